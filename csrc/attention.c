/* Single-query attention over a key/value cache (see attention.h). */
#include "attention.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "simd_math.h"

#if TF_HAVE_X86
TF_TARGET_AVX512
static inline float dot_avx512(const float *a, const float *b, long n)
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
    attention_decode_rows_forward(q, ldq, k, v, NULL, NULL, 0, key_mask, out, ldo, probs,
                                  N, H, Tmax, n_keys, dh, scale, 0, 0);
}

/* x rounded to the nearest bf16, ties to even, as its 16 bits (the high half of the float32):
 * NaN stays NaN (quietened: rounding could carry its payload into infinity), subnormals and
 * infinities are kept, a finite x past bf16's largest value rounds to infinity. */
static inline uint16_t bf16_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u | 0x00400000u) >> 16);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float bf16_value(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

void attention_to_bf16(const float *x, long n, uint16_t *out)
{
    for (long i = 0; i < n; i++) out[i] = bf16_bits(x[i]);
}

void attention_round_bf16(float *x, long rows, long cols, long ld)
{
    for (long r = 0; r < rows; r++)
        for (long i = 0; i < cols; i++) x[r * ld + i] = bf16_value(bf16_bits(x[r * ld + i]));
}

/* One (row, head) pair: scores, softmax and weighted sum (the definition every level follows).
 * kp, vp: the pair's cache when krow is NULL; else key j lives at k/v + krow[j]*H*head + h*head.
 * kv16: the caches hold bf16 (uint16_t), widened exactly to float32 as they are read, so every
 * sum is the one a float32 cache holding those values gives: the same bits. */
typedef struct {
    const void *k, *v;           /* whole caches */
    long H, head, dh, n_keys;    /* head = Tmax * dh */
    float scale;
    int kv16;
} cache_view;

/* Key (cache c->k, the pair's own rows at kp) or value (c->v, vp) j of head h: through krow, or
 * the pair's own row. `kv16` is c->kv16, a constant where the caller is compiled for one. */
static inline __attribute__((always_inline)) const void *
cache_row(const cache_view *c, const void *cache, const void *own, const int64_t *krow, long h, long j,
          const int kv16)
{
    const size_t size = kv16 ? sizeof(uint16_t) : sizeof(float);
    return krow ? (const char *)cache + (size_t)(((long)krow[j] * c->H + h) * c->head + j * c->dh) * size
                : (const char *)own + (size_t)(j * c->dh) * size;
}

/* A row of dh keys or values as floats: the cache's own (float32) or widened into tmp (bf16). */
static inline const float *row_floats(const void *row, long dh, int kv16, float *tmp)
{
    if (!kv16) return (const float *)row;
    for (long d = 0; d < dh; d++) tmp[d] = bf16_value(((const uint16_t *)row)[d]);
    return tmp;
}

static void attend_pair(const cache_view *c, const float *qp, const void *kp, const void *vp,
                        const int64_t *krow, long h, const uint8_t *mask, float *scores,
                        float *op, float *pp, float *tmp,
                        float (*dot)(const float *, const float *, long),
                        void (*axpy)(float *, float, const float *, long))
{
    long n_keys = c->n_keys, dh = c->dh;
    float max = -INFINITY;
    for (long j = 0; j < n_keys; j++) {
        if (mask && mask[j]) { scores[j] = -INFINITY; continue; }
        const float *kj = row_floats(cache_row(c, c->k, kp, krow, h, j, c->kv16), dh, c->kv16, tmp);
        scores[j] = c->scale * dot(qp, kj, dh);
        if (scores[j] > max) max = scores[j];
    }
    for (long d = 0; d < dh; d++) op[d] = 0.0f;
    if (max == -INFINITY) {  /* every key masked (or none): zeros, never NaN */
        if (pp) for (long j = 0; j < n_keys; j++) pp[j] = 0.0f;
        return;
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
        if (w == 0.0f) continue;
        const float *vj = row_floats(cache_row(c, c->v, vp, krow, h, j, c->kv16), dh, c->kv16, tmp);
        axpy(op, w, vj, dh);
    }
}

#if TF_HAVE_X86
/* The floats at row + d of a float32 or bf16 row (kv16), lanes outside m zero (and not read). */
TF_TARGET_AVX512
static inline __attribute__((always_inline)) __m512 kv_load16(const void *row, long d, __mmask16 m,
                                                              const int kv16)
{
    if (!kv16) return _mm512_maskz_loadu_ps(m, (const float *)row + d);
    const __m256i b = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + d);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

TF_TARGET_AVX512
static inline __attribute__((always_inline)) __m512 kv_load16n(const void *row, long d, long count,
                                                               const int kv16)
{
    return kv16 ? kv_load16(row, d, tf_lanes16(count), 1) : tf_load16((const float *)row + d, count);
}

/* attend_pair at the AVX-512 level, 16 keys at a time: 16 dot products as 16-lane FMA chains
 * reduced together (tf_sum16x16), the vector exp, and the weighted sum kept in registers (64
 * output floats at a time, two chains over alternate keys) instead of read and written back
 * per key. Same definition as attend_pair; the sums run in another order and the exp is
 * simd_math.h's (1 ulp), so the bits differ from it by rounding. */
TF_TARGET_AVX512
static inline __attribute__((always_inline)) void
attend_pair_avx512_body(const cache_view *c, const float *qp, const void *kp, const void *vp,
                        const int64_t *krow, long h, const uint8_t *mask, float *scores,
                        float *op, float *pp, const long dh, const int kv16)
{
    const long n_keys = c->n_keys;
    const __m512 vscale = _mm512_set1_ps(c->scale), minus_inf = _mm512_set1_ps(-INFINITY);
    __m512 vmax = minus_inf;
    for (long j0 = 0; j0 < n_keys; j0 += 16) {
        const long jn = n_keys - j0 < 16 ? n_keys - j0 : 16;
        const void *key[16];
        for (int t = 0; t < 16; t++) {   /* past the last key: the block's first again, dropped below */
            long j = j0 + (t < jn ? t : 0);
            key[t] = cache_row(c, c->k, kp, krow, h, j, kv16);
        }
        /* Key by key, up to 64 of dh (q held in four registers) at a time, every key of the block
         * whether it exists or not: no test inside, so the 16 sums stay in registers (with a
         * test per key gcc kept them on the stack). Each sum runs over d in order, as before. */
        __m512 acc[16];
#pragma GCC unroll 16
        for (int t = 0; t < 16; t++) acc[t] = _mm512_setzero_ps();
        for (long d0 = 0; d0 < dh; d0 += 64) {
            const long len = dh - d0 < 64 ? dh - d0 : 64;
            const __mmask16 m0 = tf_lanes16(len), m1 = tf_lanes16(len - 16), m2 = tf_lanes16(len - 32),
                            m3 = tf_lanes16(len - 48);
            const __m512 q0 = _mm512_maskz_loadu_ps(m0, qp + d0), q1 = _mm512_maskz_loadu_ps(m1, qp + d0 + 16),
                         q2 = _mm512_maskz_loadu_ps(m2, qp + d0 + 32), q3 = _mm512_maskz_loadu_ps(m3, qp + d0 + 48);
#pragma GCC unroll 16
            for (int t = 0; t < 16; t++) {
                const void *x = key[t];
                __m512 a = _mm512_fmadd_ps(q0, kv_load16(x, d0, m0, kv16), acc[t]);
                if (len > 16) a = _mm512_fmadd_ps(q1, kv_load16(x, d0 + 16, m1, kv16), a);
                if (len > 32) a = _mm512_fmadd_ps(q2, kv_load16(x, d0 + 32, m2, kv16), a);
                if (len > 48) a = _mm512_fmadd_ps(q3, kv_load16(x, d0 + 48, m3, kv16), a);
                acc[t] = a;
            }
        }
        __mmask16 live = tf_lanes16(jn);
        if (mask) live &= ~_mm_test_epi8_mask(_mm_maskz_loadu_epi8(live, mask + j0), _mm_set1_epi8(-1));
        __m512 s = _mm512_mask_mul_ps(minus_inf, live, vscale, tf_sum16x16(acc));
        vmax = _mm512_max_ps(s, vmax);   /* a NaN score is passed over, as by the plain loop */
        tf_store16(scores + j0, jn, s);
    }
    const float max = _mm512_reduce_max_ps(vmax);
    if (max == -INFINITY) {   /* every key masked (or none): zeros, never NaN */
        for (long d = 0; d < dh; d++) op[d] = 0.0f;
        if (pp) for (long j = 0; j < n_keys; j++) pp[j] = 0.0f;
        return;
    }
    const __m512 vpeak = _mm512_set1_ps(max);
    __m512 vsum = _mm512_setzero_ps();
    for (long j0 = 0; j0 < n_keys; j0 += 16) {
        const long jn = n_keys - j0 < 16 ? n_keys - j0 : 16;
        __m512 s = tf_load16(scores + j0, jn);
        /* hidden keys (-inf) weigh exactly 0; NaN scores stay NaN */
        __mmask16 shown = _mm512_cmp_ps_mask(s, minus_inf, _CMP_NEQ_UQ) & tf_lanes16(jn);
        __m512 e = _mm512_maskz_mov_ps(shown, tf_exp_avx512(_mm512_sub_ps(s, vpeak)));
        vsum = _mm512_add_ps(vsum, e);
        tf_store16(scores + j0, jn, e);
    }
    const __m512 vinv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum));
    for (long j0 = 0; j0 < n_keys; j0 += 16) {
        const long jn = n_keys - j0 < 16 ? n_keys - j0 : 16;
        __m512 w = _mm512_mul_ps(tf_load16(scores + j0, jn), vinv);
        tf_store16(scores + j0, jn, w);
        if (pp) tf_store16(pp + j0, jn, w);
    }
    for (long c0 = 0; c0 < dh; c0 += 64) {
        const long len = dh - c0 < 64 ? dh - c0 : 64;
        __m512 a[2][4];
        for (int r = 0; r < 2; r++)
            for (int u = 0; u < 4; u++) a[r][u] = _mm512_setzero_ps();
        /* two chains over alternate keys (an FMA's latency per key, not per two), each key's
         * chain fixed at compile time: with the chain picked at run time gcc kept them in memory */
        for (long j = 0; j < n_keys; j += 2) {
#pragma GCC unroll 2
            for (int r = 0; r < 2; r++) {
                if (j + r >= n_keys) break;
                const float w = scores[j + r];
                if (w == 0.0f) continue;   /* hidden keys: their values are never read */
                const long jj = j + r;
                const void *x = cache_row(c, c->v, vp, krow, h, jj, kv16);
                const __m512 vw = _mm512_set1_ps(w);
                a[r][0] = _mm512_fmadd_ps(vw, kv_load16n(x, c0, len, kv16), a[r][0]);
                if (len > 16) a[r][1] = _mm512_fmadd_ps(vw, kv_load16n(x, c0 + 16, len - 16, kv16), a[r][1]);
                if (len > 32) a[r][2] = _mm512_fmadd_ps(vw, kv_load16n(x, c0 + 32, len - 32, kv16), a[r][2]);
                if (len > 48) a[r][3] = _mm512_fmadd_ps(vw, kv_load16n(x, c0 + 48, len - 48, kv16), a[r][3]);
            }
        }
        for (int u = 0; u < 4 && 16 * u < len; u++)
            tf_store16(op + c0 + 16 * u, len - 16 * u, _mm512_add_ps(a[0][u], a[1][u]));
    }
}

