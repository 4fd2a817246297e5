/* gpu_test_eval_kernels: (e) and (i) of the CUDA eval checks (gpu_test_eval.h):
 *   e. (under every variant of decode_linear_variant_cuda)
 *      decode_linear_rows_cuda vs a float64 reference (rel L2 < 1e-4), and bitwise row
 *      independence: rows of a T-row call (T = 1..64, any offset) == the 64-row call's;
 *      decode_linear_swiglu_rows_cuda == nn_swiglu_cuda + decode_linear_rows_cuda bitwise;
 *      the bit-exact fused kernels (SwiGLU epilogue, residual + add_rmsnorm tail, argmax
 *      in the lm_head) == the separate kernels they replace, bitwise, 1..64 rows; two
 *      column tiles a block == one.
 *   i. chunk-major activations: every kernel that writes or reads them == its row-major
 *      call bitwise, 1..64 rows (64 itself included); the linear and gate/up kernels also in
 *      blocks of 8..32 rows (decode_linear_rows_block_cuda) in both layouts, a gate/up shape
 *      that takes the two-tile chunk-major kernel at 9..16 rows (against one tile a block),
 *      and the fused epilogues (argmax, residual + norm tail, q/k tail) split over blocks of
 *      8..32 rows == one block a tile. (The whole target runs chunk-major in
 *      gpu_test_eval_rows and gpu_test_eval_batch.)
 * The kernels get random inputs of their own; the tiny target is loaded first, as when
 * these ran inside the one gpu_test_eval program (the same CUDA context and settings).
 * Without a GPU: SKIPPED (77). A watchdog fails the test instead of hanging. */
#include "gpu_test_eval.h"

/* e. decode_linear_rows_cuda: against a float64 reference of the bf16 inputs, and row
 * independence bit for bit: rows r0..r0+T-1 of a T-row call (T = 1..64, any offset) equal
 * the same rows of the 64-row call. Shapes cover the 16-byte path (n_in % 8 == 0, also
 * with n_in % 32 != 0), the element path (n_in % 8 != 0) and a partial last column tile. */
