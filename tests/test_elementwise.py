"""Residual add, bias add / bias gradient, fused bias + ReLU/GELU and their backward (transformer._C).

References are numpy float64. Tolerances, stated once:
- add, add_bias, ReLU: exact (one float32 rounding, same as numpy float32).
- bias_grad: |ours - float64 sum| <= 1e-6 * sum(|dout|) per column (blocked fixed-order sum).
- GELU forward: within GELU_ULPS ulp of the float64 value (the SIMD erf path is measured at ~5 ulp;
  results below 1e-37 in magnitude are compared absolutely, Phi is flushed to 0 below x = -13.19).
- GELU backward: |ours - ref| <= 4e-7 + 1e-6 |ref| (the derivative crosses zero at x = -0.75).
- SiLU forward: within SILU_ULPS ulp of the float64 value (exp, an add and a division); below
  x = -88.7 exp(-x) overflows and the SIMD result is -0 (|silu(x)| < 3e-37 there: compared
  absolutely below 1e-35).
- SiLU backward: |ours - ref| <= 4e-7 + 1e-6 |ref| (the derivative crosses zero at x = -1.28).
"""
import math

import numpy as np
import pytest

from transformer import _C
from conftest import ISA_LEVELS

LEVELS = ISA_LEVELS
GELU_ULPS = 8
GELU_GRAD_ATOL, GELU_GRAD_RTOL = 4e-7, 1e-6
SILU_ULPS = 4
SILU_TINY = 1e-35
SHAPES = [(1, 1), (3, 7), (2, 15), (2, 16), (3, 17), (2, 31), (2, 32), (2, 33), (3, 63), (2, 64),
          (2, 65), (13, 97), (0, 5), (5, 0)]




def rand(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def gelu64(x):
    x = np.asarray(x, np.float64)
    return x * 0.5 * _erfc(-x / math.sqrt(2.0))


def gelu_grad64(x):
    x = np.asarray(x, np.float64)
    cdf = 0.5 * _erfc(-x / math.sqrt(2.0))
    return cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def silu64(x):
    x = np.asarray(x, np.float64)
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-x))


def silu_grad64(x):
    x = np.asarray(x, np.float64)
    with np.errstate(over="ignore"):
        s = 1.0 / (1.0 + np.exp(-x))
    return s * (1.0 + x * (1.0 - s))


def act64(act, x):
    return {"gelu": gelu64, "silu": silu64}[act](x)


def act_grad64(act, x):
    return {"gelu": gelu_grad64, "silu": silu_grad64}[act](x)


def assert_ulps(got, want, ulps, tiny=1e-37):
    want = np.asarray(want, np.float64)
    got = np.asarray(got, np.float64)
    err = np.abs(got - want)
    allowed = ulps * np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    allowed = np.where(np.abs(want) < tiny, tiny, allowed)
    bad = err > allowed
    if bad.any():
        i = np.flatnonzero(bad.ravel())[0]
        ulp_err = (err / np.spacing(np.abs(want).astype(np.float32))).max()
        raise AssertionError(f"{bad.sum()} elements off by more than {ulps} ulp; max {ulp_err:.2f} ulp; "
                             f"first at flat {i}: got {got.ravel()[i]!r} want {want.ravel()[i]!r}")


def assert_close(got, want, atol, rtol):
    err = np.abs(np.asarray(got, np.float64) - want)
    lim = atol + rtol * np.abs(want)
    assert (err <= lim).all(), f"max abs err {err.max():.3g}, max err/limit {(err / lim).max():.3g}"


# ---- add --------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES + [(4, 3, 5), (1000,)])
def test_add_matches_numpy(isa, shape):
    a, b = rand(*shape, seed=1), rand(*shape, seed=2)
    out = np.full(shape, np.nan, np.float32)
    _C.add(a, b, out)
    np.testing.assert_array_equal(out, a + b)


