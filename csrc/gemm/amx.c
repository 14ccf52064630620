/* amx: tdpbf16ps, a 16 x 16 fp32 tile += a 16 x 32 bf16 tile @ a 32 x 16 bf16 tile (pairs of k
 * per 32-bit element) per instruction, 16 times the products of a vdpbf16ps. Tile kernel of 32 x
 * 32 (csrc/amx.h: four C tiles, two A, two B). B is packed exactly as for vdpbf16ps ([ceil(kc/2)]
 * [NR] pairs: a B tile is 16 pair rows x 16 columns of a panel, row stride NR * 4 bytes), so the
 * pre-packed weights and packing code are shared. A panels are row-major instead, what an A tile
 * reads: MR rows of kcp = kc rounded up to even bf16 (zero past kc), row r at (uint16_t *)Ap +
 * r * kcp; rows past the panel's height are zeros up to the tile that reads them. Within a
 * panel's floats: 32 * kcp / 2 <= MR * kc floats.
 *
 * Each element of C: the tile sum over the kc / 32 whole steps of 32 k (tdpbf16ps's order), then
 * the remaining pairs one by one with vdpbf16ps, then alpha and C as store_tile_avx512 applies
 * them. Operands rounded as round_bf16 does (bf16_high), products exact, sums fp32: as at
 * avx512_bf16, only the order of the fp32 additions differs, and it depends on the shape alone. */
#include "amx.h"
#include "avx512.h"

#ifdef GEMM_X86
#if TF_HAVE_AMX
#define AMX_MR 32
#define AMX_NR 32

/* Rows [0, m) of op(A) x columns [0, kc), as bf16 rows of kcp (see above). */
static TARGET_AVX512 void pack_a_amx(int trans_a, const float *A, long lda, long m, long kc, float *Ap)
{
    uint16_t *dst = (uint16_t *)Ap;
    const long kcp = kc + (kc & 1), filled = m <= 16 ? 16 : AMX_MR;
    if (!trans_a) {   /* row i of op(A) is contiguous */
        for (long i = 0; i < m; i++)
            for (long k = 0; k < kcp; k += 16) {
                const __mmask16 in = tf_lanes16(kc - k), out = tf_lanes16(kcp - k);
                __m512i r = _mm512_srli_epi32(bf16_high(_mm512_maskz_loadu_ps(in, A + i * lda + k)), 16);
                _mm256_mask_storeu_epi16(dst + i * kcp + k, out, _mm512_cvtepi32_epi16(r));
            }
    } else {          /* column i of A: 16 x 16 blocks, transposed in registers */
        for (long k0 = 0; k0 < kcp; k0 += 16)
            for (long i0 = 0; i0 < m; i0 += 16) {
                const __mmask16 rows = tf_lanes16(m - i0), out = tf_lanes16(kcp - k0);
                __m512 r[16];
#pragma GCC unroll 16
                for (int t = 0; t < 16; t++)
                    r[t] = k0 + t < kc ? _mm512_maskz_loadu_ps(rows, A + (k0 + t) * lda + i0) : _mm512_setzero_ps();
                transpose16(r);
                for (long t = 0; t < 16 && i0 + t < m; t++) {
                    __m512i h = _mm512_srli_epi32(bf16_high(r[t]), 16);
                    _mm256_mask_storeu_epi16(dst + (i0 + t) * kcp + k0, out, _mm512_cvtepi32_epi16(h));
                }
            }
    }
    if (m < filled) memset(dst + m * kcp, 0, (size_t)((filled - m) * kcp) * sizeof(uint16_t));
}

/* How far ahead (bytes) the stream kernel fetches a pre-packed B: one step of the tiles reads 2 KiB
 * (16 pairs x 32 columns), and the tile loads leave fetching to the hardware prefetcher. Measured
 * on the 16-core Xeon (family 6 model 207, one thread, 8 rows as a decoding step has them): the
 * bf16 output projection x @ W^T of W 8000 x 512 took 0.41-0.43 ms 2 KiB ahead against 0.48-0.51
 * with no fetching, 0.41-0.46 at 1 KiB, 0.52-0.58 at 4 and 8 KiB (2026-11-27). */
#define AMX_STREAM_AHEAD 2048

