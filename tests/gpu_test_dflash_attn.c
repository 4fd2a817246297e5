/* gpu_test_dflash_attn: the fused block-sparse DFlash attention (dflash_attn_cuda.h, scheme
 * fused) against the GEMM scheme (the one gpu_test_dflash validated against the CPU
 * reference), on fresh random Q, K, V and output gradients every run.
 * Cases: head_dim 128 (the 8B drafter's heads, G = 4), 64 (G = 8: two CTAs per block, and
 * 300 anchor slots: the dK/dV kernel's block ranges and their reduction), 32 (the mid test
 * shape) and 8 (the tiny test shape, padded to 16 in the kernels); full and sliding-window
 * layers; S not a multiple of the 64-key tile; anchors at 0, 1, S-2 and S-1; padding slots;
 * packed documents (windows [doc start, doc start + anchor), a 1-token document of padding
 * only). Per case and tensor: ||fused - gemm|| / ||gemm|| and the largest element difference
 * over the largest element, against: output 1e-2, dQ / dK / dV 2e-2; LSE max abs diff 1e-3.
 * The fused-rc backward (dQ recomputing S and dP) is held to the same gradient tolerances.
 * Exact checks: padding rows' output and dQ are 0 and their LSE -inf, padding blocks' keys and
 * context keys no block sees get dK = dV = 0, everything finite (the workspace is filled with
 * NaN before each run: a dS tile or partial read before it is written shows), and a second
 * fused run is bit-identical. No GPU: SKIPPED, exit 77.
 * Seed: DFLASH_ATTN_SEED=n replays a run (default: from the clock, printed). */
#include "gpu_test_check.h"

#include "dflash/dflash_attn_cuda.h"
#include "io/safetensors.h"
#include "nn/nn_cuda.h"
#include "test_helpers.h"
#include "util.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char g_err[512];

#define MAXD 8
typedef struct acase {
    const char *name;
    int hd, H, KV, B, window;
    int n_docs, len[MAXD], per, real[MAXD]; /* documents: tokens, slots each, kept anchors */
} acase;

static void *dmalloc(size_t bytes)
{
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}
static void *dupload(const void *src, size_t bytes)
{
    void *p = dmalloc(bytes);
    CUDA_CHECK(cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice));
    return p;
}
static void *hdownload(const void *src, size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    T_ASSERT(p);
    CUDA_CHECK(cudaMemcpy(p, src, bytes, cudaMemcpyDeviceToHost));
    return p;
}
static uint16_t *rand_bf16(size_t n, df_rng *r, double std)
{
    uint16_t *p = malloc(sizeof(uint16_t) * (n ? n : 1));
    T_ASSERT(p);
    for (size_t i = 0; i < n; i++)
        p[i] = safetensors_f32_to_bf16((float)(std * df_rng_normal(r)));
    return p;
}
static float *bf16_to_f32(const uint16_t *b, size_t n)
{
    float *f = malloc(sizeof(float) * (n ? n : 1));
    T_ASSERT(f);
    for (size_t i = 0; i < n; i++)
        f[i] = safetensors_bf16_to_f32(b[i]);
    return f;
}

/* ||a - ref|| / ||ref|| and max |a - ref| / max |ref| over n; non-finite a counts */
static void cmp(const float *a, const float *ref, size_t n, double *rel, double *mx, long *nonfinite)
{
    double num = 0, den = 0, md = 0, mr = 0;
    long nf = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) {
            nf++;
            continue;
        }
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
        md = fmax(md, fabs(d));
        mr = fmax(mr, fabs((double)ref[i]));
    }
    *rel = den > 0 ? sqrt(num / den) : sqrt(num);
    *mx = mr > 0 ? md / mr : md;
    *nonfinite = nf;
}

typedef struct outs {
    uint16_t *att;
    float *lse, *dQ, *dK, *dV;
} outs;