def test_add_in_place_on_either_input(isa):
    a, b = rand(7, 33, seed=1), rand(7, 33, seed=2)
    want = a + b
    a1 = a.copy()
    _C.add(a1, b, a1)
    np.testing.assert_array_equal(a1, want)
    b1 = b.copy()
    _C.add(a, b1, b1)
    np.testing.assert_array_equal(b1, want)
    c = a.copy()
    _C.add(c, c, c)
    np.testing.assert_array_equal(c, a + a)


# ---- bias add and gradient --------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES)
def test_add_bias_matches_numpy(isa, shape):
    x, bias = rand(*shape, seed=1), rand(shape[1], seed=2)
    want = x + bias
    _C.add_bias(x, bias)
    np.testing.assert_array_equal(x, want)


@pytest.mark.parametrize("shape", SHAPES + [(1000, 3), (257, 130)])
def test_bias_grad_accumulates_column_sums(isa, shape):
    dout = rand(*shape, seed=3)
    dbias = rand(shape[1], seed=4)
    want = dbias.astype(np.float64) + dout.astype(np.float64).sum(axis=0)
    _C.bias_grad(dout, dbias)
    tol = 1e-6 * np.abs(dout).astype(np.float64).sum(axis=0) + 1e-6 * np.abs(want)
    err = np.abs(dbias - want)
    assert (err <= tol).all(), f"max err {err.max():.3g}"


@pytest.mark.parametrize("shape", [(301, 77), (130, 1024), (65, 1100)])
def test_bias_grad_same_bits_at_every_isa_level(shape):
    dout, d0 = rand(*shape, seed=5), rand(shape[1], seed=6)
    results = []
    for level in LEVELS:
        _C.set_isa(level)
        d = d0.copy()
        _C.bias_grad(dout, d)
        results.append(d)
    _C.set_isa(_C.best_isa())
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


# ---- activations ------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES)
def test_bias_relu_forward(isa, shape):
    x, bias = rand(*shape, seed=1), rand(shape[1], seed=2)
    pre = x + bias
    out = np.full(shape, np.nan, np.float32)
    _C.bias_act_forward(x, bias, out, "relu")
    np.testing.assert_array_equal(x, pre)             # x now holds the pre-activation
    np.testing.assert_array_equal(out, np.maximum(pre, 0))


@pytest.mark.parametrize("act, ulps", [("gelu", GELU_ULPS), ("silu", SILU_ULPS)])
@pytest.mark.parametrize("shape", SHAPES)
def test_bias_gelu_and_silu_forward(isa, shape, act, ulps):
    x, bias = rand(*shape, seed=1, scale=3.0), rand(shape[1], seed=2)
    pre = x + bias
    out = np.full(shape, np.nan, np.float32)
    _C.bias_act_forward(x, bias, out, act)
    np.testing.assert_array_equal(x, pre)
    assert_ulps(out, act64(act, pre), ulps)


@pytest.mark.parametrize("act", ["relu", "gelu", "silu"])
@pytest.mark.parametrize("shape", SHAPES)
def test_fast_kernels_match_the_naive_c_reference(isa, act, shape):
    x, bias, g = rand(*shape, seed=1, scale=3.0), rand(shape[1], seed=2), rand(*shape, seed=3)
    xf, xr = x.copy(), x.copy()
    yf, yr = np.empty_like(x), np.empty_like(x)
    _C.bias_act_forward(xf, bias, yf, act)
    _C.bias_act_forward(xr, bias, yr, act, reference=True)
    np.testing.assert_array_equal(xf, xr)
    df, dr = rand(*shape, seed=4), rand(*shape, seed=4)
    _C.act_backward(g, xf, df, act, accumulate=True)
    _C.act_backward(g, xr, dr, act, accumulate=True, reference=True)
    if act == "relu":
        np.testing.assert_array_equal(yf, yr)
        np.testing.assert_array_equal(df, dr)
    else:   # the reference evaluates GELU and SiLU in double precision
        assert_ulps(yf, yr, GELU_ULPS if act == "gelu" else SILU_ULPS)
        assert_close(df, dr.astype(np.float64), GELU_GRAD_ATOL * (1 + np.abs(g)), GELU_GRAD_RTOL)


