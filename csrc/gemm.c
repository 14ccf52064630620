/* GEMM: packed, cache-blocked, register-blocked (see gemm.h for the contract).
 *
 * The structure is the classic BLIS/GotoBLAS one:
 *
 *   for jc in N by NC:                        B block  [K x NC]  packed (L3)
 *     for ic in M by MC:
 *       for pc in K by KC:                    (fixed K blocking: result bits never depend on threads)
 *         pack A[ic:ic+mc, pc:pc+kc] -> Ap    A block [MC x KC] (L2), micro-panels [kc][MR]
 *         for jr in nc by NR:                 B micro-panel [kc x NR] stays in L1
 *           for ir in mc by MR:
 *             micro-kernel: C[MR x NR] (+)= alpha * Ap[MR x kc] @ Bp[kc x NR]
 *
 * The micro-kernel keeps the MR x NR tile of C in registers (AVX-512: 14 x 32 =
 * 28 zmm accumulators, one broadcast per row and two FMAs; AVX2 + FMA: 6 x 16 in
 * 12 ymm; plain C: 4 x 8) and runs one FMA chain per element of C over the kc
 * values of a K block (bf16 at the avx512_bf16 level: one vdpbf16ps chain over the kc / 2
 * pairs, the AVX-512 tile; at the amx level a 32 x 32 tile of C in four AMX tile registers,
 * tdpbf16ps over steps of 32 k, see isa_amx_bf16). Packing reads every transposition variant
 * and leading dimension (AVX-512: 16 x 16 register transposes), so no copy of the caller's
 * data exists outside the packing buffers. Edge tiles: rows via kernels
 * specialised for 1..MR rows (no wasted FMAs on short panels), columns via
 * zero-padded B panels and masked stores (AVX-512) or a small spill tile.
 *
 * Schedules (which one depends on the shape and ISA only, so the bits of C never
 * depend on the thread count: every element is computed by the same instructions
 * whichever thread computes it):
 *  - private: one thread, the loops above;
 *  - narrow:  few rows (attention heads, decoding): all of op(A) is packed once,
 *             then each B micro-panel is packed (or, for a row-major B and at
 *             most two row panels, read in place) and consumed at once from L1;
 *             threads take groups of panels from a shared counter;
 *  - tiles:   a few threads on a large product: C is cut into tiles that
 *             threads take from a shared counter, each packing its own A and B
 *             blocks (no barriers: a thread the OS stalls holds nobody up);
 *  - shared:  many threads on a large product (BLIS): per N block and K block the
 *             team packs the B block once into a shared buffer, then each thread
 *             multiplies its own rows (and, for few rows, columns) against it;
 *  - dot:     (AVX-512) few rows of A @ B^T (decoding x @ W^T): dot products of
 *             contiguous rows, 4 x 4 tiles of C, no packing at all;
 *  - batches of small products: threads take groups of batch entries.
 *
 * gemm_packed (gemm.h) multiplies by an op(B) packed once ahead (decoding: the same weights
 * every step), panel by panel in one sequential pass with a prefetching copy of the kernels:
 * the weights stream at ~36 GB/s on one core, where the dot schedule reaches ~20.
 */
#include "gemm.h"
#include "amx.h"
#include "cpu.h"
#include "simd_math.h"

#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if TF_HAVE_X86
#define GEMM_X86 1
#endif

#define MAX_MR 32   /* the amx tile kernel's 32 rows; the register kernels have at most 14 */

/* C[mr x nr] = alpha * Ap @ Bp (load_c = 0) or C += alpha * Ap @ Bp (load_c = 1).
 * Ap: [kc][MR] packed rows of op(A). Bp: kc rows of op(B), row k at Bp + k*bs (bs = NR
 * when packed; columns past nr are zero in packed panels, never read when in place). */
typedef void (*gemm_kernel)(long kc, const float *Ap, const float *Bp, long bs, float *C, long ldc,
                            int nr, const float *alpha, int load_c);

/* Pack rows [0, m) (pack_a) or columns [0, n) (pack_b) of an operand block into micro-panels. */
typedef void (*gemm_pack)(int trans, const float *X, long ldx, long n, long kc, float *dst);

/* Columns [j0, j1) of C = alpha * A @ B^T (+ C), A row-major M x K, B row-major N x K:
 * every element one dot product of two contiguous rows (decoding: few rows, a weight matrix). */
typedef void (*gemm_dot)(long M, long K, float alpha, const float *A, long lda, const float *B, long ldb,
                         int accumulate, float *C, long ldc, long j0, long j1);

typedef struct {
    int mr, nr;            /* register tile */
    long kc, mc, nc;       /* cache blocks: K (maximum), M per thread block, N */
    gemm_kernel kernel[MAX_MR + 1];   /* kernel[r] computes r <= mr rows */
    gemm_kernel half[MAX_MR + 1];     /* the same for at most nr / 2 columns, or NULLs */
    gemm_pack pack_a, pack_b;
    gemm_dot dot;          /* A @ B^T for few rows without packing, or NULL */
    gemm_kernel stream[MAX_MR + 1];   /* kernel[r] for a Bp streamed from memory, or NULLs */
    int bf16;              /* 1: operands rounded to bf16 while packing; nothing read unpacked */
    int pairs;             /* 1: packed B panels hold bf16 pairs [ceil(kc/2)][NR] (vdpbf16ps, amx); A
                              panels too, except amx's (rows of kc bf16: pack_a_amx) */
    int amx;               /* 1: tile kernels: tf_amx_begin / tf_amx_end around them (amx.h) */
    int even_k;            /* 1: K blocks of even length, as pairs have (k_block), with packing in
                              floats: AVX2's bf16 kernels, whose pre-packed B holds pairs */
} gemm_isa;

static long ceil_div(long a, long b) { return (a + b - 1) / b; }
static long min_l(long a, long b) { return a < b ? a : b; }
static long max_l(long a, long b) { return a > b ? a : b; }

/* Multiply-adds per thread below which a GEMM does not start another thread (2M: about 20 us
 * of work; waking a sleeping OpenMP team costs tens of us on a virtual machine, and on a busy
 * machine the join can wait a whole scheduler tick). */
#define GEMM_GRAIN (1L << 21)
/* The same for gemm_packed, decoding's x @ W^T: called back to back on an awake team, so a
 * smaller grain pays (GEMM_GRAIN left a base-size step's 8-row products by 512 x 512 weights on
 * one thread: 2 threads decoded fp32 greedy 7% slower than with them split; AMD EPYC Zen 2). */
#define GEMM_PACKED_GRAIN (1L << 20)
/* A thread's B block in the tiles schedule holds at most this many floats (4 MiB of L3). */
#define GEMM_TILE_B (1L << 20)
/* A @ B^T uses the dot kernel for K >= GEMM_DOT_MIN_K and at most GEMM_DOT_ROWS / 2 rows, or
 * GEMM_DOT_ROWS rows when K >= 4 * GEMM_DOT_MIN_K (measured: its fixed cost per 4 x 4 tile
 * needs a long K; packing needs many rows). */
#define GEMM_DOT_ROWS 24
#define GEMM_DOT_MIN_K 64
/* How far ahead (floats) a kernel reading a pre-packed B from memory fetches it (measured on
 * Zen 5: 1024 -> 29, 2048 -> 34, 4096 -> 36 GB/s, 8192 -> 33 GB/s for x @ W^T, 8 rows). */
#ifndef GEMM_STREAM_AHEAD
#define GEMM_STREAM_AHEAD 4096
#endif
/* The narrow schedule packs all of op(A) when it has at most this many floats (1 MiB). */
#define GEMM_NARROW_A (1L << 18)

/* ------------------------------------------------------------------------- */
/* Portable packing: any MR / NR. */

/* Ap <- rows [0, m) x columns [0, kc) of op(A), as ceil(m/MR) micro-panels [kc][MR]
 * (panel p at Ap + p*MR*kc; rows past m are zero).
 * A points at element (0, 0) of the block: op(A)[i][k] = trans_a ? A[k*lda + i] : A[i*lda + k]. */
static void pack_a_any(int trans_a, const float *A, long lda, long m, long kc, int MR, float *Ap)
{
    for (long ip = 0; ip < m; ip += MR) {
        int mr = m - ip < MR ? (int)(m - ip) : MR;
        float *dst = Ap + ip * kc;
        if (!trans_a) {
            for (int i = 0; i < mr; i++) {
                const float *src = A + (ip + i) * lda;
                for (long k = 0; k < kc; k++) dst[k * MR + i] = src[k];
            }
            for (int i = mr; i < MR; i++)
                for (long k = 0; k < kc; k++) dst[k * MR + i] = 0.0f;
        } else {
            for (long k = 0; k < kc; k++) {
                const float *src = A + k * lda + ip;
                float *d = dst + k * MR;
                for (int i = 0; i < mr; i++) d[i] = src[i];
                for (int i = mr; i < MR; i++) d[i] = 0.0f;
            }
        }
    }
}

/* Bp <- rows [0, kc) x columns [0, n) of op(B), as ceil(n/NR) micro-panels [kc][NR]
 * (panel p at Bp + p*NR*kc; columns past n are zero).
 * op(B)[k][j] = trans_b ? B[j*ldb + k] : B[k*ldb + j]. */
static void pack_b_any(int trans_b, const float *B, long ldb, long n, long kc, int NR, float *Bp)
{
    for (long jp = 0; jp < n; jp += NR) {
        int nr = n - jp < NR ? (int)(n - jp) : NR;
        float *dst = Bp + jp * kc;
        if (!trans_b) {
            for (long k = 0; k < kc; k++) {
                const float *src = B + k * ldb + jp;
                float *d = dst + k * NR;
                for (int j = 0; j < nr; j++) d[j] = src[j];
                for (int j = nr; j < NR; j++) d[j] = 0.0f;
            }
        } else {
            for (int j = 0; j < nr; j++) {
                const float *src = B + (jp + j) * ldb;
                for (long k = 0; k < kc; k++) dst[k * NR + j] = src[k];
            }
            for (int j = nr; j < NR; j++)
                for (long k = 0; k < kc; k++) dst[k * NR + j] = 0.0f;
        }
    }
}

/* ------------------------------------------------------------------------- */
/* Plain C micro-kernel: 4 x 8. */

#define GEN_MR 4
#define GEN_NR 8

static void kernel_generic(long kc, const float *Ap, const float *Bp, long bs, float *C, long ldc,
                           int nr, const float *alpha, int load_c, int mr)
{
    float acc[GEN_MR][GEN_NR] = {{0}};
    for (long k = 0; k < kc; k++) {
        const float *a = Ap + k * GEN_MR, *b = Bp + k * bs;
        for (int i = 0; i < GEN_MR; i++)
            for (int j = 0; j < GEN_NR; j++)
                acc[i][j] += a[i] * b[j];
    }
    for (int i = 0; i < mr; i++) {
        float *c = C + i * ldc;
        if (load_c)
            for (int j = 0; j < nr; j++) c[j] += *alpha * acc[i][j];
        else
            for (int j = 0; j < nr; j++) c[j] = *alpha * acc[i][j];
    }
}

