"""The commands of `transformer` (cli.py), one module each: `register(sub)` adds the command's
parser and flags, `run(args)` checks what the flags alone cannot and runs it. Flag types and help
texts shared by several commands are in flags.py, model directories (loading, --out) in models.py,
threads and the MPI world in world.py."""
