"""The weights' fingerprint (csrc/checksum.h) against its definition, computed in numpy."""
import numpy as np
import pytest

from transformer import _C
from conftest import num_threads

CHUNK = 1 << 20
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
ODD = np.uint64(0xFF51AFD7ED558CCD)


def definition(data: bytes) -> int:
    """checksum.h: the sum over 8-byte words of (word ^ i * GOLDEN) * ODD per 1 MiB chunk (a
    zero-padded tail word adds its byte count too), chunks combined in order, mod 2^64."""
    with np.errstate(over="ignore"):   # every sum and product is mod 2^64
        return _definition(data)


def _definition(data):
    n = len(data)
    total = np.uint64(n) * GOLDEN
    for c, start in enumerate(range(0, n, CHUNK)):
        chunk = data[start:start + CHUNK]
        tail = len(chunk) % 8
        padded = chunk + bytes((8 - tail) % 8)
        words = np.frombuffer(padded, dtype=np.uint64)
        index = np.arange(len(words), dtype=np.uint64) + np.uint64(start // 8)
        h = ((words ^ (index * GOLDEN)) * ODD).sum(dtype=np.uint64)
        if tail:
            h += np.uint64(tail)
        total += (h ^ (np.uint64(c) * ODD)) * GOLDEN
    return int(total)


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 1000, CHUNK - 3, CHUNK, CHUNK + 5, (1 << 18) * 5 + 12,
                                  3 * CHUNK + (1 << 17) + 4])
def test_matches_the_definition_at_every_thread_count(size):
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    want = definition(data.tobytes())
    for threads in (1, 2, 3):
        with num_threads(threads):
            assert _C.checksum(data) == want, f"{size} bytes, {threads} threads"


def test_any_single_word_change_is_seen():
    data = np.random.default_rng(0).standard_normal((3 * CHUNK + 100) // 4, dtype=np.float32)
    before = _C.checksum(data)
    rng = np.random.default_rng(1)
    for i in list(rng.integers(0, data.size, 20)) + [0, data.size - 1]:
        old = data[i]
        data[i] = np.nextafter(old, np.float32(np.inf))     # the smallest change of one weight
        assert _C.checksum(data) != before, i
        data[i] = old
    assert _C.checksum(data) == before
    swapped = data.copy()
    swapped[[5, 6]] = swapped[[6, 5]]                        # the same words in another order
    assert _C.checksum(swapped) != before
