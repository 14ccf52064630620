/* checksum64 (checksum.h). */
#include "checksum.h"
#include "cpu.h"

#include <stdlib.h>
#include <string.h>

#define CHUNK (1L << 20)                      /* bytes per chunk: the unit of the definition */
#define PIECE (1L << 18)                      /* bytes per piece: the unit of work of a thread */
#define GOLDEN 0x9E3779B97F4A7C15ull
#define ODD 0xff51afd7ed558ccdull

/* Words [first_word, first_word + bytes / 8) of the definition (and the zero-padded tail, when
 * `bytes` is not a multiple of 8). (first_word + i) * GOLDEN advances by additions (the same
 * value mod 2^64), and four words at a time go to four sums: one multiply per word, and the
 * loop's own instructions once per four words (one Zen 2 core: 17 GB/s from cache, 13 a word
 * at a time; from memory 10.5 against 9.8). */
static uint64_t piece_sum(const unsigned char *p, size_t bytes, uint64_t first_word)
{
    uint64_t h = 0, g = first_word * GOLDEN;
    size_t words = bytes / 8, i = 0;
    uint64_t h0 = 0, h1 = 0, h2 = 0, h3 = 0, g0 = g, g1 = g + GOLDEN, g2 = g + 2 * GOLDEN, g3 = g + 3 * GOLDEN;
    for (; i + 4 <= words; i += 4) {
        uint64_t w[4];
        memcpy(w, p + 8 * i, sizeof w);
        h0 += (w[0] ^ g0) * ODD;
        h1 += (w[1] ^ g1) * ODD;
        h2 += (w[2] ^ g2) * ODD;
        h3 += (w[3] ^ g3) * ODD;
        g0 += 4 * GOLDEN;
        g1 += 4 * GOLDEN;
        g2 += 4 * GOLDEN;
        g3 += 4 * GOLDEN;
    }
    h = h0 + h1 + h2 + h3;
    g = g0;
    for (; i < words; i++, g += GOLDEN) {
        uint64_t w;
        memcpy(&w, p + 8 * i, 8);
        h += (w ^ g) * ODD;
    }
    if (bytes % 8) {                           /* the tail, zero-padded, as one more word */
        uint64_t w = 0;
        memcpy(&w, p + 8 * words, bytes % 8);
        h += (w ^ g) * ODD + (uint64_t)(bytes % 8);
    }
    return h;
}

static uint64_t combine(uint64_t total, uint64_t chunk_sum, long c)
{
    return total + (chunk_sum ^ ((uint64_t)c * ODD)) * GOLDEN;   /* chunk order matters */
}

uint64_t checksum64(const void *data, size_t bytes)
{
    const unsigned char *p = (const unsigned char *)data;
    const long chunks = (long)((bytes + CHUNK - 1) / CHUNK), pieces = (long)((bytes + PIECE - 1) / PIECE);
    uint64_t total = (uint64_t)bytes * GOLDEN;
    const int threads = tf_team(pieces, 2);
    /* A chunk's sum is a sum mod 2^64, so its pieces may be added in any order, by any thread:
     * the value does not depend on the thread count. */
    uint64_t *sums = threads > 1 ? calloc((size_t)chunks, sizeof *sums) : NULL;
    if (!sums) {                               /* one thread (or no memory for the sums) */
        for (long c = 0; c < chunks; c++) {
            size_t start = (size_t)c * CHUNK, n = bytes - start < (size_t)CHUNK ? bytes - start : (size_t)CHUNK;
            total = combine(total, piece_sum(p + start, n, start / 8), c);
        }
        return total;
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long q = 0; q < pieces; q++) {
        size_t start = (size_t)q * PIECE, n = bytes - start < (size_t)PIECE ? bytes - start : (size_t)PIECE;
        __atomic_fetch_add(&sums[start / CHUNK], piece_sum(p + start, n, start / 8), __ATOMIC_RELAXED);
    }
    for (long c = 0; c < chunks; c++) total = combine(total, sums[c], c);
    free(sums);
    return total;
}
