"""Autoregressive decoding (section 3 of the paper: "at each step the model is
auto-regressive, consuming the previously generated symbols as additional input
when generating the next") with a key/value cache per decoder layer.

The encoder runs once. Each step feeds one new token per row through the decoder:
self-attention appends that token's key and value to the layer's cache and
attends over it; cross-attention keys and values are computed once from the
encoder output. Greedy and beam search are batched, stop per sentence at EOS or
at its length limit, and drop finished sentences from the batch so later steps
cost less.

A step runs in C (csrc/decoder.h): the kernels below, called in the same order as
DecoderCache._step_python calls them (which stays, for return_attention and as the reference of
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
"""
import contextlib
import functools
import math
import os

import numpy as np

from . import _C
from .precision import check_precision
from .prepared import PreparedWeights

# The length limit when a call passes max_len=None: per sentence, MAX_LEN_A * (its source's
# non-pad tokens) + MAX_LEN_B, clamped to the model's max_len; fairseq's --max-len-a/--max-len-b
# and Marian's --max-length-factor bound the output the same way, so a model that never emits EOS
# (untrained, or stuck repeating itself) stops at a length that fits its input.
MAX_LEN_A = 2
MAX_LEN_B = 10

# The output projection's precision in int8 decoding. Measured on a Bible model (small, 1800 steps,
# 500 held-out sentences, Zen 3): int8 / bf16 / fp32 projection give greedy BLEU 2.60 / 2.61 / 2.63
# (fp32 decoding 2.64) with 62% / 69% / 68% of sentences identical to fp32's, beam 4 3.66 / 3.61 /
# 3.70 (fp32 3.67) with 58% / 67% / 67%. The projection picks the word: int8 changes 6-9% more
# sentences, bf16 none more than float32 does, so it is bf16 (its operands rounded, float32 sums; an
# int8 file stores it as float32), which halves what it reads where the CPU has bf16 products
# (Zen 4, family 25 model 17, base int8, 1 thread: greedy 1574 -> 1640 tokens/s, beam 4 662 -> 712;
# an int8 projection would give 1878 and 792) and costs nothing elsewhere -- unless it holds more
# weights than all decoder layers together (OPUS-MT: 58101 x 512 against 6 layers' 22 M): then it
# is most of what a step reads, float32 would leave int8 decoding barely faster than fp32
# (measured: 1.13x at OPUS-MT's size), and it is quantized like the rest, as CTranslate2 does.
# None: that rule (int8_generator); "fp32", "bf16" or "int8": that precision for every model.
INT8_GENERATOR = None


def int8_generator(cfg):
    """The output projection's precision in int8 decoding of a model of config `cfg`."""
    if INT8_GENERATOR is not None:
        return INT8_GENERATOR
    d = cfg.d_model
    layers = cfg.n_decoder_layers * (6 * d * d + 2 * d * cfg.d_ff)   # what a decoder step multiplies by
    return "int8" if cfg.tgt_vocab_size * d > layers else "bf16"


# Decoding splits a step's rows across threads (csrc/decoder.h): each thread runs the whole step
# on its own block of rows and reads every weight, against one team meeting per kernel (whose
# small products mostly run on one thread) when kernels are split instead. A step of n rows on
# T threads runs in min(T, n // r) blocks (at least 1) of at least r rows, where r is
#  - MIN_GROUP_ROWS when the weights a step reads are at most GROUP_WEIGHT_BYTES. Measured at 2
#    threads (Zen 3, steps/s, split rows against split kernels): tiny greedy (4 MB of weights)
#    1.25x fp32, 1.31x int8; small (15 MB) 1.07x at B=32, 1.24x at B=8. On a 16-core Xeon
#    (family 6 model 207) tiny is fastest at 4 rows a block (greedy B=32, 16 threads: 96k
#    tokens/s in 8 blocks, 89k in 16);
#  - below GROUP_THREADS threads, for weights up to twice that (base int8: 38 MB),
#    MIN_GROUP_ROWS_FEW, and for larger ones (base fp32: 104 MB) never: with few rows a block each
#    kernel splits better and one copy of the weights streams (Zen 3, 2 threads, base greedy B=8:
#    split rows 0.93x fp32, 1.00x int8; the Xeon: 0.80x, 0.93x), while blocks of 16 rows amortise
#    the reading of int8 weights (the Xeon, beam 4, 32 rows: 1.01-1.30x int8; fp32 0.79-1.06x);
#  - for larger weights, MIN_GROUP_ROWS_MANY from GROUP_THREADS threads on: a team of 4 or more
#    meeting ~70 times a step costs more than every thread reading all weights. The Xeon, base,
#    tokens/s, split kernels against split rows: int8 greedy (B=8) 2034 / 2430 at 4 threads,
#    1881 / 2675 at 8, 2068 / 2611 at 16; int8 beam 4 1195 / 1577, 1152 / 2038, 555 / 1970; fp32
#    greedy 1455 / 1282 (the one loss), 1464 / 1568, 1450 / 1540; fp32 beam 4 849 / 1124,
#    912 / 1151, 447 / 1085. Split kernels at 16 threads were slower than at 2 (2199 int8
#    greedy, 1248 fp32); split rows never are. Not beyond GROUP_MANY_BYTES (4 x 32 MiB): a
#    MarianMT step at fp32 reads 207 MB (its 58101-word projection alone 119 MB), which every
#    thread would stream from memory; unmeasured there, so its kernels stay split.
# DECODE_GROUPS: None (that rule) or a fixed count (tests, benchmarks; still at most n // 4).
GROUP_WEIGHT_BYTES = 32 << 20
GROUP_MANY_BYTES = 4 * GROUP_WEIGHT_BYTES
GROUP_THREADS = 4
MIN_GROUP_ROWS = 4
MIN_GROUP_ROWS_FEW = 16
MIN_GROUP_ROWS_MANY = 2
DECODE_GROUPS = None
# Greedy and beam search run their whole loop in C (DecoderStep.greedy, .beam: each block of
# sentences from its first step to its last on one thread); True: the step-by-step loops below,
# with the step in C (tests: the reference of the loops in C).
_PYTHON_LOOPS = False


