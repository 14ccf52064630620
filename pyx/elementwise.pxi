# Bias, residual, activations, dropout (csrc/elementwise.h, csrc/dropout.h). Included by _C.pyx.

cimport numpy as cnp

cdef extern from "elementwise.h" nogil:
    void c_residual_add "residual_add" (const float *a, const float *b, float *out, size_t n)
    void c_bias_add "bias_add" (float *x, const float *bias, size_t N, size_t D)
    void c_bias_grad "bias_grad" (const float *dout, float *dbias, size_t N, size_t D)
    void c_bias_act_forward "bias_act_forward" (float *x, const float *bias, float *out, size_t N,
                                                size_t D, int act)
    void c_act_backward "act_backward" (const float *dout, const float *pre, float *dx, size_t n,
                                        int act, int accumulate)
    void c_bias_act_forward_reference "bias_act_forward_reference" (float *x, const float *bias,
            float *out, size_t N, size_t D, int act)
    void c_act_backward_reference "act_backward_reference" (const float *dout, const float *pre,
            float *dx, size_t n, int act, int accumulate)

cdef extern from "dropout.h" nogil:
    void c_dropout_forward "dropout_forward" (const float *x, float *out, size_t n, float p,
                                              uint64_t seed, uint64_t offset)
    void c_dropout_backward "dropout_backward" (const float *dout, float *dx, size_t n, float p,
                                                uint64_t seed, uint64_t offset)
    void c_dropout_add_forward "dropout_add_forward" (const float *x, const float *residual,
                                                      float *out, size_t n, float p, uint64_t seed,
                                                      uint64_t offset)
    void c_bias_dropout_add_forward "bias_dropout_add_forward" (const float *x, const float *bias,
            const float *residual, float *out, size_t N, size_t D, float p, uint64_t seed,
            uint64_t offset)
    void c_dropout_mask "dropout_mask" (uint8_t *mask, size_t n, float p, uint64_t seed,
                                        uint64_t offset)
    void c_dropout_forward_reference "dropout_forward_reference" (const float *x, float *out,
            size_t n, float p, uint64_t seed, uint64_t offset)


cdef int _ew_activation(object activation) except -1:
    if not isinstance(activation, str):
        raise TypeError(f"activation must be a str ('relu', 'gelu' or 'silu'), got {type(activation).__name__}")
    if activation == "relu":
        return 0
    if activation == "gelu":
        return 1
    if activation == "silu":
        return 2
    raise ValueError(f"activation must be 'relu', 'gelu' or 'silu', got {activation!r}")


cdef inline float *_ew_f(object x):
    """Data pointer of a float32 ndarray the caller has already checked."""
    return <float *>cnp.PyArray_DATA(<cnp.ndarray>x)


cdef inline bint _ew_overlap(object x, object y):
    """Whether two C-contiguous arrays share a byte (exact: each is one contiguous range)."""
    cdef char *px = <char *>cnp.PyArray_DATA(<cnp.ndarray>x)
    cdef char *py = <char *>cnp.PyArray_DATA(<cnp.ndarray>y)
    cdef Py_ssize_t nx = cnp.PyArray_NBYTES(<cnp.ndarray>x), ny = cnp.PyArray_NBYTES(<cnp.ndarray>y)
    return nx > 0 and ny > 0 and px < py + ny and py < px + nx


cdef void _ew_apart(object out, str oname, object x, str xname) except *:
    """out must not share memory with x (both already checked C-contiguous)."""
    if _ew_overlap(out, x):
        raise ValueError(f"{oname} must not overlap {xname}")


cdef void _ew_alias_or_apart(object out, str oname, object x, str xname) except *:
    """out may be x itself (same data, same shape), but must not partially overlap it."""
    if _ew_overlap(out, x) and not (cnp.PyArray_DATA(<cnp.ndarray>out) == cnp.PyArray_DATA(<cnp.ndarray>x)
                                    and out.shape == x.shape):
        raise ValueError(f"{oname} must be {xname} itself or not overlap it")


cdef float _ew_prob(object p) except? -1.0:
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise TypeError(f"p must be a real number, got {type(p).__name__}")
    cdef float pf = <float>float(p)
    if not (pf >= 0.0 and pf < 1.0):     # also refuses NaN
        raise ValueError(f"p must be in [0, 1), got {p!r}")
    return pf


