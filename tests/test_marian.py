"""MarianMT (OPUS-MT) models: import, decoding, fine-tuning and export against transformers.

The oracle is `transformers.MarianMTModel` itself, on small random models built in the test (no
download) with a SentencePiece model trained here on a few sentences. Tolerances:
- logits within 1e-4 of the largest (MarianMT's, float32, at non-pad positions);
- gradients of one fine-tuning pass within 1e-3 relative per tensor (max |diff| / max |theirs|);
- greedy and beam outputs equal token for token; export -> import bit-exact.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

import transformer as T  # noqa: E402
from transformer.marian import (config_from_marian, export_marian, import_marian,  # noqa: E402
                                state_dict_from_marian, state_dict_to_marian, write_marian_vocab)

LOGITS_ATOL = 1e-4
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")
GRAD_RTOL = 1e-3

SENTENCES = [
    "the house is small", "the dog runs in the garden", "i like green apples",
    "where is the train station", "she reads a book every night", "we are going to the beach",
    "the weather is nice today", "my brother plays the guitar", "they eat bread and cheese",
    "la casa es pequeña", "el perro corre en el jardín", "me gustan las manzanas verdes",
    "dónde está la estación de tren", "ella lee un libro cada noche", "vamos a la playa",
    "hace buen tiempo hoy", "mi hermano toca la guitarra", "comen pan y queso",
    "good morning, how are you?", "buenos días, ¿cómo estás?", "thank you very much!",
    "muchas gracias", "the children sing songs", "los niños cantan canciones",
]


def _spm_model(directory):
    prefix = os.path.join(directory, "sp")
    spm.SentencePieceTrainer.train(sentence_iterator=iter(SENTENCES), model_prefix=prefix, vocab_size=90,
                                   character_coverage=1.0, model_type="unigram", bos_id=-1,
                                   eos_id=-1, unk_id=0, minloglevel=2)
    return prefix + ".model"


def _marian_dir(root, activation="swish", scale_embedding=True, seed=0, safetensors=True):
    """A random MarianMTModel (weights, biases and norms all random) saved with its tokenizer files."""
    os.makedirs(root, exist_ok=True)
    vocab = write_marian_vocab(root, _spm_model(root))
    pad = len(vocab) - 1
    cfg = transformers.MarianConfig(
        vocab_size=len(vocab), decoder_vocab_size=len(vocab), d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48,
        max_position_embeddings=64, pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad,
        forced_eos_token_id=None, activation_function=activation, scale_embedding=scale_embedding,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" not in name:
                p.copy_(torch.randn_like(p) * (0.3 if p.dim() > 1 else 0.1) + (1.0 if "layer_norm.weight" in name else 0.0))
        model.final_logits_bias.copy_(torch.randn_like(model.final_logits_bias) * 0.1)
    model.eval()
    model.save_pretrained(root)
    if not safetensors:      # the older format (transformers 5 writes safetensors only): torch.save's zip
        os.remove(os.path.join(root, "model.safetensors"))
        torch.save(model.state_dict(), os.path.join(root, "pytorch_model.bin"))
    return model


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("marian") / "hf")
    hf = _marian_dir(root)
    tok = transformers.MarianTokenizer.from_pretrained(root)
    ours, src_tok, tgt_tok = import_marian(root)
    return dict(dir=root, hf=hf, tok=tok, ours=ours, src_tok=src_tok, tgt_tok=tgt_tok)


def _batch(m, texts):
    enc = m["tok"](texts, return_tensors="np", padding=True)
    return enc["input_ids"].astype(np.int64), enc["attention_mask"]


def test_config_maps_marians_options(marian):
    cfg = marian["ours"].cfg
    hf = marian["hf"].config
    assert (cfg.activation, cfg.positions, cfg.tie_embeddings, cfg.final_norm, cfg.norm_first) == \
        ("silu", "split", "all", False, False)
    assert (cfg.pad_id, cfg.bos_id, cfg.eos_id) == (hf.pad_token_id, hf.decoder_start_token_id, hf.eos_token_id)
    assert cfg.src_vocab_size == cfg.tgt_vocab_size == hf.vocab_size and cfg.max_len == 64


def test_tokenizers_give_marians_ids(marian):
    texts = ["the dog reads a book", "¿dónde está el tren?"]
    for text in texts:
        assert marian["src_tok"].encode(text) == marian["tok"](text)["input_ids"]


def test_logits_match_marianmt(marian):
    src, mask = _batch(marian, ["the dog runs in the garden", "hace buen tiempo", "thank you"])
    rng = np.random.default_rng(0)
    cfg = marian["ours"].cfg
    tgt_in = rng.integers(2, cfg.tgt_vocab_size - 1, (3, 7))
    tgt_in[:, 0] = cfg.bos_id                          # MarianMT's decoder start: the pad token
    tgt_in[2, 5:] = cfg.pad_id                         # right padding
    with torch.no_grad():
        ref = marian["hf"](input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(mask),
                           decoder_input_ids=torch.from_numpy(tgt_in)).logits.numpy()
    ours = marian["ours"].forward(src, tgt_in)
    keep = tgt_in != cfg.pad_id
    keep[:, 0] = True
    err = np.abs(ours[keep] - ref[keep]).max() / np.abs(ref[keep]).max()
    assert err <= LOGITS_ATOL, err


def _generate(marian, src, mask, **kw):
    cfg = marian["ours"].cfg
    with torch.no_grad():
        out = marian["hf"].generate(input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(mask),
                                    do_sample=False, bad_words_ids=[[cfg.pad_id]], forced_eos_token_id=None,
                                    min_length=0, **kw).numpy()
    hyps = []
    for row in out[:, 1:].tolist():                   # drop the start token; cut at EOS
        row = row[:row.index(cfg.eos_id)] if cfg.eos_id in row else row
        hyps.append([t for t in row if t != cfg.pad_id])
    return hyps


def test_greedy_equals_generate(marian):
    src, mask = _batch(marian, ["the dog runs in the garden", "hace buen tiempo", "thank you", "la casa"])
    want = _generate(marian, src, mask, num_beams=1, max_new_tokens=12)
    assert marian["ours"].greedy_decode(src, max_len=12) == want


@pytest.fixture(scope="module")
def trained(marian, tmp_path_factory):
    """The imported model after 40 Adam steps (ours) on nine pairs, exported, and MarianMTModel
    loaded from the export: a model whose hypotheses end at different lengths (a random one ends
    at once or never), on both sides."""
    from transformer.data import collate, make_example
    ours, src_tok, tgt_tok = import_marian(marian["dir"])
    cfg = ours.cfg
    examples = [make_example(src_tok.encode(a), tgt_tok.encode(b), cfg.bos_id, cfg.eos_id)
                for a, b in zip(SENTENCES[:9], SENTENCES[9:18])]
    src, tgt_in, tgt_out = collate(examples, range(len(examples)), cfg.pad_id)
    opt = T.Adam(ours, lr=3e-3)
    for _ in range(40):
        ours.zero_grad()
        ours.forward_backward(src, tgt_in, tgt_out, label_smoothing=0.0)
        opt.step()
    out = str(tmp_path_factory.mktemp("trained") / "hf")
    export_marian(ours, src_tok, tgt_tok, out)
    hf = transformers.MarianMTModel.from_pretrained(out).eval()
    return dict(marian, hf=hf, ours=ours)


@pytest.mark.parametrize("eos_bias", [-1.0, 0.0, 1.0])
def test_beam_search_equals_generate(trained, eos_bias):
    """num_beams=4, early_stopping=True (done at K finished hypotheses), length_penalty 0: the
    hypotheses ranked by their summed log-probabilities. (Our length penalty is GNMT's
    ((5 + len) / 6)^a, generate's len^a: they agree at a = 0.) The EOS bias moves where
    hypotheses end, and EOS competes inside and outside the K best candidates."""
    hf, ours = trained["hf"], trained["ours"]
    eos = ours.cfg.eos_id
    texts = SENTENCES[:9] + ["the house reads", "thank you", "good morning"]
    src, mask = _batch(trained, texts)
    with torch.no_grad():
        hf.final_logits_bias[0, eos] += eos_bias
    ours.params.data["generator.bias"][eos] += eos_bias
    try:
        want = _generate(trained, src, mask, num_beams=4, max_new_tokens=12, length_penalty=0.0,
                         early_stopping=True)
        got = ours.beam_search(src, beam_size=4, max_len=12, length_penalty=0.0, early_stopping=True)
        greedy = _generate(trained, src, mask, num_beams=1, max_new_tokens=12)
        assert ours.greedy_decode(src, max_len=12) == greedy
    finally:
        with torch.no_grad():
            hf.final_logits_bias[0, eos] -= eos_bias
        ours.params.data["generator.bias"][eos] -= eos_bias
    assert len({len(h) for h in want}) > 2, "the test wants hypotheses of different lengths"
    assert got == want


def test_fine_tuning_gradients_match_marianmt(marian):
    hf, ours = marian["hf"], marian["ours"]
    cfg = ours.cfg
    src, mask = _batch(marian, ["the dog runs in the garden", "thank you", "la casa es pequeña"])
    labels = marian["tok"](text_target=["el perro corre", "muchas gracias", "the house"], return_tensors="np",
                           padding=True)["input_ids"].astype(np.int64)     # pieces + </s>, pad-filled
    tgt_in = np.concatenate([np.full((3, 1), cfg.bos_id), labels[:, :-1]], axis=1)
    tgt_in[tgt_in == cfg.eos_id] = cfg.pad_id          # MarianMT's shift_tokens_right: EOS not fed
    loss, grads = ours.loss_and_grads(src, tgt_in, labels, label_smoothing=0.0)
    hf.train()
    hf.zero_grad()
    logits = hf(input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(mask),
                decoder_input_ids=torch.from_numpy(tgt_in)).logits
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.from_numpy(labels).reshape(-1),
                                            ignore_index=cfg.pad_id)
    ref.backward()
    hf.eval()
    assert abs(loss - ref.item()) <= 1e-5 * abs(ref.item())
    ref_grads = {k: p.grad.numpy() for k, p in hf.named_parameters() if p.grad is not None}
    mapped = state_dict_from_marian(ref_grads, cfg, "gradients")
    del mapped["generator.bias"]                        # final_logits_bias is a buffer in MarianMT
    for name, want in mapped.items():
        got = grads[name]
        err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)
        assert err <= GRAD_RTOL, f"{name}: {err:.3g}"


def test_export_import_round_trip_is_bit_exact_and_transformers_loads_it(marian, tmp_path):
    out = str(tmp_path / "exported")
    export_marian(marian["ours"], marian["src_tok"], marian["tgt_tok"], out)
    back, src_tok, _ = import_marian(out)
    for name, value in marian["ours"].state_dict().items():
        assert np.array_equal(back.state_dict()[name], value), name
    hf = transformers.MarianMTModel.from_pretrained(out).eval()
    tok = transformers.MarianTokenizer.from_pretrained(out)
    src, mask = _batch(marian, ["where is the train station", "muchas gracias"])
    assert tok("muchas gracias")["input_ids"] == src_tok.encode("muchas gracias")
    tgt_in = np.array([[back.cfg.bos_id, 5, 9, 13], [back.cfg.bos_id, 7, 7, 3]])
    with torch.no_grad():
        ref = hf(input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(mask),
                 decoder_input_ids=torch.from_numpy(tgt_in)).logits.numpy()
    with torch.no_grad():
        orig = marian["hf"](input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(mask),
                            decoder_input_ids=torch.from_numpy(tgt_in)).logits.numpy()
    np.testing.assert_array_equal(ref, orig)
    exported = state_dict_to_marian(back)
    assert set(exported) <= set(marian["hf"].state_dict())


@pytest.mark.parametrize("activation, scale", [("gelu", False), ("relu", True)])
def test_other_activations_and_unscaled_embeddings_and_pytorch_bin(tmp_path, activation, scale):
    root = str(tmp_path / "hf")
    hf = _marian_dir(root, activation=activation, scale_embedding=scale, seed=3, safetensors=False)
    assert os.path.exists(os.path.join(root, "pytorch_model.bin"))
    ours, _, _ = import_marian(root)
    src = np.array([[5, 9, 12, 0], [7, 8, 0, ours.cfg.pad_id]])
    tgt_in = np.array([[ours.cfg.bos_id, 4, 6], [ours.cfg.bos_id, 11, 3]])
    with torch.no_grad():
        ref = hf(input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(src != ours.cfg.pad_id),
                 decoder_input_ids=torch.from_numpy(tgt_in)).logits.numpy()
    got = ours.forward(src, tgt_in)
    assert np.abs(got - ref).max() <= LOGITS_ATOL * np.abs(ref).max()


def test_what_cannot_be_mapped_is_named(marian):
    hf_cfg = json.load(open(os.path.join(marian["dir"], "config.json")))
    with pytest.raises(ValueError, match="activation_function 'tanh'"):
        config_from_marian({**hf_cfg, "activation_function": "tanh"})
    with pytest.raises(ValueError, match="model_type"):
        config_from_marian({**hf_cfg, "model_type": "bart"})
    with pytest.raises(ValueError, match="attention heads"):
        config_from_marian({**hf_cfg, "decoder_attention_heads": 2})
    cfg = marian["ours"].cfg
    sd = {k: v.numpy() for k, v in marian["hf"].state_dict().items()}
    with pytest.raises(ValueError, match="model.encoder.layers.0.extra.weight"):
        state_dict_from_marian({**sd, "model.encoder.layers.0.extra.weight": np.zeros(3)}, cfg)
    missing = dict(sd)
    del missing["model.decoder.layers.1.encoder_attn.k_proj.weight"]
    with pytest.raises(ValueError, match="decoder.layers.1.multihead_attn.in_proj_weight"):
        state_dict_from_marian(missing, cfg)
    with pytest.raises(ValueError, match="fc1.weight has shape"):
        state_dict_from_marian({**sd, "model.encoder.layers.0.fc1.weight": np.zeros((3, 3))}, cfg)
    learned = dict(sd, **{"model.encoder.embed_positions.weight": sd["model.encoder.embed_positions.weight"] + 0.1})
    with pytest.raises(ValueError, match="sinusoidal"):
        state_dict_from_marian(learned, cfg)


@pytest.mark.parametrize("damage, match", [
    (lambda c: [1], "config.json: not a MarianMT config: a JSON object is expected, got list"),
    (lambda c: {**c, "activation_function": ["swish"]}, "config.json: activation_function must be a string"),
    (lambda c: {**c, "d_model": "32"}, "config.json: d_model must be an integer, got '32'"),
    (lambda c: {**c, "encoder_layers": True}, "config.json: encoder_layers must be an integer, got True"),
    (lambda c: {**c, "scale_embedding": "false"}, "config.json: scale_embedding must be true or false"),
    (lambda c: {**c, "dropout": [0.1]}, "config.json: dropout must be a number"),
    (lambda c: {**c, "decoder_start_token_id": None}, "config.json: decoder_start_token_id must be an integer"),
], ids=["list", "activation-list", "string-size", "bool-size", "string-bool", "list-dropout", "null-id"])
def test_a_damaged_or_foreign_config_is_a_value_error_naming_the_field(marian, damage, match):
    hf_cfg = json.load(open(os.path.join(marian["dir"], "config.json")))
    with pytest.raises(ValueError, match=match):
        config_from_marian(damage(hf_cfg), "/some/dir/config.json")


def test_non_finite_weights_are_refused_naming_the_tensor(marian, tmp_path):
    """A data area overwritten with 0xFF bytes (NaN) was imported as a model that translates to
    empty lines; the importer checks every tensor, from safetensors and pytorch_model.bin alike."""
    root = tmp_path / "hf"
    shutil.copytree(marian["dir"], root)
    path = root / "model.safetensors"
    raw = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(raw[:8], "little")
    raw[start:] = b"\xff" * (len(raw) - start)
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=f"{root}: tensor '.+' holds non-finite values"):
        import_marian(str(root))
    sd = {k: v.numpy() for k, v in marian["hf"].state_dict().items()}
    sd["model.decoder.layers.1.fc2.bias"] = np.full_like(sd["model.decoder.layers.1.fc2.bias"], np.inf)
    with pytest.raises(ValueError, match="tensor 'model.decoder.layers.1.fc2.bias' holds non-finite"):
        state_dict_from_marian(sd, marian["ours"].cfg)


def test_command_line_refuses_damaged_configs_and_weights_in_one_line(marian, tmp_path):
    for name, damage in (("config", lambda root: (root / "config.json").write_text("[1]")),
                         ("activation", lambda root: (root / "config.json").write_text(json.dumps(
                             {**json.loads((root / "config.json").read_text()), "activation_function": ["swish"]}))),
                         ("weights", lambda root: (root / "model.safetensors").write_bytes(
                             (root / "model.safetensors").read_bytes()[:-4] + b"\xff" * 4))):
        root = tmp_path / name
        shutil.copytree(marian["dir"], root)
        damage(root)
        r = _cli("convert", "--from", "marian", str(root), "--out", str(tmp_path / f"{name}-out"))
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and f"--from {root}:" in r.stderr, r.stderr
        assert ("config.json" if name != "weights" else "non-finite") in r.stderr, r.stderr


def test_export_refuses_what_marianmt_cannot_hold(marian, tmp_path):
    ours = T.Seq2SeqTransformer(T.ModelConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=16, n_heads=2,
                                              d_ff=32, n_encoder_layers=1, n_decoder_layers=1))
    with pytest.raises(ValueError, match="norm_first|final_norm|positions"):
        export_marian(ours, marian["src_tok"], marian["tgt_tok"], str(tmp_path / "x"))


def _cli(*args, cwd=None):
    """`transformer ...` in a fresh process, run from outside the checkout (whose transformer/
    folder has no compiled module and would shadow the installed package)."""
    return subprocess.run([sys.executable, "-m", "transformer", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd or tempfile.gettempdir())


def test_command_line_convert_translate_fine_tune_and_export(marian, tmp_path):
    out = str(tmp_path / "ours")
    r = _cli("convert", "--from", "marian", marian["dir"], "--out", out)
    assert r.returncode == 0, r.stderr
    texts = ["the dog runs in the garden", "thank you very much!"]
    r = _cli("translate", "--model", out, "--beam", "1", *texts)
    assert r.returncode == 0, r.stderr
    want = []
    for text in texts:       # the model's own limit: generate's default max_length 20 (it sets none)
        src, mask = _batch(marian, [text])
        hyp = _generate(marian, src, mask, num_beams=1)[0]
        want.append(marian["tok"].decode(hyp, skip_special_tokens=True))
    assert r.stdout.splitlines() == want
    src, mask = _batch(marian, texts)
    # fine-tune on a few pairs with the model's own tokenizers, then export the result
    data = tmp_path / "pairs.tsv"
    data.write_text("".join(f"{a}\t{b}\n" for a, b in zip(SENTENCES[:9], SENTENCES[9:18])) * 4, encoding="utf-8")
    tuned = str(tmp_path / "tuned")
    r = _cli("train", "--data", str(data), "--init-from", out, "--out", tuned, "--max-steps", "3",
             "--dev-fraction", "0.1", "--quiet", "--batch-tokens", "256")
    assert r.returncode == 0, r.stderr
    before, after = T.Seq2SeqTransformer.load(out), T.Seq2SeqTransformer.load(tuned)
    assert after.cfg.replace(dropout=before.cfg.dropout) == before.cfg
    assert not np.array_equal(after.state_dict()["src_embed.weight"], before.state_dict()["src_embed.weight"])
    exported = str(tmp_path / "hf_tuned")
    r = _cli("convert", "--to", "marian", tuned, "--out", exported)
    assert r.returncode == 0, r.stderr
    hf = transformers.MarianMTModel.from_pretrained(exported).eval()
    tgt_in = np.array([[after.cfg.bos_id, 5, 9], [after.cfg.bos_id, 7, 3]])
    with torch.no_grad():
        ref = hf(input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(mask),
                 decoder_input_ids=torch.from_numpy(tgt_in)).logits.numpy()
    got = after.forward(src, tgt_in)
    assert np.abs(got - ref).max() <= LOGITS_ATOL * np.abs(ref).max()


@pytest.mark.parametrize("argv, match", [
    (["convert", "--from", "marian", "/nonexistent", "--out", "x"], "--from /nonexistent"),
    (["convert", "--from", "fairseq", "/tmp", "--out", "x"], "--from fairseq"),
    (["convert", "--out", "x"], "exactly one of"),
])
def test_command_line_errors_are_one_line(argv, match, tmp_path):
    r = _cli(*argv, cwd=tmp_path)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and match in r.stderr, r.stderr


def test_init_from_refuses_size_flags(marian, tmp_path):
    out = str(tmp_path / "ours")
    import_marian(marian["dir"], out)
    data = tmp_path / "p.tsv"
    data.write_text("a\tb\n" * 20, encoding="utf-8")
    r = _cli("train", "--data", str(data), "--init-from", out, "--d-model", "64", "--out", str(tmp_path / "t"))
    assert r.returncode != 0 and "--d-model" in r.stderr and "Traceback" not in r.stderr


def test_fine_tuning_an_imported_model_resumes_exactly(marian, tmp_path):
    """train --init-from keeps every feature of training: a run stopped after 3 steps and resumed
    repeats the losses of an uninterrupted 6-step run (the checkpoint carries the SentencePiece
    tokenizers and MarianMT's pad start token)."""
    out = str(tmp_path / "ours")
    import_marian(marian["dir"], out)
    data = tmp_path / "pairs.tsv"
    data.write_text("".join(f"{a}\t{b}\n" for a, b in zip(SENTENCES[:9], SENTENCES[9:18])) * 4, encoding="utf-8")
    base = ["train", "--data", str(data), "--init-from", out, "--schedule", "noam", "--warmup", "4",
            "--batch-tokens", "200", "--dev-fraction", "0.1", "--quiet", "--dropout", "0.1"]
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    assert _cli(*base, "--max-steps", "6", "--out", straight).returncode == 0
    assert _cli(*base, "--max-steps", "3", "--out", split).returncode == 0
    r = _cli("train", "--resume", split, "--max-steps", "6", "--quiet")
    assert r.returncode == 0, r.stderr

    def losses(directory):
        with open(os.path.join(directory, "log.jsonl")) as f:
            return [json.loads(line)["loss"] for line in f if "loss" in json.loads(line)]
    assert len(losses(straight)) == 6 and losses(split) == losses(straight)


def test_reduced_precision_decoding_of_an_imported_model(marian, tmp_path):
    """bf16 and int8 decoding work on the tied matrix; an int8 file keeps it float32 (it is the
    output projection, which int8 decoding keeps wide) and decodes as the model in memory does."""
    ours = marian["ours"]
    src, _ = _batch(marian, ["the dog runs in the garden", "thank you"])
    want = ours.greedy_decode(src, max_len=10, precision="int8")
    for precision in ("bf16", "int8"):
        assert len(ours.beam_search(src, max_len=10, precision=precision)) == 2
    ours.save(tmp_path / "q", precision="int8")
    from transformer.serialization import load_file
    stored = load_file(str(tmp_path / "q" / "model.safetensors"))
    assert stored["src_embed.weight"].dtype == np.float32
    assert stored["transformer.encoder.layers.0.linear1.weight"].dtype == np.int8
    loaded = T.Seq2SeqTransformer.load(tmp_path / "q")
    assert loaded.stored_precision == "int8" and loaded.greedy_decode(src, max_len=10, precision="int8") == want


@pytest.mark.parametrize("tie_output, tie", [(True, "target"), (False, "none")])
def test_separate_encoder_and_decoder_embeddings_map_too(tie_output, tie):
    """share_encoder_decoder_embeddings=false (newer OPUS-MT models): the decoder's embedding is
    its own, and the output projection is tied to it or not."""
    c = transformers.MarianConfig(
        vocab_size=50, decoder_vocab_size=50, d_model=16, encoder_layers=1, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
        max_position_embeddings=64, pad_token_id=49, eos_token_id=0, decoder_start_token_id=49,
        activation_function="swish", scale_embedding=True, share_encoder_decoder_embeddings=False,
        tie_word_embeddings=tie_output, dropout=0.0)
    torch.manual_seed(5)
    hf = transformers.MarianMTModel(c).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "embed_positions" not in name:
                p.copy_(torch.randn_like(p) * 0.3)
    cfg = config_from_marian(c.to_dict())
    assert cfg.tie_embeddings == tie
    ours = T.Seq2SeqTransformer(cfg)
    ours.load_state_dict(state_dict_from_marian({k: v.numpy() for k, v in hf.state_dict().items()}, cfg))
    src, tgt_in = np.array([[5, 6, 7, 0], [8, 0, 49, 49]]), np.array([[49, 3, 4], [49, 9, 9]])
    with torch.no_grad():
        ref = hf(input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(src != 49),
                 decoder_input_ids=torch.from_numpy(tgt_in)).logits.numpy()
    assert np.abs(ours.forward(src, tgt_in) - ref).max() <= LOGITS_ATOL * np.abs(ref).max()
