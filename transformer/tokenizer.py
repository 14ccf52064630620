"""Subword vocabulary: byte-pair encoding (section 5.1 of the paper used BPE for
English-German) learned with the `tokenizers` library on the training split only.

Ids 0-3 are reserved: <pad>=0, <s>=1 (BOS), </s>=2 (EOS), <unk>=3, matching
ModelConfig's defaults (pad_id=0, bos_id=1, eos_id=2).

SentencePieceTokenizer is the other kind: one side of a Hugging Face MarianMT (OPUS-MT) model,
whose ids are fixed by the imported weights; marian_tokenizers(directory) builds both sides.
"""
import base64
import binascii
import json
import os
import re

import numpy as np

from .serialization import atomic_write_bytes, path_argument

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
MAX_VOCAB_SIZE = 1 << 20   # far above any real BPE vocabulary; the trainer allocates per entry


def _text(text, name="text"):
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str, got {type(text).__name__}")
    return text


def _texts(texts, name="texts"):
    """A list of str from an iterable of str (one str alone is refused: it is not a list of texts)."""
    if isinstance(texts, (str, bytes)):
        raise TypeError(f"{name} must be an iterable of str, not a single {type(texts).__name__}")
    try:
        texts = list(texts)
    except TypeError:
        raise TypeError(f"{name} must be an iterable of str, got {type(texts).__name__}") from None
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(text).__name__}")
    return texts


def _ids(ids, vocab_size, name="ids"):
    """Token ids as Python ints, keeping only those in [0, vocab_size): decoding never fails on an
    id the vocabulary does not have (a model's output layer may be larger than its tokenizer)."""
    return [i for i in _int_list(ids, name) if 0 <= i < vocab_size]


def _int_list(ids, name="ids"):
    """A sequence of ints (Python or numpy) as a list of Python ints, or TypeError naming it."""
    if isinstance(ids, (str, bytes)):
        raise TypeError(f"{name} must be a sequence of ints, got {type(ids).__name__}")
    try:
        items = list(ids.tolist() if isinstance(ids, np.ndarray) else ids)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of ints, got {type(ids).__name__}") from None
    for i in items:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"{name} must hold ints, got {type(i).__name__}")
    return [int(i) for i in items]


def _count(value, name, minimum, maximum=None):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {bounds}, got {value}")
    return int(value)


class SubwordTokenizer:
    """A BPE vocabulary for one language; encode/decode text <-> ids."""

    def __init__(self, tokenizer):
        self._tok = tokenizer
        for token_id, token in enumerate(SPECIAL_TOKENS):
            if tokenizer.token_to_id(token) != token_id:
                raise ValueError(f"tokenizer must map {token!r} to id {token_id}")
        # Text is text: a sentence that spells "</s>" must not become the end-of-sentence id.
        tokenizer.encode_special_tokens = True

    @classmethod
    def train(cls, texts, vocab_size=8000, min_frequency=2):
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

        texts = _texts(texts)
        vocab_size = _count(vocab_size, "vocab_size", len(SPECIAL_TOKENS) + 1, MAX_VOCAB_SIZE)
        min_frequency = _count(min_frequency, "min_frequency", 0)
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.normalizer = normalizers.NFKC()
        # Metaspace marks word starts, so decoding restores the spaces exactly.
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                      special_tokens=list(SPECIAL_TOKENS), show_progress=False)
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @property
    def vocab_size(self):
        return self._tok.get_vocab_size()

    def encode(self, text):
        return self._tok.encode(_text(text), add_special_tokens=False).ids

    def encode_batch(self, texts):
        return [e.ids for e in self._tok.encode_batch(_texts(texts), add_special_tokens=False)]

    def dropout(self):
        """This vocabulary's merges for BPE-dropout (bpe_dropout.BPEDropout), made once."""
        if getattr(self, "_dropout", None) is None:
            from .bpe_dropout import BPEDropout

            self._dropout = BPEDropout(self)
        return self._dropout

    def encode_with_dropout(self, text, p, rng):
        """The ids of a TRAINING sentence with BPE-dropout: each merge skipped with probability p,
        drawn from rng (bpe_dropout.dropout_rng(seed, pass, side, index) for reproducible draws).
        encode() never drops a merge: dev, test and inference text use it."""
        return self.dropout().encode(_text(text), p, rng)

    def decode(self, ids):
        """Text of ids; reserved ids but <unk> and ids outside the vocabulary are skipped."""
        ids = [i for i in _ids(ids, self.vocab_size) if i >= len(SPECIAL_TOKENS) or i == UNK_ID]
        return self._tok.decode(ids, skip_special_tokens=False).replace("<unk>", "\u2047").strip()

    def tokens(self, ids):
        """The subword strings of ids (for attention plots)."""
        return [self._tok.id_to_token(i) or "?" if 0 <= i < self.vocab_size else "?"
                for i in _int_list(ids)]

    def to_json(self):
        return self._tok.to_str()

    @classmethod
    def from_json(cls, text):
        from tokenizers import Tokenizer

        _text(text)
        try:
            return cls(Tokenizer.from_str(text))
        except Exception as exc:
            raise ValueError(f"not a valid tokenizer file: {exc}") from None

    KIND = "BPE"

    def save(self, path):
        atomic_write_bytes(path, self.to_json().encode("utf-8"))

    @classmethod
    def load(cls, path):
        """A tokenizer file of this kind (ValueError for another kind)."""
        tok = load_tokenizer(path)
        if not isinstance(tok, cls):
            raise ValueError(f"{path}: not a {cls.KIND} tokenizer")
        return tok


