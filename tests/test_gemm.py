"""GEMM: out = alpha * op(a) @ op(b) (+ out when accumulate), batched over 0, 1 or 2 axes.

Every result is compared with numpy in float64. Tolerance (stated once): float32 products summed
over K in float32 may be off by about K * 2**-24 * |a| * |b| in the worst case and far less in
practice, so we allow TOL * K * max|a| * max|b| * |alpha| (plus TOL * max|out| when adding into
out) with TOL = 1e-6; every failure prints the largest difference found.
"""
import numpy as np
import pytest

import transformer as T
from transformer import _C, ops

TOL = 1e-6
TRANS = [(False, False), (False, True), (True, False), (True, True)]

# Register tiles and cache blocks of each micro-kernel (csrc/gemm/: each instruction set's file).
# avx512_vnni, avx512_bf16 and amx run AVX-512's fp32 kernels; avx512_bf16's bf16 kernel (vdpbf16ps)
# has AVX-512's tile and blocks, amx's bf16 tile kernel its own (test_gemm_bf16.py).
# ARM64's neon level runs avx2's kernels (through SIMDe): avx2's tile and blocks.
MR = {"generic": 4, "avx2": 6, "neon": 6, "neon_dotprod": 6, "avx512": 14, "avx512_vnni": 14, "avx512_bf16": 14, "amx": 14}
NR = {"generic": 8, "avx2": 16, "neon": 16, "neon_dotprod": 16, "avx512": 32, "avx512_vnni": 32, "avx512_bf16": 32, "amx": 32}
KC = 256
MC = {"generic": 128, "avx2": 144, "neon": 144, "neon_dotprod": 144, "avx512": 336, "avx512_vnni": 336, "avx512_bf16": 336, "amx": 336}
NC = {"generic": 2048, "avx2": 4096, "neon": 4096, "neon_dotprod": 4096, "avx512": 4096, "avx512_vnni": 4096, "avx512_bf16": 4096, "amx": 4096}
# Thread counts whose results must be bitwise identical (more than the 2 cores: oversubscribed).
THREADS = (1, 2, 3, 4, 7, 16)
# The shared schedule gives each thread at least this many MR-row panels before splitting columns.
SHARED_PANELS = 3


def rng(seed=0):
    return np.random.default_rng(seed)


def operand(r, rows, cols, trans):
    """A random float32 matrix holding op(x) as rows x cols (stored transposed when trans)."""
    x = r.uniform(-1, 1, (cols, rows) if trans else (rows, cols)).astype(np.float32)
    return x


def expected(a, b, trans_a, trans_b, alpha=1.0, out0=None):
    a64 = np.swapaxes(a, -1, -2) if trans_a else a
    b64 = np.swapaxes(b, -1, -2) if trans_b else b
    r = alpha * (a64.astype(np.float64) @ b64.astype(np.float64))
    return r if out0 is None else r + out0.astype(np.float64)


def assert_close(got, a, b, trans_a, trans_b, alpha=1.0, out0=None):
    want = expected(a, b, trans_a, trans_b, alpha, out0)
    k = a.shape[-2] if trans_a else a.shape[-1]
    scale = max(k, 1) * max(np.abs(a).max(initial=0), 1e-30) * max(np.abs(b).max(initial=0), 1e-30) * abs(alpha)
    if out0 is not None:
        scale += np.abs(out0).max(initial=0)
    diff = np.abs(got.astype(np.float64) - want).max(initial=0)
    assert diff <= TOL * scale, f"max difference {diff:.3g} > {TOL * scale:.3g}"


def padded_out(shape, fill=np.nan):
    """An out view inside a larger NaN-filled buffer: the kernel must write exactly the view
    (no stray writes past an edge tile, and it must not read out when not accumulating)."""
    rows, cols = shape[-2], shape[-1]
    big = np.full(shape[:-2] + (rows + 2, cols + 7), fill, dtype=np.float32)
    return big, big[..., 1:rows + 1, 3:cols + 3]


def outside(big, shape):
    mask = np.ones(big.shape, dtype=bool)
    mask[..., 1:shape[-2] + 1, 3:shape[-1] + 3] = False
    return big[mask]


def assert_same_bits(got, want, what):
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), \
        f"{what}: bits differ, max difference {np.abs(got - want).max():.3g}"


@pytest.fixture
def forced():
    """Force a schedule with _C._gemm_force_schedule(...); the normal choice is restored afterwards."""
    yield _C._gemm_force_schedule
    _C._gemm_force_schedule("auto")


def shapes_past_boundaries(isa):
    """(M, N, K) just around each tile and block edge of this micro-kernel."""
    mr, nr, mc = MR[isa], NR[isa], MC[isa]
    out = [(1, 1, 1), (1, 1, 7), (7, 1, 3), (1, 13, 5), (3, 5, 1), (17, 19, 23)]
    for m in (mr - 1, mr, mr + 1, 2 * mr + 1):
        out.append((m, nr + 3, 37))
    for n in (nr - 1, nr, nr + 1, 2 * nr - 1, 2 * nr + 1):
        out.append((mr + 2, n, 29))
    for k in (KC - 1, KC, KC + 1, 2 * KC + 1):
        out.append((mr + 1, nr + 1, k))
    for m in (mc - 1, mc + 1):
        out.append((m, nr - 1, 11))
    return out


