"""Marian NMT's leg of the time-to-quality race (bench/race.py): the C++ trainer behind OPUS-MT,
from PyPI's `pymarian`, trained on our split and scored by our scorer.

    python -m transformer.bench.race_marian --marian-python VENV/bin/python --minutes 10 \\
        --data FILE --src-col eng --tgt-col spa --threads 2 --out runs/marian-10 [--json RECORDS.jsonl]

Everything but the trainer is ours, so the BLEU compares what training reached:
- the data: the prepared corpus's training pairs that our TrainingSet keeps (the same BPE, the same
  length filter), written as id words ("w17 w4 ..."); Marian builds its vocabularies from them;
- the scoring: Marian's output words mapped back to ids, decoded by our target tokenizer and scored
  by translation.score_translations on the whole held-out split (greedy and beam 4), and greedy on
  the first --eval-limit held-out pairs at ten snapshots along the run (the curve).

Marian's training is its documented transformer recipe (marian-examples/transformer: post-norm
"dan", label smoothing 0.1, dropout 0.1, Adam 0.9/0.98/1e-9, clip-norm 5, exponential smoothing,
inverse-square-root decay after a linear warm-up) at the shape our run picks for the budget
(SHAPES), with two changes a budget forces:
- the schedule scaled to the budget: warm-up over WARMUP_SHARE of the steps (ours' share), then
  `--lr-decay-inv-sqrt` from there, as the recipe;
- mini-batches of --batch-tokens target words (ours' batch), where the recipe fills a GPU.
The recipe's `--tied-embeddings-all` needs one vocabulary for both sides; ours are two, so the
target embedding and the output layer are tied (`--tied-embeddings`).
The peak learning rate is --marian-lr: by default ("ours") the peak ours' budget schedule gives the
shape (training/schedule.py: 2.83e-3 for `tiny`). Measured on the Bible, 5 minutes of `tiny` (539
updates, Xeon family 6 model 207, 2026-12-02), it is the best of three: held-out BLEU 0.42 and
training cost 5.67 at update 500 against the recipe's 3e-4 (0.05, 6.71) and 6e-3 (cost 6.23).

The budget: Marian's seconds per update are timed first on this corpus at this thread count (a
PROBE_UPDATES-update run, from its log, not counted in the budget); the run trains budget / that
many updates (`--after Nu`). --steps N trains N updates instead (a busy machine: give the quiet
--step-seconds measured apart; the record's curve then uses it, as race.py's records).
"""
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

PROBE_UPDATES = 60
WARMUP_SHARE = 0.05
RECIPE_LR = 3e-4     # marian-examples/transformer's, for GPU batches of thousands of sentences
SNAPSHOTS = 10
# ours' presets that a budget picks (training/sizing.py), Marian given the same shape
SHAPES = ("tiny", "medium-4-2", "small")

_DISPLAY = re.compile(r"Up\. (\d+) .*?Time ([0-9.]+)s")


def shape_of(name):
    """(d_model, heads, d_ff, encoder layers, decoder layers) of ours' preset `name`."""
    from ..config import PRESETS

    p = PRESETS[name]
    return p["d_model"], p["n_heads"], p["d_ff"], p["n_encoder_layers"], p["n_decoder_layers"]


def recipe_flags(shape, steps, threads, lr, batch_tokens, max_tokens, seed):
    """Marian's command line for `steps` updates of `shape` (see the module docstring)."""
    d_model, heads, d_ff, enc, dec = shape_of(shape)
    warmup = max(1, round(WARMUP_SHARE * steps))
    return ["--type", "transformer", "--dim-emb", str(d_model), "--transformer-heads", str(heads),
            "--transformer-dim-ffn", str(d_ff), "--enc-depth", str(enc), "--dec-depth", str(dec),
            "--transformer-postprocess-emb", "d", "--transformer-postprocess", "dan",
            "--transformer-dropout", "0.1", "--label-smoothing", "0.1",
            "--learn-rate", f"{lr:g}", "--lr-warmup", str(warmup), "--lr-decay-inv-sqrt", str(warmup),
            "--optimizer-params", "0.9", "0.98", "1e-09", "--clip-norm", "5", "--exponential-smoothing",
            "--tied-embeddings", "--mini-batch-words", str(batch_tokens), "--maxi-batch", "1000",
            "--max-length", str(max_tokens), "--after", f"{steps}u", "--cpu-threads", str(threads),
            "--seed", str(seed + 1), "--disp-freq", "20u", "--shuffle-in-ram", "--no-restore-corpus",
            "--sigterm", "save-and-exit"]


