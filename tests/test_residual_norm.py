"""A sub-layer's residual connection and the norm after it, fused (csrc/residual_norm.c, issue 57
item 3): s = residual + dropout(x + bias), out = LayerNorm(s) or ScaleNorm(s), and their backward.

Oracles: the formula in numpy float64 (with the dropout mask _C.dropout_mask draws, itself tested
against its scalar reference in test_dropout.py); and the unfused kernels called in turn, which the
fused ones must equal bit for bit (the layers switch between the two, so a step's bits do not
move), at every SIMD level and thread count; and a training pass through the layers with the fusion
on and off, equal bit for bit (PyTorch parity of that pass is test_model_parity.py's).
"""
import numpy as np
import pytest

import transformer as T
from transformer import _C, layers

from conftest import num_threads

RTOL, ATOL = 1e-5, 1e-6
SEED, OFFSET = 0x5EED, 3 << 40
SHAPES = [(1, 1), (5, 7), (33, 32), (70, 128), (130, 200), (64, 512), (97, 17)]


def assert_close(actual, expected, what):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    err = np.abs(actual - expected)
    floor = ATOL * max(1.0, float(np.abs(expected).max()))
    assert (err <= RTOL * np.abs(expected) + floor).all(), f"{what}: max |diff| {err.max():.3e}"


def make(N, D, seed=0):
    rng = np.random.default_rng(seed)
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)   # noqa: E731
    return dict(x=f(N, D), bias=f(D), residual=f(N, D), weight=f(D), lnbias=f(D), dout=f(N, D))


def keep(N, D, p):
    """The mask and scale the kernels apply (element (r, j) draws counter OFFSET + r * D + j)."""
    if p == 0.0:
        return np.ones((N, D)), 1.0
    mask = _C.dropout_mask(N * D, p, SEED, OFFSET).reshape(N, D).astype(np.float64)
    return mask, float(np.float32(1.0 / (1.0 - p)))


def reference(a, p, with_bias=True):
    """float64: s, out, and the gradients of out . dout."""
    N, D = a["x"].shape
    mask, scale = keep(N, D, p)
    v = a["x"].astype(np.float64) + (a["bias"] if with_bias else 0.0)
    s = a["residual"] + v * mask * scale
    mean = s.mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((s - mean) ** 2).mean(-1, keepdims=True) + np.float64(np.float32(1e-5)))
    xhat = (s - mean) * rstd
    out = xhat * a["weight"] + a["lnbias"]
    dy = a["dout"].astype(np.float64)
    g = dy * a["weight"]
    ds = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    dd = ds * mask * scale
    return dict(s=s, out=out, ds=ds, dd=dd, dweight=(dy * xhat).sum(0), dlnbias=dy.sum(0), dbias=dd.sum(0))


def fused(a, p, with_bias=True):
    N, D = a["x"].shape
    s, out = np.empty((N, D), np.float32), np.empty((N, D), np.float32)
    mean, rstd = np.empty(N, np.float32), np.empty(N, np.float32)
    _C.residual_layernorm_forward(a["x"], a["bias"] if with_bias else None, a["residual"], s, a["weight"],
                                  a["lnbias"], out, mean, rstd, 1e-5, p, SEED, OFFSET)
    ds = a["dout"].copy()
    dd = np.empty((N, D), np.float32) if p > 0 else None
    g = {k: np.full(D, 0.25, np.float32) for k in ("dweight", "dlnbias", "dbias")}
    _C.residual_layernorm_backward(ds, s, a["weight"], mean, rstd, ds, dd, g["dweight"], g["dlnbias"],
                                   g["dbias"], p, SEED, OFFSET)
    return dict(s=s, out=out, mean=mean, rstd=rstd, ds=ds, dd=ds if dd is None else dd,
                **{k: v - np.float32(0.25) for k, v in g.items()})


def unfused(a, p, with_bias=True):
    """The kernels the layers called before: bias + dropout + add, layer norm; layer norm's
    backward, dropout's, bias_grad."""
    N, D = a["x"].shape
    s, out = np.empty((N, D), np.float32), np.empty((N, D), np.float32)
    mean, rstd = np.empty(N, np.float32), np.empty(N, np.float32)
    _C.dropout_add_forward(a["x"], a["residual"], s, p, SEED, OFFSET, bias=a["bias"] if with_bias else None)
    _C.layernorm_forward(s, a["weight"], a["lnbias"], out, mean, rstd, 1e-5)
    ds = a["dout"].copy()
    g = {k: np.full(D, 0.25, np.float32) for k in ("dweight", "dlnbias", "dbias")}
    _C.layernorm_backward(ds, s, a["weight"], mean, rstd, ds, g["dweight"], g["dlnbias"])
    dd = np.empty((N, D), np.float32)
    _C.dropout_backward(ds, dd, p, SEED, OFFSET)
    _C.bias_grad(dd, g["dbias"])
    return dict(s=s, out=out, mean=mean, rstd=rstd, ds=ds, dd=dd,
                **{k: v - np.float32(0.25) for k, v in g.items()})