class CharTokenizer:
    """One id per character of a fixed alphabet (the built-in task's vocabulary)."""

    def __init__(self, alphabet):
        if not isinstance(alphabet, str):
            raise TypeError(f"alphabet must be a str, got {type(alphabet).__name__}")
        if len(set(alphabet)) != len(alphabet) or not alphabet:
            raise ValueError("alphabet must be a non-empty string of distinct characters")
        self.alphabet = alphabet
        self._ids = {ch: i + len(SPECIAL_TOKENS) for i, ch in enumerate(alphabet)}

    @property
    def vocab_size(self):
        return len(SPECIAL_TOKENS) + len(self.alphabet)

    def encode(self, text):
        return [self._ids.get(ch, UNK_ID) for ch in _text(text)]

    def encode_batch(self, texts):
        return [self.encode(t) for t in _texts(texts)]

    def decode(self, ids):
        """Text of ids; reserved ids but <unk> and ids outside the vocabulary are skipped."""
        first = len(SPECIAL_TOKENS)
        return "".join(self.alphabet[i - first] if i >= first else ("\u2047" if i == UNK_ID else "")
                       for i in _ids(ids, self.vocab_size))

    def tokens(self, ids):
        first = len(SPECIAL_TOKENS)
        return [self.alphabet[i - first] if first <= i < self.vocab_size else "\u2047" if i == UNK_ID
                else SPECIAL_TOKENS[i] if 0 <= i < first else "?" for i in _int_list(ids)]

    def to_json(self):
        return json.dumps({"type": "chars", "alphabet": self.alphabet})

    save = SubwordTokenizer.save


SPIECE_UNDERLINE = "\u2581"   # SentencePiece's word-start mark, "▁"


def _sentencepiece():
    """The sentencepiece module, imported only when a SentencePieceTokenizer is built (optional)."""
    try:
        import sentencepiece
    except ImportError:
        raise ImportError("SentencePieceTokenizer needs the sentencepiece package: "
                          "pip install sentencepiece (or pip install transformer-cpu[marian])") from None
    return sentencepiece


def _sentencepiece_processor(model_bytes, source):
    """A SentencePieceProcessor from a serialized model, or ValueError naming `source`."""
    sentencepiece = _sentencepiece()
    if not model_bytes:
        raise ValueError(f"{source}: not a valid SentencePiece model (empty)")
    try:
        processor = sentencepiece.SentencePieceProcessor(model_proto=model_bytes)
        pieces = processor.get_piece_size()
    except Exception as exc:   # the C++ parser reports damage as RuntimeError (or worse)
        why = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise ValueError(f"{source}: not a valid SentencePiece model ({why})") from None
    if pieces < 1:
        raise ValueError(f"{source}: not a valid SentencePiece model (no pieces)")
    return processor


