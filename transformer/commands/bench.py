"""`transformer bench`: which benchmark (--what), the flags each reads, and the run
(transformer/bench)."""
import argparse
import importlib.util
import json
import os
import sys

from ..errors import FlagError, blame
from .flags import _check_output, _positive_int

BENCH_DEFAULTS = {"config": "tiny,base", "families": "gemm,nn,elementwise,loss", "precision": "fp32"}
# What each --what reads besides --threads and --json; these flags given to another are refused.
BENCH_FLAGS = {"kernels": ("families", "against", "precision"),
               "train": ("config", "against", "precision", "repeats"), "profile": ("config",),
               "decode": ("config", "against", "precision", "repeats"), "masking": (),
               "all": ("config", "against", "plot"), "distributed": ("config", "against"),
               "marian": ("config",), "serve": ("config", "precision", "hostile", "baseline", "file_docx", "repeats")}


def _threads(text):
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--threads takes a comma-separated list of ints, got {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"--threads values must be >= 1, got {text!r}")
    return values


def _default_threads():
    """1, 2, 4, ... up to the cores this process may use (its affinity, capped by a container's CPU
    limit: transformer/cores.py), and that count itself; 1 alone in a build without OpenMP, which
    runs one thread."""
    from .. import _C, cores as usable

    cores = usable.usable_cores() if _C.openmp_version() else 1
    values, n = [], 1
    while n < cores:
        values.append(n)
        n *= 2
    return values + [cores]


def _refuse_more_threads_than_the_build_runs(values):
    """A build without OpenMP refuses --threads above 1 before anything runs, in one line, as the
    other commands do; not half-way through a grid, from the first point that asks for 2."""
    from .. import _C

    if _C.openmp_version() == 0 and max(values) > 1:
        with blame("--threads", ",".join(map(str, values))):
            raise _C.SingleThreadedBuild(f"{max(values)} threads refused: {_C.SINGLE_THREADED_FIX}")


def _against(args):
    """"torch" when asked for and installed; None to measure ours alone."""
    if args.against == "none":
        return None
    try:
        import torch  # noqa: F401
    except ImportError:
        if args.against == "torch":
            print("transformer bench: warning: --against torch needs PyTorch (pip install torch); "
                  "measuring ours alone", file=sys.stderr)
        return None
    return "torch"


def _configs(args):
    """Named configs (tiny,base) or one custom size spec (KEY=INT,...)."""
    from ..bench import train

    if "=" in args.config:
        try:
            return [train.custom_config(args.config)]
        except ValueError as exc:
            raise FlagError(str(exc)) from None
    names = [n.strip() for n in args.config.split(",") if n.strip()]
    unknown = [n for n in names if n not in train.CONFIGS or n == "custom"]
    if not names or unknown:
        raise FlagError(f"--config: expected tiny, base, tiny,base or KEY=INT,..., got {args.config!r}")
    return names


def _bench_marian(args):
    """MarianMT at OPUS-MT's size: decoding against CTranslate2 and transformers, fine-tuning
    against transformers (transformer/bench/marian.py)."""
    from ..bench import marian

    if args.config not in marian.CONFIGS:
        raise FlagError(f"--config {args.config}: --what marian takes {' or '.join(sorted(marian.CONFIGS))}")
    missing = [name for name in ("torch", "transformers", "sentencepiece", "ctranslate2")
               if importlib.util.find_spec(name) is None]
    if missing:
        raise FlagError(f"--what marian compares with CTranslate2 and transformers: it needs "
                        f"{', '.join(missing)} (pip install {' '.join(missing)})")
    records = marian.run(tuple(args.threads), config=args.config, stream=sys.stdout)
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    return 0


def _bench_serve(args):
    """`transformer serve` under concurrent clients (transformer/bench/serve.py)."""
    from ..bench import serve

    if importlib.util.find_spec("aiohttp") is None:
        raise FlagError('--what serve needs aiohttp: pip install "transformer-cpu[serve]"')
    names = [n.strip() for n in args.config.split(",") if n.strip()]
    unknown = [n for n in names if n not in serve.CONFIGS]
    if not names or unknown:
        raise FlagError(f"--config {args.config}: --what serve takes {', '.join(serve.CONFIGS)}")
    if args.baseline is not None and not args.hostile:
        raise FlagError("--baseline applies to --hostile: the other checkout's server under the same load")
    if args.baseline is not None and not os.path.isdir(os.path.join(args.baseline, "transformer")):
        raise FlagError(f"--baseline {args.baseline}: no transformer package there (a checkout's root, built)")
    records = []
    for threads in args.threads:
        if args.file_docx:
            from ..bench import serve_file
            for name in names:
                records += serve_file.run(config=name, threads=threads, precision=args.precision, stream=sys.stdout)
        elif args.hostile:
            for name in names:
                records += serve.run_hostile(config=name, threads=threads, precision=args.precision,
                                             hostile=args.hostile, baseline=args.baseline, rounds=args.repeats or 2,
                                             stream=sys.stdout)
        else:
            records += serve.run(configs=tuple(names), threads=threads, precision=args.precision, stream=sys.stdout)
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    if not args.hostile and not args.file_docx:
        print(serve.table(records), file=sys.stderr)
    return 0


