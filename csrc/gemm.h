/* GEMM: C = alpha * op(A) @ op(B), or C += alpha * op(A) @ op(B).
 *
 * Row-major, float32. op(X) is X or its transpose. Every matrix is addressed by a
 * pointer and a leading dimension (the distance, in floats, between consecutive
 * stored rows), so transposed operands and views into larger arrays (attention
 * heads) are read in place: the only copies are the kernel's own packing buffers.
 *
 *   op(A) is M x K:  A is stored M x K (lda >= K) or, when trans_a, K x M (lda >= M)
 *   op(B) is K x N:  B is stored K x N (ldb >= N) or, when trans_b, N x K (ldb >= K)
 *   C     is M x N:  ldc >= N, C must not overlap A or B
 *
 * Results are bitwise independent of the thread count: how an element of C is
 * summed (FMA chains over fixed K blocks, or for few rows of A @ B^T 16-lane dot
 * products) depends only on the shape and the instruction set, and threads split
 * the output, never the K sum.
 *
 * Packing buffers: one process-wide buffer, grown on demand and kept (a few threads: at
 * most about 5 MiB per thread while K <= 32768; many threads: two B blocks of at most 4 MiB
 * shared by the team, plus at most 336 KiB per thread); a concurrent second caller
 * allocates its own.
 *
 * The implementation: csrc/gemm/, one file per concern (csrc/gemm/gemm_isa.h lists them).
 */
#ifndef TF_GEMM_H
#define TF_GEMM_H

/* Operand precision (gemm_batched_prec, gemm_pack_b, gemm_packed). GEMM_FP32: as stored.
 * GEMM_BF16: every element of op(A) and op(B) is first rounded to bfloat16 (round to nearest, ties
 * to even; NaN stays NaN; a subnormal bf16 becomes zero of its sign, as vdpbf16ps reads it), then multiplied and summed in fp32 exactly as GEMM_FP32 sums: the same
 * FMA chains, schedules and thread-count independence (a bf16 x bf16 product is exact in fp32).
 * C, alpha and the accumulation stay fp32. This is the rounding vdpbf16ps applies. At the
 * avx512_bf16 level vdpbf16ps computes it (two products per fp32 lane and instruction, added in
 * its own order: the sums differ from the other levels' by fp32 rounding only; still bitwise
 * independent of the thread count), at the amx level AMX tiles (tdpbf16ps, 32 k per step, then
 * the remaining pairs with vdpbf16ps; the same bf16 pairs packed for B); below them the fp32 FMA
 * kernels of the level do. */
enum { GEMM_FP32 = 0, GEMM_BF16 = 1 };

/* One GEMM. accumulate = 0: C = alpha*op(A)@op(B) (C is not read);
 * accumulate = 1: C += alpha*op(A)@op(B). K = 0 gives zeros (or leaves C as is). */
void gemm(int trans_a, int trans_b, long M, long N, long K, float alpha,
          const float *A, long lda,      /* op(A): M x K */
          const float *B, long ldb,      /* op(B): K x N */
          int accumulate,
          float *C, long ldc);           /* C: M x N */

/* Batched GEMM over two batch axes [batch0, batch1] (e.g. [B, H] attention heads).
 * Matrix (i, j) of X starts at X + i * x_stride0 + j * x_stride1 (strides in floats,
 * >= 0; a stride of 0 broadcasts one matrix to every entry of that axis, A and B only). */
void gemm_batched(int trans_a, int trans_b, long batch0, long batch1,
                  long M, long N, long K, float alpha,
                  const float *A, long lda, long a_stride0, long a_stride1,
                  const float *B, long ldb, long b_stride0, long b_stride1,
                  int accumulate,
                  float *C, long ldc, long c_stride0, long c_stride1);

/* gemm_batched with operands of precision `prec` (GEMM_FP32 | GEMM_BF16). */
void gemm_batched_prec(int prec, int trans_a, int trans_b, long batch0, long batch1,
                       long M, long N, long K, float alpha,
                       const float *A, long lda, long a_stride0, long a_stride1,
                       const float *B, long ldb, long b_stride0, long b_stride1,
                       int accumulate,
                       float *C, long ldc, long c_stride0, long c_stride1);

