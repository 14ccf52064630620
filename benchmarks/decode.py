"""Decoding tokens/s: ours (KV cache) vs PyTorch nn.Transformer (prefix re-run) and CTranslate2.

    python benchmarks/decode.py [--threads 1,2] [--configs tiny,base] [--beams 1,4] [--precision fp32|bf16|int8]

One JSON line per (config, threads, beam) on stdout; CTranslate2 is included when installed
(pip install ctranslate2). --precision bf16|int8: ours at that precision and at fp32 against
CTranslate2 at the same compute type (PyTorch left out).
"""
import runpy

if __name__ == "__main__":
    runpy.run_module("transformer.bench.decode", run_name="__main__")
