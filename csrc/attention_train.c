/* Fused attention for training, forward and backward (see attention_train.h).
 *
 * One (sentence, head) pair at a time per thread. fp32 reads Q, K, V and dC in place; bf16
 * reads copies rounded into thread-local buffers. Kᵀ (forward) and Vᵀ (backward) are made once
 * per pair, and every product is then one small matrix product C = A B, B row-major, A read
 * through two strides (a transposed A costs nothing: its elements are broadcast one by one):
 *   forward   S = Q Kᵀ,  ctx = P_d V
 *   backward  dP_d = dC Vᵀ,  dV = P_dᵀ dC,  dQ = dS K,  dK = dSᵀ Q
 * C[i, j] is always one fp32 chain over k in increasing order (at avx512_bf16 with bf16 operands,
 * over pairs of k: vdpbf16ps), whichever register tile it falls in, so a pair's results do not
 * depend on how its rows are blocked nor on the thread that runs it. The softmax is softmax.c's
 * row code and the dropout dropout.c's range code, called on one pair's block: the same bits as
 * the unfused kernels for the same scores. Pairs are split into one contiguous range per thread.
 */
#include "attention_train.h"

#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "dropout.h"
#include "gemm/avx512.h"   /* round_bf16 (gemm's bf16 rounding) and transpose16 */
#include "gemm/pairs.h"    /* floats to bf16 pairs */
#include "simd_math.h"
#include "softmax.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Multiply-adds per thread below which fewer threads are started: one pair of tiny's shapes
 * (T = 40, dh = 32) is 51K per product, a few microseconds, so two pairs wake a second thread. */
#define ATTENTION_TRAIN_GRAIN 65536L

#define TF_ALWAYS_INLINE inline __attribute__((always_inline))

/* Causal attention (query i sees keys j <= i) leaves half of each product zero; a matmul told
 * which half skips it. Rows of C are always the mask's rows i:
 * BAND_COLS    only C[i, j <= i] is needed (S = Q Kᵀ, dP = dC Vᵀ); the rest is written as zeros
 * BAND_K_UPTO  A[i, k] is zero for k > i (P V, dS K): those terms are skipped
 * BAND_K_FROM  A[i, k] is zero for k < i (P_dᵀ dC, dSᵀ Q: rows are keys, k queries)
 * Skipped terms are exact zeros added to a chain, so the sums are unchanged (but for the sign of
 * a zero). Limits move by whole row tiles, as the tiles fall, the same on every thread. */
enum { BAND_NONE = 0, BAND_COLS = 1, BAND_K_UPTO = 2, BAND_K_FROM = 3 };

/* [k_lo, k_hi) of the terms rows [i, i + rows) need out of K, and the columns below n_hi. */
static inline void band_limits(int band, long i, long rows, long K, long N, long *k_lo, long *k_hi,
                               long *n_hi)
{
    /* rows of the tile see keys below end */
    const long end = i + rows;
    *k_lo = band == BAND_K_FROM ? (i < K ? i : K) : 0;
    *k_hi = band == BAND_K_UPTO && end < K ? end : K;
    *n_hi = band == BAND_COLS && end < N ? end : N;
}

/* out = x * factors, elementwise: with factors = dropout_forward_span of ones (keep / (1 - p) or
 * 0, exactly), the bits dropout_forward_span gives x itself; backward draws a pair's mask once
 * this way for both P_d and dP. */
static void multiply(float *out, const float *x, const float *factors, long n)
{
    for (long i = 0; i < n; i++) out[i] = x[i] * factors[i];
}

/* Software prefetch of what the next pair reads and writes. In a step the operands come from
 * the projections' outputs, strided by head, and the backward's were written a whole forward
 * pass before: cold, in a pattern the hardware's prefetchers do not follow (per pair 1.9 -> 1.4
 * us forward, 3.5 -> 2.2 us backward from memory at T 15; the step's attention 17.6 -> 15.5 ms,
 * Zen 4 f25m17, benchmarks/notes/2026-12-05-attention-prefetch.md). Into L2 (locality 2): a
 * sentence's rows and weights. Up to PREFETCH_SENTENCE_BYTES of a sentence's operands (every
 * head: Q, K, V, the context or dC and the three gradients, and the weights) the next sentence
 * is fetched whole as a sentence starts; a longer one a pair (head) ahead, which measured better
 * than whole sentences from T ~ 28 on. */
#define PREFETCH_SENTENCE_BYTES (96L << 10)

/* The cache lines of `rows` rows of `cols` floats at row stride ld, for reading or writing. */
static inline void prefetch_rows(const float *x, long ld, long rows, long cols, int write)
{
    for (long r = 0; r < rows; r++) {
        const char *row = (const char *)(x + r * ld);
        const char *end = (const char *)(x + r * ld + cols - 1);
        for (const char *line = (const char *)((uintptr_t)row & ~(uintptr_t)63); line <= end; line += 64) {
            if (write) __builtin_prefetch(line, 1, 2);
            else __builtin_prefetch(line, 0, 2);
        }
    }
}

/* Which rows to fetch while pair `pair` of [p0, p1) runs: whole (a sentence's footprint within
 * PREFETCH_SENTENCE_BYTES) fetches sentence b + 1 at its first head (or the range's first
 * pair), every column; else pair + 1's head columns. Gives the sentence nb, the columns [c0,
 * c0 + width) and the probability blocks [first, first + count); 0 when there is nothing to fetch. */
