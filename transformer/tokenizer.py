"""Subword vocabulary: byte-pair encoding (section 5.1 of the paper used BPE for
English-German) learned with the `tokenizers` library on the training split only.

Ids 0-3 are reserved: <pad>=0, <s>=1 (BOS), </s>=2 (EOS), <unk>=3, matching
ModelConfig's defaults (pad_id=0, bos_id=1, eos_id=2).
"""
import json

from .serialization import atomic_write_bytes

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3


class SubwordTokenizer:
    """A BPE vocabulary for one language; encode/decode text <-> ids."""

    def __init__(self, tokenizer):
        self._tok = tokenizer
        for token_id, token in enumerate(SPECIAL_TOKENS):
            if tokenizer.token_to_id(token) != token_id:
                raise ValueError(f"tokenizer must map {token!r} to id {token_id}")

    @classmethod
    def train(cls, texts, vocab_size=8000, min_frequency=2):
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

        if vocab_size < len(SPECIAL_TOKENS) + 1:
            raise ValueError(f"vocab_size must be > {len(SPECIAL_TOKENS)}, got {vocab_size}")
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
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts):
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids):
        ids = [int(i) for i in ids if int(i) >= len(SPECIAL_TOKENS) or int(i) == UNK_ID]
        return self._tok.decode(ids, skip_special_tokens=False).replace("<unk>", "\u2047").strip()

    def tokens(self, ids):
        """The subword strings of ids (for attention plots)."""
        return [self._tok.id_to_token(int(i)) or "?" for i in ids]

    def to_json(self):
        return self._tok.to_str()

    @classmethod
    def from_json(cls, text):
        from tokenizers import Tokenizer

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
        if len(set(alphabet)) != len(alphabet) or not alphabet:
            raise ValueError("alphabet must be a non-empty string of distinct characters")
        self.alphabet = alphabet
        self._ids = {ch: i + len(SPECIAL_TOKENS) for i, ch in enumerate(alphabet)}

    @property
    def vocab_size(self):
        return len(SPECIAL_TOKENS) + len(self.alphabet)

    def encode(self, text):
        return [self._ids.get(ch, UNK_ID) for ch in text]

    def encode_batch(self, texts):
        return [self.encode(t) for t in texts]

    def decode(self, ids):
        first = len(SPECIAL_TOKENS)
        return "".join(self.alphabet[i - first] if i >= first else ("\u2047" if i == UNK_ID else "")
                       for i in (int(i) for i in ids) if i < self.vocab_size)

    def tokens(self, ids):
        return [self.decode([i]) or SPECIAL_TOKENS[int(i)] if int(i) < len(SPECIAL_TOKENS) else self.decode([i])
                for i in ids]

    def to_json(self):
        return json.dumps({"type": "chars", "alphabet": self.alphabet})

    save = SubwordTokenizer.save


def tokenizer_from_json(text, source="tokenizer"):
    """Either kind of tokenizer from its JSON text."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}: not a valid tokenizer file ({exc})") from None
    if isinstance(data, dict) and data.get("type") == "chars":
        if not isinstance(data.get("alphabet"), str):
            raise ValueError(f"{source}: character tokenizer without an alphabet")
        return CharTokenizer(data["alphabet"])
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
