"""bf16 mixed-precision training: model.forward_backward(..., precision="bf16").

Oracle (tests/bf16_oracle.py): the network written out in torch, every GEMM of forward and
backward rounding its operands to bf16 exactly where the engine does, everything else in float64
(or float32). What we found and rely on:

- pre-LN: the engine matches the float64 oracle to ~1e-7 (relative error norm per gradient), while
  the fp32 engine is off by 1e-2..1e-1: the rounding points are the same, and the test could not
  pass with an operand left unrounded;
- post-LN: a bf16 rounding flip (an operand computed in fp32 by us and in float64 by the oracle,
  landing on different sides of a bf16 boundary) is amplified through the stacked post-LN layers
  (1e-4 relative on the loss after 4 layers, against 1e-9 for pre-LN; 1e-6 with the oracle in
  float32, whose intermediate values are nearer ours), so the tight comparison is made on pre-LN.
- Against fp32: cosine similarity of each gradient >= 0.999, except for tensors where bf16 itself
  loses more: there PyTorch's autocast-bf16 loses as much against its own fp32 gradients (measured
  on the parity configs: its worst tensor 0.993, ours 0.991-0.993; post-LN at d_model 64 and 2+2
  layers: torch 0.964, ours 0.967), so those must be within 0.003 of torch's. The key-projection
  bias, exactly zero in exact arithmetic, is left out (DESIGN's trap).
"""
import gzip
import json
import os

import numpy as np
import pytest

import transformer as T
from transformer import _C

from conftest import num_threads, unit_embeddings
from test_model_parity import BLOCKED, CASES, batch, config, scale_invariant

torch = pytest.importorskip("torch")
import bf16_oracle  # noqa: E402

LS = 0.1


def zero_key_bias(cfg, grads):
    D = cfg.d_model
    out = {}
    for k, g in grads.items():
        g = np.array(g, dtype=np.float64)
        if k.endswith("in_proj_bias"):
            g[D:2 * D] = 0.0
        out[k] = g
    return out


def oracle(cfg, model, src, tin, tout, dtype, rounding=True):
    loss, P = bf16_oracle.loss(torch, cfg, model.state_dict(), model.pe, src, tin, tout, LS, rounding, dtype)
    loss.backward()
    return float(loss.detach()), zero_key_bias(cfg, {k: v.grad.numpy() for k, v in P.items()})


def rel_errors(got, want):
    return {k: np.linalg.norm(got[k] - want[k]) / max(np.linalg.norm(want[k]), 1e-30) for k in want}


@pytest.mark.parametrize("case", ["pre_ln_relu", "pre_ln_gelu"])
def test_gradients_match_the_oracle_that_rounds_the_same_operands(case):
    """Pre-LN only: post-LN amplifies rounding flips between any two implementations (module
    docstring); its layers make the same GEMM calls, and the next test covers it against torch.

    Pre-LN has flips too, only rarer: an fp32 sum landing on the other side of a bf16 boundary
    than the float64 oracle's moves a gradient by up to ~2e-3 (relative). Which seeds flip
    depends on the summation order, so on the SIMD level (measured, model seeds 3-8: two to
    three of six flip at avx2, avx512_bf16 and amx alike, not the same ones). Seed 4 flips at
    none of the six levels, in either case: the test then sees the rounding points, not luck."""
    cfg = config(case)
    model = unit_embeddings(T.Seq2SeqTransformer(cfg, seed=4))
    src, tin, tout = batch(case)[:3]
    loss16, g16 = model.loss_and_grads(src, tin, tout, LS, precision="bf16")
    loss32, g32 = model.loss_and_grads(src, tin, tout, LS)
    g16, g32 = zero_key_bias(cfg, g16), zero_key_bias(cfg, g32)
    want_loss, want = oracle(cfg, model, src, tin, tout, torch.float64)
    assert abs(loss16 - want_loss) <= 1e-7 * abs(want_loss), (loss16, want_loss)
    err = rel_errors(g16, want)
    worst = max(err, key=err.get)
    assert err[worst] <= 1e-5, f"{worst}: relative error {err[worst]:.3g} > 1e-5"
    # the unrounded (fp32) gradients miss the bound by far: the comparison sees the rounding
    assert max(rel_errors(g32, want).values()) > 1e-3


@pytest.mark.parametrize("case", sorted(set(CASES) - BLOCKED))   # BLOCKED: narrow heads, for parity
def test_gradients_point_where_fp32_gradients_point_as_closely_as_torch_autocast(case):
    """Cosine of each bf16 gradient with the fp32 one: >= 0.999, or, for the few tensors where
    bf16 itself loses more, no more than PyTorch's autocast-bf16 loses on the same network."""
    from transformer import torch_compat
    cfg = config(case)
    model = unit_embeddings(T.Seq2SeqTransformer(cfg, seed=4))
    src, tin, tout = batch(case, seed=1)[:3]
    loss16, g16 = model.loss_and_grads(src, tin, tout, LS, precision="bf16")
    loss32, g32 = model.loss_and_grads(src, tin, tout, LS)
    assert abs(loss16 - loss32) <= 2e-3 * abs(loss32)
    reference = torch_compat.to_torch(model)
    reference.train()

    def torch_grads(autocast):
        reference.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = torch_compat.torch_loss(reference, src, tin, tout, LS)
        loss.backward()
        return zero_key_bias(cfg, {k: p.grad.numpy() for k, p in reference.named_parameters()})

    t16, t32 = torch_grads(True), torch_grads(False)
    g16, g32 = zero_key_bias(cfg, g16), zero_key_bias(cfg, g32)

    def cos(a, b):
        return float(a.ravel() @ b.ravel() / (np.linalg.norm(a) * np.linalg.norm(b)))

    # torch names a tied matrix once; a ScaleNorm gain with an exactly zero gradient has no direction
    names = [k for k in t32 if k not in scale_invariant(cfg)]
    ours = {k: cos(g16[k], g32[k]) for k in names}
    theirs = {k: cos(t16[k], t32[k]) for k in names}
    # FixNorm's post-LN case loses more in bf16 here and in autocast alike (0.9989, 0.9985)
    assert np.median(list(ours.values())) >= min(0.9995, np.median(list(theirs.values())))
    for k in ours:
        floor = min(0.999, theirs[k] - 0.003)
        assert ours[k] >= floor, f"{k}: cosine {ours[k]:.5f} < {floor:.5f} (torch autocast: {theirs[k]:.5f})"


