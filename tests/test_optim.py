"""Fused Adam/AdamW (transformer._C.adam_step) and the global-norm helpers (sum_squares, scale_).

Specification: adam_step is one step of torch.optim.Adam / AdamW (foreach=False, the
single-tensor CPU path) with the same order of operations and float32/double choices.

Tolerances (stated once):
- With torch's float32 sqrt replaced by the correctly rounded one (numpy's), torch.optim.Adam and
  adam_step are bitwise identical over STEPS steps: every other operation is PyTorch's, in its
  order, with its roundings and its fused multiply-adds. (Unpatched, PyTorch's contiguous float32
  sqrt goes through MKL's vector math, which is not correctly rounded: about 1 element in 5 of
  [0, 1) differs by one ulp.)
- Against unpatched torch: params, exp_avg, exp_avg_sq within TORCH_RTOL of the tensor's largest
  magnitude (those one-ulp differences in sqrt, carried through STEPS steps).
- sum_squares within SUMSQ_RTOL of the float64 sum (double accumulation of exact squares).
"""
import numpy as np
import pytest

from transformer import _C

STEPS = 20
TORCH_RTOL = 1e-6
SUMSQ_RTOL = 1e-12





def random_problem(n, seed=0):
    rng = np.random.default_rng(seed)
    params = rng.standard_normal(n).astype(np.float32)
    # gradients of different sizes per step, some elements tiny, some exactly zero
    grads = []
    for _ in range(STEPS):
        g = rng.standard_normal(n).astype(np.float32) * np.float32(10 ** rng.uniform(-4, 0))
        g[rng.random(n) < 0.01] = 0.0
        grads.append(g)
    return params, grads


def run_both(n, lr, betas, eps, weight_decay, decoupled, seed=0):
    """(torch's params, exp_avg, exp_avg_sq), (ours) after STEPS steps from the same start."""
    import torch
    params0, grads = random_problem(n, seed)
    tp = torch.nn.Parameter(torch.from_numpy(params0.copy()))
    Opt = torch.optim.AdamW if decoupled else torch.optim.Adam
    opt = Opt([tp], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=False)
    p, m, v = params0.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32)
    for step in range(1, STEPS + 1):
        tp.grad = torch.from_numpy(grads[step - 1].copy())
        opt.step()
        _C.adam_step(p, grads[step - 1], m, v, step, lr, betas[0], betas[1], eps, weight_decay,
                     decoupled)
    state = opt.state[tp]
    ref = (tp.detach().numpy(), state["exp_avg"].numpy(), state["exp_avg_sq"].numpy())
    return ref, (p, m, v)


CONFIGS = [  # (weight_decay, decoupled, eps, betas)
    (0.0, False, 1e-9, (0.9, 0.98)),
    (0.0, False, 1e-8, (0.9, 0.98)),
    (0.01, False, 1e-9, (0.9, 0.98)),
    (0.01, False, 1e-8, (0.9, 0.98)),
    (0.01, True, 1e-9, (0.9, 0.98)),
    (0.01, True, 1e-8, (0.9, 0.98)),
    (0.0, True, 1e-8, (0.9, 0.999)),
    (0.1, True, 1e-8, (0.3, 0.5)),   # lerp weight >= 0.5: PyTorch's other lerp formula
    (0.1, False, 0.0, (0.0, 0.0)),
]


@pytest.mark.parametrize("weight_decay,decoupled,eps,betas", CONFIGS)
@pytest.mark.parametrize("n", [1, 15, 16, 17, 33, 4096 + 31])
def test_bitwise_torch_adam_with_correctly_rounded_sqrt(isa, monkeypatch, n, weight_decay,
                                                        decoupled, eps, betas):
    torch = pytest.importorskip("torch")
    calls = []

    def correctly_rounded_sqrt(self):
        calls.append(1)
        return torch.from_numpy(np.sqrt(self.detach().numpy()))

    monkeypatch.setattr(torch.Tensor, "sqrt", correctly_rounded_sqrt)
    ref, ours = run_both(n, 1e-3, betas, eps, weight_decay, decoupled)
    assert len(calls) == STEPS, "torch's Adam no longer calls Tensor.sqrt: update this test"
    for name, r, o in zip(("params", "exp_avg", "exp_avg_sq"), ref, ours):
        differ = int(np.sum(r.view(np.uint32) != o.view(np.uint32)))
        assert differ == 0, f"{name}: {differ} of {n} elements differ from torch"


