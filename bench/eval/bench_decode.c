/* bench_decode: greedy decoding on the GPU at the Qwen3-1.7B and Qwen3-8B shapes, and with
 * --models 30b-a3b the Qwen3-30B-A3B mixture of experts (random
 * bf16 weights made on the device, no files): plain decoding against its memory ceiling,
 * the parts of a speculative step (draft, 16-row verify, accept + feature append), and the
 * speculative loop at several acceptance rates, with its output checked against plain
 * decoding token for token.
 *
 * Ceiling: the bytes a step must read (every linear weight once, the lm_head, the K/V
 * rows attended to: decode_step_bytes_cuda / infer_draft_bytes_cuda) over the bandwidth of
 * a 2 GiB device-to-device copy measured in the same run (bytes read + written).
 *
 * The speculative loop runs eval/spec_decode.c's spec_generate over the CUDA target and
 * the CUDA drafter (random weights, 5 layers, block 16, the target's shape); random
 * weights cannot draft, so a drafting step runs the real drafter (its time is real) and
 * then replaces its tokens by the plain output's next tokens with each token corrupted
 * with probability q (q = 1: nothing accepted, tau 1; q = 0: every draft right, tau ~16):
 * the time per token at the tau a trained drafter would reach. Lossless: its output
 * equals plain greedy decoding token for token.
 *
 * --linear-sweep instead: per shape the plain step, verify and draft under each small-row
 * linear kernel variant (decode_linear_variant_cuda; --variant V picks them, default all)
 * and under attention key rounds and fused sequences, then every linear shape of a step at
 * 1 and 16 rows (GB/s of weights and % of the copy ceiling, weights cycled through >= 256
 * MB so they come from HBM) and the step's other kernels (JSON default
 * bench/results/eval/linear_sweep.json). Without it, --variant V runs the bench under V.
 *
 * Batches (--batch N, default 4; 1 skips them): N prompts of different lengths (P, P-8,
 * ...) decoded together by spec_generate_batch over one target with N sequences (one
 * drafter context per sequence, shared weights), plain and speculative at the same
 * corruption rates; tokens/s = new tokens of all prompts over the batch's decode time,
 * beside batch 1 (the loops above); lossless = every prompt's output equals its lone
 * plain greedy run token for token. Then a queue: 4N prompts through the N sequences
 * (a prompt that finishes hands its sequence to the next), plain and speculative at
 * q = 0.12 with the drafts together: the batch rate without the ragged end of a fixed
 * batch (its last steps run with finished sequences beside the slowest).
 *
 * Kernel sequences: the plain step, verify and draft under the sequence before the
 * bit-exact fusions (DECODE_FUSED_SEPARATE), with each of them added, and the default: the
 * before / after of one process. --quick measures the steps and these only.
 *
 * Prints a table; writes JSON (--json, default bench/results/eval/decode.json). Exit 77
 * without a GPU; a CPU build says it needs CUDA=1 and exits 0 (so `make bench` stays green). */
#ifndef DF_WITH_CUDA
#include <stdio.h>
int main(void)
{
    printf("SKIPPED: bench_decode needs a CUDA=1 build\n");
    return 0;
}
#else
#include <cuda_runtime_api.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dflash/dflash_config.h"
#include "dflash/dflash_model.h"
#include "eval/dflash_infer_cuda.h"
#include "eval/spec_decode.h"
#include "io/hfconfig.h"
#include "target/decode_kernels_cuda.h"
#include "target/target_decode_cuda.h"
#include "tests/gpu_test_check.h"
#include "util.h"

static char g_err[1024];

typedef struct shape {
    const char *name, *key;
    int d, L, H, KV, hd, I, V, tied;
    int E, k, F; /* routed experts (every layer sparse), 0: dense */
} shape;

static const shape SHAPES[] = {
    {"Qwen3-1.7B", "1.7b", 2048, 28, 16, 8, 128, 6144, 151936, 1, 0, 0, 0},
    {"Qwen3-8B", "8b", 4096, 36, 32, 8, 128, 12288, 151936, 0, 0, 0, 0},
    /* only when asked (--models 30b-a3b): 61 GB of bf16 experts; the drafter is dense, of the
     * config's intermediate_size */
    {"Qwen3-30B-A3B", "30b-a3b", 2048, 48, 32, 4, 128, 6144, 151936, 0, 128, 8, 768},
};

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double now_ms(void)
{
    return (double)df_now_ns() * 1e-6;
}

/* ---- spec_decode adapters over the CUDA models, with an oracle on top of the drafter ---- */

typedef struct oracle {
    infer_state_cuda *dr;
    const int32_t *plain; /* the plain output (after the prompt) */
    int n_plain;
    int n_prompt;
    double corrupt; /* probability that a drafted token is replaced by a wrong one */
    df_rng rng;
    int V;
} oracle;

static int t_reset(void *ctx)
{
    decode_reset_cuda(ctx);
    return 0;
}
static int t_extend(void *ctx, const int32_t *tokens, int k, int n_next, int32_t *next, const float **feats)
{
    decode_model_cuda *m = ctx;
    int rc = decode_extend_cuda(m, tokens, k, n_next, next, g_err, sizeof g_err);
    *feats = (const float *)m->feat;
    return rc;
}
static int t_truncate(void *ctx, int len)
{
    return decode_truncate_cuda(ctx, len);
}
static int t_reset_seq(void *ctx, int seq)
{
    decode_reset_seq_cuda(ctx, seq);
    return 0;
}
static int t_extend_seq(void *ctx, int seq, const int32_t *tokens, int k, int n_next, int32_t *next,
                        const float **feats)
{
    decode_model_cuda *m = ctx;
    int rc = decode_extend_seq_cuda(m, seq, tokens, k, n_next, next, g_err, sizeof g_err);
    *feats = (const float *)m->feat;
    return rc;
}
static int t_truncate_seq(void *ctx, int seq, int len)
{
    return decode_truncate_seq_cuda(ctx, seq, len);
}
static int t_extend_batch(void *ctx, const int32_t *tokens, const int *ks, int32_t *next, const float **feats)
{
    decode_model_cuda *m = ctx;
    int rc = decode_extend_batch_cuda(m, tokens, ks, next, g_err, sizeof g_err);
    *feats = (const float *)m->feat;
    return rc;
}
static int d_reset(void *ctx)
{
    infer_reset_cuda(((oracle *)ctx)->dr);
    return 0;
}
static int d_append(void *ctx, const float *feats, int n)
{
    return infer_append_cuda(((oracle *)ctx)->dr, (const nn_bf16_cuda *)feats, n, g_err, sizeof g_err);
}
/* The oracle's tokens over a real draft: the plain output, a fraction corrupted. */
static void oracle_fill(oracle *o, int32_t *draft)
{
    if (!o->plain)
        return;
    /* the anchor is output token j = n_ctx - n_prompt; draft k predicts output j + k */
    int j = o->dr->n_ctx - o->n_prompt, B = o->dr->c->block_size;
    for (int k = 1; k < B; k++) {
        int at = j + k;
        int32_t t = at < o->n_plain ? o->plain[at] : 0;
        if (df_rng_uniform(&o->rng) < o->corrupt)
            t = (t + 1 + (int32_t)df_rng_below(&o->rng, (uint64_t)o->V - 1)) % o->V;
        draft[k - 1] = t;
    }
}
static int d_draft(void *ctx, int32_t anchor, int32_t *draft)
{
    oracle *o = ctx;
    int rc = infer_draft_cuda(o->dr, anchor, draft, g_err, sizeof g_err);
    if (rc == 0)
        oracle_fill(o, draft);
    return rc;
}
/* A batch's drafts in one call (infer_batch_draft_cuda), then each sequence's oracle. */
typedef struct oracle_batch {
    infer_batch_cuda *ib;
    oracle *o;        /* per prompt */
    int *slot_prompt; /* a queue: [n_seq] the prompt sequence s serves; NULL: prompt s */
} oracle_batch;
static oracle *seq_oracle(oracle_batch *ob, int s)
{
    return &ob->o[ob->slot_prompt ? ob->slot_prompt[s] : s];
}
static int d_draft_batch(void *bctx, int n, const int *seqs, const int32_t *anchors, int32_t *drafts)
{
    oracle_batch *ob = bctx;
    int rc = infer_batch_draft_cuda(ob->ib, n, seqs, anchors, drafts, g_err, sizeof g_err);
    for (int j = 0; rc == 0 && j < n; j++)
        oracle_fill(seq_oracle(ob, seqs[j]), drafts + (size_t)j * (ob->ib->from->c->block_size - 1));
    return rc;
}
/* Sequence s's drafter in a queue (more prompts than sequences): the oracle of the prompt
 * spec_generate_batch assigns to it, drafting with that sequence's drafter context. */
typedef struct oracle_slot {
    oracle_batch *ob;
    int s;
} oracle_slot;
static int q_assign(void *ctx, int prompt)
{
    oracle_slot *q = ctx;
    q->ob->slot_prompt[q->s] = prompt;
    q->ob->o[prompt].dr = &q->ob->ib->seq[q->s];
    return 0;
}
static int q_reset(void *ctx)
{
    oracle_slot *q = ctx;
    return d_reset(seq_oracle(q->ob, q->s));
}
static int q_append(void *ctx, const float *feats, int n)
{
    oracle_slot *q = ctx;
    return d_append(seq_oracle(q->ob, q->s), feats, n);
}
static int q_draft(void *ctx, int32_t anchor, int32_t *draft)
{
    oracle_slot *q = ctx;
    return d_draft(seq_oracle(q->ob, q->s), anchor, draft);
}

/* The target's config.json fields of a bench shape (random weights: no file). */
static void shape_config(hfconfig *c, const shape *sh)
{
    memset(c, 0, sizeof *c);
    c->arch = HFCONFIG_ARCH_QWEN3;
    c->hidden_size = sh->d, c->intermediate_size = sh->I, c->num_hidden_layers = sh->L;
    c->num_attention_heads = sh->H, c->num_key_value_heads = sh->KV, c->head_dim = sh->hd;
    c->vocab_size = sh->V, c->rms_norm_eps = 1e-6, c->rope_theta = 1e6, c->qk_norm = 1;
    c->tie_word_embeddings = sh->tied;
    snprintf(c->rope_type, sizeof c->rope_type, "default");
    if (sh->E) { /* every layer sparse (a static mask: these configs are never freed) */
        static unsigned char all_sparse[256];
        memset(all_sparse, 1, sizeof all_sparse);
        c->arch = HFCONFIG_ARCH_QWEN3_MOE;
        c->num_experts = sh->E, c->num_experts_per_tok = sh->k, c->moe_intermediate_size = sh->F;
        c->norm_topk_prob = 1, c->decoder_sparse_step = 1;
        c->moe_layer = all_sparse, c->n_moe_layers = sh->L;
    }
}

