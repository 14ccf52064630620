/* Embedding gather / scatter-add (see embedding.h). */
#include "embedding.h"

#include "cpu.h"

#include "simd.h"
#if TF_HAVE_X86
#define TF_X86 1
#define AVX512_TARGET TF_TARGET_AVX512
#define AVX2_TARGET TF_TARGET_AVX2
#endif

/* Keep a product rounded on its own (no FMA contraction by the compiler): out = round(w * scale)
 * + pe exactly as PyTorch's two ops, and the same bits at every SIMD level. */
#define ROUNDED(v) TF_ROUNDED(v)

/* floats per thread below which a call stays on fewer threads (a few microseconds of copying) */
#define EMBEDDING_GRAIN 32768

static inline size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* ---- forward: tokens [r0, r1) ----------------------------------------------------------- */

static void gather_rows_generic(const int64_t *ids, const float *table, const float *pe, float *out,
                                size_t r0, size_t r1, size_t T, size_t D, float scale)
{
    for (size_t r = r0; r < r1; r++) {
        const float *src = table + (size_t)ids[r] * D;
        float *dst = out + r * D;
        if (pe) {
            const float *pos = pe + (r % T) * D;
            for (size_t j = 0; j < D; j++) dst[j] = src[j] * scale + pos[j];
        } else {
            for (size_t j = 0; j < D; j++) dst[j] = src[j] * scale;
        }
    }
}

#ifdef TF_X86
AVX512_TARGET static void gather_rows_avx512(const int64_t *ids, const float *table, const float *pe,
                                             float *out, size_t r0, size_t r1, size_t T, size_t D,
                                             float scale)
{
    const __m512 s = _mm512_set1_ps(scale);
    const __mmask16 m = (__mmask16)((1u << (D % 16)) - 1);
    const size_t Dv = D - D % 16;
    for (size_t r = r0; r < r1; r++) {
        const float *src = table + (size_t)ids[r] * D;
        const float *pos = pe ? pe + (r % T) * D : NULL;
        float *dst = out + r * D;
        size_t j = 0;
        if (pos) {
            for (; j < Dv; j += 16) {
                __m512 w = _mm512_mul_ps(_mm512_loadu_ps(src + j), s);
                ROUNDED(w);
                _mm512_storeu_ps(dst + j, _mm512_add_ps(w, _mm512_loadu_ps(pos + j)));
            }
            if (j < D) {
                __m512 w = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, src + j), s);
                ROUNDED(w);
                _mm512_mask_storeu_ps(dst + j, m, _mm512_add_ps(w, _mm512_maskz_loadu_ps(m, pos + j)));
            }
        } else {
            for (; j < Dv; j += 16)
                _mm512_storeu_ps(dst + j, _mm512_mul_ps(_mm512_loadu_ps(src + j), s));
            if (j < D)
                _mm512_mask_storeu_ps(dst + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, src + j), s));
        }
    }
}

AVX2_TARGET static void gather_rows_avx2(const int64_t *ids, const float *table, const float *pe,
                                         float *out, size_t r0, size_t r1, size_t T, size_t D,
                                         float scale)
{
    const __m256 s = _mm256_set1_ps(scale);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(D % 8)), lane);
    const size_t Dv = D - D % 8;
    for (size_t r = r0; r < r1; r++) {
        const float *src = table + (size_t)ids[r] * D;
        const float *pos = pe ? pe + (r % T) * D : NULL;
        float *dst = out + r * D;
        size_t j = 0;
        for (; j < Dv; j += 8) {
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(src + j), s);
            ROUNDED(v);
            if (pos) v = _mm256_add_ps(v, _mm256_loadu_ps(pos + j));
            _mm256_storeu_ps(dst + j, v);
        }
        if (j < D) {
            __m256 v = _mm256_mul_ps(_mm256_maskload_ps(src + j, tail), s);
            ROUNDED(v);
            if (pos) v = _mm256_add_ps(v, _mm256_maskload_ps(pos + j, tail));
            _mm256_maskstore_ps(dst + j, tail, v);
        }
    }
}
#endif

void embedding_forward(const int64_t *ids, const float *table, const float *pe, float *out,
                       size_t BT, size_t T, size_t D, float scale)
{
    if (BT == 0 || D == 0) return;
    void (*fn)(const int64_t *, const float *, const float *, float *, size_t, size_t, size_t,
               size_t, float) = gather_rows_generic;
#ifdef TF_X86
    if (tf_isa() >= TF_ISA_AVX512) fn = gather_rows_avx512;
    else if (tf_isa() >= TF_ISA_AVX2) fn = gather_rows_avx2;
#endif
    int team = tf_team((long)(BT * D), EMBEDDING_GRAIN);
    if (team > (long)BT) team = (int)BT;
    #pragma omp parallel for schedule(static) num_threads(team)
    for (int t = 0; t < team; t++) {
        size_t r0 = BT * (size_t)t / (size_t)team, r1 = BT * (size_t)(t + 1) / (size_t)team;
        if (r0 < r1) fn(ids, table, pe, out, r0, r1, T, D, scale);
    }
}

