"""The time-to-quality race: what each trainer gives a user after 2, 5, 10 and 30 minutes on the
same corpus and cores, with its own defaults, and how much sooner ours reaches each reference's
10-minute BLEU.

    python benchmarks/race.py run --data FILE --src-col eng --tgt-col spa --threads 2 \\
        --budgets 2,5,10,30 --systems ours,torch,marian --json RECORDS.jsonl [--out-dir runs/race] \\
        [--marian-python VENV/bin/python] [--marian-lr LR]
    python benchmarks/race.py table RECORDS.jsonl...        # budget x system x corpus, and the ratios
    python benchmarks/race.py plot OUT.png RECORDS.jsonl...  # held-out BLEU against minutes

Systems:
- ours: `transformer train` with every default (precision auto, the model sized to the budget).
- torch: the PyTorch reference network through the same pipeline (bench/quality.py: the same
  split, BPE, batches, schedule and initial weights; sized to the budget by its own step times),
  at its fastest precision on this CPU: fp32 and autocast bf16 are timed on the corpus's batches
  first and the faster one trains (the record keeps both timings).
- marian: Marian NMT (`pymarian`, in the environment of --marian-python: a 600 MB wheel with its
  own MKL, kept out of ours) with its documented transformer recipe scaled to the budget, at the
  shape ours picked for the same budget, on ours' split and BPE, scored by ours' scorer
  (bench/race_marian.py). --marian-lr: its peak learning rate, by default ours' for the shape
  (race_marian.py says why).

Each (budget, system) is one run of bench/quality.py in a fresh process: final BLEU and chrF
(greedy, beam 4) on the whole held-out split, and the periodic dev BLEU against training seconds.
A record may carry `step_seconds` (a run made with --max-steps standing for a budget on a machine
that was busy: its quiet step time, measured apart); its curve's seconds are then steps times that.

Time to quality: for a reference's 10-minute final greedy BLEU, the minutes at which ours reaches
it: interpolated (linearly in minutes) between ours' budgets' final BLEU, and, from ours' 10-minute
run alone, the first periodic evaluation that reaches the reference's last periodic one (as
quality.py --compare). The ratio is the reference's 10 minutes over ours.
"""
import json
import os
import subprocess
import sys

from .harness import same_package
from .quality import pop_options, read_records, reached_at

SYSTEMS = ("ours", "torch", "marian")


def curve_minutes(record):
    """[(minutes, dev BLEU)] of the record's periodic evaluations."""
    per_step = record.get("step_seconds")
    points = []
    for seconds, step, bleu, *_ in record.get("curve") or []:
        if bleu is not None:
            points.append(((step * per_step if per_step else seconds) / 60.0, bleu))
    return points


def budget_minutes(record):
    if record.get("budget_minutes") is not None:
        return record["budget_minutes"]
    return record.get("minutes")


def system_of(record):
    return record.get("system") or record.get("engine")


def minutes_to_reach(finals, target):
    """The minutes at which final BLEU against budget [(minutes, bleu)] first reaches target,
    interpolated linearly; (value, "at most") when the smallest budget already does; None if none does."""
    finals = sorted(finals)
    for i, (minutes, bleu) in enumerate(finals):
        if bleu >= target:
            if i == 0:
                return minutes, "at most"
            m0, b0 = finals[i - 1]
            return m0 + (minutes - m0) * (target - b0) / (bleu - b0), "interpolated"
    return None


