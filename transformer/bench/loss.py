"""Benchmark: fused cross-entropy forward+backward and fused Adam against PyTorch.

- cross_entropy on [N, V] logits (label smoothing 0.1, ~10% of rows ignored): ours
  (_C.cross_entropy writing dlogits, and in place) against F.cross_entropy forward + autograd
  backward. GB/s counts the logits read once and the gradient written once.
- adam_step on one flat buffer (3M elements, and 44M, about the base model) against
  torch.optim.Adam with foreach=False (the single-tensor path we follow), foreach=True, and
  fused=True where this PyTorch has a fused CPU Adam. GB/s counts 4 buffers read and 3 written.

Ours and the references are timed interleaved in the same loop after warm-up, at the same
thread count; the median of `repeats` is reported. ratio = reference time / our time.
"""
import statistics
import time

import numpy as np

from transformer import _C

from .harness import engine_threads, print_records


def _timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


_SPREADS = {}  # name -> [fastest, slowest] call of the last _interleaved run (next to the median)


def _interleaved(fns, repeats, warmup=1):
    """Median seconds per call of each fn in `fns` (dict), calls interleaved."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(_timed(fn))
    _SPREADS.clear()
    _SPREADS.update({name: [min(t), max(t)] for name, t in times.items()})
    return {name: statistics.median(t) for name, t in times.items()}


def _with_minima(records, ours, ref):
    """Add the fastest calls (ours_min_s, ref_min_s): on a shared machine the median of a
    2-thread run often includes a wait for a descheduled thread."""
    for record, (o, r) in zip(records, zip(ours, ref)):
        record["ours_min_s"], record["ref_min_s"] = _SPREADS[o][0], _SPREADS[r][0]
        record["ours_spread_s"], record["ref_spread_s"] = _SPREADS[o], _SPREADS[r]
    return records


def bench_cross_entropy(N, V, threads, repeats, label_smoothing=0.1, ignored=0.1):
    import torch
    F = torch.nn.functional
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((N, V)) * 2).astype(np.float32)
    targets = rng.integers(1, V, N).astype(np.int64)
    targets[rng.random(N) < ignored] = -100
    dlogits = np.empty_like(logits)
    scratch = logits.copy()
    x = torch.from_numpy(logits.copy()).requires_grad_()
    t = torch.from_numpy(targets)

    def ours():
        _C.cross_entropy(logits, targets, dlogits, label_smoothing=label_smoothing)

    def ours_in_place():
        # the gradient overwrites the logits (the copy back is not timed: see below)
        _C.cross_entropy(scratch, targets, scratch, label_smoothing=label_smoothing)

    def ref():
        x.grad = None
        loss = F.cross_entropy(x, t, ignore_index=-100, label_smoothing=label_smoothing)
        loss.backward()

    times = _interleaved({"ours": ours, "ours_in_place": ours_in_place, "ref": ref}, repeats)
    gbytes = 2 * N * V * 4 / 1e9
    shape = f"[{N}, {V}]"
    return _with_minima([
        {"kernel": "cross_entropy fwd+bwd (ls 0.1)", "shape": shape, "threads": threads,
         "ours_s": times["ours"], "ref_s": times["ref"], "ratio": times["ref"] / times["ours"],
         "ours_gbps": gbytes / times["ours"], "ref_gbps": gbytes / times["ref"],
         "reference": "torch F.cross_entropy + backward"},
        {"kernel": "cross_entropy fwd+bwd in place", "shape": shape, "threads": threads,
         "ours_s": times["ours_in_place"], "ref_s": times["ref"],
         "ratio": times["ref"] / times["ours_in_place"],
         "ours_gbps": gbytes / times["ours_in_place"],
         "reference": "torch F.cross_entropy + backward"},
    ], ["ours", "ours_in_place"], ["ref", "ref"])


def bench_adam(n, threads, repeats):
    import torch
    rng = np.random.default_rng(1)
    p = rng.standard_normal(n).astype(np.float32)
    g = (rng.standard_normal(n) * 1e-2).astype(np.float32)
    m = np.zeros(n, np.float32)
    v = np.zeros(n, np.float32)
    step = [0]

    def ours():
        step[0] += 1
        _C.adam_step(p, g, m, v, step[0], 1e-4, 0.9, 0.98, 1e-9, 0.0, False)

    fns = {"ours": ours}
    variants = {"foreach=False": dict(foreach=False), "foreach=True": dict(foreach=True),
                "fused=True": dict(fused=True)}
    optimizers = {}
    for name, kwargs in variants.items():
        tp = torch.nn.Parameter(torch.from_numpy(p.copy()))
        tp.grad = torch.from_numpy(g.copy())
        try:
            opt = torch.optim.Adam([tp], lr=1e-4, betas=(0.9, 0.98), eps=1e-9, **kwargs)
            opt.step()
        except (RuntimeError, ValueError, TypeError):
            continue  # e.g. no fused CPU Adam in this PyTorch
        optimizers[name] = (opt, tp)
        fns[name] = opt.step
    times = _interleaved(fns, repeats)
    gbytes = 7 * n * 4 / 1e9
    shape = f"[{n}]"
    records = []
    for name in optimizers:
        records.append({"kernel": f"adam_step vs Adam({name})", "shape": shape,
                        "threads": threads, "ours_s": times["ours"], "ref_s": times[name],
                        "ratio": times[name] / times["ours"],
                        "ours_gbps": gbytes / times["ours"], "ref_gbps": gbytes / times[name],
                        "reference": f"torch.optim.Adam({name})"})
    _with_minima(records, ["ours"] * len(records), list(optimizers))
    del optimizers
    return records


def bench_sum_squares(n, threads, repeats):
    import torch
    x = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    tx = torch.from_numpy(x)
    times = _interleaved({"ours": lambda: _C.sum_squares(x),
                          "ref": lambda: torch.linalg.vector_norm(tx)},
                         repeats)
    return _with_minima([{"kernel": "sum_squares (double acc.)", "shape": f"[{n}]",
                          "threads": threads, "ours_s": times["ours"], "ref_s": times["ref"],
                          "ratio": times["ref"] / times["ours"],
                          "ours_gbps": n * 4 / 1e9 / times["ours"],
                          "reference": "torch.linalg.vector_norm (float32, as clip_grad_norm_)"}],
                        ["ours"], ["ref"])


def run(threads=(1, 2), repeats=7, big_adam=True):
    """One dict per measurement (see the module docstring)."""
    import torch
    records = []
    with engine_threads(torch) as set_threads:
        for n_threads in threads:
            set_threads(n_threads)
            for N, V in ((1024, 4000), (1024, 8000)):
                records += bench_cross_entropy(N, V, n_threads, repeats)
            records += bench_adam(3_000_000, n_threads, repeats)
            if big_adam:
                records += bench_adam(44_000_000, n_threads, max(3, repeats // 2))
            records += bench_sum_squares(44_000_000, n_threads, repeats)
    # thread scaling of our kernel: time at the fewest threads measured / time at this count
    base = {}
    for r in records:
        key = (r["kernel"], r["shape"])
        if key not in base or r["threads"] < base[key]["threads"]:
            base[key] = r
    for r in records:
        b = base[(r["kernel"], r["shape"])]
        r["ours_speedup_vs_%d_thread" % b["threads"]] = b["ours_s"] / r["ours_s"]
    return records


if __name__ == "__main__":
    print_records(run())