#define GEN_KERNEL(R)                                                                      \
    static void kernel_generic_##R(long kc, const float *Ap, const float *Bp, long bs,       \
                                   float *C, long ldc, int nr, const float *alpha,          \
                                   int load_c)                                              \
    { kernel_generic(kc, Ap, Bp, bs, C, ldc, nr, alpha, load_c, R); }
GEN_KERNEL(1) GEN_KERNEL(2) GEN_KERNEL(3) GEN_KERNEL(4)

static void pack_a_generic(int t, const float *X, long ldx, long n, long kc, float *dst)
{ pack_a_any(t, X, ldx, n, kc, GEN_MR, dst); }
static void pack_b_generic(int t, const float *X, long ldx, long n, long kc, float *dst)
{ pack_b_any(t, X, ldx, n, kc, GEN_NR, dst); }

static const gemm_isa isa_generic = {
    GEN_MR, GEN_NR, 256, 128, 2048,
    {0, kernel_generic_1, kernel_generic_2, kernel_generic_3, kernel_generic_4}, {0},
    pack_a_generic, pack_b_generic, NULL, {0}, 0};

/* ------------------------------------------------------------------------- */
/* bf16 operands (gemm.h: GEMM_BF16). Each ISA's packing routines, followed by rounding the packed
 * block to bf16 in place; the fp32 micro-kernels then multiply exactly (a product of two bf16
 * values has at most 16 significant bits, so an FMA adds it to the accumulator with the single
 * rounding of an fp32 sum, as vdpbf16ps does). Nothing is read unpacked: no dot path, no B read
 * in place. */

/* x rounded to the nearest bf16, ties to even, kept as a float with the low 16 bits zero; a
 * subnormal result is zero of its sign (vdpbf16ps treats subnormal inputs as zero, so every level
 * does). NaN stays NaN (quietened: rounding could carry its payload into infinity). */
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

static void round_bf16_block(float *p, long n)
{
    for (long i = 0; i < n; i++) p[i] = round_bf16(p[i]);
}

#define BF16_PACKS(NAME, MR, NR)                                                               \
    static void pack_a_##NAME##_bf16(int t, const float *X, long ldx, long n, long kc, float *dst) \
    { pack_a_##NAME(t, X, ldx, n, kc, dst); round_bf16_block(dst, ceil_div(n, MR) * MR * kc); }  \
    static void pack_b_##NAME##_bf16(int t, const float *X, long ldx, long n, long kc, float *dst) \
    { pack_b_##NAME(t, X, ldx, n, kc, dst); round_bf16_block(dst, ceil_div(n, NR) * NR * kc); }

BF16_PACKS(generic, GEN_MR, GEN_NR)

static const gemm_isa isa_generic_bf16 = {
    GEN_MR, GEN_NR, 256, 128, 2048,
    {0, kernel_generic_1, kernel_generic_2, kernel_generic_3, kernel_generic_4}, {0},
    pack_a_generic_bf16, pack_b_generic_bf16, NULL, {0}, 1};

#ifdef GEMM_X86
/* ------------------------------------------------------------------------- */
/* AVX2 + FMA micro-kernel: 6 x 16, 12 ymm accumulators. */

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

static const gemm_isa isa_avx2 = {
    AVX2_MR, AVX2_NR, 256, 144, 4096,
    {0, kernel_avx2_1, kernel_avx2_2, kernel_avx2_3, kernel_avx2_4, kernel_avx2_5,
     kernel_avx2_6}, {0},
    pack_a_avx2, pack_b_avx2, NULL, AVX2_STREAM, 0};

BF16_PACKS(avx2, AVX2_MR, AVX2_NR)

/* K blocks of even length (even_k), as the pre-packed pairs below need, so that a product with a
 * pre-packed B has the bits of the same product packed on the fly. */
static const gemm_isa isa_avx2_bf16 = {
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

static const gemm_isa isa_avx2_bf16_packed = {
    AVX2_MR, AVX2_NR, 256, 144, 4096,
    {0, kernel_avx2_pairs_1, kernel_avx2_pairs_2, kernel_avx2_pairs_3, kernel_avx2_pairs_4,
     kernel_avx2_pairs_5, kernel_avx2_pairs_6}, {0},
    pack_a_avx2_bf16, pack_b_avx2_pairs, NULL,
    {0, kernel_avx2_pairs_stream_1, kernel_avx2_pairs_stream_2, kernel_avx2_pairs_stream_3,
     kernel_avx2_pairs_stream_4, kernel_avx2_pairs_stream_5, kernel_avx2_pairs_stream_6},
    1, 1, 0, 0};

/* ------------------------------------------------------------------------- */
/* AVX-512 micro-kernel: 14 x 32, 28 zmm accumulators. */

#define AVX512_MR 14
#define AVX512_NR 32
#define TARGET_AVX512 TF_TARGET_AVX512

/* C[mr x nr] (+)= alpha * the accumulators c0 (columns 0-15) and c1 (16-31, when wide). */
static inline __attribute__((always_inline)) TARGET_AVX512 void
store_tile_avx512(const __m512 *c0, const __m512 *c1, float *restrict C, long ldc, int nr,
                  const float *alpha, int load_c, const int mr, const int wide)
{
    __m512 va = _mm512_set1_ps(*alpha);   /* read late: all 32 registers serve the loop */
    if (wide && nr == AVX512_NR) {
#pragma GCC unroll 14
        for (int i = 0; i < AVX512_MR; i++)
            if (i < mr) {
                float *c = C + i * ldc;
                if (load_c) {
                    _mm512_storeu_ps(c, _mm512_fmadd_ps(va, c0[i], _mm512_loadu_ps(c)));
                    _mm512_storeu_ps(c + 16, _mm512_fmadd_ps(va, c1[i], _mm512_loadu_ps(c + 16)));
                } else {
                    _mm512_storeu_ps(c, _mm512_mul_ps(va, c0[i]));
                    _mm512_storeu_ps(c + 16, _mm512_mul_ps(va, c1[i]));
                }
            }
    } else {
        __mmask16 m0 = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1);
        __mmask16 m1 = nr <= 16 ? (__mmask16)0 : (__mmask16)((1u << (nr - 16)) - 1);
#pragma GCC unroll 14
        for (int i = 0; i < AVX512_MR; i++)
            if (i < mr) {
                float *c = C + i * ldc;
                if (load_c) {
                    _mm512_mask_storeu_ps(c, m0, _mm512_fmadd_ps(va, c0[i], _mm512_maskz_loadu_ps(m0, c)));
                    if (wide)
                        _mm512_mask_storeu_ps(c + 16, m1,
                                              _mm512_fmadd_ps(va, c1[i], _mm512_maskz_loadu_ps(m1, c + 16)));
                } else {
                    _mm512_mask_storeu_ps(c, m0, _mm512_mul_ps(va, c0[i]));
                    if (wide) _mm512_mask_storeu_ps(c + 16, m1, _mm512_mul_ps(va, c1[i]));
                }
            }
    }
}

static inline __attribute__((always_inline)) TARGET_AVX512 void
kernel_avx512(long kc, const float *restrict Ap, const float *restrict Bp, long bs,
              float *restrict C, long ldc, int nr, const float *alpha, int load_c, const int mr,
              const int wide,   /* wide = 0: only the first 16 columns (nr <= 16) */
              const int stream) /* 1: Bp streams from memory (pre-packed B): fetch ahead */
{
    __m512 c0[AVX512_MR], c1[AVX512_MR];
#pragma GCC unroll 14
    for (int i = 0; i < AVX512_MR; i++)
        if (i < mr) {
            c0[i] = _mm512_setzero_ps();
            c1[i] = _mm512_setzero_ps();
            _mm_prefetch((const char *)(C + i * ldc), _MM_HINT_T0);
            if (wide) _mm_prefetch((const char *)(C + i * ldc + 16), _MM_HINT_T0);
        }
    for (long k = 0; k < kc; k++) {
        if (stream) {   /* 16 KiB ahead: the hardware prefetcher alone streams ~22 of 40 GB/s */
            _mm_prefetch((const char *)(Bp + k * bs + GEMM_STREAM_AHEAD), _MM_HINT_T0);
            _mm_prefetch((const char *)(Bp + k * bs + GEMM_STREAM_AHEAD + 16), _MM_HINT_T0);
        }
        __m512 b0 = _mm512_loadu_ps(Bp + k * bs);
        __m512 b1 = wide ? _mm512_loadu_ps(Bp + k * bs + 16) : b0;
        const float *a = Ap + k * AVX512_MR;
#pragma GCC unroll 14
        for (int i = 0; i < AVX512_MR; i++)
            if (i < mr) {
                __m512 ai = _mm512_set1_ps(a[i]);
                c0[i] = _mm512_fmadd_ps(ai, b0, c0[i]);
                if (wide) c1[i] = _mm512_fmadd_ps(ai, b1, c1[i]);
            }
    }
    store_tile_avx512(c0, c1, C, ldc, nr, alpha, load_c, mr, wide);
}

#define AVX512_KERNEL(R)                                                                   \
    static TARGET_AVX512 void kernel_avx512_##R(long kc, const float *Ap, const float *Bp,  \
                                                long bs, float *C, long ldc, int nr,        \
                                                const float *alpha, int load_c)             \
    { kernel_avx512(kc, Ap, Bp, bs, C, ldc, nr, alpha, load_c, R, 1, 0); }                   \
    static TARGET_AVX512 void kernel_avx512_half_##R(long kc, const float *Ap, const float *Bp, \
                                                     long bs, float *C, long ldc, int nr,   \
                                                     const float *alpha, int load_c)        \
    { kernel_avx512(kc, Ap, Bp, bs, C, ldc, nr, alpha, load_c, R, 0, 0); }                   \
    static TARGET_AVX512 void kernel_avx512_stream_##R(long kc, const float *Ap, const float *Bp, \
                                                       long bs, float *C, long ldc, int nr, \
                                                       const float *alpha, int load_c)      \
    { kernel_avx512(kc, Ap, Bp, bs, C, ldc, nr, alpha, load_c, R, 1, 1); }
AVX512_KERNEL(1) AVX512_KERNEL(2) AVX512_KERNEL(3) AVX512_KERNEL(4) AVX512_KERNEL(5)
AVX512_KERNEL(6) AVX512_KERNEL(7) AVX512_KERNEL(8) AVX512_KERNEL(9) AVX512_KERNEL(10)
AVX512_KERNEL(11) AVX512_KERNEL(12) AVX512_KERNEL(13) AVX512_KERNEL(14)

