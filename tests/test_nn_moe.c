/* test_nn_moe.c: the CPU mixture-of-experts layer (common/nn/moe.c) against plain loops
 * written here from the definition (double precision, every expert run densely):
 *   - routing: the top-k set and order, the weights with and without norm_topk, the logits
 *   - ties: equal router rows give equal probabilities; the lower expert index wins
 *   - experts: out[t] = sum_j w[t,j] * down_e(silu(gate_e x) * up_e x), rel err < 1e-5
 *   - batch invariance: every token run alone gives the same bits as the batched call
 */
#include "nn/nn.h"
#include "test_helpers.h"
#include "util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static df_rng rng;

static float *randv(size_t n, float scale)
{
    float *v = malloc(sizeof(float) * n);
    T_ASSERT(v);
    for (size_t i = 0; i < n; i++)
        v[i] = scale * (float)(2.0 * df_rng_uniform(&rng) - 1.0);
    return v;
}

typedef struct pe {
    double p;
    int e;
} pe;

static int by_prob_desc(const void *a, const void *b)
{
    const pe *x = a, *y = b;
    if (x->p != y->p)
        return x->p > y->p ? -1 : 1;
    return x->e - y->e;
}

/* the definition: softmax in double, sort by (probability desc, index asc), take k */
static void ref_route(int32_t *idx, double *wts, const float *x, const float *wr, int d, int E, int k, int norm)
{
    pe *v = malloc(sizeof(pe) * (size_t)E);
    T_ASSERT(v);
    double mx = -INFINITY, sum = 0;
    for (int e = 0; e < E; e++) {
        double s = 0;
        for (int i = 0; i < d; i++)
            s += (double)x[i] * wr[(size_t)e * d + i];
        v[e].p = s, v[e].e = e;
        mx = fmax(mx, s);
    }
    for (int e = 0; e < E; e++)
        sum += (v[e].p = exp(v[e].p - mx));
    for (int e = 0; e < E; e++)
        v[e].p /= sum;
    qsort(v, (size_t)E, sizeof *v, by_prob_desc);
    double s = 0;
    for (int j = 0; j < k; j++)
        s += v[j].p;
    for (int j = 0; j < k; j++)
        idx[j] = v[j].e, wts[j] = norm ? v[j].p / s : v[j].p;
    free(v);
}

static void routing(void)
{
    const int T = 37, d = 24, E = 16, k = 4;
    float *x = randv((size_t)T * d, 1.0f), *wr = randv((size_t)E * d, 1.0f);
    float *lg = malloc(sizeof(float) * T * E), *pr = malloc(sizeof(float) * T * E), *w = malloc(sizeof(float) * T * k);
    int32_t *ix = malloc(sizeof(int32_t) * T * k), rix[16];
    double rw[16], maxerr = 0;
    for (int norm = 0; norm < 2; norm++) {
        nn_moe_route(ix, w, lg, pr, x, wr, T, d, E, k, norm);
        for (int t = 0; t < T; t++) {
            ref_route(rix, rw, x + (size_t)t * d, wr, d, E, k, norm);
            double psum = 0;
            for (int e = 0; e < E; e++)
                psum += pr[(size_t)t * E + e];
            T_ASSERT(fabs(psum - 1.0) < 1e-5);
            for (int j = 0; j < k; j++) {
                T_ASSERT(ix[t * k + j] == rix[j]);
                maxerr = fmax(maxerr, fabs(w[t * k + j] - rw[j]) / rw[j]);
            }
            if (norm) {
                double s = 0;
                for (int j = 0; j < k; j++)
                    s += w[t * k + j];
                T_ASSERT(fabs(s - 1.0) < 1e-6);
            }
        }
    }
    T_ASSERT(maxerr < 1e-5);
    /* ties: experts 2, 5 and 9 get the same router row, so equal logits and probabilities;
     * make that row the largest by far: the top 2 must be 2 then 5, and with k = 3, 2, 5, 9 */
    for (int i = 0; i < d; i++)
        wr[2 * d + i] = wr[5 * d + i] = wr[9 * d + i] = 4.0f * x[i];
    nn_moe_route(ix, w, lg, pr, x, wr, 1, d, E, 2, 1);
    T_ASSERT(lg[2] == lg[5] && lg[5] == lg[9] && pr[2] == pr[9]);
    T_ASSERT(ix[0] == 2 && ix[1] == 5 && w[0] == w[1] && w[0] == 0.5f);
    nn_moe_route(ix, w, lg, pr, x, wr, 1, d, E, 3, 1);
    T_ASSERT(ix[0] == 2 && ix[1] == 5 && ix[2] == 9);
    /* k = E: every expert, in descending probability */
    nn_moe_route(ix, w, lg, pr, x, wr, 1, d, E, E, 0);
    for (int j = 1; j < E; j++)
        T_ASSERT(w[j] <= w[j - 1]);
    printf("routing: top-k sets, order and weights (max rel err %.2g), ties to the lower index ok\n", maxerr);
    free(x), free(wr), free(lg), free(pr), free(w), free(ix);
}

