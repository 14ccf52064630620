"""Where decoding's time goes at each thread count: the encoder and the step loop timed apart.

    python benchmarks/decode_threads.py [--threads 1,2,4,8,16] [--configs tiny,base]
                                        [--precisions int8,fp32] [--repeats 5]

Ours alone (no other engine in the process or the machine), greedy, the decode bench's models and
batches (transformer/bench/decode.py: random weights, every sentence 64 tokens). For each
(config, precision, threads): the median seconds of the encoder alone (what greedy_decode runs
before its first step, on the same prepared weights) and of the whole greedy decode, each after
SETTLE_S of sleep; the step loop is their difference. With `groups`: the blocks of rows each step
is split into at that count (transformer/decoding.py, step_groups). One JSON line each.

Written for the 16-core Xeon, where ours gets slower from 8 to 16 threads even with the same
blocks a step (benchmarks/README.md, "The 16-core Xeon again"): this tells the encoder's share of
that loss from the steps'.
"""
import argparse
import json
import os
import statistics
import sys
import time

import transformer as T
from transformer import decoding
from transformer.bench import decode as bench


def _seconds(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        time.sleep(bench.SETTLE_S)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), [min(times), max(times)]


def measure(name, precision, threads, repeats):
    model, src = bench._model(name)
    T.set_num_threads(threads)
    decode = lambda: model.greedy_decode(src, max_len=bench.STEPS, min_len=bench.STEPS, precision=precision)
    total_s, total_spread = _seconds(decode, repeats)
    workspace = decoding._lend_workspace(model)        # the prepared weights the decodes used
    try:
        prepared = decoding._prepared(model, workspace)
        encoder_s, encoder_spread = _seconds(lambda: model._encode(src, precision, prepared), repeats)
    finally:
        decoding._return_workspace(model, workspace)
    tokens = src.shape[0] * bench.STEPS
    return dict(bench="decode_threads", config=name, precision=precision, threads=threads,
                shape=f"{name} B={src.shape[0]} S={src.shape[1]}", tokens=tokens,
                groups=decoding.step_groups(model.cfg, precision, threads, src.shape[0]),
                tokens_per_s=tokens / total_s, total_s=total_s, total_spread_s=total_spread,
                encoder_s=encoder_s, encoder_spread_s=encoder_spread, steps_s=total_s - encoder_s,
                encoder_share=encoder_s / total_s, isa=T.build_info()["isa"], repeats=repeats)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cores = os.cpu_count() or 1
    default = ",".join(str(1 << i) for i in range(cores.bit_length()) if 1 << i <= cores)
    parser.add_argument("--threads", default=default, help=f"comma-separated (default {default})")
    parser.add_argument("--configs", default="tiny,base")
    parser.add_argument("--precisions", default="int8,fp32")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    try:
        threads = [int(n) for n in args.threads.split(",")]
    except ValueError:
        parser.error(f"--threads {args.threads!r}: comma-separated positive integers")
    configs, precisions = args.configs.split(","), args.precisions.split(",")
    if min(threads) < 1:
        parser.error(f"--threads {args.threads!r}: comma-separated positive integers")
    if set(configs) - set(bench.CONFIGS):
        parser.error(f"--configs {args.configs!r}: choose from {', '.join(bench.CONFIGS)}")
    if set(precisions) - {"fp32", "bf16", "int8"}:
        parser.error(f"--precisions {args.precisions!r}: choose from fp32, bf16, int8")
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: at least 1")
    for name in configs:
        for precision in precisions:
            for n in threads:
                record = measure(name, precision, n, args.repeats)
                print(json.dumps(record), flush=True)
                print(f"{name} {precision} {n:>2} threads: {record['tokens_per_s']:9.0f} tokens/s, "
                      f"encoder {record['encoder_s'] * 1e3:6.1f} ms of {record['total_s'] * 1e3:6.1f} "
                      f"({record['groups']} blocks a step)", file=sys.stderr)


if __name__ == "__main__":
    main()
