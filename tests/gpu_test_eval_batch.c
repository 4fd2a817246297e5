/* gpu_test_eval_batch: (g) of the CUDA eval checks (gpu_test_eval.h): batches.
 * decode_extend_batch_cuda rows (5 sequences of different lengths, one sitting out in
 * some steps, up to 80 rows: the 64-row pieces) == each sequence's lone extend bitwise
 * (logits and features), graphs on and off; spec_generate_batch, plain, speculative
 * (random / release drafter) and with oracle drafters (varied acceptance), each as a batch
 * and as a queue through 2 sequences, gives every prompt exactly the tokens of lone plain
 * greedy on the GPU, prompts of different lengths, one stopping early at eos; and what
 * depends on the drafter state, against each prompt's lone spec_generate: every draft of
 * the real drafter (batch and queue, draft for draft), and the steps, acceptance sums and
 * histograms of the real and the oracle drafters (a drafter context reset on the wrong
 * sequence, left stale or appended to another prompt's changes them).
 * Without a GPU: SKIPPED (77). A watchdog fails the test instead of hanging. */
#include "gpu_test_eval.h"

/* A sequence's drafter in a queue (more prompts than sequences): the oracle of the prompt
 * spec_generate_batch assigns to it (as test_spec_decode's os_assign). A slot that keeps
 * the last prompt's oracle, or one reset or appended on the wrong slot, drafts from the
 * wrong output position, and its acceptances change. */
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
    oracle_slot *s = ctx;
    return s->cur ? or_reset(s->cur) : -EINVAL;
}

static int os_append(void *ctx, const float *feats, int n)
{
    oracle_slot *s = ctx;
    return s->cur ? or_append(s->cur, feats, n) : -EINVAL;
}

static int os_draft(void *ctx, int32_t anchor, int32_t *draft)
{
    oracle_slot *s = ctx;
    return s->cur ? or_draft(s->cur, anchor, draft) : -EINVAL;
}

/* Every draft a real (CUDA) drafter makes, logged per prompt: a wrapper around a backend's
 * drafter (its draft_batch too) that follows the prompt each slot serves (assign). The
 * drafts depend on the drafter's context (the target's features of that prompt), so a
 * context reset on the wrong sequence, left stale or appended to the wrong slot gives other
 * drafts, whatever the acceptance. */
#define DLOG_PROMPTS 4
typedef struct draft_log {
    int32_t *d[DLOG_PROMPTS]; /* [cap * (B - 1)] prompt i's drafts in order */
    int n[DLOG_PROMPTS], cap, Bm1;
    int lost; /* drafts for no prompt (never assigned) or past cap */
} draft_log;

typedef struct rec_slot {
    spec_drafter in; /* the backend's drafter of this slot */
    draft_log *log;
    int prompt; /* the prompt this slot serves (-1: none yet) */
} rec_slot;

static void dlog_init(draft_log *l, int cap, int Bm1)
{
    *l = (draft_log){.cap = cap, .Bm1 = Bm1};
    for (int i = 0; i < DLOG_PROMPTS; i++)
        l->d[i] = xmalloc(sizeof(int32_t) * (size_t)cap * (size_t)Bm1);
}

static void dlog_free(draft_log *l)
{
    for (int i = 0; i < DLOG_PROMPTS; i++)
        free(l->d[i]);
}

static void dlog_put(draft_log *l, int prompt, const int32_t *draft)
{
    if (prompt < 0 || prompt >= DLOG_PROMPTS || l->n[prompt] >= l->cap) {
        l->lost++;
        return;
    }
    memcpy(l->d[prompt] + (size_t)l->n[prompt]++ * (size_t)l->Bm1, draft, sizeof(int32_t) * (size_t)l->Bm1);
}

/* Index of the first draft of prompt i where a and b differ (a count that differs counts
 * from the shorter), -1 when equal. */