static inline int prefetch_next(long pair, long p0, long p1, long H, long dh, int whole, long *nb,
                                long *c0, long *width, long *first, long *count)
{
    if (whole) {
        if (pair % H != 0 && pair != p0) return 0;
        *nb = pair / H + 1, *c0 = 0, *width = H * dh, *first = *nb * H;
        *count = p1 - *first < H ? p1 - *first : H;
    } else {
        *nb = (pair + 1) / H, *c0 = (pair + 1) % H * dh, *width = dh, *first = pair + 1, *count = 1;
    }
    return *first < p1;
}

/* A sentence's operands, every head (Q, dC and dQ; K, V, dK and dV; the weights), fit
 * PREFETCH_SENTENCE_BYTES. */
static inline int prefetch_whole(long Tq, long Tk, long H, long dh)
{
    return (long)sizeof(float) * (3 * Tq * H * dh + 4 * Tk * H * dh + H * Tq * Tk) <= PREFETCH_SENTENCE_BYTES;
}

static void zero_cols(float *C, long ldc, long rows, long j0, long j1)
{
    if (j1 > j0)
        for (long r = 0; r < rows; r++) memset(C + r * ldc + j0, 0, (size_t)(j1 - j0) * sizeof(float));
}

/* The per-ISA pieces of a pair:
 * matmul     C [M, ldc] = A B, C[:, :N] overwritten; A [M, K] read as A[i * sa + k * ka] (so a
 *            transposed A costs nothing: its elements are broadcast one at a time), B [K, ldb];
 *            band: the causal half to skip (BAND_*)
 * gather     dst [rows, cols] contiguous = src [rows, lds], rounded to bf16 when bf16
 * transpose  dst [cols, rows] contiguous = the transpose of src [rows, lds]
 * round      x [n] rounded to bf16 in place */
typedef struct {
    void (*matmul)(float *C, long ldc, const float *A, long sa, long ka, const float *B, long ldb,
                   long M, long N, long K, int band);
    void (*gather)(float *dst, const float *src, long lds, long rows, long cols, int bf16);
    void (*transpose)(float *dst, const float *src, long lds, long rows, long cols);
    void (*round)(float *x, long n);
} pair_ops;

/* ------------------------------------------------------------------------- */
/* Plain C: the reference. */

static void matmul_generic(float *C, long ldc, const float *A, long sa, long ka, const float *B,
                           long ldb, long M, long N, long K, int band)
{
    for (long i = 0; i < M; i++) {
        float *c = C + i * ldc;
        long k_lo, k_hi, n_hi;
        band_limits(band, i, 1, K, N, &k_lo, &k_hi, &n_hi);
        for (long j = 0; j < N; j++) c[j] = 0.0f;
        for (long k = k_lo; k < k_hi; k++) {
            const float a = A[i * sa + k * ka];
            const float *b = B + k * ldb;
            for (long j = 0; j < n_hi; j++) c[j] += a * b[j];
        }
    }
}

static void gather_generic(float *dst, const float *src, long lds, long rows, long cols, int bf16)
{
    for (long r = 0; r < rows; r++) {
        const float *s = src + r * lds;
        float *d = dst + r * cols;
        if (bf16)
            for (long c = 0; c < cols; c++) d[c] = round_bf16(s[c]);
        else
            memcpy(d, s, (size_t)cols * sizeof(float));
    }
}

static void transpose_generic(float *dst, const float *src, long lds, long rows, long cols)
{
    for (long r = 0; r < rows; r++)
        for (long c = 0; c < cols; c++) dst[c * rows + r] = src[r * lds + c];
}

static void round_generic(float *x, long n)
{
    for (long i = 0; i < n; i++) x[i] = round_bf16(x[i]);
}

#if TF_HAVE_X86
/* ------------------------------------------------------------------------- */
/* AVX-512: R rows x NV vectors of 16 columns held in registers over the whole k loop. */

TF_TARGET_AVX512 static TF_ALWAYS_INLINE void matmul_tile_avx512(
    float *C, long ldc, const float *A, long sa, long ka, const float *B, long ldb, long K,
    long ncols, const int R, const int NV)
{
    __m512 acc[8][4];
    const __mmask16 last = tf_lanes16(ncols - 16 * (NV - 1));
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) acc[r][j] = _mm512_setzero_ps();
    for (long k = 0; k < K; k++) {
        __m512 b[4];
        const float *bk = B + k * ldb, *ak = A + k * ka;
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++)
            b[j] = j == NV - 1 ? _mm512_maskz_loadu_ps(last, bk + 16 * j) : _mm512_loadu_ps(bk + 16 * j);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const __m512 a = _mm512_set1_ps(ak[r * sa]);
#pragma GCC unroll 4
            for (int j = 0; j < NV; j++) acc[r][j] = _mm512_fmadd_ps(a, b[j], acc[r][j]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) {
            if (j == NV - 1) _mm512_mask_storeu_ps(C + r * ldc + 16 * j, last, acc[r][j]);
            else _mm512_storeu_ps(C + r * ldc + 16 * j, acc[r][j]);
        }
}

