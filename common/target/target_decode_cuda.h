/* target_decode_cuda.h: the full target (every decoder layer, final norm, lm_head) with a
 * KV cache on the GPU, for greedy decoding (prefix decode_*_cuda): the CUDA twin of
 * target_decode.h, used by the CUDA backend of speculative-decoding evaluation
 * (eval/spec_decode_cuda.c).
 *
 * Mixture of experts (Qwen3-MoE): a sparse layer's MLP is target_moe_mlp_cuda, row-exact in
 * every extend of up to 64 rows and in every batched step (the router through the
 * small-row linear kernel, the experts through NN_MOE_ROWS: one block per 16 columns of
 * each expert some row picked, each such expert's weights read once for all its rows), the
 * grouped GEMM in longer prefills. A model with a sparse layer drops the fusions that
 * replace the MLP's bf16 output or read chunk-major inputs (RESIDUAL, SWIGLU, NORM, XC):
 * the others, and CUDA graphs, work as for a dense model.
 *
 * Weights: target_load_cuda (target_model_cuda.h) with the caller's capture layers plus the last
 * layer, so every layer is uploaded (bf16, fused QKV and gate/up); its embedding, RoPE
 * frequencies and workspace (sized for max_ctx rows: a whole prompt in one prefill) are
 * reused. The final norm (fp32) and an untied lm_head (bf16) are uploaded here; a tied
 * lm_head is the embedding. Residual stream fp32, activations bf16, fp32 accumulation.
 *
 * One extend of k tokens at positions len..len+k-1: per layer fused add + RMSNorm
 * (capturing the previous layer's output), QKV, q/k norm + RoPE (nn_*_cuda), the new K/V rows
 * appended to the cache, cached attention of the k queries to the cache and themselves
 * (causal; sliding layers see their window), o_proj, add + RMSNorm, gate/up, SwiGLU,
 * down; then the final norm and lm_head (fp32 logits) of the last n_next rows and their
 * argmax on the device: only n_next ints come back. Linear layers of up to
 * DECODE_LINEAR_MAX_ROWS (64) rows use decode_linear_rows_cuda (a row's result does not
 * depend on the other rows of the call: a B-row verify gives bit-identical logits to B
 * single-token steps, so speculative decoding is exactly lossless on one GPU); longer
 * calls (prefills) use cuBLASLt.
 *
 * CUDA graphs: an extend of k <= 64 tokens is captured once per (k, n_next) into a CUDA
 * graph (up to DECODE_CUDA_GRAPHS of them) and replayed from then on: the tokens and the
 * cache length go through pinned host buffers copied inside the graph, and every kernel
 * that places rows reads the length from device memory, so a plain step or a verify is
 * one graph launch and one synchronisation. use_graphs = 0 runs the same kernels
 * eagerly (the benchmark compares both), fused picks the kernel sequence of a small
 * extend (below).
 *
 * Batches (decode_load_batch_cuda, decode_extend_batch_cuda): n_seq sequences share one
 * cache, per layer [n_seq * max_ctx, KV*hd], sequence s at rows s*max_ctx..; the
 * single-sequence calls work on sequence 0 (m->len) or on sequence s (_seq: prefills). A
 * batched extend runs k_s new tokens of every sequence (rows one sequence after another,
 * k_s = 0: it sits out) in one pass of the same kernels as a small single-sequence
 * extend: the row-exact linear kernel (in 64-row pieces when a batch has more rows), q/k
 * norm + RoPE at per-row positions, each row's K/V to its own cache row
 * (decode_kv_append_rows_cuda) and attention with per-query key ranges inside the row's
 * sequence (full layers: every cached key up to the row; sliding layers: its window),
 * which counts and sums the same keys in the same order as the causal mode of a lone
 * extend. So every row's bits equal those of its sequence decoded alone (with fused 0 or
 * the default DECODE_FUSE_QK_APPEND, whose one kernel computes the same bits; a batch
 * refuses the residual and SwiGLU fusions). The row metadata (position, cache row, two key ranges) is
 * written to pinned host memory and copied inside the step, like the tokens: a batched
 * step of R rows is one CUDA graph, captured once per R and replayed.
 *
 * Cache: per layer K and V [n_seq * max_ctx, KV*hd] bf16 (K after q/k norm and RoPE).
 * Features of the last extend: feat [k, n_capture, d] bf16 on the device (the layout
 * the training pipeline hands the drafter).
 *
 * Errors: 0 or -errno, and a line in the caller's err (file and tensor for a bad model,
 * the step, layer and CUDA call otherwise). -EINVAL / -ENOENT permanent (target_exit_code
 * maps them), -ENOMEM / -EIO temporary. Ownership: decode_model_cuda owns every device
 * buffer, its graphs, its stream and the target_model_cuda; decode_free_cuda releases all
 * (safe on a zeroed or failed model). One extend at a time; the current CUDA device at
 * load is used. */
