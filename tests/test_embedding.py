"""Embedding gather (out = table[ids] * scale + pe[pos_offset + t]) and its scatter-add backward
(dtable[ids] += scale * dout), transformer._C.embedding_forward / embedding_backward.

References are numpy float64. Tolerance, stated once: forward within 1 float32 rounding of the
float64 value for each of the two operations (|err| <= 2^-23 (|w scale| + |pe|) + 2^-24 |ref|, i.e.
RTOL = 2^-22 on the sum of magnitudes); backward within RTOL times the sum of the magnitudes
accumulated into each element (float32 accumulation of repeated ids in token order).
"""
import numpy as np
import pytest

from transformer import _C
from conftest import ISA_LEVELS

LEVELS = ISA_LEVELS
RTOL = 2.0 ** -22
# (B, T, V, D): ones, primes, vector-width boundaries, empty dimensions
CASES = [(1, 1, 1, 1), (2, 3, 5, 7), (3, 5, 11, 15), (2, 4, 9, 16), (1, 7, 13, 17), (2, 3, 4, 31),
         (2, 2, 6, 32), (3, 2, 7, 33), (2, 5, 17, 63), (1, 3, 3, 64), (4, 3, 10, 65), (3, 11, 50, 130),
         (0, 4, 5, 8), (2, 0, 5, 8), (2, 3, 5, 0)]




def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def make_ids(B, T, V, seed=0):
    """Random ids that hit 0, V - 1 and repeats whenever there is room."""
    ids = np.random.default_rng(seed).integers(0, max(V, 1), size=(B, T)).astype(np.int64)
    flat = ids.reshape(-1)
    if flat.size >= 3:
        flat[0], flat[1], flat[2] = 0, V - 1, V - 1
    return ids


def forward_ref(ids, table, scale, pe, pos_offset):
    w = table.astype(np.float64)[ids] * scale
    mag = np.abs(w)
    if pe is not None:
        T = ids.shape[1]
        p = pe.astype(np.float64)[pos_offset:pos_offset + T][None]
        return w + p, mag + np.abs(p)
    return w, mag


@pytest.mark.parametrize("with_pe", [False, True])
@pytest.mark.parametrize("B,T,V,D", CASES)
def test_forward_matches_numpy(isa, B, T, V, D, with_pe):
    ids, table = make_ids(B, T, V), rand(V, D, seed=1)
    pe = rand(T + 5, D, seed=2) if with_pe else None
    pos_offset = 3 if with_pe else 0
    scale = float(np.sqrt(max(D, 1)))
    out = np.full((B, T, D), np.nan, np.float32)
    _C.embedding_forward(ids, table, out, scale, pe, pos_offset)
    want, mag = forward_ref(ids, table, scale, pe, pos_offset)
    err = np.abs(out - want)
    assert (err <= RTOL * mag).all(), f"max abs err {err.max() if err.size else 0:.3g}"


@pytest.mark.parametrize("B,T,V,D", CASES)
def test_fast_kernels_match_the_naive_c_reference_bitwise(isa, B, T, V, D):
    ids, table, pe, dout = make_ids(B, T, V), rand(V, D, seed=1), rand(T + 2, D, seed=2), rand(B, T, D, seed=3)
    fast, ref = np.empty((B, T, D), np.float32), np.empty((B, T, D), np.float32)
    _C.embedding_forward(ids, table, fast, 1.7, pe, 2)
    _C.embedding_forward(ids, table, ref, 1.7, pe, 2, reference=True)
    np.testing.assert_array_equal(fast, ref)
    d_fast, d_ref = rand(V, D, seed=4), rand(V, D, seed=4)
    _C.embedding_backward(ids, dout, d_fast, 1.7)
    _C.embedding_backward(ids, dout, d_ref, 1.7, reference=True)
    np.testing.assert_array_equal(d_fast, d_ref)