static void experts(void)
{
    const int T = 29, d = 40, F = 24, E = 8, k = 3;
    float *x = randv((size_t)T * d, 1.0f), *wr = randv((size_t)E * d, 1.0f);
    float *wg = randv((size_t)E * F * d, 0.3f), *wu = randv((size_t)E * F * d, 0.3f);
    float *wd = randv((size_t)E * d * F, 0.3f);
    float *lg = malloc(sizeof(float) * T * E), *pr = malloc(sizeof(float) * T * E), *w = malloc(sizeof(float) * T * k);
    int32_t *ix = malloc(sizeof(int32_t) * T * k), *rows = malloc(sizeof(int32_t) * T);
    float *scr = malloc(sizeof(float) * nn_moe_scratch_floats(T, d, F));
    float *out = malloc(sizeof(float) * T * d), *one = malloc(sizeof(float) * d);
    nn_moe_route(ix, w, lg, pr, x, wr, T, d, E, k, 1);
    nn_moe_experts(out, x, ix, w, wg, wu, wd, T, d, F, E, k, scr, rows);
    double maxerr = 0, *h = malloc(sizeof(double) * F);
    int used[8] = {0};
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * d;
        for (int i = 0; i < d; i++) {
            double ref = 0, mag = 0;
            for (int j = 0; j < k; j++) {
                int e = ix[t * k + j];
                used[e] = 1;
                for (int f = 0; f < F; f++) {
                    double gs = 0, us = 0;
                    for (int c = 0; c < d; c++) {
                        gs += (double)xt[c] * wg[((size_t)e * F + f) * d + c];
                        us += (double)xt[c] * wu[((size_t)e * F + f) * d + c];
                    }
                    h[f] = gs / (1.0 + exp(-gs)) * us;
                }
                double y = 0;
                for (int f = 0; f < F; f++)
                    y += h[f] * wd[((size_t)e * d + i) * F + f];
                ref += w[t * k + j] * y;
                mag += fabs(w[t * k + j] * y);
            }
            maxerr = fmax(maxerr, fabs(out[(size_t)t * d + i] - ref) / (mag + 1e-3));
        }
    }
    T_ASSERT(maxerr < 1e-5);
    int n_used = 0;
    for (int e = 0; e < E; e++)
        n_used += used[e];
    T_ASSERT(n_used == E); /* the test routes to every expert */
    /* one token at a time: the same bits */
    for (int t = 0; t < T; t++) {
        nn_moe_experts(one, x + (size_t)t * d, ix + t * k, w + t * k, wg, wu, wd, 1, d, F, E, k, scr, rows);
        T_ASSERT(memcmp(one, out + (size_t)t * d, sizeof(float) * d) == 0);
    }
    printf("experts: vs the dense definition (max rel err %.2g), every expert used, one token == batch ok\n", maxerr);
    free(x), free(wr), free(wg), free(wu), free(wd), free(lg), free(pr), free(w), free(ix), free(rows), free(scr);
    free(out), free(one), free(h);
}

int main(void)
{
    df_rng_seed(&rng, 42);
    routing();
    experts();
    printf("test_nn_moe: ok\n");
    return 0;
}
