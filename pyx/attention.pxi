# Single-query attention over a key/value cache (csrc/attention.h). Included by _C.pyx.

cdef extern from "attention.h" nogil:
    void attention_decode_forward(const float *q, long ldq, const float *k, const float *v,
                                  const uint8_t *key_mask, float *out, long ldo, float *probs,
                                  long N, long H, long Tmax, long n_keys, long dh, float scale)
    void attention_decode_rows_forward(const float *q, long ldq, const void *k, const void *v,
                                       const int64_t *rows, const int64_t *key_rows,
                                       long ld_key_rows, const uint8_t *key_mask, float *out,
                                       long ldo, float *probs, long N, long H, long Tmax,
                                       long n_keys, long dh, float scale, int reference, int kv16)
    void c_attention_cache_store "attention_cache_store"(const float *x, long ldx, void *cache, const int64_t *rows,
                               long N, long H, long Tmax, long dh, long t, int kv16)
    void c_attention_to_bf16 "attention_to_bf16"(const float *x, long n, uint16_t *out)
    void c_attention_round_bf16 "attention_round_bf16"(float *x, long rows, long cols, long ld)


cdef object _att_cache(object cache, str name, bint writeable):
    """A key or value cache: float32, or uint16 holding bf16 (attention.h), C-contiguous 4-D."""
    if isinstance(cache, np.ndarray) and cache.dtype == _U16:
        return _check(cache, name, _U16, 4, writeable)
    return _check(cache, name, _F32, 4, writeable)


cdef Py_ssize_t _att_bad_index(const int64_t *p, Py_ssize_t count, Py_ssize_t stride,
                               Py_ssize_t width, Py_ssize_t limit) noexcept nogil:
    """Flat position of the first value outside [0, limit) among `count` rows of `width`
    values spaced `stride` apart, or -1."""
    cdef Py_ssize_t i, j
    for i in range(count):
        for j in range(width):
            if <uint64_t>p[i * stride + j] >= <uint64_t>limit:
                return i * width + j
    return -1


cdef bint _att_meet(object x, object y):
    """Whether the byte extents [first, last] of two ndarrays with non-negative strides intersect
    (what np.may_share_memory tests, without its Python-level cost: these run every decoding step)."""
    cdef cnp.ndarray a = <cnp.ndarray>x, b = <cnp.ndarray>y
    if cnp.PyArray_SIZE(a) == 0 or cnp.PyArray_SIZE(b) == 0:
        return False
    cdef char *a0 = <char *>cnp.PyArray_DATA(a)
    cdef char *b0 = <char *>cnp.PyArray_DATA(b)
    cdef char *a1 = a0 + cnp.PyArray_ITEMSIZE(a)
    cdef char *b1 = b0 + cnp.PyArray_ITEMSIZE(b)
    cdef int i
    for i in range(cnp.PyArray_NDIM(a)):
        a1 += (cnp.PyArray_DIMS(a)[i] - 1) * cnp.PyArray_STRIDES(a)[i]
    for i in range(cnp.PyArray_NDIM(b)):
        b1 += (cnp.PyArray_DIMS(b)[i] - 1) * cnp.PyArray_STRIDES(b)[i]
    return a0 < b1 and b0 < a1


cdef void _att_apart(object out, str oname, object x, str xname) except *:
    if _att_meet(out, x):
        raise ValueError(f"{oname} must not overlap {xname}")


cdef object _att_rows(object rows, str name, Py_ssize_t N, Py_ssize_t R):
    """rows: int64 C-contiguous [N], every value in [0, R)."""
    _check(rows, name, _I64, 1)
    if rows.shape[0] != N:
        raise ValueError(f"{name} must have shape ({N},) (one per query row), got {rows.shape}")
    if N == 0:
        return rows
    cdef const int64_t[::1] view = rows
    cdef Py_ssize_t bad
    with nogil:
        bad = _att_bad_index(&view[0], 1, N, N, R)
    if bad >= 0:
        raise ValueError(f"{name} must be in [0, {R}) (rows of the cache), got {rows[bad]} at {bad}")
    return rows


