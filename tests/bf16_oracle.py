"""An independent float64 oracle for reduced precision (tests only).

The network of DESIGN.md written out functionally in torch, float64 throughout, except where the
engine's precision rounds:

- loss(..., rounding=True): every GEMM of the forward and of the backward pass rounds its two
  operands to bfloat16 first, as forward_backward(precision="bf16") does (the same products:
  linear maps, Q Kᵀ, P V, and in backward dX = dY W, dW = dYᵀ X, dQ = dS K, dK = dSᵀ Q,
  dP = dC Vᵀ, dV = Pᵀ dC). With rounding=False it is the plain float64 network.
- logits(..., linear="bf16" | "int8" | None): inference, where only the linear maps are reduced
  (decoding's precision): bf16 operands, or int8 (csrc/qgemm.h: weights and activations quantized
  per row with float32 arithmetic, integer products summed exactly, dequantized as the kernel
  does); the decoder's attention keys and values rounded to bf16 (what decoding's caches hold
  at those precisions, decoding.cache_dtype); attention products, softmax, layer norm and
  residuals float64.
"""
import math

import numpy as np


def widen(bits):
    """float32 values of bf16 bits (uint16, as _C.to_bf16 and the bf16 caches hold them): exact."""
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def make(torch, rounding=True, dtype=None):
    def r(x):
        if not rounding:
            return x
        y = x.to(torch.float32).to(torch.bfloat16).to(dtype or torch.float64)
        return torch.where(y.abs() < 2.0 ** -126, y * 0, y)   # subnormal bf16 -> zero (csrc/gemm.h)

    class MatMul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return r(a) @ r(b)

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            return r(g) @ r(b).transpose(-1, -2), r(a).transpose(-1, -2) @ r(g)

    return MatMul.apply


def quantize_rows(torch, x):
    """(q as float64, scale float32 as float64) per row, as csrc/qgemm.h: amax in float32,
    inv = 127 / amax in float32, q = rint(x * inv) (float32 product, ties to even), scale = amax / 127."""
    x32 = x.detach().to(torch.float32)
    amax = x32.abs().amax(dim=-1, keepdim=True)
    tiny = amax < 2.0 ** -120     # csrc/qgemm.h: QGEMM_TINY, zeros and scale 0
    safe = torch.where(tiny, torch.ones_like(amax), amax)
    inv = torch.tensor(127.0, dtype=torch.float32) / safe
    q = torch.round(x32 * inv).clamp(-127, 127)
    q = torch.where(tiny, torch.zeros_like(q), q)
    scale = torch.where(tiny, torch.zeros_like(amax), amax / torch.tensor(127.0, dtype=torch.float32))
    return q.to(torch.float64), scale.to(torch.float64)


def int8_linear(torch, x, w, b):
    """x @ w^T + b as the int8 kernel computes it: exact integer sums, then
    float32((float)acc * float32(xs * ws) + b) with one rounding (fmaf)."""
    qx, xs = quantize_rows(torch, x)
    qw, ws = quantize_rows(torch, w)
    acc = qx @ qw.transpose(-1, -2)                       # exact: integers below 2^53
    s = (xs.to(torch.float32) * ws.transpose(-1, -2).to(torch.float32)).to(torch.float64)
    acc32 = acc.to(torch.float32).to(torch.float64)        # (float)acc
    out = acc32 * s + b.detach().to(torch.float32).to(torch.float64)
    return out.to(torch.float32).to(torch.float64)


def logits(torch, cfg, params, pe, src, tgt_in, linear=None, tables=None, generator=None):
    """Logits float64 [B, T, V] in eval mode, linear maps reduced as `linear` says (module doc), the
    output projection as `generator` says (None: as the others; "fp32": not reduced).
    tables: {name: float32 table} to read instead of the embedding parameters (int8: dequantized)."""
    params = dict(params)
    params.update(tables or {})
    rounding = linear == "bf16"
    generator = linear if generator is None else (None if generator == "fp32" else generator)
    with torch.no_grad():
        out, _ = _network(torch, cfg, params, pe, src, tgt_in, rounding=False, linear_rounding=rounding,
                          int8=linear == "int8", dtype=torch.float64, grad=False, generator=generator,
                          decoder_kv=linear is not None)
    return out


def loss(torch, cfg, params, pe, src, tgt_in, tgt_out, label_smoothing, rounding=True, dtype=None):
    """(loss, {name: float64 leaf tensor}) for float32 numpy params; call loss.backward()."""
    F = torch.nn.functional
    out, P = _network(torch, cfg, params, pe, src, tgt_in, rounding, rounding, False, dtype or torch.float64, True,
                      "bf16" if rounding else None)
    tgt_out = torch.tensor(np.asarray(tgt_out), dtype=torch.long)
    value = F.cross_entropy(out.reshape(-1, out.shape[-1]), tgt_out.reshape(-1),
                            ignore_index=cfg.pad_id, label_smoothing=label_smoothing)
    return value, P


