"""Weights converted for the inference kernels, kept from call to call, redone when they change.

Decoding multiplies a few rows by every decoder weight matrix at every step, so it reads each
matrix as its kernels want it: packed in panels (fp32, csrc/gemm.h: gemm_pack_b), rounded to
bf16 while packing (bf16), or quantized to int8 with one scale per output row (int8,
csrc/qgemm.h). Converting costs about as much as reading the weights twice, so it is done once
per weights version, not once per call: each converted matrix remembers a fingerprint of the
float32 matrix it came from (csrc/checksum.h, at memory speed), and a matrix whose fingerprint
changed since, by an optimizer step, load_state_dict or an edit in place through a numpy view,
is converted again. Nothing stale is ever used. While the weights are frozen (Parameters.freeze:
read-only arrays, as the command line's translate and evaluate hold them) a matrix checked or
converted under the same freeze is trusted without reading it again: for one short sentence of a
base-size model in int8 that read is a third of the call (225 MB of float32 weights, about 19 ms
of 65 at one thread on an AMD EPYC Zen 2, family 23 model 49).

A model loaded from an int8 file (Seq2SeqTransformer.load) brings its quantized matrices along
(`int8_seed`): they are used as they are, not quantized a second time, as long as the float32
weights are their dequantized values.
"""
import numpy as np

from . import _C


def quantize(weight):
    """(q int8 [N, K], scale float32 [N]) of a float32 matrix [N, K]: symmetric, one scale per
    row (csrc/qgemm.h); refuses non-finite values."""
    return _C.qgemm_quantize(np.ascontiguousarray(weight, dtype=np.float32))


def dequantize(q, scale):
    """float32 q * scale per row: the weights an int8 matrix stands for."""
    return (q.astype(np.float32) * scale.astype(np.float32)[:, None]).astype(np.float32)


def _nbytes(converted):
    """Bytes of a converted entry: an array, a PackedMatrix (its data), or a tuple of them."""
    if isinstance(converted, np.ndarray):
        return converted.nbytes
    if isinstance(converted, (tuple, list)):
        return sum(map(_nbytes, converted))
    data = getattr(converted, "data", None)
    return data.nbytes if isinstance(data, np.ndarray) else 0


class PreparedWeights:
    """{(precision, name, rows): converted matrix}, each with the fingerprint of its float32 source.

    One per decoding workspace (which a call holds alone), so no locking is needed. `int8_seed`:
    {parameter name: (q, scale)} loaded from an int8 file (the model's, read only); a seed is used
    instead of quantizing while the float32 weights still equal its dequantized values."""

    def __init__(self, int8_seed=None, params=None):
        self._entries = {}     # (precision, name, rows) -> (fingerprint, isa, converted, frozen token)
        self._int8_seed = int8_seed if int8_seed is not None else {}
        self._params = params  # the model's Parameters, whose `frozen` token is trusted (or None)

    def _quantized(self, name, weight, rows):
        seed = self._int8_seed.get(name)
        if seed is not None:
            q, scale = (seed[0], seed[1]) if rows is None else (seed[0][rows], seed[1][rows])
            if q.shape == weight.shape and np.array_equal(dequantize(q, scale), weight):
                return np.ascontiguousarray(q), np.ascontiguousarray(scale)
        return quantize(weight)

    @property
    def _frozen(self):
        return self._params.frozen if self._params is not None else None

    def _held(self, key, weight):
        """(fingerprint, isa, held entry or None, fresh): fresh when the held conversion is of
        these very weights, at this level. Under a freeze the entry checked or converted under it
        is fresh without a checksum; a checked one is marked with the freeze's token."""
        isa, held, frozen = _C.isa(), self._entries.get(key), self._frozen
        if frozen is not None and held is not None and held[3] is frozen and held[1] == isa:
            return held[0], isa, held, True
        fingerprint = _C.checksum(weight)
        fresh = held is not None and held[0] == fingerprint and held[1] == isa
        if fresh and frozen is not None:
            self._entries[key] = held = (fingerprint, isa, held[2], frozen)
        return fingerprint, isa, held, fresh

    def nbytes(self):
        """Bytes its converted matrices hold (what decoding at a precision keeps beside the weights)."""
        return sum(_nbytes(entry[2]) for entry in self._entries.values())

    def _keep(self, key, fingerprint, isa, converted):
        self._entries[key] = (fingerprint, isa, converted, self._frozen)

    def linear(self, precision, name, weight, rows=None):
        """Parameter `name` (rows `rows` of it: a slice, or None for all), [N, K], multiplied as
        x @ W^T: a PackedMatrix (fp32, bf16: rounded while packing) or a packed int8 matrix."""
        w = np.ascontiguousarray(weight if rows is None else weight[rows])
        key = (precision, name, None if rows is None else (rows.start, rows.stop))
        fingerprint, isa, held, fresh = self._held(key, w)
        if fresh:
            return held[2]
        reuse = held[2] if held is not None and held[1] == isa else None   # same layout: refill it
        if precision == "int8":
            q, scale = self._quantized(name, w, rows)
            converted = _C.qgemm_pack(q, scale, reuse=reuse)
        else:
            converted = _C.gemm_pack_b(w, trans_b=True, reuse=reuse, bf16=precision == "bf16")
        self._keep(key, fingerprint, isa, converted)
        return converted

    def table(self, precision, name, table):
        """An embedding table as `precision` decoding reads it: itself, or for int8 its rows
        quantized and dequantized (what an int8 file holds)."""
        if precision != "int8":
            return table
        table = np.ascontiguousarray(table)
        key = ("int8-table", name, None)
        fingerprint, isa, held, fresh = self._held(key, table)
        if fresh:
            return held[2]
        converted = dequantize(*self._quantized(name, table, None))
        self._keep(key, fingerprint, isa, converted)
        return converted
