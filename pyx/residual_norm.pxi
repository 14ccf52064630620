# Residual connection + layer norm, fused (csrc/residual_norm.h). Included by _C.pyx after
# layernorm.pxi and elementwise.pxi, whose checks it uses.

cdef extern from "residual_norm.h" nogil:
    void c_residual_layernorm_forward "residual_layernorm_forward"(
        float *out, float *mean, float *rstd, float *s, const float *x, const float *bias,
        const float *residual, const float *weight, const float *lnbias, long N, long D, float eps,
        float p, uint64_t seed, uint64_t offset)
    size_t c_residual_layernorm_backward_scratch "residual_layernorm_backward_scratch"(long N, long D)
    void c_residual_layernorm_backward "residual_layernorm_backward"(
        float *ds, float *dd, float *dweight, float *dlnbias, float *dbias, float *scratch,
        const float *dout, const float *s, const float *weight, const float *mean, const float *rstd,
        long N, long D, float p, uint64_t seed, uint64_t offset)
    void c_residual_scalenorm_forward "residual_scalenorm_forward"(
        float *out, float *norms, float *s, const float *x, const float *bias, const float *residual,
        float g, long N, long D, float eps, float p, uint64_t seed, uint64_t offset)
    size_t c_residual_scalenorm_backward_scratch "residual_scalenorm_backward_scratch"(long N, long D)
    void c_residual_scalenorm_backward "residual_scalenorm_backward"(
        float *ds, float *dd, float *dg, float *dbias, float *scratch, const float *dout, const float *s,
        const float *norms, float g, long N, long D, float eps, float p, uint64_t seed, uint64_t offset)
    size_t c_dropout_bias_backward_scratch "dropout_bias_backward_scratch"(long N, long D)
    void c_dropout_bias_backward "dropout_bias_backward"(
        float *dd, float *dbias, float *scratch, const float *ds, const float *pre, int act, long N,
        long D, float p, uint64_t seed, uint64_t offset)


cdef tuple _residual_forward_operands(x, bias, residual, s, out, params):
    """The checks both forwards make of x, bias, residual, s and out (params: the norm's own
    read-only arrays, as (array, name) pairs, that s and out must not overlap). Returns
    (x, bias or None, residual, s, out) as arrays."""
    cdef cnp.ndarray xa = _nn_f32(x, "x", 2)
    cdef Py_ssize_t D = cnp.PyArray_DIMS(xa)[1]
    if D < 1:
        raise ValueError(f"x must have a non-empty last axis, got shape {x.shape}")
    cdef cnp.ndarray ra_ = _nn_f32(residual, "residual", 2)
    _nn_rows_like(ra_, "residual", xa, "x")
    cdef cnp.ndarray sa = _nn_f32(s, "s", 2, True)
    _nn_rows_like(sa, "s", xa, "x")
    cdef cnp.ndarray oa = _nn_f32(out, "out", 2, True)
    _nn_rows_like(oa, "out", xa, "x")
    cdef cnp.ndarray ba = None
    if bias is not None:
        ba = _nn_f32(bias, "bias", 1)
        _nn_vector(ba, "bias", D, "the last axis of x")
        params = list(params) + [(ba, "bias")]
    _nn_same_or_disjoint(sa, "s", xa, "x")
    _nn_same_or_disjoint(sa, "s", ra_, "residual")
    _nn_no_overlap(oa, "out", sa, "s")
    _nn_no_overlap(oa, "out", xa, "x")
    _nn_no_overlap(oa, "out", ra_, "residual")
    for a, name in params:
        _nn_no_overlap(oa, "out", a, name)
        _nn_no_overlap(sa, "s", a, name)
    return xa, ba, ra_, sa, oa


cdef cnp.ndarray _residual_dropped_gradient(dd, float pf, cnp.ndarray dya, cnp.ndarray dsa):
    """The backwards' dd: an array of its own when p > 0, None when p == 0."""
    cdef cnp.ndarray dda = None
    if pf > 0:
        if dd is None:
            raise ValueError("dd must be an array when p > 0 (the dropped gradient has its own memory)")
        dda = _nn_f32(dd, "dd", 2, True)
        _nn_rows_like(dda, "dd", dya, "dout")
        _nn_no_overlap(dda, "dd", dya, "dout")
        _nn_no_overlap(dda, "dd", dsa, "ds")
    elif dd is not None:
        raise ValueError("dd must be None when p == 0 (the gradient of x is ds itself)")
    return dda


