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

/* The same, reading the cache through row indices, so beam search and finished
 * sentences never move the cache (only small index tables change):
 * k, v:      (R, H, Tmax, dh) caches of R rows (R may differ from N)
 * rows:      (N) cache row of query row n, or NULL for row n (cross-attention: the
 *            sentence whose encoder output row n reads; key_mask row too)
 * key_rows:  (N, ld_key_rows) when not NULL, key j of query row n is k[key_rows[n, j], h, j]
 *            (self-attention in beam search: the row that computed that step of the
 *            hypothesis), overriding rows for keys
 * Every index must be in [0, R) (the caller checks). Arithmetic and its order are those
 * of attention_decode_forward: the same bits as gathering the cache first.
 * reference = 1: the plain per-key loop (a dot product and an axpy call per key) at the
 * current SIMD level. The fast paths (AVX-512 and AVX2: 16 or 8 keys at a time, the vector
 * exp, the weighted sum kept in registers) agree with it within rounding; in plain C the fast
 * path is that loop.
 * kv16 = 1: k and v hold bf16 (uint16_t, the high half of a float32) instead of float32, half
 * the bytes a step reads (reduced-precision decoding); each is widened exactly as it is read,
 * so the results have the bits of float32 caches holding the same values. */
void attention_decode_rows_forward(const float *q, long ldq, const void *k, const void *v,
                                   const int64_t *rows, const int64_t *key_rows, long ld_key_rows,
                                   const uint8_t *key_mask, float *out, long ldo, float *probs,
                                   long N, long H, long Tmax, long n_keys, long dh, float scale,
                                   int reference, int kv16);

/* cache[rows[n], h, t, :] = x[n, h*dh : (h+1)*dh]: store one step's keys (or values).
 * x:     (N, H*dh) rows start every ldx floats
 * cache: (R, H, Tmax, dh), float32, or bf16 (kv16: each value rounded as attention_to_bf16)
 * rows:  (N) cache row of each x row, or NULL for row n; distinct, in [0, R) */
void attention_cache_store(const float *x, long ldx, void *cache, const int64_t *rows,
                           long N, long H, long Tmax, long dh, long t, int kv16);

/* out[i] = x[i] rounded to the nearest bf16, ties to even, as its 16 bits: NaN stays NaN
 * (quietened), infinities and subnormals are kept, a finite value past bf16's largest rounds to
 * infinity. What a bf16 cache holds. */
void attention_to_bf16(const float *x, long n, uint16_t *out);

/* x[r, :cols] (rows every ld floats) replaced in place by those bf16 values, widened: what the
 * full forward pass of reduced-precision inference attends with (its keys and values are those
 * a bf16 cache would hold). */
void attention_round_bf16(float *x, long rows, long cols, long ld);

#endif
