/* The naive reference (gemm.h: gemm_reference): a triple loop with a double accumulator per
 * element, the tests' second opinion and the slow path when no packing buffer can be had. */
#include "blocks.h"

void gemm_reference(int trans_a, int trans_b, long batch0, long batch1,
                    long M, long N, long K, float alpha,
                    const float *A, long lda, long a_stride0, long a_stride1,
                    const float *B, long ldb, long b_stride0, long b_stride1,
                    int accumulate,
                    float *C, long ldc, long c_stride0, long c_stride1)
{
    gemm_reference_prec(GEMM_FP32, trans_a, trans_b, batch0, batch1, M, N, K, alpha, A, lda, a_stride0,
                        a_stride1, B, ldb, b_stride0, b_stride1, accumulate, C, ldc, c_stride0, c_stride1);
}

void gemm_reference_prec(int prec, int trans_a, int trans_b, long batch0, long batch1,
                         long M, long N, long K, float alpha,
                         const float *A, long lda, long a_stride0, long a_stride1,
                         const float *B, long ldb, long b_stride0, long b_stride1,
                         int accumulate, float *C, long ldc, long c_stride0, long c_stride1)
{
    const int bf16 = prec == GEMM_BF16;
    for (long b0 = 0; b0 < batch0; b0++)
        for (long b1 = 0; b1 < batch1; b1++) {
            const float *a = A + b0 * a_stride0 + b1 * a_stride1;
            const float *b = B + b0 * b_stride0 + b1 * b_stride1;
            float *c = C + b0 * c_stride0 + b1 * c_stride1;
            for (long i = 0; i < M; i++)
                for (long j = 0; j < N; j++) {
                    double sum = 0.0;
                    for (long k = 0; k < K; k++) {
                        float x = trans_a ? a[k * lda + i] : a[i * lda + k];
                        float y = trans_b ? b[j * ldb + k] : b[k * ldb + j];
                        if (bf16) { x = round_bf16(x); y = round_bf16(y); }
                        sum += (double)x * y;
                    }
                    double r = (double)alpha * sum;
                    if (accumulate) r += c[i * ldc + j];
                    c[i * ldc + j] = (float)r;
                }
        }
}
