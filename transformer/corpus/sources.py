"""Where a corpus comes from: the inputs a user names, read as streams of sentence pairs.

Two formats: the tab-separated files `train --data` has always read (plain or gzip, columns by
name or index: data.iter_pairs), and OPUS's two aligned plain-text files, one sentence a line
(`--data corpus.en,corpus.es`, or `--src-file` / `--tgt-file`). Several inputs are one corpus,
in the order given.

Every input is fingerprinted by the bytes it holds as stored (SHA-256, at the speed of the
disk): that is what finds a prepared copy in the cache. Reading an input feeds the same digest,
so a file that changes while it is prepared is caught when its stream ends.
"""
import hashlib
import os

from ..data import ReadReport, _open_lines, iter_pairs

FINGERPRINT_CHUNK = 4 << 20


def file_digest(path, chunk=FINGERPRINT_CHUNK):
    """SHA-256 (hex) of a file's bytes as stored."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                return digest.hexdigest()
            digest.update(block)


def _existing_file(path, role):
    if not os.path.exists(path):
        raise FileNotFoundError(f"{role} not found: {path}")
    if os.path.isdir(path):
        raise ValueError(f"{role} is a directory, not a file: {path}")
    return path


class TsvInput:
    """Tab-separated pairs: one file, two of its columns."""
    kind = "tsv"

    def __init__(self, path, src_col="0", tgt_col="1", header=None):
        self.path = _existing_file(os.fspath(path), "data file")
        self.src_col, self.tgt_col, self.header = src_col, tgt_col, header

    @property
    def files(self):
        return [self.path]

    def settings(self):
        """What decides the pairs read from the file's bytes."""
        return {"kind": self.kind, "src_col": str(self.src_col), "tgt_col": str(self.tgt_col),
                "header": self.header}

    def pairs(self, report, digests, on_bytes=None):
        """(source, target) pairs; `report` counts them and what was skipped."""
        return iter_pairs(self.path, self.src_col, self.tgt_col, self.header, report, digests[0], on_bytes)

    def reports(self):
        return [ReadReport(self.path)]


class AlignedInput:
    """OPUS's format: two plain-text files (plain or gzip), line i of one the translation of line
    i of the other. A line that is not UTF-8 on either side, or empty on either, skips the pair
    (counted, as for tab-separated files); files of different line counts are an error naming
    both files and their counts."""
    kind = "aligned"

    def __init__(self, src_path, tgt_path):
        self.src_path = _existing_file(os.fspath(src_path), "source file")
        self.tgt_path = _existing_file(os.fspath(tgt_path), "target file")
        if os.path.realpath(self.src_path) == os.path.realpath(self.tgt_path):
            raise ValueError(f"the source and target files are the same file: {self.src_path}")

    @property
    def path(self):
        return f"{self.src_path},{self.tgt_path}"

    @property
    def files(self):
        return [self.src_path, self.tgt_path]

    def settings(self):
        return {"kind": self.kind}

    def reports(self):
        return [ReadReport(self.path)]

    def pairs(self, report, digests, on_bytes=None):
        src_lines = _open_lines(self.src_path, digests[0], on_bytes)
        tgt_lines = _open_lines(self.tgt_path, digests[1], on_bytes)
        line_number = kept = 0
        for line_number, (src_raw, tgt_raw) in enumerate(zip(src_lines, tgt_lines), start=1):
            try:
                src, tgt = src_raw.decode("utf-8"), tgt_raw.decode("utf-8")
            except UnicodeDecodeError:
                report.skip("lines with invalid UTF-8", line_number)
                continue
            if line_number == 1:
                src, tgt = src.lstrip("\ufeff"), tgt.lstrip("\ufeff")
            src, tgt = src.strip(), tgt.strip()
            if not src and not tgt:
                report.skip("blank lines", line_number)
                continue
            if not src or not tgt:
                report.skip("pairs with an empty side", line_number)
                continue
            kept += 1
            report.kept = kept
            yield src, tgt
        # zip stops at the shorter file: the longer one's remaining lines make the mismatch
        src_rest, tgt_rest = sum(1 for _ in src_lines), sum(1 for _ in tgt_lines)
        if src_rest or tgt_rest:
            raise ValueError(f"aligned files of different lengths: {self.src_path} has "
                             f"{line_number + src_rest} lines, {self.tgt_path} has {line_number + tgt_rest} "
                             "(line i of one must be the translation of line i of the other)")
        if not kept:
            raise ValueError(f"{self.path}: no usable sentence pairs ({report.summary()})")


def split_spec(spec):
    """One --data value as the inputs it names: an existing file is a tab-separated file; "A,B"
    (neither an existing file) is two aligned files."""
    if os.path.exists(spec) or "," not in spec:
        return (spec,)
    parts = spec.split(",")
    if len(parts) != 2 or not all(parts):
        raise FileNotFoundError(f"data file not found: {spec} (two aligned files are given as "
                                "SOURCE,TARGET)")
    return tuple(parts)


def make_inputs(specs, src_col="0", tgt_col="1", header=None, src_file=None, tgt_file=None):
    """The inputs of --data values (each a tab-separated file, or SOURCE,TARGET aligned files) and
    of --src-file / --tgt-file, in that order."""
    inputs = []
    for spec in specs or ():
        parts = split_spec(os.fspath(spec))
        inputs.append(TsvInput(parts[0], src_col, tgt_col, header) if len(parts) == 1 else AlignedInput(*parts))
    if (src_file is None) != (tgt_file is None):
        given, missing = ("--src-file", "--tgt-file") if src_file is not None else ("--tgt-file", "--src-file")
        raise ValueError(f"needs {missing} too: {given} is one side of two aligned files")
    if src_file is not None:
        inputs.append(AlignedInput(src_file, tgt_file))
    if not inputs:
        raise ValueError("no corpus given: --data FILE (or SOURCE,TARGET), or --src-file and --tgt-file")
    return inputs


def fingerprint(inputs):
    """(SHA-256 of the SHA-256s of every input file's bytes, in order; the list of {path, bytes,
    sha256} per file). Equal fingerprints mean the same bytes in the same order."""
    combined, files = hashlib.sha256(), []
    for item in inputs:
        for path in item.files:
            digest = file_digest(path)
            files.append({"path": os.path.abspath(path), "bytes": os.path.getsize(path), "sha256": digest})
            combined.update(digest.encode())
    return combined.hexdigest(), files