TF_TARGET_AVX512 static void matmul_avx512(float *C, long ldc, const float *A, long sa, long ka,
                                           const float *B, long ldb, long M, long N, long K, int band)
{
    for (long j0 = 0; j0 < N; j0 += 64) {
        const long nc = N - j0 < 64 ? N - j0 : 64;
        const int nv = (int)((nc + 15) / 16);
        /* 16 accumulators either way */
        const long rb = nv <= 2 ? 8 : 4;
        for (long i = 0; i < M; i += rb) {
            const int rows = (int)(M - i < rb ? M - i : rb);
            long k_lo, k_hi, n_hi;
            band_limits(band, i, rows, K, N, &k_lo, &k_hi, &n_hi);
            
            const long ne = n_hi - j0 < nc ? n_hi - j0 : nc;                  /* columns computed */
            float *c = C + i * ldc + j0;
            zero_cols(c, ldc, rows, ne > 0 ? ne : 0, nc);
            if (ne <= 0) continue;
            const int nve = (int)((ne + 15) / 16);
            const long kn = k_hi > k_lo ? k_hi - k_lo : 0;
            const float *a = A + i * sa + k_lo * ka, *b = B + k_lo * ldb + j0;
#define TILE(R, NV) matmul_tile_avx512(c, ldc, a, sa, ka, b, ldb, kn, ne, R, NV)
            switch (nve) {
            case 1:
                switch (rows) {
                case 1: TILE(1, 1); break; case 2: TILE(2, 1); break; case 3: TILE(3, 1); break;
                case 4: TILE(4, 1); break; case 5: TILE(5, 1); break; case 6: TILE(6, 1); break;
                case 7: TILE(7, 1); break; default: TILE(8, 1); break;
                }
                break;
            case 2:
                switch (rows) {
                case 1: TILE(1, 2); break; case 2: TILE(2, 2); break; case 3: TILE(3, 2); break;
                case 4: TILE(4, 2); break; case 5: TILE(5, 2); break; case 6: TILE(6, 2); break;
                case 7: TILE(7, 2); break; default: TILE(8, 2); break;
                }
                break;
            case 3:
                switch (rows) {
                case 1: TILE(1, 3); break; case 2: TILE(2, 3); break; case 3: TILE(3, 3); break;
                default: TILE(4, 3); break;
                }
                break;
            default:
                switch (rows) {
                case 1: TILE(1, 4); break; case 2: TILE(2, 4); break; case 3: TILE(3, 4); break;
                default: TILE(4, 4); break;
                }
                break;
            }
#undef TILE
        }
    }
}

/* round_bf16 of 16 lanes (the same bits): gemm's rounding, the low halves cleared. */
TF_TARGET_AVX512 static inline __m512 round16_bf16(__m512 x)
{
    return _mm512_castsi512_ps(_mm512_and_si512(bf16_high(x), _mm512_set1_epi32((int)0xffff0000u)));
}

TF_TARGET_AVX512 static void gather_avx512(float *dst, const float *src, long lds, long rows,
                                           long cols, int bf16)
{
    for (long r = 0; r < rows; r++) {
        const float *s = src + r * lds;
        float *d = dst + r * cols;
        for (long c = 0; c < cols; c += 16) {
            __m512 x = tf_load16(s + c, cols - c);
            tf_store16(d + c, cols - c, bf16 ? round16_bf16(x) : x);
        }
    }
}

TF_TARGET_AVX512 static void round_avx512(float *x, long n)
{
    for (long i = 0; i < n; i += 16) tf_store16(x + i, n - i, round16_bf16(tf_load16(x + i, n - i)));
}

/* 16 x 16 blocks through registers (transpose16); partial blocks read and write only inside. */
TF_TARGET_AVX512 static void transpose_avx512(float *dst, const float *src, long lds, long rows,
                                              long cols)
{
    for (long r0 = 0; r0 < rows; r0 += 16) {
        const long nr = rows - r0 < 16 ? rows - r0 : 16;
        for (long c0 = 0; c0 < cols; c0 += 16) {
            const long nc = cols - c0 < 16 ? cols - c0 : 16;
            __m512 t[16];
            for (int i = 0; i < 16; i++)
                t[i] = i < nr ? tf_load16(src + (r0 + i) * lds + c0, nc) : _mm512_setzero_ps();
            transpose16(t);
            for (int i = 0; i < nc; i++) tf_store16(dst + (c0 + i) * rows + r0, nr, t[i]);
        }
    }
}

/* ------------------------------------------------------------------------- */
/* AVX2: R rows x NV vectors of 8 columns (at most 12 accumulators of the 16 ymm registers). */

TF_TARGET_AVX2 static TF_ALWAYS_INLINE void matmul_tile_avx2(
    float *C, long ldc, const float *A, long sa, long ka, const float *B, long ldb, long K,
    long ncols, const int R, const int NV)
{
    __m256 acc[4][4];
    const __m256i last = tf_lanes8(ncols - 8 * (NV - 1));
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) acc[r][j] = _mm256_setzero_ps();
    for (long k = 0; k < K; k++) {
        __m256 b[4];
        const float *bk = B + k * ldb, *ak = A + k * ka;
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++)
            b[j] = j == NV - 1 ? _mm256_maskload_ps(bk + 8 * j, last) : _mm256_loadu_ps(bk + 8 * j);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m256 a = _mm256_broadcast_ss(ak + r * sa);
#pragma GCC unroll 4
            for (int j = 0; j < NV; j++) acc[r][j] = _mm256_fmadd_ps(a, b[j], acc[r][j]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) {
            if (j == NV - 1) _mm256_maskstore_ps(C + r * ldc + 8 * j, last, acc[r][j]);
            else _mm256_storeu_ps(C + r * ldc + 8 * j, acc[r][j]);
        }
}