@pytest.mark.parametrize("weight_decay,decoupled,eps,betas", CONFIGS[:6])
def test_matches_torch_adam_and_adamw(weight_decay, decoupled, eps, betas):
    pytest.importorskip("torch")
    ref, ours = run_both(20011, 1e-3, betas, eps, weight_decay, decoupled, seed=1)
    for name, r, o in zip(("params", "exp_avg", "exp_avg_sq"), ref, ours):
        err = np.max(np.abs(r - o)) / np.max(np.abs(r))
        print(f"{name}: max |ours - torch| / max |torch| = {err:.3g}")
        assert err <= TORCH_RTOL, f"{name}: relative difference {err:.3g} > {TORCH_RTOL}"


def test_bitwise_identical_at_1_and_2_threads(isa, restore_threads):
    params0, grads = random_problem(300007)
    results = []
    for threads in (1, 2):
        _C.set_num_threads(threads)
        p, m, v = params0.copy(), np.zeros_like(params0), np.zeros_like(params0)
        for step in (1, 2, 3):
            _C.adam_step(p, grads[step], m, v, step, 1e-3, 0.9, 0.98, 1e-9, 0.01, True)
        results.append((p, m, v, _C.sum_squares(grads[0]), _C.scale_(grads[1].copy(), 0.3)))
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_grads_are_not_modified():
    params, grads = random_problem(100)
    g = grads[0].copy()
    _C.adam_step(params, g, np.zeros(100, np.float32), np.zeros(100, np.float32), 1, 1e-3,
                 weight_decay=0.1)
    np.testing.assert_array_equal(g, grads[0])


def test_empty_buffers_are_a_no_op():
    # empty views into the middle of larger buffers: nothing around them may be written, the
    # buffers stay empty, and nothing is returned
    backings = [np.arange(40, dtype=np.float32) + 100 * k for k in range(4)]
    before = [b.copy() for b in backings]
    params, grads, exp_avg, exp_avg_sq = (b[16:16] for b in backings)
    assert _C.adam_step(params, grads, exp_avg, exp_avg_sq, 1, 1e-3, weight_decay=0.1) is None
    assert params.shape == grads.shape == exp_avg.shape == exp_avg_sq.shape == (0,)
    for name, b, was in zip(("params", "grads", "exp_avg", "exp_avg_sq"), backings, before):
        np.testing.assert_array_equal(b, was, err_msg=f"{name}'s buffer was written")


# --------------------------------------------------------------------------------------------
# sum_squares, scale_

@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 31, 32, 33, 4095, 4096, 4097, 1000003])
def test_sum_squares_matches_float64(isa, n):
    x = (np.random.default_rng(n).standard_normal(n) * 3).astype(np.float32)
    got = _C.sum_squares(x)
    expected = float(np.sum(x.astype(np.float64) ** 2))
    assert isinstance(got, float)
    assert abs(got - expected) <= SUMSQ_RTOL * expected, f"{got} vs {expected}"


def test_sum_squares_any_shape():
    x = np.random.default_rng(0).standard_normal((7, 3, 5)).astype(np.float32)
    assert abs(_C.sum_squares(x) - np.sum(x.astype(np.float64) ** 2)) <= SUMSQ_RTOL * np.sum(x.astype(np.float64) ** 2)
    assert _C.sum_squares(np.full((), 3.0, np.float32)) == 9.0


@pytest.mark.parametrize("n", [0, 1, 17, 100003])
def test_scale_in_place(isa, n):
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    expected = x * np.float32(0.37)
    assert _C.scale_(x, 0.37) is x
    np.testing.assert_array_equal(x, expected)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("n", [0, 1, 17, 100003, 1000003])
def test_zero_clears_everything_even_nan_and_inf(n, threads, restore_threads):
    _C.set_num_threads(threads)
    big = np.full(n + 2, 7.0, np.float32)
    x = big[1:n + 1]
    x[::3] = np.nan
    x[1::3] = -np.inf
    assert _C.zero_(x) is x
    assert (x == 0).all() and not np.signbit(x).any()   # +0.0, not x * 0
    assert big[0] == 7.0 and big[-1] == 7.0             # nothing around it


