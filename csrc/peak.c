/* peak_fma_gflops, peak_int8_gops (peak.h). */
#include "peak.h"
#include "amx.h"
#include "cpu.h"

#include <math.h>
#include <stdint.h>
#include <time.h>
#include "simd.h"
#if TF_HAVE_X86
#define PEAK_X86 1
#endif

#define CHAINS 16      /* AVX-512 and plain C; AVX2 has 16 registers: 12 chains + 2 operands */
#define CHAINS_YMM 12
#define ROUNDS 4096L   /* iterations between clock reads */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Each kernel runs `rounds` iterations of CHAINS independent operations and returns a value that
 * depends on all of them (so nothing is optimised away). */

static float fma_generic(long rounds)   /* a multiply and an add, as the plain C GEMM compiles */
{
    float acc[CHAINS], a = 0.999999f, b = 1e-7f;
    for (int c = 0; c < CHAINS; c++) acc[c] = (float)c;
    for (long r = 0; r < rounds; r++)
        for (int c = 0; c < CHAINS; c++) acc[c] = acc[c] * a + b;
    float s = 0.0f;
    for (int c = 0; c < CHAINS; c++) s += acc[c];
    return s;
}

static int32_t madd_generic(long rounds)
{
    int32_t acc[CHAINS];
    volatile int32_t seed = 3;
    int32_t a = seed, b = seed + 1;
    for (int c = 0; c < CHAINS; c++) acc[c] = c;
    for (long r = 0; r < rounds; r++)
        for (int c = 0; c < CHAINS; c++) acc[c] = acc[c] * a + b;   /* a recurrence: not foldable */
    int32_t s = 0;
    for (int c = 0; c < CHAINS; c++) s ^= acc[c];
    return s;
}

#ifdef PEAK_X86
TF_TARGET_AVX2 static float fma_avx2(long rounds)
{
    __m256 acc[CHAINS_YMM], a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (int c = 0; c < CHAINS_YMM; c++) acc[c] = _mm256_set1_ps((float)c);
    for (long r = 0; r < rounds; r++)
#pragma GCC unroll 12
        for (int c = 0; c < CHAINS_YMM; c++) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
    __m256 s = acc[0];
    for (int c = 1; c < CHAINS_YMM; c++) s = _mm256_add_ps(s, acc[c]);
    return _mm256_cvtss_f32(s);
}

TF_TARGET_AVX512 static float fma_avx512(long rounds)
{
    __m512 acc[CHAINS], a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_set1_ps((float)c);
    for (long r = 0; r < rounds; r++)
#pragma GCC unroll 16
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
    __m512 s = acc[0];
    for (int c = 1; c < CHAINS; c++) s = _mm512_add_ps(s, acc[c]);
    return _mm512_reduce_add_ps(s);
}

/* v, as if changed here: in a register, or in memory where SIMDe's vectors are structs (the
 * emulated test build, csrc/simd.h). */
#ifdef TF_EMULATE_X86
#define OPAQUE(v) __asm__("" : "+m"(v))
#else
#define OPAQUE(v) __asm__("" : "+x"(v))
#endif

/* vpmaddwd + vpaddd: what the AVX2 int8 kernel issues per 16 products (csrc/qgemm/avx2.c), in its
 * shape: rows' activation pairs, broadcast from memory, times two weight vectors. The products do
 * not depend on the sums (a chain through the madd would measure its latency, not its
 * throughput), so a vpaddd's latency of one cycle needs few sums: three rows' six, which leaves
 * gcc room for all of them in registers (with twelve it spills them on every round); the empty
 * asm makes the operands new every round, so nothing is hoisted out of the loop. */
TF_TARGET_AVX2 static int32_t madd_avx2(long rounds)
{
    static const int32_t pairs[3] = {0x00030002, 0x00050004, 0x00070006};
    const int32_t *p = pairs;
    __m256i w0 = _mm256_set1_epi16(-5), w1 = _mm256_set1_epi16(7);
    __m256i a0 = w0, a1 = w0, a2 = w0, a3 = w0, a4 = w0, a5 = w0;
    for (long r = 0; r < rounds; r++) {
        OPAQUE(w0);
        OPAQUE(w1);
        __asm__("" : "+r"(p));
#define MADD_ROW(A, B, I)                                                    \
        {                                                                    \
            const __m256i x = _mm256_set1_epi32(p[I]);                       \
            A = _mm256_add_epi32(A, _mm256_madd_epi16(x, w0));               \
            B = _mm256_add_epi32(B, _mm256_madd_epi16(x, w1));               \
        }
        MADD_ROW(a0, a1, 0) MADD_ROW(a2, a3, 1) MADD_ROW(a4, a5, 2)
#undef MADD_ROW
    }
    __m256i s = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    return _mm256_extract_epi32(_mm256_xor_si256(s, _mm256_xor_si256(a4, a5)), 0);
}

/* vpdpbusd: the VNNI int8 kernel's instruction, 64 u8 x s8 products. */
TF_TARGET_AVX512_VNNI static int32_t dpbusd_avx512(long rounds)
{
    __m512i acc[CHAINS], a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-5);
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_set1_epi32(c);
    for (long r = 0; r < rounds; r++)
#pragma GCC unroll 16
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_dpbusd_epi32(acc[c], a, b);
    __m512i s = acc[0];
    for (int c = 1; c < CHAINS; c++) s = _mm512_xor_si512(s, acc[c]);
    return _mm_cvtsi128_si32(_mm512_castsi512_si128(s));
}

