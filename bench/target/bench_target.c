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
#include "io/hfconfig.h"
#include "nn/nn_cuda.h"
#include "sha256.h"
#include "target/target_model_cuda.h"
#include "util.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CK(call)                                                                                          \
    do {                                                                                                  \
        cudaError_t e_ = (call);                                                                          \
        if (e_ != cudaSuccess) {                                                                          \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                                      \
        }                                                                                                 \
    } while (0)
#define RC(call, extra)                                                                              \
    do {                                                                                             \
        long r_ = (long)(call);                                                                      \
        if (r_ < 0) {                                                                                \
            fprintf(stderr, "%s:%d: %s returned %ld: %s\n", __FILE__, __LINE__, #call, r_, (extra)); \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

static char g_err[512]; /* the failure text of the last 0 / -errno call */

typedef struct shape {
    const char *name;
    int d, L, H, KV, hd, I, V;
} shape;

static const shape SHAPES[] = {
    {"Qwen3-1.7B", 2048, 28, 16, 8, 128, 6144, 151936},
    {"Qwen3-8B", 4096, 36, 32, 8, 128, 12288, 151936},
};

static void on_alarm(int sig)
{
    (void)sig;
    static const char m[] = "bench_target: watchdog: ran past its time limit\n";
    ssize_t w = write(2, m, sizeof m - 1);
    (void)w;
    _exit(1);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_target [--json PATH] [--tokens N] [--iters N] [--models 1.7b,8b] [--timeout S]\n"
               "                    [--check PATH]\n"
               "  CUDA target forward at Qwen3-1.7B / Qwen3-8B shapes (random weights made on the GPU),\n"
               "  documents of T = 2048 and 4096 tokens packed into one row of N tokens (default 8192),\n"
               "  plus a mixed-length layout; prints a table and writes JSON (default\n"
               "  bench/results/target_ours.json). Exit 77 without a GPU.\n"
               "  --check PATH: write the SHA-256 of the captured output bytes of every layout (after\n"
               "  the eager calls and after the graph replays) to PATH, one line each: two builds run\n"
               "  with the same arguments must write the same file\n");
}

static double gemm_ceiling_tflops(int iters)
{
    const int n = 8192;
    size_t e = (size_t)n * n;
    nn_bf16_cuda *a, *b, *c;
    CK(cudaMalloc((void **)&a, 2 * e));
    CK(cudaMalloc((void **)&b, 2 * e));
    CK(cudaMalloc((void **)&c, 2 * e));
    RC(nn_fill_uniform_bf16_cuda(a, e, 1, 1.0f, 0, g_err, sizeof g_err), g_err);
    RC(nn_fill_uniform_bf16_cuda(b, e, 2, 1.0f, 0, g_err, sizeof g_err), g_err);
    nn_gemm_cuda *g;
    RC(nn_gemm_create_cuda(&g, (size_t)32 << 20, g_err, sizeof g_err), g_err);
    /* the target forward's kind of call: a linear layer, align_hint 0 */
    nn_gemm_args_cuda ga = nn_gemm_linear_args_cuda(c, a, b, NULL, n, n, n);
    for (int i = 0; i < 3; i++)
        RC(nn_gemm_run_cuda(g, &ga, 0, g_err, sizeof g_err), g_err);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, 0));
    for (int i = 0; i < iters; i++)
        RC(nn_gemm_run_cuda(g, &ga, 0, g_err, sizeof g_err), g_err);
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    nn_gemm_destroy_cuda(g);
    cudaFree(a), cudaFree(b), cudaFree(c);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return 2.0 * n * (double)n * n * iters / (ms * 1e-3) / 1e12;
}

/* --check: one line "model | layout | when | sha256 of the device bytes" */
static void check_line(FILE *f, const char *model, const char *layout, const char *when, const void *dev, size_t bytes)
{
    void *h = malloc(bytes);
    if (!h) {
        fprintf(stderr, "bench_target: out of host memory for the check copy\n");
        exit(1);
    }
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, dev, bytes, cudaMemcpyDeviceToHost));
    df_sha256 sh;
    uint8_t dig[32];
    char hex[65];
    df_sha256_init(&sh);
    df_sha256_update(&sh, h, bytes);
    df_sha256_final(&sh, dig);
    df_sha256_hex(dig, hex);
    fprintf(f, "%s | %s | %s | %s\n", model, layout, when, hex);
    printf("check: %s | %s | %s | %s\n", model, layout, when, hex);
    free(h);
}

