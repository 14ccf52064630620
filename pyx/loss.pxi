# Cross-entropy and log-softmax (csrc/loss.h). Included by _C.pyx.

def cross_entropy(logits, targets, dlogits=None, Py_ssize_t ignore_index=-100,
                  float label_smoothing=0.0, float grad_scale=1.0):
    """F.cross_entropy(logits, targets, ignore_index=..., label_smoothing=...) with mean reduction.

    Returns (loss, n_valid): the mean over rows whose target != ignore_index (as a Python float),
    and how many such rows there were. logits float32 C-contiguous [N, V]; targets int64 [N], each
    in [0, V) or equal to ignore_index (ValueError otherwise). When dlogits (float32 [N, V]) is
    given it receives grad_scale * d loss / d logits (zeros on ignored rows); dlogits may be logits.
    With no valid row the loss is 0.0 and the gradient zero (PyTorch would give nan).
    Deterministic for any thread count.
    """
    raise NotImplementedError("cross_entropy")


def log_softmax(x, out):
    """out = log_softmax(x) over the last axis; float32 C-contiguous [N, V]; out may be x."""
    raise NotImplementedError("log_softmax")
