/* gpu_test_eval_rows: (f) of the CUDA eval checks (gpu_test_eval.h): the whole target:
 * a k-row extend == k one-row extends bitwise (k = 16, 5), with and without CUDA graphs,
 * separate kernels and several fused sequences (fused 1, the residual bit, q/k append +
 * residual, the default), and graph replays == eager launches bitwise; the default and
 * each bit-exact fusion == separate kernels bitwise (logits, features, greedy tokens); under
 * every linear kernel variant, each attention warp count, each column-tile setting and the
 * small kernels launched plainly; extends of 17, 40 and 64 rows with the linear kernels in
 * blocks of 32 / 16 / 8 rows == one block of 64, bitwise (chunk-major activations).
 * Without a GPU: SKIPPED (77). A watchdog fails the test instead of hanging. */
#include "gpu_test_eval.h"

/* f. The bit-exact fusions on the whole target: every extend (a 16-row verify, a 5-row
 * one with 2 greedy rows, single rows) gives the same logits, features and greedy tokens
 * under each of them as under the separate kernels, graphs and eager. */
static void test_exact_fusions(decode_model_cuda *gpu)
{
    int V = gpu->tm.V, fd = gpu->n_capture * gpu->tm.d, P = rnd(20, 200);
    int32_t *tok = xmalloc(sizeof(int32_t) * (P + 80)), nx[16];
    for (int i = 0; i < P + 80; i++)
        tok[i] = rnd(0, V - 1);
    static const int seqs[] = {DECODE_FUSED_SEPARATE,
                               DECODE_FUSED_DEFAULT,
                               DECODE_FUSE_QK_APPEND | DECODE_FUSE_GLU,
                               DECODE_FUSE_NORM,
                               DECODE_FUSE_ARGMAX | DECODE_FUSE_GLU,
                               DECODE_FUSE_QK_APPEND | DECODE_FUSE_QK_TAIL,
                               DECODE_FUSED_DEFAULT | DECODE_FUSE_QK_TAIL,
                               DECODE_FUSE_ARGMAX_SPLIT,
                               DECODE_FUSED_DEFAULT | DECODE_FUSE_ARGMAX,
                               DECODE_FUSED_DEFAULT | DECODE_FUSE_NORM,
                               DECODE_FUSED_DEFAULT ^ DECODE_FUSE_XC,
                               DECODE_FUSE_GLU | DECODE_FUSE_XC};
    /* (40 rows: chunk-major activations from DECODE_XC_MIN_ROWS rows) */
    static const int steps[][2] = {{16, 16}, {5, 2}, {1, 1}, {1, 1}, {2, 0}, {1, 1}, {40, 3}};
    const int ns = sizeof steps / sizeof steps[0];
    float *lref = xmalloc(sizeof(float) * 16 * (size_t)V * ns), *fref = xmalloc(sizeof(float) * 64 * (size_t)fd * ns);
    float *lx = xmalloc(sizeof(float) * 16 * (size_t)V), *fx = xmalloc(sizeof(float) * 64 * (size_t)fd);
    int32_t *tref = xmalloc(sizeof(int32_t) * 16 * ns);
    long bad = 0, runs = 0;
    for (size_t si = 0; si < sizeof seqs / sizeof seqs[0]; si++)
        for (int graphs = 1; graphs >= 0; graphs--) {
            gpu->fused = seqs[si];
            gpu->use_graphs = graphs;
            decode_drop_graphs_cuda(gpu);
            decode_reset_cuda(gpu);
            RC_CHECK(decode_extend_cuda(gpu, tok, P, 1, nx, g_err, sizeof g_err), g_err);
            for (int j = 0, at = P; j < ns; at += steps[j][0], j++) {
                int k = steps[j][0], nn = steps[j][1];
                RC_CHECK(decode_extend_cuda(gpu, tok + at, k, nn, nx, g_err, sizeof g_err), g_err);
                RC_CHECK(decode_logits_to_host_cuda(gpu, lx, g_err, sizeof g_err), g_err);
                RC_CHECK(decode_feats_to_host_cuda(gpu, k, fx, g_err, sizeof g_err), g_err);
                float *lr = lref + (size_t)j * 16 * V, *fr = fref + (size_t)j * 64 * fd;
                int32_t *tr = tref + j * 16;
                if (si == 0 && graphs == 1) {
                    memcpy(lr, lx, sizeof(float) * (size_t)nn * V), memcpy(fr, fx, sizeof(float) * (size_t)k * fd);
                    memcpy(tr, nx, sizeof(int32_t) * nn);
                    continue;
                }
                int ok = !memcmp(lr, lx, sizeof(float) * (size_t)nn * V) &&
                         !memcmp(fr, fx, sizeof(float) * (size_t)k * fd) && !memcmp(tr, nx, sizeof(int32_t) * nn);
                if (!ok && bad < 4)
                    printf("    (f) fused %d, graphs %d, step %d (%d rows, %d greedy): differs from the separate "
                           "kernels\n",
                           seqs[si], graphs, j, k, nn);
                bad += !ok, runs++;
            }
        }
    printf("%s target: the bit-exact fusions (SwiGLU epilogue, add + RMSNorm tail, argmax in lm_head, q/k tail, "
           "chunk-major activations, and together) == separate kernels bitwise in %ld of %ld extends (logits, "
           "features, greedy tokens; graphs "
           "and eager)\n",
           bad ? "FAIL" : "PASS", runs - bad, runs);
    g_fail += bad > 0;
    gpu->use_graphs = 1;
    gpu->fused = DECODE_FUSED_DEFAULT;
    decode_drop_graphs_cuda(gpu);
    free(tok), free(lref), free(fref), free(lx), free(fx), free(tref);
}