def export(data, dev, directory):
    """The training pairs `data` (a TrainingSet) and the held-out sources as id words, for Marian."""
    os.makedirs(directory, exist_ok=True)

    def words(ids):
        return " ".join(f"w{int(i)}" for i in ids)

    corpus = data.corpus
    with open(os.path.join(directory, "train.src"), "w", encoding="utf-8") as src, \
            open(os.path.join(directory, "train.tgt"), "w", encoding="utf-8") as tgt:
        for row in data.rows:
            src.write(words(corpus.sentence("src", int(row))) + "\n")
            tgt.write(words(corpus.sentence("tgt", int(row))) + "\n")
    with open(os.path.join(directory, "dev.src"), "w", encoding="utf-8") as f:
        for source in dev:
            f.write(words(corpus.src_tokenizer.encode(source)) + "\n")


def read_words(line):
    """Ids of Marian's output words ("w17 w4 ..."); anything else (<unk>) dropped."""
    return [int(w[1:]) for w in line.split() if w[:1] == "w" and w[1:].isdigit()]


def seconds_per_update(log_path):
    """Median seconds per update between the displays of a Marian log after its first one."""
    points = []
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = _DISPLAY.search(line)
            if m:
                points.append((int(m.group(1)), float(m.group(2))))
    per = [t / (u - prev) for (prev, _), (u, t) in zip(points, points[1:])]
    if not per:
        raise RuntimeError(f"{log_path}: fewer than two progress lines; Marian's log is in that file")
    return statistics.median(per)


def train_marian(python, workdir, flags, timeout_s=None):
    """Run Marian's trainer (`python -m pymarian`) on the exported corpus; its log is train.log."""
    model = os.path.join(workdir, "model.npz")
    vocabs = [os.path.join(workdir, f"vocab.{side}.yml") for side in ("src", "tgt")]
    log = os.path.join(workdir, "train.log")
    command = [python, "-m", "pymarian", "--model", model, "--train-sets",
               os.path.join(workdir, "train.src"), os.path.join(workdir, "train.tgt"), "--vocabs", *vocabs,
               "--log", log, "--quiet", *flags]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stopped = False
    try:
        _, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:      # the budget is up: Marian saves and exits on SIGTERM
        process.terminate()
        _, err = process.communicate()
        stopped = True
    if process.returncode and not stopped:
        raise RuntimeError(f"Marian's trainer failed ({process.returncode}): {err[-2000:]}")
    return time.perf_counter() - started, model, vocabs, log, stopped


_TRANSLATE = r"""
import sys
from pymarian import Translator
model, src_vocab, tgt_vocab, beam, threads, source, out = sys.argv[1:]
t = Translator(models=model, vocabs=[src_vocab, tgt_vocab], beam_size=int(beam), normalize=0.6,
               cpu_threads=int(threads), mini_batch=32, maxi_batch=100, max_length_factor=3, quiet=True)
with open(source, encoding="utf-8") as f:
    lines = [line.rstrip("\n") for line in f]
with open(out, "w", encoding="utf-8") as f:
    for hyp in t.translate(lines):
        f.write(hyp + "\n")
"""


def translate_marian(python, model, vocabs, source_file, beam, threads, tgt_tokenizer, limit=None):
    """Our target texts for the lines of source_file, translated by a Marian model."""
    if limit is not None:
        part = source_file + f".first{limit}"
        with open(source_file, encoding="utf-8") as f, open(part, "w", encoding="utf-8") as g:
            for _, line in zip(range(limit), f):
                g.write(line)
        source_file = part
    out = model + f".beam{beam}.out"
    subprocess.run([python, "-c", _TRANSLATE, model, *vocabs, str(beam), str(threads), source_file, out],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out, encoding="utf-8") as f:
        return [tgt_tokenizer.decode(read_words(line)) for line in f]


def ours_peak(shape):
    """The peak learning rate of ours' budget schedule for `shape` (--marian-lr ours)."""
    from ..training.schedule import PEAK_LR_FACTOR

    return PEAK_LR_FACTOR * shape_of(shape)[0] ** -0.5


