/* Fused attention for training, forward and backward (see attention_train.h).
 *
 * One (sentence, head) pair at a time per thread. Its operands are gathered into contiguous
 * thread-local buffers (rounded to bf16 there when asked; K and V also transposed, once), and
 * every product of the pair is then one small row-major matrix product C = A B:
 *   forward   S = Q Kᵀ,  ctx = P_d V
 *   backward  dP_d = dC Vᵀ,  dV = P_dᵀ dC,  dQ = dS K,  dK = dSᵀ Q
 * C[i, j] is always one fp32 chain over k in increasing order, whichever register tile it falls
 * in, so a pair's results do not depend on how its rows are blocked nor on the thread that runs
 * it. The softmax is softmax.c's row code and the dropout dropout.c's range code, called on one
 * pair's block: the same bits as the unfused kernels for the same scores.
 */
#include "attention_train.h"

#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "dropout.h"
#include "simd_math.h"
#include "softmax.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Multiply-adds per thread below which fewer threads are started: one pair of tiny's shapes
 * (T = 40, dh = 32) is 51K per product, a few microseconds, so two pairs wake a second thread. */
#define ATTENTION_TRAIN_GRAIN 65536L

#define TF_ALWAYS_INLINE inline __attribute__((always_inline))

typedef void (*matmul_fn)(float *C, long ldc, const float *A, long lda, const float *B, long ldb,
                          long M, long N, long K);

/* ------------------------------------------------------------------------- */
/* Operands: gather, round, transpose (plain C at every level: a few percent of a pair's work). */

/* x rounded to the nearest bf16, ties to even, as a float with the low 16 bits zero; subnormal
 * results become zero of their sign and NaN stays NaN: gemm.h's GEMM_BF16 rounding. */
static inline float round_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) u |= 0x00400000u;
    else u += 0x7fffu + ((u >> 16) & 1u);
    u &= (u & 0x7f800000u) ? 0xffff0000u : 0x80000000u;
    memcpy(&x, &u, 4);
    return x;
}

/* dst [rows, cols] contiguous = src [rows, lds] (rounded to bf16 when bf16). */
static void gather(float *dst, const float *src, long lds, long rows, long cols, int bf16)
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

/* dst [cols, rows] contiguous = transpose of src [rows, lds] (rounded to bf16 when bf16). */
static void transpose(float *dst, const float *src, long lds, long rows, long cols, int bf16)
{
    for (long r = 0; r < rows; r++) {
        const float *s = src + r * lds;
        if (bf16)
            for (long c = 0; c < cols; c++) dst[c * rows + r] = round_bf16(s[c]);
        else
            for (long c = 0; c < cols; c++) dst[c * rows + r] = s[c];
    }
}

static void round_block(float *x, long n)
{
    for (long i = 0; i < n; i++) x[i] = round_bf16(x[i]);
}

/* ------------------------------------------------------------------------- */
/* C [M, ldc] = A [M, lda] B [K, ldb] (C[:, :N] overwritten). Plain C: the reference. */

static void matmul_generic(float *C, long ldc, const float *A, long lda, const float *B, long ldb,
                           long M, long N, long K)
{
    for (long i = 0; i < M; i++) {
        float *c = C + i * ldc;
        for (long j = 0; j < N; j++) c[j] = 0.0f;
        for (long k = 0; k < K; k++) {
            const float a = A[i * lda + k];
            const float *b = B + k * ldb;
            for (long j = 0; j < N; j++) c[j] += a * b[j];
        }
    }
}

#if TF_HAVE_X86
/* ------------------------------------------------------------------------- */
/* AVX-512: R rows x NV vectors of 16 columns held in registers over the whole k loop. */

TF_TARGET_AVX512 static TF_ALWAYS_INLINE void matmul_tile_avx512(
    float *C, long ldc, const float *A, long lda, const float *B, long ldb, long K, long ncols,
    const int R, const int NV)
{
    __m512 acc[8][4];
    const __mmask16 last = tf_lanes16(ncols - 16 * (NV - 1));
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) acc[r][j] = _mm512_setzero_ps();
    for (long k = 0; k < K; k++) {
        __m512 b[4];
        const float *bk = B + k * ldb;
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++)
            b[j] = j == NV - 1 ? _mm512_maskz_loadu_ps(last, bk + 16 * j) : _mm512_loadu_ps(bk + 16 * j);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const __m512 a = _mm512_set1_ps(A[r * lda + k]);
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

