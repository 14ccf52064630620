"""The command line talks to people: an expected failure is one line naming the flag, a flag that
would be silently ignored is refused, blank lines stay blank and over-long lines are split."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from transformer import cli
from transformer.commands import info, translate, world
from transformer.checkpoint import CHECKPOINT_FILE, LOG_FILE
from transformer.train import split_to_fit

SMALL = ["--d-model", "32", "--n-heads", "2", "--d-ff", "64", "--n-encoder-layers", "1",
         "--n-decoder-layers", "1", "--quiet", "--threads", "1"]
OUTSIDE = tempfile.gettempdir()      # the checkout's transformer/ folder has no compiled module
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run_cli(*argv, stdin=None):
    return subprocess.run([sys.executable, "-m", "transformer", *argv], input=stdin, capture_output=True,
                          text=True, timeout=300, cwd=OUTSIDE, env=ENV)


def error_line(done, command):
    """The one line an expected failure prints; nothing else on stderr, no traceback."""
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"transformer {command}: error: "), done.stderr
    return lines[0]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A built-in task run of two steps (its model has 14 positions) and a small corpus."""
    root = tmp_path_factory.mktemp("cli")
    out = str(root / "run")
    done = run_cli("train", *SMALL, "--batch-size", "4", "--max-steps", "2", "--out", out)
    assert done.returncode == 0, done.stderr
    corpus = root / "pairs.tsv"
    corpus.write_text("eng\tfake\nabc\tCBA\nhello\tOLLEH\n", encoding="utf-8")
    return {"out": out, "data": str(corpus), "root": root}


# -- expected failures: one line, the flag named, no traceback -----------------------------------------

def test_a_missing_model_directory_is_one_line_naming_the_flag():
    line = error_line(run_cli("translate", "--model", "/nonexistent", "hi"), "translate")
    assert "--model /nonexistent:" in line and "not found" in line


def test_debug_shows_the_traceback_before_or_after_the_command():
    for argv in (["--debug", "translate", "--model", "/nonexistent", "hi"],
                 ["translate", "--model", "/nonexistent", "hi", "--debug"]):
        done = run_cli(*argv)
        assert done.returncode != 0
        assert "Traceback" in done.stderr and "FileNotFoundError" in done.stderr


def test_a_directory_that_is_not_a_model_is_named(tmp_path):
    line = error_line(run_cli("translate", "--model", str(tmp_path), "hi"), "translate")
    assert f"--model {tmp_path}:" in line and "config.json" in line


def test_a_damaged_model_and_a_damaged_checkpoint_are_named(run, tmp_path):
    copy = str(tmp_path / "copy")
    shutil.copytree(run["out"], copy)
    weights = os.path.join(copy, "model.safetensors")
    with open(weights, "r+b") as f:
        f.truncate(os.path.getsize(weights) - 100)
    line = error_line(run_cli("translate", "--model", copy, "hi"), "translate")
    assert f"--model {copy}: model.safetensors" in line
    path = os.path.join(copy, CHECKPOINT_FILE)
    blob = bytearray(open(path, "rb").read())
    blob[-50] ^= 0x10
    open(path, "wb").write(bytes(blob))
    line = error_line(run_cli("train", "--resume", copy, "--quiet"), "train")
    assert f"--resume {copy}:" in line and "checksum" in line
    line = error_line(run_cli("train", "--resume", str(tmp_path / "nowhere")), "train")
    assert "--resume" in line


def test_a_model_whose_weights_are_not_finite_is_refused_by_every_command_that_reads_it(run, tmp_path):
    """Its data area overwritten with 0xFF bytes (NaN): translate printed empty lines, status 0."""
    copy = str(tmp_path / "copy")
    shutil.copytree(run["out"], copy)
    weights = os.path.join(copy, "model.safetensors")
    raw = bytearray(open(weights, "rb").read())
    start = 8 + int.from_bytes(raw[:8], "little")
    raw[start:] = b"\xff" * (len(raw) - start)
    open(weights, "wb").write(bytes(raw))
    for argv in (["translate", "--model", copy, "hi"], ["quantize", "--model", copy, "--out", str(tmp_path / "q")],
                 ["average", run["out"], copy, "--out", str(tmp_path / "a")]):
        line = error_line(run_cli(*argv), argv[0])
        assert "model.safetensors: tensor 'src_embed.weight' holds non-finite values" in line, line


def test_a_wrong_column_names_the_column_flag_and_the_columns_there(run):
    line = error_line(run_cli("evaluate", "--model", run["out"], "--data", run["data"], "--src-col", "xyz"),
                      "evaluate")
    assert "--src-col xyz:" in line and "eng, fake" in line


def test_a_missing_data_file_names_the_flag(run, tmp_path):
    missing = str(tmp_path / "missing.tsv")
    line = error_line(run_cli("train", "--data", missing, *SMALL, "--out", str(tmp_path / "x")), "train")
    assert f"--data {missing}:" in line
    line = error_line(run_cli("evaluate", "--model", run["out"], "--data", missing), "evaluate")
    assert f"--data {missing}:" in line


