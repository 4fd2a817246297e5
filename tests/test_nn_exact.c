/* test_nn_exact: the optimised CPU layers of common/nn (only allowed keys visited, four
 * keys / outputs / terms side by side) give exactly the bits of the plain loops they
 * replaced (tests/nn_plain.h), on fresh random inputs every run (NN_EXACT_SEED=N replays):
 *  - nn_key_spans against a loop over every key, for random, overlapping, reversed,
 *    touching, out-of-bounds and empty ranges;
 *  - nn_attention and nn_attention_backward with random shapes (GQA groups, odd head
 *    sizes, key counts that are not multiples of 4), random ranges of every kind above,
 *    queries that see nothing, and values with large spread;
 *  - nn_matmul and nn_matmul_backward (dx, dw, dbias) with random shapes (some wide enough
 *    to be computed in several tiles), gradients with exact zeros (whole rows, single
 *    entries, -0.0) and accumulation into non-zero buffers.
 * All of it at every vector level this CPU has (nn_isa_set: the baseline and AVX copies of
 * the loops), each against the plain loops; and nn_isa_set refuses what it must.
 * Any differing element fails with its index and both values. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn.h"
#include "nn/nn_backward.h"
#include "test_helpers.h"
#include "tests/nn_plain.h"
#include "util.h"

static df_rng g_rng;

static int rnd(int lo, int hi) /* [lo, hi] */
{
    return lo + (int)df_rng_below(&g_rng, (uint64_t)(hi - lo + 1));
}

static float *rnd_buf(size_t n, double scale)
{
    float *p = malloc(sizeof(float) * (n ? n : 1));
    T_ASSERT(p);
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(scale * df_rng_normal(&g_rng));
    return p;
}

static void same(const float *got, const float *ref, size_t n, const char *what, int iter)
{
    if (memcmp(got, ref, n * sizeof(float)) == 0)
        return;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &ref[i], sizeof(float)) != 0) {
            fprintf(stderr, "iteration %d: %s: element %zu of %zu is %.9g, the plain loop gives %.9g\n", iter, what, i,
                    n, got[i], ref[i]);
            exit(1);
        }
}

static nn_key_ranges rnd_range(int Tk)
{
    nn_key_ranges r;
    switch (rnd(0, 5)) {
    case 0: r = (nn_key_ranges){0, rnd(0, Tk), 0, 0}; break; /* causal prefix */
    case 1: {
        int a = rnd(0, Tk);
        r = (nn_key_ranges){0, a, a, a + rnd(0, 6)};
    } break; /* context + block, touching */
    case 2: r = (nn_key_ranges){rnd(-3, Tk), rnd(-3, Tk + 3), rnd(-3, Tk), rnd(-3, Tk + 3)}; break; /* anything */
    case 3: {
        int a = rnd(0, Tk), b = rnd(0, Tk);
        r = (nn_key_ranges){b, b + rnd(1, 8), 0, a};
    } break;                                        /* reversed */
    case 4: r = (nn_key_ranges){0, 0, 0, 0}; break; /* sees nothing */
    default: {
        int a = rnd(0, Tk);
        r = (nn_key_ranges){0, a + 3, a, a + rnd(1, 9)};
    } break; /* overlapping */
    }
    return r;
}

static void test_spans(void)
{
    for (int it = 0; it < 20000; it++) {
        int Tk = rnd(0, 40);
        nn_key_ranges r = rnd_range(Tk);
        int lo[2], hi[2], want[64], got[64], nw = 0, ng = 0;
        int n = nn_key_spans(&r, Tk, lo, hi);
        T_ASSERT(n >= 0 && n <= 2);
        for (int k = 0; k < Tk; k++) /* what a loop over every key visits */
            if (plain_in_ranges(&r, k))
                want[nw++] = k;
        for (int q = 0; q < n; q++) {
            T_ASSERT(lo[q] < hi[q] && lo[q] >= 0 && hi[q] <= Tk);
            T_ASSERT(q == 0 || lo[q] > hi[q - 1]); /* disjoint, ascending, not touching */
            for (int k = lo[q]; k < hi[q]; k++)
                got[ng++] = k;
        }
        T_ASSERT(ng == nw && memcmp(got, want, sizeof(int) * (size_t)nw) == 0);
    }
    printf("ok: nn_key_spans lists exactly the allowed keys in ascending order (20000 random ranges)\n");
}

