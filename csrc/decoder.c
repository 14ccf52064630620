/* The decoder's step in C (see decoder.h). Each call below is the kernel that
 * transformer/decoding/cache.py's DecoderCache._step_python makes, with the same arguments. */
#include "decoder.h"
#include "decoder_loop.h"

#include <math.h>
#include <string.h>
#include <time.h>

#include "attention.h"
#include "beam.h"
#include "cpu.h"
#include "dropout.h"
#include "elementwise.h"
#include "embedding.h"
#include "gemm.h"
#include "layernorm.h"
#include "loss.h"
#include "qgemm.h"
#include "simd.h"
#include "simd_math.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* The rows [r0, r0 + n) of every per-row buffer. */
typedef struct {
    float *x, *h, *tmp, *ctx, *query, *qkv, *ff_pre, *ff_act, *logits, *mean, *rstd;
} rows_view;

static rows_view rows_at(const tf_decoder *d, long r0)
{
    rows_view v = {d->x + r0 * d->D, d->h + r0 * d->D, d->tmp + r0 * d->D, d->ctx + r0 * d->D,
                   d->query + r0 * d->D, d->qkv + r0 * 3 * d->D, d->ff_pre + r0 * d->d_ff,
                   d->ff_act + r0 * d->d_ff, d->logits + r0 * d->V, d->mean + r0, d->rstd + r0};
    return v;
}

/* out = x @ W^T, plus the bias when with_bias (decoding/cache.py: _linear; _mul without it). */
static void linear(const tf_linear *l, const float *x, long n, float *out, int with_bias)
{
    const float *bias = with_bias ? l->bias : NULL;
    if (l->int8) {
        qgemm_packed(l->isa, n, l->N, l->K, x, l->K, l->w, bias, out, l->N);
        return;
    }
    gemm_packed(l->isa, l->prec, n, l->N, l->K, 1.0f, x, l->K, (const float *)l->w, 0, out, l->N);
    if (bias) bias_add(out, bias, (size_t)n, (size_t)l->N);
}

static void norm(const tf_decoder *d, const rows_view *v, int which, const tf_decoder_layer *w,
                 const float *x, float *out, long n)
{
    if (!w->norm_b[which])      /* ScaleNorm: its one gain, no bias */
        scalenorm_forward(out, v->rstd, x, w->norm_w[which][0], n, d->D, d->eps);
    else
        layernorm_forward(out, v->mean, v->rstd, x, w->norm_w[which], w->norm_b[which], n, d->D, d->eps);
}

/* What a sublayer reads: x (post-LN) or norm(x) in h (pre-LN). */
static const float *sublayer_input(const tf_decoder *d, const rows_view *v, int which,
                                   const tf_decoder_layer *w, long n)
{
    if (!d->norm_first) return v->x;
    norm(d, v, which, w, v->x, v->h, n);
    return v->h;
}

/* x = norm(x + (delta + bias)) (post-LN) or x += delta + bias (pre-LN). */
static void residual(const tf_decoder *d, const rows_view *v, int which, const tf_decoder_layer *w,
                     const float *bias, long n)
{
    const int post = !d->norm_first;
    float *out = post ? v->tmp : v->x;
    if (bias)
        bias_dropout_add_forward(v->tmp, bias, v->x, out, (size_t)n, (size_t)d->D, 0.0f, 0, 0);
    else
        dropout_add_forward(v->tmp, v->x, out, (size_t)(n * d->D), 0.0f, 0, 0);
    if (post) norm(d, v, which, w, v->tmp, v->x, n);
}

/* The first index of the maximum of x[0..V), or of its first NaN (numpy's argmax): the
 * definition, one element at a time. */
static int64_t argmax_row_generic(const float *x, long V)
{
    long best = 0;
    for (long j = 0; j < V; j++) {
        if (x[j] != x[j]) return j;
        if (x[j] > x[best]) best = j;
    }
    return best;
}

#if TF_HAVE_X86
/* The same in two passes over the row: the maximum (returning at the first vector that holds a
 * NaN), then the first element equal to it. Equal is what the definition keeps too: it moves on
 * only to a greater element, so of equal ones (-0 and +0 among them) the first stays. A greedy
 * step's argmax over the vocabulary, one compare-and-branch per element in the definition, was
 * 13% of tiny decoding. */
