/* Iteration-level batching: decoding calls ("waves") that join and leave one running batch
 * between two decoder steps (Orca, Yu et al., OSDI 2022: scheduling per iteration, with the
 * attention of each request on its own and every other operation batched).
 *
 * A wave is a decoding call as decoder_greedy or decoder_beam would run it: its sentences, their
 * encoder keys and values, their self-attention caches and the loop's arrays (tf_decoder,
 * tf_greedy / tf_beam). A stream steps every live wave together: each step's linear maps,
 * layer norms and output projection multiply the rows of all of them at once, in one set of
 * step buffers, while each wave's rows attend over its own caches and encoder output at its own
 * position (decoder_loop.h: segments). Between two calls the caller adds waves (a new request's
 * sentences start at their first step while the others go on) and drops the finished ones.
 *
 * A wave's tokens are those decoder_greedy or decoder_beam would give it: the same kernels in
 * the same order on each row, and no kernel mixes rows. The server (transformer/serve) checks
 * every answer against the offline translation of its own sentence. */
#ifndef TF_STREAM_H
#define TF_STREAM_H

#include "decoder.h"

typedef struct {
    const tf_decoder *d;        /* the wave's call: caches, encoder keys/values, src_pad (its step buffers unused) */
    const tf_greedy *greedy;    /* one of the two, the other NULL; finished set, cancelled optional */
    const tf_beam *beam;
    tf_loop loop;               /* decoder_wave_begin sets it */
} tf_wave;

/* The wave's sentences before their first step (every sentence of it, one block). */
void decoder_wave_begin(tf_wave *w);

/* Steps the live waves (loop.n > 0) together until, after at least min_steps steps, a sentence
 * has finished since the call began (its finished flag set) or *arrived is nonzero (the caller
 * has a wave to add), or until max_steps steps are done; returns the steps taken. min_steps > 1
 * lets sentences that finish or arrive a few steps apart be answered or admitted together: each
 * return costs the caller its interpreter's work, every step when requests keep arriving.
 *
 * d: the weights and the step buffers, whose N rows must hold the live waves' rows (greedy:
 * their live sentences; beam: K per live sentence). groups: threads, each stepping whole waves
 * (dealt biggest first to the thread with the fewest rows) to the call's end without meeting the
 * others, every kernel inside on it alone, as decoder_greedy's blocks; 1, or one live wave: every
 * kernel with the process's team. The caller splits a big wave in one per thread
 * (streaming.py). The caller checks. */
long decoder_stream(const tf_decoder *d, tf_wave *const *waves, int n_waves, long min_steps, long max_steps,
                    const int *arrived, int groups);

#endif
