/* Floats to bf16 pairs, what vdpbf16ps multiplies: two floats of k rounded to bf16 in one 32-bit
 * word, the even k in the low half. */
#ifndef TF_GEMM_PAIRS_H
#define TF_GEMM_PAIRS_H

#include "avx512.h"

#ifdef GEMM_X86
/* The floats' rounding by vcvtne2ps2bf16, for the packing of avx512_bf16 (avx512_bf16.c) and
 * of the fused attention (attention_train.c).
 *
 * vcvtne2ps2bf16 rounds as bf16_high does (nearest, ties to even; a NaN quieted; a subnormal
 * result zero of its sign) for every float but one range: it takes a subnormal input as zero,
 * where bf16_high rounds the subnormals within 2^-133 of 2^-126 (|bits| 0x007F8000-0x007FFFFF)
 * up to the smallest normal (checked over all 2^32 floats: benchmarks/notes/2026-12-05-bf16-
 * pairs-one-pass.md; tests/test_gemm_bf16.py rounds floats of that range through each packer). A
 * group of 32 floats with one in that range is rounded by bf16_high instead. */

/* The odd 16-bit words of 64: the high halves of two vectors' 32 floats, in order. */
static const short odd_words[32] __attribute__((aligned(64))) = {
    1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
    33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
/* Words 0-15 and 16-31 interleaved: lane w of the result is word w, then word 16 + w. */
static const short interleaved_words[32] __attribute__((aligned(64))) = {
    0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
    8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

/* The lanes of x whose magnitude vcvtne2ps2bf16 rounds otherwise than bf16_high. */
static inline __attribute__((always_inline)) TF_TARGET_AVX512_BF16 __mmask16 rounds_apart(__m512 x)
{
    const __m512i u = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff));
    return _mm512_cmple_epu32_mask(_mm512_sub_epi32(u, _mm512_set1_epi32(0x007F8000)), _mm512_set1_epi32(0x7FFF));
}

/* The 32 floats x0, x1 rounded to bf16, as 16-bit words: x0's in words 0-15, x1's in 16-31. */
static inline __attribute__((always_inline)) TF_TARGET_AVX512_BF16 __m512i round_words(__m512 x0, __m512 x1)
{
#ifndef TF_SIMDE   /* SIMDe (the ARM64 build, where this level never runs) has no vcvtne2ps2bf16 */
    if (__builtin_expect((rounds_apart(x0) | rounds_apart(x1)) == 0, 1))
        return (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
#endif
    return _mm512_permutex2var_epi16(bf16_high(x0), _mm512_load_si512((const void *)odd_words), bf16_high(x1));
}

/* 16 lanes of pairs: bf16(lo[w]) in the low half of lane w, bf16(hi[w]) in the high half. */
static inline __attribute__((always_inline)) TF_TARGET_AVX512_BF16 __m512i pair_lanes(__m512 lo, __m512 hi)
{
    return _mm512_permutexvar_epi16(_mm512_load_si512((const void *)interleaved_words), round_words(lo, hi));
}

/* 32 consecutive floats of a row (x0: the first 16, x1: the next) as its 16 pairs: pair p is
 * bf16(x[2p]) | bf16(x[2p + 1]) << 16. */
static inline __attribute__((always_inline)) TF_TARGET_AVX512_BF16 __m512i pair_row(__m512 x0, __m512 x1)
{
    return round_words(x0, x1);
}

#endif

#endif