def test_zero_refuses_what_it_cannot_clear():
    with pytest.raises(TypeError, match="x"):
        _C.zero_(np.ones(4))
    with pytest.raises(ValueError, match="x"):
        _C.zero_(np.ones(8, np.float32)[::2])
    ro = np.ones(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="x"):
        _C.zero_(ro)


def test_model_zero_grad_clears_the_gradient_buffer():
    import transformer as T
    cfg = T.ModelConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=16, n_heads=2, d_ff=24,
                        n_encoder_layers=1, n_decoder_layers=1, max_len=8)
    model = T.Seq2SeqTransformer(cfg, seed=0)
    model.params.flat_grad[:] = np.nan
    model.zero_grad()
    assert (model.params.flat_grad == 0).all()


# --------------------------------------------------------------------------------------------
# Bad input: refused with the argument named, nothing modified

def _buffers(n=8):
    return [np.ones(n, np.float32) for _ in range(4)]


@pytest.mark.parametrize("position,name", [(0, "params"), (1, "grads"), (2, "exp_avg"),
                                           (3, "exp_avg_sq")])
def test_adam_bad_arrays_are_refused(position, name):
    for bad, error in [(np.ones(8), TypeError), (np.ones(8, np.float16), TypeError),
                       (np.ones(8, np.int32), TypeError), (np.ones(8, object), TypeError),
                       ([1.0] * 8, TypeError), (np.ones(9, np.float32), ValueError),
                       (np.ones((2, 4), np.float32), ValueError),
                       (np.ones(16, np.float32)[::2], ValueError)]:
        args = _buffers()
        args[position] = bad
        with pytest.raises(error, match=name):
            _C.adam_step(*args, 1, 1e-3)


@pytest.mark.parametrize("position,name", [(0, "params"), (2, "exp_avg"), (3, "exp_avg_sq")])
def test_adam_read_only_state_is_refused(position, name):
    args = _buffers()
    args[position].flags.writeable = False
    before = [a.copy() for a in args]
    with pytest.raises(ValueError, match=name):
        _C.adam_step(*args, 1, 1e-3)
    for a, b in zip(args, before):
        np.testing.assert_array_equal(a, b)


def test_adam_overlapping_buffers_are_refused():
    p, g, m, v = _buffers()
    with pytest.raises(ValueError, match="exp_avg"):
        _C.adam_step(p, g, p, v, 1, 1e-3)
    with pytest.raises(ValueError, match="params"):
        _C.adam_step(p, p, m, v, 1, 1e-3)


@pytest.mark.parametrize("kwargs,name", [
    (dict(step=0), "step"), (dict(lr=-1e-3), "lr"), (dict(lr=float("nan")), "lr"),
    (dict(beta1=1.0), "beta1"), (dict(beta1=-0.1), "beta1"), (dict(beta2=1.0), "beta2"),
    (dict(beta2=float("nan")), "beta2"), (dict(eps=-1e-8), "eps"),
    (dict(weight_decay=-0.1), "weight_decay")])
def test_adam_bad_hyper_parameters_are_refused(kwargs, name):
    p, g, m, v = _buffers()
    args = dict(step=1, lr=1e-3)
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        _C.adam_step(p, g, m, v, **args)
    assert (p == 1).all() and (m == 1).all() and (v == 1).all()


def test_sum_squares_and_scale_bad_input_is_refused():
    for bad in (np.ones(4), np.ones(4, np.float16), [1.0]):
        with pytest.raises(TypeError, match="x"):
            _C.sum_squares(bad)
        with pytest.raises(TypeError, match="x"):
            _C.scale_(bad, 2.0)
    with pytest.raises(ValueError, match="x"):
        _C.sum_squares(np.ones(8, np.float32)[::2])
    read_only = np.ones(4, np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="x"):
        _C.scale_(read_only, 2.0)
    with pytest.raises(ValueError, match="x"):
        _C.scale_(np.ones((4, 4), np.float32).T, 2.0)


def test_read_only_grads_and_sum_squares_input_are_accepted():
    p, g, m, v = _buffers()
    g.flags.writeable = False
    _C.adam_step(p, g, m, v, 1, 1e-3)
    assert _C.sum_squares(g) == 8.0
