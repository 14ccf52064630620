/* Dropout with a counter-based RNG (see dropout.h and rng.h). */
#include "dropout.h"

#include <math.h>
#include <string.h>

#include "cpu.h"
#include "rng.h"

#include "simd.h"
#if TF_HAVE_X86
#define TF_X86 1
#endif

/* Elements per thread below which a call stays on fewer threads: hashing is ~1 ns/element. */
#define DROPOUT_GRAIN 16384

uint32_t dropout_threshold(float p)
{
    /* uniform = u24 * 2^-24 >= p  <=>  u24 >= p * 2^24 (exact in double)  <=>  u24 >= ceil(.) */
    return (uint32_t)ceil((double)p * 16777216.0);
}

float dropout_scale(float p) { return (float)(1.0 / (1.0 - (double)p)); }

/* ---- one contiguous range [i0, i1) of elements, per instruction set ---------------------- */

/* Keep a product rounded on its own (no FMA contraction): residual + dropout(x) gives the same
 * bits as the two unfused ops. */
#define ROUNDED(v) TF_ROUNDED(v)

/* out[i] = (x[i] (+ bias[i - i0])) * keep[i] * scale (+ residual[i]) for i in [i0, i1); bias and
 * residual may be NULL (a bias range is one row: i0 is a row start) */
static void dropout_range_generic(const float *x, const float *bias, const float *residual,
                                  float *out, size_t i0, size_t i1, uint32_t thr, float scale,
                                  uint64_t key, uint64_t offset)
{
    for (size_t i = i0; i < i1; i++) {
        float keep = tf_rng_u24(key, offset + i) >= thr ? scale : 0.0f;
        float v = (bias ? x[i] + bias[i - i0] : x[i]) * keep;   /* x * 0 keeps signed zeros, NaN */
        out[i] = residual ? residual[i] + v : v;
    }
}

#ifdef TF_X86
#define AVX512_TARGET TF_TARGET_AVX512
#define AVX2_TARGET TF_TARGET_AVX2

AVX512_TARGET static inline __m512i mix64_avx512(__m512i z)
{
    z = _mm512_xor_si512(z, _mm512_srli_epi64(z, 30));
    z = _mm512_mullo_epi64(z, _mm512_set1_epi64((long long)TF_RNG_MIX1));
    z = _mm512_xor_si512(z, _mm512_srli_epi64(z, 27));
    z = _mm512_mullo_epi64(z, _mm512_set1_epi64((long long)TF_RNG_MIX2));
    return _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
}

/* The 32-bit lanes of draws u (64-bit lanes): lane 2m the counter 2d's 24 bits of its draw d
 * (bits 40-63), lane 2m + 1 the counter 2d + 1's (bits 8-31): rng.h's u24 for two counters. */
#define TF_PAIR_BITS 0x00FFFFFF00000000ll
AVX512_TARGET static inline __m512i draws16_avx512(__m512i state)
{
    const __m512i u = mix64_avx512(state);
    return _mm512_or_si512(_mm512_srli_epi64(u, 40),
                           _mm512_and_si512(_mm512_slli_epi64(u, 24), _mm512_set1_epi64(TF_PAIR_BITS)));
}

/* A range that starts at an odd counter takes its first element alone (the generic code, the
 * same bits), so that each vector of the rest holds whole draws. *i0 and *bias move past it;
 * returns 1 when nothing is left. */
static inline int odd_start(const float *x, const float **bias, const float *residual, float *out,
                            size_t *i0, size_t i1, uint32_t thr, float scale, uint64_t key, uint64_t offset)
{
    if (!((offset + *i0) & 1)) return 0;
    dropout_range_generic(x, *bias, residual, out, *i0, *i0 + 1, thr, scale, key, offset);
    if (*bias) *bias += 1;   /* a bias range is one row: its index is relative to i0 */
    *i0 += 1;
    return *i0 >= i1;
}

