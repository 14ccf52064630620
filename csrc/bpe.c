/* BPE-dropout's segmentation (bpe.h). Sentences are independent, each with its own random stream,
 * so they run in parallel in any order and give the same ids at any thread count. */
#include "bpe.h"

#include <stdlib.h>
#include <string.h>

#include "cpu.h"

/* ---- CPython's Mersenne Twister (Modules/_randommodule.c, after Matsumoto and Nishimura) ---- */

#define MT_N 624
#define MT_M 397

typedef struct {
    uint32_t mt[MT_N];
    int index;
} mt_state;

static void mt_init_genrand(mt_state *s, uint32_t seed)
{
    s->mt[0] = seed;
    for (int i = 1; i < MT_N; i++)
        s->mt[i] = 1812433253U * (s->mt[i - 1] ^ (s->mt[i - 1] >> 30)) + (uint32_t)i;
    s->index = MT_N;
}

/* random.Random(key): init_by_array over the key's little-endian 32-bit words */
static void mt_init_by_array(mt_state *s, const uint32_t *key, int len)
{
    uint32_t *mt = s->mt;
    mt_init_genrand(s, 19650218U);
    int i = 1, j = 0;
    for (int k = MT_N > len ? MT_N : len; k; k--) {
        mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525U)) + key[j] + (uint32_t)j;
        i++, j++;
        if (i >= MT_N) { mt[0] = mt[MT_N - 1]; i = 1; }
        if (j >= len) j = 0;
    }
    for (int k = MT_N - 1; k; k--) {
        mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1566083941U)) - (uint32_t)i;
        i++;
        if (i >= MT_N) { mt[0] = mt[MT_N - 1]; i = 1; }
    }
    mt[0] = 0x80000000U;
}

static uint32_t mt_next(mt_state *s)
{
    static const uint32_t mag01[2] = {0U, 0x9908b0dfU};
    uint32_t *mt = s->mt, y;
    if (s->index >= MT_N) {
        int k;
        for (k = 0; k < MT_N - MT_M; k++) {
            y = (mt[k] & 0x80000000U) | (mt[k + 1] & 0x7fffffffU);
            mt[k] = mt[k + MT_M] ^ (y >> 1) ^ mag01[y & 1U];
        }
        for (; k < MT_N - 1; k++) {
            y = (mt[k] & 0x80000000U) | (mt[k + 1] & 0x7fffffffU);
            mt[k] = mt[k + (MT_M - MT_N)] ^ (y >> 1) ^ mag01[y & 1U];
        }
        y = (mt[MT_N - 1] & 0x80000000U) | (mt[0] & 0x7fffffffU);
        mt[MT_N - 1] = mt[MT_M - 1] ^ (y >> 1) ^ mag01[y & 1U];
        s->index = 0;
    }
    y = mt[s->index++];
    y ^= (y >> 11);
    y ^= (y << 7) & 0x9d2c5680U;
    y ^= (y << 15) & 0xefc60000U;
    y ^= (y >> 18);
    return y;
}