static inline __attribute__((always_inline)) TF_TARGET_AMX void
kernel_amx(long kc, const float *restrict Ap, const float *restrict Bp, long bs, float *restrict C,
           long ldc, int nr, const float *alpha, int load_c, const int mr, const int stream)
{
    const int two = mr > 16, wide = nr > 16;
    const long kcp = kc + (kc & 1), steps = kc / 32, astride = kcp * 2, bstride = bs * 4;
    const uint16_t *A = (const uint16_t *)Ap;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (long s = 0; s < steps; s++) {
        const float *b = Bp + s * 16 * bs;
        if (stream)   /* the 2 KiB of B a later step reads, one line at a time */
            for (int line = 0; line < 32; line++)
                _mm_prefetch((const char *)((uintptr_t)b + AMX_STREAM_AHEAD + 64 * line), _MM_HINT_T0);
        for (long i = 2 * s; i < 2 * s + 2 && i < mr; i++) {   /* C's lines, two rows a step */
            _mm_prefetch((const char *)(C + i * ldc), _MM_HINT_T0);
            _mm_prefetch((const char *)(C + i * ldc + 16), _MM_HINT_T0);
        }
        _tile_loadd(4, A + s * 32, astride);
        _tile_loadd(6, b, bstride);
        _tile_dpbf16ps(0, 4, 6);
        if (wide) {
            _tile_loadd(7, b + 16, bstride);
            _tile_dpbf16ps(1, 4, 7);
        }
        if (two) {
            _tile_loadd(5, A + 16 * kcp + s * 32, astride);
            _tile_dpbf16ps(2, 5, 6);
            if (wide) _tile_dpbf16ps(3, 5, 7);
        }
    }
    float acc[AMX_MR * AMX_NR] __attribute__((aligned(64)));
    _tile_stored(0, acc, AMX_NR * 4);
    if (wide) _tile_stored(1, acc + 16, AMX_NR * 4);
    if (two) {
        _tile_stored(2, acc + 16 * AMX_NR, AMX_NR * 4);
        if (wide) _tile_stored(3, acc + 16 * AMX_NR + 16, AMX_NR * 4);
    }
    /* the pairs past the whole steps, then alpha and C, row by row */
    const __m512 va = _mm512_set1_ps(*alpha);
    const __mmask16 m0 = tf_lanes16(nr), m1 = tf_lanes16(nr - 16);
    for (int i = 0; i < mr; i++) {
        __m512 c0 = _mm512_load_ps(acc + i * AMX_NR);
        __m512 c1 = wide ? _mm512_load_ps(acc + i * AMX_NR + 16) : c0;
        const uint32_t *a = (const uint32_t *)(A + i * kcp);
        for (long t = steps * 16; t < kcp / 2; t++) {
            __m512bh ai = (__m512bh)_mm512_set1_epi32((int)a[t]);
            c0 = _mm512_dpbf16_ps(c0, ai, (__m512bh)_mm512_loadu_ps(Bp + t * bs));
            if (wide) c1 = _mm512_dpbf16_ps(c1, ai, (__m512bh)_mm512_loadu_ps(Bp + t * bs + 16));
        }
        float *c = C + i * ldc;
        if (nr == AMX_NR) {   /* whole rows: plain stores (masked ones stall on lines not yet here) */
            _mm512_storeu_ps(c, load_c ? _mm512_fmadd_ps(va, c0, _mm512_loadu_ps(c)) : _mm512_mul_ps(va, c0));
            _mm512_storeu_ps(c + 16, load_c ? _mm512_fmadd_ps(va, c1, _mm512_loadu_ps(c + 16))
                                            : _mm512_mul_ps(va, c1));
        } else if (load_c) {
            _mm512_mask_storeu_ps(c, m0, _mm512_fmadd_ps(va, c0, _mm512_maskz_loadu_ps(m0, c)));
            if (wide) _mm512_mask_storeu_ps(c + 16, m1, _mm512_fmadd_ps(va, c1, _mm512_maskz_loadu_ps(m1, c + 16)));
        } else {
            _mm512_mask_storeu_ps(c, m0, _mm512_mul_ps(va, c0));
            if (wide) _mm512_mask_storeu_ps(c + 16, m1, _mm512_mul_ps(va, c1));
        }
    }
}

