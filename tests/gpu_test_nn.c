/* gpu_test_nn: every CUDA layer (nn_cuda.h) against the CPU reference (nn.h) on fresh
 * random inputs each run (the seed is printed; NN_CUDA_TEST_SEED replays it).
 *
 * Inputs are drawn in fp32, rounded to bf16, and the CPU reference runs on exactly the
 * rounded values, so the tolerances only cover what the GPU adds: bf16 rounding of the
 * output (and of P in the flash attention), fp32 vs double accumulation order, fast
 * intrinsics. Every output buffer is poisoned (all bits set = NaN in bf16 and fp32)
 * before each run, so an element the kernel failed to write fails the check, and bytes
 * it must not touch (other capture slots, value heads) are checked still poisoned /
 * unchanged. Without a GPU: SKIPPED (77). A watchdog fails the test instead of hanging.
 * Plain C on the C API (the kernels live in libnn.a): no device code here. */
#include "gpu_test_check.h"

#include <errno.h>

#include "io/safetensors.h" /* safetensors_f32_to_bf16 / safetensors_bf16_to_f32 (RNE) */
#include "nn/nn.h"
#include "nn/nn_cuda.h"
#include "util.h"

static df_rng g_rng;
static long g_fail;
static char g_err[512]; /* every nn_*_cuda call's err: RC_CHECK prints it */

static float urand(float lo, float hi)
{
    return lo + (hi - lo) * (float)df_rng_uniform(&g_rng);
}

#define NEWF(n) ((float *)xmalloc(sizeof(float) * (size_t)(n)))
#define NEWH(n) ((uint16_t *)xmalloc(sizeof(uint16_t) * (size_t)(n)))
#define NEWI(n) ((int32_t *)xmalloc(sizeof(int32_t) * (size_t)(n)))

/* n bf16 values uniform in [lo, hi) into *h (bits) and *f (the same values as fp32). */
static void rand_bf16(uint16_t **h, float **f, size_t n, float lo, float hi)
{
    *h = NEWH(n);
    *f = NEWF(n);
    for (size_t i = 0; i < n; i++) {
        (*h)[i] = safetensors_f32_to_bf16(urand(lo, hi));
        (*f)[i] = safetensors_bf16_to_f32((*h)[i]);
    }
}

static void *dev_upload(const void *h, size_t bytes)
{
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, bytes ? bytes : 1));
    if (bytes)
        CUDA_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}
static void *dev_poisoned(size_t bytes)
{
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, bytes ? bytes : 1));
    CUDA_CHECK(cudaMemset(d, 0xFF, bytes ? bytes : 1));
    return d;
}
static float *dev_bf16_to_f32(const nn_bf16_cuda *d, size_t n)
{
    uint16_t *h = NEWH(n);
    float *f = NEWF(n);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(h, d, 2 * n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++)
        f[i] = safetensors_bf16_to_f32(h[i]);
    free(h);
    return f;
}
static float *dev_f32(const float *d, size_t n)
{
    float *f = NEWF(n);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(f, d, sizeof(float) * n, cudaMemcpyDeviceToHost));
    return f;
}

/* doc_starts for T tokens in *n_docs (<= want) documents: random cuts, the first
 * document one token long when T allows. Returns [n_docs + 1]. */
static int32_t *rand_docs(int T, int want, int *n_docs)
{
    int32_t *s = NEWI(want + 1);
    int n = 0;
    s[0] = 0;
    for (int i = 1; i < want; i++) {
        int lo = s[n] + 1, hi = T - (want - i);
        if (lo > hi)
            break;
        s[++n] = i == 1 ? lo : lo + (int)df_rng_below(&g_rng, (uint64_t)(hi - lo + 1));
    }
    s[++n] = T;
    *n_docs = n;
    return s;
}

