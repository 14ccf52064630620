# Layer norm (csrc/layernorm.h). Included by _C.pyx (after softmax.pxi, whose _nn_* checks it uses).

cdef extern from "layernorm.h" nogil:
    void c_layernorm_forward "layernorm_forward"(float *out, float *mean, float *rstd,
                                                 const float *x, const float *weight,
                                                 const float *bias, long N, long D, float eps)
    void c_scalenorm_forward "scalenorm_forward"(float *out, float *norms, const float *x, float g,
                                                 long N, long D, float eps)
    void c_scalenorm_backward "scalenorm_backward"(float *dx, float *dg, const float *dout, const float *x,
                                                   const float *norms, float g, long N, long D, float eps,
                                                   int accumulate)
    void c_scalenorm_forward_at "scalenorm_forward_at"(float *out, float *norms, const float *x, float g,
                                                       const int64_t *rows, long n, long D, float eps)
    void c_scalenorm_backward_at "scalenorm_backward_at"(float *dx, float *dout, const float *x,
                                                         const float *norms, float g, const int64_t *rows,
                                                         long n, long D, float eps)
    size_t c_layernorm_backward_scratch "layernorm_backward_scratch"(long N, long D)
    void c_layernorm_backward "layernorm_backward"(float *dx, float *dweight, float *dbias,
                                                   float *scratch, const float *dout,
                                                   const float *x, const float *weight,
                                                   const float *mean, const float *rstd,
                                                   long N, long D, int accumulate)

from libc.stdlib cimport malloc, free


