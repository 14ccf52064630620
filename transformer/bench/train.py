"""A full training step (forward, backward, clipping, Adam), ours against PyTorch, from the same run.

What training sees: the model a run on data builds (pre-LN, ScaleNorm with FixNorm:
config.DATA_RUN_MODEL), and the named configurations step through batches shaped as `transformer train`
makes them (batches of about 2,048 tokens, padding included, of sentences of similar length drawn
from a corpus-like length distribution: from about 128 short sentences to about 16 long ones), one
batch after another, with gradient clipping and Adam, as Trainer.step does. Custom configurations
(--config KEY=INT,...) keep one uniform batch of their `batch` x `length`.

Timing: the engines take turns by blocks (one pass over the batches each), each block after
GRACE_S of sleep, so that the other engine's OpenMP workers, which spin for milliseconds after their
last parallel region (two runtimes: ours and PyTorch's), have parked: neither engine's threads spin
while the other is timed. The median block gives seconds per step and target tokens per second.
The record also gives the step's FLOP/s (its products: the linear maps, the output layer over
the targets, attention; step_flops) and its share of the ceiling of the cores it ran on
(_C.peak_per_core at the precision of the step, times the threads).
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

from ..shards import pass_batches, step_threads

# name: model sizes, and the batches: `batch_tokens` tokens a batch (padding included, as
# --batch-tokens counts them), `batches` of them in a pass; `batch` and `length` are the uniform
# batch of the data-parallel bench (bench/distributed.py)
CONFIGS = {
    "tiny": dict(sizes=dict(d_model=128, n_heads=4, d_ff=512, n_encoder_layers=2, n_decoder_layers=2),
                 vocab=4000, batch=32, length=32, repeats=7, batch_tokens=2048, batches=8),
    "base": dict(sizes=dict(d_model=512, n_heads=8, d_ff=2048, n_encoder_layers=6, n_decoder_layers=6),
                 vocab=8000, batch=16, length=64, repeats=3, batch_tokens=2048, batches=2),
}
DROPOUT = 0.1
LABEL_SMOOTHING = 0.1
CLIP_NORM = 1.0        # train's default (--clip-norm)
GRACE_S = 0.25         # sleep before each engine's block: the other runtime's spinning workers park


def _config(name):
    """Config `name`'s model as a run on data builds it (config.DATA_RUN_MODEL: pre-LN, ScaleNorm
    with FixNorm), so the step runs the layers training runs."""
    import transformer as T
    from transformer.config import DATA_RUN_MODEL
    c = CONFIGS[name]
    return T.ModelConfig(src_vocab_size=c["vocab"], tgt_vocab_size=c["vocab"], dropout=DROPOUT,
                         max_len=max(512, c["length"] + 1), **c["sizes"], **DATA_RUN_MODEL)


def _uniform_batch(c, rng):
    src = rng.integers(3, c["vocab"], (c["batch"], c["length"]), dtype=np.int64)
    tgt = rng.integers(3, c["vocab"], (c["batch"], c["length"] + 1), dtype=np.int64)
    tgt[:, 0] = 1
    return src, tgt[:, :-1].copy(), tgt[:, 1:].copy()


def _run_batches(c, rng):
    """c["batches"] batches as training makes them: sentence lengths in subwords drawn like a corpus's
    (median 32, a long tail, 3 to 127; targets about 1.1x their source), sorted by length and packed
    into batches of at most batch_tokens tokens with padding; the batches are spread over the range
    of lengths. Ids: random in [3, vocab), BOS 1, EOS 2, pad 0."""
    n = 4000
    src_len = np.clip(np.rint(rng.lognormal(np.log(32), 0.5, n)), 3, 127).astype(int)
    tgt_len = np.clip(np.rint(src_len * rng.lognormal(np.log(1.1), 0.15, n)), 3, 126).astype(int)
    order = np.argsort(np.maximum(src_len, tgt_len + 1), kind="stable")
    packs, start = [], 0
    while start < n:
        end, width = start, 0
        while end < n and (end - start + 1) * max(width, src_len[order[end]], tgt_len[order[end]] + 1) <= c["batch_tokens"]:
            width = max(width, src_len[order[end]], tgt_len[order[end]] + 1)
            end += 1
        packs.append(order[start:max(end, start + 1)])
        start = max(end, start + 1)
    full = packs[:-1] or packs        # the last pack holds what was left over: not a batch training makes
    chosen = [full[i] for i in np.linspace(0, len(full) - 1, c["batches"]).round().astype(int)]
    batches = []
    for rows in chosen:
        S, T = int(src_len[rows].max()), int(tgt_len[rows].max()) + 1
        src = np.zeros((len(rows), S), dtype=np.int64)
        tgt = np.zeros((len(rows), T + 1), dtype=np.int64)
        for b, r in enumerate(rows):
            src[b, :src_len[r]] = rng.integers(3, c["vocab"], src_len[r])
            tgt[b, 0], tgt[b, 1:tgt_len[r] + 1], tgt[b, tgt_len[r] + 1] = 1, rng.integers(3, c["vocab"], tgt_len[r]), 2
        batches.append((src, tgt[:, :-1].copy(), tgt[:, 1:].copy()))
    return batches


def _batches(name, seed=0):
    """The batches a step of config `name` cycles through (a list of (src, tgt_in, tgt_out))."""
    c = CONFIGS[name]
    rng = np.random.default_rng(seed)
    return _run_batches(c, rng) if "batch_tokens" in c else [_uniform_batch(c, rng)]


def _batch(name, seed=0):
    """One uniform batch (the data-parallel bench's and the peak-memory probe's)."""
    return _uniform_batch(CONFIGS[name], np.random.default_rng(seed))


def step_flops(cfg, batch):
    """FLOPs of one training step's products on `batch` (forward and both backward products of
    every linear map, the output layer over the non-pad targets, attention's four products per
    head), counted over the padded shapes the engine computes: a sharded pass's trimmed shards
    (shards.pass_batches), not the batch's own padding."""
    return sum(_products_flops(cfg, part) for part in pass_batches(cfg, *batch))


