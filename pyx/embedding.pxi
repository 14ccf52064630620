# Embedding gather / scatter-add (csrc/embedding.h). Included by _C.pyx.

def embedding_forward(ids, table, out, float scale=1.0, pe=None, Py_ssize_t pos_offset=0):
    """out[b, t, :] = table[ids[b, t], :] * scale (+ pe[pos_offset + t, :] when pe is given).
    ids: int64 C-contiguous [B, T], every value in [0, V) (checked, ValueError otherwise);
    table: float32 [V, D]; pe: None or float32 [L, D] with pos_offset + T <= L; out: float32 [B, T, D]."""
    raise NotImplementedError("embedding_forward")


def embedding_backward(ids, dout, dtable, float scale=1.0):
    """dtable[ids[b, t], :] += scale * dout[b, t, :]. Deterministic (no atomics): same bits for any
    thread count. ids int64 [B, T]; dout float32 [B, T, D]; dtable float32 [V, D]."""
    raise NotImplementedError("embedding_backward")