static void test_attention(void)
{
    long elems = 0;
    for (int it = 0; it < 60; it++) {
        int KV = rnd(1, 3), H = KV * rnd(1, 3), hd = rnd(1, 40), Tq = rnd(1, 30), Tk = rnd(1, 70);
        float scale = (float)(0.2 + df_rng_uniform(&g_rng));
        double spread = it % 3 == 0 ? 4.0 : 1.0;
        float *q = rnd_buf((size_t)Tq * H * hd, spread), *k = rnd_buf((size_t)Tk * KV * hd, spread),
              *v = rnd_buf((size_t)Tk * KV * hd, 1.0), *dout = rnd_buf((size_t)Tq * H * hd, 1.0);
        nn_key_ranges *rg = malloc(sizeof *rg * (size_t)Tq);
        T_ASSERT(rg);
        for (int t = 0; t < Tq; t++)
            rg[t] = rnd_range(Tk);
        size_t nq = (size_t)Tq * H * hd, nk = (size_t)Tk * KV * hd;
        float *o1 = malloc(sizeof(float) * nq), *o2 = malloc(sizeof(float) * nq);
        T_ASSERT(o1 && o2);
        nn_attention(o1, q, k, v, rg, Tq, Tk, H, KV, hd, scale);
        plain_attention(o2, q, k, v, rg, Tq, Tk, H, KV, hd, scale);
        same(o1, o2, nq, "nn_attention", it);
        /* backward, accumulating into the same random starting buffers */
        float *dq1 = rnd_buf(nq, 0.1), *dk1 = rnd_buf(nk, 0.1), *dv1 = rnd_buf(nk, 0.1);
        float *dq2 = malloc(sizeof(float) * nq), *dk2 = malloc(sizeof(float) * nk), *dv2 = malloc(sizeof(float) * nk);
        T_ASSERT(dq2 && dk2 && dv2);
        memcpy(dq2, dq1, sizeof(float) * nq);
        memcpy(dk2, dk1, sizeof(float) * nk);
        memcpy(dv2, dv1, sizeof(float) * nk);
        int which = rnd(0, 3); /* sometimes leave one gradient out (NULL) */
        nn_attention_backward(which == 1 ? NULL : dq1, which == 2 ? NULL : dk1, which == 3 ? NULL : dv1, dout, q, k, v,
                              rg, Tq, Tk, H, KV, hd, scale);
        plain_attention_backward(which == 1 ? NULL : dq2, which == 2 ? NULL : dk2, which == 3 ? NULL : dv2, dout, q, k,
                                 v, rg, Tq, Tk, H, KV, hd, scale);
        same(dq1, dq2, nq, "nn_attention_backward dq", it);
        same(dk1, dk2, nk, "nn_attention_backward dk", it);
        same(dv1, dv2, nk, "nn_attention_backward dv", it);
        elems += (long)(2 * nq + 2 * nk);
        free(q), free(k), free(v), free(dout), free(rg), free(o1), free(o2);
        free(dq1), free(dk1), free(dv1), free(dq2), free(dk2), free(dv2);
    }
    printf("ok: nn_attention and its backward == the plain loops bit for bit (60 random shapes, %ld values)\n", elems);
}

static void zero_some(float *g, int T, int n)
{
    for (int t = 0; t < T; t++) {
        int mode = rnd(0, 3);
        for (int o = 0; o < n; o++) {
            float *e = &g[(long)t * n + o];
            if (mode == 0)
                *e = 0.0f; /* a whole row without gradient */
            else if (mode == 1 && rnd(0, 3) == 0)
                *e = rnd(0, 1) ? 0.0f : -0.0f;
        }
    }
}