@pytest.mark.parametrize("trans_a,trans_b", TRANS)
def test_matches_float64_past_every_tile_and_block_edge(isa, trans_a, trans_b):
    r = rng(1)
    for m, n, k in shapes_past_boundaries(isa):
        a, b = operand(r, m, k, trans_a), operand(r, k, n, trans_b)
        big, out = padded_out((m, n))
        _C.gemm(a, b, out, trans_a, trans_b)
        assert_close(out, a, b, trans_a, trans_b)
        assert np.isnan(outside(big, (m, n))).all(), f"wrote outside out for {(m, n, k)}"


def test_wide_output_past_the_n_block():
    r = rng(2)
    for trans_a, trans_b in TRANS:
        a, b = operand(r, 3, 5, trans_a), operand(r, 5, 4097, trans_b)
        out = np.empty((3, 4097), np.float32)
        _C.gemm(a, b, out, trans_a, trans_b)
        assert_close(out, a, b, trans_a, trans_b)


@pytest.mark.parametrize("trans_a,trans_b", TRANS)
def test_accumulate_adds_alpha_times_product(isa, trans_a, trans_b):
    r = rng(3)
    for m, n, k in [(1, 1, 1), (15, 33, 257), (29, 17, 40)]:
        a, b = operand(r, m, k, trans_a), operand(r, k, n, trans_b)
        out0 = r.uniform(-1, 1, (m, n)).astype(np.float32)
        out = out0.copy()
        _C.gemm(a, b, out, trans_a, trans_b, alpha=-0.75, accumulate=True)
        assert_close(out, a, b, trans_a, trans_b, alpha=-0.75, out0=out0)
        out = out0.copy()
        _C.gemm(a, b, out, trans_a, trans_b, alpha=2.5)
        assert_close(out, a, b, trans_a, trans_b, alpha=2.5)


def test_empty_dimensions():
    r = rng(4)
    for m, n in [(0, 5), (5, 0), (0, 0)]:
        a, b = operand(r, m, 3, False), operand(r, 3, n, False)
        out = np.empty((m, n), np.float32)
        assert _C.gemm(a, b, out) is out
    # K = 0: an empty sum is zero, and accumulating it leaves out unchanged
    for trans_a, trans_b in TRANS:
        a, b = operand(r, 4, 0, trans_a), operand(r, 0, 6, trans_b)
        out = np.full((4, 6), np.nan, np.float32)
        _C.gemm(a, b, out, trans_a, trans_b)
        assert (out == 0).all()
        out[:] = 7
        _C.gemm(a, b, out, trans_a, trans_b, accumulate=True)
        assert (out == 7).all()
    # empty batch
    _C.gemm(np.ones((0, 2, 3), np.float32), np.ones((0, 3, 4), np.float32), np.empty((0, 2, 4), np.float32))


@pytest.mark.parametrize("trans_a,trans_b", TRANS)
def test_fast_kernel_agrees_with_the_naive_reference(isa, trans_a, trans_b):
    r = rng(5)
    for m, n, k in [(1, 1, 1), (MR[isa] + 1, NR[isa] - 1, 3), (31, 65, 257), (2, 300, 19)]:
        a, b = operand(r, m, k, trans_a), operand(r, k, n, trans_b)
        fast, slow = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
        _C.gemm(a, b, fast, trans_a, trans_b, alpha=0.5)
        _C.gemm_reference(a, b, slow, trans_a, trans_b, alpha=0.5)
        assert_close(fast, a, b, trans_a, trans_b, alpha=0.5)
        # the reference sums in double and rounds once
        want = expected(a, b, trans_a, trans_b, 0.5)
        assert np.abs(slow - want).max() <= 1e-7 * (np.abs(want).max() + 1)
        diff = np.abs(fast - slow).max()
        assert diff <= TOL * k, f"fast vs reference max difference {diff:.3g}"


def test_few_rows_times_transposed_b(isa):
    """Decoding shapes, x @ W^T with 1..25 rows (AVX-512: dot products without packing,
    4 x 4 tiles, K in 16-wide steps plus a tail)."""
    r = rng(13)
    for m in (1, 2, 3, 4, 5, 7, 24, 25):
        for n in (1, 3, 4, 5, 9):
            for k in (64, 65, 79, 80, 127, 257):
                a, b = operand(r, m, k, False), operand(r, k, n, True)
                big, out = padded_out((m, n))
                _C.gemm(a, b, out, False, True, alpha=0.5)
                assert_close(out, a, b, False, True, alpha=0.5)
                assert np.isnan(outside(big, (m, n))).all(), f"wrote outside out for {(m, n, k)}"
                out0 = r.uniform(-1, 1, (m, n)).astype(np.float32)
                out[...] = out0
                _C.gemm(a, b, out, False, True, alpha=-2.0, accumulate=True)
                assert_close(out, a, b, False, True, alpha=-2.0, out0=out0)


def head_view(x, batch, length, heads):
    """[B, T, H*dh] -> the [B, H, T, dh] view, no copy (as attention reads its heads)."""
    return x.reshape(batch, length, heads, -1).transpose(0, 2, 1, 3)


