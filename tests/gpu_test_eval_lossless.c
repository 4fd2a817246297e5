/* gpu_test_eval_lossless: (c) and (d) of the CUDA eval checks (gpu_test_eval.h):
 *   c. lossless on the GPU: through spec_backend_open("cuda"), speculative output == plain
 *      greedy output token for token, exactly, with the release drafter, a random
 *      drafter, and an oracle drafter that drafts the plain output with 30% of its tokens
 *      corrupted (real multi-token acceptances: truncation and multi-row appends);
 *   d. CUDA plain greedy vs CPU plain greedy on the same prompts: differing tokens and the
 *      first difference are reported (bf16 vs fp32 arithmetic; not a failure).
 * Without a GPU: SKIPPED (77). A watchdog fails the test instead of hanging. */
#include "gpu_test_eval.h"

/* The CPU target's logit margin between its token and the GPU's at the first output
 * position where they differ (prompt + common prefix through td): small = a near-tie. */
static double cpu_margin(decode_model *td, const prompts_entry *pr, const spec_result *gpu, const spec_result *cpu,
                         int fd)
{
    decode_reset(td);
    RC_CHECK(decode_extend(td, pr->tokens, pr->n, 1), "decode_extend (prompt)");
    if (fd > 0)
        RC_CHECK(decode_extend(td, cpu->tokens, fd, 1), "decode_extend (common prefix)");
    if (fd >= gpu->n_tokens || fd >= cpu->n_tokens)
        return NAN;
    const float *lg = td->logits;
    return (double)lg[cpu->tokens[fd]] - lg[gpu->tokens[fd]];
}

