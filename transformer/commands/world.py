"""The threads a command runs on, and under mpirun its place among the ranks and the cores it
shares with them (train and info)."""
import os
import sys

from ..errors import FlagError, blame


def _cores():
    """The cores this process may run on at once (a launcher's binding and a container's CPU limit
    count: transformer/cores.py)."""
    from .. import cores

    return cores.usable_cores()


def _apply_threads(args):
    if getattr(args, "threads", None):
        import transformer as T

        threads = args.threads[0] if isinstance(args.threads, list) else args.threads
        cores = _cores()
        if threads > cores:   # honoured, but every thread past the cores slows all of them down
            from .. import cores as usable

            print(f"transformer {args.command}: warning: --threads {threads} is more than "
                  f"{usable.describe(cores)}; threads past the cores take turns on them and make every "
                  f"step slower", file=sys.stderr)
        with blame("--threads", threads):   # a build without OpenMP refuses more than one, in one line
            T.set_num_threads(threads)


def _mpi_world():
    """Under mpirun/mpiexec: (rank, size, ranks on this machine, the cores this rank may use, how
    many ranks on this machine may use exactly those cores); None for a plain process (importing
    no MPI)."""
    from ..distributed import import_mpi, launched_ranks

    rank, size = launched_ranks()
    if size == 1:
        return None
    try:
        MPI = import_mpi()
    except ImportError as exc:
        raise FlagError(f"started by an MPI launcher with {size} ranks, but {exc}") from None
    comm = MPI.COMM_WORLD
    if comm.Get_size() != size:
        raise FlagError(f"the MPI launcher started {size} ranks but mpi4py sees {comm.Get_size()}: mpi4py was "
                        "built for another MPI than the mpirun used (use the mpirun of the same installation, "
                        "e.g. the one `pip install \"transformer-cpu[mpi]\"` puts in the virtual environment)")
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    cores = sorted(os.sched_getaffinity(0))
    sharing = sum(other == cores for other in local.allgather(cores))
    return comm.Get_rank(), size, local.Get_size(), cores, sharing


def _rank_share(world):
    """(bound, threads): whether this rank may run on fewer than all the machine's cores (pinned by
    the launcher, or a container's limit), and the threads it may run without oversubscribing: its
    share of the cores it may use (capped by its cgroup's CPU limit, which the ranks in that cgroup
    share), among the ranks here that may use the same ones."""
    from .. import cores as usable

    cores, sharing = world[3], world[4]
    n = usable.capped(len(cores))      # a container's CPU limit, shared by its ranks
    return len(cores) < (os.cpu_count() or len(cores)) or n < len(cores), max(1, n // sharing)
