/* Masked softmax, forward and backward (see softmax.h).
 *
 * Per row: (1) max of scale*s over visible keys, (2) e = exp(scale*s - max) for
 * visible keys (exact 0 for hidden ones) while summing, (3) probs = e * (1/sum).
 * Memory sees one read of scores and one write of probs: rows of up to 128 keys
 * are held in registers (AVX-512; several short rows at once so their reduction
 * latencies overlap), longer rows stay in L1 between the sweeps. This is the
 * arithmetic of torch.softmax after masked_fill(-inf) (max, exp(x - max),
 * multiply by 1/sum), except that a fully masked row gives zeros, not NaN.
 * Rows are split into one contiguous range per thread and every row is computed
 * the same way wherever it falls, so results do not depend on the thread count.
 * The plain C path is the reference: expf and a double-precision sum.
 */
#include "softmax.h"

#include <math.h>
#include <string.h>

#include "cpu.h"
#include "simd_math.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Elements per thread below which fewer threads are started: about 3 us of work at one
 * thread (forward ~0.35 ns per element, backward ~0.14), several times what handing work
 * to a warm OpenMP team costs, so the second thread pays for itself (measured: 1.7x at
 * 2 x 8K elements forward, 1.5x at 2 x 16K backward). */
#define SOFTMAX_FORWARD_GRAIN 8192L
#define SOFTMAX_BACKWARD_GRAIN 16384L

#define TF_ALWAYS_INLINE inline __attribute__((always_inline))

/* ------------------------------------------------------------------------- */
/* Plain C: the reference (expf, a double-precision sum). */

/* NaN rows, at every SIMD level alike (as numpy and PyTorch): a row with a NaN among its
 * visible scores is NaN everywhere, hidden keys included (0 / NaN). The max passes below may
 * lose a NaN (a max of NaN and -inf is not NaN in every instruction), so the rare "every
 * key masked" branch asks whether a visible score is NaN, and a NaN sum marks the rest. */
static int row_has_nan(const float *s, const uint8_t *pad, long n, float scale)
{
    for (long k = 0; k < n; k++) {
        float v = scale * s[k];   /* NaN also when scale is 0 and the score infinite */
        if (!(pad && pad[k]) && v != v) return 1;
    }
    return 0;
}

static void fill_nan(float *p, long Tk)
{
    for (long k = 0; k < Tk; k++) p[k] = NAN;
}

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
    if (sum != sum) { fill_nan(p, Tk); return; }
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

/* Lanes k..k+15 that are visible: below n and not padding. */
TF_TARGET_AVX512 static inline __mmask16 visible16(long k, long n, const uint8_t *pad)
{
    __mmask16 m = tf_lanes16(n - k);
    if (pad) m = _mm_mask_cmpeq_epi8_mask(m, _mm_maskz_loadu_epi8(m, pad + k), _mm_setzero_si128());
    return m;
}

/* R consecutive rows of Tk <= 16 * NV keys held in R * NV registers: one load and one store per
 * element, and the R rows' max / exp / sum chains are independent, so short rows overlap
 * (their horizontal reductions and the reciprocal are latency, not work). Row i sees keys
 * below n[i] that are not padding in pad[i]. */
