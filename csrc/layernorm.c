/* Layer normalisation, forward and backward (see layernorm.h).
 *
 * Each row is read from memory once per kernel: its D floats stay in L1 across
 * the mean, variance and output sweeps (forward) and the two backward sweeps.
 * The SIMD paths advance several consecutive rows together (4 with AVX-512, 2
 * with AVX2) so that one row's reduction latency (horizontal add, divide, square
 * root) overlaps the others' work; each row's arithmetic is the same whichever
 * group it falls in, so results do not depend on the thread count. The backward
 * pass of a fixed chunk of rows keeps its dweight/dbias partial sums in registers
 * across the rows of a group and adds the rows in order.
 */
#include "layernorm.h"

#include <math.h>
#include <string.h>

#include "cpu.h"
#include "simd_math.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Elements per thread below which fewer threads are started: ~2-3 us of work at one thread
 * (measured: 2 threads give 1.4x at 2 x 8K elements, 1.6x at 2 x 16K). */
#define LAYERNORM_GRAIN 16384L

/* ------------------------------------------------------------------------- */
/* Plain C: the reference (sums in double). */

/* One row: y [D] out, x [D], w [D], b [D]; returns mean and rstd through m, rs. */
static void layernorm_row_generic(float *y, float *m, float *rs, const float *x, const float *w,
                                  const float *b, long D, float eps)
{
    double sum = 0.0;
    for (long c = 0; c < D; c++) sum += x[c];
    float mean = (float)(sum / (double)D);
    double ss = 0.0;
    for (long c = 0; c < D; c++) {
        double d = (double)(x[c] - mean);
        ss += d * d;
    }
    float var = (float)(ss / (double)D);
    float rstd = 1.0f / sqrtf(var + eps);
    for (long c = 0; c < D; c++) y[c] = (x[c] - mean) * rstd * w[c] + b[c];
    *m = mean;
    *rs = rstd;
}

/* One row of the backward: dx [D] out (+= when acc); dwp, dbp [D] partial sums added into. */
static void layernorm_backward_row_generic(float *dx, float *dwp, float *dbp, const float *dy,
                                           const float *x, const float *w, float mean, float rstd,
                                           long D, int acc)
{
    double sg = 0.0, sgx = 0.0;
    for (long c = 0; c < D; c++) {
        float xh = (x[c] - mean) * rstd;
        float g = dy[c] * w[c];
        sg += g;
        sgx += (double)g * xh;
        dwp[c] += dy[c] * xh;
        dbp[c] += dy[c];
    }
    float a = (float)(sg / (double)D), bb = (float)(sgx / (double)D);
    for (long c = 0; c < D; c++) {
        float xh = (x[c] - mean) * rstd;
        float g = dy[c] * w[c];
        float v = rstd * ((g - a) - xh * bb);
        dx[c] = acc ? dx[c] + v : v;
    }
}

#if TF_HAVE_X86
/* ------------------------------------------------------------------------- */
/* AVX-512 */

#define TF_ALWAYS_INLINE inline __attribute__((always_inline))

/* R consecutive rows (any D), interleaved: each sweep over the columns advances all R rows, so
 * the R rows' reduction chains (sum, variance, horizontal adds, divide, square root) overlap
 * instead of each row waiting on its own. Every row's arithmetic is the same for any R. */
