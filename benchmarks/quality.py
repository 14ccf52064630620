"""Translation quality for equal wall-clock time, ours vs the PyTorch reference (same pipeline).

    python benchmarks/quality.py --engine ours  --data ../shared/data/tatoeba-eng-hin.tsv \
        --src-col eng --tgt-col hin --preset small --threads 2 --minutes 10 --out runs/hin-ours
    python benchmarks/quality.py --engine torch --data ../shared/data/tatoeba-eng-hin.tsv \
        --src-col eng --tgt-col hin --preset small --threads 2 --minutes 10 --out runs/hin-torch

Each prints the final JSON line (steps, tokens, dev loss, BLEU, chrF) and sample translations.
"""
import runpy

if __name__ == "__main__":
    runpy.run_module("transformer.bench.quality", run_name="__main__")
