"""A model sized to the budget: with no size flag, a run on data measures what a step of each
candidate shape costs on this CPU, at this precision and thread count, in the first seconds of its
budget, and trains the one whose learning curve is highest at the steps the rest of the budget buys.

The curves are measured (benchmarks/notes/2026-12-05-sizing-repeats.md for the default model,
ScaleNorm + FixNorm; 2026-12-01-time-to-quality.md for LayerNorm's): dev BLEU (greedy) against
optimizer steps of the budget schedule on the Bible corpus, 2048-token batches, for each
candidate; a run's quality at a given step does not depend on the CPU or the thread count (the
kernels are deterministic in both), so the curves travel and only the clock is measured here.
Each is fitted as bleu(steps) = A - B * effective_steps(steps) ** -ALPHA, where a step of the
corpus's k-th repeat counts exp(-k / R*) of a fresh one (REPEATS: R* per candidate, the smaller
model's smaller; LayerNorm's curves count every step).

A curve is trusted only as far as it was measured in passes over the training pairs
(MEASURED_PASSES): a step of a pass the candidate was never measured at counts as nothing. Once a
corpus has been seen many times over, more steps stop paying, and how soon depends on the model,
which R* says within the passes measured. Measured: `medium-4-2`'s curve, fitted on a run of
7.4 passes, promised 34.8 BLEU at 22 passes (thirty minutes of an AMX Xeon); the run gave 27.7 (with
dropout 0.3, then the rule's), below ten minutes of `tiny` (28.7). Run again with 0.1 it gave 33.3,
and its range now reaches 22 passes. On a small corpus (Tatoeba's 2,580 pairs, seen ~400 times in
ten minutes) every candidate is judged at the few hundred steps its passes allow, where `tiny`'s
curve is the highest; on a corpus of millions of pairs no cap binds and the curves decide."""
import argparse
import math
import time
from dataclasses import dataclass, field

from ..config import PRESETS

# The shapes a run may pick, cheapest step first. medium-4-2 has a deeper encoder than decoder (the
# decoder runs once per output token when translating, the encoder once per sentence, so it also
# decodes faster than a balanced model of its cost). Measured and left out: tiny-6-2 (d_model 128,
# 6 + 2 layers), 1.5x tiny's step and below tiny's curve at every step of a ten-minute run (dev
# BLEU 23.4 / 26.0 against tiny's 28.7 / 30.8 in the same ten minutes; the note).
CANDIDATES = {
    "tiny": PRESETS["tiny"],
    "medium-4-2": PRESETS["medium-4-2"],
    "small": PRESETS["small"],
}

# bleu(steps) = A - B * effective_steps(steps) ** -ALPHA per candidate, for the default model (pre-LN,
# ScaleNorm + FixNorm, the default since 2026-12-05): dev BLEU (greedy, the periodic evaluations on
# 200 held-out sentences from step 500 on, and each run's final on all 500) on the Bible (468 steps
# a pass), least squares with one ALPHA for all and a repeat constant R* (REPEATS, in passes) for
# each candidate (`python benchmarks/size_curves.py RECORDS...`; the records, the fit's residuals
# and why this form: benchmarks/notes/2026-12-05-sizing-repeats.md). A and B are not asymptotes:
# beyond the runs measured the curves are extrapolations.
#
# Why R*: with one exponent and every step counted alike, tiny's points past 25 passes lay 0.7 BLEU
# below its curve, and the curves put medium-4-2 0.34-0.51 above tiny at thirty minutes of an AMX
# Xeon on the Bible, where two seeds measured 0.86 and 1.02 (tiny was picked). A model that has
# seen the pairs many times gains less from another pass, and the smaller model sooner: tiny's R*
# is 12 passes, medium-4-2's 21. The fit's exponent goes to the grid's floor (MIN_ALPHA, 0.2, in
# size_curves.py); every floor from 0.2 to 0.35 gives the same picks on the Bible.
ALPHA = 0.20
CURVES = {
    "tiny": (81.20, 265.9),
    "medium-4-2": (82.08, 268.9),
    "small": (86.20, 270.6),
}
# The passes over the training pairs each curve was measured to: the longest run fitted, with the
# dropout the run's rule gives (schedule.dropout_for), on the Bible (468 steps a pass). tiny: three
# ten-minute runs (7,456-7,513 steps) and two of 17,300 (thirty minutes of an AMX Xeon, dropout
# 0.1, seeds 0 and 1), 352 points (RMS residual 0.93 BLEU); medium-4-2: two of 10,400 steps (the
# same thirty minutes, dropout 0.1: 34.67 / 36.20 and 34.58 / 36.10 BLEU greedy / beam 4 against
# tiny's 33.65 / 35.27 and 33.72 / 35.41), 82 points (0.81); small: 2,037 steps, 17 points (1.10).
MEASURED_PASSES = {
    "tiny": 37.0,
    "medium-4-2": 22.2,
    "small": 4.4,
}
# R* of each candidate, in passes: small, measured to 4.4 passes, too few repeated ones to fit its
# own, takes medium-4-2's (size_curves.py: the most expensive candidate measured further).
REPEATS = {
    "tiny": 12.2,
    "medium-4-2": 20.9,
    "small": 20.9,
}