def _vocab_dict(vocab, name="vocab"):
    """A copy of a {piece: id} dict with distinct non-negative int ids, or TypeError/ValueError."""
    if not isinstance(vocab, dict):
        raise TypeError(f"{name} must be a dict of str to int, got {type(vocab).__name__}")
    if not vocab:
        raise ValueError(f"{name} must not be empty")
    out, seen = {}, {}
    for piece, token_id in vocab.items():
        if not isinstance(piece, str):
            raise TypeError(f"{name} keys must be str, got {type(piece).__name__}")
        try:
            piece.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{name} key {piece!r} is not valid Unicode") from None
        if isinstance(token_id, bool) or not isinstance(token_id, (int, np.integer)):
            raise TypeError(f"{name}[{piece!r}] must be an int, got {type(token_id).__name__}")
        if not 0 <= token_id < MAX_VOCAB_SIZE:
            raise ValueError(f"{name}[{piece!r}] must be in [0, {MAX_VOCAB_SIZE}), got {token_id}")
        if int(token_id) in seen:
            raise ValueError(f"{name} maps both {seen[int(token_id)]!r} and {piece!r} to id {token_id}")
        seen[int(token_id)] = piece
        out[piece] = int(token_id)
    return out


def _language_code(text):
    """(['>>xx<<'], rest) when text starts with a target-language code, else ([], text): MarianTokenizer
    keeps the code as one token, looked up in the vocabulary, and gives SentencePiece the rest."""
    if text.startswith(">>"):
        end = text.find("<<")
        if end != -1:
            return [text[:end + 2]], text[end + 2:]
    return [], text


