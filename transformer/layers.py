"""The layers of "Attention Is All You Need", each with a hand-written backward pass.

Conventions (llm.c's, see STYLE.md):
- activations are row-major [N, D] with N = B * T rows; parameters are views into the model's
  flat buffer and gradients views into the flat gradient buffer (transformer/params.py);
- `forward(...)` saves what `backward` needs (its inputs, softmax probabilities, layer-norm
  mean/rstd; dropout masks are regenerated from their seed, never stored) and returns an array
  the layer owns, valid until its next forward (LayerNorm, the encoder/decoder layers,
  Embedding), or a shared scratch array the caller consumes at once (MultiHeadAttention,
  FeedForward: their output only feeds dropout and the residual sum);
- `backward(dout, ...)` adds into the parameter gradients and returns the input gradient. A
  layer may overwrite `dout` (it belongs to the layer above, which is done with it); `dx=` and
  `accumulate=` let a caller have the input gradient written or added where it wants it, which
  is how residual connections are summed without an extra pass over memory;
- buffers are allocated once per batch shape (`Workspace`) and reused;
- the kernels are transformer._C; numpy only makes views and small glue.
"""
import math

import numpy as np

from . import _C
from .norms import ScaleNorm

__all__ = ["Workspace", "DropoutStream", "Linear", "LayerNorm", "Dropout", "WordDropout", "MultiHeadAttention",
           "FeedForward", "Embedding", "EncoderLayer", "DecoderLayer", "ScaleNorm"]

_f32 = np.float32


def _aligned_empty(n):
    """float32 [n] starting on a 64-byte (cache-line, AVX-512 vector) boundary."""
    raw = np.empty(n + 16, dtype=_f32)
    start = (-raw.ctypes.data % 64) // 4
    return raw[start:start + n]


