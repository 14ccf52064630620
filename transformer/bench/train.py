"""A full training step (forward, backward, Adam), ours against PyTorch, from the same run.

For each configuration and thread count: both engines warm up, then their steps alternate
(ours, torch, ours, torch, ...) and the median step time of each gives target tokens per second.
Peak resident memory of the step is measured for each engine in a fresh subprocess
(resource.getrusage ru_maxrss), so neither sees the other's allocations.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

# name: model sizes, batch, source and target length (DESIGN's presets; issue 3's batches)
CONFIGS = {
    "tiny": dict(sizes=dict(d_model=128, n_heads=4, d_ff=512, n_encoder_layers=2, n_decoder_layers=2),
                 vocab=4000, batch=32, length=32, repeats=15),
    "base": dict(sizes=dict(d_model=512, n_heads=8, d_ff=2048, n_encoder_layers=6, n_decoder_layers=6),
                 vocab=8000, batch=16, length=64, repeats=3),
}
DROPOUT = 0.1
LABEL_SMOOTHING = 0.1


def _config(name):
    import transformer as T
    c = CONFIGS[name]
    return T.ModelConfig(src_vocab_size=c["vocab"], tgt_vocab_size=c["vocab"], dropout=DROPOUT,
                         max_len=max(512, c["length"] + 1), **c["sizes"])


def _batch(name, seed=0):
    c = CONFIGS[name]
    rng = np.random.default_rng(seed)
    src = rng.integers(3, c["vocab"], (c["batch"], c["length"]), dtype=np.int64)
    tgt = rng.integers(3, c["vocab"], (c["batch"], c["length"] + 1), dtype=np.int64)
    tgt[:, 0] = 1
    return src, tgt[:, :-1].copy(), tgt[:, 1:].copy()


class _Ours:
    def __init__(self, name):
        import transformer as T
        self.model = T.Seq2SeqTransformer(_config(name), seed=0)
        self.opt = T.Adam(self.model, lr=1e-4)
        self.batch = _batch(name)

    def step(self):
        self.model.zero_grad()
        loss = self.model.forward_backward(*self.batch, label_smoothing=LABEL_SMOOTHING)
        self.opt.step()
        return loss


class _Torch:
    def __init__(self, name):
        import torch
        from transformer.torch_compat import build_torch_model
        self.torch = torch
        self.model = build_torch_model(_config(name), seed=0)
        self.model.train()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
        self.batch = [torch.from_numpy(x) for x in _batch(name)]

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        loss = self.model.loss(*self.batch, label_smoothing=LABEL_SMOOTHING)
        loss.backward()
        self.opt.step()
        return loss.item()


def _timed(step):
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def run(threads=(1, 2), repeats=None, configs=("tiny", "base"), memory=True):
    """One dict per (config, threads): step times (median), target tokens/s and the ratio
    (torch time / our time: > 1 means we are faster); then one memory dict per config."""
    import torch

    import transformer as T
    records = []
    prev_ours, prev_torch = T.get_num_threads(), torch.get_num_threads()
    try:
        for name in configs:
            c = CONFIGS[name]
            ours, ref = _Ours(name), _Torch(name)
            tokens = c["batch"] * c["length"]
            n_rep = repeats or c["repeats"]
            for n in threads:
                T.set_num_threads(n)
                torch.set_num_threads(n)
                ours.step(), ref.step()           # warm-up: buffers, packing, thread teams
                if name == "tiny":
                    ours.step(), ref.step()
                ours_t, ref_t = [], []
                for _ in range(n_rep):
                    ours_t.append(_timed(ours.step))
                    ref_t.append(_timed(ref.step))
                o, r = statistics.median(ours_t), statistics.median(ref_t)
                records.append({"bench": "train_step", "kernel": f"train_step {name}", "config": name,
                                "threads": n,
                                "shape": f"B{c['batch']} S{c['length']} T{c['length']} V{c['vocab']}",
                                "ours_s": o, "ref_s": r, "ratio": r / o,
                                "ours_tokens_per_s": tokens / o, "ref_tokens_per_s": tokens / r,
                                "ours_per_s": tokens / o,
                                "repeats": n_rep})
            del ours, ref
        if memory:
            for name in configs:
                if name != "base" and len(configs) > 1:
                    continue
                ours_kb, ref_kb = _peak_rss(name, "ours"), _peak_rss(name, "torch")
                records.append({"bench": "train_step_peak_rss", "kernel": f"train_step {name} peak RSS",
                                "config": name,
                                "ours_mb": ours_kb / 1024, "ref_mb": ref_kb / 1024,
                                "ratio": ref_kb / ours_kb})
    finally:
        T.set_num_threads(prev_ours)
        torch.set_num_threads(prev_torch)
    return records


def _peak_rss(name, engine):
    """Peak resident set (KiB) of a fresh process running three training steps of `engine`.

    Read from /proc/self/status VmHWM, the high-water mark of the child's own address space:
    ru_maxrss would not do here, since Linux carries the parent's high-water mark across
    fork + exec into the child's ru_maxrss (the parent holds both models when this runs)."""
    code = ("import resource, sys; from transformer.bench.train import _Ours, _Torch, _vm_hwm_kib; "
            f"e = (_Ours if {engine!r} == 'ours' else _Torch)({name!r}); "
            "[e.step() for _ in range(3)]; "
            "print(_vm_hwm_kib() or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    # cwd outside any checkout: `python -c` puts the cwd first on sys.path
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True, cwd=tempfile.gettempdir())
    return int(out.stdout.strip().splitlines()[-1])


