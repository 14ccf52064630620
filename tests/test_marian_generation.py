"""An imported MarianMT model decodes as `transformers`' generate() does with the model's own
generation settings (generation_config.json, else config.json), and with settings given per call.

The oracle is MarianMTModel.generate on small random models built here (test_marian's fixture)
whose generation_config.json carries OPUS-MT's settings: num_beams, max_length, forced EOS, the
pad token banned, renormalize_logits. Outputs are compared token for token. A bias on EOS's
logit makes sentences end early, at random, or never (then they stop at the length limit, where
the forced EOS applies).
"""
import json
import os
import re
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

import transformer as T  # noqa: E402
from transformer import decoding as dec  # noqa: E402
from transformer.marian import export_marian, import_marian  # noqa: E402
from test_marian import SENTENCES, _cli, _marian_dir  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")

MAX_LENGTH = 14          # generate's max_length: the start token and 13 new tokens
TEXTS = SENTENCES[:6] + ["thank you", "la casa", "good morning, how are you?"]


def _opus_settings(pad, renormalize):
    """What an OPUS-MT generation_config.json holds (max_length shortened for speed)."""
    return {"bad_words_ids": [[pad]], "bos_token_id": 0, "decoder_start_token_id": pad, "eos_token_id": 0,
            "forced_eos_token_id": 0, "max_length": MAX_LENGTH, "num_beams": 4, "pad_token_id": pad,
            "renormalize_logits": renormalize, "transformers_version": "4.27.0.dev0"}


def _opus_dir(root, renormalize=True, seed=0):
    _marian_dir(root, seed=seed)
    pad = json.load(open(os.path.join(root, "config.json")))["pad_token_id"]
    with open(os.path.join(root, "generation_config.json"), "w") as f:
        json.dump(_opus_settings(pad, renormalize), f)
    return root


@pytest.fixture(scope="module", params=[True, False], ids=["renormalize", "plain"])
def opus(request, tmp_path_factory):
    root = _opus_dir(str(tmp_path_factory.mktemp("opus") / "hf"), renormalize=request.param)
    hf = transformers.MarianMTModel.from_pretrained(root).eval()
    tok = transformers.MarianTokenizer.from_pretrained(root)
    ours, _, _ = import_marian(root)
    return dict(dir=root, hf=hf, tok=tok, ours=ours, renormalize=request.param)


def _source(m, texts=TEXTS):
    enc = m["tok"](texts, return_tensors="np", padding=True)
    return enc["input_ids"].astype(np.int64), enc["attention_mask"]


def _generate(m, src, mask, **overrides):
    """generate() with the model's own settings and `overrides`; the tokens after the start
    token, cut at EOS (EOS and the padding after it dropped)."""
    eos, pad = m["ours"].cfg.eos_id, m["ours"].cfg.pad_id
    with torch.no_grad():
        out = m["hf"].generate(input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(mask),
                               **overrides).numpy()
    hyps = []
    for row in out[:, 1:].tolist():
        row = row[:row.index(eos)] if eos in row else row
        assert pad not in row
        hyps.append(row)
    return hyps


class _eos_bias:
    """Adds `bias` to EOS's logit in both models for the duration of a with-block."""

    def __init__(self, m, bias):
        self.m, self.bias = m, bias

    def _add(self, sign):
        eos = self.m["ours"].cfg.eos_id
        with torch.no_grad():
            self.m["hf"].final_logits_bias[0, eos] += sign * self.bias
        self.m["ours"].params.data["generator.bias"][eos] += sign * self.bias

    def __enter__(self):
        self._add(1)

    def __exit__(self, *exc):
        self._add(-1)


def test_the_settings_are_read_as_transformers_reads_them(opus):
    settings = opus["ours"].generation
    assert settings.num_beams == opus["hf"].generation_config.num_beams == 4
    assert settings.max_new_tokens(opus["ours"].cfg.max_len) == MAX_LENGTH - 1
    assert settings.forced_eos and settings.banned == (opus["ours"].cfg.pad_id,)
    assert settings.renormalize == opus["renormalize"] == opus["hf"].generation_config.renormalize_logits
    assert (settings.length_penalty, settings.early_stopping) == (1.0, False)     # generate's defaults
    assert all("generation_config.json" in line or "default" in line
               for line in settings.describe(opus["ours"].cfg.max_len))


