"""Cross-entropy (label smoothing, ignore index) and log-softmax: transformer._C.cross_entropy,
_C.cross_entropy_reference, _C.log_softmax.

Specification: PyTorch's F.cross_entropy(logits, targets, ignore_index=..., label_smoothing=...)
with mean reduction, and its autograd gradient, times grad_scale; with no valid row the loss is
0.0 and the gradient zero. References: a float64 numpy re-implementation, torch, and central
finite differences of the float64 loss.

Tolerances (stated once): the loss within LOSS_RTOL relative of float64; each gradient element
within GRAD_ATOL * grad_scale / n_valid of float64 (a softmax probability is in [0, 1], so the
float32 rounding of the gradient is below 2^-24 / n_valid; we allow a few ulps of the largest).
Against torch (which computes in float32) the same tolerances, a little wider (TORCH_FACTOR).
"""
import math

import numpy as np
import pytest

from transformer import _C

LOSS_RTOL = 1e-6
GRAD_ATOL = 4e-7
TORCH_FACTOR = 8.0   # torch's own float32 rounding: 6.5x GRAD_ATOL seen on AMD Zen 3 (AVX2, family 25 model 1)





def reference(logits, targets, ignore_index=-100, label_smoothing=0.0, grad_scale=1.0):
    """float64 numpy: (mean loss, n_valid, gradient)."""
    x = logits.astype(np.float64)
    N, V = x.shape
    valid = targets != ignore_index
    n_valid = int(valid.sum())
    grad = np.zeros_like(x)
    if n_valid == 0 or V == 0:
        return 0.0, 0, grad
    m = x.max(axis=1, keepdims=True)
    log_p = x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    rows = np.nonzero(valid)[0]
    t = targets[rows]
    eps = label_smoothing
    row_loss = (1 - eps) * -log_p[rows, t] + eps * -log_p[rows].mean(axis=1)
    onehot = np.zeros((len(rows), V))
    onehot[np.arange(len(rows)), t] = 1.0
    grad[rows] = (np.exp(log_p[rows]) - (1 - eps) * onehot - eps / V) * grad_scale / n_valid
    return float(row_loss.sum() / n_valid), n_valid, grad


def make_case(rng, N, V, ignore_index=-100, ignored_fraction=0.2, scale=3.0):
    logits = (rng.standard_normal((N, V)) * scale).astype(np.float32)
    targets = rng.integers(0, max(V, 1), N).astype(np.int64)
    targets[rng.random(N) < ignored_fraction] = ignore_index
    return logits, targets


def check_against(ref, loss, n_valid, grad, tol_factor=1.0, grad_scale=1.0):
    ref_loss, ref_n, ref_grad = ref
    assert n_valid == ref_n
    loss_err = abs(loss - ref_loss) / max(abs(ref_loss), 1e-30)
    assert loss_err <= LOSS_RTOL * tol_factor, f"loss {loss} vs {ref_loss}: rel err {loss_err:.3g}"
    if grad is not None and ref_n > 0:
        grad_err = np.max(np.abs(grad - ref_grad)) if grad.size else 0.0
        limit = GRAD_ATOL * tol_factor * abs(grad_scale) / ref_n
        assert grad_err <= limit, f"max |dlogits - ref| = {grad_err:.3g} > {limit:.3g}"


# --------------------------------------------------------------------------------------------
# Values

@pytest.mark.parametrize("V", [1, 2, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 1000, 4000])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 0.3])
def test_matches_float64_reference_at_every_isa(isa, V, label_smoothing):
    rng = np.random.default_rng(V)
    logits, targets = make_case(rng, 23, V)
    dlogits = np.full_like(logits, np.nan)
    loss, n_valid = _C.cross_entropy(logits, targets, dlogits, label_smoothing=label_smoothing)
    check_against(reference(logits, targets, label_smoothing=label_smoothing), loss, n_valid, dlogits)


@pytest.mark.parametrize("V", [1, 2, 17, 4000])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("ignore_index", [0, -100])
def test_matches_torch_loss_and_autograd_gradient(V, label_smoothing, ignore_index):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(V + 7)
    logits, targets = make_case(rng, 41, V, ignore_index=ignore_index)
    dlogits = np.empty_like(logits)
    loss, n_valid = _C.cross_entropy(logits, targets, dlogits, ignore_index=ignore_index,
                                     label_smoothing=label_smoothing)
    x = torch.from_numpy(logits).requires_grad_()
    ref = F.cross_entropy(x, torch.from_numpy(targets), ignore_index=ignore_index,
                          label_smoothing=label_smoothing, reduction="mean")
    ref.backward()
    n_ref = int((targets != ignore_index).sum())
    if n_ref == 0:  # V == 1 with ignore_index 0: torch says nan, we say 0 (documented)
        assert (loss, n_valid) == (0.0, 0) and not dlogits.any()
        return
    check_against((ref.item(), n_ref, x.grad.numpy().astype(np.float64)), loss, n_valid,
                  dlogits, TORCH_FACTOR)


