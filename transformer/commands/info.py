"""`transformer info`: build_info(), a model's decoding settings, and under mpirun every rank's."""
import json
import os

from .models import _load_model
from .world import _mpi_world, _rank_share


def run(args):
    import transformer as T

    info = T.build_info()
    if args.model is not None:
        model = _load_model(args.model)[0]
        settings = model.generation
        info["model"] = {"dir": args.model, "generation_settings": None if settings is None else
                         settings.describe(model.cfg.max_len),
                         "note": "imported with the model: the defaults of translate, evaluate and decoding calls"
                         if settings is not None else "a model trained here: this engine's decoding defaults"}
    world = _mpi_world()
    if world is not None:           # under mpirun: every rank reports, rank order
        from ..distributed import import_mpi

        rank, size, local, cores, _ = world
        bound, share = _rank_share(world)
        mine = {"rank": rank, "ranks": size, "ranks_on_this_machine": local, "host": os.uname().nodename,
                "threads": share, "bound_by_the_launcher": bound, "cores_this_rank_may_use": cores}
        every = import_mpi().COMM_WORLD.gather(mine, root=0)
        if rank != 0:
            return 0
        info["mpi"] = every
    print(json.dumps(info, indent=2))
    return 0


def register(sub):
    info = sub.add_parser("info", help="print build_info(): compiler, OpenMP, SIMD level, threads")
    info.add_argument("--model", metavar="DIR", help="also the decoding settings of the model in DIR "
                                                     "(an imported model's generation settings)")
    info.set_defaults(func=run)
