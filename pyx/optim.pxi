# Fused Adam/AdamW over one flat buffer, global-norm helpers (csrc/optim.h). Included by _C.pyx.

def adam_step(params, grads, exp_avg, exp_avg_sq, Py_ssize_t step, float lr, float beta1=0.9,
              float beta2=0.999, float eps=1e-8, float weight_decay=0.0, bint decoupled=False):
    """One step of torch.optim.Adam (decoupled=False: weight_decay * param is added to the
    gradient) or torch.optim.AdamW (decoupled=True: param *= 1 - lr * weight_decay), following the
    order of operations of PyTorch's single-tensor CPU implementation. All four arrays float32
    C-contiguous 1-D of one length; params, exp_avg, exp_avg_sq are updated in place; grads is
    not modified. step is the 1-based step count after this update (bias correction)."""
    raise NotImplementedError("adam_step")


def sum_squares(x):
    """sum(x**2) of a float32 C-contiguous array, accumulated in double in a fixed order
    (same result for any thread count). Returns a Python float."""
    raise NotImplementedError("sum_squares")


def scale_(x, float s):
    """x *= s in place (float32 C-contiguous)."""
    raise NotImplementedError("scale_")
