"""Reduced-precision inference: forward / greedy_decode / beam_search / encode with precision
"bf16" or "int8", int8 model files, and weights converted once per weights version.

Oracle: tests/bf16_oracle.py `logits`, the network in float64 with only the linear maps reduced
(bf16 operands; or int8 weights and activations quantized per row by the kernel's float32 rule,
exact integer sums, the kernel's dequantization), embedding tables dequantized for int8. The
engine computes the same roundings on float32 intermediates, so its logits are near the oracle's
(a value on a rounding boundary can land on the other side: rare, and diluted in a sum); the fp32
engine's logits are far from them, so these comparisons see whether the reduction happened.
"""
import os

import numpy as np
import pytest

import transformer as T
from transformer import _C, decoding, prepared

from conftest import ALL_ISA_LEVELS, isa_fixture, num_threads, unit_embeddings

isa = isa_fixture(ALL_ISA_LEVELS)   # the GEMMs have vnni (int8) and bf16 kernels

torch = pytest.importorskip("torch")
import bf16_oracle  # noqa: E402

REDUCED = ("bf16", "int8")


def make_model(norm_first=True, seed=0, **changes):
    cfg = T.ModelConfig(src_vocab_size=53, tgt_vocab_size=59, d_model=64, n_heads=4, d_ff=96,
                        n_encoder_layers=2, n_decoder_layers=2, dropout=0.0, norm_first=norm_first, max_len=32,
                        **changes)
    return unit_embeddings(T.Seq2SeqTransformer(cfg, seed=seed))


def inputs(cfg, seed=0, B=3, S=7, Tt=6):
    rng = np.random.default_rng(seed)
    src = rng.integers(3, cfg.src_vocab_size, (B, S))
    tin = rng.integers(3, cfg.tgt_vocab_size, (B, Tt))
    tin[:, 0] = cfg.bos_id
    src[1, S - 2:] = cfg.pad_id
    tin[2, Tt - 2:] = cfg.pad_id
    return src, tin


def oracle_logits(model, src, tin, precision):
    tables = None
    if precision == "int8":
        tables = {name: prepared.dequantize(*prepared.quantize(model.params.data[name]))
                  for name in ("src_embed.weight", "tgt_embed.weight")}
    linear = None if precision == "fp32" else precision
    generator = decoding.int8_generator(model.cfg) if precision == "int8" else None
    return bf16_oracle.logits(torch, model.cfg, model.state_dict(), model.pe, src, tin, linear, tables,
                              generator).numpy()


def nonpad(x, tin, pad):
    return x[tin != pad]


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("precision", REDUCED)
def test_logits_match_the_oracle_that_reduces_the_same_linear_maps(isa, precision, norm_first):
    model = make_model(norm_first, seed=1)
    src, tin = inputs(model.cfg, seed=2)
    got = nonpad(model.forward(src, tin, precision=precision).astype(np.float64), tin, model.cfg.pad_id)
    want = nonpad(oracle_logits(model, src, tin, precision), tin, model.cfg.pad_id)
    fp32 = nonpad(model.forward(src, tin).astype(np.float64), tin, model.cfg.pad_id)
    scale = np.abs(want).max()
    err = np.abs(got - want).max() / scale
    err32 = np.abs(fp32 - want).max() / scale
    assert err <= 5e-6, f"{precision}: max error {err:.3g} of the logits' scale"
    assert err32 >= 10 * err, f"the fp32 logits are as close ({err32:.3g}): the test would not see a missed reduction"


@pytest.mark.parametrize("precision", REDUCED)
def test_reduced_logits_stay_close_to_fp32(precision):
    model = make_model(seed=3)
    src, tin = inputs(model.cfg, seed=4)
    got, fp32 = model.forward(src, tin, precision=precision), model.forward(src, tin)
    assert not np.array_equal(got, fp32)
    assert np.abs(got - fp32).max() <= 0.05 * np.abs(fp32).max()


@pytest.mark.parametrize("norms", [{}, {"fix_norm": True}, {"norm": "scale", "fix_norm": True}],
                         ids=["layer", "fix_norm", "scale_fix_norm"])
@pytest.mark.parametrize("precision", REDUCED)
def test_greedy_decoding_follows_the_forward_logits_of_its_precision(precision, norms):
    """The key/value-cached step loop and the full forward pass use the same reduced linear maps:
    each greedy token is the argmax of forward(prefix, precision) (or a near-tie of it). FixNorm's
    unit tables reach both (the C step, and the Python step that ScaleNorm's models take)."""
    model = make_model(seed=5, **norms)
    cfg = model.cfg
    src, _ = inputs(cfg, seed=6)
    hyps = model.greedy_decode(src, max_len=8, precision=precision)
    for b, hyp in enumerate(hyps):
        prefix = [cfg.bos_id]
        for token in hyp + ([cfg.eos_id] if len(hyp) < 8 else []):
            logits = model.forward(src[b:b + 1], np.array([prefix]), precision=precision)[0, -1].astype(np.float64)
            logits[[cfg.pad_id, cfg.bos_id]] = -np.inf
            assert logits[token] >= logits.max() - 1e-4 * np.abs(logits[np.isfinite(logits)]).max(), \
                f"sentence {b}, step {len(prefix)}: token {token} is not the argmax {logits.argmax()}"
            prefix.append(token)


