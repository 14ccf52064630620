"""`transformer quantize`: an int8 copy of a model."""
import sys

from ..errors import blame
from .models import _check_out_dir, _load_model, _replace


def run(args):
    from ..checkpoint import copy_languages, save_inference_files

    _check_out_dir(args.out, [("--model", args.model)], args.overwrite)
    model, src_tok, tgt_tok = _load_model(args.model)
    with blame("--out", args.out):
        _replace(args)
        save_inference_files(args.out, model, src_tok, tgt_tok, precision="int8")
        copy_languages(args.model, args.out)
    print(f"wrote the int8 model {args.out} (its weight matrices quantized per row; translate and "
          "evaluate decode it in int8 unless given another --precision)", file=sys.stderr)
    return 0


def register(sub):
    quantize = sub.add_parser("quantize", help="write an int8 copy of a model (its weight matrices at a quarter of their size)")
    quantize.add_argument("--model", required=True, metavar="DIR")
    quantize.add_argument("--out", required=True, metavar="DIR", help="where to write the int8 model")
    quantize.add_argument("--overwrite", action="store_true", help="replace a model already in --out")
    quantize.set_defaults(func=run)