AVX512_TARGET static void dropout_range_avx512(const float *x, const float *bias,
                                               const float *residual, float *out, size_t i0,
                                               size_t i1, uint32_t thr, float scale, uint64_t key,
                                               uint64_t offset)
{
    if (odd_start(x, &bias, residual, out, &i0, i1, thr, scale, key, offset)) return;
    const uint64_t g = TF_RNG_GAMMA;
    const uint64_t base = key + ((offset + i0) >> 1) * g;   /* state of draw (offset + i0) / 2 */
    __m512i state = _mm512_add_epi64(_mm512_set1_epi64((long long)base),
                                     _mm512_mullo_epi64(_mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0),
                                                        _mm512_set1_epi64((long long)g)));
    const __m512i step = _mm512_set1_epi64((long long)(8 * g));
    const __m512i vthr = _mm512_set1_epi32((int)thr);
    const __m512 vscale = _mm512_set1_ps(scale);
    size_t i = i0;
    for (; i + 16 <= i1; i += 16) {
        __mmask16 keep = _mm512_cmpge_epu32_mask(draws16_avx512(state), vthr);
        __m512 v = _mm512_loadu_ps(x + i);
        if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + (i - i0)));
        v = _mm512_mul_ps(v, _mm512_maskz_mov_ps(keep, vscale));
        if (residual) {
            ROUNDED(v);
            v = _mm512_add_ps(_mm512_loadu_ps(residual + i), v);
        }
        _mm512_storeu_ps(out + i, v);
        state = _mm512_add_epi64(state, step);
    }
    if (i < i1) {
        __mmask16 tail = (__mmask16)((1u << (i1 - i)) - 1);
        __mmask16 keep = _mm512_cmpge_epu32_mask(draws16_avx512(state), vthr);
        __m512 v = _mm512_maskz_loadu_ps(tail, x + i);
        if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(tail, bias + (i - i0)));
        v = _mm512_mul_ps(v, _mm512_maskz_mov_ps(keep, vscale));
        if (residual) {
            ROUNDED(v);
            v = _mm512_add_ps(_mm512_maskz_loadu_ps(tail, residual + i), v);
        }
        _mm512_mask_storeu_ps(out + i, tail, v);
    }
}

/* a * c mod 2^64 for 4 lanes: AVX2 has no 64-bit multiply, so three 32x32->64 products. */
AVX2_TARGET static inline __m256i mul64c_avx2(__m256i a, uint64_t c)
{
    const __m256i clo = _mm256_set1_epi64x((long long)(c & 0xffffffffu));
    const __m256i chi = _mm256_set1_epi64x((long long)(c >> 32));
    __m256i lo = _mm256_mul_epu32(a, clo);
    __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), clo),
                                     _mm256_mul_epu32(a, chi));
    return _mm256_add_epi64(lo, _mm256_slli_epi64(cross, 32));
}

AVX2_TARGET static inline __m256i mix64_avx2(__m256i z)
{
    z = _mm256_xor_si256(z, _mm256_srli_epi64(z, 30));
    z = mul64c_avx2(z, TF_RNG_MIX1);
    z = _mm256_xor_si256(z, _mm256_srli_epi64(z, 27));
    z = mul64c_avx2(z, TF_RNG_MIX2);
    return _mm256_xor_si256(z, _mm256_srli_epi64(z, 31));
}

/* 8 counters' 24 bits from 4 draws (see the AVX-512 one). */
AVX2_TARGET static inline __m256i draws8_avx2(__m256i state)
{
    const __m256i u = mix64_avx2(state);
    return _mm256_or_si256(_mm256_srli_epi64(u, 40),
                           _mm256_and_si256(_mm256_slli_epi64(u, 24), _mm256_set1_epi64x(TF_PAIR_BITS)));
}