TF_TARGET_AVX512 static TF_ALWAYS_INLINE void softmax_rows_regs_avx512(
    float *p, const float *s, const uint8_t *const *pad, const long *n, long Tk, float scale,
    const int NV, const int R)
{
    __m512 v[4][8];
    __mmask16 m[4][8];
    __m512 vmx[4], vinv[4];
    const __m512 vscale = _mm512_set1_ps(scale);
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) {
        __m512 vmax = _mm512_set1_ps(-INFINITY);
#pragma GCC unroll 8
        for (int j = 0; j < NV; j++) {
            m[i][j] = visible16(16 * j, n[i], pad[i]);
            /* hidden lanes are loaded too (when inside the row) and ignored through m */
            v[i][j] = _mm512_mul_ps(tf_load16(s + i * Tk + 16 * j, Tk - 16 * j), vscale);
            vmax = _mm512_mask_max_ps(vmax, m[i][j], vmax, v[i][j]);
        }
        float mx = _mm512_reduce_max_ps(vmax);
        if (mx == -INFINITY && row_has_nan(s + i * Tk, pad[i], n[i], scale))
            mx = NAN;                      /* a NaN row: NaN everywhere through the sum */
        if (mx == -INFINITY) {             /* every key masked: the row is zeros */
            mx = 0.0f;
#pragma GCC unroll 8
            for (int j = 0; j < NV; j++) m[i][j] = 0;
        }
        vmx[i] = _mm512_set1_ps(mx);
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) {
        __m512 vsum = _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int j = 0; j < NV; j++) {
            v[i][j] = _mm512_maskz_mov_ps(m[i][j], tf_exp_avx512(_mm512_sub_ps(v[i][j], vmx[i])));
            vsum = _mm512_add_ps(vsum, v[i][j]);
        }
        float sum = _mm512_reduce_add_ps(vsum);
        vinv[i] = _mm512_set1_ps(sum != 0.0f ? 1.0f / sum : 0.0f);   /* 0: all masked */
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) {
#pragma GCC unroll 8
        for (int j = 0; j < NV; j++)
            tf_store16(p + i * Tk + 16 * j, Tk - 16 * j, _mm512_mul_ps(v[i][j], vinv[i]));
    }
}

/* Any row length, three sweeps over the row (in L1). */
TF_TARGET_AVX512 static void softmax_row_long_avx512(float *p, const float *s, const uint8_t *pad,
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
        if (row_has_nan(s, pad, n, scale)) fill_nan(p, Tk);
        else memset(p, 0, (size_t)Tk * sizeof(float));
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
        tf_store16(p + k, Tk - k, e);
    }
    float sum = _mm512_reduce_add_ps(vsum);
    if (sum != sum) { fill_nan(p, Tk); return; }
    for (; k < Tk; k += 16) tf_store16(p + k, Tk - k, _mm512_setzero_ps());
    const __m512 vinv = _mm512_set1_ps(1.0f / sum);
    for (k = 0; k < n; k += 16) tf_store16(p + k, Tk - k, _mm512_mul_ps(tf_load16(p + k, Tk - k), vinv));
}

/* `count` (1..4) consecutive rows starting at p / s; row i: padding pad[i], keys below n[i]. */
TF_TARGET_AVX512 static void softmax_rows_avx512(float *p, const float *s, const uint8_t *const *pad,
                                                 const long *n, int count, long Tk, float scale)
{
#define TF_REGS(NV, R) softmax_rows_regs_avx512(p, s, pad, n, Tk, scale, NV, R)
    long nv = (Tk + 15) / 16;
    if (count == 4 && nv <= 2) {
        if (nv == 1) TF_REGS(1, 4); else TF_REGS(2, 4);
        return;
    }
    if (count >= 2 && nv <= 4) {
        long done = 0;
        for (; done + 2 <= count; done += 2) {
            float *pp = p + done * Tk;
            const float *ss = s + done * Tk;
#define TF_REGS2(NV) softmax_rows_regs_avx512(pp, ss, pad + done, n + done, Tk, scale, NV, 2)
            switch (nv) {
            case 1: TF_REGS2(1); break;
            case 2: TF_REGS2(2); break;
            case 3: TF_REGS2(3); break;
            default: TF_REGS2(4); break;
            }
#undef TF_REGS2
        }
        if (done == count) return;
        p += done * Tk;
        s += done * Tk;
        pad += done;
        n += done;
        count -= (int)done;
    }
    for (int i = 0; i < count; i++, p += Tk, s += Tk) {
        switch (nv) {
        case 1: softmax_rows_regs_avx512(p, s, pad + i, n + i, Tk, scale, 1, 1); break;
        case 2: softmax_rows_regs_avx512(p, s, pad + i, n + i, Tk, scale, 2, 1); break;
        case 3: softmax_rows_regs_avx512(p, s, pad + i, n + i, Tk, scale, 3, 1); break;
        case 4: softmax_rows_regs_avx512(p, s, pad + i, n + i, Tk, scale, 4, 1); break;
        case 5: softmax_rows_regs_avx512(p, s, pad + i, n + i, Tk, scale, 5, 1); break;
        case 6: softmax_rows_regs_avx512(p, s, pad + i, n + i, Tk, scale, 6, 1); break;
        case 7: softmax_rows_regs_avx512(p, s, pad + i, n + i, Tk, scale, 7, 1); break;
        case 8: softmax_rows_regs_avx512(p, s, pad + i, n + i, Tk, scale, 8, 1); break;
        default: softmax_row_long_avx512(p, s, pad[i], n[i], Tk, scale); break;
        }
    }
#undef TF_REGS
}