@pytest.mark.parametrize("trans_a,trans_b", TRANS)
def test_batched_head_views_in_place(isa, trans_a, trans_b):
    """4-D [B, H, T, dh] views of [B, T, D] arrays as inputs and as out (Q K^T and P V shapes)."""
    r = rng(6)
    B, H, T, S, dh = 2, 3, 17, 13, 8
    q = r.uniform(-1, 1, (B, T, H * dh)).astype(np.float32)
    # op(a) = [T, dh] or stored transposed [dh, T]: build a from a head view either way
    qa = head_view(q, B, T, H)                          # [B, H, T, dh]
    a = np.swapaxes(qa, -1, -2) if trans_a else qa      # stored so that op(a) = [T, dh]
    if trans_a:  # a must have a unit-stride last axis: use a fresh [B, H, dh, T] array
        a = np.ascontiguousarray(a)
    kv = r.uniform(-1, 1, (B, S, H * dh)).astype(np.float32)
    kh = head_view(kv, B, S, H)                         # [B, H, S, dh]
    b = kh if trans_b else np.ascontiguousarray(np.swapaxes(kh, -1, -2))   # op(b) = [dh, S]
    scores = np.full((B, T, H * S + 5), np.nan, np.float32)
    out = scores[:, :, :H * S].reshape(B, T, H, S).transpose(0, 2, 1, 3)   # [B, H, T, S] view
    assert not out.flags.c_contiguous and np.shares_memory(out, scores)
    _C.gemm(a, b, out, trans_a, trans_b)
    assert_close(out, a, b, trans_a, trans_b)
    assert np.isnan(scores[:, :, H * S:]).all()
    # and back: P [B, H, T, S] @ V [B, H, S, dh] written into a [B, T, H*dh] head view
    p = r.uniform(0, 1, (B, H, T, S)).astype(np.float32)
    pa = np.ascontiguousarray(np.swapaxes(p, -1, -2)) if trans_a else p
    vb = np.ascontiguousarray(np.swapaxes(kh, -1, -2)) if trans_b else kh
    ctx = np.full((B, T, H * dh), np.nan, np.float32)
    _C.gemm(pa, vb, head_view(ctx, B, T, H), trans_a, trans_b, alpha=0.5)
    assert_close(head_view(ctx, B, T, H), pa, vb, trans_a, trans_b, alpha=0.5)


@pytest.mark.parametrize("trans_a,trans_b", TRANS)
def test_batched_broadcast_operands(isa, trans_a, trans_b):
    r = rng(7)
    m, n, k = 9, 35, 21
    for nd in (3, 4):
        batch = (4,) if nd == 3 else (2, 3)
        w = operand(r, k, n, trans_b)
        b = np.broadcast_to(w, batch + w.shape)          # batch strides 0
        a = r.uniform(-1, 1, batch + ((k, m) if trans_a else (m, k))).astype(np.float32)
        out = np.empty(batch + (m, n), np.float32)
        _C.gemm(a, b, out, trans_a, trans_b)
        assert_close(out, a, b, trans_a, trans_b)
        x = operand(r, m, k, trans_a)
        a = np.broadcast_to(x, batch + x.shape)
        b = r.uniform(-1, 1, batch + ((n, k) if trans_b else (k, n))).astype(np.float32)
        out0 = r.uniform(-1, 1, batch + (m, n)).astype(np.float32)
        out = out0.copy()
        _C.gemm(a, b, out, trans_a, trans_b, alpha=3.0, accumulate=True)
        assert_close(out, a, b, trans_a, trans_b, alpha=3.0, out0=out0)
    if nd == 4:  # broadcast along one of the two batch axes only
        a = np.broadcast_to(r.uniform(-1, 1, (2, 1, m, k) if not trans_a else (2, 1, k, m)).astype(np.float32),
                            (2, 3) + ((k, m) if trans_a else (m, k)))
        b = r.uniform(-1, 1, (2, 3) + ((n, k) if trans_b else (k, n))).astype(np.float32)
        out = np.empty((2, 3, m, n), np.float32)
        _C.gemm(a, b, out, trans_a, trans_b)
        assert_close(out, a, b, trans_a, trans_b)


def test_many_small_batched_matrices_like_attention(isa):
    r = rng(8)
    for bh, t, dh in [(16, 8, 16), (12, 33, 17), (5, 64, 64)]:
        q = r.uniform(-1, 1, (bh, t, dh)).astype(np.float32)
        k = r.uniform(-1, 1, (bh, t, dh)).astype(np.float32)
        s = np.empty((bh, t, t), np.float32)
        _C.gemm(q, k, s, False, True, alpha=dh ** -0.5)
        assert_close(s, q, k, False, True, alpha=dh ** -0.5)
        o = np.empty((bh, t, dh), np.float32)
        _C.gemm(s, k, o)
        assert_close(o, s, k, False, False)


@pytest.mark.parametrize("trans_a,trans_b", TRANS)
def test_result_bits_do_not_depend_on_thread_count(isa, threads, trans_a, trans_b):
    r = rng(9)
    # shared B block (large M, also with several N blocks and K blocks), per-thread column ranges
    # (few rows), batch entries split over threads, and tiny products that stay on one thread
    cases = [((), 300, 200, 300), ((), 100, 1100, 2050), ((), 5, 900, 300), ((), 20, 3000, 300), ((), 3, 30000, 70),
             ((), 700, 3, 64), ((8,), 60, 70, 180), ((3,), 200, 150, 100), ((2, 5), 33, 31, 65),
             ((), 400, 300, 200), ((2,), 350, 100, 100)]
    if isa != "generic":   # many rows, several column blocks and K blocks (slow in plain C)
        cases.append(((), 337, 1000, 2100))
    for batch, m, n, k in cases:
        a = r.uniform(-1, 1, batch + ((k, m) if trans_a else (m, k))).astype(np.float32)
        b = r.uniform(-1, 1, batch + ((n, k) if trans_b else (k, n))).astype(np.float32)
        results = []
        for nthreads in THREADS:
            T.set_num_threads(nthreads)
            out = np.ones(batch + (m, n), np.float32)
            _C.gemm(a, b, out, trans_a, trans_b, alpha=0.3, accumulate=True)
            results.append(out)
            assert_same_bits(out, results[0], f"{nthreads} vs 1 threads, {batch + (m, n, k)}")
        assert_close(results[0], a, b, trans_a, trans_b, alpha=0.3, out0=np.ones(batch + (m, n), np.float32))


