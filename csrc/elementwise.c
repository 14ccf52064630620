/* Residual add, bias, ReLU/GELU forward and backward (see elementwise.h). */
#include "elementwise.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu.h"
#include "simd_math.h"

#include "simd.h"
#if TF_HAVE_X86
#define TF_X86 1
#define AVX512_TARGET TF_TARGET_AVX512
#define AVX2_TARGET TF_TARGET_AVX2
#endif

/* Elements per thread below which a call stays on fewer threads (waking a team costs a few
 * microseconds; a memory-bound op moves ~10 GB/s per core). GELU is compute-heavier. */
#define COPY_GRAIN 32768
#define GELU_GRAIN 8192
/* bias_grad sums rows in blocks of this many, then the block sums: error ~(64 + N/64) ulp. */
#define BIAS_ROW_BLOCK 64

/* Thread t's share [*i0, *i1) of n elements, cut at multiples of 16 (one cache line). */
static inline void split_range(size_t n, int t, int team, size_t *i0, size_t *i1)
{
    *i0 = (n * (size_t)t / (size_t)team) & ~(size_t)15;
    *i1 = t == team - 1 ? n : (n * (size_t)(t + 1) / (size_t)team) & ~(size_t)15;
}

static inline size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* Keep a product rounded on its own (no FMA contraction by the compiler), so dx += dout * act'
 * gives the same bits as computing dout * act' and adding it afterwards. */
#define ROUNDED(v) TF_ROUNDED(v)

size_t elementwise_stream_bytes(void)
{
    /* Fixed rather than sysconf(_SC_LEVEL3_CACHE_SIZE): in virtual machines that reports the
     * host's whole L3 (384 MiB here) while a core sees one 32 MiB slice. */
    return (size_t)32 << 20;
}

/* Elements from p to the next `align`-byte boundary, at most n (p must be 4-byte aligned). */
static inline size_t head_to_align(const float *p, size_t align, size_t n)
{
    size_t h = ((align - ((uintptr_t)p & (align - 1))) & (align - 1)) / sizeof(float);
    return h < n ? h : n;
}

/* ---- GELU, scalar (generic level and references): double-precision libm ------------------ */

#define INV_SQRT_2PI 0.39894228040143267794

static inline float gelu_scalar(float x)
{
    double xd = x;
    return (float)(xd * 0.5 * erfc(-xd * M_SQRT1_2));
}

static inline float gelu_grad_scalar(float x)
{
    double xd = x;
    double cdf = 0.5 * erfc(-xd * M_SQRT1_2);
    double pdf = exp(-0.5 * xd * xd) * INV_SQRT_2PI;
    return (float)(cdf + xd * pdf);
}

static inline float silu_scalar(float x)
{
    double xd = x;
    return (float)(xd / (1.0 + exp(-xd)));
}

static inline float silu_grad_scalar(float x)
{
    double xd = x;
    double s = 1.0 / (1.0 + exp(-xd));
    return (float)(s * (1.0 + xd * (1.0 - s)));
}

static inline float act_scalar(float x, int act)
{
    if (act == TF_ACT_GELU) return gelu_scalar(x);
    if (act == TF_ACT_SILU) return silu_scalar(x);
    return x < 0.0f ? 0.0f : x;   /* keeps NaN, as torch.relu */
}

/* dout * act'(x); ReLU gives +0 where x <= 0 and passes dout elsewhere (PyTorch's) */
static inline float act_grad_scalar(float x, float dout, int act)
{
    if (act == TF_ACT_GELU) return dout * gelu_grad_scalar(x);
    if (act == TF_ACT_SILU) return dout * silu_grad_scalar(x);
    return x <= 0.0f ? 0.0f : dout;   /* NaN passes dout, as torch's threshold_backward */
}

/* ---- GELU, vector: Phi(x) = t Q(t) exp(-x^2/2) for x < 0, 1 - Phi(-x) for x >= 0 ---------
 * t = 1 / (1 + |x| / (2 sqrt 2)); Q(t) = Phi(-|x|) exp(x^2/2) / t fitted on t in [0.17, 1]
 * (|x| <= 13.3) by a degree-10 polynomial, relative error 3e-9 in exact arithmetic, ~1 ulp
 * evaluated in float. exp(-x^2/2) takes x^2/2 = h + l exactly (FMA), reduces by n ln 2
 * (Cody-Waite) and uses a degree-6 polynomial (~1 ulp). Below x = -13.19 (h > 87) Phi is
 * flushed to 0 (it is < 1.2e-38 there). */