/* The body with the head size a constant where it is a common one (32: tiny and small; 64: base
 * and OPUS-MT): the chunk lengths, the loads and the tests on them are then fixed at compile
 * time. With dh at run time gcc kept a test and a branch per load and copied the sums between
 * registers; attention was 19-24% of tiny int8 greedy decoding's time for 3% of its
 * multiply-adds (Zen 3, one thread). The same operations in the same order: the same bits. */
#define TF_ATTEND_PAIR_KV(level, kv16)                                                        \
    if (c->dh == 32)                                                                          \
        attend_pair_##level##_body(c, qp, kp, vp, krow, h, mask, scores, op, pp, 32, kv16);   \
    else if (c->dh == 64)                                                                     \
        attend_pair_##level##_body(c, qp, kp, vp, krow, h, mask, scores, op, pp, 64, kv16);   \
    else                                                                                      \
        attend_pair_##level##_body(c, qp, kp, vp, krow, h, mask, scores, op, pp, c->dh, kv16);
#define TF_ATTEND_PAIR(level, target)                                                         \
    target static void attend_pair_##level(const cache_view *c, const float *qp,              \
                                           const void *kp, const void *vp,                    \
                                           const int64_t *krow, long h, const uint8_t *mask,  \
                                           float *scores, float *op, float *pp)               \
    {                                                                                         \
        if (c->kv16) {                                                                        \
            TF_ATTEND_PAIR_KV(level, 1)                                                       \
        } else {                                                                              \
            TF_ATTEND_PAIR_KV(level, 0)                                                       \
        }                                                                                     \
    }
