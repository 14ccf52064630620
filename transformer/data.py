"""Parallel text: reading sentence pairs, a deterministic train/dev split, and
batches by length under a token budget (section 5.1 of the paper: "sentence pairs
were batched together by approximate sequence length").
"""
import gzip
import hashlib
import io
import os
import re
import zlib
from dataclasses import dataclass, field

import numpy as np

_HEADER_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,31}$")
HEADER_CHOICES = {"auto": None, "yes": True, "no": False}     # the command line's --header -> header=


@dataclass
class ReadReport:
    """What read_pairs kept and what it skipped (counted, never silently)."""
    path: str
    kept: int = 0
    skipped: dict = field(default_factory=dict)   # reason -> count
    first_skipped: dict = field(default_factory=dict)   # reason -> first line number
    header: list = None      # line 1's fields when it was read as the header (not a pair), else None

    def skip(self, reason, line_number):
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        self.first_skipped.setdefault(reason, line_number)

    def summary(self):
        text = f"{self.path}: {self.kept} pairs"
        if self.header is not None:
            text += f" (line 1 read as the header: {', '.join(self.header)})"
        if not self.skipped:
            return text
        parts = ", ".join(f"{n} {reason} (first at line {self.first_skipped[reason]})"
                          for reason, n in sorted(self.skipped.items()))
        return f"{text}; skipped {parts}"


class ColumnError(ValueError):
    """A column that the file does not have; `argument` is "src_col" or "tgt_col"."""

    def __init__(self, message, argument):
        super().__init__(message)
        self.argument = argument


class _HashingReader(io.RawIOBase):
    """A raw file that feeds every byte read to `digest` and counts them (the corpus reader's
    fingerprint of the file as stored, and its progress)."""

    def __init__(self, f, digest=None, on_bytes=None):
        self._f, self._digest, self._on_bytes = f, digest, on_bytes

    def readable(self):
        return True

    def readinto(self, buffer):
        n = self._f.readinto(buffer)
        if n:
            if self._digest is not None:
                self._digest.update(memoryview(buffer)[:n])
            if self._on_bytes is not None:
                self._on_bytes(n)
        return n


