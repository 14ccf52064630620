/* int8 GEMM for inference (see qgemm.h for the contract and the packed layout).
 *
 *   quantize every row of X once (int16, k padded to an even count), before the parallel loop
 *   for each block of up to QGEMM_MB rows:            (decoding: always one block)
 *     threads take groups of NR-column panels from a shared counter:
 *       for each tile of up to MR rows:
 *         int32 tile of acc[MR x NR] over all of K, then dequantize and store
 *
 * Each panel is read in one sequential pass per block of rows, and stays in L1/L2 for the
 * other row tiles of that block. The integer sum is exact, so its order is free; the
 * dequantization is one fixed sequence of float32 operations per element, so the bits depend
 * on neither the instruction set nor the thread count.
 *
 * AVX2 micro-kernel: 6 rows x 16 columns, 12 ymm int32 accumulators. Per pair of k, the 32
 * packed bytes [16][2] are sign-extended to int16 (vpmovsxbw) and multiplied by the row's
 * broadcast int16 pair with vpmaddwd, which adds the two products into one int32 lane:
 * exact (|sum| <= 2 * 127 * 127), unlike vpmaddubsw, which saturates at int16.
 * Plain C: one int32 dot product per element over a row of Q (panels of one column).
 */
#include "qgemm.h"
#include "amx.h"
#include "cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "simd.h"
#if TF_HAVE_X86
#define QGEMM_X86 1
#define TARGET_AVX2 TF_TARGET_AVX2
#define TARGET_VNNI TF_TARGET_AVX512_VNNI
#endif

/* Rows per block: the activations of a block (QGEMM_MB x K int16) stay in L2 while the
 * panels stream past them; decoding (batch x beams) fits in one block. */
#define QGEMM_MB 64
/* Multiply-adds per thread below which no other thread is started (see GEMM_GRAIN): about 20 us
 * on an AVX2 core. Decoding calls these back to back, so the team is awake; with 4M (the value
 * until 2026-11-26) a base-size step's 8-row x @ W^T for W of 512 x 512 and 1536 x 512 ran on one
 * thread, and 2 threads decoded greedy 9-13% slower than with every product split (AMD EPYC
 * Zen 2, family 23 model 49). */
#define QGEMM_GRAIN (1L << 20)
/* How far ahead (bytes) the first row tile of a block fetches a panel streaming from memory. */
#define QGEMM_AHEAD 2048

static long ceil_div(long a, long b) { return (a + b - 1) / b; }
static long min_l(long a, long b) { return a < b ? a : b; }
static long round64(long bytes) { return (bytes + 63) / 64 * 64; }

/* Panel geometry of an instruction set: NR columns per panel, k in groups of KG. */
typedef struct { int nr, kg; } qgemm_layout;

static qgemm_layout layout_of(int isa)
{
    qgemm_layout generic = {1, 1}, avx2 = {16, 2}, vnni = {32, 4};
#ifdef QGEMM_X86
    if (isa >= TF_ISA_AVX512_VNNI) return vnni;
    if (isa >= TF_ISA_AVX2) return avx2;   /* AVX-512 without VNNI runs the AVX2 kernel */
#else
    (void)avx2;
    (void)vnni;
#endif
    return generic;
}

/* ------------------------------------------------------------------------- */
/* Quantization of one row (qgemm.h): the rule, then the plain C and AVX2 forms of it. */

/* From a row's amax (and whether it held a NaN): inv = 127 / amax and the scale, or 0 and the
 * scale of a row that quantizes to zeros (scale 0, or NaN for a non-finite row). */
static float row_rule(float amax, int has_nan, float *inv)
{
    *inv = 0.0f;
    if (has_nan || !(amax <= 3.40282347e38f)) return NAN;
    if (amax < QGEMM_TINY) return 0.0f;
    *inv = 127.0f / amax;
    return amax / 127.0f;
}

/* clamp(rint(v * inv), -127, 127); v * inv is finite and at most 127 * (1 + 2^-23) in
 * magnitude whenever inv != 0, so the conversion is always defined. */
static inline int quantize_one(float v, float inv)
{
    float r = nearbyintf(v * inv);
    if (r > 127.0f) r = 127.0f;
    if (r < -127.0f) r = -127.0f;
    return (int)r;
}

/* The scale of row v[0, K) and its inv (row_rule), scanning the row one element at a time. */
static float row_scale_c(long K, const float *v, float *inv)
{
    float amax = 0.0f;
    int has_nan = 0;
    for (long k = 0; k < K; k++) {
        float a = fabsf(v[k]);
        amax = a > amax ? a : amax;
        has_nan |= v[k] != v[k];
    }
    return row_rule(amax, has_nan, inv);
}

