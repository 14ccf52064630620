/* Which micro-kernels run at which instruction-set level (cpu.h): one row per level.
 *
 * A level with nothing of its own for a precision runs the level below's (avx512_vnni has int8
 * kernels only, qgemm's; amx has bf16 tiles only). A pre-packed bf16 op(B) is packed for the
 * bf16 descriptions, except at the AVX2 level, whose pre-packed panels hold pairs
 * (isa_avx2_bf16_packed); a pre-packed fp32 op(B) for the fp32 ones. */
#include "gemm_isa.h"

typedef struct {
    const gemm_isa *fp32;          /* GEMM_FP32 */
    const gemm_isa *bf16;          /* GEMM_BF16, packed on the fly */
    const gemm_isa *bf16_packed;   /* GEMM_BF16, op(B) packed ahead (gemm_pack_b, gemm_packed) */
} gemm_level;

/* Rows left empty (the x86 levels on another architecture) run the generic kernels. */
static const gemm_level levels[TF_ISA_LEVELS] = {
    [TF_ISA_GENERIC]     = {&isa_generic, &isa_generic_bf16, &isa_generic_bf16},
#ifdef GEMM_X86
    [TF_ISA_AVX2]        = {&isa_avx2, &isa_avx2_bf16, &isa_avx2_bf16_packed},
#if defined(__aarch64__)   /* neon_dotprod has int8 kernels only: neon's (avx2's) run */
    [TF_ISA_NEON_DOTPROD] = {&isa_avx2, &isa_avx2_bf16, &isa_avx2_bf16_packed},
#endif
    [TF_ISA_AVX512]      = {&isa_avx512, &isa_avx512_bf16, &isa_avx512_bf16},
    [TF_ISA_AVX512_VNNI] = {&isa_avx512, &isa_avx512_bf16, &isa_avx512_bf16},
    [TF_ISA_AVX512_BF16] = {&isa_avx512, &isa_avx512_dpbf16, &isa_avx512_dpbf16},
#if TF_HAVE_AMX
    [TF_ISA_AMX]         = {&isa_avx512, &isa_amx_bf16, &isa_amx_bf16},
#else
    [TF_ISA_AMX]         = {&isa_avx512, &isa_avx512_dpbf16, &isa_avx512_dpbf16},
#endif
#endif
};

static const gemm_level *level_row(int level)
{
    return level >= 0 && level < TF_ISA_LEVELS && levels[level].fp32 ? &levels[level]
                                                                      : &levels[TF_ISA_GENERIC];
}

const gemm_isa *gemm_isa_of(int level, int prec)
{
    return prec == GEMM_BF16 ? level_row(level)->bf16 : level_row(level)->fp32;
}

const gemm_isa *packed_isa_of(int level, int prec)
{
    return prec == GEMM_BF16 ? level_row(level)->bf16_packed : level_row(level)->fp32;
}
