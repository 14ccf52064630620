# Fused attention for training, forward and backward (csrc/attention_train.h). Included by _C.pyx.

cdef extern from "attention_train.h" nogil:
    void c_attention_train_forward "attention_train_forward"(
        const float *q, long ldq, const float *k, long ldk, const float *v, long ldv,
        const uint8_t *key_padding_mask, float *probs, float *ctx, long ldc, long B, long H,
        long Tq, long Tk, long dh, float scale, int causal, float dropout_p, uint64_t seed,
        uint64_t offset, int bf16)
    void c_attention_train_backward "attention_train_backward"(
        const float *dctx, long lddc, const float *q, long ldq, const float *k, long ldk,
        const float *v, long ldv, const float *probs, float *dq, long lddq, float *dk, long lddk,
        float *dv, long lddv, long B, long H, long Tq, long Tk, long dh, float scale, int causal,
        float dropout_p, uint64_t seed, uint64_t offset, int bf16)
    int c_attention_train_path "attention_train_path"()


cdef Py_ssize_t _at_rows(object x, str name, Py_ssize_t rows, Py_ssize_t cols,
                         bint writeable) except -1:
    """x: float32 [rows, cols] whose rows have unit inner stride and lie ld floats apart
    (ld >= cols; a column slice of a wider array is fine). Returns ld."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(x).__name__}")
    if x.dtype != _F32:
        raise TypeError(f"{name} must have dtype {_F32}, got {x.dtype}")
    if x.shape != (rows, cols):
        raise ValueError(f"{name} must have shape {(rows, cols)}, got {x.shape}")
    if writeable and not x.flags.writeable:
        raise ValueError(f"{name} must be writeable")
    if rows == 0 or cols == 0:
        return cols
    if cols > 1 and x.strides[1] != 4:
        raise ValueError(f"{name} must have unit inner stride (rows of contiguous floats)")
    cdef Py_ssize_t stride = x.strides[0]
    if rows == 1:
        return cols
    if stride % 4 != 0 or stride < 4 * cols:
        raise ValueError(f"{name} rows must be whole floats apart, at least {cols} apart")
    return stride // 4


cdef void _at_disjoint(object a, str aname, object b, str bname) except *:
    """Two outputs checked by _at_rows share no element: their byte extents are apart, or they
    are column ranges of one row layout (the same row stride) that do not meet within a row
    (dq, dk, dv: column slices of one [B*T, 3D] gradient)."""
    if not _att_meet(a, b):
        return
    cdef Py_ssize_t sa = a.strides[0], sb = b.strides[0]
    cdef Py_ssize_t pa = <Py_ssize_t>cnp.PyArray_DATA(<cnp.ndarray>a)
    cdef Py_ssize_t pb = <Py_ssize_t>cnp.PyArray_DATA(<cnp.ndarray>b)
    cdef Py_ssize_t wa = 4 * a.shape[1], wb = 4 * b.shape[1], shift
    if a.shape[0] > 1 and b.shape[0] > 1 and sa == sb and sa > 0:
        shift = (pb - pa) % sa
        if shift < 0:
            shift += sa
        if wa <= shift and shift + wb <= sa:
            return
    raise ValueError(f"{aname} and {bname} must not share elements")


cdef float _at_prob(object p) except? -1.0:
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise TypeError(f"dropout_p must be a real number, got {type(p).__name__}")
    cdef float pf = <float>float(p)
    if not (pf >= 0.0 and pf < 1.0):     # also refuses NaN
        raise ValueError(f"dropout_p must be in [0, 1), got {p!r}")
    return pf


cdef inline float *_at_ptr(object x):
    return <float *>cnp.PyArray_DATA(<cnp.ndarray>x)


def attention_train_path():
    """Which code the fused attention runs at the current SIMD level: "avx512_bf16" (bf16 products
    through vdpbf16ps, fp32 ones as avx512), "avx512" or "avx2" micro-kernels, or "generic" (plain C
    loops: the reference, slower than batched GEMMs)."""
    return ("generic", "avx2", "avx512", "avx512_bf16")[c_attention_train_path()]


def attention_train_forward(q, k, v, probs, ctx, float scale, bint causal=False,
                            key_padding_mask=None, dropout_p=0.0, seed=0, offset=0,
                            bint bf16=False):
    """Scaled dot-product attention of every (sentence, head), fused (csrc/attention_train.h).

    probs: float32 C-contiguous [B, H, Tq, Tk], receives softmax(scale * Q Kᵀ + masks) (before
    dropout); q: float32 [B*Tq, H*dh], k, v: float32 [B*Tk, H*dh], ctx: float32 [B*Tq, H*dh]
    receiving P_d V, head h in columns h*dh..; each with unit inner stride and any row stride
    (column slices of a fused projection are fine). causal: query i sees keys j <= i.
    key_padding_mask: None or bool/uint8 C-contiguous [B, Tk], True = padding key. A row whose keys
    are all hidden gives zero weights. dropout_p in [0, 1): dropout on the weights with the mask
    dropout_forward(probs, ., dropout_p, seed, offset) draws. bf16: the products' operands rounded
    to bfloat16, sums in fp32. probs and ctx must not overlap the inputs."""
    _check_f32(probs, "probs", 4, True)
    cdef Py_ssize_t B = probs.shape[0], H = probs.shape[1], Tq = probs.shape[2], Tk = probs.shape[3]
    if H == 0:
        raise ValueError("probs must have at least one head (shape [B, H, Tq, Tk])")
    _check(q, "q", _F32, 2, False, False)
    if q.shape[1] % H != 0:
        raise ValueError(f"q must be [B*Tq, H*dh] with H = {H} (probs), got shape {q.shape}")
    cdef Py_ssize_t dh = q.shape[1] // H
    if dh == 0:
        raise ValueError("q must have at least one column per head")
    cdef Py_ssize_t ldq = _at_rows(q, "q", B * Tq, H * dh, False)
    cdef Py_ssize_t ldk = _at_rows(k, "k", B * Tk, H * dh, False)
    cdef Py_ssize_t ldv = _at_rows(v, "v", B * Tk, H * dh, False)
    cdef Py_ssize_t ldc = _at_rows(ctx, "ctx", B * Tq, H * dh, True)
    cdef float pf = _at_prob(dropout_p)
    cdef uint64_t s = _ew_u64(seed, "seed"), o = _ew_u64(offset, "offset")
    cdef const uint8_t *pmask = NULL
    cdef const uint8_t[:, ::1] mview
    if key_padding_mask is not None:
        key_padding_mask = _check_mask(key_padding_mask, "key_padding_mask", 2)
        if key_padding_mask.shape != (B, Tk):
            raise ValueError(f"key_padding_mask must have shape {(B, Tk)} ([B, Tk]), "
                             f"got {key_padding_mask.shape}")
        if B * Tk > 0:
            mview = key_padding_mask
            pmask = &mview[0, 0]
    for out, oname in ((probs, "probs"), (ctx, "ctx")):
        for x, xname in ((q, "q"), (k, "k"), (v, "v")):
            _att_apart(out, oname, x, xname)
    _att_apart(ctx, "ctx", probs, "probs")
    cdef const float *pq = _at_ptr(q)
    cdef const float *pk = _at_ptr(k)
    cdef const float *pv = _at_ptr(v)
    cdef float *pp = _at_ptr(probs)
    cdef float *pc = _at_ptr(ctx)
    with nogil:
        c_attention_train_forward(pq, ldq, pk, ldk, pv, ldv, pmask, pp, pc, ldc, B, H, Tq, Tk, dh,
                                  scale, causal, pf, s, o, bf16)


def attention_train_backward(dctx, q, k, v, probs, dq, dk, dv, float scale, bint causal=False,
                             dropout_p=0.0, seed=0, offset=0, bint bf16=False):
    """Gradients of attention_train_forward: dq [B*Tq, H*dh], dk, dv [B*Tk, H*dh] (float32, unit
    inner stride, any row stride; overwritten) from dctx [B*Tq, H*dh] and the forward's q, k, v,
    probs, scale, causal (it skips the zero half of the products), dropout_p, seed, offset and
    bf16. dq, dk, dv must not overlap the inputs nor share an element with each other (they may
    interleave: column slices of one array)."""
    _check_f32(probs, "probs", 4, False)
    cdef Py_ssize_t B = probs.shape[0], H = probs.shape[1], Tq = probs.shape[2], Tk = probs.shape[3]
    if H == 0:
        raise ValueError("probs must have at least one head (shape [B, H, Tq, Tk])")
    _check(q, "q", _F32, 2, False, False)
    if q.shape[1] % H != 0:
        raise ValueError(f"q must be [B*Tq, H*dh] with H = {H} (probs), got shape {q.shape}")
    cdef Py_ssize_t dh = q.shape[1] // H
    if dh == 0:
        raise ValueError("q must have at least one column per head")
    cdef Py_ssize_t lddc = _at_rows(dctx, "dctx", B * Tq, H * dh, False)
    cdef Py_ssize_t ldq = _at_rows(q, "q", B * Tq, H * dh, False)
    cdef Py_ssize_t ldk = _at_rows(k, "k", B * Tk, H * dh, False)
    cdef Py_ssize_t ldv = _at_rows(v, "v", B * Tk, H * dh, False)
    cdef Py_ssize_t lddq = _at_rows(dq, "dq", B * Tq, H * dh, True)
    cdef Py_ssize_t lddk = _at_rows(dk, "dk", B * Tk, H * dh, True)
    cdef Py_ssize_t lddv = _at_rows(dv, "dv", B * Tk, H * dh, True)
    cdef float pf = _at_prob(dropout_p)
    cdef uint64_t s = _ew_u64(seed, "seed"), o = _ew_u64(offset, "offset")
    for out, oname in ((dq, "dq"), (dk, "dk"), (dv, "dv")):
        for x, xname in ((dctx, "dctx"), (q, "q"), (k, "k"), (v, "v"), (probs, "probs")):
            _att_apart(out, oname, x, xname)
    _at_disjoint(dq, "dq", dk, "dk")
    _at_disjoint(dq, "dq", dv, "dv")
    _at_disjoint(dk, "dk", dv, "dv")
    cdef const float *pdc = _at_ptr(dctx)
    cdef const float *pq = _at_ptr(q)
    cdef const float *pk = _at_ptr(k)
    cdef const float *pv = _at_ptr(v)
    cdef const float *pp = _at_ptr(probs)
    cdef float *pdq = _at_ptr(dq)
    cdef float *pdk = _at_ptr(dk)
    cdef float *pdv = _at_ptr(dv)
    with nogil:
        c_attention_train_backward(pdc, lddc, pq, ldq, pk, ldk, pv, ldv, pp, pdq, lddq, pdk, lddk,
                                   pdv, lddv, B, H, Tq, Tk, dh, scale, causal, pf, s, o, bf16)