/* r[0..15] <- its 16 x 16 transpose (r[i][j] <-> r[j][i]). */
static inline __attribute__((always_inline)) TARGET_AVX512 void transpose16(__m512 r[16])
{
    __m512 t[16], u[16], v[8];
    for (int i = 0; i < 16; i += 2) {   /* interleave pairs of rows, 32-bit */
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {   /* u[i + e]: rows i..i+3, element e of each 128-bit lane */
        u[i + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        u[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        u[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        u[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    for (int e = 0; e < 4; e++) {      /* gather the 128-bit lanes */
        v[0] = _mm512_shuffle_f32x4(u[e], u[4 + e], 0x88);
        v[1] = _mm512_shuffle_f32x4(u[e], u[4 + e], 0xDD);
        v[2] = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0x88);
        v[3] = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0xDD);
        r[e] = _mm512_shuffle_f32x4(v[0], v[2], 0x88);
        r[e + 8] = _mm512_shuffle_f32x4(v[0], v[2], 0xDD);
        r[e + 4] = _mm512_shuffle_f32x4(v[1], v[3], 0x88);
        r[e + 12] = _mm512_shuffle_f32x4(v[1], v[3], 0xDD);
    }
}


/* pack_a_any for MR = 14: a row-major A is transposed 16 k-values at a time. */
static TARGET_AVX512 void pack_a_avx512(int trans_a, const float *A, long lda, long m, long kc, float *Ap)
{
    const int MR = AVX512_MR;
    for (long ip = 0; ip < m; ip += MR) {
        int mr = m - ip < MR ? (int)(m - ip) : MR;
        float *dst = Ap + ip * kc;
        if (trans_a) {
            __mmask16 mm = tf_lanes16(mr);
            for (long k = 0; k < kc; k++)
                _mm512_mask_storeu_ps(dst + k * MR, 0x3FFF, _mm512_maskz_loadu_ps(mm, A + k * lda + ip));
            continue;
        }
        for (long k0 = 0; k0 < kc; k0 += 16) {
            __mmask16 mk = tf_lanes16(kc - k0);
            __m512 r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++)
                r[i] = i < mr ? _mm512_maskz_loadu_ps(mk, A + (ip + i) * lda + k0) : _mm512_setzero_ps();
            transpose16(r);
            int kn = kc - k0 < 16 ? (int)(kc - k0) : 16;
            for (int k = 0; k < kn; k++)
                _mm512_mask_storeu_ps(dst + (k0 + k) * MR, 0x3FFF, r[k]);
        }
    }
}

/* pack_b_any for NR = 32: a transposed B is transposed 16 x 16 at a time. */
static TARGET_AVX512 void pack_b_avx512(int trans_b, const float *B, long ldb, long n, long kc, float *Bp)
{
    const int NR = AVX512_NR;
    for (long jp = 0; jp < n; jp += NR) {
        int nr = n - jp < NR ? (int)(n - jp) : NR;
        float *dst = Bp + jp * kc;
        if (!trans_b) {
            __mmask16 m0 = tf_lanes16(nr), m1 = tf_lanes16(nr - 16 < 0 ? 0 : nr - 16);
            const float *src = B + jp;
            for (long k = 0; k < kc; k++) {
                _mm512_store_ps(dst + k * NR, _mm512_maskz_loadu_ps(m0, src + k * ldb));
                _mm512_store_ps(dst + k * NR + 16, _mm512_maskz_loadu_ps(m1, src + k * ldb + 16));
            }
            continue;
        }
        for (int h = 0; h < 2; h++) {
            int j0 = 16 * h, jn = nr - j0;   /* columns j0 .. j0+jn of this half */
            for (long k0 = 0; k0 < kc; k0 += 16) {
                __mmask16 mk = tf_lanes16(kc - k0);
                __m512 r[16];
#pragma GCC unroll 16
                for (int j = 0; j < 16; j++)
                    r[j] = j < jn ? _mm512_maskz_loadu_ps(mk, B + (jp + j0 + j) * ldb + k0) : _mm512_setzero_ps();
                transpose16(r);
                int kn = kc - k0 < 16 ? (int)(kc - k0) : 16;
                for (int k = 0; k < kn; k++) _mm512_store_ps(dst + (k0 + k) * NR + j0, r[k]);
            }
        }
    }
}

/* Few rows times a transposed B, without packing: 4 x 4 tiles of C, each element a 16-lane
 * FMA chain over k (both operands contiguous in k) and a fixed reduction tree at the end. */
static TARGET_AVX512 void dot_avx512(long M, long K, float alpha, const float *A, long lda,
                                     const float *B, long ldb, int accumulate, float *C, long ldc,
                                     long j0, long j1)
{
    const __mmask16 tail = tf_lanes16(K % 16);
    const long kfull = K - K % 16;
    for (long j = j0; j < j1; j += 4) {
        int nr = (int)min_l(4, j1 - j);
        const float *b[4];
        for (int c = 0; c < 4; c++) b[c] = B + (j + (c < nr ? c : 0)) * ldb;
        for (long i = 0; i < M; i += 4) {
            int mr = (int)min_l(4, M - i);
            const float *a[4];
            for (int r = 0; r < 4; r++) a[r] = A + (i + (r < mr ? r : 0)) * lda;
            __m512 acc[16];
#pragma GCC unroll 16
            for (int t = 0; t < 16; t++) acc[t] = _mm512_setzero_ps();
            /* B is read from memory once, by the first rows: the hardware prefetcher loses
             * track of four interleaved rows, so fetch the next tile's rows (13 -> 20 GB/s) */
            const int fetch = i == 0 && j + 7 < j1;
            for (long k = 0; k < kfull; k += 16) {
                __m512 va[4];
                if (fetch) {
#pragma GCC unroll 4
                    for (int c = 0; c < 4; c++) _mm_prefetch((const char *)(b[c] + 4 * ldb + k), _MM_HINT_T0);
                }
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++) va[r] = _mm512_loadu_ps(a[r] + k);
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) {
                    __m512 vb = _mm512_loadu_ps(b[c] + k);
#pragma GCC unroll 4
                    for (int r = 0; r < 4; r++) acc[4 * r + c] = _mm512_fmadd_ps(va[r], vb, acc[4 * r + c]);
                }
            }
            if (tail) {
                __m512 va[4];
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++) va[r] = _mm512_maskz_loadu_ps(tail, a[r] + kfull);
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) {
                    __m512 vb = _mm512_maskz_loadu_ps(tail, b[c] + kfull);
#pragma GCC unroll 4
                    for (int r = 0; r < 4; r++) acc[4 * r + c] = _mm512_fmadd_ps(va[r], vb, acc[4 * r + c]);
                }
            }
            /* the result holds the sum of acc[t] in element t, i.e. row r = t / 4, column c = t % 4 */
            __m512 sum = tf_sum16x16(acc);
            float t[16] __attribute__((aligned(64)));
            _mm512_store_ps(t, sum);
            for (int r = 0; r < mr; r++) {
                float *c = C + (i + r) * ldc + j;
                if (accumulate)
                    for (int q = 0; q < nr; q++) c[q] = __builtin_fmaf(alpha, t[4 * r + q], c[q]);
                else
                    for (int q = 0; q < nr; q++) c[q] = alpha * t[4 * r + q];
            }
        }
    }
}

/* The AVX-512 kernel tables, shared by the fp32 and bf16 descriptions. */
#define AVX512_KERNELS \
    {0, kernel_avx512_1, kernel_avx512_2, kernel_avx512_3, kernel_avx512_4, kernel_avx512_5, \
     kernel_avx512_6, kernel_avx512_7, kernel_avx512_8, kernel_avx512_9, kernel_avx512_10, \
     kernel_avx512_11, kernel_avx512_12, kernel_avx512_13, kernel_avx512_14}, \
    {0, kernel_avx512_half_1, kernel_avx512_half_2, kernel_avx512_half_3, kernel_avx512_half_4, \
     kernel_avx512_half_5, kernel_avx512_half_6, kernel_avx512_half_7, kernel_avx512_half_8, \
     kernel_avx512_half_9, kernel_avx512_half_10, kernel_avx512_half_11, kernel_avx512_half_12, \
     kernel_avx512_half_13, kernel_avx512_half_14},
#define AVX512_STREAM \
    {0, kernel_avx512_stream_1, kernel_avx512_stream_2, kernel_avx512_stream_3, kernel_avx512_stream_4, \
     kernel_avx512_stream_5, kernel_avx512_stream_6, kernel_avx512_stream_7, kernel_avx512_stream_8, \
     kernel_avx512_stream_9, kernel_avx512_stream_10, kernel_avx512_stream_11, kernel_avx512_stream_12, \
     kernel_avx512_stream_13, kernel_avx512_stream_14}

/* KC = 256: the B micro-panel (256 x 32 floats = 32 KiB) stays in the 48 KiB L1d;
 * MC = 336: the A block (336 x 256 = 336 KiB) stays in the 1 MiB L2;
 * NC = 4096: the B block (up to 8 MiB) stays in the 32 MiB L3. */
static const gemm_isa isa_avx512 = {
    AVX512_MR, AVX512_NR, 256, 336, 4096,
    AVX512_KERNELS
    pack_a_avx512, pack_b_avx512, dot_avx512,
    AVX512_STREAM, 0};

BF16_PACKS(avx512, AVX512_MR, AVX512_NR)

static const gemm_isa isa_avx512_bf16 = {
    AVX512_MR, AVX512_NR, 256, 336, 4096,
    AVX512_KERNELS
    pack_a_avx512_bf16, pack_b_avx512_bf16, NULL,
    AVX512_STREAM, 1};

/* ------------------------------------------------------------------------- */
/* avx512_bf16: vdpbf16ps, two bf16 products added into each fp32 lane per instruction (twice the
 * products of an FMA). The same 14 x 32 tile and packing as AVX-512 (K blocks of 512), after which each
 * packed micro-panel [kc][W] (W = MR or NR) is turned in place into [ceil(kc/2)][W] 32-bit pairs:
 * bf16(x[2t][w]) in the low half, bf16(x[2t+1][w]) (0 past kc) in the high half, the layout
 * vdpbf16ps multiplies lane by lane. Operands are rounded exactly as round_bf16 does; the products
 * are exact and the sums fp32, so only the summation order differs from the other levels. K blocks
 * have an even length (k_block), so a pre-packed panel's pair t is pair t - pc/2 of block pc. */

#define TARGET_BF16 TF_TARGET_AVX512_BF16

/* round_bf16 of each lane, the bf16 in the high half of the 32 bits. */
static inline __attribute__((always_inline)) TARGET_AVX512 __m512i bf16_high(__m512 x)
{
    const __m512i u = _mm512_castps_si512(x);
    const __m512i half = _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                          _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __m512i r = _mm512_mask_or_epi32(_mm512_add_epi32(u, half), nan, u, _mm512_set1_epi32(0x00400000));
    const __mmask16 subnormal = _mm512_cmpeq_epi32_mask(_mm512_and_si512(r, _mm512_set1_epi32(0x7f800000)),
                                                        _mm512_setzero_si512());
    return _mm512_mask_and_epi32(r, subnormal, r, _mm512_set1_epi32((int)0x80000000u));
}

/* `panels` micro-panels [kc][W] of floats, panel q at p + q * W * kc, into pairs in place: pair
 * (t, w) is written at t * W + w, below every float not read yet (2t * W + w and on). */
