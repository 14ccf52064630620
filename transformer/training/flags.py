"""The `train` command's flags as a run reads them: which apply to it (the built-in task or a corpus),
which fix its trajectory (a resumed run keeps them), the defaults that depend on other flags, and
the model sizes they give."""
import argparse

from ..config import DATA_RUN_MODEL, PRESETS, TRAIN_DEFAULTS, ModelConfig
from ..errors import FlagError, blame
from . import precision


# The flags that set a model's shape: with none of them (and no --preset), a run on data sizes its
# model to its budget (--preset auto, training/sizing.py).
SHAPE_FLAGS = ("d_model", "n_heads", "d_ff", "n_encoder_layers", "n_decoder_layers")
SIZE_FLAGS = ("d_model", "n_heads", "d_ff", "n_encoder_layers", "n_decoder_layers", "dropout", "activation",
              "norm_first", "tie_embeddings", "attention_dropout", "activation_dropout", "word_dropout",
              "norm", "fix_norm")
# The config fields that only training reads (ModelConfig: dropout by site): a run fine-tuning
# --init-from's model may set them, and a resumed run keeps them (TRAJECTORY_ARGS).
DROPOUT_FLAGS = ("dropout", "attention_dropout", "activation_dropout", "word_dropout")


def model_config_from_args(args, src_vocab, tgt_vocab, max_len):
    preset = dict(PRESETS[args.preset])
    for name in SIZE_FLAGS:
        value = getattr(args, name, None)
        if value is not None:
            preset[name] = value
    return ModelConfig(src_vocab_size=src_vocab, tgt_vocab_size=tgt_vocab, max_len=max_len, **preset)


# What a run's trajectory depends on: taken from the checkpoint when resuming, so that the resumed
# run repeats the uninterrupted one. Everything else (--max-steps, --minutes, --threads, --out,
# evaluation and checkpoint frequency) may change between runs.
TRAJECTORY_ARGS = ("data", "src_file", "tgt_file", "src_col", "tgt_col", "header", "bpe_sample", "src_lang",
                   "tgt_lang", "seed", "batch_size", "batch_tokens", "warmup",
                   "schedule", "lr", "lr_scale", "label_smoothing", "clip_norm", "vocab_size", "max_sentence_tokens",
                   "dev_fraction", "dev_max", "preset", "curriculum", "bpe_dropout") + SIZE_FLAGS


# Flags that only the runs on --data read, and those that only the built-in task reads.
DATA_ONLY_ARGS = ("src_col", "tgt_col", "header", "bpe_sample", "src_lang", "tgt_lang", "batch_tokens", "vocab_size", "max_sentence_tokens", "dev_fraction",
                  "dev_max", "samples", "init_from", "curriculum", "bpe_dropout")
BUILTIN_ONLY_ARGS = ("batch_size",)


def flag_name(key):
    return "--" + key.replace("_", "-")


def refuse_flags_that_do_not_apply(args, data):
    """A flag the run would not read is refused (FlagError), not silently ignored."""
    for key in DATA_ONLY_ARGS:
        if not data and getattr(args, key, None) is not None:
            raise FlagError(f"{flag_name(key)} applies only with --data (the built-in task generates its own "
                            "sentences, vocabulary and batches)")
    for key in BUILTIN_ONLY_ARGS:
        if data and getattr(args, key, None) is not None:
            raise FlagError(f"{flag_name(key)} applies only to the built-in task; with --data, batches hold "
                            "--batch-tokens tokens")


def has_data(args):
    """Whether the run trains on a corpus (--data, or --src-file and --tgt-file)."""
    return bool(data_specs(getattr(args, "data", None)) or getattr(args, "src_file", None)
                or getattr(args, "tgt_file", None))


def data_specs(data):
    """--data's values as a list (a run written before --data took several has one str)."""
    if not data:
        return []
    return [data] if isinstance(data, str) else list(data)


def describe_data(args):
    """The corpus as the command line named it, for messages."""
    parts = data_specs(args.data)
    if getattr(args, "src_file", None):
        parts.append(f"--src-file {args.src_file} --tgt-file {args.tgt_file}")
    return " ".join(parts)


