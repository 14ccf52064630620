"""GEMM benchmark: ours (transformer._C.gemm) against torch.matmul and numpy.matmul (OpenBLAS).

All three write into preallocated outputs and are timed interleaved in the same loop, after
warm-up; each figure is the median over `repeats`. Threads: ours via transformer.set_num_threads,
torch via torch.set_num_threads, numpy's OpenBLAS via its own set_num_threads (found in the
library numpy loaded; when it cannot be found, numpy is reported with its default threads and
`numpy_threads` says so).

Each record also names the schedule ours ran ("private", "tiles", "shared", "narrow", "dot",
"by_batch"; csrc/gemm/schedule.c) and how many floats of op(b) it packed per call, relative to K * N
(1.0: B packed once; the tiles schedule packs it about once per thread). `schedules=("auto",
"tiles", "shared")` times the large products under each forced schedule as well (a test-only
hook of transformer._C), to check the rule that picks one.

Reduced precision (`precisions=("bf16", "int8")`, `transformer bench --precision`): for the
model's linear maps (x @ W^T: PRECISION_SHAPES), ours at bf16 (ops.matmul precision="bf16")
against torch.matmul on bfloat16 tensors, and ours at int8 (quantize_int8 weights, activations
quantized per row in the call) against torch._int_mm on int8 tensors (the bare int8 x int8 ->
int32 product) and against torch's dynamically quantized Linear (activations quantized in the
call, like ours), with ours at fp32 on the same shape in the same loop. Each row carries the
instruction ceiling measured in the same run (_C.peak_per_core: a pure loop of the instruction
the kernel issues, per core, times the thread count): `fraction_of_ceiling` is the row's figure
over it (bf16: tdpbf16ps tiles at amx, vdpbf16ps at avx512_bf16, below it the fp32 FMA ceiling,
since the fallback multiplies rounded operands with the fp32 FMAs; int8: tdpbusd tiles at amx,
vpdpbusd at avx512_vnni, vpmaddwd + vpaddd on AVX2). Beside it, ours at fp32 on a large
square product (`ours_fp32_peak_gflops`, PEAK_SHAPE).

    python -m transformer.bench.gemm                      # JSON lines
    python -m transformer.bench.gemm --threads 1,2 --large-only --schedules auto,shared
    python -m transformer.bench.gemm --threads 1 --precisions bf16,int8 --precision-only
"""
import ctypes
import glob
import json
import os
import time

import numpy as np

from .harness import engine_threads

# Sleep between one library's timing block and the next when using several threads.
# Before each library's timed block, wait for the previous library's idle threads to stop
# spinning: OpenBLAS (numpy) busy-waits about 2**28 cycles (~80 ms here) after a call, and a
# spinning team steals the core the next library's second thread needs.
SETTLE_S = 0.25
# (M, N, K) of the model's large products: projections, feed-forward, output layer.
LARGE = [(2048, 512, 512), (2048, 2048, 512), (2048, 512, 2048), (1024, 8000, 512)]
# Decoding: a few rows against a weight matrix (x @ W^T).
SKINNY = [(16, 8000, 512), (16, 512, 512)]
# Attention: (batch * heads, T, head dim): scores Q K^T (NT) and context P V (NN).
ATTENTION = [(128, 32, 32), (128, 64, 64), (64, 128, 64)]
# Reduced precision: the linear maps x @ W^T (M, N, K) of training batches and of decoding steps.
PRECISION_SHAPES = [(2048, 512, 512), (2048, 2048, 512), (2048, 512, 2048), (1024, 8000, 512),
                    (16, 8000, 512), (16, 512, 512)]
# The large square product whose fp32 figure the reduced-precision rows are read against.
PEAK_SHAPE = (2048, 2048, 2048)
PEAK_NOTE = "ours at fp32 on a large square product in this run"
CEILING_NOTE = {"bf16": "the bf16 kernel's instruction loop (amx: tdpbf16ps on four tiles; avx512_bf16: "
                        "vdpbf16ps; below it the fp32 FMAs the rounded operands are multiplied with), "
                        "per core x threads",
                "int8": "the int8 kernel's instruction loop (amx: tdpbusd on four tiles; avx512_vnni: "
                        "vpdpbusd; AVX2: vpmaddwd + vpaddd), per core x threads"}


