/* AVX2 + FMA micro-kernel: 6 x 16, 12 ymm accumulators. */
#include "gemm_isa.h"

#ifdef GEMM_X86
#define AVX2_MR 6
#define AVX2_NR 16
/* How far ahead (floats) the stream kernels fetch a pre-packed B: 4 KiB. On Zen 3 (one core, B
 * read from memory, x @ W^T for 8 and 32 rows of K = 512, 2048) that is 3-15% faster than the
 * hardware prefetcher alone, and than 1 or 16 KiB ahead (interleaved repeats, 2026-11-25). */
#define GEMM_STREAM_AHEAD_AVX2 1024
#define TARGET_AVX2 TF_TARGET_AVX2

/* C[mr x nr] = alpha * tile (load_c = 0) or C += alpha * tile, from the 6 x 16 tile's sums. */
static inline __attribute__((always_inline)) TARGET_AVX2 void
store_tile_avx2(const __m256 *c0, const __m256 *c1, float *restrict C, long ldc, int nr,
                const float *alpha, int load_c, const int mr)
{
    __m256 va = _mm256_set1_ps(*alpha);   /* read late: keeps a register free in the loop */
    if (nr == AVX2_NR) {
#pragma GCC unroll 6
        for (int i = 0; i < AVX2_MR; i++)
            if (i < mr) {
                float *c = C + i * ldc;
                if (load_c) {
                    _mm256_storeu_ps(c, _mm256_fmadd_ps(va, c0[i], _mm256_loadu_ps(c)));
                    _mm256_storeu_ps(c + 8, _mm256_fmadd_ps(va, c1[i], _mm256_loadu_ps(c + 8)));
                } else {
                    _mm256_storeu_ps(c, _mm256_mul_ps(va, c0[i]));
                    _mm256_storeu_ps(c + 8, _mm256_mul_ps(va, c1[i]));
                }
            }
    } else {
        float tile[AVX2_NR] __attribute__((aligned(32)));
#pragma GCC unroll 6
        for (int i = 0; i < AVX2_MR; i++)
            if (i < mr) {
                float *c = C + i * ldc;
                _mm256_store_ps(tile, c0[i]);
                _mm256_store_ps(tile + 8, c1[i]);
                /* the same fused rounding as the full-tile path */
                if (load_c)
                    for (int j = 0; j < nr; j++) c[j] = __builtin_fmaf(*alpha, tile[j], c[j]);
                else
                    for (int j = 0; j < nr; j++) c[j] = *alpha * tile[j];
            }
    }
}

/* c0[i] += a[i] * b0, c1[i] += a[i] * b1 for the tile's mr rows: one k of the 6 x 16 tile. */
static inline __attribute__((always_inline)) TARGET_AVX2 void
fma_rows_avx2(__m256 *c0, __m256 *c1, const float *a, __m256 b0, __m256 b1, const int mr)
{
#pragma GCC unroll 6
    for (int i = 0; i < AVX2_MR; i++)
        if (i < mr) {
            __m256 ai = _mm256_broadcast_ss(a + i);
            c0[i] = _mm256_fmadd_ps(ai, b0, c0[i]);
            c1[i] = _mm256_fmadd_ps(ai, b1, c1[i]);
        }
}

static inline __attribute__((always_inline)) TARGET_AVX2 void
kernel_avx2(long kc, const float *restrict Ap, const float *restrict Bp, long bs, float *restrict C,
            long ldc, int nr, const float *alpha, int load_c, const int mr,
            const int stream) /* 1: Bp streams from memory (pre-packed B): fetch ahead */
{
    __m256 c0[AVX2_MR], c1[AVX2_MR];
#pragma GCC unroll 6
    for (int i = 0; i < AVX2_MR; i++)
        if (i < mr) { c0[i] = _mm256_setzero_ps(); c1[i] = _mm256_setzero_ps(); }
    for (long k = 0; k < kc; k++) {
        if (stream)     /* one 64-byte row of the panel per k */
            _mm_prefetch((const char *)(Bp + k * bs + GEMM_STREAM_AHEAD_AVX2), _MM_HINT_T0);
        fma_rows_avx2(c0, c1, Ap + k * AVX2_MR, _mm256_loadu_ps(Bp + k * bs), _mm256_loadu_ps(Bp + k * bs + 8), mr);
    }
    store_tile_avx2(c0, c1, C, ldc, nr, alpha, load_c, mr);
}

/* KERNEL_R and KERNEL_stream_R: the R-row kernels of an AVX2 kernel body, as gemm_kernel. */
#define AVX2_KERNELS(KERNEL, R)                                                              \
    static TARGET_AVX2 void KERNEL##_##R(long kc, const float *Ap, const float *Bp, long bs,  \
                                         float *C, long ldc, int nr, const float *alpha,     \
                                         int load_c)                                         \
    { KERNEL(kc, Ap, Bp, bs, C, ldc, nr, alpha, load_c, R, 0); }                             \
    static TARGET_AVX2 void KERNEL##_stream_##R(long kc, const float *Ap, const float *Bp,    \
                                                long bs, float *C, long ldc, int nr,         \
                                                const float *alpha, int load_c)              \
    { KERNEL(kc, Ap, Bp, bs, C, ldc, nr, alpha, load_c, R, 1); }
