"""Preparing a corpus: two passes over the inputs as streams, never the whole corpus in memory.

Pass 1 (scan) reads every pair once: the skipped lines counted, the train/dev split decided (the
same split as data.split_pairs: by a hash of the source sentence, the first `dev_max` of those
under `dev_fraction` held out and the rest of those trained on after the others), the words
counted for the vocabulary's size, and a deterministic sample of the training pairs kept for
BPE: all of them when there are at most `bpe_sample`, else the `bpe_sample` of smallest hash
(bottom-k), the way Marian learns its SentencePiece vocabulary from --sentencepiece-max-lines.

Pass 2 (encode) reads the pairs again and encodes the training pairs a chunk at a time with the
tokenizer's batch encoder (its threads use every core), appending their ids to the arrays of
store.py. Both passes hash the bytes they read; an input whose bytes differ from those it was
fingerprinted by (it changed while it was prepared) is an error, and nothing is kept.

So a small corpus gets exactly what `train --data` has always built: the same split, the same
BPE vocabularies (learned on every training pair), the same training pairs in the same order.
"""
import hashlib
import heapq
import itertools
import json
import os
import shutil
import sys
import time

import numpy as np

from .. import __version__
from ..config import BPE_SAMPLE_PAIRS, MAX_VOCAB, MIN_VOCAB, VOCAB_WORDS_PER_ENTRY
from ..tokenizer import SubwordTokenizer
from . import store
from .sources import fingerprint

MIN_FREQUENCY = 2          # SubwordTokenizer.train's default, recorded in the settings
CHUNK_PAIRS = 16384        # pairs encoded in one call of the batch encoder


def vocab_size_for_words(words):
    """The BPE vocabulary size per language for a corpus of `words` words a side (the mean of the two
    sides' words) when --vocab-size is left out: one entry per VOCAB_WORDS_PER_ENTRY words,
    rounded down to a multiple of 500, within [MIN_VOCAB, MAX_VOCAB]."""
    size = int(words // VOCAB_WORDS_PER_ENTRY) // 500 * 500
    return min(MAX_VOCAB, max(MIN_VOCAB, size))


class _Split:
    """Which side of the split each pair falls on, pair by pair, as data.split_pairs decides it."""

    def __init__(self, dev_fraction, dev_max):
        self.threshold = int(dev_fraction * 2**32)
        self.dev_max = dev_max
        self.candidates = 0

    def place(self, src):
        """(where, hash): "dev", "late" (under the threshold past dev_max: trained on, after the
        others) or "train"."""
        return self.place_bytes(src.encode("utf-8"))

    def place_bytes(self, src_bytes):
        """place() of a source sentence already encoded as UTF-8."""
        h = int.from_bytes(hashlib.blake2b(src_bytes, digest_size=4).digest(), "little")
        if h >= self.threshold:
            return "train", h
        self.candidates += 1
        return ("dev" if self.candidates <= self.dev_max else "late"), h


class _Progress:
    """A tqdm bar, or nothing."""

    def __init__(self, show, **kw):
        self.bar = None
        if show:
            from tqdm import tqdm

            self.bar = tqdm(file=sys.stderr, dynamic_ncols=True, mininterval=0.5, **kw)

    def update(self, n):
        if self.bar is not None:
            self.bar.update(n)

    def close(self):
        if self.bar is not None:
            self.bar.close()


class _Reading:
    """One pass over the inputs: their pairs in order, every file's bytes hashed as they are read,
    and then the check that those are the bytes the corpus was fingerprinted by."""

    def __init__(self, inputs, files):
        self.inputs, self.files = inputs, files
        self.reports = [item.reports()[0] for item in inputs]
        self.digests = [hashlib.sha256() for item in inputs for _ in item.files]

    def pairs(self, on_bytes=None):
        digests = iter(self.digests)
        for item, report in zip(self.inputs, self.reports):
            yield from item.pairs(report, [next(digests) for _ in item.files], on_bytes)
        self.check_unchanged()

    def check_unchanged(self):
        """A file changed while it was being prepared is an error (nothing is kept)."""
        paths = [path for item in self.inputs for path in item.files]
        for path, digest, entry in zip(paths, self.digests, self.files):
            size = os.path.getsize(path)
            if digest.hexdigest() != entry["sha256"] or size != entry["bytes"]:
                raise ValueError(f"{path}: changed while it was being prepared ({entry['bytes']} bytes when "
                                 f"preparation began, {size} now, other contents): nothing was kept; prepare "
                                 "it again once it is complete")


def scan(inputs, files, dev_fraction, dev_max, bpe_sample, want_sample=True, progress=False):
    """Pass 1. Returns a dict: reports, pairs, train, dev, words (mean of the sides' words over the
    training pairs), pairs_fingerprint (data.py's fingerprint of the pairs), sample (training
    pairs for BPE, in corpus order; empty unless want_sample)."""
    reading = _Reading(inputs, files)
    total_bytes = sum(entry["bytes"] for entry in files)
    bar = _Progress(progress, total=total_bytes, unit="B", unit_scale=True, desc="reading")
    split = _Split(dev_fraction, dev_max)
    pairs_digest = hashlib.sha256()
    heap = []                      # bottom-k: (-hash, -ordinal, source, target), the largest on top
    words = train = dev = 0
    update = pairs_digest.update
    for ordinal, (src, tgt) in enumerate(reading.pairs(bar.update)):
        src_bytes = src.encode("utf-8")
        update(b"".join((src_bytes, b"\t", tgt.encode("utf-8"), b"\n")))
        where, h = split.place_bytes(src_bytes)
        if where == "dev":
            dev += 1
            continue
        train += 1
        words += len(src.split()) + len(tgt.split())
        if not want_sample:
            continue
        if len(heap) < bpe_sample:
            heap.append((-h, -ordinal, src, tgt))
            if len(heap) == bpe_sample:
                heapq.heapify(heap)
        elif (-h, -ordinal) > heap[0][:2]:
            heapq.heapreplace(heap, (-h, -ordinal, src, tgt))
    bar.close()
    sample = [(src, tgt) for _, _, src, tgt in sorted(heap, key=lambda entry: -entry[1])]
    return {"reports": reading.reports, "pairs": train + dev, "train": train, "dev": dev, "words": words / 2,
            "pairs_fingerprint": pairs_digest.hexdigest(), "sample": sample}


def _encode(tokenizer, texts, dtype):
    """(ids end to end as `dtype`, int64 lengths) of texts."""
    ids = tokenizer.encode_batch(texts)
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=int(lengths.sum()))
    return flat, lengths