/* Row v[0, K) into q8 (int8) or q16 (int16), whichever is not NULL; returns the scale. */
static float quantize_row_c(long K, const float *v, int8_t *q8, int16_t *q16)
{
    float inv, scale = row_scale_c(K, v, &inv);
    for (long k = 0; k < K; k++) {
        int q = inv != 0.0f ? quantize_one(v[k], inv) : 0;
        if (q8) q8[k] = (int8_t)q;
        else q16[k] = (int16_t)q;
    }
    return scale;
}

#ifdef QGEMM_X86
static TARGET_AVX2 float quantize_row_avx2(long K, const float *v, int16_t *q)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 vmax = _mm256_setzero_ps(), vnan = _mm256_setzero_ps();
    long k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 x = _mm256_loadu_ps(v + k);
        vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, x));   /* max is exact in any order */
        vnan = _mm256_or_ps(vnan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, vmax);
    float amax = 0.0f;
    for (int j = 0; j < 8; j++) amax = lanes[j] > amax ? lanes[j] : amax;
    int has_nan = _mm256_movemask_ps(vnan) != 0;
    for (; k < K; k++) {
        float a = fabsf(v[k]);
        amax = a > amax ? a : amax;
        has_nan |= v[k] != v[k];
    }
    float inv, scale = row_rule(amax, has_nan, &inv);
    if (inv == 0.0f) {
        memset(q, 0, (size_t)K * sizeof(int16_t));
        return scale;
    }
    const __m256 vinv = _mm256_set1_ps(inv), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    for (k = 0; k + 16 <= K; k += 16) {
        __m256 a = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(v + k), vinv),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 b = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(v + k + 8), vinv),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        a = _mm256_max_ps(_mm256_min_ps(a, hi), lo);
        b = _mm256_max_ps(_mm256_min_ps(b, hi), lo);
        /* packs interleaves 128-bit halves: [a0-3 b0-3 a4-7 b4-7] -> [a0-7 b0-7] */
        __m256i ab = _mm256_packs_epi32(_mm256_cvtps_epi32(a), _mm256_cvtps_epi32(b));
        _mm256_storeu_si256((__m256i *)(q + k), _mm256_permute4x64_epi64(ab, 0xD8));
    }
    for (; k < K; k++) q[k] = (int16_t)quantize_one(v[k], inv);
    return scale;
}
#endif

void qgemm_quantize(long N, long K, const float *W, long ldw, int8_t *Q, float *scale)
{
#pragma omp parallel for num_threads(tf_team(N * K, QGEMM_GRAIN / 4)) schedule(static)
    for (long n = 0; n < N; n++)
        scale[n] = quantize_row_c(K, W + n * ldw, Q + n * K, NULL);
}

/* ------------------------------------------------------------------------- */
/* Micro-kernels: rows [0, m) of the block (Xq: int16 rows of ldq, zero past K, or for VNNI
 * the same rows as uint8 q + 128 at the start of each row; xs: their scales) times one panel
 * (ws, comp: its NR scales and compensations; bias: at its first column, or NULL) into the
 * nr <= NR columns of C that the panel covers. */
typedef void (*qgemm_kernel)(long m, long K, const int16_t *Xq, long ldq, const float *xs,
                             const int8_t *panel, const float *ws, const int32_t *comp,
                             const float *bias, float *C, long ldc, int nr);

/* The dequantization, one element (every path computes exactly this). */
static inline float dequantize(int32_t acc, float xs, float ws, const float *bias)
{
    float s = xs * ws;
    return bias ? fmaf((float)acc, s, *bias) : (float)acc * s;
}

static void kernel_generic(long m, long K, const int16_t *Xq, long ldq, const float *xs,
                           const int8_t *panel, const float *ws, const int32_t *comp,
                           const float *bias, float *C, long ldc, int nr)
{
    (void)nr;   /* panels of one column */
    (void)comp;
    for (long i = 0; i < m; i++) {
        const int16_t *x = Xq + i * ldq;
        int32_t acc = 0;
        for (long k = 0; k < K; k++) acc += (int32_t)x[k] * panel[k];
        C[i * ldc] = dequantize(acc, xs[i], ws[0], bias);
    }
}

#ifdef QGEMM_X86
#define AVX2_MR 6
#define AVX2_NR 16

static inline __attribute__((always_inline)) TARGET_AVX2 void
tile_avx2(long pairs, const int16_t *restrict Xq, long ldq, const float *xs,
          const int8_t *restrict panel, const float *ws, const float *bias,
          float *restrict C, long ldc, int nr, const int mr, const int stream)
{
    __m256i c0[AVX2_MR], c1[AVX2_MR];
#pragma GCC unroll 6
    for (int i = 0; i < AVX2_MR; i++)
        if (i < mr) { c0[i] = _mm256_setzero_si256(); c1[i] = _mm256_setzero_si256(); }
    for (long g = 0; g < pairs; g++) {
        const int8_t *w = panel + g * 2 * AVX2_NR;
        if (stream)   /* an address, never dereferenced: no pointer past the buffer is formed */
            _mm_prefetch((const char *)((uintptr_t)w + QGEMM_AHEAD), _MM_HINT_T0);
        /* columns 0-7 and 8-15, each as int16 pairs (k, k+1) */
        __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w));
        __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + AVX2_NR)));