TF_TARGET_AVX512 static TF_ALWAYS_INLINE void layernorm_rows_avx512(
    float *y, float *m, float *rs, const float *x, const float *w, const float *b, long D,
    float eps, const int R)
{
    __m512 s0[4], s1[4], vmean[4], vrstd[4];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) s0[i] = s1[i] = _mm512_setzero_ps();
    long c = 0;
    for (; c + 32 <= D; c += 32) {
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            s0[i] = _mm512_add_ps(s0[i], _mm512_loadu_ps(x + i * D + c));
            s1[i] = _mm512_add_ps(s1[i], _mm512_loadu_ps(x + i * D + c + 16));
        }
    }
    for (; c < D; c += 16) {
        __mmask16 k = tf_lanes16(D - c);
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) s0[i] = _mm512_add_ps(s0[i], _mm512_maskz_loadu_ps(k, x + i * D + c));
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) {
        float mean = _mm512_reduce_add_ps(_mm512_add_ps(s0[i], s1[i])) / (float)D;
        m[i] = mean;
        vmean[i] = _mm512_set1_ps(mean);
        s0[i] = s1[i] = _mm512_setzero_ps();
    }
    for (c = 0; c + 32 <= D; c += 32) {
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            __m512 d0 = _mm512_sub_ps(_mm512_loadu_ps(x + i * D + c), vmean[i]);
            __m512 d1 = _mm512_sub_ps(_mm512_loadu_ps(x + i * D + c + 16), vmean[i]);
            s0[i] = _mm512_fmadd_ps(d0, d0, s0[i]);
            s1[i] = _mm512_fmadd_ps(d1, d1, s1[i]);
        }
    }
    for (; c < D; c += 16) {
        __mmask16 k = tf_lanes16(D - c);
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            __m512 d = _mm512_maskz_sub_ps(k, _mm512_maskz_loadu_ps(k, x + i * D + c), vmean[i]);
            s0[i] = _mm512_fmadd_ps(d, d, s0[i]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) {
        float var = _mm512_reduce_add_ps(_mm512_add_ps(s0[i], s1[i])) / (float)D;
        float rstd = 1.0f / sqrtf(var + eps);
        rs[i] = rstd;
        vrstd[i] = _mm512_set1_ps(rstd);
    }
    for (c = 0; c < D; c += 16) {
        long cnt = D - c;
        __m512 vw = tf_load16(w + c, cnt), vb = tf_load16(b + c, cnt);
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            __m512 xh = _mm512_mul_ps(_mm512_sub_ps(tf_load16(x + i * D + c, cnt), vmean[i]), vrstd[i]);
            tf_store16(y + i * D + c, cnt, _mm512_fmadd_ps(xh, vw, vb));
        }
    }
}

/* Rows [r0, r1) of the forward: groups of 4, then single rows. */
TF_TARGET_AVX512 static void layernorm_forward_rows_avx512(float *out, float *mean, float *rstd,
                                                           const float *x, const float *w,
                                                           const float *b, long r0, long r1,
                                                           long D, float eps)
{
    long r = r0;
    for (; r + 4 <= r1; r += 4)
        layernorm_rows_avx512(out + r * D, mean + r, rstd + r, x + r * D, w, b, D, eps, 4);
    for (; r < r1; r++)
        layernorm_rows_avx512(out + r * D, mean + r, rstd + r, x + r * D, w, b, D, eps, 1);
}

/* R consecutive rows of the backward, interleaved as in the forward. The partial sums dwp/dbp
 * stay in registers across the R rows and receive the rows in order. */
TF_TARGET_AVX512 static TF_ALWAYS_INLINE void layernorm_backward_rows_avx512(
    float *dx, float *dwp, float *dbp, const float *dy, const float *x, const float *w,
    const float *mean, const float *rstd, long D, int acc, const int R)
{
    __m512 vmean[4], vrstd[4], sg[4], sgx[4], va[4], vb[4];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) {
        vmean[i] = _mm512_set1_ps(mean[i]);
        vrstd[i] = _mm512_set1_ps(rstd[i]);
        sg[i] = sgx[i] = _mm512_setzero_ps();
    }
    for (long c = 0; c < D; c += 16) {
        long cnt = D - c;
        __mmask16 k = tf_lanes16(cnt);
        __m512 vw = tf_load16(w + c, cnt);
        __m512 dwv = tf_load16(dwp + c, cnt), dbv = tf_load16(dbp + c, cnt);
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            __m512 vdy = tf_load16(dy + i * D + c, cnt);
            __m512 xh = _mm512_maskz_mul_ps(k, _mm512_sub_ps(tf_load16(x + i * D + c, cnt), vmean[i]), vrstd[i]);
            __m512 g = _mm512_mul_ps(vdy, vw);
            sg[i] = _mm512_add_ps(sg[i], g);
            sgx[i] = _mm512_fmadd_ps(g, xh, sgx[i]);
            dwv = _mm512_fmadd_ps(vdy, xh, dwv);
            dbv = _mm512_add_ps(vdy, dbv);
        }
        tf_store16(dwp + c, cnt, dwv);
        tf_store16(dbp + c, cnt, dbv);
    }
    /* dx = rstd * (g - a - xhat * b) = g * rstd - ((x - mean) * (rstd^2 * b) + rstd * a) */
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) {
        float a = _mm512_reduce_add_ps(sg[i]) / (float)D, bb = _mm512_reduce_add_ps(sgx[i]) / (float)D;
        float r = rstd[i];
        va[i] = _mm512_set1_ps(r * a);
        vb[i] = _mm512_set1_ps(r * r * bb);
    }
    for (long c = 0; c < D; c += 16) {
        long cnt = D - c;
        __m512 vw = tf_load16(w + c, cnt);
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            __m512 d = _mm512_sub_ps(tf_load16(x + i * D + c, cnt), vmean[i]);
            __m512 g = _mm512_mul_ps(tf_load16(dy + i * D + c, cnt), vw);
            __m512 v = _mm512_fmsub_ps(g, vrstd[i], _mm512_fmadd_ps(d, vb[i], va[i]));
            if (acc) v = _mm512_add_ps(tf_load16(dx + i * D + c, cnt), v);
            tf_store16(dx + i * D + c, cnt, v);
        }
    }
}

