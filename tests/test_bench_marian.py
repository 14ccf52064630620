"""The MarianMT benchmark (transformer/bench/marian.py) at a tiny size: the records it makes, and
that every engine generated the same number of tokens. Timings are not asserted. Its refusals (a
short count, options it does not read) need none of the engines, and run without them."""
import io
import json
import os

import pytest

from transformer.bench import marian

RATIO_RTOL = 1e-9
COMMON = {"bench", "kernel", "measured", "config", "shape", "cpu", "threads", "precision", "tokens", "repeats",
          "ours_per_s", "ours_s", "ours_spread_s", "reference", "ref_per_s", "ratio", "versions"}


SEEN_CPUS = []       # the CPUs this process may use at each timed comparison of tiny_run


@pytest.fixture(scope="module")
def tiny_run():
    for name in ("torch", "transformers", "sentencepiece", "ctranslate2"):   # the engines it compares
        pytest.importorskip(name)
    original = marian.alternate

    def watching(*args, **kwargs):
        SEEN_CPUS.append(sorted(os.sched_getaffinity(0)))
        return original(*args, **kwargs)

    stream = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(marian, "alternate", watching)
        records = marian.run([1], quick=True, config="tiny", stream=stream)
    return records, stream.getvalue()


def test_every_engine_is_timed_on_the_same_first_cpu(tiny_run):
    """One thread: every comparison (decoding and fine-tuning) runs held to the first CPU of this
    process's set, CTranslate2's translators too (affinity is inherited); the set comes back after."""
    records, _ = tiny_run
    allowed = sorted(os.sched_getaffinity(0))
    assert len(SEEN_CPUS) == 3           # greedy, beam 4 (fp32 and int8 alternate in each), fine-tuning
    assert all(seen == allowed[:1] for seen in SEEN_CPUS)
    assert all(r["cpus"] == allowed[:1] for r in records)


def test_one_json_line_per_record(tiny_run):
    records, printed = tiny_run
    assert [json.loads(line) for line in printed.splitlines()] == records


def test_decoding_records_cover_both_searches_and_precisions(tiny_run):
    records, _ = tiny_run
    kinds = [(r["kernel"], r["threads"]) for r in records]
    assert kinds == [("marian decode greedy fp32", 1), ("marian decode greedy int8", 1),
                     ("marian decode beam 4 fp32", 1), ("marian decode beam 4 int8", 1),
                     ("marian fine-tune fp32", 1)]
    for r in records:
        assert COMMON <= set(r), COMMON - set(r)
        assert set(r["versions"]) == {"ctranslate2", "transformers", "torch"}
        assert r["cpu"] and r["ours_per_s"] > 0 and r["ref_per_s"] > 0
        assert r["ratio"] == pytest.approx(r["ours_per_s"] / r["ref_per_s"], rel=RATIO_RTOL)


def test_every_engine_generated_the_same_tokens(tiny_run):
    records, _ = tiny_run
    new_tokens = marian.RUNS[True]["new_tokens"]
    for r in records[:4]:
        want = {"ours", "ctranslate2", "transformers"} if r["precision"] == "fp32" else {"ours", "ctranslate2"}
        assert set(r["generated"]) == want, r["kernel"]
        assert r["tokens"] == r["batch"] * new_tokens
        assert all(n == r["tokens"] for n in r["generated"].values()), r["generated"]
        assert r["vs_ctranslate2"] == r["ratio"] and r["reference"] == "ctranslate2"
        assert r["ctranslate2_compute_type"] == {"fp32": "float32", "int8": "int8"}[r["precision"]]
        assert r["weights"] == "frozen"          # as translate holds them; fine-tuning after, unfrozen
    assert records[0]["vs_transformers"] > 0 and "transformers_skipped" in records[1]


def test_fine_tuning_record_compares_the_same_loss(tiny_run):
    record = tiny_run[0][-1]
    assert record["reference"] == "transformers" and record["vs_transformers"] == record["ratio"]
    # same weights and batch, different dropout masks: the first losses are close, not equal
    first = record["first_loss"]
    assert first["ours"] == pytest.approx(first["transformers"], rel=0.05)


def test_a_short_count_is_refused():
    assert marian.check_counts("ours", [16, 16], 2, 16) == 32
    with pytest.raises(RuntimeError, match="ctranslate2 generated \\[16, 15\\]"):
        marian.check_counts("ctranslate2", [16, 15], 2, 16)
    with pytest.raises(RuntimeError, match="expected 16 each"):
        marian.check_counts("transformers", [16], 2, 16)


@pytest.mark.parametrize("argv, match", [
    (["--what", "marian", "--config", "base"], "--config base: --what marian takes opus or tiny"),
    (["--what", "marian", "--precision", "int8"], "--precision does not apply to --what marian"),
])
def test_command_line_refuses_what_the_suite_does_not_read(argv, match, capsys):
    from transformer import cli
    assert cli.main(["bench", *argv, "--threads", "1"]) != 0
    assert match in capsys.readouterr().err
