/* attention.c: CPU reference masked attention with GQA. A mask is given as at most two
 * key ranges per query (nn_key_ranges): enough for packed causal documents (one range)
 * and for DFlash training (context before the anchor + the query's own block). Softmax
 * is computed in double so this stays the reference the kernels are judged against. */
#include "nn/nn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int in_ranges(const nn_key_ranges *r, int k)
{
    return (k >= r->lo0 && k < r->hi0) || (k >= r->lo1 && k < r->hi1);
}

void nn_attention(float *out, const float *q, const float *k, const float *v, const nn_key_ranges *ranges,
                  int Tq, int Tk, int n_heads, int n_kv_heads, int hd, float scale)
{
    int group = n_heads / n_kv_heads;
    double *sc = malloc(sizeof(double) * (size_t)(Tk > 0 ? Tk : 1));
    double *acc = malloc(sizeof(double) * (size_t)hd);
    if (!sc || !acc)
        abort(); /* reference code: allocation failure is not recoverable here */
    for (int t = 0; t < Tq; t++) {
        const nn_key_ranges *r = &ranges[t];
        for (int h = 0; h < n_heads; h++) {
            int kh = h / group;
            const float *qh = q + ((long)t * n_heads + h) * hd;
            float *oh = out + ((long)t * n_heads + h) * hd;
            double mx = -INFINITY;
            int any = 0;
            for (int j = 0; j < Tk; j++) {
                if (!in_ranges(r, j)) {
                    sc[j] = -INFINITY;
                    continue;
                }
                const float *kj = k + ((long)j * n_kv_heads + kh) * hd;
                double s = 0;
                for (int d = 0; d < hd; d++)
                    s += (double)qh[d] * kj[d];
                sc[j] = s * scale;
                if (sc[j] > mx)
                    mx = sc[j];
                any = 1;
            }
            if (!any) { /* padding query: exact zeros, never NaN */
                memset(oh, 0, sizeof(float) * (size_t)hd);
                continue;
            }
            double den = 0;
            memset(acc, 0, sizeof(double) * (size_t)hd);
            for (int j = 0; j < Tk; j++) {
                if (sc[j] == -INFINITY)
                    continue;
                double p = exp(sc[j] - mx);
                den += p;
                const float *vj = v + ((long)j * n_kv_heads + kh) * hd;
                for (int d = 0; d < hd; d++)
                    acc[d] += p * vj[d];
            }
            for (int d = 0; d < hd; d++)
                oh[d] = (float)(acc[d] / den);
        }
    }
    free(sc);
    free(acc);
}

void nn_packed_causal_ranges(nn_key_ranges *ranges, int32_t *pos, const int32_t *starts, int n_docs)
{
    for (int d = 0; d < n_docs; d++) {
        for (int t = starts[d]; t < starts[d + 1]; t++) {
            ranges[t] = (nn_key_ranges){starts[d], t + 1, 0, 0};
            if (pos)
                pos[t] = t - starts[d];
        }
    }
}
