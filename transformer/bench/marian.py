"""MarianMT at OPUS-MT's size: decoding and fine-tuning tokens/s against CTranslate2 and transformers.

Ours and the references are measured in the same run, interleaved.

    python -m transformer.bench.marian --threads 1,2 [--quick] [--config opus|tiny] [--json FILE]

One random MarianMTModel of opus-mt-*'s shape (d_model 512, 6 + 6 layers, 8 heads, FFN 2048,
SiLU "swish", scaled embeddings, one 58101 x 512 matrix shared by both embeddings and the output
projection, pad = 58100 = decoder start, EOS 0) is written with `save_pretrained` beside its
tokenizer files, and every engine reads that directory the way its users do: ours through
import_marian, CTranslate2 through its TransformersConverter (once without quantization, once
with int8 weights), transformers through MarianMTModel. The vocabulary: a SentencePiece model
trained here on a synthetic corpus (2000 pieces) and a vocab.json completed to 58101 entries with
placeholder pieces. In OPUS-MT too vocab.json is bigger than either SentencePiece model (it is the
union of the source and target ones); the matrices, which set the cost, have all 58101 rows.

Decoding: 8 sentences of 16 to 24 random token ids (lengths spread evenly, mean 20; EOS last,
right-padded). A random model does not stop at EOS, so every engine generates exactly `new_tokens` (64) tokens per
sentence: ours min_len = max_len, transformers min_new_tokens = max_new_tokens, CTranslate2
min_decoding_length = max_decoding_length; each engine's counts are checked after its warm-up
and stored in the record ("generated"). Five engines alternate in every repeat, each after
decode.SETTLE_S of sleep when threads > 1 (every library brings its own OpenMP runtime, whose
idle workers spin): ours fp32, CTranslate2 float32, transformers `generate` (fp32, its key/value
cache, torch at the same thread count, pad banned as OPUS-MT's generation_config does), ours
int8 and CTranslate2 int8. The medians give one fp32 record (ours vs CTranslate2 and vs
transformers) and one int8 record (ours vs CTranslate2) per (threads, beam). CTranslate2 runs at
the faster of its thread layouts (intra_threads = n, or n translators of one thread each),
chosen as the decode bench does (decode.fastest_layout). Tokens/s counts output tokens (batch x
new_tokens), also for beam search, whose length penalty plays no part at a fixed length. A
thread count n runs every engine on the same n CPUs, the first this process may use
(harness.pinned, as the decode bench; records: "cpus"), CTranslate2's translators included.
transformers' beam 4 takes about 1.5-2x ours here (it has a key/value cache), so it is timed in
full like the others. At int8, the output projection (58101 x 512, more weights than the six decoder layers) is
quantized by both engines (ours: decoding.int8_generator's rule).

Fine-tuning: 16 pairs of 20-28 random tokens (~24; targets end with EOS, decoder input started
from pad, as MarianMT's shift_tokens_right), cross-entropy with label smoothing 0.1 over non-pad
targets, dropout 0.1. Ours applies one dropout probability at every site (embeddings, attention
weights, after the activation, residual branches), like nn.Transformer; MarianConfig names them
apart, so the model is written with dropout = attention_dropout = activation_dropout = 0.1 and
both engines do the same work. A step: ours zero_grad + forward_backward + Adam; transformers
MarianMTModel forward, F.cross_entropy, loss.backward(), torch.optim.Adam (fp32). Target tokens
per second of the median step, interleaved after warm-up.

--quick: 16 new tokens, one timed repeat, one layout trial; a smoke run of about two minutes.
Every record names the CPU (model name, family and model), the thread count, what was measured,
ours (ours_per_s), the reference (reference, ref_per_s), ratio = ours / reference in tokens/s
(> 1: we are faster), and the versions of ctranslate2, transformers and torch.
Needs torch, transformers, sentencepiece and ctranslate2.
"""
import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np

from . import decode as decode_bench
from .decode import CT2_LAYOUTS, SETTLE_S, ctranslate2_compute_type, fastest_layout
from ..marian import write_marian_vocab
from .harness import alternate, bench_cpus, cpu_model, emit, engine_threads, pinned

