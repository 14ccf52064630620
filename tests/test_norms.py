"""ScaleNorm and FixNorm (transformer/norms.py; ModelConfig.norm, .fix_norm; issue 57 item 5).

What must hold: ScaleNorm is x * g / max(||x||, 1e-5) per row with the gradient autograd gives
(PyTorch the oracle, a clamped zero row included); FixNorm reads unit rows and its gradient through
the normalisation is orthogonal to each row; the stored weights stay as trained; a training pass
gives the same bits at any thread count (sentence shards, dropout on, fp32 and bf16); a model saves
and loads with both options and gives the same logits; a config without them is written as before
they existed; bad values are refused naming the field or flag; MarianMT export refuses them. The
whole model against PyTorch (logits, gradients, 50 Adam steps, decoding) is tests/test_model_parity.py's
scale/fix cases; decoding at bf16 and int8 is tests/test_decode_precision.py's.
"""
import dataclasses
import json

import numpy as np
import pytest

import transformer as T
from transformer import cli, norms
from transformer.layers import Workspace
from transformer.marian import config_to_marian

from conftest import isa, needs_threads, num_threads  # noqa: F401 (isa: a fixture)
from test_shards import batch, forced  # noqa: F401 (forced: a fixture)
from test_train import write_corpus

BASE = dict(src_vocab_size=41, tgt_vocab_size=43, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2,
            n_decoder_layers=2, max_len=32, norm_first=True)
RTOL = 1e-5     # float32 against PyTorch's float64 of the same formula


def config(**changes):
    return T.ModelConfig(**{**BASE, "dropout": 0.0, **changes})


def rel(a, b):
    b = np.asarray(b, np.float64)
    return np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30)


# -- the layers against autograd --------------------------------------------------------------------

def rows(seed=0, n=7, d=24):
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    x[3] = 0.0            # a row whose norm is clamped
    x[5] *= 1e-7          # and one just below the clamp
    return x


def test_scale_norm_forward_and_backward_match_autograd():
    torch = pytest.importorskip("torch")
    x, g = rows(), np.array([2.5], np.float32)
    dy = np.random.default_rng(1).standard_normal(x.shape).astype(np.float32)
    dg = np.array([0.25], np.float32)         # backward adds into the gradient
    layer = norms.ScaleNorm(g, dg, Workspace())
    y = layer.forward(x)
    dx = np.full_like(x, 1.0)
    layer.backward(dy, dx, accumulate=True)   # adds

    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    tg = torch.tensor(g, dtype=torch.float64, requires_grad=True)
    ty = tx * (tg / torch.linalg.vector_norm(tx, dim=-1, keepdim=True).clamp(min=1e-5))
    ty.backward(torch.tensor(dy, dtype=torch.float64))
    assert rel(y, ty.detach()) < RTOL
    assert rel(dx - 1.0, tx.grad) < RTOL
    assert abs(dg[0] - 0.25 - tg.grad.item()) < RTOL * abs(tg.grad.item())
    assert np.array_equal(y[3], np.zeros(x.shape[1], np.float32))


def test_fix_norm_reads_unit_rows_and_its_gradient_matches_autograd():
    torch = pytest.importorskip("torch")
    table = rows(2, n=9, d=16)
    stored = table.copy()
    dtable = np.full_like(table, 0.5)
    fixed = norms.FixNorm(table, dtable)
    fixed.refresh(training=True)
    assert np.array_equal(table, stored)                          # the weights stay as trained
    lengths = np.linalg.norm(fixed.unit.astype(np.float64), axis=1)
    nonzero = np.linalg.norm(stored, axis=1) > 1e-12
    assert np.allclose(lengths[nonzero], 1.0, atol=1e-6) and np.all(lengths[~nonzero] == 0.0)
    dunit = np.random.default_rng(3).standard_normal(table.shape).astype(np.float32)
    fixed.dunit[...] = dunit
    fixed.backward()

    tt = torch.tensor(stored, dtype=torch.float64, requires_grad=True)
    unit = torch.nn.functional.normalize(tt, dim=-1, eps=1e-12)
    unit.backward(torch.tensor(dunit, dtype=torch.float64))
    assert rel(fixed.unit, unit.detach()) < RTOL
    assert rel(dtable - 0.5, tt.grad) < RTOL
    # the gradient through a normalisation is orthogonal to its row (where the row has a length)
    grad = (dtable - 0.5).astype(np.float64)
    lengths_product = np.linalg.norm(grad, axis=1) * np.linalg.norm(stored, axis=1) + 1e-30
    dots = np.abs(np.einsum("ij,ij->i", grad, stored)) / lengths_product
    assert dots[nonzero].max() < 1e-5


