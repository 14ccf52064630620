"""Training runs: exact resume, checkpoints that survive damage and interruption, clean stops."""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import transformer as T
from transformer import cli, config, train
from transformer.corpus import preparation as corpus_prepare
from transformer.checkpoint import (CHECKPOINT_FILE, TRAIN_STATE_FIELDS, _digest, load_checkpoint,
                                    load_for_inference)
from transformer.data import read_pairs, split_pairs
from transformer.serialization import load_file, read_metadata, save_file
from transformer.training import schedule

SMALL = ["--d-model", "32", "--n-heads", "2", "--d-ff", "64", "--n-encoder-layers", "1",
         "--n-decoder-layers", "1", "--quiet", "--threads", "1"]


# Subprocesses run from outside the checkout, whose transformer/ folder has no compiled module.
OUTSIDE = tempfile.gettempdir()


def run_cli(*argv):
    """`transformer ...` in a fresh process (signals, exit codes and stdout as a user sees them)."""
    return subprocess.run([sys.executable, "-m", "transformer", *argv], capture_output=True, text=True,
                          timeout=600, cwd=OUTSIDE)


def losses(out):
    with open(os.path.join(out, train.LOG_FILE)) as f:
        return [json.loads(line)["loss"] for line in f if "loss" in json.loads(line)]


def write_corpus(path, n=120, seed=0):
    rng = np.random.default_rng(seed)
    words = ["red", "blue", "cat", "dog", "runs", "sleeps", "the", "a", "big", "small"]
    lines = ["eng\tfake"]
    for _ in range(n):
        sentence = " ".join(rng.choice(words, size=rng.integers(2, 7)))
        lines.append(f"{sentence}\t{sentence[::-1]}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_resume_takes_a_moved_copy_of_the_data_and_refuses_other_pairs(tmp_path):
    data = write_corpus(tmp_path / "pairs.tsv", n=40)
    out = str(tmp_path / "run")
    base = ["--src-col", "eng", "--tgt-col", "fake", *SMALL, "--vocab-size", "60", "--batch-tokens", "200"]
    assert run_cli("train", "--data", data, *base, "--max-steps", "2", "--out", out).returncode == 0
    moved = tmp_path / "elsewhere.tsv"
    moved.write_bytes((tmp_path / "pairs.tsv").read_bytes())
    done = run_cli("train", "--resume", out, "--data", str(moved), "--max-steps", "3", "--quiet")
    assert done.returncode == 0, done.stderr
    other = write_corpus(tmp_path / "other.tsv", n=40, seed=1)
    done = run_cli("train", "--resume", out, "--data", other, "--max-steps", "4", "--quiet")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]       # after the lines that report the data read
    assert last.startswith(f"transformer train: error: --data {other}: not the pairs the run in {out} "
                           "trained on"), done.stderr
    assert load_checkpoint(out).train_state["step"] == 3      # nothing trained on the other pairs


def test_builtin_resume_repeats_the_uninterrupted_losses(tmp_path):
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    base = ["train", *SMALL, "--batch-size", "8", "--warmup", "5"]
    assert run_cli(*base, "--max-steps", "6", "--out", straight).returncode == 0
    assert run_cli(*base, "--max-steps", "3", "--out", split).returncode == 0
    assert run_cli("train", "--resume", split, "--max-steps", "6", "--quiet").returncode == 0
    print(losses(straight), losses(split))
    assert len(losses(straight)) == 6
    assert losses(split) == losses(straight)          # exactly, dropout included


def test_data_resume_across_an_epoch_boundary_repeats_the_losses(tmp_path):
    data = write_corpus(tmp_path / "pairs.tsv")
    base = ["train", "--data", data, "--src-col", "eng", "--tgt-col", "fake", *SMALL, "--schedule", "noam",
            "--vocab-size", "60", "--batch-tokens", "300", "--dev-fraction", "0.1"]
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    done = run_cli(*base, "--max-steps", "14", "--out", straight)
    assert done.returncode == 0, done.stderr
    assert "bleu" in done.stdout
    assert run_cli(*base, "--max-steps", "5", "--out", split).returncode == 0
    assert run_cli("train", "--resume", split, "--max-steps", "14", "--quiet").returncode == 0
    ckpt = load_checkpoint(split)
    assert ckpt.train_state["epoch"] >= 1, "the test should cross an epoch boundary"
    assert losses(split) == losses(straight)


def small_checkpoint(tmp_path):
    out = str(tmp_path / "run")
    assert run_cli("train", *SMALL, "--batch-size", "4", "--max-steps", "2", "--out", out).returncode == 0
    return out, os.path.join(out, CHECKPOINT_FILE)