#define GELU_T_SCALE 0.35355339059327373f   /* 1 / (2 sqrt 2) */
#define GQ0 0x1.20db98p-3f
#define GQ1 0x1.210bb6p-3f
#define GQ2 0x1.f5bf9cp-4f
#define GQ3 0x1.7e35d8p-4f
#define GQ4 0x1.a3cc2cp-6f
#define GQ5 0x1.6764dep-6f
#define GQ6 (-0x1.206498p-6f)
#define GQ7 (-0x1.1a7112p-3f)
#define GQ8 0x1.7d3a58p-3f
#define GQ9 (-0x1.8016eep-4f)
#define GQ10 0x1.2034d6p-6f
#define EXP_P2 0x1.fffff8p-2f
#define EXP_P3 0x1.55548cp-3f
#define EXP_P4 0x1.555b54p-5f
#define EXP_P5 0x1.123d32p-7f
#define EXP_P6 0x1.688510p-10f
#define LN2_HI 0.693359375f             /* 9 significant bits: n * LN2_HI is exact */
#define LN2_LO (-2.12194440e-4f)
#define LOG2E 1.44269504088896341f
#define EXP_FLUSH 87.0f                 /* h = x^2/2 above this: exp(-h) flushed to 0 */

#ifdef TF_X86
/* Phi(x) and *ex = exp(-x^2/2) (0 where flushed), 16 lanes. */
AVX512_TARGET static inline __m512 gelu_phi_avx512(__m512 x, __m512 *ex_out)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    __m512 ax = _mm512_abs_ps(x);
    __m512 t = _mm512_div_ps(one, _mm512_fmadd_ps(ax, _mm512_set1_ps(GELU_T_SCALE), one));
    __m512 q = _mm512_set1_ps(GQ10);
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(GQ9));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(GQ8));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(GQ7));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(GQ6));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(GQ5));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(GQ4));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(GQ3));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(GQ2));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(GQ1));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(GQ0));
    /* x^2 / 2 = h + l exactly */
    __m512 hx = _mm512_mul_ps(x, _mm512_set1_ps(0.5f));
    __m512 h = _mm512_mul_ps(hx, x);
    __m512 l = _mm512_fmsub_ps(hx, x, h);
    __mmask16 flush = _mm512_cmp_ps_mask(h, _mm512_set1_ps(EXP_FLUSH), _CMP_GT_OQ);
    h = _mm512_min_ps(_mm512_set1_ps(EXP_FLUSH), h);   /* NaN stays NaN (second operand) */
    /* exp(-h - l) = 2^n exp(r), r = -h - l - n ln2 */
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(h, _mm512_set1_ps(-LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), _mm512_sub_ps(_mm512_setzero_ps(), h));
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    r = _mm512_sub_ps(r, l);
    __m512 p = _mm512_set1_ps(EXP_P6);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P2));
    p = _mm512_fmadd_ps(p, r, one);
    p = _mm512_fmadd_ps(p, r, one);
    __m512 ex = _mm512_maskz_mov_ps((__mmask16)~flush, _mm512_scalef_ps(p, n));
    __m512 e = _mm512_mul_ps(_mm512_mul_ps(t, q), ex);              /* Phi(-|x|) */
    __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
    *ex_out = ex;
    return _mm512_mask_blend_ps(neg, _mm512_sub_ps(one, e), e);
}

AVX2_TARGET static inline __m256 gelu_phi_avx2(__m256 x, __m256 *ex_out)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
    __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(ax, _mm256_set1_ps(GELU_T_SCALE), one));
    __m256 q = _mm256_set1_ps(GQ10);
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(GQ9));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(GQ8));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(GQ7));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(GQ6));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(GQ5));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(GQ4));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(GQ3));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(GQ2));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(GQ1));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(GQ0));
    __m256 hx = _mm256_mul_ps(x, _mm256_set1_ps(0.5f));
    __m256 h = _mm256_mul_ps(hx, x);
    __m256 l = _mm256_fmsub_ps(hx, x, h);
    __m256 flush = _mm256_cmp_ps(h, _mm256_set1_ps(EXP_FLUSH), _CMP_GT_OQ);
    h = _mm256_min_ps(_mm256_set1_ps(EXP_FLUSH), h);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(h, _mm256_set1_ps(-LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), _mm256_sub_ps(_mm256_setzero_ps(), h));
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    r = _mm256_sub_ps(r, l);
    __m256 p = _mm256_set1_ps(EXP_P6);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P2));
    p = _mm256_fmadd_ps(p, r, one);
    p = _mm256_fmadd_ps(p, r, one);
    /* 2^n for n in [-126, 0]: build the exponent field (NaN lanes: garbage times NaN = NaN) */
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 ex = _mm256_andnot_ps(flush, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
    __m256 e = _mm256_mul_ps(_mm256_mul_ps(t, q), ex);
    __m256 neg = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
    *ex_out = ex;
    return _mm256_blendv_ps(_mm256_sub_ps(one, e), e, neg);
}

