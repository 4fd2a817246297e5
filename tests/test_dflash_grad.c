/* test_dflash_grad.c: the DFlash drafter's gradient and every training rule of
 * docs/dflash_spec.md, on a tiny model (d=32, H=4, KV=2, hd=8, I=64, V=50, B=4, S=24, N=4,
 * 2 captured layers, 2 layers: full + sliding W=8).
 *  - finite differences of the WHOLE loss w.r.t. every parameter kind (largest-gradient
 *    elements, random elements, and the directional derivative along the gradient) and
 *    w.r.t. the captured features H;
 *  - mask: strict "< anchor" (the anchor's own feature row is invisible to its block),
 *    blocks independent, padding blocks exact zeros and no effect on loss/gradients,
 *    sliding window and in-block causality;
 *  - labels unshifted, loss weights, anchor sampling, chunked loss == unchunked reference;
 *  - D-PACE: the position weights against their definition written as plain sums (gaps stop
 *    a block, padding, alpha = 1, bad alpha refused); the gradient is the one of the loss with
 *    the weights frozen at the current point (detached): equal to the decay path's gradient
 *    with those weights, and to finite differences of that frozen loss (not of the D-PACE
 *    loss itself, whose weights move with the parameters: tests/reference/dflash_torch.py
 *    shows the two apart on its fixture).
 * Seed from the clock (printed; DFLASH_SEED replays). */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dflash/dflash_batch.h"
#include "dflash/dflash_config.h"
#include "dflash/dflash_loss.h"
#include "dflash/dflash_model.h"
#include "nn/nn.h"
#include "test_helpers.h"
#include "util.h"

enum { S = 24, NA = 4 };
static df_rng g_rng;
static dflash_config C;
static float *E, *Hf;
static int32_t X[S];
static uint8_t LM[S];
static dflash_frozen FZ;

static void fill(float *v, long n, float s)
{
    for (long i = 0; i < n; i++)
        v[i] = (float)(s * df_rng_normal(&g_rng));
}

static double eval_loss(const dflash_params *p, const dflash_batch *b, dflash_acts *a)
{
    dflash_stats st;
    T_ASSERT_RC(dflash_loss_and_grad(&C, p, &FZ, b, a, NULL, 0, 64, &st));
    return st.loss;
}

static void setup(void)
{
    dflash_config_tiny(&C);
    long V = C.vocab, d = C.hidden;
    E = malloc(sizeof(float) * V * d);
    Hf = malloc(sizeof(float) * S * C.n_capture * d);
    T_ASSERT(E && Hf);
    fill(E, V * d, 1.0f);
    fill(Hf, (long)S * C.n_capture * d, 1.0f);
    for (int i = 0; i < S; i++) {
        X[i] = (int32_t)df_rng_below(&g_rng, (uint64_t)V - 1);
        LM[i] = i >= 5 && i != 14; /* prompt 0..4, one hole at 14 */
    }
    FZ.embed = E;
    FZ.lm_head = E; /* tied, like Qwen3-4B */
}

static void init_params(dflash_params *p, uint64_t seed)
{
    T_ASSERT_RC(dflash_params_alloc(p, &C));
    dflash_params_init_random(p, &C, seed, 0.15f);
    int nt = dflash_tensor_count(&C);
    for (int i = 0; i < nt; i++) { /* norms away from 1 so their gradients are not special */
        dflash_tensor t;
        dflash_tensor_info(&C, i, &t);
        if (t.is_norm)
            for (size_t e = 0; e < t.numel; e++)
                p->data[t.offset + e] = 1.0f + 0.2f * (float)df_rng_normal(&g_rng);
    }
}

static void make_batch(dflash_batch *b, const int32_t *anchors, const uint8_t *keep, int N)
{
    T_ASSERT_RC(dflash_batch_init(b, &C, S, NA, Hf, X, LM, 1, 1));
    T_ASSERT_RC(dflash_batch_set_anchors(b, &C, anchors, keep, N));
}

/* ---- gradient vs finite differences ------------------------------------------- */

static int fd_ok(double fd, double an, double scale)
{
    return fabs(fd - an) <= 3e-2 * fabs(an) + 2e-3 * scale + 3e-4;
}

