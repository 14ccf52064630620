"""The run's own choices (issue 44): --precision auto resolved on the CPU at hand, and a model sized
to the budget when no size flag is given; every choice printed, kept in the checkpoint, and
overruled by any flag the user gives."""
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from transformer import _C, cli
from transformer.checkpoint import load_checkpoint
from transformer.training import precision, sizing

from conftest import benchmark_script

BASE = ["--src-col", "eng", "--tgt-col", "fake", "--vocab-size", "60", "--batch-tokens", "300", "--quiet",
        "--threads", "1", "--dev-fraction", "0.1"]
SMALL = ["--d-model", "32", "--n-heads", "2", "--d-ff", "64", "--n-encoder-layers", "1", "--n-decoder-layers", "1"]
OUTSIDE = tempfile.gettempdir()


def write_corpus(path, n=120, seed=0):
    rng = np.random.default_rng(seed)
    words = ["red", "blue", "cat", "dog", "runs", "sleeps", "the", "a", "big", "small"]
    lines = ["eng\tfake"] + [" ".join(rng.choice(words, size=rng.integers(2, 7))) for _ in range(n)]
    path.write_text("\n".join(lines[:1] + [f"{s}\t{s[::-1]}" for s in lines[1:]]) + "\n", encoding="utf-8")
    return str(path)


# -- --precision auto ------------------------------------------------------------------------------

def probe_says(ratio, calls):
    """A stand-in for the probe: bf16's products `ratio` times as fast as fp32's."""
    def speedup():
        calls.append(ratio)
        return ratio
    return speedup


@pytest.mark.parametrize("level, native", [("amx", True), ("avx512_bf16", True), ("avx512", False),
                                           ("avx2", False), ("generic", False)])
@pytest.mark.parametrize("ratio", [2.0, 0.6])
def test_auto_is_bf16_where_the_level_multiplies_bf16_natively_and_the_probe_finds_it_faster(level, native, ratio):
    calls = []
    chosen, why = precision.resolve("auto", level=level, speedup=probe_says(ratio, calls))
    assert chosen == ("bf16" if native and ratio >= precision.BF16_PAYS else "fp32"), why
    assert why.startswith("auto: ")
    assert calls == ([ratio] if native else [])      # no probe where the instruction is missing
    if native:
        assert precision.NATIVE_BF16[level] in why and f"{ratio:.2f}x as fast" in why
    else:
        assert level in why


def test_auto_keeps_fp32_where_bf16_is_faster_by_less_than_it_pays():
    below = precision.BF16_PAYS * 0.99
    assert precision.resolve("auto", level="amx", speedup=lambda: below)[0] == "fp32"
    assert precision.resolve("auto", level="amx", speedup=lambda: precision.BF16_PAYS)[0] == "bf16"


def test_the_probe_times_both_precisions_on_the_level_in_use_once_a_process(monkeypatch):
    seen = []
    real_gemm = _C.gemm

    def gemm(a, b, out, trans_a=False, bf16=False, **kw):
        seen.append(bf16)
        return real_gemm(a, b, out, trans_a=trans_a, bf16=bf16, **kw)

    monkeypatch.setattr(_C, "gemm", gemm)
    monkeypatch.setattr(precision, "_measured", {})
    ratio = precision.measured_speedup()
    assert 0 < ratio < float("inf")
    per_round = len(precision.PROBE_SHAPES)
    assert seen.count(True) == seen.count(False) == per_round * (precision.PROBE_ROUNDS + 1)
    assert precision.measured_speedup() == ratio and len(seen) == 2 * per_round * (precision.PROBE_ROUNDS + 1)


