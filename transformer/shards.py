"""Sentence shards: a training step of a small model runs whole sentences per thread.

A small model's products are small (tiny: d_model 128, a 2,048-token batch): split over two
threads, each product forks and joins a team, and a step makes about 300 of them. Here the batch
is cut into shards of whole sentences instead; each shard runs the whole forward and backward pass
on its own thread (its kernels on that thread's share of the cores, single-threaded when there are
as many shards as threads), through a replica of the model that reads the same weights and adds
into a gradient buffer of its own. The step then sums the shards' gradients in shard order.

What a result depends on: how many shards a batch is cut into, and where, is a function of the
batch and the model's sizes alone (shard_count, shard_rows), never of the thread count; each
kernel's bits are independent of its team; and the gradient sum runs in shard order. So a step
gives the same bits at any thread count. Dropout: shard 0 draws the masks of the whole pass's
seed, shard s > 0 those of a seed mixed from it and s (a shard's element indices restart at 0).
"""
import concurrent.futures
import contextlib
import os
import threading

import numpy as np

from . import _C
from .layers import _splitmix64

__all__ = ["pass_batches", "shard_count", "shard_plan", "shard_rows", "ShardedSteps", "step_threads"]

# A batch is cut into two shards when its model is at most this wide (tiny, medium-4-2, small) and
# it holds at least 2 x SHARD_MIN_TOKENS target tokens. Wider models' products keep two cores busy
# on their own, and their gradient buffer (each further shard adds one to the step's memory
# traffic) is large: base's is 240 MB. Measured on tiny (benchmarks/train_runs.py, notes of
# 2026-12-04: 1.06x at 2 threads by the median of real runs, 2.08x beside a spinning process).
SHARD_MAX_D_MODEL = 256
SHARD_MIN_TOKENS = 256
SHARDS = 2

# tests and benchmarks: None, or the shard count every training pass uses (1: never split);
# TRANSFORMER_SHARDS sets it for a process (benchmarks/train_runs.py runs `transformer train` so)
forced = int(os.environ["TRANSFORMER_SHARDS"]) if os.environ.get("TRANSFORMER_SHARDS", "").isdigit() else None

_SHARD_SEED_MIX = 0x9E3779B97F4A7C15


def shard_count(cfg, batch_rows, target_tokens):
    """How many shards a batch of `batch_rows` sentences with `target_tokens` non-pad targets is
    cut into: depends on the model's sizes and the batch, never on the threads."""
    if forced is not None:
        return max(1, min(int(forced), batch_rows))
    if cfg.d_model > SHARD_MAX_D_MODEL or target_tokens < SHARDS * SHARD_MIN_TOKENS:
        return 1
    return min(SHARDS, batch_rows)


def shard_rows(src, tgt_out, pad_id, shards):
    """Contiguous row ranges [(r0, r1)] of about equal work (source + target tokens), each with at
    least one row; fewer than `shards` ranges only when there are fewer rows."""
    work = np.count_nonzero(src != pad_id, axis=1) + np.count_nonzero(tgt_out != pad_id, axis=1)
    ends = np.cumsum(work, dtype=np.int64)
    total = int(ends[-1]) if len(ends) else 0
    bounds, start = [], 0
    for s in range(1, shards):
        # after row i, where the cumulative work first reaches s / shards of the total, or
        # before it, whichever comes closer
        goal = total * s / shards
        i = int(np.searchsorted(ends, goal, side="left"))
        cut = i + 1 if i == 0 or i >= len(ends) or ends[i] - goal <= goal - ends[i - 1] else i
        cut = min(max(cut, start + 1), len(src) - (shards - s))
        if cut <= start:
            continue
        bounds.append((start, cut))
        start = cut
    bounds.append((start, len(src)))
    return bounds


def shard_plan(cfg, src, tgt_out):
    """How a training pass runs a checked batch: None for one whole pass (shard_count gives one
    shard, or the cut leaves fewer than two ranges or a range without a target), else the row
    ranges [(r0, r1)] of its shards and each one's non-pad targets. Each shard runs trimmed
    (_trimmed)."""
    pad = cfg.pad_id
    shards = shard_count(cfg, src.shape[0], int(np.count_nonzero(tgt_out != pad)))
    if shards < 2:
        return None
    bounds = shard_rows(src, tgt_out, pad, shards)
    counts = [int(np.count_nonzero(tgt_out[r0:r1] != pad)) for r0, r1 in bounds]
    if len(bounds) < 2 or min(counts) == 0:
        return None
    return bounds, counts


def pass_batches(cfg, src, tgt_in, tgt_out):
    """The (src, tgt_in, tgt_out) a training pass of a model of `cfg` runs for this batch, as it
    runs them: the batch itself, or its trimmed shards (the shapes of the step's products)."""
    plan = shard_plan(cfg, src, tgt_out)
    if plan is None:
        return [(src, tgt_in, tgt_out)]
    return [_trimmed(src[r0:r1], tgt_in[r0:r1], tgt_out[r0:r1], cfg.pad_id) for r0, r1 in plan[0]]


def _trimmed(src, tgt_in, tgt_out, pad_id):
    """The shard without its trailing columns of padding (in exact arithmetic they change nothing:
    pad keys are masked, pad targets carry no loss, causal attention never looks ahead)."""
    def width(mask):
        cols = np.flatnonzero(mask.any(axis=0))
        return int(cols[-1]) + 1 if len(cols) else 1
    S = width(src != pad_id)
    T = max(width(tgt_in != pad_id), width(tgt_out != pad_id))
    return (np.ascontiguousarray(src[:, :S]), np.ascontiguousarray(tgt_in[:, :T]),
            np.ascontiguousarray(tgt_out[:, :T]))


