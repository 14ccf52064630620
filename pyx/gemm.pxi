# GEMM (csrc/gemm.h). Included by _C.pyx.

def gemm(a, b, out, bint trans_a=False, bint trans_b=False, float alpha=1.0, bint accumulate=False):
    """out = alpha * op(a) @ op(b), or out += alpha * op(a) @ op(b) when accumulate.

    a, b, out: float32 arrays with ndim 2, 3 or 4, all the same ndim; the leading (batch) axes of
    a, b and out are equal in size, but a or b may have batch stride 0 (a np.broadcast_to view).
    The last axis of each must have unit stride; the other strides are free (>= 0), so head views
    such as q.reshape(B, T, H, dh).transpose(0, 2, 1, 3) are used in place, without copies.
    op(x) swaps the last two axes of x when trans_x. out must be writeable, its rows must not overlap
    each other, and it must not overlap a or b. Result bits do not depend on the thread count.
    """
    raise NotImplementedError("gemm")


def gemm_reference(a, b, out, bint trans_a=False, bint trans_b=False, float alpha=1.0, bint accumulate=False):
    """Same contract as gemm, computed by the naive triple loop in C (the tests' second opinion)."""
    raise NotImplementedError("gemm_reference")
