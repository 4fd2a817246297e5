/* dflash_loss.c: chunked lm_head + softmax + CE + gradient (see dflash_loss.h). Per chunk
 * of kept rows: logits = z W^T, a numerically safe softmax in double, CE = lse - logit_y,
 * dlogits = (p - onehot) * w / norm, dz = dlogits W. Only the chunk's logits exist. */
#include "dflash/dflash_loss.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn.h"
#include "nn/nn_backward.h"

int dflash_loss_chunked(float *dz, const float *z, const float *W, const int32_t *labels, const float *w, int rows,
                        int d, int V, int B, int chunk_rows, double norm, dflash_stats *st)
{
    if (B > DFLASH_MAX_BLOCK || chunk_rows <= 0)
        return -EINVAL;
    dflash_stats local;
    if (!st)
        st = &local;
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
            st->wce += (double)w[row] * (lse - l[y]);
            st->count[k] += 1;
            st->correct[k] += amax == y;
            double scale = (double)w[row] / norm;
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

void dflash_stats_merge(dflash_stats *a, const dflash_stats *b)
{
    a->wce += b->wce;
    a->sum_w += b->sum_w;
    for (int k = 0; k < DFLASH_MAX_BLOCK; k++) {
        a->correct[k] += b->correct[k];
        a->count[k] += b->count[k];
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