@pytest.mark.parametrize("trans_a,trans_b", TRANS)
def test_every_schedule_on_one_thread(isa, threads, trans_a, trans_b):
    """Few rows with all of op(A) packed (B read in place or packed per panel), and many rows
    with B packed per block, each across several K blocks and (for many rows) N blocks."""
    T.set_num_threads(1)
    r = rng(12)
    for m, n, k in [(3, 70, 600), (MR[isa] * 2, NR[isa] * 3 + 1, 513), (2 * MR[isa] + 1, 70, 600),
                    (MC[isa] + 1, 4097, 300), (MC[isa] - 1, 65, 1100)]:
        a, b = operand(r, m, k, trans_a), operand(r, k, n, trans_b)
        big, out = padded_out((m, n), fill=1.0)
        _C.gemm(a, b, out, trans_a, trans_b, alpha=-1.5, accumulate=True)
        assert_close(out, a, b, trans_a, trans_b, alpha=-1.5, out0=np.ones((m, n), np.float32))
        assert (outside(big, (m, n)) == 1).all()


# ---------------------------------------------------------------------------
# Multi-thread schedules. "tiles" (a few threads: each packs its own B blocks) and "shared" (many
# threads: the team packs each B block once, then splits the rows of C) must give the bits of the
# one-thread schedule for every team, split and edge; forced with every thread of the process
# started even for small products, so 7 and 16 threads meet empty and one-panel shares. "lazy":
# odd threads of the shared schedule leave their own share to the others (what happens to the
# share of a thread the OS stalls), so taking another thread's work is always exercised.

def shared_edge_cases(isa):
    """(batch, M, N, K) around the shared schedule's edges: register tiles, the row split (a thread
    needs SHARED_PANELS row panels: 16 threads split rows 16 ways from 16 * 3 * MR rows on), the MC
    row chunks, the K blocks (fixed, so several K blocks meet the double-buffered barrier), the N block."""
    mr, nr, mc = MR[isa], NR[isa], MC[isa]
    rows16 = 16 * SHARED_PANELS * mr
    return [((), 1, 1, 1), ((), mr - 1, nr + 1, KC + 1), ((), 2 * mr + 1, 2 * nr - 1, 2 * KC + 1),
            ((), rows16 - 1, nr + 3, 40), ((), rows16 + 1, 2 * nr + 1, KC - 1), ((), mc + 1, 3 * nr + 1, 70),
            ((), 2 * mc + 5, 50, 300), ((), 2 * mr + 3, NC[isa] + nr + 1, 20),
            ((3,), 4 * mr + 1, nr + 5, KC + 3), ((2, 2), 3 * mr, 2 * nr, 33)]


@pytest.mark.parametrize("trans_a,trans_b", TRANS)
def test_tiles_and_shared_schedules_give_the_one_thread_bits(isa, threads, forced, trans_a, trans_b):
    r = rng(14)
    for batch, m, n, k in shared_edge_cases(isa):
        a = r.uniform(-1, 1, batch + ((k, m) if trans_a else (m, k))).astype(np.float32)
        b = r.uniform(-1, 1, batch + ((n, k) if trans_b else (k, n))).astype(np.float32)
        out0 = r.uniform(-1, 1, batch + (m, n)).astype(np.float32)
        T.set_num_threads(1)
        forced("auto")
        want = out0.copy()
        _C.gemm(a, b, want, trans_a, trans_b, alpha=-0.7, accumulate=True)
        assert_close(want, a, b, trans_a, trans_b, alpha=-0.7, out0=out0)
        for schedule, lazy in (("tiles", False), ("shared", False), ("shared", True)):
            forced(schedule, all_threads=True, lazy=lazy)
            for nthreads in THREADS:
                T.set_num_threads(nthreads)
                big, out = padded_out(batch + (m, n), fill=np.nan)
                out[...] = out0
                _C.gemm(a, b, out, trans_a, trans_b, alpha=-0.7, accumulate=True)
                what = f"{schedule} (lazy={lazy}) on {nthreads} threads, {batch + (m, n, k)}"
                assert_same_bits(out, want, what)
                assert np.isnan(outside(big, batch + (m, n))).all(), f"{what}: wrote outside out"
                if nthreads == 16:   # and without accumulating: out is written, never read
                    out[...] = np.nan
                    _C.gemm(a, b, out, trans_a, trans_b, alpha=2.0)
                    assert_close(out, a, b, trans_a, trans_b, alpha=2.0)


