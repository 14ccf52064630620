"""Fused attention for training (csrc/attention_train.h) against a float64 reference.

The reference multiplies in float64 the operands the kernel multiplies: rounded to bfloat16 first
when bf16. Every product is compared elementwise against its magnitude (the same product of
absolute values): |ours - ref| <= TOL * magnitude + ATOL. The dropped weights come from
_C.dropout_forward on the kernel's own probs (the mask the unfused path draws).
With bf16, dS is rounded from the kernel's fp32 value and the reference's float64 one, which may
fall on either side of a rounding midpoint: a flipped rounding moves a term of dQ or dK by at
most one bf16 unit (BF16_FLIP relative), so those two get that allowance, and at least half of
their elements must still meet the tight bound (a missing rounding fails it nearly everywhere).
"""
import numpy as np
import pytest

from conftest import ALL_ISA_LEVELS, isa_fixture, needs_threads, num_threads, restore_threads  # noqa: F401
from transformer import _C, layers

# the levels with code of their own here: avx512_bf16 multiplies bf16 operands with vdpbf16ps
isa = isa_fixture([level for level in ALL_ISA_LEVELS
                   if level in ("generic", "avx2", "avx512", "avx512_bf16", "neon")])

TOL = 1e-5            # fp32 sums of exact products, relative to the sum of absolute terms
ATOL = 1e-7
BF16_FLIP = 2.0 ** -7  # one bf16 unit, relative to the rounded value

# (B, H, Tq, Tk, dh): lengths 1, primes, just past 16 / 32 / 64 / 128 boundaries, Tq != Tk
SHAPES = [
    (1, 1, 1, 1, 32),
    (2, 3, 5, 7, 32),
    (3, 2, 17, 13, 48),
    (2, 2, 33, 31, 64),
    (1, 2, 65, 40, 40),
    (2, 1, 129, 129, 32),
    (1, 4, 3, 97, 64),
    (2, 2, 16, 16, 17),
]