static void test_gemm(int T, int K, int N, int with_bias)
{
    uint16_t *xh, *wh, *bh;
    float *xf, *wf, *bf;
    float ws = 1.0f / sqrtf((float)K);
    rand_bf16(&xh, &xf, (size_t)T * K, -1, 1);
    rand_bf16(&wh, &wf, (size_t)N * K, -ws, ws);
    rand_bf16(&bh, &bf, (size_t)N, -0.5f, 0.5f);
    size_t n = (size_t)T * N;
    nn_bf16_cuda *dx = dev_upload(xh, 2 * (size_t)T * K), *dw = dev_upload(wh, 2 * (size_t)N * K);
    nn_bf16_cuda *db = dev_upload(bh, 2 * (size_t)N), *dout = dev_poisoned(2 * n);
    nn_gemm_cuda *g = NULL;
    RC_CHECK(nn_gemm_create_cuda(&g, (size_t)32 << 20, g_err, sizeof g_err), g_err);
    nn_gemm_args_cuda a = nn_gemm_linear_args_cuda(dout, dx, dw, with_bias ? db : NULL, T, K, N);
    RC_CHECK(nn_gemm_run_cuda(g, &a, 0, g_err, sizeof g_err), g_err);
    float *got = dev_bf16_to_f32(dout, n), *ref = NEWF(n);
    nn_matmul(ref, xf, wf, with_bias ? bf : NULL, T, K, N);
    char what[96];
    snprintf(what, sizeof what, "gemm T=%d K=%d N=%d bias=%d", T, K, N, with_bias);
    g_fail += gt_check(what, got, ref, n, 2e-3, 1e-2);
    /* a second call hits the cached plan and must give the same bits */
    CUDA_CHECK(cudaMemset(dout, 0xFF, 2 * n));
    RC_CHECK(nn_gemm_run_cuda(g, &a, 0, g_err, sizeof g_err), g_err);
    float *again = dev_bf16_to_f32(dout, n);
    snprintf(what, sizeof what, "gemm T=%d K=%d N=%d cached plan, same bits", T, K, N);
    g_fail += gt_check(what, again, got, n, 0, 0);
    /* every later heuristic rank (algo_rank, the target's per-shape table) computes the
     * same product, twice with the same bits; past the offered list: -ENOENT */
    for (int k = 1; k < NN_GEMM_MAX_RANK; k++) {
        a.algo_rank = k;
        CUDA_CHECK(cudaMemset(dout, 0xFF, 2 * n));
        g_err[0] = '\0';
        int rc = nn_gemm_run_cuda(g, &a, 0, g_err, sizeof g_err);
        if (rc == -ENOENT && strstr(g_err, "offered")) {
            printf("PASS gemm T=%d K=%d N=%d: the heuristic offers %d algorithms (%s)\n", T, K, N, k, g_err);
            break;
        }
        RC_CHECK(rc, g_err);
        float *rk = dev_bf16_to_f32(dout, n);
        snprintf(what, sizeof what, "gemm T=%d K=%d N=%d bias=%d rank %d", T, K, N, with_bias, k);
        g_fail += gt_check(what, rk, ref, n, 2e-3, 1e-2);
        CUDA_CHECK(cudaMemset(dout, 0xFF, 2 * n));
        RC_CHECK(nn_gemm_run_cuda(g, &a, 0, g_err, sizeof g_err), g_err);
        float *rk2 = dev_bf16_to_f32(dout, n);
        snprintf(what, sizeof what, "gemm T=%d K=%d N=%d rank %d again, same bits", T, K, N, k);
        g_fail += gt_check(what, rk2, rk, n, 0, 0);
        free(rk), free(rk2);
    }
    nn_gemm_destroy_cuda(g);
    cudaFree(dx), cudaFree(dw), cudaFree(db), cudaFree(dout);
    free(xh), free(wh), free(bh), free(xf), free(wf), free(bf), free(got), free(ref), free(again);
}

/* The general entry, the way the drafter step calls it: row-major D = alpha op(A) op(B) +
 * beta C over `batch` strided matrices, bf16 or fp32 D, align_hint 1. The reference runs in
 * double on the same bf16 inputs. A second call must hit the cached plan: same bits. */