#define AVX2_KERNEL(R) AVX2_KERNELS(kernel_avx2, R)
AVX2_KERNEL(1) AVX2_KERNEL(2) AVX2_KERNEL(3) AVX2_KERNEL(4) AVX2_KERNEL(5) AVX2_KERNEL(6)

#define AVX2_STREAM \
    {0, kernel_avx2_stream_1, kernel_avx2_stream_2, kernel_avx2_stream_3, kernel_avx2_stream_4, \
     kernel_avx2_stream_5, kernel_avx2_stream_6}

/* r[0..7] <- its 8 x 8 transpose (r[i][j] <-> r[j][i]). */
static inline __attribute__((always_inline)) TARGET_AVX2 void transpose8(__m256 r[8])
{
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {    /* interleave pairs of rows, 32-bit */
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {    /* u[i + e]: rows i..i+3, element e of each 128-bit lane */
        u[i + 0] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int e = 0; e < 4; e++) {       /* gather the 128-bit lanes */
        r[e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x20);
        r[e + 4] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x31);
    }
}

/* pack_a_any for MR = 6: a row-major A is transposed 8 k-values at a time (the portable loop
 * stores one float per 24 bytes: 7% of a training step on Zen 3). */
static TARGET_AVX2 void pack_a_avx2(int trans_a, const float *A, long lda, long m, long kc, float *Ap)
{
    const int MR = AVX2_MR;
    for (long ip = 0; ip < m; ip += MR) {
        int mr = m - ip < MR ? (int)(m - ip) : MR;
        float *dst = Ap + ip * kc;
        if (trans_a) {
            __m256i mm = tf_lanes8(mr);
            for (long k = 0; k < kc; k++) {
                __m256 v = _mm256_maskload_ps(A + k * lda + ip, mm);
                _mm_storeu_ps(dst + k * MR, _mm256_castps256_ps128(v));
                _mm_storel_pi((__m64 *)(dst + k * MR + 4), _mm256_extractf128_ps(v, 1));
            }
            continue;
        }
        for (long k0 = 0; k0 < kc; k0 += 8) {
            __m256i mk = tf_lanes8(kc - k0);
            __m256 r[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                r[i] = i < mr ? _mm256_maskload_ps(A + (ip + i) * lda + k0, mk) : _mm256_setzero_ps();
            transpose8(r);
            int kn = kc - k0 < 8 ? (int)(kc - k0) : 8;
            for (int k = 0; k < kn; k++) {
                _mm_storeu_ps(dst + (k0 + k) * MR, _mm256_castps256_ps128(r[k]));
                _mm_storel_pi((__m64 *)(dst + (k0 + k) * MR + 4), _mm256_extractf128_ps(r[k], 1));
            }
        }
    }
}

/* pack_b_any for NR = 16: a transposed B is transposed 8 x 8 at a time. */
static TARGET_AVX2 void pack_b_avx2(int trans_b, const float *B, long ldb, long n, long kc, float *Bp)
{
    const int NR = AVX2_NR;
    for (long jp = 0; jp < n; jp += NR) {
        int nr = n - jp < NR ? (int)(n - jp) : NR;
        float *dst = Bp + jp * kc;
        if (!trans_b) {
            __m256i m0 = tf_lanes8(nr), m1 = tf_lanes8(nr - 8);
            const float *src = B + jp;
            for (long k = 0; k < kc; k++) {
                _mm256_storeu_ps(dst + k * NR, _mm256_maskload_ps(src + k * ldb, m0));
                _mm256_storeu_ps(dst + k * NR + 8, _mm256_maskload_ps(src + k * ldb + 8, m1));
            }
            continue;
        }
        for (int h = 0; h < 2; h++) {
            int j0 = 8 * h, jn = nr - j0;   /* columns j0 .. j0+jn of this half */
            for (long k0 = 0; k0 < kc; k0 += 8) {
                __m256i mk = tf_lanes8(kc - k0);
                __m256 r[8];
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++)
                    r[j] = j < jn ? _mm256_maskload_ps(B + (jp + j0 + j) * ldb + k0, mk) : _mm256_setzero_ps();
                transpose8(r);
                int kn = kc - k0 < 8 ? (int)(kc - k0) : 8;
                for (int k = 0; k < kn; k++) _mm256_storeu_ps(dst + (k0 + k) * NR + j0, r[k]);
            }
        }
    }
}

const gemm_isa isa_avx2 = {
    AVX2_MR, AVX2_NR, 256, 144, 4096,
    {0, kernel_avx2_1, kernel_avx2_2, kernel_avx2_3, kernel_avx2_4, kernel_avx2_5,
     kernel_avx2_6}, {0},
    pack_a_avx2, pack_b_avx2, NULL, AVX2_STREAM, 0};

