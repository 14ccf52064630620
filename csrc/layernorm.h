/* Layer normalisation over the last axis (nn.LayerNorm), forward and backward.
 *
 * Forward: mean, then the biased variance as the mean of (x - mean)^2 (two
 * passes, never E[x^2] - E[x]^2), rstd = 1/sqrt(var + eps),
 * out = (x - mean) * rstd * weight + bias. Saves mean and rstd.
 * Backward (g = dout * weight, xhat = (x - mean) * rstd):
 *   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
 *   dweight += sum over rows of dout * xhat,  dbias += sum over rows of dout.
 * Rows are split into fixed chunks of LAYERNORM_CHUNK rows; each chunk writes its
 * own partial column sums and the partials are added in chunk order, so the bits
 * of dweight/dbias do not depend on the thread count.
 */
#ifndef TF_LAYERNORM_H
#define TF_LAYERNORM_H

#include <stddef.h>
#include <stdint.h>

#define LAYERNORM_CHUNK 32L   /* rows per partial sum of dweight/dbias */

/* out    [N, D] output; may be x (in place)
 * mean   [N] output, rstd [N] output
 * x      [N, D], weight [D], bias [D] */
void layernorm_forward(float *out, float *mean, float *rstd, const float *x, const float *weight,
                       const float *bias, long N, long D, float eps);

/* Floats of scratch layernorm_backward needs: 2 * ceil(N / LAYERNORM_CHUNK) * D. */
size_t layernorm_backward_scratch(long N, long D);

/* dx      [N, D] output (dx += when accumulate); may be dout when !accumulate
 * dweight [D] added into, dbias [D] added into
 * scratch [layernorm_backward_scratch(N, D)] floats, any contents
 * dout, x [N, D], weight [D], mean [N], rstd [N] (from layernorm_forward) */
void layernorm_backward(float *dx, float *dweight, float *dbias, float *scratch, const float *dout,
                        const float *x, const float *weight, const float *mean, const float *rstd,
                        long N, long D, int accumulate);

/* ScaleNorm (Nguyen & Salazar 2019; transformer/norms.py): per row, norm = max(sqrt(sum x^2), eps)
 * with the sum of squares in double (eight running sums by index mod 8, added pairwise in a fixed
 * order: the same bits at every SIMD level and thread count), rounded to float;
 * out = x * (g / norm), g / norm rounded to float first. out may be x.
 * norms [N] receives each row's clamped norm (the backward pass reads it). */
void scalenorm_forward(float *out, float *norms, const float *x, float g, long N, long D, float eps);

/* Its backward, given the forward's clamped norms: x_hat = x * (1 / norm), dot = sum(dout * x_hat)
 * (double, summed as the forward's; 0 where the norm was clamped, norm <= eps, as it does not move with x there),
 * dx (+)= (g / norm) * (dout - x_hat * dot) (accumulate: added); *dg (when not NULL) += the sum over
 * rows, in row order, of each row's sum(dout * x_hat). dx may be dout when not accumulating.
 * FixNorm's backward is this kernel with g = 1 (its unit rows are x_hat). */
void scalenorm_backward(float *dx, float *dg, const float *dout, const float *x, const float *norms, float g,
                        long N, long D, float eps, int accumulate);

/* FixNorm's tables at the rows a training pass reads (transformer/norms.py): scalenorm_forward and
 * scalenorm_backward (accumulate, no dg) at rows[0..n) of an [N, D] table only, each row's bits
 * those the whole table's kernel gives it. rows: distinct indices in [0, N) (the caller checks).
 * The backward then zeroes the dout rows it read, so a gradient buffer the pass dirtied is clean
 * again without a fill of the whole table. */
void scalenorm_forward_at(float *out, float *norms, const float *x, float g, const int64_t *rows,
                          long n, long D, float eps);
void scalenorm_backward_at(float *dx, float *dout, const float *x, const float *norms, float g,
                           const int64_t *rows, long n, long D, float eps);

/* Pieces of the two kernels for kernels that fuse layer norm into their own parallel loop over rows
 * (residual_norm.c). Each runs on the calling thread alone and gives the bits the whole kernel
 * gives those rows.
 * layernorm_forward_rows: rows [r0, r1) of layernorm_forward.
 * layernorm_backward_chunk: rows [r0, r1) (one chunk: r0 a multiple of LAYERNORM_CHUNK, at most
 *   LAYERNORM_CHUNK rows) of dx, their dweight/dbias partial sums written (not added) to dwp/dbp [D].
 * layernorm_add_partials: dweight/dbias columns [c0, c1) += the partials of `chunks` chunks, laid out
 *   as layernorm_backward's scratch (chunk ch's dwp at 2 ch D, its dbp after it), in chunk order. */
void layernorm_forward_rows(float *out, float *mean, float *rstd, const float *x, const float *weight,
                            const float *bias, long r0, long r1, long D, float eps);
void layernorm_backward_chunk(float *dx, float *dwp, float *dbp, const float *dout, const float *x,
                              const float *weight, const float *mean, const float *rstd, long r0,
                              long r1, long D, int accumulate);
void layernorm_add_partials(float *dweight, float *dbias, const float *scratch, long chunks, long D,
                            long c0, long c1);

/* ScaleNorm's pieces, as layernorm's above:
 * scalenorm_forward_rows: rows [r0, r1) of scalenorm_forward.
 * scalenorm_backward_rows: rows [r0, r1) of scalenorm_backward, each row's sum(dout * x_hat) to
 *   dots[r] (what scalenorm_backward adds into *dg, in row order). */
void scalenorm_forward_rows(float *out, float *norms, const float *x, float g, long r0, long r1,
                            long D, float eps);
void scalenorm_backward_rows(float *dx, double *dots, const float *dout, const float *x,
                             const float *norms, float g, long r0, long r1, long D, float eps,
                             int accumulate);

#endif