/* R consecutive rows of Tk <= 16 * NV: probs and dprobs read once into registers, the R dot
 * products' chains overlap. */
TF_TARGET_AVX512 static TF_ALWAYS_INLINE void softmax_backward_rows_regs_avx512(
    float *ds, const float *p, const float *dp, long Tk, float scale, const int NV, const int R)
{
    __m512 pv[4][4], dv[4][4], vdot[4];
    const __m512 vscale = _mm512_set1_ps(scale);
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) {
        __m512 acc = _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) {
            pv[i][j] = tf_load16(p + i * Tk + 16 * j, Tk - 16 * j);
            dv[i][j] = tf_load16(dp + i * Tk + 16 * j, Tk - 16 * j);
            acc = _mm512_fmadd_ps(pv[i][j], dv[i][j], acc);
        }
        vdot[i] = _mm512_set1_ps(_mm512_reduce_add_ps(acc));
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) {
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) {
            __m512 r = _mm512_mul_ps(_mm512_mul_ps(pv[i][j], _mm512_sub_ps(dv[i][j], vdot[i])), vscale);
            tf_store16(ds + i * Tk + 16 * j, Tk - 16 * j, r);
        }
    }
}

/* Any row length: two accumulators for the dot product. */
TF_TARGET_AVX512 static void softmax_backward_row_long_avx512(float *ds, const float *p,
                                                              const float *dp, long Tk, float scale)
{
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    long k = 0;
    for (; k + 32 <= Tk; k += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(p + k), _mm512_loadu_ps(dp + k), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(p + k + 16), _mm512_loadu_ps(dp + k + 16), acc1);
    }
    for (; k < Tk; k += 16) {
        __mmask16 m = tf_lanes16(Tk - k);
        acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, p + k), _mm512_maskz_loadu_ps(m, dp + k), acc0);
    }
    const __m512 vdot = _mm512_set1_ps(_mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)));
    const __m512 vscale = _mm512_set1_ps(scale);
    for (k = 0; k < Tk; k += 16) {
        __m512 d = _mm512_sub_ps(tf_load16(dp + k, Tk - k), vdot);
        tf_store16(ds + k, Tk - k, _mm512_mul_ps(_mm512_mul_ps(tf_load16(p + k, Tk - k), d), vscale));
    }
}

/* Rows [r0, r1) of the backward. */
TF_TARGET_AVX512 static void softmax_backward_rows_avx512(float *ds, const float *p, const float *dp,
                                                          long r0, long r1, long Tk, float scale)
{
    const long nv = (Tk + 15) / 16;
    if (nv > 4) {
        for (long r = r0; r < r1; r++)
            softmax_backward_row_long_avx512(ds + r * Tk, p + r * Tk, dp + r * Tk, Tk, scale);
        return;
    }
    /* Groups of 4 rows (2 when Tk > 32), then single rows; NV is always nv, so each row gets
     * exactly the same arithmetic whichever group it falls in (thread splits move groups). */
    const long group = nv <= 2 ? 4 : 2;
    for (long r = r0; r < r1;) {
        float *d = ds + r * Tk;
        const float *pp = p + r * Tk, *dd = dp + r * Tk;
#define TF_BWD(NV, R) softmax_backward_rows_regs_avx512(d, pp, dd, Tk, scale, NV, R)
        if (r + group <= r1) {
            switch (nv) {
            case 1: TF_BWD(1, 4); break;
            case 2: TF_BWD(2, 4); break;
            case 3: TF_BWD(3, 2); break;
            default: TF_BWD(4, 2); break;
            }
            r += group;
        } else {
            switch (nv) {
            case 1: TF_BWD(1, 1); break;
            case 2: TF_BWD(2, 1); break;
            case 3: TF_BWD(3, 1); break;
            default: TF_BWD(4, 1); break;
            }
            r += 1;
        }
#undef TF_BWD
    }
}