static int dlog_first_diff(const draft_log *a, const draft_log *b, int i)
{
    int n = DF_MIN(a->n[i], b->n[i]);
    for (int s = 0; s < n; s++)
        if (memcmp(a->d[i] + (size_t)s * a->Bm1, b->d[i] + (size_t)s * b->Bm1, sizeof(int32_t) * (size_t)a->Bm1))
            return s;
    return a->n[i] != b->n[i] ? n : -1;
}

static int rec_assign(void *ctx, int prompt)
{
    rec_slot *s = ctx;
    s->prompt = prompt;
    return s->in.assign ? s->in.assign(s->in.ctx, prompt) : 0;
}

static int rec_reset(void *ctx)
{
    rec_slot *s = ctx;
    return s->in.reset(s->in.ctx);
}

static int rec_append(void *ctx, const float *feats, int n)
{
    rec_slot *s = ctx;
    return s->in.append(s->in.ctx, feats, n);
}

static int rec_draft(void *ctx, int32_t anchor, int32_t *draft)
{
    rec_slot *s = ctx;
    int rc = s->in.draft(s->in.ctx, anchor, draft);
    if (rc == 0)
        dlog_put(s->log, s->prompt, draft);
    return rc;
}

static int rec_draft_batch(void *bctx, int n, const int *seqs, const int32_t *anchors, int32_t *drafts)
{
    rec_slot *all = bctx;
    int rc = all[0].in.draft_batch(all[0].in.batch_ctx, n, seqs, anchors, drafts);
    for (int j = 0; rc == 0 && j < n; j++)
        dlog_put(all[seqs[j]].log, all[seqs[j]].prompt, drafts + (size_t)j * (size_t)all[0].log->Bm1);
    return rc;
}

/* Wraps the n drafters in[] into out[] (slots in rs[]) logging into l; prompt: the prompt
 * of a lone run (spec_generate assigns none), -1 for a batch (assign sets it). */
static void rec_wrap(rec_slot *rs, spec_drafter *out, const spec_drafter *in, int n, draft_log *l, int prompt)
{
    for (int s = 0; s < n; s++) {
        rs[s] = (rec_slot){.in = in[s], .log = l, .prompt = prompt};
        out[s] = (spec_drafter){.ctx = &rs[s],
                                .block_size = in[s].block_size,
                                .reset = rec_reset,
                                .append = rec_append,
                                .draft = rec_draft,
                                .batch_ctx = in[s].draft_batch ? rs : NULL, /* draft_batch's seqs index rs */
                                .draft_batch = in[s].draft_batch ? rec_draft_batch : NULL,
                                .assign = rec_assign};
    }
}