@pytest.mark.parametrize("rank", [0, 1])
def test_under_mpirun_rank_zero_alone_decides_and_every_rank_takes_its_answer(monkeypatch, rank):
    import argparse
    import types

    from transformer import distributed
    from transformer.training.world import rank_zero_decides

    sent = []

    class World:      # COMM_WORLD of two ranks: bcast gives every rank what rank 0 sent
        def bcast(self, value, root=0):
            assert root == 0
            sent.append(value)
            return ("bf16", "rank 0's answer")

    monkeypatch.setattr(distributed, "import_mpi", lambda: types.SimpleNamespace(COMM_WORLD=World()))
    probed = []
    decide = lambda: probed.append(rank) or ("fp32", f"rank {rank}'s own")   # noqa: E731
    got = rank_zero_decides(argparse.Namespace(world=(rank, 2)), decide)
    assert got == ("bf16", "rank 0's answer")
    assert probed == ([0] if rank == 0 else [])          # only rank 0 measures
    assert sent == [("fp32", "rank 0's own") if rank == 0 else None]
    assert rank_zero_decides(argparse.Namespace(), decide)[1] == f"rank {rank}'s own"   # one process


@pytest.mark.parametrize("given", ["fp32", "bf16"])
def test_a_precision_given_wins_over_auto_on_every_level(given):
    for level in ("amx", "avx2"):
        assert precision.resolve(given, level=level)[0] == given


def test_bf16_asked_on_a_level_without_it_is_honoured_and_warned_about():
    chosen, why = precision.resolve("bf16", level="avx2")
    assert chosen == "bf16" and "slower than fp32" in why


@pytest.mark.parametrize("ratio", [2.0, 0.6])
def test_a_new_run_says_its_precision_and_why_and_its_checkpoint_keeps_it(tmp_path, capsys, monkeypatch, ratio):
    monkeypatch.setattr(precision, "measured_speedup", lambda: ratio)
    data = write_corpus(tmp_path / "pairs.tsv")
    out = str(tmp_path / "run")
    assert cli.main(["train", "--data", data, *BASE, *SMALL, "--max-steps", "2", "--out", out]) == 0
    expected = "bf16" if _C.isa() in precision.NATIVE_BF16 and ratio >= precision.BF16_PAYS else "fp32"
    err = capsys.readouterr().err
    assert f"precision: {expected} (auto: " in err
    assert load_checkpoint(out).args["precision"] == expected
    assert "precision_why" not in load_checkpoint(out).args


@pytest.mark.parametrize("level", ["avx2", "amx"])
def test_auto_follows_the_dispatch_level_forced_by_transformer_isa(tmp_path, level):
    if level not in _C.isa_levels() or _C.isa_levels().index(level) > _C.isa_levels().index(_C.best_isa()):
        pytest.skip(f"this CPU cannot run the {level} level")
    data = write_corpus(tmp_path / "pairs.tsv")
    out = str(tmp_path / "run")
    done = subprocess.run([sys.executable, "-m", "transformer", "train", "--data", data, *BASE, *SMALL,
                           "--max-steps", "1", "--out", out], capture_output=True, text=True, timeout=300,
                          cwd=OUTSIDE, env={**os.environ, "TRANSFORMER_ISA": level})
    assert done.returncode == 0, done.stderr
    expected = "fp32"
    if level in precision.NATIVE_BF16:   # the choice the probe's figure, printed, calls for
        ratio = float(re.search(r"ran them (?:only )?([0-9.]+)x as fast", done.stderr).group(1))
        expected = "bf16" if ratio >= precision.BF16_PAYS else "fp32"
    assert f"precision: {expected} (auto: " in done.stderr
    assert load_checkpoint(out).args["precision"] == expected


def test_a_resumed_run_keeps_its_precision_and_says_whence(tmp_path, capsys):
    data = write_corpus(tmp_path / "pairs.tsv")
    out = str(tmp_path / "run")
    assert cli.main(["train", "--data", data, *BASE, *SMALL, "--precision", "fp32", "--schedule", "noam",
                     "--max-steps", "2", "--out", out]) == 0
    capsys.readouterr()
    assert cli.main(["train", "--resume", out, "--max-steps", "3", "--quiet"]) == 0
    assert "precision: fp32 (the run's own, from its checkpoint" in capsys.readouterr().err
    assert load_checkpoint(out).args["precision"] == "fp32"


