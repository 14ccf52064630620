"""A prepared corpus on disk: flat token-id arrays with offsets, memory-mapped, and their manifest.

    DIR/manifest.json            format and version, the inputs' fingerprint, the settings, the
                                 counts, and each file's size and SHA-256
    DIR/train.src.ids            the source sentences' token ids, end to end (uint16 for a
    DIR/train.tgt.ids            vocabulary of at most 65,536 entries, else uint32)
    DIR/train.src.offsets        int64, one more than the sentences: sentence i is
    DIR/train.tgt.offsets        ids[offsets[i]:offsets[i + 1]] (fairseq's MMapIndexedDataset, in two files)
    DIR/src_tokenizer.json, DIR/tgt_tokenizer.json
    DIR/dev.jsonl                the held-out pairs as text, one ["source", "target"] a line

A directory is written under a temporary name beside its final one and renamed when complete
(ArrayWriter, commit), so a preparation killed half-way leaves nothing that reads as prepared.
Opening one checks every file against the manifest, size and checksum, and refuses a truncated,
grown or edited one, naming it: a damaged corpus is never trained on.
"""
import hashlib
import json
import mmap
import os
import shutil

import numpy as np

from ..serialization import _temporary_prefix, atomic_write_bytes, fsync_directory, remove_stale_temporaries
from ..tokenizer import tokenizer_from_json

FORMAT = "transformer-prepared-corpus"
VERSION = 1
MANIFEST = "manifest.json"
SIDES = ("src", "tgt")
COPY_CHUNK = 8 << 20


def ids_dtype(vocab_size):
    """The narrowest unsigned dtype that holds every id of a vocabulary."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


class ArrayWriter:
    """One side's sentences appended to `name`.ids and `name`.offsets, hashed as they are written."""

    def __init__(self, directory, name, dtype):
        self.name, self.dtype = name, np.dtype(dtype)
        self.paths = {part: os.path.join(directory, f"{name}.{part}") for part in ("ids", "offsets")}
        self.files = {part: open(path, "wb") for part, path in self.paths.items()}
        self.digests = {part: hashlib.sha256() for part in self.paths}
        self.total = 0         # ids written
        self.count = 0         # sentences written
        self._write("offsets", np.zeros(1, dtype=np.int64))

    def _write(self, part, array):
        data = memoryview(np.ascontiguousarray(array)).cast("B")
        self.files[part].write(data)
        self.digests[part].update(data)

    def append(self, flat_ids, lengths):
        """Sentences given as their ids end to end (`flat_ids`, this writer's dtype) and lengths."""
        ends = self.total + np.cumsum(lengths, dtype=np.int64)
        self._write("ids", flat_ids)
        self._write("offsets", ends)
        self.total += int(flat_ids.size)
        self.count += int(lengths.size)

    def append_writer(self, other):
        """Everything `other` (closed) wrote, after what this one holds."""
        other_ids = np.memmap(other.paths["ids"], dtype=self.dtype, mode="r") if other.total else None
        other_offsets = np.fromfile(other.paths["offsets"], dtype=np.int64)
        for start in range(0, other.total, COPY_CHUNK):
            self._write("ids", other_ids[start:start + COPY_CHUNK])
        for start in range(1, other_offsets.size, COPY_CHUNK):
            self._write("offsets", other_offsets[start:start + COPY_CHUNK] + self.total)
        self.total += other.total
        self.count += other.count
        del other_ids

    def close(self):
        for f in self.files.values():
            f.flush()
            os.fsync(f.fileno())
            f.close()

    def remove(self):
        for path in self.paths.values():
            os.unlink(path)

    def manifest(self):
        """The manifest's entries for this writer's two files."""
        return {f"{self.name}.ids": {"dtype": self.dtype.name, "count": self.total,
                                     "sha256": self.digests["ids"].hexdigest()},
                f"{self.name}.offsets": {"dtype": "int64", "count": self.count + 1,
                                         "sha256": self.digests["offsets"].hexdigest()}}


def write_text_file(directory, name, text):
    """A small file of the prepared directory, and its manifest entry."""
    data = text.encode("utf-8")
    atomic_write_bytes(os.path.join(directory, name), data)
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def temporary_dir(final):
    """A new empty directory beside `final`, named so that remove_stale_temporaries knows whose it is."""
    parent = os.path.dirname(os.path.abspath(final)) or "."
    os.makedirs(parent, exist_ok=True)
    remove_stale_temporaries(parent)
    base = _temporary_prefix() + os.path.basename(os.path.abspath(final))
    for attempt in range(1000):
        path = os.path.join(parent, f"{base}-{attempt}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue
    raise OSError(f"cannot create a temporary directory beside {final}")


def commit(tmp, final, manifest, overwrite=False):
    """Write the manifest into the complete directory `tmp` and rename it to `final`. A `final`
    already there is replaced when `overwrite`; otherwise (another process prepared the same
    corpus meanwhile) `tmp` is dropped and theirs kept. Returns the path that holds the corpus."""
    atomic_write_bytes(os.path.join(tmp, MANIFEST), (json.dumps(manifest, indent=1) + "\n").encode("utf-8"))
    fsync_directory(tmp)
    if os.path.exists(final):
        if not overwrite:
            shutil.rmtree(tmp, ignore_errors=True)
            return final
        old = temporary_dir(final + "-old")
        os.rename(final, os.path.join(old, "corpus"))
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        try:
            os.rename(tmp, final)
        except OSError:            # another process renamed its copy there first
            shutil.rmtree(tmp, ignore_errors=True)
    fsync_directory(os.path.dirname(os.path.abspath(final)))
    return final


def is_prepared(path):
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, MANIFEST))


