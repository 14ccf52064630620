"""Dropout with a counter-based RNG (transformer._C.dropout_forward / dropout_backward / dropout_mask).

Specification: element i of a call is kept iff uniform(seed, offset + i) >= p, kept values are
exactly x * float32(1 / (1 - p)), dropped ones x * 0. The mask depends only on (seed, offset + i):
not on the thread count, the SIMD level or how a tensor is split into calls.
Statistical tolerance, stated once: a kept fraction over n draws must be within 5 binomial standard
deviations, 5 * sqrt(q (1 - q) / n), of its expectation q (the draws are deterministic for a given
seed, so these tests cannot flake).
"""
import numpy as np
import pytest

from transformer import _C
from conftest import ISA_LEVELS

LEVELS = ISA_LEVELS
SIGMAS = 5.0
N_STATS = 1_000_000
SIZES = [0, 1, 2, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 1009]




def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def scale_of(p):
    return np.float32(1.0 / (1.0 - np.float64(np.float32(p))))


def assert_fraction(k, n, q, what=""):
    sigma = np.sqrt(q * (1 - q) / n)
    assert abs(k / n - q) <= SIGMAS * sigma, f"{what}: fraction {k / n:.5f}, expected {q} +- {SIGMAS} * {sigma:.2g}"


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_kept_fraction_is_one_minus_p(isa, p):
    x = np.ones(N_STATS, np.float32)
    out = np.empty_like(x)
    _C.dropout_forward(x, out, p, seed=1234)
    assert_fraction(np.count_nonzero(out), N_STATS, 1 - p, f"p={p}")


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("n", SIZES)
def test_kept_values_are_exactly_x_over_1_minus_p_and_dropped_are_zero(isa, p, n):
    x = rand(n, seed=n)
    out = np.full(n, np.nan, np.float32)
    _C.dropout_forward(x, out, p, seed=7, offset=3)
    keep = _C.dropout_mask(n, p, seed=7, offset=3).astype(bool)
    np.testing.assert_array_equal(out[keep], x[keep] * scale_of(p))
    np.testing.assert_array_equal(out[~keep], 0.0)


# p values on and next to multiples of 2^-24, where an integer threshold could be off by one
EDGE_P = [0.1, 0.5, 1 / 3, 0.9999, 2.0 ** -24, float(np.nextafter(np.float32(0.25), np.float32(1))),
          float(np.nextafter(np.float32(0.75), np.float32(0)))]


@pytest.mark.parametrize("p", EDGE_P)
@pytest.mark.parametrize("n", [1, 17, 4099])
def test_fast_kernel_matches_naive_float_compare_reference(isa, p, n):
    # the reference draws uniform(seed, offset + i) as a float and compares it with p
    x = rand(n, seed=n)
    fast, ref = np.empty_like(x), np.empty_like(x)
    _C.dropout_forward(x, fast, p, seed=12, offset=2**40 + 3)
    _C.dropout_forward(x, ref, p, seed=12, offset=2**40 + 3, reference=True)
    np.testing.assert_array_equal(fast, ref)


def test_mask_is_uniform_draw_at_least_p():
    # keep iff uniform >= p: the masks are nested (a larger p keeps a subset), and p just above
    # k * 2^-24 drops exactly the draws below (k + 1) * 2^-24
    n = 100_000
    masks = [_C.dropout_mask(n, p, seed=3).astype(bool) for p in (0.0, 0.1, 0.3, 0.5, 0.7, 0.9)]
    assert masks[0].all()
    for a, b in zip(masks, masks[1:]):
        assert not (b & ~a).any()


def test_adjacent_elements_are_independent():
    m = _C.dropout_mask(N_STATS, 0.5, seed=99).astype(bool)
    assert_fraction(np.count_nonzero(m[:-1] & m[1:]), N_STATS - 1, 0.25, "pairs kept")
    assert_fraction(np.count_nonzero(m[:-16] == m[16:]), N_STATS - 16, 0.5, "lag-16 agreement")


def test_uniform_draws_fill_24_bit_buckets_evenly():
    # kept fraction for a grid of p, each one a 1/20 bucket of [0, 1)
    n = 200_000
    counts = [np.count_nonzero(_C.dropout_mask(n, p, seed=5)) for p in np.arange(20) / 20]
    per_bucket = -np.diff(counts + [0])
    for k in per_bucket:
        assert_fraction(k, n, 1 / 20, "bucket")


def test_forward_applies_dropout_mask(isa):
    n = 4099
    x = rand(n, seed=1)
    out = np.empty_like(x)
    _C.dropout_forward(x, out, 0.3, seed=11, offset=5)
    np.testing.assert_array_equal(out != 0, _C.dropout_mask(n, 0.3, seed=11, offset=5).astype(bool))