TF_TARGET_AVX512 static int64_t argmax_row_avx512(const float *x, long V)
{
    const __m512 minus_inf = _mm512_set1_ps(-INFINITY);
    __m512 vmax = minus_inf;
    for (long j = 0; j < V; j += 16) {
        const __mmask16 live = tf_lanes16(V - j);
        const __m512 v = _mm512_mask_loadu_ps(minus_inf, live, x + j);
        const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        if (nan) return j + __builtin_ctz(nan);
        vmax = _mm512_max_ps(vmax, v);
    }
    const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
    for (long j = 0; j < V; j += 16) {
        const __mmask16 live = tf_lanes16(V - j);   /* nothing read past the row */
        const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_maskz_loadu_ps(live, x + j), top, _CMP_EQ_OQ) & live;
        if (hit) return j + __builtin_ctz(hit);
    }
    return 0;   /* V <= 0 */
}

TF_TARGET_AVX2 static int64_t argmax_row_avx2(const float *x, long V)
{
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    long j = 0;
    for (; j + 8 <= V; j += 8) {
        const __m256 v = _mm256_loadu_ps(x + j);
        const int nan = _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        if (nan) return j + __builtin_ctz((unsigned)nan);
        vmax = _mm256_max_ps(vmax, v);
    }
    float lanes[8], top = -INFINITY;
    _mm256_storeu_ps(lanes, vmax);
    for (int l = 0; l < 8; l++) top = lanes[l] > top ? lanes[l] : top;
    for (long k = j; k < V; k++) {
        if (x[k] != x[k]) return k;
        top = x[k] > top ? x[k] : top;
    }
    const __m256 vtop = _mm256_set1_ps(top);
    for (j = 0; j + 8 <= V; j += 8) {
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j), vtop, _CMP_EQ_OQ));
        if (hit) return j + __builtin_ctz((unsigned)hit);
    }
    for (; j < V; j++)
        if (x[j] == top) return j;
    return 0;   /* V <= 0 */
}
#endif

static int64_t argmax_row(const float *x, long V)
{
#if TF_HAVE_X86
    const int isa = tf_isa();
    if (isa >= TF_ISA_AVX512) return argmax_row_avx512(x, V);
    if (isa >= TF_ISA_AVX2) return argmax_row_avx2(x, V);
#endif
    return argmax_row_generic(x, V);
}

void argmax_rows(const float *x, long n, long V, int64_t *out, int reference)
{
    for (long r = 0; r < n; r++)
        out[r] = reference ? argmax_row_generic(x + r * V, V) : argmax_row(x + r * V, V);
}

