/* AVX-512 micro-kernel: 14 x 32, 28 zmm accumulators (the tile, stores and transposes: avx512.h). */
#include "avx512.h"

#ifdef GEMM_X86
static inline __attribute__((always_inline)) TARGET_AVX512 void
kernel_avx512(long kc, const float *restrict Ap, const float *restrict Bp, long bs,
              float *restrict C, long ldc, int nr, const float *alpha, int load_c, const int mr,
              const int wide,   /* wide = 0: only the first 16 columns (nr <= 16) */
              const int stream) /* 1: Bp streams from memory (pre-packed B): fetch ahead */
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
    for (long k = 0; k < kc; k++) {
        if (stream) {   /* 16 KiB ahead: the hardware prefetcher alone streams ~22 of 40 GB/s */
            _mm_prefetch((const char *)(Bp + k * bs + GEMM_STREAM_AHEAD), _MM_HINT_T0);
            _mm_prefetch((const char *)(Bp + k * bs + GEMM_STREAM_AHEAD + 16), _MM_HINT_T0);
        }
        __m512 b0 = _mm512_loadu_ps(Bp + k * bs);
        __m512 b1 = wide ? _mm512_loadu_ps(Bp + k * bs + 16) : b0;
        const float *a = Ap + k * AVX512_MR;
#pragma GCC unroll 14
        for (int i = 0; i < AVX512_MR; i++)
            if (i < mr) {
                __m512 ai = _mm512_set1_ps(a[i]);
                c0[i] = _mm512_fmadd_ps(ai, b0, c0[i]);
                if (wide) c1[i] = _mm512_fmadd_ps(ai, b1, c1[i]);
            }
    }
    store_tile_avx512(c0, c1, C, ldc, nr, alpha, load_c, mr, wide);
}

#define AVX512_KERNEL(R)                                                                   \
    static TARGET_AVX512 void kernel_avx512_##R(long kc, const float *Ap, const float *Bp,  \
                                                long bs, float *C, long ldc, int nr,        \
                                                const float *alpha, int load_c)             \
    { kernel_avx512(kc, Ap, Bp, bs, C, ldc, nr, alpha, load_c, R, 1, 0); }                   \
    static TARGET_AVX512 void kernel_avx512_half_##R(long kc, const float *Ap, const float *Bp, \
                                                     long bs, float *C, long ldc, int nr,   \
                                                     const float *alpha, int load_c)        \
    { kernel_avx512(kc, Ap, Bp, bs, C, ldc, nr, alpha, load_c, R, 0, 0); }                   \
    static TARGET_AVX512 void kernel_avx512_stream_##R(long kc, const float *Ap, const float *Bp, \
                                                       long bs, float *C, long ldc, int nr, \
                                                       const float *alpha, int load_c)      \
    { kernel_avx512(kc, Ap, Bp, bs, C, ldc, nr, alpha, load_c, R, 1, 1); }
AVX512_KERNEL(1) AVX512_KERNEL(2) AVX512_KERNEL(3) AVX512_KERNEL(4) AVX512_KERNEL(5)
AVX512_KERNEL(6) AVX512_KERNEL(7) AVX512_KERNEL(8) AVX512_KERNEL(9) AVX512_KERNEL(10)
AVX512_KERNEL(11) AVX512_KERNEL(12) AVX512_KERNEL(13) AVX512_KERNEL(14)

/* pack_a_any for MR = 14: a row-major A is transposed 16 k-values at a time. */
TARGET_AVX512 void pack_a_avx512(int trans_a, const float *A, long lda, long m, long kc, float *Ap)
{
    const int MR = AVX512_MR;
    for (long ip = 0; ip < m; ip += MR) {
        int mr = m - ip < MR ? (int)(m - ip) : MR;
        float *dst = Ap + ip * kc;
        if (trans_a) {
            __mmask16 mm = tf_lanes16(mr);
            for (long k = 0; k < kc; k++)
                _mm512_mask_storeu_ps(dst + k * MR, 0x3FFF, _mm512_maskz_loadu_ps(mm, A + k * lda + ip));
            continue;
        }
        for (long k0 = 0; k0 < kc; k0 += 16) {
            __mmask16 mk = tf_lanes16(kc - k0);
            __m512 r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++)
                r[i] = i < mr ? _mm512_maskz_loadu_ps(mk, A + (ip + i) * lda + k0) : _mm512_setzero_ps();
            transpose16(r);
            int kn = kc - k0 < 16 ? (int)(kc - k0) : 16;
            for (int k = 0; k < kn; k++)
                _mm512_mask_storeu_ps(dst + (k0 + k) * MR, 0x3FFF, r[k]);
        }
    }
}

