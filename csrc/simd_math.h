/* Vectorised expf for the AVX-512 and AVX2 paths (header only, static inline).
 *
 * Cephes-style: n = round(x * log2(e)), r = x - n*ln2 (ln2 split in two, FMA),
 * exp(r) on [-ln2/2, ln2/2] by the Cephes degree-7 polynomial
 * 1 + r + r^2 * P(r), then 2^n applied exactly:
 *   - AVX-512: vscalefps (one rounding, correct overflow to inf and gradual
 *     underflow to denormals/zero);
 *   - AVX2: two power-of-two multiplies 2^(n>>1) * 2^(n-(n>>1)) (n up to 129
 *     is representable, so overflow gives +inf like expf). For x < -87
 *     the result (below 1.65e-38, just above FLT_MIN = 1.18e-38) is flushed
 *     to 0: a multiply whose result is denormal takes a slow path on x86
 *     cores (measured 3x slower on the whole exp), and softmax rows with
 *     hidden (-inf) keys would hit it on every hidden key.
 * x > 88.72 gives +inf, +-inf and NaN behave like expf (NaN in, NaN out).
 *
 * Accuracy (checked exhaustively over every float in [-104, 89] against
 * (float)exp((double)x)): at most 1 ulp wherever the result is a normal float
 * (AVX2: for x >= -87)
 * (max observed error 1 ulp, more than 99% correctly rounded). Below that:
 * AVX-512 within one denormal step (double rounding); AVX2 gives 0 for x < -87.
 * Use these only in functions compiled with the matching target attribute
 * (TF_TARGET_AVX512 / TF_TARGET_AVX2).
 */
#ifndef TF_SIMD_MATH_H
#define TF_SIMD_MATH_H

#include "simd.h"

#define TF_EXP_HI 89.0f           /* beyond ln(FLT_MAX) = 88.72: result +inf */
#define TF_EXP_LO -105.0f         /* below ln(min denormal / 2) = -103.97: result 0 */
#define TF_EXP_LO_AVX2 -87.0f    /* AVX2 flushes exp(x < -87) (< 1.65e-38, near FLT_MIN) to 0 */
#define TF_LOG2E 1.44269504088896341f
#define TF_LN2_HI 0.693359375f    /* few mantissa bits: n * TF_LN2_HI is exact */
#define TF_LN2_LO -2.12194440e-4f
#define TF_EXP_P0 1.9875691500e-4f
#define TF_EXP_P1 1.3981999507e-3f
#define TF_EXP_P2 8.3334519073e-3f
#define TF_EXP_P3 4.1665795894e-2f
#define TF_EXP_P4 1.6666665459e-1f
#define TF_EXP_P5 5.0000001201e-1f

#if TF_HAVE_X86

/* The first `count` lanes of a 16-float vector, as a mask (count may be <= 0 or >= 16). */
TF_TARGET_AVX512 static inline __mmask16 tf_lanes16(long count)
{
    if (count <= 0) return 0;
    return count >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << count) - 1u);
}

/* The first `count` lanes of an 8-lane (AVX2) vector, as a maskload / maskstore mask (count may
 * be <= 0 or >= 8). */