/* act(x), 16 / 8 lanes */
AVX512_TARGET static inline __m512 act_avx512(__m512 x, int act)
{
    if (act == TF_ACT_GELU) {
        __m512 ex;
        return _mm512_mul_ps(x, gelu_phi_avx512(x, &ex));
    }
    if (act == TF_ACT_SILU)   /* x * s(x); exp(-x) is +inf below x = -89: s = 0 */
        return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), tf_exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
    return _mm512_max_ps(_mm512_setzero_ps(), x);   /* NaN stays NaN */
}

AVX2_TARGET static inline __m256 act_avx2(__m256 x, int act)
{
    if (act == TF_ACT_GELU) {
        __m256 ex;
        return _mm256_mul_ps(x, gelu_phi_avx2(x, &ex));
    }
    if (act == TF_ACT_SILU)
        return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), tf_exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), x))));
    return _mm256_max_ps(_mm256_setzero_ps(), x);
}

/* act'(x) * g, 16 / 8 lanes */
AVX512_TARGET static inline __m512 act_grad_avx512(__m512 x, __m512 g, int act)
{
    if (act == TF_ACT_GELU) {
        __m512 ex;
        __m512 phi = gelu_phi_avx512(x, &ex);
        __m512 d = _mm512_fmadd_ps(_mm512_mul_ps(x, ex), _mm512_set1_ps((float)INV_SQRT_2PI), phi);
        return _mm512_mul_ps(g, d);
    }
    if (act == TF_ACT_SILU) {
        const __m512 one = _mm512_set1_ps(1.0f);
        __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, tf_exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
        __m512 d = _mm512_mul_ps(s, _mm512_fmadd_ps(x, _mm512_sub_ps(one, s), one));
        return _mm512_mul_ps(g, d);
    }
    __mmask16 pos = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_NLE_UQ);   /* !(x <= 0) */
    return _mm512_maskz_mov_ps(pos, g);
}

AVX2_TARGET static inline __m256 act_grad_avx2(__m256 x, __m256 g, int act)
{
    if (act == TF_ACT_GELU) {
        __m256 ex;
        __m256 phi = gelu_phi_avx2(x, &ex);
        __m256 d = _mm256_fmadd_ps(_mm256_mul_ps(x, ex), _mm256_set1_ps((float)INV_SQRT_2PI), phi);
        return _mm256_mul_ps(g, d);
    }
    if (act == TF_ACT_SILU) {
        const __m256 one = _mm256_set1_ps(1.0f);
        __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, tf_exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), x))));
        __m256 d = _mm256_mul_ps(s, _mm256_fmadd_ps(x, _mm256_sub_ps(one, s), one));
        return _mm256_mul_ps(g, d);
    }
    return _mm256_and_ps(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_NLE_UQ), g);
}

#endif

/* ---- residual add ----------------------------------------------------------------------- */

static void add_range_generic(const float *a, const float *b, float *out, size_t i0, size_t i1,
                              int stream)
{
    (void)stream;
    for (size_t i = i0; i < i1; i++) out[i] = a[i] + b[i];
}

#ifdef TF_X86
AVX512_TARGET static inline void add_masked_avx512(const float *a, const float *b, float *out,
                                                   size_t i, size_t count)
{
    __mmask16 m = (__mmask16)((1u << count) - 1);
    _mm512_mask_storeu_ps(out + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, a + i),
                                                    _mm512_maskz_loadu_ps(m, b + i)));
}

