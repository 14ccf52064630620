"""Marian's leg of the race (bench/race_marian.py): the recipe scaled to the budget, the corpus as
Marian reads it and back, the timing read from its log, and a whole run against a stand-in
`pymarian` (the real one is a 600 MB benchmark-only wheel, never a test requirement)."""
import os
import subprocess
import sys
import textwrap

import pytest

import transformer
from transformer import cli, train
from transformer.bench import race, race_marian
from transformer.config import PRESETS
from transformer.corpus import TrainingSet
from transformer.training.data import open_corpus

from test_train_auto import BASE, race_record, write_corpus


def flag(flags, name):
    return flags[flags.index(name) + 1]


@pytest.mark.parametrize("shape", race_marian.SHAPES)
def test_the_recipe_is_ours_shape_with_its_schedule_scaled_to_the_budget(shape):
    flags = race_marian.recipe_flags(shape, 1077, threads=2, lr=3e-4, batch_tokens=2048, max_tokens=128, seed=0)
    p = PRESETS[shape]
    assert [int(flag(flags, f)) for f in ("--dim-emb", "--transformer-heads", "--transformer-dim-ffn",
                                          "--enc-depth", "--dec-depth")] == \
        [p["d_model"], p["n_heads"], p["d_ff"], p["n_encoder_layers"], p["n_decoder_layers"]]
    assert flag(flags, "--after") == "1077u"
    assert flag(flags, "--lr-warmup") == flag(flags, "--lr-decay-inv-sqrt") == "54"     # 5% of the updates
    assert flag(flags, "--mini-batch-words") == "2048" and flag(flags, "--cpu-threads") == "2"
    assert flag(flags, "--transformer-postprocess") == "dan" and "--exponential-smoothing" in flags


def test_marian_reads_the_training_pairs_ours_keeps_and_its_words_decode_back(tmp_path, monkeypatch):
    monkeypatch.setenv("TRANSFORMER_CACHE", str(tmp_path / "cache"))
    args = cli.build_parser().parse_args(["train", "--data", write_corpus(tmp_path / "pairs.tsv"), *BASE,
                                          ])
    train.load_resume(args)
    train.apply_defaults(args)
    corpus = open_corpus(args)
    data = TrainingSet(corpus, 6, 300, 0, 1, 2, 0)
    assert data.dropped > 0         # the length filter left some pairs out: Marian must not see them
    dev = [s for s, _ in corpus.dev]
    race_marian.export(data, dev, tmp_path / "m")
    src = (tmp_path / "m" / "train.src").read_text().splitlines()
    tgt = (tmp_path / "m" / "train.tgt").read_text().splitlines()
    assert len(src) == len(tgt) == len(data)
    for i, row in enumerate(data.rows):
        assert race_marian.read_words(src[i]) == list(corpus.sentence("src", int(row)))
        assert race_marian.read_words(tgt[i]) == list(corpus.sentence("tgt", int(row)))
    lines = (tmp_path / "m" / "dev.src").read_text().splitlines()
    assert [corpus.src_tokenizer.decode(race_marian.read_words(line)) for line in lines] == \
        [corpus.src_tokenizer.decode(corpus.src_tokenizer.encode(s)) for s in dev]


def test_marian_words_that_are_not_ours_are_dropped():
    assert race_marian.read_words("w3 <unk> w17 w x9 w2") == [3, 17, 2]


