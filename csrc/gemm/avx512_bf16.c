/* avx512_bf16: vdpbf16ps, two bf16 products added into each fp32 lane per instruction (twice the
 * products of an FMA). The same 14 x 32 tile and packing as AVX-512 (K blocks of 512), after which each
 * packed micro-panel [kc][W] (W = MR or NR) is turned in place into [ceil(kc/2)][W] 32-bit pairs:
 * bf16(x[2t][w]) in the low half, bf16(x[2t+1][w]) (0 past kc) in the high half, the layout
 * vdpbf16ps multiplies lane by lane. Operands are rounded exactly as round_bf16 does; the products
 * are exact and the sums fp32, so only the summation order differs from the other levels. K blocks
 * have an even length (k_block), so a pre-packed panel's pair t is pair t - pc/2 of block pc. */
#include "avx512.h"

#ifdef GEMM_X86
#define TARGET_BF16 TF_TARGET_AVX512_BF16

/* bf16_high, the operands' rounding, is in avx512.h (amx.c rounds with it too). */

/* `panels` micro-panels [kc][W] of floats, panel q at p + q * W * kc, into pairs in place: pair
 * (t, w) is written at t * W + w, below every float not read yet (2t * W + w and on). */
static TARGET_AVX512 void pair_panels(float *p, long panels, long kc, int W)
{
    const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
    for (long q = 0; q < panels; q++) {
        float *x = p + q * W * kc;
        for (long t = 0; t < (kc + 1) / 2; t++)
            for (int w = 0; w < W; w += 16) {
                const __mmask16 m = tf_lanes16(W - w);
                __m512i lo = bf16_high(_mm512_maskz_loadu_ps(m, x + 2 * t * W + w));
                __m512i hi = 2 * t + 1 < kc ? bf16_high(_mm512_maskz_loadu_ps(m, x + (2 * t + 1) * W + w))
                                            : _mm512_setzero_si512();
                _mm512_mask_storeu_epi32(x + t * W + w, m,
                                         _mm512_or_si512(_mm512_srli_epi32(lo, 16), _mm512_and_si512(hi, high)));
            }
    }
}

static void pack_a_dpbf16(int t, const float *X, long ldx, long n, long kc, float *dst)
{
    pack_a_avx512(t, X, ldx, n, kc, dst);
    pair_panels(dst, ceil_div(n, AVX512_MR), kc, AVX512_MR);
}

void pack_b_dpbf16(int t, const float *X, long ldx, long n, long kc, float *dst)
{
    pack_b_avx512(t, X, ldx, n, kc, dst);
    pair_panels(dst, ceil_div(n, AVX512_NR), kc, AVX512_NR);
}

/* kernel_avx512 over pairs: Ap [ceil(kc/2)][MR] and Bp rows of NR pairs, row t at Bp + t * bs. */
static inline __attribute__((always_inline)) TARGET_BF16 void
kernel_dpbf16(long kc, const float *restrict Ap, const float *restrict Bp, long bs,
              float *restrict C, long ldc, int nr, const float *alpha, int load_c, const int mr,
              const int wide, const int stream)
{
    __m512 c0[AVX512_MR], c1[AVX512_MR];
#pragma GCC unroll 14
    for (int i = 0; i < AVX512_MR; i++)
        if (i < mr) {
            c0[i] = _mm512_setzero_ps();
            c1[i] = _mm512_setzero_ps();
            _mm_prefetch((const char *)(C + i * ldc), _MM_HINT_T0);
            if (wide) _mm_prefetch((const char *)(C + i * ldc + 16), _MM_HINT_T0);
        }
    const long pairs = (kc + 1) / 2;
    for (long t = 0; t < pairs; t++) {
        if (stream) {
            _mm_prefetch((const char *)(Bp + t * bs + GEMM_STREAM_AHEAD), _MM_HINT_T0);
            _mm_prefetch((const char *)(Bp + t * bs + GEMM_STREAM_AHEAD + 16), _MM_HINT_T0);
        }
        __m512bh b0 = (__m512bh)_mm512_loadu_ps(Bp + t * bs);
        __m512bh b1 = wide ? (__m512bh)_mm512_loadu_ps(Bp + t * bs + 16) : b0;
        const float *a = Ap + t * AVX512_MR;
#pragma GCC unroll 14
        for (int i = 0; i < AVX512_MR; i++)
            if (i < mr) {
                __m512bh ai = (__m512bh)_mm512_set1_ps(a[i]);   /* the pair's 32 bits, as they are */
                c0[i] = _mm512_dpbf16_ps(c0[i], ai, b0);
                if (wide) c1[i] = _mm512_dpbf16_ps(c1[i], ai, b1);
            }
    }
    store_tile_avx512(c0, c1, C, ldc, nr, alpha, load_c, mr, wide);
}