void step_segments(const tf_decoder *d, const step_segment *seg, int n_seg)
{
    const long r0 = seg[0].row, D = d->D, H = d->H, dh = d->dh;
    long n = 0;
    for (int i = 0; i < n_seg; i++) n += seg[i].n;
    if (n <= 0) return;
    rows_view v = rows_at(d, r0);
    for (int i = 0; i < n_seg; i++) {
        const step_segment *s = seg + i;
        for (long r = 0; r < s->n; r++) s->origin[r * s->ld_origin + s->t] = s->slot[r];
        embedding_forward(s->ids, d->embed, s->d->pe + s->t * D, d->x + s->row * D, (size_t)s->n, 1,
                          (size_t)D, d->embed_scale);
    }
    for (long layer = 0; layer < d->n_layers; layer++) {
        const tf_decoder_layer *w = d->layers + layer;
        /* Masked self-attention over each segment's cache (only keys <= its t exist). */
        const float *src = sublayer_input(d, &v, 0, w, n);
        linear(&w->qkv, src, n, v.qkv, 1);
        for (int i = 0; i < n_seg; i++) {
            const step_segment *s = seg + i;
            const tf_decoder_layer *c = s->d->layers + layer;
            const float *qkv = d->qkv + s->row * 3 * D;
            const long Tmax = s->d->Tmax;
            attention_cache_store(qkv + D, 3 * D, c->self_k, s->slot, s->n, H, Tmax, dh, s->t, d->kv16);
            attention_cache_store(qkv + 2 * D, 3 * D, c->self_v, s->slot, s->n, H, Tmax, dh, s->t, d->kv16);
            attention_decode_rows_forward(qkv, 3 * D, c->self_k, c->self_v, NULL, s->origin, s->ld_origin, NULL,
                                          d->ctx + s->row * D, D, NULL, s->n, H, Tmax, s->t + 1, dh, d->scale, 0,
                                          d->kv16);
        }
        linear(&w->self_out, v.ctx, n, v.tmp, 0);
        residual(d, &v, 0, w, w->self_out.bias, n);

        /* Cross-attention over each segment's encoder output. */
        src = sublayer_input(d, &v, 1, w, n);
        linear(&w->cross_q, src, n, v.query, 1);
        for (int i = 0; i < n_seg; i++) {
            const step_segment *s = seg + i;
            const tf_decoder_layer *c = s->d->layers + layer;
            attention_decode_rows_forward(d->query + s->row * D, D, c->memory_k, c->memory_v, s->sentence, NULL, 0,
                                          s->d->src_pad, d->ctx + s->row * D, D, NULL, s->n, H, s->d->S, s->d->S,
                                          dh, d->scale, 0, d->kv16);
        }
        linear(&w->cross_out, v.ctx, n, v.tmp, 0);
        residual(d, &v, 1, w, w->cross_out.bias, n);

        /* Position-wise feed-forward (section 3.3). */
        src = sublayer_input(d, &v, 2, w, n);
        linear(&w->linear1, src, n, v.ff_pre, 0);
        bias_act_forward(v.ff_pre, w->linear1.bias, v.ff_act, (size_t)n, (size_t)d->d_ff, d->activation);
        linear(&w->linear2, v.ff_act, n, v.tmp, 0);
        residual(d, &v, 2, w, w->linear2.bias, n);
    }
    const float *top = v.x;
    if (d->final_w) {
        if (!d->final_b)
            scalenorm_forward(v.h, v.rstd, v.x, d->final_w[0], n, D, d->eps);
        else
            layernorm_forward(v.h, v.mean, v.rstd, v.x, d->final_w, d->final_b, n, D, d->eps);
        top = v.h;
    }
    linear(&d->generator, top, n, v.logits, 1);
    for (int i = 0; i < n_seg; i++) {
        const step_segment *s = seg + i;
        float *logits = d->logits + s->row * d->V;
        if (s->log_softmax) log_softmax_forward(logits, logits, s->n, d->V);
        /* One block (groups == 1) with a big vocabulary: the bans and argmax over rows in parallel. */
#pragma omp parallel for num_threads(tf_team(s->n * d->V, 1L << 18)) schedule(static)
        for (long r = 0; r < s->n; r++) {
            float *row = logits + r * d->V;
            for (int b = 0; b < s->n_banned; b++) row[s->banned[b]] = -INFINITY;
            if (s->argmax) s->argmax[r] = argmax_row(row, d->V);
        }
    }
}

/* Rows [r0, r1) of a decoder_step call, as one segment. */
static void step_block(const tf_decoder *d, const int64_t *ids, long r0, long r1, long t, const int64_t *slot,
                       int64_t *origin, long ld_origin, const int64_t *sentence, int log_softmax,
                       const int64_t *banned, int n_banned, int64_t *argmax)
{
    const step_segment s = {d, ids + r0, slot + r0, sentence + r0, origin + r0 * ld_origin, ld_origin,
                            r1 - r0, t, r0, log_softmax, n_banned, banned, argmax ? argmax + r0 : NULL};
    if (s.n > 0) step_segments(d, &s, 1);
}

void decoder_step(const tf_decoder *d, const int64_t *ids, long n, long t, const int64_t *slot,
                  int64_t *origin, long ld_origin, const int64_t *sentence, int log_softmax,
                  const int64_t *banned, int n_banned, int64_t *argmax, int groups)
{
    if (groups > n) groups = (int)n;
    if (groups <= 1) {
        step_block(d, ids, 0, n, t, slot, origin, ld_origin, sentence, log_softmax, banned, n_banned, argmax);
        return;
    }
#pragma omp parallel for num_threads(groups) schedule(static, 1)
    for (int g = 0; g < groups; g++)
        step_block(d, ids, n * g / groups, n * (g + 1) / groups, t, slot, origin, ld_origin, sentence,
                   log_softmax, banned, n_banned, argmax);
}