/* ---- backward: columns [c0, c1), all tokens in order ------------------------------------ */

static void scatter_cols_generic(const int64_t *ids, const float *dout, float *dtable, size_t BT,
                                 size_t D, size_t c0, size_t c1, float scale)
{
    for (size_t r = 0; r < BT; r++) {
        const float *src = dout + r * D;
        float *dst = dtable + (size_t)ids[r] * D;
        for (size_t j = c0; j < c1; j++) dst[j] += src[j] * scale;
    }
}

#ifdef TF_X86
AVX512_TARGET static void scatter_cols_avx512(const int64_t *ids, const float *dout, float *dtable,
                                              size_t BT, size_t D, size_t c0, size_t c1, float scale)
{
    const __m512 s = _mm512_set1_ps(scale);
    const __mmask16 m = (__mmask16)((1u << ((c1 - c0) % 16)) - 1);
    const size_t cv = c1 - (c1 - c0) % 16;
    for (size_t r = 0; r < BT; r++) {
        const float *src = dout + r * D;
        float *dst = dtable + (size_t)ids[r] * D;
        size_t j = c0;
        for (; j < cv; j += 16) {
            __m512 g = _mm512_mul_ps(_mm512_loadu_ps(src + j), s);
            ROUNDED(g);
            _mm512_storeu_ps(dst + j, _mm512_add_ps(_mm512_loadu_ps(dst + j), g));
        }
        if (j < c1) {
            __m512 g = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, src + j), s);
            ROUNDED(g);
            _mm512_mask_storeu_ps(dst + j, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, dst + j), g));
        }
    }
}

AVX2_TARGET static void scatter_cols_avx2(const int64_t *ids, const float *dout, float *dtable,
                                          size_t BT, size_t D, size_t c0, size_t c1, float scale)
{
    const __m256 s = _mm256_set1_ps(scale);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)((c1 - c0) % 8)), lane);
    const size_t cv = c1 - (c1 - c0) % 8;
    for (size_t r = 0; r < BT; r++) {
        const float *src = dout + r * D;
        float *dst = dtable + (size_t)ids[r] * D;
        size_t j = c0;
        for (; j < cv; j += 8) {
            __m256 g = _mm256_mul_ps(_mm256_loadu_ps(src + j), s);
            ROUNDED(g);
            _mm256_storeu_ps(dst + j, _mm256_add_ps(_mm256_loadu_ps(dst + j), g));
        }
        if (j < c1) {
            __m256 g = _mm256_mul_ps(_mm256_maskload_ps(src + j, tail), s);
            ROUNDED(g);
            _mm256_maskstore_ps(dst + j, tail, _mm256_add_ps(_mm256_maskload_ps(dst + j, tail), g));
        }
    }
}
#endif

void embedding_backward(const int64_t *ids, const float *dout, float *dtable, size_t BT, size_t D,
                        float scale)
{
    if (BT == 0 || D == 0) return;
    void (*fn)(const int64_t *, const float *, float *, size_t, size_t, size_t, size_t, float) =
        scatter_cols_generic;
#ifdef TF_X86
    if (tf_isa() >= TF_ISA_AVX512) fn = scatter_cols_avx512;
    else if (tf_isa() >= TF_ISA_AVX2) fn = scatter_cols_avx2;
#endif
    /* column chunks of 16 floats (one cache line): a thread owns the columns it writes */
    long chunks = (long)((D + 15) / 16);
    int team = tf_team((long)(BT * D), EMBEDDING_GRAIN);
    if (team > chunks) team = (int)chunks;
    #pragma omp parallel for schedule(static) num_threads(team)
    for (int t = 0; t < team; t++) {
        size_t c0 = 16 * (size_t)(chunks * t / team);
        size_t c1 = min_size(D, 16 * (size_t)(chunks * (t + 1) / team));
        if (c0 < c1) fn(ids, dout, dtable, BT, D, c0, c1, scale);
    }
}

/* ---- naive references ------------------------------------------------------------------- */

void embedding_forward_reference(const int64_t *ids, const float *table, const float *pe,
                                 float *out, size_t BT, size_t T, size_t D, float scale)
{
    gather_rows_generic(ids, table, pe, out, 0, BT, T, D, scale);
}

void embedding_backward_reference(const int64_t *ids, const float *dout, float *dtable, size_t BT,
                                  size_t D, float scale)
{
    scatter_cols_generic(ids, dout, dtable, BT, D, 0, D, scale);
}
