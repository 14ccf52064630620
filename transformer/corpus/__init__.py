"""Corpora of any size: read once as a stream into a prepared directory of memory-mapped token-id
arrays (fairseq's binarized datasets, nanoGPT's flat memmap), then trained on from the arrays.

    sources.py      the inputs: tab-separated files, OPUS's aligned text files; their fingerprints
    preparation.py  the two passes: scan (split, counts, BPE sample) and encode (ids to arrays)
    store.py        the directory's format: manifest, arrays, atomic writing, checked loading
    cache.py        `train --data FILE`'s cache of prepared directories, keyed by bytes and settings
    batches.py      batches by length from the offsets, with numpy, as the trainer reads them
"""
from .batches import TrainingSet, length_batches
from .cache import cache_root, find_or_prepare
from .preparation import BPE_SAMPLE_PAIRS, prepare
from .sources import AlignedInput, TsvInput, make_inputs
from .store import PreparedCorpus, is_prepared, read_manifest

__all__ = ["AlignedInput", "BPE_SAMPLE_PAIRS", "PreparedCorpus", "TrainingSet", "TsvInput", "cache_root",
           "find_or_prepare", "is_prepared", "length_batches", "make_inputs", "prepare", "read_manifest"]