/* pack_b_any for NR = 32: a transposed B is transposed 16 x 16 at a time; a row-major B is packed
 * in one pass down its rows, row k making row k of every panel (panel by panel, each row was
 * read once a panel, ldb apart). */
TARGET_AVX512 void pack_b_avx512(int trans_b, const float *B, long ldb, long n, long kc, float *Bp)
{
    const int NR = AVX512_NR;
    if (!trans_b) {
        for (long k = 0; k < kc; k++)
            for (long jp = 0; jp < n; jp += NR) {
                const int nr = n - jp < NR ? (int)(n - jp) : NR;
                const __mmask16 m0 = tf_lanes16(nr), m1 = tf_lanes16(nr - 16);
                float *row = Bp + jp * kc + k * NR;
                _mm512_store_ps(row, _mm512_maskz_loadu_ps(m0, B + k * ldb + jp));
                _mm512_store_ps(row + 16, _mm512_maskz_loadu_ps(m1, B + k * ldb + jp + 16));
            }
        return;
    }
    for (long jp = 0; jp < n; jp += NR) {
        int nr = n - jp < NR ? (int)(n - jp) : NR;
        float *dst = Bp + jp * kc;
        for (int h = 0; h < 2; h++) {
            int j0 = 16 * h, jn = nr - j0;   /* columns j0 .. j0+jn of this half */
            for (long k0 = 0; k0 < kc; k0 += 16) {
                __mmask16 mk = tf_lanes16(kc - k0);
                __m512 r[16];
#pragma GCC unroll 16
                for (int j = 0; j < 16; j++)
                    r[j] = j < jn ? _mm512_maskz_loadu_ps(mk, B + (jp + j0 + j) * ldb + k0) : _mm512_setzero_ps();
                transpose16(r);
                int kn = kc - k0 < 16 ? (int)(kc - k0) : 16;
                for (int k = 0; k < kn; k++) _mm512_store_ps(dst + (k0 + k) * NR + j0, r[k]);
            }
        }
    }
}

/* gemm_pack_panels: a transposed op(A) (op(A)[i][k] = A[k][i]) in one pass down A's rows, row k
 * making row k of every panel (pack_a_avx512 packs panel by panel). */
static TARGET_AVX512 void pack_at_avx512(const float *A, long lda, long mc, long p0, long p1, long kc, float *Ap)
{
    const int MR = AVX512_MR;
    const long panels = ceil_div(mc, MR), base = mc / panels, extra = mc % panels;
    for (long k = 0; k < kc; k++)
        for (long p = p0; p < p1; p++) {
            const long i = p * base + (p < extra ? p : extra);
            const __mmask16 mm = tf_lanes16(base + (p < extra));
            _mm512_mask_storeu_ps(Ap + p * MR * kc + k * MR, 0x3FFF, _mm512_maskz_loadu_ps(mm, A + k * lda + i));
        }
}

/* Few rows times a transposed B, without packing: 4 x 4 tiles of C, each element a 16-lane
 * FMA chain over k (both operands contiguous in k) and a fixed reduction tree at the end. */
