"""Whether the decoder rows the server holds fit the memory it may fill, checked as it starts.

The scheduler keeps at most --batch-size x 4 decoder rows in flight (scheduler.py). With step
batching, each model's stream holds step buffers for all of them from its first request on
(streaming.DecodingStream); a --batch-size whose buffers pass the machine's memory, or a
container's limit (cgroups.usable_memory), would fail every request, so the server refuses to
start and names the flag. Every row in flight at its longest (the model's max_len steps) would
also hold its caches (decoding.checks.row_bytes): past the memory, the server starts and says so,
since rows that long, all at once, are the exception. What is left once the models are loaded and
the buffers counted is the decoding's budget (decoding_budget): the scheduler admits a wave only
into what is left of it (Scheduler.held, DecodingStream.add's room), and one past it waits for
another to finish.
"""
import os

from .. import cgroups
from ..decoding.checks import row_bytes
from ..streaming import stream_row_bytes


def step_buffers(models, rows):
    """Bytes of the step buffers each model's stream holds for `rows` rows, all models together."""
    return sum(rows * stream_row_bytes(served.model.cfg) for served in models.values())


def check_rows_memory(models, rows, batch_size, batching="step"):
    """MemoryError naming --batch-size when `rows` decoder rows of step buffers for every model
    pass the memory; else a warning (str) when those rows at their longest would, or None."""
    total, source = cgroups.usable_memory()
    if total is None:
        return None
    room = cgroups.room_text(total, source)
    buffers = step_buffers(models, rows) if batching == "step" else 0
    if buffers > total:
        each = "each model's stream" if len(models) > 1 else "the model's stream"
        raise MemoryError(f"--batch-size {batch_size}: {each} holds step buffers for {rows:,} decoder rows "
                          f"(--batch-size x 4), {cgroups.size_text(buffers)} in all, more than {room}")
    longest = buffers + sum(rows * row_bytes(served.model.cfg, served.model.cfg.max_len, served.defaults["precision"])
                            for served in models.values())
    if longest > total:
        return (f"warning: {rows:,} decoder rows (--batch-size {batch_size} x 4) in flight at their longest "
                f"would need {cgroups.size_text(longest)} for their caches and buffers, more than {room}: "
                "enough requests that long at once could exhaust it; a smaller --batch-size bounds them")
    return None


def resident_memory():
    """Bytes this process holds in memory now (its resident set), or 0 where the system does not say."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def decoding_budget(models, rows, batching="step"):
    """The bytes the waves' caches may hold at once (scheduler.Scheduler's memory): the memory this
    process may fill, less what it holds now (the models loaded) and the streams' step buffers;
    None where the memory is not known, or with batching "batch" (one batch at a time, checked
    by the decoding itself)."""
    total, _ = cgroups.usable_memory()
    if total is None or batching != "step":
        return None
    return max(total - resident_memory() - step_buffers(models, rows), 0)
