"""Autoregressive decoding (section 3 of the paper: "at each step the model is
auto-regressive, consuming the previously generated symbols as additional input
when generating the next") with a key/value cache per decoder layer.

The encoder runs once. Each step feeds one new token per row through the decoder:
self-attention appends that token's key and value to the layer's cache and
attends over it; cross-attention keys and values are computed once from the
encoder output. Greedy and beam search are batched, stop per sentence at EOS or
at its length limit, and drop finished sentences from the batch so later steps
cost less.

A step runs in C (csrc/decoder.h): the kernels of DecoderCache._step_python (cache.py), called in
the same order as it calls them (which stays, for return_attention and as the reference of
the tests), with no interpreter between them; when the weights are small, its rows are split
across the threads (step_groups), each running the whole step on its own block. Greedy
decoding without return_attention and beam search run their whole loop in C too
(DecoderStep.greedy, .beam): each block of sentences goes from the first step to its last on
one thread, so the threads meet once per call instead of once per step. The thread that
called them asks the interpreter for its signals every 20 ms between steps, so Ctrl-C stops
them within a step or so, as it stopped the step-by-step loops.

Every step multiplies a few rows by every decoder weight, so the weights stream
from memory each step: they are kept packed as the kernels read them (_C.gemm_pack_b),
which makes that stream sequential. The model keeps the call's buffers (packed
weights: about the decoder's size, plus the caches) for the next call, because fresh
memory costs a page fault per 4 KiB; packed weights are redone whenever the weights
changed since (prepared.py: a fingerprint per matrix), so changes are always seen.

Precision (per call): "fp32"; "bf16": every linear map's operands rounded to bfloat16
(float32 sums); "int8": every linear map of the encoder and decoder (the output projection
at int8_generator's precision: bf16 unless it is the biggest part of a step) on int8 weights quantized per output row and
activations quantized per row on the fly, and the embedding tables' rows quantized the
same way (what an int8 file holds). At bf16 and int8 the decoder's keys and values are kept
in bfloat16 (cache_dtype), which halves what attention over the caches reads; that attention
computes in float32, as do layer norm, softmax and the residual stream, in every precision.

The rooms: tuning.py (the choices by size, precision and threads: rows per thread, the output
projection's precision in int8, what the caches hold), cache.py (the weights a call's steps read,
the key/value caches and step buffers, the workspace a model keeps between calls), checks.py (a
call's arguments), greedy.py (greedy_decode), beam.py (beam_search). Every name is importable
from here, as when they were one module.
"""
import sys
import types

from . import checks, tuning
from .beam import _beam_search, _length_penalty, beam_search, beam_search_steps  # noqa: F401
from .cache import (DecoderCache, StepWeights, _buffers, _encode_once, _lend_workspace, _prepared,  # noqa: F401
                    _return_workspace, rows_apart)
from .checks import (_check_bool, _check_decode_args, _check_int, _check_memory, _check_rules,  # noqa: F401
                     beam_args, greedy_args)
from .greedy import _forbid_eos, _greedy_decode, _strip, greedy_decode  # noqa: F401
from .tuning import _step_weight_bytes, cache_dtype, int8_generator, min_group_rows, step_groups  # noqa: F401

# The settings tests and benchmarks change at run time (decoding.DECODE_GROUPS = 2,
# monkeypatch.setattr(decoding, "_PYTHON_LOOPS", True)) live in the room that reads them; read or
# set here, they are read or set there (a property of this module's class each), so that such a
# change is never silently lost.
_SETTINGS = {name: room for room, names in (
    (checks, ("MAX_LEN_A", "MAX_LEN_B")),
    (tuning, ("INT8_GENERATOR", "GROUP_WEIGHT_BYTES", "GROUP_MANY_BYTES", "GROUP_THREADS", "MIN_GROUP_ROWS",
              "MIN_GROUP_ROWS_FEW", "MIN_GROUP_ROWS_MANY", "DECODE_GROUPS", "_PYTHON_LOOPS"))) for name in names}


def _setting(room, name):
    return property(lambda package: getattr(room, name), lambda package, value: setattr(room, name, value))


sys.modules[__name__].__class__ = type("_Decoding", (types.ModuleType,),
                                       {name: _setting(room, name) for name, room in _SETTINGS.items()})