def test_a_training_pass_leaves_the_stored_tables_and_gives_row_orthogonal_gradients():
    cfg = config(norm="scale", fix_norm=True)
    model = T.Seq2SeqTransformer(cfg, seed=4)
    before = model.params.flat.copy()
    _, grads = model.loss_and_grads(*batch(), label_smoothing=0.1)
    assert np.array_equal(model.params.flat, before)
    for name in ("src_embed.weight", "tgt_embed.weight", "generator.weight"):
        w, g = model.params.data[name].astype(np.float64), grads[name].astype(np.float64)
        used = np.linalg.norm(g, axis=1) > 0
        assert used.sum() > 3, name
        cos = np.abs(np.einsum("ij,ij->i", w, g))[used] / (np.linalg.norm(w, axis=1) * np.linalg.norm(g, axis=1))[used]
        assert cos.max() < 1e-4, (name, cos.max())
    assert all(grads[n].shape == (1,) for n in grads if ".norm" in n)


# -- the guarantees of a step -----------------------------------------------------------------------

@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_sharded_pass_is_bitwise_the_same_at_one_two_and_three_threads(forced, precision):
    forced(3)
    cfg, data = config(norm="scale", fix_norm=True, dropout=0.2, tie_embeddings="target"), batch()

    def run():
        model = T.Seq2SeqTransformer(cfg, seed=3)
        losses = [model.forward_backward(*data, label_smoothing=0.1, precision=precision) for _ in range(2)]
        return losses, model.params.flat_grad.copy()
    with num_threads(1):
        one = run()
    for threads in (2, 3):
        with num_threads(threads):
            other = run()
        assert one[0] == other[0]
        assert np.array_equal(one[1], other[1]), threads


@pytest.mark.parametrize("threads", [1, 2])
def test_scale_norm_at_rows_gives_the_whole_tables_bits_at_those_rows(isa, threads):
    """scalenorm_forward_at / _backward_at (FixNorm's tables at the rows a pass reads) against the
    whole table's kernels, bit for bit, at every SIMD level: a clamped row, a row of width not a
    multiple of 16, rows left alone untouched; the backward adds, then clears dout's rows."""
    rng = np.random.default_rng(4)
    table = rng.standard_normal((300, 40)).astype(np.float32)
    table[7] = 0.0                                   # clamped at eps
    rows = np.array([0, 3, 7, 100, 101, 299], np.int64)
    with num_threads(threads):
        want_unit, want_norms = np.empty_like(table), np.empty(300, np.float32)
        T._C.scalenorm_forward(table, norms._ONE, want_unit, want_norms, norms.FIX_NORM_EPS)
        unit, got_norms = np.full_like(table, 5.0), np.full(300, 5.0, np.float32)
        T._C.scalenorm_forward_at(table, norms._ONE, unit, got_norms, rows, norms.FIX_NORM_EPS)
        assert np.array_equal(unit[rows], want_unit[rows]) and np.array_equal(got_norms[rows], want_norms[rows])
        others = np.setdiff1d(np.arange(300), rows)
        assert (unit[others] == 5.0).all() and (got_norms[others] == 5.0).all()

        dunit = np.zeros_like(table)
        dunit[rows] = rng.standard_normal((len(rows), 40)).astype(np.float32)
        start = rng.standard_normal(table.shape).astype(np.float32)
        want = start.copy()
        T._C.scalenorm_backward(dunit, table, want_norms, norms._ONE, want, None, norms.FIX_NORM_EPS, True)
        got = start.copy()
        T._C.scalenorm_backward_at(dunit, table, want_norms, norms._ONE, got, rows, norms.FIX_NORM_EPS)
        assert np.array_equal(got, want)
        assert not dunit.any()


