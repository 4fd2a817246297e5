/* spec_decode.h: greedy speculative decoding with a DFlash drafter, and plain greedy
 * decoding of the target for comparison (prefix spec_). docs/eval.md has the loop and the
 * statistics; docs/dflash_spec.md "Evaluation" defines tau.
 *
 * The loop is written against two small interfaces so the same code runs the CPU models
 * (target_decode.h, dflash_infer.h; spec_target_cpu / spec_drafter_cpu below) and the CUDA
 * ones (spec_decode_cuda.h): the backend seam is here, the loop never knows which.
 *
 * One speculative step, with n tokens so far (prompt + output) and `last` the newest:
 * the target cache and the drafter context hold rows 0..n-2; `last` is the anchor, at
 * position n-1, its features not computed yet:
 *   1. the drafter drafts d_1..d_{B-1} for the block [last, MASK...];
 *   2. the target runs [last, d_1..d_{B-1}] at positions n-1..n+B-2 against its cache;
 *      its greedy token after each block row is t_0..t_{B-1};
 *   3. m = the number of leading k with d_k == t_{k-1}; the step yields d_1..d_m and the
 *      bonus t_m: acceptance length m + 1 (1..B);
 *   4. the target cache keeps rows 0..n-1+m (the anchor and the m accepted drafts),
 *      those m+1 rows' features are appended to the drafter context, and the bonus is
 *      the next anchor.
 * Every yielded token is the target's own greedy choice given the tokens before it, so
 * the output equals plain greedy decoding (lossless), up to ties broken differently by
 * different arithmetic (none on the CPU: a row's math does not depend on its block). */
#ifndef DF_SPEC_DECODE_H
#define DF_SPEC_DECODE_H

#include <stddef.h>
#include <stdint.h>

/* The target: a KV-cached greedy decoder with captured features. */
typedef struct spec_target {
    void *ctx;
    int feat_dim;          /* feature elements per token (n_capture * d) */
    size_t feat_row_bytes; /* bytes of one token's features in the backend's memory (fp32
                            * on the CPU, bf16 on the GPU): the stride between rows of
                            * *feats, whatever its C type says */
    int max_ctx;           /* tokens the cache holds */
    int (*reset)(void *ctx);
    /* Run k tokens after the cached ones; next[i] (i < n_next) = greedy token after new
     * position k - n_next + i; *feats = the k new tokens' features [k, feat_dim] in the
     * backend's memory, valid until the next call. 0 or -errno. */
    int (*extend)(void *ctx, const int32_t *tokens, int k, int n_next, int32_t *next, const float **feats);
    int (*truncate)(void *ctx, int len);
    /* Batches (spec_generate_batch): n_seq sequences with a cache of max_ctx tokens each;
     * the calls above work on sequence 0. n_seq 1 and NULL pointers: no batch calls. */
    int n_seq;
    int (*reset_seq)(void *ctx, int seq);
    /* extend on sequence seq alone (the prefill of a batch member), same contract */
    int (*extend_seq)(void *ctx, int seq, const int32_t *tokens, int k, int n_next, int32_t *next, const float **feats);
    int (*truncate_seq)(void *ctx, int seq, int len);
    /* One call for every sequence: tokens = ks[0] tokens of sequence 0, then ks[1] of
     * sequence 1, ... (ks[s] = 0: s sits out); next[i] = the greedy token after new row i
     * and *feats = the new rows' features, both in that row order. 0 or -errno. */
    int (*extend_batch)(void *ctx, const int32_t *tokens, const int *ks, int32_t *next, const float **feats);
} spec_target;

/* The drafter: context from features, one greedy block per call. */
typedef struct spec_drafter {
    void *ctx;
    int block_size; /* B: a draft has B-1 tokens */
    int (*reset)(void *ctx);
    /* Append n context rows (feats from spec_target.extend, same memory kind). 0 or -errno. */
    int (*append)(void *ctx, const float *feats, int n);
    /* Draft B-1 tokens for the block anchored at the next context position. 0 or -errno. */
    int (*draft)(void *ctx, int32_t anchor, int32_t *draft);
    /* Optional (NULL: spec_generate_batch drafts one sequence after the other): the blocks
     * of n sequences in one call, for drafters of one batch (the same batch_ctx): seqs[j]
     * the index of sequence j's drafter in the batch, anchors[j] its anchor, drafts[j *
     * (B-1) ..] what that drafter's draft would give. 0 or -errno. */
    void *batch_ctx;
    int (*draft_batch)(void *batch_ctx, int n, const int *seqs, const int32_t *anchors, int32_t *drafts);
    /* Optional (NULL: nothing to do): spec_generate_batch tells a sequence's drafter which
     * prompt (its index in the call) it serves next, before its reset. Drafters that draft
     * from the features alone ignore it; a test oracle that drafts a known output uses it. */
    int (*assign)(void *ctx, int prompt);
} spec_drafter;

