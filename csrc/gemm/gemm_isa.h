/* csrc/gemm/: the fp32 and bf16 GEMM of gemm.h, one file per concern.
 *
 * This header is the contract of csrc/gemm/: what one instruction set's file provides (micro-
 * kernels, packing and their description, gemm_isa) and the helpers they share. The files:
 *
 *   gemm_isa.h     this contract: the micro-kernel, packing and dot signatures, gemm_isa, and
 *                  every instruction set's descriptions
 *   dispatch.c     the table of which descriptions run at which level (cpu.h)
 *   blocks.h       a block of C as micro-kernel calls (K blocking, A packing, the kernel loop),
 *                  shared by the schedules and the pre-packed path
 *   schedule.c     the schedules: what runs where, on how many threads; gemm, gemm_batched
 *   buffer.c       the process-wide packing buffer
 *   packed.c       the pre-packed path: gemm_pack_b, gemm_packed
 *   reference.c    the naive triple loop
 *   generic.c      plain C: portable packing, the 4 x 8 kernel
 *   avx2.c         AVX2 + FMA: the 6 x 16 kernel, its packing, bf16 pairs for pre-packed B
 *   avx512.h/.c    AVX-512: the 14 x 32 kernel, its packing, the dot path
 *   avx512_bf16.c  vdpbf16ps: the 14 x 32 kernel over bf16 pairs
 *   amx.c          AMX tiles: the 32 x 32 bf16 tile kernel
 *
 * Adding an instruction set: a file that defines its gemm_isa descriptions, their declarations
 * below, and a row in dispatch.c's table.
 *
 * How a product is cut into blocks, micro-kernels and threads: schedule.c. */
#ifndef TF_GEMM_ISA_H
#define TF_GEMM_ISA_H

#include "gemm.h"
#include "amx.h"
#include "cpu.h"
#include "simd_math.h"

#include <stdint.h>
#include <string.h>
#if TF_HAVE_X86
#define GEMM_X86 1
#endif

/* Everything declared below is internal to the folder: hidden, so the extension does not export
 * it and calls between the files are direct, not through the PLT (as when this was one file's
 * statics). */
#pragma GCC visibility push(hidden)

#define MAX_MR 32   /* the amx tile kernel's 32 rows; the register kernels have at most 14 */

/* C[mr x nr] = alpha * Ap @ Bp (load_c = 0) or C += alpha * Ap @ Bp (load_c = 1).
 * Ap: [kc][MR] packed rows of op(A). Bp: kc rows of op(B), row k at Bp + k*bs (bs = NR
 * when packed; columns past nr are zero in packed panels, never read when in place). */
typedef void (*gemm_kernel)(long kc, const float *Ap, const float *Bp, long bs, float *C, long ldc,
                            int nr, const float *alpha, int load_c);

/* Pack rows [0, m) (pack_a) or columns [0, n) (pack_b) of an operand block into micro-panels. */
typedef void (*gemm_pack)(int trans, const float *X, long ldx, long n, long kc, float *dst);
/* Panels [p0, p1) of a transposed op(A) block of mc rows balanced into ceil(mc / mr) panels (as
 * pack_a_panels balances them, blocks.h), panel p at Ap + p * mr * kc, in one pass down A's rows. */
typedef void (*gemm_pack_panels)(const float *A, long lda, long mc, long p0, long p1, long kc, float *Ap);

/* Columns [j0, j1) of C = alpha * A @ B^T (+ C), A row-major M x K, B row-major N x K:
 * every element one dot product of two contiguous rows (decoding: few rows, a weight matrix). */
typedef void (*gemm_dot)(long M, long K, float alpha, const float *A, long lda, const float *B, long ldb,
                         int accumulate, float *C, long ldc, long j0, long j1);

