"""MarianMT import pieces, each against an independent oracle: SentencePieceTokenizer against
transformers.MarianTokenizer on a MarianMT directory built here, and the weight readers
(hf_weights) against torch.save / torch.load / safetensors, bit for bit."""
import io
import json
import os
import pickle
import pickletools
import shutil
import sys
import warnings
import zipfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
sentencepiece = pytest.importorskip("sentencepiece")
safetensors_torch = pytest.importorskip("safetensors.torch")

from transformer.hf_weights import read_hf_weights, read_pytorch_bin, read_safetensors  # noqa: E402
from transformer.tokenizer import (CharTokenizer, SentencePieceTokenizer, load_tokenizer,  # noqa: E402
                                   marian_tokenizers, tokenizer_from_json)

SENTENCES = [
    "The cat sits on the mat.", "El gato está sentado en la alfombra.",
    "Where is the train station?", "¿Dónde está la estación de tren?",
    "I like green apples.", "Me gustan las manzanas verdes.",
    "She reads a book every night.", "Ella lee un libro cada noche.",
    "We are going to the beach tomorrow!", "¡Mañana vamos a la playa!",
    "The children play in the garden.", "Los niños juegan en el jardín.",
    "My brother's car is red.", "El coche de mi hermano es rojo.",
    "It's raining, isn't it?", "Está lloviendo, ¿verdad?",
    "Open the window, please.", "Abre la ventana, por favor.",
    "The old man walks slowly.", "El anciano camina despacio.",
    "This coffee is too hot.", "Este café está demasiado caliente.",
    "They sing songs in the evening.", "Ellos cantan canciones por la tarde.",
    "Our teacher speaks three languages.", "Nuestra profesora habla tres idiomas.",
    "Do you want some water?", "¿Quieres un poco de agua?",
    "The dog sleeps under the table.", "El perro duerme debajo de la mesa.",
]

# What the comparisons run on: accents, punctuation, a character neither model knows (☃), a
# ligature SentencePiece's NFKC rule rewrites, odd spaces, the empty string, language codes (known,
# unknown, not leading) and special-token strings written in the text.
PROBES = [
    "The cat sits on the mat.", "¿Dónde está la estación de tren?", "¡Mañana vamos a la playa!",
    "It's raining, isn't it?", "a snow ☃ man", "ﬁne ﬂowers", "  spaces   around  ", "",
    ">>es<< The dog sleeps.", ">>es<<", ">>fr<< Le chat", "the >>es<< code is not leading",
    "one </s> two<unk>three<pad>", "Tab\tand\nnewline", "ZZZ qqq",
]
EOS, UNK = 0, 1


def _train(sentences, **options):
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, vocab_size=90, hard_vocab_limit=False,
        character_coverage=1.0, minloglevel=2, **options)
    return model.getvalue()


def _pieces(model_bytes):
    processor = sentencepiece.SentencePieceProcessor(model_proto=model_bytes)
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory):
    """A MarianMT tokenizer directory: two different SentencePiece models, one shared vocab.json
    laid out as OPUS-MT's (</s> 0, <unk> 1, the pieces, a language code, <pad> last). One source
    piece is left out of the vocabulary, so that a known piece maps to <unk> too."""
    directory = tmp_path_factory.mktemp("marian")
    source = _train(SENTENCES, model_type="unigram")
    target = _train(SENTENCES[1::2] + SENTENCES[::2][:5], model_type="bpe")
    vocab = {"</s>": EOS, "<unk>": UNK}
    left_out = _pieces(source)[-1]
    for piece in _pieces(source) + _pieces(target):
        if piece not in vocab and piece not in ("<s>", left_out):
            vocab[piece] = len(vocab)
    vocab[">>es<<"] = len(vocab)
    vocab["<pad>"] = len(vocab)
    (directory / "source.spm").write_bytes(source)
    (directory / "target.spm").write_bytes(target)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    return directory


def _marian_tokenizer(directory):
    from transformers import MarianTokenizer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # "Recommended: pip install sacremoses" (not used to tokenize)
        return MarianTokenizer.from_pretrained(str(directory))


@pytest.fixture(scope="module")
def hf_tokenizer(marian_dir):
    return _marian_tokenizer(marian_dir)


