/* test_nn_backward.c: finite-difference checks of every backward layer in
 * common/nn/nn_backward.h on fresh random inputs (seed from the clock, printed; set
 * NN_SEED to replay). Objective per layer: L = sum(out * R) for a random R, so dout = R.
 * Central differences in fp32 with a step of 1e-2 and tolerances relative to the
 * gradient's scale; every input and weight gradient is checked on every element. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn.h"
#include "nn/nn_backward.h"
#include "test_helpers.h"
#include "util.h"

static df_rng g_rng;

static float *randv(long n, float s)
{
    float *v = malloc(sizeof(float) * (size_t)n);
    T_ASSERT(v);
    for (long i = 0; i < n; i++)
        v[i] = (float)(s * df_rng_normal(&g_rng));
    return v;
}
static float *zeros(long n)
{
    float *v = calloc((size_t)n, sizeof(float));
    T_ASSERT(v);
    return v;
}

/* the layer under test, evaluated into out; the objective is sum(out * R) */
typedef void (*fwd_fn)(float *out, void *ctx);
static double objective(fwd_fn f, void *ctx, float *out, const float *R, long n_out)
{
    f(out, ctx);
    double s = 0;
    for (long i = 0; i < n_out; i++)
        s += (double)out[i] * R[i];
    return s;
}

static int g_checked;
static void check_grad(const char *what, fwd_fn f, void *ctx, float *out, const float *R, long n_out, float *x,
                       const float *g, long n, double eps)
{
    double gmax = 0;
    for (long i = 0; i < n; i++)
        gmax = fmax(gmax, fabs(g[i]));
    double worst = 0;
    for (long i = 0; i < n; i++) {
        float x0 = x[i];
        x[i] = x0 + (float)eps;
        double lp = objective(f, ctx, out, R, n_out);
        x[i] = x0 - (float)eps;
        double lm = objective(f, ctx, out, R, n_out);
        x[i] = x0;
        double fd = (lp - lm) / (2 * eps);
        double err = fabs(fd - g[i]) / (1e-3 * gmax + 2e-2 * fabs(fd) + 1e-4);
        if (err > worst)
            worst = err;
        if (err > 1.0) {
            fprintf(stderr, "%s[%ld]: analytic %.6g vs finite difference %.6g (scale %.3g)\n", what, i, g[i], fd, gmax);
            exit(1);
        }
        g_checked++;
    }
    printf("  %-22s %5ld elements, worst err/tol %.3f, |g|max %.3g\n", what, n, worst, gmax);
}

/* ---- matmul ---- */
typedef struct {
    float *x, *w, *b;
    int T, ni, no;
} mm_ctx;
static void mm_fwd(float *out, void *c_)
{
    mm_ctx *c = c_;
    nn_matmul(out, c->x, c->w, c->b, c->T, c->ni, c->no);
}
static void test_matmul(void)
{
    mm_ctx c = {randv(5 * 7, 1), randv(6 * 7, 1), randv(6, 1), 5, 7, 6};
    float *out = zeros(30), *R = randv(30, 1), *dx = zeros(35), *dw = zeros(42), *db = zeros(6);
    nn_matmul_backward(dx, dw, db, R, c.x, c.w, c.T, c.ni, c.no);
    check_grad("matmul dx", mm_fwd, &c, out, R, 30, c.x, dx, 35, 1e-2);
    check_grad("matmul dw", mm_fwd, &c, out, R, 30, c.w, dw, 42, 1e-2);
    check_grad("matmul dbias", mm_fwd, &c, out, R, 30, c.b, db, 6, 1e-2);
    /* accumulation contract: a second call adds the same amount again */
    float dx0 = dx[3];
    nn_matmul_backward(dx, NULL, NULL, R, c.x, c.w, c.T, c.ni, c.no);
    T_ASSERT(fabsf(dx[3] - 2 * dx0) <= 1e-5f * fabsf(dx0) + 1e-6f);
    free(c.x), free(c.w), free(c.b), free(out), free(R), free(dx), free(dw), free(db);
}

/* ---- rmsnorm ---- */
typedef struct {
    float *x, *w;
    int T, C;
} rn_ctx;
static void rn_fwd(float *out, void *c_)
{
    rn_ctx *c = c_;
    nn_rmsnorm(out, c->x, c->w, c->T, c->C, 1e-6f);
}
static void test_rmsnorm(void)
{
    rn_ctx c = {randv(4 * 16, 1.5f), randv(16, 1), 4, 16};
    float *out = zeros(64), *R = randv(64, 1), *dx = zeros(64), *dw = zeros(16);
    nn_rmsnorm_backward(dx, dw, R, c.x, c.w, c.T, c.C, 1e-6f);
    check_grad("rmsnorm dx", rn_fwd, &c, out, R, 64, c.x, dx, 64, 1e-2);
    check_grad("rmsnorm dw", rn_fwd, &c, out, R, 64, c.w, dw, 16, 1e-2);
    free(c.x), free(c.w), free(out), free(R), free(dx), free(dw);
}