typedef struct {
    int mr, nr;            /* register tile */
    long kc, mc, nc;       /* cache blocks: K (maximum), M per thread block, N */
    gemm_kernel kernel[MAX_MR + 1];   /* kernel[r] computes r <= mr rows */
    gemm_kernel half[MAX_MR + 1];     /* the same for at most nr / 2 columns, or NULLs */
    gemm_pack pack_a, pack_b;
    gemm_dot dot;          /* A @ B^T for few rows without packing, or NULL */
    gemm_kernel stream[MAX_MR + 1];   /* kernel[r] for a Bp streamed from memory, or NULLs */
    int bf16;              /* 1: operands rounded to bf16 while packing; nothing read unpacked */
    int pairs;             /* 1: packed B panels hold bf16 pairs [ceil(kc/2)][NR] (vdpbf16ps, amx); A
                              panels too, except amx's (rows of kc bf16: pack_a_amx) */
    int amx;               /* 1: tile kernels: tf_amx_begin / tf_amx_end around them (amx.h) */
    int even_k;            /* 1: K blocks of even length, as pairs have (k_block), with packing in
                              floats: AVX2's bf16 kernels, whose pre-packed B holds pairs */
    gemm_pack_panels pack_at;   /* a transposed op(A)'s panels together, or NULL: pack_a each */
} gemm_isa;

static inline long ceil_div(long a, long b) { return (a + b - 1) / b; }
static inline long min_l(long a, long b) { return a < b ? a : b; }
static inline long max_l(long a, long b) { return a > b ? a : b; }

/* bf16 operands (gemm.h: GEMM_BF16). Each ISA's packing routines, followed by rounding the packed
 * block to bf16 in place; the fp32 micro-kernels then multiply exactly (a product of two bf16
 * values has at most 16 significant bits, so an FMA adds it to the accumulator with the single
 * rounding of an fp32 sum, as vdpbf16ps does). Nothing is read unpacked: no dot path, no B read
 * in place. */

/* x rounded to the nearest bf16, ties to even, kept as a float with the low 16 bits zero; a
 * subnormal result is zero of its sign (vdpbf16ps treats subnormal inputs as zero, so every level
 * does). NaN stays NaN (quietened: rounding could carry its payload into infinity). */
static inline float round_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) u |= 0x00400000u;
    else u += 0x7fffu + ((u >> 16) & 1u);
    u &= (u & 0x7f800000u) ? 0xffff0000u : 0x80000000u;
    memcpy(&x, &u, 4);
    return x;
}

static inline void round_bf16_block(float *p, long n)
{
    for (long i = 0; i < n; i++) p[i] = round_bf16(p[i]);
}

#define BF16_PACKS(NAME, MR, NR)                                                               \
    static void pack_a_##NAME##_bf16(int t, const float *X, long ldx, long n, long kc, float *dst) \
    { pack_a_##NAME(t, X, ldx, n, kc, dst); round_bf16_block(dst, ceil_div(n, MR) * MR * kc); }  \
    static void pack_b_##NAME##_bf16(int t, const float *X, long ldx, long n, long kc, float *dst) \
    { pack_b_##NAME(t, X, ldx, n, kc, dst); round_bf16_block(dst, ceil_div(n, NR) * NR * kc); }

/* Each instruction set's descriptions (dispatch.c says which runs at which level). */
extern const gemm_isa isa_generic, isa_generic_bf16;                       /* generic.c */
#ifdef GEMM_X86
extern const gemm_isa isa_avx2, isa_avx2_bf16, isa_avx2_bf16_packed;       /* avx2.c */
extern const gemm_isa isa_avx512, isa_avx512_bf16;                         /* avx512.c */
extern const gemm_isa isa_avx512_dpbf16;                                   /* avx512_bf16.c */
#if TF_HAVE_AMX
extern const gemm_isa isa_amx_bf16;                                        /* amx.c */
#endif
#endif

/* The descriptions that run at `level` (a TF_ISA_* level) for operands of precision `prec`
 * (GEMM_FP32 | GEMM_BF16): for products packed on the fly (gemm_isa_of), and for an op(B) packed
 * ahead by gemm_pack_b (packed_isa_of). dispatch.c. */
const gemm_isa *gemm_isa_of(int level, int prec);
const gemm_isa *packed_isa_of(int level, int prec);

#pragma GCC visibility pop

#endif