static void test_gemm_general(int ta, int tb, int M, int N, int K, int d_type, float alpha, float beta, int batch)
{
    long lda = ta ? M : K, ldb = tb ? K : N, ldd = N;
    long long sA = (long long)M * K, sB = (long long)K * N, sD = (long long)M * N;
    size_t na = (size_t)sA * batch, nb = (size_t)sB * batch, nd = (size_t)sD * batch;
    int es = d_type == NN_GEMM_F32 ? 4 : 2;
    uint16_t *ah, *bh, *ch;
    float *af, *bf, *cf;
    rand_bf16(&ah, &af, na, -1, 1);
    rand_bf16(&bh, &bf, nb, -1.0f / sqrtf((float)K), 1.0f / sqrtf((float)K));
    rand_bf16(&ch, &cf, nd, -1, 1); /* C = the initial D, bf16-exact so both types hold it */
    void *da = dev_upload(ah, 2 * na), *db = dev_upload(bh, 2 * nb), *dd;
    if (d_type == NN_GEMM_F32)
        dd = dev_upload(cf, 4 * nd);
    else
        dd = dev_upload(ch, 2 * nd);
    float *ref = NEWF(nd);
    for (int z = 0; z < batch; z++)
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double acc = 0;
                for (int k = 0; k < K; k++) {
                    double a = af[z * sA + (ta ? (long)k * lda + m : (long)m * lda + k)];
                    double b = bf[z * sB + (tb ? (long)n * ldb + k : (long)k * ldb + n)];
                    acc += a * b;
                }
                size_t o = (size_t)(z * sD + (long)m * ldd + n);
                ref[o] = (float)(alpha * acc + beta * (double)cf[o]);
            }
    nn_gemm_cuda *g = NULL;
    RC_CHECK(nn_gemm_create_cuda(&g, (size_t)32 << 20, g_err, sizeof g_err), g_err);
    nn_gemm_args_cuda p;
    memset(&p, 0, sizeof p);
    p.ta = ta, p.tb = tb, p.M = M, p.N = N, p.K = K, p.A = da, p.lda = lda, p.B = db, p.ldb = ldb, p.D = dd;
    p.ldd = ldd, p.d_type = d_type, p.alpha = alpha, p.beta = beta, p.batch = batch, p.sA = sA, p.sB = sB, p.sD = sD;
    p.align_hint = 1;
    RC_CHECK(nn_gemm_run_cuda(g, &p, 0, g_err, sizeof g_err), g_err);
    float *got = d_type == NN_GEMM_F32 ? dev_f32(dd, nd) : dev_bf16_to_f32(dd, nd);
    char what[128];
    snprintf(what, sizeof what, "gemm op%c op%c M=%d N=%d K=%d %s a=%g b=%g batch=%d", ta ? 'T' : 'N', tb ? 'T' : 'N',
             M, N, K, d_type == NN_GEMM_F32 ? "f32" : "bf16", alpha, beta, batch);
    if (d_type == NN_GEMM_F32)
        g_fail += gt_check(what, got, ref, nd, 1e-4, 1e-4);
    else
        g_fail += gt_check(what, got, ref, nd, 2e-3, 1e-2);
    /* again from the same C: the cached plan, the same bits */
    CUDA_CHECK(
        cudaMemcpy(dd, d_type == NN_GEMM_F32 ? (void *)cf : (void *)ch, (size_t)es * nd, cudaMemcpyHostToDevice));
    RC_CHECK(nn_gemm_run_cuda(g, &p, 0, g_err, sizeof g_err), g_err);
    float *again = d_type == NN_GEMM_F32 ? dev_f32(dd, nd) : dev_bf16_to_f32(dd, nd);
    snprintf(what, sizeof what, "gemm op%c op%c M=%d N=%d K=%d cached plan, same bits", ta ? 'T' : 'N', tb ? 'T' : 'N',
             M, N, K);
    g_fail += gt_check(what, again, got, nd, 0, 0);
    nn_gemm_destroy_cuda(g);
    cudaFree(da), cudaFree(db), cudaFree(dd);
    free(ah), free(bh), free(ch), free(af), free(bf), free(cf), free(ref), free(got), free(again);
}

/* Failures are -EINVAL / -EIO with one line in err naming the function; err may be NULL. */
static void test_errors(void)
{
    int ok = 1;
    g_err[0] = '\0';
    int rc = nn_swiglu_cuda(NULL, NULL, 4, 0, 0, g_err, sizeof g_err);
    ok &= rc == -EINVAL && strstr(g_err, "nn_swiglu_cuda") != NULL;
    printf("%s nn_swiglu_cuda I=0: rc %d, err \"%s\"\n", ok ? "PASS" : "FAIL", rc, g_err);
    rc = nn_swiglu_cuda(NULL, NULL, 4, 0, 0, NULL, 0);
    ok &= rc == -EINVAL;
    nn_gemm_cuda *g = NULL;
    RC_CHECK(nn_gemm_create_cuda(&g, 0, g_err, sizeof g_err), g_err);
    nn_gemm_args_cuda p;
    memset(&p, 0, sizeof p);
    uint16_t bias = 0;
    p.tb = 1, p.M = 8, p.N = 8, p.K = 8, p.lda = 8, p.ldb = 8, p.ldd = 8, p.d_type = NN_GEMM_F32, p.alpha = 1;
    p.bias = &bias; /* a bias needs a bf16 output */
    g_err[0] = '\0';
    rc = nn_gemm_run_cuda(g, &p, 0, g_err, sizeof g_err);
    int ok2 = rc == -EINVAL && strstr(g_err, "nn_gemm_run_cuda") && strstr(g_err, "D[8, 8]");
    printf("%s nn_gemm_run_cuda bias with fp32 D: rc %d, err \"%s\"\n", ok2 ? "PASS" : "FAIL", rc, g_err);
    p.bias = NULL, p.d_type = NN_GEMM_BF16;
    int ok3 = 1;
    for (int i = 0; i < 2; i++) {
        p.algo_rank = i ? NN_GEMM_MAX_RANK : -1; /* outside [0, NN_GEMM_MAX_RANK) */
        g_err[0] = '\0';
        rc = nn_gemm_run_cuda(g, &p, 0, g_err, sizeof g_err);
        int oki = rc == -EINVAL && strstr(g_err, "nn_gemm_run_cuda") != NULL;
        printf("%s nn_gemm_run_cuda algo_rank %d: rc %d, err \"%s\"\n", oki ? "PASS" : "FAIL", p.algo_rank, rc, g_err);
        ok3 &= oki;
    }
    g_err[0] = '\0';
    rc = nn_attention_packed_tile_cuda(NULL, NULL, NULL, 4, 2, 1, 128, 0, 1.0f, NN_ATTN_TILES, 0, g_err, sizeof g_err);
    int ok4 = rc == -EINVAL && strstr(g_err, "tile") != NULL;
    printf("%s nn_attention_packed_tile_cuda tile %d: rc %d, err \"%s\"\n", ok4 ? "PASS" : "FAIL", NN_ATTN_TILES, rc,
           g_err);
    nn_gemm_destroy_cuda(g);
    g_fail += !(ok && ok2 && ok3 && ok4);
}