def encode(inputs, files, tokenizers, directory, dev_fraction, dev_max, train_pairs, progress=False):
    """Pass 2: the training pairs' ids into `directory` (store.ArrayWriter), in data.split_pairs's
    order. Returns (manifest entries of the arrays, dev pairs)."""
    dtype = store.ids_dtype(max(tok.vocab_size for tok in tokenizers.values()))
    writers = {part: {side: store.ArrayWriter(directory, f"{part}.{side}", dtype) for side in store.SIDES}
               for part in ("train", "late")}
    pending = {part: ([], []) for part in writers}
    reading = _Reading(inputs, files)
    bar = _Progress(progress, total=train_pairs, unit="pairs", unit_scale=True, desc="encoding")
    split, dev = _Split(dev_fraction, dev_max), []

    def flush(part):
        texts = pending[part]
        for side, side_texts in zip(store.SIDES, texts):
            writers[part][side].append(*_encode(tokenizers[side], side_texts, dtype))
        bar.update(len(texts[0]))
        pending[part] = ([], [])

    try:
        for src, tgt in reading.pairs():
            where, _ = split.place(src)
            if where == "dev":
                dev.append((src, tgt))
                continue
            part = "late" if where == "late" else "train"
            pending[part][0].append(src)
            pending[part][1].append(tgt)
            if len(pending[part][0]) >= CHUNK_PAIRS:
                flush(part)
        for part in writers:
            flush(part)
        entries = {}
        for side in store.SIDES:          # the pairs past dev_max were trained on after the others
            main, late = writers["train"][side], writers["late"][side]
            late.close()
            main.append_writer(late)
            main.close()
            late.remove()
            entries.update(main.manifest())
        if writers["train"]["src"].count != train_pairs:
            raise ValueError(f"{inputs[0].path}: read {writers['train']['src'].count} training pairs the second "
                             f"time and {train_pairs} the first: the corpus changed while it was being prepared")
    finally:
        bar.close()
        for part in writers.values():
            for writer in part.values():
                for f in writer.files.values():
                    f.close()
    return entries, dev


def settings_of(inputs, dev_fraction, dev_max, vocab_size, bpe_sample, tokenizers=None):
    """What decides a prepared corpus besides the inputs' bytes (the cache's key with them)."""
    settings = {"inputs": [item.settings() for item in inputs], "dev_fraction": float(dev_fraction),
                "dev_max": int(dev_max)}
    if tokenizers is None:
        settings["bpe"] = {"vocab_size": vocab_size, "sample_pairs": int(bpe_sample), "min_frequency": MIN_FREQUENCY}
        if vocab_size is None:       # the rule that will choose it
            settings["bpe"]["rule"] = [VOCAB_WORDS_PER_ENTRY, MIN_VOCAB, MAX_VOCAB]
    else:
        settings["tokenizers_sha256"] = tokenizers_digest(tokenizers)
    return settings