@pytest.mark.parametrize("trans_a,trans_b", TRANS)
def test_shared_schedule_on_head_views_and_broadcast_operands(isa, threads, forced, trans_a, trans_b):
    """4-D [B, H, T, dh] views in place (strided batch axes for a, b and out), and a weight
    broadcast over the batch (stride 0), with several K blocks, on 1..16 threads."""
    r = rng(15)
    B, H, L, dh = 2, 2, 3 * MR[isa] + 5, 40
    q = r.uniform(-1, 1, (B, L, H * dh)).astype(np.float32)
    a = np.ascontiguousarray(np.swapaxes(head_view(q, B, L, H), -1, -2)) if trans_a else head_view(q, B, L, H)
    w = operand(r, dh, 2 * NR[isa] + 3, trans_b)   # op(w): [dh, n]
    n = 2 * NR[isa] + 3
    wide = r.uniform(-1, 1, (B, H) + ((n, KC + 9) if trans_b else (KC + 9, n))).astype(np.float32)
    p = r.uniform(-1, 1, (B, H) + ((KC + 9, L) if trans_a else (L, KC + 9))).astype(np.float32)
    cases = [(a, np.broadcast_to(w, (B, H) + w.shape)), (p, wide)]
    for x, y in cases:
        ctx0 = r.uniform(-1, 1, (B, L, H * y.shape[-2 if trans_b else -1])).astype(np.float32)
        T.set_num_threads(1)
        forced("auto")
        want = ctx0.copy()
        _C.gemm(x, y, head_view(want, B, L, H), trans_a, trans_b, alpha=0.5, accumulate=True)
        assert_close(head_view(want, B, L, H), x, y, trans_a, trans_b, alpha=0.5, out0=head_view(ctx0, B, L, H))
        for nthreads in THREADS:
            forced("shared", all_threads=True, lazy=nthreads % 2 == 1)
            T.set_num_threads(nthreads)
            got = ctx0.copy()
            _C.gemm(x, y, head_view(got, B, L, H), trans_a, trans_b, alpha=0.5, accumulate=True)
            assert_same_bits(got, want, f"shared on {nthreads} threads, {x.shape} @ {y.shape}")


def test_shared_schedule_packs_each_b_block_once_whatever_the_team(threads, forced):
    """The point of the shared schedule: op(B) is packed K * N floats in all, on any team, and op(A)
    M * K per N block (rows are split, not repacked), plus the rows of any work a thread takes from
    another (lazy: odd threads leave all theirs). (Tiles pack B once per thread that takes a tile of
    the column block: how often depends on which threads the OS runs, so no count here.)"""
    r = rng(16)
    isa = _C.best_isa()
    m, n, k = 16 * SHARED_PANELS * MR[isa] + 7, 3 * NR[isa] + 5, 2 * KC + 3   # every team splits rows only
    a, b = operand(r, m, k, False), operand(r, k, n, False)
    out = np.empty((m, n), np.float32)
    for nthreads in THREADS:
        for lazy in (False, True):
            forced("shared", all_threads=True, lazy=lazy)
            T.set_num_threads(nthreads)
            _C._gemm_stats(reset=True)
            _C.gemm(a, b, out)
            stats = _C._gemm_stats(reset=True)
            assert stats["schedule"] == "shared"
            assert stats["packed_b"] == k * n, f"{nthreads} threads packed {stats['packed_b']} floats of B, not {k * n}"
            # each thread owns m / nthreads rows; a taken unit repacks at most its owner's rows
            most = m * k + stats["taken"] * -(-m // nthreads) * KC
            assert m * k <= stats["packed_a"] <= most, f"{nthreads} threads packed {stats['packed_a']} floats of A"
            if lazy and nthreads > 1:
                assert stats["taken"] >= 3 * (nthreads // 2), "odd threads' work was not taken by others"
            assert_close(out, a, b, False, False)


def test_many_threads_choose_the_shared_schedule_for_large_products(threads):
    """The rule: one thread runs alone; a few threads share tiles; many threads (16) on a product
    with many rows share B blocks; few rows, many batch entries and A @ B^T with few rows keep
    their own schedules."""
    r = rng(17)
    isa = _C.best_isa()

    def schedule(batch, m, n, k, trans_b=False):
        a = r.uniform(-1, 1, batch + (m, k)).astype(np.float32)
        b = r.uniform(-1, 1, batch + ((n, k) if trans_b else (k, n))).astype(np.float32)
        out = np.empty(batch + (m, n), np.float32)
        _C._gemm_stats(reset=True)
        _C.gemm(a, b, out, False, trans_b)
        assert_close(out, a, b, False, trans_b)
        return _C._gemm_stats(reset=True)

    large = ((), 2 * MC[isa] + 1, 300, 200)           # > 2**25 multiply-adds: enough for 16 threads
    T.set_num_threads(1)
    assert schedule(*large)["schedule"] == "private"
    T.set_num_threads(2)
    assert schedule(*large)["schedule"] == "shared"
    T.set_num_threads(16)
    stats = schedule(*large)
    assert stats["schedule"] == "shared" and stats["packed_b"] == 300 * 200
    assert schedule((), 5, 20000, 400)["schedule"] == "narrow"
    assert schedule((64,), 100, 100, 64)["schedule"] == "by_batch"
    if isa.startswith("avx512"):
        assert schedule((), 3, 30000, 400, trans_b=True)["schedule"] == "dot"


def test_force_schedule_refuses_unknown_names(forced):
    with pytest.raises(ValueError, match="schedule"):
        forced("fastest")


# ---------------------------------------------------------------------------
# Bad input: refused with an error naming the argument.

def good(m=4, n=5, k=3):
    return (np.ones((m, k), np.float32), np.ones((k, n), np.float32), np.zeros((m, n), np.float32))


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, object])
@pytest.mark.parametrize("which", [0, 1, 2])
def test_wrong_dtype_is_a_type_error(dtype, which):
    args = list(good())
    args[which] = args[which].astype(dtype)
    with pytest.raises(TypeError, match=["a", "b", "out"][which]):
        _C.gemm(*args)


def test_not_an_array_is_a_type_error():
    a, b, out = good()
    with pytest.raises(TypeError, match="a"):
        _C.gemm(a.tolist(), b, out)
    with pytest.raises(TypeError, match="out"):
        _C.gemm(a, b, None)


def test_alpha_must_be_a_number():
    with pytest.raises(TypeError, match="alpha"):
        _C.gemm(*good(), alpha="2")
    with pytest.raises(TypeError, match="alpha"):
        _C.gemm(*good(), alpha=None)
    a, b, out = good()
    _C.gemm(a, b, out, alpha=np.float64(2))
    assert (out == 6).all()


