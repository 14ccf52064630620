/* The parts of decoder.c's decoding loops that a stream (stream.c) runs too: one step over
 * segments of rows, and greedy decoding's and beam search's work between two steps. Internal to
 * the two files.
 *
 * A segment is a run of consecutive rows of the step buffers that belong to one decoding call
 * (tf_decoder: its self-attention caches, its sentences' encoder keys and values, their padding)
 * and stand at one position t. decoder_greedy and decoder_beam step one segment at a time; a
 * stream steps the segments of all its waves together, so every linear map multiplies all their
 * rows at once while attention reads each segment's own caches. Every kernel computes each row
 * on its own, so a row's bits do not depend on the segments beside it. */
#ifndef TF_DECODER_LOOP_H
#define TF_DECODER_LOOP_H

#include "decoder.h"

typedef struct {
    const tf_decoder *d;        /* the call the rows belong to: caches, encoder keys/values, src_pad, S, Tmax, pe */
    const int64_t *ids, *slot, *sentence;   /* the segment's first row's */
    int64_t *origin;            /* the segment's first row's; rows every ld_origin */
    long ld_origin;
    long n, t, row;             /* rows, position, first row in the step buffers */
    int log_softmax, n_banned;  /* the step's tail (decoder_step) */
    const int64_t *banned;
    int64_t *argmax;            /* NULL, or the segment's first row's */
} step_segment;

/* One decoding step of the segments seg[0 .. n_seg), whose rows follow each other in d's step
 * buffers from seg[0].row on. d: the weights and the step buffers. */
void step_segments(const tf_decoder *d, const step_segment *seg, int n_seg);

/* The sentences first, first + stride, ... in slots b0 .. b1 - 1, before their first step. */
void greedy_begin(const tf_greedy *g, tf_loop *run, long b0, long b1, long first, long stride);
void beam_begin(const tf_beam *g, tf_loop *run, long b0, long b1, long first, long stride);

/* The block's rows at its next step, as a segment starting at step-buffer row `row`. */
step_segment greedy_segment(const tf_decoder *d, const tf_greedy *g, const tf_loop *run, long row);
step_segment beam_segment(const tf_decoder *d, const tf_beam *g, const tf_loop *run, long row);

/* After the step: logits holds the block's rows' ([rows, V]). Chooses the tokens, records what
 * finished, moves the live rows up, and advances run->t; run->n becomes 0 when the block is done. */
void greedy_after(const tf_decoder *d, const tf_greedy *g, tf_loop *run, float *logits);
void beam_after(const tf_decoder *d, const tf_beam *g, tf_loop *run, float *logits);

#endif