# The same for LayerNorm (--norm layer: the paper's model, the default until 2026-12-05), from the
# notes of 2026-12-01, 2026-12-02 and 2026-12-03. tiny: 9 runs of 1500 to 17,300 steps, 236 points
# (RMS residual 1.1 BLEU); medium-4-2: runs of 3460 and 10,400 steps, 34 points (0.8); small: two
# runs of 1018 and 2037 steps (1.0). Passes: tiny 17,300 steps (thirty minutes of an AMX Xeon,
# dropout 0.1); medium-4-2 10,400 (the same thirty minutes, dropout 0.1: 33.32 / 34.73 BLEU greedy /
# beam 4 against tiny's 32.46 / 34.61, dev loss 1.91 against 1.96; an earlier 10,400-step run with
# the 0.3 the rule then gave at 22 passes is not fitted); small 2,037.
LAYER_ALPHA = 0.34
LAYER_CURVES = {
    "tiny": (44.54, 305.0),
    "medium-4-2": (49.10, 348.6),
    "small": (53.42, 390.3),
}
LAYER_MEASURED_PASSES = {
    "tiny": 37.0,
    "medium-4-2": 22.2,
    "small": 4.4,
}
LAYER_REPEATS = {}      # LayerNorm's curves were fitted without it: every step counts
CURVE_NOTES = {"scale": "2026-12-05-sizing-repeats.md", "layer": "2026-12-01-time-to-quality.md"}


def fitted(norm):
    """(ALPHA, CURVES, MEASURED_PASSES, REPEATS) of the model a run trains: LayerNorm's for norm
    "layer", else the default's (a ScaleNorm model without FixNorm was not measured; the default's
    are the nearer)."""
    if norm == "layer":
        return LAYER_ALPHA, LAYER_CURVES, LAYER_MEASURED_PASSES, LAYER_REPEATS
    return ALPHA, CURVES, MEASURED_PASSES, REPEATS


MIN_STEPS = 300         # a candidate the budget gives fewer steps is not worth its probe
TIE = 0.5               # predicted dev BLEU within this of the best: the cheaper candidate wins
PROBE_PASSES = 2        # timed forward/backward passes a candidate (after one untimed, which allocates)


