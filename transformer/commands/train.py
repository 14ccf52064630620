"""`transformer train`: its flags, the world under mpirun, and the checks of --resume and --out
before the run (transformer/train.py, transformer/training)."""
import argparse
import os

from ..config import PRESETS, DROPOUT_FREE_PASSES, HEAVY_DROPOUT, HEAVY_DROPOUT_PASSES, TRAIN_DEFAULTS
from ..errors import FlagError, blame
from .flags import (DATA_HELP, _at_least_two, _corpus_flags, _curriculum, _fraction, _language_code,
                    _non_negative_float, _non_negative_int, _positive_float, _positive_int, _split_flags,
                    _vocabulary_flags)
from .models import _check_out_dir
from .world import _apply_threads, _mpi_world, _rank_share


def _threads_per_rank(args, world):
    """Ranks x threads must not oversubscribe the cores: the default is this rank's share of the
    cores it may run on; a --threads that would oversubscribe is refused."""
    cores, sharing = world[3], world[4]
    bound, share = _rank_share(world)
    if args.threads is None:
        args.threads = share
        return
    if args.threads > share:
        from .. import cores as usable

        whose = "the same" if bound else "this machine's"
        how = (f"this rank is bound to {len(cores)} core{'s' if len(cores) > 1 else ''}" if sharing == 1 else
               f"{sharing} ranks share {whose} {len(cores)} cores")
        limit = usable.cpu_limit()
        if limit is not None and usable.limit_cores(limit) < len(cores):
            how += f" under a cgroup CPU limit of {limit:g} CPU{'s' if limit != 1 else ''}"
        raise FlagError(f"--threads {args.threads}: {how}, so {args.threads} threads a rank would oversubscribe "
                        f"them (at most {share}; or bind each rank to more cores: MPICH `mpiexec -bind-to "
                        f"core:{args.threads}`, Open MPI `mpirun --map-by slot:PE={args.threads}`)")


def run(args):
    from .. import train
    from ..training import report

    world = _mpi_world()
    if world is not None:
        args.world = world[:2]
        report.SILENT = world[0] != 0
        if world[0] != 0:
            args.quiet = True
        _threads_per_rank(args, world)
    _apply_threads(args)
    with blame("--resume", args.resume):
        if args.resume and not os.path.exists(args.resume):
            raise FileNotFoundError("no such directory")
        if args.resume and os.path.isdir(args.resume) and not os.path.exists(
                os.path.join(args.resume, "checkpoint.safetensors")):
            raise FileNotFoundError("no checkpoint.safetensors in it: not the --out of a training run")
        train.load_resume(args)
    train.apply_defaults(args)
    builtin_default = args.out is None and args.resume is None and not train.has_data(args)
    if world is None or world[0] == 0:    # rank 0 writes --out; the others may start after it has
        _check_train_out(args, builtin_default)
    with blame("--out", args.out):
        created = train.prepare_out_dir(args)
    try:
        if train.has_data(args):
            return train.train_on_data(args)
        return train.train_builtin(args)
    except BaseException:
        if world is None or world[0] == 0:   # a run that failed before writing anything leaves no
            for directory in created:          # empty --out behind (nor the runs/ made for it)
                try:
                    os.rmdir(directory)
                except OSError:   # not empty: what it wrote stays
                    break
        raise


def _check_train_out(args, builtin_default):
    """A new run does not write over another run's checkpoint or model: --resume continues it,
    --overwrite replaces it. The built-in task's default directory (a two-minute demo) is the
    exception, so that `transformer train` can be run again."""
    from ..training.resume import default_out_dir

    out = args.out or args.resume or default_out_dir(args)
    if args.resume is not None and os.path.realpath(out) == os.path.realpath(args.resume):
        return
    if builtin_default:
        return
    _check_out_dir(out, [("--init-from", getattr(args, "init_from", None))], args.overwrite)


