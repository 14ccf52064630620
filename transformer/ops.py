"""The kernels as numpy functions: float32 in, float32 out.

Conventions, the same for every function here:
- inputs must be float32 (TypeError otherwise: nothing is silently downcast);
  non-contiguous or Fortran-ordered inputs are accepted and converted (matmul
  reads transposed views in place, without a copy);
- an `out` array must be exactly right (ndarray, float32, the result's shape,
  C-contiguous, writeable, aligned, not overlapping an input) or it is refused with
  ValueError/TypeError;
- every error names the argument.
"""
import numpy as np

from . import _C
from .precision import check_precision

__all__ = ["matmul", "softmax", "layer_norm", "positional_encoding", "quantize_int8", "int8_linear"]


def _input(x, name):
    if not isinstance(x, np.ndarray):
        try:
            x = np.asarray(x)
        except Exception as exc:  # ragged lists and the like
            raise TypeError(f"{name} must be a float32 array: {exc}") from None
    if x.dtype != np.float32:
        raise TypeError(f"{name} must have dtype float32, got {x.dtype}")
    if not x.flags.aligned:
        # a float32 view at an odd byte offset: the kernels read whole floats, so copy it
        x = x.copy()
    return x


def _flag(value, name):
    """A yes/no argument: bool (or numpy bool, or the ints 0 and 1); nothing else is guessed at."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def _out(out, name, shape, inputs):
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(out).__name__}")
    if out.dtype != np.float32:
        raise TypeError(f"{name} must have dtype float32, got {out.dtype}")
    if out.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {out.shape}")
    if not out.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if not out.flags.writeable:
        raise ValueError(f"{name} must be writeable")
    if not out.flags.aligned:
        raise ValueError(f"{name} must be aligned to its dtype (4 bytes)")
    for other_name, other in inputs:
        if np.may_share_memory(out, other):
            raise ValueError(f"{name} must not overlap {other_name}")
    return out


def _gemm_operand(x, trans):
    """A view the GEMM reads in place: unit stride along the last axis, non-negative strides.
    A transposed (Fortran-ordered) matrix is read as the transpose of its C-ordered base."""
    item = x.itemsize
    if x.shape[-1] <= 1 or x.strides[-1] == item:
        if min(x.strides) >= 0:
            return x, trans
    elif x.strides[-2] == item and min(x.strides) >= 0:
        return np.swapaxes(x, -1, -2), not trans
    return np.ascontiguousarray(x), trans


def matmul(a, b, trans_a=False, trans_b=False, out=None, accumulate=False, precision="fp32"):
    """op(a) @ op(b), where op transposes the last two axes when asked.

    a, b: 2-D, or 3-D batched (a 2-D operand is shared by every batch entry).
    With accumulate=True the product is added into `out` (which is then required).
    precision: "fp32", or "bf16" (every element of a and b rounded to bfloat16, nearest even,
    before it is multiplied; sums and the result float32). For int8 see int8_linear.
    """
    precision = check_precision(precision, ("fp32", "bf16"), "matmul (int8 is ops.int8_linear)")
    a = _input(a, "a")
    b = _input(b, "b")
    for name, x in (("a", a), ("b", b)):
        if x.ndim not in (2, 3):
            raise ValueError(f"{name} must be 2-D or 3-D, got shape {x.shape}")
    trans_a, trans_b = _flag(trans_a, "trans_a"), _flag(trans_b, "trans_b")
    accumulate = _flag(accumulate, "accumulate")
    m, k = (a.shape[-1], a.shape[-2]) if trans_a else a.shape[-2:]
    k2, n = (b.shape[-1], b.shape[-2]) if trans_b else b.shape[-2:]
    if k != k2:
        raise ValueError(f"a and b have mismatched inner dimensions: op(a) is {m}x{k}, op(b) is {k2}x{n}")
    batch = None
    if a.ndim == 3 and b.ndim == 3 and a.shape[0] != b.shape[0]:
        raise ValueError(f"a and b must have the same batch size, got {a.shape[0]} and {b.shape[0]}")
    if a.ndim == 3 or b.ndim == 3:
        batch = a.shape[0] if a.ndim == 3 else b.shape[0]
    shape = (m, n) if batch is None else (batch, m, n)

    if out is None:
        if accumulate:
            raise ValueError("accumulate=True needs out (the array to add into)")
        out = np.empty(shape, dtype=np.float32)
    else:
        out = _out(out, "out", shape, (("a", a), ("b", b)))

    a, trans_a = _gemm_operand(a, trans_a)
    b, trans_b = _gemm_operand(b, trans_b)
    if batch is not None:
        if a.ndim == 2:
            a = np.broadcast_to(a, (batch,) + a.shape)
        if b.ndim == 2:
            b = np.broadcast_to(b, (batch,) + b.shape)
    _C.gemm(a, b, out, trans_a, trans_b, 1.0, accumulate, precision == "bf16")
    return out


def softmax(scores, scale=1.0, causal=False, key_padding_mask=None):
    """Softmax over the last axis of scale * scores with optional masks.

    scores: [B, H, Tq, Tk] or [B, Tq, Tk]. causal hides keys k > q.
    key_padding_mask: bool [B, Tk], True = padding (PyTorch's convention).
    Rows whose keys are all masked are zeros, never NaN.
    """
    scores = _input(scores, "scores")
    if scores.ndim not in (3, 4):
        raise ValueError(f"scores must be 3-D [B, Tq, Tk] or 4-D [B, H, Tq, Tk], got shape {scores.shape}")
    scale = _finite_float(scale, "scale")
    causal = _flag(causal, "causal")
    if key_padding_mask is not None:
        key_padding_mask = np.asarray(key_padding_mask)
        if key_padding_mask.dtype != np.bool_:
            raise TypeError(f"key_padding_mask must have dtype bool, got {key_padding_mask.dtype}")
        expected = (scores.shape[0], scores.shape[-1])
        if key_padding_mask.shape != expected:
            raise ValueError(f"key_padding_mask must have shape [B, Tk] = {expected}, got {key_padding_mask.shape}")
        key_padding_mask = np.ascontiguousarray(key_padding_mask)
    scores = np.ascontiguousarray(scores)
    probs = np.empty_like(scores)
    _C.softmax_forward(scores, probs, scale, causal, key_padding_mask, 0)
    return probs


def layer_norm(x, weight, bias, eps=1e-5):
    """nn.LayerNorm over the last axis: (x - mean) / sqrt(var + eps) * weight + bias."""
    x = _input(x, "x")
    weight = _input(weight, "weight")
    bias = _input(bias, "bias")
    if x.ndim < 1:
        raise ValueError("x must have at least one axis")
    d = x.shape[-1]
    for name, p in (("weight", weight), ("bias", bias)):
        if p.shape != (d,):
            raise ValueError(f"{name} must have shape ({d},) to match the last axis of x, got {p.shape}")
    eps = _finite_float(eps, "eps")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    rows = int(np.prod(x.shape[:-1], dtype=np.int64))
    x2 = np.ascontiguousarray(x).reshape(rows, d)
    out = np.empty((rows, d), dtype=np.float32)
    mean = np.empty(rows, dtype=np.float32)
    rstd = np.empty(rows, dtype=np.float32)
    _C.layernorm_forward(x2, np.ascontiguousarray(weight), np.ascontiguousarray(bias), out, mean, rstd, eps)
    return out.reshape(x.shape)


def positional_encoding(max_len, d_model):
    """The sinusoidal table of section 3.5, [max_len, d_model] float32."""
    max_len = _count(max_len, "max_len", minimum=0)
    d_model = _count(d_model, "d_model", minimum=1)
    out = np.empty((max_len, d_model), dtype=np.float32)
    _C.positional_encoding(out)
    return out


def quantize_int8(w):
    """Symmetric int8 weights, one scale per output row: (q int8 [N, K], scale float32 [N]) with
    w ~= q * scale[:, None]. w: a float32 [N, K] Linear weight (y = x @ w.T + b), finite.
    q and scale are what an int8 model saves (a quarter of w's size); see csrc/qgemm.h."""
    w = _input(w, "w")
    if w.ndim != 2:
        raise ValueError(f"w must be 2-D [N, K], got shape {w.shape}")
    return _C.qgemm_quantize(np.ascontiguousarray(w))


def int8_linear(x, q, scale, bias=None):
    """x @ (q * scale[:, None]).T + bias with int8 arithmetic: each row of x quantized on the fly
    (its own scale), int32 sums, float32 result [..., N]. x: float32 [M, K] or [B, T, K]; q, scale
    from quantize_int8; bias: None or float32 [N]. Packs q on every call: for the same weights
    many times, pack once with _C.qgemm_pack and call _C.qgemm_packed."""
    x = _input(x, "x")
    if x.ndim not in (2, 3):
        raise ValueError(f"x must be 2-D [M, K] or 3-D [B, T, K], got shape {x.shape}")
    if not isinstance(q, np.ndarray):
        raise TypeError(f"q must be a numpy.ndarray, got {type(q).__name__}")
    if q.dtype != np.int8:
        raise TypeError(f"q must have dtype int8, got {q.dtype}")
    if q.ndim != 2:
        raise ValueError(f"q must be 2-D [N, K], got shape {q.shape}")
    scale = _input(scale, "scale")
    n, k = q.shape
    if x.shape[-1] != k:
        raise ValueError(f"x must have {k} features in its last axis (q is {q.shape}), got shape {x.shape}")
    if scale.shape != (n,):
        raise ValueError(f"scale must have shape ({n},), got {scale.shape}")
    if bias is not None:
        bias = _input(bias, "bias")
        if bias.shape != (n,):
            raise ValueError(f"bias must have shape ({n},), got {bias.shape}")
        bias = np.ascontiguousarray(bias)
    packed = _C.qgemm_pack(np.ascontiguousarray(q), np.ascontiguousarray(scale))
    rows = x.reshape(-1, k) if x.size else np.zeros((int(np.prod(x.shape[:-1])), k), np.float32)
    out = np.empty((rows.shape[0], n), dtype=np.float32)
    _C.qgemm_packed(np.ascontiguousarray(rows), packed, bias, out)
    return out.reshape(x.shape[:-1] + (n,))


def _count(value, name, minimum):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _finite_float(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value
