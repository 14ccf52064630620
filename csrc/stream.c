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
        beam_begin(w->beam, &w->loop, 0, w->d->B, 0, 1);
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

/* The waves mine[0 .. n) stepped together on the calling thread, their rows from step-buffer row
 * row0 on, until *stop is set (by this thread or another: the call's end) or max_steps; this
 * thread sets it once, after min_steps of its steps, one of its sentences has finished or
 * *arrived is nonzero. seg, live: room for n. Returns the steps taken. */
static long run_waves(const tf_decoder *d, tf_wave *const *mine, int n, long row0, step_segment *seg,
                      tf_wave **live, long min_steps, long max_steps, const int *arrived, int *stop)
{
    long steps = 0, finished = 0;
    while (steps < max_steps && !__atomic_load_n(stop, __ATOMIC_RELAXED)) {
        int n_live = 0;
        long rows = row0;
        for (int i = 0; i < n; i++) {
            if (mine[i]->loop.n <= 0) continue;
            live[n_live] = mine[i];
            seg[n_live] = wave_segment(mine[i], rows);
            rows += seg[n_live].n;
            n_live++;
        }
        if (!n_live) break;
        step_segments(d, seg, n_live);
        for (int i = 0; i < n_live; i++) {
            wave_after(d, live[i], seg[i].row);
            finished += live[i]->loop.finished;
        }
        steps++;
        if (steps >= min_steps && (finished || (arrived && __atomic_load_n(arrived, __ATOMIC_ACQUIRE)))) {
            __atomic_store_n(stop, 1, __ATOMIC_RELAXED);
            break;
        }
    }
    return steps;
}

static long wave_rows(const tf_wave *w)
{
    return w->greedy ? w->loop.n : w->loop.n * w->beam->K;
}

long decoder_stream(const tf_decoder *d, tf_wave *const *waves, int n_waves, long min_steps, long max_steps,
                    const int *arrived, int groups)
{
    if (n_waves <= 0 || max_steps <= 0) return 0;
    int n_live = 0;
    for (int i = 0; i < n_waves; i++) n_live += waves[i]->loop.n > 0;
    const int G = groups < n_live ? groups : n_live;
    tf_wave **order = malloc((size_t)n_waves * 3 * sizeof *order);   /* order, mine, live */
    step_segment *seg = malloc((size_t)n_waves * sizeof *seg);
    int *owner = malloc((size_t)n_waves * sizeof *owner);
    long steps = 0;
    int stop = 0;
    if (!order || !seg || !owner) goto out;   /* the caller sees 0 steps with waves live */
    if (G <= 1) {
        /* one block: every kernel with the process's team */
        steps = run_waves(d, waves, n_waves, 0, seg, order + 2 * (size_t)n_waves, min_steps, max_steps, arrived,
                          &stop);
        goto out;
    }
    /* G threads, each stepping its own waves to the call's end without meeting the others (as
     * decoder_greedy's blocks: a thread that the system takes away for a while does not hold the
     * others up at every step). Waves go whole to the thread with the fewest rows, biggest
     * first; each thread's rows follow the threads' before it in the step buffers (waves only
     * shrink within a call). */
    long load[64] = {0};
    const int T = G < 64 ? G : 64;   /* threads: tf_team caps the process's at far fewer */
    int m = 0;
    for (int i = 0; i < n_waves; i++)
        if (waves[i]->loop.n > 0) order[m++] = waves[i];
    for (int i = 1; i < m; i++)            /* biggest first (insertion sort: few waves) */
        for (int j = i; j > 0 && wave_rows(order[j]) > wave_rows(order[j - 1]); j--) {
            tf_wave *t = order[j]; order[j] = order[j - 1]; order[j - 1] = t;
        }
    for (int i = 0; i < m; i++) {
        int k = 0;
        for (int t = 1; t < T; t++) if (load[t] < load[k]) k = t;
        owner[i] = k;
        load[k] += wave_rows(order[i]);
    }
    tf_wave **mine = order + n_waves;      /* grouped by thread */
    int first[65] = {0};
    for (int t = 0, at = 0; t < T; t++) {
        first[t] = at;
        for (int i = 0; i < m; i++) if (owner[i] == t) mine[at++] = order[i];
        first[t + 1] = at;
    }
    long taken[64] = {0};
#pragma omp parallel for num_threads(T) schedule(static, 1)
    for (int t = 0; t < T; t++) {
        long row0 = 0;
        for (int u = 0; u < t; u++) row0 += load[u];
        taken[t] = run_waves(d, mine + first[t], first[t + 1] - first[t], row0, seg + first[t],
                             order + 2 * (size_t)n_waves + first[t], min_steps, max_steps, arrived, &stop);
    }
    for (int t = 0; t < T; t++) steps = taken[t] > steps ? taken[t] : steps;
out:
    free(order);
    free(seg);
    free(owner);
    return steps;
}
