"""The attention core of one layer, forward + backward: fused kernel vs the batched-GEMM path.

    python benchmarks/attention_fused.py [--threads 1,2] [--precision fp32,bf16] [--dropout 0.1]
                                         [--shapes 50x40x4x32,...] [--reps 30] [--isa LEVEL]

Times exactly what MultiHeadAttention runs between its projections (the current path: Q Kᵀ,
softmax, dropout, P V, then dP, dV, dropout backward, softmax backward, dQ, dK; the fused path:
attention_train_forward and attention_train_backward), on self-attention's layout (q, k, v
column slices of one [B*T, 3D] array, no padding; causal with --causal). The two are interleaved
(A, B, A, B, ...) in one process so both see the same background load; each prints its median
and best over `reps` rounds. One JSON line per (shape, precision, threads) on stdout: shape
B x T x H x d_head, both timings in ms, ratio = current / fused (above 1 the fused one is
faster), the CPU. --step PRESET times whole training steps of a model preset instead (shapes
B x T), the layers' attention fused or not (Workspace.fused_attention), interleaved the same way.
"""
import argparse
import json
import platform
import subprocess
import time

import numpy as np

from transformer import _C


def cpu_name():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        info = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
        return (f"{info.get('Model name', '?').strip()}, family {info.get('CPU family', '?').strip()}"
                f" model {info.get('Model', '?').strip()}")
    except OSError:
        return platform.processor()


