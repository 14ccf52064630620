/* The decoder's step in C (see decoder.h). Each call below is the kernel that
 * transformer/decoding.py's DecoderCache._step_python makes, with the same arguments. */
#include "decoder.h"

#include <math.h>

#include "attention.h"
#include "cpu.h"
#include "dropout.h"
#include "elementwise.h"
#include "embedding.h"
#include "gemm.h"
#include "layernorm.h"
#include "loss.h"
#include "qgemm.h"
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

/* out = x @ W^T, plus the bias when with_bias (decoding.py: _linear; _mul without it). */
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

/* The first index of the maximum of x[0..V), or of its first NaN (numpy's argmax). */
static int64_t argmax_row(const float *x, long V)
{
    long best = 0;
    for (long j = 0; j < V; j++) {
        if (x[j] != x[j]) return j;
        if (x[j] > x[best]) best = j;
    }
    return best;
}

typedef struct {
    int log_softmax, n_banned;
    const int64_t *banned;
    int64_t *argmax;
} step_tail;

static void step_rows(const tf_decoder *d, const int64_t *ids, long n, long t, const int64_t *slot,
                      int64_t *origin, long ld_origin, const int64_t *sentence, const step_tail *tail,
                      long r0)
{
    if (n <= 0) return;
    const long D = d->D;
    rows_view v = rows_at(d, r0);
    ids += r0;
    slot += r0;
    origin += r0 * ld_origin;
    sentence += r0;
    for (long r = 0; r < n; r++) origin[r * ld_origin + t] = slot[r];
    embedding_forward(ids, d->embed, d->pe + t * D, v.x, (size_t)n, 1, (size_t)D, d->embed_scale);
    for (long layer = 0; layer < d->n_layers; layer++) {
        const tf_decoder_layer *w = d->layers + layer;
        /* Masked self-attention over the cache (only keys <= t exist). */
        const float *src = sublayer_input(d, &v, 0, w, n);
        linear(&w->qkv, src, n, v.qkv, 1);
        attention_cache_store(v.qkv + D, 3 * D, w->self_k, slot, n, d->H, d->Tmax, d->dh, t);
        attention_cache_store(v.qkv + 2 * D, 3 * D, w->self_v, slot, n, d->H, d->Tmax, d->dh, t);
        attention_decode_rows_forward(v.qkv, 3 * D, w->self_k, w->self_v, NULL, origin, ld_origin, NULL,
                                      v.ctx, D, NULL, n, d->H, d->Tmax, t + 1, d->dh, d->scale, 0);
        linear(&w->self_out, v.ctx, n, v.tmp, 0);
        residual(d, &v, 0, w, w->self_out.bias, n);

        /* Cross-attention over the encoder output. */
        src = sublayer_input(d, &v, 1, w, n);
        linear(&w->cross_q, src, n, v.query, 1);
        attention_decode_rows_forward(v.query, D, w->memory_k, w->memory_v, sentence, NULL, 0, d->src_pad,
                                      v.ctx, D, NULL, n, d->H, d->S, d->S, d->dh, d->scale, 0);
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
        layernorm_forward(v.h, v.mean, v.rstd, v.x, d->final_w, d->final_b, n, D, d->eps);
        top = v.h;
    }
    linear(&d->generator, top, n, v.logits, 1);
    if (tail->log_softmax) log_softmax_forward(v.logits, v.logits, n, d->V);
    /* One block (groups == 1) with a big vocabulary: the bans and argmax over rows in parallel. */
#pragma omp parallel for num_threads(tf_team(n * d->V, 1L << 18)) schedule(static)
    for (long r = 0; r < n; r++) {
        float *row = v.logits + r * d->V;
        for (int b = 0; b < tail->n_banned; b++) row[tail->banned[b]] = -INFINITY;
        if (tail->argmax) tail->argmax[r0 + r] = argmax_row(row, d->V);
    }
}

void decoder_step(const tf_decoder *d, const int64_t *ids, long n, long t, const int64_t *slot,
                  int64_t *origin, long ld_origin, const int64_t *sentence, int log_softmax,
                  const int64_t *banned, int n_banned, int64_t *argmax, int groups)
{
    const step_tail tail = {log_softmax, n_banned, banned, argmax};
    if (groups > n) groups = (int)n;
    if (groups <= 1) {
        step_rows(d, ids, n, t, slot, origin, ld_origin, sentence, &tail, 0);
        return;
    }
#pragma omp parallel for num_threads(groups) schedule(static, 1)
    for (int g = 0; g < groups; g++) {
        const long r0 = n * g / groups, r1 = n * (g + 1) / groups;
        step_rows(d, ids, r1 - r0, t, slot, origin, ld_origin, sentence, &tail, r0);
    }
}
