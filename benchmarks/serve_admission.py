"""What admitting the server's waves by memory costs: the scheduler with a budget (that does not
bind) against none, alternated round by round in one process, each round 300 one-sentence
requests submitted at once and timed to their last answer.

    python benchmarks/serve_admission.py --model runs/m --data ../shared/data/tatoeba-eng-hin.tsv \\
        --column eng --other-column hin --rounds 14 --json benchmarks/results/serve-admission-....jsonl
"""
import argparse
import json
import statistics
import time

import numpy as np

from train_runs import cpu_model
from transformer.checkpoint import load_for_inference
from transformer.data import read_pairs
from transformer.serve import load_models
from transformer.serve.scheduler import Scheduler


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True, help="tab-separated pairs whose --column is the source")
    parser.add_argument("--column", default="0", help="the source column (its name or index)")
    parser.add_argument("--other-column", default="1", help="any other column of the file")
    parser.add_argument("--sentences", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=14)
    parser.add_argument("--json")
    args = parser.parse_args()
    served = load_models([args.model], load=load_for_inference)
    name = next(iter(served))
    sources = [s for s, _ in read_pairs(args.data, args.column, args.other_column)[0]]
    rng = np.random.default_rng(0)
    texts = [sources[i] for i in rng.choice(len(sources), args.sentences, replace=False)]
    times = {"none": [], "budget": []}
    for r in range(args.rounds):
        order = [("none", None), ("budget", 1 << 40)]
        for variant, memory in order if r % 2 == 0 else order[::-1]:
            scheduler = Scheduler(served, memory=memory)
            started = time.perf_counter()
            futures = [scheduler.submit(name, [text], served[name].options()) for text in texts]
            for future in futures:
                future.result(300)
            times[variant].append(time.perf_counter() - started)
            scheduler.stop()
    record = {"bench": "serve_admission", "cpu": cpu_model(), "sentences": len(texts), "rounds": args.rounds,
              "s_none": [round(t, 3) for t in times["none"]], "s_budget": [round(t, 3) for t in times["budget"]],
              "none_over_budget_paired_median": round(statistics.median(
                  a / b for a, b in zip(times["none"], times["budget"])), 3)}
    print(json.dumps(record))
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
