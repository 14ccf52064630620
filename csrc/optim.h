/* Fused Adam/AdamW over one flat parameter buffer, and the global-norm helpers (clipping).
 *
 * Kernels trust their caller: pyx/optim.pxi checks dtypes, lengths and hyper-parameter ranges.
 */
#ifndef TF_OPTIM_H
#define TF_OPTIM_H

/* One Adam (decoupled = 0) or AdamW (decoupled = 1) step, in the order of operations and the
 * float32/double choices of torch.optim.Adam's single-tensor CPU path:
 *   AdamW, wd != 0:   p *= (float)(1 - lr * wd)
 *   Adam,  wd != 0:   g = fma(p, (float)wd, g)                 (grad.add(param, alpha=wd))
 *   m = lerp(m, g, (float)(1 - beta1))                          (exp_avg.lerp_)
 *   v = fma((float)(1 - beta2) * g, g, v * (float)beta2)        (mul_ then addcmul_)
 *   denom = sqrt(v) / (float)sqrt(1 - beta2^step) + (float)eps
 *   p = p + ((float)(-lr / (1 - beta1^step)) * m) / denom       (addcdiv_)
 *   params, exp_avg, exp_avg_sq (n) float32, updated in place; grads (n) float32, read only.
 * step >= 1 is the step count after this update. One parallel loop over the buffer. */
void adam_update(float *params, const float *grads, float *exp_avg, float *exp_avg_sq, long n,
                 long step, double lr, double beta1, double beta2, double eps,
                 double weight_decay, int decoupled);

/* Elements per chunk of sum_squares_f32: the summation order is fixed by this, not by threads. */
#define TF_SUMSQ_CHUNK 4096L

/* sum of x[i]^2 in double.
 *   x           (n) float32
 *   chunk_sums  (ceil(n / TF_SUMSQ_CHUNK)) double scratch: one partial sum per chunk, then
 *               added in chunk order, so the result has the same bits for any thread count. */
double sum_squares_f32(const float *x, long n, double *chunk_sums);

/* x (n) *= s */
void scale_f32(float *x, long n, float s);

/* x (n) = 0, threads over contiguous chunks (zeroing the gradient buffer each step: a serial
 * memset of a base model's 225 MB was most of the step's time outside kernels). */
void zero_f32(float *x, long n);

#endif
