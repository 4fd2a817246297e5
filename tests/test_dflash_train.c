/* test_dflash_train.c: the drafter learns, and the optimizer does what it says.
 *  - 200 AdamW steps on a synthetic task where the target features carry the answer
 *    (feature row p holds the embeddings of x[p+2] and x[p+4], so the rows before an
 *    anchor reveal the block's next tokens): loss falls by > 50%, accuracy rises;
 *  - the LR schedule (warmup, peak, cosine, floor), global-norm clipping (pre-clip norm
 *    reported, post-clip norm = clip), decoupled weight decay only on marked segments,
 *    a NaN gradient skipped;
 *  - determinism: two runs give bit-identical losses and weights. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dflash/adamw.h"
#include "dflash/dflash_batch.h"
#include "dflash/dflash_config.h"
#include "dflash/dflash_model.h"
#include "test_helpers.h"
#include "util.h"

enum { S = 40, NA = 8, STEPS = 200 };

typedef struct run_result {
    double loss_first, loss_last, acc_first, acc_last;
    float *weights;
    double losses[STEPS];
} run_result;

/* One synthetic sequence for a step: random tokens (never the mask token), prompt of 4,
 * features = embeddings of the tokens 2 and 4 ahead (scaled), plus small noise. */
static void make_sequence(const dflash_config *c, const float *E, uint64_t id, int32_t *x, uint8_t *lm, float *H)
{
    df_rng r;
    df_rng_seed(&r, 1000 + id);
    int d = c->hidden;
    for (int i = 0; i < S; i++) {
        x[i] = (int32_t)df_rng_below(&r, (uint64_t)c->vocab - 1);
        lm[i] = i >= 4;
    }
    for (int p = 0; p < S; p++) {
        for (int ch = 0; ch < c->n_capture; ch++) {
            int q = p + 2 + 2 * ch; /* row a-1 holds x[a+1], x[a+3]; row a-2 x[a+2] */
            for (int e = 0; e < d; e++)
                H[((long)p * c->n_capture + ch) * d + e] = q < S ? 4.0f * E[(long)x[q] * d + e] : 0.0f;
        }
    }
}

static void train(run_result *out)
{
    dflash_config c;
    dflash_config_tiny(&c);
    int d = c.hidden, V = c.vocab;
    float *E = malloc(sizeof(float) * V * d), *H = malloc(sizeof(float) * S * c.n_capture * d);
    T_ASSERT(E && H);
    df_rng r;
    df_rng_seed(&r, 42);
    for (long i = 0; i < (long)V * d; i++)
        E[i] = (float)(df_rng_normal(&r) / sqrt(d));
    dflash_frozen fz = {E, E};
    dflash_params p, g;
    T_ASSERT_RC(dflash_params_alloc(&p, &c));
    T_ASSERT_RC(dflash_params_alloc(&g, &c));
    dflash_params_init_random(&p, &c, 7, 0.05f);
    adamw_config oc;
    adamw_config_default(&oc, STEPS);
    oc.lr = 3e-3;
    oc.warmup_frac = 0.05;
    oc.weight_decay = 0.01;
    adamw opt;
    T_ASSERT_RC(adamw_init(&opt, &oc, p.n));
    adamw_segment segs[3 + 11 * DFLASH_MAX_LAYERS];
    int nseg = dflash_decay_segments(&c, segs, (int)DF_ARRAY_LEN(segs));
    dflash_acts a = {0};
    int32_t x[S];
    uint8_t lm[S];
    dflash_stats win = {0};
    int clipped = 0;
    for (int step = 0; step < STEPS; step++) {
        make_sequence(&c, E, (uint64_t)step, x, lm, H);
        dflash_batch b;
        T_ASSERT_RC(dflash_batch_init(&b, &c, S, NA, H, x, lm, 99, (uint64_t)step));
        memset(g.data, 0, sizeof(float) * g.n);
        dflash_stats st;
        T_ASSERT_RC(dflash_loss_and_grad(&c, &p, &fz, &b, &a, &g, 0, 16, &st));
        adamw_info info;
        T_ASSERT_RC(adamw_step(&opt, p.data, g.data, segs, nseg, &info));
        T_ASSERT(!info.skipped && isfinite(st.loss));
        clipped += info.clip_scale < 1.0;
        out->losses[step] = st.loss;
        dflash_stats_merge(&win, &st);
        if (step == 19 || step == STEPS - 1) { /* 20-step windows: first and last */
            double acc = dflash_stats_acc(&win, 1);
            if (step == 19)
                out->loss_first = win.loss, out->acc_first = acc;
            else
                out->loss_last = win.loss, out->acc_last = acc;
            printf("  steps %3d-%3d: loss %.4f acc_1 %.3f acc_2 %.3f acc_3 %.3f tau %.3f lr %.2e |g| %.3f\n", step - 19,
                   step, win.loss, acc, dflash_stats_acc(&win, 2), dflash_stats_acc(&win, 3),
                   dflash_stats_tau(&win, c.block_size), info.lr, info.grad_norm);
        }
        if (step == STEPS - 21)
            memset(&win, 0, sizeof(win));
        dflash_batch_free(&b);
    }
    T_ASSERT(clipped > 0); /* the early steps' norms exceed 1.0 */
    out->weights = malloc(sizeof(float) * p.n);
    T_ASSERT(out->weights);
    memcpy(out->weights, p.data, sizeof(float) * p.n);
    dflash_acts_free(&a);
    adamw_free(&opt);
    dflash_params_free(&p);
    dflash_params_free(&g);
    free(E);
    free(H);
}