/* g. batched target rows == lone extends, bitwise. */
static void test_batch_rows(decode_model_cuda *lone, const prompts_list *pl)
{
    const int NS = 5, B = 16;
    int capture[2] = {1, 3};
    decode_model_cuda bm;
    RC_CHECK(decode_load_batch_cuda(&bm, TARGET, capture, 2, MAX_CTX, B, NS, g_err, sizeof g_err), g_err);
    int V = bm.tm.V, fd = 2 * bm.tm.d;
    int32_t next[80], nl[16], tok[80];
    float *lg = xmalloc(sizeof(float) * 80 * (size_t)V), *ft = xmalloc(sizeof(float) * 80 * (size_t)fd);
    float *l1 = xmalloc(sizeof(float) * 16 * (size_t)V), *f1 = xmalloc(sizeof(float) * 16 * (size_t)fd);
    static const int KS[4][5] = {{16, 16, 16, 16, 16}, {1, 0, 1, 1, 1}, {16, 3, 0, 16, 7}, {0, 0, 0, 0, 16}};
    long rows = 0, bad = 0;
    for (int lay = 0; lay < 4; lay++) { /* graphs on / off, each with both activation layouts */
        int graphs = lay < 2;
        bm.use_graphs = lone->use_graphs = graphs;
        bm.fused = lay & 1 ? DECODE_FUSED_DEFAULT ^ DECODE_FUSE_XC : DECODE_FUSED_DEFAULT;
        decode_drop_graphs_cuda(&bm);
        int np[5];
        for (int q = 0; q < NS; q++) {
            np[q] = pl->p[q % pl->n].n - 9 * q; /* different lengths */
            decode_reset_seq_cuda(&bm, q);
            RC_CHECK(decode_extend_seq_cuda(&bm, q, pl->p[q % pl->n].tokens, np[q], 1, next, g_err, sizeof g_err),
                     g_err);
        }
        for (int st = 0; st < 4; st++) {
            int R = 0, lens[5];
            for (int q = 0; q < NS; q++)
                R += KS[st][q], lens[q] = decode_seq_len_cuda(&bm, q);
            for (int i = 0; i < R; i++)
                tok[i] = rnd(0, V - 1);
            RC_CHECK(decode_extend_batch_cuda(&bm, tok, KS[st], next, g_err, sizeof g_err), g_err);
            RC_CHECK(decode_logits_to_host_cuda(&bm, lg, g_err, sizeof g_err), g_err);
            RC_CHECK(decode_feats_to_host_cuda(&bm, R, ft, g_err, sizeof g_err), g_err);
            for (int q = 0, row = 0; q < NS; row += KS[st][q], q++) {
                int k = KS[st][q];
                if (decode_seq_len_cuda(&bm, q) != lens[q] + k)
                    bad++;
                if (!k)
                    continue;
                /* the same sequence alone: its prompt, then this step's rows (every step
                 * starts from the prompt: the sequences are truncated back below) */
                decode_reset_cuda(lone);
                RC_CHECK(decode_extend_cuda(lone, pl->p[q % pl->n].tokens, np[q], 1, nl, g_err, sizeof g_err), g_err);
                if (lens[q] != np[q]) {
                    bad++;
                    continue;
                }
                RC_CHECK(decode_extend_cuda(lone, tok + row, k, k, nl, g_err, sizeof g_err), g_err);
                RC_CHECK(decode_logits_to_host_cuda(lone, l1, g_err, sizeof g_err), g_err);
                RC_CHECK(decode_feats_to_host_cuda(lone, k, f1, g_err, sizeof g_err), g_err);
                int bl = memcmp(l1, lg + (size_t)row * V, sizeof(float) * (size_t)k * V) != 0;
                int bf = memcmp(f1, ft + (size_t)row * fd, sizeof(float) * (size_t)k * fd) != 0;
                int bn = memcmp(nl, next + row, sizeof(int32_t) * (size_t)k) != 0;
                if ((bl || bf || bn) && bad < 4)
                    printf("    (g) graphs %d, fused %d, step %d, sequence %d (%d rows at row %d of %d): differs "
                           "in%s%s%s\n",
                           graphs, bm.fused, st, q, k, row, R, bl ? " logits" : "", bf ? " features" : "",
                           bn ? " greedy tokens" : "");
                bad += bl + bf + bn;
                rows += k;
            }
            for (int q = 0; q < NS; q++) /* back to the prompt: the lone replay stays one prefill */
                RC_CHECK(decode_truncate_seq_cuda(&bm, q, np[q]), "decode_truncate_seq_cuda");
        }
    }
    int over[5] = {0, 0, 0, 0, MAX_CTX};
    int ok_err = decode_extend_batch_cuda(&bm, tok, over, next, g_err, sizeof g_err) == -ENOSPC;
    bm.fused = 1;
    ok_err &= decode_extend_batch_cuda(&bm, tok, KS[1], next, g_err, sizeof g_err) == -EINVAL;
    printf("%s (g) batched target: %ld rows of 4 steps x 5 sequences (up to 80 rows a call, graphs on and off, "
           "activations row- and chunk-major) == "
           "each sequence's lone extend bitwise (logits, features, greedy tokens)%s\n",
           bad == 0 && ok_err ? "PASS" : "FAIL", rows, ok_err ? "" : "; error codes wrong");
    g_fail += bad != 0 || !ok_err;
    lone->use_graphs = 1;
    decode_free_cuda(&bm);
    free(lg), free(ft), free(l1), free(f1);
}