def test_forward_pe_window_ends_exactly_at_the_last_position(isa):
    ids, table, pe = make_ids(2, 6, 9), rand(9, 17, seed=1), rand(10, 17, seed=2)
    out = np.empty((2, 6, 17), np.float32)
    _C.embedding_forward(ids, table, out, 1.0, pe, 4)      # positions 4 .. 9 of 10
    np.testing.assert_array_equal(out, table[ids] + pe[4:10][None])


def test_forward_defaults_are_plain_gather(isa):
    ids, table = make_ids(3, 4, 6), rand(6, 19, seed=1)
    out = np.empty((3, 4, 19), np.float32)
    _C.embedding_forward(ids, table, out)
    np.testing.assert_array_equal(out, table[ids])


@pytest.mark.parametrize("B,T,V,D", CASES)
def test_backward_scatter_adds_repeated_ids(isa, B, T, V, D):
    ids, dout = make_ids(B, T, V, seed=3), rand(B, T, D, seed=4)
    dtable = rand(V, D, seed=5)                  # backward adds into what is there
    scale = 1.7
    want = dtable.astype(np.float64)
    mag = np.abs(want)
    np.add.at(want, ids.reshape(-1), scale * dout.reshape(B * T, D).astype(np.float64))
    np.add.at(mag, ids.reshape(-1), np.abs(scale * dout.reshape(B * T, D).astype(np.float64)))
    _C.embedding_backward(ids, dout, dtable, scale)
    err = np.abs(dtable - want)
    assert (err <= 4 * RTOL * mag).all(), f"max abs err {err.max() if err.size else 0:.3g}"


def test_backward_all_tokens_on_one_row_sum_in_token_order(isa):
    # every token is id 2: row 2 gets the float32 running sum in token order, other rows stay put
    B, T, V, D = 3, 7, 4, 21
    ids = np.full((B, T), 2, np.int64)
    dout = rand(B, T, D, seed=6)
    dtable = np.zeros((V, D), np.float32)
    _C.embedding_backward(ids, dout, dtable, 1.0)
    running = np.zeros(D, np.float32)
    for row in dout.reshape(-1, D):
        running = running + row
    np.testing.assert_array_equal(dtable[2], running)
    np.testing.assert_array_equal(dtable[[0, 1, 3]], 0.0)


def test_backward_matches_finite_differences(isa):
    # L(table) = sum(w * forward(table)); dL/dtable = backward(w). Central differences of our own
    # float32 forward along a random direction v (L is linear, so only rounding is left).
    B, T, V, D = 3, 5, 7, 33
    ids, table, pe = make_ids(B, T, V, seed=1), rand(V, D, seed=2), rand(T, D, seed=3)
    w, v = rand(B, T, D, seed=4), rand(V, D, seed=5)
    scale, h = 2.5, np.float32(0.25)

    def loss(tab):
        out = np.empty((B, T, D), np.float32)
        _C.embedding_forward(ids, tab, out, scale, pe, 0)
        return np.dot(w.reshape(-1).astype(np.float64), out.reshape(-1))

    fd = (loss(table + h * v) - loss(table - h * v)) / (2 * np.float64(h))
    grad = np.zeros((V, D), np.float32)
    _C.embedding_backward(ids, w, grad, scale)
    analytic = np.dot(grad.reshape(-1).astype(np.float64), v.reshape(-1))
    assert abs(fd - analytic) <= 1e-4 * np.abs(w).sum() * scale, (fd, analytic)