def _openblas_threads_setter():
    """numpy's OpenBLAS set_num_threads, or None."""
    try:
        import numpy
        libdir = os.path.join(os.path.dirname(os.path.dirname(numpy.__file__)), "numpy.libs")
        for path in sorted(glob.glob(os.path.join(libdir, "*openblas*"))):
            lib = ctypes.CDLL(path)
            for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                         "openblas_set_num_threads64_", "openblas_set_num_threads"):
                if hasattr(lib, name):
                    fn = getattr(lib, name)
                    fn.argtypes = [ctypes.c_int]
                    fn.restype = None
                    return fn
    except OSError:
        pass
    return None


def _time_interleaved(fns, repeats, min_seconds=0.02, settle=0.0):
    """Median seconds per call of each function, timed round-robin (the [min, max] of each
    function's samples is left in _time_interleaved.spreads). With several threads, each
    library's idle workers keep spinning for a while after its calls (OpenBLAS for up to ~0.1 s)
    and would steal a core from the next library: `settle` seconds of sleep between blocks let
    them park first."""
    inner = []
    for fn in fns:   # warm-up, and the number of calls per sample (>= min_seconds)
        fn()
        t0 = time.perf_counter()
        fn()
        dt = max(time.perf_counter() - t0, 1e-7)
        inner.append(max(1, int(min_seconds / dt)))
    samples = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            if settle:
                time.sleep(settle)
                fn()   # wake this library's own team
            t0 = time.perf_counter()
            for _ in range(inner[i]):
                fn()
            samples[i].append((time.perf_counter() - t0) / inner[i])
    _time_interleaved.spreads = [[float(np.min(s)), float(np.max(s))] for s in samples]
    return [float(np.median(s)) for s in samples]


def _operands(rng, batch, m, n, k, variant):
    ta, tb = variant[0] == "T", variant[1] == "T"
    a = rng.standard_normal(batch + ((k, m) if ta else (m, k))).astype(np.float32)
    b = rng.standard_normal(batch + ((n, k) if tb else (k, n))).astype(np.float32)
    return a, b, ta, tb


def _measure(rng, batch, m, n, k, variant, repeats, torch, with_numpy, schedule="auto"):
    from transformer import _C

    a, b, ta, tb = _operands(rng, batch, m, n, k, variant)
    out = np.empty(batch + (m, n), np.float32)
    out_t = np.empty_like(out)
    out_n = np.empty_like(out)
    at, bt = torch.from_numpy(a), torch.from_numpy(b)
    opa_t = at.transpose(-1, -2) if ta else at
    opb_t = bt.transpose(-1, -2) if tb else bt
    ot = torch.from_numpy(out_t)
    opa_n = np.swapaxes(a, -1, -2) if ta else a
    opb_n = np.swapaxes(b, -1, -2) if tb else b

    _C._gemm_force_schedule(schedule)
    fns = [lambda: _C.gemm(a, b, out, ta, tb),
           lambda: torch.matmul(opa_t, opb_t, out=ot)]
    if with_numpy:
        fns.append(lambda: np.matmul(opa_n, opb_n, out=out_n))
    try:
        times = _time_interleaved(fns, repeats, settle=SETTLE_S if torch.get_num_threads() > 1 else 0.0)
        spreads = _time_interleaved.spreads
        _C._gemm_stats(reset=True)
        _C.gemm(a, b, out, ta, tb)
        stats = _C._gemm_stats(reset=True)
    finally:
        _C._gemm_force_schedule("auto")
    flops = 2.0 * m * n * k * int(np.prod(batch, dtype=np.int64))
    rec = {"ours_s": times[0], "ref_s": times[1], "ratio": times[1] / times[0],
           "ours_gflops": flops / times[0] / 1e9, "torch_gflops": flops / times[1] / 1e9,
           "ours_spread_s": spreads[0], "ref_spread_s": spreads[1]}
    if with_numpy:
        rec.update(numpy_s=times[2], numpy_ratio=times[2] / times[0], numpy_gflops=flops / times[2] / 1e9,
                   numpy_spread_s=spreads[2])
    batches = int(np.prod(batch, dtype=np.int64))
    rec.update(schedule=stats["schedule"], packed_b_per_kn=stats["packed_b"] / (k * n * batches))
    diff = float(np.abs(out - out_t).max())
    rec["max_abs_diff_vs_torch"] = diff
    return rec


