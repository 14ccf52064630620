# Sinusoidal positional encoding (csrc/positional.h). Included by _C.pyx.

def positional_encoding(out):
    """Fill out, float32 C-contiguous [max_len, d_model], with the paper's table (section 3.5):
    PE[pos, 2i] = sin(pos / 10000^(2i/d_model)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d_model)),
    computed in double precision and rounded once."""
    raise NotImplementedError("positional_encoding")
