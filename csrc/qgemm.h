/* int8 GEMM for inference: C = x @ W^T (+ bias), W quantized once, x on the fly.
 *
 * Quantization (the same rule for weight rows and activation rows; float32 throughout):
 *   amax  = max_k |v[k]|
 *   amax is NaN/inf (a non-finite value in the row): scale = NaN, every q = 0
 *   amax < QGEMM_TINY (zero or so small that 127 / amax would overflow): scale = 0, every q = 0
 *   otherwise: inv = 127.0f / amax, q[k] = clamp(rint(v[k] * inv), -127, 127) (float32 multiply,
 *              round half to even), scale = amax / 127.0f
 * so v[k] ~= q[k] * scale. The Python door refuses non-finite weights; a non-finite activation
 * makes its whole output row NaN (defined, never undefined behaviour).
 *
 * Product (bits identical on every ISA and every thread count):
 *   acc[i][n] = sum_k qx[i][k] * qw[n][k]                 exact int32 (K <= QGEMM_MAX_K)
 *   C[i][n]   = fmaf((float)acc[i][n], xs[i] * ws[n], bias[n])   one float32 multiply for the
 *               scales, round-to-nearest conversion, fused multiply-add (one rounding);
 *   C[i][n]   = (float)acc[i][n] * (xs[i] * ws[n])        when bias is NULL.
 *
 * Packed weights (qgemm_pack): one buffer of qgemm_packed_bytes(isa, N, K) bytes, 64-byte
 * aligned, sections at 64-byte aligned offsets:
 *   header   64 bytes: "TFQGEMM1", isa, NR, KG, N, K (qgemm_packed_info reads it back)
 *   scale    float32 [Np]          ws[n], zero past N           (Np = ceil(N / NR) * NR)
 *   comp     int32   [Np]          128 * sum_k qw[n][k], zero past N: the compensation the
 *                                  u8 x s8 kernel (vpdpbusd, activations + 128) subtracts
 *   panels   int8    [Np / NR][ceil(K / KG)][NR][KG]   qw[p*NR + j][g*KG + t], zero padded
 * with, per instruction set: avx512_vnni (and avx512_bf16, and amx, whose tdpbusd tiles read the
 * same panels 16 quads x 16 columns at a time): NR = 32 columns, KG = 4 (k in
 * fours: vpdpbusd adds the four u8 x s8 products of a 32-bit lane into int32); AVX2 (and
 * AVX-512 without VNNI, which runs the AVX2 kernel): NR = 16, KG = 2 (k in pairs: vpmaddwd sums
 * the two int16 products of a pair exactly into int32); generic: NR = 1, KG = 1 (each panel is
 * one row of Q).
 *
 * The implementation: csrc/qgemm/, one file per concern (csrc/qgemm/qgemm_isa.h lists them).
 */
#ifndef TF_QGEMM_H
#define TF_QGEMM_H

#include <stdint.h>

/* The largest K: |acc| <= 127 * 127 * K and, in the u8 x s8 kernel, 255 * 127 * K stay below
 * 2^31. */
#define QGEMM_MAX_K 65536L
/* Rows whose amax is below this (2^-120) quantize to zeros with scale 0. */
#define QGEMM_TINY 0x1p-120f

/* Q[n][k] and scale[n] of W [N, K] (row n at W + n * ldw), by the rule above. */
void qgemm_quantize(long N, long K,
                    const float *W, long ldw,    /* [N, K] */
                    int8_t *Q,                   /* [N, K] row-major */
                    float *scale);               /* [N] */

/* Bytes of a packed buffer for instruction set `isa` (a TF_ISA_* level). */
long qgemm_packed_bytes(int isa, long N, long K);

/* Packs Q (values in [-127, 127]) and scale into `packed` (qgemm_packed_bytes, 64-byte aligned). */
void qgemm_pack(int isa, long N, long K,
                const int8_t *Q,                 /* [N, K] row-major */
                const float *scale,              /* [N] */
                void *packed);

/* Reads a packed buffer's header: 0 and isa, N, K when `bytes` is the size of a buffer that
 * qgemm_pack wrote with those (magic and layout checked), -1 otherwise. */
int qgemm_packed_info(const void *packed, long bytes, int *isa, long *N, long *K);

/* C = dequant(quant(X) @ Q^T) (+ bias) as above, with the kernels of `isa` (the level packed for).
 * Threads take groups of column panels (and, past 64 rows, blocks of rows): each element is
 * computed by the same instructions whichever thread takes it. */
void qgemm_packed(int isa, long M, long N, long K,
                  const float *X, long ldx,      /* [M, K] */
                  const void *packed,            /* from qgemm_pack(isa, N, K, ...) */
                  const float *bias,             /* [N] or NULL */
                  float *C, long ldc);           /* [M, N], not overlapping X, packed or bias */

/* "amx (tdpbusd tiles, int32)", "avx512_vnni (vpdpbusd, int32)", "avx2 (vpmaddwd, int32)" or
 * "generic (C, int32)": the path
 * qgemm_packed takes for `isa`. */
const char *qgemm_path_name(int isa);

/* Testing hooks (tests/test_qgemm.py): all_threads: start every thread whatever the size;
 * slow: run the naive fallback (the one taken when no buffer can be allocated). */
void qgemm_test_force(int all_threads, int slow);

#endif