/* stream: non-temporal stores (out is not read back soon: the op moves more than the L3 holds) */
AVX512_TARGET static void add_range_avx512(const float *a, const float *b, float *out, size_t i0,
                                           size_t i1, int stream)
{
    size_t i = i0;
    if (stream) {
        size_t head = head_to_align(out + i, 64, i1 - i);
        if (head) add_masked_avx512(a, b, out, i, head);
        i += head;
    }
    for (; i + 16 <= i1; i += 16) {
        __m512 v = _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i));
        if (stream) _mm512_stream_ps(out + i, v);
        else _mm512_storeu_ps(out + i, v);
    }
    if (i < i1) add_masked_avx512(a, b, out, i, i1 - i);
    if (stream) _mm_sfence();
}

AVX2_TARGET static inline void add_masked_avx2(const float *a, const float *b, float *out, size_t i,
                                               size_t count)
{
    __m256i m = tf_lanes8(count);
    _mm256_maskstore_ps(out + i, m, _mm256_add_ps(_mm256_maskload_ps(a + i, m),
                                                  _mm256_maskload_ps(b + i, m)));
}

AVX2_TARGET static void add_range_avx2(const float *a, const float *b, float *out, size_t i0,
                                       size_t i1, int stream)
{
    size_t i = i0;
    if (stream) {
        size_t head = head_to_align(out + i, 32, i1 - i);
        if (head) add_masked_avx2(a, b, out, i, head);
        i += head;
    }
    for (; i + 8 <= i1; i += 8) {
        __m256 v = _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
        if (stream) _mm256_stream_ps(out + i, v);
        else _mm256_storeu_ps(out + i, v);
    }
    if (i < i1) add_masked_avx2(a, b, out, i, i1 - i);
    if (stream) _mm_sfence();
}
#endif

void residual_add(const float *a, const float *b, float *out, size_t n)
{
    if (n == 0) return;
    void (*fn)(const float *, const float *, float *, size_t, size_t, int) = add_range_generic;
#ifdef TF_X86
    if (tf_isa() >= TF_ISA_AVX512) fn = add_range_avx512;
    else if (tf_isa() >= TF_ISA_AVX2) fn = add_range_avx2;
#endif
    const int stream = out != a && out != b && ((uintptr_t)out & 3) == 0 &&
                       3 * n * sizeof(float) > elementwise_stream_bytes();
    const int team = tf_team((long)n, COPY_GRAIN);
    #pragma omp parallel for schedule(static) num_threads(team)
    for (int t = 0; t < team; t++) {
        size_t i0, i1;
        split_range(n, t, team, &i0, &i1);
        if (i0 < i1) fn(a, b, out, i0, i1, stream);
    }
}

/* ---- bias add and its gradient ---------------------------------------------------------- */

static void bias_rows_generic(float *x, const float *bias, size_t r0, size_t r1, size_t D)
{
    for (size_t r = r0; r < r1; r++) {
        float *row = x + r * D;
        for (size_t j = 0; j < D; j++) row[j] += bias[j];
    }
}

#ifdef TF_X86
AVX512_TARGET static void bias_rows_avx512(float *x, const float *bias, size_t r0, size_t r1, size_t D)
{
    const __mmask16 m = (__mmask16)((1u << (D % 16)) - 1);
    const size_t Dv = D - D % 16;
    for (size_t r = r0; r < r1; r++) {
        float *row = x + r * D;
        size_t j = 0;
        for (; j < Dv; j += 16)
            _mm512_storeu_ps(row + j, _mm512_add_ps(_mm512_loadu_ps(row + j), _mm512_loadu_ps(bias + j)));
        if (j < D)
            _mm512_mask_storeu_ps(row + j, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, row + j),
                                                            _mm512_maskz_loadu_ps(m, bias + j)));
    }
}

AVX2_TARGET static void bias_rows_avx2(float *x, const float *bias, size_t r0, size_t r1, size_t D)
{
    for (size_t r = r0; r < r1; r++) {
        float *row = x + r * D;
        size_t j = 0;
        for (; j + 8 <= D; j += 8)
            _mm256_storeu_ps(row + j, _mm256_add_ps(_mm256_loadu_ps(row + j), _mm256_loadu_ps(bias + j)));
        if (j < D) {
            __m256i m = tf_lanes8(D - j);
            _mm256_maskstore_ps(row + j, m, _mm256_add_ps(_mm256_maskload_ps(row + j, m),
                                                          _mm256_maskload_ps(bias + j, m)));
        }
    }
}
#endif