static TARGET_AVX512 void dot_avx512(long M, long K, float alpha, const float *A, long lda,
                                     const float *B, long ldb, int accumulate, float *C, long ldc,
                                     long j0, long j1)
{
    const __mmask16 tail = tf_lanes16(K % 16);
    const long kfull = K - K % 16;
    for (long j = j0; j < j1; j += 4) {
        int nr = (int)min_l(4, j1 - j);
        const float *b[4];
        for (int c = 0; c < 4; c++) b[c] = B + (j + (c < nr ? c : 0)) * ldb;
        for (long i = 0; i < M; i += 4) {
            int mr = (int)min_l(4, M - i);
            const float *a[4];
            for (int r = 0; r < 4; r++) a[r] = A + (i + (r < mr ? r : 0)) * lda;
            __m512 acc[16];
#pragma GCC unroll 16
            for (int t = 0; t < 16; t++) acc[t] = _mm512_setzero_ps();
            /* B is read from memory once, by the first rows: the hardware prefetcher loses
             * track of four interleaved rows, so fetch the next tile's rows (13 -> 20 GB/s) */
            const int fetch = i == 0 && j + 7 < j1;
            for (long k = 0; k < kfull; k += 16) {
                __m512 va[4];
                if (fetch) {
#pragma GCC unroll 4
                    for (int c = 0; c < 4; c++) _mm_prefetch((const char *)(b[c] + 4 * ldb + k), _MM_HINT_T0);
                }
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++) va[r] = _mm512_loadu_ps(a[r] + k);
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) {
                    __m512 vb = _mm512_loadu_ps(b[c] + k);
#pragma GCC unroll 4
                    for (int r = 0; r < 4; r++) acc[4 * r + c] = _mm512_fmadd_ps(va[r], vb, acc[4 * r + c]);
                }
            }
            if (tail) {
                __m512 va[4];
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++) va[r] = _mm512_maskz_loadu_ps(tail, a[r] + kfull);
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) {
                    __m512 vb = _mm512_maskz_loadu_ps(tail, b[c] + kfull);
#pragma GCC unroll 4
                    for (int r = 0; r < 4; r++) acc[4 * r + c] = _mm512_fmadd_ps(va[r], vb, acc[4 * r + c]);
                }
            }
            /* the result holds the sum of acc[t] in element t, i.e. row r = t / 4, column c = t % 4 */
            __m512 sum = tf_sum16x16(acc);
            float t[16] __attribute__((aligned(64)));
            _mm512_store_ps(t, sum);
            for (int r = 0; r < mr; r++) {
                float *c = C + (i + r) * ldc + j;
                if (accumulate)
                    for (int q = 0; q < nr; q++) c[q] = __builtin_fmaf(alpha, t[4 * r + q], c[q]);
                else
                    for (int q = 0; q < nr; q++) c[q] = alpha * t[4 * r + q];
            }
        }
    }
}

/* The AVX-512 kernel tables, shared by the fp32 and bf16 descriptions. */
#define AVX512_KERNELS \
    {0, kernel_avx512_1, kernel_avx512_2, kernel_avx512_3, kernel_avx512_4, kernel_avx512_5, \
     kernel_avx512_6, kernel_avx512_7, kernel_avx512_8, kernel_avx512_9, kernel_avx512_10, \
     kernel_avx512_11, kernel_avx512_12, kernel_avx512_13, kernel_avx512_14}, \
    {0, kernel_avx512_half_1, kernel_avx512_half_2, kernel_avx512_half_3, kernel_avx512_half_4, \
     kernel_avx512_half_5, kernel_avx512_half_6, kernel_avx512_half_7, kernel_avx512_half_8, \
     kernel_avx512_half_9, kernel_avx512_half_10, kernel_avx512_half_11, kernel_avx512_half_12, \
     kernel_avx512_half_13, kernel_avx512_half_14},
#define AVX512_STREAM \
    {0, kernel_avx512_stream_1, kernel_avx512_stream_2, kernel_avx512_stream_3, kernel_avx512_stream_4, \
     kernel_avx512_stream_5, kernel_avx512_stream_6, kernel_avx512_stream_7, kernel_avx512_stream_8, \
     kernel_avx512_stream_9, kernel_avx512_stream_10, kernel_avx512_stream_11, kernel_avx512_stream_12, \
     kernel_avx512_stream_13, kernel_avx512_stream_14}

/* KC = 256: the B micro-panel (256 x 32 floats = 32 KiB) stays in the 48 KiB L1d;
 * MC = 336: the A block (336 x 256 = 336 KiB) stays in the 1 MiB L2;
 * NC = 4096: the B block (up to 8 MiB) stays in the 32 MiB L3. */
const gemm_isa isa_avx512 = {
    AVX512_MR, AVX512_NR, 256, 336, 4096,
    AVX512_KERNELS
    pack_a_avx512, pack_b_avx512, dot_avx512,
    AVX512_STREAM, 0, 0, 0, 0, pack_at_avx512};

BF16_PACKS(avx512, AVX512_MR, AVX512_NR)

const gemm_isa isa_avx512_bf16 = {
    AVX512_MR, AVX512_NR, 256, 336, 4096,
    AVX512_KERNELS
    pack_a_avx512_bf16, pack_b_avx512_bf16, NULL,
    AVX512_STREAM, 1};
#endif
