"""Benchmark: masked softmax and layer norm kernels against PyTorch at the same thread count.

Each measurement times ours and the PyTorch equivalent interleaved in the same loop (after a
warm-up), takes the median of `repeats` batches, and reports seconds per call, GB/s (bytes the
op must read and write once) and ratio = torch time / our time (> 1: we are faster).

PyTorch equivalents:
- softmax forward: scores.masked_fill(mask, -inf).softmax(-1) (mask: causal [Tq, Tk] or key padding
  [B, 1, 1, Tk]); ours also applies the 1/sqrt(d_head) scale in the same pass.
- softmax backward: torch._softmax_backward_data(dprobs, probs, -1, float32) (what autograd runs).
- layer norm forward: F.layer_norm(x, (D,), weight, bias) under no_grad (native_layer_norm, which
  also returns mean and rstd).
- layer norm backward: torch.ops.aten.native_layer_norm_backward (what autograd runs).

Every array (ours and the torch inputs, which share numpy's memory) starts on a 64-byte
boundary, as torch's own outputs do: a 512-bit access that straddles two cache lines costs
~10% on these memory-bound ops, and numpy's large arrays start 16 bytes into a line.

python -m transformer.bench.nn  prints one JSON line per measurement.
"""

import numpy as np

from .harness import engine_threads, kernel_record, print_records, time_pair

SOFTMAX_SHAPES = {"tiny": (32, 4, 32, 32), "base": (16, 8, 64, 64)}
LAYERNORM_SHAPES = [(1024, 128), (1024, 512)]


def _aligned(a):
    """A copy of `a` whose data starts on a 64-byte boundary."""
    a = np.asarray(a)
    buf = np.empty(a.nbytes + 64, dtype=np.uint8)
    offset = (-buf.ctypes.data) % 64
    out = buf[offset:offset + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def _softmax_cases(torch, _C, threads, repeats, rng):
    out = []
    for name, shape in SOFTMAX_SHAPES.items():
        B, H, Tq, Tk = shape
        scale = 1.0 / np.sqrt(64.0)
        scores = _aligned(rng.standard_normal(shape, dtype=np.float32))
        probs = _aligned(np.zeros_like(scores))
        pad = np.zeros((B, Tk), dtype=bool)
        for b in range(B):                       # varied padding, at least one key kept
            pad[b, Tk - (b * 7) % (Tk // 2):] = True
        causal_t = torch.ones(Tq, Tk, dtype=torch.bool).triu(1)
        pad_t = torch.from_numpy(pad)[:, None, None, :]
        scores_t = torch.from_numpy(scores)
        n = scores.size
        for mode in ("causal", "padding"):
            causal = mode == "causal"
            mask_np = None if causal else pad
            mask_t = causal_t if causal else pad_t

            def ours_fwd():
                _C.softmax_forward(scores, probs, scale, causal, mask_np, 0)

            def ref_fwd():
                scores_t.masked_fill(mask_t, float("-inf")).softmax(-1)

            o, r = time_pair(ours_fwd, ref_fwd, repeats)
            extra_bytes = 0 if causal else pad.size
            out.append(kernel_record("softmax_forward", shape, threads, o, r, 8 * n + extra_bytes,
                                     mode=mode, size=name))

            ours_fwd()
            dprobs = _aligned(rng.standard_normal(shape, dtype=np.float32))
            dscores = _aligned(np.zeros_like(dprobs))
            probs_t = torch.from_numpy(_aligned(probs))
            dprobs_t = torch.from_numpy(dprobs)

            def ours_bwd():
                _C.softmax_backward(probs, dprobs, dscores, scale)

            def ref_bwd():
                torch._softmax_backward_data(dprobs_t, probs_t, -1, torch.float32)

            o, r = time_pair(ours_bwd, ref_bwd, repeats)
            out.append(kernel_record("softmax_backward", shape, threads, o, r, 12 * n,
                                     mode=mode, size=name))
    return out


def _layernorm_cases(torch, _C, threads, repeats, rng):
    F = torch.nn.functional
    out = []
    for N, D in LAYERNORM_SHAPES:
        x = _aligned(rng.standard_normal((N, D), dtype=np.float32))
        w = _aligned(rng.standard_normal(D, dtype=np.float32))
        b = _aligned(rng.standard_normal(D, dtype=np.float32))
        y = _aligned(np.zeros_like(x))
        mean = _aligned(np.zeros(N, np.float32))
        rstd = _aligned(np.zeros(N, np.float32))
        xt, wt, bt = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b)

        def ours_fwd():
            _C.layernorm_forward(x, w, b, y, mean, rstd, 1e-5)

        def ref_fwd():
            with torch.no_grad():
                F.layer_norm(xt, (D,), wt, bt, 1e-5)

        o, r = time_pair(ours_fwd, ref_fwd, repeats)
        out.append(kernel_record("layernorm_forward", (N, D), threads, o, r, 8 * x.size))

        ours_fwd()
        dy = _aligned(rng.standard_normal((N, D), dtype=np.float32))
        dx = _aligned(np.zeros_like(x))
        dw = _aligned(np.zeros(D, np.float32))
        db = _aligned(np.zeros(D, np.float32))
        dyt = torch.from_numpy(dy)
        _, mean_t, rstd_t = torch.native_layer_norm(xt, [D], wt, bt, 1e-5)

        def ours_bwd():
            _C.layernorm_backward(dy, x, w, mean, rstd, dx, dw, db, False)

        def ref_bwd():
            torch.ops.aten.native_layer_norm_backward(dyt, xt, [D], mean_t, rstd_t, wt, bt,
                                                      [True, True, True])

        o, r = time_pair(ours_bwd, ref_bwd, repeats)
        out.append(kernel_record("layernorm_backward", (N, D), threads, o, r, 12 * x.size))
    return out


def run(threads=(1, 2), repeats=15):
    """One dict per (kernel, shape, mode, threads): ours vs torch, interleaved, median of repeats."""
    import torch

    from transformer import _C

    rng = np.random.default_rng(0)
    results = []
    with engine_threads(torch) as set_threads:
        for n in threads:
            set_threads(n)
            results += _softmax_cases(torch, _C, n, repeats, rng)
            results += _layernorm_cases(torch, _C, n, repeats, rng)
    _add_scaling(results)
    return results


def _add_scaling(results):
    """speedup_vs_1t: time at 1 thread / time at this thread count, for ours and for torch."""
    base = {}
    for r in results:
        if r["threads"] == 1:
            base[(r["kernel"], tuple(r["shape"]), r.get("mode"))] = r
    for r in results:
        b = base.get((r["kernel"], tuple(r["shape"]), r.get("mode")))
        if b is not None:
            r["ours_speedup_vs_1t"] = b["ours_s"] / r["ours_s"]
            r["ref_speedup_vs_1t"] = b["ref_s"] / r["ref_s"]


if __name__ == "__main__":
    print_records(run())