def residual_layernorm_forward(x, bias, residual, s, weight, lnbias, out, mean, rstd, eps=1e-5,
                               p=0.0, seed=0, offset=0):
    """A sub-layer's residual connection and the layer norm after it, in one pass:
    s = residual + dropout(x + bias) (bias None: without one), out = LayerNorm(s) with weight and
    lnbias, mean and rstd saved for residual_layernorm_backward. The same bits as
    dropout_add_forward(x, residual, s, p, seed, offset, bias=bias) then layernorm_forward(s, ...).
    x, residual, s, out: float32 C-contiguous [N, D]; s may be x or residual; out must not overlap
    s, x or residual; bias, weight, lnbias [D]; mean, rstd [N]."""
    cdef float pf = _ew_prob(p)
    cdef uint64_t sd = _ew_u64(seed, "seed"), o = _ew_u64(offset, "offset")
    cdef cnp.ndarray xa = _nn_f32(x, "x", 2)
    cdef Py_ssize_t N = cnp.PyArray_DIMS(xa)[0], D = cnp.PyArray_DIMS(xa)[1]
    cdef cnp.ndarray wa = _nn_f32(weight, "weight", 1)
    cdef cnp.ndarray la = _nn_f32(lnbias, "lnbias", 1)
    cdef cnp.ndarray ba, ra_, sa, oa
    xa, ba, ra_, sa, oa = _residual_forward_operands(x, bias, residual, s, out, ((wa, "weight"), (la, "lnbias")))
    _nn_vector(wa, "weight", D, "the last axis of x")
    _nn_vector(la, "lnbias", D, "the last axis of x")
    cdef cnp.ndarray ma = _nn_f32(mean, "mean", 1, True)
    _nn_vector(ma, "mean", N, "the rows of x")
    cdef cnp.ndarray rsa = _nn_f32(rstd, "rstd", 1, True)
    _nn_vector(rsa, "rstd", N, "the rows of x")
    cdef float feps = _eps_arg(eps)
    for a, name in ((ma, "mean"), (rsa, "rstd")):
        for other, other_name in ((oa, "out"), (sa, "s"), (xa, "x"), (ra_, "residual"), (wa, "weight"), (la, "lnbias")):
            _nn_no_overlap(a, name, other, other_name)
        if ba is not None:
            _nn_no_overlap(a, name, ba, "bias")
    _nn_no_overlap(rsa, "rstd", ma, "mean")
    if N == 0:
        return
    cdef float *op = <float *>cnp.PyArray_DATA(oa)
    cdef float *mp = <float *>cnp.PyArray_DATA(ma)
    cdef float *rp = <float *>cnp.PyArray_DATA(rsa)
    cdef float *sp = <float *>cnp.PyArray_DATA(sa)
    cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
    cdef const float *bp = NULL
    if ba is not None:
        bp = <const float *>cnp.PyArray_DATA(ba)
    cdef const float *rp_ = <const float *>cnp.PyArray_DATA(ra_)
    cdef const float *wp = <const float *>cnp.PyArray_DATA(wa)
    cdef const float *lp = <const float *>cnp.PyArray_DATA(la)
    with nogil:
        c_residual_layernorm_forward(op, mp, rp, sp, xp, bp, rp_, wp, lp, N, D, feps, pf, sd, o)