@pytest.mark.parametrize("precision", REDUCED)
def test_decoding_bits_do_not_depend_on_thread_count(precision, restore_threads):
    model = make_model(seed=7)
    src, tin = inputs(model.cfg, seed=8, B=5)
    results = []
    for n in (1, 2, 3):
        with num_threads(n):
            results.append((model.forward(src, tin, precision=precision),
                            model.greedy_decode(src, max_len=8, precision=precision),
                            model.beam_search(src, beam_size=3, max_len=8, precision=precision)))
    for logits, greedy, beam in results[1:]:
        assert np.array_equal(logits.view(np.uint32), results[0][0].view(np.uint32))
        assert greedy == results[0][1] and beam == results[0][2]


def test_weights_are_converted_once_per_weights_version(monkeypatch):
    model = make_model(seed=9)
    src, _ = inputs(model.cfg, seed=10)
    quantized = []
    real = prepared.quantize
    monkeypatch.setattr(prepared, "quantize", lambda w: quantized.append(w.shape) or real(w))
    first = model.greedy_decode(src, max_len=6, precision="int8")
    n_first = len(quantized)
    assert n_first > 0
    assert model.greedy_decode(src, max_len=6, precision="int8") == first
    assert model.beam_search(src, beam_size=2, max_len=6, precision="int8") is not None
    assert len(quantized) == n_first            # nothing quantized again: the weights did not change
    model.params.data["transformer.decoder.layers.1.linear2.weight"][0, 0] += 0.5   # in place
    model.greedy_decode(src, max_len=6, precision="int8")
    assert quantized[n_first:] == [model.params.data["transformer.decoder.layers.1.linear2.weight"].shape]


@pytest.mark.parametrize("precision", ("fp32",) + REDUCED)
def test_decoding_sees_weights_changed_in_place_in_every_precision(precision):
    model = make_model(seed=11)
    src, _ = inputs(model.cfg, seed=12)
    before = model.greedy_decode(src, max_len=8, precision=precision), \
        model.beam_search(src, beam_size=3, max_len=8, precision=precision)
    rng = np.random.default_rng(13)
    for name, w in model.params.data.items():
        w += rng.normal(0, 0.3, w.shape).astype(np.float32)     # encoder and embeddings too
    fresh = make_model(seed=14)
    fresh.load_state_dict(model.state_dict())
    after = model.greedy_decode(src, max_len=8, precision=precision), \
        model.beam_search(src, beam_size=3, max_len=8, precision=precision)
    assert after == (fresh.greedy_decode(src, max_len=8, precision=precision),
                     fresh.beam_search(src, beam_size=3, max_len=8, precision=precision))
    assert after != before


def test_int8_file_is_a_quarter_and_loads_without_quantizing_again(tmp_path, monkeypatch):
    model = make_model(seed=15)
    src, tin = inputs(model.cfg, seed=16)
    model.save(tmp_path / "fp32")
    model.save(tmp_path / "int8", precision="int8")
    matrices = sum(model.params.data[k].size for k in model.int8_matrices())
    others = model.num_parameters() - matrices
    size32 = os.path.getsize(tmp_path / "fp32" / "model.safetensors")
    size8 = os.path.getsize(tmp_path / "int8" / "model.safetensors")
    rows = sum(model.params.data[k].shape[0] for k in model.int8_matrices())
    assert size8 - size32 == pytest.approx(-3 * matrices + 4 * rows, abs=4096)   # headers differ a little
    assert size8 < 0.3 * size32 + 4 * others

    want = (model.forward(src, tin, precision="int8"), model.greedy_decode(src, max_len=8, precision="int8"),
            model.beam_search(src, beam_size=3, max_len=8, precision="int8"))
    monkeypatch.setattr(prepared, "quantize", lambda w: pytest.fail("quantized a loaded int8 matrix again"))
    loaded = T.Seq2SeqTransformer.load(tmp_path / "int8")
    got = (loaded.forward(src, tin, precision="int8"), loaded.greedy_decode(src, max_len=8, precision="int8"),
           loaded.beam_search(src, beam_size=3, max_len=8, precision="int8"))
    assert np.array_equal(got[0], want[0]) and got[1:] == want[1:]
    # its float32 weights are the dequantized matrices: fp32 decoding works, and saving int8
    # again writes the same integers
    assert isinstance(loaded.greedy_decode(src, max_len=4), list)
    loaded.save(tmp_path / "again", precision="int8")
    assert (tmp_path / "again" / "model.safetensors").read_bytes() == (tmp_path / "int8" / "model.safetensors").read_bytes()