def test_bf16_bits_do_not_depend_on_thread_count(restore_threads):
    cfg = T.ModelConfig(src_vocab_size=61, tgt_vocab_size=67, d_model=64, n_heads=4, d_ff=96,
                        n_encoder_layers=2, n_decoder_layers=2, dropout=0.1, norm_first=True)
    rng = np.random.default_rng(5)
    src, tin, tout = rng.integers(3, 61, (6, 11)), rng.integers(3, 67, (6, 9)), rng.integers(3, 67, (6, 9))
    results = []
    for n in (1, 2, 3):
        with num_threads(n):
            model = unit_embeddings(T.Seq2SeqTransformer(cfg, seed=7))
            loss, grads = model.loss_and_grads(src, tin, tout, LS, precision="bf16")
            results.append((loss, model.params.flat_grad.copy()))
    for loss, flat in results[1:]:
        assert loss == results[0][0]
        assert np.array_equal(flat.view(np.uint32), results[0][1].view(np.uint32))
    model = unit_embeddings(T.Seq2SeqTransformer(cfg, seed=7))
    assert model.loss_and_grads(src, tin, tout, LS)[0] != results[0][0]   # bf16 is not fp32


def test_forward_in_bf16_rounds_the_linear_maps():
    case = "pre_ln_relu"
    cfg = config(case)
    model = unit_embeddings(T.Seq2SeqTransformer(cfg, seed=3))
    src, tin, _ = batch(case)[:3]
    logits16 = model.forward(src, tin, precision="bf16")
    logits32 = model.forward(src, tin)
    assert not np.array_equal(logits16, logits32)
    assert np.abs(logits16 - logits32).max() <= 0.05 * np.abs(logits32).max()
    # precision is per call: the next fp32 call is fp32 again
    assert np.array_equal(model.forward(src, tin), logits32)


def test_unknown_or_unsupported_precision_is_refused_before_anything_changes():
    cfg = config("pre_ln_relu")
    model = unit_embeddings(T.Seq2SeqTransformer(cfg, seed=3))
    src, tin, tout = batch("pre_ln_relu")[:3]
    model.forward_backward(src, tin, tout)
    before = model.params.flat_grad.copy()
    for bad in ("fp16", "BF16", None, 8):
        with pytest.raises(ValueError, match="precision must be one of 'fp32', 'bf16', 'int8'"):
            model.forward_backward(src, tin, tout, precision=bad)
        with pytest.raises(ValueError, match="precision must be one of"):
            model.loss_and_grads(src, tin, tout, precision=bad)
    with pytest.raises(ValueError, match="precision='int8' is not available for training"):
        model.forward_backward(src, tin, tout, precision="int8")
    with pytest.raises(ValueError, match="precision='int8' is not available for training"):
        model.loss_and_grads(src, tin, tout, precision="int8")
    assert np.array_equal(model.params.flat_grad, before)


SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")


@pytest.mark.skipif(not os.path.isdir(SHARED), reason="../shared/data is not present")
def test_300_steps_on_real_data_follow_the_fp32_loss_curve(tmp_path, restore_threads):
    """The Bible corpus (its first 4000 pairs), tiny preset, 300 steps of the budget schedule with
    dropout, batches of 512 tokens, the same seed: every bf16 loss within 2% of the fp32 run's at the same step (issue 11;
    measured on `small` with 29k pairs: 0.014% at worst, dev loss 5.3957 vs 5.3959)."""
    from transformer import cli, train

    with gzip.open(os.path.join(SHARED, "bible-eng-spa.tsv.gz"), "rt", encoding="utf-8") as f:
        lines = [next(f) for _ in range(4001)]
    data = tmp_path / "bible-4000.tsv"
    data.write_text("".join(lines), encoding="utf-8")
    losses = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / precision
        assert cli.main(["train", "--data", str(data), "--src-col", "eng", "--tgt-col", "spa", "--preset", "tiny",
                         "--vocab-size", "1000", "--batch-tokens", "512", "--max-steps", "300", "--dev-max", "20", "--threads", "1",
                         "--quiet", "--precision", precision, "--out", str(out)]) == 0
        with open(out / train.LOG_FILE) as f:
            losses[precision] = np.array([json.loads(line)["loss"] for line in f if '"loss"' in line])
    assert len(losses["fp32"]) == len(losses["bf16"]) == 300
    relative = np.abs(losses["bf16"] - losses["fp32"]) / losses["fp32"]
    assert relative.max() <= 0.02, f"step {relative.argmax() + 1}: {relative.max():.3%}"
    assert relative.max() > 0          # bf16 did round
    assert losses["fp32"][-20:].mean() < losses["fp32"][:20].mean() - 1.0   # and it learned
