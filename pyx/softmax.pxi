# Masked softmax (csrc/softmax.h). Included by _C.pyx.

def softmax_forward(scores, probs, float scale=1.0, bint causal=False, key_padding_mask=None,
                    Py_ssize_t q_offset=0):
    """probs = softmax(scale * scores + masks) over the last axis, in one pass per row.

    scores, probs: float32, C-contiguous, [B, H, Tq, Tk] or [B, Tq, Tk], the same shape; probs may
    be scores itself (in place). key_padding_mask: None or bool/uint8 C-contiguous [B, Tk], True =
    padding (ignored key). causal: query i, at absolute position q_offset + i, sees keys
    k <= q_offset + i (q_offset > 0 when decoding with a key/value cache). A row whose keys are all
    masked gives zeros, never NaN.
    """
    raise NotImplementedError("softmax_forward")


def softmax_backward(probs, dprobs, dscores, float scale=1.0):
    """dscores = scale * probs * (dprobs - sum(probs * dprobs, axis=-1)), one pass per row.
    All float32 C-contiguous of one shape ([..., Tk]); dscores may be dprobs (in place)."""
    raise NotImplementedError("softmax_backward")
