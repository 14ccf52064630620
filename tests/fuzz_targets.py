"""Property-based fuzz targets for every public entry point (run by tests/test_fuzz.py).

Not a test module (pytest does not collect it): tests/test_fuzz.py runs each target in its own
interpreter, so a crash (a signal, an abort in C or Rust code) shows up as a failed test instead
of a dead test run:

    python tests/fuzz_targets.py TARGET [--examples N]     # prints {"target", "cases", ...} as JSON

Each target draws inputs that are valid or broken in one way (shapes with 0 and 1, dtypes
float64/float16/int/object/bool/byte-swapped, wrong ranks, non-contiguous, Fortran-ordered,
negative-stride, unaligned, broadcast, read-only and overlapping arrays, NaN/Inf, ids negative, out
of range or longer than max_len, empty batches, damaged files) and checks one rule:

- a valid input gives the right answer: an independent float64 numpy oracle for the kernels
  (error <= REL * the size of the terms, REL stated once below), a self-consistency oracle for the
  model (a batch equals its rows one by one; decoding equals the argmax of forward over its own
  output), a plain re-implementation of the documented rules for the data loaders;
- an invalid input raises ValueError or TypeError whose message names the offending argument.

Non-finite values (NaN/Inf) in valid float inputs follow numpy's propagation: an output is NaN
where numpy's float64 result is NaN, non-finite where numpy's is, and close elsewhere. Documented
differences: softmax rows whose scores are all -inf (or all masked) are zeros, not NaN; the kernels'
domain is float32, so the oracle rounds scale * scores to float32 first.

The hypothesis seed is fixed (derandomize=True); TRANSFORMER_FUZZ_EXAMPLES (or --examples) sets
the number of examples per target.
"""
import argparse
import gzip
import json
import math
import os
import re
import sys
import tempfile
import unicodedata

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import transformer as T
from transformer import data as tdata
from transformer import ops
from transformer.tokenizer import CharTokenizer, SubwordTokenizer, tokenizer_from_json

REL = 1e-5            # kernels: |ours - float64 oracle| <= REL * (size of the terms) + TINY
TINY = 1e-30
MODEL_REL = 1e-4      # model: |batch - rows one by one| <= MODEL_REL * max|value| (GEMM blocking differs)
GRAD_REL = 1e-3       # gradients: relative to the tensor's largest element
MARGIN = 1e-3         # decoding: logits closer than this are a tie (either choice is right)

CASES = {"cases": 0, "valid": 0, "invalid": 0}


class Expect:
    """What a case should do: succeed, or raise one of `errors` naming `name`."""

    def __init__(self, name=None, errors=(ValueError, TypeError)):
        self.name, self.errors = name, errors

    @property
    def valid(self):
        return self.name is None


OK = Expect()


def names(message, name):
    """Whether an error message names the argument `name` (as a word of its own)."""
    return re.search(r"(^|[^A-Za-z0-9_])" + re.escape(name) + r"($|[^A-Za-z0-9_])", message) is not None


def run_case(expect, call, check=None):
    """Call `call()`; a valid case must return (then `check(result)` runs), an invalid one must
    raise ValueError/TypeError naming the argument."""
    CASES["cases"] += 1
    if expect.valid:
        CASES["valid"] += 1
        result = call()
        if check is not None:
            check(result)
        return result
    CASES["invalid"] += 1
    try:
        result = call()
    except expect.errors as exc:
        message = str(exc)
        if len(expect.name) == 1:
            # one-letter names ("a", "b", "x"): the message must start with it, or say "a and b"
            assert (message.startswith(expect.name + " ") or f" {expect.name} " in message
                    and " and " in message), f"error does not name {expect.name!r}: {message!r}"
        else:
            assert names(message, expect.name), f"error does not name {expect.name!r}: {message!r}"
        return None
    raise AssertionError(f"expected {expect.errors} naming {expect.name!r}, got a result "
                         f"{type(result).__name__}")


# --------------------------------------------------------------------------------------------
# arrays: values, dtypes and memory layouts

GOOD_LAYOUTS = ("c", "c", "c", "fortran", "strided", "reversed", "readonly", "unaligned", "broadcast")
BAD_DTYPES = ("float64", "float16", "int32", "int64", "object", "bool", ">f4", "complex64")


def values(rng, shape, special=False):
    """float64 values of a few magnitudes; with `special`, some NaN, +Inf and -Inf."""
    x = np.asarray(rng.standard_normal(shape) * rng.choice([0.01, 1.0, 30.0]))
    if special and x.size:
        flat = x.reshape(-1)
        for value in (np.nan, np.inf, -np.inf):
            if rng.random() < 0.6:
                flat[rng.integers(0, flat.size, size=rng.integers(1, 3))] = value
    return x


def with_dtype(x, dtype):
    x = np.asarray(x)
    if dtype == "object":
        return x.astype(object)
    if dtype == "bool":
        return x > 0
    return x.astype(np.dtype(dtype))


def layout(x, kind, rng):
    """The same kind of array (dtype, shape) in memory laid out as `kind`; values may change (the
    oracles read the array they are given)."""
    if kind == "c":
        return np.array(x, order="C")     # (np.ascontiguousarray would make a 0-d array 1-d)
    if kind == "fortran":
        return np.array(x, order="F")
    if kind == "strided" and x.ndim:
        axis = int(rng.integers(0, x.ndim))
        shape = list(x.shape)
        shape[axis] *= 2
        big = np.zeros(shape, dtype=x.dtype)
        index = [slice(None)] * x.ndim
        index[axis] = slice(None, None, 2)
        big[tuple(index)] = x
        return big[tuple(index)]
    if kind == "reversed" and x.ndim:
        return np.ascontiguousarray(x[::-1])[::-1]
    if kind == "readonly":
        y = np.array(x)
        y.flags.writeable = False
        return y
    if kind == "unaligned" and x.dtype != object and x.dtype.itemsize > 1:
        buf = np.zeros(x.nbytes + x.dtype.itemsize, dtype=np.uint8)
        y = buf[1:1 + x.nbytes].view(x.dtype).reshape(x.shape)
        y[...] = x
        return y
    if kind == "broadcast" and x.ndim and x.shape[0] > 1:
        return np.broadcast_to(x[:1], x.shape)
    return np.array(x, order="C")


def float_array(rng, shape, dtype="float32", kind="c", special=False):
    return layout(with_dtype(values(rng, shape, special), dtype), kind, rng)


def is_f32(x):
    return isinstance(x, np.ndarray) and x.dtype == np.dtype(np.float32)


def out_ok(out, shape):
    """The ops contract for `out`: exactly right, or refused."""
    return (is_f32(out) and out.shape == tuple(shape) and out.flags.c_contiguous
            and out.flags.writeable and out.flags.aligned)


def assert_close(ours, ref, scale, rel=REL, what="result"):
    """ours (float32) against the float64 oracle: the same non-finite pattern (NaN where the oracle
    is NaN), and |ours - ref| <= rel * scale + TINY elsewhere."""
    ours = np.asarray(ours, dtype=np.float64)
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape}, expected {ref.shape}"
    finite = np.isfinite(ref)
    bad = np.isfinite(ours) != finite
    assert not bad.any(), f"{what}: finite where the oracle is not (or the reverse) at {np.argwhere(bad)[:3].tolist()}"
    nan = np.isnan(ref)
    assert np.isnan(ours[nan]).all(), f"{what}: not NaN where the oracle is NaN"
    if finite.any():
        err = np.abs(ours - ref)[finite]
        bound = (rel * np.broadcast_to(scale, ref.shape) + TINY)[finite]
        worst = float(np.max(err / bound))
        assert worst <= 1.0, f"{what}: max |diff| {float(err.max()):.3e} exceeds the tolerance (x{worst:.1f})"


seeds = st.integers(0, 2**32 - 1)
dims = st.sampled_from([0, 1, 1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33])
small_dims = st.sampled_from([0, 1, 1, 2, 3, 5, 8])


ISA_LEVELS = tuple(T._C.isa_levels())
# A build without OpenMP runs on one thread only (docs/platforms.md).
THREAD_COUNTS = [1, 2] if T._C.openmp_version() else [1]


def draw_machine(draw):
    """Each example runs at a drawn thread count (1 or 2; 1 without OpenMP) and SIMD level (clamped to the CPU's)."""
    T.set_num_threads(draw(st.sampled_from(THREAD_COUNTS)))
    T._C.set_isa(draw(st.sampled_from(ISA_LEVELS)))


def chance(draw, p):
    """True with probability about p (sampled_from is close to uniform; floats and integers
    drawn by hypothesis lean towards their bounds)."""
    return draw(st.sampled_from(range(100))) < round(100 * p)


def fault_or_none(draw, faults, p_valid=0.45):
    """None (a valid case) with probability p_valid, else one of `faults`."""
    if chance(draw, p_valid):
        return None
    return draw(st.sampled_from(faults))


# --------------------------------------------------------------------------------------------
# ops.matmul

def matmul_oracle(a, b, trans_a, trans_b, c0=None):
    a64 = np.asarray(a, dtype=np.float64)
    b64 = np.asarray(b, dtype=np.float64)
    if trans_a:
        a64 = np.swapaxes(a64, -1, -2)
    if trans_b:
        b64 = np.swapaxes(b64, -1, -2)
    if a64.ndim == 2 and b64.ndim == 3:
        a64 = np.broadcast_to(a64, (b64.shape[0],) + a64.shape)
    if b64.ndim == 2 and a64.ndim == 3:
        b64 = np.broadcast_to(b64, (a64.shape[0],) + b64.shape)
    with np.errstate(all="ignore"):
        # an explicit sum (not BLAS): IEEE semantics for NaN/Inf in every term
        ref = (a64[..., :, :, None] * b64[..., None, :, :]).sum(axis=-2)
        scale = (np.abs(a64)[..., :, :, None] * np.abs(b64)[..., None, :, :]).sum(axis=-2)
        if c0 is not None:
            ref = ref + c0
            scale = scale + np.abs(c0)
    return ref, np.where(np.isfinite(scale), scale, 0.0)


@given(st.data())
def prop_matmul(data):
    draw = data.draw
    draw_machine(draw)
    rng = np.random.default_rng(draw(seeds))
    m, k, n = draw(dims), draw(dims), draw(dims)
    batch = draw(small_dims)
    ranks = draw(st.sampled_from([(2, 2), (3, 3), (2, 3), (3, 2)]))
    trans_a, trans_b = draw(st.booleans()), draw(st.booleans())
    special = chance(draw, 0.15)
    fault = fault_or_none(draw, ["dtype_a", "dtype_b", "rank_a", "rank_b", "inner", "batch",
                                 "out_dtype", "out_shape", "out_layout", "out_overlap",
                                 "acc_no_out", "flag", "list_a"])
    a_mat = (k, m) if trans_a else (m, k)
    b_mat = (n, k) if trans_b else (k, n)
    a_shape = ((batch,) if ranks[0] == 3 else ()) + a_mat
    b_shape = ((batch,) if ranks[1] == 3 else ()) + b_mat
    expect = OK
    a_dtype = b_dtype = "float32"
    if fault == "dtype_a":
        a_dtype, expect = draw(st.sampled_from(BAD_DTYPES)), Expect("a", (TypeError,))
    elif fault == "dtype_b":
        b_dtype, expect = draw(st.sampled_from(BAD_DTYPES)), Expect("b", (TypeError,))
    elif fault == "rank_a":
        a_shape, expect = draw(st.sampled_from([(), (3,), (1, 2, 3, 4)])), Expect("a")
    elif fault == "rank_b":
        b_shape, expect = draw(st.sampled_from([(), (3,), (1, 2, 3, 4)])), Expect("b")
    elif fault == "inner":
        bad = (k + 1, n) if not trans_b else (n, k + 1)
        b_shape, expect = b_shape[:-2] + bad, Expect("b")
    elif fault == "batch" and ranks == (3, 3):
        b_shape, expect = (batch + 1,) + b_shape[1:], Expect("b")
    a = float_array(rng, a_shape, a_dtype, draw(st.sampled_from(GOOD_LAYOUTS)), special)
    b = float_array(rng, b_shape, b_dtype, draw(st.sampled_from(GOOD_LAYOUTS)), special)
    if fault == "list_a":
        a = a.tolist()   # nested lists of Python floats: float64, refused
        expect = Expect("a", (TypeError,))
    kwargs = {"trans_a": trans_a, "trans_b": trans_b}
    if fault == "flag":
        flag = draw(st.sampled_from(["trans_a", "trans_b", "accumulate"]))
        kwargs[flag], expect = draw(st.sampled_from(["yes", None, 2, [1]])), Expect(flag, (TypeError,))
    out_shape = ((batch,) if 3 in ranks else ()) + (m, n)
    use_out = fault is not None and fault.startswith("out") or draw(st.booleans())
    accumulate = use_out and draw(st.booleans())
    c0 = None
    if fault == "acc_no_out":
        kwargs["accumulate"], expect = True, Expect("out")
    elif use_out and "out" not in kwargs:
        out = float_array(rng, out_shape)
        if fault == "out_dtype":
            out = float_array(rng, out_shape, draw(st.sampled_from(BAD_DTYPES)))
        elif fault == "out_shape":
            out = float_array(rng, draw(st.sampled_from([out_shape + (1,), out_shape[:-1] + (n + 1,), ()])))
        elif fault == "out_layout":
            out = float_array(rng, out_shape, "float32", draw(st.sampled_from(
                ["fortran", "strided", "reversed", "readonly", "broadcast", "unaligned"])))
        elif fault == "out_overlap" and expect.valid and isinstance(a, np.ndarray):
            size = int(np.prod(out_shape))
            if a.size and size and is_f32(a) and a.flags.c_contiguous and a.flags.writeable:
                base = a.reshape(-1)
                if base.size >= size:
                    out = base[:size].reshape(out_shape)
        if expect.valid and not out_ok(out, out_shape):
            expect = Expect("out")
        elif expect.valid and any(isinstance(x, np.ndarray) and np.shares_memory(out, x) for x in (a, b)):
            expect = Expect("out")
        kwargs["out"] = out
        if accumulate and "accumulate" not in kwargs:
            kwargs["accumulate"] = True
            c0 = np.array(out, dtype=np.float64) if is_f32(out) else None

    def check(result):
        assert result.dtype == np.float32 and result.shape == out_shape
        if "out" in kwargs:
            assert result is kwargs["out"]
        ref, scale = matmul_oracle(a, b, trans_a, trans_b, c0)
        assert_close(result, ref, scale, what="matmul")

    run_case(expect, lambda: ops.matmul(a, b, **kwargs), check)


