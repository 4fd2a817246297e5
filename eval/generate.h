/* generate.h: the target answering prompts on its own (prefix generate_): the responses a
 * DFlash drafter is trained on are the target's, so training data is regenerated with
 * the target before training (target_generate, docs/walkthrough.md).
 *
 * Backend seam (the tree's one shape, docs/backends.md): a generate_target holds an ops
 * table chosen at generate_open: "cpu" (target_decode.h, generate.c) or "cuda[:N]"
 * (target_decode_cuda.h, generate_ops_cuda in generate_cuda.c; generate_nocuda.c's table
 * answers -ENOTSUP in a build without CUDA=1).
 *
 * Determinism: greedy decoding needs no RNG; sampled decoding draws from one RNG per
 * prompt, seeded from (seed, prompt index), so a prompt's response does not depend on
 * which other prompts run, in which order, or how many at once. The CPU and CUDA backends
 * round differently, so their sampled (and near-tie greedy) responses may differ. */
#ifndef DF_EVAL_GENERATE_H
#define DF_EVAL_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "eval/sample.h"

typedef struct generate_target generate_target;
typedef struct generate_ops {
    const char *name;
    /* Load model_dir on this backend (device: the CUDA device; the CPU ignores it) with
     * n_seq sequences of max_ctx cached tokens each and fill t. 0 or -errno with err set. */
    int (*open)(generate_target *t, int device, const char *model_dir, int max_ctx, int n_seq, char *err,
                size_t errlen);
    /* Run k tokens after sequence s's cached ones (a prefill). Afterwards *greedy = the
     * argmax after the last of them and, when want_logits, *logits = host fp32 [vocab]
     * logits after the last of them (valid until the next call). 0 or -errno with err set
     * (-ENOSPC: the cache is full). */
    int (*extend)(void *impl, int s, const int32_t *tokens, int k, int want_logits, int32_t *greedy,
                  const float **logits, char *err, size_t errlen);
    /* One token for every sequence s with on[s] = 1, in one pass: tokens[i] is the i-th such
     * sequence's; greedy[i] its argmax and, when want_logits, (*logits)[i * vocab ..] its
     * host fp32 logits. Each row is bit-identical to the same sequence extended alone. */
    int (*step)(void *impl, const int32_t *tokens, const int *on, int want_logits, int32_t *greedy,
                const float **logits, char *err, size_t errlen);
    void (*reset)(void *impl, int s); /* forget sequence s's cached tokens */
    void (*close)(void *impl);
} generate_ops;

struct generate_target {
    const generate_ops *ops;
    void *impl;
    int vocab;   /* logits per row */
    int max_ctx; /* prompt + response tokens one sequence's cache holds */
    int n_seq;   /* sequences decoded together at most (GENERATE_MAX_BATCH) */
};
#define GENERATE_MAX_BATCH 64

typedef struct generate_opts {
    sample_opts sample;
    int max_new; /* response tokens at most */
    const int64_t *eos;
    int n_eos; /* stop after any of these (kept in the response) */
} generate_opts;

/* backend "cpu", "cuda" or "cuda:N"; n_seq 1..GENERATE_MAX_BATCH sequences. 0 or -errno
 * with err naming the file / field / device. */
int generate_open(generate_target *t, const char *backend, const char *model_dir, int max_ctx, int n_seq, char *err,
                  size_t errlen);
/* The CUDA table (generate_cuda.c; in a build without CUDA=1, generate_nocuda.c's stubs). */
extern const generate_ops generate_ops_cuda;
void generate_close(generate_target *t);

/* One response to prompt[n_prompt] into out[o->max_new]; *n_out tokens (the eos that
 * ended it included); *stopped = 1 when it ended on an eos. rng is this prompt's own.
 * 0 or -errno (-ENOSPC: prompt + max_new does not fit the cache). */
int generate_one(generate_target *t, const int32_t *prompt, int n_prompt, const generate_opts *o, df_rng *rng,
                 sample_work *w, int32_t *out, int *n_out, int *stopped, char *err, size_t errlen);

/* One prompt of a batch: the caller fills prompt, n_prompt, rng (its own, as in
 * generate_one) and out[o->max_new]; generate_batch fills n_out and stopped. */
typedef struct generate_item {
    const int32_t *prompt;
    int n_prompt;
    df_rng *rng;
    int32_t *out;
    int n_out, stopped;
} generate_item;

/* The responses to items[0..n) (any n) decoded together through min(n, t->n_seq)
 * sequences, a queue: the items take the sequences in order, each prefilled on its own,
 * then one step per token for all that are running; an item that ends hands its sequence to
 * the next, prefilled before the next step, so long and short responses mix without the
 * short ones' sequences idling until the longest ends. Each response equals generate_one's
 * for that prompt and rng: greedy rows are bit-identical whatever else is in the step, and
 * each prompt draws only from its rng. 0 or -errno (-ENOSPC: a prompt + max_new does not
 * fit; err names its index, checked before anything runs). */
int generate_batch(generate_target *t, generate_item *items, int n, const generate_opts *o, sample_work *w, char *err,
                   size_t errlen);

/* The RNG of prompt number idx under seed (splitmix of both). */
void generate_rng(df_rng *r, uint64_t seed, uint64_t idx);

#endif