def tokenizers_digest(tokenizers):
    """SHA-256 of the two tokenizers' JSON: equal digests encode every text alike."""
    digest = hashlib.sha256()
    for side in store.SIDES:
        digest.update(tokenizers[side].to_json().encode("utf-8") + b"\0")
    return digest.hexdigest()


def prepare(inputs, out, *, dev_fraction=0.05, dev_max=500, vocab_size=None, bpe_sample=BPE_SAMPLE_PAIRS,
            tokenizers=None, overwrite=False, progress=False, log=None, known=None):
    """Prepare `inputs` (sources.make_inputs) into the directory `out` and return its path.

    tokenizers: {"src": ..., "tgt": ...} to encode with (a model's, for fine-tuning or a resumed
    run), or None to learn BPE vocabularies of `vocab_size` entries a side (None: chosen from the
    corpus's size, vocab_size_for_words) from at most `bpe_sample` training pairs. log(message):
    what is decided along the way. known: (fingerprint, files) when the caller has them."""
    log = log or (lambda message: None)
    started = time.monotonic()
    fp, files = known or fingerprint(inputs)
    phases = {"fingerprint": time.monotonic() - started}      # seconds of each phase, for the manifest
    settings = settings_of(inputs, dev_fraction, dev_max, vocab_size, bpe_sample, tokenizers)
    tmp = store.temporary_dir(out)
    try:
        mark = time.monotonic()
        scanned = scan(inputs, files, dev_fraction, dev_max, bpe_sample, want_sample=tokenizers is None,
                       progress=progress)
        phases["scan"], mark = time.monotonic() - mark, time.monotonic()
        for report in scanned["reports"]:
            log(report.summary())
        log(f"split: {scanned['train']} training pairs, {scanned['dev']} held out for evaluation")
        if not scanned["train"]:
            raise ValueError(f"{inputs[0].path}: no training pairs left after the split (--dev-fraction "
                             f"{dev_fraction} holds out every pair)")
        bpe = {"learned": tokenizers is None}
        if tokenizers is None:
            if vocab_size is None:
                vocab_size = vocab_size_for_words(scanned["words"])
                log(f"BPE vocabulary size {vocab_size} per language: one entry per {VOCAB_WORDS_PER_ENTRY} "
                    f"words of training text, within [{MIN_VOCAB}, {MAX_VOCAB}] (--vocab-size to choose)")
            sample = scanned.pop("sample")
            if len(sample) < scanned["train"]:
                log(f"BPE learned from a sample of {len(sample):,} of the {scanned['train']:,} training pairs "
                    f"(those of smallest hash; --bpe-sample to choose)")
            tokenizers = {side: SubwordTokenizer.train([pair[i] for pair in sample], vocab_size=vocab_size,
                                                       min_frequency=MIN_FREQUENCY)
                          for i, side in enumerate(store.SIDES)}
            bpe.update(vocab_size=vocab_size, sample_pairs=len(sample))
            del sample
            log(f"BPE vocabularies: source {tokenizers['src'].vocab_size}, target {tokenizers['tgt'].vocab_size}")
        phases["bpe"], mark = time.monotonic() - mark, time.monotonic()
        arrays, dev = encode(inputs, files, tokenizers, tmp, dev_fraction, dev_max, scanned["train"],
                             progress=progress)
        phases["encode"] = time.monotonic() - mark
        manifest_files = {f"{side}_tokenizer.json": store.write_text_file(tmp, f"{side}_tokenizer.json",
                                                                          tokenizers[side].to_json())
                          for side in store.SIDES}
        manifest_files["dev.jsonl"] = store.write_text_file(
            tmp, "dev.jsonl", "".join(json.dumps([s, t], ensure_ascii=False) + "\n" for s, t in dev))
        manifest = {
            "format": store.FORMAT, "version": store.VERSION, "transformer_version": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "fingerprint": fp, "pairs_fingerprint": scanned["pairs_fingerprint"], "settings": settings,
            "inputs": [{"kind": item.kind, "path": item.path, "kept": report.kept, "skipped": report.skipped,
                        "first_skipped": report.first_skipped, "header": report.header}
                       for item, report in zip(inputs, scanned["reports"])],
            "input_files": files,
            "counts": {"pairs": scanned["pairs"], "train": scanned["train"], "dev": len(dev)},
            "bpe": bpe, "tokenizers_sha256": tokenizers_digest(tokenizers),
            "seconds": {**{name: round(value, 2) for name, value in phases.items()},
                        "total": round(time.monotonic() - started, 2)},
            "arrays": arrays, "files": manifest_files,
        }
        path = store.commit(tmp, out, manifest, overwrite=overwrite)
        seconds = time.monotonic() - started
        log(f"prepared into {path} in {seconds:.1f} s ({scanned['pairs'] / max(seconds, 1e-9):,.0f} pairs/s)")
        return path
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
