/* Packing buffers: one process-wide buffer reused across calls (no page faults per
 * call); a concurrent caller that finds it busy allocates its own. */
#include "blocks.h"

#include <stdlib.h>

static float *cached_buffer;
static size_t cached_floats;
static char cached_busy;

float *gemm_buffer_acquire(size_t floats, int *owned)
{
    size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
    if (!__atomic_test_and_set(&cached_busy, __ATOMIC_ACQUIRE)) {
        if (cached_floats < floats) {
            free(cached_buffer);
            cached_buffer = aligned_alloc(64, bytes);
            cached_floats = cached_buffer ? floats : 0;
        }
        if (cached_buffer) { *owned = 0; return cached_buffer; }
        __atomic_clear(&cached_busy, __ATOMIC_RELEASE);
    }
    *owned = 1;
    return aligned_alloc(64, bytes);
}

void gemm_buffer_release(float *buffer, int owned)
{
    if (owned) free(buffer);
    else __atomic_clear(&cached_busy, __ATOMIC_RELEASE);
}
