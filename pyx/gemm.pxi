# GEMM (csrc/gemm.h). Included by _C.pyx.

cimport numpy as cnp

cdef extern from "gemm.h" nogil:
    void c_gemm_batched "gemm_batched"(
        int trans_a, int trans_b, long batch0, long batch1, long M, long N, long K, float alpha,
        const float *A, long lda, long a_stride0, long a_stride1,
        const float *B, long ldb, long b_stride0, long b_stride1,
        int accumulate, float *C, long ldc, long c_stride0, long c_stride1)
    void c_gemm_batched_prec "gemm_batched_prec"(
        int prec, int trans_a, int trans_b, long batch0, long batch1, long M, long N, long K, float alpha,
        const float *A, long lda, long a_stride0, long a_stride1,
        const float *B, long ldb, long b_stride0, long b_stride1,
        int accumulate, float *C, long ldc, long c_stride0, long c_stride1)
    void c_gemm_reference "gemm_reference"(
        int trans_a, int trans_b, long batch0, long batch1, long M, long N, long K, float alpha,
        const float *A, long lda, long a_stride0, long a_stride1,
        const float *B, long ldb, long b_stride0, long b_stride1,
        int accumulate, float *C, long ldc, long c_stride0, long c_stride1)
    long c_gemm_packed_floats "gemm_packed_floats"(int isa, long N, long K)
    void c_gemm_pack_b "gemm_pack_b"(int isa, int prec, int trans_b, long N, long K, const float *B,
                                     long ldb, float *Bp)
    void c_gemm_packed "gemm_packed"(int isa, int prec, long M, long N, long K, float alpha, const float *A,
                                     long lda, const float *Bp, int accumulate, float *C, long ldc)
    void c_gemm_test_force "gemm_test_force"(int schedule, int all_threads, int lazy)
    int c_gemm_rows_apart "gemm_rows_apart"(int on)
    int c_gemm_test_last_schedule "gemm_test_last_schedule"()
    void c_gemm_test_counters "gemm_test_counters"(long counts[3], int reset)
    enum:
        GEMM_FP32, GEMM_BF16
    enum:
        GEMM_AUTO, GEMM_DOT, GEMM_PRIVATE, GEMM_NARROW, GEMM_BY_BATCH, GEMM_TILES, GEMM_SHARED