@dataclass
class Choice:
    name: str
    sizes: dict
    step_seconds: float
    rows: list = field(default_factory=list)   # (name, step seconds, steps, predicted BLEU) per candidate
    probe_seconds: float = 0.0
    why: str = None                             # a note on the pick (its prediction capped by the passes)
    curves: str = "scale"                       # whose learning curves judged: fitted()'s "scale" or "layer"

    def record(self):
        return {"picked": self.name, "why": self.why, "curves": self.curves,
                "probe_seconds": round(self.probe_seconds, 2),
                "candidates": [{"name": name, "step_seconds": round(seconds, 4), "steps": steps,
                                "predicted_bleu": round(bleu, 2)} for name, seconds, steps, bleu in self.rows]}

    def describe(self, budget_seconds):
        lines = [f"model size: auto picked {self.name} ({describe_sizes(self.sizes)}) for the "
                 f"{budget_seconds / 60:.1f} minutes left on this CPU; measured in {self.probe_seconds:.1f} s "
                 "(counted in the budget):"]
        lines.append(f"  {'candidate':<12}{'s a step':>10}{'steps':>8}{'predicted dev BLEU':>20}")
        for name, seconds, steps, bleu in self.rows:
            mark = " <" if name == self.name else ""
            lines.append(f"  {name:<12}{seconds:>10.3f}{steps:>8}{bleu:>20.1f}{mark}")
        if self.why:
            lines.append(f"  {self.name}: {self.why}")
        model = "LayerNorm" if self.curves == "layer" else "ScaleNorm + FixNorm"
        lines.append(f"  (learning curves of the {model} model measured on the Bible corpus, "
                     f"benchmarks/notes/{CURVE_NOTES[self.curves]}; --preset or a size flag to choose)")
        return "\n".join(lines)


def describe_sizes(sizes):
    return (f"d_model {sizes['d_model']}, {sizes['n_heads']} heads, d_ff {sizes['d_ff']}, "
            f"{sizes['n_encoder_layers']}+{sizes['n_decoder_layers']} layers")


def effective_steps(steps, steps_per_pass, repeats):
    """What `steps` steps are worth when the corpus is `steps_per_pass` steps a pass: the first pass
    counts in full, and a step of the corpus's k-th repeat exp(-k / repeats) of a fresh one, so that
    the worth of all repeats saturates at `repeats` passes of fresh pairs (the repeated-data form of Muennighoff et
    al., "Scaling Data-Constrained Language Models", 2023, with R* = repeats, in steps instead of
    tokens). repeats None, or no steps_per_pass (a corpus too large to say): every step counts."""
    if repeats is None or not steps_per_pass or steps <= steps_per_pass:
        return float(steps)
    again = steps / steps_per_pass - 1.0
    return steps_per_pass * (1.0 + repeats * -math.expm1(-again / repeats))


def predicted_bleu(name, steps, steps_per_pass=None, norm=None):
    """The candidate's dev BLEU after `steps` steps of a budget schedule planned for them, from its
    fitted curve (the default model's, or LayerNorm's for norm "layer") at the steps' worth on a
    corpus of `steps_per_pass` steps a pass (effective_steps, with the candidate's REPEATS); steps
    past the passes over the training pairs its curve was measured to (MEASURED_PASSES) count as
    those passes."""
    alpha, curves, measured, repeats = fitted(norm)
    a, b = curves[name]
    if steps_per_pass:
        steps = min(steps, measured[name] * steps_per_pass)
    worth = effective_steps(max(steps, 1), steps_per_pass, repeats.get(name))
    return max(a - b * worth ** -alpha, 0.0)


def pick(rows):
    """The candidate (of rows: name, step seconds, steps, predicted BLEU; cheapest first) with the
    best prediction, the cheapest within TIE of it."""
    best = max(bleu for *_, bleu in rows)
    return next(row for row in rows if row[3] >= best - TIE)


