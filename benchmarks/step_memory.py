"""What a training step holds against the floor the trainer checks (transformer/training/memory.py).

Each shape runs in a fresh process: the batch arrays made, then the model, Adam and two steps
(zeroing, forward_backward, Adam); the growth of the peak resident memory (VmHWM) over those steps is set
beside memory.step_floor for the same model and batch (uniform lengths: every row as long as the
widest). The floor must stay below every growth, so that the trainer refuses no run that fits;
its share of the growth says how far below.

    python benchmarks/step_memory.py --json benchmarks/results/step-memory-....jsonl

A shape is D_MODEL,LAYERS,VOCAB,ROWS,LENGTH,PRECISION,THREADS (LAYERS on each side, d_ff 4 x d_model).
"""
import argparse
import json
import os
import subprocess
import sys

from train_runs import cpu_model

SHAPES = ["128,2,4000,256,64,fp32,1", "128,2,4000,256,64,bf16,1", "128,2,4000,256,64,fp32,2",
          "128,2,4000,256,64,bf16,2", "128,2,4000,512,16,fp32,2", "256,3,8000,128,32,bf16,2",
          "512,6,8000,64,64,fp32,2", "512,6,8000,64,64,bf16,2", "128,2,32000,64,64,bf16,2"]

PROBE = r'''
import json, sys
import numpy as np
import transformer as T
from transformer.training.memory import parameter_count, step_floor


def peak():
    """Bytes of this process's peak resident memory: VmHWM, its own (ru_maxrss keeps the parent's
    peak across exec)."""
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM")).split()[1]) * 1024
d, layers, vocab, rows, length, precision, threads = sys.argv[1].split(",")
d, layers, vocab, rows, length, threads = map(int, (d, layers, vocab, rows, length, threads))
T.set_num_threads(threads)
cfg = T.ModelConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d, n_heads=max(1, d // 64), d_ff=4 * d,
                    n_encoder_layers=layers, n_decoder_layers=layers, max_len=length + 2, dropout=0.1)
rng = np.random.default_rng(0)
src, tgt_in, tgt_out = (rng.integers(4, vocab, (rows, length)) for _ in range(3))
before = peak()
model = T.Seq2SeqTransformer(cfg, seed=0)
adam = T.Adam(model)
for _ in range(2):
    model.zero_grad()
    model.forward_backward(src, tgt_in, tgt_out, precision=precision)
    adam.step()
grew = peak() - before
floor = step_floor(cfg, parameter_count(cfg), rows, length, length)
print(json.dumps({"parameters": parameter_count(cfg), "isa": T.build_info()["isa"], "grew_mb": round(grew / 2**20),
                  "floor_mb": round(floor / 2**20), "floor_share": round(floor / grew, 3)}))
'''


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", action="append", help="D_MODEL,LAYERS,VOCAB,ROWS,LENGTH,PRECISION,THREADS")
    parser.add_argument("--json", help="also append the records to this file")
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cpu, records = cpu_model(), []
    for shape in args.shape or SHAPES:
        proc = subprocess.run([sys.executable, "-c", PROBE, shape], capture_output=True, text=True, env=env)
        if proc.returncode:
            sys.exit(f"{shape}: {proc.stderr.strip()}")
        d, layers, vocab, rows, length, precision, threads = shape.split(",")
        record = {"bench": "step_memory", "cpu": cpu, "d_model": int(d), "layers": f"{layers}+{layers}",
                  "vocab": int(vocab), "rows": int(rows), "length": int(length), "precision": precision,
                  "threads": int(threads), **json.loads(proc.stdout)}
        print(json.dumps(record), flush=True)
        records.append(record)
    shares = [r["floor_share"] for r in records]
    print(f"floor / growth: {min(shares):.2f}-{max(shares):.2f} over {len(shares)} shapes", flush=True)
    if args.json:
        with open(args.json, "a") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