static void test_lossless(const char *name, const dflash_config *c, const dflash_params *p, const prompts_list *pl,
                          int max_new, decode_model *with_cpu)
{
    spec_backend g, cpu;
    int max_ctx = 1024 + max_new + c->block_size;
    RC_CHECK(spec_backend_open(&g, "cuda", TARGET, c, p, max_ctx, g_err, sizeof g_err), g_err);
    if (with_cpu)
        RC_CHECK(spec_backend_open(&cpu, "cpu", TARGET, c, p, max_ctx, g_err, sizeof g_err), g_err);
    spec_opts o = {.max_new = max_new, .eos = -1}; /* never stop early: every prompt decodes max_new tokens */
    double tau = 0, tp = 0, ts = 0, to = 0, tau_o = 0;
    long same = 0, same_o = 0, cpu_same = 0, cpu_tok_diff = 0, cpu_tok = 0;
    for (int i = 0; i < pl->n; i++) {
        const prompts_entry *pr = &pl->p[i];
        spec_result a, b, r;
        RC_CHECK(spec_generate_plain(&g.target, pr->tokens, pr->n, &o, &a), "spec_generate_plain (cuda)");
        RC_CHECK(spec_generate(&g.target, &g.drafter, pr->tokens, pr->n, &o, &b), "spec_generate (cuda)");
        long nd;
        int fd = first_diff(&a, &b, &nd);
        same += fd < 0;
        if (fd >= 0) {
            printf("FAIL (c) %s: %s: speculative output differs from plain at token %d (%ld tokens differ)\n", name,
                   pr->source, fd, nd);
            g_fail++;
        }
        tau += spec_result_tau(&b) / pl->n, tp += tpot_ms(&a) / pl->n, ts += tpot_ms(&b) / pl->n;
        /* the oracle: plain output with 30% of the drafts corrupted */
        int32_t *seq = xmalloc(sizeof(int32_t) * (size_t)(pr->n + a.n_tokens));
        memcpy(seq, pr->tokens, sizeof(int32_t) * pr->n);
        memcpy(seq + pr->n, a.tokens, sizeof(int32_t) * a.n_tokens);
        oracle orc = {.seq = seq, .n_seq = pr->n + a.n_tokens, .B = c->block_size, .V = c->vocab};
        df_rng_seed(&orc.rng, df_rng_next(&g_rng));
        spec_drafter od = {
            .ctx = &orc, .block_size = c->block_size, .reset = or_reset, .append = or_append, .draft = or_draft};
        RC_CHECK(spec_generate(&g.target, &od, pr->tokens, pr->n, &o, &r), "spec_generate (cuda, oracle)");
        fd = first_diff(&a, &r, &nd);
        same_o += fd < 0;
        if (fd >= 0) {
            printf("FAIL (c) %s: %s: oracle speculative output differs from plain at token %d (%ld differ)\n", name,
                   pr->source, fd, nd);
            g_fail++;
        }
        tau_o += spec_result_tau(&r) / pl->n, to += tpot_ms(&r) / pl->n;
        spec_result_free(&r);
        free(seq);
        if (with_cpu) { /* d. */
            spec_result cp;
            RC_CHECK(spec_generate_plain(&cpu.target, pr->tokens, pr->n, &o, &cp), "spec_generate_plain (cpu)");
            fd = first_diff(&a, &cp, &nd);
            cpu_same += fd < 0, cpu_tok_diff += nd, cpu_tok += cp.n_tokens;
            printf("(d) %s: CUDA vs CPU greedy: %s (%ld of %d tokens differ)\n", pr->source,
                   fd < 0 ? "identical" : "differ", nd, cp.n_tokens);
            if (fd >= 0)
                printf("    first difference at token %d: GPU %d, CPU %d; the CPU's logit margin between them %.4g\n",
                       fd, a.tokens[fd], cp.tokens[fd], cpu_margin(with_cpu, pr, &a, &cp, fd));
            spec_result_free(&cp);
        }
        spec_result_free(&a), spec_result_free(&b);
    }
    printf("(c) %s: %d prompts x %d tokens: speculative == plain on the GPU for %ld of %d; tau %.3f; time per token "
           "plain %.3f ms, speculative %.3f ms\n",
           name, pl->n, max_new, same, pl->n, tau, tp, ts);
    printf("(c) %s + oracle drafter (plain output, 30%% of drafts corrupted): identical for %ld of %d; tau %.3f, "
           "%.3f ms per token (plain %.3f)\n",
           name, same_o, pl->n, tau_o, to, tp);
    if (with_cpu)
        printf("(d) CUDA vs CPU plain greedy: %ld of %d prompts identical, %ld of %ld tokens differ\n", cpu_same, pl->n,
               cpu_tok_diff, cpu_tok);
    spec_backend_close(&g);
    if (with_cpu)
        spec_backend_close(&cpu);
}

int main(void)
{
    gte_begin(300);
    int capture[2] = {1, 3}; /* the release fixture's target_layer_ids, also the random drafter's */
    decode_model cpu;        /* (d)'s margins, and the random drafter's shape */
    RC_CHECK(decode_load(&cpu, TARGET, capture, 2, MAX_CTX, g_err, sizeof g_err), g_err);
    prompts_list pl = {0};
    RC_CHECK(prompts_load(&pl, HELDOUT, TARGET, cpu.tm.cfg.vocab_size, 4, 512, g_err, sizeof g_err), g_err);
    dflash_config rc_, rl;
    dflash_params rp, lp;
    random_drafter(&rc_, &rp, &cpu.tm.cfg, df_rng_next(&g_rng));
    test_lossless("random drafter B=8", &rc_, &rp, &pl, 96, &cpu);
    if (gte_have_release()) {
        RC_CHECK(dflash_load_release(RELEASE, &rl, &lp, g_err, sizeof g_err), g_err);
        test_lossless("release drafter B=16", &rl, &lp, &pl, 96, NULL);
        dflash_params_free(&lp);
    }
    dflash_params_free(&rp);
    decode_free(&cpu);
    prompts_free(&pl);
    return gte_end("gpu_test_eval_lossless");
}