@pytest.fixture(scope="module")
def ours(marian_dir):
    return marian_tokenizers(marian_dir)


# -- SentencePieceTokenizer against MarianTokenizer --------------------------------------------

@pytest.mark.parametrize("text", PROBES)
def test_source_encode_matches_marian_tokenizer(hf_tokenizer, ours, text):
    source, _ = ours
    assert source.encode(text) == hf_tokenizer(text)["input_ids"]


@pytest.mark.parametrize("text", PROBES)
def test_target_encode_matches_marian_tokenizer_less_its_eos(hf_tokenizer, ours, text):
    _, target = ours
    expected = hf_tokenizer(text_target=text)["input_ids"]
    assert expected[-1] == EOS
    assert target.encode(text) == expected[:-1]


def test_the_probes_reach_the_cases_they_are_for(hf_tokenizer, ours, marian_dir):
    source, target = ours
    vocab = json.loads((marian_dir / "vocab.json").read_text(encoding="utf-8"))
    assert source.encode("") == [EOS] and target.encode("") == []
    assert source.encode(">>es<<")[0] == vocab[">>es<<"]
    assert source.encode(">>fr<< Le chat")[0] == UNK                      # code unknown: <unk>
    assert vocab[">>es<<"] not in source.encode("the >>es<< code is not leading")
    assert UNK in source.encode("a snow ☃ man")
    assert source.encode("one </s> two<unk>three<pad>").count(EOS) == 2  # the text's and the end
    assert vocab["<pad>"] in source.encode("one </s> two<unk>three<pad>")
    assert source.encode_batch(PROBES[:3]) == [source.encode(t) for t in PROBES[:3]]


def test_training_sentences_encode_as_marian_tokenizer_does(hf_tokenizer, ours):
    """One source piece is missing from vocab.json: where SentencePiece produces it, <unk>."""
    source, target = ours
    expected = [hf_tokenizer(t)["input_ids"] for t in SENTENCES]
    assert source.encode_batch(SENTENCES) == expected
    assert any(UNK in ids for ids in expected)
    assert target.encode_batch(SENTENCES) == [hf_tokenizer(text_target=t)["input_ids"][:-1] for t in SENTENCES]


@pytest.mark.parametrize("text", PROBES)
def test_decode_matches_marian_tokenizer_skipping_special_tokens(hf_tokenizer, ours, text):
    for side, ids in zip(ours, (hf_tokenizer(text)["input_ids"], hf_tokenizer(text_target=text)["input_ids"])):
        assert side.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True)


def test_decode_of_every_id_matches_marian_tokenizer(hf_tokenizer, ours):
    source, target = ours
    every = list(range(source.vocab_size))
    for ids in [every, every[::-1], *([i] for i in every)]:
        expected = hf_tokenizer.decode(ids, skip_special_tokens=True)
        assert source.decode(ids) == expected
        assert target.decode(np.array(ids)) == expected


def test_unk_eos_and_pad_are_skipped_when_decoding(ours, marian_dir):
    source, _ = ours
    vocab = json.loads((marian_dir / "vocab.json").read_text(encoding="utf-8"))
    ids = source.encode("The cat.")
    assert source.decode([UNK, vocab["<pad>"]] + ids + [UNK, EOS]) == source.decode(ids) == "The cat."


def test_clean_up_tokenization_spaces_follows_tokenizer_config(marian_dir, tmp_path):
    for name in ("source.spm", "target.spm", "vocab.json"):
        shutil.copy(marian_dir / name, tmp_path / name)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"clean_up_tokenization_spaces": True}))
    hf = _marian_tokenizer(tmp_path)
    source, target = marian_tokenizers(tmp_path)
    assert source.clean_up_tokenization_spaces
    text = "It 's raining , is n't it ? Yes !"
    ids = hf(text)["input_ids"]
    assert source.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    assert " ," not in source.decode(ids)


