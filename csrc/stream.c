/* Iteration-level batching (stream.h): the live waves stepped together. */
#include "stream.h"

#include <stdlib.h>

#include "decoder_loop.h"

void decoder_wave_begin(tf_wave *w)
{
    if (w->greedy) {
        for (long b = 0; b < w->d->B; b++) w->greedy->lengths[b] = w->greedy->limits[b];
        greedy_begin(w->greedy, &w->loop, 0, w->d->B, 0, 1);
    } else {
        beam_begin(w->d, w->beam, &w->loop, 0, w->d->B, 0, 1);
    }
}

static step_segment wave_segment(const tf_wave *w, long row)
{
    return w->greedy ? greedy_segment(w->d, w->greedy, &w->loop, row) : beam_segment(w->d, w->beam, &w->loop, row);
}

static void wave_after(const tf_decoder *d, tf_wave *w, long row)
{
    float *logits = d->logits + row * d->V;   /* the stream's step buffers, not the wave's own */
    if (w->greedy) greedy_after(w->d, w->greedy, &w->loop, logits);
    else beam_after(w->d, w->beam, &w->loop, logits);
}

/* The part of segment s in step-buffer rows [lo, hi) (0: none of it). */
static int clip(const step_segment *s, long lo, long hi, step_segment *out)
{
    const long a = s->row > lo ? s->row : lo, b = s->row + s->n < hi ? s->row + s->n : hi;
    if (a >= b) return 0;
    const long off = a - s->row;
    *out = *s;
    out->ids += off;
    out->slot += off;
    out->sentence += off;
    out->origin += off * s->ld_origin;
    if (out->argmax) out->argmax += off;
    out->n = b - a;
    out->row = a;
    return 1;
}

long decoder_stream(const tf_decoder *d, tf_wave *const *waves, int n_waves, long max_steps,
                    const int *arrived, int groups)
{
    if (n_waves <= 0 || max_steps <= 0) return 0;
    if (groups < 1) groups = 1;
    step_segment *seg = malloc((size_t)n_waves * (size_t)(groups + 1) * sizeof *seg);
    tf_wave **live = malloc((size_t)n_waves * sizeof *live);
    long *first_row = malloc((size_t)n_waves * sizeof *first_row);
    long steps = 0;
    if (!seg || !live || !first_row) goto out;   /* the caller sees 0 steps with waves live */
    step_segment *parts = seg + n_waves;
    while (steps < max_steps) {
        int n_live = 0;
        long rows = 0;
        for (int i = 0; i < n_waves; i++) {
            if (waves[i]->loop.n <= 0) continue;
            live[n_live] = waves[i];
            first_row[n_live] = rows;
            seg[n_live] = wave_segment(waves[i], rows);
            rows += seg[n_live].n;
            n_live++;
        }
        if (!n_live) break;
        const int G = groups < rows ? groups : (int)rows;
        if (G <= 1) {
            step_segments(d, seg, n_live);
        } else {
            /* Each thread the whole step for its block of rows, every kernel inside on it alone
             * (decoder.h: decoder_step's groups); a block may cut a wave anywhere. */
#pragma omp parallel for num_threads(G) schedule(static, 1)
            for (int k = 0; k < G; k++) {
                step_segment *mine = parts + (size_t)k * (size_t)n_live;
                int m = 0;
                for (int i = 0; i < n_live; i++) m += clip(&seg[i], rows * k / G, rows * (k + 1) / G, &mine[m]);
                if (m) step_segments(d, mine, m);
            }
        }
        long finished = 0;
        if (G <= 1 || n_live == 1) {
            for (int i = 0; i < n_live; i++) {
                wave_after(d, live[i], first_row[i]);
                finished += live[i]->loop.finished;
            }
        } else {
#pragma omp parallel for num_threads(G < n_live ? G : n_live) schedule(dynamic, 1) reduction(+ : finished)
            for (int i = 0; i < n_live; i++) {
                wave_after(d, live[i], first_row[i]);
                finished += live[i]->loop.finished;
            }
        }
        steps++;
        if (finished || (arrived && __atomic_load_n(arrived, __ATOMIC_ACQUIRE))) break;
    }
out:
    free(seg);
    free(live);
    free(first_row);
    return steps;
}
