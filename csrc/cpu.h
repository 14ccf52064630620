/* CPU features, SIMD dispatch level and the one thread count of the process.
 *
 * Every kernel asks tf_isa() which instruction set to use and tf_team(work, grain)
 * how many OpenMP threads to start: below `grain` units of work per thread a
 * kernel runs on fewer threads (waking a sleeping team costs more than small
 * ops save), and nothing ever uses more than tf_get_num_threads().
 */
#ifndef TF_CPU_H
#define TF_CPU_H

#include <stddef.h>
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Levels, each including the ones below it:
 *   avx2:        AVX2 + FMA
 *   avx512:      AVX-512 F, VL, DQ, BW
 *   avx512_vnni: + AVX512_VNNI (vpdpbusd: the int8 GEMM's u8 x s8 kernel)
 *   avx512_bf16: + AVX512_BF16 (vdpbf16ps: the bf16 GEMM's kernel); every CPU that has it has VNNI
 *   amx:         + AMX-TILE, AMX-BF16, AMX-INT8 with the OS's permission to use the tiles
 *                (Sapphire Rapids and later Xeons: tdpbf16ps and tdpbusd, the bf16 and int8
 *                GEMMs' tile kernels; csrc/amx.h)
 * Kernels with nothing specific to a level run the code of the level below it.
 *
 * On aarch64 the levels are
 *   neon:         Advanced SIMD, every aarch64 CPU; it takes the avx2 level's slot: its kernels
 *                 are the AVX2 ones compiled through SIMDe into NEON (simd.h), so every
 *                 `isa >= TF_ISA_AVX2` in the kernels means "neon" there
 *   neon_dotprod: + the dot product instructions (SDOT, Armv8.2's FEAT_DotProd, HWCAP_ASIMDDP):
 *                 the int8 GEMM's kernel (qgemm/neon_dotprod.c); every other kernel runs neon's
 * and the x86 levels above them are never reported or forced: they are numbered past
 * neon_dotprod there, so `isa >= TF_ISA_AVX512` never holds. A kernel dispatches on
 * `isa >= TF_ISA_AVX2`, never `isa == TF_ISA_AVX2`, so that neon_dotprod runs neon's code. */
#if defined(__aarch64__)
enum { TF_ISA_GENERIC = 0, TF_ISA_AVX2 = 1, TF_ISA_NEON_DOTPROD = 2, TF_ISA_AVX512 = 3,
       TF_ISA_AVX512_VNNI = 4, TF_ISA_AVX512_BF16 = 5, TF_ISA_AMX = 6, TF_ISA_LEVELS = 7,
       TF_ISA_NEON = TF_ISA_AVX2 };
#else
enum { TF_ISA_GENERIC = 0, TF_ISA_AVX2 = 1, TF_ISA_AVX512 = 2, TF_ISA_AVX512_VNNI = 3,
       TF_ISA_AVX512_BF16 = 4, TF_ISA_AMX = 5, TF_ISA_LEVELS = 6, TF_ISA_NEON = TF_ISA_AVX2 };
#endif

int tf_cpu_best_isa(void);          /* best level this CPU (and OS) supports */
int tf_isa(void);                   /* level in use: min(best, forced) */
int tf_set_isa(int level);          /* force a level (clamped to best); returns the level in use */
const char *tf_isa_name(int level); /* "generic" | "avx2" | "avx512" | "avx512_vnni" | "avx512_bf16" | "amx";
                                       on aarch64 "generic" | "neon" | "neon_dotprod" */
int tf_isa_top(void);               /* the highest level this architecture names (amx; neon_dotprod on aarch64) */

void tf_set_num_threads(int n);     /* n >= 1 */
int tf_get_num_threads(void);       /* the process's count, or the calling thread's limit if lower */
int tf_set_thread_limit(int n);     /* the calling thread's kernels use at most n threads (0: no
                                       limit); returns the previous limit */
int tf_openmp_version(void);        /* _OPENMP (yyyymm), 0 without OpenMP */
const char *tf_compiler(void);
int tf_probe_team(void);         /* threads a full-size parallel region really starts */
/* lane(ctx, l) for every l in [0, lanes), each on a thread of ONE OpenMP team of min(lanes,
 * tf_get_num_threads()) threads (the caller's runs lane 0; a smaller team runs the rest in turn).
 * The team's workers are the ones every kernel's region uses, so a lane starts at once, not after
 * a worker of the caller's last region has spun down. A lane's own kernels run one thread each
 * (no nested regions, tf_set_num_threads): for lanes of one thread, as sentence shards on 2 cores
 * run. */
void tf_run_lanes(int lanes, void (*lane)(void *ctx, int l), void *ctx);

/* Threads to use for `work` units when each thread should get at least `grain`. */
static inline int tf_team(long work, long grain)
{
#ifdef _OPENMP
    if (omp_in_parallel()) return 1;   /* a kernel called by one thread of a team: runs on it alone */
#endif
    int threads = tf_get_num_threads();
    long useful = grain > 0 ? work / grain : work;
    if (useful < 1) useful = 1;
    return useful < threads ? (int)useful : threads;
}

#endif