static void test_add_rmsnorm(int T, int d, int with_y)
{
    const int nc = 3, slot = 1;
    const float eps = 1e-6f;
    size_t n = (size_t)T * d, ncap = n * nc;
    float *x0 = NEWF(n), *wv = NEWF(d), *x = NEWF(n), *ref = NEWF(n), *xr = NEWF(n), *gc = NEWF(n);
    for (size_t i = 0; i < n; i++)
        x0[i] = urand(-2, 2);
    for (int i = 0; i < d; i++)
        wv[i] = urand(0.5f, 1.5f);
    uint16_t *yh, *cap = NEWH(ncap);
    float *yf;
    rand_bf16(&yh, &yf, n, -1, 1);
    float *dx = dev_upload(x0, sizeof(float) * n), *dw = dev_upload(wv, sizeof(float) * d);
    nn_bf16_cuda *dy = dev_upload(yh, 2 * n), *dout = dev_poisoned(2 * n), *dcap = dev_poisoned(2 * ncap);
    RC_CHECK(nn_add_rmsnorm_cuda(dx, with_y ? dy : NULL, dw, dout, dcap + (size_t)slot * d, (long)nc * d, T, d, eps, 0,
                                 g_err, sizeof g_err),
             g_err);
    for (size_t i = 0; i < n; i++) {
        x[i] = x0[i] + (with_y ? yf[i] : 0.0f);
        xr[i] = safetensors_bf16_to_f32(safetensors_f32_to_bf16(x[i]));
    }
    nn_rmsnorm(ref, x, wv, T, d, eps);
    char what[96];
    snprintf(what, sizeof what, "add_rmsnorm T=%d d=%d y=%d: x", T, d, with_y);
    float *gx = dev_f32(dx, n);
    g_fail += gt_check(what, gx, x, n, 1e-6, 1e-6);
    snprintf(what, sizeof what, "add_rmsnorm T=%d d=%d y=%d: out", T, d, with_y);
    float *go = dev_bf16_to_f32(dout, n);
    g_fail += gt_check(what, go, ref, n, 1e-3, 1e-2);
    /* capture: slot 1 = bf16(x) exactly; slots 0 and 2 untouched (still NaN bits) */
    for (int pass = 0; pass < 2; pass++) {
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemcpy(cap, dcap, 2 * ncap, cudaMemcpyDeviceToHost));
        long stray = 0;
        for (int t = 0; t < T; t++)
            for (int c = 0; c < nc; c++)
                for (int i = 0; i < d; i++) {
                    uint16_t v = cap[((size_t)t * nc + c) * d + i];
                    if (c == slot)
                        gc[(size_t)t * d + i] = safetensors_bf16_to_f32(v);
                    else if (v != 0xFFFF)
                        stray++;
                }
        snprintf(what, sizeof what, "%s T=%d d=%d y=%d: capture", pass ? "add (no norm)" : "add_rmsnorm", T, d, with_y);
        g_fail += gt_check(what, gc, xr, n, 0, 0);
        if (stray) {
            printf("FAIL %s: %ld elements written outside the capture slot\n", what, stray);
            g_fail++;
        }
        if (pass == 0) { /* the last-layer form: add + capture only */
            CUDA_CHECK(cudaMemset(dcap, 0xFF, 2 * ncap));
            CUDA_CHECK(cudaMemcpy(dx, x0, sizeof(float) * n, cudaMemcpyHostToDevice));
            RC_CHECK(nn_add_rmsnorm_cuda(dx, with_y ? dy : NULL, NULL, NULL, dcap + (size_t)slot * d, (long)nc * d, T,
                                         d, eps, 0, g_err, sizeof g_err),
                     g_err);
        }
    }
    cudaFree(dx), cudaFree(dw), cudaFree(dy), cudaFree(dout), cudaFree(dcap);
    free(x0), free(wv), free(x), free(ref), free(xr), free(gc), free(yh), free(cap), free(yf), free(gx), free(go);
}

/* Copy heads [h0, h0 + nh) of every row of qkv [T, row] into dst [T, nh * hd] and back. */
static void heads_get(float *dst, const float *qkv, int T, int row, int h0, int nh, int hd)
{
    for (int t = 0; t < T; t++)
        memcpy(dst + (size_t)t * nh * hd, qkv + (size_t)t * row + (size_t)h0 * hd, sizeof(float) * nh * hd);
}
static void heads_put(float *qkv, const float *src, int T, int row, int h0, int nh, int hd)
{
    for (int t = 0; t < T; t++)
        memcpy(qkv + (size_t)t * row + (size_t)h0 * hd, src + (size_t)t * nh * hd, sizeof(float) * nh * hd);
}