/* decoding/greedy.py's _forbid_eos for one row: EOS at -inf unless nothing else is left above -inf. */
static void forbid_eos(float *row, long V, int64_t eos)
{
    const float saved = row[eos];
    row[eos] = -INFINITY;
    for (long j = 0; j < V; j++)
        if (row[j] > -INFINITY) return;
    row[eos] = saved;
}

static long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long)t.tv_sec * 1000L + t.tv_nsec / 1000000L;
}

static int caller_thread(void)
{
#ifdef _OPENMP
    return omp_get_thread_num() == 0;   /* the team's master, or no team at all */
#else
    return 1;
#endif
}

/* Between two steps of a block: whether to stop (tf_poll). *next: when the caller's thread
 * asks next, in now_ms's milliseconds. */
static int stop_asked(tf_poll *p, long *next)
{
    if (!p || !p->fn) return 0;
    if (caller_thread()) {
        const long now = now_ms();
        if (now >= *next) {
            *next = now + TF_POLL_MS;
            if (p->fn(p->ctx)) __atomic_store_n(&p->stopped, 1, __ATOMIC_RELAXED);
        }
    }
    return __atomic_load_n(&p->stopped, __ATOMIC_RELAXED);
}

/* The calling thread, its own blocks done, while others still run (`running` of them): it goes
 * on asking for signals, every TF_POLL_MS, so that a stop still reaches the other blocks at their
 * next step (a block of short sentences done first would otherwise leave a Ctrl-C unseen until
 * the longest block ended). Sleeps between looks: its core is free for the others. */
static void poll_while_running(tf_poll *p, const int *running)
{
    long next = now_ms() + TF_POLL_MS;
    const struct timespec nap = {0, 200000};   /* 0.2 ms: the most the call's end waits for it */
    while (__atomic_load_n(running, __ATOMIC_ACQUIRE) > 0) {
        if (!__atomic_load_n(&p->stopped, __ATOMIC_RELAXED)) stop_asked(p, &next);
        nanosleep(&nap, NULL);
    }
}

void greedy_begin(const tf_greedy *g, tf_loop *run, long b0, long b1, long first, long stride)
{
    memset(run, 0, sizeof *run);
    run->b0 = b0;
    run->n = b1 - b0;
    for (long b = b0; b < b1; b++) {
        const long s = first + (b - b0) * stride;
        g->ids[b] = g->bos;
        g->slot[b] = b;
        g->sentence[b] = s;
        if (g->limits[s] > run->steps) run->steps = g->limits[s];
    }
}

step_segment greedy_segment(const tf_decoder *d, const tf_greedy *g, const tf_loop *run, long row)
{
    const long b0 = run->b0, t = run->t;
    /* pad, bos, the settings' bans, then EOS (last: banned before min_len) */
    const int n_ban = 2 + g->n_banned + (t < g->min_len && !g->ngram);
    const step_segment s = {d, g->ids + b0, g->slot + b0, g->sentence + b0, g->origin + b0 * d->Tmax, d->Tmax,
                            run->n, t, row, 0, n_ban, g->banned, g->ngram ? NULL : g->argmax + b0};
    return s;
}