TF_ATTEND_PAIR(avx512, TF_TARGET_AVX512)

/* Up to 8 floats at x (count of them; zeros past them, nothing read past them). */
TF_TARGET_AVX2
static inline __m256 load8(const float *x, long count)
{
    return count >= 8 ? _mm256_loadu_ps(x) : _mm256_maskload_ps(x, tf_lanes8(count));
}

/* attend_pair at the AVX2 level, as attend_pair_avx512 with 8 keys at a time: 8 dot products as
 * 8-lane FMA chains reduced together (tf_sum8x8), the vector exp, and the weighted sum in
 * registers (32 output floats at a time, two chains over alternate keys). Same definition as
 * attend_pair; the sums run in another order and the exp is simd_math.h's (1 ulp; exp below -87
 * gives 0), so the bits differ from it by rounding. `scores` holds n_keys rounded up to 8. */
/* Up to 8 floats at row + d of a float32 or bf16 row (kv16), as load8. */
TF_TARGET_AVX2
static inline __attribute__((always_inline)) __m256 kv_load8(const void *row, long d, long count,
                                                             const int kv16)
{
    if (!kv16) return load8((const float *)row + d, count);
    const uint16_t *x = (const uint16_t *)row + d;
    __m128i b;
    if (count >= 8) {
        b = _mm_loadu_si128((const __m128i *)x);
    } else {
        uint16_t part[8] = {0};
        if (count > 0) memcpy(part, x, (size_t)count * sizeof(uint16_t));
        b = _mm_loadu_si128((const __m128i *)part);
    }
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
}

