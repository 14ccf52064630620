/* amx: tdpbusd, a 16 x 16 int32 tile += a 16 x 64 u8 tile @ a 64 x 16 s8 tile (quads of k per
 * 32-bit element) per instruction. Tiles of 32 rows x 32 columns (csrc/amx.h: four C tiles, A
 * rows 0-15 and 16-31, B columns 0-15 and 16-31). The panels are the VNNI kernel's ([groups][32]
 * [4]: a B tile is 16 quads x 16 columns of a panel, row stride 128 bytes) and the activation
 * rows its uint8 rows (64-byte multiples, so an A tile reads 64 k of 16 rows). The whole steps
 * of 64 k run on tiles, the quads past them with vpdpbusd, then the VNNI kernel's
 * dequantization: the integer sum is exact, so every bit equals the other paths'. Rows of the
 * A tiles past the block's last row read the zero rows qgemm_packed pads the activations
 * with; their results are dropped. */
#include "avx512_vnni.h"

#ifdef QGEMM_X86
#if TF_HAVE_AMX
#define TARGET_AMX TF_TARGET_AMX
#define AMX_MR 32
/* How far ahead (bytes) the first row tile of a block fetches its panel: a step reads 2 KiB of it
 * (16 quads x 32 columns), and the tile loads leave fetching to the hardware prefetcher. Measured
 * on the 16-core Xeon (family 6 model 207, one thread, 8 rows): a decoding step's 36 products of
 * a base model's six layers (21 MB) took 1.47-1.50 ms 2 KiB ahead against 1.56-1.57 with no
 * fetching, 1.55-1.86 at 1 KiB and 1.81-1.83 at 4 and 8 KiB; base int8 greedy decoding, 14
 * alternated rounds, was faster in 10 (median 1.08x) at one thread, in 8 (1.01x) at two
 * (2026-11-27, results/decode-int8-base-*-xeon-f6m207-16core-2026-11-27.jsonl). */
#define QGEMM_AMX_AHEAD 2048

static TARGET_AMX void tile_amx(long K, const uint8_t *restrict Xu, long ldu, const float *xs,
                                const int8_t *restrict panel, const float *ws, const int32_t *comp,
                                const float *bias, float *restrict C, long ldc, int nr, int mr,
                                int stream)
{
    const long steps = K / 64, groups = ceil_div(K, 4);
    const int two = mr > 16;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (long s = 0; s < steps; s++) {
        const int8_t *w = panel + s * 16 * 4 * VNNI_NR;
        if (stream)   /* the 2 KiB a later step reads, one line at a time */
            for (int line = 0; line < 32; line++)
                _mm_prefetch((const char *)((uintptr_t)w + QGEMM_AMX_AHEAD + 64 * line), _MM_HINT_T0);
        for (long i = 2 * s; i < 2 * s + 2 && i < mr; i++) {   /* C's lines, two rows a step */
            _mm_prefetch((const char *)(C + i * ldc), _MM_HINT_T0);
            _mm_prefetch((const char *)(C + i * ldc + 16), _MM_HINT_T0);
        }
        _tile_loadd(4, Xu + s * 64, ldu);
        _tile_loadd(6, w, 4 * VNNI_NR);
        _tile_loadd(7, w + 64, 4 * VNNI_NR);
        _tile_dpbusd(0, 4, 6);
        _tile_dpbusd(1, 4, 7);
        if (two) {
            _tile_loadd(5, Xu + 16 * ldu + s * 64, ldu);
            _tile_dpbusd(2, 5, 6);
            _tile_dpbusd(3, 5, 7);
        }
    }
    int32_t acc[AMX_MR * VNNI_NR] __attribute__((aligned(64)));
    _tile_stored(0, acc, 4 * VNNI_NR);
    _tile_stored(1, acc + 16, 4 * VNNI_NR);
    if (two) {
        _tile_stored(2, acc + 16 * VNNI_NR, 4 * VNNI_NR);
        _tile_stored(3, acc + 16 * VNNI_NR + 16, 4 * VNNI_NR);
    }
    const vnni_out out = vnni_out_of(ws, comp, bias, nr);
    for (int i = 0; i < mr; i++) {
        __m512i c0 = _mm512_load_si512((const void *)(acc + i * VNNI_NR));
        __m512i c1 = _mm512_load_si512((const void *)(acc + i * VNNI_NR + 16));
        for (long g = steps * 16; g < groups; g++) {   /* the quads past the whole steps */
            const int8_t *w = panel + g * 4 * VNNI_NR;
            int32_t quad;
            memcpy(&quad, Xu + i * ldu + 4 * g, sizeof quad);
            const __m512i x = _mm512_set1_epi32(quad);
            c0 = _mm512_dpbusd_epi32(c0, x, _mm512_loadu_si512((const void *)w));
            c1 = _mm512_dpbusd_epi32(c1, x, _mm512_loadu_si512((const void *)(w + 64)));
        }
        vnni_store_row(&out, c0, c1, xs[i], C + i * ldc);
    }
}

void qgemm_kernel_amx(long m, long K, const int16_t *Xq, long ldq, const float *xs,
                      const int8_t *panel, const float *ws, const int32_t *comp,
                      const float *bias, float *C, long ldc, int nr)
{
    const long ldu = ldq * (long)sizeof(int16_t);
    const uint8_t *Xu = (const uint8_t *)Xq;
    for (long i = 0; i < m; i += AMX_MR)
        tile_amx(K, Xu + i * ldu, ldu, xs + i, panel, ws, comp, bias, C + i * ldc, ldc, nr,
                 (int)min_l(AMX_MR, m - i), i == 0);
}
#endif
#endif