TF_TARGET_AVX2 static void matmul_avx2(float *C, long ldc, const float *A, long sa, long ka,
                                       const float *B, long ldb, long M, long N, long K, int band)
{
    for (long j0 = 0; j0 < N; j0 += 32) {
        const long nc = N - j0 < 32 ? N - j0 : 32;
        const int nv = (int)((nc + 7) / 8);
        const long rb = nv <= 2 ? 4 : 3;
        for (long i = 0; i < M; i += rb) {
            const int rows = (int)(M - i < rb ? M - i : rb);
            long k_lo, k_hi, n_hi;
            band_limits(band, i, rows, K, N, &k_lo, &k_hi, &n_hi);
            const long ne = n_hi - j0 < nc ? n_hi - j0 : nc;
            float *c = C + i * ldc + j0;
            zero_cols(c, ldc, rows, ne > 0 ? ne : 0, nc);
            if (ne <= 0) continue;
            const int nve = (int)((ne + 7) / 8);
            const long kn = k_hi > k_lo ? k_hi - k_lo : 0;
            const float *a = A + i * sa + k_lo * ka, *b = B + k_lo * ldb + j0;
#define TILE(R, NV) matmul_tile_avx2(c, ldc, a, sa, ka, b, ldb, kn, ne, R, NV)
            switch (nve * 4 + rows) {
            case 5: TILE(1, 1); break; case 6: TILE(2, 1); break; case 7: TILE(3, 1); break;
            case 8: TILE(4, 1); break;
            case 9: TILE(1, 2); break; case 10: TILE(2, 2); break; case 11: TILE(3, 2); break;
            case 12: TILE(4, 2); break;
            case 13: TILE(1, 3); break; case 14: TILE(2, 3); break; case 15: TILE(3, 3); break;
            case 17: TILE(1, 4); break; case 18: TILE(2, 4); break; default: TILE(3, 4); break;
            }
#undef TILE
        }
    }
}

/* round_bf16 of 8 lanes (the same bits). */
TF_TARGET_AVX2 static inline __m256 round8_bf16(__m256 x)
{
    const __m256i u = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), nan);
    const __m256i tiny = _mm256_cmpeq_epi32(_mm256_and_si256(r, _mm256_set1_epi32(0x7f800000)),
                                            _mm256_setzero_si256());
    r = _mm256_and_si256(r, _mm256_blendv_epi8(_mm256_set1_epi32((int)0xffff0000u),
                                               _mm256_set1_epi32((int)0x80000000u), tiny));
    return _mm256_castsi256_ps(r);
}

TF_TARGET_AVX2 static void gather_avx2(float *dst, const float *src, long lds, long rows, long cols,
                                       int bf16)
{
    if (!bf16) { gather_generic(dst, src, lds, rows, cols, 0); return; }
    for (long r = 0; r < rows; r++) {
        const float *s = src + r * lds;
        float *d = dst + r * cols;
        long c = 0;
        for (; c + 8 <= cols; c += 8) _mm256_storeu_ps(d + c, round8_bf16(_mm256_loadu_ps(s + c)));
        for (; c < cols; c++) d[c] = round_bf16(s[c]);
    }
}

/* 8 x 8 blocks through registers; partial blocks read and write only inside. */
TF_TARGET_AVX2 static void transpose_avx2(float *dst, const float *src, long lds, long rows, long cols)
{
    for (long r0 = 0; r0 < rows; r0 += 8) {
        const long nr = rows - r0 < 8 ? rows - r0 : 8;
        const __m256i row_lanes = tf_lanes8(nr);
        for (long c0 = 0; c0 < cols; c0 += 8) {
            const long nc = cols - c0 < 8 ? cols - c0 : 8;
            const __m256i col_lanes = tf_lanes8(nc);
            __m256 r[8], t[8], u[8];
            for (int i = 0; i < 8; i++)
                r[i] = i < nr ? (nc == 8 ? _mm256_loadu_ps(src + (r0 + i) * lds + c0)
                                         : _mm256_maskload_ps(src + (r0 + i) * lds + c0, col_lanes))
                              : _mm256_setzero_ps();
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
                t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
            }
            for (int i = 0; i < 8; i += 4) {
                u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
                u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
                u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
                u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
            }
            for (int i = 0; i < 4; i++) {
                r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
                r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
            }
            for (int i = 0; i < nc; i++) {
                float *d = dst + (c0 + i) * rows + r0;
                if (nr == 8) _mm256_storeu_ps(d, r[i]);
                else _mm256_maskstore_ps(d, row_lanes, r[i]);
            }
        }
    }
}

TF_TARGET_AVX2 static void round_avx2(float *x, long n)
{
    long i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, round8_bf16(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) x[i] = round_bf16(x[i]);
}

/* ------------------------------------------------------------------------- */
/* avx512_bf16 with bf16 operands: vdpbf16ps, two products per fp32 lane and instruction (twice the
 * multiply-adds of an FMA). Operands are packed as bf16 pairs along k, each pair one 32-bit word
 * (k = 2t in the low half, 2t + 1 in the high half, a missing odd k zero), rounded exactly as
 * round_bf16 does; the words are then read like the floats of the fp32 tiles. */

/* dst [rows, ceil(K / 2)] words = the pairs of each row of src [rows, lds] (K floats a row). */
TF_TARGET_AVX512_BF16 static void pack_rows_bf16(float *dst, const float *src, long lds, long rows, long K)
{
    const long Kp = (K + 1) / 2;
    for (long r = 0; r < rows; r++) {
        const float *s = src + r * lds;
        float *d = dst + r * Kp;
        for (long k0 = 0; k0 < K; k0 += 32) {
            const __m512i words = pair_row(tf_load16(s + k0, K - k0), tf_load16(s + k0 + 16, K - k0 - 16));
            tf_store16(d + k0 / 2, Kp - k0 / 2, _mm512_castsi512_ps(words));
        }
    }
}

/* dst [ceil(K / 2), N] words: word (t, j) pairs rows 2t and 2t + 1 of src [K, lds] at column j. */
TF_TARGET_AVX512_BF16 static void pack_row_pairs_bf16(float *dst, const float *src, long lds, long K, long N)
{
    for (long t = 0; t < (K + 1) / 2; t++) {
        const float *a = src + 2 * t * lds, *b = 2 * t + 1 < K ? a + lds : NULL;
        float *d = dst + t * N;
        for (long j = 0; j < N; j += 16) {
            const __m512i w = pair_lanes(tf_load16(a + j, N - j), b ? tf_load16(b + j, N - j) : _mm512_setzero_ps());
            tf_store16(d + j, N - j, _mm512_castsi512_ps(w));
        }
    }
}

