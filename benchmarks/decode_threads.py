"""Where decoding's time goes at each thread count: the encoder and the step loop timed apart.

    python benchmarks/decode_threads.py [--threads 1,2,4,8,16] [--configs tiny,base]
                                        [--precisions int8,fp32] [--repeats 5]
                                        [--python-loops] [--blocks auto,2,4,8,16]

Ours alone (no other engine in the process or the machine), greedy, the decode bench's models and
batches (transformer/bench/decode.py: random weights, every sentence 64 tokens). For each
(config, precision, threads): the median seconds of the encoder alone (what greedy_decode runs
before its first step, on the same prepared weights) and of the whole greedy decode, each after
SETTLE_S of sleep; the step loop is their difference. With `groups`: the blocks of sentences the
loop runs in at that count (transformer/decoding/tuning.py, step_groups).

--python-loops: also the step-by-step loop in Python (decoding._PYTHON_LOOPS, the threads
meeting once per step) next to the loop in C (each block of sentences on one thread from its
first step to its last), in the same process. --blocks: also each fixed block count
(decoding.DECODE_GROUPS, blocks of one row allowed), "auto" being step_groups' choice. A fixed
count runs that many threads in the loop whatever --threads says (--threads sizes the encoder's
team and the kernels of a one-block loop): each record says `loop_threads`. One JSON line each.

Written for the 16-core Xeon, where ours got slower from 8 to 16 threads even with the same
blocks a step (benchmarks/notes/2026-11-27-xeon-16core.md), before the loops moved to C:
this tells the encoder's share of that loss from the steps', the loops' share, and the block
count the loops in C want there.
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


def measure(name, precision, threads, repeats, python_loops=False, blocks="auto"):
    """One record; python_loops: the step-by-step loop in Python; blocks: "auto" or a count."""
    model, src = bench._model(name)
    model.params.freeze()          # as the decode bench times them (transformer/bench/decode.py)
    T.set_num_threads(threads)
    saved = decoding._PYTHON_LOOPS, decoding.DECODE_GROUPS, decoding.MIN_GROUP_ROWS
    decoding._PYTHON_LOOPS = python_loops
    if blocks != "auto":
        decoding.DECODE_GROUPS, decoding.MIN_GROUP_ROWS = int(blocks), 1
    try:
        return _measure(model, src, name, precision, threads, repeats, python_loops, blocks)
    finally:
        decoding._PYTHON_LOOPS, decoding.DECODE_GROUPS, decoding.MIN_GROUP_ROWS = saved


def _measure(model, src, name, precision, threads, repeats, python_loops, blocks):
    decode = lambda: model.greedy_decode(src, max_len=bench.STEPS, min_len=bench.STEPS, precision=precision)
    total_s, total_spread = _seconds(decode, repeats)
    workspace = decoding._lend_workspace(model)        # the prepared weights the decodes used
    try:
        prepared = decoding._prepared(model, workspace)
        encoder_s, encoder_spread = _seconds(lambda: model._encode(src, precision, prepared), repeats)
    finally:
        decoding._return_workspace(model, workspace)
    tokens = src.shape[0] * bench.STEPS
    groups = decoding.step_groups(model.cfg, precision, threads, src.shape[0])
    return dict(bench="decode_threads", config=name, precision=precision, threads=threads,
                shape=f"{name} B={src.shape[0]} S={src.shape[1]}", tokens=tokens,
                groups=groups, loop_threads=groups if groups > 1 else threads,
                tokens_per_s=tokens / total_s, total_s=total_s, total_spread_s=total_spread,
                encoder_s=encoder_s, encoder_spread_s=encoder_spread, steps_s=total_s - encoder_s,
                encoder_share=encoder_s / total_s, loops="python" if python_loops else "c",
                blocks_asked=blocks, isa=T.build_info()["isa"], repeats=repeats,
                weights="frozen" if model.params.frozen is not None else "writeable")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cores = os.cpu_count() or 1
    default = ",".join(str(1 << i) for i in range(cores.bit_length()) if 1 << i <= cores)
    parser.add_argument("--threads", default=default, help=f"comma-separated (default {default})")
    parser.add_argument("--configs", default="tiny,base")
    parser.add_argument("--precisions", default="int8,fp32")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--python-loops", action="store_true",
                        help="also time the step-by-step loops in Python")
    parser.add_argument("--blocks", default="auto", help="comma-separated block counts or auto (default auto)")
    args = parser.parse_args(argv)
    blocks = args.blocks.split(",")
    if any(b != "auto" and not (b.isdigit() and int(b) >= 1) for b in blocks):
        parser.error(f"--blocks {args.blocks!r}: comma-separated positive integers or auto")
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
                for count in blocks:
                    for python_loops in (False, True) if args.python_loops else (False,):
                        record = measure(name, precision, n, args.repeats, python_loops, count)
                        print(json.dumps(record), flush=True)
                        print(f"{name} {precision} {n:>2} threads, loops in {record['loops']:>6}: "
                              f"{record['tokens_per_s']:9.0f} tokens/s, encoder "
                              f"{record['encoder_s'] * 1e3:6.1f} ms of {record['total_s'] * 1e3:6.1f} "
                              f"({record['groups']} blocks on {record['loop_threads']} threads)",
                              file=sys.stderr)


if __name__ == "__main__":
    main()