cdef inline float _eps_arg(object eps) except? -1:
    cdef float value
    if type(eps) is float:
        value = <float>(<double>eps)
    elif isinstance(eps, bool) or not isinstance(eps, (int, float, np.integer, np.floating)):
        raise TypeError(f"eps must be a number, got {type(eps).__name__}")
    else:
        value = <float>float(eps)
    if not (value >= 0 and value - value == 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    return value


cdef inline void _nn_rows_like(cnp.ndarray x, str name, cnp.ndarray like, str like_name) except *:
    if not _nn_same_dims(x, like):
        raise ValueError(f"{name} must have the shape of {like_name} {(<object>like).shape}, got {(<object>x).shape}")


def layernorm_forward(x, weight, bias, out, mean, rstd, eps=1e-5):
    """nn.LayerNorm over the last axis (biased variance, two passes).
    x, out: float32 C-contiguous [N, D]; weight, bias [D]; mean, rstd [N] receive the row mean and
    1/sqrt(var + eps) for the backward pass. out may be x (then backward needs a copy of x).
    D must be >= 1; eps a finite number >= 0."""
    cdef cnp.ndarray xa = _nn_f32(x, "x", 2)
    cdef Py_ssize_t N = cnp.PyArray_DIMS(xa)[0], D = cnp.PyArray_DIMS(xa)[1]
    if D < 1:
        raise ValueError(f"x must have a non-empty last axis, got shape {x.shape}")
    cdef cnp.ndarray wa = _nn_f32(weight, "weight", 1)
    _nn_vector(wa, "weight", D, "the last axis of x")
    cdef cnp.ndarray ba = _nn_f32(bias, "bias", 1)
    _nn_vector(ba, "bias", D, "the last axis of x")
    cdef cnp.ndarray oa = _nn_f32(out, "out", 2, True)
    _nn_rows_like(oa, "out", xa, "x")
    cdef cnp.ndarray ma = _nn_f32(mean, "mean", 1, True)
    _nn_vector(ma, "mean", N, "the rows of x")
    cdef cnp.ndarray ra = _nn_f32(rstd, "rstd", 1, True)
    _nn_vector(ra, "rstd", N, "the rows of x")
    cdef float feps = _eps_arg(eps)
    _nn_same_or_disjoint(oa, "out", xa, "x")
    _nn_no_overlap(oa, "out", wa, "weight")
    _nn_no_overlap(oa, "out", ba, "bias")
    _nn_no_overlap(ma, "mean", wa, "weight")
    _nn_no_overlap(ma, "mean", ba, "bias")
    _nn_no_overlap(ra, "rstd", wa, "weight")
    _nn_no_overlap(ra, "rstd", ba, "bias")
    _nn_no_overlap(ma, "mean", xa, "x")
    _nn_no_overlap(ra, "rstd", xa, "x")
    _nn_no_overlap(ma, "mean", oa, "out")
    _nn_no_overlap(ra, "rstd", oa, "out")
    _nn_no_overlap(ra, "rstd", ma, "mean")
    cdef float *op = <float *>cnp.PyArray_DATA(oa)
    cdef float *mp = <float *>cnp.PyArray_DATA(ma)
    cdef float *rp = <float *>cnp.PyArray_DATA(ra)
    cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
    cdef const float *wp = <const float *>cnp.PyArray_DATA(wa)
    cdef const float *bp = <const float *>cnp.PyArray_DATA(ba)
    if N == 0:
        return
    with nogil:
        c_layernorm_forward(op, mp, rp, xp, wp, bp, N, D, feps)


def layernorm_backward(dout, x, weight, mean, rstd, dx, dweight, dbias, bint accumulate=False):
    """Gradients of layernorm_forward. dx = dL/dx (dx += dL/dx when accumulate); dweight and dbias
    are always added into (parameter gradients accumulate). dx may be dout when not accumulate.
    dweight/dbias are reduced over rows in a fixed order: same bits for any thread count."""
    cdef cnp.ndarray dya = _nn_f32(dout, "dout", 2)
    cdef Py_ssize_t N = cnp.PyArray_DIMS(dya)[0], D = cnp.PyArray_DIMS(dya)[1]
    if D < 1:
        raise ValueError(f"dout must have a non-empty last axis, got shape {dout.shape}")
    cdef cnp.ndarray xa = _nn_f32(x, "x", 2)
    _nn_rows_like(xa, "x", dya, "dout")
    cdef cnp.ndarray wa = _nn_f32(weight, "weight", 1)
    _nn_vector(wa, "weight", D, "the last axis of dout")
    cdef cnp.ndarray ma = _nn_f32(mean, "mean", 1)
    _nn_vector(ma, "mean", N, "the rows of dout")
    cdef cnp.ndarray ra = _nn_f32(rstd, "rstd", 1)
    _nn_vector(ra, "rstd", N, "the rows of dout")
    cdef cnp.ndarray dxa = _nn_f32(dx, "dx", 2, True)
    _nn_rows_like(dxa, "dx", dya, "dout")
    cdef cnp.ndarray dwa = _nn_f32(dweight, "dweight", 1, True)
    _nn_vector(dwa, "dweight", D, "the last axis of dout")
    cdef cnp.ndarray dba = _nn_f32(dbias, "dbias", 1, True)
    _nn_vector(dba, "dbias", D, "the last axis of dout")
    if accumulate:
        _nn_no_overlap(dxa, "dx", dya, "dout")
    else:
        _nn_same_or_disjoint(dxa, "dx", dya, "dout")
    for o, oname in ((dxa, "dx"), (dwa, "dweight"), (dba, "dbias")):
        _nn_no_overlap(o, oname, xa, "x")
        _nn_no_overlap(o, oname, wa, "weight")
        _nn_no_overlap(o, oname, ma, "mean")
        _nn_no_overlap(o, oname, ra, "rstd")
    _nn_no_overlap(dwa, "dweight", dya, "dout")
    _nn_no_overlap(dba, "dbias", dya, "dout")
    _nn_no_overlap(dwa, "dweight", dxa, "dx")
    _nn_no_overlap(dba, "dbias", dxa, "dx")
    _nn_no_overlap(dba, "dbias", dwa, "dweight")
    if N == 0:
        return
    cdef float *dxp = <float *>cnp.PyArray_DATA(dxa)
    cdef float *dwp = <float *>cnp.PyArray_DATA(dwa)
    cdef float *dbp = <float *>cnp.PyArray_DATA(dba)
    cdef const float *dyp = <const float *>cnp.PyArray_DATA(dya)
    cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
    cdef const float *wp = <const float *>cnp.PyArray_DATA(wa)
    cdef const float *mp = <const float *>cnp.PyArray_DATA(ma)
    cdef const float *rp = <const float *>cnp.PyArray_DATA(ra)
    cdef float *scratch = <float *>malloc(c_layernorm_backward_scratch(N, D) * sizeof(float))
    if scratch == NULL:
        raise MemoryError("layernorm_backward: no memory for the partial sums")
    with nogil:
        c_layernorm_backward(dxp, dwp, dbp, scratch, dyp, xp, wp, mp, rp, N, D, accumulate)
    free(scratch)


def scalenorm_forward(x, g, out, norms, eps=1e-5):
    """ScaleNorm over the last axis (csrc/layernorm.h): out = x * (g / max(||x||, eps)) per row.
    x, out: float32 C-contiguous [N, D] (out may be x); g: float32 [1]; norms [N] receives each
    row's clamped norm. D must be >= 1; eps a finite number >= 0."""
    cdef cnp.ndarray xa = _nn_f32(x, "x", 2)
    cdef Py_ssize_t N = cnp.PyArray_DIMS(xa)[0], D = cnp.PyArray_DIMS(xa)[1]
    if D < 1:
        raise ValueError(f"x must have a non-empty last axis, got shape {x.shape}")
    cdef cnp.ndarray ga = _nn_f32(g, "g", 1)
    _nn_vector(ga, "g", 1, "one gain")
    cdef cnp.ndarray oa = _nn_f32(out, "out", 2, True)
    _nn_rows_like(oa, "out", xa, "x")
    cdef cnp.ndarray na = _nn_f32(norms, "norms", 1, True)
    _nn_vector(na, "norms", N, "the rows of x")
    cdef float feps = _eps_arg(eps)
    _nn_same_or_disjoint(oa, "out", xa, "x")
    _nn_no_overlap(na, "norms", xa, "x")
    _nn_no_overlap(na, "norms", oa, "out")
    cdef float *op = <float *>cnp.PyArray_DATA(oa)
    cdef float *np_ = <float *>cnp.PyArray_DATA(na)
    cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
    cdef float gv = (<const float *>cnp.PyArray_DATA(ga))[0]
    if N == 0:
        return
    with nogil:
        c_scalenorm_forward(op, np_, xp, gv, N, D, feps)


def scalenorm_backward(dout, x, norms, g, dx, dg=None, eps=1e-5, bint accumulate=False):
    """The backward of scalenorm_forward (csrc/layernorm.h): dx (+)= the input gradient [N, D];
    dg (float32 [1], or None) += the gain's gradient. dout, x [N, D]; norms [N] from the forward;
    g float32 [1]. dx may be dout when not accumulate."""
    cdef cnp.ndarray ya = _nn_f32(dout, "dout", 2)
    cdef Py_ssize_t N = cnp.PyArray_DIMS(ya)[0], D = cnp.PyArray_DIMS(ya)[1]
    cdef cnp.ndarray xa = _nn_f32(x, "x", 2)
    _nn_rows_like(xa, "x", ya, "dout")
    cdef cnp.ndarray na = _nn_f32(norms, "norms", 1)
    _nn_vector(na, "norms", N, "the rows of x")
    cdef cnp.ndarray ga = _nn_f32(g, "g", 1)
    _nn_vector(ga, "g", 1, "one gain")
    cdef cnp.ndarray da = _nn_f32(dx, "dx", 2, True)
    _nn_rows_like(da, "dx", ya, "dout")
    cdef cnp.ndarray dga = None
    cdef float *dgp = NULL
    if dg is not None:
        dga = _nn_f32(dg, "dg", 1, True)
        _nn_vector(dga, "dg", 1, "one gain")
        dgp = <float *>cnp.PyArray_DATA(dga)
        _nn_no_overlap(dga, "dg", da, "dx")
    cdef float feps = _eps_arg(eps)
    if accumulate:
        _nn_no_overlap(da, "dx", ya, "dout")
    else:
        _nn_same_or_disjoint(da, "dx", ya, "dout")
    _nn_no_overlap(da, "dx", xa, "x")
    _nn_no_overlap(da, "dx", na, "norms")
    cdef float *dp = <float *>cnp.PyArray_DATA(da)
    cdef const float *yp = <const float *>cnp.PyArray_DATA(ya)
    cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
    cdef const float *npp = <const float *>cnp.PyArray_DATA(na)
    cdef float gv = (<const float *>cnp.PyArray_DATA(ga))[0]
    if N == 0:
        return
    with nogil:
        c_scalenorm_backward(dp, dgp, yp, xp, npp, gv, N, D, feps, accumulate)


cdef cnp.ndarray _table_rows(rows, Py_ssize_t N):
    """rows: int64 C-contiguous [n], strictly increasing, in [0, N) (np.unique's output)."""
    if not isinstance(rows, np.ndarray) or rows.dtype != np.int64 or rows.ndim != 1 \
            or not rows.flags.c_contiguous:
        raise TypeError(f"rows must be a C-contiguous 1-D int64 array, got "
                        f"{getattr(rows, 'dtype', type(rows).__name__)} {getattr(rows, 'shape', '')}")
    cdef cnp.ndarray ra = <cnp.ndarray>rows
    cdef const int64_t *rp = <const int64_t *>cnp.PyArray_DATA(ra)
    cdef Py_ssize_t i, n = cnp.PyArray_DIMS(ra)[0]
    for i in range(n):
        if rp[i] < 0 or rp[i] >= N or (i > 0 and rp[i] <= rp[i - 1]):
            raise ValueError(f"rows must be strictly increasing indices in [0, {N}), got {rows[max(i - 1, 0):i + 1]} "
                             f"at position {i}")
    return ra


def scalenorm_forward_at(x, g, out, norms, rows, eps=1e-5):
    """scalenorm_forward at `rows` of x only (csrc/layernorm.h): out[rows] and norms[rows] get the
    bits the whole array's call gives them; other rows are left as they are. rows: strictly
    increasing int64 [n] in [0, N). x, out [N, D] float32 C-contiguous, distinct; norms [N]."""
    cdef cnp.ndarray xa = _nn_f32(x, "x", 2)
    cdef Py_ssize_t N = cnp.PyArray_DIMS(xa)[0], D = cnp.PyArray_DIMS(xa)[1]
    if D < 1:
        raise ValueError(f"x must have a non-empty last axis, got shape {x.shape}")
    cdef cnp.ndarray ga = _nn_f32(g, "g", 1)
    _nn_vector(ga, "g", 1, "one gain")
    cdef cnp.ndarray oa = _nn_f32(out, "out", 2, True)
    _nn_rows_like(oa, "out", xa, "x")
    cdef cnp.ndarray na = _nn_f32(norms, "norms", 1, True)
    _nn_vector(na, "norms", N, "the rows of x")
    cdef cnp.ndarray ra = _table_rows(rows, N)
    cdef float feps = _eps_arg(eps)
    _nn_no_overlap(oa, "out", xa, "x")
    _nn_no_overlap(na, "norms", xa, "x")
    _nn_no_overlap(na, "norms", oa, "out")
    cdef float *op = <float *>cnp.PyArray_DATA(oa)
    cdef float *np_ = <float *>cnp.PyArray_DATA(na)
    cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
    cdef const int64_t *rp = <const int64_t *>cnp.PyArray_DATA(ra)
    cdef float gv = (<const float *>cnp.PyArray_DATA(ga))[0]
    cdef long n = cnp.PyArray_DIMS(ra)[0]
    with nogil:
        c_scalenorm_forward_at(op, np_, xp, gv, rp, n, D, feps)


def scalenorm_backward_at(dout, x, norms, g, dx, rows, eps=1e-5):
    """scalenorm_backward(..., accumulate=True) at `rows` only: dx[rows] += their input gradient,
    with the bits the whole array's call gives them, then dout[rows] = 0 (a gradient buffer that
    only these rows dirtied is clean again). rows as scalenorm_forward_at; dout, x, dx [N, D]
    float32 C-contiguous, dx apart from the others; norms [N] from the forward."""
    cdef cnp.ndarray ya = _nn_f32(dout, "dout", 2, True)
    cdef Py_ssize_t N = cnp.PyArray_DIMS(ya)[0], D = cnp.PyArray_DIMS(ya)[1]
    cdef cnp.ndarray xa = _nn_f32(x, "x", 2)
    _nn_rows_like(xa, "x", ya, "dout")
    cdef cnp.ndarray na = _nn_f32(norms, "norms", 1)
    _nn_vector(na, "norms", N, "the rows of x")
    cdef cnp.ndarray ga = _nn_f32(g, "g", 1)
    _nn_vector(ga, "g", 1, "one gain")
    cdef cnp.ndarray da = _nn_f32(dx, "dx", 2, True)
    _nn_rows_like(da, "dx", ya, "dout")
    cdef cnp.ndarray ra = _table_rows(rows, N)
    cdef float feps = _eps_arg(eps)
    _nn_no_overlap(da, "dx", ya, "dout")
    _nn_no_overlap(da, "dx", xa, "x")
    _nn_no_overlap(da, "dx", na, "norms")
    _nn_no_overlap(ya, "dout", xa, "x")
    _nn_no_overlap(ya, "dout", na, "norms")
    cdef float *dp = <float *>cnp.PyArray_DATA(da)
    cdef float *yp = <float *>cnp.PyArray_DATA(ya)
    cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
    cdef const float *npp = <const float *>cnp.PyArray_DATA(na)
    cdef const int64_t *rp = <const int64_t *>cnp.PyArray_DATA(ra)
    cdef float gv = (<const float *>cnp.PyArray_DATA(ga))[0]
    cdef long n = cnp.PyArray_DIMS(ra)[0]
    with nogil:
        c_scalenorm_backward_at(dp, yp, xp, npp, gv, rp, n, D, feps)
