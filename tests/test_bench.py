"""`transformer bench` pieces that make claims: the masking demonstration (parallel masked training
equals the autoregressive loop; without the mask it does not), the step profile, the options.

Timings are not asserted (they belong to benchmarks); what is computed is."""
import numpy as np
import pytest

import transformer as T
from transformer import cli
from transformer.bench import masking
from transformer.bench import train as bench_train

LOSS_RTOL = 1e-5     # float32 sums over a few hundred terms
GRAD_RTOL = 1e-4     # max |parallel - autoregressive| / max |autoregressive|, per flat gradient


def small_model(norm_first=False, seed=0):
    cfg = T.ModelConfig(src_vocab_size=23, tgt_vocab_size=29, d_model=32, n_heads=4, d_ff=48,
                        n_encoder_layers=1, n_decoder_layers=2, dropout=0.0, max_len=16,
                        norm_first=norm_first)
    model = T.Seq2SeqTransformer(cfg, seed=seed)
    rng = np.random.default_rng(seed)
    B, S, Tt = 3, 5, 7
    src = rng.integers(3, cfg.src_vocab_size, (B, S))
    tgt = rng.integers(3, cfg.tgt_vocab_size, (B, Tt + 1))
    tgt[:, 0] = cfg.bos_id
    src[2, 3:] = cfg.pad_id            # padded rows: the weights of the mean must still add up
    tgt[1, 5:] = cfg.pad_id
    return model, src, tgt[:, :-1].copy(), tgt[:, 1:].copy()


@pytest.mark.parametrize("norm_first", [False, True])
def test_parallel_masked_training_equals_the_autoregressive_loop(norm_first):
    model, src, tgt_in, tgt_out = small_model(norm_first)
    loss_p, grad_p = masking.parallel_loss_and_grad(model, src, tgt_in, tgt_out)
    loss_a, grad_a = masking.autoregressive_loss_and_grad(model, src, tgt_in, tgt_out)
    assert abs(loss_p - loss_a) <= LOSS_RTOL * abs(loss_a), (loss_p, loss_a)
    err = masking._relative(grad_p, grad_a)
    assert err <= GRAD_RTOL, f"gradient relative difference {err:.3g}"
    assert np.abs(grad_a).max() > 0


def test_without_the_causal_mask_parallel_training_sees_the_future():
    model, src, tgt_in, tgt_out = small_model()
    loss_a, grad_a = masking.autoregressive_loss_and_grad(model, src, tgt_in, tgt_out)
    model.decoder.causal = False
    loss_p, grad_p = masking.parallel_loss_and_grad(model, src, tgt_in, tgt_out)
    model.decoder.causal = True
    assert abs(loss_p - loss_a) > 1e-3 * abs(loss_a)
    assert masking._relative(grad_p, grad_a) > 1e-2
    # and the switch is restored: the masked forward is unchanged by having been unmasked
    loss_again, _ = masking.parallel_loss_and_grad(model, src, tgt_in, tgt_out)
    assert abs(loss_again - loss_a) <= LOSS_RTOL * abs(loss_a)


def test_without_the_mask_training_loss_is_lower_yet_greedy_decoding_fails():
    # the leakage demonstration at a small size (seeded, so deterministic): 300 steps, 256 words
    masked, unmasked = masking.leakage(steps=300, pool_size=256, batch=32, evaluate=64)
    assert masked["causal_mask"] and not unmasked["causal_mask"]
    print(masked, unmasked)
    assert unmasked["train_loss"] < masked["train_loss"]
    assert unmasked["greedy_char_accuracy"] < 0.2 < 0.5 < masked["greedy_char_accuracy"]
    assert unmasked["greedy_exact_match"] < masked["greedy_exact_match"]


def test_masking_report_runs_and_its_table_shows_both_parts():
    records = masking.equivalence(lengths=(4,), repeats=1)
    records += masking.leakage(steps=3, pool_size=32, batch=8, evaluate=8)
    (eq,) = [r for r in records if r["part"] == "equivalence"]
    assert eq["grad_max_rel_diff"] <= GRAD_RTOL and eq["loss_rel_diff"] <= LOSS_RTOL
    assert eq["unmasked_loss_rel_diff"] > 1e-4
    leak = [r for r in records if r["part"] == "leakage"]
    assert [r["causal_mask"] for r in leak] == [True, False]
    for r in leak:
        assert 0 <= r["greedy_exact_match"] <= 1 and 0 <= r["teacher_forced_token_accuracy"] <= 1
    text = masking.table(records)
    assert "autoregressive" in text and "mask" in text and "off" in text