def read_manifest(path):
    """The manifest of a prepared directory, checked for format and version (ValueError otherwise)."""
    manifest_path = os.path.join(path, MANIFEST)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no such directory")
    if not os.path.isfile(manifest_path):
        raise ValueError(f"{path}: not a prepared corpus (no {MANIFEST}; `transformer prepare --out DIR` "
                         "writes one)")
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{manifest_path}: damaged ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{manifest_path}: not the manifest of a prepared corpus")
    if manifest.get("version") != VERSION:
        raise ValueError(f"{manifest_path}: format version {manifest.get('version')!r}, and this transformer "
                         f"reads version {VERSION}: prepare the corpus again")
    for key in ("fingerprint", "pairs_fingerprint", "settings", "counts", "arrays", "files"):
        if key not in manifest:
            raise ValueError(f"{manifest_path}: damaged ({key} missing)")
    return manifest


def _sha256_file(path):
    """SHA-256 of a file, read through a memory map: the pages it brings in are those training
    maps, shared with every process that maps the file (and counted so in its PSS)."""
    if os.path.getsize(path) == 0:
        return hashlib.sha256().hexdigest()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        return hashlib.sha256(mapped).hexdigest()


class PreparedCorpus:
    """A prepared directory, opened: the training pairs as memory-mapped arrays (`ids[side]`,
    `offsets[side]`), the held-out pairs (`dev`, a list of (source, target)), the tokenizers and
    the manifest. Nothing per sentence is a Python object."""

    def __init__(self, path, verify=True):
        self.path = os.fspath(path)
        self.manifest = read_manifest(self.path)
        where = self.path
        for name, entry in {**self.manifest["arrays"], **self.manifest["files"]}.items():
            file = os.path.join(where, name)
            if not os.path.isfile(file):
                raise ValueError(f"{file}: missing from the prepared corpus")
            expected = entry["count"] * np.dtype(entry["dtype"]).itemsize if "count" in entry else entry["bytes"]
            size = os.path.getsize(file)
            if size != expected:
                raise ValueError(f"{file}: {size} bytes, and the manifest says {expected}: truncated or grown "
                                 "since it was prepared (prepare the corpus again)")
            if verify and _sha256_file(file) != entry["sha256"]:
                raise ValueError(f"{file}: its contents changed since it was prepared (checksum differs "
                                 "from the manifest's; prepare the corpus again)")
        self.ids, self.offsets = {}, {}
        for side in SIDES:
            entry = self.manifest["arrays"][f"train.{side}.ids"]
            file = os.path.join(where, f"train.{side}.ids")
            self.ids[side] = (np.memmap(file, dtype=entry["dtype"], mode="r") if entry["count"]
                              else np.zeros(0, dtype=entry["dtype"]))
            self.offsets[side] = np.memmap(os.path.join(where, f"train.{side}.offsets"), dtype=np.int64, mode="r")
            if self.offsets[side][0] != 0 or self.offsets[side][-1] != entry["count"]:
                raise ValueError(f"{os.path.join(where, f'train.{side}.offsets')}: does not span its ids")
        if self.offsets["src"].size != self.offsets["tgt"].size:
            raise ValueError(f"{where}: the source and target arrays hold different sentence counts")
        self.tokenizers = {}
        for side in SIDES:
            file = os.path.join(where, f"{side}_tokenizer.json")
            with open(file, encoding="utf-8") as f:
                self.tokenizers[side] = tokenizer_from_json(f.read(), source=file)
        self.dev = []
        with open(os.path.join(where, "dev.jsonl"), encoding="utf-8") as f:
            for line in f:
                src, tgt = json.loads(line)
                self.dev.append((src, tgt))

    def __len__(self):
        """The training pairs."""
        return self.offsets["src"].size - 1

    @property
    def src_tokenizer(self):
        return self.tokenizers["src"]

    @property
    def tgt_tokenizer(self):
        return self.tokenizers["tgt"]

    @property
    def pairs_fingerprint(self):
        return self.manifest["pairs_fingerprint"]

    def sentence(self, side, index):
        """Training sentence `index`'s ids on `side` (a view of the mapped array)."""
        offsets = self.offsets[side]
        return self.ids[side][offsets[index]:offsets[index + 1]]

    def lengths(self, side, chunk=1 << 22):
        """int32 lengths of every training sentence on `side`, computed a chunk at a time (no int64
        copy of the offsets in memory)."""
        offsets, out = self.offsets[side], np.empty(len(self), dtype=np.int32)
        for start in range(0, len(self), chunk):
            stop = min(start + chunk, len(self))
            out[start:stop] = np.diff(offsets[start:stop + 1])
        return out
