/* One decoding step of the whole decoder in C: the token embedding, every layer (masked
 * self-attention over the key/value cache, cross-attention over the encoder output, the
 * feed-forward network, residuals and layer norms), the final norm and the output projection,
 * for n rows at once ("Attention Is All You Need" section 3, one query row per hypothesis).
 *
 * It calls the same kernels, in the same order, as transformer/decoding/cache.py's step in Python, so
 * its logits have exactly those bits. Two things it adds:
 *
 * - no interpreter between the kernels (a tiny model's step is a few hundred microseconds, and
 *   some thirty Python calls per layer were a sixth of it);
 * - rows split across threads: with groups > 1 each thread runs the whole step for its own
 *   block of rows, every kernel inside on one thread (cpu.h: tf_team gives 1 inside a parallel
 *   region). When a step's matrices are small, each kernel on its own is too short to split
 *   (the team costs more than it saves), so several threads were no faster than one; split by
 *   rows, the threads meet once per step instead of once per kernel. Every kernel here computes
 *   each row on its own, so the bits do not depend on the grouping.
 */
#ifndef TF_DECODER_H
#define TF_DECODER_H

#include <stdint.h>

/* x @ W^T (+ bias) with W prepared once per call: packed floats for gemm_packed (fp32 or bf16,
 * prec GEMM_FP32 | GEMM_BF16, packed for instruction set `isa`), or int8 bytes from qgemm_pack. */
typedef struct {
    const void *w;
    int int8;           /* 1: qgemm_packed on w */
    int prec;           /* gemm_packed's precision when !int8 */
    int isa;            /* the level w was packed for */
    long N, K;
    const float *bias;  /* [N] or NULL */
} tf_linear;

typedef struct {
    const float *norm_w[3], *norm_b[3];   /* norm1 (self-attention), norm2 (cross), norm3 (FF);
                                             ScaleNorm: norm_w its gain [1], norm_b NULL */
    tf_linear qkv, self_out, cross_q, cross_out, linear1, linear2;
    const void *memory_k, *memory_v;      /* [B, H, S, dh] cross-attention keys and values */
    void *self_k, *self_v;                /* [N, H, Tmax, dh] self-attention caches */
} tf_decoder_layer;

typedef struct {
    long D, H, dh, d_ff, V, S, Tmax, B, N, n_layers;
    int norm_first;       /* 1: pre-LN; 0: post-LN (the paper's) */
    int kv16;             /* 1: the caches above hold bf16 (attention.h), else float32 */
    int activation;       /* TF_ACT_* (elementwise.h) */
    float embed_scale, scale, eps;
    const float *embed;   /* [V, D] target embedding table (dequantized for int8) */
    const float *pe;      /* [Tmax, D] positional encodings */
    const uint8_t *src_pad;        /* [B, S], 1 = padding */
    const float *final_w, *final_b;   /* the final norm, or NULL (ScaleNorm: final_w [1], final_b NULL) */
    tf_linear generator;
    const tf_decoder_layer *layers;
    /* step buffers, N rows each */
    float *x, *h, *tmp, *ctx, *query, *qkv, *ff_pre, *ff_act, *logits, *mean, *rstd;
} tf_decoder;

/* Feed ids[0..n) at position t. Row r writes cache row slot[r] (distinct), reads its history
 * through origin[r * ld_origin + j] (origin[r, t] is set to slot[r] here) and its sentence's
 * encoder output through sentence[r]. Writes logits[0..n) (d->logits, [n, V]), replaced by their
 * log_softmax (loss.h) when log_softmax is set (beam search); then the tokens banned[0..n_banned)
 * get -inf in every row, and when argmax is not NULL, argmax[r] is the first index of row r's
 * maximum (numpy's argmax: the first NaN if there is one). groups: threads that each take a
 * block of rows (1: one block, every kernel with the process's team). The caller checks every
 * index (pyx/decoder.pxi). */
void decoder_step(const tf_decoder *d, const int64_t *ids, long n, long t, const int64_t *slot,
                  int64_t *origin, long ld_origin, const int64_t *sentence, int log_softmax,
                  const int64_t *banned, int n_banned, int64_t *argmax, int groups);

/* out[r]: the argmax of row r of x [n, V] as decoder_step takes it (numpy's: the first index of
 * the maximum, or of the first NaN), at the SIMD level in use, or by the one-element-at-a-time
 * definition when `reference` (tests compare the two). */
void argmax_rows(const float *x, long n, long V, int64_t *out, int reference);

/* How a decoding loop in C is told to stop early (the interpreter's signals: Ctrl-C, which the
 * step-by-step loop in Python saw between any two steps). The thread that called the loop calls
 * fn(ctx) between two of its steps, and once its own blocks are done, while other blocks still
 * run, at most every TF_POLL_MS; when it returns nonzero, `stopped` is set and every block stops
 * before its next step (the outputs are then incomplete). */
#define TF_POLL_MS 20
typedef struct {
    int (*fn)(void *ctx);
    void *ctx;
    int stopped;
} tf_poll;

