/* Plain C: one int32 dot product per element over a row of Q (panels of one column). */
#include "qgemm_isa.h"

void qgemm_kernel_generic(long m, long K, const int16_t *Xq, long ldq, const float *xs,
                          const int8_t *panel, const float *ws, const int32_t *comp,
                          const float *bias, float *C, long ldc, int nr)
{
    (void)nr;   /* panels of one column */
    (void)comp;
    for (long i = 0; i < m; i++) {
        const int16_t *x = Xq + i * ldq;
        int32_t acc = 0;
        for (long k = 0; k < K; k++) acc += (int32_t)x[k] * panel[k];
        C[i * ldc] = dequantize(acc, xs[i], ws[0], bias);
    }
}
