"""GEMM with bf16 operands (csrc/gemm.h, GEMM_BF16): every element of op(a) and op(b) rounded to
bfloat16 (nearest, ties to even) before it is multiplied; sums, alpha and out stay float32.

The oracle rounds the operands the same way in numpy (bf16() below, itself checked against
torch's float32 -> bfloat16 conversion) and multiplies them in float64. A bf16 x bf16 product is
exact in float32, so the only difference left is the float32 summation: TOL * K * max|a| * max|b|
with TOL = 1e-6, as in test_gemm.py. The unrounded float32 product misses that tolerance by far
(checked below), so these tests fail if an operand reaches the kernels unrounded.
"""
import numpy as np
import pytest

import transformer as T
from transformer import _C, ops

from conftest import ALL_ISA_LEVELS, isa_fixture
from test_gemm import KC, THREADS, TRANS, assert_same_bits, operand, outside, padded_out, rng
from test_gemm import MC as MC_FP32, MR as MR_FP32, NR

isa = isa_fixture(ALL_ISA_LEVELS)   # avx512_bf16 and amx have kernels of their own

TOL = 1e-6
# The K block of the bf16 kernels (csrc/gemm/avx512_bf16.c, amx.c): avx512_bf16's vdpbf16ps
# kernel and amx's tile kernel take 512 k (256 pairs), every other level the fp32 kernels' 256.
# amx's tile is 32 rows (two A tiles of 16) and its A block 256 rows; every other level has its
# fp32 tile and block.
KC_OF = {"avx512_bf16": 512, "amx": 512}
MR = dict(MR_FP32, amx=32)
MC = dict(MC_FP32, amx=256)
# Levels whose pre-packed B holds bf16 pairs (vdpbf16ps and tdpbf16ps read the same layout; the
# AVX2 kernels widen each half back to a float).
PAIRS = ("avx2", "avx512_bf16", "amx")


