/* spec_decode.c: the plain and the speculative greedy loops (see spec_decode.h) and the
 * CPU adapters that plug target_decode and dflash_infer into them. */
#include "eval/spec_decode.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "eval/dflash_infer.h"
#include "target/target_decode.h"
#include "util.h"

void spec_result_free(spec_result *r)
{
    if (!r)
        return;
    free(r->tokens);
    free(r->hist);
    free(r->pos_hit);
    free(r->pos_n);
    memset(r, 0, sizeof *r);
}

double spec_result_tau(const spec_result *r)
{
    return r->n_steps ? (double)r->accept_sum / r->n_steps : 0.0;
}

static int result_init(spec_result *r, const spec_opts *o, int block_size)
{
    memset(r, 0, sizeof *r);
    if (o->max_new < 1 || block_size < 1)
        return -EINVAL;
    r->tokens = malloc(sizeof(int32_t) * (size_t)o->max_new);
    r->hist = calloc((size_t)block_size + 1, sizeof(long));
    r->pos_hit = calloc((size_t)block_size, sizeof(long));
    r->pos_n = calloc((size_t)block_size, sizeof(long));
    if (!r->tokens || !r->hist || !r->pos_hit || !r->pos_n) {
        spec_result_free(r);
        return -ENOMEM;
    }
    r->block_size = block_size;
    return 0;
}

/* Append tok; 1 when the generation is complete (max_new reached or tok is eos). */
static int emit(spec_result *r, const spec_opts *o, int32_t tok)
{
    r->tokens[r->n_tokens++] = tok;
    return r->n_tokens >= o->max_new || (o->eos >= 0 && tok == o->eos);
}

/* Prefill: prompt through the target (features to the drafter when there is one), the
 * first new token from the last prompt position. 1 when that already ends it. */
static int prefill(spec_target *t, spec_drafter *dr, const int32_t *prompt, int n_prompt, const spec_opts *o,
                   spec_result *r, int *rc)
{
    uint64_t t0 = df_now_ns();
    int32_t first;
    const float *feats = NULL;
    if (n_prompt < 1) {
        *rc = -EINVAL;
        return 1;
    }
    if (n_prompt + o->max_new + r->block_size > t->max_ctx) {
        *rc = -ENOSPC; /* the cache would overflow mid-generation */
        return 1;
    }
    if ((*rc = t->reset(t->ctx)) < 0 || (*rc = t->extend(t->ctx, prompt, n_prompt, 1, &first, &feats)) < 0)
        return 1;
    if (dr && ((*rc = dr->reset(dr->ctx)) < 0 || (*rc = dr->append(dr->ctx, feats, n_prompt)) < 0))
        return 1;
    int done = emit(r, o, first);
    r->prefill_s = (double)(df_now_ns() - t0) * 1e-9;
    return done;
}

int spec_generate_plain(spec_target *t, const int32_t *prompt, int n_prompt, const spec_opts *o, spec_result *r)
{
    int rc = result_init(r, o, 1);
    if (rc < 0)
        return rc;
    int done = prefill(t, NULL, prompt, n_prompt, o, r, &rc);
    uint64_t t0 = df_now_ns();
    while (!done && rc == 0) {
        int32_t last = r->tokens[r->n_tokens - 1], next;
        const float *feats;
        if ((rc = t->extend(t->ctx, &last, 1, 1, &next, &feats)) < 0)
            break;
        r->n_steps++;
        r->accept_sum++;
        r->hist[1]++;
        done = emit(r, o, next);
    }
    r->decode_s = (double)(df_now_ns() - t0) * 1e-9;
    if (rc < 0)
        spec_result_free(r);
    return rc;
}