#pragma GCC unroll 6
        for (int i = 0; i < AVX2_MR; i++)
            if (i < mr) {
                int32_t pair;   /* x[i][2g], x[i][2g+1] as one 32-bit lane */
                memcpy(&pair, Xq + i * ldq + 2 * g, sizeof pair);
                __m256i x = _mm256_set1_epi32(pair);
                c0[i] = _mm256_add_epi32(c0[i], _mm256_madd_epi16(x, w0));
                c1[i] = _mm256_add_epi32(c1[i], _mm256_madd_epi16(x, w1));
            }
    }
    /* Through memory, as the VNNI tile does: gcc 12 would otherwise keep a stack copy of the
     * accumulators inside the loop above. */
    int32_t acc[AVX2_MR * AVX2_NR] __attribute__((aligned(32)));
#pragma GCC unroll 6
    for (int i = 0; i < AVX2_MR; i++)
        if (i < mr) {
            _mm256_store_si256((__m256i *)(acc + i * AVX2_NR), c0[i]);
            _mm256_store_si256((__m256i *)(acc + i * AVX2_NR + 8), c1[i]);
        }
    const __m256 ws0 = _mm256_loadu_ps(ws), ws1 = _mm256_loadu_ps(ws + 8);   /* padded to NR */
    for (int i = 0; i < mr; i++) {
        const __m256 x = _mm256_set1_ps(xs[i]);
        __m256 s0 = _mm256_mul_ps(x, ws0), s1 = _mm256_mul_ps(x, ws1);
        __m256 a0 = _mm256_cvtepi32_ps(_mm256_load_si256((const __m256i *)(acc + i * AVX2_NR)));
        __m256 a1 = _mm256_cvtepi32_ps(_mm256_load_si256((const __m256i *)(acc + i * AVX2_NR + 8)));
        float *c = C + i * ldc;
        if (nr == AVX2_NR) {
            if (bias) {
                _mm256_storeu_ps(c, _mm256_fmadd_ps(a0, s0, _mm256_loadu_ps(bias)));
                _mm256_storeu_ps(c + 8, _mm256_fmadd_ps(a1, s1, _mm256_loadu_ps(bias + 8)));
            } else {
                _mm256_storeu_ps(c, _mm256_mul_ps(a0, s0));
                _mm256_storeu_ps(c + 8, _mm256_mul_ps(a1, s1));
            }
        } else {   /* the panel's last columns: the same operations, one at a time */
            float a[AVX2_NR], s[AVX2_NR];
            _mm256_storeu_ps(a, a0);
            _mm256_storeu_ps(a + 8, a1);
            _mm256_storeu_ps(s, s0);
            _mm256_storeu_ps(s + 8, s1);
            for (int j = 0; j < nr; j++)
                c[j] = bias ? fmaf(a[j], s[j], bias[j]) : a[j] * s[j];
        }
    }
}

#define AVX2_TILE(R)                                                                         \
    static TARGET_AVX2 void tile_avx2_##R(long pairs, const int16_t *Xq, long ldq,           \
                                          const float *xs, const int8_t *panel,              \
                                          const float *ws, const float *bias, float *C,      \
                                          long ldc, int nr, int stream)                      \
    {                                                                                        \
        if (stream) tile_avx2(pairs, Xq, ldq, xs, panel, ws, bias, C, ldc, nr, R, 1);        \
        else tile_avx2(pairs, Xq, ldq, xs, panel, ws, bias, C, ldc, nr, R, 0);               \
    }
AVX2_TILE(1) AVX2_TILE(2) AVX2_TILE(3) AVX2_TILE(4) AVX2_TILE(5) AVX2_TILE(6)

typedef void (*tile_fn)(long, const int16_t *, long, const float *, const int8_t *, const float *,
                        const float *, float *, long, int, int);
static const tile_fn tiles_avx2[AVX2_MR + 1] = {0, tile_avx2_1, tile_avx2_2, tile_avx2_3,
                                                tile_avx2_4, tile_avx2_5, tile_avx2_6};

static void kernel_avx2(long m, long K, const int16_t *Xq, long ldq, const float *xs,
                        const int8_t *panel, const float *ws, const int32_t *comp,
                        const float *bias, float *C, long ldc, int nr)
{
    (void)comp;
    const long pairs = ceil_div(K, 2);
    for (long i = 0; i < m; i += AVX2_MR) {
        int mr = (int)min_l(AVX2_MR, m - i);
        tiles_avx2[mr](pairs, Xq + i * ldq, ldq, xs + i, panel, ws, bias, C + i * ldc, ldc, nr,
                       i == 0);
    }
}