def test_seconds_per_update_is_the_median_over_displays_after_the_first(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("[t] Allocating memory\n"
                   "[t] Ep. 1 : Up. 20 : Sen. 1 : Cost 8 : Time 99.00s : 10 words/s\n"
                   "[t] Ep. 1 : Up. 40 : Sen. 2 : Cost 7 : Time 8.00s : 10 words/s\n"
                   "[t] Ep. 1 : Up. 60 : Sen. 3 : Cost 6 : Time 12.00s : 10 words/s\n"
                   "[t] Ep. 1 : Up. 80 : Sen. 4 : Cost 6 : Time 10.00s : 10 words/s\n")
    assert race_marian.seconds_per_update(log) == pytest.approx(0.5)
    log.write_text("[t] Ep. 1 : Up. 20 : Sen. 1 : Cost 8 : Time 9.00s : 10 words/s\n")
    with pytest.raises(RuntimeError, match="fewer than two progress lines"):
        race_marian.seconds_per_update(log)


# a stand-in for pymarian: its trainer writes Marian's log lines (0.5 s an update), the model and the
# --save-freq snapshots; its Translator is perfect on write_corpus's pairs (the target is the source
# reversed): source words -> source text -> reversed -> target words, through the prepared corpus's
# tokenizers. So the held-out BLEU is 100 exactly when the words, the ids and the scoring agree.
FAKE_MAIN = """
import os, signal, sys, time
a = sys.argv[1:]
def value(name):
    return a[a.index(name) + 1]
if "--version" in a:
    print("v0-stand-in"); sys.exit(0)
updates, every, shown = int(value("--after")[:-1]), int(value("--save-freq")[:-1]) if "--save-freq" in a else 0, 20
model = value("--model")
def save_and_exit(*_):
    open(model, "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, save_and_exit)
pause = float(os.environ.get("FAKE_MARIAN_SECONDS", "0"))    # wall-clock seconds an update
with open(value("--log"), "w", buffering=1) as log:
    log.write(" ".join(a) + "\\n")
    for u in range(shown, updates + 1, shown):
        time.sleep(pause * shown)
        log.write(f"[t] Ep. 1 : Up. {u} : Sen. {u} : Cost 5.0 : Time {0.5 * shown:.2f}s : 4000 words/s\\n")
for u in range(every, updates + 1, every or updates + 1):
    open(model.replace(".npz", f".iter{u}.npz"), "w").close()
open(model, "w").close()
"""
FAKE_INIT = """
import glob, os, sys
sys.path.insert(0, os.environ["FAKE_MARIAN_TRANSFORMER_ROOT"])    # ours, not a checkout's uncompiled copy
from transformer.tokenizer import tokenizer_from_json

class Translator:
    def __init__(self, **kwargs):
        assert kwargs["beam_size"] in (1, 4)
        [prepared] = glob.glob(os.path.join(os.environ["TRANSFORMER_CACHE"], "prepared", "*"))
        self.src, self.tgt = (tokenizer_from_json(open(os.path.join(prepared, f"{side}_tokenizer.json")).read())
                              for side in ("src", "tgt"))
    def translate(self, lines):
        texts = [self.src.decode([int(w[1:]) for w in line.split()]) for line in lines]
        return [" ".join(f"w{i}" for i in self.tgt.encode(text[::-1])) for text in texts]
"""


@pytest.fixture
def fake_pymarian(tmp_path, monkeypatch):
    package = tmp_path / "fake" / "pymarian"
    package.mkdir(parents=True)
    (package / "__main__.py").write_text(textwrap.dedent(FAKE_MAIN))
    (package / "__init__.py").write_text(textwrap.dedent(FAKE_INIT))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "fake"), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("TRANSFORMER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FAKE_MARIAN_TRANSFORMER_ROOT", os.path.dirname(os.path.dirname(transformer.__file__)))
    return sys.executable


def test_a_marian_run_trains_the_updates_its_own_step_time_buys_and_scores_them(tmp_path, fake_pymarian, capsys):
    data = write_corpus(tmp_path / "pairs.tsv")
    records = tmp_path / "m.jsonl"
    assert race_marian.main(["--marian-python", fake_pymarian, "--data", data, *BASE, "--minutes", "0.5",
                             "--out", str(tmp_path / "run"), "--json", str(records)]) == 0
    record = race.read_records([records])[-1]
    assert record["step_seconds"] == pytest.approx(0.5)           # read from the probe's log
    assert record["planned_steps"] == record["steps"] == 60          # 30 s at 0.5 s an update
    assert "--after 60u" in record["flags"] and "--lr-warmup 3 " in record["flags"]
    assert record["marian_lr"] == pytest.approx(0.032 * 128 ** -0.5)    # ours' peak for tiny, by default
    assert f"--learn-rate {record['marian_lr']:g} " in record["flags"]
    assert record["marian_version"] == "v0-stand-in" and record["dev_pairs"] == 10
    assert [p[1] for p in record["curve"]] == list(range(6, 61, 6))  # ten snapshots
    assert [p[0] for p in record["curve"]] == pytest.approx([3.0 * i for i in range(1, 11)])
    assert [p[2] for p in record["curve"]] == pytest.approx([100.0] * 10)
    assert record["greedy"]["bleu"] == record["beam4"]["bleu"] == pytest.approx(100.0)
    assert not os.path.exists(tmp_path / "run" / "probe")