static void drafter_config(dflash_config *c, const shape *sh)
{
    dflash_config_tiny(c);
    c->hidden = sh->d, c->intermediate = sh->I, c->n_layers = 5, c->n_heads = sh->H, c->n_kv_heads = sh->KV;
    c->head_dim = sh->hd, c->vocab = sh->V, c->block_size = 16, c->n_capture = 5, c->num_target_layers = sh->L;
    dflash_default_layer_ids(c->target_layer_ids, 5, sh->L);
    c->mask_token_id = sh->V - 1, c->sliding_window = 0;
    memset(c->layer_sliding, 0, sizeof c->layer_sliding);
    c->tie_word_embeddings = sh->tied, c->max_position_embeddings = 40960;
    c->rms_norm_eps = 1e-6, c->rope_theta = 1e6, c->gamma = 7.0;
}

/* Norms 1, linear weights uniform with std 0.02 (fast; the values do not matter here). */
static void drafter_params(dflash_params *p, const dflash_config *c, uint64_t seed)
{
    if (dflash_params_alloc(p, c) < 0) {
        fprintf(stderr, "bench_decode: out of host memory for the drafter\n");
        exit(1);
    }
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    int nt = dflash_tensor_count(c);
    for (int i = 0; i < nt; i++) {
        dflash_tensor t;
        dflash_tensor_info(c, i, &t);
        float *v = p->data + t.offset;
        for (size_t j = 0; j < t.numel; j++) {
            if (t.is_norm) {
                v[j] = 1.0f;
                continue;
            }
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            v[j] = (float)((double)(x >> 11) / 9007199254740992.0 * 2 - 1) * 0.0346f;
        }
    }
}

/* ---- --linear-sweep: each linear shape of a step, every kernel variant ------------------ */

/* ms per call of decode_linear_rows_cuda (swiglu 1: the SwiGLU one; 2: the chunk-major
 * one, decode_linear_rows_xc_cuda) at T rows, replayed in a graph of `calls` launches
 * cycling through `nw` weight copies (>= 256 MB in all, so the weights come from HBM, not
 * L2) */