@pytest.mark.parametrize("act", ["relu", "gelu", "silu"])
@pytest.mark.parametrize("shape", SHAPES + [(1500, 2048)])   # the last past 32 MiB moved: streaming stores
def test_bias_act_forward_in_place_leaves_the_activation(isa, act, shape):
    # out = x: inference's feed-forward, which keeps no pre-activation (FeedForward.forward)
    if shape[0] * shape[1] * 12 > 32 << 20 and isa != _C.best_isa():   # csrc's elementwise_stream_bytes
        pytest.skip("the streaming size at the best level only")
    x, bias = rand(*shape, seed=1, scale=3.0), rand(shape[1], seed=2)
    apart, out = x.copy(), np.empty_like(x)
    _C.bias_act_forward(apart, bias, out, act)
    _C.bias_act_forward(x, bias, x, act)
    np.testing.assert_array_equal(x, out)


def test_gelu_forward_over_the_whole_range(isa):
    # dense grid including the far left tail (where 1 + erf(x) cancels) and large positive x
    x = np.concatenate([np.linspace(-16, 10, 20001), [0.0, -0.0, 1e-30, -1e-30, 5e-39, 100, -100, 1e30, -1e30]])
    x = x.astype(np.float32).reshape(1, -1)
    out = np.empty_like(x)
    _C.bias_act_forward(x.copy(), np.zeros(x.shape[1], np.float32), out, "gelu")
    assert_ulps(out, gelu64(x), GELU_ULPS)


@pytest.mark.parametrize("act", ["relu", "gelu", "silu"])
@pytest.mark.parametrize("shape", SHAPES)
def test_act_backward_matches_analytic_derivative(isa, act, shape):
    pre, dout = rand(*shape, seed=1, scale=3.0), rand(*shape, seed=2)
    dx = np.full(shape, np.nan, np.float32)
    _C.act_backward(dout, pre, dx, act)
    if act == "relu":
        np.testing.assert_array_equal(dx, np.where(pre > 0, dout, 0))
    else:
        assert_close(dx, dout * act_grad64(act, pre), GELU_GRAD_ATOL * np.abs(dout), GELU_GRAD_RTOL)


def test_silu_over_the_whole_range(isa):
    x = np.concatenate([np.linspace(-100, 100, 40001), [0.0, -0.0, 1e-30, -1e-30, 5e-39, 1e30, -1e30]])
    x = x.astype(np.float32).reshape(1, -1)
    out, dx = np.empty_like(x), np.empty_like(x)
    _C.bias_act_forward(x.copy(), np.zeros(x.shape[1], np.float32), out, "silu")
    assert_ulps(out, silu64(x), SILU_ULPS, tiny=SILU_TINY)
    _C.act_backward(np.ones_like(x), x, dx, "silu")
    assert_close(dx, silu_grad64(x), GELU_GRAD_ATOL, GELU_GRAD_RTOL)


def test_silu_propagates_nan_and_matches_torch_autograd(isa):
    torch = pytest.importorskip("torch")
    x = np.concatenate([np.linspace(-20, 20, 4001), [np.nan]]).astype(np.float32)
    xt = torch.tensor(x, requires_grad=True)
    yt = torch.nn.functional.silu(xt)
    g = np.random.default_rng(1).standard_normal(x.size).astype(np.float32)
    yt.backward(torch.from_numpy(g))
    out, pre = np.empty((1, x.size), np.float32), x.reshape(1, -1).copy()
    _C.bias_act_forward(pre, np.zeros(x.size, np.float32), out, "silu")
    dx = np.empty_like(out)
    _C.act_backward(g.reshape(1, -1), pre, dx, "silu")
    assert np.isnan(out[0, -1]) and np.isnan(dx[0, -1])
    assert_close(out.ravel()[:-1], yt.detach().numpy()[:-1].astype(np.float64), 1e-6, 1e-6)
    assert_close(dx.ravel()[:-1], xt.grad.numpy()[:-1].astype(np.float64), 1e-6 * np.abs(g[:-1]) + 1e-7, 1e-6)


