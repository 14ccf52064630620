/* Cross-entropy (label smoothing, ignore index) and log-softmax; see loss.h.
 *
 * One fused pass per row, rows split across threads (each thread writes its own rows, its own
 * row_loss entries), the mean reduced in row order afterwards: the same bits for any thread
 * count. Per row, with m = max_c x_c and S = sum_c exp(x_c - m):
 *   -log p_c = log S - (x_c - m)
 *   loss = (1 - eps) * (log S - (x_t - m)) + eps * (log S - (mean_c x_c - m))
 *   d x_c = (exp(x_c - m) / S - eps / V - (1 - eps) [c == t]) * grad_scale / n_valid
 * The row is read three times (max; exp, stored into dlogits, with the sums; the scaling), but
 * only the first read comes from memory: a row of a few thousand floats stays in L1/L2.
 * S and sum_c x_c are accumulated in double (SIMD paths: float lanes over short blocks, each
 * block added into double), the row's loss is formed in double.
 */
#include "loss.h"
#include "cpu.h"
#include "simd_math.h" /* tf_exp_avx512, tf_exp_avx2: the project's one vectorised expf */

#include <math.h>
#include <string.h>

#include "simd.h"
#if TF_HAVE_X86
#define TF_X86 1
#define TARGET_AVX512 TF_TARGET_AVX512
#define TARGET_AVX2 TF_TARGET_AVX2
#endif

/* Row statistics the loss and gradient need. */
typedef struct {
    float max;       /* m = max_c x_c */
    double sum_exp;  /* S = sum_c exp(x_c - m) */
    double sum_x;    /* sum_c x_c (only when asked for: label smoothing) */
} row_stats;

/* Rows below this many elements of work per thread are not worth a second thread. */
#define CE_GRAIN 32768L

/* ------------------------------------------------------------------------------------------ */
/* Generic C: also what a non-x86 build runs. */

/* x (V) -> stats; e (V) or NULL receives exp(x - m); e may be x. */
static row_stats row_stats_generic(const float *x, float *e, long V, int want_sum_x)
{
    row_stats st;
    float m = x[0];
    for (long c = 1; c < V; c++) m = x[c] > m ? x[c] : m;
    double s = 0.0, sx = 0.0;
    for (long c = 0; c < V; c++) {
        float xc = x[c];
        float ec = expf(xc - m);
        if (want_sum_x) sx += (double)xc;
        s += (double)ec;
        if (e) e[c] = ec;
    }
    st.max = m;
    st.sum_exp = s;
    st.sum_x = sx;
    return st;
}

/* d (V) = d * a - b */
static void row_scale_generic(float *d, long V, float a, float b)
{
    for (long c = 0; c < V; c++) d[c] = d[c] * a - b;
}

/* out (V) = (x - m) - l    (log-softmax: PyTorch's order, exact for the largest logits) */
static void row_shift_generic(const float *x, float *out, long V, float m, float l)
{
    for (long c = 0; c < V; c++) out[c] = (x[c] - m) - l;
}

/* ------------------------------------------------------------------------------------------ */
/* AVX-512 */
#ifdef TF_X86

/* 16 floats added into two 8-lane double accumulators. */
#define ADD_PD_512(acc_lo, acc_hi, v)                                                           \
    do {                                                                                        \
        acc_lo = _mm512_add_pd(acc_lo, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));             \
        acc_hi = _mm512_add_pd(acc_hi, _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)));          \
    } while (0)

/* Pass 1 (from memory): the max, and sum x when asked for. Pass 2 (from cache): exp(x - m),
 * stored when asked for, and S. Sums run in float lanes over blocks of SUM_BLOCK elements (at
 * most SUM_BLOCK / 16 terms per lane) and go into double accumulators after each block: the
 * per-row totals are double, the conversions are rare. `store` and `want_sum_x` are
 * compile-time constants in each of the four callers below. */
