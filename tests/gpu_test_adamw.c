/* gpu_test_adamw: the drafter's AdamW on the GPU (adamw_step_cuda, dflash_adamw_cuda.cu) against
 * the same operations done on the host, bit for bit.
 *
 * The contract (dflash_adamw_cuda.cu adamw_elem): per element, every operation rounded on its
 * own in this order, fma with one rounding:
 *   g = g*gs (clip); p = p*wdf (decay); m = fma(b1, m, (1-b1)*g);
 *   v = fma(b2, v, g*((1-b2)*g)); p = p - (ss*m) / fma(sqrt(v), ib, eps); mirror = bf16(p)
 * with gs, wdf, ss, ib the floats the plan kernel left in adamw_state_cuda. Here the host does
 * those operations (fmaf, sqrtf and every product through a volatile float, so no compiler
 * may fuse them) and compares every p, m, v and mirror element with memcmp-exactness, over
 * two steps, on two layouts: a small one and one of 3M parameters (the norm's unrolled loop
 * runs; thousands of blocks), each with norm tensors (never decayed) between decayed ones and
 * a last tensor whose length leaves n % 8 = 3 (the scalar tail). Cases: weight decay on and
 * off, the clip engaged and not. Also: the global norm against a host double sum (rel 1e-10),
 * lr against adamw_lr, the clip factor, a NaN gradient skipping the step (nothing written, the
 * step not counted), and a misaligned array refused with -EINVAL naming it.
 * No GPU: SKIPPED, exit 77. */
#include "dflash/adamw.h"
#include "dflash/dflash_adamw_cuda.h"
#include "gpu_test_check.h"
#include "io/safetensors.h"

#include <errno.h>

static int failures;
#define CHECK(cond, ...)                  \
    do {                                  \
        if (!(cond)) {                    \
            printf("FAIL: " __VA_ARGS__); \
            printf("\n");                 \
            failures++;                   \
        }                                 \
    } while (0)

/* one rounding to float, never fused with the next operation */
static float r32(float x)
{
    volatile float y = x;
    return y;
}

static void ref_elem(float *p, float *m, float *v, float g, int clip, int decay, const adamw_state_cuda *s, float b1,
                     float b2, float eps)
{
    float omb1 = r32(1.0f - b1), omb2 = r32(1.0f - b2);
    if (clip)
        g = r32(g * s->gscale);
    float pp = *p;
    if (decay)
        pp = r32(pp * s->wd_factor);
    float mm = fmaf(b1, *m, r32(omb1 * g));
    float vv = fmaf(b2, *v, r32(g * r32(omb2 * g)));
    float num = r32(s->step_size * mm);
    float den = fmaf(sqrtf(vv), s->inv_sqrt_bc2, eps);
    *p = r32(pp - r32(num / den));
    *m = mm;
    *v = vv;
}

typedef struct layout {
    const char *name;
    int nt;
    long long len[8];
    int is_norm[8];
} layout;

static uint64_t rng_state;
static double urand(void)
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static void *dmalloc(size_t bytes)
{
    void *d = NULL;
    CUDA_CHECK(cudaMalloc(&d, bytes));
    return d;
}