TF_TARGET_AVX512 static void matmul_avx512(float *C, long ldc, const float *A, long lda,
                                           const float *B, long ldb, long M, long N, long K)
{
    for (long j0 = 0; j0 < N; j0 += 64) {
        const long nc = N - j0 < 64 ? N - j0 : 64;
        const int nv = (int)((nc + 15) / 16);
        const long rb = nv <= 2 ? 8 : 4;   /* 16 accumulators either way */
        for (long i = 0; i < M; i += rb) {
            const int rows = (int)(M - i < rb ? M - i : rb);
            float *c = C + i * ldc + j0;
            const float *a = A + i * lda, *b = B + j0;
#define TILE(R, NV) matmul_tile_avx512(c, ldc, a, lda, b, ldb, K, nc, R, NV)
            switch (nv) {
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

/* ------------------------------------------------------------------------- */
/* AVX2: R rows x NV vectors of 8 columns (at most 12 accumulators of the 16 ymm registers). */

TF_TARGET_AVX2 static TF_ALWAYS_INLINE void matmul_tile_avx2(
    float *C, long ldc, const float *A, long lda, const float *B, long ldb, long K, long ncols,
    const int R, const int NV)
{
    __m256 acc[4][4];
    const __m256i last = tf_lanes8(ncols - 8 * (NV - 1));
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) acc[r][j] = _mm256_setzero_ps();
    for (long k = 0; k < K; k++) {
        __m256 b[4];
        const float *bk = B + k * ldb;
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++)
            b[j] = j == NV - 1 ? _mm256_maskload_ps(bk + 8 * j, last) : _mm256_loadu_ps(bk + 8 * j);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m256 a = _mm256_broadcast_ss(A + r * lda + k);
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

TF_TARGET_AVX2 static void matmul_avx2(float *C, long ldc, const float *A, long lda,
                                       const float *B, long ldb, long M, long N, long K)
{
    for (long j0 = 0; j0 < N; j0 += 32) {
        const long nc = N - j0 < 32 ? N - j0 : 32;
        const int nv = (int)((nc + 7) / 8);
        const long rb = nv <= 2 ? 4 : 3;
        for (long i = 0; i < M; i += rb) {
            const int rows = (int)(M - i < rb ? M - i : rb);
            float *c = C + i * ldc + j0;
            const float *a = A + i * lda, *b = B + j0;
#define TILE(R, NV) matmul_tile_avx2(c, ldc, a, lda, b, ldb, K, nc, R, NV)
            switch (nv * 4 + rows) {
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
#endif /* TF_HAVE_X86 */

int attention_train_path(void)
{
#if TF_HAVE_X86
    const int isa = tf_isa();
    if (isa >= TF_ISA_AVX512) return 2;
    if (isa >= TF_ISA_AVX2) return 1;
#endif
    return 0;
}

static matmul_fn matmul_pick(void)
{
#if TF_HAVE_X86
    switch (attention_train_path()) {
    case 2: return matmul_avx512;
    case 1: return matmul_avx2;
    default: break;
    }
#endif
    return matmul_generic;
}

/* ------------------------------------------------------------------------- */
/* The thread split: one contiguous range of pairs per thread (schedule(static)'s), each with
 * one buffer of `floats` floats allocated once. */

static float *pair_buffer(long floats)
{
    size_t bytes = ((size_t)floats * sizeof(float) + 63) & ~(size_t)63;
    return aligned_alloc(64, bytes ? bytes : 64);
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
    const matmul_fn matmul = matmul_pick();
    const long block = Tq * Tk;
#pragma omp parallel num_threads(pair_team(pairs, Tq, Tk, dh))
    {
        long p0, p1;
        PAIR_RANGE(pairs, p0, p1);
        /* Qc [Tq, dh], Kt [dh, Tk], Vc [Tk, dh], S [Tq, Tk], Pd [Tq, Tk] */
        float *buf = pair_buffer(Tq * dh + 2 * Tk * dh + 2 * block);
        float *Qc = buf, *Kt = Qc + Tq * dh, *Vc = Kt + Tk * dh, *S = Vc + Tk * dh, *Pd = S + block;
        for (long pair = p0; pair < p1; pair++) {
            const long b = pair / H, h = pair % H;
            const float *Q = q + b * Tq * ldq + h * dh;
            const float *K = k + b * Tk * ldk + h * dh;
            const float *V = v + b * Tk * ldv + h * dh;
            float *P = probs + pair * block;
            /* Q read in place in fp32 (unit stride along dh); rounded copies for bf16 */
            const float *A = Q;
            long lda = ldq;
            if (bf16) { gather(Qc, Q, ldq, Tq, dh, 1); A = Qc; lda = dh; }
            transpose(Kt, K, ldk, Tk, dh, bf16);
            matmul(S, Tk, A, lda, Kt, Tk, Tq, Tk, dh);                       /* S = Q Kᵀ */
            softmax_block_forward(P, S, key_padding_mask ? key_padding_mask + b * Tk : NULL, Tq, Tk,
                                  scale, causal);                            /* softmax(S / sqrt(dk)) */
            const float *W = P;
            if (dropout_p > 0.0f) {
                dropout_forward_span(P, Pd, (size_t)block, dropout_p, seed, offset + (uint64_t)(pair * block));
                W = Pd;
            }
            if (bf16) {
                if (W == P) memcpy(Pd, P, (size_t)block * sizeof(float));
                round_block(Pd, block);
                W = Pd;
            }
            const float *Vb = V;
            long ldvb = ldv;
            if (bf16) { gather(Vc, V, ldv, Tk, dh, 1); Vb = Vc; ldvb = dh; }
            matmul(ctx + b * Tq * ldc + h * dh, ldc, W, Tk, Vb, ldvb, Tq, dh, Tk);   /* (.) V */
        }
        free(buf);
    }
}

void attention_train_backward(const float *dctx, long lddc, const float *q, long ldq,
                              const float *k, long ldk, const float *v, long ldv,
                              const float *probs, float *dq, long lddq, float *dk, long lddk,
                              float *dv, long lddv, long B, long H, long Tq, long Tk, long dh,
                              float scale, float dropout_p, uint64_t seed, uint64_t offset,
                              int bf16)
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
    const matmul_fn matmul = matmul_pick();
    const long block = Tq * Tk;
#pragma omp parallel num_threads(pair_team(pairs, Tq, Tk, dh))
    {
        long p0, p1;
        PAIR_RANGE(pairs, p0, p1);
        /* dCc [Tq, dh], Qc [Tq, dh], Kc [Tk, dh], Vt [dh, Tk], G [Tq, Tk], W [Tq, Tk], T [Tk, Tq] */
        float *buf = pair_buffer(2 * Tq * dh + 2 * Tk * dh + 3 * block);
        float *dCc = buf, *Qc = dCc + Tq * dh, *Kc = Qc + Tq * dh, *Vt = Kc + Tk * dh;
        float *G = Vt + Tk * dh, *W = G + block, *T = W + block;
        for (long pair = p0; pair < p1; pair++) {
            const long b = pair / H, h = pair % H;
            const float *Q = q + b * Tq * ldq + h * dh;
            const float *K = k + b * Tk * ldk + h * dh;
            const float *V = v + b * Tk * ldv + h * dh;
            const float *dC = dctx + b * Tq * lddc + h * dh;
            const float *P = probs + pair * block;
            const uint64_t counter0 = offset + (uint64_t)(pair * block);
            const float *dCb = dC, *Qb = Q, *Kb = K;
            long lddcb = lddc, ldqb = ldq, ldkb = ldk;
            if (bf16) {
                gather(dCc, dC, lddc, Tq, dh, 1); dCb = dCc; lddcb = dh;
                gather(Qc, Q, ldq, Tq, dh, 1); Qb = Qc; ldqb = dh;
                gather(Kc, K, ldk, Tk, dh, 1); Kb = Kc; ldkb = dh;
            }
            transpose(Vt, V, ldv, Tk, dh, bf16);
            matmul(G, Tk, dCb, lddcb, Vt, Tk, Tq, Tk, dh);                   /* dP_d = dC Vᵀ */
            /* P_d, as the forward multiplied V by it */
            const float *Pd = P;
            if (dropout_p > 0.0f) {
                dropout_forward_span(P, W, (size_t)block, dropout_p, seed, counter0);
                Pd = W;
            }
            transpose(T, Pd, Tk, Tq, Tk, bf16);
            matmul(dv + b * Tk * lddv + h * dh, lddv, T, Tq, dCb, lddcb, Tk, dh, Tq);  /* dV = P_dᵀ dC */
            if (dropout_p > 0.0f)
                dropout_forward_span(G, G, (size_t)block, dropout_p, seed, counter0);   /* dP */
            softmax_block_backward(G, P, G, Tq, Tk, scale);                 /* dS, scaled */
            if (bf16) round_block(G, block);
            matmul(dq + b * Tq * lddq + h * dh, lddq, G, Tk, Kb, ldkb, Tq, dh, Tk);   /* dQ = dS K */
            transpose(T, G, Tk, Tq, Tk, 0);
            matmul(dk + b * Tk * lddk + h * dh, lddk, T, Tq, Qb, ldqb, Tk, dh, Tq);   /* dK = dSᵀ Q */
        }
        free(buf);
    }
}
