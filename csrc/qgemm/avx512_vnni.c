/* AVX-512 VNNI micro-kernel: 12 rows x 32 columns (the tile, its constants and the dequantization
 * it shares with the amx tiles: avx512_vnni.h). */
#include "avx512_vnni.h"

#ifdef QGEMM_X86
static inline __attribute__((always_inline)) TARGET_VNNI void
tile_vnni(long groups, const uint8_t *restrict Xu, long ldu, const float *xs,
          const int8_t *restrict panel, const float *ws, const int32_t *comp, const float *bias,
          float *restrict C, long ldc, int nr, const int mr, const int stream)
{
    __m512i c0[VNNI_MR], c1[VNNI_MR];
#pragma GCC unroll 12
    for (int i = 0; i < VNNI_MR; i++)
        if (i < mr) { c0[i] = _mm512_setzero_si512(); c1[i] = _mm512_setzero_si512(); }
    for (long g = 0; g < groups; g++) {
        const int8_t *w = panel + g * 4 * VNNI_NR;
        if (stream) {
            _mm_prefetch((const char *)((uintptr_t)w + QGEMM_AHEAD), _MM_HINT_T0);
            _mm_prefetch((const char *)((uintptr_t)w + QGEMM_AHEAD + 64), _MM_HINT_T0);
        }
        const __m512i w0 = _mm512_loadu_si512((const void *)w);
        const __m512i w1 = _mm512_loadu_si512((const void *)(w + 64));
#pragma GCC unroll 12
        for (int i = 0; i < VNNI_MR; i++)
            if (i < mr) {
                int32_t quad;   /* x[i][4g .. 4g+3] + 128 as one 32-bit lane */
                memcpy(&quad, Xu + i * ldu + 4 * g, sizeof quad);
                const __m512i x = _mm512_set1_epi32(quad);
                c0[i] = _mm512_dpbusd_epi32(c0[i], x, w0);
                c1[i] = _mm512_dpbusd_epi32(c1[i], x, w1);
            }
    }
    /* Through memory: with the dequantization's six constants live at once, gcc 12 otherwise
     * keeps a stack copy of all 24 accumulators inside the loop above (2.3x slower at 12 rows). */
    int32_t acc[VNNI_MR * VNNI_NR] __attribute__((aligned(64)));
#pragma GCC unroll 12
    for (int i = 0; i < VNNI_MR; i++)
        if (i < mr) {
            _mm512_store_si512((void *)(acc + i * VNNI_NR), c0[i]);
            _mm512_store_si512((void *)(acc + i * VNNI_NR + 16), c1[i]);
        }
    const vnni_out out = vnni_out_of(ws, comp, bias, nr);
    for (int i = 0; i < mr; i++)
        vnni_store_row(&out, _mm512_load_si512((const void *)(acc + i * VNNI_NR)),
                       _mm512_load_si512((const void *)(acc + i * VNNI_NR + 16)), xs[i], C + i * ldc);
}

#define VNNI_TILE(R)                                                                         \
    static TARGET_VNNI void tile_vnni_##R(long groups, const uint8_t *Xu, long ldu,          \
                                          const float *xs, const int8_t *panel,              \
                                          const float *ws, const int32_t *comp,              \
                                          const float *bias, float *C, long ldc, int nr,     \
                                          int stream)                                        \
    {                                                                                        \
        if (stream) tile_vnni(groups, Xu, ldu, xs, panel, ws, comp, bias, C, ldc, nr, R, 1); \
        else tile_vnni(groups, Xu, ldu, xs, panel, ws, comp, bias, C, ldc, nr, R, 0);        \
    }
VNNI_TILE(1) VNNI_TILE(2) VNNI_TILE(3) VNNI_TILE(4) VNNI_TILE(5) VNNI_TILE(6)
VNNI_TILE(7) VNNI_TILE(8) VNNI_TILE(9) VNNI_TILE(10) VNNI_TILE(11) VNNI_TILE(12)

typedef void (*vnni_tile_fn)(long, const uint8_t *, long, const float *, const int8_t *,
                             const float *, const int32_t *, const float *, float *, long, int, int);
static const vnni_tile_fn tiles_vnni[VNNI_MR + 1] = {
    0, tile_vnni_1, tile_vnni_2, tile_vnni_3, tile_vnni_4, tile_vnni_5, tile_vnni_6,
    tile_vnni_7, tile_vnni_8, tile_vnni_9, tile_vnni_10, tile_vnni_11, tile_vnni_12};

/* Xq's rows hold uint8 activations here (qgemm_to_unsigned): row i at (uint8_t *)(Xq + i * ldq). */
void qgemm_kernel_vnni(long m, long K, const int16_t *Xq, long ldq, const float *xs,
                       const int8_t *panel, const float *ws, const int32_t *comp,
                       const float *bias, float *C, long ldc, int nr)
{
    const long groups = ceil_div(K, 4), ldu = ldq * (long)sizeof(int16_t);
    const uint8_t *Xu = (const uint8_t *)Xq;
    for (long i = 0; i < m; i += VNNI_MR) {
        int mr = (int)min_l(VNNI_MR, m - i);
        tiles_vnni[mr](groups, Xu + i * ldu, ldu, xs + i, panel, ws, comp, bias, C + i * ldc, ldc,
                       nr, i == 0);
    }
}
#endif
