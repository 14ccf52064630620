"""Single-query attention over a key/value cache (the decoding inner loop) against numpy."""
import numpy as np
import pytest

from transformer import _C

from bf16_oracle import widen

TOL = 1e-5  # relative to the largest |value|, float32 vs float64


def reference(q, k, v, n_keys, scale, mask):
    N, H, _, dh = k.shape
    q = q.reshape(N, H, dh).astype(np.float64)
    scores = np.einsum("nhd,nhtd->nht", q, k[:, :, :n_keys].astype(np.float64)) * scale
    if mask is not None:
        scores = np.where(mask[:, None, :n_keys], -np.inf, scores)
    peak = scores.max(-1, keepdims=True, initial=-np.inf)
    e = np.where(np.isfinite(scores), np.exp(scores - np.where(np.isfinite(peak), peak, 0)), 0.0)
    total = e.sum(-1, keepdims=True)
    p = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return np.einsum("nht,nhtd->nhd", p, v[:, :, :n_keys]).reshape(N, H * dh), p


def isas():
    from conftest import ISA_LEVELS
    return ISA_LEVELS


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("N, H, Tmax, n_keys, dh", [(1, 1, 1, 1, 1), (3, 2, 9, 7, 17), (4, 3, 20, 20, 32),
                                                    (2, 4, 70, 65, 64), (5, 1, 8, 0, 16), (2, 2, 5, 3, 15)])
def test_matches_numpy_with_and_without_mask(isa, N, H, Tmax, n_keys, dh):
    rng = np.random.default_rng(N * 100 + dh)
    fused = rng.standard_normal((N, 3 * H * dh), dtype=np.float32)   # q is a column slice of it
    q = fused[:, : H * dh]
    k = rng.standard_normal((N, H, Tmax, dh), dtype=np.float32)
    v = rng.standard_normal((N, H, Tmax, dh), dtype=np.float32)
    mask = rng.random((N, Tmax)) < 0.3
    mask[0, :] = True  # a fully masked row gives zeros
    best = _C.best_isa()
    try:
        _C.set_isa(isa)
        for m in (None, mask):
            out = np.full((N, H * dh), np.nan, dtype=np.float32)
            probs = np.empty((N, H, n_keys), dtype=np.float32)
            _C.attention_decode(q, k, v, n_keys, out, 0.37, m, probs)
            want, want_p = reference(q, k, v, n_keys, 0.37, m)
            err = np.abs(out - want).max(initial=0) / max(np.abs(want).max(initial=0), 1e-30)
            print(isa, m is not None, err)
            assert err <= TOL
            assert np.abs(probs - want_p).max(initial=0) <= TOL
            assert not np.isnan(out).any()
    finally:
        _C.set_isa(best)


def test_bitwise_equal_at_one_and_two_threads():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((8, 4 * 32), dtype=np.float32)
    k, v = (rng.standard_normal((8, 4, 40, 32), dtype=np.float32) for _ in range(2))
    outs = []
    for threads in (1, 2):
        before = _C.get_num_threads()
        _C.set_num_threads(threads)
        try:
            out = np.empty_like(q)
            outs.append(_C.attention_decode(q, k, v, 37, out, 0.2))
        finally:
            _C.set_num_threads(before)
    assert np.array_equal(outs[0], outs[1])


