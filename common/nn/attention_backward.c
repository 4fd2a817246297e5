/* attention_backward.c: gradient of the range-masked GQA attention of attention.c.
 * Per (query, head): recompute the softmax row in double exactly as the forward does,
 * then dv += p dout, ds_j = p_j (dout.v_j - sum_i p_i dout.v_i), dq += scale ds k,
 * dk += scale ds q. Queries whose ranges are empty produced a constant zero row and so
 * pass no gradient. Several query heads share a kv head (GQA): their dk/dv add up. */
#include "nn/nn_backward.h"

#include <math.h>
#include <stdlib.h>

static int in_ranges(const nn_key_ranges *r, int k)
{
    return (k >= r->lo0 && k < r->hi0) || (k >= r->lo1 && k < r->hi1);
}

void nn_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                           const float *v, const nn_key_ranges *ranges, int Tq, int Tk, int n_heads, int n_kv_heads,
                           int hd, float scale)
{
    int group = n_heads / n_kv_heads;
    double *p = malloc(sizeof(double) * (size_t)(Tk > 0 ? Tk : 1));
    double *dp = malloc(sizeof(double) * (size_t)(Tk > 0 ? Tk : 1));
    if (!p || !dp)
        abort(); /* reference code: allocation failure is not recoverable here */
    for (int t = 0; t < Tq; t++) {
        const nn_key_ranges *r = &ranges[t];
        for (int h = 0; h < n_heads; h++) {
            int kh = h / group;
            const float *qh = q + ((long)t * n_heads + h) * hd;
            const float *gh = dout + ((long)t * n_heads + h) * hd;
            double mx = -INFINITY;
            int any = 0;
            for (int j = 0; j < Tk; j++) {
                if (!in_ranges(r, j)) {
                    p[j] = -INFINITY;
                    continue;
                }
                const float *kj = k + ((long)j * n_kv_heads + kh) * hd;
                double s = 0;
                for (int d = 0; d < hd; d++)
                    s += (double)qh[d] * kj[d];
                p[j] = s * scale;
                if (p[j] > mx)
                    mx = p[j];
                any = 1;
            }
            if (!any)
                continue;
            double den = 0;
            for (int j = 0; j < Tk; j++) {
                if (p[j] == -INFINITY) {
                    p[j] = 0;
                    continue;
                }
                p[j] = exp(p[j] - mx);
                den += p[j];
            }
            double pdp = 0; /* sum_j p_j dp_j */
            for (int j = 0; j < Tk; j++) {
                if (p[j] == 0)
                    continue;
                p[j] /= den;
                const float *vj = v + ((long)j * n_kv_heads + kh) * hd;
                double s = 0;
                for (int d = 0; d < hd; d++)
                    s += (double)gh[d] * vj[d];
                dp[j] = s;
                pdp += p[j] * s;
            }
            float *dqh = dq ? dq + ((long)t * n_heads + h) * hd : NULL;
            for (int j = 0; j < Tk; j++) {
                if (p[j] == 0)
                    continue;
                double ds = p[j] * (dp[j] - pdp) * scale;
                long off = ((long)j * n_kv_heads + kh) * hd;
                if (dv) {
                    for (int d = 0; d < hd; d++)
                        dv[off + d] += (float)(p[j] * gh[d]);
                }
                if (dqh) {
                    for (int d = 0; d < hd; d++)
                        dqh[d] += (float)(ds * k[off + d]);
                }
                if (dk) {
                    for (int d = 0; d < hd; d++)
                        dk[off + d] += (float)(ds * qh[d]);
                }
            }
        }
    }
    free(p);
    free(dp);
}
