/* gpu_test_eval_drafter: (b) and (h) of the CUDA eval checks (gpu_test_eval.h):
 *   b. CUDA drafter drafts vs CPU dflash_infer fed the same features (the GPU target's,
 *      bf16 -> fp32), for the public release fixture tests/fixtures/dflash-release-tiny
 *      and a random 2-layer drafter with a sliding layer (its weights rounded to bf16
 *      for both sides, as the fixture's are on disk); context appended in pieces
 *      (one of 280 rows: more than one append chunk); logits relative L2 as in (a), draft
 *      differences counted and explained as in (a).
 *   h. batched drafts: infer_batch_draft_cuda (several sequences' blocks in one call) ==
 *      each sequence's lone infer_draft_cuda bitwise (drafts and logits), random subsets
 *      and orders of 5 sequences, graphs on and off.
 * Without a GPU: SKIPPED (77). A watchdog fails the test instead of hanging. */
#include "gpu_test_eval.h"

static void test_drafter(const char *name, const dflash_config *c, const dflash_params *p, decode_model *cpu_t,
                         decode_model_cuda *gpu_t)
{
    int V = c->vocab, B = c->block_size, F = c->n_capture * c->hidden;
    infer_state cd;
    infer_state_cuda gd;
    dflash_frozen fr = {.embed = cpu_t->head.embed, .lm_head = cpu_t->head.lm_head};
    RC_CHECK(infer_init(&cd, c, p, &fr, MAX_CTX), "infer_init");
    RC_CHECK(infer_init_cuda(&gd, c, p, gpu_t->tm.embed, gpu_t->lm_head, MAX_CTX, gpu_t->stream, g_err, sizeof g_err),
             g_err);
    int32_t tok[MAX_CTX], *draft = xmalloc(sizeof(int32_t) * B), *next = xmalloc(sizeof(int32_t) * 16);
    float *ft = xmalloc(sizeof(float) * MAX_CTX * F), *lg = xmalloc(sizeof(float) * (size_t)(B - 1) * V);
    flips f = {0};
    l2acc ll = {0};
    int S = 0, n0 = 280; /* > INFER_CUDA_CHUNK rows in the first append */
    for (int i = 0; i < MAX_CTX; i++)
        tok[i] = rnd(0, V - 1);
    decode_reset_cuda(gpu_t);
    for (int step = 0; step < 8; step++) {
        int k = step == 0 ? n0 : rnd(1, 16);
        RC_CHECK(decode_extend_cuda(gpu_t, tok + S, k, 1, next, g_err, sizeof g_err), g_err);
        RC_CHECK(decode_feats_to_host_cuda(gpu_t, k, ft, g_err, sizeof g_err), g_err);
        RC_CHECK(infer_append(&cd, ft, k), "infer_append");
        RC_CHECK(infer_append_cuda(&gd, gpu_t->feat, k, g_err, sizeof g_err), g_err);
        S += k;
        int32_t anchor = tok[S];
        RC_CHECK(infer_draft(&cd, anchor, draft), "infer_draft");
        RC_CHECK(infer_draft_cuda(&gd, anchor, draft, g_err, sizeof g_err), g_err);
        RC_CHECK(infer_logits_to_host_cuda(&gd, lg, g_err, sizeof g_err), g_err);
        char what[160];
        snprintf(what, sizeof what, "(b) %s: draft at context %d: logits", name, S);
        l2_add(&ll, lg, cd.logits, (size_t)(B - 1) * V);
        if (gt_check_rel_l2(what, lg, cd.logits, (size_t)(B - 1) * V, REL_L2_CALL))
            g_fail++;
        count_flips(&f, draft, lg, cd.logits, B - 1, V, what);
    }
    printf("(b) drafter %s (B=%d, %d layers): %ld drafted tokens, %ld differ from the CPU (%ld unexplained), worst "
           "logits rel L2 %.3g\n",
           name, B, c->n_layers, f.rows, f.diff, f.unexplained, ll.worst);
    char w[160];
    snprintf(w, sizeof w, "(b) %s logits, all drafts", name);
    g_fail += l2_check(w, &ll);
    infer_free(&cd);
    infer_free_cuda(&gd);
    free(draft), free(next), free(ft), free(lg);
}

/* h. infer_batch_draft_cuda == infer_draft_cuda of each sequence, bitwise (drafts and
 * logits): 5 sequences of different context lengths (features of the GPU target's
 * prefills), drafted together in random subsets and orders (more blocks than one call
 * takes at B=16: two calls), graphs on and off. */