def _network(torch, cfg, params, pe, src, tgt_in, rounding, linear_rounding, int8, dtype, grad, generator,
             decoder_kv=False):
    """(logits, leaves): `rounding` rounds the attention products to bf16, `linear_rounding` the
    linear maps; `int8` makes the linear maps int8 (csrc/qgemm.h); the output projection is
    `generator` ("bf16", "int8" or None: not reduced); `decoder_kv` rounds the decoder's keys and
    values to bf16 (float32 first, as the engine computes them; ties to even; subnormals kept)."""
    F = torch.nn.functional
    mm = make(torch, rounding, dtype)
    lm = make(torch, linear_rounding, dtype)
    P = {k: torch.tensor(v, dtype=dtype, requires_grad=grad) for k, v in params.items()}
    D, H = cfg.d_model, cfg.n_heads
    dh = D // H
    pe = torch.tensor(pe, dtype=dtype)
    src, tgt_in = (torch.tensor(np.asarray(x), dtype=torch.long) for x in (src, tgt_in))
    act = F.relu if cfg.activation == "relu" else F.gelu

    def project(x, w, b):
        if int8:
            return int8_linear(torch, x, w, b)
        return lm(x, w.t()) + b

    def linear(x, name):
        return project(x, P[f"{name}.weight"], P[f"{name}.bias"])

    def norm(x, name):
        return F.layer_norm(x, (D,), P[f"{name}.weight"], P[f"{name}.bias"], 1e-5)

    def heads(x):   # [B, T, D] -> [B, H, T, dh]
        return x.view(x.shape[0], x.shape[1], H, dh).transpose(1, 2)

    def to_bf16(x):
        return x.to(torch.float32).to(torch.bfloat16).to(dtype)

    def attention(x, mem, name, key_pad, causal, round_kv=False):
        w, b = P[f"{name}.in_proj_weight"], P[f"{name}.in_proj_bias"]
        if x is mem:   # self-attention: one fused projection, as the engine does (same rows)
            qkv = project(x, w, b)
            q, k, v = qkv[..., :D], qkv[..., D:2 * D], qkv[..., 2 * D:]
        else:
            q = project(x, w[:D], b[:D])
            k = project(mem, w[D:2 * D], b[D:2 * D])
            v = project(mem, w[2 * D:], b[2 * D:])
        if round_kv:
            k, v = to_bf16(k), to_bf16(v)
        scores = mm(heads(q), heads(k).transpose(-1, -2)) / math.sqrt(dh)
        hide = key_pad[:, None, None, :]
        if causal:
            T = x.shape[1]
            hide = hide | torch.triu(torch.ones(T, T, dtype=torch.bool), 1)[None, None]
        p = torch.softmax(scores.masked_fill(hide, float("-inf")), dim=-1)
        ctx = mm(p, heads(v)).transpose(1, 2).reshape(x.shape)
        return linear(ctx, f"{name}.out_proj")

    def ff(x, name):
        return linear(act(linear(x, f"{name}.linear1")), f"{name}.linear2")

    def sublayer(x, norm_name, f):   # pre-LN: x + f(norm(x)); post-LN (the paper's): norm(x + f(x))
        return x + f(norm(x, norm_name)) if cfg.norm_first else norm(x + f(x), norm_name)

    src_pad, tgt_pad = src == cfg.pad_id, tgt_in == cfg.pad_id
    x = P["src_embed.weight"][src] * math.sqrt(D) + pe[:src.shape[1]]
    for i in range(cfg.n_encoder_layers):
        n = f"transformer.encoder.layers.{i}"
        x = sublayer(x, f"{n}.norm1", lambda h: attention(h, h, f"{n}.self_attn", src_pad, False))
        x = sublayer(x, f"{n}.norm2", lambda h: ff(h, n))
    mem = norm(x, "transformer.encoder.norm")
    y = P["tgt_embed.weight"][tgt_in] * math.sqrt(D) + pe[:tgt_in.shape[1]]
    for i in range(cfg.n_decoder_layers):
        n = f"transformer.decoder.layers.{i}"
        y = sublayer(y, f"{n}.norm1", lambda h: attention(h, h, f"{n}.self_attn", tgt_pad, True, decoder_kv))
        y = sublayer(y, f"{n}.norm2", lambda h: attention(h, mem, f"{n}.multihead_attn", src_pad, False,
                                                          decoder_kv))
        y = sublayer(y, f"{n}.norm3", lambda h: ff(h, n))
    y = norm(y, "transformer.decoder.norm")
    w, b = P["generator.weight"], P["generator.bias"]
    if generator == "int8":
        return int8_linear(torch, y, w, b), P
    return make(torch, generator == "bf16", dtype)(y, w.t()) + b, P