/* Pre-packed op(B), for many products with one fixed op(B) and few rows (decoding: x @ W^T with
 * the same weights every step). gemm_pack_b stores op(B) (K x N, as in gemm) the way the micro-
 * kernels of instruction set `isa` (a TF_ISA_* level) read it: ceil(N / NR) panels of K x NR
 * floats, columns past N zero (avx2, avx512_bf16 and amx with GEMM_BF16: the first ceil(K / 2) x NR
 * of each panel's floats hold bf16 pairs, k = 2t in the low half and 2t + 1 in the high half of
 * row t: half the bytes to stream);
 * gemm_packed_floats(isa, N, K) floats, 64-byte aligned. gemm_packed
 * then computes C = alpha * A @ op(B) (or C += ...), A row-major M x K, with the kernels of the
 * same `isa`, reading each panel in one sequential pass and packing nothing of op(B): no
 * transposition per call. Bits as the narrow schedule's, independent of the thread count. */
long gemm_packed_floats(int isa, long N, long K);
void gemm_pack_b(int isa, int prec, int trans_b, long N, long K,   /* prec: GEMM_BF16 rounds */
                 const float *B, long ldb,       /* op(B): K x N */
                 float *Bp);                     /* [ceil(N / NR)][K][NR] */
void gemm_packed(int isa, int prec, long M, long N, long K, float alpha,   /* prec: as packed */
                 const float *A, long lda,       /* M x K */
                 const float *Bp,                /* from gemm_pack_b(isa, ..., N, K, ...) */
                 int accumulate,
                 float *C, long ldc);            /* M x N, not overlapping A or Bp */

/* The naive reference: a triple loop with a double accumulator per element, then
 * C = alpha * sum (or C += alpha * sum), rounded once to float. Same arguments. */
void gemm_reference(int trans_a, int trans_b, long batch0, long batch1,
                    long M, long N, long K, float alpha,
                    const float *A, long lda, long a_stride0, long a_stride1,
                    const float *B, long ldb, long b_stride0, long b_stride1,
                    int accumulate,
                    float *C, long ldc, long c_stride0, long c_stride1);

/* Testing hooks, for tests/test_gemm.py only (through transformer._C); not thread-safe
 * against concurrent GEMMs, and never needed to get a correct or fast result. */
enum { GEMM_AUTO = 0, GEMM_DOT, GEMM_PRIVATE, GEMM_NARROW, GEMM_BY_BATCH, GEMM_TILES, GEMM_SHARED };
/* In the calling thread, while `on`: gemm never takes the dot path (few rows of A @ B^T as dot
 * products, whose sums run in another order than the packed kernels'), so each row of C has the
 * bits it has in any other call, whatever the other rows: inference's encoder asks for it, so
 * that a sentence's translation does not depend on what it was batched with (transformer/
 * decoding/cache.py: rows_apart). Returns the previous setting. The packed path (gemm_packed) never
 * depends on the other rows. */
int gemm_rows_apart(int on);

/* From now on run every product the dot path does not take with `schedule` (GEMM_TILES or
 * GEMM_SHARED; anything else: GEMM_AUTO, the normal choice); when all_threads, start every
 * thread of the process whatever the size of the product; when lazy, odd threads of the
 * shared schedule leave their own work to the others (exercises taking others' work). */
void gemm_test_force(int schedule, int all_threads, int lazy);
/* The schedule the last GEMM ran (its first thread's view; GEMM_AUTO before any). */
int gemm_test_last_schedule(void);
/* Since the last reset: counts[0], counts[1]: floats of op(A), op(B) copied into packing
 * buffers (zero padding not counted); counts[2]: shared-schedule work units a thread took
 * from another's rectangle. reset: read and set to zero. */
void gemm_test_counters(long counts[3], int reset);

#endif
