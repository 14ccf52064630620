"""Masked softmax (csrc/softmax.c via transformer._C and transformer.ops): the specification.

Reference: a two-pass softmax in numpy float64 with the same masks. Tolerance for every float32
result against a float64 reference: |ours - ref| <= RTOL * |ref| + ATOL.
"""

import numpy as np
import pytest

from transformer import _C, ops

from conftest import ISA_LEVELS as LEVELS, num_threads

RTOL, ATOL = 1e-5, 1e-8          # forward and backward vs float64 references
FD_RTOL = 1e-4                   # float32 backward vs float64 central differences
TK_SIZES = [1, 2, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 97, 128, 129, 200]




def assert_close(actual, expected, rtol=RTOL, atol=ATOL, what="result"):
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape
    assert not np.isnan(actual).any(), f"{what}: NaN in result"
    err = np.abs(actual - expected)
    bound = rtol * np.abs(expected) + atol
    worst = float(np.max(err - bound)) if err.size else 0.0
    assert worst <= 0, (f"{what}: max |diff| {err.max():.3e}, max relative "
                        f"{np.max(err / (np.abs(expected) + atol)):.3e} (rtol {rtol}, atol {atol})")


# ---------------------------------------------------------------------------
# float64 references

def visible(shape, causal, mask, q_offset):
    """Boolean [B, H, Tq, Tk] (or [B, Tq, Tk]): True where key k is visible to query q."""
    B, Tq, Tk = shape[0], shape[-2], shape[-1]
    vis = np.ones((B, Tq, Tk), dtype=bool)
    if causal:
        q = np.arange(Tq)[:, None] + q_offset
        vis &= (np.arange(Tk)[None, :] <= q)[None]
    if mask is not None:
        vis &= ~np.asarray(mask, dtype=bool)[:, None, :]
    if len(shape) == 4:
        vis = np.broadcast_to(vis[:, None], shape)
    return vis