def test_average_refuses_a_single_model(run, tmp_path):
    line = error_line(run_cli("average", run["out"], "--out", str(tmp_path / "a")), "average")
    assert f"one model directory ({run['out']}): averaging needs at least two" in line
    assert not (tmp_path / "a").exists()


def test_a_file_where_a_directory_is_expected_is_called_a_file(run, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for argv in (["translate", "--model", str(afile), "hi"], ["quantize", "--model", str(afile), "--out",
                 str(tmp_path / "q")], ["average", run["out"], str(afile), "--out", str(tmp_path / "a")]):
        line = error_line(run_cli(*argv), argv[0])
        assert f"{afile}: a file, not a model directory" in line, line
    line = error_line(run_cli("train", *SMALL, "--max-steps", "1", "--out", str(afile)), "train")
    assert line == f"transformer train: error: --out {afile}: a file, not a directory (--out is the directory " \
                   "a run writes its checkpoint and model to)", line


def test_a_train_that_fails_before_writing_leaves_no_empty_out_behind(run, tmp_path):
    out = tmp_path / "runs" / "new"
    line = error_line(run_cli("train", "--data", run["data"], "--src-col", "xyz", *SMALL, "--out", str(out)),
                      "train")
    assert "--src-col xyz:" in line
    assert not (tmp_path / "runs").exists()        # neither --out nor the parent made for it
    kept = tmp_path / "kept"
    kept.mkdir()
    error_line(run_cli("train", "--data", run["data"], "--src-col", "xyz", *SMALL, "--out", str(kept)), "train")
    assert kept.is_dir()                           # a directory that was there stays


def test_more_threads_than_cores_is_honoured_with_a_warning(run, monkeypatch, capsys):
    monkeypatch.setattr(world, "_cores", lambda: 2)
    calls = []
    monkeypatch.setattr("transformer.set_num_threads", calls.append)
    args = cli.build_parser().parse_args(["translate", "--model", run["out"], "--threads", "3", "hi"])
    world._apply_threads(args)
    assert calls == [3]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("transformer translate: warning: --threads 3 is more than the 2 cores")
    args = cli.build_parser().parse_args(["translate", "--model", run["out"], "--threads", "2", "hi"])
    world._apply_threads(args)
    assert calls == [3, 2] and capsys.readouterr().err == ""


@pytest.mark.parametrize("argv", [
    ["train", "--minutes", "-1"], ["train", "--minutes", "0"], ["train", "--dropout", "2"],
    ["train", "--threads", "0"], ["train", "--label-smoothing", "1.5"], ["train", "--dev-fraction", "1.2"],
    ["train", "--lr", "nan"], ["train", "--clip-norm", "-1"], ["train", "--seed", "-3"],
    ["train", "--eval-every", "x"], ["translate", "--model", "m", "--beam", "0"], ["bench", "--threads", "0"],
])
def test_bad_flag_values_are_refused_when_parsed(argv):
    done = run_cli(*argv)
    assert done.returncode == 2
    line = error_line(done, argv[0])
    assert f"argument {argv[-2]}:" in line


def test_an_interruption_is_one_line_and_status_130(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(info, "run", interrupted)
    assert cli.main(["info"]) == 130
    assert capsys.readouterr().err == "transformer info: error: interrupted\n"


def test_a_bug_keeps_its_traceback(monkeypatch):
    def buggy(args):
        raise ValueError("an unexpected ValueError is a bug, not a user's mistake")

    monkeypatch.setattr(info, "run", buggy)
    with pytest.raises(ValueError, match="a bug"):
        cli.main(["info"])


# -- blank and over-long lines ---------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_a_beam_whose_caches_exceed_the_machines_memory_is_one_line_before_any_decoding(run, command):
    """--beam 100000 had no bound: numpy reserved its caches, and the process grew for minutes."""
    argv = ["translate", "--model", run["out"], "hello"] if command == "translate" else \
        ["evaluate", "--model", run["out"], "--data", run["data"], "--src-col", "eng", "--tgt-col", "fake"]
    done = run_cli(*argv, "--beam", str(10**9))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    line = done.stderr.strip().splitlines()[-1]      # evaluate first says what it read
    assert line.startswith(f"transformer {command}: error: out of memory: beam_size 1000000000 for 1 "
                           "sentence: 1,000,000,000 decoder rows"), line
    assert "more than this machine's" in line or "its cgroup's memory limit allows" in line   # in a container


def test_wide_beams_translate_in_smaller_batches_with_the_same_result(run, monkeypatch):
    """More than 4 beams: fewer sentences a batch (at most 64 x 4 decoder rows), the same
    translations as one batch of them all."""
    from transformer.checkpoint import load_for_inference
    from transformer.train import translate_texts
    model, src_tok, tgt_tok = load_for_inference(run["out"])
    texts = ["abc", "hello", "a", "transformer", "xy", "attention", "b", "decoder"] * 3
    sizes = []
    search = model.beam_search
    monkeypatch.setattr(model, "beam_search", lambda src, **kw: sizes.append(len(src)) or search(src, **kw))
    got = translate_texts(model, src_tok, tgt_tok, texts, beam=8, batch_size=8)
    assert sizes == [4] * 6
    sizes.clear()
    assert translate_texts(model, src_tok, tgt_tok, texts, beam=8, batch_size=1000) == got
    assert sizes == [24]


def test_blank_lines_translate_to_blank_lines(run):
    done = run_cli("translate", "--model", run["out"], "--beam", "1", stdin="abc\n\n   \nxyz\n")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    assert len(lines) == 5 and lines[4] == ""           # four lines in, four out
    assert lines[0] and lines[1] == "" and lines[2] == "" and lines[3]
    done = run_cli("translate", "--model", run["out"], "")
    assert done.returncode == 0 and done.stdout == "\n"


def test_a_line_longer_than_the_positions_is_translated_in_pieces_with_a_warning(run):
    long_word = "abcdefghij" * 4                        # 40 characters, 14 positions
    done = run_cli("translate", "--model", run["out"], "--beam", "1", stdin=f"abc\n{long_word}\n")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and len(lines[1].split(" ")) == 3
    assert done.stderr.strip() == ("transformer translate: warning: line 2 has 40 subwords, more than the "
                                   "model's 14 positions: translated in 3 pieces")


class Subwords:
    """tokens(ids) of a tokenizer: the id list is the index into a fixed list of subwords."""

    def __init__(self, words):
        self.words = words

    def tokens(self, ids):
        return [self.words[i] for i in ids]


def test_long_texts_are_cut_after_sentences_then_clauses_then_before_words():
    words = ["\u2581The", "\u2581cat", "\u2581sle", "eps.", "\u2581A", "\u2581dog", "\u2581runs,", "\u2581far",
             "\u2581aw", "ay"]
    tok, ids = Subwords(words), list(range(10))
    assert split_to_fit(ids, 10, tok) == [ids]
    assert split_to_fit(ids, 6, tok) == [[0, 1, 2, 3], [4, 5, 6, 7, 8, 9]]    # after the full stop
    assert split_to_fit(ids, 3, tok) == [[0, 1], [2, 3], [4, 5, 6], [7, 8, 9]]   # then after the comma
    assert split_to_fit([7, 8, 9], 2, tok) == [[7], [8, 9]]                    # not inside "away"
    assert split_to_fit(list(range(7)), 3) == [[0, 1, 2], [3, 4, 5], [6]]    # no tokenizer: fixed pieces
    assert split_to_fit([], 3, tok) == []


# -- flags that would do nothing are refused ------------------------------------------------------------

@pytest.mark.parametrize("argv, flag", [
    (["bench", "--what", "train", "--plot", "F.png"], "--plot"),
    (["bench", "--plot", "F.png"], "--plot"),
    (["bench", "--what", "decode", "--families", "gemm"], "--families"),
    (["bench", "--what", "masking", "--config", "tiny"], "--config"),
    (["bench", "--what", "kernels", "--config", "tiny"], "--config"),
    (["bench", "--what", "profile", "--against", "none"], "--against"),
    (["bench", "--what", "masking", "--against", "torch"], "--against"),
    (["train", "--vocab-size", "100"], "--vocab-size"),
    (["train", "--batch-tokens", "100"], "--batch-tokens"),
    (["train", "--src-col", "eng"], "--src-col"),
    (["train", "--tgt-col", "hin"], "--tgt-col"),
    (["train", "--header", "no"], "--header"),
    (["train", "--dev-fraction", "0.1"], "--dev-fraction"),
    (["train", "--dev-max", "10"], "--dev-max"),
    (["train", "--max-sentence-tokens", "50"], "--max-sentence-tokens"),
    (["train", "--samples", "hello"], "--samples"),
    (["train", "--eval-limit", "10"], "--eval-limit"),
])
def test_flags_the_command_would_not_read_are_refused(argv, flag, tmp_path):
    if argv[0] == "train":
        argv = [*argv, *SMALL, "--max-steps", "1", "--out", str(tmp_path / "x")]
    done = run_cli(*argv)
    assert done.returncode == 2
    assert error_line(done, argv[0]).startswith(f"transformer {argv[0]}: error: {flag} ")
    assert not os.path.exists(tmp_path / "x")


def test_batch_size_is_refused_with_data(run, tmp_path):
    done = run_cli("train", "--data", run["data"], "--batch-size", "8", *SMALL, "--out", str(tmp_path / "x"))
    assert done.returncode == 2
    assert error_line(done, "train").startswith("transformer train: error: --batch-size ")


@pytest.mark.parametrize("flag", [["--d-model", "64"], ["--preset", "small"], ["--seed", "3"],
                                  ["--lr", "0.001"], ["--schedule", "budget"], ["--warmup", "7"],
                                  ["--label-smoothing", "0.2"], ["--batch-size", "5"], ["--data", "pairs.tsv"]])
def test_resume_refuses_a_setting_other_than_the_checkpoints(run, flag):
    done = run_cli("train", "--resume", run["out"], *flag, "--quiet")
    assert done.returncode == 2
    assert error_line(done, "train").startswith(f"transformer train: error: {flag[0]} {flag[1]}: ")


def test_resume_accepts_the_checkpoints_own_settings(run, tmp_path):
    """...and continues from the checkpoint's step: the two steps logged before stay as they were
    (marked here: a run that started over would log them again, unmarked), one step is added, and
    the run ends with the log line and the weights of an uninterrupted run of three steps."""
    from safetensors.numpy import load_file

    copy = str(tmp_path / "copy")
    shutil.copytree(run["out"], copy)
    log = os.path.join(copy, LOG_FILE)
    before = [{**json.loads(line), "before_resume": True} for line in open(log, encoding="utf-8")]
    assert [line["step"] for line in before] == [1, 2]
    with open(log, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(line) + "\n" for line in before)
    done = run_cli("train", "--resume", copy, *SMALL, "--batch-size", "4", "--seed", "0", "--max-steps", "3")
    assert done.returncode == 0, done.stderr
    after = [json.loads(line) for line in open(log, encoding="utf-8")]
    assert after[:2] == before and [line["step"] for line in after] == [1, 2, 3], after
    whole = str(tmp_path / "whole")
    done = run_cli("train", *SMALL, "--batch-size", "4", "--max-steps", "3", "--out", whole)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in open(os.path.join(whole, LOG_FILE), encoding="utf-8")][2] == after[2]
    resumed, uninterrupted = (load_file(os.path.join(d, "model.safetensors")) for d in (copy, whole))
    assert resumed.keys() == uninterrupted.keys()
    for name in resumed:
        np.testing.assert_array_equal(resumed[name], uninterrupted[name], err_msg=name)


# -- precision -----------------------------------------------------------------------------------------

def test_quantize_writes_an_int8_model_that_translates_and_evaluates_in_int8(run):
    int8 = str(run["root"] / "int8")
    done = run_cli("quantize", "--model", run["out"], "--out", int8)
    assert done.returncode == 0, done.stderr
    assert os.path.getsize(os.path.join(int8, "model.safetensors")) < \
        0.5 * os.path.getsize(os.path.join(run["out"], "model.safetensors"))
    texts = "abc\nhello world\n"
    by_default = run_cli("translate", "--model", int8, "--beam", "1", stdin=texts)
    assert by_default.returncode == 0, by_default.stderr
    # an int8 model decodes in int8 unless told otherwise: the same as asking for it on the original
    asked = run_cli("translate", "--model", run["out"], "--beam", "1", "--precision", "int8", stdin=texts)
    assert by_default.stdout == asked.stdout
    done = run_cli("evaluate", "--model", int8, "--data", run["data"], "--src-col", "eng", "--tgt-col", "fake")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["precision"] == "int8"
    done = run_cli("evaluate", "--model", run["out"], "--data", run["data"], "--src-col", "eng",
                   "--tgt-col", "fake", "--precision", "bf16", "--beam", "2")
    assert done.returncode == 0 and json.loads(done.stdout)["precision"] == "bf16"


def test_an_unknown_precision_names_the_choices(run):
    done = run_cli("translate", "--model", run["out"], "--precision", "fp8", "hi")
    assert done.returncode == 2
    assert "--precision" in done.stderr and "'fp32', 'bf16', 'int8'" in done.stderr


# -- no output written over a model or run that is still wanted -------------------------------------------

def test_a_new_run_does_not_overwrite_another_runs_checkpoint_without_overwrite(run, tmp_path):
    out = str(tmp_path / "kept")
    shutil.copytree(run["out"], out)
    before = open(os.path.join(out, CHECKPOINT_FILE), "rb").read()
    line = error_line(run_cli("train", *SMALL, "--batch-size", "4", "--max-steps", "1", "--out", out), "train")
    assert f"--out {out}:" in line and "--overwrite" in line
    assert open(os.path.join(out, CHECKPOINT_FILE), "rb").read() == before     # untouched
    done = run_cli("train", *SMALL, "--batch-size", "4", "--max-steps", "1", "--out", out, "--overwrite")
    assert done.returncode == 0, done.stderr
    assert open(os.path.join(out, CHECKPOINT_FILE), "rb").read() != before


@pytest.mark.parametrize("command", ["quantize", "average", "convert-to", "init-from"])
def test_an_output_that_is_the_input_is_refused_even_with_overwrite(run, tmp_path, command):
    model = str(tmp_path / "model")
    shutil.copytree(run["out"], model)
    files = {name: open(os.path.join(model, name), "rb").read() for name in os.listdir(model)
             if os.path.isfile(os.path.join(model, name))}
    argv = {"quantize": ["quantize", "--model", model],
            "average": ["average", model, run["out"]],
            "convert-to": ["convert", "--to", "marian", model],
            "init-from": ["train", "--data", run["data"], "--src-col", "eng", "--tgt-col", "fake",
                          "--init-from", model, "--max-steps", "1", "--quiet"]}[command]
    line = error_line(run_cli(*argv, "--out", model, "--overwrite"), argv[0])
    assert f"--out {model}: the same directory as" in line
    assert {name: open(os.path.join(model, name), "rb").read() for name in files} == files


def test_quantize_into_a_model_directory_needs_overwrite(run, tmp_path):
    other = str(tmp_path / "other")
    shutil.copytree(run["out"], other)
    line = error_line(run_cli("quantize", "--model", run["out"], "--out", other), "quantize")
    assert "already holds a model" in line
    done = run_cli("quantize", "--model", run["out"], "--out", other, "--overwrite")
    assert done.returncode == 0, done.stderr


def test_overwrite_replaces_the_whole_run_or_model_and_keeps_what_is_not_ours(run, tmp_path):
    """--overwrite replaces what --out held: the int8 model written over a training run leaves
    no checkpoint or log of that run to resume (a resume would have continued the old run beside
    the new model), and a new run leaves nothing of the old run's --keep-best model or
    --average-last snapshots (its average would have counted them). A file that is not part of
    a run or model stays."""
    out = str(tmp_path / "out")
    shutil.copytree(run["out"], out)
    for leftover in ("best", os.path.join("snapshots", "step-9999999")):
        os.makedirs(os.path.join(out, leftover))
        open(os.path.join(out, leftover, "config.json"), "w").close()
    open(os.path.join(out, "notes.txt"), "w").write("mine")
    done = run_cli("quantize", "--model", run["out"], "--out", out, "--overwrite")
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "notes.txt",
                                       "src_tokenizer.json", "tgt_tokenizer.json"]
    line = error_line(run_cli("train", "--resume", out, "--max-steps", "3"), "train")
    assert f"--resume {out}" in line

    for leftover in ("best", os.path.join("snapshots", "step-9999999")):
        os.makedirs(os.path.join(out, leftover))
        open(os.path.join(out, leftover, "config.json"), "w").close()
    done = run_cli("train", *SMALL, "--batch-size", "4", "--max-steps", "2", "--average-last", "2",
                   "--snapshot-every", "1", "--out", out, "--overwrite")
    assert done.returncode == 0, done.stderr
    assert "best" not in os.listdir(out) and open(os.path.join(out, "notes.txt")).read() == "mine"
    assert sorted(os.listdir(os.path.join(out, "snapshots"))) == ["step-0000001", "step-0000002"]
    with open(os.path.join(out, "log.jsonl")) as f:
        assert [json.loads(line)["step"] for line in f if '"loss"' in line] == [1, 2]