TF_TARGET_AVX512_BF16 static TF_ALWAYS_INLINE void matmul_tile_dpbf16(
    float *C, long ldc, const float *A, long sa, long ka, const float *B, long ldb, long Kp,
    long ncols, const int R, const int NV)
{
    __m512 acc[8][4];
    const __mmask16 last = tf_lanes16(ncols - 16 * (NV - 1));
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) acc[r][j] = _mm512_setzero_ps();
    for (long t = 0; t < Kp; t++) {
        __m512bh b[4];
        const float *bt = B + t * ldb, *at = A + t * ka;
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++)
            b[j] = (__m512bh)(j == NV - 1 ? _mm512_maskz_loadu_ps(last, bt + 16 * j)
                                          : _mm512_loadu_ps(bt + 16 * j));
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            /* the pair's 32 bits */
            const __m512bh a = (__m512bh)_mm512_set1_ps(at[r * sa]);
#pragma GCC unroll 4
            for (int j = 0; j < NV; j++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], a, b[j]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) {
            if (j == NV - 1) _mm512_mask_storeu_ps(C + r * ldc + 16 * j, last, acc[r][j]);
            else _mm512_storeu_ps(C + r * ldc + 16 * j, acc[r][j]);
        }
}

/* C [M, ldc] = A B with A's words read as A[i * sa + t * ka], B [Kp, ldb] words, Kp pairs. */
TF_TARGET_AVX512_BF16 static void matmul_dpbf16(float *C, long ldc, const float *A, long sa, long ka,
                                                const float *B, long ldb, long M, long N, long Kp, int band)
{
    for (long j0 = 0; j0 < N; j0 += 64) {
        const long nc = N - j0 < 64 ? N - j0 : 64;
        const int nv = (int)((nc + 15) / 16);
        const long rb = nv <= 2 ? 8 : 4;
        for (long i = 0; i < M; i += rb) {
            const int rows = (int)(M - i < rb ? M - i : rb);
            long k_lo, k_hi, n_hi;
            band_limits(band, i, rows, 2 * Kp, N, &k_lo, &k_hi, &n_hi);
            /* pairs holding those terms */
            k_lo /= 2, k_hi = (k_hi + 1) / 2;
            const long ne = n_hi - j0 < nc ? n_hi - j0 : nc;                  /* columns computed */
            float *c = C + i * ldc + j0;
            zero_cols(c, ldc, rows, ne > 0 ? ne : 0, nc);
            if (ne <= 0) continue;
            const int nve = (int)((ne + 15) / 16);
            const long kn = k_hi > k_lo ? k_hi - k_lo : 0;
            const float *a = A + i * sa + k_lo * ka, *b = B + k_lo * ldb + j0;
#define TILE(R, NV) matmul_tile_dpbf16(c, ldc, a, sa, ka, b, ldb, kn, ne, R, NV)
            switch (nve) {
            case 1:
                switch (rows) {
                case 1: TILE(1, 1); break; case 2: TILE(2, 1); break; case 3: TILE(3, 1); break;
                case 4: TILE(4, 1); break; case 5: TILE(5, 1); break; case 6: TILE(6, 1); break;
                case 7: TILE(7, 1); break; default: TILE(8, 1); break;
                }
                break;
            case 2:
                switch (rows) {
                case 1: TILE(1, 2); break; case 2: TILE(2, 2); break; case 3: TILE(3, 2); break;
                case 4: TILE(4, 2); break; case 5: TILE(5, 2); break; case 6: TILE(6, 2); break;
                case 7: TILE(7, 2); break; default: TILE(8, 2); break;
                }
                break;
            case 3:
                switch (rows) {
                case 1: TILE(1, 3); break; case 2: TILE(2, 3); break; case 3: TILE(3, 3); break;
                default: TILE(4, 3); break;
                }
                break;
            default:
                switch (rows) {
                case 1: TILE(1, 4); break; case 2: TILE(2, 4); break; case 3: TILE(3, 4); break;
                default: TILE(4, 4); break;
                }
                break;
            }
#undef TILE
        }
    }
}

/* One pair at bf16 with vdpbf16ps (see attention_train_forward for the steps). buf: at least
 * dp_buffer_floats(Tq, Tk, dh) floats. */
TF_TARGET_AVX512_BF16 static void forward_pair_dpbf16(
    const float *Q, long ldq, const float *K, long ldk, const float *V, long ldv, const uint8_t *pad,
    float *P, float *ctx, long ldc, long Tq, long Tk, long dh, float scale, int causal,
    float dropout_p, uint64_t seed, uint64_t counter0, float *buf)
{
    const long dhp = (dh + 1) / 2, Tkp = (Tk + 1) / 2, block = Tq * Tk;
    const int cols = causal ? BAND_COLS : BAND_NONE, upto = causal ? BAND_K_UPTO : BAND_NONE;
    float *Qw = buf, *Kw = Qw + Tq * dhp, *Kt = Kw + Tk * dhp, *S = Kt + dhp * Tk, *W = S + block;
    float *Pw = W + block, *Vw = Pw + Tq * Tkp;
    pack_rows_bf16(Qw, Q, ldq, Tq, dh);
    pack_rows_bf16(Kw, K, ldk, Tk, dh);
    transpose_avx512(Kt, Kw, dhp, Tk, dhp);                                   /* Kᵀ's pairs */
    matmul_dpbf16(S, Tk, Qw, dhp, 1, Kt, Tk, Tq, Tk, dhp, cols);              /* S = Q Kᵀ */
    softmax_block_forward(P, S, pad, Tq, Tk, scale, causal);
    const float *Pd = P;
    if (dropout_p > 0.0f) {
        dropout_forward_span(P, W, (size_t)block, dropout_p, seed, counter0);
        Pd = W;
    }
    pack_rows_bf16(Pw, Pd, Tk, Tq, Tk);
    pack_row_pairs_bf16(Vw, V, ldv, Tk, dh);
    matmul_dpbf16(ctx, ldc, Pw, Tkp, 1, Vw, dh, Tq, dh, Tkp, upto);           /* (.) V */
}

