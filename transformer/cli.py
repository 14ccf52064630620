"""The `transformer` command line."""
import argparse
import json
import os
import sys


def _threads(text):
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--threads takes a comma-separated list of ints, got {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"--threads values must be >= 1, got {text!r}")
    return values


def _default_threads():
    """1, 2, 4, ... up to the cores present, and the core count itself."""
    cores = os.cpu_count() or 1
    values, n = [], 1
    while n < cores:
        values.append(n)
        n *= 2
    return values + [cores]


def _against(args):
    """"torch" when asked for and installed; None to measure ours alone."""
    if args.against == "none":
        return None
    try:
        import torch  # noqa: F401
    except ImportError:
        if args.against == "torch":
            print("transformer bench: --against torch needs PyTorch (pip install torch); "
                  "measuring ours alone", file=sys.stderr)
        return None
    return "torch"


def _configs(args):
    """Named configs (tiny,base) or one custom size spec (KEY=INT,...)."""
    from .bench import train

    if "=" in args.config:
        return [train.custom_config(args.config)]
    names = [n.strip() for n in args.config.split(",") if n.strip()]
    unknown = [n for n in names if n not in train.CONFIGS or n == "custom"]
    if not names or unknown:
        raise ValueError(f"--config: expected tiny, base, tiny,base or KEY=INT,..., got {args.config!r}")
    return names


def _emit(records, args):
    with open(args.json, "w") if args.json else open(os.devnull, "w") as sink:
        for record in records:
            print(json.dumps(record))
            sink.write(json.dumps(record) + "\n")