/* ---- rope ---- */
typedef struct {
    float *x;
    int32_t pos[5];
    float inv[4];
} rp_ctx;
static void rp_fwd(float *out, void *c_)
{
    rp_ctx *c = c_;
    memcpy(out, c->x, sizeof(float) * 5 * 2 * 8);
    nn_rope(out, c->pos, 5, 2, 8, c->inv);
}
static void test_rope(void)
{
    rp_ctx c;
    c.x = randv(80, 1);
    for (int i = 0; i < 5; i++)
        c.pos[i] = (int32_t)df_rng_below(&g_rng, 3000);
    nn_rope_inv_freq(c.inv, 8, 1e4, NULL);
    float *out = zeros(80), *R = randv(80, 1), *dx = zeros(80);
    memcpy(dx, R, sizeof(float) * 80);
    nn_rope_backward(dx, c.pos, 5, 2, 8, c.inv);
    check_grad("rope dx", rp_fwd, &c, out, R, 80, c.x, dx, 80, 1e-2);
    free(c.x), free(out), free(R), free(dx);
}

/* ---- swiglu ---- */
typedef struct {
    float *g, *u;
} sw_ctx;
static void sw_fwd(float *out, void *c_)
{
    sw_ctx *c = c_;
    nn_swiglu(out, c->g, c->u, 40);
}
static void test_swiglu(void)
{
    sw_ctx c = {randv(40, 3), randv(40, 1)};
    float *out = zeros(40), *R = randv(40, 1), *dg = zeros(40), *du = zeros(40);
    nn_swiglu_backward(dg, du, R, c.g, c.u, 40);
    check_grad("swiglu dgate", sw_fwd, &c, out, R, 40, c.g, dg, 40, 1e-2);
    check_grad("swiglu dup", sw_fwd, &c, out, R, 40, c.u, du, 40, 1e-2);
    free(c.g), free(c.u), free(out), free(R), free(dg), free(du);
}

/* ---- attention (GQA, two ranges per query, one empty query) ---- */
enum { ATQ = 6, ATK = 9, ATH = 4, ATKV = 2, ATD = 8 };
typedef struct {
    float *q, *k, *v;
    nn_key_ranges r[ATQ];
} at_ctx;
static void at_fwd(float *out, void *c_)
{
    at_ctx *c = c_;
    nn_attention(out, c->q, c->k, c->v, c->r, ATQ, ATK, ATH, ATKV, ATD, 0.35f);
}
static void test_attention(void)
{
    at_ctx c = {randv(ATQ * ATH * ATD, 1), randv(ATK * ATKV * ATD, 1), randv(ATK * ATKV * ATD, 1), {{0}}};
    for (int t = 0; t < ATQ; t++)
        c.r[t] = (nn_key_ranges){0, 1 + t % 4, 5, 5 + t % 3};
    c.r[2] = (nn_key_ranges){0, 0, 0, 0}; /* padding query */
    long no = ATQ * ATH * ATD, nk = ATK * ATKV * ATD;
    float *out = zeros(no), *R = randv(no, 1), *dq = zeros(no), *dk = zeros(nk), *dv = zeros(nk);
    nn_attention_backward(dq, dk, dv, R, c.q, c.k, c.v, c.r, ATQ, ATK, ATH, ATKV, ATD, 0.35f);
    at_fwd(out, &c);
    for (int i = 0; i < ATH * ATD; i++) {
        T_ASSERT(out[2 * ATH * ATD + i] == 0.0f);
        T_ASSERT(dq[2 * ATH * ATD + i] == 0.0f);
    }
    check_grad("attention dq", at_fwd, &c, out, R, no, c.q, dq, no, 1e-2);
    check_grad("attention dk", at_fwd, &c, out, R, no, c.k, dk, nk, 1e-2);
    check_grad("attention dv", at_fwd, &c, out, R, no, c.v, dv, nk, 1e-2);
    free(c.q), free(c.k), free(c.v), free(out), free(R), free(dq), free(dk), free(dv);
}

int main(void)
{
    uint64_t seed = getenv("NN_SEED") ? strtoull(getenv("NN_SEED"), NULL, 0) : (uint64_t)time(NULL);
    printf("test_nn_backward: seed %llu (NN_SEED=%llu replays)\n", (unsigned long long)seed, (unsigned long long)seed);
    df_rng_seed(&g_rng, seed);
    test_matmul();
    test_rmsnorm();
    test_rope();
    test_swiglu();
    test_attention();
    printf("test_nn_backward: OK (%d gradient elements checked)\n", g_checked);
    return 0;
}
