"""Fit the learning curves behind `train --preset auto` (transformer/training/sizing.py).

    python benchmarks/size_curves.py [--norm scale|layer] RECORDS.jsonl...    # the runs of ours on the Bible among them

Each record is a bench/quality.py run on the Bible corpus (its `preset`, or its sizes, name the
candidate). Only the runs of one normalisation are fitted, the default model's (`--norm scale`:
ScaleNorm + FixNorm, the default since 2026-12-05) unless `--norm layer` says LayerNorm's; a record
names its model's in `norm` (records written before that field are LayerNorm runs, the default
then). A run's quality at a given step does not depend on the CPU or the thread count, so
records from any machine serve. Every periodic evaluation from step MIN_STEP on and the run's
final greedy BLEU are points (steps, BLEU); each candidate is fitted as

    bleu(steps) = A - B * effective_steps(steps) ** -ALPHA

(sizing.effective_steps: a step of a repeated pass counts for less, by the candidate's REPEATS
constant, R*) with one ALPHA shared by all: for each ALPHA of a grid, each candidate measured to
OWN_REPEATS_PASSES passes or more takes the R* of a grid that fits its points best (least squares
for A and B at each), a candidate measured to fewer takes that of the most expensive one measured
further, and the ALPHA of the least total squared error wins. The constants are printed in the
form sizing.CURVES and sizing.REPEATS take, with each candidate's points and residuals (over all
its points, and over its last passes).

ALPHA's grid starts at MIN_ALPHA: on the Bible the fit goes lower (0.05, a curve logarithmic in
steps) when left free, and a curve that low promises a corpus of fresh pairs gains without a
bound that no run measured; the picks on the Bible are the same for every ALPHA from 0.2 to 0.35
(benchmarks/notes/2026-12-05-sizing-repeats.md).
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))   # this checkout's package

CORPUS = "bible"        # the runs fitted: ours on the Bible (records' "data" names the file or directory)
STEPS_PER_PASS = 468    # the Bible's training pairs in 2048-token batches (len(data.batches(0)) of a run on it)
MIN_STEP = 500          # the first few hundred steps are the unigram plateau, not the power law
MIN_ALPHA = 0.2
OWN_REPEATS_PASSES = 8  # a candidate measured to fewer passes has too few repeated ones to fit its R*
ALPHAS = np.linspace(MIN_ALPHA, 1.5, 131)
REPEATS_GRID = np.geomspace(2.0, 400.0, 80)     # R*, in passes; 400 is a curve that hardly bends on the Bible


def candidate_of(record):
    from transformer.config import PRESETS

    if record.get("candidate"):
        return record["candidate"]
    return record.get("preset") if record.get("preset") in PRESETS else None


def points_of(record):
    points = [(step, bleu) for _, step, bleu, *_ in record.get("curve") or [] if bleu is not None and step >= MIN_STEP]
    points.append((record["steps"], record["greedy"]["bleu"]))
    return points


def least_squares(points, alpha, repeats):
    """(A, B, squared error) of bleu = A - B * effective_steps(steps) ** -alpha over points."""
    from transformer.training.sizing import effective_steps

    steps, bleu = np.array(points, dtype=np.float64).T
    x = np.array([effective_steps(s, STEPS_PER_PASS, repeats) for s in steps]) ** -alpha
    design = np.stack([np.ones_like(x), -x], axis=1)
    (a, b), *_ = np.linalg.lstsq(design, bleu, rcond=None)
    return float(a), float(b), float(np.sum((design @ np.array([a, b]) - bleu) ** 2))


def fit(points_by_candidate, alphas=ALPHAS, repeats_grid=REPEATS_GRID):
    """(alpha, {candidate: (A, B)}, {candidate: R*}, total squared error) minimising the squared
    error over all points (the module's docstring says how R* is shared)."""
    from transformer.config import PRESETS

    cost = list(PRESETS)        # the presets' order: cheapest first
    own = [name for name, points in points_by_candidate.items()
           if max(s for s, _ in points) >= OWN_REPEATS_PASSES * STEPS_PER_PASS]
    if not own:
        raise ValueError(f"no candidate is measured to {OWN_REPEATS_PASSES} passes of the corpus: no R* can be fitted")
    best = None
    for alpha in alphas:
        repeats = {name: min(repeats_grid, key=lambda r: least_squares(points_by_candidate[name], alpha, r)[2])
                   for name in own}
        widest = max(own, key=cost.index)
        for name in points_by_candidate:
            repeats.setdefault(name, repeats[widest])
        constants, error = {}, 0.0
        for name, points in points_by_candidate.items():
            a, b, e = least_squares(points, alpha, repeats[name])
            constants[name] = (a, b)
            error += e
        if best is None or error < best[3]:
            best = (float(alpha), constants, {k: float(v) for k, v in repeats.items()}, error)
    return best


def norm_of(record):
    """The record's normalisation: its `norm` field, "layer" for records written before it existed."""
    return record.get("norm") or "layer"


def main(argv):
    norm = "scale"
    if argv[:1] == ["--norm"] and len(argv) > 1:
        norm, argv = argv[1], argv[2:]
    if norm not in ("scale", "layer") or not argv or any(a.startswith("--") for a in argv):
        raise SystemExit("usage: size_curves.py [--norm scale|layer] RECORDS.jsonl...")
    paths = argv
    points = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    record = json.loads(line)
                    name = candidate_of(record)
                    if (name and record.get("engine", "ours") == "ours" and record["data"].startswith(CORPUS)
                            and norm_of(record) == norm):
                        points.setdefault(name, []).extend(points_of(record))
    if not points:
        raise SystemExit(f"no run of ours on the {CORPUS} corpus with norm {norm!r} in {paths}")
    from transformer.training.sizing import effective_steps

    alpha, constants, repeats, error = fit(points)
    floor = "  (the grid's floor, MIN_ALPHA)" if alpha <= MIN_ALPHA else ""
    print(f"norm {norm}: ALPHA = {alpha:.2f}{floor}   (total squared error {error:.1f} over "
          f"{sum(map(len, points.values()))} points; {STEPS_PER_PASS} steps a pass)")
    for name, (a, b) in constants.items():
        steps = np.array([s for s, _ in points[name]], dtype=np.float64)
        curve = np.array([a - b * effective_steps(s, STEPS_PER_PASS, repeats[name]) ** -alpha for s in steps])
        residuals = np.array([bleu for _, bleu in points[name]]) - curve
        last = steps >= 0.7 * steps.max()
        print(f'    "{name}": ({a:.2f}, {b:.1f}),   REPEATS {repeats[name]:.1f}   # {len(points[name])} points, '
              f'residuals: RMS {np.sqrt(np.mean(residuals ** 2)):.2f}, largest {np.max(np.abs(residuals)):.2f}, '
              f'mean over the last 30% of steps {np.mean(residuals[last]):+.2f}; measured to step {int(steps.max())} '
              f'({steps.max() / STEPS_PER_PASS:.1f} passes)')
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