def test_vocab_and_model_bytes_are_what_the_directory_holds(ours, marian_dir):
    source, target = ours
    vocab = json.loads((marian_dir / "vocab.json").read_text(encoding="utf-8"))
    assert source.vocab == vocab and target.vocab == vocab
    assert source.vocab_size == target.vocab_size == max(vocab.values()) + 1
    assert source.model_bytes == (marian_dir / "source.spm").read_bytes()
    assert target.model_bytes == (marian_dir / "target.spm").read_bytes()
    source.vocab["</s>"] = 99                                         # a copy: ours is untouched
    assert source.vocab["</s>"] == EOS
    with pytest.raises(AttributeError):
        source.vocab = {}
    assert (source.append_eos, target.append_eos) == (True, False)
    assert source.tokens([EOS, UNK, -1, 10 ** 9]) == ["</s>", "<unk>", "?", "?"]


def test_json_round_trip_and_save_load(ours, tmp_path):
    for side in ours:
        text = side.to_json()
        assert json.loads(text)["type"] == "sentencepiece"
        again = tokenizer_from_json(text)
        assert isinstance(again, SentencePieceTokenizer) and again.to_json() == text
        assert [again.encode(t) for t in PROBES] == [side.encode(t) for t in PROBES]
        path = tmp_path / "tok.json"
        side.save(path)
        loaded = SentencePieceTokenizer.load(path)
        assert loaded.to_json() == text and load_tokenizer(path).to_json() == text
        assert SentencePieceTokenizer.from_json(text).append_eos == side.append_eos
    CharTokenizer("ab").save(tmp_path / "chars.json")
    with pytest.raises(ValueError, match="chars.json"):
        SentencePieceTokenizer.load(tmp_path / "chars.json")