void bias_add(float *x, const float *bias, size_t N, size_t D)
{
    if (N == 0 || D == 0) return;
    void (*fn)(float *, const float *, size_t, size_t, size_t) = bias_rows_generic;
#ifdef TF_X86
    if (tf_isa() >= TF_ISA_AVX512) fn = bias_rows_avx512;
    else if (tf_isa() >= TF_ISA_AVX2) fn = bias_rows_avx2;
#endif
    int team = tf_team((long)(N * D), COPY_GRAIN);
    if (team > (long)N) team = (int)N;
    #pragma omp parallel for schedule(static) num_threads(team)
    for (int t = 0; t < team; t++) {
        size_t r0 = N * (size_t)t / (size_t)team, r1 = N * (size_t)(t + 1) / (size_t)team;
        if (r0 < r1) fn(x, bias, r0, r1, D);
    }
}

/* Columns [c0, c1) of dbias += column sums of dout, in strips of up to BIAS_STRIP columns whose
 * partial sums stay in L1 while the rows stream through: for each block of BIAS_ROW_BLOCK rows,
 * block[j] = sum of the block's rows in order; total[j] += block[j]; finally dbias[j] += total[j].
 * Every level runs this same C (vectorised across columns by the compiler for its target), so
 * each column is summed in the same order and all levels give the same bits. */
#define BIAS_STRIP 1024

static inline __attribute__((always_inline)) void bias_grad_cols_body(const float *dout, float *dbias,
                                                                      size_t N, size_t D, size_t c0,
                                                                      size_t c1)
{
    float total[BIAS_STRIP], block[BIAS_STRIP];
    for (size_t j0 = c0; j0 < c1; j0 += BIAS_STRIP) {
        const size_t w = min_size(BIAS_STRIP, c1 - j0);
        for (size_t j = 0; j < w; j++) total[j] = 0.0f;
        for (size_t r0 = 0; r0 < N; r0 += BIAS_ROW_BLOCK) {
            const size_t r1 = min_size(N, r0 + BIAS_ROW_BLOCK);
            const float *first = dout + r0 * D + j0;
            for (size_t j = 0; j < w; j++) block[j] = first[j];
            for (size_t r = r0 + 1; r < r1; r++) {
                const float *row = dout + r * D + j0;
                for (size_t j = 0; j < w; j++) block[j] += row[j];
            }
            for (size_t j = 0; j < w; j++) total[j] += block[j];
        }
        for (size_t j = 0; j < w; j++) dbias[j0 + j] += total[j];
    }
}

static void bias_grad_cols_generic(const float *dout, float *dbias, size_t N, size_t D, size_t c0,
                                   size_t c1)
{
    bias_grad_cols_body(dout, dbias, N, D, c0, c1);
}

#ifdef TF_X86
/* The same order with the block sums of 64 columns kept in registers: one load and one add per
 * 16 floats of dout (the 64-row block of the strip stays in L2 between column groups). Rows a
 * multiple of 4 KiB apart all fall in the same L1 sets, which defeats this walk down 64 rows:
 * there the L1-array version (bias_grad_cols_body, same order, same bits) is faster. */
AVX512_TARGET static void bias_grad_cols_avx512(const float *dout, float *dbias, size_t N, size_t D,
                                                size_t c0, size_t c1)
{
    if (D % 1024 == 0) {
        bias_grad_cols_body(dout, dbias, N, D, c0, c1);
        return;
    }
    float total[BIAS_STRIP];
    for (size_t j0 = c0; j0 < c1; j0 += BIAS_STRIP) {
        const size_t w = min_size(BIAS_STRIP, c1 - j0);
        for (size_t j = 0; j < w; j++) total[j] = 0.0f;
        for (size_t r0 = 0; r0 < N; r0 += BIAS_ROW_BLOCK) {
            const size_t r1 = min_size(N, r0 + BIAS_ROW_BLOCK);
            for (size_t jj = 0; jj < w; jj += 64) {
                __mmask16 m[4];
                for (int k = 0; k < 4; k++) {
                    size_t j = jj + 16 * (size_t)k;
                    m[k] = j >= w ? 0 : w - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (w - j)) - 1);
                }
                const float *first = dout + r0 * D + j0 + jj;
                __m512 b0 = _mm512_maskz_loadu_ps(m[0], first), b1 = _mm512_maskz_loadu_ps(m[1], first + 16);
                __m512 b2 = _mm512_maskz_loadu_ps(m[2], first + 32), b3 = _mm512_maskz_loadu_ps(m[3], first + 48);
                for (size_t r = r0 + 1; r < r1; r++) {
                    const float *row = dout + r * D + j0 + jj;
                    b0 = _mm512_add_ps(b0, _mm512_maskz_loadu_ps(m[0], row));
                    b1 = _mm512_add_ps(b1, _mm512_maskz_loadu_ps(m[1], row + 16));
                    b2 = _mm512_add_ps(b2, _mm512_maskz_loadu_ps(m[2], row + 32));
                    b3 = _mm512_add_ps(b3, _mm512_maskz_loadu_ps(m[3], row + 48));
                }
                float *t = total + jj;
                _mm512_mask_storeu_ps(t, m[0], _mm512_add_ps(_mm512_maskz_loadu_ps(m[0], t), b0));
                _mm512_mask_storeu_ps(t + 16, m[1], _mm512_add_ps(_mm512_maskz_loadu_ps(m[1], t + 16), b1));
                _mm512_mask_storeu_ps(t + 32, m[2], _mm512_add_ps(_mm512_maskz_loadu_ps(m[2], t + 32), b2));
                _mm512_mask_storeu_ps(t + 48, m[3], _mm512_add_ps(_mm512_maskz_loadu_ps(m[3], t + 48), b3));
            }
        }
        for (size_t j = 0; j < w; j++) dbias[j0 + j] += total[j];
    }
}

