"""Kernel benchmark: ours vs numpy (OpenBLAS) and torch, same run, JSON lines on stdout.

    python benchmarks/kernels.py [--threads 1,2] [--families gemm,nn,elementwise,loss] [--json FILE]
                                 [--precision bf16|int8]     # adds the GEMM rows at that precision

The summary table (ratios: reference time / our time) goes to stderr.
"""
import sys

from transformer.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--what", "kernels"] + sys.argv[1:]))