#ifndef DF_TARGET_DECODE_CUDA_H
#define DF_TARGET_DECODE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "io/hfconfig.h"
#include "target/target_model_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Graphs kept per model (distinct (k, n_next) pairs: a plain step and a verify are two). */
#define DECODE_CUDA_GRAPHS 16

typedef struct decode_graph_cuda {
    int k, n_next; /* n_next -1: a batched step of k rows */
    cudaGraphExec_t exec;
} decode_graph_cuda;

typedef struct decode_model_cuda {
    target_model_cuda tm;  /* every layer; its x/a/y/qkv/att/gu/h/pos workspace holds max_ctx rows */
    int n_capture;         /* the caller's captured layers (slots 0..n_capture-1) */
    int max_ctx;           /* cache rows per sequence */
    int n_seq;             /* sequences (1 after decode_load_cuda) */
    int max_rows;          /* rows one batched extend may have (n_seq * max_next) */
    int window;            /* the sliding layers' window (0: none) */
    int *seq_len;          /* host [n_seq]: valid rows of sequences 1.. (entry 0 unused: len) */
    int32_t *meta_d;       /* device [max_rows * 10]: a batch's positions, cache rows, key ranges */
    int32_t *meta_h;       /* pinned host, the same */
    int max_next;          /* greedy tokens one extend may ask for (<= DECODE_LINEAR_MAX_ROWS) */
    int small_rows;        /* calls of at most this many rows use the row-exact linear kernel */
    int len;               /* valid cache rows */
    int use_graphs;        /* 1 (default): small extends replay CUDA graphs */
    int fused;             /* small extends: 0 = separate kernels, bf16 sub-block outputs; else the
                               * DECODE_FUSE_* bits (1 = all of them): q/k norm + RoPE + cache append in
                               * one kernel; o_proj / down added to the fp32 residual inside the linear
                               * kernel; SwiGLU inside the down projection's loads; and the bit-exact
                               * ones (default): SwiGLU in gate/up's epilogue, add + RMSNorm in the
                               * last block of o_proj / down, argmax in the lm_head. Every choice is
                               * row-independent; set before the first extend (graphs). */
    int32_t *sync_d;       /* device DECODE_EPI_SYNC_BYTES: scratch of the fused epilogues */
    float *final_norm;     /* device [d] */
    nn_bf16_cuda *lm_head; /* device [V, d]; tm.embed when tied */
    int lm_head_owned;
    nn_bf16_cuda *kc, *vc; /* device [n_layers, n_seq * max_ctx, KV*hd] */
    nn_bf16_cuda *feat;    /* device [max(max_ctx, max_rows), n_capture, d] features of the last extend */
    nn_bf16_cuda *z;       /* device [max(max_next, max_rows), d] final-normed rows */
    float *logits;         /* device [max(max_next, max_rows), V] logits of the last extend's last n_next rows */
    int32_t *tokens;       /* device [max_ctx] */
    int32_t *len_d;        /* device [1]: the cache length the graphs read */
    int32_t *next_d;       /* device [max(max_next, max_rows)] */
    int32_t *next_h;       /* pinned host, the same */
    int32_t *tok_h;        /* pinned host [max_ctx] */
    int32_t *len_h;        /* pinned host [1] */
    int last_n_next;       /* rows of logits valid */
    decode_graph_cuda graphs[DECODE_CUDA_GRAPHS];
    int n_graphs;
    cudaStream_t stream;
} decode_model_cuda;

/* Load dir (HF Qwen3 / Llama) on the current device with the given captured layers
 * (distinct, any order), a cache of max_ctx tokens and up to max_next (<= 64) greedy
 * tokens per extend. 0 or -errno with err naming the file / tensor / CUDA call. */
int decode_load_cuda(decode_model_cuda *m, const char *dir, const int *capture, int n_capture, int max_ctx,
                     int max_next, char *err, size_t errlen);
/* The same with n_seq (1..DECODE_CUDA_MAX_SEQ) sequences of max_ctx tokens each. */
#define DECODE_CUDA_MAX_SEQ 64
int decode_load_batch_cuda(decode_model_cuda *m, const char *dir, const int *capture, int n_capture, int max_ctx,
                           int max_next, int n_seq, char *err, size_t errlen);