BF16_PACKS(avx2, AVX2_MR, AVX2_NR)

/* K blocks of even length (even_k), as the pre-packed pairs below need, so that a product with a
 * pre-packed B has the bits of the same product packed on the fly. */
const gemm_isa isa_avx2_bf16 = {
    AVX2_MR, AVX2_NR, 256, 144, 4096,
    {0, kernel_avx2_1, kernel_avx2_2, kernel_avx2_3, kernel_avx2_4, kernel_avx2_5,
     kernel_avx2_6}, {0},
    pack_a_avx2_bf16, pack_b_avx2_bf16, NULL, AVX2_STREAM, 1, 0, 0, 1};

/* A pre-packed bf16 B at the AVX2 level (gemm_pack_b, gemm_packed: decoding's x @ W^T) holds bf16
 * pairs as avx512_bf16's does, [ceil(kc/2)][NR] per panel: half the bytes a step streams from
 * memory. The kernel widens each half back to a float (shifts) and runs the fp32
 * kernel's FMA chains in the same order (k = 2t, then 2t + 1), so the bits are those of the
 * rounded floats; op(A) stays packed in floats. */
static inline __attribute__((always_inline)) TARGET_AVX2 void
kernel_avx2_pairs(long kc, const float *restrict Ap, const float *restrict Bp, long bs,
                  float *restrict C, long ldc, int nr, const float *alpha, int load_c, const int mr,
                  const int stream)
{
    __m256 c0[AVX2_MR], c1[AVX2_MR];
#pragma GCC unroll 6
    for (int i = 0; i < AVX2_MR; i++)
        if (i < mr) { c0[i] = _mm256_setzero_ps(); c1[i] = _mm256_setzero_ps(); }
    for (long t = 0; 2 * t < kc; t++) {
        const __m256i *b = (const __m256i *)(Bp + t * bs);
        if (stream)     /* one 64-byte row of pairs per two k */
            _mm_prefetch((const char *)(Bp + t * bs + GEMM_STREAM_AHEAD_AVX2), _MM_HINT_T0);
        const float *a = Ap + 2 * t * AVX2_MR;
        fma_rows_avx2(c0, c1, a, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(b), 16)),
                      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(b + 1), 16)), mr);
        if (2 * t + 1 == kc) break;   /* an odd K block's last k has no partner */
        /* the high halves, low bits cleared by two shifts (no mask held in a register; the 6-row
         * tile still keeps one loaded row of pairs on the stack: a store per 24 FMAs) */
        fma_rows_avx2(c0, c1, a + AVX2_MR,
                      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(_mm256_loadu_si256(b), 16), 16)),
                      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(_mm256_loadu_si256(b + 1), 16), 16)),
                      mr);
    }
    store_tile_avx2(c0, c1, C, ldc, nr, alpha, load_c, mr);
}

#define AVX2_PAIRS_KERNEL(R) AVX2_KERNELS(kernel_avx2_pairs, R)
AVX2_PAIRS_KERNEL(1) AVX2_PAIRS_KERNEL(2) AVX2_PAIRS_KERNEL(3) AVX2_PAIRS_KERNEL(4)
AVX2_PAIRS_KERNEL(5) AVX2_PAIRS_KERNEL(6)

/* Packed panels [kc][NR] of rounded floats (pack_b_avx2_bf16) into pairs in place: pair (t, w)
 * is written at t * NR + w, below every float not read yet (2t * NR + w and on). */
static void pack_b_avx2_pairs(int t, const float *X, long ldx, long n, long kc, float *dst)
{
    pack_b_avx2_bf16(t, X, ldx, n, kc, dst);
    for (long q = 0; q < ceil_div(n, AVX2_NR); q++) {
        uint32_t *x = (uint32_t *)(dst + q * AVX2_NR * kc);
        for (long r = 0; r < (kc + 1) / 2; r++)
            for (int w = 0; w < AVX2_NR; w++) {
                uint32_t lo = x[2 * r * AVX2_NR + w] >> 16;
                uint32_t hi = 2 * r + 1 < kc ? x[(2 * r + 1) * AVX2_NR + w] & 0xffff0000u : 0;
                x[r * AVX2_NR + w] = lo | hi;
            }
    }
}

const gemm_isa isa_avx2_bf16_packed = {
    AVX2_MR, AVX2_NR, 256, 144, 4096,
    {0, kernel_avx2_pairs_1, kernel_avx2_pairs_2, kernel_avx2_pairs_3, kernel_avx2_pairs_4,
     kernel_avx2_pairs_5, kernel_avx2_pairs_6}, {0},
    pack_a_avx2_bf16, pack_b_avx2_pairs, NULL,
    {0, kernel_avx2_pairs_stream_1, kernel_avx2_pairs_stream_2, kernel_avx2_pairs_stream_3,
     kernel_avx2_pairs_stream_4, kernel_avx2_pairs_stream_5, kernel_avx2_pairs_stream_6},
    1, 1, 0, 0};
#endif