void greedy_after(const tf_decoder *d, const tf_greedy *g, tf_loop *run, float *logits)
{
    const long Tmax = d->Tmax, V = d->V, b0 = run->b0, t = run->t, n = run->n;
    if (g->ngram) {
        no_repeat_ngram_ban(logits, n, V, g->out, g->ld_out, g->sentence + b0, t, g->ngram, g->eos);
        for (long r = 0; r < n; r++) {
            if (t < g->min_len) forbid_eos(logits + r * V, V, g->eos);
            g->argmax[b0 + r] = argmax_row(logits + r * V, V);
        }
    }
    /* Record each row's token; the rows that go on move up, keeping their order. */
    long kept = 0;
    run->finished = 0;
    for (long r = 0; r < n; r++) {
        const long i = b0 + r;
        const int64_t s = g->sentence[i];
        /* the forced EOS at the last step: generate's row of -inf but EOS, whose argmax it is */
        const int64_t token = g->forced_eos && g->limits[s] == t + 1 ? g->eos : g->argmax[i];
        g->out[s * g->ld_out + t] = token;
        const int ended = token == g->eos;
        if (ended) g->lengths[s] = t;
        if (ended || g->limits[s] == t + 1 || (g->cancelled && g->cancelled[s])) {
            if (g->finished) g->finished[s] = 1;
            run->finished++;
            continue;
        }
        const long k = b0 + kept++;
        if (k != i) {
            g->slot[k] = g->slot[i];
            g->sentence[k] = s;
            memcpy(g->origin + k * Tmax, g->origin + i * Tmax, (size_t)(t + 1) * sizeof(int64_t));
        }
        g->ids[k] = token;
    }
    run->n = kept;
    run->t = t + 1;
    if (run->t >= run->steps) run->n = 0;
}

/* Greedy decoding of the sentences first, first + stride, ... in rows b0 .. b1 - 1 of every
 * buffer, to their last step. */
static void greedy_block(const tf_decoder *d, const tf_greedy *g, long b0, long b1, long first, long stride)
{
    tf_loop run;
    greedy_begin(g, &run, b0, b1, first, stride);
    long next_poll = now_ms() + TF_POLL_MS;
    while (run.n > 0) {
        if (stop_asked(g->poll, &next_poll)) return;
        const step_segment s = greedy_segment(d, g, &run, b0);
        step_segments(d, &s, 1);
        greedy_after(d, g, &run, d->logits + b0 * d->V);
    }
}

/* A decoding loop's sentences in `groups` blocks, each from its first step to its last on one
 * thread (decoder.h). Block k takes the sentences k, k + groups, ...: translate_texts sorts a
 * batch by length, so each block gets its share of short and long sentences, rather than the
 * first block the shortest. Its rows follow the blocks before it: block j has
 * (B - j + groups - 1) / groups. The calling thread, its blocks done, goes on polling while
 * others run (poll_while_running). */
typedef void (*block_fn)(const tf_decoder *d, const void *loop, long b0, long b1, long first, long stride);

static void run_blocks(const tf_decoder *d, const void *loop, block_fn block, tf_poll *poll, int groups)
{
    const long B = d->B;
    if (groups > B) groups = (int)B;
    if (groups <= 1) {
        block(d, loop, 0, B, 0, 1);
        return;
    }
    int running = groups;
#pragma omp parallel num_threads(groups)
    {
#pragma omp for schedule(static, 1) nowait
        for (int k = 0; k < groups; k++) {
            const long base = B / groups, extra = B % groups;
            const long b0 = k * base + (k < extra ? k : extra);
            block(d, loop, b0, b0 + base + (k < extra), k, groups);
            __atomic_fetch_sub(&running, 1, __ATOMIC_RELEASE);
        }
        if (poll && poll->fn && caller_thread()) poll_while_running(poll, &running);
    }
}

static void greedy_block_of(const tf_decoder *d, const void *loop, long b0, long b1, long first, long stride)
{
    greedy_block(d, (const tf_greedy *)loop, b0, b1, first, stride);
}

void decoder_greedy(const tf_decoder *d, const tf_greedy *g, int groups)
{
    for (long b = 0; b < d->B; b++) g->lengths[b] = g->limits[b];   /* B = N: one row a sentence */
    run_blocks(d, g, greedy_block_of, g->poll, groups);
}

/* A finished hypothesis's score is divided by this at its length (EOS counted). */
static double length_norm(const tf_beam *g, double length)
{
    return g->length_form ? pow(length, g->length_penalty) : pow((5.0 + length) / 6.0, g->length_penalty);
}

/* A sentence's K best finished scores, best first (kept[0 .. *count)): `score` takes its place
 * when fewer than K are kept or it beats the worst (generate keeps its K best the same way). */
static void keep_finished(double *kept, int64_t *count, long K, double score)
{
    long i;
    if (*count < K) i = (long)(*count)++;
    else if (score > kept[K - 1]) i = K - 1;
    else return;
    while (i > 0 && kept[i - 1] < score) {
        kept[i] = kept[i - 1];
        i--;
    }
    kept[i] = score;
}