/* nn_qk_norm_rope_cuda (the fast kernel) and nn_qk_norm_rope_ref_cuda (the kernel it
 * replaced) on copies of the same qkv [n] (bits): every byte of the results must agree. */
static void qk_norm_rope_same_bits(const char *what, const uint16_t *qh, size_t n, const float *dqn, const float *dkn,
                                   const float *dinv, const int32_t *dpos, int T, int H, int KV, int hd, float eps)
{
    nn_bf16_cuda *fast = dev_upload(qh, 2 * n), *ref = dev_upload(qh, 2 * n);
    RC_CHECK(nn_qk_norm_rope_cuda(fast, dqn, dkn, dinv, dpos, T, H, KV, hd, eps, 0, g_err, sizeof g_err), g_err);
    RC_CHECK(nn_qk_norm_rope_ref_cuda(ref, dqn, dkn, dinv, dpos, T, H, KV, hd, eps, 0, g_err, sizeof g_err), g_err);
    uint16_t *hf = NEWH(n), *hr = NEWH(n);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(hf, fast, 2 * n, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(hr, ref, 2 * n, cudaMemcpyDeviceToHost));
    long bad = 0;
    size_t first = 0;
    for (size_t i = 0; i < n; i++)
        if (hf[i] != hr[i] && bad++ == 0)
            first = i;
    if (bad)
        printf("FAIL %-44s n=%zu: %ld bf16 differ from the reference kernel (first at %zu: %04x, reference %04x)\n",
               what, n, bad, first, hf[first], hr[first]);
    else
        printf("PASS %-44s n=%zu: the same bits as the reference kernel\n", what, n);
    g_fail += bad > 0;
    cudaFree(fast), cudaFree(ref);
    free(hf), free(hr);
}

static void test_qk_norm_rope(int T, int H, int KV, int hd, int with_norm, int llama3)
{
    const float eps = 1e-6f;
    int row = (H + 2 * KV) * hd, n_docs;
    size_t n = (size_t)T * row;
    uint16_t *qh;
    float *qf, *qn = NEWF(hd), *kn = NEWF(hd), *inv = NEWF(hd / 2);
    rand_bf16(&qh, &qf, n, -2, 2);
    for (int i = 0; i < hd; i++)
        qn[i] = urand(0.5f, 1.5f), kn[i] = urand(0.5f, 1.5f);
    nn_rope_scaling sc = {8.0, 1.0, 4.0, 64};
    nn_rope_inv_freq(inv, hd, llama3 ? 500000.0 : 1e6, llama3 ? &sc : NULL);
    int32_t *starts = rand_docs(T, 3, &n_docs), *pos = NEWI(T);
    nn_key_ranges *rg = xmalloc(sizeof *rg * (size_t)T);
    nn_packed_causal_ranges(rg, pos, starts, n_docs);
    nn_bf16_cuda *dq = dev_upload(qh, 2 * n);
    float *dqn = dev_upload(qn, sizeof(float) * hd), *dkn = dev_upload(kn, sizeof(float) * hd);
    float *dinv = dev_upload(inv, sizeof(float) * (hd / 2));
    int32_t *dpos = dev_upload(pos, sizeof(int32_t) * T);
    RC_CHECK(nn_qk_norm_rope_cuda(dq, with_norm ? dqn : NULL, with_norm ? dkn : NULL, dinv, dpos, T, H, KV, hd, eps, 0,
                                  g_err, sizeof g_err),
             g_err);
    float *got = dev_bf16_to_f32(dq, n);
    /* reference: split q / k, norm per head, rope, put back; v unchanged (ref = input) */
    float *q = NEWF((size_t)T * H * hd), *k = NEWF((size_t)T * KV * hd), *ref = NEWF(n);
    memcpy(ref, qf, sizeof(float) * n);
    heads_get(q, qf, T, row, 0, H, hd);
    heads_get(k, qf, T, row, H, KV, hd);
    if (with_norm) {
        nn_rmsnorm(q, q, qn, T * H, hd, eps);
        nn_rmsnorm(k, k, kn, T * KV, hd, eps);
    }
    nn_rope(q, pos, T, H, hd, inv);
    nn_rope(k, pos, T, KV, hd, inv);
    heads_put(ref, q, T, row, 0, H, hd);
    heads_put(ref, k, T, row, H, KV, hd);
    char what[96];
    snprintf(what, sizeof what, "qk_norm_rope T=%d H=%d KV=%d hd=%d norm=%d llama3=%d", T, H, KV, hd, with_norm,
             llama3);
    g_fail += gt_check(what, got, ref, n, 1e-2, 1e-2);
    /* value heads: bit-exact */
    float *gv = NEWF((size_t)T * KV * hd), *rv = NEWF((size_t)T * KV * hd);
    heads_get(gv, got, T, row, H + KV, KV, hd);
    heads_get(rv, qf, T, row, H + KV, KV, hd);
    snprintf(what, sizeof what, "qk_norm_rope hd=%d: value heads untouched", hd);
    g_fail += gt_check(what, gv, rv, (size_t)T * KV * hd, 0, 0);
    /* the fast kernel against the one it replaced, bit for bit: on this input, then on one
     * with far positions (the angles of sincosf's slow path) and planted specials (zeros,
     * -0, subnormals, the largest finite, infinities, NaN; a zero head, an overflowing one) */
    const float *dn = with_norm ? dqn : NULL, *dk = with_norm ? dkn : NULL;
    snprintf(what, sizeof what, "qk_norm_rope T=%d H=%d KV=%d hd=%d norm=%d bits", T, H, KV, hd, with_norm);
    qk_norm_rope_same_bits(what, qh, n, dn, dk, dinv, dpos, T, H, KV, hd, eps);
    static const uint16_t special[] = {0x0000, 0x8000, 0x0001, 0x807f, 0x7f7f, 0xff7f, 0x7f80, 0xff80, 0x7fc0, 0x3f80};
    int nsp = (int)(sizeof special / sizeof special[0]);
    for (size_t i = 0; i < n; i += 1 + df_rng_below(&g_rng, 60))
        qh[i] = special[df_rng_below(&g_rng, (uint64_t)nsp)];
    for (int i = 0; i < hd; i++)
        qh[i] = 0, qh[(size_t)(T - 1) * row + (size_t)(H + KV - 1) * hd + i] = 0x7f00; /* 2^127 */
    for (int t = 0; t < T; t++)
        if (t % 2)
            pos[t] = (int32_t)df_rng_below(&g_rng, (uint64_t)1 << 24);
    CUDA_CHECK(cudaMemcpy(dpos, pos, sizeof(int32_t) * T, cudaMemcpyHostToDevice));
    snprintf(what, sizeof what, "qk_norm_rope T=%d hd=%d norm=%d bits, specials", T, hd, with_norm);
    qk_norm_rope_same_bits(what, qh, n, dn, dk, dinv, dpos, T, H, KV, hd, eps);
    cudaFree(dq), cudaFree(dqn), cudaFree(dkn), cudaFree(dinv), cudaFree(dpos);
    free(qh), free(qf), free(qn), free(kn), free(inv), free(starts), free(pos), free(rg), free(got), free(q), free(k);
    free(ref), free(gv), free(rv);
}