/* random.random(): 53 bits, as CPython makes them */
static double mt_random(mt_state *s)
{
    uint32_t a = mt_next(s) >> 5, b = mt_next(s) >> 6;
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

/* ---- the merges ------------------------------------------------------------------------------ */

static inline uint64_t merge_slot(uint64_t key, uint64_t mask)
{
    return ((key * 0x9E3779B97F4A7C15ULL) >> 32) & mask;
}

void bpe_merges_insert(uint64_t *keys, int32_t *ranks, int32_t *merged, uint64_t mask,
                       int32_t left, int32_t right, int32_t rank, int32_t merged_id)
{
    uint64_t key = (((uint64_t)(uint32_t)left << 32) | (uint32_t)right) + 1;
    for (uint64_t h = merge_slot(key, mask);; h = (h + 1) & mask) {
        if (keys[h] == key) return;
        if (keys[h] == 0) {
            keys[h] = key, ranks[h] = rank, merged[h] = merged_id;
            return;
        }
    }
}

/* the slot of the merge (left, right), or -1 */
static inline int64_t merge_find(const uint64_t *keys, uint64_t mask, int32_t left, int32_t right)
{
    uint64_t key = (((uint64_t)(uint32_t)left << 32) | (uint32_t)right) + 1;
    for (uint64_t h = merge_slot(key, mask);; h = (h + 1) & mask) {
        if (keys[h] == key) return (int64_t)h;
        if (keys[h] == 0) return -1;
    }
}

typedef struct {
    const uint64_t *keys;
    const int32_t *ranks, *merged;
    uint64_t mask;
} merges_t;

/* BPE on one word's symbols (sym[0:n], merged in place) with dropout p; returns the new length.
 * slot[i]: scratch, the merge of the pair (sym[i], sym[i + 1]) or -1. Each turn takes the pairs
 * in (rank, position) order and draws for each until one is not skipped; a turn that skips them
 * all ends the word (bpe_dropout.BPEDropout._merge_word). */
static long merge_word(const merges_t *m, int32_t *sym, long n, int64_t *slot, double p,
                       mt_state *rng, int *seeded, const uint32_t *key, int keylen)
{
    while (n > 1) {
        for (long i = 0; i + 1 < n; i++) slot[i] = merge_find(m->keys, m->mask, sym[i], sym[i + 1]);
        int32_t last_rank = -1;
        long last_i = -1, chosen = -1;
        for (;;) {
            long best = -1;
            int32_t best_rank = 0;
            for (long i = 0; i + 1 < n; i++) {
                if (slot[i] < 0) continue;
                int32_t r = m->ranks[slot[i]];
                if (r < last_rank || (r == last_rank && i <= last_i)) continue;   /* already skipped */
                if (best < 0 || r < best_rank) best = i, best_rank = r;
            }
            if (best < 0) break;                  /* every merge left was skipped */
            if (p > 0) {
                if (!*seeded) { mt_init_by_array(rng, key, keylen); *seeded = 1; }
                if (mt_random(rng) < p) { last_rank = best_rank, last_i = best; continue; }
            }
            chosen = best;
            break;
        }
        if (chosen < 0) break;
        sym[chosen] = m->merged[slot[chosen]];
        memmove(sym + chosen + 1, sym + chosen + 2, (size_t)(n - chosen - 2) * sizeof *sym);
        n--;
    }
    return n;
}

static inline int32_t read_id(const void *ids, int ids_bytes, int64_t k)
{
    return ids_bytes == 2 ? (int32_t)((const uint16_t *)ids)[k] : ((const int32_t *)ids)[k];
}

int bpe_dropout_segment(const void *ids, int ids_bytes, const int64_t *offsets, long n,
                        const int32_t *chars_off, const int32_t *chars, const uint8_t *starts,
                        long vocab_n, const uint64_t *keys_table, const int32_t *ranks,
                        const int32_t *merged, uint64_t mask, const uint32_t *keys,
                        const int32_t *keylen, double p, int32_t *out, const int64_t *out_at,
                        int64_t *lens)
{
    merges_t m = {keys_table, ranks, merged, mask};
    int failed = 0;
    int team = tf_team(n * 64, 256);
    #pragma omp parallel num_threads(team) reduction(|:failed)
    {
        int32_t *sym = NULL;
        int64_t *slot = NULL;
        long cap = 0;
        mt_state *rng = malloc(sizeof *rng);
        if (!rng) failed = 1;
        #pragma omp for schedule(dynamic, 16)
        for (long s = 0; s < n; s++) {
            if (failed) continue;
            long need = 0;       /* the sentence's characters: room for any word of it */
            for (int64_t k = offsets[s]; k < offsets[s + 1]; k++) {
                int32_t id = read_id(ids, ids_bytes, k);
                need += (id >= 0 && id < vocab_n) ? chars_off[id + 1] - chars_off[id] : 1;
            }
            if (need > cap) {
                int32_t *ns = realloc(sym, (size_t)need * sizeof *sym);
                if (ns) sym = ns;
                int64_t *nl = ns ? realloc(slot, (size_t)need * sizeof *slot) : NULL;
                if (nl) slot = nl;
                if (!ns || !nl) { failed = 1; continue; }
                cap = need;
            }
            int seeded = 0;
            int64_t written = 0;
            long w = 0;          /* the word so far: sym[0:w] */
            for (int64_t k = offsets[s]; k <= offsets[s + 1]; k++) {
                int end = k == offsets[s + 1];
                int32_t id = end ? 0 : read_id(ids, ids_bytes, k);
                int known = !end && id >= 0 && id < vocab_n;
                if (w && (end || (known && starts[id]))) {
                    w = merge_word(&m, sym, w, slot, p, rng, &seeded, keys + 4 * s, keylen[s]);
                    if (out) memcpy(out + out_at[s] + written, sym, (size_t)w * sizeof *sym);
                    written += w;
                    w = 0;
                }
                if (end) break;
                if (known) {
                    for (int32_t c = chars_off[id]; c < chars_off[id + 1]; c++) sym[w++] = chars[c];
                } else {
                    sym[w++] = id;
                }
            }
            lens[s] = written;
        }
        free(sym);
        free(slot);
        free(rng);
    }
    return failed ? -1 : 0;
}