def attention_decode(q, k_cache, v_cache, Py_ssize_t n_keys, out, float scale, key_mask=None,
                     probs=None, rows=None, key_rows=None, reference=False):
    """One query per (row, head) attends to the first n_keys entries of a key/value cache.

    q: float32 [N, H*dh] rows with unit inner stride (a column slice of a fused projection is
    fine); k_cache, v_cache: float32 C-contiguous [R, H, Tmax, dh], or both uint16 holding bf16
    (to_bf16; half the bytes to read, the bits of float32 caches holding those values); out: float32 [N, H*dh] rows
    with unit inner stride, not overlapping the other arrays; key_mask: None or bool/uint8
    C-contiguous [R, Tmax], True = ignore; probs: None or float32 C-contiguous [N, H, n_keys]
    receiving the attention weights. out[n, h] = softmax(scale * q[n, h] . k[n, h, :n_keys]) @
    v[n, h, :n_keys]. Rows whose keys are all masked give zeros.

    Without rows and key_rows, R must be N; with key_rows only, N <= R. rows: None or int64 C-contiguous [N] in [0, R):
    query row n reads cache row rows[n] (and key_mask row rows[n]) instead of row n.
    key_rows: None or int64 C-contiguous [N, >= n_keys], values (of the first n_keys columns)
    in [0, R): key and value j of query row n are read from cache row key_rows[n, j]
    (position j), overriding rows for them (beam search's per-hypothesis history). The results
    have the bits of gathering those cache rows first and calling without indices.
    reference=True runs the plain per-key loop (one dot-product and one axpy call per key) at
    the current SIMD level: the default fast path gives exactly its bits.
    """
    _check(q, "q", _F32, 2, False, False)
    _att_cache(k_cache, "k_cache", False)
    _check(v_cache, "v_cache", k_cache.dtype, 4)
    _check(out, "out", _F32, 2, True, False)
    _same_shape(k_cache, "k_cache", v_cache, "v_cache")
    cdef Py_ssize_t R = k_cache.shape[0], H = k_cache.shape[1], Tmax = k_cache.shape[2]
    cdef Py_ssize_t dh = k_cache.shape[3]
    cdef Py_ssize_t N = q.shape[0] if (rows is not None or key_rows is not None) else R
    if q.shape != (N, H * dh) or q.strides[1] != 4 or q.strides[0] < 0:
        raise ValueError(f"q must be [N, H*dh] = {(N, H * dh)} with unit inner stride, got {q.shape}")
    if out.shape != (N, H * dh) or out.strides[1] != 4 or out.strides[0] < H * dh * 4:
        raise ValueError(f"out must be [N, H*dh] = {(N, H * dh)} with unit inner stride, got {out.shape}")
    if not 0 <= n_keys <= Tmax:
        raise ValueError(f"n_keys must be in [0, {Tmax}], got {n_keys}")
    _att_apart(out, "out", q, "q")
    _att_apart(out, "out", k_cache, "k_cache")
    _att_apart(out, "out", v_cache, "v_cache")
    cdef const int64_t *rows_ptr = NULL
    cdef const int64_t[::1] rows_view
    if rows is not None:
        _att_rows(rows, "rows", N, R)
        _att_apart(out, "out", rows, "rows")
        if N > 0:
            rows_view = rows
            rows_ptr = &rows_view[0]
    elif N > R:
        raise ValueError(f"k_cache must have at least N = {N} rows when rows is None, got {R}")
    cdef const int64_t *key_rows_ptr = NULL
    cdef const int64_t[:, ::1] key_rows_view
    cdef Py_ssize_t ld_key_rows = 0, bad
    if key_rows is not None:
        _check(key_rows, "key_rows", _I64, 2)
        if key_rows.shape[0] != N or key_rows.shape[1] < n_keys:
            raise ValueError(f"key_rows must be [N, >= n_keys] = [{N}, >= {n_keys}], got shape "
                             f"{key_rows.shape}")
        _att_apart(out, "out", key_rows, "key_rows")
        if N > 0 and n_keys > 0:
            key_rows_view = key_rows
            key_rows_ptr = &key_rows_view[0, 0]
            ld_key_rows = key_rows.shape[1]
            with nogil:
                bad = _att_bad_index(key_rows_ptr, N, ld_key_rows, n_keys, R)
            if bad >= 0:
                raise ValueError(f"key_rows must be in [0, {R}) (rows of the cache), got "
                                 f"{key_rows[bad // n_keys, bad % n_keys]} at "
                                 f"{(bad // n_keys, bad % n_keys)}")
    cdef const uint8_t[:, ::1] mask_view
    cdef const uint8_t *mask_ptr = NULL
    if key_mask is not None:
        key_mask = _check_mask(key_mask, "key_mask", 2)
        if key_mask.shape != (R, Tmax):
            raise ValueError(f"key_mask must have shape [R, Tmax] = {(R, Tmax)}, got {key_mask.shape}")
        if R * Tmax > 0:
            mask_view = key_mask
            mask_ptr = &mask_view[0, 0]
    cdef float *probs_ptr = NULL
    cdef float[:, :, ::1] probs_view
    if probs is not None:
        _check_f32(probs, "probs", 3, True)
        if probs.shape != (N, H, n_keys):
            raise ValueError(f"probs must have shape {(N, H, n_keys)}, got {probs.shape}")
        for other, other_name in ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache"), (out, "out"),
                                  (key_mask, "key_mask"), (rows, "rows"), (key_rows, "key_rows")):
            if other is not None:
                _att_apart(probs, "probs", other, other_name)
        if probs.size:
            probs_view = probs
            probs_ptr = &probs_view[0, 0, 0]
    if N * H * dh == 0:
        return out
    cdef const float[:, :] q_view = q
    cdef float[:, :] out_view = out
    cdef const void *k_ptr = cnp.PyArray_DATA(<cnp.ndarray>k_cache)
    cdef const void *v_ptr = cnp.PyArray_DATA(<cnp.ndarray>v_cache)
    cdef long ldq = q.strides[0] // 4, ldo = out.strides[0] // 4
    cdef int ref = 1 if reference else 0
    cdef int kv16 = 1 if k_cache.dtype == _U16 else 0
    with nogil:
        attention_decode_rows_forward(&q_view[0, 0], ldq, k_ptr, v_ptr,
                                      rows_ptr, key_rows_ptr, ld_key_rows, mask_ptr,
                                      &out_view[0, 0], ldo, probs_ptr, N, H, Tmax, n_keys, dh,
                                      scale, ref, kv16)
    return out