def _products_flops(cfg, batch):
    src, _, tgt_out = batch
    B, S = src.shape
    T = tgt_out.shape[1]
    D, F, V = cfg.d_model, cfg.d_ff, cfg.tgt_vocab_size
    Le, Ld = cfg.n_encoder_layers, cfg.n_decoder_layers
    targets = int(np.count_nonzero(tgt_out != cfg.pad_id))
    linear = 6 * (B * S * Le * (4 * D * D + 2 * D * F) + B * T * Ld * (6 * D * D + 2 * D * F)
                  + B * S * Ld * 2 * D * D + targets * D * V)
    attention = 12 * B * D * (Le * S * S + Ld * (T * T + T * S))
    return linear + attention


def _target_tokens(batches, pad=0):
    return float(np.mean([np.count_nonzero(b[2] != pad) for b in batches]))


class _Ours:
    """Our training step at `precision` ("fp32" or "bf16": every GEMM on bf16 operands, fp32
    master weights, gradients and Adam; DESIGN.md "Reduced precision")."""

    def __init__(self, name, precision="fp32"):
        import transformer as T
        self.model = T.Seq2SeqTransformer(_config(name), seed=0)
        self.T = T
        self.opt = T.Adam(self.model, lr=1e-4)
        self.batches, self.next = _batches(name), 0
        # fp32 calls leave the argument out, so an engine without precision= still runs them
        self.options = {} if precision == "fp32" else {"precision": precision}

    def step(self):
        batch = self.batches[self.next % len(self.batches)]
        self.next += 1
        with step_threads(self.model):      # as Trainer.step holds the threads
            self.model.zero_grad()
            loss = self.model.forward_backward(*batch, label_smoothing=LABEL_SMOOTHING, **self.options)
            self.T.clip_grad_norm(self.model, CLIP_NORM)
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
        self.batches = [[torch.from_numpy(x) for x in batch] for batch in _batches(name)]
        self.next = 0
        self.autocast = precision == "bf16"

    def step(self):
        batch = self.batches[self.next % len(self.batches)]
        self.next += 1
        self.opt.zero_grad(set_to_none=True)
        with self.torch.autocast("cpu", dtype=self.torch.bfloat16, enabled=self.autocast):
            loss = self.model.loss(*batch, label_smoothing=LABEL_SMOOTHING)
        loss.backward()
        self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP_NORM)
        self.opt.step()
        return loss.item()


