#ifndef TF_QGEMM_AVX512_VNNI_H
#define TF_QGEMM_AVX512_VNNI_H

#include "qgemm_isa.h"

/* Internal to the folder: hidden (qgemm_isa.h says why). */
#pragma GCC visibility push(hidden)

#ifdef QGEMM_X86
/* AVX-512 VNNI micro-kernel: 12 rows x 32 columns, 24 zmm int32 accumulators. Per group of
 * four k, the panel's 128 bytes [32][4] are two zmm of signed weights, and the row's four
 * activations, shifted to unsigned (q + 128, in [1, 255]), are broadcast to every lane;
 * vpdpbusd adds the four u8 x s8 products of each lane into its int32 accumulator. Exact:
 * |sum| <= 255 * 127 * K < 2^31 (QGEMM_MAX_K). The shift adds 128 * sum_k w[n][k] to column n,
 * which the panel's precomputed compensation takes off again, so acc is the very integer the
 * other paths compute, and the same dequantization gives the same bits. */
#define VNNI_MR 12
#define VNNI_NR 32

/* The dequantization of one 32-column panel (the VNNI and amx kernels'): its masks, scales,
 * compensations and bias, read once per tile, then row by row C = (acc - comp) * (xs * ws) (+ bias)
 * in the order `dequantize` computes it. */
typedef struct {
    __mmask16 m0, m1;
    __m512 ws0, ws1, b0, b1;
    __m512i k0, k1;
    int whole, bias;
} vnni_out;

static inline __attribute__((always_inline)) TARGET_VNNI vnni_out
vnni_out_of(const float *ws, const int32_t *comp, const float *bias, int nr)
{
    vnni_out o;
    o.m0 = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1);
    o.m1 = nr <= 16 ? (__mmask16)0 : nr >= 32 ? (__mmask16)0xFFFF : (__mmask16)((1u << (nr - 16)) - 1);
    o.ws0 = _mm512_loadu_ps(ws);   /* padded to NR */
    o.ws1 = _mm512_loadu_ps(ws + 16);
    o.k0 = _mm512_loadu_si512((const void *)comp);
    o.k1 = _mm512_loadu_si512((const void *)(comp + 16));
    o.b0 = bias ? _mm512_maskz_loadu_ps(o.m0, bias) : _mm512_setzero_ps();
    o.b1 = bias ? _mm512_maskz_loadu_ps(o.m1, bias + 16) : _mm512_setzero_ps();
    o.whole = nr == VNNI_NR;
    o.bias = bias != NULL;
    return o;
}

static inline __attribute__((always_inline)) TARGET_VNNI void
vnni_store_row(const vnni_out *o, __m512i c0, __m512i c1, float xs, float *c)
{
    const __m512 x = _mm512_set1_ps(xs);
    const __m512 s0 = _mm512_mul_ps(x, o->ws0), s1 = _mm512_mul_ps(x, o->ws1);
    const __m512 a0 = _mm512_cvtepi32_ps(_mm512_sub_epi32(c0, o->k0));
    const __m512 a1 = _mm512_cvtepi32_ps(_mm512_sub_epi32(c1, o->k1));
    const __m512 r0 = o->bias ? _mm512_fmadd_ps(a0, s0, o->b0) : _mm512_mul_ps(a0, s0);
    const __m512 r1 = o->bias ? _mm512_fmadd_ps(a1, s1, o->b1) : _mm512_mul_ps(a1, s1);
    if (o->whole) {   /* whole rows: plain stores (masked ones stall on lines not yet in cache) */
        _mm512_storeu_ps(c, r0);
        _mm512_storeu_ps(c + 16, r1);
    } else {
        _mm512_mask_storeu_ps(c, o->m0, r0);
        _mm512_mask_storeu_ps(c + 16, o->m1, r1);
    }
}
#endif

#pragma GCC visibility pop

#endif
