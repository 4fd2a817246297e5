/* bench_target: tok/s and MFU of the CUDA target forward (target_forward_cuda) at Qwen3-1.7B
 * and Qwen3-8B shapes, random bf16 weights generated on the device (no files).
 *
 * What one measurement is: one packed row of --tokens tokens (default 8192) holding
 * tokens/T documents of T tokens each (T = 2048 and 4096: the same B*T as the
 * transformers peer's batch of B sequences, bench/target/peer_transformers.py), plus a
 * "mixed" layout of uneven documents. Capture layers: the DFlash default for 5 layers,
 * round(1 + i*(L-4)/4); only layers 0..last captured run. The forward is captured in a
 * CUDA graph after one eager call and replayed --iters times between CUDA events; the
 * eager time is reported too. FLOP per docs/performance.md (target_forward_flops_cuda); MFU
 * against a bf16 8192^3 cuBLASLt GEMM measured in the same run (same wrapper).
 * Prints a table, writes JSON (--json, default bench/results/target_ours.json).
 * A watchdog (alarm) ends a hung run with exit 1. Exit 77 without a GPU. In a CPU build
 * (no DF_WITH_CUDA) it only says so and exits 0, so `make bench` stays green there. */
#ifndef DF_WITH_CUDA
#include <stdio.h>
int main(void)
{
    printf("SKIPPED: bench_target needs a CUDA=1 build\n");
    return 0;
}
#else
#include "forward_bench.h"
#include "io/hfconfig.h"
#include "nn/nn_cuda.h"
#include "sha256.h"
#include "target/target_model_cuda.h"
#include "util.h"

#include <cuda_runtime_api.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct shape {
    const char *name;
    int d, L, H, KV, hd, I, V;
} shape;

static const shape SHAPES[] = {
    {"Qwen3-1.7B", 2048, 28, 16, 8, 128, 6144, 151936},
    {"Qwen3-8B", 4096, 36, 32, 8, 128, 12288, 151936},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_target [--json PATH] [--tokens N] [--iters N] [--models 1.7b,8b] [--timeout S]\n"
               "                    [--check PATH] [--breakdown] [--variants LIST] [--doc-len T]\n"
               "  CUDA target forward at Qwen3-1.7B / Qwen3-8B shapes (random weights made on the GPU),\n"
               "  documents of T = 2048 and 4096 tokens packed into one row of N tokens (default 8192),\n"
               "  plus a mixed-length layout; prints a table and writes JSON (default\n"
               "  bench/results/target_ours.json). Exit 77 without a GPU.\n"
               "  --check PATH: write the SHA-256 of the captured output bytes of every layout (after\n"
               "  the eager calls and after the graph replays) to PATH, one line each: two builds run\n"
               "  with the same arguments must write the same file\n"
               "  --breakdown: per layout T = 2048 and 4096, one layer's steps timed one by one (each\n"
               "  GEMM at every cuBLASLt heuristic rank, the attention at every tile shape), with\n"
               "  TFLOP/s, GB/s and %% of the GEMM ceiling\n"
               "  --variants LIST: comma list of kernel choices to time (default: default): default (the\n"
               "  shipped choices), base (64x64 attention tiles, heuristic rank 0), t1 .. t6 (128x64 /\n"
               "  128x32 / wgmma / wgmma serial / wgmma tma / wgmma pingpong attention tiles, rank 0), auto (the\n"
               "  breakdown's fastest per shape); each row\n"
               "  says whether the graph replay gave the eager forward's bits (exit 1 if not) and its\n"
               "  relative L2 distance to the first variant's output\n"
               "  --doc-len T: one layout only, N/T documents of T tokens (N a multiple of T), as a\n"
               "  pipeline's batch of T-token documents is packed (no --breakdown)\n");
}

