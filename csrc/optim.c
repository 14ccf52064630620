/* Fused Adam/AdamW and the global-norm helpers; see optim.h.
 *
 * PyTorch's single-tensor Adam runs one kernel per line of its Python code (lerp_, mul_,
 * addcmul_, sqrt, div, add_, addcdiv_), each rounding its result to float32. Here the same
 * operations run in registers in one pass over the four buffers, with the same float32
 * roundings and the same fused multiply-adds where PyTorch's kernels use them (lerp,
 * add(alpha=) and addcmul, whose `self + value * t1 * t2` its compiler contracts into
 * fma(value * t1, t2, self)), so the update is PyTorch's bit for bit (checked element by
 * element in tests/test_optim.py). Every element is computed by the same code whatever thread
 * handles it.
 */
/* a*b + c must stay two roundings where PyTorch rounds twice: no contraction into fma. */
#pragma GCC optimize("fp-contract=off")
#pragma STDC FP_CONTRACT OFF

#include "optim.h"
#include "cpu.h"

#include <math.h>
#include <string.h>

#include "simd.h"
#if TF_HAVE_X86
#define TF_X86 1
#define TARGET_AVX512 TF_TARGET_AVX512
#define TARGET_AVX2 TF_TARGET_AVX2
#endif

#define ADAM_BLOCK 4096L        /* elements per scheduling unit */
#define ADAM_GRAIN (1L << 16)   /* elements per thread below which fewer threads run */
#define STREAM_GRAIN (1L << 17) /* same, for sum_squares and scale */

/* The scalars of one step, rounded to float32 the way PyTorch's kernels round them. */
typedef struct {
    int decay_param;  /* AdamW with wd != 0: p *= decay */
    float decay;
    int l2_grad;      /* Adam with wd != 0: g += wd * p */
    float wd;
    int lerp_small;   /* |w1| < 0.5: m + w1 (g - m); else g - (1 - w1)(g - m) */
    float lerp_coeff; /* w1, or w1 - 1 */
    float beta2;
    float one_minus_beta2;
    float bc2_sqrt;   /* sqrt(1 - beta2^step) */
    float eps;
    float neg_step_size; /* -lr / (1 - beta1^step) */
} adam_scalars;

/* ------------------------------------------------------------------------------------------ */

/* Generic C, one element at a time: the naive reference and the fallback. */
static void adam_generic(const adam_scalars *k, float *p, const float *gr, float *ma, float *va,
                         long n)
{
    for (long i = 0; i < n; i++) {
        float param = p[i], g = gr[i], m = ma[i], v = va[i];
        if (k->decay_param) param = param * k->decay;
        if (k->l2_grad) g = fmaf(param, k->wd, g);
        m = fmaf(k->lerp_coeff, g - m, k->lerp_small ? m : g);
        v = v * k->beta2;
        v = fmaf(k->one_minus_beta2 * g, g, v);
        float denom = sqrtf(v) / k->bc2_sqrt + k->eps;
        param = param + (k->neg_step_size * m) / denom;
        p[i] = param;
        ma[i] = m;
        va[i] = v;
    }
}

#ifdef TF_X86
TARGET_AVX512 static inline void adam16_avx512(const adam_scalars *k, float *p, const float *gr,
                                               float *ma, float *va, __mmask16 mask)
{
    __m512 param = _mm512_maskz_loadu_ps(mask, p), g = _mm512_maskz_loadu_ps(mask, gr);
    __m512 m = _mm512_maskz_loadu_ps(mask, ma), v = _mm512_maskz_loadu_ps(mask, va);
    if (k->decay_param) param = _mm512_mul_ps(param, _mm512_set1_ps(k->decay));
    if (k->l2_grad) g = _mm512_fmadd_ps(param, _mm512_set1_ps(k->wd), g);
    m = _mm512_fmadd_ps(_mm512_set1_ps(k->lerp_coeff), _mm512_sub_ps(g, m), k->lerp_small ? m : g);
    v = _mm512_mul_ps(v, _mm512_set1_ps(k->beta2));
    v = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(k->one_minus_beta2), g), g, v);
    __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), _mm512_set1_ps(k->bc2_sqrt)),
                                 _mm512_set1_ps(k->eps));
    param = _mm512_add_ps(param, _mm512_div_ps(_mm512_mul_ps(_mm512_set1_ps(k->neg_step_size), m), denom));
    _mm512_mask_storeu_ps(p, mask, param);
    _mm512_mask_storeu_ps(ma, mask, m);
    _mm512_mask_storeu_ps(va, mask, v);
}