/* AVX-512 VNNI micro-kernel: 12 rows x 32 columns, 24 zmm int32 accumulators. Per group of
 * four k, the panel's 128 bytes [32][4] are two zmm of signed weights, and the row's four
 * activations, shifted to unsigned (q + 128, in [1, 255]), are broadcast to every lane;
 * vpdpbusd adds the four u8 x s8 products of each lane into its int32 accumulator. Exact:
 * |sum| <= 255 * 127 * K < 2^31 (QGEMM_MAX_K). The shift adds 128 * sum_k w[n][k] to column n,
 * which the panel's precomputed compensation takes off again, so acc is the very integer the
 * other paths compute, and the same dequantization gives the same bits. */
#define VNNI_MR 12
#define VNNI_NR 32

/* The dequantization of one 32-column panel (the VNNI and amx kernels'): its masks, scales,
 * compensations and bias, read once per tile, then row by row C = (acc - comp) * (xs * ws) (+ bias)
 * in the order `dequantize` computes it. */
typedef struct {
    __mmask16 m0, m1;
    __m512 ws0, ws1, b0, b1;
    __m512i k0, k1;
    int whole, bias;
} vnni_out;

static inline __attribute__((always_inline)) TARGET_VNNI vnni_out
vnni_out_of(const float *ws, const int32_t *comp, const float *bias, int nr)
{
    vnni_out o;
    o.m0 = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1);
    o.m1 = nr <= 16 ? (__mmask16)0 : nr >= 32 ? (__mmask16)0xFFFF : (__mmask16)((1u << (nr - 16)) - 1);
    o.ws0 = _mm512_loadu_ps(ws);   /* padded to NR */
    o.ws1 = _mm512_loadu_ps(ws + 16);
    o.k0 = _mm512_loadu_si512((const void *)comp);
    o.k1 = _mm512_loadu_si512((const void *)(comp + 16));
    o.b0 = bias ? _mm512_maskz_loadu_ps(o.m0, bias) : _mm512_setzero_ps();
    o.b1 = bias ? _mm512_maskz_loadu_ps(o.m1, bias + 16) : _mm512_setzero_ps();
    o.whole = nr == VNNI_NR;
    o.bias = bias != NULL;
    return o;
}

static inline __attribute__((always_inline)) TARGET_VNNI void
vnni_store_row(const vnni_out *o, __m512i c0, __m512i c1, float xs, float *c)
{
    const __m512 x = _mm512_set1_ps(xs);
    const __m512 s0 = _mm512_mul_ps(x, o->ws0), s1 = _mm512_mul_ps(x, o->ws1);
    const __m512 a0 = _mm512_cvtepi32_ps(_mm512_sub_epi32(c0, o->k0));
    const __m512 a1 = _mm512_cvtepi32_ps(_mm512_sub_epi32(c1, o->k1));
    const __m512 r0 = o->bias ? _mm512_fmadd_ps(a0, s0, o->b0) : _mm512_mul_ps(a0, s0);
    const __m512 r1 = o->bias ? _mm512_fmadd_ps(a1, s1, o->b1) : _mm512_mul_ps(a1, s1);
    if (o->whole) {   /* whole rows: plain stores (masked ones stall on lines not yet in cache) */
        _mm512_storeu_ps(c, r0);
        _mm512_storeu_ps(c + 16, r1);
    } else {
        _mm512_mask_storeu_ps(c, o->m0, r0);
        _mm512_mask_storeu_ps(c + 16, o->m1, r1);
    }
}

static inline __attribute__((always_inline)) TARGET_VNNI void
tile_vnni(long groups, const uint8_t *restrict Xu, long ldu, const float *xs,
          const int8_t *restrict panel, const float *ws, const int32_t *comp, const float *bias,
          float *restrict C, long ldc, int nr, const int mr, const int stream)
{
    __m512i c0[VNNI_MR], c1[VNNI_MR];
#pragma GCC unroll 12
    for (int i = 0; i < VNNI_MR; i++)
        if (i < mr) { c0[i] = _mm512_setzero_si512(); c1[i] = _mm512_setzero_si512(); }
    for (long g = 0; g < groups; g++) {
        const int8_t *w = panel + g * 4 * VNNI_NR;
        if (stream) {
            _mm_prefetch((const char *)((uintptr_t)w + QGEMM_AHEAD), _MM_HINT_T0);
            _mm_prefetch((const char *)((uintptr_t)w + QGEMM_AHEAD + 64), _MM_HINT_T0);
        }
        const __m512i w0 = _mm512_loadu_si512((const void *)w);
        const __m512i w1 = _mm512_loadu_si512((const void *)(w + 64));
#pragma GCC unroll 12
        for (int i = 0; i < VNNI_MR; i++)
            if (i < mr) {
                int32_t quad;   /* x[i][4g .. 4g+3] + 128 as one 32-bit lane */
                memcpy(&quad, Xu + i * ldu + 4 * g, sizeof quad);
                const __m512i x = _mm512_set1_epi32(quad);
                c0[i] = _mm512_dpbusd_epi32(c0[i], x, w0);
                c1[i] = _mm512_dpbusd_epi32(c1[i], x, w1);
            }
    }
    /* Through memory: with the dequantization's six constants live at once, gcc 12 otherwise
     * keeps a stack copy of all 24 accumulators inside the loop above (2.3x slower at 12 rows). */
    int32_t acc[VNNI_MR * VNNI_NR] __attribute__((aligned(64)));
#pragma GCC unroll 12
    for (int i = 0; i < VNNI_MR; i++)
        if (i < mr) {
            _mm512_store_si512((void *)(acc + i * VNNI_NR), c0[i]);
            _mm512_store_si512((void *)(acc + i * VNNI_NR + 16), c1[i]);
        }
    const vnni_out out = vnni_out_of(ws, comp, bias, nr);
    for (int i = 0; i < mr; i++)
        vnni_store_row(&out, _mm512_load_si512((const void *)(acc + i * VNNI_NR)),
                       _mm512_load_si512((const void *)(acc + i * VNNI_NR + 16)), xs[i], C + i * ldc);
}

