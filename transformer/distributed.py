"""Data-parallel training over MPI ranks (DESIGN, Public Python API).

Every rank holds the whole model; each runs its shard of every global batch, and the gradients are
summed over ranks in the model's flat gradient buffer, so that N ranks on the shards of a batch
compute what one process computes on the whole batch. mpi4py is imported here only, and only when
a DataParallel is made (or `transformer train` runs under mpirun): importing `transformer` never
needs it.

Overlap: the backward pass tells, layer by layer, which parameter groups have their final gradient
(Seq2SeqTransformer._train_pass's `ready`); contiguous ready groups are gathered into buckets of at
least `bucket_mb` and each bucket is all-reduced in place with a non-blocking Iallreduce as soon as
it is full, so communication runs while the earlier layers are still computing. Buckets follow the
parameter layout, so every rank issues the same all-reduces in the same order.

Faults: every wait polls with a deadline (`timeout`, seconds): a rank that died or hangs makes the
others raise DistributedError naming what they were waiting for, instead of waiting forever.
"""
import os
import time

import numpy as np

from . import _C
from .errors import DistributedError

__all__ = ["DataParallel", "DistributedError", "launched_ranks"]

# Environment variables MPI launchers set in every rank: world size and rank.
_LAUNCHER_VARS = (("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),   # Open MPI
                  ("PMI_SIZE", "PMI_RANK"),                           # MPICH (hydra), Intel MPI
                  ("PMIX_SIZE", "PMIX_RANK"),
                  ("MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK"))     # MVAPICH2
INSTALL_HINT = 'pip install "transformer-cpu[mpi]" (mpi4py and the MPICH runtime)'
LONG_WAIT = 3600.0     # seconds the other ranks wait while rank 0 evaluates or writes a checkpoint


def launched_ranks():
    """(rank, world size) an MPI launcher gave this process, read from its environment without
    importing MPI; (0, 1) when not started by mpirun/mpiexec."""
    for size_var, rank_var in _LAUNCHER_VARS:
        size = os.environ.get(size_var, "")
        if size.isdigit():
            rank = os.environ.get(rank_var, "0")
            return (int(rank) if rank.isdigit() else 0), int(size)
    return 0, 1


def import_mpi():
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ImportError(f"data-parallel training needs mpi4py: {INSTALL_HINT}") from exc
    return MPI


class DataParallel:
    """One model replicated on every rank of an MPI communicator.

    dp = DataParallel(model)          # comm: an mpi4py communicator, default MPI.COMM_WORLD
    dp.broadcast_parameters()         # rank 0's weights on every rank
    loss = dp.forward_backward(src, tgt_in, tgt_out, label_smoothing=0.1)

    forward_backward runs this rank's part of the batch and ADDS to the model's gradient buffer
    (like model.forward_backward) the gradient of the mean loss over the non-pad targets of all
    ranks' parts: after it, every rank holds what one process computes on the concatenated batch,
    and the returned loss is that global mean. A rank with an empty part (src None or zero rows)
    still takes part in the sum. Gradient clipping and the optimizer then run unchanged on every
    rank, with identical inputs, and the weights stay bitwise identical (check_replicas verifies).
    """

    def __init__(self, model, comm=None, bucket_mb=4.0, timeout=120.0):
        MPI = import_mpi()
        if not hasattr(model, "params") or not hasattr(model, "_train_pass"):
            raise TypeError(f"model must be a Seq2SeqTransformer, got {type(model).__name__}")
        if comm is None:
            comm = MPI.COMM_WORLD
        if not isinstance(comm, MPI.Intracomm):
            raise TypeError(f"comm must be an mpi4py intracommunicator (e.g. MPI.COMM_WORLD), got "
                            f"{type(comm).__name__}")
        bucket_mb, timeout = float(bucket_mb), float(timeout)
        if not bucket_mb > 0:
            raise ValueError(f"bucket_mb must be > 0, got {bucket_mb}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.MPI, self.comm, self.model = MPI, comm, model
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.bucket_floats = max(16, int(bucket_mb * 2 ** 20) // 4)
        self.timeout = timeout
        self.regions = _parameter_groups(model.params)
        model.stream.rank = self.rank
        self.last_target_count = 0
        # Summed over calls (reset_stats() clears them): seconds in forward_backward; of those, the
        # communication the backward pass did not hide (the pass's end minus the slowest rank's end
        # of compute), and the time spent waiting for slower ranks (imbalance: noise, uneven parts)
        self.stats = {"calls": 0, "seconds": 0.0, "wait_seconds": 0.0, "imbalance_seconds": 0.0, "buckets": 0}

    # -- one training pass ----------------------------------------------------------------------
    def forward_backward(self, src, tgt_in, tgt_out, label_smoothing=0.1, precision="fp32"):
        started = time.perf_counter()
        model = self.model
        pad = model.cfg.pad_id
        empty = src is None or np.asarray(src).size == 0
        local = 0 if empty else int(np.count_nonzero(np.asarray(tgt_out) != pad))
        if empty:
            from .precision import check_precision
            check_precision(precision, ("fp32", "bf16"), "training (int8 is for decoding)")
        total = int(self._allreduce(np.array([local], dtype=np.int64), "the target count")[0])
        computing = time.perf_counter()
        behind = computing - started          # waiting for the slowest rank to start this pass
        if total == 0:
            raise ValueError("no non-pad target on any rank: every part of the batch is empty")
        flat = model.params.flat_grad
        prior = None if model.params.grad_is_zero else flat.copy()
        if prior is not None:
            _C.zero_(flat)
        buckets = _Buckets(self)
        if local:
            loss = model._train_pass(src, tgt_in, tgt_out, label_smoothing, precision, grad_scale=local / total,
                                     ready=buckets.ready)
        else:
            loss = 0.0
            for prefix in self.regions:           # nothing computed: zeros join the sum
                buckets.ready(prefix)
            model.params.grad_is_zero = False
        compute = time.perf_counter() - computing
        buckets.finish()
        every = np.zeros((self.size, 2), dtype=np.float64)
        self._wait([self.comm.Iallgather(np.array([loss * local, compute]), every)], "the loss")
        loss = float(every[:, 0].sum()) / total           # the same order of terms on every rank
        if prior is not None:
            flat += prior
        self.last_target_count = total
        ended = time.perf_counter()
        slowest = float(every[:, 1].max())
        self.stats["calls"] += 1
        self.stats["seconds"] += ended - started
        self.stats["wait_seconds"] += max(0.0, ended - computing - slowest)
        self.stats["imbalance_seconds"] += behind + slowest - compute
        self.stats["buckets"] += buckets.count
        return loss

    def reset_stats(self):
        for key in self.stats:
            self.stats[key] = type(self.stats[key])(0)

    # -- replicas -------------------------------------------------------------------------------
    def broadcast_parameters(self):
        """Copy rank 0's weights to every rank (collective: every rank calls it)."""
        self.comm.Bcast(self.model.params.flat, root=0)

    def broadcast_optimizer(self, optimizer):
        """Copy rank 0's Adam state (moments and step count) to every rank."""
        self.comm.Bcast(optimizer.exp_avg, root=0)
        self.comm.Bcast(optimizer.exp_avg_sq, root=0)
        optimizer.step_count = self.comm.bcast(optimizer.step_count, root=0)

    def check_replicas(self, step=None, optimizer=None):
        """Raise DistributedError on every rank when the weights (and, given, the Adam moments) are
        not bitwise identical on all ranks; `step` goes into the message."""
        arrays = [self.model.params.flat]
        if optimizer is not None:
            arrays += [optimizer.exp_avg, optimizer.exp_avg_sq]
        mine = np.array([_C.checksum(a) for a in arrays], dtype=np.uint64)
        every = np.zeros((self.size, len(arrays)), dtype=np.uint64)
        self._wait([self.comm.Iallgather(mine, every)], "the weight checksums")
        bad = [r for r in range(self.size) if not np.array_equal(every[r], every[0])]
        if bad:
            where = f" at step {step}" if step is not None else ""
            what = "weights" if np.any(every[bad, 0] != every[0, 0]) else "optimizer states"
            error = DistributedError(f"the {what} of rank{'s' if len(bad) > 1 else ''} "
                                     f"{', '.join(map(str, bad))} differ from rank 0's{where}: the replicas "
                                     "diverged (stopping; the last checkpoint is intact)")
            error.everywhere = True
            raise error

    # -- small collectives with a deadline --------------------------------------------------------
    def max_flags(self, flags, what="the step's stop flags", timeout=None):
        """Element-wise maximum of small integer flags over ranks."""
        return [int(v) for v in self._allreduce(np.array(flags, dtype=np.int64), what, self.MPI.MAX, timeout)]

    def sync(self, what, timeout=LONG_WAIT):
        """Wait until every rank gets here (rank 0 evaluating or saving: the others wait with a long
        deadline)."""
        self._wait([self.comm.Ibarrier()], what, timeout)

    def bcast_object(self, obj, root=0):
        return self.comm.bcast(obj, root=root)

    def agree(self, description):
        agree(self.comm, description)

    def _allreduce(self, values, what, op=None, timeout=None):
        out = np.empty_like(values)
        self._wait([self.comm.Iallreduce(values, out, op=op or self.MPI.SUM)], what, timeout)
        return out

    def _wait(self, requests, what, timeout=None):
        """Wait for the requests, driving MPI's progress; DistributedError after `timeout` seconds."""
        Request = self.MPI.Request
        if Request.Testall(requests):
            return
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        spins = 0
        while not Request.Testall(requests):
            spins += 1
            if spins > 2000:                   # a long wait: stop burning a core the others may need
                time.sleep(0.0002)
                if time.monotonic() > deadline:
                    raise DistributedError(
                        f"rank {self.rank}: no answer from the other ranks for {limit:.0f} s while waiting "
                        f"for {what}: a rank died or hangs")


def agree(comm, description):
    """Refuse to start when ranks were given different settings or data: `description` is a dict of
    what must match (flags, a data fingerprint, the package version). Raises DistributedError on
    every rank (with `everywhere` set: each rank knows), saying what differs."""
    every = comm.allgather(description)
    differences = []
    for rank, other in enumerate(every[1:], start=1):
        for key in sorted(set(other) | set(every[0]), key=str):
            mine, theirs = every[0].get(key), other.get(key)
            if mine != theirs:
                differences.append(f"{key}: rank {rank} has {theirs!r}, rank 0 has {mine!r}")
    if differences:
        shown = "; ".join(differences[:4]) + (f"; and {len(differences) - 4} more" if len(differences) > 4 else "")
        error = DistributedError(f"the {len(every)} ranks were started with different settings or data: {shown}")
        error.everywhere = True
        raise error


class _Buckets:
    """The all-reduces of one backward pass: contiguous ready parameter groups, gathered until a
    bucket holds at least bucket_floats, each bucket an in-place Iallreduce on its slice of the flat
    gradient buffer."""

    def __init__(self, dp):
        self.dp, self.flat = dp, dp.model.params.flat_grad
        self.pending = None      # [lo, hi) of the bucket being filled
        self.requests = []
        self.count = 0

    def ready(self, prefix):
        lo, hi = self.dp.regions[prefix]
        if self.pending is not None and self.pending[0] == hi:
            self.pending = (lo, self.pending[1])        # the backward pass walks the layout downwards
        else:
            self._issue()
            self.pending = (lo, hi)
        if self.pending[1] - self.pending[0] >= self.dp.bucket_floats:
            self._issue()
        if self.requests:
            self.dp.MPI.Request.Testall(self.requests)  # let MPI progress the buckets in flight

    def _issue(self):
        if self.pending is None:
            return
        lo, hi = self.pending
        dp = self.dp
        self.requests.append(dp.comm.Iallreduce(dp.MPI.IN_PLACE, self.flat[lo:hi], op=dp.MPI.SUM))
        self.count += 1
        self.pending = None

    def finish(self):
        self._issue()
        self.dp._wait(self.requests, "the gradient all-reduce")


def _parameter_groups(params):
    """{prefix: (lo, hi)}: the slice of the flat buffers holding each group the backward pass
    reports (an embedding, the generator, a layer, a final norm), alignment gaps included; the
    slices tile the buffer."""
    groups = {}
    names = params.names
    for i, name in enumerate(names):
        parts = name.split(".")
        prefix = ".".join(parts[:4] if parts[0] == "transformer" and parts[2] == "layers" else parts[:-1]) + "."
        start = params.offsets[name]
        end = params.offsets[names[i + 1]] if i + 1 < len(names) else params.size
        lo, hi = groups.get(prefix, (start, end))
        groups[prefix] = (min(lo, start), max(hi, end))
    spans = sorted(groups.values())
    if spans[0][0] != 0 or spans[-1][1] != params.size or any(a[1] != b[0] for a, b in zip(spans, spans[1:])):
        raise AssertionError("parameter groups do not tile the flat buffer")   # pragma: no cover
    return groups
