/* Beam search candidate selection (see beam.h). */
#include "beam.h"

#include <math.h>
#include <stdlib.h>

#include "cpu.h"
#include "simd_math.h"

typedef struct {
    double score;
    int64_t index;   /* beam * V + token */
} candidate;

/* Insert a candidate into the sorted list top[0 .. *count) of capacity width. The caller has
 * checked value > the current threshold; the new index is larger than every index already in
 * the list (candidates arrive in index order), so it goes after the equal scores. */
static inline double offer(candidate *top, long *count, long width, double value, int64_t index)
{
    long i = *count < width ? (*count)++ : width - 1;
    while (i > 0 && top[i - 1].score < value) {
        top[i] = top[i - 1];
        i--;
    }
    top[i].score = value;
    top[i].index = index;
    return *count < width ? -INFINITY : top[width - 1].score;
}

/* One beam's V candidates score + logp[v] (v != banned) offered in order; returns the
 * threshold a candidate must now beat. */
typedef double (*scan_fn)(const float *lp, long V, double score, int64_t base, int64_t banned,
                          candidate *top, long *count, long width, double threshold);

static double scan_generic(const float *lp, long V, double score, int64_t base, int64_t banned,
                           candidate *top, long *count, long width, double threshold)
{
    for (long v = 0; v < V; v++) {
        double c = score + (double)lp[v];
        if (c > threshold && v != banned)
            threshold = offer(top, count, width, c, base + v);
    }
    return threshold;
}

#if TF_HAVE_X86
/* The lanes set in m (candidates v + lane, scores in lanes[]) offered in lane order, each still
 * compared with the current threshold exactly as scan_generic compares it. */
static inline double offer_lanes(const double *lanes, unsigned m, long v, int64_t base, int64_t banned,
                                 candidate *top, long *count, long width, double threshold)
{
    for (; m; m &= m - 1) {
        int lane = __builtin_ctz(m);
        if (lanes[lane] > threshold && v + lane != banned)
            threshold = offer(top, count, width, lanes[lane], base + v + lane);
    }
    return threshold;
}

/* Sixteen candidates at a time in double: a lane passes the filter exactly when the scalar
 * comparison would accept it, so the result is that of scan_generic. */
TF_TARGET_AVX512
static double scan_avx512(const float *lp, long V, double score, int64_t base, int64_t banned,
                          candidate *top, long *count, long width, double threshold)
{
    __m512d vscore = _mm512_set1_pd(score), vthr = _mm512_set1_pd(threshold);
    double lanes[16];
    long v = 0;
    for (; v + 16 <= V; v += 16) {
        __m512 f = _mm512_loadu_ps(lp + v);
        __m512d lo = _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(f)), vscore);
        __m512d hi = _mm512_add_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(f, 1)), vscore);
        unsigned m = (unsigned)_mm512_cmp_pd_mask(lo, vthr, _CMP_GT_OQ)
                   | (unsigned)_mm512_cmp_pd_mask(hi, vthr, _CMP_GT_OQ) << 8;
        if (!m) continue;
        _mm512_storeu_pd(lanes, lo);
        _mm512_storeu_pd(lanes + 8, hi);
        threshold = offer_lanes(lanes, m, v, base, banned, top, count, width, threshold);
        vthr = _mm512_set1_pd(threshold);
    }
    return scan_generic(lp + v, V - v, score, base + v, banned - v, top, count, width, threshold);
}

TF_TARGET_AVX2
static double scan_avx2(const float *lp, long V, double score, int64_t base, int64_t banned,
                        candidate *top, long *count, long width, double threshold)
{
    __m256d vscore = _mm256_set1_pd(score), vthr = _mm256_set1_pd(threshold);
    double lanes[8];
    long v = 0;
    for (; v + 8 <= V; v += 8) {
        __m256 f = _mm256_loadu_ps(lp + v);
        __m256d lo = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(f)), vscore);
        __m256d hi = _mm256_add_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)), vscore);
        unsigned m = (unsigned)_mm256_movemask_pd(_mm256_cmp_pd(lo, vthr, _CMP_GT_OQ))
                   | (unsigned)_mm256_movemask_pd(_mm256_cmp_pd(hi, vthr, _CMP_GT_OQ)) << 4;
        if (!m) continue;
        _mm256_storeu_pd(lanes, lo);
        _mm256_storeu_pd(lanes + 4, hi);
        threshold = offer_lanes(lanes, m, v, base, banned, top, count, width, threshold);
        vthr = _mm256_set1_pd(threshold);
    }
    return scan_generic(lp + v, V - v, score, base + v, banned - v, top, count, width, threshold);
}
#endif

static scan_fn pick_scan(void)
{
#if TF_HAVE_X86
    int isa = tf_isa();
    if (isa >= TF_ISA_AVX512) return scan_avx512;
    if (isa >= TF_ISA_AVX2) return scan_avx2;
#endif
    return scan_generic;
}

/* The best `width` candidates of one slot into top (sorted); returns how many were found. */
static long slot_topk(scan_fn scan, const float *logp, const double *scores, long K, long V,
                      int64_t banned, long width, candidate *top)
{
    long count = 0;
    double threshold = -INFINITY;
    for (long beam = 0; beam < K; beam++) {
        double s = scores[beam];
        if (!(s > -INFINITY)) continue;            /* dead beam (or NaN): no candidates */
        threshold = scan(logp + beam * V, V, s, beam * V, banned, top, &count, width, threshold);
    }
    return count;
}