static void run_scheme(const dflash_attn_ws_cuda *ws, const dflash_attn_cuda *a, const void *Q, const void *K,
                       const void *V, const void *datt, void *att_d, float *lse_d, float *dQ_d, float *dK_d,
                       float *dV_d, outs *o, size_t n_att, size_t n_lse, size_t n_q, size_t n_kv)
{
    /* poison the workspace (NaN in bf16 and fp32): a dS tile or partial read before it is
     * written shows up as a non-finite or wrong gradient */
    CUDA_CHECK(cudaMemset(ws->base, 0xff,
                          dflash_attn_ws_bytes_cuda(ws->scheme, ws->max_S, ws->max_N, ws->B, ws->H, ws->KV, ws->hd)));
    /* poison the outputs: every element must be written */
    CUDA_CHECK(cudaMemset(att_d, 0xff, sizeof(uint16_t) * n_att));
    CUDA_CHECK(cudaMemset(lse_d, 0xff, sizeof(float) * n_lse));
    CUDA_CHECK(cudaMemset(dQ_d, 0xff, sizeof(float) * n_q));
    CUDA_CHECK(cudaMemset(dK_d, 0xff, sizeof(float) * n_kv));
    CUDA_CHECK(cudaMemset(dV_d, 0xff, sizeof(float) * n_kv));
    RC_CHECK(dflash_attn_fwd_cuda(ws, a, Q, K, V, att_d, lse_d, 0, g_err, sizeof g_err), g_err);
    RC_CHECK(dflash_attn_bwd_cuda(ws, a, Q, K, V, att_d, lse_d, datt, dQ_d, dK_d, dV_d, 0, g_err, sizeof g_err), g_err);
    CUDA_CHECK(cudaDeviceSynchronize());
    o->att = hdownload(att_d, sizeof(uint16_t) * n_att);
    o->lse = hdownload(lse_d, sizeof(float) * n_lse);
    o->dQ = hdownload(dQ_d, sizeof(float) * n_q);
    o->dK = hdownload(dK_d, sizeof(float) * n_kv);
    o->dV = hdownload(dV_d, sizeof(float) * n_kv);
}
static void outs_free(outs *o)
{
    free(o->att), free(o->lse), free(o->dQ), free(o->dK), free(o->dV);
}