def test_profile_accounts_for_the_whole_step():
    record = bench_train.profile("tiny", threads=1, steps=1)
    groups = record["groups_s"]
    assert "GEMM" in groups and "Python overhead" in groups and "optimizer" in groups
    assert all(v >= 0 for v in groups.values())
    assert sum(groups.values()) == pytest.approx(record["step_s"], rel=0.05)
    assert record["kernel_calls_per_step"] > 50
    table = bench_train.profile_table(record)
    assert "GEMM" in table and "Python overhead" in table


def test_custom_bench_config_is_parsed_and_checked():
    assert bench_train.custom_config("d_model=64,n_heads=4,d_ff=128,layers=1,batch=4,length=8") == "custom"
    c = bench_train.CONFIGS["custom"]
    assert c["sizes"] == dict(d_model=64, n_heads=4, d_ff=128, n_encoder_layers=1, n_decoder_layers=1)
    assert (c["batch"], c["length"]) == (4, 8)
    for bad in ("d_model=64,n_heads=5", "depth=3", "d_model=x", "d_model=0"):
        with pytest.raises(ValueError, match="--config"):
            bench_train.custom_config(bad)


def test_bench_command_rejects_a_bad_config(capsys):
    assert cli.main(["bench", "--what", "train", "--config", "huge", "--threads", "1"]) == 2
    assert "--config" in capsys.readouterr().err


def test_default_threads_go_up_to_the_cores_present(monkeypatch):
    monkeypatch.setattr(cli.os, "cpu_count", lambda: 12)
    assert cli._default_threads() == [1, 2, 4, 8, 12]
    monkeypatch.setattr(cli.os, "cpu_count", lambda: 16)
    assert cli._default_threads() == [1, 2, 4, 8, 16]
    monkeypatch.setattr(cli.os, "cpu_count", lambda: 1)
    assert cli._default_threads() == [1]


def test_scaling_runs_ours_alone_without_a_reference():
    from transformer.bench import scaling

    records = scaling.run_all([1], what=("train",), configs=("tiny",), against=None)
    (train,) = [r for r in records if r.get("suite") == "train"]
    assert train["ours_tokens_per_s"] > 0 and "ref_s" not in train
    assert "train_step tiny" in scaling.efficiency_table(records)


def test_timed_records_report_the_median_and_the_spread():
    # issue: "warm-up, repeats and the median and spread reported"; spreads are [min, max]
    from transformer.bench import decode, gemm, timing

    def inside(spread, median):
        return spread[0] <= median <= spread[1]

    (o, _), (r, _) = timing.time_pair(lambda: sum(range(100)), lambda: sum(range(200)), repeats=5)
    fields = timing.spread_fields()
    assert inside(fields["ours_spread_s"], o) and inside(fields["ref_spread_s"], r)
    medians = gemm._time_interleaved([lambda: None, lambda: sum(range(50))], repeats=5, min_seconds=1e-4)
    assert all(inside(s, m) for s, m in zip(gemm._time_interleaved.spreads, medians))
    (record,) = decode.run(threads=[1], configs=("tiny",), beams=(1,), engines=("ours",))
    assert record["repeats"] == decode.CONFIGS["tiny"]["repeats"]
    assert inside(record["ours_spread_s"], record["ours_s"])


def test_scaling_table_and_plot_show_ctranslate2_for_decoding(tmp_path):
    from transformer.bench import scaling

    records = [{"kernel": "decode greedy", "config": "tiny", "shape": "tiny B=2 S=3", "threads": n,
                "ours_per_s": 100.0 * n, "torch_per_s": 10.0 * n, "ctranslate2_per_s": 50.0 * (1 + n) / 2}
               for n in (1, 2)]
    table = scaling.efficiency_table(records)
    lines = {line.split()[0]: line.split()[1:] for line in table.splitlines()[2:]}
    assert lines["ct2"] == ["50.0", "75.0"]
    assert lines["ours/ct2"] == ["2.00x", "2.67x"] and lines["ours/torch"] == ["10.00x", "10.00x"]
    assert "75%" in table   # ct2's efficiency at 2 threads: 75 / (2 * 50)
    pytest.importorskip("matplotlib")
    scaling.plot(records, str(tmp_path / "s.png"))
    assert (tmp_path / "s.png").stat().st_size > 0


def test_decode_bench_runs_ours_alone_without_pytorch(monkeypatch):
    import sys

    from transformer.bench import decode

    monkeypatch.setitem(sys.modules, "torch", None)   # any import of torch now fails
    (record,) = decode.run(threads=[1], configs=("tiny",), beams=(1,), engines=("ours",))
    assert record["ours_per_s"] > 0 and "torch_per_s" not in record