int spec_generate(spec_target *t, spec_drafter *dr, const int32_t *prompt, int n_prompt, const spec_opts *o,
                  spec_result *r)
{
    int B = dr->block_size;
    int rc = result_init(r, o, B);
    if (rc < 0)
        return rc;
    int32_t *block = malloc(sizeof(int32_t) * (size_t)B);
    int32_t *next = malloc(sizeof(int32_t) * (size_t)B);
    /* every step's drafts and anchor index, scored against the output at the end */
    int32_t *drafts = malloc(sizeof(int32_t) * (size_t)o->max_new * (size_t)(B - 1 > 0 ? B - 1 : 1));
    int *anchor_at = malloc(sizeof(int) * (size_t)o->max_new);
    if (!block || !next || !drafts || !anchor_at) {
        free(block), free(next), free(drafts), free(anchor_at);
        spec_result_free(r);
        return -ENOMEM;
    }
    int done = prefill(t, dr, prompt, n_prompt, o, r, &rc);
    uint64_t t0 = df_now_ns();
    while (!done && rc == 0) {
        /* tokens so far n = n_prompt + n_tokens; cache and context hold n-1 rows */
        int cached = n_prompt + r->n_tokens - 1;
        block[0] = r->tokens[r->n_tokens - 1];
        uint64_t ta = df_now_ns();
        if ((rc = dr->draft(dr->ctx, block[0], block + 1)) < 0)
            break;
        uint64_t tb = df_now_ns();
        anchor_at[r->n_steps] = r->n_tokens - 1; /* n_steps < max_new: each step emits >= 1 */
        memcpy(drafts + (size_t)r->n_steps * (size_t)(B - 1), block + 1, sizeof(int32_t) * (size_t)(B - 1));
        const float *feats;
        if ((rc = t->extend(t->ctx, block, B, B, next, &feats)) < 0)
            break;
        uint64_t tc = df_now_ns();
        int m = 0;
        while (m < B - 1 && block[m + 1] == next[m])
            m++;
        /* keep the anchor and the m accepted drafts; the rest of the block is dropped */
        if ((rc = t->truncate(t->ctx, cached + m + 1)) < 0 || (rc = dr->append(dr->ctx, feats, m + 1)) < 0)
            break;
        uint64_t td = df_now_ns();
        r->draft_s += (double)(tb - ta) * 1e-9;
        r->verify_s += (double)(tc - tb) * 1e-9;
        r->accept_s += (double)(td - tc) * 1e-9;
        r->n_steps++;
        r->accept_sum += m + 1;
        r->hist[m + 1]++;
        for (int k = 1; k <= m && !done; k++)
            done = emit(r, o, block[k]);
        if (!done)
            done = emit(r, o, next[m]); /* the bonus: the target's own token after the accepted ones */
    }
    r->decode_s = (double)(df_now_ns() - t0) * 1e-9;
    for (int s = 0; rc == 0 && s < r->n_steps; s++)
        for (int k = 1; k < B && anchor_at[s] + k < r->n_tokens; k++) {
            r->pos_n[k]++;
            r->pos_hit[k] += drafts[(size_t)s * (size_t)(B - 1) + (size_t)(k - 1)] == r->tokens[anchor_at[s] + k];
        }
    free(block), free(next), free(drafts), free(anchor_at);
    if (rc < 0)
        spec_result_free(r);
    return rc;
}

/* Per-prompt state of spec_generate_batch. */
typedef struct batch_seq {
    const int32_t *prompt;
    int n_prompt, done;
    int32_t *drafts; /* [max_new, B-1] every step's drafts, scored at the end */
    int *anchor_at;  /* [max_new] */
} batch_seq;

/* The queue of spec_generate_batch: prompts wait in order for a free sequence (slot). */
typedef struct batch_queue {
    spec_target *t;
    spec_drafter *drs; /* one per slot, or NULL (plain) */
    const spec_opts *o;
    int B, n, next; /* prompts, the next one to admit */
    batch_seq *sq;
    spec_result *r;
    int *in_slot; /* [slots]: the prompt a slot decodes, -1: free */
} batch_queue;

/* Prefill prompts into free slot s until one is still running after its first token (or
 * the queue is empty): the call a lone generation makes, on sequence s. 0 or -errno. */
static int queue_admit(batch_queue *q, int s)
{
    q->in_slot[s] = -1;
    while (q->next < q->n) {
        int p = q->next++;
        uint64_t t0 = df_now_ns();
        batch_seq *b = &q->sq[p];
        spec_drafter *dr = q->drs ? &q->drs[s] : NULL;
        int32_t first;
        const float *feats = NULL;
        int rc;
        if (b->n_prompt < 1)
            return -EINVAL;
        if (b->n_prompt + q->o->max_new + q->B > q->t->max_ctx)
            return -ENOSPC;
        if ((rc = q->t->reset_seq(q->t->ctx, s)) < 0 ||
            (rc = q->t->extend_seq(q->t->ctx, s, b->prompt, b->n_prompt, 1, &first, &feats)) < 0)
            return rc;
        if (dr && ((dr->assign && (rc = dr->assign(dr->ctx, p)) < 0) || (rc = dr->reset(dr->ctx)) < 0 ||
                   (rc = dr->append(dr->ctx, feats, b->n_prompt)) < 0))
            return rc;
        b->done = emit(&q->r[p], q->o, first);
        q->r[p].prefill_s = (double)(df_now_ns() - t0) * 1e-9;
        if (!b->done) {
            q->in_slot[s] = p;
            return 0;
        }
    }
    return 0;
}