def test_naive_reference_matches_float64(isa):
    rng = np.random.default_rng(3)
    for V in (1, 17, 300):
        for eps in (0.0, 0.2):
            logits, targets = make_case(rng, 19, V)
            dlogits = np.empty_like(logits)
            loss, n_valid = _C.cross_entropy_reference(logits, targets, dlogits,
                                                       label_smoothing=eps, grad_scale=0.5)
            check_against(reference(logits, targets, label_smoothing=eps, grad_scale=0.5),
                          loss, n_valid, dlogits, grad_scale=0.5)


def test_gradient_matches_finite_differences_of_the_float64_loss():
    rng = np.random.default_rng(11)
    logits, targets = make_case(rng, 5, 9)
    targets[1] = -100
    eps, h = 0.15, 1e-6
    dlogits = np.empty_like(logits)
    _C.cross_entropy(logits, targets, dlogits, label_smoothing=eps)
    x = logits.astype(np.float64)
    numeric = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        plus, minus = x.copy(), x.copy()
        plus[index] += h
        minus[index] -= h
        numeric[index] = (reference(plus, targets, label_smoothing=eps)[0]
                          - reference(minus, targets, label_smoothing=eps)[0]) / (2 * h)
    err = np.max(np.abs(dlogits - numeric))
    assert err <= 1e-6, f"max |dlogits - finite differences| = {err:.3g}"


def test_loss_without_gradient_is_the_same_loss(isa):
    rng = np.random.default_rng(5)
    logits, targets = make_case(rng, 30, 257)
    with_grad = _C.cross_entropy(logits, targets, np.empty_like(logits), label_smoothing=0.1)
    without = _C.cross_entropy(logits, targets, label_smoothing=0.1)
    assert with_grad == without


def test_gradient_in_place_equals_separate_buffer(isa):
    rng = np.random.default_rng(6)
    logits, targets = make_case(rng, 30, 1001)
    dlogits = np.empty_like(logits)
    expected = _C.cross_entropy(logits, targets, dlogits, label_smoothing=0.1)
    in_place = logits.copy()
    got = _C.cross_entropy(in_place, targets, in_place, label_smoothing=0.1)
    assert got == expected
    np.testing.assert_array_equal(in_place, dlogits)


def test_grad_scale_scales_the_gradient_not_the_loss():
    rng = np.random.default_rng(7)
    logits, targets = make_case(rng, 20, 100)
    dlogits = np.empty_like(logits)
    loss, n_valid = _C.cross_entropy(logits, targets, dlogits, label_smoothing=0.1,
                                     grad_scale=-2.5)
    check_against(reference(logits, targets, label_smoothing=0.1, grad_scale=-2.5), loss,
                  n_valid, dlogits, grad_scale=-2.5)
    assert loss == _C.cross_entropy(logits, targets, label_smoothing=0.1)[0]


def test_ignored_rows_get_zero_gradient_and_do_not_count():
    rng = np.random.default_rng(8)
    logits, targets = make_case(rng, 10, 50, ignore_index=0, ignored_fraction=0.0)
    targets[[2, 5]] = 0
    dlogits = np.full_like(logits, 7.0)
    loss, n_valid = _C.cross_entropy(logits, targets, dlogits, ignore_index=0)
    assert n_valid == int((targets != 0).sum())
    assert not dlogits[[2, 5]].any()
    keep = targets != 0
    expected, _ = _C.cross_entropy(np.ascontiguousarray(logits[keep]), targets[keep],
                                   ignore_index=0)
    assert abs(loss - expected) <= LOSS_RTOL * abs(expected)


def test_all_rows_ignored_gives_zero_loss_and_zero_gradient(isa):
    logits = np.random.default_rng(9).standard_normal((6, 33)).astype(np.float32)
    targets = np.full(6, -100, dtype=np.int64)
    dlogits = np.full_like(logits, np.nan)
    assert _C.cross_entropy(logits, targets, dlogits, label_smoothing=0.1) == (0.0, 0)
    assert not dlogits.any()


