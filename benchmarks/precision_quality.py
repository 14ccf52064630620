"""BLEU/chrF of one trained model decoded in fp32, bf16 and int8 on its held-out split.

    python benchmarks/precision_quality.py --model runs/spa --data ../shared/data/bible-eng-spa.tsv.gz \
        --src-col eng --tgt-col spa --threads 2 --json benchmarks/results/precision-quality.jsonl
"""
import runpy

if __name__ == "__main__":
    runpy.run_module("transformer.bench.precision_quality", run_name="__main__")
