"""The model's behaviour beyond PyTorch parity: dropout, the causal mask, determinism across
threads, checkpoints, the optimizer, configuration and bad input."""
import json
import math
import os

import numpy as np
import pytest

import transformer as T
from transformer import layers
from transformer.layers import Dropout, DropoutStream, output_rows_per_block
from transformer.serialization import load_file, save_file

TINY = dict(src_vocab_size=23, tgt_vocab_size=29, d_model=32, n_heads=4, d_ff=48,
            n_encoder_layers=2, n_decoder_layers=2, dropout=0.1, max_len=24)
KEPT_TOL = 0.01         # kept fraction of a 64,000-element dropout vs 1 - p (about 5 sigma)
SAME_TOL = 1e-6         # logits that must not change, relative to their largest


def cfg(**changes):
    return T.ModelConfig(**{**TINY, **changes})


def batch(c, B=3, S=6, Tt=5, seed=0):
    rng = np.random.default_rng(seed)
    src = rng.integers(3, c.src_vocab_size, (B, S))
    tgt = rng.integers(3, c.tgt_vocab_size, (B, Tt + 1))
    for b in range(1, B):
        src[b, S - b:] = c.pad_id
        tgt[b, Tt + 1 - b:] = c.pad_id
    return src, tgt[:, :-1].copy(), tgt[:, 1:].copy()


class threads:
    def __init__(self, n):
        self.n = n

    def __enter__(self):
        self.prev = T.get_num_threads()
        T.set_num_threads(self.n)

    def __exit__(self, *exc):
        T.set_num_threads(self.prev)


# ---------------------------------------------------------------- dropout

@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_dropout_keeps_one_minus_p_and_scales_by_its_inverse(p):
    stream = DropoutStream(seed=7)
    stream.training = True
    stream.next_call()
    drop = Dropout(p, stream)
    x = np.ones((1000, 64), dtype=np.float32)
    drop.forward_(x)
    kept = x != 0
    assert abs(kept.mean() - (1 - p)) <= KEPT_TOL, kept.mean()
    np.testing.assert_allclose(x[kept], np.float32(1 / (1 - p)), rtol=1e-6)
    dx = np.empty_like(x)
    drop.backward(np.ones_like(x), dx)
    assert np.array_equal(dx != 0, kept), "backward must regenerate the forward mask"


def test_dropout_sites_draw_different_masks():
    stream = DropoutStream(seed=7)
    stream.training = True
    stream.next_call()
    a, b = Dropout(0.5, stream), Dropout(0.5, stream)
    xa, xb = np.ones((64, 64), np.float32), np.ones((64, 64), np.float32)
    a.forward_(xa)
    b.forward_(xb)
    assert not np.array_equal(xa != 0, xb != 0)


def test_dropout_is_off_in_forward():
    c = cfg(dropout=0.5)
    m = T.Seq2SeqTransformer(c, seed=0)
    src, tgt_in, _ = batch(c)
    assert np.array_equal(m.forward(src, tgt_in), m.forward(src, tgt_in))


def test_same_seed_same_training_pass_and_calls_differ():
    c = cfg()
    src, tgt_in, tgt_out = batch(c)
    a, b = T.Seq2SeqTransformer(c, seed=3), T.Seq2SeqTransformer(c, seed=3)
    la, ga = a.loss_and_grads(src, tgt_in, tgt_out)
    lb, gb = b.loss_and_grads(src, tgt_in, tgt_out)
    assert la == lb and all(np.array_equal(ga[k], gb[k]) for k in ga)
    la2, _ = a.loss_and_grads(src, tgt_in, tgt_out)
    assert la2 != la, "each training call draws fresh dropout masks"
    other, _ = T.Seq2SeqTransformer(c, seed=4).loss_and_grads(src, tgt_in, tgt_out)
    assert other != la


def test_training_pass_is_bitwise_identical_at_one_and_two_threads():
    c = cfg(dropout=0.2)
    src, tgt_in, tgt_out = batch(c, B=4, S=9, Tt=7)
    out = []
    for n in (1, 2):
        with threads(n):
            m = T.Seq2SeqTransformer(c, seed=11)
            loss = m.forward_backward(src, tgt_in, tgt_out, label_smoothing=0.1)
            out.append((loss, m.params.flat_grad.copy(), m.forward(src, tgt_in)))
    assert out[0][0] == out[1][0]
    assert np.array_equal(out[0][1], out[1][1]), "gradients differ between 1 and 2 threads"
    assert np.array_equal(out[0][2], out[1][2]), "logits differ between 1 and 2 threads"