def test_damaged_checkpoints_are_refused_with_a_clear_error(tmp_path):
    out, path = small_checkpoint(tmp_path)
    ckpt = load_checkpoint(out)
    assert ckpt.train_state["step"] == 2
    blob = open(path, "rb").read()
    # truncated
    with open(path, "wb") as f:
        f.write(blob[: len(blob) - 100])
    with pytest.raises(ValueError, match="checkpoint.safetensors"):
        load_checkpoint(out)
    # one flipped bit in the weights
    flipped = bytearray(blob)
    flipped[-50] ^= 0x10
    with open(path, "wb") as f:
        f.write(bytes(flipped))
    with pytest.raises(ValueError, match="checksum"):
        load_checkpoint(out)
    # another version of the format
    with open(path, "wb") as f:
        f.write(blob.replace(b'"version":"1"', b'"version":"9"'))
    with pytest.raises(ValueError, match="version"):
        load_checkpoint(out)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(str(tmp_path / "nowhere"))


def _rewrite_metadata(path, **entries):
    """The checkpoint at `path` with these metadata entries replaced, its tensors (and so their
    SHA-256) as they were."""
    save_file(load_file(path), path, metadata={**read_metadata(path), **entries})


def test_damaged_train_state_metadata_is_refused_naming_the_file(tmp_path):
    """The SHA-256 covers the tensors only: a train_state that TrainState(**state) or the trainer
    cannot take is refused as the checkpoint loads, not met as a traceback on resume."""
    out, path = small_checkpoint(tmp_path)
    state = load_checkpoint(out).train_state
    plan = state["schedule"]
    for damaged in ([state], {**state, "bogus": 1}, {k: v for k, v in state.items() if k != "step"},
                    {**state, "step": "2"}, {**state, "step": True}, {**state, "tokens": -1},
                    {**state, "best_dev_loss": None}, {**state, "schedule": [plan]},
                    {**state, "schedule": {"name": plan["name"]}}):
        _rewrite_metadata(path, train_state=json.dumps(damaged))
        with pytest.raises(ValueError, match="checkpoint.safetensors: damaged train_state metadata"):
            load_checkpoint(out)
    # written before the plan was kept in the checkpoint: loads, and the resumed run plans anew
    _rewrite_metadata(path, train_state=json.dumps({k: v for k, v in state.items() if k != "schedule"}))
    assert load_checkpoint(out).train_state["step"] == 2
    _rewrite_metadata(path, train_state=json.dumps([state]))
    done = run_cli("train", "--resume", out, "--max-steps", "4", "--quiet")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"transformer train: error: --resume {out}: checkpoint.safetensors: damaged train_state metadata: "
        "a JSON object is expected, got list"]


def test_the_checkpoint_checks_every_field_of_train_state():
    assert set(TRAIN_STATE_FIELDS) == {field.name for field in dataclasses.fields(train.TrainState)}


def test_non_finite_values_in_a_checkpoint_are_refused_even_with_a_matching_checksum(tmp_path):
    out, path = small_checkpoint(tmp_path)
    tensors, metadata = load_file(path), read_metadata(path)
    tensors["optimizer/exp_avg_sq"][7] = np.inf               # a writer's bug, not a flipped bit
    save_file(tensors, path, metadata={**metadata, "sha256": _digest(tensors)})
    with pytest.raises(ValueError, match="checkpoint.safetensors: tensor 'optimizer/exp_avg_sq' holds non-finite"):
        load_checkpoint(out)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_saves_a_checkpoint_and_exits(tmp_path, sig):
    out = str(tmp_path / "run")
    proc = subprocess.Popen([sys.executable, "-m", "transformer", "train", *SMALL, "--batch-size", "8",
                             "--minutes", "5", "--out", out], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=OUTSIDE)
    log = os.path.join(out, train.LOG_FILE)
    deadline = time.time() + 120
    while time.time() < deadline and not (os.path.exists(log) and len(open(log).readlines()) >= 3):
        time.sleep(0.1)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err
    assert signal.Signals(sig).name in err
    ckpt = load_checkpoint(out)
    assert ckpt.train_state["step"] == len(losses(out)) >= 3