#define DPBF16_KERNEL(R)                                                                   \
    static TARGET_BF16 void kernel_dpbf16_##R(long kc, const float *Ap, const float *Bp,    \
                                              long bs, float *C, long ldc, int nr,          \
                                              const float *alpha, int load_c)               \
    { kernel_dpbf16(kc, Ap, Bp, bs, C, ldc, nr, alpha, load_c, R, 1, 0); }                   \
    static TARGET_BF16 void kernel_dpbf16_half_##R(long kc, const float *Ap, const float *Bp, \
                                                   long bs, float *C, long ldc, int nr,     \
                                                   const float *alpha, int load_c)          \
    { kernel_dpbf16(kc, Ap, Bp, bs, C, ldc, nr, alpha, load_c, R, 0, 0); }                   \
    static TARGET_BF16 void kernel_dpbf16_stream_##R(long kc, const float *Ap, const float *Bp, \
                                                     long bs, float *C, long ldc, int nr,   \
                                                     const float *alpha, int load_c)        \
    { kernel_dpbf16(kc, Ap, Bp, bs, C, ldc, nr, alpha, load_c, R, 1, 1); }
DPBF16_KERNEL(1) DPBF16_KERNEL(2) DPBF16_KERNEL(3) DPBF16_KERNEL(4) DPBF16_KERNEL(5)
DPBF16_KERNEL(6) DPBF16_KERNEL(7) DPBF16_KERNEL(8) DPBF16_KERNEL(9) DPBF16_KERNEL(10)
DPBF16_KERNEL(11) DPBF16_KERNEL(12) DPBF16_KERNEL(13) DPBF16_KERNEL(14)

/* KC = 512: a K block of 256 pairs keeps the B micro-panel (256 x 32 pairs, 32 KiB) and the A
 * block (336 x 256 pairs) at fp32's footprints, with half the C updates per product. */
const gemm_isa isa_avx512_dpbf16 = {
    AVX512_MR, AVX512_NR, 512, 336, 4096,
    {0, kernel_dpbf16_1, kernel_dpbf16_2, kernel_dpbf16_3, kernel_dpbf16_4, kernel_dpbf16_5,
     kernel_dpbf16_6, kernel_dpbf16_7, kernel_dpbf16_8, kernel_dpbf16_9, kernel_dpbf16_10,
     kernel_dpbf16_11, kernel_dpbf16_12, kernel_dpbf16_13, kernel_dpbf16_14},
    {0, kernel_dpbf16_half_1, kernel_dpbf16_half_2, kernel_dpbf16_half_3, kernel_dpbf16_half_4,
     kernel_dpbf16_half_5, kernel_dpbf16_half_6, kernel_dpbf16_half_7, kernel_dpbf16_half_8,
     kernel_dpbf16_half_9, kernel_dpbf16_half_10, kernel_dpbf16_half_11, kernel_dpbf16_half_12,
     kernel_dpbf16_half_13, kernel_dpbf16_half_14},
    pack_a_dpbf16, pack_b_dpbf16, NULL,
    {0, kernel_dpbf16_stream_1, kernel_dpbf16_stream_2, kernel_dpbf16_stream_3, kernel_dpbf16_stream_4,
     kernel_dpbf16_stream_5, kernel_dpbf16_stream_6, kernel_dpbf16_stream_7, kernel_dpbf16_stream_8,
     kernel_dpbf16_stream_9, kernel_dpbf16_stream_10, kernel_dpbf16_stream_11, kernel_dpbf16_stream_12,
     kernel_dpbf16_stream_13, kernel_dpbf16_stream_14},
    1, 1};
#endif