# --------------------------------------------------------------------------------------------
# ops.softmax

def softmax_oracle(scores, scale, causal, mask):
    z = (np.float32(scale) * np.asarray(scores, dtype=np.float32)).astype(np.float64)
    hidden = np.zeros(z.shape, dtype=bool)
    Tq, Tk = z.shape[-2:]
    if causal:
        hidden |= np.arange(Tk)[None, :] > np.arange(Tq)[:, None]
    if mask is not None:
        m = np.asarray(mask, dtype=bool)
        hidden |= (m[:, None, None, :] if z.ndim == 4 else m[:, None, :])
    z = np.where(hidden, -np.inf, z)
    with np.errstate(all="ignore"):
        top = z.max(axis=-1, keepdims=True) if Tk else z
        e = np.exp(z - top)
        ref = e / e.sum(axis=-1, keepdims=True)
    # documented: a row with nothing to attend to (all masked or all -inf) is zeros, not NaN
    empty = np.all(z == -np.inf, axis=-1, keepdims=True)
    ref = np.where(empty, 0.0, ref)
    # a row with a NaN among its visible scores is NaN everywhere, hidden keys included, at every
    # SIMD level (numpy's answer)
    return ref


@given(st.data())
def prop_softmax(data):
    draw = data.draw
    draw_machine(draw)
    rng = np.random.default_rng(draw(seeds))
    B, H, Tq, Tk = draw(small_dims), draw(small_dims), draw(dims), draw(dims)
    four = draw(st.booleans())
    shape = (B, H, Tq, Tk) if four else (B, Tq, Tk)
    scale = draw(st.sampled_from([1.0, 0.125, 3.0, 0.0, -1.0, 2, np.float32(0.5)]))
    causal = draw(st.booleans())
    special = chance(draw, 0.2)
    use_mask = draw(st.booleans())
    fault = fault_or_none(draw, ["dtype", "rank", "mask_dtype", "mask_shape", "scale_type",
                                 "scale_inf", "flag", "list_mask_bad"])
    expect, dtype = OK, "float32"
    if fault == "dtype":
        dtype, expect = draw(st.sampled_from(BAD_DTYPES)), Expect("scores", (TypeError,))
    elif fault == "rank":
        shape, expect = draw(st.sampled_from([(), (4,), (2, 3), (1, 1, 1, 2, 2)])), Expect("scores")
    scores = float_array(rng, shape, dtype, draw(st.sampled_from(GOOD_LAYOUTS)), special)
    mask = None
    if use_mask or fault in ("mask_dtype", "mask_shape", "list_mask_bad"):
        mask = rng.random((B, Tk)) < 0.3
        if Tk and B and draw(st.booleans()):
            mask[0, :] = True      # a fully masked batch row
        mask = layout(mask, draw(st.sampled_from(["c", "fortran", "strided", "readonly"])), rng)
        if B and Tk and draw(st.booleans()):
            mask = mask.tolist()   # nested lists of bools are converted
        if fault == "mask_dtype":
            mask, expect = np.asarray(mask).astype(draw(st.sampled_from(["uint8", "int64", "float32", "object"]))), \
                Expect("key_padding_mask", (TypeError,))
        elif fault == "mask_shape" and expect.valid:
            mask, expect = np.zeros((B, Tk + 1), bool), Expect("key_padding_mask")
        elif fault == "list_mask_bad":
            mask, expect = [[True, None]], Expect("key_padding_mask")
    kwargs = {"scale": scale, "causal": causal, "key_padding_mask": mask}
    if fault == "scale_type":
        kwargs["scale"], expect = draw(st.sampled_from(["1", None, True, [1.0]])), Expect("scale", (TypeError,))
    elif fault == "scale_inf":
        kwargs["scale"], expect = draw(st.sampled_from([math.inf, -math.inf, math.nan, 1e39])), Expect("scale")
    elif fault == "flag":
        kwargs["causal"], expect = draw(st.sampled_from(["yes", None, 2])), Expect("causal", (TypeError,))

    def check(probs):
        assert probs.dtype == np.float32 and probs.shape == shape and probs.flags.c_contiguous
        ref = softmax_oracle(scores, scale, causal, mask)
        assert_close(probs, ref, 1.0, what="softmax")

    run_case(expect, lambda: ops.softmax(scores, **kwargs), check)


# --------------------------------------------------------------------------------------------
# ops.layer_norm

def layer_norm_oracle(x, weight, bias, eps):
    x64 = np.asarray(x, dtype=np.float64)
    w64, b64 = np.asarray(weight, np.float64), np.asarray(bias, np.float64)
    with np.errstate(all="ignore"):
        mean = x64.mean(axis=-1, keepdims=True)
        var = ((x64 - mean) ** 2).mean(axis=-1, keepdims=True)
        rstd = 1.0 / np.sqrt(var + np.float32(eps))
        ref = (x64 - mean) * rstd * w64 + b64
        # error terms: the float32 mean (and variance) carry ~eps32 * max|x| of rounding
        span = np.abs(x64).max(axis=-1, keepdims=True) if x64.size else np.zeros(x64.shape[:-1] + (1,))
        scale = 8 * x64.shape[-1] * (span * rstd + 1.0) * np.abs(w64) + np.abs(b64)
    # eps = 0 and a constant row: 0/0, unspecified (NaN or a number); no comparison there
    undefined = np.broadcast_to((var + np.float32(eps)) == 0, ref.shape)
    return ref, np.where(np.isfinite(scale), scale, 0.0), undefined


@given(st.data())
def prop_layer_norm(data):
    draw = data.draw
    draw_machine(draw)
    rng = np.random.default_rng(draw(seeds))
    lead = tuple(draw(st.lists(small_dims, min_size=0, max_size=2)))
    D = draw(st.sampled_from([1, 2, 3, 4, 7, 8, 15, 16, 17, 33, 64, 65]))
    eps = draw(st.sampled_from([1e-5, 1e-5, 0.0, 1e-12, 0.5, 1, np.float64(1e-6)]))
    special = chance(draw, 0.15)
    fault = fault_or_none(draw, ["dtype_x", "dtype_w", "dtype_b", "shape_w", "shape_b", "rank",
                                 "empty_axis", "eps_neg", "eps_type", "eps_inf"])
    expect = OK
    dt = {"x": "float32", "weight": "float32", "bias": "float32"}
    if fault in ("dtype_x", "dtype_w", "dtype_b"):
        which = {"dtype_x": "x", "dtype_w": "weight", "dtype_b": "bias"}[fault]
        dt[which], expect = draw(st.sampled_from(BAD_DTYPES)), Expect(which, (TypeError,))
    x_shape = lead + (D,)
    w_shape = b_shape = (D,)
    if fault == "shape_w":
        w_shape, expect = draw(st.sampled_from([(D + 1,), (1, D), ()])), Expect("weight")
    elif fault == "shape_b":
        b_shape, expect = draw(st.sampled_from([(D + 1,), (1, D), ()])), Expect("bias")
    elif fault == "rank":
        x_shape, w_shape, b_shape, expect = (), (1,), (1,), Expect("x")
    elif fault == "empty_axis":
        x_shape, w_shape, b_shape, expect = lead + (0,), (0,), (0,), Expect("x")
    x = float_array(rng, x_shape, dt["x"], draw(st.sampled_from(GOOD_LAYOUTS)), special)
    weight = float_array(rng, w_shape, dt["weight"], draw(st.sampled_from(GOOD_LAYOUTS)))
    bias = float_array(rng, b_shape, dt["bias"], draw(st.sampled_from(GOOD_LAYOUTS)))
    if fault == "eps_neg":
        eps, expect = -1e-5, Expect("eps")
    elif fault == "eps_type":
        eps, expect = draw(st.sampled_from(["1e-5", None, True])), Expect("eps", (TypeError,))
    elif fault == "eps_inf":
        eps, expect = draw(st.sampled_from([math.inf, math.nan, 1e300])), Expect("eps")

    def check(out):
        assert out.dtype == np.float32 and out.shape == x_shape
        ref, scale, undefined = layer_norm_oracle(x, weight, bias, eps)
        ref = np.where(undefined, np.asarray(out, np.float64), ref)
        assert_close(out, ref, scale, what="layer_norm")

    run_case(expect, lambda: ops.layer_norm(x, weight, bias, eps=eps), check)


# --------------------------------------------------------------------------------------------
# ops.positional_encoding

