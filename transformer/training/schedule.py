"""The learning-rate plan of a run, fixed before step 1 and kept in the checkpoint (so a resumed run
follows it exactly): the paper's warm-up schedule (equation 3), or the budget schedule that fits
warm-up and decay into --max-steps or --minutes; and the dropout the plan calls for."""
from ..config import DROPOUT_FREE_PASSES, HEAVY_DROPOUT, HEAVY_DROPOUT_PASSES
from ..optim import budget_lr, noam_lr

# The budget schedule (the default with --data): warm-up over this share of the budget, peak
# learning rate PEAK_LR_FACTOR * d_model^-0.5 (the paper's schedule peaks at d_model^-0.5 *
# warmup^-0.5: 1e-3 for d_model 256 with its 4000 warm-up steps; a 10-minute budget with pre-LN
# takes twice that: on the Bible corpus, `small`, dev BLEU 2.62 at peak 2e-3 against 1.42 at 1e-3
# and 1.99 at 3e-3), linear decay to FINAL_LR_SHARE of the peak at the end of the budget.
WARMUP_SHARE = 0.05
MIN_WARMUP = 10
PEAK_LR_FACTOR = 0.032
FINAL_LR_SHARE = 0.1
SNAPSHOT_SHARE = 0.025   # --average-last: a snapshot every 2.5% of the planned steps
PROBE_STEPS = 2          # forward/backward passes timed (not trained on) to estimate the step rate


def plan(args, d_model, budget_seconds=None, measure_step_seconds=None):
    """The learning-rate plan of a new run.

    noam: the paper's inverse-square-root schedule (equation 3), --warmup steps.
    budget: the step count the budget allows (--max-steps, or budget_seconds divided by
    measure_step_seconds()), warm-up over WARMUP_SHARE of it, then linear decay to its end."""
    if args.schedule == "noam":
        warmup = args.warmup or 4000
        return {"name": "noam", "warmup": warmup, "peak": args.lr_scale * noam_lr(warmup, d_model, warmup)}
    total, step_seconds = args.max_steps, None
    if budget_seconds is not None:
        step_seconds = measure_step_seconds()
        by_time = max(1, int(budget_seconds / step_seconds))
        total = by_time if total is None else min(total, by_time)
    if total is None:
        raise ValueError("--schedule budget needs a budget: --max-steps or --minutes")
    warmup = args.warmup or max(MIN_WARMUP, round(WARMUP_SHARE * total))
    warmup = min(warmup, total)
    peak = args.lr if args.lr is not None else PEAK_LR_FACTOR * d_model ** -0.5
    planned = {"name": "budget", "warmup": int(warmup), "total": int(total), "peak": args.lr_scale * peak,
               "final": FINAL_LR_SHARE}
    if step_seconds is not None:
        planned["estimated_step_seconds"] = round(step_seconds, 4)
        planned["replan_at"] = int(warmup)   # see replan_total
    return planned


def replan_total(planned, step, seconds_per_step, seconds_left, max_steps):
    """At the end of warm-up, a time-bounded plan re-estimates its step count from the steps
    actually taken (the probe sees two batches; real steps include the optimizer, checkpoints,
    batches of every length). The learning rates of steps already taken do not change."""
    total = step + max(int(seconds_left / seconds_per_step), 0)
    if max_steps is not None:
        total = min(total, max_steps)
    planned["total"] = max(int(total), planned["warmup"])
    planned["estimated_step_seconds"] = round(seconds_per_step, 4)
    del planned["replan_at"]


def learning_rate(planned, step, lr_scale, d_model):
    if planned["name"] == "noam":
        return lr_scale * noam_lr(step, d_model=d_model, warmup=planned["warmup"])
    return budget_lr(step, planned["peak"], planned["warmup"], planned["total"], planned["final"])


def describe(planned):
    if planned["name"] == "noam":
        return (f"schedule: noam (the paper's), warm-up {planned['warmup']} steps, "
                f"peak learning rate {planned['peak']:.2e} at step {planned['warmup']}")
    how = ""
    if "estimated_step_seconds" in planned:
        how = f", from {planned['estimated_step_seconds']:.2f} s a step measured"
    return (f"schedule: budget, about {planned['total']} steps{how}; warm-up {planned['warmup']} steps "
            f"to peak learning rate {planned['peak']:.2e}, then linear decay to "
            f"{planned['peak'] * planned['final']:.2e} at step {planned['total']}")


def snapshot_every(planned, every=None):
    """--average-last: steps between snapshots (--snapshot-every, or SNAPSHOT_SHARE of the plan)."""
    if every:
        return every
    return max(1, round(SNAPSHOT_SHARE * planned.get("total", planned["warmup"])))


def dropout_for(passes, current):
    """(rate, why) for a new run on data without --dropout, whose plan sees the training pairs
    `passes` times: no dropout below DROPOUT_FREE_PASSES, HEAVY_DROPOUT from HEAVY_DROPOUT_PASSES
    on, else the model's `current` rate (rate None: keep it)."""
    if passes < DROPOUT_FREE_PASSES:
        return 0.0, (f"dropout 0: the plan sees the training pairs {passes:.1f} times (fewer than "
                     f"{DROPOUT_FREE_PASSES:g}: nothing to regularise yet; --dropout to choose)")
    if passes >= HEAVY_DROPOUT_PASSES:
        return HEAVY_DROPOUT, (f"dropout {HEAVY_DROPOUT:g}: the plan sees the training pairs {passes:.1f} times "
                               f"({HEAVY_DROPOUT_PASSES:g} or more: a small corpus to learn, not to memorise; "
                               "--dropout to choose)")
    return None, f"dropout {current:g}: the plan sees the training pairs {passes:.1f} times"