cdef uint64_t _ew_u64(object v, str name) except? 0:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if v < 0 or v >= (1 << 64):
        raise ValueError(f"{name} must be in [0, 2**64), got {v}")
    return <uint64_t>int(v)


def add(a, b, out):
    """out = a + b elementwise (residual connection). float32 C-contiguous arrays of one shape;
    out may be a or b itself (but must not partially overlap either)."""
    _check_f32(a, "a")
    _check_f32(b, "b")
    _check_f32(out, "out", -1, True)
    _same_shape(a, "a", b, "b")
    _same_shape(a, "a", out, "out")
    _ew_alias_or_apart(out, "out", a, "a")
    _ew_alias_or_apart(out, "out", b, "b")
    if a.size == 0:
        return
    cdef const float *pa = _ew_f(a)
    cdef const float *pb = _ew_f(b)
    cdef float *po = _ew_f(out)
    cdef size_t n = a.size
    with nogil:
        c_residual_add(pa, pb, po, n)


def add_bias(x, bias):
    """x[n, :] += bias in place. x float32 [N, D]; bias [D], not overlapping x."""
    _check_f32(x, "x", 2, True)
    _check_f32(bias, "bias", 1)
    if bias.shape[0] != x.shape[1]:
        raise ValueError(f"bias must have shape [D] = ({x.shape[1]},), got {bias.shape}")
    _ew_apart(x, "x", bias, "bias")
    if x.size == 0:
        return
    cdef size_t N = x.shape[0], D = x.shape[1]
    cdef float *px = _ew_f(x)
    cdef const float *pb = _ew_f(bias)
    with nogil:
        c_bias_add(px, pb, N, D)


def bias_grad(dout, dbias):
    """dbias += dout.sum(axis=0), reduced in a fixed order (same bits for any thread count and SIMD
    level: each column sums blocks of 64 rows in row order, then the block sums).
    dout float32 [N, D]; dbias [D], not overlapping dout."""
    _check_f32(dout, "dout", 2)
    _check_f32(dbias, "dbias", 1, True)
    if dbias.shape[0] != dout.shape[1]:
        raise ValueError(f"dbias must have shape [D] = ({dout.shape[1]},), got {dbias.shape}")
    _ew_apart(dbias, "dbias", dout, "dout")
    if dout.size == 0:
        return
    cdef size_t N = dout.shape[0], D = dout.shape[1]
    cdef const float *pg = _ew_f(dout)
    cdef float *pb = _ew_f(dbias)
    with nogil:
        c_bias_grad(pg, pb, N, D)


def bias_act_forward(x, bias, out, activation, reference=False):
    """Fused bias + activation: x += bias in place (x then holds the pre-activation, which
    act_backward needs), out = act(x). activation: 'relu' or 'gelu' (exact erf form, PyTorch's
    default). x, out float32 [N, D]; bias [D]. out may be x itself (which then holds act(x + bias):
    for inference, where no backward needs the pre-activation), but must not partially overlap x,
    nor overlap bias; bias must not overlap x. GELU's SIMD paths are accurate to a few ulp (see csrc/elementwise.h).
    reference=True runs the naive one-thread C loop (double-precision libm GELU) instead."""
    cdef int act = _ew_activation(activation)
    _check_f32(x, "x", 2, True)
    _check_f32(bias, "bias", 1)
    _check_f32(out, "out", 2, True)
    if bias.shape[0] != x.shape[1]:
        raise ValueError(f"bias must have shape [D] = ({x.shape[1]},), got {bias.shape}")
    _same_shape(x, "x", out, "out")
    _ew_alias_or_apart(out, "out", x, "x")
    _ew_apart(out, "out", bias, "bias")
    _ew_apart(x, "x", bias, "bias")
    if x.size == 0:
        return
    cdef size_t N = x.shape[0], D = x.shape[1]
    cdef float *px = _ew_f(x)
    cdef const float *pb = _ew_f(bias)
    cdef float *po = _ew_f(out)
    if reference:
        with nogil:
            c_bias_act_forward_reference(px, pb, po, N, D, act)
        return
    with nogil:
        c_bias_act_forward(px, pb, po, N, D, act)