def table(records):
    """Rows of budget x system x corpus, then one time-to-quality row per (corpus, reference)."""
    rows = []
    for r in sorted(records, key=lambda r: (r["data"], budget_minutes(r) or 0, system_of(r))):
        rows.append({"data": r["data"], "budget_minutes": budget_minutes(r), "system": system_of(r),
                     "cpu": r.get("cpu"), "threads": r.get("threads"), "preset": r.get("preset"),
                     "precision": r.get("precision"), "steps": r.get("steps"),
                     "greedy": r["greedy"], "beam4": r["beam4"]})
    for data in sorted({r["data"] for r in records}):
        ours = [r for r in records if r["data"] == data and system_of(r) == "ours"]
        finals = [(budget_minutes(r), r["greedy"]["bleu"]) for r in ours if budget_minutes(r)]
        ours10 = next((r for r in ours if budget_minutes(r) == 10), None)
        for ref in (r for r in records if r["data"] == data and system_of(r) != "ours" and budget_minutes(r) == 10):
            target = ref["greedy"]["bleu"]
            reached = minutes_to_reach(finals, target)
            row = {"data": data, "reference": system_of(ref), "reference_10min_bleu": target,
                   "ours_minutes_by_budgets": None if reached is None else round(reached[0], 2),
                   "how": None if reached is None else reached[1],
                   "time_ratio_by_budgets": None if reached is None else round(10.0 / reached[0], 2)}
            ref_curve = curve_minutes(ref)
            if ours10 is not None and ref_curve:
                last = ref_curve[-1][1]
                when = reached_at([(m, None, b) for m, b in curve_minutes(ours10)], last)
                row.update(reference_last_periodic_bleu=round(last, 2),
                           ours_minutes_by_curve=None if when is None else round(when, 2),
                           time_ratio_by_curve=None if when is None else round(ref_curve[-1][0] / when, 2))
            rows.append(row)
    return rows


def plot(records, path):
    """Held-out BLEU (greedy) against minutes: each system's finals over its budgets (solid), and
    each run's periodic dev BLEU (thin)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    corpora = sorted({r["data"] for r in records})
    systems = sorted({system_of(r) for r in records}, key=lambda s: (s != "ours", s))
    colors = {system: f"C{i}" for i, system in enumerate(systems)}     # one color a system in every panel
    fig, axes = plt.subplots(1, len(corpora), figsize=(6.5 * len(corpora), 4.5), squeeze=False)
    for ax, data in zip(axes[0], corpora):
        mine = [r for r in records if r["data"] == data]
        for system in [s for s in systems if any(system_of(r) == s for r in mine)]:
            runs = sorted((r for r in mine if system_of(r) == system), key=lambda r: budget_minutes(r) or 0)
            color = colors[system]
            finals = [(budget_minutes(r), r["greedy"]["bleu"]) for r in runs if budget_minutes(r)]
            if finals:
                ax.plot(*zip(*finals), "-o", color=color, label=f"{system}: final, held-out")
            for r in runs:
                points = curve_minutes(r)
                if points:
                    ax.plot(*zip(*points), "-", color=color, alpha=0.35, linewidth=1)
        ax.set_title(f"{data} ({mine[0].get('cpu', '')}, {mine[0].get('threads')} threads)", fontsize=9)
        ax.set_xlabel("training minutes (budget)")
        ax.set_ylabel("BLEU (greedy)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def torch_fastest_precision(train_flags, threads):
    """("fp32" | "bf16", {precision: seconds a step}): PyTorch's tiny step timed at both precisions
    on the corpus's batches, in a child process."""
    code = same_package("import json; from transformer.bench.race import _torch_probe; "
                        "print(json.dumps(_torch_probe(sys.argv[1:])))")
    done = subprocess.run([sys.executable, "-c", code, str(threads), *train_flags], capture_output=True,
                          text=True, check=True)
    timings = json.loads(done.stdout.strip().splitlines()[-1])
    return min(timings, key=timings.get), timings


