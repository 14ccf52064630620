"""A run under mpirun: its rank and size, the checks that every rank starts alike, the model wrapped
for data parallel, and the corpus prepared by one rank for all."""
import os
import time

from .. import _C
from .flags import SIZE_FLAGS, TRAJECTORY_ARGS, flag_name
from .report import say


def world(args):
    """(rank, size) of this run: under mpirun with more than one rank, set by the command line."""
    return getattr(args, "world", None) or (0, 1)


_sharing = []      # ranks_sharing_memory's answer, once a process


def ranks_sharing_memory(args):
    """(ranks, those on this machine): how many ranks the run has and how many of them share this
    machine's memory (MPI's shared-memory split of the world). A collective the first time, so
    every rank calls it first at the same point (train_on_data, before sizing); then kept."""
    size = world(args)[1]
    if size == 1:
        return 1, 1
    if not _sharing:
        from ..distributed import import_mpi

        MPI = import_mpi()
        here = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
        try:
            _sharing.append(here.Get_size())
        finally:
            here.Free()
    return size, _sharing[0]


def rank_zero_decides(args, decide):
    """decide() on rank 0 alone under mpirun, its value on every rank: for a choice made by measuring
    (--precision auto's probe), which the ranks could each make differently, and which they would
    make at once on the cores they share. One process: decide()."""
    if world(args)[1] == 1:
        return decide()
    from ..distributed import import_mpi

    comm = import_mpi().COMM_WORLD
    return comm.bcast(decide() if world(args)[0] == 0 else None, root=0)


def agree_across_ranks(args, data_fingerprint):
    """Under mpirun: refuse to start unless every rank has the same settings, data and build."""
    if world(args)[1] == 1:
        return
    from .. import __version__
    from ..distributed import agree, import_mpi

    keys = [k for k in TRAJECTORY_ARGS + SIZE_FLAGS + ("precision", "max_steps", "minutes", "preset",
                                                      "eval_every", "save_every", "save_minutes", "average_last",
                                                      "snapshot_every", "keep_best", "init_from")
            if k != "data"]
    description = {flag_name(k): getattr(args, k, None) for k in dict.fromkeys(keys)}
    description.update({"data (fingerprint of the pairs)": data_fingerprint, "transformer version": __version__,
                        "SIMD level (TRANSFORMER_ISA)": _C.isa(),
                        "--resume (checkpoint step)": None if args.checkpoint is None else
                        args.checkpoint.train_state.get("step")})
    agree(import_mpi().COMM_WORLD, description)


def data_parallel(args, model, optimizer):
    """Under mpirun with more than one rank: the model wrapped in a DataParallel, with rank 0's
    weights and optimizer state on every rank. None for one process."""
    if world(args)[1] == 1:
        return None
    from ..distributed import DataParallel

    dp = DataParallel(model)
    dp.broadcast_parameters()
    dp.broadcast_optimizer(optimizer)
    return dp


def describe_world(dp):
    if dp is None:
        return ""
    return f"; data parallel over {dp.size} ranks, each on its part of every batch"


def one_rank_prepares(args, prepare, open_prepared):
    """prepare() on rank 0 alone under mpirun: the other ranks wait (asleep, not spinning on a
    core the preparation needs), then open_prepared(path) the very files rank 0 wrote, so that one
    host holds one copy in its page cache. One process: prepare()."""
    rank, size = world(args)
    if size == 1:
        return prepare()
    from ..distributed import import_mpi

    comm = import_mpi().COMM_WORLD
    corpus = None
    if rank == 0:
        others = f"the other {size - 1} ranks wait" if size > 2 else "the other rank waits"
        say(f"rank 0 prepares the corpus (or finds it prepared); {others} for it, then every rank maps "
             "the same files")
        corpus = prepare()
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.05)
    path = comm.bcast(corpus.path if rank == 0 else None, root=0)
    if rank == 0:
        return corpus
    if not os.path.isdir(path):
        raise FileNotFoundError(f"rank {rank} cannot see {path}, the corpus rank 0 prepared: give every host "
                                "a file system they share, and pass a directory of `transformer prepare` as --data")
    return open_prepared(path)
