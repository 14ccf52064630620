/* Token embedding gather and its scatter-add backward ("Attention Is All You Need" section 3.4:
 * the embedding is multiplied by sqrt(d_model); section 3.5: positional encodings are added).
 *
 * Kernels trust their caller: every id in [0, V), pe has the T rows the call reads
 * (pyx/embedding.pxi checks both before calling).
 */
#ifndef TF_EMBEDDING_H
#define TF_EMBEDDING_H

#include <stddef.h>
#include <stdint.h>

/* out[r, :] = table[ids[r], :] * scale (+ pe[r % T, :] when pe is not NULL), r = b * T + t.
 * ids: [BT]; table: [V, D]; pe: NULL or [T, D] (already offset to the first position);
 * out: [BT, D]. Parallel over tokens. */
void embedding_forward(const int64_t *ids, const float *table, const float *pe, float *out,
                       size_t BT, size_t T, size_t D, float scale);

/* dtable[ids[r], :] += scale * dout[r, :] for r = 0 .. BT-1 in order.
 * ids: [BT]; dout: [BT, D]; dtable: [V, D]. Parallel over column chunks of D: each thread walks
 * all tokens in order over its own columns, so repeated ids accumulate in token order whatever
 * the thread count (no atomics, same bits). */
void embedding_backward(const int64_t *ids, const float *dout, float *dtable, size_t BT, size_t D,
                        float scale);

/* Naive references, one thread. */
void embedding_forward_reference(const int64_t *ids, const float *table, const float *pe,
                                 float *out, size_t BT, size_t T, size_t D, float scale);
void embedding_backward_reference(const int64_t *ids, const float *dout, float *dtable, size_t BT,
                                  size_t D, float scale);

#endif