#define AMX_KERNEL(R)                                                                      \
    static TF_TARGET_AMX void kernel_amx_##R(long kc, const float *Ap, const float *Bp, long bs, \
                                             float *C, long ldc, int nr, const float *alpha,  \
                                             int load_c)                                      \
    { kernel_amx(kc, Ap, Bp, bs, C, ldc, nr, alpha, load_c, R, 0); }                             \
    static TF_TARGET_AMX void kernel_amx_stream_##R(long kc, const float *Ap, const float *Bp,    \
                                                    long bs, float *C, long ldc, int nr,         \
                                                    const float *alpha, int load_c)              \
    { kernel_amx(kc, Ap, Bp, bs, C, ldc, nr, alpha, load_c, R, 1); }
AMX_KERNEL(1) AMX_KERNEL(2) AMX_KERNEL(3) AMX_KERNEL(4) AMX_KERNEL(5) AMX_KERNEL(6) AMX_KERNEL(7)
AMX_KERNEL(8) AMX_KERNEL(9) AMX_KERNEL(10) AMX_KERNEL(11) AMX_KERNEL(12) AMX_KERNEL(13)
AMX_KERNEL(14) AMX_KERNEL(15) AMX_KERNEL(16) AMX_KERNEL(17) AMX_KERNEL(18) AMX_KERNEL(19)
AMX_KERNEL(20) AMX_KERNEL(21) AMX_KERNEL(22) AMX_KERNEL(23) AMX_KERNEL(24) AMX_KERNEL(25)
AMX_KERNEL(26) AMX_KERNEL(27) AMX_KERNEL(28) AMX_KERNEL(29) AMX_KERNEL(30) AMX_KERNEL(31)
AMX_KERNEL(32)

/* KC = 512 as for vdpbf16ps (a B micro-panel of 256 pairs x 32 = 32 KiB in L1d); MC = 256: whole
 * 32-row panels, an A block of 256 KiB of bf16 in L2. */
#ifndef AMX_KC
#define AMX_KC 512
#endif
#ifndef AMX_MC
#define AMX_MC 256
#endif
const gemm_isa isa_amx_bf16 = {
    AMX_MR, AMX_NR, AMX_KC, AMX_MC, 4096,
    {0, kernel_amx_1, kernel_amx_2, kernel_amx_3, kernel_amx_4, kernel_amx_5, kernel_amx_6,
     kernel_amx_7, kernel_amx_8, kernel_amx_9, kernel_amx_10, kernel_amx_11, kernel_amx_12,
     kernel_amx_13, kernel_amx_14, kernel_amx_15, kernel_amx_16, kernel_amx_17, kernel_amx_18,
     kernel_amx_19, kernel_amx_20, kernel_amx_21, kernel_amx_22, kernel_amx_23, kernel_amx_24,
     kernel_amx_25, kernel_amx_26, kernel_amx_27, kernel_amx_28, kernel_amx_29, kernel_amx_30,
     kernel_amx_31, kernel_amx_32},
    {0}, pack_a_amx, pack_b_dpbf16, NULL,
    {0, kernel_amx_stream_1, kernel_amx_stream_2, kernel_amx_stream_3, kernel_amx_stream_4,
     kernel_amx_stream_5, kernel_amx_stream_6, kernel_amx_stream_7, kernel_amx_stream_8,
     kernel_amx_stream_9, kernel_amx_stream_10, kernel_amx_stream_11, kernel_amx_stream_12,
     kernel_amx_stream_13, kernel_amx_stream_14, kernel_amx_stream_15, kernel_amx_stream_16,
     kernel_amx_stream_17, kernel_amx_stream_18, kernel_amx_stream_19, kernel_amx_stream_20,
     kernel_amx_stream_21, kernel_amx_stream_22, kernel_amx_stream_23, kernel_amx_stream_24,
     kernel_amx_stream_25, kernel_amx_stream_26, kernel_amx_stream_27, kernel_amx_stream_28,
     kernel_amx_stream_29, kernel_amx_stream_30, kernel_amx_stream_31, kernel_amx_stream_32},
    1, 1, 1};
#endif
#endif
