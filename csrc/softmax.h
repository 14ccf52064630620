/* Masked softmax over the last axis of attention scores, forward and backward.
 *
 * Scores are [B, H, Tq, Tk] (H = 1 for [B, Tq, Tk]); each of the B*H*Tq rows of
 * Tk keys is handled in one pass over memory (the row stays in L1 between its
 * max, exp-and-sum and normalise sweeps). Masked keys get probability exactly 0;
 * a row whose keys are all masked is all zeros (never NaN). Rows are spread over
 * OpenMP threads; each row is computed the same way on any thread, so results
 * do not depend on the thread count. AVX-512 / AVX2 / plain C chosen by tf_isa().
 */
#ifndef TF_SOFTMAX_H
#define TF_SOFTMAX_H

#include <stddef.h>
#include <stdint.h>

/* probs = softmax(scale * scores + masks) over Tk.
 * probs            [B, H, Tq, Tk]  output; may be scores itself (in place)
 * scores           [B, H, Tq, Tk]
 * key_padding_mask [B, Tk] or NULL; nonzero = padding key, ignored
 * causal           query q (absolute position q_offset + q) sees keys k <= q_offset + q
 * q_offset         >= 0 */
void softmax_forward(float *probs, const float *scores, const uint8_t *key_padding_mask,
                     long B, long H, long Tq, long Tk, float scale, int causal, long q_offset);

/* dscores = scale * probs * (dprobs - sum(probs * dprobs)) over each row of Tk.
 * dscores [rows, Tk] output; may be dprobs itself (in place)
 * probs   [rows, Tk]
 * dprobs  [rows, Tk] */
void softmax_backward(float *dscores, const float *probs, const float *dprobs,
                      long rows, long Tk, float scale);

/* One (sentence, head) block on the calling thread alone, for kernels that fuse the softmax into
 * their own parallel loop (attention_train.c): the bits softmax_forward / softmax_backward give
 * these rows (each row is computed the same way wherever it falls).
 * probs, scores [Tq, Tk] (probs may be scores); pad [Tk] or NULL; causal: query q sees keys <= q.
 * dscores, probs, dprobs [rows, Tk] (dscores may be dprobs). */
void softmax_block_forward(float *probs, const float *scores, const uint8_t *pad, long Tq, long Tk,
                           float scale, int causal);
void softmax_block_backward(float *dscores, const float *probs, const float *dprobs, long rows,
                            long Tk, float scale);

/* exp of every element (the vectorised exp the softmax uses at the current ISA level;
 * the plain C level uses expf). out [n] may be x. For tests of the exp's accuracy. */
void tf_exp_array(float *out, const float *x, long n);

#endif
