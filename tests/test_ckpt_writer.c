/* test_ckpt_writer.c: the drafter's checkpoint written on a thread (drafter_worker/
 * ckpt_writer.h) and the tidying of what an interrupted save leaves (dflash_ckpt.h).
 *  - copy = 1: the weights and moments are overwritten (NaN) right after the start, while
 *    the thread is held back (DF_FAULT_CKPT_DELAY_MS): the checkpoint holds the values of
 *    the moment of the start, bit for bit, and its step and trainer state;
 *  - a second start before the first is collected is refused (-EBUSY), nothing lost;
 *  - the caller's heartbeat runs while collect waits;
 *  - copy = 0 (borrowed, the cuda backend's host copies) writes the caller's buffers;
 *  - a write that fails (root below a regular file) comes back as the result's error,
 *    naming the path, and leaves no step dir;
 *  - dflash_ckpt_remove_partial: .tmp-step-N.<pid> deleted, .old-step-N.<pid> deleted when
 *    step-N exists and renamed back when it does not, other names left alone. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dflash/adamw.h"
#include "dflash/dflash_ckpt.h"
#include "dflash/dflash_model.h"
#include "drafter_worker/ckpt_writer.h"
#include "drafter_worker/hb_wait.h"
#include "test_helpers.h"
#include "util.h"

static char err[800];
static int hb_calls;
static void hb(void *arg)
{
    (void)arg;
    hb_calls++;
}

static void touch(const char *path)
{
    FILE *f = fopen(path, "w");
    T_ASSERT(f);
    fputs("x\n", f);
    fclose(f);
}

static int exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Load root's latest checkpoint and compare it with the expected values bit for bit. */
static void expect_ckpt(const char *root, long step, const dflash_config *c, const float *p, const float *m,
                        const float *v, size_t n)
{
    dflash_config c2;
    dflash_params p2;
    adamw o2;
    dflash_train_state ts2;
    if (dflash_ckpt_load(root, &c2, &p2, &o2, &ts2, err, sizeof err) < 0) {
        fprintf(stderr, "load %s: %s\n", root, err);
        exit(1);
    }
    T_ASSERT(memcmp(&c2, c, sizeof *c) == 0);
    T_ASSERT(ts2.step == step && ts2.ledger_committed_step == step);
    T_ASSERT(p2.n == n && memcmp(p2.data, p, n * sizeof(float)) == 0);
    T_ASSERT(memcmp(o2.m, m, n * sizeof(float)) == 0 && memcmp(o2.v, v, n * sizeof(float)) == 0);
    dflash_params_free(&p2);
    adamw_free(&o2);
}