def test_matches_torch_embedding_times_scale_plus_pe():
    torch = pytest.importorskip("torch")
    B, T, V, D, scale = 4, 9, 31, 48, float(np.sqrt(48))
    ids, table, pe, g = make_ids(B, T, V), rand(V, D, seed=1), rand(T, D, seed=2), rand(B, T, D, seed=3)
    wt = torch.tensor(table, requires_grad=True)
    yt = torch.nn.functional.embedding(torch.from_numpy(ids), wt) * scale + torch.from_numpy(pe)
    yt.backward(torch.from_numpy(g))
    out = np.empty((B, T, D), np.float32)
    _C.embedding_forward(ids, table, out, scale, pe, 0)
    dtable = np.zeros_like(table)
    _C.embedding_backward(ids, g, dtable, scale)
    np.testing.assert_array_equal(out, yt.detach().numpy())   # same two roundings: w * scale, + pe
    np.testing.assert_allclose(dtable, wt.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_same_bits_at_every_isa_level():
    B, T, V, D = 3, 7, 5, 37
    ids, table, pe, dout = make_ids(B, T, V), rand(V, D, seed=1), rand(T, D, seed=2), rand(B, T, D, seed=3)
    results = []
    for level in LEVELS:
        _C.set_isa(level)
        out = np.empty((B, T, D), np.float32)
        _C.embedding_forward(ids, table, out, 1.3, pe, 0)
        dtable = rand(V, D, seed=4)
        _C.embedding_backward(ids, dout, dtable, 1.3)
        results.append((out, dtable))
    _C.set_isa(_C.best_isa())
    for out, dtable in results[1:]:
        np.testing.assert_array_equal(out, results[0][0])
        np.testing.assert_array_equal(dtable, results[0][1])


def test_same_bits_at_1_and_2_threads(isa, restore_threads):
    B, T, V, D = 8, 64, 37, 161            # > 2 * grain floats; 11 column chunks; many repeats
    ids, table, pe, dout = make_ids(B, T, V), rand(V, D, seed=1), rand(T, D, seed=2), rand(B, T, D, seed=3)
    results = []
    for threads in (1, 2):
        _C.set_num_threads(threads)
        out = np.empty((B, T, D), np.float32)
        _C.embedding_forward(ids, table, out, 3.0, pe, 0)
        dtable = rand(V, D, seed=4)
        _C.embedding_backward(ids, dout, dtable, 3.0)
        results.append((out, dtable))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


# ---- ids and positions are checked before any C runs --------------------------------------------

@pytest.mark.parametrize("bad", [-1, 9, 2**40, -2**63])
def test_out_of_range_ids_are_refused_before_writing(bad):
    ids, table = make_ids(2, 3, 9), rand(9, 4, seed=1)
    ids[1, 2] = bad
    out = np.full((2, 3, 4), 7.0, np.float32)
    with pytest.raises(ValueError, match="ids"):
        _C.embedding_forward(ids, table, out)
    np.testing.assert_array_equal(out, 7.0)                # nothing written
    dtable = np.full((9, 4), 7.0, np.float32)
    with pytest.raises(ValueError, match="ids"):
        _C.embedding_backward(ids, np.ones((2, 3, 4), np.float32), dtable)
    np.testing.assert_array_equal(dtable, 7.0)


def test_ids_with_empty_table_are_refused():
    with pytest.raises(ValueError, match="ids"):
        _C.embedding_forward(np.zeros((1, 1), np.int64), np.zeros((0, 4), np.float32), np.zeros((1, 1, 4), np.float32))


def test_positions_past_pe_are_refused():
    ids, table = make_ids(2, 5, 6), rand(6, 8, seed=1)
    out = np.zeros((2, 5, 8), np.float32)
    with pytest.raises(ValueError, match="pe"):
        _C.embedding_forward(ids, table, out, 1.0, rand(5, 8), 1)       # 1 + 5 > 5
    with pytest.raises(ValueError, match="pe"):
        _C.embedding_forward(ids, table, out, 1.0, rand(4, 8), 0)
    with pytest.raises(ValueError, match="pos_offset"):
        _C.embedding_forward(ids, table, out, 1.0, rand(9, 8), -1)


def _f(*shape):
    return np.zeros(shape, np.float32)


def _i(*shape):
    return np.zeros(shape, np.int64)


def _readonly(a):
    a.flags.writeable = False
    return a


BAD = [
    (lambda: _C.embedding_forward(_i(2, 3).astype(np.int32), _f(5, 4), _f(2, 3, 4)), TypeError, "ids"),
    (lambda: _C.embedding_forward(_f(2, 3), _f(5, 4), _f(2, 3, 4)), TypeError, "ids"),
    (lambda: _C.embedding_forward(_i(6), _f(5, 4), _f(2, 3, 4)), ValueError, "ids"),
    (lambda: _C.embedding_forward(_i(3, 4)[:, ::2], _f(5, 4), _f(3, 2, 4)), ValueError, "ids"),
    (lambda: _C.embedding_forward(_i(2, 3), _f(5, 4).astype(np.float64), _f(2, 3, 4)), TypeError, "table"),
    (lambda: _C.embedding_forward(_i(2, 3), _f(5, 4, 1), _f(2, 3, 4)), ValueError, "table"),
    (lambda: _C.embedding_forward(_i(2, 3), _f(5, 8)[:, ::2], _f(2, 3, 4)), ValueError, "table"),
    (lambda: _C.embedding_forward(_i(2, 3), _f(5, 4), _f(2, 3, 5)), ValueError, "out"),
    (lambda: _C.embedding_forward(_i(2, 3), _f(5, 4), _f(6, 4)), ValueError, "out"),
    (lambda: _C.embedding_forward(_i(2, 3), _f(5, 4), _readonly(_f(2, 3, 4))), ValueError, "out"),
    (lambda: _C.embedding_forward(_i(2, 3), _f(5, 4), _f(2, 3, 4).astype(np.float16)), TypeError, "out"),
    (lambda: _C.embedding_forward(_i(2, 3), _f(5, 4), _f(2, 3, 4), "2"), TypeError, "scale"),
    (lambda: _C.embedding_forward(_i(2, 3), _f(5, 4), _f(2, 3, 4), 1.0, _f(3, 5)), ValueError, "pe"),
    (lambda: _C.embedding_forward(_i(2, 3), _f(5, 4), _f(2, 3, 4), 1.0, _f(3, 4).astype(np.float64)), TypeError, "pe"),
    (lambda: _C.embedding_forward(_i(2, 3), _f(5, 4), _f(2, 3, 4), 1.0, _f(9, 4), 1.5), TypeError, "pos_offset"),
    (lambda: _C.embedding_backward(_i(2, 3), _f(2, 3, 5), _f(5, 4)), ValueError, "dout"),
    (lambda: _C.embedding_backward(_i(2, 3), _f(2, 3, 4).astype(np.float64), _f(5, 4)), TypeError, "dout"),
    (lambda: _C.embedding_backward(_i(2, 3), _f(2, 3, 4), _readonly(_f(5, 4))), ValueError, "dtable"),
    (lambda: _C.embedding_backward(_i(2, 3), _f(2, 3, 4), _f(5, 4).astype(object)), TypeError, "dtable"),
    (lambda: _C.embedding_backward(_i(2, 3).astype(np.uint64), _f(2, 3, 4), _f(5, 4)), TypeError, "ids"),
]


@pytest.mark.parametrize("call,exc,name", BAD)
def test_bad_input_is_refused_naming_the_argument(call, exc, name):
    with pytest.raises(exc, match=rf"\b{name}\b"):
        call()


def test_out_overlapping_inputs_is_refused():
    buf = np.zeros(2 * 3 * 4 + 20, np.float32)
    table = buf[:20].reshape(5, 4)
    with pytest.raises(ValueError, match="out"):
        _C.embedding_forward(_i(2, 3), table, buf[4:28].reshape(2, 3, 4))
    pe = buf[:12].reshape(3, 4)
    with pytest.raises(ValueError, match="out"):
        _C.embedding_forward(_i(2, 3), _f(5, 4), buf[:24].reshape(2, 3, 4), 1.0, pe)
    with pytest.raises(ValueError, match="dtable"):
        _C.embedding_backward(_i(2, 3), buf[:24].reshape(2, 3, 4), buf[:20].reshape(5, 4))