def run(args, python, shape, minutes, lr=None, steps=None, step_seconds=None, eval_limit=100):
    """One Marian run for a budget: the record race.py keeps (final greedy and beam-4 BLEU / chrF on
    the whole held-out split, the curve of snapshots' greedy BLEU on the first eval_limit pairs).
    lr None: ours_peak(shape)."""
    from ..corpus import TrainingSet
    from ..translation import score_translations
    from ..training.data import open_corpus
    from .harness import cpu_model

    from ..train import describe_data

    data_name = describe_data(args)
    lr = ours_peak(shape) if lr is None else lr
    corpus = open_corpus(args)
    data = TrainingSet(corpus, args.max_sentence_tokens, args.batch_tokens, 0, 1, 2, 0)
    dev = corpus.dev
    if os.path.exists(args.out):         # a run's folder is replaced; nothing else is
        if os.listdir(args.out) and not os.path.exists(os.path.join(args.out, "train.src")):
            raise SystemExit(f"--out {args.out}: exists and is not a Marian run's folder")
        shutil.rmtree(args.out)
    export(data, [s for s, _ in dev], args.out)
    common = dict(threads=args.threads, lr=lr, batch_tokens=args.batch_tokens,
                  max_tokens=args.max_sentence_tokens, seed=args.seed)
    if step_seconds is None:            # Marian's own seconds an update, here, on this corpus
        probe = os.path.join(args.out, "probe")
        os.makedirs(probe)
        for name in ("train.src", "train.tgt"):
            os.link(os.path.join(args.out, name), os.path.join(probe, name))
        train_marian(python, probe, recipe_flags(shape, PROBE_UPDATES, **common))
        step_seconds = seconds_per_update(os.path.join(probe, "train.log"))
        shutil.rmtree(probe)
    planned = steps if steps is not None else max(1, int(minutes * 60 / step_seconds))
    flags = recipe_flags(shape, planned, **common) + ["--save-freq", f"{max(1, planned // SNAPSHOTS)}u"]
    timeout = None if steps is not None else minutes * 60
    seconds, model, vocabs, log, stopped = train_marian(python, args.out, flags, timeout_s=timeout)
    with open(log, encoding="utf-8", errors="replace") as f:     # stopped by the clock: its last display
        done = max([int(m.group(1)) for m in map(_DISPLAY.search, f) if m] or [0]) if stopped else planned
    refs = [t for _, t in dev]
    finals = {}
    for beam, name in ((1, "greedy"), (4, "beam4")):
        hyps = translate_marian(python, model, vocabs, os.path.join(args.out, "dev.src"), beam, args.threads,
                                corpus.tgt_tokenizer)
        finals[name] = score_translations(hyps, refs)
    curve = []
    snapshots = sorted((int(m.group(1)), f) for f in os.listdir(args.out)
                       for m in [re.fullmatch(r"model\.iter(\d+)\.npz", f)] if m)
    for step, name in snapshots:
        hyps = translate_marian(python, os.path.join(args.out, name), vocabs, os.path.join(args.out, "dev.src"), 1,
                                args.threads, corpus.tgt_tokenizer, limit=eval_limit)
        bleu = score_translations(hyps, [t for _, t in dev[:eval_limit]])
        curve.append([round(step * step_seconds, 1), step, bleu["bleu"], bleu["chrf"], None])
    done_version = subprocess.run([python, "-m", "pymarian", "--version"], capture_output=True, text=True)
    version = (done_version.stdout + done_version.stderr).strip()
    d_model, heads, d_ff, enc, dec = shape_of(shape)
    return {"engine": "marian", "system": "marian", "marian_version": version,
            "data": os.path.basename(data_name),
            "preset": shape, "shape": {"d_model": d_model, "heads": heads, "d_ff": d_ff, "encoder_layers": enc,
                                        "decoder_layers": dec},
            "precision": "fp32", "cpu": cpu_model(), "threads": args.threads, "budget_minutes": minutes,
            "marian_lr": lr, "batch_tokens": args.batch_tokens, "steps": done, "planned_steps": planned, "stopped_by_clock": stopped,
            "step_seconds": round(step_seconds, 4), "seconds": round(seconds, 1), "dev_pairs": len(dev),
            "greedy": finals["greedy"], "beam4": finals["beam4"], "curve": curve,
            "flags": " ".join(flags)}


def main(argv=None):
    from .. import cli, train
    from .quality import pop_options, write_record

    argv = list(sys.argv[1:] if argv is None else argv)
    options = {"--marian-python": sys.executable, "--json": None, "--marian-lr": "ours",
               "--shape": "tiny", "--steps": None, "--step-seconds": None}
    pop_options(argv, options)
    args = cli.build_parser().parse_args(["train", *argv])
    if not train.has_data(args) or not args.minutes or not args.out:
        raise SystemExit("--data, --minutes and --out are required")
    if options["--shape"] not in SHAPES:
        raise SystemExit(f"--shape: one of {', '.join(SHAPES)}")
    train.load_resume(args)
    train.apply_defaults(args)
    args.threads = args.threads or 1
    lr = None if options["--marian-lr"] == "ours" else float(options["--marian-lr"])
    record = run(args, options["--marian-python"], options["--shape"], args.minutes, lr,
                 steps=None if options["--steps"] is None else int(options["--steps"]),
                 step_seconds=None if options["--step-seconds"] is None else float(options["--step-seconds"]),
                 eval_limit=args.eval_limit or 100)
    write_record(record, options["--json"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