AVX2_TARGET static void bias_grad_cols_avx2(const float *dout, float *dbias, size_t N, size_t D,
                                            size_t c0, size_t c1)
{
    bias_grad_cols_body(dout, dbias, N, D, c0, c1);
}
#endif

void bias_grad(const float *dout, float *dbias, size_t N, size_t D)
{
    if (N == 0 || D == 0) return;
    void (*fn)(const float *, float *, size_t, size_t, size_t, size_t) = bias_grad_cols_generic;
#ifdef TF_X86
    if (tf_isa() >= TF_ISA_AVX512) fn = bias_grad_cols_avx512;
    else if (tf_isa() >= TF_ISA_AVX2) fn = bias_grad_cols_avx2;
#endif
    /* parallel over column chunks of 16 (what a thread writes); each walks all rows in order */
    long chunks = (long)((D + 15) / 16);
    int team = tf_team((long)(N * D), COPY_GRAIN);
    if (team > chunks) team = (int)chunks;
    #pragma omp parallel for schedule(static) num_threads(team)
    for (int t = 0; t < team; t++) {
        size_t c0 = 16 * (size_t)(chunks * t / team), c1 = min_size(D, 16 * (size_t)(chunks * (t + 1) / team));
        if (c0 < c1) fn(dout, dbias, N, D, c0, c1);
    }
}

/* ---- fused bias + activation, and the activation's backward ----------------------------- */

static void bias_act_rows_generic(float *x, const float *bias, float *out, size_t r0, size_t r1,
                                  size_t D, int act, int stream)
{
    (void)stream;
    for (size_t r = r0; r < r1; r++) {
        float *xr = x + r * D, *outr = out + r * D;
        for (size_t j = 0; j < D; j++) {
            float v = xr[j] + bias[j];
            xr[j] = v;
            outr[j] = act_scalar(v, act);
        }
    }
}

#ifdef TF_X86
AVX512_TARGET static inline void bias_act_masked_avx512(float *xr, const float *bias, float *outr,
                                                        size_t j, size_t count, int act)
{
    __mmask16 m = (__mmask16)((1u << count) - 1);
    __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, xr + j), _mm512_maskz_loadu_ps(m, bias + j));
    _mm512_mask_storeu_ps(xr + j, m, v);
    _mm512_mask_storeu_ps(outr + j, m, act_avx512(v, act));
}

AVX512_TARGET static void bias_act_rows_avx512(float *x, const float *bias, float *out, size_t r0,
                                               size_t r1, size_t D, int act, int stream)
{
    for (size_t r = r0; r < r1; r++) {
        float *xr = x + r * D, *outr = out + r * D;
        size_t j = 0;
        if (stream) {
            size_t head = head_to_align(outr, 64, D);
            if (head) bias_act_masked_avx512(xr, bias, outr, 0, head, act);
            j = head;
        }
        for (; j + 16 <= D; j += 16) {
            __m512 v = _mm512_add_ps(_mm512_loadu_ps(xr + j), _mm512_loadu_ps(bias + j));
            _mm512_storeu_ps(xr + j, v);
            if (stream) _mm512_stream_ps(outr + j, act_avx512(v, act));
            else _mm512_storeu_ps(outr + j, act_avx512(v, act));
        }
        if (j < D) bias_act_masked_avx512(xr, bias, outr, j, D - j, act);
    }
    if (stream) _mm_sfence();
}