def attention_cache_store(x, cache, Py_ssize_t t, rows=None):
    """cache[rows[n], h, t, :] = x[n, h*dh:(h+1)*dh] for every n, h: one decoding step's keys
    (or values) into a cache. x: float32 [N, H*dh] rows with unit inner stride (a column slice
    of a fused projection is fine); cache: float32 C-contiguous writeable [R, H, Tmax, dh], or
    uint16 (bf16: each value rounded as to_bf16 rounds it), not overlapping x; t in [0, Tmax); rows: None (row n, then R must be >= N) or int64
    C-contiguous [N] in [0, R) (a repeated row keeps the last x row written to it)."""
    _check(x, "x", _F32, 2, False, False)
    _att_cache(cache, "cache", True)
    cdef Py_ssize_t R = cache.shape[0], H = cache.shape[1], Tmax = cache.shape[2], dh = cache.shape[3]
    cdef Py_ssize_t N = x.shape[0]
    if x.shape[1] != H * dh or (x.shape[1] > 1 and x.strides[1] != 4) or x.strides[0] < 0:
        raise ValueError(f"x must be [N, H*dh] = [N, {H * dh}] with unit inner stride, got {x.shape}")
    if not 0 <= t < Tmax:
        raise ValueError(f"t must be in [0, {Tmax}), got {t}")
    _att_apart(cache, "cache", x, "x")
    cdef const int64_t *rows_ptr = NULL
    cdef const int64_t[::1] rows_view
    if rows is None:
        if N > R:
            raise ValueError(f"cache must have at least N = {N} rows without rows, got {R}")
    else:
        _att_rows(rows, "rows", N, R)
        if N > 0:
            rows_view = rows
            rows_ptr = &rows_view[0]
    if N * H * dh == 0:
        return cache
    cdef const float[:, :] x_view = x
    cdef void *c_ptr = cnp.PyArray_DATA(<cnp.ndarray>cache)
    cdef long ldx = x.strides[0] // 4
    cdef int kv16 = 1 if cache.dtype == _U16 else 0
    with nogil:
        c_attention_cache_store(&x_view[0, 0], ldx, c_ptr, rows_ptr, N, H, Tmax, dh, t, kv16)
    return cache


def to_bf16(x, out=None):
    """x (float32, C-contiguous) rounded to the nearest bf16, ties to even, as uint16 bits (the
    high half of each float32): NaN stays NaN (quietened), infinities and subnormals are kept, a
    finite value past bf16's largest rounds to infinity. out: None (a new array) or a writeable
    C-contiguous uint16 array of x's shape. What a bf16 key/value cache holds. Returns out."""
    _check_f32(x, "x")
    if out is None:
        out = np.empty(x.shape, _U16)
    _check(out, "out", _U16, x.ndim, True)
    if out.shape != x.shape:
        raise ValueError(f"out must have x's shape {x.shape}, got {out.shape}")
    _att_apart(out, "out", x, "x")
    cdef const float *xp = <const float *>cnp.PyArray_DATA(<cnp.ndarray>x)
    cdef uint16_t *op = <uint16_t *>cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef long n = x.size
    with nogil:
        c_attention_to_bf16(xp, n, op)
    return out


def round_bf16_(x):
    """x (float32 [rows, cols] with unit inner stride, writeable) replaced in place by its values
    rounded as to_bf16 rounds them, widened back: the keys and values a bf16 cache would hold.
    Returns x."""
    _check(x, "x", _F32, 2, True, False)
    if x.shape[1] > 1 and x.strides[1] != 4 or x.strides[0] < 0:
        raise ValueError(f"x must be [rows, cols] with unit inner stride, got strides {x.strides}")
    if x.size == 0:
        return x
    cdef float[:, :] view = x
    cdef long rows = x.shape[0], cols = x.shape[1], ld = x.strides[0] // 4
    with nogil:
        c_attention_round_bf16(&view[0, 0], rows, cols, ld)
    return x
