/* AVX-512: what the 14 x 32 fp32 kernel (avx512.c) shares with the kernels that reuse its tile,
 * packing or stores: vdpbf16ps (avx512_bf16.c) and the amx tiles (amx.c). */
#ifndef TF_GEMM_AVX512_H
#define TF_GEMM_AVX512_H

#include "gemm_isa.h"

/* Internal to the folder: hidden (gemm_isa.h says why). */
#pragma GCC visibility push(hidden)

#ifdef GEMM_X86
#define AVX512_MR 14
#define AVX512_NR 32
#define TARGET_AVX512 TF_TARGET_AVX512
/* How far ahead (floats) a kernel reading a pre-packed B from memory fetches it (measured on
 * Zen 5: 1024 -> 29, 2048 -> 34, 4096 -> 36 GB/s, 8192 -> 33 GB/s for x @ W^T, 8 rows). */
#ifndef GEMM_STREAM_AHEAD
#define GEMM_STREAM_AHEAD 4096
#endif

/* C[mr x nr] (+)= alpha * the accumulators c0 (columns 0-15) and c1 (16-31, when wide). */
static inline __attribute__((always_inline)) TARGET_AVX512 void
store_tile_avx512(const __m512 *c0, const __m512 *c1, float *restrict C, long ldc, int nr,
                  const float *alpha, int load_c, const int mr, const int wide)
{
    __m512 va = _mm512_set1_ps(*alpha);   /* read late: all 32 registers serve the loop */
    if (wide && nr == AVX512_NR) {
#pragma GCC unroll 14
        for (int i = 0; i < AVX512_MR; i++)
            if (i < mr) {
                float *c = C + i * ldc;
                if (load_c) {
                    _mm512_storeu_ps(c, _mm512_fmadd_ps(va, c0[i], _mm512_loadu_ps(c)));
                    _mm512_storeu_ps(c + 16, _mm512_fmadd_ps(va, c1[i], _mm512_loadu_ps(c + 16)));
                } else {
                    _mm512_storeu_ps(c, _mm512_mul_ps(va, c0[i]));
                    _mm512_storeu_ps(c + 16, _mm512_mul_ps(va, c1[i]));
                }
            }
    } else {
        __mmask16 m0 = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1);
        __mmask16 m1 = nr <= 16 ? (__mmask16)0 : (__mmask16)((1u << (nr - 16)) - 1);
#pragma GCC unroll 14
        for (int i = 0; i < AVX512_MR; i++)
            if (i < mr) {
                float *c = C + i * ldc;
                if (load_c) {
                    _mm512_mask_storeu_ps(c, m0, _mm512_fmadd_ps(va, c0[i], _mm512_maskz_loadu_ps(m0, c)));
                    if (wide)
                        _mm512_mask_storeu_ps(c + 16, m1,
                                              _mm512_fmadd_ps(va, c1[i], _mm512_maskz_loadu_ps(m1, c + 16)));
                } else {
                    _mm512_mask_storeu_ps(c, m0, _mm512_mul_ps(va, c0[i]));
                    if (wide) _mm512_mask_storeu_ps(c + 16, m1, _mm512_mul_ps(va, c1[i]));
                }
            }
    }
}

/* r[0..15] <- its 16 x 16 transpose (r[i][j] <-> r[j][i]). */
static inline __attribute__((always_inline)) TARGET_AVX512 void transpose16(__m512 r[16])
{
    __m512 t[16], u[16], v[8];
    for (int i = 0; i < 16; i += 2) {   /* interleave pairs of rows, 32-bit */
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {   /* u[i + e]: rows i..i+3, element e of each 128-bit lane */
        u[i + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        u[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        u[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        u[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    for (int e = 0; e < 4; e++) {      /* gather the 128-bit lanes */
        v[0] = _mm512_shuffle_f32x4(u[e], u[4 + e], 0x88);
        v[1] = _mm512_shuffle_f32x4(u[e], u[4 + e], 0xDD);
        v[2] = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0x88);
        v[3] = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0xDD);
        r[e] = _mm512_shuffle_f32x4(v[0], v[2], 0x88);
        r[e + 8] = _mm512_shuffle_f32x4(v[0], v[2], 0xDD);
        r[e + 4] = _mm512_shuffle_f32x4(v[1], v[3], 0x88);
        r[e + 12] = _mm512_shuffle_f32x4(v[1], v[3], 0xDD);
    }
}

/* round_bf16 of each lane, the bf16 in the high half of the 32 bits (the operands of vdpbf16ps,
 * avx512_bf16.c, and of the amx tiles, amx.c). */
static inline __attribute__((always_inline)) TARGET_AVX512 __m512i bf16_high(__m512 x)
{
    const __m512i u = _mm512_castps_si512(x);
    const __m512i half = _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                          _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __m512i r = _mm512_mask_or_epi32(_mm512_add_epi32(u, half), nan, u, _mm512_set1_epi32(0x00400000));
    const __mmask16 subnormal = _mm512_cmpeq_epi32_mask(_mm512_and_si512(r, _mm512_set1_epi32(0x7f800000)),
                                                        _mm512_setzero_si512());
    return _mm512_mask_and_epi32(r, subnormal, r, _mm512_set1_epi32((int)0x80000000u));
}

/* Packing (avx512.c): op(A) into 14-row, op(B) into 32-column micro-panels of floats; and
 * (avx512_bf16.c) op(B) into 32-column panels of bf16 pairs, what vdpbf16ps and the amx tiles read. */
void pack_a_avx512(int trans_a, const float *A, long lda, long m, long kc, float *Ap);
void pack_b_avx512(int trans_b, const float *B, long ldb, long n, long kc, float *Bp);
void pack_b_dpbf16(int t, const float *X, long ldx, long n, long kc, float *dst);
#endif

#pragma GCC visibility pop

#endif