def softmax_ref(scores, scale=1.0, causal=False, mask=None, q_offset=0):
    """Two passes in float64: max over visible keys, then exp / sum; all-masked rows are zeros."""
    vis = visible(scores.shape, causal, mask, q_offset)
    s = np.float64(np.float32(scale)) * scores.astype(np.float64)
    s = np.where(vis, s, -np.inf)
    mx = s.max(axis=-1, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    e = np.where(vis, np.exp(s - mx), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    return np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)


def softmax_backward_ref(probs, dprobs, scale=1.0):
    p, dp = probs.astype(np.float64), dprobs.astype(np.float64)
    return np.float64(np.float32(scale)) * p * (dp - (p * dp).sum(axis=-1, keepdims=True))


def forward(scores, scale=1.0, causal=False, mask=None, q_offset=0):
    probs = np.empty_like(scores)
    _C.softmax_forward(scores, probs, scale, causal, mask, q_offset)
    return probs


def backward(probs, dprobs, scale=1.0):
    dscores = np.empty_like(probs)
    _C.softmax_backward(probs, dprobs, dscores, scale)
    return dscores


def random_mask(rng, B, Tk, fully_padded_row=None):
    """Varied numbers of padded keys per batch entry (0 .. Tk - 1), optionally one row all padded."""
    mask = np.zeros((B, Tk), dtype=bool)
    for b in range(B):
        count = int(rng.integers(0, Tk)) if Tk > 1 else 0
        mask[b, rng.permutation(Tk)[:count]] = True
    if fully_padded_row is not None:
        mask[fully_padded_row] = True
    return mask


# ---------------------------------------------------------------------------
# forward

@pytest.mark.parametrize("Tk", TK_SIZES)
def test_forward_matches_reference_at_awkward_widths(isa, Tk):
    rng = np.random.default_rng(Tk)
    scores = (3 * rng.standard_normal((2, 3, 5, Tk))).astype(np.float32)
    assert_close(forward(scores, 0.7), softmax_ref(scores, 0.7))


@pytest.mark.parametrize("Tk", TK_SIZES)
def test_causal_with_padding_mask_matches_reference(isa, Tk):
    rng = np.random.default_rng(100 + Tk)
    B, Tq = 3, 6
    scores = (3 * rng.standard_normal((B, 2, Tq, Tk))).astype(np.float32)
    mask = random_mask(rng, B, Tk, fully_padded_row=1)
    probs = forward(scores, 0.125, True, mask, 0)
    ref = softmax_ref(scores, 0.125, True, mask, 0)
    assert_close(probs, ref)
    hidden = ~visible(scores.shape, True, mask, 0)
    assert (probs[hidden] == 0).all(), "masked keys must get exactly 0"


def test_rows_sum_to_one_and_masked_rows_are_zero(isa):
    rng = np.random.default_rng(1)
    B, Tq, Tk = 4, 9, 33
    scores = rng.standard_normal((B, Tq, Tk)).astype(np.float32)
    mask = random_mask(rng, B, Tk, fully_padded_row=2)
    probs = forward(scores, 1.0, False, mask)
    sums = probs.sum(axis=-1, dtype=np.float64)
    assert np.abs(sums[[0, 1, 3]] - 1).max() < 1e-5
    assert (probs[2] == 0).all() and not np.isnan(probs).any()


def test_causal_and_padding_can_hide_every_key_of_a_row(isa):
    # Padding the first keys hides everything from the first queries under the causal mask.
    rng = np.random.default_rng(2)
    B, H, T = 2, 2, 17
    scores = rng.standard_normal((B, H, T, T)).astype(np.float32)
    mask = np.zeros((B, T), dtype=bool)
    mask[0, :5] = True
    probs = forward(scores, 1.0, True, mask)
    assert not np.isnan(probs).any()
    assert (probs[0, :, :5] == 0).all()
    assert_close(probs, softmax_ref(scores, 1.0, True, mask))


@pytest.mark.parametrize("Tq, Tk, q_offset", [(1, 10, 9), (3, 10, 4), (4, 9, 0), (5, 3, 0),
                                              (2, 33, 31), (2, 7, 100), (16, 17, 1)])
def test_causal_with_query_offset(isa, Tq, Tk, q_offset):
    rng = np.random.default_rng(Tq * 100 + Tk)
    scores = rng.standard_normal((2, 2, Tq, Tk)).astype(np.float32)
    mask = random_mask(rng, 2, Tk)
    mask[:, 0] = False
    for m in (None, mask):
        probs = forward(scores, 0.5, True, m, q_offset)
        assert_close(probs, softmax_ref(scores, 0.5, True, m, q_offset))


def test_in_place_forward(isa):
    rng = np.random.default_rng(3)
    scores = rng.standard_normal((2, 3, 7, 65)).astype(np.float32)
    mask = random_mask(rng, 2, 65, fully_padded_row=0)
    expected = forward(scores, 0.3, True, mask)
    _C.softmax_forward(scores, scores, 0.3, True, mask, 0)
    assert np.array_equal(scores, expected)


def test_uint8_mask_same_as_bool(isa):
    rng = np.random.default_rng(4)
    scores = rng.standard_normal((3, 5, 31)).astype(np.float32)
    mask = random_mask(rng, 3, 31)
    assert np.array_equal(forward(scores, 1.0, False, mask),
                          forward(scores, 1.0, False, mask.astype(np.uint8)))


def test_extreme_scores_do_not_overflow(isa):
    scores = np.array([[[1e4, -1e4, 0.0, 80.0, -3e38, 3e38]]], dtype=np.float32)
    probs = forward(scores, 1.0)
    assert_close(probs, softmax_ref(scores, 1.0))
    scores = np.full((1, 2, 20), -1e30, dtype=np.float32)
    assert_close(forward(scores, 1.0), np.full(scores.shape, 0.05))


def test_minus_infinity_scores_act_as_masked(isa):
    scores = np.zeros((1, 2, 5), dtype=np.float32)
    scores[0, 0, 1:] = -np.inf
    scores[0, 1, :] = -np.inf
    probs = forward(scores, 1.0)
    assert np.array_equal(probs[0, 0], [1, 0, 0, 0, 0]) and (probs[0, 1] == 0).all()


@pytest.mark.parametrize("Tk", [7, 32, 65, 200])
def test_hidden_scores_never_reach_the_result(isa, Tk):
    # NaN or inf at hidden positions (causal or padding) must not leak into any probability.
    rng = np.random.default_rng(20 + Tk)
    scores = rng.standard_normal((2, 2, 6, Tk)).astype(np.float32)
    mask = random_mask(rng, 2, Tk, fully_padded_row=1)
    expected = forward(scores, 0.5, True, mask, 1)
    hidden = ~visible(scores.shape, True, mask, 1)
    poisoned = scores.copy()
    poisoned[hidden] = np.where(rng.random(int(hidden.sum())) < 0.5, np.nan, np.inf)
    assert np.array_equal(forward(poisoned, 0.5, True, mask, 1), expected)


@pytest.mark.parametrize("shape", [(0, 2, 3, 4), (2, 0, 3, 4), (2, 3, 0, 4), (2, 3, 4, 0), (0, 3, 4)])
def test_empty_shapes(shape):
    scores = np.ones(shape, dtype=np.float32)
    mask = np.zeros((shape[0], shape[-1]), dtype=bool)
    assert forward(scores, 1.0, True, mask).shape == shape
    assert backward(scores, scores.copy()).shape == shape


@pytest.mark.parametrize("op", ["forward", "backward"])
@pytest.mark.parametrize("Tk", [32, 65, 200])
def test_same_bits_on_one_and_two_threads(isa, op, Tk):
    # An odd number of rows, and enough work for two threads: the halves start mid-group.
    rng = np.random.default_rng(5)
    B, H, Tq = 3, 5, 1 + 40000 // (15 * Tk) * 2
    shape = (B, H, Tq, Tk)
    scores = rng.standard_normal(shape).astype(np.float32)
    mask = random_mask(rng, B, Tk, fully_padded_row=2)
    dprobs = rng.standard_normal(shape).astype(np.float32)
    results = []
    for n in (1, 2):
        with num_threads(n):
            probs = forward(scores, 0.125, True, mask)
            results.append(probs if op == "forward" else backward(probs, dprobs, 0.125))
    assert np.array_equal(results[0].view(np.int32), results[1].view(np.int32))


def test_isa_levels_agree():
    rng = np.random.default_rng(6)
    scores = (4 * rng.standard_normal((3, 2, 11, 67))).astype(np.float32)
    mask = random_mask(rng, 3, 67)
    outs = []
    for level in LEVELS:
        _C.set_isa(level)
        outs.append(forward(scores, 0.5, True, mask))
    _C.set_isa(_C.best_isa())
    for o in outs[1:]:
        assert_close(o, outs[0], rtol=4e-7, atol=1e-9, what="ISA levels")


# ---------------------------------------------------------------------------
# backward

@pytest.mark.parametrize("Tk", TK_SIZES)
def test_backward_matches_reference(isa, Tk):
    rng = np.random.default_rng(200 + Tk)
    scores = rng.standard_normal((2, 2, 4, Tk)).astype(np.float32)
    mask = random_mask(rng, 2, Tk)
    probs = forward(scores, 0.5, True, mask)
    dprobs = rng.standard_normal(probs.shape).astype(np.float32)
    ds = backward(probs, dprobs, 0.5)
    # absolute floor: the row dot product cancels, scale the bound by the row's magnitude
    floor = RTOL * np.abs(probs).astype(np.float64) * np.abs(dprobs).sum(-1, keepdims=True)
    err = np.abs(ds - softmax_backward_ref(probs, dprobs, 0.5))
    assert (err <= RTOL * np.abs(softmax_backward_ref(probs, dprobs, 0.5)) + floor + ATOL).all(), \
        f"max |diff| {err.max():.3e}"
    hidden = ~visible(probs.shape, True, mask, 0)
    assert (ds[hidden] == 0).all()


@pytest.mark.parametrize("Tk", [5, 16, 33])
def test_backward_matches_finite_differences(isa, Tk):
    # d/dt of L(s + t v) with L = sum(w * softmax(scale * s + masks)), float64 central differences,
    # equals <dscores, v> where dscores = softmax_backward(probs, w).
    rng = np.random.default_rng(300 + Tk)
    shape = (2, 3, 4, Tk)
    scores = rng.standard_normal(shape).astype(np.float32)
    mask = random_mask(rng, 2, Tk)
    w = rng.standard_normal(shape).astype(np.float32)
    ds = backward(forward(scores, 0.7, True, mask), w, 0.7).astype(np.float64)
    for _ in range(3):
        v = rng.standard_normal(shape)
        h = 1e-5

        def loss(t):
            return float((w * softmax_ref(scores + t * v, 0.7, True, mask)).sum())

        fd = (loss(h) - loss(-h)) / (2 * h)
        analytic = float((ds * v).sum())
        assert abs(fd - analytic) <= FD_RTOL * (abs(fd) + np.abs(ds * v).sum()), (fd, analytic)


def test_backward_in_place(isa):
    rng = np.random.default_rng(7)
    probs = forward(rng.standard_normal((2, 3, 6, 33)).astype(np.float32))
    dprobs = rng.standard_normal(probs.shape).astype(np.float32)
    expected = backward(probs, dprobs, 0.25)
    _C.softmax_backward(probs, dprobs, dprobs, 0.25)
    assert np.array_equal(dprobs, expected)


def test_backward_accepts_any_rank():
    rng = np.random.default_rng(8)
    probs = forward(rng.standard_normal((1, 5, 9)).astype(np.float32))[0]
    dprobs = rng.standard_normal(probs.shape).astype(np.float32)
    assert_close(backward(probs, dprobs), softmax_backward_ref(probs, dprobs), atol=1e-7)


# ---------------------------------------------------------------------------
# PyTorch defines "correct"

def test_forward_and_backward_match_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    B, H, T = 3, 4, 19
    scale = 0.125
    scores = (4 * rng.standard_normal((B, H, T, T))).astype(np.float32)
    mask = random_mask(rng, B, T)
    mask[:, 0] = False                       # torch gives NaN for fully masked rows
    dprobs = rng.standard_normal(scores.shape).astype(np.float32)

    s = torch.from_numpy(scores).requires_grad_()
    hide = torch.ones(T, T, dtype=torch.bool).triu(1) | torch.from_numpy(mask)[:, None, None, :]
    p = (s * scale).masked_fill(hide, float("-inf")).softmax(-1)
    p.backward(torch.from_numpy(dprobs))

    probs = forward(scores, scale, True, mask)
    assert_close(probs, p.detach().numpy().astype(np.float64), rtol=2e-6, atol=1e-7, what="probs")
    ds = backward(probs, dprobs, scale)
    assert_close(ds, s.grad.numpy().astype(np.float64), rtol=1e-4, atol=1e-6, what="dscores")


# ---------------------------------------------------------------------------
# the vectorised exp

def test_exp_within_one_ulp_of_correctly_rounded(isa):
    # Normal results within 1 ulp. Below FLT_MIN: AVX-512 and expf within one denormal step;
    # the AVX2 exp flushes x < -87 to 0 (a denormal multiply is slow; see csrc/simd_math.h).
    rng = np.random.default_rng(10)
    x = np.concatenate([rng.uniform(-104, 89, 200_000), rng.uniform(-1, 1, 50_000),
                        np.linspace(-87.33, 88.72, 10_001)]).astype(np.float32)
    out = np.empty_like(x)
    _C.exp_f32(x, out)
    with np.errstate(over="ignore"):
        ref = np.exp(x.astype(np.float64)).astype(np.float32)
    ulps = np.abs(out.view(np.int32).astype(np.int64) - ref.view(np.int32).astype(np.int64))
    flushed = (x < -87) if isa in ("avx2", "neon") else np.zeros(x.shape, bool)
    normal = (ref >= np.finfo(np.float32).tiny) & np.isfinite(ref) & ~flushed
    assert ulps[normal].max() <= 1, f"max ulp error {ulps[normal].max()} at x={x[normal][ulps[normal].argmax()]}"
    assert ulps[~normal & ~flushed].max() <= 1
    assert (out[flushed] == 0).all()


def test_exp_special_values(isa):
    x = np.array([np.inf, -np.inf, np.nan, 88.73, 100, -104, -200, 0, -0.0], dtype=np.float32)
    out = np.empty_like(x)
    _C.exp_f32(x, out)
    assert out[0] == np.inf and out[1] == 0 and np.isnan(out[2]) and out[3] == np.inf
    assert out[4] == np.inf and out[5] == 0 and out[6] == 0 and out[7] == 1 and out[8] == 1


# ---------------------------------------------------------------------------
# the numpy-facing wrapper

def test_ops_softmax_converts_non_contiguous_input():
    rng = np.random.default_rng(11)
    base = rng.standard_normal((2, 9, 4, 7)).astype(np.float32)
    scores = base.transpose(0, 2, 1, 3)          # [2, 4, 9, 7], not contiguous
    mask = random_mask(rng, 2, 7)
    probs = ops.softmax(scores, scale=0.5, causal=True, key_padding_mask=mask)
    assert_close(probs, softmax_ref(np.ascontiguousarray(scores), 0.5, True, mask))
    assert_close(ops.softmax(scores[:, 0]), softmax_ref(np.ascontiguousarray(scores[:, 0])))


def test_ops_softmax_rejects_bad_input():
    scores = np.zeros((2, 3, 4), dtype=np.float32)
    with pytest.raises(TypeError, match="scores"):
        ops.softmax(scores.astype(np.float64))
    with pytest.raises(ValueError, match="scores"):
        ops.softmax(scores[0])
    with pytest.raises(ValueError, match="key_padding_mask"):
        ops.softmax(scores, key_padding_mask=np.zeros((2, 3), dtype=bool))
    with pytest.raises(TypeError, match="key_padding_mask"):
        ops.softmax(scores, key_padding_mask=np.zeros((2, 4), dtype=np.int64))
    with pytest.raises(ValueError, match="scale"):
        ops.softmax(scores, scale=float("nan"))


# ---------------------------------------------------------------------------
# the strict door refuses, naming the argument

def test_forward_rejects_bad_input():
    s = np.zeros((2, 3, 4, 5), dtype=np.float32)
    p = np.empty_like(s)
    m = np.zeros((2, 5), dtype=bool)
    cases = [
        (TypeError, "scores", lambda: _C.softmax_forward(s.astype(np.float64), p)),
        (TypeError, "scores", lambda: _C.softmax_forward(s.astype(np.float16), p)),
        (TypeError, "scores", lambda: _C.softmax_forward(s.astype(np.int32), p)),
        (TypeError, "scores", lambda: _C.softmax_forward(s.astype(">f4"), p)),   # byte-swapped
        (TypeError, "scores", lambda: _C.softmax_forward(s.astype(object), p)),
        (TypeError, "scores", lambda: _C.softmax_forward(s.tolist(), p)),
        (ValueError, "scores", lambda: _C.softmax_forward(s[0, 0], p[0, 0])),
        (ValueError, "scores", lambda: _C.softmax_forward(s[None], p[None])),
        (ValueError, "scores", lambda: _C.softmax_forward(s[..., ::2], p[..., :3])),
        (TypeError, "probs", lambda: _C.softmax_forward(s, p.astype(np.float64))),
        (ValueError, "probs", lambda: _C.softmax_forward(s, p[..., :4])),
        (ValueError, "probs", lambda: _C.softmax_forward(s, np.empty((2, 3, 5, 4), np.float32))),
        (ValueError, "probs", lambda: _C.softmax_forward(s, np.zeros((2, 3, 4, 10), np.float32)[..., ::2])),
        (ValueError, "probs", lambda: _C.softmax_forward(s, read_only(p))),
        (TypeError, "key_padding_mask", lambda: _C.softmax_forward(s, p, 1.0, False, m.astype(np.int32))),
        (TypeError, "key_padding_mask", lambda: _C.softmax_forward(s, p, 1.0, False, m.astype(np.float32))),
        (TypeError, "key_padding_mask", lambda: _C.softmax_forward(s, p, 1.0, False, m.tolist())),
        (ValueError, "key_padding_mask", lambda: _C.softmax_forward(s, p, 1.0, False, m[:, :4])),
        (ValueError, "key_padding_mask", lambda: _C.softmax_forward(s, p, 1.0, False, m[:1])),
        (ValueError, "key_padding_mask", lambda: _C.softmax_forward(s, p, 1.0, False, m[0])),
        (ValueError, "key_padding_mask", lambda: _C.softmax_forward(s, p, 1.0, False, np.zeros((2, 10), bool)[:, ::2])),
        (ValueError, "q_offset", lambda: _C.softmax_forward(s, p, 1.0, True, None, -1)),
        (TypeError, "q_offset", lambda: _C.softmax_forward(s, p, 1.0, True, None, 1.5)),
        (ValueError, "scale", lambda: _C.softmax_forward(s, p, float("inf"))),
        (ValueError, "scale", lambda: _C.softmax_forward(s, p, 1e39)),
        (TypeError, "scale", lambda: _C.softmax_forward(s, p, "1")),
    ]
    for exc, name, call in cases:
        with pytest.raises(exc, match=name):
            call()


def test_forward_rejects_partial_overlap():
    buf = np.zeros(2 * 3 * 4 * 5 + 1, dtype=np.float32)
    scores, probs = buf[:-1].reshape(2, 3, 4, 5), buf[1:].reshape(2, 3, 4, 5)
    with pytest.raises(ValueError, match="probs"):
        _C.softmax_forward(scores, probs)


def test_backward_rejects_bad_input():
    p = np.zeros((2, 3, 4), dtype=np.float32)
    dp = np.zeros_like(p)
    ds = np.zeros_like(p)
    cases = [
        (TypeError, "probs", lambda: _C.softmax_backward(p.astype(np.float64), dp, ds)),
        (TypeError, "dprobs", lambda: _C.softmax_backward(p, dp.astype(np.float16), ds)),
        (TypeError, "dscores", lambda: _C.softmax_backward(p, dp, ds.astype(np.int64))),
        (ValueError, "dprobs", lambda: _C.softmax_backward(p, dp[:1], ds)),
        (ValueError, "dscores", lambda: _C.softmax_backward(p, dp, ds[:, :2])),
        (ValueError, "probs", lambda: _C.softmax_backward(np.zeros((2, 3, 8), np.float32)[..., ::2], dp, ds)),
        (ValueError, "dscores", lambda: _C.softmax_backward(p, dp, read_only(ds))),
        (ValueError, "dscores", lambda: _C.softmax_backward(p, dp, p)),
        (ValueError, "scale", lambda: _C.softmax_backward(p, dp, ds, float("nan"))),
        (ValueError, "probs", lambda: _C.softmax_backward(np.ones((), np.float32), np.ones((), np.float32), np.ones((), np.float32))),
    ]
    for exc, name, call in cases:
        with pytest.raises(exc, match=name):
            call()


def read_only(a):
    a = a.copy()
    a.flags.writeable = False
    return a