def r16(x):
    """float32 x rounded to bfloat16 (nearest, ties to even; subnormals to zero), as float32."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = np.where(nan, u | 0x00400000, u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFFFFFF
    r = np.where(r & 0x7F800000, r & 0xFFFF0000, r & 0x80000000)
    return r.astype(np.uint32).view(np.float32).reshape(np.shape(x))


def heads(x, B, T, H):
    """[B*T, H*dh] rows -> float64 [B, H, T, dh]."""
    return np.asarray(x, np.float64).reshape(B, T, H, -1).transpose(0, 2, 1, 3)


def concat(x):
    """[B, H, T, dh] -> [B*T, H*dh]."""
    B, H, T, dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B * T, H * dh)


def visible(B, Tq, Tk, causal, pad):
    vis = np.ones((B, 1, Tq, Tk), bool)
    if causal:
        vis &= np.tril(np.ones((Tq, Tk), bool))
    if pad is not None:
        vis &= ~pad.astype(bool)[:, None, None, :]
    return vis


def probs_ref(q, k, B, H, Tq, Tk, scale, causal, pad, bf16):
    rnd = r16 if bf16 else (lambda a: a)
    S = scale * heads(rnd(q), B, Tq, H) @ heads(rnd(k), B, Tk, H).transpose(0, 1, 3, 2)
    vis = visible(B, Tq, Tk, causal, pad)
    S = np.where(vis, S, -np.inf)
    mx = S.max(-1, keepdims=True)
    e = np.where(vis, np.exp(S - np.where(np.isfinite(mx), mx, 0.0)), 0.0)
    s = e.sum(-1, keepdims=True)
    return np.where(s > 0, e / np.where(s > 0, s, 1.0), 0.0)


def dropped(probs, p, seed, offset):
    if p == 0.0:
        return probs.copy()
    out = np.empty_like(probs)
    _C.dropout_forward(probs, out, p, seed, offset)
    return out


def backward_ref(dctx, q, k, v, probs, scale, p, seed, offset, bf16):
    """(dq, dk, dv) and their magnitudes, float64, [B*T, H*dh]."""
    B, H, Tq, Tk = probs.shape
    rnd = r16 if bf16 else (lambda a: a)
    dC, Q, K, V = (heads(rnd(x), B, T, H) for x, T in ((dctx, Tq), (q, Tq), (k, Tk), (v, Tk)))
    aC, aQ, aK, aV = (np.abs(x) for x in (dC, Q, K, V))
    Pd = np.asarray(rnd(dropped(probs, p, seed, offset)), np.float64)
    keep = np.asarray(dropped(np.ones_like(probs), p, seed, offset), np.float64)
    P = np.asarray(probs, np.float64)
    dP = (dC @ V.transpose(0, 1, 3, 2)) * keep
    mdP = (aC @ aV.transpose(0, 1, 3, 2)) * keep
    dS = scale * P * (dP - (dP * P).sum(-1, keepdims=True))
    mdS = scale * P * (mdP + (mdP * P).sum(-1, keepdims=True))
    if bf16:
        dS = np.asarray(r16(dS.astype(np.float32)), np.float64)
    dq, mdq = dS @ K, mdS @ aK
    dk, mdk = dS.transpose(0, 1, 3, 2) @ Q, mdS.transpose(0, 1, 3, 2) @ aQ
    dv, mdv = Pd.transpose(0, 1, 3, 2) @ dC, np.abs(Pd).transpose(0, 1, 3, 2) @ aC
    return [(concat(a), concat(m)) for a, m in ((dq, mdq), (dk, mdk), (dv, mdv))]


def check(actual, expected, magnitude, what, flip=0.0):
    err = np.abs(np.asarray(actual, np.float64) - expected)
    tight = TOL * magnitude + ATOL
    bound = tight + flip * magnitude
    assert (err <= bound).all(), (f"{what}: max error {err.max():.3e}, max error / bound "
                                  f"{np.max(err / bound):.3e} (TOL {TOL}, flip {flip})")
    if flip:
        assert np.mean(err <= tight) >= 0.5, f"{what}: fewer than half the elements within TOL"


def case(B, H, Tq, Tk, dh, cross, padded, seed=0):
    """Inputs in the layer's layouts: self-attention reads q, k, v from one [B*T, 3D] array,
    cross-attention q from [B*Tq, D] and k, v from [B*Tk, 2D]. Padding: random keys, one
    sentence's every key padded (its rows give zeros)."""
    rng = np.random.default_rng(seed)
    D = H * dh
    if cross:
        qa = rng.standard_normal((B * Tq, D), dtype=np.float32)
        kv = rng.standard_normal((B * Tk, 2 * D), dtype=np.float32)
        q, k, v = qa, kv[:, :D], kv[:, D:]
    else:
        qkv = rng.standard_normal((B * Tq, 3 * D), dtype=np.float32)
        q, k, v = qkv[:, :D], qkv[:, D:2 * D], qkv[:, 2 * D:]
    pad = None
    if padded:
        pad = rng.random((B, Tk)) < 0.3
        pad[0, -1] = True
        if B > 1:
            pad[-1, :] = True
    dctx = rng.standard_normal((B * Tq, D), dtype=np.float32)
    return q, k, v, pad, dctx


