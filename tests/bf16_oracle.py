"""An independent float64 oracle for bf16 mixed-precision training (tests only).

The network of DESIGN.md written out functionally in torch, float64 throughout, except that every
GEMM of the forward and of the backward pass rounds its two operands to bfloat16 first, as the
engine's precision="bf16" does (the same products: linear maps, Q Kᵀ, P V, and in backward
dX = dY W, dW = dYᵀ X, dQ = dS K, dK = dSᵀ Q, dP = dC Vᵀ, dV = Pᵀ dC). With rounding=False it is
the plain float64 network (the fp32 engine's oracle).
"""
import math

import numpy as np


def make(torch, rounding=True, dtype=None):
    def r(x):
        return x.to(torch.float32).to(torch.bfloat16).to(dtype or torch.float64) if rounding else x

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


def loss(torch, cfg, params, pe, src, tgt_in, tgt_out, label_smoothing, rounding=True, dtype=None):
    """(loss, {name: float64 leaf tensor}) for float32 numpy params; call loss.backward()."""
    F = torch.nn.functional
    dtype = dtype or torch.float64
    mm = make(torch, rounding, dtype)
    P = {k: torch.tensor(v, dtype=dtype, requires_grad=True) for k, v in params.items()}
    D, H = cfg.d_model, cfg.n_heads
    dh = D // H
    pe = torch.tensor(pe, dtype=dtype)
    src, tgt_in, tgt_out = (torch.tensor(np.asarray(x), dtype=torch.long) for x in (src, tgt_in, tgt_out))
    act = F.relu if cfg.activation == "relu" else F.gelu

    def linear(x, name):
        return mm(x, P[f"{name}.weight"].t()) + P[f"{name}.bias"]

    def norm(x, name):
        return F.layer_norm(x, (D,), P[f"{name}.weight"], P[f"{name}.bias"], 1e-5)

    def heads(x):   # [B, T, D] -> [B, H, T, dh]
        return x.view(x.shape[0], x.shape[1], H, dh).transpose(1, 2)

    def attention(x, mem, name, key_pad, causal):
        w, b = P[f"{name}.in_proj_weight"], P[f"{name}.in_proj_bias"]
        q = mm(x, w[:D].t()) + b[:D]
        k = mm(mem, w[D:2 * D].t()) + b[D:2 * D]
        v = mm(mem, w[2 * D:].t()) + b[2 * D:]
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

    src_pad, tgt_pad = src == cfg.pad_id, tgt_in == cfg.pad_id
    x = P["src_embed.weight"][src] * math.sqrt(D) + pe[:src.shape[1]]
    for i in range(cfg.n_encoder_layers):
        n = f"transformer.encoder.layers.{i}"
        if cfg.norm_first:
            h = norm(x, f"{n}.norm1")
            x = x + attention(h, h, f"{n}.self_attn", src_pad, False)
            x = x + ff(norm(x, f"{n}.norm2"), n)
        else:
            x = norm(x + attention(x, x, f"{n}.self_attn", src_pad, False), f"{n}.norm1")
            x = norm(x + ff(x, n), f"{n}.norm2")
    mem = norm(x, "transformer.encoder.norm")
    y = P["tgt_embed.weight"][tgt_in] * math.sqrt(D) + pe[:tgt_in.shape[1]]
    for i in range(cfg.n_decoder_layers):
        n = f"transformer.decoder.layers.{i}"
        if cfg.norm_first:
            h = norm(y, f"{n}.norm1")
            y = y + attention(h, h, f"{n}.self_attn", tgt_pad, True)
            y = y + attention(norm(y, f"{n}.norm2"), mem, f"{n}.multihead_attn", src_pad, False)
            y = y + ff(norm(y, f"{n}.norm3"), n)
        else:
            y = norm(y + attention(y, y, f"{n}.self_attn", tgt_pad, True), f"{n}.norm1")
            y = norm(y + attention(y, mem, f"{n}.multihead_attn", src_pad, False), f"{n}.norm2")
            y = norm(y + ff(y, n), f"{n}.norm3")
    y = norm(y, "transformer.decoder.norm")
    logits = linear(y, "generator")
    out = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1),
                          ignore_index=cfg.pad_id, label_smoothing=label_smoothing)
    return out, P
