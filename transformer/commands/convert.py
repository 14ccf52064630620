"""`transformer convert`: a MarianMT (OPUS-MT) model imported, or one of ours exported as one
(transformer/marian.py)."""
import os
import sys

from ..errors import FlagError, blame
from .models import _check_out_dir, _load_model, _replace


def run(args):
    from ..checkpoint import save_inference_files
    from ..checkpoint import read_languages
    from ..marian import config_to_marian, export_marian, import_marian, marian_languages

    if (args.source is None) == (args.to is None):
        raise FlagError("give exactly one of --from marian HF_DIR (import) and --to marian DIR (export)")
    if args.source is not None:
        fmt, directory = args.source
        if fmt != "marian":
            raise FlagError(f"--from {fmt}: the formats are: marian")
        _check_out_dir(args.out, [("--from", directory)], args.overwrite)
        with blame("--from", directory):
            if not os.path.isdir(directory):
                raise FileNotFoundError("MarianMT directory not found")
            model, src_tok, tgt_tok = import_marian(directory)
        with blame("--out", args.out):
            _replace(args)
            languages = marian_languages(directory)
            save_inference_files(args.out, model, src_tok, tgt_tok, languages=languages)
        said = f"; languages {languages[0]} -> {languages[1]}" if languages else \
            "; its languages are not in it (serve it as --model SRC-TGT=DIR)"
        print(f"wrote {args.out}: a MarianMT model with {model.num_parameters():,} parameters "
              f"(translate, evaluate and train --init-from read it){said}", file=sys.stderr)
        return 0
    fmt, directory = args.to
    if fmt != "marian":
        raise FlagError(f"--to {fmt}: the formats are: marian")
    _check_out_dir(args.out, [("--to", directory)], args.overwrite)
    model, src_tok, tgt_tok = _load_model(directory, "--to")
    with blame("--to", directory):
        config_to_marian(model.cfg)
    with blame("--out", args.out):
        _replace(args)
        export_marian(model, src_tok, tgt_tok, args.out, languages=read_languages(directory))
    print(f"wrote {args.out}: MarianMTModel.from_pretrained and MarianTokenizer.from_pretrained read it",
          file=sys.stderr)
    return 0


def register(sub):
    convert = sub.add_parser("convert", help="import a MarianMT (OPUS-MT) model, or export one")
    convert.add_argument("--from", dest="source", nargs=2, metavar=("FORMAT", "HF_DIR"),
                         help="marian HF_DIR: a local MarianMTModel directory (config.json, "
                              "model.safetensors or pytorch_model.bin, source.spm, target.spm, vocab.json)")
    convert.add_argument("--to", nargs=2, metavar=("FORMAT", "DIR"),
                         help="marian DIR: write our model directory DIR as a MarianMTModel directory")
    convert.add_argument("--out", required=True, metavar="DIR", help="the directory to write")
    convert.add_argument("--overwrite", action="store_true", help="replace a model already in --out")
    convert.set_defaults(func=run)