#define SUM_BLOCK 256
TARGET_AVX512 static inline __attribute__((always_inline)) row_stats
row_stats_avx512_body(const float *x, float *e, long V, const int store, const int want_sum_x)
{
    row_stats st;
    const long Vv = V & ~15L;
    const __mmask16 tail = (__mmask16)((1u << (V - Vv)) - 1u);
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
    const __m512 zero = _mm512_setzero_ps();

    __m512 m0 = neg_inf, m1 = neg_inf, xs = zero;
    __m512d x_lo = _mm512_setzero_pd(), x_hi = _mm512_setzero_pd();
    long c = 0;
    for (; c + 32 <= V; c += 32) {
        __m512 x0 = _mm512_loadu_ps(x + c), x1 = _mm512_loadu_ps(x + c + 16);
        m0 = _mm512_max_ps(m0, x0);
        m1 = _mm512_max_ps(m1, x1);
        if (want_sum_x) {
            xs = _mm512_add_ps(xs, _mm512_add_ps(x0, x1));
            if (((c + 32) & (SUM_BLOCK - 1)) == 0) {
                ADD_PD_512(x_lo, x_hi, xs);
                xs = zero;
            }
        }
    }
    for (; c < Vv; c += 16) {
        __m512 x0 = _mm512_loadu_ps(x + c);
        m0 = _mm512_max_ps(m0, x0);
        if (want_sum_x) xs = _mm512_add_ps(xs, x0);
    }
    if (tail) {
        m1 = _mm512_max_ps(m1, _mm512_mask_loadu_ps(neg_inf, tail, x + Vv));
        if (want_sum_x) xs = _mm512_add_ps(xs, _mm512_maskz_loadu_ps(tail, x + Vv));
    }
    if (want_sum_x) ADD_PD_512(x_lo, x_hi, xs);
    const float m = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
    const __m512 mv = _mm512_set1_ps(m);

    __m512 es = zero;
    __m512d s_lo = _mm512_setzero_pd(), s_hi = _mm512_setzero_pd();
    for (c = 0; c + 32 <= V; c += 32) {
        __m512 e0 = tf_exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(x + c), mv));
        __m512 e1 = tf_exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(x + c + 16), mv));
        if (store) {
            _mm512_storeu_ps(e + c, e0);
            _mm512_storeu_ps(e + c + 16, e1);
        }
        es = _mm512_add_ps(es, _mm512_add_ps(e0, e1));
        if (((c + 32) & (SUM_BLOCK - 1)) == 0) {
            ADD_PD_512(s_lo, s_hi, es);
            es = zero;
        }
    }
    for (; c < Vv; c += 16) {
        __m512 e0 = tf_exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(x + c), mv));
        if (store) _mm512_storeu_ps(e + c, e0);
        es = _mm512_add_ps(es, e0);
    }
    if (tail) {
        __m512 xv = _mm512_maskz_loadu_ps(tail, x + Vv);
        __m512 e0 = _mm512_maskz_mov_ps(tail, tf_exp_avx512(_mm512_sub_ps(xv, mv)));
        if (store) _mm512_mask_storeu_ps(e + Vv, tail, e0);
        es = _mm512_add_ps(es, e0);
    }
    ADD_PD_512(s_lo, s_hi, es);
    st.max = m;
    st.sum_exp = _mm512_reduce_add_pd(_mm512_add_pd(s_lo, s_hi));
    st.sum_x = _mm512_reduce_add_pd(_mm512_add_pd(x_lo, x_hi));
    return st;
}

TARGET_AVX512 static row_stats row_stats_avx512(const float *x, float *e, long V, int want_sum_x)
{
    if (e) return want_sum_x ? row_stats_avx512_body(x, e, V, 1, 1) : row_stats_avx512_body(x, e, V, 1, 0);
    return want_sum_x ? row_stats_avx512_body(x, e, V, 0, 1) : row_stats_avx512_body(x, e, V, 0, 0);
}