def test_gradient_with_dropout_matches_directional_derivative():
    """With the dropout masks held fixed (same seed, same call number), the loss is a smooth
    function of the weights: its derivative along the gradient must equal |g|^2."""
    c = cfg(dropout=0.3, activation="gelu")
    m = T.Seq2SeqTransformer(c, seed=2)
    src, tgt_in, tgt_out = batch(c)
    m.stream.calls = 41
    m.zero_grad()
    m.forward_backward(src, tgt_in, tgt_out, 0.1)
    g = m.params.flat_grad.astype(np.float64)
    direction = g / np.linalg.norm(g)
    theta = m.params.flat.copy()
    eps = 5e-4
    losses = []
    for sign in (1, -1):
        m.params.flat[:] = theta + sign * eps * direction
        m.stream.calls = 41
        losses.append(m.forward_backward(src, tgt_in, tgt_out, 0.1))
    m.params.flat[:] = theta
    numeric = (losses[0] - losses[1]) / (2 * eps)
    assert abs(numeric - np.linalg.norm(g)) <= 1e-2 * np.linalg.norm(g), (numeric, np.linalg.norm(g))


# ---------------------------------------------------------------- masks

@pytest.mark.parametrize("norm_first", [False, True])
def test_causal_mask_future_tokens_do_not_change_past_logits(norm_first):
    c = cfg(norm_first=norm_first)
    m = T.Seq2SeqTransformer(c, seed=0)
    src, tgt_in, _ = batch(c, B=2, Tt=8)
    tgt_in[:] = np.random.default_rng(1).integers(3, c.tgt_vocab_size, tgt_in.shape)
    base = m.forward(src, tgt_in)
    for t in (0, 3, 6):
        changed = tgt_in.copy()
        changed[:, t + 1:] = (changed[:, t + 1:] + 5) % (c.tgt_vocab_size - 3) + 3
        out = m.forward(src, changed)
        scale = np.abs(base).max()
        assert np.abs(out[:, :t + 1] - base[:, :t + 1]).max() <= SAME_TOL * scale
        assert np.abs(out[:, t + 1:] - base[:, t + 1:]).max() > 1e-3 * scale


def test_source_padding_is_ignored():
    c = cfg()
    m = T.Seq2SeqTransformer(c, seed=0)
    src, tgt_in, _ = batch(c, B=1)
    longer = np.concatenate([src, np.full((1, 4), c.pad_id)], axis=1)
    a, b = m.forward(src, tgt_in), m.forward(longer, tgt_in)
    assert np.abs(a - b).max() <= SAME_TOL * np.abs(a).max()