AVX2_TARGET static void dropout_range_avx2(const float *x, const float *bias,
                                           const float *residual, float *out, size_t i0, size_t i1,
                                           uint32_t thr, float scale, uint64_t key, uint64_t offset)
{
    if (odd_start(x, &bias, residual, out, &i0, i1, thr, scale, key, offset)) return;
    const uint64_t g = TF_RNG_GAMMA;
    const uint64_t base = key + ((offset + i0) >> 1) * g;
    __m256i state = _mm256_set_epi64x((long long)(base + 3 * g), (long long)(base + 2 * g),
                                      (long long)(base + g), (long long)base);
    const __m256i step = _mm256_set1_epi64x((long long)(4 * g));
    /* draws are < 2^24, so a signed compare with thr - 1 (>= -1) is exact */
    const __m256i vthr1 = _mm256_set1_epi32((int)thr - 1);
    const __m256 vscale = _mm256_set1_ps(scale);
    size_t i = i0;
    for (; i + 8 <= i1; i += 8) {
        __m256i keep = _mm256_cmpgt_epi32(draws8_avx2(state), vthr1);
        __m256 v = _mm256_loadu_ps(x + i);
        if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + (i - i0)));
        v = _mm256_mul_ps(v, _mm256_and_ps(_mm256_castsi256_ps(keep), vscale));
        if (residual) {
            ROUNDED(v);
            v = _mm256_add_ps(_mm256_loadu_ps(residual + i), v);
        }
        _mm256_storeu_ps(out + i, v);
        state = _mm256_add_epi64(state, step);
    }
    if (i < i1) {
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(i1 - i)), lane);
        __m256i keep = _mm256_cmpgt_epi32(draws8_avx2(state), vthr1);
        __m256 v = _mm256_maskload_ps(x + i, tail);
        if (bias) v = _mm256_add_ps(v, _mm256_maskload_ps(bias + (i - i0), tail));
        v = _mm256_mul_ps(v, _mm256_and_ps(_mm256_castsi256_ps(keep), vscale));
        if (residual) {
            ROUNDED(v);
            v = _mm256_add_ps(_mm256_maskload_ps(residual + i, tail), v);
        }
        _mm256_maskstore_ps(out + i, tail, v);
    }
}
#endif

typedef void (*dropout_range_fn)(const float *, const float *, const float *, float *, size_t,
                                 size_t, uint32_t, float, uint64_t, uint64_t);

static dropout_range_fn dropout_pick(void)
{
#ifdef TF_X86
    int isa = tf_isa();
    if (isa >= TF_ISA_AVX512) return dropout_range_avx512;
    if (isa >= TF_ISA_AVX2) return dropout_range_avx2;
#endif
    return dropout_range_generic;
}

/* The range at p = 0 (thr 0: every draw keeps, scale 1): x * 1 is x, so the same bits without the
 * draws. Decoding's residual adds and training at dropout 0 (short budgets' default) take it. */
static void keep_all_range(const float *x, const float *bias, const float *residual, float *out,
                           size_t i0, size_t i1, uint32_t thr, float scale, uint64_t key, uint64_t offset)
{
    (void)thr, (void)scale, (void)key, (void)offset;
    if (bias && residual)
        for (size_t i = i0; i < i1; i++) out[i] = residual[i] + (x[i] + bias[i - i0]);
    else if (bias)
        for (size_t i = i0; i < i1; i++) out[i] = x[i] + bias[i - i0];
    else if (residual)
        for (size_t i = i0; i < i1; i++) out[i] = residual[i] + x[i];
    else if (out != x)
        memmove(out + i0, x + i0, (i1 - i0) * sizeof(float));
}

/* out = (x (+ bias)) * keep * scale (+ residual) over n = N * D elements, one pass. Without a bias
 * each thread takes one contiguous range cut at multiples of 16 elements (one 64-byte line); with
 * one, whole rows (the bias restarts at each row). */
static void dropout_apply(const float *x, const float *bias, const float *residual, float *out,
                          size_t N, size_t D, float p, uint64_t seed, uint64_t offset)
{
    const size_t n = N * D;
    const uint32_t thr = dropout_threshold(p);
    const float scale = dropout_scale(p);
    const uint64_t key = tf_rng_key(seed);
    dropout_range_fn fn = thr == 0 ? keep_all_range : dropout_pick();
    int team = tf_team((long)n, DROPOUT_GRAIN);
    if (bias) {
        if (team > (long)N) team = (int)N;
        #pragma omp parallel for schedule(static) num_threads(team)
        for (int t = 0; t < team; t++) {
            size_t r0 = N * (size_t)t / (size_t)team, r1 = N * (size_t)(t + 1) / (size_t)team;
            for (size_t r = r0; r < r1; r++)
                fn(x, bias, residual, out, r * D, (r + 1) * D, thr, scale, key, offset);
        }
        return;
    }
    #pragma omp parallel for schedule(static) num_threads(team)
    for (int t = 0; t < team; t++) {
        size_t i0 = (n * (size_t)t / (size_t)team) & ~(size_t)15;
        size_t i1 = t == team - 1 ? n : (n * (size_t)(t + 1) / (size_t)team) & ~(size_t)15;
        if (i0 < i1) fn(x, NULL, residual, out, i0, i1, thr, scale, key, offset);
    }
}