def test_same_seed_same_mask_other_seed_or_offset_other_mask():
    n = 10_000
    a = _C.dropout_mask(n, 0.5, seed=1)
    np.testing.assert_array_equal(a, _C.dropout_mask(n, 0.5, seed=1))
    for other in (_C.dropout_mask(n, 0.5, seed=2), _C.dropout_mask(n, 0.5, seed=1, offset=1),
                  _C.dropout_mask(n, 0.5, seed=2**64 - 1)):
        assert_fraction(np.count_nonzero(a == other), n, 0.5, "agreement with another stream")


@pytest.mark.parametrize("k", [1, 15, 16, 17, 1000])
def test_offset_composes(k):
    n = 5000
    np.testing.assert_array_equal(_C.dropout_mask(n, 0.4, seed=9)[k:],
                                  _C.dropout_mask(n - k, 0.4, seed=9, offset=k))


def test_forward_split_into_calls_equals_one_call(isa):
    x = rand(3001, seed=2)
    whole = np.empty_like(x)
    _C.dropout_forward(x, whole, 0.2, seed=4, offset=100)
    parts = np.empty_like(x)
    _C.dropout_forward(x[:1234], parts[:1234], 0.2, seed=4, offset=100)
    _C.dropout_forward(x[1234:], parts[1234:], 0.2, seed=4, offset=100 + 1234)
    np.testing.assert_array_equal(parts, whole)


def test_offset_wraps_modulo_2_64():
    np.testing.assert_array_equal(_C.dropout_mask(40, 0.5, seed=1, offset=2**64 - 8)[8:],
                                  _C.dropout_mask(32, 0.5, seed=1, offset=0))


def test_same_bits_at_every_isa_level():
    x = rand(1, 1003, seed=3)
    outs = []
    for level in LEVELS:
        _C.set_isa(level)
        o = np.empty_like(x)
        _C.dropout_forward(x, o, 0.1, seed=77, offset=12345)
        outs.append(o)
    _C.set_isa(_C.best_isa())
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


def test_same_bits_at_1_and_2_threads(isa, restore_threads):
    x = rand(200_003, seed=4)
    outs = []
    for threads in (1, 2):
        _C.set_num_threads(threads)
        o, g = np.empty_like(x), np.empty_like(x)
        _C.dropout_forward(x, o, 0.1, seed=5, offset=6)
        _C.dropout_backward(x, g, 0.1, seed=5, offset=6)
        outs.append((o, g))
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])


def test_p_zero_is_identity(isa):
    x = rand(4, 33, seed=5)
    out = np.full_like(x, np.nan)
    _C.dropout_forward(x, out, 0.0, seed=1)
    np.testing.assert_array_equal(out, x)
    y = x.copy()
    _C.dropout_forward(y, y, 0.0, seed=1)
    np.testing.assert_array_equal(y, x)


def test_in_place(isa):
    x = rand(7, 129, seed=6)
    want = np.empty_like(x)
    _C.dropout_forward(x, want, 0.25, seed=8)
    _C.dropout_forward(x, x, 0.25, seed=8)
    np.testing.assert_array_equal(x, want)


@pytest.mark.parametrize("n", SIZES)
def test_backward_applies_exactly_the_forward_mask(isa, n):
    dout = rand(n, seed=n + 1)
    dx = np.full(n, np.nan, np.float32)
    _C.dropout_backward(dout, dx, 0.3, seed=21, offset=8)
    keep = _C.dropout_mask(n, 0.3, seed=21, offset=8).astype(bool)
    np.testing.assert_array_equal(dx, np.where(keep, dout * scale_of(0.3), np.float32(0) * dout))


def test_gradient_check(isa):
    # dropout is linear: <dout, f(x + h v) - f(x - h v)> / 2h must equal <backward(dout), v>
    n, h = 5000, np.float32(0.5)
    x, v, dout = rand(n, seed=1), rand(n, seed=2), rand(n, seed=3)

    def f(z):
        out = np.empty_like(z)
        _C.dropout_forward(z, out, 0.1, seed=31, offset=2)
        return out.astype(np.float64)

    fd = np.dot(dout, (f(x + h * v) - f(x - h * v)) / (2 * np.float64(h)))
    dx = np.empty_like(dout)
    _C.dropout_backward(dout, dx, 0.1, seed=31, offset=2)
    analytic = np.dot(dx.astype(np.float64), v)
    assert abs(fd - analytic) <= 1e-5 * np.abs(dout).sum(), (fd, analytic)


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5])
@pytest.mark.parametrize("n", SIZES)
def test_dropout_add_equals_dropout_then_add(isa, p, n):
    x, res = rand(n, seed=1), rand(n, seed=2)
    dropped = np.empty_like(x)
    _C.dropout_forward(x, dropped, p, seed=3, offset=4)
    out = np.full(n, np.nan, np.float32)
    _C.dropout_add_forward(x, res, out, p, seed=3, offset=4)
    np.testing.assert_array_equal(out, res + dropped)