def choose(budget_seconds, step_seconds_of, steps_per_pass=None, max_steps=None, clock=time.monotonic,
           norm=None, fits=None):
    """The Choice for a budget: step_seconds_of(name, sizes) measures a candidate's step; the
    candidates are tried cheapest first, and none after one the budget gives fewer than MIN_STEPS.
    norm: the run's normalisation, whose curves judge the candidates (fitted). fits(name, sizes):
    False for a candidate whose step is past the memory, which ends the list before it is measured."""
    measured = fitted(norm)[2]
    started = clock()
    rows = []
    for name, sizes in CANDIDATES.items():
        if fits is not None and not fits(name, sizes):
            break
        seconds = step_seconds_of(name, sizes)
        left = budget_seconds - (clock() - started)
        steps = max(int(left / seconds), 0)
        if max_steps is not None:
            steps = min(steps, max_steps)
        if rows and steps < MIN_STEPS:
            break
        rows.append((name, seconds, steps, predicted_bleu(name, steps, steps_per_pass, norm)))
    name, seconds, steps, _ = pick(rows)
    why = None
    if steps_per_pass and steps > measured[name] * steps_per_pass:
        why = (f"the budget would show it the training pairs {steps / steps_per_pass:.1f} times; its curve is "
               f"measured to {measured[name]:g}, and its prediction counts {measured[name]:g}")
    return Choice(name, dict(CANDIDATES[name]), seconds, rows, clock() - started, why,
                  "layer" if norm == "layer" else "scale")


def step_timer(data, make, precision, label_smoothing, clip_norm):
    """step_seconds_of for choose(): a candidate built by make(sizes) -> (model, clip), timed on
    batches spread over the corpus's first epoch (forward, backward, clipping), then dropped."""
    import numpy as np

    batches = data.batches(0)
    picks = [batches[i * 97 % len(batches)] for i in range(PROBE_PASSES + 1)]

    def step_seconds_of(name, sizes):
        model, clip = make(sizes)
        times = []
        for positions in picks:
            src, tgt_in, tgt_out = data.collate(positions)
            started = time.perf_counter()
            model.zero_grad()
            model.forward_backward(src, tgt_in, tgt_out, label_smoothing=label_smoothing, precision=precision)
            if clip_norm > 0:
                clip(model, clip_norm)
            times.append(time.perf_counter() - started)
        # + the optimizer step and bookkeeping, a few percent of a step (as the schedule's probe)
        return 1.03 * float(np.median(times[1:]))

    return step_seconds_of


def size_run(args, data, src_vocab, tgt_vocab, max_len, engine=None, stream=None):
    """--preset auto: measure the candidates (step_timer), pick one (choose), and make it the run's
    preset; the seconds spent measuring come off --minutes, so the budget counts them. `engine`
    (train_on_data's, for comparisons) measures its own model instead of ours."""
    from ..model import Seq2SeqTransformer
    from ..optim import clip_grad_norm
    from .flags import model_config_from_args
    from .memory import check_step_memory
    from .report import say
    from .world import ranks_sharing_memory

    def config(sizes):
        probe_args = argparse.Namespace(**{**vars(args), **sizes, "preset": "tiny"})
        if probe_args.dropout is None:
            probe_args.dropout = 0.1      # a rate the run may take; what it takes is chosen later
        return model_config_from_args(probe_args, src_vocab, tgt_vocab, max_len=max_len)

    def fits(name, sizes):
        """Whether a candidate's step fits the memory (memory.py): one past it ends the list before
        it is measured; the first one past it refuses the run. (The chosen one's warning, if any,
        comes with the run's own check.)"""
        try:
            check_step_memory(config(sizes), data, args.batch_tokens, *ranks_sharing_memory(args), warn=False)
        except MemoryError as exc:
            if name == next(iter(CANDIDATES)):
                raise
            say(f"sizing: {name} and larger not tried, their step is past the memory ({exc})", stream)
            return False
        return True

    def make(sizes):
        cfg = config(sizes)
        if engine is not None:
            model, _, clip = engine(cfg)
            return model, clip
        return Seq2SeqTransformer(cfg, seed=args.seed), clip_grad_norm

    budget = 60.0 * args.minutes
    timer = step_timer(data, make, args.precision, args.label_smoothing, args.clip_norm)
    choice = choose(budget, timer, steps_per_pass=len(data.batches(0)), max_steps=args.max_steps,
                    norm=getattr(args, "norm", None), fits=fits if engine is None else None)
    args.preset = choice.name
    args.minutes = max(args.minutes - choice.probe_seconds / 60.0, 0.0)
    say(choice.describe(budget - choice.probe_seconds), stream)
    return choice