@given(st.data())
def prop_positional_encoding(data):
    draw = data.draw
    max_len = draw(st.sampled_from([0, 1, 2, 3, 17, 100, 513]))
    d_model = draw(st.sampled_from([1, 2, 3, 4, 7, 8, 31, 64, 65]))
    fault = fault_or_none(draw, ["len_neg", "dm_zero", "len_type", "dm_type"])
    expect = OK
    if fault == "len_neg":
        max_len, expect = -1, Expect("max_len")
    elif fault == "dm_zero":
        d_model, expect = draw(st.sampled_from([0, -3])), Expect("d_model")
    elif fault == "len_type":
        max_len, expect = draw(st.sampled_from([2.0, "3", None, True])), Expect("max_len", (TypeError,))
    elif fault == "dm_type":
        d_model, expect = draw(st.sampled_from([8.0, "8", None, np.float32(4)])), Expect("d_model", (TypeError,))
    if draw(st.booleans()) and isinstance(max_len, int) and not isinstance(max_len, bool):
        max_len = np.int64(max_len)

    def check(pe):
        assert pe.dtype == np.float32 and pe.shape == (max_len, d_model)
        pos = np.arange(int(max_len), dtype=np.float64)[:, None]
        i = np.arange(d_model)
        angle = pos / np.power(10000.0, (2 * (i // 2)) / d_model)
        ref = np.where(i % 2 == 0, np.sin(angle), np.cos(angle))
        assert_close(pe, ref, 1.0, what="positional_encoding")

    run_case(expect, lambda: ops.positional_encoding(max_len, d_model), check)


# --------------------------------------------------------------------------------------------
# the model, on very small configurations

_MODELS = {}


def tiny_model(norm_first=False, activation="relu", dropout=0.0):
    key = (norm_first, activation, dropout)
    if key not in _MODELS:
        cfg = T.ModelConfig(src_vocab_size=9, tgt_vocab_size=7, d_model=8, n_heads=2, d_ff=16,
                            n_encoder_layers=1, n_decoder_layers=2, dropout=dropout,
                            activation=activation, norm_first=norm_first, max_len=7)
        _MODELS[key] = T.Seq2SeqTransformer(cfg, seed=len(_MODELS))
        # larger weights than the initialisation: decisive logits, few near-ties in decoding
        params = _MODELS[key].params.flat
        params *= 3.0
    return _MODELS[key]


def draw_model(draw):
    return tiny_model(draw(st.booleans()), draw(st.sampled_from(["relu", "gelu"])))


def draw_model_problem(draw, max_batch):
    """A model property's start: the machine, a seeded rng, a model, and a padded source batch
    [B, S] with a target length Tt. Returns (rng, model, B, S, Tt, src)."""
    draw_machine(draw)
    rng = np.random.default_rng(draw(seeds))
    model = draw_model(draw)
    cfg = model.cfg
    B = draw(st.integers(1, max_batch))
    S, Tt = draw(st.integers(1, cfg.max_len)), draw(st.integers(1, cfg.max_len))
    return rng, model, B, S, Tt, ids(rng, B, S, cfg.src_vocab_size, cfg.pad_id)


def ids(rng, B, L, vocab, pad, pad_tail=True):
    """Random ids [B, L] in [0, vocab) with trailing padding on some rows (at least one real id)."""
    x = rng.integers(0, vocab, size=(B, L))
    x[x == pad] = (pad + 1) % vocab
    if pad_tail and L > 1:
        for row in range(B):
            if rng.random() < 0.5:
                x[row, rng.integers(1, L):] = pad
    return x


ID_FAULTS = ["negative", "too_big", "too_long", "dtype", "rank", "empty_rows", "empty_cols", "list_ragged"]


def break_ids(draw, rng, x, name, vocab, max_len):
    """x broken in one way (returns (x, Expect)), or laid out differently but still valid."""
    fault = fault_or_none(draw, ID_FAULTS, p_valid=0.75)
    B, L = x.shape
    if fault == "negative":
        x = x.copy()
        x[rng.integers(0, B), rng.integers(0, L)] = -draw(st.sampled_from([1, 2, 2**40]))
        return x, Expect(name)
    if fault == "too_big":
        x = x.copy()
        x[rng.integers(0, B), rng.integers(0, L)] = vocab + draw(st.sampled_from([0, 1, 2**40]))
        return x, Expect(name)
    if fault == "too_long":
        return np.ones((B, max_len + draw(st.sampled_from([1, 5]))), np.int64), Expect(name)
    if fault == "dtype":
        kind = draw(st.sampled_from(["float32", "float64", "object", "bool", "str"]))
        bad = x.astype(kind) if kind != "str" else x.astype(str)
        return bad, Expect(name, (TypeError,))
    if fault == "rank":
        return draw(st.sampled_from([x[0], x[None], np.int64(3)])), Expect(name)
    if fault == "empty_rows":
        return x[:0], Expect(name)
    if fault == "empty_cols":
        return x[:, :0], Expect(name)
    if fault == "list_ragged":
        return [[1, 2], [1]], Expect(name)
    # valid, in another form: dtype int32/uint8/uint64, a list, Fortran, strided, read-only
    form = draw(st.sampled_from(["int64", "int32", "uint8", "uint64", "list", "fortran", "strided",
                                 "readonly", "reversed", "unaligned", "broadcast"]))
    if form in ("int32", "uint8", "uint64"):
        return x.astype(form), OK
    if form == "list":
        return x.tolist(), OK
    return layout(x, form, rng), OK


def canonical(x):
    """Valid ids in any form, as the int64 C-contiguous array the oracle uses."""
    return np.array(x, dtype=np.int64)


def rows_one_by_one(fn, *arrays):
    return np.concatenate([fn(*(a[i:i + 1] for a in arrays)) for i in range(arrays[0].shape[0])])


def close_to(ours, ref, rel, what):
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} != {ref.shape}"
    limit = rel * max(1.0, float(np.abs(ref).max(initial=0.0)))
    diff = float(np.abs(ours - ref).max(initial=0.0))
    assert diff <= limit, f"{what}: max |diff| {diff:.3e} > {limit:.3e}"


@given(st.data())
def prop_model_forward(data):
    draw = data.draw
    rng, model, B, S, Tt, src = draw_model_problem(draw, 4)
    cfg = model.cfg
    tgt = ids(rng, B, Tt, cfg.tgt_vocab_size, cfg.pad_id)
    src_in, expect = break_ids(draw, rng, src, "src", cfg.src_vocab_size, cfg.max_len)
    tgt_in = tgt
    if expect.valid:
        tgt_in, expect = break_ids(draw, rng, tgt, "tgt_in", cfg.tgt_vocab_size, cfg.max_len)
    if expect.valid:
        src, tgt = canonical(src_in), canonical(tgt_in)
    if expect.valid and B > 1 and chance(draw, 0.1):
        tgt_in, expect = tgt[:1], Expect("tgt_in")     # batch sizes differ
    return_attention = draw(st.booleans())
    if expect.valid and chance(draw, 0.08):
        return_attention, expect = draw(st.sampled_from(["yes", 1, None])), Expect("return_attention", (TypeError,))

    def check(result):
        logits, attention = result if return_attention else (result, None)
        assert logits.dtype == np.float32 and logits.shape == (B, Tt, cfg.tgt_vocab_size)
        # the oracle: the same ids as C-contiguous int64, and the batch one row at a time
        plain = model.forward(src, tgt)
        assert np.array_equal(plain, logits), "another layout or dtype of the same ids changed the logits"
        close_to(logits, rows_one_by_one(model.forward, src, tgt), MODEL_REL, "forward (batch vs rows)")
        if attention is not None:
            check_attention(attention, src, tgt, cfg)

    run_case(expect, lambda: model.forward(src_in, tgt_in, return_attention=return_attention), check)


def check_attention(attention, src, tgt, cfg):
    B, S = src.shape
    Tt = tgt.shape[1]
    src_pad, tgt_pad = src == cfg.pad_id, tgt == cfg.pad_id
    parts = {"encoder": ((B, cfg.n_heads, S, S), src_pad, False),
             "decoder_self": ((B, cfg.n_heads, Tt, Tt), tgt_pad, True),
             "cross": ((B, cfg.n_heads, Tt, S), src_pad, False)}
    for name, (shape, key_pad, causal) in parts.items():
        layers = attention[name]
        assert len(layers) == (cfg.n_encoder_layers if name == "encoder" else cfg.n_decoder_layers)
        for probs in layers:
            assert probs.shape == shape and probs.dtype == np.float32, name
            hidden = np.broadcast_to(key_pad[:, None, None, :], shape).copy()
            if causal:
                hidden |= np.triu(np.ones(shape[-2:], bool), 1)
            assert np.all(probs[hidden] == 0), f"{name}: a masked key has weight"
            sums = probs.sum(-1)
            nothing = hidden.all(-1)
            assert np.allclose(sums[~nothing], 1, atol=1e-5), f"{name}: rows do not sum to 1"
            assert np.all(sums[nothing] == 0), f"{name}: fully masked rows are not zeros"


def loss_oracle(logits, tgt_out, pad, smoothing):
    z = logits.astype(np.float64).reshape(-1, logits.shape[-1])
    y = tgt_out.reshape(-1)
    keep = y != pad
    if not keep.any():
        return 0.0      # documented: no target tokens -> loss 0 and no gradient (PyTorch: NaN)
    z = z[keep]
    logp = z - z.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    nll = -logp[np.arange(len(z)), y[keep]]
    return float(((1 - smoothing) * nll - smoothing * logp.mean(1)).mean())


@given(st.data())
def prop_model_training(data):
    """forward_backward and loss_and_grads: the loss from forward's logits, and the gradient of the
    batch equals the mean of its target tokens' gradients, each computed alone."""
    draw = data.draw
    rng, model, B, S, Tt, src = draw_model_problem(draw, 3)
    cfg = model.cfg
    tgt_in = ids(rng, B, Tt, cfg.tgt_vocab_size, cfg.pad_id)
    tgt_out = ids(rng, B, Tt, cfg.tgt_vocab_size, cfg.pad_id)
    if chance(draw, 0.1):
        tgt_out[:] = cfg.pad_id                      # nothing to predict
    smoothing = draw(st.sampled_from([0.0, 0.1, 1.0, 0, np.float64(0.3), np.float32(0.2)]))
    args = {"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out}
    fault = fault_or_none(draw, ["ids", "shape", "smoothing_range", "smoothing_type"], p_valid=0.5)
    expect = OK
    if fault == "ids":
        name = draw(st.sampled_from(["src", "tgt_in", "tgt_out"]))
        vocab = cfg.src_vocab_size if name == "src" else cfg.tgt_vocab_size
        args[name], expect = break_ids(draw, rng, args[name], name, vocab, cfg.max_len)
    elif fault == "shape":
        args["tgt_out"], expect = np.ones((B, Tt + 1) if Tt < cfg.max_len else (B, Tt - 1), np.int64), Expect("tgt_out")
        if Tt == 1:
            args["tgt_out"] = np.ones((B + 1, 1), np.int64)
    elif fault == "smoothing_range":
        smoothing, expect = draw(st.sampled_from([-0.1, 1.5, math.nan, math.inf])), Expect("label_smoothing")
    elif fault == "smoothing_type":
        smoothing, expect = draw(st.sampled_from(["0.1", None, True, [0.1]])), Expect("label_smoothing", (TypeError,))
    use_pair = draw(st.booleans())
    if expect.valid:
        src, tgt_in, tgt_out = (canonical(args[k]) for k in ("src", "tgt_in", "tgt_out"))

    def call():
        if use_pair:
            return model.loss_and_grads(args["src"], args["tgt_in"], args["tgt_out"], smoothing)
        model.zero_grad()
        return model.forward_backward(args["src"], args["tgt_in"], args["tgt_out"], label_smoothing=smoothing), None

    def check(result):
        loss, grads = result
        if grads is None:
            grads = {k: v.copy() for k, v in model.grads().items()}
        ref = loss_oracle(model.forward(src, tgt_in), tgt_out, cfg.pad_id, float(smoothing))
        assert math.isfinite(loss) and abs(loss - ref) <= MODEL_REL * max(1.0, abs(ref)), (loss, ref)
        counts = (tgt_out != cfg.pad_id).sum(1)
        if counts.sum() > 1:
            # the oracle: the gradient of the mean loss is the mean of every target token's own
            # gradient (that token alone in tgt_out, the rest padding), one sentence at a time
            total = {k: np.zeros(v.shape) for k, v in grads.items()}
            terms = {k: np.zeros(v.shape) for k, v in grads.items()}   # sum of |token terms|
            for i, j in zip(*np.nonzero(tgt_out != cfg.pad_id)):
                alone = np.full((1, Tt), cfg.pad_id, np.int64)
                alone[0, j] = tgt_out[i, j]
                _, g = model.loss_and_grads(src[i:i + 1], tgt_in[i:i + 1], alone, smoothing)
                for k in total:
                    total[k] += g[k] / counts.sum()
                    terms[k] += np.abs(g[k]) / counts.sum()
            # relative to the size of the terms (token gradients may cancel), with a floor at
            # 1e-3 of the largest of any tensor (an almost-zero gradient is rounding noise)
            floor = 1e-3 * max(float(t.max()) for t in terms.values())
            for k, g in grads.items():
                limit = GRAD_REL * max(float(terms[k].max()), floor, 1e-6)
                diff = float(np.abs(g - total[k]).max())
                assert diff <= limit, f"gradient {k}: batch != tokens, max |diff| {diff:.3e} > {limit:.3e}; " \
                    f"counts {counts.tolist()} smoothing {smoothing} src {src.tolist()} tgt_in {tgt_in.tolist()} tgt_out {tgt_out.tolist()}"
        if not counts.sum():
            assert loss == 0.0 and all(not g.any() for g in grads.values())

    run_case(expect, call, check)


@given(st.data())
def prop_model_encode(data):
    draw = data.draw
    rng, model, B, S, _, src = draw_model_problem(draw, 4)
    cfg = model.cfg
    src_in, expect = break_ids(draw, rng, src, "src", cfg.src_vocab_size, cfg.max_len)
    if expect.valid:
        src = canonical(src_in)

    def check(memory):
        assert memory.shape == (B, S, cfg.d_model) and memory.dtype == np.float32
        close_to(memory, rows_one_by_one(model.encode, src), MODEL_REL, "encode (batch vs rows)")

    run_case(expect, lambda: model.encode(src_in), check)


def decode_limits(model, src, max_len):
    """Each sentence's length limit: min(max_len, cfg.max_len), or with max_len None
    min(2 * its non-pad source tokens + 10, cfg.max_len)."""
    cfg = model.cfg
    if max_len is None:
        return [min(2 * int((row != cfg.pad_id).sum()) + 10, cfg.max_len) for row in src]
    return [min(int(max_len), cfg.max_len)] * src.shape[0]


def ngram_banned(hyp, n):
    """The tokens no_repeat_ngram=n forbids after hyp: the one after every earlier occurrence of
    hyp's last n-1 tokens."""
    if n == 0:
        return set()
    tail = hyp[len(hyp) - n + 1:] if n > 1 else []
    return {hyp[j + n - 1] for j in range(len(hyp) - n + 1) if hyp[j:j + n - 1] == tail}


def check_decoded(model, src, hyps, max_len, min_len, greedy, no_repeat_ngram=0):
    """Every hypothesis is the argmax of forward over its own prefix (up to ties) when `greedy`;
    always: ids in range, no EOS inside, length <= its sentence's limit (decode_limits), and
    >= min_len unless that limit is shorter or (with no_repeat_ngram) every word was banned;
    with no_repeat_ngram=n, no n-gram twice."""
    cfg = model.cfg
    words = set(range(cfg.tgt_vocab_size)) - {cfg.pad_id, cfg.bos_id, cfg.eos_id}
    assert len(hyps) == src.shape[0]
    for row, (hyp, limit) in enumerate(zip(hyps, decode_limits(model, src, max_len))):
        assert all(isinstance(t, int) and 0 <= t < cfg.tgt_vocab_size for t in hyp), hyp
        stuck = no_repeat_ngram > 0 and words <= ngram_banned(hyp, no_repeat_ngram)
        assert cfg.eos_id not in hyp and len(hyp) <= limit, (hyp, limit)
        assert min(min_len, limit) <= len(hyp) or stuck, (hyp, min_len, limit)
        if no_repeat_ngram:
            grams = [tuple(hyp[i:i + no_repeat_ngram]) for i in range(len(hyp) - no_repeat_ngram + 1)]
            assert len(grams) == len(set(grams)), (hyp, no_repeat_ngram)
        if not greedy:
            continue
        tgt_in = np.array([[cfg.bos_id] + hyp], np.int64)[:, :cfg.max_len]
        logits = model.forward(src[row:row + 1], tgt_in)[0].astype(np.float64)
        assert cfg.pad_id not in hyp and cfg.bos_id not in hyp, hyp
        steps = tgt_in.shape[1]
        for t in range(steps):
            want = hyp[t] if t < len(hyp) else cfg.eos_id
            if t >= len(hyp) and len(hyp) == limit:
                break
            scores = logits[t].copy()
            scores[cfg.pad_id] = scores[cfg.bos_id] = -np.inf     # decoding never emits them
            for token in ngram_banned(hyp[:t], no_repeat_ngram) - {cfg.eos_id}:
                scores[token] = -np.inf
            if t < min_len and (no_repeat_ngram == 0 or np.delete(scores, cfg.eos_id).max() > -np.inf):
                scores[cfg.eos_id] = -np.inf                       # EOS stays when nothing else does
            assert scores[want] >= scores.max() - MARGIN, \
                f"row {row} step {t}: decoded {want} but forward prefers {int(scores.argmax())} by " \
                f"{scores.max() - scores[want]:.3e}"


DECODE_FAULTS = ["src", "max_len_zero", "max_len_type", "min_len_big", "min_len_neg", "min_len_type",
                 "ngram_neg", "ngram_type"]


def decode_args(draw, rng, model):
    cfg = model.cfg
    B, S = draw(st.integers(1, 4)), draw(st.integers(1, cfg.max_len))
    src = ids(rng, B, S, cfg.src_vocab_size, cfg.pad_id)
    if chance(draw, 0.1):
        src[0] = cfg.pad_id                         # a sentence that is all padding
    max_len = draw(st.sampled_from([1, 2, 3, 6, cfg.max_len, cfg.max_len + 5, np.int64(4), None]))
    ceiling = cfg.max_len if max_len is None else min(int(max_len), cfg.max_len)   # min_len's bound
    min_len = draw(st.sampled_from([0, 0, 0, 1, 2]))
    min_len = min(min_len, ceiling)
    kwargs = {"max_len": max_len, "min_len": min_len}
    if chance(draw, 0.4):
        kwargs["no_repeat_ngram"] = draw(st.sampled_from([0, 1, 2, 3, np.int64(2)]))
    fault = fault_or_none(draw, DECODE_FAULTS, p_valid=0.6)
    src_in, expect = src, OK
    if fault == "src":
        src_in, expect = break_ids(draw, rng, src, "src", cfg.src_vocab_size, cfg.max_len)
        if expect.valid:
            src = canonical(src_in)
    elif fault == "max_len_zero":
        kwargs["max_len"], expect = draw(st.sampled_from([0, -1])), Expect("max_len")
    elif fault == "max_len_type":
        kwargs["max_len"], expect = draw(st.sampled_from([3.0, "3", True])), Expect("max_len", (TypeError,))
    elif fault == "min_len_big":
        kwargs["min_len"], expect = ceiling + 1, Expect("min_len")
    elif fault == "min_len_neg":
        kwargs["min_len"], expect = -1, Expect("min_len")
    elif fault == "min_len_type":
        kwargs["min_len"], expect = draw(st.sampled_from([1.0, "1", None, False])), Expect("min_len", (TypeError,))
    elif fault == "ngram_neg":
        kwargs["no_repeat_ngram"], expect = draw(st.sampled_from([-1, -3])), Expect("no_repeat_ngram")
    elif fault == "ngram_type":
        kwargs["no_repeat_ngram"], expect = draw(st.sampled_from([1.5, "2", None, True])), \
            Expect("no_repeat_ngram", (TypeError,))
    return src, src_in, kwargs, expect


@given(st.data())
def prop_greedy_decode(data):
    draw = data.draw
    draw_machine(draw)
    rng = np.random.default_rng(draw(seeds))
    model = draw_model(draw)
    src, src_in, kwargs, expect = decode_args(draw, rng, model)
    attention = draw(st.booleans())
    if expect.valid and chance(draw, 0.08):
        kwargs["return_attention"], expect = draw(st.sampled_from(["yes", None, 1])), Expect("return_attention", (TypeError,))
    elif attention:
        kwargs["return_attention"] = True

    def check(result):
        hyps, probs = result if attention else (result, None)
        ngram = int(kwargs.get("no_repeat_ngram", 0))
        check_decoded(model, src, hyps, kwargs["max_len"], kwargs["min_len"], greedy=True, no_repeat_ngram=ngram)
        if probs is not None:
            S = src.shape[1]
            for hyp, p, row in zip(hyps, probs, src):
                assert p.shape[1:] == (model.cfg.n_heads, S) and p.shape[0] in (len(hyp), len(hyp) + 1)
                assert np.all(p[..., row == model.cfg.pad_id] == 0)
        # beam search with one beam is greedy decoding
        beam = model.beam_search(src, beam_size=1, max_len=kwargs["max_len"], min_len=kwargs["min_len"],
                                 no_repeat_ngram=ngram)
        check_decoded(model, src, beam, kwargs["max_len"], kwargs["min_len"], greedy=True, no_repeat_ngram=ngram)

    run_case(expect, lambda: model.greedy_decode(src_in, **kwargs), check)


@given(st.data())
def prop_beam_search(data):
    draw = data.draw
    draw_machine(draw)
    rng = np.random.default_rng(draw(seeds))
    model = draw_model(draw)
    src, src_in, kwargs, expect = decode_args(draw, rng, model)
    kwargs["beam_size"] = draw(st.sampled_from([1, 2, 3, 5, 8, 20, np.int64(2)]))
    kwargs["length_penalty"] = draw(st.sampled_from([0.6, 0.0, 1.0, 2, np.float64(0.6), np.float32(0.6)]))
    if expect.valid:
        fault = fault_or_none(draw, ["beam_zero", "beam_type", "lp_neg", "lp_type"], p_valid=0.7)
        if fault == "beam_zero":
            kwargs["beam_size"], expect = draw(st.sampled_from([0, -2])), Expect("beam_size")
        elif fault == "beam_type":
            kwargs["beam_size"], expect = draw(st.sampled_from([2.0, "2", None, True])), Expect("beam_size")
        elif fault == "lp_neg":
            kwargs["length_penalty"], expect = draw(st.sampled_from([-0.5, math.nan, math.inf])), Expect("length_penalty")
        elif fault == "lp_type":
            kwargs["length_penalty"], expect = draw(st.sampled_from(["0.6", None, True])), Expect("length_penalty")

    def check(hyps):
        check_decoded(model, src, hyps, kwargs["max_len"], kwargs["min_len"],
                      greedy=int(kwargs["beam_size"]) == 1, no_repeat_ngram=int(kwargs.get("no_repeat_ngram", 0)))

    run_case(expect, lambda: model.beam_search(src_in, **kwargs), check)


@given(st.data())
def prop_state_dict(data):
    """state_dict / load_state_dict / save / load / check_ids: round trips are exact; a bad state
    dict is refused with the weights left as they were."""
    draw = data.draw
    rng = np.random.default_rng(draw(seeds))
    model = T.Seq2SeqTransformer(tiny_model().cfg, seed=draw(st.integers(0, 3)))
    before = model.state_dict()
    sd = {k: (v + rng.standard_normal(v.shape).astype(np.float32)) for k, v in before.items()}
    names_ = sorted(sd)
    fault = fault_or_none(draw, ["missing", "extra", "shape", "dtype", "not_array", "not_dict",
                                 "key_type", "overflow", "poison"], p_valid=0.4)
    expect = OK
    key = draw(st.sampled_from(names_))
    if fault == "poison":
        # non-finite weights are values too (a diverged run): loaded, and nothing crashes on them;
        # only a file holding them is refused, as damaged (Seq2SeqTransformer.load)
        sd[key].reshape(-1)[rng.integers(0, sd[key].size)] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    elif fault == "missing":
        del sd[key]
        expect = Expect("state_dict")
    elif fault == "extra":
        sd["encoder.extra.weight"] = np.zeros(3, np.float32)
        expect = Expect("state_dict")
    elif fault == "shape":
        sd[key] = np.zeros(sd[key].shape + (1,), np.float32)
        expect = Expect(key)
    elif fault == "dtype":
        sd[key] = sd[key].astype(draw(st.sampled_from(["object", "complex64", "bool", "U3"])))
        expect = Expect(key, (TypeError,))
    elif fault == "not_array":
        sd[key] = sd[key].tolist()
        expect = Expect(key, (TypeError,))
    elif fault == "not_dict":
        sd = list(sd.items())
        expect = Expect("state_dict", (TypeError,))
    elif fault == "key_type":
        sd[5] = np.zeros(1, np.float32)
        expect = Expect("state_dict")
    elif fault == "overflow":
        sd[key] = np.full(sd[key].shape, 1e300)
        expect = Expect(key)
    else:
        # valid in another dtype or layout: float64, float16, int, Fortran, strided, read-only
        sd[key] = layout(sd[key].astype(draw(st.sampled_from(["float32", "float64", "float16", "int32"]))),
                         draw(st.sampled_from(GOOD_LAYOUTS)), rng)

    def check(_):
        after = model.state_dict()
        for k in names_:
            assert np.array_equal(after[k], np.asarray(sd[k]).astype(np.float32), equal_nan=True), k
        with tempfile.TemporaryDirectory() as tmp:
            model.save(os.path.join(tmp, "m"))
            if fault == "poison":
                try:
                    T.Seq2SeqTransformer.load(os.path.join(tmp, "m"))
                    _fail("a file of non-finite weights was loaded")
                except ValueError as exc:
                    assert names(str(exc), key) and "non-finite" in str(exc), exc
                loaded = model
            else:
                loaded = T.Seq2SeqTransformer.load(os.path.join(tmp, "m"))
        assert loaded.cfg == model.cfg
        assert all(np.array_equal(v, after[k], equal_nan=True) for k, v in loaded.state_dict().items())
        src = ids(rng, 2, 3, model.cfg.src_vocab_size, 0)
        tgt = src % model.cfg.tgt_vocab_size
        assert np.array_equal(loaded.forward(src, tgt), model.forward(src, tgt), equal_nan=True)
        if fault == "poison":
            model.forward_backward(src, tgt, tgt)
            check_decoded(model, src, model.greedy_decode(src, max_len=4), 4, 0, greedy=False)
            check_decoded(model, src, model.beam_search(src, beam_size=2, max_len=4), 4, 0, greedy=False)

    result = run_case(expect, lambda: model.load_state_dict(sd), check)
    if not expect.valid:
        after = model.state_dict()
        assert all(np.array_equal(after[k], before[k]) for k in names_), "a refused state dict changed weights"
    # check_ids: the model's own id check, with any vocabulary
    vocab = draw(st.sampled_from([1, 5, 9]))
    x = ids(rng, 2, 3, vocab, 0, pad_tail=False) if vocab > 1 else np.zeros((2, 3), np.int64)
    x_in, expect = break_ids(draw, rng, x, "ids", vocab, model.cfg.max_len)
    run_case(expect, lambda: model.check_ids(x_in, "ids", vocab),
             lambda got: (got.dtype == np.int64 and got.flags.c_contiguous
                          and np.array_equal(got, canonical(x_in))) or _fail("check_ids changed the ids"))
    for bad_vocab, err in ((0, ValueError), ("9", TypeError), (None, TypeError), (2.5, TypeError)):
        run_case(Expect("vocab", (err, ValueError, TypeError)), lambda: model.check_ids(x, "ids", bad_vocab))
    for bad_path in (None, 3):
        run_case(Expect("path", (TypeError,)), lambda: model.save(bad_path))
        run_case(Expect("path", (TypeError,)), lambda: T.Seq2SeqTransformer.load(bad_path))
    return result


def _fail(message):
    raise AssertionError(message)


# --------------------------------------------------------------------------------------------
# tokenizers

SAFE_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,?!'-éñüहिंदी中文ß"
ANY_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)


@given(st.data())
def prop_char_tokenizer(data):
    draw = data.draw
    alphabet = "".join(dict.fromkeys(draw(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)),
                                                   min_size=1, max_size=20))))
    fault = fault_or_none(draw, ["duplicate", "empty", "type"], p_valid=0.75)
    expect = OK
    arg = alphabet
    if fault == "duplicate":
        arg, expect = alphabet + alphabet[0], Expect("alphabet")
    elif fault == "empty":
        arg, expect = "", Expect("alphabet")
    elif fault == "type":
        arg, expect = draw(st.sampled_from([None, 5, list(alphabet), alphabet.encode()])), Expect("alphabet", (TypeError,))
    tok = run_case(expect, lambda: CharTokenizer(arg))
    if tok is None:
        return
    text = draw(st.one_of(st.text(alphabet=alphabet, max_size=20), ANY_TEXT))
    encoded = run_case(OK, lambda: tok.encode(text))
    assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in encoded)
    expected = "".join(ch if ch in alphabet else "\u2047" for ch in text)
    assert tok.decode(encoded) == expected
    again = tokenizer_from_json(tok.to_json())
    assert isinstance(again, CharTokenizer) and again.encode(text) == encoded
    # decode skips ids outside the vocabulary (and the reserved ones but <unk>); never raises
    stray = draw(st.lists(st.integers(-2**70, 2**70) | st.integers(-5, tok.vocab_size + 5), max_size=8))
    assert tok.decode(stray) == tok.decode([i for i in stray if 0 <= i < tok.vocab_size])
    assert len(tok.tokens([i for i in stray if 0 <= i < tok.vocab_size])) == len(
        [i for i in stray if 0 <= i < tok.vocab_size])
    run_case(Expect("text", (TypeError,)), lambda: tok.encode(draw(st.sampled_from([None, 5, b"abc", ["a"]]))))
    run_case(Expect("ids", (TypeError,)), lambda: tok.decode(draw(st.sampled_from([["a"], [1.5], None, 5]))))