@pytest.mark.parametrize("p", [0.0, 0.1])
@pytest.mark.parametrize("shape", [(1, 1), (3, 15), (2, 16), (4, 17), (3, 63), (2, 64), (5, 65), (2, 3, 33)])
def test_bias_dropout_add_equals_the_three_ops_in_turn(isa, p, shape):
    x, res, bias = rand(*shape, seed=1), rand(*shape, seed=2), rand(shape[-1], seed=3)
    xb = x + bias                              # what add_bias would leave in x
    dropped = np.empty_like(x)
    _C.dropout_forward(xb, dropped, p, seed=3, offset=4)
    out = np.full(shape, np.nan, np.float32)
    x_before = x.copy()
    _C.dropout_add_forward(x, res, out, p, seed=3, offset=4, bias=bias)
    np.testing.assert_array_equal(out, res + dropped)
    np.testing.assert_array_equal(x, x_before)     # x is not modified


def test_bias_dropout_add_same_bits_at_1_and_2_threads(restore_threads):
    x, res, bias = rand(301, 333, seed=1), rand(301, 333, seed=2), rand(333, seed=3)
    outs = []
    for threads in (1, 2):
        _C.set_num_threads(threads)
        o = np.empty_like(x)
        _C.dropout_add_forward(x, res, o, 0.1, seed=5, offset=6, bias=bias)
        outs.append(o)
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("p", [0.0, 0.2])   # 0: the path without draws
def test_dropout_add_in_place_on_either_input(isa, p):
    x, res = rand(3, 67, seed=1), rand(3, 67, seed=2)
    want = np.empty_like(x)
    _C.dropout_add_forward(x, res, want, p, seed=5)
    if p == 0.0:
        np.testing.assert_array_equal(want, res + x)
    x1, r1 = x.copy(), res.copy()
    _C.dropout_add_forward(x1, res, x1, p, seed=5)
    _C.dropout_add_forward(x, r1, r1, p, seed=5)
    np.testing.assert_array_equal(x1, want)
    np.testing.assert_array_equal(r1, want)


def test_dropout_add_same_bits_at_1_and_2_threads(restore_threads):
    x, res = rand(100_003, seed=1), rand(100_003, seed=2)
    outs = []
    for threads in (1, 2):
        _C.set_num_threads(threads)
        o = np.empty_like(x)
        _C.dropout_add_forward(x, res, o, 0.1, seed=5, offset=6)
        outs.append(o)
    np.testing.assert_array_equal(outs[0], outs[1])


M64 = (1 << 64) - 1


def _mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def documented_uniform(seed, offset, n):
    """csrc/rng.h: draw d = mix64(key + d * GAMMA), key = mix64(seed ^ SALT); counter c takes draw
    c >> 1's bits 40-63 (c even) or 8-31 (c odd); uniform = those 24 bits / 2^24."""
    key = _mix64(seed ^ 0x243F6A8885A308D3)
    out = []
    for i in range(n):
        c = (offset + i) & M64
        u = _mix64((key + (c >> 1) * 0x9E3779B97F4A7C15) & M64)
        out.append(((u >> 8) & 0xFFFFFF if c & 1 else u >> 40) / 2**24)
    return out


@pytest.mark.parametrize("offset", [2**63 + 5, 2**63 + 6, M64 - 100])
def test_mask_is_the_documented_splitmix64_draw(offset):
    seed, p, n = 2024, np.float32(0.37), 300
    want = np.array([u >= p for u in documented_uniform(seed, offset, n)], np.uint8)
    np.testing.assert_array_equal(_C.dropout_mask(n, float(p), seed, offset), want)


@pytest.mark.parametrize("offset", [0, 1, 2**40 + 7])
@pytest.mark.parametrize("n", [1, 2, 15, 16, 17, 33, 301])
def test_vector_kernels_draw_the_documented_mask(isa, offset, n):
    """Each SIMD level's kernel, from an even or an odd counter, keeps what the formula says."""
    seed, p = 77, 0.37
    x = np.arange(1, n + 1, dtype=np.float32)
    out = np.empty_like(x)
    _C.dropout_forward(x, out, p, seed, offset)
    want = np.array([u >= np.float32(p) for u in documented_uniform(seed, offset, n)])
    np.testing.assert_array_equal(out != 0, want)