def test_wrong_rank_is_a_value_error():
    a, b, out = good()
    with pytest.raises(ValueError, match="a"):
        _C.gemm(np.ones(3, np.float32), b, out)
    with pytest.raises(ValueError, match="a"):
        _C.gemm(np.ones((1, 1, 1, 4, 3), np.float32), np.ones((1, 1, 1, 3, 5), np.float32),
                np.empty((1, 1, 1, 4, 5), np.float32))
    with pytest.raises(ValueError, match="b"):
        _C.gemm(a, b[None], out)
    with pytest.raises(ValueError, match="out"):
        _C.gemm(a, b, out[None])


def test_mismatched_shapes_are_value_errors():
    a, b, out = good()
    with pytest.raises(ValueError, match="a and b"):
        _C.gemm(a, np.ones((4, 5), np.float32), out)
    with pytest.raises(ValueError, match="a and b"):
        _C.gemm(a, b, out, trans_a=True)
    with pytest.raises(ValueError, match="out"):
        _C.gemm(a, b, np.empty((4, 6), np.float32))
    with pytest.raises(ValueError, match="out"):
        _C.gemm(a, b, np.empty((5, 4), np.float32))
    # batch sizes
    with pytest.raises(ValueError, match="b"):
        _C.gemm(np.ones((2, 4, 3), np.float32), np.ones((3, 3, 5), np.float32), np.empty((2, 4, 5), np.float32))
    with pytest.raises(ValueError, match="a"):
        _C.gemm(np.ones((3, 4, 3), np.float32), np.ones((2, 3, 5), np.float32), np.empty((2, 4, 5), np.float32))
    with pytest.raises(ValueError, match="a"):
        _C.gemm(np.ones((2, 2, 4, 3), np.float32), np.ones((2, 3, 3, 5), np.float32),
                np.empty((2, 3, 4, 5), np.float32))


def test_bad_strides_are_value_errors():
    a, b, out = good()
    with pytest.raises(ValueError, match="a"):
        _C.gemm(np.ones((4, 6), np.float32)[:, ::2], b, out)      # last axis not unit stride
    with pytest.raises(ValueError, match="b"):
        _C.gemm(a, b[::-1], out)                                   # negative stride
    with pytest.raises(ValueError, match="out"):
        _C.gemm(a, b, np.empty((5, 4), np.float32).T)
    raw = np.zeros(4 * 15 + 1, np.uint8)
    unaligned = np.frombuffer(raw.data, dtype=np.float32, count=15, offset=1).reshape(5, 3)
    with pytest.raises(ValueError, match="a"):
        _C.gemm(unaligned[:4], b, out)


def test_read_only_out_is_refused():
    a, b, out = good()
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out"):
        _C.gemm(a, b, out)


def test_out_overlapping_an_input_is_refused():
    x = np.ones((4, 4), np.float32)
    with pytest.raises(ValueError, match="out must not overlap a"):
        _C.gemm(x, np.ones((4, 4), np.float32), x)
    with pytest.raises(ValueError, match="out must not overlap b"):
        _C.gemm(np.ones((4, 4), np.float32), x, x)
    buf = np.ones((4, 8), np.float32)
    with pytest.raises(ValueError, match="out must not overlap a"):
        _C.gemm(buf[:, :4], np.ones((4, 4), np.float32), buf[:, 2:6])
    # interleaved but disjoint views of one buffer are fine (q and k heads of a qkv array)
    _C.gemm(buf[:, :4], np.ones((4, 4), np.float32), buf[:, 4:])
    assert (buf[:, 4:] == 4).all()


def test_out_with_overlapping_rows_is_refused():
    a, b, _ = good()
    base = np.zeros(64, np.float32)
    same_rows = np.lib.stride_tricks.as_strided(base, (4, 5), (0, 4))
    with pytest.raises(ValueError, match="out"):
        _C.gemm(a, b, same_rows)
    short_rows = np.lib.stride_tricks.as_strided(base, (4, 5), (12, 4))   # row stride 3 < 5 columns
    with pytest.raises(ValueError, match="out"):
        _C.gemm(a, b, short_rows)
    same_batch = np.lib.stride_tricks.as_strided(base, (2, 4, 5), (0, 20, 4))
    with pytest.raises(ValueError, match="out"):
        _C.gemm(np.ones((2, 4, 3), np.float32), np.ones((2, 3, 5), np.float32), same_batch)
    overlapping_batch = np.lib.stride_tricks.as_strided(base, (2, 4, 5), (40, 20, 4))   # 2nd starts at row 2
    with pytest.raises(ValueError, match="out"):
        _C.gemm(np.ones((2, 4, 3), np.float32), np.ones((2, 3, 5), np.float32), overlapping_batch)


# ---------------------------------------------------------------------------
# transformer.ops.matmul (the friendly numpy API on top of _C.gemm)

def test_ops_matmul_reads_fortran_ordered_and_transposed_inputs():
    r = rng(10)
    a = np.asfortranarray(r.uniform(-1, 1, (37, 19)).astype(np.float32))
    b = r.uniform(-1, 1, (23, 19)).astype(np.float32)
    assert_close(ops.matmul(a, b.T), a, b.T, False, False)
    assert_close(ops.matmul(a, b, trans_b=True), a, b, False, True)
    assert_close(ops.matmul(a.T, a), a.T, a, False, False)
    assert_close(ops.matmul(a, a, trans_a=True), a, a, True, False)
    sliced = r.uniform(-1, 1, (19, 60)).astype(np.float32)[:, ::3]   # non-unit last stride: copied
    assert_close(ops.matmul(a, sliced), a, sliced, False, False)


