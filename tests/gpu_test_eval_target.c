/* gpu_test_eval_target: (a) of the CUDA eval checks (gpu_test_eval.h): CUDA KV-cached
 * target decode vs the CPU target_decode on random prompts: prefill, extends in random
 * chunks (k = 1..16, logits of every new row), truncation and extending with other
 * tokens. Logits and captured features match to a bf16 tolerance (relative L2 < 2e-2
 * pooled over all calls, as gpu_test_target's forward; < 5e-2 for any one call, a single
 * logit row included); greedy tokens that differ are counted, and each must be a near-tie
 * the measured logit error explains (CPU margin between the two tokens <= 2 x the row's
 * max |logit error|). Then the time per extend (k = 1 and 16), printed.
 * Without a GPU: SKIPPED (77). A watchdog fails the test instead of hanging. */
#include "gpu_test_eval.h"

/* One extend of k tokens on both; compares features and the logits of all k rows. */
static void extend_both(decode_model *cpu, decode_model_cuda *gpu, const int32_t *tok, int k, int n_next, flips *f,
                        l2acc *lf, l2acc *ll, const char *what)
{
    int V = cpu->tm.cfg.vocab_size, F = cpu->n_capture * cpu->tm.cfg.hidden_size;
    int32_t *next = xmalloc(sizeof(int32_t) * n_next);
    float *lg = xmalloc(sizeof(float) * (size_t)n_next * V), *ft = xmalloc(sizeof(float) * (size_t)k * F);
    RC_CHECK(decode_extend(cpu, tok, k, n_next), "decode_extend");
    RC_CHECK(decode_extend_cuda(gpu, tok, k, n_next, next, g_err, sizeof g_err), g_err);
    RC_CHECK(decode_logits_to_host_cuda(gpu, lg, g_err, sizeof g_err), g_err);
    RC_CHECK(decode_feats_to_host_cuda(gpu, k, ft, g_err, sizeof g_err), g_err);
    char w[160];
    snprintf(w, sizeof w, "%s: features of %d rows", what, k);
    if (gt_check_rel_l2(w, ft, cpu->feat, (size_t)k * F, REL_L2_CALL))
        g_fail++;
    snprintf(w, sizeof w, "%s: logits of %d rows", what, n_next);
    if (gt_check_rel_l2(w, lg, cpu->logits, (size_t)n_next * V, REL_L2_CALL))
        g_fail++;
    l2_add(lf, ft, cpu->feat, (size_t)k * F);
    l2_add(ll, lg, cpu->logits, (size_t)n_next * V);
    count_flips(f, next, lg, cpu->logits, n_next, V, what);
    free(next), free(lg), free(ft);
}

static void test_target(decode_model *cpu, decode_model_cuda *gpu)
{
    int V = cpu->tm.cfg.vocab_size;
    flips f = {0};
    l2acc lf = {0}, ll = {0};
    int32_t tok[MAX_CTX];
    for (int round = 0; round < 3; round++) {
        int n = rnd(5, 300), total = n + rnd(40, 80);
        for (int i = 0; i < total; i++)
            tok[i] = rnd(0, V - 1);
        decode_reset(cpu), decode_reset_cuda(gpu);
        char what[96];
        snprintf(what, sizeof what, "round %d prefill %d", round, n);
        extend_both(cpu, gpu, tok, n, 1, &f, &lf, &ll, what);
        int at = n;
        while (at < total) {
            int k = rnd(1, 16); /* not inside DF_MIN: the macro evaluates its arguments twice */
            k = DF_MIN(k, total - at);
            snprintf(what, sizeof what, "round %d extend %d at %d", round, k, at);
            extend_both(cpu, gpu, tok + at, k, k, &f, &lf, &ll, what);
            at += k;
            if (rnd(0, 3) == 0) { /* reject part of what was just run, continue with other tokens */
                int keep = at - rnd(0, k);
                RC_CHECK(decode_truncate(cpu, keep), "decode_truncate");
                RC_CHECK(decode_truncate_cuda(gpu, keep), "decode_truncate_cuda");
                for (int i = keep; i < total; i++)
                    tok[i] = rnd(0, V - 1);
                at = keep;
            }
        }
    }
    printf("(a) target decode CUDA vs CPU: %ld greedy rows, %ld differ (near-ties: %ld explained by the logit error, "
           "%ld not), worst logits rel L2 %.3g\n",
           f.rows, f.diff, f.diff - f.unexplained, f.unexplained, ll.worst);
    g_fail += l2_check("(a) target features, all calls", &lf);
    g_fail += l2_check("(a) target logits, all calls", &ll);
}

/* Time per extend (k = 1: a plain step, k = 16: a verify) at a short and a long context:
 * what the simple cached attention costs as the context grows. Printed, not asserted. */
static void time_extends(decode_model_cuda *gpu)
{
    int32_t tok[MAX_CTX], next[16];
    for (int i = 0; i < MAX_CTX; i++)
        tok[i] = rnd(0, gpu->tm.V - 1);
    int ctxs[2] = {64, MAX_CTX - 40}, ks[2] = {1, 16};
    printf("extend timing (ms, mean of 50, prefill excluded):");
    for (int c = 0; c < 2; c++) {
        decode_reset_cuda(gpu);
        RC_CHECK(decode_extend_cuda(gpu, tok, ctxs[c], 1, next, g_err, sizeof g_err), g_err);
        for (int j = 0; j < 2; j++) {
            uint64_t t0 = df_now_ns();
            for (int r = 0; r < 50; r++) {
                RC_CHECK(decode_extend_cuda(gpu, tok + ctxs[c], ks[j], ks[j], next, g_err, sizeof g_err), g_err);
                RC_CHECK(decode_truncate_cuda(gpu, ctxs[c]), "decode_truncate_cuda");
            }
            printf(" context %d k=%d %.3f;", ctxs[c], ks[j], (double)(df_now_ns() - t0) * 1e-6 / 50);
        }
    }
    printf("\n");
}

int main(void)
{
    gte_begin(300);
    int capture[2] = {1, 3}; /* the release fixture's target_layer_ids */
    decode_model cpu;
    decode_model_cuda gpu;
    RC_CHECK(decode_load(&cpu, TARGET, capture, 2, MAX_CTX, g_err, sizeof g_err), g_err);
    RC_CHECK(decode_load_cuda(&gpu, TARGET, capture, 2, MAX_CTX, 16, g_err, sizeof g_err), g_err);
    test_target(&cpu, &gpu);
    time_extends(&gpu);
    decode_free_cuda(&gpu);
    decode_free(&cpu);
    return gte_end("gpu_test_eval_target");
}