static void test_linear_rows(void)
{
    static const int shapes[][3] = {{2048, 300, 0}, {128, 1000, 1}, {200, 77, 0}, {100, 50, 1}, {6144, 64, 0}};
    const int MT = DECODE_LINEAR_MAX_ROWS;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int K = shapes[si][0], N = shapes[si][1], with_bias = shapes[si][2];
        size_t nx = (size_t)MT * K, nw = (size_t)N * K;
        uint16_t *hx = xmalloc(2 * nx), *hw = xmalloc(2 * nw), *hb = xmalloc(2 * (size_t)N);
        for (size_t i = 0; i < nx; i++)
            hx[i] = safetensors_f32_to_bf16((float)(df_rng_uniform(&g_rng) * 2 - 1));
        for (size_t i = 0; i < nw; i++)
            hw[i] = safetensors_f32_to_bf16((float)((df_rng_uniform(&g_rng) * 2 - 1) * 0.05));
        for (int i = 0; i < N; i++)
            hb[i] = safetensors_f32_to_bf16((float)(df_rng_uniform(&g_rng) - 0.5));
        nn_bf16_cuda *dx, *dw, *db, *dob;
        float *dall, *dpart;
        CUDA_CHECK(cudaMalloc((void **)&dx, 2 * nx));
        CUDA_CHECK(cudaMalloc((void **)&dw, 2 * nw));
        CUDA_CHECK(cudaMalloc((void **)&db, 2 * (size_t)N));
        CUDA_CHECK(cudaMalloc((void **)&dall, sizeof(float) * MT * N));
        CUDA_CHECK(cudaMalloc((void **)&dpart, sizeof(float) * MT * N));
        CUDA_CHECK(cudaMalloc((void **)&dob, 2 * (size_t)MT * N));
        CUDA_CHECK(cudaMemcpy(dx, hx, 2 * nx, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(dw, hw, 2 * nw, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(db, hb, 2 * (size_t)N, cudaMemcpyHostToDevice));
        const nn_bf16_cuda *bias = with_bias ? db : NULL;
        float *all = xmalloc(sizeof(float) * MT * N), *part = xmalloc(sizeof(float) * MT * N);
        uint16_t *ob = xmalloc(2 * (size_t)MT * N);
        CUDA_CHECK(cudaMemset(dall, 0xff, sizeof(float) * MT * N)); /* NaN: an unwritten element fails */
        RC_CHECK(decode_linear_rows_cuda(dall, 1, dx, dw, bias, MT, K, N, 0, g_err, sizeof g_err), g_err);
        CUDA_CHECK(cudaMemcpy(all, dall, sizeof(float) * MT * N, cudaMemcpyDeviceToHost));
        double num = 0, den = 0;
        for (int t = 0; t < MT; t++)
            for (int n = 0; n < N; n++) {
                double r = with_bias ? safetensors_bf16_to_f32(hb[n]) : 0;
                for (int k = 0; k < K; k++)
                    r += (double)safetensors_bf16_to_f32(hx[(size_t)t * K + k]) *
                         safetensors_bf16_to_f32(hw[(size_t)n * K + k]);
                double e = all[(size_t)t * N + n] - r;
                num += e * e, den += r * r;
            }
        char what[96];
        snprintf(what, sizeof what, "linear_rows %d -> %d%s vs float64", K, N, with_bias ? " + bias" : "");
        double rel = sqrt(num / (den > 0 ? den : 1));
        int ok = rel <= 1e-4;
        printf("%s %s: rel_l2_err=%.3g (limit 1e-4)\n", ok ? "PASS" : "FAIL", what, rel);
        g_fail += !ok;
        long bad = 0, calls = 0;
        for (int T = 1; T <= MT; T += (T < 18 ? 1 : 7)) {
            int r0 = rnd(0, MT - T);
            CUDA_CHECK(cudaMemset(dpart, 0xff, sizeof(float) * MT * N));
            RC_CHECK(decode_linear_rows_cuda(dpart, 1, dx + (size_t)r0 * K, dw, bias, T, K, N, 0, g_err, sizeof g_err),
                     g_err);
            CUDA_CHECK(cudaMemcpy(part, dpart, sizeof(float) * T * N, cudaMemcpyDeviceToHost));
            bad += memcmp(part, all + (size_t)r0 * N, sizeof(float) * T * N) != 0;
            calls++;
        }
        RC_CHECK(decode_linear_rows_cuda(dob, 0, dx, dw, bias, MT, K, N, 0, g_err, sizeof g_err), g_err);
        CUDA_CHECK(cudaMemcpy(ob, dob, 2 * (size_t)MT * N, cudaMemcpyDeviceToHost));
        long bad16 = 0;
        for (size_t i = 0; i < (size_t)MT * N; i++)
            bad16 += ob[i] != safetensors_f32_to_bf16(all[i]);
        printf("%s %s: %ld of %ld calls of 1..%d rows differ bitwise from the 64-row call; bf16 output != "
               "bf16(fp32 output) at %ld elements\n",
               bad || bad16 ? "FAIL" : "PASS", what, bad, calls, MT, bad16);
        g_fail += bad > 0 || bad16 > 0;
        /* SwiGLU inside the loads == nn_swiglu_cuda then the plain kernel, bitwise, at 64 rows
         * and at 1..16 rows: x as the gate/up activation of 32 rows [32, 2K] */
        if (K % 2 == 0) {
            int Ih = K / 2, R = 32;
            nn_bf16_cuda *dh, *dw2;
            float *d1, *d2;
            CUDA_CHECK(cudaMalloc((void **)&dh, 2 * (size_t)R * Ih));
            CUDA_CHECK(cudaMalloc((void **)&dw2, 2 * (size_t)N * Ih));
            CUDA_CHECK(cudaMalloc((void **)&d1, sizeof(float) * R * N));
            CUDA_CHECK(cudaMalloc((void **)&d2, sizeof(float) * R * N));
            CUDA_CHECK(cudaMemcpy(dw2, hw, 2 * (size_t)N * Ih, cudaMemcpyHostToDevice));
            char serr[256] = "";
            RC_CHECK(nn_swiglu_cuda(dh, dx, R, Ih, 0, serr, sizeof serr), serr);
            RC_CHECK(decode_linear_rows_cuda(d1, 1, dh, dw2, bias, R, Ih, N, 0, g_err, sizeof g_err), g_err);
            long sbad = 0;
            for (int T = 1; T <= R; T += (T < 16 ? 1 : 16)) {
                int r0 = T == R ? 0 : rnd(0, R - T);
                CUDA_CHECK(cudaMemset(d2, 0xff, sizeof(float) * R * N));
                RC_CHECK(decode_linear_swiglu_rows_cuda(d2, 1, dx + (size_t)r0 * K, dw2, bias, T, Ih, N, 0, g_err,
                                                        sizeof g_err),
                         g_err);
                CUDA_CHECK(cudaMemcpy(part, d2, sizeof(float) * T * N, cudaMemcpyDeviceToHost));
                CUDA_CHECK(cudaMemcpy(all, d1 + (size_t)r0 * N, sizeof(float) * T * N, cudaMemcpyDeviceToHost));
                sbad += memcmp(part, all, sizeof(float) * T * N) != 0;
            }
            printf("%s linear_swiglu_rows %d -> %d: %ld calls differ bitwise from nn_swiglu_cuda + linear_rows\n",
                   sbad ? "FAIL" : "PASS", Ih, N, sbad);
            g_fail += sbad > 0;
            cudaFree(dh), cudaFree(dw2), cudaFree(d1), cudaFree(d2);
        }
        cudaFree(dx), cudaFree(dw), cudaFree(db), cudaFree(dall), cudaFree(dpart), cudaFree(dob);
        free(hx), free(hw), free(hb), free(all), free(part), free(ob);
    }
}

/* bf16 device copy of n uniform values in [-scale, scale] (host copy in *h when h). */
static nn_bf16_cuda *rand_bf16_dev(size_t n, double scale, uint16_t **h)
{
    uint16_t *hh = xmalloc(2 * n);
    for (size_t i = 0; i < n; i++)
        hh[i] = safetensors_f32_to_bf16((float)((df_rng_uniform(&g_rng) * 2 - 1) * scale));
    nn_bf16_cuda *d;
    CUDA_CHECK(cudaMalloc((void **)&d, 2 * n));
    CUDA_CHECK(cudaMemcpy(d, hh, 2 * n, cudaMemcpyHostToDevice));
    if (h)
        *h = hh;
    else
        free(hh);
    return d;
}

static float *rand_f32_dev(size_t n, double center, double scale)
{
    float *hh = xmalloc(sizeof(float) * n), *d;
    for (size_t i = 0; i < n; i++)
        hh[i] = (float)(center + (df_rng_uniform(&g_rng) * 2 - 1) * scale);
    CUDA_CHECK(cudaMalloc((void **)&d, sizeof(float) * n));
    CUDA_CHECK(cudaMemcpy(d, hh, sizeof(float) * n, cudaMemcpyHostToDevice));
    free(hh);
    return d;
}

/* 1 when n bytes of device a and b are equal. */
static int dev_same(const void *a, const void *b, size_t n)
{
    char *ha = xmalloc(n ? n : 1), *hb = xmalloc(n ? n : 1);
    CUDA_CHECK(cudaMemcpy(ha, a, n, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hb, b, n, cudaMemcpyDeviceToHost));
    int same = memcmp(ha, hb, n) == 0;
    free(ha), free(hb);
    return same;
}

/* e. The bit-exact fused kernels against the separate ones they replace, bit for bit, at
 * T = 1..32 rows (any offset), many calls in a row (the epilogue scratch must come back to
 * zero after each, or the next call's tail never runs):
 *   decode_linear_glu_rows_cuda == decode_linear_rows_cuda (gu) + nn_swiglu_cuda;
 *   decode_linear_residual_rows_cuda == decode_linear_rows_cuda (y) + nn_add_rmsnorm_cuda
 *     (x, the normalised rows, the capture; the norm from row 0 and from a later row);
 *   decode_linear_argmax_rows_cuda == decode_linear_rows_cuda + decode_argmax_rows_cuda
 *     (logits and indices; weight rows repeated so that logits tie);
 *   decode_linear_qk_rows_cuda == decode_linear_rows_cuda + decode_qk_norm_rope_append_cuda
 *     (qkv, both caches; positions from p0 and from a device base; with and without norms).
 * Shapes: both warp counts of the tuned variant (narrow / wide), n_in % 8 != 0, each
 * thread count of the norm (d >= 2048, >= 512, less) and d % 4 != 0. */
static void test_fused_kernels(void)
{
    const int R = DECODE_EPI_MAX_ROWS;
    int32_t *sync;
    CUDA_CHECK(cudaMalloc((void **)&sync, DECODE_EPI_SYNC_BYTES));
    CUDA_CHECK(cudaMemset(sync, 0, DECODE_EPI_SYNC_BYTES));
    /* GLU: (n_in, I, bias) */
    static const int gs[][3] = {{2048, 96, 0}, {128, 512, 1}, {200, 40, 1}, {64, 4096, 0}};
    for (size_t si = 0; si < sizeof gs / sizeof gs[0]; si++) {
        int K = gs[si][0], I = gs[si][1];
        nn_bf16_cuda *x = rand_bf16_dev((size_t)R * K, 1.0, NULL), *w = rand_bf16_dev((size_t)2 * I * K, 0.05, NULL);
        nn_bf16_cuda *b = gs[si][2] ? rand_bf16_dev((size_t)2 * I, 0.5, NULL) : NULL, *gu, *h1, *h2;
        CUDA_CHECK(cudaMalloc((void **)&gu, 2 * (size_t)R * 2 * I));
        CUDA_CHECK(cudaMalloc((void **)&h1, 2 * (size_t)R * I));
        CUDA_CHECK(cudaMalloc((void **)&h2, 2 * (size_t)R * I));
        RC_CHECK(decode_linear_rows_cuda(gu, 0, x, w, b, R, K, 2 * I, 0, g_err, sizeof g_err), g_err);
        RC_CHECK(nn_swiglu_cuda(h1, gu, R, I, 0, g_err, sizeof g_err), g_err);
        long bad = 0, calls = 0;
        for (int T = 1; T <= R; T += (T < 17 ? 1 : 5)) {
            int r0 = rnd(0, R - T);
            CUDA_CHECK(cudaMemset(h2, 0xff, 2 * (size_t)R * I));
            RC_CHECK(decode_linear_glu_rows_cuda(h2, x + (size_t)r0 * K, w, b, T, K, I, 0, g_err, sizeof g_err), g_err);
            bad += !dev_same(h2, h1 + (size_t)r0 * I, 2 * (size_t)T * I);
            calls++;
        }
        printf("%s linear_glu_rows %d -> 2 x %d%s: %ld of %ld calls differ bitwise from linear_rows + nn_swiglu_cuda\n",
               bad ? "FAIL" : "PASS", K, I, b ? " + bias" : "", bad, calls);
        g_fail += bad > 0;
        cudaFree(x), cudaFree(w), cudaFree(b), cudaFree(gu), cudaFree(h1), cudaFree(h2);
    }
    /* residual + norm tail: (n_in, d, bias) */
    static const int rs[][3] = {{512, 2048, 0}, {2048, 1024, 1}, {96, 300, 0}, {64, 50, 1}, {128, 4096, 0}};
    for (size_t si = 0; si < sizeof rs / sizeof rs[0]; si++) {
        int K = rs[si][0], d = rs[si][1];
        long cs = 3L * d + 4; /* a capture row stride like the features' (n_capture * d) */
        nn_bf16_cuda *in = rand_bf16_dev((size_t)R * K, 1.0, NULL), *w = rand_bf16_dev((size_t)d * K, 0.05, NULL);
        nn_bf16_cuda *b = rs[si][2] ? rand_bf16_dev((size_t)d, 0.5, NULL) : NULL, *y, *a1, *a2, *c1, *c2;
        float *x0 = rand_f32_dev((size_t)R * d, 0.0, 2.0), *nw = rand_f32_dev((size_t)d, 1.0, 0.2), *x1, *x2;
        CUDA_CHECK(cudaMalloc((void **)&y, 2 * (size_t)R * d));
        CUDA_CHECK(cudaMalloc((void **)&a1, 2 * (size_t)R * d));
        CUDA_CHECK(cudaMalloc((void **)&a2, 2 * (size_t)R * d));
        CUDA_CHECK(cudaMalloc((void **)&c1, 2 * (size_t)R * cs));
        CUDA_CHECK(cudaMalloc((void **)&c2, 2 * (size_t)R * cs));
        CUDA_CHECK(cudaMalloc((void **)&x1, sizeof(float) * R * d));
        CUDA_CHECK(cudaMalloc((void **)&x2, sizeof(float) * R * d));
        long bad = 0, calls = 0;
        for (int T = 1; T <= R; T += (T < 17 ? 1 : 5))
            for (int late = 0; late < 2; late++) {
                int r0 = rnd(0, R - T), n0 = late ? rnd(0, T) : 0; /* norm rows n0..T-1 */
                size_t xb = sizeof(float) * (size_t)T * d;
                CUDA_CHECK(cudaMemcpy(x1, x0 + (size_t)r0 * d, xb, cudaMemcpyDeviceToDevice));
                CUDA_CHECK(cudaMemcpy(x2, x0 + (size_t)r0 * d, xb, cudaMemcpyDeviceToDevice));
                CUDA_CHECK(cudaMemset(a1, 0, 2 * (size_t)R * d));
                CUDA_CHECK(cudaMemset(a2, 0xff, 2 * (size_t)R * d));
                CUDA_CHECK(cudaMemset(c1, 0, 2 * (size_t)R * cs));
                CUDA_CHECK(cudaMemset(c2, 0xff, 2 * (size_t)R * cs));
                RC_CHECK(decode_linear_rows_cuda(y, 0, in + (size_t)r0 * K, w, b, T, K, d, 0, g_err, sizeof g_err),
                         g_err);
                if (!late) {
                    RC_CHECK(nn_add_rmsnorm_cuda(x1, y, nw, a1, c1, cs, T, d, 1e-6f, 0, g_err, sizeof g_err), g_err);
                } else {
                    RC_CHECK(nn_add_rmsnorm_cuda(x1, y, NULL, NULL, c1, cs, T, d, 1e-6f, 0, g_err, sizeof g_err),
                             g_err);
                    RC_CHECK(nn_add_rmsnorm_cuda(x1 + (size_t)n0 * d, NULL, nw, a1, NULL, 0, T - n0, d, 1e-6f, 0, g_err,
                                                 sizeof g_err),
                             g_err);
                }
                decode_norm_tail tl = {nw, a2, n0, 1e-6f, c2, cs, sync};
                RC_CHECK(decode_linear_residual_rows_cuda(x2, in + (size_t)r0 * K, w, b, T, K, d, &tl, 0, g_err,
                                                          sizeof g_err),
                         g_err);
                /* captured rows: d elements at each stride (the gaps hold 0 / 0xff) */
                int cap_ok = 1;
                for (int t = 0; t < T && cap_ok; t++)
                    cap_ok = dev_same(c1 + (size_t)t * cs, c2 + (size_t)t * cs, 2 * (size_t)d);
                int ok = dev_same(x1, x2, xb) && dev_same(a1, a2, 2 * (size_t)(T - n0) * d) && cap_ok;
                if (!ok && bad < 3)
                    printf("    residual_rows %d -> %d: %d rows at %d, norm from row %d differ\n", K, d, T, r0, n0);
                bad += !ok, calls++;
            }
        printf("%s linear_residual_rows %d -> %d%s: %ld of %ld calls differ bitwise from linear_rows + "
               "nn_add_rmsnorm_cuda (residual, norm, capture)\n",
               bad ? "FAIL" : "PASS", K, d, b ? " + bias" : "", bad, calls);
        g_fail += bad > 0;
        cudaFree(in), cudaFree(w), cudaFree(b), cudaFree(y), cudaFree(a1), cudaFree(a2), cudaFree(c1), cudaFree(c2);
        cudaFree(x0), cudaFree(nw), cudaFree(x1), cudaFree(x2);
    }
    /* argmax: (n_in, V) */
    static const int as[][2] = {{128, 1000}, {256, 20000}, {72, 77}};
    for (size_t si = 0; si < sizeof as / sizeof as[0]; si++) {
        int K = as[si][0], V = as[si][1];
        uint16_t *hw;
        nn_bf16_cuda *x = rand_bf16_dev((size_t)R * K, 1.0, NULL), *w = rand_bf16_dev((size_t)V * K, 0.05, &hw);
        for (int i = 0; i < 8; i++) { /* ties: a row repeated later (and once earlier) */
            int src = rnd(0, V - 1), dst = rnd(0, V - 1);
            CUDA_CHECK(cudaMemcpy(w + (size_t)dst * K, hw + (size_t)src * K, 2 * (size_t)K, cudaMemcpyHostToDevice));
        }
        float *l1, *l2;
        int32_t *i1, *i2;
        CUDA_CHECK(cudaMalloc((void **)&l1, sizeof(float) * R * V));
        CUDA_CHECK(cudaMalloc((void **)&l2, sizeof(float) * R * V));
        CUDA_CHECK(cudaMalloc((void **)&i1, sizeof(int32_t) * R));
        CUDA_CHECK(cudaMalloc((void **)&i2, sizeof(int32_t) * R));
        long bad = 0, calls = 0;
        for (int T = 1; T <= R; T += (T < 17 ? 1 : 5)) {
            int r0 = rnd(0, R - T);
            CUDA_CHECK(cudaMemset(i2, 0xff, sizeof(int32_t) * R));
            RC_CHECK(decode_linear_rows_cuda(l1, 1, x + (size_t)r0 * K, w, NULL, T, K, V, 0, g_err, sizeof g_err),
                     g_err);
            RC_CHECK(decode_argmax_rows_cuda(i1, l1, T, V, 0, g_err, sizeof g_err), g_err);
            RC_CHECK(
                decode_linear_argmax_rows_cuda(l2, i2, x + (size_t)r0 * K, w, T, K, V, sync, 0, g_err, sizeof g_err),
                g_err);
            bad += !dev_same(l1, l2, sizeof(float) * (size_t)T * V) || !dev_same(i1, i2, sizeof(int32_t) * T);
            calls++;
        }
        printf("%s linear_argmax_rows %d -> %d: %ld of %ld calls differ from linear_rows + argmax_rows (logits "
               "bitwise, indices)\n",
               bad ? "FAIL" : "PASS", K, V, bad, calls);
        g_fail += bad > 0;
        cudaFree(x), cudaFree(w), cudaFree(l1), cudaFree(l2), cudaFree(i1), cudaFree(i2);
        free(hw);
    }
    /* the split argmax: random logits with planted ties (the maximum twice, later and
     * earlier), NaNs, a row of NaN only, a row of -inf only, -0 against +0 */
    static const int avs[] = {151936, 1000, 77};
    for (size_t vi = 0; vi < sizeof avs / sizeof avs[0]; vi++) {
        int V = avs[vi];
        float *hl = xmalloc(sizeof(float) * R * (size_t)V), *dl;
        for (int r = 0; r < R; r++) {
            float *row = hl + (size_t)r * V;
            for (int v = 0; v < V; v++)
                row[v] = (float)(df_rng_uniform(&g_rng) * 8 - 4);
            int a = rnd(0, V - 1), b2 = rnd(0, V - 1);
            row[a] = row[b2] = 5.0f; /* a tie at the top */
            row[rnd(0, V - 1)] = NAN;
            if (r == 3)
                for (int v = 0; v < V; v++)
                    row[v] = NAN;
            if (r == 4)
                for (int v = 0; v < V; v++)
                    row[v] = -INFINITY;
            if (r == 5) {
                for (int v = 0; v < V; v++)
                    row[v] = -1.0f;
                row[rnd(0, V - 1)] = -0.0f, row[rnd(0, V - 1)] = 0.0f;
            }
        }
        CUDA_CHECK(cudaMalloc((void **)&dl, sizeof(float) * R * (size_t)V));
        CUDA_CHECK(cudaMemcpy(dl, hl, sizeof(float) * R * (size_t)V, cudaMemcpyHostToDevice));
        int32_t *j1, *j2;
        CUDA_CHECK(cudaMalloc((void **)&j1, sizeof(int32_t) * R));
        CUDA_CHECK(cudaMalloc((void **)&j2, sizeof(int32_t) * R));
        long bad = 0, calls = 0;
        for (int rows = 1; rows <= R; rows += (rows < 8 ? 1 : 7)) {
            CUDA_CHECK(cudaMemset(j2, 0xff, sizeof(int32_t) * R));
            RC_CHECK(decode_argmax_rows_cuda(j1, dl, rows, V, 0, g_err, sizeof g_err), g_err);
            RC_CHECK(decode_argmax_split_rows_cuda(j2, dl, rows, V, sync, 0, g_err, sizeof g_err), g_err);
            bad += !dev_same(j1, j2, sizeof(int32_t) * rows), calls++;
        }
        printf("%s argmax_split_rows of %d (ties, NaN, all-NaN and all -inf rows, -0 / +0): %ld of %ld calls differ "
               "from argmax_rows\n",
               bad ? "FAIL" : "PASS", V, bad, calls);
        g_fail += bad > 0;
        cudaFree(dl), cudaFree(j1), cudaFree(j2);
        free(hl);
    }
    /* q/k tail: (n_in, H, KV, hd, norms) */
    static const int qs[][5] = {{128, 4, 2, 32, 1}, {256, 16, 8, 128, 1}, {200, 6, 3, 64, 0}};
    for (size_t si = 0; si < sizeof qs / sizeof qs[0]; si++) {
        int K = qs[si][0], H = qs[si][1], KV = qs[si][2], hd = qs[si][3], N = (H + 2 * KV) * hd, rows = 64;
        size_t cb = 2 * (size_t)rows * KV * hd;
        nn_bf16_cuda *x = rand_bf16_dev((size_t)R * K, 1.0, NULL), *w = rand_bf16_dev((size_t)N * K, 0.05, NULL);
        nn_bf16_cuda *q1, *q2, *k1, *k2, *v1, *v2;
        float *qn = qs[si][4] ? rand_f32_dev((size_t)hd, 1.0, 0.2) : NULL;
        float *kn = qs[si][4] ? rand_f32_dev((size_t)hd, 1.0, 0.2) : NULL,
              *inv = rand_f32_dev((size_t)hd / 2, 0.5, 0.5);
        int32_t *base, hb = rnd(0, 20);
        CUDA_CHECK(cudaMalloc((void **)&base, sizeof(int32_t)));
        CUDA_CHECK(cudaMemcpy(base, &hb, sizeof(int32_t), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMalloc((void **)&q1, 2 * (size_t)R * N));
        CUDA_CHECK(cudaMalloc((void **)&q2, 2 * (size_t)R * N));
        CUDA_CHECK(cudaMalloc((void **)&k1, cb));
        CUDA_CHECK(cudaMalloc((void **)&k2, cb));
        CUDA_CHECK(cudaMalloc((void **)&v1, cb));
        CUDA_CHECK(cudaMalloc((void **)&v2, cb));
        long bad = 0, calls = 0;
        for (int T = 1; T <= 8; T++)
            for (int with_base = 0; with_base < 2; with_base++) {
                int r0 = rnd(0, R - T), p0 = rnd(0, 20);
                const int32_t *bp = with_base ? base : NULL;
                CUDA_CHECK(cudaMemset(k1, 0, cb));
                CUDA_CHECK(cudaMemset(k2, 0, cb));
                CUDA_CHECK(cudaMemset(v1, 0, cb));
                CUDA_CHECK(cudaMemset(v2, 0, cb));
                RC_CHECK(decode_linear_rows_cuda(q1, 0, x + (size_t)r0 * K, w, NULL, T, K, N, 0, g_err, sizeof g_err),
                         g_err);
                RC_CHECK(decode_qk_norm_rope_append_cuda(q1, qn, kn, inv, k1, v1, T, H, KV, hd, 1e-6f, bp, p0, 0, g_err,
                                                         sizeof g_err),
                         g_err);
                decode_qk_tail qt = {H, KV, hd, qn, kn, inv, 1e-6f, k2, v2, bp, p0, sync};
                RC_CHECK(decode_linear_qk_rows_cuda(q2, x + (size_t)r0 * K, w, NULL, T, K, &qt, 0, g_err, sizeof g_err),
                         g_err);
                int ok = dev_same(q1, q2, 2 * (size_t)T * N) && dev_same(k1, k2, cb) && dev_same(v1, v2, cb);
                bad += !ok, calls++;
            }
        printf("%s linear_qk_rows %d -> heads %d/%d of %d%s: %ld of %ld calls differ bitwise from linear_rows + "
               "qk_norm_rope_append (qkv, K and V caches)\n",
               bad ? "FAIL" : "PASS", K, H, KV, hd, qn ? " (q/k norms)" : "", bad, calls);
        g_fail += bad > 0;
        cudaFree(x), cudaFree(w), cudaFree(q1), cudaFree(q2), cudaFree(k1), cudaFree(k2), cudaFree(v1), cudaFree(v2);
        cudaFree(qn), cudaFree(kn), cudaFree(inv), cudaFree(base);
    }
    cudaFree(sync);
}

/* e. Two column tiles a block (decode_linear_cols_cuda 2, 3 and 4) give the bits of one
 * tile a block: on a wide shape (n_in >= 4096) at 1..16 rows the plain kernel (bias), the
 * SwiGLU epilogue and the argmax one, with a partial last tile and an odd tile count (the
 * last block's second tile past the end); on a narrow shape of more tiles than the GPU
 * has SMs at 1..16 rows the plain kernel and the residual + norm tail. */
static void test_two_tiles(void)
{
    const int R = 64, K = 4096 + 8, N = 16 * 513 + 8, I = 8 * 513, Kn = 264, Nn = 16 * 200 + 8;
    int32_t *sync, *i1, *i2;
    CUDA_CHECK(cudaMalloc((void **)&sync, DECODE_EPI_SYNC_BYTES));
    CUDA_CHECK(cudaMemset(sync, 0, DECODE_EPI_SYNC_BYTES));
    nn_bf16_cuda *x = rand_bf16_dev((size_t)R * K, 1.0, NULL), *w = rand_bf16_dev((size_t)N * K, 0.05, NULL);
    nn_bf16_cuda *b = rand_bf16_dev((size_t)N, 0.5, NULL), *h1, *h2, *a1, *a2, *c1, *c2;
    float *o1, *o2, *x0 = rand_f32_dev((size_t)R * Nn, 0.0, 2.0), *nw = rand_f32_dev((size_t)Nn, 1.0, 0.2);
    CUDA_CHECK(cudaMalloc((void **)&o1, sizeof(float) * R * N));
    CUDA_CHECK(cudaMalloc((void **)&o2, sizeof(float) * R * N));
    CUDA_CHECK(cudaMalloc((void **)&h1, 2 * (size_t)R * I));
    CUDA_CHECK(cudaMalloc((void **)&h2, 2 * (size_t)R * I));
    CUDA_CHECK(cudaMalloc((void **)&a1, 2 * (size_t)R * Nn));
    CUDA_CHECK(cudaMalloc((void **)&a2, 2 * (size_t)R * Nn));
    CUDA_CHECK(cudaMalloc((void **)&c1, 2 * (size_t)R * Nn));
    CUDA_CHECK(cudaMalloc((void **)&c2, 2 * (size_t)R * Nn));
    CUDA_CHECK(cudaMalloc((void **)&i1, sizeof(int32_t) * R));
    CUDA_CHECK(cudaMalloc((void **)&i2, sizeof(int32_t) * R));
    long bad = 0, calls = 0;
    int old = decode_linear_cols_cuda(-1);
    for (int T = 1; T <= R; T += T < 17 ? 1 : 7)
        for (int ct = 2; ct <= 4; ct++) {
            int r0 = rnd(0, R - T);
            const nn_bf16_cuda *xt = x + (size_t)r0 * K;
            decode_linear_cols_cuda(1);
            RC_CHECK(decode_linear_rows_cuda(o1, 1, xt, w, b, T, K, N, 0, g_err, sizeof g_err), g_err);
            RC_CHECK(decode_linear_glu_rows_cuda(h1, xt, w, b, T, K, I, 0, g_err, sizeof g_err), g_err);
            decode_linear_cols_cuda(ct);
            CUDA_CHECK(cudaMemset(o2, 0xff, sizeof(float) * R * N));
            CUDA_CHECK(cudaMemset(h2, 0xff, 2 * (size_t)R * I));
            RC_CHECK(decode_linear_rows_cuda(o2, 1, xt, w, b, T, K, N, 0, g_err, sizeof g_err), g_err);
            RC_CHECK(decode_linear_glu_rows_cuda(h2, xt, w, b, T, K, I, 0, g_err, sizeof g_err), g_err);
            bad += !dev_same(o1, o2, sizeof(float) * (size_t)T * N) + !dev_same(h1, h2, 2 * (size_t)T * I);
            decode_linear_cols_cuda(1);
            RC_CHECK(decode_linear_argmax_rows_cuda(o1, i1, xt, w, T, K, N, sync, 0, g_err, sizeof g_err), g_err);
            decode_linear_cols_cuda(ct);
            CUDA_CHECK(cudaMemset(i2, 0xff, sizeof(int32_t) * R));
            RC_CHECK(decode_linear_argmax_rows_cuda(o2, i2, xt, w, T, K, N, sync, 0, g_err, sizeof g_err), g_err);
            bad += !dev_same(o1, o2, sizeof(float) * (size_t)T * N) + !dev_same(i1, i2, sizeof(int32_t) * T);
            calls += 4;
            if (T > 16)
                continue;
            /* narrow: x rows of Kn, weights the first Nn rows of w read as [Nn, Kn] */
            const nn_bf16_cuda *xn = x + (size_t)r0 * Kn;
            float *xa = o1, *xb = o2; /* residual rows [T, Nn] */
            decode_linear_cols_cuda(1);
            RC_CHECK(decode_linear_rows_cuda(o1, 1, xn, w, b, T, Kn, Nn, 0, g_err, sizeof g_err), g_err);
            decode_linear_cols_cuda(ct);
            CUDA_CHECK(cudaMemset(o2, 0xff, sizeof(float) * R * N));
            RC_CHECK(decode_linear_rows_cuda(o2, 1, xn, w, b, T, Kn, Nn, 0, g_err, sizeof g_err), g_err);
            bad += !dev_same(o1, o2, sizeof(float) * (size_t)T * Nn);
            CUDA_CHECK(cudaMemcpy(xa, x0, sizeof(float) * (size_t)T * Nn, cudaMemcpyDeviceToDevice));
            CUDA_CHECK(cudaMemcpy(xb, x0, sizeof(float) * (size_t)T * Nn, cudaMemcpyDeviceToDevice));
            decode_norm_tail t1 = {nw, a1, 0, 1e-6f, c1, Nn, sync}, t2 = {nw, a2, 0, 1e-6f, c2, Nn, sync};
            decode_linear_cols_cuda(1);
            RC_CHECK(decode_linear_residual_rows_cuda(xa, xn, w, b, T, Kn, Nn, &t1, 0, g_err, sizeof g_err), g_err);
            decode_linear_cols_cuda(ct);
            RC_CHECK(decode_linear_residual_rows_cuda(xb, xn, w, b, T, Kn, Nn, &t2, 0, g_err, sizeof g_err), g_err);
            bad += !dev_same(xa, xb, sizeof(float) * (size_t)T * Nn) + !dev_same(a1, a2, 2 * (size_t)T * Nn) +
                   !dev_same(c1, c2, 2 * (size_t)T * Nn);
            calls += 2;
        }
    decode_linear_cols_cuda(old);
    printf("%s linear kernels with two column tiles a block (settings 2, 3 and 4, 1..64 rows; %d -> %d: a partial last "
           "tile; "
           "SwiGLU 2 x %d: an odd tile count; plain + bias, SwiGLU epilogue, argmax; narrow %d -> %d: plain, "
           "residual + norm): %ld of %ld calls differ bitwise from one tile a block\n",
           bad ? "FAIL" : "PASS", K, N, I, Kn, Nn, bad, calls);
    g_fail += bad > 0;
    cudaFree(sync), cudaFree(i1), cudaFree(i2), cudaFree(x), cudaFree(w), cudaFree(b), cudaFree(h1), cudaFree(h2);
    cudaFree(o1), cudaFree(o2), cudaFree(a1), cudaFree(a2), cudaFree(c1), cudaFree(c2), cudaFree(x0), cudaFree(nw);
}

/* i. Chunk-major activations (decode_kernels_cuda.h): every producer and consumer of the
 * layout against its row-major call, bit for bit, at 1..64 rows:
 *   decode_linear_rows_xc_cuda (bf16, fp32 and residual-add outputs, with a bias) ==
 *     decode_linear_rows_cuda on the same rows row-major;
 *   decode_linear_glu_rows_xc_cuda == decode_linear_glu_rows_cuda, h read back in order;
 *   decode_attention_xc_cuda == decode_attention_cuda (the warp kernel at hd 64, the
 *     generic one at hd 48), out read back in order;
 *   nn_add_rmsnorm_xc_cuda == nn_add_rmsnorm_cuda (x, the capture, the norm in order),
 *     4-wide and element-wise;
 * the linear and gate/up kernels also with their rows in blocks of 32, 16 and 8
 * (decode_linear_rows_block_cuda) in both layouts, and the fused epilogues split that way
 * == one block a tile; and the bad shapes (a width not a multiple of 32) are -EINVAL. */
static void chunk_major(uint16_t *dst, const uint16_t *src, int T, int n) /* row-major -> chunk-major */
{
    for (int t = 0; t < T; t++)
        for (int k = 0; k < n; k++)
            dst[((size_t)(k / DECODE_XC_CHUNK) * T + t) * DECODE_XC_CHUNK + k % DECODE_XC_CHUNK] =
                src[(size_t)t * n + k];
}

/* 1 when device bf16 row-major a [T, n] equals device chunk-major b, element for element. */
static int same_chunked(const nn_bf16_cuda *a, const nn_bf16_cuda *b, int T, int n)
{
    size_t e = (size_t)T * n;
    uint16_t *ha = xmalloc(2 * e), *hb = xmalloc(2 * e), *hc = xmalloc(2 * e);
    CUDA_CHECK(cudaMemcpy(ha, a, 2 * e, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hb, b, 2 * e, cudaMemcpyDeviceToHost));
    chunk_major(hc, ha, T, n);
    int same = memcmp(hb, hc, 2 * e) == 0;
    free(ha), free(hb), free(hc);
    return same;
}

/* Device bf16 [T, n] random, and its chunk-major copy in *xc. */
static nn_bf16_cuda *rand_rows_both(int T, int n, nn_bf16_cuda **xc)
{
    uint16_t *h, *hc = xmalloc(2 * (size_t)T * n);
    nn_bf16_cuda *x = rand_bf16_dev((size_t)T * n, 1.0, &h);
    chunk_major(hc, h, T, n);
    CUDA_CHECK(cudaMalloc((void **)xc, 2 * (size_t)T * n));
    CUDA_CHECK(cudaMemcpy(*xc, hc, 2 * (size_t)T * n, cudaMemcpyHostToDevice));
    free(h), free(hc);
    return x;
}

/* The row counts (i) runs: 1..18 one by one, then every 7th, and exactly 64 (a batch of 4
 * verifies: the largest call, two reduction passes at 16 warps, 8 blocks a tile in blocks of
 * 8 rows). */
static int next_rows(int T)
{
    const int MT = DECODE_LINEAR_MAX_ROWS;
    return T < 18 ? T + 1 : T + 7 < MT || T == MT ? T + 7 : MT;
}

/* The variant called name (-1 when there is none). */
static int variant_named(const char *name)
{
    for (int v = 0; v < DECODE_LINEAR_VARIANTS; v++)
        if (!strcmp(decode_linear_variant_name_cuda(v), name))
            return v;
    return -1;
}

static void test_chunk_major(void)
{
    const int MT = DECODE_LINEAR_MAX_ROWS;
    long calls = 0, bad = 0;
    /* linear: n_in -> n_out, bias */
    /* (128 -> 4096: more 16-warp tiles than SMs, two tiles a block at 1..16 rows; 4096 -> 8192:
     * a wide shape with n_in >= 4096, two tiles a block at 9..16 rows) */
    static const int lin[][3] = {{2048, 300, 1}, {96, 1000, 0}, {6144, 64, 1}, {128, 4096, 1}, {4096, 8192, 0}};
    static const int rows_blk[] = {64, 32, 16, 8};
    const int rb_dflt = decode_linear_rows_block_cuda(-1);
    for (size_t si = 0; si < DF_ARRAY_LEN(lin); si++) {
        int K = lin[si][0], N = lin[si][1];
        nn_bf16_cuda *w = rand_bf16_dev((size_t)N * K, 0.05, NULL),
                     *b = lin[si][2] ? rand_bf16_dev(N, 0.5, NULL) : NULL;
        float *base = rand_f32_dev((size_t)MT * N, 0.0, 1.0), *o1, *o2;
        CUDA_CHECK(cudaMalloc((void **)&o1, sizeof(float) * MT * N));
        CUDA_CHECK(cudaMalloc((void **)&o2, sizeof(float) * MT * N));
        for (int T = 1; T <= MT; T = next_rows(T)) {
            nn_bf16_cuda *xc, *x = rand_rows_both(T, K, &xc);
            for (int of = 0; of <= 2; of++) {
                size_t ob = (of ? sizeof(float) : 2) * (size_t)T * N;
                decode_linear_rows_block_cuda(64);
                CUDA_CHECK(cudaMemcpy(o1, base, ob, cudaMemcpyDeviceToDevice)); /* of 2 adds to it */
                RC_CHECK(decode_linear_rows_cuda(o1, of, x, w, b, T, K, N, 0, g_err, sizeof g_err), g_err);
                /* chunk-major, then both layouts in blocks of fewer rows (17..64 rows) */
                for (int ri = 0; ri < (T > 16 ? 4 : 1); ri++)
                    for (int lay = ri ? 0 : 1; lay < 2; lay++) {
                        decode_linear_rows_block_cuda(rows_blk[ri]);
                        CUDA_CHECK(cudaMemcpy(o2, base, ob, cudaMemcpyDeviceToDevice));
                        if (lay)
                            RC_CHECK(decode_linear_rows_xc_cuda(o2, of, xc, w, b, T, K, N, 0, g_err, sizeof g_err),
                                     g_err);
                        else
                            RC_CHECK(decode_linear_rows_cuda(o2, of, x, w, b, T, K, N, 0, g_err, sizeof g_err), g_err);
                        int same = dev_same(o1, o2, ob);
                        if (!same && bad < 4)
                            printf("    (i) linear %d -> %d, %d rows, out_f32 %d, %s x, %d rows a block: differs\n", K,
                                   N, T, of, lay ? "chunk-major" : "row-major", rows_blk[ri]);
                        bad += !same, calls++;
                    }
            }
            cudaFree(x), cudaFree(xc);
        }
        decode_linear_rows_block_cuda(rb_dflt);
        cudaFree(w), cudaFree(b), cudaFree(base), cudaFree(o1), cudaFree(o2);
    }
    /* gate/up + SwiGLU: n_in -> 2 x I. Which kernel each shape reaches (the tuned variant,
     * forced here: 16 warps below 512 column tiles, else 8 with the prefetch above 8 rows;
     * GLU has I / 8 tiles):
     *   128 -> 2 x 384 (48 tiles) and 2048 -> 2 x 96 (12 tiles): 16 warps, one tile a block
     *     (fewer tiles than SMs, so no two-tile setting applies), 8..64 rows a block;
     *   4096 -> 2 x 4096 (512 tiles, n_in >= 4096): 8 warps, and at 9..16 rows two column
     *     tiles a block (the chunk-major two-tile kernel, lin_launch_rows' MC8 branch; column
     *     tiles forced to 2, the least setting that takes it); its reference is the row-major
     *     call with one tile a block (setting 1), so the two-tile kernel is checked in both
     *     layouts; at 17..64 rows one tile, 8 warps, in row blocks of 64..8.
     * Every shape: chunk-major under rows blocks 64..8 and row-major under 32..8 == the
     * row-major call in one block of 64 rows. */
    static const int glu[][2] = {{128, 384}, {2048, 96}, {4096, 4096}};
    const int v_tuned = variant_named("tuned"), old_v = decode_linear_variant_cuda(-1),
              old_cols = decode_linear_cols_cuda(-1);
    if (v_tuned < 0) {
        printf("FAIL (i) no linear kernel variant named tuned: the GLU shapes would not reach their kernels\n");
        g_fail++;
    }
    decode_linear_variant_cuda(v_tuned);
    for (size_t si = 0; si < DF_ARRAY_LEN(glu); si++) {
        int K = glu[si][0], I = glu[si][1], two = K >= 4096; /* two tiles a block at 9..16 rows */
        nn_bf16_cuda *w = rand_bf16_dev((size_t)2 * I * K, 0.05, NULL), *b = rand_bf16_dev(2 * (size_t)I, 0.5, NULL);
        nn_bf16_cuda *h1, *h2;
        CUDA_CHECK(cudaMalloc((void **)&h1, 2 * (size_t)MT * I));
        CUDA_CHECK(cudaMalloc((void **)&h2, 2 * (size_t)MT * I));
        for (int T = 1; T <= MT; T = next_rows(T)) {
            nn_bf16_cuda *xc, *x = rand_rows_both(T, K, &xc);
            decode_linear_rows_block_cuda(64);
            decode_linear_cols_cuda(two ? 1 : old_cols);
            RC_CHECK(decode_linear_glu_rows_cuda(h1, x, w, b, T, K, I, 0, g_err, sizeof g_err), g_err);
            decode_linear_cols_cuda(two ? 2 : old_cols);
            /* chunk-major in blocks of 64..8 rows, row-major in blocks of fewer than 64 (and,
             * for the two-tile shape, row-major with two tiles at 64) */
            for (int ri = 0; ri < (T > 16 ? 4 : 1); ri++)
                for (int lay = ri || two ? 0 : 1; lay < 2; lay++) {
                    decode_linear_rows_block_cuda(rows_blk[ri]);
                    CUDA_CHECK(cudaMemset(h2, 0xff, 2 * (size_t)T * I));
                    int same;
                    if (lay) {
                        RC_CHECK(decode_linear_glu_rows_xc_cuda(h2, xc, w, b, T, K, I, 0, g_err, sizeof g_err), g_err);
                        same = same_chunked(h1, h2, T, I);
                    } else {
                        RC_CHECK(decode_linear_glu_rows_cuda(h2, x, w, b, T, K, I, 0, g_err, sizeof g_err), g_err);
                        same = dev_same(h1, h2, 2 * (size_t)T * I);
                    }
                    if (!same && bad < 4)
                        printf("    (i) gate/up + SwiGLU %d -> 2 x %d, %d rows, %d rows a block: %s differs\n", K, I, T,
                               rows_blk[ri], lay ? "chunk-major" : "row-major");
                    bad += !same, calls++;
                }
            cudaFree(x), cudaFree(xc);
        }
        decode_linear_rows_block_cuda(rb_dflt);
        decode_linear_cols_cuda(old_cols);
        cudaFree(w), cudaFree(b), cudaFree(h1), cudaFree(h2);
    }
    /* the fused epilogues with a column tile's rows split over blocks (rows blocks 32, 16 and
     * 8 at 17..64 rows: 2..8 blocks a tile; each block folds its rows' argmax keys, and the
     * grid's last block hands out all T indices, or runs the residual's capture + norm tail
     * or the q/k norm + RoPE + cache append over all T rows) == the same call with one block
     * a tile (rows block 64), bitwise: logits and indices; x, the normalised rows (from row
     * 0 or a later one) and the capture; qkv and both caches. Argmax 256 -> 8200 (513 tiles:
     * 8 warps with the prefetch, a partial last tile, tied columns), residual 512 -> 2048
     * and q/k 128 -> heads 4/2 of 32 (16 warps, two reduction passes at 33..64 rows). */
    {
        const int Ka = 256, Va = 8200, Kr = 512, d = 2048, Kq = 128, H = 4, KV = 2, hd = 32, Nq = (H + 2 * KV) * hd;
        const int crows = 20 + 20 + MT; /* cache rows: p0 + *base + T */
        const long cs = 3L * d + 4;
        const size_t cb = 2 * (size_t)crows * KV * hd;
        int32_t *sync, *i1, *i2, *base, hb = rnd(0, 20);
        uint16_t *hwa;
        CUDA_CHECK(cudaMalloc((void **)&sync, DECODE_EPI_SYNC_BYTES));
        CUDA_CHECK(cudaMemset(sync, 0, DECODE_EPI_SYNC_BYTES));
        CUDA_CHECK(cudaMalloc((void **)&base, sizeof(int32_t)));
        CUDA_CHECK(cudaMemcpy(base, &hb, sizeof(int32_t), cudaMemcpyHostToDevice));
        nn_bf16_cuda *xa = rand_bf16_dev((size_t)MT * Ka, 1.0, NULL), *wa = rand_bf16_dev((size_t)Va * Ka, 0.05, &hwa);
        for (int i = 0; i < 8; i++) { /* tied columns */
            int src = rnd(0, Va - 1), dst = rnd(0, Va - 1);
            CUDA_CHECK(
                cudaMemcpy(wa + (size_t)dst * Ka, hwa + (size_t)src * Ka, 2 * (size_t)Ka, cudaMemcpyHostToDevice));
        }
        free(hwa);
        nn_bf16_cuda *xr = rand_bf16_dev((size_t)MT * Kr, 1.0, NULL), *wr = rand_bf16_dev((size_t)d * Kr, 0.05, NULL);
        nn_bf16_cuda *br = rand_bf16_dev((size_t)d, 0.5, NULL), *xq = rand_bf16_dev((size_t)MT * Kq, 1.0, NULL);
        nn_bf16_cuda *wq = rand_bf16_dev((size_t)Nq * Kq, 0.05, NULL), *a1, *a2, *c1, *c2, *q1, *q2, *k1, *k2, *v1, *v2;
        float *x0 = rand_f32_dev((size_t)MT * d, 0.0, 2.0), *nw = rand_f32_dev((size_t)d, 1.0, 0.2);
        float *qn = rand_f32_dev((size_t)hd, 1.0, 0.2), *kn = rand_f32_dev((size_t)hd, 1.0, 0.2);
        float *inv = rand_f32_dev((size_t)hd / 2, 0.5, 0.5), *l1, *l2, *x1, *x2;
        CUDA_CHECK(cudaMalloc((void **)&l1, sizeof(float) * MT * Va));
        CUDA_CHECK(cudaMalloc((void **)&l2, sizeof(float) * MT * Va));
        CUDA_CHECK(cudaMalloc((void **)&i1, sizeof(int32_t) * MT));
        CUDA_CHECK(cudaMalloc((void **)&i2, sizeof(int32_t) * MT));
        CUDA_CHECK(cudaMalloc((void **)&x1, sizeof(float) * MT * d));
        CUDA_CHECK(cudaMalloc((void **)&x2, sizeof(float) * MT * d));
        CUDA_CHECK(cudaMalloc((void **)&a1, 2 * (size_t)MT * d));
        CUDA_CHECK(cudaMalloc((void **)&a2, 2 * (size_t)MT * d));
        CUDA_CHECK(cudaMalloc((void **)&c1, 2 * (size_t)MT * cs));
        CUDA_CHECK(cudaMalloc((void **)&c2, 2 * (size_t)MT * cs));
        CUDA_CHECK(cudaMalloc((void **)&q1, 2 * (size_t)MT * Nq));
        CUDA_CHECK(cudaMalloc((void **)&q2, 2 * (size_t)MT * Nq));
        CUDA_CHECK(cudaMalloc((void **)&k1, cb));
        CUDA_CHECK(cudaMalloc((void **)&k2, cb));
        CUDA_CHECK(cudaMalloc((void **)&v1, cb));
        CUDA_CHECK(cudaMalloc((void **)&v2, cb));
        long ebad[3] = {0, 0, 0}, ecalls = 0;
        for (int T = 17; T <= MT; T = next_rows(T)) {
            int n0 = T & 1 ? rnd(1, T) : 0, p0 = rnd(0, 20); /* norm rows n0..T-1 */
            for (int ri = 0; ri < 4; ri++) {
                decode_linear_rows_block_cuda(rows_blk[ri]);
                float *l = ri ? l2 : l1, *xx = ri ? x2 : x1;
                int32_t *ix = ri ? i2 : i1;
                nn_bf16_cuda *a = ri ? a2 : a1, *cc = ri ? c2 : c1, *q = ri ? q2 : q1, *kc = ri ? k2 : k1,
                             *vc = ri ? v2 : v1;
                CUDA_CHECK(cudaMemset(l, 0xff, sizeof(float) * (size_t)T * Va));
                CUDA_CHECK(cudaMemset(ix, 0xff, sizeof(int32_t) * MT));
                CUDA_CHECK(cudaMemcpy(xx, x0, sizeof(float) * (size_t)T * d, cudaMemcpyDeviceToDevice));
                CUDA_CHECK(cudaMemset(a, 0xff, 2 * (size_t)MT * d));
                CUDA_CHECK(cudaMemset(cc, 0xff, 2 * (size_t)MT * cs));
                CUDA_CHECK(cudaMemset(q, 0xff, 2 * (size_t)MT * Nq));
                CUDA_CHECK(cudaMemset(kc, 0, cb));
                CUDA_CHECK(cudaMemset(vc, 0, cb));
                RC_CHECK(decode_linear_argmax_rows_cuda(l, ix, xa, wa, T, Ka, Va, sync, 0, g_err, sizeof g_err), g_err);
                decode_norm_tail tl = {nw, a, n0, 1e-6f, cc, cs, sync};
                RC_CHECK(decode_linear_residual_rows_cuda(xx, xr, wr, br, T, Kr, d, &tl, 0, g_err, sizeof g_err),
                         g_err);
                decode_qk_tail qt = {H, KV, hd, qn, kn, inv, 1e-6f, kc, vc, T & 1 ? base : NULL, p0, sync};
                RC_CHECK(decode_linear_qk_rows_cuda(q, xq, wq, NULL, T, Kq, &qt, 0, g_err, sizeof g_err), g_err);
                if (!ri)
                    continue;
                int cap_ok = 1;
                for (int t = 0; t < T && cap_ok; t++)
                    cap_ok = dev_same(c1 + (size_t)t * cs, c2 + (size_t)t * cs, 2 * (size_t)d);
                int ok[3] = {dev_same(l1, l2, sizeof(float) * (size_t)T * Va) && dev_same(i1, i2, sizeof(int32_t) * MT),
                             dev_same(x1, x2, sizeof(float) * (size_t)T * d) &&
                                 dev_same(a1, a2, 2 * (size_t)(T - n0) * d) && cap_ok,
                             dev_same(q1, q2, 2 * (size_t)T * Nq) && dev_same(k1, k2, cb) && dev_same(v1, v2, cb)};
                static const char *what[3] = {"argmax", "residual + norm tail", "q/k tail"};
                for (int e = 0; e < 3; e++) {
                    if (!ok[e] && ebad[0] + ebad[1] + ebad[2] < 4)
                        printf("    (i) fused %s, %d rows in blocks of %d: differs from one block a tile\n", what[e], T,
                               rows_blk[ri]);
                    ebad[e] += !ok[e];
                }
                ecalls++;
            }
        }
        decode_linear_rows_block_cuda(rb_dflt);
        printf("%s (i) fused epilogues split over rows blocks of 32 / 16 / 8 at 17..64 rows: argmax %ld, residual + "
               "norm tail %ld, q/k tail %ld of %ld calls each differ bitwise from one block a tile\n",
               ebad[0] + ebad[1] + ebad[2] ? "FAIL" : "PASS", ebad[0], ebad[1], ebad[2], ecalls);
        g_fail += ebad[0] + ebad[1] + ebad[2] > 0;
        cudaFree(sync), cudaFree(i1), cudaFree(i2), cudaFree(base), cudaFree(xa), cudaFree(wa), cudaFree(xr);
        cudaFree(wr), cudaFree(br), cudaFree(xq), cudaFree(wq), cudaFree(a1), cudaFree(a2), cudaFree(c1);
        cudaFree(c2), cudaFree(q1), cudaFree(q2), cudaFree(k1), cudaFree(k2), cudaFree(v1), cudaFree(v2);
        cudaFree(x0), cudaFree(nw), cudaFree(qn), cudaFree(kn), cudaFree(inv), cudaFree(l1), cudaFree(l2);
        cudaFree(x1), cudaFree(x2);
    }
    decode_linear_variant_cuda(old_v);
    /* attention: heads H / KV of hd, causal from p0 over a cache of p0 + T rows */
    static const int att[][3] = {{4, 2, 64}, {2, 1, 48}, {16, 8, 128}};
    for (size_t si = 0; si < DF_ARRAY_LEN(att); si++) {
        int H = att[si][0], KV = att[si][1], hd = att[si][2], qn = (H + 2 * KV) * hd, p0 = rnd(1, 300);
        nn_bf16_cuda *kc = rand_bf16_dev((size_t)(p0 + MT) * KV * hd, 1.0, NULL);
        nn_bf16_cuda *vc = rand_bf16_dev((size_t)(p0 + MT) * KV * hd, 1.0, NULL), *o1, *o2;
        CUDA_CHECK(cudaMalloc((void **)&o1, 2 * (size_t)MT * H * hd));
        CUDA_CHECK(cudaMalloc((void **)&o2, 2 * (size_t)MT * H * hd));
        for (int T = 1; T <= MT; T = next_rows(T)) {
            nn_bf16_cuda *q = rand_bf16_dev((size_t)T * qn, 1.0, NULL);
            float sc = 1.0f / sqrtf((float)hd);
            RC_CHECK(
                decode_attention_cuda(o1, q, qn, kc, vc, NULL, NULL, p0, 0, T, H, KV, hd, sc, 0, g_err, sizeof g_err),
                g_err);
            RC_CHECK(decode_attention_xc_cuda(o2, q, qn, kc, vc, NULL, NULL, p0, 0, T, H, KV, hd, sc, 0, g_err,
                                              sizeof g_err),
                     g_err);
            int same = same_chunked(o1, o2, T, H * hd);
            if (!same && bad < 4)
                printf("    (i) attention %d/%d heads of %d, %d rows: chunk-major out differs\n", H, KV, hd, T);
            bad += !same, calls++;
            cudaFree(q);
        }
        cudaFree(kc), cudaFree(vc), cudaFree(o1), cudaFree(o2);
    }
    /* add + RMSNorm with a capture: d, and the output at an odd element (element-wise path) */
    static const int nrm[][2] = {{2048, 0}, {96, 0}, {128, 1}};
    for (size_t si = 0; si < DF_ARRAY_LEN(nrm); si++) {
        int d = nrm[si][0], odd = nrm[si][1];
        float *w = rand_f32_dev(d, 1.0, 0.1), *x1 = rand_f32_dev((size_t)MT * d, 0.0, 1.0), *x2;
        nn_bf16_cuda *y = rand_bf16_dev((size_t)MT * d, 1.0, NULL), *n1, *n2, *c1, *c2;
        CUDA_CHECK(cudaMalloc((void **)&x2, sizeof(float) * MT * d));
        CUDA_CHECK(cudaMalloc((void **)&n1, 2 * ((size_t)MT * d + 1)));
        CUDA_CHECK(cudaMalloc((void **)&n2, 2 * ((size_t)MT * d + 1)));
        CUDA_CHECK(cudaMalloc((void **)&c1, 2 * (size_t)MT * d));
        CUDA_CHECK(cudaMalloc((void **)&c2, 2 * (size_t)MT * d));
        for (int T = 1; T <= MT; T = next_rows(T)) {
            CUDA_CHECK(cudaMemcpy(x2, x1, sizeof(float) * T * d, cudaMemcpyDeviceToDevice));
            RC_CHECK(nn_add_rmsnorm_cuda(x1, y, w, n1 + odd, c1, d, T, d, 1e-6f, 0, g_err, sizeof g_err), g_err);
            RC_CHECK(nn_add_rmsnorm_xc_cuda(x2, y, w, n2 + odd, c2, d, T, d, 1e-6f, T & 1, 0, g_err, sizeof g_err),
                     g_err);
            int same = dev_same(x1, x2, sizeof(float) * T * d) && dev_same(c1, c2, 2 * (size_t)T * d) &&
                       same_chunked(n1 + odd, n2 + odd, T, d);
            if (!same && bad < 4)
                printf("    (i) add + RMSNorm d %d%s, %d rows: chunk-major differs\n", d, odd ? " (odd output)" : "",
                       T);
            bad += !same, calls++;
        }
        cudaFree(w), cudaFree(x1), cudaFree(x2), cudaFree(y), cudaFree(n1), cudaFree(n2), cudaFree(c1), cudaFree(c2);
    }
    /* widths that are not multiples of 32 */
    nn_bf16_cuda *t = rand_bf16_dev(64 * 100, 1.0, NULL);
    float *tf = rand_f32_dev(64 * 100, 0.0, 1.0);
    int ok_err = decode_linear_rows_xc_cuda(tf, 1, t, t, NULL, 4, 100, 8, 0, g_err, sizeof g_err) == -EINVAL &&
                 decode_linear_glu_rows_xc_cuda(t, t, t, NULL, 4, 64, 40, 0, g_err, sizeof g_err) == -EINVAL &&
                 decode_attention_xc_cuda(t, t, 6 * 20, t, t, NULL, NULL, 0, 0, 2, 2, 2, 20, 0.2f, 0, g_err,
                                          sizeof g_err) == -EINVAL &&
                 nn_add_rmsnorm_xc_cuda(tf, NULL, tf, t, NULL, 0, 2, 100, 1e-6f, 0, 0, g_err, sizeof g_err) == -EINVAL;
    cudaFree(t), cudaFree(tf);
    printf("%s (i) chunk-major activations and blocks of 8..64 rows: %ld of %ld calls (linear 5 shapes x 3 outputs, "
           "gate/up + SwiGLU 3 shapes (4096 -> 2 x 4096: two tiles a block at 9..16 rows), attention at hd "
           "64/48/128, add + RMSNorm; 1..18, 25..60 and 64 rows) differ bitwise from row-major 64-row blocks; widths "
           "not a multiple of 32 %s\n",
           bad == 0 && ok_err ? "PASS" : "FAIL", bad, calls, ok_err ? "refused" : "NOT refused");
    g_fail += bad != 0 || !ok_err;
}

int main(void)
{
    gte_begin(300);
    int capture[2] = {1, 3};
    decode_model_cuda gpu;
    RC_CHECK(decode_load_cuda(&gpu, TARGET, capture, 2, MAX_CTX, 16, g_err, sizeof g_err), g_err);
    /* (e) under every kernel variant of the small-row linear layer (each must keep a row's
     * bits independent of the row count) */
    int dflt_variant = decode_linear_variant_cuda(-1);
    for (int v = 0; v < DECODE_LINEAR_VARIANTS; v++) {
        decode_linear_variant_cuda(v);
        printf("-- linear kernel variant %d (%s)%s\n", v, decode_linear_variant_name_cuda(v),
               v == dflt_variant ? ", the default" : "");
        test_linear_rows();
        test_fused_kernels();
    }
    decode_linear_variant_cuda(dflt_variant);
    test_two_tiles();
    test_chunk_major();
    decode_free_cuda(&gpu);
    return gte_end("gpu_test_eval_kernels");
}
