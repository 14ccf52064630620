/* BPE-dropout's segmentation in C (transformer/bpe_dropout.py is the reference it equals, id for
 * id): a sentence's plain ids go back to their words' characters, and each word is merged again,
 * lowest rank first, leftmost on ties, each merge skipped with probability p when its turn comes.
 * The draws are CPython's random.Random(key).random() (MT19937 seeded by init_by_array), so a
 * sentence drawn here equals the Python replay with dropout_rng's key. */
#ifndef TF_BPE_H
#define TF_BPE_H

#include <stdint.h>

/* The merges as an open-addressed table of size mask + 1 (a power of two, at least twice the
 * merges): keys[h] = ((left << 32) | right) + 1, 0 where empty. Inserting a pair already there
 * keeps the first (the lowest rank, as merges are inserted in rank order). */
void bpe_merges_insert(uint64_t *keys, int32_t *ranks, int32_t *merged, uint64_t mask,
                       int32_t left, int32_t right, int32_t rank, int32_t merged_id);

/* Segment sentences [0, n): sentence s is ids[offsets[s]:offsets[s + 1]] (ids_bytes 2: uint16,
 * 4: int32, or uint32 below 2**31). An id < vocab_n goes back to
 * chars[chars_off[id]:chars_off[id + 1]] and begins a word where starts[id]; any other id stays
 * whole and does not. keys[4 s .. 4 s + keylen[s]) are the little-endian 32-bit words of the
 * sentence's random.Random seed. lens[s] gets the length of the segmentation, and out the ids
 * from out[out_at[s]], where the caller leaves room for the sentence's characters (a
 * segmentation is never longer); out NULL: lengths only (out_at unread, may be NULL).
 * Returns 0, or -1 if scratch memory could not be allocated. */
int bpe_dropout_segment(const void *ids, int ids_bytes, const int64_t *offsets, long n,
                        const int32_t *chars_off, const int32_t *chars, const uint8_t *starts,
                        long vocab_n, const uint64_t *keys_table, const int32_t *ranks,
                        const int32_t *merged, uint64_t mask, const uint32_t *keys,
                        const int32_t *keylen, double p, int32_t *out, const int64_t *out_at,
                        int64_t *lens);

#endif