@pytest.mark.parametrize("act", ["relu", "gelu", "silu"])
def test_act_backward_accumulates(isa, act):
    pre, dout, dx0 = rand(5, 37, seed=1), rand(5, 37, seed=2), rand(5, 37, seed=3)
    fresh = np.empty_like(dx0)
    _C.act_backward(dout, pre, fresh, act)
    dx = dx0.copy()
    _C.act_backward(dout, pre, dx, act, accumulate=True)
    np.testing.assert_array_equal(dx, dx0 + fresh)


@pytest.mark.parametrize("act", ["relu", "gelu", "silu"])
def test_act_backward_in_place_on_dout(isa, act):
    pre, dout = rand(3, 41, seed=1), rand(3, 41, seed=2)
    want = np.empty_like(dout)
    _C.act_backward(dout, pre, want, act)
    _C.act_backward(dout, pre, dout, act)
    np.testing.assert_array_equal(dout, want)


def test_relu_derivative_at_zero_is_zero(isa):
    pre = np.array([[-1.0, -0.0, 0.0, 1e-45, 2.0, np.nan]], np.float32)
    dx = np.empty_like(pre)
    _C.act_backward(np.full_like(pre, 3.0), pre, dx, "relu")
    np.testing.assert_array_equal(dx, [[0, 0, 0, 3, 3, 3]])     # as torch: zero where pre <= 0


def test_gelu_propagates_nan(isa):
    x = np.array([[np.nan, 1.0, -1.0] * 7], np.float32)
    out, dx = np.empty_like(x), np.empty_like(x)
    _C.bias_act_forward(x.copy(), np.zeros(x.shape[1], np.float32), out, "gelu")
    _C.act_backward(np.ones_like(x), x, dx, "gelu")
    np.testing.assert_array_equal(np.isnan(out), np.isnan(x))
    np.testing.assert_array_equal(np.isnan(dx), np.isnan(x))


def test_relu_keeps_nan_and_signed_zero_like_torch(isa):
    x = np.array([[np.nan, -0.0, 0.0, -2.0, 3.0]], np.float32)
    out = np.empty_like(x)
    _C.bias_act_forward(x.copy(), np.zeros(5, np.float32), out, "relu")
    assert np.isnan(out[0, 0])
    np.testing.assert_array_equal(out[0, 1:], [0, 0, 0, 3])


@pytest.mark.parametrize("act", ["relu", "gelu", "silu"])
def test_act_backward_matches_finite_differences_of_forward(isa, act):
    # central differences of our own float32 forward, per element; ReLU away from its kink
    rng = np.random.default_rng(7)
    pre = (rng.standard_normal((4, 53)) * 3).astype(np.float32)
    if act == "relu":
        pre[np.abs(pre) < 0.1] = 0.5
    h = np.float32(1e-2)

    def f(v):
        out = np.empty_like(v)
        _C.bias_act_forward(v.copy(), np.zeros(v.shape[1], np.float32), out, act)
        return out.astype(np.float64)

    fd = (f(pre + h) - f(pre - h)) / (np.float64(pre + h) - np.float64(pre - h))
    dx = np.empty_like(pre)
    _C.act_backward(np.ones_like(pre), pre, dx, act)
    assert_close(dx, fd, 2e-3, 2e-3)   # O(h^2) truncation plus float32 rounding / h


def test_gelu_matches_torch_autograd(isa):
    torch = pytest.importorskip("torch")
    x = np.concatenate([np.linspace(-12, 12, 4801), [-30, -20, 20, 30, 0.0]]).astype(np.float32)
    xt = torch.tensor(x, requires_grad=True)
    yt = torch.nn.functional.gelu(xt)
    g = np.random.default_rng(1).standard_normal(x.size).astype(np.float32)
    yt.backward(torch.from_numpy(g))
    out = np.empty((1, x.size), np.float32)
    pre = x.reshape(1, -1).copy()
    _C.bias_act_forward(pre, np.zeros(x.size, np.float32), out, "gelu")
    dx = np.empty_like(out)
    _C.act_backward(g.reshape(1, -1), pre, dx, "gelu")
    # torch evaluates 1 + erf(x / sqrt 2) in float32 (absolute error ~1e-7), so compare absolutely
    assert_close(out.ravel(), yt.detach().numpy().astype(np.float64), 1e-6, 1e-6)
    assert_close(dx.ravel(), xt.grad.numpy().astype(np.float64), 1e-6 * np.abs(g) + 1e-7, 1e-6)


