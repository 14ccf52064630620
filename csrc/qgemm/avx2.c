/* AVX2 micro-kernel: 6 rows x 16 columns, 12 ymm int32 accumulators. Per pair of k, the 32
 * packed bytes [16][2] are sign-extended to int16 (vpmovsxbw) and multiplied by the row's
 * broadcast int16 pair with vpmaddwd, which adds the two products into one int32 lane:
 * exact (|sum| <= 2 * 127 * 127), unlike vpmaddubsw, which saturates at int16. */
#include "qgemm_isa.h"

#ifdef QGEMM_X86
#define AVX2_MR 6
#define AVX2_NR 16

static inline __attribute__((always_inline)) TARGET_AVX2 void
tile_avx2(long pairs, const int16_t *restrict Xq, long ldq, const float *xs,
          const int8_t *restrict panel, const float *ws, const float *bias,
          float *restrict C, long ldc, int nr, const int mr, const int stream)
{
    __m256i c0[AVX2_MR], c1[AVX2_MR];
#pragma GCC unroll 6
    for (int i = 0; i < AVX2_MR; i++)
        if (i < mr) { c0[i] = _mm256_setzero_si256(); c1[i] = _mm256_setzero_si256(); }
    for (long g = 0; g < pairs; g++) {
        const int8_t *w = panel + g * 2 * AVX2_NR;
        if (stream)   /* an address, never dereferenced: no pointer past the buffer is formed */
            _mm_prefetch((const char *)((uintptr_t)w + QGEMM_AHEAD), _MM_HINT_T0);
        /* columns 0-7 and 8-15, each as int16 pairs (k, k+1) */
        __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w));
        __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + AVX2_NR)));
#pragma GCC unroll 6
        for (int i = 0; i < AVX2_MR; i++)
            if (i < mr) {
                int32_t pair;   /* x[i][2g], x[i][2g+1] as one 32-bit lane */
                memcpy(&pair, Xq + i * ldq + 2 * g, sizeof pair);
                __m256i x = _mm256_set1_epi32(pair);
                c0[i] = _mm256_add_epi32(c0[i], _mm256_madd_epi16(x, w0));
                c1[i] = _mm256_add_epi32(c1[i], _mm256_madd_epi16(x, w1));
            }
    }
    /* Through memory, as the VNNI tile does: gcc 12 would otherwise keep a stack copy of the
     * accumulators inside the loop above. */
    int32_t acc[AVX2_MR * AVX2_NR] __attribute__((aligned(32)));
#pragma GCC unroll 6
    for (int i = 0; i < AVX2_MR; i++)
        if (i < mr) {
            _mm256_store_si256((__m256i *)(acc + i * AVX2_NR), c0[i]);
            _mm256_store_si256((__m256i *)(acc + i * AVX2_NR + 8), c1[i]);
        }
    const __m256 ws0 = _mm256_loadu_ps(ws), ws1 = _mm256_loadu_ps(ws + 8);   /* padded to NR */
    for (int i = 0; i < mr; i++) {
        const __m256 x = _mm256_set1_ps(xs[i]);
        __m256 s0 = _mm256_mul_ps(x, ws0), s1 = _mm256_mul_ps(x, ws1);
        __m256 a0 = _mm256_cvtepi32_ps(_mm256_load_si256((const __m256i *)(acc + i * AVX2_NR)));
        __m256 a1 = _mm256_cvtepi32_ps(_mm256_load_si256((const __m256i *)(acc + i * AVX2_NR + 8)));
        float *c = C + i * ldc;
        if (nr == AVX2_NR) {
            if (bias) {
                _mm256_storeu_ps(c, _mm256_fmadd_ps(a0, s0, _mm256_loadu_ps(bias)));
                _mm256_storeu_ps(c + 8, _mm256_fmadd_ps(a1, s1, _mm256_loadu_ps(bias + 8)));
            } else {
                _mm256_storeu_ps(c, _mm256_mul_ps(a0, s0));
                _mm256_storeu_ps(c + 8, _mm256_mul_ps(a1, s1));
            }
        } else {   /* the panel's last columns: the same operations, one at a time */
            float a[AVX2_NR], s[AVX2_NR];
            _mm256_storeu_ps(a, a0);
            _mm256_storeu_ps(a + 8, a1);
            _mm256_storeu_ps(s, s0);
            _mm256_storeu_ps(s + 8, s1);
            for (int j = 0; j < nr; j++)
                c[j] = bias ? fmaf(a[j], s[j], bias[j]) : a[j] * s[j];
        }
    }
}

#define AVX2_TILE(R)                                                                         \
    static TARGET_AVX2 void tile_avx2_##R(long pairs, const int16_t *Xq, long ldq,           \
                                          const float *xs, const int8_t *panel,              \
                                          const float *ws, const float *bias, float *C,      \
                                          long ldc, int nr, int stream)                      \
    {                                                                                        \
        if (stream) tile_avx2(pairs, Xq, ldq, xs, panel, ws, bias, C, ldc, nr, R, 1);        \
        else tile_avx2(pairs, Xq, ldq, xs, panel, ws, bias, C, ldc, nr, R, 0);               \
    }
AVX2_TILE(1) AVX2_TILE(2) AVX2_TILE(3) AVX2_TILE(4) AVX2_TILE(5) AVX2_TILE(6)

typedef void (*tile_fn)(long, const int16_t *, long, const float *, const int8_t *, const float *,
                        const float *, float *, long, int, int);
static const tile_fn tiles_avx2[AVX2_MR + 1] = {0, tile_avx2_1, tile_avx2_2, tile_avx2_3,
                                                tile_avx2_4, tile_avx2_5, tile_avx2_6};

void qgemm_kernel_avx2(long m, long K, const int16_t *Xq, long ldq, const float *xs,
                       const int8_t *panel, const float *ws, const int32_t *comp,
                       const float *bias, float *C, long ldc, int nr)
{
    (void)comp;
    const long pairs = ceil_div(K, 2);
    for (long i = 0; i < m; i += AVX2_MR) {
        int mr = (int)min_l(AVX2_MR, m - i);
        tiles_avx2[mr](pairs, Xq + i * ldq, ldq, xs + i, panel, ws, bias, C + i * ldc, ldc, nr,
                       i == 0);
    }
}
#endif