def test_empty_batch():
    assert _C.cross_entropy(np.zeros((0, 5), np.float32), np.zeros(0, np.int64)) == (0.0, 0)
    # V == 0 is allowed only when every row is ignored
    assert _C.cross_entropy(np.zeros((3, 0), np.float32), np.full(3, -100, np.int64)) == (0.0, 0)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_huge_logits_stay_finite(isa, label_smoothing):
    torch = pytest.importorskip("torch")
    logits = np.zeros((4, 37), np.float32)
    logits[0, 3], logits[1, :], logits[1, 5] = 1e4, -1e4, 1e4
    logits[2, :] = 1e4
    logits[3, ::2] = -1e4
    targets = np.array([3, 6, 0, 1], np.int64)
    dlogits = np.empty_like(logits)
    loss, _ = _C.cross_entropy(logits, targets, dlogits, label_smoothing=label_smoothing)
    assert math.isfinite(loss) and np.isfinite(dlogits).all()
    x = torch.from_numpy(logits).requires_grad_()
    ref = torch.nn.functional.cross_entropy(x, torch.from_numpy(targets),
                                            label_smoothing=label_smoothing)
    ref.backward()
    assert abs(loss - ref.item()) <= LOSS_RTOL * abs(ref.item())
    assert np.max(np.abs(dlogits - x.grad.numpy())) <= GRAD_ATOL * TORCH_FACTOR / 4


def test_bitwise_identical_at_1_and_2_threads(isa, restore_threads):
    rng = np.random.default_rng(10)
    logits, targets = make_case(rng, 203, 1003)
    results = []
    for threads in (1, 2):
        _C.set_num_threads(threads)
        dlogits = np.empty_like(logits)
        loss = _C.cross_entropy(logits, targets, dlogits, label_smoothing=0.1)
        out = np.empty_like(logits)
        _C.log_softmax(logits, out)
        results.append((loss, dlogits, out))
    assert results[0][0] == results[1][0]
    np.testing.assert_array_equal(results[0][1], results[1][1])
    np.testing.assert_array_equal(results[0][2], results[1][2])


# --------------------------------------------------------------------------------------------
# log_softmax

@pytest.mark.parametrize("V", [1, 2, 15, 16, 17, 33, 4000])
def test_log_softmax_matches_float64_and_torch(isa, V):
    torch = pytest.importorskip("torch")
    x = (np.random.default_rng(V).standard_normal((13, V)) * 5).astype(np.float32)
    x[0, 0] = 1e4
    out = np.full_like(x, np.nan)
    _C.log_softmax(x, out)
    x64 = x.astype(np.float64)
    m = x64.max(axis=1, keepdims=True)
    ref = x64 - m - np.log(np.exp(x64 - m).sum(axis=1, keepdims=True))
    scale = np.maximum(np.abs(ref), 1.0)  # float32 rounding of values like -1e4
    err = np.max(np.abs(out - ref) / scale)
    assert err <= 1e-6, f"max rel err vs float64 {err:.3g}"
    t = torch.log_softmax(torch.from_numpy(x), dim=1).numpy()
    err_t = np.max(np.abs(out - t) / scale)
    assert err_t <= 1e-6 * TORCH_FACTOR, f"max rel err vs torch {err_t:.3g}"


def test_log_softmax_in_place(isa):
    x = np.random.default_rng(1).standard_normal((9, 70)).astype(np.float32)
    out = np.empty_like(x)
    _C.log_softmax(x, out)
    _C.log_softmax(x, x)
    np.testing.assert_array_equal(x, out)


# --------------------------------------------------------------------------------------------
# Bad input: refused before any C runs, with the argument named

def _case():
    logits = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    return logits, np.array([0, 1, -100, 4], np.int64)


@pytest.mark.parametrize("bad", [np.zeros((4, 5)), np.zeros((4, 5), np.float16),
                                 np.zeros((4, 5), np.int32), np.zeros((4, 5), object),
                                 [[0.0] * 5] * 4])
def test_logits_wrong_type_is_refused(bad):
    _, targets = _case()
    with pytest.raises(TypeError, match="logits"):
        _C.cross_entropy(bad, targets)


def test_logits_wrong_rank_or_layout_is_refused():
    logits, targets = _case()
    with pytest.raises(ValueError, match="logits"):
        _C.cross_entropy(logits.reshape(-1), targets)
    with pytest.raises(ValueError, match="logits"):
        _C.cross_entropy(np.asfortranarray(np.zeros((4, 5), np.float32)), targets)