TF_TARGET_AVX512 static void exp_array_avx512(float *out, const float *x, long n)
{
    for (long k = 0; k < n; k += 16) {
        __mmask16 m = tf_lanes16(n - k);
        _mm512_mask_storeu_ps(out + k, m, tf_exp_avx512(_mm512_maskz_loadu_ps(m, x + k)));
    }
}

/* ------------------------------------------------------------------------- */
/* AVX2: 8 keys per vector, masks as all-ones lanes. */


TF_TARGET_AVX2 static inline __m256i visible8(long k, long n, const uint8_t *pad)
{
    if (!pad) return tf_lanes8(n - k);
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
    else if (count > 0) _mm256_maskstore_ps(dst, tf_lanes8(count), v);
}

/* The first `count` floats at src (zeros past them; nothing read past them). Full vectors use a
 * plain load, which store-to-load forwarding serves (vmaskmovps loads may not be). */
TF_TARGET_AVX2 static inline __m256 load8(const float *src, long count)
{
    if (count >= 8) return _mm256_loadu_ps(src);
    return _mm256_maskload_ps(src, tf_lanes8(count));
}

TF_TARGET_AVX2 static void softmax_row_long_avx2(float *p, const float *s, const uint8_t *pad,
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
        if (row_has_nan(s, pad, n, scale)) fill_nan(p, Tk);
        else memset(p, 0, (size_t)Tk * sizeof(float));
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
    float sum = hsum8(vsum);
    if (sum != sum) { fill_nan(p, Tk); return; }
    for (; k < Tk; k += 8) store8(p + k, Tk - k, _mm256_setzero_ps());
    const __m256 vinv = _mm256_set1_ps(1.0f / sum);
    for (k = 0; k < n; k += 8) store8(p + k, n - k, _mm256_mul_ps(load8(p + k, n - k), vinv));
}

/* `count` consecutive rows. (Holding rows in registers, as the AVX-512 path does, spills with
 * 16 ymm registers and the exp's constants: three sweeps over an L1-resident row are faster.) */
TF_TARGET_AVX2 static void softmax_rows_avx2(float *p, const float *s, const uint8_t *const *pad,
                                             const long *n, int count, long Tk, float scale)
{
    for (int i = 0; i < count; i++) softmax_row_long_avx2(p + i * Tk, s + i * Tk, pad[i], n[i], Tk, scale);
}

/* R consecutive rows of the backward, Tk <= 8 * NV, in registers. */
TF_TARGET_AVX2 static TF_ALWAYS_INLINE void softmax_backward_rows_regs_avx2(
    float *ds, const float *p, const float *dp, long Tk, float scale, const int NV, const int R)
{
    __m256 pv[2][4], dv[2][4], vdot[2];
    const __m256 vscale = _mm256_set1_ps(scale);
#pragma GCC unroll 2
    for (int i = 0; i < R; i++) {
        __m256 acc = _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) {
            pv[i][j] = load8(p + i * Tk + 8 * j, Tk - 8 * j);
            dv[i][j] = load8(dp + i * Tk + 8 * j, Tk - 8 * j);
            acc = _mm256_fmadd_ps(pv[i][j], dv[i][j], acc);
        }
        vdot[i] = _mm256_set1_ps(hsum8(acc));
    }
#pragma GCC unroll 2
    for (int i = 0; i < R; i++) {
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++)
            store8(ds + i * Tk + 8 * j, Tk - 8 * j,
                   _mm256_mul_ps(_mm256_mul_ps(pv[i][j], _mm256_sub_ps(dv[i][j], vdot[i])), vscale));
    }
}