def _vm_hwm_kib():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def profile(name="tiny", threads=1, steps=5):
    """Where our step's time goes: seconds per call site (kernel wrappers timed by name)."""
    import collections

    import transformer as T
    from transformer import _C
    totals = collections.Counter()
    counts = collections.Counter()
    originals = {}
    for fn in ("gemm", "softmax_forward", "softmax_backward", "layernorm_forward", "layernorm_backward",
               "embedding_forward", "embedding_backward", "add", "add_bias", "bias_grad",
               "bias_act_forward", "act_backward", "dropout_forward", "dropout_backward",
               "cross_entropy", "adam_step"):
        originals[fn] = getattr(_C, fn)

        def wrap(*a, _f=originals[fn], _n=fn, **k):
            t0 = time.perf_counter()
            r = _f(*a, **k)
            totals[_n] += time.perf_counter() - t0
            counts[_n] += 1
            return r
        setattr(_C, fn, wrap)
    prev = T.get_num_threads()
    T.set_num_threads(threads)
    try:
        ours = _Ours(name)
        ours.step()
        totals.clear(), counts.clear()
        t0 = time.perf_counter()
        for _ in range(steps):
            ours.step()
        total = (time.perf_counter() - t0) / steps
    finally:
        for fn, f in originals.items():
            setattr(_C, fn, f)
        T.set_num_threads(prev)
    rows = {k: (v / steps, counts[k] // steps) for k, v in totals.most_common()}
    return total, rows


if __name__ == "__main__":
    for record in run():
        print(json.dumps(record))


def profile_layers(name="tiny", threads=1, steps=3):
    """Where our step's time goes by layer: {component: seconds per step} for forward and
    backward of the embeddings, each encoder/decoder layer, the final norms, the generator + loss
    and the optimizer."""
    import collections

    import transformer as T
    totals = collections.Counter()
    prev = T.get_num_threads()
    T.set_num_threads(threads)
    ours = _Ours(name)
    m = ours.model
    parts = {"src_embed": m.src_embed, "tgt_embed": m.tgt_embed, "encoder.norm": m.encoder.norm,
             "decoder.norm": m.decoder.norm, "generator": m.generator}
    parts.update({f"encoder.{i}": layer for i, layer in enumerate(m.encoder.layers)})
    parts.update({f"decoder.{i}": layer for i, layer in enumerate(m.decoder.layers)})

    def timed(label, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            r = fn(*a, **k)
            totals[label] += time.perf_counter() - t0
            return r
        return wrapper

    for label, obj in parts.items():
        obj.forward = timed(f"{label}.forward", obj.forward)
        obj.backward = timed(f"{label}.backward", obj.backward)
    ours.opt.step = timed("adam", ours.opt.step)
    try:
        ours.step()
        totals.clear()
        t0 = time.perf_counter()
        for _ in range(steps):
            ours.step()
        total = (time.perf_counter() - t0) / steps
    finally:
        T.set_num_threads(prev)
    return total, {k: v / steps for k, v in totals.most_common()}
