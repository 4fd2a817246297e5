/* test_spec_decode.c: the pieces of speculative-decoding evaluation on the tiny target
 * (models/tiny-target), with fresh random inputs every run (seed printed; SPEC_SEED=...
 * replays one):
 *   1. target_decode: a KV-cached decode in random chunks gives the features of one
 *      target_forward_cpu over the same tokens (capture order respected) and logits equal to
 *      final norm + lm_head of target_forward_cpu's last layer; truncating and extending with
 *      other tokens equals a fresh forward of the new sequence.
 *   2. dflash_infer: drafting with a cached context (appended in random chunks) gives the
 *      block rows of dflash_forward for the same features and anchor (anchor 0, middle,
 *      last), with a full and a sliding drafter layer.
 *   3. the speculative loop with an oracle drafter (it drafts the plain greedy output,
 *      with a seeded fraction of its tokens corrupted): output == plain output; with no
 *      corruption every step accepts B tokens; the features the loop hands the drafter
 *      are exactly the target's features of the accepted sequence, in order.
 *   4. held-out prompts: chat JSONL and the shard give the same prompt tokens; greedy
 *      speculative decoding with a random drafter equals plain decoding; tau in [1, B].
 *   6. batches: decode_extend_batch rows (several sequences, different lengths, one
 *      sitting out) have bit-identical features and logits to each sequence decoded
 *      alone; spec_generate_batch, plain and speculative, gives every prompt (different
 *      lengths, one stopping early at eos) the tokens of spec_generate_plain on it alone;
 *      with oracle drafters, drafting one after the other and through draft_batch (the
 *      running sequences' blocks in one call), the tokens, acceptance histograms and
 *      drafter context rows of each alone.
 *   5. a public release-format drafter (tests/fixtures/dflash-release-tiny, written by
 *      scripts/make_release_drafter.py with transformers) loads and decodes losslessly;
 *      when the directory is absent that one check is skipped with a line saying so.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dflash/dflash_batch.h"
#include "dflash/dflash_ckpt.h"
#include "dflash/dflash_config.h"
#include "eval/dflash_infer.h"
#include "dflash/dflash_model.h"
#include "eval/eval_prompts.h"
#include "eval/spec_decode.h"
#include "eval/spec_decode_backend.h"
#include "io/safetensors.h"
#include "target/target_decode.h"
#include "target/target_model.h"
#include "test_helpers.h"
#include "util.h"

#define TARGET "models/tiny-target"
#define RELEASE_FIXTURE "tests/fixtures/dflash-release-tiny"

static df_rng rng;

static int rnd(int lo, int hi) /* [lo, hi] */
{
    return lo + (int)df_rng_below(&rng, (uint64_t)(hi - lo + 1));
}

/* max |a - b| / (1 + max |b|) */
static double rel_err(const float *a, const float *b, size_t n)
{
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        md = fmax(md, fabs((double)a[i] - b[i]));
        mb = fmax(mb, fabs((double)b[i]));
    }
    return md / (1.0 + mb);
}

/* ---- 1. target decode vs target_forward_cpu --------------------------------------------- */

/* Reference for a sequence: features [S, 2, d] of layers {3, 1} and logits [S, V]. */
static void reference(target_model *ref, const target_embeddings *e, const int32_t *tok, int S, float *feat,
                      float *logits)
{
    int d = ref->cfg.hidden_size, V = ref->cfg.vocab_size;
    int32_t starts[2] = {0, S};
    float *all = malloc(sizeof(float) * (size_t)S * 4 * d); /* ref captures layers 0..3 in order */
    float *z = malloc(sizeof(float) * (size_t)S * d);
    T_ASSERT(all && z);
    T_ASSERT_RC(target_forward_cpu(ref, tok, starts, 1, all));
    for (int t = 0; t < S; t++) {
        memcpy(feat + ((size_t)t * 2 + 0) * d, all + ((size_t)t * 4 + 3) * d, sizeof(float) * d);
        memcpy(feat + ((size_t)t * 2 + 1) * d, all + ((size_t)t * 4 + 1) * d, sizeof(float) * d);
        memcpy(z + (size_t)t * d, all + ((size_t)t * 4 + 3) * d, sizeof(float) * d);
    }
    nn_rmsnorm(z, z, e->final_norm, S, d, (float)ref->cfg.rms_norm_eps);
    nn_matmul(logits, z, e->lm_head, NULL, S, d, V);
    free(all);
    free(z);
}

/* Decode tok[from..S) into m in random chunks, comparing with the reference rows. */
static void decode_and_compare(decode_model *m, const int32_t *tok, int from, int S, const float *feat,
                               const float *logits, double *worst_f, double *worst_l)
{
    int d = m->tm.cfg.hidden_size, V = m->tm.cfg.vocab_size;
    for (int p = from; p < S;) {
        int k = rnd(1, 9);
        k = DF_MIN(k, S - p);
        int nl = rnd(0, k);
        T_ASSERT_RC(decode_extend(m, tok + p, k, nl));
        T_ASSERT(m->len == p + k);
        *worst_f = fmax(*worst_f, rel_err(m->feat, feat + (size_t)p * 2 * d, (size_t)k * 2 * d));
        if (nl)
            *worst_l = fmax(*worst_l, rel_err(m->logits, logits + (size_t)(p + k - nl) * V, (size_t)nl * V));
        p += k;
    }
}