class Case:
    def __init__(self, B, T, H, dh, p, bf16, causal=False, seed=0):
        rng = np.random.default_rng(seed)
        D = H * dh
        self.B, self.T, self.H, self.dh, self.p, self.bf16, self.causal = B, T, H, dh, p, bf16, causal
        self.scale = 1.0 / np.sqrt(dh)
        self.qkv = rng.standard_normal((B * T, 3 * D), dtype=np.float32)
        self.dqkv = np.empty_like(self.qkv)
        self.dctx = rng.standard_normal((B * T, D), dtype=np.float32)
        self.ctx = np.empty((B * T, D), np.float32)
        self.probs = np.empty((B, H, T, T), np.float32)
        self.probs_d = np.empty_like(self.probs)
        self.dprobs = np.empty_like(self.probs)
        q5 = self.qkv.reshape(B, T, 3, H, dh)
        self.q4, self.k4, self.v4 = (q5[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
        d5 = self.dqkv.reshape(B, T, 3, H, dh)
        self.dq4, self.dk4, self.dv4 = (d5[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
        self.ctx4 = self.ctx.reshape(B, T, H, dh).transpose(0, 2, 1, 3)
        self.dctx4 = self.dctx.reshape(B, T, H, dh).transpose(0, 2, 1, 3)
        self.q, self.k, self.v = self.qkv[:, :D], self.qkv[:, D:2 * D], self.qkv[:, 2 * D:]
        self.dq, self.dk, self.dv = self.dqkv[:, :D], self.dqkv[:, D:2 * D], self.dqkv[:, 2 * D:]

    def current(self):
        """layers.MultiHeadAttention's forward and backward between the projections."""
        bf16, probs, p = self.bf16, self.probs, self.p
        _C.gemm(self.q4, self.k4, probs, False, True, bf16=bf16)
        _C.softmax_forward(probs, probs, self.scale, self.causal, None)
        probs_d = probs
        if p > 0:
            probs_d = self.probs_d
            _C.dropout_forward(probs, probs_d, p, 1, 0)
        _C.gemm(probs_d, self.v4, self.ctx4, bf16=bf16)
        dprobs = self.dprobs
        _C.gemm(self.dctx4, self.v4, dprobs, False, True, bf16=bf16)
        _C.gemm(probs_d, self.dctx4, self.dv4, True, False, bf16=bf16)
        if p > 0:
            _C.dropout_backward(dprobs, dprobs, p, 1, 0)
        _C.softmax_backward(probs, dprobs, dprobs, self.scale)
        _C.gemm(dprobs, self.k4, self.dq4, bf16=bf16)
        _C.gemm(dprobs, self.q4, self.dk4, True, False, bf16=bf16)

    def fused(self):
        _C.attention_train_forward(self.q, self.k, self.v, self.probs, self.ctx, self.scale, self.causal,
                                   None, self.p, 1, 0, self.bf16)
        _C.attention_train_backward(self.dctx, self.q, self.k, self.v, self.probs, self.dq, self.dk,
                                    self.dv, self.scale, self.causal, self.p, 1, 0, self.bf16)


def measure(case, reps):
    times = {"current": [], "fused": []}
    for _ in range(3):   # warm-up
        case.current()
        case.fused()
    for _ in range(reps):
        for name in ("current", "fused"):
            fn = getattr(case, name)
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: (float(np.median(t)) * 1e3, float(np.min(t)) * 1e3) for name, t in times.items()}


def measure_step(preset, B, T, precision, reps, dropout):
    """A whole training step (forward_backward) of a model preset on a B x T batch (source and
    target of T tokens, vocabulary 8000), the layers' attention fused or not, interleaved."""
    import transformer as tf
    from transformer.config import PRESETS
    cfg = tf.ModelConfig(**PRESETS[preset], dropout=dropout)
    model = tf.Seq2SeqTransformer(cfg, seed=0)
    rng = np.random.default_rng(0)
    src = rng.integers(3, cfg.src_vocab_size, (B, T))
    tgt = rng.integers(3, cfg.tgt_vocab_size, (B, T + 1))
    tgt[:, 0] = cfg.bos_id
    times = {"current": [], "fused": []}
    for rep in range(reps + 2):
        for name in ("current", "fused"):
            model.ws.fused_attention = name == "fused"
            model.zero_grad()
            t0 = time.perf_counter()
            model.forward_backward(src, tgt[:, :-1], tgt[:, 1:], precision=precision)
            if rep >= 2:
                times[name].append(time.perf_counter() - t0)
    return {name: (float(np.median(t)) * 1e3, float(np.min(t)) * 1e3) for name, t in times.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--precision", default="fp32,bf16")
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--shapes", default="50x40x4x32,128x16x4x32,21x95x4x32,50x40x4x64,128x16x4x64,21x95x4x64",
                    help="B x T x H x d_head, comma-separated (tiny: d_head 32, small: 64)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--isa", default=None)
    ap.add_argument("--causal", action="store_true", help="the decoder's self-attention (causal mask)")
    ap.add_argument("--step", default=None, metavar="PRESET",
                    help="time whole training steps of this preset (tiny, small) instead; shapes B x T")
    args = ap.parse_args()
    if args.isa:
        _C.set_isa(args.isa)
    cpu = cpu_name()
    if args.step:
        for threads in (int(t) for t in args.threads.split(",")):
            _C.set_num_threads(threads)
            for shape in args.shapes.split(","):
                B, T = (int(x) for x in shape.split("x")[:2])
                for precision in args.precision.split(","):
                    t = measure_step(args.step, B, T, precision, args.reps, args.dropout)
                    print(json.dumps({
                        "bench": "attention_fused_step", "preset": args.step, "shape": f"{B}x{T}",
                        "precision": precision, "threads": threads, "dropout": args.dropout,
                        "isa": _C.isa(), "current_ms": round(t["current"][0], 3),
                        "fused_ms": round(t["fused"][0], 3), "current_best_ms": round(t["current"][1], 3),
                        "fused_best_ms": round(t["fused"][1], 3),
                        "ratio": round(t["current"][0] / t["fused"][0], 3),
                        "cpu": cpu, "date": time.strftime("%Y-%m-%d")}), flush=True)
        return
    for threads in (int(t) for t in args.threads.split(",")):
        _C.set_num_threads(threads)
        for shape in args.shapes.split(","):
            B, T, H, dh = (int(x) for x in shape.split("x"))
            for precision in args.precision.split(","):
                case = Case(B, T, H, dh, args.dropout, precision == "bf16", args.causal)
                t = measure(case, args.reps)
                print(json.dumps({
                    "bench": "attention_fused", "shape": shape, "precision": precision,
                    "threads": threads, "dropout": args.dropout, "causal": args.causal, "isa": _C.isa(),
                    "current_ms": round(t["current"][0], 4), "fused_ms": round(t["fused"][0], 4),
                    "current_best_ms": round(t["current"][1], 4), "fused_best_ms": round(t["fused"][1], 4),
                    "ratio": round(t["current"][0] / t["fused"][0], 3),
                    "cpu": cpu, "date": time.strftime("%Y-%m-%d")}), flush=True)


if __name__ == "__main__":
    main()
