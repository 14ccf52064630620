/* Scaled dot-product attention for training (section 3.2.1), forward and backward, fused per
 * (sentence, head): the scores, masks, softmax, dropout on the weights and the weighted sum of
 * one pair are computed in thread-local buffers that stay in cache, instead of four batched
 * passes over [B, H, Tq, Tk] arrays in memory. Parallel over (sentence, head) pairs; each pair
 * is computed the same way on whichever thread, so results do not depend on the thread count.
 *
 * Layouts: Q, K, V are read in place from the projections' outputs, heads side by side in a
 * row: head h of row r of Q is q[r * ldq + h * dh .. + dh] (self-attention: q, k, v are columns
 * 0, D, 2D of one [B*T, 3D] array, ld 3D; cross-attention: q [B*Tq, D], k, v columns 0, D of
 * [B*Tk, 2D]). The context is written the same way: the heads' concat of section 3.2.2.
 *
 * Arithmetic: S = Q Kᵀ (fp32 sums in k order), then softmax_forward's softmax of scale * S with
 * its masks (a fully masked row gives zeros), dropout_forward's mask on the weights (element
 * index = flat index into probs [B, H, Tq, Tk], counter offset + index), ctx = P_d V.
 * bf16 = 1: every operand of the products (Q, K, V, P_d; dC, dP's inputs, dS) is rounded to
 * bfloat16 (round to nearest even, subnormals to zero: gemm.h's GEMM_BF16) and the products are
 * summed in fp32. probs stays fp32.
 * Any Tq, Tk, dh >= 1 is computed; the fast paths are written for dh <= 64 and Tq, Tk of a few
 * hundred at most (per-thread buffers of about 4 Tq Tk + 6 T dh floats). */
#ifndef TF_ATTENTION_TRAIN_H
#define TF_ATTENTION_TRAIN_H

#include <stdint.h>

/* q      [B*Tq, ldq]  head h at column h*dh
 * k, v   [B*Tk, ldk], [B*Tk, ldv]
 * key_padding_mask [B, Tk] uint8, nonzero = padding key, or NULL
 * probs  [B, H, Tq, Tk] out: the attention weights before dropout
 * ctx    [B*Tq, ldc] out: head h at column h*dh
 * dropout_p in [0, 1): dropout on the weights with (seed, offset), 0 = none */
void attention_train_forward(const float *q, long ldq, const float *k, long ldk, const float *v,
                             long ldv, const uint8_t *key_padding_mask, float *probs, float *ctx,
                             long ldc, long B, long H, long Tq, long Tk, long dh, float scale,
                             int causal, float dropout_p, uint64_t seed, uint64_t offset, int bf16);

/* dctx   [B*Tq, lddc] gradient of ctx
 * q, k, v, probs: as the forward read and wrote them (same causal, dropout_p, seed, offset, bf16;
 * causal only skips the products' zero half)
 * dq     [B*Tq, lddq] out (overwritten), dk [B*Tk, lddk] out, dv [B*Tk, lddv] out */
void attention_train_backward(const float *dctx, long lddc, const float *q, long ldq,
                              const float *k, long ldk, const float *v, long ldv,
                              const float *probs, float *dq, long lddq, float *dk, long lddk,
                              float *dv, long lddv, long B, long H, long Tq, long Tk, long dh,
                              float scale, int causal, float dropout_p, uint64_t seed,
                              uint64_t offset, int bf16);

/* The code the two calls take at the current SIMD level: 3 AVX-512 micro-kernels with vdpbf16ps
 * for bf16 (two products per lane and instruction, added in its own order: the sums differ from
 * the other levels' by fp32 rounding), 2 AVX-512 micro-kernels (bf16: rounded operands, fp32
 * FMAs), 1 AVX2 ones, 0 plain C loops (the reference the tests hold the others to; slower than
 * batched GEMMs). */
int attention_train_path(void);

#endif