# ---- thread count ------------------------------------------------------------------------------

def test_every_kernel_gives_same_bits_at_1_and_2_threads(isa, restore_threads):
    N, D = 384, 401                        # > 2 * grain: both threads work, ragged ends
    x, bias, a, g = rand(N, D, seed=1, scale=3), rand(D, seed=2), rand(N, D, seed=3), rand(N, D, seed=4)
    results = []
    for threads in (1, 2):
        _C.set_num_threads(threads)
        r = {}
        out = np.empty_like(x)
        _C.add(x, a, out); r["add"] = out
        xb = x.copy(); _C.add_bias(xb, bias); r["add_bias"] = xb
        db = bias.copy(); _C.bias_grad(g, db); r["bias_grad"] = db
        for act in ("relu", "gelu"):
            xa, ya = x.copy(), np.empty_like(x)
            _C.bias_act_forward(xa, bias, ya, act); r[act] = ya
            dx = a.copy(); _C.act_backward(g, xa, dx, act, accumulate=True); r[act + "_bwd"] = dx
        results.append(r)
    for k in results[0]:
        np.testing.assert_array_equal(results[0][k], results[1][k], err_msg=k)


# ---- large calls: outputs written with non-temporal stores (more than 32 MiB moved) -------------

def _misaligned(shape, seed):
    """C-contiguous float32 data starting 4 bytes past an allocation: not 64-byte aligned."""
    n = int(np.prod(shape))
    buf = np.empty(n + 1, np.float32)[1:]
    buf[:] = rand(n, seed=seed)
    return buf.reshape(shape)