def test_ops_matmul_batched_with_a_shared_2d_operand():
    r = rng(11)
    x = r.uniform(-1, 1, (3, 10, 8)).astype(np.float32)
    w = r.uniform(-1, 1, (6, 8)).astype(np.float32)
    got = ops.matmul(x, w, trans_b=True)
    assert got.shape == (3, 10, 6)
    assert_close(got, x, np.broadcast_to(w, (3, 6, 8)), False, True)
    v = r.uniform(-1, 1, (5, 10)).astype(np.float32)
    got = ops.matmul(v, x)
    assert_close(got, np.broadcast_to(v, (3, 5, 10)), x, False, False)
    out0 = r.uniform(-1, 1, (3, 5, 8)).astype(np.float32)
    out = out0.copy()
    ops.matmul(v, x, out=out, accumulate=True)
    assert_close(out, np.broadcast_to(v, (3, 5, 10)), x, False, False, out0=out0)


def test_ops_matmul_refuses_bad_arguments():
    a = np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match="out"):
        ops.matmul(a, a.T, accumulate=True)
    with pytest.raises(TypeError, match="a"):
        ops.matmul(a.astype(np.float64), a.T)
    with pytest.raises(ValueError, match="a and b"):
        ops.matmul(a, a)
    with pytest.raises(ValueError, match="out"):
        ops.matmul(a, a.T, out=np.empty((4, 4), np.float32))
    with pytest.raises(ValueError, match="batch"):
        ops.matmul(np.ones((2, 3, 4), np.float32), np.ones((3, 4, 5), np.float32))


# ---------------------------------------------------------------------------------------------
# Pre-packed op(b): gemm_pack_b once, gemm_packed many times (decoding's x @ W^T).

def packed_shapes(isa):
    """(M, N, K): one row to more than a row block (MC), panels cut by N, K blocks cut by K."""
    mr, nr, mc = MR[isa], NR[isa], MC[isa]
    return [(1, 1, 1), (1, nr, 7), (3, nr - 1, KC + 1), (mr, nr + 1, 2 * KC + 3), (mr + 1, 2 * nr - 1, 64),
            (8, 5 * nr + 3, 512), (2 * mr + 3, 3 * nr, 300), (mc + 5, nr + 7, 40)]


@pytest.mark.parametrize("trans_b", [False, True])
def test_packed_matches_float64(isa, trans_b):
    r = rng(20)
    for m, n, k in packed_shapes(isa):
        a, b = operand(r, m, k, False), operand(r, k, n, trans_b)
        packed = _C.gemm_pack_b(b, trans_b=trans_b)
        assert (packed.K, packed.N, packed.isa) == (k, n, isa)
        big, out = padded_out((m, n))
        assert _C.gemm_packed(a, packed, out) is out
        assert_close(out, a, b, False, trans_b)
        assert np.isnan(outside(big, (m, n))).all(), f"wrote outside out for {(m, n, k)}"
        out0 = r.uniform(-1, 1, (m, n)).astype(np.float32)
        out = out0.copy()
        _C.gemm_packed(a, packed, out, alpha=-0.75, accumulate=True)
        assert_close(out, a, b, False, trans_b, alpha=-0.75, out0=out0)


def test_packed_reads_a_as_a_view_with_a_row_stride(isa):
    r = rng(25)
    wide = r.uniform(-1, 1, (9, 300)).astype(np.float32)
    a, b = wide[:, 7:207], operand(r, 200, 70, True)   # lda = 300, K = 200
    out = np.empty((9, 70), np.float32)
    _C.gemm_packed(a, _C.gemm_pack_b(b, trans_b=True), out)
    assert_close(out, a, b, False, True)


def test_packed_has_the_bits_of_the_narrow_schedule(isa):
    # gemm runs few rows of a @ b (b not transposed) with the narrow schedule: same kernels, same
    # K blocks, so the same bits; that schedule is tested against float64 and the others above
    r = rng(21)
    for m, n, k in [(3, 70, 600), (MR[isa] + 2, NR[isa] * 3 + 1, 513), (8, 2 * NR[isa], 64)]:
        a, b = operand(r, m, k, False), operand(r, k, n, False)
        want, got = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
        _C.gemm(a, b, want)
        assert _C._gemm_stats()["schedule"] == "narrow"
        _C.gemm_packed(a, _C.gemm_pack_b(b), got)
        assert_same_bits(got, want, f"packed vs narrow {(m, n, k)}")


def test_packed_bits_do_not_depend_on_thread_count(isa, threads):
    r = rng(22)
    # large enough for a team; the last: op(A)'s row panels (uneven, over K blocks) packed by the team
    for m, n, k in [(8, 2048, 512), (32, 700, 300), (3, 4000, 64), (301, 260, 700)]:
        a, b = operand(r, m, k, False), operand(r, k, n, True)
        packed = _C.gemm_pack_b(b, trans_b=True)
        results = []
        for nthreads in THREADS:
            T.set_num_threads(nthreads)
            out = np.ones((m, n), np.float32)
            _C.gemm_packed(a, packed, out, alpha=0.3, accumulate=True)
            results.append(out)
            assert_same_bits(out, results[0], f"{nthreads} vs 1 threads, {(m, n, k)}")
            assert_same_bits(_C.gemm_pack_b(b, trans_b=True).data, packed.data, f"packing on {nthreads} threads")
        assert_close(results[0], a, b, False, True, alpha=0.3, out0=np.ones((m, n), np.float32))
    # small products split across every thread (the test hook), so a team shares few panels
    for m, n, k in [(5, 37, 19), (8, 40, 512)]:
        a, b = operand(r, m, k, False), operand(r, k, n, True)
        packed = _C.gemm_pack_b(b, trans_b=True)
        T.set_num_threads(1)
        want = _C.gemm_packed(a, packed, np.empty((m, n), np.float32))
        T.set_num_threads(max(THREADS))
        try:
            _C._gemm_force_schedule(all_threads=True)
            got = _C.gemm_packed(a, packed, np.empty((m, n), np.float32))
        finally:
            _C._gemm_force_schedule()
        assert_same_bits(got, want, f"every thread vs 1, {(m, n, k)}")