TF_TARGET_AVX512_BF16 static void backward_pair_dpbf16(
    const float *dC, long lddc, const float *Q, long ldq, const float *K, long ldk, const float *V,
    long ldv, const float *P, float *dq, long lddq, float *dk, long lddk, float *dv, long lddv,
    long Tq, long Tk, long dh, float scale, int causal, const float *factors, float *buf)
{
    const long dhp = (dh + 1) / 2, Tkp = (Tk + 1) / 2, Tqp = (Tq + 1) / 2, block = Tq * Tk;
    const int cols = causal ? BAND_COLS : BAND_NONE, upto = causal ? BAND_K_UPTO : BAND_NONE;
    const int from = causal ? BAND_K_FROM : BAND_NONE;
    float *dCw = buf, *Vw = dCw + Tq * dhp, *Vt = Vw + Tk * dhp, *G = Vt + dhp * Tk, *W = G + block;
    float *Pp = W + block, *dCp = Pp + Tqp * Tk, *dSw = dCp + Tqp * dh, *Kp = dSw + Tq * Tkp;
    float *dSp = Kp + Tkp * dh, *Qp = dSp + Tqp * Tk;
    pack_rows_bf16(dCw, dC, lddc, Tq, dh);
    pack_rows_bf16(Vw, V, ldv, Tk, dh);
    transpose_avx512(Vt, Vw, dhp, Tk, dhp);                                   /* Vᵀ's pairs */
    matmul_dpbf16(G, Tk, dCw, dhp, 1, Vt, Tk, Tq, Tk, dhp, cols);             /* dP_d = dC Vᵀ */
    const float *Pd = P;
    if (factors) {
        multiply(W, P, factors, block);
        Pd = W;
    }
    /* P_dᵀ's pairs, by column */
    pack_row_pairs_bf16(Pp, Pd, Tk, Tq, Tk);
    pack_row_pairs_bf16(dCp, dC, lddc, Tq, dh);
    matmul_dpbf16(dv, lddv, Pp, 1, Tk, dCp, dh, Tk, dh, Tqp, from);           /* dV = P_dᵀ dC */
    if (factors) multiply(G, G, factors, block);                              /* dP */
    softmax_block_backward(G, P, G, Tq, Tk, scale);                           /* dS, scaled */
    pack_rows_bf16(dSw, G, Tk, Tq, Tk);
    pack_row_pairs_bf16(Kp, K, ldk, Tk, dh);
    matmul_dpbf16(dq, lddq, dSw, Tkp, 1, Kp, dh, Tq, dh, Tkp, upto);          /* dQ = dS K */
    pack_row_pairs_bf16(dSp, G, Tk, Tq, Tk);
    pack_row_pairs_bf16(Qp, Q, ldq, Tq, dh);
    matmul_dpbf16(dk, lddk, dSp, 1, Tk, Qp, dh, Tk, dh, Tqp, from);           /* dK = dSᵀ Q */
}
#endif /* TF_HAVE_X86 */

int attention_train_path(void)
{
#if TF_HAVE_X86
    const int isa = tf_isa();
    if (isa >= TF_ISA_AVX512_BF16) return 3;
    if (isa >= TF_ISA_AVX512) return 2;
    if (isa >= TF_ISA_AVX2) return 1;
#endif
    return 0;
}

static pair_ops ops_pick(void)
{
#if TF_HAVE_X86
    switch (attention_train_path()) {
    case 3:
    case 2: return (pair_ops){matmul_avx512, gather_avx512, transpose_avx512, round_avx512};
    case 1: return (pair_ops){matmul_avx2, gather_avx2, transpose_avx2, round_avx2};
    default: break;
    }
#endif
    return (pair_ops){matmul_generic, gather_generic, transpose_generic, round_generic};
}

/* ------------------------------------------------------------------------- */
/* The thread split: one contiguous range of pairs per thread (schedule(static)'s), each with
 * one buffer of `floats` floats allocated once. */

static float *pair_buffer(long floats)
{
    size_t bytes = ((size_t)floats * sizeof(float) + 63) & ~(size_t)63;
    return aligned_alloc(64, bytes ? bytes : 64);
}

/* Floats the vdpbf16ps path of one pair needs, forward or backward (bounds on both). */
static long dp_buffer_floats(long Tq, long Tk, long dh)
{
    return 3 * (Tq + Tk) * (dh + 1) + 5 * (Tq + 1) * (Tk + 1);
}

static int pair_team(long pairs, long Tq, long Tk, long dh)
{
    int team = tf_team(pairs * Tq * Tk * dh, ATTENTION_TRAIN_GRAIN);
    return team < pairs ? team : (int)pairs;
}

#ifdef _OPENMP
#define PAIR_RANGE(pairs, p0, p1)                                                        \
    int team_ = omp_get_num_threads(), t_ = omp_get_thread_num();                        \
    p0 = (pairs) / team_ * t_ + (t_ < (pairs) % team_ ? t_ : (pairs) % team_);            \
    p1 = p0 + (pairs) / team_ + (t_ < (pairs) % team_ ? 1 : 0)
