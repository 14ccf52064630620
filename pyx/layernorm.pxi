# Layer norm (csrc/layernorm.h). Included by _C.pyx.

cdef extern from "layernorm.h" nogil:
    void c_layernorm_forward "layernorm_forward"(float *out, float *mean, float *rstd,
                                                 const float *x, const float *weight,
                                                 const float *bias, long N, long D, float eps)
    size_t c_layernorm_backward_scratch "layernorm_backward_scratch"(long N, long D)
    void c_layernorm_backward "layernorm_backward"(float *dx, float *dweight, float *dbias,
                                                   float *scratch, const float *dout,
                                                   const float *x, const float *weight,
                                                   const float *mean, const float *rstd,
                                                   long N, long D, int accumulate)


cdef inline void _check_rows(object x, str name, object like, str like_name) except *:
    """x is [N, D] with N, D of `like` [N, D]."""
    if x.shape != like.shape:
        raise ValueError(f"{name} must have the shape of {like_name} {like.shape}, got {x.shape}")


cdef inline void _check_vec(object v, str name, Py_ssize_t n, str what) except *:
    if v.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},) ({what}), got {v.shape}")


def layernorm_forward(x, weight, bias, out, mean, rstd, eps=1e-5):
    """nn.LayerNorm over the last axis (biased variance, two passes).
    x, out: float32 C-contiguous [N, D]; weight, bias [D]; mean, rstd [N] receive the row mean and
    1/sqrt(var + eps) for the backward pass. out may be x (then backward needs a copy of x).
    D must be >= 1; eps a finite number >= 0."""
    _check_f32(x, "x", 2)
    cdef Py_ssize_t N = x.shape[0], D = x.shape[1]
    if D < 1:
        raise ValueError(f"x must have a non-empty last axis, got shape {x.shape}")
    _check_f32(weight, "weight", 1)
    _check_vec(weight, "weight", D, "the last axis of x")
    _check_f32(bias, "bias", 1)
    _check_vec(bias, "bias", D, "the last axis of x")
    _check_f32(out, "out", 2, True)
    _check_rows(out, "out", x, "x")
    _check_f32(mean, "mean", 1, True)
    _check_vec(mean, "mean", N, "the rows of x")
    _check_f32(rstd, "rstd", 1, True)
    _check_vec(rstd, "rstd", N, "the rows of x")
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.integer, np.floating)):
        raise TypeError(f"eps must be a number, got {type(eps).__name__}")
    cdef float feps = <float>float(eps)
    if not (feps >= 0 and feps - feps == 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    _same_or_disjoint(out, "out", x, "x")
    for oname, o in (("out", out), ("mean", mean), ("rstd", rstd)):
        _no_overlap(o, oname, weight, "weight")
        _no_overlap(o, oname, bias, "bias")
    _no_overlap(mean, "mean", x, "x")
    _no_overlap(rstd, "rstd", x, "x")
    _no_overlap(mean, "mean", out, "out")
    _no_overlap(rstd, "rstd", out, "out")
    _no_overlap(rstd, "rstd", mean, "mean")
    if N == 0:
        return
    cdef const float[:, ::1] xv = x
    cdef const float[::1] wv = weight
    cdef const float[::1] bv = bias
    cdef float[:, ::1] ov = out
    cdef float[::1] mv = mean
    cdef float[::1] rv = rstd
    with nogil:
        c_layernorm_forward(&ov[0, 0], &mv[0], &rv[0], &xv[0, 0], &wv[0], &bv[0], N, D, feps)


def layernorm_backward(dout, x, weight, mean, rstd, dx, dweight, dbias, bint accumulate=False):
    """Gradients of layernorm_forward. dx = dL/dx (dx += dL/dx when accumulate); dweight and dbias
    are always added into (parameter gradients accumulate). dx may be dout when not accumulate.
    dweight/dbias are reduced over rows in a fixed order: same bits for any thread count."""
    _check_f32(dout, "dout", 2)
    cdef Py_ssize_t N = dout.shape[0], D = dout.shape[1]
    if D < 1:
        raise ValueError(f"dout must have a non-empty last axis, got shape {dout.shape}")
    _check_f32(x, "x", 2)
    _check_rows(x, "x", dout, "dout")
    _check_f32(weight, "weight", 1)
    _check_vec(weight, "weight", D, "the last axis of dout")
    _check_f32(mean, "mean", 1)
    _check_vec(mean, "mean", N, "the rows of dout")
    _check_f32(rstd, "rstd", 1)
    _check_vec(rstd, "rstd", N, "the rows of dout")
    _check_f32(dx, "dx", 2, True)
    _check_rows(dx, "dx", dout, "dout")
    _check_f32(dweight, "dweight", 1, True)
    _check_vec(dweight, "dweight", D, "the last axis of dout")
    _check_f32(dbias, "dbias", 1, True)
    _check_vec(dbias, "dbias", D, "the last axis of dout")
    if accumulate:
        _no_overlap(dx, "dx", dout, "dout")
    else:
        _same_or_disjoint(dx, "dx", dout, "dout")
    for iname, i in (("x", x), ("weight", weight), ("mean", mean), ("rstd", rstd)):
        _no_overlap(dx, "dx", i, iname)
        _no_overlap(dweight, "dweight", i, iname)
        _no_overlap(dbias, "dbias", i, iname)
    _no_overlap(dweight, "dweight", dout, "dout")
    _no_overlap(dbias, "dbias", dout, "dout")
    _no_overlap(dweight, "dweight", dx, "dx")
    _no_overlap(dbias, "dbias", dx, "dx")
    _no_overlap(dbias, "dbias", dweight, "dweight")
    if N == 0:
        return
    scratch = np.empty(c_layernorm_backward_scratch(N, D), dtype=np.float32)
    cdef float[::1] sv = scratch
    cdef const float[:, ::1] dyv = dout
    cdef const float[:, ::1] xv = x
    cdef const float[::1] wv = weight
    cdef const float[::1] mv = mean
    cdef const float[::1] rv = rstd
    cdef float[:, ::1] dxv = dx
    cdef float[::1] dwv = dweight
    cdef float[::1] dbv = dbias
    with nogil:
        c_layernorm_backward(&dxv[0, 0], &dwv[0], &dbv[0], &sv[0], &dyv[0, 0], &xv[0, 0], &wv[0],
                             &mv[0], &rv[0], N, D, accumulate)