def test_packed_is_a_copy_of_b_and_read_only():
    r = rng(23)
    a, b = operand(r, 4, 30, False), operand(r, 30, 50, True)
    packed = _C.gemm_pack_b(b, trans_b=True)
    want = expected(a, b, False, True)
    b[:] = 0   # later changes to b are not seen
    out = np.empty((4, 50), np.float32)
    _C.gemm_packed(a, packed, out)
    assert np.abs(out - want).max() <= TOL * 30
    with pytest.raises(ValueError):
        packed.data[0] = 1.0
    # a view with a row stride packs like its copy
    view = operand(r, 30, 100, True)[::2]
    assert np.array_equal(_C.gemm_pack_b(view, trans_b=True).data,
                          _C.gemm_pack_b(np.ascontiguousarray(view), trans_b=True).data)


def test_packed_empty_dimensions():
    for m, n, k in [(0, 5, 3), (4, 0, 3), (4, 5, 0)]:
        a = np.ones((m, k), np.float32)
        packed = _C.gemm_pack_b(np.ones((n, k), np.float32), trans_b=True)
        out = np.full((m, n), 7.0, np.float32)
        _C.gemm_packed(a, packed, out, accumulate=True)   # adds an empty sum
        assert (out == 7.0).all()
        _C.gemm_packed(a, packed, out)                    # an empty sum: zeros
        assert (out == 0.0).all()


def test_packed_refuses_bad_arguments():
    a = np.ones((3, 8), np.float32)
    packed = _C.gemm_pack_b(np.ones((5, 8), np.float32), trans_b=True)
    out = np.empty((3, 5), np.float32)
    with pytest.raises(TypeError, match="packed must be a PackedMatrix"):
        _C.gemm_packed(a, np.ones((8, 5), np.float32), out)
    with pytest.raises(TypeError, match="b must have dtype float32"):
        _C.gemm_pack_b(np.ones((5, 8)))
    with pytest.raises(ValueError, match="b must have the rank"):
        _C.gemm_pack_b(np.ones(8, np.float32))
    with pytest.raises(ValueError, match="a must have 8 columns"):
        _C.gemm_packed(np.ones((3, 7), np.float32), packed, out)
    with pytest.raises(ValueError, match=r"out must have shape \(3, 5\)"):
        _C.gemm_packed(a, packed, np.empty((3, 6), np.float32))
    with pytest.raises(ValueError, match="out must not overlap a"):
        buf = np.ones((3, 8), np.float32)
        _C.gemm_packed(buf, _C.gemm_pack_b(np.ones((8, 8), np.float32)), buf)
    ro = np.empty((3, 5), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out must be writeable"):
        _C.gemm_packed(a, packed, ro)
    with pytest.raises(TypeError, match="alpha"):
        _C.gemm_packed(a, packed, out, alpha="2")
    with pytest.raises(TypeError, match="made by gemm_pack_b"):
        _C.PackedMatrix()   # an empty one would point nowhere
    empty = _C.PackedMatrix.__new__(_C.PackedMatrix)   # made anyway: refused, never read
    with pytest.raises(TypeError, match="packed must be a PackedMatrix from gemm_pack_b"):
        _C.gemm_packed(np.ones((3, 0), np.float32), empty, np.empty((3, 0), np.float32))
    with pytest.raises(TypeError, match="reuse must be None or a PackedMatrix"):
        _C.gemm_pack_b(np.ones((0, 0), np.float32), reuse=empty)


@pytest.mark.skipif(_C.best_isa() == "generic", reason="needs two SIMD levels")
def test_packed_for_another_instruction_set_is_refused():
    packed = _C.gemm_pack_b(np.ones((5, 8), np.float32), trans_b=True)
    try:
        _C.set_isa("generic")
        with pytest.raises(ValueError, match="packed was packed for the .* pack it again"):
            _C.gemm_packed(np.ones((3, 8), np.float32), packed, np.empty((3, 5), np.float32))
    finally:
        _C.set_isa(_C.best_isa())


def test_pack_b_reuses_the_memory_of_a_packed_matrix_of_the_same_shape():
    r = rng(24)
    b1, b2 = operand(r, 30, 50, True), operand(r, 30, 50, True)
    first = _C.gemm_pack_b(b1, trans_b=True)
    memory = first.data.__array_interface__["data"][0]
    again = _C.gemm_pack_b(b2, trans_b=True, reuse=first)
    assert again is first and again.data.__array_interface__["data"][0] == memory
    assert np.array_equal(again.data, _C.gemm_pack_b(b2, trans_b=True).data)
    other = _C.gemm_pack_b(operand(r, 30, 51, True), trans_b=True, reuse=first)   # another shape
    assert other is not first and (other.N, first.N) == (51, 50)
    with pytest.raises(TypeError, match="reuse must be None or a PackedMatrix"):
        _C.gemm_pack_b(b1, trans_b=True, reuse=b1)