def _open_lines(path, digest=None, on_bytes=None):
    """Raw byte lines of a plain or gzip'd file (gzip detected by its magic, not its name).

    digest: a hashlib object that receives the file's bytes as stored (compressed for gzip) as
    they are read; on_bytes(n): called with the count of each read. A file that cannot be read to
    its end (a truncated or corrupted gzip stream, an I/O error) is a ValueError naming the file
    and the last line read whole."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"data file not found: {path}")
    if os.path.isdir(path):
        raise ValueError(f"data path is a directory, not a file: {path}")
    with open(path, "rb") as f:
        magic = f.read(2)
    line_number = 0
    try:
        with open(path, "rb", buffering=0) as raw:
            stream = io.BufferedReader(_HashingReader(raw, digest, on_bytes), 1 << 20)
            f = gzip.GzipFile(fileobj=stream, mode="rb") if magic == b"\x1f\x8b" else stream
            for line in f:
                line_number += 1
                yield line
    except (OSError, EOFError, zlib.error) as exc:   # zlib.error: a corrupted gzip stream
        where = f"after line {line_number}" if line_number else "at its start"
        raise ValueError(f"{path}: cannot be read {where} ({exc})") from None


def _check_column(spec, name):
    """A column: a 0-based index (int, or a str of digits) or a header name (str)."""
    if isinstance(spec, bool) or not isinstance(spec, (int, np.integer, str)):
        raise TypeError(f"{name} must be a column name (str) or 0-based index (int), got {type(spec).__name__}")
    if isinstance(spec, (int, np.integer)) and spec < 0:
        raise ColumnError(f"{name} must be a 0-based column index >= 0, got {spec}", name)
    if isinstance(spec, str) and spec.startswith("-") and spec[1:].isdigit():
        raise ColumnError(f"{name} must be a 0-based column index >= 0, got {spec!r}", name)
    return spec


def _by_name(spec):
    return isinstance(spec, str) and not (spec.isascii() and spec.isdigit())


def _resolve_column(spec, header, path, argument):
    if not _by_name(spec):
        return int(spec)      # a header narrower than the lines does not limit them (read_pairs checks)
    if header is None:     # only with header=False: a name makes line 1 the header otherwise
        raise ColumnError(f"{path}: {spec!r} is a column name, but line 1 is not to be read as a header "
                          "(header=False, --header no): give a 0-based index", argument)
    if spec not in header:
        raise ColumnError(f"{path}: no column named {spec!r} (columns: {', '.join(header)})", argument)
    return header.index(spec)


def read_pairs(path, src_col=0, tgt_col=1, max_pairs=None, header=None):
    """Read (source, target) sentence pairs from a tab-separated file (optionally gzip'd).

    Columns are names from the header line or 0-based indexes. header: True (line 1 names the
    columns), False (line 1 is a pair like the others) or None (decide: line 1 is the header when
    a column is given by name, or else when it has two or more fields and every one is a short
    identifier such as "eng", "hin", "attribution"). A header is never a pair; the report's
    `header` holds it and its summary names it, so a first pair read as one ("abc<TAB>CBA") shows.
    Lines with too few columns, invalid UTF-8 or an empty side are skipped and counted in the
    returned ReadReport. Returns (pairs, report). Raises FileNotFoundError for a missing file,
    ColumnError (a ValueError) for a column the file does not have, and ValueError when nothing
    usable is left.
    """
    try:
        path = os.fspath(path)
    except TypeError:
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}") from None
    if max_pairs is not None:
        if isinstance(max_pairs, bool) or not isinstance(max_pairs, (int, np.integer)):
            raise TypeError(f"max_pairs must be None or an int, got {type(max_pairs).__name__}")
        if max_pairs < 1:
            raise ValueError(f"max_pairs must be >= 1 (or None for all), got {max_pairs}")
    report = ReadReport(path)
    pairs = []
    stream = iter_pairs(path, src_col, tgt_col, header, report)
    for pair in stream:
        pairs.append(pair)
        if max_pairs is not None and len(pairs) >= max_pairs:
            stream.close()
            break
    report.kept = len(pairs)
    return pairs, report


def iter_pairs(path, src_col=0, tgt_col=1, header=None, report=None, digest=None, on_bytes=None):
    """The pairs of read_pairs as a stream: (source, target) one at a time, in memory of one line.

    `report` (a ReadReport) counts what was skipped and `kept`; digest and on_bytes see the file's
    bytes as stored (_open_lines). The checks that need the whole file (no usable pair, a column
    beyond every line) are made when the stream ends, before it stops."""
    path = os.fspath(path)
    src_col = _check_column(src_col, "src_col")
    tgt_col = _check_column(tgt_col, "tgt_col")
    if header is not None and not isinstance(header, bool):
        raise TypeError(f"header must be True, False or None (decide), got {type(header).__name__}")
    report = ReadReport(path) if report is None else report
    named = _by_name(src_col) or _by_name(tgt_col)
    is_header = True if header is None and named else header    # names can only come from a header
    columns = None       # the header's fields, once line 1 is read as the header
    src_index = tgt_index = None
    widest = 0           # the most fields of a line: a column beyond every line's is the flag's mistake
    kept = 0
    for line_number, raw in enumerate(_open_lines(path, digest, on_bytes), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            if line_number == 1 and is_header:
                raise ValueError(f"{path}: line 1, the header, is not valid UTF-8") from None
            report.skip("lines with invalid UTF-8", line_number)
            continue
        line = line.rstrip("\r\n")
        if line_number == 1:
            line = line.lstrip("\ufeff")
            fields = line.split("\t")
            if is_header is None:
                is_header = len(fields) >= 2 and all(_HEADER_FIELD.match(f) for f in fields)
            if is_header:
                columns = report.header = fields
        if src_index is None:
            src_index = _resolve_column(src_col, columns, path, "src_col")
            tgt_index = _resolve_column(tgt_col, columns, path, "tgt_col")
            if src_index == tgt_index:
                raise ColumnError(f"{path}: source and target columns are the same ({src_col!r})", "tgt_col")
            if columns is not None:
                continue
        if not line.strip():
            report.skip("blank lines", line_number)
            continue
        fields = line.split("\t")
        widest = max(widest, len(fields))
        if max(src_index, tgt_index) >= len(fields):
            report.skip("lines with too few columns", line_number)
            continue
        src, tgt = fields[src_index].strip(), fields[tgt_index].strip()
        if not src or not tgt:
            report.skip("pairs with an empty side", line_number)
            continue
        kept += 1
        report.kept = kept
        yield src, tgt
    if not kept and widest:
        for index, argument in ((src_index, "src_col"), (tgt_index, "tgt_col")):
            if index >= widest:
                raise ColumnError(f"{path}: no column {index} (0-based): its lines have at most {widest} "
                                  "columns", argument)
    if not kept:
        raise ValueError(f"{path}: no usable sentence pairs ({report.summary()})")


def split_pairs(pairs, dev_fraction=0.05, max_dev=1000, key=""):
    """Deterministic train/dev split by a hash of the source sentence.

    Hashing the source (not the position) keeps every translation of one sentence on the same
    side, so the dev set never contains a sentence the model was trained on.
    """
    if not 0.0 <= dev_fraction < 1.0:
        raise ValueError(f"dev_fraction must be in [0, 1), got {dev_fraction}")
    train, dev = [], []
    threshold = int(dev_fraction * 2**32)
    for pair in pairs:
        digest = hashlib.blake2b((key + pair[0]).encode("utf-8"), digest_size=4).digest()
        (dev if int.from_bytes(digest, "little") < threshold else train).append(pair)
    if len(dev) > max_dev:
        train.extend(dev[max_dev:])
        dev = dev[:max_dev]
    return train, dev


def pad_batch(sequences, pad_id, length=None):
    """Rows of ids -> int64 [B, length] padded with pad_id."""
    length = max((len(s) for s in sequences), default=0) if length is None else length
    out = np.full((len(sequences), length), pad_id, dtype=np.int64)
    for row, seq in enumerate(sequences):
        try:
            out[row, :len(seq)] = seq[:length]
        except (TypeError, ValueError, OverflowError) as exc:
            raise TypeError(f"sequences[{row}] must be a sequence of int ids ({exc})") from None
    return out


def make_example(src_ids, tgt_ids, bos_id, eos_id):
    """Teacher forcing (section 3.1): the decoder reads BOS + y and predicts y + EOS."""
    return list(src_ids), [bos_id] + list(tgt_ids), list(tgt_ids) + [eos_id]


def length_batches(examples, max_tokens, seed=0, epoch=0, shuffle=True):
    """Group examples (src, tgt_in, tgt_out) into batches of similar length.

    A batch holds as many examples as fit in `max_tokens` counted as rows x longest sequence
    (padding included), so every batch costs about the same. Order within length buckets and
    the order of batches depend only on (seed, epoch): a resumed run sees the same batches.
    Returns a list of index lists.
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, float, np.integer, np.floating)):
        raise TypeError(f"max_tokens must be a number, got {type(max_tokens).__name__}")
    if not max_tokens >= 1:   # NaN too
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    rng = np.random.default_rng([seed, epoch])
    lengths = np.array([max(len(e[0]), len(e[1])) for e in examples], dtype=np.int64)
    jitter = rng.random(len(examples)) if shuffle else np.zeros(len(examples))
    order = np.lexsort((jitter, lengths))
    batches, current, longest = [], [], 0
    for index in order:
        longest_if_added = max(longest, int(lengths[index]))
        if current and longest_if_added * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest_if_added = [], int(lengths[index])
        current.append(int(index))
        longest = longest_if_added
    if current:
        batches.append(current)
    if shuffle:
        rng.shuffle(batches)
    return batches


def collate(examples, indices, pad_id):
    """The padded arrays (src, tgt_in, tgt_out) of the examples at `indices`."""
    try:
        indices = list(indices)
    except TypeError:
        raise TypeError(f"indices must be a sequence of ints, got {type(indices).__name__}") from None
    for i in indices:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"indices must hold ints, got {type(i).__name__}")
        if not 0 <= i < len(examples):
            raise ValueError(f"indices must be in [0, {len(examples)}), got {i}")
    chosen = [examples[i] for i in indices]
    return (pad_batch([e[0] for e in chosen], pad_id),
            pad_batch([e[1] for e in chosen], pad_id),
            pad_batch([e[2] for e in chosen], pad_id))