TARGET_AVX512 static void row_scale_avx512(float *d, long V, float a, float b)
{
    const __m512 av = _mm512_set1_ps(a), bv = _mm512_set1_ps(b);
    long c = 0;
    for (; c + 16 <= V; c += 16)
        _mm512_storeu_ps(d + c, _mm512_fmsub_ps(_mm512_loadu_ps(d + c), av, bv));
    if (c < V) {
        __mmask16 tail = (__mmask16)((1u << (V - c)) - 1u);
        _mm512_mask_storeu_ps(d + c, tail, _mm512_fmsub_ps(_mm512_maskz_loadu_ps(tail, d + c), av, bv));
    }
}

TARGET_AVX512 static void row_shift_avx512(const float *x, float *out, long V, float m, float l)
{
    const __m512 mv = _mm512_set1_ps(m), lv = _mm512_set1_ps(l);
    long c = 0;
    for (; c + 16 <= V; c += 16)
        _mm512_storeu_ps(out + c, _mm512_sub_ps(_mm512_sub_ps(_mm512_loadu_ps(x + c), mv), lv));
    if (c < V) {
        __mmask16 tail = (__mmask16)((1u << (V - c)) - 1u);
        __m512 xv = _mm512_maskz_loadu_ps(tail, x + c);
        _mm512_mask_storeu_ps(out + c, tail, _mm512_sub_ps(_mm512_sub_ps(xv, mv), lv));
    }
}

/* ------------------------------------------------------------------------------------------ */
/* AVX2 + FMA */


#define ADD_PD_256(acc_lo, acc_hi, v)                                                           \
    do {                                                                                        \
        acc_lo = _mm256_add_pd(acc_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));             \
        acc_hi = _mm256_add_pd(acc_hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));           \
    } while (0)

TARGET_AVX2 static double hsum_pd_avx2(__m256d v)
{
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

/* As row_stats_avx512_body, 8 lanes: blocks of SUM_BLOCK / 2 keep 16 terms per float lane. */
TARGET_AVX2 static inline __attribute__((always_inline)) row_stats
row_stats_avx2_body(const float *x, float *e, long V, const int store, const int want_sum_x)
{
    row_stats st;
    const long block = SUM_BLOCK / 2;
    const long Vv = V & ~7L;
    const long nt = V - Vv;
    const __m256i tail = tf_lanes8(nt);
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    const __m256 zero = _mm256_setzero_ps();

    __m256 m0 = neg_inf, m1 = neg_inf, xs = zero;
    __m256d x_lo = _mm256_setzero_pd(), x_hi = _mm256_setzero_pd();
    long c = 0;
    for (; c + 16 <= V; c += 16) {
        __m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8);
        m0 = _mm256_max_ps(m0, x0);
        m1 = _mm256_max_ps(m1, x1);
        if (want_sum_x) {
            xs = _mm256_add_ps(xs, _mm256_add_ps(x0, x1));
            if (((c + 16) & (block - 1)) == 0) {
                ADD_PD_256(x_lo, x_hi, xs);
                xs = zero;
            }
        }
    }
    for (; c < Vv; c += 8) {
        __m256 x0 = _mm256_loadu_ps(x + c);
        m0 = _mm256_max_ps(m0, x0);
        if (want_sum_x) xs = _mm256_add_ps(xs, x0);
    }
    if (nt) {
        __m256 xv = _mm256_maskload_ps(x + Vv, tail); /* masked lanes read as 0 */
        m1 = _mm256_max_ps(m1, _mm256_blendv_ps(neg_inf, xv, _mm256_castsi256_ps(tail)));
        if (want_sum_x) xs = _mm256_add_ps(xs, xv);
    }
    if (want_sum_x) ADD_PD_256(x_lo, x_hi, xs);
    m0 = _mm256_max_ps(m0, m1);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m0), _mm256_extractf128_ps(m0, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    const float m = _mm_cvtss_f32(h);
    const __m256 mv = _mm256_set1_ps(m);

    __m256 es = zero;
    __m256d s_lo = _mm256_setzero_pd(), s_hi = _mm256_setzero_pd();
    for (c = 0; c + 16 <= V; c += 16) {
        __m256 e0 = tf_exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + c), mv));
        __m256 e1 = tf_exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + c + 8), mv));
        if (store) {
            _mm256_storeu_ps(e + c, e0);
            _mm256_storeu_ps(e + c + 8, e1);
        }
        es = _mm256_add_ps(es, _mm256_add_ps(e0, e1));
        if (((c + 16) & (block - 1)) == 0) {
            ADD_PD_256(s_lo, s_hi, es);
            es = zero;
        }
    }
    for (; c < Vv; c += 8) {
        __m256 e0 = tf_exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + c), mv));
        if (store) _mm256_storeu_ps(e + c, e0);
        es = _mm256_add_ps(es, e0);
    }
    if (nt) {
        __m256 xv = _mm256_maskload_ps(x + Vv, tail);
        __m256 e0 = _mm256_and_ps(tf_exp_avx2(_mm256_sub_ps(xv, mv)), _mm256_castsi256_ps(tail));
        if (store) _mm256_maskstore_ps(e + Vv, tail, e0);
        es = _mm256_add_ps(es, e0);
    }
    ADD_PD_256(s_lo, s_hi, es);
    st.max = m;
    st.sum_exp = hsum_pd_avx2(_mm256_add_pd(s_lo, s_hi));
    st.sum_x = hsum_pd_avx2(_mm256_add_pd(x_lo, x_hi));
    return st;
}

