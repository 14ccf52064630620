"""GEMM benchmark: ours (transformer._C.gemm) against torch.matmul and numpy.matmul (OpenBLAS).

All three write into preallocated outputs and are timed interleaved in the same loop, after
warm-up; each figure is the median over `repeats`. Threads: ours via transformer.set_num_threads,
torch via torch.set_num_threads, numpy's OpenBLAS via its own set_num_threads (found in the
library numpy loaded; when it cannot be found, numpy is reported with its default threads and
`numpy_threads` says so).

Each record also names the schedule ours ran ("private", "tiles", "shared", "narrow", "dot",
"by_batch"; csrc/gemm.c) and how many floats of op(b) it packed per call, relative to K * N
(1.0: B packed once; the tiles schedule packs it about once per thread). `schedules=("auto",
"tiles", "shared")` times the large products under each forced schedule as well (a test-only
hook of transformer._C), to check the rule that picks one.

    python -m transformer.bench.gemm                      # JSON lines
    python -m transformer.bench.gemm --threads 1,2 --large-only --schedules auto,shared
"""
import ctypes
import glob
import json
import os
import time

import numpy as np

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


def run(threads=(1, 2), repeats=5, large=True, skinny=True, attention=True, schedules=("auto",)):
    """One record per (case, thread count): ours vs torch (ratio = torch time / ours) and numpy.
    schedules: the large products are timed once per entry ("auto": the normal choice; "tiles" or
    "shared": forced), the others with "auto" only."""
    import torch

    import transformer as T

    set_blas_threads = _openblas_threads_setter()
    rng = np.random.default_rng(0)
    before_ours, before_torch = T.get_num_threads(), torch.get_num_threads()
    records = []
    try:
        for nthreads in threads:
            T.set_num_threads(nthreads)
            torch.set_num_threads(nthreads)
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
    finally:
        T.set_num_threads(before_ours)
        torch.set_num_threads(before_torch)
    return records


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--large-only", action="store_true", help="only the model's large products")
    parser.add_argument("--schedules", default="auto", help="for the large products: auto,tiles,shared")
    args = parser.parse_args()
    only = args.large_only
    for record in run(threads=tuple(int(t) for t in args.threads.split(",")), repeats=args.repeats,
                      skinny=not only, attention=not only, schedules=tuple(args.schedules.split(","))):
        print(json.dumps(record), flush=True)
