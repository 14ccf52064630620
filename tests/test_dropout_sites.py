"""Dropout by site (ModelConfig.attention_dropout, activation_dropout) and source word dropout
(ModelConfig.word_dropout), issue 57 item 5.

What must hold: each rate is the one its site draws with, and no other site's; left unset, a
training pass is bit for bit what it was before the options existed; word dropout zeroes a source
token's whole word embedding (its position stays), kept ones scaled by 1 / (1 - p), and no gradient
reaches a dropped word's table row; every mask comes from the model's counter-based stream, so a
pass gives the same bits at any thread count, and sentence shards draw word masks by shards.py's
rule; the rates survive a checkpoint; set_dropout keeps explicit site rates; bad values are refused
naming the field or flag.

Statistical tolerance as in test_dropout.py: a fraction over n draws within 5 binomial standard
deviations of its expectation (the draws are fixed by the seed, so these cannot flake).
"""
import dataclasses
import json

import numpy as np
import pytest

import transformer as T
from transformer import _C, cli, shards
from transformer.config import ModelConfig

from conftest import num_threads
from test_shards import batch, forced  # noqa: F401 (forced: a fixture)
from test_train import write_corpus

SIGMAS = 5.0
GRAD_RTOL = 1e-3
BASE = dict(src_vocab_size=41, tgt_vocab_size=43, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2,
            n_decoder_layers=2, max_len=40, norm_first=True)


def config(**changes):
    return T.ModelConfig(**{**BASE, "dropout": 0.0, **changes})


def run_pass(cfg, data, calls=1, precision="fp32", seed=3):
    model = T.Seq2SeqTransformer(cfg, seed=seed)
    losses = [model.forward_backward(*data, label_smoothing=0.1, precision=precision) for _ in range(calls)]
    return model, losses, model.params.flat_grad.copy()


def assert_fraction(k, n, q, what=""):
    sigma = np.sqrt(q * (1 - q) / n)
    assert abs(k / n - q) <= SIGMAS * sigma, f"{what}: fraction {k / n:.4f}, expected {q} +- {SIGMAS} * {sigma:.2g}"


# -- the config ------------------------------------------------------------------------------------

def test_site_rates_default_to_following_dropout_and_word_dropout_to_zero():
    cfg = config(dropout=0.2)
    assert cfg.attention_dropout is None and cfg.activation_dropout is None and cfg.word_dropout == 0.0
    assert [cfg.dropout_at(s) for s in ("residual", "attention", "activation", "word")] == [0.2, 0.2, 0.2, 0.0]
    cfg = config(dropout=0.2, attention_dropout=0.0, activation_dropout=0.3, word_dropout=0.1)
    assert [cfg.dropout_at(s) for s in ("residual", "attention", "activation", "word")] == [0.2, 0.0, 0.3, 0.1]
    assert config().trains_with_dropout() is False
    for name in ("attention_dropout", "activation_dropout", "word_dropout"):
        assert config(**{name: 0.1}).trains_with_dropout() is True


@pytest.mark.parametrize("name", ["attention_dropout", "activation_dropout", "word_dropout"])
@pytest.mark.parametrize("value, error", [(1.0, ValueError), (-0.1, ValueError), (float("nan"), ValueError),
                                          ("0.1", TypeError), (True, TypeError), ([0.1], TypeError)])
def test_bad_rates_are_refused_naming_the_field(name, value, error):
    with pytest.raises(error, match=name):
        config(**{name: value})


def test_only_the_site_rates_may_be_none():
    with pytest.raises(TypeError, match="word_dropout"):
        config(word_dropout=None)
    with pytest.raises(TypeError, match="^dropout must be a float, got NoneType"):
        config(dropout=None)
    assert config(attention_dropout=0, activation_dropout=None).attention_dropout == 0.0


def test_a_config_written_before_the_fields_existed_loads_with_them_unset():
    old = {k: v for k, v in dataclasses.asdict(config(dropout=0.1)).items()
           if k not in ("attention_dropout", "activation_dropout", "word_dropout")}
    cfg = ModelConfig.from_dict(old)
    assert (cfg.attention_dropout, cfg.activation_dropout, cfg.word_dropout) == (None, None, 0.0)


