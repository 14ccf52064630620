/* Run-time CPU dispatch and the process-wide thread count (see cpu.h). */
#include "cpu.h"

#include "amx.h"

#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)   /* asm/hwcap.h, Linux 4.15 */
#endif
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif
#if TF_HAVE_AMX
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

static int forced_isa = -1;   /* -1: not forced */
static int num_threads = 0;   /* 0: not yet initialised */
/* The calling thread's own cap on its kernels' teams (0: none). A training step split into
 * sentence shards runs each shard's kernels on a share of the threads, from a Python thread
 * of its own (transformer/shards.py). */
static __thread int thread_limit = 0;

#if TF_HAVE_AMX
/* AMX-TILE, AMX-BF16 and AMX-INT8 (CPUID.7.0:EDX bits 24, 22, 25), the tile state enabled by the
 * OS (XCR0 bits 17 and 18) and, on Linux, the process's permission to use it (arch_prctl
 * ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA; without it the first tile instruction is SIGILL). */
static int amx_usable(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (!(d >> 24 & 1) || !(d >> 22 & 1) || !(d >> 25 & 1)) return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1)) return 0;   /* OSXSAVE: xgetbv works */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return 0;
#ifdef __linux__
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
#else
    return 0;
#endif
}
#endif

#if defined(__aarch64__)
static int aarch64_dotprod(void)
{
#if defined(__linux__)
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#elif defined(__APPLE__)
    int has = 0;
    size_t size = sizeof has;
    return sysctlbyname("hw.optional.arm.FEAT_DotProd", &has, &size, NULL, 0) == 0 && has;
#else
    return 0;
#endif
}
#endif

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
        if (!__builtin_cpu_supports("avx512bf16")) return TF_ISA_AVX512_VNNI;
#if TF_HAVE_AMX
        static int amx = -1;   /* asked once: the permission is the process's */
        if (amx < 0) amx = amx_usable();
        if (amx) return TF_ISA_AMX;
#endif
        return TF_ISA_AVX512_BF16;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return TF_ISA_AVX2;
#elif defined(__aarch64__) && TF_HAVE_X86
    /* Advanced SIMD is part of every aarch64 CPU (simd.h: through SIMDe); the dot products are
     * Armv8.2's option, told by the kernel (Linux's auxiliary vector; Apple's M-series all have
     * them, and macOS's sysctl says so) */
    return aarch64_dotprod() ? TF_ISA_NEON_DOTPROD : TF_ISA_NEON;
#endif
    return TF_ISA_GENERIC;
}

int tf_isa_top(void)
{
#if defined(__aarch64__)
    return TF_ISA_NEON_DOTPROD;
#else
    return TF_ISA_AMX;
#endif
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
    if (level > tf_isa_top()) level = tf_isa_top();
    forced_isa = level;
    return tf_isa();
}

const char *tf_isa_name(int level)
{
#if defined(__aarch64__)
    return level >= TF_ISA_NEON_DOTPROD ? "neon_dotprod" : level >= TF_ISA_NEON ? "neon" : "generic";
#else
    switch (level) {
    case TF_ISA_AMX: return "amx";
    case TF_ISA_AVX512_BF16: return "avx512_bf16";
    case TF_ISA_AVX512_VNNI: return "avx512_vnni";
    case TF_ISA_AVX512: return "avx512";
    case TF_ISA_AVX2: return "avx2";
    default: return "generic";
    }
#endif
}

void tf_set_num_threads(int n)
{
    if (n < 1) n = 1;
#ifndef _OPENMP
    n = 1;   /* no team to start: the kernels' splits assume the threads they are told of run */
#endif
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
    return thread_limit > 0 && thread_limit < num_threads ? thread_limit : num_threads;
}

int tf_set_thread_limit(int n)
{
    const int was = thread_limit;
    thread_limit = n > 0 ? n : 0;
    return was;
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

void tf_run_lanes(int lanes, void (*lane)(void *ctx, int l), void *ctx)
{
#ifdef _OPENMP
    const int threads = tf_get_num_threads() < lanes ? tf_get_num_threads() : lanes;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        const int tid = omp_get_thread_num(), team = omp_get_num_threads();
        for (int l = tid; l < lanes; l += team) lane(ctx, l);
    }
#else
    for (int l = 0; l < lanes; l++) lane(ctx, l);
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