/* The same model shape from cfg with random weights made on the device
 * (target_randomize_cuda; final norm 1 +- 0.1; an untied lm_head uniform +- 0.02): for
 * benchmarks at real shapes without files. */
int decode_init_random_cuda(decode_model_cuda *m, const hfconfig *cfg, const int *capture, int n_capture, int max_ctx,
                            int max_next, uint64_t seed, char *err, size_t errlen);
int decode_init_random_batch_cuda(decode_model_cuda *m, const hfconfig *cfg, const int *capture, int n_capture,
                                  int max_ctx, int max_next, int n_seq, uint64_t seed, char *err, size_t errlen);
void decode_free_cuda(decode_model_cuda *m);

/* Forget every cached token. */
void decode_reset_cuda(decode_model_cuda *m);
/* Destroy the captured graphs (after changing fused: a graph keeps the kernels it was
 * captured with). */
void decode_drop_graphs_cuda(decode_model_cuda *m);
/* Keep the first len cached tokens (len <= m->len). 0 or -EINVAL. */
int decode_truncate_cuda(decode_model_cuda *m, int len);

/* Run k tokens (host ids) after the cached ones; next[i] (host, i < n_next) = the greedy
 * token after new position k - n_next + i (argmax, first on ties). Afterwards m->feat
 * rows 0..k-1 are the new tokens' features and m->logits the n_next rows' logits, valid
 * until the next extend. Synchronous (returns when next is filled). 0, -EINVAL (k < 1,
 * n_next outside [0, min(k, max_next)]), -ERANGE (token id; nothing run), -ENOSPC (cache
 * full), -EIO (CUDA; the cache is then undefined: reset). */
int decode_extend_cuda(decode_model_cuda *m, const int32_t *tokens, int k, int n_next, int32_t *next, char *err,
                       size_t errlen);

/* Sequence s's cached tokens; forget them; keep the first len (0 or -EINVAL). */
int decode_seq_len_cuda(const decode_model_cuda *m, int s);
void decode_reset_seq_cuda(decode_model_cuda *m, int s);
int decode_truncate_seq_cuda(decode_model_cuda *m, int s, int len);
/* decode_extend_cuda on sequence s (eager when s > 0: graphs are kept for sequence 0). */
int decode_extend_seq_cuda(decode_model_cuda *m, int s, const int32_t *tokens, int k, int n_next, int32_t *next,
                           char *err, size_t errlen);
/* One step for every sequence: tokens = ks[0] tokens of sequence 0, then ks[1] of 1, ...
 * (ks[s] = 0: s sits out); next[i] (host) = the greedy token after new row i, for all
 * R = sum ks rows; m->feat rows 0..R-1 and m->logits rows 0..R-1 in the same order.
 * Synchronous. 0, -EINVAL (a k < 0, R < 1 or R > max_rows, a residual or SwiGLU fusion in
 * fused), -ERANGE (token),
 * -ENOSPC (a sequence would pass max_ctx), -EIO (CUDA: reset). */
int decode_extend_batch_cuda(decode_model_cuda *m, const int32_t *tokens, const int *ks, int32_t *next, char *err,
                             size_t errlen);

/* Copy the logits of the last extend ([last_n_next, V] fp32) to host out. 0 or -EIO. */
int decode_logits_to_host_cuda(decode_model_cuda *m, float *out, char *err, size_t errlen);
/* Copy the features of the last extend's first k rows ([k, n_capture, d]) to host out as
 * fp32. 0, -ENOMEM or -EIO. */
int decode_feats_to_host_cuda(decode_model_cuda *m, int k, float *out, char *err, size_t errlen);

/* Bytes one extend of k tokens with n_next logit rows reads at least, with len tokens
 * cached before it: every linear weight once, the final norm, n_next > 0: the lm_head,
 * and the K/V cache rows its queries attend to (the memory floor of a decode step). A
 * sparse layer reads its attention weights, its router and the weights of the DISTINCT
 * experts its k rows picked: decode_step_bytes_cuda assumes uniform routing (E (1 -
 * (1 - topk/E)^k) distinct experts a layer), decode_step_bytes_moe_cuda takes the
 * measured average (nn_moe_work_cuda.stat; distinct < 0: the uniform figure). */
double decode_step_bytes_cuda(const decode_model_cuda *m, int len, int k, int n_next);
double decode_step_bytes_moe_cuda(const decode_model_cuda *m, int len, int k, int n_next, double distinct);

#ifdef __cplusplus
}
#endif

#endif