def _relative_error(approx, exact):
    """max |approx - exact| / max |exact|."""
    return float(np.abs(np.asarray(approx, np.float64) - exact).max() / max(np.abs(exact).max(), 1e-30))


def _fp32_peak(rng, shape, repeats):
    """The record of ours at fp32 on the square product `shape` (M, N, K): the figure the
    reduced-precision rows are divided by."""
    from transformer import _C

    m, n, k = shape
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    out = np.empty((m, n), np.float32)
    (t,) = _time_interleaved([lambda: _C.gemm(a, b, out, False, False)], repeats)
    return {"kernel": "gemm NN fp32 peak (ours)", "shape": "x".join(map(str, shape)), "precision": "fp32",
            "ours_s": t, "ours_spread_s": _time_interleaved.spreads[0],
            "ours_gflops": 2.0 * m * n * k / t / 1e9, "peak_kind": PEAK_NOTE}


def _measure_bf16(rng, m, n, k, repeats, torch, settle):
    """x @ W^T with bf16 operands: ours (ops.matmul precision="bf16", fp32 sums and output)
    against torch.matmul on bfloat16 tensors (bf16 output), and ours at fp32."""
    from transformer import ops

    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    out, out_fp32 = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
    xt, wt = torch.from_numpy(x).bfloat16(), torch.from_numpy(w).bfloat16()
    out_t = torch.empty((m, n), dtype=torch.bfloat16)
    fns = [lambda: ops.matmul(x, w, trans_b=True, out=out, precision="bf16"),
           lambda: torch.matmul(xt, wt.t(), out=out_t),
           lambda: ops.matmul(x, w, trans_b=True, out=out_fp32)]
    times = _time_interleaved(fns, repeats, settle=settle)
    spreads = _time_interleaved.spreads
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    ops_ = 2.0 * m * n * k
    return {"ours_call": "ops.matmul(precision='bf16')",
            "reference": "torch.matmul on bfloat16 tensors (bfloat16 output)",
            "ours_s": times[0], "ours_spread_s": spreads[0], "ours_gflops": ops_ / times[0] / 1e9,
            "torch_s": times[1], "torch_spread_s": spreads[1], "torch_gflops": ops_ / times[1] / 1e9,
            "ref_s": times[1], "ref_spread_s": spreads[1], "ratio": times[1] / times[0],
            "ours_fp32_s": times[2], "ours_fp32_spread_s": spreads[2], "ours_fp32_gflops": ops_ / times[2] / 1e9,
            "vs_ours_fp32": times[2] / times[0],
            "max_rel_err_vs_fp64": _relative_error(out, exact),
            "torch_max_rel_err_vs_fp64": _relative_error(out_t.float().numpy(), exact)}


def _torch_int8_references(torch, x, w, bias):
    """({name: fn}, {name: why unavailable}) of PyTorch's int8 products of x @ w^T on this build:
    torch_int_mm, torch._int_mm(int8 [M, K], int8 [K, N]) -> int32, the bare product of operands
    quantized beforehand (no activation quantization, no dequantization in the call); and
    torch_dynamic_linear, torch.ao's dynamically quantized Linear (int8 weights, activations
    quantized in each call, float output plus bias: the same work as ours)."""
    refs, unavailable = {}, {}

    def per_row(v):
        scale = np.maximum(np.abs(v).max(axis=1, keepdims=True), 1e-30) / 127.0
        return np.clip(np.rint(v / scale), -127, 127).astype(np.int8)

    if not hasattr(torch, "_int_mm"):
        unavailable["torch_int_mm"] = f"torch {torch.__version__} has no torch._int_mm"
    else:
        a, b = torch.from_numpy(per_row(x)), torch.from_numpy(per_row(w)).t()
        c = torch.empty((x.shape[0], w.shape[0]), dtype=torch.int32)
        try:
            torch._int_mm(a, b, out=c)
            refs["torch_int_mm"] = lambda: torch._int_mm(a, b, out=c)
        except (RuntimeError, NotImplementedError) as exc:       # not built for this CPU or shape
            unavailable["torch_int_mm"] = " ".join(str(exc).split())[:200]
    try:
        import warnings

        from torch.ao.quantization import quantize_dynamic

        linear = torch.nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(w))
            linear.bias.copy_(torch.from_numpy(bias))
        with warnings.catch_warnings():      # torch.ao.quantization's deprecation notice
            warnings.simplefilter("ignore")
            quantized = quantize_dynamic(torch.nn.Sequential(linear), {torch.nn.Linear}, dtype=torch.qint8)[0]
        xt = torch.from_numpy(x)
        quantized(xt)
        refs["torch_dynamic_linear"] = lambda: quantized(xt)
        refs["torch_dynamic_linear"].check = lambda: quantized(xt).numpy()
    except (ImportError, RuntimeError, NotImplementedError, AssertionError) as exc:
        unavailable["torch_dynamic_linear"] = (f"torch.ao dynamic quantization: {type(exc).__name__}: "
                                               + " ".join(str(exc).split())[:200])
    return refs, unavailable


