"""Autoregressive decoding (section 3 of the paper: "at each step the model is
auto-regressive, consuming the previously generated symbols as additional input
when generating the next") with a key/value cache per decoder layer.

The encoder runs once. Each step feeds one new token per row through the decoder:
self-attention appends that token's key and value to the layer's cache and
attends over it; cross-attention keys and values are computed once from the
encoder output. Greedy and beam search are batched, stop per sentence at EOS,
and drop finished sentences from the batch so later steps cost less.
"""
import math

import numpy as np

from . import _C


class DecoderCache:
    """Everything one decoding call needs: weights as views, caches, step buffers.

    `rows` decoder rows share `B` encoder outputs (rows_per_sentence = beam size).
    """

    def __init__(self, model, memory, src_pad, rows_per_sentence, max_steps, keep_attention=False):
        cfg = model.cfg
        weights = model.params.data
        B, S, D = memory.shape
        H = cfg.n_heads
        self.cfg, self.w = cfg, weights
        self.D, self.H, self.dh, self.S = D, H, D // H, S
        self.scale = 1.0 / math.sqrt(self.dh)
        self.N = B * rows_per_sentence
        self.Tmax = max_steps
        self.pe = model.positional_table(max_steps)
        N = self.N

        # Cross-attention keys and values: once per sentence, then one copy per beam.
        self.memory_k, self.memory_v = [], []
        flat_memory = np.ascontiguousarray(memory).reshape(B * S, D)
        projected = np.empty((B * S, D), dtype=np.float32)
        for layer in range(cfg.n_decoder_layers):
            prefix = f"transformer.decoder.layers.{layer}.multihead_attn"
            w, b = weights[f"{prefix}.in_proj_weight"], weights[f"{prefix}.in_proj_bias"]
            heads = []
            for part in (1, 2):
                _C.gemm(flat_memory, w[part * D:(part + 1) * D], projected, trans_b=True)
                _C.add_bias(projected, b[part * D:(part + 1) * D])
                per_head = projected.reshape(B, S, H, self.dh).transpose(0, 2, 1, 3)
                heads.append(np.ascontiguousarray(np.repeat(per_head, rows_per_sentence, axis=0)))
            self.memory_k.append(heads[0])
            self.memory_v.append(heads[1])
        self.src_pad = np.ascontiguousarray(np.repeat(src_pad, rows_per_sentence, axis=0))

        shape = (N, H, max_steps, self.dh)
        self.self_k = [np.zeros(shape, np.float32) for _ in range(cfg.n_decoder_layers)]
        self.self_v = [np.zeros(shape, np.float32) for _ in range(cfg.n_decoder_layers)]

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

    def _layer_norm(self, name, x, out, n):
        _C.layernorm_forward(x[:n], self.w[f"{name}.weight"], self.w[f"{name}.bias"], out[:n],
                             self.mean[:n], self.rstd[:n])

    def _linear(self, name, x, out, n):
        _C.gemm(x[:n], self.w[f"{name}.weight"], out[:n], trans_b=True)
        _C.add_bias(out[:n], self.w[f"{name}.bias"])

    def step(self, ids, t):
        """Feed token ids [n] at position t; returns logits [n, V] (a view, valid until the next step)."""
        cfg, w, D, n = self.cfg, self.w, self.D, len(ids)
        x, h, tmp, ctx, qkv = self.x[:n], self.h[:n], self.tmp[:n], self.ctx[:n], self.qkv[:n]
        # Embedding * sqrt(d_model) + PE[t] (section 3.4, 3.5).
        _C.embedding_forward(ids.reshape(n, 1), w["tgt_embed.weight"], x.reshape(n, 1, D),
                             math.sqrt(D), self.pe, t)
        probs = None
        for layer in range(cfg.n_decoder_layers):
            p = f"transformer.decoder.layers.{layer}"
            # Masked self-attention over the cache (the mask is implicit: only keys <= t exist).
            source = self._sublayer_input(f"{p}.norm1", x, n)
            _C.gemm(source, w[f"{p}.self_attn.in_proj_weight"], qkv, trans_b=True)
            _C.add_bias(qkv, w[f"{p}.self_attn.in_proj_bias"])
            self.self_k[layer][:n, :, t, :] = qkv[:, D:2 * D].reshape(n, self.H, self.dh)
            self.self_v[layer][:n, :, t, :] = qkv[:, 2 * D:].reshape(n, self.H, self.dh)
            _C.attention_decode(qkv[:, :D], self.self_k[layer][:n], self.self_v[layer][:n], t + 1,
                                ctx, self.scale)
            self._linear(f"{p}.self_attn.out_proj", ctx, tmp, n)
            self._residual(f"{p}.norm1", x, tmp, n, post=not cfg.norm_first)

            # Cross-attention over the encoder output.
            source = self._sublayer_input(f"{p}.norm2", x, n)
            query = self.query[:n]
            _C.gemm(source, w[f"{p}.multihead_attn.in_proj_weight"][:D], query, trans_b=True)
            _C.add_bias(query, w[f"{p}.multihead_attn.in_proj_bias"][:D])
            if self.keep_attention and layer == cfg.n_decoder_layers - 1:
                probs = np.empty((n, self.H, self.S), np.float32)
            _C.attention_decode(query, self.memory_k[layer][:n], self.memory_v[layer][:n], self.S,
                                ctx, self.scale, self.src_pad[:n], probs)
            self._linear(f"{p}.multihead_attn.out_proj", ctx, tmp, n)
            self._residual(f"{p}.norm2", x, tmp, n, post=not cfg.norm_first)

            # Position-wise feed-forward (section 3.3).
            source = self._sublayer_input(f"{p}.norm3", x, n)
            _C.gemm(source, w[f"{p}.linear1.weight"], self.ff_pre[:n], trans_b=True)
            _C.bias_act_forward(self.ff_pre[:n], w[f"{p}.linear1.bias"], self.ff_act[:n], cfg.activation)
            self._linear(f"{p}.linear2", self.ff_act, tmp, n)
            self._residual(f"{p}.norm3", x, tmp, n, post=not cfg.norm_first)

        self._layer_norm("transformer.decoder.norm", x, h, n)
        self._linear("generator", h, self.logits, n)
        if probs is not None:
            self.attention.append(probs)
        return self.logits[:n]

    def _sublayer_input(self, norm, x, n):
        """What a sublayer reads: x itself (post-LN, the paper's), or norm(x) in `h` (pre-LN)."""
        if not self.cfg.norm_first:
            return x
        self._layer_norm(norm, x, self.h, n)
        return self.h[:n]

    def _residual(self, norm, x, delta, n, post):
        """x = norm(x + delta) after the sublayer (post-LN) or x = x + delta (pre-LN)."""
        _C.add(x, delta, delta if post else x)
        if post:
            self._layer_norm(norm, delta, x, n)

    def reorder(self, rows, t):
        """Keep decoder rows `rows` (int indices, in their new order) for positions <= t."""
        n = len(rows)
        for cache in self.self_k + self.self_v:
            cache[:n, :, :t + 1] = cache[rows, :, :t + 1]
        for cache in self.memory_k + self.memory_v:
            cache[:n] = cache[rows]
        self.src_pad[:n] = self.src_pad[rows]
        if self.attention:
            self.attention = [a[rows] for a in self.attention]