/* Rows [r0, r1) of the backward, all within one chunk (partials dwp, dbp). */
TF_TARGET_AVX512 static void layernorm_backward_chunk_avx512(float *dx, float *dwp, float *dbp,
                                                             const float *dy, const float *x,
                                                             const float *w, const float *mean,
                                                             const float *rstd, long r0, long r1,
                                                             long D, int acc)
{
    long r = r0;
    for (; r + 4 <= r1; r += 4)
        layernorm_backward_rows_avx512(dx + r * D, dwp, dbp, dy + r * D, x + r * D, w, mean + r,
                                       rstd + r, D, acc, 4);
    for (; r < r1; r++)
        layernorm_backward_rows_avx512(dx + r * D, dwp, dbp, dy + r * D, x + r * D, w, mean + r,
                                       rstd + r, D, acc, 1);
}

/* ------------------------------------------------------------------------- */
/* AVX2 */


TF_TARGET_AVX2 static inline float ln_hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

TF_TARGET_AVX2 static inline void ln_store8(float *dst, long count, __m256 v)
{
    if (count >= 8) _mm256_storeu_ps(dst, v);
    else if (count > 0) _mm256_maskstore_ps(dst, tf_lanes8(count), v);
}

/* The first `count` floats at src, zeros past them (nothing read past them). */
TF_TARGET_AVX2 static inline __m256 ln_load8(const float *src, long count)
{
    if (count >= 8) return _mm256_loadu_ps(src);
    return _mm256_maskload_ps(src, tf_lanes8(count));
}

/* R consecutive rows, interleaved (as layernorm_rows_avx512). */
TF_TARGET_AVX2 static TF_ALWAYS_INLINE void layernorm_rows_avx2(
    float *y, float *m, float *rs, const float *x, const float *w, const float *b, long D,
    float eps, const int R)
{
    __m256 s0[2], s1[2], vmean[2], vrstd[2];
#pragma GCC unroll 2
    for (int i = 0; i < R; i++) s0[i] = s1[i] = _mm256_setzero_ps();
    long c = 0;
    for (; c + 16 <= D; c += 16) {
#pragma GCC unroll 2
        for (int i = 0; i < R; i++) {
            s0[i] = _mm256_add_ps(s0[i], _mm256_loadu_ps(x + i * D + c));
            s1[i] = _mm256_add_ps(s1[i], _mm256_loadu_ps(x + i * D + c + 8));
        }
    }
    for (; c < D; c += 8) {
#pragma GCC unroll 2
        for (int i = 0; i < R; i++) s0[i] = _mm256_add_ps(s0[i], ln_load8(x + i * D + c, D - c));
    }
#pragma GCC unroll 2
    for (int i = 0; i < R; i++) {
        float mean = ln_hsum8(_mm256_add_ps(s0[i], s1[i])) / (float)D;
        m[i] = mean;
        vmean[i] = _mm256_set1_ps(mean);
        s0[i] = s1[i] = _mm256_setzero_ps();
    }
    for (c = 0; c + 16 <= D; c += 16) {
#pragma GCC unroll 2
        for (int i = 0; i < R; i++) {
            __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(x + i * D + c), vmean[i]);
            __m256 d1 = _mm256_sub_ps(_mm256_loadu_ps(x + i * D + c + 8), vmean[i]);
            s0[i] = _mm256_fmadd_ps(d0, d0, s0[i]);
            s1[i] = _mm256_fmadd_ps(d1, d1, s1[i]);
        }
    }
    for (; c < D; c += 8) {
        __m256 k = _mm256_castsi256_ps(tf_lanes8(D - c));
#pragma GCC unroll 2
        for (int i = 0; i < R; i++) {
            __m256 d = _mm256_and_ps(_mm256_sub_ps(ln_load8(x + i * D + c, D - c), vmean[i]), k);
            s0[i] = _mm256_fmadd_ps(d, d, s0[i]);
        }
    }