#else
#define PAIR_RANGE(pairs, p0, p1) p0 = 0, p1 = (pairs)
#endif

/* ------------------------------------------------------------------------- */

void attention_train_forward(const float *q, long ldq, const float *k, long ldk, const float *v,
                             long ldv, const uint8_t *key_padding_mask, float *probs, float *ctx,
                             long ldc, long B, long H, long Tq, long Tk, long dh, float scale,
                             int causal, float dropout_p, uint64_t seed, uint64_t offset, int bf16)
{
    const long pairs = B * H;
    if (pairs == 0 || Tq == 0) return;
    if (Tk == 0) {   /* no keys: zero weights, zero context */
        for (long r = 0; r < B * Tq; r++) memset(ctx + r * ldc, 0, (size_t)(H * dh) * sizeof(float));
        return;
    }
    const pair_ops ops = ops_pick();
    /* bf16 products through vdpbf16ps */
    const int dp = bf16 && attention_train_path() == 3;
    const int cols = causal ? BAND_COLS : BAND_NONE, upto = causal ? BAND_K_UPTO : BAND_NONE;
    const long block = Tq * Tk;
    const int whole = prefetch_whole(Tq, Tk, H, dh);
#pragma omp parallel num_threads(pair_team(pairs, Tq, Tk, dh))
    {
        long p0, p1;
        PAIR_RANGE(pairs, p0, p1);
        /* Qc [Tq, dh], Kc [Tk, dh], Kt [dh, Tk], Vc [Tk, dh], S [Tq, Tk], Pd [Tq, Tk] */
        float *buf = pair_buffer(dp ? dp_buffer_floats(Tq, Tk, dh) : Tq * dh + 3 * Tk * dh + 2 * block);
        float *Qc = buf, *Kc = Qc + Tq * dh, *Kt = Kc + Tk * dh, *Vc = Kt + Tk * dh;
        float *S = Vc + Tk * dh, *Pd = S + block;
        for (long pair = p0; pair < p1; pair++) {
            const long b = pair / H, h = pair % H;
            const float *Q = q + b * Tq * ldq + h * dh;
            const float *K = k + b * Tk * ldk + h * dh;
            const float *V = v + b * Tk * ldv + h * dh;
            float *P = probs + pair * block;
            /* what comes next: the next sentence's rows when short, else the next pair's */
            long nb, c0, width, first, count;     /* (not `cols`: the band above) */
            if (prefetch_next(pair, p0, p1, H, dh, whole, &nb, &c0, &width, &first, &count)) {
                prefetch_rows(q + nb * Tq * ldq + c0, ldq, Tq, width, 0);
                prefetch_rows(k + nb * Tk * ldk + c0, ldk, Tk, width, 0);
                prefetch_rows(v + nb * Tk * ldv + c0, ldv, Tk, width, 0);
                prefetch_rows(ctx + nb * Tq * ldc + c0, ldc, Tq, width, 1);
                prefetch_rows(probs + first * block, block, 1, count * block, 1);
            }
#if TF_HAVE_X86
            if (dp) {
                forward_pair_dpbf16(Q, ldq, K, ldk, V, ldv,
                                    key_padding_mask ? key_padding_mask + b * Tk : NULL,
                                    P, ctx + b * Tq * ldc + h * dh, ldc, Tq, Tk, dh, scale, causal,
                                    dropout_p, seed, offset + (uint64_t)(pair * block), buf);
                continue;
            }
#endif
            /* fp32 reads Q and V in place; bf16 reads rounded copies */
            long lq = ldq, lk = ldk, lv = ldv;
            if (bf16) {
                ops.gather(Qc, Q, ldq, Tq, dh, 1), Q = Qc, lq = dh;
                ops.gather(Kc, K, ldk, Tk, dh, 1), K = Kc, lk = dh;
                ops.gather(Vc, V, ldv, Tk, dh, 1), V = Vc, lv = dh;
            }
            ops.transpose(Kt, K, lk, Tk, dh);
            ops.matmul(S, Tk, Q, lq, 1, Kt, Tk, Tq, Tk, dh, cols);            /* S = Q Kᵀ */
            softmax_block_forward(P, S, key_padding_mask ? key_padding_mask + b * Tk : NULL, Tq, Tk,
                                  /* softmax(S / sqrt(dk)) */
                                  scale, causal);
            const float *W = P;
            if (dropout_p > 0.0f) {
                dropout_forward_span(P, Pd, (size_t)block, dropout_p, seed,
                                     offset + (uint64_t)(pair * block));
                W = Pd;
            }
            if (bf16) {
                if (W == P) memcpy(Pd, P, (size_t)block * sizeof(float));
                ops.round(Pd, block);
                W = Pd;
            }
            /* (.) V */
            ops.matmul(ctx + b * Tq * ldc + h * dh, ldc, W, Tk, 1, V, lv, Tq, dh, Tk, upto);
        }
        free(buf);
    }
}