static void test_param_grads(void)
{
    dflash_params p, g;
    dflash_acts a = {0};
    dflash_batch b;
    init_params(&p, df_rng_next(&g_rng));
    T_ASSERT_RC(dflash_params_alloc(&g, &C));
    const int32_t anc[NA] = {4, 9, 15, 21};
    const uint8_t keep[NA] = {1, 1, 1, 1};
    make_batch(&b, anc, keep, NA);
    dflash_stats st;
    T_ASSERT_RC(dflash_loss_and_grad(&C, &p, &FZ, &b, &a, &g, 0, 5, &st));
    printf("  loss %.5f over sum(w) %.3f\n", st.loss, st.sum_w);
    T_ASSERT(st.loss > 0 && isfinite(st.loss));
    int nt = dflash_tensor_count(&C), kinds = 0;
    const double eps = 1e-2;
    for (int i = 0; i < nt; i++) {
        dflash_tensor t;
        dflash_tensor_info(&C, i, &t);
        float *w = p.data + t.offset, *gw = g.data + t.offset;
        double gmax = 0, gn2 = 0;
        for (size_t e = 0; e < t.numel; e++) {
            gmax = fmax(gmax, fabs(gw[e]));
            gn2 += (double)gw[e] * gw[e];
        }
        T_ASSERT(gmax > 0); /* every parameter kind receives gradient */
        /* elements: the 3 largest |g| and 3 random */
        size_t pick[6];
        for (int q = 0; q < 3; q++) {
            size_t best = 0;
            double bv = -1;
            for (size_t e = 0; e < t.numel; e++) {
                int used = 0;
                for (int u = 0; u < q; u++)
                    used |= pick[u] == e;
                if (!used && fabs(gw[e]) > bv)
                    bv = fabs(gw[e]), best = e;
            }
            pick[q] = best;
        }
        for (int q = 3; q < 6; q++)
            pick[q] = (size_t)df_rng_below(&g_rng, t.numel);
        for (int q = 0; q < 6; q++) {
            size_t e = pick[q];
            float w0 = w[e];
            w[e] = w0 + (float)eps;
            double lp = eval_loss(&p, &b, &a);
            w[e] = w0 - (float)eps;
            double lm = eval_loss(&p, &b, &a);
            w[e] = w0;
            double fd = (lp - lm) / (2 * eps);
            if (!fd_ok(fd, gw[e], gmax)) {
                fprintf(stderr, "%s[%zu]: analytic %.6g vs finite difference %.6g (max |g| %.3g)\n", t.name, e, gw[e],
                        fd, gmax);
                exit(1);
            }
        }
        /* directional derivative along the gradient: must equal |g| */
        double gn = sqrt(gn2), de = 1e-2;
        float *w0 = malloc(sizeof(float) * t.numel);
        T_ASSERT(w0);
        memcpy(w0, w, sizeof(float) * t.numel);
        for (size_t e = 0; e < t.numel; e++)
            w[e] = w0[e] + (float)(de * gw[e] / gn);
        double lp = eval_loss(&p, &b, &a);
        for (size_t e = 0; e < t.numel; e++)
            w[e] = w0[e] - (float)(de * gw[e] / gn);
        double lm = eval_loss(&p, &b, &a);
        memcpy(w, w0, sizeof(float) * t.numel);
        free(w0);
        double dd = (lp - lm) / (2 * de);
        if (fabs(dd - gn) > 2e-2 * gn + 1e-4) {
            fprintf(stderr, "%s: directional derivative %.6g vs |g| %.6g\n", t.name, dd, gn);
            exit(1);
        }
        if (i < 2 + 11 || i == nt - 1) { /* print fc, hidden_norm, layer 0 and final norm */
            printf("  %-42s |g| %.4g  d/d(g/|g|) %.4g  ok\n", t.name, gn, dd);
        }
        kinds++;
    }
    printf("  parameter gradients: %d tensors checked (every kind, both layers)\n", kinds);
    /* gradient w.r.t. H (the context path through every layer's K/V) */
    long nh = (long)S * C.n_capture * C.hidden;
    float *dH = calloc((size_t)nh, sizeof(float));
    T_ASSERT(dH);
    dflash_params g2;
    T_ASSERT_RC(dflash_params_alloc(&g2, &C));
    T_ASSERT_RC(dflash_loss_and_grad(&C, &p, &FZ, &b, &a, NULL, 0, 64, &st));
    T_ASSERT_RC(dflash_backward(&C, &p, &FZ, &b, &a, a.dz, &g2, dH));
    double hmax = 0;
    for (long i = 0; i < nh; i++)
        hmax = fmax(hmax, fabs(dH[i]));
    T_ASSERT(hmax > 0);
    for (int q = 0; q < 12; q++) {
        long i = (long)df_rng_below(&g_rng, (uint64_t)nh);
        if (q < 2) { /* rows a_j and later than the last anchor must have exactly zero gradient */
            int row = q == 0 ? anc[NA - 1] : S - 1;
            i = (long)row * C.n_capture * C.hidden + (long)df_rng_below(&g_rng, (uint64_t)C.n_capture * C.hidden);
            T_ASSERT(dH[i] == 0.0f);
            continue;
        }
        float h0 = Hf[i];
        Hf[i] = h0 + (float)eps;
        double lp = eval_loss(&p, &b, &a);
        Hf[i] = h0 - (float)eps;
        double lm = eval_loss(&p, &b, &a);
        Hf[i] = h0;
        double fd = (lp - lm) / (2 * eps);
        if (!fd_ok(fd, dH[i], hmax)) {
            fprintf(stderr, "dH[%ld]: analytic %.6g vs finite difference %.6g\n", i, dH[i], fd);
            exit(1);
        }
    }
    printf("  dL/dH: finite differences agree; rows at/after the last anchor get exactly 0\n");
    free(dH);
    dflash_params_free(&g2);
    dflash_params_free(&p);
    dflash_params_free(&g);
    dflash_acts_free(&a);
    dflash_batch_free(&b);
}