static void test_attention(int T, int H, int KV, int hd, int want_docs, int window, int simple)
{
    int row = (H + 2 * KV) * hd, n_docs;
    size_t n = (size_t)T * row, no = (size_t)T * H * hd;
    uint16_t *xh;
    float *xf;
    rand_bf16(&xh, &xf, n, -2, 2);
    int32_t *starts = rand_docs(T, want_docs, &n_docs), *pos = NEWI(T);
    nn_key_ranges *rg = xmalloc(sizeof *rg * (size_t)T);
    nn_packed_causal_ranges(rg, pos, starts, n_docs);
    if (window > 0)
        for (int t = 0; t < T; t++)
            rg[t].lo0 = DF_MAX(rg[t].lo0, t - window + 1);
    float *q = NEWF(no), *k = NEWF((size_t)T * KV * hd), *v = NEWF((size_t)T * KV * hd), *ref = NEWF(no);
    heads_get(q, xf, T, row, 0, H, hd);
    heads_get(k, xf, T, row, H, KV, hd);
    heads_get(v, xf, T, row, H + KV, KV, hd);
    float scale = 1.0f / sqrtf((float)hd);
    nn_attention(ref, q, k, v, rg, T, T, H, KV, hd, scale);
    nn_bf16_cuda *dx = dev_upload(xh, 2 * n);
    int32_t *dpos = dev_upload(pos, sizeof(int32_t) * T);
    /* the default entry, then every tile shape (each against the reference, each run twice
     * for the same bits) */
    for (int tile = -1; tile < (simple ? 0 : NN_ATTN_TILES); tile++) {
        nn_bf16_cuda *dout = dev_poisoned(2 * no);
        char what[160];
        if (simple)
            RC_CHECK(
                nn_attention_packed_simple_cuda(dout, dx, dpos, T, H, KV, hd, window, scale, 0, g_err, sizeof g_err),
                g_err);
        else if (tile < 0)
            RC_CHECK(nn_attention_packed_cuda(dout, dx, dpos, T, H, KV, hd, window, scale, 0, g_err, sizeof g_err),
                     g_err);
        else
            RC_CHECK(nn_attention_packed_tile_cuda(dout, dx, dpos, T, H, KV, hd, window, scale, tile, 0, g_err,
                                                   sizeof g_err),
                     g_err);
        float *got = dev_bf16_to_f32(dout, no);
        snprintf(what, sizeof what, "attention%s tile %d T=%d H=%d KV=%d hd=%d docs=%d win=%d",
                 simple ? "(simple)" : "", tile, T, H, KV, hd, n_docs, window);
        g_fail += gt_check(what, got, ref, no, 1e-2, 2e-2);
        if (tile >= 0) {
            CUDA_CHECK(cudaMemset(dout, 0xFF, 2 * no));
            RC_CHECK(nn_attention_packed_tile_cuda(dout, dx, dpos, T, H, KV, hd, window, scale, tile, 0, g_err,
                                                   sizeof g_err),
                     g_err);
            float *again = dev_bf16_to_f32(dout, no);
            snprintf(what, sizeof what, "attention tile %d T=%d hd=%d: second run, same bits", tile, T, hd);
            g_fail += gt_check(what, again, got, no, 0, 0);
            free(again);
        }
        cudaFree(dout);
        free(got);
    }
    cudaFree(dx), cudaFree(dpos);
    free(xh), free(xf), free(starts), free(pos), free(rg), free(q), free(k), free(v), free(ref);
}

