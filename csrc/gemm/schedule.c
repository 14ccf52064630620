/* GEMM: packed, cache-blocked, register-blocked (see gemm.h for the contract).
 *
 * The structure is the classic BLIS/GotoBLAS one:
 *
 *   for jc in N by NC:                        B block  [K x NC]  packed (L3)
 *     for ic in M by MC:
 *       for pc in K by KC:                    (fixed K blocking: result bits never depend on threads)
 *         pack A[ic:ic+mc, pc:pc+kc] -> Ap    A block [MC x KC] (L2), micro-panels [kc][MR]
 *         for jr in nc by NR:                 B micro-panel [kc x NR] stays in L1
 *           for ir in mc by MR:
 *             micro-kernel: C[MR x NR] (+)= alpha * Ap[MR x kc] @ Bp[kc x NR]
 *
 * The micro-kernel keeps the MR x NR tile of C in registers (AVX-512: 14 x 32 =
 * 28 zmm accumulators, one broadcast per row and two FMAs; AVX2 + FMA: 6 x 16 in
 * 12 ymm; plain C: 4 x 8) and runs one FMA chain per element of C over the kc
 * values of a K block (bf16 at the avx512_bf16 level: one vdpbf16ps chain over the kc / 2
 * pairs, the AVX-512 tile; at the amx level a 32 x 32 tile of C in four AMX tile registers,
 * tdpbf16ps over steps of 32 k, see isa_amx_bf16). Packing reads every transposition variant
 * and leading dimension (AVX-512: 16 x 16 register transposes), so no copy of the caller's
 * data exists outside the packing buffers. Edge tiles: rows via kernels
 * specialised for 1..MR rows (no wasted FMAs on short panels), columns via
 * zero-padded B panels and masked stores (AVX-512) or a small spill tile.
 *
 * Schedules (which one depends on the shape and ISA only, so the bits of C never
 * depend on the thread count: every element is computed by the same instructions
 * whichever thread computes it):
 *  - private: one thread, the loops above;
 *  - narrow:  few rows (attention heads, decoding): all of op(A) is packed once,
 *             then each B micro-panel is packed (or, for a row-major B and at
 *             most two row panels, read in place) and consumed at once from L1;
 *             threads take groups of panels from a shared counter;
 *  - tiles:   a few threads on a large product: C is cut into tiles that
 *             threads take from a shared counter, each packing its own A and B
 *             blocks (no barriers: a thread the OS stalls holds nobody up);
 *  - shared:  many threads on a large product (BLIS): per N block and K block the
 *             team packs the B block once into a shared buffer, then each thread
 *             multiplies its own rows (and, for few rows, columns) against it;
 *  - dot:     (AVX-512) few rows of A @ B^T (decoding x @ W^T): dot products of
 *             contiguous rows, 4 x 4 tiles of C, no packing at all;
 *  - batches of small products: threads take groups of batch entries.
 *
 * gemm_packed (gemm.h) multiplies by an op(B) packed once ahead (decoding: the same weights
 * every step), panel by panel in one sequential pass with a prefetching copy of the kernels:
 * the weights stream at ~36 GB/s on one core, where the dot schedule reaches ~20.
 *
 * This file: the schedules (gemm, gemm_batched, gemm_batched_prec); the micro-kernels and
 * packing of each instruction set are in its own file (gemm_isa.h lists them).
 */
#include "blocks.h"
#include "amx.h"

#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* A thread's B block in the tiles schedule holds at most this many floats (4 MiB of L3). */
#define GEMM_TILE_B (1L << 20)
/* A @ B^T uses the dot kernel for K >= GEMM_DOT_MIN_K and at most GEMM_DOT_ROWS / 2 rows, or
 * GEMM_DOT_ROWS rows when K >= 4 * GEMM_DOT_MIN_K (measured: its fixed cost per 4 x 4 tile
 * needs a long K; packing needs many rows). */
#define GEMM_DOT_ROWS 24
#define GEMM_DOT_MIN_K 64
/* The narrow schedule packs all of op(A) when it has at most this many floats (1 MiB). */
#define GEMM_NARROW_A (1L << 18)

