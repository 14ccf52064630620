# Masked softmax (csrc/softmax.h). Included by _C.pyx.

cdef extern from "softmax.h" nogil:
    void c_softmax_forward "softmax_forward"(float *probs, const float *scores,
                                             const uint8_t *key_padding_mask, long B, long H,
                                             long Tq, long Tk, float scale, int causal,
                                             long q_offset)
    void c_softmax_backward "softmax_backward"(float *dscores, const float *probs,
                                               const float *dprobs, long rows, long Tk,
                                               float scale)
    void c_tf_exp_array "tf_exp_array"(float *out, const float *x, long n)


# Fast argument checks (numpy C-API, no Python attribute lookups: these kernels run in tens of
# microseconds at training shapes, so the door's cost matters). On any failure the shared
# checks of _C.pyx run and raise their messages, which name the argument.

cimport numpy as cnp


cdef inline bint _nn_f32_ok(object x, int ndim, bint writeable):
    cdef cnp.ndarray a
    if not cnp.PyArray_Check(x):
        return False
    a = <cnp.ndarray>x
    return (cnp.PyArray_TYPE(a) == cnp.NPY_FLOAT32 and cnp.PyArray_ISNOTSWAPPED(a)
            and cnp.PyArray_IS_C_CONTIGUOUS(a) and (ndim < 0 or cnp.PyArray_NDIM(a) == ndim)
            and (not writeable or cnp.PyArray_ISWRITEABLE(a)))


cdef inline cnp.ndarray _nn_f32(object x, str name, int ndim=-1, bint writeable=False):
    """x as a float32 C-contiguous ndarray (of rank `ndim` when >= 0, writeable when asked),
    or TypeError/ValueError naming it."""
    if not _nn_f32_ok(x, ndim, writeable):
        _check_f32(x, name, ndim, writeable)
        raise ValueError(f"{name} must be a float32 C-contiguous array")   # not reached
    return <cnp.ndarray>x


cdef inline bint _nn_same_dims(cnp.ndarray a, cnp.ndarray b):
    cdef int nd = cnp.PyArray_NDIM(a)
    if cnp.PyArray_NDIM(b) != nd:
        return False
    cdef cnp.npy_intp *da = cnp.PyArray_DIMS(a)
    cdef cnp.npy_intp *db = cnp.PyArray_DIMS(b)
    for i in range(nd):
        if da[i] != db[i]:
            return False
    return True


cdef inline void _nn_shape_like(cnp.ndarray x, str xname, cnp.ndarray y, str yname) except *:
    if not _nn_same_dims(x, y):
        _same_shape(x, xname, y, yname)


cdef inline void _nn_vector(cnp.ndarray v, str name, Py_ssize_t n, str what) except *:
    if cnp.PyArray_NDIM(v) != 1 or cnp.PyArray_DIMS(v)[0] != n:
        raise ValueError(f"{name} must have shape ({n},) ({what}), got {(<object>v).shape}")


cdef inline bint _nn_overlap(cnp.ndarray a, cnp.ndarray b):
    """Whether two C-contiguous arrays share any byte (exact)."""
    cdef char *pa = <char *>cnp.PyArray_DATA(a)
    cdef char *pb = <char *>cnp.PyArray_DATA(b)
    cdef Py_ssize_t na = cnp.PyArray_NBYTES(a), nb = cnp.PyArray_NBYTES(b)
    return na > 0 and nb > 0 and pa < pb + nb and pb < pa + na


cdef inline void _nn_no_overlap(cnp.ndarray out, str oname, cnp.ndarray x, str xname) except *:
    if _nn_overlap(out, x):
        raise ValueError(f"{oname} must not overlap {xname}")


cdef inline void _nn_same_or_disjoint(cnp.ndarray out, str oname, cnp.ndarray x, str xname) except *:
    """`out` is `x` itself (same memory, same shape: checked before) or does not overlap it."""
    if _nn_overlap(out, x) and cnp.PyArray_DATA(out) != cnp.PyArray_DATA(x):
        raise ValueError(f"{oname} must be {xname} itself (in place) or not overlap it")


cdef inline float _finite_scale(object scale) except? -1:
    """A real number, finite once rounded to float32."""
    cdef float value
    if type(scale) is float:
        value = <float>(<double>scale)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise TypeError(f"scale must be a number, got {type(scale).__name__}")
    else:
        value = <float>float(scale)
    if not (value == value and value - value == 0):
        raise ValueError(f"scale must be finite (as float32), got {scale}")
    return value


cdef inline Py_ssize_t _offset(object q_offset) except? -1:
    if type(q_offset) is not int and (isinstance(q_offset, bool)
                                      or not isinstance(q_offset, (int, np.integer))):
        raise TypeError(f"q_offset must be an int, got {type(q_offset).__name__}")
    if q_offset < 0:
        raise ValueError(f"q_offset must be >= 0, got {q_offset}")
    return <Py_ssize_t>min(int(q_offset), 1 << 62)


