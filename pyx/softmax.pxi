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


cdef inline void _same_or_disjoint(object out, str oname, object x, str xname) except *:
    """`out` is `x` itself (same memory, same shape) or does not overlap it."""
    if np.may_share_memory(out, x) and not (
            out.__array_interface__["data"][0] == x.__array_interface__["data"][0]
            and out.shape == x.shape):
        raise ValueError(f"{oname} must be {xname} itself (in place) or not overlap it")


cdef inline float _finite_scale(object scale) except? -1:
    """A real number, finite once rounded to float32."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise TypeError(f"scale must be a number, got {type(scale).__name__}")
    cdef float value = <float>float(scale)
    if not (value == value and value - value == 0):
        raise ValueError(f"scale must be finite (as float32), got {scale}")
    return value


cdef inline Py_ssize_t _offset(object q_offset) except? -1:
    if isinstance(q_offset, bool) or not isinstance(q_offset, (int, np.integer)):
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
    _check_f32(scores, "scores")
    if scores.ndim not in (3, 4):
        raise ValueError(f"scores must be 3-D [B, Tq, Tk] or 4-D [B, H, Tq, Tk], got shape {scores.shape}")
    _check_f32(probs, "probs", -1, True)
    _same_shape(scores, "scores", probs, "probs")
    _same_or_disjoint(probs, "probs", scores, "scores")
    cdef float fscale = _finite_scale(scale)
    cdef long offset = _offset(q_offset)
    cdef long B = scores.shape[0]
    cdef long H = scores.shape[1] if scores.ndim == 4 else 1
    cdef long Tq = scores.shape[scores.ndim - 2]
    cdef long Tk = scores.shape[scores.ndim - 1]
    cdef const uint8_t[::1] mask_view
    cdef const uint8_t *mask_ptr = NULL
    if key_padding_mask is not None:
        mask = _check_mask(key_padding_mask, "key_padding_mask", 2)
        if mask.shape != (B, Tk):
            raise ValueError(f"key_padding_mask must have shape [B, Tk] = {(B, Tk)}, "
                             f"got {key_padding_mask.shape}")
        _no_overlap(probs, "probs", key_padding_mask, "key_padding_mask")
        if mask.size:
            mask_view = mask.reshape(-1)
            mask_ptr = &mask_view[0]
    if scores.size == 0:
        return
    cdef const float[::1] s = scores.reshape(-1)
    cdef float[::1] p = probs.reshape(-1)
    with nogil:
        c_softmax_forward(&p[0], &s[0], mask_ptr, B, H, Tq, Tk, fscale, causal, offset)


def softmax_backward(probs, dprobs, dscores, scale=1.0):
    """dscores = scale * probs * (dprobs - sum(probs * dprobs, axis=-1)), one pass per row.
    All float32 C-contiguous of one shape ([..., Tk]); dscores may be dprobs (in place)."""
    _check_f32(probs, "probs")
    if probs.ndim < 1:
        raise ValueError(f"probs must have at least one axis, got shape {probs.shape}")
    _check_f32(dprobs, "dprobs")
    _same_shape(probs, "probs", dprobs, "dprobs")
    _check_f32(dscores, "dscores", -1, True)
    _same_shape(probs, "probs", dscores, "dscores")
    _no_overlap(dscores, "dscores", probs, "probs")
    _same_or_disjoint(dscores, "dscores", dprobs, "dprobs")
    cdef float fscale = _finite_scale(scale)
    if probs.size == 0:
        return
    cdef long Tk = probs.shape[probs.ndim - 1]
    cdef long rows = probs.size // Tk
    cdef const float[::1] p = probs.reshape(-1)
    cdef const float[::1] dp = dprobs.reshape(-1)
    cdef float[::1] ds = dscores.reshape(-1)
    with nogil:
        c_softmax_backward(&ds[0], &p[0], &dp[0], rows, Tk, fscale)


def exp_f32(x, out):
    """out = exp(x) elementwise with the vectorised exp the softmax uses at the current SIMD
    level (expf at 'generic'); for accuracy tests. x, out float32 C-contiguous 1-D, one shape;
    out may be x."""
    _check_f32(x, "x", 1)
    _check_f32(out, "out", 1, True)
    _same_shape(x, "x", out, "out")
    _same_or_disjoint(out, "out", x, "x")
    if x.size == 0:
        return
    cdef const float[::1] xv = x
    cdef float[::1] ov = out
    with nogil:
        c_tf_exp_array(&ov[0], &xv[0], xv.shape[0])
