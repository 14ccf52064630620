"""Which reduced precisions the engine in use can run, asked before a benchmark starts.

A benchmark at bf16 or int8 calls the engine's public API with `precision=` (DESIGN.md, "Reduced
precision"). An engine built before that API answers such a call with a TypeError in the middle
of a run; this module asks up front instead, from the signatures, so that a benchmark either
measures the precision it names or refuses to start, and never falls back to fp32 quietly.
"""
import inspect

PRECISIONS = ("fp32", "bf16", "int8")
# What each benchmark can run: training is fp32 or bf16 (int8 is for inference only).
SUPPORTED = {"train": ("fp32", "bf16"), "decode": PRECISIONS, "kernels": PRECISIONS}


def _has_parameter(function, name):
    try:
        return name in inspect.signature(function).parameters
    except (TypeError, ValueError):     # a builtin without a signature
        return False


def missing(precision, what):
    """None when the engine can run benchmark `what` ("train", "decode", "kernels") at
    `precision`; otherwise one line saying what this build lacks."""
    if precision not in SUPPORTED[what]:
        raise ValueError(f"precision {precision!r} does not apply to the {what} benchmark: "
                         f"choose {' or '.join(SUPPORTED[what])}")
    if precision == "fp32":
        return None
    from .. import ops
    from ..model import Seq2SeqTransformer

    if what == "train" and not _has_parameter(Seq2SeqTransformer.forward_backward, "precision"):
        return "this build's Seq2SeqTransformer.forward_backward has no precision argument"
    if what == "decode":
        for method in ("greedy_decode", "beam_search"):
            if not _has_parameter(getattr(Seq2SeqTransformer, method), "precision"):
                return f"this build's Seq2SeqTransformer.{method} has no precision argument"
    if what == "kernels":
        if precision == "bf16" and not _has_parameter(ops.matmul, "precision"):
            return "this build's transformer.ops.matmul has no precision argument"
        if precision == "int8" and not (hasattr(ops, "quantize_int8") and hasattr(ops, "int8_linear")):
            return "this build's transformer.ops has no quantize_int8 / int8_linear"
    return None


def require(precision, what):
    """Raise RuntimeError when the engine cannot run `what` at `precision` (see missing)."""
    why = missing(precision, what)
    if why is not None:
        raise RuntimeError(f"cannot benchmark {what} at {precision}: {why}")
