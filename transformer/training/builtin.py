"""The default run, with no --data: the built-in task (tasks.ReverseTask) learned in a couple of
minutes, then shown decoding."""
import numpy as np

from ..model import Seq2SeqTransformer
from ..tasks import ReverseTask
from .flags import model_config_from_args
from .loop import Trainer
from .report import describe, say
from .resume import resume_or_new
from .world import agree_across_ranks, data_parallel, describe_world


def train_builtin(args):
    """The default run: learn the reverse task in a couple of minutes, then show it decoding."""
    task = ReverseTask()
    if args.dropout is None:
        args.dropout = 0.0   # every batch is fresh data: nothing to regularise, and it learns 3x faster
    say("No --data given: training on the built-in task (reverse a word and capitalise it, "
         "'attention' -> 'NOITNETTA'), generated in process.")

    def make_model():
        cfg = model_config_from_args(args, task.src_tokenizer.vocab_size, task.tgt_tokenizer.vocab_size,
                                     max_len=task.max_len + 2)
        return Seq2SeqTransformer(cfg, seed=args.seed)

    agree_across_ranks(args, "built-in task")
    model, optimizer, src_tok, tgt_tok, state = resume_or_new(args, make_model, task.src_tokenizer,
                                                               task.tgt_tokenizer)
    dp = data_parallel(args, model, optimizer)
    rng = np.random.default_rng([args.seed, 10**9])
    dev = task.sample(rng, 500)
    trainer = Trainer(args, model, optimizer, src_tok, tgt_tok, None, dev, state, task=task, dp=dp)
    say(describe(model) + describe_world(dp))
    status = trainer.run()
    if status or not trainer.leader:
        return status
    hyps = trainer.translate([s for s, _ in dev])
    exact = np.mean([h == t for h, (_, t) in zip(hyps, dev)])
    chars = np.mean([sum(a == b for a, b in zip(h, t)) / len(t) for h, (_, t) in zip(hyps, dev)])
    print(f"\nafter {trainer.state.step} steps ({trainer.state.seconds:.0f} s): exact-match accuracy on "
          f"{len(dev)} fresh words {exact:.1%}, character accuracy {chars:.1%}")
    for (src, tgt), hyp in list(zip(dev, hyps))[:6]:
        mark = "ok" if hyp == tgt else "  "
        print(f"  {mark} {src:<14} -> {hyp:<14} (expected {tgt})")
    examples = ["attention", "transformer", "encoder", "decoder"]
    for src, hyp in zip(examples, trainer.translate(examples)):
        print(f"     {src:<14} -> {hyp}")
    print(f"\nmodel saved in {args.out}; try: transformer translate --model {args.out} hello world")
    return 0
