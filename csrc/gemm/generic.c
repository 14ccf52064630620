/* Plain C: the portable packing (any MR / NR) and the 4 x 8 micro-kernel, for CPUs without AVX2
 * and builds for other architectures. */
#include "gemm_isa.h"

/* ------------------------------------------------------------------------- */
/* Portable packing: any MR / NR. */

/* Ap <- rows [0, m) x columns [0, kc) of op(A), as ceil(m/MR) micro-panels [kc][MR]
 * (panel p at Ap + p*MR*kc; rows past m are zero).
 * A points at element (0, 0) of the block: op(A)[i][k] = trans_a ? A[k*lda + i] : A[i*lda + k]. */
static void pack_a_any(int trans_a, const float *A, long lda, long m, long kc, int MR, float *Ap)
{
    for (long ip = 0; ip < m; ip += MR) {
        int mr = m - ip < MR ? (int)(m - ip) : MR;
        float *dst = Ap + ip * kc;
        if (!trans_a) {
            for (int i = 0; i < mr; i++) {
                const float *src = A + (ip + i) * lda;
                for (long k = 0; k < kc; k++) dst[k * MR + i] = src[k];
            }
            for (int i = mr; i < MR; i++)
                for (long k = 0; k < kc; k++) dst[k * MR + i] = 0.0f;
        } else {
            for (long k = 0; k < kc; k++) {
                const float *src = A + k * lda + ip;
                float *d = dst + k * MR;
                for (int i = 0; i < mr; i++) d[i] = src[i];
                for (int i = mr; i < MR; i++) d[i] = 0.0f;
            }
        }
    }
}

/* Bp <- rows [0, kc) x columns [0, n) of op(B), as ceil(n/NR) micro-panels [kc][NR]
 * (panel p at Bp + p*NR*kc; columns past n are zero).
 * op(B)[k][j] = trans_b ? B[j*ldb + k] : B[k*ldb + j]. */
static void pack_b_any(int trans_b, const float *B, long ldb, long n, long kc, int NR, float *Bp)
{
    for (long jp = 0; jp < n; jp += NR) {
        int nr = n - jp < NR ? (int)(n - jp) : NR;
        float *dst = Bp + jp * kc;
        if (!trans_b) {
            for (long k = 0; k < kc; k++) {
                const float *src = B + k * ldb + jp;
                float *d = dst + k * NR;
                for (int j = 0; j < nr; j++) d[j] = src[j];
                for (int j = nr; j < NR; j++) d[j] = 0.0f;
            }
        } else {
            for (int j = 0; j < nr; j++) {
                const float *src = B + (jp + j) * ldb;
                for (long k = 0; k < kc; k++) dst[k * NR + j] = src[k];
            }
            for (int j = nr; j < NR; j++)
                for (long k = 0; k < kc; k++) dst[k * NR + j] = 0.0f;
        }
    }
}

/* ------------------------------------------------------------------------- */
/* Plain C micro-kernel: 4 x 8. */

#define GEN_MR 4
#define GEN_NR 8

static void kernel_generic(long kc, const float *Ap, const float *Bp, long bs, float *C, long ldc,
                           int nr, const float *alpha, int load_c, int mr)
{
    float acc[GEN_MR][GEN_NR] = {{0}};
    for (long k = 0; k < kc; k++) {
        const float *a = Ap + k * GEN_MR, *b = Bp + k * bs;
        for (int i = 0; i < GEN_MR; i++)
            for (int j = 0; j < GEN_NR; j++)
                acc[i][j] += a[i] * b[j];
    }
    for (int i = 0; i < mr; i++) {
        float *c = C + i * ldc;
        if (load_c)
            for (int j = 0; j < nr; j++) c[j] += *alpha * acc[i][j];
        else
            for (int j = 0; j < nr; j++) c[j] = *alpha * acc[i][j];
    }
}

#define GEN_KERNEL(R)                                                                      \
    static void kernel_generic_##R(long kc, const float *Ap, const float *Bp, long bs,       \
                                   float *C, long ldc, int nr, const float *alpha,          \
                                   int load_c)                                              \
    { kernel_generic(kc, Ap, Bp, bs, C, ldc, nr, alpha, load_c, R); }
GEN_KERNEL(1) GEN_KERNEL(2) GEN_KERNEL(3) GEN_KERNEL(4)

static void pack_a_generic(int t, const float *X, long ldx, long n, long kc, float *dst)
{ pack_a_any(t, X, ldx, n, kc, GEN_MR, dst); }
static void pack_b_generic(int t, const float *X, long ldx, long n, long kc, float *dst)
{ pack_b_any(t, X, ldx, n, kc, GEN_NR, dst); }

const gemm_isa isa_generic = {
    GEN_MR, GEN_NR, 256, 128, 2048,
    {0, kernel_generic_1, kernel_generic_2, kernel_generic_3, kernel_generic_4}, {0},
    pack_a_generic, pack_b_generic, NULL, {0}, 0};

/* bf16 operands (gemm_isa.h: BF16_PACKS): the same kernels over packed blocks rounded to bf16. */
BF16_PACKS(generic, GEN_MR, GEN_NR)

const gemm_isa isa_generic_bf16 = {
    GEN_MR, GEN_NR, 256, 128, 2048,
    {0, kernel_generic_1, kernel_generic_2, kernel_generic_3, kernel_generic_4}, {0},
    pack_a_generic_bf16, pack_b_generic_bf16, NULL, {0}, 1};
