/* Dropout (Srivastava et al. 2014; "Attention Is All You Need" section 5.4, P_drop = 0.1)
 * with a counter-based RNG (rng.h): element i of a call draws uniform(seed, offset + i) and is
 * kept when that draw is >= p, then scaled by 1 / (1 - p) (inverted dropout, PyTorch's).
 * The mask is a pure function of (seed, offset + i): the same for any thread count and any
 * SIMD level, and backward recomputes it instead of storing it. A caller that draws several
 * masks from one seed advances `offset` by the element count of each call.
 *
 * The kernels trust their caller: 0 <= p < 1 (pyx/ checks it).
 */
#ifndef TF_DROPOUT_H
#define TF_DROPOUT_H

#include <stddef.h>
#include <stdint.h>

/* Integer threshold: keep[i] = (u24(seed, offset + i) >= threshold), i.e. uniform >= p. */
uint32_t dropout_threshold(float p);
/* The float the kept values are multiplied by: float32(1 / (1 - p)) (rounded once). */
float dropout_scale(float p);

/* out = x * keep / (1 - p).  x, out: [n] (out may be x); p == 0 copies. */
void dropout_forward(const float *x, float *out, size_t n, float p, uint64_t seed, uint64_t offset);
/* dx = dout * keep / (1 - p), keep drawn exactly as dropout_forward did.  dout, dx: [n] (dx may be dout). */
void dropout_backward(const float *dout, float *dx, size_t n, float p, uint64_t seed, uint64_t offset);
/* Fused residual connection (Attention Is All You Need section 5.4: dropout on each sub-layer's
 * output before it is added to the sub-layer input): out = residual + x * keep / (1 - p), the
 * same bits as dropout_forward followed by an add. x, residual, out: [n]; out may be x or
 * residual. Backward: d residual = dout, dx = dropout_backward(dout). */
void dropout_add_forward(const float *x, const float *residual, float *out, size_t n, float p,
                         uint64_t seed, uint64_t offset);
/* The same with the bias of the preceding linear map folded in:
 * out[r, :] = residual[r, :] + (x[r, :] + bias) * keep / (1 - p), element (r, j) drawing counter
 * offset + r * D + j; the same bits as add_bias, dropout_forward and add in turn. x, residual, out:
 * [N, D] (out may be x or residual); bias: [D]. Backward: d residual = dout,
 * dx = dropout_backward(dout), dbias += column sums of dx. */
void bias_dropout_add_forward(const float *x, const float *bias, const float *residual, float *out,
                              size_t N, size_t D, float p, uint64_t seed, uint64_t offset);
/* One thread's piece of a larger call, for kernels that fuse dropout into their own parallel loop
 * (attention_train.c): out[i] = x[i] * keep(counter0 + i) / (1 - p) for i < n, the bits
 * dropout_forward(x0, out0, ..., offset) gives element counter0 - offset of its array.
 * x, out: [n] (out may be x). Runs on the calling thread alone. */
void dropout_forward_span(const float *x, float *out, size_t n, float p, uint64_t seed,
                          uint64_t counter0);
/* Rows [r0, r1) of bias_dropout_add_forward (bias NULL: of dropout_add_forward over N * D
 * elements; residual NULL too: of dropout_forward), on the calling thread alone, with the bits
 * the whole call gives those rows: for kernels that fuse it into their own loop over rows
 * (residual_norm.c). out may be x or residual. */
void bias_dropout_add_rows(const float *x, const float *bias, const float *residual, float *out,
                           size_t r0, size_t r1, size_t D, float p, uint64_t seed, uint64_t offset);
/* mask[i] = keep[i] (1 kept, 0 dropped), the mask dropout_forward applies.  mask: [n]. */
void dropout_mask(uint8_t *mask, size_t n, float p, uint64_t seed, uint64_t offset);

/* Naive reference: one scalar draw per element, one thread. */
void dropout_forward_reference(const float *x, float *out, size_t n, float p, uint64_t seed,
                               uint64_t offset);

#endif