def test_clear_run_leaves_a_directory_that_holds_no_run_or_model_alone(tmp_path):
    from transformer.checkpoint import clear_run
    os.makedirs(tmp_path / "best")
    (tmp_path / "log.jsonl").write_text("theirs")
    clear_run(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["best", "log.jsonl"]
    (tmp_path / "config.json").write_text("{}")
    clear_run(str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_the_builtin_demo_can_be_run_again_in_its_default_directory(tmp_path):
    argv = [sys.executable, "-m", "transformer", "train", *SMALL, "--batch-size", "4", "--max-steps", "1"]
    for _ in range(2):          # runs/builtin under the working directory, both times
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=ENV)
        assert done.returncode == 0, done.stderr
    assert os.path.exists(tmp_path / "runs" / "builtin" / CHECKPOINT_FILE)


# -- more mistakes that ended in a traceback or were silently ignored -------------------------------------

def test_sizes_that_cannot_make_a_model_are_refused_before_any_work(run):
    line = error_line(run_cli("train", "--data", run["data"], "--src-col", "eng", "--tgt-col", "fake",
                              "--d-model", "100", "--n-heads", "7", "--max-steps", "1", "--quiet"), "train")
    assert "model sizes:" in line and "n_heads (7)" in line


@pytest.mark.parametrize("value", ["3", "4"])
def test_a_vocabulary_too_small_for_the_reserved_ids_is_refused_when_parsed(value):
    done = run_cli("train", "--vocab-size", value)
    assert done.returncode == 2
    assert "argument --vocab-size: must be >= 5" in error_line(done, "train")


def test_an_unknown_argument_is_the_commands_one_line_error(run):
    done = run_cli("translate", "--model", run["out"], "--bogus", "hi")
    assert done.returncode == 2
    assert "unrecognized arguments: --bogus" in error_line(done, "translate")


def test_translate_with_standard_input_closed_is_one_line(run):
    done = subprocess.run([sys.executable, "-m", "transformer", "translate", "--model", run["out"]],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, cwd=OUTSIDE,
                          env=ENV, preexec_fn=lambda: os.close(0))
    assert "no text" in error_line(done, "translate")


def test_running_out_of_memory_is_one_line(monkeypatch, capsys):
    def too_big(args):
        raise MemoryError

    monkeypatch.setattr(info, "run", too_big)
    assert cli.main(["info"]) == 1
    assert capsys.readouterr().err.startswith("transformer info: error: out of memory")


def test_resume_with_max_steps_already_reached_is_refused(run, tmp_path):
    copy = str(tmp_path / "copy")
    shutil.copytree(run["out"], copy)
    line = error_line(run_cli("train", "--resume", copy, "--max-steps", "2"), "train")
    assert "--max-steps 2:" in line and "already trained 2 steps" in line


def test_average_last_needs_two_snapshots_and_warns_when_the_run_made_fewer(run, tmp_path):
    done = run_cli("train", *SMALL, "--average-last", "1", "--max-steps", "2")
    assert done.returncode == 2 and "must be >= 2" in error_line(done, "train")
    done = run_cli("train", *SMALL, "--batch-size", "4", "--average-last", "3", "--snapshot-every", "100",
                   "--max-steps", "2", "--out", str(tmp_path / "avg"))
    assert done.returncode == 0, done.stderr
    assert "warning: --average-last 3 found only 1 snapshot" in done.stderr


@pytest.mark.parametrize("flag, value", [("--eval-every", "5"), ("--dev-max", "10")])
def test_dev_flags_without_a_dev_split_are_refused(run, tmp_path, flag, value):
    """--dev-fraction 0 holds nothing out: --eval-every and --dev-max were silently ignored."""
    line = error_line(run_cli("train", "--data", run["data"], "--src-col", "eng", "--tgt-col", "fake",
                              *SMALL, "--dev-fraction", "0", flag, value, "--max-steps", "2",
                              "--out", str(tmp_path / "x")), "train")
    assert line.endswith(f"{flag} {value}: --dev-fraction 0 holds no pairs out, so there is no dev split to "
                         "evaluate on")


def test_keep_best_that_would_never_evaluate_is_refused(run, tmp_path):
    line = error_line(run_cli("train", *SMALL, "--keep-best", "--eval-every", "10", "--max-steps", "2",
                              "--out", str(tmp_path / "kb")), "train")
    assert "--keep-best" in line and "before the first evaluation" in line


def test_fine_tuning_takes_the_dropout_asked_for(run, tmp_path, monkeypatch):
    from transformer import train

    args = cli.build_parser().parse_args(
        ["train", "--data", run["data"], "--src-col", "eng", "--tgt-col", "fake", "--init-from", run["out"],
         "--dropout", "0.25", "--max-steps", "1", "--quiet", "--out", str(tmp_path / "ft")])
    train.load_resume(args)
    train.apply_defaults(args)
    train.prepare_out_dir(args)
    report = {}
    assert train.train_on_data(args, result=report) == 0
    assert report["trainer"].model.cfg.dropout == 0.25


def test_lines_ending_in_crlf_translate_like_lines_ending_in_lf(run):
    lf = run_cli("translate", "--model", run["out"], "--beam", "1", stdin="abc\nxyz\n")
    crlf = run_cli("translate", "--model", run["out"], "--beam", "1", stdin="abc\r\nxyz\r\n")
    assert lf.returncode == crlf.returncode == 0, crlf.stderr
    assert crlf.stdout == lf.stdout


def test_a_negative_column_names_the_column_flag(run):
    line = error_line(run_cli("evaluate", "--model", run["out"], "--data", run["data"], "--src-col", "-1"),
                      "evaluate")
    assert line.split(": error: ")[1].startswith("--src-col -1:")


def test_int8_models_are_not_averaged(run, tmp_path):
    int8 = str(tmp_path / "int8")
    assert run_cli("quantize", "--model", run["out"], "--out", int8).returncode == 0
    line = error_line(run_cli("average", run["out"], int8, "--out", str(tmp_path / "avg")), "average")
    assert f"{int8}: an int8 model" in line


def test_a_warmup_longer_than_the_budget_schedule_is_refused(run, tmp_path):
    line = error_line(run_cli("train", "--data", run["data"], "--src-col", "eng", "--tgt-col", "fake", *SMALL,
                              "--warmup", "100", "--max-steps", "3", "--out", str(tmp_path / "w")), "train")
    assert "--warmup 100: longer than the run (--max-steps 3)" in line


def test_a_max_len_beyond_the_models_positions_is_refused(run):
    """It was cut to the model's 14 positions in silence."""
    line = error_line(run_cli("translate", "--model", run["out"], "--max-len", "15", "abc"), "translate")
    assert "--max-len 15:" in line and "14 positions" in line
    done = run_cli("translate", "--model", run["out"], "--max-len", "14", "abc")
    assert done.returncode == 0, done.stderr


def test_max_sentence_tokens_beyond_the_init_from_models_positions_is_refused(run, tmp_path):
    """Left out, the default (128) is cut to the model's positions; given, it is refused."""
    argv = ["train", "--data", run["data"], "--src-col", "eng", "--tgt-col", "fake", "--init-from", run["out"],
            "--max-steps", "1", "--quiet", "--threads", "1"]
    line = error_line(run_cli(*argv, "--max-sentence-tokens", "14", "--out", str(tmp_path / "a")), "train")
    assert "--max-sentence-tokens 14:" in line and "14 positions, so at most 13" in line
    done = run_cli(*argv, "--max-sentence-tokens", "13", "--out", str(tmp_path / "b"))
    assert done.returncode == 0, done.stderr


def test_a_column_beyond_the_files_names_the_column_flag(run, tmp_path):
    """It was blamed on --data ("no usable sentence pairs")."""
    line = error_line(run_cli("evaluate", "--model", run["out"], "--data", run["data"], "--tgt-col", "2"),
                      "evaluate")
    assert line.split(": error: ")[1].startswith("--tgt-col 2:") and "at most 2 columns" in line
    plain = tmp_path / "plain.tsv"
    plain.write_text("abc def.\tCBA FED.\nhello there.\tOLLEH.\n", encoding="utf-8")
    line = error_line(run_cli("evaluate", "--model", run["out"], "--data", str(plain), "--src-col", "4"),
                      "evaluate")
    assert line.split(": error: ")[1].startswith("--src-col 4:") and "at most 2 columns" in line


def test_text_that_is_not_utf8_is_refused_not_translated(run):
    """Invalid bytes reached the model as replacement characters and came back as a translation."""
    command = [sys.executable, "-m", "transformer", "translate", "--model", run["out"]]
    done = subprocess.run(command, input=b"abc\n\xff\xfexyz\n", capture_output=True, timeout=300, cwd=OUTSIDE,
                          env=ENV)
    done = subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())
    line = error_line(done, "translate")
    assert "standard input line 2: not UTF-8 (byte 0xff at byte 1 of the line)" in line and not done.stdout
    done = subprocess.run([*map(os.fsencode, command), b"ab\xffc"], capture_output=True, text=True,
                          timeout=300, cwd=OUTSIDE, env=ENV)
    assert "argument 1: not UTF-8 text" in error_line(done, "translate")
    done = run_cli("translate", "--model", run["out"], stdin="abc\ncaf\u00e9\n")
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 2, done.stderr


