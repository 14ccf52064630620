"""The precision a training run multiplies in: `--precision auto` (the default) resolved on the CPU
at hand, with the reason the run prints at its start.

bf16 rounds every GEMM operand to bfloat16 and sums in float32; weights, gradients, Adam, softmax,
layer norm and the loss stay float32 (DESIGN, "Data layout"). It pays where the CPU multiplies
bfloat16 pairs itself: AMX tiles (tdpbf16ps) and avx512_bf16 (vdpbf16ps). Below those levels the
bf16 kernels round the operands and multiply them with the fp32 FMA kernels, the same work as
fp32 plus the rounding: slower, never faster, so `auto` keeps fp32 there.

Measured on an Intel Xeon (family 6 model 207, AMX, 2 threads; benchmarks/notes/
2026-12-01-time-to-quality.md): a `tiny` step on the Bible's batches 0.104 s in bf16 against 0.150 s
in fp32, `small` 0.295 s against 0.540 s; the dev BLEU at equal steps is within the seed-to-seed
spread of fp32 on both shared corpora."""
from .. import _C

# The dispatch levels (TRANSFORMER_ISA) whose bf16 GEMM multiplies bfloat16 natively.
NATIVE_BF16 = {"amx": "AMX tiles (tdpbf16ps)", "avx512_bf16": "avx512_bf16 (vdpbf16ps)"}
CHOICES = ("auto", "fp32", "bf16")


def native_bf16(level=None):
    """How the dispatch level in use (or `level`) multiplies bfloat16 natively, or None."""
    return NATIVE_BF16.get(level or _C.isa())


def resolve(requested, level=None):
    """(precision, why) for train's --precision: `auto` becomes bf16 where the level in use multiplies
    bfloat16 natively and fp32 elsewhere; fp32 and bf16 are the user's choice."""
    level = level or _C.isa()
    if requested != "auto":
        why = "--precision " + requested
        if requested == "bf16" and native_bf16(level) is None:
            why += (f"; this CPU's level ({level}) has no bf16 multiply, so every product runs on the fp32 "
                    "kernels after rounding: expect it slower than fp32")
        return requested, why
    native = native_bf16(level)
    if native is not None:
        return "bf16", (f"auto: this CPU multiplies bfloat16 natively with {native}, so every GEMM takes bf16 "
                        "operands with float32 sums; weights, optimizer and checkpoints stay float32; "
                        "--precision fp32 to choose")
    return "fp32", (f"auto: this CPU's level ({level}) has no native bfloat16 multiply (AMX or avx512_bf16), "
                    "where bf16 would only add rounding work; --precision bf16 to choose")


def describe(precision, why):
    """The start line of a run."""
    return f"precision: {precision} ({why})"