static TARGET_AVX512 void pair_panels(float *p, long panels, long kc, int W)
{
    const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
    for (long q = 0; q < panels; q++) {
        float *x = p + q * W * kc;
        for (long t = 0; t < (kc + 1) / 2; t++)
            for (int w = 0; w < W; w += 16) {
                const __mmask16 m = tf_lanes16(W - w);
                __m512i lo = bf16_high(_mm512_maskz_loadu_ps(m, x + 2 * t * W + w));
                __m512i hi = 2 * t + 1 < kc ? bf16_high(_mm512_maskz_loadu_ps(m, x + (2 * t + 1) * W + w))
                                            : _mm512_setzero_si512();
                _mm512_mask_storeu_epi32(x + t * W + w, m,
                                         _mm512_or_si512(_mm512_srli_epi32(lo, 16), _mm512_and_si512(hi, high)));
            }
    }
}

static void pack_a_dpbf16(int t, const float *X, long ldx, long n, long kc, float *dst)
{
    pack_a_avx512(t, X, ldx, n, kc, dst);
    pair_panels(dst, ceil_div(n, AVX512_MR), kc, AVX512_MR);
}

static void pack_b_dpbf16(int t, const float *X, long ldx, long n, long kc, float *dst)
{
    pack_b_avx512(t, X, ldx, n, kc, dst);
    pair_panels(dst, ceil_div(n, AVX512_NR), kc, AVX512_NR);
}

/* kernel_avx512 over pairs: Ap [ceil(kc/2)][MR] and Bp rows of NR pairs, row t at Bp + t * bs. */
static inline __attribute__((always_inline)) TARGET_BF16 void
kernel_dpbf16(long kc, const float *restrict Ap, const float *restrict Bp, long bs,
              float *restrict C, long ldc, int nr, const float *alpha, int load_c, const int mr,
              const int wide, const int stream)
{
    __m512 c0[AVX512_MR], c1[AVX512_MR];
#pragma GCC unroll 14
    for (int i = 0; i < AVX512_MR; i++)
        if (i < mr) {
            c0[i] = _mm512_setzero_ps();
            c1[i] = _mm512_setzero_ps();
            _mm_prefetch((const char *)(C + i * ldc), _MM_HINT_T0);
            if (wide) _mm_prefetch((const char *)(C + i * ldc + 16), _MM_HINT_T0);
        }
    const long pairs = (kc + 1) / 2;
    for (long t = 0; t < pairs; t++) {
        if (stream) {
            _mm_prefetch((const char *)(Bp + t * bs + GEMM_STREAM_AHEAD), _MM_HINT_T0);
            _mm_prefetch((const char *)(Bp + t * bs + GEMM_STREAM_AHEAD + 16), _MM_HINT_T0);
        }
        __m512bh b0 = (__m512bh)_mm512_loadu_ps(Bp + t * bs);
        __m512bh b1 = wide ? (__m512bh)_mm512_loadu_ps(Bp + t * bs + 16) : b0;
        const float *a = Ap + t * AVX512_MR;
#pragma GCC unroll 14
        for (int i = 0; i < AVX512_MR; i++)
            if (i < mr) {
                __m512bh ai = (__m512bh)_mm512_set1_ps(a[i]);   /* the pair's 32 bits, as they are */
                c0[i] = _mm512_dpbf16_ps(c0[i], ai, b0);
                if (wide) c1[i] = _mm512_dpbf16_ps(c1[i], ai, b1);
            }
    }
    store_tile_avx512(c0, c1, C, ldc, nr, alpha, load_c, mr, wide);
}

#define DPBF16_KERNEL(R)                                                                   \
    static TARGET_BF16 void kernel_dpbf16_##R(long kc, const float *Ap, const float *Bp,    \
                                              long bs, float *C, long ldc, int nr,          \
                                              const float *alpha, int load_c)               \
    { kernel_dpbf16(kc, Ap, Bp, bs, C, ldc, nr, alpha, load_c, R, 1, 0); }                   \
    static TARGET_BF16 void kernel_dpbf16_half_##R(long kc, const float *Ap, const float *Bp, \
                                                   long bs, float *C, long ldc, int nr,     \
                                                   const float *alpha, int load_c)          \
    { kernel_dpbf16(kc, Ap, Bp, bs, C, ldc, nr, alpha, load_c, R, 0, 0); }                   \
    static TARGET_BF16 void kernel_dpbf16_stream_##R(long kc, const float *Ap, const float *Bp, \
                                                     long bs, float *C, long ldc, int nr,   \
                                                     const float *alpha, int load_c)        \
    { kernel_dpbf16(kc, Ap, Bp, bs, C, ldc, nr, alpha, load_c, R, 1, 1); }
DPBF16_KERNEL(1) DPBF16_KERNEL(2) DPBF16_KERNEL(3) DPBF16_KERNEL(4) DPBF16_KERNEL(5)
DPBF16_KERNEL(6) DPBF16_KERNEL(7) DPBF16_KERNEL(8) DPBF16_KERNEL(9) DPBF16_KERNEL(10)
DPBF16_KERNEL(11) DPBF16_KERNEL(12) DPBF16_KERNEL(13) DPBF16_KERNEL(14)

/* KC = 512: a K block of 256 pairs keeps the B micro-panel (256 x 32 pairs, 32 KiB) and the A
 * block (336 x 256 pairs) at fp32's footprints, with half the C updates per product. */
static const gemm_isa isa_avx512_dpbf16 = {
    AVX512_MR, AVX512_NR, 512, 336, 4096,
    {0, kernel_dpbf16_1, kernel_dpbf16_2, kernel_dpbf16_3, kernel_dpbf16_4, kernel_dpbf16_5,
     kernel_dpbf16_6, kernel_dpbf16_7, kernel_dpbf16_8, kernel_dpbf16_9, kernel_dpbf16_10,
     kernel_dpbf16_11, kernel_dpbf16_12, kernel_dpbf16_13, kernel_dpbf16_14},
    {0, kernel_dpbf16_half_1, kernel_dpbf16_half_2, kernel_dpbf16_half_3, kernel_dpbf16_half_4,
     kernel_dpbf16_half_5, kernel_dpbf16_half_6, kernel_dpbf16_half_7, kernel_dpbf16_half_8,
     kernel_dpbf16_half_9, kernel_dpbf16_half_10, kernel_dpbf16_half_11, kernel_dpbf16_half_12,
     kernel_dpbf16_half_13, kernel_dpbf16_half_14},
    pack_a_dpbf16, pack_b_dpbf16, NULL,
    {0, kernel_dpbf16_stream_1, kernel_dpbf16_stream_2, kernel_dpbf16_stream_3, kernel_dpbf16_stream_4,
     kernel_dpbf16_stream_5, kernel_dpbf16_stream_6, kernel_dpbf16_stream_7, kernel_dpbf16_stream_8,
     kernel_dpbf16_stream_9, kernel_dpbf16_stream_10, kernel_dpbf16_stream_11, kernel_dpbf16_stream_12,
     kernel_dpbf16_stream_13, kernel_dpbf16_stream_14},
    1, 1};

/* ------------------------------------------------------------------------- */
/* amx: tdpbf16ps, a 16 x 16 fp32 tile += a 16 x 32 bf16 tile @ a 32 x 16 bf16 tile (pairs of k
 * per 32-bit element) per instruction, 16 times the products of a vdpbf16ps. Tile kernel of 32 x
 * 32 (csrc/amx.h: four C tiles, two A, two B). B is packed exactly as for vdpbf16ps ([ceil(kc/2)]
 * [NR] pairs: a B tile is 16 pair rows x 16 columns of a panel, row stride NR * 4 bytes), so the
 * pre-packed weights and packing code are shared. A panels are row-major instead, what an A tile
 * reads: MR rows of kcp = kc rounded up to even bf16 (zero past kc), row r at (uint16_t *)Ap +
 * r * kcp; rows past the panel's height are zeros up to the tile that reads them. Within a
 * panel's floats: 32 * kcp / 2 <= MR * kc floats.
 *
 * Each element of C: the tile sum over the kc / 32 whole steps of 32 k (tdpbf16ps's order), then
 * the remaining pairs one by one with vdpbf16ps, then alpha and C as store_tile_avx512 applies
 * them. Operands rounded as round_bf16 does (bf16_high), products exact, sums fp32: as at
 * avx512_bf16, only the order of the fp32 additions differs, and it depends on the shape alone. */
#if TF_HAVE_AMX
#define AMX_MR 32
#define AMX_NR 32

/* Rows [0, m) of op(A) x columns [0, kc), as bf16 rows of kcp (see above). */
static TARGET_AVX512 void pack_a_amx(int trans_a, const float *A, long lda, long m, long kc, float *Ap)
{
    uint16_t *dst = (uint16_t *)Ap;
    const long kcp = kc + (kc & 1), filled = m <= 16 ? 16 : AMX_MR;
    if (!trans_a) {   /* row i of op(A) is contiguous */
        for (long i = 0; i < m; i++)
            for (long k = 0; k < kcp; k += 16) {
                const __mmask16 in = tf_lanes16(kc - k), out = tf_lanes16(kcp - k);
                __m512i r = _mm512_srli_epi32(bf16_high(_mm512_maskz_loadu_ps(in, A + i * lda + k)), 16);
                _mm256_mask_storeu_epi16(dst + i * kcp + k, out, _mm512_cvtepi32_epi16(r));
            }
    } else {          /* column i of A: 16 x 16 blocks, transposed in registers */
        for (long k0 = 0; k0 < kcp; k0 += 16)
            for (long i0 = 0; i0 < m; i0 += 16) {
                const __mmask16 rows = tf_lanes16(m - i0), out = tf_lanes16(kcp - k0);
                __m512 r[16];
#pragma GCC unroll 16
                for (int t = 0; t < 16; t++)
                    r[t] = k0 + t < kc ? _mm512_maskz_loadu_ps(rows, A + (k0 + t) * lda + i0) : _mm512_setzero_ps();
                transpose16(r);
                for (long t = 0; t < 16 && i0 + t < m; t++) {
                    __m512i h = _mm512_srli_epi32(bf16_high(r[t]), 16);
                    _mm256_mask_storeu_epi16(dst + (i0 + t) * kcp + k0, out, _mm512_cvtepi32_epi16(h));
                }
            }
    }
    if (m < filled) memset(dst + m * kcp, 0, (size_t)((filled - m) * kcp) * sizeof(uint16_t));
}

/* How far ahead (bytes) the stream kernel fetches a pre-packed B: one step of the tiles reads 2 KiB
 * (16 pairs x 32 columns), and the tile loads leave fetching to the hardware prefetcher. Measured
 * on the 16-core Xeon (family 6 model 207, one thread, 8 rows as a decoding step has them): the
 * bf16 output projection x @ W^T of W 8000 x 512 took 0.41-0.43 ms 2 KiB ahead against 0.48-0.51
 * with no fetching, 0.41-0.46 at 1 KiB, 0.52-0.58 at 4 and 8 KiB (2026-11-27). */
#define AMX_STREAM_AHEAD 2048

