/* AMX tiles (the amx level of cpu.h): what the bf16 and int8 GEMMs' tile kernels share.
 *
 * Eight tile registers of up to 16 rows x 64 bytes. Every kernel here uses one shape for all
 * eight, so one configuration serves them all:
 *   tiles 0-3: C, 16 x 16 fp32 (tdpbf16ps) or int32 (tdpbusd) accumulators, a 32 x 32 block
 *              of C as [rows 0-15 | 16-31] x [columns 0-15 | 16-31];
 *   tiles 4-5: A, rows 0-15 and 16-31 of a 32-row panel: 32 bf16 or 64 u8 of k per row;
 *   tiles 6-7: B, columns 0-15 and 16-31: 16 rows of k pairs (bf16) or quads (int8), each row
 *              16 columns x 4 bytes: the pair / quad layout the vdpbf16ps and vpdpbusd kernels
 *              already pack B in, so one packed B serves both.
 *
 * The configuration and the tiles are per thread, and other libraries in the process (oneDNN
 * under PyTorch) configure tiles of their own on the same threads. So every parallel region
 * that runs tile kernels configures on entry (tf_amx_begin) and releases on exit (tf_amx_end):
 * between the two nothing but our kernels runs on that thread.
 *
 * Compiled out (TF_HAVE_AMX 0) with SIMDe's intrinsics (TF_SIMDE: TF_EMULATE_X86 and aarch64;
 * SIMDe has no AMX) and with compilers
 * without the intrinsics; the amx level is then never reported (cpu.c). */
#ifndef TF_AMX_H
#define TF_AMX_H

#include "simd.h"

#include <stdint.h>

#if TF_HAVE_X86 && !defined(TF_SIMDE) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#define TF_HAVE_AMX 1
#define TF_TARGET_AMX \
    TF_TARGET("avx512f,avx512vl,avx512dq,avx512bw,fma,avx512vnni,avx512bf16,amx-tile,amx-bf16,amx-int8")

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tf_amx_config;

/* One constant in memory: gcc's _tile_loadconfig tells the compiler it reads only the first
 * 8 bytes, so a configuration built on the stack just before it loses its stores. */
static const tf_amx_config tf_amx_tiles = {
    1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

static inline TF_TARGET_AMX void tf_amx_begin(void) { _tile_loadconfig(&tf_amx_tiles); }

static inline TF_TARGET_AMX void tf_amx_end(void) { _tile_release(); }
#else
#define TF_HAVE_AMX 0
#endif

#endif