typedef struct spec_opts {
    int max_new; /* stop after this many new tokens */
    int eos;     /* stop after this token (-1: never) */
} spec_opts;

/* One generation. Owns tokens and hist (spec_result_free). Times in seconds, CLOCK_MONOTONIC. */
typedef struct spec_result {
    int32_t *tokens; /* [max_new] the new tokens (eos included when it stopped there) */
    int n_tokens;
    int block_size;  /* 1 for plain decoding */
    int n_steps;     /* target forward calls after the prefill (verify steps) */
    long accept_sum; /* sum of acceptance lengths over the steps */
    long *hist;      /* [block_size + 1]: hist[a] = steps with acceptance length a (a >= 1) */
    /* Per-position accuracy of the drafts against the final output (speculative runs;
     * zeros for plain): for each step anchored at output token j and each k = 1..B-1
     * whose token j+k exists, pos_n[k]++ and pos_hit[k] += (d_k == output[j+k]). The
     * output is the target's greedy text, so this is the training-time acc_k measured on
     * held-out prompts, every draft position counted (not only the leading accepted). */
    long *pos_hit;    /* [block_size] */
    long *pos_n;      /* [block_size] */
    double prefill_s; /* prompt through the target (and the drafter's context), first token */
    double decode_s;  /* everything after: the tokens 2..n_tokens */
    /* decode_s of a speculative run in parts: drafting, the target's verify call (both
     * return tokens to the host, so their device work is inside them), and accepting
     * (cache truncation + the accepted rows' features appended to the drafter; on a GPU
     * its device work may finish inside the next draft, which then counts it) */
    double draft_s, verify_s, accept_s;
    long batch_steps; /* spec_generate_batch: the call's steps (extend_batch calls), in every r[i]; else 0 */
} spec_result;

void spec_result_free(spec_result *r);
/* Mean acceptance length of this generation (0 when it had no step). */
double spec_result_tau(const spec_result *r);

/* Plain greedy decoding: prefill, then one token per target call. 0 or -errno (the
 * backend's code; -ENOSPC when prompt + max_new exceeds the cache). */
int spec_generate_plain(spec_target *t, const int32_t *prompt, int n_prompt, const spec_opts *o, spec_result *r);
/* Speculative greedy decoding as above. 0 or -errno. */
int spec_generate(spec_target *t, spec_drafter *dr, const int32_t *prompt, int n_prompt, const spec_opts *o,
                  spec_result *r);

/* Plain (drs NULL) or speculative greedy decoding of n prompts (any number) over the
 * S = min(n, t->n_seq) sequences of t (t with batch calls), a queue: prompts take the
 * sequences (slots) in order, each prefilled alone into its slot, then every step is one
 * extend_batch over the slots still running (1 row each for plain, B for speculative: the
 * drafts (one draft_batch call when the drafters have one, else one draft per slot),
 * verify all in one call, then each slot's own acceptance, truncation and feature
 * append). A prompt that reaches eos or max_new leaves its slot, and the next prompt of the
 * queue is prefilled into it before the next step, so a long list runs S at a time without
 * waiting for the slowest of a group. drs (speculative): one drafter per slot, drs[s] with
 * its own context (assign, when set, names the prompt it serves next). r[i] is prompt i's
 * result as spec_generate makes it, but decode_s and draft_s / verify_s / accept_s are the
 * whole call's times (the steps are shared; decode_s leaves out the prefills of prompts
 * admitted on the way); *wall_s (may be NULL) = prefills + steps. Prompt i's tokens are the
 * same as spec_generate_plain on it alone whenever a row's greedy token does not depend on
 * the other rows of its call (true on the CPU and for the CUDA backend, docs/eval.md). 0 or
 * -errno (then no r[i] is left allocated). */
int spec_generate_batch(spec_target *t, spec_drafter *drs, int n, const int32_t *const *prompts, const int *n_prompt,
                        const spec_opts *o, spec_result *r, double *wall_s);

/* Teacher-forced per-position accuracy on a finished output: every output token but the
 * last becomes an anchor in turn, with the target's features of everything before it as
 * the drafter's context (computed once, in one target call), and the draft's position k
 * is compared with out[j + k] where that token exists: hit[k] += match, n[k]++ (k = 1..B-1;
 * the arrays have B entries and are added to). This is the training-time acc_k measured on
 * held-out text, with anchors at every position; the drafts scored inside speculative
 * decoding (spec_result.pos_hit) sit right after a rejected draft, a harder-than-average
 * place. Resets the target and the drafter. 0 or -errno. */
int spec_score_drafts(spec_target *t, spec_drafter *dr, const int32_t *prompt, int n_prompt, const int32_t *out,
                      int n_out, long *hit, long *n);

/* CPU backends over target_decode / dflash_infer (borrowed; must outlive the structs). */
struct decode_model;
struct infer_state;
void spec_target_cpu(spec_target *t, struct decode_model *m); /* batch calls when m->n_seq > 1 */
void spec_drafter_cpu(spec_drafter *d, struct infer_state *s);

#endif
