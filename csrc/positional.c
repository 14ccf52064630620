/* Sinusoidal positional encoding (see positional.h). Rows in parallel; every
 * element is computed on its own, so the table does not depend on the thread count. */
#include "positional.h"

#include <math.h>

#include "cpu.h"

void positional_encoding(float *out, long max_len, long d_model)
{
    if (max_len == 0 || d_model == 0) return;
#pragma omp parallel for schedule(static) num_threads(tf_team(max_len * d_model, 1024))
    for (long pos = 0; pos < max_len; pos++) {
        float *row = out + pos * d_model;
        for (long c = 0; c < d_model; c += 2) {
            /* c = 2i: the wavelength 10000^(2i/d_model) of the pair (2i, 2i+1). */
            double angle = (double)pos / pow(10000.0, (double)c / (double)d_model);
            row[c] = (float)sin(angle);
            if (c + 1 < d_model) row[c + 1] = (float)cos(angle);
        }
    }
}