_SUBWORD = {}


def subword(texts_key, texts, vocab_size, min_frequency):
    key = (texts_key, vocab_size, min_frequency)
    if key not in _SUBWORD:
        if len(_SUBWORD) > 64:
            _SUBWORD.clear()
        _SUBWORD[key] = SubwordTokenizer.train(texts, vocab_size=vocab_size, min_frequency=min_frequency)
    return _SUBWORD[key]


@given(st.data())
def prop_subword_tokenizer(data):
    draw = data.draw
    words = draw(st.lists(st.text(alphabet=SAFE_CHARS, min_size=1, max_size=8), min_size=1, max_size=12))
    texts = [" ".join(words[i:] + words[:i]) for i in range(len(words))]
    vocab_size = draw(st.sampled_from([5, 8, 30, 60, 200]))
    min_frequency = draw(st.sampled_from([0, 1, 2]))
    fault = fault_or_none(draw, ["vocab_small", "vocab_type", "vocab_huge", "freq", "texts_type",
                                 "texts_items"], p_valid=0.7)
    expect = OK
    kwargs = {"vocab_size": vocab_size, "min_frequency": min_frequency}
    train_texts = texts
    if fault == "vocab_small":
        kwargs["vocab_size"], expect = draw(st.sampled_from([4, 0, -1])), Expect("vocab_size")
    elif fault == "vocab_type":
        kwargs["vocab_size"], expect = draw(st.sampled_from(["60", None, 60.0, True])), Expect("vocab_size", (TypeError,))
    elif fault == "vocab_huge":
        kwargs["vocab_size"], expect = 2**40, Expect("vocab_size")
    elif fault == "freq":
        kwargs["min_frequency"], expect = draw(st.sampled_from([-1, 1.5, "2", None])), Expect("min_frequency")
    elif fault == "texts_type":
        train_texts, expect = draw(st.sampled_from(["just one string", None, 5, b"bytes"])), Expect("texts", (TypeError,))
    elif fault == "texts_items":
        train_texts, expect = texts + [draw(st.sampled_from([None, 5, b"x"]))], Expect("texts", (TypeError,))
    if expect.valid:
        CASES["cases"] += 1
        CASES["valid"] += 1
        tok = subword(tuple(texts), texts, vocab_size, min_frequency)
    else:
        run_case(expect, lambda: SubwordTokenizer.train(train_texts, **kwargs))
        return
    # text over the training characters round-trips; any text encodes to ids in range
    known = "".join(sorted(set("".join(texts)) - {" "}))
    sample = draw(st.one_of(st.text(alphabet=known + " ", max_size=30), ANY_TEXT,
                            st.sampled_from(["<s>", "</s> <pad>", "a<unk>b", ""])))
    encoded = tok.encode(sample)
    assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in encoded)
    # text is text: strings that spell a reserved token are not control ids
    assert not set(encoded) & {0, 1, 2} or not sample, f"{sample!r} encoded to reserved ids {encoded}"
    if all(ch in known or ch == " " for ch in sample):
        normal = re.sub(" +", " ", unicodedata.normalize("NFKC", sample)).strip()
        assert re.sub(" +", " ", tok.decode(encoded)) == normal, (sample, encoded, tok.decode(encoded))
    assert tok.encode_batch([sample, sample]) == [encoded, encoded]
    again = tokenizer_from_json(tok.to_json())
    assert again.encode(sample) == encoded
    stray = draw(st.lists(st.integers(-2**70, 2**70) | st.integers(-5, tok.vocab_size + 5), max_size=8))
    assert tok.decode(stray) == tok.decode([i for i in stray if 0 <= i < tok.vocab_size])
    run_case(Expect("text", (TypeError,)), lambda: tok.encode(draw(st.sampled_from([None, 5, b"abc"]))))
    run_case(Expect("ids", (TypeError,)), lambda: tok.decode(draw(st.sampled_from([["a"], [1.5], None]))))
    # a damaged JSON file: ValueError (or TypeError for a non-str), never a crash
    text = tok.to_json()
    cut = draw(st.integers(0, len(text)))
    damaged = draw(st.sampled_from([text[:cut], text[:cut] + "}" + text[cut + 1:],
                                    text.replace('"<pad>"', '"<pap>"'), "[]", "null", "{}",
                                    json.dumps({"type": "chars", "alphabet": 5}),
                                    json.dumps({"type": "chars", "alphabet": "aa"})]))
    try:
        tokenizer_from_json(damaged)
    except ValueError as exc:
        assert "tokenizer" in str(exc), str(exc)
    run_case(Expect("text", (TypeError,)), lambda: tokenizer_from_json(draw(st.sampled_from([None, 5]))))


