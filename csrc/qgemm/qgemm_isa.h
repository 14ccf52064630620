/* csrc/qgemm/: the int8 GEMM of qgemm.h, one file per concern, in the shape of csrc/gemm/.
 *
 * This header is the contract of the folder: the micro-kernel signature every instruction set
 * implements, the panel layout it reads, and what the files share. The files:
 *
 *   qgemm_isa.h    this contract
 *   dispatch.c     the table of which kernel and layout run at which level (cpu.h)
 *   quantize.c     the quantization rule, per row: plain C and AVX2; qgemm_quantize
 *   pack.c         the packed buffer: header, sections, qgemm_pack, qgemm_packed_info
 *   product.c      qgemm_packed: activations quantized, then threads over panels and row blocks
 *   generic.c      plain C: one int32 dot product per element
 *   avx2.c         AVX2: the 6 x 16 vpmaddwd kernel
 *   avx512_vnni.h/.c  AVX-512 VNNI: the 12 x 32 vpdpbusd kernel (+ its dequantization, which
 *                  the amx tiles reuse)
 *   amx.c          AMX tiles: the 32 x 32 tdpbusd tile kernel
 *   neon_dotprod.c Arm's dot products (aarch64): the 4 x 16 SDOT kernel
 *
 * Adding an instruction set: a file with its kernel, its declaration below, and a row in
 * dispatch.c's table. How a product runs: product.c. */
#ifndef TF_QGEMM_ISA_H
#define TF_QGEMM_ISA_H

#include "qgemm.h"
#include "amx.h"
#include "cpu.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include "simd.h"
#if TF_HAVE_X86
#define QGEMM_X86 1
#define TARGET_AVX2 TF_TARGET_AVX2
#define TARGET_VNNI TF_TARGET_AVX512_VNNI
#endif
#if defined(__aarch64__) && defined(QGEMM_X86)
#define QGEMM_NEON_DOTPROD 1   /* the neon_dotprod level (cpu.h): the SDOT kernel */
#endif

/* Everything declared below is internal to the folder: hidden, so the extension does not export
 * it and calls between the files are direct, not through the PLT (as when this was one file's
 * statics). */
#pragma GCC visibility push(hidden)

/* Multiply-adds per thread below which no other thread is started (see GEMM_GRAIN): about 20 us
 * on an AVX2 core. Decoding calls these back to back, so the team is awake; with 4M (the value
 * until 2026-11-26) a base-size step's 8-row x @ W^T for W of 512 x 512 and 1536 x 512 ran on one
 * thread, and 2 threads decoded greedy 9-13% slower than with every product split (AMD EPYC
 * Zen 2, family 23 model 49). */
#define QGEMM_GRAIN (1L << 20)
/* How far ahead (bytes) the first row tile of a block fetches a panel streaming from memory. */
#define QGEMM_AHEAD 2048

static inline long ceil_div(long a, long b) { return (a + b - 1) / b; }
static inline long min_l(long a, long b) { return a < b ? a : b; }
static inline long round64(long bytes) { return (bytes + 63) / 64 * 64; }

/* Panel geometry of an instruction set: NR columns per panel, k in groups of KG. */
typedef struct { int nr, kg; } qgemm_layout;

/* Quantization (quantize.c). */

/* clamp(rint(v * inv), -127, 127); v * inv is finite and at most 127 * (1 + 2^-23) in
 * magnitude whenever inv != 0, so the conversion is always defined. */
static inline int quantize_one(float v, float inv)
{
    float r = nearbyintf(v * inv);
    if (r > 127.0f) r = 127.0f;
    if (r < -127.0f) r = -127.0f;
    return (int)r;
}

/* The scale of row v[0, K) and its inv (row_rule), scanning the row one element at a time. */
float qgemm_row_scale_c(long K, const float *v, float *inv);
/* Row v[0, K) into q8 (int8) or q16 (int16), whichever is not NULL; returns the scale. */
float qgemm_quantize_row_c(long K, const float *v, int8_t *q8, int16_t *q16);
#ifdef QGEMM_X86
/* The same into int16, with AVX2. */
float qgemm_quantize_row_avx2(long K, const float *v, int16_t *q);
#endif
/* Row q of int16 activations rewritten in place as uint8 q + 128, what vpdpbusd reads. */
void qgemm_to_unsigned(int16_t *q, long K);
#ifdef QGEMM_NEON_DOTPROD
/* The same row rewritten in place as int8 q, what SDOT reads. */
void qgemm_to_signed(int16_t *q, long K);
#endif

/* Micro-kernels: rows [0, m) of the block (Xq: int16 rows of ldq, zero past K, or for VNNI
 * the same rows as uint8 q + 128 at the start of each row; xs: their scales) times one panel
 * (ws, comp: its NR scales and compensations; bias: at its first column, or NULL) into the
 * nr <= NR columns of C that the panel covers. */
typedef void (*qgemm_kernel)(long m, long K, const int16_t *Xq, long ldq, const float *xs,
                             const int8_t *panel, const float *ws, const int32_t *comp,
                             const float *bias, float *C, long ldc, int nr);

/* The dequantization, one element (every path computes exactly this). */
static inline float dequantize(int32_t acc, float xs, float ws, const float *bias)
{
    float s = xs * ws;
    return bias ? fmaf((float)acc, s, *bias) : (float)acc * s;
}

/* Each instruction set's kernel (dispatch.c says which runs at which level). */
/* generic.c */
void qgemm_kernel_generic(long m, long K, const int16_t *Xq, long ldq, const float *xs,
                          const int8_t *panel, const float *ws, const int32_t *comp,
                          const float *bias, float *C, long ldc, int nr);
#ifdef QGEMM_X86
/* avx2.c */
void qgemm_kernel_avx2(long m, long K, const int16_t *Xq, long ldq, const float *xs,
                       const int8_t *panel, const float *ws, const int32_t *comp,
                       const float *bias, float *C, long ldc, int nr);
/* avx512_vnni.c */
void qgemm_kernel_vnni(long m, long K, const int16_t *Xq, long ldq, const float *xs,
                       const int8_t *panel, const float *ws, const int32_t *comp,
                       const float *bias, float *C, long ldc, int nr);
#if TF_HAVE_AMX
/* amx.c */
void qgemm_kernel_amx(long m, long K, const int16_t *Xq, long ldq, const float *xs,
                      const int8_t *panel, const float *ws, const int32_t *comp,
                      const float *bias, float *C, long ldc, int nr);
#endif
#endif
#ifdef QGEMM_NEON_DOTPROD
/* neon_dotprod.c */
void qgemm_kernel_neon_dotprod(long m, long K, const int16_t *Xq, long ldq, const float *xs,
                               const int8_t *panel, const float *ws, const int32_t *comp,
                               const float *bias, float *C, long ldc, int nr);
#endif

/* The panel layout and the kernel of level `isa` (dispatch.c). */
qgemm_layout qgemm_layout_of(int isa);
qgemm_kernel qgemm_kernel_of(int isa);

/* Byte offsets of the packed buffer's sections; returns the total size (pack.c). */
long qgemm_sections(int isa, long N, long K, long *scale_at, long *comp_at, long *panels_at);

#pragma GCC visibility pop

#endif
