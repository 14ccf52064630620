/* Elementwise kernels of the Transformer: residual add, bias add and its gradient, the fused
 * bias + activation of the position-wise feed-forward network ("Attention Is All You Need"
 * eq. 2: FFN(x) = max(0, x W1 + b1) W2 + b2) and its backward.
 *
 * Every kernel is parallel over what a thread writes, so results are bitwise the same for any
 * thread count. Kernels trust their caller (shapes, aliasing: see pyx/elementwise.pxi).
 *
 * GELU is the exact form gelu(x) = x * Phi(x), Phi(x) = 0.5 * erfc(-x / sqrt(2)) (PyTorch's
 * approximate='none'). The SIMD paths evaluate Phi(x) = t * Q(t) * exp(-x^2/2) for x < 0
 * (t = 1 / (1 + |x| / (2 sqrt 2)), Q a degree-10 fit) and 1 - Phi(-x) for x >= 0, with x^2/2
 * split exactly into two floats, so Phi is accurate to a few ulp *relative* everywhere (also
 * deep in the left tail, where 1 + erf(x) loses all digits); Phi is flushed to 0 below
 * x = -13.2 (Phi < 1.2e-38). The generic path uses libm's double erfc/exp.
 *
 * SiLU ("swish", MarianMT's activation) is silu(x) = x * s(x), s(x) = 1 / (1 + exp(-x)), and
 * silu'(x) = s(x) (1 + x (1 - s(x))); the SIMD paths take exp from simd_math.h (~1 ulp), the
 * generic path libm's double exp.
 */
#ifndef TF_ELEMENTWISE_H
#define TF_ELEMENTWISE_H

#include <stddef.h>

enum { TF_ACT_RELU = 0, TF_ACT_GELU = 1, TF_ACT_SILU = 2 };

/* out = a + b.  a, b, out: [n]; out may be a or b. */
void residual_add(const float *a, const float *b, float *out, size_t n);

/* x[i, :] += bias.  x: [N, D] in place; bias: [D]. */
void bias_add(float *x, const float *bias, size_t N, size_t D);
/* dbias += sum over rows of dout (rows summed in a fixed order).  dout: [N, D]; dbias: [D]. */
void bias_grad(const float *dout, float *dbias, size_t N, size_t D);

/* x[i, :] += bias (x keeps the pre-activation); out = act(x).  x, out: [N, D]; bias: [D].  out may
 * be x (x then holds act(x + bias): inference, where no backward reads the pre-activation). */
void bias_act_forward(float *x, const float *bias, float *out, size_t N, size_t D, int act);
/* dx = dout * act'(pre) (dx += ... when accumulate).  dout, pre, dx: [n]; dx may be dout when
 * not accumulating.  ReLU'(0) = 0. */
void act_backward(const float *dout, const float *pre, float *dx, size_t n, int act, int accumulate);
/* Elements [i0, i1) of act_backward (not accumulating) on the calling thread alone, with its bits:
 * for kernels that fuse it into their own loop (residual_norm.c). */
void act_backward_span(const float *dout, const float *pre, float *dx, size_t i0, size_t i1, int act);

/* Bytes an op may move (reads + writes) before its output is written with non-temporal stores,
 * which skip the cache: 32 MiB (one L3 slice of a current server core). Same bits either way. */
size_t elementwise_stream_bytes(void);

/* Naive references (one thread, double-precision GELU). */
void bias_act_forward_reference(float *x, const float *bias, float *out, size_t N, size_t D, int act);
void act_backward_reference(const float *dout, const float *pre, float *dx, size_t n, int act,
                            int accumulate);

#endif