def _torch_probe(argv):
    """Seconds per step of PyTorch's tiny model at fp32 and at bf16 autocast (child of
    torch_fastest_precision)."""
    import time

    import numpy as np
    import torch

    import transformer as T

    from .. import cli, train
    from ..config import PRESETS, ModelConfig
    from ..corpus import TrainingSet
    from ..training.data import open_corpus
    from .quality import torch_engine

    threads, flags = int(argv[0]), argv[1:]
    T.set_num_threads(threads)
    torch.set_num_threads(threads)
    args = cli.build_parser().parse_args(["train", *flags])
    train.load_resume(args)
    train.apply_defaults(args)
    corpus = open_corpus(args)
    data = TrainingSet(corpus, args.max_sentence_tokens, args.batch_tokens, 0, 1, 2, 0)
    batches = data.batches(0)
    cfg = ModelConfig(src_vocab_size=corpus.src_tokenizer.vocab_size, tgt_vocab_size=corpus.tgt_tokenizer.vocab_size,
                      max_len=args.max_sentence_tokens + 1, norm_first=True, **PRESETS["tiny"])
    timings = {}
    for precision in ("fp32", "bf16"):
        model, optimizer, clip = torch_engine(0)(cfg)
        times = []
        for i in range(8):
            src, tgt_in, tgt_out = data.collate(batches[i * 97 % len(batches)])
            started = time.perf_counter()
            model.zero_grad()
            model.forward_backward(src, tgt_in, tgt_out, label_smoothing=0.1, precision=precision)
            clip(model, 1.0)
            optimizer.step(1e-4)
            if i >= 2:
                times.append(time.perf_counter() - started)
        timings[precision] = round(float(np.median(times)), 4)
    return timings


def run(argv):
    """`run`: every (budget, system) as a bench/quality.py child; the records appended to --json."""
    from .race_marian import SHAPES

    options = {"--budgets": "2,5,10,30", "--systems": "ours,torch", "--json": None, "--out-dir": "runs/race",
               "--threads": "2", "--marian-python": sys.executable, "--marian-lr": "ours"}
    pop_options(argv, options)
    budgets = [float(b) for b in options["--budgets"].split(",")]
    systems = options["--systems"].split(",")
    for system in systems:
        if system not in SYSTEMS:
            raise SystemExit(f"--systems: {system!r} is not one of {', '.join(SYSTEMS)}")
    if not options["--json"]:
        raise SystemExit("--json RECORDS.jsonl is required")
    threads = options["--threads"]
    marian = ["--marian-python", options["--marian-python"], "--marian-lr", options["--marian-lr"]]
    if "marian" in systems and subprocess.run([options["--marian-python"], "-c", "import pymarian"],
                                              capture_output=True).returncode:
        raise SystemExit(f"--systems marian: {options['--marian-python']} cannot import pymarian (pip install "
                         "pymarian in an environment of its own, and give its python as --marian-python)")
    torch_precision, timings = (None, None)
    if "torch" in systems:
        torch_precision, timings = torch_fastest_precision(argv, threads)
        print(f"torch: {torch_precision} is its faster precision here ({timings} s a tiny step)", file=sys.stderr)
    for minutes in budgets:
        ours_shape = "tiny"
        for system in systems:
            out = os.path.join(options["--out-dir"], f"{system}-{minutes:g}min")
            tmp = options["--json"] + ".part"
            if os.path.exists(tmp):
                os.remove(tmp)
            if system == "marian":         # the shape ours picked for this budget (tiny without ours)
                child = same_package("from transformer.bench.race_marian import main; sys.exit(main())")
                extra = [*marian, "--shape", ours_shape]
            else:
                child = same_package("from transformer.bench.quality import main; sys.exit(main())")
                extra = ["--engine", system, "--overwrite"]
                extra += ["--precision", torch_precision] if system == "torch" else []
            subprocess.run([sys.executable, "-c", child, *extra, *argv, "--threads", threads,
                            "--minutes", f"{minutes:g}", "--out", out, "--quiet", "--json", tmp], check=True)
            record = read_records([tmp])[-1]
            os.remove(tmp)
            record.update(system=system, budget_minutes=minutes, precision=record.get("precision"))
            if system == "torch":
                record["torch_step_seconds_by_precision"] = timings
            if system == "ours" and record.get("preset") in SHAPES:
                ours_shape = record["preset"]
            with open(options["--json"], "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("run", "table", "plot"):
        raise SystemExit(__doc__)
    verb, rest = argv[0], argv[1:]
    if verb == "run":
        return run(rest)
    if verb == "table":
        for row in table(read_records(rest)):
            print(json.dumps(row))
        return 0
    plot(read_records(rest[1:]), rest[0])
    print(f"plot written to {rest[0]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
