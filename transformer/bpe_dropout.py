"""BPE-dropout (Provilkov, Emelianenko and Voita, 2020): while a training sentence is segmented,
each merge that could apply is skipped with probability p, so the model sees the same words cut
into varied subwords; inference and the dev/test sets keep the plain segmentation.

The merges of a SubwordTokenizer are replayed here, in Python, from the plain ids: a sentence's
pieces are grouped into words (every pre-token Metaspace makes begins with "▁", and no merge
crosses one), each word goes back to its characters, and BPE merges them again, lowest rank
first, the leftmost on ties, exactly as the `tokenizers` library does, except that each merge,
when its turn comes, is skipped with probability p (and considered again after the next merge
made; the word is done when every merge left was skipped). With p = 0 this is the plain
segmentation, id for id.

The random draws come from an explicit stream, dropout_rng(seed, pass, side, index): a function
of the sentence and the pass over the data only, so a segmentation does not depend on the
order sentences are segmented in, on threads, on ranks, or on where a run was resumed.
`tokenizers`' own BPE dropout draws from a thread's unseeded generator, hence this replay.

Training segments many sentences at a time in C (segment_many: csrc/bpe.c, every core, the same
draws through CPython's Mersenne Twister), id for id what resegment gives here; this Python
replay is the reference that C is tested against.
"""
import hashlib
import json
import random

import numpy as np

WORD_START = "\u2581"   # Metaspace's word-start mark, "▁"


def _seed_digest(seed, pass_index, side, index):
    key = f"bpe-dropout:{int(seed)}:{int(pass_index)}:{side}:{int(index)}".encode("ascii")
    return hashlib.blake2b(key, digest_size=16).digest()


def dropout_rng(seed, pass_index, side, index):
    """The random stream of one sentence's segmentation in one pass: random.Random, whose
    random() sequence for a given int seed Python keeps the same from version to version."""
    return random.Random(int.from_bytes(_seed_digest(seed, pass_index, side, index), "little"))


def dropout_keys(seed, pass_index, side, rows):
    """The seeds of dropout_rng for sentences `rows` as random.Random reads an int seed: its
    little-endian 32-bit words (keys, uint32 [n, 4]) and how many it has (keylen, the highest
    non-zero word's place + 1, at least 1)."""
    rows = np.asarray(rows).reshape(-1)
    keys = np.frombuffer(b"".join(_seed_digest(seed, pass_index, side, r) for r in rows.tolist()),
                         dtype="<u4").reshape(rows.size, 4).astype(np.uint32)
    nonzero = keys != 0
    keylen = np.where(nonzero.any(axis=1), 4 - np.argmax(nonzero[:, ::-1], axis=1), 1).astype(np.int32)
    return keys, keylen


def check_rate(p, name="p"):
    """p as a float in [0, 1), or TypeError/ValueError naming it."""
    if isinstance(p, bool) or not isinstance(p, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(p).__name__}")
    if not 0 <= p < 1:          # NaN too
        raise ValueError(f"{name} must be in [0, 1), got {p}")
    return float(p)


