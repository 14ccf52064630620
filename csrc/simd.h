/* x86 intrinsics and the target attributes of each dispatch level (cpu.h), for every kernel file.
 *
 * A kernel of level L is compiled with TF_TARGET_L and called only when tf_isa() >= L, so one
 * build runs on any x86-64 (never -march=native).
 *
 * On aarch64 with TF_SIMDE_NEON (setup.py defines it when it finds SIMDe's headers, the
 * simde-py package), the same x86 kernels are compiled through SIMDe, which translates each
 * intrinsic into NEON (Advanced SIMD, present on every aarch64 CPU); the CPU then reports the
 * neon level, the avx2 level's slot (cpu.h), and the AVX2 kernels run. TF_HAVE_X86 means "the
 * x86 kernels are compiled in", natively or so. Without SIMDe an aarch64 build has the portable
 * C kernels only.
 *
 * TF_EMULATE_X86 (setup.py with TRANSFORMER_EMULATE_X86=1; a test build, never shipped): every
 * intrinsic comes from SIMDe (Debian's libsimde-dev) as portable C, no function carries a
 * target attribute and the CPU reports every level (cpu.c), so the AVX-512, VNNI and bf16
 * kernels run, slowly, on a CPU that has none of them, and the test suite checks them there.
 */
#ifndef TF_SIMD_H
#define TF_SIMD_H

#if defined(__x86_64__) || defined(__i386__) || (defined(__aarch64__) && defined(TF_SIMDE_NEON))
#define TF_HAVE_X86 1
#if defined(TF_EMULATE_X86) || defined(__aarch64__)
/* The intrinsics from SIMDe: as portable C (TF_EMULATE_X86) or as NEON (aarch64). The overrides
 * below give the hardware's results where SIMDe's differ, on either. */
#define TF_SIMDE 1
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <math.h>
#include <string.h>
#define TF_TARGET(features)
#define TF_ROUNDED(v) __asm__("" : "+m"(v))   /* SIMDe's vectors live in memory */
/* What SIMDe (0.8) does not alias or implement. */
#ifndef _MM_FROUND_NO_EXC
#define _MM_FROUND_NO_EXC SIMDE_MM_FROUND_NO_EXC
#endif
static inline __mmask16 tf_emulated_test_epi8_mask(__m128i a, __m128i b)
{
    uint8_t x[16], y[16];
    __mmask16 m = 0;
    _mm_storeu_si128((__m128i *)x, a);
    _mm_storeu_si128((__m128i *)y, b);
    for (int i = 0; i < 16; i++) m |= (__mmask16)((x[i] & y[i]) != 0) << i;
    return m;
}
#define _mm_test_epi8_mask tf_emulated_test_epi8_mask
static inline __m512d tf_emulated_cvtps_pd(__m256 a)
{
    float x[8];
    double y[8];
    _mm256_storeu_ps(x, a);
    for (int i = 0; i < 8; i++) y[i] = x[i];
    return _mm512_loadu_pd(y);
}
#define _mm512_cvtps_pd tf_emulated_cvtps_pd
#define _mm512_stream_ps _mm512_store_ps
/* Masked loads and stores touch the selected elements only, as the hardware does (SIMDe's read
 * and rewrite the whole vector: past the end of a buffer, and racing with the thread that owns
 * the neighbouring elements). */
#define TF_EMULATED_MASKED(NAME, VEC, ELEM, LANES, MASK)                                        \
    static inline VEC tf_emulated_maskz_loadu_##NAME(MASK k, const void *p)                   \
    {                                                                                       \
        ELEM x[LANES] = {0};                                                                \
        for (int i = 0; i < LANES; i++)                                                     \
            if (k >> i & 1) memcpy(&x[i], (const char *)p + i * sizeof(ELEM), sizeof(ELEM)); \
        VEC v;                                                                              \
        memcpy(&v, x, sizeof v);                                                            \
        return v;                                                                           \
    }                                                                                       \
    static inline void tf_emulated_mask_storeu_##NAME(void *p, MASK k, VEC v)                \
    {                                                                                       \
        ELEM x[LANES];                                                                      \
        memcpy(x, &v, sizeof x);                                                            \
        for (int i = 0; i < LANES; i++)                                                     \
            if (k >> i & 1) memcpy((char *)p + i * sizeof(ELEM), &x[i], sizeof(ELEM));       \
    }
