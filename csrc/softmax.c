/* Masked softmax, forward and backward (see softmax.h).
 *
 * Per row: (1) max of scale*s over visible keys, (2) e = exp(scale*s - max) written
 * to probs (masked keys written as exact 0) while summing, (3) probs *= 1/sum.
 * The row (Tk floats) stays in L1 between the sweeps, so memory sees one read of
 * scores and one write of probs. This is the arithmetic of torch.softmax after
 * masked_fill(-inf) (max, exp(x - max), multiply by 1/sum), except that a fully
 * masked row gives zeros where PyTorch gives NaN.
 */
#include "softmax.h"

#include <math.h>
#include <string.h>

#include "cpu.h"
#include "simd_math.h"

/* Elements per thread below which fewer threads are started (a row pass over 16K
 * floats takes a few microseconds, about what waking a thread costs). */
#define SOFTMAX_GRAIN 16384L

/* ------------------------------------------------------------------------- */
/* Plain C: the reference (two passes over the scores, a double-precision sum). */

/* One row. p [Tk] out, s [Tk], pad [Tk] or NULL; keys >= n are hidden (causal). */
static void softmax_row_generic(float *p, const float *s, const uint8_t *pad, long n, long Tk,
                                float scale)
{
    float mx = -INFINITY;
    for (long k = 0; k < n; k++) {
        if (pad && pad[k]) continue;
        float v = scale * s[k];
        if (v > mx || v != v) mx = v;   /* a NaN score makes the row NaN, as in PyTorch */
    }
    if (mx == -INFINITY) {              /* every key masked: zeros, not NaN */
        memset(p, 0, (size_t)Tk * sizeof(float));
        return;
    }
    double sum = 0.0;
    for (long k = 0; k < n; k++) {
        float e = (pad && pad[k]) ? 0.0f : expf(scale * s[k] - mx);
        p[k] = e;
        sum += e;
    }
    for (long k = n; k < Tk; k++) p[k] = 0.0f;
    float inv = 1.0f / (float)sum;
    for (long k = 0; k < n; k++) p[k] *= inv;
}

/* One row of the backward. ds, p, dp [Tk]. */
static void softmax_backward_row_generic(float *ds, const float *p, const float *dp, long Tk,
                                         float scale)
{
    double dot = 0.0;
    for (long k = 0; k < Tk; k++) dot += (double)p[k] * (double)dp[k];
    float d = (float)dot;
    for (long k = 0; k < Tk; k++) ds[k] = (p[k] * (dp[k] - d)) * scale;
}

#if TF_HAVE_X86
/* ------------------------------------------------------------------------- */
/* AVX-512: 16 keys per vector, tails and masks as k-registers. */

TF_TARGET_AVX512 static inline __mmask16 first_lanes16(long count)
{
    return count >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << count) - 1u);
}

/* Lanes k..k+15 that are visible: below n and not padding. */
TF_TARGET_AVX512 static inline __mmask16 visible16(long k, long n, const uint8_t *pad)
{
    __mmask16 m = first_lanes16(n - k);
    if (pad) m = _mm_mask_cmpeq_epi8_mask(m, _mm_maskz_loadu_epi8(m, pad + k), _mm_setzero_si128());
    return m;
}

TF_TARGET_AVX512 static void softmax_row_avx512(float *p, const float *s, const uint8_t *pad,
                                                long n, long Tk, float scale)
{
    const __m512 vscale = _mm512_set1_ps(scale);
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (long k = 0; k < n; k += 16) {
        __mmask16 m = visible16(k, n, pad);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + k), vscale);
        vmax = _mm512_mask_max_ps(vmax, m, vmax, v);
    }
    float mx = _mm512_reduce_max_ps(vmax);
    if (mx == -INFINITY) {
        memset(p, 0, (size_t)Tk * sizeof(float));
        return;
    }
    const __m512 vmx = _mm512_set1_ps(mx);
    __m512 vsum = _mm512_setzero_ps();
    long k = 0;
    for (; k < n; k += 16) {
        __mmask16 m = visible16(k, n, pad);
        __m512 v = _mm512_sub_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + k), vscale), vmx);
        __m512 e = _mm512_maskz_mov_ps(m, tf_exp_avx512(v));
        vsum = _mm512_add_ps(vsum, e);
        _mm512_mask_storeu_ps(p + k, first_lanes16(Tk - k), e);
    }
    for (; k < Tk; k += 16) _mm512_mask_storeu_ps(p + k, first_lanes16(Tk - k), _mm512_setzero_ps());
    const __m512 vinv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum));
    for (k = 0; k < n; k += 16) {
        __mmask16 m = first_lanes16(n - k);
        _mm512_mask_storeu_ps(p + k, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, p + k), vinv));
    }
}