/* --check: one line "model | layout | when | sha256 of the device bytes" */
static void check_line(FILE *f, const char *model, const char *layout, const char *when, const void *dev, size_t bytes)
{
    void *h = malloc(bytes);
    if (!h) {
        fprintf(stderr, "bench_target: out of host memory for the check copy\n");
        exit(1);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(h, dev, bytes, cudaMemcpyDeviceToHost));
    char hex[65];
    int rc = df_sha256_buf(h, bytes, hex);
    if (rc < 0) {
        fprintf(stderr, "bench_target: sha256 of the check copy: %s\n", strerror(-rc));
        exit(1);
    }
    fprintf(f, "%s | %s | %s | %s\n", model, layout, when, hex);
    printf("check: %s | %s | %s | %s\n", model, layout, when, hex);
    free(h);
}

typedef struct result {
    const char *model, *variant;
    char layout[64], choice[64];
    int T, B, tokens, layers_run, capture[5], bits_same;
    double eager_ms, graph_ms, tok_s, tflops, mfu, gflop_per_token, rel_l2_vs_first;
} result;

/* ---- --breakdown: one layer's steps timed one by one -------------------------------- */

#define BD_REPS 10
typedef struct bd_row {
    const char *model;
    int T;
    char op[48];
    double ms, tflops, gbs, pct;
} bd_row;
static bd_row g_bd[256];
static int g_nbd;
/* the sweep's pick per GEMM (model-independent index: TARGET_GEMM_*) and per-T tile */
static int g_best_rank[4];
static int g_best_tile[2]; /* [0]: T = 2048, [1]: T = 4096 */

static float time_op(cudaStream_t s, int (*op)(void *, cudaStream_t), void *ctx)
{
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    for (int i = 0; i < 2; i++)
        RC_CHECK(op(ctx, s), g_err);
    CUDA_CHECK(cudaEventRecord(e0, s));
    for (int i = 0; i < BD_REPS; i++)
        RC_CHECK(op(ctx, s), g_err);
    CUDA_CHECK(cudaEventRecord(e1, s));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return ms / BD_REPS;
}

typedef struct bd_ctx {
    target_model_cuda *m;
    const target_layer_cuda *L;
    int T, which, rank, tile, post;
    nn_gemm_args_cuda ga;
} bd_ctx;

static int op_norm(void *p, cudaStream_t s)
{
    bd_ctx *c = p;
    target_model_cuda *m = c->m;
    return nn_add_rmsnorm_cuda(m->x, m->y, c->post ? c->L->post_norm : c->L->in_norm, m->a, NULL, 0, c->T, m->d, m->eps,
                               s, g_err, sizeof g_err);
}
static int op_rope(void *p, cudaStream_t s)
{
    bd_ctx *c = p;
    target_model_cuda *m = c->m;
    return nn_qk_norm_rope_cuda(m->qkv, c->L->q_norm, c->L->k_norm, m->inv_freq, m->pos, c->T, m->H, m->KV, m->hd,
                                m->eps, s, g_err, sizeof g_err);
}
static int op_attn(void *p, cudaStream_t s)
{
    bd_ctx *c = p;
    target_model_cuda *m = c->m;
    return nn_attention_packed_tile_cuda(m->att, m->qkv, m->pos, c->T, m->H, m->KV, m->hd, c->L->window,
                                         1.0f / sqrtf((float)m->hd), c->tile, s, g_err, sizeof g_err);
}
static int op_swiglu(void *p, cudaStream_t s)
{
    bd_ctx *c = p;
    return nn_swiglu_cuda(c->m->h, c->m->gu, c->T, c->m->I, s, g_err, sizeof g_err);
}
static int op_gemm(void *p, cudaStream_t s)
{
    bd_ctx *c = p;
    c->ga.algo_rank = c->rank;
    return nn_gemm_run_cuda(c->m->gemm, &c->ga, s, g_err, sizeof g_err);
}

