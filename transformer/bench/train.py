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
    """Our training step at `precision` ("fp32" or "bf16": every GEMM on bf16 operands, fp32
    master weights, gradients and Adam; DESIGN.md "Reduced precision")."""

    def __init__(self, name, precision="fp32"):
        import transformer as T
        self.model = T.Seq2SeqTransformer(_config(name), seed=0)
        self.opt = T.Adam(self.model, lr=1e-4)
        self.batch = _batch(name)
        # fp32 calls leave the argument out, so an engine without precision= still runs them
        self.options = {} if precision == "fp32" else {"precision": precision}

    def step(self):
        self.model.zero_grad()
        loss = self.model.forward_backward(*self.batch, label_smoothing=LABEL_SMOOTHING, **self.options)
        self.opt.step()
        return loss


class _Torch:
    """The reference network's training step; precision "bf16": forward and loss under
    torch.autocast("cpu", dtype=torch.bfloat16), the usual PyTorch mixed precision (fp32 master
    weights and Adam; backward replays autocast's casts)."""

    def __init__(self, name, precision="fp32"):
        import torch
        from transformer.torch_compat import build_torch_model
        self.torch = torch
        self.model = build_torch_model(_config(name), seed=0)
        self.model.train()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
        self.batch = [torch.from_numpy(x) for x in _batch(name)]
        self.autocast = precision == "bf16"

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        with self.torch.autocast("cpu", dtype=self.torch.bfloat16, enabled=self.autocast):
            loss = self.model.loss(*self.batch, label_smoothing=LABEL_SMOOTHING)
        loss.backward()
        self.opt.step()
        return loss.item()