def test_a_tokenizer_that_is_not_the_models_is_refused(run, tmp_path):
    """A smaller vocabulary was accepted: every id in range, every translation garbage."""
    from transformer.checkpoint import SRC_TOKENIZER_FILE
    from transformer.tokenizer import CharTokenizer

    copy = str(tmp_path / "copy")
    shutil.copytree(run["out"], copy)
    CharTokenizer("abc").save(os.path.join(copy, SRC_TOKENIZER_FILE))
    line = error_line(run_cli("translate", "--model", copy, "abc"), "translate")
    assert f"--model {copy}: the source tokenizer has" in line and "not the tokenizer the model was trained" in line


def test_a_terminal_gets_each_translation_when_its_line_is_entered(run):
    """Standard input was read to its end before anything was translated: typing a sentence at a
    terminal printed nothing until Ctrl-D."""
    import pty
    import select

    main, terminal = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "transformer", "translate", "--model", run["out"],
                                "--beam", "1"], stdin=terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               cwd=OUTSIDE, env=ENV)
    os.close(terminal)
    try:
        expected = run_cli("translate", "--model", run["out"], "--beam", "1", "abc", "hello").stdout.splitlines()
        for text, translation in zip(("abc", "hello"), expected):
            os.write(main, text.encode() + b"\n")
            ready, _, _ = select.select([process.stdout], [], [], 60)
            assert ready, "no translation before the end of the input"
            assert process.stdout.readline().decode().rstrip("\n") == translation
        os.write(main, b"\x04")          # Ctrl-D: the end of the input
        assert process.wait(timeout=120) == 0, process.stderr.read()
    finally:
        process.kill()
        process.wait()
        os.close(main)