def test_large_calls_give_the_same_bits_as_small_ones(isa, restore_threads):
    N, D = 1500, 2011                     # 3.0e6 elements: 36 MB moved by each op below
    x, bias, a, g = _misaligned((N, D), 1), rand(D, seed=2), _misaligned((N, D), 3), _misaligned((N, D), 4)
    for threads in (1, 2):
        _C.set_num_threads(threads)
        out = _misaligned((N, D), 5)
        _C.add(x, a, out)
        np.testing.assert_array_equal(out, x + a)
        for act in ("relu", "gelu"):
            xa, ya, dx = x.copy(), _misaligned((N, D), 6), _misaligned((N, D), 7)
            _C.bias_act_forward(xa, bias, ya, act)
            _C.act_backward(g, xa, dx, act)
            rows = slice(N // 2 - 3, N // 2 + 4)          # the same rows as a small call
            xs, ys, dxs = x[rows].copy(), np.empty((7, D), np.float32), np.empty((7, D), np.float32)
            _C.bias_act_forward(xs, bias, ys, act)
            _C.act_backward(g[rows].copy(), xs, dxs, act)
            np.testing.assert_array_equal(ya[rows], ys, err_msg=act)
            np.testing.assert_array_equal(dx[rows], dxs, err_msg=act)
            np.testing.assert_array_equal(ya[[0, -1]], _act_rows(x[[0, -1]], bias, act))


def _act_rows(x, bias, act):
    out = np.empty_like(x)
    _C.bias_act_forward(x.copy(), bias, out, act)
    return out


# ---- bad input ---------------------------------------------------------------------------------

def _f(*shape):
    return np.zeros(shape, np.float32)


def _readonly(a):
    a.flags.writeable = False
    return a


BAD = [
    # add
    (lambda: _C.add(_f(4, 5).astype(np.float64), _f(4, 5), _f(4, 5)), TypeError, "a"),
    (lambda: _C.add(_f(4, 5), _f(4, 5).astype(np.float16), _f(4, 5)), TypeError, "b"),
    (lambda: _C.add(_f(4, 5), _f(4, 5), _f(4, 5).astype(np.int32)), TypeError, "out"),
    (lambda: _C.add([[0.0]], _f(1, 1), _f(1, 1)), TypeError, "a"),
    (lambda: _C.add(_f(4, 5), _f(4, 6), _f(4, 5)), ValueError, "b"),
    (lambda: _C.add(_f(4, 5), _f(4, 5), _f(5, 4)), ValueError, "out"),
    (lambda: _C.add(_f(4, 10)[:, ::2], _f(4, 5), _f(4, 5)), ValueError, "a"),
    (lambda: _C.add(_f(4, 5), _f(4, 5), _readonly(_f(4, 5))), ValueError, "out"),
    # bias
    (lambda: _C.add_bias(_f(4, 5), _f(4)), ValueError, "bias"),
    (lambda: _C.add_bias(_f(20), _f(5)), ValueError, "x"),
    (lambda: _C.add_bias(_readonly(_f(4, 5)), _f(5)), ValueError, "x"),
    (lambda: _C.add_bias(_f(4, 5), _f(5).astype(np.float64)), TypeError, "bias"),
    (lambda: _C.bias_grad(_f(4, 5), _f(6)), ValueError, "dbias"),
    (lambda: _C.bias_grad(_f(4, 5), _readonly(_f(5))), ValueError, "dbias"),
    (lambda: _C.bias_grad(_f(4, 5).astype(object), _f(5)), TypeError, "dout"),
    # activations
    (lambda: _C.bias_act_forward(_f(4, 5), _f(5), _f(4, 5), "tanh"), ValueError, "activation"),
    (lambda: _C.bias_act_forward(_f(4, 5), _f(5), _f(4, 5), None), TypeError, "activation"),
    (lambda: _C.bias_act_forward(_f(4, 5), _f(5), _f(4, 6), "relu"), ValueError, "out"),
    (lambda: _C.bias_act_forward(_f(4, 5), _f(6), _f(4, 5), "relu"), ValueError, "bias"),
    (lambda: _C.bias_act_forward(_f(4, 5, 1), _f(5), _f(4, 5), "relu"), ValueError, "x"),
    (lambda: _C.act_backward(_f(4, 5), _f(4, 6), _f(4, 5), "gelu"), ValueError, "pre"),
    (lambda: _C.act_backward(_f(4, 5), _f(4, 5), _f(4, 5).astype(np.float64), "gelu"), TypeError, "dx"),
    (lambda: _C.act_backward(_f(4, 5), _f(4, 5), _readonly(_f(4, 5)), "relu"), ValueError, "dx"),
    (lambda: _C.act_backward(_f(4, 5), _f(4, 5), _f(4, 5), "gelu_tanh"), ValueError, "activation"),
]


@pytest.mark.parametrize("call,exc,name", BAD)
def test_bad_input_is_refused_naming_the_argument(call, exc, name):
    with pytest.raises(exc, match=rf"\b{name}\b"):
        call()


def test_out_overlapping_inputs_is_refused():
    buf = _f(10, 8)
    with pytest.raises(ValueError, match="out"):            # partial overlap with a
        _C.add(buf[0:5], _f(5, 8), buf[1:6])
    x = _f(5, 5)
    with pytest.raises(ValueError, match="out"):             # out may be x, but not x shifted by a row
        _C.bias_act_forward(x[:4], _f(5), x[1:], "relu")
    flat = _f(30)
    with pytest.raises(ValueError, match="bias"):             # bias is x's last row
        _C.add_bias(flat.reshape(6, 5), flat[25:30])
    pre, dout = _f(4, 5), _f(4, 5)
    with pytest.raises(ValueError, match="dx"):               # dx must not be pre
        _C.act_backward(dout, pre, pre, "relu")
    with pytest.raises(ValueError, match="dx"):               # accumulating into dout itself
        _C.act_backward(dout, pre, dout, "relu", accumulate=True)
    d = _f(6)
    with pytest.raises(ValueError, match="dbias"):
        _C.bias_grad(d.reshape(1, 6), d)
