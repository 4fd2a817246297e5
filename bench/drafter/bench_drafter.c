/* bench_drafter: the CUDA DFlash drafter training step (dflash_step_accumulate_cuda + clip + AdamW)
 * at the Qwen3-8B-DFlash-b16 shape (5 layers, d 4096, H 32 / KV 8 / hd 128, I 12288,
 * V 151936, 5 captured layers, B 16, gamma 7), random weights made on the device; --shape
 * 1.7b / 30b-a3b: the same drafter on the Qwen3-1.7B / Qwen3-30B-A3B target.
 *
 * Per configuration (S, anchors): warmup steps, then timed steps with CUDA events on the
 * step's stream; the median is reported as ms/step (one sequence = one sample), samples/s,
 * TFLOP/s and MFU. FLOPs use the formula of the PyTorch peer (tests/reference/dflash_torch.py
 * step_flops, docs/performance.md): all N*B block positions x (6 trainable + 4 lm_head params),
 * 6 (fc + L (k,v proj)) per context token, 12 H hd per allowed (query, key) pair. MFU is over
 * a bf16 8192^3 cuBLASLt GEMM measured in the same run. The prompt is the first S/8 tokens
 * (loss_mask 0), as the peer does. Prints a table, writes JSON (--json, default
 * bench/results/drafter_cuda.json).
 * --attn gemm,fused runs each attention scheme (dflash_attn_cuda.h) in turn on a fresh context
 * with the same weights and prints the phase table per scheme; --docs K packs K documents of
 * S tokens and N anchor slots each into one step (dflash_batch_cuda.n_docs), as the pipeline's
 * trainer does with a ring batch: samples/s counts documents.
 * Then the optimizer alone (AdamW over the fp32 array:
 * ms, the bytes it must move, GB/s) beside a device-to-device cudaMemcpy of 2 GiB measured in
 * the same process, the bandwidth ceiling of a memory-bound kernel; its fields
 * (optimizer_ms, optimizer_bytes, optimizer_gb_s, copy_ceiling_gb_s, optimizer_frac_of_copy)
 * are in every JSON row. Then the checkpoint's copy to the host (the weights and both moments
 * into pageable buffers, as trainer_to_host does): ckpt_copy_bytes, ckpt_copy_s.
 * Exit 0, 1 on failure, 77 without a GPU.
 * Plain C: the Makefile's .cu bench rule hands -Wl,--start-group to nvcc, which rejects it; so
 * this file is C and compiles to a stub that says "skipped" in builds without CUDA. */
#ifndef DF_WITH_CUDA
#include <stdio.h>
int main(int argc, char **argv)
{
    (void)argc, (void)argv;
    printf("bench_drafter: skipped: built without CUDA=1 (the drafter step is GPU code)\n");
    return 0;
}
#else
#include "dflash/dflash_adamw_cuda.h"
#include "dflash/dflash_batch.h"
#include "dflash/dflash_cuda.h"
#include "nn/nn_cuda.h"
#include "tests/gpu_test_check.h"
#include "util.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAXCFG 8
#define MAXSCH 4

static void usage(void)
{
    printf("usage: bench_drafter [--seq S ...] [--anchors N ...] [--iters n] [--warmup n] [--chunk rows]\n"
           "                     [--json PATH] [--tiny | --shape 1.7b|8b|30b-a3b] [--check PATH] [--attn S1,S2]\n"
           "                     [--docs K]\n"
           "  --shape: the drafter of that Qwen3 target (default 8b); 30b-a3b: the mixture-of-experts\n"
           "  target's width and heads (d 2048, 32 / 4 heads) with its dense intermediate_size 6144\n"
           "  default: S in {768, 2048} x anchors in {256, 512} ... run as the pairs (768,256) and (2048,512)\n"
           "  --seq/--anchors  give the pairs explicitly (same count), e.g. --seq 768 2048 --anchors 256 512\n"
           "  --iters 10 --warmup 3 --chunk 1024; --tiny: a small shape (smoke test of the code path)\n"
           "  JSON to bench/results/drafter_cuda.json unless --json is given\n"
           "  --check PATH: after the last step write the fp32 master weights to PATH (raw, the\n"
           "  dflash_params.data layout) and print each configuration's loss bits: two builds run\n"
           "  with the same arguments must write the same bytes\n"
           "  --attn fused,gemm,fused-fwd,fused-rc: the attention schemes to run, each on a fresh context\n"
           "  (default: the DFLASH_ATTN environment variable, else fused)\n"
           "  --docs K: each step packs K documents of S tokens with N anchor slots each (default 1)\n");
}

