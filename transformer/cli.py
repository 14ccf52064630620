"""The `transformer` command line."""
import argparse
import os
import sys
import time

from .commands import average, bench, convert, evaluate, info, prepare, quantize, serve, train, translate
from .errors import describe

# The commands in the order `transformer --help` lists them; each module holds its flags, its
# checks and its run (transformer/commands).
COMMANDS = (bench, train, prepare, serve, translate, evaluate, average, quantize, convert, info)
ABORT_GRACE_S = 0.5   # a rank that fails alone waits this long after its message before MPI_Abort


class _Parser(argparse.ArgumentParser):
    """A usage error is one line, `transformer train: error: argument --threads: ...` (exit status 2);
    only the top level, whose usage is one line, shows it too."""
    usage_on_error = False

    def error(self, message):
        if self.usage_on_error:
            self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_args(self, args=None, namespace=None):
        # an argument no parser took is the command's error (`transformer translate: error: ...`),
        # not the top level's, which would print the usage of every command
        args, extras = self.parse_known_args(args, namespace)
        if extras:
            command = getattr(self, "commands", {}).get(getattr(args, "command", None), self)
            command.error(f"unrecognized arguments: {' '.join(extras)}")
        return args


def build_parser():
    parser = _Parser(prog="transformer", description=__doc__)
    parser.usage_on_error = True
    parser.add_argument("--debug", action="store_true",
                        help="show the Python traceback of a failure (a user's mistake is one line without it)")
    sub = parser.add_subparsers(dest="command", required=True)
    parser.commands = sub.choices
    for command in COMMANDS:
        command.register(sub)
    for command in sub.choices.values():         # --debug before or after the command
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show the Python traceback of a failure")
    return parser


def main(argv=None):
    """Run one command; its exit status. An expected failure (a missing or damaged file, a wrong
    column, a flag that cannot apply, Ctrl-C) is one line on stderr, `transformer <command>: error:
    ...`; a bug keeps its traceback, and so does everything with --debug."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BaseException as exc:
        if getattr(args, "world", (0, 1))[1] > 1:
            return _fail_under_mpi(args, exc)
        return _fail(args, exc)


def _fail(args, exc):
    if isinstance(exc, KeyboardInterrupt):
        if args.debug:
            raise exc
        print(f"transformer {args.command}: error: interrupted", file=sys.stderr)
        return 130
    if isinstance(exc, BrokenPipeError):         # the reader went away (`| head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    told = describe(exc, args) if isinstance(exc, Exception) else None
    if told is None or args.debug:
        raise exc
    message, status = told
    print(f"transformer {args.command}: error: {message}", file=sys.stderr)
    return status


def _fail_under_mpi(args, exc):
    """Under mpirun. A failure every rank saw (ranks that disagree, replicas that diverged) is told
    once, by rank 0, and every rank exits with it. A rank that fails alone says so and takes the
    others down with MPI_Abort rather than leave them waiting."""
    import traceback

    from .distributed import import_mpi

    rank = args.world[0]
    everywhere = getattr(exc, "everywhere", False)
    if isinstance(exc, KeyboardInterrupt):
        told = ("interrupted", 130)
    elif isinstance(exc, SystemExit):
        told = (None, exc.code if isinstance(exc.code, int) else 1)
    else:
        told = describe(exc, args) if isinstance(exc, Exception) else None
        if told is None or args.debug:
            traceback.print_exception(type(exc), exc, exc.__traceback__)
        if told is None:
            told = (f"{type(exc).__name__}: {exc}", 1)
    message, status = told
    if message and (rank == 0 or not everywhere):
        where = "" if everywhere or message.startswith("rank ") else f"rank {rank}: "
        print(f"transformer {args.command}: error: {where}{message}", file=sys.stderr, flush=True)
    if not everywhere:
        # MPI_Abort ends every rank at once, and with them the launcher's forwarding of what they
        # wrote last: a moment first, so that the message gets out (without it, MPICH's mpiexec
        # lost it in 1 refusal of 20 here, and the run ended with a status and no word)
        time.sleep(ABORT_GRACE_S)
        import_mpi().COMM_WORLD.Abort(status or 1)
    return status


if __name__ == "__main__":
    sys.exit(main())
