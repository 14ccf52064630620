"""What a decoding call's steps read and write: the weights every step reads (StepWeights, made
once per call after the encoder's run), the key/value caches and step buffers of the decoder
(DecoderCache: the step in C, or one kernel at a time from Python), and the buffers a model keeps
from one call to the next (its workspace)."""
import contextlib
import functools
import math

import numpy as np

from .. import _C
from ..norms import SCALE_NORM_EPS
from ..prepared import PreparedWeights
from .tuning import cache_dtype, int8_generator, step_groups


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


class StepWeights:
    """What every step of a call reads and nothing writes: each decoder layer's weights (the
    matrices packed, rounded or quantized for the call's precision, prepared.py), and the
    cross-attention keys and values of every sentence, [B, H, S, dh] per layer. Made once per call."""

    def __init__(self, model, memory, precision, prepared, buffer):
        cfg = model.cfg
        weights = {name: model.params.tensor(name) for name in model.state_dict_names()}   # tied ones too
        weights.update(model.fixed_tables())      # FixNorm's unit rows (cfg.fix_norm), read instead
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
        def norm(name):       # (weight, bias); ScaleNorm's (g, None)
            return (weights[f"{name}.weight"], weights[f"{name}.bias"] if cfg.norm == "layer" else None)

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
        if weight_bias[1] is None:      # ScaleNorm (the C step's kernel)
            _C.scalenorm_forward(x[:n], weight_bias[0], out[:n], self.rstd[:n], SCALE_NORM_EPS)
            return
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
