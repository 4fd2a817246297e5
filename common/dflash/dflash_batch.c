/* dflash_batch.c: anchors, labels, loss weights, training mask and feature noise for
 * one sequence. Every rule here is a trap of docs/dflash_spec.md written as code:
 * strict "< anchor" context visibility, no label shift, position 0 without loss. */
#include "dflash/dflash_batch.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void dflash_rng_for(df_rng *r, uint64_t seed, uint64_t batch_id, uint64_t stream)
{
    df_rng_seed(r, df_hash64(seed) ^ df_hash64(batch_id * 0x9e3779b97f4a7c15ull + stream));
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int dflash_sample_anchors(int32_t *anchors, uint8_t *keep, int num_anchors, const uint8_t *loss_mask, int S,
                          uint64_t seed, uint64_t batch_id)
{
    int n_cand = 0; /* count, then collect the candidates in a scratch list */
    for (int p = 0; p + 1 < S; p++)
        n_cand += loss_mask[p] && loss_mask[p + 1];
    int n = DF_MIN(num_anchors, n_cand);
    int32_t *cand = malloc(sizeof(int32_t) * (size_t)(n_cand > 0 ? n_cand : 1));
    if (!cand)
        return -ENOMEM;
    int i = 0;
    for (int p = 0; p + 1 < S; p++)
        if (loss_mask[p] && loss_mask[p + 1])
            cand[i++] = p;
    df_rng r;
    dflash_rng_for(&r, seed, batch_id, DFLASH_STREAM_ANCHORS);
    for (int t = 0; t < n; t++) { /* partial Fisher-Yates: cand[0..n) is a uniform sample */
        int u = t + (int)df_rng_below(&r, (uint64_t)(n_cand - t));
        int32_t tmp = cand[t];
        cand[t] = cand[u];
        cand[u] = tmp;
    }
    qsort(cand, (size_t)n, sizeof(int32_t), cmp_i32);
    for (int j = 0; j < num_anchors; j++) {
        anchors[j] = j < n ? cand[j] : 0;
        keep[j] = j < n;
    }
    free(cand);
    return n;
}

double dflash_labels_weights(int32_t *labels, float *weights, const int32_t *anchors, const uint8_t *keep, int N, int B,
                             const int32_t *x, const uint8_t *loss_mask, int S, double gamma)
{
    double sum = 0;
    for (int j = 0; j < N; j++) {
        for (int k = 0; k < B; k++) {
            long r = (long)j * B + k;
            int p = anchors[j] + k;
            labels[r] = -1;
            weights[r] = 0.0f;
            if (!keep[j] || k == 0 || p >= S)
                continue;
            labels[r] = x[p]; /* the block's k-th slot predicts the token AT anchor + k */
            weights[r] = loss_mask[p] ? (float)exp(-(double)(k - 1) / gamma) : 0.0f;
            sum += weights[r];
        }
    }
    return sum;
}

void dflash_mask_ranges(nn_key_ranges *ranges, const int32_t *anchors, const uint8_t *keep, int N, int B, int S,
                        int window)
{
    for (int j = 0; j < N; j++) {
        int32_t blk = S + j * B;
        for (int k = 0; k < B; k++) {
            nn_key_ranges *r = &ranges[(long)j * B + k];
            if (!keep[j]) {
                *r = (nn_key_ranges){0, 0, 0, 0};
                continue;
            }
            int32_t a = anchors[j];
            if (window > 0) {
                int32_t lo = a + k - (window - 1);
                *r = (nn_key_ranges){lo > 0 ? lo : 0, a, blk, blk + k + 1};
            } else {
                *r = (nn_key_ranges){0, a, blk, blk + B};
            }
        }
    }
}

void dflash_batch_free(dflash_batch *b)
{
    free(b->anchors);
    free(b->keep);
    free(b->labels);
    free(b->weights);
    b->anchors = NULL;
    b->keep = NULL;
    b->labels = NULL;
    b->weights = NULL;
}

static int batch_alloc(dflash_batch *b, int N, int B)
{
    size_t n = (size_t)(N > 0 ? N : 1);
    b->anchors = malloc(sizeof(int32_t) * n);
    b->keep = malloc(n);
    b->labels = malloc(sizeof(int32_t) * n * (size_t)B);
    b->weights = malloc(sizeof(float) * n * (size_t)B);
    if (!b->anchors || !b->keep || !b->labels || !b->weights) {
        dflash_batch_free(b);
        return -ENOMEM;
    }
    b->N = N;
    return 0;
}

int dflash_batch_init(dflash_batch *b, const dflash_config *c, int S, int num_anchors, const float *H, const int32_t *x,
                      const uint8_t *loss_mask, uint64_t seed, uint64_t batch_id)
{
    memset(b, 0, sizeof(*b));
    if (S <= 0 || num_anchors <= 0)
        return -EINVAL;
    b->S = S;
    b->H = H;
    b->x = x;
    b->loss_mask = loss_mask;
    int rc = batch_alloc(b, num_anchors, c->block_size);
    if (rc < 0)
        return rc;
    rc = dflash_sample_anchors(b->anchors, b->keep, num_anchors, loss_mask, S, seed, batch_id);
    if (rc < 0) {
        dflash_batch_free(b);
        return rc;
    }
    b->n_real = rc;
    b->sum_w = dflash_labels_weights(b->labels, b->weights, b->anchors, b->keep, b->N, c->block_size, x, loss_mask, S,
                                     c->gamma);
    return 0;
}

int dflash_batch_set_anchors(dflash_batch *b, const dflash_config *c, const int32_t *anchors, const uint8_t *keep,
                             int N)
{
    if (N <= 0)
        return -EINVAL;
    for (int j = 0; j < N; j++) {
        if (anchors[j] < 0 || anchors[j] >= b->S || (j > 0 && keep[j] && keep[j - 1] && anchors[j] < anchors[j - 1]))
            return -EINVAL;
    }
    dflash_batch nb = *b; /* allocate first: anchors/keep may alias b's own arrays */
    int rc = batch_alloc(&nb, N, c->block_size);
    if (rc < 0)
        return rc;
    memcpy(nb.anchors, anchors, sizeof(int32_t) * (size_t)N);
    nb.n_real = 0;
    for (int j = 0; j < N; j++)
        nb.n_real += (nb.keep[j] = keep[j] ? 1 : 0);
    dflash_batch_free(b);
    *b = nb;
    b->sum_w = dflash_labels_weights(b->labels, b->weights, b->anchors, b->keep, N, c->block_size, b->x, b->loss_mask,
                                     b->S, c->gamma);
    return 0;
}

void dflash_add_noise(float *H, size_t count, double std, uint64_t seed, uint64_t batch_id)
{
    if (!(std > 0))
        return;
    df_rng r;
    dflash_rng_for(&r, seed, batch_id, DFLASH_STREAM_NOISE);
    for (size_t i = 0; i < count; i++)
        H[i] += (float)(std * df_rng_normal(&r));
}
