/* nn_plain.h: the CPU layers as plain loops, one output at a time over every key: the
 * specification the optimised common/nn/ kernels must match bit for bit
 * (tests/test_nn_exact.c) and the peer they are timed against (bench/nn/bench_nn_cpu.c).
 * These are the kernels as first written; keep them simple, never optimise them. */
#ifndef DF_TESTS_NN_PLAIN_H
#define DF_TESTS_NN_PLAIN_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn.h"
#include "nn/nn_backward.h"

#define PLAIN_LANES 8

static int plain_in_ranges(const nn_key_ranges *r, int k)
{
    return (k >= r->lo0 && k < r->hi0) || (k >= r->lo1 && k < r->hi1);
}

static void plain_attention(float *out, const float *q, const float *k, const float *v, const nn_key_ranges *ranges,
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
                if (!plain_in_ranges(r, j)) {
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

static void plain_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                                     const float *v, const nn_key_ranges *ranges, int Tq, int Tk, int n_heads,
                                     int n_kv_heads, int hd, float scale)
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
                if (!plain_in_ranges(r, j)) {
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

static float plain_dot(const float *restrict a, const float *restrict b, int n)
{
    float acc[PLAIN_LANES] = {0};
    int i = 0;
    for (; i + PLAIN_LANES <= n; i += PLAIN_LANES)
        for (int l = 0; l < PLAIN_LANES; l++)
            acc[l] += a[i + l] * b[i + l];
    float s = 0.0f;
    for (; i < n; i++)
        s += a[i] * b[i];
    for (int l = 0; l < PLAIN_LANES; l++)
        s += acc[l];
    return s;
}

static void plain_matmul(float *out, const float *x, const float *w, const float *bias, int T, int n_in, int n_out)
{
    for (int t = 0; t < T; t++) {
        const float *xr = x + (long)t * n_in;
        float *orow = out + (long)t * n_out;
        for (int o = 0; o < n_out; o++)
            orow[o] = (bias ? bias[o] : 0.0f) + plain_dot(xr, w + (long)o * n_in, n_in);
    }
}

static void plain_matmul_backward(float *restrict dx, float *restrict dw, float *dbias, const float *restrict dout,
                                  const float *restrict x, const float *restrict w, int T, int n_in, int n_out)
{
    if (dx) {
        for (int t = 0; t < T; t++) {
            const float *g = dout + (long)t * n_out;
            float *dxr = dx + (long)t * n_in;
            for (int o = 0; o < n_out; o++) {
                float go = g[o];
                if (go == 0.0f)
                    continue;
                const float *wr = w + (long)o * n_in;
                for (int i = 0; i < n_in; i++)
                    dxr[i] += go * wr[i];
            }
        }
    }
    if (dw || dbias) {
        for (int t = 0; t < T; t++) {
            const float *g = dout + (long)t * n_out;
            const float *xr = x + (long)t * n_in;
            for (int o = 0; o < n_out; o++) {
                float go = g[o];
                if (go == 0.0f)
                    continue;
                if (dbias)
                    dbias[o] += go;
                if (dw) {
                    float *dwr = dw + (long)o * n_in;
                    for (int i = 0; i < n_in; i++)
                        dwr[i] += go * xr[i];
                }
            }
        }
    }
}

#endif