static void test_batch_draft(const char *name, const dflash_config *c, const dflash_params *p, decode_model_cuda *gpu_t)
{
    enum { NS = 5 };
    int V = c->vocab, B = c->block_size;
    infer_state_cuda gd;
    infer_batch_cuda ib;
    RC_CHECK(infer_init_cuda(&gd, c, p, gpu_t->tm.embed, gpu_t->lm_head, MAX_CTX, gpu_t->stream, g_err, sizeof g_err),
             g_err);
    RC_CHECK(infer_batch_init_cuda(&ib, &gd, NS, MAX_CTX - 64, g_err, sizeof g_err), g_err);
    int32_t tok[MAX_CTX], next[16], seqs[NS], anc[NS];
    int32_t *lone = xmalloc(sizeof(int32_t) * NS * B), *got = xmalloc(sizeof(int32_t) * NS * B);
    float *l1 = xmalloc(sizeof(float) * NS * (size_t)(B - 1) * V), *l2 = xmalloc(sizeof(float) * (size_t)(B - 1) * V);
    long blocks = 0, bad = 0, calls = 0;
    for (int q = 0; q < NS; q++) { /* context: a prefill of 40 + 37q random tokens, then a few short appends */
        int n = 40 + 37 * q;
        for (int i = 0; i < n; i++)
            tok[i] = rnd(0, V - 1);
        decode_reset_cuda(gpu_t);
        infer_reset_cuda(&ib.seq[q]);
        RC_CHECK(decode_extend_cuda(gpu_t, tok, n, 1, next, g_err, sizeof g_err), g_err);
        RC_CHECK(infer_append_cuda(&ib.seq[q], gpu_t->feat, n, g_err, sizeof g_err), g_err);
        for (int k = 1; k <= q; k++) {
            RC_CHECK(decode_extend_cuda(gpu_t, tok, k, 1, next, g_err, sizeof g_err), g_err);
            RC_CHECK(infer_append_cuda(&ib.seq[q], gpu_t->feat, k, g_err, sizeof g_err), g_err);
        }
    }
    for (int pass = 0; pass < 3; pass++) {
        /* graphs on, off, then off with the batch's activations in the other layout (chunk-major
         * or row-major: DECODE_FUSE_XC flipped on the batch side only) */
        int graphs = pass == 0;
        ib.use_graphs = graphs;
        gd.fused = pass == 2 ? DECODE_FUSED_DEFAULT ^ DECODE_FUSE_XC : DECODE_FUSED_DEFAULT;
        for (int q = 0; q < NS; q++)
            ib.seq[q].use_graphs = graphs;
        for (int round = 0; round < 6; round++) {
            int n = round == 0 ? NS : rnd(1, NS); /* a random subset in a random order */
            for (int q = 0; q < NS; q++)
                seqs[q] = q;
            for (int q = NS - 1; q > 0; q--) {
                int j = rnd(0, q), t = seqs[q];
                seqs[q] = seqs[j], seqs[j] = t;
            }
            for (int j = 0; j < n; j++) {
                anc[j] = rnd(0, V - 1);
                RC_CHECK(infer_draft_cuda(&ib.seq[seqs[j]], anc[j], lone + (size_t)j * (B - 1), g_err, sizeof g_err),
                         g_err);
                RC_CHECK(infer_logits_to_host_cuda(&ib.seq[seqs[j]], l1 + (size_t)j * (B - 1) * V, g_err, sizeof g_err),
                         g_err);
            }
            RC_CHECK(infer_batch_draft_cuda(&ib, n, seqs, anc, got, g_err, sizeof g_err), g_err);
            calls++;
            for (int j = 0; j < n; j++) {
                int same = !memcmp(lone + (size_t)j * (B - 1), got + (size_t)j * (B - 1), sizeof(int32_t) * (B - 1));
                /* logits: the blocks of the last call (j0 = the last multiple of max_blocks) */
                int j0 = (n - 1) / ib.max_blocks * ib.max_blocks;
                if (j >= j0) {
                    RC_CHECK(infer_batch_logits_to_host_cuda(&ib, j - j0, l2, g_err, sizeof g_err), g_err);
                    same &= !memcmp(l1 + (size_t)j * (B - 1) * V, l2, sizeof(float) * (size_t)(B - 1) * V);
                }
                if (!same && bad < 3)
                    printf("    (h) %s: graphs %d, batch fused %d, round %d: block %d of %d (sequence %d, context %d) "
                           "differs\n",
                           name, graphs, gd.fused, round, j, n, seqs[j], ib.seq[seqs[j]].n_ctx);
                bad += !same, blocks++;
            }
        }
    }
    int bad_seq[1] = {NS};
    int twice[2] = {1, 1};
    int ok_err = infer_batch_draft_cuda(&ib, 1, bad_seq, anc, got, g_err, sizeof g_err) == -EINVAL &&
                 infer_batch_draft_cuda(&ib, 2, twice, anc, got, g_err, sizeof g_err) == -EINVAL;
    printf("%s (h) %s (B=%d): %ld blocks of 5 sequences drafted together in %ld calls == their lone drafts bitwise "
           "(drafts, logits), graphs on and off, the batch's activations in both layouts%s\n",
           bad == 0 && ok_err ? "PASS" : "FAIL", name, B, blocks, calls,
           ok_err ? "" : "; a bad or repeated sequence not refused");
    g_fail += bad != 0 || !ok_err;
    infer_batch_free_cuda(&ib);
    infer_free_cuda(&gd);
    free(lone), free(got), free(l1), free(l2);
}

int main(void)
{
    gte_begin(300);
    int capture[2] = {1, 3}; /* the release fixture's target_layer_ids, also the random drafter's */
    decode_model cpu;
    decode_model_cuda gpu;
    RC_CHECK(decode_load(&cpu, TARGET, capture, 2, MAX_CTX, g_err, sizeof g_err), g_err);
    RC_CHECK(decode_load_cuda(&gpu, TARGET, capture, 2, MAX_CTX, 16, g_err, sizeof g_err), g_err);
    dflash_config rc_, rl;
    dflash_params rp, lp;
    random_drafter(&rc_, &rp, &cpu.tm.cfg, df_rng_next(&g_rng));
    test_drafter("random (full + sliding layer)", &rc_, &rp, &cpu, &gpu);
    test_batch_draft("random drafter", &rc_, &rp, &gpu);
    int have_release = gte_have_release();
    if (have_release) {
        RC_CHECK(dflash_load_release(RELEASE, &rl, &lp, g_err, sizeof g_err), g_err);
        test_drafter("release fixture", &rl, &lp, &cpu, &gpu);
        test_batch_draft("release fixture", &rl, &lp, &gpu);
        dflash_params_free(&lp);
    }
    dflash_params_free(&rp);
    decode_free_cuda(&gpu);
    decode_free(&cpu);
    return gte_end("gpu_test_eval_drafter");
}