def test_unset_options_are_left_out_of_the_written_config_so_older_engines_still_read_it():
    assert config(dropout=0.1).to_dict() == old_fields_only(config(dropout=0.1))
    cfg = config(dropout=0.1, attention_dropout=0.0, word_dropout=0.2)
    written = cfg.to_dict()
    assert written["attention_dropout"] == 0.0 and written["word_dropout"] == 0.2
    assert "activation_dropout" not in written
    assert ModelConfig.from_dict(json.loads(json.dumps(written))) == cfg


def old_fields_only(cfg):
    return {k: v for k, v in dataclasses.asdict(cfg).items()
            if k not in ("attention_dropout", "activation_dropout", "word_dropout", "norm", "fix_norm")}


# -- unset, nothing changes -------------------------------------------------------------------------

def test_the_word_site_is_the_streams_last_so_every_other_site_keeps_its_offset():
    """Each Dropout's offset is its creation order on the stream: the word site is created after
    all of today's, so theirs (and so their masks) are what they were."""
    model = T.Seq2SeqTransformer(config(dropout=0.1))
    sites = model.stream.users
    assert sites[-1] is model.src_embed.words and sites[-1].site == "word"
    assert [s.offset for s in sites] == [i * sites[0].stream.SITE_STRIDE for i in range(len(sites))]
    assert [s.site for s in sites[:2]] == ["residual", "residual"]    # the two embeddings, first


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("n", [1, 2])
def test_unset_or_equal_site_rates_give_the_same_bits(forced, precision, n):
    """Site rates left unset, or set to dropout's own rate, word dropout 0: the same loss and
    gradient bits (and the same bits as before the options existed: checked against the parent
    commit when they were added, see the commit message)."""
    forced(n)
    data = batch()
    _, l1, g1 = run_pass(config(dropout=0.2), data, calls=2, precision=precision)
    _, l2, g2 = run_pass(config(dropout=0.2, attention_dropout=0.2, activation_dropout=0.2, word_dropout=0.0),
                         data, calls=2, precision=precision)
    assert l1 == l2
    assert np.array_equal(g1, g2)


# -- each site draws with its own rate ------------------------------------------------------------

def dropped_fraction(kept, before):
    """(dropped, candidates): entries of `before` that are nonzero and are zero in `kept`."""
    live = before != 0
    return int(np.count_nonzero(kept[live] == 0)), int(np.count_nonzero(live))


def site_statistics(cfg, data):
    """Dropped fractions at the feed-forward hidden activation (relu: positive pre-activations
    are the candidates) and the attention weights (nonzero probabilities), first encoder layer."""
    model = T.Seq2SeqTransformer(cfg, seed=5)
    model.ws.fused_attention = False          # probs_d: the weights after dropout, kept for backward
    model.forward_backward(*data, label_smoothing=0.0)
    layer = model.encoder.layers[0]
    ff = layer.feed_forward
    pre_act = np.maximum(ff.pre, 0.0)
    attn = layer.self_attn
    return dropped_fraction(ff.hidden, pre_act), dropped_fraction(attn.probs_d, attn.probs), model


def test_attention_dropout_drops_the_attention_weights_and_nothing_else():
    data = batch(B=16, S=30, Tt=20)
    (ff_k, ff_n), (at_k, at_n), model = site_statistics(config(attention_dropout=0.5), data)
    assert ff_k == 0 and ff_n > 0                       # the feed-forward site: rate 0
    assert_fraction(at_k, at_n, 0.5, "attention weights")
    assert {s.p for s in model.stream.users if s.site != "attention"} == {0.0}


def test_activation_dropout_drops_the_hidden_activation_and_nothing_else():
    data = batch(B=16, S=30, Tt=20)
    (ff_k, ff_n), (at_k, at_n), model = site_statistics(config(activation_dropout=0.5), data)
    assert at_k == 0 and at_n > 0
    assert_fraction(ff_k, ff_n, 0.5, "feed-forward hidden")
    assert {s.p for s in model.stream.users if s.site != "activation"} == {0.0}


def test_the_residual_rate_leaves_explicit_zero_sites_alone():
    data = batch(B=16, S=30, Tt=20)
    (ff_k, _), (at_k, _), model = site_statistics(config(dropout=0.3, attention_dropout=0.0,
                                                         activation_dropout=0.0), data)
    assert ff_k == 0 and at_k == 0
    assert model.encoder.layers[0].dropout1.p == 0.3 and model.src_embed.dropout.p == 0.3