/* 1 when a and b took the same steps with the same acceptances (count, sum, histogram). */
static int same_steps(const spec_result *a, const spec_result *b)
{
    if (a->n_steps != b->n_steps || a->accept_sum != b->accept_sum || a->block_size != b->block_size)
        return 0;
    for (int k = 0; k <= a->block_size; k++)
        if (a->hist[k] != b->hist[k])
            return 0;
    return 1;
}

/* g. spec_generate_batch on the GPU against lone decoding on the GPU, per prompt, exactly:
 * the tokens of plain, speculative and oracle batches, and of plain, speculative and oracle
 * queues through 2 sequences, == lone plain greedy; and what depends on each prompt's
 * drafter state (the tokens do not: decoding is lossless whatever the drafts): every draft
 * of the real drafter in the batch and in the queue == the drafts of lone spec_generate,
 * draft for draft, and the steps, acceptance sums and histograms of the real and the oracle
 * drafters in the batch and in the queue == lone spec_generate's. */
static void test_batch_lossless(const char *name, const dflash_config *c, const dflash_params *p,
                                const prompts_list *pl, int max_new)
{
    const int n = 4, B = c->block_size;
    spec_backend one, many;
    int max_ctx = 1024 + max_new + c->block_size;
    RC_CHECK(spec_backend_open(&one, "cuda", TARGET, c, p, max_ctx, g_err, sizeof g_err), g_err);
    RC_CHECK(spec_backend_open_batch(&many, "cuda", TARGET, c, p, max_ctx, n, g_err, sizeof g_err), g_err);
    const int32_t *pr[4];
    int np[4];
    spec_result ref[4], bp[4], bs[4], bo[4], ls[4], lo[4];
    spec_opts free_run = {.max_new = max_new, .eos = -1};
    for (int i = 0; i < n; i++) {
        pr[i] = pl->p[i % pl->n].tokens, np[i] = pl->p[i % pl->n].n - 11 * i;
        RC_CHECK(spec_generate_plain(&one.target, pr[i], np[i], &free_run, &ref[i]), "spec_generate_plain");
    }
    /* eos: a token one prompt's output has (position 4 on) and another's never does */
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
    /* oracle drafters: each prompt's free-running output, 30% of drafts corrupted; every
     * run starts each prompt's oracle from the same seed, so its drafts depend only on the
     * context it is given */
    oracle orc[4];
    spec_drafter od[4];
    int32_t *seqs[4];
    uint64_t oseed[4];
    for (int i = 0; i < n; i++) {
        seqs[i] = xmalloc(sizeof(int32_t) * (size_t)(np[i] + max_new));
        memcpy(seqs[i], pr[i], sizeof(int32_t) * np[i]);
        memcpy(seqs[i] + np[i], ref[i].tokens, sizeof(int32_t) * max_new);
        orc[i] = (oracle){.seq = seqs[i], .n_seq = np[i] + max_new, .B = B, .V = c->vocab};
        oseed[i] = df_rng_next(&g_rng);
        od[i] =
            (spec_drafter){.ctx = &orc[i], .block_size = B, .reset = or_reset, .append = or_append, .draft = or_draft};
        spec_result_free(&ref[i]);
        RC_CHECK(spec_generate_plain(&one.target, pr[i], np[i], &o, &ref[i]), "spec_generate_plain (eos)");
    }
    /* each prompt alone: the real drafter (every draft logged) and the oracle */
    draft_log dl_lone, dl_bs, dl_qs;
    dlog_init(&dl_lone, max_new, B - 1), dlog_init(&dl_bs, max_new, B - 1), dlog_init(&dl_qs, max_new, B - 1);
    for (int i = 0; i < n; i++) {
        rec_slot rs1;
        spec_drafter w1;
        rec_wrap(&rs1, &w1, &one.drafter, 1, &dl_lone, i);
        RC_CHECK(spec_generate(&one.target, &w1, pr[i], np[i], &o, &ls[i]), "spec_generate (lone)");
        df_rng_seed(&orc[i].rng, oseed[i]);
        RC_CHECK(spec_generate(&one.target, &od[i], pr[i], np[i], &o, &lo[i]), "spec_generate (lone oracle)");
    }
    double wp, ws, wo;
    rec_slot rsb[4];
    spec_drafter wb[4];
    rec_wrap(rsb, wb, many.drafters, n, &dl_bs, -1);
    RC_CHECK(spec_generate_batch(&many.target, NULL, n, pr, np, &o, bp, &wp), "spec_generate_batch (plain)");
    RC_CHECK(spec_generate_batch(&many.target, wb, n, pr, np, &o, bs, &ws), "spec_generate_batch (spec)");
    for (int i = 0; i < n; i++)
        df_rng_seed(&orc[i].rng, oseed[i]);
    RC_CHECK(spec_generate_batch(&many.target, od, n, pr, np, &o, bo, &wo), "spec_generate_batch (oracle)");
    /* the same prompts as a queue through 2 sequences (a finished prompt's sequence and its
     * drafter context in the slab are reused by the next prompt), plain, speculative and
     * with the oracles (each slot told the prompt it serves next) */
    spec_backend two;
    spec_result qp[4], qs[4], qo[4];
    rec_slot rsq[2];
    spec_drafter wq[2], qd[2];
    oracle_slot oslot[2] = {{orc, NULL}, {orc, NULL}};
    for (int k = 0; k < 2; k++)
        qd[k] = (spec_drafter){.ctx = &oslot[k],
                               .block_size = B,
                               .reset = os_reset,
                               .append = os_append,
                               .draft = os_draft,
                               .assign = os_assign};
    RC_CHECK(spec_backend_open_batch(&two, "cuda", TARGET, c, p, max_ctx, 2, g_err, sizeof g_err), g_err);
    rec_wrap(rsq, wq, two.drafters, 2, &dl_qs, -1);
    RC_CHECK(spec_generate_batch(&two.target, NULL, n, pr, np, &o, qp, NULL), "spec_generate_batch (plain queue)");
    RC_CHECK(spec_generate_batch(&two.target, wq, n, pr, np, &o, qs, NULL), "spec_generate_batch (queue)");
    for (int i = 0; i < n; i++)
        df_rng_seed(&orc[i].rng, oseed[i]);
    RC_CHECK(spec_generate_batch(&two.target, qd, n, pr, np, &o, qo, NULL), "spec_generate_batch (oracle queue)");
    spec_backend_close(&two);
    long same = 0, early = 0, tokens = 0, drafts = 0;
    double tau_o = 0, tau_s = 0;
    for (int i = 0; i < n; i++) {
        long nd;
        int tok_ok = first_diff(&ref[i], &bp[i], &nd) < 0 && first_diff(&ref[i], &bs[i], &nd) < 0 &&
                     first_diff(&ref[i], &bo[i], &nd) < 0 && first_diff(&ref[i], &qp[i], &nd) < 0 &&
                     first_diff(&ref[i], &qs[i], &nd) < 0 && first_diff(&ref[i], &qo[i], &nd) < 0 &&
                     first_diff(&ref[i], &ls[i], &nd) < 0 && first_diff(&ref[i], &lo[i], &nd) < 0;
        int db = dlog_first_diff(&dl_lone, &dl_bs, i), dq = dlog_first_diff(&dl_lone, &dl_qs, i);
        int drafts_ok = db < 0 && dq < 0 && dl_lone.n[i] == ls[i].n_steps;
        int steps_ok = same_steps(&ls[i], &bs[i]) && same_steps(&ls[i], &qs[i]);
        int orc_ok = same_steps(&lo[i], &bo[i]) && same_steps(&lo[i], &qo[i]);
        int ok = tok_ok && drafts_ok && steps_ok && orc_ok;
        same += ok;
        early += ref[i].n_tokens < max_new, tokens += ref[i].n_tokens, drafts += dl_lone.n[i];
        tau_o += spec_result_tau(&lo[i]) / n, tau_s += spec_result_tau(&ls[i]) / n;
        if (!tok_ok)
            printf("FAIL (g) %s: prompt %d (%d tokens): a batched, queued or lone speculative output differs from "
                   "lone plain greedy\n",
                   name, i, np[i]);
        if (!drafts_ok)
            printf("FAIL (g) %s: prompt %d: drafter drafts differ from its lone run: batch from draft %d, queue from "
                   "draft %d (-1: none; lone %d drafts for %d steps)\n",
                   name, i, db, dq, dl_lone.n[i], ls[i].n_steps);
        if (!steps_ok)
            printf("FAIL (g) %s: prompt %d: drafter steps / acceptance sum lone %d / %ld, batch %d / %ld, queue "
                   "%d / %ld (or the histograms differ)\n",
                   name, i, ls[i].n_steps, ls[i].accept_sum, bs[i].n_steps, bs[i].accept_sum, qs[i].n_steps,
                   qs[i].accept_sum);
        if (!orc_ok)
            printf("FAIL (g) %s: prompt %d: oracle steps / acceptance sum lone %d / %ld, batch %d / %ld, queue "
                   "%d / %ld (or the histograms differ)\n",
                   name, i, lo[i].n_steps, lo[i].accept_sum, bo[i].n_steps, bo[i].accept_sum, qo[i].n_steps,
                   qo[i].accept_sum);
        spec_result_free(&ref[i]), spec_result_free(&bp[i]), spec_result_free(&bs[i]), spec_result_free(&bo[i]);
        spec_result_free(&qp[i]), spec_result_free(&qs[i]), spec_result_free(&qo[i]);
        spec_result_free(&ls[i]), spec_result_free(&lo[i]);
        free(seqs[i]);
    }
    int lost = dl_lone.lost + dl_bs.lost + dl_qs.lost;
    if (lost)
        printf("FAIL (g) %s: %d drafts logged for no prompt or past max_new\n", name, lost);
    printf("%s (g) %s: batch of %d prompts (%d..%d tokens, eos %d: %ld stop early), plain / speculative / oracle "
           "batched and as a queue through 2 sequences == lone plain greedy for %ld of %d (tokens; %ld drafts of the "
           "drafter and its steps, tau %.3f, and the oracle's steps, tau %.2f, == each prompt's lone "
           "spec_generate); %ld tokens in %.3f / %.3f / %.3f s\n",
           same == n && !lost ? "PASS" : "FAIL", name, n, np[n - 1], np[0], o.eos, early, same, n, drafts, tau_s, tau_o,
           tokens, wp, ws, wo);
    g_fail += same != n || lost;
    dlog_free(&dl_lone), dlog_free(&dl_bs), dlog_free(&dl_qs);
    spec_backend_close(&many);
    spec_backend_close(&one);
}