@pytest.mark.parametrize("eos_bias", [-30.0, 0.0, 3.0], ids=["never-ends", "random", "ends-early"])
def test_greedy_and_beam_equal_generate_with_the_models_own_settings(opus, eos_bias):
    src, mask = _source(opus)
    with _eos_bias(opus, eos_bias):
        want_beam = _generate(opus, src, mask)                       # num_beams=4 from the settings
        want_greedy = _generate(opus, src, mask, num_beams=1)
        got_beam = opus["ours"].beam_search(src)
        got_greedy = opus["ours"].greedy_decode(src)
    assert got_greedy == want_greedy
    assert got_beam == want_beam
    if eos_bias < 0:   # the limit: MAX_LENGTH - 2 tokens, then the forced EOS
        assert {len(h) for h in got_greedy + got_beam} == {MAX_LENGTH - 2}


@pytest.mark.parametrize("eos_bias", [-30.0, 0.0, 3.0], ids=["never-ends", "random", "ends-early"])
@pytest.mark.parametrize("ours, theirs", [
    (dict(beam_size=2, max_len=7), dict(num_beams=2, max_new_tokens=7)),
    (dict(beam_size=4, length_penalty=0.0, early_stopping=True), dict(num_beams=4, length_penalty=0.0,
                                                                       early_stopping=True)),
    (dict(beam_size=3, length_penalty=2.0, early_stopping="never", max_len=9),
     dict(num_beams=3, length_penalty=2.0, early_stopping="never", max_new_tokens=9)),
    (dict(beam_size=4, renormalize=False, forced_eos=False), dict(num_beams=4, renormalize_logits=False,
                                                                  forced_eos_token_id=None)),
    (dict(beam_size=4, renormalize=True, length_penalty=-0.5), dict(num_beams=4, renormalize_logits=True,
                                                                    length_penalty=-0.5)),
], ids=["beam2-len7", "early-stopping", "never-lp2", "no-renormalize-no-forced-eos", "renormalize-lp-neg"])
def test_beam_with_arguments_equals_generate_with_the_same_kwargs(opus, eos_bias, ours, theirs):
    src, mask = _source(opus)
    with _eos_bias(opus, eos_bias):
        assert opus["ours"].beam_search(src, **ours) == _generate(opus, src, mask, **theirs)


@pytest.mark.parametrize("eos_bias", [-30.0, 0.0], ids=["never-ends", "random"])
def test_greedy_with_arguments_equals_generate_with_the_same_kwargs(opus, eos_bias):
    src, mask = _source(opus)
    with _eos_bias(opus, eos_bias):
        assert opus["ours"].greedy_decode(src, max_len=5) == _generate(opus, src, mask, num_beams=1,
                                                                       max_new_tokens=5)
        assert opus["ours"].greedy_decode(src, max_len=6, forced_eos=False) == _generate(
            opus, src, mask, num_beams=1, max_new_tokens=6, forced_eos_token_id=None)


@pytest.mark.parametrize("early_stopping", [True, False, "never"])
def test_the_loops_in_c_equal_the_python_reference_with_the_rules_on(opus, monkeypatch, early_stopping):
    src, _ = _source(opus)
    options = dict(length_penalty=1.5, early_stopping=early_stopping, max_len=10)
    with _eos_bias(opus, 1.0):
        native = (opus["ours"].greedy_decode(src), opus["ours"].beam_search(src, **options))
        monkeypatch.setattr(dec, "_PYTHON_LOOPS", True)
        python = (opus["ours"].greedy_decode(src), opus["ours"].beam_search(src, **options))
        attention = opus["ours"].greedy_decode(src, return_attention=True)[0]   # the step in Python too
    assert native == python and attention == native[0]


def test_the_settings_travel_with_the_model_directory_and_back_out(opus, tmp_path):
    ours, src_tok, tgt_tok = import_marian(opus["dir"], tmp_path / "ours")
    loaded = T.Seq2SeqTransformer.load(tmp_path / "ours")
    assert loaded.generation == ours.generation and loaded.generation.origin == ours.generation.origin
    out = str(tmp_path / "exported")
    export_marian(loaded, src_tok, tgt_tok, out)
    theirs = transformers.GenerationConfig.from_pretrained(out).to_dict()
    original = transformers.GenerationConfig.from_pretrained(opus["dir"]).to_dict()
    for field in ("num_beams", "max_length", "forced_eos_token_id", "bad_words_ids", "renormalize_logits",
                  "eos_token_id", "pad_token_id", "decoder_start_token_id", "length_penalty", "early_stopping"):
        assert theirs[field] == original[field], field
    assert json.load(open(os.path.join(out, "config.json")))["num_beams"] == 4   # config.json agrees
    assert import_marian(out)[0].generation == ours.generation
    hf = transformers.MarianMTModel.from_pretrained(out).eval()
    src, mask = _source(opus)
    with torch.no_grad():
        again = hf.generate(input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(mask))
        first = opus["hf"].generate(input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(mask))
    assert torch.equal(again, first)