static void run(const layout *L, double wd, double clip, float gscale_in)
{
    adamw_tensor_cuda th[8];
    long long off = 0;
    for (int i = 0; i < L->nt; i++) {
        th[i].off = off, th[i].len = L->len[i], th[i].is_norm = L->is_norm[i];
        off += L->len[i];
        if (i + 1 < L->nt && off % 8) {
            fprintf(stderr, "bad layout %s\n", L->name);
            exit(1);
        }
    }
    size_t n = (size_t)off;
    float *p = malloc(n * 4), *g = malloc(n * 4), *m = malloc(n * 4), *v = malloc(n * 4);
    float *gp = malloc(n * 4), *gm = malloc(n * 4), *gv = malloc(n * 4);
    uint16_t *gw = malloc(n * 2);
    if (!p || !g || !m || !v || !gp || !gm || !gv || !gw) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        p[i] = (float)(urand() - 0.5) * 0.08f;
        g[i] = (float)(urand() - 0.5) * gscale_in;
        m[i] = (float)(urand() - 0.5) * 0.002f;
        v[i] = (float)urand() * 1e-6f;
    }
    float *dp = dmalloc(n * 4), *dg = dmalloc(n * 4), *dm = dmalloc(n * 4), *dv = dmalloc(n * 4);
    uint16_t *dw = dmalloc(n * 2);
    adamw_tensor_cuda *dt = dmalloc(sizeof th);
    double *part = dmalloc(sizeof(double) * ADAMW_NORM_PARTS_CUDA);
    adamw_state_cuda *ds = dmalloc(sizeof(adamw_state_cuda)), st;
    CUDA_CHECK(cudaMemcpy(dp, p, n * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dg, g, n * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dm, m, n * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dv, v, n * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dt, th, sizeof th, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(ds, 0, sizeof st));
    adamw_config c;
    adamw_config_default(&c, 100);
    c.lr = 1e-3, c.weight_decay = wd, c.clip_norm = clip;
    long warm = 4;
    adamw_buffers_cuda b = {dp, dm, dv, dg, dw, n, dt, L->nt, part, ds};
    char err[256];
    double sq = 0;
    for (size_t i = 0; i < n; i++)
        sq += (double)g[i] * g[i];
    double norm = sqrt(sq);
    for (int step = 0; step < 2; step++) {
        RC_CHECK(adamw_step_cuda(&b, &c, warm, 0, err, sizeof err), err);
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemcpy(&st, ds, sizeof st, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(gp, dp, n * 4, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(gm, dm, n * 4, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(gv, dv, n * 4, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(gw, dw, n * 2, cudaMemcpyDeviceToHost));
        double lr = adamw_lr(&c, step);
        int want_clip = clip > 0 && norm > clip;
        CHECK(!st.skip && st.step == step + 1, "%s step %d: skip %d step %lld", L->name, step, st.skip, st.step);
        CHECK(fabs(st.norm - norm) <= 1e-10 * norm, "%s step %d: norm %.17g, host %.17g", L->name, step, st.norm, norm);
        CHECK(fabs(st.lr - lr) <= 1e-15 * lr, "%s step %d: lr %.17g, adamw_lr %.17g", L->name, step, st.lr, lr);
        CHECK(st.do_clip == want_clip && (!want_clip || fabs(st.clip_scale - clip / (norm + 1e-6)) <= 1e-12),
              "%s step %d: clip %d scale %.17g (norm %.6g)", L->name, step, st.do_clip, st.clip_scale, norm);
        for (int i = 0; i < L->nt; i++)
            for (long long e = th[i].off; e < th[i].off + th[i].len; e++)
                ref_elem(&p[e], &m[e], &v[e], g[e], st.do_clip, wd > 0 && !th[i].is_norm, &st, (float)c.beta1,
                         (float)c.beta2, (float)c.eps);
        long bad = 0;
        size_t first = 0;
        for (size_t i = 0; i < n; i++) {
            int same = !memcmp(&gp[i], &p[i], 4) && !memcmp(&gm[i], &m[i], 4) && !memcmp(&gv[i], &v[i], 4) &&
                       gw[i] == safetensors_f32_to_bf16(p[i]);
            if (!same && bad++ == 0)
                first = i;
        }
        printf("  %s (n=%zu, wd %.2g, clip %s) step %d: %ld of %zu elements differ from the host sequence%s", L->name,
               n, wd, want_clip ? "on" : "off", step + 1, bad, n, bad ? "" : "\n");
        if (bad)
            printf(" (first %zu: p %a vs %a, m %a vs %a, v %a vs %a)\n", first, gp[first], p[first], gm[first],
                   m[first], gv[first], v[first]);
        CHECK(bad == 0, "%s step %d: the update is not the host's operation sequence bit for bit", L->name, step);
        memcpy(p, gp, n * 4), memcpy(m, gm, n * 4), memcpy(v, gv, n * 4); /* the next step from the GPU's state */
    }
    /* a NaN gradient: skipped, nothing written, the step not counted */
    float nan = NAN;
    CUDA_CHECK(cudaMemcpy(dg + n / 2, &nan, 4, cudaMemcpyHostToDevice));
    RC_CHECK(adamw_step_cuda(&b, &c, warm, 0, err, sizeof err), err);
    CUDA_CHECK(cudaMemcpy(&st, ds, sizeof st, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(gp, dp, n * 4, cudaMemcpyDeviceToHost));
    CHECK(st.skip == 1 && st.step == 2 && !memcmp(gp, p, n * 4), "%s NaN: skip %d step %lld, weights %s", L->name,
          st.skip, st.step, memcmp(gp, p, n * 4) ? "changed" : "kept");
    /* a misaligned array is refused */
    adamw_buffers_cuda mis = b;
    mis.v = dv + 1;
    int rc = adamw_step_cuda(&mis, &c, warm, 0, err, sizeof err);
    CHECK(rc == -EINVAL && strstr(err, "not 16-byte aligned"), "%s misaligned v: rc %d (%s)", L->name, rc, err);
    cudaFree(dp), cudaFree(dg), cudaFree(dm), cudaFree(dv), cudaFree(dw), cudaFree(dt), cudaFree(part), cudaFree(ds);
    free(p), free(g), free(m), free(v), free(gp), free(gm), free(gv), free(gw);
}

int main(int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: gpu_test_adamw   (env NN_CUDA_TEST_SEED=n replays a seed)\n"
               "adamw_step_cuda against the host's operation sequence, bit for bit; exit 0 pass, 1 fail, 77 no "
               "GPU.\n");
        return 0;
    }
    gt_setup(300);
    rng_state = gt_seed() | 1;
    layout small = {"small", 5, {1000, 64, 4096, 8, 1003}, {0, 1, 0, 1, 0}};
    layout big = {"3M", 6, {2097152, 4096, 786432, 128, 131072, 11}, {0, 1, 0, 1, 0, 0}};
    run(&small, 0.1, 1.0, 1.0f);  /* norm ~ 18: clipped; decay on */
    run(&small, 0.0, 1.0, 0.01f); /* norm ~ 0.2: not clipped; no decay */
    run(&big, 0.1, 1.0, 0.01f);   /* norm ~ 5: clipped */
    run(&big, 0.0, 100.0, 0.01f); /* not clipped */
    if (failures) {
        printf("gpu_test_adamw: %d check(s) FAILED\n", failures);
        return 1;
    }
    printf("gpu_test_adamw: all checks passed\n");
    return 0;
}