#define VNNI_TILE(R)                                                                         \
    static TARGET_VNNI void tile_vnni_##R(long groups, const uint8_t *Xu, long ldu,          \
                                          const float *xs, const int8_t *panel,              \
                                          const float *ws, const int32_t *comp,              \
                                          const float *bias, float *C, long ldc, int nr,     \
                                          int stream)                                        \
    {                                                                                        \
        if (stream) tile_vnni(groups, Xu, ldu, xs, panel, ws, comp, bias, C, ldc, nr, R, 1); \
        else tile_vnni(groups, Xu, ldu, xs, panel, ws, comp, bias, C, ldc, nr, R, 0);        \
    }
VNNI_TILE(1) VNNI_TILE(2) VNNI_TILE(3) VNNI_TILE(4) VNNI_TILE(5) VNNI_TILE(6)
VNNI_TILE(7) VNNI_TILE(8) VNNI_TILE(9) VNNI_TILE(10) VNNI_TILE(11) VNNI_TILE(12)

typedef void (*vnni_tile_fn)(long, const uint8_t *, long, const float *, const int8_t *,
                             const float *, const int32_t *, const float *, float *, long, int, int);
static const vnni_tile_fn tiles_vnni[VNNI_MR + 1] = {
    0, tile_vnni_1, tile_vnni_2, tile_vnni_3, tile_vnni_4, tile_vnni_5, tile_vnni_6,
    tile_vnni_7, tile_vnni_8, tile_vnni_9, tile_vnni_10, tile_vnni_11, tile_vnni_12};

/* Xq's rows hold uint8 activations here (to_unsigned): row i at (uint8_t *)(Xq + i * ldq). */
static void kernel_vnni(long m, long K, const int16_t *Xq, long ldq, const float *xs,
                        const int8_t *panel, const float *ws, const int32_t *comp,
                        const float *bias, float *C, long ldc, int nr)
{
    const long groups = ceil_div(K, 4), ldu = ldq * (long)sizeof(int16_t);
    const uint8_t *Xu = (const uint8_t *)Xq;
    for (long i = 0; i < m; i += VNNI_MR) {
        int mr = (int)min_l(VNNI_MR, m - i);
        tiles_vnni[mr](groups, Xu + i * ldu, ldu, xs + i, panel, ws, comp, bias, C + i * ldc, ldc,
                       nr, i == 0);
    }
}

/* Row q of int16 activations (in [-127, 127], zero past K) rewritten in place as uint8 q + 128,
 * through a multiple of 4 past K (the panels' zero padding makes those bytes count for nothing):
 * byte k is written after int16 k (bytes 2k, 2k + 1) was read, and before any later one. */
static void to_unsigned(int16_t *q, long K)
{
    uint8_t *u = (uint8_t *)q;
    const long k4 = ceil_div(K, 4) * 4;
    for (long k = 0; k < k4; k++) {
        int v = k < K ? q[k] : 0;
        u[k] = (uint8_t)(v + 128);
    }
}

#if TF_HAVE_AMX
/* amx: tdpbusd, a 16 x 16 int32 tile += a 16 x 64 u8 tile @ a 64 x 16 s8 tile (quads of k per
 * 32-bit element) per instruction. Tiles of 32 rows x 32 columns (csrc/amx.h: four C tiles, A
 * rows 0-15 and 16-31, B columns 0-15 and 16-31). The panels are the VNNI kernel's ([groups][32]
 * [4]: a B tile is 16 quads x 16 columns of a panel, row stride 128 bytes) and the activation
 * rows its uint8 rows (64-byte multiples, so an A tile reads 64 k of 16 rows). The whole steps
 * of 64 k run on tiles, the quads past them with vpdpbusd, then the VNNI kernel's
 * dequantization: the integer sum is exact, so every bit equals the other paths'. Rows of the
 * A tiles past the block's last row read the zero rows qgemm_packed pads the activations
 * with; their results are dropped. */
