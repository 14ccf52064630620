"""The encoder-decoder of "Attention Is All You Need" (Figure 1), composed from transformer/layers.py.

Read top to bottom like the figure: source embedding + positional encoding -> N encoder layers ->
(nn.Transformer's) final encoder norm = memory; target embedding + positional encoding -> N
decoder layers attending to memory -> final decoder norm -> linear -> softmax (cross-entropy).
Parameter names, shapes and numerics follow the PyTorch reference of DESIGN.md
(transformer/torch_compat.py).
"""
import json
import math
import os
import threading

import numpy as np

from . import _C
from .config import ModelConfig
from .layers import (DecoderLayer, DropoutStream, Embedding, EncoderLayer, Linear, WordDropout, Workspace,
                     norm_layer, output_loss)
from .norms import FixNorm
from .params import Parameters
from .precision import check_precision
from .prepared import PreparedWeights, dequantize, quantize
from .serialization import atomic_write_bytes, load_file, save_file
from .shards import ShardedSteps, shard_plan

__all__ = ["Seq2SeqTransformer", "Encoder", "Decoder"]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def _nothing(prefix):
    """The default `ready` of the backward passes: nobody is waiting for a gradient."""


class Encoder:
    """The encoder (section 3.1): a stack of N identical layers, then the final LayerNorm that
    nn.Transformer has (transformer.encoder.norm; None when cfg.final_norm is False, as MarianMT)."""

    def __init__(self, layers, norm):
        self.layers, self.norm = layers, norm

    def forward(self, x, B, S, src_pad):
        for layer in self.layers:
            x = layer.forward(x, B, S, src_pad)
        return x if self.norm is None else self.norm.forward(x)

    def backward(self, dmemory, ready=_nothing):
        # dmemory [B*S, D], overwritten with the gradient of the encoder input. ready(prefix) is
        # told each time the gradients of the parameters named prefix* are complete.
        d = dmemory
        if self.norm is not None:
            d = self.norm.backward(dmemory, dmemory)
            ready("transformer.encoder.norm.")
        for i in reversed(range(len(self.layers))):
            d = self.layers[i].backward(d)
            ready(f"transformer.encoder.layers.{i}.")
        return d


class Decoder:
    """The decoder (section 3.1): N identical layers with masked self-attention and attention over
    the encoder output, then the final LayerNorm (transformer.decoder.norm)."""

    def __init__(self, layers, norm):
        self.layers, self.norm = layers, norm
        self.causal = True

    def forward(self, y, memory, B, T, S, tgt_pad, src_pad):
        for layer in self.layers:
            y = layer.forward(y, memory, B, T, S, tgt_pad, src_pad, self.causal)
        return y if self.norm is None else self.norm.forward(y)

    def backward(self, dout, dmemory, ready=_nothing):
        # dout [B*T, D], overwritten with the gradient of the decoder input; dmemory [B*S, D] is
        # written with the sum over layers of the gradients of the encoder output; ready as in
        # Encoder.backward
        d = dout
        if self.norm is not None:
            d = self.norm.backward(dout, dout)
            ready("transformer.decoder.norm.")
        n = len(self.layers)
        for i in reversed(range(n)):
            d = self.layers[i].backward(d, dmemory, accumulate_memory=i < n - 1)
            ready(f"transformer.decoder.layers.{i}.")
        return d


def _split_int8(sd):
    """In place: every int8 matrix of `sd` (with its "<name>.scale") replaced by its dequantized
    float32 values; returns {name: (q, scale)}. ValueError for a matrix without a valid scale."""
    seeds = {}
    for name in [k for k, v in sd.items() if v.dtype == np.int8]:
        q, scale = sd[name], sd.pop(f"{name}.scale", None)
        if q.ndim != 2:
            raise ValueError(f"int8 tensor {name!r} must be 2-D, got shape {q.shape}")
        if scale is None or scale.dtype != np.float32 or scale.shape != (q.shape[0],):
            raise ValueError(f"int8 tensor {name!r} needs a float32 {name + '.scale'!r} of shape "
                             f"({q.shape[0]},), got {None if scale is None else (scale.dtype, scale.shape)}")
        if not (np.isfinite(scale).all() and (scale >= 0).all()):
            raise ValueError(f"{name + '.scale'!r} must hold finite scales >= 0")
        seeds[name] = (np.ascontiguousarray(q), np.ascontiguousarray(scale))
        sd[name] = dequantize(q, scale)
    return seeds       # a stray ".scale" stays in sd: load_state_dict names it as unexpected


