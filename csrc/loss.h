/* Cross-entropy with label smoothing and an ignore index, and log-softmax.
 *
 * The loss is PyTorch's F.cross_entropy(logits, targets, ignore_index, label_smoothing) with
 * mean reduction; its gradient is written in the same pass over each row, so the training loop
 * reads the logits once and writes the gradient once (in place when dlogits == logits).
 * Kernels trust their caller: pyx/loss.pxi checks shapes, dtypes and target ranges.
 */
#ifndef TF_LOSS_H
#define TF_LOSS_H

#include <stdint.h>

/* Mean cross-entropy over the rows whose target != ignore_index, and its gradient.
 *   logits     (N, V)  float32
 *   targets    (N,)    int64, each in [0, V) or == ignore_index
 *   dlogits    (N, V)  float32 or NULL; receives grad_scale * d mean_loss / d logits, zeros on
 *                      ignored rows; may be logits itself (overwritten in place)
 *   row_loss   (N,)    double scratch: per-row losses, summed in row order (same bits for any
 *                      thread count)
 *   n_valid            number of rows whose target != ignore_index (the caller counts them)
 * Per valid row (label smoothing eps):
 *   loss_i = (1 - eps) * (-log p_target) + eps * mean_c(-log p_c)
 *   dlogits_i = (softmax_i - (1 - eps) * onehot(target) - eps / V) * grad_scale / n_valid
 * Returns the mean of loss_i over valid rows (0 when n_valid == 0). */
double cross_entropy_forward_backward(const float *logits, const int64_t *targets, float *dlogits,
                                      double *row_loss, long N, long V, int64_t ignore_index,
                                      long n_valid, double label_smoothing, double grad_scale);

/* Naive reference of the above: two passes per row in double with libm exp, one thread. */
double cross_entropy_naive(const float *logits, const int64_t *targets, float *dlogits,
                           double *row_loss, long N, long V, int64_t ignore_index,
                           long n_valid, double label_smoothing, double grad_scale);

/* out = log_softmax(x) over each row.
 *   x   (N, V) float32
 *   out (N, V) float32, may be x */
void log_softmax_forward(const float *x, float *out, long N, long V);

#endif
