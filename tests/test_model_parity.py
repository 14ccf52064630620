"""The model matches PyTorch (the oracle): the reference network of DESIGN.md, built by
transformer.torch_compat, loaded with the same weights, must give the same logits, the same
gradient for every parameter tensor and the same loss curve over 50 Adam steps.

Tolerances (stated once; "relative" is per tensor: max|ours - torch| / max|torch|):
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import transformer as T  # noqa: E402
from transformer import _C, layers  # noqa: E402
from transformer.params import parameter_specs  # noqa: E402
from transformer.torch_compat import build_torch_model, torch_loss  # noqa: E402

LOGITS_RTOL = 1e-4      # logits at non-pad target positions
GRAD_RTOL = 1e-3        # every gradient tensor
LOSS_ATOL = 1e-3        # every step of a 50-step Adam run
LABEL_SMOOTHING = 0.1
ZERO_FLOOR = 1e-5       # gradient elements below this fraction of the tensor's largest are rounding
                        # noise of exactly-zero gradients (DESIGN's trap): zeroed on both sides

# name: (config changes, batch, source length, target length)
CASES = {
    "post_ln_relu": (dict(norm_first=False, activation="relu"), 4, 7, 5),
    "post_ln_gelu": (dict(norm_first=False, activation="gelu"), 3, 4, 9),
    "pre_ln_relu": (dict(norm_first=True, activation="relu"), 3, 6, 6),
    "pre_ln_gelu": (dict(norm_first=True, activation="gelu"), 4, 9, 4),
    # MarianMT's options: SiLU, sines then cosines, one tied matrix for source, target and output,
    # no final norms, decoding started from the pad token
    "marian": (dict(activation="silu", positions="split", tie_embeddings="all", final_norm=False,
                    bos_id=0, src_vocab_size=41), 4, 7, 6),
    "tied_target_unscaled": (dict(norm_first=True, activation="silu", tie_embeddings="target",
                                  scale_embedding=False), 3, 5, 7),
    # the output projection and loss over blocks of rows (layers.output_loss), the blocks forced
    # small (BLOCKED): blocks of 48 and 20 of the 68 positions with a target
    "blocked_output": (dict(d_model=24, n_heads=2, d_ff=48), 8, 5, 12),
    # ScaleNorm and FixNorm (transformer/norms.py): post-LN, and pre-LN with a tied output matrix;
    # each alone
    "scale_fix_post": (dict(norm="scale", fix_norm=True), 4, 7, 5),
    "scale_fix_pre_tied": (dict(norm="scale", fix_norm=True, norm_first=True, tie_embeddings="target",
                                activation="gelu"), 3, 6, 6),
    "scale_norm": (dict(norm="scale", norm_first=True), 3, 5, 7),
    "fix_norm": (dict(fix_norm=True, tie_embeddings="all", src_vocab_size=41), 4, 7, 6),
}
BLOCKED = {"blocked_output"}

BASE = dict(src_vocab_size=37, tgt_vocab_size=41, d_model=96, n_heads=3, d_ff=80,
            n_encoder_layers=1, n_decoder_layers=3, dropout=0.0, max_len=16)


@pytest.fixture(autouse=True, scope="module")
def _torch_on_one_thread():
    """The oracle's speed does not matter here; one thread keeps its OpenMP team from competing
    with ours for the cores."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


def config(case):
    return T.ModelConfig(**{**BASE, **CASES[case][0]})


def block_bytes(case):
    """OUTPUT_BLOCK_BYTES that makes a BLOCKED case's blocks 2 x d_model rows: the fewest there are."""
    c = config(case)
    return 4 * c.tgt_vocab_size * 2 * c.d_model


def batch(case, seed=0):
    """src [B, S], tgt_in/tgt_out [B, T]; row b ends with b pads (every row padded differently)."""
    _, B, S, Tt = CASES[case]
    cfg = config(case)
    rng = np.random.default_rng(seed)
    src = rng.integers(3, cfg.src_vocab_size, (B, S))
    tgt = rng.integers(3, cfg.tgt_vocab_size, (B, Tt + 1))
    tgt[:, 0] = cfg.bos_id
    for b in range(B):
        if b:
            src[b, S - min(b, S - 1):] = cfg.pad_id
            tgt[b, Tt + 1 - min(b, Tt - 1):] = cfg.pad_id
    return src, tgt[:, :-1].copy(), tgt[:, 1:].copy()