static inline __attribute__((always_inline)) TF_TARGET_AMX void
kernel_amx(long kc, const float *restrict Ap, const float *restrict Bp, long bs, float *restrict C,
           long ldc, int nr, const float *alpha, int load_c, const int mr, const int stream)
{
    const int two = mr > 16, wide = nr > 16;
    const long kcp = kc + (kc & 1), steps = kc / 32, astride = kcp * 2, bstride = bs * 4;
    const uint16_t *A = (const uint16_t *)Ap;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (long s = 0; s < steps; s++) {
        const float *b = Bp + s * 16 * bs;
        if (stream)   /* the 2 KiB of B a later step reads, one line at a time */
            for (int line = 0; line < 32; line++)
                _mm_prefetch((const char *)((uintptr_t)b + AMX_STREAM_AHEAD + 64 * line), _MM_HINT_T0);
        for (long i = 2 * s; i < 2 * s + 2 && i < mr; i++) {   /* C's lines, two rows a step */
            _mm_prefetch((const char *)(C + i * ldc), _MM_HINT_T0);
            _mm_prefetch((const char *)(C + i * ldc + 16), _MM_HINT_T0);
        }
        _tile_loadd(4, A + s * 32, astride);
        _tile_loadd(6, b, bstride);
        _tile_dpbf16ps(0, 4, 6);
        if (wide) {
            _tile_loadd(7, b + 16, bstride);
            _tile_dpbf16ps(1, 4, 7);
        }
        if (two) {
            _tile_loadd(5, A + 16 * kcp + s * 32, astride);
            _tile_dpbf16ps(2, 5, 6);
            if (wide) _tile_dpbf16ps(3, 5, 7);
        }
    }
    float acc[AMX_MR * AMX_NR] __attribute__((aligned(64)));
    _tile_stored(0, acc, AMX_NR * 4);
    if (wide) _tile_stored(1, acc + 16, AMX_NR * 4);
    if (two) {
        _tile_stored(2, acc + 16 * AMX_NR, AMX_NR * 4);
        if (wide) _tile_stored(3, acc + 16 * AMX_NR + 16, AMX_NR * 4);
    }
    /* the pairs past the whole steps, then alpha and C, row by row */
    const __m512 va = _mm512_set1_ps(*alpha);
    const __mmask16 m0 = tf_lanes16(nr), m1 = tf_lanes16(nr - 16);
    for (int i = 0; i < mr; i++) {
        __m512 c0 = _mm512_load_ps(acc + i * AMX_NR);
        __m512 c1 = wide ? _mm512_load_ps(acc + i * AMX_NR + 16) : c0;
        const uint32_t *a = (const uint32_t *)(A + i * kcp);
        for (long t = steps * 16; t < kcp / 2; t++) {
            __m512bh ai = (__m512bh)_mm512_set1_epi32((int)a[t]);
            c0 = _mm512_dpbf16_ps(c0, ai, (__m512bh)_mm512_loadu_ps(Bp + t * bs));
            if (wide) c1 = _mm512_dpbf16_ps(c1, ai, (__m512bh)_mm512_loadu_ps(Bp + t * bs + 16));
        }
        float *c = C + i * ldc;
        if (nr == AMX_NR) {   /* whole rows: plain stores (masked ones stall on lines not yet here) */
            _mm512_storeu_ps(c, load_c ? _mm512_fmadd_ps(va, c0, _mm512_loadu_ps(c)) : _mm512_mul_ps(va, c0));
            _mm512_storeu_ps(c + 16, load_c ? _mm512_fmadd_ps(va, c1, _mm512_loadu_ps(c + 16))
                                            : _mm512_mul_ps(va, c1));
        } else if (load_c) {
            _mm512_mask_storeu_ps(c, m0, _mm512_fmadd_ps(va, c0, _mm512_maskz_loadu_ps(m0, c)));
            if (wide) _mm512_mask_storeu_ps(c + 16, m1, _mm512_fmadd_ps(va, c1, _mm512_maskz_loadu_ps(m1, c + 16)));
        } else {
            _mm512_mask_storeu_ps(c, m0, _mm512_mul_ps(va, c0));
            if (wide) _mm512_mask_storeu_ps(c + 16, m1, _mm512_mul_ps(va, c1));
        }
    }
}

#define AMX_KERNEL(R)                                                                      \
    static TF_TARGET_AMX void kernel_amx_##R(long kc, const float *Ap, const float *Bp, long bs, \
                                             float *C, long ldc, int nr, const float *alpha,  \
                                             int load_c)                                      \
    { kernel_amx(kc, Ap, Bp, bs, C, ldc, nr, alpha, load_c, R, 0); }                             \
    static TF_TARGET_AMX void kernel_amx_stream_##R(long kc, const float *Ap, const float *Bp,    \
                                                    long bs, float *C, long ldc, int nr,         \
                                                    const float *alpha, int load_c)              \
    { kernel_amx(kc, Ap, Bp, bs, C, ldc, nr, alpha, load_c, R, 1); }
AMX_KERNEL(1) AMX_KERNEL(2) AMX_KERNEL(3) AMX_KERNEL(4) AMX_KERNEL(5) AMX_KERNEL(6) AMX_KERNEL(7)
AMX_KERNEL(8) AMX_KERNEL(9) AMX_KERNEL(10) AMX_KERNEL(11) AMX_KERNEL(12) AMX_KERNEL(13)
AMX_KERNEL(14) AMX_KERNEL(15) AMX_KERNEL(16) AMX_KERNEL(17) AMX_KERNEL(18) AMX_KERNEL(19)
AMX_KERNEL(20) AMX_KERNEL(21) AMX_KERNEL(22) AMX_KERNEL(23) AMX_KERNEL(24) AMX_KERNEL(25)
AMX_KERNEL(26) AMX_KERNEL(27) AMX_KERNEL(28) AMX_KERNEL(29) AMX_KERNEL(30) AMX_KERNEL(31)
AMX_KERNEL(32)

/* KC = 512 as for vdpbf16ps (a B micro-panel of 256 pairs x 32 = 32 KiB in L1d); MC = 256: whole
 * 32-row panels, an A block of 256 KiB of bf16 in L2. */
#ifndef AMX_KC
#define AMX_KC 512
#endif
#ifndef AMX_MC
#define AMX_MC 256
#endif
static const gemm_isa isa_amx_bf16 = {
    AMX_MR, AMX_NR, AMX_KC, AMX_MC, 4096,
    {0, kernel_amx_1, kernel_amx_2, kernel_amx_3, kernel_amx_4, kernel_amx_5, kernel_amx_6,
     kernel_amx_7, kernel_amx_8, kernel_amx_9, kernel_amx_10, kernel_amx_11, kernel_amx_12,
     kernel_amx_13, kernel_amx_14, kernel_amx_15, kernel_amx_16, kernel_amx_17, kernel_amx_18,
     kernel_amx_19, kernel_amx_20, kernel_amx_21, kernel_amx_22, kernel_amx_23, kernel_amx_24,
     kernel_amx_25, kernel_amx_26, kernel_amx_27, kernel_amx_28, kernel_amx_29, kernel_amx_30,
     kernel_amx_31, kernel_amx_32},
    {0}, pack_a_amx, pack_b_dpbf16, NULL,
    {0, kernel_amx_stream_1, kernel_amx_stream_2, kernel_amx_stream_3, kernel_amx_stream_4,
     kernel_amx_stream_5, kernel_amx_stream_6, kernel_amx_stream_7, kernel_amx_stream_8,
     kernel_amx_stream_9, kernel_amx_stream_10, kernel_amx_stream_11, kernel_amx_stream_12,
     kernel_amx_stream_13, kernel_amx_stream_14, kernel_amx_stream_15, kernel_amx_stream_16,
     kernel_amx_stream_17, kernel_amx_stream_18, kernel_amx_stream_19, kernel_amx_stream_20,
     kernel_amx_stream_21, kernel_amx_stream_22, kernel_amx_stream_23, kernel_amx_stream_24,
     kernel_amx_stream_25, kernel_amx_stream_26, kernel_amx_stream_27, kernel_amx_stream_28,
     kernel_amx_stream_29, kernel_amx_stream_30, kernel_amx_stream_31, kernel_amx_stream_32},
    1, 1, 1};
#endif
#endif

static const gemm_isa *gemm_isa_of(int level, int prec)
{
    const int bf16 = prec == GEMM_BF16;
#ifdef GEMM_X86
    switch (level) {
    case TF_ISA_AMX:
#if TF_HAVE_AMX
        if (bf16) return &isa_amx_bf16;
#endif
        /* fall through */
    case TF_ISA_AVX512_BF16:
        if (bf16) return &isa_avx512_dpbf16;
        return &isa_avx512;
    case TF_ISA_AVX512_VNNI:
    case TF_ISA_AVX512: return bf16 ? &isa_avx512_bf16 : &isa_avx512;
    case TF_ISA_AVX2: return bf16 ? &isa_avx2_bf16 : &isa_avx2;
    default: break;
    }
#endif
    return bf16 ? &isa_generic_bf16 : &isa_generic;
}

/* ------------------------------------------------------------------------- */
/* Schedules. */

typedef struct {
    const gemm_isa *isa;
    int trans_a, trans_b;
    long M, N, K;
    float alpha;
    const float *A; long lda;
    const float *B; long ldb;
    int accumulate;
    float *C; long ldc;
    long *packed;          /* this thread's counts: floats packed [0] of op(A), [1] of op(B),
                              [2] shared-schedule work units taken from other threads */
} gemm_problem;

/* The K block: K split into equal blocks of at most isa->kc (depends on K only), rounded up to
 * an even length for the pair layout. */
static long k_block(const gemm_isa *s, long K)
{
    const long kcb = ceil_div(K, ceil_div(K, s->kc));
    return s->pairs || s->even_k ? kcb + (kcb & 1) : kcb;   /* pairs: blocks start at even k */
}

/* Element (i, k) of op(A) and (k, j) of op(B). */
static const float *a_at(const gemm_problem *g, long i, long k)
{ return g->trans_a ? g->A + k * g->lda + i : g->A + i * g->lda + k; }
static const float *b_at(const gemm_problem *g, long k, long j)
{ return g->trans_b ? g->B + j * g->ldb + k : g->B + k * g->ldb + j; }

/* C[rows of the packed A block, panel] for one K block: every MR-row panel of Ap. */
static void run_kernels_from(const gemm_problem *g, long mc, long kc, const float *Ap, const float *Bp,
                             long bs, int nr, float *C, int load_c, int stream)
{
    const gemm_isa *s = g->isa;
    const long panels = ceil_div(mc, s->mr), base = mc / panels, extra = mc % panels;
    const gemm_kernel *kernel = 2 * nr <= s->nr && s->half[1] ? s->half
                              : stream && s->stream[1] ? s->stream : s->kernel;
    for (long p = 0, i = 0; p < panels; p++) {
        int mr = (int)(base + (p < extra));
        kernel[mr](kc, Ap + p * s->mr * kc, Bp, bs, C + i * g->ldc, g->ldc, nr, &g->alpha, load_c);
        i += mr;
    }
}

static void run_kernels(const gemm_problem *g, long mc, long kc, const float *Ap, const float *Bp,
                        long bs, int nr, float *C, int load_c)
{ run_kernels_from(g, mc, kc, Ap, Bp, bs, nr, C, load_c, 0); }

