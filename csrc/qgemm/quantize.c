/* Quantization of one row (qgemm.h): the rule, then the plain C and AVX2 forms of it. */
#include "qgemm_isa.h"

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

/* The scale of row v[0, K) and its inv (row_rule), scanning the row one element at a time. */
float qgemm_row_scale_c(long K, const float *v, float *inv)
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
float qgemm_quantize_row_c(long K, const float *v, int8_t *q8, int16_t *q16)
{
    float inv, scale = qgemm_row_scale_c(K, v, &inv);
    for (long k = 0; k < K; k++) {
        int q = inv != 0.0f ? quantize_one(v[k], inv) : 0;
        if (q8) q8[k] = (int8_t)q;
        else q16[k] = (int16_t)q;
    }
    return scale;
}

#ifdef QGEMM_X86
TARGET_AVX2 float qgemm_quantize_row_avx2(long K, const float *v, int16_t *q)
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
        scale[n] = qgemm_quantize_row_c(K, W + n * ldw, Q + n * K, NULL);
}

/* Row q of int16 activations (in [-127, 127], zero past K) rewritten in place as uint8 q + 128,
 * through a multiple of 4 past K (the panels' zero padding makes those bytes count for nothing):
 * byte k is written after int16 k (bytes 2k, 2k + 1) was read, and before any later one. */
void qgemm_to_unsigned(int16_t *q, long K)
{
    uint8_t *u = (uint8_t *)q;
    const long k4 = ceil_div(K, 4) * 4;
    for (long k = 0; k < k4; k++) {
        int v = k < K ? q[k] : 0;
        u[k] = (uint8_t)(v + 128);
    }
}

#ifdef QGEMM_NEON_DOTPROD
/* Row q of int16 activations (in [-127, 127], zero past K) rewritten in place as int8 q, through a
 * multiple of 4 past K, as qgemm_to_unsigned (byte k is written after int16 k was read). */
void qgemm_to_signed(int16_t *q, long K)
{
    int8_t *s = (int8_t *)q;
    const long k4 = ceil_div(K, 4) * 4;
    for (long k = 0; k < k4; k++)
        s[k] = (int8_t)(k < K ? q[k] : 0);
}
#endif