def to_bf16(x):
    """float32 -> nearest bfloat16 (ties to even), as float32 with the low 16 bits zero."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    nan = np.isnan(x)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return np.where(nan, np.float32(np.nan), r).astype(np.float32)


def bf16(x):
    """The GEMM's operand rounding (csrc/gemm.h): to_bf16, then a subnormal is zero of its sign
    (vdpbf16ps treats subnormal inputs as zero, and every level does the same)."""
    r = to_bf16(x)
    return np.where(np.abs(r) < np.float32(2.0 ** -126), np.copysign(np.float32(0), r), r).astype(np.float32)


def expected(a, b, trans_a, trans_b, alpha=1.0, out0=None):
    a = np.swapaxes(bf16(a), -1, -2) if trans_a else bf16(a)
    b = np.swapaxes(bf16(b), -1, -2) if trans_b else bf16(b)
    r = alpha * (a.astype(np.float64) @ b.astype(np.float64))
    return r if out0 is None else r + out0.astype(np.float64)


def tolerance(a, b, trans_a, alpha=1.0, out0=None):
    k = a.shape[-2] if trans_a else a.shape[-1]
    scale = max(k, 1) * max(np.abs(a).max(initial=0), 1e-30) * max(np.abs(b).max(initial=0), 1e-30) * abs(alpha)
    if out0 is not None:
        scale += np.abs(out0).max(initial=0)
    return TOL * scale


def assert_close(got, a, b, trans_a, trans_b, alpha=1.0, out0=None):
    want = expected(a, b, trans_a, trans_b, alpha, out0)
    diff = np.abs(got.astype(np.float64) - want).max(initial=0)
    tol = tolerance(a, b, trans_a, alpha, out0)
    assert diff <= tol, f"max difference {diff:.3g} > {tol:.3g}"


def test_the_oracle_rounds_as_torch_does():
    torch = pytest.importorskip("torch")
    r = rng(0)
    x = np.concatenate([r.standard_normal(10000).astype(np.float32) * 10.0 ** r.integers(-40, 39, 10000),
                        np.array([0.0, -0.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 3.4e38, -3.4e38,
                                  1e-40, np.inf, -np.inf], np.float32)]).astype(np.float32)
    want = torch.from_numpy(x).to(torch.bfloat16).to(torch.float32).numpy()
    assert_same_bits(to_bf16(x), want, "numpy bf16 vs torch")
    assert bf16(np.float32(1 + 2 ** -8)) == 1.0 and bf16(np.float32(1 + 3 * 2 ** -8)) == 1 + 2 ** -6
    flushed = bf16(np.array([1e-40, -3e-39, 1.1754944e-38, -1.1754942e-38], np.float32))
    assert_same_bits(flushed, np.array([0.0, -0.0, 2.0 ** -126, -(2.0 ** -126)], np.float32), "subnormals")


def test_a_product_with_the_identity_is_the_rounded_operand(isa):
    """Ties go to even, subnormals become zero: bitwise, for every operand position
    (a, transposed a, b). (An infinity would turn the zeros of I into NaNs: next test.)"""
    r = rng(1)
    x = (r.standard_normal((37, 41)) * 10.0 ** r.integers(-30, 30, (37, 41))).astype(np.float32)
    x[0, :4] = [1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 3.3e38]
    x[1, :2] = [1e-40, -3e-39]
    eye_n, eye_m = np.eye(41, dtype=np.float32), np.eye(37, dtype=np.float32)
    want = bf16(x) + np.float32(0)   # a flushed -3e-39 is -0, and -0 + the zero products is +0
    assert_same_bits(ops.matmul(x, eye_n, precision="bf16"), want, "a @ I")
    assert_same_bits(ops.matmul(np.ascontiguousarray(x.T), eye_n, trans_a=True, precision="bf16"), want, "a^T @ I")
    assert_same_bits(ops.matmul(eye_m, x, precision="bf16"), want, "I @ b")
    assert_same_bits(ops.matmul(eye_m, np.ascontiguousarray(x.T), trans_b=True, precision="bf16"), want, "I @ b^T")


def test_the_subnormals_next_to_the_smallest_normal_round_up_through_every_packer(isa):
    """The subnormals within 2^-133 of 2^-126 (bits 0x007F8000-0x007FFFFF, either sign) round up
    to the smallest normal; vcvtne2ps2bf16, which avx512_bf16's packing uses, would make them zero
    (csrc/gemm/avx512_bf16.c). Among ordinary floats and in groups of their own, in each operand
    position and in a pre-packed B."""
    r = rng(11)
    x = (r.standard_normal((37, 70)) * 10.0 ** r.integers(-3, 3, (37, 70))).astype(np.float32)
    bits = r.integers(0x007F8000, 0x00800000, size=x.size, dtype=np.uint32) | (r.integers(0, 2, x.size, dtype=np.uint32) << 31)
    edge = bits.astype(np.uint32).view(np.float32).reshape(x.shape)
    where = r.random(x.shape) < 0.05
    where[3] = True                                           # a row of them
    where[:, 5] = True                                        # a column of them
    x = np.where(where, edge, x).astype(np.float32)
    x[4, :3] = np.array([0x007F7FFF, 0x807F7FFF, 0x00400000], np.uint32).view(np.float32)   # these flush
    where[4, :3] = False
    want = bf16(x) + np.float32(0)
    assert (np.abs(want[where]) == np.float32(2.0 ** -126)).all()
    eye_n, eye_m = np.eye(x.shape[1], dtype=np.float32), np.eye(x.shape[0], dtype=np.float32)
    xt = np.ascontiguousarray(x.T)
    assert_same_bits(ops.matmul(x, eye_n, precision="bf16"), want, "a @ I")
    assert_same_bits(ops.matmul(xt, eye_n, trans_a=True, precision="bf16"), want, "a^T @ I")
    assert_same_bits(ops.matmul(eye_m, x, precision="bf16"), want, "I @ b")
    assert_same_bits(ops.matmul(eye_m, xt, trans_b=True, precision="bf16"), want, "I @ b^T")
    for b, trans_b in ((x, False), (xt, True)):
        got = np.empty(x.shape, np.float32)
        _C.gemm_packed(eye_m, _C.gemm_pack_b(b, trans_b=trans_b, bf16=True), got)
        assert_same_bits(got, want, f"I @ packed b (trans_b={trans_b})")


def test_every_operand_position_rounds_random_finite_floats_as_the_oracle(isa):
    """2^21 floats of random bits (every exponent, subnormals included; none that is or rounds to
    NaN or infinity, which the zeros of I would spread), in each operand position: bitwise the
    oracle's rounding."""
    r = rng(12)
    bits = r.integers(0, 2 ** 32, size=2 ** 21, dtype=np.uint64).astype(np.uint32)
    bits = np.where((bits & 0x7FFFFFFF) >= 0x7F7F8000, bits & 0xBFFFFFFF, bits).astype(np.uint32)
    x = bits.view(np.float32).reshape(-1, 32)
    want = bf16(x) + np.float32(0)
    eye = np.eye(32, dtype=np.float32)
    assert_same_bits(ops.matmul(x, eye, precision="bf16"), want, "a @ I")
    assert_same_bits(ops.matmul(np.ascontiguousarray(x.T), eye, trans_a=True, precision="bf16"), want, "a^T @ I")
    y = x.reshape(-1, 1024)[:64]                       # b positions: 64 x 1024 of them
    want_y = bf16(y) + np.float32(0)
    eye_m = np.eye(64, dtype=np.float32)
    assert_same_bits(ops.matmul(eye_m, y, precision="bf16"), want_y, "I @ b")
    assert_same_bits(ops.matmul(eye_m, np.ascontiguousarray(y.T), trans_b=True, precision="bf16"), want_y, "I @ b^T")