static void test_target_decode(void)
{
    char err[512];
    int all[4] = {0, 1, 2, 3}, cap[2] = {3, 1};
    target_model ref;
    target_embeddings e;
    decode_model m;
    T_ASSERT_RC(target_load(&ref, TARGET, all, 4, err, sizeof err));
    T_ASSERT_RC(target_load_embeddings(&e, TARGET, 1, err, sizeof err));
    T_ASSERT_RC(decode_load(&m, TARGET, cap, 2, 256, err, sizeof err));
    int d = ref.cfg.hidden_size, V = ref.cfg.vocab_size, S = rnd(60, 160);
    int32_t *tok = malloc(sizeof(int32_t) * S), *tok2 = malloc(sizeof(int32_t) * S);
    float *feat = malloc(sizeof(float) * (size_t)S * 2 * d), *lg = malloc(sizeof(float) * (size_t)S * V);
    T_ASSERT(tok && tok2 && feat && lg);
    for (int i = 0; i < S; i++)
        tok[i] = rnd(0, V - 1);
    reference(&ref, &e, tok, S, feat, lg);
    double wf = 0, wl = 0;
    decode_reset(&m);
    decode_and_compare(&m, tok, 0, S, feat, lg, &wf, &wl);
    printf("target decode: %d random tokens in random chunks: features rel err %.2e, logits rel err %.2e\n", S, wf, wl);
    T_ASSERT(wf < 1e-5 && wl < 1e-5);

    /* truncate to r, continue with other tokens: equals a fresh forward of the new sequence */
    int r = rnd(1, S - 2);
    memcpy(tok2, tok, sizeof(int32_t) * r);
    for (int i = r; i < S; i++)
        tok2[i] = rnd(0, V - 1);
    reference(&ref, &e, tok2, S, feat, lg);
    T_ASSERT_RC(decode_truncate(&m, r));
    wf = wl = 0;
    decode_and_compare(&m, tok2, r, S, feat, lg, &wf, &wl);
    printf("target decode: truncate to %d and continue: features rel err %.2e, logits rel err %.2e\n", r, wf, wl);
    T_ASSERT(wf < 1e-5 && wl < 1e-5);

    /* errors: bad token, cache overflow, truncating forward; the cache is unchanged */
    int32_t bad = V;
    T_ASSERT(decode_extend(&m, &bad, 1, 1) == -ERANGE && m.len == S);
    T_ASSERT(decode_extend(&m, tok, 257 - S, 0) == -ENOSPC && m.len == S);
    T_ASSERT(decode_truncate(&m, S + 1) == -EINVAL);
    decode_free(&m);
    T_ASSERT(decode_load(&m, "tests/no-such-model", cap, 2, 16, err, sizeof err) < 0 && strstr(err, "no-such-model"));
    printf("target decode: errors: %s\n", err);
    float ties[4] = {1, 3, 3, 2};
    T_ASSERT(decode_argmax(ties, 4) == 1);
    free(tok), free(tok2), free(feat), free(lg);
    target_free(&ref);
    target_embeddings_free(&e);
}

/* ---- 2. drafter inference vs the training forward ----------------------------------- */

static void drafter_config(dflash_config *c, const hfconfig *t, int B, int sliding)
{
    memset(c, 0, sizeof *c);
    c->hidden = t->hidden_size, c->intermediate = 2 * t->hidden_size, c->n_layers = 2;
    c->n_heads = 4, c->n_kv_heads = 2, c->head_dim = t->hidden_size / 4, c->vocab = t->vocab_size;
    c->block_size = B, c->n_capture = 2, c->target_layer_ids[0] = 1, c->target_layer_ids[1] = 3;
    c->num_target_layers = t->num_hidden_layers, c->mask_token_id = 261, c->tie_word_embeddings = 1;
    c->sliding_window = 5, c->layer_sliding[1] = (uint8_t)sliding;
    c->max_position_embeddings = 1024, c->rms_norm_eps = 1e-6, c->rope_theta = 10000.0;
    c->gamma = dflash_default_gamma(B);
    char err[256];
    T_ASSERT_RC(dflash_config_validate(c, err, sizeof err));
}

