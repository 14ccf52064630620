/* Pre-packed B (gemm.h): panel jp of op(B), columns [jp*NR, jp*NR + NR), is [K][NR] at
 * Bp + jp*K*NR, so a thread streams its panels in one sequential pass; K block pc of a panel
 * is the kc x NR slice at + pc*NR that the micro-kernels read as usual. */
#include "blocks.h"
#include "amx.h"
#include "avx512.h"     /* pack_b_dpbf16 and pack_b_avx512: a pre-packed buffer's second half */

#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* The same for gemm_packed, decoding's x @ W^T: called back to back on an awake team, so a
 * smaller grain pays (GEMM_GRAIN left a base-size step's 8-row products by 512 x 512 weights on
 * one thread: 2 threads decoded fp32 greedy 7% slower than with them split; AMD EPYC Zen 2). */
#define GEMM_PACKED_GRAIN (1L << 20)

long gemm_packed_floats(int isa, long N, long K)
{
    const gemm_isa *s = gemm_isa_of(isa, GEMM_FP32);
    return ceil_div(N, s->nr) * s->nr * K;
}

void gemm_pack_b(int isa, int prec, int trans_b, long N, long K, const float *B, long ldb, float *Bp)
{
    const gemm_isa *s = packed_isa_of(isa, prec);
    const long NR = s->nr, np = ceil_div(N, NR);
#pragma omp parallel for num_threads(tf_team(N * K, GEMM_GRAIN / 4)) schedule(static)
    for (long jp = 0; jp < np; jp++) {
        long j = jp * NR;
        s->pack_b(trans_b, trans_b ? B + j * ldb : B + j, ldb, min_l(NR, N - j), K, Bp + j * K);
#ifdef GEMM_X86
        /* avx512_bf16's packer writes a panel's pairs straight into the first half of its floats'
         * footprint and leaves the rest; a pre-packed buffer keeps op(B)'s rows from ceil(K/2) on
         * there as floats, the bytes it had when the pairs were made in place from a panel of
         * floats, so that a buffer's bytes depend on nothing else (tests/test_gemm_bits.py records
         * them) */
        const long h = (K + 1) / 2;
        if (s->pack_b == pack_b_dpbf16 && K > h)
            pack_b_avx512(trans_b, trans_b ? B + j * ldb + h : B + h * ldb + j, ldb, min_l(NR, N - j), K - h,
                          Bp + j * K + h * NR);
#endif
    }
}

/* Element k of a pre-packed panel's column that starts at b. */
static float packed_b_at(const gemm_isa *s, const float *b, long k)
{
    if (!s->pairs) return b[k * s->nr];
    uint32_t u;
    memcpy(&u, b + k / 2 * s->nr, sizeof u);
    u = k % 2 ? u & 0xffff0000u : u << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* The naive form of gemm_packed (only when no buffer for op(A) can be had). */
static void gemm_packed_slow(const gemm_isa *s, long M, long N, long K, float alpha, const float *A,
                             long lda, const float *Bp, int accumulate, float *C, long ldc)
{
    for (long i = 0; i < M; i++)
        for (long j = 0; j < N; j++) {
            const float *b = Bp + (j / s->nr) * K * s->nr + j % s->nr;
            double sum = 0.0;
            for (long k = 0; k < K; k++)
                sum += (double)(s->bf16 ? round_bf16(A[i * lda + k]) : A[i * lda + k]) * packed_b_at(s, b, k);
            double r = (double)alpha * sum;
            if (accumulate) r += C[i * ldc + j];
            C[i * ldc + j] = (float)r;
        }
}

void gemm_packed(int isa, int prec, long M, long N, long K, float alpha, const float *A, long lda,
                 const float *Bp, int accumulate, float *C, long ldc)
{
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        for (long i = 0; i < M && !accumulate; i++) memset(C + i * ldc, 0, (size_t)N * sizeof(float));
        return;
    }
    const gemm_isa *s = packed_isa_of(isa, prec);
    const long NR = s->nr, np = ceil_div(N, NR), kcb = k_block(s, K);
    const long rows = min_l(M, s->mc), rpad = ceil_div(rows, s->mr) * s->mr;
    int owned = 1;
    float *Ap = gemm_buffer_acquire(round16((size_t)(rpad * K)), &owned);
    if (!Ap) {
        gemm_packed_slow(s, M, N, K, alpha, A, lda, Bp, accumulate, C, ldc);
        return;
    }
    for (long ic = 0; ic < M; ic += rows) {   /* one block of rows (decoding: always one) */
        const long mc = min_l(rows, M - ic), mpad = ceil_div(mc, s->mr) * s->mr;
        long packed[3] = {0, 0, 0};
        gemm_problem g = {s, 0, 0, mc, N, K, alpha, A + ic * lda, lda, NULL, 0, accumulate,
                          C + ic * ldc, ldc, packed};
        const int nt = gemm_forced_all_threads ? tf_get_num_threads() : tf_team(mc * N * K, GEMM_PACKED_GRAIN);
        long next = 0;   /* the next group of panels nobody has taken */
#pragma omp parallel num_threads(nt) if (nt > 1)
        {
            int team = 1, t = 0;
#ifdef _OPENMP
            team = omp_get_num_threads();
            t = omp_get_thread_num();
#endif
            /* op(A) as the narrow schedule packs it, its row panels split over the team (a
             * training block's 256 x 4,000 logits' gradient took one thread ~0.4 ms a block) */
            const long apanels = ceil_div(mc, s->mr);
            for (long pc = 0; pc < K; pc += kcb)
                pack_a_panels(&g, 0, mc, pc, min_l(kcb, K - pc), Ap + pc * mpad, apanels * t / team,
                              apanels * (t + 1) / team);
#pragma omp barrier
            const long per = team == 1 ? np : ceil_div(np, 8L * team);
            long u;
#if TF_HAVE_AMX
            if (s->amx) tf_amx_begin();
#endif
            while ((u = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED)) * per < np)
                for (long jp = u * per; jp < min_l(np, (u + 1) * per); jp++) {
                    const long j = jp * NR;
                    for (long pc = 0; pc < K; pc += kcb)
                        run_kernels_from(&g, mc, min_l(kcb, K - pc), Ap + pc * mpad,
                                         Bp + j * K + (s->pairs ? pc / 2 : pc) * NR,
                                         NR, (int)min_l(NR, N - j), C + ic * ldc + j, accumulate || pc > 0, 1);
                }
#if TF_HAVE_AMX
            if (s->amx) tf_amx_end();
#endif
        }
    }
    gemm_buffer_release(Ap, owned);
}