@pytest.mark.parametrize("N,D", SHAPES)
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_matches_float64_formula(isa, N, D, p):
    a = make(N, D)
    ours, ref = fused(a, p), reference(a, p)
    for k in ("s", "out", "ds", "dd", "dweight", "dlnbias", "dbias"):
        assert_close(ours[k], ref[k], k)


@pytest.mark.parametrize("N,D", SHAPES)
@pytest.mark.parametrize("p", [0.0, 0.1])
@pytest.mark.parametrize("with_bias", [True, False])
def test_same_bits_as_the_kernels_in_turn_at_any_thread_count(isa, N, D, p, with_bias):
    a = make(N, D, seed=N + D)
    with num_threads(1):
        expected = unfused(a, p, with_bias)
    for threads in (1, 2):
        with num_threads(threads):
            ours = fused(a, p, with_bias)
        for k, v in expected.items():
            assert np.array_equal(ours[k].view(np.uint32), v.view(np.uint32)), (k, threads)


def test_in_place_on_the_residual():
    """s may be the residual (or x) itself, as the kernels in turn allow."""
    a = make(40, 64)
    expected = fused(a, 0.2)
    s, out = a["residual"], np.empty((40, 64), np.float32)
    mean, rstd = np.empty(40, np.float32), np.empty(40, np.float32)
    _C.residual_layernorm_forward(a["x"], a["bias"], s, s, a["weight"], a["lnbias"], out, mean, rstd,
                                  1e-5, 0.2, SEED, OFFSET)
    assert np.array_equal(s, expected["s"]) and np.array_equal(out, expected["out"])


def test_refuses_bad_arguments():
    a = make(6, 8)
    N, D = 6, 8
    s, out = np.empty((N, D), np.float32), np.empty((N, D), np.float32)
    mean, rstd = np.empty(N, np.float32), np.empty(N, np.float32)
    fwd = lambda **k: _C.residual_layernorm_forward(   # noqa: E731
        k.get("x", a["x"]), k.get("bias", a["bias"]), a["residual"], k.get("s", s), a["weight"], a["lnbias"],
        k.get("out", out), mean, rstd, 1e-5, k.get("p", 0.1), SEED, OFFSET)
    with pytest.raises(ValueError, match="bias"):
        fwd(bias=np.zeros(D + 1, np.float32))
    with pytest.raises(TypeError, match="x"):
        fwd(x=a["x"].astype(np.float64))
    with pytest.raises(ValueError, match="out"):
        fwd(out=s)
    with pytest.raises(ValueError, match="p"):
        fwd(p=1.0)
    fwd()
    g = [np.zeros(D, np.float32) for _ in range(3)]
    with pytest.raises(ValueError, match="dd"):     # p > 0 needs its own buffer
        _C.residual_layernorm_backward(a["dout"], s, a["weight"], mean, rstd, a["dout"].copy(), None, *g, 0.1)
    ds = a["dout"].copy()
    with pytest.raises(ValueError, match="dd"):     # and not ds itself
        _C.residual_layernorm_backward(a["dout"], s, a["weight"], mean, rstd, ds, ds, *g, 0.1)
    with pytest.raises(ValueError, match="dd"):     # p == 0: dd is ds, none given
        _C.residual_layernorm_backward(a["dout"], s, a["weight"], mean, rstd, ds, np.empty_like(ds), *g, 0.0)


# -- ScaleNorm's (the default model's norm) --------------------------------------------------------

SN_EPS = 1e-5


def reference_scale(a, p, g, with_bias=True):
    """float64: s, out = s * g / max(||s||, eps), and the gradients of out . dout."""
    N, D = a["x"].shape
    mask, scale = keep(N, D, p)
    v = a["x"].astype(np.float64) + (a["bias"] if with_bias else 0.0)
    s = a["residual"] + v * mask * scale
    norm = np.maximum(np.sqrt((s * s).sum(-1, keepdims=True)), SN_EPS)
    shat = s / norm
    dy = a["dout"].astype(np.float64)
    dot = (dy * shat).sum(-1, keepdims=True)
    ds = g / norm * (dy - shat * dot)
    dd = ds * mask * scale
    return dict(s=s, out=shat * g, ds=ds, dd=dd, dg=np.array([dot.sum()]), dbias=dd.sum(0))


