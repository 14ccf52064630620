"""int8 GEMM for inference: y = dequant(quant(x) @ q^T) (+ bias), the contract of csrc/qgemm.h.

The oracle is numpy following the same rule, and results are compared bitwise. Why that is sound:
- quantization: the same float32 operations (amax, 127 / amax, v * inv, rint = half to even,
  clip), each one correctly rounded IEEE float32 in numpy as in C;
- the integer sum is exact on both sides (int32 in C, int64 here, |acc| < 2^31);
- (float)acc: int64 -> float64 is exact (|acc| < 2^53), then one rounding to float32;
- xs * ws: one float32 multiply on both sides;
- fmaf(a, s, b): a * s is exact in float64 (two 24-bit significands), and the sum is rounded to
  odd in float64 (TwoSum tells whether it was exact) before the one rounding to float32: rounding
  to odd with 29 spare bits makes the double rounding exact (Boldo & Melquiond), where a plain
  float64 sum could round twice on a tie. test_oracle_fma_is_exact checks this against
  fractions.
The fp32 product is a second, looser check (TOL_FP32, relative to the output's scale).
"""
import fractions

import numpy as np
import pytest

import transformer as T
from transformer import _C, ops

from conftest import ALL_ISA_LEVELS as ISA_LEVELS, isa_fixture, num_threads

isa = isa_fixture(ISA_LEVELS)   # avx512_vnni has a kernel of its own

TINY = np.float32(2.0 ** -120)   # rows with amax below this quantize to zeros (qgemm.h)
MAX_K = 65536
TOL_FP32 = 0.02   # int8 vs fp32: max difference <= 2 % of max |fp32 output|


def rng(seed=0):
    return np.random.default_rng(seed)


# ---------------------------------------------------------------------------
# The oracle.

