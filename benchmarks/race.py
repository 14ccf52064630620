"""The time-to-quality race (transformer/bench/race.py): ours with its defaults against PyTorch
through the same pipeline, at 2, 5, 10 and 30 minutes, on the same corpus and cores.

    python benchmarks/race.py run --data ../shared/data/bible-eng-spa.tsv.gz --src-col eng \
        --tgt-col spa --threads 2 --budgets 2,5,10,30 --json race.jsonl
    python benchmarks/race.py table race.jsonl
    python benchmarks/race.py plot race.png race.jsonl
"""
import runpy

if __name__ == "__main__":
    runpy.run_module("transformer.bench.race", run_name="__main__")
