/* target_decode.h: the full target (every decoder layer, final norm, lm_head) with a KV
 * cache, for decoding on the CPU (prefix decode_). Used by speculative-decoding evaluation
 * (eval/spec_decode.h): prefill a prompt, then extend by k tokens at a time,
 * get the logits of every new position and the captured features of every new token,
 * and truncate the cache back when the target rejects part of a drafted block.
 *
 * Built on target_model (target_model.h): target_load with the caller's capture layers plus the
 * last layer (so every layer is loaded) and target_load_embeddings for the final norm and
 * lm_head. The math per token is exactly target_forward_cpu's (same kernels, same order per
 * row), so the features of a cached decode equal a one-document target_forward_cpu of the
 * same tokens, and a block of k tokens gives the same logits as k single-token steps.
 *
 * Cache: per layer K and V rows [max_ctx, KV*hd] fp32 (K after q/k norm and RoPE), rows
 * 0..len-1 valid. Extending past max_ctx is -ENOSPC.
 *
 * Ownership: decode_model owns the target_model, the embeddings and every buffer; decode_free
 * releases all (safe on a zeroed or failed model). Not thread-safe. */
#ifndef DF_TARGET_DECODE_H
#define DF_TARGET_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "target/target_model.h"

typedef struct decode_model {
    target_model tm;        /* every layer (capture list extended by the last layer) */
    target_embeddings head; /* embed [V, d] fp32, lm_head [V, d] (== embed when tied), final_norm [d] */
    int n_capture;          /* the caller's captured layers (slots 0..n_capture-1 of tm) */
    int max_ctx;            /* cache rows */
    int len;                /* valid cache rows = tokens decoded so far */
    float *kc, *vc;         /* [n_layers, max_ctx, KV*hd] */
    float *feat;            /* [max_step, n_capture * d] features of the last extend */
    float *z;               /* [max_step, d] final-normed hidden of the last extend */
    float *logits;          /* [max_step, V] logits of the last extend (rows asked for) */
    int max_step;           /* rows of feat / z / logits */
} decode_model;

/* Load dir (HF Qwen3/Llama) with the given captured layers (the drafter's target_layer_ids,
 * any order, distinct) and a cache for max_ctx tokens. 0 or -errno with err naming the
 * file and tensor/field (target_exit_code maps it to an exit code). */
int decode_load(decode_model *m, const char *dir, const int *capture, int n_capture, int max_ctx, char *err,
                size_t errlen);
void decode_free(decode_model *m);

/* Forget every cached token (len = 0). */
void decode_reset(decode_model *m);
/* Keep the first len cached tokens (len <= m->len): the rest are dropped. 0 or -EINVAL. */
int decode_truncate(decode_model *m, int len);

/* Run k new tokens at positions len..len+k-1 against the cache, append their K/V.
 * Afterwards m->feat rows 0..k-1 hold the captured features [k, n_capture*d] (capture
 * order) and, when n_logits > 0, m->logits rows 0..n_logits-1 hold the logits of the
 * LAST n_logits new positions ([n_logits, V]; n_logits <= k). Both stay valid until the
 * next extend. 0, -EINVAL (k < 1, n_logits > k), -ERANGE (token id), -ENOSPC (cache
 * full), -ENOMEM. On error the cache is unchanged. */
int decode_extend(decode_model *m, const int32_t *tokens, int k, int n_logits);

/* Index of the largest of x[n] (the first on ties: greedy decoding is deterministic). */
int32_t decode_argmax(const float *x, int n);

#endif