# --------------------------------------------------------------------------------------------
# data: read_pairs, length_batches, collate

_TMP = None


def tmp_dir():
    """One temporary folder per process for the generated data files, removed at exit."""
    global _TMP
    if _TMP is None:
        import atexit
        import shutil

        _TMP = tempfile.mkdtemp(prefix="transformer-fuzz-")
        atexit.register(shutil.rmtree, _TMP, True)
    return _TMP
HEADER = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,31}$")
FIELD = st.text(alphabet=" abcxyzé\u00a0हि\r", max_size=6)          # may be blank once stripped
WORD = st.text(alphabet="abcxyzéहि ", min_size=1, max_size=6).filter(str.strip)


def read_pairs_oracle(lines, src_col, tgt_col, max_pairs, header_arg=None):
    """The documented rules of read_pairs, written out plainly. Returns (pairs, skipped) or the
    exception class expected."""
    decoded = []
    for raw in lines:
        try:
            decoded.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            decoded.append(None)
    named = [spec for spec in (src_col, tgt_col) if isinstance(spec, str) and not re.fullmatch(r"[0-9]+", spec)]
    if header_arg is False and named:
        return ValueError                                 # names need a header
    is_header = True if header_arg is None and named else header_arg
    header = None
    if decoded and decoded[0] is None and is_header:
        return ValueError                                 # a header that is not text
    if decoded and decoded[0] is not None:
        decoded[0] = decoded[0].lstrip("\ufeff")          # a byte-order mark is not text
        first = decoded[0].rstrip("\r\n").split("\t")
        if is_header is None:
            is_header = len(first) >= 2 and all(HEADER.match(f) for f in first)
        if is_header:
            header = first
    cols = []
    for spec in (src_col, tgt_col):
        if spec in named:
            if header is None or spec not in header:
                return ValueError
            cols.append(header.index(spec))
        else:
            cols.append(int(spec))
    if cols[0] == cols[1]:
        return ValueError
    pairs, skipped = [], {}
    for number, line in enumerate(decoded, start=1):
        if number == 1 and header is not None:
            continue
        if line is None:
            skipped["lines with invalid UTF-8"] = skipped.get("lines with invalid UTF-8", 0) + 1
            continue
        line = line.rstrip("\r\n")
        if not line.strip():
            reason = "blank lines"
        else:
            fields = line.split("\t")
            if max(cols) >= len(fields):
                reason = "lines with too few columns"
            elif not fields[cols[0]].strip() or not fields[cols[1]].strip():
                reason = "pairs with an empty side"
            else:
                pairs.append((fields[cols[0]].strip(), fields[cols[1]].strip()))
                if max_pairs is not None and len(pairs) >= max_pairs:
                    break
                continue
        skipped[reason] = skipped.get(reason, 0) + 1
    if not pairs:
        return ValueError
    return pairs, skipped


@st.composite
def tsv_lines(draw):
    lines = []
    if draw(st.booleans()):
        lines.append("\t".join(draw(st.sampled_from([["eng", "spa"], ["ref", "eng", "spa"], ["a b", "c"],
                                                      ["eng", "spa text"]]))))   # the last: names only
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["pair", "pair", "pair", "messy", "blank", "one", "many", "bad_utf8",
                                     "empty_side"]))
        if kind == "pair":
            lines.append("\t".join(draw(st.lists(WORD, min_size=2, max_size=3))))
        elif kind == "messy":
            lines.append("\t".join(draw(st.lists(FIELD, min_size=2, max_size=3))))
        elif kind == "blank":
            lines.append(draw(st.sampled_from(["", " ", "\t", " \t "])))
        elif kind == "one":
            lines.append(draw(FIELD))
        elif kind == "many":
            lines.append("\t".join(draw(st.lists(FIELD, min_size=4, max_size=6))))
        elif kind == "bad_utf8":
            lines.append(b"\xff\xfe bad\tbytes \xc3")
        else:
            lines.append("\t" + draw(FIELD))
    encoded = [(ln if isinstance(ln, bytes) else ln.encode("utf-8")) for ln in lines]
    if encoded and draw(st.booleans()):
        encoded[0] = b"\xef\xbb\xbf" + encoded[0]     # a byte-order mark
    ending = draw(st.sampled_from([b"\n", b"\r\n"]))
    blob = ending.join(encoded) + (ending if encoded and draw(st.booleans()) else b"")
    return blob


