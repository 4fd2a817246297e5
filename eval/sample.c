/* sample.c: greedy / temperature / top-k / top-p token choice (see sample.h). */
#include "eval/sample.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "util.h"

int sample_work_init(sample_work *w, int vocab, char *err, size_t errlen)
{
    w->vocab = 0;
    w->prob = NULL;
    w->cand = NULL;
    if (vocab < 1)
        return df_err(err, errlen, -EINVAL, "sampler: vocabulary of %d tokens", vocab);
    w->prob = malloc(sizeof(float) * (size_t)vocab);
    w->cand = malloc(sizeof(int32_t) * (size_t)vocab);
    if (!w->prob || !w->cand) {
        sample_work_free(w);
        return df_err(err, errlen, -ENOMEM, "sampler: out of memory for %d tokens", vocab);
    }
    w->vocab = vocab;
    return 0;
}

void sample_work_free(sample_work *w)
{
    free(w->prob);
    free(w->cand);
    w->prob = NULL;
    w->cand = NULL;
    w->vocab = 0;
}

int sample_opts_check(const sample_opts *o, char *err, size_t errlen)
{
    if (!(o->temperature >= 0.0) || !isfinite(o->temperature))
        return df_err(err, errlen, -EINVAL, "temperature %g: must be a finite number >= 0 (0 = greedy)",
                      o->temperature);
    if (!(o->top_p > 0.0 && o->top_p <= 1.0))
        return df_err(err, errlen, -EINVAL, "top-p %g: must be in (0, 1]", o->top_p);
    if (o->top_k < 0)
        return df_err(err, errlen, -EINVAL, "top-k %d: must be >= 0 (0 = off)", o->top_k);
    return 0;
}

static int32_t argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* order of candidates: larger probability first, then the lower token id (qsort_r) */
static int by_prob(const void *a, const void *b, void *ctx)
{
    const float *p = ctx;
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (p[i] != p[j])
        return p[i] > p[j] ? -1 : 1;
    return (i > j) - (i < j);
}

/* worse(a, b): a comes after b in the candidate order */
static int worse(const float *p, int32_t a, int32_t b)
{
    return p[a] < p[b] || (p[a] == p[b] && a > b);
}

static void sift_down(int32_t *h, int n, int i, const float *p)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && worse(p, h[l], h[m]))
            m = l;
        if (r < n && worse(p, h[r], h[m]))
            m = r;
        if (m == i)
            return;
        int32_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* the k first tokens of the candidate order among all V, sorted, into out[0..k):
 * a heap of the k best so far whose root is the worst of them, O(V log k) */
static void top_k(const float *p, int V, int k, int32_t *out)
{
    for (int i = 0; i < k; i++)
        out[i] = i;
    for (int i = k / 2 - 1; i >= 0; i--)
        sift_down(out, k, i, p);
    for (int i = k; i < V; i++)
        if (worse(p, out[0], i)) {
            out[0] = i;
            sift_down(out, k, 0, p);
        }
    qsort_r(out, (size_t)k, sizeof *out, by_prob, (void *)p);
}

int32_t sample_token(const float *logits, const sample_opts *o, df_rng *rng, sample_work *w)
{
    int V = w->vocab;
    if (o->temperature == 0.0)
        return argmax(logits, V);
    float m = logits[argmax(logits, V)];
    double inv_t = 1.0 / o->temperature;
    for (int i = 0; i < V; i++)
        w->prob[i] = (float)exp(((double)logits[i] - (double)m) * inv_t); /* the max is 1 */
    int n = 0;
    double total = 0.0; /* the mass top-p is a fraction of */
    if (o->top_k > 0 && o->top_k < V) {
        /* top-k first; top-p then takes its share of the renormalised k (transformers' order) */
        n = o->top_k;
        top_k(w->prob, V, n, w->cand);
        for (int i = 0; i < n; i++)
            total += w->prob[w->cand[i]];
    } else if (o->top_p < 1.0) {
        /* candidates: p >= (1 - top_p) / (2V) (p_max is 1); sample.h says why this is exact */
        float floor_p = (float)((1.0 - o->top_p) / (2.0 * (double)V));
        for (int i = 0; i < V; i++) {
            total += w->prob[i];
            if (w->prob[i] >= floor_p)
                w->cand[n++] = i;
        }
        qsort_r(w->cand, (size_t)n, sizeof *w->cand, by_prob, w->prob);
    } else {
        for (int i = 0; i < V; i++) {
            w->cand[n++] = i;
            total += w->prob[i];
        }
    }
    double mass = total;
    if (o->top_p < 1.0) {
        int keep = 0;
        mass = 0.0;
        while (keep < n) {
            mass += w->prob[w->cand[keep++]];
            if (mass >= o->top_p * total)
                break;
        }
        n = keep;
    }
    double u = df_rng_uniform(rng) * mass, acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += w->prob[w->cand[i]];
        if (u < acc)
            return w->cand[i];
    }
    return w->cand[n - 1]; /* u rounded up to the mass */
}
