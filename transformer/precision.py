"""Precision names, checked in one place.

One model, one set of float32 master weights; the precision is chosen per call:

- "fp32": everything float32 (the default);
- "bf16": every GEMM operand rounded to bfloat16 (nearest, ties to even) as it is packed, products
  summed in float32 (csrc/gemm.h, GEMM_BF16); everything else float32;
- "int8": inference only; the weights of the linear layers quantized once per weights version
  (symmetric, one scale per output row), activations per row on the fly, int32 sums
  (csrc/qgemm.h); attention products and everything else float32.
"""

PRECISIONS = ("fp32", "bf16", "int8")


def check_precision(precision, allowed=PRECISIONS, what=None, name="precision"):
    """precision if it is one of `allowed`; otherwise ValueError naming the argument and the
    choices (an unknown name), or saying what cannot run at that precision (a known one)."""
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, PRECISIONS))}, got {precision!r}")
    if precision not in allowed:
        raise ValueError(f"{name}={precision!r} is not available for {what}: "
                         f"choose {' or '.join(map(repr, allowed))}")
    return precision