def act_backward(dout, pre, dx, activation, accumulate=False, reference=False):
    """dx = dout * act'(pre) (dx += ... when accumulate). All float32 of one shape; dx may be dout
    when not accumulate (otherwise it must not overlap dout); dx never overlaps pre. ReLU's
    derivative at 0 is 0 (PyTorch's). reference=True runs the naive one-thread C loop instead."""
    cdef int act = _ew_activation(activation)
    cdef bint acc = bool(accumulate)
    _check_f32(dout, "dout")
    _check_f32(pre, "pre")
    _check_f32(dx, "dx", -1, True)
    _same_shape(dout, "dout", pre, "pre")
    _same_shape(dout, "dout", dx, "dx")
    _ew_apart(dx, "dx", pre, "pre")
    if acc:
        _ew_apart(dx, "dx", dout, "dout")
    else:
        _ew_alias_or_apart(dx, "dx", dout, "dout")
    if dout.size == 0:
        return
    cdef const float *pg = _ew_f(dout)
    cdef const float *pp = _ew_f(pre)
    cdef float *pd = _ew_f(dx)
    cdef size_t n = dout.size
    if reference:
        with nogil:
            c_act_backward_reference(pg, pp, pd, n, act, acc)
        return
    with nogil:
        c_act_backward(pg, pp, pd, n, act, acc)


def dropout_forward(x, out, p, seed, offset=0, reference=False):
    """out = x * keep / (1 - p) where keep[i] = (uniform(seed, offset + i) >= p), from a
    counter-based RNG (csrc/rng.h: 24 bits of SplitMix64 output number (offset + i) >> 1 of a stream
    keyed by seed, one half of it for an even counter, the other for an odd one): element i's draw
    depends only on (seed, offset + i), so the mask is the same
    for any thread count. p in [0, 1) (used as float32); p == 0 copies. Kept values are
    x * float32(1 / (1 - p)). x, out float32 of one shape; out may be x (not partially overlap it).
    seed, offset: ints in [0, 2**64). A caller drawing several masks from one seed advances offset
    by x.size per call. reference=True runs the naive one-thread loop (float compare
    uniform >= p, one scalar draw per element) instead."""
    cdef float pf = _ew_prob(p)
    cdef uint64_t s = _ew_u64(seed, "seed"), o = _ew_u64(offset, "offset")
    _check_f32(x, "x")
    _check_f32(out, "out", -1, True)
    _same_shape(x, "x", out, "out")
    _ew_alias_or_apart(out, "out", x, "x")
    if x.size == 0:
        return
    cdef const float *px = _ew_f(x)
    cdef float *po = _ew_f(out)
    cdef size_t n = x.size
    if reference:
        with nogil:
            c_dropout_forward_reference(px, po, n, pf, s, o)
        return
    with nogil:
        c_dropout_forward(px, po, n, pf, s, o)


def dropout_backward(dout, dx, p, seed, offset=0):
    """dx = dout * keep / (1 - p) with the mask dropout_forward drew for (seed, offset). dx may be
    dout (not partially overlap it)."""
    cdef float pf = _ew_prob(p)
    cdef uint64_t s = _ew_u64(seed, "seed"), o = _ew_u64(offset, "offset")
    _check_f32(dout, "dout")
    _check_f32(dx, "dx", -1, True)
    _same_shape(dout, "dout", dx, "dx")
    _ew_alias_or_apart(dx, "dx", dout, "dout")
    if dout.size == 0:
        return
    cdef const float *pg = _ew_f(dout)
    cdef float *pd = _ew_f(dx)
    cdef size_t n = dout.size
    with nogil:
        c_dropout_backward(pg, pd, n, pf, s, o)


