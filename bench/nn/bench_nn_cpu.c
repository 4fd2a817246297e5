/* bench_nn_cpu: the CPU layers of common/nn against the plain loops they replaced
 * (tests/nn_plain.h: one output, one key, one term at a time), in the same process, at the
 * shapes of the embedded default (configs/tiny.json: d = 128, I = 384, 4 heads of 32, 2 kv
 * heads): the target's packed causal forward over a 1024-token batch, and the drafter's
 * training step over 32 anchors x block 16 = 512 block rows against 512 context rows; plus
 * one linear layer at a real model's width (64 tokens x 2048 -> 2048, Qwen3-1.7B's o_proj).
 * Ours runs at every vector level this CPU has (nn_isa_set: base = the x86-64 baseline, avx),
 * each checked to give the plain loops' bits (test_nn_exact checks it widely).
 * Prints a table (median ms of --iters runs, GFLOP/s, speedups) and writes JSON (date, host,
 * cpus, commit, every figure) to --out (default bench/results/nn_cpu.json).
 *   build/bench/bench_nn_cpu [--iters N] [--out PATH] */
#include <getopt.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nn/nn.h"
#include "nn/nn_backward.h"
#include "tests/nn_plain.h"
#include "util.h"
#include "bench/bench_env.h"

enum { D = 128, I = 384, H = 4, KV = 2, HD = 32, T_TGT = 1024, S_CTX = 512, N_ANCH = 32, BLK = 16 };
enum { R_BLK = N_ANCH * BLK, T_KEYS = S_CTX + R_BLK, MAX_ITERS = 200, NROWS = 6 };
enum { T_WIDE = 64, D_WIDE = 2048 }; /* the wide linear: [T_WIDE, D_WIDE] x [D_WIDE -> D_WIDE] */

static df_rng g_rng;