TF_TARGET_AVX512 static void softmax_backward_row_avx512(float *ds, const float *p, const float *dp,
                                                         long Tk, float scale)
{
    __m512 acc = _mm512_setzero_ps();
    for (long k = 0; k < Tk; k += 16) {
        __mmask16 m = first_lanes16(Tk - k);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, p + k), _mm512_maskz_loadu_ps(m, dp + k), acc);
    }
    const __m512 vdot = _mm512_set1_ps(_mm512_reduce_add_ps(acc));
    const __m512 vscale = _mm512_set1_ps(scale);
    for (long k = 0; k < Tk; k += 16) {
        __mmask16 m = first_lanes16(Tk - k);
        __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, dp + k), vdot);
        __m512 r = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, p + k), d), vscale);
        _mm512_mask_storeu_ps(ds + k, m, r);
    }
}

TF_TARGET_AVX512 static void exp_array_avx512(float *out, const float *x, long n)
{
    for (long k = 0; k < n; k += 16) {
        __mmask16 m = first_lanes16(n - k);
        _mm512_mask_storeu_ps(out + k, m, tf_exp_avx512(_mm512_maskz_loadu_ps(m, x + k)));
    }
}

/* ------------------------------------------------------------------------- */
/* AVX2: 8 keys per vector, masks as all-ones lanes. */

TF_TARGET_AVX2 static inline __m256i first_lanes8(long count)
{
    if (count > 8) count = 8;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

TF_TARGET_AVX2 static inline __m256i visible8(long k, long n, const uint8_t *pad)
{
    if (!pad) return first_lanes8(n - k);
    if (n - k >= 8) {
        __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(pad + k)));
        return _mm256_cmpeq_epi32(bytes, _mm256_setzero_si256());
    }
    int32_t lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (long j = 0; j < n - k; j++) lanes[j] = pad[k + j] ? 0 : -1;
    return _mm256_loadu_si256((const __m256i *)lanes);
}

/* Fixed-order horizontal reductions (same bits on every call). */
TF_TARGET_AVX2 static inline float hmax8(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

TF_TARGET_AVX2 static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

TF_TARGET_AVX2 static inline void store8(float *dst, long count, __m256 v)
{
    if (count >= 8) _mm256_storeu_ps(dst, v);
    else _mm256_maskstore_ps(dst, first_lanes8(count), v);
}

TF_TARGET_AVX2 static void softmax_row_avx2(float *p, const float *s, const uint8_t *pad,
                                            long n, long Tk, float scale)
{
    const __m256 vscale = _mm256_set1_ps(scale);
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    __m256 vmax = neg_inf;
    for (long k = 0; k < n; k += 8) {
        __m256i m = visible8(k, n, pad);
        __m256 v = _mm256_mul_ps(_mm256_maskload_ps(s + k, m), vscale);
        vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(neg_inf, v, _mm256_castsi256_ps(m)));
    }
    float mx = hmax8(vmax);
    if (mx == -INFINITY) {
        memset(p, 0, (size_t)Tk * sizeof(float));
        return;
    }
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256 vsum = _mm256_setzero_ps();
    long k = 0;
    for (; k < n; k += 8) {
        __m256i m = visible8(k, n, pad);
        __m256 v = _mm256_sub_ps(_mm256_mul_ps(_mm256_maskload_ps(s + k, m), vscale), vmx);
        __m256 e = _mm256_and_ps(tf_exp_avx2(v), _mm256_castsi256_ps(m));
        vsum = _mm256_add_ps(vsum, e);
        store8(p + k, Tk - k, e);
    }
    for (; k < Tk; k += 8) store8(p + k, Tk - k, _mm256_setzero_ps());
    const __m256 vinv = _mm256_set1_ps(1.0f / hsum8(vsum));
    for (k = 0; k < n; k += 8) {
        __m256i m = first_lanes8(n - k);
        store8(p + k, n - k, _mm256_mul_ps(_mm256_maskload_ps(p + k, m), vinv));
    }
}