def _check_bench_flags(args):
    """A flag the chosen --what would not read is refused, not silently ignored."""
    for key in ("config", "against", "families", "plot", "precision", "repeats", "hostile", "baseline", "file_docx"):
        if getattr(args, key) is not None and key not in BENCH_FLAGS[args.what]:
            readers = " or ".join(what for what, keys in BENCH_FLAGS.items() if key in keys)
            raise FlagError(f"--{key.replace('_', '-')} does not apply to --what {args.what}, only to --what {readers}")
    if args.what == "distributed" and args.config is None:
        args.config = "base"            # the figure: the base training step
    if args.what == "marian" and args.config is None:
        args.config = "opus"            # OPUS-MT's size
    if args.what == "serve" and args.precision is None:
        args.precision = "int8"         # the figure: int8 serving
    if args.what == "serve" and args.hostile and args.config is None:
        args.config = "tiny"            # issue 58's load: the server's own costs show on the small model
    if args.what == "serve" and args.repeats is not None and not args.hostile:
        raise FlagError("--repeats with --what serve applies to --hostile only (its rounds)")
    if args.what == "serve" and args.file_docx and args.hostile:
        raise FlagError("--file-docx and --hostile are two loads: give one")
    if args.what == "serve" and args.file_docx and args.config is None:
        args.config = "tiny"            # issue 59's figure: what the document path costs shows on the small model
    for key, value in BENCH_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    _check_output("--json", args.json)
    _check_output("--plot", args.plot, needs="matplotlib")
    _check_bench_precision(args)


def _check_bench_precision(args):
    """--precision: int8 is for inference, not --what train; bf16/int8 kernels rows are GEMM rows;
    and an engine built without the precision API is refused here, before any work, rather than
    measured at fp32 under another name."""
    from ..bench.precision import SUPPORTED, missing

    if args.what not in SUPPORTED or args.precision == "fp32":
        return
    if args.precision not in SUPPORTED[args.what]:
        raise FlagError(f"--precision {args.precision} does not apply to --what {args.what}: training runs at "
                        f"{' or '.join(SUPPORTED[args.what])} ({args.precision} is for inference: --what decode "
                        f"or kernels)")
    if args.what == "kernels" and "gemm" not in args.families.split(","):
        raise FlagError(f"--precision {args.precision} adds GEMM rows to --what kernels: --families must "
                        f"include gemm, got {args.families!r}")
    why = missing(args.precision, args.what)
    if why is not None:
        with blame("--precision", args.precision):
            raise ValueError(f"{why}: this engine cannot run {args.what} at {args.precision} yet")


def _emit(records, args):
    with open(args.json, "w") if args.json else open(os.devnull, "w") as sink:
        for record in records:
            print(json.dumps(record))
            sink.write(json.dumps(record) + "\n")