static bd_row *bd_add(const char *model, int T, const char *op, double ms)
{
    if (g_nbd >= (int)DF_ARRAY_LEN(g_bd)) {
        fprintf(stderr, "bench_target: too many breakdown rows\n");
        exit(1);
    }
    bd_row *r = &g_bd[g_nbd++];
    memset(r, 0, sizeof *r);
    r->model = model, r->T = T, r->ms = ms;
    snprintf(r->op, sizeof r->op, "%s", op);
    return r;
}

/* Layer 1 of m (after a forward of this layout: pos, qkv, y are live), each step BD_REPS
 * times between events; every cuBLASLt rank of each GEMM (the sweep) and every attention
 * tile shape. Sets g_best_rank (fastest rank, a later rank only when >= 2% faster than
 * rank 0) and g_best_tile. Prints the table. */
static void breakdown(target_model_cuda *m, const char *model, int Tdoc, int tokens, double ceiling, cudaStream_t s)
{
    const int T = tokens, d = m->d, I = m->I, qkv_n = (m->H + 2 * m->KV) * m->hd, n_docs = tokens / Tdoc;
    const target_layer_cuda *L = &m->layers[1];
    bd_ctx c;
    memset(&c, 0, sizeof c);
    c.m = m, c.L = L, c.T = T;
    double sum_default = 0;
    char op[48];
    printf("\nbreakdown %s, %d docs x %d (one layer, T = %d, each step alone, mean of %d):\n", model, n_docs, Tdoc, T,
           BD_REPS);
    printf("  %-30s %9s %9s %8s %7s\n", "step", "ms", "TFLOP/s", "GB/s", "ceil%");
    c.post = 0;
    double ms = time_op(s, op_norm, &c);
    bd_row *r = bd_add(model, Tdoc, "add_rmsnorm (input)", ms);
    r->gbs = 12.0 * T * d / (ms * 1e-3) / 1e9;
    sum_default += ms;
    printf("  %-30s %9.3f %9s %8.0f\n", r->op, ms, "", r->gbs);

    struct {
        const char *name;
        nn_bf16_cuda *out;
        const nn_bf16_cuda *x, *w, *b;
        int K, N;
    } gm[4] = {{"gemm qkv", m->qkv, m->a, L->w_qkv, L->b_qkv, d, qkv_n},
               {"gemm o_proj", m->y, m->att, L->w_o, L->b_o, m->H * m->hd, d},
               {"gemm gate_up", m->gu, m->a, L->w_gu, L->b_gu, d, 2 * I},
               {"gemm down", m->y, m->h, L->w_down, L->b_down, I, d}};
    for (int gi = 0; gi < 4; gi++) {
        if (gi == 1) { /* rope and attention sit between qkv and o_proj */
            ms = time_op(s, op_rope, &c);
            r = bd_add(model, Tdoc, "qk_norm_rope", ms);
            r->gbs = 4.0 * T * (m->H + m->KV) * m->hd / (ms * 1e-3) / 1e9;
            sum_default += ms;
            printf("  %-30s %9.3f %9s %8.0f\n", r->op, ms, "", r->gbs);
            double att_flop = 2.0 * (double)Tdoc * Tdoc * m->H * m->hd * n_docs;
            int def_tile = target_attn_tile_cuda(m, T), best = 0;
            double best_ms = 1e30;
            for (int t = 0; t < NN_ATTN_TILES; t++) {
                c.tile = t;
                ms = time_op(s, op_attn, &c);
                static const char *const tile_name[NN_ATTN_TILES] = {
                    "64x64", "128x64", "128x32", "wgmma", "wgmma serial", "wgmma tma", "wgmma pingpong"};
                snprintf(op, sizeof op, "attention tile %s%s", tile_name[t], t == def_tile ? " *" : "");
                r = bd_add(model, Tdoc, op, ms);
                r->tflops = att_flop / (ms * 1e-3) / 1e12;
                r->pct = 100 * r->tflops / ceiling;
                if (t == def_tile)
                    sum_default += ms;
                if (ms < best_ms)
                    best_ms = ms, best = t;
                printf("  %-30s %9.3f %9.1f %8s %6.1f%%\n", r->op, ms, r->tflops, "", r->pct);
            }
            g_best_tile[Tdoc == 2048 ? 0 : 1] = best;
        }
        if (gi == 2) {
            c.post = 1;
            ms = time_op(s, op_norm, &c);
            r = bd_add(model, Tdoc, "add_rmsnorm (post)", ms);
            r->gbs = 12.0 * T * d / (ms * 1e-3) / 1e9;
            sum_default += ms;
            printf("  %-30s %9.3f %9s %8.0f\n", r->op, ms, "", r->gbs);
        }
        if (gi == 3) {
            ms = time_op(s, op_swiglu, &c);
            r = bd_add(model, Tdoc, "swiglu", ms);
            r->gbs = 6.0 * T * I / (ms * 1e-3) / 1e9;
            sum_default += ms;
            printf("  %-30s %9.3f %9s %8.0f\n", r->op, ms, "", r->gbs);
        }
        c.ga = nn_gemm_linear_args_cuda(gm[gi].out, gm[gi].x, gm[gi].w, gm[gi].b, T, gm[gi].K, gm[gi].N);
        double flop = 2.0 * T * gm[gi].K * gm[gi].N, ms0 = 0, best_ms = 1e30;
        int def_rank = m->gemm_rank[gi] >= 0 ? m->gemm_rank[gi] : target_gemm_rank_cuda(m, T, gm[gi].N, gm[gi].K);
        int best = 0;
        for (int k = 0; k < NN_GEMM_MAX_RANK; k++) {
            c.rank = k;
            c.ga.algo_rank = k;
            int rc = nn_gemm_run_cuda(m->gemm, &c.ga, s, g_err, sizeof g_err);
            if (rc == -ENOENT)
                break; /* the heuristic offers fewer */
            if (rc < 0) {
                printf("  %s rank %d: not runnable: %s\n", gm[gi].name, k, g_err);
                continue;
            }
            ms = time_op(s, op_gemm, &c);
            if (k == 0)
                ms0 = ms;
            snprintf(op, sizeof op, "%s [%d,%d,%d] r%d%s", gm[gi].name, T, gm[gi].N, gm[gi].K, k,
                     k == def_rank ? " *" : "");
            r = bd_add(model, Tdoc, op, ms);
            r->tflops = flop / (ms * 1e-3) / 1e12;
            r->pct = 100 * r->tflops / ceiling;
            if (k == def_rank)
                sum_default += ms;
            if (ms < best_ms)
                best_ms = ms, best = k;
            printf("  %-30s %9.3f %9.1f %8s %6.1f%%\n", r->op, ms, r->tflops, "", r->pct);
        }
        if (best != 0 && best_ms > 0.98 * ms0)
            best = 0; /* within 2% of the heuristic's first answer: keep it */
        g_best_rank[gi] = best;
    }
    printf("  %-30s %9.3f   (the * rows: the forward's choices; best ranks qkv %d o %d gu %d down %d, best tile %d)\n",
           "sum of one layer", sum_default, g_best_rank[0], g_best_rank[1], g_best_rank[2], g_best_rank[3],
           g_best_tile[Tdoc == 2048 ? 0 : 1]);
    bd_add(model, Tdoc, "sum of one layer (choices *)", sum_default);
}

