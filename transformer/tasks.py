"""The built-in task `transformer train` learns when given no data: generated in
process, no download, small enough to learn in a couple of minutes on two cores.

Reverse a lowercase word and capitalise it: "attention" -> "NOITNETTA". Every
output token depends on one input token at a mirrored position, so the model must
learn to attend by position (the sinusoidal encodings, section 3.5) and by content;
its cross-attention is a clean anti-diagonal, the textbook picture.
"""
import numpy as np

from .tokenizer import CharTokenizer

SOURCE_ALPHABET = "abcdefghijklmnopqrstuvwxyz"
TARGET_ALPHABET = SOURCE_ALPHABET.upper()


class ReverseTask:
    """Random lowercase strings -> reversed, upper-cased strings."""

    name = "reverse"

    def __init__(self, min_len=3, max_len=12):
        if not 1 <= min_len <= max_len:
            raise ValueError(f"need 1 <= min_len <= max_len, got {min_len}, {max_len}")
        self.min_len, self.max_len = min_len, max_len
        self.src_tokenizer = CharTokenizer(SOURCE_ALPHABET)
        self.tgt_tokenizer = CharTokenizer(TARGET_ALPHABET)

    @staticmethod
    def translate(text):
        return text[::-1].upper()

    def sample(self, rng, n):
        """n (source, target) text pairs."""
        lengths = rng.integers(self.min_len, self.max_len + 1, size=n)
        letters = np.array(list(SOURCE_ALPHABET))
        pairs = []
        for length in lengths:
            src = "".join(letters[rng.integers(0, len(letters), size=length)])
            pairs.append((src, self.translate(src)))
        return pairs