TF_EMULATED_MASKED(ps, __m512, float, 16, __mmask16)
TF_EMULATED_MASKED(epi32, __m512i, int32_t, 16, __mmask16)
TF_EMULATED_MASKED(epi8_128, __m128i, int8_t, 16, __mmask16)
static inline __m512 tf_emulated_mask_loadu_ps(__m512 src, __mmask16 k, const void *p)
{ return _mm512_mask_mov_ps(src, k, tf_emulated_maskz_loadu_ps(k, p)); }
#undef _mm512_maskz_loadu_ps
#undef _mm512_mask_loadu_ps
#undef _mm512_mask_storeu_ps
#undef _mm512_mask_storeu_epi32
#undef _mm_maskz_loadu_epi8
#define _mm512_maskz_loadu_ps tf_emulated_maskz_loadu_ps
#define _mm512_mask_loadu_ps tf_emulated_mask_loadu_ps
#define _mm512_mask_storeu_ps tf_emulated_mask_storeu_ps
#define _mm512_mask_storeu_epi32 tf_emulated_mask_storeu_epi32
#define _mm_maskz_loadu_epi8 tf_emulated_maskz_loadu_epi8_128
/* vdpbf16ps as the hardware computes it (SIMDe's keeps subnormals and adds the even product
 * first): per lane, the odd pair's exact product then the even pair's, each added with one
 * rounding to nearest even; subnormal inputs count as zero and subnormal results are flushed. */
static inline float tf_emulated_ftz(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
    memcpy(&x, &u, sizeof x);
    return x;
}
static inline float tf_emulated_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return tf_emulated_ftz(x);
}
static inline __m512 tf_emulated_dpbf16_ps(__m512 src, __m512bh a, __m512bh b)
{
    float acc[16];
    uint16_t x[32], y[32];
    memcpy(acc, &src, sizeof acc);
    memcpy(x, &a, sizeof x);
    memcpy(y, &b, sizeof y);
    for (int i = 0; i < 16; i++) {
        float s = tf_emulated_ftz(acc[i]);
        s = tf_emulated_ftz(__builtin_fmaf(tf_emulated_bf16(x[2 * i + 1]), tf_emulated_bf16(y[2 * i + 1]), s));
        acc[i] = tf_emulated_ftz(__builtin_fmaf(tf_emulated_bf16(x[2 * i]), tf_emulated_bf16(y[2 * i]), s));
    }
    memcpy(&src, acc, sizeof acc);
    return src;
}
#undef _mm512_dpbf16_ps
#define _mm512_dpbf16_ps tf_emulated_dpbf16_ps
/* vscalefps for finite scales: a * 2^floor(b), rounded once (SIMDe's loses accuracy). */
static inline __m512 tf_emulated_scalef_ps(__m512 a, __m512 b)
{
    float x[16], y[16];
    memcpy(x, &a, sizeof x);
    memcpy(y, &b, sizeof y);
    for (int i = 0; i < 16; i++)
        x[i] = y[i] != y[i] ? y[i] : ldexpf(x[i], (int)fmaxf(fminf(floorf(y[i]), 1000.0f), -1000.0f));
    memcpy(&a, x, sizeof x);
    return a;
}
#undef _mm512_scalef_ps
#define _mm512_scalef_ps tf_emulated_scalef_ps
/* What SIMDe 0.8.2 (the simde-py package) lacks; a SIMDe that has them keeps its own. The
 * reductions add in the order GCC's intrinsics do (halves, then quarters, then pairs), so the
 * sums are the hardware build's to the bit. */