def quantize_ref(v):
    """(q int8, scale float32) of each row of float32 v, by the rule of qgemm.h."""
    v = np.asarray(v, dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        amax = np.abs(v).max(axis=1, initial=np.float32(0)).astype(np.float32)
        bad = ~np.isfinite(v).all(axis=1)
        zero = bad | (amax < TINY)
        inv = np.float32(127) / np.where(zero, np.float32(1), amax)
        q = np.clip(np.rint(v * inv[:, None]), -127, 127)
        q[zero] = 0
        scale = amax / np.float32(127)
    scale[amax < TINY] = 0
    scale[bad] = np.nan
    assert q.dtype == np.float32 and inv.dtype == np.float32 and scale.dtype == np.float32
    return q.astype(np.int8), scale.astype(np.float32)


def fma32(a, s, b):
    """Correctly rounded float32 fma(a, s, b) of float32 arrays (see the module docstring)."""
    p = a.astype(np.float64) * s.astype(np.float64)   # exact
    c = np.broadcast_to(b, p.shape).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        t = p + c
        bb = t - p
        err = (p - (t - bb)) + (c - bb)   # TwoSum: p + c == t + err exactly
        fix = np.isfinite(t) & (err != 0) & ((t.view(np.uint64) & 1) == 0)
        t[fix] = np.nextafter(t[fix], np.where(err[fix] > 0, np.inf, -np.inf))   # round to odd
    return t.astype(np.float32)


def int8_linear_ref(x, q, ws, bias=None):
    qx, xs = quantize_ref(x)
    acc = qx.astype(np.int64) @ q.astype(np.int64).T
    accf = acc.astype(np.float64).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        s = xs[:, None] * ws[None, :]
        if bias is None:
            return (accf.astype(np.float64) * s.astype(np.float64)).astype(np.float32)
        return fma32(accf, s, bias[None, :])


def assert_same_bits(got, want, what=""):
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    if not same.all():
        i = np.argwhere(~same)[0]
        raise AssertionError(f"{what}: {np.count_nonzero(~same)} elements differ, first at {tuple(i)}: "
                             f"got {got[tuple(i)]!r}, want {want[tuple(i)]!r}, max difference "
                             f"{np.nanmax(np.abs(got.astype(np.float64) - want)):.3g}")


def run(x, q, scale, bias=None):
    packed = _C.qgemm_pack(q, scale)
    out = np.full((x.shape[0], q.shape[0]), np.nan, dtype=np.float32)
    return _C.qgemm_packed(x, packed, bias, out)


def problem(M, N, K, seed=0):
    r = rng(seed)
    x = r.standard_normal((M, K)).astype(np.float32)
    w = (r.standard_normal((N, K)) * 0.1).astype(np.float32)
    b = r.standard_normal(N).astype(np.float32)
    return x, w, b


@pytest.fixture
def forced():
    """_C._qgemm_force(...) for one test; the normal behaviour is restored afterwards."""
    yield _C._qgemm_force
    _C._qgemm_force()


# ---------------------------------------------------------------------------
# The oracle itself.

def test_oracle_fma_is_exact():
    r = rng(1)
    # the last one: a * s is 1.5 ulp above 3, the bias a hair below; a float64 sum rounds to the
    # tie, which float32 then rounds up to even, where the exact value rounds down
    a = np.concatenate([r.integers(-2**30, 2**30, 300).astype(np.float32), np.float32([3])])
    s = np.concatenate([r.uniform(0, 1e-4, 300).astype(np.float32), np.float32([1 + 2.0 ** -23])])
    b = np.concatenate([r.standard_normal(300).astype(np.float32) * np.float32(1e3), np.float32([-2.0 ** -80])])
    got = fma32(a, s, b)
    naive = (a[-1:].astype(np.float64) * s[-1:] + b[-1:]).astype(np.float32)
    assert got[-1] == np.float32(3 + 2.0 ** -22) and naive[0] != got[-1]
    for ai, si, bi, gi in zip(a, s, b, got):
        exact = fractions.Fraction(float(ai)) * fractions.Fraction(float(si)) + fractions.Fraction(float(bi))
        lo = np.float32(float(exact))
        candidates = [lo, np.nextafter(lo, np.float32(np.inf)), np.nextafter(lo, np.float32(-np.inf))]
        best = min(candidates, key=lambda c: (abs(fractions.Fraction(float(c)) - exact),
                                              int(np.float32(c).view(np.uint32)) & 1))
        assert gi == best, (ai, si, bi, gi, best)


# ---------------------------------------------------------------------------
# Quantization.

def test_quantize_follows_the_rule_bitwise():
    r = rng(2)
    w = r.standard_normal((40, 77)).astype(np.float32)
    w[3] = 0                                   # all-zero row: scale 0, q 0
    w[5] = 0; w[5, 10] = 3e38                  # one huge value
    w[6] = -np.abs(w[6])                       # all negative
    w[7] = np.float32(1e-38) * r.standard_normal(77).astype(np.float32)   # tiny but above 2^-120
    w[8] = np.float32(2.0 ** -125)             # below 2^-120: zeros
    q, scale = _C.qgemm_quantize(w)
    q_ref, scale_ref = quantize_ref(w)
    np.testing.assert_array_equal(q, q_ref)
    assert_same_bits(scale, scale_ref, "scale")
    assert scale[3] == 0 and not q[3].any() and scale[8] == 0 and not q[8].any()
    assert q[5, 10] == 127 and np.count_nonzero(q[5]) == 1
    assert q.min() >= -127 and q.max() <= 127
    assert (np.abs(q).max(axis=1)[scale > 0] == 127).all()


def test_quantize_rounds_half_to_even():
    w = np.float32([[127, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 3.4999998]])   # amax 127: inv = 1
    q, scale = _C.qgemm_quantize(w)
    np.testing.assert_array_equal(q[0], [127, 0, 2, 2, 0, -2, -2, 126, 3])
    assert scale[0] == 1


def test_quantize_empty_shapes():
    q, scale = _C.qgemm_quantize(np.zeros((0, 5), np.float32))
    assert q.shape == (0, 5) and scale.shape == (0,)
    q, scale = _C.qgemm_quantize(np.zeros((3, 0), np.float32))
    assert q.shape == (3, 0) and (scale == 0).all()


# ---------------------------------------------------------------------------
# The product, bitwise against the oracle.

SHAPES = [(1, 1, 1), (1, 16, 2), (3, 17, 3), (1, 5, 1), (7, 33, 64), (6, 15, 129), (13, 50, 255),
          (5, 32, 16), (65, 20, 31), (2, 3, 0),
          # amx's tiles: whole steps of 64 k with and without quads past them, one and two A
          # tiles of 16 rows, partly filled, and more than one block of 64 rows
          (40, 70, 200), (33, 64, 128), (70, 33, 320)]


@pytest.mark.parametrize("M,N,K", SHAPES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_matches_the_oracle_bitwise(isa, M, N, K, with_bias):
    x, w, b = problem(M, N, K, seed=M * 1000 + N + K)
    q, scale = _C.qgemm_quantize(w)
    bias = b if with_bias else None
    assert_same_bits(run(x, q, scale, bias), int8_linear_ref(x, q, scale, bias), f"{isa} {M}x{N}x{K}")


def test_awkward_activation_rows(isa):
    """Zero rows, a single huge value, negatives, exact ties (amax 127: inv = 1), tiny rows."""
    K, N = 37, 21
    r = rng(3)
    x = r.standard_normal((7, K)).astype(np.float32)
    x[0] = 0
    x[1] = 0; x[1, 5] = -3e38
    x[2] = -np.abs(x[2])
    x[3] = np.float32(0.5) + np.arange(K, dtype=np.float32) % 5 - 2; x[3, 0] = 127   # ties
    x[4] = np.float32(2.0 ** -121)
    x[5] = np.float32(1e-30) * x[5]
    x[6] = 1e30
    w = r.standard_normal((N, K)).astype(np.float32)
    w[4] = 0
    q, scale = _C.qgemm_quantize(w)
    b = r.standard_normal(N).astype(np.float32)
    for bias in (b, None):
        got = run(x, q, scale, bias)
        assert_same_bits(got, int8_linear_ref(x, q, scale, bias), isa)
    assert (run(x[:1], q, scale, b) == b).all()   # a zero row gives the bias


def test_non_finite_activation_gives_a_nan_row(isa):
    x, w, b = problem(4, 19, 10)
    x[1, 3] = np.nan
    x[2, 0] = -np.inf
    q, scale = _C.qgemm_quantize(w)
    got = run(x, q, scale, b)
    assert np.isnan(got[1]).all() and np.isnan(got[2]).all()
    assert np.isfinite(got[[0, 3]]).all()
    assert_same_bits(got, int8_linear_ref(x, q, scale, b), isa)


def test_longest_k_does_not_overflow(isa):
    K = MAX_K
    w = np.ones((3, K), np.float32)
    w[1] = -1
    x = np.ones((2, K), np.float32)
    x[1, ::2] = -1
    q, scale = _C.qgemm_quantize(w)
    got = run(x, q, scale)
    assert_same_bits(got, int8_linear_ref(x, q, scale), isa)
    assert got[0, 0] == np.float32(127 * 127 * K) * (np.float32(1 / 127.0) * np.float32(1 / 127.0))
    assert got[0, 1] < 0 and got[1, 0] == 0


def test_many_rows_like_an_encoder(isa):
    x, w, b = problem(300, 40, 96, seed=4)
    q, scale = _C.qgemm_quantize(w)
    assert_same_bits(run(x, q, scale, b), int8_linear_ref(x, q, scale, b), isa)


def test_bits_do_not_depend_on_the_thread_count(isa, forced, restore_threads):
    x, w, b = problem(70, 100, 83, seed=5)   # two blocks of rows, a partial panel
    q, scale = _C.qgemm_quantize(w)
    forced(all_threads=True)
    results = []
    for n in (1, 2, 3):
        with num_threads(n):
            results.append(run(x, q, scale, b))
    for got in results[1:]:
        assert_same_bits(got, results[0], "threads")
    assert_same_bits(results[0], int8_linear_ref(x, q, scale, b), isa)


def test_every_instruction_set_gives_the_same_bits():
    x, w, b = problem(9, 45, 70, seed=6)
    q, scale = _C.qgemm_quantize(w)
    try:
        results = [(_C.set_isa(level), run(x, q, scale, b)) for level in ISA_LEVELS]
    finally:
        _C.set_isa(_C.best_isa())
    for level, got in results:
        assert_same_bits(got, results[0][1], level)


def test_the_naive_fallback_gives_the_same_bits(isa, forced):
    x, w, b = problem(8, 35, 41, seed=7)
    x[2] = 0
    q, scale = _C.qgemm_quantize(w)
    fast = run(x, q, scale, b)
    forced(slow=True)
    assert_same_bits(run(x, q, scale, b), fast, "slow")
    assert_same_bits(run(x, q, scale), int8_linear_ref(x, q, scale), "slow, no bias")


def test_empty_dimensions(isa):
    q, scale = _C.qgemm_quantize(np.ones((4, 6), np.float32))
    packed = _C.qgemm_pack(q, scale)
    out = np.empty((0, 4), np.float32)
    assert _C.qgemm_packed(np.empty((0, 6), np.float32), packed, None, out) is out
    q0, s0 = _C.qgemm_quantize(np.ones((0, 6), np.float32))
    out = np.empty((3, 0), np.float32)
    _C.qgemm_packed(np.ones((3, 6), np.float32), _C.qgemm_pack(q0, s0), None, out)


def test_close_to_the_fp32_product(isa):
    x, w, b = problem(12, 64, 256, seed=8)
    want = x.astype(np.float64) @ w.T.astype(np.float64) + b
    got = ops.int8_linear(x, *ops.quantize_int8(w), bias=b)
    diff = np.abs(got - want).max()
    assert diff <= TOL_FP32 * np.abs(want).max(), f"max difference {diff:.3g}"


# ---------------------------------------------------------------------------
# The packed buffer.

def test_packed_buffer_holds_header_scales_and_compensation(isa):
    """The layout of qgemm.h: 64-byte header, scale [Np], comp [Np] = 128 * row sums of q."""
    x, w, b = problem(1, 20, 9, seed=9)
    q, scale = _C.qgemm_quantize(w)
    packed = _C.qgemm_pack(q, scale)
    assert packed.dtype == np.uint8 and packed.ctypes.data % 64 == 0
    assert bytes(packed[:8]) == b"TFQGEMM1"
    nr = 1 if isa == "generic" else 16
    np_cols = -(-20 // nr) * nr
    comp_at = 64 + -(-np_cols * 4 // 64) * 64
    assert_same_bits(packed[64:64 + 4 * 20].view(np.float32), scale, "scale")
    comp = packed[comp_at:comp_at + 4 * np_cols].view(np.int32)
    np.testing.assert_array_equal(comp[:20], 128 * q.astype(np.int64).sum(axis=1))
    assert not comp[20:].any()


def test_reuse_is_refilled_in_place(isa):
    _, w1, _ = problem(1, 30, 40, seed=10)
    _, w2, _ = problem(1, 30, 40, seed=11)
    q1, s1 = _C.qgemm_quantize(w1)
    q2, s2 = _C.qgemm_quantize(w2)
    packed = _C.qgemm_pack(q1, s1)
    again = _C.qgemm_pack(q2, s2, reuse=packed)
    assert again is packed
    np.testing.assert_array_equal(packed, _C.qgemm_pack(q2, s2))
    with pytest.raises(ValueError, match="reuse"):
        _C.qgemm_pack(q2[:, :20].copy(), s2, reuse=packed)
    with pytest.raises(TypeError, match="reuse"):
        _C.qgemm_pack(q2, s2, reuse=packed.view(np.int8))
    with pytest.raises(ValueError, match="reuse"):
        _C.qgemm_pack(q2, s2, reuse=np.empty(packed.size + 1, np.uint8)[1:])   # misaligned


@pytest.mark.skipif(len(ISA_LEVELS) < 2, reason="one instruction set on this CPU")
def test_packed_for_another_instruction_set_is_refused():
    q, scale = _C.qgemm_quantize(np.ones((4, 6), np.float32))
    try:
        assert _C.set_isa("generic") == "generic"
        packed = _C.qgemm_pack(q, scale)
    finally:
        _C.set_isa(_C.best_isa())
    with pytest.raises(ValueError, match="packed was packed for the generic kernels"):
        _C.qgemm_packed(np.ones((1, 6), np.float32), packed, None, np.empty((1, 4), np.float32))


def test_packed_for_another_shape_or_damaged_is_refused():
    q, scale = _C.qgemm_quantize(np.ones((4, 6), np.float32))
    packed = _C.qgemm_pack(q, scale)
    x, out = np.ones((2, 6), np.float32), np.empty((2, 4), np.float32)
    with pytest.raises(ValueError, match="x must have 6 columns"):
        _C.qgemm_packed(np.ones((2, 7), np.float32), packed, None, out)
    with pytest.raises(ValueError, match="out must have shape"):
        _C.qgemm_packed(x, packed, None, np.empty((2, 5), np.float32))
    with pytest.raises(ValueError, match="packed is not a buffer from qgemm_pack"):
        _C.qgemm_packed(x, packed[:-64], None, out)
    other = _C.qgemm_pack(q, scale)
    other[0] ^= 1
    with pytest.raises(ValueError, match="packed is not a buffer from qgemm_pack"):
        _C.qgemm_packed(x, other, None, out)
    other = _C.qgemm_pack(q, scale)
    other[24:32] = np.array([1000], np.int64).view(np.uint8)   # N in the header: not this size
    with pytest.raises(ValueError, match="packed is not a buffer from qgemm_pack"):
        _C.qgemm_packed(x, other, None, out)


# ---------------------------------------------------------------------------
# Bad arguments: refused before any C runs, naming the argument.

def test_quantize_refuses_bad_weights():
    with pytest.raises(TypeError, match="w must have dtype float32"):
        _C.qgemm_quantize(np.ones((2, 3)))
    with pytest.raises(ValueError, match="w must be 2-D"):
        _C.qgemm_quantize(np.ones(3, np.float32))
    with pytest.raises(ValueError, match="w must be C-contiguous"):
        _C.qgemm_quantize(np.ones((3, 2), np.float32).T)
    for bad in (np.nan, np.inf, -np.inf):
        w = np.ones((2, 3), np.float32)
        w[1, 2] = bad
        with pytest.raises(ValueError, match="w must be finite"):
            _C.qgemm_quantize(w)
        with pytest.raises(ValueError, match="w must be finite"):
            ops.quantize_int8(w)
    with pytest.raises(ValueError, match="w must have at most 65536 columns"):
        _C.qgemm_quantize(np.ones((1, MAX_K + 1), np.float32))


def test_pack_refuses_bad_arguments():
    q, scale = _C.qgemm_quantize(np.ones((4, 6), np.float32))
    with pytest.raises(TypeError, match="q must have dtype int8"):
        _C.qgemm_pack(q.astype(np.int16), scale)
    with pytest.raises(TypeError, match="scale must have dtype float32"):
        _C.qgemm_pack(q, scale.astype(np.float64))
    with pytest.raises(ValueError, match="scale must have shape"):
        _C.qgemm_pack(q, scale[:3].copy())
    bad = q.copy(); bad[0, 0] = -128
    with pytest.raises(ValueError, match=r"q must hold values in \[-127, 127\]"):
        _C.qgemm_pack(bad, scale)
    for s in (-1.0, np.nan, np.inf):
        bad = scale.copy(); bad[2] = s
        with pytest.raises(ValueError, match="scale must be finite and >= 0"):
            _C.qgemm_pack(q, bad)
    with pytest.raises(ValueError, match="q must have at most 65536 columns"):
        _C.qgemm_pack(np.zeros((1, MAX_K + 1), np.int8), np.zeros(1, np.float32))


def test_product_refuses_bad_arguments():
    q, scale = _C.qgemm_quantize(np.ones((4, 6), np.float32))
    packed = _C.qgemm_pack(q, scale)
    x, out, b = np.ones((2, 6), np.float32), np.empty((2, 4), np.float32), np.ones(4, np.float32)
    with pytest.raises(TypeError, match="x must have dtype float32"):
        _C.qgemm_packed(x.astype(np.float64), packed, b, out)
    with pytest.raises(TypeError, match="packed must have dtype uint8"):
        _C.qgemm_packed(x, packed.view(np.int8), b, out)
    with pytest.raises(TypeError, match="packed must be a numpy.ndarray"):
        _C.qgemm_packed(x, bytes(packed), b, out)
    with pytest.raises(ValueError, match="bias must have shape"):
        _C.qgemm_packed(x, packed, b[:3].copy(), out)
    with pytest.raises(TypeError, match="bias must have dtype float32"):
        _C.qgemm_packed(x, packed, b.astype(np.float64), out)
    with pytest.raises(TypeError, match="out must have dtype float32"):
        _C.qgemm_packed(x, packed, b, out.astype(np.float64))
    readonly = out.copy(); readonly.flags.writeable = False
    with pytest.raises(ValueError, match="out must be writeable"):
        _C.qgemm_packed(x, packed, b, readonly)
    with pytest.raises(ValueError, match="x must be C-contiguous"):
        _C.qgemm_packed(np.ones((6, 2), np.float32).T, packed, b, out)
    with pytest.raises(ValueError, match="packed must be 64-byte aligned"):
        _C.qgemm_packed(x, np.concatenate([np.zeros(1, np.uint8), packed])[1:], b, out)
    shared = np.ones(8 + 6, np.float32)
    with pytest.raises(ValueError, match="out must not overlap x"):
        _C.qgemm_packed(shared[:6].reshape(1, 6), packed, b, shared[4:8].reshape(1, 4))
    with pytest.raises(ValueError, match="out must not overlap bias"):
        _C.qgemm_packed(np.ones((1, 6), np.float32), packed, shared[:4], shared[:4].reshape(1, 4))


# ---------------------------------------------------------------------------
# The friendly wrappers.

def test_int8_linear_takes_3d_and_converts_layouts(isa):
    r = rng(12)
    w = r.standard_normal((24, 10)).astype(np.float32)
    x3 = r.standard_normal((2, 5, 10)).astype(np.float32)
    b = r.standard_normal(24).astype(np.float32)
    q, scale = ops.quantize_int8(np.asfortranarray(w))
    q_ref, scale_ref = quantize_ref(w)
    np.testing.assert_array_equal(q, q_ref)
    got = ops.int8_linear(x3, q, scale, bias=b)
    assert got.shape == (2, 5, 24) and got.dtype == np.float32
    assert_same_bits(got.reshape(10, 24), int8_linear_ref(x3.reshape(10, 10), q, scale, b), isa)
    fortran = np.asfortranarray(x3[0])
    assert_same_bits(ops.int8_linear(fortran, q, scale), int8_linear_ref(x3[0], q, scale), "fortran x")
    assert ops.int8_linear(np.empty((0, 3, 10), np.float32), q, scale).shape == (0, 3, 24)


def test_int8_linear_refuses_bad_arguments():
    q, scale = ops.quantize_int8(np.ones((4, 6), np.float32))
    x = np.ones((2, 6), np.float32)
    with pytest.raises(TypeError, match="x must have dtype float32"):
        ops.int8_linear(x.astype(np.float64), q, scale)
    with pytest.raises(ValueError, match="x must be 2-D"):
        ops.int8_linear(np.ones(6, np.float32), q, scale)
    with pytest.raises(ValueError, match="x must have 6 features"):
        ops.int8_linear(np.ones((2, 5), np.float32), q, scale)
    with pytest.raises(TypeError, match="q must have dtype int8"):
        ops.int8_linear(x, q.astype(np.int32), scale)
    with pytest.raises(ValueError, match="scale must have shape"):
        ops.int8_linear(x, q, scale[:2])
    with pytest.raises(ValueError, match="bias must have shape"):
        ops.int8_linear(x, q, scale, bias=np.ones(5, np.float32))
    with pytest.raises(TypeError, match="w must have dtype float32"):
        ops.quantize_int8(np.ones((2, 2), np.float64))


def test_build_info_names_the_int8_path(isa):
    want = {"generic": "generic (C, int32)", "avx2": "avx2 (vpmaddwd, int32)",
            "neon": "neon (avx2's vpmaddwd kernel through SIMDe, int32)",
            "neon_dotprod": "neon_dotprod (sdot, int32)",
            "avx512": "avx2 (vpmaddwd, int32)", "avx512_vnni": "avx512_vnni (vpdpbusd, int32)",
            "avx512_bf16": "avx512_vnni (vpdpbusd, int32)", "amx": "amx (tdpbusd tiles, int32)"}[isa]
    assert T.build_info()["int8"] == want