def dropout_add_forward(x, residual, out, p, seed, offset=0, bias=None):
    """Fused residual connection: out = residual + dropout(x) (with bias: residual +
    dropout(x + bias), the bias broadcast over the last axis), with exactly dropout_forward's mask
    and the same bits as add_bias, dropout_forward and add in turn, in one pass over memory.
    p == 0 gives residual + x (+ bias). x, residual, out float32 of one shape (at least 1-D with a
    bias); bias None or float32 [D] (D = x.shape[-1]), not overlapping out; out may be x or
    residual itself (not partially overlap either); x is not modified unless it is out.
    Backward: d residual = dout, dx = dropout_backward(dout) with the same (p, seed, offset), and
    with a bias dbias += column sums of dx (bias_grad). (Extra function, not in the original
    contract.)"""
    cdef float pf = _ew_prob(p)
    cdef uint64_t s = _ew_u64(seed, "seed"), o = _ew_u64(offset, "offset")
    _check_f32(x, "x")
    _check_f32(residual, "residual")
    _check_f32(out, "out", -1, True)
    _same_shape(x, "x", residual, "residual")
    _same_shape(x, "x", out, "out")
    _ew_alias_or_apart(out, "out", x, "x")
    _ew_alias_or_apart(out, "out", residual, "residual")
    cdef size_t D = 0
    if bias is not None:
        _check_f32(bias, "bias", 1)
        if x.ndim == 0 or bias.shape[0] != x.shape[x.ndim - 1]:
            raise ValueError(f"bias must have shape [D] = x.shape[-1:], got {bias.shape} for x {x.shape}")
        _ew_apart(out, "out", bias, "bias")
        D = bias.shape[0]
    if x.size == 0:
        return
    cdef const float *px = _ew_f(x)
    cdef const float *pr = _ew_f(residual)
    cdef float *po = _ew_f(out)
    cdef const float *pb = NULL
    cdef size_t n = x.size
    if bias is None:
        with nogil:
            c_dropout_add_forward(px, pr, po, n, pf, s, o)
    else:
        pb = _ew_f(bias)
        with nogil:
            c_bias_dropout_add_forward(px, pb, pr, po, n // D, D, pf, s, o)


def dropout_mask(n, p, seed, offset=0):
    """The keep-mask dropout_forward applies to n elements: uint8 [n], 1 = kept, 0 = dropped
    (mask[i] = uniform(seed, offset + i) >= p). For tests and inspection."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"n must be an int, got {type(n).__name__}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    cdef float pf = _ew_prob(p)
    cdef uint64_t s = _ew_u64(seed, "seed"), o = _ew_u64(offset, "offset")
    mask = np.empty(int(n), dtype=np.uint8)
    if n == 0:
        return mask
    cdef uint8_t[::1] mv = mask
    with nogil:
        c_dropout_mask(&mv[0], <size_t>mv.shape[0], pf, s, o)
    return mask


# ---------------------------------------------------------------------------
# Fingerprint of an array's memory (csrc/checksum.h).

cdef extern from "checksum.h" nogil:
    uint64_t c_checksum64 "checksum64"(const void *data, size_t bytes)


def checksum(x):
    """A 64-bit fingerprint (int) of the bytes of a C-contiguous array: any change of a single
    8-byte word changes it; the same on any thread count. For caches that must see in-place changes."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"x must be a numpy.ndarray, got {type(x).__name__}")
    if not x.flags.c_contiguous:
        raise ValueError("x must be C-contiguous")
    cdef cnp.ndarray arr = <cnp.ndarray>x
    cdef const void *p = cnp.PyArray_DATA(arr)
    cdef size_t n = <size_t>x.nbytes
    cdef uint64_t h
    with nogil:
        h = c_checksum64(p, n)
    return int(h)


# ---------------------------------------------------------------------------
# Instruction ceilings of one core (csrc/peak.h), for the benchmarks' "fraction of peak".

cdef extern from "peak.h" nogil:
    double c_peak_fma_gflops "peak_fma_gflops"(int isa, double seconds)
    double c_peak_int8_gops "peak_int8_gops"(int isa, double seconds)
    double c_peak_bf16_gflops "peak_bf16_gflops"(int isa, double seconds)


def peak_per_core(double seconds=0.2):
    """{"fp32_fma_gflops": ..., "bf16_gflops": ..., "int8_gops": ...}: this core's ceilings at the
    SIMD level in use, measured now on the calling thread (pure FMA / tdpbf16ps or vdpbf16ps /
    tdpbusd, vpdpbusd or vpmaddwd loops, independent chains or tiles; csrc/peak.h)."""
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    cdef int level = tf_isa()
    cdef double f, h, i
    with nogil:
        f = c_peak_fma_gflops(level, seconds)
        h = c_peak_bf16_gflops(level, seconds)
        i = c_peak_int8_gops(level, seconds)
    return {"fp32_fma_gflops": f, "bf16_gflops": h, "int8_gops": i, "isa": tf_isa_name(level).decode()}
