"""Fit the learning curves behind `train --preset auto` (transformer/training/sizing.py).

    python benchmarks/size_curves.py [--norm scale|layer] RECORDS.jsonl...    # the runs of ours on the Bible among them

Each record is a bench/quality.py run on the Bible corpus (its `preset`, or its sizes, name the
candidate). Only the runs of one normalisation are fitted, the default model's (`--norm scale`:
ScaleNorm + FixNorm, the default since 2026-12-05) unless `--norm layer` says LayerNorm's; a record
names its model's in `norm` (records written before that field are LayerNorm runs, the default
then). A run's quality at a given step does not depend on the CPU or the thread count, so
records from any machine serve. Every periodic evaluation from step MIN_STEP on and the run's
final greedy BLEU are points (steps, BLEU); each candidate is fitted as

    bleu(steps) = A - B * steps ** -ALPHA

with one ALPHA shared by all (a grid, least squares for A and B at each), and the constants are
printed in the form sizing.CURVES takes, with each candidate's points and residuals.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))   # this checkout's package

CORPUS = "bible"        # the runs fitted: ours on the Bible (records' "data" names the file or directory)
MIN_STEP = 500          # the first few hundred steps are the unigram plateau, not the power law


def candidate_of(record):
    from transformer.config import PRESETS

    if record.get("candidate"):
        return record["candidate"]
    return record.get("preset") if record.get("preset") in PRESETS else None


def points_of(record):
    points = [(step, bleu) for _, step, bleu, *_ in record.get("curve") or [] if bleu is not None and step >= MIN_STEP]
    points.append((record["steps"], record["greedy"]["bleu"]))
    return points


def fit(points_by_candidate, alphas=np.linspace(0.2, 1.5, 131)):
    """(alpha, {candidate: (A, B)}, total squared error) minimising the squared error over all points."""
    best = None
    for alpha in alphas:
        constants, error = {}, 0.0
        for name, points in points_by_candidate.items():
            steps, bleu = np.array(points, dtype=np.float64).T
            design = np.stack([np.ones_like(steps), -steps ** -alpha], axis=1)
            (a, b), *_ = np.linalg.lstsq(design, bleu, rcond=None)
            constants[name] = (float(a), float(b))
            error += float(np.sum((design @ np.array([a, b]) - bleu) ** 2))
        if best is None or error < best[2]:
            best = (float(alpha), constants, error)
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
    alpha, constants, error = fit(points)
    print(f"norm {norm}: ALPHA = {alpha:.2f}   (total squared error {error:.1f} over {sum(map(len, points.values()))} points)")
    for name, (a, b) in constants.items():
        residuals = np.array([bleu - (a - b * s ** -alpha) for s, bleu in points[name]])
        print(f'    "{name}": ({a:.2f}, {b:.1f}),   # {len(points[name])} points, residuals: RMS '
              f'{np.sqrt(np.mean(residuals ** 2)):.2f}, largest {np.max(np.abs(residuals)):.2f}; '
              f'measured to step {max(s for s, _ in points[name])}')
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