TF_TARGET_AVX2 static void softmax_backward_row_long_avx2(float *ds, const float *p, const float *dp,
                                                          long Tk, float scale)
{
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    long k = 0;
    for (; k + 16 <= Tk; k += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(p + k), _mm256_loadu_ps(dp + k), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(p + k + 8), _mm256_loadu_ps(dp + k + 8), acc1);
    }
    for (; k < Tk; k += 8) acc0 = _mm256_fmadd_ps(load8(p + k, Tk - k), load8(dp + k, Tk - k), acc0);
    const __m256 vdot = _mm256_set1_ps(hsum8(_mm256_add_ps(acc0, acc1)));
    const __m256 vscale = _mm256_set1_ps(scale);
    for (k = 0; k < Tk; k += 8) {
        __m256 d = _mm256_sub_ps(load8(dp + k, Tk - k), vdot);
        store8(ds + k, Tk - k, _mm256_mul_ps(_mm256_mul_ps(load8(p + k, Tk - k), d), vscale));
    }
}

/* Rows [r0, r1) of the backward: pairs for Tk <= 16, single rows up to 32, then the long path. */
TF_TARGET_AVX2 static void softmax_backward_rows_avx2(float *ds, const float *p, const float *dp,
                                                      long r0, long r1, long Tk, float scale)
{
    const long nv = (Tk + 7) / 8;
    for (long r = r0; r < r1;) {
        float *d = ds + r * Tk;
        const float *pp = p + r * Tk, *dd = dp + r * Tk;
        if (nv <= 2 && r + 2 <= r1) {
            if (nv == 1) softmax_backward_rows_regs_avx2(d, pp, dd, Tk, scale, 1, 2);
            else softmax_backward_rows_regs_avx2(d, pp, dd, Tk, scale, 2, 2);
            r += 2;
            continue;
        }
        switch (nv) {
        case 1: softmax_backward_rows_regs_avx2(d, pp, dd, Tk, scale, 1, 1); break;
        case 2: softmax_backward_rows_regs_avx2(d, pp, dd, Tk, scale, 2, 1); break;
        case 3: softmax_backward_rows_regs_avx2(d, pp, dd, Tk, scale, 3, 1); break;
        case 4: softmax_backward_rows_regs_avx2(d, pp, dd, Tk, scale, 4, 1); break;
        default: softmax_backward_row_long_avx2(d, pp, dd, Tk, scale); break;
        }
        r += 1;
    }
}

TF_TARGET_AVX2 static void exp_array_avx2(float *out, const float *x, long n)
{
    for (long k = 0; k < n; k += 8) {
        __m256i m = tf_lanes8(n - k);
        store8(out + k, n - k, tf_exp_avx2(_mm256_maskload_ps(x + k, m)));
    }
}
#endif /* TF_HAVE_X86 */

/* ------------------------------------------------------------------------- */

void softmax_forward(float *probs, const float *scores, const uint8_t *key_padding_mask,
                     long B, long H, long Tq, long Tk, float scale, int causal, long q_offset)
{
    const long rows = B * H * Tq;
    if (rows == 0 || Tk == 0) return;
    if (q_offset > Tk) q_offset = Tk;   /* every key visible already; avoids overflow below */
    const int isa = tf_isa();
    /* Each thread takes one contiguous range of rows (the same split as schedule(static)) and
     * walks it in groups of up to 4 rows, tracking (batch, query) without a division per row. */
#pragma omp parallel num_threads(tf_team(rows * Tk, SOFTMAX_FORWARD_GRAIN))
    {
        long r = 0, r1 = rows;
#ifdef _OPENMP
        int team = omp_get_num_threads(), t = omp_get_thread_num();
        r = rows / team * t + (t < rows % team ? t : rows % team);
        r1 = r + rows / team + (t < rows % team ? 1 : 0);
#endif
        long q = r % Tq, b = r / Tq / H, h = r / Tq % H;
        while (r < r1) {
            const uint8_t *pad[4];
            long n[4];
            int count = 0;
            for (; count < 4 && r + count < r1; count++) {
                pad[count] = key_padding_mask ? key_padding_mask + b * Tk : NULL;
                n[count] = causal && q_offset + q + 1 < Tk ? q_offset + q + 1 : Tk;  /* keys < n */
                if (++q == Tq) {
                    q = 0;
                    if (++h == H) { h = 0; b++; }
                }
            }
            float *p = probs + r * Tk;
            const float *s = scores + r * Tk;
#if TF_HAVE_X86
            if (isa >= TF_ISA_AVX512) {
                softmax_rows_avx512(p, s, pad, n, count, Tk, scale);
            } else if (isa >= TF_ISA_AVX2) {
                softmax_rows_avx2(p, s, pad, n, count, Tk, scale);
            } else
#endif
            {
                for (int i = 0; i < count; i++) softmax_row_generic(p + i * Tk, s + i * Tk, pad[i], n[i], Tk, scale);
            }
            r += count;
        }
    }
}