def test_a_model_trained_here_has_no_settings_and_keeps_its_defaults(tmp_path):
    model = T.Seq2SeqTransformer(T.ModelConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=16, n_heads=2,
                                               d_ff=32, n_encoder_layers=1, n_decoder_layers=1))
    model.save(tmp_path / "m")
    assert model.generation is None and not os.path.exists(tmp_path / "m" / "generation.json")
    src = np.array([[3, 4, 5, 6], [7, 8, 9, 0]])
    assert model.beam_search(src) == model.beam_search(src, beam_size=4, length_penalty=0.6, early_stopping=True,
                                                       renormalize=False, forced_eos=False)


def _with_generation_config(tmp_path, opus, **changes):
    root = tmp_path / "hf"
    shutil.copytree(opus["dir"], root)
    path = root / "generation_config.json"
    raw = json.loads(path.read_text())
    raw.update(changes)
    path.write_text(json.dumps(raw))
    return str(root)


@pytest.mark.parametrize("changes, named", [
    (dict(do_sample=True), "do_sample"),
    (dict(bad_words_ids=[[5, 6]]), "bad_words_ids entry [5, 6]"),
    (dict(repetition_penalty=1.2), "repetition_penalty"),
    (dict(no_repeat_ngram_size=3), "no_repeat_ngram_size"),
    (dict(min_length=5), "min_length"),
    (dict(num_return_sequences=2), "num_return_sequences"),
    (dict(forced_bos_token_id=3), "forced_bos_token_id"),
    (dict(eos_token_id=[0, 5]), "eos_token_id"),
    (dict(some_future_option=1), "some_future_option"),
])
def test_a_setting_this_engine_does_not_implement_is_refused_naming_it(opus, tmp_path, changes, named):
    root = _with_generation_config(tmp_path, opus, **changes)
    with pytest.raises(ValueError, match=re.escape(f"generation_config.json: generation setting {named}")):
        import_marian(root)
    r = _cli("convert", "--from", "marian", root, "--out", str(tmp_path / "out"))
    assert r.returncode == 1 and "Traceback" not in r.stderr and named in r.stderr, r.stderr


def test_harmless_settings_that_opus_mt_files_carry_are_accepted(opus, tmp_path):
    root = _with_generation_config(tmp_path, opus, temperature=0.7, top_k=50, top_p=1.0, do_sample=False,
                                   output_scores=False, use_cache=True, min_length=0, no_repeat_ngram_size=0,
                                   num_return_sequences=1, bad_words_ids=[[0], [opus["ours"].cfg.pad_id]])
    settings = import_marian(root)[0].generation
    assert settings.banned == (opus["ours"].cfg.pad_id,)     # [[eos]] dropped, as generate drops it


def test_without_generation_config_json_the_settings_come_from_config_json(opus, tmp_path):
    root = tmp_path / "hf"
    shutil.copytree(opus["dir"], root)
    os.remove(root / "generation_config.json")
    cfg = json.loads((root / "config.json").read_text())
    cfg.update(num_beams=3, max_length=9, forced_eos_token_id=0)
    (root / "config.json").write_text(json.dumps(cfg))
    settings = import_marian(str(root))[0].generation
    assert (settings.num_beams, settings.max_new_tokens(64), settings.forced_eos) == (3, 8, True)
    assert set(settings.origin.values()) == {"config.json"}
    hf = transformers.MarianMTModel.from_pretrained(str(root))
    assert (hf.generation_config.num_beams, hf.generation_config.max_length) == (3, 9)
    # with generation_config.json present, transformers reads it alone: config.json's num_beams
    # does not count, and neither does it here
    (root / "generation_config.json").write_text(json.dumps({"max_length": 9, "eos_token_id": 0}))
    assert import_marian(str(root))[0].generation.num_beams == 1
    assert transformers.MarianMTModel.from_pretrained(str(root)).generation_config.num_beams in (None, 1)


