"""Subword vocabulary: byte-pair encoding (section 5.1 of the paper used BPE for
English-German) learned with the `tokenizers` library on the training split only.

Ids 0-3 are reserved: <pad>=0, <s>=1 (BOS), </s>=2 (EOS), <unk>=3, matching
ModelConfig's defaults (pad_id=0, bos_id=1, eos_id=2).
"""
import json

import numpy as np

from .serialization import atomic_write_bytes

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

    def save(self, path):
        atomic_write_bytes(path, self.to_json().encode("utf-8"))

    @classmethod
    def load(cls, path):
        tok = load_tokenizer(path)
        if not isinstance(tok, cls):
            raise ValueError(f"{path}: not a BPE tokenizer")
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


def tokenizer_from_json(text, source="tokenizer"):
    """Either kind of tokenizer from its JSON text."""
    _text(text)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}: not a valid tokenizer file ({exc})") from None
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
