# int8 GEMM for inference (csrc/qgemm.h). Included by _C.pyx.

from libc.stdint cimport int8_t

cdef extern from "qgemm.h" nogil:
    long QGEMM_MAX_K
    void c_qgemm_quantize "qgemm_quantize"(long N, long K, const float *W, long ldw, int8_t *Q,
                                           float *scale)
    long c_qgemm_packed_bytes "qgemm_packed_bytes"(int isa, long N, long K)
    void c_qgemm_pack "qgemm_pack"(int isa, long N, long K, const int8_t *Q, const float *scale,
                                   void *packed)
    int c_qgemm_packed_info "qgemm_packed_info"(const void *packed, long bytes, int *isa, long *N,
                                                long *K)
    void c_qgemm_packed "qgemm_packed"(int isa, long M, long N, long K, const float *X, long ldx,
                                       const void *packed, const float *bias, float *C, long ldc)
    const char *c_qgemm_path_name "qgemm_path_name"(int isa)
    void c_qgemm_test_force "qgemm_test_force"(int all_threads, int slow)

cdef object _QI8 = np.dtype(np.int8)
cdef object _QU8 = np.dtype(np.uint8)


cdef inline void _qgemm_k(long K, str name, object shape) except *:
    if K > QGEMM_MAX_K:
        raise ValueError(f"{name} must have at most {QGEMM_MAX_K} columns (int32 sums must not "
                         f"overflow), got shape {shape}")


cdef inline void _qgemm_apart(object x, str xname, list others) except *:
    for other, other_name in others:
        if other is not None and np.may_share_memory(x, other):
            raise ValueError(f"{xname} must not overlap {other_name}")


def int8_path():
    """The int8 kernel the current instruction set runs, e.g. "avx2 (vpmaddwd, int32)"."""
    return c_qgemm_path_name(tf_isa()).decode()


def qgemm_quantize(w):
    """(q, scale) of w: float32 C-contiguous [N, K], finite, K <= 65536. Per row n:
    scale[n] = max|w[n]| / 127, q[n] = clamp(rint(w[n] * (127 / max|w[n]|)), -127, 127) int8
    (float32 arithmetic, half to even; rows below 2^-120 give zeros and scale 0). See qgemm.h."""
    _check_f32(w, "w", 2)
    cdef long N = w.shape[0], K = w.shape[1]
    _qgemm_k(K, "w", w.shape)
    if not np.isfinite(w).all():
        raise ValueError("w must be finite (it holds NaN or inf)")
    q = np.empty((N, K), dtype=np.int8)
    scale = np.empty(N, dtype=np.float32)
    cdef const float *pw = <const float *>cnp.PyArray_DATA(<cnp.ndarray>w)
    cdef int8_t *pq = <int8_t *>cnp.PyArray_DATA(<cnp.ndarray>q)
    cdef float *ps = <float *>cnp.PyArray_DATA(<cnp.ndarray>scale)
    if N > 0:
        with nogil:
            c_qgemm_quantize(N, K, pw, K, pq, ps)
    return q, scale