int main(void)
{
    char tmpl[] = "/tmp/test_ckpt_writer.XXXXXX";
    char *dir = mkdtemp(tmpl);
    T_ASSERT(dir);
    char root[600], path[900], p2[1000];
    snprintf(root, sizeof root, "%s/ckpt", dir);
    printf("test_ckpt_writer: in %s\n", dir);

    dflash_config c;
    dflash_config_tiny(&c);
    dflash_params p;
    T_ASSERT_RC(dflash_params_alloc(&p, &c));
    dflash_params_init_random(&p, &c, 5, 0.05f);
    adamw opt;
    adamw_config oc;
    adamw_config_default(&oc, 100);
    T_ASSERT_RC(adamw_init(&opt, &oc, p.n));
    df_rng r;
    df_rng_seed(&r, 9);
    for (size_t i = 0; i < p.n; i++)
        opt.m[i] = (float)df_rng_normal(&r), opt.v[i] = (float)fabs(df_rng_normal(&r));
    opt.step = 12;
    size_t n = p.n, bytes = n * sizeof(float);
    float *keep_p = malloc(bytes), *keep_m = malloc(bytes), *keep_v = malloc(bytes);
    T_ASSERT(keep_p && keep_m && keep_v);
    memcpy(keep_p, p.data, bytes), memcpy(keep_m, opt.m, bytes), memcpy(keep_v, opt.v, bytes);
    dflash_train_state ts = {.step = 12, .epoch = 0, .ledger_committed_step = 12, .seed = 42};
    df_rng_seed(&ts.rng, 1);

    /* ---- copy = 1: a snapshot of the moment of the start ---- */
    ckpt_writer w;
    ckpt_writer_init(&w);
    T_ASSERT(setenv("DF_FAULT_CKPT_DELAY_MS", "1000", 1) == 0);
    T_ASSERT_RC(ckpt_writer_start(&w, root, &c, &p, &opt, &ts, 1, err, sizeof err));
    T_ASSERT(ckpt_writer_pending(&w));
    for (size_t i = 0; i < n; i++) /* training goes on and changes everything */
        p.data[i] = NAN, opt.m[i] = NAN, opt.v[i] = NAN;
    ts.step = 13;
    dflash_train_state ts13 = ts;
    T_ASSERT(ckpt_writer_start(&w, root, &c, &p, &opt, &ts13, 1, err, sizeof err) == -EBUSY);
    T_ASSERT(strstr(err, "step 12"));
    ckpt_result res;
    hb_calls = 0;
    T_ASSERT(ckpt_writer_collect(&w, 1, hb, NULL, &res) == 1);
    T_ASSERT(res.rc == 0 && res.step == 12);
    T_ASSERT(hb_calls >= 1); /* the thread was held back 1 s: collect waited, heartbeating */
    T_ASSERT(!ckpt_writer_pending(&w) && ckpt_writer_collect(&w, 1, hb, NULL, &res) == 0);
    expect_ckpt(root, 12, &c, keep_p, keep_m, keep_v, n);
    printf("  copy: weights and moments overwritten during the write; step-00000012 holds the "
           "start's values bit for bit (write %.3f s, collect waited %.3f s, %d heartbeats)\n",
           res.write_s, res.wait_s, hb_calls);
    /* the heartbeat stops after hb_limit_s of waiting (a stuck write must not hide from the
     * hang timeout): 0.3 s of a 1.5 s wait heartbeated, the rest not, the result still comes */
    T_ASSERT(setenv("DF_FAULT_CKPT_DELAY_MS", "1500", 1) == 0);
    w.hb_limit_s = 0.3;
    T_ASSERT_RC(ckpt_writer_start(&w, root, &c, &p, &opt, &ts13, 1, err, sizeof err));
    hb_calls = 0;
    T_ASSERT(ckpt_writer_collect(&w, 1, hb, NULL, &res) == 1 && res.rc == 0 && res.step == 13);
    T_ASSERT(hb_calls <= 5 && res.wait_s >= 1.0); /* about 15 without the limit */
    printf("  a 1.5 s wait with a 0.3 s heartbeat limit: %d heartbeats, then none (waited %.2f s)\n", hb_calls,
           res.wait_s);
    w.hb_limit_s = HB_WAIT_LIMIT_S;
    T_ASSERT(unsetenv("DF_FAULT_CKPT_DELAY_MS") == 0);

    /* ---- copy = 0: the caller's buffers, unchanged until collected ---- */
    for (size_t i = 0; i < n; i++)
        p.data[i] = keep_p[i] * 2.0f, opt.m[i] = keep_m[i] + 1.0f, opt.v[i] = keep_v[i] * 0.5f;
    opt.step = 13;
    ts.ledger_committed_step = 13;
    T_ASSERT_RC(ckpt_writer_start(&w, root, &c, &p, &opt, &ts, 0, err, sizeof err));
    T_ASSERT(ckpt_writer_collect(&w, 1, NULL, NULL, &res) == 1 && res.rc == 0 && res.step == 13);
    expect_ckpt(root, 13, &c, p.data, opt.m, opt.v, n);
    snprintf(path, sizeof path, "%s/step-00000012/manifest.json", root);
    T_ASSERT(exists(path)); /* the earlier one stays */
    printf("  borrow: step-00000013 holds the caller's buffers; latest moved, step 12 kept\n");

    /* ---- a failing write comes back in the result ---- */
    char bad[700];
    snprintf(path, sizeof path, "%s/afile", dir);
    touch(path);
    snprintf(bad, sizeof bad, "%s/afile/ckpt", dir);
    T_ASSERT_RC(ckpt_writer_start(&w, bad, &c, &p, &opt, &ts, 1, err, sizeof err));
    T_ASSERT(ckpt_writer_collect(&w, 1, NULL, NULL, &res) == 1);
    T_ASSERT(res.rc < 0 && strstr(res.err, bad));
    printf("  failure: rc %d, \"%s\"\n", res.rc, res.err);
    ckpt_writer_free(&w);

    /* ---- tidying after an interrupted save ---- */
    snprintf(path, sizeof path, "%s/.tmp-step-00000014.4242", root);
    T_ASSERT(mkdir(path, 0700) == 0);
    snprintf(p2, sizeof p2, "%s/model.safetensors", path);
    touch(p2);
    snprintf(path, sizeof path, "%s/.old-step-00000013.4242", root); /* step-13 exists: stale */
    T_ASSERT(mkdir(path, 0700) == 0);
    snprintf(path, sizeof path, "%s/.old-step-00000011.4242", root); /* step-11 missing: the only copy */
    T_ASSERT(mkdir(path, 0700) == 0);
    snprintf(p2, sizeof p2, "%s/manifest.json", path);
    touch(p2);
    snprintf(path, sizeof path, "%s/.tmp-step-junk", root); /* not a name a save makes */
    T_ASSERT(mkdir(path, 0700) == 0);
    int k = dflash_ckpt_remove_partial(root, err, sizeof err);
    T_ASSERT(k == 3);
    snprintf(path, sizeof path, "%s/.tmp-step-00000014.4242", root);
    T_ASSERT(!exists(path));
    snprintf(path, sizeof path, "%s/.old-step-00000013.4242", root);
    T_ASSERT(!exists(path));
    snprintf(path, sizeof path, "%s/step-00000011/manifest.json", root);
    T_ASSERT(exists(path));
    snprintf(path, sizeof path, "%s/.tmp-step-junk", root);
    T_ASSERT(exists(path));
    expect_ckpt(root, 13, &c, p.data, opt.m, opt.v, n); /* latest untouched */
    snprintf(path, sizeof path, "%s/nothing-here", dir);
    T_ASSERT(dflash_ckpt_remove_partial(path, err, sizeof err) == 0);
    printf("  tidy: temp dir deleted, stale .old deleted, the only copy of step 11 renamed back, "
           "other names left\n");

    free(keep_p), free(keep_m), free(keep_v);
    dflash_params_free(&p);
    adamw_free(&opt);
    snprintf(path, sizeof path, "rm -rf '%s'", dir);
    T_ASSERT(system(path) == 0);
    printf("test_ckpt_writer: passed\n");
    return 0;
}