static void test_drafter_infer(decode_model *t)
{
    dflash_config c;
    drafter_config(&c, &t->tm.cfg, 6, 1);
    dflash_params p;
    T_ASSERT_RC(dflash_params_alloc(&p, &c));
    dflash_params_init_random(&p, &c, df_rng_next(&rng), 0.08f);
    dflash_frozen f = {.embed = t->head.embed, .lm_head = t->head.lm_head};
    int S = rnd(20, 60), nin = c.n_capture * c.hidden, d = c.hidden, B = c.block_size, V = c.vocab;
    float *H = malloc(sizeof(float) * (size_t)S * nin);
    int32_t *x = malloc(sizeof(int32_t) * S);
    uint8_t *lm = malloc((size_t)S);
    T_ASSERT(H && x && lm);
    for (long i = 0; i < (long)S * nin; i++)
        H[i] = (float)df_rng_normal(&rng);
    for (int i = 0; i < S; i++)
        x[i] = rnd(0, 255), lm[i] = 1;
    int32_t anchors[3] = {0, rnd(1, S - 2), S - 1};
    uint8_t keep[3] = {1, 1, 1};
    dflash_batch b;
    dflash_acts a = {0};
    T_ASSERT_RC(dflash_batch_init(&b, &c, S, 3, H, x, lm, 1, 1));
    T_ASSERT_RC(dflash_batch_set_anchors(&b, &c, anchors, keep, 3));
    T_ASSERT_RC(dflash_forward(&c, &p, &f, &b, &a));
    infer_state s;
    T_ASSERT_RC(infer_init(&s, &c, &p, &f, S));
    float *lg = malloc(sizeof(float) * (size_t)(B - 1) * V);
    T_ASSERT(lg);
    double worst_z = 0, worst_l = 0;
    for (int j = 0; j < 3; j++) {
        infer_reset(&s);
        for (int r = 0; r < anchors[j];) { /* the context: every row before the anchor */
            int k = rnd(1, 7);
            k = DF_MIN(k, anchors[j] - r); /* DF_MIN evaluates its arguments twice */
            T_ASSERT_RC(infer_append(&s, H + (size_t)r * nin, k));
            r += k;
        }
        T_ASSERT(s.n_ctx == anchors[j]);
        int32_t draft[16];
        T_ASSERT_RC(infer_draft(&s, x[anchors[j]], draft));
        const float *zr = a.z + (size_t)j * B * d;
        worst_z = fmax(worst_z, rel_err(s.z, zr, (size_t)B * d));
        nn_matmul(lg, zr + d, f.lm_head, NULL, B - 1, d, V);
        worst_l = fmax(worst_l, rel_err(s.logits, lg, (size_t)(B - 1) * V));
        for (int k = 1; k < B; k++)
            T_ASSERT(draft[k - 1] == decode_argmax(s.logits + (size_t)(k - 1) * V, V));
    }
    printf("drafter inference vs dflash_forward (anchors %d %d %d of %d, full + sliding layer, B=%d): z rel err "
           "%.2e, logits rel err %.2e\n",
           anchors[0], anchors[1], anchors[2], S, B, worst_z, worst_l);
    T_ASSERT(worst_z < 1e-5 && worst_l < 1e-5);
    T_ASSERT(infer_append(&s, H, S + 1) == -ENOSPC);
    T_ASSERT(infer_draft(&s, V, (int32_t[16]){0}) == -EINVAL);
    infer_free(&s);
    dflash_acts_free(&a);
    dflash_batch_free(&b);
    dflash_params_free(&p);
    free(H), free(x), free(lm), free(lg);
}

/* ---- 3. the loop with an oracle drafter ------------------------------------------------ */

typedef struct oracle {
    int B, n_prompt, n_ctx, feat_dim;
    const int32_t *ref; /* the plain greedy continuation, long enough */
    int n_ref;
    double corrupt; /* probability that a drafted token is wrong */
    df_rng r;
    float *feats; /* [cap, feat_dim] every row appended, in order */
    int cap;
} oracle;

static int or_reset(void *ctx)
{
    ((oracle *)ctx)->n_ctx = 0;
    return 0;
}

static int or_append(void *ctx, const float *f, int n)
{
    oracle *o = ctx;
    T_ASSERT(o->n_ctx + n <= o->cap);
    memcpy(o->feats + (size_t)o->n_ctx * o->feat_dim, f, sizeof(float) * (size_t)n * o->feat_dim);
    o->n_ctx += n;
    return 0;
}

static int or_draft(void *ctx, int32_t anchor, int32_t *draft)
{
    oracle *o = ctx;
    /* the anchor sits at position n_ctx; its block predicts positions n_ctx+1.. */
    int gen = o->n_ctx - o->n_prompt; /* index of the anchor in the output */
    T_ASSERT(gen >= 0 && gen < o->n_ref && o->ref[gen] == anchor);
    for (int k = 1; k < o->B; k++) {
        int i = gen + k;
        int32_t tok = i < o->n_ref ? o->ref[i] : 0;
        if (df_rng_uniform(&o->r) < o->corrupt)
            tok = (tok + 1 + (int32_t)df_rng_below(&o->r, 200)) % 256;
        draft[k - 1] = tok;
    }
    return 0;
}

/* spec_drafter.draft_batch over an array of oracles: each sequence's oracle drafts its
 * block (or_draft checks the anchor against that sequence's output, so a block handed to
 * the wrong sequence fails). */
/* A sequence's drafter in a queue (more prompts than sequences): the oracle of the prompt
 * spec_generate_batch assigns to it. */
typedef struct oracle_slot {
    oracle *prompts, *cur;
} oracle_slot;

static int os_assign(void *ctx, int prompt)
{
    oracle_slot *s = ctx;
    s->cur = &s->prompts[prompt];
    return 0;
}

static int os_reset(void *ctx)
{
    return or_reset(((oracle_slot *)ctx)->cur);
}

static int os_append(void *ctx, const float *f, int n)
{
    return or_append(((oracle_slot *)ctx)->cur, f, n);
}

static int os_draft(void *ctx, int32_t anchor, int32_t *draft)
{
    return or_draft(((oracle_slot *)ctx)->cur, anchor, draft);
}

static int or_draft_batch(void *bctx, int n, const int *seqs, const int32_t *anchors, int32_t *drafts)
{
    oracle *all = bctx;
    for (int j = 0; j < n; j++) {
        oracle *o = &all[seqs[j]];
        int rc = or_draft(o, anchors[j], drafts + (size_t)j * (size_t)(o->B - 1));
        if (rc < 0)
            return rc;
    }
    return 0;
}

