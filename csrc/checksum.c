/* checksum64 (checksum.h). */
#include "checksum.h"
#include "cpu.h"

#include <string.h>

#define CHUNK (1L << 20)                      /* bytes per chunk: the unit of work of a thread */
#define GOLDEN 0x9E3779B97F4A7C15ull
#define ODD 0xff51afd7ed558ccdull

static uint64_t chunk_sum(const unsigned char *p, size_t bytes, uint64_t first_word)
{
    uint64_t h = 0;
    size_t words = bytes / 8;
    for (size_t i = 0; i < words; i++) {
        uint64_t w;
        memcpy(&w, p + 8 * i, 8);
        h += (w ^ ((first_word + i) * GOLDEN)) * ODD;
    }
    if (bytes % 8) {                           /* the tail, zero-padded, as one more word */
        uint64_t w = 0;
        memcpy(&w, p + 8 * words, bytes % 8);
        h += (w ^ ((first_word + words) * GOLDEN)) * ODD + (uint64_t)(bytes % 8);
    }
    return h;
}

uint64_t checksum64(const void *data, size_t bytes)
{
    const unsigned char *p = (const unsigned char *)data;
    const long chunks = (long)((bytes + CHUNK - 1) / CHUNK);
    uint64_t total = (uint64_t)bytes * GOLDEN;
#pragma omp parallel for num_threads(tf_team(chunks, 4)) schedule(static) reduction(+ : total)
    for (long c = 0; c < chunks; c++) {
        size_t start = (size_t)c * CHUNK;
        size_t n = bytes - start < (size_t)CHUNK ? bytes - start : (size_t)CHUNK;
        uint64_t h = chunk_sum(p + start, n, start / 8);
        total += (h ^ ((uint64_t)c * ODD)) * GOLDEN;   /* chunk order matters */
    }
    return total;
}