static void test_schedule_and_clip(void)
{
    adamw_config c;
    adamw_config_default(&c, 100);
    c.lr = 1.0;
    c.min_lr = 0.1;
    c.warmup_frac = 0.1; /* 10 warmup steps */
    T_ASSERT(fabs(adamw_lr(&c, 0) - 0.1) < 1e-12);
    T_ASSERT(fabs(adamw_lr(&c, 4) - 0.5) < 1e-12);
    T_ASSERT(fabs(adamw_lr(&c, 9) - 1.0) < 1e-12);
    T_ASSERT(fabs(adamw_lr(&c, 10) - 1.0) < 1e-12);
    T_ASSERT(fabs(adamw_lr(&c, 55) - 0.55) < 1e-12); /* half way: (1 + 0.1) / 2 */
    T_ASSERT(fabs(adamw_lr(&c, 100) - 0.1) < 1e-12);
    T_ASSERT(fabs(adamw_lr(&c, 500) - 0.1) < 1e-12);
    printf("  lr schedule: warmup 0.1..1.0 over 10 steps, cosine to min_lr 0.1 (0.55 half way)\n");
    /* clipping: norm reported before the clip, gradients scaled to clip_norm */
    adamw o;
    c.clip_norm = 1.0;
    c.weight_decay = 0.5;
    T_ASSERT_RC(adamw_init(&o, &c, 4));
    float p[4] = {1, 1, 1, 1}, g[4] = {3, 4, 0, 0};
    adamw_segment seg = {2, 1}; /* decay only element 2 */
    adamw_info info;
    T_ASSERT_RC(adamw_step(&o, p, g, &seg, 1, &info));
    T_ASSERT(fabs(info.grad_norm - 5.0) < 1e-9 && fabs(adamw_global_norm(g, 4) - 1.0) < 1e-5);
    /* first Adam step moves each element with nonzero gradient by ~lr; decay only on 2 */
    T_ASSERT(fabs(p[0] - (1 - 0.1)) < 1e-5 && fabs(p[1] - (1 - 0.1)) < 1e-5);
    T_ASSERT(fabsf(p[2] - (float)(1.0 - 0.1 * 0.5)) < 1e-6 && p[3] == 1.0f);
    printf("  clip: pre-clip norm 5 reported, gradients scaled to norm 1; decay only on marked segments\n");
    float gn[4] = {NAN, 0, 0, 0}, before[4];
    memcpy(before, p, sizeof(p));
    T_ASSERT_RC(adamw_step(&o, p, gn, &seg, 1, &info));
    T_ASSERT(info.skipped && o.step == 1 && memcmp(before, p, sizeof(p)) == 0);
    printf("  a NaN gradient is skipped without touching weights or moments\n");
    adamw_free(&o);
}

int main(void)
{
    printf("test_dflash_train:\n");
    test_schedule_and_clip();
    run_result r1, r2;
    train(&r1);
    T_ASSERT(r1.loss_last < 0.5 * r1.loss_first);
    T_ASSERT(r1.acc_last > r1.acc_first + 0.2);
    printf("  loss %.4f -> %.4f (%.0f%% lower), acc_1 %.3f -> %.3f\n", r1.loss_first, r1.loss_last,
           100 * (1 - r1.loss_last / r1.loss_first), r1.acc_first, r1.acc_last);
    train(&r2);
    T_ASSERT(memcmp(r1.losses, r2.losses, sizeof(r1.losses)) == 0);
    dflash_config c;
    dflash_config_tiny(&c);
    T_ASSERT(memcmp(r1.weights, r2.weights, sizeof(float) * dflash_config_param_count(&c)) == 0);
    printf("  determinism: a second run has bit-identical losses and weights\n");
    free(r1.weights);
    free(r2.weights);
    printf("test_dflash_train: OK\n");
    return 0;
}