#pragma GCC unroll 2
    for (int i = 0; i < R; i++) {
        float var = ln_hsum8(_mm256_add_ps(s0[i], s1[i])) / (float)D;
        float rstd = 1.0f / sqrtf(var + eps);
        rs[i] = rstd;
        vrstd[i] = _mm256_set1_ps(rstd);
    }
    for (c = 0; c < D; c += 8) {
        __m256 vw = ln_load8(w + c, D - c), vb = ln_load8(b + c, D - c);
#pragma GCC unroll 2
        for (int i = 0; i < R; i++) {
            __m256 xh = _mm256_mul_ps(_mm256_sub_ps(ln_load8(x + i * D + c, D - c), vmean[i]), vrstd[i]);
            ln_store8(y + i * D + c, D - c, _mm256_fmadd_ps(xh, vw, vb));
        }
    }
}

TF_TARGET_AVX2 static void layernorm_forward_rows_avx2(float *out, float *mean, float *rstd,
                                                       const float *x, const float *w,
                                                       const float *b, long r0, long r1,
                                                       long D, float eps)
{
    long r = r0;
    for (; r + 2 <= r1; r += 2)
        layernorm_rows_avx2(out + r * D, mean + r, rstd + r, x + r * D, w, b, D, eps, 2);
    for (; r < r1; r++)
        layernorm_rows_avx2(out + r * D, mean + r, rstd + r, x + r * D, w, b, D, eps, 1);
}

/* R consecutive rows of the backward (as layernorm_backward_rows_avx512). */
TF_TARGET_AVX2 static TF_ALWAYS_INLINE void layernorm_backward_rows_avx2(
    float *dx, float *dwp, float *dbp, const float *dy, const float *x, const float *w,
    const float *mean, const float *rstd, long D, int acc, const int R)
{
    __m256 vmean[2], vrstd[2], sg[2], sgx[2], va[2], vb[2];
#pragma GCC unroll 2
    for (int i = 0; i < R; i++) {
        vmean[i] = _mm256_set1_ps(mean[i]);
        vrstd[i] = _mm256_set1_ps(rstd[i]);
        sg[i] = sgx[i] = _mm256_setzero_ps();
    }
    for (long c = 0; c < D; c += 8) {
        long cnt = D - c;
        __m256 k = _mm256_castsi256_ps(tf_lanes8(cnt));
        __m256 vw = ln_load8(w + c, cnt);
        __m256 dwv = ln_load8(dwp + c, cnt), dbv = ln_load8(dbp + c, cnt);
#pragma GCC unroll 2
        for (int i = 0; i < R; i++) {
            __m256 vdy = ln_load8(dy + i * D + c, cnt);
            __m256 xh = _mm256_and_ps(_mm256_mul_ps(_mm256_sub_ps(ln_load8(x + i * D + c, cnt), vmean[i]), vrstd[i]), k);
            __m256 g = _mm256_mul_ps(vdy, vw);
            sg[i] = _mm256_add_ps(sg[i], g);
            sgx[i] = _mm256_fmadd_ps(g, xh, sgx[i]);
            dwv = _mm256_fmadd_ps(vdy, xh, dwv);
            dbv = _mm256_add_ps(vdy, dbv);
        }
        ln_store8(dwp + c, cnt, dwv);
        ln_store8(dbp + c, cnt, dbv);
    }
    /* dx = rstd * (g - a - xhat * b) = g * rstd - ((x - mean) * (rstd^2 * b) + rstd * a) */
#pragma GCC unroll 2
    for (int i = 0; i < R; i++) {
        float a = ln_hsum8(sg[i]) / (float)D, bb = ln_hsum8(sgx[i]) / (float)D;
        float r = rstd[i];
        va[i] = _mm256_set1_ps(r * a);
        vb[i] = _mm256_set1_ps(r * r * bb);
    }
    for (long c = 0; c < D; c += 8) {
        long cnt = D - c;
        __m256 vw = ln_load8(w + c, cnt);
#pragma GCC unroll 2
        for (int i = 0; i < R; i++) {
            __m256 d = _mm256_sub_ps(ln_load8(x + i * D + c, cnt), vmean[i]);
            __m256 g = _mm256_mul_ps(ln_load8(dy + i * D + c, cnt), vw);
            __m256 v = _mm256_fmsub_ps(g, vrstd[i], _mm256_fmadd_ps(d, vb[i], va[i]));
            if (acc) v = _mm256_add_ps(ln_load8(dx + i * D + c, cnt), v);
            ln_store8(dx + i * D + c, cnt, v);
        }
    }
}