static void test_matmul(void)
{
    long elems = 0;
    for (int it = 0; it < 80; it++) {
        int T = rnd(1, 13), n_in = rnd(1, 70), n_out = rnd(1, 23);
        if (it % 8 == 7) /* rows wide enough that the weight rows go in several L1 tiles (nn_tile_rows) */
            T = rnd(1, 6), n_in = rnd(700, 1300), n_out = rnd(9, 40);
        float *x = rnd_buf((size_t)T * n_in, 1.0), *w = rnd_buf((size_t)n_out * n_in, 1.0),
              *b = it % 2 ? rnd_buf((size_t)n_out, 1.0) : NULL;
        size_t no = (size_t)T * n_out, nx = (size_t)T * n_in, nw = (size_t)n_out * n_in;
        float *o1 = malloc(sizeof(float) * no), *o2 = malloc(sizeof(float) * no);
        T_ASSERT(o1 && o2);
        nn_matmul(o1, x, w, b, T, n_in, n_out);
        plain_matmul(o2, x, w, b, T, n_in, n_out);
        same(o1, o2, no, "nn_matmul", it);
        float *g = rnd_buf(no, 1.0);
        zero_some(g, T, n_out);
        float *dx1 = rnd_buf(nx, 0.1), *dw1 = rnd_buf(nw, 0.1), *db1 = rnd_buf((size_t)n_out, 0.1);
        if (it % 4 == 0) /* -0.0 starting values: adding a skipped zero term would flip them */
            for (size_t i = 0; i < nw; i++)
                dw1[i] = -0.0f;
        float *dx2 = malloc(sizeof(float) * nx), *dw2 = malloc(sizeof(float) * nw),
              *db2 = malloc(sizeof(float) * n_out);
        T_ASSERT(dx2 && dw2 && db2);
        memcpy(dx2, dx1, sizeof(float) * nx);
        memcpy(dw2, dw1, sizeof(float) * nw);
        memcpy(db2, db1, sizeof(float) * n_out);
        int which = rnd(0, 3);
        nn_matmul_backward(which == 1 ? NULL : dx1, which == 2 ? NULL : dw1, which == 3 ? NULL : db1, g, x, w, T, n_in,
                           n_out);
        plain_matmul_backward(which == 1 ? NULL : dx2, which == 2 ? NULL : dw2, which == 3 ? NULL : db2, g, x, w, T,
                              n_in, n_out);
        same(dx1, dx2, nx, "nn_matmul_backward dx", it);
        same(dw1, dw2, nw, "nn_matmul_backward dw", it);
        same(db1, db2, (size_t)n_out, "nn_matmul_backward dbias", it);
        elems += (long)(no + nx + nw + n_out);
        free(x), free(w), free(b), free(o1), free(o2), free(g);
        free(dx1), free(dw1), free(db1), free(dx2), free(dw2), free(db2);
    }
    printf("ok: nn_matmul and its backward == the plain loops bit for bit (80 random shapes, zero and -0.0 "
           "gradients, %ld values)\n",
           elems);
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        printf("usage: %s\nThe optimised CPU layers against the plain loops, bit for bit. NN_EXACT_SEED=N replays.\n",
               argv[0]);
        return strcmp(argv[1], "--help") ? 2 : 0;
    }
    const char *env = getenv("NN_EXACT_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : df_now_ns();
    printf("seed %llu (NN_EXACT_SEED=%llu replays)\n", (unsigned long long)seed, (unsigned long long)seed);
    T_ASSERT(nn_isa_set(-1) == -EINVAL && nn_isa_set(NN_ISA_COUNT) == -EINVAL);
    T_ASSERT(strcmp(nn_isa_name(NN_ISA_AVX), "avx") == 0 && strcmp(nn_isa_name(NN_ISA_COUNT), "?") == 0);
    int levels = 0, start = nn_isa();
    for (int isa = 0; isa < NN_ISA_COUNT; isa++) {
        if (!nn_isa_supported(isa)) {
            T_ASSERT(nn_isa_set(isa) == -ENOTSUP);
            printf("vector level %s: not on this CPU, skipped\n", nn_isa_name(isa));
            continue;
        }
        T_ASSERT(nn_isa_set(isa) >= 0 && nn_isa() == isa);
        printf("vector level %s:\n", nn_isa_name(isa));
        df_rng_seed(&g_rng, seed + (uint64_t)isa); /* fresh inputs for each level */
        test_spans();
        test_attention();
        test_matmul();
        levels++;
    }
    nn_isa_set(start);
    printf("test_nn_exact: all passed (%d vector level%s)\n", levels, levels == 1 ? "" : "s");
    return 0;
}