def test_translate_uses_the_models_settings_says_so_and_a_flag_wins(opus, tmp_path):
    out = str(tmp_path / "ours")
    assert _cli("convert", "--from", "marian", opus["dir"], "--out", out).returncode == 0
    texts = ["the dog runs in the garden", "thank you very much!"]
    src, mask = _source(opus, texts)
    with _eos_bias(opus, 0.0):
        beam = [opus["tok"].decode(h, skip_special_tokens=True) for h in _generate(opus, src, mask)]
        greedy = [opus["tok"].decode(h, skip_special_tokens=True)
                  for h in _generate(opus, src, mask, num_beams=1, max_new_tokens=6)]
    r = _cli("translate", "--model", out, *texts)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [t for t in beam]
    assert "num_beams=4 (generation_config.json)" in r.stderr and "forced_eos_token_id=0" in r.stderr, r.stderr
    r = _cli("translate", "--model", out, "--beam", "1", "--max-len", "6", *texts)
    assert r.returncode == 0 and r.stdout.splitlines() == greedy, r.stderr
    assert "given: --beam 1, --max-len 6" in r.stderr, r.stderr
    r = _cli("info", "--model", out)
    assert r.returncode == 0, r.stderr
    assert any("num_beams=4" in line for line in json.loads(r.stdout)["model"]["generation_settings"])


def test_serve_answers_an_imported_model_as_generate_does_with_its_own_settings(opus, tmp_path):
    """`transformer serve` decodes with translate's defaults, so an imported model's own settings
    (num_beams, max_length, forced EOS, the banned pad) hold there too: every answer equals generate's."""
    pytest.importorskip("aiohttp")
    from test_serve import Running, post

    out = str(tmp_path / "ours")
    assert _cli("convert", "--from", "marian", opus["dir"], "--out", out).returncode == 0
    texts = ["the dog runs in the garden", "thank you very much!", "la casa"]
    src, mask = _source(opus, texts)
    with _eos_bias(opus, 0.0):
        want = [opus["tok"].decode(h, skip_special_tokens=True) for h in _generate(opus, src, mask)]
    server = Running("--model", f"en-de={out}")
    try:
        assert any("num_beams=4 (generation_config.json)" in line for line in server.banner), server.banner
        status, body, _ = post(server.url, "/translate", {"q": texts, "source": "en", "target": "de"})
    finally:
        server.stop()
    assert status == 200 and body["translatedText"] == want


def test_an_imported_models_languages_come_from_its_directory_and_go_back_out(opus, tmp_path):
    """MarianTokenizer's source_lang / target_lang (tokenizer_config.json), else the OPUS-MT name
    the config was saved from: convert writes them to languages.json, serve answers for them, and
    an export writes them back."""
    from transformer.checkpoint import load_for_inference, read_languages
    from transformer.marian import marian_languages
    from transformer.serve import load_models

    root = tmp_path / "hf"
    shutil.copytree(opus["dir"], root)
    config = json.load(open(root / "config.json"))
    assert marian_languages(str(root), {**config, "_name_or_path": "Helsinki-NLP/opus-mt-en-de"}) == ("en", "de")
    assert marian_languages(str(root), {**config, "_name_or_path": "my-model"}) is None
    tokenizer_config = root / "tokenizer_config.json"
    settings = json.load(open(tokenizer_config)) if tokenizer_config.exists() else {}
    tokenizer_config.write_text(json.dumps({**settings, "source_lang": "eng", "target_lang": "deu"}))
    out = str(tmp_path / "ours")
    r = _cli("convert", "--from", "marian", str(root), "--out", out)
    assert r.returncode == 0 and "languages en -> de" in r.stderr, r.stderr     # normalised (languages.py)
    assert read_languages(out) == ("en", "de")
    served = load_models([out], load=load_for_inference)
    assert list(served) == ["en-de"] and (served["en-de"].source, served["en-de"].target) == ("en", "de")
    back = tmp_path / "back"
    assert _cli("convert", "--to", "marian", out, "--out", str(back)).returncode == 0
    exported = json.load(open(back / "tokenizer_config.json"))
    assert (exported["source_lang"], exported["target_lang"]) == ("en", "de")