def test_non_finite_loss_stops_training_and_keeps_the_last_checkpoint(tmp_path, capsys):
    out, path = small_checkpoint(tmp_path)
    before = open(path, "rb").read()
    args = cli.build_parser().parse_args(["train", "--resume", out, "--max-steps", "10", "--quiet"])
    args.minutes, args.warmup = None, None
    train.load_resume(args)
    args.out = out
    ckpt = args.checkpoint
    ckpt.model.params.data["generator.bias"][:] = np.nan   # poisoned weights: the next loss is nan
    trainer = train.Trainer(args, ckpt.model, ckpt.optimizer, ckpt.src_tokenizer, ckpt.tgt_tokenizer,
                            None, [], train.TrainState(**ckpt.train_state), task=train.ReverseTask())
    assert trainer.run() == 1
    err = capsys.readouterr().err
    assert "non-finite loss" in err and "step 3" in err
    assert open(path, "rb").read() == before            # the good checkpoint is untouched
    assert load_checkpoint(out).train_state["step"] == 2


def test_trained_directory_serves_translation(tmp_path):
    out, _ = small_checkpoint(tmp_path)
    model, src_tok, tgt_tok = load_for_inference(out)
    assert model.cfg.src_vocab_size == src_tok.vocab_size
    translated = run_cli("translate", "--model", out, "--beam", "2", "abc", "hello")
    assert translated.returncode == 0, translated.stderr
    assert len(translated.stdout.splitlines()) == 2
    piped = subprocess.run([sys.executable, "-m", "transformer", "translate", "--model", out, "--beam", "1"],
                           input="abc\nxyz\n", capture_output=True, text=True, timeout=120, cwd=OUTSIDE)
    assert piped.returncode == 0 and len(piped.stdout.splitlines()) == 2


def test_translate_draws_the_cross_attention_heatmap(tmp_path):
    pytest.importorskip("matplotlib")
    out, _ = small_checkpoint(tmp_path)
    png = str(tmp_path / "attention.png")
    done = run_cli("translate", "--model", out, "--beam", "1", "--attention", png, "attention")
    assert done.returncode == 0, done.stderr
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(png) > 10_000


def test_characters_no_font_draws_are_one_list_not_a_warning_each(tmp_path, monkeypatch):
    """matplotlib warns once per character and label it cannot draw (a dozen lines for a Hindi
    sentence without a Devanagari font): plot_cross_attention returns those characters, once each,
    for the command line's one warning; other warnings pass through."""
    pytest.importorskip("matplotlib")
    import warnings

    from transformer import plot

    def draw(*args):
        plt = plot._pyplot()
        fig, ax = plt.subplots()
        ax.set_title("\ue000\ue001 \ue000")
        ax.set_xticks([0, 1])
        ax.set_xticklabels(["\ue001", "a"])
        fig.savefig(str(tmp_path / "x.png"))
        plt.close(fig)
        warnings.warn("something else", RuntimeWarning)

    monkeypatch.setattr(plot, "_draw", draw)
    with pytest.warns(RuntimeWarning, match="something else"):
        assert plot.plot_cross_attention(None, None, None, "", "") == ["\ue000", "\ue001"]


def lrs(out):
    with open(os.path.join(out, train.LOG_FILE)) as f:
        return [json.loads(line)["lr"] for line in f if "lr" in json.loads(line)]


def test_interrupted_budget_run_resumes_its_plan_exactly(tmp_path, monkeypatch, capsys):
    """A run planned for 14 steps, stopped by SIGINT after step 5, resumed with no budget flag:
    it finishes the same plan with the losses and learning rates of an uninterrupted run."""
    data = write_corpus(tmp_path / "pairs.tsv")
    base = ["train", "--data", data, "--src-col", "eng", "--tgt-col", "fake", *SMALL,
            "--vocab-size", "60", "--batch-tokens", "300", "--dev-fraction", "0.1", "--max-steps", "14"]
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    assert cli.main([*base, "--out", straight]) == 0
    plan = load_checkpoint(straight).train_state["schedule"]
    assert plan == {"name": "budget", "warmup": train.MIN_WARMUP, "total": 14,
                    "peak": pytest.approx(train.PEAK_LR_FACTOR * 32 ** -0.5), "final": train.FINAL_LR_SHARE}
    assert lrs(straight) == [pytest.approx(T.budget_lr(s, plan["peak"], plan["warmup"], 14, plan["final"]))
                             for s in range(1, 15)]

    step = train.Trainer.step

    def interrupted_step(self):
        result = step(self)
        if self.state.step == 5:
            os.kill(os.getpid(), signal.SIGINT)     # what Ctrl-C does: StopFlag saves and stops
        return result

    monkeypatch.setattr(train.Trainer, "step", interrupted_step)
    assert cli.main([*base, "--out", split]) == 128 + signal.SIGINT
    monkeypatch.setattr(train.Trainer, "step", step)
    assert load_checkpoint(split).train_state["step"] == 5
    assert cli.main(["train", "--resume", split, "--quiet"]) == 0     # no budget flag: finish the plan
    assert losses(split) == losses(straight)
    assert lrs(split) == lrs(straight)