TF_TARGET_AVX2 static inline __m256i tf_lanes8(long count)
{
    count = count < 0 ? 0 : count > 8 ? 8 : count;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The first `count` floats at src (zeros past them, nothing read past them) / stored to dst.
 * Full vectors use plain loads and stores: masked ones are slower on some cores, and masked
 * stores do not forward to later loads. */
TF_TARGET_AVX512 static inline __m512 tf_load16(const float *src, long count)
{
    if (count >= 16) return _mm512_loadu_ps(src);
    return _mm512_maskz_loadu_ps(tf_lanes16(count), src);
}

TF_TARGET_AVX512 static inline void tf_store16(float *dst, long count, __m512 v)
{
    if (count >= 16) _mm512_storeu_ps(dst, v);
    else _mm512_mask_storeu_ps(dst, tf_lanes16(count), v);
}

/* Lane t of the result: the sum of the 16 lanes of v[t], by a fixed tree (adjacent lanes, then
 * pairs of those, then 128-bit quarters), so 16 dot products finish in 15 adds and 30 shuffles. */
TF_TARGET_AVX512 static inline __m512 tf_sum16x16(const __m512 v[16])
{
    __m512 l1[8], l2[4];
    for (int p = 0; p < 8; p++)   /* l1[p]: v[2p] and v[2p+1], adjacent lanes added */
        l1[p] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * p], v[2 * p + 1]),
                              _mm512_unpackhi_ps(v[2 * p], v[2 * p + 1]));
    for (int q = 0; q < 4; q++) {   /* l2[q], 128-bit lane L, element e: part L of sum v[4q + e] */
        __m512d c0 = _mm512_castps_pd(l1[2 * q]), c1 = _mm512_castps_pd(l1[2 * q + 1]);
        l2[q] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(c0, c1)),
                              _mm512_castpd_ps(_mm512_unpackhi_pd(c0, c1)));
    }
    __m512 e0 = _mm512_add_ps(_mm512_shuffle_f32x4(l2[0], l2[1], 0x88), _mm512_shuffle_f32x4(l2[0], l2[1], 0xDD));
    __m512 e1 = _mm512_add_ps(_mm512_shuffle_f32x4(l2[2], l2[3], 0x88), _mm512_shuffle_f32x4(l2[2], l2[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(e0, e1, 0x88), _mm512_shuffle_f32x4(e0, e1, 0xDD));
}

/* Lane t: the sum of v[t]'s eight lanes (adjacent lanes added first, then pairs of those, then
 * the two halves). */
TF_TARGET_AVX2 static inline __m256 tf_sum8x8(const __m256 v[8])
{
    __m256 l1[4];
    for (int p = 0; p < 4; p++) l1[p] = _mm256_hadd_ps(v[2 * p], v[2 * p + 1]);
    /* l2[q], half H: part H of the sums of v[4q] .. v[4q + 3] */
    __m256 l2_0 = _mm256_hadd_ps(l1[0], l1[1]), l2_1 = _mm256_hadd_ps(l1[2], l1[3]);
    return _mm256_add_ps(_mm256_permute2f128_ps(l2_0, l2_1, 0x20), _mm256_permute2f128_ps(l2_0, l2_1, 0x31));
}

TF_TARGET_AVX512 static inline __m512 tf_exp_avx512(__m512 x)
{
    /* min/max with the constant first: a NaN in x passes through. */
    x = _mm512_min_ps(_mm512_set1_ps(TF_EXP_HI), x);
    x = _mm512_max_ps(_mm512_set1_ps(TF_EXP_LO), x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(TF_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(TF_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(TF_LN2_LO), r);
    __m512 p = _mm512_set1_ps(TF_EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(TF_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(TF_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(TF_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(TF_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(TF_EXP_P5));
    __m512 y = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
    y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(y, n);
}

TF_TARGET_AVX2 static inline __m256 tf_exp_avx2(__m256 x)
{
    /* lanes kept (x >= -87, or NaN): the others become 0 */
    const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(TF_EXP_LO_AVX2), _CMP_NLT_UQ);
    x = _mm256_min_ps(_mm256_set1_ps(TF_EXP_HI), x);
    x = _mm256_max_ps(_mm256_set1_ps(TF_EXP_LO_AVX2), x);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(TF_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(TF_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(TF_LN2_LO), r);
    __m256 p = _mm256_set1_ps(TF_EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(TF_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(TF_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(TF_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(TF_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(TF_EXP_P5));
    __m256 y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    /* 2^n as two exact power-of-two factors (n in [-126, 129], every product normal;
     * a NaN x gives a NaN y). */
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i n1 = _mm256_srai_epi32(ni, 1);
    __m256i n2 = _mm256_sub_epi32(ni, n1);
    __m256i bias = _mm256_set1_epi32(127);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_and_ps(_mm256_mul_ps(_mm256_mul_ps(y, s1), s2), keep);
}

#endif /* TF_HAVE_X86 */

#endif