# -- the model sized to the budget ---------------------------------------------------------------

def fake_clock(costs):
    """A step timer that reports `costs[name]` seconds."""
    return lambda name, sizes: costs[name]


COSTS = {"tiny": 0.1, "medium-4-2": 0.2, "small": 0.3}


def test_choose_takes_the_highest_predicted_curve_and_the_cheaper_one_within_a_tie(monkeypatch):
    monkeypatch.setattr(sizing, "CURVES", {"tiny": (30, 0), "medium-4-2": (33, 0), "small": (33.4, 0)})
    choice = sizing.choose(600, fake_clock(COSTS), clock=lambda: 0.0)
    assert choice.name == "medium-4-2"       # small's 33.4 is within TIE of 33: the cheaper wins
    assert [row[0] for row in choice.rows] == list(sizing.CANDIDATES)
    assert [row[2] for row in choice.rows] == [int(600 / c) for c in COSTS.values()]


def test_choose_stops_at_a_candidate_the_budget_cannot_train(monkeypatch):
    monkeypatch.setattr(sizing, "CURVES", {name: (30 + i, 0) for i, name in enumerate(sizing.CANDIDATES)})
    choice = sizing.choose(sizing.MIN_STEPS * 0.2, fake_clock(COSTS), clock=lambda: 0.0)
    # tiny gets 600 steps, medium-4-2 300, small 200 < MIN_STEPS: measured, and not a candidate
    assert [row[0] for row in choice.rows] == ["tiny", "medium-4-2"]
    assert choice.name == "medium-4-2"


def test_choose_counts_steps_past_a_curves_measured_passes_as_those_passes_and_respects_max_steps():
    assert set(sizing.MEASURED_PASSES) == set(sizing.CANDIDATES)
    spp = 468       # the Bible's
    for name, passes in sizing.MEASURED_PASSES.items():
        capped = sizing.predicted_bleu(name, 100_000, steps_per_pass=spp)
        assert capped == sizing.predicted_bleu(name, passes * spp, steps_per_pass=spp) > 10, name
        assert sizing.predicted_bleu(name, 100_000) > capped, name
        # a budget within the measured passes is not capped: one step fewer predicts less
        within = int(passes * spp) - 1
        assert 10 < sizing.predicted_bleu(name, within, steps_per_pass=spp) < capped, name
    choice = sizing.choose(600, fake_clock(COSTS), max_steps=400, clock=lambda: 0.0)
    assert all(row[2] <= 400 for row in choice.rows)


def test_a_candidate_is_judged_at_the_passes_it_was_measured_to(monkeypatch):
    # equal curves: only the cap tells the candidates apart. 10 steps a pass, 600 s: tiny gets 6000
    # steps, counted as its measured passes; medium-4-2's shorter range makes it the lower prediction
    monkeypatch.setattr(sizing, "ALPHA", 0.5)
    monkeypatch.setattr(sizing, "REPEATS", {})      # every step counts: the cap alone
    monkeypatch.setattr(sizing, "CURVES", {name: (40, 200) for name in sizing.CANDIDATES})
    monkeypatch.setattr(sizing, "MEASURED_PASSES", {"tiny": 30.0, "medium-4-2": 5.0, "small": 4.0})
    choice = sizing.choose(600, fake_clock(COSTS), steps_per_pass=10, clock=lambda: 0.0)
    assert [row[3] for row in choice.rows] == [sizing.predicted_bleu(n, int(p * 10))
                                              for n, p in sizing.MEASURED_PASSES.items()]
    assert choice.name == "tiny"
    assert "its curve is measured to 30" in choice.why and choice.why in choice.describe(600)
    # a corpus of many pairs: no cap binds, the curves and the step counts decide as before
    monkeypatch.setattr(sizing, "CURVES", {"tiny": (30, 0), "medium-4-2": (33, 0), "small": (33.4, 0)})
    choice = sizing.choose(600, fake_clock(COSTS), steps_per_pass=1_000_000, clock=lambda: 0.0)
    assert choice.why is None and choice.name == "medium-4-2"


