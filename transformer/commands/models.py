"""Model directories as the commands meet them: one loaded for decoding (and the beam it decodes
with), and an --out that must not replace a model or run it was not asked to."""
import os
import sys

from ..errors import FlagError, blame

# What marks a directory as holding a model or a training run: ours, or a MarianMT export's.
MODEL_FILES = ("checkpoint.safetensors", "config.json", "model.safetensors", "pytorch_model.bin")


def _check_out_dir(out, inputs=(), overwrite=False):
    """Refuse, before any work, an --out that is one of the command's inputs (the input would be
    lost while it is read), or that already holds a model or run, unless --overwrite."""
    target = os.path.realpath(out)
    for flag, path in inputs:
        if path is not None and os.path.realpath(path) == target:
            raise FlagError(f"--out {out}: the same directory as {flag}; write the result to another one")
    held = [name for name in MODEL_FILES if os.path.exists(os.path.join(out, name))]
    if held and not overwrite:
        raise FlagError(f"--out {out}: already holds a model ({held[0]}); give --overwrite to replace it, "
                        "or another directory")


def _replace(args):
    """With --overwrite, what a run or model of ours left in --out goes before the new one is
    written (checkpoint.clear_run), so the two are never mixed; input checks have all passed."""
    from ..checkpoint import clear_run

    if args.overwrite and os.path.isdir(args.out):
        clear_run(args.out)


def _load_model(directory, flag="--model", frozen=False):
    """load_for_inference, errors blamed on `flag`. frozen: read-only weights (Parameters.freeze),
    for the commands that only decode: no one else ever holds a view of them, so decoding trusts
    its converted matrices from call to call instead of reading every weight again."""
    from ..checkpoint import load_for_inference

    with blame(flag, directory):
        if os.path.isdir(directory) and not os.path.exists(os.path.join(directory, "config.json")):
            raise FileNotFoundError("no config.json in it: not the --out of a training run")
        model, src_tok, tgt_tok = load_for_inference(directory)
    if frozen:
        model.params.freeze()
    return model, src_tok, tgt_tok


def _model_beam(args, model, command):
    """--beam as given, else the model's own num_beams (an imported model's generation settings,
    generation.py), else 4; for translate, says on stderr which settings decode and whence."""
    settings = model.generation
    given = args.beam is not None
    if not given:
        args.beam = settings.num_beams if settings is not None else 4
    if settings is None or command != "translate":
        return
    overrides = [f"{flag} {value}" for flag, value, on in (("--beam", args.beam, given),
                                                            ("--max-len", args.max_len, args.max_len is not None))
                 if on]
    print(f"transformer translate: the model's generation settings (imported with it, as transformers' "
          f"generate reads them): {'; '.join(settings.describe(model.cfg.max_len))}"
          + (f"; given: {', '.join(overrides)}" if overrides else ""), file=sys.stderr)
