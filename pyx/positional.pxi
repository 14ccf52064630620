# Sinusoidal positional encoding (csrc/positional.h). Included by _C.pyx.

cdef extern from "positional.h" nogil:
    void c_positional_encoding "positional_encoding"(float *out, long max_len, long d_model)


def positional_encoding(out):
    """Fill out, float32 C-contiguous [max_len, d_model], with the paper's table (section 3.5):
    PE[pos, 2i] = sin(pos / 10000^(2i/d_model)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d_model)),
    computed in double precision and rounded once."""
    _check_f32(out, "out", 2, True)
    if out.size == 0:
        return
    cdef float[:, ::1] ov = out
    with nogil:
        c_positional_encoding(&ov[0, 0], ov.shape[0], ov.shape[1])