void softmax_backward(float *dscores, const float *probs, const float *dprobs,
                      long rows, long Tk, float scale)
{
    if (rows == 0 || Tk == 0) return;
    const int isa = tf_isa();
#pragma omp parallel num_threads(tf_team(rows * Tk, SOFTMAX_BACKWARD_GRAIN))
    {
        long r0 = 0, r1 = rows;
#ifdef _OPENMP
        int team = omp_get_num_threads(), t = omp_get_thread_num();
        r0 = rows / team * t + (t < rows % team ? t : rows % team);
        r1 = r0 + rows / team + (t < rows % team ? 1 : 0);
#endif
#if TF_HAVE_X86
        if (isa >= TF_ISA_AVX512) {
            softmax_backward_rows_avx512(dscores, probs, dprobs, r0, r1, Tk, scale);
        } else if (isa >= TF_ISA_AVX2) {
            softmax_backward_rows_avx2(dscores, probs, dprobs, r0, r1, Tk, scale);
        } else
#endif
        {
            for (long r = r0; r < r1; r++)
                softmax_backward_row_generic(dscores + r * Tk, probs + r * Tk, dprobs + r * Tk, Tk, scale);
        }
    }
}

void softmax_block_forward(float *probs, const float *scores, const uint8_t *pad, long Tq, long Tk,
                           float scale, int causal)
{
    const int isa = tf_isa();
    for (long q = 0; q < Tq;) {
        const uint8_t *pads[4];
        long n[4];
        int count = 0;
        for (; count < 4 && q + count < Tq; count++) {
            pads[count] = pad;
            n[count] = causal && q + count + 1 < Tk ? q + count + 1 : Tk;
        }
        float *p = probs + q * Tk;
        const float *s = scores + q * Tk;
#if TF_HAVE_X86
        if (isa >= TF_ISA_AVX512) {
            softmax_rows_avx512(p, s, pads, n, count, Tk, scale);
        } else if (isa >= TF_ISA_AVX2) {
            softmax_rows_avx2(p, s, pads, n, count, Tk, scale);
        } else
#endif
        {
            for (int i = 0; i < count; i++) softmax_row_generic(p + i * Tk, s + i * Tk, pads[i], n[i], Tk, scale);
        }
        q += count;
    }
}

void softmax_block_backward(float *dscores, const float *probs, const float *dprobs, long rows,
                            long Tk, float scale)
{
#if TF_HAVE_X86
    const int isa = tf_isa();
    if (isa >= TF_ISA_AVX512) { softmax_backward_rows_avx512(dscores, probs, dprobs, 0, rows, Tk, scale); return; }
    if (isa >= TF_ISA_AVX2) { softmax_backward_rows_avx2(dscores, probs, dprobs, 0, rows, Tk, scale); return; }
#endif
    for (long r = 0; r < rows; r++)
        softmax_backward_row_generic(dscores + r * Tk, probs + r * Tk, dprobs + r * Tk, Tk, scale);
}

void tf_exp_array(float *out, const float *x, long n)
{
#if TF_HAVE_X86
    const int isa = tf_isa();
    if (isa >= TF_ISA_AVX512) { exp_array_avx512(out, x, n); return; }
    if (isa >= TF_ISA_AVX2) { exp_array_avx2(out, x, n); return; }
#endif
    for (long k = 0; k < n; k++) out[k] = expf(x[k]);
}