static double time_linear(int T, int K, int N, int swiglu, int out_f32, const nn_bf16_cuda *x, nn_bf16_cuda **w, int nw,
                          void *out, int calls, cudaStream_t s)
{
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    int rc = 0;
    for (int i = 0; i < calls && rc == 0; i++)
        rc = swiglu == 1
                 ? decode_linear_swiglu_rows_cuda(out, out_f32, x, w[i % nw], NULL, T, K, N, s, g_err, sizeof g_err)
             : swiglu == 2
                 ? decode_linear_rows_xc_cuda(out, out_f32, x, w[i % nw], NULL, T, K, N, s, g_err, sizeof g_err)
                 : decode_linear_rows_cuda(out, out_f32, x, w[i % nw], NULL, T, K, N, s, g_err, sizeof g_err);
    cudaError_t ce = cudaStreamEndCapture(s, &g);
    if (rc < 0 || ce != cudaSuccess || cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
        printf("[failed: %s %s]", g_err, cudaGetErrorString(cudaGetLastError()));
        return -1;
    }
    cudaGraphDestroy(g);
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    double t[5];
    for (int r = 0; r < 6; r++) {
        CUDA_CHECK(cudaEventRecord(e0, s));
        CUDA_CHECK(cudaGraphLaunch(ge, s));
        CUDA_CHECK(cudaEventRecord(e1, s));
        CUDA_CHECK(cudaEventSynchronize(e1));
        float ms;
        CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (r > 0)
            t[r - 1] = ms / calls;
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaGraphExecDestroy(ge);
    return median(t, 5);
}

/* The kernel sequence of fused bits, short. */
static const char *fz_name(int fz)
{
    switch (fz) {
    case 0: return "sep";
    case 1: return "all";
    case DECODE_FUSE_QK_APPEND: return "qk";
    case DECODE_FUSE_QK_APPEND | DECODE_FUSE_RESIDUAL: return "qk+res";
    case DECODE_FUSE_RESIDUAL: return "res";
    default: return "other";
    }
}

/* Kernel sequences measured side by side (the same bits, only time differs): the one
 * before the bit-exact fusions (DECODE_FUSED_SEPARATE, small kernels launched plainly),
 * then one change at a time up to the default, and the default with one setting
 * flipped. fused -1: the default; pdl / cols -1: the default setting. */
typedef struct seq_cfg {
    const char *name;
    int fused, pdl, cols;
} seq_cfg;
static const seq_cfg SEQ_CFGS[] = {
    {"before (separate)", DECODE_FUSED_SEPARATE, 0, 1},
    {"+ PDL small kernels", DECODE_FUSED_SEPARATE, 1, 1},
    {"+ SwiGLU epilogue", DECODE_FUSED_SEPARATE | DECODE_FUSE_GLU, 1, 1},
    {"+ 2 column tiles", DECODE_FUSED_SEPARATE | DECODE_FUSE_GLU, 1, 2},
    {"+ argmax split", DECODE_FUSED_SEPARATE | DECODE_FUSE_GLU | DECODE_FUSE_ARGMAX_SPLIT, 1, 2},
    {"+ 2 tiles also 1-row", DECODE_FUSED_SEPARATE | DECODE_FUSE_GLU | DECODE_FUSE_ARGMAX_SPLIT, 1, 3},
    {"+ 2 tiles also 16w 16-row", DECODE_FUSED_SEPARATE | DECODE_FUSE_GLU | DECODE_FUSE_ARGMAX_SPLIT, 1, 4},
    {"default", -1, -1, -1},
    {"default, 16w 1 tile", -1, -1, 2},
    {"default, 1 tile", -1, -1, 1},
    {"default + argmax in lm_head", -2, -1, -1},
    {"default + q/k tail", -3, -1, -1},
    {"default + add_rmsnorm tail", -4, -1, -1},
    {"default ^ chunk-major x", -5, -1, -1},
};
#define N_SEQ_CFGS ((int)(sizeof SEQ_CFGS / sizeof SEQ_CFGS[0]))

/* The fused bits of configuration c given the default dflt. */
static int seq_fused(const seq_cfg *c, int dflt)
{
    switch (c->fused) {
    case -1: return dflt;
    case -2: return dflt | DECODE_FUSE_ARGMAX;
    case -3: return dflt | DECODE_FUSE_QK_TAIL;
    case -4: return dflt | DECODE_FUSE_NORM;
    case -5: return dflt ^ DECODE_FUSE_XC; /* the other activation layout */
    default: return c->fused;
    }
}

/* Median ms of a plain step, a 16-row verify (truncated back each time) and a draft, CUDA
 * graphs, with both models on kernel sequence fz; after a prefill of the prompt, whose
 * features are the drafter's context. */
static void steps_under(decode_model_cuda *m, infer_state_cuda *dr, int fz, const int32_t *prompt, int P, int V,
                        int reps, df_rng *rng, double out[3])
{
    double t_ms[64];
    int32_t next[16], blk[16], draft[16];
    m->fused = fz, m->use_graphs = 1;
    decode_drop_graphs_cuda(m);
    if (dr->draft_graph)
        cudaGraphExecDestroy(dr->draft_graph);
    dr->draft_graph = NULL;
    dr->fused = fz;
    decode_reset_cuda(m);
    RC_CHECK(decode_extend_cuda(m, prompt, P, 1, next, g_err, sizeof g_err), g_err);
    infer_reset_cuda(dr);
    RC_CHECK(infer_append_cuda(dr, m->feat, P, g_err, sizeof g_err), g_err);
    for (int i = 0; i < reps + 3; i++) {
        double a = now_ms();
        RC_CHECK(decode_extend_cuda(m, next, 1, 1, next, g_err, sizeof g_err), g_err);
        if (i >= 3)
            t_ms[i - 3] = now_ms() - a;
    }
    out[0] = median(t_ms, reps);
    int len = m->len;
    for (int i = 0; i < 16; i++)
        blk[i] = (int32_t)df_rng_below(rng, (uint64_t)V - 1);
    for (int i = 0; i < reps + 3; i++) {
        double a = now_ms();
        RC_CHECK(decode_extend_cuda(m, blk, 16, 16, next, g_err, sizeof g_err), g_err);
        if (i >= 3)
            t_ms[i - 3] = now_ms() - a;
        RC_CHECK(decode_truncate_cuda(m, len), g_err);
    }
    out[1] = median(t_ms, reps);
    for (int i = 0; i < reps + 3; i++) {
        double a = now_ms();
        RC_CHECK(infer_draft_cuda(dr, next[0], draft, g_err, sizeof g_err), g_err);
        if (i >= 3)
            t_ms[i - 3] = now_ms() - a;
    }
    out[2] = median(t_ms, reps);
    if (dr->draft_graph)
        cudaGraphExecDestroy(dr->draft_graph);
    dr->draft_graph = NULL;
    decode_drop_graphs_cuda(m);
}

/* A failed step of one configuration of the sweep: say so and go on with the next. */
#define SOFT(call)                                                                                                \
    do {                                                                                                          \
        int r_ = (call);                                                                                          \
        if (r_ < 0) {                                                                                             \
            printf("%s keys %d %s: %s failed (%d): %s\n", decode_linear_variant_name_cuda(vars[vi]), keys_of[ki], \
                   fz_name(fz), #call, r_, g_err);                                                                \
            cudaGetLastError();                                                                                   \
            goto next_cfg;                                                                                        \
        }                                                                                                         \
    } while (0)

/* us per call of the step's other kernels, a graph of L calls (one per layer: each
 * attention reads its own layer's cache of P keys), at T rows */
static void time_others(const shape *sh, int P, int T, FILE *jf, cudaStream_t s)
{
    int d = sh->d, H = sh->H, KV = sh->KV, hd = sh->hd, I = sh->I, V = sh->V, L = sh->L;
    int qn = (H + 2 * KV) * hd, ctx = P + 64;
    size_t kvl = (size_t)ctx * KV * hd;
    float *x, *w, *fl, *logits;
    nn_bf16_cuda *y, *a, *qkv, *kc, *vc, *att, *gu, *h;
    int32_t *pos, *idx;
    CUDA_CHECK(cudaMalloc((void **)&x, sizeof(float) * 64 * d));
    CUDA_CHECK(cudaMalloc((void **)&w, sizeof(float) * d));
    CUDA_CHECK(cudaMalloc((void **)&fl, sizeof(float) * 3 * hd));
    CUDA_CHECK(cudaMalloc((void **)&logits, sizeof(float) * 64 * (size_t)V));
    CUDA_CHECK(cudaMalloc((void **)&y, 2 * 64 * (size_t)d));
    CUDA_CHECK(cudaMalloc((void **)&a, 2 * 64 * (size_t)d));
    CUDA_CHECK(cudaMalloc((void **)&qkv, 2 * 64 * (size_t)qn));
    CUDA_CHECK(cudaMalloc((void **)&kc, 2 * kvl * L));
    CUDA_CHECK(cudaMalloc((void **)&vc, 2 * kvl * L));
    CUDA_CHECK(cudaMalloc((void **)&att, 2 * 64 * (size_t)H * hd));
    CUDA_CHECK(cudaMalloc((void **)&gu, 2 * 64 * 2 * (size_t)I));
    CUDA_CHECK(cudaMalloc((void **)&h, 2 * 64 * (size_t)I));
    CUDA_CHECK(cudaMalloc((void **)&pos, sizeof(int32_t) * 64));
    CUDA_CHECK(cudaMalloc((void **)&idx, sizeof(int32_t) * 64));
    RC_CHECK(nn_fill_uniform_f32_cuda(x, 64 * (size_t)d, 1, 0.0f, 1.0f, s, g_err, sizeof g_err), g_err);
    RC_CHECK(nn_fill_uniform_f32_cuda(w, d, 2, 1.0f, 0.1f, s, g_err, sizeof g_err), g_err);
    RC_CHECK(nn_fill_uniform_f32_cuda(fl, 3 * (size_t)hd, 3, 0.5f, 0.1f, s, g_err, sizeof g_err), g_err);
    RC_CHECK(nn_fill_uniform_f32_cuda(logits, 64 * (size_t)V, 4, 0.0f, 1.0f, s, g_err, sizeof g_err), g_err);
    RC_CHECK(nn_fill_uniform_bf16_cuda(y, 64 * (size_t)d, 5, 1.0f, s, g_err, sizeof g_err), g_err);
    RC_CHECK(nn_fill_uniform_bf16_cuda(qkv, 64 * (size_t)qn, 6, 1.0f, s, g_err, sizeof g_err), g_err);
    RC_CHECK(nn_fill_uniform_bf16_cuda(kc, kvl * L, 7, 1.0f, s, g_err, sizeof g_err), g_err);
    RC_CHECK(nn_fill_uniform_bf16_cuda(vc, kvl * L, 8, 1.0f, s, g_err, sizeof g_err), g_err);
    RC_CHECK(nn_fill_uniform_bf16_cuda(gu, 64 * 2 * (size_t)I, 9, 1.0f, s, g_err, sizeof g_err), g_err);
    RC_CHECK(decode_positions_cuda(pos, NULL, P, 16, s, g_err, sizeof g_err), g_err);
    static const char *names[] = {"add_rmsnorm",  "qk_norm_rope",  "kv_append", "qk_rope_append", "attention k4",
                                  "attention k8", "attention k16", "swiglu",    "argmax"};
    printf("%d rows, us per call:", T);
    fprintf(jf, "%s{\"rows\": %d", T == 1 ? "" : ", ", T);
    for (int kind = 0; kind < 9; kind++) {
        if (kind >= 4 && kind <= 6)
            decode_attention_keys_cuda(kind == 4 ? 4 : kind == 5 ? 8 : 16);
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int l = 0; l < L; l++) {
            nn_bf16_cuda *kl = kc + l * kvl, *vl = vc + l * kvl;
            switch (kind) {
            case 0:
                RC_CHECK(nn_add_rmsnorm_cuda(x, y, w, a, NULL, 0, T, d, 1e-6f, s, g_err, sizeof g_err), g_err);
                break;
            case 1:
                RC_CHECK(nn_qk_norm_rope_cuda(qkv, fl, fl + hd, fl + 2 * hd, pos, T, H, KV, hd, 1e-6f, s, g_err,
                                              sizeof g_err),
                         g_err);
                break;
            case 2:
                RC_CHECK(decode_kv_append_cuda(kl, vl, qkv, T, H, KV, hd, NULL, P, s, g_err, sizeof g_err), g_err);
                break;
            case 3:
                RC_CHECK(decode_qk_norm_rope_append_cuda(qkv, fl, fl + hd, fl + 2 * hd, kl, vl, T, H, KV, hd, 1e-6f,
                                                         NULL, P, s, g_err, sizeof g_err),
                         g_err);
                break;
            case 4:
            case 5:
            case 6:
                RC_CHECK(decode_attention_cuda(att, qkv, qn, kl, vl, NULL, NULL, P, 0, T, H, KV, hd, 0.088f, s, g_err,
                                               sizeof g_err),
                         g_err);
                break;
            case 7: RC_CHECK(nn_swiglu_cuda(h, gu, T, I, s, g_err, sizeof g_err), g_err); break;
            default: RC_CHECK(decode_argmax_rows_cuda(idx, logits, T, V, s, g_err, sizeof g_err), g_err);
            }
        }
        CUDA_CHECK(cudaStreamEndCapture(s, &g));
        CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
        cudaGraphDestroy(g);
        cudaEvent_t e0, e1;
        CUDA_CHECK(cudaEventCreate(&e0));
        CUDA_CHECK(cudaEventCreate(&e1));
        double t[5];
        for (int r = 0; r < 6; r++) {
            CUDA_CHECK(cudaEventRecord(e0, s));
            CUDA_CHECK(cudaGraphLaunch(ge, s));
            CUDA_CHECK(cudaEventRecord(e1, s));
            CUDA_CHECK(cudaEventSynchronize(e1));
            float ms;
            CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
            if (r > 0)
                t[r - 1] = ms * 1e3 / L;
        }
        cudaEventDestroy(e0), cudaEventDestroy(e1);
        cudaGraphExecDestroy(ge);
        double us = median(t, 5);
        printf(" %s %.2f", names[kind], us);
        fprintf(jf, ", \"%s_us\": %.3f", names[kind], us);
    }
    decode_attention_keys_cuda(4);
    printf("\n");
    fprintf(jf, "}");
    cudaFree(x), cudaFree(w), cudaFree(fl), cudaFree(logits), cudaFree(y), cudaFree(a), cudaFree(qkv);
    cudaFree(kc), cudaFree(vc), cudaFree(att), cudaFree(gu), cudaFree(h), cudaFree(pos), cudaFree(idx);
}

/* Per shape: the steps (plain, verify 16, draft) under each variant, then every linear
 * shape of a step at 1, 16 and 64 rows: GB/s of weights read and % of the copy ceiling. */
static void linear_sweep(const char *models, const int *vars, int nv, double bw, FILE *jf, int P)
{
    int first = 1;
    fprintf(jf, "{\"copy_bw_Bps\": %.4g, \"variants\": [", bw);
    for (int i = 0; i < nv; i++)
        fprintf(jf, "%s\"%s\"", i ? ", " : "", decode_linear_variant_name_cuda(vars[i]));
    fprintf(jf, "], \"default\": \"%s\", \"shapes\": [",
            decode_linear_variant_name_cuda(decode_linear_variant_cuda(-1)));
    int dflt = decode_linear_variant_cuda(-1);
    for (size_t si = 0; si < DF_ARRAY_LEN(SHAPES); si++) {
        const shape *sh = &SHAPES[si];
        if (!strstr(models, sh->key))
            continue;
        hfconfig c;
        shape_config(&c, sh);
        dflash_config dc;
        drafter_config(&dc, sh);
        int max_ctx = P + 128;
        decode_model_cuda m;
        RC_CHECK(decode_init_random_cuda(&m, &c, dc.target_layer_ids, 5, max_ctx, 16, 1234 + si, g_err, sizeof g_err),
                 g_err);
        dflash_params dp;
        drafter_params(&dp, &dc, 99 + si);
        infer_state_cuda dr;
        RC_CHECK(infer_init_cuda(&dr, &dc, &dp, m.tm.embed, m.lm_head, max_ctx, m.stream, g_err, sizeof g_err), g_err);
        dflash_params_free(&dp);
        df_rng rng;
        df_rng_seed(&rng, 7 + si);
        int32_t *prompt = malloc(sizeof(int32_t) * (size_t)P), next[16], draft[16], blk[16], ref[64], got[64];
        for (int i = 0; i < P; i++)
            prompt[i] = (int32_t)df_rng_below(&rng, (uint64_t)sh->V - 1);
        for (int i = 0; i < 16; i++)
            blk[i] = (int32_t)df_rng_below(&rng, (uint64_t)sh->V - 1);
        double pb = decode_step_bytes_cuda(&m, P + 8, 1, 1), pf = pb / bw * 1e3;
        double db = infer_draft_bytes_cuda(&dr, P), dfl = db / bw * 1e3;
        printf("== %s: steps per variant (plain floor %.3f ms, draft floor %.3f ms)\n", sh->name, pf, dfl);
        printf("%-12s %4s %5s %10s %6s %10s %7s %10s %6s %s\n", "variant", "keys", "seq", "plain ms", "%", "verify ms",
               "/plain", "draft ms", "%", "greedy tokens");
        fprintf(jf, "%s\n {\"shape\": \"%s\", \"plain_floor_ms\": %.4f, \"draft_floor_ms\": %.4f, \"steps\": [",
                first ? "" : ",", sh->name, pf, dfl);
        double t_ms[32];
        /* the configurations: every given variant alone (attention 4 keys, separate
         * kernels), then, for the variants with PDL (and the first one), attention key
         * rounds and kernel sequences (fused bits) */
        static const int keys_of[3] = {4, 8, 16};
        int cv[128], ck[128], cf[128], ncfg = 0;
        for (int vi = 0; vi < nv; vi++)
            cv[ncfg] = vi, ck[ncfg] = 0, cf[ncfg++] = 0;
        static const int more[][2] = {{0, 1},
                                      {1, 0},
                                      {2, 0},
                                      {0, DECODE_FUSE_QK_APPEND},
                                      {1, DECODE_FUSE_QK_APPEND},
                                      {0, DECODE_FUSE_QK_APPEND | DECODE_FUSE_RESIDUAL}};
        for (int vi = 0; vi < nv; vi++)
            for (size_t j = 0; j < DF_ARRAY_LEN(more); j++)
                if (vi == 0 ? j == 0 : vars[vi] >= 8 && j > 0)
                    cv[ncfg] = vi, ck[ncfg] = more[j][0], cf[ncfg++] = more[j][1];
        for (int cfg = 0; cfg < ncfg; cfg++) {
            int vi = cv[cfg], ki = ck[cfg], fz = cf[cfg];
            decode_linear_variant_cuda(vars[vi]);
            decode_attention_keys_cuda(keys_of[ki]);
            m.fused = dr.fused = fz;
            decode_drop_graphs_cuda(&m);
            m.use_graphs = 1;
            decode_reset_cuda(&m);
            SOFT(decode_extend_cuda(&m, prompt, P, 1, next, g_err, sizeof g_err));
            for (int i = 0; i < 32 + 3; i++) {
                double a = now_ms();
                SOFT(decode_extend_cuda(&m, next, 1, 1, next, g_err, sizeof g_err));
                if (i >= 3)
                    t_ms[i - 3] = now_ms() - a;
                if (i < 64)
                    got[i] = next[0];
            }
            double plain = median(t_ms, 32);
            int same = 1;
            if (cfg == 0)
                memcpy(ref, got, sizeof(int32_t) * 35);
            else
                same = !memcmp(ref, got, sizeof(int32_t) * 35);
            int len = m.len;
            for (int i = 0; i < 32 + 3; i++) {
                double a = now_ms();
                SOFT(decode_extend_cuda(&m, blk, 16, 16, next, g_err, sizeof g_err));
                if (i >= 3)
                    t_ms[i - 3] = now_ms() - a;
                SOFT(decode_truncate_cuda(&m, len));
            }
            double v16 = median(t_ms, 32);
            if (dr.draft_graph)
                cudaGraphExecDestroy(dr.draft_graph);
            dr.draft_graph = NULL;
            decode_reset_cuda(&m);
            SOFT(decode_extend_cuda(&m, prompt, P, 1, next, g_err, sizeof g_err));
            infer_reset_cuda(&dr);
            SOFT(infer_append_cuda(&dr, m.feat, P, g_err, sizeof g_err));
            for (int i = 0; i < 32 + 3; i++) {
                double a = now_ms();
                SOFT(infer_draft_cuda(&dr, next[0], draft, g_err, sizeof g_err));
                if (i >= 3)
                    t_ms[i - 3] = now_ms() - a;
            }
            double dm = median(t_ms, 32);
            printf("%-12s %4d %5s %10.3f %5.0f%% %10.3f %6.2fx %10.3f %5.0f%% %s\n",
                   decode_linear_variant_name_cuda(vars[vi]), keys_of[ki], fz_name(fz), plain, 100 * pf / plain, v16,
                   v16 / plain, dm, 100 * dfl / dm,
                   cfg == 0 ? "reference"
                   : same   ? "same as the first"
                            : "differ (another rounding)");
            fprintf(jf,
                    "%s{\"variant\": \"%s\", \"att_keys\": %d, \"fused\": %d, \"plain_ms\": %.4f, \"plain_pct\": %.2f, "
                    "\"verify16_ms\": %.4f, "
                    "\"verify16_over_plain\": %.3f, \"draft_ms\": %.4f, \"draft_pct\": %.2f}",
                    cfg ? ", " : "", decode_linear_variant_name_cuda(vars[vi]), keys_of[ki], fz, plain,
                    100 * pf / plain, v16, v16 / plain, dm, 100 * dfl / dm);
            continue;
        next_cfg:
            fprintf(jf, "%s{\"variant\": \"%s\", \"att_keys\": %d, \"fused\": %d, \"failed\": true}", cfg ? ", " : "",
                    decode_linear_variant_name_cuda(vars[vi]), keys_of[ki], fz);
        }
        m.fused = dr.fused = 0;
        decode_attention_keys_cuda(4);
        decode_drop_graphs_cuda(&m);
        fprintf(jf, "], \"linears\": [");
        /* the linear shapes of a step (separate kernels: bf16 outputs; lm_head fp32) */
        int qn = (sh->H + 2 * sh->KV) * sh->hd;
        struct {
            const char *name;
            int K, N, swiglu, out_f32;
        } L[] = {
            {"qkv", sh->d, qn, 0, 0},     {"o_proj", sh->H * sh->hd, sh->d, 0, 0}, {"gate_up", sh->d, 2 * sh->I, 0, 0},
            {"down", sh->I, sh->d, 0, 0}, {"swiglu+down+res", sh->I, sh->d, 1, 2}, {"lm_head", sh->d, sh->V, 0, 1}};
        printf("%-16s %5s %5s %6s %4s", "linear", "n_in", "n_out", "MB", "rows");
        for (int vi = 0; vi < nv; vi++)
            printf(" %17s", decode_linear_variant_name_cuda(vars[vi]));
        printf(" %17s   (us per call, GB/s, %% of copy; chunk-major: x in that layout, the last variant)\n",
               "chunk-major x");
        cudaStream_t s = m.stream;
        int firstl = 1;
        for (size_t li = 0; li < DF_ARRAY_LEN(L); li++) {
            size_t wn = (size_t)L[li].K * L[li].N, wbytes = 2 * wn;
            int nw = (int)((((size_t)256 << 20) + wbytes - 1) / wbytes);
            nn_bf16_cuda **w = malloc(sizeof *w * (size_t)nw);
            for (int i = 0; i < nw; i++) {
                CUDA_CHECK(cudaMalloc((void **)&w[i], wbytes));
                RC_CHECK(nn_fill_uniform_bf16_cuda(w[i], wn, 77 + i, 0.02f, s, g_err, sizeof g_err), g_err);
            }
            size_t xn = (size_t)64 * L[li].K * (L[li].swiglu ? 2 : 1);
            nn_bf16_cuda *x;
            void *out;
            CUDA_CHECK(cudaMalloc((void **)&x, 2 * xn));
            CUDA_CHECK(cudaMalloc(&out, sizeof(float) * 64 * (size_t)L[li].N));
            CUDA_CHECK(cudaMemset(out, 0, sizeof(float) * 64 * (size_t)L[li].N));
            RC_CHECK(nn_fill_uniform_bf16_cuda(x, xn, 5, 1.0f, s, g_err, sizeof g_err), g_err);
            int calls = nw < 48 ? 48 - 48 % nw : nw;
            static const int rows[3] = {1, 16, 64}; /* plain, verify, a batch of 4 verifies */
            for (int ri = 0; ri < 3; ri++) {
                printf("%-16s %5d %5d %6.1f %4d", L[li].name, L[li].K, L[li].N, wbytes / 1e6, rows[ri]);
                fprintf(jf, "%s\n  {\"linear\": \"%s\", \"n_in\": %d, \"n_out\": %d, \"rows\": %d, \"by_variant\": [",
                        firstl ? "" : ",", L[li].name, L[li].K, L[li].N, rows[ri]);
                firstl = 0;
                for (int vi = 0; vi < nv; vi++) {
                    decode_linear_variant_cuda(vars[vi]);
                    double ms =
                        time_linear(rows[ri], L[li].K, L[li].N, L[li].swiglu, L[li].out_f32, x, w, nw, out, calls, s);
                    double gbs = wbytes / (ms * 1e-3) / 1e9;
                    printf(" %5.1f %5.0f %4.0f%%", ms * 1e3, gbs, 100 * gbs * 1e9 / bw);
                    fprintf(jf, "%s{\"variant\": \"%s\", \"us\": %.3f, \"GBps\": %.1f, \"pct_copy\": %.2f}",
                            vi ? ", " : "", decode_linear_variant_name_cuda(vars[vi]), ms * 1e3, gbs,
                            100 * gbs * 1e9 / bw);
                }
                fprintf(jf, "]");
                if (!L[li].swiglu && L[li].K % DECODE_XC_CHUNK == 0) { /* the last variant, x chunk-major */
                    double ms = time_linear(rows[ri], L[li].K, L[li].N, 2, L[li].out_f32, x, w, nw, out, calls, s);
                    double gbs = wbytes / (ms * 1e-3) / 1e9;
                    printf(" %5.1f %5.0f %4.0f%%", ms * 1e3, gbs, 100 * gbs * 1e9 / bw);
                    fprintf(jf, ", \"chunk_major_x\": {\"us\": %.3f, \"GBps\": %.1f, \"pct_copy\": %.2f}", ms * 1e3,
                            gbs, 100 * gbs * 1e9 / bw);
                    /* 64 rows in blocks of 32, 16, 8 rows (the same bits) */
                    for (int rb = 32; rows[ri] == 64 && rb >= 8; rb /= 2) {
                        int old_rb = decode_linear_rows_block_cuda(rb);
                        ms = time_linear(rows[ri], L[li].K, L[li].N, 2, L[li].out_f32, x, w, nw, out, calls, s);
                        decode_linear_rows_block_cuda(old_rb);
                        gbs = wbytes / (ms * 1e-3) / 1e9;
                        printf("  /%d: %5.1f", rb, ms * 1e3);
                        fprintf(jf, ", \"chunk_major_x_rows_block_%d_us\": %.3f", rb, ms * 1e3);
                    }
                }
                fprintf(jf, "}");
                printf("\n");
            }
            for (int i = 0; i < nw; i++)
                cudaFree(w[i]);
            free(w);
            cudaFree(x), cudaFree(out);
        }
        fprintf(jf, "], \"other_kernels\": [");
        printf("other kernels of a step, context %d:\n", P);
        time_others(sh, P, 1, jf, s);
        time_others(sh, P, 16, jf, s);
        time_others(sh, P, 64, jf, s);
        fprintf(jf, "]}");
        fflush(jf);
        first = 0;
        free(prompt);
        infer_free_cuda(&dr);
        decode_free_cuda(&m);
        decode_linear_variant_cuda(dflt);
    }
    fprintf(jf, "\n]}\n");
}

int main(int argc, char **argv)
{
    const char *json = "bench/results/eval/decode.json", *models = "1.7b,8b";
    int P = 128, NEW = 128, reps = 32, timeout_s = 420, sweep = 0, vars[DECODE_LINEAR_VARIANTS], nv = 0, NB = 4;
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else if (!strcmp(argv[i], "--models") && i + 1 < argc)
            models = argv[++i];
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc)
            P = (int)df_arg_int("bench_decode", "--prompt", argv[++i], 1, 1 << 20);
        else if (!strcmp(argv[i], "--new") && i + 1 < argc)
            NEW = (int)df_arg_int("bench_decode", "--new", argv[++i], 1, 1 << 20);
        else if (!strcmp(argv[i], "--timeout") && i + 1 < argc)
            timeout_s = (int)df_arg_int("bench_decode", "--timeout", argv[++i], 1, INT_MAX);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            NB = (int)df_arg_int("bench_decode", "--batch", argv[++i], 1, INT_MAX);
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--linear-sweep"))
            sweep = 1;
        else if (!strcmp(argv[i], "--variant") && i + 1 < argc && nv < DECODE_LINEAR_VARIANTS) {
            int v = (int)df_arg_int("bench_decode", "--variant", argv[++i], 0, INT_MAX);
            if (v < 0 || v >= DECODE_LINEAR_VARIANTS) {
                fprintf(stderr, "bench_decode: --variant %d: 0 .. %d\n", v, DECODE_LINEAR_VARIANTS - 1);
                return 2;
            }
            vars[nv++] = v;
        } else {
            fprintf(stderr,
                    "usage: bench_decode [--models 1.7b,8b,30b-a3b] [--prompt N] [--new N] [--json PATH] "
                    "[--timeout S] [--batch N] [--variant V]... [--linear-sweep] [--quick]\n"
                    "  --batch N: prompts decoded together in the batch rows (default 4; 1 skips them)\n"
                    "  --variant V: the linear kernel variant (0 .. %d; the first one given runs the\n"
                    "  decoding bench, the sweep compares all given, default all)\n"
                    "  --linear-sweep: steps per variant and every linear shape at 1, 16 and 64 rows\n"
                    "  --quick: the steps and kernel sequences only (no loops, no batches)\n",
                    DECODE_LINEAR_VARIANTS - 1);
            return 2;
        }
    }
    if (P < 1 || NEW < 16 || NB < 1 || NB > 4 || P - 8 * (NB - 1) < 1) {
        fprintf(stderr, "bench_decode: --prompt >= 1, --new >= 16, --batch 1..4 (64 rows of block 16), prompts of "
                        "P - 8 * (N - 1) >= 1 tokens\n");
        return 2;
    }
    gt_watchdog((unsigned)timeout_s, "bench_decode: watchdog: past its time limit\n");
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("SKIPPED: no CUDA device\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));

    /* copy bandwidth: 2 GiB device to device, bytes read + written */
    size_t cb = (size_t)2 << 30;
    void *ca, *cbuf;
    CUDA_CHECK(cudaMalloc(&ca, cb));
    CUDA_CHECK(cudaMalloc(&cbuf, cb));
    CUDA_CHECK(cudaMemset(ca, 1, cb));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    double bws[5];
    for (int r = 0; r < 6; r++) {
        CUDA_CHECK(cudaEventRecord(e0, 0));
        CUDA_CHECK(cudaMemcpyAsync(cbuf, ca, cb, cudaMemcpyDeviceToDevice, 0));
        CUDA_CHECK(cudaEventRecord(e1, 0));
        CUDA_CHECK(cudaEventSynchronize(e1));
        float ms;
        CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (r > 0)
            bws[r - 1] = 2.0 * cb / (ms * 1e-3);
    }
    double bw = median(bws, 5);
    cudaFree(ca), cudaFree(cbuf);
    printf("%s: device-to-device copy %.2f TB/s (read + write); prompt %d tokens, %d new\n", prop.name, bw / 1e12, P,
           NEW);

    if (sweep && !strcmp(json, "bench/results/eval/decode.json"))
        json = "bench/results/eval/linear_sweep.json";
    FILE *jf = fopen(json, "w");
    if (!jf) {
        fprintf(stderr, "bench_decode: cannot write %s\n", json);
        return 1;
    }
    if (sweep) {
        if (nv == 0)
            for (nv = 0; nv < DECODE_LINEAR_VARIANTS; nv++)
                vars[nv] = nv;
        linear_sweep(models, vars, nv, bw, jf, P);
        fclose(jf);
        printf("JSON: %s\n", json);
        return 0;
    }
    if (nv > 0)
        decode_linear_variant_cuda(vars[0]);
    printf("linear kernel variant: %s\n", decode_linear_variant_name_cuda(decode_linear_variant_cuda(-1)));
    fprintf(jf,
            "{\"device\": \"%s\", \"copy_bw_Bps\": %.4g, \"prompt\": %d, \"new\": %d, \"linear_variant\": \"%s\", "
            "\"shapes\": [",
            prop.name, bw, P, NEW, decode_linear_variant_name_cuda(decode_linear_variant_cuda(-1)));
    int first_shape = 1;
    char table[8192], btable[4096];
    size_t tl = 0, btl = 0;
    for (size_t si = 0; si < DF_ARRAY_LEN(SHAPES); si++) {
        const shape *sh = &SHAPES[si];
        if (!strstr(models, sh->key))
            continue;
        hfconfig c;
        shape_config(&c, sh);
        dflash_config dc;
        drafter_config(&dc, sh);
        int max_ctx = P + NEW + 64;
        decode_model_cuda m;
        double t0 = now_ms();
        RC_CHECK(decode_init_random_batch_cuda(&m, &c, dc.target_layer_ids, 5, max_ctx, 16, NB, 1234 + si, g_err,
                                               sizeof g_err),
                 g_err);
        dflash_params dp;
        drafter_params(&dp, &dc, 99 + si);
        infer_state_cuda dr;
        infer_batch_cuda ib; /* the batch rows' drafter contexts (NB > 1) */
        RC_CHECK(infer_init_cuda(&dr, &dc, &dp, m.tm.embed, m.lm_head, max_ctx, m.stream, g_err, sizeof g_err), g_err);
        if (NB > 1)
            RC_CHECK(infer_batch_init_cuda(&ib, &dr, NB, max_ctx, g_err, sizeof g_err), g_err);
        dflash_params_free(&dp);
        printf("== %s: target %.2f GB of weights, drafter 5 layers (set up in %.1f s)\n", sh->name,
               m.tm.weight_bytes / 1e9, (now_ms() - t0) / 1e3);
        df_rng rng;
        df_rng_seed(&rng, 7 + si);
        int32_t *prompt = malloc(sizeof(int32_t) * (size_t)P), next[16], draft[16], blk[16];
        for (int i = 0; i < P; i++)
            prompt[i] = (int32_t)df_rng_below(&rng, (uint64_t)sh->V - 1);

        /* plain steps, graphs and eager, at len P .. P + reps; the other kernel sequence
         * (fused / separate) once more with graphs */
        double plain_ms[2] = {0, 0}, v16_ms = 0, v16e_ms = 0, t_ms[64], alt_plain = 0, alt_v16 = 0;
        /* the other sequence: the one before the bit-exact fusions when the default has
         * them, else all fused */
        int dflt = m.fused, dflt_dr = dr.fused, alt_fz = dflt != DECODE_FUSED_SEPARATE ? DECODE_FUSED_SEPARATE : 1;
        for (int graphs = 2; graphs >= 0; graphs--) {
            m.fused = graphs == 2 ? alt_fz : dflt;
            decode_drop_graphs_cuda(&m);
            m.use_graphs = graphs > 0;
            decode_reset_cuda(&m);
            RC_CHECK(decode_extend_cuda(&m, prompt, P, 1, next, g_err, sizeof g_err), g_err);
            for (int i = 0; i < reps + 3; i++) {
                double a = now_ms();
                RC_CHECK(decode_extend_cuda(&m, next, 1, 1, next, g_err, sizeof g_err), g_err);
                if (i >= 3)
                    t_ms[i - 3] = now_ms() - a;
            }
            double pm = median(t_ms, reps);
            if (graphs == 2)
                alt_plain = pm;
            else
                plain_ms[graphs] = pm;
            /* verify of 16 rows at the same length, the cache truncated back each time */
            int len = m.len;
            for (int i = 0; i < 16; i++)
                blk[i] = (int32_t)df_rng_below(&rng, (uint64_t)sh->V - 1);
            for (int i = 0; i < reps + 3; i++) {
                double a = now_ms();
                RC_CHECK(decode_extend_cuda(&m, blk, 16, 16, next, g_err, sizeof g_err), g_err);
                if (i >= 3)
                    t_ms[i - 3] = now_ms() - a;
                RC_CHECK(decode_truncate_cuda(&m, len), g_err);
            }
            *(graphs == 2 ? &alt_v16 : graphs ? &v16_ms : &v16e_ms) = median(t_ms, reps);
        }
        m.use_graphs = 1;
        m.fused = dflt;
        decode_drop_graphs_cuda(&m);
        int len_mid = P + reps / 2;
        double plain_bytes = decode_step_bytes_cuda(&m, len_mid, 1, 1);
        double plain_floor = plain_bytes / bw * 1e3;

        /* draft and append, at context P */
        decode_reset_cuda(&m);
        RC_CHECK(decode_extend_cuda(&m, prompt, P, 1, next, g_err, sizeof g_err), g_err);
        infer_reset_cuda(&dr);
        RC_CHECK(infer_append_cuda(&dr, m.feat, P, g_err, sizeof g_err), g_err);
        for (int i = 0; i < reps + 3; i++) {
            double a = now_ms();
            RC_CHECK(infer_draft_cuda(&dr, next[0], draft, g_err, sizeof g_err), g_err);
            if (i >= 3)
                t_ms[i - 3] = now_ms() - a;
        }
        double draft_ms = median(t_ms, reps);
        /* the drafter's other kernel sequence (a fresh graph) */
        if (dr.draft_graph)
            cudaGraphExecDestroy(dr.draft_graph);
        dr.draft_graph = NULL;
        dr.fused = alt_fz;
        for (int i = 0; i < reps + 3; i++) {
            double a = now_ms();
            RC_CHECK(infer_draft_cuda(&dr, next[0], draft, g_err, sizeof g_err), g_err);
            if (i >= 3)
                t_ms[i - 3] = now_ms() - a;
        }
        double alt_draft = median(t_ms, reps);
        cudaGraphExecDestroy(dr.draft_graph);
        dr.draft_graph = NULL;
        dr.fused = dflt_dr;
        double draft_bytes = infer_draft_bytes_cuda(&dr, P);
        double draft_floor = draft_bytes / bw * 1e3;
        /* accept: truncate + append of 4 rows (tau ~ 4), graph replays, synchronised */
        RC_CHECK(decode_extend_cuda(&m, blk, 16, 16, next, g_err, sizeof g_err), g_err);
        for (int i = 0; i < reps + 3 && dr.n_ctx + 4 <= dr.cap; i++) {
            double a = now_ms();
            RC_CHECK(decode_truncate_cuda(&m, m.len - 12), g_err);
            RC_CHECK(infer_append_cuda(&dr, m.feat, 4, g_err, sizeof g_err), g_err);
            CUDA_CHECK(cudaStreamSynchronize(m.stream));
            if (i >= 3)
                t_ms[i - 3] = now_ms() - a;
            m.len += 12; /* the rows are still there: keep truncating the same block */
        }
        double append_ms = median(t_ms, reps);

        /* the kernel sequences side by side (the same bits: only time differs) */
        double fus[N_SEQ_CFGS][3];
        for (int fi = 0; fi < N_SEQ_CFGS; fi++) {
            const seq_cfg *sc = &SEQ_CFGS[fi];
            int old_p = decode_pdl_small_cuda(sc->pdl), old_c = decode_linear_cols_cuda(sc->cols);
            steps_under(&m, &dr, seq_fused(sc, dflt), prompt, P, sh->V, reps, &rng, fus[fi]);
            decode_pdl_small_cuda(old_p), decode_linear_cols_cuda(old_c);
        }
        m.fused = dflt, dr.fused = dflt_dr;
        printf("kernel sequences (graphs; plain floor %.3f ms, draft floor %.3f ms):\n", plain_floor, draft_floor);
        for (int fi = 0; fi < N_SEQ_CFGS; fi++)
            printf("  %-24s plain %.3f ms (%.0f%%)  verify-16 %.3f ms (%.2fx)  draft %.3f ms (%.0f%%)\n",
                   SEQ_CFGS[fi].name, fus[fi][0], 100 * plain_floor / fus[fi][0], fus[fi][1], fus[fi][1] / fus[fi][0],
                   fus[fi][2], 100 * draft_floor / fus[fi][2]);

        /* the loops: plain, then speculative at three corruption rates */
        spec_target st = {.ctx = &m,
                          .feat_dim = 5 * sh->d,
                          .feat_row_bytes = sizeof(nn_bf16_cuda) * 5 * (size_t)sh->d,
                          .max_ctx = max_ctx,
                          .reset = t_reset,
                          .extend = t_extend,
                          .truncate = t_truncate,
                          .n_seq = NB,
                          .reset_seq = t_reset_seq,
                          .extend_seq = t_extend_seq,
                          .truncate_seq = t_truncate_seq,
                          .extend_batch = t_extend_batch};
        oracle orc = {.dr = &dr, .n_prompt = P, .V = sh->V};
        df_rng_seed(&orc.rng, 11 + si);
        spec_drafter sd = {.ctx = &orc, .block_size = 16, .reset = d_reset, .append = d_append, .draft = d_draft};
        spec_opts so = {.max_new = NEW, .eos = -1};
        spec_result pr = {0};
        double sp_tpot[3] = {0, 0, 0}, sp_tau[3] = {0, 0, 0}, sp_draft[3] = {0, 0, 0}, sp_verify[3] = {0, 0, 0},
               sp_accept[3] = {0, 0, 0}, plain_tpot = 0;
        int sp_lossless[3] = {1, 1, 1};
        static const double qs[3] = {1.0, 0.12, 0.0};
        double b_plain_tps = 0, b_spec_tps[2][3] = {{0}}, b_tau[3] = {0, 0, 0}, b_part[2][3][3] = {{{0}}};
        /* plain step of NB rows, verify of NB blocks, NB drafts one after the other / together */
        /* [4]: the verify in the other activation layout; [5..7]: in blocks of 32, 16, 8 rows */
        double b_step[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int b_plain_ok = 1, b_spec_ok[2][3] = {{1, 1, 1}, {1, 1, 1}};
        /* the queue of NQ prompts through NB sequences: plain, speculative (p = 0.12, together) */
        const int NQ = 4 * NB;
        double q_tps[2] = {0, 0}, q_tau = 0, q_part[3] = {0, 0, 0};
        int q_ok[2] = {0, 0};
        if (quick)
            goto report; /* --quick: the steps only */
        RC_CHECK(spec_generate_plain(&st, prompt, P, &so, &pr), g_err);
        plain_tpot = pr.decode_s * 1e3 / (pr.n_tokens - 1);
        orc.plain = pr.tokens, orc.n_plain = pr.n_tokens;
        for (int qi = 0; qi < 3; qi++) {
            orc.corrupt = qs[qi];
            spec_result r;
            RC_CHECK(spec_generate(&st, &sd, prompt, P, &so, &r), g_err);
            sp_tpot[qi] = r.decode_s * 1e3 / (r.n_tokens - 1);
            sp_tau[qi] = spec_result_tau(&r);
            sp_draft[qi] = r.draft_s * 1e3 / r.n_steps;
            sp_verify[qi] = r.verify_s * 1e3 / r.n_steps;
            sp_accept[qi] = r.accept_s * 1e3 / r.n_steps;
            sp_lossless[qi] =
                r.n_tokens == pr.n_tokens && memcmp(r.tokens, pr.tokens, sizeof(int32_t) * (size_t)r.n_tokens) == 0;
            spec_result_free(&r);
        }
        spec_result_free(&pr);

        /* batches: NB prompts of P, P-8, ... tokens; their lone plain runs are the reference */
        if (NB > 1) {
            int32_t *bp[4];
            int bn[4];
            spec_result lone[4], br[4];
            for (int b = 0; b < NB; b++) {
                bn[b] = P - 8 * b;
                bp[b] = malloc(sizeof(int32_t) * (size_t)bn[b]);
                for (int i = 0; i < bn[b]; i++)
                    bp[b][i] = (int32_t)df_rng_below(&rng, (uint64_t)sh->V - 1);
                RC_CHECK(spec_generate_plain(&st, bp[b], bn[b], &so, &lone[b]), g_err);
            }
            RC_CHECK(spec_generate_batch(&st, NULL, NB, (const int32_t *const *)bp, bn, &so, br, NULL), g_err);
            long toks = 0;
            for (int b = 0; b < NB; b++) {
                toks += br[b].n_tokens - 1;
                b_plain_ok &= br[b].n_tokens == lone[b].n_tokens &&
                              !memcmp(br[b].tokens, lone[b].tokens, sizeof(int32_t) * (size_t)br[b].n_tokens);
            }
            b_plain_tps = toks / br[0].decode_s;
            for (int b = 0; b < NB; b++)
                spec_result_free(&br[b]);
            /* the batch's steps alone (graphs, median of 32): a plain step of NB rows, a
             * verify of NB blocks, the NB drafts one after the other and together */
            {
                int ks1[4], ks16[4], lens[4];
                int32_t btok[64], bnext[64], bdraft[64], anc[4], sq[4];
                for (int b = 0; b < NB; b++) {
                    decode_reset_seq_cuda(&m, b);
                    RC_CHECK(decode_extend_seq_cuda(&m, b, bp[b], bn[b], 1, bnext, g_err, sizeof g_err), g_err);
                    infer_reset_cuda(&ib.seq[b]);
                    RC_CHECK(infer_append_cuda(&ib.seq[b], m.feat, bn[b], g_err, sizeof g_err), g_err);
                    ks1[b] = 1, ks16[b] = 16, lens[b] = bn[b], anc[b] = bnext[0], sq[b] = b;
                }
                for (int i = 0; i < 16 * NB; i++)
                    btok[i] = (int32_t)df_rng_below(&rng, (uint64_t)sh->V - 1);
                for (int kind = 0; kind < 8; kind++) {
                    static const int rblk[8] = {64, 64, 64, 64, 64, 32, 16, 8};
                    decode_linear_rows_block_cuda(rblk[kind]);
                    if (kind == 4) /* the 64-row verify again, chunk-major x flipped */
                        m.fused ^= DECODE_FUSE_XC, decode_drop_graphs_cuda(&m);
                    if (kind >= 5) /* and in blocks of fewer rows (graphs keep their launches) */
                        decode_drop_graphs_cuda(&m);
                    for (int i = 0; i < 32 + 3; i++) {
                        double a = now_ms();
                        if (kind < 2 || kind >= 4) {
                            RC_CHECK(decode_extend_batch_cuda(&m, btok, kind ? ks16 : ks1, bnext, g_err, sizeof g_err),
                                     g_err);
                        } else if (kind == 2) {
                            for (int b = 0; b < NB; b++)
                                RC_CHECK(infer_draft_cuda(&ib.seq[b], anc[b], bdraft + 15 * b, g_err, sizeof g_err),
                                         g_err);
                        } else {
                            RC_CHECK(infer_batch_draft_cuda(&ib, NB, sq, anc, bdraft, g_err, sizeof g_err), g_err);
                        }
                        if (i >= 3)
                            t_ms[i - 3] = now_ms() - a;
                        for (int b = 0; (kind < 2 || kind >= 4) && b < NB; b++)
                            RC_CHECK(decode_truncate_seq_cuda(&m, b, lens[b]), g_err);
                    }
                    b_step[kind] = median(t_ms, 32);
                    if (kind == 4)
                        m.fused ^= DECODE_FUSE_XC, decode_drop_graphs_cuda(&m);
                }
                decode_linear_rows_block_cuda(64);
                decode_drop_graphs_cuda(&m);
            }
            oracle bo[4];
            oracle_batch obt = {&ib, bo, NULL};
            spec_drafter bsd[4];
            for (int mode = 0; mode < 2; mode++) /* drafts one after the other, then together */
                for (int qi = 0; qi < 3; qi++) {
                    for (int b = 0; b < NB; b++) {
                        bo[b] = (oracle){.dr = &ib.seq[b],
                                         .plain = lone[b].tokens,
                                         .n_plain = lone[b].n_tokens,
                                         .n_prompt = bn[b],
                                         .corrupt = qs[qi],
                                         .V = sh->V};
                        df_rng_seed(&bo[b].rng, 100 * (si + 1) + 10 * qi + b);
                        bsd[b] = (spec_drafter){.ctx = &bo[b],
                                                .block_size = 16,
                                                .reset = d_reset,
                                                .append = d_append,
                                                .draft = d_draft,
                                                .batch_ctx = mode ? &obt : NULL,
                                                .draft_batch = mode ? d_draft_batch : NULL};
                    }
                    RC_CHECK(spec_generate_batch(&st, bsd, NB, (const int32_t *const *)bp, bn, &so, br, NULL), g_err);
                    long steps = 0, acc = 0, smax = 1;
                    double wall = br[0].decode_s; /* the batch's (every r[i] has it) */
                    toks = 0;
                    for (int b = 0; b < NB; b++) {
                        toks += br[b].n_tokens - 1, steps += br[b].n_steps, acc += br[b].accept_sum;
                        smax = br[b].n_steps > smax ? br[b].n_steps : smax;
                        b_spec_ok[mode][qi] &=
                            br[b].n_tokens == lone[b].n_tokens &&
                            !memcmp(br[b].tokens, lone[b].tokens, sizeof(int32_t) * (size_t)br[b].n_tokens);
                    }
                    /* per batch step (the steps of the longest-running sequence) */
                    b_part[mode][qi][0] = br[0].draft_s * 1e3 / smax;
                    b_part[mode][qi][1] = br[0].verify_s * 1e3 / smax;
                    b_part[mode][qi][2] = br[0].accept_s * 1e3 / smax;
                    for (int b = 0; b < NB; b++)
                        spec_result_free(&br[b]);
                    b_spec_tps[mode][qi] = toks / wall;
                    b_tau[qi] = steps ? (double)acc / steps : 0;
                }
            for (int b = 0; b < NB; b++) {
                spec_result_free(&lone[b]);
                free(bp[b]);
            }
            /* a queue: NQ prompts through the NB sequences, a prompt that finishes handing its
             * sequence to the next (spec_generate_batch), plain and speculative at p = 0.12 with
             * the drafts together: the batch without its ragged end, where the last prompts of a
             * fixed batch run with empty sequences beside them */
            int32_t *qp[4 * 4];
            int qn[4 * 4], slot_prompt[4];
            spec_result qlone[4 * 4], *qr = calloc((size_t)NQ, sizeof *qr);
            oracle qo[4 * 4];
            oracle_batch qob = {&ib, qo, slot_prompt};
            oracle_slot qslot[4];
            spec_drafter qsd[4];
            if (!qr) {
                fprintf(stderr, "bench_decode: out of memory\n");
                return 1;
            }
            long qtoks = 0, qsteps = 0, qacc = 0;
            for (int q = 0; q < NQ; q++) {
                qn[q] = P - 8 * (q % NB);
                qp[q] = malloc(sizeof(int32_t) * (size_t)qn[q]);
                for (int i = 0; i < qn[q]; i++)
                    qp[q][i] = (int32_t)df_rng_below(&rng, (uint64_t)sh->V - 1);
                RC_CHECK(spec_generate_plain(&st, qp[q], qn[q], &so, &qlone[q]), g_err);
                qo[q] = (oracle){.dr = &ib.seq[0],
                                 .plain = qlone[q].tokens,
                                 .n_plain = qlone[q].n_tokens,
                                 .n_prompt = qn[q],
                                 .corrupt = qs[1],
                                 .V = sh->V};
                df_rng_seed(&qo[q].rng, 1000 * (si + 1) + q);
            }
            RC_CHECK(spec_generate_batch(&st, NULL, NQ, (const int32_t *const *)qp, qn, &so, qr, NULL), g_err);
            for (int q = 0; q < NQ; q++) {
                qtoks += qr[q].n_tokens - 1;
                q_ok[0] += qr[q].n_tokens == qlone[q].n_tokens &&
                           !memcmp(qr[q].tokens, qlone[q].tokens, sizeof(int32_t) * (size_t)qr[q].n_tokens);
            }
            q_tps[0] = qtoks / qr[0].decode_s;
            for (int q = 0; q < NQ; q++)
                spec_result_free(&qr[q]);
            for (int b = 0; b < NB; b++) {
                qslot[b] = (oracle_slot){&qob, b};
                slot_prompt[b] = 0;
                qsd[b] = (spec_drafter){.ctx = &qslot[b],
                                        .block_size = 16,
                                        .reset = q_reset,
                                        .append = q_append,
                                        .draft = q_draft,
                                        .batch_ctx = &qob,
                                        .draft_batch = d_draft_batch,
                                        .assign = q_assign};
            }
            RC_CHECK(spec_generate_batch(&st, qsd, NQ, (const int32_t *const *)qp, qn, &so, qr, NULL), g_err);
            qtoks = 0;
            for (int q = 0; q < NQ; q++) {
                qtoks += qr[q].n_tokens - 1, qsteps += qr[q].n_steps, qacc += qr[q].accept_sum;
                q_ok[1] += qr[q].n_tokens == qlone[q].n_tokens &&
                           !memcmp(qr[q].tokens, qlone[q].tokens, sizeof(int32_t) * (size_t)qr[q].n_tokens);
            }
            q_tps[1] = qtoks / qr[0].decode_s;
            q_tau = qsteps ? (double)qacc / qsteps : 0;
            q_part[0] = qr[0].draft_s * 1e3 / qr[0].batch_steps, q_part[1] = qr[0].verify_s * 1e3 / qr[0].batch_steps;
            q_part[2] = qr[0].accept_s * 1e3 / qr[0].batch_steps;
            for (int q = 0; q < NQ; q++) {
                spec_result_free(&qr[q]);
                spec_result_free(&qlone[q]);
                free(qp[q]);
            }
            free(qr);
        }

    report:
        printf("plain step: %.3f ms (graphs), %.3f ms (eager); reads %.3f GB: floor %.3f ms -> %.0f%% of the "
               "copy ceiling\n",
               plain_ms[1], plain_ms[0], plain_bytes / 1e9, plain_floor, 100 * plain_floor / plain_ms[1]);
        printf("verify 16 rows: %.3f ms (graphs) = %.2fx a plain step; eager %.3f ms\n", v16_ms, v16_ms / plain_ms[1],
               v16e_ms);
        printf("draft (16 rows, context %d): %.3f ms; reads %.3f GB: floor %.3f ms -> %.0f%%\n", P, draft_ms,
               draft_bytes / 1e9, draft_floor, 100 * draft_floor / draft_ms);
        printf("accept (truncate + 4-row feature append): %.3f ms\n", append_ms);
        printf("%s kernels instead (graphs): plain step %.3f ms, verify 16 %.3f ms, draft %.3f ms\n",
               alt_fz == DECODE_FUSED_SEPARATE ? "separate add_rmsnorm / SwiGLU" : "all-fused", alt_plain, alt_v16,
               alt_draft);
        if (!quick)
            printf("plain loop: %.3f ms/token\n", plain_tpot);
        for (int qi = 0; qi < 3 && !quick; qi++)
            printf("speculative, drafts corrupted with p = %.2f: tau %.2f, %.3f ms/token (draft %.3f + verify %.3f + "
                   "accept %.3f ms per step), speedup %.2fx, lossless %s\n",
                   qs[qi], sp_tau[qi], sp_tpot[qi], sp_draft[qi], sp_verify[qi], sp_accept[qi],
                   plain_tpot / sp_tpot[qi], sp_lossless[qi] ? "yes" : "NO");
        tl += (size_t)snprintf(table + tl, sizeof table - tl,
                               "| %s | %.3f | %.0f%% | %.3f | %.2fx | %.3f | %.0f%% | %.3f |", sh->name, plain_ms[1],
                               100 * plain_floor / plain_ms[1], v16_ms, v16_ms / plain_ms[1], draft_ms,
                               100 * draft_floor / draft_ms, append_ms);
        for (int qi = 0; qi < 3; qi++)
            tl += quick
                      ? (size_t)snprintf(table + tl, sizeof table - tl, " - |")
                      : (size_t)snprintf(table + tl, sizeof table - tl, " %.2f: %.3f ms, %.2fx%s |", sp_tau[qi],
                                         sp_tpot[qi], plain_tpot / sp_tpot[qi], sp_lossless[qi] ? "" : " NOT LOSSLESS");
        tl += (size_t)snprintf(table + tl, sizeof table - tl, "\n");
        if (!quick)
            btl += (size_t)snprintf(btable + btl, sizeof btable - btl,
                                    "| %s | 1 | %.0f | %.0f (tau %.2f) | %.0f (%.2f) | "
                                    "%.0f (%.2f) |\n",
                                    sh->name, 1e3 / plain_tpot, 1e3 / sp_tpot[0], sp_tau[0], 1e3 / sp_tpot[1],
                                    sp_tau[1], 1e3 / sp_tpot[2], sp_tau[2]);
        if (NB > 1 && !quick) {
            printf("batch of %d (prompts %d..%d tokens): plain %.0f tokens/s (batch 1: %.0f), lossless %s\n", NB,
                   P - 8 * (NB - 1), P, b_plain_tps, 1e3 / plain_tpot, b_plain_ok ? "yes" : "NO");
            printf("batch of %d, one step: plain (%d rows) %.3f ms, verify (%d rows) %.3f ms = %.2fx, drafts one "
                   "after the other %.3f ms, together %.3f ms\n",
                   NB, NB, b_step[0], 16 * NB, b_step[1], b_step[1] / b_step[0], b_step[2], b_step[3]);
            printf("batch of %d, verify (%d rows) with activations %s instead: %.3f ms = %.2fx; in blocks of 32 / 16 / "
                   "8 rows: %.3f / %.3f / %.3f ms\n",
                   NB, 16 * NB, (m.fused & DECODE_FUSE_XC) ? "row-major" : "chunk-major", b_step[4],
                   b_step[4] / b_step[0], b_step[5], b_step[6], b_step[7]);
            for (int mode = 0; mode < 2; mode++)
                for (int qi = 0; qi < 3; qi++)
                    printf("batch of %d, speculative p = %.2f, drafts %s: tau %.2f, %.0f tokens/s (batch 1: %.0f) = "
                           "%.2fx the plain batch (draft %.3f + verify %.3f + accept %.3f ms a step), lossless %s\n",
                           NB, qs[qi], mode ? "together" : "one after the other", b_tau[qi], b_spec_tps[mode][qi],
                           1e3 / sp_tpot[qi], b_spec_tps[mode][qi] / b_plain_tps, b_part[mode][qi][0],
                           b_part[mode][qi][1], b_part[mode][qi][2], b_spec_ok[mode][qi] ? "yes" : "NO");
            printf("queue of %d prompts through %d sequences: plain %.0f tokens/s, speculative p = %.2f (drafts "
                   "together) tau %.2f, %.0f tokens/s = %.2fx the plain queue (draft %.3f + verify %.3f + accept %.3f "
                   "ms a step), lossless %d + %d of %d + %d\n",
                   NQ, NB, q_tps[0], qs[1], q_tau, q_tps[1], q_tps[0] > 0 ? q_tps[1] / q_tps[0] : 0.0, q_part[0],
                   q_part[1], q_part[2], q_ok[0], q_ok[1], NQ, NQ);
            btl += (size_t)snprintf(btable + btl, sizeof btable - btl,
                                    "| %s | %d, a queue of %d prompts, drafts together | %.0f%s | - | %.0f (%.2f, "
                                    "%.2fx)%s | - |\n",
                                    sh->name, NB, NQ, q_tps[0], q_ok[0] == NQ ? "" : " NOT LOSSLESS", q_tps[1], q_tau,
                                    q_tps[0] > 0 ? q_tps[1] / q_tps[0] : 0.0, q_ok[1] == NQ ? "" : " NOT LOSSLESS");
            for (int mode = 0; mode < 2; mode++)
                btl += (size_t)snprintf(
                    btable + btl, sizeof btable - btl,
                    "| %s | %d%s | %.0f%s | %.0f (tau %.2f, %.2fx)%s | %.0f (%.2f, %.2fx)%s | %.0f (%.2f, %.2fx)%s |\n",
                    sh->name, NB, mode ? ", drafts together" : ", drafts one by one", b_plain_tps,
                    b_plain_ok ? "" : " NOT LOSSLESS", b_spec_tps[mode][0], b_tau[0], b_spec_tps[mode][0] / b_plain_tps,
                    b_spec_ok[mode][0] ? "" : " NOT LOSSLESS", b_spec_tps[mode][1], b_tau[1],
                    b_spec_tps[mode][1] / b_plain_tps, b_spec_ok[mode][1] ? "" : " NOT LOSSLESS", b_spec_tps[mode][2],
                    b_tau[2], b_spec_tps[mode][2] / b_plain_tps, b_spec_ok[mode][2] ? "" : " NOT LOSSLESS");
        }

        fprintf(jf,
                "%s\n {\"shape\": \"%s\", \"weight_bytes\": %zu, \"plain_step_ms\": %.4f, \"plain_step_eager_ms\": "
                "%.4f, \"plain_step_bytes\": %.6g, \"plain_floor_ms\": %.4f, \"plain_pct_ceiling\": %.2f, "
                "\"verify16_ms\": %.4f, \"verify16_eager_ms\": %.4f, \"verify16_over_plain\": %.3f, \"draft_ms\": "
                "%.4f, \"draft_bytes\": %.6g, \"draft_pct_ceiling\": %.2f, \"accept4_ms\": %.4f, "
                "\"plain_tpot_ms\": %.4f, \"fused_default\": %d, \"other_kernels\": {\"plain_step_ms\": %.4f, "
                "\"verify16_ms\": %.4f, \"draft_ms\": %.4f}, \"fusions\": [",
                first_shape ? "" : ",", sh->name, m.tm.weight_bytes, plain_ms[1], plain_ms[0], plain_bytes, plain_floor,
                100 * plain_floor / plain_ms[1], v16_ms, v16e_ms, v16_ms / plain_ms[1], draft_ms, draft_bytes,
                100 * draft_floor / draft_ms, append_ms, plain_tpot, dflt, alt_plain, alt_v16, alt_draft);
        for (int fi = 0; fi < N_SEQ_CFGS; fi++) {
            const seq_cfg *sc = &SEQ_CFGS[fi];
            fprintf(jf,
                    "%s{\"sequence\": \"%s\", \"fused\": %d, \"pdl_small\": %d, \"col_tiles\": %d, "
                    "\"plain_ms\": %.4f, \"plain_pct_ceiling\": %.2f, \"verify16_ms\": %.4f, \"draft_ms\": %.4f, "
                    "\"draft_pct_ceiling\": %.2f}",
                    fi ? ", " : "", sc->name, seq_fused(sc, dflt), sc->pdl >= 0 ? sc->pdl : decode_pdl_small_cuda(-1),
                    sc->cols >= 0 ? sc->cols : decode_linear_cols_cuda(-1), fus[fi][0], 100 * plain_floor / fus[fi][0],
                    fus[fi][1], fus[fi][2], 100 * draft_floor / fus[fi][2]);
        }
        fprintf(jf, "], \"quick\": %s, \"spec\": [", quick ? "true" : "false");
        if (quick) /* no loops: nothing to report (and no 0 / 0 in the JSON) */
            fprintf(jf, "], \"batch\": null}");
        for (int qi = 0; qi < 3 && !quick; qi++)
            fprintf(jf,
                    "%s{\"corrupt\": %.2f, \"tau\": %.3f, \"tpot_ms\": %.4f, \"draft_ms\": %.4f, \"verify_ms\": %.4f, "
                    "\"accept_ms\": %.4f, \"speedup\": %.3f, \"lossless\": %s}",
                    qi ? ", " : "", qs[qi], sp_tau[qi], sp_tpot[qi], sp_draft[qi], sp_verify[qi], sp_accept[qi],
                    plain_tpot / sp_tpot[qi], sp_lossless[qi] ? "true" : "false");
        if (!quick)
            fprintf(jf,
                    "], \"batch\": {\"n\": %d, \"plain_b1_tokens_per_s\": %.2f, \"plain_tokens_per_s\": %.2f, "
                    "\"plain_lossless\": %s, \"plain_step_ms\": %.4f, \"verify_ms\": %.4f, \"drafts_one_by_one_ms\": "
                    "%.4f, \"drafts_together_ms\": %.4f, \"chunk_major_x\": %s, \"verify_other_layout_ms\": %.4f, "
                    "\"verify_rows_block_32_16_8_ms\": [%.4f, %.4f, %.4f], \"spec\": [",
                    NB, 1e3 / plain_tpot, NB > 1 ? b_plain_tps : 1e3 / plain_tpot, b_plain_ok ? "true" : "false",
                    b_step[0], b_step[1], b_step[2], b_step[3], (m.fused & DECODE_FUSE_XC) ? "true" : "false",
                    b_step[4], b_step[5], b_step[6], b_step[7]);
        for (int qi = 0; qi < 3 && !quick; qi++)
            for (int mode = 0; mode < 2; mode++)
                fprintf(jf,
                        "%s{\"corrupt\": %.2f, \"drafts\": \"%s\", \"tau\": %.3f, \"b1_tokens_per_s\": %.2f, "
                        "\"tokens_per_s\": %.2f, \"over_plain_batch\": %.3f, \"draft_ms\": %.4f, \"verify_ms\": %.4f, "
                        "\"accept_ms\": %.4f, \"lossless\": %s}",
                        qi || mode ? ", " : "", qs[qi], mode ? "together" : "one by one",
                        NB > 1 ? b_tau[qi] : sp_tau[qi], 1e3 / sp_tpot[qi],
                        NB > 1 ? b_spec_tps[mode][qi] : 1e3 / sp_tpot[qi],
                        NB > 1 ? b_spec_tps[mode][qi] / b_plain_tps : 0.0, b_part[mode][qi][0], b_part[mode][qi][1],
                        b_part[mode][qi][2], NB > 1 ? (b_spec_ok[mode][qi] ? "true" : "false") : "true");
        if (!quick)
            fprintf(jf,
                    "], \"queue\": {\"prompts\": %d, \"sequences\": %d, \"plain_tokens_per_s\": %.2f, "
                    "\"plain_lossless\": %d, \"corrupt\": %.2f, \"tau\": %.3f, \"spec_tokens_per_s\": %.2f, "
                    "\"over_plain_queue\": %.3f, \"draft_ms\": %.4f, \"verify_ms\": %.4f, \"accept_ms\": %.4f, "
                    "\"spec_lossless\": %d}",
                    NB > 1 ? NQ : 0, NB, q_tps[0], q_ok[0], qs[1], q_tau, q_tps[1],
                    q_tps[0] > 0 ? q_tps[1] / q_tps[0] : 0.0, q_part[0], q_part[1], q_part[2], q_ok[1]);
        fprintf(jf, "%s", quick ? "" : "}}");
        fflush(jf);
        first_shape = 0;
        free(prompt);
        if (NB > 1)
            infer_batch_free_cuda(&ib); /* before the weights it borrows */
        infer_free_cuda(&dr);
        decode_free_cuda(&m);
    }
    fprintf(jf, "\n]}\n");
    fclose(jf);
    printf("\n| shape | plain ms/step | %% of ceiling | verify-16 ms | / plain | draft ms | %% of ceiling | accept "
           "ms | tau: spec ms/token, speedup (p = 1) | (p = 0.12) | (p = 0) "
           "|\n|---|---|---|---|---|---|---|---|---|---|---|\n%s",
           table);
    printf("\ntokens/s (new tokens of all prompts / decode time; speculative at p = 1, 0.12, 0):\n| shape | batch | "
           "plain | spec (p = 1) | (p = 0.12) | (p = 0) |\n|---|---|---|---|---|---|\n%s",
           btable);
    printf("JSON: %s\n", json);
    return 0;
}
#endif