def test_damaged_json_and_model_blobs_are_value_errors_naming_the_source(ours):
    source, _ = ours
    data = json.loads(source.to_json())
    broken = dict(data, model=data["model"][: len(data["model"]) // 2])
    with pytest.raises(ValueError, match="tok.json"):
        tokenizer_from_json(json.dumps(broken), source="tok.json")
    with pytest.raises(ValueError, match="tok.json"):
        tokenizer_from_json(json.dumps(dict(data, model="not base64!")), source="tok.json")
    with pytest.raises(ValueError, match="tok.json"):
        tokenizer_from_json(json.dumps(dict(data, eos_id="0")), source="tok.json")
    with pytest.raises(ValueError, match="append_eos"):
        SentencePieceTokenizer.from_json(json.dumps({k: v for k, v in data.items() if k != "append_eos"}))
    blob, vocab = source.model_bytes, source.vocab
    for damaged in (blob[: len(blob) // 2], b"", b"not a model at all", bytes(range(256)) * 4):
        with pytest.raises(ValueError, match="model_bytes"):
            SentencePieceTokenizer(damaged, vocab, EOS, UNK, vocab["<pad>"], True)


def test_bad_arguments_name_the_argument(ours):
    source, _ = ours
    blob, vocab = source.model_bytes, source.vocab
    pad = vocab["<pad>"]
    cases = [
        (TypeError, "model_bytes", lambda: SentencePieceTokenizer("text", vocab, EOS, UNK, pad, True)),
        (TypeError, "vocab", lambda: SentencePieceTokenizer(blob, list(vocab), EOS, UNK, pad, True)),
        (ValueError, "vocab", lambda: SentencePieceTokenizer(blob, {}, EOS, UNK, pad, True)),
        (ValueError, "vocab", lambda: SentencePieceTokenizer(blob, dict(vocab, extra=EOS), EOS, UNK, pad, True)),
        (ValueError, "vocab", lambda: SentencePieceTokenizer(blob, dict(vocab, extra=-1), EOS, UNK, pad, True)),
        (TypeError, "vocab", lambda: SentencePieceTokenizer(blob, dict(vocab, extra=1.5), EOS, UNK, pad, True)),
        (TypeError, "eos_id", lambda: SentencePieceTokenizer(blob, vocab, True, UNK, pad, True)),
        (ValueError, "eos_id", lambda: SentencePieceTokenizer(blob, vocab, 10 ** 6, UNK, pad, True)),
        (ValueError, "unk_id", lambda: SentencePieceTokenizer(blob, vocab, EOS, -1, pad, True)),
        (TypeError, "pad_id", lambda: SentencePieceTokenizer(blob, vocab, EOS, UNK, "2", True)),
        (TypeError, "append_eos", lambda: SentencePieceTokenizer(blob, vocab, EOS, UNK, pad, 1)),
        (TypeError, "text", lambda: source.encode(b"bytes")),
        (ValueError, "text", lambda: source.encode("\ud800 lone surrogate")),
        (TypeError, "texts", lambda: source.encode_batch("one string")),
        (TypeError, "ids", lambda: source.decode("1 2")),
        (TypeError, "ids", lambda: source.decode([1.0])),
        (ValueError, "ids", lambda: source.decode([source.vocab_size])),
        (ValueError, "ids", lambda: source.decode([-1])),
        (TypeError, "hf_dir", lambda: marian_tokenizers(3)),
    ]
    for error, name, call in cases:
        with pytest.raises(error, match=name):
            call()
    holes = {piece: i * 2 for i, piece in enumerate(vocab)}    # ids with gaps: size is max + 1
    gappy = SentencePieceTokenizer(blob, holes, holes["</s>"], holes["<unk>"], holes["<pad>"], False)
    assert gappy.vocab_size == max(holes.values()) + 1
    with pytest.raises(ValueError, match="ids"):
        gappy.decode([1])


def test_marian_directory_problems_name_the_file(marian_dir, tmp_path):
    for name in ("source.spm", "target.spm", "vocab.json"):
        shutil.copy(marian_dir / name, tmp_path / name)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        marian_tokenizers(tmp_path / "nowhere")
    (tmp_path / "target.spm").unlink()
    with pytest.raises(FileNotFoundError, match="target.spm"):
        marian_tokenizers(tmp_path)
    (tmp_path / "target.spm").write_bytes((marian_dir / "target.spm").read_bytes()[:1000])
    with pytest.raises(ValueError, match="target.spm"):
        marian_tokenizers(tmp_path)
    shutil.copy(marian_dir / "target.spm", tmp_path / "target.spm")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"separate_vocabs": True}))
    with pytest.raises(ValueError, match="separate_vocabs.*not supported"):
        marian_tokenizers(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))
    with pytest.raises(ValueError, match="vocab.json.*<eos>"):
        marian_tokenizers(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{broken")
    with pytest.raises(ValueError, match="tokenizer_config.json"):
        marian_tokenizers(tmp_path)
    (tmp_path / "tokenizer_config.json").unlink()
    (tmp_path / "vocab.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="vocab.json"):
        marian_tokenizers(tmp_path)


def test_missing_sentencepiece_says_how_to_install_it(ours, monkeypatch):
    source, _ = ours
    monkeypatch.setitem(sys.modules, "sentencepiece", None)     # `import sentencepiece` fails
    with pytest.raises(ImportError, match="pip install sentencepiece"):
        SentencePieceTokenizer(source.model_bytes, source.vocab, EOS, UNK, source.pad_id, True)


# -- weight readers against torch and safetensors ----------------------------------------------

def _state_dict():
    """fp32/fp16/bf16 tensors, non-contiguous views, tensors sharing one storage, a Parameter,
    a scalar and an empty tensor; bf16 with infinities, NaN and subnormals (bits must survive)."""
    generator = torch.Generator().manual_seed(0)
    base = torch.randn(6, 7, generator=generator)
    half = torch.randn(5, 4, generator=generator).half()
    special = torch.tensor([float("inf"), -float("inf"), float("nan"), 1e-40, -0.0, 3.0e38, 1.5])
    bf16 = torch.cat([torch.randn(13, generator=generator), special]).bfloat16().reshape(4, 5)
    return {
        "base": base,
        "transposed_slice": base.t()[2:5, 1:],              # shares base's storage, offset, strides
        "row": base[3],
        "every_other": base[::2, ::3],
        "half": half,
        "half_transposed": half.t(),
        "bf16": bf16,
        "bf16_transposed_slice": bf16.t()[1:],
        "param": torch.nn.Parameter(torch.randn(3, generator=generator)),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
    }


def _bits(array):
    return np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)


def _assert_bitwise_equal(ours, expected):
    assert list(ours) == list(expected)
    for name, tensor in expected.items():
        want = tensor.detach().float().numpy()
        got = ours[name]
        assert got.dtype == np.float32 and got.flags.c_contiguous and got.shape == want.shape, name
        assert np.array_equal(_bits(got), _bits(want)), (name, np.max(np.abs(got - want)))


def test_torch_zip_file_reads_bit_for_bit(tmp_path):
    state = _state_dict()
    path = tmp_path / "pytorch_model.bin"
    torch.save(state, path)
    ours = read_pytorch_bin(path)
    _assert_bitwise_equal(ours, state)
    _assert_bitwise_equal(ours, torch.load(path, weights_only=True))   # and as torch reads it
    _assert_bitwise_equal(read_hf_weights(tmp_path), state)
    assert ours["base"].flags.writeable and not np.shares_memory(ours["base"], ours["transposed_slice"])


def test_torch_zip_file_with_another_top_folder_and_big_endian_data(tmp_path):
    """torch names the top folder after the file; byteorder "big" means byte-swapped storages
    (rewritten here from a little-endian save; torch.load reads the rewrite as the oracle)."""
    state = {"a": torch.randn(3, 4), "b": torch.randn(5).t(), "c": torch.randn(4, 2)[1:, 1]}
    torch.save(state, tmp_path / "little.bin")
    big = tmp_path / "big.bin"
    with zipfile.ZipFile(tmp_path / "little.bin") as src, zipfile.ZipFile(big, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            top, rest = info.filename.split("/", 1)
            if rest == "byteorder":
                data = b"big"
            elif rest.startswith("data/"):
                data = np.frombuffer(data, "<f4").astype(">f4").tobytes()
            dst.writestr("renamed/" + rest, data)
    expected = torch.load(big, weights_only=True)
    assert torch.equal(expected["a"], state["a"])
    _assert_bitwise_equal(read_pytorch_bin(big), expected)


def test_safetensors_file_reads_bit_for_bit(tmp_path):
    state = {name: t.detach().contiguous().clone() for name, t in _state_dict().items()}
    safetensors_torch.save_file(state, str(tmp_path / "model.safetensors"))
    ours = read_hf_weights(tmp_path)
    assert set(ours) == set(state)
    _assert_bitwise_equal({name: ours[name] for name in state}, state)


def test_unsupported_dtypes_name_the_tensor(tmp_path):
    tensors = {"weight": torch.ones(2), "position_ids": torch.arange(4)}
    safetensors_torch.save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="position_ids"):
        read_safetensors(tmp_path / "model.safetensors")
    torch.save(tensors, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="position_ids.*LongStorage"):
        read_pytorch_bin(tmp_path / "pytorch_model.bin")


def test_truncated_and_damaged_files_are_value_errors_naming_the_file(tmp_path):
    state = {name: t.detach().contiguous().clone() for name, t in _state_dict().items()}
    safetensors_torch.save_file(state, str(tmp_path / "full.safetensors"))
    torch.save(state, tmp_path / "full.bin")
    blobs = {"safetensors": (tmp_path / "full.safetensors").read_bytes(),
             "bin": (tmp_path / "full.bin").read_bytes()}
    for kind, blob in blobs.items():
        reader = read_safetensors if kind == "safetensors" else read_pytorch_bin
        for cut in (3, 12, len(blob) // 2, len(blob) - 4):
            path = tmp_path / f"cut{cut}.{kind}"
            path.write_bytes(blob[:cut])
            with pytest.raises(ValueError, match=f"cut{cut}"):
                reader(path)
    flipped = bytearray(blobs["bin"])
    flipped[flipped.index(state["base"].numpy().tobytes()) + 5] ^= 0xFF   # inside a storage's bytes
    (tmp_path / "flipped.bin").write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match="flipped.bin"):           # the zip's CRC catches it
        read_pytorch_bin(tmp_path / "flipped.bin")


def test_legacy_torch_format_is_refused_with_advice(tmp_path):
    torch.save({"w": torch.ones(2)}, tmp_path / "legacy.bin", _use_new_zipfile_serialization=False)
    with pytest.raises(ValueError, match="legacy.*re-save"):
        read_pytorch_bin(tmp_path / "legacy.bin")


def test_missing_weights_name_the_directory_and_both_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}.*model.safetensors.*pytorch_model.bin"):
        read_hf_weights(tmp_path)
    with pytest.raises(TypeError, match="directory"):
        read_hf_weights(None)


def _torch_zip(path, pickled):
    """A zip laid out as torch.save lays it out, around the given data.pkl."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickled)
        archive.writestr("archive/byteorder", b"little")
        archive.writestr("archive/version", b"3\n")


def _call_global(module, name, argument, protocol=2):
    """A pickle of {"weight": module.name(argument)}: the call runs at unpickling time."""
    text = argument.encode()
    if protocol >= 4:
        push = (b"\x8c" + bytes([len(module)]) + module.encode() + b"\x8c" + bytes([len(name)])
                + name.encode() + b"\x93")                                   # STACK_GLOBAL
    else:
        push = b"c" + module.encode() + b"\n" + name.encode() + b"\n"        # GLOBAL
    body = (b"}" + b"X\x06\x00\x00\x00weight" + push + b"X" + len(text).to_bytes(4, "little") + text
            + b"\x85R" + b"s.")                                              # TUPLE1 REDUCE SETITEM STOP
    return bytes([0x80, protocol]) + body


@pytest.mark.parametrize("module, name, protocol", [
    ("os", "system", 2), ("posix", "system", 2), ("os", "system", 4), ("subprocess", "getoutput", 2)])
def test_a_pickle_calling_os_system_is_refused_and_never_runs(tmp_path, module, name, protocol):
    marker = tmp_path / "pwned"
    payload = _call_global(module, name, f"touch {marker}", protocol)
    globals_named = [arg for op, arg, _ in pickletools.genops(payload) if op.name == "GLOBAL"]
    assert protocol >= 4 or globals_named == [f"{module} {name}"]
    _torch_zip(tmp_path / "pytorch_model.bin", payload)
    with pytest.raises(ValueError, match=rf"{module}\.{name}"):
        read_hf_weights(tmp_path)
    assert not marker.exists()


def test_the_malicious_payload_is_live_for_a_plain_unpickler(tmp_path):
    """The refusal above is no accident of a broken payload: plain pickle runs it."""
    marker = tmp_path / "ran"
    pickle.loads(_call_global("os", "system", f"touch {marker}"))
    assert marker.exists()


def test_a_pickle_cannot_rewrite_the_storage_stand_ins(tmp_path):
    """BUILD on torch.FloatStorage's stand-in (shared by every load) is refused, and later loads
    still read float32."""
    payload = (b"\x80\x02}X\x01\x00\x00\x00x" + b"ctorch\nFloatStorage\n"
               + b"}X\x05\x00\x00\x00dtypeNsb" + b"s.")                      # {"dtype": None}, BUILD
    _torch_zip(tmp_path / "attack.bin", payload)
    with pytest.raises(ValueError, match="attack.bin"):
        read_pytorch_bin(tmp_path / "attack.bin")
    torch.save({"w": torch.ones(2)}, tmp_path / "after.bin")
    assert read_pytorch_bin(tmp_path / "after.bin")["w"].tolist() == [1.0, 1.0]


def test_marian_model_weights_read_back_equal_to_its_state_dict(tmp_path):
    from transformers import MarianConfig, MarianMTModel
    config = MarianConfig(vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1,
                          encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                          decoder_ffn_dim=32, max_position_embeddings=32, pad_token_id=63,
                          decoder_start_token_id=63, eos_token_id=0)
    model = MarianMTModel(config)
    state = model.state_dict()
    layouts = {"single": {}, "sharded": {"max_shard_size": "20KB"}}
    for layout, options in layouts.items():
        model.save_pretrained(tmp_path / layout, safe_serialization=True, **options)
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    os.makedirs(tmp_path / "bin")
    torch.save(state, tmp_path / "bin" / "pytorch_model.bin")       # what older transformers wrote
    for layout in ("single", "sharded", "bin"):
        ours = read_hf_weights(tmp_path / layout)
        assert ours and set(ours) <= set(state), layout
        assert "model.shared.weight" in ours or "model.encoder.embed_tokens.weight" in ours
        _assert_bitwise_equal(ours, {name: state[name] for name in ours})