int main(void)
{
    gte_begin(300);
    int capture[2] = {1, 3}; /* the release fixture's target_layer_ids, also the random drafter's */
    decode_model cpu;        /* the target's config: the prompts' vocabulary, the random drafter's shape */
    decode_model_cuda gpu;
    RC_CHECK(decode_load(&cpu, TARGET, capture, 2, MAX_CTX, g_err, sizeof g_err), g_err);
    RC_CHECK(decode_load_cuda(&gpu, TARGET, capture, 2, MAX_CTX, 16, g_err, sizeof g_err), g_err);
    prompts_list pl = {0};
    RC_CHECK(prompts_load(&pl, HELDOUT, TARGET, cpu.tm.cfg.vocab_size, 4, 512, g_err, sizeof g_err), g_err);
    test_batch_rows(&gpu, &pl);
    dflash_config rc_, rl;
    dflash_params rp, lp;
    random_drafter(&rc_, &rp, &cpu.tm.cfg, df_rng_next(&g_rng));
    decode_free_cuda(&gpu);
    test_batch_lossless("random drafter B=8", &rc_, &rp, &pl, 96);
    if (gte_have_release()) {
        RC_CHECK(dflash_load_release(RELEASE, &rl, &lp, g_err, sizeof g_err), g_err);
        test_batch_lossless("release drafter B=16", &rl, &lp, &pl, 96);
        dflash_params_free(&lp);
    }
    dflash_params_free(&rp);
    decode_free(&cpu);
    prompts_free(&pl);
    return gte_end("gpu_test_eval_batch");
}