def _measure_int8(rng, m, n, k, repeats, torch, settle):
    """x @ W^T + bias with int8 weights (one scale per row) and int8 activations: ours against
    PyTorch's int8 products (see _torch_int8_references), and ours at fp32. Figures in GOP/s
    (2 M N K per call). ratio: the fastest PyTorch reference's time / ours."""
    from transformer import _C, ops

    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    q, scale = ops.quantize_int8(w)
    out, out_fp32 = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
    if hasattr(_C, "qgemm_pack") and hasattr(_C, "qgemm_packed"):
        packed = _C.qgemm_pack(q, scale)

        def ours():
            return _C.qgemm_packed(x, packed, bias, out)
        call = "_C.qgemm_packed: weights packed once (as decoding does), x quantized per row in the call"
    else:
        def ours():
            out[...] = ops.int8_linear(x, q, scale, bias)
        call = "ops.int8_linear (packs the weights in every call)"
    refs, unavailable = _torch_int8_references(torch, x, w, bias)
    fns = [ours, lambda: ops.matmul(x, w, trans_b=True, out=out_fp32)] + list(refs.values())
    with torch.inference_mode():
        times = _time_interleaved(fns, repeats, settle=settle)
        spreads = _time_interleaved.spreads
        exact = x.astype(np.float64) @ w.astype(np.float64).T + bias
        ops_ = 2.0 * m * n * k
        rec = {"ours_call": call, "ours_s": times[0], "ours_spread_s": spreads[0], "ours_gops": ops_ / times[0] / 1e9,
               "ours_fp32_s": times[1], "ours_fp32_spread_s": spreads[1], "ours_fp32_gflops": ops_ / times[1] / 1e9,
               "vs_ours_fp32": times[1] / times[0], "max_rel_err_vs_fp64": _relative_error(out, exact)}
        for (name, fn), t, spread in zip(refs.items(), times[2:], spreads[2:]):
            rec.update({f"{name}_s": t, f"{name}_spread_s": spread, f"{name}_gops": ops_ / t / 1e9,
                        f"vs_{name}": t / times[0]})
            if hasattr(fn, "check"):
                rec[f"{name}_max_rel_err_vs_fp64"] = _relative_error(fn.check(), exact)
    for name, why in unavailable.items():
        rec[f"{name}_unavailable"] = why
    if refs:
        best = min(refs, key=lambda name: rec[f"{name}_s"])
        rec.update(reference=best, ref_s=rec[f"{best}_s"], ref_spread_s=rec[f"{best}_spread_s"],
                   ratio=rec[f"{best}_s"] / times[0])
    return rec