int spec_generate_batch(spec_target *t, spec_drafter *drs, int n, const int32_t *const *prompts, const int *n_prompt,
                        const spec_opts *o, spec_result *r, double *wall_s)
{
    int B = drs ? drs[0].block_size : 1, rc = 0;
    if (n < 1 || t->n_seq < 1 || !t->extend_batch || !t->extend_seq || !t->reset_seq || !t->truncate_seq)
        return -EINVAL;
    const int S = n < t->n_seq ? n : t->n_seq; /* slots: sequences of t in use */
    for (int s = 0; s < S; s++)
        if (drs && drs[s].block_size != B)
            return -EINVAL;
    uint64_t t_start = df_now_ns();
    batch_seq *sq = calloc((size_t)n, sizeof *sq);
    int *ks = calloc((size_t)t->n_seq, sizeof(int)), *in_slot = malloc(sizeof(int) * (size_t)S);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)S * (size_t)B), *next = malloc(sizeof(int32_t) * (size_t)S * B);
    int *run = malloc(sizeof(int) * (size_t)S);
    int32_t *anc = malloc(sizeof(int32_t) * (size_t)S), *dft = malloc(sizeof(int32_t) * (size_t)S * (size_t)B);
    int n_init = 0;
    if (!sq || !ks || !in_slot || !tok || !next || !run || !anc || !dft) {
        rc = -ENOMEM;
        goto out;
    }
    for (; n_init < n; n_init++) {
        if ((rc = result_init(&r[n_init], o, B)) < 0)
            goto out;
        batch_seq *q = &sq[n_init];
        q->prompt = prompts[n_init], q->n_prompt = n_prompt[n_init];
        q->drafts = malloc(sizeof(int32_t) * (size_t)o->max_new * (size_t)(B > 1 ? B - 1 : 1));
        q->anchor_at = malloc(sizeof(int) * (size_t)o->max_new);
        if (!q->drafts || !q->anchor_at) {
            n_init++;
            rc = -ENOMEM;
            goto out;
        }
    }
    batch_queue qu = {.t = t, .drs = drs, .o = o, .B = B, .n = n, .next = 0, .sq = sq, .r = r, .in_slot = in_slot};
    /* the first prompts, one per slot, each prefilled alone */
    for (int s = 0; s < S; s++)
        if ((rc = queue_admit(&qu, s)) < 0)
            goto out;
    uint64_t t0 = df_now_ns();
    double draft_s = 0, verify_s = 0, accept_s = 0, admit_s = 0;
    long n_batch_steps = 0;
    for (;;) {
        /* the block of every running slot: [last, drafts] (plain: [last]) */
        int R = 0, running = 0;
        uint64_t ta = df_now_ns();
        for (int i = 0; i < t->n_seq; i++)
            ks[i] = 0;
        for (int s = 0; s < S; s++)
            if (in_slot[s] >= 0) {
                spec_result *ri = &r[in_slot[s]];
                run[running] = s, anc[running++] = ri->tokens[ri->n_tokens - 1];
            }
        if (!running)
            break;
        if (drs && drs[0].draft_batch) { /* every running slot's block in one call */
            if ((rc = drs[0].draft_batch(drs[0].batch_ctx, running, run, anc, dft)) < 0)
                goto out;
        } else {
            for (int j = 0; drs && j < running; j++)
                if ((rc = drs[run[j]].draft(drs[run[j]].ctx, anc[j], dft + (size_t)j * (size_t)(B - 1))) < 0)
                    goto out;
        }
        for (int j = 0; j < running; j++) {
            int s = run[j], p = in_slot[s];
            int32_t *blk = tok + R;
            blk[0] = anc[j];
            if (drs) {
                memcpy(blk + 1, dft + (size_t)j * (size_t)(B - 1), sizeof(int32_t) * (size_t)(B - 1));
                sq[p].anchor_at[r[p].n_steps] = r[p].n_tokens - 1;
                memcpy(sq[p].drafts + (size_t)r[p].n_steps * (size_t)(B - 1), blk + 1,
                       sizeof(int32_t) * (size_t)(B - 1));
            }
            ks[s] = B;
            R += B;
        }
        uint64_t tb = df_now_ns();
        const float *feats;
        if ((rc = t->extend_batch(t->ctx, tok, ks, next, &feats)) < 0)
            goto out;
        uint64_t tc = df_now_ns();
        int freed = 0;
        for (int s = 0, row = 0; s < S; s++) {
            if (!ks[s])
                continue;
            int p = in_slot[s];
            const int32_t *blk = tok + row, *nx = next + row;
            int cached = sq[p].n_prompt + r[p].n_tokens - 1, m = 0;
            while (m < B - 1 && blk[m + 1] == nx[m])
                m++;
            /* keep the anchor and the m accepted drafts */
            if (drs) {
                const float *f = (const float *)(const void *)((const char *)feats + (size_t)row * t->feat_row_bytes);
                if ((rc = t->truncate_seq(t->ctx, s, cached + m + 1)) < 0 ||
                    (rc = drs[s].append(drs[s].ctx, f, m + 1)) < 0)
                    goto out;
            }
            r[p].n_steps++;
            r[p].accept_sum += m + 1;
            r[p].hist[m + 1]++;
            for (int k = 1; k <= m && !sq[p].done; k++)
                sq[p].done = emit(&r[p], o, blk[k]);
            if (!sq[p].done)
                sq[p].done = emit(&r[p], o, nx[m]);
            freed += sq[p].done;
            row += B;
        }
        uint64_t td = df_now_ns();
        /* finished prompts give their slots to the next ones in the queue (after every slot
         * has used this step's features: a prefill replaces them) */
        for (int s = 0; freed && s < S; s++)
            if (ks[s] && sq[in_slot[s]].done && (rc = queue_admit(&qu, s)) < 0)
                goto out;
        uint64_t te = df_now_ns();
        draft_s += (double)(tb - ta) * 1e-9;
        verify_s += (double)(tc - tb) * 1e-9;
        accept_s += (double)(td - tc) * 1e-9;
        admit_s += (double)(te - td) * 1e-9;
        n_batch_steps++;
    }
    /* the steps' time: the prefills of prompts admitted on the way are theirs, not decoding */
    double decode_s = (double)(df_now_ns() - t0) * 1e-9 - admit_s;
    for (int i = 0; i < n; i++) {
        r[i].decode_s = decode_s, r[i].batch_steps = n_batch_steps;
        if (drs)
            r[i].draft_s = draft_s, r[i].verify_s = verify_s, r[i].accept_s = accept_s;
        for (int s = 0; drs && s < r[i].n_steps; s++)
            for (int k = 1; k < B && sq[i].anchor_at[s] + k < r[i].n_tokens; k++) {
                r[i].pos_n[k]++;
                r[i].pos_hit[k] +=
                    sq[i].drafts[(size_t)s * (size_t)(B - 1) + (size_t)(k - 1)] == r[i].tokens[sq[i].anchor_at[s] + k];
            }
    }
    if (wall_s)
        *wall_s = (double)(df_now_ns() - t_start) * 1e-9;