static void test_swiglu(int T, int I)
{
    size_t n = (size_t)T * I;
    uint16_t *h;
    float *f, *g = NEWF(n), *u = NEWF(n), *ref = NEWF(n);
    rand_bf16(&h, &f, 2 * n, -4, 4);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < I; i++) {
            g[(size_t)t * I + i] = f[(size_t)t * 2 * I + i];
            u[(size_t)t * I + i] = f[(size_t)t * 2 * I + I + i];
        }
    nn_swiglu(ref, g, u, (long)n);
    nn_bf16_cuda *dgu = dev_upload(h, 4 * n), *dout = dev_poisoned(2 * n);
    RC_CHECK(nn_swiglu_cuda(dout, dgu, T, I, 0, g_err, sizeof g_err), g_err);
    float *got = dev_bf16_to_f32(dout, n);
    char what[64];
    snprintf(what, sizeof what, "swiglu T=%d I=%d", T, I);
    g_fail += gt_check(what, got, ref, n, 1e-3, 1e-2);
    cudaFree(dgu), cudaFree(dout);
    free(h), free(f), free(g), free(u), free(ref), free(got);
}

static void test_embed_positions(int T, int d, int V)
{
    uint16_t *th;
    float *tf;
    size_t n = (size_t)T * d;
    rand_bf16(&th, &tf, (size_t)V * d, -1, 1);
    int32_t *tok = NEWI(T);
    for (int t = 0; t < T; t++)
        tok[t] = (int32_t)df_rng_below(&g_rng, (uint64_t)V);
    tok[T / 2] = V; /* out of range: zero row + flag */
    tok[T - 1] = -1;
    nn_bf16_cuda *dt = dev_upload(th, 2 * (size_t)V * d);
    int32_t *dtok = dev_upload(tok, sizeof(int32_t) * T);
    float *dx = dev_poisoned(sizeof(float) * n);
    int *dbad = NULL, bad = 0;
    CUDA_CHECK(cudaMalloc((void **)&dbad, sizeof(int)));
    CUDA_CHECK(cudaMemset(dbad, 0, sizeof(int)));
    RC_CHECK(nn_embed_cuda(dx, dt, dtok, T, d, V, dbad, 0, g_err, sizeof g_err), g_err);
    float *got = dev_f32(dx, n), *ref = NEWF(n);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < d; i++)
            ref[(size_t)t * d + i] = tok[t] >= 0 && tok[t] < V ? tf[(size_t)tok[t] * d + i] : 0.0f;
    char what[64];
    snprintf(what, sizeof what, "embed T=%d d=%d V=%d", T, d, V);
    g_fail += gt_check(what, got, ref, n, 0, 0);
    CUDA_CHECK(cudaMemcpy(&bad, dbad, sizeof bad, cudaMemcpyDeviceToHost));
    printf("%s embed bad-token flag = %d (expected 1)\n", bad == 1 ? "PASS" : "FAIL", bad);
    g_fail += bad != 1;

    int n_docs;
    int32_t *starts = rand_docs(T, 5, &n_docs), *pos = NEWI(T), *gp = NEWI(T);
    nn_key_ranges *rg = xmalloc(sizeof *rg * (size_t)T);
    nn_packed_causal_ranges(rg, pos, starts, n_docs);
    int32_t *ds = dev_upload(starts, sizeof(int32_t) * (n_docs + 1)), *dpos = dev_poisoned(sizeof(int32_t) * T);
    RC_CHECK(nn_positions_cuda(dpos, ds, n_docs, T, 0, g_err, sizeof g_err), g_err);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(gp, dpos, sizeof(int32_t) * T, cudaMemcpyDeviceToHost));
    long badp = 0;
    for (int t = 0; t < T; t++)
        badp += gp[t] != pos[t];
    printf("%s positions T=%d docs=%d: %ld wrong\n", badp ? "FAIL" : "PASS", T, n_docs, badp);
    g_fail += badp != 0;
    cudaFree(dt), cudaFree(dtok), cudaFree(dx), cudaFree(dbad), cudaFree(ds), cudaFree(dpos);
    free(th), free(tf), free(tok), free(got), free(ref), free(starts), free(pos), free(gp), free(rg);
}