def residual_layernorm_backward(dout, s, weight, mean, rstd, ds, dd, dweight, dlnbias, dbias,
                                p=0.0, seed=0, offset=0):
    """Gradients of residual_layernorm_forward: ds = dL/ds (the residual's gradient; ds may be
    dout), dd = dropout_backward(ds) (the gradient of x: an array [N, D] apart from ds and dout
    when p > 0; None when p == 0, where it is ds), and dweight, dlnbias (the layer norm's) and
    dbias (the column sums of dd: the bias's) added into. The same bits as layernorm_backward,
    dropout_backward and bias_grad in turn, for any thread count."""
    cdef float pf = _ew_prob(p)
    cdef uint64_t sd = _ew_u64(seed, "seed"), o = _ew_u64(offset, "offset")
    cdef cnp.ndarray dya = _nn_f32(dout, "dout", 2)
    cdef Py_ssize_t N = cnp.PyArray_DIMS(dya)[0], D = cnp.PyArray_DIMS(dya)[1]
    if D < 1:
        raise ValueError(f"dout must have a non-empty last axis, got shape {dout.shape}")
    cdef cnp.ndarray sa = _nn_f32(s, "s", 2)
    _nn_rows_like(sa, "s", dya, "dout")
    cdef cnp.ndarray wa = _nn_f32(weight, "weight", 1)
    _nn_vector(wa, "weight", D, "the last axis of dout")
    cdef cnp.ndarray ma = _nn_f32(mean, "mean", 1)
    _nn_vector(ma, "mean", N, "the rows of dout")
    cdef cnp.ndarray rsa = _nn_f32(rstd, "rstd", 1)
    _nn_vector(rsa, "rstd", N, "the rows of dout")
    cdef cnp.ndarray dsa = _nn_f32(ds, "ds", 2, True)
    _nn_rows_like(dsa, "ds", dya, "dout")
    _nn_same_or_disjoint(dsa, "ds", dya, "dout")
    cdef cnp.ndarray dda = _residual_dropped_gradient(dd, pf, dya, dsa)
    cdef cnp.ndarray dwa = _nn_f32(dweight, "dweight", 1, True)
    _nn_vector(dwa, "dweight", D, "the last axis of dout")
    cdef cnp.ndarray dla = _nn_f32(dlnbias, "dlnbias", 1, True)
    _nn_vector(dla, "dlnbias", D, "the last axis of dout")
    cdef cnp.ndarray dba = _nn_f32(dbias, "dbias", 1, True)
    _nn_vector(dba, "dbias", D, "the last axis of dout")
    outs = [(dsa, "ds"), (dwa, "dweight"), (dla, "dlnbias"), (dba, "dbias")]
    if dda is not None:
        outs.append((dda, "dd"))
    for a, name in outs:
        _nn_no_overlap(a, name, sa, "s")
        _nn_no_overlap(a, name, wa, "weight")
        _nn_no_overlap(a, name, ma, "mean")
        _nn_no_overlap(a, name, rsa, "rstd")
    for a, name in ((dwa, "dweight"), (dla, "dlnbias"), (dba, "dbias")):
        _nn_no_overlap(a, name, dya, "dout")
        _nn_no_overlap(a, name, dsa, "ds")
        if dda is not None:
            _nn_no_overlap(a, name, dda, "dd")
    _nn_no_overlap(dla, "dlnbias", dwa, "dweight")
    _nn_no_overlap(dba, "dbias", dwa, "dweight")
    _nn_no_overlap(dba, "dbias", dla, "dlnbias")
    if N == 0:
        return
    cdef float *dsp = <float *>cnp.PyArray_DATA(dsa)
    cdef float *ddp = NULL
    if dda is not None:
        ddp = <float *>cnp.PyArray_DATA(dda)
    cdef float *dwp = <float *>cnp.PyArray_DATA(dwa)
    cdef float *dlp = <float *>cnp.PyArray_DATA(dla)
    cdef float *dbp = <float *>cnp.PyArray_DATA(dba)
    cdef const float *dyp = <const float *>cnp.PyArray_DATA(dya)
    cdef const float *sp = <const float *>cnp.PyArray_DATA(sa)
    cdef const float *wp = <const float *>cnp.PyArray_DATA(wa)
    cdef const float *mp = <const float *>cnp.PyArray_DATA(ma)
    cdef const float *rp = <const float *>cnp.PyArray_DATA(rsa)
    cdef float *scratch = <float *>malloc(c_residual_layernorm_backward_scratch(N, D) * sizeof(float))
    if scratch == NULL:
        raise MemoryError("residual_layernorm_backward: no memory for the partial sums")
    with nogil:
        c_residual_layernorm_backward(dsp, ddp, dwp, dlp, dbp, scratch, dyp, sp, wp, mp, rp, N, D,
                                      pf, sd, o)
    free(scratch)