TF_TARGET_AVX2 static void softmax_backward_row_avx2(float *ds, const float *p, const float *dp,
                                                     long Tk, float scale)
{
    __m256 acc = _mm256_setzero_ps();
    for (long k = 0; k < Tk; k += 8) {
        __m256i m = first_lanes8(Tk - k);
        acc = _mm256_fmadd_ps(_mm256_maskload_ps(p + k, m), _mm256_maskload_ps(dp + k, m), acc);
    }
    const __m256 vdot = _mm256_set1_ps(hsum8(acc));
    const __m256 vscale = _mm256_set1_ps(scale);
    for (long k = 0; k < Tk; k += 8) {
        __m256i m = first_lanes8(Tk - k);
        __m256 d = _mm256_sub_ps(_mm256_maskload_ps(dp + k, m), vdot);
        store8(ds + k, Tk - k, _mm256_mul_ps(_mm256_mul_ps(_mm256_maskload_ps(p + k, m), d), vscale));
    }
}

TF_TARGET_AVX2 static void exp_array_avx2(float *out, const float *x, long n)
{
    for (long k = 0; k < n; k += 8) {
        __m256i m = first_lanes8(n - k);
        store8(out + k, n - k, tf_exp_avx2(_mm256_maskload_ps(x + k, m)));
    }
}
#endif /* TF_HAVE_X86 */

/* ------------------------------------------------------------------------- */

void softmax_forward(float *probs, const float *scores, const uint8_t *key_padding_mask,
                     long B, long H, long Tq, long Tk, float scale, int causal, long q_offset)
{
    long rows = B * H * Tq;
    if (rows == 0 || Tk == 0) return;
    if (q_offset > Tk) q_offset = Tk;   /* every key visible already; avoids overflow below */
    const int isa = tf_isa();
#pragma omp parallel for schedule(static) num_threads(tf_team(rows * Tk, SOFTMAX_GRAIN))
    for (long r = 0; r < rows; r++) {
        long b = r / (H * Tq), q = r % Tq;
        long n = causal && q_offset + q + 1 < Tk ? q_offset + q + 1 : Tk;   /* keys < n visible */
        const uint8_t *pad = key_padding_mask ? key_padding_mask + b * Tk : NULL;
        float *p = probs + r * Tk;
        const float *s = scores + r * Tk;
#if TF_HAVE_X86
        if (isa == TF_ISA_AVX512) { softmax_row_avx512(p, s, pad, n, Tk, scale); continue; }
        if (isa == TF_ISA_AVX2) { softmax_row_avx2(p, s, pad, n, Tk, scale); continue; }
#endif
        softmax_row_generic(p, s, pad, n, Tk, scale);
    }
}

void softmax_backward(float *dscores, const float *probs, const float *dprobs,
                      long rows, long Tk, float scale)
{
    if (rows == 0 || Tk == 0) return;
    const int isa = tf_isa();
#pragma omp parallel for schedule(static) num_threads(tf_team(rows * Tk, SOFTMAX_GRAIN))
    for (long r = 0; r < rows; r++) {
        float *ds = dscores + r * Tk;
        const float *p = probs + r * Tk, *dp = dprobs + r * Tk;
#if TF_HAVE_X86
        if (isa == TF_ISA_AVX512) { softmax_backward_row_avx512(ds, p, dp, Tk, scale); continue; }
        if (isa == TF_ISA_AVX2) { softmax_backward_row_avx2(ds, p, dp, Tk, scale); continue; }
#endif
        softmax_backward_row_generic(ds, p, dp, Tk, scale);
    }
}

void tf_exp_array(float *out, const float *x, long n)
{
#if TF_HAVE_X86
    const int isa = tf_isa();
    if (isa == TF_ISA_AVX512) { exp_array_avx512(out, x, n); return; }
    if (isa == TF_ISA_AVX2) { exp_array_avx2(out, x, n); return; }
#endif
    for (long k = 0; k < n; k++) out[k] = expf(x[k]);
}