AVX2_TARGET static inline void bias_act_masked_avx2(float *xr, const float *bias, float *outr,
                                                    size_t j, size_t count, int act)
{
    __m256i m = tf_lanes8(count);
    __m256 v = _mm256_add_ps(_mm256_maskload_ps(xr + j, m), _mm256_maskload_ps(bias + j, m));
    _mm256_maskstore_ps(xr + j, m, v);
    _mm256_maskstore_ps(outr + j, m, act_avx2(v, act));
}

AVX2_TARGET static void bias_act_rows_avx2(float *x, const float *bias, float *out, size_t r0,
                                           size_t r1, size_t D, int act, int stream)
{
    for (size_t r = r0; r < r1; r++) {
        float *xr = x + r * D, *outr = out + r * D;
        size_t j = 0;
        if (stream) {
            size_t head = head_to_align(outr, 32, D);
            if (head) bias_act_masked_avx2(xr, bias, outr, 0, head, act);
            j = head;
        }
        for (; j + 8 <= D; j += 8) {
            __m256 v = _mm256_add_ps(_mm256_loadu_ps(xr + j), _mm256_loadu_ps(bias + j));
            _mm256_storeu_ps(xr + j, v);
            if (stream) _mm256_stream_ps(outr + j, act_avx2(v, act));
            else _mm256_storeu_ps(outr + j, act_avx2(v, act));
        }
        if (j < D) bias_act_masked_avx2(xr, bias, outr, j, D - j, act);
    }
    if (stream) _mm_sfence();
}
#endif

void bias_act_forward(float *x, const float *bias, float *out, size_t N, size_t D, int act)
{
    if (N == 0 || D == 0) return;
    void (*fn)(float *, const float *, float *, size_t, size_t, size_t, int, int) = bias_act_rows_generic;
#ifdef TF_X86
    if (tf_isa() >= TF_ISA_AVX512) fn = bias_act_rows_avx512;
    else if (tf_isa() >= TF_ISA_AVX2) fn = bias_act_rows_avx2;
#endif
    /* out == x: the pre-activation's store and the activation's go to one address, in that order,
     * which a non-temporal store (weakly ordered) would not keep */
    const int stream = out != x && ((uintptr_t)out & 3) == 0
                       && 3 * N * D * sizeof(float) > elementwise_stream_bytes();
    int team = tf_team((long)(N * D), act != TF_ACT_RELU ? GELU_GRAIN : COPY_GRAIN);
    if (team > (long)N) team = (int)N;
    #pragma omp parallel for schedule(static) num_threads(team)
    for (int t = 0; t < team; t++) {
        size_t r0 = N * (size_t)t / (size_t)team, r1 = N * (size_t)(t + 1) / (size_t)team;
        if (r0 < r1) fn(x, bias, out, r0, r1, D, act, stream);
    }
}

static void act_backward_range_generic(const float *dout, const float *pre, float *dx, size_t i0,
                                       size_t i1, int act, int accumulate, int stream)
{
    (void)stream;
    if (accumulate)
        for (size_t i = i0; i < i1; i++) dx[i] += act_grad_scalar(pre[i], dout[i], act);
    else
        for (size_t i = i0; i < i1; i++) dx[i] = act_grad_scalar(pre[i], dout[i], act);
}

#ifdef TF_X86
AVX512_TARGET static inline void act_backward_masked_avx512(const float *dout, const float *pre,
                                                            float *dx, size_t i, size_t count,
                                                            int act, int accumulate)
{
    __mmask16 m = (__mmask16)((1u << count) - 1);
    __m512 g = act_grad_avx512(_mm512_maskz_loadu_ps(m, pre + i), _mm512_maskz_loadu_ps(m, dout + i), act);
    if (accumulate) {
        ROUNDED(g);
        g = _mm512_add_ps(_mm512_maskz_loadu_ps(m, dx + i), g);
    }
    _mm512_mask_storeu_ps(dx + i, m, g);
}