/* vdpbf16ps: the bf16 GEMM kernel's instruction, 32 bf16 products added into 16 fp32 lanes. */
TF_TARGET_AVX512_BF16 static float dpbf16_avx512(long rounds)
{
    __m512 acc[CHAINS];
    const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f7f3f7f), b = (__m512bh)_mm512_set1_epi32(0x33d633d6);
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_set1_ps((float)c);
    for (long r = 0; r < rounds; r++)
#pragma GCC unroll 16
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
    __m512 s = acc[0];
    for (int c = 1; c < CHAINS; c++) s = _mm512_add_ps(s, acc[c]);
    return _mm512_reduce_add_ps(s);
}
#endif

#if TF_HAVE_AMX
/* tdpbf16ps / tdpbusd: the amx GEMM kernels' instructions, on four independent C tiles (as the
 * kernels' 32 x 32 tile), operands held in tiles: 4 x 16 x 16 x 32 bf16 or x 64 int8 products
 * a round. */
#define TILE_PEAK(NAME, ACC, OPERAND, VALUE, DP)                                   \
    TF_TARGET_AMX static ACC NAME(long rounds)                                        \
    {                                                                                 \
        OPERAND x[16 * 64 / sizeof(OPERAND)];                                         \
        ACC c[16 * 16];                                                               \
        for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) x[i] = VALUE;             \
        tf_amx_begin();                                                               \
        _tile_loadd(4, x, 64);                                                        \
        _tile_loadd(5, x, 64);                                                        \
        _tile_loadd(6, x, 64);                                                        \
        _tile_loadd(7, x, 64);                                                        \
        _tile_zero(0);                                                                \
        _tile_zero(1);                                                                \
        _tile_zero(2);                                                                \
        _tile_zero(3);                                                                \
        for (long r = 0; r < rounds; r++) {                                           \
            DP(0, 4, 6);                                                              \
            DP(1, 4, 7);                                                              \
            DP(2, 5, 6);                                                              \
            DP(3, 5, 7);                                                              \
        }                                                                             \
        _tile_stored(3, c, 64);                                                       \
        tf_amx_end();                                                                 \
        return c[0];                                                                  \
    }
TILE_PEAK(tdpbf16_amx, float, uint16_t, 0x3c00 /* 2^-7 in bf16 */, _tile_dpbf16ps)
TILE_PEAK(tdpbusd_amx, int32_t, int8_t, 3, _tile_dpbusd)
#endif

volatile float peak_sink_f;
volatile int32_t peak_sink_i;

static double measure(int kind, int isa, double seconds, double *ops_per_round)
{
    long rounds = 0;
    double start = now(), elapsed;
    do {
#if TF_HAVE_AMX
        if (kind == 1 && isa >= TF_ISA_AMX) { peak_sink_i = tdpbusd_amx(ROUNDS); *ops_per_round = 4 * 16 * 16 * 64 * 2.0; }
        else if (kind == 2 && isa >= TF_ISA_AMX) { peak_sink_f = tdpbf16_amx(ROUNDS); *ops_per_round = 4 * 16 * 16 * 32 * 2.0; }
        else
#endif
#ifdef PEAK_X86
        if (kind == 0 && isa >= TF_ISA_AVX512) { peak_sink_f = fma_avx512(ROUNDS); *ops_per_round = CHAINS * 32.0; }
        else if (kind == 0 && isa >= TF_ISA_AVX2) { peak_sink_f = fma_avx2(ROUNDS); *ops_per_round = CHAINS_YMM * 16.0; }
        else if (kind == 1 && isa >= TF_ISA_AVX512_VNNI) { peak_sink_i = dpbusd_avx512(ROUNDS); *ops_per_round = CHAINS * 128.0; }
        else if (kind == 1 && isa >= TF_ISA_AVX2) { peak_sink_i = madd_avx2(ROUNDS); *ops_per_round = 6 * 32.0; }
        else if (kind == 2 && isa >= TF_ISA_AVX512_BF16) { peak_sink_f = dpbf16_avx512(ROUNDS); *ops_per_round = CHAINS * 64.0; }
        else if (kind == 2 && isa >= TF_ISA_AVX512) { peak_sink_f = fma_avx512(ROUNDS); *ops_per_round = CHAINS * 32.0; }
        else if (kind == 2 && isa >= TF_ISA_AVX2) { peak_sink_f = fma_avx2(ROUNDS); *ops_per_round = CHAINS_YMM * 16.0; }
        else
#endif
        if (kind != 1) { peak_sink_f = fma_generic(ROUNDS); *ops_per_round = CHAINS * 2.0; }
        else { peak_sink_i = madd_generic(ROUNDS); *ops_per_round = CHAINS * 2.0; }
        rounds += ROUNDS;
        elapsed = now() - start;
    } while (elapsed < seconds);
    return (double)rounds * *ops_per_round / elapsed * 1e-9;
}

double peak_fma_gflops(int isa, double seconds)
{
    double per_round;
    return measure(0, isa, seconds, &per_round);
}

double peak_bf16_gflops(int isa, double seconds)
{
    double per_round;
    return measure(2, isa, seconds, &per_round);
}

double peak_int8_gops(int isa, double seconds)
{
    double per_round;
    return measure(1, isa, seconds, &per_round);
}