# name: MarianConfig sizes; `pieces`: the SentencePiece model's size (vocab.json is completed to
# `vocab` with placeholder pieces, see the module docstring)
CONFIGS = {
    "opus": dict(d_model=512, layers=6, heads=8, ffn=2048, vocab=58101, max_positions=512, pieces=2000),
    "tiny": dict(d_model=64, layers=2, heads=4, ffn=128, vocab=600, max_positions=128, pieces=200),
}
# what is measured, at every size
DECODE_BATCH, SOURCE_TOKENS = 8, (16, 24)          # sentences; length range, EOS included
TRAIN_BATCH, TRAIN_TOKENS = 16, (20, 28)
BEAMS = (1, 4)
DROPOUT = 0.1
LABEL_SMOOTHING = 0.1
# full run and --quick (a smoke test: fewer tokens, one timed repeat)
RUNS = {False: dict(new_tokens=64, repeats=3, train_repeats=3, layout_trials=2),
        True: dict(new_tokens=16, repeats=1, train_repeats=1, layout_trials=1)}
PRECISIONS = ("fp32", "int8")


def versions():
    import ctranslate2
    import torch
    import transformers
    return {"ctranslate2": ctranslate2.__version__, "transformers": transformers.__version__,
            "torch": torch.__version__}


@contextlib.contextmanager
def _quiet_transformers():
    """transformers' progress bars and advisory warnings off for the block, then as they were."""
    from transformers.utils import logging
    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


# -- the model, written once, read by every engine ---------------------------------------------------

def _sentencepiece_model(path, pieces, seed):
    """A unigram SentencePiece model of `pieces` pieces, trained on random words (MarianMT's
    SentencePiece models have no BOS/EOS of their own: vocab.json gives </s>)."""
    import sentencepiece as spm

    rng = np.random.default_rng(seed)
    letters = list("abcdefghijklmnopqrstuvwxyz")
    words = ["".join(rng.choice(letters, size=rng.integers(2, 9))) for _ in range(3000)]
    sentences = [" ".join(rng.choice(words, size=12)) for _ in range(2000)]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_prefix=path, vocab_size=pieces,
                                   character_coverage=1.0, model_type="unigram", bos_id=-1, eos_id=-1,
                                   unk_id=0, minloglevel=2)
    return path + ".model"