def _check_decode_args(model, src, max_len, min_len):
    """src as int64 ids; max_len clamped to the model's max_len; min_len in [0, max_len]."""
    cfg = model.cfg
    src = model.check_ids(src, "src", cfg.src_vocab_size)
    for name, value in (("max_len", max_len), ("min_len", min_len)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    # Positions beyond the model's max_len have no positional encoding: generation stops there.
    max_len = min(int(max_len), cfg.max_len)
    if not 0 <= min_len <= max_len:
        raise ValueError(f"min_len must be in [0, max_len={max_len}], got {min_len}")
    return src, int(max_len), int(min_len)


def _strip(tokens, eos_id):
    tokens = [int(t) for t in tokens]
    return tokens[:tokens.index(eos_id)] if eos_id in tokens else tokens


def greedy_decode(model, src, max_len=128, min_len=0, return_attention=False):
    """Batched greedy decoding. Returns a list of token-id lists (BOS dropped, cut before EOS);
    at most min(max_len, the model's max_len) tokens each;
    with return_attention, also each sentence's last-layer cross-attention [steps, H, S]."""
    src, max_len, min_len = _check_decode_args(model, src, max_len, min_len)
    cfg = model.cfg
    B = src.shape[0]
    memory = model.encode(src)
    cache = DecoderCache(model, memory, src == cfg.pad_id, 1, max_len, keep_attention=return_attention)
    out = np.full((B, max_len), cfg.pad_id, dtype=np.int64)
    lengths = np.full(B, max_len, dtype=np.int64)
    alive = np.arange(B)                         # row -> sentence
    ids = np.full(B, cfg.bos_id, dtype=np.int64)
    attention = [[] for _ in range(B)]
    for t in range(max_len):
        logits = cache.step(ids, t)
        if t < min_len:
            logits[:, cfg.eos_id] = -np.inf
        ids = logits.argmax(axis=1).astype(np.int64)
        out[alive, t] = ids
        if return_attention:
            for row, sentence in enumerate(alive):
                attention[sentence].append(cache.attention[-1][row])
            cache.attention.clear()
        finished = ids == cfg.eos_id
        if finished.any():
            lengths[alive[finished]] = t
            keep = np.flatnonzero(~finished)
            alive, ids = alive[keep], ids[keep]
            if not len(alive):
                break
            cache.reorder(keep, t)
    hyps = [out[b, :lengths[b]].tolist() for b in range(B)]
    if return_attention:
        return hyps, [np.stack(a[:len(h) + 1]) if a else np.zeros((0, cfg.n_heads, src.shape[1]), np.float32)
                      for a, h in zip(attention, hyps)]
    return hyps


def _length_penalty(length, alpha):
    """GNMT's length normalisation ((5 + |Y|) / 6) ** alpha (Wu et al. 2016)."""
    return ((5.0 + length) / 6.0) ** alpha


def beam_search(model, src, beam_size=4, max_len=128, length_penalty=0.6, min_len=0):
    """Batched beam search. Returns the best hypothesis per sentence (token-id lists, BOS dropped,
    cut before EOS), ranked by log-probability / ((5 + length) / 6) ** length_penalty.

    A hypothesis that emits EOS is finished and kept; a sentence is done once it has beam_size
    finished hypotheses, or at max_len, where its live beams are finished as they stand.
    """
    if isinstance(beam_size, bool) or not isinstance(beam_size, (int, np.integer)) or beam_size < 1:
        raise ValueError(f"beam_size must be an int >= 1, got {beam_size!r}")
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)) \
            or not math.isfinite(length_penalty) or length_penalty < 0:
        raise ValueError(f"length_penalty must be a finite number >= 0, got {length_penalty!r}")
    src, max_len, min_len = _check_decode_args(model, src, max_len, min_len)
    cfg = model.cfg
    K, V, eos = int(beam_size), cfg.tgt_vocab_size, cfg.eos_id
    B = src.shape[0]
    memory = model.encode(src)
    cache = DecoderCache(model, memory, src == cfg.pad_id, K, max_len)

    sentences = np.arange(B)                      # live sentence slots -> sentence index
    scores = np.full((B, K), -np.inf, dtype=np.float64)
    scores[:, 0] = 0.0                            # one live beam at first: the others are copies
    hyps = np.full((B * K, max_len), cfg.pad_id, dtype=np.int64)
    finished = [[] for _ in range(B)]             # (normalised score, tokens)
    ids = np.full(B * K, cfg.bos_id, dtype=np.int64)
    logp = np.empty((B * K, V), dtype=np.float32)
    for t in range(max_len):
        nb = len(sentences)
        logits = cache.step(ids, t)
        _C.log_softmax(logits, logp[:nb * K])
        step_logp = logp[:nb * K]
        if t < min_len:
            step_logp[:, eos] = -np.inf
        candidates = (scores[:nb].reshape(-1, 1) + step_logp).reshape(nb, K * V)
        width = min(2 * K, K * V)
        top = np.argpartition(-candidates, width - 1, axis=1)[:, :width]
        top_scores = np.take_along_axis(candidates, top, axis=1)
        order = np.argsort(-top_scores, axis=1, kind="stable")
        top, top_scores = np.take_along_axis(top, order, 1), np.take_along_axis(top_scores, order, 1)

        rows = np.repeat(np.arange(nb) * K, K)   # unfilled beams stay dead (score -inf)
        new_ids = np.full(nb * K, eos, dtype=np.int64)
        new_scores = np.full((nb, K), -np.inf)
        done = np.zeros(nb, dtype=bool)
        last_step = t == max_len - 1
        for slot in range(nb):
            sentence, kept = sentences[slot], 0
            for candidate, score in zip(top[slot], top_scores[slot]):
                if not np.isfinite(score):
                    break
                beam, token = divmod(int(candidate), V)
                row = slot * K + beam
                if token == eos or last_step:
                    tokens = hyps[row, :t].tolist() + ([] if token == eos else [token])
                    finished[sentence].append((score / _length_penalty(t + 1, length_penalty), tokens))
                    if len(finished[sentence]) >= K:
                        break
                    continue
                rows[slot * K + kept] = row
                new_ids[slot * K + kept] = token
                new_scores[slot, kept] = score
                kept += 1
                if kept == K:
                    break
            done[slot] = len(finished[sentence]) >= K or last_step or kept == 0
        if done.all():
            break
        hyps[:nb * K] = hyps[rows]
        hyps[np.arange(nb * K), t] = new_ids
        live = np.flatnonzero(~done)
        keep_rows = (live[:, None] * K + np.arange(K)).ravel()
        cache.reorder(rows[keep_rows], t)
        hyps[:len(keep_rows)] = hyps[keep_rows]
        ids = new_ids[keep_rows]
        scores[:len(live)] = new_scores[live]
        sentences = sentences[live]
    return [max(f, key=lambda item: item[0])[1] if f else [] for f in finished]