def corpus_blame(args):
    """blame() for the corpus's flag: --data (with its value when it is one file) or --src-file."""
    specs = data_specs(args.data)
    for flag, given in (("--src-file", getattr(args, "src_file", None)), ("--tgt-file", getattr(args, "tgt_file", None))):
        if given and not specs:
            return blame(flag)
    return blame("--data", specs[0] if len(specs) == 1 else None)


def apply_defaults(args):
    """The defaults that depend on other flags (and, with --resume, on the checkpoint), and those
    left out of the parser so that a flag given can be told from one left out (config.TRAIN_DEFAULTS)."""
    if args.eval_limit is not None and not args.eval_every:
        raise FlagError("--eval-limit sets how many dev sentences periodic evaluation translates: it "
                        "needs --eval-every N")
    if has_data(args) and args.dev_fraction == 0:   # no dev split: what reads one would do nothing
        for flag, value in (("--eval-every", args.eval_every), ("--dev-max", args.dev_max)):
            if value:
                raise FlagError(f"{flag} {value}: --dev-fraction 0 holds no pairs out, so there is no dev "
                                "split to evaluate on")
    shapes = [flag_name(key) for key in SHAPE_FLAGS if getattr(args, key, None) is not None]
    if args.preset == "auto" and args.checkpoint is None:
        if not has_data(args):
            raise FlagError("--preset auto sizes a model to a corpus and a budget: it applies only with --data "
                            "(the built-in task trains tiny)")
        if shapes:
            raise FlagError(f"--preset auto picks the model's shape, and {' '.join(shapes)} sets it: give one or "
                            "the other")
    if args.preset is None and has_data(args) and args.checkpoint is None and getattr(args, "init_from", None) is None \
            and not shapes:
        args.preset = "auto"     # sized to the budget once the corpus is open (training/sizing.py)
    for key, value in TRAIN_DEFAULTS.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.schedule is None:
        args.schedule = "noam" if not has_data(args) else "budget"
    if has_data(args) and getattr(args, "bpe_dropout", None) is None:
        args.bpe_dropout = 0.0      # off unless asked for: it lost on the Bible, level on Tatoeba (docs/training.md)
    if args.norm_first is None and has_data(args) and args.checkpoint is None:
        # Pre-LN escapes the early unigram plateau sooner: on the Bible corpus, preset small, 150
        # steps of the budget schedule, dev loss 6.00 against post-LN's 6.28 (same data and seed).
        args.norm_first = DATA_RUN_MODEL["norm_first"]
    if has_data(args) and args.checkpoint is None and getattr(args, "init_from", None) is None:
        # ScaleNorm with FixNorm ("Transformers without Tears"), as a run on data trains pre-LN: on
        # the Bible, tiny, 6,600 steps, 5 seeds, +1.86 BLEU greedy [+1.46, +2.32] and +1.49 beam 4
        # at equal steps, each step 1.01-1.02x; on Tatoeba level in BLEU, dev loss 3.64-3.73
        # against 4.23-4.36 (benchmarks/notes/2026-12-04-scalenorm-fixnorm-levers-bible.md); ten
        # minutes, +2.05 BLEU over 572e4d1's defaults (notes/2026-12-05-scalenorm-defaults-ten-minutes.md).
        # FixNorm comes with ScaleNorm, as the paper pairs them: --norm layer alone is the LayerNorm model.
        if args.norm is None:
            args.norm = DATA_RUN_MODEL["norm"]
        if args.fix_norm is None:
            args.fix_norm = DATA_RUN_MODEL["fix_norm"] and args.norm == "scale"
    if args.precision == "int8":
        raise FlagError("--precision int8 is for decoding (translate, evaluate); train takes auto, fp32 or bf16 "
                        "(bf16: every GEMM's operands in bfloat16, weights and optimizer in float32)")
    started = args.checkpoint.args.get("precision") if args.checkpoint is not None else None
    if args.precision is None and started:   # resume: the interrupted run's precision, unless asked for another
        args.precision, args.precision_why = started, f"the run's own, from its checkpoint in {args.resume}"
    else:                                    # a new run: auto (the default) decided on this CPU
        from .world import rank_zero_decides   # (world.py imports this module)

        requested = args.precision or "auto"
        args.precision, args.precision_why = rank_zero_decides(args, lambda: precision.resolve(requested))
    if args.minutes is None and args.max_steps is None:
        plan = args.checkpoint.train_state.get("schedule") if args.checkpoint is not None else None
        if plan and "budget_seconds" in plan:        # resume: finish the interrupted run's budget
            spent = args.checkpoint.train_state.get("seconds", 0.0)
            args.minutes = max(plan["budget_seconds"] - spent, 0.0) / 60.0
        elif plan and "total" in plan:
            args.max_steps = plan["total"]
        elif has_data(args):
            args.minutes = 10.0
        else:   # the built-in task trains until it has learned it (builtin.Goal), within a cap
            from .builtin import CAP_MINUTES, GOAL_EXACT
            args.minutes, args.goal_exact = CAP_MINUTES, GOAL_EXACT
    if args.preset == "auto":
        world = getattr(args, "world", None)
        if args.minutes is None:
            args.preset, args.size_why = "tiny", "--max-steps without --minutes: no time budget to size the model to"
        elif world is not None and world[1] > 1:
            args.preset, args.size_why = "tiny", f"{world[1]} data-parallel ranks: sizing measures one process"
    if args.warmup is None and args.schedule == "noam":
        args.warmup = 300 if not has_data(args) else 4000
    if args.checkpoint is None and getattr(args, "initial", None) is None:
        try:        # the sizes, checked before any data is read or vocabulary learned
            model_config_from_args(args if args.preset != "auto" else argparse.Namespace(**{**vars(args), "preset": "tiny"}),
                                   16, 16, max_len=args.max_sentence_tokens + 1)
        except ValueError as exc:
            raise FlagError(f"model sizes: {exc}") from None
    check_curriculum(args)
    if args.keep_best and not args.eval_every:
        raise FlagError("--keep-best keeps the model of the best dev loss: it needs --eval-every N")
    if args.schedule == "budget" and args.warmup is not None and args.max_steps is not None \
            and args.warmup > args.max_steps:
        raise FlagError(f"--warmup {args.warmup}: longer than the run (--max-steps {args.max_steps}); the budget "
                        "schedule would cut it short")
    if args.keep_best and args.max_steps is not None and args.eval_every > args.max_steps:
        raise FlagError(f"--keep-best with --eval-every {args.eval_every}: the run stops at --max-steps "
                        f"{args.max_steps}, before the first evaluation")
    if args.keep_best and has_data(args) and args.dev_fraction == 0:
        raise FlagError("--keep-best compares the dev loss, and --dev-fraction 0 holds no pairs out")
    if args.max_steps is not None and args.checkpoint is not None:
        done = args.checkpoint.train_state.get("step", 0)
        if args.max_steps <= done:
            raise FlagError(f"--max-steps {args.max_steps}: the run in {args.resume} has already trained "
                            f"{done} steps (--max-steps counts from the start of the run)")
    if args.snapshot_every and not args.average_last:
        raise FlagError("--snapshot-every only applies with --average-last K")
    if args.lr is not None and args.schedule != "budget":
        raise FlagError("--lr sets the peak of the budget schedule; with --schedule noam use --lr-scale")


def check_curriculum(args):
    """--curriculum against the run's budget (FlagError naming it): a fraction needs a planned step
    count. A step count beyond the run's is allowed (a noam run may be resumed further); its log
    line says so."""
    value = getattr(args, "curriculum", None)
    if value is None or (args.checkpoint is not None and args.checkpoint.train_state.get("schedule")):
        return               # off, or a resumed run's: its length is in the plan of its checkpoint
    if isinstance(value, float) and args.schedule == "noam" and args.max_steps is None:
        raise FlagError(f"--curriculum {value:g}: a fraction of the planned steps, and --schedule noam plans no "
                        "step count without --max-steps; give the curriculum's length in steps")