def fused_scale(a, p, g, with_bias=True):
    N, D = a["x"].shape
    s, out, norms = np.empty((N, D), np.float32), np.empty((N, D), np.float32), np.empty(N, np.float32)
    gain = np.array([g], np.float32)
    _C.residual_scalenorm_forward(a["x"], a["bias"] if with_bias else None, a["residual"], s, gain, out, norms,
                                  SN_EPS, p, SEED, OFFSET)
    ds = a["dout"].copy()
    dd = np.empty((N, D), np.float32) if p > 0 else None
    dg, dbias = np.full(1, 0.25, np.float32), np.full(D, 0.25, np.float32)
    _C.residual_scalenorm_backward(ds, s, norms, gain, ds, dd, dg, dbias, SN_EPS, p, SEED, OFFSET)
    return dict(s=s, out=out, norms=norms, ds=ds, dd=ds if dd is None else dd, dg=dg - np.float32(0.25),
                dbias=dbias - np.float32(0.25))


def unfused_scale(a, p, g, with_bias=True):
    """The kernels the layers call one by one: bias + dropout + add, ScaleNorm; ScaleNorm's backward,
    dropout's, bias_grad."""
    N, D = a["x"].shape
    s, out, norms = np.empty((N, D), np.float32), np.empty((N, D), np.float32), np.empty(N, np.float32)
    gain = np.array([g], np.float32)
    _C.dropout_add_forward(a["x"], a["residual"], s, p, SEED, OFFSET, bias=a["bias"] if with_bias else None)
    _C.scalenorm_forward(s, gain, out, norms, SN_EPS)
    ds = a["dout"].copy()
    dg, dbias = np.full(1, 0.25, np.float32), np.full(D, 0.25, np.float32)
    _C.scalenorm_backward(ds, s, norms, gain, ds, dg, SN_EPS)
    dd = np.empty((N, D), np.float32)
    _C.dropout_backward(ds, dd, p, SEED, OFFSET)
    _C.bias_grad(dd, dbias)
    return dict(s=s, out=out, norms=norms, ds=ds, dd=dd, dg=dg - np.float32(0.25), dbias=dbias - np.float32(0.25))


@pytest.mark.parametrize("N,D", SHAPES)
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_scalenorm_matches_float64_formula(isa, N, D, p):
    a = make(N, D)
    ours, ref = fused_scale(a, p, 3.5), reference_scale(a, p, 3.5)
    for k in ("s", "out", "ds", "dd", "dbias"):
        assert_close(ours[k], ref[k], k)
    assert abs(float(ours["dg"][0]) - ref["dg"][0]) <= 1e-4 * max(1.0, abs(ref["dg"][0])), "dg"