def run_precisions(rng, nthreads, precisions, repeats, torch, shapes=PRECISION_SHAPES, peak_shape=PEAK_SHAPE):
    """At the current thread count: the fp32 peak record, then one record per (precision, shape)
    of x @ W^T, each with fraction_of_ours_fp32_peak (its GFLOP/s or GOP/s over the peak's)."""
    from transformer import _C

    settle = SETTLE_S if nthreads > 1 else 0.0
    peak = _fp32_peak(rng, peak_shape, repeats)
    per_core = _C.peak_per_core(0.3)
    ceilings = {"bf16": per_core["bf16_gflops"] * nthreads, "int8": per_core["int8_gops"] * nthreads}
    fma = per_core["fp32_fma_gflops"] * nthreads
    peak.update(fp32_fma_ceiling_gflops=fma, fraction_of_ceiling=peak["ours_gflops"] / fma)
    records = [{**peak, "threads": nthreads}]
    for precision in precisions:
        measure = {"bf16": _measure_bf16, "int8": _measure_int8}[precision]
        for m, n, k in shapes:
            rec = {"kernel": f"gemm NT {precision}", "shape": f"{m}x{n}x{k}", "threads": nthreads,
                   "precision": precision}
            rec.update(measure(rng, m, n, k, repeats, torch, settle))
            figure = rec.get("ours_gflops", rec.get("ours_gops"))
            rec.update(ours_fp32_peak_gflops=peak["ours_gflops"],
                       fraction_of_ours_fp32_peak=figure / peak["ours_gflops"], peak_kind=PEAK_NOTE,
                       ceiling=ceilings[precision], fraction_of_ceiling=figure / ceilings[precision],
                       ceiling_kind=CEILING_NOTE[precision], isa=per_core["isa"])
            records.append(rec)
    return records


def run(threads=(1, 2), repeats=5, large=True, skinny=True, attention=True, schedules=("auto",),
        precisions=(), precision_shapes=PRECISION_SHAPES, peak_shape=PEAK_SHAPE):
    """One record per (case, thread count): ours vs torch (ratio = torch time / ours) and numpy.
    schedules: the large products are timed once per entry ("auto": the normal choice; "tiles" or
    "shared": forced), the others with "auto" only. precisions ("bf16", "int8"): also the
    reduced-precision rows of run_precisions at every thread count (refused before any work,
    RuntimeError, when the engine lacks them)."""
    import torch


    from .precision import require
    precisions = tuple(p for p in precisions if p != "fp32")
    for precision in precisions:
        require(precision, "kernels")

    set_blas_threads = _openblas_threads_setter()
    rng = np.random.default_rng(0)
    records = []
    with engine_threads(torch) as set_threads:
        for nthreads in threads:
            set_threads(nthreads)
            if set_blas_threads is not None:
                set_blas_threads(nthreads)
            cases = []
            if large:
                cases += [("gemm " + v, (), s, v, True, sch) for s in LARGE for v in ("NN", "NT", "TN")
                          for sch in schedules]
            if skinny:
                cases += [("gemm " + v, (), s, v, True, "auto") for s in SKINNY for v in ("NT", "NN")]
            if attention:
                cases += [("batched gemm " + v, (bh,), (t, t if v == "NT" else dh, dh if v == "NT" else t), v,
                           True, "auto") for bh, t, dh in ATTENTION for v in ("NT", "NN")]
            for kernel, batch, (m, n, k), variant, with_numpy, schedule in cases:
                rec = {"kernel": kernel,
                       "shape": "x".join(map(str, batch + (m, n, k))),
                       "threads": nthreads,
                       "numpy_threads": nthreads if set_blas_threads is not None else "default",
                       "forced_schedule": schedule}
                rec.update(_measure(rng, batch, m, n, k, variant, repeats, torch, with_numpy, schedule))
                records.append(rec)
            if precisions:
                records += run_precisions(rng, nthreads, precisions, repeats, torch, precision_shapes, peak_shape)
    return records


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--large-only", action="store_true", help="only the model's large products")
    parser.add_argument("--schedules", default="auto", help="for the large products: auto,tiles,shared")
    parser.add_argument("--precisions", default="", help="also the reduced-precision rows: bf16,int8")
    parser.add_argument("--precision-only", action="store_true", help="only the reduced-precision rows")
    args = parser.parse_args()
    only = args.large_only
    fp32 = not args.precision_only
    for record in run(threads=tuple(int(t) for t in args.threads.split(",")), repeats=args.repeats,
                      large=fp32, skinny=fp32 and not only, attention=fp32 and not only,
                      schedules=tuple(args.schedules.split(",")),
                      precisions=tuple(p for p in args.precisions.split(",") if p)):
        print(json.dumps(record), flush=True)
