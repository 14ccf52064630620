/* Single-query attention over a key/value cache (see attention.h). */
#include "attention.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "cpu.h"
#include "simd_math.h"

#if TF_HAVE_X86
TF_TARGET_AVX512
static float dot_avx512(const float *a, const float *b, long n)
{
    __m512 acc = _mm512_setzero_ps();
    long i = 0;
    for (; i + 16 <= n; i += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    if (i < n)
        acc = _mm512_fmadd_ps(tf_load16(a + i, n - i), tf_load16(b + i, n - i), acc);
    return _mm512_reduce_add_ps(acc);
}

TF_TARGET_AVX512
static void axpy_avx512(float *y, float alpha, const float *x, long n)
{
    __m512 va = _mm512_set1_ps(alpha);
    long i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n)
        tf_store16(y + i, n - i, _mm512_fmadd_ps(va, tf_load16(x + i, n - i), tf_load16(y + i, n - i)));
}

TF_TARGET_AVX2
static float dot_avx2(const float *a, const float *b, long n)
{
    __m256 acc = _mm256_setzero_ps();
    long i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    float total = _mm_cvtss_f32(s);
    for (; i < n; i++) total += a[i] * b[i];
    return total;
}

TF_TARGET_AVX2
static void axpy_avx2(float *y, float alpha, const float *x, long n)
{
    __m256 va = _mm256_set1_ps(alpha);
    long i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += alpha * x[i];
}
#endif

static float dot_generic(const float *a, const float *b, long n)
{
    float total = 0.0f;
    for (long i = 0; i < n; i++) total += a[i] * b[i];
    return total;
}

static void axpy_generic(float *y, float alpha, const float *x, long n)
{
    for (long i = 0; i < n; i++) y[i] += alpha * x[i];
}

void attention_decode_forward(const float *q, long ldq, const float *k, const float *v,
                              const uint8_t *key_mask, float *out, long ldo, float *probs,
                              long N, long H, long Tmax, long n_keys, long dh, float scale)
{
    float (*dot)(const float *, const float *, long) = dot_generic;
    void (*axpy)(float *, float, const float *, long) = axpy_generic;
#if TF_HAVE_X86
    int isa = tf_isa();
    if (isa >= TF_ISA_AVX512) { dot = dot_avx512; axpy = axpy_avx512; }
    else if (isa >= TF_ISA_AVX2) { dot = dot_avx2; axpy = axpy_avx2; }
#endif
    long pairs = N * H;
    int threads = tf_team(pairs * n_keys * dh, 1L << 15);
#pragma omp parallel num_threads(threads)
    {
        float *scores = malloc((size_t)(n_keys > 0 ? n_keys : 1) * sizeof(float));
#pragma omp for schedule(static)
        for (long p = 0; p < pairs; p++) {
            long n = p / H, h = p % H;
            const float *qp = q + n * ldq + h * dh;
            const float *kp = k + p * Tmax * dh;
            const float *vp = v + p * Tmax * dh;
            const uint8_t *mask = key_mask ? key_mask + n * Tmax : NULL;
            float *op = out + n * ldo + h * dh;
            float max = -INFINITY;
            for (long j = 0; j < n_keys; j++) {
                if (mask && mask[j]) { scores[j] = -INFINITY; continue; }
                scores[j] = scale * dot(qp, kp + j * dh, dh);
                if (scores[j] > max) max = scores[j];
            }
            for (long d = 0; d < dh; d++) op[d] = 0.0f;
            float *pp = probs ? probs + p * n_keys : NULL;
            if (max == -INFINITY) {  /* every key masked (or none): zeros, never NaN */
                if (pp) for (long j = 0; j < n_keys; j++) pp[j] = 0.0f;
                continue;
            }
            float sum = 0.0f;
            for (long j = 0; j < n_keys; j++) {
                float e = scores[j] == -INFINITY ? 0.0f : expf(scores[j] - max);
                scores[j] = e;
                sum += e;
            }
            float inv = 1.0f / sum;
            for (long j = 0; j < n_keys; j++) {
                float w = scores[j] * inv;
                if (pp) pp[j] = w;
                if (w != 0.0f) axpy(op, w, vp + j * dh, dh);
            }
        }
        free(scores);
    }
}