@pytest.mark.parametrize("rows, error, match", [
    (np.array([3, 2], np.int64), ValueError, "strictly increasing"),
    (np.array([1, 1], np.int64), ValueError, "strictly increasing"),
    (np.array([0, 10], np.int64), ValueError, r"in \[0, 10\)"),
    (np.array([-1], np.int64), ValueError, r"in \[0, 10\)"),
    (np.array([1, 2], np.int32), TypeError, "int64"),
    ([1, 2], TypeError, "int64")])
def test_scale_norm_at_rows_refuses_rows_it_cannot_use(rows, error, match):
    table = np.ones((10, 4), np.float32)
    with pytest.raises(error, match=match):
        T._C.scalenorm_forward_at(table, norms._ONE, np.empty_like(table), np.empty(10, np.float32), rows)
    with pytest.raises(error, match=match):
        T._C.scalenorm_backward_at(np.zeros_like(table), table, np.ones(10, np.float32), norms._ONE,
                                   np.zeros_like(table), rows)


def _whole_fixnorm(monkeypatch):
    """Every FixNorm table refreshed and differentiated whole: the reference of the by-rows path."""
    whole = T.Seq2SeqTransformer._refresh_fixed
    monkeypatch.setattr(T.Seq2SeqTransformer, "_refresh_fixed",
                        lambda self, training=False, ids=None: whole(self, training))