@given(st.data())
def prop_read_pairs(data):
    draw = data.draw
    blob = draw(tsv_lines())
    compress = draw(st.sampled_from([None, None, "gzip", "gzip_cut", "gzip_garbage"]))
    path = os.path.join(tmp_dir(), "pairs" + draw(st.sampled_from([".tsv", ".tsv.gz", ""])))
    payload = blob
    if compress == "gzip":
        payload = gzip.compress(blob)
    elif compress == "gzip_cut":
        payload = gzip.compress(blob)
        payload = payload[:draw(st.integers(2, max(2, len(payload) - 1)))]
    elif compress == "gzip_garbage":
        payload = gzip.compress(blob)
        payload = payload[:12] + bytes(b ^ 0x5A for b in payload[12:])
    with open(path, "wb") as f:
        f.write(payload)
    src_col = draw(st.sampled_from([0, 0, 1, 2, "0", "eng", "spa", "ref", np.int64(0)]))
    tgt_col = draw(st.sampled_from([1, 1, 0, 2, "1", "spa", "eng"]))
    max_pairs = draw(st.sampled_from([None, None, 1, 2, 100]))
    header = draw(st.sampled_from([None, None, True, False]))
    fault = fault_or_none(draw, ["path_none", "path_missing", "path_dir", "col_neg", "col_type", "max_pairs",
                                 "header_type"], p_valid=0.7)
    kwargs = {"src_col": src_col, "tgt_col": tgt_col, "max_pairs": max_pairs, "header": header}
    target = path
    expect = OK
    if fault == "path_none":
        target, expect = draw(st.sampled_from([None, 5])), Expect("path", (TypeError,))
    elif fault == "path_missing":
        target, expect = os.path.join(tmp_dir(), "nowhere.tsv"), Expect("nowhere.tsv", (FileNotFoundError,))
    elif fault == "path_dir":
        target, expect = tmp_dir(), Expect(os.path.basename(tmp_dir()))
    elif fault == "col_neg":
        kwargs["src_col"], expect = draw(st.sampled_from([-1, "-1", -2])), Expect("src_col")
    elif fault == "col_type":
        kwargs["tgt_col"], expect = draw(st.sampled_from([None, 1.0, True, [1]])), Expect("tgt_col", (TypeError,))
    elif fault == "max_pairs":
        kwargs["max_pairs"], expect = draw(st.sampled_from([0, -1, 1.5, "3", True])), Expect("max_pairs")
    elif fault == "header_type":
        kwargs["header"], expect = draw(st.sampled_from(["yes", 1, 0])), Expect("header", (TypeError,))
    if not expect.valid:
        run_case(expect, lambda: tdata.read_pairs(target, **kwargs))
        return
    if compress in ("gzip_cut", "gzip_garbage"):
        # a damaged archive: a ValueError naming the file (or, if the damage missed, the pairs)
        try:
            tdata.read_pairs(path, **kwargs)
        except ValueError as exc:
            assert os.path.basename(path) in str(exc), str(exc)
        CASES["cases"] += 1
        CASES["invalid"] += 1
        return
    lines = blob.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    expected = read_pairs_oracle(lines, src_col, tgt_col, max_pairs, header)
    if expected is ValueError:
        run_case(Expect(os.path.basename(path), (ValueError,)), lambda: tdata.read_pairs(path, **kwargs))
        return

    def check(result):
        pairs, report = result
        assert pairs == expected[0], (pairs, expected[0])
        assert report.kept == len(pairs)
        if max_pairs is None:
            assert report.skipped == expected[1], (report.skipped, expected[1])

    run_case(OK, lambda: tdata.read_pairs(path, **kwargs), check)


@given(st.data())
def prop_batches(data):
    """length_batches and collate: every example once, the token budget kept, padded arrays."""
    draw = data.draw
    rng = np.random.default_rng(draw(seeds))
    n = draw(st.sampled_from([0, 1, 2, 5, 17, 40]))
    examples = []
    for _ in range(n):
        s = rng.integers(3, 50, size=rng.integers(0, 12)).tolist()
        t = rng.integers(3, 50, size=rng.integers(0, 12)).tolist()
        examples.append(tdata.make_example(s, t, 1, 2))
    max_tokens = draw(st.sampled_from([1, 5, 12, 40, 1000, np.int64(30), 25.0]))
    seed, epoch, shuffle = draw(st.integers(0, 3)), draw(st.integers(0, 3)), draw(st.booleans())
    fault = fault_or_none(draw, ["budget", "budget_type"], p_valid=0.8)
    if fault == "budget":
        bad = draw(st.sampled_from([0, -3, 0.5, math.nan, -math.inf]))
        run_case(Expect("max_tokens"), lambda: tdata.length_batches(examples, bad))
        return
    if fault == "budget_type":
        bad = draw(st.sampled_from([None, "40", [40]]))
        run_case(Expect("max_tokens", (TypeError,)), lambda: tdata.length_batches(examples, bad))
        return

    def check(batches):
        flat = sorted(i for b in batches for i in b)
        assert flat == list(range(n)), "every example exactly once"
        assert all(b for b in batches), "no empty batch"
        for b in batches:
            longest = max(max(len(examples[i][0]), len(examples[i][1])) for i in b)
            assert longest * len(b) <= max_tokens or len(b) == 1
        assert batches == tdata.length_batches(examples, max_tokens, seed=seed, epoch=epoch, shuffle=shuffle)

    batches = run_case(OK, lambda: tdata.length_batches(examples, max_tokens, seed=seed, epoch=epoch,
                                                        shuffle=shuffle), check)
    for b in batches + [[]]:
        def check_collate(arrays, b=b):
            for part, arr in enumerate(arrays):
                assert arr.dtype == np.int64 and arr.ndim == 2 and arr.shape[0] == len(b)
                longest = max((len(examples[i][part]) for i in b), default=0)
                assert arr.shape[1] == longest
                for row, i in enumerate(b):
                    seq = examples[i][part]
                    assert arr[row, :len(seq)].tolist() == seq and not arr[row, len(seq):].any()
        run_case(OK, lambda: tdata.collate(examples, b, 0), check_collate)
    if n:
        bad = draw(st.sampled_from([[n], [-1], [0, n + 5], [0.5], ["0"], None]))
        run_case(Expect("indices"), lambda: tdata.collate(examples, bad, 0))
    run_case(Expect("sequences"), lambda: tdata.pad_batch([["a", "b"]], 0))


# --------------------------------------------------------------------------------------------
# ModelConfig, Adam, noam_lr, clip_grad_norm

CONFIG_FIELDS = {"src_vocab_size": 9, "tgt_vocab_size": 7, "d_model": 8, "n_heads": 2, "d_ff": 16,
                 "n_encoder_layers": 1, "n_decoder_layers": 1, "dropout": 0.0, "activation": "relu",
                 "norm_first": False, "max_len": 6, "pad_id": 0, "bos_id": 1, "eos_id": 2,
                 "attention_dropout": None, "activation_dropout": 0.1, "word_dropout": 0.0}
_SITE_RATE_BAD = [(-0.1, ValueError), (1.0, ValueError), (math.nan, ValueError), ("0.1", TypeError), (True, TypeError)]
CONFIG_BAD = {
    "attention_dropout": _SITE_RATE_BAD, "activation_dropout": _SITE_RATE_BAD,
    "word_dropout": _SITE_RATE_BAD + [(None, TypeError)],
    "int": [(0, ValueError), (-1, ValueError), (2.0, TypeError), ("8", TypeError), (None, TypeError), (True, TypeError)],
    "dropout": [(-0.1, ValueError), (1.0, ValueError), (math.nan, ValueError), ("0.1", TypeError), (None, TypeError), (True, TypeError)],
    "activation": [("tanh", ValueError), ("", ValueError), (None, ValueError), (1, ValueError)],
    "norm_first": [(1, TypeError), ("yes", TypeError), (None, TypeError)],
    "special": [(-1, ValueError), (7, ValueError), (1.0, TypeError), (None, TypeError)],
}


def adam_oracle(p, g, m, v, step, lr, b1, b2, eps, wd, decoupled):
    """torch.optim.Adam / AdamW (single-tensor, PyTorch's order of operations) in float64.
    Returns the new (params, exp_avg, exp_avg_sq) and the size of the terms of each (the scale
    of float32 rounding: the weight-decay sum g + wd * p may cancel)."""
    p, g, m, v = (np.asarray(x, np.float64) for x in (p, g, m, v))
    terms = np.abs(g)
    if decoupled:
        p = p * (1 - lr * wd)
    elif wd:
        terms = terms + wd * np.abs(p)
        g = g + wd * p
    m_scale = (1 - b1) * terms + b1 * np.abs(m)
    v_scale = (1 - b2) * terms * terms + b2 * np.abs(v)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    denom = np.sqrt(v) / math.sqrt(1 - b2 ** step) + eps
    step_size = lr / (1 - b1 ** step)
    update = step_size * m / denom
    with np.errstate(all="ignore"):
        p_scale = np.abs(p) + 10 * step_size * (m_scale / denom + np.abs(m) * np.sqrt(v_scale) / (denom * denom))
    return p - update, m, v, (np.nan_to_num(p_scale, posinf=0.0), m_scale, v_scale)