void dropout_forward(const float *x, float *out, size_t n, float p, uint64_t seed, uint64_t offset)
{
    if (n == 0) return;
    if (p == 0.0f) {   /* identity, as PyTorch */
        if (out != x) memcpy(out, x, n * sizeof(float));
        return;
    }
    dropout_apply(x, NULL, NULL, out, 1, n, p, seed, offset);
}

void dropout_add_forward(const float *x, const float *residual, float *out, size_t n, float p,
                         uint64_t seed, uint64_t offset)
{
    if (n == 0) return;
    /* p == 0 keeps everything with scale 1: residual + x * 1, the plain sum */
    dropout_apply(x, NULL, residual, out, 1, n, p, seed, offset);
}

void bias_dropout_add_forward(const float *x, const float *bias, const float *residual, float *out,
                              size_t N, size_t D, float p, uint64_t seed, uint64_t offset)
{
    if (N == 0 || D == 0) return;
    dropout_apply(x, bias, residual, out, N, D, p, seed, offset);
}

void dropout_backward(const float *dout, float *dx, size_t n, float p, uint64_t seed, uint64_t offset)
{
    /* d(x * keep * s)/dx = keep * s: the same map applied to the gradient, same mask */
    dropout_forward(dout, dx, n, p, seed, offset);
}

void dropout_forward_span(const float *x, float *out, size_t n, float p, uint64_t seed,
                          uint64_t counter0)
{
    if (n == 0) return;
    if (p == 0.0f) {
        if (out != x) memmove(out, x, n * sizeof(float));
        return;
    }
    const uint32_t thr = dropout_threshold(p);
    dropout_range_fn fn = thr == 0 ? keep_all_range : dropout_pick();
    fn(x, NULL, NULL, out, 0, n, thr, dropout_scale(p), tf_rng_key(seed), counter0);
}

void bias_dropout_add_rows(const float *x, const float *bias, const float *residual, float *out,
                           size_t r0, size_t r1, size_t D, float p, uint64_t seed, uint64_t offset)
{
    if (r0 >= r1 || D == 0) return;
    const uint32_t thr = dropout_threshold(p);
    const float scale = dropout_scale(p);
    const uint64_t key = tf_rng_key(seed);
    dropout_range_fn fn = thr == 0 ? keep_all_range : dropout_pick();
    if (!bias) {
        fn(x, NULL, residual, out, r0 * D, r1 * D, thr, scale, key, offset);
        return;
    }
    for (size_t r = r0; r < r1; r++)
        fn(x, bias, residual, out, r * D, (r + 1) * D, thr, scale, key, offset);
}

void dropout_mask(uint8_t *mask, size_t n, float p, uint64_t seed, uint64_t offset)
{
    const uint32_t thr = dropout_threshold(p);
    const uint64_t key = tf_rng_key(seed);
    for (size_t i = 0; i < n; i++) mask[i] = tf_rng_u24(key, offset + i) >= thr;
}

void dropout_forward_reference(const float *x, float *out, size_t n, float p, uint64_t seed,
                               uint64_t offset)
{
    if (p == 0.0f) {
        for (size_t i = 0; i < n; i++) out[i] = x[i];
        return;
    }
    const float scale = dropout_scale(p);
    const uint64_t key = tf_rng_key(seed);
    for (size_t i = 0; i < n; i++)
        out[i] = tf_rng_uniform(key, offset + i) >= p ? x[i] * scale : x[i] * 0.0f;
}