/* f. The whole target, row independence and graphs: after a prefill, one extend of k
 * tokens with the logits of every row equals k single-token extends bit for bit (k = 16
 * and 5), with CUDA graphs and without, and the graph and eager runs agree bitwise. */
static void test_rows_and_graphs(decode_model_cuda *gpu)
{
    int V = gpu->tm.V, P = rnd(20, 200), k = 16;
    int32_t *tok = xmalloc(sizeof(int32_t) * (P + k)), next[16];
    for (int i = 0; i < P + k; i++)
        tok[i] = rnd(0, V - 1);
    float *blk = xmalloc(sizeof(float) * (size_t)k * V), *one = xmalloc(sizeof(float) * (size_t)k * V);
    float *ref = xmalloc(sizeof(float) * (size_t)k * V);
    static const int seqs[] = {0,
                               1,
                               DECODE_FUSE_RESIDUAL,
                               DECODE_FUSE_QK_APPEND | DECODE_FUSE_RESIDUAL,
                               DECODE_FUSED_DEFAULT,
                               DECODE_FUSED_DEFAULT ^ DECODE_FUSE_XC,
                               DECODE_FUSE_QK_APPEND | DECODE_FUSE_RESIDUAL | DECODE_FUSE_GLU | DECODE_FUSE_XC};
    for (size_t si = 0; si < sizeof seqs / sizeof seqs[0]; si++)
        for (int graphs = 1; graphs >= 0; graphs--) {
            int fused = seqs[si];
            gpu->use_graphs = graphs;
            gpu->fused = fused;
            decode_drop_graphs_cuda(gpu); /* graphs hold the kernels they were captured with */
            for (int kk = 16; kk >= 5; kk -= 11) {
                decode_reset_cuda(gpu);
                RC_CHECK(decode_extend_cuda(gpu, tok, P, 1, next, g_err, sizeof g_err), g_err);
                RC_CHECK(decode_extend_cuda(gpu, tok + P, kk, kk, next, g_err, sizeof g_err), g_err);
                RC_CHECK(decode_logits_to_host_cuda(gpu, blk, g_err, sizeof g_err), g_err);
                decode_truncate_cuda(gpu, P);
                for (int i = 0; i < kk; i++) {
                    RC_CHECK(decode_extend_cuda(gpu, tok + P + i, 1, 1, next, g_err, sizeof g_err), g_err);
                    RC_CHECK(decode_logits_to_host_cuda(gpu, one + (size_t)i * V, g_err, sizeof g_err), g_err);
                }
                int same = memcmp(blk, one, sizeof(float) * (size_t)kk * V) == 0;
                printf("%s target: a %d-row extend == %d one-row extends bitwise (graphs %s, kernels fused %d, prompt "
                       "%d)\n",
                       same ? "PASS" : "FAIL", kk, kk, graphs ? "on" : "off", fused, P);
                g_fail += !same;
            }
            if (graphs)
                memcpy(ref, one, sizeof(float) * 5 * V);
            else {
                int same = memcmp(ref, one, sizeof(float) * 5 * V) == 0;
                printf("%s target: graph replays == eager launches bitwise (5 steps, kernels fused %d)\n",
                       same ? "PASS" : "FAIL", fused);
                g_fail += !same;
            }
        }
    gpu->use_graphs = 1;
    gpu->fused = DECODE_FUSED_DEFAULT;
    decode_drop_graphs_cuda(gpu);
    free(tok), free(blk), free(one), free(ref);
}