/* Ap <- rows [i0, i0 + mc) x K block [pc, pc + kc) of op(A) as ceil(mc / MR) micro-panels of
 * balanced heights (M = 16 is two panels of 8 rows, not 14 + 2: a kernel needs about 4 rows
 * or more to hide the FMA latency), panel p at Ap + p * MR * kc. run_kernels cuts the same way. */
static void pack_a_block(const gemm_problem *g, long i0, long mc, long pc, long kc, float *Ap)
{
    const gemm_isa *s = g->isa;
    const long panels = ceil_div(mc, s->mr), base = mc / panels, extra = mc % panels;
    for (long p = 0, i = i0; p < panels; p++) {
        long mr = base + (p < extra);
        s->pack_a(g->trans_a, a_at(g, i, pc), g->lda, mr, kc, Ap + p * s->mr * kc);
        i += mr;
    }
    g->packed[0] += mc * kc;
}

/* Narrow: NR panels [jp0, jp1) of C, all M rows; Ap holds all of op(A) packed, K block by
 * K block (block q at Ap + q * kcb * Mpad); Bp has room for one panel [kcb][NR]. */
static int narrow_fits(const gemm_isa *s, long M, long K)
{
    return M <= s->mc && ceil_div(M, s->mr) * s->mr * K <= GEMM_NARROW_A;
}

static void narrow_pack_a(const gemm_problem *g, float *Ap)
{
    const gemm_isa *s = g->isa;
    const long kcb = k_block(s, g->K), mpad = ceil_div(g->M, s->mr) * s->mr;
    for (long pc = 0; pc < g->K; pc += kcb)
        pack_a_block(g, 0, g->M, pc, min_l(kcb, g->K - pc), Ap + pc * mpad);
}

static void narrow_panels(const gemm_problem *g, float *Bp, const float *Ap, long jp0, long jp1)
{
    const gemm_isa *s = g->isa;
    const int NR = s->nr;
    const long kcb = k_block(s, g->K), mpad = ceil_div(g->M, s->mr) * s->mr;
    /* a row-major B is read in place when each panel serves at most two row panels */
    const int in_place = !g->trans_b && mpad <= 2 * s->mr && !s->bf16;
    for (long jp = jp0; jp < jp1; jp++) {
        long j = jp * NR;
        int nr = (int)min_l(NR, g->N - j);
        for (long pc = 0; pc < g->K; pc += kcb) {
            long kc = min_l(kcb, g->K - pc);
            const float *b = Bp;
            long bs = NR;
            if (in_place && nr == NR) {
                b = b_at(g, pc, j);
                bs = g->ldb;
            } else {
                s->pack_b(g->trans_b, b_at(g, pc, j), g->ldb, nr, kc, Bp);
                g->packed[1] += nr * kc;
            }
            run_kernels(g, g->M, kc, Ap + pc * mpad, b, bs, nr, g->C + j, g->accumulate || pc > 0);
        }
    }
}

/* Private: NR panels [jp0, jp1) of C, all M rows, with this thread's own Bp [kcb][NC]. */
static void gemm_private(const gemm_problem *g, float *Bp, float *Ap, long jp0, long jp1)
{
    const gemm_isa *s = g->isa;
    const int NR = s->nr;
    const long kcb = k_block(s, g->K), ncp = s->nc / NR;
    for (long jc = jp0; jc < jp1; jc += ncp) {
        long j0 = jc * NR, nc = min_l((jc + ncp < jp1 ? jc + ncp : jp1) * NR, g->N) - j0;
        for (long pc = 0; pc < g->K; pc += kcb) {
            long kc = min_l(kcb, g->K - pc);
            int load_c = g->accumulate || pc > 0;
            s->pack_b(g->trans_b, b_at(g, pc, j0), g->ldb, nc, kc, Bp);
            g->packed[1] += nc * kc;
            for (long ic = 0; ic < g->M; ic += s->mc) {
                long mc = min_l(s->mc, g->M - ic);
                pack_a_block(g, ic, mc, pc, kc, Ap);
                for (long jp = 0; jp * NR < nc; jp++)
                    run_kernels(g, mc, kc, Ap, Bp + jp * NR * kc, NR, (int)min_l(NR, nc - jp * NR),
                                g->C + ic * g->ldc + j0 + jp * NR, load_c);
            }
        }
    }
}

/* Tiles: several threads on one large product. C is cut into units of tile_rows x tile_cols,
 * numbered column block by column block, and threads take units from a shared counter: no
 * barriers, so a thread the OS stalls holds nobody up and the others take its share. A thread
 * packs the B block [K][tile_cols] of its unit unless it holds it from its previous unit (the usual
 * case: consecutive units share a column block), and the A block of the unit per K block. */
static long tile_rows(const gemm_isa *s, long M, int nt)
{
    return min_l(s->mc, ceil_div(ceil_div(M, s->mr), 4L * nt) * s->mr);   /* ~4 units per thread */
}

static long tile_cols(const gemm_isa *s, long N, long K)
{
    long nc = max_l(s->nr, GEMM_TILE_B / max_l(K, 1) / s->nr * s->nr);
    return min_l(min_l(nc, s->nc), N);
}

/* C[ic:ic+mc, jc:jc+nc]; Bp holds (or, when pack_b, receives) op(B)[:, jc:jc+nc] packed, K block
 * q at Bp + q * kcb * np * NR. */
static void gemm_tile(const gemm_problem *g, float *Bp, float *Ap, long ic, long mc, long jc, long nc,
                      int pack_b)
{
    const gemm_isa *s = g->isa;
    const int NR = s->nr;
    const long kcb = k_block(s, g->K), np = ceil_div(nc, NR);
    for (long pc = 0; pc < g->K && pack_b; pc += kcb) {
        s->pack_b(g->trans_b, b_at(g, pc, jc), g->ldb, nc, min_l(kcb, g->K - pc), Bp + pc * np * NR);
        g->packed[1] += nc * min_l(kcb, g->K - pc);
    }
    for (long pc = 0; pc < g->K; pc += kcb) {
        long kc = min_l(kcb, g->K - pc);
        const float *b = Bp + pc * np * NR;
        pack_a_block(g, ic, mc, pc, kc, Ap);
        for (long jp = 0; jp < np; jp++)
            run_kernels(g, mc, kc, Ap, b + jp * NR * kc, NR, (int)min_l(NR, nc - jp * NR),
                        g->C + ic * g->ldc + jc + jp * NR, g->accumulate || pc > 0);
    }
}

/* One thread's part of C when it works alone on NR panels [jp0, jp1). */
static void gemm_alone(const gemm_problem *g, float *Bp, float *Ap, long jp0, long jp1)
{
    if (jp1 <= jp0) return;
    if (narrow_fits(g->isa, g->M, g->K)) {
        narrow_pack_a(g, Ap);
        narrow_panels(g, Bp, Ap, jp0, jp1);
    } else {
        gemm_private(g, Bp, Ap, jp0, jp1);
    }
}

/* Batch entry t of a batched product: where its A, B and C start. */
typedef struct {
    long batch1;
    const float *A; long a_stride0, a_stride1;
    const float *B; long b_stride0, b_stride1;
    float *C; long c_stride0, c_stride1;
} gemm_batch;

static void gemm_entry(gemm_problem *g, const gemm_batch *bt, long t)
{
    long i = t / bt->batch1, j = t % bt->batch1;
    g->A = bt->A + i * bt->a_stride0 + j * bt->a_stride1;
    g->B = bt->B + i * bt->b_stride0 + j * bt->b_stride1;
    g->C = bt->C + i * bt->c_stride0 + j * bt->c_stride1;
}

/* Shared: many threads on large products (BLIS's parallel loops, one parallel region).
 *
 *   for each batch entry, N block jc (NC columns), K block pc (KC), in this order:
 *     the team packs op(B)[pc, jc] ONCE into a shared buffer, each thread a contiguous
 *     share of its NR panels;                                       barrier
 *     each thread packs its own rows of op(A)[:, pc] (chunks of at most MC rows, private,
 *     L2) and runs the micro-kernels on its rectangle of C[:, jc] against the shared panels.
 *
 * Why: in the tiles schedule every thread packs (and keeps in L3) its own copy of each B
 * block it touches, so packing work and L3 footprint grow with the team; here both are
 * those of one thread, whatever the team (a 16-core Xeon fell from 763 GF/s at 8 threads
 * to 341 at 16 with tiles on 2048 x 2048 x 512).
 *
 * The team is split tr x tc (tr * tc = team): rows of C into tr balanced ranges (any
 * height: pack_a_block balances the panels, so 128 rows run as 10 panels of 12.8 rows and
 * no thread gets a spare panel), each block's NR panels into tc balanced groups. tr is the
 * largest divisor of the team that leaves every thread GEMM_SHARED_PANELS row panels or
 * more (a B micro-panel loaded into L1 serves that many kernel calls); the columns take
 * the rest of the team only when rows run short (their A rows are then packed tc times,
 * small next to B). Each thread owns the same rectangle in every block.
 *
 * A thread the OS stalls must not hold the team up for long at the barriers: a thread's
 * rectangle is cut into its row chunks x GEMM_SHARED_SLICES column slices, which it takes
 * in order from its own counter; a thread done with its own takes what is left of the
 * others' (packing the owner's rows of A for itself: 1/tc of the owner's share of A, for
 * 1/SLICES of its work). Without stalls every thread does exactly its own rectangle.
 *
 * Two B buffers: after computing block b a thread packs its share of block b + 1 into the
 * other buffer, then waits at the one barrier per block, which both publishes block b + 1
 * and guarantees that nobody still reads the buffer that block b + 2 will overwrite. The
 * counters alternate the same way: a thread resets its counter for block b + 1 during block b.
 * Bits: every element of C sums the same K blocks in the same order with the same kernel
 * as in the other schedules, so the result depends neither on the team nor on who computes it. */
#define GEMM_SHARED_PANELS 3
#define GEMM_SHARED_SLICES 4
#define GEMM_COUNTER_STRIDE 8   /* longs: one counter per 64-byte line */

static int shared_row_ways(const gemm_isa *s, long M, int team)
{
    for (int tr = team; tr > 1; tr--)
        if (team % tr == 0 && M >= (long)tr * GEMM_SHARED_PANELS * s->mr) return tr;
    return 1;
}

/* Floats of one shared B block: [kcb][NR panels of at most NC columns]. */
static long shared_b_floats(const gemm_isa *s, long N, long K)
{
    return (k_block(s, K) * min_l(s->nc, ceil_div(N, s->nr) * s->nr) + 15) / 16 * 16;
}

/* counters: 2 x team counters, GEMM_COUNTER_STRIDE apart, zero on entry. lazy (tests only):
 * odd threads leave their own work to the others. */
