"""Training-step benchmark: ours vs PyTorch, same run, interleaved; prints ONE JSON line.

    python benchmarks/train_step.py [--threads 1,2] [--configs tiny,base] [--repeats N] [--no-memory]
                                    [--precision fp32|bf16]

Each result has target tokens/s of both engines and ratio = torch step time / our step time
(> 1: we are faster); the memory results give each engine's peak resident set in MB for the
base step, each measured in its own subprocess. With --precision bf16: ours at bf16 against
PyTorch's torch.autocast bf16 step and against ours at fp32, in the same run.
"""
import argparse
import json
import time

from transformer.bench import train


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", default="1,2")
    p.add_argument("--configs", default="tiny,base")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    a = p.parse_args(argv)
    import transformer as T
    threads = tuple(int(t) for t in a.threads.split(","))
    configs = tuple(a.configs.split(","))
    records = train.run(threads=threads, repeats=a.repeats, configs=configs, memory=not a.no_memory,
                        precision=a.precision)
    print(json.dumps({"benchmark": "train_step", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      "build": T.build_info(), "results": records}))


if __name__ == "__main__":
    main()