/* ---- variants: the forward's kernel choices ------------------------------------------ */

/* base: 64x64 tiles, rank 0 everywhere (the forward as it was); t1 .. t4: the other tile
 * shapes (NN_ATTN_TILE_*); auto: the breakdown's fastest tile per T and ranks; default: target_init_cuda's
 * choices (the shipped table). */
static int set_variant(target_model_cuda *m, const char *v, int Tdoc, char *desc, size_t desclen)
{
    if (!strcmp(v, "default")) {
        m->attn_tile = -1;
        for (int i = 0; i < 4; i++)
            m->gemm_rank[i] = -1;
    } else if (!strcmp(v, "base") || !strcmp(v, "t1") || !strcmp(v, "t2") || !strcmp(v, "t3") || !strcmp(v, "t4") ||
               !strcmp(v, "t5") || !strcmp(v, "t6")) {
        m->attn_tile = v[0] == 'b' ? 0 : v[1] - '0';
        for (int i = 0; i < 4; i++)
            m->gemm_rank[i] = 0;
    } else if (!strcmp(v, "auto")) {
        m->attn_tile = g_best_tile[Tdoc == 4096 ? 1 : 0];
        for (int i = 0; i < 4; i++)
            m->gemm_rank[i] = g_best_rank[i];
    } else {
        return -1;
    }
    int tile = target_attn_tile_cuda(m, Tdoc);
    int rk[4];
    for (int i = 0; i < 4; i++)
        rk[i] = m->gemm_rank[i] >= 0 ? m->gemm_rank[i] : -1;
    snprintf(desc, desclen, "tile %d, ranks %d/%d/%d/%d", tile, rk[0], rk[1], rk[2], rk[3]);
    return 0;
}