/* gemm_rows_apart's setting, per calling thread (the schedule is chosen before any team starts). */
static __thread int rows_apart;

int gemm_rows_apart(int on)
{
    const int was = rows_apart;
    rows_apart = on != 0;
    return was;
}

/* Narrow: NR panels [jp0, jp1) of C, all M rows; Ap holds all of op(A) packed, K block by
 * K block (block q at Ap + q * kcb * Mpad); Bp has room for one panel [kcb][NR]. */
static int narrow_fits(const gemm_isa *s, long M, long K)
{
    return M <= s->mc && ceil_div(M, s->mr) * s->mr * K <= GEMM_NARROW_A;
}

static void narrow_pack_a(const gemm_problem *g, float *Ap)
{
    const gemm_isa *s = g->isa;
    const long kcb = k_block(s, g->K), mpad = ceil_div(g->M, s->mr) * s->mr;
    for (long pc = 0; pc < g->K; pc += kcb)
        pack_a_block(g, 0, g->M, pc, min_l(kcb, g->K - pc), Ap + pc * mpad);
}

static void narrow_panels(const gemm_problem *g, float *Bp, const float *Ap, long jp0, long jp1)
{
    const gemm_isa *s = g->isa;
    const int NR = s->nr;
    const long kcb = k_block(s, g->K), mpad = ceil_div(g->M, s->mr) * s->mr;
    /* a row-major B is read in place when each panel serves at most two row panels */
    const int in_place = !g->trans_b && mpad <= 2 * s->mr && !s->bf16;
    for (long jp = jp0; jp < jp1; jp++) {
        long j = jp * NR;
        int nr = (int)min_l(NR, g->N - j);
        for (long pc = 0; pc < g->K; pc += kcb) {
            long kc = min_l(kcb, g->K - pc);
            const float *b = Bp;
            long bs = NR;
            if (in_place && nr == NR) {
                b = b_at(g, pc, j);
                bs = g->ldb;
            } else {
                s->pack_b(g->trans_b, b_at(g, pc, j), g->ldb, nr, kc, Bp);
                g->packed[1] += nr * kc;
            }
            run_kernels(g, g->M, kc, Ap + pc * mpad, b, bs, nr, g->C + j, g->accumulate || pc > 0);
        }
    }
}

/* Private: NR panels [jp0, jp1) of C, all M rows, with this thread's own Bp [kcb][NC]. */
static void gemm_private(const gemm_problem *g, float *Bp, float *Ap, long jp0, long jp1)
{
    const gemm_isa *s = g->isa;
    const int NR = s->nr;
    const long kcb = k_block(s, g->K), ncp = s->nc / NR;
    for (long jc = jp0; jc < jp1; jc += ncp) {
        long j0 = jc * NR, nc = min_l((jc + ncp < jp1 ? jc + ncp : jp1) * NR, g->N) - j0;
        for (long pc = 0; pc < g->K; pc += kcb) {
            long kc = min_l(kcb, g->K - pc);
            int load_c = g->accumulate || pc > 0;
            s->pack_b(g->trans_b, b_at(g, pc, j0), g->ldb, nc, kc, Bp);
            g->packed[1] += nc * kc;
            for (long ic = 0; ic < g->M; ic += s->mc) {
                long mc = min_l(s->mc, g->M - ic);
                pack_a_block(g, ic, mc, pc, kc, Ap);
                for (long jp = 0; jp * NR < nc; jp++)
                    run_kernels(g, mc, kc, Ap, Bp + jp * NR * kc, NR, (int)min_l(NR, nc - jp * NR),
                                g->C + ic * g->ldc + j0 + jp * NR, load_c);
            }
        }
    }
}

/* Tiles: several threads on one large product. C is cut into units of tile_rows x tile_cols,
 * numbered column block by column block, and threads take units from a shared counter: no
 * barriers, so a thread the OS stalls holds nobody up and the others take its share. A thread
 * packs the B block [K][tile_cols] of its unit unless it holds it from its previous unit (the usual
 * case: consecutive units share a column block), and the A block of the unit per K block. */
static long tile_rows(const gemm_isa *s, long M, int nt)
{
    return min_l(s->mc, ceil_div(ceil_div(M, s->mr), 4L * nt) * s->mr);   /* ~4 units per thread */
}

