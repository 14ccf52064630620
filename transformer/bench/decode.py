"""Decoding speed: generated tokens per second, ours against PyTorch and CTranslate2, same run.

Every engine decodes exactly 64 tokens per sentence (min_len = max_len = 64) with the same random
weights: PyTorch's nn.Transformer the usual way (encoder once, then the decoder re-run over the
whole prefix at every step), CTranslate2 (float32, a model of the same shape written from our
weights; in post-LN mode it has no final encoder/decoder norms, so it does slightly less work),
and ours (encoder once, decoder one token per step with a key/value cache). Engines alternate
after warm-up, each timed decode after a pause that lets the others' idle threads park; the
median of the repeats is reported (PyTorch, 10-50x slower, is timed once by
default: see run). Tokens/s counts output tokens (batch x 64),
also for beam search.

Reduced precision (run(precision="bf16" | "int8")): ours decodes with precision=... and, in the
same run and interleaved, at fp32, so the ratio of the two is measured on the same machine state;
CTranslate2 loads the same float32 model with compute_type "bfloat16" or "int8" (it converts the
weights on load), when this CPU supports it (otherwise the record says why it was skipped).
PyTorch takes no part there: it has no cached, quantized decoder to compare with, and its fp32
prefix re-run is in the fp32 records.

CTranslate2 runs at its best setting for the thread count: with n > 1 threads both
intra_threads=n (one translator, n OpenMP threads per op) and inter_threads=n (n translators of
one thread each, the batch split in n with max_batch_size) are tried before timing, and the
faster is kept; the record names it (ctranslate2_layout) with both trial times. Each translator
runs in a process of its own, as in a deployment, and times its calls there (ctranslate2_decoder
says why: in one process with torch imported, the two engines' OpenMP threads slow each other).

Our weights are frozen while they are timed (Parameters.freeze), as `transformer translate` and
`evaluate` hold them and as CTranslate2 holds the model it converted on load: a call then trusts
the matrices it converted for the first one instead of reading every float32 weight again to see
whether it changed (transformer/prepared.py; 225 MB at base size, 3-7% of a base int8 decode at
one thread). Records say so (`weights`: "frozen"); a record without that field (before
2026-11-27 late evening) was timed with writeable weights.
"""
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import weakref

import numpy as np

from .harness import bench_cpus, call_seconds, paired_ratio, pinned, same_package

CONFIGS = {
    "tiny": dict(sizes=dict(d_model=128, n_heads=4, d_ff=512, n_encoder_layers=2, n_decoder_layers=2),
                 vocab=4000, batch=32, src_len=32, repeats=5),
    "base": dict(sizes=dict(d_model=512, n_heads=8, d_ff=2048, n_encoder_layers=6, n_decoder_layers=6),
                 vocab=8000, batch=8, src_len=64, repeats=3),
}
STEPS = 64
# With several threads, an engine's idle OpenMP workers keep spinning for a while after its
# call (each engine here brings its own libgomp) and would steal cores from the engine timed
# next: each timed decode starts after this much sleep, so every engine runs on a quiet machine.
SETTLE_S = 0.25


def _model(name, seed=0):
    import transformer as T

    c = CONFIGS[name]
    cfg = T.ModelConfig(src_vocab_size=c["vocab"], tgt_vocab_size=c["vocab"], dropout=0.0,
                        max_len=max(STEPS, c["src_len"]) + 1, **c["sizes"])
    model = T.Seq2SeqTransformer(cfg, seed=seed)
    rng = np.random.default_rng(seed)
    src = rng.integers(4, c["vocab"], size=(c["batch"], c["src_len"]), dtype=np.int64)
    return model, src


# -- PyTorch: the usual way -----------------------------------------------------------------------

