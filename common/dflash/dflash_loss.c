/* dflash_loss.c: chunked lm_head + softmax + CE + gradient (see dflash_loss.h). Per chunk
 * of kept rows: logits = z W^T, a numerically safe softmax in double, CE = lse - logit_y,
 * dlogits = (p - onehot) * w / norm, dz = dlogits W. Only the chunk's logits exist.
 * D-PACE runs the same pass with unit weights, keeps each row's CE, then scales the rows of
 * dz by the weights its CEs give (the gradient of a row is linear in its weight). */
#include "dflash/dflash_loss.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn.h"
#include "nn/nn_backward.h"

/* The chunked pass. unit = 0: row weights w (the decay objective, wce and wpos filled);
 * unit = 1: every loss row (w > 0) weighs 1 in dz, and ce_out[row] gets its CE (wce, wpos
 * left to the caller). st is zeroed here. */
static int chunked_pass(float *dz, const float *z, const float *W, const int32_t *labels, const float *w, int rows,
                        int d, int V, int B, int chunk_rows, double norm, int unit, double *ce_out, dflash_stats *st)
{
    if (B > DFLASH_MAX_BLOCK || chunk_rows <= 0)
        return -EINVAL;
    memset(st, 0, sizeof(*st));
    double sum_w = 0;
    for (int r = 0; r < rows; r++) {
        if (w[r] > 0) {
            if (labels[r] < 0 || labels[r] >= V)
                return -EINVAL;
            sum_w += w[r];
        }
    }
    if (norm <= 0)
        norm = sum_w;
    if (dz)
        memset(dz, 0, sizeof(float) * (size_t)rows * (size_t)d);
    float *zc = malloc(sizeof(float) * (size_t)chunk_rows * d); /* gathered kept rows */
    float *lg = malloc(sizeof(float) * (size_t)chunk_rows * V); /* their logits */
    float *dzc = malloc(sizeof(float) * (size_t)chunk_rows * d);
    int *idx = malloc(sizeof(int) * (size_t)chunk_rows);
    if (!zc || !lg || !dzc || !idx) {
        free(zc);
        free(lg);
        free(dzc);
        free(idx);
        return -ENOMEM;
    }
    int r = 0;
    while (r < rows) {
        int n = 0; /* gather up to chunk_rows rows with weight */
        for (; r < rows && n < chunk_rows; r++) {
            if (w[r] > 0) {
                idx[n] = r;
                memcpy(zc + (long)n * d, z + (long)r * d, sizeof(float) * (size_t)d);
                n++;
            }
        }
        if (n == 0)
            break;
        nn_matmul(lg, zc, W, NULL, n, d, V);
        for (int i = 0; i < n; i++) {
            int row = idx[i], y = labels[row], k = row % B;
            float *l = lg + (long)i * V;
            double mx = -INFINITY;
            int amax = 0;
            for (int v = 0; v < V; v++) {
                if (l[v] > mx) {
                    mx = l[v];
                    amax = v;
                }
            }
            double se = 0;
            for (int v = 0; v < V; v++)
                se += exp((double)l[v] - mx);
            double lse = mx + log(se);
            if (unit) {
                ce_out[row] = lse - l[y];
            } else {
                st->wce += (double)w[row] * (lse - l[y]);
                st->wpos[k] += w[row];
            }
            st->count[k] += 1;
            st->correct[k] += amax == y;
            double scale = (unit ? 1.0 : (double)w[row]) / norm;
            for (int v = 0; v < V; v++) /* logits become dlogits in place */
                l[v] = (float)(exp((double)l[v] - lse) * scale);
            l[y] -= (float)scale;
        }
        if (dz) {
            memset(dzc, 0, sizeof(float) * (size_t)n * d);
            nn_matmul_backward(dzc, NULL, NULL, lg, zc, W, n, d, V);
            for (int i = 0; i < n; i++)
                memcpy(dz + (long)idx[i] * d, dzc + (long)i * d, sizeof(float) * (size_t)d);
        }
    }
    free(zc);
    free(lg);
    free(dzc);
    free(idx);
    st->sum_w = sum_w;
    st->loss = norm > 0 ? st->wce / norm : 0.0;
    return 0;
}

int dflash_loss_chunked(float *dz, const float *z, const float *W, const int32_t *labels, const float *w, int rows,
                        int d, int V, int B, int chunk_rows, double norm, dflash_stats *st)
{
    dflash_stats local;
    return chunked_pass(dz, z, W, labels, w, rows, d, V, B, chunk_rows, norm, 0, NULL, st ? st : &local);
}

