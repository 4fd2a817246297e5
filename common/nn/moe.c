/* moe.c: CPU reference mixture-of-experts layer (Qwen3-MoE's sparse MLP block): softmax
 * top-k routing and the weighted sum of the chosen SwiGLU experts. nn.h gives the contract
 * (weight layout, tie rule, summation order); the loops here are the plain version every
 * other backend is checked against. */
#include "nn/nn.h"

#include <math.h>
#include <string.h>

void nn_moe_route(int32_t *idx, float *wts, float *logits, float *probs, const float *x, const float *w_router, int T,
                  int d, int E, int k, int norm_topk)
{
    nn_matmul(logits, x, w_router, NULL, T, d, E);
    for (int t = 0; t < T; t++) {
        const float *lg = logits + (size_t)t * E;
        float *p = probs + (size_t)t * E;
        int32_t *ix = idx + (size_t)t * k;
        float *w = wts + (size_t)t * k;
        float mx = lg[0], sum = 0.0f;
        for (int e = 1; e < E; e++)
            mx = lg[e] > mx ? lg[e] : mx;
        for (int e = 0; e < E; e++) {
            p[e] = expf(lg[e] - mx);
            sum += p[e];
        }
        for (int e = 0; e < E; e++)
            p[e] /= sum;
        /* k passes of "the largest not yet taken": strict > keeps the lower index on a tie */
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j && !taken; i++)
                    taken = ix[i] == e;
                if (!taken && (best < 0 || p[e] > p[best]))
                    best = e;
            }
            ix[j] = best;
            w[j] = p[best];
        }
        if (norm_topk) {
            float s = 0.0f;
            for (int j = 0; j < k; j++)
                s += w[j];
            for (int j = 0; j < k; j++)
                w[j] /= s;
        }
    }
}

size_t nn_moe_scratch_floats(int T, int d, int F)
{
    /* gathered rows [T, d], gate and up [T, F] each, expert output [T, d], row weights [T] */
    return (size_t)T * (2 * (size_t)d + 2 * (size_t)F + 1);
}

void nn_moe_experts(float *out, const float *x, const int32_t *idx, const float *wts, const float *w_gate,
                    const float *w_up, const float *w_down, int T, int d, int F, int E, int k, float *scratch,
                    int32_t *rows)
{
    float *xg = scratch, *g = xg + (size_t)T * d, *u = g + (size_t)T * F, *y = u + (size_t)T * F;
    float *rw = y + (size_t)T * d;
    memset(out, 0, sizeof(float) * (size_t)T * d);
    /* experts in ascending order, so each token's k terms are added in ascending expert
     * order whatever order the router listed them in */
    for (int e = 0; e < E; e++) {
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < k; j++)
                if (idx[(size_t)t * k + j] == e) {
                    rows[n] = t;
                    rw[n] = wts[(size_t)t * k + j];
                    memcpy(xg + (size_t)n * d, x + (size_t)t * d, sizeof(float) * d);
                    n++;
                    break; /* an expert appears at most once in a token's top k */
                }
        if (!n)
            continue;
        size_t fd = (size_t)F * d;
        nn_matmul(g, xg, w_gate + e * fd, NULL, n, d, F);
        nn_matmul(u, xg, w_up + e * fd, NULL, n, d, F);
        nn_swiglu(g, g, u, (long)n * F);
        nn_matmul(y, g, w_down + e * fd, NULL, n, F, d);
        for (int r = 0; r < n; r++) {
            float *o = out + (size_t)rows[r] * d;
            const float *yr = y + (size_t)r * d;
            for (int i = 0; i < d; i++)
                o[i] += rw[r] * yr[i];
        }
    }
}