static void test_oracle_loop(decode_model *t, target_model *ref_model, const int32_t *prompt, int n_prompt, int B,
                             double corrupt, int max_new)
{
    spec_target st;
    spec_target_cpu(&st, t);
    spec_opts long_o = {.max_new = max_new + B, .eos = -1}, o = {.max_new = max_new, .eos = -1};
    spec_result plain_long, plain, spec;
    T_ASSERT_RC(spec_generate_plain(&st, prompt, n_prompt, &long_o, &plain_long));
    T_ASSERT_RC(spec_generate_plain(&st, prompt, n_prompt, &o, &plain));
    oracle orc = {.B = B,
                  .n_prompt = n_prompt,
                  .feat_dim = st.feat_dim,
                  .ref = plain_long.tokens,
                  .n_ref = plain_long.n_tokens,
                  .corrupt = corrupt,
                  .cap = t->max_ctx};
    df_rng_seed(&orc.r, df_rng_next(&rng));
    orc.feats = malloc(sizeof(float) * (size_t)orc.cap * orc.feat_dim);
    T_ASSERT(orc.feats);
    spec_drafter dr = {.ctx = &orc, .block_size = B, .reset = or_reset, .append = or_append, .draft = or_draft};
    T_ASSERT_RC(spec_generate(&st, &dr, prompt, n_prompt, &o, &spec));
    T_ASSERT(spec.n_tokens == plain.n_tokens && plain.n_tokens == max_new);
    T_ASSERT(memcmp(spec.tokens, plain.tokens, sizeof(int32_t) * max_new) == 0);
    long sum = 0, steps = 0;
    for (int a = 1; a <= B; a++)
        sum += a * spec.hist[a], steps += spec.hist[a];
    T_ASSERT(spec.hist[0] == 0 && steps == spec.n_steps && sum == spec.accept_sum);
    if (corrupt == 0) { /* perfect drafts: every step yields B tokens */
        T_ASSERT(spec.hist[B] == spec.n_steps);
        T_ASSERT(spec.n_steps == (max_new - 1 + B - 1) / B);
    }
    /* the drafter context = the target's features of prompt + accepted output, in order */
    /* the last step may accept drafts past max_new: compare against the long plain run */
    int nrows = orc.n_ctx, S = n_prompt + plain_long.n_tokens;
    T_ASSERT(nrows >= n_prompt && nrows < S);
    int32_t *seq = malloc(sizeof(int32_t) * S), starts[2] = {0, S};
    int d = ref_model->cfg.hidden_size;
    float *allf = malloc(sizeof(float) * (size_t)S * 4 * d), *want = malloc(sizeof(float) * (size_t)S * 2 * d);
    T_ASSERT(seq && allf && want);
    memcpy(seq, prompt, sizeof(int32_t) * n_prompt);
    memcpy(seq + n_prompt, plain_long.tokens, sizeof(int32_t) * plain_long.n_tokens);
    T_ASSERT_RC(target_forward_cpu(ref_model, seq, starts, 1, allf));
    for (int i = 0; i < nrows; i++) { /* td capture order: layers 1, 3 */
        memcpy(want + ((size_t)i * 2) * d, allf + ((size_t)i * 4 + 1) * d, sizeof(float) * d);
        memcpy(want + ((size_t)i * 2 + 1) * d, allf + ((size_t)i * 4 + 3) * d, sizeof(float) * d);
    }
    double fe = rel_err(orc.feats, want, (size_t)nrows * 2 * d);
    printf("oracle drafter (corrupt %.2f, B=%d, %d new): lossless, tau %.2f over %d steps, hist", corrupt, B, max_new,
           spec_result_tau(&spec), spec.n_steps);
    for (int a = 1; a <= B; a++)
        printf(" %ld", spec.hist[a]);
    printf("; drafter context %d rows, features rel err %.2e\n", nrows, fe);
    T_ASSERT(fe < 1e-5);
    free(seq), free(allf), free(want), free(orc.feats);
    spec_result_free(&plain_long);
    spec_result_free(&plain);
    spec_result_free(&spec);
}

/* ---- 4/5. real prompts, random and release drafters -------------------------------------- */

