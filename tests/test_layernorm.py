"""Layer norm (csrc/layernorm.c via transformer._C and transformer.ops): the specification.

nn.LayerNorm semantics: biased variance, eps inside the square root, affine weight and bias.
Reference: the formula in numpy float64. Tolerance for float32 results against float64
references: |ours - ref| <= RTOL * |ref| + ATOL * scale of the tensor.
"""

import numpy as np
import pytest

from transformer import _C, ops

from conftest import ISA_LEVELS as LEVELS, num_threads

RTOL, ATOL = 1e-5, 1e-6          # forward and backward vs float64 references
FD_RTOL = 1e-5                   # float32 backward vs float64 central differences
D_SIZES = [1, 2, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 129]




def assert_close(actual, expected, rtol=RTOL, atol=ATOL, what="result"):
    """Relative to each element, with an absolute floor scaled by the tensor's magnitude."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape
    assert not np.isnan(actual).any(), f"{what}: NaN in result"
    if not expected.size:
        return
    err = np.abs(actual - expected)
    floor = atol * max(1.0, float(np.abs(expected).max()))
    assert (err <= rtol * np.abs(expected) + floor).all(), (
        f"{what}: max |diff| {err.max():.3e}, max relative {np.max(err / (np.abs(expected) + floor)):.3e}")


# ---------------------------------------------------------------------------
# float64 references (nn.LayerNorm's formula)

def layernorm_ref(x, w, b, eps=1e-5):
    x = x.astype(np.float64)
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)       # biased
    rstd = 1.0 / np.sqrt(var + np.float64(np.float32(eps)))
    return (x - mean) * rstd * w + b, mean[..., 0], rstd[..., 0]


def layernorm_backward_ref(dout, x, w, eps=1e-5):
    _, mean, rstd = layernorm_ref(x, w, np.zeros_like(w), eps)
    dy = dout.astype(np.float64)
    xhat = (x - mean[:, None]) * rstd[:, None]
    g = dy * w
    dx = rstd[:, None] * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    return dx, (dy * xhat).sum(0), dy.sum(0)


def make(rng, N, D, offset=0.0):
    x = (offset + 2 * rng.standard_normal((N, D))).astype(np.float32)
    w = rng.standard_normal(D).astype(np.float32)
    b = rng.standard_normal(D).astype(np.float32)
    return x, w, b


def forward(x, w, b, eps=1e-5):
    out = np.empty_like(x)
    mean = np.empty(x.shape[0], np.float32)
    rstd = np.empty(x.shape[0], np.float32)
    _C.layernorm_forward(x, w, b, out, mean, rstd, eps)
    return out, mean, rstd


def backward(dout, x, w, mean, rstd, dweight=None, dbias=None):
    D = x.shape[1]
    dx = np.empty_like(x)
    dweight = np.zeros(D, np.float32) if dweight is None else dweight
    dbias = np.zeros(D, np.float32) if dbias is None else dbias
    _C.layernorm_backward(dout, x, w, mean, rstd, dx, dweight, dbias, False)
    return dx, dweight, dbias


# ---------------------------------------------------------------------------
# forward

@pytest.mark.parametrize("D", D_SIZES)
@pytest.mark.parametrize("N", [1, 3, 33])
def test_forward_matches_reference(isa, N, D):
    rng = np.random.default_rng(N * 1000 + D)
    x, w, b = make(rng, N, D, offset=0.5)
    out, mean, rstd = forward(x, w, b)
    ref, ref_mean, ref_rstd = layernorm_ref(x, w, b)
    assert_close(out, ref, what="out")
    assert_close(mean, ref_mean, what="mean")
    assert_close(rstd, ref_rstd, what="rstd")


def test_variance_is_two_pass(isa):
    # A large common offset: E[x^2] - E[x]^2 in float32 would lose every digit of the variance.
    rng = np.random.default_rng(1)
    x, w, b = make(rng, 8, 300, offset=3000.0)
    out, mean, rstd = forward(x, w, b)
    ref, _, ref_rstd = layernorm_ref(x, w, b)
    assert_close(rstd, ref_rstd, what="rstd")
    assert_close(out, ref, rtol=1e-4, atol=1e-4, what="out")


def test_constant_row_gives_bias(isa):
    x = np.full((2, 37), 5.0, dtype=np.float32)
    w = np.arange(37, dtype=np.float32)
    b = np.linspace(-1, 1, 37).astype(np.float32)
    out, mean, rstd = forward(x, w, b, eps=1e-5)
    assert np.array_equal(out, np.broadcast_to(b, x.shape))
    assert (mean == 5).all() and np.allclose(rstd, 1 / np.sqrt(np.float32(1e-5)), rtol=1e-6)


def test_eps_is_used(isa):
    rng = np.random.default_rng(2)
    x, w, b = make(rng, 4, 20)
    x *= 1e-3
    for eps in (0.0, 1e-5, 1e-2):
        out, _, rstd = forward(x, w, b, eps)
        ref, _, ref_rstd = layernorm_ref(x, w, b, eps)
        assert_close(rstd, ref_rstd, what=f"rstd at eps={eps}")


def test_forward_in_place(isa):
    rng = np.random.default_rng(3)
    x, w, b = make(rng, 5, 33)
    expected, mean, rstd = forward(x, w, b)
    m2, r2 = np.empty_like(mean), np.empty_like(rstd)
    _C.layernorm_forward(x, w, b, x, m2, r2, 1e-5)
    assert np.array_equal(x, expected) and np.array_equal(m2, mean) and np.array_equal(r2, rstd)


def test_empty_batch():
    w = np.ones(8, np.float32)
    x = np.zeros((0, 8), np.float32)
    out, mean, rstd = forward(x, w, w)
    dw, db = np.ones(8, np.float32), np.ones(8, np.float32)
    dx, dw, db = backward(x, x, w, mean, rstd, dw, db)
    assert out.shape == (0, 8) and dx.shape == (0, 8)
    assert (dw == 1).all() and (db == 1).all()


# ---------------------------------------------------------------------------
# backward

@pytest.mark.parametrize("D", D_SIZES)
@pytest.mark.parametrize("N", [1, 5, 70])
def test_backward_matches_reference(isa, N, D):
    rng = np.random.default_rng(N * 1000 + D + 7)
    x, w, b = make(rng, N, D, offset=-0.3)
    _, mean, rstd = forward(x, w, b)
    dout = rng.standard_normal((N, D)).astype(np.float32)
    dx, dw, db = backward(dout, x, w, mean, rstd)
    ref_dx, ref_dw, ref_db = layernorm_backward_ref(dout, x, w)
    # dx cancels (g - mean(g) - ...): bound relative to the size of g * rstd in the row
    floor = RTOL * np.abs(dout * w).max() * rstd.max()
    assert np.abs(dx - ref_dx).max() <= floor + RTOL * np.abs(ref_dx).max(), np.abs(dx - ref_dx).max()
    assert_close(dw, ref_dw, atol=RTOL * np.abs(dout).max(), what="dweight")
    assert_close(db, ref_db, atol=RTOL * np.abs(dout).max(), what="dbias")


@pytest.mark.parametrize("D", [1, 6, 17, 64])
def test_backward_matches_finite_differences(isa, D):
    # d/dt of L = sum(c * layernorm(x + t vx, w + t vw, b + t vb)) by float64 central differences
    # equals <dx, vx> + <dweight, vw> + <dbias, vb> from the float32 kernel.
    rng = np.random.default_rng(400 + D)
    N = 9
    x, w, b = make(rng, N, D)
    c = rng.standard_normal((N, D)).astype(np.float32)
    _, mean, rstd = forward(x, w, b)
    dx, dw, db = backward(c, x, w, mean, rstd)
    for _ in range(3):
        vx, vw, vb = rng.standard_normal((N, D)), rng.standard_normal(D), rng.standard_normal(D)
        h = 1e-6

        def loss(t):
            return float((c * layernorm_ref(x + t * vx, w + t * vw, b + t * vb)[0]).sum())

        fd = (loss(h) - loss(-h)) / (2 * h)
        terms = np.concatenate([(dx * vx).ravel(), dw * vw, db * vb]).astype(np.float64)
        analytic = float(terms.sum())
        assert abs(fd - analytic) <= FD_RTOL * np.abs(terms).sum() + 1e-6, (fd, analytic)


def test_backward_accumulates(isa):
    rng = np.random.default_rng(5)
    x, w, b = make(rng, 40, 33)
    _, mean, rstd = forward(x, w, b)
    dout = rng.standard_normal(x.shape).astype(np.float32)
    dx0, dw0, db0 = backward(dout, x, w, mean, rstd)
    dx = rng.standard_normal(x.shape).astype(np.float32)
    dw = rng.standard_normal(33).astype(np.float32)
    db = rng.standard_normal(33).astype(np.float32)
    start = (dx.copy(), dw.copy(), db.copy())
    _C.layernorm_backward(dout, x, w, mean, rstd, dx, dw, db, True)
    assert_close(dx, start[0].astype(np.float64) + dx0, rtol=1e-6, atol=1e-6, what="dx +=")
    assert_close(dw, start[1].astype(np.float64) + dw0, rtol=1e-6, atol=1e-6, what="dweight +=")
    assert_close(db, start[2].astype(np.float64) + db0, rtol=1e-6, atol=1e-6, what="dbias +=")
    # without accumulate, dx is overwritten but dweight/dbias still add
    dw2, db2 = dw.copy(), db.copy()
    _C.layernorm_backward(dout, x, w, mean, rstd, dx, dw2, db2, False)
    assert np.array_equal(dx, dx0)
    assert_close(dw2, dw.astype(np.float64) + dw0, rtol=1e-6, atol=1e-6, what="dweight +=")


def test_backward_in_place(isa):
    rng = np.random.default_rng(6)
    x, w, b = make(rng, 7, 65)
    _, mean, rstd = forward(x, w, b)
    dout = rng.standard_normal(x.shape).astype(np.float32)
    expected = backward(dout, x, w, mean, rstd)
    dw, db = np.zeros(65, np.float32), np.zeros(65, np.float32)
    _C.layernorm_backward(dout, x, w, mean, rstd, dout, dw, db, False)
    assert np.array_equal(dout, expected[0])
    assert np.array_equal(dw, expected[1]) and np.array_equal(db, expected[2])


@pytest.mark.parametrize("N, D", [(301, 130), (1001, 64), (257, 512), (4099, 8)])
def test_same_bits_on_one_and_two_threads(isa, N, D):
    rng = np.random.default_rng(7)
    x, w, b = make(rng, N, D)
    dout = rng.standard_normal(x.shape).astype(np.float32)
    results = []
    for n in (1, 2):
        with num_threads(n):
            out, mean, rstd = forward(x, w, b)
            results.append((out, mean, rstd) + backward(dout, x, w, mean, rstd))
    for a, b_ in zip(*results):
        assert np.array_equal(a.view(np.int32), b_.view(np.int32))


def test_isa_levels_agree():
    rng = np.random.default_rng(8)
    x, w, b = make(rng, 50, 77)
    dout = rng.standard_normal(x.shape).astype(np.float32)
    results = []
    for level in LEVELS:
        _C.set_isa(level)
        out, mean, rstd = forward(x, w, b)
        results.append((out, mean, rstd) + backward(dout, x, w, mean, rstd))
    _C.set_isa(_C.best_isa())
    for other in results[1:]:
        for a, b_ in zip(results[0], other):
            assert_close(b_, a, rtol=1e-5, atol=1e-6, what="ISA levels")


# ---------------------------------------------------------------------------
# PyTorch defines "correct"

@pytest.mark.parametrize("N, D", [(64, 128), (13, 33)])
def test_forward_and_backward_match_torch(N, D):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    x, w, b = make(rng, N, D, offset=1.0)
    dout = rng.standard_normal(x.shape).astype(np.float32)
    xt, wt, bt = (torch.from_numpy(a.copy()).requires_grad_() for a in (x, w, b))
    y = torch.nn.functional.layer_norm(xt, (D,), wt, bt, 1e-5)
    y.backward(torch.from_numpy(dout))
    out, mean, rstd = forward(x, w, b)
    assert_close(out, y.detach().numpy(), what="out vs torch")
    dx, dw, db = backward(dout, x, w, mean, rstd)
    assert_close(dx, xt.grad.numpy(), rtol=1e-4, atol=1e-5, what="dx vs torch")
    assert_close(dw, wt.grad.numpy(), rtol=1e-4, atol=1e-5, what="dweight vs torch")
    assert_close(db, bt.grad.numpy(), rtol=1e-4, atol=1e-5, what="dbias vs torch")


# ---------------------------------------------------------------------------
# the numpy-facing wrapper

def test_ops_layer_norm_any_leading_shape_and_layout():
    rng = np.random.default_rng(10)
    x = rng.standard_normal((3, 17, 4)).astype(np.float32).transpose(0, 2, 1)   # [3, 4, 17]
    w = rng.standard_normal(17).astype(np.float32)
    b = rng.standard_normal(17).astype(np.float32)
    out = ops.layer_norm(x, w, b)
    assert out.shape == (3, 4, 17)
    assert_close(out, layernorm_ref(np.ascontiguousarray(x).reshape(-1, 17), w, b)[0].reshape(3, 4, 17))
    assert_close(ops.layer_norm(x[0, 0], w, b), layernorm_ref(x[0, :1], w, b)[0][0])
    assert ops.layer_norm(np.zeros((0, 17), np.float32), w, b).shape == (0, 17)


def test_ops_layer_norm_rejects_bad_input():
    x = np.zeros((4, 8), np.float32)
    w = np.ones(8, np.float32)
    with pytest.raises(TypeError, match="x"):
        ops.layer_norm(x.astype(np.float64), w, w)
    with pytest.raises(ValueError, match="weight"):
        ops.layer_norm(x, w[:7], w)
    with pytest.raises(ValueError, match="bias"):
        ops.layer_norm(x, w, np.ones((1, 8), np.float32))
    with pytest.raises(ValueError, match="eps"):
        ops.layer_norm(x, w, w, eps=-1.0)


# ---------------------------------------------------------------------------
# the strict door refuses, naming the argument

def read_only(a):
    a = a.copy()
    a.flags.writeable = False
    return a


def test_forward_rejects_bad_input():
    x = np.zeros((4, 8), np.float32)
    w, b = np.ones(8, np.float32), np.zeros(8, np.float32)
    out, m, r = np.empty_like(x), np.empty(4, np.float32), np.empty(4, np.float32)
    f = _C.layernorm_forward
    cases = [
        (TypeError, "x", lambda: f(x.astype(np.float64), w, b, out, m, r)),
        (TypeError, "x", lambda: f(x.astype(np.float16), w, b, out, m, r)),
        (TypeError, "x", lambda: f(x.astype(np.int32), w, b, out, m, r)),
        (TypeError, "x", lambda: f(x.astype(object), w, b, out, m, r)),
        (ValueError, "x", lambda: f(x[None], w, b, out, m, r)),
        (ValueError, "x", lambda: f(np.zeros((4, 16), np.float32)[:, ::2], w, b, out, m, r)),
        (ValueError, "x", lambda: f(np.zeros((4, 0), np.float32), w[:0], b[:0], out[:, :0], m, r)),
        (TypeError, "weight", lambda: f(x, w.astype(np.float64), b, out, m, r)),
        (ValueError, "weight", lambda: f(x, w[:7], b, out, m, r)),
        (ValueError, "weight", lambda: f(x, w[None], b, out, m, r)),
        (TypeError, "bias", lambda: f(x, w, b.astype(np.int64), out, m, r)),
        (ValueError, "bias", lambda: f(x, w, np.zeros(16, np.float32)[::2], out, m, r)),
        (ValueError, "out", lambda: f(x, w, b, out[:3], m, r)),
        (ValueError, "out", lambda: f(x, w, b, read_only(out), m, r)),
        (ValueError, "out", lambda: f(x, w, b, np.empty((8, 4), np.float32).T, m, r)),
        (ValueError, "mean", lambda: f(x, w, b, out, m[:3], r)),
        (ValueError, "mean", lambda: f(x, w, b, out, read_only(m), r)),
        (TypeError, "rstd", lambda: f(x, w, b, out, m, r.astype(np.float64))),
        (ValueError, "rstd", lambda: f(x, w, b, out, m, m)),
        (ValueError, "eps", lambda: f(x, w, b, out, m, r, -1e-5)),
        (ValueError, "eps", lambda: f(x, w, b, out, m, r, float("nan"))),
        (TypeError, "eps", lambda: f(x, w, b, out, m, r, "1e-5")),
        (ValueError, "mean", lambda: f(x, w, b, out, out.reshape(-1)[:4], r)),
        (ValueError, "out", lambda: f(x, out.reshape(-1)[:8], b, out, m, r)),
        (ValueError, "out", lambda: f(x, w, b, np.broadcast_to(w, (4, 8)), m, r)),
    ]
    for exc, name, call in cases:
        with pytest.raises(exc, match=name):
            call()


def test_forward_rejects_partial_overlap():
    buf = np.zeros(33, np.float32)
    w = np.ones(8, np.float32)
    with pytest.raises(ValueError, match="out"):
        _C.layernorm_forward(buf[:32].reshape(4, 8), w, w, buf[1:].reshape(4, 8),
                             np.empty(4, np.float32), np.empty(4, np.float32))


def test_backward_rejects_bad_input():
    N, D = 4, 8
    dy, x = np.zeros((N, D), np.float32), np.zeros((N, D), np.float32)
    w, m, r = np.ones(D, np.float32), np.zeros(N, np.float32), np.ones(N, np.float32)
    dx, dw, db = np.zeros((N, D), np.float32), np.zeros(D, np.float32), np.zeros(D, np.float32)
    f = _C.layernorm_backward
    cases = [
        (TypeError, "dout", lambda: f(dy.astype(np.float64), x, w, m, r, dx, dw, db)),
        (ValueError, "dout", lambda: f(dy[0], x, w, m, r, dx, dw, db)),
        (ValueError, "x", lambda: f(dy, x[:3], w, m, r, dx, dw, db)),
        (TypeError, "x", lambda: f(dy, x.astype(np.int32), w, m, r, dx, dw, db)),
        (ValueError, "weight", lambda: f(dy, x, w[:3], m, r, dx, dw, db)),
        (ValueError, "mean", lambda: f(dy, x, w, m[:3], r, dx, dw, db)),
        (TypeError, "rstd", lambda: f(dy, x, w, m, r.astype(np.float16), dx, dw, db)),
        (ValueError, "dx", lambda: f(dy, x, w, m, r, read_only(dx), dw, db)),
        (ValueError, "dx", lambda: f(dy, x, w, m, r, dx[:, :4], dw, db)),
        (ValueError, "dx", lambda: f(dy, x, w, m, r, np.zeros((D, N), np.float32).T, dw, db)),
        (ValueError, "dweight", lambda: f(dy, x, w, m, r, dx, read_only(dw), db)),
        (ValueError, "dweight", lambda: f(dy, x, w, m, r, dx, dw[:2], db)),
        (ValueError, "dbias", lambda: f(dy, x, w, m, r, dx, dw, np.zeros(16, np.float32)[::2])),
        (ValueError, "dbias", lambda: f(dy, x, w, m, r, dx, dw, dw)),
        (ValueError, "dx", lambda: f(dy, x, w, m, r, dy, dw, db, True)),   # dx is dout: only without accumulate
        (ValueError, "dx", lambda: f(dy, x, w, m, r, x, dw, db)),
        (ValueError, "dweight", lambda: f(dy, x, w, m, r, dx, w, db)),
    ]
    for exc, name, call in cases:
        with pytest.raises(exc, match=name):
            call()