def residual_scalenorm_forward(x, bias, residual, s, g, out, norms, eps=1e-5, p=0.0, seed=0, offset=0):
    """residual_layernorm_forward for ScaleNorm (csrc/residual_norm.h): s = residual +
    dropout(x + bias) (bias None: without one), out = ScaleNorm(s) = s * (g / max(||s||, eps)) per
    row, norms [N] saved for residual_scalenorm_backward. The same bits as
    dropout_add_forward(x, residual, s, p, seed, offset, bias=bias) then scalenorm_forward(s, g, out,
    norms, eps). x, residual, s, out: float32 C-contiguous [N, D]; s may be x or residual; out must
    not overlap s, x or residual; bias [D]; g float32 [1]."""
    cdef float pf = _ew_prob(p)
    cdef uint64_t sd = _ew_u64(seed, "seed"), o = _ew_u64(offset, "offset")
    cdef cnp.ndarray ga = _nn_f32(g, "g", 1)
    _nn_vector(ga, "g", 1, "one gain")
    cdef cnp.ndarray xa, ba, ra_, sa, oa
    xa, ba, ra_, sa, oa = _residual_forward_operands(x, bias, residual, s, out, ((ga, "g"),))
    cdef Py_ssize_t N = cnp.PyArray_DIMS(xa)[0], D = cnp.PyArray_DIMS(xa)[1]
    cdef cnp.ndarray na = _nn_f32(norms, "norms", 1, True)
    _nn_vector(na, "norms", N, "the rows of x")
    cdef float feps = _eps_arg(eps)
    for other, other_name in ((oa, "out"), (sa, "s"), (xa, "x"), (ra_, "residual"), (ga, "g")):
        _nn_no_overlap(na, "norms", other, other_name)
    if ba is not None:
        _nn_no_overlap(na, "norms", ba, "bias")
    if N == 0:
        return
    cdef float *op = <float *>cnp.PyArray_DATA(oa)
    cdef float *np_ = <float *>cnp.PyArray_DATA(na)
    cdef float *sp = <float *>cnp.PyArray_DATA(sa)
    cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
    cdef const float *bp = NULL
    if ba is not None:
        bp = <const float *>cnp.PyArray_DATA(ba)
    cdef const float *rp_ = <const float *>cnp.PyArray_DATA(ra_)
    cdef float gv = (<const float *>cnp.PyArray_DATA(ga))[0]
    with nogil:
        c_residual_scalenorm_forward(op, np_, sp, xp, bp, rp_, gv, N, D, feps, pf, sd, o)


def residual_scalenorm_backward(dout, s, norms, g, ds, dd, dg, dbias, eps=1e-5, p=0.0, seed=0, offset=0):
    """Gradients of residual_scalenorm_forward: ds = dL/ds (the residual's gradient; ds may be
    dout), dd = dropout_backward(ds) (the gradient of x: an array [N, D] apart from ds and dout
    when p > 0; None when p == 0, where it is ds), dg (float32 [1], or None: the gain's) and dbias
    (the column sums of dd: the bias's) added into. The same bits as scalenorm_backward,
    dropout_backward and bias_grad in turn, for any thread count."""
    cdef float pf = _ew_prob(p)
    cdef uint64_t sd = _ew_u64(seed, "seed"), o = _ew_u64(offset, "offset")
    cdef cnp.ndarray dya = _nn_f32(dout, "dout", 2)
    cdef Py_ssize_t N = cnp.PyArray_DIMS(dya)[0], D = cnp.PyArray_DIMS(dya)[1]
    if D < 1:
        raise ValueError(f"dout must have a non-empty last axis, got shape {dout.shape}")
    cdef cnp.ndarray sa = _nn_f32(s, "s", 2)
    _nn_rows_like(sa, "s", dya, "dout")
    cdef cnp.ndarray na = _nn_f32(norms, "norms", 1)
    _nn_vector(na, "norms", N, "the rows of dout")
    cdef cnp.ndarray ga = _nn_f32(g, "g", 1)
    _nn_vector(ga, "g", 1, "one gain")
    cdef cnp.ndarray dsa = _nn_f32(ds, "ds", 2, True)
    _nn_rows_like(dsa, "ds", dya, "dout")
    _nn_same_or_disjoint(dsa, "ds", dya, "dout")
    cdef cnp.ndarray dda = _residual_dropped_gradient(dd, pf, dya, dsa)
    cdef cnp.ndarray dba = _nn_f32(dbias, "dbias", 1, True)
    _nn_vector(dba, "dbias", D, "the last axis of dout")
    cdef cnp.ndarray dga = None
    cdef float *dgp = NULL
    outs = [(dsa, "ds"), (dba, "dbias")]
    if dg is not None:
        dga = _nn_f32(dg, "dg", 1, True)
        _nn_vector(dga, "dg", 1, "one gain")
        dgp = <float *>cnp.PyArray_DATA(dga)
        outs.append((dga, "dg"))
    if dda is not None:
        outs.append((dda, "dd"))
    for a, name in outs:
        for other, other_name in ((sa, "s"), (na, "norms"), (ga, "g")):
            _nn_no_overlap(a, name, other, other_name)
    for a, name in outs[1:]:
        if a is dda:
            continue
        _nn_no_overlap(a, name, dya, "dout")         # the sums added into: apart from the rest
        for other, other_name in outs:
            if other is not a:
                _nn_no_overlap(a, name, other, other_name)
    if N == 0:
        return
    cdef float *dsp = <float *>cnp.PyArray_DATA(dsa)
    cdef float *ddp = NULL
    if dda is not None:
        ddp = <float *>cnp.PyArray_DATA(dda)
    cdef float *dbp = <float *>cnp.PyArray_DATA(dba)
    cdef const float *dyp = <const float *>cnp.PyArray_DATA(dya)
    cdef const float *sp = <const float *>cnp.PyArray_DATA(sa)
    cdef const float *npp = <const float *>cnp.PyArray_DATA(na)
    cdef float gv = (<const float *>cnp.PyArray_DATA(ga))[0]
    cdef float feps = _eps_arg(eps)
    cdef float *scratch = <float *>malloc(c_residual_scalenorm_backward_scratch(N, D) * sizeof(float))
    if scratch == NULL:
        raise MemoryError("residual_scalenorm_backward: no memory for the partial sums")
    with nogil:
        c_residual_scalenorm_backward(dsp, ddp, dgp, dbp, scratch, dyp, sp, npp, gv, N, D, feps, pf, sd, o)
    free(scratch)