TARGET_AVX2 static row_stats row_stats_avx2(const float *x, float *e, long V, int want_sum_x)
{
    if (e) return want_sum_x ? row_stats_avx2_body(x, e, V, 1, 1) : row_stats_avx2_body(x, e, V, 1, 0);
    return want_sum_x ? row_stats_avx2_body(x, e, V, 0, 1) : row_stats_avx2_body(x, e, V, 0, 0);
}

TARGET_AVX2 static void row_scale_avx2(float *d, long V, float a, float b)
{
    const __m256 av = _mm256_set1_ps(a), bv = _mm256_set1_ps(b);
    long c = 0;
    for (; c + 8 <= V; c += 8)
        _mm256_storeu_ps(d + c, _mm256_fmsub_ps(_mm256_loadu_ps(d + c), av, bv));
    if (c < V) {
        __m256i tail = tf_lanes8(V - c);
        _mm256_maskstore_ps(d + c, tail, _mm256_fmsub_ps(_mm256_maskload_ps(d + c, tail), av, bv));
    }
}

TARGET_AVX2 static void row_shift_avx2(const float *x, float *out, long V, float m, float l)
{
    const __m256 mv = _mm256_set1_ps(m), lv = _mm256_set1_ps(l);
    long c = 0;
    for (; c + 8 <= V; c += 8)
        _mm256_storeu_ps(out + c, _mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c), mv), lv));
    if (c < V) {
        __m256i tail = tf_lanes8(V - c);
        __m256 xv = _mm256_maskload_ps(x + c, tail);
        _mm256_maskstore_ps(out + c, tail, _mm256_sub_ps(_mm256_sub_ps(xv, mv), lv));
    }
}
#endif /* TF_X86 */

/* The row kernels of one instruction set. */
typedef struct {
    row_stats (*stats)(const float *x, float *e, long V, int want_sum_x);
    void (*scale)(float *d, long V, float a, float b);
    void (*shift)(const float *x, float *out, long V, float m, float l);
} row_kernels;

static row_kernels pick_kernels(void)
{
    row_kernels k = {row_stats_generic, row_scale_generic, row_shift_generic};
#ifdef TF_X86
    int isa = tf_isa();
    if (isa >= TF_ISA_AVX512) {
        k.stats = row_stats_avx512;
        k.scale = row_scale_avx512;
        k.shift = row_shift_avx512;
    } else if (isa >= TF_ISA_AVX2) {
        k.stats = row_stats_avx2;
        k.scale = row_scale_avx2;
        k.shift = row_shift_avx2;
    }
#endif
    return k;
}

/* Sum of row_loss[0..N) in row order, divided by n_valid. */
static double mean_of_rows(const double *row_loss, long N, long n_valid)
{
    if (n_valid <= 0) return 0.0;
    double total = 0.0;
    for (long i = 0; i < N; i++) total += row_loss[i];
    return total / (double)n_valid;
}