def test_infinity_and_nan_pass_through_rounding(isa):
    """... and the largest floats round up to infinity, as a bf16 conversion does."""
    a = np.array([[np.inf], [-np.inf], [np.nan], [2.0], [3.4e38]], np.float32)
    out = ops.matmul(a, np.ones((1, 3), np.float32), precision="bf16")
    assert np.isposinf(out[0]).all() and np.isneginf(out[1]).all() and np.isnan(out[2]).all()
    assert (out[3] == 2.0).all() and np.isposinf(out[4]).all()


@pytest.mark.parametrize("trans_a,trans_b", TRANS)
def test_matches_the_rounded_float64_product_past_tile_and_block_edges(isa, trans_a, trans_b):
    r = rng(2)
    mr, nr, mc, kc = MR[isa], NR[isa], MC[isa], KC_OF.get(isa, KC)
    shapes = [(1, 1, 1), (7, 1, 3), (mr + 1, nr - 1, 37), (2 * mr + 1, 2 * nr + 1, kc + 1),
              (3, 70, 600), (mc + 1, nr + 3, 40), (5, 300, 256), (5, 40, 2 * kc + 3)]
    for m, n, k in shapes:
        a, b = operand(r, m, k, trans_a), operand(r, k, n, trans_b)
        big, out = padded_out((m, n), fill=1.0)
        out0 = out.copy()
        _C.gemm(a, b, out, trans_a, trans_b, alpha=-1.5, accumulate=True, bf16=True)
        assert_close(out, a, b, trans_a, trans_b, alpha=-1.5, out0=out0)
        assert (outside(big, (m, n)) == 1).all()
        big, out = padded_out((m, n))
        _C.gemm(a, b, out, trans_a, trans_b, bf16=True)
        assert_close(out, a, b, trans_a, trans_b)
        assert np.isnan(outside(big, (m, n))).all()


def test_the_unrounded_product_would_fail_these_tolerances():
    r = rng(3)
    a, b = operand(r, 64, 300, False), operand(r, 300, 50, False)
    diff = np.abs(ops.matmul(a, b).astype(np.float64) - expected(a, b, False, False)).max()
    assert diff > 10 * tolerance(a, b, False)