def _timed(step, steps=1):
    """Seconds per step over a block of `steps` consecutive steps."""
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps


def _block(engine):
    """A block of steps of `engine` (one pass over its batches), timed after GRACE_S of sleep that
    lets the other runtime's spinning OpenMP workers park, and one untimed step that wakes ours."""
    time.sleep(GRACE_S)
    engine.step()
    return _timed(engine.step, len(engine.batches))


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
    from transformer import _C

    from .precision import require
    require(precision, "train")
    torch = None
    if against == "torch":
        import torch
    records = []
    peak = _C.peak_per_core(0.2)      # this core's ceilings, measured in this run
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
                for engine in engines.values():   # warm-up: buffers for every shape, packing, thread teams
                    for _ in range(len(engine.batches)):
                        engine.step()
                times = {label: [] for label in engines}
                for _ in range(n_rep):            # interleaved by blocks: ours, torch, ours, torch, ...
                    for label, engine in engines.items():
                        times[label].append(_block(engine))
                records.append(_record(name, n, times, precision, engines["ours"].batches, peak))
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


def _record(name, threads, times, precision, batches=None, peak=None):
    """The record of one (config, threads) from {label: [seconds per step]}: "ours" (at
    `precision`), "ref" (PyTorch at the same precision, when measured) and, below fp32, "ours_fp32".

    fp32 keeps the record of issue 3 (ours_*, ref_*, ratio = torch time / ours). bf16 adds the
    same figures under names that say what ran: ours_bf16_tokens_per_s,
    torch_autocast_bf16_tokens_per_s, ours_fp32_tokens_per_s, and the ratios of tokens/s
    ours_bf16_vs_torch_autocast_bf16 (= ratio) and ours_bf16_vs_ours_fp32. The steps alternate,
    so each ratio also comes paired (ratio_paired, ..._paired: harness.paired_ratio). Every record names
    the CPU (family and model: the name alone does not tell Zen 3, 4 and 5 apart) and the
    dispatch level it ran. With `batches` (the ones the steps cycled through) and `peak`
    (_C.peak_per_core), also the step's FLOP/s and its share of the ceiling of `threads` cores."""
    from .. import _C
    from .harness import cpu_model, paired_ratio

    c = CONFIGS[name]
    batches = batches or [_batch(name)]
    tokens = _target_tokens(batches)
    shapes = sorted({f"B{b[0].shape[0]} S{b[0].shape[1]} T{b[1].shape[1]}" for b in batches},
                    key=lambda x: int(x.split()[0][1:]))
    median = {label: statistics.median(t) for label, t in times.items()}
    spread = {label: [min(t), max(t)] for label, t in times.items()}
    o = median["ours"]
    kernel = f"train_step {name}" if precision == "fp32" else f"train_step {precision} {name}"
    record = {"bench": "train_step", "kernel": kernel, "config": name, "threads": threads,
              "precision": precision, "cpu": cpu_model(), "isa": _C.isa(),
              "shape": (f"{len(batches)} batches of ~{c['batch_tokens']} tokens ({shapes[0]} ... {shapes[-1]}) V{c['vocab']}"
                        if "batch_tokens" in c else f"B{c['batch']} S{c['length']} T{c['length']} V{c['vocab']}"),
              "target_tokens_per_step": tokens,
              "ours_s": o, "ours_spread_s": spread["ours"],
              "ours_tokens_per_s": tokens / o, "ours_per_s": tokens / o, "repeats": len(times["ours"])}
    if peak is not None:
        flops = float(np.mean([step_flops(_config(name), b) for b in batches]))
        ceiling = peak["bf16_gflops" if precision == "bf16" else "fp32_fma_gflops"] * 1e9 * threads
        record.update({"step_gflop": flops / 1e9, "ours_gflop_per_s": flops / o / 1e9,
                       "peak_gflop_per_s": ceiling / 1e9, "ours_peak_share": flops / o / ceiling})
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


