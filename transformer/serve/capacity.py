"""Whether the decoder rows the server holds fit the memory it may fill, checked as it starts.

The scheduler keeps at most --batch-size x 4 decoder rows in flight (scheduler.py). With step
batching, each model's stream holds step buffers for all of them from its first request on
(streaming.DecodingStream); a --batch-size whose buffers pass the machine's memory, or a
container's limit (cgroups.usable_memory), would fail every request, so the server refuses to
start and names the flag. Every row in flight at its longest (the model's max_len steps) would
also hold its caches (decoding.checks.row_bytes): past the memory, the server starts and says so,
since rows that long, all at once, are the exception.
"""
from .. import cgroups
from ..decoding.checks import row_bytes
from ..streaming import stream_row_bytes


def check_rows_memory(models, rows, batch_size, batching="step"):
    """MemoryError naming --batch-size when `rows` decoder rows of step buffers for every model
    pass the memory; else a warning (str) when those rows at their longest would, or None."""
    total, source = cgroups.usable_memory()
    if total is None:
        return None
    room = cgroups.room_text(total, source)
    buffers = sum(rows * stream_row_bytes(served.model.cfg) for served in models.values()) \
        if batching == "step" else 0
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