@pytest.mark.parametrize("rates", [dict(attention_dropout=0.3), dict(activation_dropout=0.3),
                                   dict(word_dropout=0.3), dict(dropout=0.3)])
def test_each_site_alone_changes_the_loss_and_gradients(rates):
    data = batch()
    _, l0, g0 = run_pass(config(), data)
    _, l1, g1 = run_pass(config(**rates), data)
    assert l0 != l1 and not np.array_equal(g0, g1)


def test_the_fused_attention_kernel_takes_the_attention_rate():
    """d_head 32: the fused kernel (csrc/attention_train.c) where the CPU has it; its dropout is
    the attention site's rate, and equals the unfused path's masks within float32 rounding."""
    cfg = config(d_model=64, n_heads=2, d_ff=64, attention_dropout=0.4)
    data = batch()
    fused, lf, gf = run_pass(cfg, data)
    layer = fused.encoder.layers[0].self_attn
    assert layer.fused_call[1] == pytest.approx(0.4) if layer.fused else True
    plain = T.Seq2SeqTransformer(cfg, seed=3)
    plain.ws.fused_attention = False
    lp = plain.forward_backward(*data, label_smoothing=0.1)
    assert abs(lf[0] - lp) <= 1e-5 * abs(lp)
    assert np.abs(gf - plain.params.flat_grad).max() <= 1e-4 * np.abs(gf).max()
    _, l0, _ = run_pass(config(d_model=64, n_heads=2, d_ff=64), data)
    assert l0 != lf


# -- word dropout ----------------------------------------------------------------------------------

def word_mask(model, rows, p):
    """The keep-mask of the source rows of the last training call (shard 0 / a whole pass)."""
    return _C.dropout_mask(rows, p, model.stream.seed, model.src_embed.words.offset).astype(bool)


def test_word_dropout_zeroes_whole_word_embeddings_and_keeps_positions(forced):
    forced(1)
    p = 0.3
    src, tgt_in, tgt_out = batch(B=64, S=32, Tt=6)
    model = T.Seq2SeqTransformer(config(word_dropout=p), seed=1)
    model.forward_backward(src, tgt_in, tgt_out)
    B, S = src.shape
    D = model.cfg.d_model
    out = model.ws.persistent(model.src_embed, "out", (B * S, D)).reshape(B, S, D)   # what forward returned
    keep = word_mask(model, B * S, p).reshape(B, S)
    words = model.params.tensor("src_embed.weight")[src] * np.float32(model.src_embed.scale)
    pe = model.pe[:S]
    assert np.array_equal(out[~keep], np.broadcast_to(pe, (B, S, pe.shape[1]))[~keep])   # word gone, position kept
    f = np.float32(1.0 / (1.0 - np.float64(np.float32(p))))
    assert np.array_equal(out[keep], (words * f + pe)[keep])
    assert_fraction(int(np.count_nonzero(~keep)), B * S, p, "dropped source words")
    # the target side has no word dropout: its embeddings are the eval-mode ones
    tgt_out_rows = model.ws.persistent(model.tgt_embed, "out", (tgt_in.size, D)).copy()
    model.stream.training = False
    assert np.array_equal(tgt_out_rows, model.tgt_embed.forward(tgt_in))


def test_word_dropout_is_off_outside_training():
    model = T.Seq2SeqTransformer(config(word_dropout=0.5), seed=1)
    plain = T.Seq2SeqTransformer(config(), seed=1)
    src, tgt_in, _ = batch()
    assert np.array_equal(model.forward(src, tgt_in), plain.forward(src, tgt_in))
    assert np.array_equal(model.encode(src), plain.encode(src))
    assert model.greedy_decode(src, max_len=5) == plain.greedy_decode(src, max_len=5)


def test_a_dropped_word_adds_nothing_to_its_embedding_row(forced):
    """Source ids that occur once each: the table rows of dropped ones get exactly zero gradient,
    the kept ones' don't."""
    forced(1)
    cfg = config(src_vocab_size=200, word_dropout=0.5)
    src = np.arange(3, 3 + 8 * 20).reshape(8, 20)
    _, tgt_in, tgt_out = batch(B=8)
    model = T.Seq2SeqTransformer(cfg, seed=2)
    model.forward_backward(src, tgt_in, tgt_out)
    keep = word_mask(model, src.size, 0.5).reshape(src.shape)
    grad = model.params.gradient("src_embed.weight")
    assert not grad[src[~keep]].any()
    assert (np.abs(grad[src[keep]]).max(axis=1) > 0).all()