def test_loss_ignores_pad_targets_and_all_pad_gives_zero():
    c = cfg(dropout=0.0)
    m = T.Seq2SeqTransformer(c, seed=0)
    src, tgt_in, tgt_out = batch(c)
    loss = m.forward_backward(src, tgt_in, tgt_out, 0.0)
    logits = m.forward(src, tgt_in).astype(np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    keep = tgt_out != c.pad_id
    ref = -np.take_along_axis(logp, tgt_out[..., None], -1)[..., 0][keep].mean()
    assert abs(loss - ref) <= 1e-5 * ref
    m.zero_grad()
    assert m.forward_backward(src, tgt_in, np.full_like(tgt_out, c.pad_id), 0.0) == 0.0
    assert not m.params.flat_grad.any()


def test_forward_backward_adds_into_gradients():
    c = cfg(dropout=0.0)
    m = T.Seq2SeqTransformer(c, seed=0)
    src, tgt_in, tgt_out = batch(c)
    m.zero_grad()
    m.forward_backward(src, tgt_in, tgt_out)
    once = m.params.flat_grad.copy()
    m.forward_backward(src, tgt_in, tgt_out)
    np.testing.assert_allclose(m.params.flat_grad, 2 * once, rtol=1e-5, atol=1e-7)
    grads = m.grads()
    assert set(grads) == set(m.state_dict())
    assert np.shares_memory(grads["generator.weight"], m.params.flat_grad)
    m.zero_grad()
    assert not m.params.flat_grad.any()


def test_output_rows_per_block_keeps_a_block_of_logits_in_cache():
    assert output_rows_per_block(2048, 128, 4000) == 256          # 4 MB of logits a block
    assert output_rows_per_block(200, 128, 4000) == 200           # one block: the whole batch
    assert output_rows_per_block(4096, 64, 100) == 4096
    # 4 MB of logits would be 16 rows, too few to pay for dW read and written once more a block
    assert output_rows_per_block(2048, 512, 58101) == 2048
    assert output_rows_per_block(2048, 512, 8000) == 2048         # 128 rows < 2 x d_model


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_output_loss_in_blocks_is_the_one_block_pass_but_for_sums_over_rows(monkeypatch, precision):
    """Blocks of rows (forced small): each row's logits and gradient are those of one block, the loss,
    dW and db add the same terms block by block, so every gradient agrees to rounding."""
    c = cfg(dropout=0.0, d_model=16, n_heads=2, d_ff=32)
    src, tgt_in, tgt_out = batch(c, B=7, S=6, Tt=11)
    kept = int((tgt_out != c.pad_id).sum())
    m = T.Seq2SeqTransformer(c, seed=0)
    one_loss, one = m.loss_and_grads(src, tgt_in, tgt_out, 0.1, precision)
    monkeypatch.setattr(layers, "OUTPUT_BLOCK_BYTES", 4 * c.tgt_vocab_size * 2 * c.d_model)   # 32 rows
    assert output_rows_per_block(kept, c.d_model, c.tgt_vocab_size) == 32 < kept
    calls = []
    real = layers._C.cross_entropy
    monkeypatch.setattr(layers._C, "cross_entropy", lambda *a: calls.append(len(a[0])) or real(*a))
    loss, blocked = m.loss_and_grads(src, tgt_in, tgt_out, 0.1, precision)
    assert calls == [32, kept - 32]
    assert loss == pytest.approx(one_loss, rel=1e-6)
    for name, g in one.items():
        np.testing.assert_allclose(blocked[name], g, rtol=1e-5, atol=1e-6 * np.abs(g).max(), err_msg=name)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_blocks_read_the_output_weight_packed_once_with_gemms_bits_at_any_thread_count(monkeypatch, precision):
    """The blocked pass packs the generator's weight once (Linear.pack_weight) and each block reads
    it: the bits each block's own gemm gives (every block here has 16 rows or more), at 1, 2 and 3
    threads. A packed panel misread, or the wrong orientation, changes the logits or dh."""
    c = cfg(dropout=0.1, d_model=16, n_heads=2, d_ff=32)
    src, tgt_in, tgt_out = batch(c, B=7, S=6, Tt=11)                # 56 targets: blocks of 32 and 24
    monkeypatch.setattr(layers, "OUTPUT_BLOCK_BYTES", 4 * c.tgt_vocab_size * 2 * c.d_model)
    real_pack = layers.Linear.pack_weight
    monkeypatch.setattr(layers.Linear, "pack_weight", lambda self: None)     # each block packs its own
    want_loss, want = T.Seq2SeqTransformer(c, seed=0).loss_and_grads(src, tgt_in, tgt_out, 0.1, precision)
    packs = []
    monkeypatch.setattr(layers.Linear, "pack_weight", lambda self: packs.append(1) or real_pack(self))
    for n in (1, 2, 3):
        with threads(n):
            loss, grads = T.Seq2SeqTransformer(c, seed=0).loss_and_grads(src, tgt_in, tgt_out, 0.1, precision)
        assert len(packs) == n and loss == want_loss, n
        for name, g in want.items():
            assert np.array_equal(grads[name], g), (n, name)


def test_batch_shapes_can_change_between_calls():
    c = cfg(dropout=0.0)
    m = T.Seq2SeqTransformer(c, seed=0)
    small, big = batch(c, B=2, S=4, Tt=3), batch(c, B=5, S=11, Tt=9, seed=3)
    first = m.forward(*small[:2])
    m.forward(*big[:2])
    m.loss_and_grads(*big)
    assert np.array_equal(m.forward(*small[:2]), first)


# ---------------------------------------------------------------- parameters, checkpoints

def test_parameters_are_views_into_one_buffer_with_pytorch_init_and_scaled_embeddings():
    c = T.ModelConfig(**{**TINY, "d_model": 64, "d_ff": 256})
    m = T.Seq2SeqTransformer(c, seed=0)
    sd = m.params.data
    for name, view in sd.items():
        assert np.shares_memory(view, m.params.flat), name
        assert view.ctypes.data % 64 == 0, f"{name} is not 64-byte aligned"
    assert m.num_parameters() == sum(v.size for v in sd.values())
    w = sd["transformer.encoder.layers.0.linear1.weight"]
    bound = math.sqrt(6 / (64 + 256))
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    assert not sd["transformer.encoder.layers.0.self_attn.in_proj_bias"].any()
    assert np.all(sd["transformer.decoder.layers.1.norm3.weight"] == 1)
    assert abs(sd["src_embed.weight"].std() * math.sqrt(64) - 1) < 0.05     # N(0, 1/d_model)
    b1 = sd["transformer.encoder.layers.0.linear1.bias"]
    assert np.abs(b1).max() <= 1 / math.sqrt(64)
    assert np.abs(sd["generator.bias"]).max() <= 1 / math.sqrt(64)
    same = T.Seq2SeqTransformer(c, seed=0).state_dict()
    assert all(np.array_equal(same[k], v) for k, v in sd.items())
    assert not np.array_equal(T.Seq2SeqTransformer(c, seed=1).state_dict()["src_embed.weight"],
                              sd["src_embed.weight"])


def test_save_load_round_trip(tmp_path):
    c = cfg(norm_first=True, activation="gelu")
    m = T.Seq2SeqTransformer(c, seed=9)
    m.save(tmp_path / "ckpt")
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["config.json", "model.safetensors"]
    loaded = T.Seq2SeqTransformer.load(tmp_path / "ckpt")
    assert loaded.cfg == c
    for k, v in m.state_dict().items():
        assert np.array_equal(loaded.state_dict()[k], v), k
    src, tgt_in, _ = batch(c)
    assert np.array_equal(loaded.forward(src, tgt_in), m.forward(src, tgt_in))


@pytest.mark.parametrize("tie", ["target", "all"])
def test_tied_matrices_are_one_tensor_in_memory_and_on_disk(tmp_path, tie):
    c = cfg(tie_embeddings=tie, src_vocab_size=29, activation="silu", positions="split", final_norm=False)
    m = T.Seq2SeqTransformer(c, seed=3)
    sd = m.state_dict()
    tied = ["generator.weight"] + (["tgt_embed.weight"] if tie == "all" else [])
    owner = "src_embed.weight" if tie == "all" else "tgt_embed.weight"
    assert all(name in sd and np.array_equal(sd[name], sd[owner]) for name in tied)
    assert not any(name.startswith("transformer.encoder.norm") or name.startswith("transformer.decoder.norm")
                   for name in sd)
    grads = m.grads()
    assert all(np.shares_memory(grads[name], grads[owner]) for name in tied)
    # the parameter count and the flat buffer hold the matrix once
    assert m.num_parameters() == sum(v.size for k, v in sd.items() if k not in tied)
    m.save(tmp_path / "m")
    from transformer.serialization import load_file
    on_disk = load_file(str(tmp_path / "m" / "model.safetensors"))
    assert not set(tied) & set(on_disk)
    loaded = T.Seq2SeqTransformer.load(tmp_path / "m")
    src, tgt_in, _ = batch(c)
    assert np.array_equal(loaded.forward(src, tgt_in), m.forward(src, tgt_in))
    # a state dict may leave the tied names out, or give them equal to their owner; never different
    m.load_state_dict({k: v for k, v in sd.items() if k not in tied})
    m.load_state_dict(sd)
    bad = dict(sd, **{"generator.weight": sd[owner] + 1})
    with pytest.raises(ValueError, match="generator.weight.*tied"):
        m.load_state_dict(bad)


def test_tied_gradient_is_the_sum_over_every_use():
    """Directional derivative along the shared matrix, against ours untied with the same values:
    the tied gradient is the sum of the three untied ones."""
    tied = T.Seq2SeqTransformer(cfg(tie_embeddings="all", src_vocab_size=29, dropout=0.0), seed=4)
    untied = T.Seq2SeqTransformer(cfg(src_vocab_size=29, dropout=0.0), seed=4)
    untied.load_state_dict(tied.state_dict())
    src, tgt_in, tgt_out = batch(tied.cfg)
    _, g_tied = tied.loss_and_grads(src, tgt_in, tgt_out)
    _, g = untied.loss_and_grads(src, tgt_in, tgt_out)
    want = g["src_embed.weight"] + g["tgt_embed.weight"] + g["generator.weight"]
    np.testing.assert_allclose(g_tied["src_embed.weight"], want, rtol=1e-5, atol=1e-6)


def test_safetensors_layout_is_the_standard_one(tmp_path):
    path = tmp_path / "x.safetensors"
    save_file({"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(1, np.float32)}, path,
              metadata={"k": "v"})
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    assert header["a"] == {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}
    assert header["b"]["data_offsets"] == [24, 28] and header["__metadata__"] == {"k": "v"}
    assert np.array_equal(np.frombuffer(raw[8 + n:8 + n + 24], "<f4"), np.arange(6))
    back = load_file(path)
    assert list(back) == ["a", "b"] and np.array_equal(back["a"], np.arange(6).reshape(2, 3))


def _damage(path, how):
    raw = bytearray(path.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    if how == "truncated":
        raw = raw[:-7]
    elif how == "truncated_header":
        raw = raw[:8 + n // 2]
    elif how == "tiny":
        raw = raw[:5]
    elif how == "huge_header_length":
        raw[:8] = (len(raw) * 2).to_bytes(8, "little")
    elif how == "bad_json":
        raw[8] = ord("X")
    elif how == "bad_dtype":
        raw = raw.replace(b'"F32"', b'"Q99"', 1)
    elif how == "bad_offsets":
        raw = raw.replace(b'"data_offsets":[0,', b'"data_offsets":[4,', 1)
    elif how == "trailing":
        raw += b"\0" * 4
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("how", ["truncated", "truncated_header", "tiny", "huge_header_length",
                                 "bad_json", "bad_dtype", "bad_offsets", "trailing"])
def test_damaged_checkpoint_raises_value_error_naming_the_file(tmp_path, how):
    m = T.Seq2SeqTransformer(cfg(), seed=0)
    m.save(tmp_path / "ckpt")
    path = tmp_path / "ckpt" / "model.safetensors"
    _damage(path, how)
    with pytest.raises(ValueError, match="model.safetensors"):
        T.Seq2SeqTransformer.load(tmp_path / "ckpt")


def test_damaged_config_raises_value_error(tmp_path):
    T.Seq2SeqTransformer(cfg(), seed=0).save(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json"):
        T.Seq2SeqTransformer.load(tmp_path / "ckpt")


@pytest.mark.parametrize("fill", [b"\xff" * 4, np.float32(np.inf).tobytes()], ids=["0xFF (NaN)", "inf"])
def test_a_data_area_overwritten_with_non_finite_floats_is_refused(tmp_path, fill):
    """Such a model loaded and decoded nothing but empty lines: the file and tensor are named."""
    T.Seq2SeqTransformer(cfg(), seed=0).save(tmp_path / "m")
    path = tmp_path / "m" / "model.safetensors"
    raw = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(raw[:8], "little")
    raw[start:] = fill * ((len(raw) - start) // 4)
    path.write_bytes(bytes(raw))
    first = next(k for k in json.loads(raw[8:start]) if k != "__metadata__")
    with pytest.raises(ValueError, match=f"model.safetensors: tensor '{first}' holds non-finite values"):
        T.Seq2SeqTransformer.load(tmp_path / "m")


@pytest.mark.parametrize("precision, name", [("fp32", "transformer.decoder.layers.1.linear2.bias"),
                                             ("int8", "transformer.encoder.layers.0.linear1.bias")])
def test_one_non_finite_value_is_refused_naming_its_tensor(tmp_path, precision, name):
    """Float tensors of int8 files too (their scales: test_decode_precision.py)."""
    T.Seq2SeqTransformer(cfg(), seed=0).save(tmp_path / "m", precision=precision)
    path = str(tmp_path / "m" / "model.safetensors")
    tensors = load_file(path)
    tensors[name].reshape(-1)[-1] = np.inf
    save_file(tensors, path)
    with pytest.raises(ValueError, match=f"model.safetensors: tensor '{name}' holds non-finite values"):
        T.Seq2SeqTransformer.load(tmp_path / "m")


def test_save_is_atomic_and_leaves_no_temporary_files(tmp_path):
    m = T.Seq2SeqTransformer(cfg(), seed=0)
    m.save(tmp_path)
    m.save(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]


def test_load_state_dict_refuses_mismatches():
    m = T.Seq2SeqTransformer(cfg(), seed=0)
    sd = m.state_dict()
    before = m.params.flat.copy()
    missing = dict(sd)
    missing.pop("generator.bias")
    with pytest.raises(ValueError, match="missing"):
        m.load_state_dict(missing)
    with pytest.raises(ValueError, match="unexpected"):
        m.load_state_dict({**sd, "extra.weight": np.zeros(3, np.float32)})
    bad = dict(sd)
    bad["generator.weight"] = np.zeros((3, 3), np.float32)
    with pytest.raises(ValueError, match="generator.weight"):
        m.load_state_dict(bad)
    bad["generator.weight"] = sd["generator.weight"].tolist()
    with pytest.raises(TypeError, match="generator.weight"):
        m.load_state_dict(bad)
    assert np.array_equal(m.params.flat, before), "a refused load must change nothing"


def test_load_state_dict_from_torch_model():
    torch = pytest.importorskip("torch")
    from transformer.torch_compat import build_torch_model, from_torch, to_torch
    c = cfg()
    tm = build_torch_model(c, seed=0)
    m = T.Seq2SeqTransformer(c, seed=0)
    m.load_state_dict({k: v.numpy() for k, v in tm.state_dict().items()})
    for k, v in tm.state_dict().items():
        assert np.array_equal(m.state_dict()[k], v.numpy()), k
    back = to_torch(from_torch(tm, c))
    for k, v in tm.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k


# ---------------------------------------------------------------- optimizer

@pytest.mark.parametrize("weight_decay,decoupled", [(0.0, False), (0.01, False), (0.01, True)])
def test_adam_steps_match_torch(weight_decay, decoupled):
    torch = pytest.importorskip("torch")
    c = cfg(dropout=0.0)
    m = T.Seq2SeqTransformer(c, seed=0)
    rng = np.random.default_rng(0)
    params = {k: torch.from_numpy(v.copy()).requires_grad_() for k, v in m.state_dict().items()}
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    ref = cls(params.values(), lr=1e-2, betas=(0.9, 0.98), eps=1e-9, weight_decay=weight_decay,
              foreach=False)
    opt = T.Adam(m, lr=1e-2, weight_decay=weight_decay, decoupled=decoupled)
    for step in range(3):
        for k, g in m.grads().items():
            g[...] = rng.standard_normal(g.shape).astype(np.float32)
            params[k].grad = torch.from_numpy(g.copy())
        opt.step(lr=1e-2 / (step + 1))
        for group in ref.param_groups:
            group["lr"] = 1e-2 / (step + 1)
        ref.step()
    worst = max(np.abs(m.state_dict()[k] - p.detach().numpy()).max() for k, p in params.items())
    assert worst <= 1e-6, worst


def test_adam_state_dict_round_trip():
    c = cfg(dropout=0.0)
    m = T.Seq2SeqTransformer(c, seed=0)
    src, tgt_in, tgt_out = batch(c)
    opt = T.Adam(m)
    for _ in range(2):
        m.zero_grad()
        m.forward_backward(src, tgt_in, tgt_out)
        opt.step()
    sd = opt.state_dict()
    assert sd["step"] == 2
    twin = T.Seq2SeqTransformer(c, seed=0)
    twin.load_state_dict(m.state_dict())
    opt2 = T.Adam(twin)
    opt2.load_state_dict(sd)
    for model, o in ((m, opt), (twin, opt2)):
        model.zero_grad()
        model.forward_backward(src, tgt_in, tgt_out)
        o.step()
    assert np.array_equal(m.params.flat, twin.params.flat)
    with pytest.raises(ValueError, match="exp_avg"):
        opt2.load_state_dict({**sd, "exp_avg": np.zeros(3, np.float32)})


def test_noam_lr_is_the_papers_schedule():
    assert T.noam_lr(1, d_model=512, warmup=4000) == pytest.approx(512 ** -0.5 * 4000 ** -1.5)
    assert T.noam_lr(4000, 512, 4000) == pytest.approx(512 ** -0.5 * 4000 ** -0.5)
    assert T.noam_lr(16384, 512, 4000) == pytest.approx(512 ** -0.5 / 128)
    assert T.noam_lr(3999) < T.noam_lr(4000) > T.noam_lr(4001)
    with pytest.raises(ValueError, match="step"):
        T.noam_lr(0)


def test_budget_lr_warms_up_linearly_then_decays_linearly_to_its_floor():
    peak, warmup, total = 2e-3, 10, 110
    assert T.budget_lr(1, peak, warmup, total) == pytest.approx(peak / 10)
    assert T.budget_lr(10, peak, warmup, total) == pytest.approx(peak)
    assert T.budget_lr(60, peak, warmup, total) == pytest.approx(peak * (1 - 0.9 * 0.5))
    assert T.budget_lr(110, peak, warmup, total) == pytest.approx(peak * 0.1)
    assert T.budget_lr(500, peak, warmup, total) == pytest.approx(peak * 0.1)    # held after the plan
    assert T.budget_lr(7, peak, 7, 7, final=0.0) == pytest.approx(peak)
    for name, bad in (("step", dict(step=0)), ("warmup", dict(warmup=1.5)), ("total", dict(total=True)),
                      ("total", dict(total=5)), ("peak", dict(peak=float("nan"))), ("final", dict(final=2.0))):
        with pytest.raises((ValueError, TypeError), match=name):
            T.budget_lr(**{"step": 1, "peak": peak, "warmup": warmup, "total": total, **bad})


def test_clip_grad_norm_matches_torch():
    torch = pytest.importorskip("torch")
    m = T.Seq2SeqTransformer(cfg(), seed=0)
    rng = np.random.default_rng(0)
    grads = m.grads()
    tensors = []
    for k, g in grads.items():
        g[...] = rng.standard_normal(g.shape).astype(np.float32)
        t = torch.zeros(g.shape, requires_grad=True)
        t.grad = torch.from_numpy(g.copy())
        tensors.append(t)
    ref_norm = torch.nn.utils.clip_grad_norm_(tensors, 5.0).item()
    norm = T.clip_grad_norm(m, 5.0)
    assert norm == pytest.approx(ref_norm, rel=1e-5)
    for t, g in zip(tensors, grads.values()):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-5, atol=1e-8)
    before = m.params.flat_grad.copy()
    assert T.clip_grad_norm(m, 1e6) == pytest.approx(5.0, rel=1e-5)
    assert np.array_equal(m.params.flat_grad, before), "no clipping below max_norm"


# ---------------------------------------------------------------- configuration and bad input

def test_config_round_trip_and_presets():
    c = cfg(norm_first=True)
    assert T.ModelConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    for name, sizes in T.PRESETS.items():
        p = T.ModelConfig(src_vocab_size=100, tgt_vocab_size=100, **sizes)
        assert p.d_model % p.n_heads == 0, name
    assert T.PRESETS["base"]["d_model"] == 512 and T.PRESETS["tiny"]["n_encoder_layers"] == 2


@pytest.mark.parametrize("field,value,exc", [
    ("d_model", 30, ValueError), ("n_heads", 0, ValueError), ("d_ff", 0, ValueError),
    ("n_encoder_layers", 0, ValueError), ("dropout", 1.0, ValueError), ("dropout", -0.1, ValueError),
    ("activation", "tanh", ValueError), ("max_len", 0, ValueError), ("pad_id", 99, ValueError),
    ("eos_id", 0, ValueError), ("d_model", 32.0, TypeError), ("norm_first", 1, TypeError),
    ("positions", "rotary", ValueError), ("tie_embeddings", "yes", ValueError),
    ("tie_embeddings", "all", ValueError),          # TINY has two vocabulary sizes
    ("final_norm", 0, TypeError), ("scale_embedding", "no", TypeError), ("eos_id", 1, ValueError)])
def test_config_validation_names_the_field(field, value, exc):
    with pytest.raises(exc, match=field if field != "d_model" or exc is TypeError else "d_model"):
        cfg(**{field: value})


def test_config_from_dict_refuses_unknown_fields():
    with pytest.raises(ValueError, match="colour"):
        T.ModelConfig.from_dict({**TINY, "colour": 1})


@pytest.mark.parametrize("arg,value,exc", [
    ("src", np.zeros((2, 3), np.float32), TypeError),
    ("src", np.zeros((2, 3), bool), TypeError),
    ("src", np.zeros(3, np.int64), ValueError),
    ("src", np.zeros((0, 3), np.int64), ValueError),
    ("src", np.full((2, 3), 23), ValueError),
    ("src", np.full((2, 3), -1), ValueError),
    ("src", np.ones((2, 25), np.int64), ValueError),
    ("tgt_in", np.full((2, 4), 29), ValueError),
    ("tgt_in", np.ones((3, 4), np.int64), ValueError),
    ("tgt_in", np.ones((2, 4, 1), np.int64), ValueError),
    ("tgt_out", np.ones((2, 5), np.int64), ValueError),
    ("tgt_out", np.full((2, 4), 29), ValueError),
    ("tgt_out", "abc", TypeError),
])
def test_bad_inputs_raise_naming_the_argument(arg, value, exc):
    m = T.Seq2SeqTransformer(cfg(), seed=0)
    args = dict(src=np.ones((2, 3), np.int64), tgt_in=np.ones((2, 4), np.int64),
                tgt_out=np.ones((2, 4), np.int64))
    args[arg] = value
    with pytest.raises(exc, match=arg):
        m.forward_backward(args["src"], args["tgt_in"], args["tgt_out"])
    if arg != "tgt_out":
        with pytest.raises(exc, match=arg):
            m.forward(args["src"], args["tgt_in"])


def test_other_bad_arguments():
    m = T.Seq2SeqTransformer(cfg(), seed=0)
    ids = np.ones((2, 3), np.int64)
    with pytest.raises(ValueError, match="label_smoothing"):
        m.forward_backward(ids, ids, ids, label_smoothing=1.5)
    with pytest.raises(TypeError, match="cfg"):
        T.Seq2SeqTransformer(TINY)
    with pytest.raises(ValueError, match="max_norm"):
        T.clip_grad_norm(m, 0.0)
    with pytest.raises(ValueError, match="betas"):
        T.Adam(m, betas=(0.9, 1.0))
    # int32 and lists are accepted ids
    assert m.forward(ids.astype(np.int32), [[1, 2, 3], [4, 5, 6]]).shape == (2, 3, 29)


def test_buffers_are_reused_across_batch_shapes():
    """Length-bucketed training changes the batch shape every step: buffers only grow to the
    largest shape seen, then are reused (views into them), never reallocated."""
    c = cfg(dropout=0.1)
    m = T.Seq2SeqTransformer(c, seed=0)
    m.loss_and_grads(*batch(c, B=6, S=12, Tt=11))
    size = m.ws.nbytes()
    for shape in ((2, 4, 3), (6, 12, 11), (3, 9, 5), (5, 7, 10)):
        m.loss_and_grads(*batch(c, *shape))
        m.forward(*batch(c, *shape)[:2])
    assert m.ws.nbytes() == size


def _unshared_memory(m, src):
    """The encoder's output with every layer on its own buffers, as a training pass keeps them."""
    from transformer.model import _padding_mask
    B, S = src.shape
    m.ws.reset(("each layer its own", B, S))
    return m.encoder.forward(m.src_embed.forward(src), B, S, _padding_mask(src, m.cfg.pad_id)).reshape(B, S, -1).copy()


@pytest.mark.parametrize("norm_first, norm", [(False, "layer"), (True, "layer"), (False, "scale")])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_inference_on_one_layers_buffers_gives_the_bits_of_a_buffer_set_a_layer(norm_first, norm, precision):
    # encode and forward share one layer's buffers across a stack (Workspace.share_layers): each
    # layer must have read its input before it writes the buffer that input is in
    c = cfg(n_encoder_layers=3, n_decoder_layers=3, norm_first=norm_first, norm=norm, dropout=0.0)
    m = T.Seq2SeqTransformer(c, seed=4)
    src, tgt_in, _ = batch(c, B=4, S=9, Tt=7)
    logits, _ = m.forward(src, tgt_in, return_attention=True, precision=precision)   # a buffer set a layer
    np.testing.assert_array_equal(m.forward(src, tgt_in, precision=precision), logits)
    if precision == "fp32":
        np.testing.assert_array_equal(m.encode(src), _unshared_memory(m, src))


def test_inference_holds_one_layers_buffers_whatever_the_depth():
    sizes = {}
    for depth in (1, 4):
        c = cfg(n_encoder_layers=depth, n_decoder_layers=depth, dropout=0.0)
        src, tgt_in, _ = batch(c, B=5, S=11, Tt=9)
        m = T.Seq2SeqTransformer(c, seed=0)
        m.encode(src)
        encoded = m.ws.nbytes()
        m.forward(src, tgt_in)
        sizes[depth] = encoded, m.ws.nbytes()
        m.loss_and_grads(src, tgt_in, tgt_in)
        sizes[depth] += (m.ws.nbytes(),)
    assert sizes[4][:2] == sizes[1][:2], sizes
    assert sizes[4][2] > 2 * sizes[1][2], sizes     # training keeps every layer's


def test_training_after_inference_gets_the_gradients_of_a_fresh_model():
    # the shared buffers and the views made without gradient buffers must not reach training
    c = cfg(n_encoder_layers=3, n_decoder_layers=3)
    src, tgt_in, tgt_out = batch(c)
    fresh = T.Seq2SeqTransformer(c, seed=2)
    loss, grads = fresh.loss_and_grads(src, tgt_in, tgt_out)
    m = T.Seq2SeqTransformer(c, seed=2)
    m.encode(src)
    m.forward(src, tgt_in)
    again, after = m.loss_and_grads(src, tgt_in, tgt_out)
    assert again == loss
    for name in grads:
        np.testing.assert_array_equal(after[name], grads[name], err_msg=name)
    np.testing.assert_array_equal(m.forward(src, tgt_in), fresh.forward(src, tgt_in))


def test_concurrent_calls_from_python_threads_are_serialised():
    """The kernels release the GIL and the model's buffers are shared: a lock keeps two Python
    threads calling one model from corrupting each other's results."""
    import sys
    import threading
    c = cfg(dropout=0.0)
    m = T.Seq2SeqTransformer(c, seed=0)
    inputs = [batch(c, B=8, S=12, Tt=10, seed=s)[:2] for s in range(4)]
    expected = [m.forward(*x) for x in inputs]
    wrong = []

    def work(i):
        for _ in range(20):
            wrong.append(not np.array_equal(m.forward(*inputs[i]), expected[i]))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)   # switch threads as often as possible
    try:
        workers = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        sys.setswitchinterval(interval)
    assert len(wrong) == 80 and not any(wrong), f"{sum(wrong)} of {len(wrong)} results corrupted"


def test_helpers_used_by_decoding():
    c = cfg()
    m = T.Seq2SeqTransformer(c, seed=0)
    assert m.config is m.cfg
    pe = m.positional_table(7)
    assert pe.shape == (7, c.d_model) and pe.flags.c_contiguous
    assert pe[0, 0] == 0.0 and pe[0, 1] == 1.0 and abs(pe[3, 0] - math.sin(3)) < 1e-6
    src, tgt_in, _ = batch(c)
    memory = m.encode(src)
    assert memory.shape == src.shape + (c.d_model,) and memory.dtype == np.float32
    ids = m.check_ids(src.astype(np.int32), "src", c.src_vocab_size)
    assert ids.dtype == np.int64 and np.array_equal(ids, src)
    with pytest.raises(ValueError, match="src"):
        m.check_ids(np.full((1, 2), c.src_vocab_size), "src", c.src_vocab_size)
