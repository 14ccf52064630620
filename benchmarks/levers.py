"""Recipe levers at equal steps, several seeds, with a paired bootstrap on the held-out pairs
(issue 57, item 5).

Each (lever, seed) is `transformer train --data DATA --preset P --max-steps N --threads 1 --seed S`
plus the lever's flags, pinned to one core, as many runs at a time as there are cores (the
kernels give the same bits at any thread count and under any load, so a run's result does not
depend on what shares the machine; its time does, and is reported only as the ratio of the
lever's seconds a step to the baseline's). Then every model translates the held-out split that
training kept back (greedy and beam 4), and for each lever against the baseline:

- the BLEU and chrF of every seed, and the mean over seeds;
- a paired bootstrap over the held-out sentences (1,000 resamples, the same resample for every
  run): the difference of the means over seeds (lever - baseline), its 95% interval, and the share
  of resamples the lever wins;
- the verdict: `wins` only when the interval's lower end is above 0 and the mean gain is larger
  than the baseline's own spread between seeds (max - min); `loses` symmetrically; else `level`.

    python benchmarks/levers.py --data ../shared/data/tatoeba-eng-hin.tsv --src-col eng --tgt-col hin \\
        --steps 2500 --seeds 0,1,2 --out /tmp/levers --json benchmarks/results/levers-....jsonl

A lever whose step costs more (BPE-dropout's segmentations are drawn in Python and are longer)
is measured at equal steps here: it cannot win at equal time unless it wins at equal steps, and
its time ratio says by how much its steps are dearer.
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

LEVERS = {
    "baseline": [],
    "bpe-dropout-0.1": ["--bpe-dropout", "0.1"],
    "word-dropout-0.1": ["--word-dropout", "0.1"],
    "site-dropout-0.1": ["--attention-dropout", "0.1", "--activation-dropout", "0.1"],
    # where the rule's residual dropout is 0.1 (the Bible's ten minutes), the line above is the
    # defaults themselves (the sites follow --dropout): there the question is the sites without it
    "site-dropout-0": ["--attention-dropout", "0", "--activation-dropout", "0"],
    "curriculum-0.2": ["--curriculum", "0.2"],
    # "Transformers without Tears" (Nguyen & Salazar 2019): ScaleNorm in every norm's place and
    # FixNorm's unit rows for the tables (pre-LN, as a run on data has by default)
    "scale-fix-norm": ["--norm", "scale", "--fix-norm"],
}


def train_command(args, lever, seed, out):
    cmd = [sys.executable, "-m", "transformer", "train", "--data", args.data, "--preset", args.preset,
           "--max-steps", str(args.steps), "--threads", "1", "--seed", str(seed), "--eval-every", "0",
           "--out", out]
    if args.src_col:
        cmd += ["--src-col", args.src_col, "--tgt-col", args.tgt_col]
    return cmd + LEVERS[lever]


def run_all(args, jobs):
    """Every (lever, seed) of `jobs` trained, `cores` at a time, each pinned to its core."""
    cores = list(range(os.cpu_count() or 1))
    running = {}
    pending = list(jobs)
    while pending or running:
        free = [c for c in cores if c not in running]
        while pending and free:
            lever, seed = pending.pop(0)
            core = free.pop(0)
            out = os.path.join(args.out, f"{lever}-s{seed}")
            if os.path.exists(os.path.join(out, "result.json")):
                continue
            shutil.rmtree(out, ignore_errors=True)       # a run cut short: started again
            os.makedirs(out)
            log = open(os.path.join(out, "train.log"), "w")
            proc = subprocess.Popen(["taskset", "-c", str(core)] + train_command(args, lever, seed, out),
                                    stdout=subprocess.PIPE, stderr=log, text=True, cwd=args.cwd)
            running[core] = (proc, lever, seed, out, log, time.monotonic())
            print(f"started {lever} seed {seed} on core {core}", file=sys.stderr, flush=True)
        for core, (proc, lever, seed, out, log, t0) in list(running.items()):
            if proc.poll() is None:
                continue
            stdout = proc.stdout.read()
            log.close()
            del running[core]
            with open(os.path.join(out, "train.out"), "w") as f:
                f.write(stdout)
            if proc.returncode != 0:
                for other, *_ in running.values():
                    other.kill()
                raise SystemExit(f"{lever} seed {seed} failed ({proc.returncode}): see {out}/train.log")
            # the run's record: its JSON line (sample translations follow it)
            final = json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])
            with open(os.path.join(out, "result.json"), "w") as f:
                json.dump({"lever": lever, "seed": seed, "train": final, "wall_s": time.monotonic() - t0}, f)
            print(f"done {lever} seed {seed}: {final.get('step')} steps, {final.get('seconds')} s",
                  file=sys.stderr, flush=True)
        time.sleep(1)


def translate_dev(args, out):
    """Greedy and beam-4 translations of the held-out split this run kept back, cached in out."""
    path = os.path.join(out, "dev.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    import transformer as T
    from transformer.checkpoint import load_for_inference
    from transformer.config import TRAIN_DEFAULTS
    from transformer.data import read_pairs, split_pairs
    from transformer.translation import translate_texts
    T.set_num_threads(os.cpu_count() or 1)
    model, src_tok, tgt_tok = load_for_inference(out)
    pairs, _ = read_pairs(args.data, args.src_col, args.tgt_col)
    _, dev = split_pairs(pairs, dev_fraction=TRAIN_DEFAULTS["dev_fraction"], max_dev=TRAIN_DEFAULTS["dev_max"])
    sources, refs = [s for s, _ in dev], [t for _, t in dev]
    result = {"refs": refs, "greedy": translate_texts(model, src_tok, tgt_tok, sources, beam=1),
              "beam4": translate_texts(model, src_tok, tgt_tok, sources, beam=4)}
    with open(path, "w") as f:
        json.dump(result, f)
    return result


class Stats:
    """Per-sentence sufficient statistics of BLEU and chrF (sacrebleu's), so that a resample's
    corpus score is a sum and a formula, not a rescoring."""

    def __init__(self, hyps, refs):
        from sacrebleu.metrics import BLEU, CHRF
        self.bleu, self.chrf = BLEU(), CHRF()
        # [sentences, statistics] arrays: a resample's sums are one indexed sum
        self.b = np.asarray(self.bleu._extract_corpus_statistics(hyps, [refs]))
        self.c = np.asarray(self.chrf._extract_corpus_statistics(hyps, [refs]))

    def bleu_at(self, idx):
        return self.bleu._compute_score_from_stats(self.b[idx].sum(0).tolist()).score

    def score(self, idx):
        """(BLEU, chrF) of the sentences idx (with repeats)."""
        return self.bleu_at(idx), self.chrf._compute_score_from_stats(self.c[idx].sum(0).tolist()).score


def compare(runs, lever, search, resamples, rng_seed=12345):
    """The bootstrap of lever against baseline for one search: a record."""
    base = [runs[("baseline", s)][search] for s in sorted(s for l, s in runs if l == "baseline")]
    other = [runs[(lever, s)][search] for s in sorted(s for l, s in runs if l == lever)]
    n = len(base[0].b)
    full = list(range(n))
    per_seed = {"baseline": [st.score(full) for st in base], lever: [st.score(full) for st in other]}
    rng = random.Random(rng_seed)
    diffs = []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        diffs.append(statistics.mean(st.bleu_at(idx) for st in other) - statistics.mean(st.bleu_at(idx) for st in base))
    diffs.sort()
    lo, hi = diffs[int(0.025 * resamples)], diffs[int(0.975 * resamples) - 1]
    mean_base = statistics.mean(b for b, _ in per_seed["baseline"])
    mean_other = statistics.mean(b for b, _ in per_seed[lever])
    gain = mean_other - mean_base
    spread = max(b for b, _ in per_seed["baseline"]) - min(b for b, _ in per_seed["baseline"])
    verdict = "wins" if lo > 0 and gain > spread else "loses" if hi < 0 and -gain > spread else "level"
    return {"lever": lever, "search": search, "sentences": n, "seeds": len(other),
            "bleu_per_seed": [round(b, 2) for b, _ in per_seed[lever]],
            "chrf_per_seed": [round(c, 2) for _, c in per_seed[lever]],
            "baseline_bleu_per_seed": [round(b, 2) for b, _ in per_seed["baseline"]],
            "baseline_chrf_per_seed": [round(c, 2) for _, c in per_seed["baseline"]],
            "bleu_gain": round(gain, 2), "bootstrap_95": [round(lo, 2), round(hi, 2)],
            "wins_share": round(sum(d > 0 for d in diffs) / resamples, 3),
            "baseline_seed_spread": round(spread, 2), "verdict": verdict}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--src-col")
    parser.add_argument("--tgt-col")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--levers", default=",".join(LEVERS))
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--out", required=True, help="a folder for the runs (kept: a rerun reuses finished runs)")
    parser.add_argument("--cwd", default=os.path.join(HERE, ".."), help="the checkout whose package trains")
    parser.add_argument("--json")
    args = parser.parse_args()
    args.data = os.path.abspath(args.data)
    seeds = [int(s) for s in args.seeds.split(",")]
    levers = args.levers.split(",")
    if "baseline" not in levers:
        levers.insert(0, "baseline")
    jobs = [(lever, seed) for seed in seeds for lever in levers]
    try:
        run_all(args, jobs)
    except BaseException:
        subprocess.run(["pkill", "-f", f"out {os.path.abspath(args.out)}/"])   # no run outlives this one
        raise

    from transformer.bench.harness import cpu_model
    runs, times, dev_loss = {}, {}, {}
    for lever, seed in jobs:
        out = os.path.join(args.out, f"{lever}-s{seed}")
        dev = translate_dev(args, out)
        runs[(lever, seed)] = {search: Stats(dev[search], dev["refs"]) for search in ("greedy", "beam4")}
        with open(os.path.join(out, "result.json")) as f:
            result = json.load(f)
        times[(lever, seed)] = result["train"]["seconds"] / max(result["train"]["step"], 1)
        dev_loss[(lever, seed)] = result["train"].get("dev_loss")
    header = {"bench": "levers", "data": os.path.basename(args.data), "preset": args.preset, "steps": args.steps,
              "seeds": seeds, "cpu": cpu_model(), "how": "--max-steps, one thread pinned to one core, "
              "two runs at a time on two cores; held-out split of training's defaults"}
    records = []
    for lever in levers:
        if lever == "baseline":
            continue
        ratio = statistics.median(times[(lever, s)] / times[("baseline", s)] for s in seeds)
        for search in ("greedy", "beam4"):
            record = {**header, **compare(runs, lever, search, args.resamples),
                      "step_time_vs_baseline": round(ratio, 3), "flags": LEVERS[lever],
                      # training's own dev loss (label-smoothed cross-entropy on the held-out pairs)
                      "dev_loss_per_seed": [dev_loss[(lever, s)] for s in seeds],
                      "baseline_dev_loss_per_seed": [dev_loss[("baseline", s)] for s in seeds]}
            records.append(record)
            print(json.dumps(record), flush=True)
    if args.json:
        with open(args.json, "a") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