@pytest.mark.parametrize("norm_first", [True, False])
def test_word_dropout_gradients_match_pytorch_with_the_same_mask(forced, norm_first):
    """The reference network (torch_compat) with our engine's keep-mask: loss and every gradient
    within the parity suite's tolerance (all other dropout 0)."""
    torch = pytest.importorskip("torch")
    from transformer.torch_compat import build_torch_model, torch_loss
    forced(1)
    p = 0.4
    cfg = config(word_dropout=p, norm_first=norm_first)
    src, tgt_in, tgt_out = batch(B=7)
    torch.manual_seed(0)
    tm = build_torch_model(cfg)
    ours = T.Seq2SeqTransformer(cfg, seed=9)
    ours.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    loss, grads = ours.loss_and_grads(src, tgt_in, tgt_out, 0.1)
    keep = word_mask(ours, src.size, p).reshape(src.shape)
    assert 0 < keep.sum() < keep.size
    tm.train()
    tm.word_keep = torch.from_numpy(keep)
    ref = torch_loss(tm, src, tgt_in, tgt_out, 0.1)
    ref.backward()
    assert abs(loss - ref.item()) <= GRAD_RTOL * abs(ref.item())
    for name, param in tm.named_parameters():
        want = param.grad.numpy()
        scale = max(np.abs(want).max(), 1e-30)
        assert np.abs(grads[name] - want).max() / scale < GRAD_RTOL, name


# -- threads and shards ----------------------------------------------------------------------------

ALL_SITES = dict(dropout=0.1, attention_dropout=0.2, activation_dropout=0.3, word_dropout=0.25)


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_every_site_gives_the_same_bits_at_one_and_two_threads(forced, n, precision):
    forced(n)
    data = batch()
    with num_threads(1):
        _, l1, g1 = run_pass(config(**ALL_SITES), data, calls=2, precision=precision)
    with num_threads(2):
        _, l2, g2 = run_pass(config(**ALL_SITES), data, calls=2, precision=precision)
    assert l1 == l2
    assert np.array_equal(g1, g2), f"max difference {np.abs(g1 - g2).max()}"


def test_shards_draw_word_masks_by_the_shard_rule(forced):
    """Shard 0 draws the pass's seed, shard s > 0 a seed mixed from it and s, a shard's rows
    counted from 0 (shards.py): as every other dropout site."""
    forced(2)
    p = 0.4
    src, tgt_in, tgt_out = batch(B=12, S=16)
    model = T.Seq2SeqTransformer(config(word_dropout=p, attention_dropout=0.1), seed=4)
    model.forward_backward(src, tgt_in, tgt_out)
    bounds = shards.shard_rows(src, tgt_out, 0, 2)
    assert len(bounds) == 2
    seed, offset = model.stream.seed, model.src_embed.words.offset
    rep = model.shards.replicas[0]
    for (r0, r1), owner, s in zip(bounds, (model, rep), (seed, shards._mix(seed, 1))):
        part, _, _ = shards._trimmed(src[r0:r1], tgt_in[r0:r1], tgt_out[r0:r1], 0)
        want = _C.dropout_mask(part.size, p, s, offset)
        got = owner.src_embed.word_factors
        assert got.shape == (part.size,)
        assert np.array_equal(got != 0, want.astype(bool))
    assert [u.p for u in rep.stream.users] == [u.p for u in model.stream.users]


def test_replicas_take_the_rates_set_dropout_gives(forced):
    forced(2)
    model = T.Seq2SeqTransformer(config(dropout=0.1, attention_dropout=0.2, word_dropout=0.3), seed=4)
    data = batch()
    model.forward_backward(*data)
    model.set_dropout(0.0)
    model.forward_backward(*data)
    rep = model.shards.replicas[0]
    assert [u.p for u in rep.stream.users] == [u.p for u in model.stream.users]
    assert {(u.site, u.p) for u in rep.stream.users} == {("residual", 0.0), ("attention", 0.2),
                                                         ("activation", 0.0), ("word", 0.3)}