def softmax_forward(scores, probs, scale=1.0, bint causal=False, key_padding_mask=None,
                    q_offset=0):
    """probs = softmax(scale * scores + masks) over the last axis, in one pass per row.

    scores, probs: float32, C-contiguous, [B, H, Tq, Tk] or [B, Tq, Tk], the same shape; probs may
    be scores itself (in place). key_padding_mask: None or bool/uint8 C-contiguous [B, Tk], True =
    padding (ignored key). causal: query i, at absolute position q_offset + i, sees keys
    k <= q_offset + i (q_offset > 0 when decoding with a key/value cache). A row whose keys are all
    masked gives zeros, never NaN.
    """
    cdef cnp.ndarray s = _nn_f32(scores, "scores")
    cdef int nd = cnp.PyArray_NDIM(s)
    if nd != 3 and nd != 4:
        raise ValueError(f"scores must be 3-D [B, Tq, Tk] or 4-D [B, H, Tq, Tk], got shape {scores.shape}")
    cdef cnp.ndarray p = _nn_f32(probs, "probs", -1, True)
    _nn_shape_like(s, "scores", p, "probs")
    _nn_same_or_disjoint(p, "probs", s, "scores")
    cdef float fscale = _finite_scale(scale)
    cdef long offset = _offset(q_offset)
    cdef cnp.npy_intp *dims = cnp.PyArray_DIMS(s)
    cdef long B = dims[0]
    cdef long H = dims[1] if nd == 4 else 1
    cdef long Tq = dims[nd - 2]
    cdef long Tk = dims[nd - 1]
    cdef cnp.ndarray m
    cdef const uint8_t *mask_ptr = NULL
    if key_padding_mask is not None:
        if (cnp.PyArray_Check(key_padding_mask)
                and (cnp.PyArray_TYPE(<cnp.ndarray>key_padding_mask) == cnp.NPY_BOOL
                     or cnp.PyArray_TYPE(<cnp.ndarray>key_padding_mask) == cnp.NPY_UINT8)
                and cnp.PyArray_NDIM(<cnp.ndarray>key_padding_mask) == 2
                and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>key_padding_mask)):
            m = <cnp.ndarray>key_padding_mask
        else:
            m = <cnp.ndarray>_check_mask(key_padding_mask, "key_padding_mask", 2)
        if cnp.PyArray_DIMS(m)[0] != B or cnp.PyArray_DIMS(m)[1] != Tk:
            raise ValueError(f"key_padding_mask must have shape [B, Tk] = {(B, Tk)}, "
                             f"got {key_padding_mask.shape}")
        _nn_no_overlap(p, "probs", m, "key_padding_mask")
        mask_ptr = <const uint8_t *>cnp.PyArray_DATA(m)
    cdef float *pp = <float *>cnp.PyArray_DATA(p)
    cdef const float *sp = <const float *>cnp.PyArray_DATA(s)
    if cnp.PyArray_SIZE(s) == 0:
        return
    with nogil:
        c_softmax_forward(pp, sp, mask_ptr, B, H, Tq, Tk, fscale, causal, offset)


def softmax_backward(probs, dprobs, dscores, scale=1.0):
    """dscores = scale * probs * (dprobs - sum(probs * dprobs, axis=-1)), one pass per row.
    All float32 C-contiguous of one shape ([..., Tk]); dscores may be dprobs (in place)."""
    cdef cnp.ndarray p = _nn_f32(probs, "probs")
    if cnp.PyArray_NDIM(p) < 1:
        raise ValueError(f"probs must have at least one axis, got shape {probs.shape}")
    cdef cnp.ndarray dp = _nn_f32(dprobs, "dprobs")
    _nn_shape_like(p, "probs", dp, "dprobs")
    cdef cnp.ndarray ds = _nn_f32(dscores, "dscores", -1, True)
    _nn_shape_like(p, "probs", ds, "dscores")
    _nn_no_overlap(ds, "dscores", p, "probs")
    _nn_same_or_disjoint(ds, "dscores", dp, "dprobs")
    cdef float fscale = _finite_scale(scale)
    cdef long size = cnp.PyArray_SIZE(p)
    if size == 0:
        return
    cdef long Tk = cnp.PyArray_DIMS(p)[cnp.PyArray_NDIM(p) - 1]
    cdef float *dsp = <float *>cnp.PyArray_DATA(ds)
    cdef const float *pp = <const float *>cnp.PyArray_DATA(p)
    cdef const float *dpp = <const float *>cnp.PyArray_DATA(dp)
    with nogil:
        c_softmax_backward(dsp, pp, dpp, size // Tk, Tk, fscale)


def exp_f32(x, out):
    """out = exp(x) elementwise with the vectorised exp the softmax uses at the current SIMD
    level (expf at 'generic'); for accuracy tests. x, out float32 C-contiguous 1-D, one shape;
    out may be x."""
    cdef cnp.ndarray xa = _nn_f32(x, "x", 1)
    cdef cnp.ndarray oa = _nn_f32(out, "out", 1, True)
    _nn_shape_like(xa, "x", oa, "out")
    _nn_same_or_disjoint(oa, "out", xa, "x")
    cdef float *op = <float *>cnp.PyArray_DATA(oa)
    cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
    cdef long n = cnp.PyArray_SIZE(xa)
    with nogil:
        c_tf_exp_array(op, xp, n)