def test_minutes_budget_plans_from_a_measured_step_time_and_keeps_the_plan_on_resume(tmp_path, capsys):
    data = write_corpus(tmp_path / "pairs.tsv")
    out = str(tmp_path / "run")
    base = ["--data", data, "--src-col", "eng", "--tgt-col", "fake", *SMALL, "--vocab-size", "60",
            "--batch-tokens", "300", "--dev-fraction", "0.1"]
    assert cli.main(["train", *base, "--minutes", "0.05", "--out", out]) == 0
    err = capsys.readouterr().err
    assert "schedule: budget" in err and "s a step measured" in err
    plan = load_checkpoint(out).train_state["schedule"]
    assert plan["name"] == "budget" and plan["budget_seconds"] == 3.0
    assert "replan_at" not in plan, "re-estimated at the end of warm-up"
    steps = load_checkpoint(out).train_state["step"]
    assert steps > plan["warmup"]
    # the step count the plan expected is close to the one the budget allowed
    assert 0.5 * steps <= plan["total"] <= 2 * steps + 5, (steps, plan)
    assert cli.main(["train", "--resume", out, "--max-steps", str(steps + 3), "--quiet"]) == 0
    assert load_checkpoint(out).train_state["schedule"] == plan
    expected = [T.budget_lr(s, plan["peak"], plan["warmup"], plan["total"], plan["final"])
                for s in range(1, steps + 4)]
    assert lrs(out) == pytest.approx(expected)


def test_schedule_flags_that_cannot_apply_are_refused(tmp_path):
    done = run_cli("train", *SMALL, "--max-steps", "1", "--lr", "1e-3", "--out", str(tmp_path / "x"))
    assert done.returncode != 0 and "--lr" in done.stderr


def test_average_last_makes_the_saved_model_the_mean_of_the_last_snapshots(tmp_path):
    from transformer import Seq2SeqTransformer
    from transformer.checkpoint import list_snapshots

    data = write_corpus(tmp_path / "pairs.tsv")
    out = str(tmp_path / "run")
    done = run_cli("train", "--data", data, "--src-col", "eng", "--tgt-col", "fake", *SMALL, "--vocab-size", "60",
                   "--batch-tokens", "300", "--dev-fraction", "0.1", "--max-steps", "9", "--average-last", "3",
                   "--snapshot-every", "2", "--eval-every", "3", "--keep-best", "--out", out)
    assert done.returncode == 0, done.stderr
    snapshots = list_snapshots(out)
    assert [os.path.basename(p) for p in snapshots] == ["step-0000006", "step-0000008", "step-0000009"]
    weights = [Seq2SeqTransformer.load(p).params.flat.astype(np.float64) for p in snapshots]
    saved = Seq2SeqTransformer.load(out).params.flat
    np.testing.assert_allclose(saved, np.mean(weights, axis=0), rtol=1e-6, atol=1e-7)
    final = load_checkpoint(out).model.params.flat            # the checkpoint keeps the raw weights
    assert np.array_equal(final, weights[-1].astype(np.float32))
    assert not np.array_equal(final, saved)
    assert '"final"' in done.stdout                             # raw and averaged both reported
    # --keep-best: the model of the lowest periodic dev loss
    best = load_checkpoint(out).train_state["best_dev_loss"]
    evals = [json.loads(line) for line in open(os.path.join(out, train.LOG_FILE)) if "dev_loss" in line]
    assert best == min(e["dev_loss"] for e in evals)
    assert os.path.exists(os.path.join(out, "best", "model.safetensors"))
    # transformer average: the same mean from the command line
    averaged = str(tmp_path / "averaged")
    for p in snapshots:     # a snapshot holds weights only; give it the run's tokenizers
        for name in ("src_tokenizer.json", "tgt_tokenizer.json"):
            with open(os.path.join(out, name)) as src, open(os.path.join(p, name), "w") as dst:
                dst.write(src.read())
    assert run_cli("average", *snapshots, "--out", averaged).returncode == 0
    assert np.array_equal(Seq2SeqTransformer.load(averaged).params.flat, saved)