TF_TARGET_AVX2 static void layernorm_backward_chunk_avx2(float *dx, float *dwp, float *dbp,
                                                         const float *dy, const float *x,
                                                         const float *w, const float *mean,
                                                         const float *rstd, long r0, long r1,
                                                         long D, int acc)
{
    long r = r0;
    for (; r + 2 <= r1; r += 2)
        layernorm_backward_rows_avx2(dx + r * D, dwp, dbp, dy + r * D, x + r * D, w, mean + r,
                                     rstd + r, D, acc, 2);
    for (; r < r1; r++)
        layernorm_backward_rows_avx2(dx + r * D, dwp, dbp, dy + r * D, x + r * D, w, mean + r,
                                     rstd + r, D, acc, 1);
}

/* ------------------------------------------------------------------------- */
/* ScaleNorm's rows at AVX-512 and AVX2: dot8's eight double lanes (lane j % 8) in registers, each
 * lane's products (exact in double: float times float) added in dot8's order, then dot8's pairwise
 * sum; a short row's missing lanes add +0.0, which leaves a sum that is never -0.0 as it is. The
 * element-wise parts round each product on its own as the plain C does (TF_ROUNDED: GCC would fuse
 * a product into the next add under these targets' FMA), so every level gives the plain C's bits. */

static inline double sn_pairwise(const double *l)
{
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* The first min(count, 8) floats at src, zeros past them (through a 16-lane mask: SIMDe, the
 * ARM64 build's, has no 8-lane mask type). */
TF_TARGET_AVX512 static inline __m256 sn_load8(const float *src, long count)
{
    return _mm512_castps512_ps256(_mm512_maskz_loadu_ps(tf_lanes16(count < 8 ? count : 8), src));
}

/* dot8(a, b, inv, D) (b NULL: a . a) */
TF_TARGET_AVX512 static inline double sn_dot_avx512(const float *a, const float *b, float inv, long D)
{
    __m512d s = _mm512_setzero_pd();
    const __m256 vinv = _mm256_set1_ps(inv);
    for (long j = 0; j < D; j += 8) {
        const __m256 va = sn_load8(a + j, D - j);
        const __m256 vb = b ? _mm256_mul_ps(sn_load8(b + j, D - j), vinv) : va;
        s = _mm512_add_pd(s, _mm512_mul_pd(_mm512_cvtps_pd(va), _mm512_cvtps_pd(vb)));
    }
    double l[8];
    _mm512_storeu_pd(l, s);
    return sn_pairwise(l);
}

/* o = x * scale over one row */
TF_TARGET_AVX512 static void sn_scale_avx512(float *o, const float *x, float scale, long D)
{
    const __m512 vs = _mm512_set1_ps(scale);
    for (long j = 0; j < D; j += 16) {
        const __mmask16 k = tf_lanes16(D - j);
        _mm512_mask_storeu_ps(o + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + j), vs));
    }
}

/* o (+)= scale * (dy - (x * inv) * d) over one row */
TF_TARGET_AVX512 static void sn_grad_avx512(float *o, const float *x, const float *dy, float inv, float d,
                                            float scale, long D, int acc)
{
    const __m512 vd = _mm512_set1_ps(d), vs = _mm512_set1_ps(scale), vinv = _mm512_set1_ps(inv);
    for (long j = 0; j < D; j += 16) {
        const __mmask16 k = tf_lanes16(D - j);
        __m512 p = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + j), vinv), vd);
        TF_ROUNDED(p);
        __m512 v = _mm512_mul_ps(vs, _mm512_sub_ps(_mm512_maskz_loadu_ps(k, dy + j), p));
        TF_ROUNDED(v);
        if (acc) v = _mm512_add_ps(_mm512_maskz_loadu_ps(k, o + j), v);
        _mm512_mask_storeu_ps(o + j, k, v);
    }
}

