"""`transformer prepare`: a corpus read once into a prepared directory (transformer/corpus)."""
import json
import os
import sys

from ..config import TRAIN_DEFAULTS
from ..data import HEADER_CHOICES
from ..errors import FlagError, blame
from .flags import DATA_HELP, _corpus_flags, _split_flags, _vocabulary_flags


def run(args):
    """`transformer prepare`: a corpus read once into a prepared directory (transformer/corpus)."""
    import time

    from .. import datasets
    from ..corpus import is_prepared, make_inputs, prepare
    from ..training.flags import corpus_blame, data_specs

    for key in ("src_col", "tgt_col", "header", "dev_fraction", "dev_max", "bpe_sample"):
        if getattr(args, key) is None:
            setattr(args, key, TRAIN_DEFAULTS[key])
    with blame("--out", args.out):
        if os.path.isdir(args.out) and os.listdir(args.out):
            if not is_prepared(args.out):
                raise FlagError(f"--out {args.out}: holds files that are not a prepared corpus (nothing there "
                                "is replaced: choose another directory)")
            if not args.overwrite:
                raise FlagError(f"--out {args.out}: holds a prepared corpus; --overwrite replaces it")
        elif os.path.exists(args.out) and not os.path.isdir(args.out):
            raise NotADirectoryError(f"{args.out}: a file, not a directory")
        elif os.path.isdir(args.out):
            os.rmdir(args.out)           # an empty directory: the prepared one takes its place
    tokenizers = None
    if args.tokenizers_from:
        from ..checkpoint import load_for_inference

        if args.vocab_size is not None:
            raise FlagError("--vocab-size: the vocabularies come from --tokenizers-from (leave the flag out)")
        with blame("--tokenizers-from", args.tokenizers_from):
            _, src_tok, tgt_tok = load_for_inference(args.tokenizers_from)
        tokenizers = {"src": src_tok, "tgt": tgt_tok}
    with corpus_blame(args):
        specs = [datasets.resolve(spec) if datasets.is_shortcut(spec) else spec for spec in data_specs(args.data)]
        inputs = make_inputs(specs, args.src_col, args.tgt_col, HEADER_CHOICES[args.header], args.src_file,
                             args.tgt_file)
    started = time.monotonic()
    with corpus_blame(args):
        path = prepare(inputs, args.out, dev_fraction=args.dev_fraction, dev_max=args.dev_max,
                       vocab_size=args.vocab_size, bpe_sample=args.bpe_sample, tokenizers=tokenizers,
                       overwrite=args.overwrite, progress=not args.quiet,
                       log=lambda message: print(message, file=sys.stderr, flush=True))
    seconds = time.monotonic() - started
    from ..corpus import read_manifest

    manifest = read_manifest(path)
    counts = manifest["counts"]
    print(json.dumps({"prepared": path, **counts, "seconds": round(seconds, 2),
                      "pairs_per_s": round(counts["pairs"] / max(seconds, 1e-9), 1),
                      "phases": manifest["seconds"],
                      "ids_dtype": manifest["arrays"]["train.src.ids"]["dtype"]}))
    print(f"prepared {counts['train']:,} training and {counts['dev']:,} held-out pairs into {path} in "
          f"{seconds:.1f} s; train on them with: transformer train --data {path}", file=sys.stderr)
    return 0


def register(sub):
    prepare = sub.add_parser("prepare", help="read a corpus once into memory-mapped token-id arrays for train --data")
    _corpus_flags(prepare, DATA_HELP)
    prepare.add_argument("--out", required=True, metavar="DIR", help="the prepared directory to write "
                         "(one that holds a prepared corpus is refused without --overwrite)")
    prepare.add_argument("--overwrite", action="store_true", help="replace a prepared corpus already in --out")
    _vocabulary_flags(prepare)
    prepare.add_argument("--tokenizers-from", metavar="MODEL_DIR",
                         help="encode with the tokenizers of this model (to fine-tune it with --init-from) "
                              "instead of learning BPE")
    _split_flags(prepare)
    prepare.add_argument("--quiet", action="store_true", help="no progress bar")
    prepare.set_defaults(func=run)
