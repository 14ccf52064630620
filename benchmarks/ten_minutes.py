"""The defaults' ten minutes, two builds against each other (issue 57's measure): final BLEU over
seeds with a paired bootstrap on the held-out pairs, and how much sooner one build reaches the
other's ten-minute BLEU.

    python benchmarks/ten_minutes.py run --variant base=/path/to/old/checkout --variant new=. \\
        --data ../shared/data/bible-eng-spa.tsv.gz --src-col eng --tgt-col spa --seeds 0,1,2 --out DIR
    python benchmarks/ten_minutes.py report --variant base=... --variant new=. --data ... --out DIR \\
        [--json RECORDS.jsonl]

`run`: for each seed, each variant in turn (A, B, A, B, ...: a drift of the machine's speed hits
both alike) runs `benchmarks/quality.py --engine ours --minutes M --eval-every 100 --seed S` in
its own checkout (the process runs there, so that checkout's package trains): `transformer
train`'s defaults, what a user gets, with dev BLEU every 100 steps (not counted as training
time). A finished run is kept; a rerun does the rest.

`report`, for every variant against the first:
- steps and final BLEU (greedy and beam 4, the held-out split training kept back) per seed;
- a paired bootstrap over the held-out sentences (levers.py's: every run's model translates the
  split again, 1,000 resamples, the same for every run): the gain of the mean over seeds, its 95%
  interval and the share of resamples won;
- sooner: when, in training seconds, the variant's periodic dev BLEU first reaches the first
  variant's last periodic dev BLEU of the same seed (interpolated), and the first variant's
  training seconds over that: 1.5 means it got there in two thirds of the time. The periodic
  evaluations score --eval-limit sentences; the curve is the run's own, so its schedule is the
  full budget's (a shorter budget's run would decay its learning rate sooner).
"""
import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

from levers import Stats, compare, translate_dev  # noqa: E402

from transformer.bench.quality import reached_at, read_records, write_record  # noqa: E402


def parse_variant(text):
    name, _, where = text.partition("=")
    return name, os.path.abspath(where or ".")


def check_variants(variants):
    """At least two, with distinct names (each names its runs' folders), and "baseline" only for the
    first (levers.compare's name for the one to beat)."""
    names = [name for name, _ in variants]
    if len(names) < 2:
        raise SystemExit("--variant: give at least two (the first is the one to beat)")
    if len(set(names)) != len(names) or "baseline" in names[1:] or not all(names):
        raise SystemExit(f"--variant: names must be distinct, non-empty, and 'baseline' only for the first; got {names}")


def run_dir(args, name, seed):
    return os.path.join(args.out, f"{name}-s{seed}")


def record_path(args, name, seed):
    return run_dir(args, name, seed) + ".jsonl"


def run(args, variants, seeds):
    for seed in seeds:
        for name, checkout in variants:
            if os.path.exists(record_path(args, name, seed)):
                continue
            cmd = [sys.executable, "-m", "transformer.bench.quality", "--engine", "ours", "--data", args.data,
                   "--threads", str(args.threads), "--minutes", str(args.minutes), "--eval-every", "100",
                   "--seed", str(seed), "--out", run_dir(args, name, seed), "--overwrite",
                   "--json", record_path(args, name, seed) + ".part"]
            if args.src_col:
                cmd += ["--src-col", args.src_col, "--tgt-col", args.tgt_col]
            print(f"{name} seed {seed}", file=sys.stderr, flush=True)
            with open(run_dir(args, name, seed) + ".log", "w") as log:
                done = subprocess.run(cmd, cwd=checkout, stdout=log, stderr=subprocess.STDOUT)
            if done.returncode != 0:
                raise SystemExit(f"{name} seed {seed} failed: see {run_dir(args, name, seed)}.log")
            os.replace(record_path(args, name, seed) + ".part", record_path(args, name, seed))


def sooner(first, other):
    """(seconds the other run needed to reach the first's last periodic dev BLEU, the ratio)."""
    points = [p for p in first["curve"] if p[2] is not None]
    if not points:
        return None, None
    end, target = points[-1][0], points[-1][2]
    when = reached_at(other["curve"], target)
    return when, (end / when if when else None)


def report(args, variants, seeds):
    from transformer.bench.harness import cpu_model
    records = {(name, s): read_records([record_path(args, name, s)])[-1] for name, _ in variants for s in seeds}
    # levers.compare reads the first variant as "baseline"
    first = variants[0][0]
    runs = {}
    for name, _ in variants:
        for s in seeds:
            dev = translate_dev(args, run_dir(args, name, s))
            runs[("baseline" if name == first else name, s)] = {
                search: Stats(dev[search], dev["refs"]) for search in ("greedy", "beam4")}
    for name, _ in variants[1:]:
        when = [sooner(records[(first, s)], records[(name, s)]) for s in seeds]
        ratios = [r for _, r in when if r is not None]
        head = {"bench": "ten_minutes", "variant": name, "against": first, "data": os.path.basename(args.data),
                "minutes": args.minutes, "threads": args.threads, "seeds": seeds, "cpu": cpu_model(),
                "steps": [records[(name, s)]["steps"] for s in seeds],
                "steps_against": [records[(first, s)]["steps"] for s in seeds],
                "preset": [records[(name, s)].get("size") or records[(name, s)].get("preset") for s in seeds],
                "reached_at_seconds": [None if w is None else round(w, 1) for w, _ in when],
                "sooner": [None if r is None else round(r, 3) for _, r in when],
                "sooner_median": round(statistics.median(ratios), 3) if len(ratios) == len(seeds) else None}
        for search in ("greedy", "beam4"):
            row = {**head, **compare(runs, name, search, args.resamples)}
            row.pop("lever", None)
            write_record(row, args.json)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["run", "report"])
    parser.add_argument("--variant", action="append", required=True, help="NAME=CHECKOUT (the first: the one to beat)")
    parser.add_argument("--data", required=True)
    parser.add_argument("--src-col")
    parser.add_argument("--tgt-col")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--out", required=True, help="a folder for the runs (kept: a rerun reuses finished runs)")
    parser.add_argument("--json")
    args = parser.parse_args()
    args.data, args.out = os.path.abspath(args.data), os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    variants = [parse_variant(v) for v in args.variant]
    seeds = [int(s) for s in args.seeds.split(",")]
    check_variants(variants)
    (run if args.what == "run" else report)(args, variants, seeds)


if __name__ == "__main__":
    main()
