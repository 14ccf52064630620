"""Training, a room per concern (transformer.train is its public face):

    loop.py       the Trainer: batches, steps, evaluation, checkpoints, the loop itself
    schedule.py   the learning-rate plan (the paper's warm-up, or the budget schedule) and dropout
    flags.py      the `train` flags: which apply, their defaults, the model sizes they give
    resume.py     where a run writes and how it continues (--resume, --init-from)
    data.py       from the corpus flags to the prepared corpus a run batches
    world.py      under mpirun: ranks, their agreement, data parallel
    builtin.py    the default run on the built-in task (no --data)
    on_data.py    a run on a corpus
    report.py     what a run prints
"""