#define TARGET_AMX TF_TARGET_AMX
#define AMX_MR 32
/* How far ahead (bytes) the first row tile of a block fetches its panel: a step reads 2 KiB of it
 * (16 quads x 32 columns), and the tile loads leave fetching to the hardware prefetcher. Measured
 * on the 16-core Xeon (family 6 model 207, one thread, 8 rows): a decoding step's 36 products of
 * a base model's six layers (21 MB) took 1.47-1.50 ms 2 KiB ahead against 1.56-1.57 with no
 * fetching, 1.55-1.86 at 1 KiB and 1.81-1.83 at 4 and 8 KiB; base int8 greedy decoding, 14
 * alternated rounds, was faster in 10 (median 1.08x) at one thread, in 8 (1.01x) at two
 * (2026-11-27, results/decode-int8-base-*-xeon-f6m207-16core-2026-11-27.jsonl). */
#define QGEMM_AMX_AHEAD 2048

static TARGET_AMX void tile_amx(long K, const uint8_t *restrict Xu, long ldu, const float *xs,
                                const int8_t *restrict panel, const float *ws, const int32_t *comp,
                                const float *bias, float *restrict C, long ldc, int nr, int mr,
                                int stream)
{
    const long steps = K / 64, groups = ceil_div(K, 4);
    const int two = mr > 16;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (long s = 0; s < steps; s++) {
        const int8_t *w = panel + s * 16 * 4 * VNNI_NR;
        if (stream)   /* the 2 KiB a later step reads, one line at a time */
            for (int line = 0; line < 32; line++)
                _mm_prefetch((const char *)((uintptr_t)w + QGEMM_AMX_AHEAD + 64 * line), _MM_HINT_T0);
        for (long i = 2 * s; i < 2 * s + 2 && i < mr; i++) {   /* C's lines, two rows a step */
            _mm_prefetch((const char *)(C + i * ldc), _MM_HINT_T0);
            _mm_prefetch((const char *)(C + i * ldc + 16), _MM_HINT_T0);
        }
        _tile_loadd(4, Xu + s * 64, ldu);
        _tile_loadd(6, w, 4 * VNNI_NR);
        _tile_loadd(7, w + 64, 4 * VNNI_NR);
        _tile_dpbusd(0, 4, 6);
        _tile_dpbusd(1, 4, 7);
        if (two) {
            _tile_loadd(5, Xu + 16 * ldu + s * 64, ldu);
            _tile_dpbusd(2, 5, 6);
            _tile_dpbusd(3, 5, 7);
        }
    }
    int32_t acc[AMX_MR * VNNI_NR] __attribute__((aligned(64)));
    _tile_stored(0, acc, 4 * VNNI_NR);
    _tile_stored(1, acc + 16, 4 * VNNI_NR);
    if (two) {
        _tile_stored(2, acc + 16 * VNNI_NR, 4 * VNNI_NR);
        _tile_stored(3, acc + 16 * VNNI_NR + 16, 4 * VNNI_NR);
    }
    const vnni_out out = vnni_out_of(ws, comp, bias, nr);
    for (int i = 0; i < mr; i++) {
        __m512i c0 = _mm512_load_si512((const void *)(acc + i * VNNI_NR));
        __m512i c1 = _mm512_load_si512((const void *)(acc + i * VNNI_NR + 16));
        for (long g = steps * 16; g < groups; g++) {   /* the quads past the whole steps */
            const int8_t *w = panel + g * 4 * VNNI_NR;
            int32_t quad;
            memcpy(&quad, Xu + i * ldu + 4 * g, sizeof quad);
            const __m512i x = _mm512_set1_epi32(quad);
            c0 = _mm512_dpbusd_epi32(c0, x, _mm512_loadu_si512((const void *)w));
            c1 = _mm512_dpbusd_epi32(c1, x, _mm512_loadu_si512((const void *)(w + 64)));
        }
        vnni_store_row(&out, c0, c1, xs[i], C + i * ldc);
    }
}

static void kernel_amx(long m, long K, const int16_t *Xq, long ldq, const float *xs,
                       const int8_t *panel, const float *ws, const int32_t *comp,
                       const float *bias, float *C, long ldc, int nr)
{
    const long ldu = ldq * (long)sizeof(int16_t);
    const uint8_t *Xu = (const uint8_t *)Xq;
    for (long i = 0; i < m; i += AMX_MR)
        tile_amx(K, Xu + i * ldu, ldu, xs + i, panel, ws, comp, bias, C + i * ldc, ldc, nr,
                 (int)min_l(AMX_MR, m - i), i == 0);
}
#endif
#endif

