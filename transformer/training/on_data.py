"""A run on a corpus: the prepared corpus opened and checked against the run, the model made (or
resumed, or fine-tuned from --init-from), trained, evaluated and shown translating."""
import json

from ..config import ModelConfig
from ..errors import FlagError, blame
from ..model import Seq2SeqTransformer
from ..optim import clip_grad_norm
from . import sizing
from .data import choose_languages, open_corpus
from .flags import DROPOUT_FLAGS, describe_data, model_config_from_args
from .loop import Trainer, TrainState
from .memory import check_step_memory
from .report import describe, rounded, say
from .resume import resume_or_new
from .world import agree_across_ranks, data_parallel, describe_world, ranks_sharing_memory


def train_on_data(args, engine=None, result=None):
    """Train a translation model on a corpus (corpus.PreparedCorpus: prepared once, memory-mapped).

    `engine` (for comparisons) replaces our model: a callable cfg -> (model, optimizer, clip) whose
    model offers our training interface; it gets exactly the same data, batches and schedule.
    `result`, a dict, receives the final record and the trainer (for benchmarks)."""
    from ..corpus import TrainingSet

    initial = getattr(args, "initial", None)
    given = None
    if args.checkpoint is not None:
        given = {"src": args.checkpoint.src_tokenizer, "tgt": args.checkpoint.tgt_tokenizer}
    elif initial is not None:            # fine-tuning: the model's own tokenizers, no new BPE
        given = {"src": initial[1], "tgt": initial[2]}
    corpus = open_corpus(args, given)
    fingerprint = corpus.pairs_fingerprint[:16]
    agree_across_ranks(args, fingerprint)
    started = None if args.checkpoint is None else args.checkpoint.args.get("data_fingerprint")
    if started is not None and started != fingerprint:
        raise FlagError(f"--data {describe_data(args)}: not the pairs the run in {args.resume} trained on (their "
                        f"fingerprint {fingerprint}, the run's {started}; --src-col and --tgt-col are the run's). A "
                        "resumed run continues on its own data; a moved or renamed copy of it is fine. Start a new "
                        "run (--out, or --init-from) to train on other data")
    args.data_fingerprint = fingerprint   # kept in the checkpoint's args for that check
    choose_languages(args, corpus.manifest)
    if args.checkpoint is None and initial is None:     # the size chosen, kept with the run's flags
        args.vocab_size = corpus.manifest["bpe"].get("vocab_size", args.vocab_size)
    if initial is not None:
        say(f"fine-tuning {args.init_from}: its vocabularies (source {initial[1].vocab_size}, "
             f"target {initial[2].vocab_size})")
    src_tok, tgt_tok = (given["src"], given["tgt"]) if given is not None else (corpus.src_tokenizer,
                                                                             corpus.tgt_tokenizer)

    # the ids of the model the run trains: a checkpoint's, the --init-from model's or a new one's
    known = args.checkpoint.model.cfg if args.checkpoint is not None else (
        initial[0].cfg if initial is not None else ModelConfig())
    max_tokens = args.max_sentence_tokens
    if args.checkpoint is not None or initial is not None:
        max_tokens = min(max_tokens, known.max_len - 1)
    bpe_dropout = getattr(args, "bpe_dropout", None) or 0.0
    with blame("--bpe-dropout", bpe_dropout):
        data = TrainingSet(corpus, max_tokens, args.batch_tokens, args.seed, known.bos_id, known.eos_id,
                           known.pad_id, bpe_dropout=bpe_dropout)
    if bpe_dropout:
        say(f"BPE-dropout {bpe_dropout:g}: each pass over the data segments the training pairs anew, each merge "
            "skipped with that probability (the dev pairs and translations keep the plain segmentation)")
    if data.dropped:
        say(f"skipped {data.dropped} training pairs that are empty after tokenisation or longer than "
             f"{max_tokens} subwords")
    if not len(data):
        with blame("--data", describe_data(args)):
            raise ValueError(f"no training pairs left after tokenisation (--max-sentence-tokens {max_tokens})")

    ranks = ranks_sharing_memory(args)      # every rank, here: a collective under mpirun
    sized = None
    if args.preset == "auto":      # no size flag: the shape this budget trains best (training/sizing.py)
        sized = sizing.size_run(args, data, src_tok.vocab_size, tgt_tok.vocab_size, max_tokens + 1, engine)
    elif getattr(args, "size_why", None):
        say(f"model size: {args.preset} ({args.size_why}; --preset or a size flag to choose)")

    def make_model():
        if initial is not None:
            # the rates given; the model's stored ones otherwise (the residual rate: choose_dropout)
            given = {key: getattr(args, key) for key in DROPOUT_FLAGS if getattr(args, key, None) is not None}
            if given:
                initial[0].set_dropout_rates(**given)
            return initial[0]
        cfg = model_config_from_args(args, src_tok.vocab_size, tgt_tok.vocab_size, max_len=max_tokens + 1)
        return Seq2SeqTransformer(cfg, seed=args.seed)

    clip, dp = clip_grad_norm, None
    if engine is None:
        # before the model and the optimizer take their part: the model's sizes are known
        check_step_memory(known if args.checkpoint is not None or initial is not None else
                          model_config_from_args(args, src_tok.vocab_size, tgt_tok.vocab_size, max_len=max_tokens + 1),
                          data, args.batch_tokens, *ranks)
        model, optimizer, src_tok, tgt_tok, state = resume_or_new(args, make_model, src_tok, tgt_tok)
        dp = data_parallel(args, model, optimizer)
    else:
        cfg = model_config_from_args(args, src_tok.vocab_size, tgt_tok.vocab_size, max_len=max_tokens + 1)
        (model, optimizer, clip), state = engine(cfg), TrainState()
    dev_pairs = corpus.dev
    trainer = Trainer(args, model, optimizer, src_tok, tgt_tok, data, dev_pairs, state, clip=clip,
                      checkpoints=engine is None, dp=dp)
    say(describe(model) + describe_world(dp))
    status = trainer.run()
    if status or not trainer.leader:
        return status
    metrics = trainer.evaluate()
    averaged = trainer.model_for_inference
    if averaged is not None:           # report the raw final weights and the average side by side
        with trainer.scoring(averaged):
            metrics = {"final": rounded(metrics), **trainer.evaluate()}
    record = {"step": trainer.state.step, "seconds": round(trainer.state.seconds, 1),
              "tokens": trainer.state.tokens, **rounded(metrics)}
    if trainer.curriculum_steps() is not None:     # the step the length curriculum ended (or ends) at
        record["curriculum_steps"] = trainer.curriculum_steps()
    if sized is not None:               # the figures behind the size: each candidate's step and prediction
        record["size"] = sized.record()
    print(json.dumps(record))
    if result is not None:
        result.update(record=record, trainer=trainer)
    samples = [s for s, _ in dev_pairs[:5]] + list(args.samples or [])
    with trainer.scoring(trainer.model if averaged is None else averaged):   # the model saved in --out
        for src, hyp in zip(samples, trainer.translate(samples)):
            print(f"  {src}  ->  {hyp}")
    return 0