TARGET_AVX512 static void adam_avx512(const adam_scalars *k, float *p, const float *gr, float *ma,
                                      float *va, long n)
{
    long i = 0;
    for (; i + 16 <= n; i += 16) adam16_avx512(k, p + i, gr + i, ma + i, va + i, (__mmask16)0xFFFF);
    if (i < n) adam16_avx512(k, p + i, gr + i, ma + i, va + i, (__mmask16)((1u << (n - i)) - 1u));
}

TARGET_AVX2 static inline __m256 adam8_avx2(const adam_scalars *k, __m256 param, __m256 g,
                                            __m256 *m_io, __m256 *v_io)
{
    __m256 m = *m_io, v = *v_io;
    if (k->decay_param) param = _mm256_mul_ps(param, _mm256_set1_ps(k->decay));
    if (k->l2_grad) g = _mm256_fmadd_ps(param, _mm256_set1_ps(k->wd), g);
    m = _mm256_fmadd_ps(_mm256_set1_ps(k->lerp_coeff), _mm256_sub_ps(g, m), k->lerp_small ? m : g);
    v = _mm256_mul_ps(v, _mm256_set1_ps(k->beta2));
    v = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(k->one_minus_beta2), g), g, v);
    __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), _mm256_set1_ps(k->bc2_sqrt)),
                                 _mm256_set1_ps(k->eps));
    param = _mm256_add_ps(param, _mm256_div_ps(_mm256_mul_ps(_mm256_set1_ps(k->neg_step_size), m), denom));
    *m_io = m;
    *v_io = v;
    return param;
}

TARGET_AVX2 static void adam_avx2(const adam_scalars *k, float *p, const float *gr, float *ma,
                                  float *va, long n)
{
    long i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 m = _mm256_loadu_ps(ma + i), v = _mm256_loadu_ps(va + i);
        __m256 param = adam8_avx2(k, _mm256_loadu_ps(p + i), _mm256_loadu_ps(gr + i), &m, &v);
        _mm256_storeu_ps(p + i, param);
        _mm256_storeu_ps(ma + i, m);
        _mm256_storeu_ps(va + i, v);
    }
    if (i < n) {
        __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)),
                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 m = _mm256_maskload_ps(ma + i, mask), v = _mm256_maskload_ps(va + i, mask);
        __m256 param = adam8_avx2(k, _mm256_maskload_ps(p + i, mask), _mm256_maskload_ps(gr + i, mask), &m, &v);
        _mm256_maskstore_ps(p + i, mask, param);
        _mm256_maskstore_ps(ma + i, mask, m);
        _mm256_maskstore_ps(va + i, mask, v);
    }
}
#endif

typedef void (*adam_fn)(const adam_scalars *, float *, const float *, float *, float *, long);