TF_TARGET_AVX2
static inline __attribute__((always_inline)) void
attend_pair_avx2_body(const cache_view *c, const float *qp, const void *kp, const void *vp,
                      const int64_t *krow, long h, const uint8_t *mask, float *scores, float *op,
                      float *pp, const long dh, const int kv16)
{
    const long n_keys = c->n_keys;
    const __m256 vscale = _mm256_set1_ps(c->scale), minus_inf = _mm256_set1_ps(-INFINITY);
    __m256 vmax = minus_inf;
    for (long j0 = 0; j0 < n_keys; j0 += 8) {
        const long jn = n_keys - j0 < 8 ? n_keys - j0 : 8;
        const void *key[8];
        for (int t = 0; t < 8; t++) {   /* past the last key: the block's first again, dropped below */
            long j = j0 + (t < jn ? t : 0);
            key[t] = cache_row(c, c->k, kp, krow, h, j, kv16);
        }
        /* key by key, up to 32 of dh (q held in four registers) at a time, every key of the
         * block whether it exists or not: no test inside, so the 8 sums stay in registers */
        __m256 acc[8];
#pragma GCC unroll 8
        for (int t = 0; t < 8; t++) acc[t] = _mm256_setzero_ps();
        for (long d0 = 0; d0 < dh; d0 += 32) {
            const long len = dh - d0 < 32 ? dh - d0 : 32;
            const __m256 q0 = load8(qp + d0, len), q1 = load8(qp + d0 + 8, len - 8),
                         q2 = load8(qp + d0 + 16, len - 16), q3 = load8(qp + d0 + 24, len - 24);
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) {
                const void *x = key[t];
                __m256 a = _mm256_fmadd_ps(q0, kv_load8(x, d0, len, kv16), acc[t]);
                if (len > 8) a = _mm256_fmadd_ps(q1, kv_load8(x, d0 + 8, len - 8, kv16), a);
                if (len > 16) a = _mm256_fmadd_ps(q2, kv_load8(x, d0 + 16, len - 16, kv16), a);
                if (len > 24) a = _mm256_fmadd_ps(q3, kv_load8(x, d0 + 24, len - 24, kv16), a);
                acc[t] = a;
            }
        }
        __m256i live = tf_lanes8(jn);
        if (mask) {   /* the block's mask bytes, widened to lanes: shown where the byte is 0 */
            uint64_t bytes = 0;
            memcpy(&bytes, mask + j0, (size_t)jn);
            __m256i m = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)bytes));
            live = _mm256_and_si256(live, _mm256_cmpeq_epi32(m, _mm256_setzero_si256()));
        }
        __m256 s = _mm256_blendv_ps(minus_inf, _mm256_mul_ps(vscale, tf_sum8x8(acc)),
                                    _mm256_castsi256_ps(live));
        vmax = _mm256_max_ps(s, vmax);   /* a NaN score is passed over, as by the plain loop */
        _mm256_storeu_ps(scores + j0, s);   /* the lanes past n_keys hold -inf */
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float max = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    if (max == -INFINITY) {   /* every key masked (or none): zeros, never NaN */
        for (long d = 0; d < dh; d++) op[d] = 0.0f;
        if (pp) for (long j = 0; j < n_keys; j++) pp[j] = 0.0f;
        return;
    }
    const __m256 vpeak = _mm256_set1_ps(max);
    __m256 vsum = _mm256_setzero_ps();
    for (long j0 = 0; j0 < n_keys; j0 += 8) {   /* hidden keys (-inf) weigh exactly 0; NaN stays NaN */
        __m256 e = tf_exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(scores + j0), vpeak));
        vsum = _mm256_add_ps(vsum, e);
        _mm256_storeu_ps(scores + j0, e);
    }
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(vsum), _mm256_extractf128_ps(vsum, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    const __m256 vinv = _mm256_set1_ps(1.0f / _mm_cvtss_f32(_mm_add_ss(s4, _mm_movehdup_ps(s4))));
    for (long j0 = 0; j0 < n_keys; j0 += 8) {
        const long jn = n_keys - j0 < 8 ? n_keys - j0 : 8;
        __m256 w = _mm256_mul_ps(_mm256_loadu_ps(scores + j0), vinv);
        _mm256_storeu_ps(scores + j0, w);
        if (pp) {
            if (jn == 8) _mm256_storeu_ps(pp + j0, w);
            else _mm256_maskstore_ps(pp + j0, tf_lanes8(jn), w);
        }
    }
    for (long c0 = 0; c0 < dh; c0 += 32) {
        const long len = dh - c0 < 32 ? dh - c0 : 32;
        __m256 a[2][4];
        for (int r = 0; r < 2; r++)
            for (int u = 0; u < 4; u++) a[r][u] = _mm256_setzero_ps();
        /* two chains over alternate keys, each key's chain fixed at compile time */
        for (long j = 0; j < n_keys; j += 2) {
#pragma GCC unroll 2
            for (int r = 0; r < 2; r++) {
                if (j + r >= n_keys) break;
                const float w = scores[j + r];
                if (w == 0.0f) continue;   /* hidden keys: their values are never read */
                const long jj = j + r;
                const void *x = cache_row(c, c->v, vp, krow, h, jj, kv16);
                const __m256 vw = _mm256_set1_ps(w);
                a[r][0] = _mm256_fmadd_ps(vw, kv_load8(x, c0, len, kv16), a[r][0]);
                if (len > 8) a[r][1] = _mm256_fmadd_ps(vw, kv_load8(x, c0 + 8, len - 8, kv16), a[r][1]);
                if (len > 16) a[r][2] = _mm256_fmadd_ps(vw, kv_load8(x, c0 + 16, len - 16, kv16), a[r][2]);
                if (len > 24) a[r][3] = _mm256_fmadd_ps(vw, kv_load8(x, c0 + 24, len - 24, kv16), a[r][3]);
            }
        }
        for (int u = 0; u < 4 && 8 * u < len; u++) {
            __m256 sum = _mm256_add_ps(a[0][u], a[1][u]);
            if (len - 8 * u >= 8) _mm256_storeu_ps(op + c0 + 8 * u, sum);
            else _mm256_maskstore_ps(op + c0 + 8 * u, tf_lanes8(len - 8 * u), sum);
        }
    }
}