def write_marian_dir(root, config="opus", seed=0):
    """A random MarianMTModel of CONFIGS[config]'s shape (transformers' own initialisation) in
    `root`: save_pretrained's files and MarianTokenizer's (source.spm, target.spm, vocab.json,
    tokenizer_config.json). Returns the pieces by id (vocab.json inverted)."""
    import torch
    import transformers

    c = CONFIGS[config]
    os.makedirs(root, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        vocab = write_marian_vocab(root, _sentencepiece_model(os.path.join(scratch, "sp"), c["pieces"], seed),
                                   c["vocab"])
    pad = len(vocab) - 1
    cfg = transformers.MarianConfig(
        vocab_size=len(vocab), decoder_vocab_size=len(vocab), d_model=c["d_model"],
        encoder_layers=c["layers"], decoder_layers=c["layers"], encoder_attention_heads=c["heads"],
        decoder_attention_heads=c["heads"], encoder_ffn_dim=c["ffn"], decoder_ffn_dim=c["ffn"],
        max_position_embeddings=c["max_positions"], pad_token_id=pad, eos_token_id=0,
        decoder_start_token_id=pad, forced_eos_token_id=None, activation_function="swish",
        scale_embedding=True, share_encoder_decoder_embeddings=True,
        dropout=DROPOUT, attention_dropout=DROPOUT, activation_dropout=DROPOUT)
    torch.manual_seed(seed)
    with _quiet_transformers():
        transformers.MarianMTModel(cfg).save_pretrained(root)
        transformers.MarianTokenizer(os.path.join(root, "source.spm"), os.path.join(root, "target.spm"),
                                     os.path.join(root, "vocab.json")).save_pretrained(root)
    return [piece for piece, _ in sorted(vocab.items(), key=lambda item: item[1])]


def convert_ctranslate2(hf_dir, out_dir, quantization=None):
    """CTranslate2's own conversion of the MarianMT directory (quantization None or "int8")."""
    import ctranslate2

    with _quiet_transformers():
        ctranslate2.converters.TransformersConverter(hf_dir).convert(out_dir, quantization=quantization,
                                                                     force=True)
    return out_dir


def _rows(rng, batch, lengths, vocab_size, pad_id, eos_id):
    """[batch, longest] random ids in [2, pad_id) with EOS last, right-padded with pad_id; the
    lengths spread evenly over `lengths` (first, last), so their mean is the range's middle."""
    sizes = np.linspace(lengths[0], lengths[1], batch).round().astype(int)
    out = np.full((batch, int(sizes.max())), pad_id, dtype=np.int64)
    for row, size in enumerate(sizes):
        out[row, :size - 1] = rng.integers(2, min(pad_id, vocab_size), size - 1)
        out[row, size - 1] = eos_id
    return out


def source_batch(cfg, seed=0):
    """The decoding batch: DECODE_BATCH sentences of SOURCE_TOKENS ids."""
    return _rows(np.random.default_rng(seed), DECODE_BATCH, SOURCE_TOKENS, cfg.src_vocab_size, cfg.pad_id,
                 cfg.eos_id)


def train_batch(cfg, seed=1):
    """(src, tgt_in, tgt_out): tgt_in is tgt_out shifted right behind the decoder start (pad), its
    EOS not fed (MarianMT's shift_tokens_right)."""
    rng = np.random.default_rng(seed)
    src = _rows(rng, TRAIN_BATCH, TRAIN_TOKENS, cfg.src_vocab_size, cfg.pad_id, cfg.eos_id)
    tgt_out = _rows(rng, TRAIN_BATCH, TRAIN_TOKENS, cfg.tgt_vocab_size, cfg.pad_id, cfg.eos_id)
    tgt_in = np.full_like(tgt_out, cfg.pad_id)
    tgt_in[:, 1:] = tgt_out[:, :-1]
    tgt_in[tgt_in == cfg.eos_id] = cfg.pad_id
    return src, tgt_in, tgt_out


# -- decoders: decode(src, beam) -> the number of tokens generated for each sentence -----------------

def _remembering(decode):
    """decode, keeping (beam, counts) of its last call in .last: the warm-up reads a translator's
    counts from its layout trial instead of decoding once more."""
    def call(src, beam):
        counts = decode(src, beam)
        call.last = (beam, counts)
        call.seconds = getattr(decode, "seconds", None)   # a translator's own measure (decode.call_seconds)
        return counts

    call.last = call.seconds = None
    return call


def ours_decoder(model, precision, new_tokens):
    """Our greedy (beam 1) or beam search, exactly new_tokens per sentence, at `precision`."""
    options = {} if precision == "fp32" else {"precision": precision}

    def decode(src, beam):
        if beam == 1:
            hyps = model.greedy_decode(src, max_len=new_tokens, min_len=new_tokens, **options)
        else:
            hyps = model.beam_search(src, beam, max_len=new_tokens, min_len=new_tokens, length_penalty=0.0,
                                     **options)
        return [len(h) for h in hyps]

    return _remembering(decode)


def ctranslate2_decoder(directory, pieces, pad_id, threads, compute_type, layout, new_tokens):
    """decode_bench.ctranslate2_decoder over `directory` (token strings, pad left out, `new_tokens`
    steps), returning each sentence's token count; .layout names the thread layout."""
    translate = decode_bench.ctranslate2_decoder(directory, pieces, threads, compute_type, layout,
                                                 steps=new_tokens, pad_id=pad_id)

    def counts(src, beam):
        result = [len(r.hypotheses[0]) for r in translate(src, beam)]
        counts.seconds = translate.seconds
        return result

    counts = _remembering(counts)
    counts.layout = {**translate.layout,
                     "max_batch_size": -(-DECODE_BATCH // translate.layout["inter_threads"])}
    return counts


def transformers_decoder(hf_model, pad_id, new_tokens):
    """MarianMTModel.generate, greedy or beam, exactly new_tokens per sentence."""
    import torch

    @torch.inference_mode()
    def decode(src, beam):
        ids = torch.from_numpy(src)
        out = hf_model.generate(input_ids=ids, attention_mask=ids != pad_id, num_beams=beam, do_sample=False,
                                min_new_tokens=new_tokens, max_new_tokens=new_tokens, bad_words_ids=[[pad_id]])
        return (out[:, 1:] != pad_id).sum(1).tolist()     # after the decoder start token

    return _remembering(decode)


def check_counts(engine, counts, batch, new_tokens):
    """RuntimeError unless `engine` generated exactly new_tokens for each of `batch` sentences."""
    if len(counts) != batch or any(n != new_tokens for n in counts):
        raise RuntimeError(f"{engine} generated {counts} tokens for {batch} sentences, expected "
                           f"{new_tokens} each: the engines would not be doing the same work")
    return sum(counts)


# -- fine-tuning steps --------------------------------------------------------------------------------

class _OursStep:
    def __init__(self, model, batch):
        import transformer as T
        self.model, self.batch = model, batch
        self.opt = T.Adam(model, lr=1e-4)

    def __call__(self):
        self.model.zero_grad()
        loss = self.model.forward_backward(*self.batch, label_smoothing=LABEL_SMOOTHING)
        self.opt.step()
        return float(loss)


class _TransformersStep:
    def __init__(self, hf_model, batch, pad_id):
        import torch
        self.torch, self.model, self.pad_id = torch, hf_model, pad_id
        self.src, self.tgt_in, self.tgt_out = (torch.from_numpy(x) for x in batch)
        self.mask = self.src != pad_id
        self.opt = torch.optim.Adam(hf_model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def __call__(self):
        F = self.torch.nn.functional
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        logits = self.model(input_ids=self.src, attention_mask=self.mask, decoder_input_ids=self.tgt_in).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), self.tgt_out.reshape(-1),
                               ignore_index=self.pad_id, label_smoothing=LABEL_SMOOTHING)
        loss.backward()
        self.opt.step()
        return loss.item()


# -- records --------------------------------------------------------------------------------------

def _figures(label, seconds, tokens):
    median = statistics.median(seconds)
    return {f"{label}_per_s": tokens / median, f"{label}_s": median,
            f"{label}_spread_s": [min(seconds), max(seconds)]}


def _record(config, threads, kernel, measured, **fields):
    """The fields every record starts with (bench, what was measured, model, CPU, threads)."""
    c = CONFIGS[config]
    return {"bench": "marian", "kernel": kernel, "measured": measured, "config": config,
            "shape": (f"d_model={c['d_model']} layers={c['layers']}+{c['layers']} heads={c['heads']} "
                      f"ffn={c['ffn']} vocab={c['vocab']}"),
            "cpu": cpu_model(), "threads": threads, "cpus": bench_cpus(threads), **fields}


def _compare(record, ours, refs, times, tokens):
    """Adds ours' figures (label `ours` in times) and each reference's ({label in times: name}),
    vs_<name> = ours / reference in tokens/s, and ratio against the first reference."""
    record.update(repeats=len(times[ours]), **_figures("ours", times[ours], tokens))
    for label, name in refs.items():
        if label in times:
            record.update(_figures(name, times[label], tokens))
            record[f"vs_{name}"] = record["ours_per_s"] / record[f"{name}_per_s"]
    reference = next(iter(refs.values()))
    record.update(reference=reference, ref_per_s=record.get(f"{reference}_per_s"),
                  ratio=record.get(f"vs_{reference}"), versions=versions())
    return record


# -- the run ----------------------------------------------------------------------------------------

def _translators(ct2_dirs, pieces, pad_id, threads, new_tokens):
    """({precision: (compute_type, {layout: decoder})}, {precision: why skipped}): one translator
    per layout tried at this thread count (intra only at one thread)."""
    layouts = CT2_LAYOUTS if threads > 1 else CT2_LAYOUTS[:1]
    translators, skipped = {}, {}
    for precision in PRECISIONS:
        compute_type, why = ctranslate2_compute_type(precision)
        if compute_type is None:
            skipped[precision] = why
            continue
        translators[precision] = (compute_type, {
            layout: ctranslate2_decoder(ct2_dirs[precision], pieces, pad_id, threads, compute_type, layout,
                                        new_tokens) for layout in layouts})
    return translators, skipped


def _fastest(compute_type, by_layout, src, beam, trials, settle_s):
    """(the faster translator, its record fields) for this beam (decode.fastest_layout)."""
    best, trial_s = next(iter(by_layout)), None
    if len(by_layout) > 1:
        best, trial_s = fastest_layout(by_layout, src, beam, trials=trials, settle_s=settle_s)
    return by_layout[best], {"ctranslate2_compute_type": compute_type,
                             "ctranslate2_layout": dict(by_layout[best].layout),
                             "ctranslate2_layout_trials_s": trial_s}


def _decode(model, hf_model, pieces, ct2_dirs, config, threads, options, records, stream):
    """The decoding records of one thread count: per beam, one fp32 record (ours vs CTranslate2
    float32 and transformers) and one int8 record (ours vs CTranslate2 int8), all five engines
    interleaved."""
    cfg = model.cfg
    src = source_batch(cfg)
    new_tokens = options["new_tokens"]
    tokens = src.shape[0] * new_tokens
    settle_s = SETTLE_S if threads > 1 else 0.0
    source_tokens = float((src != cfg.pad_id).sum(1).mean())
    translators, skipped = _translators(ct2_dirs, pieces, cfg.pad_id, threads, new_tokens)
    try:
        for beam in BEAMS:
            ct2, ct2_fields = {}, {p: {"ctranslate2_skipped": why} for p, why in skipped.items()}
            for precision, (compute_type, by_layout) in translators.items():
                ct2[precision], ct2_fields[precision] = _fastest(compute_type, by_layout, src, beam,
                                                                 options["layout_trials"], settle_s)
            decoders = {"ours": ours_decoder(model, "fp32", new_tokens), "ctranslate2": ct2.get("fp32"),
                        "transformers": transformers_decoder(hf_model, cfg.pad_id, new_tokens),
                        "ours_int8": ours_decoder(model, "int8", new_tokens),
                        "ctranslate2_int8": ct2.get("int8")}                # timed in this order
            decoders = {label: decode for label, decode in decoders.items() if decode is not None}
            generated = {}
            for label, decode in decoders.items():                 # warm-up, and the same work
                if decode.last is None or decode.last[0] != beam:
                    if settle_s:
                        time.sleep(settle_s)
                    decode(src, beam)
                generated[label] = check_counts(label, decode.last[1], src.shape[0], new_tokens)
            times = alternate(decoders, (src, beam), options["repeats"], settle_s)
            search = "greedy" if beam == 1 else f"beam {beam}"
            for precision, ours, refs in (
                    ("fp32", "ours", {"ctranslate2": "ctranslate2", "transformers": "transformers"}),
                    ("int8", "ours_int8", {"ctranslate2_int8": "ctranslate2"})):
                record = _record(config, threads, f"marian decode {search} {precision}",
                                 f"decoding, {search}, {precision}: generated tokens/s, {src.shape[0]} "
                                 f"sentences of ~{source_tokens:.0f} source tokens, {new_tokens} new tokens each",
                                 precision=precision, beam=beam, batch=int(src.shape[0]),
                                 source_tokens=source_tokens, new_tokens=new_tokens, tokens=tokens,
                                 weights="frozen" if model.params.frozen is not None else "writeable")
                record["generated"] = {name: generated[label] for label, name in {ours: "ours", **refs}.items()
                                       if label in generated}
                record.update(ct2_fields[precision])
                if precision != "fp32":
                    record["transformers_skipped"] = ("transformers generate runs fp32 only here (no "
                                                      "quantized decoder of its own): see the fp32 record")
                emit(_compare(record, ours, refs, times, tokens), records, stream)
    finally:
        translators.clear()          # the translators let go of their threads and weights
        gc.collect()


def _train(model, hf_model, config, threads, options, records, stream, set_threads):
    """The fine-tuning records, one per thread count; the two steps alternate after warm-up."""
    cfg = model.cfg
    batch = train_batch(cfg)
    steps = {"ours": _OursStep(model, batch), "transformers": _TransformersStep(hf_model, batch, cfg.pad_id)}
    tokens = int((batch[2] != cfg.pad_id).sum())
    first_loss = None         # same weights, same batch: the two losses differ by dropout only
    for n in threads:
        set_threads(n)
        with pinned(bench_cpus(n)):
            warm_up = {name: step() for name, step in steps.items()}    # buffers, thread teams
            first_loss = first_loss or warm_up
            times = alternate(steps, (), options["train_repeats"], SETTLE_S if n > 1 else 0.0)
        record = _record(config, n, "marian fine-tune fp32",
                         f"fine-tuning step (forward, backward, Adam), fp32: target tokens/s, {TRAIN_BATCH} "
                         f"pairs of ~{np.mean(TRAIN_TOKENS):.0f} tokens, label smoothing {LABEL_SMOOTHING}, "
                         f"dropout {DROPOUT}",
                         precision="fp32", batch=TRAIN_BATCH, source_shape=list(batch[0].shape),
                         target_shape=list(batch[2].shape), tokens=tokens, first_loss=first_loss)
        emit(_compare(record, "ours", {"transformers": "transformers"}, times, tokens), records, stream)


def run(threads, quick=False, config="opus", stream=sys.stdout):
    """Decoding and fine-tuning records (dicts, see the module docstring) for each thread count
    in `threads`, each printed to `stream` as one JSON line as soon as it is measured (None:
    not printed). quick: 16 new tokens and one timed repeat (a smoke test); config "tiny": the
    same run on a d_model 64, 2 + 2 layer model (for tests). The thread counts of ours and torch
    are restored afterwards."""
    import torch
    import transformers

    from transformer.marian import import_marian

    from .precision import require

    if config not in CONFIGS:
        raise ValueError(f"config must be one of {sorted(CONFIGS)}, got {config!r}")
    threads = [int(n) for n in threads]
    if not threads or min(threads) < 1:
        raise ValueError(f"threads must be counts >= 1, got {threads}")
    require("int8", "decode")
    options = RUNS[bool(quick)]
    records = []
    with engine_threads(torch) as set_threads, tempfile.TemporaryDirectory(prefix="marian-bench-") as root:
        hf_dir = os.path.join(root, "hf")
        pieces = write_marian_dir(hf_dir, config)
        ct2_dirs = {"fp32": convert_ctranslate2(hf_dir, os.path.join(root, "ct2-float32")),
                    "int8": convert_ctranslate2(hf_dir, os.path.join(root, "ct2-int8"), "int8")}
        model, _, _ = import_marian(hf_dir)
        with _quiet_transformers():
            hf_model = transformers.MarianMTModel.from_pretrained(hf_dir).eval()
        model.params.freeze()      # decoded as translate holds the weights (decode.py)
        try:
            for n in threads:
                set_threads(n)
                with pinned(bench_cpus(n)):     # both engines on the same cores, CTranslate2 too
                    _decode(model, hf_model, pieces, ct2_dirs, config, n, options, records, stream)
        finally:
            model.params.unfreeze()
        _train(model, hf_model, config, threads, options, records, stream, set_threads)
    return records


def main(argv=None):
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--quick", action="store_true", help="16 new tokens, one timed repeat (< 2 minutes)")
    parser.add_argument("--config", default="opus", choices=sorted(CONFIGS))
    parser.add_argument("--json", metavar="FILE", help="also write the records there, one JSON line each")
    args = parser.parse_args(argv)
    records = run([int(t) for t in args.threads.split(",")], quick=args.quick, config=args.config)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
    return records


if __name__ == "__main__":
    main()