@pytest.mark.parametrize("tie", ["none", "target", "all"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("n", [1, 2])
def test_fix_norm_at_the_rows_a_pass_reads_gives_the_whole_tables_bits(forced, monkeypatch, tie, precision, n):
    """A table only embeddings read is normalised and differentiated at the rows the pass looks up
    (norms.FixNorm): the losses and every gradient bit are those of the whole table, over passes
    that add into one gradient (dunit kept clean between them), with word dropout, around a
    refused pass, unsharded and sharded."""
    forced(n)
    cfg = config(norm="scale", fix_norm=True, dropout=0.1, word_dropout=0.2, tie_embeddings=tie,
                 src_vocab_size=400, tgt_vocab_size=400)
    data = [batch(seed=s, vocab=400) for s in range(3)]

    def run():
        model = T.Seq2SeqTransformer(cfg, seed=3)
        losses = [model.forward_backward(*data[0], precision=precision),
                  model.forward_backward(*data[1], precision=precision)]
        bad = list(data[2])
        bad[2] = bad[2][:, :-1]                # tgt_out one column short: refused, nothing changed
        with pytest.raises(ValueError):
            model.forward_backward(*bad, precision=precision)
        losses.append(model.forward_backward(*data[2], precision=precision))
        return model, losses, model.params.flat_grad.copy()

    model, losses, grad = run()
    if tie == "none":       # both embedding tables went by rows, and read a fraction of them
        assert set(model._fixed_rows) == {"src_embed.weight", "tgt_embed.weight"}
        assert len(model._fixed_rows["src_embed.weight"]) < 100
    elif tie == "all":
        assert model._fixed_rows == {}
    for name, fixed in model.fixed.items():       # by-rows tables end a pass clean, the others not
        assert fixed.clean == (name in model._fixed_rows)
        assert not fixed.clean or not fixed.dunit.any()
    with monkeypatch.context() as m:
        _whole_fixnorm(m)
        _, want_losses, want = run()
    assert losses == want_losses
    assert np.array_equal(grad, want)


def test_a_fix_norm_pass_that_stops_half_way_leaves_no_gradient_behind(monkeypatch):
    """dunit rows a failed pass dirtied are cleared before the next pass adds (FixNorm.clean)."""
    cfg = config(norm="scale", fix_norm=True, src_vocab_size=400, tgt_vocab_size=400)
    data = batch(vocab=400)
    model = T.Seq2SeqTransformer(cfg, seed=3)
    works = T.Seq2SeqTransformer._encode_decode

    def fails_after_adding(self, src, tgt_in):
        self.fixed["src_embed.weight"].dunit[src.reshape(-1)] += 1.0    # as a backward would, then a failure
        raise RuntimeError("boom")
    monkeypatch.setattr(T.Seq2SeqTransformer, "_encode_decode", fails_after_adding)
    with pytest.raises(RuntimeError):
        model.forward_backward(*data)
    monkeypatch.setattr(T.Seq2SeqTransformer, "_encode_decode", works)
    model.zero_grad()
    got = model.forward_backward(*data)
    fresh = T.Seq2SeqTransformer(cfg, seed=3)
    assert got == fresh.forward_backward(*data)
    assert np.array_equal(model.params.flat_grad, fresh.params.flat_grad)


def test_a_sharded_pass_equals_the_whole_pass_within_rounding(forced):
    cfg, data = config(norm="scale", fix_norm=True), batch()
    results = []
    for n in (1, 3):
        forced(n)
        model = T.Seq2SeqTransformer(cfg, seed=3)
        results.append((model.forward_backward(*data, label_smoothing=0.1), model.params.flat_grad.copy()))
    assert abs(results[0][0] - results[1][0]) <= 1e-5 * abs(results[0][0])
    assert rel(results[1][1], results[0][1]) < 1e-4


# -- the config, files and flags --------------------------------------------------------------------

def test_a_config_without_them_is_written_as_before_and_one_with_them_round_trips():
    plain = config().to_dict()
    assert "norm" not in plain and "fix_norm" not in plain
    assert T.ModelConfig.from_dict(plain).norm == "layer"
    d = config(norm="scale", fix_norm=True).to_dict()
    assert d["norm"] == "scale" and d["fix_norm"] is True
    assert T.ModelConfig.from_dict(json.loads(json.dumps(d))) == config(norm="scale", fix_norm=True)
    fields = {f.name for f in dataclasses.fields(T.ModelConfig)}
    assert {"norm", "fix_norm"} <= fields


@pytest.mark.parametrize("changes, error, match", [
    (dict(norm="rms"), ValueError, "norm must be one of"), (dict(norm=None), ValueError, "norm must be one of"),
    (dict(fix_norm=1), TypeError, "fix_norm must be a bool"), (dict(fix_norm="yes"), TypeError, "fix_norm")])
def test_bad_values_are_refused_naming_the_field(changes, error, match):
    with pytest.raises(error, match=match):
        config(**changes)


def test_a_model_saves_and_loads_with_both_and_gives_the_same_logits(tmp_path):
    model = T.Seq2SeqTransformer(config(norm="scale", fix_norm=True), seed=2)
    model.params.data["transformer.encoder.norm.weight"][0] = 3.0    # not the initial sqrt(d)
    src, tgt_in, _ = batch(B=3)
    want = model.forward(src, tgt_in)
    model.save(tmp_path / "m")
    loaded = T.Seq2SeqTransformer.load(tmp_path / "m")
    assert loaded.cfg == model.cfg
    assert np.array_equal(loaded.forward(src, tgt_in), want)
    assert loaded.greedy_decode(src, max_len=6) == model.greedy_decode(src, max_len=6)


def test_marian_export_refuses_them_naming_the_option():
    marian = dict(positions="split", final_norm=False, norm_first=False, activation="silu")
    for changes, name in ((dict(norm="scale"), "norm='scale'"), (dict(fix_norm=True), "fix_norm=True")):
        with pytest.raises(ValueError, match=f"cannot export as MarianMT: {name}"):
            config_to_marian(config(**marian, **changes))


@pytest.mark.parametrize("changes", [dict(norm="scale"), dict(fix_norm=True)])
def test_the_ctranslate2_writer_refuses_them_even_approximately(tmp_path, changes):
    from transformer.bench.decode import write_ctranslate2_model
    with pytest.raises(ValueError, match="CTranslate2 has no ScaleNorm or FixNorm"):
        write_ctranslate2_model(T.Seq2SeqTransformer(config(**changes)), tmp_path, approximate=True)


def test_train_takes_the_flags_and_writes_them_to_the_model(tmp_path):
    data = write_corpus(tmp_path / "c.tsv", 60)
    out = tmp_path / "run"
    cli.main(["train", "--data", str(data), "--max-steps", "2", "--threads", "1", "--eval-every", "0",
              "--d-model", "32", "--n-heads", "2", "--d-ff", "32", "--n-encoder-layers", "1",
              "--n-decoder-layers", "1", "--norm", "scale", "--fix-norm", "--out", str(out)])
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["norm"] == "scale" and cfg["fix_norm"] is True


def test_a_bad_norm_flag_is_refused_naming_it(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--norm", "rms", "--max-steps", "1"])
    assert "--norm" in capsys.readouterr().err


def test_the_scale_norm_kernel_checks_its_arguments_and_keeps_nan_rows():
    from transformer import _C
    x = rows()
    x[1, 2] = np.nan
    out, n = np.empty_like(x), np.empty(len(x), np.float32)
    _C.scalenorm_forward(x, np.array([2.0], np.float32), out, n)
    assert np.isnan(out[1]).all() and np.isfinite(out[np.arange(len(x)) != 1]).all()
    assert n[3] == np.float32(1e-5)                       # a zero row's norm clamped
    for g, match in ((np.ones(2, np.float32), "g"), (np.ones(1, np.float64), "g")):
        with pytest.raises((ValueError, TypeError), match=match):
            _C.scalenorm_forward(x, g, out, n)
    with pytest.raises(ValueError, match="norms"):
        _C.scalenorm_forward(x, np.ones(1, np.float32), out, np.empty(3, np.float32))


# -- the kernel's bits against numpy, at every SIMD level and thread count ----------------------------

def lane_dot(a, b):
    """The kernel's documented sum per row (csrc/layernorm.h): products in double, eight running
    sums by column mod 8, each in column order, then added pairwise."""
    s = np.zeros((len(a), 8))
    for j in range(a.shape[1]):
        s[:, j % 8] += a[:, j].astype(np.float64) * b[:, j].astype(np.float64)
    return ((s[:, 0] + s[:, 1]) + (s[:, 2] + s[:, 3])) + ((s[:, 4] + s[:, 5]) + (s[:, 6] + s[:, 7]))


def scale_norm_oracle(x, dy, dx0, g, eps=np.float32(1e-5)):
    """Forward and backward in numpy's float32 (each operation rounded as the C rounds it)."""
    norm = np.sqrt(lane_dot(x, x)).astype(np.float32)
    norm = np.where(norm <= eps, eps, norm)
    out = x * (g / norm)[:, None]
    inv = np.float32(1) / norm
    xh = x * inv[:, None]
    dots = lane_dot(dy, xh)
    d = np.where(norm <= eps, np.float32(0), dots.astype(np.float32))
    dx = dx0 + (g / norm)[:, None] * (dy - xh * d[:, None])
    return out, norm, dx, np.float32(dots.sum())     # numpy's sum of 2,100 doubles: pairwise


@pytest.mark.parametrize("D", [1, 7, 13, 24, 130])
def test_the_scale_norm_kernel_gives_the_formulas_bits_at_every_level_and_thread_count(isa, D):
    """2,100 rows cross the backward's 2,048-row block; widths below, at and past one vector."""
    from transformer import _C
    rng = np.random.default_rng(D)
    x = rng.standard_normal((2100, D)).astype(np.float32) * rng.uniform(0.1, 10, (2100, 1)).astype(np.float32)
    x[7] = 0.0                                   # clamped
    dy = rng.standard_normal(x.shape).astype(np.float32)
    dx0 = rng.standard_normal(x.shape).astype(np.float32)
    g = np.float32(1.75)
    out_want, norm_want, dx_want, dg_sum = scale_norm_oracle(x, dy, dx0, g)
    for threads in (1, 2, 3):
        with num_threads(threads):
            out, norm = np.empty_like(x), np.empty(len(x), np.float32)
            _C.scalenorm_forward(x, np.array([g]), out, norm)
            dx, dg = dx0.copy(), np.zeros(1, np.float32)
            _C.scalenorm_backward(dy, x, norm, np.array([g]), dx, dg, accumulate=True)
        assert np.array_equal(norm, norm_want) and np.array_equal(out, out_want), (isa, threads)
        assert np.array_equal(dx, dx_want), (isa, threads)
        # the row sums join dg in row order: within a double's rounding of numpy's pairwise sum
        assert abs(dg[0] - dg_sum) <= 1e-6 * max(1.0, abs(dg_sum)), (isa, threads)
        if threads == 1:
            dg_first = dg[0]
        assert dg[0] == dg_first, (isa, threads)   # the same bits at any thread count


def test_an_int8_file_of_a_fix_norm_model_translates_as_the_model_it_was_saved_from(tmp_path):
    """FixNorm's tables stay float32 in an int8 file (decoding quantizes their unit rows): the loaded
    model's int8 decoding equals the saved model's; every other matrix is stored as int8."""
    model = T.Seq2SeqTransformer(config(norm="scale", fix_norm=True), seed=3)
    src = batch(B=4)[0]
    model.save(tmp_path / "m8", precision="int8")
    loaded = T.Seq2SeqTransformer.load(tmp_path / "m8")
    assert loaded.stored_precision == "int8"
    for name in ("src_embed.weight", "tgt_embed.weight", "generator.weight"):
        assert np.array_equal(loaded.params.data[name], model.params.data[name]), name
    assert set(loaded._int8_seed) == set(model.int8_matrices()) and "transformer.encoder.layers.0.linear1.weight" \
        in loaded._int8_seed
    for search in ("greedy", "beam"):
        kw = dict(max_len=8, precision="int8")
        run = (lambda m: m.greedy_decode(src, **kw)) if search == "greedy" else \
            (lambda m: m.beam_search(src, beam_size=3, **kw))
        assert run(loaded) == run(model), search


@pytest.mark.parametrize("tie, tables", [("none", 3), ("target", 2), ("all", 1)])
def test_a_tied_table_is_normalised_once_for_all_its_readers(tie, tables):
    """One FixNorm a stored table: tied readers read the same unit rows (the gradient they add
    together is checked against PyTorch by test_model_parity's tied FixNorm cases)."""
    cfg = config(fix_norm=True, tie_embeddings=tie, src_vocab_size=43)
    model = T.Seq2SeqTransformer(cfg, seed=1)
    assert len(model.fixed) == tables
    readers = [model.src_embed.table, model.tgt_embed.table, model.generator.weight]
    assert len({id(r) for r in readers}) == tables
    units = model.fixed_tables()
    assert set(units) == {"tgt_embed.weight", "generator.weight"}
    assert (units["tgt_embed.weight"] is units["generator.weight"]) == (tie != "none")


def _defaults(argv):
    from transformer import train

    args = cli.build_parser().parse_args(["train", *argv])
    train.load_resume(args)
    train.apply_defaults(args)
    return args


def test_a_new_run_on_data_defaults_to_scale_norm_with_fix_norm(tmp_path):
    """The defaults of a new run on data (training/flags.py); each can be turned off, and the
    built-in task keeps the paper's LayerNorm."""
    data = str(write_corpus(tmp_path / "c.tsv", 60))
    args = _defaults(["--data", data, "--max-steps", "2"])
    assert (args.norm, args.fix_norm) == ("scale", True)
    args = _defaults(["--data", data, "--max-steps", "2", "--norm", "layer"])    # FixNorm comes with ScaleNorm
    assert (args.norm, args.fix_norm) == ("layer", False)
    args = _defaults(["--data", data, "--max-steps", "2", "--norm", "layer", "--fix-norm"])
    assert (args.norm, args.fix_norm) == ("layer", True)
    args = _defaults(["--data", data, "--max-steps", "2", "--no-fix-norm"])
    assert (args.norm, args.fix_norm) == ("scale", False)
    args = _defaults(["--max-steps", "2"])
    assert args.norm is None and args.fix_norm is None       # the preset's: LayerNorm, no FixNorm
    assert T.ModelConfig(src_vocab_size=5, tgt_vocab_size=5).norm == "layer"


def test_the_train_bench_builds_the_model_a_run_on_data_builds(tmp_path):
    """`transformer bench --what train` times the layers training runs (issue 57): its model has
    the norm, FixNorm and placement that a new run on data defaults to."""
    from transformer.bench import train as bench_train

    args = _defaults(["--data", str(write_corpus(tmp_path / "c.tsv", 60)), "--max-steps", "2", "--preset", "tiny"])
    for name in ("tiny", "base"):
        cfg = bench_train._config(name)
        assert (cfg.norm, cfg.fix_norm, cfg.norm_first) == (args.norm, args.fix_norm, args.norm_first)
    assert (args.norm, args.fix_norm, args.norm_first) == ("scale", True, True)


def test_a_layer_norm_model_stays_one_when_fine_tuned_or_resumed(tmp_path):
    """--init-from and --resume train the model they are given: a LayerNorm model is not turned into
    a ScaleNorm one by the new defaults (its config.json has neither field)."""
    data = str(write_corpus(tmp_path / "c.tsv", 60))
    small = ["--d-model", "32", "--n-heads", "2", "--d-ff", "32", "--n-encoder-layers", "1",
             "--n-decoder-layers", "1", "--threads", "1", "--eval-every", "0", "--quiet"]
    out = tmp_path / "run"
    cli.main(["train", "--data", data, "--max-steps", "2", *small, "--norm", "layer", "--out", str(out)])
    written = json.loads((out / "config.json").read_text())
    assert "norm" not in written and "fix_norm" not in written
    cli.main(["train", "--data", data, "--max-steps", "3", "--threads", "1", "--quiet", "--resume", str(out)])
    assert json.loads((out / "config.json").read_text()) == written
    tuned = tmp_path / "tuned"
    cli.main(["train", "--data", data, "--max-steps", "1", "--threads", "1", "--eval-every", "0", "--quiet",
              "--init-from", str(out), "--out", str(tuned)])
    assert json.loads((tuned / "config.json").read_text()) == written


def test_frozen_weights_are_normalised_once_and_unfreezing_sees_new_weights(monkeypatch):
    """While the weights are frozen (Parameters.freeze: translate, evaluate, serve), FixNorm's unit
    rows are made once, not on every call; once unfrozen, a change to the weights is seen."""
    cfg = config(fix_norm=True, norm="scale")
    model = T.Seq2SeqTransformer(cfg, seed=3)
    src = np.random.default_rng(0).integers(3, 41, (2, 6))
    before = model.greedy_decode(src, max_len=8)
    logits = model.forward(src, src[:, :5])
    calls = []
    real = norms.unit_rows

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    model.params.freeze()
    with monkeypatch.context() as patch:
        patch.setattr(norms, "unit_rows", counted)     # FixNorm.refresh's
        tables = model.fixed_tables()
        for _ in range(3):
            assert model.greedy_decode(src, max_len=8) == before
            assert np.array_equal(model.forward(src, src[:, :5]), logits)
        again = model.fixed_tables()
    assert all(again[name] is tables[name] for name in tables)
    assert len(calls) == 3      # the three FixNorm tables once, for the passes and decoding's steps alike
    model.params.unfreeze()
    model.params.data["generator.weight"][:] *= -1.0      # unit rows point the other way
    flipped = T.Seq2SeqTransformer(cfg, seed=3)
    flipped.load_state_dict({k: v.copy() for k, v in model.state_dict().items()})
    for frozen in (True, False):     # frozen again at once (a new token), then writable and written
        if frozen:
            model.params.freeze()
        else:
            model.params.unfreeze()
            for m in (model, flipped):
                m.params.data["tgt_embed.weight"][:20] *= -1.0
        assert np.array_equal(model.forward(src, src[:, :5]), flipped.forward(src, src[:, :5]))
        assert model.greedy_decode(src, max_len=8) == flipped.greedy_decode(src, max_len=8)
        assert np.array_equal(model.fixed_tables()["generator.weight"], flipped.fixed_tables()["generator.weight"])