int main(void)
{
    gt_setup(300);
    df_rng_seed(&g_rng, gt_seed());

    test_gemm(67, 256, 320, 0);
    test_gemm(130, 96, 200, 1);
    test_gemm(1, 64, 64, 1);
    test_gemm(512, 1024, 3072, 0);
    /* the drafter step's shapes: forward, dX = dY W, dW += dY^T X, residual in C, batched */
    test_gemm_general(0, 1, 70, 96, 64, NN_GEMM_F32, 1.0f, 0.0f, 1);
    test_gemm_general(0, 0, 70, 64, 96, NN_GEMM_BF16, 1.0f, 0.0f, 1);
    test_gemm_general(1, 0, 96, 64, 70, NN_GEMM_F32, 1.0f, 1.0f, 1);
    test_gemm_general(0, 1, 33, 40, 24, NN_GEMM_F32, 1.0f, 1.0f, 1);
    test_gemm_general(0, 1, 48, 40, 32, NN_GEMM_F32, 0.125f, 0.0f, 3);
    test_gemm_general(1, 0, 40, 32, 48, NN_GEMM_F32, 0.5f, 0.0f, 2);
    test_errors();

    test_add_rmsnorm(37, 96, 1);
    test_add_rmsnorm(37, 70, 1);
    test_add_rmsnorm(5, 4096, 1);
    test_add_rmsnorm(9, 64, 0);

    test_qk_norm_rope(50, 4, 2, 128, 1, 0);
    test_qk_norm_rope(50, 6, 2, 16, 0, 1);
    test_qk_norm_rope(20, 2, 1, 256, 1, 0);
    test_qk_norm_rope(33, 4, 4, 64, 0, 0);
    test_qk_norm_rope(300, 32, 8, 128, 1, 0); /* Qwen3-8B's heads: 5 warps of 8 heads a token */
    test_qk_norm_rope(300, 32, 8, 128, 0, 1);
    test_qk_norm_rope(77, 12, 2, 64, 1, 0); /* odd T, hd 64: a group of 16 heads, cut at 14 */
    test_qk_norm_rope(41, 10, 2, 96, 1, 0); /* hd 96 (not a constant hd): a second pair in lanes 0..15 only */
    test_qk_norm_rope(23, 6, 3, 160, 1, 1); /* 3 pairs a lane, the third in lanes 0..15 only */
    test_qk_norm_rope(19, 3, 2, 250, 0, 0); /* 4 pairs a lane, the fourth in lanes 0..28 only */
    test_qk_norm_rope(9, 3, 1, 2, 1, 0);    /* the smallest head */

    test_attention(300, 4, 2, 128, 5, 0, 0);
    test_attention(300, 4, 2, 128, 5, 0, 1);
    test_attention(257, 8, 2, 64, 3, 50, 0);
    test_attention(200, 6, 2, 16, 2, 0, 0);
    test_attention(130, 4, 1, 32, 1, 0, 0);
    test_attention(1, 4, 2, 128, 1, 0, 0);
    test_attention(64, 2, 2, 128, 64, 0, 0);    /* every document one token long */
    test_attention(150, 4, 2, 96, 3, 0, 0);     /* hd 96: the simple fallback */
    test_attention(700, 2, 1, 128, 2, 0, 0);    /* many key tiles per query tile */
    test_attention(1000, 4, 2, 128, 3, 0, 0);   /* several 128-query tiles per document */
    test_attention(600, 4, 1, 128, 2, 100, 0);  /* a sliding window with the 128-query tiles */
    test_attention(129, 2, 2, 128, 1, 0, 0);    /* one row past a 128-query tile */
    test_attention(2100, 4, 1, 128, 2, 0, 0);   /* a long document: many 128-key tiles through the stages */
    test_attention(1800, 2, 1, 128, 3, 700, 0); /* long documents under a sliding window */

    test_swiglu(33, 160);
    test_swiglu(17, 100);

    test_embed_positions(40, 64, 50);
    test_embed_positions(300, 72, 1000);

    CUDA_CHECK(cudaDeviceSynchronize());
    if (g_fail) {
        printf("gpu_test_nn: %ld failed checks\n", g_fail);
        return 1;
    }
    printf("gpu_test_nn: all checks passed\n");
    return 0;
}
