"""Fit the learning curves behind `train --preset auto` (transformer/training/sizing.py).

    python benchmarks/size_curves.py RECORDS.jsonl...    # the runs of ours on the Bible among them

Each record is a bench/quality.py run on the Bible corpus (its `preset`, or its sizes, name the
candidate). A run's quality at a given step does not depend on the CPU or the thread count, so
records from any machine serve. Every periodic evaluation from step MIN_STEP on and the run's
final greedy BLEU are points (steps, BLEU); each candidate is fitted as

    bleu(steps) = A - B * steps ** -ALPHA

with one ALPHA shared by all (a grid, least squares for A and B at each), and the constants are
printed in the form sizing.CURVES takes, with each candidate's points and residuals.
"""
import json
import sys

import numpy as np

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


def main(paths):
    points = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    record = json.loads(line)
                    name = candidate_of(record)
                    if name and record.get("engine", "ours") == "ours" and record["data"].startswith(CORPUS):
                        points.setdefault(name, []).extend(points_of(record))
    alpha, constants, error = fit(points)
    print(f"ALPHA = {alpha:.2f}   (total squared error {error:.1f} over {sum(map(len, points.values()))} points)")
    for name, (a, b) in constants.items():
        residuals = np.array([bleu - (a - b * s ** -alpha) for s, bleu in points[name]])
        print(f'    "{name}": ({a:.2f}, {b:.1f}),   # {len(points[name])} points, residuals: RMS '
              f'{np.sqrt(np.mean(residuals ** 2)):.2f}, largest {np.max(np.abs(residuals)):.2f}')
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