/* a 0 / -errno call writes its failure into g_err */
static char g_err[512];

static void qwen3_8b_b16(dflash_config *c)
{
    dflash_config_tiny(c);
    c->hidden = 4096, c->intermediate = 12288, c->n_layers = 5, c->n_heads = 32, c->n_kv_heads = 8;
    c->head_dim = 128, c->vocab = 151936, c->block_size = 16, c->n_capture = 5, c->num_target_layers = 36;
    int ids[5] = {1, 9, 17, 25, 33};
    memcpy(c->target_layer_ids, ids, sizeof ids);
    c->mask_token_id = 151669, c->sliding_window = 0;
    memset(c->layer_sliding, 0, sizeof c->layer_sliding);
    c->tie_word_embeddings = 0, c->max_position_embeddings = 40960;
    c->rms_norm_eps = 1e-6, c->rope_theta = 1e6, c->gamma = 7.0;
}

/* The same drafter on the Qwen3-1.7B target (d 2048, 16/8 heads, I 6144, 28 layers, tied). */
static void qwen3_1p7b_b16(dflash_config *c)
{
    qwen3_8b_b16(c);
    c->hidden = 2048, c->intermediate = 6144, c->n_heads = 16, c->n_kv_heads = 8, c->num_target_layers = 28;
    int ids[5] = {1, 7, 13, 19, 25};
    memcpy(c->target_layer_ids, ids, sizeof ids);
    c->tie_word_embeddings = 1;
}

/* The same drafter on the Qwen3-30B-A3B target (d 2048, 32/4 heads, 48 layers, untied): a
 * drafter's layers are dense, of the config's intermediate_size 6144 (drafter_worker's
 * build_config takes that field, not the experts' width); captured layers by the DFlash
 * default rule for 48 layers (1, 12, 23, 34, 45, as scripts/make_topology.py picks them). */
static void qwen3_30b_a3b_b16(dflash_config *c)
{
    qwen3_8b_b16(c);
    c->hidden = 2048, c->intermediate = 6144, c->n_heads = 32, c->n_kv_heads = 4, c->num_target_layers = 48;
    dflash_default_layer_ids(c->target_layer_ids, c->n_capture, c->num_target_layers);
}

/* --shape NAME: the drafter's config, the name printed and the JSON label */
static const struct shape {
    const char *name, *title, *label;
    void (*make)(dflash_config *c);
} SHAPES[] = {
    {"8b", "Qwen3-8B-DFlash-b16", "qwen3-8b-b16", qwen3_8b_b16},
    {"1.7b", "Qwen3-1.7B-DFlash-b16", "qwen3-1.7b-b16", qwen3_1p7b_b16},
    {"30b-a3b", "Qwen3-30B-A3B-DFlash-b16", "qwen3-30b-a3b-b16", qwen3_30b_a3b_b16},
};

static void tiny_shape(dflash_config *c)
{
    dflash_config_tiny(c);
    c->hidden = 256, c->intermediate = 512, c->n_heads = 8, c->n_kv_heads = 2, c->head_dim = 32, c->vocab = 1000;
    c->block_size = 16, c->mask_token_id = 999, c->gamma = 7.0;
}

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static double gemm_ceiling(cudaStream_t s)
{
    const int n = 8192;
    nn_gemm_cuda *g;
    if (nn_gemm_create_cuda(&g, 64u << 20, g_err, sizeof g_err) < 0) {
        fprintf(stderr, "bench_drafter: ceiling GEMM: %s\n", g_err);
        return 0;
    }
    dflash_bf16_cuda *a, *b, *c;
    CUDA_CHECK(cudaMalloc((void **)&a, sizeof(dflash_bf16_cuda) * (size_t)n * n));
    CUDA_CHECK(cudaMalloc((void **)&b, sizeof(dflash_bf16_cuda) * (size_t)n * n));
    CUDA_CHECK(cudaMalloc((void **)&c, sizeof(dflash_bf16_cuda) * (size_t)n * n));
    RC_CHECK(dflash_fill_uniform_bf16_cuda(a, (size_t)n * n, 1, 1.0f, s, g_err, sizeof g_err), g_err);
    RC_CHECK(dflash_fill_uniform_bf16_cuda(b, (size_t)n * n, 2, 1.0f, s, g_err, sizeof g_err), g_err);
    nn_gemm_args_cuda p; /* the drafter step's kind of call (align_hint 1) */
    memset(&p, 0, sizeof p);
    p.ta = 0, p.tb = 1, p.M = n, p.N = n, p.K = n, p.A = a, p.lda = n, p.B = b, p.ldb = n, p.D = c, p.ldd = n;
    p.d_type = NN_GEMM_BF16, p.alpha = 1, p.beta = 0, p.batch = 1, p.align_hint = 1;
    float ms[20];
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    for (int i = 0; i < 25; i++) {
        CUDA_CHECK(cudaEventRecord(e0, s));
        if (nn_gemm_run_cuda(g, &p, s, g_err, sizeof g_err) < 0) {
            fprintf(stderr, "bench_drafter: ceiling GEMM: %s\n", g_err);
            exit(1);
        }
        CUDA_CHECK(cudaEventRecord(e1, s));
        CUDA_CHECK(cudaEventSynchronize(e1));
        if (i >= 5)
            CUDA_CHECK(cudaEventElapsedTime(&ms[i - 5], e0, e1));
    }
    qsort(ms, 20, sizeof(float), cmp_f);
    cudaFree(a), cudaFree(b), cudaFree(c);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    nn_gemm_destroy_cuda(g);
    return 2.0 * n * (double)n * n / (ms[10] * 1e-3) / 1e12;
}

