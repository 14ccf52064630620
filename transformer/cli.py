"""The `transformer` command line."""
import argparse
import json
import sys


def _threads(text):
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--threads takes a comma-separated list of ints, got {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"--threads values must be >= 1, got {text!r}")
    return values


def _bench(args):
    from .bench import kernels

    if args.what != "kernels":
        print(f"transformer bench: --what {args.what} is not available yet (only 'kernels')", file=sys.stderr)
        return 2
    families = [f for f in args.families.split(",") if f]
    unknown = sorted(set(families) - set(kernels.FAMILIES))
    if unknown:
        print(f"transformer bench: unknown --families {unknown}; choose from {list(kernels.FAMILIES)}",
              file=sys.stderr)
        return 2
    records = kernels.run(threads=args.threads, families=families, stream=sys.stdout)
    if args.json:
        with open(args.json, "w") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
    print(kernels.summary_table(records), file=sys.stderr)
    return 0


def _info(args):
    import transformer as T

    print(json.dumps(T.build_info(), indent=2))
    return 0


def build_parser():
    parser = argparse.ArgumentParser(prog="transformer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    bench = sub.add_parser("bench", help="benchmark our kernels against numpy/PyTorch")
    bench.add_argument("--what", default="kernels", choices=["kernels", "train", "decode", "masking", "all"])
    bench.add_argument("--threads", type=_threads, default=[1, 2], help="e.g. 1,2,4")
    bench.add_argument("--families", default="gemm,nn,elementwise,loss",
                       help="kernel families to run (comma-separated)")
    bench.add_argument("--json", metavar="FILE", help="also write the JSON lines to FILE")
    bench.set_defaults(func=_bench)

    info = sub.add_parser("info", help="print build_info(): compiler, OpenMP, SIMD level, threads")
    info.set_defaults(func=_info)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
