/* Beam search's candidate selection (one step for every live sentence at once).
 *
 * Each sentence slot has K beams (rows slot*K .. slot*K+K-1) with running
 * log-probabilities; every beam extended by every token is a candidate scored
 * score[beam] + logp[row, token] (added in double, as numpy adds a float64 score to a
 * float32 log-probability). The kernel keeps the best min(2K, K*V) finite candidates
 * of each slot, best first (ties: the lower beam*V + token first), then walks them in
 * that order the way beam search does: a candidate ending in EOS among the K best of
 * them (or any candidate at its sentence's last step) finishes a hypothesis, an EOS
 * candidate ranked below the K best is dropped (Hugging Face's and fairseq's rule: only
 * the top K can be final), the others fill the K beams of the next step, until K beams
 * are filled or the slot has K finished hypotheses. Parallel over slots;
 * every slot's result depends only on its own rows, so the bits are the same at any
 * thread count, and the SIMD levels compare the same doubles, so they agree too.
 */
#ifndef TF_BEAM_H
#define TF_BEAM_H

#include <stdint.h>

/* logp:        (n*K, V) float32 log-probabilities, row slot*K + beam
 * scores:      (n, K) double running scores; -inf (or NaN) marks a dead beam, skipped
 * n_finished:  (n) int64 finished hypotheses of each slot so far; incremented here
 * banned:      a token never chosen (EOS before min_len), or -1
 * eos:         the end-of-sentence token
 * last_step:   (n) uint8, 1 where it is the slot's final step (its sentence's length limit):
 *              every candidate of that slot finishes a hypothesis
 * parents:     (n*K) out: row (slot*K + beam) each new beam extends; slot*K when unfilled
 * tokens:      (n*K) out: each new beam's token; eos when unfilled
 * new_scores:  (n, K) out: each new beam's score; -inf when unfilled
 * done:        (n) out: 1 when the slot has K finished hypotheses, at its last step, or
 *              when no beam could be filled
 * fin_rows, fin_tokens: (n, 2K) out: the hypotheses finished at this step, in order
 * fin_scores:  (n, 2K) out: their (unnormalised) scores
 * fin_count:   (n) out: how many of each slot's fin_* entries are set
 * early_stopping: 1: a slot is done once it has K finished hypotheses, and the walk stops there
 *              (the rule of beam search here, and generate's early_stopping=True); 0: finished
 *              hypotheses are counted but end nothing, every EOS among the K best finishes one,
 *              and the caller decides when a slot is done (generate's early_stopping False and
 *              "never", decoder.h). Either way, at a slot's last step only its K best candidates
 *              finish hypotheses (as in generate: only the top K can be final). */
void beam_select(const float *logp, const double *scores, int64_t *n_finished,
                 long n, long K, long V, int64_t banned, int64_t eos, const uint8_t *last_step,
                 int64_t *parents, int64_t *tokens, double *new_scores, uint8_t *done,
                 int64_t *fin_rows, int64_t *fin_tokens, double *fin_scores, int64_t *fin_count,
                 int early_stopping);

/* The top-`width` part of beam_select on its own (for tests): each slot's best `width`
 * candidates with a score above -inf, best first, ties by lower index.
 * top_index: (n, width) beam*V + token, -1 past the last found; top_score: (n, width),
 * -inf past the last found. */
void beam_topk(const float *logp, const double *scores, long n, long K, long V,
               int64_t banned, long width, int64_t *top_index, double *top_score);

/* The naive reference of beam_topk: `width` passes of a plain scalar scan per slot, each
 * taking the best candidate not yet taken; one thread. Same arguments. */
void beam_topk_reference(const float *logp, const double *scores, long n, long K, long V,
                         int64_t banned, long width, int64_t *top_index, double *top_score);

/* The no-repeat-n-gram guard (fairseq's and Hugging Face's no_repeat_ngram_size): for each
 * row, every token that would complete an n-gram of length `ngram` already present in the row's
 * hypothesis gets logit -inf. For each j with hyp[j .. j+N-1) equal to the last N-1 tokens,
 * hyp[j+N-1] is banned; N = 1 bans every token already generated. One thread, deterministic.
 * logits:  (n, V) float32 scores of each row's next token, written in place
 * history: (R, stride) int64 generated tokens, each in [0, V); row r's hypothesis is
 *          history[rows[r], 0 .. length)
 * rows:    (n) int64 history row of each logits row, each in [0, R); NULL: row r itself (n <= R)
 * length:  tokens generated so far, the same for every row (the step), <= stride
 * ngram:   N >= 1
 * keep:    a token never banned (EOS, so a hypothesis can always end), or -1 */
void no_repeat_ngram_ban(float *logits, long n, long V, const int64_t *history, long stride,
                         const int64_t *rows, long length, long ngram, int64_t keep);

#endif