static float *buf(size_t n, double scale)
{
    float *p = malloc(sizeof(float) * n);
    if (!p) {
        fprintf(stderr, "bench_nn_cpu: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(scale * df_rng_normal(&g_rng));
    return p;
}

static double now_ms(void)
{
    return (double)df_now_ns() * 1e-6;
}

typedef struct inputs {
    float *x, *w, *out, *g, *dx, *dw;             /* linear: x [T_TGT, D], w [I, D] */
    float *xw, *ww, *outw;                        /* the wide linear */
    float *q, *k, *v, *att, *datt, *dq, *dk, *dv; /* attention */
    nn_key_ranges *causal;                        /* [T_TGT]: 4 packed documents of 256 */
    nn_key_ranges *dflash;                        /* [R_BLK]: context before the anchor + own block */
    float *qb, *kb, *vb, *attb;                   /* drafter attention: R_BLK queries over T_KEYS keys */
} inputs;

typedef struct row {
    const char *name, *key;
    double flops;                           /* per call */
    double ms_ours[NN_ISA_COUNT], ms_plain; /* ms_ours: 0 for a level this CPU lacks */
    int same[NN_ISA_COUNT];
} row;

/* the layer calls, ours (plain = 0) or the plain loops (plain = 1) */
static void call(int which, int plain, inputs *in)
{
    switch (which) {
    case 0: (plain ? plain_matmul : nn_matmul)(in->out, in->x, in->w, NULL, T_TGT, D, I); break;
    case 1:
        memset(in->dx, 0, sizeof(float) * T_TGT * D);
        memset(in->dw, 0, sizeof(float) * I * D);
        (plain ? plain_matmul_backward : nn_matmul_backward)(in->dx, in->dw, NULL, in->g, in->x, in->w, T_TGT, D, I);
        break;
    case 2:
        (plain ? plain_attention : nn_attention)(in->att, in->q, in->k, in->v, in->causal, T_TGT, T_TGT, H, KV, HD,
                                                 0.17677669f);
        break;
    case 3:
        (plain ? plain_attention : nn_attention)(in->attb, in->qb, in->kb, in->vb, in->dflash, R_BLK, T_KEYS, H, KV, HD,
                                                 0.17677669f);
        break;
    case 4:
        memset(in->dq, 0, sizeof(float) * R_BLK * H * HD);
        memset(in->dk, 0, sizeof(float) * T_KEYS * KV * HD);
        memset(in->dv, 0, sizeof(float) * T_KEYS * KV * HD);
        (plain ? plain_attention_backward : nn_attention_backward)(in->dq, in->dk, in->dv, in->datt, in->qb, in->kb,
                                                                   in->vb, in->dflash, R_BLK, T_KEYS, H, KV, HD,
                                                                   0.17677669f);
        break;
    case 5: (plain ? plain_matmul : nn_matmul)(in->outw, in->xw, in->ww, NULL, T_WIDE, D_WIDE, D_WIDE); break;
    }
}

/* the call's result, to compare ours with the plain loops */
static size_t result(int which, inputs *in, float **parts, size_t *sizes)
{
    switch (which) {
    case 0: parts[0] = in->out, sizes[0] = (size_t)T_TGT * I; return 1;
    case 1: parts[0] = in->dx, sizes[0] = (size_t)T_TGT * D, parts[1] = in->dw, sizes[1] = (size_t)I * D; return 2;
    case 2: parts[0] = in->att, sizes[0] = (size_t)T_TGT * H * HD; return 1;
    case 3: parts[0] = in->attb, sizes[0] = (size_t)R_BLK * H * HD; return 1;
    case 5: parts[0] = in->outw, sizes[0] = (size_t)T_WIDE * D_WIDE; return 1;
    default:
        parts[0] = in->dq, sizes[0] = (size_t)R_BLK * H * HD;
        parts[1] = in->dk, sizes[1] = (size_t)T_KEYS * KV * HD;
        parts[2] = in->dv, sizes[2] = (size_t)T_KEYS * KV * HD;
        return 3;
    }
}

static double time_it(int which, int plain, inputs *in, int iters)
{
    double t[MAX_ITERS];
    call(which, plain, in); /* warm */
    for (int i = 0; i < iters; i++) {
        double t0 = now_ms();
        call(which, plain, in);
        t[i] = now_ms() - t0;
    }
    return bench_median(t, iters);
}

int main(int argc, char **argv)
{
    int iters = 15;
    const char *out = "bench/results/nn_cpu.json";
    static const struct option lo[] = {{"iters", 1, 0, 'i'}, {"out", 1, 0, 'o'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (ch == 'i')
            iters = (int)df_arg_int("bench_nn_cpu", "--iters", optarg, 1, INT_MAX);
        else if (ch == 'o')
            out = optarg;
        else if (ch == 'h') {
            printf("usage: %s [--iters N] [--out PATH]\nThe CPU layers against the plain loops at the embedded "
                   "default's shapes (one core).\n",
                   argv[0]);
            return 0;
        } else
            return 2;
    }
    if (iters < 1 || iters > MAX_ITERS) {
        fprintf(stderr, "bench_nn_cpu: --iters must be 1..%d\n", MAX_ITERS);
        return 2;
    }
    df_rng_seed(&g_rng, 12345);
    inputs in;
    in.x = buf((size_t)T_TGT * D, 1), in.w = buf((size_t)I * D, 0.1), in.out = buf((size_t)T_TGT * I, 0);
    in.g = buf((size_t)T_TGT * I, 1), in.dx = buf((size_t)T_TGT * D, 0), in.dw = buf((size_t)I * D, 0);
    in.q = buf((size_t)T_TGT * H * HD, 1), in.k = buf((size_t)T_TGT * KV * HD, 1),
    in.v = buf((size_t)T_TGT * KV * HD, 1);
    in.att = buf((size_t)T_TGT * H * HD, 0);
    in.qb = buf((size_t)R_BLK * H * HD, 1), in.kb = buf((size_t)T_KEYS * KV * HD, 1),
    in.vb = buf((size_t)T_KEYS * KV * HD, 1), in.attb = buf((size_t)R_BLK * H * HD, 0);
    in.datt = buf((size_t)R_BLK * H * HD, 1), in.dq = buf((size_t)R_BLK * H * HD, 0);
    in.xw = buf((size_t)T_WIDE * D_WIDE, 1), in.ww = buf((size_t)D_WIDE * D_WIDE, 0.02);
    in.outw = buf((size_t)T_WIDE * D_WIDE, 0);
    in.dk = buf((size_t)T_KEYS * KV * HD, 0), in.dv = buf((size_t)T_KEYS * KV * HD, 0);
    in.causal = malloc(sizeof(nn_key_ranges) * T_TGT);
    in.dflash = malloc(sizeof(nn_key_ranges) * R_BLK);
    if (!in.causal || !in.dflash)
        return 1;
    int32_t starts[5] = {0, 256, 512, 768, 1024};
    nn_packed_causal_ranges(in.causal, NULL, starts, 4);
    double causal_keys = 0, dflash_keys = 0;
    for (int t = 0; t < T_TGT; t++)
        causal_keys += in.causal[t].hi0 - in.causal[t].lo0;
    for (int j = 0; j < N_ANCH; j++) { /* sorted anchors spread over the context */
        int a = (int)((long)(j + 1) * (S_CTX - 1) / (N_ANCH + 1));
        for (int b = 0; b < BLK; b++) {
            in.dflash[j * BLK + b] = (nn_key_ranges){0, a, S_CTX + j * BLK, S_CTX + (j + 1) * BLK};
            dflash_keys += a + BLK;
        }
    }
    row rows[NROWS] = {
        {"linear fwd [1024x128]x[128->384]", "linear_fwd", 2.0 * T_TGT * D * I, {0}, 0, {0}},
        {"linear bwd (dx + dw)", "linear_bwd", 4.0 * T_TGT * D * I, {0}, 0, {0}},
        {"attention fwd, target (4 docs x 256, causal)", "attn_fwd_target", 4.0 * causal_keys * H * HD, {0}, 0, {0}},
        {"attention fwd, drafter (512 block rows)", "attn_fwd_drafter", 4.0 * dflash_keys * H * HD, {0}, 0, {0}},
        {"attention bwd, drafter", "attn_bwd_drafter", 8.0 * dflash_keys * H * HD, {0}, 0, {0}},
        {"linear fwd [64x2048]x[2048->2048] (wide)", "linear_fwd_wide", 2.0 * T_WIDE * D_WIDE * D_WIDE, {0}, 0, {0}},
    };
    bench_env env;
    bench_env_read(&env);
    int best = nn_isa();
    printf("bench_nn_cpu  (%s, %ld cpus, commit %s): one core, medians of %d calls; ours at each vector level this "
           "CPU has (the default here: %s); peer = the plain loops (tests/nn_plain.h)\n\n",
           env.host, env.cpus, env.commit, iters, nn_isa_name(best));
    printf("%-46s %8s %8s %9s %9s %10s %8s %8s %5s\n", "layer", "base ms", "avx ms", "plain ms", "best GF/s",
           "plain GF/s", "avx/base", "vs plain", "same");
    for (int r = 0; r < NROWS; r++) {
        float *parts[3], *copy[3];
        size_t sizes[3];
        call(r, 1, &in);
        size_t np = result(r, &in, parts, sizes);
        for (size_t p = 0; p < np; p++) {
            copy[p] = malloc(sizeof(float) * sizes[p]);
            if (!copy[p])
                return 1;
            memcpy(copy[p], parts[p], sizeof(float) * sizes[p]);
        }
        for (int isa = 0; isa < NN_ISA_COUNT; isa++) {
            rows[r].same[isa] = 1;
            if (nn_isa_set(isa) < 0)
                continue; /* not on this CPU */
            call(r, 0, &in);
            for (size_t p = 0; p < np; p++)
                rows[r].same[isa] &= memcmp(copy[p], parts[p], sizeof(float) * sizes[p]) == 0;
            rows[r].ms_ours[isa] = time_it(r, 0, &in, iters);
        }
        nn_isa_set(best);
        for (size_t p = 0; p < np; p++)
            free(copy[p]);
        rows[r].ms_plain = time_it(r, 1, &in, iters);
        row *w = &rows[r];
        double ours = w->ms_ours[best];
        char avx[16] = "-", ratio[16] = "-";
        if (w->ms_ours[NN_ISA_AVX] > 0) {
            snprintf(avx, sizeof avx, "%.2f", w->ms_ours[NN_ISA_AVX]);
            snprintf(ratio, sizeof ratio, "%.2fx", w->ms_ours[NN_ISA_BASE] / w->ms_ours[NN_ISA_AVX]);
        }
        printf("%-46s %8.2f %8s %9.2f %9.2f %10.2f %8s %7.2fx %5s\n", w->name, w->ms_ours[NN_ISA_BASE], avx,
               w->ms_plain, w->flops / ours * 1e-6, w->flops / w->ms_plain * 1e-6, ratio, w->ms_plain / ours,
               w->same[NN_ISA_BASE] && w->same[NN_ISA_AVX] ? "yes" : "NO");
        fflush(stdout);
    }
    char json[4096];
    int k = snprintf(
        json, sizeof json,
        "{\n  \"bench\": \"nn_cpu\",\n  \"date\": \"%s\",\n  \"host\": \"%s\",\n  \"cpus\": %ld,\n"
        "  \"commit\": \"%s\",\n  \"iters\": %d,\n  \"shape\": {\"d\": %d, \"intermediate\": %d, \"heads\": %d, "
        "\"kv_heads\": %d, \"head_dim\": %d, \"target_tokens\": %d, \"drafter_context\": %d, "
        "\"drafter_block_rows\": %d, \"wide_linear\": [%d, %d, %d]},\n  \"isa\": \"%s\",\n"
        "  \"peer\": \"the plain loops of tests/nn_plain.h\",\n  \"layers\": [\n",
        env.date, env.host, env.cpus, env.commit, iters, D, I, H, KV, HD, T_TGT, S_CTX, R_BLK, T_WIDE, D_WIDE, D_WIDE,
        nn_isa_name(best));
    for (int r = 0; r < NROWS && k > 0 && (size_t)k < sizeof json; r++) {
        row *w = &rows[r];
        double ours = w->ms_ours[best];
        k += snprintf(json + k, sizeof json - (size_t)k,
                      "    {\"layer\": \"%s\", \"flops\": %.0f, \"base_ms\": %.4f, \"avx_ms\": %.4f, \"ours_ms\": "
                      "%.4f, \"plain_ms\": %.4f, \"ours_gflops\": %.3f, \"plain_gflops\": %.3f, \"speedup\": %.3f, "
                      "\"same_bits\": %s}%s\n",
                      w->key, w->flops, w->ms_ours[NN_ISA_BASE], w->ms_ours[NN_ISA_AVX], ours, w->ms_plain,
                      w->flops / ours * 1e-6, w->flops / w->ms_plain * 1e-6, w->ms_plain / ours,
                      w->same[NN_ISA_BASE] && w->same[NN_ISA_AVX] ? "true" : "false", r < NROWS - 1 ? "," : "");
    }
    if (k > 0 && (size_t)k < sizeof json)
        k += snprintf(json + k, sizeof json - (size_t)k, "  ]\n}\n");
    if (k <= 0 || (size_t)k >= sizeof json) {
        fprintf(stderr, "bench_nn_cpu: JSON too long\n");
        return 1;
    }
    int rc = df_write_file_atomic(out, json, (size_t)k);
    if (rc < 0) {
        fprintf(stderr, "bench_nn_cpu: %s: %s\n", out, strerror(-rc));
        return 1;
    }
    printf("\nwrote %s\n", out);
    float *bufs[] = {in.x,  in.w,  in.out,  in.g,    in.dx, in.dw, in.q,  in.k,  in.v,  in.att, in.qb,
                     in.kb, in.vb, in.attb, in.datt, in.dq, in.dk, in.dv, in.xw, in.ww, in.outw};
    for (size_t b = 0; b < sizeof bufs / sizeof bufs[0]; b++)
        free(bufs[b]);
    free(in.causal);
    free(in.dflash);
    int all_same = 1;
    for (int r = 0; r < NROWS; r++)
        all_same &= rows[r].same[NN_ISA_BASE] && rows[r].same[NN_ISA_AVX];
    return all_same ? 0 : 1;
}