static void gemm_shared(gemm_problem *g, const gemm_batch *bt, long nb, float *Bbuf, float *Ap,
                        long *counters, int lazy, int tid, int team)
{
    const gemm_isa *s = g->isa;
    const int NR = s->nr;
    const long M = g->M, kcb = k_block(s, g->K), b_size = shared_b_floats(s, g->N, g->K);
    const long jn = ceil_div(g->N, s->nc), kn = ceil_div(g->K, kcb), blocks = nb * jn * kn;
    const int tr = shared_row_ways(s, M, team), tc = team / tr;
    for (long b = -1; b < blocks; b++) {
        if (b >= 0) {   /* block b: my rectangle, then what others left */
            long t = b / (jn * kn), j0 = (b / kn) % jn * s->nc, pc = b % kn * kcb;
            long nc = min_l(s->nc, g->N - j0), kc = min_l(kcb, g->K - pc), q = ceil_div(nc, NR);
            const float *Bp = Bbuf + (b & 1) * b_size;
            long *counter = counters + (b & 1) * team * GEMM_COUNTER_STRIDE;
            gemm_entry(g, bt, t);
            for (int v = 0; v < team; v++) {
                int owner = (tid + v) % team, oi = owner / tc, oj = owner % tc;
                if (v == 0 && lazy && tid % 2) continue;
                long r0 = M * oi / tr, rows = M * (oi + 1) / tr - r0, chunks = ceil_div(rows, s->mc);
                long c0 = q * oj / tc, cn = q * (oj + 1) / tc - c0, slices = min_l(GEMM_SHARED_SLICES, cn);
                long u, held = -1;
                while ((u = __atomic_fetch_add(counter + owner * GEMM_COUNTER_STRIDE, 1, __ATOMIC_RELAXED))
                       < chunks * slices) {
                    long ch = u / slices, sl = u % slices;
                    long i0 = r0 + rows * ch / chunks, mc = r0 + rows * (ch + 1) / chunks - i0;
                    if (ch != held) { pack_a_block(g, i0, mc, pc, kc, Ap); held = ch; }
                    g->packed[2] += v > 0;
                    for (long jp = c0 + cn * sl / slices; jp < c0 + cn * (sl + 1) / slices; jp++)
                        run_kernels(g, mc, kc, Ap, Bp + jp * NR * kc, NR, (int)min_l(NR, nc - jp * NR),
                                    g->C + i0 * g->ldc + j0 + jp * NR, g->accumulate || pc > 0);
                }
            }
            __atomic_store_n(counters + ((b + 1) & 1) * team * GEMM_COUNTER_STRIDE + tid * GEMM_COUNTER_STRIDE,
                             0, __ATOMIC_RELAXED);
        }
        if (b + 1 < blocks) {   /* my share of block b + 1's panels */
            long t = (b + 1) / (jn * kn), j0 = (b + 1) / kn % jn * s->nc, pc = (b + 1) % kn * kcb;
            long nc = min_l(s->nc, g->N - j0), kc = min_l(kcb, g->K - pc), q = ceil_div(nc, NR);
            long p0 = q * tid / team, p1 = q * (tid + 1) / team;
            if (p1 > p0) {
                long cols = min_l(p1 * NR, nc) - p0 * NR;
                gemm_entry(g, bt, t);
                s->pack_b(g->trans_b, b_at(g, pc, j0 + p0 * NR), g->ldb, cols, kc,
                          Bbuf + ((b + 1) & 1) * b_size + p0 * NR * kc);
                g->packed[1] += cols * kc;
            }
        }
#pragma omp barrier
    }
}

/* Packing buffers: one process-wide buffer reused across calls (no page faults per
 * call); a concurrent caller that finds it busy allocates its own. */
static float *cached_buffer;
static size_t cached_floats;
static char cached_busy;

static float *buffer_acquire(size_t floats, int *owned)
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

static void buffer_release(float *buffer, int owned)
{
    if (owned) free(buffer);
    else __atomic_clear(&cached_busy, __ATOMIC_RELEASE);
}

static size_t round16(size_t n) { return (n + 15) / 16 * 16; }

/* Testing hooks (gemm.h). */
static int forced_schedule = GEMM_AUTO, forced_all_threads = 0, forced_lazy = 0, last_schedule = GEMM_AUTO;
static long packed_total[3];

void gemm_test_force(int schedule, int all_threads, int lazy)
{
    forced_schedule = schedule == GEMM_TILES || schedule == GEMM_SHARED ? schedule : GEMM_AUTO;
    forced_all_threads = all_threads != 0;
    forced_lazy = lazy != 0;
}

int gemm_test_last_schedule(void) { return __atomic_load_n(&last_schedule, __ATOMIC_RELAXED); }

void gemm_test_counters(long counts[3], int reset)
{
    for (int i = 0; i < 3; i++)
        counts[i] = reset ? __atomic_exchange_n(&packed_total[i], 0, __ATOMIC_RELAXED)
                          : __atomic_load_n(&packed_total[i], __ATOMIC_RELAXED);
}

/* The rule: a large product (not few rows, not A @ B^T with few rows, not many batch
 * entries: those keep narrow, dot and by_batch, which never pack B twice) runs on the
 * shared schedule from GEMM_SHARED_THREADS threads on, on tiles below. In tiles every
 * thread packs all of B that its tiles touch (about K x N) while its share of the product
 * shrinks as 1 / team, so the packing fraction grows linearly with the team, and the L3
 * holds team copies of B (2048 x 2048 x 512 on a 16-core Xeon: 430 GF/s at 4 threads, 763
 * at 8, 341 at 16). Even at 2 threads shared wins on a quiet machine (the 2-core EPYC,
 * 1024 x 2048 x 512 and the other products of a base training step: 99-107 % parallel
 * efficiency against tiles' 88-98 %); tiles, which need no barrier, remain for a single
 * thread's fallbacks and for forcing in tests. */
#define GEMM_SHARED_THREADS 2

static void reference_prec(int prec, int trans_a, int trans_b, long batch0, long batch1,
                           long M, long N, long K, float alpha,
                           const float *A, long lda, long a_stride0, long a_stride1,
                           const float *B, long ldb, long b_stride0, long b_stride1,
                           int accumulate, float *C, long ldc, long c_stride0, long c_stride1);

void gemm_batched_prec(int prec, int trans_a, int trans_b, long batch0, long batch1,
                       long M, long N, long K, float alpha,
                       const float *A, long lda, long a_stride0, long a_stride1,
                       const float *B, long ldb, long b_stride0, long b_stride1,
                       int accumulate,
                       float *C, long ldc, long c_stride0, long c_stride1)
{
    if (batch0 <= 0 || batch1 <= 0 || M <= 0 || N <= 0) return;
    const long nb = batch0 * batch1;
    if (K <= 0) {   /* empty sum: zeros, or C unchanged */
        if (!accumulate)
            for (long t = 0; t < nb; t++)
                for (long i = 0; i < M; i++)
                    memset(C + (t / batch1) * c_stride0 + (t % batch1) * c_stride1 + i * ldc, 0,
                           (size_t)N * sizeof(float));
        return;
    }
    const gemm_isa *s = gemm_isa_of(tf_isa(), prec);
    const long item = M * N * K, np = ceil_div(N, s->nr);
    const int forced = forced_schedule;
    int nt = forced_all_threads ? tf_get_num_threads() : tf_team(nb * item, GEMM_GRAIN);
    /* Many small GEMMs: each thread a range of batch entries. Few large ones: all threads on each. */
    const int by_batch = nt > 1 && nb >= nt && (nb % nt == 0 || nb >= 4 * nt || item < 4 * GEMM_GRAIN);
    /* few rows of A @ B^T: dot products straight from the caller's rows, nothing packed */
    const int dot = s->dot && !trans_a && trans_b && K >= GEMM_DOT_MIN_K &&
                    (M <= GEMM_DOT_ROWS / 2 || (M <= GEMM_DOT_ROWS && K >= 4 * GEMM_DOT_MIN_K));
    const int narrow = narrow_fits(s, M, K);
    int schedule = dot ? GEMM_DOT : forced ? forced : nt == 1 ? (narrow ? GEMM_NARROW : GEMM_PRIVATE)
                 : by_batch ? GEMM_BY_BATCH : narrow ? GEMM_NARROW
                 : nt >= GEMM_SHARED_THREADS ? GEMM_SHARED : GEMM_TILES;

    /* Buffers: the shared B blocks (shared schedule), then per thread Bp and Ap. */
    const long kcb = k_block(s, K), mpad = ceil_div(M, s->mr) * s->mr;
    size_t a_floats = 0, b_floats = 0, shared_floats = 0;
    if (schedule == GEMM_SHARED) {
        shared_floats = 2 * (size_t)shared_b_floats(s, N, K);
        a_floats = round16((size_t)(min_l(mpad, s->mc) * kcb));
    } else if (narrow && schedule != GEMM_TILES) {
        a_floats = round16((size_t)(mpad * K));
        b_floats = round16((size_t)(kcb * s->nr));
    } else if (!dot) {
        long tile_b = ceil_div(K, kcb) * kcb * ceil_div(tile_cols(s, N, K), s->nr) * s->nr;
        a_floats = round16((size_t)(min_l(mpad, s->mc) * kcb));
        b_floats = round16((size_t)max_l(kcb * min_l(np * s->nr, s->nc), tile_b));
    }
    const size_t total = shared_floats + (size_t)nt * (a_floats + b_floats);
    int owned = 1;
    float *buffer = dot ? NULL : buffer_acquire(total, &owned);
    if (!buffer && !dot) {   /* out of memory: the slow path still gives the right answer */
        reference_prec(prec, trans_a, trans_b, batch0, batch1, M, N, K, alpha, A, lda, a_stride0,
                       a_stride1, B, ldb, b_stride0, b_stride1, accumulate, C, ldc, c_stride0, c_stride1);
        return;
    }

    long counters[2 * GEMM_COUNTER_STRIDE * (schedule == GEMM_SHARED ? nt : 1)];   /* shared schedule */
    memset(counters, 0, sizeof counters);
    const int lazy = forced_lazy;
    const gemm_batch bt = {batch1, A, a_stride0, a_stride1, B, b_stride0, b_stride1, C, c_stride0, c_stride1};
    long next = 0;   /* the next unit of work nobody has taken yet (dynamic schedules) */
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int tid = 0, team = 1;
#ifdef _OPENMP
        tid = omp_get_thread_num();
        team = omp_get_num_threads();
#endif
        long packed[3] = {0, 0, 0};
        gemm_problem g = {s, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, accumulate, C, ldc, packed};
        /* a team of one (OpenMP gave no more) runs alone, except in the shared schedule, whose
         * buffers are laid out for it (its barriers are then no-ops) */
        int run = team == 1 && !forced && schedule != GEMM_DOT && schedule != GEMM_SHARED
                  ? (narrow ? GEMM_NARROW : GEMM_PRIVATE) : schedule;
        if (tid == 0) __atomic_store_n(&last_schedule, run, __ATOMIC_RELAXED);
#if TF_HAVE_AMX
        if (s->amx) tf_amx_begin();
#endif
        float *Bp = dot ? NULL : buffer + shared_floats + (size_t)tid * (a_floats + b_floats);
        float *Ap = dot ? NULL : Bp + b_floats;
        long u;
        if (run == GEMM_DOT) {   /* units of 4 * `per` columns */
            long tiles = ceil_div(N, 4), per = team == 1 ? tiles : ceil_div(tiles, 8L * team);
            long groups = ceil_div(tiles, per);
            while ((u = team == 1 ? (next < nb * groups ? next++ : nb * groups)
                                  : __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED)) < nb * groups) {
                long t = u / groups, p = u % groups;
                gemm_entry(&g, &bt, t);
                s->dot(M, K, alpha, g.A, lda, g.B, ldb, accumulate, g.C, ldc, 4 * p * per,
                       min_l(N, 4 * (p + 1) * per));
            }
        } else if (run == GEMM_PRIVATE || (run == GEMM_NARROW && team == 1)) {
            for (long t = 0; t < nb; t++) { gemm_entry(&g, &bt, t); gemm_alone(&g, Bp, Ap, 0, np); }
        } else if (run == GEMM_BY_BATCH) {   /* units of `per` batch entries */
            long per = ceil_div(nb, 8L * team);
            while ((u = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED)) * per < nb)
                for (long t = u * per; t < min_l(nb, (u + 1) * per); t++) {
                    gemm_entry(&g, &bt, t);
                    gemm_alone(&g, Bp, Ap, 0, np);
                }
        } else if (run == GEMM_NARROW) {     /* units of `per` NR panels; op(A) packed once per entry */
            long per = ceil_div(np, 8L * team), groups = ceil_div(np, per), held = -1;
            while ((u = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED)) < nb * groups) {
                long t = u / groups, p = u % groups;
                gemm_entry(&g, &bt, t);
                if (t != held) { narrow_pack_a(&g, Ap); held = t; }
                narrow_panels(&g, Bp, Ap, p * per, min_l(np, (p + 1) * per));
            }
        } else if (run == GEMM_SHARED) {
            gemm_shared(&g, &bt, nb, buffer, Ap, counters, lazy, tid, team);
        } else {                             /* tiles */
            long mcu = tile_rows(s, M, team), ncu = tile_cols(s, N, K);
            long rb = ceil_div(M, mcu), cb = ceil_div(N, ncu), held = -1;
            while ((u = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED)) < nb * rb * cb) {
                long t = u / (rb * cb), c = u % (rb * cb) / rb, r = u % rb;
                gemm_entry(&g, &bt, t);
                gemm_tile(&g, Bp, Ap, r * mcu, min_l(mcu, M - r * mcu), c * ncu, min_l(ncu, N - c * ncu),
                          t * cb + c != held);
                held = t * cb + c;
            }
        }