def run(q, k, v, pad, dctx, B, H, Tq, Tk, causal, p, bf16, seed=123, offset=456):
    D = q.shape[1]
    scale = 1.0 / np.sqrt(D // H)
    probs = np.full((B, H, Tq, Tk), np.nan, np.float32)
    ctx = np.full((B * Tq, D), np.nan, np.float32)
    _C.attention_train_forward(q, k, v, probs, ctx, scale, causal, pad, p, seed, offset, bf16)
    grads = np.full((B * Tq, D), np.nan, np.float32), np.full((B * Tk, 2 * D), np.nan, np.float32)
    dq, dkv = grads
    dk, dv = dkv[:, :D], dkv[:, D:]
    _C.attention_train_backward(dctx, q, k, v, probs, dq, dk, dv, scale, causal, p, seed, offset, bf16)
    return scale, probs, ctx, dq, dk, dv


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("causal,padded,p", [(False, False, 0.0), (True, False, 0.0),
                                             (False, True, 0.2), (True, True, 0.1)],
                         ids=["plain", "causal", "padded_dropout", "causal_padded_dropout"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_and_backward_match_reference(isa, shape, causal, padded, p, bf16):
    B, H, Tq, Tk, dh = shape
    q, k, v, pad, dctx = case(B, H, Tq, Tk, dh, cross=Tq != Tk, padded=padded)
    scale, probs, ctx, dq, dk, dv = run(q, k, v, pad, dctx, B, H, Tq, Tk, causal, p, bf16)
    P = probs_ref(q, k, B, H, Tq, Tk, scale, causal, pad, bf16)
    check(probs, P, P, "probs")
    vis = visible(B, Tq, Tk, causal, pad)
    assert (probs[~np.broadcast_to(vis, probs.shape)] == 0).all(), "hidden keys got weight"
    rnd = r16 if bf16 else (lambda a: a)
    Pd = np.asarray(rnd(dropped(probs, p, 123, 456)), np.float64)
    V = heads(rnd(v), B, Tk, H)
    check(ctx, concat(Pd @ V), concat(np.abs(Pd) @ np.abs(V)), "ctx")
    flip = BF16_FLIP if bf16 else 0.0
    (rq, mq), (rk, mk), (rv, mv) = backward_ref(dctx, q, k, v, probs, scale, p, 123, 456, bf16)
    check(dv, rv, mv, "dv")
    check(dq, rq, mq, "dq", flip)
    check(dk, rk, mk, "dk", flip)


def test_fully_padded_sentence_gives_zeros_not_nan(isa):
    B, H, T, dh = 2, 2, 9, 32
    q, k, v, pad, dctx = case(B, H, T, T, dh, cross=False, padded=True)
    _, probs, ctx, dq, dk, dv = run(q, k, v, pad, dctx, B, H, T, T, False, 0.1, False)
    for a in (probs, ctx, dq, dk, dv):
        assert np.isfinite(a).all()
    assert (probs[-1] == 0).all() and (ctx[-T:] == 0).all() and (dq[-T:] == 0).all()


def test_probs_equal_the_unfused_softmax_bits(isa):
    """Scores of small integers are exact in any summation order, so the fused probs must have
    exactly the bits softmax_forward gives those scores (the fused kernel runs its row code)."""
    rng = np.random.default_rng(3)
    B, H, T, dh = 2, 2, 21, 32
    D = H * dh
    qkv = rng.integers(-3, 4, (B * T, 3 * D)).astype(np.float32)   # exact products and sums
    q, k, v = qkv[:, :D], qkv[:, D:2 * D], qkv[:, 2 * D:]
    pad = rng.random((B, T)) < 0.2
    probs = np.empty((B, H, T, T), np.float32)
    ctx = np.empty((B * T, D), np.float32)
    _C.attention_train_forward(q, k, v, probs, ctx, 0.125, True, pad)
    scores = (heads(q, B, T, H) @ heads(k, B, T, H).transpose(0, 1, 3, 2)).astype(np.float32)
    expected = np.empty_like(scores)
    _C.softmax_forward(scores, expected, 0.125, True, pad)
    np.testing.assert_array_equal(probs, expected)


@needs_threads
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_same_bits_on_one_and_two_threads(isa, restore_threads, bf16):
    B, H, T, dh = 5, 3, 23, 32
    q, k, v, pad, dctx = case(B, H, T, T, dh, cross=False, padded=True)
    outs = []
    for n in (1, 2):
        with num_threads(n):
            outs.append(run(q, k, v, pad, dctx, B, H, T, T, True, 0.1, bf16)[1:])
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


def test_arguments_are_checked_by_name():
    B, H, T, dh = 2, 2, 5, 32
    D = H * dh
    q, k, v, pad, dctx = case(B, H, T, T, dh, cross=True, padded=False)
    probs = np.empty((B, H, T, T), np.float32)
    ctx = np.empty((B * T, D), np.float32)
    with pytest.raises(TypeError, match="q must have dtype"):
        _C.attention_train_forward(q.astype(np.float64), k, v, probs, ctx, 1.0)
    with pytest.raises(ValueError, match="k must have shape"):
        _C.attention_train_forward(q, k[:-1], v, probs, ctx, 1.0)
    with pytest.raises(ValueError, match="v must have unit inner stride"):
        _C.attention_train_forward(q, k, np.asfortranarray(v), probs, ctx, 1.0)
    with pytest.raises(ValueError, match="key_padding_mask must have shape"):
        _C.attention_train_forward(q, k, v, probs, ctx, 1.0, False, np.zeros((B, T + 1), bool))
    with pytest.raises(ValueError, match="dropout_p must be in"):
        _C.attention_train_forward(q, k, v, probs, ctx, 1.0, False, None, 1.0)
    with pytest.raises(ValueError, match="ctx must not overlap q"):
        _C.attention_train_forward(q, k, v, probs, q, 1.0)
    with pytest.raises(ValueError, match="dq must not overlap q"):
        _C.attention_train_backward(dctx, q, k, v, probs, q, np.empty_like(k), np.empty_like(v), 1.0)


# ---- the layer: MultiHeadAttention takes the fused kernel when it fits, same results ----------

LAYER_RTOL = 1e-5   # per tensor, max|fused - unfused| / max|unfused| (fp32: the same FMA chains, equal so far)
LAYER_RTOL_BF16 = 1e-3   # bf16: vdpbf16ps sums pairs in its own order; an operand may round the other way


def _model(dropout, n_heads=2, d_model=64):
    import transformer as T
    cfg = T.ModelConfig(src_vocab_size=37, tgt_vocab_size=41, d_model=d_model, n_heads=n_heads,
                        d_ff=96, n_encoder_layers=2, n_decoder_layers=2, dropout=dropout, max_len=40)
    return T.Seq2SeqTransformer(cfg, seed=0)


def _batch(model, B=5, S=19, Tt=17, seed=0):
    rng = np.random.default_rng(seed)
    cfg = model.cfg
    src = rng.integers(3, cfg.src_vocab_size, (B, S))
    tgt = rng.integers(3, cfg.tgt_vocab_size, (B, Tt + 1))
    tgt[:, 0] = cfg.bos_id
    for b in range(1, B):
        src[b, S - min(2 * b, S - 1):] = cfg.pad_id
        tgt[b, Tt + 1 - min(2 * b, Tt - 1):] = cfg.pad_id
    return src, tgt[:, :-1].copy(), tgt[:, 1:].copy()


def _attentions(model):
    return [layer.self_attn for layer in model.encoder.layers] + \
        [a for layer in model.decoder.layers for a in (layer.self_attn, layer.cross_attn)]


def _train_pass(model, fused, precision, batch):
    """Loss and gradients of one training pass (dropout on when the model has it), the model's
    call counter rewound so both paths draw the same masks."""
    model.ws.fused_attention = fused
    calls = model.stream.calls
    model.zero_grad()
    loss = model.forward_backward(*batch, label_smoothing=0.1, precision=precision)
    model.stream.calls = calls
    assert all(a.fused == fused for a in _attentions(model))
    return loss, {k: v.copy() for k, v in model.grads().items()}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_layer_fused_path_matches_unfused_path(precision, dropout):
    if not layers.fused_attention_fits(32, 17, 19, precision == "bf16"):
        pytest.skip("the layer keeps the batched GEMMs at this level and precision")
    model = _model(dropout)
    batch = _batch(model)
    loss_u, grads_u = _train_pass(model, False, precision, batch)
    loss_f, grads_f = _train_pass(model, True, precision, batch)
    rtol = LAYER_RTOL if precision == "fp32" else LAYER_RTOL_BF16
    assert abs(loss_f - loss_u) <= rtol * abs(loss_u), (loss_f, loss_u)
    for name, g in grads_u.items():
        err = np.abs(grads_f[name] - g).max() / max(np.abs(g).max(), 1e-30)
        assert err <= rtol, f"{name}: relative difference {err:.3e} > {rtol}"


def test_layer_keeps_probs_for_return_attention():
    if not layers.fused_attention_fits(32, 17, 19, False):
        pytest.skip("the layer keeps the batched GEMMs at this level and precision")
    model = _model(0.0)
    src, tgt_in, _ = _batch(model)
    out = {}
    for fused in (False, True):
        model.ws.fused_attention = fused
        out[fused] = model.forward(src, tgt_in, return_attention=True)
        assert all(a.fused == fused for a in _attentions(model))
    np.testing.assert_allclose(out[True][0], out[False][0], rtol=1e-4, atol=1e-5)
    for key, maps in out[False][1].items():
        for a, b in zip(out[True][1][key], maps):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_layer_takes_fused_kernel_only_for_heads_of_32_to_64():
    model = _model(0.0, n_heads=4, d_model=64)   # d_head 16: the batched GEMMs
    src, tgt_in, _ = _batch(model)
    model.forward(src, tgt_in)
    assert not any(a.fused for a in _attentions(model))


def test_gradients_must_not_share_elements():
    """dq, dk, dv may be interleaved column slices of one array, never the same columns."""
    B, H, T, dh = 2, 2, 5, 32
    D = H * dh
    q, k, v, pad, dctx = case(B, H, T, T, dh, cross=False, padded=False)
    probs = np.zeros((B, H, T, T), np.float32)
    dqkv = np.empty((B * T, 3 * D), np.float32)
    _C.attention_train_backward(dctx, q, k, v, probs, dqkv[:, :D], dqkv[:, D:2 * D], dqkv[:, 2 * D:], 1.0)
    with pytest.raises(ValueError, match="dk and dv must not share elements"):
        _C.attention_train_backward(dctx, q, k, v, probs, dqkv[:, :D], dqkv[:, D:2 * D], dqkv[:, D + 1:2 * D + 1], 1.0)
