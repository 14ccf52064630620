/* Which int8 kernel, and so which panel layout, runs at which instruction-set level (cpu.h): one
 * row per level. A level with no kernel of its own runs the one below's (AVX-512 without VNNI
 * runs the AVX2 kernel; avx512_bf16 the VNNI one; on aarch64, neon runs AVX2's through SIMDe and
 * neon_dotprod the SDOT kernel). The bits are the same on every row (qgemm.h);
 * only the speed and the layout differ. */
#include "qgemm_isa.h"

typedef struct {
    qgemm_layout layout;   /* NR columns per panel, k in groups of KG */
    qgemm_kernel kernel;
    const char *name;      /* qgemm_path_name */
} qgemm_level;

#define GENERIC_ROW {{1, 1}, qgemm_kernel_generic, "generic (C, int32)"}
#if defined(__aarch64__)
#define AVX2_ROW {{16, 2}, qgemm_kernel_avx2, "neon (avx2's vpmaddwd kernel through SIMDe, int32)"}
#else
#define AVX2_ROW {{16, 2}, qgemm_kernel_avx2, "avx2 (vpmaddwd, int32)"}
#endif
#define VNNI_ROW {{32, 4}, qgemm_kernel_vnni, "avx512_vnni (vpdpbusd, int32)"}

/* Rows left empty (the x86 levels on another architecture) run the generic kernel. */
static const qgemm_level levels[TF_ISA_LEVELS] = {
    [TF_ISA_GENERIC]     = GENERIC_ROW,
#ifdef QGEMM_NEON_DOTPROD
    [TF_ISA_NEON]        = AVX2_ROW,
    [TF_ISA_NEON_DOTPROD] = {{16, 4}, qgemm_kernel_neon_dotprod, "neon_dotprod (sdot, int32)"},
#elif defined(QGEMM_X86)
    [TF_ISA_AVX2]        = AVX2_ROW,
    [TF_ISA_AVX512]      = AVX2_ROW,
    [TF_ISA_AVX512_VNNI] = VNNI_ROW,
    [TF_ISA_AVX512_BF16] = VNNI_ROW,
#if TF_HAVE_AMX
    [TF_ISA_AMX]         = {{32, 4}, qgemm_kernel_amx, "amx (tdpbusd tiles, int32)"},
#else
    [TF_ISA_AMX]         = VNNI_ROW,
#endif
#endif
};

/* Levels past the last run the last row's kernel, as they would any level's at or above it. */
static const qgemm_level *level_row(int isa)
{
    const int level = isa < TF_ISA_GENERIC ? TF_ISA_GENERIC
                    : isa >= TF_ISA_LEVELS ? TF_ISA_LEVELS - 1 : isa;
    return levels[level].kernel ? &levels[level] : &levels[TF_ISA_GENERIC];
}

qgemm_layout qgemm_layout_of(int isa) { return level_row(isa)->layout; }

qgemm_kernel qgemm_kernel_of(int isa) { return level_row(isa)->kernel; }

const char *qgemm_path_name(int isa) { return level_row(isa)->name; }
