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
 * Cache: per layer K and V rows [n_seq * max_ctx, KV*hd] fp32 (K after q/k norm and RoPE);
 * sequence s owns rows s*max_ctx .. s*max_ctx+max_ctx-1, of which the first len(s) are
 * valid. Extending a sequence past max_ctx is -ENOSPC. decode_load makes one sequence
 * (the single-sequence calls below work on sequence 0, its length is m->len);
 * decode_load_batch makes n_seq of them for decode_extend_batch.
 *
 * Batches: decode_extend_batch runs k_s new tokens of every sequence s in one pass (rows
 * of the sequences one after another; k_s = 0: the sequence sits out). A row's query sees
 * only its own sequence's cached keys (key ranges inside that sequence's rows) at its own
 * position, and every other step works row by row, so each row's features and logits are
 * bit-identical to the same sequence decoded alone.
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
    int max_ctx;            /* cache rows per sequence */
    int len;                /* valid cache rows of sequence 0 = tokens decoded so far */
    int n_seq;              /* sequences (1 after decode_load) */
    int *seq_len;           /* [n_seq]: valid rows of sequences 1.. (entry 0 unused: m->len) */
    int *seq_k, *seq_nl;    /* [n_seq] scratch of one extend: rows and logit rows per sequence */
    float *kc, *vc;         /* [n_layers, n_seq * max_ctx, KV*hd] */
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
/* The same with n_seq (1..DECODE_MAX_SEQ) sequences of max_ctx tokens each. */
#define DECODE_MAX_SEQ 64
int decode_load_batch(decode_model *m, const char *dir, const int *capture, int n_capture, int max_ctx, int n_seq,
                      char *err, size_t errlen);
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

/* Sequence s's cached tokens, forget them, keep the first len (0 or -EINVAL). */
int decode_seq_len(const decode_model *m, int s);
void decode_reset_seq(decode_model *m, int s);
int decode_truncate_seq(decode_model *m, int s, int len);
/* decode_extend on sequence s. */
int decode_extend_seq(decode_model *m, int s, const int32_t *tokens, int k, int n_logits);

/* One pass over every sequence: tokens holds ks[0] tokens of sequence 0, then ks[1] of
 * sequence 1, ... (ks[s] = 0: s sits out); each extends at its own length. Afterwards
 * the R = sum ks rows are, in that order, m->feat rows 0..R-1 and m->logits rows 0..R-1
 * (every new row's logits). 0, -EINVAL (a k < 0 or no row), -ERANGE (a token id),
 * -ENOSPC (a sequence would pass max_ctx), -ENOMEM; on error no cache changes. */
int decode_extend_batch(decode_model *m, const int32_t *tokens, const int *ks);

/* Index of the largest of x[n] (the first on ties: greedy decoding is deterministic). */
int32_t decode_argmax(const float *x, int n);

#endif