static long tile_cols(const gemm_isa *s, long N, long K)
{
    long nc = max_l(s->nr, GEMM_TILE_B / max_l(K, 1) / s->nr * s->nr);
    return min_l(min_l(nc, s->nc), N);
}

/* C[ic:ic+mc, jc:jc+nc]; Bp holds (or, when pack_b, receives) op(B)[:, jc:jc+nc] packed, K block
 * q at Bp + q * kcb * np * NR. */
static void gemm_tile(const gemm_problem *g, float *Bp, float *Ap, long ic, long mc, long jc, long nc,
                      int pack_b)
{
    const gemm_isa *s = g->isa;
    const int NR = s->nr;
    const long kcb = k_block(s, g->K), np = ceil_div(nc, NR);
    for (long pc = 0; pc < g->K && pack_b; pc += kcb) {
        s->pack_b(g->trans_b, b_at(g, pc, jc), g->ldb, nc, min_l(kcb, g->K - pc), Bp + pc * np * NR);
        g->packed[1] += nc * min_l(kcb, g->K - pc);
    }
    for (long pc = 0; pc < g->K; pc += kcb) {
        long kc = min_l(kcb, g->K - pc);
        const float *b = Bp + pc * np * NR;
        pack_a_block(g, ic, mc, pc, kc, Ap);
        for (long jp = 0; jp < np; jp++)
            run_kernels(g, mc, kc, Ap, b + jp * NR * kc, NR, (int)min_l(NR, nc - jp * NR),
                        g->C + ic * g->ldc + jc + jp * NR, g->accumulate || pc > 0);
    }
}

/* One thread's part of C when it works alone on NR panels [jp0, jp1). */
static void gemm_alone(const gemm_problem *g, float *Bp, float *Ap, long jp0, long jp1)
{
    if (jp1 <= jp0) return;
    if (narrow_fits(g->isa, g->M, g->K)) {
        narrow_pack_a(g, Ap);
        narrow_panels(g, Bp, Ap, jp0, jp1);
    } else {
        gemm_private(g, Bp, Ap, jp0, jp1);
    }
}

/* Batch entry t of a batched product: where its A, B and C start. */
typedef struct {
    long batch1;
    const float *A; long a_stride0, a_stride1;
    const float *B; long b_stride0, b_stride1;
    float *C; long c_stride0, c_stride1;
} gemm_batch;

static void gemm_entry(gemm_problem *g, const gemm_batch *bt, long t)
{
    long i = t / bt->batch1, j = t % bt->batch1;
    g->A = bt->A + i * bt->a_stride0 + j * bt->a_stride1;
    g->B = bt->B + i * bt->b_stride0 + j * bt->b_stride1;
    g->C = bt->C + i * bt->c_stride0 + j * bt->c_stride1;
}

/* Shared: many threads on large products (BLIS's parallel loops, one parallel region).
 *
 *   for each batch entry, N block jc (NC columns), K block pc (KC), in this order:
 *     the team packs op(B)[pc, jc] ONCE into a shared buffer, each thread a contiguous
 *     share of its NR panels;                                       barrier
 *     each thread packs its own rows of op(A)[:, pc] (chunks of at most MC rows, private,
 *     L2) and runs the micro-kernels on its rectangle of C[:, jc] against the shared panels.
 *
 * Why: in the tiles schedule every thread packs (and keeps in L3) its own copy of each B
 * block it touches, so packing work and L3 footprint grow with the team; here both are
 * those of one thread, whatever the team (a 16-core Xeon fell from 763 GF/s at 8 threads
 * to 341 at 16 with tiles on 2048 x 2048 x 512).
 *
 * The team is split tr x tc (tr * tc = team): rows of C into tr balanced ranges (any
 * height: pack_a_block balances the panels, so 128 rows run as 10 panels of 12.8 rows and
 * no thread gets a spare panel), each block's NR panels into tc balanced groups. tr is the
 * largest divisor of the team that leaves every thread GEMM_SHARED_PANELS row panels or
 * more (a B micro-panel loaded into L1 serves that many kernel calls); the columns take
 * the rest of the team only when rows run short (their A rows are then packed tc times,
 * small next to B). Each thread owns the same rectangle in every block.
 *
 * A thread the OS stalls must not hold the team up for long at the barriers: a thread's
 * rectangle is cut into its row chunks x GEMM_SHARED_SLICES column slices, which it takes
 * in order from its own counter; a thread done with its own takes what is left of the
 * others' (packing the owner's rows of A for itself: 1/tc of the owner's share of A, for
 * 1/SLICES of its work). Without stalls every thread does exactly its own rectangle.
 *
 * Two B buffers: after computing block b a thread packs its share of block b + 1 into the
 * other buffer, then waits at the one barrier per block, which both publishes block b + 1
 * and guarantees that nobody still reads the buffer that block b + 2 will overwrite. The
 * counters alternate the same way: a thread resets its counter for block b + 1 during block b.
 * Bits: every element of C sums the same K blocks in the same order with the same kernel
 * as in the other schedules, so the result depends neither on the team nor on who computes it. */