cdef void _gemm_operand(object x, str name, int ndim) except *:
    """x must be a float32 ndarray of rank 2..4 (or `ndim` when > 0), aligned, with a unit-stride
    last axis and non-negative strides that are whole floats."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(x).__name__}")
    cdef cnp.ndarray arr = <cnp.ndarray>x
    if cnp.PyArray_TYPE(arr) != cnp.NPY_FLOAT32:
        raise TypeError(f"{name} must have dtype float32, got {x.dtype}")
    cdef int nd = cnp.PyArray_NDIM(arr)
    if ndim > 0:
        if nd != ndim:
            raise ValueError(f"{name} must have the rank of a ({ndim}-D), got shape {x.shape}")
    elif nd < 2 or nd > 4:
        raise ValueError(f"{name} must be 2-D, 3-D or 4-D, got shape {x.shape}")
    cdef cnp.npy_intp *shape = cnp.PyArray_DIMS(arr)
    cdef cnp.npy_intp *strides = cnp.PyArray_STRIDES(arr)
    cdef int axis
    for axis in range(nd):
        if shape[axis] == 0:   # nothing is read or written: any strides will do
            return
    if not cnp.PyArray_ISALIGNED(arr):
        raise ValueError(f"{name} must be aligned to 4 bytes")
    for axis in range(nd):
        if shape[axis] > 1 and (strides[axis] < 0 or strides[axis] % 4):
            raise ValueError(f"{name} must have non-negative strides that are multiples of 4 bytes, "
                             f"got strides {x.strides}")
    if shape[nd - 1] > 1 and strides[nd - 1] != 4:
        raise ValueError(f"{name} must have a unit-stride last axis, got strides {x.strides}")


cdef bint _rows_overlap(cnp.ndarray x):
    """True unless every element of x has its own address: sorted by stride, each axis of
    size > 1 must step past everything the smaller-stride axes span (exact for nested
    layouts such as head views, conservative for exotic interleavings)."""
    cdef cnp.npy_intp st[4]
    cdef cnp.npy_intp sz[4]
    cdef int n = 0, i, j, nd = cnp.PyArray_NDIM(x)
    cdef cnp.npy_intp *shape = cnp.PyArray_DIMS(x)
    cdef cnp.npy_intp *strides = cnp.PyArray_STRIDES(x)
    for i in range(nd):
        if shape[i] > 1:
            j = n
            while j > 0 and st[j - 1] > strides[i]:   # insertion sort by stride
                st[j], sz[j] = st[j - 1], sz[j - 1]
                j -= 1
            st[j], sz[j] = strides[i], shape[i]
            n += 1
    cdef cnp.npy_intp span = 1   # bytes covered by the axes seen so far, plus one element
    for i in range(n):
        if st[i] < span:
            return True
        span += st[i] * (sz[i] - 1)
    return False


cdef inline bint _extents_meet(cnp.ndarray x, cnp.ndarray y):
    """Whether the byte ranges [first, last] of x and y intersect (strides are >= 0)."""
    cdef char *x0 = <char *>cnp.PyArray_DATA(x)
    cdef char *y0 = <char *>cnp.PyArray_DATA(y)
    cdef char *x1 = x0 + 4
    cdef char *y1 = y0 + 4
    cdef int i
    for i in range(cnp.PyArray_NDIM(x)):
        x1 += (cnp.PyArray_DIMS(x)[i] - 1) * cnp.PyArray_STRIDES(x)[i]
    for i in range(cnp.PyArray_NDIM(y)):
        y1 += (cnp.PyArray_DIMS(y)[i] - 1) * cnp.PyArray_STRIDES(y)[i]
    return x0 < y1 and y0 < x1


cdef void _gemm_no_overlap(cnp.ndarray out, cnp.ndarray x, str xname) except *:
    if cnp.PyArray_SIZE(x) == 0 or not _extents_meet(out, x):
        return
    try:   # the ranges meet: decide exactly (interleaved head views of one buffer are fine)
        overlap = np.shares_memory(out, x, max_work=100000)
    except Exception:   # too hard to decide exactly: refuse
        overlap = True
    if overlap:
        raise ValueError(f"out must not overlap {xname}")


cdef inline void _gemm_layout(cnp.ndarray x, int nd, long *ld, long *stride0, long *stride1):
    """Leading dimension and batch strides of x in floats (0 for a batch axis of size 1 or absent)."""
    cdef cnp.npy_intp *dims = cnp.PyArray_DIMS(x)
    cdef cnp.npy_intp *strides = cnp.PyArray_STRIDES(x)
    ld[0] = strides[nd - 2] // 4 if dims[nd - 2] > 1 else max(1, dims[nd - 1])
    stride0[0] = strides[0] // 4 if nd == 4 and dims[0] > 1 else 0
    stride1[0] = strides[nd - 3] // 4 if nd >= 3 and dims[nd - 3] > 1 else 0


cdef object _gemm_call(object a, object b, object out, bint trans_a, bint trans_b, float alpha,
                       bint accumulate, bint reference, bint bf16=False):
    _gemm_operand(a, "a", 0)
    cdef cnp.ndarray xa = <cnp.ndarray>a
    cdef int nd = cnp.PyArray_NDIM(xa)
    _gemm_operand(b, "b", nd)
    _gemm_operand(out, "out", nd)
    cdef cnp.ndarray xb = <cnp.ndarray>b
    cdef cnp.ndarray xc = <cnp.ndarray>out
    if not cnp.PyArray_ISWRITEABLE(xc):
        raise ValueError("out must be writeable")
    cdef cnp.npy_intp *sa = cnp.PyArray_DIMS(xa)
    cdef cnp.npy_intp *sb = cnp.PyArray_DIMS(xb)
    cdef cnp.npy_intp *sc = cnp.PyArray_DIMS(xc)
    cdef long M, N, K, K2
    if trans_a:
        K, M = sa[nd - 2], sa[nd - 1]
    else:
        M, K = sa[nd - 2], sa[nd - 1]
    if trans_b:
        N, K2 = sb[nd - 2], sb[nd - 1]
    else:
        K2, N = sb[nd - 2], sb[nd - 1]
    if K != K2:
        raise ValueError(f"a and b have mismatched inner dimensions: op(a) is {M}x{K}, op(b) is {K2}x{N} "
                         f"(trans_a={trans_a}, trans_b={trans_b})")
    cdef int axis
    for axis in range(nd - 2):
        if sa[axis] != sc[axis]:
            raise ValueError(f"a must have the batch axes of out {out.shape[:nd - 2]}, got shape {a.shape}")
        if sb[axis] != sc[axis]:
            raise ValueError(f"b must have the batch axes of out {out.shape[:nd - 2]}, got shape {b.shape}")
    if sc[nd - 2] != M or sc[nd - 1] != N:
        raise ValueError(f"out must have shape {out.shape[:nd - 2] + (M, N)} for op(a) {M}x{K} @ op(b) "
                         f"{K}x{N}, got {out.shape}")
    if cnp.PyArray_SIZE(xc) == 0:
        return out
    if _rows_overlap(xc):
        raise ValueError(f"out must not overlap itself (rows or batch entries share memory), "
                         f"got strides {out.strides}")
    _gemm_no_overlap(xc, xa, "a")
    _gemm_no_overlap(xc, xb, "b")

    # batch axes: [batch0, batch1] (absent axes have size 1); strides in floats, 0 for size 1
    cdef long batch0 = 1, batch1 = 1
    cdef long lda, ldb, ldc, as0, as1, bs0, bs1, cs0, cs1
    if nd >= 3:
        batch1 = sc[nd - 3]
    if nd == 4:
        batch0 = sc[0]
    _gemm_layout(xa, nd, &lda, &as0, &as1)
    _gemm_layout(xb, nd, &ldb, &bs0, &bs1)
    _gemm_layout(xc, nd, &ldc, &cs0, &cs1)
    cdef const float *pa = <const float *>cnp.PyArray_DATA(xa)
    cdef const float *pb = <const float *>cnp.PyArray_DATA(xb)
    cdef float *pc = <float *>cnp.PyArray_DATA(xc)
    cdef int ta = trans_a, tb = trans_b, acc = accumulate
    cdef int prec = GEMM_BF16 if bf16 else GEMM_FP32
    if reference:
        with nogil:
            c_gemm_reference(ta, tb, batch0, batch1, M, N, K, alpha, pa, lda, as0, as1,
                             pb, ldb, bs0, bs1, acc, pc, ldc, cs0, cs1)
    else:
        with nogil:
            c_gemm_batched_prec(prec, ta, tb, batch0, batch1, M, N, K, alpha, pa, lda, as0, as1,
                                pb, ldb, bs0, bs1, acc, pc, ldc, cs0, cs1)
    return out


cdef float _gemm_alpha(object alpha) except? -1:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer, np.floating)):
        raise TypeError(f"alpha must be a real number, got {type(alpha).__name__}")
    return <float>float(alpha)


def gemm(a, b, out, bint trans_a=False, bint trans_b=False, alpha=1.0, bint accumulate=False,
         bint bf16=False):
    """out = alpha * op(a) @ op(b), or out += alpha * op(a) @ op(b) when accumulate.

    a, b, out: float32 arrays with ndim 2, 3 or 4, all the same ndim; the leading (batch) axes of
    a, b and out are equal in size, but a or b may have batch stride 0 (a np.broadcast_to view).
    The last axis of each must have unit stride; the other strides are free (>= 0), so head views
    such as q.reshape(B, T, H, dh).transpose(0, 2, 1, 3) are used in place, without copies.
    op(x) swaps the last two axes of x when trans_x. out must be writeable, its rows must not overlap
    each other, and it must not overlap a or b. Result bits do not depend on the thread count.
    bf16: every element of op(a) and op(b) is rounded to bfloat16 (nearest, ties to even) before
    it is multiplied; the sums, alpha, out and accumulate stay float32 (csrc/gemm.h: GEMM_BF16).
    Returns out.
    """
    return _gemm_call(a, b, out, trans_a, trans_b, _gemm_alpha(alpha), accumulate, False, bf16)


def gemm_reference(a, b, out, bint trans_a=False, bint trans_b=False, alpha=1.0, bint accumulate=False):
    """Same contract as gemm, computed by the naive triple loop in C (the tests' second opinion):
    a double-precision sum per element, scaled by alpha (and added to out) in double, rounded once."""
    return _gemm_call(a, b, out, trans_a, trans_b, _gemm_alpha(alpha), accumulate, True)


# ---------------------------------------------------------------------------
# Pre-packed op(b): pack a fixed matrix once, multiply few rows by it many times (decoding).

cdef class PackedMatrix:
    """op(b) packed by gemm_pack_b for gemm_packed: K x N, laid out for the micro-kernels of the
    instruction set in use when it was packed (`isa`). Read-only; `data` holds the packed floats."""
    cdef readonly object data
    cdef readonly long N, K
    cdef readonly str isa
    cdef readonly str precision
    cdef int level, prec

    def __init__(self, *args, **kwargs):
        raise TypeError("a PackedMatrix is made by gemm_pack_b, not constructed directly")

    def __repr__(self):
        return f"PackedMatrix(K={self.K}, N={self.N}, isa={self.isa!r}, precision={self.precision!r})"


def gemm_pack_b(b, bint trans_b=False, reuse=None, bint bf16=False):
    """op(b) (b if not trans_b, else b.T; K x N) packed once for gemm_packed, as the current
    instruction set's kernels read it. b: a 2-D float32 array with a unit-stride last axis
    (trans_b=True with a [N, K] nn.Linear weight gives op(b) = W^T). Returns a PackedMatrix
    (about the size of b; a copy: later changes to b are not seen). reuse: None, or a
    PackedMatrix that nobody needs any more: when it has the same shape and instruction set it
    is packed again in place and returned (no new memory), else a new one is returned.
    bf16: op(b) is rounded to bfloat16 as it is packed, and gemm_packed rounds a the same way
    (the product gemm(..., bf16=True) computes)."""
    if reuse is not None and (not isinstance(reuse, PackedMatrix) or (<PackedMatrix>reuse).data is None):
        raise TypeError(f"reuse must be None or a PackedMatrix from gemm_pack_b, got "
                        f"{'an empty one' if isinstance(reuse, PackedMatrix) else type(reuse).__name__}")
    _gemm_operand(b, "b", 2)
    cdef cnp.ndarray xb = <cnp.ndarray>b
    cdef long rows = cnp.PyArray_DIMS(xb)[0], cols = cnp.PyArray_DIMS(xb)[1]
    cdef long N = rows if trans_b else cols, K = cols if trans_b else rows
    cdef long ldb, s0, s1
    _gemm_layout(xb, 2, &ldb, &s0, &s1)
    cdef int level = tf_isa()
    cdef int prec = GEMM_BF16 if bf16 else GEMM_FP32
    cdef long floats = c_gemm_packed_floats(level, N, K)
    cdef PackedMatrix packed
    cdef size_t address
    cdef long offset
    if reuse is not None and (<PackedMatrix>reuse).N == N and (<PackedMatrix>reuse).K == K \
            and (<PackedMatrix>reuse).level == level \
            and not (floats and _extents_meet(xb, <cnp.ndarray>(<PackedMatrix>reuse).data)):
        packed = <PackedMatrix>reuse
        data = packed.data
    else:
        raw = np.empty(floats + 16, dtype=np.float32)   # + room to start on a 64-byte boundary
        address = <size_t>cnp.PyArray_DATA(<cnp.ndarray>raw)
        offset = <long>((64 - address % 64) % 64 // 4)
        data = raw[offset:offset + floats]
        packed = PackedMatrix.__new__(PackedMatrix)
    cdef const float *pb = <const float *>cnp.PyArray_DATA(xb)
    cdef float *pp = <float *>cnp.PyArray_DATA(<cnp.ndarray>data)
    cdef int tb = trans_b
    if floats > 0:
        with nogil:
            c_gemm_pack_b(level, prec, tb, N, K, pb, ldb, pp)
    data.flags.writeable = False
    packed.data, packed.N, packed.K, packed.level, packed.prec = data, N, K, level, prec
    packed.isa = tf_isa_name(level).decode()
    packed.precision = "bf16" if bf16 else "fp32"
    return packed


def gemm_packed(a, packed, out, alpha=1.0, bint accumulate=False):
    """out = alpha * a @ op(b), or out += alpha * a @ op(b) when accumulate, where packed =
    gemm_pack_b(b, trans_b). a: float32 [M, K], out: float32 [M, N], writeable, not overlapping a;
    both 2-D with a unit-stride last axis. The instruction set must still be the one packed for
    (after set_isa, pack again). Bits equal gemm's narrow schedule's and do not depend on the
    thread count (gemm's dot path, for few rows of a @ b.T, sums in another order). Returns out."""
    if not isinstance(packed, PackedMatrix):
        raise TypeError(f"packed must be a PackedMatrix (from gemm_pack_b), got {type(packed).__name__}")
    cdef PackedMatrix pm = <PackedMatrix>packed
    if pm.data is None:
        raise TypeError("packed must be a PackedMatrix from gemm_pack_b, got an empty one")
    if pm.level != tf_isa():
        raise ValueError(f"packed was packed for the {pm.isa} kernels, the instruction set is now "
                         f"{tf_isa_name(tf_isa()).decode()}: pack it again")
    cdef float al = _gemm_alpha(alpha)
    _gemm_operand(a, "a", 2)
    _gemm_operand(out, "out", 2)
    cdef cnp.ndarray xa = <cnp.ndarray>a
    cdef cnp.ndarray xc = <cnp.ndarray>out
    if not cnp.PyArray_ISWRITEABLE(xc):
        raise ValueError("out must be writeable")
    cdef long M = cnp.PyArray_DIMS(xa)[0], K = cnp.PyArray_DIMS(xa)[1]
    if K != pm.K:
        raise ValueError(f"a must have {pm.K} columns (op(b) is {pm.K}x{pm.N}), got shape {a.shape}")
    if cnp.PyArray_DIMS(xc)[0] != M or cnp.PyArray_DIMS(xc)[1] != pm.N:
        raise ValueError(f"out must have shape {(M, pm.N)} for a {M}x{K} @ op(b) {K}x{pm.N}, "
                         f"got {out.shape}")
    if cnp.PyArray_SIZE(xc) == 0:
        return out
    if _rows_overlap(xc):
        raise ValueError(f"out must not overlap itself (rows share memory), got strides {out.strides}")
    _gemm_no_overlap(xc, xa, "a")
    _gemm_no_overlap(xc, <cnp.ndarray>pm.data, "packed")
    cdef long lda, ldc, s0, s1
    _gemm_layout(xa, 2, &lda, &s0, &s1)
    _gemm_layout(xc, 2, &ldc, &s0, &s1)
    cdef const float *pa = <const float *>cnp.PyArray_DATA(xa)
    cdef const float *pp = <const float *>cnp.PyArray_DATA(<cnp.ndarray>pm.data)
    cdef float *pc = <float *>cnp.PyArray_DATA(xc)
    cdef int level = pm.level, acc = accumulate, prec = pm.prec
    cdef long N = pm.N
    with nogil:
        c_gemm_packed(level, prec, M, N, K, al, pa, lda, pp, acc, pc, ldc)
    return out


# ---------------------------------------------------------------------------
# Testing hooks (tests/test_gemm.py): which schedule runs, and how much was packed.

_GEMM_SCHEDULES = {"auto": GEMM_AUTO, "dot": GEMM_DOT, "private": GEMM_PRIVATE, "narrow": GEMM_NARROW,
                   "by_batch": GEMM_BY_BATCH, "tiles": GEMM_TILES, "shared": GEMM_SHARED}


def gemm_rows_apart(bint on):
    """In the calling thread, while on: gemm never takes its dot path, so each row of out has the
    bits it has in any other call, whatever the other rows (csrc/gemm.h). Returns the previous
    setting."""
    return bool(c_gemm_rows_apart(on))


def _gemm_force_schedule(str schedule="auto", bint all_threads=False, bint lazy=False):
    """Test-only. Run every later gemm the dot path does not take with `schedule` ("tiles" or
    "shared"; "auto" restores the normal choice); all_threads: use every thread of the process
    even for products too small to be worth it; lazy: in the shared schedule, odd threads leave
    their own work to the others. Process-wide: restore with _gemm_force_schedule("auto")."""
    if schedule not in ("auto", "tiles", "shared"):
        raise ValueError(f"schedule must be 'auto', 'tiles' or 'shared', got {schedule!r}")
    c_gemm_test_force(_GEMM_SCHEDULES[schedule], all_threads, lazy)


def _gemm_stats(bint reset=False):
    """Test-only. {"schedule": the schedule the last gemm ran, and since the last reset:
    "packed_a"/"packed_b": floats of op(a)/op(b) copied into packing buffers (padding not
    counted), "taken": shared-schedule work units a thread took from another's share}."""
    cdef long counts[3]
    c_gemm_test_counters(counts, reset)
    names = {v: k for k, v in _GEMM_SCHEDULES.items()}
    return {"schedule": names[c_gemm_test_last_schedule()], "packed_a": counts[0], "packed_b": counts[1],
            "taken": counts[2]}