static int cmp_i32(const void *a, const void *b)
{
    int x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void run_case(const acase *c, uint64_t seed, nn_gemm_cuda *gemm)
{
    df_rng r;
    df_rng_seed(&r, seed ^ (uint64_t)(c->hd * 1000003 + c->window * 7919 + c->n_docs * 131 + c->len[0]));
    int S = 0, N = c->n_docs * c->per, B = c->B, R = N * B, T, G = c->H / c->KV, hd = c->hd;
    int starts[MAXD + 1];
    for (int k = 0; k < c->n_docs; k++)
        starts[k] = S, S += c->len[k];
    starts[c->n_docs] = S;
    T = S + R;
    /* anchors: per document sorted random, the first four forced to 0, 1, len-2, len-1 */
    int32_t *hi = calloc((size_t)N, sizeof(int32_t)), *lo = calloc((size_t)N, sizeof(int32_t));
    uint8_t *keep = calloc((size_t)N, 1);
    T_ASSERT(hi && lo && keep);
    int n_kept = 0;
    for (int k = 0; k < c->n_docs; k++) {
        int len = c->len[k], nr = DF_MIN(c->real[k], c->per);
        int32_t *loc = calloc((size_t)c->per, sizeof(int32_t));
        T_ASSERT(loc);
        for (int i = 0; i < nr; i++) {
            int forced[4] = {0, 1, len - 2, len - 1};
            loc[i] = i < 4 ? forced[i] : (int32_t)df_rng_below(&r, (uint64_t)len);
            if (loc[i] < 0 || loc[i] >= len)
                loc[i] = 0;
        }
        qsort(loc, (size_t)nr, sizeof(int32_t), cmp_i32);
        for (int i = 0; i < c->per; i++) {
            int j = k * c->per + i;
            keep[j] = i < nr;
            lo[j] = starts[k];
            hi[j] = starts[k] + (keep[j] ? loc[i] : 0);
            n_kept += keep[j];
        }
        free(loc);
    }
    printf("== case %s: hd %d H %d KV %d (G %d) B %d %s, S %d in %d document(s), %d slots (%d kept)\n", c->name, hd,
           c->H, c->KV, G, B, c->window ? "sliding" : "full", S, c->n_docs, N, n_kept);
    if (c->window)
        printf("  window %d\n", c->window);

    size_t n_q = (size_t)c->H * R * hd, n_kv = (size_t)c->KV * T * hd, n_att = (size_t)R * c->H * hd;
    size_t n_lse = (size_t)c->H * R;
    uint16_t *Qh = rand_bf16(n_q, &r, 1.5), *Kh = rand_bf16(n_kv, &r, 1.5), *Vh = rand_bf16(n_kv, &r, 1.0);
    uint16_t *dA = rand_bf16(n_att, &r, 1.0);
    void *Q_d = dupload(Qh, sizeof(uint16_t) * n_q), *K_d = dupload(Kh, sizeof(uint16_t) * n_kv);
    void *V_d = dupload(Vh, sizeof(uint16_t) * n_kv), *dA_d = dupload(dA, sizeof(uint16_t) * n_att);
    void *hi_d = dupload(hi, sizeof(int32_t) * (size_t)N), *lo_d = dupload(lo, sizeof(int32_t) * (size_t)N);
    void *keep_d = dupload(keep, (size_t)N);
    void *att_d = dmalloc(sizeof(uint16_t) * n_att);
    float *lse_d = dmalloc(sizeof(float) * n_lse), *dQ_d = dmalloc(sizeof(float) * n_q);
    float *dK_d = dmalloc(sizeof(float) * n_kv), *dV_d = dmalloc(sizeof(float) * n_kv);

    dflash_attn_cuda a = {S, N, B, c->H, c->KV, hd, c->window, 1.0f / sqrtf((float)hd), hi_d, lo_d, keep_d};
    dflash_attn_ws_cuda wf = {DFLASH_ATTN_FUSED, S, N, B, c->H, c->KV, hd, NULL, NULL};
    dflash_attn_ws_cuda wg = {DFLASH_ATTN_GEMM, S, N, B, c->H, c->KV, hd, NULL, gemm};
    dflash_attn_ws_cuda wr = {DFLASH_ATTN_FUSED_RC, S, N, B, c->H, c->KV, hd, NULL, NULL};
    wf.base = dmalloc(dflash_attn_ws_bytes_cuda(wf.scheme, S, N, B, c->H, c->KV, hd));
    wg.base = dmalloc(dflash_attn_ws_bytes_cuda(wg.scheme, S, N, B, c->H, c->KV, hd));
    wr.base = dmalloc(dflash_attn_ws_bytes_cuda(wr.scheme, S, N, B, c->H, c->KV, hd));

    outs F, F2, Gm, Rc;
    run_scheme(&wg, &a, Q_d, K_d, V_d, dA_d, att_d, lse_d, dQ_d, dK_d, dV_d, &Gm, n_att, n_lse, n_q, n_kv);
    run_scheme(&wf, &a, Q_d, K_d, V_d, dA_d, att_d, lse_d, dQ_d, dK_d, dV_d, &F, n_att, n_lse, n_q, n_kv);
    run_scheme(&wf, &a, Q_d, K_d, V_d, dA_d, att_d, lse_d, dQ_d, dK_d, dV_d, &F2, n_att, n_lse, n_q, n_kv);
    run_scheme(&wr, &a, Q_d, K_d, V_d, dA_d, att_d, lse_d, dQ_d, dK_d, dV_d, &Rc, n_att, n_lse, n_q, n_kv);

    /* tolerances: fused (and fused-rc, the recomputing backward) vs gemm */
    float *fa = bf16_to_f32(F.att, n_att), *ga = bf16_to_f32(Gm.att, n_att);
    struct {
        const char *name;
        const float *f, *g;
        size_t n;
        double tol;
    } t[7] = {{"output", fa, ga, n_att, 1e-2},      {"dQ", F.dQ, Gm.dQ, n_q, 2e-2},
              {"dK", F.dK, Gm.dK, n_kv, 2e-2},      {"dV", F.dV, Gm.dV, n_kv, 2e-2},
              {"dQ (rc)", Rc.dQ, Gm.dQ, n_q, 2e-2}, {"dK (rc)", Rc.dK, Gm.dK, n_kv, 2e-2},
              {"dV (rc)", Rc.dV, Gm.dV, n_kv, 2e-2}};
    printf("  %-8s %12s %14s %10s\n", "tensor", "rel err", "max diff/max", "tolerance");
    for (int i = 0; i < 7; i++) {
        double rel, mx;
        long nf;
        cmp(t[i].f, t[i].g, t[i].n, &rel, &mx, &nf);
        printf("  %-8s %12.3e %14.3e %10.0e%s\n", t[i].name, rel, mx, t[i].tol,
               rel < t[i].tol && nf == 0 ? "" : "  <-- FAIL");
        EXPECT(nf == 0, "%s: %ld non-finite fused values", t[i].name, nf);
        EXPECT(rel < t[i].tol, "%s: fused vs gemm rel err %.3e >= %.0e", t[i].name, rel, t[i].tol);
    }
    /* LSE: kept rows close, padding rows -inf in both */
    double lse_max = 0;
    long lse_bad = 0;
    for (size_t rho = 0; rho < n_lse; rho++) {
        int rr = (int)((rho / (size_t)G) % (size_t)R), j = rr / B;
        if (keep[j]) {
            double d = fabs((double)F.lse[rho] - Gm.lse[rho]);
            if (!isfinite(F.lse[rho]) || !(d <= 1e-3))
                lse_bad++;
            if (isfinite(d))
                lse_max = fmax(lse_max, d);
        } else if (!(isinf(F.lse[rho]) && F.lse[rho] < 0 && isinf(Gm.lse[rho]) && Gm.lse[rho] < 0)) {
            lse_bad++;
        }
    }
    printf("  lse      max abs diff %.3e over kept rows (tolerance 1e-3), %ld bad\n", lse_max, lse_bad);
    EXPECT(lse_bad == 0, "lse: %ld rows differ by more than 1e-3 or padding rows not -inf", lse_bad);

    /* exact zeros: padding rows (output, dQ), padding blocks' keys and unseen context keys (dK, dV) */
    long nz_att = 0, nz_dq = 0, nz_kv = 0, unseen = 0;
    for (size_t e = 0; e < n_att; e++) {
        int rr = (int)(e / ((size_t)c->H * hd));
        if (!keep[rr / B])
            nz_att += fa[e] != 0.0f;
    }
    for (size_t e = 0; e < n_q; e++) {
        size_t rho = e / (size_t)hd;
        int rr = (int)((rho / (size_t)G) % (size_t)R);
        if (!keep[rr / B])
            nz_dq += F.dQ[e] != 0.0f;
    }
    for (int g = 0; g < c->KV; g++)
        for (int tk = 0; tk < T; tk++) {
            int seen;
            if (tk >= S) {
                seen = keep[(tk - S) / B];
            } else {
                seen = 0;
                for (int j = 0; j < N && !seen; j++)
                    seen = keep[j] && tk >= lo[j] && tk < hi[j];
            }
            if (seen)
                continue;
            unseen += tk < S;
            for (int i = 0; i < hd; i++) {
                size_t e = ((size_t)g * T + tk) * hd + i;
                nz_kv += F.dK[e] != 0.0f || F.dV[e] != 0.0f;
            }
        }
    printf("  exact zeros: %ld non-zero padding outputs, %ld non-zero padding dQ, %ld non-zero dK/dV of keys no "
           "query sees (%d KV heads x %ld unseen context keys + padding blocks)\n",
           nz_att, nz_dq, nz_kv, c->KV, unseen / c->KV);
    EXPECT(nz_att == 0 && nz_dq == 0 && nz_kv == 0, "padding / unseen keys not exact zeros");

    int same = !memcmp(F.att, F2.att, sizeof(uint16_t) * n_att) && !memcmp(F.lse, F2.lse, sizeof(float) * n_lse) &&
               !memcmp(F.dQ, F2.dQ, sizeof(float) * n_q) && !memcmp(F.dK, F2.dK, sizeof(float) * n_kv) &&
               !memcmp(F.dV, F2.dV, sizeof(float) * n_kv);
    printf("  determinism: second fused run %s\n", same ? "bit-identical" : "DIFFERS");
    EXPECT(same, "two fused runs differ");

    outs_free(&F), outs_free(&F2), outs_free(&Gm), outs_free(&Rc);
    free(fa), free(ga);
    free(Qh), free(Kh), free(Vh), free(dA), free(hi), free(lo), free(keep);
    cudaFree(Q_d), cudaFree(K_d), cudaFree(V_d), cudaFree(dA_d), cudaFree(hi_d), cudaFree(lo_d), cudaFree(keep_d);
    cudaFree(att_d), cudaFree(lse_d), cudaFree(dQ_d), cudaFree(dK_d), cudaFree(dV_d);
    cudaFree(wf.base), cudaFree(wg.base), cudaFree(wr.base);
}

int main(int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: gpu_test_dflash_attn   (env DFLASH_ATTN_SEED=n replays a run)\n"
               "Fused DFlash attention vs the GEMM scheme on random inputs; exit 0 pass, 1 fail, 77 no GPU.\n");
        return 0;
    }
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev < 1)
        T_SKIP("gpu_test_dflash_attn: no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    uint64_t seed = (uint64_t)time(NULL);
    const char *s = getenv("DFLASH_ATTN_SEED");
    if (s)
        seed = strtoull(s, NULL, 0);
    printf("gpu_test_dflash_attn: seed %llu (DFLASH_ATTN_SEED=%llu to replay)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    nn_gemm_cuda *gemm = NULL;
    RC_CHECK(nn_gemm_create_cuda(&gemm, 64u << 20, g_err, sizeof g_err), g_err);
    acase cases[] = {
        {"8b-full", 128, 32, 8, 16, 0, 1, {777}, 40, {37}},
        {"8b-sliding", 128, 32, 8, 16, 100, 1, {777}, 40, {37}},
        {"mid-sliding", 32, 8, 2, 16, 48, 1, {300}, 18, {16}},
        {"tiny-full", 8, 4, 2, 4, 0, 1, {40}, 10, {8}},
        {"tiny-sliding", 8, 4, 2, 4, 8, 1, {40}, 10, {8}},
        {"wide-ranges", 64, 16, 2, 16, 0, 1, {131}, 300, {280}},
        {"packed-full", 128, 32, 8, 16, 0, 4, {200, 1, 333, 97}, 12, {12, 0, 10, 5}},
        {"packed-sliding", 128, 32, 8, 16, 64, 4, {200, 1, 333, 97}, 12, {12, 0, 10, 5}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(&cases[i], seed, gemm);
    nn_gemm_destroy_cuda(gemm);
    if (gt_failures) {
        printf("gpu_test_dflash_attn: %d check(s) FAILED (seed %llu)\n", gt_failures, (unsigned long long)seed);
        return 1;
    }
    printf("gpu_test_dflash_attn: all checks passed\n");
    return 0;
}