class Seq2SeqTransformer:
    """The Transformer encoder-decoder (Figure 1) with hand-written backward passes.

    All parameters live in one flat float32 buffer and all gradients in another
    (`self.params.flat`, `self.params.flat_grad`); layers hold named views into both."""

    def __init__(self, cfg, seed=0):
        if not isinstance(cfg, ModelConfig):
            raise TypeError(f"cfg must be a ModelConfig, got {type(cfg).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        self.cfg = cfg
        self.seed = int(seed)
        self.params = Parameters(cfg, self.seed)
        self._int8_seed = {}      # {name: (q, scale)} from an int8 file (prepared.py)
        self.stored_precision = "fp32"   # "int8" for a model loaded from an int8 file
        # An imported model's own decoding settings (generation.py: GenerationSettings, the
        # defaults of its decoding calls), saved beside it; None for the models trained here.
        self.generation = None
        self._assemble()
        self.shards = None        # shards.ShardedSteps, made by the first training pass that splits

    def _assemble(self):
        """The layers (Figure 1) as views into self.params, with their own workspace, dropout
        stream and lock: a replica (shards.py) is another assembly over the same weights."""
        cfg = self.cfg
        self.ws = Workspace()
        self.stream = DropoutStream(self.seed)
        self._lock = threading.Lock()
        P, G, p = self.params.data, self.params.grad, cfg.dropout
        self.pe = _positional_encoding(cfg.max_len, cfg.d_model, cfg.positions)
        # Figure 1, left to right, bottom to top
        scale = math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0
        tensor, gradient = self.params.tensor, self.params.gradient
        self.src_embed = Embedding(tensor("src_embed.weight"), gradient("src_embed.weight"), self.pe, p,
                                   self.stream, self.ws, scale, cfg.pad_id)
        self.tgt_embed = Embedding(tensor("tgt_embed.weight"), gradient("tgt_embed.weight"), self.pe, p,
                                   self.stream, self.ws, scale, cfg.pad_id)
        self.encoder = Encoder(
            [EncoderLayer(P, G, f"transformer.encoder.layers.{i}", cfg, self.stream, self.ws)
             for i in range(cfg.n_encoder_layers)],
            self._norm("transformer.encoder.norm") if cfg.final_norm else None)
        self.decoder = Decoder(
            [DecoderLayer(P, G, f"transformer.decoder.layers.{i}", cfg, self.stream, self.ws)
             for i in range(cfg.n_decoder_layers)],
            self._norm("transformer.decoder.norm") if cfg.final_norm else None)
        for stack in (self.encoder.layers, self.decoder.layers):
            if stack:
                self.ws.share_layers(stack)
        self.generator = Linear(tensor("generator.weight"), P["generator.bias"],
                                gradient("generator.weight"), G["generator.bias"], self.ws, "generator.weight")
        # the stream's last site, so that every other site keeps the offset it had before it existed
        self.src_embed.words = WordDropout(cfg.word_dropout, self.stream)
        self._fix_norm()

    def _norm(self, name):
        return norm_layer(self.params.data, self.params.grad, name, self.ws, self.cfg.norm)

    # FixNorm's readers in the order the backward pass finishes with them
    _FIXED_READERS = ("generator", "tgt_embed", "src_embed")

    def _fix_norm(self):
        """FixNorm (cfg.fix_norm, norms.py): the source and target embeddings and the output
        projection read unit rows of their tables, one FixNorm a stored table (tied readers share
        its unit rows and the gradient buffer they add into)."""
        self.fixed, self._fixed_last = {}, {}       # stored name -> FixNorm, -> its last reader
        self._fixed_readers, self._fixed_rows = {}, {}   # -> its readers; -> the rows this pass reads
        # the frozen token (Parameters.freeze) the unit rows were last made under: frozen weights
        # are normalised once, not on every call
        self._fixed_under = None
        if not self.cfg.fix_norm:
            return
        for reader in self._FIXED_READERS:
            name = self.params.tied.get(f"{reader}.weight", f"{reader}.weight")
            fixed = self.fixed.get(name)
            if fixed is None:
                fixed = self.fixed[name] = FixNorm(self.params.data[name], self.params.grad[name])
            self._fixed_readers.setdefault(name, []).append(reader)
            layer = getattr(self, reader)
            if reader == "generator":
                layer.weight = layer.full = fixed.unit
                layer.dweight = fixed.dunit
            else:
                layer.table, layer.dtable = fixed.unit, fixed.dunit
            self._fixed_last[name] = reader

    def _refresh_fixed(self, training=False, ids=None):
        """The unit rows from the tables as they are now (the caller holds self._lock); for a pass
        that does not train, kept while the weights stay frozen under the token they were made under.
        A training pass gives ids ({reader: its token ids}): a table that only embeddings read is
        made, and differentiated, at the rows they look up (FixNorm); the output projection's
        whole."""
        frozen = self.params.frozen
        if not training and frozen is not None and self._fixed_under is frozen:
            return
        self._fixed_rows = {}
        for name, fixed in self.fixed.items():
            readers = self._fixed_readers[name]
            rows = None
            if training and ids is not None and "generator" not in readers:
                rows = self._fixed_rows[name] = np.unique(np.concatenate([ids[r].reshape(-1) for r in readers]))
            fixed.refresh(training, rows)
        self._fixed_under = None if training else frozen

    def _fixed_backward(self, reader):
        """After `reader`'s backward: the table's gradient through the normalisation, once every
        reader of that table has added into its buffer."""
        name = self.params.tied.get(f"{reader}.weight", f"{reader}.weight")
        if self._fixed_last.get(name) == reader:
            self.fixed[name].backward(self._fixed_rows.get(name))

    def fixed_tables(self):
        """{parameter name: its rows at unit length} for the tables decoding's steps read (the
        target embedding, the output projection) when FixNorm normalises them; {} without
        cfg.fix_norm. They are FixNorm's own buffers, made from the weights as they are now (kept
        while the weights are frozen), which the next pass of this model makes again."""
        if not self.cfg.fix_norm:
            return {}
        with self._lock:
            self._refresh_fixed()
        return {name: self.fixed[self.params.tied.get(name, name)].unit for name in ("tgt_embed.weight", "generator.weight")}

    @property
    def config(self):
        """The ModelConfig (also `cfg`)."""
        return self.cfg

    def positional_table(self, n):
        """The sinusoidal table PE[:n] (section 3.5), float32 [n, d_model], C-contiguous."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"n must be an int, got {type(n).__name__}")
        if not 0 <= n <= self.cfg.max_len:
            raise ValueError(f"n must be in [0, max_len={self.cfg.max_len}], got {n}")
        return self.pe[:n]

    # ------------------------------------------------------------------ running

    def encode(self, src, precision="fp32"):
        """The encoder output (memory) float32 [B, S, d_model] for src [B, S], eval mode (a new array).
        precision: "fp32", "bf16" (the linear maps' operands rounded to bfloat16) or "int8" (their
        weights quantized per row, activations per row on the fly, prepared.py); attention float32,
        as in decoding."""
        src = self.check_ids(src, "src", self.cfg.src_vocab_size)
        return self._encode(src, check_precision(precision), None)

    def _encode(self, src, precision, prepared):
        """encode, src checked; `prepared`: the PreparedWeights to take int8 matrices from."""
        B, S = src.shape
        if precision == "int8" and prepared is None:
            prepared = PreparedWeights(self._int8_seed)
        with self._lock:
            self.stream.training = False
            self.ws.reset((B, S, 0), inference=True)
            self.ws.bf16 = precision == "bf16"
            self.ws.int8 = prepared if precision == "int8" else None
            try:
                self._refresh_fixed()
                table = None if prepared is None else prepared.table(precision, "src_embed.weight",
                                                                      self.src_embed.table)
                memory = self.encoder.forward(self.src_embed.forward(src, table), B, S,
                                              _padding_mask(src, self.cfg.pad_id))
            finally:
                self.ws.bf16, self.ws.int8 = False, None
            return memory.reshape(B, S, -1).copy()

    def _generation_rules(self, max_len, forced_eos, banned):
        """max_len and the greedy rules of a decoding call: what the caller passed, else the
        model's generation settings (self.generation), else this engine's defaults."""
        settings = self.generation
        if settings is None:
            return max_len, {"forced_eos": bool(forced_eos) if forced_eos is not None else False,
                             "banned": () if banned is None else banned}
        if max_len is None:
            max_len = settings.max_new_tokens(self.cfg.max_len)
        return max_len, {"forced_eos": settings.forced_eos if forced_eos is None else forced_eos,
                         "banned": settings.banned if banned is None else banned}

    def greedy_decode(self, src, max_len=None, min_len=0, return_attention=False, no_repeat_ngram=0,
                      precision="fp32", forced_eos=None, banned=None):
        """Greedy decoding with a key/value cache: list of token-id lists (BOS dropped, cut at EOS).
        max_len counts new tokens, EOS included (generate's max_new_tokens); None: the model's
        own limit (an imported model's generation settings, generation.py), else each
        sentence's min(2 * its source length + 10, cfg.max_len);
        no_repeat_ngram N > 0: no n-gram of N tokens twice (decoding/greedy.py: greedy_decode).
        precision: "fp32", "bf16" or "int8" (transformer/decoding). With return_attention, also each
        sentence's last-layer cross-attention [steps, H, S]. forced_eos (EOS at the limit) and
        banned (token ids never chosen): None takes the model's generation settings (off for
        the models trained here)."""
        from .decoding import greedy_decode
        _check_bool(return_attention, "return_attention")
        max_len, rules = self._generation_rules(max_len, forced_eos, banned)
        return greedy_decode(self, src, max_len=max_len, min_len=min_len,
                             return_attention=bool(return_attention), no_repeat_ngram=no_repeat_ngram,
                             precision=precision, **rules)

    def beam_search(self, src, beam_size=None, max_len=None, length_penalty=None, min_len=0, no_repeat_ngram=0,
                    precision="fp32", forced_eos=None, banned=None, renormalize=None, early_stopping=None, n_best=1):
        """Beam search with a key/value cache: the best hypothesis per sentence (max_len,
        no_repeat_ngram, precision, forced_eos and banned as in greedy_decode).

        An argument left None takes the model's generation settings when it has them (an
        imported MarianMT model, generation.py: num_beams, length_penalty, renormalize_logits,
        early_stopping, ranked as generate ranks: score / length ** length_penalty), else this
        engine's defaults: beam_size 4, GNMT's length_penalty 0.6, no renormalisation,
        early_stopping True (done at beam_size finished hypotheses). n_best > 1: a list of each
        sentence's best hypotheses, best first (decoding.beam_search)."""
        from .decoding import beam_search
        if isinstance(length_penalty, np.floating):     # np.float32(0.6) is a number too
            length_penalty = float(length_penalty)
        max_len, rules = self._generation_rules(max_len, forced_eos, banned)
        options = self._beam_options(beam_size, length_penalty, renormalize, early_stopping)
        return beam_search(self, src, max_len=max_len, min_len=min_len, no_repeat_ngram=no_repeat_ngram,
                           precision=precision, n_best=n_best, **rules, **options)

    def _beam_options(self, beam_size, length_penalty, renormalize, early_stopping):
        """beam_search's options: what the caller passed, else the model's generation settings,
        else this engine's defaults (beam_search's docstring)."""
        settings = self.generation
        if settings is None:
            defaults = dict(beam_size=4, length_penalty=0.6, renormalize=False, early_stopping=True,
                            length_form="gnmt")
        else:
            defaults = dict(beam_size=settings.num_beams, length_penalty=settings.length_penalty,
                            renormalize=settings.renormalize, early_stopping=settings.early_stopping,
                            length_form="generate")
        given = dict(beam_size=beam_size, length_penalty=length_penalty, renormalize=renormalize,
                     early_stopping=early_stopping)
        return {k: defaults[k] if given.get(k) is None else given[k] for k in defaults}

    def forward(self, src, tgt_in, return_attention=False, precision="fp32"):
        """Logits float32 [B, T, tgt_vocab] for src [B, S] and the shifted target tgt_in [B, T]
        (teacher forcing), in eval mode (no dropout). precision: "fp32", "bf16" or "int8", as in
        decoding (transformer/decoding: the linear maps reduced, attention float32), so these are the
        logits that greedy_decode(precision=...) computes step by step.

        With return_attention, returns (logits, attention): attention["encoder"],
        attention["decoder_self"] and attention["cross"] are lists with one float32 array per
        layer, [B, H, S, S], [B, H, T, T] and [B, H, T, S]: the softmax weights of every head
        (rows of padded queries are included; masked keys have weight 0)."""
        from .decoding import cache_dtype, int8_generator
        _check_bool(return_attention, "return_attention")
        precision = check_precision(precision)
        src, tgt_in, _ = self._check_inputs(src, tgt_in)
        B, T = tgt_in.shape
        logits = np.empty((B * T, self.cfg.tgt_vocab_size), dtype=np.float32)
        prepared = PreparedWeights(self._int8_seed) if precision == "int8" else None
        with self._lock:
            self.stream.training = False
            self.ws.bf16 = precision == "bf16"
            self.ws.int8 = prepared
            self.ws.kv_bf16 = cache_dtype(precision) == np.uint16   # as decoding's caches hold them
            try:
                self._refresh_fixed()
                tables = None if prepared is None else tuple(
                    prepared.table(precision, f"{name}.weight", embed.table)
                    for name, embed in (("src_embed", self.src_embed), ("tgt_embed", self.tgt_embed)))
                h = self._encode_decode(src, tgt_in, tables, inference=not return_attention)
                generator = int8_generator(self.cfg)
                if prepared is not None and generator != "int8":
                    self.ws.int8, self.ws.bf16 = None, generator == "bf16"
                self.generator.forward(h, logits)
            finally:
                self.ws.bf16, self.ws.int8, self.ws.kv_bf16 = False, None, False
            if not return_attention:
                return logits.reshape(B, T, -1)
            attention = {
                "encoder": [layer.self_attn.probs.copy() for layer in self.encoder.layers],
                "decoder_self": [layer.self_attn.probs.copy() for layer in self.decoder.layers],
                "cross": [layer.cross_attn.probs.copy() for layer in self.decoder.layers],
            }
        return logits.reshape(B, T, -1), attention

    def forward_backward(self, src, tgt_in, tgt_out, label_smoothing=0.1, precision="fp32"):
        """One training pass (dropout on): ADDS d loss / d params into the gradient buffer and
        returns the loss, F.cross_entropy(logits, tgt_out, ignore_index=pad_id,
        label_smoothing=label_smoothing), the mean over non-pad targets.

        precision "bf16": mixed precision. Every GEMM of the forward and backward pass (the linear
        maps, Q Kᵀ, P V and their gradients) rounds its operands to bfloat16 and sums in float32;
        weights, gradients, softmax, layer norm, loss, residuals and dropout stay float32."""
        return self._train_pass(src, tgt_in, tgt_out, label_smoothing, precision)

    def _train_pass(self, src, tgt_in, tgt_out, label_smoothing, precision, grad_scale=1.0, ready=_nothing):
        """forward_backward, with the gradient scaled by grad_scale (DataParallel: this rank's
        share of the global target count) and ready(prefix) told as each parameter group's
        gradient is complete (DataParallel starts its all-reduce there).

        A small model's batch runs as sentence shards, one thread each (shards.py): how many
        depends on the batch and the model's sizes, never on the threads, so the result is the
        same at any thread count."""
        bf16 = check_precision(precision, ("fp32", "bf16"), "training (int8 is for decoding)") == "bf16"
        src, tgt_in, tgt_out = self._check_inputs(src, tgt_in, tgt_out)
        label_smoothing = _check_smoothing(label_smoothing)
        plan = shard_plan(self.cfg, src, tgt_out)
        if plan is not None:
            if self.shards is None:
                self.shards = ShardedSteps(self)
            return self.shards.train_pass(src, tgt_in, tgt_out, label_smoothing, bf16, grad_scale, ready, plan)
        return self._train_pass_whole(src, tgt_in, tgt_out, label_smoothing, bf16, grad_scale, ready,
                                      self.stream.next_call())

    def _train_pass_whole(self, src, tgt_in, tgt_out, label_smoothing, bf16, grad_scale, ready, seed):
        """One training pass over the whole (checked) batch, dropout drawn from `seed`."""
        ready = ready or _nothing
        B, T = tgt_in.shape
        S = src.shape[1]
        D = self.cfg.d_model
        with self._lock:
            self.stream.training = self.cfg.trains_with_dropout()
            self.stream.seed = seed
            self.ws.bf16 = self.ws.bf16_attention = bf16
            self.params.grad_is_zero = False
            try:
                self._refresh_fixed(training=True, ids={"src_embed": src, "tgt_embed": tgt_in})
                h = self._encode_decode(src, tgt_in)
                ws = self.ws
                dh = ws.persistent(self, "dh", (B * T, D))
                dmemory = ws.persistent(self, "dmemory", (B * S, D))
                targets = tgt_out.reshape(-1)
                # Only the positions with a target go through the output projection and the loss:
                # a pad position's loss and gradient are zero, its logits (a vocabulary's worth per
                # position) were computed for nothing. Its dh is zero, as the full product gives.
                kept = np.flatnonzero(targets != self.cfg.pad_id)
                if 0 < len(kept) < B * T:
                    h_kept = np.take(h, kept, axis=0, out=ws.scratch("model.h_kept", (len(kept), D)))
                    targets = targets[kept]
                else:
                    h_kept = h
                dh_kept = dh if h_kept is h else ws.scratch("model.dh_kept", (len(kept), D))
                loss = output_loss(self.generator, h_kept, targets, self.cfg.pad_id, label_smoothing, grad_scale,
                                   dh_kept, ws)
                if h_kept is not h:
                    dh.fill(0.0)
                    dh[kept] = dh_kept
                self._fixed_backward("generator")
                ready("generator.")
                self.tgt_embed.backward(self.decoder.backward(dh, dmemory, ready))
                self._fixed_backward("tgt_embed")
                ready("tgt_embed.")
                self.src_embed.backward(self.encoder.backward(dmemory, ready))
                self._fixed_backward("src_embed")
                ready("src_embed.")
            finally:
                self.stream.training = False
                self.ws.bf16 = self.ws.bf16_attention = False
        return loss

    def _encode_decode(self, src, tgt_in, tables=None, inference=False):
        """tables: (source, target) embedding tables to read instead of the parameters, or None;
        inference: no backward follows (the layers of each stack share their buffers, so a layer's
        attention weights are gone once the next has run)."""
        B, S = src.shape
        T = tgt_in.shape[1]
        self.ws.reset((B, S, T), inference)
        pad = self.cfg.pad_id
        src_pad = _padding_mask(src, pad)
        tgt_pad = _target_padding_mask(tgt_in, self.cfg)
        src_table, tgt_table = tables or (None, None)
        memory = self.encoder.forward(self.src_embed.forward(src, src_table), B, S, src_pad)
        return self.decoder.forward(self.tgt_embed.forward(tgt_in, tgt_table), memory, B, T, S, tgt_pad, src_pad)

    def loss_and_grads(self, src, tgt_in, tgt_out, label_smoothing=0.0, precision="fp32"):
        """zero_grad + forward_backward; returns (loss, {name: gradient copy})."""
        check_precision(precision, ("fp32", "bf16"), "training (int8 is for decoding)")
        self.zero_grad()
        loss = self.forward_backward(src, tgt_in, tgt_out, label_smoothing, precision)
        return loss, {k: v.copy() for k, v in self.grads().items()}

    def grads(self):
        """{name: gradient view} (views into the flat gradient buffer; tied names share one)."""
        return {name: self.params.gradient(name) for name in self.state_dict_names()}

    def state_dict_names(self):
        """The names of state_dict(): the parameters in PyTorch's order, then the tied names."""
        return list(self.params.data) + list(self.params.tied)

    def zero_grad(self):
        self.params.zero_grad()

    def set_dropout(self, p):
        """Change cfg.dropout, the rate of the embeddings and sublayer outputs, and of the attention
        and feed-forward sites that follow it (attention_dropout / activation_dropout None), e.g.
        once a training plan knows how often it will see its data. A site rate set explicitly
        stays as it is: it was asked for, and the plan's rule was measured on the residual rate
        alone, so scaling the others with it would be a guess; word_dropout is its own."""
        self.set_dropout_rates(dropout=float(p))

    def set_dropout_rates(self, **rates):
        """Change any of cfg's dropout, attention_dropout, activation_dropout (None: follow dropout)
        and word_dropout, checked as ModelConfig checks them; every site takes its new rate."""
        unknown = sorted(set(rates) - {"dropout", "attention_dropout", "activation_dropout", "word_dropout"})
        if unknown:
            raise TypeError(f"set_dropout_rates() takes dropout rates only, got {unknown}")
        self.cfg = self.cfg.replace(**rates)
        for site in self.stream.users:
            site.p = self.cfg.dropout_at(site.site)

    def num_parameters(self):
        return self.params.count()

    # ------------------------------------------------------------------ weights

    def state_dict(self):
        """{name: np.ndarray copy} with PyTorch's names and shapes (DESIGN); a tied name
        (cfg.tie_embeddings) is there too, a copy of the matrix it shares, as in PyTorch."""
        return {k: self.params.tensor(k).copy() for k in self.state_dict_names()}

    def load_state_dict(self, sd):
        """Copy weights in from {name: np.ndarray}; every name of state_dict() must be present
        (a tied name may be left out; when present it must equal the matrix it shares), no other,
        with the same shape (ValueError), and each value a real-valued ndarray (TypeError).
        Nothing is changed unless everything is right."""
        if not isinstance(sd, dict):
            raise TypeError(f"state_dict must be a dict, got {type(sd).__name__}")
        data, tied = self.params.data, self.params.tied
        missing = [k for k in data if k not in sd]
        unexpected = [k for k in sd if k not in data and k not in tied]
        if missing or unexpected:
            raise ValueError(f"state_dict does not match the model: missing {missing[:5]}"
                             f"{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
                             f"{'...' if len(unexpected) > 5 else ''}")
        for k, v in sd.items():
            if not isinstance(v, np.ndarray):
                raise TypeError(f"state_dict[{k!r}] must be a numpy.ndarray, got {type(v).__name__}")
            if v.dtype.kind not in "fiu":
                raise TypeError(f"state_dict[{k!r}] must be real-valued, got dtype {v.dtype}")
            shape = self.params.tensor(k).shape
            if v.shape != shape:
                raise ValueError(f"state_dict[{k!r}] has shape {v.shape}, expected {shape}")
            if v.dtype.kind == "f" and v.dtype.itemsize > 4 and v.size:
                # finite values beyond float32's range would silently become inf
                with np.errstate(invalid="ignore"):
                    too_big = np.abs(v[np.isfinite(v)]) > np.finfo(np.float32).max
                if too_big.any():
                    raise ValueError(f"state_dict[{k!r}] has finite values beyond float32's range "
                                     f"(largest {np.abs(v[np.isfinite(v)]).max():.3g})")
        for alias, owner in tied.items():
            if alias in sd and not np.array_equal(np.asarray(sd[alias], dtype=np.float32),
                                                  np.asarray(sd[owner], dtype=np.float32)):
                raise ValueError(f"state_dict[{alias!r}] differs from {owner!r}, which it is tied to "
                                 f"(tie_embeddings={self.cfg.tie_embeddings!r})")
        with self._lock:
            for k, v in sd.items():
                if k in data:
                    np.copyto(data[k], v, casting="unsafe")

    def int8_matrices(self):
        """Names of the matrices an int8 model stores quantized: every linear map's weight and the
        embedding tables (the output projection too unless decoding.int8_generator keeps it wider).
        With FixNorm the tables it normalises stay float32: decoding quantizes their unit rows, which
        quantized stored tables would give only approximately (the file would translate otherwise
        than the model it was saved from)."""
        from .decoding import int8_generator
        names = [k for k, v in self.params.data.items() if v.ndim == 2]
        names = [k for k in names if k not in self.fixed]
        generator = self.params.tied.get("generator.weight", "generator.weight")
        return [k for k in names if k != generator or int8_generator(self.cfg) == "int8"]

    def save(self, path, precision="fp32"):
        """Write the directory `path`: config.json and model.safetensors (atomic writes, no pickle).

        precision "int8": the matrices of int8_matrices() are stored quantized (int8, one float32
        scale per row under "<name>.scale": a quarter of their float32 size), as int8 decoding
        uses them; load() gives a model whose float32 weights are their dequantized values and
        whose int8 decoding uses the stored integers as they are (nothing quantized again)."""
        precision = check_precision(precision, ("fp32", "int8"), "saving (bf16 models are saved as fp32)")
        path = _path(path)
        os.makedirs(path, exist_ok=True)
        atomic_write_bytes(os.path.join(path, CONFIG_FILE),
                           (json.dumps(self.cfg.to_dict(), indent=2, sort_keys=True) + "\n").encode())
        with self._lock:
            tensors = dict(self.params.data)
            if precision == "int8":
                for name in self.int8_matrices():
                    seed = self._int8_seed.get(name)
                    if seed is not None and np.array_equal(dequantize(*seed), tensors[name]):
                        q, scale = seed
                    else:
                        try:
                            q, scale = quantize(tensors[name])
                        except ValueError as exc:
                            raise ValueError(f"cannot save {name!r} as int8: {exc}") from None
                    tensors[name], tensors[f"{name}.scale"] = q, scale
            save_file(tensors, os.path.join(path, WEIGHTS_FILE),
                      metadata={"format": "transformer.Seq2SeqTransformer", "precision": precision})
        from .generation import GENERATION_FILE
        settings_path = os.path.join(path, GENERATION_FILE)
        if self.generation is not None:
            atomic_write_bytes(settings_path, (json.dumps(self.generation.to_json(), indent=2) + "\n").encode())
        elif os.path.isfile(settings_path):      # an older model's settings are not this one's
            os.remove(settings_path)

    @classmethod
    def load(cls, path):
        """A model from a directory written by save(); ValueError if anything is damaged."""
        path = _path(path)
        cfg_path = os.path.join(path, CONFIG_FILE)
        try:
            with open(cfg_path, "r", encoding="utf-8") as f:
                raw = json.load(f)
        except FileNotFoundError:
            raise
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"{cfg_path}: not a valid config file ({exc})") from None
        try:
            cfg = ModelConfig.from_dict(raw)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{cfg_path}: invalid config ({exc})") from None
        weights = os.path.join(path, WEIGHTS_FILE)
        sd = load_file(weights)
        model = cls(cfg)
        try:
            seeds = _split_int8(sd)
            model.load_state_dict(sd)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{weights}: {exc}") from None
        model._int8_seed.update(seeds)
        model.stored_precision = "int8" if seeds else "fp32"
        from .generation import GENERATION_FILE, GenerationSettings
        settings_path = os.path.join(path, GENERATION_FILE)
        if os.path.exists(settings_path):
            try:
                with open(settings_path, encoding="utf-8") as f:
                    raw = json.load(f)
            except (OSError, ValueError, UnicodeDecodeError) as exc:
                raise ValueError(f"{settings_path}: not a valid settings file ({exc})") from None
            model.generation = GenerationSettings.from_json(raw, cfg, settings_path)
        return model

    # ------------------------------------------------------------------ input checks

    def check_ids(self, x, name, vocab):
        """x as checked token ids: int64 C-contiguous [B, L], 1 <= L <= max_len, ids in [0, vocab)."""
        if isinstance(vocab, bool) or not isinstance(vocab, (int, np.integer)):
            raise TypeError(f"vocab must be an int, got {type(vocab).__name__}")
        if vocab < 1:
            raise ValueError(f"vocab must be >= 1, got {vocab}")
        return _ids(x, name, int(vocab), self.cfg.max_len)

    def _check_inputs(self, src, tgt_in, tgt_out=None):
        cfg = self.cfg
        src = _ids(src, "src", cfg.src_vocab_size, cfg.max_len)
        tgt_in = _ids(tgt_in, "tgt_in", cfg.tgt_vocab_size, cfg.max_len)
        if src.shape[0] != tgt_in.shape[0]:
            raise ValueError(f"src and tgt_in must have the same batch size, got {src.shape[0]} and {tgt_in.shape[0]}")
        if tgt_out is not None:
            tgt_out = _ids(tgt_out, "tgt_out", cfg.tgt_vocab_size, cfg.max_len)
            if tgt_out.shape != tgt_in.shape:
                raise ValueError(f"tgt_out must have the shape of tgt_in {tgt_in.shape}, got {tgt_out.shape}")
        return src, tgt_in, tgt_out