typedef struct result {
    const char *model;
    char layout[64];
    int T, B, tokens, layers_run, capture[5];
    double eager_ms, graph_ms, tok_s, tflops, mfu, gflop_per_token;
} result;

int main(int argc, char **argv)
{
    const char *json = "bench/results/target_ours.json", *models = "1.7b,8b", *check = NULL;
    int tokens = 8192, iters = 10, limit = 550;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (i + 1 < argc && !strcmp(argv[i], "--json"))
            json = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--tokens"))
            tokens = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--iters"))
            iters = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--models"))
            models = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--timeout"))
            limit = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--check"))
            check = argv[++i];
        else {
            fprintf(stderr, "bench_target: unknown or incomplete argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (tokens < 4096 || tokens % 4096 || iters < 1) {
        fprintf(stderr, "bench_target: --tokens must be a positive multiple of 4096, --iters >= 1\n");
        return 2;
    }
    signal(SIGALRM, on_alarm);
    alarm((unsigned)limit);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("SKIPPED: bench_target: no CUDA device\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    FILE *chk = NULL;
    if (check && !(chk = fopen(check, "w"))) {
        fprintf(stderr, "bench_target: cannot write %s: %s\n", check, strerror(errno));
        return 1;
    }
    double ceiling = gemm_ceiling_tflops(20);
    printf("device %s; bf16 GEMM 8192^3 (cuBLASLt, this run): %.1f TFLOP/s\n", prop.name, ceiling);

    result res[16];
    int nres = 0;
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
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
        RC(target_init_cuda(&m, &c, cap, 5, tokens, err, sizeof err), err);
        RC(target_randomize_cuda(&m, 1234 + mi, g_err, sizeof g_err), g_err);
        printf("%s: %d of %d layers run (capture %d,%d,%d,%d,%d), weights %.2f GB, workspace %.2f GB\n", sh->name,
               m.n_layers, sh->L, cap[0], cap[1], cap[2], cap[3], cap[4], m.weight_bytes / 1e9, m.act_bytes / 1e9);
        int32_t *tok = malloc(sizeof(int32_t) * tokens), *dtok, *dst;
        nn_bf16_cuda *dout;
        df_rng r;
        df_rng_seed(&r, 99);
        for (int t = 0; t < tokens; t++)
            tok[t] = (int32_t)df_rng_below(&r, (uint64_t)sh->V);
        CK(cudaMalloc((void **)&dtok, sizeof(int32_t) * tokens));
        CK(cudaMalloc((void **)&dst, sizeof(int32_t) * 64));
        CK(cudaMalloc((void **)&dout, 2 * (size_t)tokens * 5 * sh->d));
        CK(cudaMemcpy(dtok, tok, sizeof(int32_t) * tokens, cudaMemcpyHostToDevice));
        for (int lay = 0; lay < 3; lay++) {
            int32_t starts[64];
            int n_docs = 0, T = 0;
            result *o = &res[nres++];
            memset(o, 0, sizeof *o);
            if (lay < 2) {
                T = lay == 0 ? 2048 : 4096;
                n_docs = tokens / T;
                for (int i = 0; i <= n_docs; i++)
                    starts[i] = i * T;
                snprintf(o->layout, sizeof o->layout, "%d docs x %d", n_docs, T);
            } else { /* uneven documents, as a real packed row looks */
                static const double frac[] = {0.37, 0.18, 0.15, 0.11, 0.09, 0.06, 0.04};
                starts[0] = 0;
                for (n_docs = 0; n_docs < 7; n_docs++)
                    starts[n_docs + 1] = starts[n_docs] + (int)(frac[n_docs] * tokens);
                starts[n_docs] = tokens;
                int o2 = snprintf(o->layout, sizeof o->layout, "mixed");
                for (int i = 0; i < n_docs && o2 < (int)sizeof o->layout - 8; i++)
                    o2 += snprintf(o->layout + o2, sizeof o->layout - (size_t)o2, "%c%d", i ? '+' : ' ',
                                   starts[i + 1] - starts[i]);
            }
            CK(cudaMemcpy(dst, starts, sizeof(int32_t) * (n_docs + 1), cudaMemcpyHostToDevice));
            cudaEvent_t e0, e1;
            CK(cudaEventCreate(&e0));
            CK(cudaEventCreate(&e1));
            /* the first call builds the GEMM plans */
            RC(target_forward_cuda(&m, dtok, dst, n_docs, tokens, dout, s, g_err, sizeof g_err), g_err);
            CK(cudaStreamSynchronize(s));
            CK(cudaEventRecord(e0, s));
            for (int i = 0; i < 3; i++)
                RC(target_forward_cuda(&m, dtok, dst, n_docs, tokens, dout, s, g_err, sizeof g_err), g_err);
            CK(cudaEventRecord(e1, s));
            CK(cudaEventSynchronize(e1));
            float ms_eager;
            CK(cudaEventElapsedTime(&ms_eager, e0, e1));
            if (chk)
                check_line(chk, sh->name, o->layout, "eager", dout, 2 * (size_t)tokens * 5 * sh->d);
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            int rc = target_forward_cuda(&m, dtok, dst, n_docs, tokens, dout, s, g_err, sizeof g_err);
            CK(cudaStreamEndCapture(s, &g));
            RC(rc, g_err);
            CK(cudaGraphInstantiate(&ge, g, 0));
            CK(cudaGraphLaunch(ge, s));
            CK(cudaStreamSynchronize(s));
            CK(cudaEventRecord(e0, s));
            for (int i = 0; i < iters; i++)
                CK(cudaGraphLaunch(ge, s));
            CK(cudaEventRecord(e1, s));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (chk)
                check_line(chk, sh->name, o->layout, "graph", dout, 2 * (size_t)tokens * 5 * sh->d);
            int bad = 0;
            RC(target_take_token_error_cuda(&m, &bad, g_err, sizeof g_err), g_err);
            if (bad) {
                fprintf(stderr, "bench_target: token error flag set (bench bug)\n");
                return 1;
            }
            double flops = target_forward_flops_cuda(&m, starts, n_docs);
            o->model = sh->name, o->T = T, o->B = n_docs, o->tokens = tokens, o->layers_run = m.n_layers;
            memcpy(o->capture, cap, sizeof cap);
            o->eager_ms = ms_eager / 3, o->graph_ms = ms / iters;
            o->tok_s = tokens / (o->graph_ms * 1e-3);
            o->tflops = flops / (o->graph_ms * 1e-3) / 1e12;
            o->mfu = o->tflops / ceiling;
            o->gflop_per_token = flops / tokens / 1e9;
            cudaGraphExecDestroy(ge);
            cudaGraphDestroy(g);
            cudaEventDestroy(e0), cudaEventDestroy(e1);
        }
        cudaFree(dtok), cudaFree(dst), cudaFree(dout);
        free(tok);
        target_free_cuda(&m);
    }

    if (chk) {
        if (fclose(chk) != 0) {
            fprintf(stderr, "bench_target: writing %s: %s\n", check, strerror(errno));
            return 1;
        }
        printf("wrote the output checksums to %s\n", check);
    }
    printf("\n%-11s %-34s %7s %9s %9s %11s %8s %6s\n", "model", "layout (one packed row)", "layers", "eager ms",
           "graph ms", "tok/s", "TFLOP/s", "MFU");
    for (int i = 0; i < nres; i++)
        printf("%-11s %-34s %7d %9.2f %9.2f %11.0f %8.1f %5.1f%%\n", res[i].model, res[i].layout, res[i].layers_run,
               res[i].eager_ms, res[i].graph_ms, res[i].tok_s, res[i].tflops, 100 * res[i].mfu);

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
                "    {\"model\": \"%s\", \"T\": %d, \"B\": %d, \"layout\": \"%s\", \"tokens\": %d, \"layers_run\": %d, "
                "\"capture\": [%d, %d, %d, %d, %d], \"eager_ms\": %.3f, \"graph_ms\": %.3f, \"tok_s\": %.1f, "
                "\"gflop_per_token\": %.4f, \"tflops\": %.2f, \"mfu\": %.4f}%s\n",
                o->model, o->T, o->B, o->layout, o->tokens, o->layers_run, o->capture[0], o->capture[1], o->capture[2],
                o->capture[3], o->capture[4], o->eager_ms, o->graph_ms, o->tok_s, o->gflop_per_token, o->tflops, o->mfu,
                i + 1 < nres ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    if (fclose(f) != 0) {
        fprintf(stderr, "bench_target: writing %s: %s\n", json, strerror(errno));
        return 1;
    }
    printf("wrote %s\n", json);
    return 0;
}
#endif