out:
    for (int i = 0; sq && i < n_init; i++) {
        free(sq[i].drafts), free(sq[i].anchor_at);
        if (rc < 0)
            spec_result_free(&r[i]);
    }
    free(sq), free(ks), free(in_slot), free(tok), free(next), free(run), free(anc), free(dft);
    return rc;
}

int spec_score_drafts(spec_target *t, spec_drafter *dr, const int32_t *prompt, int n_prompt, const int32_t *out,
                      int n_out, long *hit, long *n)
{
    int B = dr->block_size, total = n_prompt + n_out;
    if (n_prompt < 1 || n_out < 2)
        return n_prompt < 1 ? -EINVAL : 0;
    if (total + B > t->max_ctx)
        return -ENOSPC;
    int32_t *all = malloc(sizeof(int32_t) * (size_t)total), *draft = malloc(sizeof(int32_t) * (size_t)B);
    if (!all || !draft) {
        free(all), free(draft);
        return -ENOMEM;
    }
    memcpy(all, prompt, sizeof(int32_t) * (size_t)n_prompt);
    memcpy(all + n_prompt, out, sizeof(int32_t) * (size_t)n_out);
    const float *feats;
    int32_t next, rc;
    /* rows 0..total-2: every row that is ever context (the last token is never an anchor) */
    if ((rc = t->reset(t->ctx)) < 0 || (rc = t->extend(t->ctx, all, total - 1, 1, &next, &feats)) < 0 ||
        (rc = dr->reset(dr->ctx)) < 0 || (rc = dr->append(dr->ctx, feats, n_prompt)) < 0)
        goto out;
    for (int j = 0; j + 1 < n_out; j++) {
        int a = n_prompt + j; /* the anchor out[j]; rows < a are in the context */
        if ((rc = dr->draft(dr->ctx, all[a], draft)) < 0)
            goto out;
        for (int k = 1; k < B && j + k < n_out; k++) {
            n[k]++;
            hit[k] += draft[k - 1] == out[j + k];
        }
        const float *row = (const float *)(const void *)((const char *)feats + (size_t)a * t->feat_row_bytes);
        if ((rc = dr->append(dr->ctx, row, 1)) < 0)
            goto out;
    }
out:
    free(all), free(draft);
    return rc < 0 ? rc : 0;
}