static double rel_l2(const uint16_t *a, const uint16_t *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        union {
            uint32_t u;
            float f;
        } x, y;
        x.u = (uint32_t)a[i] << 16, y.u = (uint32_t)b[i] << 16;
        num += ((double)x.f - y.f) * ((double)x.f - y.f);
        den += (double)y.f * y.f;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

int main(int argc, char **argv)
{
    const char *json = "bench/results/target_ours.json", *models = "1.7b,8b", *check = NULL;
    const char *variants = "default";
    int tokens = 8192, iters = 10, limit = 550, do_breakdown = 0, doc_len = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (i + 1 < argc && !strcmp(argv[i], "--json"))
            json = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--tokens"))
            tokens = (int)df_arg_int("bench_target", "--tokens", argv[++i], 1, 1 << 24);
        else if (i + 1 < argc && !strcmp(argv[i], "--iters"))
            iters = (int)df_arg_int("bench_target", "--iters", argv[++i], 1, INT_MAX);
        else if (i + 1 < argc && !strcmp(argv[i], "--models"))
            models = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--timeout"))
            limit = (int)df_arg_int("bench_target", "--timeout", argv[++i], 1, INT_MAX);
        else if (i + 1 < argc && !strcmp(argv[i], "--check"))
            check = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--variants"))
            variants = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--doc-len"))
            doc_len = (int)df_arg_int("bench_target", "--doc-len", argv[++i], 1, 1 << 24);
        else if (!strcmp(argv[i], "--breakdown"))
            do_breakdown = 1;
        else {
            fprintf(stderr, "bench_target: unknown or incomplete argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (iters < 1) {
        fprintf(stderr, "bench_target: --iters must be >= 1\n");
        return 2;
    }
    if (doc_len) {
        if (doc_len < 1 || tokens < doc_len || tokens % doc_len || tokens / doc_len > 63 || do_breakdown) {
            fprintf(stderr, "bench_target: --doc-len T needs --tokens a positive multiple of T, at most 63 documents "
                            "per row and no --breakdown\n");
            return 2;
        }
    } else if (tokens < 4096 || tokens % 4096) {
        fprintf(stderr, "bench_target: --tokens must be a positive multiple of 4096\n");
        return 2;
    }
    char vlist[8][16];
    int nv = 0;
    {
        char tmp[256];
        snprintf(tmp, sizeof tmp, "%s", variants);
        for (char *sv = NULL, *t = strtok_r(tmp, ",", &sv); t; t = strtok_r(NULL, ",", &sv)) {
            target_model_cuda probe;
            char desc[64];
            memset(&probe, 0, sizeof probe);
            if (nv >= 8 || strlen(t) >= sizeof vlist[0] || set_variant(&probe, t, 2048, desc, sizeof desc) < 0) {
                fprintf(stderr, "bench_target: --variants: '%s' is not one of default, base, t1 .. t6, auto (<= 8)\n",
                        t);
                return 2;
            }
            if (!strcmp(t, "auto") && !do_breakdown) {
                fprintf(stderr, "bench_target: --variants auto needs --breakdown (it takes the breakdown's picks)\n");
                return 2;
            }
            snprintf(vlist[nv++], sizeof vlist[0], "%s", t);
        }
    }
    gt_watchdog((unsigned)limit, "bench_target: watchdog: ran past its time limit\n");
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("SKIPPED: bench_target: no CUDA device\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    FILE *chk = NULL;
    if (check && !(chk = fopen(check, "w"))) {
        fprintf(stderr, "bench_target: cannot write %s: %s\n", check, strerror(errno));
        return 1;
    }
    double ceiling = gemm_ceiling_tflops(20);
    printf("device %s (sm_%d%d, %d SMs); bf16 GEMM 8192^3 (cuBLASLt, this run): %.1f TFLOP/s\n", prop.name, prop.major,
           prop.minor, prop.multiProcessorCount, ceiling);

    static result res[96];
    int nres = 0;
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (size_t mi = 0; mi < DF_ARRAY_LEN(SHAPES); mi++) {
        const shape *sh = &SHAPES[mi];
        if (!strstr(models, mi == 0 ? "1.7b" : "8b"))
            continue;
        hfconfig c;
        memset(&c, 0, sizeof c);
        c.arch = HFCONFIG_ARCH_QWEN3;
        c.hidden_size = sh->d, c.intermediate_size = sh->I, c.num_hidden_layers = sh->L;
        c.num_attention_heads = sh->H, c.num_key_value_heads = sh->KV, c.head_dim = sh->hd;
        c.vocab_size = sh->V, c.rms_norm_eps = 1e-6, c.rope_theta = 1e6, c.qk_norm = 1;
        snprintf(c.rope_type, sizeof c.rope_type, "default");
        int cap[5];
        for (int i = 0; i < 5; i++)
            cap[i] = (int)lround(1.0 + i * (sh->L - 4) / 4.0);
        target_model_cuda m;
        char err[512];
        RC_CHECK(target_init_cuda(&m, &c, cap, 5, tokens, err, sizeof err), err);
        RC_CHECK(target_randomize_cuda(&m, 1234 + mi, g_err, sizeof g_err), g_err);
        printf("%s: %d of %d layers run (capture %d,%d,%d,%d,%d), weights %.2f GB, workspace %.2f GB\n", sh->name,
               m.n_layers, sh->L, cap[0], cap[1], cap[2], cap[3], cap[4], m.weight_bytes / 1e9, m.act_bytes / 1e9);
        int32_t *tok = malloc(sizeof(int32_t) * tokens), *dtok, *dst;
        nn_bf16_cuda *dout;
        size_t out_n = (size_t)tokens * 5 * sh->d;
        uint16_t *h_first = malloc(2 * out_n), *h_eager = malloc(2 * out_n), *h_graph = malloc(2 * out_n);
        if (!tok || !h_first || !h_eager || !h_graph) {
            fprintf(stderr, "bench_target: out of host memory\n");
            return 1;
        }
        df_rng r;
        df_rng_seed(&r, 99);
        for (int t = 0; t < tokens; t++)
            tok[t] = (int32_t)df_rng_below(&r, (uint64_t)sh->V);
        CUDA_CHECK(cudaMalloc((void **)&dtok, sizeof(int32_t) * tokens));
        CUDA_CHECK(cudaMalloc((void **)&dst, sizeof(int32_t) * 64));
        CUDA_CHECK(cudaMalloc((void **)&dout, 2 * out_n));
        CUDA_CHECK(cudaMemcpy(dtok, tok, sizeof(int32_t) * tokens, cudaMemcpyHostToDevice));
        for (int lay = 0; lay < (doc_len ? 1 : 3); lay++) {
            int32_t starts[64];
            int n_docs = 0, T = 0;
            char layout[64];
            if (lay < 2) {
                T = doc_len ? doc_len : lay == 0 ? 2048 : 4096;
                n_docs = tokens / T;
                for (int i = 0; i <= n_docs; i++)
                    starts[i] = i * T;
                snprintf(layout, sizeof layout, "%d docs x %d", n_docs, T);
            } else { /* uneven documents, as a real packed row looks */
                static const double frac[] = {0.37, 0.18, 0.15, 0.11, 0.09, 0.06, 0.04};
                starts[0] = 0;
                for (n_docs = 0; n_docs < 7; n_docs++)
                    starts[n_docs + 1] = starts[n_docs] + (int)(frac[n_docs] * tokens);
                starts[n_docs] = tokens;
                int o2 = snprintf(layout, sizeof layout, "mixed");
                for (int i = 0; i < n_docs && o2 < (int)sizeof layout - 8; i++)
                    o2 += snprintf(layout + o2, sizeof layout - (size_t)o2, "%c%d", i ? '+' : ' ',
                                   starts[i + 1] - starts[i]);
            }
            CUDA_CHECK(cudaMemcpy(dst, starts, sizeof(int32_t) * (n_docs + 1), cudaMemcpyHostToDevice));
            if (do_breakdown && lay < 2) {
                set_variant(&m, "default", T, err, sizeof err);
                RC_CHECK(target_forward_cuda(&m, dtok, dst, n_docs, tokens, dout, s, g_err, sizeof g_err), g_err);
                CUDA_CHECK(cudaStreamSynchronize(s));
                breakdown(&m, sh->name, T, tokens, ceiling, s);
            }
            for (int vi = 0; vi < nv; vi++) {
                result *o = &res[nres++];
                memset(o, 0, sizeof *o);
                snprintf(o->layout, sizeof o->layout, "%s", layout);
                o->variant = vlist[vi];
                set_variant(&m, vlist[vi], T ? T : 2048, o->choice, sizeof o->choice);
                float ms_eager = forward_eager_ms(&m, dtok, dst, n_docs, tokens, dout, 3, s);
                CUDA_CHECK(cudaMemcpy(h_eager, dout, 2 * out_n, cudaMemcpyDeviceToHost));
                if (chk)
                    check_line(chk, sh->name, o->layout, "eager", dout, 2 * out_n);
                CUDA_CHECK(cudaMemset(dout, 0xFF, 2 * out_n));
                float ms = forward_graph_ms(&m, dtok, dst, n_docs, tokens, dout, iters, s);
                CUDA_CHECK(cudaMemcpy(h_graph, dout, 2 * out_n, cudaMemcpyDeviceToHost));
                if (chk)
                    check_line(chk, sh->name, o->layout, "graph", dout, 2 * out_n);
                o->bits_same = memcmp(h_eager, h_graph, 2 * out_n) == 0;
                if (vi == 0) {
                    memcpy(h_first, h_graph, 2 * out_n);
                    o->rel_l2_vs_first = 0;
                } else {
                    o->rel_l2_vs_first = rel_l2(h_graph, h_first, out_n);
                }
                forward_token_check(&m, "bench_target");
                double flops = target_forward_flops_cuda(&m, starts, n_docs);
                o->model = sh->name, o->T = T, o->B = n_docs, o->tokens = tokens, o->layers_run = m.n_layers;
                memcpy(o->capture, cap, sizeof cap);
                o->eager_ms = ms_eager / 3, o->graph_ms = ms / iters;
                o->tok_s = tokens / (o->graph_ms * 1e-3);
                o->tflops = flops / (o->graph_ms * 1e-3) / 1e12;
                o->mfu = o->tflops / ceiling;
                o->gflop_per_token = flops / tokens / 1e9;
                printf("%s %-30s %-8s %-28s graph %8.2f ms %9.0f tok/s %5.1f%% MFU, eager=graph bits %s, rel L2 vs "
                       "%s %.2e\n",
                       sh->name, o->layout, o->variant, o->choice, o->graph_ms, o->tok_s, 100 * o->mfu,
                       o->bits_same ? "yes" : "NO", vlist[0], o->rel_l2_vs_first);
            }
        }
        cudaFree(dtok), cudaFree(dst), cudaFree(dout);
        free(tok), free(h_first), free(h_eager), free(h_graph);
        target_free_cuda(&m);
    }

    if (chk) {
        if (fclose(chk) != 0) {
            fprintf(stderr, "bench_target: writing %s: %s\n", check, strerror(errno));
            return 1;
        }
        printf("wrote the output checksums to %s\n", check);
    }
    printf("\n%-11s %-34s %-8s %7s %9s %9s %11s %8s %6s %5s\n", "model", "layout (one packed row)", "variant", "layers",
           "eager ms", "graph ms", "tok/s", "TFLOP/s", "MFU", "bits");
    int bad_bits = 0;
    for (int i = 0; i < nres; i++) {
        printf("%-11s %-34s %-8s %7d %9.2f %9.2f %11.0f %8.1f %5.1f%% %5s\n", res[i].model, res[i].layout,
               res[i].variant, res[i].layers_run, res[i].eager_ms, res[i].graph_ms, res[i].tok_s, res[i].tflops,
               100 * res[i].mfu, res[i].bits_same ? "same" : "DIFF");
        bad_bits += !res[i].bits_same;
    }
    FILE *f = fopen(json, "w");
    if (!f) {
        fprintf(stderr, "bench_target: cannot write %s: %s\n", json, strerror(errno));
        return 1;
    }
    fprintf(f, "{\n  \"bench\": \"target_forward\",\n  \"device\": \"%s\",\n  \"date_unix\": %.0f,\n", prop.name,
            df_wall_s());
    fprintf(f, "  \"gemm_ceiling_tflops\": %.2f,\n  \"iters\": %d,\n  \"results\": [\n", ceiling, iters);
    for (int i = 0; i < nres; i++) {
        const result *o = &res[i];
        fprintf(f,
                "    {\"model\": \"%s\", \"T\": %d, \"B\": %d, \"layout\": \"%s\", \"variant\": \"%s\", "
                "\"choice\": \"%s\", \"tokens\": %d, \"layers_run\": %d, "
                "\"capture\": [%d, %d, %d, %d, %d], \"eager_ms\": %.3f, \"graph_ms\": %.3f, \"tok_s\": %.1f, "
                "\"gflop_per_token\": %.4f, \"tflops\": %.2f, \"mfu\": %.4f, \"eager_graph_same_bits\": %s, "
                "\"rel_l2_vs_first_variant\": %.3e}%s\n",
                o->model, o->T, o->B, o->layout, o->variant, o->choice, o->tokens, o->layers_run, o->capture[0],
                o->capture[1], o->capture[2], o->capture[3], o->capture[4], o->eager_ms, o->graph_ms, o->tok_s,
                o->gflop_per_token, o->tflops, o->mfu, o->bits_same ? "true" : "false", o->rel_l2_vs_first,
                i + 1 < nres ? "," : "");
    }
    fprintf(f, "  ],\n  \"breakdown\": [\n");
    for (int i = 0; i < g_nbd; i++) {
        const bd_row *b = &g_bd[i];
        fprintf(f,
                "    {\"model\": \"%s\", \"T\": %d, \"step\": \"%s\", \"ms\": %.4f, \"tflops\": %.2f, \"gb_s\": %.1f, "
                "\"pct_of_ceiling\": %.2f}%s\n",
                b->model, b->T, b->op, b->ms, b->tflops, b->gbs, b->pct, i + 1 < g_nbd ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    if (fclose(f) != 0) {
        fprintf(stderr, "bench_target: writing %s: %s\n", json, strerror(errno));
        return 1;
    }
    printf("wrote %s\n", json);
    if (bad_bits) {
        fprintf(stderr, "bench_target: %d run(s) where the graph replay differs from the eager forward\n", bad_bits);
        return 1;
    }
    return 0;
}
#endif