def _timed(step):
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def custom_config(text):
    """A named size from `--config`: "d_model=256,n_heads=4,d_ff=1024,layers=3" (also
    n_encoder_layers/n_decoder_layers, vocab, batch, length); registered as "custom" here and in
    the decode bench. Returns its name."""
    from . import decode

    spec = dict(d_model=256, n_heads=4, d_ff=1024, n_encoder_layers=3, n_decoder_layers=3,
                vocab=8000, batch=16, length=48)
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        key = key.strip()
        if key == "layers":
            spec["n_encoder_layers"] = spec["n_decoder_layers"] = value
            continue
        if key not in spec or not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"--config: expected tiny, base or KEY=INT,... with KEY in "
                             f"{sorted(spec) + ['layers']}, got {item!r}")
        spec[key] = value
    spec = {k: int(v) for k, v in spec.items()}
    sizes = {k: spec[k] for k in ("d_model", "n_heads", "d_ff", "n_encoder_layers", "n_decoder_layers")}
    if sizes["d_model"] % sizes["n_heads"]:
        raise ValueError(f"--config: d_model {sizes['d_model']} is not a multiple of n_heads {sizes['n_heads']}")
    CONFIGS["custom"] = dict(sizes=sizes, vocab=spec["vocab"], batch=spec["batch"], length=spec["length"],
                             repeats=5)
    decode.CONFIGS["custom"] = dict(sizes=sizes, vocab=spec["vocab"], batch=max(1, spec["batch"] // 2),
                                    src_len=spec["length"], repeats=3)
    return "custom"


def run(threads=(1, 2), repeats=None, configs=("tiny", "base"), memory=True, against="torch",
        precision="fp32"):
    """One dict per (config, threads): step times (median), target tokens/s and the ratio
    (torch time / our time: > 1 means we are faster); then one memory dict per config.
    against=None measures ours alone (no PyTorch needed).

    precision="bf16": ours with precision="bf16" against PyTorch's torch.autocast bf16 step of the
    same network, and against ours at fp32, all three interleaved in the same run; the `ours_*`
    and `ref_*` figures are then the bf16 ones (see _record). int8 is refused (ValueError: training
    is fp32 or bf16), and so is bf16 on an engine without precision= (RuntimeError), before any
    work: nothing falls back to fp32."""
    import transformer as T

    from .precision import require
    require(precision, "train")
    torch = None
    if against == "torch":
        import torch
    records = []
    prev_ours = T.get_num_threads()
    prev_torch = torch.get_num_threads() if torch else None
    try:
        for name in configs:
            c = CONFIGS[name]
            engines = {"ours": _Ours(name, precision)}        # label -> engine, timed in this order
            if torch:
                engines["ref"] = _Torch(name, precision)
            if precision != "fp32":
                engines["ours_fp32"] = _Ours(name)
            n_rep = repeats or c["repeats"]
            for n in threads:
                T.set_num_threads(n)
                if torch:
                    torch.set_num_threads(n)
                for engine in engines.values():   # warm-up: buffers, packing, thread teams
                    for _ in range(2 if name == "tiny" else 1):
                        engine.step()
                times = {label: [] for label in engines}
                for _ in range(n_rep):            # interleaved: ours, torch, ours, torch, ...
                    for label, engine in engines.items():
                        times[label].append(_timed(engine.step))
                records.append(_record(name, n, times, precision))
            del engines
        if memory:
            for name in configs:
                if name != "base" and len(configs) > 1:
                    continue
                label = name if precision == "fp32" else f"{precision} {name}"
                ours_kb = _peak_rss(name, "ours", precision)
                record = {"bench": "train_step_peak_rss", "kernel": f"train_step {label} peak RSS",
                          "config": name, "precision": precision, "ours_mb": ours_kb / 1024}
                if torch:
                    ref_kb = _peak_rss(name, "torch", precision)
                    record.update({"ref_mb": ref_kb / 1024, "ratio": ref_kb / ours_kb})
                records.append(record)
    finally:
        T.set_num_threads(prev_ours)
        if torch:
            torch.set_num_threads(prev_torch)
    return records


def _record(name, threads, times, precision):
    """The record of one (config, threads) from {label: [seconds per step]}: "ours" (at
    `precision`), "ref" (PyTorch at the same precision, when measured) and, below fp32, "ours_fp32".

    fp32 keeps the record of issue 3 (ours_*, ref_*, ratio = torch time / ours). bf16 adds the
    same figures under names that say what ran: ours_bf16_tokens_per_s,
    torch_autocast_bf16_tokens_per_s, ours_fp32_tokens_per_s, and the ratios of tokens/s
    ours_bf16_vs_torch_autocast_bf16 (= ratio) and ours_bf16_vs_ours_fp32. The steps alternate,
    so each ratio also comes paired (ratio_paired, ..._paired: harness.paired_ratio). Every record names
    the CPU (family and model: the name alone does not tell Zen 3, 4 and 5 apart) and the
    dispatch level it ran."""
    from .. import _C
    from .harness import cpu_model, paired_ratio

    c = CONFIGS[name]
    tokens = c["batch"] * c["length"]
    median = {label: statistics.median(t) for label, t in times.items()}
    spread = {label: [min(t), max(t)] for label, t in times.items()}
    o = median["ours"]
    kernel = f"train_step {name}" if precision == "fp32" else f"train_step {precision} {name}"
    record = {"bench": "train_step", "kernel": kernel, "config": name, "threads": threads,
              "precision": precision, "cpu": cpu_model(), "isa": _C.isa(),
              "shape": f"B{c['batch']} S{c['length']} T{c['length']} V{c['vocab']}",
              "ours_s": o, "ours_spread_s": spread["ours"],
              "ours_tokens_per_s": tokens / o, "ours_per_s": tokens / o, "repeats": len(times["ours"])}
    if "ref" in median:
        r = median["ref"]
        record.update({"ref_s": r, "ref_spread_s": spread["ref"], "ratio": r / o, "ref_tokens_per_s": tokens / r,
                       "ratio_paired": paired_ratio(times["ours"], times["ref"])})
    if precision == "fp32":
        return record
    f = median["ours_fp32"]
    record.update({f"ours_{precision}_tokens_per_s": tokens / o,
                   "ours_fp32_s": f, "ours_fp32_spread_s": spread["ours_fp32"], "ours_fp32_tokens_per_s": tokens / f,
                   f"ours_{precision}_vs_ours_fp32": f / o,
                   f"ours_{precision}_vs_ours_fp32_paired": paired_ratio(times["ours"], times["ours_fp32"])})
    if "ref" in median:
        record.update({"reference": "torch.autocast('cpu', dtype=torch.bfloat16), fp32 master weights",
                       f"torch_autocast_{precision}_tokens_per_s": tokens / median["ref"],
                       f"ours_{precision}_vs_torch_autocast_{precision}": median["ref"] / o})
    return record


def _peak_rss(name, engine, precision="fp32"):
    """Peak resident set (KiB) of a fresh process running three training steps of `engine` at
    `precision`.

    Read from /proc/self/status VmHWM, the high-water mark of the child's own address space:
    ru_maxrss would not do here, since Linux carries the parent's high-water mark across
    fork + exec into the child's ru_maxrss (the parent holds both models when this runs)."""
    # the config travels with the code: a custom one (--config KEY=INT,...) exists only here
    code = ("import resource, sys; from transformer.bench.train import CONFIGS, _Ours, _Torch, _vm_hwm_kib; "
            f"CONFIGS[{name!r}] = {CONFIGS[name]!r}; "
            f"e = (_Ours if {engine!r} == 'ours' else _Torch)({name!r}, {precision!r}); "
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


# what each _C entry point counts as in the profile; anything else in _C is "other kernels"
PROFILE_GROUPS = {
    "gemm": "GEMM",
    "softmax_forward": "attention softmax", "softmax_backward": "attention softmax",
    "layernorm_forward": "layer norm", "layernorm_backward": "layer norm",
    "add": "element-wise", "add_bias": "element-wise", "bias_grad": "element-wise",
    "bias_act_forward": "element-wise", "act_backward": "element-wise",
    "dropout_forward": "element-wise", "dropout_backward": "element-wise", "dropout_add": "element-wise",
    "embedding_forward": "embedding", "embedding_backward": "embedding",
    "positional_encoding": "embedding",
    "cross_entropy": "loss",
    "adam_step": "optimizer", "sum_squares": "optimizer", "scale_": "optimizer", "zero_": "optimizer",
}
PROFILE_ORDER = ("GEMM", "attention softmax", "layer norm", "element-wise", "embedding", "loss",
                 "optimizer", "other kernels", "Python overhead")


def profile(name="tiny", threads=1, steps=10, precision="fp32"):
    """Where one training step's time goes, at `precision` (fp32 or bf16): {group: seconds per
    step} over the groups of PROFILE_ORDER, plus the step time and the kernel calls per step.

    Every function of transformer._C is wrapped by a timer while `steps` steps run; "Python
    overhead" is the step time not spent inside a kernel call (the layers' bookkeeping, numpy
    views, argument checks in the Cython door), minus the timers' own cost, which is measured
    separately per call and subtracted."""
    import collections

    import transformer as T
    from transformer import _C

    from .precision import require
    require(precision, "train")
    totals, calls = collections.Counter(), collections.Counter()
    clock = time.perf_counter
    skip = {"set_num_threads", "get_num_threads", "set_isa", "get_isa", "best_isa"}
    originals = {fn: getattr(_C, fn) for fn in dir(_C)
                 if not fn.startswith("_") and fn not in skip and callable(getattr(_C, fn))
                 and not isinstance(getattr(_C, fn), type)}   # functions, not classes (PackedMatrix)

    def timed(f, group):
        def wrapper(*a, **k):
            t0 = clock()
            try:
                return f(*a, **k)
            finally:
                totals[group] += clock() - t0
                calls[group] += 1
        return wrapper

    # the cost of a wrapper around a function that does nothing: subtracted per call below
    noop = timed(lambda: None, "noop")
    t0 = clock()
    for _ in range(20000):
        noop()
    per_call = (clock() - t0 - totals.pop("noop")) / 20000
    calls.clear()
    prev = T.get_num_threads()
    T.set_num_threads(threads)
    for fn, f in originals.items():
        setattr(_C, fn, timed(f, PROFILE_GROUPS.get(fn, "other kernels")))
    try:
        ours = _Ours(name, precision)
        ours.step(), ours.step()
        totals.clear(), calls.clear()
        t0 = clock()
        for _ in range(steps):
            ours.step()
        total = (clock() - t0) / steps
    finally:
        for fn, f in originals.items():
            setattr(_C, fn, f)
        T.set_num_threads(prev)
    n_calls = sum(calls.values()) / steps
    groups = {g: totals[g] / steps for g in PROFILE_ORDER if g in totals}
    groups["Python overhead"] = max(total - sum(groups.values()) - n_calls * per_call, 0.0)
    return {"bench": "train_step_profile", "config": name, "threads": threads, "precision": precision,
            "step_s": total - n_calls * per_call, "kernel_calls_per_step": n_calls, "groups_s": groups}


def profile_table(record):
    step = record["step_s"]
    lines = [f"Profile of one {record.get('precision', 'fp32')} training step, {record['config']} config, "
             f"{record['threads']} thread(s): "
             f"{step * 1e3:.2f} ms, {record['kernel_calls_per_step']:.0f} kernel calls",
             f"  {'part':<18} {'ms/step':>9} {'share':>7}"]
    for group in PROFILE_ORDER:
        if group in record["groups_s"]:
            t = record["groups_s"][group]
            lines.append(f"  {group:<18} {t * 1e3:>9.3f} {t / step:>7.1%}")
    return "\n".join(lines)


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


if __name__ == "__main__":
    for record in run():
        print(json.dumps(record))