def _mix(seed, shard):
    """Shard s > 0's dropout seed, mixed from the pass's seed (shard 0 keeps the pass's own)."""
    return _splitmix64(seed ^ _splitmix64(_SHARD_SEED_MIX * shard & 0xFFFFFFFFFFFFFFFF))


_held = threading.local()     # .threads: the process's threads while step_threads holds a share


def _lane_threads(threads, lanes, lane):
    """Lane `lane`'s share of `threads` threads over `lanes` lanes (the first ones take the rest)."""
    return threads // lanes + (lane < threads % lanes)


@contextlib.contextmanager
def step_threads(model):
    """A whole training step of `model` (zeroing, the pass, clipping, the optimizer) on the
    calling thread: when its passes run as fewer lanes than there are threads, the thread's
    kernels keep lane 0's share of the threads for the whole step, not only for its shard.

    Otherwise the thread's OpenMP team shrinks to that share for the pass and grows back for the
    optimizer, every step; libgomp ends the threads a smaller team leaves out and starts new
    ones, beside the other lanes' teams, and counts them all: past the core count every team's
    waits turn to sleeps. On a 16-core Xeon, tiny ran 39.7 ms a step at 16 threads against 28.0
    at 8 so (notes of 2026-12-04). With as many threads as lanes (2 on 2 cores) the lanes run on
    the team itself (run_lanes) and nothing is held."""
    threads = _C.get_num_threads()
    lanes = min(shard_count(model.cfg, 1 << 30, 1 << 30), threads)
    if lanes < 2 or lanes == threads or getattr(_held, "threads", None) is not None:
        yield
        return
    was = _C.set_thread_limit(_lane_threads(threads, lanes, 0))
    _held.threads = threads
    try:
        yield
    finally:
        _held.threads = None
        _C.set_thread_limit(was)


_pool = None
_pool_lock = threading.Lock()


def _executor(workers):
    """The process's threads for shards past the first (grown on demand, kept)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool._max_workers < workers:
            if _pool is not None:
                _pool.shutdown(wait=False)    # its idle threads end; a new one has room for more
            _pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers,
                                                          thread_name_prefix="transformer-shard")
        return _pool


class ShardedSteps:
    """The replicas of one model that run its shards past the first (shard 0 runs on the model)."""

    def __init__(self, model):
        self.model = model
        self.replicas = []

    def _replica(self, i):
        """Replica i (i >= 1): the model's layers over the same weights, its own gradients,
        workspace and dropout stream; remade if the model's weights were replaced."""
        model = self.model
        while len(self.replicas) < i:
            self.replicas.append(None)
        rep = self.replicas[i - 1]
        if rep is None or rep.params.flat is not model.params.flat or rep.cfg is not model.cfg:
            rep = object.__new__(type(model))
            rep.cfg, rep.seed = model.cfg, model.seed
            rep.params = model.params.with_own_gradients()
            rep._int8_seed, rep.stored_precision, rep.generation, rep.shards = {}, "fp32", None, None
            rep._assemble()
            self.replicas[i - 1] = rep
        for mine, theirs in zip(model.stream.users, rep.stream.users):
            theirs.p = mine.p             # set_dropout changes the model's sites only
        return rep

    def train_pass(self, src, tgt_in, tgt_out, label_smoothing, bf16, grad_scale, ready, plan):
        """The model's _train_pass over the shards of `plan` (shard_plan's): the mean loss over
        every non-pad target; grad_scale times its gradient ADDED into the model's gradient
        buffer; ready(prefix) told for every parameter group once the sum over shards is complete."""
        model = self.model
        pad = model.cfg.pad_id
        bounds, counts = plan
        total = sum(counts)
        seed = model.stream.next_call()
        owners = [model] + [self._replica(i) for i in range(1, len(bounds))]
        for rep in owners[1:]:
            if not rep.params.grad_is_zero:
                rep.params.zero_grad()
        prefixes = []
        losses = [0.0] * len(bounds)

        def run(i):
            part = _trimmed(src[bounds[i][0]:bounds[i][1]], tgt_in[bounds[i][0]:bounds[i][1]],
                            tgt_out[bounds[i][0]:bounds[i][1]], pad)
            losses[i] = owners[i]._train_pass_whole(*part, label_smoothing, bf16, grad_scale * counts[i] / total,
                                                    prefixes.append if i == 0 else None,
                                                    seed if i == 0 else _mix(seed, i))

        threads = getattr(_held, "threads", None) or _C.get_num_threads()
        lanes = min(len(bounds), threads)

        def lane(l):
            was = _C.set_thread_limit(_lane_threads(threads, lanes, l))
            try:
                for i in range(l, len(bounds), lanes):
                    run(i)
            finally:
                _C.set_thread_limit(was)

        if lanes == threads and lanes > 1:
            # a lane a thread (two shards on two cores): the lanes run on the OpenMP team's own
            # threads. A Python thread of ours would first wait for that team's worker, still
            # spinning after the last step's region, to leave its core: 3.5 ms a step on 2 cores.
            _C.run_lanes(lanes, lane)
        else:
            pending = [_executor(lanes - 1).submit(lane, l) for l in range(1, lanes)]
            try:
                lane(0)
            finally:
                for future in pending:
                    future.result()       # waits for every lane; raises the first lane's error
        flat = model.params.flat_grad
        for rep in owners[1:]:        # in shard order: the bits do not depend on the lanes
            _C.add(flat, rep.params.flat_grad, flat)
        for prefix in prefixes:
            ready(prefix)
        return sum(loss * n for loss, n in zip(losses, counts)) / total
