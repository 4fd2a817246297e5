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
    /* Load model_dir on this backend (device: the CUDA device; the CPU ignores it) with a
     * cache of max_ctx tokens and fill t. 0 or -errno with err set. */
    int (*open)(generate_target *t, int device, const char *model_dir, int max_ctx, char *err, size_t errlen);
    /* Run k tokens after the cached ones (the cache is reset by reset()). Afterwards
     * *greedy = the argmax after the last of them and, when want_logits, *logits = host
     * fp32 [vocab] logits after the last of them (valid until the next call). 0 or -errno
     * with err set (-ENOSPC: the cache is full). */
    int (*extend)(void *impl, const int32_t *tokens, int k, int want_logits, int32_t *greedy, const float **logits,
                  char *err, size_t errlen);
    void (*reset)(void *impl);
    void (*close)(void *impl);
} generate_ops;

struct generate_target {
    const generate_ops *ops;
    void *impl;
    int vocab;   /* logits per row */
    int max_ctx; /* prompt + response tokens the cache holds */
};

typedef struct generate_opts {
    sample_opts sample;
    int max_new; /* response tokens at most */
    const int64_t *eos;
    int n_eos; /* stop after any of these (kept in the response) */
} generate_opts;

/* backend "cpu", "cuda" or "cuda:N". 0 or -errno with err naming the file / field / device. */
int generate_open(generate_target *t, const char *backend, const char *model_dir, int max_ctx, char *err,
                  size_t errlen);
/* The CUDA table (generate_cuda.c; in a build without CUDA=1, generate_nocuda.c's stubs). */
extern const generate_ops generate_ops_cuda;
void generate_close(generate_target *t);

/* One response to prompt[n_prompt] into out[o->max_new]; *n_out tokens (the eos that
 * ended it included); *stopped = 1 when it ended on an eos. rng is this prompt's own.
 * 0 or -errno (-ENOSPC: prompt + max_new does not fit the cache). */
int generate_one(generate_target *t, const int32_t *prompt, int n_prompt, const generate_opts *o, df_rng *rng,
                 sample_work *w, int32_t *out, int *n_out, int *stopped, char *err, size_t errlen);

/* The RNG of prompt number idx under seed (splitmix of both). */
void generate_rng(df_rng *r, uint64_t seed, uint64_t idx);

#endif