int dflash_dpace_weights(double *wd, const double *ce, const float *mask, int rows, int B, double alpha)
{
    if (!(alpha > 0 && alpha <= 1) || B < 2 || B > DFLASH_MAX_BLOCK)
        return -EINVAL;
    int blocks = 0;
    for (int j = 0; j < rows / B; j++) {
        const int r0 = j * B;
        double P[DFLASH_MAX_BLOCK];
        int L = 0; /* the positions 1..L the block can accept in a row */
        double p = 1.0;
        for (int k = 1; k < B && mask[r0 + k] > 0; k++) {
            p *= (1.0 - alpha) * exp(-ce[r0 + k]) + alpha;
            P[k] = p;
            L = k;
        }
        double tail = 0; /* P_k + ... + P_L, accumulated from the end */
        for (int k = B - 1; k >= 0; k--) {
            if (k >= 1 && k <= L)
                tail += P[k];
            wd[r0 + k] = k >= 1 && k <= L ? tail : 0.0;
        }
        blocks += L >= 1;
    }
    for (int r = rows / B * B; r < rows; r++) /* a partial block (never in the model's layout) */
        wd[r] = 0.0;
    return blocks;
}

double dflash_loss_norm(int loss, const float *w, int rows, int B)
{
    double s = 0;
    if (loss == DFLASH_LOSS_DPACE) {
        for (int r = 1; r < rows; r += B)
            s += w[r] > 0;
        return s;
    }
    for (int r = 0; r < rows; r++)
        s += w[r];
    return s;
}

int dflash_loss_dpace_chunked(float *dz, const float *z, const float *W, const int32_t *labels, const float *w,
                              int rows, int d, int V, int B, int chunk_rows, double alpha, double norm, float *wd_out,
                              dflash_stats *st)
{
    dflash_stats local;
    if (!st)
        st = &local;
    if (!(alpha > 0 && alpha <= 1) || B < 2 || B > DFLASH_MAX_BLOCK || rows % B != 0)
        return -EINVAL;
    double blocks = dflash_loss_norm(DFLASH_LOSS_DPACE, w, rows, B);
    if (norm <= 0)
        norm = blocks;
    double *ce = calloc((size_t)rows + 1, sizeof(double)), *wd = malloc(sizeof(double) * ((size_t)rows + 1));
    if (!ce || !wd) {
        free(ce);
        free(wd);
        return -ENOMEM;
    }
    /* dz with unit weights (norm > 0 here unless the call has no loss row: then no row is
     * touched and the scale is never used) */
    int rc = chunked_pass(dz, z, W, labels, w, rows, d, V, B, chunk_rows, norm > 0 ? norm : 1.0, 1, ce, st);
    if (rc == 0)
        rc = dflash_dpace_weights(wd, ce, w, rows, B, alpha);
    if (rc >= 0) {
        rc = 0;
        st->wce = 0;
        for (int r = 0; r < rows; r++) {
            if (!(w[r] > 0))
                continue;
            st->wce += wd[r] * ce[r];
            st->wpos[r % B] += wd[r];
            if (dz) {
                float *row = dz + (size_t)r * d;
                for (int i = 0; i < d; i++)
                    row[i] = (float)((double)row[i] * wd[r]);
            }
        }
        if (wd_out)
            for (int r = 0; r < rows; r++)
                wd_out[r] = (float)wd[r];
        st->sum_w = blocks;
        st->loss = norm > 0 ? st->wce / norm : 0.0;
    }
    free(ce);
    free(wd);
    return rc;
}

int dflash_loss_config(const dflash_config *c, float *dz, const float *z, const float *W, const int32_t *labels,
                       const float *w, int rows, int chunk_rows, double norm, dflash_stats *st)
{
    if (c->loss == DFLASH_LOSS_DPACE)
        return dflash_loss_dpace_chunked(dz, z, W, labels, w, rows, c->hidden, c->vocab, c->block_size, chunk_rows,
                                         c->dpace_alpha, norm, NULL, st);
    return dflash_loss_chunked(dz, z, W, labels, w, rows, c->hidden, c->vocab, c->block_size, chunk_rows, norm, st);
}

void dflash_stats_merge(dflash_stats *a, const dflash_stats *b)
{
    a->wce += b->wce;
    a->sum_w += b->sum_w;
    for (int k = 0; k < DFLASH_MAX_BLOCK; k++) {
        a->correct[k] += b->correct[k];
        a->count[k] += b->count[k];
        a->wpos[k] += b->wpos[k];
    }
    a->loss = a->sum_w > 0 ? a->wce / a->sum_w : 0.0;
}

double dflash_stats_acc(const dflash_stats *s, int k)
{
    return s->count[k] > 0 ? s->correct[k] / s->count[k] : 0.0;
}

double dflash_stats_tau(const dflash_stats *s, int B)
{
    double tau = 1.0, prod = 1.0;
    for (int k = 1; k < B && k < DFLASH_MAX_BLOCK; k++) {
        prod *= dflash_stats_acc(s, k);
        tau += prod;
    }
    return tau;
}

void dflash_stats_wpos(const dflash_stats *s, int B, double *out)
{
    double tot = 0;
    for (int k = 1; k < B && k < DFLASH_MAX_BLOCK; k++)
        tot += s->wpos[k];
    for (int k = 1; k < B && k < DFLASH_MAX_BLOCK; k++)
        out[k - 1] = tot > 0 ? s->wpos[k] / tot : 0.0;
}
