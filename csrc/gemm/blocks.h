/* A block of C as micro-kernel calls: the problem one thread works on, the K blocking, the
 * packing of an A block and the run of micro-kernels over it. Shared by the schedules
 * (schedule.c) and the pre-packed path (packed.c), so both cut a product the same way and give
 * the same bits. */
#ifndef TF_GEMM_BLOCKS_H
#define TF_GEMM_BLOCKS_H

#include "gemm_isa.h"

#include <stddef.h>

/* Internal to the folder: hidden (gemm_isa.h says why). */
#pragma GCC visibility push(hidden)

/* Multiply-adds per thread below which a GEMM does not start another thread (2M: about 20 us
 * of work; waking a sleeping OpenMP team costs tens of us on a virtual machine, and on a busy
 * machine the join can wait a whole scheduler tick). */
#define GEMM_GRAIN (1L << 21)

typedef struct {
    const gemm_isa *isa;
    int trans_a, trans_b;
    long M, N, K;
    float alpha;
    const float *A; long lda;
    const float *B; long ldb;
    int accumulate;
    float *C; long ldc;
    long *packed;          /* this thread's counts: floats packed [0] of op(A), [1] of op(B),
                              [2] shared-schedule work units taken from other threads */
} gemm_problem;

/* The K block: K split into equal blocks of at most isa->kc (depends on K only), rounded up to
 * an even length for the pair layout. */
static inline long k_block(const gemm_isa *s, long K)
{
    const long kcb = ceil_div(K, ceil_div(K, s->kc));
    return s->pairs || s->even_k ? kcb + (kcb & 1) : kcb;   /* pairs: blocks start at even k */
}

/* Element (i, k) of op(A) and (k, j) of op(B). */
static inline const float *a_at(const gemm_problem *g, long i, long k)
{ return g->trans_a ? g->A + k * g->lda + i : g->A + i * g->lda + k; }
static inline const float *b_at(const gemm_problem *g, long k, long j)
{ return g->trans_b ? g->B + j * g->ldb + k : g->B + k * g->ldb + j; }

/* C[rows of the packed A block, panel] for one K block: every MR-row panel of Ap. */
static inline void run_kernels_from(const gemm_problem *g, long mc, long kc, const float *Ap,
                                    const float *Bp, long bs, int nr, float *C, int load_c, int stream)
{
    const gemm_isa *s = g->isa;
    const long panels = ceil_div(mc, s->mr), base = mc / panels, extra = mc % panels;
    const gemm_kernel *kernel = 2 * nr <= s->nr && s->half[1] ? s->half
                              : stream && s->stream[1] ? s->stream : s->kernel;
    for (long p = 0, i = 0; p < panels; p++) {
        int mr = (int)(base + (p < extra));
        kernel[mr](kc, Ap + p * s->mr * kc, Bp, bs, C + i * g->ldc, g->ldc, nr, &g->alpha, load_c);
        i += mr;
    }
}

static inline void run_kernels(const gemm_problem *g, long mc, long kc, const float *Ap, const float *Bp,
                               long bs, int nr, float *C, int load_c)
{ run_kernels_from(g, mc, kc, Ap, Bp, bs, nr, C, load_c, 0); }

/* Ap <- rows [i0, i0 + mc) x K block [pc, pc + kc) of op(A) as ceil(mc / MR) micro-panels of
 * balanced heights (M = 16 is two panels of 8 rows, not 14 + 2: a kernel needs about 4 rows
 * or more to hide the FMA latency), panel p at Ap + p * MR * kc. run_kernels cuts the same way. */
/* Panels [p0, p1) of pack_a_block's (the rows [i0, i0 + mc) balanced into ceil(mc / MR) panels),
 * for a team that packs one block together; no counter is added to. */
static inline void pack_a_panels(const gemm_problem *g, long i0, long mc, long pc, long kc, float *Ap,
                                 long p0, long p1)
{
    const gemm_isa *s = g->isa;
    const long panels = ceil_div(mc, s->mr), base = mc / panels, extra = mc % panels;
    if (g->trans_a && s->pack_at) {
        s->pack_at(a_at(g, i0, pc), g->lda, mc, p0, p1, kc, Ap);
        return;
    }
    for (long p = p0; p < p1; p++) {
        const long i = i0 + p * base + (p < extra ? p : extra), mr = base + (p < extra);
        s->pack_a(g->trans_a, a_at(g, i, pc), g->lda, mr, kc, Ap + p * s->mr * kc);
    }
}

static inline void pack_a_block(const gemm_problem *g, long i0, long mc, long pc, long kc, float *Ap)
{
    pack_a_panels(g, i0, mc, pc, kc, Ap, 0, ceil_div(mc, g->isa->mr));
    g->packed[0] += mc * kc;
}

static inline size_t round16(size_t n) { return (n + 15) / 16 * 16; }

/* A process-wide packing buffer (buffer.c): at least `floats` floats, 64-byte aligned, or NULL;
 * *owned > 0 says the caller must free it (gemm_buffer_release does either). */
float *gemm_buffer_acquire(size_t floats, int *owned);
void gemm_buffer_release(float *buffer, int owned);

/* Testing hook (gemm_test_force, schedule.c): start every thread whatever the size. */
extern int gemm_forced_all_threads;

/* gemm_reference with operands of precision `prec` (reference.c): the slow path when no buffer
 * can be had. */
void gemm_reference_prec(int prec, int trans_a, int trans_b, long batch0, long batch1,
                         long M, long N, long K, float alpha,
                         const float *A, long lda, long a_stride0, long a_stride1,
                         const float *B, long ldb, long b_stride0, long b_stride1,
                         int accumulate, float *C, long ldc, long c_stride0, long c_stride1);

#pragma GCC visibility pop

#endif