def pair(case):
    """A torch reference model and ours with the same (torch-initialised) weights."""
    cfg = config(case)
    torch.manual_seed(1234)
    tm = build_torch_model(cfg)
    ours = T.Seq2SeqTransformer(cfg, seed=0)
    ours.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    return tm, ours


def rel(ours, ref):
    ref = np.asarray(ref, dtype=np.float64)
    diff = np.abs(np.asarray(ours, dtype=np.float64) - ref).max()
    return diff / max(np.abs(ref).max(), 1e-30), diff


_RESULTS = {}


def results(case):
    """Computed once per case: logits (eval) and gradients (train mode, dropout 0) of both."""
    if case not in _RESULTS:
        tm, ours = pair(case)
        src, tgt_in, tgt_out = batch(case)
        tm.eval()
        with torch.no_grad():
            ref_logits = tm(torch.from_numpy(src), torch.from_numpy(tgt_in)).numpy()
        our_logits = ours.forward(src, tgt_in)
        tm.train()
        tm.zero_grad()
        ref_loss = torch_loss(tm, src, tgt_in, tgt_out, LABEL_SMOOTHING)
        ref_loss.backward()
        ref_grads = {k: p.grad.numpy().copy() for k, p in tm.named_parameters()}
        with pytest.MonkeyPatch.context() as mp:
            if case in BLOCKED:
                mp.setattr(layers, "OUTPUT_BLOCK_BYTES", block_bytes(case))
                kept = int((tgt_out != config(case).pad_id).sum())
                assert layers.output_rows_per_block(kept, config(case).d_model, config(case).tgt_vocab_size) == 48 < kept
            our_loss, our_grads = ours.loss_and_grads(src, tgt_in, tgt_out, LABEL_SMOOTHING)
        keep = tgt_in != config(case).pad_id
        keep[:, 0] = True      # the start token (the pad token itself in the "marian" case)
        _RESULTS[case] = dict(keep=keep, ref_logits=ref_logits,
                              our_logits=our_logits, ref_loss=ref_loss.item(), our_loss=our_loss,
                              ref_grads=ref_grads, our_grads=our_grads)
    return _RESULTS[case]


@pytest.mark.parametrize("case", CASES)
def test_logits_match_torch_at_non_pad_positions(case):
    r = results(case)
    keep = r["keep"]
    assert r["our_logits"].dtype == np.float32 and r["our_logits"].shape == r["ref_logits"].shape
    err, diff = rel(r["our_logits"][keep], r["ref_logits"][keep])
    assert err <= LOGITS_RTOL, f"{case}: logits relative difference {err:.3g} (max abs {diff:.3g})"


@pytest.mark.parametrize("case", CASES)
def test_loss_matches_torch(case):
    r = results(case)
    diff = abs(r["our_loss"] - r["ref_loss"])
    assert diff <= LOGITS_RTOL * abs(r["ref_loss"]), f"{case}: loss {r['our_loss']} vs {r['ref_loss']} (diff {diff:.3g})"


@pytest.mark.parametrize("case,name", [(c, name) for c in CASES
                                       for name, _, _ in parameter_specs(config(c))])
def test_gradient_matches_torch(case, name):
    r = results(case)
    ours, ref = r["our_grads"][name], r["ref_grads"][name]
    assert ours.shape == ref.shape
    if name in scale_invariant(config(case)):
        # exactly zero (the final ScaleNorm undoes any g before it): both sides' rounding noise,
        # far below the other gains' gradients
        others = max(np.abs(g).max() for n, g in r["ref_grads"].items()
                     if ".norm" in n and n not in scale_invariant(config(case)))
        assert max(abs(ours[0]), abs(ref[0])) <= ZERO_FLOOR * others, (ours, ref, others)
        return
    err, diff = rel(ours, ref)
    assert err <= GRAD_RTOL, f"{case} {name}: gradient relative difference {err:.3g} (max abs {diff:.3g})"


