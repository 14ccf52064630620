# Layer norm (csrc/layernorm.h). Included by _C.pyx.

def layernorm_forward(x, weight, bias, out, mean, rstd, float eps=1e-5):
    """nn.LayerNorm over the last axis (biased variance, two passes).
    x, out: float32 C-contiguous [N, D]; weight, bias [D]; mean, rstd [N] receive the row mean and
    1/sqrt(var + eps) for the backward pass. out may be x (then backward needs a copy of x)."""
    raise NotImplementedError("layernorm_forward")


def layernorm_backward(dout, x, weight, mean, rstd, dx, dweight, dbias, bint accumulate=False):
    """Gradients of layernorm_forward. dx = dL/dx (dx += dL/dx when accumulate); dweight and dbias
    are always added into (parameter gradients accumulate). dx may be dout when not accumulate.
    dweight/dbias are reduced over rows in a fixed order: same bits for any thread count."""
    raise NotImplementedError("layernorm_backward")