def _ids(x, name, vocab, max_len):
    """Token ids as int64 C-contiguous [B, L], checked: integers, 2-D, B >= 1, 1 <= L <= max_len,
    every id in [0, vocab)."""
    if not isinstance(x, np.ndarray):
        try:
            x = np.asarray(x)
        except Exception as exc:  # ragged lists and the like
            raise TypeError(f"{name} must be an integer array: {exc}") from None
    if x.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer array, got dtype {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D [batch, length], got shape {x.shape}")
    if x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"{name} must have at least one row and one position, got shape {x.shape}")
    if x.shape[1] > max_len:
        raise ValueError(f"{name} has length {x.shape[1]} > max_len {max_len}")
    lo, hi = int(x.min()), int(x.max())
    if lo < 0 or hi >= vocab:
        raise ValueError(f"{name} ids must be in [0, {vocab}), got values in [{lo}, {hi}]")
    return np.ascontiguousarray(x, dtype=np.int64)


def _check_bool(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def _path(path):
    """A file-system path (str, bytes or os.PathLike), or TypeError naming `path`."""
    try:
        return os.fspath(path)
    except TypeError:
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}") from None


def _padding_mask(ids, pad):
    """bool [B, L], True = padding (PyTorch's key_padding_mask convention); None if no padding."""
    mask = ids == pad
    return mask if mask.any() else None


def _target_padding_mask(tgt_in, cfg):
    """_padding_mask of the decoder input; when decoding starts from the pad token (bos_id ==
    pad_id, MarianMT), the first position is that start token, not padding."""
    mask = tgt_in == cfg.pad_id
    if cfg.bos_id == cfg.pad_id:
        mask[:, 0] = False
    return mask if mask.any() else None


def _positional_encoding(max_len, d_model, layout="interleaved"):
    """The sinusoidal table (section 3.5), float32 [max_len, d_model]: columns sin, cos, sin, ...
    (layout "interleaved", the paper's) or all sines then all cosines ("split", MarianMT's)."""
    pe = np.empty((max_len, d_model), dtype=np.float32)
    _C.positional_encoding(pe)
    if layout == "split":
        pe = np.ascontiguousarray(np.concatenate([pe[:, 0::2], pe[:, 1::2]], axis=1))
    return pe


def _check_smoothing(value):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"label_smoothing must be a float, got {type(value).__name__}")
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {value}")
    return value
