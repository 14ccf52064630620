/* Attention of one new query per (row, head) against a key/value cache: the
 * decoder's inner loop during autoregressive decoding (section 3.2.1 with one
 * query row). Scores, mask, softmax and the weighted sum of values in one pass
 * over the cache, parallel over (row, head) pairs.
 */
#ifndef TF_ATTENTION_H
#define TF_ATTENTION_H

#include <stdint.h>

/* q:        (N, H, dh) rows of q start every ldq floats; head h at q + n*ldq + h*dh
 * k, v:     (N, H, Tmax, dh) contiguous caches; keys 0 .. n_keys-1 are valid
 * key_mask: (N, Tmax) uint8, 1 = ignore that key, or NULL
 * out:      (N, H, dh) rows start every ldo floats
 * probs:    (N, H, n_keys) attention weights written when not NULL
 * A row whose keys are all masked gives zeros. */
void attention_decode_forward(const float *q, long ldq, const float *k, const float *v,
                              const uint8_t *key_mask, float *out, long ldo, float *probs,
                              long N, long H, long Tmax, long n_keys, long dh, float scale);

#endif