#define GEMM_SHARED_PANELS 3
#define GEMM_SHARED_SLICES 4
#define GEMM_COUNTER_STRIDE 8   /* longs: one counter per 64-byte line */

static int shared_row_ways(const gemm_isa *s, long M, int team)
{
    for (int tr = team; tr > 1; tr--)
        if (team % tr == 0 && M >= (long)tr * GEMM_SHARED_PANELS * s->mr) return tr;
    return 1;
}

/* Floats of one shared B block: [kcb][NR panels of at most NC columns]. */
static long shared_b_floats(const gemm_isa *s, long N, long K)
{
    return (k_block(s, K) * min_l(s->nc, ceil_div(N, s->nr) * s->nr) + 15) / 16 * 16;
}

/* counters: 2 x team counters, GEMM_COUNTER_STRIDE apart, zero on entry. lazy (tests only):
 * odd threads leave their own work to the others. */
static void gemm_shared(gemm_problem *g, const gemm_batch *bt, long nb, float *Bbuf, float *Ap,
                        long *counters, int lazy, int tid, int team)
{
    const gemm_isa *s = g->isa;
    const int NR = s->nr;
    const long M = g->M, kcb = k_block(s, g->K), b_size = shared_b_floats(s, g->N, g->K);
    const long jn = ceil_div(g->N, s->nc), kn = ceil_div(g->K, kcb), blocks = nb * jn * kn;
    const int tr = shared_row_ways(s, M, team), tc = team / tr;
    for (long b = -1; b < blocks; b++) {
        if (b >= 0) {   /* block b: my rectangle, then what others left */
            long t = b / (jn * kn), j0 = (b / kn) % jn * s->nc, pc = b % kn * kcb;
            long nc = min_l(s->nc, g->N - j0), kc = min_l(kcb, g->K - pc), q = ceil_div(nc, NR);
            const float *Bp = Bbuf + (b & 1) * b_size;
            long *counter = counters + (b & 1) * team * GEMM_COUNTER_STRIDE;
            gemm_entry(g, bt, t);
            for (int v = 0; v < team; v++) {
                int owner = (tid + v) % team, oi = owner / tc, oj = owner % tc;
                if (v == 0 && lazy && tid % 2) continue;
                long r0 = M * oi / tr, rows = M * (oi + 1) / tr - r0, chunks = ceil_div(rows, s->mc);
                long c0 = q * oj / tc, cn = q * (oj + 1) / tc - c0, slices = min_l(GEMM_SHARED_SLICES, cn);
                long u, held = -1;
                while ((u = __atomic_fetch_add(counter + owner * GEMM_COUNTER_STRIDE, 1, __ATOMIC_RELAXED))
                       < chunks * slices) {
                    long ch = u / slices, sl = u % slices;
                    long i0 = r0 + rows * ch / chunks, mc = r0 + rows * (ch + 1) / chunks - i0;
                    if (ch != held) { pack_a_block(g, i0, mc, pc, kc, Ap); held = ch; }
                    g->packed[2] += v > 0;
                    for (long jp = c0 + cn * sl / slices; jp < c0 + cn * (sl + 1) / slices; jp++)
                        run_kernels(g, mc, kc, Ap, Bp + jp * NR * kc, NR, (int)min_l(NR, nc - jp * NR),
                                    g->C + i0 * g->ldc + j0 + jp * NR, g->accumulate || pc > 0);
                }
            }
            __atomic_store_n(counters + ((b + 1) & 1) * team * GEMM_COUNTER_STRIDE + tid * GEMM_COUNTER_STRIDE,
                             0, __ATOMIC_RELAXED);
        }
        if (b + 1 < blocks) {   /* my share of block b + 1's panels */
            long t = (b + 1) / (jn * kn), j0 = (b + 1) / kn % jn * s->nc, pc = (b + 1) % kn * kcb;
            long nc = min_l(s->nc, g->N - j0), kc = min_l(kcb, g->K - pc), q = ceil_div(nc, NR);
            long p0 = q * tid / team, p1 = q * (tid + 1) / team;
            if (p1 > p0) {
                long cols = min_l(p1 * NR, nc) - p0 * NR;
                gemm_entry(g, bt, t);
                s->pack_b(g->trans_b, b_at(g, pc, j0 + p0 * NR), g->ldb, cols, kc,
                          Bbuf + ((b + 1) & 1) * b_size + p0 * NR * kc);
                g->packed[1] += cols * kc;
            }
        }
#pragma omp barrier
    }
}

