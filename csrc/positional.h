/* Sinusoidal positional encoding (paper, section 3.5). */
#ifndef TF_POSITIONAL_H
#define TF_POSITIONAL_H

/* out [max_len, d_model] output:
 *   out[pos, 2i]   = sin(pos / 10000^(2i / d_model))
 *   out[pos, 2i+1] = cos(pos / 10000^(2i / d_model))
 * computed in double and rounded to float once; an odd d_model ends with a sin column. */
void positional_encoding(float *out, long max_len, long d_model);

#endif