def test_a_marian_run_that_outlasts_its_budget_is_stopped_by_the_clock(tmp_path, fake_pymarian, monkeypatch):
    monkeypatch.setenv("FAKE_MARIAN_SECONDS", "0.05")     # 20 s for the 400 updates its 3 s buy at 0.0075 s
    data = write_corpus(tmp_path / "pairs.tsv")
    records = tmp_path / "m.jsonl"
    assert race_marian.main(["--marian-python", fake_pymarian, "--data", data, *BASE, "--minutes", "0.05",
                             "--step-seconds", "0.0075", "--out", str(tmp_path / "run"), "--json", str(records)]) == 0
    record = race.read_records([records])[-1]
    assert record["planned_steps"] == 400 and record["stopped_by_clock"]
    assert 0 < record["steps"] < 400 and record["steps"] % 20 == 0      # the last update it displayed
    assert record["seconds"] < 10


def test_the_race_gives_marian_the_shape_ours_picked_and_ranks_it(tmp_path, fake_pymarian):
    data = write_corpus(tmp_path / "pairs.tsv")
    records = tmp_path / "race.jsonl"
    assert race.main(["run", "--data", data, *BASE, "--budgets", "0.05", "--systems", "ours,marian",
                      "--marian-python", fake_pymarian, "--threads", "1", "--json", str(records),
                      "--out-dir", str(tmp_path / "runs")]) == 0
    ours, marian = race.read_records([records])
    assert (ours["system"], marian["system"]) == ("ours", "marian")
    assert marian["preset"] == ours["preset"] in race_marian.SHAPES
    assert marian["budget_minutes"] == 0.05


def test_the_race_refuses_marian_without_pymarian(tmp_path):
    if subprocess.run([sys.executable, "-c", "import pymarian"], capture_output=True).returncode == 0:
        pytest.skip("pymarian is installed here")
    with pytest.raises(SystemExit, match="--systems marian: .* cannot import pymarian"):
        race.main(["run", "--data", "x.tsv", "--systems", "marian", "--json", str(tmp_path / "r.jsonl")])


def test_the_race_table_times_ours_to_marians_ten_minute_bleu():
    rows = race.table([race_record("ours", 2, 18.0, []), race_record("ours", 5, 24.0, []),
                       race_record("marian", 10, 20.0, [[600.0, 1000, 19.0]])])
    ratio = rows[-1]
    assert ratio["reference"] == "marian" and ratio["ours_minutes_by_budgets"] == pytest.approx(2 + 3 * 2 / 6)
    assert ratio["time_ratio_by_budgets"] == pytest.approx(10 / (2 + 3 * 2 / 6), rel=1e-2)


def test_the_suites_own_flags_are_taken_out_the_last_given_wins_and_a_missing_value_is_named():
    from transformer.bench.quality import pop_options

    argv = ["--data", "x.tsv", "--json", "a.jsonl", "--minutes", "2", "--json", "b.jsonl"]
    assert pop_options(argv, {"--json": None, "--engine": "ours"}) == {"--json": "b.jsonl", "--engine": "ours"}
    assert argv == ["--data", "x.tsv", "--minutes", "2"]        # the rest is train's
    with pytest.raises(SystemExit, match="--json needs a value"):
        pop_options(["--data", "x.tsv", "--json"], {"--json": None})
