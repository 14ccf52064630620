"""The cache of prepared corpora that `train --data FILE` keeps: one directory per (inputs' bytes,
settings), under $TRANSFORMER_CACHE/prepared (default ~/.cache/transformer-cpu/prepared).

A run finds the directory whose manifest has the inputs' fingerprint and the same settings, and
reuses it; anything else (other bytes, another split, another vocabulary) is prepared again,
never silently reused. A cached directory that no longer checks out (store.PreparedCorpus) is
prepared again over it, with a line saying so.
"""
import hashlib
import json
import os
import re
import shutil

from .. import datasets
from ..data import ReadReport
from . import preparation as preparing
from .sources import fingerprint
from .store import PreparedCorpus, read_manifest


def cache_root():
    return os.path.join(datasets.cache_dir(), "prepared")


def _stem(inputs):
    name = os.path.basename(inputs[0].files[0])
    for suffix in (".gz", ".tsv", ".txt"):
        if name.endswith(suffix):
            name = name[:-len(suffix)]
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:48] or "corpus"


def _same_split(manifest, settings):
    held = manifest["settings"]
    return all(held.get(key) == settings[key] for key in ("inputs", "dev_fraction", "dev_max"))


def lookup(fp, settings, tokenizers=None):
    """The cached directory prepared from these bytes with these settings (with `tokenizers`: one
    encoded with exactly them, whatever vocabulary settings made it), or None."""
    root = cache_root()
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return None
    digest = preparing.tokenizers_digest(tokenizers) if tokenizers is not None else None
    for name in names:
        path = os.path.join(root, name)
        if name.startswith("."):
            continue
        try:
            manifest = read_manifest(path)
        except (OSError, ValueError):
            continue
        if manifest["fingerprint"] != fp or not _same_split(manifest, settings):
            continue
        if digest is not None and manifest.get("tokenizers_sha256") == digest:
            return path
        if digest is None and manifest["settings"].get("bpe") == settings.get("bpe"):
            return path
    return None


def find_or_prepare(inputs, *, dev_fraction, dev_max, vocab_size=None, bpe_sample=preparing.BPE_SAMPLE_PAIRS,
                    tokenizers=None, progress=False, log=None):
    """The PreparedCorpus of `inputs` with these settings: the cached one, or a new one prepared
    into the cache. log(message) hears what was found or done."""
    log = log or (lambda message: None)
    fp, files = fingerprint(inputs)
    settings = preparing.settings_of(inputs, dev_fraction, dev_max, vocab_size, bpe_sample, tokenizers)
    found = lookup(fp, settings, tokenizers)
    if found is not None:
        try:
            corpus = PreparedCorpus(found)
            for entry in corpus.manifest["inputs"]:
                report = ReadReport(entry["path"], kept=entry["kept"], skipped=entry["skipped"],
                                    first_skipped=entry.get("first_skipped", {}), header=entry["header"])
                log(report.summary())
            counts = corpus.manifest["counts"]
            log(f"split: {counts['train']} training pairs, {counts['dev']} held out for evaluation "
                f"(prepared before, in {found})")
            return corpus
        except (OSError, ValueError) as exc:
            log(f"the prepared copy in {found} is damaged ({exc}): preparing it again")
            shutil.rmtree(found, ignore_errors=True)
    key = hashlib.sha256(json.dumps([fp, settings], sort_keys=True).encode()).hexdigest()[:16]
    out = os.path.join(cache_root(), f"{_stem(inputs)}-{key}")
    path = preparing.prepare(inputs, out, dev_fraction=dev_fraction, dev_max=dev_max, vocab_size=vocab_size,
                             bpe_sample=bpe_sample, tokenizers=tokenizers, overwrite=True, progress=progress,
                             log=log, known=(fp, files))
    return PreparedCorpus(path)