def test_a_long_input_streams_in_blocks_in_order(run):
    """A pipe's lines are translated STDIN_BLOCK_LINES at a time; the output keeps the input's order
    and a warning numbers the line in the whole input."""
    count = 2 * translate.STDIN_BLOCK_LINES + 5
    lines = [("abc" if i % 3 else "hello") + "x" * (i % 5) for i in range(count)]
    lines[translate.STDIN_BLOCK_LINES + 9] = "abcdefghijklmnopqrstuvwxyz"   # more subwords than its 14 positions
    whole = run_cli("translate", "--model", run["out"], "--beam", "1", *lines)
    piped = run_cli("translate", "--model", run["out"], "--beam", "1", stdin="\n".join(lines) + "\n")
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == whole.stdout and len(piped.stdout.splitlines()) == count
    assert f"line {translate.STDIN_BLOCK_LINES + 10} has 26 subwords" in piped.stderr


def test_evaluate_writes_its_translations_and_the_scores_signatures(run, tmp_path):
    """The translations behind a BLEU figure, in the order of the pairs, and sacrebleu's signature
    of each score (what makes it comparable with another paper's or tool's)."""
    import sacrebleu

    corpus = tmp_path / "pairs.tsv"
    sources, refs = ["abc de.", "hello there.", "xyz."], ["CBA ED.", "OLLEH EREHT.", "ZYX."]
    corpus.write_text("".join(f"{s}\t{t}\n" for s, t in zip(sources, refs)), encoding="utf-8")
    out = str(tmp_path / "hyps.txt")
    done = run_cli("evaluate", "--model", run["out"], "--data", str(corpus), "--beam", "1", "--output", out)
    assert done.returncode == 0, done.stderr
    hyps = open(out, encoding="utf-8").read().split("\n")
    assert hyps[-1] == "" and len(hyps) == 4
    assert hyps[:3] == run_cli("translate", "--model", run["out"], "--beam", "1", *sources).stdout.splitlines()
    result = json.loads(done.stdout)
    assert result["bleu"] == round(sacrebleu.corpus_bleu(hyps[:3], [refs]).score, 2)
    assert result["chrf"] == round(sacrebleu.corpus_chrf(hyps[:3], [refs]).score, 2)
    assert result["signature"]["bleu"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    line = error_line(run_cli("evaluate", "--model", run["out"], "--data", str(corpus), "--output",
                              str(tmp_path / "no" / "h.txt")), "evaluate")
    assert "--output" in line and "no folder" in line


def test_header_says_whether_line_1_is_a_pair(run, tmp_path):
    # the summary printed before any work names a line 1 read as the header; --header no keeps it
    data = tmp_path / "words.tsv"
    data.write_text("abc\tCBA\nhello\tOLLEH\n", encoding="utf-8")
    auto = run_cli("evaluate", "--model", run["out"], "--data", str(data), "--beam", "1")
    assert auto.returncode == 0, auto.stderr
    assert "1 pairs (line 1 read as the header: abc, CBA)" in auto.stderr
    kept = run_cli("evaluate", "--model", run["out"], "--data", str(data), "--beam", "1", "--header", "no")
    assert kept.returncode == 0, kept.stderr
    assert f"{data}: 2 pairs" in kept.stderr and "read as the header" not in kept.stderr
    named = run_cli("evaluate", "--model", run["out"], "--data", str(data), "--header", "no", "--src-col", "abc")
    assert "--src-col abc: " in error_line(named, "evaluate")


def test_a_resumed_run_reads_its_data_with_the_header_rule_it_started_with(tmp_path):
    data = tmp_path / "words.tsv"
    data.write_text("".join(f"w{i}\tW{i}\n" for i in range(40)), encoding="utf-8")
    out = str(tmp_path / "run")
    first = run_cli("train", "--data", str(data), "--header", "no", *SMALL, "--vocab-size", "40",
                    "--max-steps", "1", "--out", out)
    assert first.returncode == 0, first.stderr
    assert f"{data}: 40 pairs" in first.stderr
    other = run_cli("train", "--resume", out, "--header", "yes", "--max-steps", "2", "--quiet")
    assert error_line(other, "train").startswith("transformer train: error: --header yes: ")
    same = run_cli("train", "--resume", out, "--max-steps", "2", "--threads", "1")
    assert same.returncode == 0, same.stderr
    assert f"{data}: 40 pairs" in same.stderr


def test_translate_and_evaluate_decode_frozen_weights(run, monkeypatch, capsys):
    # they load a model no one else holds, so its weights are read-only and decoding trusts the
    # matrices it converted (prepared.py) instead of reading every weight again on each call
    from transformer.params import Parameters

    frozen = []
    real = Parameters.freeze
    monkeypatch.setattr(Parameters, "freeze", lambda self: frozen.append(self) or real(self))
    assert cli.main(["translate", "--model", run["out"], "abc", "hello"]) == 0
    assert cli.main(["evaluate", "--model", run["out"], "--data", run["data"], "--beam", "1"]) == 0
    assert len(frozen) == 2 and all(p.frozen is not None and not p.flat.flags.writeable for p in frozen)
    assert len(capsys.readouterr().out.splitlines()) >= 2
