/* bench_moe: tok/s and MFU of the CUDA target forward (target_forward_cuda) at the
 * Qwen3-30B-A3B shape: d 2048, 32 q / 4 kv heads of 128, 128 experts of width 768, top 8
 * (renormalised), every layer sparse; random bf16 weights generated on the device (no
 * files), --layers N of them (default 48, the real count; fewer is shape-faithful per
 * layer and fits a smaller GPU or a shorter run).
 *
 * What one measurement is: one packed row of --tokens tokens (default 8192) holding
 * documents of T = 2048 and of T = 4096 tokens (the transformers peer's batch of B x T,
 * bench/target/moe_peer.py); --doc-len T: one layout only, --tokens / T documents of T
 * tokens, as a pipeline's batch of T-token documents is packed (bench/pipeline/run.sh
 * 30b-a3b: 10 x 768). Captured: the DFlash default 5 layers and the last one, so
 * ALL N layers run, as the peer's do. The forward is captured in a CUDA graph after one
 * eager call and replayed --iters times between CUDA events (the experts' counts and
 * offsets stay on the device, so the graph holds the whole forward); the eager time is
 * reported too, and each row says whether the replay gave the eager forward's bits. Per
 * expert kernel (--kernels grouped,rows; default grouped).
 *
 * FLOP: 2 x ACTIVE parameters x tokens (the router and the k experts a token runs, the
 * attention projections; target_layer_params_cuda) + the causal attention term
 * (target_forward_flops_cuda). Two MFU figures: the active-parameter FLOP alone over 780
 * TFLOP/s (nominal dense bf16), and all FLOP over a bf16 8192^3 cuBLASLt GEMM measured in
 * the same run.
 *
 * --breakdown (default on): one sparse layer's MLP at T = --tokens, each step timed (mean
 * of 10 after 2 warm-ups): the router GEMM, the routing + permutation, the experts with
 * the grouped kernel and with the rows kernel, the whole block, and as a reference for the
 * other design, a host loop of cuBLASLt GEMMs over the experts at this routing's counts
 * (read back once: only the GEMMs are timed, no gather / SwiGLU / un-permute).
 *
 * Prints a table, writes JSON (--json, default bench/results/target_moe_ours.json). A
 * watchdog (alarm) ends a hung run with exit 1. Exit 77 without a GPU. In a CPU build it
 * only says so and exits 0. */
#ifndef DF_WITH_CUDA
#include <stdio.h>
int main(void)
{
    printf("SKIPPED: bench_moe needs a CUDA=1 build\n");
    return 0;
}
#else
#include "forward_bench.h"
#include "io/hfconfig.h"
#include "nn/nn_cuda.h"
#include "target/target_model_cuda.h"
#include "util.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOMINAL_TFLOPS 780.0 /* dense bf16, H100 / H200 SXM (the MFU the issue asks for) */
#define BD_REPS 10

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_moe [--layers N] [--tokens N] [--iters N] [--kernels grouped,rows] [--no-breakdown]\n"
               "                 [--json PATH] [--timeout S] [--doc-len T]\n"
               "  CUDA target forward at the Qwen3-30B-A3B shape (128 experts, top 8, F 768, d 2048, 32/4 heads)\n"
               "  with N layers (default 48), random weights made on the GPU; documents of 2048 and 4096\n"
               "  tokens packed into one row of --tokens (default 8192); tok/s, MFU of the active parameters,\n"
               "  a per-step breakdown of one sparse layer. Exit 77 without a GPU.\n"
               "  --doc-len T: one layout only, N/T documents of T tokens (N a multiple of T, at most 63\n"
               "  documents), as a pipeline's batch of T-token documents is packed\n");
}

typedef struct result {
    char layout[48];
    const char *kernel;
    int T, B, tokens, bits_same;
    double eager_ms, graph_ms, tok_s, tflops, mfu_active, mfu_all, per_layer_ms;
} result;

typedef struct bd_row {
    char op[64];
    double ms, tflops;
} bd_row;

/* mean ms of reps calls of one step (after 2 warm-ups), on stream s */
#define TIME_STEP(out_ms, reps, call)                   \
    do {                                                \
        for (int w_ = 0; w_ < 2; w_++)                  \
            RC_CHECK((call), g_err);                    \
        cudaEvent_t a_, b_;                             \
        CUDA_CHECK(cudaEventCreate(&a_));               \
        CUDA_CHECK(cudaEventCreate(&b_));               \
        CUDA_CHECK(cudaEventRecord(a_, s));             \
        for (int i_ = 0; i_ < (reps); i_++)             \
            RC_CHECK((call), g_err);                    \
        CUDA_CHECK(cudaEventRecord(b_, s));             \
        CUDA_CHECK(cudaEventSynchronize(b_));           \
        float ms_;                                      \
        CUDA_CHECK(cudaEventElapsedTime(&ms_, a_, b_)); \
        (out_ms) = ms_ / (reps);                        \
        cudaEventDestroy(a_), cudaEventDestroy(b_);     \
    } while (0)

