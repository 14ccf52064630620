/* Run-time CPU dispatch and the process-wide thread count (see cpu.h). */
#include "cpu.h"

#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static int forced_isa = -1;   /* -1: not forced */
static int num_threads = 0;   /* 0: not yet initialised */

int tf_cpu_best_isa(void)
{
#if defined(TF_EMULATE_X86)
    return TF_ISA_AVX512_BF16;   /* simd.h: every level runs as SIMDe's portable C */
#elif defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    /* gcc's checks include OS support of the wide registers (XCR0). */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw")) {
        if (!__builtin_cpu_supports("avx512vnni")) return TF_ISA_AVX512;
        return __builtin_cpu_supports("avx512bf16") ? TF_ISA_AVX512_BF16 : TF_ISA_AVX512_VNNI;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return TF_ISA_AVX2;
#endif
    return TF_ISA_GENERIC;
}

int tf_isa(void)
{
    static int best = -1;
    if (best < 0) best = tf_cpu_best_isa();
    if (forced_isa >= 0 && forced_isa < best) return forced_isa;
    return best;
}

int tf_set_isa(int level)
{
    if (level < TF_ISA_GENERIC) level = TF_ISA_GENERIC;
    if (level > TF_ISA_AVX512_BF16) level = TF_ISA_AVX512_BF16;
    forced_isa = level;
    return tf_isa();
}

const char *tf_isa_name(int level)
{
    switch (level) {
    case TF_ISA_AVX512_BF16: return "avx512_bf16";
    case TF_ISA_AVX512_VNNI: return "avx512_vnni";
    case TF_ISA_AVX512: return "avx512";
    case TF_ISA_AVX2: return "avx2";
    default: return "generic";
    }
}

void tf_set_num_threads(int n)
{
    if (n < 1) n = 1;
    num_threads = n;
#ifdef _OPENMP
    omp_set_num_threads(n);
    omp_set_max_active_levels(1);  /* no nested parallelism, ever */
#endif
}

int tf_get_num_threads(void)
{
    if (num_threads <= 0) {
#ifdef _OPENMP
        num_threads = omp_get_max_threads();
#else
        num_threads = 1;
#endif
    }
    return num_threads;
}

int tf_openmp_version(void)
{
#ifdef _OPENMP
    return _OPENMP;
#else
    return 0;
#endif
}

const char *tf_compiler(void)
{
#if defined(__clang__)
    return "clang " __clang_version__;
#elif defined(__GNUC__)
    return "gcc " __VERSION__;
#else
    return "unknown";
#endif
}

int tf_probe_team(void)
{
    int team = 1;
#ifdef _OPENMP
#pragma omp parallel num_threads(tf_team(1L << 30, 1))
    {
#pragma omp single
        team = omp_get_num_threads();
    }
#endif
    return team;
}
