# BPE-dropout's segmentation (csrc/bpe.h). Included by _C.pyx.

from libc.stdint cimport uint8_t, uint32_t, int32_t, int64_t, uint64_t

cdef extern from "bpe.h" nogil:
    void c_bpe_merges_insert "bpe_merges_insert"(uint64_t *keys, int32_t *ranks, int32_t *merged, uint64_t mask,
                                                int32_t left, int32_t right, int32_t rank, int32_t merged_id)
    int c_bpe_dropout_segment "bpe_dropout_segment"(
        const void *ids, int ids_bytes, const int64_t *offsets, long n, const int32_t *chars_off,
        const int32_t *chars, const uint8_t *starts, long vocab_n, const uint64_t *keys_table,
        const int32_t *ranks, const int32_t *merged, uint64_t mask, const uint32_t *keys,
        const int32_t *keylen, double p, int32_t *out, const int64_t *out_at, int64_t *lens)


cdef class BPETables:
    """One BPE vocabulary's merges and characters, as bpe_dropout.BPEDropout reads them:
    merges (left, right, merged) int32 in rank order (a pair given twice keeps its first rank);
    chars_off int32 [vocab_n + 1] and chars int32: id's characters are
    chars[chars_off[id]:chars_off[id + 1]]; starts bool/uint8 [vocab_n]: id begins a word."""
    cdef object keys, ranks, merged, chars_off, chars, starts, char_len
    cdef uint64_t mask
    cdef readonly long vocab_n

    def __init__(self, left, right, merged, chars_off, chars, starts):
        left = np.ascontiguousarray(left, dtype=np.int32)
        right = np.ascontiguousarray(right, dtype=np.int32)
        merged = np.ascontiguousarray(merged, dtype=np.int32)
        if left.ndim != 1 or left.shape != right.shape or left.shape != merged.shape:
            raise ValueError("left, right and merged must be 1-D arrays of one length")
        self.chars_off = np.ascontiguousarray(chars_off, dtype=np.int32)
        self.chars = np.ascontiguousarray(chars, dtype=np.int32)
        self.starts = np.ascontiguousarray(starts, dtype=np.uint8)
        self.vocab_n = self.starts.size
        if self.chars_off.shape != (self.vocab_n + 1,) or self.chars_off[0] != 0 \
                or np.any(np.diff(self.chars_off) < 1) or self.chars_off[self.vocab_n] != self.chars.size:
            raise ValueError("chars_off must run from 0 to chars.size in steps of at least 1, one per id")
        self.char_len = np.diff(self.chars_off).astype(np.int64)
        size = 2
        while size < 2 * max(left.size, 1):
            size *= 2
        self.mask = size - 1
        self.keys = np.zeros(size, dtype=np.uint64)
        self.ranks = np.zeros(size, dtype=np.int32)
        self.merged = np.zeros(size, dtype=np.int32)
        cdef uint64_t[::1] kv = self.keys
        cdef int32_t[::1] rv = self.ranks, mv = self.merged, lv = left, gv = right, ov = merged
        cdef Py_ssize_t i
        for i in range(left.size):
            c_bpe_merges_insert(&kv[0], &rv[0], &mv[0], self.mask, lv[i], gv[i], <int32_t>i, ov[i])

    def segment(self, ids, offsets, keys, keylen, double p, bint lengths_only=False):
        """The segmentations of sentences ids[offsets[s]:offsets[s + 1]] (ids uint16, int32 or uint32,
        offsets int64 [n + 1]), sentence s drawn from random.Random whose seed's little-endian
        32-bit words are keys[s, :keylen[s]] (keys uint32 [n, 4], keylen int32 [n] in 1..4).
        Returns lens (int64 [n]) when lengths_only, else (ids int32, offsets int64 [n + 1])."""
        if not isinstance(ids, np.ndarray) or ids.dtype not in (np.uint16, np.int32, np.uint32) or ids.ndim != 1:
            raise TypeError("ids must be a 1-D numpy array of uint16, int32 or uint32 (ids below 2**31)")
        ids = np.ascontiguousarray(ids)
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        keys = np.ascontiguousarray(keys, dtype=np.uint32)
        keylen = np.ascontiguousarray(keylen, dtype=np.int32)
        cdef long n = offsets.size - 1
        if offsets.ndim != 1 or n < 0:
            raise ValueError("offsets must be 1-D with at least one entry")
        if n and (offsets[0] < 0 or offsets[n] > ids.size or np.any(np.diff(offsets) < 0)):
            raise ValueError("offsets must rise from >= 0 to at most ids.size")
        if keys.shape != (n, 4) or keylen.shape != (n,) or (n and (keylen.min() < 1 or keylen.max() > 4)):
            raise ValueError(f"keys must be [{n}, 4] and keylen [{n}] in 1..4")
        if not 0 <= p < 1:
            raise ValueError(f"p must be in [0, 1), got {p}")
        lens = np.zeros(n, dtype=np.int64)
        if n == 0:
            return lens if lengths_only else (np.zeros(0, np.int32), np.zeros(1, np.int64))
        cdef const int64_t[::1] atv
        cdef int32_t[::1] ov
        cdef int32_t *op = NULL
        cdef const int64_t *atp = NULL
        if not lengths_only:      # room for each sentence's characters (a segmentation is never longer)
            span = ids[offsets[0]:offsets[n]]
            per_id = np.ones(span.size, dtype=np.int64)
            inside = (span >= 0) & (span < self.vocab_n)
            per_id[inside] = self.char_len[span[inside]]
            run = np.zeros(span.size + 1, dtype=np.int64)
            np.cumsum(per_id, out=run[1:])
            out_at = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(run[offsets[1:] - offsets[0]] - run[offsets[:n] - offsets[0]], out=out_at[1:])
            out = np.empty(max(int(out_at[n]), 1), dtype=np.int32)
            atv, ov = out_at, out
            atp, op = &atv[0], &ov[0]
        cdef const unsigned char[::1] idv = ids.view(np.uint8)
        cdef const int64_t[::1] offv = offsets
        cdef const int32_t[::1] cov = self.chars_off, chv = self.chars, rv = self.ranks, mv = self.merged
        cdef const int32_t[::1] klv = keylen
        cdef const uint8_t[::1] stv = self.starts
        cdef const uint64_t[::1] kv = self.keys
        cdef const uint32_t[:, ::1] keyv = keys
        cdef int64_t[::1] lv = lens
        cdef int nbytes = ids.itemsize, rc
        cdef const void *ip = <const void *>&idv[0] if idv.shape[0] else NULL
        with nogil:
            rc = c_bpe_dropout_segment(ip, nbytes, &offv[0], n, &cov[0], &chv[0], &stv[0], self.vocab_n,
                                       &kv[0], &rv[0], &mv[0], self.mask, &keyv[0, 0], &klv[0], p, op,
                                       atp, &lv[0])
        if rc:
            raise MemoryError("BPE-dropout: no memory for a sentence's scratch")
        if lengths_only:
            return lens
        # the sentences packed: each was written at its characters' room, and is as long as lens
        offsets_out = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets_out[1:])
        keep = np.repeat(out_at[:n] - offsets_out[:n], lens) + np.arange(int(offsets_out[n]), dtype=np.int64)
        return out[keep], offsets_out
