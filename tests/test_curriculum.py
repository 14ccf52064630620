"""The length curriculum (--curriculum, issue 57): competence-based (Platanios et al. 2019). Early
steps draw their batches from the shortest pairs only, later ones from all; the run stays a function
of its seed (resumed, or on a prepared directory); off, the batches are today's."""
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from types import SimpleNamespace

import numpy as np
import pytest

from transformer import cli, train
from transformer.checkpoint import load_checkpoint
from transformer.corpus import TrainingSet
from transformer.training import curriculum

SMALL = ["--d-model", "32", "--n-heads", "2", "--d-ff", "64", "--n-encoder-layers", "1",
         "--n-decoder-layers", "1", "--quiet", "--threads", "1"]
WORDS = ["red", "blue", "cat", "dog", "runs", "sleeps", "the", "a", "big", "small", "house", "tree"]


def write_tsv(path, n=200, seed=0):
    """Pairs of 1 to 14 words: lengths enough apart that the shortest share is a few batches."""
    rng = np.random.default_rng(seed)
    lines = ["eng\tfake"]
    for _ in range(n):
        sentence = " ".join(rng.choice(WORDS, size=rng.integers(1, 15)))
        lines.append(f"{sentence}\t{sentence[::-1].upper()}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def base(data, *extra):
    return ["train", "--data", data, "--src-col", "eng", "--tgt-col", "fake", *SMALL, "--vocab-size", "60",
            "--batch-tokens", "200", "--dev-fraction", "0.1", *extra]


def losses(out):
    with open(os.path.join(out, train.LOG_FILE)) as f:
        return [json.loads(line)["loss"] for line in f if "loss" in json.loads(line)]


@pytest.fixture
def drawn(monkeypatch):
    """The (training set, positions) of every batch a run collates, in order."""
    seen = []
    collate = TrainingSet.collate

    def recording(self, positions, epoch=0):
        seen.append((self, np.array(positions)))
        return collate(self, positions, epoch)

    monkeypatch.setattr(TrainingSet, "collate", recording)
    return seen


def test_competence_is_the_square_root_schedule_from_c0_to_one():
    c0 = curriculum.INITIAL_COMPETENCE
    assert c0 == 0.01
    assert curriculum.competence(0, 100) == pytest.approx(c0)
    assert curriculum.competence(25, 100) == pytest.approx(math.sqrt(0.25 * (1 - c0 ** 2) + c0 ** 2))
    assert curriculum.competence(50, 100) == pytest.approx(math.sqrt(0.5 * (1 - c0 ** 2) + c0 ** 2))
    assert curriculum.competence(100, 100) == 1.0 and curriculum.competence(1000, 100) == 1.0
    values = [curriculum.competence(t, 100) for t in range(101)]
    assert all(a < b for a, b in zip(values, values[1:]))
    assert curriculum.competence(0, 10, initial=0.1) == pytest.approx(0.1)


def test_a_fraction_is_of_the_planned_steps_and_a_whole_number_is_steps():
    assert curriculum.curriculum_steps(0.25, {"total": 400}, None) == 100
    assert curriculum.curriculum_steps(0.25, {"name": "noam"}, 40) == 10     # noam: of --max-steps
    assert curriculum.curriculum_steps(0.001, {"total": 40}, None) == 1
    assert curriculum.curriculum_steps(30, {"total": 400}, None) == 30


def test_early_batches_hold_only_the_shortest_pairs_and_later_ones_come_in_the_usual_order(tmp_path, drawn,
                                                                                            capsys):
    data = write_tsv(tmp_path / "pairs.tsv")
    steps, total = 8, 20
    out = str(tmp_path / "run")
    assert cli.main(base(data, "--max-steps", str(total), "--curriculum", str(steps), "--out", out)) == 0
    told = capsys.readouterr()
    assert "length curriculum: the shortest 1% of the training pairs at step 1" in told.err
    assert f"to all of them at step {steps}" in told.err
    assert f"step {steps}: the length curriculum ends" in told.out     # beside the other step lines
    assert json.loads(told.out.splitlines()[-6])["curriculum_steps"] == steps
    assert load_checkpoint(out).train_state["schedule"]["curriculum"] == steps
    assert len(drawn) == total
    data_set = drawn[0][0]
    lengths = data_set.lengths
    ranked = np.sort(lengths)
    epoch = data_set.batches(0)
    shortest_batch = lengths[epoch.order[epoch.bounds[0]:epoch.bounds[1]]].max()
    for t, (_, positions) in enumerate(drawn[:steps]):
        allowed = ranked[math.ceil(curriculum.competence(t, steps) * len(ranked)) - 1]
        assert lengths[positions].max() <= max(allowed, shortest_batch), t
    first = lengths[drawn[0][1]].max()
    assert first == shortest_batch and first < np.median(lengths), (first, np.median(lengths))
    # from step `steps` on: epoch 0 from its first batch, as a run without the curriculum reads it
    after = [positions.tolist() for _, positions in drawn[steps:]]
    usual = [batches[i].tolist() for batches in map(data_set.batches, range(3)) for i in range(len(batches))]
    assert after == usual[:len(after)]
    assert lengths[np.concatenate([positions for _, positions in drawn[steps:]])].max() > first


def test_without_the_flag_the_batches_are_todays(tmp_path, drawn):
    data = write_tsv(tmp_path / "pairs.tsv")
    out = str(tmp_path / "run")
    assert cli.main(base(data, "--max-steps", "12", "--out", out)) == 0
    data_set = drawn[0][0]
    usual = []
    for epoch in range(3):
        usual += [data_set.batches(epoch)[i].tolist() for i in range(len(data_set.batches(epoch)))]
    assert [positions.tolist() for _, positions in drawn] == usual[:12]
    assert "curriculum" not in load_checkpoint(out).train_state["schedule"]


def test_the_same_seed_draws_the_same_curriculum_and_another_seed_another(tmp_path, drawn):
    data = write_tsv(tmp_path / "pairs.tsv")
    runs = []
    for name, seed in (("a", "0"), ("b", "0"), ("c", "5")):
        del drawn[:]
        assert cli.main(base(data, "--max-steps", "6", "--curriculum", "6", "--seed", seed,
                             "--out", str(tmp_path / name))) == 0
        runs.append([positions.tolist() for _, positions in drawn])
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    assert losses(str(tmp_path / "a")) == losses(str(tmp_path / "b"))


def test_a_run_stopped_mid_curriculum_resumes_the_uninterrupted_losses(tmp_path, monkeypatch):
    """A budget run of 14 steps with a curriculum over half of them, stopped by SIGINT after step
    3 and resumed with no flag: the losses of the uninterrupted run."""
    data = write_tsv(tmp_path / "pairs.tsv")
    argv = base(data, "--max-steps", "14", "--curriculum", "0.5")
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    assert cli.main([*argv, "--out", straight]) == 0
    assert load_checkpoint(straight).train_state["schedule"]["curriculum"] == 7
    step = train.Trainer.step

    def interrupted_step(self):
        result = step(self)
        if self.state.step == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return result

    monkeypatch.setattr(train.Trainer, "step", interrupted_step)
    assert cli.main([*argv, "--out", split]) == 128 + signal.SIGINT
    monkeypatch.setattr(train.Trainer, "step", step)
    assert load_checkpoint(split).train_state["step"] == 3
    assert cli.main(["train", "--resume", split, "--quiet"]) == 0
    assert len(losses(straight)) == 14
    assert losses(split) == losses(straight)


def test_a_noam_run_resumed_mid_curriculum_across_its_end_repeats_the_losses(tmp_path):
    data = write_tsv(tmp_path / "pairs.tsv")
    argv = base(data, "--schedule", "noam", "--warmup", "10", "--curriculum", "6")
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    assert cli.main([*argv, "--max-steps", "10", "--out", straight]) == 0
    assert cli.main([*argv, "--max-steps", "4", "--out", split]) == 0
    assert cli.main(["train", "--resume", split, "--max-steps", "10", "--quiet"]) == 0
    assert losses(split) == losses(straight)


def test_a_file_and_its_prepared_directory_draw_the_same_curriculum(tmp_path, drawn):
    data = write_tsv(tmp_path / "pairs.tsv")
    prepared = str(tmp_path / "prepared")
    assert cli.main(["prepare", "--data", data, "--src-col", "eng", "--tgt-col", "fake", "--vocab-size", "60",
                     "--dev-fraction", "0.1", "--out", prepared, "--quiet"]) == 0
    common = [*SMALL, "--batch-tokens", "200", "--max-steps", "10", "--curriculum", "0.6"]
    runs = {}
    for name, argv in (("file", ["--data", data, "--src-col", "eng", "--tgt-col", "fake", "--vocab-size", "60",
                                 "--dev-fraction", "0.1"]),
                       ("prepared", ["--data", prepared])):
        del drawn[:]
        out = str(tmp_path / name)
        assert cli.main(["train", *argv, *common, "--out", out]) == 0
        runs[name] = ([positions.tolist() for _, positions in drawn], losses(out))
    assert runs["file"] == runs["prepared"]


def test_data_parallel_ranks_share_the_same_curriculum_batch(tmp_path, drawn):
    """Each rank takes every size-th sentence of the one global batch the (seed, step) draws."""
    data = write_tsv(tmp_path / "pairs.tsv")
    assert cli.main(base(data, "--max-steps", "2", "--curriculum", "4", "--out", str(tmp_path / "run"))) == 0
    data_set = drawn[0][0]
    glob = data_set.curriculum_batch(1, curriculum.competence(1, 4))
    assert drawn[1][1].tolist() == glob.tolist()

    ranks = [SimpleNamespace(dp=SimpleNamespace(rank=rank, size=2)) for rank in range(2)]
    parts = [train.Trainer._shard(trainer, glob) for trainer in ranks]     # what next_batch hands each
    assert parts[0].tolist() == glob[0::2].tolist() and parts[1].tolist() == glob[1::2].tolist()
    assert sorted(np.concatenate(parts).tolist()) == sorted(glob.tolist())


def test_two_mpi_ranks_train_the_curriculum_as_one_process(tmp_path):
    """mpiexec -n 2: each rank its half of the batch the curriculum draws; the losses of one process."""
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if mpiexec is None or importlib.util.find_spec("mpi4py") is None:
        pytest.skip('needs the [mpi] extra: pip install ".[mpi]"')
    data = write_tsv(tmp_path / "pairs.tsv")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRANSFORMER_CACHE": str(tmp_path / "cache")}
    flags = ["-m", "transformer", *base(data, "--max-steps", "6", "--curriculum", "4")]
    runs = {}
    for name, launch in (("one", []), ("two", [mpiexec, "-n", "2"])):
        done = subprocess.run([*launch, sys.executable, *flags, "--out", str(tmp_path / name)], capture_output=True,
                              text=True, timeout=240, cwd=tempfile.gettempdir(), env=env)
        assert done.returncode == 0, done.stderr
        runs[name] = losses(str(tmp_path / name))
    assert len(runs["one"]) == 6
    np.testing.assert_allclose(runs["two"], runs["one"], rtol=1e-4)


def test_a_fraction_of_a_minutes_budget_follows_the_re_estimated_plan(tmp_path, capsys):
    data = write_tsv(tmp_path / "pairs.tsv")
    out = str(tmp_path / "run")
    assert cli.main(base(data, "--minutes", "0.05", "--curriculum", "0.5", "--out", out)) == 0
    plan = load_checkpoint(out).train_state["schedule"]
    assert "replan_at" not in plan, "re-estimated at the end of warm-up"
    assert plan["curriculum"] == max(1, round(0.5 * plan["total"]))
    assert f"length curriculum to step {plan['curriculum']}" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["0", "-2", "1.5", "abc", "nan"])