TF_ATTEND_PAIR(avx2, TF_TARGET_AVX2)
#endif

void attention_decode_rows_forward(const float *q, long ldq, const void *k, const void *v,
                                   const int64_t *rows, const int64_t *key_rows, long ld_key_rows,
                                   const uint8_t *key_mask, float *out, long ldo, float *probs,
                                   long N, long H, long Tmax, long n_keys, long dh, float scale,
                                   int reference, int kv16)
{
    float (*dot)(const float *, const float *, long) = dot_generic;
    void (*axpy)(float *, float, const float *, long) = axpy_generic;
    int isa = tf_isa();
#if TF_HAVE_X86
    if (isa >= TF_ISA_AVX512) { dot = dot_avx512; axpy = axpy_avx512; }
    else if (isa >= TF_ISA_AVX2) { dot = dot_avx2; axpy = axpy_avx2; }
    if (reference) isa = TF_ISA_GENERIC;   /* attend_pair with this level's dot and axpy */
#endif
    const cache_view c = {k, v, H, Tmax * dh, dh, n_keys, scale, kv16 != 0};
    const size_t size = kv16 ? sizeof(uint16_t) : sizeof(float);
    long pairs = N * H;
    int threads = tf_team(pairs * n_keys * dh, 1L << 15);
#pragma omp parallel num_threads(threads)
    {
        /* rounded up to whole blocks of 8 (attend_pair_avx2 stores whole vectors) */
        float *scores = malloc((size_t)((n_keys + 7) / 8 * 8 + 8 + dh) * sizeof(float));
        float *tmp = scores + (n_keys + 7) / 8 * 8 + 8;   /* a bf16 row widened (attend_pair) */
#pragma omp for schedule(static)
        for (long p = 0; p < pairs; p++) {
            long n = p / H, h = p % H;
            long row = rows ? (long)rows[n] : n;
            const int64_t *krow = key_rows ? key_rows + n * ld_key_rows : NULL;
            const float *qp = q + n * ldq + h * dh;
            const void *kp = (const char *)k + (size_t)((row * H + h) * c.head) * size;
            const void *vp = (const char *)v + (size_t)((row * H + h) * c.head) * size;
            const uint8_t *mask = key_mask ? key_mask + row * Tmax : NULL;
            float *op = out + n * ldo + h * dh;
            float *pp = probs ? probs + p * n_keys : NULL;
#if TF_HAVE_X86
            if (isa >= TF_ISA_AVX512) {
                attend_pair_avx512(&c, qp, kp, vp, krow, h, mask, scores, op, pp);
                continue;
            }
            if (isa >= TF_ISA_AVX2) {
                attend_pair_avx2(&c, qp, kp, vp, krow, h, mask, scores, op, pp);
                continue;
            }
#endif
            attend_pair(&c, qp, kp, vp, krow, h, mask, scores, op, pp, tmp, dot, axpy);
        }
        free(scores);
    }
}

void attention_cache_store(const float *x, long ldx, void *cache, const int64_t *rows,
                           long N, long H, long Tmax, long dh, long t, int kv16)
{
    /* N * H * dh floats: a few KiB per step, one thread (a team would cost more). */
    for (long n = 0; n < N; n++) {
        long row = rows ? (long)rows[n] : n;
        for (long h = 0; h < H; h++) {
            const long at = ((row * H + h) * Tmax + t) * dh;
            if (kv16) attention_to_bf16(x + n * ldx + h * dh, dh, (uint16_t *)cache + at);
            else memcpy((float *)cache + at, x + n * ldx + h * dh, (size_t)dh * sizeof(float));
        }
    }
}