void beam_begin(const tf_beam *g, tf_loop *run, long b0, long b1, long first, long stride)
{
    const long K = g->K, R0 = b0 * K;
    memset(run, 0, sizeof *run);
    run->b0 = b0;
    run->n = b1 - b0;
    run->origin = g->origin;                    /* whole arrays: rows R0 .. are the block's */
    run->origin_spare = g->origin_spare;
    run->hyps = g->hyps + R0 * g->ld_best;      /* the block's */
    run->hyps_spare = g->hyps_spare + R0 * g->ld_best;
    for (long j = 0; j < run->n; j++) {
        const long s = first + j * stride;
        g->live[b0 + j] = s;                    /* live slot -> sentence */
        g->n_finished[b0 + j] = 0;
        g->n_kept[s] = 0;
        g->best_len[s] = -1;
        if (g->limits[s] > run->steps) run->steps = g->limits[s];
        for (long i = 0; i < K; i++) {
            const long r = R0 + j * K + i;
            g->scores[r] = i ? -INFINITY : 0.0; /* one live beam at first: the others are copies */
            g->ids[r] = g->bos;
            g->slot[r] = r;
            g->sentence[r] = s;
        }
    }
}

step_segment beam_segment(const tf_decoder *d, const tf_beam *g, const tf_loop *run, long row)
{
    const long R0 = run->b0 * g->K;
    /* pad, bos and the settings' bans (decoder.h), after the log_softmax */
    const step_segment s = {d, g->ids + R0, g->slot + R0, g->sentence + R0, run->origin + R0 * d->Tmax, d->Tmax,
                            run->n * g->K, run->t, row, 1, 2 + g->n_banned, g->banned, NULL};
    return s;
}

/* Beam search's work between two steps for the sentences in slots b0 .. (rows b0 * K .. of
 * every buffer). Arrays per slot or row are offset to the block's first; parents and fin_rows
 * from beam_select count rows from it too. */
