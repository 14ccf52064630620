"""A length curriculum (--curriculum): competence-based curriculum learning (Platanios et al. 2019,
"Competence-based curriculum learning for neural machine translation").

A pair's difficulty is its length, max(source, 1 + target) ids: the length that batches it and
that its batch is padded to. At step t of a curriculum of T steps, the run may draw only from the
shortest c(t) of the training pairs, c(t) the paper's square-root competence (c_sqrt):

    c(t) = min(1, sqrt(t (1 - c0^2) / T + c0^2))

so it starts from the shortest c0 of them and takes in longer pairs quickly at first, then more
slowly; from step T on, the run reads its epochs in the usual order (corpus.TrainingSet draws the
batches: TrainingSet.curriculum_batch). Off unless --curriculum is given."""
import math

# c0: the share of the pairs the first step draws from; the paper's value. The shortest batch is
# always among the choices, so a small corpus whose 1% fills no batch still has one to draw.
INITIAL_COMPETENCE = 0.01


def competence(step, steps, initial=INITIAL_COMPETENCE):
    """c(step): the share of the training pairs, shortest first, that the batch after `step` steps
    may hold, in a curriculum of `steps` steps (1 from `steps` on)."""
    if step >= steps:
        return 1.0
    return min(1.0, math.sqrt(step * (1.0 - initial * initial) / steps + initial * initial))


def planned_steps(planned, max_steps):
    """The step count a fraction of --curriculum is of: the plan's (budget schedule), or --max-steps
    (noam), or None (noam with only --minutes: no step count is planned)."""
    return planned.get("total", max_steps)


def curriculum_steps(value, planned, max_steps):
    """--curriculum's length in steps: a whole number as given; a fraction (0 < value < 1) of the
    planned steps, at least 1."""
    if isinstance(value, float) and value < 1:
        return max(1, round(value * planned_steps(planned, max_steps)))
    return int(value)


def fix(planned, value, max_steps):
    """Write the curriculum's length into the learning-rate plan (kept in the checkpoint, so a resumed
    run, and every data-parallel rank, ends it at the same step). Also after the end-of-warm-up
    re-estimate of a --minutes budget, so that a fraction stays a fraction of the run."""
    if value is not None:
        planned["curriculum"] = curriculum_steps(value, planned, max_steps)


def describe(planned, step, value):
    """The log line of a run with a curriculum (None without one)."""
    steps = planned.get("curriculum")
    if steps is None:
        return None
    given = f"{value:g} of the planned steps" if isinstance(value, float) and value < 1 else "--curriculum"
    if step >= steps:
        return f"length curriculum: ended at step {steps} ({given}); batches from all the training pairs"
    total = planned.get("total")
    beyond = f", beyond the {total} planned steps" if total is not None and steps > total else ""
    return (f"length curriculum: the shortest {competence(step, steps):.0%} of the training pairs at step "
            f"{step + 1}, growing (square-root competence, c0 {INITIAL_COMPETENCE:g}) to all of them at step "
            f"{steps} ({given}{beyond}); then the usual order")