/* Greedy decoding's whole loop (transformer/decoding/greedy.py, _greedy_decode without return_attention):
 * one row per sentence, B = N rows. Sentence b starts from `bos` and takes at each step t the
 * argmax of its logits, with pad and bos banned, EOS banned while t < min_len (with ngram > 0:
 * after the no-repeat-n-gram bans, and only where another token is left, as decoding/greedy.py's
 * _forbid_eos), and ngram > 0 banning what would repeat an n-gram of its own tokens
 * (no_repeat_ngram_ban, EOS kept). out[b, t] receives the token; the sentence stops at EOS
 * (lengths[b] = t) or after limits[b] tokens (lengths[b] = limits[b]); a stopped sentence's row
 * leaves the steps.
 *
 * groups: blocks of sentences (block k: sentences k, k + groups, ...), each decoded from the
 * first step to its last by one thread with every kernel on that thread, without meeting the
 * others: the threads meet once per call, not once per step, and no interpreter runs between
 * steps. 1: one block, every kernel with the process's team. Rows are computed apart, so the
 * tokens do not depend on the grouping. ids, slot, sentence and argmax ([N]) and origin
 * ([N, Tmax]) are scratch; limits[b] in [1, Tmax], ld_out >= max(limits). The caller checks.
 * poll: see tf_poll.
 *
 * The rules a model's generation settings add (transformer/generation.py; all off for the models
 * trained here): banned holds pad, bos, the settings' n_banned bans (generate's bad_words_ids of
 * one token), then eos (n_banned + 3 ids; the caller lays them out); forced_eos: at a sentence's last step its token is EOS (generate's
 * forced_eos_token_id at max_length - 1). */
typedef struct {
    const int64_t *limits;
    long min_len, ngram;
    int64_t bos, eos, pad;
    int forced_eos, n_banned;
    const int64_t *banned;
    int64_t *out, *lengths;
    long ld_out;
    int64_t *ids, *slot, *sentence, *argmax, *origin;
    tf_poll *poll;      /* NULL: never stopped early */
    /* A stream's (stream.h; NULL in decoder_greedy): finished[b] set to 1 when sentence b stops;
     * a sentence whose cancelled[b] is nonzero leaves at the next step, unfinished. */
    uint8_t *finished;
    const uint8_t *cancelled;
} tf_greedy;

void decoder_greedy(const tf_decoder *d, const tf_greedy *g, int groups);

/* Beam search's whole loop (transformer/decoding/beam.py, _beam_search, the same steps and bits): K
 * rows a sentence, N = B * K. Each step takes the log_softmax of the live rows' logits (pad and
 * bos banned after it), with ngram > 0 the no-repeat-n-gram bans of each row's own tokens (and
 * EOS banned before min_len only where another token is left), else EOS banned before min_len,
 * and beam_select (beam.h) over the live sentences, whose last step is at their limit. Each
 * hypothesis finished at step t is scored score / ((5 + t + 1) / 6) ** length_penalty; a
 * sentence keeps the first of its best-scored (Python's max over the finished in order).
 * best[b, 0 .. best_len[b]) receives its tokens (EOS dropped), best_len[b] = -1 when none
 * finished. A sentence whose beam_select says done leaves the steps.
 *
 * groups: blocks of sentences, as decoder_greedy's. scores, new_scores ([B * K]), fin_scores
 * ([B * 2K]), best_score ([B]), ids, slot, sentence, parents, tokens ([N]), fin_rows, fin_tokens
 * ([B * 2K]), n_finished, fin_count, live ([B]), done, last_step ([B]), origin, origin_spare
 * ([N, Tmax]), hyps, hyps_spare ([N, ld_best]) are scratch; limits[b] in [1, Tmax], ld_best >=
 * max(limits). The caller checks.
 *
 * The rules a model's generation settings add (generate's beam search; all off, 0 and 1 below,
 * for the models trained here, whose results stay as described above):
 * - banned: laid out as decoder_greedy's; its n_banned + 2 first (pad, bos, the settings' bans)
 *   are banned after the log_softmax;
 * - forced_eos: at a sentence's last step each beam's row is -inf but EOS, 0 (generate's
 *   ForcedEOSTokenLogitsProcessor after the log_softmax, so the hypothesis keeps its score);
 * - renormalize: after every ban (and EOS banned before min_len, the forced EOS) each row is
 *   normalised again (log_softmax of the row: generate's renormalize_logits), which moves the
 *   scores of the hypotheses and so the search;
 * - length_form: 0 GNMT's ((5 + len) / 6) ** length_penalty, 1 generate's len ** length_penalty;
 * - early_stopping: 1 a sentence is done at K finished hypotheses (as above); 0 generate's
 *   early_stopping=False: it keeps its K best finished (normalised scores in kept[b * K ..],
 *   n_kept[b]), and is done once it has K of them and its best live beam, normalised at its
 *   current length, does not beat the worst (or at its limit); 2 generate's "never": the same,
 *   normalised at the sentence's limit when length_penalty > 0. */
typedef struct {
    const int64_t *limits;
    long K, min_len, ngram;
    double length_penalty;
    int64_t bos, eos, pad;
    int forced_eos, renormalize, length_form, early_stopping, n_banned;
    const int64_t *banned;
    double *kept;
    int64_t *n_kept;
    int64_t *best, *best_len;
    long ld_best;
    double *scores, *new_scores, *fin_scores, *best_score;
    int64_t *ids, *slot, *sentence, *parents, *tokens, *fin_rows, *fin_tokens, *n_finished, *fin_count,
        *live, *origin, *origin_spare, *hyps, *hyps_spare;
    uint8_t *done, *last_step;
    tf_poll *poll;      /* NULL: never stopped early */
    uint8_t *finished;          /* as tf_greedy's */
    const uint8_t *cancelled;
} tf_beam;

void decoder_beam(const tf_decoder *d, const tf_beam *g, int groups);

/* Where a block of a loop's sentences stands between two of its steps: decoder_greedy and
 * decoder_beam keep one per block on its thread, a stream (stream.h) one per wave. */
typedef struct {
    long b0;            /* the block's first sentence slot (rows b0 .. for greedy, b0 * K .. for beam) */
    long n;             /* live sentences (greedy: live rows) */
    long t, steps;      /* the next step, and the block's last step + 1 */
    long finished;      /* sentences that stopped at the last step */
    int64_t *origin, *origin_spare, *hyps, *hyps_spare;   /* beam: swapped step by step */
} tf_loop;

#endif
