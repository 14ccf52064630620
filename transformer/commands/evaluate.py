"""`transformer evaluate`: BLEU and chrF of a model's translations of tab-separated pairs."""
import json
import sys

from ..data import HEADER_CHOICES
from ..errors import blame
from .flags import DECODE_PRECISION_HELP, HEADER_HELP, _check_output, _non_negative_int, _positive_int
from .models import _load_model, _model_beam
from .world import _apply_threads


def run(args):
    from ..data import read_pairs
    from ..translation import score_translations, translate_texts

    _apply_threads(args)
    _check_output("--output", args.output)
    from .. import datasets

    model, src_tok, tgt_tok = _load_model(args.model, frozen=True)
    _model_beam(args, model, "evaluate")
    with blame("--data", args.data):
        if datasets.is_shortcut(args.data):
            args.data = datasets.resolve(args.data)
        pairs, report = read_pairs(args.data, args.src_col, args.tgt_col, max_pairs=args.limit,
                                   header=HEADER_CHOICES[args.header])
    print(report.summary(), file=sys.stderr)
    split = []
    precision = args.precision or model.stored_precision
    hyps = translate_texts(model, src_tok, tgt_tok, [s for s, _ in pairs], beam=args.beam,
                           on_split=lambda index, subwords, pieces: split.append(index),
                           no_repeat_ngram=args.no_repeat_ngram, precision=precision)
    if split:
        print(f"transformer evaluate: warning: {len(split)} source sentences (the first: pair {split[0] + 1}) "
              f"have more subwords than the model's {model.cfg.max_len} positions: translated in pieces",
              file=sys.stderr)
    if args.output:
        with blame("--output", args.output), open(args.output, "w", encoding="utf-8") as f:
            f.writelines(hyp + "\n" for hyp in hyps)
    scores = score_translations(hyps, [t for _, t in pairs], signatures=True)
    print(json.dumps({"pairs": len(pairs), "beam": args.beam, "precision": precision,
                      "bleu": round(scores["bleu"], 2), "chrf": round(scores["chrf"], 2),
                      "signature": scores["signature"]}))
    return 0


def register(sub):
    evaluate = sub.add_parser("evaluate", help="BLEU and chrF on tab-separated pairs")
    evaluate.add_argument("--model", required=True, metavar="DIR")
    evaluate.add_argument("--data", required=True)
    evaluate.add_argument("--src-col", default="0")
    evaluate.add_argument("--tgt-col", default="1")
    evaluate.add_argument("--header", choices=list(HEADER_CHOICES), default="auto", help=HEADER_HELP)
    evaluate.add_argument("--beam", type=_positive_int,
                          help="beam size (1: greedy; default: an imported model's own num_beams, else 4)")
    evaluate.add_argument("--no-repeat-ngram", type=_non_negative_int, default=0, metavar="N",
                          help="never repeat an n-gram of N tokens in an output (0: off)")
    evaluate.add_argument("--limit", type=_positive_int, help="use only the first N pairs")
    evaluate.add_argument("--precision", choices=["fp32", "bf16", "int8"],
                          help=DECODE_PRECISION_HELP)
    evaluate.add_argument("--threads", type=_positive_int)
    evaluate.add_argument("--output", metavar="FILE", help="also write the translations there, one per line, "
                                                            "in the order of the pairs")
    evaluate.set_defaults(func=run)