class Workspace:
    """Buffers for the current batch shape. `persistent(owner, name, shape)` is an array that
    belongs to one layer (what its forward saves for backward); `scratch(name, shape)` is shared
    by every layer (temporaries that die within one layer's forward or backward call).

    Each (owner, name) keeps one flat backing array that only grows; a batch shape gets
    C-contiguous views into its first elements. So a trainer whose batch shapes vary from step to
    step (length-bucketed batches) allocates, and page-faults, only until the largest shape has
    been seen, and memory stays bounded by that largest shape.

    An inference call (`reset(key, inference=True)`: no backward follows) keeps nothing for a
    backward pass: each layer of a stack reads its input and writes its own buffers in turn, so
    the owners `share_layers` maps to a stand-in (the same part of the stack's first layer) use
    the stand-in's buffers, and a stack of N layers holds one layer's, not N (base, 6 encoder
    layers at fp32: 17.6 x d_model floats a source token, from 113)."""

    def __init__(self):
        self.key = None
        self.inference = False    # the call in progress has no backward (reset's inference)
        self._stand_in = {}       # id(owner) -> the owner whose buffers it uses at inference
        self.generation = 0   # bumped on every new shape: layers re-make their cached views
        self.bf16 = False     # the call in progress: linear maps on bf16 operands (precision="bf16")
        self.bf16_attention = False   # and the attention products too (training, forward)
        self.int8 = None      # or, for an int8 inference call, its PreparedWeights (prepared.py)
        self.kv_bf16 = False  # the decoder's keys and values rounded to bf16 (bf16 or int8 inference)
        self.fused_attention = True   # MultiHeadAttention may take the fused kernel (fused_attention_fits)
        self._backing = {}
        self._views = {}

    def share_layers(self, layers):
        """At inference, each layer's buffer owners (its `owners()`, position by position) use
        those of layers[0]."""
        first = layers[0].owners()
        for layer in layers[1:]:
            owners = layer.owners()
            assert len(owners) == len(first)
            for owner, stand_in in zip(owners, first):
                self._stand_in[id(owner)] = stand_in

    def reset(self, key, inference=False):
        """A call of batch shape `key` begins; inference: no backward follows it."""
        self.inference = inference
        key = (key, inference)
        if key != self.key:
            self._views = {}
            self.key = key
            self.generation += 1

    def _get(self, k, shape):
        v = self._views.get((k, shape))
        if v is None:
            n = 1
            for s in shape:
                n *= s
            buf = self._backing.get(k)
            if buf is None or buf.size < n:
                buf = self._backing[k] = _aligned_empty(n if buf is None else max(n, buf.size + buf.size // 4))
            v = self._views[(k, shape)] = buf[:n].reshape(shape)
        return v

    def persistent(self, owner, name, shape):
        if self.inference:
            owner = self._stand_in.get(id(owner), owner)
        return self._get((id(owner), name), shape)

    def scratch(self, name, shape):
        return self._get((None, name), shape)

    def nbytes(self):
        return sum(a.nbytes for a in self._backing.values())


class DropoutStream:
    """The counter-based random stream every dropout site draws from (section 5.4).

    A call of the model sets `seed` from the model's seed and a call counter; each site adds its
    own fixed offset, so element i of site s draws uniform(seed, offset_s + i): the masks depend on
    neither the thread count nor the order of kernels, and backward regenerates them."""

    SITE_STRIDE = 1 << 40  # elements one site may draw; offsets never overlap

    def __init__(self, seed):
        self.base_seed = int(seed) & 0xFFFFFFFFFFFFFFFF
        self.calls = 0
        self.seed = 0
        self.training = False
        self._sites = 0
        self.rank = 0          # DataParallel: each rank draws its own masks (rank 0: a plain run's)
        self.users = []        # the Dropout sites drawing from this stream

    def new_site(self):
        offset = self._sites * self.SITE_STRIDE
        self._sites += 1
        return offset

    def next_call(self):
        """Advance to the next training call: a fresh seed mixed from (base seed, call counter)."""
        self.calls += 1
        self.seed = _splitmix64(self.base_seed ^ _splitmix64(self.calls))
        if self.rank:
            self.seed = _splitmix64(self.seed ^ _splitmix64(0xD1B54A32D192ED03 * self.rank & 0xFFFFFFFFFFFFFFFF))
        return self.seed


def _splitmix64(z):
    z = (z + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


class Dropout:
    """Dropout (section 5.4): out = x * keep / (1 - p), active only in training calls.

    `site` names the config rate it takes (ModelConfig.dropout_at): "residual" (the embeddings and
    each sublayer's output), "attention" (the attention weights), "activation" (the feed-forward
    hidden activation) or "word" (WordDropout)."""

    def __init__(self, p, stream, site="residual"):
        self.p = float(p)
        self.site = site
        self.stream = stream
        self.offset = stream.new_site()
        stream.users.append(self)

    @property
    def active(self):
        return self.p > 0.0 and self.stream.training

    def forward_(self, x):
        """In place on x (x's undropped values are not needed by any backward)."""
        if self.p > 0.0 and self.stream.training:
            _C.dropout_forward(x, x, self.p, self.stream.seed, self.offset)
        return x

    def call(self):
        """(p, seed, offset) of this call for a kernel that fuses the dropout: p 0 when inactive."""
        active = self.p > 0.0 and self.stream.training
        return (self.p if active else 0.0), self.stream.seed, self.offset

    def backward(self, dout, dx):
        """dx = dout * mask / (1 - p); returns dout itself when inactive (no copy)."""
        if self.p > 0.0 and self.stream.training:
            _C.dropout_backward(dout, dx, self.p, self.stream.seed, self.offset)
            return dx
        return dout


class WordDropout(Dropout):
    """Source word dropout (Marian's --dropout-src; Gal and Ghahramani 2016 drop word types, this
    drops tokens): in a training call, row r of the [B*S] source tokens keeps its word embedding
    iff uniform(seed, offset + r) >= p, scaled by 1 / (1 - p) as every dropout here; a dropped
    token's embedding is zeroed, every feature together, and its position encoding stays (the
    model sees that a word was there). Its own site of the stream, drawn like any other: the same
    bits at any thread count, and a shard's rows counted from 0 under the shard's seed (shards.py)."""

    def __init__(self, p, stream):
        super().__init__(p, stream, site="word")

    def factors(self, rows, out):
        """out float32 [rows] = keep / (1 - p) for each row (exactly dropout_forward of ones)."""
        out.fill(1.0)
        _C.dropout_forward(out, out, self.p, self.stream.seed, self.offset)
        return out


class Linear:
    """A learned linear map y = x Wᵀ + b (sections 3.2.2 and 3.3; the pre-softmax projection of 3.4)."""

    def __init__(self, weight, bias, dweight, dbias, ws, name, full=None, rows=None):
        self.weight, self.bias, self.dweight, self.dbias = weight, bias, dweight, dbias
        self.ws = ws
        # weight is parameter `name` (`full`), or its rows `rows` (a slice): int8 calls look the
        # quantized matrix up by these
        self.name, self.full, self.rows = name, weight if full is None else full, rows
        self._packed = (None, None)      # pack_weight's buffers, packed again in place each call

    def matmul(self, x, out, bias=False):
        """out = x Wᵀ (+ b when bias), at the precision of the call in progress."""
        ws = self.ws
        if ws.int8 is not None:   # the bias fused into the dequantization, as decoding's steps do
            packed = ws.int8.linear("int8", self.name, self.full, self.rows)
            _C.qgemm_packed(x, packed, self.bias if bias else None, out)
        else:
            _C.gemm(x, self.weight, out, False, True, bf16=ws.bf16)
            if bias:
                _C.add_bias(out, self.bias)
        return out

    def forward(self, x, out, bias=True, packed=None):
        # x [N, in], out [N, out]; bias=False: the caller adds the bias (residual_layernorm_forward);
        # packed: pack_weight()'s pair, for a caller that multiplies many blocks of rows by it
        if packed is None:
            return self.matmul(x, out, bias=bias)
        _C.gemm_packed(x, packed[0], out)
        if bias:
            _C.add_bias(out, self.bias)
        return out

    def backward(self, dout, x, dx=None, accumulate=False, bias=True, packed=None):
        # dout [N, out], x [N, in] (the forward input), dx [N, in] or None; bias=False: the caller
        # has added the bias's gradient (residual_layernorm_backward); packed: as forward's
        bf16 = self.ws.bf16
        _C.gemm(dout, x, self.dweight, True, False, 1.0, True, bf16)     # dW += doutᵀ x
        if bias:
            _C.bias_grad(dout, self.dbias)                         # db += colsum(dout)
        if dx is not None:                                         # dx (+)= dout W
            if packed is None:
                _C.gemm(dout, self.weight, dx, False, False, 1.0, accumulate, bf16)
            else:
                _C.gemm_packed(dout, packed[1], dx, 1.0, accumulate)
        return dx

    def pack_weight(self):
        """Wᵀ and W packed for the micro-kernels (at the precision of the call in progress), for
        forward's x Wᵀ and backward's dout W over many blocks of rows: each block's product then
        reads the packed panels instead of packing the weight again (the blocked output pass packed
        a 4,000 x 128 weight twice a block). The same bits as gemm's for blocks of 16 rows or more
        (its dot path for fewer rows sums in another order; neither depends on the thread count).
        Its buffers are packed again in place on every call."""
        bf16 = self.ws.bf16
        self._packed = (_C.gemm_pack_b(self.weight, trans_b=True, reuse=self._packed[0], bf16=bf16),
                        _C.gemm_pack_b(self.weight, trans_b=False, reuse=self._packed[1], bf16=bf16))
        return self._packed


# The training pass's output projection and loss run over blocks of rows whose logits take about
# this many bytes, so that a block's logits stay in cache from the product that writes them through
# the bias, the softmax and cross-entropy and the two backward products that read the gradient.
# Over the whole batch at once (2,048 rows x 4,000 words: 33 MB) each of those six passes went to
# memory: on a Zen 5 with two threads the output layer's forward and backward took 16.1 ms of a
# 50 ms bf16 step, and 13.7 ms in blocks of 256 rows (4 MB); the step ran 1.09x faster (fp32 1.08x;
# benchmarks/output_blocks.py). The logits' memory is a block's, not the batch's.
OUTPUT_BLOCK_BYTES = 4 << 20


def output_rows_per_block(n, d_model, vocab):
    """Rows of each block of the blocked output pass: about OUTPUT_BLOCK_BYTES of logits, a multiple
    of 16; or n (one block: the whole batch, the pass unblocked) when that is no fewer rows, or when
    such a block holds fewer than 2 x d_model rows: each block reads and writes dW (d_model x vocab
    floats) once more, which then costs about what the block saves. Measured on Zen 5 (2 threads):
    d_model 512 and 58,101 words (MarianMT's) in blocks of 1,024 rows ran 0.84x (bf16) and 0.89x (fp32)."""
    rows = OUTPUT_BLOCK_BYTES // (4 * max(vocab, 1)) // 16 * 16
    return n if rows < max(2 * d_model, 16) else min(n, rows)


def output_loss(generator, h, targets, pad_id, label_smoothing, grad_scale, dh, ws):
    """The pre-softmax projection and the loss, forward and backward, over the decoder's rows h [N, D]
    with targets [N]: returns the mean cross-entropy over the non-pad targets (label-smoothed),
    ADDS grad_scale * its gradient into the generator's dW and db, and writes it for h into dh [N, D].

    Block by block of output_rows_per_block rows. A row's logits, loss and gradient are computed as
    in one block (the gradient's scale, grad_scale / count, reaches the loss kernel as
    (grad_scale * share / count) / share: equal but for a double's last bit); the sums over rows
    (the loss, dW, db) add block after block, in an order fixed by the shapes alone."""
    n, vocab = len(h), generator.weight.shape[0]
    count = int(np.count_nonzero(targets != pad_id))
    rows = output_rows_per_block(n, h.shape[1], vocab) if count else n
    total = 0.0
    packed = generator.pack_weight() if rows < n else None     # once for every block
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        logits = ws.scratch("output.logits", (r1 - r0, vocab))
        generator.forward(h[r0:r1], logits, packed=packed)
        # the gradient of the mean loss (of this block's share of it) overwrites the logits
        if rows == n:
            total, _ = _C.cross_entropy(logits, targets, logits, pad_id, label_smoothing, grad_scale)
        else:
            share = int(np.count_nonzero(targets[r0:r1] != pad_id))
            loss, _ = _C.cross_entropy(logits, targets[r0:r1], logits, pad_id, label_smoothing,
                                       grad_scale * share / count)
            total += loss * share / count
        generator.backward(logits, h[r0:r1], dh[r0:r1], packed=packed)
    return total


class LayerNorm:
    """Layer normalisation (Ba et al. 2016) as nn.LayerNorm: biased variance, eps 1e-5."""

    def __init__(self, weight, bias, dweight, dbias, ws, eps=1e-5):
        self.weight, self.bias, self.dweight, self.dbias = weight, bias, dweight, dbias
        self.ws, self.eps = ws, eps

    def _buffers(self, n, d):
        """The output [n, d] (returned) and the saved mean and rstd [n] of a forward call."""
        self.mean = self.ws.persistent(self, "mean", (n,))
        self.rstd = self.ws.persistent(self, "rstd", (n,))
        return self.ws.persistent(self, "out", (n, d))

    def forward(self, x):
        # x [N, D] (kept, not copied: the caller must not overwrite it before backward)
        out = self._buffers(*x.shape)
        _C.layernorm_forward(x, self.weight, self.bias, out, self.mean, self.rstd, self.eps)
        self.x = x
        return out

    def forward_residual(self, sub, linear, residual, dropout, s):
        """The residual connection into this norm and the norm, in one pass (csrc/residual_norm.h):
        s = residual + dropout(sub + linear's bias) is written into s [N, D] (kept, as forward keeps
        x), and LayerNorm(s) returned. sub: the sub-layer's output without its last bias."""
        out = self._buffers(*s.shape)
        _C.residual_layernorm_forward(sub, linear.bias, residual, s, self.weight, self.bias, out, self.mean,
                                      self.rstd, self.eps, *dropout.call())
        self.x = s
        return out

    def backward(self, dout, dx, accumulate=False):
        # dout [N, D]; dx [N, D] (may be dout when not accumulate)
        _C.layernorm_backward(dout, self.x, self.weight, self.mean, self.rstd, dx,
                              self.dweight, self.dbias, accumulate)
        return dx

    def backward_residual(self, dout, linear, dropout, tmp):
        """Backward of forward_residual: dout [N, D] becomes d s (the residual's gradient); returns
        the gradient of the sub-layer's output (dropout's backward of d s: in tmp, or dout itself
        when dropout is off) and adds its column sums into linear's bias gradient."""
        p, seed, offset = dropout.call()
        dd = tmp if p > 0.0 else None
        _C.residual_layernorm_backward(dout, self.x, self.weight, self.mean, self.rstd, dout, dd, self.dweight,
                                       self.dbias, linear.dbias, p, seed, offset)
        return dout if dd is None else dd


FUSED_ATTENTION_MAX_LEN = 512   # longer sentences: the per-thread Tq x Tk buffers outgrow L2


def fused_attention_fits(d_head, Tq, Tk, bf16):
    """Whether attention of this shape takes the fused kernel (csrc/attention_train.h): heads of
    32 to 64 dimensions (what its register tiles are sized for), sentences up to
    FUSED_ATTENTION_MAX_LEN, and a SIMD level with its micro-kernels (AVX2 or better: 1.0-1.6x
    the batched GEMMs on Zen 4, benchmarks/attention_fused.py; the plain C loops are slower).
    bf16 is the precision of the products: the kernel handles both."""
    return (32 <= d_head <= 64 and Tq <= FUSED_ATTENTION_MAX_LEN and Tk <= FUSED_ATTENTION_MAX_LEN
            and _C.attention_train_path() != "generic")


class MultiHeadAttention:
    """Multi-head scaled dot-product attention (sections 3.2.1-3.2.2), all heads at once.

    Self-attention projects Q, K, V from x with one fused gemm ([N, 3D]); cross-attention projects
    Q from x and K, V from the encoder memory. Heads are strided views ([B, T, 3, H, dh] ->
    [B, H, T, dh]) fed to 4-D batched gemms: no copies, no loop over heads or batch rows."""

    def __init__(self, params, grads, prefix, n_heads, dropout, stream, ws, cross=False, cached=False):
        # cached: a decoder's attention, whose keys and values decoding keeps in caches: in bf16
        # for the reduced precisions (decoding.cache_dtype), so the forward pass of those
        # precisions (ws.kv_bf16) rounds them the same way.
        self.cached = cached
        w, b = params[f"{prefix}.in_proj_weight"], params[f"{prefix}.in_proj_bias"]
        dw, db = grads[f"{prefix}.in_proj_weight"], grads[f"{prefix}.in_proj_bias"]
        d = w.shape[1]
        self.d_model, self.n_heads, self.d_head = d, n_heads, d // n_heads
        self.scale = 1.0 / math.sqrt(self.d_head)
        self.cross = cross
        if cross:
            name = f"{prefix}.in_proj_weight"
            self.q_proj = Linear(w[:d], b[:d], dw[:d], db[:d], ws, name, w, slice(0, d))
            self.kv_proj = Linear(w[d:], b[d:], dw[d:], db[d:], ws, name, w, slice(d, 3 * d))
        else:
            self.qkv_proj = Linear(w, b, dw, db, ws, f"{prefix}.in_proj_weight")
        self.out_proj = Linear(params[f"{prefix}.out_proj.weight"], params[f"{prefix}.out_proj.bias"],
                               grads[f"{prefix}.out_proj.weight"], grads[f"{prefix}.out_proj.bias"], ws,
                               f"{prefix}.out_proj.weight")
        self.attn_dropout = Dropout(dropout, stream, site="attention")
        self.ws = ws
        self._key = None

    def _setup(self, B, Tq, Tk):
        """Buffers and head views for one batch shape (views are made once, then reused)."""
        ws, H, dh, D = self.ws, self.n_heads, self.d_head, self.d_model
        self.B, self.Tq, self.Tk = B, Tq, Tk
        if self.cross:
            self.q = ws.persistent(self, "q", (B * Tq, D))
            self.kv = ws.persistent(self, "kv", (B * Tk, 2 * D))
            self.q4 = self.q.reshape(B, Tq, H, dh).transpose(0, 2, 1, 3)
            kv5 = self.kv.reshape(B, Tk, 2, H, dh)
            self.k4 = kv5[:, :, 0].transpose(0, 2, 1, 3)
            self.v4 = kv5[:, :, 1].transpose(0, 2, 1, 3)
            self.q2, self.k2, self.v2 = self.q, self.kv[:, :D], self.kv[:, D:]   # the fused kernel's views
        else:
            self.qkv = ws.persistent(self, "qkv", (B * Tq, 3 * D))
            qkv5 = self.qkv.reshape(B, Tq, 3, H, dh)
            self.q4 = qkv5[:, :, 0].transpose(0, 2, 1, 3)
            self.k4 = qkv5[:, :, 1].transpose(0, 2, 1, 3)
            self.v4 = qkv5[:, :, 2].transpose(0, 2, 1, 3)
            self.q2, self.k2, self.v2 = self.qkv[:, :D], self.qkv[:, D:2 * D], self.qkv[:, 2 * D:]
        # softmax probabilities, written over the raw scores (backward needs only the probs)
        self.probs = ws.persistent(self, "probs", (B, H, Tq, Tk))
        # the context is written head by head straight into [B, T, H, dh] = [N, D]: the concat of 3.2.2
        self.ctx = ws.persistent(self, "ctx", (B * Tq, D))
        self.ctx4 = self.ctx.reshape(B, Tq, H, dh).transpose(0, 2, 1, 3)
        self.out = ws.scratch("attn.out", (B * Tq, D))   # consumed by the caller at once
        if not ws.inference:
            self._setup_gradients(B, Tq, Tk)

    def _setup_gradients(self, B, Tq, Tk):
        """The gradient buffers and views of backward (not made for an inference call)."""
        ws, H, dh, D = self.ws, self.n_heads, self.d_head, self.d_model
        if self.cross:
            self.dq = ws.scratch("attn.dq", (B * Tq, D))
            self.dkv = ws.scratch("attn.dkv", (B * Tk, 2 * D))
            self.dq4 = self.dq.reshape(B, Tq, H, dh).transpose(0, 2, 1, 3)
            dkv5 = self.dkv.reshape(B, Tk, 2, H, dh)
            self.dk4 = dkv5[:, :, 0].transpose(0, 2, 1, 3)
            self.dv4 = dkv5[:, :, 1].transpose(0, 2, 1, 3)
            self.dq2, self.dk2, self.dv2 = self.dq, self.dkv[:, :D], self.dkv[:, D:]
        else:
            self.dqkv = ws.scratch("attn.dqkv", (B * Tq, 3 * D))
            dqkv5 = self.dqkv.reshape(B, Tq, 3, H, dh)
            self.dq4 = dqkv5[:, :, 0].transpose(0, 2, 1, 3)
            self.dk4 = dqkv5[:, :, 1].transpose(0, 2, 1, 3)
            self.dv4 = dqkv5[:, :, 2].transpose(0, 2, 1, 3)
            self.dq2, self.dk2, self.dv2 = self.dqkv[:, :D], self.dqkv[:, D:2 * D], self.dqkv[:, 2 * D:]
        self.dctx = ws.scratch("attn.dctx", (B * Tq, D))
        self.dctx4 = self.dctx.reshape(B, Tq, H, dh).transpose(0, 2, 1, 3)

    def forward(self, x, memory, B, Tq, Tk, key_padding_mask, causal, bias=True):
        # x [B*Tq, D]; memory [B*Tk, D] (cross) or None (self); key_padding_mask bool [B, Tk] or None;
        # bias=False: the output projection's bias is left to the caller (LayerNorm.forward_residual)
        key = (self.ws.generation, B, Tq, Tk)
        if key != self._key:
            self._setup(B, Tq, Tk)
            self._key = key
        self.x, self.memory = x, memory
        if self.cross:
            self.q_proj.forward(x, self.q)
            self.kv_proj.forward(memory, self.kv)
        else:
            self.qkv_proj.forward(x, self.qkv)
        if self.cached and self.ws.kv_bf16:   # the keys and values a bf16 cache holds
            _C.round_bf16_(self.kv if self.cross else self.qkv[:, self.d_model:])
        probs, bf16 = self.probs, self.ws.bf16_attention
        self.fused = self.ws.fused_attention and fused_attention_fits(self.d_head, Tq, Tk, bf16)
        if self.fused:   # scores, masks, softmax, dropout and (.) V per (sentence, head), in cache
            drop = self.attn_dropout
            self.fused_call = (causal, drop.p if drop.active else 0.0, drop.stream.seed, drop.offset)
            _C.attention_train_forward(self.q2, self.k2, self.v2, probs, self.ctx, self.scale, causal,
                                       key_padding_mask, *self.fused_call[1:], bf16)
            return self.out_proj.forward(self.ctx, self.out, bias)           # Concat(heads) W^O
        _C.gemm(self.q4, self.k4, probs, False, True, bf16=bf16)            # Q Kᵀ
        _C.softmax_forward(probs, probs, self.scale, causal, key_padding_mask)  # softmax(QKᵀ/sqrt(dk))
        if self.attn_dropout.active:
            self.probs_d = self.ws.persistent(self, "probs_d", probs.shape)
            _C.dropout_forward(probs, self.probs_d, self.attn_dropout.p,
                               self.attn_dropout.stream.seed, self.attn_dropout.offset)
        else:
            self.probs_d = probs
        _C.gemm(self.probs_d, self.v4, self.ctx4, bf16=bf16)                 # (.) V, heads concatenated
        return self.out_proj.forward(self.ctx, self.out, bias)               # Concat(heads) W^O

    def backward(self, dout, dx, accumulate=False, dmemory=None, accumulate_memory=False, bias=True):
        # dout [B*Tq, D] (read before dx is written, so dx may be dout); dx [B*Tq, D];
        # dmemory [B*Tk, D] receives (or, accumulate_memory, adds) the gradient of memory (cross);
        # bias=False: the output projection's bias gradient is the caller's (backward_residual)
        self.out_proj.backward(dout, self.ctx, self.dctx, bias=bias)
        bf16 = self.ws.bf16_attention
        if self.fused:
            _C.attention_train_backward(self.dctx, self.q2, self.k2, self.v2, self.probs, self.dq2,
                                        self.dk2, self.dv2, self.scale, *self.fused_call, bf16)
        else:
            self._backward_unfused(bf16)
        if self.cross:
            self.kv_proj.backward(self.dkv, self.memory, dmemory, accumulate_memory)
            self.q_proj.backward(self.dq, self.x, dx, accumulate)
        else:
            self.qkv_proj.backward(self.dqkv, self.x, dx, accumulate)
        return dx

    def _backward_unfused(self, bf16):
        dprobs = self.ws.scratch("attn.dprobs", self.probs.shape)
        _C.gemm(self.dctx4, self.v4, dprobs, False, True, bf16=bf16)         # dP = dC Vᵀ
        _C.gemm(self.probs_d, self.dctx4, self.dv4, True, False, bf16=bf16)  # dV = Pᵀ dC
        if self.attn_dropout.active:
            _C.dropout_backward(dprobs, dprobs, self.attn_dropout.p,
                                self.attn_dropout.stream.seed, self.attn_dropout.offset)
        _C.softmax_backward(self.probs, dprobs, dprobs, self.scale)          # dS (scaled)
        _C.gemm(dprobs, self.k4, self.dq4, bf16=bf16)                        # dQ = dS K
        _C.gemm(dprobs, self.q4, self.dk4, True, False, bf16=bf16)           # dK = dSᵀ Q


class FeedForward:
    """Position-wise feed-forward network (section 3.3): FFN(x) = act(x W1ᵀ + b1) W2ᵀ + b2,
    with PyTorch's dropout between the activation and the second linear map."""

    def __init__(self, params, grads, prefix, activation, dropout, stream, ws):
        self.linear1 = Linear(params[f"{prefix}.linear1.weight"], params[f"{prefix}.linear1.bias"],
                              grads[f"{prefix}.linear1.weight"], grads[f"{prefix}.linear1.bias"], ws,
                              f"{prefix}.linear1.weight")
        self.linear2 = Linear(params[f"{prefix}.linear2.weight"], params[f"{prefix}.linear2.bias"],
                              grads[f"{prefix}.linear2.weight"], grads[f"{prefix}.linear2.bias"], ws,
                              f"{prefix}.linear2.weight")
        self.activation = activation
        self.dropout = Dropout(dropout, stream, site="activation")
        self.ws = ws
        self.d_ff, self.d_model = self.linear1.weight.shape

    def forward(self, x, bias=True):
        # x [N, D] -> [N, D]; bias=False: the second map's bias is left to the caller
        n = x.shape[0]
        ws = self.ws
        self.pre = ws.persistent(self, "pre", (n, self.d_ff))     # x W1ᵀ + b1 (act_backward needs it)
        # at inference nothing needs the pre-activation: the activation overwrites it
        self.hidden = self.pre if ws.inference else ws.persistent(self, "hidden", (n, self.d_ff))
        out = ws.scratch("ffn.out", (n, self.d_model))     # consumed by the caller at once
        self.x = x
        self.linear1.matmul(x, self.pre)
        _C.bias_act_forward(self.pre, self.linear1.bias, self.hidden, self.activation)
        self.dropout.forward_(self.hidden)
        self.linear2.matmul(self.hidden, out)
        if bias:
            _C.add_bias(out, self.linear2.bias)
        return out

    def backward(self, dout, dx, accumulate=False, bias=True):
        # dout [N, D] (read before dx is written: dx may be dout); dx [N, D]; bias=False: the
        # second map's bias gradient is the caller's
        dhidden = self.ws.scratch("ffn.dhidden", self.pre.shape)
        self.linear2.backward(dout, self.hidden, dhidden, bias=bias)
        if fuse_residual_norm:     # the dropout's, the activation's and b1's gradients in one pass
            _C.dropout_bias_backward(dhidden, dhidden, self.linear1.dbias, *self.dropout.call(), pre=self.pre,
                                     activation=self.activation)
            return self.linear1.backward(dhidden, self.x, dx, accumulate, bias=False)
        self.dropout.backward(dhidden, dhidden)
        _C.act_backward(dhidden, self.pre, dhidden, self.activation)
        return self.linear1.backward(dhidden, self.x, dx, accumulate)


class Embedding:
    """Embeddings and positional encoding (sections 3.4-3.5): table[ids] * sqrt(d_model) + PE,
    then dropout. `scale`: the factor (sqrt(d_model) unless the config says not to scale);
    `pad_id`: the row no lookup trains (nn.Embedding's padding_idx); `words`: a WordDropout
    (the source embedding's), set by the model, or None."""

    def __init__(self, table, dtable, pe, dropout, stream, ws, scale=None, pad_id=None):
        self.table, self.dtable, self.pe = table, dtable, pe
        self.d_model = table.shape[1]
        self.scale = math.sqrt(self.d_model) if scale is None else float(scale)
        self.pad_id = pad_id
        self.dropout = Dropout(dropout, stream)
        self.words = None
        self.ws = ws

    def forward(self, ids, table=None):
        # ids int64 [B, T] -> [B*T, D]; table: another table to read (int8 inference: dequantized)
        B, T = ids.shape
        out = self.ws.persistent(self, "out", (B * T, self.d_model))
        out3 = out.reshape(B, T, self.d_model)
        table = self.table if table is None else table
        self.ids = ids
        self.word_factors = None
        if self.words is not None and self.words.active:
            # word dropout: (table[ids] * scale) * keep / (1 - p) + PE, each product rounded
            f = self.words.factors(B * T, self.ws.persistent(self, "word_factors", (B * T,)))
            _C.embedding_forward(ids, table, out3, self.scale, None, 0)
            np.multiply(out3, f.reshape(B, T, 1), out=out3)
            np.add(out3, self.pe[:T], out=out3)
            self.word_factors = f
        else:
            _C.embedding_forward(ids, table, out3, self.scale, self.pe, 0)
        return self.dropout.forward_(out)

    def backward(self, dout):
        # dout [B*T, D] (overwritten)
        B, T = self.ids.shape
        dout = self.dropout.backward(dout, dout)
        if self.pad_id is not None:
            # padding_idx: pad positions add nothing to the pad row (in exact arithmetic they carry
            # no gradient anyway, except a pad start token: MarianMT's decoder input)
            dout[self.ids.reshape(-1) == self.pad_id] = 0.0
        if self.word_factors is not None:   # a dropped word's row adds nothing to its table row
            np.multiply(dout, self.word_factors.reshape(-1, 1), out=dout)
        _C.embedding_backward(self.ids, dout.reshape(B, T, self.d_model), self.dtable, self.scale)


# The layers run each sub-layer's bias, dropout, residual add and the norm after it as one kernel,
# and backward, a dropout's, an activation's and a bias's gradients (csrc/residual_norm.h: the same
# bits as the kernels one by one). False: one by one (tests and benchmarks compare the two).
fuse_residual_norm = True


def branch_backward(dout, dropout, linear, tmp):
    """A pre-norm layer's residual branch, backward through its dropout and its last linear map's
    bias in one pass: returns the gradient of the branch's output before the dropout (in tmp, or
    dout itself when the dropout is off) and adds its column sums into linear's bias gradient."""
    p, seed, offset = dropout.call()
    d = tmp if p > 0.0 else dout
    _C.dropout_bias_backward(dout, d, linear.dbias, p, seed, offset)
    return d


def norm_layer(params, grads, name, ws, kind="layer"):
    """The norm `name` of a config's kind (ModelConfig.norm): LayerNorm or ScaleNorm (norms.py)."""
    if kind == "scale":
        return ScaleNorm(params[f"{name}.weight"], grads[f"{name}.weight"], ws)
    return LayerNorm(params[f"{name}.weight"], params[f"{name}.bias"],
                     grads[f"{name}.weight"], grads[f"{name}.bias"], ws)


class EncoderLayer:
    """One encoder layer (section 3.1): self-attention, then feed-forward, each wrapped in a
    residual connection and layer norm: LayerNorm(x + Sublayer(x)) (norm_first=False, the paper's)
    or x + Sublayer(LayerNorm(x)) (norm_first=True), as torch.nn.TransformerEncoderLayer."""

    def __init__(self, params, grads, prefix, cfg, stream, ws):
        p, attention = cfg.dropout, cfg.dropout_at("attention")
        self.self_attn = MultiHeadAttention(params, grads, f"{prefix}.self_attn", cfg.n_heads, attention, stream, ws)
        self.feed_forward = FeedForward(params, grads, prefix, cfg.activation, cfg.dropout_at("activation"),
                                        stream, ws)
        self.norm1 = norm_layer(params, grads, f"{prefix}.norm1", ws, cfg.norm)
        self.norm2 = norm_layer(params, grads, f"{prefix}.norm2", ws, cfg.norm)
        self.dropout1 = Dropout(p, stream)
        self.dropout2 = Dropout(p, stream)
        self.norm_first = cfg.norm_first
        self.ws = ws

    def owners(self):
        """What holds this layer's buffers in the workspace (Workspace.share_layers)."""
        return [self, self.self_attn, self.feed_forward, self.norm1, self.norm2]

    def forward(self, x, B, S, src_pad):
        # x [B*S, D] -> [B*S, D]
        ws = self.ws
        s1 = ws.persistent(self, "s1", x.shape)
        # each sub-layer's bias, dropout, residual add and the norm after it in one pass (not with
        # int8 weights, whose products add the bias as they dequantize)
        self.fused = fuse_residual_norm and ws.int8 is None
        if self.fused:
            attn, ffn = self.self_attn, self.feed_forward
            if self.norm_first:
                a = attn.forward(self.norm1.forward(x), None, B, S, S, src_pad, False, bias=False)
                f = ffn.forward(self.norm2.forward_residual(a, attn.out_proj, x, self.dropout1, s1), bias=False)
                out = ws.persistent(self, "s2", x.shape)
                _C.dropout_add_forward(f, s1, out, *self.dropout2.call(), bias=ffn.linear2.bias)
                return out
            a = attn.forward(x, None, B, S, S, src_pad, False, bias=False)
            h1 = self.norm1.forward_residual(a, attn.out_proj, x, self.dropout1, s1)
            f = ffn.forward(h1, bias=False)
            return self.norm2.forward_residual(f, ffn.linear2, h1, self.dropout2, ws.persistent(self, "s2", x.shape))
        if self.norm_first:
            a = self.self_attn.forward(self.norm1.forward(x), None, B, S, S, src_pad, False)
            _C.add(x, self.dropout1.forward_(a), s1)
            f = self.feed_forward.forward(self.norm2.forward(s1))
            out = ws.persistent(self, "s2", x.shape)
            _C.add(s1, self.dropout2.forward_(f), out)
            return out
        a = self.self_attn.forward(x, None, B, S, S, src_pad, False)
        _C.add(x, self.dropout1.forward_(a), s1)
        h1 = self.norm1.forward(s1)
        f = self.feed_forward.forward(h1)
        s2 = ws.persistent(self, "s2", x.shape)
        _C.add(h1, self.dropout2.forward_(f), s2)
        return self.norm2.forward(s2)

    def backward(self, dout):
        # dout [B*S, D], overwritten with and returned as the input gradient
        tmp = self.ws.scratch("layer.tmp", dout.shape) if self.dropout1.active else None
        if self.norm_first:
            attn, ffn, fused = self.self_attn, self.feed_forward, self.fused
            dn = self.ws.scratch("layer.dn", dout.shape)
            d = branch_backward(dout, self.dropout2, ffn.linear2, tmp) if fused else self.dropout2.backward(dout, tmp)
            self.norm2.backward(ffn.backward(d, dn, bias=not fused), dout, accumulate=True)       # dout = d s1
            d = branch_backward(dout, self.dropout1, attn.out_proj, tmp) if fused else self.dropout1.backward(dout, tmp)
            self.norm1.backward(attn.backward(d, dn, bias=not fused), dout, accumulate=True)      # dout = d x
            return dout
        if self.fused:
            attn, ffn = self.self_attn, self.feed_forward
            d = self.norm2.backward_residual(dout, ffn.linear2, self.dropout2, tmp)     # dout = d s2
            ffn.backward(d, dout, accumulate=True, bias=False)                          # d h1
            d = self.norm1.backward_residual(dout, attn.out_proj, self.dropout1, tmp)   # dout = d s1
            attn.backward(d, dout, accumulate=True, bias=False)                         # d x
            return dout
        self.norm2.backward(dout, dout)                                      # dout = d s2
        self.feed_forward.backward(self.dropout2.backward(dout, tmp), dout, accumulate=True)  # d h1
        self.norm1.backward(dout, dout)                                      # dout = d s1
        self.self_attn.backward(self.dropout1.backward(dout, tmp), dout, accumulate=True)     # d x
        return dout


class DecoderLayer:
    """One decoder layer (section 3.1): masked self-attention, attention over the encoder output,
    feed-forward, each with a residual connection and layer norm in either placement, as
    torch.nn.TransformerDecoderLayer."""

    def __init__(self, params, grads, prefix, cfg, stream, ws):
        p, attention = cfg.dropout, cfg.dropout_at("attention")
        self.self_attn = MultiHeadAttention(params, grads, f"{prefix}.self_attn", cfg.n_heads, attention, stream,
                                            ws, cached=True)
        self.cross_attn = MultiHeadAttention(params, grads, f"{prefix}.multihead_attn", cfg.n_heads, attention,
                                             stream, ws, cross=True, cached=True)
        self.feed_forward = FeedForward(params, grads, prefix, cfg.activation, cfg.dropout_at("activation"),
                                        stream, ws)
        self.norm1 = norm_layer(params, grads, f"{prefix}.norm1", ws, cfg.norm)
        self.norm2 = norm_layer(params, grads, f"{prefix}.norm2", ws, cfg.norm)
        self.norm3 = norm_layer(params, grads, f"{prefix}.norm3", ws, cfg.norm)
        self.dropout1 = Dropout(p, stream)
        self.dropout2 = Dropout(p, stream)
        self.dropout3 = Dropout(p, stream)
        self.norm_first = cfg.norm_first
        self.ws = ws

    def owners(self):
        """As EncoderLayer.owners."""
        return [self, self.self_attn, self.cross_attn, self.feed_forward, self.norm1, self.norm2, self.norm3]

    def forward(self, y, memory, B, T, S, tgt_pad, src_pad, causal=True):
        # y [B*T, D], memory [B*S, D] -> [B*T, D]; causal=False lets position i see every target
        # position (only to demonstrate the leakage the mask prevents)
        ws = self.ws
        s1 = ws.persistent(self, "s1", y.shape)
        s2 = ws.persistent(self, "s2", y.shape)
        s3 = ws.persistent(self, "s3", y.shape)
        self.fused = fuse_residual_norm and ws.int8 is None    # as EncoderLayer.forward
        if self.fused:
            sa, ca, ffn = self.self_attn, self.cross_attn, self.feed_forward
            if self.norm_first:
                a = sa.forward(self.norm1.forward(y), None, B, T, T, tgt_pad, causal, bias=False)
                h = self.norm2.forward_residual(a, sa.out_proj, y, self.dropout1, s1)
                c = ca.forward(h, memory, B, T, S, src_pad, False, bias=False)
                f = ffn.forward(self.norm3.forward_residual(c, ca.out_proj, s1, self.dropout2, s2), bias=False)
                _C.dropout_add_forward(f, s2, s3, *self.dropout3.call(), bias=ffn.linear2.bias)
                return s3
            a = sa.forward(y, None, B, T, T, tgt_pad, causal, bias=False)
            h1 = self.norm1.forward_residual(a, sa.out_proj, y, self.dropout1, s1)
            c = ca.forward(h1, memory, B, T, S, src_pad, False, bias=False)
            h2 = self.norm2.forward_residual(c, ca.out_proj, h1, self.dropout2, s2)
            f = ffn.forward(h2, bias=False)
            return self.norm3.forward_residual(f, ffn.linear2, h2, self.dropout3, s3)
        if self.norm_first:
            a = self.self_attn.forward(self.norm1.forward(y), None, B, T, T, tgt_pad, causal)
            _C.add(y, self.dropout1.forward_(a), s1)
            c = self.cross_attn.forward(self.norm2.forward(s1), memory, B, T, S, src_pad, False)
            _C.add(s1, self.dropout2.forward_(c), s2)
            f = self.feed_forward.forward(self.norm3.forward(s2))
            _C.add(s2, self.dropout3.forward_(f), s3)
            return s3
        a = self.self_attn.forward(y, None, B, T, T, tgt_pad, causal)
        _C.add(y, self.dropout1.forward_(a), s1)
        h1 = self.norm1.forward(s1)
        c = self.cross_attn.forward(h1, memory, B, T, S, src_pad, False)
        _C.add(h1, self.dropout2.forward_(c), s2)
        h2 = self.norm2.forward(s2)
        f = self.feed_forward.forward(h2)
        _C.add(h2, self.dropout3.forward_(f), s3)
        return self.norm3.forward(s3)

    def backward(self, dout, dmemory, accumulate_memory):
        # dout [B*T, D], overwritten with and returned as the input gradient;
        # dmemory [B*S, D] receives (accumulate_memory: adds) the gradient of the encoder output
        tmp = self.ws.scratch("layer.tmp", dout.shape) if self.dropout1.active else None
        if self.norm_first:
            sa, ca, ffn, fused = self.self_attn, self.cross_attn, self.feed_forward, self.fused
            dn = self.ws.scratch("layer.dn", dout.shape)

            def branch(dropout, linear):     # the gradient of a branch's output before its dropout
                return branch_backward(dout, dropout, linear, tmp) if fused else dropout.backward(dout, tmp)
            self.norm3.backward(ffn.backward(branch(self.dropout3, ffn.linear2), dn, bias=not fused), dout,
                                accumulate=True)
            d = ca.backward(branch(self.dropout2, ca.out_proj), dn, dmemory=dmemory,
                            accumulate_memory=accumulate_memory, bias=not fused)
            self.norm2.backward(d, dout, accumulate=True)
            self.norm1.backward(sa.backward(branch(self.dropout1, sa.out_proj), dn, bias=not fused), dout,
                                accumulate=True)
            return dout
        if self.fused:
            sa, ca, ffn = self.self_attn, self.cross_attn, self.feed_forward
            d = self.norm3.backward_residual(dout, ffn.linear2, self.dropout3, tmp)
            ffn.backward(d, dout, accumulate=True, bias=False)
            d = self.norm2.backward_residual(dout, ca.out_proj, self.dropout2, tmp)
            ca.backward(d, dout, accumulate=True, dmemory=dmemory, accumulate_memory=accumulate_memory, bias=False)
            d = self.norm1.backward_residual(dout, sa.out_proj, self.dropout1, tmp)
            sa.backward(d, dout, accumulate=True, bias=False)
            return dout
        self.norm3.backward(dout, dout)
        self.feed_forward.backward(self.dropout3.backward(dout, tmp), dout, accumulate=True)
        self.norm2.backward(dout, dout)
        self.cross_attn.backward(self.dropout2.backward(dout, tmp), dout, accumulate=True,
                                 dmemory=dmemory, accumulate_memory=accumulate_memory)
        self.norm1.backward(dout, dout)
        self.self_attn.backward(self.dropout1.backward(dout, tmp), dout, accumulate=True)
        return dout