@given(st.data())
def prop_config_and_optimizer(data):
    draw = data.draw
    rng = np.random.default_rng(draw(seeds))
    fields = dict(CONFIG_FIELDS, norm_first=draw(st.booleans()), activation=draw(st.sampled_from(["relu", "gelu"])),
                  d_model=draw(st.sampled_from([2, 4, 8])), n_heads=draw(st.sampled_from([1, 2])))
    expect = OK
    if not chance(draw, 0.5):
        name = draw(st.sampled_from(sorted(CONFIG_FIELDS)))
        kind = ("int" if isinstance(CONFIG_FIELDS[name], int) and name not in ("pad_id", "bos_id", "eos_id")
                and not isinstance(CONFIG_FIELDS[name], bool) else
                "special" if name in ("pad_id", "bos_id", "eos_id") else name)
        bad, error = draw(st.sampled_from(CONFIG_BAD[kind]))
        fields[name], expect = bad, Expect(name, (error,))
    elif chance(draw, 0.2):
        fields["n_heads"], expect = 3, Expect("n_heads")          # d_model not divisible
    elif chance(draw, 0.2):
        fields["eos_id"], expect = fields["bos_id"], Expect("eos_id")
    cfg = run_case(expect, lambda: T.ModelConfig(**fields))
    if cfg is None:
        run_case(Expect("config", (TypeError,)), lambda: T.ModelConfig.from_dict(list(fields.items())))
        return
    assert T.ModelConfig.from_dict(cfg.to_dict()) == cfg
    run_case(Expect("unknown", (ValueError,)), lambda: T.ModelConfig.from_dict(dict(cfg.to_dict(), colour=1)))
    model = run_case(OK, lambda: T.Seq2SeqTransformer(cfg, seed=draw(st.sampled_from([0, 1, np.int64(2)]))))
    run_case(Expect("seed", (TypeError,)), lambda: T.Seq2SeqTransformer(cfg, seed=draw(st.sampled_from([1.0, None, "0"]))))
    run_case(Expect("cfg", (TypeError,)), lambda: T.Seq2SeqTransformer(cfg.to_dict()))

    # Adam: the constructor's checks, then one step against the float64 oracle
    kwargs = {"lr": draw(st.sampled_from([1e-3, 0.0, 0.5, np.float32(1e-2)])),
              "betas": draw(st.sampled_from([(0.9, 0.98), (0.0, 0.5), [0.5, 0.999]])),
              "eps": draw(st.sampled_from([1e-9, 1e-6, 0.0])), "weight_decay": draw(st.sampled_from([0.0, 0.01])),
              "decoupled": draw(st.booleans())}
    fault = fault_or_none(draw, ["lr", "betas", "beta_range", "eps", "wd", "model"], p_valid=0.6)
    expect = OK
    target = model
    if fault == "lr":
        kwargs["lr"], expect = draw(st.sampled_from([-1e-3, math.nan, math.inf, "0.1", None])), Expect("lr")
    elif fault == "betas":
        kwargs["betas"], expect = draw(st.sampled_from([0.9, (0.9,), "ab", None])), Expect("betas")
    elif fault == "beta_range":
        kwargs["betas"], expect = draw(st.sampled_from([(1.0, 0.9), (0.9, -0.1), (0.9, math.nan)])), Expect("betas")
    elif fault == "eps":
        kwargs["eps"], expect = draw(st.sampled_from([-1.0, math.inf, None])), Expect("eps")
    elif fault == "wd":
        kwargs["weight_decay"], expect = draw(st.sampled_from([-0.1, math.nan, "0"])), Expect("weight_decay")
    elif fault == "model":
        target, expect = draw(st.sampled_from([None, cfg, "model"])), Expect("model", (TypeError,))
    opt = run_case(expect, lambda: T.Adam(target, **kwargs))
    if opt is None:
        return
    p = model.params
    p.flat_grad[:] = rng.standard_normal(p.flat_grad.size) * rng.choice([1e-3, 1.0, 10.0])
    state = [p.flat.copy(), p.flat_grad.copy(), opt.exp_avg.copy(), opt.exp_avg_sq.copy()]
    step_lr = draw(st.sampled_from([None, 1e-3, 0.0, np.float64(2e-3)]))
    run_case(OK, lambda: opt.step(lr=step_lr))
    lr = float(kwargs["lr"] if step_lr is None else step_lr)
    ref, m, v, (p_scale, m_scale, v_scale) = adam_oracle(
        *state, 1, lr, *map(float, kwargs["betas"]), float(kwargs["eps"]), float(kwargs["weight_decay"]),
        kwargs["decoupled"])
    assert_close(opt.exp_avg, m, m_scale, rel=1e-6, what="Adam exp_avg")
    assert_close(opt.exp_avg_sq, v, v_scale, rel=1e-6, what="Adam exp_avg_sq")
    assert_close(p.flat, ref, p_scale, rel=1e-6, what="Adam parameters")
    run_case(Expect("lr"), lambda: opt.step(lr=draw(st.sampled_from([math.nan, "1", math.inf]))))

    # clip_grad_norm: the float64 norm, and the gradient scaled to at most max_norm
    max_norm = draw(st.sampled_from([1.0, 0.5, 1e3, np.float32(2.0), 1]))
    before = p.flat_grad.astype(np.float64)
    norm = run_case(OK, lambda: T.clip_grad_norm(model, max_norm))
    ref_norm = float(np.sqrt((before ** 2).sum()))
    assert abs(norm - ref_norm) <= 1e-6 * ref_norm + TINY, (norm, ref_norm)
    coef = min(1.0, float(max_norm) / (ref_norm + 1e-6))
    assert_close(p.flat_grad, before * coef, np.abs(before), rel=1e-6, what="clip_grad_norm")
    run_case(Expect("max_norm"), lambda: T.clip_grad_norm(model, draw(st.sampled_from([0.0, -1.0, math.nan, None]))))

    # noam_lr: equation 3
    step, d_model, warmup = draw(st.integers(1, 10**6)), draw(st.sampled_from([1, 64, 512])), draw(st.integers(1, 10**4))
    got = run_case(OK, lambda: T.noam_lr(step, d_model=d_model, warmup=warmup))
    assert math.isclose(got, d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5), rel_tol=1e-12)
    bad_name = draw(st.sampled_from(["step", "d_model", "warmup"]))
    bad = {"step": step, "d_model": d_model, "warmup": warmup, bad_name: draw(st.sampled_from([0, -5, 1.5, None, True]))}
    run_case(Expect(bad_name), lambda: T.noam_lr(**bad))


# --------------------------------------------------------------------------------------------
# transformer._C, the strict door: every function with one argument broken at a time. Arrays live
# inside guard bytes, so a kernel writing outside the array it was given is caught even when the
# process survives. Any outcome but a result or a ValueError/TypeError naming an argument fails.

from transformer import _C  # noqa: E402

GUARD_BYTES = 256
GUARD_BYTE = 0xA5


class Arena:
    """Arrays in guarded buffers; check() asserts no byte around them changed."""

    def __init__(self):
        self.buffers = []

    def array(self, x, offset=0):
        x = np.asarray(x)
        buf = np.full(x.nbytes + 2 * GUARD_BYTES + offset, GUARD_BYTE, dtype=np.uint8)
        y = buf[GUARD_BYTES + offset:GUARD_BYTES + offset + x.nbytes].view(x.dtype).reshape(x.shape)
        y[...] = x
        self.buffers.append((buf, GUARD_BYTES + offset, x.nbytes))
        return y

    def check(self, what):
        for buf, start, n in self.buffers:
            before, after = buf[:start], buf[start + n:]
            assert (before == GUARD_BYTE).all() and (after == GUARD_BYTE).all(), \
                f"{what}: wrote outside an array it was given"


