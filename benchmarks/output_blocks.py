"""The training pass's output projection and loss over blocks of rows (transformer/layers.py:
output_loss), against the same pass over the whole batch at once, on this CPU: one JSON line per
(rows, precision) with the median milliseconds of each, timed round-robin in one process
(bench/gemm.py's _time_interleaved: a machine whose speed drifts hits both alike).

    python benchmarks/output_blocks.py [--threads 2] [--rows 1024,2048,4096] [--vocab 4000]
        [--d-model 128] [--repeats 40]

The pass is, by default, a tiny model's (d_model 128) over `rows` target positions and a 4,000-word
vocabulary: the product, the bias, softmax and cross-entropy, and the two backward products and the
bias gradient. "one": OUTPUT_BLOCK_BYTES too large to block; "blocks": its default.
"""
import argparse
import json

import numpy as np

import transformer as T
from transformer import layers
from transformer.bench.gemm import _time_interleaved
from transformer.bench.harness import cpu_model
from transformer.layers import Linear, Workspace, output_loss


def measure(rows, vocab, d_model, precision, repeats, rng):
    w = (rng.standard_normal((vocab, d_model)) * 0.05).astype(np.float32)
    b = np.zeros(vocab, np.float32)
    ws = Workspace()
    ws.bf16 = precision == "bf16"
    generator = Linear(w, b, np.zeros_like(w), np.zeros_like(b), ws, "generator.weight")
    h = rng.standard_normal((rows, d_model)).astype(np.float32)
    dh = np.zeros_like(h)
    targets = rng.integers(3, vocab, rows).astype(np.int64)
    default = layers.OUTPUT_BLOCK_BYTES

    def run(block_bytes):
        def call():
            layers.OUTPUT_BLOCK_BYTES = block_bytes
            output_loss(generator, h, targets, 0, 0.1, 1.0, dh, ws)
        return call

    try:
        one, blocks = (t * 1e3 for t in _time_interleaved([run(1 << 50), run(default)], repeats))
    finally:
        layers.OUTPUT_BLOCK_BYTES = default
    return {"bench": "output_blocks", "cpu": cpu_model(), "threads": T.get_num_threads(), "precision": precision,
            "rows": rows, "vocab": vocab, "d_model": d_model,
            "rows_per_block": layers.output_rows_per_block(rows, d_model, vocab),
            "one_block_ms": round(one, 3), "blocks_ms": round(blocks, 3), "ratio": round(one / blocks, 3),
            "repeats": repeats}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1024,2048,4096")
    parser.add_argument("--vocab", type=int, default=4000)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args(argv)
    T.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    for rows in (int(r) for r in args.rows.split(",")):
        for precision in ("bf16", "fp32"):
            print(json.dumps(measure(rows, args.vocab, args.d_model, precision, args.repeats, rng)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