# what each _C entry point counts as in the profile; anything else in _C is "other kernels".
# "element-wise" holds the fused residual kernels too (bias, dropout, residual add and the norm in
# one pass: csrc/residual_norm.c); "norm" the norms run alone (pre-LN's inputs, the final norms).
PROFILE_GROUPS = {
    "gemm": "GEMM", "gemm_packed": "GEMM", "gemm_pack_b": "GEMM",
    "attention_train_forward": "attention", "attention_train_backward": "attention",
    "softmax_forward": "attention", "softmax_backward": "attention",
    "layernorm_forward": "norm", "layernorm_backward": "norm",
    "scalenorm_forward": "norm", "scalenorm_backward": "norm",
    "scalenorm_forward_at": "norm", "scalenorm_backward_at": "norm",
    "add": "element-wise", "add_bias": "element-wise", "bias_grad": "element-wise",
    "bias_act_forward": "element-wise", "act_backward": "element-wise",
    "dropout_forward": "element-wise", "dropout_backward": "element-wise",
    "dropout_add_forward": "element-wise", "dropout_bias_backward": "element-wise",
    "residual_layernorm_forward": "element-wise", "residual_layernorm_backward": "element-wise",
    "residual_scalenorm_forward": "element-wise", "residual_scalenorm_backward": "element-wise",
    "embedding_forward": "embedding", "embedding_backward": "embedding",
    "positional_encoding": "embedding",
    "cross_entropy": "loss",
    "adam_step": "optimizer", "sum_squares": "optimizer", "scale_": "optimizer", "zero_": "optimizer",
}
PROFILE_ORDER = ("GEMM", "attention", "norm", "element-wise", "embedding", "loss",
                 "optimizer", "other kernels", "Python overhead")


def profile(name="tiny", threads=1, steps=10, precision="fp32"):
    """Where one training step's time goes, at `precision` (fp32 or bf16): {group: seconds per
    step} over the groups of PROFILE_ORDER, plus the step time and the kernel calls per step.

    Every function of transformer._C is wrapped by a timer while `steps` steps run; "Python
    overhead" is the step time not spent inside a kernel call (the layers' bookkeeping, numpy
    views, argument checks in the Cython door), minus the timers' own cost, which is measured
    separately per call and subtracted. The pass is profiled whole (shards.forced = 1): with
    sentence shards two threads run kernels at once, and a wall-clock split by kernel would count
    their overlap twice."""
    import collections

    import transformer as T
    from transformer import _C, shards

    from .precision import require
    require(precision, "train")
    totals, calls = collections.Counter(), collections.Counter()
    clock = time.perf_counter
    skip = {"set_num_threads", "get_num_threads", "set_thread_limit", "set_isa", "get_isa", "best_isa"}
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
    forced, shards.forced = shards.forced, 1
    try:
        ours = _Ours(name, precision)
        ours.step(), ours.step()
        totals.clear(), calls.clear()
        t0 = clock()
        for _ in range(steps):
            ours.step()
        total = (clock() - t0) / steps
    finally:
        shards.forced = forced
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