def test_a_bad_value_is_refused_naming_the_flag(value, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["train", "--curriculum", value, "--max-steps", "1"])
    assert exc.value.code == 2
    assert "--curriculum" in capsys.readouterr().err


@pytest.mark.parametrize("extra, says", [
    ([], "--curriculum applies only with --data"),
])
def test_the_builtin_task_refuses_the_curriculum(tmp_path, capsys, extra, says):
    assert cli.main(["train", *SMALL, "--curriculum", "5", "--max-steps", "2", "--out", str(tmp_path / "x"),
                     *extra]) == 2
    assert says in capsys.readouterr().err


def test_flags_the_curriculum_cannot_follow_are_refused(tmp_path, capsys):
    data = write_tsv(tmp_path / "pairs.tsv", n=40)
    assert cli.main(base(data, "--max-steps", "2", "--curriculum", "6", "--out", str(tmp_path / "a"))) == 0
    assert "to all of them at step 6 (--curriculum, beyond the 2 planned steps)" in capsys.readouterr().err
    assert cli.main(base(data, "--schedule", "noam", "--minutes", "1", "--curriculum", "0.5",
                         "--out", str(tmp_path / "b"))) == 2
    assert "--curriculum 0.5: a fraction of the planned steps" in capsys.readouterr().err
    out = str(tmp_path / "c")
    assert cli.main(base(data, "--max-steps", "2", "--curriculum", "2", "--out", out)) == 0
    capsys.readouterr()
    assert cli.main(["train", "--resume", out, "--max-steps", "3", "--curriculum", "3", "--quiet"]) == 2
    assert f"--curriculum 3: the run in {out} started with 2" in capsys.readouterr().err
    plain = str(tmp_path / "d")
    assert cli.main(base(data, "--max-steps", "2", "--out", plain)) == 0
    capsys.readouterr()
    assert cli.main(["train", "--resume", plain, "--max-steps", "3", "--curriculum", "3", "--quiet"]) == 2
    assert f"--curriculum 3: the run in {plain} started without it" in capsys.readouterr().err
