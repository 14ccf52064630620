# Fused Adam/AdamW over one flat buffer, global-norm helpers (csrc/optim.h). Included by _C.pyx.

cdef extern from "optim.h" nogil:
    long TF_SUMSQ_CHUNK
    void adam_update(float *params, const float *grads, float *exp_avg, float *exp_avg_sq, long n,
                     long step, double lr, double beta1, double beta2, double eps,
                     double weight_decay, bint decoupled)
    double sum_squares_f32(const float *x, long n, double *chunk_sums)
    void scale_f32(float *x, long n, float s)
    void zero_f32(float *x, long n)


def adam_step(params, grads, exp_avg, exp_avg_sq, Py_ssize_t step, double lr, double beta1=0.9,
              double beta2=0.999, double eps=1e-8, double weight_decay=0.0, bint decoupled=False):
    """One step of torch.optim.Adam (decoupled=False: weight_decay * param is added to the
    gradient) or torch.optim.AdamW (decoupled=True: param *= 1 - lr * weight_decay), following the
    order of operations of PyTorch's single-tensor CPU implementation. All four arrays float32
    C-contiguous 1-D of one length; params, exp_avg, exp_avg_sq are updated in place; grads is
    not modified. step is the 1-based step count after this update (bias correction).

    The hyper-parameters are Python floats (double), as in torch/optim/adam.py: 1 - beta1,
    lr / bias_correction1 and the like are computed in double and rounded to float32 once.
    Requires step >= 1, lr >= 0, 0 <= beta1, beta2 < 1, eps >= 0, weight_decay >= 0."""
    _check_f32(params, "params", 1, writeable=True)
    _check_f32(grads, "grads", 1)
    _check_f32(exp_avg, "exp_avg", 1, writeable=True)
    _check_f32(exp_avg_sq, "exp_avg_sq", 1, writeable=True)
    _same_shape(params, "params", grads, "grads")
    _same_shape(params, "params", exp_avg, "exp_avg")
    _same_shape(params, "params", exp_avg_sq, "exp_avg_sq")
    _no_overlap(params, "params", grads, "grads")
    _no_overlap(exp_avg, "exp_avg", params, "params")
    _no_overlap(exp_avg, "exp_avg", grads, "grads")
    _no_overlap(exp_avg_sq, "exp_avg_sq", params, "params")
    _no_overlap(exp_avg_sq, "exp_avg_sq", grads, "grads")
    _no_overlap(exp_avg_sq, "exp_avg_sq", exp_avg, "exp_avg")
    if step < 1:
        raise ValueError(f"step must be >= 1 (the count after this update), got {step}")
    if not lr >= 0.0:  # `not >=` also refuses nan
        raise ValueError(f"lr must be >= 0, got {lr}")
    if not 0.0 <= beta1 < 1.0:
        raise ValueError(f"beta1 must be in [0, 1), got {beta1}")
    if not 0.0 <= beta2 < 1.0:
        raise ValueError(f"beta2 must be in [0, 1), got {beta2}")
    if not eps >= 0.0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    if not weight_decay >= 0.0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    cdef Py_ssize_t n = params.shape[0]
    if n == 0:
        return
    cdef float[::1] p = params, m = exp_avg, v = exp_avg_sq
    cdef const float[::1] g = grads
    with nogil:
        adam_update(&p[0], &g[0], &m[0], &v[0], n, step, lr, beta1, beta2, eps, weight_decay,
                    decoupled)


def sum_squares(x):
    """sum(x**2) of a float32 C-contiguous array, accumulated in double in a fixed order
    (same result for any thread count). Returns a Python float."""
    _check_f32(x, "x")
    cdef Py_ssize_t n = x.size
    if n == 0:
        return 0.0
    cdef const float[::1] xv = x.reshape(-1)
    cdef double[::1] chunk_sums = np.empty((n + TF_SUMSQ_CHUNK - 1) // TF_SUMSQ_CHUNK,
                                           dtype=np.float64)
    cdef double total
    with nogil:
        total = sum_squares_f32(&xv[0], n, &chunk_sums[0])
    return total


def scale_(x, float s):
    """x *= s in place (float32 C-contiguous)."""
    _check_f32(x, "x", -1, True)
    cdef Py_ssize_t n = x.size
    if n == 0:
        return x
    cdef float[::1] xv = x.reshape(-1)
    with nogil:
        scale_f32(&xv[0], n, s)
    return x


def zero_(x):
    """x[...] = 0 in place (float32 C-contiguous, writeable), threads over chunks. Returns x."""
    _check_f32(x, "x", -1, True)
    cdef Py_ssize_t n = x.size
    if n == 0:
        return x
    cdef float[::1] xv = x.reshape(-1)
    with nogil:
        zero_f32(&xv[0], n)
    return x
