"""What encoding a batch holds and takes, build against build and against PyTorch: the memory
the model's workspace keeps after `encode` (the server's waves and `translate` encode through it),
the growth of the process's peak resident memory (VmHWM) over the first encode, and the median
time of an encode; PyTorch's nn.TransformerEncoder of the same weights under inference_mode is the
reference (its peak growth and time).

Each (variant, shape) runs in a fresh process; rounds alternate the variants' order.

    python benchmarks/encode_memory.py --variant before=/path/to/old/checkout --variant after=. \\
        --rounds 3 --json benchmarks/results/encode-memory-....jsonl

A shape is D_MODEL,LAYERS,ROWS,LENGTH,PRECISION,THREADS (d_ff 4 x d_model, heads d_model / 64,
a vocabulary of 8,000). A variant is NAME=DIR: the checkout whose `transformer` package (with its
compiled extension) is imported; "torch" is the reference.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from train_runs import cpu_model, parse_variant

SHAPES = ["512,6,64,100,fp32,2", "512,6,16,30,fp32,2", "512,6,64,100,int8,2", "128,2,64,100,fp32,2"]

PROBE = r'''
import json, sys, time
import numpy as np
import transformer as T


def peak():
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM")).split()[1]) * 1024


d, layers, rows, length, precision, threads = sys.argv[1].split(",")
d, layers, rows, length, threads = map(int, (d, layers, rows, length, threads))
reference = sys.argv[2] == "torch"
T.set_num_threads(threads)
cfg = T.ModelConfig(src_vocab_size=8000, tgt_vocab_size=8000, d_model=d, n_heads=max(1, d // 64), d_ff=4 * d,
                    n_encoder_layers=layers, n_decoder_layers=layers, max_len=length + 2, dropout=0.0)
model = T.Seq2SeqTransformer(cfg, seed=0)
src = np.random.default_rng(0).integers(4, 8000, (rows, length))
if reference:
    import torch
    from transformer.torch_compat import to_torch
    torch.set_num_threads(threads)
    tm = to_torch(model).eval()
    ids = torch.from_numpy(src)

    def encode():
        with torch.inference_mode():
            x = torch.nn.functional.embedding(ids, tm.src_embed.weight) * tm.scale + tm.pe[:length]
            return tm.transformer.encoder(x, src_key_padding_mask=ids == cfg.pad_id)
else:
    def encode():
        return model.encode(src, precision=precision)
before = peak()
encode()
grew = peak() - before
times = []
for _ in range(5):
    started = time.perf_counter()
    encode()
    times.append(time.perf_counter() - started)
kept = None if reference else model.ws.nbytes()
print(json.dumps({"grew_mb": round(grew / 2**20, 1), "ms": round(1e3 * float(np.median(times)), 2),
                  "workspace_mb": None if kept is None else round(kept / 2**20, 1),
                  "workspace_floats_a_token": None if kept is None else round(kept / 4 / d / rows / length, 1)}))
'''


def run(where, shape, reference):
    env = dict(os.environ, PYTHONPATH=where)
    out = subprocess.run([sys.executable, "-c", PROBE, shape, "torch" if reference else "ours"], env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", action="append", help="NAME=DIR (default: this checkout, as 'this')")
    parser.add_argument("--shape", action="append", help="D_MODEL,LAYERS,ROWS,LENGTH,PRECISION,THREADS")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="also write the records to this file")
    args = parser.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    variants = [(name, where) for name, where, _ in map(parse_variant, args.variant or [f"this={here}"])]
    variants.append(("torch", variants[-1][1]))
    records = []
    for shape in args.shape or SHAPES:
        seen = {name: [] for name, _ in variants}
        for r in range(args.rounds):
            for name, where in variants if r % 2 == 0 else variants[::-1]:
                if name == "torch" and shape.split(",")[4] != "fp32":
                    continue
                seen[name].append(run(where, shape, name == "torch"))
        for name, runs in seen.items():
            if not runs:
                continue
            times = sorted(x["ms"] for x in runs)
            record = {"shape": shape, "variant": name, "cpu": cpu_model(), "runs": len(runs),
                      "ms_median": statistics.median(times), "ms_spread": [times[0], times[-1]],
                      "grew_mb_median": statistics.median(x["grew_mb"] for x in runs),
                      "workspace_mb": runs[0]["workspace_mb"],
                      "workspace_floats_a_token": runs[0]["workspace_floats_a_token"]}
            torch_ms = statistics.median(x["ms"] for x in seen["torch"]) if seen["torch"] else None
            if torch_ms and name != "torch":
                record["speed_vs_torch"] = round(torch_ms / record["ms_median"], 3)
            records.append(record)
            print(json.dumps(record), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)


if __name__ == "__main__":
    main()