def torch_decoder(model):
    import torch

    from ..torch_compat import to_torch

    tm = to_torch(model).eval()
    cfg = model.cfg

    @torch.inference_mode()
    def decode(src, beam, steps=STEPS):
        src = torch.as_tensor(src)
        B, S = src.shape
        pad = src == cfg.pad_id
        x = tm.src_embed(src) * tm.scale + tm.pe[:S]
        memory = tm.transformer.encoder(x, src_key_padding_mask=pad)
        if beam > 1:
            memory = memory.repeat_interleave(beam, 0)
            pad = pad.repeat_interleave(beam, 0)
        rows = B * beam
        ys = torch.full((rows, 1), cfg.bos_id, dtype=torch.long)
        scores = torch.zeros(B, beam)
        if beam > 1:
            scores[:, 1:] = -float("inf")
        for t in range(steps):
            T_ = ys.shape[1]
            causal = torch.triu(torch.full((T_, T_), float("-inf")), diagonal=1)
            y = tm.tgt_embed(ys) * tm.scale + tm.pe[:T_]
            h = tm.transformer.decoder(y, memory, tgt_mask=causal, memory_key_padding_mask=pad)
            logits = tm.generator(h[:, -1])
            logits[:, cfg.eos_id] = -float("inf")          # min_len = max_len: never stop early
            if beam == 1:
                ys = torch.cat([ys, logits.argmax(-1, keepdim=True)], 1)
                continue
            logp = torch.log_softmax(logits, -1).view(B, beam, -1)
            cand = (scores[:, :, None] + logp).view(B, -1)
            top, idx = cand.topk(beam, dim=1)
            V = logp.shape[-1]
            origin = (idx // V) + torch.arange(B)[:, None] * beam
            ys = torch.cat([ys[origin.view(-1)], (idx % V).view(-1, 1)], 1)
            scores = top
        return ys

    return decode


# -- CTranslate2 ----------------------------------------------------------------------------------

# Our precision names -> CTranslate2's compute_type (it quantizes or converts on load).
CT2_COMPUTE_TYPE = {"fp32": "float32", "bf16": "bfloat16", "int8": "int8"}
# How CTranslate2 spends n threads: on each op of one translator, or on n translators of one thread.
CT2_LAYOUTS = ("intra", "inter")


def ctranslate2_compute_type(precision):
    """(compute_type, None) when CTranslate2 can decode at `precision` on this CPU, otherwise
    (None, why not): not installed, or the compute type missing from its supported ones here
    (bfloat16 needs AVX512-BF16 or AMX; int8 needs AVX2 or NEON)."""
    try:
        import ctranslate2
    except ImportError:
        return None, "ctranslate2 is not installed (pip install ctranslate2)"
    compute_type = CT2_COMPUTE_TYPE[precision]
    supported = sorted(ctranslate2.get_supported_compute_types("cpu"))
    if compute_type not in supported:
        return None, (f"CTranslate2 {ctranslate2.__version__} has no compute_type {compute_type!r} on this CPU "
                      f"(get_supported_compute_types('cpu') = {supported})")
    return compute_type, None


def ctranslate2_translator(model, threads, directory, compute_type="float32", layout="intra"):
    """A CTranslate2 decoder (decode(src, beam)) holding our weights, or None when not installed.
    The model is written as float32; compute_type ("float32", "int8", "bfloat16") is applied by
    CTranslate2 when it loads it; layout as in ctranslate2_decoder."""
    vocab = write_ctranslate2_model(model, directory, approximate=True)
    if vocab is None:
        return None
    return ctranslate2_decoder(directory, vocab, threads, compute_type, layout)


CT2_ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "silu": "SWISH"}   # ours -> common_spec.Activation


def ctranslate2_gap(cfg):
    """Why CTranslate2's Transformer cannot compute what a model of `cfg` computes, or None."""
    if cfg.norm_first and not cfg.final_norm:
        return "a pre-LN model without final norms (CTranslate2's pre-LN Transformer always has them)"
    if not cfg.norm_first and cfg.final_norm:
        return ("a post-LN model with final encoder and decoder norms (CTranslate2's post-LN Transformer "
                "has none)")
    return None