def _step_weight_bytes(cfg, precision):
    d = cfg.d_model
    layers = cfg.n_decoder_layers * (6 * d * d + 2 * d * cfg.d_ff)
    generator = cfg.tgt_vocab_size * d
    # bf16 counted as float32, as the grouping thresholds were measured (read as pairs, half of
    # that, at avx2 and avx512_bf16 and above; as floats at avx512 without avx512_bf16)
    size = {"fp32": 4, "bf16": 4, "int8": 1}
    return layers * size[precision] + generator * size[
        int8_generator(cfg) if precision == "int8" else precision]


def min_group_rows(cfg, precision, threads):
    """The fewest rows of a block when a step's rows are split across `threads` threads, or None
    when they are not split."""
    step_bytes = _step_weight_bytes(cfg, precision)
    if step_bytes <= GROUP_WEIGHT_BYTES:
        return MIN_GROUP_ROWS
    if threads >= GROUP_THREADS:
        return MIN_GROUP_ROWS_MANY if step_bytes <= GROUP_MANY_BYTES else None
    return MIN_GROUP_ROWS_FEW if step_bytes <= 2 * GROUP_WEIGHT_BYTES else None


def step_groups(cfg, precision, threads, rows):
    """Blocks of rows a decoding step of `rows` rows of a model of config `cfg` is split into,
    one per thread (1: the step's kernels split their own work instead)."""
    if DECODE_GROUPS is not None:
        return max(1, min(DECODE_GROUPS, rows // MIN_GROUP_ROWS))
    least = min_group_rows(cfg, precision, threads)
    return 1 if least is None else max(1, min(threads, rows // least))


def _buffers(ws):
    """buffer(key, shape, dtype=float32): a view of `ws`'s array for `key`, grown on demand
    (contents are never carried over from one call to the next)."""
    def buffer(key, shape, dtype=np.float32):
        size = math.prod(shape)
        key = (key, np.dtype(dtype).str)
        held = ws.get(key)
        if held is None or held.size < size:
            held = ws[key] = np.empty(size, dtype)
        return held[:size].reshape(shape)
    return buffer


def cache_dtype(precision):
    """What decoding's key/value caches hold: float32 at fp32; bf16 (uint16: rounded to nearest,
    ties to even, attention.h) at bf16 and int8, whose caches then read half the bytes. A step's
    attention reads every cached key and value of its sentence (a base step of 8 sentences: 12.6 MB
    of cross-attention at 64 source positions, in float32), and int8 products made those reads
    its biggest cost after the weights. Measured, int8, the decode bench's models, float32 against
    bf16 caches alternated in one process, two sessions of 5-20 rounds (AMD EPYC Zen 3, family 25
    model 1), the median of the rounds' ratios: greedy 1.13-1.16x at one thread and 1.13-1.15x at
    two (base), 1.12-1.16x / 1.03-1.07x (tiny); beam 4, whose beams share their sentence's
    cross-attention, 1.00-1.15x / 1.02x (base), 1.03-1.10x (tiny, one thread). The full
    forward pass of those precisions rounds the decoder's keys and values the same way
    (layers.py), so it scores what decoding computes."""
    return np.float32 if precision == "fp32" else np.uint16


class StepWeights:
    """What every step of a call reads and nothing writes: each decoder layer's weights (the
    matrices packed, rounded or quantized for the call's precision, prepared.py), and the
    cross-attention keys and values of every sentence, [B, H, S, dh] per layer. Made once per call."""

    def __init__(self, model, memory, precision, prepared, buffer):
        cfg = model.cfg
        weights = {name: model.params.tensor(name) for name in model.state_dict_names()}   # tied ones too
        B, S, D = memory.shape
        H = cfg.n_heads
        dh = D // H
        self.S = S
        self.precision = precision

        # Cross-attention keys and values: once per sentence, [B, H, S, dh].
        self.memory_k, self.memory_v = [], []
        flat_memory = np.ascontiguousarray(memory).reshape(B * S, D)
        projected = np.empty((B * S, D), dtype=np.float32)
        for layer in range(cfg.n_decoder_layers):
            prefix = f"transformer.decoder.layers.{layer}.multihead_attn"
            w, b = weights[f"{prefix}.in_proj_weight"], weights[f"{prefix}.in_proj_bias"]
            heads = []
            for part in (1, 2):
                rows = slice(part * D, (part + 1) * D)
                if precision == "int8":
                    packed = prepared.linear("int8", f"{prefix}.in_proj_weight", w, rows)
                    _C.qgemm_packed(flat_memory, packed, b[rows], projected)
                else:
                    _C.gemm(flat_memory, w[rows], projected, trans_b=True, bf16=precision == "bf16")
                    _C.add_bias(projected, b[rows])
                # A copy (never a view: `projected` is reused for the values), rounded to bf16
                # for the reduced precisions (cache_dtype).
                dtype = cache_dtype(precision)
                heads.append(buffer(("memory", layer, part), (B, H, S, dh), dtype))
                if dtype == np.uint16:
                    rounded = _C.to_bf16(projected, buffer(("memory bf16",), (B * S, D), np.uint16))
                    np.copyto(heads[-1], rounded.reshape(B, S, H, dh).transpose(0, 2, 1, 3))
                else:
                    np.copyto(heads[-1], projected.reshape(B, S, H, dh).transpose(0, 2, 1, 3))
            self.memory_k.append(heads[0])
            self.memory_v.append(heads[1])

        # Each layer's weights looked up once (the step loop runs per token); the matrices the
        # step multiplies by are kept packed as the kernels read them (x @ W^T for few rows then
        # streams W at memory speed, csrc/gemm.h: gemm_packed), converted again whenever the
        # weights changed (prepared.py), so no packed copy is ever stale.
        def norm(name):
            return (weights[f"{name}.weight"], weights[f"{name}.bias"])

        def linear(name, rows=None, bias=None, precision=precision):
            full = weights[name]
            bias = weights[name.replace("_weight", "_bias").replace(".weight", ".bias")] if bias is None else bias
            return (prepared.linear(precision, name, full, rows), bias if rows is None else bias[rows])

        self.layers = []
        for layer in range(cfg.n_decoder_layers):
            p = f"transformer.decoder.layers.{layer}"
            self.layers.append(dict(
                norm1=norm(f"{p}.norm1"), norm2=norm(f"{p}.norm2"), norm3=norm(f"{p}.norm3"),
                qkv=linear(f"{p}.self_attn.in_proj_weight"),
                self_out=linear(f"{p}.self_attn.out_proj.weight"),
                cross_q=linear(f"{p}.multihead_attn.in_proj_weight", slice(0, D)),
                cross_out=linear(f"{p}.multihead_attn.out_proj.weight"),
                linear1=linear(f"{p}.linear1.weight"), linear2=linear(f"{p}.linear2.weight")))
        self.final_norm = norm("transformer.decoder.norm") if cfg.final_norm else None
        self.generator = linear("generator.weight",
                                precision=int8_generator(cfg) if precision == "int8" else precision)
        self.embed = prepared.table(precision, "tgt_embed.weight", weights["tgt_embed.weight"])


class DecoderCache:
    """Everything one decoding loop needs: the call's StepWeights, caches, step buffers.

    `rows_per_sentence` decoder rows (the beam size) share each sentence's encoder output.

    Nothing in the caches moves while decoding. A live row reads its sentence's encoder
    keys/values through `sentence` (cross-attention is stored once per sentence, not once per
    beam), writes its step-t key/value to cache row `slot` (each live row owns one), and reads its
    own history through `origin[row, j]`, the cache row that computed step j of its hypothesis.
    Beam search and finished sentences then only permute these small integer tables.
    """

    def __init__(self, model, shared, src_pad, rows_per_sentence, max_steps, keep_attention=False,
                 workspace=None):
        cfg = model.cfg
        # Big buffers come from `workspace` (a dict one call hands to the next, see
        # _lend_workspace): fresh memory would cost a page fault and a page cleared by the
        # kernel per 4 KiB, ~15% of a base model's decoding time. Contents are never carried over.
        buffer = _buffers({} if workspace is None else workspace)
        B = src_pad.shape[0]
        D, H = cfg.d_model, cfg.n_heads
        self.cfg = cfg
        self.D, self.H, self.dh, self.S = D, H, D // H, shared.S
        self.scale = 1.0 / math.sqrt(self.dh)
        self.N = B * rows_per_sentence
        self.Tmax = max_steps
        self.pe = model.positional_table(max_steps)
        N = self.N
        self.memory_k, self.memory_v = shared.memory_k, shared.memory_v
        self.layers, self.final_norm, self.generator, self.embed = \
            shared.layers, shared.final_norm, shared.generator, shared.embed
        self.embed_scale = model.tgt_embed.scale
        self.src_pad = np.ascontiguousarray(src_pad, dtype=np.bool_)

        # Self-attention caches: row r's key/value of step j at [r, :, j]; step j is written
        # before any query reads it, so nothing older than the call is ever read.
        shape, dtype = (N, H, max_steps, self.dh), cache_dtype(shared.precision)
        self.self_k = [buffer(("self_k", layer), shape, dtype) for layer in range(cfg.n_decoder_layers)]
        self.self_v = [buffer(("self_v", layer), shape, dtype) for layer in range(cfg.n_decoder_layers)]
        self.slot = np.arange(N, dtype=np.int64)                            # live row -> cache row
        self.sentence = np.arange(N, dtype=np.int64) // rows_per_sentence   # live row -> sentence
        self.origin = np.zeros((N, max_steps), np.int64)                    # (row, step) -> cache row
        self._origin_spare = np.zeros_like(self.origin)

        f32 = np.float32
        self.x = np.empty((N, D), f32)
        self.h = np.empty((N, D), f32)
        self.tmp = np.empty((N, D), f32)
        self.ctx = np.empty((N, D), f32)
        self.query = np.empty((N, D), f32)
        self.qkv = np.empty((N, 3 * D), f32)
        self.ff_pre = np.empty((N, cfg.d_ff), f32)
        self.ff_act = np.empty((N, cfg.d_ff), f32)
        self.logits = np.empty((N, cfg.tgt_vocab_size), f32)
        self.mean = np.empty(N, f32)
        self.rstd = np.empty(N, f32)
        self.keep_attention = keep_attention
        self.attention = [] if keep_attention else None
        # The step in C (csrc/decoder.h: the same kernels and bits as _step_python, which stays
        # for return_attention's probabilities and as the tests' reference).
        self._native = None if keep_attention else _C.DecoderStep(
            [dict(w, memory_k=k, memory_v=v, self_k=sk, self_v=sv)
             for w, k, v, sk, sv in zip(self.layers, self.memory_k, self.memory_v, self.self_k, self.self_v)],
            self.generator, self.final_norm, self.embed, self.embed_scale, self.pe, self.src_pad,
            dict(x=self.x, h=self.h, tmp=self.tmp, ctx=self.ctx, query=self.query, qkv=self.qkv,
                 ff_pre=self.ff_pre, ff_act=self.ff_act, logits=self.logits, mean=self.mean, rstd=self.rstd),
            H, cfg.activation, cfg.norm_first)
        self._groups = functools.partial(step_groups, cfg, shared.precision, _C.get_num_threads())

    def _layer_norm(self, weight_bias, x, out, n):
        _C.layernorm_forward(x[:n], weight_bias[0], weight_bias[1], out[:n], self.mean[:n], self.rstd[:n])

    @staticmethod
    def _mul(packed, x, out, bias=None):
        """out = x @ W^T (+ bias) for a packed W of any precision."""
        if isinstance(packed, _C.PackedMatrix):
            _C.gemm_packed(x, packed, out)
            if bias is not None:
                _C.add_bias(out, bias)
        else:
            _C.qgemm_packed(x, packed, bias, out)

    def _linear(self, weight_bias, x, out):
        self._mul(weight_bias[0], x, out, weight_bias[1])

    def step(self, ids, t, log_softmax=False, banned=(), argmax_out=None):
        """Feed token ids [n] (int64, C-contiguous) at position t; returns logits [n, V], or their
        log_softmax (a view, valid until the next step), with the tokens `banned` at -inf; with
        argmax_out (int64 [>= n]), also each row's argmax there."""
        if self._native is not None:
            return self._native.step(ids, t, self.slot, self.origin, self.sentence,
                                     self._groups(len(ids)), log_softmax,
                                     banned, argmax_out)
        logits = self._step_python(ids, t)
        if log_softmax:
            _C.log_softmax(logits, logits)
        logits[:, list(banned)] = -np.inf
        if argmax_out is not None:
            np.argmax(logits, axis=1, out=argmax_out[:len(ids)])
        return logits

    def _step_python(self, ids, t):
        """step, one kernel call at a time from Python."""
        cfg, D, n = self.cfg, self.D, len(ids)
        x, h, tmp, ctx, qkv = self.x[:n], self.h[:n], self.tmp[:n], self.ctx[:n], self.qkv[:n]
        slot, origin, sentence = self.slot[:n], self.origin[:n], self.sentence[:n]
        post = not cfg.norm_first
        origin[:, t] = slot                      # step t of every hypothesis: its own cache row
        # Embedding * sqrt(d_model) + PE[t] (section 3.4, 3.5).
        _C.embedding_forward(ids.reshape(n, 1), self.embed, x.reshape(n, 1, D), self.embed_scale, self.pe, t)
        probs = None
        for layer, w in enumerate(self.layers):
            # Masked self-attention over the cache (the mask is implicit: only keys <= t exist).
            source = self._sublayer_input(w["norm1"], x, n)
            self._linear(w["qkv"], source, qkv)
            _C.attention_cache_store(qkv[:, D:2 * D], self.self_k[layer], t, slot)
            _C.attention_cache_store(qkv[:, 2 * D:], self.self_v[layer], t, slot)
            _C.attention_decode(qkv[:, :D], self.self_k[layer], self.self_v[layer], t + 1, ctx, self.scale,
                                key_rows=origin)
            self._mul(w["self_out"][0], ctx, tmp)
            self._residual(w["norm1"], x, tmp, w["self_out"][1], n, post)

            # Cross-attention over the encoder output.
            source = self._sublayer_input(w["norm2"], x, n)
            query = self.query[:n]
            self._linear(w["cross_q"], source, query)
            if self.keep_attention and layer == cfg.n_decoder_layers - 1:
                probs = np.empty((n, self.H, self.S), np.float32)
            _C.attention_decode(query, self.memory_k[layer], self.memory_v[layer], self.S, ctx, self.scale,
                                self.src_pad, probs, rows=sentence)
            self._mul(w["cross_out"][0], ctx, tmp)
            self._residual(w["norm2"], x, tmp, w["cross_out"][1], n, post)

            # Position-wise feed-forward (section 3.3).
            source = self._sublayer_input(w["norm3"], x, n)
            self._mul(w["linear1"][0], source, self.ff_pre[:n])
            _C.bias_act_forward(self.ff_pre[:n], w["linear1"][1], self.ff_act[:n], cfg.activation)
            self._mul(w["linear2"][0], self.ff_act[:n], tmp)
            self._residual(w["norm3"], x, tmp, w["linear2"][1], n, post)

        if self.final_norm is not None:
            self._layer_norm(self.final_norm, x, h, n)
        else:
            h = x
        self._linear(self.generator, h, self.logits[:n])
        if probs is not None:
            self.attention.append(probs)
        return self.logits[:n]

    def _sublayer_input(self, norm, x, n):
        """What a sublayer reads: x itself (post-LN, the paper's), or norm(x) in `h` (pre-LN)."""
        if not self.cfg.norm_first:
            return x
        self._layer_norm(norm, x, self.h, n)
        return self.h[:n]

    def _residual(self, norm, x, delta, bias, n, post):
        """x = norm(x + (delta + bias)) after the sublayer (post-LN) or x = x + (delta + bias)
        (pre-LN): the output projection's bias and the residual sum in one pass, with the bits of
        add_bias then add."""
        _C.dropout_add_forward(delta, x, delta if post else x, 0.0, 0, bias=bias)
        if post:
            self._layer_norm(norm, delta, x, n)

    def reorder(self, parents, t, slots=None):
        """The next step's rows: row i continues the hypothesis of row parents[i] (positions <= t;
        two rows may share a parent) and takes over the cache row and sentence of row slots[i]
        (distinct), or keeps its own when slots is None (no row dropped). Only index tables move."""
        m = len(parents)
        np.take(self.origin[:, :t + 1], parents, axis=0, out=self._origin_spare[:m, :t + 1])
        self.origin, self._origin_spare = self._origin_spare, self.origin
        if slots is not None:
            self.slot[:m] = self.slot[slots]
            self.sentence[:m] = self.sentence[slots]
        if self.attention:
            self.attention = [a[parents] for a in self.attention]


def _lend_workspace(model):
    """The buffers the model's last decoding call left (a dict; {} the first time or while another
    call, in another thread, holds them). Give them back with _return_workspace."""
    return model.__dict__.pop("_decoding_workspace", None) or {}


def _return_workspace(model, workspace):
    model.__dict__["_decoding_workspace"] = workspace


@contextlib.contextmanager
def rows_apart():
    """Every gemm of the calling thread computes each row as in any other call (csrc/gemm.h:
    gemm_rows_apart): no dot path for few rows. Decoding's encoder runs so, and so a sentence's
    encoder output, and its translation, do not depend on the sentences batched with it (the
    dot path, taken for a short sentence alone, sums in another order: measured on the decode
    bench's base model at int8, 3 of 160 Bible sentences translated alone differed from their
    translation in a batch of 64). Everything else decoding multiplies is row by row already
    (gemm_packed, qgemm, the attention and normalisation kernels)."""
    was = _C.gemm_rows_apart(True)
    try:
        yield
    finally:
        _C.gemm_rows_apart(was)


def _encode_once(model, src, precision, workspace):
    """The encoder's run and what every step then reads: (StepWeights, source padding mask)."""
    prepared = _prepared(model, workspace)
    with rows_apart():
        memory = model._encode(src, precision, prepared)
        return StepWeights(model, memory, precision, prepared, _buffers(workspace)), src == model.cfg.pad_id


def _prepared(model, workspace):
    """The PreparedWeights a workspace carries from call to call (prepared.py)."""
    prepared = workspace.get("prepared")
    if prepared is None:
        prepared = workspace["prepared"] = PreparedWeights(model._int8_seed, model.params)
    return prepared


def _check_int(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")


def _check_decode_args(model, src, max_len, min_len, no_repeat_ngram):
    """src as int64 ids; each sentence's length limit (int64 [B]); min_len; no_repeat_ngram.

    An int max_len is one limit for every sentence, clamped to the model's max_len, and min_len
    must be in [0, that limit]. max_len None gives each sentence its own limit (MAX_LEN_A,
    MAX_LEN_B above); min_len must then be in [0, the model's max_len], and a sentence whose limit
    is shorter stops at its limit (min_len is clamped to it)."""
    cfg = model.cfg
    src = model.check_ids(src, "src", cfg.src_vocab_size)
    if max_len is not None:
        _check_int(max_len, "max_len")
    _check_int(min_len, "min_len")
    _check_int(no_repeat_ngram, "no_repeat_ngram")
    # Positions beyond the model's max_len have no positional encoding: generation stops there.
    if max_len is None:
        source_lengths = (src != cfg.pad_id).sum(axis=1)
        limits = np.minimum(MAX_LEN_A * source_lengths + MAX_LEN_B, cfg.max_len).astype(np.int64)
        if not 0 <= min_len <= cfg.max_len:
            raise ValueError(f"min_len must be in [0, the model's max_len={cfg.max_len}], got {min_len}")
    else:
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        max_len = min(int(max_len), cfg.max_len)
        if not 0 <= min_len <= max_len:
            raise ValueError(f"min_len must be in [0, max_len={max_len}], got {min_len}")
        limits = np.full(src.shape[0], max_len, np.int64)
    if no_repeat_ngram < 0:
        raise ValueError(f"no_repeat_ngram must be >= 0 (0: off), got {no_repeat_ngram}")
    return src, limits, int(min_len), int(no_repeat_ngram)


def _physical_memory():
    """This machine's memory in bytes, or None where the system does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def _check_memory(cfg, rows, steps, what, precision="fp32"):
    """MemoryError naming `what` when a decoding loop of `rows` rows and `steps` steps needs more
    memory for its caches and step buffers than this machine has: numpy would reserve them all
    the same (the system promises memory it has not got), and the process would then fill them
    until the machine swaps or kills it (a --beam of 100000 ran for minutes, growing)."""
    total = _physical_memory()
    if total is None:
        return
    cache = np.dtype(cache_dtype(precision)).itemsize
    per_row = cache * 2 * cfg.n_decoder_layers * steps * cfg.d_model \
        + 4 * (cfg.tgt_vocab_size + 8 * cfg.d_model + 2 * cfg.d_ff) + 8 * 4 * steps
    # caches; logits, step buffers; origin and hypothesis tables
    need = rows * per_row
    if need > total:
        raise MemoryError(f"{what}: {rows:,} decoder rows of up to {steps} steps need {need / 2**30:,.1f} GiB "
                          f"for their caches, more than this machine's {total / 2**30:,.1f} GiB")


def _forbid_eos(scores, eos_id):
    """EOS gets -inf (before min_len) where no-repeat-n-gram bans are in play: a row left with no
    other allowed token keeps its EOS score, so the hypothesis ends short of min_len rather than
    continuing with a token that was banned. (Without those bans the step itself bans EOS.)"""
    saved = scores[:, eos_id].copy()
    scores[:, eos_id] = -np.inf
    stuck = ~(scores > -np.inf).any(axis=1)
    scores[stuck, eos_id] = saved[stuck]


def _strip(tokens, eos_id):
    tokens = [int(t) for t in tokens]
    return tokens[:tokens.index(eos_id)] if eos_id in tokens else tokens


def greedy_decode(model, src, max_len=None, min_len=0, return_attention=False, no_repeat_ngram=0,
                  precision="fp32", *, forced_eos=False, banned=()):
    """Batched greedy decoding. Returns a list of token-id lists (BOS dropped, cut before EOS).

    Each sentence stops at its length limit: min(max_len, the model's max_len) for an int max_len,
    or with max_len None (the default) min(MAX_LEN_A * its source length + MAX_LEN_B, the model's
    max_len), its source length being its non-pad tokens. EOS is not chosen before min_len tokens.
    no_repeat_ngram=N > 0 never completes an n-gram of N tokens already in the hypothesis
    (Hugging Face's no_repeat_ngram_size; N = 1: no token twice; EOS is never banned, and a row
    with nothing else left may end before min_len; csrc/beam.h: no_repeat_ngram_ban). The
    hypothesis is the generated tokens: Hugging Face counts the start token too, which bans the
    same tokens, since BOS is never generated again.
    With return_attention, also each sentence's last-layer cross-attention [steps, H, S].
    precision: "fp32", "bf16" or "int8" (module docstring).
    The rules of a model's generation settings (generation.py; off by default): forced_eos: a
    sentence's token at its length limit is EOS (generate's forced_eos_token_id); banned: a
    tuple of token ids never chosen (generate's bad_words_ids of one token)."""
    precision = check_precision(precision)
    src, limits, min_len, no_repeat_ngram, rules = greedy_args(model, src, max_len, min_len, no_repeat_ngram,
                                                               forced_eos, banned)
    workspace = _lend_workspace(model)
    try:
        return _greedy_decode(model, src, limits, min_len, no_repeat_ngram, return_attention, workspace,
                              precision, rules)
    finally:
        _return_workspace(model, workspace)


def _check_bool(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _check_rules(model, forced_eos, banned, **flags):
    """The generation settings' rules of a decoding call, checked: {"forced_eos": bool,
    "banned": tuple of token ids, and each of `flags` as a bool}."""
    rules = {"forced_eos": _check_bool(forced_eos, "forced_eos")}
    if not isinstance(banned, (tuple, list)):
        raise TypeError(f"banned must be a tuple of token ids, got {type(banned).__name__}")
    V = model.cfg.tgt_vocab_size
    for token in banned:
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or not 0 <= token < V:
            raise ValueError(f"banned must hold token ids in [0, {V}), got {token!r}")
    rules["banned"] = tuple(int(t) for t in banned)
    for name, value in flags.items():
        rules[name] = _check_bool(value, name)
    return rules


def _greedy_decode(model, src, limits, min_len, no_repeat_ngram, return_attention, workspace, precision,
                   rules):
    cfg = model.cfg
    shared, src_pad = _encode_once(model, src, precision, workspace)
    B = src.shape[0]
    steps = int(limits.max())
    cache = DecoderCache(model, shared, src_pad, 1, steps, keep_attention=return_attention, workspace=workspace)
    if cache._native is not None and not _PYTHON_LOOPS:   # the whole loop in C (decoder_greedy)
        out, lengths = cache._native.greedy(limits, min_len, no_repeat_ngram, cfg.bos_id, cfg.eos_id,
                                            cfg.pad_id, cache._groups(B), banned=rules["banned"],
                                            forced_eos=rules["forced_eos"])
        return [out[b, :lengths[b]].tolist() for b in range(B)]
    out = np.full((B, steps), cfg.pad_id, dtype=np.int64)     # sentence -> its tokens so far
    lengths = limits.copy()                      # a sentence that never ends stops at its limit
    alive = np.arange(B, dtype=np.int64)         # row -> sentence
    ids = np.full(B, cfg.bos_id, dtype=np.int64)
    attention = [[] for _ in range(B)]
    chosen = np.empty(B, np.int64)
    for t in range(steps):
        banned = (cfg.pad_id, cfg.bos_id) + rules["banned"]   # never "nothing" or a second start
        if no_repeat_ngram:
            logits = cache.step(ids, t, banned=banned)
            _C.no_repeat_ngram_ban(logits, out, t, no_repeat_ngram, cfg.eos_id, rows=alive)
            if t < min_len:
                _forbid_eos(logits, cfg.eos_id)
            ids = logits.argmax(axis=1).astype(np.int64)
        else:                                    # the choice made in the step
            cache.step(ids, t, banned=banned + ((cfg.eos_id,) if t < min_len else ()), argmax_out=chosen)
            ids = chosen[:len(ids)].copy()
        if rules["forced_eos"]:                  # generate's row of -inf but EOS at the limit
            ids[limits[alive] == t + 1] = cfg.eos_id
        out[alive, t] = ids
        if return_attention:
            for row, sentence in enumerate(alive):
                attention[sentence].append(cache.attention[-1][row])
            cache.attention.clear()
        finished = ids == cfg.eos_id
        stopped = finished | (limits[alive] == t + 1)   # EOS, or the sentence's last step
        if stopped.any():
            lengths[alive[finished]] = t
            keep = np.flatnonzero(~stopped)
            alive, ids = alive[keep], ids[keep]
            if not len(alive):
                break
            cache.reorder(keep, t, keep)
    hyps = [out[b, :lengths[b]].tolist() for b in range(B)]
    if not return_attention:
        return hyps
    return hyps, [np.stack(a[:len(h) + 1]) if a else np.zeros((0, cfg.n_heads, shared.S), np.float32)
                  for a, h in zip(attention, hyps)]


def _length_penalty(length, alpha, form="gnmt"):
    """GNMT's length normalisation ((5 + |Y|) / 6) ** alpha (Wu et al. 2016), or generate's
    |Y| ** alpha (form "generate")."""
    return float(length) ** alpha if form == "generate" else ((5.0 + length) / 6.0) ** alpha


def beam_search(model, src, beam_size=4, max_len=None, length_penalty=0.6, min_len=0, no_repeat_ngram=0,
                precision="fp32", *, forced_eos=False, banned=(), renormalize=False, length_form="gnmt",
                early_stopping=True, n_best=1):
    """Batched beam search. Returns the best hypothesis per sentence (token-id lists, BOS dropped,
    cut before EOS), ranked by log-probability / ((5 + length) / 6) ** length_penalty.

    A hypothesis that emits EOS is finished and kept; a sentence is done once it has beam_size
    finished hypotheses, or at its length limit (as in greedy_decode: max_len, or with max_len
    None one relative to its source length), where its live beams are finished as they stand.
    Each step's candidates (every beam times every token, scored by the beam's log-probability
    plus the token's) are ranked best first, ties by beam then token; csrc/beam.c does the ranking
    and the walk through it, Python only records finished hypotheses. no_repeat_ngram as in
    greedy_decode, applied to each beam's own hypothesis after the log-softmax (the banned tokens'
    probability is not given to the others, as in Hugging Face's beam search). precision as in
    greedy_decode.

    The rules of a model's generation settings (generation.py, csrc/decoder.h; the defaults
    are the rules above): forced_eos and banned as in greedy_decode (the forced EOS adds 0 to
    its hypothesis's score); renormalize: each row normalised again after the bans (generate's
    renormalize_logits); length_form "generate": scores divided by length ** length_penalty
    instead of GNMT's; early_stopping False or "never": generate's stopping rules instead of
    stopping at beam_size finished hypotheses.

    n_best > 1: for each sentence, a list of its best finished hypotheses, at most n_best, best
    first (the first is the one n_best 1 gives; LibreTranslate's alternatives). The C loop keeps
    only the best, so these run the same steps in Python (the same kernels, the same bits).
    """
    precision = check_precision(precision)
    if isinstance(n_best, bool) or not isinstance(n_best, (int, np.integer)) or n_best < 1:
        raise ValueError(f"n_best must be an int >= 1, got {n_best!r}")
    src, K, limits, min_len, no_repeat_ngram, rules = beam_args(
        model, src, beam_size, max_len, length_penalty, min_len, no_repeat_ngram, precision, forced_eos, banned,
        renormalize, length_form, early_stopping)
    workspace = _lend_workspace(model)
    try:
        return _beam_search(model, src, K, limits, float(length_penalty), min_len, no_repeat_ngram,
                            workspace, precision, rules, int(n_best))
    finally:
        _return_workspace(model, workspace)


def beam_args(model, src, beam_size, max_len, length_penalty, min_len, no_repeat_ngram, precision, forced_eos,
              banned, renormalize, length_form, early_stopping):
    """beam_search's arguments checked: (src, beam_size, limits, min_len, no_repeat_ngram, rules).
    What a stream's wave (streaming.py) checks too."""
    if isinstance(beam_size, bool) or not isinstance(beam_size, (int, np.integer)) or beam_size < 1:
        raise ValueError(f"beam_size must be an int >= 1, got {beam_size!r}")
    # generate's len ** a may take a < 0 (shorter preferred); GNMT's alpha is >= 0
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)) \
            or not math.isfinite(length_penalty) or (length_penalty < 0 and length_form != "generate"):
        raise ValueError(f"length_penalty must be a finite number >= 0, got {length_penalty!r}")
    src, limits, min_len, no_repeat_ngram = _check_decode_args(model, src, max_len, min_len, no_repeat_ngram)
    rules = _check_rules(model, forced_eos, banned, renormalize=renormalize)
    if length_form not in ("gnmt", "generate"):
        raise ValueError(f"length_form must be 'gnmt' or 'generate', got {length_form!r}")
    if not isinstance(early_stopping, (bool, np.bool_, str)) or early_stopping not in (True, False, "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")
    rules.update(length_form=length_form,
                 early_stopping=early_stopping if isinstance(early_stopping, str) else bool(early_stopping))
    _check_memory(model.cfg, src.shape[0] * int(beam_size), int(limits.max()),
                  f"beam_size {beam_size} for {src.shape[0]} sentence{'' if src.shape[0] == 1 else 's'}", precision)
    return src, int(beam_size), limits, min_len, no_repeat_ngram, rules


def greedy_args(model, src, max_len, min_len, no_repeat_ngram, forced_eos, banned):
    """greedy_decode's arguments checked: (src, limits, min_len, no_repeat_ngram, rules)."""
    src, limits, min_len, no_repeat_ngram = _check_decode_args(model, src, max_len, min_len, no_repeat_ngram)
    return src, limits, min_len, no_repeat_ngram, _check_rules(model, forced_eos, banned)


def _beam_search(model, src, K, limits, length_penalty, min_len, no_repeat_ngram, workspace, precision, rules,
                 n_best=1):
    cfg = model.cfg
    shared, src_pad = _encode_once(model, src, precision, workspace)
    eos = cfg.eos_id
    B = src.shape[0]
    max_len = int(limits.max())
    cache = DecoderCache(model, shared, src_pad, K, max_len, workspace=workspace)
    if cache._native is not None and not _PYTHON_LOOPS and n_best == 1:   # the whole loop in C (decoder_beam)
        best, best_len = cache._native.beam(limits, K, length_penalty, min_len, no_repeat_ngram, cfg.bos_id, eos,
                                            cfg.pad_id, min(cache._groups(B * K), B), **rules)
        return [best[b, :best_len[b]].tolist() if best_len[b] >= 0 else [] for b in range(B)]   # -1: none finished

    sentences = np.arange(B)                      # live sentence slots -> sentence index
    scores = np.full((B, K), -np.inf, dtype=np.float64)
    scores[:, 0] = 0.0                            # one live beam at first: the others are copies
    n_finished = np.zeros(B, dtype=np.int64)      # len(finished[sentences[slot]]) per slot
    finished = [[] for _ in range(B)]             # (normalised score, tokens)
    early = rules["early_stopping"]
    kept = [[] for _ in range(B)]                 # early_stopping False / "never": the K best scores

    def norm(length):
        return _length_penalty(length, length_penalty, rules["length_form"])
    hyps = np.full((B * K, max_len), cfg.pad_id, dtype=np.int64)   # live row -> its tokens so far
    spare = np.empty_like(hyps)
    ids = np.full(B * K, cfg.bos_id, dtype=np.int64)
    # beam_select's outputs, written every step (the new beams, the hypotheses just finished).
    parents, tokens = np.empty(B * K, np.int64), np.empty(B * K, np.int64)
    new_scores, done = np.empty((B, K)), np.empty(B, np.uint8)
    fin_rows, fin_tokens = np.empty((B, 2 * K), np.int64), np.empty((B, 2 * K), np.int64)
    fin_scores, fin_count = np.empty((B, 2 * K)), np.empty(B, np.int64)
    last_step = np.empty(B, np.uint8)             # per slot: its sentence's final step
    for t in range(max_len):
        nb = len(sentences)
        n = nb * K
        # never "nothing" or a second start; banned after the normalisation, as Hugging Face's
        # generate does, so a hypothesis's score is the model's log-probability of its tokens
        logp = cache.step(ids, t, log_softmax=True, banned=(cfg.pad_id, cfg.bos_id) + rules["banned"])
        banned = eos if t < min_len else -1
        if no_repeat_ngram:
            _C.no_repeat_ngram_ban(logp, hyps, t, no_repeat_ngram, eos)
            if banned >= 0:                       # EOS stays where nothing else is left
                _forbid_eos(logp, eos)
                banned = -1
        last_step[:nb] = limits[sentences] == t + 1
        if rules["renormalize"] and banned >= 0:  # generate bans EOS before it renormalises
            _forbid_eos(logp, eos)
            banned = -1
        if rules["forced_eos"]:                   # generate's ForcedEOS after the log_softmax
            forced = np.repeat(last_step[:nb].astype(bool), K)
            logp[forced] = -np.inf
            logp[forced, eos] = 0.0
        if rules["renormalize"]:
            _C.log_softmax(logp, logp)
        _C.beam_select(logp, scores[:nb], n_finished[:nb], banned, eos,
                       last_step[:nb], parents[:n], tokens[:n], new_scores[:nb], done[:nb],
                       fin_rows[:nb], fin_tokens[:nb], fin_scores[:nb], fin_count[:nb],
                       early_stopping=early is True)
        for slot in np.flatnonzero(fin_count[:nb]).tolist():
            hypotheses = finished[sentences[slot]]
            for row, token, score in zip(fin_rows[slot, :fin_count[slot]].tolist(),
                                         fin_tokens[slot, :fin_count[slot]].tolist(),
                                         fin_scores[slot, :fin_count[slot]]):
                hypothesis = hyps[row, :t].tolist() + ([] if token == eos else [token])
                hypotheses.append((score / norm(t + 1), hypothesis))
                if early is not True:
                    kept[sentences[slot]] = sorted(kept[sentences[slot]] + [score / norm(t + 1)], reverse=True)[:K]
        if early is not True:                     # generate's early-stopping heuristic (decoder.h)
            for slot in range(nb):
                best_kept = kept[sentences[slot]]
                if done[slot] or len(best_kept) < K:
                    continue
                length = limits[sentences[slot]] if early == "never" and length_penalty > 0 else t + 1
                if not new_scores[slot, 0] / norm(length) > best_kept[-1]:
                    done[slot] = 1
        if done[:nb].all():
            break
        if done[:nb].any():                       # drop the finished sentences' rows
            live = np.flatnonzero(done[:nb] == 0)
            keep = (live[:, None] * K + np.arange(K)).ravel()
            chosen = parents[keep]
            cache.reorder(chosen, t, keep)
            ids = tokens[keep]
            m = len(live)
            scores[:m], n_finished[:m] = new_scores[live], n_finished[live]
            sentences = sentences[live]
        else:
            chosen = parents[:n]
            cache.reorder(chosen, t)
            ids = tokens[:n]
            scores[:nb] = new_scores[:nb]
        m = len(ids)
        np.take(hyps[:, :t], chosen, axis=0, out=spare[:m, :t])
        spare[:m, t] = ids
        hyps, spare = spare, hyps
    if n_best > 1:              # a stable sort: among equal scores the first finished, as max() takes
        return [[h for _, h in sorted(f, key=lambda item: item[0], reverse=True)[:n_best]] or [[]] for f in finished]
    return [max(f, key=lambda item: item[0])[1] if f else [] for f in finished]