static qgemm_kernel kernel_of(int isa)
{
#ifdef QGEMM_X86
#if TF_HAVE_AMX
    if (isa >= TF_ISA_AMX) return kernel_amx;
#endif
    if (isa >= TF_ISA_AVX512_VNNI) return kernel_vnni;
    if (isa >= TF_ISA_AVX2) return kernel_avx2;
#endif
    (void)isa;
    return kernel_generic;
}

const char *qgemm_path_name(int isa)
{
#ifdef QGEMM_X86
#if TF_HAVE_AMX
    if (isa >= TF_ISA_AMX) return "amx (tdpbusd tiles, int32)";
#endif
    if (isa >= TF_ISA_AVX512_VNNI) return "avx512_vnni (vpdpbusd, int32)";
    if (isa >= TF_ISA_AVX2) return "avx2 (vpmaddwd, int32)";
#endif
    (void)isa;
    return "generic (C, int32)";
}

/* ------------------------------------------------------------------------- */
/* The packed buffer (qgemm.h). */

typedef struct {
    char magic[8];         /* "TFQGEMM1" */
    int32_t isa, nr, kg, reserved;
    int64_t N, K;
    char pad[24];
} qgemm_header;

typedef char qgemm_header_is_64_bytes[sizeof(qgemm_header) == 64 ? 1 : -1];

static const char qgemm_magic[8] = {'T', 'F', 'Q', 'G', 'E', 'M', 'M', '1'};

/* Byte offsets of the sections; returns the total size. */
static long sections(int isa, long N, long K, long *scale_at, long *comp_at, long *panels_at)
{
    qgemm_layout L = layout_of(isa);
    long np = ceil_div(N, L.nr) * L.nr;
    *scale_at = round64(sizeof(qgemm_header));
    *comp_at = *scale_at + round64(np * (long)sizeof(float));
    *panels_at = *comp_at + round64(np * (long)sizeof(int32_t));
    return *panels_at + round64(np * ceil_div(K, L.kg) * L.kg);
}

long qgemm_packed_bytes(int isa, long N, long K)
{
    long s, c, p;
    return sections(isa, N, K, &s, &c, &p);
}

void qgemm_pack(int isa, long N, long K, const int8_t *Q, const float *scale, void *packed)
{
    const qgemm_layout L = layout_of(isa);
    long scale_at, comp_at, panels_at;
    const long bytes = sections(isa, N, K, &scale_at, &comp_at, &panels_at);
    const long np = ceil_div(N, L.nr), groups = ceil_div(K, L.kg);
    char *base = packed;
    qgemm_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, qgemm_magic, sizeof h.magic);
    h.isa = isa; h.nr = L.nr; h.kg = L.kg; h.N = N; h.K = K;
    memcpy(base, &h, sizeof h);
    memset(base + sizeof h, 0, (size_t)(bytes - (long)sizeof h));   /* padding included */
    float *ws = (float *)(base + scale_at);
    int32_t *comp = (int32_t *)(base + comp_at);
    int8_t *panels = (int8_t *)(base + panels_at);
#pragma omp parallel for num_threads(tf_team(N * K, QGEMM_GRAIN / 4)) schedule(static)
    for (long p = 0; p < np; p++) {
        int8_t *dst = panels + p * groups * L.nr * L.kg;
        for (int j = 0; j < L.nr && p * L.nr + j < N; j++) {
            const long n = p * L.nr + j;
            const int8_t *q = Q + n * K;
            int32_t sum = 0;
            for (long k = 0; k < K; k++) {
                dst[((k / L.kg) * L.nr + j) * L.kg + k % L.kg] = q[k];
                sum += q[k];
            }
            ws[n] = scale[n];
            comp[n] = 128 * sum;
        }
    }
}