TF_TARGET_AVX2 static inline double sn_dot_avx2(const float *a, const float *b, float inv, long D)
{
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    const __m256 vinv = _mm256_set1_ps(inv);
    for (long j = 0; j < D; j += 8) {
        const __m256 va = ln_load8(a + j, D - j);
        const __m256 vb = b ? _mm256_mul_ps(ln_load8(b + j, D - j), vinv) : va;
        lo = _mm256_add_pd(lo, _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(va)),
                                             _mm256_cvtps_pd(_mm256_castps256_ps128(vb))));
        hi = _mm256_add_pd(hi, _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(va, 1)),
                                             _mm256_cvtps_pd(_mm256_extractf128_ps(vb, 1))));
    }
    double l[8];
    _mm256_storeu_pd(l, lo);
    _mm256_storeu_pd(l + 4, hi);
    return sn_pairwise(l);
}

TF_TARGET_AVX2 static void sn_scale_avx2(float *o, const float *x, float scale, long D)
{
    const __m256 vs = _mm256_set1_ps(scale);
    for (long j = 0; j < D; j += 8) ln_store8(o + j, D - j, _mm256_mul_ps(ln_load8(x + j, D - j), vs));
}

TF_TARGET_AVX2 static void sn_grad_avx2(float *o, const float *x, const float *dy, float inv, float d,
                                        float scale, long D, int acc)
{
    const __m256 vd = _mm256_set1_ps(d), vs = _mm256_set1_ps(scale), vinv = _mm256_set1_ps(inv);
    for (long j = 0; j < D; j += 8) {
        __m256 p = _mm256_mul_ps(_mm256_mul_ps(ln_load8(x + j, D - j), vinv), vd);
        TF_ROUNDED(p);
        __m256 v = _mm256_mul_ps(vs, _mm256_sub_ps(ln_load8(dy + j, D - j), p));
        TF_ROUNDED(v);
        if (acc) v = _mm256_add_ps(ln_load8(o + j, D - j), v);
        ln_store8(o + j, D - j, v);
    }
}
#endif /* TF_HAVE_X86 */

/* ------------------------------------------------------------------------- */

void layernorm_forward_rows(float *out, float *mean, float *rstd, const float *x, const float *weight,
                            const float *bias, long r0, long r1, long D, float eps)
{
#if TF_HAVE_X86
    const int isa = tf_isa();
    if (isa >= TF_ISA_AVX512) {
        layernorm_forward_rows_avx512(out, mean, rstd, x, weight, bias, r0, r1, D, eps);
        return;
    }
    if (isa >= TF_ISA_AVX2) {
        layernorm_forward_rows_avx2(out, mean, rstd, x, weight, bias, r0, r1, D, eps);
        return;
    }
#endif
    for (long r = r0; r < r1; r++)
        layernorm_row_generic(out + r * D, mean + r, rstd + r, x + r * D, weight, bias, D, eps);
}

/* The calling thread's share [*r0, *r1) of N rows, split evenly over its team (all N outside one). */
static inline void team_rows(long N, long *r0, long *r1)
{
    *r0 = 0;
    *r1 = N;
#ifdef _OPENMP
    const int team = omp_get_num_threads(), t = omp_get_thread_num();
    *r0 = N / team * t + (t < N % team ? t : N % team);
    *r1 = *r0 + N / team + (t < N % team ? 1 : 0);
#endif
}

void layernorm_forward(float *out, float *mean, float *rstd, const float *x, const float *weight,
                       const float *bias, long N, long D, float eps)
{
    if (N == 0 || D == 0) return;
#pragma omp parallel num_threads(tf_team(N * D, LAYERNORM_GRAIN))
    {
        long r0, r1;
        team_rows(N, &r0, &r1);
        layernorm_forward_rows(out, mean, rstd, x, weight, bias, r0, r1, D, eps);
    }
}

/* sum over j of a[j] * b[j] in double: eight running sums, lane j % 8, then added pairwise in a
 * fixed order (independent chains: the loop vectorises; the same bits at every SIMD level). b NULL:
 * a[j] * a[j]; inv != 1: b[j] * inv rounded to float first, as the caller computes it. */