def register(sub):
    train = sub.add_parser("train", help="train a translation model (no --data: the built-in task)")
    _corpus_flags(train, DATA_HELP + "; or a directory of `transformer prepare`. Prepared once into a cache "
                  "($TRANSFORMER_CACHE/prepared) and reused while the files and settings are the same")
    train.add_argument("--src-lang", metavar="CODE", type=_language_code,
                       help="with --data: the source language's code, written beside the model for `serve` "
                            "(default: the source column's header name or file extension, when it is a code)")
    train.add_argument("--tgt-lang", metavar="CODE", type=_language_code, help="the target language's code (as --src-lang)")
    train.add_argument("--out", help="output directory for checkpoints and the model (one that holds another "
                       "run or model is refused without --overwrite)")
    train.add_argument("--overwrite", action="store_true",
                       help="let a new run replace the run or model in --out")
    train.add_argument("--resume", metavar="DIR", help="continue the run whose checkpoint is in DIR")
    train.add_argument("--init-from", dest="init_from", metavar="DIR",
                       help="with --data: fine-tune the model in DIR (a training run's --out, or a MarianMT "
                            "model imported with `transformer convert --from marian`) with its own "
                            "tokenizers; its sizes are the run's")
    train.add_argument("--preset", choices=["auto", *PRESETS],
                       help="model sizes. auto (the default with --data and a time budget): each shape's step "
                            "measured in the first seconds of the budget, and the one whose learning curve is "
                            "highest at the steps left trained; tiny otherwise. Any size flag overrides it")
    train.add_argument("--d-model", dest="d_model", type=_positive_int)
    train.add_argument("--n-heads", dest="n_heads", type=_positive_int)
    train.add_argument("--d-ff", dest="d_ff", type=_positive_int)
    train.add_argument("--n-encoder-layers", dest="n_encoder_layers", type=_positive_int)
    train.add_argument("--n-decoder-layers", dest="n_decoder_layers", type=_positive_int)
    train.add_argument("--dropout", type=_fraction,
                       help=f"the rate of the embeddings and of each sublayer's output before its residual add, "
                            f"and of the sites below left unset. Default with --data: 0 when the budget sees the "
                            f"training pairs fewer than {DROPOUT_FREE_PASSES:g} times, {HEAVY_DROPOUT:g} when it "
                            f"sees them {HEAVY_DROPOUT_PASSES:g} times or more, else 0.1; 0 for the built-in task")
    train.add_argument("--attention-dropout", dest="attention_dropout", type=_fraction, metavar="P",
                       help="dropout on the attention weights (default: --dropout's rate, or the rate the rule "
                            "above picks without it; given, it stays as given whatever the rule picks)")
    train.add_argument("--activation-dropout", dest="activation_dropout", type=_fraction, metavar="P",
                       help="dropout on the feed-forward hidden activation (default: that of the attention weights, above)")
    train.add_argument("--word-dropout", dest="word_dropout", type=_fraction, metavar="P",
                       help="source word dropout (Marian's --dropout-src): each source token's word embedding "
                            "zeroed with this probability, its position kept (default 0; the rule never sets it)")
    train.add_argument("--bpe-dropout", dest="bpe_dropout", type=_fraction, metavar="P",
                       help="with --data: BPE-dropout (Provilkov et al., 2020): each pass over the data segments the "
                            "training pairs anew, each BPE merge skipped with probability P (0.1 in the paper); dev "
                            "pairs and translations keep the plain segmentation. Default 0 (off)")
    train.add_argument("--activation", choices=["relu", "gelu", "silu"])
    train.add_argument("--tie-embeddings", dest="tie_embeddings", choices=["none", "target"],
                       help="target: the output projection is the target embedding matrix (one matrix, "
                            "its gradient summed over both uses; default none)")
    train.add_argument("--norm-first", dest="norm_first", action=argparse.BooleanOptionalAction, default=None,
                       help="layer norm before each sublayer (pre-LN; the default with --data) or after it "
                            "(--no-norm-first: the paper's post-LN; the default for the built-in task)")
    train.add_argument("--norm", choices=["layer", "scale"],
                       help="scale: ScaleNorm (Nguyen & Salazar, 2019) wherever a layer norm would be: x * g / "
                            "||x||, one learned g per norm, started at sqrt(d_model) (default: scale for a new run "
                            "on --data; layer for the built-in task)")
    train.add_argument("--fix-norm", dest="fix_norm", action=argparse.BooleanOptionalAction, default=None,
                       help="FixNorm (Nguyen & Chiang, 2018): the embedding tables and the output projection read "
                            "with every row at unit length, as 'Transformers without Tears' pairs it with "
                            "--norm scale (default: on with --norm scale in a new run on --data, else off)")
    train.add_argument("--max-steps", type=_positive_int)
    train.add_argument("--minutes", type=_positive_float, help="wall-clock budget (default 10 with --data; the built-in task "
                       "trains until it reverses 99%% of fresh words, within 10; periodic evaluation is not counted; with --resume: what the interrupted run had left)")
    train.add_argument("--threads", type=_positive_int)
    train.add_argument("--batch-tokens", type=_positive_int,
                       help=f"with --data: tokens per batch, padding included (default {TRAIN_DEFAULTS['batch_tokens']}); "
                            "refused at the start when a step on the first pass's largest batch cannot fit the "
                            "memory (the machine's, or a cgroup's limit)")
    train.add_argument("--curriculum", type=_curriculum, metavar="STEPS",
                       help="with --data: a length curriculum (competence-based, Platanios et al. 2019) over "
                            "the first STEPS steps, or over this fraction of the planned steps (0.2: the first "
                            "fifth): step t draws its batch from the shortest c(t) of the training pairs, "
                            "c(t) = min(1, sqrt(t (1 - c0^2) / STEPS + c0^2)), c0 = 0.01; then the usual "
                            "order (default: off)")
    train.add_argument("--batch-size", type=_positive_int,
                       help=f"built-in task: sentences per batch (default {TRAIN_DEFAULTS['batch_size']})")
    train.add_argument("--precision", choices=["auto", "fp32", "bf16", "int8"],
                       help="auto (default): bf16 where the CPU multiplies bfloat16 natively (AMX, avx512_bf16) and "
                            "a probe at the start finds its products at least 1.1x as fast as fp32's, "
                            "fp32 elsewhere. fp32, or bf16 mixed precision: every GEMM of forward and backward "
                            "multiplies bfloat16 operands with float32 sums; weights, gradients, Adam, "
                            "softmax, layer norm and loss stay float32, and checkpoints are the same. "
                            "With --resume: the interrupted run's precision unless given")
    train.add_argument("--schedule", choices=["budget", "noam"],
                       help="learning-rate schedule. budget (default with --data): warm-up over the first "
                            "5%% of the budget (--max-steps, or --minutes divided by a measured step time), "
                            "then linear decay to its end; noam (default for the built-in task): the "
                            "paper's inverse-square-root schedule with --warmup steps")
    train.add_argument("--warmup", type=_positive_int,
                       help="warm-up steps (noam: default 300 built-in, 4000 with --data; budget: 5%% of the budget)")
    train.add_argument("--lr", type=_positive_float, help="peak learning rate of the budget schedule (default 0.032 * d_model^-0.5: 2e-3 for small)")
    train.add_argument("--lr-scale", type=_positive_float,
                       help=f"factor on the learning-rate schedule (default {TRAIN_DEFAULTS['lr_scale']})")
    train.add_argument("--label-smoothing", type=_fraction, help=f"default {TRAIN_DEFAULTS['label_smoothing']}")
    train.add_argument("--clip-norm", type=_non_negative_float,
                       help=f"clip gradients to this global norm (0: off; default {TRAIN_DEFAULTS['clip_norm']})")
    _vocabulary_flags(train)
    train.add_argument("--max-sentence-tokens", type=_positive_int,
                       help="with --data: longer training pairs are skipped; also the model's positions "
                            f"(default {TRAIN_DEFAULTS['max_sentence_tokens']})")
    _split_flags(train)
    train.add_argument("--eval-every", type=_non_negative_int, default=0,
                       help="evaluate every N steps (0: only at the end)")
    train.add_argument("--eval-limit", type=_positive_int,
                       help=f"dev sentences used by periodic evaluation (default {TRAIN_DEFAULTS['eval_limit']})")
    train.add_argument("--save-every", type=_non_negative_int, default=0, help="checkpoint every N steps")
    train.add_argument("--save-minutes", type=_non_negative_float, default=5.0,
                       help="checkpoint every M minutes (default 5)")
    train.add_argument("--average-last", type=_at_least_two, metavar="K",
                       help="snapshot the weights every --snapshot-every steps and make the saved model "
                            "the average of the last K (the checkpoint keeps the raw weights)")
    train.add_argument("--snapshot-every", type=_positive_int, metavar="N",
                       help="with --average-last: steps between snapshots (default 2.5%% of the planned steps)")
    train.add_argument("--keep-best", action="store_true",
                       help="with --eval-every: also keep the model of the best dev loss in OUT/best")
    train.add_argument("--seed", type=_non_negative_int, help=f"default {TRAIN_DEFAULTS['seed']}")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.add_argument("--samples", nargs="*", metavar="TEXT", help="with --data: also translate these at the end")
    train.set_defaults(func=run)