def _bench(args):
    from .bench import kernels

    if args.threads is None:
        args.threads = _default_threads()
    try:
        configs = _configs(args)
    except ValueError as e:
        print(f"transformer bench: {e}", file=sys.stderr)
        return 2
    against = _against(args)
    if args.what == "kernels" and against is None:
        print("transformer bench: --what kernels compares with PyTorch and numpy; it needs torch "
              "(--what train, profile, decode, masking and all run without it)", file=sys.stderr)
        return 2
    if args.what == "all":
        from .bench import scaling

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
        from .bench import train

        records = []
        if args.what == "train":
            records = train.run(threads=tuple(args.threads), configs=tuple(configs), against=against)
        profiles = [train.profile(name, n) for name in configs for n in args.threads]
        _emit(records + profiles, args)
        for record in profiles:
            print("\n" + train.profile_table(record), file=sys.stderr)
        return 0
    if args.what == "decode":
        from .bench import decode

        engines = ("ours", "torch", "ctranslate2") if against else ("ours",)
        _emit(decode.run(threads=tuple(args.threads), configs=tuple(configs), engines=engines), args)
        return 0
    if args.what == "masking":
        from .bench import masking

        records = masking.run(threads=tuple(args.threads), stream=sys.stdout)
        if args.json:
            with open(args.json, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
        print(masking.table(records), file=sys.stderr)
        return 0
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


def _positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _apply_threads(args):
    if getattr(args, "threads", None):
        import transformer as T

        T.set_num_threads(args.threads[0] if isinstance(args.threads, list) else args.threads)


def _train(args):
    from . import train

    _apply_threads(args)
    train.load_resume(args)
    train.apply_defaults(args)
    train.prepare_out_dir(args)
    if args.data:
        return train.train_on_data(args)
    return train.train_builtin(args)


def _read_texts(texts):
    if texts:
        return list(texts)
    return [line.rstrip("\n") for line in sys.stdin]


def _translate(args):
    from .checkpoint import load_for_inference
    from .train import translate_texts

    _apply_threads(args)
    model, src_tok, tgt_tok = load_for_inference(args.model)
    texts = _read_texts(args.text)
    for line in translate_texts(model, src_tok, tgt_tok, texts, beam=args.beam, max_len=args.max_len):
        print(line)
    if args.attention:
        from .plot import plot_cross_attention

        if not texts:
            print("transformer translate: --attention needs at least one sentence", file=sys.stderr)
            return 2
        plot_cross_attention(model, src_tok, tgt_tok, texts[0], args.attention)
        print(f"cross-attention of {texts[0]!r} drawn in {args.attention}", file=sys.stderr)
    return 0


def _evaluate(args):
    from .checkpoint import load_for_inference
    from .data import read_pairs
    from .train import score_translations, translate_texts

    _apply_threads(args)
    from . import datasets

    model, src_tok, tgt_tok = load_for_inference(args.model)
    if datasets.is_shortcut(args.data):
        args.data = datasets.resolve(args.data)
    pairs, report = read_pairs(args.data, args.src_col, args.tgt_col, max_pairs=args.limit)
    print(report.summary(), file=sys.stderr)
    hyps = translate_texts(model, src_tok, tgt_tok, [s for s, _ in pairs], beam=args.beam)
    scores = score_translations(hyps, [t for _, t in pairs])
    print(json.dumps({"pairs": len(pairs), "beam": args.beam,
                      **{k: round(v, 2) for k, v in scores.items()}}))
    return 0


def _average(args):
    from .checkpoint import average_model_dirs, save_inference_files

    model, src_tok, tgt_tok = average_model_dirs(args.models)
    save_inference_files(args.out, model, src_tok, tgt_tok)
    print(f"averaged {len(args.models)} models into {args.out}", file=sys.stderr)
    return 0


def _info(args):
    import transformer as T

    print(json.dumps(T.build_info(), indent=2))
    return 0


def build_parser():
    parser = argparse.ArgumentParser(prog="transformer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    bench = sub.add_parser("bench", help="benchmark our kernels against numpy/PyTorch")
    bench.add_argument("--what", default="kernels",
                       choices=["kernels", "train", "profile", "decode", "masking", "all"],
                       help="kernels: every kernel vs PyTorch/numpy; train: a training step (and its "
                            "profile); profile: where a training step's time goes; decode: greedy and "
                            "beam search; masking: parallel masked training vs an autoregressive loop, "
                            "and the leakage without the mask; all: thread scaling of GEMM, training "
                            "and decoding")
    bench.add_argument("--threads", type=_threads, default=None,
                       help="e.g. 1,2,4 (default: 1, 2, 4, ... up to the cores present)")
    bench.add_argument("--config", default="tiny,base",
                       help="tiny, base, tiny,base, or custom sizes for train/profile/decode/all: "
                            "d_model=256,n_heads=4,d_ff=1024,layers=3[,vocab=8000,batch=16,length=48]")
    bench.add_argument("--against", default="torch", choices=["torch", "none"],
                       help="reference measured in the same run (torch: when installed)")
    bench.add_argument("--families", default="gemm,nn,elementwise,loss",
                       help="kernel families to run (comma-separated)")
    bench.add_argument("--json", metavar="FILE", help="also write the JSON lines to FILE")
    bench.add_argument("--plot", metavar="FILE.png", help="with --what all: draw throughput and efficiency")
    bench.set_defaults(func=_bench)

    train = sub.add_parser("train", help="train a translation model (no --data: the built-in task)")
    train.add_argument("--data", help="tab-separated sentence pairs (.tsv or .tsv.gz), or tatoeba:SRC-TGT "
                       "(e.g. tatoeba:eng-hin, downloaded once into a cache)")
    train.add_argument("--src-col", default="0", help="source column: header name or 0-based index")
    train.add_argument("--tgt-col", default="1", help="target column: header name or 0-based index")
    train.add_argument("--out", help="output directory for checkpoints and the model")
    train.add_argument("--resume", metavar="DIR", help="continue the run whose checkpoint is in DIR")
    train.add_argument("--preset", default="tiny", choices=["tiny", "small", "base"])
    train.add_argument("--d-model", dest="d_model", type=_positive_int)
    train.add_argument("--n-heads", dest="n_heads", type=_positive_int)
    train.add_argument("--d-ff", dest="d_ff", type=_positive_int)
    train.add_argument("--n-encoder-layers", dest="n_encoder_layers", type=_positive_int)
    train.add_argument("--n-decoder-layers", dest="n_decoder_layers", type=_positive_int)
    train.add_argument("--dropout", type=float)
    train.add_argument("--activation", choices=["relu", "gelu"])
    train.add_argument("--norm-first", dest="norm_first", action=argparse.BooleanOptionalAction, default=None,
                       help="layer norm before each sublayer (pre-LN) instead of after it (the paper's post-LN)")
    train.add_argument("--max-steps", type=_positive_int)
    train.add_argument("--minutes", type=float, help="wall-clock budget (default 2 built-in, 10 with --data; "
                       "periodic evaluation is not counted; with --resume: what the interrupted run had left)")
    train.add_argument("--threads", type=_positive_int)
    train.add_argument("--batch-tokens", type=_positive_int, default=4096,
                       help="tokens per batch, padding included (--data)")
    train.add_argument("--batch-size", type=_positive_int, default=64, help="sentences per batch (built-in task)")
    train.add_argument("--schedule", choices=["budget", "noam"],
                       help="learning-rate schedule. budget (default with --data): warm-up over the first "
                            "5%% of the budget (--max-steps, or --minutes divided by a measured step time), "
                            "then linear decay to its end; noam (default for the built-in task): the "
                            "paper's inverse-square-root schedule with --warmup steps")
    train.add_argument("--warmup", type=_positive_int,
                       help="warm-up steps (noam: default 300 built-in, 4000 with --data; budget: 5%% of the budget)")
    train.add_argument("--lr", type=float, help="peak learning rate of the budget schedule (default 0.016 * d_model^-0.5)")
    train.add_argument("--lr-scale", type=float, default=1.0, help="factor on the learning-rate schedule")
    train.add_argument("--label-smoothing", type=float, default=0.1)
    train.add_argument("--clip-norm", type=float, default=1.0, help="clip gradients to this global norm (0: off)")
    train.add_argument("--vocab-size", type=_positive_int, default=8000, help="BPE vocabulary size per language")
    train.add_argument("--max-sentence-tokens", type=_positive_int, default=128)
    train.add_argument("--dev-fraction", type=float, default=0.05)
    train.add_argument("--dev-max", type=_positive_int, default=500)
    train.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps (0: only at the end)")
    train.add_argument("--eval-limit", type=int, default=200, help="dev sentences used by periodic evaluation")
    train.add_argument("--save-every", type=int, default=0, help="checkpoint every N steps")
    train.add_argument("--save-minutes", type=float, default=5.0, help="checkpoint every M minutes")
    train.add_argument("--average-last", type=_positive_int, metavar="K",
                       help="snapshot the weights every --snapshot-every steps and make the saved model "
                            "the average of the last K (the checkpoint keeps the raw weights)")
    train.add_argument("--snapshot-every", type=_positive_int, metavar="N",
                       help="with --average-last: steps between snapshots (default 2.5%% of the planned steps)")
    train.add_argument("--keep-best", action="store_true",
                       help="with --eval-every: also keep the model of the best dev loss in OUT/best")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.add_argument("--samples", nargs="*", metavar="TEXT", help="also translate these at the end")
    train.set_defaults(func=_train)

    translate = sub.add_parser("translate", help="translate sentences (arguments, or stdin lines)")
    translate.add_argument("--model", required=True, metavar="DIR")
    translate.add_argument("--beam", type=_positive_int, default=4, help="beam size (1: greedy)")
    translate.add_argument("--max-len", type=_positive_int)
    translate.add_argument("--threads", type=_positive_int)
    translate.add_argument("--attention", metavar="FILE.png", help="draw the cross-attention of the first sentence")
    translate.add_argument("text", nargs="*")
    translate.set_defaults(func=_translate)

    evaluate = sub.add_parser("evaluate", help="BLEU and chrF on tab-separated pairs")
    evaluate.add_argument("--model", required=True, metavar="DIR")
    evaluate.add_argument("--data", required=True)
    evaluate.add_argument("--src-col", default="0")
    evaluate.add_argument("--tgt-col", default="1")
    evaluate.add_argument("--beam", type=_positive_int, default=4)
    evaluate.add_argument("--limit", type=_positive_int, help="use only the first N pairs")
    evaluate.add_argument("--threads", type=_positive_int)
    evaluate.set_defaults(func=_evaluate)

    average = sub.add_parser("average", help="average the weights of several model directories of one run")
    average.add_argument("models", nargs="+", metavar="DIR", help="model directories (same config and tokenizers)")
    average.add_argument("--out", required=True, metavar="DIR", help="where to write the averaged model")
    average.set_defaults(func=_average)

    info = sub.add_parser("info", help="print build_info(): compiler, OpenMP, SIMD level, threads")
    info.set_defaults(func=_info)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