def run(args):
    from ..bench import kernels

    _check_bench_flags(args)
    if args.threads is None:
        args.threads = _default_threads()
    _refuse_more_threads_than_the_build_runs(args.threads)
    if args.what == "marian":
        return _bench_marian(args)
    if args.what == "serve":
        return _bench_serve(args)
    configs = _configs(args)
    against = _against(args)
    if args.what == "kernels" and against is None:
        raise FlagError("--what kernels compares with PyTorch and numpy: it needs torch "
                        "(--what train, profile, decode, masking and all run without it)")
    if args.what == "all":
        from ..bench import scaling

        suites = ("gemm", "train", "decode") if against else ("train", "decode")
        records = scaling.run_all(args.threads, what=suites, stream=sys.stdout,
                                  configs=configs, against=against)
        if args.json:
            with open(args.json, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
        print(scaling.efficiency_table(records), file=sys.stderr)
        if args.plot:
            scaling.plot(records, args.plot)
            print(f"plot written to {args.plot}", file=sys.stderr)
        return 0
    if args.what in ("train", "profile"):
        from ..bench import train

        records = []
        if args.what == "train":
            records = train.run(threads=tuple(args.threads), configs=tuple(configs), against=against,
                                precision=args.precision, repeats=args.repeats)
        profiles = [train.profile(name, n, precision=args.precision) for name in configs for n in args.threads]
        _emit(records + profiles, args)
        for record in profiles:
            print("\n" + train.profile_table(record), file=sys.stderr)
        return 0
    if args.what == "decode":
        from ..bench import decode

        engines = ("ours", "torch", "ctranslate2") if against else ("ours",)
        _emit(decode.run(threads=tuple(args.threads), configs=tuple(configs), engines=engines,
                         precision=args.precision, repeats=args.repeats), args)
        return 0
    if args.what == "distributed":
        from ..bench import distributed

        if _against(args) is None and args.against != "none":
            raise FlagError("--what distributed compares with PyTorch DDP: it needs torch (or --against none)")
        records = distributed.run(threads=tuple(args.threads), configs=tuple(configs), against=against,
                                  stream=sys.stdout)
        if args.json:
            with open(args.json, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
        print(distributed.table(records), file=sys.stderr)
        return 0
    if args.what == "masking":
        from ..bench import masking

        records = masking.run(threads=tuple(args.threads), stream=sys.stdout)
        if args.json:
            with open(args.json, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
        print(masking.table(records), file=sys.stderr)
        return 0
    families = [f for f in args.families.split(",") if f]
    unknown = sorted(set(families) - set(kernels.FAMILIES))
    if unknown or not families:
        raise FlagError(f"--families {args.families}: unknown {unknown}; choose from {list(kernels.FAMILIES)}")
    records = kernels.run(threads=args.threads, families=families, stream=sys.stdout, precision=args.precision)
    if args.json:
        with open(args.json, "w") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
    print(kernels.summary_table(records), file=sys.stderr)
    return 0


def register(sub):
    bench = sub.add_parser("bench", help="benchmark our kernels against numpy/PyTorch")
    bench.add_argument("--what", default="kernels",
                       choices=["kernels", "train", "profile", "decode", "masking", "all", "distributed", "marian",
                                "serve"],
                       help="kernels: every kernel vs PyTorch/numpy; train: a training step (and its "
                            "profile); profile: where a training step's time goes; decode: greedy and "
                            "beam search; masking: parallel masked training vs an autoregressive loop, "
                            "and the leakage without the mask; all: thread scaling of GEMM, training "
                            "and decoding; distributed: the training step data-parallel over MPI ranks x "
                            "threads (every pair of --threads values that fits the cores) against PyTorch DDP; "
                            "marian: a MarianMT model of OPUS-MT's size, decoding against CTranslate2 and "
                            "transformers, fine-tuning against transformers (--config opus or tiny); serve: "
                            "`transformer serve` under 1, 8, 64 and 256 concurrent clients against offline "
                            "translate, itself one sentence at a time, and CTranslate2 behind the same front")
    bench.add_argument("--threads", type=_threads, default=None,
                       help="e.g. 1,2,4 (default: 1, 2, 4, ... up to the cores present)")
    bench.add_argument("--config",
                       help="tiny, base, tiny,base, or custom sizes for train/profile/decode/all: "
                            "d_model=256,n_heads=4,d_ff=1024,layers=3[,vocab=8000,batch=16,length=48] "
                            f"(default {BENCH_DEFAULTS['config']})")
    bench.add_argument("--against", choices=["torch", "none"],
                       help="reference measured in the same run by kernels/train/decode/all (default torch, "
                            "when installed)")
    bench.add_argument("--families",
                       help=f"with --what kernels: kernel families to run (default {BENCH_DEFAULTS['families']})")
    bench.add_argument("--precision", choices=["fp32", "bf16", "int8"],
                       help="train: fp32 (default) or bf16, ours against torch.autocast bf16 and ours fp32; "
                            "decode: fp32, bf16 or int8, ours against CTranslate2 at the same compute type "
                            "and ours fp32; kernels: bf16 or int8 adds GEMM rows at that precision")
    bench.add_argument("--repeats", type=_positive_int,
                       help="train, decode: timed runs of each engine per measurement, alternated, the "
                            "median reported (default per config: train 15 tiny / 3 base, decode 5 / 3); "
                            "serve --hostile: rounds, the loads' order alternating (default 2); "
                            "more gives steadier ratios on a noisy machine")
    bench.add_argument("--hostile", type=_positive_int, metavar="N",
                       help="with --what serve: issue 58's load instead, 64 well-formed clients alone and while "
                            "N hostile clients send malformed, oversized, slow and dropped requests "
                            "(bench/serve.py: run_hostile; --config default tiny)")
    bench.add_argument("--baseline", metavar="DIR",
                       help="with --what serve --hostile: also the server of the checkout at DIR (built in "
                            "place, e.g. a worktree of 572e4d1) under the same well-formed load")
    bench.add_argument("--file-docx", action="store_true", default=None,
                       help="with --what serve: issue 59's load instead, a ~200-page .docx through POST "
                            "/translate_file against its paragraphs through POST /translate, with the server's "
                            "peak RSS (bench/serve_file.py; --config default tiny)")
    bench.add_argument("--json", metavar="FILE", help="also write the JSON lines to FILE")
    bench.add_argument("--plot", metavar="FILE.png", help="with --what all: draw throughput and efficiency")
    bench.set_defaults(func=run)