def test_bad_arguments_are_named():
    q = np.zeros((2, 8), np.float32)
    k = np.zeros((2, 2, 5, 4), np.float32)
    out = np.zeros((2, 8), np.float32)
    with pytest.raises(TypeError, match="q"):
        _C.attention_decode(q.astype(np.float64), k, k, 3, out, 1.0)
    with pytest.raises(ValueError, match="n_keys"):
        _C.attention_decode(q, k, k, 6, out, 1.0)
    with pytest.raises(ValueError, match="out"):
        _C.attention_decode(q, k, k, 3, np.zeros((2, 9), np.float32), 1.0)
    with pytest.raises(ValueError, match="out must not overlap q"):
        _C.attention_decode(q, k, k, 3, q, 1.0)
    ro = np.zeros((2, 8), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out must be writeable"):
        _C.attention_decode(q, k, k, 3, ro, 1.0)
    with pytest.raises(ValueError, match="key_mask"):
        _C.attention_decode(q, k, k, 3, out, 1.0, key_mask=np.zeros((2, 4), bool))
    with pytest.raises(ValueError, match="k_cache"):
        _C.attention_decode(q, np.asfortranarray(k), k, 3, out, 1.0)
    with pytest.raises(ValueError, match="out must not overlap k_cache"):
        _C.attention_decode(q, k, k, 3, k.reshape(2, -1)[:, :8], 1.0)


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("dh", [1, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 80, 127, 129])
def test_fast_path_agrees_with_the_plain_per_key_loop(isa, dh):
    # The AVX-512 and AVX2 paths take 16 and 8 keys at a time (dot products reduced together,
    # the vector exp, the weighted sum in registers over two chains): within rounding of the
    # plain loop, which calls a dot and an axpy per key. In plain C the fast path is the loop.
    rng = np.random.default_rng(dh)
    N, H, Tmax, n_keys = 3, 2, 11, 9
    q = rng.standard_normal((N, H * dh), dtype=np.float32)
    k, v = (rng.standard_normal((N + 1, H, Tmax, dh), dtype=np.float32) for _ in range(2))
    mask = rng.random((N + 1, Tmax)) < 0.3
    mask[1] = True
    rows = np.array([1, 3, 0])
    key_rows = rng.integers(0, N + 1, size=(N, Tmax))
    best = _C.best_isa()
    try:
        _C.set_isa(isa)
        for kwargs in (dict(key_mask=mask, rows=rows), dict(rows=rows, key_rows=key_rows)):
            got, want = np.empty((N, H * dh), np.float32), np.empty((N, H * dh), np.float32)
            got_p, want_p = np.empty((N, H, n_keys), np.float32), np.empty((N, H, n_keys), np.float32)
            _C.attention_decode(q, k, v, n_keys, got, 0.3, probs=got_p, **kwargs)
            _C.attention_decode(q, k, v, n_keys, want, 0.3, probs=want_p, reference=True, **kwargs)
            if isa in ("avx2", "avx512", "neon"):   # neon runs avx2's code (through SIMDe)
                scale = max(np.abs(want).max(initial=0), 1e-30)
                assert np.abs(got - want).max(initial=0) <= TOL * scale, np.abs(got - want).max()
                assert np.abs(got_p - want_p).max(initial=0) <= TOL, np.abs(got_p - want_p).max()
                assert np.array_equal(got_p == 0, want_p == 0)   # hidden keys weigh exactly 0
            else:
                assert np.array_equal(got, want), np.abs(got - want).max()
                assert np.array_equal(got_p, want_p)
    finally:
        _C.set_isa(best)


# -- bf16 caches (reduced-precision decoding: half the bytes a step reads) --------------------------

def test_to_bf16_rounds_to_nearest_even_as_torch_does():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    with np.errstate(over="ignore"):
        wide = (rng.standard_normal(5000) * 10.0 ** rng.integers(-44, 39, 5000)).astype(np.float32)
    x = np.concatenate([wide,
                        np.array([0.0, -0.0, np.inf, -np.inf, 3.4e38, -3.4e38, 1e-40, -1e-42,
                                  1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 1.0 + 2.0 ** -8 + 2.0 ** -20],
                                 np.float32)])
    got = _C.to_bf16(x)
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(got, want)
    assert widen(got)[-3] == 1.0 and widen(got)[-2] == 1.0 + 2.0 ** -6   # ties to even, up and down
    assert widen(got)[-1] == 1.0 + 2.0 ** -7                              # past the tie: up
    assert widen(got)[-5] != 0.0 and np.float32(widen(got)[-5]) < 2.0 ** -126   # a subnormal is kept
    nan = _C.to_bf16(np.array([np.nan, -np.nan], np.float32))
    assert np.isnan(widen(nan)).all()


def test_round_bf16_in_place_rounds_a_column_slice_and_nothing_else():
    rng = np.random.default_rng(1)
    fused = rng.standard_normal((5, 12), dtype=np.float32)
    before = fused.copy()
    _C.round_bf16_(fused[:, 4:])
    assert np.array_equal(fused[:, :4], before[:, :4])
    assert np.array_equal(fused[:, 4:], widen(_C.to_bf16(np.ascontiguousarray(before[:, 4:]))))


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("dh", [1, 15, 17, 32, 33, 64, 65])
def test_bf16_caches_give_the_bits_of_float32_caches_holding_their_values(isa, dh):
    """A bf16 cache is widened exactly as it is read: every path (and the reference loop) then
    computes what it computes on float32 caches of the widened values, bit for bit; those are
    checked against numpy above."""
    rng = np.random.default_rng(dh)
    N, H, Tmax, n_keys = 3, 2, 21, 19
    q = rng.standard_normal((N, H * dh), dtype=np.float32)
    k16, v16 = (_C.to_bf16(rng.standard_normal((N + 1, H, Tmax, dh), dtype=np.float32)) for _ in range(2))
    k32, v32 = widen(k16), widen(v16)
    mask = rng.random((N + 1, Tmax)) < 0.3
    rows = np.array([1, 3, 0])
    key_rows = rng.integers(0, N + 1, size=(N, Tmax))
    best = _C.best_isa()
    try:
        _C.set_isa(isa)
        for kwargs in (dict(), dict(key_mask=mask, rows=rows), dict(rows=rows, key_rows=key_rows)):
            n = N + 1 if not kwargs else N
            for reference in (False, True):
                got, want = (np.empty((n, H * dh), np.float32) for _ in range(2))
                got_p, want_p = (np.empty((n, H, n_keys), np.float32) for _ in range(2))
                qn = np.ascontiguousarray(np.resize(q, (n, H * dh)))
                _C.attention_decode(qn, k16, v16, n_keys, got, 0.3, probs=got_p, reference=reference, **kwargs)
                _C.attention_decode(qn, k32, v32, n_keys, want, 0.3, probs=want_p, reference=reference, **kwargs)
                assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (kwargs, reference)
                assert np.array_equal(got_p.view(np.uint32), want_p.view(np.uint32))
    finally:
        _C.set_isa(best)


def test_cache_store_into_a_bf16_cache_rounds_each_value():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 2 * 8), dtype=np.float32)
    cache = np.zeros((4, 2, 5, 8), np.uint16)
    _C.attention_cache_store(x, cache, 3, np.array([2, 0, 3]))
    want = _C.to_bf16(x).reshape(3, 2, 8)
    assert np.array_equal(cache[[2, 0, 3], :, 3], want)
    assert not cache[1].any() and not cache[:, :, [0, 1, 2, 4]].any()


def test_bf16_cache_arguments_are_named():
    q = np.zeros((2, 8), np.float32)
    k16 = np.zeros((2, 2, 5, 4), np.uint16)
    out = np.zeros((2, 8), np.float32)
    with pytest.raises(TypeError, match="v_cache must have dtype uint16"):
        _C.attention_decode(q, k16, k16.astype(np.float32), 3, out, 1.0)
    with pytest.raises(TypeError, match="k_cache must have dtype float32"):
        _C.attention_decode(q, k16.astype(np.int16), k16, 3, out, 1.0)
    with pytest.raises(TypeError, match="out must have dtype uint16"):
        _C.to_bf16(q, np.zeros((2, 8), np.int16))
    with pytest.raises(ValueError, match="out must have x's shape"):
        _C.to_bf16(q, np.zeros((2, 9), np.uint16))