def qgemm_pack(q, scale, reuse=None):
    """q (int8 C-contiguous [N, K], values in [-127, 127], K <= 65536) and scale (float32 [N],
    finite, >= 0) packed for the current instruction set's int8 kernel: a 1-D uint8 array,
    64-byte aligned, holding a header (isa, N, K), the scales, the per-column compensation and
    the panels (qgemm.h). reuse: None, or a uint8 array from an earlier qgemm_pack of the same
    size, which is refilled in place and returned (anything else is refused)."""
    _check(q, "q", _QI8, 2)
    _check_f32(scale, "scale", 1)
    cdef long N = q.shape[0], K = q.shape[1]
    _qgemm_k(K, "q", q.shape)
    if scale.shape != (N,):
        raise ValueError(f"scale must have shape ({N},) (one per row of q {q.shape}), got {scale.shape}")
    if q.size and q.min() < -127:
        raise ValueError("q must hold values in [-127, 127], got -128")
    if not np.isfinite(scale).all() or (scale < 0).any():
        raise ValueError("scale must be finite and >= 0")
    cdef int level = tf_isa()
    cdef long nbytes = c_qgemm_packed_bytes(level, N, K)
    cdef size_t address
    if reuse is None:
        raw = np.empty(nbytes + 64, dtype=np.uint8)
        address = <size_t>cnp.PyArray_DATA(<cnp.ndarray>raw)
        packed = raw[(64 - address % 64) % 64:][:nbytes]
    else:
        _check(reuse, "reuse", _QU8, 1, True)
        if reuse.shape != (nbytes,):
            raise ValueError(f"reuse must have {nbytes} bytes (q {q.shape} packed for "
                             f"{tf_isa_name(level).decode()}), got shape {reuse.shape}")
        if <size_t>cnp.PyArray_DATA(<cnp.ndarray>reuse) % 64:
            raise ValueError("reuse must be 64-byte aligned (as qgemm_pack returns it)")
        _qgemm_apart(reuse, "reuse", [(q, "q"), (scale, "scale")])
        packed = reuse
    cdef const int8_t *pq = <const int8_t *>cnp.PyArray_DATA(<cnp.ndarray>q)
    cdef const float *ps = <const float *>cnp.PyArray_DATA(<cnp.ndarray>scale)
    cdef void *pp = cnp.PyArray_DATA(<cnp.ndarray>packed)
    with nogil:
        c_qgemm_pack(level, N, K, pq, ps, pp)
    return packed


def qgemm_packed(x, packed, bias, out):
    """out = dequant(quant(x) @ q^T) (+ bias), packed = qgemm_pack(q, scale): x float32
    C-contiguous [M, K]; bias None or float32 C-contiguous [N]; out float32 C-contiguous [M, N],
    writeable, not overlapping the others. The instruction set must still be the one packed for.
    A row of x holding NaN or inf gives a NaN row of out. Bits do not depend on the instruction
    set or the thread count (qgemm.h). Returns out."""
    _check_f32(x, "x", 2)
    _check(packed, "packed", _QU8, 1)
    cdef int level
    cdef long N, K
    cdef const void *pp = cnp.PyArray_DATA(<cnp.ndarray>packed)
    if <size_t>pp % 64:
        raise ValueError("packed must be 64-byte aligned (as qgemm_pack returns it)")
    if c_qgemm_packed_info(pp, packed.shape[0], &level, &N, &K) != 0:
        raise ValueError("packed is not a buffer from qgemm_pack (bad header or size)")
    if level != tf_isa():
        raise ValueError(f"packed was packed for the {tf_isa_name(level).decode()} kernels, the "
                         f"instruction set is now {tf_isa_name(tf_isa()).decode()}: pack it again")
    cdef long M = x.shape[0]
    if x.shape[1] != K:
        raise ValueError(f"x must have {K} columns (packed weights are [{N}, {K}]), got shape {x.shape}")
    cdef const float *pb = NULL
    if bias is not None:
        _check_f32(bias, "bias", 1)
        if bias.shape != (N,):
            raise ValueError(f"bias must have shape ({N},), got {bias.shape}")
        pb = <const float *>cnp.PyArray_DATA(<cnp.ndarray>bias)
    _check_f32(out, "out", 2, True)
    if out.shape != (M, N):
        raise ValueError(f"out must have shape {(M, N)}, got {out.shape}")
    _qgemm_apart(out, "out", [(x, "x"), (packed, "packed"), (bias, "bias")])
    cdef const float *px = <const float *>cnp.PyArray_DATA(<cnp.ndarray>x)
    cdef float *pc = <float *>cnp.PyArray_DATA(<cnp.ndarray>out)
    with nogil:
        c_qgemm_packed(level, M, N, K, px, K, pp, pb, pc, N)
    return out


def _qgemm_force(bint all_threads=False, bint slow=False):
    """Test-only. all_threads: every later qgemm_packed starts every thread of the process, however
    small; slow: it runs the naive fallback instead of the kernels. Process-wide: restore with
    _qgemm_force()."""
    c_qgemm_test_force(all_threads, slow)