/* ------------------------------------------------------------------------------------------ */

double cross_entropy_forward_backward(const float *logits, const int64_t *targets, float *dlogits,
                                      double *row_loss, long N, long V, int64_t ignore_index,
                                      long n_valid, double label_smoothing, double grad_scale)
{
    const row_kernels k = pick_kernels();
    const double eps = label_smoothing;
    const double g = n_valid > 0 ? grad_scale / (double)n_valid : 0.0; /* d mean / d loss_i */
    const int want_sum_x = eps != 0.0;

#pragma omp parallel for schedule(static) num_threads(tf_team(N * V, CE_GRAIN))
    for (long i = 0; i < N; i++) {
        const float *x = logits + i * V;
        float *d = dlogits ? dlogits + i * V : NULL;
        const int64_t t = targets[i];
        if (t == ignore_index) {
            row_loss[i] = 0.0;
            if (d) memset(d, 0, (size_t)V * sizeof(float));
            continue;
        }
        const double x_t = (double)x[t]; /* read before d (maybe x) is overwritten */
        row_stats st = k.stats(x, d, V, want_sum_x);
        const double log_s = log(st.sum_exp);
        const double nll = log_s - (x_t - (double)st.max);
        const double smooth = want_sum_x ? log_s - (st.sum_x / (double)V - (double)st.max) : 0.0;
        row_loss[i] = (1.0 - eps) * nll + eps * smooth;
        if (d) {
            /* d holds exp(x - m); softmax = d / S */
            const double e_t = (double)d[t];
            const double a = g / st.sum_exp, b = g * eps / (double)V;
            k.scale(d, V, (float)a, (float)b);
            d[t] = (float)(e_t * a - b - g * (1.0 - eps));
        }
    }
    return mean_of_rows(row_loss, N, n_valid);
}

double cross_entropy_naive(const float *logits, const int64_t *targets, float *dlogits,
                           double *row_loss, long N, long V, int64_t ignore_index,
                           long n_valid, double label_smoothing, double grad_scale)
{
    const double eps = label_smoothing;
    const double g = n_valid > 0 ? grad_scale / (double)n_valid : 0.0;
    for (long i = 0; i < N; i++) {
        const float *x = logits + i * V;
        float *d = dlogits ? dlogits + i * V : NULL;
        const int64_t t = targets[i];
        if (t == ignore_index) {
            row_loss[i] = 0.0;
            if (d) for (long c = 0; c < V; c++) d[c] = 0.0f;
            continue;
        }
        double m = x[0];
        for (long c = 1; c < V; c++) if (x[c] > m) m = x[c];
        double s = 0.0, mean_nll = 0.0;
        for (long c = 0; c < V; c++) s += exp((double)x[c] - m);
        const double log_s = log(s);
        for (long c = 0; c < V; c++) mean_nll += (log_s - ((double)x[c] - m)) / (double)V;
        const double x_t = x[t];
        row_loss[i] = (1.0 - eps) * (log_s - (x_t - m)) + eps * mean_nll;
        if (d) {
            for (long c = 0; c < V; c++) {
                double p = exp((double)x[c] - m) / s; /* x[c] is read before d[c] is written */
                d[c] = (float)((p - eps / (double)V - (c == t ? 1.0 - eps : 0.0)) * g);
            }
        }
    }
    return mean_of_rows(row_loss, N, n_valid);
}

/* ------------------------------------------------------------------------------------------ */

void log_softmax_forward(const float *x, float *out, long N, long V)
{
    const row_kernels k = pick_kernels();

#pragma omp parallel for schedule(static) num_threads(tf_team(N * V, CE_GRAIN))
    for (long i = 0; i < N; i++) {
        const float *xi = x + i * V;
        float *oi = out + i * V;
        row_stats st = k.stats(xi, NULL, V, 0);
        k.shift(xi, oi, V, st.max, (float)log(st.sum_exp));
    }
}