typedef struct result {
    const char *attn;
    int S, anchors, real, docs;
    double ms, tflop, tflops, mfu, loss, attn_pairs;
    float all_ms[64];
    int n_ms;
    dflash_timing_cuda ph; /* one extra step with phase events */
} result;

typedef struct opt_result {
    double ms, bytes, gb_s, copy_gb_s, frac;
} opt_result;

#define COPY_BYTES ((size_t)2 << 30) /* the copy ceiling's buffer (2 GiB each way) */
#define COPY_REPS 5

/* The optimizer step alone (median of 10 after 3 warmup) and the device-to-device copy
 * bandwidth in the same process (read + write bytes over the best of COPY_REPS copies):
 * the ceiling a memory-bound update can approach. */
static opt_result measure_optimizer(dflash_ctx_cuda *ctx, cudaStream_t s, size_t np)
{
    opt_result r;
    memset(&r, 0, sizeof r);
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    float ms[10];
    for (int i = 0; i < 13; i++) {
        CUDA_CHECK(cudaEventRecord(e0, s));
        RC_CHECK(dflash_optimizer_step_cuda(ctx, NULL, g_err, sizeof g_err), g_err);
        CUDA_CHECK(cudaEventRecord(e1, s));
        CUDA_CHECK(cudaEventSynchronize(e1));
        if (i >= 3)
            CUDA_CHECK(cudaEventElapsedTime(&ms[i - 3], e0, e1));
    }
    qsort(ms, 10, sizeof(float), cmp_f);
    r.ms = ms[5];
    r.bytes = (double)ADAMW_BYTES_PER_PARAM_CUDA * (double)np;
    r.gb_s = r.bytes / (r.ms * 1e-3) / 1e9;
    void *a = NULL, *b = NULL;
    if (cudaMalloc(&a, COPY_BYTES) != cudaSuccess || cudaMalloc(&b, COPY_BYTES) != cudaSuccess) {
        cudaGetLastError();
        fprintf(stderr, "bench_drafter: no room for the copy ceiling's 2 x %zu bytes; ceiling not measured\n",
                COPY_BYTES);
    } else {
        CUDA_CHECK(cudaMemsetAsync(a, 1, COPY_BYTES, s));
        float best = 0;
        for (int i = 0; i < COPY_REPS + 1; i++) {
            CUDA_CHECK(cudaEventRecord(e0, s));
            CUDA_CHECK(cudaMemcpyAsync(b, a, COPY_BYTES, cudaMemcpyDeviceToDevice, s));
            CUDA_CHECK(cudaEventRecord(e1, s));
            CUDA_CHECK(cudaEventSynchronize(e1));
            float t;
            CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
            if (i > 0 && (best == 0 || t < best))
                best = t;
        }
        r.copy_gb_s = 2.0 * (double)COPY_BYTES / (best * 1e-3) / 1e9;
        r.frac = r.gb_s / r.copy_gb_s;
    }
    cudaFree(a), cudaFree(b);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return r;
}