/* Testing hooks (gemm.h). */
static int forced_schedule = GEMM_AUTO, forced_lazy = 0, last_schedule = GEMM_AUTO;
int gemm_forced_all_threads = 0;
static long packed_total[3];

void gemm_test_force(int schedule, int all_threads, int lazy)
{
    forced_schedule = schedule == GEMM_TILES || schedule == GEMM_SHARED ? schedule : GEMM_AUTO;
    gemm_forced_all_threads = all_threads != 0;
    forced_lazy = lazy != 0;
}

int gemm_test_last_schedule(void) { return __atomic_load_n(&last_schedule, __ATOMIC_RELAXED); }

void gemm_test_counters(long counts[3], int reset)
{
    for (int i = 0; i < 3; i++)
        counts[i] = reset ? __atomic_exchange_n(&packed_total[i], 0, __ATOMIC_RELAXED)
                          : __atomic_load_n(&packed_total[i], __ATOMIC_RELAXED);
}

/* The rule: a large product (not few rows, not A @ B^T with few rows, not many batch
 * entries: those keep narrow, dot and by_batch, which never pack B twice) runs on the
 * shared schedule from GEMM_SHARED_THREADS threads on, on tiles below. In tiles every
 * thread packs all of B that its tiles touch (about K x N) while its share of the product
 * shrinks as 1 / team, so the packing fraction grows linearly with the team, and the L3
 * holds team copies of B (2048 x 2048 x 512 on a 16-core Xeon: 430 GF/s at 4 threads, 763
 * at 8, 341 at 16). Even at 2 threads shared wins on a quiet machine (the 2-core EPYC,
 * 1024 x 2048 x 512 and the other products of a base training step: 99-107 % parallel
 * efficiency against tiles' 88-98 %); tiles, which need no barrier, remain for a single
 * thread's fallbacks and for forcing in tests. */
#define GEMM_SHARED_THREADS 2