def _f(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def door_cases(rng):
    """{function name: (callable, builder)}; builder(arena) -> (args, kwargs) of a valid call."""
    B, H, Tq, Tk = (int(v) for v in rng.integers(0, 4, size=4))
    N, D, V = int(rng.integers(0, 5)), int(rng.integers(1, 20)), int(rng.integers(1, 9))
    dh, Tmax = int(rng.integers(1, 6)), int(rng.integers(1, 6))
    M, K, Nn = (int(v) for v in rng.integers(0, 20, size=3))
    T = int(rng.integers(0, 5))
    ids = lambda *shape: rng.integers(0, V, size=shape).astype(np.int64)  # noqa: E731

    def gemm(a):
        return [a.array(_f(rng, M, K)), a.array(_f(rng, K, Nn)), a.array(_f(rng, M, Nn))], \
            {"trans_a": False, "trans_b": False, "alpha": 1.0, "accumulate": bool(rng.integers(0, 2))}

    cases = {
        "gemm": (_C.gemm, gemm),
        "gemm_reference": (_C.gemm_reference, gemm),
        "softmax_forward": (_C.softmax_forward, lambda a: (
            [a.array(_f(rng, B, H, Tq, Tk)), a.array(_f(rng, B, H, Tq, Tk))],
            {"scale": 0.5, "causal": True, "key_padding_mask": a.array(rng.random((B, Tk)) < 0.3),
             "q_offset": int(rng.integers(0, 3))})),
        "softmax_backward": (_C.softmax_backward, lambda a: (
            [a.array(_f(rng, B, Tq, Tk)), a.array(_f(rng, B, Tq, Tk)), a.array(_f(rng, B, Tq, Tk))], {"scale": 2.0})),
        "exp_f32": (_C.exp_f32, lambda a: ([a.array(_f(rng, N * D)), a.array(_f(rng, N * D))], {})),
        "layernorm_forward": (_C.layernorm_forward, lambda a: (
            [a.array(_f(rng, N, D)), a.array(_f(rng, D)), a.array(_f(rng, D)), a.array(_f(rng, N, D)),
             a.array(_f(rng, N)), a.array(_f(rng, N))], {"eps": 1e-5})),
        "layernorm_backward": (_C.layernorm_backward, lambda a: (
            [a.array(_f(rng, N, D)), a.array(_f(rng, N, D)), a.array(_f(rng, D)), a.array(_f(rng, N)),
             a.array(np.abs(_f(rng, N))), a.array(_f(rng, N, D)), a.array(_f(rng, D)), a.array(_f(rng, D))],
            {"accumulate": bool(rng.integers(0, 2))})),
        "positional_encoding": (_C.positional_encoding, lambda a: ([a.array(_f(rng, N, D))], {})),
        "embedding_forward": (_C.embedding_forward, lambda a: (
            [a.array(ids(B, T)), a.array(_f(rng, V, D)), a.array(_f(rng, B, T, D))],
            {"scale": 2.0, "pe": a.array(_f(rng, T + 2, D)), "pos_offset": int(rng.integers(0, 3))})),
        "embedding_backward": (_C.embedding_backward, lambda a: (
            [a.array(ids(B, T)), a.array(_f(rng, B, T, D)), a.array(_f(rng, V, D))], {"scale": 0.5})),
        "add": (_C.add, lambda a: ([a.array(_f(rng, N, D)), a.array(_f(rng, N, D)), a.array(_f(rng, N, D))], {})),
        "add_bias": (_C.add_bias, lambda a: ([a.array(_f(rng, N, D)), a.array(_f(rng, D))], {})),
        "bias_grad": (_C.bias_grad, lambda a: ([a.array(_f(rng, N, D)), a.array(_f(rng, D))], {})),
        "bias_act_forward": (_C.bias_act_forward, lambda a: (
            [a.array(_f(rng, N, D)), a.array(_f(rng, D)), a.array(_f(rng, N, D)), str(rng.choice(["relu", "gelu"]))], {})),
        "act_backward": (_C.act_backward, lambda a: (
            [a.array(_f(rng, N, D)), a.array(_f(rng, N, D)), a.array(_f(rng, N, D)), str(rng.choice(["relu", "gelu"]))],
            {"accumulate": bool(rng.integers(0, 2))})),
        "dropout_forward": (_C.dropout_forward, lambda a: (
            [a.array(_f(rng, N, D)), a.array(_f(rng, N, D)), 0.25, 7], {"offset": 3})),
        "dropout_backward": (_C.dropout_backward, lambda a: (
            [a.array(_f(rng, N, D)), a.array(_f(rng, N, D)), 0.25, 7], {"offset": 3})),
        "dropout_add_forward": (_C.dropout_add_forward, lambda a: (
            [a.array(_f(rng, N, D)), a.array(_f(rng, N, D)), a.array(_f(rng, N, D)), 0.25, 7],
            {"offset": 3, "bias": a.array(_f(rng, D))})),
        "dropout_mask": (_C.dropout_mask, lambda a: ([N * D, 0.5, 3], {"offset": 0})),
        "cross_entropy": (_C.cross_entropy, lambda a: (
            [a.array(_f(rng, N, V)), a.array(np.where(rng.random(N) < 0.2, -100, ids(N)))],
            {"dlogits": a.array(_f(rng, N, V)), "ignore_index": -100, "label_smoothing": 0.1})),
        "log_softmax": (_C.log_softmax, lambda a: ([a.array(_f(rng, N, V)), a.array(_f(rng, N, V))], {})),
        "adam_step": (_C.adam_step, lambda a: (
            [a.array(_f(rng, N * D)), a.array(_f(rng, N * D)), a.array(_f(rng, N * D)),
             a.array(np.abs(_f(rng, N * D))), 3, 1e-3], {})),
        "sum_squares": (_C.sum_squares, lambda a: ([a.array(_f(rng, N, D))], {})),
        "scale_": (_C.scale_, lambda a: ([a.array(_f(rng, N, D)), 0.5], {})),
        "zero_": (_C.zero_, lambda a: ([a.array(_f(rng, N, D))], {})),
        "attention_decode": (_C.attention_decode, lambda a: (
            [a.array(_f(rng, N, H * dh)), a.array(_f(rng, N, H, Tmax, dh)), a.array(_f(rng, N, H, Tmax, dh)),
             Tmax, a.array(_f(rng, N, H * dh)), 0.5],
            {"key_mask": a.array(rng.random((N, Tmax)) < 0.3), "probs": a.array(_f(rng, N, H, Tmax))})),
    }
    R = N + int(rng.integers(0, 3))
    if "key_rows" in (_C.attention_decode.__doc__ or ""):
        # the indexed form (beam search reads each hypothesis' history through row tables)
        cases["attention_decode_rows"] = (_C.attention_decode, lambda a: (
            [a.array(_f(rng, N, H * dh)), a.array(_f(rng, R, H, Tmax, dh)), a.array(_f(rng, R, H, Tmax, dh)),
             Tmax, a.array(_f(rng, N, H * dh)), 0.5],
            {"key_mask": a.array(rng.random((R, Tmax)) < 0.3), "probs": a.array(_f(rng, N, H, Tmax)),
             "rows": a.array(rng.integers(0, max(R, 1), size=N).astype(np.int64)),
             "key_rows": a.array(rng.integers(0, max(R, 1), size=(N, Tmax)).astype(np.int64))}))
    if hasattr(_C, "attention_cache_store"):
        cases["attention_cache_store"] = (_C.attention_cache_store, lambda a: (
            [a.array(_f(rng, N, H * dh)), a.array(_f(rng, R, H, Tmax, dh)), int(rng.integers(0, Tmax))],
            {"rows": a.array(rng.permutation(R)[:N].astype(np.int64))}))
    if hasattr(_C, "gemm_packed"):
        trans_b = bool(rng.integers(0, 2))
        cases["gemm_pack_b"] = (_C.gemm_pack_b, lambda a: (
            [a.array(_f(rng, Nn, K) if trans_b else _f(rng, K, Nn))],
            {"trans_b": trans_b, "reuse": _C.gemm_pack_b(_f(rng, Nn, K), trans_b=True) if rng.integers(0, 2) else None}))
        cases["gemm_packed"] = (_C.gemm_packed, lambda a: (
            [a.array(_f(rng, M, K)), _C.gemm_pack_b(_f(rng, Nn, K), trans_b=True), a.array(_f(rng, M, Nn))],
            {"alpha": 0.5, "accumulate": bool(rng.integers(0, 2))}))
    if hasattr(_C, "attention_train_forward"):
        Ha = max(H, 1)
        HD = Ha * dh

        def attention_inputs(a):
            qkv = a.array(_f(rng, B * Tq, 3 * HD))   # self-attention's layout when Tq == Tk
            kv = qkv if Tq == Tk else a.array(_f(rng, B * Tk, 2 * HD))
            k0 = HD if kv is qkv else 0
            return qkv[:, :HD], kv[:, k0:k0 + HD], kv[:, k0 + HD:k0 + 2 * HD]

        def attention_forward(a):
            q, k, v = attention_inputs(a)
            return [q, k, v, a.array(_f(rng, B, Ha, Tq, Tk)), a.array(_f(rng, B * Tq, HD)), 0.5], \
                {"causal": bool(rng.integers(0, 2)), "key_padding_mask": a.array(rng.random((B, Tk)) < 0.3),
                 "dropout_p": 0.1, "seed": 3, "offset": 5, "bf16": bool(rng.integers(0, 2))}

        def attention_backward(a):
            q, k, v = attention_inputs(a)
            dqkv = a.array(_f(rng, B * Tq, 3 * HD))
            dkv = dqkv if Tq == Tk else a.array(_f(rng, B * Tk, 2 * HD))
            k0 = HD if dkv is dqkv else 0
            probs = a.array(np.abs(_f(rng, B, Ha, Tq, Tk)))
            return [a.array(_f(rng, B * Tq, HD)), q, k, v, probs, dqkv[:, :HD], dkv[:, k0:k0 + HD],
                    dkv[:, k0 + HD:k0 + 2 * HD], 0.5], \
                {"causal": bool(rng.integers(0, 2)), "dropout_p": 0.1, "seed": 3, "offset": 5,
                 "bf16": bool(rng.integers(0, 2))}
        cases["attention_train_forward"] = (_C.attention_train_forward, attention_forward)
        cases["attention_train_backward"] = (_C.attention_train_backward, attention_backward)
    if hasattr(_C, "beam_topk"):
        width = int(rng.integers(1, 6))
        cases["beam_topk"] = (_C.beam_topk, lambda a: (
            [a.array(_f(rng, N * 2, V)), a.array(rng.standard_normal((N, 2))), int(rng.integers(-1, V)), width,
             a.array(np.zeros((N, width), np.int64)), a.array(np.zeros((N, width)))], {}))
    if hasattr(_C, "no_repeat_ngram_ban"):
        length = int(rng.integers(0, Tmax + 1))
        cases["no_repeat_ngram_ban"] = (_C.no_repeat_ngram_ban, lambda a: (
            [a.array(_f(rng, N, V)), a.array(rng.integers(0, min(V, 3), size=(R, Tmax)).astype(np.int64)), length,
             int(rng.integers(0, 4))],
            {"keep": int(rng.integers(-1, V)), "rows": a.array(rng.integers(0, max(R, 1), size=N).astype(np.int64))}))
    return cases


# The arguments each function writes: accepting one that partially overlaps another argument
# is a bug even when nothing crashes (the result depends on the order of the writes).
OUTPUTS = {"gemm": {2}, "gemm_reference": {2}, "softmax_forward": {1}, "softmax_backward": {2},
           "exp_f32": {1}, "layernorm_forward": {3, 4, 5}, "layernorm_backward": {5, 6, 7},
           "positional_encoding": {0}, "embedding_forward": {2}, "embedding_backward": {2},
           "add": {2}, "add_bias": {0}, "bias_grad": {1}, "bias_act_forward": {0, 2}, "act_backward": {2},
           "dropout_forward": {1}, "dropout_backward": {1}, "dropout_add_forward": {2},
           "cross_entropy": {"dlogits"}, "log_softmax": {1}, "adam_step": {0, 2, 3}, "scale_": {0}, "zero_": {0},
           "attention_decode": {4, "probs"}, "attention_decode_rows": {4, "probs"},
           "attention_cache_store": {1}, "beam_topk": {4, 5}, "gemm_pack_b": set(), "gemm_packed": {2},
           "no_repeat_ngram_ban": {0}, "attention_train_forward": {3, 4},
           "attention_train_backward": {5, 6, 7}}


ARRAY_MUTATIONS = ("dtype", "rank_up", "rank_down", "shape_up", "shape_down", "strided", "reversed",
                   "readonly", "unaligned", "overlap", "overlap_shift", "list", "none", "fortran")
SCALAR_MUTATIONS = ("nan", "inf", "negative", "huge", "str", "none", "float_for_int", "bool")


def mutate_array(draw, rng, arena, x, others):
    kind = draw(st.sampled_from(ARRAY_MUTATIONS))
    if kind == "dtype":
        return kind, arena.array(x.astype(draw(st.sampled_from(["float64", "float16", "int64", "int32", "uint8", "bool"]))))
    if kind == "rank_up":
        return kind, arena.array(x[None])
    if kind == "rank_down":
        return kind, arena.array(x.reshape(-1)) if x.ndim != 1 else arena.array(x.reshape(1, -1))
    if kind in ("shape_up", "shape_down") and x.ndim:
        axis = int(rng.integers(0, x.ndim))
        shape = list(x.shape)
        shape[axis] = shape[axis] + 1 if kind == "shape_up" else max(0, shape[axis] - 1)
        return kind, arena.array(np.resize(x, shape) if x.size else np.zeros(shape, x.dtype))
    if kind == "strided" and x.ndim:
        big = arena.array(np.repeat(x, 2, axis=-1) if x.shape[-1] else np.zeros(x.shape[:-1] + (2,), x.dtype))
        return kind, big[..., ::2] if x.shape[-1] else big[..., :0]
    if kind == "reversed" and x.ndim:
        return kind, arena.array(x)[::-1]
    if kind == "readonly":
        y = arena.array(x)
        y.flags.writeable = False
        return kind, y
    if kind == "unaligned":
        return kind, arena.array(x, offset=1)
    if kind == "fortran" and x.ndim >= 2:
        y = arena.array(np.zeros(x.shape[::-1], x.dtype)).T
        y[...] = x
        return kind, y
    if kind in ("overlap", "overlap_shift"):
        # x's data starting at another argument's first element (the same memory), or at its
        # second (a partial overlap)
        shift = int(kind == "overlap_shift")
        same = [o for o in others if isinstance(o, np.ndarray) and o is not x and o.dtype == x.dtype
                and o.flags.c_contiguous and o.size >= x.size + shift and o.flags.writeable and x.size]
        if same:
            o = same[int(rng.integers(0, len(same)))]
            return (kind, o), o.reshape(-1)[shift:shift + x.size].reshape(x.shape)
    if kind == "list":
        return kind, x.tolist()
    if kind == "none":
        return kind, None
    return "unchanged", x


def mutate_scalar(draw, value):
    kind = draw(st.sampled_from(SCALAR_MUTATIONS))
    return kind, {"nan": math.nan, "inf": math.inf, "negative": -3 if isinstance(value, int) else -0.5,
                  "huge": 2**70, "str": "1", "none": None, "float_for_int": 1.5, "bool": True}[kind]


TRACE = bool(os.environ.get("TRANSFORMER_FUZZ_TRACE"))


def describe(v):
    if isinstance(v, np.ndarray):
        flags = "".join(c for c, f in (("C", v.flags.c_contiguous), ("W", v.flags.writeable),
                                       ("A", v.flags.aligned)) if f)
        return f"{v.dtype}{list(v.shape)}{list(v.strides)}{flags}"
    return repr(v) if not isinstance(v, list) else "list"


@given(st.data())
def prop_c_door(data):
    draw = data.draw
    rng = np.random.default_rng(draw(seeds))
    _C.set_num_threads(draw(st.sampled_from(THREAD_COUNTS)))
    _C.set_isa(draw(st.sampled_from(ISA_LEVELS)))
    name = draw(st.sampled_from(sorted(door_cases(rng))))
    fn, build = door_cases(rng)[name]
    arena = Arena()
    args, kwargs = build(arena)
    slots = [("arg", i) for i in range(len(args))] + [("kw", k) for k in kwargs]
    what = "valid"
    partial_write = None
    if not chance(draw, 0.15):
        kind, key = draw(st.sampled_from(slots))
        old = args[key] if kind == "arg" else kwargs[key]
        everything = list(args) + list(kwargs.values())
        if isinstance(old, np.ndarray):
            how, new = mutate_array(draw, rng, arena, old, everything)
            if isinstance(how, tuple):          # an overlap with another argument
                how, partner = how
                slot = next(k for k, v in list(enumerate(args)) + list(kwargs.items()) if v is partner)
                if how == "overlap_shift" and (key in OUTPUTS[name] or slot in OUTPUTS[name]):
                    partial_write = (key, slot)
        elif isinstance(old, str):
            how, new = "activation", draw(st.sampled_from(["tanh", "", None, 1]))
        else:
            how, new = mutate_scalar(draw, old)
        if kind == "arg":
            args[key] = new
        else:
            kwargs[key] = new
        what = f"{name}: {key} {how}"
    CASES["cases"] += 1
    if TRACE:   # the last line before a crash names the call
        described = [describe(v) for v in args] + [f"{k}={describe(v)}" for k, v in kwargs.items()]
        print(f"{what} | {name}({', '.join(described)})", file=sys.stderr, flush=True)
    try:
        fn(*args, **kwargs)
        CASES["valid"] += 1
        assert partial_write is None, f"{what}: accepted an output partially overlapping argument {partial_write[1]}"
    except (ValueError, TypeError, OverflowError) as exc:
        # OverflowError: Cython's own conversion of a typed scalar argument (an int beyond C long)
        CASES["invalid"] += 1
        assert what != "valid", f"{name}: a valid call raised {exc!r}"
        message = str(exc)
        assert isinstance(exc, OverflowError) or " " in message, f"{what}: unhelpful error {message!r}"
    finally:
        _C.set_isa(_C.best_isa())
    arena.check(what)


# --------------------------------------------------------------------------------------------

TARGETS = {
    "matmul": prop_matmul,
    "softmax": prop_softmax,
    "layer_norm": prop_layer_norm,
    "positional_encoding": prop_positional_encoding,
    "model_forward": prop_model_forward,
    "model_training": prop_model_training,
    "model_encode": prop_model_encode,
    "greedy_decode": prop_greedy_decode,
    "beam_search": prop_beam_search,
    "state_dict": prop_state_dict,
    "char_tokenizer": prop_char_tokenizer,
    "subword_tokenizer": prop_subword_tokenizer,
    "read_pairs": prop_read_pairs,
    "batches": prop_batches,
    "c_door": prop_c_door,
    "config_and_optimizer": prop_config_and_optimizer,
}

# relative cost: the default budget gives cheap targets more examples
WEIGHT = {"model_training": 0.5, "greedy_decode": 0.5, "beam_search": 0.5, "state_dict": 0.3,
          "subword_tokenizer": 0.5, "model_forward": 0.7, "model_encode": 0.5, "read_pairs": 0.8,
          "c_door": 2.0}


def run_target(name, examples):
    prop = TARGETS[name]
    n = max(1, int(examples * WEIGHT.get(name, 1.0)))
    configured = settings(max_examples=n, derandomize=True, database=None, deadline=None,
                          suppress_health_check=list(HealthCheck), print_blob=False,
                          phases=[Phase.explicit, Phase.generate, Phase.shrink])(prop)
    np.seterr(all="ignore")
    configured()
    return dict(CASES, target=name, examples=n)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", choices=sorted(TARGETS) + ["all"])
    parser.add_argument("--examples", type=int,
                        default=int(os.environ.get("TRANSFORMER_FUZZ_EXAMPLES", "100")))
    args = parser.parse_args(argv)
    targets = sorted(TARGETS) if args.target == "all" else [args.target]
    for name in targets:
        for key in CASES:
            CASES[key] = 0
        print(json.dumps(run_target(name, args.examples)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