/* ---- CPU adapters ---------------------------------------------------------------- */

static int cpu_t_reset(void *ctx)
{
    decode_reset(ctx);
    return 0;
}

static int cpu_t_extend_seq(void *ctx, int seq, const int32_t *tokens, int k, int n_next, int32_t *next,
                            const float **feats);

static int cpu_t_extend(void *ctx, const int32_t *tokens, int k, int n_next, int32_t *next, const float **feats)
{
    return cpu_t_extend_seq(ctx, 0, tokens, k, n_next, next, feats);
}

static int cpu_t_truncate(void *ctx, int len)
{
    return decode_truncate(ctx, len);
}

static int cpu_t_reset_seq(void *ctx, int seq)
{
    decode_model *m = ctx;
    if (seq < 0 || seq >= m->n_seq)
        return -EINVAL;
    decode_reset_seq(m, seq);
    return 0;
}

static int cpu_t_extend_seq(void *ctx, int seq, const int32_t *tokens, int k, int n_next, int32_t *next,
                            const float **feats)
{
    decode_model *m = ctx;
    int rc = decode_extend_seq(m, seq, tokens, k, n_next);
    if (rc < 0)
        return rc;
    int V = m->tm.cfg.vocab_size;
    for (int i = 0; i < n_next; i++)
        next[i] = decode_argmax(m->logits + (size_t)i * V, V);
    *feats = m->feat;
    return 0;
}

static int cpu_t_truncate_seq(void *ctx, int seq, int len)
{
    return decode_truncate_seq(ctx, seq, len);
}

static int cpu_t_extend_batch(void *ctx, const int32_t *tokens, const int *ks, int32_t *next, const float **feats)
{
    decode_model *m = ctx;
    int rc = decode_extend_batch(m, tokens, ks), R = 0;
    if (rc < 0)
        return rc;
    for (int s = 0; s < m->n_seq; s++)
        R += ks[s];
    int V = m->tm.cfg.vocab_size;
    for (int i = 0; i < R; i++)
        next[i] = decode_argmax(m->logits + (size_t)i * V, V);
    *feats = m->feat;
    return 0;
}

void spec_target_cpu(spec_target *t, decode_model *m)
{
    *t = (spec_target){.ctx = m,
                       .feat_dim = m->n_capture * m->tm.cfg.hidden_size,
                       .feat_row_bytes = sizeof(float) * (size_t)m->n_capture * (size_t)m->tm.cfg.hidden_size,
                       .max_ctx = m->max_ctx,
                       .reset = cpu_t_reset,
                       .extend = cpu_t_extend,
                       .truncate = cpu_t_truncate,
                       .n_seq = m->n_seq,
                       .reset_seq = cpu_t_reset_seq,
                       .extend_seq = cpu_t_extend_seq,
                       .truncate_seq = cpu_t_truncate_seq,
                       .extend_batch = cpu_t_extend_batch};
}

static int cpu_d_reset(void *ctx)
{
    infer_reset(ctx);
    return 0;
}

static int cpu_d_append(void *ctx, const float *feats, int n)
{
    return infer_append(ctx, feats, n);
}

static int cpu_d_draft(void *ctx, int32_t anchor, int32_t *draft)
{
    return infer_draft(ctx, anchor, draft);
}

void spec_drafter_cpu(spec_drafter *d, infer_state *s)
{
    *d = (spec_drafter){
        .ctx = s, .block_size = s->c->block_size, .reset = cpu_d_reset, .append = cpu_d_append, .draft = cpu_d_draft};
}
