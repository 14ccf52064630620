"""MarianMT at OPUS-MT's size: decoding tokens/s (ours vs CTranslate2 vs transformers, fp32 and
int8) and fine-tuning tokens/s (ours vs transformers), same run.

    python benchmarks/marian.py [--threads 1,2] [--quick] [--config opus|tiny] [--json FILE]

One JSON line per measurement on stdout (needs torch, transformers, sentencepiece and
ctranslate2); --quick is a smoke run of a couple of minutes (16 new tokens, one timed repeat).
"""
import runpy

if __name__ == "__main__":
    runpy.run_module("transformer.bench.marian", run_name="__main__")