def dropout_bias_backward(ds, dd, dbias, p=0.0, seed=0, offset=0, pre=None, activation="relu"):
    """The gradient through a dropout and the bias before it, in one pass (csrc/residual_norm.h):
    dd = dropout_backward(ds, p, seed, offset), then, when pre is given, dd = act'(pre) * dd
    (act_backward's, `activation` as bias_act_forward names it); dbias [D] += the column sums of dd.
    The same bits as dropout_backward, act_backward and bias_grad in turn, for any thread count.
    ds, dd, pre: float32 C-contiguous [N, D]; dd may be ds; pre apart from dd."""
    cdef float pf = _ew_prob(p)
    cdef uint64_t sd = _ew_u64(seed, "seed"), o = _ew_u64(offset, "offset")
    cdef int act = _ew_activation(activation)
    cdef cnp.ndarray dsa = _nn_f32(ds, "ds", 2)
    cdef Py_ssize_t N = cnp.PyArray_DIMS(dsa)[0], D = cnp.PyArray_DIMS(dsa)[1]
    cdef cnp.ndarray dda = _nn_f32(dd, "dd", 2, True)
    _nn_rows_like(dda, "dd", dsa, "ds")
    _nn_same_or_disjoint(dda, "dd", dsa, "ds")
    cdef cnp.ndarray dba = _nn_f32(dbias, "dbias", 1, True)
    _nn_vector(dba, "dbias", D, "the last axis of ds")
    _nn_no_overlap(dba, "dbias", dsa, "ds")
    _nn_no_overlap(dba, "dbias", dda, "dd")
    cdef cnp.ndarray pa = None
    cdef const float *pp = NULL
    if pre is not None:
        pa = _nn_f32(pre, "pre", 2)
        _nn_rows_like(pa, "pre", dsa, "ds")
        _nn_no_overlap(pa, "pre", dda, "dd")
        _nn_no_overlap(pa, "pre", dba, "dbias")
        pp = <const float *>cnp.PyArray_DATA(pa)
    if N == 0 or D == 0:
        return
    cdef float *ddp = <float *>cnp.PyArray_DATA(dda)
    cdef float *dbp = <float *>cnp.PyArray_DATA(dba)
    cdef const float *dsp = <const float *>cnp.PyArray_DATA(dsa)
    cdef float *scratch = <float *>malloc(c_dropout_bias_backward_scratch(N, D) * sizeof(float))
    if scratch == NULL:
        raise MemoryError("dropout_bias_backward: no memory for the partial sums")
    with nogil:
        c_dropout_bias_backward(ddp, dbp, scratch, dsp, pp, act, N, D, pf, sd, o)
    free(scratch)