void beam_after(const tf_decoder *d, const tf_beam *g, tf_loop *run, float *logp)
{
    const long K = g->K, V = d->V, Tmax = d->Tmax, ld = g->ld_best, b0 = run->b0, R0 = b0 * K;
    const long t = run->t, nb = run->n, n = nb * K;
    int64_t *origin = run->origin, *origin_spare = run->origin_spare, *hyps = run->hyps,
        *hyps_spare = run->hyps_spare;
    double *scores = g->scores + R0, *new_scores = g->new_scores + R0, *fin_scores = g->fin_scores + 2 * R0;
    int64_t *ids = g->ids + R0, *slot = g->slot + R0, *sentence = g->sentence + R0;
    int64_t *parents = g->parents + R0, *tokens = g->tokens + R0, *fin_rows = g->fin_rows + 2 * R0,
        *fin_tokens = g->fin_tokens + 2 * R0, *n_finished = g->n_finished + b0,
        *fin_count = g->fin_count + b0, *live = g->live + b0;
    uint8_t *done = g->done + b0, *last_step = g->last_step + b0;
    run->finished = 0;
    int64_t banned = t < g->min_len ? g->eos : -1;
    if (g->ngram) {
        no_repeat_ngram_ban(logp, n, V, hyps, ld, NULL, t, g->ngram, g->eos);
        if (banned >= 0) {                     /* EOS stays where nothing else is left */
            for (long r = 0; r < n; r++) forbid_eos(logp + r * V, V, g->eos);
            banned = -1;
        }
    }
    for (long j = 0; j < nb; j++) last_step[j] = g->limits[live[j]] == t + 1;
    if (g->renormalize && banned >= 0) {       /* generate bans EOS before it renormalises */
        for (long r = 0; r < n; r++) forbid_eos(logp + r * V, V, g->eos);
        banned = -1;
    }
    if (g->forced_eos)
        for (long j = 0; j < nb; j++) {
            if (!last_step[j]) continue;
            for (long r = j * K; r < (j + 1) * K; r++) {
                float *row = logp + r * V;
                for (long v = 0; v < V; v++) row[v] = -INFINITY;
                row[g->eos] = 0.0f;
            }
        }
    if (g->renormalize) log_softmax_forward(logp, logp, n, V);
    beam_select(logp, scores, n_finished, nb, K, V, banned, g->eos, last_step, parents, tokens,
                new_scores, done, fin_rows, fin_tokens, fin_scores, fin_count, g->early_stopping == 1);
    const double penalty = length_norm(g, (double)(t + 1));
    long all_done = 1;
    for (long j = 0; j < nb; j++) {
        const long s = live[j];
        for (long f = 0; f < fin_count[j]; f++) {
            const double score = fin_scores[j * 2 * K + f] / penalty;
            if (g->early_stopping != 1) keep_finished(g->kept + s * K, g->n_kept + s, K, score);
            if (g->best_len[s] >= 0 && !(score > g->best_score[s])) continue;
            const int64_t row = fin_rows[j * 2 * K + f], token = fin_tokens[j * 2 * K + f];
            int64_t *out = g->best + s * ld;
            memcpy(out, hyps + row * ld, (size_t)t * sizeof(int64_t));
            g->best_len[s] = t;
            if (token != g->eos) out[g->best_len[s]++] = token;
            g->best_score[s] = score;
        }
        /* generate's early-stopping heuristic: done once K are finished and the best live
         * beam, normalised at its current length (or, "never" with a positive penalty, at
         * the sentence's limit), cannot beat the worst of them */
        if (g->early_stopping != 1 && !done[j] && g->n_kept[s] >= K) {
            const double length = g->early_stopping == 2 && g->length_penalty > 0
                ? (double)g->limits[s] : (double)(t + 1);
            if (!(new_scores[j * K] / length_norm(g, length) > g->kept[s * K + K - 1])) done[j] = 1;
        }
        if (g->cancelled && g->cancelled[s]) done[j] = 1;
        if (done[j]) {
            if (g->finished) g->finished[s] = 1;
            run->finished++;
        }
        all_done &= done[j] != 0;
    }
    run->t = t + 1;
    if (all_done || run->t >= run->steps) {
        run->n = 0;
        return;
    }
    /* The live sentences' new beams move up: row q = m * K + i of the next step continues
     * row parents[j * K + i] of this one and takes over the cache row of row j * K + i. */
    long m = 0;
    for (long j = 0; j < nb; j++) {
        if (done[j]) continue;
        for (long i = 0; i < K; i++) {
            const long q = m * K + i, k = j * K + i, p = parents[k];
            memcpy(origin_spare + (R0 + q) * Tmax, origin + (R0 + p) * Tmax, (size_t)(t + 1) * sizeof(int64_t));
            memcpy(hyps_spare + q * ld, hyps + p * ld, (size_t)t * sizeof(int64_t));
            hyps_spare[q * ld + t] = tokens[k];
            ids[q] = tokens[k];
            slot[q] = slot[k];
            sentence[q] = sentence[k];
            scores[q] = new_scores[k];
        }
        n_finished[m] = n_finished[j];
        live[m] = live[j];
        m++;
    }
    run->origin = origin_spare;
    run->origin_spare = origin;
    run->hyps = hyps_spare;
    run->hyps_spare = hyps;
    run->n = m;
}

/* Beam search of the sentences first, first + stride, ... in slots b0 .. b1 - 1, to their last
 * step. */
static void beam_block(const tf_decoder *d, const tf_beam *g, long b0, long b1, long first, long stride)
{
    tf_loop run;
    beam_begin(g, &run, b0, b1, first, stride);
    long next_poll = now_ms() + TF_POLL_MS;
    while (run.n > 0) {
        if (stop_asked(g->poll, &next_poll)) return;
        const step_segment s = beam_segment(d, g, &run, b0 * g->K);
        step_segments(d, &s, 1);
        beam_after(d, g, &run, d->logits + b0 * g->K * d->V);
    }
}

static void beam_block_of(const tf_decoder *d, const void *loop, long b0, long b1, long first, long stride)
{
    beam_block(d, (const tf_beam *)loop, b0, b1, first, stride);
}

void decoder_beam(const tf_decoder *d, const tf_beam *g, int groups)
{
    run_blocks(d, g, beam_block_of, g->poll, groups);
}