#ifndef _mm512_reduce_add_ps
static inline float tf_simde_reduce_add_ps(__m512 a)
{
    float x[16], h[8], q[4];
    memcpy(x, &a, sizeof x);
    for (int i = 0; i < 8; i++) h[i] = x[i + 8] + x[i];
    for (int i = 0; i < 4; i++) q[i] = h[i + 4] + h[i];
    return (q[0] + q[2]) + (q[1] + q[3]);
}
#define _mm512_reduce_add_ps tf_simde_reduce_add_ps
#endif
#ifndef _mm512_reduce_add_pd
static inline double tf_simde_reduce_add_pd(__m512d a)
{
    double x[8], h[4];
    memcpy(x, &a, sizeof x);
    for (int i = 0; i < 4; i++) h[i] = x[i + 4] + x[i];
    return (h[0] + h[2]) + (h[1] + h[3]);
}
#define _mm512_reduce_add_pd tf_simde_reduce_add_pd
#endif
#ifndef _mm512_cvtepi32_epi16
static inline __m256i tf_simde_cvtepi32_epi16(__m512i a)   /* vpmovdw: truncating */
{
    int32_t x[16];
    int16_t y[16];
    memcpy(x, &a, sizeof x);
    for (int i = 0; i < 16; i++) y[i] = (int16_t)x[i];
    __m256i r;
    memcpy(&r, y, sizeof r);
    return r;
}
#define _mm512_cvtepi32_epi16 tf_simde_cvtepi32_epi16
#endif
#ifndef _mm_mask_cmpeq_epi8_mask
static inline __mmask16 tf_simde_mask_cmpeq_epi8_mask(__mmask16 k, __m128i a, __m128i b)
{
    int8_t x[16], y[16];
    __mmask16 m = 0;
    memcpy(x, &a, sizeof x);
    memcpy(y, &b, sizeof y);
    for (int i = 0; i < 16; i++) m |= (__mmask16)(x[i] == y[i]) << i;
    return m & k;
}
#define _mm_mask_cmpeq_epi8_mask tf_simde_mask_cmpeq_epi8_mask
#endif
/* Fused multiply-adds with one rounding, as the hardware's (SIMDe's portable ones round twice). */
#define TF_EMULATED_FMA(NAME, VEC, ELEM, LANES, FMA, SA, SC)                                    \
    static inline VEC tf_emulated_##NAME(VEC a, VEC b, VEC c)                                  \
    {                                                                                          \
        ELEM x[LANES], y[LANES], z[LANES];                                                     \
        memcpy(x, &a, sizeof x);                                                               \
        memcpy(y, &b, sizeof y);                                                               \
        memcpy(z, &c, sizeof z);                                                               \
        for (int i = 0; i < LANES; i++) x[i] = FMA(SA x[i], y[i], SC z[i]);                    \
        memcpy(&a, x, sizeof x);                                                               \
        return a;                                                                              \
    }
TF_EMULATED_FMA(mm256_fmadd_ps, __m256, float, 8, __builtin_fmaf, +, +)
TF_EMULATED_FMA(mm256_fmsub_ps, __m256, float, 8, __builtin_fmaf, +, -)
TF_EMULATED_FMA(mm256_fnmadd_ps, __m256, float, 8, __builtin_fmaf, -, +)
TF_EMULATED_FMA(mm256_fmadd_pd, __m256d, double, 4, __builtin_fma, +, +)
TF_EMULATED_FMA(mm512_fmadd_ps, __m512, float, 16, __builtin_fmaf, +, +)
TF_EMULATED_FMA(mm512_fmsub_ps, __m512, float, 16, __builtin_fmaf, +, -)
TF_EMULATED_FMA(mm512_fnmadd_ps, __m512, float, 16, __builtin_fmaf, -, +)
TF_EMULATED_FMA(mm512_fmadd_pd, __m512d, double, 8, __builtin_fma, +, +)
#undef _mm256_fmadd_ps
#undef _mm256_fmsub_ps
#undef _mm256_fnmadd_ps
#undef _mm256_fmadd_pd
#undef _mm512_fmadd_ps
#undef _mm512_fmsub_ps
#undef _mm512_fnmadd_ps
#undef _mm512_fmadd_pd
#define _mm256_fmadd_ps tf_emulated_mm256_fmadd_ps
#define _mm256_fmsub_ps tf_emulated_mm256_fmsub_ps
#define _mm256_fnmadd_ps tf_emulated_mm256_fnmadd_ps
#define _mm256_fmadd_pd tf_emulated_mm256_fmadd_pd
#define _mm512_fmadd_ps tf_emulated_mm512_fmadd_ps
#define _mm512_fmsub_ps tf_emulated_mm512_fmsub_ps
#define _mm512_fnmadd_ps tf_emulated_mm512_fnmadd_ps
#define _mm512_fmadd_pd tf_emulated_mm512_fmadd_pd
#else
#include <immintrin.h>
#define TF_TARGET(features) __attribute__((target(features)))
/* Keeps v rounded on its own: a product is not contracted into a later FMA. */
#define TF_ROUNDED(v) __asm__("" : "+v"(v))
#endif
#define TF_TARGET_AVX2 TF_TARGET("avx2,fma")
#define TF_TARGET_AVX512 TF_TARGET("avx512f,avx512vl,avx512dq,avx512bw,fma")
#define TF_TARGET_AVX512_VNNI TF_TARGET("avx512f,avx512vl,avx512dq,avx512bw,fma,avx512vnni")
#define TF_TARGET_AVX512_BF16 TF_TARGET("avx512f,avx512vl,avx512dq,avx512bw,fma,avx512vnni,avx512bf16")
#else
#define TF_HAVE_X86 0
#endif

#endif
