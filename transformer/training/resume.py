"""Where a run writes, and how it continues: --out made (or --resume's directory), a checkpoint's
trajectory taken over and contradicting flags refused, --init-from's model loaded, the model and
optimizer restored or made new."""
import os

from ..checkpoint import load_checkpoint
from ..errors import FlagError, blame
from ..optim import Adam
from .data import CORPUS_READING_FLAGS, check_prepared_flags, prepared_dir
from .flags import (DROPOUT_FLAGS, SIZE_FLAGS, TRAJECTORY_ARGS, data_specs, describe_data, flag_name, has_data,
                    refuse_flags_that_do_not_apply)
from .loop import TrainState


def started_with(ckpt, key):
    """The value of a trajectory argument in the run that wrote the checkpoint."""
    if key in SIZE_FLAGS:
        return getattr(ckpt.model.cfg, key)          # the preset's size when the flag was not given
    plan = ckpt.train_state.get("schedule") or {}
    if key == "warmup" and "warmup" in plan:
        return plan["warmup"]
    return ckpt.args[key]


def load_initial_model(args):
    """With --init-from DIR: the model and tokenizers to fine-tune (a model directory: one trained
    here, or imported with `transformer convert --from marian`). Its sizes and vocabularies are
    the run's, so the flags that would set them are refused."""
    from ..checkpoint import load_for_inference

    for key in ("preset", "vocab_size") + tuple(k for k in SIZE_FLAGS if k not in DROPOUT_FLAGS):
        if getattr(args, key, None) is not None:
            raise FlagError(f"{flag_name(key)}: the model's sizes and vocabularies come from --init-from "
                            f"{args.init_from} (leave the flag out)")
    with blame("--init-from", args.init_from):
        if not os.path.isdir(args.init_from):
            raise FileNotFoundError("no such model directory")
        if not os.path.exists(os.path.join(args.init_from, "config.json")):
            raise FileNotFoundError("no config.json in it: not a model directory (train --out, or "
                                    "transformer convert --out)")
        args.initial = load_for_inference(args.init_from)
    if args.initial[0].stored_precision != "fp32":
        raise FlagError(f"--init-from {args.init_from}: an int8 model (its weights rounded for decoding) "
                        "cannot be trained; start from the float32 model it was quantized from")
    positions = args.initial[0].cfg.max_len
    if args.max_sentence_tokens is not None and args.max_sentence_tokens > positions - 1:
        # left out, the default is cut to fit the model's positions (train_on_data); given, it is a
        # request the model cannot honour
        raise FlagError(f"--max-sentence-tokens {args.max_sentence_tokens}: the model in --init-from "
                        f"{args.init_from} has {positions} positions, so at most {positions - 1}")


def load_resume(args):
    """With --resume: load the checkpoint once and take the trajectory arguments from it. A
    trajectory flag given with another value than the interrupted run's is refused (FlagError),
    and so is any flag the run would not read (refuse_flags_that_do_not_apply)."""
    args.initial = None
    directory = prepared_dir(args) if args.data else None
    if directory is not None:
        held = check_prepared_flags(args, directory)
    if not args.resume:
        args.checkpoint = None
        refuse_flags_that_do_not_apply(args, has_data(args))
        if directory is not None:          # a new run takes the prepared split and vocabulary size
            for key, value in held.items():
                if getattr(args, key, None) is None and not (key == "vocab_size" and getattr(args, "init_from", None)):
                    setattr(args, key, value)
        if getattr(args, "init_from", None):
            load_initial_model(args)
        return
    if getattr(args, "init_from", None):
        raise FlagError(f"--init-from {args.init_from}: a resumed run continues the weights of its "
                        f"checkpoint ({args.resume}); --init-from starts a new run (with --out)")
    ckpt = load_checkpoint(args.resume)
    if "schedule" not in ckpt.args:
        ckpt.args["schedule"] = "noam"     # written before the budget schedule existed
    started_on_data = ckpt.args.get("data") or ckpt.args.get("src_file")
    if has_data(args) and "data" in ckpt.args and not started_on_data:
        raise FlagError(f"--data {describe_data(args)}: the run in {args.resume} trained on the built-in task; "
                        "start a new run (--out) to train on data")
    refuse_flags_that_do_not_apply(args, has_data(args) or started_on_data)
    if started_on_data:
        ckpt.args.setdefault("bpe_dropout", 0.0)   # written before --bpe-dropout: it trained without
    moved = has_data(args)
    for key in TRAJECTORY_ARGS:
        if key in ("data", "src_file", "tgt_file") and moved:
            continue           # the same corpus may have moved (or been prepared meanwhile)
        if directory is not None and key in CORPUS_READING_FLAGS:
            continue           # how the files were read: the prepared directory's business
        # a checkpoint written before the dropout-by-site flags existed has no word of them, and
        # its model's config holds what it trained with (unset): compared with that, not ignored
        if key in ckpt.args or key in DROPOUT_FLAGS:
            given, started = getattr(args, key, None), started_with(ckpt, key)
            if given is not None and given != started:
                was = "without it" if started is None else f"with {started}"
                raise FlagError(f"{flag_name(key)} {given}: the run in {args.resume} started {was}, and a resumed "
                                "run keeps its settings (leave the flag out, or start a new run with --out)")
            setattr(args, key, ckpt.args.get(key))
    if "curriculum" not in ckpt.args and getattr(args, "curriculum", None) is not None:
        # written before --curriculum existed: its plan, fixed at step 1, has no curriculum
        raise FlagError(f"--curriculum {args.curriculum}: the run in {args.resume} started without it, and a "
                        "resumed run keeps its settings (leave the flag out, or start a new run with --out)")
    args.checkpoint = ckpt


def resume_or_new(args, make_model, src_tokenizer, tgt_tokenizer):
    if args.checkpoint is not None:
        ckpt = args.checkpoint
        model, optimizer = ckpt.model, ckpt.optimizer
        state = TrainState(**ckpt.train_state)
        return model, optimizer, ckpt.src_tokenizer, ckpt.tgt_tokenizer, state
    model = make_model()
    optimizer = Adam(model, lr=0.0, betas=(0.9, 0.98), eps=1e-9)
    return model, optimizer, src_tokenizer, tgt_tokenizer, TrainState()


def default_out_dir(args):
    """Where a run without --out (or --resume) writes: runs/builtin, or runs/<first data file's name>."""
    if not has_data(args):
        return "runs/builtin"
    first = (data_specs(args.data) or [args.src_file or args.tgt_file])[0]
    name = os.path.basename(os.path.normpath(first.split(",")[0]))
    for suffix in (".gz", ".tsv", ".txt"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[:-len(suffix)]
    return "runs/" + os.path.splitext(name)[0]


def prepare_out_dir(args):
    """Sets args.out (--resume's directory, or the default) and makes it; the directories this
    made, the deepest first."""
    if args.resume and not args.out:
        args.out = args.resume
    if not args.out:
        args.out = default_out_dir(args)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise NotADirectoryError(f"{args.out}: a file, not a directory (--out is the directory a run writes "
                                 f"its checkpoint and model to)")
    created, path = [], os.path.abspath(args.out)
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        created.append(path)
        path = os.path.dirname(path)
    os.makedirs(args.out, exist_ok=True)
    return created
