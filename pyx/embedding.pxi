# Embedding gather / scatter-add (csrc/embedding.h). Included by _C.pyx.

cimport numpy as cnp

cdef extern from "embedding.h" nogil:
    void c_embedding_forward "embedding_forward" (const int64_t *ids, const float *table,
            const float *pe, float *out, size_t BT, size_t T, size_t D, float scale)
    void c_embedding_backward "embedding_backward" (const int64_t *ids, const float *dout,
            float *dtable, size_t BT, size_t D, float scale)
    void c_embedding_forward_reference "embedding_forward_reference" (const int64_t *ids,
            const float *table, const float *pe, float *out, size_t BT, size_t T, size_t D,
            float scale)
    void c_embedding_backward_reference "embedding_backward_reference" (const int64_t *ids,
            const float *dout, float *dtable, size_t BT, size_t D, float scale)


cdef float _emb_scale(object scale) except? -1.0:
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise TypeError(f"scale must be a real number, got {type(scale).__name__}")
    return <float>float(scale)


cdef void _emb_apart(object out, str oname, object x, str xname) except *:
    """out must not share memory with x (both already checked C-contiguous: each is one range)."""
    cdef char *po = <char *>cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef char *px = <char *>cnp.PyArray_DATA(<cnp.ndarray>x)
    cdef Py_ssize_t no = cnp.PyArray_NBYTES(<cnp.ndarray>out), nx = cnp.PyArray_NBYTES(<cnp.ndarray>x)
    if no > 0 and nx > 0 and po < px + nx and px < po + no:
        raise ValueError(f"{oname} must not overlap {xname}")


cdef void _emb_check_ids(object ids, Py_ssize_t V) except *:
    """Every id in [0, V), checked before any kernel runs."""
    cdef const int64_t *pi = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>ids)
    cdef Py_ssize_t i, n = ids.size, bad = -1
    cdef uint64_t limit = <uint64_t>V
    with nogil:
        for i in range(n):
            if <uint64_t>pi[i] >= limit:    # negative ids wrap to huge unsigned values
                bad = i
                break
    if bad >= 0:
        raise ValueError(f"ids must be in [0, {V}) (the table's rows), got {pi[bad]} at flat "
                         f"index {bad}")


def embedding_forward(ids, table, out, scale=1.0, pe=None, pos_offset=0, reference=False):
    """out[b, t, :] = table[ids[b, t], :] * scale (+ pe[pos_offset + t, :] when pe is given).
    ids: int64 C-contiguous [B, T], every value in [0, V) (checked, ValueError otherwise);
    table: float32 [V, D]; pe: None or float32 [L, D] with pos_offset + T <= L; out: float32 [B, T, D].
    out must not overlap ids, table or pe. scale: a real number (used as float32).
    out = round(round(w * scale) + pe) exactly as PyTorch's two ops (no fused multiply-add), so the
    result has the same bits at every SIMD level and thread count. reference=True runs the naive
    one-thread C loop instead (for tests)."""
    _check(ids, "ids", _I64, 2)
    _check_f32(table, "table", 2)
    _check_f32(out, "out", 3, True)
    cdef float s = _emb_scale(scale)
    cdef Py_ssize_t B = ids.shape[0], T = ids.shape[1], V = table.shape[0], D = table.shape[1]
    if out.shape != (B, T, D):
        raise ValueError(f"out must have shape [B, T, D] = {(B, T, D)}, got {out.shape}")
    if isinstance(pos_offset, bool) or not isinstance(pos_offset, (int, np.integer)):
        raise TypeError(f"pos_offset must be an int, got {type(pos_offset).__name__}")
    if pos_offset < 0:
        raise ValueError(f"pos_offset must be >= 0, got {pos_offset}")
    cdef Py_ssize_t off = pos_offset
    if pe is not None:
        _check_f32(pe, "pe", 2)
        if pe.shape[1] != D:
            raise ValueError(f"pe must have D = {D} columns (table's), got shape {pe.shape}")
        if pos_offset + T > pe.shape[0]:
            raise ValueError(f"pe has {pe.shape[0]} positions, too few for pos_offset + T = "
                             f"{pos_offset} + {T}")
        _emb_apart(out, "out", pe, "pe")
    _emb_apart(out, "out", table, "table")
    _emb_apart(out, "out", ids, "ids")
    _emb_check_ids(ids, V)
    if B * T == 0 or D == 0:
        return
    cdef const int64_t *pi = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>ids)
    cdef const float *pt = <const float *>cnp.PyArray_DATA(<cnp.ndarray>table)
    cdef float *po = <float *>cnp.PyArray_DATA(<cnp.ndarray>out)
    cdef const float *pp = NULL
    if pe is not None:
        pp = <const float *>cnp.PyArray_DATA(<cnp.ndarray>pe) + off * D
    if reference:
        with nogil:
            c_embedding_forward_reference(pi, pt, pp, po, <size_t>(B * T), <size_t>T, <size_t>D, s)
        return
    with nogil:
        c_embedding_forward(pi, pt, pp, po, <size_t>(B * T), <size_t>T, <size_t>D, s)


def embedding_backward(ids, dout, dtable, scale=1.0, reference=False):
    """dtable[ids[b, t], :] += scale * dout[b, t, :]. Deterministic (no atomics): same bits for any
    thread count (parallel over column chunks of D; each thread adds tokens in order).
    ids int64 [B, T] (every value in [0, V), checked); dout float32 [B, T, D]; dtable float32 [V, D],
    not overlapping dout or ids. Each token adds round(scale * dout) (PyTorch's rounding).
    reference=True runs the naive one-thread C loop instead (for tests)."""
    _check(ids, "ids", _I64, 2)
    _check_f32(dout, "dout", 3)
    _check_f32(dtable, "dtable", 2, True)
    cdef float s = _emb_scale(scale)
    cdef Py_ssize_t B = ids.shape[0], T = ids.shape[1], V = dtable.shape[0], D = dtable.shape[1]
    if dout.shape != (B, T, D):
        raise ValueError(f"dout must have shape [B, T, D] = {(B, T, D)}, got {dout.shape}")
    _emb_apart(dtable, "dtable", dout, "dout")
    _emb_apart(dtable, "dtable", ids, "ids")
    _emb_check_ids(ids, V)
    if B * T == 0 or D == 0:
        return
    cdef const int64_t *pi = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>ids)
    cdef const float *pg = <const float *>cnp.PyArray_DATA(<cnp.ndarray>dout)
    cdef float *pt = <float *>cnp.PyArray_DATA(<cnp.ndarray>dtable)
    if reference:
        with nogil:
            c_embedding_backward_reference(pi, pg, pt, <size_t>(B * T), <size_t>D, s)
        return
    with nogil:
        c_embedding_backward(pi, pg, pt, <size_t>(B * T), <size_t>D, s)
