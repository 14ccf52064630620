# Cross-entropy and log-softmax (csrc/loss.h). Included by _C.pyx.

cdef extern from "loss.h" nogil:
    double cross_entropy_forward_backward(const float *logits, const int64_t *targets,
                                          float *dlogits, double *row_loss, long N, long V,
                                          int64_t ignore_index, long n_valid,
                                          double label_smoothing, double grad_scale)
    double cross_entropy_naive(const float *logits, const int64_t *targets, float *dlogits,
                               double *row_loss, long N, long V, int64_t ignore_index,
                               long n_valid, double label_smoothing, double grad_scale)
    void log_softmax_forward(const float *x, float *out, long N, long V)


cdef object _cross_entropy(object logits, object targets, object dlogits, int64_t ignore_index,
                           double label_smoothing, double grad_scale, bint naive):
    _check_f32(logits, "logits", 2)
    _check(targets, "targets", _I64, 1)
    cdef Py_ssize_t N = logits.shape[0], V = logits.shape[1]
    if targets.shape[0] != N:
        raise ValueError(f"targets must have shape ({N},) to match logits {logits.shape}, "
                         f"got {targets.shape}")
    if not (0.0 <= label_smoothing <= 1.0):  # also refuses nan
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    if dlogits is not None:
        _check_f32(dlogits, "dlogits", 2, writeable=True)
        _same_shape(logits, "logits", dlogits, "dlogits")
        _no_overlap(dlogits, "dlogits", targets, "targets")
    # targets: each in [0, V) or == ignore_index; count the valid rows (the gradient's 1/n_valid)
    cdef const int64_t[::1] tv = targets
    cdef Py_ssize_t i, n_valid = 0, bad = -1
    cdef int64_t t
    with nogil:
        for i in range(N):
            t = tv[i]
            if t == ignore_index:
                continue
            if t < 0 or t >= V:
                bad = i
                break
            n_valid += 1
    if bad >= 0:
        raise ValueError(f"targets must be in [0, {V}) or equal ignore_index={ignore_index}; "
                         f"targets[{bad}] = {tv[bad]}")
    if N == 0 or V == 0:  # nothing to read or write (V == 0: every row is ignored)
        return 0.0, 0

    cdef const float[:, ::1] lv = logits
    cdef float[:, ::1] dv
    cdef float *dptr = NULL
    if dlogits is not None:
        dv = dlogits
        dptr = &dv[0, 0]
        # in place is allowed; any other sharing of memory with logits is not
        if <const float *>dptr != &lv[0, 0]:
            _no_overlap(dlogits, "dlogits", logits, "logits")
    cdef double[::1] row_loss = np.empty(N, dtype=np.float64)
    cdef double loss
    with nogil:
        if naive:
            loss = cross_entropy_naive(&lv[0, 0], &tv[0], dptr, &row_loss[0], N, V, ignore_index,
                                       n_valid, label_smoothing, grad_scale)
        else:
            loss = cross_entropy_forward_backward(&lv[0, 0], &tv[0], dptr, &row_loss[0], N, V,
                                                  ignore_index, n_valid, label_smoothing,
                                                  grad_scale)
    return loss, n_valid


def cross_entropy(logits, targets, dlogits=None, int64_t ignore_index=-100,
                  double label_smoothing=0.0, double grad_scale=1.0):
    """F.cross_entropy(logits, targets, ignore_index=..., label_smoothing=...) with mean reduction.

    Returns (loss, n_valid): the mean over rows whose target != ignore_index (as a Python float),
    and how many such rows there were. logits float32 C-contiguous [N, V]; targets int64 [N], each
    in [0, V) or equal to ignore_index (ValueError otherwise). When dlogits (float32 [N, V]) is
    given it receives grad_scale * d loss / d logits (zeros on ignored rows); dlogits may be logits.
    With no valid row the loss is 0.0 and the gradient zero (PyTorch would give nan).
    Deterministic for any thread count.
    """
    return _cross_entropy(logits, targets, dlogits, ignore_index, label_smoothing, grad_scale,
                          False)


def cross_entropy_reference(logits, targets, dlogits=None, int64_t ignore_index=-100,
                            double label_smoothing=0.0, double grad_scale=1.0):
    """Same contract as cross_entropy, computed by the naive two-pass double-precision loop in C
    on one thread (the tests' second opinion)."""
    return _cross_entropy(logits, targets, dlogits, ignore_index, label_smoothing, grad_scale,
                          True)


def log_softmax(x, out):
    """out = log_softmax(x) over the last axis; float32 C-contiguous [N, V]; out may be x."""
    _check_f32(x, "x", 2)
    _check_f32(out, "out", 2, writeable=True)
    _same_shape(x, "x", out, "out")
    cdef Py_ssize_t N = x.shape[0], V = x.shape[1]
    if N == 0 or V == 0:
        return out
    cdef const float[:, ::1] xv = x
    cdef float[:, ::1] ov = out
    if <const float *>&ov[0, 0] != &xv[0, 0]:
        _no_overlap(out, "out", x, "x")
    with nogil:
        log_softmax_forward(&xv[0, 0], &ov[0, 0], N, V)
    return out