# -- set_dropout, checkpoints ----------------------------------------------------------------------

def test_set_dropout_keeps_explicit_site_rates_and_moves_those_that_follow():
    model = T.Seq2SeqTransformer(config(dropout=0.1, attention_dropout=0.25, word_dropout=0.2))
    model.set_dropout(0.0)
    assert (model.cfg.dropout, model.cfg.attention_dropout, model.cfg.activation_dropout,
            model.cfg.word_dropout) == (0.0, 0.25, None, 0.2)
    rates = {site: {u.p for u in model.stream.users if u.site == site} for site in
             ("residual", "attention", "activation", "word")}
    assert rates == {"residual": {0.0}, "attention": {0.25}, "activation": {0.0}, "word": {0.2}}
    with pytest.raises(ValueError, match="dropout must be in"):
        model.set_dropout(1.0)
    with pytest.raises(ValueError, match="attention_dropout"):
        model.set_dropout_rates(attention_dropout=1.5)
    with pytest.raises(TypeError, match="dropout rates only"):
        model.set_dropout_rates(d_model=3)
    model.set_dropout_rates(attention_dropout=None, activation_dropout=0.1)
    assert {u.p for u in model.stream.users if u.site == "attention"} == {0.0}
    assert {u.p for u in model.stream.users if u.site == "activation"} == {0.1}


def test_site_rates_survive_a_model_directory_and_a_checkpoint(tmp_path):
    from transformer.checkpoint import load_checkpoint, save_checkpoint
    from transformer.tokenizer import CharTokenizer
    from transformer.training.loop import TrainState

    cfg = config(dropout=0.1, attention_dropout=0.0, activation_dropout=0.2, word_dropout=0.15)
    model = T.Seq2SeqTransformer(cfg, seed=2)
    model.save(tmp_path / "m")
    assert T.Seq2SeqTransformer.load(tmp_path / "m").cfg == cfg
    # a directory written before the fields existed
    raw = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps(old_fields_only(ModelConfig.from_dict(raw))))
    old = T.Seq2SeqTransformer.load(tmp_path / "m").cfg
    assert (old.attention_dropout, old.activation_dropout, old.word_dropout) == (None, None, 0.0)
    tok = CharTokenizer("abc")
    save_checkpoint(tmp_path / "ck", model, T.Adam(model), dataclasses.asdict(TrainState()), tok, tok, {})
    assert load_checkpoint(tmp_path / "ck").model.cfg == cfg


def test_marian_export_writes_the_site_rates_it_has_names_for():
    from transformer.marian import config_to_marian
    marian = dict(norm_first=False, final_norm=False, positions="split", activation="silu")
    assert config_to_marian(config(dropout=0.1, **marian))["attention_dropout"] == 0.0   # as before
    out = config_to_marian(config(dropout=0.1, attention_dropout=0.2, activation_dropout=0.05,
                                  word_dropout=0.3, **marian))
    assert (out["dropout"], out["attention_dropout"], out["activation_dropout"]) == (0.1, 0.2, 0.05)
    assert sorted(key for key in out if "dropout" in key) == ["activation_dropout", "attention_dropout", "dropout"]


def test_the_pytorch_reference_takes_the_site_rates():
    pytest.importorskip("torch")
    from transformer.torch_compat import build_torch_model
    tm = build_torch_model(config(dropout=0.1, attention_dropout=0.2, activation_dropout=0.3))
    layer = tm.transformer.decoder.layers[0]
    assert (layer.self_attn.dropout, layer.multihead_attn.dropout, layer.dropout.p, layer.dropout1.p) == \
        (0.2, 0.2, 0.3, 0.1)


# -- the command line ------------------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--attention-dropout", "--activation-dropout", "--word-dropout"])
@pytest.mark.parametrize("value", ["1", "-0.1", "x", "nan"])
def test_bad_flag_values_are_refused_naming_the_flag(capsys, flag, value):
    with pytest.raises(SystemExit) as done:
        cli.build_parser().parse_args(["train", flag, value])
    assert done.value.code == 2
    assert f"argument {flag}:" in capsys.readouterr().err