def write_ctranslate2_model(model, directory, approximate=False):
    """Our weights as a float32 CTranslate2 model in `directory`; returns its source vocabulary
    (token strings by id), or None when ctranslate2 is not installed. A model CTranslate2 cannot
    hold exactly (ctranslate2_gap) is refused with ValueError; approximate=True writes it without
    what CTranslate2 lacks (the decode bench's post-LN timing: at initialisation the final norms
    of a post-LN model are near the identity, the norm of an already normalised row)."""
    if model.cfg.norm != "layer" or model.cfg.fix_norm:   # not even approximately: every norm and table differs
        raise ValueError("write_ctranslate2_model: CTranslate2 has no ScaleNorm or FixNorm "
                         f"(norm={model.cfg.norm!r}, fix_norm={model.cfg.fix_norm})")
    try:
        from ctranslate2.specs import common_spec, transformer_spec
    except ImportError:
        return None
    cfg, w = model.cfg, {name: model.params.tensor(name) for name in model.params.data}
    w.setdefault("generator.weight", model.params.tensor("generator.weight"))    # tied to an embedding
    gap = ctranslate2_gap(cfg)
    if gap is not None and not approximate:
        raise ValueError(f"write_ctranslate2_model: CTranslate2 cannot hold {gap}")
    activation = getattr(common_spec.Activation, CT2_ACTIVATIONS[cfg.activation])
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.n_encoder_layers, cfg.n_decoder_layers), cfg.n_heads, pre_norm=cfg.norm_first,
        activation=activation)
    pe = model.positional_table(cfg.max_len)
    D = cfg.d_model

    def linear(spec_linear, name):
        spec_linear.weight = w[f"{name}.weight"]
        spec_linear.bias = w[f"{name}.bias"]

    def norm(spec_norm, name):          # approximate and missing here: the identity
        spec_norm.gamma = w.get(f"{name}.weight", np.ones(D, np.float32))
        spec_norm.beta = w.get(f"{name}.bias", np.zeros(D, np.float32))

    for side, embed in (("encoder", "src_embed"), ("decoder", "tgt_embed")):
        s = getattr(spec, side)
        embeddings = s.embeddings[0] if isinstance(s.embeddings, list) else s.embeddings
        embeddings.weight = w[f"{embed}.weight"]
        s.position_encodings.encodings = pe
        s.scale_embeddings = cfg.scale_embedding
        if cfg.norm_first:
            norm(s.layer_norm, f"transformer.{side}.norm")
    for i, layer in enumerate(spec.encoder.layer):
        p = f"transformer.encoder.layers.{i}"
        layer.self_attention.linear[0].weight = w[f"{p}.self_attn.in_proj_weight"]
        layer.self_attention.linear[0].bias = w[f"{p}.self_attn.in_proj_bias"]
        linear(layer.self_attention.linear[1], f"{p}.self_attn.out_proj")
        norm(layer.self_attention.layer_norm, f"{p}.norm1")
        linear(layer.ffn.linear_0, f"{p}.linear1")
        linear(layer.ffn.linear_1, f"{p}.linear2")
        norm(layer.ffn.layer_norm, f"{p}.norm2")
    for i, layer in enumerate(spec.decoder.layer):
        p = f"transformer.decoder.layers.{i}"
        layer.self_attention.linear[0].weight = w[f"{p}.self_attn.in_proj_weight"]
        layer.self_attention.linear[0].bias = w[f"{p}.self_attn.in_proj_bias"]
        linear(layer.self_attention.linear[1], f"{p}.self_attn.out_proj")
        norm(layer.self_attention.layer_norm, f"{p}.norm1")
        in_w, in_b = w[f"{p}.multihead_attn.in_proj_weight"], w[f"{p}.multihead_attn.in_proj_bias"]
        layer.attention.linear[0].weight, layer.attention.linear[0].bias = in_w[:D], in_b[:D]
        layer.attention.linear[1].weight, layer.attention.linear[1].bias = in_w[D:], in_b[D:]
        linear(layer.attention.linear[2], f"{p}.multihead_attn.out_proj")
        norm(layer.attention.layer_norm, f"{p}.norm2")
        linear(layer.ffn.linear_0, f"{p}.linear1")
        linear(layer.ffn.linear_1, f"{p}.linear2")
        norm(layer.ffn.layer_norm, f"{p}.norm3")
    linear(spec.decoder.projection, "generator")
    specials = ["<blank>", "<s>", "</s>", "<unk>"]
    src_vocab = specials + [f"s{i}" for i in range(4, cfg.src_vocab_size)]
    tgt_vocab = specials + [f"t{i}" for i in range(4, cfg.tgt_vocab_size)]
    spec.register_source_vocabulary(src_vocab)
    spec.register_target_vocabulary(tgt_vocab)
    spec.validate()
    spec.optimize(quantization="float32")
    os.makedirs(directory, exist_ok=True)
    spec.save(directory)
    return src_vocab