void adam_update(float *params, const float *grads, float *exp_avg, float *exp_avg_sq, long n,
                 long step, double lr, double beta1, double beta2, double eps,
                 double weight_decay, int decoupled)
{
    /* The scalars as torch/optim/adam.py computes them in Python floats (double), then as its
     * kernels receive them: converted to float32. */
    adam_scalars k;
    k.decay_param = decoupled && weight_decay != 0.0;
    k.decay = (float)(1.0 - lr * weight_decay);
    k.l2_grad = !decoupled && weight_decay != 0.0;
    k.wd = (float)weight_decay;
    const float w1 = (float)(1.0 - beta1);
    k.lerp_small = fabsf(w1) < 0.5f;
    k.lerp_coeff = k.lerp_small ? w1 : w1 - 1.0f;
    k.beta2 = (float)beta2;
    k.one_minus_beta2 = (float)(1.0 - beta2);
    const double bias_correction1 = 1.0 - pow(beta1, (double)step);
    const double bias_correction2 = 1.0 - pow(beta2, (double)step);
    k.bc2_sqrt = (float)pow(bias_correction2, 0.5);
    k.eps = (float)eps;
    k.neg_step_size = (float)(-(lr / bias_correction1));

    adam_fn fn = adam_generic;
#ifdef TF_X86
    int isa = tf_isa();
    if (isa >= TF_ISA_AVX512) fn = adam_avx512;
    else if (isa >= TF_ISA_AVX2) fn = adam_avx2;
#endif
    const long blocks = (n + ADAM_BLOCK - 1) / ADAM_BLOCK;
#pragma omp parallel for schedule(static) num_threads(tf_team(n, ADAM_GRAIN))
    for (long b = 0; b < blocks; b++) {
        long i = b * ADAM_BLOCK;
        long len = n - i < ADAM_BLOCK ? n - i : ADAM_BLOCK;
        fn(&k, params + i, grads + i, exp_avg + i, exp_avg_sq + i, len);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* sum of squares in double, one partial per fixed chunk */

static double sumsq_generic(const float *x, long n)
{
    double s = 0.0;
    for (long i = 0; i < n; i++) s += (double)x[i] * (double)x[i];
    return s;
}

#ifdef TF_X86
TARGET_AVX512 static double sumsq_avx512(const float *x, long n)
{
    __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    long i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 u = _mm512_loadu_ps(x + i), w = _mm512_loadu_ps(x + i + 16);
        __m512d u0 = _mm512_cvtps_pd(_mm512_castps512_ps256(u));
        __m512d u1 = _mm512_cvtps_pd(_mm512_extractf32x8_ps(u, 1));
        __m512d w0 = _mm512_cvtps_pd(_mm512_castps512_ps256(w));
        __m512d w1 = _mm512_cvtps_pd(_mm512_extractf32x8_ps(w, 1));
        a0 = _mm512_fmadd_pd(u0, u0, a0);
        a1 = _mm512_fmadd_pd(u1, u1, a1);
        a2 = _mm512_fmadd_pd(w0, w0, a2);
        a3 = _mm512_fmadd_pd(w1, w1, a3);
    }
    for (; i < n; i += 16) {
        __mmask16 mask = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        __m512 u = _mm512_maskz_loadu_ps(mask, x + i);
        __m512d u0 = _mm512_cvtps_pd(_mm512_castps512_ps256(u));
        __m512d u1 = _mm512_cvtps_pd(_mm512_extractf32x8_ps(u, 1));
        a0 = _mm512_fmadd_pd(u0, u0, a0);
        a1 = _mm512_fmadd_pd(u1, u1, a1);
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3)));
}

TARGET_AVX2 static double sumsq_avx2(const float *x, long n)
{
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 u = _mm256_loadu_ps(x + i), w = _mm256_loadu_ps(x + i + 8);
        __m256d u0 = _mm256_cvtps_pd(_mm256_castps256_ps128(u));
        __m256d u1 = _mm256_cvtps_pd(_mm256_extractf128_ps(u, 1));
        __m256d w0 = _mm256_cvtps_pd(_mm256_castps256_ps128(w));
        __m256d w1 = _mm256_cvtps_pd(_mm256_extractf128_ps(w, 1));
        a0 = _mm256_fmadd_pd(u0, u0, a0);
        a1 = _mm256_fmadd_pd(u1, u1, a1);
        a2 = _mm256_fmadd_pd(w0, w0, a2);
        a3 = _mm256_fmadd_pd(w1, w1, a3);
    }
    __m256d s = _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3));
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    double total = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    for (; i < n; i++) total += (double)x[i] * (double)x[i];
    return total;
}
#endif

double sum_squares_f32(const float *x, long n, double *chunk_sums)
{
    double (*fn)(const float *, long) = sumsq_generic;
#ifdef TF_X86
    int isa = tf_isa();
    if (isa >= TF_ISA_AVX512) fn = sumsq_avx512;
    else if (isa >= TF_ISA_AVX2) fn = sumsq_avx2;
#endif
    const long chunks = (n + TF_SUMSQ_CHUNK - 1) / TF_SUMSQ_CHUNK;
#pragma omp parallel for schedule(static) num_threads(tf_team(n, STREAM_GRAIN))
    for (long c = 0; c < chunks; c++) {
        long i = c * TF_SUMSQ_CHUNK;
        chunk_sums[c] = fn(x + i, n - i < TF_SUMSQ_CHUNK ? n - i : TF_SUMSQ_CHUNK);
    }
    double total = 0.0;
    for (long c = 0; c < chunks; c++) total += chunk_sums[c];
    return total;
}

void scale_f32(float *x, long n, float s)
{
#pragma omp parallel for simd schedule(static) num_threads(tf_team(n, STREAM_GRAIN))
    for (long i = 0; i < n; i++) x[i] *= s;
}

void zero_f32(float *x, long n)
{
    const int team = tf_team(n, STREAM_GRAIN);
    const long chunk = (n + team - 1) / team;
#pragma omp parallel for schedule(static) num_threads(team)
    for (int t = 0; t < team; t++) {
        long i = (long)t * chunk;
        if (i < n) memset(x + i, 0, (size_t)(n - i < chunk ? n - i : chunk) * sizeof(float));
    }
}
