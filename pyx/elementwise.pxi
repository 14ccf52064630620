# Bias, residual, activations, dropout (csrc/elementwise.h, csrc/dropout.h). Included by _C.pyx.

def add(a, b, out):
    """out = a + b elementwise (residual connection). float32 C-contiguous arrays of one shape;
    out may be a or b itself."""
    raise NotImplementedError("add")


def add_bias(x, bias):
    """x[n, :] += bias in place. x float32 [N, D]; bias [D]."""
    raise NotImplementedError("add_bias")


def bias_grad(dout, dbias):
    """dbias += dout.sum(axis=0), reduced in a fixed order (same bits for any thread count).
    dout float32 [N, D]; dbias [D]."""
    raise NotImplementedError("bias_grad")


def bias_act_forward(x, bias, out, str activation):
    """Fused bias + activation: x += bias in place (x then holds the pre-activation, which
    act_backward needs), out = act(x). activation: 'relu' or 'gelu' (exact erf form, PyTorch's
    default). x, out float32 [N, D]; bias [D]. out must not be x."""
    raise NotImplementedError("bias_act_forward")


def act_backward(dout, pre, dx, str activation, bint accumulate=False):
    """dx = dout * act'(pre) (dx += ... when accumulate). All float32 of one shape; dx may be dout
    when not accumulate. ReLU's derivative at 0 is 0 (PyTorch's)."""
    raise NotImplementedError("act_backward")


def dropout_forward(x, out, float p, uint64_t seed, uint64_t offset=0):
    """out = x * keep / (1 - p) where keep[i] = (uniform(seed, offset + i) >= p), from a
    counter-based RNG: element i's draw depends only on (seed, offset + i), so the mask is the same
    for any thread count. p in [0, 1); p == 0 copies. x, out float32 of one shape; out may be x."""
    raise NotImplementedError("dropout_forward")


def dropout_backward(dout, dx, float p, uint64_t seed, uint64_t offset=0):
    """dx = dout * keep / (1 - p) with the mask dropout_forward drew for (seed, offset). dx may be dout."""
    raise NotImplementedError("dropout_backward")
