"""Expected failures of the command line, told apart from bugs.

A user's mistake (a missing or damaged file, a wrong column, a flag that cannot apply) ends in one
line, `transformer <command>: error: <message>`, that names the flag; anything else is a bug and
keeps its traceback. `--debug` shows the traceback of expected failures too.
"""
import contextlib
import os


class FlagError(ValueError):
    """A flag's value, or its combination with other flags, cannot apply: a usage error."""
    status = 2


class DistributedError(RuntimeError):
    """Ranks that cannot go on together (distributed.py): one died or hangs, their weights differ,
    or they were started with different settings or data. `everywhere`: every rank raised it."""
    everywhere = False


@contextlib.contextmanager
def blame(flag=None, value=None):
    """An OSError or ValueError raised inside is caused by this flag's value (a missing or damaged
    file, say): it keeps its type and message and gains `flag` and `flag_value`, which the command
    line prints instead of a traceback. No flag: expected, and the message says what failed."""
    try:
        yield
    except (OSError, ValueError, ImportError) as exc:
        if not hasattr(exc, "flag") and not isinstance(exc, FlagError):
            exc.flag, exc.flag_value = flag or "", value
        raise


def _strip(text, value):
    """text less the path `value`, which the flag already names."""
    value = str(value).rstrip("/")
    if text.startswith(value + ": "):
        return text[len(value) + 2:]
    if text.startswith(value + "/"):
        return text[len(value) + 1:]
    if text.endswith(": " + value):
        return text[:-len(value) - 2]
    return text


def reason(exc, value=None):
    """What went wrong, in one line: `file: no such file or directory` for an OSError from the
    system, the message otherwise; without the path that `value` already names."""
    if isinstance(exc, OSError) and exc.strerror:
        text = exc.strerror[:1].lower() + exc.strerror[1:]
        if exc.filename is not None:
            text = f"{os.fsdecode(exc.filename)}: {text}"
    else:
        text = str(exc) or type(exc).__name__
    text = " ".join(text.split())
    return _strip(text, value) if value not in (None, "") else text


def describe(exc, args):
    """(message, exit status) of an expected failure, or None for a bug."""
    if isinstance(exc, FlagError):
        return str(exc), exc.status
    if isinstance(exc, DistributedError):
        return str(exc), 1
    if isinstance(exc, MemoryError):                   # sizes past the memory the process may fill
        detail = " ".join(str(exc).split())
        return "out of memory: " + (detail or "the sizes asked for (model, beam, batch, positions) need more "
                                    "than is free"), 1
    argument = getattr(exc, "argument", None)          # data.ColumnError: src_col or tgt_col
    if isinstance(argument, str) and hasattr(args, argument):
        flag = "--" + argument.replace("_", "-")
        return f"{flag} {getattr(args, argument)}: {reason(exc, getattr(args, 'data', None))}", 1
    if hasattr(exc, "flag"):
        flag, value = exc.flag, exc.flag_value
    elif isinstance(exc, OSError):                     # the file system: disk full, no permission
        return reason(exc), 1
    else:
        return None
    if not flag:
        return reason(exc), 1
    if value is None:
        return f"{flag}: {reason(exc)}", 1
    return f"{flag} {value}: {reason(exc, value)}", 1
