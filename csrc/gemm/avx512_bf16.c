/* avx512_bf16: vdpbf16ps, two bf16 products added into each fp32 lane per instruction (twice the
 * products of an FMA). The same 14 x 32 tile and panels as AVX-512 (K blocks of 512), each micro-panel
 * packed as [ceil(kc/2)][W] 32-bit pairs (W = MR or NR), in the floats' footprint [kc][W]:
 * bf16(x[2t][w]) in the low half, bf16(x[2t+1][w]) (0 past kc) in the high half, the layout
 * vdpbf16ps multiplies lane by lane. Operands are rounded exactly as round_bf16 does; the products
 * are exact and the sums fp32, so only the summation order differs from the other levels. K blocks
 * have an even length (k_block), so a pre-packed panel's pair t is pair t - pc/2 of block pc. */
#include "avx512.h"
#include "pairs.h"

#ifdef GEMM_X86
#define TARGET_BF16 TF_TARGET_AVX512_BF16

/* Packing straight into pairs, one pass over op(X): the floats are rounded as they are read, by
 * vcvtne2ps2bf16 with bf16_high's bits (pairs.h; bf16_high, in avx512.h, is the operands'
 * rounding, and amx.c rounds with it too), and no panel of floats is written first. */

/* Rows r[0..rows) of a row-major op(X), each from x + i * ldx, k values [k0, k0 + 32) (zero past
 * kc), as pairs transposed: r[t] lane i is pair (k0 / 2 + t) of row i. */
static inline __attribute__((always_inline)) TARGET_BF16 void
pairs_across(const float *x, long ldx, int rows, long k0, long kc, __m512 r[16])
{
    const __mmask16 m0 = tf_lanes16(kc - k0), m1 = tf_lanes16(kc - k0 - 16);
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        r[i] = i < rows ? _mm512_castsi512_ps(pair_row(_mm512_maskz_loadu_ps(m0, x + i * ldx + k0),
                                                       _mm512_maskz_loadu_ps(m1, x + i * ldx + k0 + 16)))
                        : _mm512_setzero_ps();
    transpose16(r);
}

/* gemm_pack_panels: a transposed op(A) (op(A)[i][k] = A[k][i]) in one pass down A's rows, rows
 * 2t and 2t + 1 making pair t of every panel. Panel by panel (pack_a_dpbf16), each row was read
 * once a panel, lda apart, and the loads waited on memory. */
static TARGET_BF16 void pack_at_dpbf16(const float *A, long lda, long mc, long p0, long p1, long kc, float *Ap)
{
    const int MR = AVX512_MR;
    const long panels = ceil_div(mc, MR), base = mc / panels, extra = mc % panels, pairs = (kc + 1) / 2;
    for (long t = 0; t < pairs; t++) {
        const float *x = A + 2 * t * lda, *y = x + lda;
        const int odd = 2 * t + 1 < kc;
        for (long p = p0; p < p1; p++) {
            const long i = p * base + (p < extra ? p : extra);
            const __mmask16 mm = tf_lanes16(base + (p < extra));
            const __m512 lo = _mm512_maskz_loadu_ps(mm, x + i);
            const __m512 hi = odd ? _mm512_maskz_loadu_ps(mm, y + i) : _mm512_setzero_ps();
            _mm512_mask_storeu_epi32(Ap + p * MR * kc + t * MR, 0x3FFF, pair_lanes(lo, hi));
        }
    }
}

/* op(A) [m][kc] into MR-row panels of pairs [ceil(kc/2)][MR], panel q at dst + q * MR * kc (the
 * floats' footprint, as the kernels' strides expect). */
static TARGET_BF16 void pack_a_dpbf16(int trans_a, const float *A, long lda, long m, long kc, float *dst)
{
    const int MR = AVX512_MR;
    const long pairs = (kc + 1) / 2;
    for (long ip = 0; ip < m; ip += MR) {
        const int mr = m - ip < MR ? (int)(m - ip) : MR;
        float *panel = dst + ip * kc;
        if (trans_a) {          /* the panel as a block of one (pack_a_panels takes pack_at for blocks) */
            pack_at_dpbf16(A + ip, lda, mr, 0, 1, kc, panel);
            continue;
        }
        for (long k0 = 0; k0 < kc; k0 += 32) {
            __m512 r[16];
            pairs_across(A + ip * lda, lda, mr, k0, kc, r);
            const long pn = pairs - k0 / 2 < 16 ? pairs - k0 / 2 : 16;
            for (long t = 0; t < pn; t++)
                _mm512_mask_storeu_ps(panel + (k0 / 2 + t) * MR, 0x3FFF, r[t]);
        }
    }
}

/* op(B) [kc][n] into NR-column panels of pairs [ceil(kc/2)][NR], panel q at dst + q * NR * kc. */
TARGET_BF16 void pack_b_dpbf16(int trans_b, const float *B, long ldb, long n, long kc, float *dst)
{
    const int NR = AVX512_NR;
    const long pairs = (kc + 1) / 2;
    if (!trans_b) {     /* op(B)[k][j] = B[k][j]: rows 2t and 2t + 1 make pair row t of every panel,
                         * in one pass down the rows (panel by panel, each row's lines were read
                         * once a panel, ldb apart: the loads waited on memory) */
        for (long t = 0; t < pairs; t++) {
            const float *x = B + 2 * t * ldb, *y = x + ldb;
            const int odd = 2 * t + 1 < kc;
            for (long jp = 0; jp < n; jp += NR) {
                const int nr = n - jp < NR ? (int)(n - jp) : NR;
                const __mmask16 m0 = tf_lanes16(nr), m1 = tf_lanes16(nr - 16);
                const __m512 lo0 = _mm512_maskz_loadu_ps(m0, x + jp), lo1 = _mm512_maskz_loadu_ps(m1, x + jp + 16);
                const __m512 hi0 = odd ? _mm512_maskz_loadu_ps(m0, y + jp) : _mm512_setzero_ps();
                const __m512 hi1 = odd ? _mm512_maskz_loadu_ps(m1, y + jp + 16) : _mm512_setzero_ps();
                float *row = dst + jp * kc + t * NR;
                _mm512_store_si512(row, pair_lanes(lo0, hi0));
                _mm512_store_si512(row + 16, pair_lanes(lo1, hi1));
            }
        }
        return;
    }
    for (long jp = 0; jp < n; jp += NR) {
        const int nr = n - jp < NR ? (int)(n - jp) : NR;
        float *panel = dst + jp * kc;
        for (int h = 0; h < 2; h++) {   /* op(B)[k][j] = B[j][k]: columns j0 .. j0 + 16 of the panel */
            const int j0 = 16 * h, jn = nr - j0;
            for (long k0 = 0; k0 < kc; k0 += 32) {
                __m512 r[16];
                pairs_across(B + (jp + j0) * ldb, ldb, jn, k0, kc, r);
                const long pn = pairs - k0 / 2 < 16 ? pairs - k0 / 2 : 16;
                for (long t = 0; t < pn; t++) _mm512_store_ps(panel + (k0 / 2 + t) * NR + j0, r[t]);
            }
        }
    }
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
    1, 1, 0, 0, pack_at_dpbf16};
#endif