AVX512_TARGET static void act_backward_range_avx512(const float *dout, const float *pre, float *dx,
                                                    size_t i0, size_t i1, int act, int accumulate,
                                                    int stream)
{
    size_t i = i0;
    if (stream) {   /* (never with accumulate: dx is read then) */
        size_t head = head_to_align(dx + i, 64, i1 - i);
        if (head) act_backward_masked_avx512(dout, pre, dx, i, head, act, 0);
        i += head;
    }
    for (; i + 16 <= i1; i += 16) {   /* unmasked main loop: masked stores are slower */
        __m512 g = act_grad_avx512(_mm512_loadu_ps(pre + i), _mm512_loadu_ps(dout + i), act);
        if (accumulate) {
            ROUNDED(g);
            g = _mm512_add_ps(_mm512_loadu_ps(dx + i), g);
        }
        if (stream) _mm512_stream_ps(dx + i, g);
        else _mm512_storeu_ps(dx + i, g);
    }
    if (i < i1) act_backward_masked_avx512(dout, pre, dx, i, i1 - i, act, accumulate);
    if (stream) _mm_sfence();
}

AVX2_TARGET static inline void act_backward_masked_avx2(const float *dout, const float *pre,
                                                        float *dx, size_t i, size_t count, int act,
                                                        int accumulate)
{
    __m256i m = tf_lanes8(count);
    __m256 g = act_grad_avx2(_mm256_maskload_ps(pre + i, m), _mm256_maskload_ps(dout + i, m), act);
    if (accumulate) {
        ROUNDED(g);
        g = _mm256_add_ps(_mm256_maskload_ps(dx + i, m), g);
    }
    _mm256_maskstore_ps(dx + i, m, g);
}

AVX2_TARGET static void act_backward_range_avx2(const float *dout, const float *pre, float *dx,
                                                size_t i0, size_t i1, int act, int accumulate,
                                                int stream)
{
    size_t i = i0;
    if (stream) {
        size_t head = head_to_align(dx + i, 32, i1 - i);
        if (head) act_backward_masked_avx2(dout, pre, dx, i, head, act, 0);
        i += head;
    }
    for (; i + 8 <= i1; i += 8) {
        __m256 g = act_grad_avx2(_mm256_loadu_ps(pre + i), _mm256_loadu_ps(dout + i), act);
        if (accumulate) {
            ROUNDED(g);
            g = _mm256_add_ps(_mm256_loadu_ps(dx + i), g);
        }
        if (stream) _mm256_stream_ps(dx + i, g);
        else _mm256_storeu_ps(dx + i, g);
    }
    if (i < i1) act_backward_masked_avx2(dout, pre, dx, i, i1 - i, act, accumulate);
    if (stream) _mm_sfence();
}
#endif

typedef void (*act_backward_range_fn)(const float *, const float *, float *, size_t, size_t, int, int, int);

static act_backward_range_fn act_backward_pick(void)
{
#ifdef TF_X86
    if (tf_isa() >= TF_ISA_AVX512) return act_backward_range_avx512;
    if (tf_isa() >= TF_ISA_AVX2) return act_backward_range_avx2;
#endif
    return act_backward_range_generic;
}

void act_backward_span(const float *dout, const float *pre, float *dx, size_t i0, size_t i1, int act)
{
    if (i0 < i1) act_backward_pick()(dout, pre, dx, i0, i1, act, 0, 0);
}

void act_backward(const float *dout, const float *pre, float *dx, size_t n, int act, int accumulate)
{
    if (n == 0) return;
    const act_backward_range_fn fn = act_backward_pick();
    /* non-temporal stores when dx is only written and the op moves more than the L3 holds */
    const int stream = !accumulate && dx != dout && ((uintptr_t)dx & 3) == 0 &&
                       3 * n * sizeof(float) > elementwise_stream_bytes();
    const int team = tf_team((long)n, act != TF_ACT_RELU ? GELU_GRAIN : COPY_GRAIN);
    #pragma omp parallel for schedule(static) num_threads(team)
    for (int t = 0; t < team; t++) {
        size_t i0, i1;
        split_range(n, t, team, &i0, &i1);
        if (i0 < i1) fn(dout, pre, dx, i0, i1, act, accumulate, stream);
    }
}

/* ---- naive references ------------------------------------------------------------------- */

void bias_act_forward_reference(float *x, const float *bias, float *out, size_t N, size_t D, int act)
{
    bias_act_rows_generic(x, bias, out, 0, N, D, act, 0);
}

void act_backward_reference(const float *dout, const float *pre, float *dx, size_t n, int act,
                            int accumulate)
{
    act_backward_range_generic(dout, pre, dx, 0, n, act, accumulate, 0);
}