def test_quality_bench_averages_the_pytorch_run_like_ours(tmp_path):
    """benchmarks/quality.py --engine torch --average-last K: the PyTorch network's snapshots are
    saved in our format and averaged as ours are, and both the raw and the averaged weights are
    scored, greedy and beam 4."""
    pytest.importorskip("torch")
    from transformer import Seq2SeqTransformer
    from transformer.bench import quality
    from transformer.checkpoint import list_snapshots

    data = write_corpus(tmp_path / "pairs.tsv")
    out, records = str(tmp_path / "run"), tmp_path / "records.jsonl"
    assert quality.main(["--engine", "torch", "--json", str(records), "--data", data, "--src-col", "eng",
                         "--tgt-col", "fake", *SMALL, "--vocab-size", "60", "--batch-tokens", "300",
                         "--dev-fraction", "0.1", "--max-steps", "6", "--average-last", "2",
                         "--snapshot-every", "2", "--eval-every", "3", "--out", out]) == 0
    record = json.loads(records.read_text())
    assert record["engine"] == "torch" and record["steps"] == 6
    snapshots = list_snapshots(out)
    assert [os.path.basename(p) for p in snapshots] == ["step-0000004", "step-0000006"]
    weights = [Seq2SeqTransformer.load(p).params.flat.astype(np.float64) for p in snapshots]
    np.testing.assert_allclose(Seq2SeqTransformer.load(out).params.flat, np.mean(weights, axis=0),
                               rtol=1e-6, atol=1e-7)
    assert not np.array_equal(weights[0], weights[1])
    averaged = record["averaged_last"]
    assert averaged["k"] == 2 and set(averaged["beam4"]) == {"bleu", "chrf"}
    assert set(record["greedy"]) == set(record["beam4"]) == {"bleu", "chrf"}


def test_quality_plot_tells_runs_apart_by_their_batches(tmp_path, monkeypatch):
    """Runs of one engine and budget that differ in batch size or dropout get legends that say so
    (records before those fields existed keep the short legend)."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from transformer.bench import quality

    def record(**extra):
        return {"engine": "ours", "data": "bible.tsv.gz", "minutes": 10, "cpu": "cpu", "threads": 2,
                "curve": [[30.0, 100, 5.0, 20.0, 4.0], [60.0, 200, 8.0, 25.0, 3.5]],
                "greedy": {"bleu": 8.0, "chrf": 25.0}, **extra}

    figures = []
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, *a, **k: figures.append(fig))
    quality.plot([record(batch_tokens=2048, dropout=0.1), record(batch_tokens=512, dropout=0.0), record()],
                 str(tmp_path / "p.png"))
    labels = sorted(t.get_text() for t in figures[0].axes[0].get_legend().get_texts())
    assert labels == ["ours, 10 min (final greedy BLEU 8.0)",
                      "ours, 10 min, batches of 2048 tokens, dropout 0.1 (final greedy BLEU 8.0)",
                      "ours, 10 min, batches of 512 tokens, dropout 0 (final greedy BLEU 8.0)"]


def test_train_on_data_hands_back_the_raw_weights_and_the_average_apart(tmp_path):
    """With --average-last the caller's trainer holds the raw final weights (what a benchmark
    scores as "final") and model_for_inference the average; neither replaces the other."""
    from transformer import Seq2SeqTransformer
    from transformer.checkpoint import list_snapshots

    data = write_corpus(tmp_path / "pairs.tsv")
    out = str(tmp_path / "run")
    args = cli.build_parser().parse_args(["train", "--data", data, "--src-col", "eng", "--tgt-col", "fake", *SMALL,
                                          "--vocab-size", "60", "--batch-tokens", "300", "--dev-fraction", "0.1",
                                          "--max-steps", "6", "--average-last", "2", "--snapshot-every", "2",
                                          "--out", out])
    train.load_resume(args)
    train.apply_defaults(args)
    train.prepare_out_dir(args)
    result = {}
    assert train.train_on_data(args, result=result) == 0
    raw, averaged = result["trainer"].model.params.flat, result["trainer"].model_for_inference.params.flat
    snapshots = [Seq2SeqTransformer.load(p).params.flat for p in list_snapshots(out)]
    assert np.array_equal(raw, snapshots[-1])
    assert np.array_equal(averaged, Seq2SeqTransformer.load(out).params.flat)
    assert not np.array_equal(raw, averaged)


def test_average_refuses_models_of_different_runs(tmp_path):
    from transformer.checkpoint import average_weights

    a = T.Seq2SeqTransformer(T.ModelConfig(src_vocab_size=10, tgt_vocab_size=10, d_model=8, n_heads=2, d_ff=8,
                                           n_encoder_layers=1, n_decoder_layers=1), seed=0)
    b = T.Seq2SeqTransformer(a.cfg.replace(d_ff=16), seed=0)
    with pytest.raises(ValueError, match="config"):
        average_weights([a, b])
    with pytest.raises(ValueError, match="^runs/b: config differs from runs/a's"):
        average_weights([a, b], names=["runs/a", "runs/b"])
    with pytest.raises(ValueError, match="nothing"):
        average_weights([])
    twin = T.Seq2SeqTransformer(a.cfg, seed=1)
    mean = average_weights([a, twin]).params.flat
    np.testing.assert_allclose(mean, (a.params.flat.astype(np.float64) + twin.params.flat) / 2, rtol=1e-7)
    for flag in (["--keep-best"], ["--snapshot-every", "2"]):
        done = run_cli("train", *SMALL, "--max-steps", "1", *flag, "--out", str(tmp_path / "x"))
        assert done.returncode != 0 and flag[0] in done.stderr


def test_bf16_run_resumes_bit_exactly_in_bf16_and_its_checkpoints_load_in_any_precision(tmp_path, capsys):
    """--precision bf16: the resumed run keeps bf16 without the flag and repeats the uninterrupted
    losses exactly; the losses are not fp32's; the model it writes is an ordinary fp32 model."""
    data = write_corpus(tmp_path / "pairs.tsv")
    base = ["train", "--data", data, "--src-col", "eng", "--tgt-col", "fake", *SMALL,
            "--vocab-size", "60", "--batch-tokens", "300", "--dev-fraction", "0.1"]
    straight, half, fp32 = (str(tmp_path / n) for n in ("straight", "half", "fp32"))
    assert cli.main([*base, "--precision", "bf16", "--max-steps", "8", "--out", straight]) == 0
    assert "precision: bf16" in capsys.readouterr().err
    assert load_checkpoint(straight).args["precision"] == "bf16"
    assert cli.main([*base, "--precision", "fp32", "--max-steps", "8", "--out", fp32]) == 0
    assert losses(fp32) != losses(straight)
    assert losses(fp32)[0] == pytest.approx(losses(straight)[0], rel=1e-2)
    # --schedule noam: the plan does not depend on the step count, so 4 + 4 steps is 8 steps
    assert cli.main([*base, "--precision", "bf16", "--schedule", "noam", "--max-steps", "8", "--out", straight,
                     "--overwrite"]) == 0
    assert cli.main([*base, "--precision", "bf16", "--schedule", "noam", "--max-steps", "4", "--out", half]) == 0
    assert cli.main(["train", "--resume", half, "--max-steps", "8", "--quiet"]) == 0
    assert losses(half) == losses(straight)
    model = load_for_inference(straight)[0]
    assert isinstance(model.greedy_decode(np.array([[5, 6, 7]]), max_len=4), list)


