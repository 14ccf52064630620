"""`transformer average`: one model, the average of the weights of several of one run."""
import sys

from ..errors import FlagError, blame
from .models import _check_out_dir, _replace


def run(args):
    from ..checkpoint import average_model_dirs, copy_languages, save_inference_files

    if len(args.models) < 2:
        raise FlagError(f"one model directory ({args.models[0]}): averaging needs at least two (to copy "
                        f"a model, copy its directory)")
    _check_out_dir(args.out, [("a model it averages", m) for m in args.models], args.overwrite)
    with blame():
        model, src_tok, tgt_tok = average_model_dirs(args.models)
    with blame("--out", args.out):
        _replace(args)
        save_inference_files(args.out, model, src_tok, tgt_tok)
        copy_languages(args.models[0], args.out)
    print(f"averaged {len(args.models)} models into {args.out}", file=sys.stderr)
    return 0


def register(sub):
    average = sub.add_parser("average", help="average the weights of several model directories of one run")
    average.add_argument("models", nargs="+", metavar="DIR", help="model directories (same config and tokenizers)")
    average.add_argument("--out", required=True, metavar="DIR", help="where to write the averaged model")
    average.add_argument("--overwrite", action="store_true", help="replace a model already in --out")
    average.set_defaults(func=run)