void gemm_batched_prec(int prec, int trans_a, int trans_b, long batch0, long batch1,
                       long M, long N, long K, float alpha,
                       const float *A, long lda, long a_stride0, long a_stride1,
                       const float *B, long ldb, long b_stride0, long b_stride1,
                       int accumulate,
                       float *C, long ldc, long c_stride0, long c_stride1)
{
    if (batch0 <= 0 || batch1 <= 0 || M <= 0 || N <= 0) return;
    const long nb = batch0 * batch1;
    if (K <= 0) {   /* empty sum: zeros, or C unchanged */
        if (!accumulate)
            for (long t = 0; t < nb; t++)
                for (long i = 0; i < M; i++)
                    memset(C + (t / batch1) * c_stride0 + (t % batch1) * c_stride1 + i * ldc, 0,
                           (size_t)N * sizeof(float));
        return;
    }
    const gemm_isa *s = gemm_isa_of(tf_isa(), prec);
    const long item = M * N * K, np = ceil_div(N, s->nr);
    const int forced = forced_schedule;
    int nt = gemm_forced_all_threads ? tf_get_num_threads() : tf_team(nb * item, GEMM_GRAIN);
    /* Many small GEMMs: each thread a range of batch entries. Few large ones: all threads on each. */
    const int by_batch = nt > 1 && nb >= nt && (nb % nt == 0 || nb >= 4 * nt || item < 4 * GEMM_GRAIN);
    /* few rows of A @ B^T: dot products straight from the caller's rows, nothing packed */
    const int dot = s->dot && !rows_apart && !trans_a && trans_b && K >= GEMM_DOT_MIN_K &&
                    (M <= GEMM_DOT_ROWS / 2 || (M <= GEMM_DOT_ROWS && K >= 4 * GEMM_DOT_MIN_K));
    const int narrow = narrow_fits(s, M, K);
    int schedule = dot ? GEMM_DOT : forced ? forced : nt == 1 ? (narrow ? GEMM_NARROW : GEMM_PRIVATE)
                 : by_batch ? GEMM_BY_BATCH : narrow ? GEMM_NARROW
                 : nt >= GEMM_SHARED_THREADS ? GEMM_SHARED : GEMM_TILES;

    /* Buffers: the shared B blocks (shared schedule), then per thread Bp and Ap. */
    const long kcb = k_block(s, K), mpad = ceil_div(M, s->mr) * s->mr;
    size_t a_floats = 0, b_floats = 0, shared_floats = 0;
    if (schedule == GEMM_SHARED) {
        shared_floats = 2 * (size_t)shared_b_floats(s, N, K);
        a_floats = round16((size_t)(min_l(mpad, s->mc) * kcb));
    } else if (narrow && schedule != GEMM_TILES) {
        a_floats = round16((size_t)(mpad * K));
        b_floats = round16((size_t)(kcb * s->nr));
    } else if (!dot) {
        long tile_b = ceil_div(K, kcb) * kcb * ceil_div(tile_cols(s, N, K), s->nr) * s->nr;
        a_floats = round16((size_t)(min_l(mpad, s->mc) * kcb));
        b_floats = round16((size_t)max_l(kcb * min_l(np * s->nr, s->nc), tile_b));
    }
    const size_t total = shared_floats + (size_t)nt * (a_floats + b_floats);
    int owned = 1;
    float *buffer = dot ? NULL : gemm_buffer_acquire(total, &owned);
    if (!buffer && !dot) {   /* out of memory: the slow path still gives the right answer */
        gemm_reference_prec(prec, trans_a, trans_b, batch0, batch1, M, N, K, alpha, A, lda, a_stride0,
                            a_stride1, B, ldb, b_stride0, b_stride1, accumulate, C, ldc, c_stride0, c_stride1);
        return;
    }

    long counters[2 * GEMM_COUNTER_STRIDE * (schedule == GEMM_SHARED ? nt : 1)];   /* shared schedule */
    memset(counters, 0, sizeof counters);
    const int lazy = forced_lazy;
    const gemm_batch bt = {batch1, A, a_stride0, a_stride1, B, b_stride0, b_stride1, C, c_stride0, c_stride1};
    long next = 0;   /* the next unit of work nobody has taken yet (dynamic schedules) */
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int tid = 0, team = 1;
#ifdef _OPENMP
        tid = omp_get_thread_num();
        team = omp_get_num_threads();
#endif
        long packed[3] = {0, 0, 0};
        gemm_problem g = {s, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, accumulate, C, ldc, packed};
        /* a team of one (OpenMP gave no more) runs alone, except in the shared schedule, whose
         * buffers are laid out for it (its barriers are then no-ops) */
        int run = team == 1 && !forced && schedule != GEMM_DOT && schedule != GEMM_SHARED
                  ? (narrow ? GEMM_NARROW : GEMM_PRIVATE) : schedule;
        if (tid == 0) __atomic_store_n(&last_schedule, run, __ATOMIC_RELAXED);
#if TF_HAVE_AMX
        if (s->amx) tf_amx_begin();
#endif
        float *Bp = dot ? NULL : buffer + shared_floats + (size_t)tid * (a_floats + b_floats);
        float *Ap = dot ? NULL : Bp + b_floats;
        long u;
        if (run == GEMM_DOT) {   /* units of 4 * `per` columns */
            long tiles = ceil_div(N, 4), per = team == 1 ? tiles : ceil_div(tiles, 8L * team);
            long groups = ceil_div(tiles, per);
            while ((u = team == 1 ? (next < nb * groups ? next++ : nb * groups)
                                  : __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED)) < nb * groups) {
                long t = u / groups, p = u % groups;
                gemm_entry(&g, &bt, t);
                s->dot(M, K, alpha, g.A, lda, g.B, ldb, accumulate, g.C, ldc, 4 * p * per,
                       min_l(N, 4 * (p + 1) * per));
            }
        } else if (run == GEMM_PRIVATE || (run == GEMM_NARROW && team == 1)) {
            for (long t = 0; t < nb; t++) { gemm_entry(&g, &bt, t); gemm_alone(&g, Bp, Ap, 0, np); }
        } else if (run == GEMM_BY_BATCH) {   /* units of `per` batch entries */
            long per = ceil_div(nb, 8L * team);
            while ((u = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED)) * per < nb)
                for (long t = u * per; t < min_l(nb, (u + 1) * per); t++) {
                    gemm_entry(&g, &bt, t);
                    gemm_alone(&g, Bp, Ap, 0, np);
                }
        } else if (run == GEMM_NARROW) {     /* units of `per` NR panels; op(A) packed once per entry */
            long per = ceil_div(np, 8L * team), groups = ceil_div(np, per), held = -1;
            while ((u = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED)) < nb * groups) {
                long t = u / groups, p = u % groups;
                gemm_entry(&g, &bt, t);
                if (t != held) { narrow_pack_a(&g, Ap); held = t; }
                narrow_panels(&g, Bp, Ap, p * per, min_l(np, (p + 1) * per));
            }
        } else if (run == GEMM_SHARED) {
            gemm_shared(&g, &bt, nb, buffer, Ap, counters, lazy, tid, team);
        } else {                             /* tiles */
            long mcu = tile_rows(s, M, team), ncu = tile_cols(s, N, K);
            long rb = ceil_div(M, mcu), cb = ceil_div(N, ncu), held = -1;
            while ((u = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED)) < nb * rb * cb) {
                long t = u / (rb * cb), c = u % (rb * cb) / rb, r = u % rb;
                gemm_entry(&g, &bt, t);
                gemm_tile(&g, Bp, Ap, r * mcu, min_l(mcu, M - r * mcu), c * ncu, min_l(ncu, N - c * ncu),
                          t * cb + c != held);
                held = t * cb + c;
            }
        }