int qgemm_packed_info(const void *packed, long bytes, int *isa, long *N, long *K)
{
    qgemm_header h;
    if (bytes < (long)sizeof h) return -1;
    memcpy(&h, packed, sizeof h);
    if (memcmp(h.magic, qgemm_magic, sizeof h.magic) != 0) return -1;
    if (h.isa < TF_ISA_GENERIC || h.isa >= TF_ISA_LEVELS || h.N < 0 || h.K < 0 || h.K > QGEMM_MAX_K
        || h.N > (1L << 40)) return -1;
    qgemm_layout L = layout_of(h.isa);
    if (h.nr != L.nr || h.kg != L.kg || qgemm_packed_bytes(h.isa, h.N, h.K) != bytes) return -1;
    *isa = h.isa; *N = (long)h.N; *K = (long)h.K;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* The product. */

static int forced_all_threads = 0, forced_slow = 0;

void qgemm_test_force(int all_threads, int slow)
{
    forced_all_threads = all_threads != 0;
    forced_slow = slow != 0;
}

/* The naive form (no buffer needed): each row quantized on the fly, one element at a time,
 * read straight from the packed panels. The same bits as the kernels. */
static void qgemm_slow(int isa, long M, long N, long K, const float *X, long ldx, const void *packed,
                       const float *bias, float *C, long ldc)
{
    const qgemm_layout L = layout_of(isa);
    long scale_at, comp_at, panels_at;
    sections(isa, N, K, &scale_at, &comp_at, &panels_at);
    const float *ws = (const float *)((const char *)packed + scale_at);
    const int8_t *panels = (const int8_t *)packed + panels_at;
    const long groups = ceil_div(K, L.kg);
    for (long i = 0; i < M; i++) {
        const float *x = X + i * ldx;
        float inv, xs = row_scale_c(K, x, &inv);
        for (long n = 0; n < N; n++) {
            const int8_t *panel = panels + (n / L.nr) * groups * L.nr * L.kg;
            const long j = n % L.nr;
            int32_t acc = 0;
            for (long k = 0; k < K && inv != 0.0f; k++)
                acc += quantize_one(x[k], inv) * panel[((k / L.kg) * L.nr + j) * L.kg + k % L.kg];
            C[i * ldc + n] = dequantize(acc, xs, ws[n], bias ? bias + n : NULL);
        }
    }
}

void qgemm_packed(int isa, long M, long N, long K, const float *X, long ldx, const void *packed,
                  const float *bias, float *C, long ldc)
{
    if (M <= 0 || N <= 0) return;
    const qgemm_layout L = layout_of(isa);
    const long ldq = ceil_div(K, 32) * 32;   /* int16 per row: 64-byte rows, zeros past K */
    const int amx = isa >= TF_ISA_AMX;
    /* amx's A tiles read 16 rows at a time: zero rows up to a multiple of 16 */
    const long rows = amx ? ceil_div(M, 16) * 16 : M;
    int16_t *Xq = forced_slow ? NULL
                : aligned_alloc(64, (size_t)round64(rows * ldq * (long)sizeof(int16_t) + M * (long)sizeof(float)));
    if (!Xq) {   /* out of memory: the slow path still gives the same answer */
        qgemm_slow(isa, M, N, K, X, ldx, packed, bias, C, ldc);
        return;
    }
    float *xs = (float *)(Xq + rows * ldq);
    if (rows > M) memset(Xq + M * ldq, 0, (size_t)((rows - M) * ldq) * sizeof(int16_t));
#ifdef QGEMM_X86
    const int avx2 = isa >= TF_ISA_AVX2, vnni = isa >= TF_ISA_AVX512_VNNI;
#endif
#pragma omp parallel for num_threads(tf_team(M * K, QGEMM_GRAIN / 4)) schedule(static)
    for (long i = 0; i < M; i++) {
        int16_t *q = Xq + i * ldq;
        memset(q + K, 0, (size_t)(ldq - K) * sizeof(int16_t));
#ifdef QGEMM_X86
        if (avx2) {
            xs[i] = quantize_row_avx2(K, X + i * ldx, q);
            if (vnni) to_unsigned(q, K);
            continue;
        }
#endif
        xs[i] = quantize_row_c(K, X + i * ldx, NULL, q);
    }

    long scale_at, comp_at, panels_at;
    sections(isa, N, K, &scale_at, &comp_at, &panels_at);
    const float *ws = (const float *)((const char *)packed + scale_at);
    const int32_t *comp = (const int32_t *)((const char *)packed + comp_at);
    const int8_t *panels = (const int8_t *)packed + panels_at;
    const long np = ceil_div(N, L.nr), panel_bytes = ceil_div(K, L.kg) * L.kg * L.nr;
    const long blocks = ceil_div(M, QGEMM_MB);
    const qgemm_kernel kernel = kernel_of(isa);
    const int nt = forced_all_threads ? tf_get_num_threads() : tf_team(M * N * K, QGEMM_GRAIN);
    long next = 0;   /* the next unit (block of rows, group of panels) nobody has taken */
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int team = 1;
#ifdef _OPENMP
        team = omp_get_num_threads();
#endif
        const long per = team == 1 ? np : ceil_div(np, 8L * team), groups = ceil_div(np, per);
        long u;
#if TF_HAVE_AMX
        if (amx) tf_amx_begin();
#endif
        while ((u = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED)) < blocks * groups) {
            const long i0 = u / groups * QGEMM_MB, m = min_l(QGEMM_MB, M - i0), g = u % groups;
            for (long p = g * per; p < min_l(np, (g + 1) * per); p++) {
                const long j = p * L.nr;
                kernel(m, K, Xq + i0 * ldq, ldq, xs + i0, panels + p * panel_bytes, ws + j, comp + j,
                       bias ? bias + j : NULL, C + i0 * ldc + j, ldc, (int)min_l(L.nr, N - j));
            }
        }
#if TF_HAVE_AMX
        if (amx) tf_amx_end();
#endif
    }
    free(Xq);
}