/* f. The whole target with the linear kernels' rows in blocks of 32, 16 and 8
 * (decode_linear_rows_block_cuda; at most 64 a block, the default, leaves them one block a
 * column tile): after a prefill, extends of 17, 40 and 64 rows (every linear layer of the
 * extend split over 1..8 blocks a tile; the lm_head takes the n_next <= 16 greedy rows, so
 * it is not split) give the same logits, features (every row) and greedy tokens, bit for
 * bit, as rows block 64; for the default kernel sequence (chunk-major activations) and the
 * row-major one, graphs on and off. */
static void test_rows_blocks(decode_model_cuda *gpu)
{
    int V = gpu->tm.V, fd = gpu->n_capture * gpu->tm.d, P = rnd(20, 200);
    static const int steps[][2] = {{17, 16}, {40, 3}, {64, 16}};
    static const int rows_blk[] = {64, 32, 16, 8};
    const int ns = DF_ARRAY_LEN(steps), rb_dflt = decode_linear_rows_block_cuda(-1);
    int32_t *tok = xmalloc(sizeof(int32_t) * (size_t)(P + 17 + 40 + 64)), nx[16], tref[3][16];
    for (int i = 0; i < P + 17 + 40 + 64; i++)
        tok[i] = rnd(0, V - 1);
    float *lref = xmalloc(sizeof(float) * 16 * (size_t)V * ns), *fref = xmalloc(sizeof(float) * 64 * (size_t)fd * ns);
    float *lx = xmalloc(sizeof(float) * 16 * (size_t)V), *fx = xmalloc(sizeof(float) * 64 * (size_t)fd);
    static const int seqs[] = {DECODE_FUSED_DEFAULT, DECODE_FUSED_DEFAULT ^ DECODE_FUSE_XC};
    long bad = 0, runs = 0;
    for (int ri = 0; ri < 4; ri++)
        for (size_t si = 0; si < DF_ARRAY_LEN(seqs); si++)
            for (int graphs = 1; graphs >= 0; graphs--) {
                decode_linear_rows_block_cuda(rows_blk[ri]);
                gpu->fused = seqs[si];
                gpu->use_graphs = graphs;
                decode_drop_graphs_cuda(gpu); /* graphs keep the launches they were captured with */
                decode_reset_cuda(gpu);
                RC_CHECK(decode_extend_cuda(gpu, tok, P, 1, nx, g_err, sizeof g_err), g_err);
                for (int j = 0, at = P; j < ns; at += steps[j][0], j++) {
                    int k = steps[j][0], nn = steps[j][1];
                    RC_CHECK(decode_extend_cuda(gpu, tok + at, k, nn, nx, g_err, sizeof g_err), g_err);
                    RC_CHECK(decode_logits_to_host_cuda(gpu, lx, g_err, sizeof g_err), g_err);
                    RC_CHECK(decode_feats_to_host_cuda(gpu, k, fx, g_err, sizeof g_err), g_err);
                    float *lr = lref + (size_t)j * 16 * V, *fr = fref + (size_t)j * 64 * fd;
                    if (ri == 0 && si == 0 && graphs == 1) {
                        memcpy(lr, lx, sizeof(float) * (size_t)nn * V), memcpy(fr, fx, sizeof(float) * (size_t)k * fd);
                        memcpy(tref[j], nx, sizeof(int32_t) * nn);
                        continue;
                    }
                    int ok = !memcmp(lr, lx, sizeof(float) * (size_t)nn * V) &&
                             !memcmp(fr, fx, sizeof(float) * (size_t)k * fd) &&
                             !memcmp(tref[j], nx, sizeof(int32_t) * nn);
                    if (!ok && bad < 4)
                        printf("    (f) rows block %d, fused %d, graphs %d: the %d-row extend differs from rows block "
                               "64\n",
                               rows_blk[ri], seqs[si], graphs, k);
                    bad += !ok, runs++;
                }
            }
    printf("%s target: extends of 17, 40 and 64 rows with the linear kernels in blocks of 32 / 16 / 8 rows == one "
           "block of 64 bitwise in %ld of %ld (logits, features, greedy tokens; chunk-major and row-major, graphs and "
           "eager)\n",
           bad ? "FAIL" : "PASS", runs - bad, runs);
    g_fail += bad > 0;
    decode_linear_rows_block_cuda(rb_dflt);
    gpu->use_graphs = 1;
    gpu->fused = DECODE_FUSED_DEFAULT;
    decode_drop_graphs_cuda(gpu);
    free(tok), free(lref), free(fref), free(lx), free(fx);
}