def test_few_rows_times_transposed_b_are_rounded_too(isa):
    """fp32 takes a dot-product path here (no packing); bf16 must not."""
    r = rng(4)
    for m, n, k in [(1, 100, 64), (8, 70, 512), (24, 33, 1024)]:
        a, b = operand(r, m, k, False), operand(r, k, n, True)
        assert_close(ops.matmul(a, b, trans_b=True, precision="bf16"), a, b, False, True)


@pytest.mark.parametrize("trans_a,trans_b", TRANS)
def test_batched_head_views_in_place(isa, trans_a, trans_b):
    r = rng(5)
    B, H, Tq, Tk, dh = 2, 3, 5, 7, 16
    q = r.uniform(-1, 1, (B, Tq, H * dh)).astype(np.float32).reshape(B, Tq, H, dh).transpose(0, 2, 1, 3)
    k = r.uniform(-1, 1, (B, Tk, H * dh)).astype(np.float32).reshape(B, Tk, H, dh).transpose(0, 2, 1, 3)
    a = np.ascontiguousarray(np.swapaxes(q, -1, -2)) if trans_a else q
    b = k if trans_b else np.ascontiguousarray(np.swapaxes(k, -1, -2))
    out = np.empty((B, H, Tq, Tk), np.float32)
    _C.gemm(a, b, out, trans_a, trans_b, bf16=True)
    assert_close(out, a, b, trans_a, trans_b)


@pytest.mark.parametrize("trans_a,trans_b", TRANS)
def test_bits_do_not_depend_on_threads_or_schedule(isa, threads, trans_a, trans_b):
    r = rng(6)
    forced_cases = [((), 300, 200, 300), ((), 5, 900, 300), ((), 3, 3000, 70), ((8,), 60, 70, 180),
                    ((), 2 * MR[isa] + 3, 2 * NR[isa] + 1, KC_OF.get(isa, KC) + 3)]
    try:
        for batch, m, n, k in forced_cases:
            a = r.uniform(-1, 1, batch + ((k, m) if trans_a else (m, k))).astype(np.float32)
            b = r.uniform(-1, 1, batch + ((n, k) if trans_b else (k, n))).astype(np.float32)
            T.set_num_threads(1)
            _C._gemm_force_schedule("auto")
            want = np.ones(batch + (m, n), np.float32)
            _C.gemm(a, b, want, trans_a, trans_b, alpha=0.3, accumulate=True, bf16=True)
            assert_close(want, a, b, trans_a, trans_b, 0.3, np.ones(batch + (m, n), np.float32))
            for schedule in ("auto", "tiles", "shared"):
                _C._gemm_force_schedule(schedule, all_threads=schedule != "auto")
                for nthreads in THREADS:
                    T.set_num_threads(nthreads)
                    out = np.ones(batch + (m, n), np.float32)
                    _C.gemm(a, b, out, trans_a, trans_b, alpha=0.3, accumulate=True, bf16=True)
                    assert_same_bits(out, want, f"{schedule} on {nthreads} threads, {batch + (m, n, k)}")
    finally:
        _C._gemm_force_schedule("auto")