@pytest.mark.parametrize("bad", [np.zeros(4, np.int32), np.zeros(4, np.float32),
                                 np.zeros(4, np.uint64)])
def test_targets_wrong_dtype_is_refused(bad):
    logits, _ = _case()
    with pytest.raises(TypeError, match="targets"):
        _C.cross_entropy(logits, bad)


def test_targets_wrong_shape_is_refused():
    logits, _ = _case()
    with pytest.raises(ValueError, match="targets"):
        _C.cross_entropy(logits, np.zeros(5, np.int64))
    with pytest.raises(ValueError, match="targets"):
        _C.cross_entropy(logits, np.zeros((4, 1), np.int64))
    with pytest.raises(ValueError, match="targets"):
        _C.cross_entropy(logits, np.zeros(8, np.int64)[::2])


@pytest.mark.parametrize("bad_target", [5, -1, -101, 2**40])
def test_targets_out_of_range_are_refused_before_any_write(bad_target):
    logits, targets = _case()
    targets[3] = bad_target
    dlogits = np.full_like(logits, 7.0)
    with pytest.raises(ValueError, match="targets"):
        _C.cross_entropy(logits, targets, dlogits)
    assert (dlogits == 7.0).all()


def test_ignore_index_zero_makes_zero_ignored_and_minus_100_invalid():
    logits, _ = _case()
    assert _C.cross_entropy(logits, np.array([0, 0, 0, 1]), ignore_index=0)[1] == 1
    with pytest.raises(ValueError, match="targets"):
        _C.cross_entropy(logits, np.array([0, -100, 1, 2]), ignore_index=0)


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan")])
def test_label_smoothing_out_of_range_is_refused(value):
    logits, targets = _case()
    with pytest.raises(ValueError, match="label_smoothing"):
        _C.cross_entropy(logits, targets, label_smoothing=value)


def test_bad_dlogits_is_refused():
    logits, targets = _case()
    with pytest.raises(TypeError, match="dlogits"):
        _C.cross_entropy(logits, targets, np.zeros((4, 5)))
    with pytest.raises(ValueError, match="dlogits"):
        _C.cross_entropy(logits, targets, np.zeros((4, 6), np.float32))
    with pytest.raises(ValueError, match="dlogits"):
        _C.cross_entropy(logits, targets, np.zeros((5, 4), np.float32).T)
    read_only = np.zeros((4, 5), np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="dlogits"):
        _C.cross_entropy(logits, targets, read_only)
    # in place is allowed, any other overlap with logits is not
    buffer = np.zeros(25, np.float32)
    with pytest.raises(ValueError, match="dlogits"):
        _C.cross_entropy(buffer[:20].reshape(4, 5), targets, buffer[5:].reshape(4, 5))


def test_dlogits_overlapping_targets_is_refused():
    logits, _ = _case()
    raw = np.zeros(4 * 5 * 4, np.uint8)
    dlogits = raw.view(np.float32).reshape(4, 5)
    targets = raw[:32].view(np.int64)
    with pytest.raises(ValueError, match="dlogits"):
        _C.cross_entropy(logits, targets, dlogits)


def test_log_softmax_bad_input_is_refused():
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(TypeError, match="x"):
        _C.log_softmax(x.astype(np.float64), x)
    with pytest.raises(TypeError, match="out"):
        _C.log_softmax(x, np.zeros((3, 4)))
    with pytest.raises(ValueError, match="out"):
        _C.log_softmax(x, np.zeros((3, 5), np.float32))
    read_only = np.zeros((3, 4), np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="out"):
        _C.log_softmax(x, read_only)
    with pytest.raises(ValueError, match="x"):
        _C.log_softmax(np.zeros((4, 3), np.float32).T, x)
    buffer = np.zeros(16, np.float32)
    with pytest.raises(ValueError, match="out"):
        _C.log_softmax(buffer[:12].reshape(3, 4), buffer[4:].reshape(3, 4))


def test_read_only_inputs_are_accepted():
    logits, targets = _case()
    expected = _C.cross_entropy(logits, targets, label_smoothing=0.1)
    logits.flags.writeable = False
    targets.flags.writeable = False
    assert _C.cross_entropy(logits, targets, np.empty((4, 5), np.float32),
                            label_smoothing=0.1) == expected
    _C.log_softmax(logits, np.empty((4, 5), np.float32))