static void lossless_on_prompts(const char *what, const char *drafter_dir, int random_seed, const prompts_list *pl,
                                int n, int max_new)
{
    char err[1024];
    dflash_config c;
    dflash_params p;
    T_ASSERT_RC(dflash_load_release(drafter_dir, &c, &p, err, sizeof err));
    if (random_seed >= 0)
        dflash_params_init_random(&p, &c, (uint64_t)random_seed, 0.02f);
    spec_backend be;
    if (spec_backend_open(&be, "cpu", TARGET, &c, &p, 1024 + max_new + c.block_size, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    spec_opts o = {.max_new = max_new, .eos = 257};
    double tau = 0;
    for (int i = 0; i < n && i < pl->n; i++) {
        spec_result a, b;
        T_ASSERT_RC(spec_generate_plain(&be.target, pl->p[i].tokens, pl->p[i].n, &o, &a));
        T_ASSERT_RC(spec_generate(&be.target, &be.drafter, pl->p[i].tokens, pl->p[i].n, &o, &b));
        T_ASSERT(a.n_tokens == b.n_tokens && memcmp(a.tokens, b.tokens, sizeof(int32_t) * a.n_tokens) == 0);
        double ti = spec_result_tau(&b);
        T_ASSERT(b.n_steps == 0 || (ti >= 1.0 && ti <= c.block_size));
        tau += ti / DF_MIN(n, pl->n);
        spec_result_free(&a);
        spec_result_free(&b);
    }
    printf("%s: %d held-out prompts, %d new tokens max: speculative == plain, tau %.3f\n", what, DF_MIN(n, pl->n),
           max_new, tau);
    spec_backend_close(&be);
    dflash_params_free(&p);
}

/* The PyTorch draft stored beside the release fixture (scripts/make_release_drafter.py):
 * our cached inference over the same features must give the same logits. */
static void release_reference(decode_model *t)
{
    char err[1024];
    safetensors_file f = {0};
    if (access(RELEASE_FIXTURE "/reference.safetensors", R_OK) != 0) {
        printf("SKIPPED one check: %s/reference.safetensors is absent\n", RELEASE_FIXTURE);
        return;
    }
    dflash_config c;
    dflash_params p;
    T_ASSERT_RC(dflash_load_release(RELEASE_FIXTURE, &c, &p, err, sizeof err));
    T_ASSERT_RC(safetensors_open(&f, RELEASE_FIXTURE "/reference.safetensors", err, sizeof err));
    const safetensors_tensor *tH = safetensors_find(&f, "H"), *tt = safetensors_find(&f, "tokens"),
                             *tl = safetensors_find(&f, "logits");
    T_ASSERT(tH && tt && tl && tH->ndim == 2 && tH->shape[1] == (int64_t)c.n_capture * c.hidden);
    int S = (int)tH->shape[0] - 1, B = c.block_size, V = c.vocab;
    T_ASSERT(tl->ndim == 2 && tl->shape[0] == B - 1 && tl->shape[1] == V && safetensors_numel(tt) == S + 1);
    float *H = malloc(sizeof(float) * (size_t)safetensors_numel(tH)), *tok = malloc(sizeof(float) * (S + 1));
    float *want = malloc(sizeof(float) * (size_t)safetensors_numel(tl));
    T_ASSERT(H && tok && want);
    T_ASSERT_RC(safetensors_tensor_to_f32(tH, H));
    T_ASSERT_RC(safetensors_tensor_to_f32(tt, tok));
    T_ASSERT_RC(safetensors_tensor_to_f32(tl, want));
    dflash_frozen fr = {.embed = t->head.embed, .lm_head = t->head.lm_head};
    infer_state s;
    int32_t draft[64];
    T_ASSERT(B <= 65);
    T_ASSERT_RC(infer_init(&s, &c, &p, &fr, S));
    T_ASSERT_RC(infer_append(&s, H, S));
    T_ASSERT_RC(infer_draft(&s, (int32_t)tok[S], draft));
    double e = rel_err(s.logits, want, (size_t)(B - 1) * V);
    int same = 0;
    for (int k = 0; k < B - 1; k++)
        same += draft[k] == decode_argmax(want + (size_t)k * V, V);
    printf("release fixture: draft over %d context rows vs PyTorch (float64): logits rel err %.2e, %d of %d greedy "
           "tokens equal\n",
           S, e, same, B - 1);
    T_ASSERT(e < 1e-4 && same == B - 1);
    infer_free(&s);
    safetensors_close(&f);
    dflash_params_free(&p);
    free(H), free(tok), free(want);
}

/* ---- 6. batches ------------------------------------------------------------------------ */

/* decode_extend_batch against decode_extend of each sequence alone: bit-identical rows. */
static void batch_rows_exact(const prompts_list *pl)
{
    char err[1024];
    int cap[2] = {1, 3}, NS = 4;
    decode_model one, many;
    T_ASSERT_RC(decode_load(&one, TARGET, cap, 2, 512, err, sizeof err));
    T_ASSERT_RC(decode_load_batch(&many, TARGET, cap, 2, 512, NS, err, sizeof err));
    int V = one.tm.cfg.vocab_size, fd = 2 * one.tm.cfg.hidden_size;
    /* sequence s: prompt s (s < 3), sequence 3 never used (sits out) */
    for (int s = 0; s < 3; s++)
        T_ASSERT_RC(decode_extend_seq(&many, s, pl->p[s].tokens, pl->p[s].n, 1));
    int32_t toks[64];
    for (int step = 0; step < 3; step++) {
        int ks[4] = {1 + step, step == 1 ? 0 : 3, 5 - step, 0}, R = 0;
        for (int i = 0; i < 64; i++)
            toks[i] = rnd(0, 255);
        for (int s = 0; s < NS; s++)
            R += ks[s];
        int lens[4];
        for (int s = 0; s < NS; s++)
            lens[s] = decode_seq_len(&many, s);
        T_ASSERT_RC(decode_extend_batch(&many, toks, ks));
        float *lg = malloc(sizeof(float) * (size_t)R * V), *ft = malloc(sizeof(float) * (size_t)R * fd);
        T_ASSERT(lg && ft);
        memcpy(lg, many.logits, sizeof(float) * (size_t)R * V);
        memcpy(ft, many.feat, sizeof(float) * (size_t)R * fd);
        for (int s = 0, row = 0; s < NS; row += ks[s], s++) {
            T_ASSERT(decode_seq_len(&many, s) == lens[s] + ks[s]);
            if (!ks[s])
                continue;
            /* the same sequence alone: its prompt, then this block */
            decode_reset(&one);
            T_ASSERT_RC(decode_extend(&one, pl->p[s].tokens, pl->p[s].n, 1));
            T_ASSERT(one.len == lens[s]); /* every step starts from the prompt (truncated below) */
            T_ASSERT_RC(decode_extend(&one, toks + row, ks[s], ks[s]));
            T_ASSERT(memcmp(one.logits, lg + (size_t)row * V, sizeof(float) * (size_t)ks[s] * V) == 0);
            T_ASSERT(memcmp(one.feat, ft + (size_t)row * fd, sizeof(float) * (size_t)ks[s] * fd) == 0);
        }
        /* keep the sequences at their prompt so the lone replay stays one prefill */
        for (int s = 0; s < 3; s++)
            T_ASSERT_RC(decode_truncate_seq(&many, s, pl->p[s].n));
        free(lg), free(ft);
    }
    int bad[4] = {1, -1, 0, 0};
    T_ASSERT(decode_extend_batch(&many, toks, bad) == -EINVAL);
    int none[4] = {0, 0, 0, 0};
    T_ASSERT(decode_extend_batch(&many, toks, none) == -EINVAL);
    int over[4] = {0, 0, 0, 513};
    T_ASSERT(decode_extend_batch(&many, toks, over) == -ENOSPC && decode_seq_len(&many, 3) == 0);
    printf("batch rows: 3 steps of 4 sequences (one sitting out, rows 1..5 each): features and logits bit-identical to "
           "each sequence alone\n");
    decode_free(&one);
    decode_free(&many);
    T_ASSERT(decode_load_batch(&one, TARGET, cap, 2, 16, 0, err, sizeof err) == -EINVAL && strstr(err, "sequences"));
}

/* spec_generate_batch, plain and speculative, against spec_generate_plain per prompt. */
static void batch_lossless(const char *drafter_dir, const prompts_list *pl, int max_new)
{
    char err[1024];
    dflash_config c;
    dflash_params p;
    T_ASSERT_RC(dflash_load_release(drafter_dir, &c, &p, err, sizeof err));
    int n = 3, NS = 4, max_ctx = 1024 + max_new + c.block_size;
    spec_backend one, many;
    T_ASSERT_RC(spec_backend_open(&one, "cpu", TARGET, &c, &p, max_ctx, err, sizeof err));
    T_ASSERT_RC(spec_backend_open_batch(&many, "cpu", TARGET, &c, &p, max_ctx, NS, err, sizeof err));
    T_ASSERT(many.n_seq == NS && many.target.n_seq == NS);
    /* an eos that prompt 1 reaches early: a token of its plain output a third of the way in */
    spec_opts free_run = {.max_new = max_new, .eos = -1};
    spec_result ref[3], bp[3], bs[3];
    const int32_t *pr[3];
    int np[3], early = 0, full = 0;
    for (int i = 0; i < n; i++)
        pr[i] = pl->p[i].tokens, np[i] = pl->p[i].n - 17 * i; /* prefixes of different lengths */
    /* eos: a token that one prompt's free-running output has (from position 4 on) and
     * another's never produces, so one prompt stops early and another runs to max_new */
    for (int i = 0; i < n; i++)
        T_ASSERT_RC(spec_generate_plain(&one.target, pr[i], np[i], &free_run, &ref[i]));
    spec_opts o = {.max_new = max_new, .eos = -1};
    for (int a = 0; a < n && o.eos < 0; a++)
        for (int b = 0; b < n && o.eos < 0; b++)
            for (int j = 4; a != b && j < max_new && o.eos < 0; j++) {
                int seen = 0;
                for (int k = 0; k < max_new; k++)
                    seen |= ref[b].tokens[k] == ref[a].tokens[j];
                if (!seen)
                    o.eos = ref[a].tokens[j];
            }
    T_ASSERT(o.eos >= 0);
    for (int i = 0; i < n; i++)
        spec_result_free(&ref[i]);
    for (int i = 0; i < n; i++) {
        T_ASSERT_RC(spec_generate_plain(&one.target, pr[i], np[i], &o, &ref[i]));
        early += ref[i].n_tokens < max_new, full += ref[i].n_tokens == max_new;
    }
    T_ASSERT(np[0] != np[1] && np[1] != np[2] && np[0] != np[2]);
    T_ASSERT(early >= 1 && full >= 1);
    double wall_p, wall_s;
    T_ASSERT_RC(spec_generate_batch(&many.target, NULL, n, pr, np, &o, bp, &wall_p));
    T_ASSERT_RC(spec_generate_batch(&many.target, many.drafters, n, pr, np, &o, bs, &wall_s));
    for (int i = 0; i < n; i++) {
        T_ASSERT(bp[i].n_tokens == ref[i].n_tokens &&
                 !memcmp(bp[i].tokens, ref[i].tokens, sizeof(int32_t) * ref[i].n_tokens));
        T_ASSERT(bs[i].n_tokens == ref[i].n_tokens &&
                 !memcmp(bs[i].tokens, ref[i].tokens, sizeof(int32_t) * ref[i].n_tokens));
        T_ASSERT(bp[i].n_steps == ref[i].n_tokens - 1 && bp[i].block_size == 1);
        long steps = 0, sum = 0;
        for (int a = 1; a <= c.block_size; a++)
            steps += bs[i].hist[a], sum += a * bs[i].hist[a];
        T_ASSERT(steps == bs[i].n_steps && sum == bs[i].accept_sum && bs[i].hist[0] == 0);
    }
    /* the batched drafters score like the lone one: same tokens, same drafts, same tau */
    spec_result lone;
    T_ASSERT_RC(spec_generate(&one.target, &one.drafter, pr[2], np[2], &o, &lone));
    T_ASSERT(lone.n_steps == bs[2].n_steps && lone.accept_sum == bs[2].accept_sum);
    for (int k = 0; k < c.block_size; k++)
        T_ASSERT(lone.pos_hit[k] == bs[2].pos_hit[k] && lone.pos_n[k] == bs[2].pos_n[k]);
    spec_result_free(&lone);
    /* a second batch on the same backend (fresh caches per prompt) and a too-large one */
    spec_result again[2];
    T_ASSERT_RC(spec_generate_batch(&many.target, many.drafters, 2, pr + 1, np + 1, &o, again, NULL));
    for (int i = 0; i < 2; i++)
        T_ASSERT(again[i].n_tokens == ref[i + 1].n_tokens &&
                 !memcmp(again[i].tokens, ref[i + 1].tokens, sizeof(int32_t) * ref[i + 1].n_tokens));
    /* a queue: the 3 prompts through 2 sequences (the third waits for the first to finish,
     * then is prefilled into its sequence): the same tokens, and the same drafts as above */
    spec_backend two;
    T_ASSERT_RC(spec_backend_open_batch(&two, "cpu", TARGET, &c, &p, max_ctx, 2, err, sizeof err));
    spec_result qp[3], qs[3];
    T_ASSERT_RC(spec_generate_batch(&two.target, NULL, n, pr, np, &o, qp, NULL));
    T_ASSERT_RC(spec_generate_batch(&two.target, two.drafters, n, pr, np, &o, qs, NULL));
    for (int i = 0; i < n; i++) {
        T_ASSERT(qp[i].n_tokens == ref[i].n_tokens &&
                 !memcmp(qp[i].tokens, ref[i].tokens, sizeof(int32_t) * ref[i].n_tokens));
        T_ASSERT(qs[i].n_tokens == ref[i].n_tokens &&
                 !memcmp(qs[i].tokens, ref[i].tokens, sizeof(int32_t) * ref[i].n_tokens));
        T_ASSERT(qs[i].n_steps == bs[i].n_steps && qs[i].accept_sum == bs[i].accept_sum);
        T_ASSERT(qp[i].prefill_s > 0 && qs[i].prefill_s > 0);
        spec_result_free(&qp[i]), spec_result_free(&qs[i]);
    }
    /* a queue whose prompts all end at their first token (max_new 1): no step at all */
    spec_opts one_tok = {.max_new = 1, .eos = -1};
    T_ASSERT_RC(spec_generate_batch(&two.target, two.drafters, n, pr, np, &one_tok, qs, NULL));
    for (int i = 0; i < n; i++) {
        T_ASSERT(qs[i].n_tokens == 1 && qs[i].tokens[0] == ref[i].tokens[0] && qs[i].n_steps == 0 &&
                 qs[i].batch_steps == 0);
        spec_result_free(&qs[i]);
    }
    /* a queue whose last prompt does not fit the cache: -ENOSPC when it is admitted, and
     * nothing left allocated (the leak checks of the sanitizer builds) */
    const int32_t *lpr[3] = {pr[0], pr[1], pr[2]};
    int lnp[3] = {np[0], np[1], max_ctx};
    T_ASSERT(spec_generate_batch(&two.target, two.drafters, n, lpr, lnp, &o, qs, NULL) == -ENOSPC);
    T_ASSERT(spec_generate_batch(&many.target, many.drafters, 0, pr, np, &o, again, NULL) == -EINVAL);
    /* oracle drafters (seeded corruption: acceptance lengths differ per sequence and step)
     * against the same oracle alone: same tokens, histogram and drafter context rows */
    oracle orc[3], lone_orc[3];
    spec_drafter odr[3];
    spec_result lr[3], br[3];
    spec_opts lo = {.max_new = max_new + c.block_size, .eos = -1};
    uint64_t oseed = df_rng_next(&rng);
    for (int i = 0; i < n; i++) {
        spec_result lp;
        T_ASSERT_RC(spec_generate_plain(&one.target, pr[i], np[i], &lo, &lp));
        for (int twin = 0; twin < 2; twin++) {
            oracle *q = twin ? &lone_orc[i] : &orc[i];
            *q = (oracle){.B = c.block_size,
                          .n_prompt = np[i],
                          .feat_dim = one.target.feat_dim,
                          .n_ref = lp.n_tokens,
                          .corrupt = 0.1 + 0.2 * i,
                          .cap = max_ctx};
            q->ref = malloc(sizeof(int32_t) * (size_t)lp.n_tokens);
            q->feats = malloc(sizeof(float) * (size_t)max_ctx * q->feat_dim);
            T_ASSERT(q->ref && q->feats);
            memcpy((int32_t *)q->ref, lp.tokens, sizeof(int32_t) * (size_t)lp.n_tokens);
            df_rng_seed(&q->r, oseed + (uint64_t)i);
        }
        odr[i] = (spec_drafter){
            .ctx = &orc[i], .block_size = c.block_size, .reset = or_reset, .append = or_append, .draft = or_draft};
        spec_drafter ld = odr[i];
        ld.ctx = &lone_orc[i];
        T_ASSERT_RC(spec_generate(&one.target, &ld, pr[i], np[i], &o, &lr[i]));
        spec_result_free(&lp);
    }
    /* three times: the drafts one sequence after the other, then through draft_batch (the
     * running sequences' blocks in one call, as the CUDA backend drafts them), then as a
     * queue of the 3 prompts through 2 sequences (each sequence's drafter told its prompt) */
    double otau = 0;
    oracle_slot oslot[2] = {{orc, NULL}, {orc, NULL}};
    spec_drafter sdr[2];
    for (int k = 0; k < 2; k++)
        sdr[k] = (spec_drafter){.ctx = &oslot[k],
                                .block_size = c.block_size,
                                .reset = os_reset,
                                .append = os_append,
                                .draft = os_draft,
                                .assign = os_assign};
    for (int mode = 0; mode < 3; mode++) {
        for (int i = 0; i < n; i++) {
            df_rng_seed(&orc[i].r, oseed + (uint64_t)i);
            odr[i].batch_ctx = mode == 1 ? orc : NULL;
            odr[i].draft_batch = mode == 1 ? or_draft_batch : NULL;
        }
        T_ASSERT_RC(spec_generate_batch(mode == 2 ? &two.target : &many.target, mode == 2 ? sdr : odr, n, pr, np, &o,
                                        br, NULL));
        for (int i = 0; i < n; i++) {
            T_ASSERT(br[i].n_tokens == ref[i].n_tokens &&
                     !memcmp(br[i].tokens, ref[i].tokens, sizeof(int32_t) * ref[i].n_tokens));
            T_ASSERT(lr[i].n_steps == br[i].n_steps && lr[i].accept_sum == br[i].accept_sum);
            for (int a = 0; a <= c.block_size; a++)
                T_ASSERT(lr[i].hist[a] == br[i].hist[a]);
            T_ASSERT(orc[i].n_ctx == lone_orc[i].n_ctx &&
                     !memcmp(orc[i].feats, lone_orc[i].feats, sizeof(float) * (size_t)orc[i].n_ctx * orc[i].feat_dim));
            otau += spec_result_tau(&br[i]) / n / 3;
            spec_result_free(&br[i]);
        }
    }
    spec_backend_close(&two);
    for (int i = 0; i < n; i++) {
        spec_result_free(&lr[i]);
        for (int twin = 0; twin < 2; twin++) {
            oracle *q = twin ? &lone_orc[i] : &orc[i];
            free((int32_t *)q->ref), free(q->feats);
        }
    }
    printf(
        "batch with oracle drafters (corrupt 0.1 / 0.3 / 0.5), drafting one after the other, through draft_batch and "
        "as a queue of 3 prompts through 2 sequences: tokens, acceptance histograms and drafter context rows == each "
        "alone, mean tau %.2f\n",
        otau);
    printf("batch of %d prompts (%d, %d, %d tokens; eos %d: %d, %d, %d new tokens), and the same as a queue through 2 "
           "sequences: plain and speculative == each alone, tau %.2f / %.2f / %.2f\n",
           n, np[0], np[1], np[2], o.eos, ref[0].n_tokens, ref[1].n_tokens, ref[2].n_tokens, spec_result_tau(&bs[0]),
           spec_result_tau(&bs[1]), spec_result_tau(&bs[2]));
    for (int i = 0; i < n; i++) {
        spec_result_free(&ref[i]);
        spec_result_free(&bp[i]);
        spec_result_free(&bs[i]);
    }
    for (int i = 0; i < 2; i++)
        spec_result_free(&again[i]);
    spec_backend_close(&one);
    T_ASSERT(spec_backend_open_batch(&one, "cpu", TARGET, &c, &p, max_ctx, 0, err, sizeof err) == -EINVAL);
    spec_backend_close(&many);
    dflash_params_free(&p);
}

int main(void)
{
    const char *env = getenv("SPEC_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    printf("seed %llu (SPEC_SEED=%llu replays it)\n", (unsigned long long)seed, (unsigned long long)seed);
    df_rng_seed(&rng, seed);
    if (access(TARGET "/model.safetensors", R_OK) != 0)
        T_SKIP("%s is missing (run from the repository root)", TARGET);

    test_target_decode();

    char err[1024];
    int cap[2] = {1, 3}, all[4] = {0, 1, 2, 3};
    decode_model t;
    target_model ref;
    T_ASSERT_RC(decode_load(&t, TARGET, cap, 2, 1200, err, sizeof err));
    T_ASSERT_RC(target_load(&ref, TARGET, all, 4, err, sizeof err));
    test_drafter_infer(&t);

    /* prompts: the JSONL and the shard made from it agree */
    prompts_list pj = {0}, ps = {0};
    T_ASSERT_RC(prompts_load(&pj, "data/tiny/chat-heldout.jsonl", TARGET, 264, 6, 1024, err, sizeof err));
    T_ASSERT_RC(prompts_load(&ps, "data/tiny/heldout-000.dfs", TARGET, 264, 6, 1024, err, sizeof err));
    T_ASSERT(pj.n == 6 && ps.n == 6);
    for (int i = 0; i < 6; i++)
        T_ASSERT(pj.p[i].n == ps.p[i].n && !memcmp(pj.p[i].tokens, ps.p[i].tokens, sizeof(int32_t) * pj.p[i].n));
    int lo = pj.p[0].n, hi = pj.p[0].n;
    for (int i = 1; i < 6; i++)
        lo = DF_MIN(lo, pj.p[i].n), hi = DF_MAX(hi, pj.p[i].n);
    printf("prompts: the first 6 of chat-heldout.jsonl equal those of heldout-000.dfs (%d..%d tokens)\n", lo, hi);

    test_oracle_loop(&t, &ref, pj.p[0].tokens, pj.p[0].n, 8, 0.0, 41);
    test_oracle_loop(&t, &ref, pj.p[1].tokens, pj.p[1].n, 16, 0.15, 60);
    test_oracle_loop(&t, &ref, pj.p[2].tokens, pj.p[2].n, 5, 0.5, 37);

    /* a random drafter of the make-run shape, through the release format */
    dflash_config c;
    drafter_config(&c, &t.tm.cfg, 16, 0);
    c.n_layers = 1, c.intermediate = 3 * c.hidden;
    dflash_params p;
    T_ASSERT_RC(dflash_params_alloc(&p, &c));
    dflash_params_init_random(&p, &c, 7, 0.02f);
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/test_spec_decode.%d", (int)getpid());
    T_ASSERT_RC(dflash_export_release(dir, &c, &p, err, sizeof err));
    dflash_params_free(&p);
    lossless_on_prompts("random drafter (release format)", dir, -1, &pj, 3, 48);
    batch_rows_exact(&pj);
    batch_lossless(dir, &pj, 48);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    T_ASSERT(system(cmd) == 0);

    if (access(RELEASE_FIXTURE "/config.json", R_OK) == 0) {
        lossless_on_prompts("public release-format drafter " RELEASE_FIXTURE, RELEASE_FIXTURE, -1, &pj, 2, 48);
        release_reference(&t);
    } else
        printf("SKIPPED one check: %s is absent (make it with scripts/make_release_drafter.py, needs torch + "
               "transformers)\n",
               RELEASE_FIXTURE);

    prompts_free(&pj);
    prompts_free(&ps);
    target_free(&ref);
    decode_free(&t);
    printf("ok\n");
    return 0;
}