def _clean_up_tokenization(text):
    """transformers' clean_up_tokenization: spaces before punctuation and English clitics removed."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                          (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text


class SentencePieceTokenizer:
    """One side (source or target) of a MarianMT model, exactly as transformers.MarianTokenizer
    tokenizes it: SentencePiece pieces looked up in the model's vocab.json (pieces it lacks become
    unk_id), EOS appended when `append_eos`.

    MarianTokenizer's rules, kept here: a leading ">>xx<<" is one token (its vocab id, or unk_id);
    the strings of the eos, unk and pad tokens written in the text are those tokens (split out
    before SentencePiece sees the text, unlike SubwordTokenizer); no other normalisation than the
    SentencePiece model's own. Decoding skips the eos, unk and pad ids (skip_special_tokens=True).
    """

    def __init__(self, model_bytes, vocab, eos_id, unk_id, pad_id, append_eos, *,
                 clean_up_tokenization_spaces=False):
        if not isinstance(model_bytes, (bytes, bytearray, memoryview)):
            raise TypeError(f"model_bytes must be bytes, got {type(model_bytes).__name__}")
        self._vocab = _vocab_dict(vocab)
        self._pieces = {token_id: piece for piece, token_id in self._vocab.items()}
        self._vocab_size = max(self._pieces) + 1
        ids = {}
        for name, value in (("eos_id", eos_id), ("unk_id", unk_id), ("pad_id", pad_id)):
            ids[name] = _count(value, name, 0, self._vocab_size - 1)
            if ids[name] not in self._pieces:
                raise ValueError(f"{name} {value} is not an id of vocab")
        for name, value in (("append_eos", append_eos),
                            ("clean_up_tokenization_spaces", clean_up_tokenization_spaces)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
        self._model_bytes = bytes(model_bytes)
        self._sp = _sentencepiece_processor(self._model_bytes, "model_bytes")
        self._eos_id, self._unk_id, self._pad_id = ids["eos_id"], ids["unk_id"], ids["pad_id"]
        self._append_eos = append_eos
        self._clean_up = clean_up_tokenization_spaces
        self._special = {self._pieces[i]: i for i in (self._eos_id, self._unk_id, self._pad_id)}
        # Longest first, so that one special string containing another wins (leftmost, then longest).
        alternatives = sorted(self._special, key=len, reverse=True)
        self._special_split = re.compile("(" + "|".join(map(re.escape, alternatives)) + ")")

    model_bytes = property(lambda self: self._model_bytes, doc="the serialized SentencePiece model (.spm)")
    vocab = property(lambda self: dict(self._vocab), doc="a copy of {piece: id} (vocab.json)")
    eos_id = property(lambda self: self._eos_id)
    unk_id = property(lambda self: self._unk_id)
    pad_id = property(lambda self: self._pad_id)
    append_eos = property(lambda self: self._append_eos)
    clean_up_tokenization_spaces = property(lambda self: self._clean_up)

    @property
    def vocab_size(self):
        return self._vocab_size

    def encode(self, text):
        text = _text(text)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"text is not valid Unicode ({exc.reason} at {exc.start})") from None
        ids = []
        # re.split with one group: the special strings found are at the odd positions.
        for position, chunk in enumerate(self._special_split.split(text)):
            if position % 2:
                ids.append(self._special[chunk])
            elif chunk:
                code, rest = _language_code(chunk)
                pieces = code + self._sp.encode(rest, out_type=str)
                ids.extend(self._vocab.get(piece, self._unk_id) for piece in pieces)
        if self._append_eos:
            ids.append(self._eos_id)
        return ids

    def encode_batch(self, texts):
        return [self.encode(t) for t in _texts(texts)]

    def decode(self, ids):
        """Text of ids as MarianTokenizer.decode(ids, skip_special_tokens=True) gives it: eos, unk
        and pad skipped; an id the vocabulary lacks is a ValueError."""
        ids = _int_list(ids, "ids")
        for token_id in ids:
            if token_id not in self._pieces:
                raise ValueError(f"ids: {token_id} is not an id of the vocabulary (size {self._vocab_size})")
        pieces = [self._pieces[i] for i in ids if i not in (self._eos_id, self._unk_id, self._pad_id)]
        text = self._sp.decode_pieces(pieces).replace(SPIECE_UNDERLINE, " ").strip()
        return _clean_up_tokenization(text) if self._clean_up else text

    def tokens(self, ids):
        """The pieces of ids (for attention plots); "?" for an id the vocabulary lacks."""
        return [self._pieces.get(i, "?") for i in _int_list(ids)]

    def to_json(self):
        return json.dumps({"type": "sentencepiece",
                           "model": base64.b64encode(self._model_bytes).decode("ascii"),
                           "vocab": self._vocab, "eos_id": self._eos_id, "unk_id": self._unk_id,
                           "pad_id": self._pad_id, "append_eos": self._append_eos,
                           "clean_up_tokenization_spaces": self._clean_up})

    @classmethod
    def from_json(cls, text):
        _text(text)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a valid tokenizer file ({exc})") from None
        return cls._from_dict(data)

    @classmethod
    def _from_dict(cls, data):
        if not isinstance(data, dict) or data.get("type") != "sentencepiece":
            raise ValueError("not a SentencePiece tokenizer file")
        missing = [k for k in ("model", "vocab", "eos_id", "unk_id", "pad_id", "append_eos") if k not in data]
        if missing:
            raise ValueError(f"not a valid tokenizer file: {', '.join(missing)} missing")
        if not isinstance(data["model"], str):
            raise ValueError("not a valid tokenizer file: model must be a base64 string")
        try:
            model_bytes = base64.b64decode(data["model"], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"not a valid tokenizer file: model is not base64 ({exc})") from None
        try:
            return cls(model_bytes, data["vocab"], data["eos_id"], data["unk_id"], data["pad_id"],
                       data["append_eos"],
                       clean_up_tokenization_spaces=data.get("clean_up_tokenization_spaces", False))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not a valid tokenizer file: {exc}") from None

    KIND = "SentencePiece"
    save = SubwordTokenizer.save
    load = classmethod(SubwordTokenizer.load.__func__)


def _marian_file(directory, name):
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file (a MarianMT directory holds source.spm, "
                                "target.spm and vocab.json)")
    return path


def _read_json_file(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None


def _special_token_string(config, key, default, path):
    """A special token's text in tokenizer_config.json: a str, or an AddedToken dict's "content"."""
    value = config.get(key, default)
    if isinstance(value, dict):
        value = value.get("content")
    if not isinstance(value, str) or not value:
        raise ValueError(f"{path}: {key} must be a non-empty string, got {value!r}")
    return value


def marian_tokenizers(hf_dir):
    """(source, target) SentencePieceTokenizers of a Hugging Face MarianMT directory: source.spm and
    target.spm with the shared vocab.json; the special tokens' strings from tokenizer_config.json
    (default </s>, <unk>, <pad>) and their ids from vocab.json, as MarianTokenizer reads them.
    The source side appends EOS; the target side does not (training adds it)."""
    directory = path_argument(hf_dir, "hf_dir")
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{directory}: no such directory")
    config_path = os.path.join(directory, "tokenizer_config.json")
    config = _read_json_file(config_path) if os.path.isfile(config_path) else {}
    if not isinstance(config, dict):
        raise ValueError(f"{config_path}: not a JSON object")
    if config.get("separate_vocabs"):
        raise ValueError(f"{config_path}: separate_vocabs (a target_vocab.json for the target side) "
                         "is not supported yet")
    for key in ("split_special_tokens", "sp_model_kwargs", "additional_special_tokens", "extra_special_tokens"):
        if config.get(key):
            raise ValueError(f"{config_path}: {key}={config[key]!r} is not supported")
    clean_up = config.get("clean_up_tokenization_spaces", False)
    if not isinstance(clean_up, bool):
        raise ValueError(f"{config_path}: clean_up_tokenization_spaces must be true or false")
    specials = {key: _special_token_string(config, key, default, config_path)
                for key, default in (("eos_token", "</s>"), ("unk_token", "<unk>"), ("pad_token", "<pad>"))}

    vocab_path = _marian_file(directory, "vocab.json")
    vocab = _read_json_file(vocab_path)
    try:
        vocab = _vocab_dict(vocab)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{vocab_path}: {exc}") from None
    for key, token in specials.items():
        if token not in vocab:
            raise ValueError(f"{vocab_path}: has no {token!r} ({key})")
    added = config.get("added_tokens_decoder") or {}
    for entry in (added.values() if isinstance(added, dict) else [added]):
        content = entry.get("content") if isinstance(entry, dict) else entry
        if content not in specials.values() or (isinstance(entry, dict) and any(
                entry.get(flag) for flag in ("lstrip", "rstrip", "single_word"))):
            raise ValueError(f"{config_path}: added token {entry!r} is not supported "
                             "(only the eos, unk and pad tokens, without stripping)")

    models = []
    for name in ("source.spm", "target.spm"):
        path = _marian_file(directory, name)
        with open(path, "rb") as f:
            model_bytes = f.read()
        _sentencepiece_processor(model_bytes, path)   # damage named by its file
        models.append(model_bytes)
    ids = [vocab[specials[key]] for key in ("eos_token", "unk_token", "pad_token")]
    return tuple(SentencePieceTokenizer(model_bytes, vocab, *ids, append_eos=append_eos,
                                        clean_up_tokenization_spaces=clean_up)
                 for model_bytes, append_eos in zip(models, (True, False)))


def tokenizer_from_json(text, source="tokenizer"):
    """Any kind of tokenizer from its JSON text."""
    _text(text)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}: not a valid tokenizer file ({exc})") from None
    if isinstance(data, dict) and data.get("type") == "sentencepiece":
        try:
            return SentencePieceTokenizer._from_dict(data)
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None
    if isinstance(data, dict) and data.get("type") == "chars":
        if not isinstance(data.get("alphabet"), str):
            raise ValueError(f"{source}: character tokenizer without an alphabet")
        try:
            return CharTokenizer(data["alphabet"])
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None
    try:
        return SubwordTokenizer.from_json(text)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


def load_tokenizer(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a valid tokenizer file (invalid UTF-8)") from None
    return tokenizer_from_json(text, source=str(path))
