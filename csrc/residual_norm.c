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

/* Both forwards: blocks of 8 rows, s made and then normalised while in L1, by LayerNorm (weight
 * and lnbias; mean and rstd saved) or, when weight is NULL, ScaleNorm (g; norms saved in mean). */
static void residual_norm_forward(float *out, float *mean, float *rstd, float *s, const float *x,
                                  const float *bias, const float *residual, const float *weight,
                                  const float *lnbias, float g, long N, long D, float eps, float p,
                                  uint64_t seed, uint64_t offset)
{
    if (N == 0 || D == 0) return;
    const long blocks = (N + FUSED_ROWS - 1) / FUSED_ROWS;
    /* each row's arithmetic is the same whichever thread takes its block */
#pragma omp parallel for schedule(static) num_threads(tf_team(N * D, FUSED_GRAIN))
    for (long b = 0; b < blocks; b++) {
        long r = b * FUSED_ROWS, e = r + FUSED_ROWS < N ? r + FUSED_ROWS : N;
        bias_dropout_add_rows(x, bias, residual, s, (size_t)r, (size_t)e, (size_t)D, p, seed, offset);
        if (weight) layernorm_forward_rows(out, mean, rstd, s, weight, lnbias, r, e, D, eps);
        else scalenorm_forward_rows(out, mean, s, g, r, e, D, eps);
    }
}

void residual_layernorm_forward(float *out, float *mean, float *rstd, float *s, const float *x,
                                const float *bias, const float *residual, const float *weight,
                                const float *lnbias, long N, long D, float eps, float p,
                                uint64_t seed, uint64_t offset)
{
    residual_norm_forward(out, mean, rstd, s, x, bias, residual, weight, lnbias, 0.0f, N, D, eps, p, seed, offset);
}

size_t residual_layernorm_backward_scratch(long N, long D)
{
    long chunks = (N + LAYERNORM_CHUNK - 1) / LAYERNORM_CHUNK;
    long blocks = (N + BIAS_BLOCK - 1) / BIAS_BLOCK;
    return (size_t)(2 * chunks + blocks) * (size_t)D;
}

/* A block's column sums of g, rows [b * BIAS_BLOCK, b1), to parts + b * D: by bias_grad itself
 * (its SIMD walk; one block of at most BIAS_BLOCK rows is summed as its whole-array call sums
 * that block). */
static void bias_block(const float *g, float *parts, long b, long b1, long D)
{
    memset(parts + b * D, 0, (size_t)D * sizeof(float));
    bias_grad(g + b * BIAS_BLOCK * D, parts + b * D, (size_t)(b1 - b * BIAS_BLOCK), (size_t)D);
}

/* dbias columns [c0, c1) (at most 64) += the blocks' partials, in block order. */
static void add_bias_blocks(float *dbias, const float *parts, long blocks, long D, long c0, long c1)
{
    float total[64];
    for (long j = c0; j < c1; j++) total[j - c0] = 0.0f;
    for (long b = 0; b < blocks; b++)
        for (long j = c0; j < c1; j++) total[j - c0] += parts[b * D + j];
    for (long j = c0; j < c1; j++) dbias[j] += total[j - c0];
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
            bias_block(g, bias_parts, b, b1, D);
        }
        /* The partials, in chunk and block order: columns in blocks of 64 per iteration. */
#pragma omp for schedule(static)
        for (long c0 = 0; c0 < D; c0 += 64) {
            long c1 = c0 + 64 < D ? c0 + 64 : D;
            layernorm_add_partials(dweight, dlnbias, scratch, chunks, D, c0, c1);
            add_bias_blocks(dbias, bias_parts, blocks, D, c0, c1);
        }
    }
}

void residual_scalenorm_forward(float *out, float *norms, float *s, const float *x, const float *bias,
                                const float *residual, float g, long N, long D, float eps, float p,
                                uint64_t seed, uint64_t offset)
{
    residual_norm_forward(out, norms, NULL, s, x, bias, residual, NULL, NULL, g, N, D, eps, p, seed, offset);
}

size_t residual_scalenorm_backward_scratch(long N, long D)
{
    /* the rows' dots (doubles), then the blocks' bias partials */
    return (size_t)(2 * N) + (size_t)((N + BIAS_BLOCK - 1) / BIAS_BLOCK) * (size_t)D;
}

/* ScaleNorm's backward (when norms is not NULL: ds from dout, each row's dot to dots) and then,
 * block by block of 64 rows: out = dropout'(ds) (dd, or ds itself when dd is NULL), out =
 * act'(pre) * out when pre is not NULL, and out's column sums into dbias (parts: the blocks'). */
static void dropout_bias_blocks(float *ds, float *dd, float *dbias, float *parts, double *dots,
                                const float *dout, const float *s, const float *norms, float g,
                                float eps, const float *pre, int act, long N, long D, float p,
                                uint64_t seed, uint64_t offset)
{
    const long blocks = (N + BIAS_BLOCK - 1) / BIAS_BLOCK;
    float *out = dd ? dd : ds;
#pragma omp parallel num_threads(tf_team(N * D, FUSED_GRAIN))
    {
#pragma omp for schedule(static)
        for (long b = 0; b < blocks; b++) {
            long r = b * BIAS_BLOCK, b1 = r + BIAS_BLOCK < N ? r + BIAS_BLOCK : N;
            const size_t i0 = (size_t)(r * D), i1 = (size_t)(b1 * D);
            if (norms) scalenorm_backward_rows(ds, dots, dout, s, norms, g, r, b1, D, eps, 0);
            if (p > 0.0f)
                bias_dropout_add_rows(ds, NULL, NULL, out, (size_t)r, (size_t)b1, (size_t)D, p, seed, offset);
            else if (out != ds)
                memcpy(out + i0, ds + i0, (i1 - i0) * sizeof(float));
            if (pre) act_backward_span(out, pre, out, i0, i1, act);
            bias_block(out, parts, b, b1, D);
        }
#pragma omp for schedule(static)
        for (long c0 = 0; c0 < D; c0 += 64)
            add_bias_blocks(dbias, parts, blocks, D, c0, c0 + 64 < D ? c0 + 64 : D);
    }
}

void residual_scalenorm_backward(float *ds, float *dd, float *dg, float *dbias, float *scratch,
                                 const float *dout, const float *s, const float *norms, float g,
                                 long N, long D, float eps, float p, uint64_t seed, uint64_t offset)
{
    if (N == 0 || D == 0) return;
    double *dots = (double *)(void *)scratch;
    dropout_bias_blocks(ds, dd, dbias, scratch + 2 * N, dots, dout, s, norms, g, eps, NULL, 0, N, D, p,
                        seed, offset);
    /* g's gradient: the rows' sums in row order, as scalenorm_backward adds them */
    double sum = 0.0;
    for (long r = 0; r < N; r++) sum += dots[r];
    if (dg) *dg += (float)sum;
}

size_t dropout_bias_backward_scratch(long N, long D)
{
    return (size_t)((N + BIAS_BLOCK - 1) / BIAS_BLOCK) * (size_t)D;
}

void dropout_bias_backward(float *dd, float *dbias, float *scratch, const float *ds, const float *pre,
                           int act, long N, long D, float p, uint64_t seed, uint64_t offset)
{
    if (N == 0 || D == 0) return;
    /* ds is only read here (dd may be ds itself) */
    dropout_bias_blocks((float *)ds, dd, dbias, scratch, NULL, NULL, NULL, NULL, 0.0f, 0.0f, pre, act, N, D,
                        p, seed, offset);
}