int main(void)
{
    gte_begin(300);
    int capture[2] = {1, 3};
    decode_model_cuda gpu;
    RC_CHECK(decode_load_cuda(&gpu, TARGET, capture, 2, MAX_CTX, 16, g_err, sizeof g_err), g_err);
    /* under every kernel variant of the small-row linear layer */
    int dflt_variant = decode_linear_variant_cuda(-1);
    for (int v = 0; v < DECODE_LINEAR_VARIANTS; v++) {
        decode_linear_variant_cuda(v);
        printf("-- linear kernel variant %d (%s)%s\n", v, decode_linear_variant_name_cuda(v),
               v == dflt_variant ? ", the default" : "");
        decode_drop_graphs_cuda(&gpu);
        test_rows_and_graphs(&gpu);
        test_exact_fusions(&gpu);
    }
    decode_linear_variant_cuda(dflt_variant);
    decode_drop_graphs_cuda(&gpu);
    test_rows_blocks(&gpu);
    /* with the other column-tile settings (the same bits) */
    for (int ct = 1; ct <= 4; ct++) {
        if (ct == decode_linear_cols_cuda(-1))
            continue;
        int old_c = decode_linear_cols_cuda(ct);
        printf("-- %d column tiles a block\n", decode_linear_cols_cuda(-1));
        decode_drop_graphs_cuda(&gpu);
        test_rows_and_graphs(&gpu);
        test_exact_fusions(&gpu);
        decode_linear_cols_cuda(old_c);
    }
    /* with the small kernels launched plainly (the same bits) */
    {
        int old_p = decode_pdl_small_cuda(!decode_pdl_small_cuda(-1));
        printf("-- small kernels %s\n", decode_pdl_small_cuda(-1) ? "as PDL dependents" : "launched plainly");
        decode_drop_graphs_cuda(&gpu);
        test_exact_fusions(&gpu);
        decode_pdl_small_cuda(old_p);
    }
    /* under the other attention warp counts (another split of the keys) */
    for (int aw = 4; aw <= 16; aw *= 2) {
        if (aw == decode_attention_warps_cuda(-1))
            continue;
        int old_w = decode_attention_warps_cuda(aw);
        printf("-- attention %d warps a block\n", aw);
        decode_drop_graphs_cuda(&gpu);
        test_rows_and_graphs(&gpu);
        test_exact_fusions(&gpu);
        decode_attention_warps_cuda(old_w);
    }
    decode_free_cuda(&gpu);
    return gte_end("gpu_test_eval_rows");
}