#if TF_HAVE_AMX
        if (s->amx) tf_amx_end();
#endif
        __atomic_fetch_add(&packed_total[0], packed[0], __ATOMIC_RELAXED);
        __atomic_fetch_add(&packed_total[1], packed[1], __ATOMIC_RELAXED);
        __atomic_fetch_add(&packed_total[2], packed[2], __ATOMIC_RELAXED);
    }
    if (buffer) buffer_release(buffer, owned);
}

void gemm_batched(int trans_a, int trans_b, long batch0, long batch1,
                  long M, long N, long K, float alpha,
                  const float *A, long lda, long a_stride0, long a_stride1,
                  const float *B, long ldb, long b_stride0, long b_stride1,
                  int accumulate,
                  float *C, long ldc, long c_stride0, long c_stride1)
{
    gemm_batched_prec(GEMM_FP32, trans_a, trans_b, batch0, batch1, M, N, K, alpha, A, lda, a_stride0,
                      a_stride1, B, ldb, b_stride0, b_stride1, accumulate, C, ldc, c_stride0, c_stride1);
}

void gemm(int trans_a, int trans_b, long M, long N, long K, float alpha,
          const float *A, long lda, const float *B, long ldb, int accumulate, float *C, long ldc)
{
    gemm_batched(trans_a, trans_b, 1, 1, M, N, K, alpha, A, lda, 0, 0, B, ldb, 0, 0,
                 accumulate, C, ldc, 0, 0);
}

/* ------------------------------------------------------------------------- */
/* Pre-packed B (gemm.h): panel jp of op(B), columns [jp*NR, jp*NR + NR), is [K][NR] at
 * Bp + jp*K*NR, so a thread streams its panels in one sequential pass; K block pc of a panel
 * is the kc x NR slice at + pc*NR that the micro-kernels read as usual. */

/* The kernels a pre-packed op(B) is packed for and multiplied with: gemm_isa_of's, except bf16 at
 * the AVX2 level, whose pre-packed panels hold pairs (isa_avx2_bf16_packed). */
static const gemm_isa *packed_isa_of(int level, int prec)
{
#ifdef GEMM_X86
    if (level == TF_ISA_AVX2 && prec == GEMM_BF16) return &isa_avx2_bf16_packed;
#endif
    return gemm_isa_of(level, prec);
}

long gemm_packed_floats(int isa, long N, long K)
{
    const gemm_isa *s = gemm_isa_of(isa, GEMM_FP32);
    return ceil_div(N, s->nr) * s->nr * K;
}

void gemm_pack_b(int isa, int prec, int trans_b, long N, long K, const float *B, long ldb, float *Bp)
{
    const gemm_isa *s = packed_isa_of(isa, prec);
    const long NR = s->nr, np = ceil_div(N, NR);
#pragma omp parallel for num_threads(tf_team(N * K, GEMM_GRAIN / 4)) schedule(static)
    for (long jp = 0; jp < np; jp++) {
        long j = jp * NR;
        s->pack_b(trans_b, trans_b ? B + j * ldb : B + j, ldb, min_l(NR, N - j), K, Bp + j * K);
    }
}

/* Element k of a pre-packed panel's column that starts at b. */
static float packed_b_at(const gemm_isa *s, const float *b, long k)
{
    if (!s->pairs) return b[k * s->nr];
    uint32_t u;
    memcpy(&u, b + k / 2 * s->nr, sizeof u);
    u = k % 2 ? u & 0xffff0000u : u << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* The naive form of gemm_packed (only when no buffer for op(A) can be had). */
static void gemm_packed_slow(const gemm_isa *s, long M, long N, long K, float alpha, const float *A,
                             long lda, const float *Bp, int accumulate, float *C, long ldc)
{
    for (long i = 0; i < M; i++)
        for (long j = 0; j < N; j++) {
            const float *b = Bp + (j / s->nr) * K * s->nr + j % s->nr;
            double sum = 0.0;
            for (long k = 0; k < K; k++)
                sum += (double)(s->bf16 ? round_bf16(A[i * lda + k]) : A[i * lda + k]) * packed_b_at(s, b, k);
            double r = (double)alpha * sum;
            if (accumulate) r += C[i * ldc + j];
            C[i * ldc + j] = (float)r;
        }
}

void gemm_packed(int isa, int prec, long M, long N, long K, float alpha, const float *A, long lda,
                 const float *Bp, int accumulate, float *C, long ldc)
{
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        for (long i = 0; i < M && !accumulate; i++) memset(C + i * ldc, 0, (size_t)N * sizeof(float));
        return;
    }
    const gemm_isa *s = packed_isa_of(isa, prec);
    const long NR = s->nr, np = ceil_div(N, NR), kcb = k_block(s, K);
    const long rows = min_l(M, s->mc), rpad = ceil_div(rows, s->mr) * s->mr;
    int owned = 1;
    float *Ap = buffer_acquire(round16((size_t)(rpad * K)), &owned);
    if (!Ap) {
        gemm_packed_slow(s, M, N, K, alpha, A, lda, Bp, accumulate, C, ldc);
        return;
    }
    for (long ic = 0; ic < M; ic += rows) {   /* one block of rows (decoding: always one) */
        const long mc = min_l(rows, M - ic), mpad = ceil_div(mc, s->mr) * s->mr;
        long packed[3] = {0, 0, 0};
        gemm_problem g = {s, 0, 0, mc, N, K, alpha, A + ic * lda, lda, NULL, 0, accumulate,
                          C + ic * ldc, ldc, packed};
        for (long pc = 0; pc < K; pc += kcb)   /* op(A) as the narrow schedule packs it */
            pack_a_block(&g, 0, mc, pc, min_l(kcb, K - pc), Ap + pc * mpad);
        const int nt = forced_all_threads ? tf_get_num_threads() : tf_team(mc * N * K, GEMM_PACKED_GRAIN);
        long next = 0;   /* the next group of panels nobody has taken */
#pragma omp parallel num_threads(nt) if (nt > 1)
        {
            int team = 1;
#ifdef _OPENMP
            team = omp_get_num_threads();
#endif
            const long per = team == 1 ? np : ceil_div(np, 8L * team);
            long u;
#if TF_HAVE_AMX
            if (s->amx) tf_amx_begin();
#endif
            while ((u = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED)) * per < np)
                for (long jp = u * per; jp < min_l(np, (u + 1) * per); jp++) {
                    const long j = jp * NR;
                    for (long pc = 0; pc < K; pc += kcb)
                        run_kernels_from(&g, mc, min_l(kcb, K - pc), Ap + pc * mpad,
                                         Bp + j * K + (s->pairs ? pc / 2 : pc) * NR,
                                         NR, (int)min_l(NR, N - j), C + ic * ldc + j, accumulate || pc > 0, 1);
                }
#if TF_HAVE_AMX
            if (s->amx) tf_amx_end();
#endif
        }
    }
    buffer_release(Ap, owned);
}

void gemm_reference(int trans_a, int trans_b, long batch0, long batch1,
                    long M, long N, long K, float alpha,
                    const float *A, long lda, long a_stride0, long a_stride1,
                    const float *B, long ldb, long b_stride0, long b_stride1,
                    int accumulate,
                    float *C, long ldc, long c_stride0, long c_stride1)
{
    reference_prec(GEMM_FP32, trans_a, trans_b, batch0, batch1, M, N, K, alpha, A, lda, a_stride0,
                   a_stride1, B, ldb, b_stride0, b_stride1, accumulate, C, ldc, c_stride0, c_stride1);
}

static void reference_prec(int prec, int trans_a, int trans_b, long batch0, long batch1,
                           long M, long N, long K, float alpha,
                           const float *A, long lda, long a_stride0, long a_stride1,
                           const float *B, long ldb, long b_stride0, long b_stride1,
                           int accumulate, float *C, long ldc, long c_stride0, long c_stride1)
{
    const int bf16 = prec == GEMM_BF16;
    for (long b0 = 0; b0 < batch0; b0++)
        for (long b1 = 0; b1 < batch1; b1++) {
            const float *a = A + b0 * a_stride0 + b1 * a_stride1;
            const float *b = B + b0 * b_stride0 + b1 * b_stride1;
            float *c = C + b0 * c_stride0 + b1 * c_stride1;
            for (long i = 0; i < M; i++)
                for (long j = 0; j < N; j++) {
                    double sum = 0.0;
                    for (long k = 0; k < K; k++) {
                        float x = trans_a ? a[k * lda + i] : a[i * lda + k];
                        float y = trans_b ? b[j * ldb + k] : b[k * ldb + j];
                        if (bf16) { x = round_bf16(x); y = round_bf16(y); }
                        sum += (double)x * y;
                    }
                    double r = (double)alpha * sum;
                    if (accumulate) r += c[i * ldc + j];
                    c[i * ldc + j] = (float)r;
                }
        }
}
