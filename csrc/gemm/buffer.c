/* Packing buffers: a few process-wide buffers reused across calls (no page faults per call),
 * one per concurrent caller (the sentence shards of a training step run their products from
 * threads of their own: transformer/shards.py); a caller that finds every one busy allocates
 * its own. */
#include "blocks.h"

#include <stdlib.h>

#define GEMM_BUFFERS 8

static float *cached_buffer[GEMM_BUFFERS];
static size_t cached_floats[GEMM_BUFFERS];
static char cached_busy[GEMM_BUFFERS];

float *gemm_buffer_acquire(size_t floats, int *owned)
{
    size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
    for (int i = 0; i < GEMM_BUFFERS; i++) {
        if (__atomic_test_and_set(&cached_busy[i], __ATOMIC_ACQUIRE)) continue;
        if (cached_floats[i] < floats) {
            free(cached_buffer[i]);
            cached_buffer[i] = aligned_alloc(64, bytes);
            cached_floats[i] = cached_buffer[i] ? floats : 0;
        }
        if (cached_buffer[i]) { *owned = -1 - i; return cached_buffer[i]; }
        __atomic_clear(&cached_busy[i], __ATOMIC_RELEASE);
    }
    *owned = 1;
    return aligned_alloc(64, bytes);
}

void gemm_buffer_release(float *buffer, int owned)
{
    if (owned > 0) free(buffer);
    else __atomic_clear(&cached_busy[-1 - owned], __ATOMIC_RELEASE);
}