/* Grain: candidates per thread below which one thread does everything. */
#define BEAM_GRAIN (1L << 16)

void beam_topk(const float *logp, const double *scores, long n, long K, long V,
               int64_t banned, long width, int64_t *top_index, double *top_score)
{
    scan_fn scan = pick_scan();
#pragma omp parallel num_threads(tf_team(n * K * V, BEAM_GRAIN))
    {
        candidate *top = malloc((size_t)(width > 0 ? width : 1) * sizeof(candidate));
#pragma omp for schedule(static)
        for (long slot = 0; slot < n; slot++) {
            long found = slot_topk(scan, logp + slot * K * V, scores + slot * K, K, V, banned,
                                   width, top);
            for (long i = 0; i < width; i++) {
                top_index[slot * width + i] = i < found ? top[i].index : -1;
                top_score[slot * width + i] = i < found ? top[i].score : -INFINITY;
            }
        }
        free(top);
    }
}

void beam_topk_reference(const float *logp, const double *scores, long n, long K, long V,
                         int64_t banned, long width, int64_t *top_index, double *top_score)
{
    for (long slot = 0; slot < n; slot++) {
        int64_t *index = top_index + slot * width;
        double *best = top_score + slot * width;
        for (long i = 0; i < width; i++) {
            /* The best candidate ranked after the previous pick: lower score, or the same
             * score at a larger index. */
            int64_t pick = -1;
            double pick_score = -INFINITY;
            for (long c = 0; c < K * V; c++) {
                double s = scores[slot * K + c / V];
                if (!(s > -INFINITY) || c % V == banned) continue;
                double value = s + (double)logp[slot * K * V + c];
                if (!(value > -INFINITY)) continue;
                if (i > 0 && !(value < best[i - 1] || (value == best[i - 1] && c > index[i - 1])))
                    continue;
                if (pick < 0 || value > pick_score) { pick = c; pick_score = value; }
            }
            index[i] = pick;
            best[i] = pick < 0 ? -INFINITY : pick_score;
            if (pick < 0) {
                for (long j = i + 1; j < width; j++) { index[j] = -1; best[j] = -INFINITY; }
                break;
            }
        }
    }
}

void beam_select(const float *logp, const double *scores, int64_t *n_finished,
                 long n, long K, long V, int64_t banned, int64_t eos, const uint8_t *last_step,
                 int64_t *parents, int64_t *tokens, double *new_scores, uint8_t *done,
                 int64_t *fin_rows, int64_t *fin_tokens, double *fin_scores, int64_t *fin_count,
                 int early_stopping)
{
    scan_fn scan = pick_scan();
    long width = 2 * K < K * V ? 2 * K : K * V;
#pragma omp parallel num_threads(tf_team(n * K * V, BEAM_GRAIN))
    {
        candidate *top = malloc((size_t)(width > 0 ? width : 1) * sizeof(candidate));
#pragma omp for schedule(static)
        for (long slot = 0; slot < n; slot++) {
            long found = slot_topk(scan, logp + slot * K * V, scores + slot * K, K, V, banned,
                                   width, top);
            for (long b = 0; b < K; b++) {             /* unfilled beams stay dead */
                parents[slot * K + b] = slot * K;
                tokens[slot * K + b] = eos;
                new_scores[slot * K + b] = -INFINITY;
            }
            long kept = 0, finished = 0;
            for (long i = 0; i < found; i++) {
                double score = top[i].score;
                if (!isfinite(score)) break;
                long beam = (long)(top[i].index / V), token = (long)(top[i].index % V);
                long row = slot * K + beam;
                /* At the last step every candidate would finish: the K best do. (With
                 * early_stopping the count below stops the walk there already.) */
                if (last_step[slot] && i >= K) break;
                if (token == eos && !last_step[slot] && i >= K)
                    continue;                           /* EOS below the K best: not final */
                if (token == eos || last_step[slot]) { /* a finished hypothesis */
                    fin_rows[slot * 2 * K + finished] = row;
                    fin_tokens[slot * 2 * K + finished] = token;
                    fin_scores[slot * 2 * K + finished] = score;
                    finished++;
                    if (++n_finished[slot] >= K && early_stopping) break;
                    continue;
                }
                parents[slot * K + kept] = row;
                tokens[slot * K + kept] = token;
                new_scores[slot * K + kept] = score;
                if (++kept == K) break;
            }
            fin_count[slot] = finished;
            done[slot] = (early_stopping && n_finished[slot] >= K) || last_step[slot] || kept == 0;
        }
        free(top);
    }
}

void no_repeat_ngram_ban(float *logits, long n, long V, const int64_t *history, long stride,
                         const int64_t *rows, long length, long ngram, int64_t keep)
{
    /* One thread: n * length * ngram compares is tiny next to the step's GEMMs that made the
     * logits, and a team would cost more to wake than the loop does. */
    long prefix = ngram - 1;                   /* what an earlier n-gram must share with the tail */
    for (long r = 0; r < n; r++) {
        const int64_t *hyp = history + (rows ? rows[r] : r) * stride;
        const int64_t *tail = hyp + length - prefix;    /* the last N-1 tokens generated */
        float *row = logits + r * V;
        for (long j = 0; j + ngram <= length; j++) {     /* every complete n-gram hyp[j .. j+N) */
            long i = 0;
            while (i < prefix && hyp[j + i] == tail[i])
                i++;
            if (i == prefix && hyp[j + prefix] != keep)
                row[hyp[j + prefix]] = -INFINITY;
        }
    }
}