int main(int argc, char **argv)
{
    int seqs[MAXCFG] = {768, 2048}, anch[MAXCFG] = {256, 512}, nseq = 0, nanc = 0, iters = 10, warmup = 3;
    int chunk = 1024, tiny = 0, docs = 1, nsch = 0;
    const struct shape *shape = &SHAPES[0];
    char *schemes[MAXSCH], attn_list[64] = "";
    const char *json = "bench/results/drafter_cuda.json", *check = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage();
            return 0;
        } else if (!strcmp(argv[i], "--seq")) {
            while (i + 1 < argc && argv[i + 1][0] != '-' && nseq < MAXCFG)
                seqs[nseq++] = (int)df_arg_int("bench_drafter", "--seq", argv[++i], 1, 1 << 20);
        } else if (!strcmp(argv[i], "--anchors")) {
            while (i + 1 < argc && argv[i + 1][0] != '-' && nanc < MAXCFG)
                anch[nanc++] = (int)df_arg_int("bench_drafter", "--anchors", argv[++i], 1, 1 << 20);
        } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
            iters = (int)df_arg_int("bench_drafter", "--iters", argv[++i], 1, INT_MAX);
        } else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) {
            warmup = (int)df_arg_int("bench_drafter", "--warmup", argv[++i], 0, INT_MAX);
        } else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) {
            chunk = (int)df_arg_int("bench_drafter", "--chunk", argv[++i], 0, INT_MAX);
        } else if (!strcmp(argv[i], "--json") && i + 1 < argc) {
            json = argv[++i];
        } else if (!strcmp(argv[i], "--check") && i + 1 < argc) {
            check = argv[++i];
        } else if (!strcmp(argv[i], "--attn") && i + 1 < argc) {
            snprintf(attn_list, sizeof attn_list, "%s", argv[++i]);
            char *save = NULL;
            for (char *t = strtok_r(attn_list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (nsch == MAXSCH ||
                    (strcmp(t, "fused") && strcmp(t, "gemm") && strcmp(t, "fused-fwd") && strcmp(t, "fused-rc"))) {
                    fprintf(stderr,
                            "bench_drafter: --attn takes up to %d of fused, gemm, fused-fwd, fused-rc (got %s)\n",
                            MAXSCH, t);
                    return 2;
                }
                schemes[nsch++] = t;
            }
        } else if (!strcmp(argv[i], "--docs") && i + 1 < argc) {
            docs = (int)df_arg_int("bench_drafter", "--docs", argv[++i], 1, 1 << 16);
            if (docs < 1 || docs > DFLASH_MAX_DOCS_CUDA) {
                fprintf(stderr, "bench_drafter: --docs must be 1..%d\n", DFLASH_MAX_DOCS_CUDA);
                return 2;
            }
        } else if (!strcmp(argv[i], "--tiny")) {
            tiny = 1;
        } else if (i + 1 < argc && !strcmp(argv[i], "--shape")) {
            i++;
            shape = NULL;
            for (size_t k = 0; k < sizeof SHAPES / sizeof SHAPES[0]; k++)
                if (!strcmp(argv[i], SHAPES[k].name))
                    shape = &SHAPES[k];
            if (!shape) {
                fprintf(stderr, "bench_drafter: --shape takes 1.7b, 8b or 30b-a3b, got %s\n", argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "bench_drafter: unknown argument '%s' (--help)\n", argv[i]);
            return 2;
        }
    }
    int ncfg = 2;
    if (nseq || nanc) {
        if (nseq != nanc || nseq == 0) {
            fprintf(stderr, "bench_drafter: --seq and --anchors need the same number of values (%d vs %d)\n", nseq,
                    nanc);
            return 2;
        }
        ncfg = nseq;
    }
    if (iters < 1 || iters > 64 || warmup < 0) {
        fprintf(stderr, "bench_drafter: --iters must be 1..64, --warmup >= 0\n");
        return 2;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("SKIPPED: bench_drafter: no CUDA device\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    dflash_config c;
    if (tiny)
        tiny_shape(&c);
    else
        shape->make(&c);
    int maxS = 0, maxN = 0;
    for (int i = 0; i < ncfg; i++)
        maxS = DF_MAX(maxS, seqs[i]), maxN = DF_MAX(maxN, anch[i]);
    int d = c.hidden, V = c.vocab, B = c.block_size;
    int pS = maxS * docs, pN = maxN * docs; /* packed sizes */
    if (nsch == 0) {                        /* the environment's scheme (or the default) */
        const char *e = getenv("DFLASH_ATTN");
        schemes[nsch++] = (char *)(e && *e ? e : "fused");
    }
    cudaStream_t s0;
    CUDA_CHECK(cudaStreamCreate(&s0));
    printf("bench_drafter: %s, %s shape, measuring the bf16 8192^3 GEMM ceiling ...\n", prop.name,
           tiny ? "tiny" : shape->title);
    fflush(stdout);
    double ceiling = gemm_ceiling(s0);
    printf("bench_drafter: GEMM ceiling %.1f TFLOP/s\n", ceiling);

    dflash_bf16_cuda *embed, *head, *Hd;
    CUDA_CHECK(cudaMalloc((void **)&embed, sizeof(dflash_bf16_cuda) * (size_t)V * d));
    CUDA_CHECK(cudaMalloc((void **)&head, sizeof(dflash_bf16_cuda) * (size_t)V * d));
    CUDA_CHECK(cudaMalloc((void **)&Hd, sizeof(dflash_bf16_cuda) * (size_t)pS * c.n_capture * d));
    /* std 0.02, 0.02 and 1 */
    RC_CHECK(dflash_fill_uniform_bf16_cuda(embed, (size_t)V * d, 11, 0.0346f, s0, g_err, sizeof g_err), g_err);
    RC_CHECK(dflash_fill_uniform_bf16_cuda(head, (size_t)V * d, 12, 0.0346f, s0, g_err, sizeof g_err), g_err);
    RC_CHECK(dflash_fill_uniform_bf16_cuda(Hd, (size_t)pS * c.n_capture * d, 13, 1.732f, s0, g_err, sizeof g_err),
             g_err);
    CUDA_CHECK(cudaStreamSynchronize(s0));
    adamw_config oc;
    adamw_config_default(&oc, 1000);

    int32_t *x = (int32_t *)malloc(sizeof(int32_t) * (size_t)pS),
            *anc = (int32_t *)malloc(sizeof(int32_t) * (size_t)pN);
    uint8_t *lm = (uint8_t *)malloc((size_t)pS), *keep = (uint8_t *)malloc((size_t)pN);
    int32_t *x_d, *anc_d;
    uint8_t *lm_d, *keep_d;
    CUDA_CHECK(cudaMalloc((void **)&x_d, sizeof(int32_t) * (size_t)pS));
    CUDA_CHECK(cudaMalloc((void **)&anc_d, sizeof(int32_t) * (size_t)pN));
    CUDA_CHECK(cudaMalloc((void **)&lm_d, (size_t)pS));
    CUDA_CHECK(cudaMalloc((void **)&keep_d, (size_t)pN));
    if (!x || !anc || !lm || !keep) {
        fprintf(stderr, "bench_drafter: out of host memory\n");
        return 1;
    }
    result res[MAXSCH * MAXCFG];
    memset(res, 0, sizeof res);
    int nres = 0;
    size_t np = 0;
    dflash_ctx_cuda *ctx = NULL;
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    for (int si = 0; si < nsch; si++) {
        setenv("DFLASH_ATTN", schemes[si], 1);
        char err[512];
        int rc = dflash_init_cuda(&ctx, &c, &oc, embed, head, pS, pN, chunk, err, sizeof err);
        if (rc < 0) {
            fprintf(stderr, "bench_drafter: dflash_init_cuda: %s\n", err);
            return 1;
        }
        printf("bench_drafter: attention %s: %zu trainable params, context holds %.1f GiB (max S %d, max anchors %d)\n",
               dflash_attn_name_cuda(ctx), dflash_param_count_cuda(ctx),
               (double)dflash_device_bytes_cuda(ctx) / (1u << 30), pS, pN);
        RC_CHECK(dflash_params_init_device_cuda(ctx, 42, 0.02f, g_err, sizeof g_err), g_err);
        cudaStream_t s = dflash_stream_cuda(ctx);
        df_rng r;
        df_rng_seed(&r, 5); /* the same documents for every scheme */
        np = dflash_param_count_cuda(ctx);
        double p_head = (double)V * d, p_fc = (double)d * c.n_capture * d;
        double p_kv = (double)c.n_layers * 2 * c.n_kv_heads * c.head_dim * d;
        for (int ci = 0; ci < ncfg; ci++) {
            int S = seqs[ci], N = anch[ci], n = 0;
            int32_t starts[DFLASH_MAX_DOCS_CUDA + 1];
            int nreal[DFLASH_MAX_DOCS_CUDA];
            double pairs = 0, flops = 0; /* allowed (query, key) pairs over all layers */
            for (int k = 0; k < docs; k++) {
                int32_t *ak = anc + (size_t)k * N;
                uint8_t *kk_ = keep + (size_t)k * N;
                starts[k] = k * S;
                for (int i = 0; i < S; i++) {
                    x[k * S + i] = (int32_t)df_rng_below(&r, (uint64_t)V);
                    lm[k * S + i] = i >= S / 8;
                }
                nreal[k] = dflash_sample_anchors(ak, kk_, N, lm + (size_t)k * S, S, 1, (uint64_t)(ci * docs + k));
                if (nreal[k] < 0) {
                    fprintf(stderr, "bench_drafter: anchor sampling failed\n");
                    return 1;
                }
                n += nreal[k];
                double pk = 0;
                for (int l = 0; l < c.n_layers; l++)
                    for (int j = 0; j < nreal[k]; j++)
                        for (int q = 0; q < B; q++) {
                            if (c.layer_sliding[l]) {
                                int lo = DF_MAX(0, ak[j] + q - (c.sliding_window - 1));
                                pk += (ak[j] - lo > 0 ? ak[j] - lo : 0) + q + 1;
                            } else {
                                pk += ak[j] + B;
                            }
                        }
                pairs += pk;
                /* block positions computed: all N slots alone, the kept ones packed */
                flops += (double)(docs > 1 ? nreal[k] : N) * B * (6.0 * (double)np + 4.0 * p_head) +
                         (double)S * 6.0 * (p_fc + p_kv) + 12.0 * pk * c.n_heads * c.head_dim;
            }
            starts[docs] = docs * S;
            CUDA_CHECK(cudaMemcpy(x_d, x, sizeof(int32_t) * (size_t)S * docs, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(lm_d, lm, (size_t)S * docs, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(anc_d, anc, sizeof(int32_t) * (size_t)N * docs, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(keep_d, keep, (size_t)N * docs, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaDeviceSynchronize());
            /* packed: the documents' kept slots one after the other (as the trainer) */
            dflash_batch_cuda b = {S * docs, docs > 1 ? n : N, docs > 1 ? -1 : n,   Hd,     1,     x_d, lm_d,
                                   anc_d,    keep_d,           docs > 1 ? docs : 0, starts, nreal, N};
            printf("bench_drafter: [%s] S=%d anchors=%d docs=%d (%d real): warmup %d, timing %d steps ...\n",
                   schemes[si], S, N, docs, n, warmup, iters);
            fflush(stdout);
            result *o = &res[nres++];
            for (int it = 0; it < warmup + iters; it++) {
                CUDA_CHECK(cudaEventRecord(e0, s));
                RC_CHECK(dflash_zero_grads_cuda(ctx, g_err, sizeof g_err), g_err);
                RC_CHECK(dflash_step_accumulate_cuda(ctx, &b, 0, NULL, g_err, sizeof g_err), g_err);
                RC_CHECK(dflash_optimizer_step_cuda(ctx, NULL, g_err, sizeof g_err), g_err);
                CUDA_CHECK(cudaEventRecord(e1, s));
                CUDA_CHECK(cudaEventSynchronize(e1));
                if (it >= warmup)
                    CUDA_CHECK(cudaEventElapsedTime(&o->all_ms[o->n_ms++], e0, e1));
            }
            /* one more step with phase events (not in the median: events add a little) */
            RC_CHECK(dflash_timing_enable_cuda(ctx, 1, g_err, sizeof g_err), g_err);
            RC_CHECK(dflash_zero_grads_cuda(ctx, g_err, sizeof g_err), g_err);
            RC_CHECK(dflash_step_accumulate_cuda(ctx, &b, 0, NULL, g_err, sizeof g_err), g_err);
            RC_CHECK(dflash_optimizer_step_cuda(ctx, NULL, g_err, sizeof g_err), g_err);
            RC_CHECK(dflash_timing_read_cuda(ctx, &o->ph, g_err, sizeof g_err), g_err);
            RC_CHECK(dflash_timing_enable_cuda(ctx, 0, g_err, sizeof g_err), g_err);
            dflash_stats st;
            RC_CHECK(dflash_stats_read_cuda(ctx, &st, g_err, sizeof g_err), g_err);
            float sorted[64];
            memcpy(sorted, o->all_ms, sizeof(float) * (size_t)o->n_ms);
            qsort(sorted, (size_t)o->n_ms, sizeof(float), cmp_f);
            o->attn = schemes[si];
            o->S = S, o->anchors = N, o->real = n, o->docs = docs, o->ms = sorted[o->n_ms / 2], o->tflop = flops / 1e12;
            o->tflops = flops / (o->ms * 1e-3) / 1e12, o->mfu = ceiling > 0 ? o->tflops / ceiling : 0;
            o->loss = st.loss, o->attn_pairs = pairs;
            printf("bench_drafter: [%s] S=%d anchors=%d docs=%d: %.2f ms/step, %.1f TFLOP/s, MFU %.1f%%, loss %.4f\n",
                   schemes[si], S, N, docs, o->ms, o->tflops, 100 * o->mfu, o->loss);
            printf("bench_drafter:   phases: forward %.2f ms (attention %.2f), loss %.2f, backward %.2f ms (attention "
                   "%.2f), optimizer %.2f\n",
                   o->ph.fwd_ms, o->ph.attn_fwd_ms, o->ph.loss_ms, o->ph.bwd_ms, o->ph.attn_bwd_ms, o->ph.opt_ms);
            if (check)
                printf("bench_drafter: check: S=%d anchors=%d loss %a wce %a sum_w %a\n", S, N, st.loss, st.wce,
                       st.sum_w);
            if (!isfinite(st.loss)) {
                fprintf(stderr, "bench_drafter: non-finite loss\n");
                return 1;
            }
        }
        if (si + 1 < nsch) {
            dflash_free_cuda(ctx);
            ctx = NULL;
        }
    }

    if (check) {
        float *P = (float *)malloc(sizeof(float) * np);
        if (!P) {
            fprintf(stderr, "bench_drafter: out of host memory\n");
            return 1;
        }
        RC_CHECK(dflash_params_to_host_cuda(ctx, P, g_err, sizeof g_err), g_err);
        int wrc;
        if ((wrc = df_write_file_atomic(check, P, sizeof(float) * np)) < 0) {
            fprintf(stderr, "bench_drafter: cannot write %s: %s\n", check, strerror(-wrc));
            return 1;
        }
        printf("bench_drafter: check: wrote %zu fp32 weights to %s\n", np, check);
        free(P);
    }
    /* the optimizer alone (after the check file: it moves the weights) beside a device copy */
    opt_result opt = measure_optimizer(ctx, dflash_stream_cuda(ctx), np);
    printf("bench_drafter: optimizer: %.3f ms for %zu params, %.2f GB moved (%d B/param), %.0f GB/s = %.1f%% of "
           "a device copy (%.0f GB/s, cudaMemcpy of %.1f GiB, best of %d)\n",
           opt.ms, np, opt.bytes / 1e9, ADAMW_BYTES_PER_PARAM_CUDA, opt.gb_s, 100 * opt.frac, opt.copy_gb_s,
           (double)COPY_BYTES / (1u << 30), COPY_REPS);
    /* what a checkpoint's copy to the host costs the loop (trainer_to_host: the weights and
     * both moments into pageable host buffers, touched before), best of 2 */
    double ck_s = 0, ck_bytes = 3.0 * sizeof(float) * (double)np;
    {
        float *hp = malloc(sizeof(float) * np), *hm = malloc(sizeof(float) * np), *hv = malloc(sizeof(float) * np);
        if (!hp || !hm || !hv) {
            fprintf(stderr, "bench_drafter: out of host memory for the checkpoint copy\n");
            return 1;
        }
        memset(hp, 0, sizeof(float) * np), memset(hm, 0, sizeof(float) * np), memset(hv, 0, sizeof(float) * np);
        for (int r = 0; r < 2; r++) {
            long st;
            double t0 = (double)df_now_ns() * 1e-9;
            if (dflash_params_to_host_cuda(ctx, hp, g_err, sizeof g_err) < 0 ||
                dflash_opt_to_host_cuda(ctx, hm, hv, &st, g_err, sizeof g_err) < 0) {
                fprintf(stderr, "bench_drafter: checkpoint copy: %s\n", g_err);
                return 1;
            }
            double dt = (double)df_now_ns() * 1e-9 - t0;
            if (!r || dt < ck_s)
                ck_s = dt;
        }
        free(hp), free(hm), free(hv);
    }
    printf(
        "bench_drafter: checkpoint copy to the host (weights + both moments, %.2f GB, pageable): %.3f s (%.1f GB/s)\n",
        ck_bytes / 1e9, ck_s, ck_bytes / 1e9 / ck_s);

    printf("\n%-9s %-6s %-8s %-4s %-6s %10s %10s %10s %9s %8s %8s\n", "attention", "S", "anchors", "docs", "real",
           "ms/step", "samples/s", "TFLOP/step", "TFLOP/s", "MFU", "loss");
    for (int i = 0; i < nres; i++)
        printf("%-9s %-6d %-8d %-4d %-6d %10.2f %10.2f %10.2f %9.1f %7.1f%% %8.4f\n", res[i].attn, res[i].S,
               res[i].anchors, res[i].docs, res[i].real, res[i].ms, 1000.0 * res[i].docs / res[i].ms, res[i].tflop,
               res[i].tflops, 100 * res[i].mfu, res[i].loss);
    printf("(GEMM ceiling %.1f TFLOP/s, %s)\n", ceiling, prop.name);
    printf("\nphases (ms):\n%-9s %-6s %-8s %-4s %9s %9s %9s %9s %9s %9s\n", "attention", "S", "anchors", "docs",
           "forward", "attn fwd", "loss", "backward", "attn bwd", "optimizer");
    for (int i = 0; i < nres; i++)
        printf("%-9s %-6d %-8d %-4d %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f\n", res[i].attn, res[i].S, res[i].anchors,
               res[i].docs, res[i].ph.fwd_ms, res[i].ph.attn_fwd_ms, res[i].ph.loss_ms, res[i].ph.bwd_ms,
               res[i].ph.attn_bwd_ms, res[i].ph.opt_ms);

    char *slash = strrchr(json, '/');
    if (slash) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - json), json);
        df_mkdir_p(dir, 0755);
    }
    char buf[65536];
    int rc;
    size_t off = 0;
    time_t now = time(NULL);
    struct tm tmv;
    gmtime_r(&now, &tmv);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tmv);
    off += (size_t)snprintf(buf + off, sizeof buf - off, "[\n");
    for (int i = 0; i < nres; i++) {
        off += (size_t)snprintf(
            buf + off, sizeof buf - off,
            " {\"bench\": \"drafter_step_cuda\", \"attn\": \"%s\", \"docs\": %d, \"shape\": \"%s\", "
            "\"seq\": %d, \"anchors\": %d, "
            "\"real_anchors\": %d, \"block_size\": %d, \"ms_per_step\": %.3f, \"ms_per_sample\": %.3f, "
            "\"samples_per_s\": %.3f, \"tflop_per_step\": %.3f, \"tflops\": %.1f, \"mfu\": %.4f, "
            "\"gemm_ceiling_tflops\": %.1f, \"loss\": %.4f, \"chunk_rows\": %d, \"warmup\": %d, "
            "\"iters\": %d, \"attention_pairs\": %.0f, \"device\": \"%s\", \"date\": \"%s\", "
            "\"phase_ms\": {\"forward\": %.3f, \"attention_fwd\": %.3f, \"loss\": %.3f, "
            "\"backward\": %.3f, \"attention_bwd\": %.3f, \"optimizer\": %.3f}, "
            "\"optimizer_ms\": %.3f, \"optimizer_bytes\": %.0f, \"optimizer_gb_s\": %.1f, "
            "\"copy_ceiling_gb_s\": %.1f, \"optimizer_frac_of_copy\": %.4f, "
            "\"ckpt_copy_bytes\": %.0f, \"ckpt_copy_s\": %.4f, "
            "\"step_ms_all\": [",
            res[i].attn, res[i].docs, tiny ? "tiny" : shape->label, res[i].S, res[i].anchors, res[i].real, B, res[i].ms,
            res[i].ms / res[i].docs, 1000.0 * res[i].docs / res[i].ms, res[i].tflop, res[i].tflops, res[i].mfu, ceiling,
            res[i].loss, chunk, warmup, iters, res[i].attn_pairs, prop.name, date, res[i].ph.fwd_ms,
            res[i].ph.attn_fwd_ms, res[i].ph.loss_ms, res[i].ph.bwd_ms, res[i].ph.attn_bwd_ms, res[i].ph.opt_ms, opt.ms,
            opt.bytes, opt.gb_s, opt.copy_gb_s, opt.frac, ck_bytes, ck_s);
        for (int k = 0; k < res[i].n_ms; k++)
            off += (size_t)snprintf(buf + off, sizeof buf - off, "%s%.3f", k ? ", " : "", res[i].all_ms[k]);
        off += (size_t)snprintf(buf + off, sizeof buf - off, "]}%s\n", i + 1 < nres ? "," : "");
    }
    off += (size_t)snprintf(buf + off, sizeof buf - off, "]\n");
    if (off >= sizeof buf || (rc = df_write_file_atomic(json, buf, off)) < 0) {
        fprintf(stderr, "bench_drafter: cannot write %s: %s\n", json, off >= sizeof buf ? "too long" : strerror(-rc));
        return 1;
    }
    printf("bench_drafter: wrote %s\n", json);
    dflash_free_cuda(ctx);
    return 0;
}
#endif /* DF_WITH_CUDA */
