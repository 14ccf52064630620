/* int8 GEMM for inference (see qgemm.h for the contract and the packed layout).
 *
 *   quantize every row of X once (int16, k padded to an even count), before the parallel loop
 *   for each block of up to QGEMM_MB rows:            (decoding: always one block)
 *     threads take groups of NR-column panels from a shared counter:
 *       for each tile of up to MR rows:
 *         int32 tile of acc[MR x NR] over all of K, then dequantize and store
 *
 * Each panel is read in one sequential pass per block of rows, and stays in L1/L2 for the
 * other row tiles of that block. The integer sum is exact, so its order is free; the
 * dequantization is one fixed sequence of float32 operations per element, so the bits depend
 * on neither the instruction set nor the thread count.
 *
 * The micro-kernels, one file per instruction set, and the quantization: qgemm_isa.h lists them.
 */
#include "qgemm_isa.h"

#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Rows per block: the activations of a block (QGEMM_MB x K int16) stay in L2 while the
 * panels stream past them; decoding (batch x beams) fits in one block. */
#define QGEMM_MB 64

static int forced_all_threads = 0, forced_slow = 0;

void qgemm_test_force(int all_threads, int slow)
{
    forced_all_threads = all_threads != 0;
    forced_slow = slow != 0;
}

/* The naive form (no buffer needed): each row quantized on the fly, one element at a time,
 * read straight from the packed panels. The same bits as the kernels. */
static void qgemm_slow(int isa, long M, long N, long K, const float *X, long ldx, const void *packed,
                       const float *bias, float *C, long ldc)
{
    const qgemm_layout L = qgemm_layout_of(isa);
    long scale_at, comp_at, panels_at;
    qgemm_sections(isa, N, K, &scale_at, &comp_at, &panels_at);
    const float *ws = (const float *)((const char *)packed + scale_at);
    const int8_t *panels = (const int8_t *)packed + panels_at;
    const long groups = ceil_div(K, L.kg);
    for (long i = 0; i < M; i++) {
        const float *x = X + i * ldx;
        float inv, xs = qgemm_row_scale_c(K, x, &inv);
        for (long n = 0; n < N; n++) {
            const int8_t *panel = panels + (n / L.nr) * groups * L.nr * L.kg;
            const long j = n % L.nr;
            int32_t acc = 0;
            for (long k = 0; k < K && inv != 0.0f; k++)
                acc += quantize_one(x[k], inv) * panel[((k / L.kg) * L.nr + j) * L.kg + k % L.kg];
            C[i * ldc + n] = dequantize(acc, xs, ws[n], bias ? bias + n : NULL);
        }
    }
}

void qgemm_packed(int isa, long M, long N, long K, const float *X, long ldx, const void *packed,
                  const float *bias, float *C, long ldc)
{
    if (M <= 0 || N <= 0) return;
    const qgemm_layout L = qgemm_layout_of(isa);
    const long ldq = ceil_div(K, 32) * 32;   /* int16 per row: 64-byte rows, zeros past K */
    const int amx = isa >= TF_ISA_AMX;
    /* amx's A tiles read 16 rows at a time: zero rows up to a multiple of 16 */
    const long rows = amx ? ceil_div(M, 16) * 16 : M;
    int16_t *Xq = forced_slow ? NULL
                : aligned_alloc(64, (size_t)round64(rows * ldq * (long)sizeof(int16_t) + M * (long)sizeof(float)));
    if (!Xq) {   /* out of memory: the slow path still gives the same answer */
        qgemm_slow(isa, M, N, K, X, ldx, packed, bias, C, ldc);
        return;
    }
    float *xs = (float *)(Xq + rows * ldq);
    if (rows > M) memset(Xq + M * ldq, 0, (size_t)((rows - M) * ldq) * sizeof(int16_t));
#ifdef QGEMM_X86
    const int avx2 = isa >= TF_ISA_AVX2, vnni = isa >= TF_ISA_AVX512_VNNI;
#endif
#ifdef QGEMM_NEON_DOTPROD
    const int sdot = isa == TF_ISA_NEON_DOTPROD;
#endif
#pragma omp parallel for num_threads(tf_team(M * K, QGEMM_GRAIN / 4)) schedule(static)
    for (long i = 0; i < M; i++) {
        int16_t *q = Xq + i * ldq;
        memset(q + K, 0, (size_t)(ldq - K) * sizeof(int16_t));
#ifdef QGEMM_X86
        if (avx2) {
            xs[i] = qgemm_quantize_row_avx2(K, X + i * ldx, q);
            if (vnni) qgemm_to_unsigned(q, K);
#ifdef QGEMM_NEON_DOTPROD
            if (sdot) qgemm_to_signed(q, K);
#endif
            continue;
        }
#endif
        xs[i] = qgemm_quantize_row_c(K, X + i * ldx, NULL, q);
    }

    long scale_at, comp_at, panels_at;
    qgemm_sections(isa, N, K, &scale_at, &comp_at, &panels_at);
    const float *ws = (const float *)((const char *)packed + scale_at);
    const int32_t *comp = (const int32_t *)((const char *)packed + comp_at);
    const int8_t *panels = (const int8_t *)packed + panels_at;
    const long np = ceil_div(N, L.nr), panel_bytes = ceil_div(K, L.kg) * L.kg * L.nr;
    const long blocks = ceil_div(M, QGEMM_MB);
    const qgemm_kernel kernel = qgemm_kernel_of(isa);
    const int nt = forced_all_threads ? tf_get_num_threads() : tf_team(M * N * K, QGEMM_GRAIN);
    long next = 0;   /* the next unit (block of rows, group of panels) nobody has taken */
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int team = 1;
#ifdef _OPENMP
        team = omp_get_num_threads();
#endif
        const long per = team == 1 ? np : ceil_div(np, 8L * team), groups = ceil_div(np, per);
        long u;
#if TF_HAVE_AMX
        if (amx) tf_amx_begin();
#endif
        while ((u = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED)) < blocks * groups) {
            const long i0 = u / groups * QGEMM_MB, m = min_l(QGEMM_MB, M - i0), g = u % groups;
            for (long p = g * per; p < min_l(np, (g + 1) * per); p++) {
                const long j = p * L.nr;
                kernel(m, K, Xq + i0 * ldq, ldq, xs + i0, panels + p * panel_bytes, ws + j, comp + j,
                       bias ? bias + j : NULL, C + i0 * ldc + j, ldc, (int)min_l(L.nr, N - j));
            }
        }
#if TF_HAVE_AMX
        if (amx) tf_amx_end();
#endif
    }
    free(Xq);
}