def test_int8_training_is_refused_with_a_clear_message(tmp_path, capsys):
    assert cli.main(["train", *SMALL, "--precision", "int8", "--max-steps", "1", "--out", str(tmp_path / "x")]) == 2   # a usage error
    assert "--precision int8 is for decoding" in capsys.readouterr().err


def test_tied_target_embeddings_train_save_and_resume(tmp_path):
    data = write_corpus(tmp_path / "pairs.tsv")
    base = ["train", "--data", data, "--src-col", "eng", "--tgt-col", "fake", *SMALL, "--schedule", "noam",
            "--vocab-size", "60", "--batch-tokens", "300", "--dev-fraction", "0.1", "--tie-embeddings", "target"]
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    assert run_cli(*base, "--max-steps", "6", "--out", straight).returncode == 0
    assert run_cli(*base, "--max-steps", "3", "--out", split).returncode == 0
    assert run_cli("train", "--resume", split, "--max-steps", "6", "--quiet").returncode == 0
    assert losses(split) == losses(straight)
    model = T.Seq2SeqTransformer.load(straight)
    assert model.cfg.tie_embeddings == "target" and "generator.weight" not in model.params.data


def test_quality_compare_pairs_runs_and_times_when_ours_reached_the_reference(tmp_path, capsys):
    """--compare pairs each of our records with each PyTorch record of the same corpus, budget, CPU,
    threads and preset; gives step, BLEU and chrF ratios; and interpolates when our dev curve first
    reached the reference's last dev BLEU (12 between 10 at 60 s and 14 at 120 s: 90 s, against the
    reference's 600 s: 6.67x), None where it never did."""
    import json

    from transformer.bench import quality

    def record(engine, curve, bleu, data="bible.tsv.gz", steps=1000):
        return {"engine": engine, "data": data, "minutes": 10, "cpu": "cpu", "threads": 2, "preset": "tiny",
                "batch_tokens": 2048, "dropout": 0.0, "steps": steps, "curve": curve,
                "greedy": {"bleu": bleu, "chrf": 2 * bleu}, "beam4": {"bleu": bleu + 1, "chrf": 2 * bleu + 1}}

    reference = record("torch", [[300.0, 500, 8.0, 0, 4.0], [600.0, 1000, 12.0, 0, 3.0]], 10.0)
    fast = record("ours", [[60.0, 200, 10.0, 0, 4.0], [120.0, 400, 14.0, 0, 3.0], [600.0, 2000, 20.0, 0, 2.0]],
                  15.0, steps=2000)
    slow = record("ours", [[300.0, 1000, 5.0, 0, 4.0], [600.0, 2000, 11.0, 0, 3.0]], 9.0, steps=2000)
    other = record("torch", [[600.0, 1000, 1.0, 0, 5.0]], 1.0, data="hindi.tsv")
    rows = quality.compare([fast, slow, reference, other])
    assert len(rows) == 2 and all(r["data"] == "bible.tsv.gz" for r in rows)
    assert rows[0]["steps_ratio"] == 2.0
    assert rows[0]["bleu_ratio"] == {"greedy": 1.5, "beam4": round(16 / 11, 3)}
    assert rows[0]["chrf_ratio"] == {"greedy": 1.5, "beam4": round(31 / 21, 3)}
    assert rows[0]["reference_last_dev_bleu"] == 12.0
    assert rows[0]["ours_reached_it_at_seconds"] == 90.0 and rows[0]["time_ratio"] == round(600 / 90, 3)
    assert rows[1]["ours_reached_it_at_seconds"] is None and rows[1]["time_ratio"] is None

    records = tmp_path / "records.jsonl"
    records.write_text("".join(json.dumps(r) + "\n" for r in (fast, reference)))
    assert quality.main(["--compare", str(records)]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [rows[0]]


@pytest.mark.parametrize("free, heavy, flag, want", [(None, None, None, 0.0), (0.0, 1e9, None, 0.1),
                                                     (0.0, 0.0, None, 0.3), (0.0, 0.0, "0.2", 0.2)])
def test_the_default_dropout_follows_how_often_the_plan_sees_the_pairs(tmp_path, monkeypatch, capsys,
                                                                       free, heavy, flag, want):
    """Three steps see the 108 training pairs less than once: no dropout. With the thresholds moved
    (training.schedule's DROPOUT_FREE_PASSES, HEAVY_DROPOUT_PASSES) the same run gets 0.1, then 0.3; an
    explicit --dropout always wins. The choice is printed and saved with the model."""
    data = write_corpus(tmp_path / "pairs.tsv")
    if free is not None:
        monkeypatch.setattr(schedule, "DROPOUT_FREE_PASSES", free)     # where the rule reads them
        monkeypatch.setattr(schedule, "HEAVY_DROPOUT_PASSES", heavy)
    out = str(tmp_path / "run")
    argv = ["train", "--data", data, "--src-col", "eng", "--tgt-col", "fake", *SMALL, "--vocab-size", "60",
            "--batch-tokens", "300", "--dev-fraction", "0.1", "--max-steps", "3", "--out", out]
    assert cli.main(argv + (["--dropout", flag] if flag else [])) == 0
    err = capsys.readouterr().err
    if flag is None:
        assert f"dropout {want:g}: the plan sees the training pairs" in err
    assert load_checkpoint(out).model.cfg.dropout == want


def test_train_help_states_the_dropout_rule_in_use(capsys):
    """`transformer train --help` gives the thresholds the rule applies (it said 5 passes after the
    rule moved to 8)."""
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert (f"fewer than {train.DROPOUT_FREE_PASSES:g} times, {train.HEAVY_DROPOUT:g} when it sees them "
            f"{train.HEAVY_DROPOUT_PASSES:g} times or more") in text


def test_choose_vocab_size_gives_one_entry_per_16_words_within_its_bounds():
    """The default BPE size: the two sides' mean word count / VOCAB_WORDS_PER_ENTRY, rounded down
    to a multiple of 500, clamped to [MIN_VOCAB, MAX_VOCAB] (Tatoeba English-Hindi: 1000; the
    Bible: 4000)."""
    def pairs(words_a_side, n=100):
        sentence = " ".join(["w"] * (words_a_side // n))
        return [(sentence, sentence)] * n

    assert train.choose_vocab_size(pairs(100)) == config.MIN_VOCAB == 1000
    assert train.choose_vocab_size(pairs(16 * 1499)) == 1000
    assert train.choose_vocab_size(pairs(16 * 1500)) == 1500
    assert train.choose_vocab_size(pairs(16 * 3999)) == 3500
    assert train.choose_vocab_size(pairs(16 * 100000)) == config.MAX_VOCAB == 4000
    # the mean of the two sides: 16 * 2000 words on one, none on the other
    assert train.choose_vocab_size([(" ".join(["w"] * 320), "")] * 100) == 1000
    assert train.choose_vocab_size([(" ".join(["w"] * 640), "")] * 100) == 2000


def test_the_default_vocab_size_is_printed_saved_and_kept_on_resume(tmp_path, monkeypatch, capsys):
    """Without --vocab-size a run learns choose_vocab_size's vocabularies, says so, and records the
    size with its flags, so a resumed run keeps it (and refuses another) even if the rule changes."""
    data = write_corpus(tmp_path / "pairs.tsv")
    monkeypatch.setattr(corpus_prepare, "VOCAB_WORDS_PER_ENTRY", 0.25)   # ~450 words a side: 1500
    out = str(tmp_path / "run")
    argv = ["train", "--data", data, "--src-col", "eng", "--tgt-col", "fake", *SMALL,
            "--batch-tokens", "300", "--dev-fraction", "0.1", "--max-steps", "2", "--out", out]
    pairs, _ = read_pairs(data, "eng", "fake")
    want = train.choose_vocab_size(split_pairs(pairs, dev_fraction=0.1, max_dev=500)[0])
    assert config.MIN_VOCAB < want < config.MAX_VOCAB
    assert cli.main(argv) == 0
    assert f"BPE vocabulary size {want} per language" in capsys.readouterr().err
    assert load_checkpoint(out).args["vocab_size"] == want
    monkeypatch.setattr(corpus_prepare, "VOCAB_WORDS_PER_ENTRY", 1000)   # the rule changes; the run does not
    resumed = ["train", "--resume", out, "--data", data, "--quiet", "--threads", "1", "--max-steps", "3"]
    assert cli.main(resumed) == 0
    assert load_checkpoint(out).args["vocab_size"] == want
    assert cli.main(resumed[:-2] + ["--max-steps", "4", "--vocab-size", "40"]) != 0


# -- the built-in task trains to its goal ------------------------------------------------------------

def test_the_builtin_default_stops_at_its_goal_and_says_so(tmp_path, monkeypatch, capsys):
    """With neither --minutes nor --max-steps the built-in task trains until its check words are
    right (here a goal of 0%: reached at the first check) and says at which step."""
    from transformer.training import builtin
    monkeypatch.setattr(builtin, "CHECK_EVERY", 3)
    monkeypatch.setattr(builtin, "GOAL_EXACT", 0.0)
    out = str(tmp_path / "run")
    assert cli.main(["train", *SMALL, "--batch-size", "4", "--out", out]) == 0
    said = capsys.readouterr()
    assert "goal reached at step 3" in said.out + said.err
    assert load_checkpoint(out).train_state["step"] == 3


def test_the_builtin_default_stops_at_its_cap_with_a_warning(tmp_path, monkeypatch, capsys):
    from transformer.training import builtin
    monkeypatch.setattr(builtin, "CHECK_EVERY", 2)
    monkeypatch.setattr(builtin, "GOAL_EXACT", 1.01)        # never reached
    monkeypatch.setattr(builtin, "CAP_MINUTES", 0.02)       # 1.2 s
    out = str(tmp_path / "run")
    started = time.monotonic()
    assert cli.main(["train", *SMALL, "--batch-size", "4", "--out", out]) == 0
    said = capsys.readouterr()
    text = said.out + said.err
    assert "stopped at the 0.02-minute cap before the goal of 101% exact" in text, text
    assert time.monotonic() - started < 60
    assert "goal reached" not in text


def test_a_builtin_run_with_a_budget_has_no_goal(tmp_path, monkeypatch, capsys):
    from transformer.training import builtin
    monkeypatch.setattr(builtin, "CHECK_EVERY", 1)
    monkeypatch.setattr(builtin, "GOAL_EXACT", 0.0)
    out = str(tmp_path / "run")
    assert cli.main(["train", *SMALL, "--batch-size", "4", "--max-steps", "4", "--out", out]) == 0
    said = capsys.readouterr()
    assert "goal" not in said.out + said.err
    assert load_checkpoint(out).train_state["step"] == 4