def scale_invariant(cfg):
    """The ScaleNorm gains whose exact gradient is zero: post-LN, the last layer's last norm feeds
    the final ScaleNorm straight, which gives the same output for any g before it."""
    if cfg.norm != "scale" or cfg.norm_first or not cfg.final_norm:
        return set()
    return {f"transformer.encoder.layers.{cfg.n_encoder_layers - 1}.norm2.weight",
            f"transformer.decoder.layers.{cfg.n_decoder_layers - 1}.norm3.weight"}


def test_every_torch_parameter_has_our_name():
    tm, ours = pair("post_ln_relu")
    assert list(ours.state_dict()) == list(tm.state_dict())
    assert {k: v.shape for k, v in ours.state_dict().items()} == \
        {k: tuple(v.shape) for k, v in tm.state_dict().items()}


def _neutralise(grads):
    """Zero the rounding noise of exactly-zero gradients (DESIGN's trap), in place."""
    for g in grads:
        big = np.abs(g).max() if g.size else 0.0
        g[np.abs(g) < ZERO_FLOOR * big] = 0.0


@pytest.mark.parametrize("case", CASES)
def test_fifty_adam_steps_follow_torch(case):
    tm, ours = pair(case)
    src, tgt_in, tgt_out = batch(case, seed=1)
    opt = T.Adam(ours, lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
    ref_opt = torch.optim.Adam(tm.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9, foreach=False)
    tm.train()
    worst = 0.0
    for step in range(50):
        ours.zero_grad()
        with pytest.MonkeyPatch.context() as mp:
            if case in BLOCKED:
                mp.setattr(layers, "OUTPUT_BLOCK_BYTES", block_bytes(case))
            loss = ours.forward_backward(src, tgt_in, tgt_out, LABEL_SMOOTHING)
        _neutralise(ours.grads().values())
        opt.step()
        ref_opt.zero_grad()
        ref = torch_loss(tm, src, tgt_in, tgt_out, LABEL_SMOOTHING)
        ref.backward()
        with torch.no_grad():
            _neutralise(p.grad.numpy() for p in tm.parameters())
        ref_opt.step()
        diff = abs(loss - ref.item())
        worst = max(worst, diff)
        assert diff <= LOSS_ATOL, f"{case} step {step}: loss {loss:.6f} vs torch {ref.item():.6f}"
    assert loss < 0.5 * results(case)["ref_loss"], "the run should learn the batch"
    print(f"{case}: worst loss difference over 50 steps {worst:.3g}")


@pytest.mark.parametrize("isa", _C.isa_levels())
def test_parity_at_every_simd_level(isa):
    best = _C.best_isa()
    levels = _C.isa_levels()
    if levels.index(isa) > levels.index(best):
        pytest.skip(f"this CPU's best level is {best}")
    case = "pre_ln_gelu"
    r = results(case)
    _, ours = pair(case)
    src, tgt_in, tgt_out = batch(case)
    try:
        _C.set_isa(isa)
        logits = ours.forward(src, tgt_in)
        _, grads = ours.loss_and_grads(src, tgt_in, tgt_out, LABEL_SMOOTHING)
    finally:
        _C.set_isa(best)
    err, diff = rel(logits[r["keep"]], r["ref_logits"][r["keep"]])
    assert err <= LOGITS_RTOL, f"{isa}: logits relative difference {err:.3g}"
    worst = max((rel(grads[k], r["ref_grads"][k])[0], k) for k in grads)
    assert worst[0] <= GRAD_RTOL, f"{isa}: gradient {worst[1]} relative difference {worst[0]:.3g}"


def test_loads_torch_state_dict_with_extra_buffers_filtered():
    tm, _ = pair("post_ln_relu")
    ours = T.Seq2SeqTransformer(config("post_ln_relu"), seed=5)
    names = set(ours.state_dict())
    ours.load_state_dict({k: v.numpy() for k, v in tm.state_dict().items() if k in names})
    for k, v in tm.state_dict().items():
        assert np.array_equal(ours.state_dict()[k], v.numpy()), k


@pytest.mark.parametrize("case", ["post_ln_relu", "pre_ln_gelu"])
def test_encode_matches_torch_encoder_output_at_non_pad_positions(case):
    tm, ours = pair(case)
    src, _, _ = batch(case)
    cfg = config(case)
    tm.eval()
    with torch.no_grad():
        s = torch.from_numpy(src)
        x = tm.src_embed(s) * cfg.d_model ** 0.5 + tm.pe[:src.shape[1]]
        ref = tm.transformer.encoder(x, src_key_padding_mask=s == cfg.pad_id).numpy()
    memory = ours.encode(src)
    keep = src != cfg.pad_id
    assert memory.shape == ref.shape and memory.dtype == np.float32
    err, diff = rel(memory[keep], ref[keep])
    assert err <= LOGITS_RTOL, f"{case}: memory relative difference {err:.3g} (max abs {diff:.3g})"


ATTENTION_ATOL = 1e-5   # attention weights are probabilities in [0, 1]


def _torch_attention_weights(tm, src, tgt_in):
    """Every layer's per-head attention weights from PyTorch itself: each MultiheadAttention call
    is repeated with need_weights=True, average_attn_weights=False on the inputs it was given."""
    captured = []

    def hook(module, args, kwargs, output):
        kwargs = {**kwargs, "need_weights": True, "average_attn_weights": False}
        captured.append(module.forward(*args, **kwargs)[1].detach().numpy().copy())

    handles = [m.register_forward_hook(hook, with_kwargs=True)
               for m in tm.modules() if isinstance(m, torch.nn.MultiheadAttention)]
    try:
        tm.train()       # dropout is 0: train mode only keeps PyTorch off its fused eval fast path
        with torch.no_grad():
            tm(torch.from_numpy(src), torch.from_numpy(tgt_in))
    finally:
        for h in handles:
            h.remove()
    n_enc = tm.cfg.n_encoder_layers
    return {"encoder": captured[:n_enc], "decoder_self": captured[n_enc::2],
            "cross": captured[n_enc + 1::2]}


@pytest.mark.parametrize("case", ["post_ln_relu", "pre_ln_gelu"])
def test_forward_return_attention_matches_torch(case):
    tm, ours = pair(case)
    src, tgt_in, _ = batch(case)
    logits, attention = ours.forward(src, tgt_in, return_attention=True)
    np.testing.assert_array_equal(logits, ours.forward(src, tgt_in))
    ref = _torch_attention_weights(tm, src, tgt_in)
    cfg = config(case)
    B, S = src.shape
    T = tgt_in.shape[1]
    shapes = {"encoder": (B, cfg.n_heads, S, S), "decoder_self": (B, cfg.n_heads, T, T),
              "cross": (B, cfg.n_heads, T, S)}
    layers = {"encoder": cfg.n_encoder_layers, "decoder_self": cfg.n_decoder_layers,
              "cross": cfg.n_decoder_layers}
    assert set(attention) == set(shapes)
    for kind, weights in attention.items():
        assert len(weights) == layers[kind] == len(ref[kind])
        for layer, (w, r) in enumerate(zip(weights, ref[kind])):
            assert w.dtype == np.float32 and w.shape == shapes[kind] == r.shape
            diff = np.abs(w - r).max()
            assert diff <= ATTENTION_ATOL, f"{case} {kind} layer {layer}: max abs difference {diff:.3g}"
    # the decoder's self-attention never looks ahead; padded source keys get no weight
    assert np.all(np.triu(attention["decoder_self"][0], k=1) == 0)
    assert np.all(attention["cross"][-1][src[:, None, None, :].repeat(T, 2).repeat(cfg.n_heads, 1)
                                         == cfg.pad_id] == 0)


def test_forward_return_attention_must_be_bool():
    _, ours = pair("post_ln_relu")
    src, tgt_in, _ = batch("post_ln_relu")
    with pytest.raises(TypeError, match="return_attention"):
        ours.forward(src, tgt_in, return_attention="yes")


# -- decoding: ours against the reference network decoding step by step ------------------------------

DECODE_STEPS = 10
# Our initialisation (torch's N(0, 1) embeddings, scaled, make a random model repeat one token),
# with the generator's EOS bias raised so that some greedy outputs end early and others at the
# limit; a case: its EOS bias
DECODE_CASES = {"post_ln_relu": 1.0, "pre_ln_gelu": 1.5, "tied_target_unscaled": 1.5}


def decode_pair(case):
    """Ours, initialised by us, and the reference holding the same weights (eval mode)."""
    from transformer.torch_compat import to_torch

    ours = T.Seq2SeqTransformer(config(case), seed=0)
    ours.params.data["generator.bias"][ours.cfg.eos_id] += DECODE_CASES[case]
    return to_torch(ours).eval(), ours


def torch_step_logp(tm, src, ys):
    """The reference's log-probabilities of the next token after each prefix in ys [N, t],
    the whole prefix re-run (no cache); padding and the start token never chosen."""
    with torch.no_grad():
        logits = tm(torch.from_numpy(src), torch.from_numpy(ys))[:, -1].double()
    logp = torch.log_softmax(logits, -1)
    logp[:, [tm.cfg.pad_id, tm.cfg.bos_id]] = -float("inf")
    return logp


def torch_greedy(tm, src, steps):
    """Greedy decoding with the reference: the favourite token each step, a sentence ends at EOS."""
    cfg = tm.cfg
    ys = np.full((len(src), 1), cfg.bos_id, dtype=np.int64)
    for _ in range(steps):
        ys = np.concatenate([ys, torch_step_logp(tm, src, ys).argmax(-1).numpy()[:, None]], 1)
    hyps = [row[1:] for row in ys.tolist()]
    return [h[:h.index(cfg.eos_id)] if cfg.eos_id in h else h for h in hyps]


def torch_beam(tm, src, beam, steps):
    """Beam search with the reference at a fixed length (EOS never chosen, as with min_len =
    max_len): each step keeps the `beam` best of every beam's extension by every token, scored by
    the sum of the log-probabilities; the best beam at the end is the answer."""
    cfg = tm.cfg
    B = len(src)
    rows = np.repeat(src, beam, axis=0)
    ys = np.full((B * beam, 1), cfg.bos_id, dtype=np.int64)
    scores = torch.full((B, beam), -float("inf"), dtype=torch.float64)
    scores[:, 0] = 0.0
    for _ in range(steps):
        logp = torch_step_logp(tm, rows, ys)
        logp[:, cfg.eos_id] = -float("inf")
        V = logp.shape[-1]
        candidates = (scores[:, :, None] + logp.view(B, beam, V)).view(B, -1)
        scores, index = candidates.topk(beam, dim=1)
        parents = (index // V + torch.arange(B)[:, None] * beam).view(-1).numpy()
        ys = np.concatenate([ys[parents], (index % V).view(-1, 1).numpy()], 1)
    best = scores.argmax(1).numpy() + np.arange(B) * beam
    return [ys[row, 1:].tolist() for row in best]


@pytest.mark.parametrize("case", DECODE_CASES)
def test_greedy_decoding_gives_the_tokens_of_the_torch_reference(case):
    tm, ours = decode_pair(case)
    src, _, _ = batch(case)
    want = torch_greedy(tm, src, DECODE_STEPS)
    got = ours.greedy_decode(src, max_len=DECODE_STEPS)
    print(want, got, sep="\n")
    assert got == want
    assert len({len(h) for h in want}) > 1, "some sentences end at EOS, others at the limit"


@pytest.mark.parametrize("case", DECODE_CASES)
def test_beam_search_gives_the_hypothesis_of_the_torch_reference(case):
    tm, ours = decode_pair(case)
    src, _, _ = batch(case)
    want = torch_beam(tm, src, 3, DECODE_STEPS)
    got = ours.beam_search(src, beam_size=3, max_len=DECODE_STEPS, min_len=DECODE_STEPS)
    print(want, got, sep="\n")
    assert got == want
    assert want != torch_beam(tm, src, 1, DECODE_STEPS), "the beams found what greedy search did not"