class BPEDropout:
    """The merges of one BPE vocabulary (a SubwordTokenizer), replayed with dropout."""

    def __init__(self, tokenizer):
        from .tokenizer import SubwordTokenizer

        if not isinstance(tokenizer, SubwordTokenizer):
            raise ValueError(f"BPE-dropout needs a BPE vocabulary (SubwordTokenizer), and this one is "
                             f"{type(tokenizer).__name__}")
        self.tokenizer = tokenizer
        data = json.loads(tokenizer.to_json())
        model, pre = data.get("model") or {}, data.get("pre_tokenizer") or {}
        plain = not any(model.get(key) for key in ("continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
                                                    "byte_fallback", "ignore_merges"))
        if model.get("type") != "BPE" or not plain or pre.get("type") != "Metaspace" \
                or pre.get("replacement") != WORD_START or pre.get("split") is False:
            raise ValueError("BPE-dropout needs a BPE vocabulary of SubwordTokenizer.train's kind (Metaspace words, "
                             "no subword prefixes or byte fallback)")
        vocab = model["vocab"]
        self._pieces = {token_id: piece for piece, token_id in vocab.items()}
        self._vocab = vocab
        self._merges = {}      # (left id, right id) -> (rank, merged id)
        for rank, merge in enumerate(model["merges"]):
            left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
            self._merges.setdefault((vocab[left], vocab[right]), (rank, vocab[left + right]))
        self._chars = {}       # id -> the ids of its characters (bounded by the vocabulary)
        self._starts = {}      # id -> whether its piece begins a word
        self._tables = None    # the C segmenter's (tables), made when first asked for

    def _characters(self, token_id):
        chars = self._chars.get(token_id)
        if chars is None:
            piece = self._pieces.get(token_id)
            chars = (token_id,)            # <unk> and the reserved ids stay whole: no merge has them
            if piece is not None and token_id > 3 and len(piece) > 1 and all(ch in self._vocab for ch in piece):
                chars = tuple(self._vocab[ch] for ch in piece)
            self._chars[token_id] = chars
        return chars

    def _begins_word(self, token_id):
        start = self._starts.get(token_id)
        if start is None:
            start = self._starts[token_id] = (self._pieces.get(token_id) or "").startswith(WORD_START)
        return start

    def _merge_word(self, symbols, p, rng, stats):
        """BPE on one word's character ids: the merge of lowest rank (leftmost on ties) that is not
        skipped, again and again; each merge reached is skipped with probability p."""
        merges, draw = self._merges, rng.random
        considered = skipped = 0
        while len(symbols) > 1:
            candidates = sorted((merges[pair][0], i) for i, pair in enumerate(zip(symbols, symbols[1:]))
                                if pair in merges)
            for _, i in candidates:
                considered += 1
                if p and draw() < p:
                    skipped += 1
                    continue
                symbols[i:i + 2] = [merges[symbols[i], symbols[i + 1]][1]]
                break
            else:
                break
        if stats is not None:
            stats["considered"] = stats.get("considered", 0) + considered
            stats["skipped"] = stats.get("skipped", 0) + skipped
        return symbols

    def resegment(self, ids, p, rng, stats=None):
        """A segmentation of the sentence whose plain ids are `ids`, each merge skipped with
        probability p, drawn from rng (random.Random: dropout_rng). stats, a dict: adds the merges
        considered and skipped."""
        out, word = [], []
        for token_id in ids:
            token_id = int(token_id)
            if word and self._begins_word(token_id):
                out.extend(self._merge_word(word, p, rng, stats))
                word = []
            word.extend(self._characters(token_id))
        if word:
            out.extend(self._merge_word(word, p, rng, stats))
        return out

    def tables(self):
        """The merges and characters for the C segmenter (_C.BPETables), made once."""
        if self._tables is None:
            from . import _C

            size = max(self._pieces) + 1 if self._pieces else 0
            pairs = sorted((rank, left, right, merged) for (left, right), (rank, merged) in self._merges.items())
            chars = [self._characters(token_id) for token_id in range(size)]
            chars_off = np.zeros(size + 1, dtype=np.int64)
            np.cumsum([len(c) for c in chars], out=chars_off[1:])
            self._tables = _C.BPETables([q[1] for q in pairs], [q[2] for q in pairs], [q[3] for q in pairs],
                                        chars_off, [c for word in chars for c in word],
                                        [self._begins_word(token_id) for token_id in range(size)])
        return self._tables

    def segment_many(self, ids, offsets, p, seed, pass_index, side, rows, lengths_only=False):
        """resegment for many sentences at once, in C on every core: sentence s, ids[offsets[s]:
        offsets[s + 1]], drawn from dropout_rng(seed, pass_index, side, rows[s]). Returns
        (ids int32, offsets int64 [n + 1]), or the lengths (int64 [n]) when lengths_only."""
        keys, keylen = dropout_keys(seed, pass_index, side, rows)
        return self.tables().segment(ids, offsets, keys, keylen, check_rate(p), lengths_only)

    def encode(self, text, p, rng, stats=None):
        """The ids of `text` with BPE-dropout p, drawn from rng (p = 0: tokenizer.encode(text))."""
        return self.resegment(self.tokenizer.encode(text), check_rate(p), rng, stats)