def test_the_flags_set_the_model_config_and_are_kept_by_a_resumed_run():
    from transformer.training.flags import TRAJECTORY_ARGS, model_config_from_args
    args = cli.build_parser().parse_args(["train", "--preset", "tiny", "--attention-dropout", "0.2",
                                          "--activation-dropout", "0", "--word-dropout", "0.1"])
    cfg = model_config_from_args(args, 50, 60, max_len=20)
    assert (cfg.attention_dropout, cfg.activation_dropout, cfg.word_dropout, cfg.dropout) == (0.2, 0.0, 0.1, 0.1)
    unset = model_config_from_args(cli.build_parser().parse_args(["train", "--preset", "tiny"]), 50, 60, 20)
    assert (unset.attention_dropout, unset.activation_dropout, unset.word_dropout) == (None, None, 0.0)
    assert {"attention_dropout", "activation_dropout", "word_dropout"} <= set(TRAJECTORY_ARGS)


def test_a_run_keeps_the_site_rates_the_rule_does_not_set_and_a_resumed_run_keeps_them(tmp_path, capsys):
    """Three steps see the pairs less than once, so the rule picks residual dropout 0; the given
    attention and word rates stay as given, the activation rate follows the rule's 0. A resumed
    run keeps them, and refuses a flag that contradicts them, naming it."""
    from transformer.checkpoint import load_checkpoint
    data = write_corpus(tmp_path / "pairs.tsv", n=60)
    out = str(tmp_path / "run")
    argv = ["train", "--data", data, "--src-col", "eng", "--tgt-col", "fake", "--d-model", "32", "--n-heads", "2",
            "--d-ff", "64", "--n-encoder-layers", "1", "--n-decoder-layers", "1", "--quiet", "--threads", "1",
            "--vocab-size", "60", "--batch-tokens", "300", "--dev-fraction", "0.1"]
    assert cli.main(argv + ["--max-steps", "2", "--attention-dropout", "0.2", "--word-dropout", "0.1",
                            "--out", out]) == 0
    err = capsys.readouterr().err
    assert "dropout 0: the plan sees the training pairs" in err and "; --attention-dropout 0.2 as given" in err
    cfg = load_checkpoint(out).model.cfg
    assert (cfg.dropout, cfg.attention_dropout, cfg.activation_dropout, cfg.word_dropout) == (0.0, 0.2, None, 0.1)
    assert cli.main(["train", "--resume", out, "--word-dropout", "0.3", "--max-steps", "3", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--word-dropout 0.3: the run in" in err and "started with 0.1" in err
    assert cli.main(["train", "--resume", out, "--max-steps", "3", "--quiet"]) == 0
    assert load_checkpoint(out).model.cfg == cfg
    # a checkpoint written before the flags existed has none in its args: a flag given is still
    # held to the model's config (unset), not ignored
    from transformer.checkpoint import CHECKPOINT_FILE, read_metadata
    from transformer.serialization import load_file, save_file
    path = f"{out}/{CHECKPOINT_FILE}"
    metadata = read_metadata(path)
    args = json.loads(metadata["args"])
    for key in ("attention_dropout", "activation_dropout", "word_dropout"):
        del args[key]
    metadata["args"] = json.dumps(args)
    save_file(load_file(path), path, metadata=metadata)
    assert cli.main(["train", "--resume", out, "--activation-dropout", "0.1", "--max-steps", "4", "--quiet"]) == 2
    assert "--activation-dropout 0.1: the run in" in capsys.readouterr().err
    # fine-tuning the run's model: its sizes are refused as flags, its dropout rates may be set
    ft = str(tmp_path / "ft")
    assert cli.main(argv + ["--init-from", out, "--max-steps", "1", "--attention-dropout", "0.05",
                            "--activation-dropout", "0.15", "--out", ft]) == 2   # --d-model & co given
    err = capsys.readouterr().err
    assert "--vocab-size" in err and "sizes and vocabularies come from --init-from" in err
    fine = argv[:7] + argv[17:20] + argv[22:]       # no size flag, no --vocab-size
    assert fine[-6:] == ["--threads", "1", "--batch-tokens", "300", "--dev-fraction", "0.1"]
    assert cli.main(fine + ["--init-from", out, "--max-steps", "1", "--attention-dropout", "0.05",
                            "--activation-dropout", "0.15", "--out", ft]) == 0
    tuned = load_checkpoint(ft).model.cfg
    assert (tuned.attention_dropout, tuned.activation_dropout, tuned.word_dropout) == (0.05, 0.15, 0.1)