@pytest.mark.parametrize("N,D", SHAPES + [(150, 128)])
@pytest.mark.parametrize("p", [0.0, 0.1])
@pytest.mark.parametrize("with_bias", [True, False])
def test_scalenorm_same_bits_as_the_kernels_in_turn_at_any_thread_count(isa, N, D, p, with_bias):
    a = make(N, D, seed=N + D)
    a["x"][N // 2] = 0.0          # a row whose norm is clamped (no residual: its s is zero too)
    a["residual"][N // 2] = 0.0
    with num_threads(1):
        expected = unfused_scale(a, p, 11.3, with_bias)
    for threads in (1, 2):
        with num_threads(threads):
            ours = fused_scale(a, p, 11.3, with_bias)
        for k, v in expected.items():
            assert np.array_equal(ours[k].view(np.uint32), v.view(np.uint32)), (k, threads)


def test_scalenorm_refuses_bad_arguments():
    a = make(6, 8)
    N, D = 6, 8
    s, out, norms, g = np.empty((N, D), np.float32), np.empty((N, D), np.float32), np.empty(N, np.float32), \
        np.ones(1, np.float32)
    fwd = lambda **k: _C.residual_scalenorm_forward(   # noqa: E731
        k.get("x", a["x"]), k.get("bias", a["bias"]), a["residual"], k.get("s", s), k.get("g", g),
        k.get("out", out), k.get("norms", norms), SN_EPS, k.get("p", 0.1), SEED, OFFSET)
    with pytest.raises(ValueError, match="bias"):
        fwd(bias=np.zeros(D + 1, np.float32))
    with pytest.raises(ValueError, match="g"):
        fwd(g=np.ones(2, np.float32))
    with pytest.raises(ValueError, match="norms"):
        fwd(norms=np.empty(N + 1, np.float32))
    with pytest.raises(ValueError, match="out"):
        fwd(out=s)
    with pytest.raises(ValueError, match="p"):
        fwd(p=1.0)
    fwd()
    dg, dbias = np.zeros(1, np.float32), np.zeros(D, np.float32)
    bwd = lambda ds, dd, p, **k: _C.residual_scalenorm_backward(   # noqa: E731
        a["dout"], s, norms, g, ds, dd, k.get("dg", dg), k.get("dbias", dbias), SN_EPS, p)
    with pytest.raises(ValueError, match="dd"):     # p > 0 needs its own buffer
        bwd(a["dout"].copy(), None, 0.1)
    ds = a["dout"].copy()
    with pytest.raises(ValueError, match="dd"):     # and not ds itself
        bwd(ds, ds, 0.1)
    with pytest.raises(ValueError, match="dd"):     # p == 0: dd is ds, none given
        bwd(ds, np.empty_like(ds), 0.0)
    with pytest.raises(ValueError, match="dbias"):
        bwd(ds, None, 0.0, dbias=ds[0])
    bwd(ds, None, 0.0, dg=None)


# -- the backward through a dropout (and an activation) and a bias, where no norm follows ------------

@pytest.mark.parametrize("N,D", SHAPES + [(150, 512)])
@pytest.mark.parametrize("p", [0.0, 0.1])
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
@pytest.mark.parametrize("in_place", [True, False])
def test_dropout_bias_backward_same_bits_as_the_kernels_in_turn(isa, N, D, p, activation, in_place):
    a = make(N, D, seed=2 * N + D)
    pre = a["x"]
    pre[0, :2] = 0.0                                   # ReLU's derivative at 0
    with num_threads(1):
        dd = np.empty((N, D), np.float32)
        _C.dropout_backward(a["dout"], dd, p, SEED, OFFSET)
        if activation:
            _C.act_backward(dd, pre, dd, activation)
        dbias = np.full(D, 0.25, np.float32)
        _C.bias_grad(dd, dbias)
    for threads in (1, 2):
        with num_threads(threads):
            ds = a["dout"].copy()
            ours = ds if in_place else np.empty((N, D), np.float32)
            db = np.full(D, 0.25, np.float32)
            kw = dict(pre=pre, activation=activation) if activation else {}
            _C.dropout_bias_backward(ds, ours, db, p, SEED, OFFSET, **kw)
        assert np.array_equal(ours.view(np.uint32), dd.view(np.uint32)), ("dd", threads)
        assert np.array_equal(db.view(np.uint32), dbias.view(np.uint32)), ("dbias", threads)


def test_dropout_bias_backward_refuses_bad_arguments():
    a = make(6, 8)
    ds, dd, db = a["dout"], np.empty((6, 8), np.float32), np.zeros(8, np.float32)
    with pytest.raises(ValueError, match="dbias"):
        _C.dropout_bias_backward(ds, dd, np.zeros(9, np.float32), 0.1)
    with pytest.raises(ValueError, match="dd"):
        _C.dropout_bias_backward(ds, np.empty((5, 8), np.float32), db, 0.1)
    with pytest.raises(ValueError, match="pre"):
        _C.dropout_bias_backward(ds, dd, db, 0.1, pre=dd)
    with pytest.raises(ValueError, match="p"):
        _C.dropout_bias_backward(ds, dd, db, 1.5)
    with pytest.raises(ValueError, match="activation"):
        _C.dropout_bias_backward(ds, dd, db, 0.1, pre=a["x"], activation="tanhh")


# -- the layers: fused and unfused give the same pass ------------------------------------------------

BASE = dict(src_vocab_size=41, tgt_vocab_size=43, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2,
            n_decoder_layers=2, max_len=32)


def training_pass(cfg, precision, fuse, monkeypatch):
    monkeypatch.setattr(layers, "fuse_residual_norm", fuse)
    rng = np.random.default_rng(1)
    src, tgt = rng.integers(3, 41, (6, 11)), rng.integers(3, 43, (6, 10))
    src[2, 7:] = 0
    tgt[4, 6:] = 0
    model = T.Seq2SeqTransformer(cfg, seed=5)
    losses = [model.forward_backward(src, tgt[:, :-1], tgt[:, 1:], label_smoothing=0.1, precision=precision)
              for _ in range(2)]
    return losses, model.params.flat_grad.copy()


@pytest.mark.parametrize("norm", ["layer", "scale"])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("dropout", [0.0, 0.2])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_training_pass_same_bits_fused_or_not(monkeypatch, norm, norm_first, dropout, precision):
    cfg = T.ModelConfig(**BASE, dropout=dropout, norm_first=norm_first, norm=norm, fix_norm=norm == "scale")
    loss_a, grad_a = training_pass(cfg, precision, True, monkeypatch)
    loss_b, grad_b = training_pass(cfg, precision, False, monkeypatch)
    assert loss_a == loss_b
    assert np.array_equal(grad_a.view(np.uint32), grad_b.view(np.uint32))
