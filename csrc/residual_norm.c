/* Residual connection + layer norm, fused (see residual_norm.h). */
#include "residual_norm.h"

#include <string.h>

#include "cpu.h"
#include "dropout.h"
#include "elementwise.h"
#include "layernorm.h"

/* Rows a thread takes in one go: s is written and read back by the layer norm while in L1
 * (8 rows of 512 floats: 16 KiB). */
#define FUSED_ROWS 8L
/* As layernorm.c's grain: elements per thread below which fewer threads start. */
#define FUSED_GRAIN 16384L
/* bias_grad's row blocks (elementwise.c: BIAS_ROW_BLOCK): the bias sums follow its order. */
#define BIAS_BLOCK 64L

void residual_layernorm_forward(float *out, float *mean, float *rstd, float *s, const float *x,
                                const float *bias, const float *residual, const float *weight,
                                const float *lnbias, long N, long D, float eps, float p,
                                uint64_t seed, uint64_t offset)
{
    if (N == 0 || D == 0) return;
    const long blocks = (N + FUSED_ROWS - 1) / FUSED_ROWS;
    /* each row's arithmetic is the same whichever thread takes its block */
#pragma omp parallel for schedule(static) num_threads(tf_team(N * D, FUSED_GRAIN))
    for (long b = 0; b < blocks; b++) {
        long r = b * FUSED_ROWS, e = r + FUSED_ROWS < N ? r + FUSED_ROWS : N;
        bias_dropout_add_rows(x, bias, residual, s, (size_t)r, (size_t)e, (size_t)D, p, seed, offset);
        layernorm_forward_rows(out, mean, rstd, s, weight, lnbias, r, e, D, eps);
    }
}

size_t residual_layernorm_backward_scratch(long N, long D)
{
    long chunks = (N + LAYERNORM_CHUNK - 1) / LAYERNORM_CHUNK;
    long blocks = (N + BIAS_BLOCK - 1) / BIAS_BLOCK;
    return (size_t)(2 * chunks + blocks) * (size_t)D;
}

void residual_layernorm_backward(float *ds, float *dd, float *dweight, float *dlnbias, float *dbias,
                                 float *scratch, const float *dout, const float *s,
                                 const float *weight, const float *mean, const float *rstd, long N,
                                 long D, float p, uint64_t seed, uint64_t offset)
{
    if (N == 0 || D == 0) return;
    const long chunks = (N + LAYERNORM_CHUNK - 1) / LAYERNORM_CHUNK;
    const long blocks = (N + BIAS_BLOCK - 1) / BIAS_BLOCK;
    float *bias_parts = scratch + 2 * chunks * D;
    const float *g = dd ? dd : ds;
#pragma omp parallel num_threads(tf_team(N * D, FUSED_GRAIN))
    {
        /* A block of 64 rows: its layer-norm chunks, the dropout of their gradient, the block's
         * bias sum, the rows still in cache. */
#pragma omp for schedule(static)
        for (long b = 0; b < blocks; b++) {
            long b1 = (b + 1) * BIAS_BLOCK < N ? (b + 1) * BIAS_BLOCK : N;
            for (long r = b * BIAS_BLOCK; r < b1; r += LAYERNORM_CHUNK) {
                long ch = r / LAYERNORM_CHUNK, e = r + LAYERNORM_CHUNK < b1 ? r + LAYERNORM_CHUNK : b1;
                layernorm_backward_chunk(ds, scratch + 2 * ch * D, scratch + (2 * ch + 1) * D, dout, s,
                                         weight, mean, rstd, r, e, D, 0);
                if (dd)
                    bias_dropout_add_rows(ds, NULL, NULL, dd, (size_t)r, (size_t)e, (size_t)D, p, seed, offset);
            }
            /* the block's column sums, by bias_grad itself (its SIMD walk; one block of at most
             * BIAS_BLOCK rows is summed as its whole-array call sums that block) */
            memset(bias_parts + b * D, 0, (size_t)D * sizeof(float));
            bias_grad(g + b * BIAS_BLOCK * D, bias_parts + b * D, (size_t)(b1 - b * BIAS_BLOCK), (size_t)D);
        }
        /* The partials, in chunk and block order: columns in blocks of 64 per iteration. */
#pragma omp for schedule(static)
        for (long c0 = 0; c0 < D; c0 += 64) {
            long c1 = c0 + 64 < D ? c0 + 64 : D;
            layernorm_add_partials(dweight, dlnbias, scratch, chunks, D, c0, c1);
            float total[64];
            for (long j = c0; j < c1; j++) total[j - c0] = 0.0f;
            for (long b = 0; b < blocks; b++)
                for (long j = c0; j < c1; j++) total[j - c0] += bias_parts[b * D + j];
            for (long j = c0; j < c1; j++) dbias[j] += total[j - c0];
        }
    }
}
