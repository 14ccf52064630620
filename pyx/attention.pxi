# Single-query attention over a key/value cache (csrc/attention.h). Included by _C.pyx.

cdef extern from "attention.h" nogil:
    void attention_decode_forward(const float *q, long ldq, const float *k, const float *v,
                                  const uint8_t *key_mask, float *out, long ldo, float *probs,
                                  long N, long H, long Tmax, long n_keys, long dh, float scale)


def attention_decode(q, k_cache, v_cache, Py_ssize_t n_keys, out, float scale, key_mask=None,
                     probs=None):
    """One query per (row, head) attends to the first n_keys entries of a key/value cache.

    q: float32 [N, H*dh] rows with unit inner stride (a column slice of a fused projection is
    fine); k_cache, v_cache: float32 C-contiguous [N, H, Tmax, dh]; out: float32 [N, H*dh] rows
    with unit inner stride, not overlapping the other arrays; key_mask: None or bool/uint8
    C-contiguous [N, Tmax], True = ignore; probs: None or float32 C-contiguous [N, H, n_keys]
    receiving the attention weights. out[n, h] = softmax(scale * q[n, h] . k[n, h, :n_keys]) @
    v[n, h, :n_keys]. Rows whose keys are all masked give zeros.
    """
    _check(q, "q", _F32, 2, False, False)
    _check_f32(k_cache, "k_cache", 4)
    _check_f32(v_cache, "v_cache", 4)
    _check(out, "out", _F32, 2, True, False)
    _same_shape(k_cache, "k_cache", v_cache, "v_cache")
    cdef Py_ssize_t N = k_cache.shape[0], H = k_cache.shape[1], Tmax = k_cache.shape[2]
    cdef Py_ssize_t dh = k_cache.shape[3]
    if q.shape != (N, H * dh) or q.strides[1] != 4 or q.strides[0] < 0:
        raise ValueError(f"q must be [N, H*dh] = {(N, H * dh)} with unit inner stride, got {q.shape}")
    if out.shape != (N, H * dh) or out.strides[1] != 4 or out.strides[0] < H * dh * 4:
        raise ValueError(f"out must be [N, H*dh] = {(N, H * dh)} with unit inner stride, got {out.shape}")
    if not 0 <= n_keys <= Tmax:
        raise ValueError(f"n_keys must be in [0, {Tmax}], got {n_keys}")
    for name, arr in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _no_overlap(out, "out", arr, name)
    cdef const uint8_t[:, ::1] mask_view
    cdef const uint8_t *mask_ptr = NULL
    if key_mask is not None:
        key_mask = _check_mask(key_mask, "key_mask", 2)
        if key_mask.shape != (N, Tmax):
            raise ValueError(f"key_mask must have shape [N, Tmax] = {(N, Tmax)}, got {key_mask.shape}")
        if N * Tmax > 0:
            mask_view = key_mask
            mask_ptr = &mask_view[0, 0]
    cdef float *probs_ptr = NULL
    cdef float[:, :, ::1] probs_view
    if probs is not None:
        _check_f32(probs, "probs", 3, True)
        if probs.shape != (N, H, n_keys):
            raise ValueError(f"probs must have shape {(N, H, n_keys)}, got {probs.shape}")
        if probs.size:
            probs_view = probs
            probs_ptr = &probs_view[0, 0, 0]
    if N * H * dh == 0:
        return out
    cdef const float[:, :] q_view = q
    cdef float[:, :] out_view = out
    cdef const float[:, :, :, ::1] k_view = k_cache
    cdef const float[:, :, :, ::1] v_view = v_cache
    cdef long ldq = q.strides[0] // 4, ldo = out.strides[0] // 4
    with nogil:
        attention_decode_forward(&q_view[0, 0], ldq, &k_view[0, 0, 0, 0], &v_view[0, 0, 0, 0],
                                 mask_ptr, &out_view[0, 0], ldo, probs_ptr, N, H, Tmax, n_keys, dh,
                                 scale)
    return out