def _ct2_worker(conn, directory, src_vocab, compute_type, inter, intra, steps, pad_id):
    """A child process's loop: (src, beam) in, ("ok", seconds, [[tokens] per sentence]) out, where
    seconds is what the tokenisation and translate_batch took here; None in: exit."""
    import ctranslate2

    try:
        translator = ctranslate2.Translator(directory, device="cpu", compute_type=compute_type,
                                            inter_threads=inter, intra_threads=intra)
        conn.send(("ready",))
    except Exception as error:   # reported to the parent, which raises it
        conn.send(("error", f"{type(error).__name__}: {error}"))
        return
    while True:
        try:
            request = conn.recv()
        except EOFError:       # the parent is gone
            return
        if request is None:
            return
        src, beam = request
        try:
            start = time.perf_counter()
            tokens = [[src_vocab[i] for i in row if i != pad_id] for row in src.tolist()]
            results = translator.translate_batch(tokens, beam_size=beam, max_decoding_length=steps,
                                                 min_decoding_length=steps,
                                                 max_batch_size=-(-len(tokens) // inter))
            seconds = time.perf_counter() - start
            conn.send(("ok", seconds, [r.hypotheses[0] for r in results]))
        except Exception as error:
            conn.send(("error", f"{type(error).__name__}: {error}"))


class Translated:
    """One sentence of a CTranslate2 result, as translate_batch gives it (.hypotheses[0])."""

    def __init__(self, tokens):
        self.hypotheses = [tokens]


def _ct2_child(fd):
    """The translator process's entry (python -c ...): its arguments, then its requests, arrive
    on the socket `fd`, and its answers leave on it."""
    from multiprocessing.connection import Connection

    conn = Connection(fd)
    _ct2_worker(conn, *conn.recv())


def _stop_worker(conn, process):
    try:
        conn.send(None)
    except OSError:
        pass
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class _RemoteTranslator:
    """A CTranslate2 Translator in a process of its own (ctranslate2_decoder): a fresh interpreter
    started with subprocess (multiprocessing's spawn would run the caller's main module again, and
    fork would copy an OpenMP runtime whose threads do not follow)."""

    def __init__(self, directory, src_vocab, compute_type, inter, intra, steps, pad_id):
        from multiprocessing.connection import Connection

        ours, theirs = socket.socketpair()
        code = same_package(f"from transformer.bench.decode import _ct2_child; _ct2_child({theirs.fileno()})")
        self._process = subprocess.Popen([sys.executable, "-c", code], pass_fds=(theirs.fileno(),))
        theirs.close()
        self._conn = Connection(ours.detach())
        weakref.finalize(self, _stop_worker, self._conn, self._process)   # the process ends with it
        self._conn.send((directory, list(src_vocab), compute_type, inter, intra, steps, pad_id))
        self.inter = inter
        self.layout = {"intra_threads": intra, "inter_threads": inter}
        self.seconds = None
        self._answer()                                 # "ready", or its error raised here

    def _answer(self):
        try:
            reply = self._conn.recv()
        except EOFError:
            raise RuntimeError(f"the CTranslate2 process ended (exit code {self._process.poll()})") from None
        if reply[0] == "error":
            raise RuntimeError(f"CTranslate2: {reply[1]}")
        return reply

    def __call__(self, src, beam):
        src = np.asarray(src)
        self.layout = {**self.layout, "max_batch_size": -(-len(src) // self.inter)}
        self._conn.send((src, beam))
        _, self.seconds, sentences = self._answer()
        return [Translated(tokens) for tokens in sentences]


def ctranslate2_decoder(directory, src_vocab, threads, compute_type="float32", layout="intra", steps=STEPS,
                        pad_id=None):
    """decode(src, beam) by a CTranslate2 Translator loaded from `directory` at `compute_type`,
    `steps` tokens per sentence; ids equal to pad_id are left out (CTranslate2 takes sentences of
    their own lengths). layout "intra": intra_threads=threads, inter_threads=1, the whole batch at
    once; "inter": intra_threads=1, inter_threads=threads, the batch split into `threads` parts
    (max_batch_size) that its translators decode in parallel. decode.layout says which, with the
    batch it split; decode.seconds, what the last call took in the translator's process.

    The translator runs in a process of its own, as it would in a deployment. In our process its
    OpenMP runtime could be ours: once torch is imported, its libgomp is global and CTranslate2's calls
    bind to it, and CTranslate2's idle threads then count against ours, which libgomp answers by
    parking our threads between parallel regions (measured, Zen 4, tiny int8 greedy at 2 threads:
    54k tokens/s with a translator in the process, 100k without). The call's time is measured in
    that process (the pipe's round trip left out); the process ends with the decoder."""
    if layout not in CT2_LAYOUTS:
        raise ValueError(f"layout must be one of {CT2_LAYOUTS}, got {layout!r}")
    intra, inter = (threads, 1) if layout == "intra" else (1, threads)
    return _RemoteTranslator(directory, src_vocab, compute_type, inter, intra, steps, pad_id)


def fastest_layout(decoders, src, beam, trials=2, settle_s=0.0):
    """(name, {name: seconds}) of the fastest of `decoders` ({name: decode(src, beam)}): each is
    warmed up once, then timed `trials` times, alternating; the minimum of each is compared."""
    times = {name: [] for name in decoders}
    for decode in decoders.values():
        decode(src, beam)
    for _ in range(trials):
        for name, decode in decoders.items():
            if settle_s:
                time.sleep(settle_s)
            times[name].append(call_seconds(decode, src, beam))
    best = {name: min(t) for name, t in times.items()}
    return min(best, key=best.get), best


def ours_decoder(model, precision="fp32"):
    """decode(src, beam) by our greedy (beam 1) or beam search, exactly STEPS tokens, at
    `precision` (left out at fp32, so an engine without the argument still runs it)."""
    options = {} if precision == "fp32" else {"precision": precision}

    def decode(src, beam):
        if beam == 1:
            return model.greedy_decode(src, max_len=STEPS, min_len=STEPS, **options)
        return model.beam_search(src, beam, max_len=STEPS, min_len=STEPS, **options)

    return decode


def run(threads=(1, 2), configs=("tiny", "base"), beams=(1, 4), engines=("ours", "torch", "ctranslate2"),
        torch_repeats=1, precision="fp32", repeats=None):
    """PyTorch re-runs the whole prefix every step (10-50x slower than the others): it is warmed up
    on a 4-step decode and timed `torch_repeats` times (in the first rounds), which keeps the
    default run to a few minutes; ours and CTranslate2 alternate for every repeat. Without
    "torch" in engines, PyTorch is not needed.

    precision "bf16" or "int8": ours at that precision ("ours_*"), ours at fp32 ("ours_fp32_*")
    and CTranslate2 at the matching compute type, interleaved; PyTorch is left out (see the module
    docstring); `ratio` is then ours / CTranslate2 in tokens/s. An engine without precision= is
    refused before any work (RuntimeError); nothing falls back to fp32. repeats: the timed calls
    of ours and CTranslate2 per record (None: the config's own, CONFIGS). A thread count n runs
    every engine on the same n CPUs, the first this process may use (harness.pinned; records:
    "cpus"), CTranslate2's process included."""
    import transformer as T

    from .precision import require
    require(precision, "decode")
    torch = None
    if "torch" in engines and precision == "fp32":
        import torch

    records = []
    for name in configs:
        model, src = _model(name)
        model.params.freeze()              # as translate holds them (module docstring)
        n_repeats = repeats or CONFIGS[name]["repeats"]
        for n in threads:
            T.set_num_threads(n)
            if torch is not None:
                torch.set_num_threads(n)
            cpus = bench_cpus(n)   # both engines on the same cores, CTranslate2's process too
            with pinned(cpus), tempfile.TemporaryDirectory() as directory:
                deciders = {"ours": ours_decoder(model, precision)}     # timed in this order
                if precision != "fp32":
                    deciders["ours_fp32"] = ours_decoder(model)
                if torch is not None:
                    deciders["torch"] = torch_decoder(model)
                ct2_layouts, ct2_skipped, compute_type = {}, None, None
                if "ctranslate2" in engines:
                    compute_type, ct2_skipped = ctranslate2_compute_type(precision)
                    if compute_type is not None:
                        vocab = write_ctranslate2_model(model, directory, approximate=True)
                        ct2_layouts = {layout: ctranslate2_decoder(directory, vocab, n, compute_type, layout)
                                       for layout in (CT2_LAYOUTS if n > 1 else CT2_LAYOUTS[:1])}
                for beam in beams:
                    ct2_trials = None
                    if ct2_layouts:
                        layout, ct2_trials = fastest_layout(ct2_layouts, src, beam,
                                                            settle_s=SETTLE_S if n > 1 else 0.0)
                        deciders["ctranslate2"] = ct2_layouts[layout]
                    times = {engine: [] for engine in deciders}
                    for engine, decide in deciders.items():     # warm-up
                        if engine == "torch":
                            decide(src, beam, steps=4)
                        else:
                            decide(src, beam)
                    for r in range(n_repeats):
                        for engine, decide in deciders.items():
                            if engine == "torch" and r >= torch_repeats:
                                continue
                            if n > 1:
                                time.sleep(SETTLE_S)
                            times[engine].append(call_seconds(decide, src, beam))
                    record = _record(name, src, n, beam, precision, times, model.params.frozen is not None)
                    record["cpus"] = cpus
                    if ct2_trials is not None:
                        record.update(ctranslate2_compute_type=compute_type,
                                      ctranslate2_layout=dict(deciders["ctranslate2"].layout),
                                      ctranslate2_layout_trials_s=ct2_trials)
                    elif ct2_skipped is not None:
                        record["ctranslate2_skipped"] = ct2_skipped
                    record["ratio"] = record.get("vs_torch" if precision == "fp32" else "vs_ctranslate2")
                    records.append(record)
                    print(json.dumps(record), file=sys.stderr, flush=True)
                deciders.pop("ctranslate2", None)
                ct2_layouts.clear()          # the translators let go of their threads and weights
    return records


def _kv_cache(precision):
    """What our key/value caches hold at `precision` (decoding.cache_dtype)."""
    from ..decoding import cache_dtype

    return "float32" if cache_dtype(precision) == np.float32 else "bf16"


def _record(name, src, threads, beam, precision, times, frozen):
    """The record of one (config, threads, beam) from {engine: [seconds]}: ours_* (at
    `precision`, on weights `frozen` or writeable), then for every other engine E: E_per_s, E_s,
    E_spread_s and vs_E (E's time / ours: ours' tokens/s over E's). Every record names the CPU
    (family and model) and the dispatch level it ran."""
    tokens = src.shape[0] * STEPS
    median = {e: statistics.median(t) for e, t in times.items()}
    kernel = f"decode {'greedy' if beam == 1 else f'beam {beam}'}"
    if precision != "fp32":
        kernel += f" {precision}"
    from .. import _C
    from .harness import cpu_model

    record = {"kernel": kernel, "config": name, "shape": f"{name} B={src.shape[0]} S={src.shape[1]}",
              "cpu": cpu_model(), "isa": _C.isa(), "threads": threads, "precision": precision, "beam": beam, "kv_cache": _kv_cache(precision),
              "weights": "frozen" if frozen else "writeable",
              "ours_per_s": tokens / median["ours"],
              "ours_s": median["ours"], "ours_spread_s": [min(times["ours"]), max(times["ours"])],
              "repeats": len(times["ours"])}
    for engine in times:
        if engine != "ours":
            record[f"{engine}_per_s"] = tokens / median[engine]
            record[f"{engine}_s"] = median[engine]
            record[f"vs_{engine}"] = median[engine] / median["ours"]
            record[f"{engine}_spread_s"] = [min(times[engine]), max(times[engine])]
            record[f"vs_{engine}_paired"] = paired_ratio(times["ours"], times[engine])
    return record


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--configs", default="tiny,base")
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--engines", default="ours,torch,ctranslate2",
                        help="ours is always run; torch and ctranslate2 are the references")
    parser.add_argument("--torch-repeats", type=int, default=1)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "int8"],
                        help="bf16/int8: ours at that precision and at fp32, CTranslate2 at the same")
    args = parser.parse_args()
    for record in run(threads=[int(t) for t in args.threads.split(",")], configs=args.configs.split(","),
                      beams=[int(b) for b in args.beams.split(",")], engines=args.engines.split(","),
                      torch_repeats=args.torch_repeats, precision=args.precision):
        print(json.dumps(record))