#if TF_HAVE_AMX
        if (s->amx) tf_amx_end();
#endif
        __atomic_fetch_add(&packed_total[0], packed[0], __ATOMIC_RELAXED);
        __atomic_fetch_add(&packed_total[1], packed[1], __ATOMIC_RELAXED);
        __atomic_fetch_add(&packed_total[2], packed[2], __ATOMIC_RELAXED);
    }
    if (buffer) gemm_buffer_release(buffer, owned);
}

void gemm_batched(int trans_a, int trans_b, long batch0, long batch1,
                  long M, long N, long K, float alpha,
                  const float *A, long lda, long a_stride0, long a_stride1,
                  const float *B, long ldb, long b_stride0, long b_stride1,
                  int accumulate,
                  float *C, long ldc, long c_stride0, long c_stride1)
{
    gemm_batched_prec(GEMM_FP32, trans_a, trans_b, batch0, batch1, M, N, K, alpha, A, lda, a_stride0,
                      a_stride1, B, ldb, b_stride0, b_stride1, accumulate, C, ldc, c_stride0, c_stride1);
}

void gemm(int trans_a, int trans_b, long M, long N, long K, float alpha,
          const float *A, long lda, const float *B, long ldb, int accumulate, float *C, long ldc)
{
    gemm_batched(trans_a, trans_b, 1, 1, M, N, K, alpha, A, lda, 0, 0, B, ldb, 0, 0,
                 accumulate, C, ldc, 0, 0);
}