def test_damaged_int8_files_are_refused(tmp_path):
    from transformer.serialization import load_file, save_file
    model = make_model(seed=17)
    model.save(tmp_path / "int8", precision="int8")
    path = tmp_path / "int8" / "model.safetensors"
    good = load_file(str(path))
    name = "transformer.decoder.layers.0.linear1.weight"
    cases = [   # (tensors, what the error says)
        ({k: v for k, v in good.items() if k != f"{name}.scale"}, "needs a float32"),             # no scale
        ({**good, f"{name}.scale": good[f"{name}.scale"][:-1]}, "needs a float32"),               # wrong shape
        ({**good, f"{name}.scale": -good[f"{name}.scale"]}, "finite scales >= 0"),               # negative
        ({**good, f"{name}.scale": np.full_like(good[f"{name}.scale"], np.nan)}, "scale' holds non-finite"),
        ({**good, "generator.bias.scale": np.ones(3, np.float32)}, "unexpected"),                # stray scale
    ]
    for tensors, message in cases:
        save_file(tensors, str(path))
        with pytest.raises(ValueError, match=f"model.safetensors.*{message}"):
            T.Seq2SeqTransformer.load(tmp_path / "int8")


@pytest.mark.parametrize("precision", ("fp32",) + REDUCED)
def test_the_reduced_precisions_keep_the_decoders_keys_and_values_in_bf16(precision):
    """bf16 caches (half the bytes attention reads per step) hold each key and value rounded to
    nearest; fp32 keeps float32. What the oracle above rounds (decoder_kv) is what they hold."""
    model = make_model(seed=19)
    src, _ = inputs(model.cfg, seed=20)
    shared, src_pad = decoding._encode_once(model, src, precision, {})
    cache = decoding.DecoderCache(model, shared, src_pad, 1, 8)
    want = np.float32 if precision == "fp32" else np.uint16
    assert all(a.dtype == want for a in cache.self_k + cache.self_v + cache.memory_k + cache.memory_v)
    if precision != "fp32":   # the cross-attention keys: the projection of the memory, rounded
        D, H = model.cfg.d_model, model.cfg.n_heads
        B, S = src.shape
        memory = model.encode(src, precision=precision).reshape(B * S, D)
        w = model.params.data["transformer.decoder.layers.0.multihead_attn.in_proj_weight"][D:2 * D]
        b = model.params.data["transformer.decoder.layers.0.multihead_attn.in_proj_bias"][D:2 * D]
        keys = (memory.astype(np.float64) @ w.T.astype(np.float64) + b).reshape(B, S, H, D // H).transpose(0, 2, 1, 3)
        held = bf16_oracle.widen(cache.memory_k[0])
        scale = np.abs(keys).max()
        assert np.abs(held - keys).max() <= 2 ** -8 * scale + (0.03 * scale if precision == "int8" else 0)


def test_unknown_or_unsupported_precision_is_refused():
    model = make_model(seed=18)
    src, tin = inputs(model.cfg, seed=19)
    for bad in ("fp16", "INT8", None, 8):
        for call in (lambda p: model.greedy_decode(src, precision=p), lambda p: model.beam_search(src, precision=p),
                     lambda p: model.encode(src, precision=p), lambda p: model.forward(src, tin, precision=p),
                     lambda p: model.save("/nonexistent/never", precision=p)):
            with pytest.raises(ValueError, match="precision must be one of 'fp32', 'bf16', 'int8'"):
                call(bad)
    with pytest.raises(ValueError, match="precision='bf16' is not available for saving"):
        model.save("/nonexistent/never", precision="bf16")


def test_a_non_finite_weight_cannot_be_saved_as_int8(tmp_path):
    model = make_model(seed=26)
    model.params.data["transformer.encoder.layers.0.linear1.weight"][3, 4] = np.inf
    with pytest.raises(ValueError, match="cannot save 'transformer.encoder.layers.0.linear1.weight' as int8"):
        model.save(tmp_path / "m", precision="int8")


def test_int8_output_projection_setting_is_honoured(monkeypatch):
    """decoding.INT8_GENERATOR (None: by size) sets the output projection's precision in int8
    decoding: its logits come from that product, and an int8 file stores it so."""
    model = make_model(seed=20)
    src, tin = inputs(model.cfg, seed=21)
    assert decoding.INT8_GENERATOR is None and decoding.int8_generator(model.cfg) == "bf16"
    assert "generator.weight" not in model.int8_matrices()
    wide = model.forward(src, tin, precision="int8")
    monkeypatch.setattr(decoding, "INT8_GENERATOR", "int8")
    narrow = model.forward(src, tin, precision="int8")
    assert not np.array_equal(wide, narrow)
    assert "generator.weight" in model.int8_matrices()
    assert isinstance(model.greedy_decode(src, max_len=4, precision="int8"), list)


def test_the_output_projection_is_int8_where_it_is_most_of_a_step():
    """By default it is bf16 (float32 in an int8 file) unless it holds more weights than every
    decoder layer together (OPUS-MT's 58101 x 512 against 6 layers): then int8 decoding quantizes
    it too."""
    cfg = T.ModelConfig(src_vocab_size=50, tgt_vocab_size=50, d_model=16, n_heads=2, d_ff=32,
                        n_encoder_layers=1, n_decoder_layers=2)
    layers = 2 * (6 * 16 * 16 + 2 * 16 * 32)          # 5120 weights; the projection: vocab x 16
    assert decoding.int8_generator(cfg) == "bf16"
    assert decoding.int8_generator(cfg.replace(tgt_vocab_size=layers // 16)) == "bf16"
    big = cfg.replace(tgt_vocab_size=layers // 16 + 1, src_vocab_size=400)
    assert decoding.int8_generator(big) == "int8"
    model = unit_embeddings(T.Seq2SeqTransformer(big, seed=3))
    assert "generator.weight" in model.int8_matrices()
    src, tin = inputs(big, seed=4)
    got = nonpad(model.forward(src, tin, precision="int8").astype(np.float64), tin, big.pad_id)
    want = nonpad(oracle_logits(model, src, tin, "int8"), tin, big.pad_id)
    assert np.abs(got - want).max() <= 5e-6 * np.abs(want).max()


def test_a_change_of_instruction_set_repacks_the_kept_weights():
    """Weights kept packed for the AVX2 kernels are packed again after set_isa("generic"): decoding
    still works, and int8, whose bits do not depend on the instruction set, gives the same output."""
    model = make_model(seed=22)
    src, _ = inputs(model.cfg, seed=23)
    best = _C.best_isa()
    try:
        want = {p: model.greedy_decode(src, max_len=8, precision=p) for p in ("fp32", "bf16", "int8")}
        _C.set_isa("generic")
        got = {p: model.greedy_decode(src, max_len=8, precision=p) for p in ("fp32", "bf16", "int8")}
    finally:
        _C.set_isa(best)
    assert got["int8"] == want["int8"]
    assert all(isinstance(got[p], list) and len(got[p]) == len(src) for p in got)


def test_int8_logits_with_an_int8_projection_match_the_oracle(monkeypatch):
    monkeypatch.setattr(decoding, "INT8_GENERATOR", "int8")
    model = make_model(seed=24)
    src, tin = inputs(model.cfg, seed=25)
    got = nonpad(model.forward(src, tin, precision="int8").astype(np.float64), tin, model.cfg.pad_id)
    want = nonpad(oracle_logits(model, src, tin, "int8"), tin, model.cfg.pad_id)
    assert np.abs(got - want).max() <= 5e-6 * np.abs(want).max()


def test_frozen_weights_are_trusted_without_a_checksum_and_refuse_every_write(monkeypatch):
    # Parameters.freeze: read-only weights (the command line's translate and evaluate), so decoding
    # reads no float32 weight again for matrices it checked under that freeze; unfreeze: checked again
    model = make_model(seed=21)
    src, _ = inputs(model.cfg, seed=22)
    def decode(m=model):
        return [search(src, max_len=6, precision=p) for p in ("fp32",) + REDUCED
                for search in (m.greedy_decode, lambda s, **k: m.beam_search(s, beam_size=2, **k))]

    expected = decode()
    sums = []
    real = _C.checksum
    monkeypatch.setattr(prepared._C, "checksum", lambda w: sums.append(w.nbytes) or real(w))
    model.params.freeze()
    assert decode() == expected and sums         # converted before the freeze: checked once under it
    del sums[:]
    assert decode() == expected and not sums     # then trusted
    name = "transformer.decoder.layers.0.linear1.weight"
    with pytest.raises(ValueError, match="read-only"):
        model.params.data[name][0, 0] += 1.0
    with pytest.raises(ValueError, match="read-only"):
        model.load_state_dict(model.state_dict())
    with pytest.raises(ValueError, match="params must be writeable"):
        T.Adam(model).step()
    model.params.unfreeze()
    model.params.data[name][...] *= -1.0         # in place, once the weights are writable again
    fresh = make_model(seed=5)
    fresh.load_state_dict(model.state_dict())
    got = decode()
    assert sums and got != expected and got == decode(fresh)