/* The host loop of cuBLASLt GEMMs a design without a grouped kernel would run: per expert
 * with rows, gate/up [c, 2F] = x_p[c, d] W_gu^T and down [c, d] = h[c, F] W_down^T, at
 * this routing's counts (read back). Only the GEMMs. */
static int cublas_loop(target_model_cuda *m, nn_gemm_cuda *g, const int32_t *counts, nn_bf16_cuda *xp, nn_bf16_cuda *gu,
                       nn_bf16_cuda *h, nn_bf16_cuda *out, const target_layer_cuda *L, cudaStream_t s)
{
    const int d = m->d, F = m->F;
    long off = 0;
    for (int e = 0; e < m->E; e++) {
        int c = counts[e];
        if (!c)
            continue;
        nn_gemm_args_cuda a = nn_gemm_linear_args_cuda(gu + off * 2 * F, xp + off * d, L->w_gu + (size_t)e * 2 * F * d,
                                                       NULL, c, d, 2 * F);
        int rc = nn_gemm_run_cuda(g, &a, s, g_err, sizeof g_err);
        if (rc < 0)
            return rc;
        a = nn_gemm_linear_args_cuda(out + off * d, h + off * F, L->w_down + (size_t)e * d * F, NULL, c, F, d);
        if ((rc = nn_gemm_run_cuda(g, &a, s, g_err, sizeof g_err)) < 0)
            return rc;
        off += c;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *json = "bench/results/target_moe_ours.json", *kernels = "grouped";
    int L = 48, tokens = 8192, iters = 5, timeout_s = 600, breakdown = 1, doc_len = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc)
            L = (int)df_arg_int("bench_moe", "--layers", argv[++i], 1, 1024);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            tokens = (int)df_arg_int("bench_moe", "--tokens", argv[++i], 64, 1 << 20);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = (int)df_arg_int("bench_moe", "--iters", argv[++i], 1, 1000);
        else if (!strcmp(argv[i], "--timeout") && i + 1 < argc)
            timeout_s = (int)df_arg_int("bench_moe", "--timeout", argv[++i], 1, INT_MAX);
        else if (!strcmp(argv[i], "--kernels") && i + 1 < argc)
            kernels = argv[++i];
        else if (!strcmp(argv[i], "--doc-len") && i + 1 < argc)
            doc_len = (int)df_arg_int("bench_moe", "--doc-len", argv[++i], 1, 1 << 20);
        else if (!strcmp(argv[i], "--no-breakdown"))
            breakdown = 0;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (doc_len && (tokens % doc_len || tokens / doc_len > 63)) {
        fprintf(stderr, "bench_moe: --doc-len T needs --tokens a multiple of T, at most 63 documents per row\n");
        return 2;
    }
    gt_watchdog((unsigned)timeout_s, "bench_moe: watchdog: ran past its time limit\n");
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("SKIPPED: no CUDA device\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    double ceiling = gemm_ceiling_tflops(20);
    printf("device %s (sm_%d%d, %d SMs); bf16 GEMM 8192^3 (cuBLASLt, this run): %.1f TFLOP/s\n", prop.name, prop.major,
           prop.minor, prop.multiProcessorCount, ceiling);

    /* the Qwen3-30B-A3B config.json, with N layers, through the same parser as a checkpoint's;
     * a GPU that cannot hold N layers' experts (61 GB at 48) gets fewer, said below */
    hfconfig c;
    target_model_cuda m;
    int cap[6], nc;
    double t0 = (double)df_now_ns();
    const int L_asked = L;
    for (;;) {
        char cj[1024];
        snprintf(cj, sizeof cj,
                 "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"hidden_size\": "
                 "2048, \"intermediate_size\": 6144, \"num_hidden_layers\": %d, \"num_attention_heads\": 32,"
                 " \"num_key_value_heads\": 4, \"head_dim\": 128, \"vocab_size\": 151936, \"rms_norm_eps\": 1e-6,"
                 " \"rope_theta\": 1000000, \"tie_word_embeddings\": false, \"num_experts\": 128,"
                 " \"num_experts_per_tok\": 8, \"moe_intermediate_size\": 768, \"norm_topk_prob\": true,"
                 " \"decoder_sparse_step\": 1, \"mlp_only_layers\": [], \"max_position_embeddings\": 40960}",
                 L);
        RC_CHECK(hfconfig_parse(&c, cj, strlen(cj), "bench_moe config", g_err, sizeof g_err), g_err);
        /* the DFlash default 5 captures and the last layer: every layer runs */
        nc = 0;
        for (int i = 0; i < 5 && L >= 5; i++) {
            int l = (int)lround(1.0 + i * (L - 4) / 4.0), dup = 0;
            for (int j = 0; j < nc; j++)
                dup |= cap[j] == l;
            if (!dup && l < L)
                cap[nc++] = l;
        }
        int has_last = 0;
        for (int j = 0; j < nc; j++)
            has_last |= cap[j] == L - 1;
        if (!has_last)
            cap[nc++] = L - 1;
        int rc = target_init_cuda(&m, &c, cap, nc, tokens, g_err, sizeof g_err);
        if (rc == -ENOMEM && L > 4) {
            printf("bench_moe: %d layers do not fit this GPU (%s); trying %d\n", L, g_err, L * 3 / 4);
            hfconfig_free(&c);
            L = L * 3 / 4;
            continue;
        }
        RC_CHECK(rc, g_err);
        break;
    }
    if (L != L_asked)
        printf("bench_moe: NOTE: %d of the asked %d layers (shape-faithful per layer; tok/s is for %d layers)\n", L,
               L_asked, L);
    RC_CHECK(target_randomize_cuda(&m, 4321, g_err, sizeof g_err), g_err);
    double params_active = target_layer_params_cuda(&m);
    printf("Qwen3-30B-A3B shape, %d layers run (%d sparse, %d experts top %d, F %d): weights %.2f GB, workspace "
           "%.2f GB, %.2fB active parameters in the layers (set up in %.1f s)\n",
           m.n_layers, m.n_moe, m.E, m.topk, m.F, m.weight_bytes / 1e9, m.act_bytes / 1e9, params_active / 1e9,
           ((double)df_now_ns() - t0) * 1e-9);

    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int32_t *tok = malloc(sizeof(int32_t) * tokens), *dtok, *dst;
    size_t out_n = (size_t)tokens * nc * m.d;
    uint16_t *h_eager = malloc(2 * out_n), *h_graph = malloc(2 * out_n);
    if (!tok || !h_eager || !h_graph) {
        fprintf(stderr, "bench_moe: out of host memory\n");
        return 1;
    }
    df_rng r;
    df_rng_seed(&r, 99);
    for (int t = 0; t < tokens; t++)
        tok[t] = (int32_t)df_rng_below(&r, (uint64_t)m.V);
    nn_bf16_cuda *dout;
    CUDA_CHECK(cudaMalloc((void **)&dtok, sizeof(int32_t) * tokens));
    CUDA_CHECK(cudaMalloc((void **)&dst, sizeof(int32_t) * 64));
    CUDA_CHECK(cudaMalloc((void **)&dout, 2 * out_n));
    CUDA_CHECK(cudaMemcpy(dtok, tok, sizeof(int32_t) * tokens, cudaMemcpyHostToDevice));

    result res[16];
    int nres = 0;
    const int doc_T[2] = {doc_len ? doc_len : 2048, 4096};
    for (int li = 0; li < (doc_len ? 1 : 2); li++) {
        int T = doc_T[li];
        if (tokens % T)
            T = tokens; /* a shorter row: one document */
        int n_docs = tokens / T;
        int32_t starts[64];
        for (int i = 0; i <= n_docs; i++)
            starts[i] = i * T;
        CUDA_CHECK(cudaMemcpy(dst, starts, sizeof(int32_t) * (n_docs + 1), cudaMemcpyHostToDevice));
        for (int kern = 0; kern < 2; kern++) {
            const char *kname = kern == NN_MOE_GROUPED ? "grouped" : "rows";
            if (!strstr(kernels, kname))
                continue;
            m.moe_kernel = kern;
            result *o = &res[nres++];
            memset(o, 0, sizeof *o);
            snprintf(o->layout, sizeof o->layout, "%d docs x %d", n_docs, T);
            o->kernel = kname, o->T = T, o->B = n_docs, o->tokens = tokens;
            float ms_eager = forward_eager_ms(&m, dtok, dst, n_docs, tokens, dout, 2, s);
            CUDA_CHECK(cudaMemcpy(h_eager, dout, 2 * out_n, cudaMemcpyDeviceToHost));
            CUDA_CHECK(cudaMemset(dout, 0xFF, 2 * out_n));
            float ms = forward_graph_ms(&m, dtok, dst, n_docs, tokens, dout, iters, s);
            CUDA_CHECK(cudaMemcpy(h_graph, dout, 2 * out_n, cudaMemcpyDeviceToHost));
            o->bits_same = memcmp(h_eager, h_graph, 2 * out_n) == 0;
            forward_token_check(&m, "bench_moe");
            double flops = target_forward_flops_cuda(&m, starts, n_docs);
            o->eager_ms = ms_eager / 2, o->graph_ms = ms / iters;
            o->tok_s = tokens / (o->graph_ms * 1e-3);
            o->tflops = flops / (o->graph_ms * 1e-3) / 1e12;
            o->mfu_active = 2.0 * params_active * tokens / (o->graph_ms * 1e-3) / 1e12 / NOMINAL_TFLOPS;
            o->mfu_all = o->tflops / ceiling;
            o->per_layer_ms = o->graph_ms / m.n_layers;
            printf("%-16s experts %-7s graph %9.2f ms (eager %9.2f) %9.0f tok/s  %6.1f TFLOP/s  MFU active %5.1f%% "
                   "of %.0f, all %5.1f%% of %.0f  %.3f ms/layer  eager=graph bits %s\n",
                   o->layout, kname, o->graph_ms, o->eager_ms, o->tok_s, o->tflops, 100 * o->mfu_active, NOMINAL_TFLOPS,
                   100 * o->mfu_all, ceiling, o->per_layer_ms, o->bits_same ? "yes" : "NO");
        }
    }

    bd_row bd[16];
    int nbd = 0;
    double avg_active = 0;
    if (breakdown) {
        /* one sparse layer's MLP over T = tokens rows of random normed activations */
        const int T = tokens, d = m.d, F = m.F, E = m.E, k = m.topk, l = 0;
        const target_layer_cuda *Lw = &m.layers[l];
        RC_CHECK(nn_fill_uniform_bf16_cuda(m.a, (size_t)T * d, 77, 1.7f, s, g_err, sizeof g_err), g_err);
        double ex_flop = 2.0 * T * k * 3.0 * d * F;
        nn_gemm_args_cuda ga = nn_gemm_linear_args_cuda((nn_bf16_cuda *)m.moe_logits, m.a, Lw->w_router, NULL, T, d, E);
        ga.d_type = NN_GEMM_F32;
        double ms;
#define ROW(name, flop, reps, call)                                             \
    do {                                                                        \
        TIME_STEP(ms, reps, call);                                              \
        snprintf(bd[nbd].op, sizeof bd[nbd].op, "%s", name);                    \
        bd[nbd].ms = ms, bd[nbd].tflops = (flop) > 0 ? (flop) / (ms * 1e9) : 0; \
        nbd++;                                                                  \
    } while (0)
        ROW("router GEMM (fp32 logits)", 2.0 * T * d * E, BD_REPS,
            nn_gemm_run_cuda(m.gemm, &ga, s, g_err, sizeof g_err));
        long long st0[2], st1[2];
        CUDA_CHECK(cudaMemcpy(st0, m.moe.stat, sizeof st0, cudaMemcpyDeviceToHost));
        ROW("route + permute", 0, BD_REPS,
            nn_moe_route_cuda(&m.moe, m.moe_logits, T, m.norm_topk, s, g_err, sizeof g_err));
        CUDA_CHECK(cudaMemcpy(st1, m.moe.stat, sizeof st1, cudaMemcpyDeviceToHost));
        avg_active = st1[1] > st0[1] ? (double)(st1[0] - st0[0]) / (double)(st1[1] - st0[1]) : 0;
        ROW("experts, grouped kernel", ex_flop, BD_REPS,
            nn_moe_experts_cuda(m.y, m.a, Lw->w_gu, Lw->w_down, &m.moe, m.moe_h, m.moe_yp, T, d, F, NN_MOE_GROUPED, s,
                                g_err, sizeof g_err));
        ROW("experts, rows kernel", ex_flop, 3,
            nn_moe_experts_cuda(m.y, m.a, Lw->w_gu, Lw->w_down, &m.moe, m.moe_h, m.moe_yp, T, d, F, NN_MOE_ROWS, s,
                                g_err, sizeof g_err));
        m.moe_kernel = NN_MOE_GROUPED;
        ROW("whole block (router..un-permute)", ex_flop + 2.0 * T * d * E, BD_REPS,
            target_moe_mlp_cuda(&m, l, m.a, m.y, T, 0, s, g_err, sizeof g_err));
        /* the other design's GEMMs: counts to the host, one cuBLASLt call per expert and matrix */
        int32_t *counts = malloc(sizeof(int32_t) * E);
        nn_bf16_cuda *gu_p, *out_p;
        size_t tk = (size_t)T * k;
        CUDA_CHECK(cudaStreamSynchronize(s));
        CUDA_CHECK(cudaMemcpy(counts, m.moe.counts, sizeof(int32_t) * E, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMalloc((void **)&gu_p, 2 * tk * 2 * F));
        CUDA_CHECK(cudaMalloc((void **)&out_p, 2 * tk * d));
        nn_gemm_cuda *g2;
        RC_CHECK(nn_gemm_create_cuda(&g2, (size_t)32 << 20, g_err, sizeof g_err), g_err);
        int distinct = 0;
        for (int e = 0; e < E; e++)
            distinct += counts[e] > 0;
        char nm[64];
        snprintf(nm, sizeof nm, "cuBLASLt loop, %d experts x 2 GEMMs", distinct);
        ROW(nm, ex_flop, 3, cublas_loop(&m, g2, counts, m.moe_yp, gu_p, m.moe_h, out_p, Lw, s));
        nn_gemm_destroy_cuda(g2);
        cudaFree(gu_p), cudaFree(out_p);
        free(counts);
#undef ROW
        printf("\none sparse layer's MLP, T = %d rows (%.1f experts active a call):\n", T, avg_active);
        for (int i = 0; i < nbd; i++) {
            printf("  %-40s %8.3f ms", bd[i].op, bd[i].ms);
            if (bd[i].tflops > 0)
                printf("  %6.1f TFLOP/s", bd[i].tflops);
            printf("\n");
        }
    }

    FILE *jf = fopen(json, "w");
    if (!jf) {
        fprintf(stderr, "bench_moe: cannot write %s: %s\n", json, strerror(errno));
        return 1;
    }
    fprintf(jf,
            "{\"bench\": \"target_forward_moe\", \"device\": \"%s\", \"gemm_ceiling_tflops\": %.2f, "
            "\"nominal_tflops\": %.0f, \"shape\": \"Qwen3-30B-A3B\", \"layers_asked\": %d, \"layers\": %d, "
            "\"layers_run\": %d, "
            "\"experts\": %d, \"topk\": %d, \"moe_intermediate\": %d, \"hidden\": %d, \"active_params_layers\": %.0f, "
            "\"weight_bytes\": %zu, \"tokens\": %d, \"results\": [",
            prop.name, ceiling, NOMINAL_TFLOPS, L_asked, L, m.n_layers, m.E, m.topk, m.F, m.d, params_active,
            m.weight_bytes, tokens);
    for (int i = 0; i < nres; i++) {
        const result *o = &res[i];
        fprintf(jf,
                "%s\n  {\"layout\": \"%s\", \"kernel\": \"%s\", \"T\": %d, \"B\": %d, \"graph_ms\": %.4f, "
                "\"eager_ms\": %.4f, \"tok_s\": %.1f, \"tflops\": %.2f, \"mfu_active\": %.4f, \"mfu_all\": %.4f, "
                "\"per_layer_ms\": %.4f, \"graph_bits_equal_eager\": %s}",
                i ? "," : "", o->layout, o->kernel, o->T, o->B, o->graph_ms, o->eager_ms, o->tok_s, o->tflops,
                o->mfu_active, o->mfu_all, o->per_layer_ms, o->bits_same ? "true" : "false");
    }
    fprintf(jf, "\n], \"breakdown_avg_active_experts\": %.2f, \"breakdown\": [", avg_active);
    for (int i = 0; i < nbd; i++)
        fprintf(jf, "%s\n  {\"op\": \"%s\", \"ms\": %.4f, \"tflops\": %.2f}", i ? "," : "", bd[i].op, bd[i].ms,
                bd[i].tflops);
    fprintf(jf, "\n]}\n");
    if (fclose(jf) != 0) {
        fprintf(stderr, "bench_moe: writing %s: %s\n", json, strerror(errno));
        return 1;
    }
    printf("JSON: %s\n", json);
    int all_same = 1;
    for (int i = 0; i < nres; i++)
        all_same &= res[i].bits_same;
    cudaFree(dtok), cudaFree(dst), cudaFree(dout);
    free(tok), free(h_eager), free(h_graph);
    target_free_cuda(&m);
    hfconfig_free(&c);
    return all_same ? 0 : 1;
}
#endif
