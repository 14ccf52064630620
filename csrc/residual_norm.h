/* A sub-layer's residual connection and the layer norm after it, in one pass over the rows
 * (section 3.1, LayerNorm(x + Sublayer(x)), with section 5.4's dropout on the sub-layer's output;
 * the sub-layer's last linear map's bias folded in).
 *
 *   forward:  s = residual + dropout(x + bias);   out = LayerNorm(s)
 *   backward: ds = LayerNorm'(dout);   dd = dropout'(ds)   (the gradient of x and of the bias;
 *             the residual's is ds);   dbias += column sums of dd
 *
 * Each kernel gives the bits of the unfused kernels called in turn (bias_dropout_add_forward
 * then layernorm_forward; layernorm_backward, dropout_backward and bias_grad): every element's
 * arithmetic and every column sum's order are theirs, so the bits do not depend on the thread
 * count either. What fusing saves is memory traffic and fork-joins: a block of rows is written
 * and read back while it is in L1, and one parallel region does what took three or four.
 * The kernels trust their caller: 0 <= p < 1, shapes checked in pyx/residual_norm.pxi.
 */
#ifndef TF_RESIDUAL_NORM_H
#define TF_RESIDUAL_NORM_H

#include <stddef.h>
#include <stdint.h>

/* x, residual, s, out [N, D]; bias [D] or NULL; weight, lnbias [D]; mean, rstd [N] (saved for
 * the backward pass, as layernorm_forward saves them). s may be x or residual; out must not
 * overlap s, x or residual. Dropout draws counter offset + r * D + j for element (r, j). */
void residual_layernorm_forward(float *out, float *mean, float *rstd, float *s, const float *x,
                                const float *bias, const float *residual, const float *weight,
                                const float *lnbias, long N, long D, float eps, float p,
                                uint64_t seed, uint64_t offset);

/* Floats of scratch residual_layernorm_backward needs. */
size_t residual_layernorm_backward_scratch(long N, long D);

/* dout, s [N, D]; weight [D], mean, rstd [N] from the forward; ds [N, D] out (may be dout);
 * dd [N, D] out when p > 0 (must not overlap ds or dout), NULL when p == 0 (then dd is ds);
 * dweight, dlnbias, dbias [D] added into (the layer norm's and the linear map's parameters). */
void residual_layernorm_backward(float *ds, float *dd, float *dweight, float *dlnbias, float *dbias,
                                 float *scratch, const float *dout, const float *s,
                                 const float *weight, const float *mean, const float *rstd, long N,
                                 long D, float p, uint64_t seed, uint64_t offset);

/* The same for ScaleNorm (transformer/norms.py; layernorm.h's scalenorm_forward and
 * scalenorm_backward), the default model's norm:
 *   forward:  s = residual + dropout(x + bias);   out = ScaleNorm(s) = s * (g / max(||s||, eps))
 *   backward: ds = ScaleNorm'(dout);   dd = dropout'(ds);   dbias += column sums of dd;
 *             *dg += the sum over rows, in row order, of each row's sum(dout * s_hat)
 * with the bits of bias_dropout_add_forward then scalenorm_forward; scalenorm_backward,
 * dropout_backward and bias_grad. norms [N]: the forward's clamped norms. dg may be NULL. */
void residual_scalenorm_forward(float *out, float *norms, float *s, const float *x, const float *bias,
                                const float *residual, float g, long N, long D, float eps, float p,
                                uint64_t seed, uint64_t offset);
size_t residual_scalenorm_backward_scratch(long N, long D);
void residual_scalenorm_backward(float *ds, float *dd, float *dg, float *dbias, float *scratch,
                                 const float *dout, const float *s, const float *norms, float g,
                                 long N, long D, float eps, float p, uint64_t seed, uint64_t offset);

/* The gradient through a sub-layer's last dropout and the bias before it, where no norm follows
 * (a pre-norm layer's residual branches), or through the feed-forward network's inner dropout,
 * activation and first bias: dd = dropout'(ds), then dd = act'(pre) * dd when pre is not NULL
 * (act a TF_ACT_* of elementwise.h); dbias [D] += the column sums of dd. The bits of
 * dropout_backward, act_backward and bias_grad in turn. ds, dd, pre [N, D]; dd may be ds. */
size_t dropout_bias_backward_scratch(long N, long D);
void dropout_bias_backward(float *dd, float *dbias, float *scratch, const float *ds, const float *pre,
                           int act, long N, long D, float p, uint64_t seed, uint64_t offset);

#endif