/* ---- mask rules -------------------------------------------------------------- */

static int rows_equal(const float *x, const float *y, int r0, int nrows)
{
    return memcmp(x + (long)r0 * C.hidden, y + (long)r0 * C.hidden, sizeof(float) * (size_t)nrows * C.hidden) == 0;
}

static void test_mask(void)
{
    dflash_params p;
    dflash_acts a = {0};
    dflash_batch b;
    init_params(&p, df_rng_next(&g_rng));
    int B = C.block_size, R = NA * B, d = C.hidden;
    const int32_t anc[NA] = {6, 10, 15, 19};
    const uint8_t keep[NA] = {1, 1, 1, 1};
    make_batch(&b, anc, keep, NA);
    float *z0 = malloc(sizeof(float) * R * d), *z1 = malloc(sizeof(float) * R * d);
    T_ASSERT(z0 && z1);
    T_ASSERT_RC(dflash_forward(&C, &p, &FZ, &b, &a));
    memcpy(z0, a.z, sizeof(float) * R * d);
    long hrow = (long)C.n_capture * d;
    /* strict <: H row a_1 = 10 is invisible to block 1 (and to block 0), visible to block 2 */
    float *hsave = malloc(sizeof(float) * (size_t)hrow);
    T_ASSERT(hsave);
    memcpy(hsave, Hf + anc[1] * hrow, sizeof(float) * (size_t)hrow);
    for (long e = 0; e < hrow; e++)
        Hf[anc[1] * hrow + e] += 1.0f;
    T_ASSERT_RC(dflash_forward(&C, &p, &FZ, &b, &a));
    T_ASSERT(rows_equal(z0, a.z, 0, 2 * B));
    T_ASSERT(!rows_equal(z0, a.z, 2 * B, B));
    memcpy(Hf + anc[1] * hrow, hsave, sizeof(float) * (size_t)hrow);
    free(hsave);
    /* row a_1 - 1 IS visible to block 1 */
    float save = Hf[(anc[1] - 1) * hrow];
    Hf[(anc[1] - 1) * hrow] += 1.0f;
    T_ASSERT_RC(dflash_forward(&C, &p, &FZ, &b, &a));
    T_ASSERT(!rows_equal(z0, a.z, B, B));
    Hf[(anc[1] - 1) * hrow] = save;
    printf("  strict < anchor: the anchor's own feature row does not reach its block; row a_j-1 does\n");
    /* blocks independent: change block 2's anchor token, others bit-identical */
    int32_t xs = X[anc[2]];
    X[anc[2]] = (xs + 1) % C.vocab;
    T_ASSERT_RC(dflash_forward(&C, &p, &FZ, &b, &a));
    T_ASSERT(rows_equal(z0, a.z, 0, 2 * B) && rows_equal(z0, a.z, 3 * B, B));
    T_ASSERT(!rows_equal(z0, a.z, 2 * B, B));
    X[anc[2]] = xs;
    printf("  blocks independent: changing block 2's input leaves blocks 0,1,3 bit-identical\n");
    /* padding: add 3 keep=0 slots; attention rows exactly 0, z finite, loss and grads equal */
    dflash_params g1, g2;
    T_ASSERT_RC(dflash_params_alloc(&g1, &C));
    T_ASSERT_RC(dflash_params_alloc(&g2, &C));
    dflash_stats s1, s2;
    T_ASSERT_RC(dflash_loss_and_grad(&C, &p, &FZ, &b, &a, &g1, 0, 7, &s1));
    int32_t anc_p[NA + 3] = {6, 10, 15, 19, 0, 0, 0};
    uint8_t keep_p[NA + 3] = {1, 1, 1, 1, 0, 0, 0};
    dflash_batch bp;
    make_batch(&bp, anc_p, keep_p, NA + 3);
    T_ASSERT_RC(dflash_loss_and_grad(&C, &p, &FZ, &bp, &a, &g2, 0, 7, &s2));
    int qd = C.n_heads * C.head_dim;
    for (int l = 0; l < C.n_layers; l++)
        for (long i = (long)R * qd; i < (long)(R + 3 * B) * qd; i++)
            T_ASSERT(a.layer[l].att[i] == 0.0f);
    for (long i = 0; i < (long)(R + 3 * B) * d; i++)
        T_ASSERT(isfinite(a.z[i]));
    T_ASSERT(s1.loss == s2.loss);
    for (size_t i = 0; i < g1.n; i++)
        T_ASSERT(g1.data[i] == g2.data[i]);
    printf("  padding blocks: attention output exactly 0, no NaN, loss and gradients bit-identical\n");
    dflash_batch_free(&bp);
    dflash_params_free(&g1);
    dflash_params_free(&g2);

    /* sliding window (W=3, every layer sliding): context kv >= a + k - 2, causal in block */
    dflash_config full = C;
    C.layer_sliding[0] = C.layer_sliding[1] = 1;
    C.sliding_window = 3;
    T_ASSERT_RC(dflash_forward(&C, &p, &FZ, &b, &a));
    memcpy(z0, a.z, sizeof(float) * R * d);
    memcpy(z1, a.layer[1].h_in, sizeof(float) * R * d);
    /* block 3 (anchor 19), query k=1 (pos 20) sees context 18 only (>= 18, < 19); k=0 sees 17,18 */
    save = Hf[17 * hrow];
    Hf[17 * hrow] += 1.0f;
    T_ASSERT_RC(dflash_forward(&C, &p, &FZ, &b, &a));
    /* after layer 0 (deeper layers pass row 0's view on to rows k >= 1 through the block) */
    T_ASSERT(!rows_equal(z1, a.layer[1].h_in, 3 * B + 0, 1)); /* k=0: 17 >= 19+0-2 visible */
    T_ASSERT(rows_equal(z1, a.layer[1].h_in, 3 * B + 1, 3));  /* k>=1: 17 < 19+k-2: outside */
    Hf[17 * hrow] = save;
    /* causality inside the block: the mask token's embedding feeds rows k >= 1 only; with
     * causal blocks row k=0 cannot see it */
    float em = E[(long)C.mask_token_id * d];
    E[(long)C.mask_token_id * d] += 1.0f;
    T_ASSERT_RC(dflash_forward(&C, &p, &FZ, &b, &a));
    for (int j = 0; j < NA; j++)
        T_ASSERT(rows_equal(z0, a.z, j * B, 1) && !rows_equal(z0, a.z, j * B + 1, 1));
    C = full; /* full attention: row 0 sees the block's mask rows (bidirectional) */
    T_ASSERT_RC(dflash_forward(&C, &p, &FZ, &b, &a));
    memcpy(z1, a.z, sizeof(float) * R * d);
    E[(long)C.mask_token_id * d] = em;
    T_ASSERT_RC(dflash_forward(&C, &p, &FZ, &b, &a));
    T_ASSERT(!rows_equal(z1, a.z, 0, 1));
    printf("  sliding: window bound a+k-(W-1) and in-block causality hold; full blocks are bidirectional\n");
    /* the range table itself */
    nn_key_ranges r[NA * 4];
    dflash_mask_ranges(r, anc, keep, NA, B, S, 0);
    T_ASSERT(r[B + 2].lo0 == 0 && r[B + 2].hi0 == 10 && r[B + 2].lo1 == S + B && r[B + 2].hi1 == S + 2 * B);
    dflash_mask_ranges(r, anc, keep, NA, B, S, 8);
    T_ASSERT(r[B + 2].lo0 == 10 + 2 - 7 && r[B + 2].hi0 == 10 && r[B + 2].hi1 == S + B + 3);
    free(z0);
    free(z1);
    dflash_params_free(&p);
    dflash_acts_free(&a);
    dflash_batch_free(&b);
}