void attention_train_backward(const float *dctx, long lddc, const float *q, long ldq,
                              const float *k, long ldk, const float *v, long ldv,
                              const float *probs, float *dq, long lddq, float *dk, long lddk,
                              float *dv, long lddv, long B, long H, long Tq, long Tk, long dh,
                              float scale, int causal, float dropout_p, uint64_t seed,
                              uint64_t offset, int bf16)
{
    const long pairs = B * H;
    if (pairs == 0) return;
    if (Tq == 0 || Tk == 0) {   /* an empty side: the other side's gradients are zero */
        for (long r = 0; r < B * Tq; r++) memset(dq + r * lddq, 0, (size_t)(H * dh) * sizeof(float));
        for (long r = 0; r < B * Tk; r++) {
            memset(dk + r * lddk, 0, (size_t)(H * dh) * sizeof(float));
            memset(dv + r * lddv, 0, (size_t)(H * dh) * sizeof(float));
        }
        return;
    }
    const pair_ops ops = ops_pick();
    /* bf16 products through vdpbf16ps */
    const int dp = bf16 && attention_train_path() == 3;
    const int cols = causal ? BAND_COLS : BAND_NONE, upto = causal ? BAND_K_UPTO : BAND_NONE;
    const int from = causal ? BAND_K_FROM : BAND_NONE;
    const long block = Tq * Tk;
    const int whole = prefetch_whole(Tq, Tk, H, dh);
#pragma omp parallel num_threads(pair_team(pairs, Tq, Tk, dh))
    {
        long p0, p1;
        PAIR_RANGE(pairs, p0, p1);
        /* dCc [Tq, dh], Qc [Tq, dh], Kc [Tk, dh], Vc [Tk, dh], Vt [dh, Tk], G [Tq, Tk], W [Tq, Tk] */
        const long used = dp ? dp_buffer_floats(Tq, Tk, dh) : 2 * Tq * dh + 3 * Tk * dh + 2 * block;
        float *buf = pair_buffer(used + (dropout_p > 0.0f ? 2 * block : 0));
        /* the dropout factors of the pair, when dropout */
        float *ones = buf + used, *factors = NULL;
        if (dropout_p > 0.0f) {
            for (long i = 0; i < block; i++) ones[i] = 1.0f;
            factors = ones + block;
        }
        float *dCc = buf, *Qc = dCc + Tq * dh, *Kc = Qc + Tq * dh, *Vc = Kc + Tk * dh;
        float *Vt = Vc + Tk * dh, *G = Vt + Tk * dh, *W = G + block;
        for (long pair = p0; pair < p1; pair++) {
            const long b = pair / H, h = pair % H;
            const float *Q = q + b * Tq * ldq + h * dh;
            const float *K = k + b * Tk * ldk + h * dh;
            const float *V = v + b * Tk * ldv + h * dh;
            const float *dC = dctx + b * Tq * lddc + h * dh;
            const float *P = probs + pair * block;
            long nb, c0, width, first, count;     /* (not `cols`: the band above) */
            if (prefetch_next(pair, p0, p1, H, dh, whole, &nb, &c0, &width, &first, &count)) {
                prefetch_rows(dctx + nb * Tq * lddc + c0, lddc, Tq, width, 0);
                prefetch_rows(q + nb * Tq * ldq + c0, ldq, Tq, width, 0);
                prefetch_rows(k + nb * Tk * ldk + c0, ldk, Tk, width, 0);
                prefetch_rows(v + nb * Tk * ldv + c0, ldv, Tk, width, 0);
                prefetch_rows(probs + first * block, block, 1, count * block, 0);
                prefetch_rows(dq + nb * Tq * lddq + c0, lddq, Tq, width, 1);
                prefetch_rows(dk + nb * Tk * lddk + c0, lddk, Tk, width, 1);
                prefetch_rows(dv + nb * Tk * lddv + c0, lddv, Tk, width, 1);
            }
            if (factors)
                dropout_forward_span(ones, factors, (size_t)block, dropout_p, seed,
                                     offset + (uint64_t)(pair * block));
#if TF_HAVE_X86
            if (dp) {
                backward_pair_dpbf16(dC, lddc, Q, ldq, K, ldk, V, ldv, P,
                                     dq + b * Tq * lddq + h * dh, lddq,
                                     dk + b * Tk * lddk + h * dh, lddk,
                                     dv + b * Tk * lddv + h * dh, lddv,
                                     Tq, Tk, dh, scale, causal, factors, buf);
                continue;
            }
#endif
            long lc = lddc, lq = ldq, lk = ldk, lv = ldv;
            if (bf16) {
                ops.gather(dCc, dC, lddc, Tq, dh, 1), dC = dCc, lc = dh;
                ops.gather(Qc, Q, ldq, Tq, dh, 1), Q = Qc, lq = dh;
                ops.gather(Kc, K, ldk, Tk, dh, 1), K = Kc, lk = dh;
                ops.gather(Vc, V, ldv, Tk, dh, 1), V = Vc, lv = dh;
            }
            ops.transpose(Vt, V, lv, Tk, dh);
            ops.matmul(G, Tk, dC, lc, 1, Vt, Tk, Tq, Tk, dh, cols);           /* dP_d = dC Vᵀ */
            /* P_d, as the forward multiplied V by it */
            const float *Pd = P;
            if (factors) {
                multiply(W, P, factors, block);
                Pd = W;
            }
            if (bf16) {
                if (Pd == P) memcpy(W, P, (size_t)block * sizeof(float));
                ops.round(W, block);
                Pd = W;
            }
            /* dV = P_dᵀ dC */
            ops.matmul(dv + b * Tk * lddv + h * dh, lddv, Pd, 1, Tk, dC, lc, Tk, dh, Tq, from);
            if (factors) multiply(G, G, factors, block);                      /* dP */
            softmax_block_backward(G, P, G, Tq, Tk, scale);                   /* dS, scaled */
            if (bf16) ops.round(G, block);
            /* dQ = dS K */
            ops.matmul(dq + b * Tq * lddq + h * dh, lddq, G, Tk, 1, K, lk, Tq, dh, Tk, upto);
            /* dK = dSᵀ Q */
            ops.matmul(dk + b * Tk * lddk + h * dh, lddk, G, 1, Tk, Q, lq, Tk, dh, Tq, from);
        }
        free(buf);
    }
}