def panels_of(opb, nr):
    """op(b) [K, N] as gemm_pack_b lays it out: [ceil(N / NR)][K][NR], zero past N."""
    k, n = opb.shape
    padded = np.zeros((k, -(-n // nr) * nr), np.float32)
    padded[:, :n] = opb
    return np.ascontiguousarray(padded.reshape(k, -1, nr).transpose(1, 0, 2))


def unpack(packed, k, isa):
    """The values a pre-packed bf16 operand holds, [panels][K][NR] (csrc/gemm.h): floats with the
    low 16 bits zero, or at avx2, avx512_bf16 and amx the first ceil(K / 2) rows of each panel as bf16 pairs
    (k = 2t in the low half of row t, 2t + 1 in the high half)."""
    words = packed.data.view(np.uint32).reshape(-1, k, NR[isa])
    if isa not in PAIRS:
        assert (words & 0xFFFF == 0).all()
        return words.view(np.float32)
    pairs = words[:, : (k + 1) // 2]
    both = np.stack([pairs << 16, pairs & 0xFFFF0000], axis=2)   # [panels][pairs][2][NR]
    both = both.reshape(pairs.shape[0], -1, NR[isa])
    if k % 2:
        assert (both[:, k] == 0).all()   # the odd K's padding
    return np.ascontiguousarray(both[:, :k]).view(np.float32)


@pytest.mark.parametrize("trans_b", [False, True])
def test_packed_b_is_rounded_once_and_a_on_every_call(isa, threads, trans_b):
    r = rng(7)
    kc = KC_OF.get(isa, KC)
    for m, n, k in [(1, 1, 1), (3, NR[isa] - 1, kc + 1), (8, 5 * NR[isa] + 3, 512), (MC[isa] + 5, 20, 40),
                    (4, 33, 2 * kc + 3)]:
        a, b = operand(r, m, k, False), operand(r, k, n, trans_b)
        packed = _C.gemm_pack_b(b, trans_b=trans_b, bf16=True)
        assert packed.precision == "bf16"
        assert_same_bits(unpack(packed, k, isa), panels_of(bf16(b.T if trans_b else b), NR[isa]),
                         "packed panels")
        want = np.empty((m, n), np.float32)
        T.set_num_threads(1)
        _C.gemm_packed(a, packed, want)
        assert_close(want, a, b, False, trans_b)
        for nthreads in THREADS:
            T.set_num_threads(nthreads)
            got = np.ones((m, n), np.float32)
            _C.gemm_packed(a, packed, got, alpha=2.0, accumulate=True)
            assert_close(got, a, b, False, trans_b, alpha=2.0, out0=np.ones((m, n), np.float32))
            got = np.empty((m, n), np.float32)
            _C.gemm_packed(a, packed, got)
            assert_same_bits(got, want, f"packed on {nthreads} threads")


def test_packed_bf16_has_the_bits_of_gemm_bf16_narrow(isa):
    r = rng(8)
    for m, n, k in [(3, 70, 600), (MR[isa] + 2, NR[isa] * 3 + 1, 513)]:
        a, b = operand(r, m, k, False), operand(r, k, n, False)
        want, got = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
        _C.gemm(a, b, want, bf16=True)
        assert _C._gemm_stats()["schedule"] == "narrow"
        _C.gemm_packed(a, _C.gemm_pack_b(b, bf16=True), got)
        assert_same_bits(got, want, f"packed vs narrow {(m, n, k)}")


def test_matmul_precision_is_checked():
    a = np.ones((2, 3), np.float32)
    for bad in ("fp16", "BF16", None, 16):
        with pytest.raises(ValueError, match="precision must be one of 'fp32', 'bf16', 'int8'"):
            ops.matmul(a, a.T, precision=bad)
    with pytest.raises(ValueError, match="precision='int8' is not available for matmul"):
        ops.matmul(a, a.T, precision="int8")
    assert np.array_equal(ops.matmul(a, a.T, precision="fp32"), np.full((2, 2), 3, np.float32))


@pytest.mark.skipif("amx" not in ALL_ISA_LEVELS, reason="this CPU has no AMX tiles")
def test_amx_tiles_survive_another_librarys_tile_configuration():
    """Tile configuration is per thread and PyTorch's oneDNN configures its own on the same
    (calling) thread: every GEMM configures on entry (csrc/amx.h), so results keep their bits
    whatever ran in between."""
    torch = pytest.importorskip("torch")
    r = rng(9)
    a, b = operand(r, 100, 300, False), operand(r, 300, 70, True)
    _C.set_isa("amx")
    try:
        want = ops.matmul(a, b.T, precision="bf16")
        assert_close(want, a, b, False, True)
        x = torch.randn(64, 96, dtype=torch.bfloat16)
        y = torch.randn(96, 48, dtype=torch.bfloat16)
        for _ in range(3):
            torch.matmul(x, y)   # oneDNN's AMX kernels, its tile shapes
            assert_same_bits(ops.matmul(a, b.T, precision="bf16"), want, "after torch's tiles")
    finally:
        _C.set_isa(_C.best_isa())
