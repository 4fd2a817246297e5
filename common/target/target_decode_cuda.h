/* target_decode_cuda.h: the full target (every decoder layer, final norm, lm_head) with a
 * KV cache on the GPU, for greedy decoding (prefix tdc_): the CUDA twin of
 * target_decode.h, used by the CUDA backend of speculative-decoding evaluation
 * (eval/spec_decode_cuda.c).
 *
 * Weights: tmc_load (target_model_cuda.h) with the caller's capture layers plus the last
 * layer, so every layer is uploaded (bf16, fused QKV and gate/up); its embedding, RoPE
 * frequencies and workspace (sized for max_ctx rows: a whole prompt in one prefill) are
 * reused. The final norm (fp32) and an untied lm_head (bf16) are uploaded here; a tied
 * lm_head is the embedding. Residual stream fp32, activations bf16, fp32 accumulation.
 *
 * One extend of k tokens at positions len..len+k-1: per layer fused add + RMSNorm
 * (capturing the previous layer's output), QKV, q/k norm + RoPE (nnc_), the new K/V rows
 * appended to the cache, cached attention of the k queries to the cache and themselves
 * (causal; sliding layers see their window), o_proj, add + RMSNorm, gate/up, SwiGLU,
 * down; then the final norm and lm_head (fp32 logits) of the last n_next rows and their
 * argmax on the device: only n_next ints come back. Linear layers of up to small_rows
 * rows use dkc_linear_rows (a row's result does not depend on the other rows of the
 * call: a B-row verify gives bit-identical logits to B single-token steps, so speculative
 * decoding is exactly lossless on one GPU); longer calls (prefills) use cuBLASLt.
 *
 * Cache: per layer K and V [max_ctx, KV*hd] bf16 (K after q/k norm and RoPE).
 * Features of the last extend: feat [k, n_capture, d] bf16 on the device (the layout
 * the training pipeline hands the drafter).
 *
 * Errors: 0 or -errno; tdc_load fills err (file and tensor for a bad model, the CUDA call
 * otherwise); extend failures leave text in tdc_error. -EINVAL / -ENOENT permanent
 * (tm_exit_code maps them), -ENOMEM / -EIO temporary. Ownership: tdc_model owns every
 * device buffer, its stream and the tmc_model; tdc_free releases all (safe on a zeroed
 * or failed model). One extend at a time; the current CUDA device at tdc_load is used. */
#ifndef DF_TARGET_DECODE_CUDA_H
#define DF_TARGET_DECODE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "target/target_model_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tdc_model {
    tmc_model tm;         /* every layer; its x/a/y/qkv/att/gu/h/pos workspace holds max_ctx rows */
    int n_capture;        /* the caller's captured layers (slots 0..n_capture-1) */
    int max_ctx;          /* cache rows */
    int max_next;         /* greedy tokens one extend may ask for */
    int small_rows;       /* calls of at most this many rows use the row-exact linear kernel */
    int len;              /* valid cache rows */
    float *final_norm;    /* device [d] */
    nnc_bf16 *lm_head;    /* device [V, d]; tm.embed when tied */
    int lm_head_owned;
    nnc_bf16 *kc, *vc;    /* device [n_layers, max_ctx, KV*hd] */
    nnc_bf16 *feat;       /* device [max_ctx, n_capture, d] features of the last extend */
    nnc_bf16 *z;          /* device [max_next, d] final-normed rows */
    float *logits;        /* device [max_next, V] logits of the last extend's last n_next rows */
    int32_t *tokens;      /* device [max_ctx] */
    int32_t *next_d;      /* device [max_next] */
    int32_t *next_h;      /* pinned host [max_next] */
    int last_n_next;      /* rows of logits valid */
    cudaStream_t stream;
    char err[400];
} tdc_model;

/* Load dir (HF Qwen3 / Llama) on the current device with the given captured layers
 * (distinct, any order), a cache of max_ctx tokens and up to max_next greedy tokens per
 * extend. 0 or -errno with err naming the file / tensor / CUDA call. */
int tdc_load(tdc_model *m, const char *dir, const int *capture, int n_capture, int max_ctx, int max_next, char *err,
             size_t errlen);
void tdc_free(tdc_model *m);

/* Forget every cached token. */
void tdc_reset(tdc_model *m);
/* Keep the first len cached tokens (len <= m->len). 0 or -EINVAL. */
int tdc_truncate(tdc_model *m, int len);

/* Run k tokens (host ids) after the cached ones; next[i] (host, i < n_next) = the greedy
 * token after new position k - n_next + i (argmax, first on ties). Afterwards m->feat
 * rows 0..k-1 are the new tokens' features and m->logits the n_next rows' logits, valid
 * until the next extend. Synchronous (returns when next is filled). 0, -EINVAL (k < 1,
 * n_next outside [0, min(k, max_next)]), -ERANGE (token id; nothing run), -ENOSPC (cache
 * full), -EIO (CUDA; text in tdc_error; the cache is then undefined: reset). */
int tdc_extend(tdc_model *m, const int32_t *tokens, int k, int n_next, int32_t *next);

/* Copy the logits of the last extend ([last_n_next, V] fp32) to host out. 0 or -EIO. */
int tdc_logits_to_host(tdc_model *m, float *out);
/* Copy the features of the last extend's first k rows ([k, n_capture, d]) to host out as
 * fp32. 0 or -EIO. */
int tdc_feats_to_host(tdc_model *m, int k, float *out);

const char *tdc_error(const tdc_model *m);

#ifdef __cplusplus
}
#endif

#endif