/* ---- labels, weights, anchors, chunked loss ----------------------------------- */

static void test_labels_anchors_loss(void)
{
    int B = C.block_size;
    dflash_batch b;
    const int32_t anc[NA] = {5, 12, 13, 22};
    const uint8_t keep[NA] = {1, 1, 1, 0};
    make_batch(&b, anc, keep, NA);
    double sw = 0;
    for (int j = 0; j < NA; j++) {
        for (int k = 0; k < B; k++) {
            int p = anc[j] + k;
            int32_t lab = b.labels[j * B + k];
            float w = b.weights[j * B + k];
            if (k == 0 || !keep[j] || p >= S) {
                T_ASSERT(lab == -1 && w == 0.0f);
                continue;
            }
            T_ASSERT(lab == X[p]); /* no shift: slot k predicts x[a+k] */
            float want = LM[p] ? (float)exp(-(double)(k - 1) / C.gamma) : 0.0f;
            T_ASSERT(w == want);
            sw += w;
        }
    }
    T_ASSERT(b.weights[1 * B + 2] == 0.0f); /* anchor 12 + 2 = 14: the loss_mask hole */
    T_ASSERT(fabs(sw - b.sum_w) < 1e-9);
    T_ASSERT(fabs(dflash_default_gamma(16) - 7) < 1e-12 && dflash_default_gamma(8) == 4);
    printf("  labels x[a+k] unshifted, k=0/padding/past-end/prompt weights 0, decay exp(-(k-1)/%.1f)\n", C.gamma);
    /* anchors: valid candidates, sorted, unique, N = min(num, #cand), deterministic */
    int32_t a1[64], a2[64];
    uint8_t k1[64], k2[64];
    int n1 = dflash_sample_anchors(a1, k1, 64, LM, S, 7, 3);
    int n2 = dflash_sample_anchors(a2, k2, 64, LM, S, 7, 3);
    int ncand = 0;
    for (int p = 0; p + 1 < S; p++)
        ncand += LM[p] && LM[p + 1];
    T_ASSERT(n1 == ncand && n2 == n1 && memcmp(a1, a2, sizeof(a1)) == 0);
    T_ASSERT(!k1[n1] && a1[n1] == 0);
    n1 = dflash_sample_anchors(a1, k1, 5, LM, S, 7, 3);
    n2 = dflash_sample_anchors(a2, k2, 5, LM, S, 7, 4);
    T_ASSERT(n1 == 5 && n2 == 5 && memcmp(a1, a2, sizeof(int32_t) * 5) != 0);
    for (int j = 0; j < 5; j++) {
        T_ASSERT(LM[a1[j]] && LM[a1[j] + 1] && a1[j] + 1 < S);
        T_ASSERT(j == 0 || a1[j] > a1[j - 1]);
    }
    printf("  anchors: candidates only, sorted, unique, min(N,#cand), (seed,batch_id)-deterministic\n");
    /* chunked loss equals an unchunked reference (loss, dz) and is independent of the chunk */
    int rows = NA * B, d = C.hidden, V = C.vocab;
    float *z = malloc(sizeof(float) * rows * d), *dz1 = malloc(sizeof(float) * rows * d),
          *dz2 = malloc(sizeof(float) * rows * d), *lg = malloc(sizeof(float) * rows * V);
    T_ASSERT(z && dz1 && dz2 && lg);
    fill(z, (long)rows * d, 1.0f);
    dflash_stats s1, s2;
    T_ASSERT_RC(dflash_loss_chunked(dz1, z, E, b.labels, b.weights, rows, d, V, B, 64, 0, &s1));
    T_ASSERT_RC(dflash_loss_chunked(dz2, z, E, b.labels, b.weights, rows, d, V, B, 1, 0, &s2));
    T_ASSERT(s1.loss == s2.loss && memcmp(dz1, dz2, sizeof(float) * rows * d) == 0);
    nn_matmul(lg, z, E, NULL, rows, d, V); /* reference: all logits at once */
    double wce = 0, sumw = 0;
    for (int r = 0; r < rows; r++) {
        if (b.weights[r] <= 0)
            continue;
        double mx = -INFINITY, se = 0;
        for (int v = 0; v < V; v++)
            mx = fmax(mx, lg[r * V + v]);
        for (int v = 0; v < V; v++)
            se += exp(lg[r * V + v] - mx);
        wce += b.weights[r] * (mx + log(se) - lg[r * V + b.labels[r]]);
        sumw += b.weights[r];
        for (int e = 0; e < d; e++) { /* dz = sum_v (p_v - [v=y]) w/sum(w) W[v] (sum(w) below) */
            double acc = 0;
            for (int v = 0; v < V; v++)
                acc += (exp(lg[r * V + v] - mx) / se - (v == b.labels[r])) * E[(long)v * d + e];
            dz2[r * d + e] = (float)(acc * b.weights[r]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int e = 0; e < d && b.weights[r] > 0; e++)
            T_ASSERT(fabs(dz2[r * d + e] / sumw - dz1[r * d + e]) <= 1e-5 * (fabs(dz1[r * d + e]) + 1e-2));
    T_ASSERT(fabs(s1.loss - wce / sumw) <= 1e-6 * fabs(s1.loss));
    for (int r = 0; r < rows; r++)
        if (b.weights[r] <= 0)
            for (int e = 0; e < d; e++)
                T_ASSERT(dz1[r * d + e] == 0.0f);
    /* dz against finite differences of the loss in z */
    for (int q = 0; q < 8; q++) {
        int r = 1 + (int)df_rng_below(&g_rng, 3), e = (int)df_rng_below(&g_rng, (uint64_t)d);
        float z0 = z[r * d + e];
        dflash_stats sp, sm;
        z[r * d + e] = z0 + 1e-2f;
        T_ASSERT_RC(dflash_loss_chunked(NULL, z, E, b.labels, b.weights, rows, d, V, B, 3, 0, &sp));
        z[r * d + e] = z0 - 1e-2f;
        T_ASSERT_RC(dflash_loss_chunked(NULL, z, E, b.labels, b.weights, rows, d, V, B, 3, 0, &sm));
        z[r * d + e] = z0;
        double fd = (sp.loss - sm.loss) / 2e-2;
        T_ASSERT(fabs(fd - dz1[r * d + e]) <= 2e-2 * fabs(fd) + 1e-4);
    }
    /* stats: counts per position, tau from accuracies */
    T_ASSERT(s1.count[0] == 0 && s1.count[1] == 2 && s1.count[2] == 2); /* 14 is a hole */
    dflash_stats t = {0};
    t.count[1] = t.count[2] = t.count[3] = 10;
    t.correct[1] = 8, t.correct[2] = 5, t.correct[3] = 10;
    T_ASSERT(fabs(dflash_stats_tau(&t, 4) - (1 + 0.8 + 0.4 + 0.4)) < 1e-12);
    printf("  chunked loss == all-logits reference (%.6f), chunk-size independent, dz matches FD\n", s1.loss);
    free(z), free(dz1), free(dz2), free(lg);
    dflash_batch_free(&b);
}

/* ---- D-PACE ------------------------------------------------------------------- */

/* u_k by the definition: the sum over m = k..L of prod_{i=1..m} ((1-alpha) e^{-ce_i} + alpha),
 * L the last position before the block's first non-loss one (O(B^2) products, no reuse) */
static double dpace_def(const double *ce, const float *mask, int r0, int B, double alpha, int k)
{
    int L = 0;
    while (L + 1 < B && mask[r0 + L + 1] > 0)
        L++;
    if (k < 1 || k > L)
        return 0.0;
    double u = 0;
    for (int m = k; m <= L; m++) {
        double prod = 1;
        for (int i = 1; i <= m; i++)
            prod *= (1 - alpha) * exp(-ce[r0 + i]) + alpha;
        u += prod;
    }
    return u;
}

static void test_dpace_rule(void)
{
    enum { BB = 6, NB = 5, RR = BB * NB };
    /* block 0 every position; 1 a gap at k = 3 (4 and 5 are loss positions after it); 2
     * padding; 3 no loss position at k = 1 (2.. are); 4 the sequence ends after k = 2 */
    static const uint8_t m[NB][BB] = {
        {0, 1, 1, 1, 1, 1}, {0, 1, 1, 0, 1, 1}, {0, 0, 0, 0, 0, 0}, {0, 0, 1, 1, 1, 1}, {0, 1, 1, 0, 0, 0}};
    static const int L[NB] = {5, 2, 0, 0, 2};
    double ce[RR], wd[RR];
    float mask[RR];
    for (int r = 0; r < RR; r++) {
        mask[r] = m[r / BB][r % BB] ? (float)(0.3 + r % 4) : 0.0f; /* any positive weight marks a loss row */
        ce[r] = mask[r] > 0 ? 4.0 * df_rng_uniform(&g_rng) : NAN;  /* non-loss CEs must never be read */
    }
    const double alphas[] = {0.5, 0.3, 0.9, 1e-3, 1.0};
    for (size_t ai = 0; ai < DF_ARRAY_LEN(alphas); ai++) {
        double al = alphas[ai];
        T_ASSERT(dflash_dpace_weights(wd, ce, mask, RR, BB, al) == 3);
        for (int r = 0; r < RR; r++) {
            int j = r / BB, k = r % BB;
            double want = dpace_def(ce, mask, j * BB, BB, al, k);
            T_ASSERT(isfinite(wd[r]) && fabs(wd[r] - want) <= 1e-12 * want);
            T_ASSERT((wd[r] > 0) == (k >= 1 && k <= L[j]));
            if (al == 1.0) /* no confidence left: the positions still ahead in the run */
                T_ASSERT(wd[r] == (k >= 1 && k <= L[j] ? L[j] - k + 1 : 0));
            if (k >= 2 && k <= L[j]) /* u_{k-1} - u_k = P_{k-1} > 0 */
                T_ASSERT(wd[r - 1] > wd[r]);
        }
    }
    const double bad[] = {0.0, -0.25, 1.0000001, NAN};
    for (size_t i = 0; i < DF_ARRAY_LEN(bad); i++)
        T_ASSERT(dflash_dpace_weights(wd, ce, mask, RR, BB, bad[i]) == -EINVAL);
    T_ASSERT(dflash_loss_norm(DFLASH_LOSS_DPACE, mask, RR, BB) == 3);
    double sm = 0;
    for (int r = 0; r < RR; r++)
        sm += mask[r];
    T_ASSERT(dflash_loss_norm(DFLASH_LOSS_DECAY, mask, RR, BB) == sm);
    dflash_config cc;
    char e[256];
    dflash_config_tiny(&cc);
    cc.loss = DFLASH_LOSS_DPACE;
    cc.dpace_alpha = 0;
    T_ASSERT(dflash_config_validate(&cc, e, sizeof e) == -EINVAL && strstr(e, "dpace_alpha"));
    printf("  D-PACE weights == their definition (alpha 0.5/0.3/0.9/1e-3/1), gaps stop a block, padding 0, "
           "alpha = 1 gives run lengths, alpha 0 / > 1 / NaN refused\n");
}

/* sum(w CE) / norm with the batch's weights replaced by w (the decay path: fixed weights) */
static double frozen_loss(const dflash_params *p, dflash_batch *b, dflash_acts *a, float *w, double norm,
                          dflash_params *g)
{
    dflash_config cd = C;
    cd.loss = DFLASH_LOSS_DECAY;
    float *keep_w = b->weights;
    b->weights = w;
    dflash_stats st;
    T_ASSERT_RC(dflash_loss_and_grad(&cd, p, &FZ, b, a, g, norm, 64, &st));
    b->weights = keep_w;
    return st.loss;
}

static void test_dpace_grad(void)
{
    dflash_config saved = C;
    C.loss = DFLASH_LOSS_DPACE;
    C.dpace_alpha = 0.4;
    int B = C.block_size, R = NA * B, d = C.hidden;
    dflash_params p, g, g1, gf;
    dflash_acts a = {0};
    dflash_batch b;
    init_params(&p, df_rng_next(&g_rng));
    T_ASSERT_RC(dflash_params_alloc(&g, &C));
    T_ASSERT_RC(dflash_params_alloc(&g1, &C));
    T_ASSERT_RC(dflash_params_alloc(&gf, &C));
    /* anchor 12: 13, then the hole at 14 stops the block (15 is a loss position, weight 0);
     * anchor 21: 24 is past the end */
    const int32_t anc[NA] = {4, 9, 12, 21};
    const uint8_t keep[NA] = {1, 1, 1, 1};
    make_batch(&b, anc, keep, NA);
    dflash_stats st, s1;
    T_ASSERT_RC(dflash_loss_and_grad(&C, &p, &FZ, &b, &a, &g, 0, 64, &st));
    T_ASSERT(st.sum_w == 4 && st.loss > 0 && isfinite(st.loss));
    T_ASSERT(b.weights[2 * B + 3] > 0); /* position 15: a loss position ... */
    for (int e = 0; e < d; e++)         /* ... after the block's gap: no gradient */
        T_ASSERT(a.dz[(2 * B + 3) * d + e] == 0.0f);
    /* chunking changes nothing, bit for bit */
    T_ASSERT_RC(dflash_loss_and_grad(&C, &p, &FZ, &b, &a, &g1, 0, 1, &s1));
    T_ASSERT(s1.loss == st.loss && memcmp(g.data, g1.data, sizeof(float) * g.n) == 0);
    /* the weights of this point; with them frozen, the decay path gives the same loss and gradient */
    float *u = malloc(sizeof(float) * (size_t)R);
    T_ASSERT(u);
    T_ASSERT_RC(dflash_forward(&C, &p, &FZ, &b, &a));
    T_ASSERT_RC(dflash_loss_dpace_chunked(NULL, a.z, FZ.lm_head, b.labels, b.weights, R, d, C.vocab, B, 5,
                                          C.dpace_alpha, 0, u, NULL));
    T_ASSERT(u[2 * B + 3] == 0.0f && u[2 * B + 1] > 0 && u[0] == 0.0f);
    double A = dflash_loss_norm(C.loss, b.weights, R, B);
    T_ASSERT(A == 4);
    double lf = frozen_loss(&p, &b, &a, u, A, &gf);
    double num = 0, den = 0;
    for (size_t i = 0; i < g.n; i++)
        num += ((double)gf.data[i] - g.data[i]) * ((double)gf.data[i] - g.data[i]),
            den += (double)g.data[i] * g.data[i];
    printf("  D-PACE loss %.6f (A = %.0f); frozen-weight loss %.6f; gradient vs frozen-weight gradient rel %.2e\n",
           st.loss, A, lf, sqrt(num / den));
    T_ASSERT(fabs(lf - st.loss) <= 1e-6 * st.loss && sqrt(num / den) < 1e-5);
    /* a given normaliser scales loss and gradient */
    T_ASSERT_RC(dflash_loss_and_grad(&C, &p, &FZ, &b, &a, NULL, 2 * A, 64, &s1));
    T_ASSERT(fabs(s1.loss - st.loss / 2) <= 1e-12 * st.loss);
    /* finite differences of the frozen-weight loss along each tensor's gradient == |g| */
    int nt = dflash_tensor_count(&C);
    double worst = 0;
    for (int i = 0; i < nt; i++) {
        dflash_tensor t;
        dflash_tensor_info(&C, i, &t);
        float *w = p.data + t.offset, *gw = g.data + t.offset;
        double gn = 0;
        for (size_t e = 0; e < t.numel; e++)
            gn += (double)gw[e] * gw[e];
        gn = sqrt(gn);
        T_ASSERT(gn > 0);
        float *w0 = malloc(sizeof(float) * t.numel);
        T_ASSERT(w0);
        memcpy(w0, w, sizeof(float) * t.numel);
        const double de = 1e-2;
        for (size_t e = 0; e < t.numel; e++)
            w[e] = w0[e] + (float)(de * gw[e] / gn);
        double lp = frozen_loss(&p, &b, &a, u, A, NULL);
        for (size_t e = 0; e < t.numel; e++)
            w[e] = w0[e] - (float)(de * gw[e] / gn);
        double lm = frozen_loss(&p, &b, &a, u, A, NULL);
        memcpy(w, w0, sizeof(float) * t.numel);
        free(w0);
        double dd = (lp - lm) / (2 * de);
        if (fabs(dd - gn) > 2e-2 * gn + 1e-4) {
            fprintf(stderr, "D-PACE %s: directional derivative of the frozen-weight loss %.6g vs |g| %.6g\n", t.name,
                    dd, gn);
            exit(1);
        }
        worst = fmax(worst, fabs(dd - gn) / gn);
    }
    printf("  D-PACE gradient == finite differences of the frozen-weight loss, %d tensors (worst rel %.2e)\n", nt,
           worst);
    free(u);
    dflash_params_free(&p);
    dflash_params_free(&g);
    dflash_params_free(&g1);
    dflash_params_free(&gf);
    dflash_acts_free(&a);
    dflash_batch_free(&b);
    C = saved;
}

int main(void)
{
    uint64_t seed = getenv("DFLASH_SEED") ? strtoull(getenv("DFLASH_SEED"), NULL, 0) : (uint64_t)time(NULL);
    printf("test_dflash_grad: seed %llu (DFLASH_SEED replays)\n", (unsigned long long)seed);
    df_rng_seed(&g_rng, seed);
    setup();
    test_labels_anchors_loss();
    test_mask();
    test_param_grads();
    test_dpace_rule();
    test_dpace_grad();
    free(E);
    free(Hf);
    printf("test_dflash_grad: OK\n");
    return 0;
}
