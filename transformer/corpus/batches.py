"""Batches by length from a prepared corpus's offsets, with numpy: no Python object per sentence.

The same batches as data.length_batches builds from lists of examples (section 5.1 of the paper:
"sentence pairs were batched together by approximate sequence length"), drawn the same way from
(seed, epoch): a pair's length is max(source, 1 + target) ids, pairs are sorted by length with a
seeded jitter to order equal lengths, cut greedily into batches of at most `batch_tokens` counted
as rows x longest, and the batches shuffled. A resumed run, or another rank, sees the same ones.
"""
import math

import numpy as np

from ..bpe_dropout import BPEDropout, check_rate
from .store import PreparedCorpus


# a third seed word for the curriculum's draws: its generators are not those of an epoch ([seed, epoch])
CURRICULUM_STREAM = 0x43555252


def _index_dtype(n):
    return np.int32 if n < 2**31 else np.int64


def pack_sorted(sorted_lengths, max_tokens):
    """Batch boundaries (int64, from 0 to n) over lengths sorted ascending: a batch takes rows while
    rows x the longest stays within max_tokens, and always takes its first row."""
    n = sorted_lengths.size
    bounds, start = [0], 0
    while start < n:
        cap = int(max_tokens // int(sorted_lengths[start]))   # a batch from here has at most cap rows
        window = sorted_lengths[start + 1:start + max(cap, 1)]
        fits = window * np.arange(2, window.size + 2, dtype=np.int64) <= max_tokens
        start += 1 + (window.size if fits.all() else int(np.argmin(fits)))
        bounds.append(start)
    return np.asarray(bounds, dtype=np.int64)


class EpochBatches:
    """One epoch's batches: batch i is the positions order[bounds[k]:bounds[k + 1]], k = perm[i]."""

    def __init__(self, order, bounds, perm):
        self.order, self.bounds, self.perm = order, bounds, perm

    def __len__(self):
        return self.perm.size

    def __getitem__(self, i):
        k = int(self.perm[i])
        return self.order[self.bounds[k]:self.bounds[k + 1]]


def length_batches(lengths, max_tokens, seed=0, epoch=0, shuffle=True):
    """data.length_batches on an array of lengths: the same batches, as an EpochBatches."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, float, np.integer, np.floating)):
        raise TypeError(f"max_tokens must be a number, got {type(max_tokens).__name__}")
    if not max_tokens >= 1:   # NaN too
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    rng = np.random.default_rng([seed, epoch])
    n = lengths.size
    jitter = rng.random(n) if shuffle else np.zeros(n)
    order = np.lexsort((jitter, lengths)).astype(_index_dtype(n))
    del jitter
    bounds = pack_sorted(lengths[order], max_tokens)
    perm = np.arange(bounds.size - 1)
    if shuffle:
        rng.shuffle(perm)          # the very permutation rng.shuffle gives a list of batches
    return EpochBatches(order, bounds, perm)


class TrainingSet:
    """The training pairs of a PreparedCorpus as the trainer reads them: those that fit the model
    (both sides non-empty, at most max_tokens source ids and max_tokens - 1 target ids, as
    train_on_data has always kept them), batched by length per epoch, padded into arrays."""

    def __init__(self, corpus, max_tokens, batch_tokens, seed, bos_id, eos_id, pad_id, bpe_dropout=0.0):
        if not isinstance(corpus, PreparedCorpus):
            raise TypeError(f"corpus must be a PreparedCorpus, got {type(corpus).__name__}")
        self.corpus = corpus
        self.max_tokens = max_tokens
        self.bpe_dropout = check_rate(bpe_dropout, "bpe_dropout")
        # BPE-dropout: the merges of each side's vocabulary (ValueError for one that is not BPE)
        self.segmenters = ({side: BPEDropout(tok) for side, tok in corpus.tokenizers.items()}
                           if self.bpe_dropout else None)
        self.batch_tokens, self.seed = batch_tokens, seed
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        src_len, tgt_len = corpus.lengths("src"), corpus.lengths("tgt")
        keep = (src_len > 0) & (tgt_len > 0) & (src_len <= max_tokens) & (tgt_len + 1 <= max_tokens)
        self.rows = np.flatnonzero(keep).astype(_index_dtype(len(corpus)))   # position -> pair
        self.lengths = np.maximum(src_len[keep], tgt_len[keep] + 1)
        self.dropped = len(corpus) - self.rows.size
        self._epoch = None

    def __len__(self):
        return self.rows.size

    def batches(self, epoch):
        """The batches of `epoch` (the last epoch asked for is kept). With bpe_dropout they are
        packed by the lengths of the epoch's own segmentations, so that a batch holds batch_tokens
        as it does without (packed by the plain lengths, they would hold a quarter more ids at 0.1,
        and half again as many with padding)."""
        if self._epoch is None or self._epoch[0] != epoch:
            self._epoch = None      # one epoch's arrays in memory at a time
            lengths = self.drawn_lengths(epoch) if self.bpe_dropout else self.lengths
            self._epoch = (epoch, length_batches(lengths, self.batch_tokens, seed=self.seed, epoch=epoch))
        return self._epoch[1]

    def drawn_lengths(self, epoch, chunk=1 << 16):
        """Every kept pair's length, max(source, 1 + target), as pass `epoch` segments it with
        BPE-dropout (segment's draws, made in C `chunk` pairs at a time: only lengths are kept)."""
        sides = {}
        for side in ("src", "tgt"):
            offsets, full = self.corpus.offsets[side], np.empty(len(self.corpus), dtype=np.int32)
            for start in range(0, full.size, chunk):
                stop = min(start + chunk, full.size)
                full[start:stop] = self.segmenters[side].segment_many(
                    self.corpus.ids[side], offsets[start:stop + 1], self.bpe_dropout, self.seed, epoch, side,
                    np.arange(start, stop), lengths_only=True)
            plain, drawn = self.corpus.lengths(side)[self.rows], full[self.rows]
            limit = self.max_tokens if side == "src" else self.max_tokens - 1
            sides[side] = np.where(drawn <= limit, drawn, plain)    # too long: the plain one (segment)
        return np.maximum(sides["src"], sides["tgt"] + 1)

    def curriculum_batch(self, step, competence):
        """The batch of `step` in a length curriculum (training/curriculum.py): one of epoch 0's batches
        that hold only the shortest `competence` share of the pairs (or its shortest batch), drawn
        uniformly from (seed, step), so that a resumed run and every rank draw the same one. Epoch 0's
        batches are packed from the pairs sorted by length: the first k of them in that order are the
        shortest pairs, and nothing is sorted or copied per step."""
        epoch = self.batches(0)
        shortest = math.ceil(competence * len(self))
        # batch k (in length order) holds positions order[bounds[k]:bounds[k + 1]]
        count = max(1, int(np.searchsorted(epoch.bounds, shortest, side="right")) - 1)
        k = int(np.random.default_rng([self.seed, step, CURRICULUM_STREAM]).integers(count))
        return epoch.order[epoch.bounds[k]:epoch.bounds[k + 1]]

    def collate(self, positions, epoch=0):
        """(src, tgt_in, tgt_out) int64 arrays of the pairs at `positions`, padded with pad_id:
        the decoder reads BOS + y and predicts y + EOS (teacher forcing, section 3.1). With
        bpe_dropout, each sentence is segmented anew for `epoch` (segment)."""
        rows = self.rows[np.asarray(positions, dtype=np.int64)]
        ids, offsets = self.corpus.ids, self.corpus.offsets
        src = [ids["src"][offsets["src"][r]:offsets["src"][r + 1]] for r in rows]
        tgt = [ids["tgt"][offsets["tgt"][r]:offsets["tgt"][r + 1]] for r in rows]
        if self.bpe_dropout:
            src, tgt = self.segment("src", rows, src, epoch), self.segment("tgt", rows, tgt, epoch)
        src_width = max((len(s) for s in src), default=0)
        tgt_width = max((len(t) for t in tgt), default=0) + 1
        src_out = np.full((rows.size, src_width), self.pad_id, dtype=np.int64)
        tgt_in = np.full((rows.size, tgt_width), self.pad_id, dtype=np.int64)
        tgt_out = np.full((rows.size, tgt_width), self.pad_id, dtype=np.int64)
        for b, (s, t) in enumerate(zip(src, tgt)):
            src_out[b, :len(s)] = s
            tgt_in[b, 0] = self.bos_id
            tgt_in[b, 1:len(t) + 1] = t
            tgt_out[b, :len(t)] = t
            tgt_out[b, len(t)] = self.eos_id
        return src_out, tgt_in, tgt_out

    def segment(self, side, rows, plain, epoch):
        """Pairs `rows`' `side` (their plain ids, a list of arrays) as pass `epoch` sees them with
        BPE-dropout (Provilkov et al., 2020): each drawn from (seed, epoch, side, row) alone, so any
        order, rank or resumed run draws the same (bpe_dropout.BPEDropout.segment_many, in C). A
        segmentation longer than the model takes (source max_tokens, target max_tokens - 1, as the
        plain ones were kept) gives way to the plain one."""
        offsets = np.zeros(len(plain) + 1, dtype=np.int64)
        np.cumsum([len(ids) for ids in plain], out=offsets[1:])
        ids = np.concatenate(plain) if len(plain) else self.corpus.ids[side][:0]
        drawn, at = self.segmenters[side].segment_many(ids, offsets, self.bpe_dropout, self.seed, epoch, side, rows)
        limit = self.max_tokens if side == "src" else self.max_tokens - 1
        return [drawn[at[k]:at[k + 1]] if at[k + 1] - at[k] <= limit else plain[k] for k in range(len(plain))]
