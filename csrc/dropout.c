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

/* 16 draws for counters c .. c+15 as 32-bit lanes (lane j = u24(counter c + j)): the even
 * counters live in `even` (c, c+2, ...), the odd ones in `odd`, so that after the shift by 40
 * one 64-bit lane holds draw 2m in its low half and draw 2m+1 in its high half. */
AVX512_TARGET static inline __m512i draws16_avx512(__m512i even, __m512i odd)
{
    __m512i lo = _mm512_srli_epi64(mix64_avx512(even), 40);
    __m512i hi = _mm512_slli_epi64(_mm512_srli_epi64(mix64_avx512(odd), 40), 32);
    return _mm512_or_si512(lo, hi);
}

AVX512_TARGET static void dropout_range_avx512(const float *x, const float *bias,
                                               const float *residual, float *out, size_t i0,
                                               size_t i1, uint32_t thr, float scale, uint64_t key,
                                               uint64_t offset)
{
    const uint64_t g = TF_RNG_GAMMA;
    uint64_t base = key + (offset + i0) * g;   /* state of counter offset + i0 */
    __m512i even = _mm512_set_epi64((long long)(base + 14 * g), (long long)(base + 12 * g),
                                    (long long)(base + 10 * g), (long long)(base + 8 * g),
                                    (long long)(base + 6 * g), (long long)(base + 4 * g),
                                    (long long)(base + 2 * g), (long long)base);
    __m512i odd = _mm512_add_epi64(even, _mm512_set1_epi64((long long)g));
    const __m512i step = _mm512_set1_epi64((long long)(16 * g));
    const __m512i vthr = _mm512_set1_epi32((int)thr);
    const __m512 vscale = _mm512_set1_ps(scale);
    size_t i = i0;
    for (; i + 16 <= i1; i += 16) {
        __mmask16 keep = _mm512_cmpge_epu32_mask(draws16_avx512(even, odd), vthr);
        __m512 v = _mm512_loadu_ps(x + i);
        if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + (i - i0)));
        v = _mm512_mul_ps(v, _mm512_maskz_mov_ps(keep, vscale));
        if (residual) {
            ROUNDED(v);
            v = _mm512_add_ps(_mm512_loadu_ps(residual + i), v);
        }
        _mm512_storeu_ps(out + i, v);
        even = _mm512_add_epi64(even, step);
        odd = _mm512_add_epi64(odd, step);
    }
    if (i < i1) {
        __mmask16 tail = (__mmask16)((1u << (i1 - i)) - 1);
        __mmask16 keep = _mm512_cmpge_epu32_mask(draws16_avx512(even, odd), vthr);
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

/* 8 draws as 32-bit lanes, even counters in `even`, odd ones in `odd` (see the AVX-512 one). */
AVX2_TARGET static inline __m256i draws8_avx2(__m256i even, __m256i odd)
{
    __m256i lo = _mm256_srli_epi64(mix64_avx2(even), 40);
    __m256i hi = _mm256_slli_epi64(_mm256_srli_epi64(mix64_avx2(odd), 40), 32);
    return _mm256_or_si256(lo, hi);
}

AVX2_TARGET static void dropout_range_avx2(const float *x, const float *bias,
                                           const float *residual, float *out, size_t i0, size_t i1,
                                           uint32_t thr, float scale, uint64_t key, uint64_t offset)
{
    const uint64_t g = TF_RNG_GAMMA;
    uint64_t base = key + (offset + i0) * g;
    __m256i even = _mm256_set_epi64x((long long)(base + 6 * g), (long long)(base + 4 * g),
                                     (long long)(base + 2 * g), (long long)base);
    __m256i odd = _mm256_add_epi64(even, _mm256_set1_epi64x((long long)g));
    const __m256i step = _mm256_set1_epi64x((long long)(8 * g));
    /* draws are < 2^24, so a signed compare with thr - 1 (>= -1) is exact */
    const __m256i vthr1 = _mm256_set1_epi32((int)thr - 1);
    const __m256 vscale = _mm256_set1_ps(scale);
    size_t i = i0;
    for (; i + 8 <= i1; i += 8) {
        __m256i keep = _mm256_cmpgt_epi32(draws8_avx2(even, odd), vthr1);
        __m256 v = _mm256_loadu_ps(x + i);
        if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + (i - i0)));
        v = _mm256_mul_ps(v, _mm256_and_ps(_mm256_castsi256_ps(keep), vscale));
        if (residual) {
            ROUNDED(v);
            v = _mm256_add_ps(_mm256_loadu_ps(residual + i), v);
        }
        _mm256_storeu_ps(out + i, v);
        even = _mm256_add_epi64(even, step);
        odd = _mm256_add_epi64(odd, step);
    }
    if (i < i1) {
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(i1 - i)), lane);
        __m256i keep = _mm256_cmpgt_epi32(draws8_avx2(even, odd), vthr1);
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