static inline double dot8(const float *a, const float *b, float inv, long D)
{
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    long j = 0;
    for (; j + 8 <= D; j += 8)
        for (int l = 0; l < 8; l++) {
            const float bj = b ? b[j + l] * inv : a[j + l];
            s[l] += (double)a[j + l] * (double)bj;
        }
    for (int l = 0; j < D; j++, l++) {
        const float bj = b ? b[j] * inv : a[j];
        s[l] += (double)a[j] * (double)bj;
    }
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

static void sn_scale_generic(float *o, const float *x, float scale, long D)
{
    for (long j = 0; j < D; j++) o[j] = x[j] * scale;
}

static void sn_grad_generic(float *o, const float *x, const float *dy, float inv, float d, float scale,
                            long D, int acc)
{
    for (long j = 0; j < D; j++) {
        const float v = scale * (dy[j] - (x[j] * inv) * d);
        o[j] = acc ? o[j] + v : v;
    }
}

/* One level's pieces of a ScaleNorm row (the same bits at every level): dot8, the forward's
 * scaled copy, the backward's row. */
typedef struct {
    double (*dot)(const float *a, const float *b, float inv, long D);
    void (*scale)(float *o, const float *x, float scale, long D);
    void (*grad)(float *o, const float *x, const float *dy, float inv, float d, float scale, long D, int acc);
} sn_row_kernels;

static sn_row_kernels sn_pick(void)
{
#if TF_HAVE_X86
    const int isa = tf_isa();
    if (isa >= TF_ISA_AVX512) return (sn_row_kernels){sn_dot_avx512, sn_scale_avx512, sn_grad_avx512};
    if (isa >= TF_ISA_AVX2) return (sn_row_kernels){sn_dot_avx2, sn_scale_avx2, sn_grad_avx2};
#endif
    return (sn_row_kernels){dot8, sn_scale_generic, sn_grad_generic};
}

void scalenorm_forward_rows(float *out, float *norms, const float *x, float g, long r0, long r1,
                            long D, float eps)
{
    const sn_row_kernels k = sn_pick();
    for (long r = r0; r < r1; r++) {
        const float *xr = x + r * D;
        float norm = (float)sqrt(k.dot(xr, NULL, 1.0f, D));
        norm = norm <= eps ? eps : norm;            /* a NaN row stays NaN */
        norms[r] = norm;
        k.scale(out + r * D, xr, g / norm, D);
    }
}

/* Rows [r0, r1) of scalenorm_backward, each row's sum(dout * x_hat) to dots[r]. */
void scalenorm_backward_rows(float *dx, double *dots, const float *dout, const float *x,
                             const float *norms, float g, long r0, long r1, long D, float eps,
                             int accumulate)
{
    const sn_row_kernels k = sn_pick();
    for (long r = r0; r < r1; r++) {
        const float *xr = x + r * D, *dy = dout + r * D;
        const float m = norms[r], inv = 1.0f / m;
        const double dot = k.dot(dy, xr, inv, D);
        dots[r] = dot;
        k.grad(dx + r * D, xr, dy, inv, m <= eps ? 0.0f : (float)dot, g / m, D, accumulate);
    }
}

void scalenorm_forward(float *out, float *norms, const float *x, float g, long N, long D, float eps)
{
    if (N == 0) return;
#pragma omp parallel num_threads(tf_team(N * D, LAYERNORM_GRAIN))
    {
        long r0, r1;
        team_rows(N, &r0, &r1);
        scalenorm_forward_rows(out, norms, x, g, r0, r1, D, eps);
    }
}

/* Rows a block: each block's row sums wait on the stack (16 KB) until the block's team is done,
 * then join dg in row order, as one thread alone would add them. */
#define SN_BLOCK 2048L

void scalenorm_backward(float *dx, float *dg, const float *dout, const float *x, const float *norms, float g,
                        long N, long D, float eps, int accumulate)
{
    double dg_sum = 0.0, dots[SN_BLOCK];
    for (long b0 = 0; b0 < N; b0 += SN_BLOCK) {
        const long n = N - b0 < SN_BLOCK ? N - b0 : SN_BLOCK;
        float *dxb = dx + b0 * D;
        const float *dyb = dout + b0 * D, *xb = x + b0 * D, *nb = norms + b0;
#pragma omp parallel num_threads(tf_team(n * D, LAYERNORM_GRAIN))
        {
            long r0, r1;
            team_rows(n, &r0, &r1);
            scalenorm_backward_rows(dxb, dots, dyb, xb, nb, g, r0, r1, D, eps, accumulate);
        }
        for (long r = 0; r < n; r++) dg_sum += dots[r];
    }
    if (dg) *dg += (float)dg_sum;
}

void scalenorm_forward_at(float *out, float *norms, const float *x, float g, const int64_t *rows,
                          long n, long D, float eps)
{
    if (n == 0) return;
#pragma omp parallel num_threads(tf_team(n * D, LAYERNORM_GRAIN))
    {
        long i0, i1;
        team_rows(n, &i0, &i1);
        for (long i = i0; i < i1; i++) scalenorm_forward_rows(out, norms, x, g, rows[i], rows[i] + 1, D, eps);
    }
}

void scalenorm_backward_at(float *dx, float *dout, const float *x, const float *norms, float g,
                           const int64_t *rows, long n, long D, float eps)
{
    if (n == 0) return;
#pragma omp parallel num_threads(tf_team(n * D, LAYERNORM_GRAIN))
    {
        long i0, i1;
        team_rows(n, &i0, &i1);
        for (long i = i0; i < i1; i++) {
            const long r = rows[i];
            double dot[1];
            /* dots[r] lands in dot[0] */
            scalenorm_backward_rows(dx + r * D, dot, dout + r * D, x + r * D, norms + r, g, 0, 1, D, eps, 1);
            memset(dout + r * D, 0, (size_t)D * sizeof(float));
        }
    }
}

size_t layernorm_backward_scratch(long N, long D)
{
    long chunks = (N + LAYERNORM_CHUNK - 1) / LAYERNORM_CHUNK;
    return (size_t)(2 * chunks) * (size_t)D;
}

void layernorm_backward_chunk(float *dx, float *dwp, float *dbp, const float *dout, const float *x,
                              const float *weight, const float *mean, const float *rstd, long r0,
                              long r1, long D, int accumulate)
{
    memset(dwp, 0, (size_t)D * sizeof(float));
    memset(dbp, 0, (size_t)D * sizeof(float));
#if TF_HAVE_X86
    const int isa = tf_isa();
    if (isa >= TF_ISA_AVX512) {
        layernorm_backward_chunk_avx512(dx, dwp, dbp, dout, x, weight, mean, rstd, r0, r1, D, accumulate);
        return;
    }
    if (isa >= TF_ISA_AVX2) {
        layernorm_backward_chunk_avx2(dx, dwp, dbp, dout, x, weight, mean, rstd, r0, r1, D, accumulate);
        return;
    }
#endif
    for (long r = r0; r < r1; r++)
        layernorm_backward_row_generic(dx + r * D, dwp, dbp, dout + r * D, x + r * D, weight,
                                       mean[r], rstd[r], D, accumulate);
}

void layernorm_add_partials(float *dweight, float *dbias, const float *scratch, long chunks, long D,
                            long c0, long c1)
{
    for (; c0 < c1; c0 += 64) {
        long width = c1 - c0 < 64 ? c1 - c0 : 64;
        float sw[64], sb[64];
        for (long j = 0; j < width; j++) sw[j] = sb[j] = 0.0f;
        for (long ch = 0; ch < chunks; ch++) {
            const float *dwp = scratch + 2 * ch * D + c0, *dbp = dwp + D;
            for (long j = 0; j < width; j++) {
                sw[j] += dwp[j];
                sb[j] += dbp[j];
            }
        }
        for (long j = 0; j < width; j++) {
            dweight[c0 + j] += sw[j];
            dbias[c0 + j] += sb[j];
        }
    }
}

void layernorm_backward(float *dx, float *dweight, float *dbias, float *scratch, const float *dout,
                        const float *x, const float *weight, const float *mean, const float *rstd,
                        long N, long D, int accumulate)
{
    if (N == 0 || D == 0) return;
    const long chunks = (N + LAYERNORM_CHUNK - 1) / LAYERNORM_CHUNK;
#pragma omp parallel num_threads(tf_team(N * D, LAYERNORM_GRAIN))
    {
        /* dx by rows; each fixed chunk of rows sums its dweight/dbias partials. */
#pragma omp for schedule(static)
        for (long ch = 0; ch < chunks; ch++) {
            long r1 = (ch + 1) * LAYERNORM_CHUNK < N ? (ch + 1) * LAYERNORM_CHUNK : N;
            layernorm_backward_chunk(dx, scratch + 2 * ch * D, scratch + (2 * ch + 1) * D, dout, x,
                                     weight, mean, rstd, ch * LAYERNORM_CHUNK, r1, D, accumulate);
        }
        /* The partials, added in chunk order: columns in blocks of 64 per iteration. */
#pragma omp for schedule(static)
        for (long c0 = 0; c0 < D; c0 += 64)
            layernorm_add_partials(dweight, dbias, scratch, chunks, D, c0, c0 + 64 < D ? c0 + 64 : D);
    }
}