def test_layernorms_measured_ranges_decide_ten_and_thirty_minutes_of_this_cpu_as_measured():
    # the LayerNorm model's curves (--norm layer; the default until 2026-12-05). 2 Xeon (family 6
    # model 207, AMX) threads, bf16, on the Bible (468 steps a pass). Thirty minutes:
    # medium-4-2 (10,400 steps, 22 passes, dropout 0.1) gave greedy BLEU 33.32 against tiny's 32.46
    # (17,300 steps), and it is picked; ten minutes: tiny (28.7), medium-4-2's 3,460 steps are below
    costs = {"tiny": 0.104, "medium-4-2": 0.173, "small": 0.26}

    def pick(seconds, steps_per_pass=468):
        return sizing.choose(seconds, fake_clock(costs), steps_per_pass=steps_per_pass, clock=lambda: 0.0,
                             norm="layer").name

    assert pick(1800) == "medium-4-2" and pick(600) == "tiny"
    # an hour: small's curve is measured to 4.4 passes only, so the ranges keep it out; the curves
    # alone, extrapolated, would have taken it
    assert pick(3600) == "medium-4-2" and pick(3600, steps_per_pass=None) == "small"


def test_the_default_models_curves_pick_as_measured_on_this_zen4():
    # the default model's curves (ScaleNorm + FixNorm; notes of 2026-12-05) with the step times a
    # ten-minute run's probe measured on 2 Zen 4 threads (family 25 model 17), bf16. On the Bible
    # (468 steps a pass): tiny at ten minutes; from thirty, medium-4-2, as two seeds measured at
    # thirty minutes' steps (10,400 against tiny's 17,300: +1.02 and +0.86 BLEU greedy). On a corpus
    # of a million pairs no pass repeats, and tiny's steps, 2.2x as many, win up to two hours
    costs = {"tiny": 0.085, "medium-4-2": 0.186, "small": 0.30}

    def pick(minutes, steps_per_pass=468):
        return sizing.choose(minutes * 60, fake_clock(costs), steps_per_pass=steps_per_pass, clock=lambda: 0.0).name

    assert [pick(m) for m in (10, 20, 30, 60, 120)] == ["tiny", "tiny", "medium-4-2", "medium-4-2", "medium-4-2"]
    assert [pick(m, 1_000_000 // 64) for m in (10, 45, 60, 120)] == ["tiny"] * 4
    # the measured runs themselves: medium-4-2's 10,400 steps ahead of tiny's 17,300 by more than TIE
    gap = sizing.predicted_bleu("medium-4-2", 10_400, 468) - sizing.predicted_bleu("tiny", 17_300, 468)
    assert sizing.TIE < gap < 2.0
    for norm in ("scale", "layer"):
        assert set(sizing.fitted(norm)[1]) == set(sizing.fitted(norm)[2]) == set(sizing.CANDIDATES)
    assert set(sizing.REPEATS) == set(sizing.CANDIDATES)


def test_effective_steps_count_the_kth_repeat_of_the_corpus_at_exp_minus_k_over_r():
    # the oracle: integrate each repeat's worth, exp(-r / R*) a step at repeat r, numerically
    spp, r_star = 468, 12.2
    for steps in (1, 200, 468, 469, 1000, 5000, 17_300, 200_000):
        again = np.linspace(0.0, max(steps / spp - 1, 0.0), 200_001)
        worth = np.exp(-again / r_star)
        integral = float(np.sum((worth[1:] + worth[:-1]) / 2 * np.diff(again)))
        expected = min(steps, spp) + spp * integral
        assert sizing.effective_steps(steps, spp, r_star) == pytest.approx(expected, rel=1e-7), steps
    # the first pass counts in full; and a corpus of unknown size, or no R*, counts every step
    assert sizing.effective_steps(468, spp, r_star) == 468.0
    assert sizing.effective_steps(10_000, None, r_star) == sizing.effective_steps(10_000, spp, None) == 10_000.0
    # more steps are never worth less, and never more than R* passes of fresh pairs past the first
    values = [sizing.effective_steps(s, spp, r_star) for s in range(0, 400_000, 997)]
    assert values == sorted(values) and values[-1] <= spp * (1 + r_star)


def test_a_smaller_repeat_constant_flattens_a_curve_on_a_small_corpus_only(monkeypatch):
    monkeypatch.setattr(sizing, "ALPHA", 0.5)
    monkeypatch.setattr(sizing, "CURVES", {name: (40, 200) for name in sizing.CANDIDATES})
    monkeypatch.setattr(sizing, "MEASURED_PASSES", {name: 100.0 for name in sizing.CANDIDATES})
    monkeypatch.setattr(sizing, "REPEATS", {"tiny": 5.0, "medium-4-2": 50.0, "small": 50.0})
    # equal curves: 10 passes of a 100-step corpus are worth less to tiny than to medium-4-2
    assert sizing.predicted_bleu("tiny", 1000, 100) < sizing.predicted_bleu("medium-4-2", 1000, 100)
    # within the first pass, or on a corpus too large to say, they are the same
    assert sizing.predicted_bleu("tiny", 100, 100) == sizing.predicted_bleu("medium-4-2", 100, 100)
    assert sizing.predicted_bleu("tiny", 1000) == sizing.predicted_bleu("medium-4-2", 1000)


def test_size_curves_recovers_the_constants_its_points_were_drawn_from():
    script = benchmark_script("size_curves")
    spp = script.STEPS_PER_PASS
    truth = {"tiny": (60.0, 300.0, 10.0, 40 * spp), "medium-4-2": (62.0, 310.0, 30.0, 24 * spp),
             "small": (64.0, 320.0, None, 4 * spp)}       # small's R*: too few passes, it takes medium-4-2's
    alpha = 0.3
    points = {}
    for name, (a, b, r, last) in truth.items():
        r = r or truth["medium-4-2"][2]
        points[name] = [(s, a - b * sizing.effective_steps(s, spp, r) ** -alpha)
                        for s in np.linspace(script.MIN_STEP, last, 60).astype(int)]
    fitted_alpha, constants, repeats, error = script.fit(points, alphas=np.linspace(0.2, 0.5, 31),
                                                         repeats_grid=np.geomspace(2.0, 400.0, 161))
    assert fitted_alpha == pytest.approx(alpha) and error < 1e-2
    assert repeats["tiny"] == pytest.approx(10.0, rel=0.03) and repeats["medium-4-2"] == pytest.approx(30.0, rel=0.03)
    assert repeats["small"] == repeats["medium-4-2"]
    for name, (a, b, _, _) in truth.items():
        assert constants[name] == pytest.approx((a, b), rel=0.02), name


@pytest.mark.parametrize("norm", ["scale", "layer"])
def test_the_fitted_curves_rise_with_steps_and_cover_every_candidate(norm):
    assert set(sizing.fitted(norm)[1]) == set(sizing.CANDIDATES)
    for name in sizing.CANDIDATES:
        values = [sizing.predicted_bleu(name, s, norm=norm) for s in (300, 1000, 3000, 10000)]
        assert values == sorted(values), name


def test_a_run_without_size_flags_measures_the_candidates_and_trains_the_pick(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sizing, "MIN_STEPS", 1)
    monkeypatch.setattr(sizing, "CURVES", {"tiny": (10, 0), "medium-4-2": (30, 0), "small": (12, 0)})
    data = write_corpus(tmp_path / "pairs.tsv")
    out = str(tmp_path / "run")
    assert cli.main(["train", "--data", data, *BASE, "--minutes", "0.1", "--max-steps", "3", "--out", out]) == 0
    err = capsys.readouterr().err
    assert "model size: auto picked medium-4-2 (d_model 192" in err
    for name in sizing.CANDIDATES:
        assert f"\n  {name} " in err
    ckpt = load_checkpoint(out)
    assert ckpt.args["preset"] == "medium-4-2"
    cfg = ckpt.model.cfg
    assert (cfg.d_model, cfg.n_encoder_layers, cfg.n_decoder_layers) == (192, 4, 2)
    # the seconds spent measuring came off the budget
    assert ckpt.train_state["schedule"]["budget_seconds"] < 6.0
    # and the resumed run keeps the size without being told
    assert cli.main(["train", "--resume", out, "--max-steps", "4", "--quiet"]) == 0
    assert load_checkpoint(out).model.cfg.d_model == 192
    assert "model size" not in capsys.readouterr().err


@pytest.mark.parametrize("norm_flags, curves, picked", [([], "scale", "medium-4-2"),
                                                         (["--norm", "layer"], "layer", "small")])
def test_a_run_is_sized_by_the_curves_of_the_normalisation_it_trains(tmp_path, capsys, monkeypatch,
                                                                    norm_flags, curves, picked):
    # the default model (ScaleNorm + FixNorm) and LayerNorm have curves of their own; each set here
    # picks a different candidate, so the pick says whose judged
    monkeypatch.setattr(sizing, "MIN_STEPS", 1)
    monkeypatch.setattr(sizing, "CURVES", {"tiny": (10, 0), "medium-4-2": (30, 0), "small": (12, 0)})
    monkeypatch.setattr(sizing, "LAYER_CURVES", {"tiny": (10, 0), "medium-4-2": (12, 0), "small": (30, 0)})
    data = write_corpus(tmp_path / "pairs.tsv")
    out = str(tmp_path / "run")
    assert cli.main(["train", "--data", data, *BASE, *norm_flags, "--minutes", "0.1", "--max-steps", "1",
                     "--out", out, "--quiet"]) == 0
    err = capsys.readouterr().err
    model = {"scale": "ScaleNorm + FixNorm", "layer": "LayerNorm"}[curves]
    assert f"model size: auto picked {picked} " in err
    assert f"learning curves of the {model} model measured on the Bible corpus" in err
    assert sizing.CURVE_NOTES[curves] in err
    ckpt = load_checkpoint(out)
    assert ckpt.args["preset"] == picked and ckpt.model.cfg.norm == curves


@pytest.mark.parametrize("flags", [["--preset", "tiny"], ["--d-model", "32", "--n-heads", "2"],
                                   ["--n-encoder-layers", "1"]])
def test_any_size_flag_wins_and_nothing_is_measured(tmp_path, capsys, flags):
    data = write_corpus(tmp_path / "pairs.tsv")
    out = str(tmp_path / "run")
    assert cli.main(["train", "--data", data, *BASE, *flags, "--minutes", "0.05", "--max-steps", "2",
                     "--out", out]) == 0
    assert "model size" not in capsys.readouterr().err
    assert load_checkpoint(out).args["preset"] == "tiny"


def test_without_a_time_budget_the_run_says_it_trains_tiny(tmp_path, capsys):
    data = write_corpus(tmp_path / "pairs.tsv")
    out = str(tmp_path / "run")
    assert cli.main(["train", "--data", data, *BASE, "--max-steps", "2", "--out", out]) == 0
    assert "model size: tiny (--max-steps without --minutes" in capsys.readouterr().err
    assert load_checkpoint(out).args["preset"] == "tiny"
    assert "size_why" not in load_checkpoint(out).args


# -- the race (bench/race.py) ----------------------------------------------------------------------

def race_record(system, minutes, bleu, curve, data="bible.tsv", step_seconds=None):
    record = {"engine": "ours" if system == "ours" else "torch", "system": system, "budget_minutes": minutes,
              "data": data, "cpu": "test CPU", "threads": 2, "preset": "tiny", "steps": 100,
              "greedy": {"bleu": bleu, "chrf": 40.0}, "beam4": {"bleu": bleu + 1, "chrf": 41.0}, "curve": curve}
    if step_seconds:
        record["step_seconds"] = step_seconds
    return record


def test_minutes_to_reach_interpolates_between_budgets_and_says_when_it_cannot():
    from transformer.bench.race import minutes_to_reach

    finals = [(2, 10.0), (5, 20.0), (10, 26.0)]
    assert minutes_to_reach(finals, 15.0) == (3.5, "interpolated")
    assert minutes_to_reach(finals, 8.0) == (2, "at most")
    assert minutes_to_reach(finals, 30.0) is None


def test_race_table_times_ours_to_the_references_ten_minute_bleu():
    from transformer.bench.race import table

    # ours' curve in steps of 0.6 s each (a run standing for a budget), the reference's in seconds
    ours = [race_record("ours", 2, 18.0, []), race_record("ours", 5, 24.0, []),
            race_record("ours", 10, 27.0, [[999.0, 100, 10.0], [999.0, 200, 20.0], [999.0, 300, 25.0]],
                        step_seconds=0.6)]
    ref = race_record("torch", 10, 21.0, [[300.0, 50, 15.0], [600.0, 100, 22.0]])
    rows = table(ours + [ref])
    assert [r["system"] for r in rows[:4]] == ["ours", "ours", "ours", "torch"]
    ratio = rows[-1]
    assert ratio["reference"] == "torch" and ratio["reference_10min_bleu"] == 21.0
    assert ratio["ours_minutes_by_budgets"] == pytest.approx(3.5)   # 18 at 2 min, 24 at 5: 21 at 3.5
    # periodic: the reference's last dev BLEU 22 at minute 10; ours passes it between steps 200 (2 min)
    # and 300 (3 min): 2.4 minutes
    assert ratio["ours_minutes_by_curve"] == pytest.approx(2.4)
    assert ratio["time_ratio_by_curve"] == pytest.approx(10 / 2.4, rel=1e-2)


def test_race_plot_draws_every_system(tmp_path):
    pytest.importorskip("matplotlib")
    from transformer.bench.race import plot

    path = tmp_path / "race.png"
    plot([race_record("ours", 2, 18.0, [[60.0, 10, 9.0]]), race_record("torch", 2, 12.0, [[60.0, 5, 7.0]])], path)
    assert path.stat().st_size > 1000


@pytest.mark.parametrize("flags, words", [([], "applies only with --data"),
                                          (["--data", "DATA", *BASE, "--d-model", "64"], "--d-model sets it")])
def test_preset_auto_is_refused_where_it_cannot_choose(tmp_path, capsys, flags, words):
    data = write_corpus(tmp_path / "pairs.tsv")
    flags = [data if f == "DATA" else f for f in flags]
    assert cli.main(["train", *flags, "--preset", "auto", "--max-steps", "1", "--out", str(tmp_path / "x")]) == 2
    assert words in capsys.readouterr().err


def test_race_run_trains_each_system_for_each_budget_and_records_them(tmp_path):
    pytest.importorskip("torch")
    from transformer.bench import race

    data = write_corpus(tmp_path / "pairs.tsv")
    records = tmp_path / "race.jsonl"
    assert race.main(["run", "--data", data, *BASE[:-4], *SMALL, "--dev-fraction", "0.1", "--budgets", "0.02",
                      "--systems", "ours,torch", "--threads", "1", "--json", str(records),
                      "--out-dir", str(tmp_path / "runs")]) == 0
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    assert [(r["system"], r["budget_minutes"]) for r in rows] == [("ours", 0.02), ("torch", 0.02)]
    assert set(rows[1]["torch_step_seconds_by_precision"]) == {"fp32", "bf16"}
    assert rows[1]["precision"] == min(rows[1]["torch_step_seconds_by_precision"],
                                       key=rows[1]["torch_step_seconds_by_precision"].get)
    assert all(r["steps"] >= 1 and "bleu" in r["greedy"] for r in rows)