def test_dropout_mask_shape_and_dtype():
    m = _C.dropout_mask(17, 0.0, seed=0)
    assert m.dtype == np.uint8 and m.shape == (17,) and m.all()
    assert _C.dropout_mask(0, 0.5, seed=0).shape == (0,)


# ---- bad input ---------------------------------------------------------------------------------

def _f(*shape):
    return np.zeros(shape, np.float32)


def _readonly(a):
    a.flags.writeable = False
    return a


BAD = [
    (lambda: _C.dropout_forward(_f(5), _f(5), 1.0, 0), ValueError, "p"),
    (lambda: _C.dropout_forward(_f(5), _f(5), -0.1, 0), ValueError, "p"),
    (lambda: _C.dropout_forward(_f(5), _f(5), float("nan"), 0), ValueError, "p"),
    (lambda: _C.dropout_forward(_f(5), _f(5), 0.99999999, 0), ValueError, "p"),   # 1.0 in float32
    (lambda: _C.dropout_forward(_f(5), _f(5), "0.1", 0), TypeError, "p"),
    (lambda: _C.dropout_forward(_f(5), _f(5), 0.1, -1), ValueError, "seed"),
    (lambda: _C.dropout_forward(_f(5), _f(5), 0.1, 2**64), ValueError, "seed"),
    (lambda: _C.dropout_forward(_f(5), _f(5), 0.1, 1.5), TypeError, "seed"),
    (lambda: _C.dropout_forward(_f(5), _f(5), 0.1, 0, -3), ValueError, "offset"),
    (lambda: _C.dropout_forward(_f(5), _f(5), 0.1, 0, None), TypeError, "offset"),
    (lambda: _C.dropout_forward(_f(5).astype(np.float64), _f(5), 0.1, 0), TypeError, "x"),
    (lambda: _C.dropout_forward(_f(5).astype(np.int32), _f(5), 0.1, 0), TypeError, "x"),
    (lambda: _C.dropout_forward(_f(5), _f(6), 0.1, 0), ValueError, "out"),
    (lambda: _C.dropout_forward(_f(5), _readonly(_f(5)), 0.1, 0), ValueError, "out"),
    (lambda: _C.dropout_forward(_f(10)[::2], _f(5), 0.1, 0), ValueError, "x"),
    (lambda: _C.dropout_backward(_f(5), _f(5).astype(np.float16), 0.1, 0), TypeError, "dx"),
    (lambda: _C.dropout_backward(_f(5, 2), _f(2, 5), 0.1, 0), ValueError, "dx"),
    (lambda: _C.dropout_backward(_f(5), _f(5), 1.5, 0), ValueError, "p"),
    (lambda: _C.dropout_add_forward(_f(5), _f(6), _f(5), 0.1, 0), ValueError, "residual"),
    (lambda: _C.dropout_add_forward(_f(5), _f(5).astype(np.float64), _f(5), 0.1, 0), TypeError, "residual"),
    (lambda: _C.dropout_add_forward(_f(5), _f(5), _f(4), 0.1, 0), ValueError, "out"),
    (lambda: _C.dropout_add_forward(_f(5), _f(5), _f(5), 1.0, 0), ValueError, "p"),
    (lambda: _C.dropout_add_forward(_f(4, 5), _f(4, 5), _f(4, 5), 0.1, 0, 0, _f(4)), ValueError, "bias"),
    (lambda: _C.dropout_add_forward(_f(4, 5), _f(4, 5), _f(4, 5), 0.1, 0, 0, _f(1, 5)), ValueError, "bias"),
    (lambda: _C.dropout_add_forward(_f(4, 5), _f(4, 5), _f(4, 5), 0.1, 0, 0, _f(5).astype(np.float64)), TypeError, "bias"),
    (lambda: _C.dropout_mask(-1, 0.1, 0), ValueError, "n"),
    (lambda: _C.dropout_mask(5.0, 0.1, 0), TypeError, "n"),
    (lambda: _C.dropout_mask(5, 1.0, 0), ValueError, "p"),
]


@pytest.mark.parametrize("call,exc,name", BAD)
def test_bad_input_is_refused_naming_the_argument(call, exc, name):
    with pytest.raises(exc, match=rf"\b{name}\b"):
        call()


def test_partial_overlap_is_refused():
    buf = _f(20)
    with pytest.raises(ValueError, match="out"):
        _C.dropout_forward(buf[:10], buf[5:15], 0.1, 0)
    with pytest.raises(ValueError, match="dx"):
        _C.dropout_backward(buf[:10], buf[1:11], 0.1, 0)
    with pytest.raises(ValueError, match="residual"):
        _C.dropout_add_forward(_f(10), buf[:10], buf[3:13], 0.1, 0)
