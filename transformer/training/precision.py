"""The precision a training run multiplies in: `--precision auto` (the default) resolved on the CPU
at hand, with the reason the run prints at its start.

bf16 rounds every GEMM operand to bfloat16 and sums in float32; weights, gradients, Adam, softmax,
layer norm and the loss stay float32 (DESIGN, "Data layout"). It can pay only where the CPU
multiplies bfloat16 pairs itself: AMX tiles (tdpbf16ps) and avx512_bf16 (vdpbf16ps). Below those
levels the bf16 kernels round the operands and multiply them with the fp32 FMA kernels, the same
work as fp32 plus the rounding: slower, never faster, so `auto` keeps fp32 there.

Where the instruction exists, whether it pays is measured, not assumed: a probe times a few
products of a training step's shapes in both precisions (0.03-0.06 s, once a process) and
`auto` takes bf16 only where they ran at least BF16_PAYS times as fast. A `tiny` step on the Bible's
batches, 2 threads:
- an Intel Xeon (family 6 model 207) with AMX: 0.104 s in bf16 against 0.150 s in fp32 (`small`
  0.295 s against 0.540 s; benchmarks/notes/2026-12-01-time-to-quality.md), and the dev BLEU at
  equal steps within the seed-to-seed spread of fp32 on both shared corpora;
- AMD Zen 5 (family 26 model 2, avx512_bf16): 1.37x faster in bf16;
- the same Xeon model where the hypervisor hides AMX (level avx512_bf16): vdpbf16ps has no more
  throughput than an fp32 FMA on Intel cores; the products ran 0.53-0.70x as fast as fp32's and the
  step took 0.184 s against 0.122 s, so `auto` trains in fp32 there
  (benchmarks/notes/2026-12-02-xeon-without-amx.md)."""
import time

import numpy as np

from .. import _C

# The dispatch levels (TRANSFORMER_ISA) whose bf16 GEMM multiplies bfloat16 natively.
NATIVE_BF16 = {"amx": "AMX tiles (tdpbf16ps)", "avx512_bf16": "avx512_bf16 (vdpbf16ps)"}
CHOICES = ("auto", "fp32", "bf16")
# `auto` takes bf16 where the probe's products ran at least this many times as fast as in fp32:
# below it the step's other work (loss, layer norm, Adam: a third of a `tiny` step) leaves too
# little of the gain to be worth the rounding.
BF16_PAYS = 1.1
# The probe: (rows, K, N, trans_a) of a step's products: the input of a feed-forward layer, its
# output, and a weight gradient (K the rows of a batch), each timed in both precisions in rounds
# whose order alternates; the best round of each counts.
PROBE_SHAPES = ((512, 128, 512, False), (512, 512, 128, False), (128, 512, 512, True))
PROBE_ROUNDS = 7
_measured = {}    # (level, threads) -> bf16_speedup(): one probe a process for each


def native_bf16(level=None):
    """How the dispatch level in use (or `level`) multiplies bfloat16 natively, or None."""
    return NATIVE_BF16.get(level or _C.isa())


def bf16_speedup(rounds=PROBE_ROUNDS):
    """fp32's time over bf16's for the probe's products (PROBE_SHAPES), at the dispatch level and
    thread count in use: above 1, bf16 multiplies faster here."""
    rng = np.random.default_rng(0)
    cases = []
    for rows, k, n, trans_a in PROBE_SHAPES:
        a = rng.standard_normal((k, rows) if trans_a else (rows, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        cases.append((a, b, np.empty((rows, n), np.float32), trans_a))
    best = {False: float("inf"), True: float("inf")}
    for r in range(rounds + 1):                 # round 0 warms both (buffers, AMX's tile permission)
        for bf16 in ((False, True) if r % 2 else (True, False)):
            started = time.perf_counter()
            for a, b, out, trans_a in cases:
                _C.gemm(a, b, out, trans_a=trans_a, bf16=bf16)
            if r:
                best[bf16] = min(best[bf16], time.perf_counter() - started)
    return best[False] / best[True]


def measured_speedup():
    """bf16_speedup() at the level and thread count in use, probed once a process for each."""
    key = (_C.isa(), _C.get_num_threads())
    if key not in _measured:
        _measured[key] = bf16_speedup()
    return _measured[key]


def resolve(requested, level=None, speedup=None):
    """(precision, why) for train's --precision: `auto` becomes bf16 where the level in use multiplies
    bfloat16 natively and speedup() (by default measured_speedup(), the probe) finds its products at
    least BF16_PAYS times as fast as fp32's, and fp32 elsewhere; fp32 and bf16 are the user's choice."""
    level = level or _C.isa()
    if requested != "auto":
        why = "--precision " + requested
        if requested == "bf16" and native_bf16(level) is None:
            why += (f"; this CPU's level ({level}) has no bf16 multiply, so every product runs on the fp32 "
                    "kernels after rounding: expect it slower than fp32")
        return requested, why
    native = native_bf16(level)
    if native is not None:
        ratio = round((speedup or measured_speedup)(), 2)     # decided on the figure it prints
        if ratio >= BF16_PAYS:
            return "bf16", (f"auto: this CPU multiplies bfloat16 natively with {native}, and a probe of a step's "
                            f"products ran them {ratio:.2f}x as fast as in fp32, so every GEMM takes bf16 operands "
                            "with float32 sums; weights, optimizer and checkpoints stay float32; --precision fp32 "
                            "to choose")
        return "fp32", (f"auto: this CPU multiplies bfloat16 with {native}, but a probe of a step's products ran "
                        f"them only {ratio:.2f}x as fast as in fp32 (bf16 pays from {BF16_PAYS:g}x), so fp32; "
                        "--precision bf16 to choose")
    return "fp32", (f"auto: this CPU's level ({level}) has no native bfloat16 multiply (AMX or avx512_bf16), "
                    "where bf16 would only add rounding work; --precision bf16 to choose")


def describe(precision, why):
    """The start line of a run."""
    return f"precision: {precision} ({why})"
