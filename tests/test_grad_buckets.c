/* test_grad_buckets: the drafter's bucketed gradient all-reduce, overlapped with the
 * backward (common/dflash/grad_buckets.h), on the real CPU backward and the real shm
 * all-reduce across forked ranks over a memfd segment. Fresh random inputs every run
 * (the seed is printed; BUCKETS_TEST_SEED=N replays).
 *  - the plan: buckets tile the flat array from its end, are cut at the backward's
 *    boundaries, are at least the asked size (but the last), for sizes 0 .. huge;
 *  - the hook: the backward reports every boundary in order, and at each report the
 *    suffix it declares final already holds the bits of the complete backward;
 *  - R = 2, 3 ranks (3 drafter layers, 2 documents per rank, one rank with an empty step):
 *    every rank gets the same bits, equal to one allreduce_sum of the same gradients,
 *    for every bucket size; the hooked backward hands every bucket over as soon as it is
 *    final (all but the last one before the backward's last stage). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dflash/dflash_batch.h"
#include "dflash/dflash_config.h"
#include "dflash/dflash_model.h"
#include "dflash/grad_buckets.h"
#include "ipc/allreduce.h"
#include "ipc/arena.h"
#include "ipc/shm.h"
#include "test_helpers.h"
#include "util.h"

static char e2[512]; /* the allreduce_ calls' error message (one thread per process) */

enum { S = 36, NA = 5, MAX_FLOATS = 4096 };

static dflash_config C;
static float *E; /* [V, d] frozen embedding = lm_head */
static uint64_t g_seed;
static arena g_seg;

static void setup_model(void)
{
    dflash_config_tiny(&C);
    C.n_layers = 3;
    C.layer_sliding[1] = 1;
    C.sliding_window = 8;
    char err[256];
    T_ASSERT_RC(dflash_config_validate(&C, err, sizeof err));
    E = malloc(sizeof(float) * (size_t)C.vocab * C.hidden);
    T_ASSERT(E);
    df_rng r;
    df_rng_seed(&r, g_seed);
    for (long i = 0; i < (long)C.vocab * C.hidden; i++)
        E[i] = (float)(0.3 * df_rng_normal(&r));
}

/* One random document of a rank's batch: tokens, loss mask, features, anchors. */
typedef struct doc {
    int32_t x[S];
    uint8_t lm[S];
    float *H;
    dflash_batch b;
} doc;

static void make_doc(doc *d, uint64_t seed)
{
    df_rng r;
    df_rng_seed(&r, seed);
    for (int i = 0; i < S; i++) {
        d->x[i] = (int32_t)df_rng_below(&r, (uint64_t)C.vocab - 1);
        d->lm[i] = i >= 3;
    }
    size_t nh = (size_t)S * C.n_capture * C.hidden;
    d->H = malloc(sizeof(float) * nh);
    T_ASSERT(d->H);
    for (size_t i = 0; i < nh; i++)
        d->H[i] = (float)df_rng_normal(&r);
    T_ASSERT_RC(dflash_batch_init(&d->b, &C, S, NA, d->H, d->x, d->lm, seed, seed));
    T_ASSERT(d->b.sum_w > 0);
}

static void free_doc(doc *d)
{
    dflash_batch_free(&d->b);
    free(d->H);
}

static void init_params(dflash_params *p)
{
    T_ASSERT_RC(dflash_params_alloc(p, &C));
    dflash_params_init_random(p, &C, g_seed + 1, 0.1f);
}

/* ---- the plan ------------------------------------------------------------------------ */

static void test_plan(void)
{
    size_t b[BUCKETS_MAX];
    int nb = dflash_grad_boundaries(&C, b, BUCKETS_MAX);
    T_ASSERT(nb == C.n_layers + 2 && b[nb - 1] == 0);
    T_ASSERT(dflash_grad_boundaries(&C, b, C.n_layers + 1) == -EINVAL);
    size_t n = dflash_config_param_count(&C);
    size_t sizes[] = {0, 1, 3000, 20000, 60000, n / 2, n, 10 * n};
    for (size_t si = 0; si < DF_ARRAY_LEN(sizes); si++) {
        buckets_plan p;
        T_ASSERT_RC(buckets_plan_make(&p, &C, sizes[si]));
        T_ASSERT(p.n >= 1 && p.n <= nb && p.hi[0] == n && p.lo[p.n - 1] == 0);
        for (int k = 0; k < p.n; k++) {
            T_ASSERT(p.lo[k] < p.hi[k]);
            if (k > 0)
                T_ASSERT(p.hi[k] == p.lo[k - 1]); /* tiles the array */
            if (k < p.n - 1)
                T_ASSERT(p.hi[k] - p.lo[k] >= sizes[si]); /* big enough */
            int on_boundary = 0;
            for (int i = 0; i < nb; i++)
                on_boundary |= b[i] == p.lo[k];
            T_ASSERT(on_boundary); /* cut where the backward reports */
        }
        if (sizes[si] <= 1)
            T_ASSERT(p.n == nb);
        if (sizes[si] >= n)
            T_ASSERT(p.n == 1);
    }
    printf("ok: plans tile the %zu gradients from the end at the %d backward boundaries, for 8 bucket sizes\n", n, nb);
}

/* ---- the hook ------------------------------------------------------------------------ */

typedef struct hook_rec {
    const float *g;
    const float *ref; /* the complete backward's gradients */
    size_t n;
    size_t seen[BUCKETS_MAX];
    int calls;
    int suffix_final; /* every report's suffix already equal to ref */
} hook_rec;

static void record(void *arg, size_t lo)
{
    hook_rec *h = arg;
    if (h->calls < BUCKETS_MAX)
        h->seen[h->calls] = lo;
    h->calls++;
    if (lo > h->n || memcmp(h->g + lo, h->ref + lo, (h->n - lo) * sizeof(float)) != 0)
        h->suffix_final = 0;
}

static void test_hook(void)
{
    dflash_params p, g, gref;
    init_params(&p);
    T_ASSERT_RC(dflash_params_alloc(&g, &C));
    T_ASSERT_RC(dflash_params_alloc(&gref, &C));
    dflash_frozen fz = {E, E};
    dflash_acts a = {0};
    doc d;
    make_doc(&d, g_seed + 10);
    dflash_stats st;
    T_ASSERT_RC(dflash_loss_and_grad(&C, &p, &fz, &d.b, &a, &gref, 0, 16, &st));
    hook_rec h = {.g = g.data, .ref = gref.data, .n = g.n, .suffix_final = 1};
    dflash_grad_hook hk = {record, &h};
    T_ASSERT_RC(dflash_loss_and_grad_hooked(&C, &p, &fz, &d.b, &a, &g, 0, 16, &st, &hk));
    T_ASSERT(memcmp(g.data, gref.data, g.n * sizeof(float)) == 0); /* the hook changes nothing */
    size_t b[BUCKETS_MAX];
    int nb = dflash_grad_boundaries(&C, b, BUCKETS_MAX);
    T_ASSERT(h.calls == nb);
    for (int i = 0; i < nb; i++)
        T_ASSERT(h.seen[i] == b[i]);
    T_ASSERT(h.suffix_final);
    printf("ok: the backward reports its %d boundaries in order; each reported suffix is already final\n", nb);
    free_doc(&d);
    dflash_acts_free(&a);
    dflash_params_free(&p);
    dflash_params_free(&g);
    dflash_params_free(&gref);
}

/* ---- ranks --------------------------------------------------------------------------- */

typedef struct group_arg {
    size_t bucket_floats;
    int empty_rank; /* this rank has no batch (an empty step), -1 none */
    float *out;     /* shared [world][2][n]: bucketed result, one-shot result */
    int *early;     /* shared [world] */
    size_t n;
} group_arg;

static int rank_main(int rank, int world, group_arg *ga)
{
    allreduce_comm c;
    allreduce_comm_init(&c);
    int rc = allreduce_open_shm(&c, g_seg.base, g_seg.size, rank, world, e2, sizeof e2);
    if (rc) {
        fprintf(stderr, "rank %d: allreduce_open_shm: %s\n", rank, e2);
        return 1;
    }
    c.timeout_ns = 30ll * 1000000000ll;
    buckets_plan plan;
    if (buckets_plan_make(&plan, &C, ga->bucket_floats) < 0)
        return 2;
    dflash_params p, g;
    init_params(&p);
    if (dflash_params_alloc(&g, &C) < 0)
        return 3;
    dflash_frozen fz = {E, E};
    dflash_acts a = {0};
    buckets_step s;
    buckets_step_begin(&s, &plan, &c, g.data);
    if (rank != ga->empty_rank) { /* two documents: the second one's backward is hooked */
        for (int k = 0; k < 2; k++) {
            doc d;
            make_doc(&d, g_seed + 100 + 10 * (uint64_t)rank + (uint64_t)k);
            dflash_stats st;
            rc = dflash_loss_and_grad_hooked(&C, &p, &fz, &d.b, &a, &g, 0, 16, &st,
                                             k == 1 ? buckets_step_hook(&s) : NULL);
            free_doc(&d);
            if (rc < 0)
                return 4;
        }
    }
    float *mine = malloc(g.n * sizeof(float)); /* the gradients before the reduction: recompute */
    if (!mine)
        return 5;
    int64_t wait_ns;
    if ((rc = buckets_step_finish(&s, &wait_ns, e2, sizeof e2)) < 0) {
        fprintf(stderr, "rank %d: buckets_step_finish: %s\n", rank, e2);
        return 6;
    }
    memcpy(ga->out + ((size_t)rank * 2) * g.n, g.data, g.n * sizeof(float));
    ga->early[rank] = s.early;
    /* the same gradients again, reduced in one call */
    memset(mine, 0, g.n * sizeof(float));
    dflash_params gm;
    dflash_params_bind(&gm, &C, mine);
    if (rank != ga->empty_rank)
        for (int k = 0; k < 2; k++) {
            doc d;
            make_doc(&d, g_seed + 100 + 10 * (uint64_t)rank + (uint64_t)k);
            dflash_stats st;
            rc = dflash_loss_and_grad(&C, &p, &fz, &d.b, &a, &gm, 0, 16, &st);
            free_doc(&d);
            if (rc < 0)
                return 7;
        }
    if ((rc = allreduce_sum(&c, mine, g.n, c.timeout_ns, e2, sizeof e2)) < 0) {
        fprintf(stderr, "rank %d: allreduce_sum: %s\n", rank, e2);
        return 8;
    }
    memcpy(ga->out + ((size_t)rank * 2 + 1) * g.n, mine, g.n * sizeof(float));
    free(mine);
    dflash_acts_free(&a);
    dflash_params_free(&p);
    dflash_params_free(&g);
    allreduce_close(&c);
    return 0;
}

static void run_group(int world, size_t bucket_floats, int empty_rank)
{
    size_t n = dflash_config_param_count(&C);
    arena out;
    arena_init(&out);
    T_ASSERT_RC(shm_create(&out, sizeof(float) * (size_t)world * 2 * n + sizeof(int) * ALLREDUCE_MAX_WORLD, "gb-out"));
    group_arg ga = {bucket_floats, empty_rank, (float *)out.base, (int *)((float *)out.base + (size_t)world * 2 * n),
                    n};
    arena_close(&g_seg);
    T_ASSERT_RC(shm_create(&g_seg, allreduce_shm_bytes(world, MAX_FLOATS), "gb-allreduce"));
    T_ASSERT_RC(allreduce_shm_format(g_seg.base, g_seg.size, world, MAX_FLOATS, e2, sizeof e2));
    pid_t pids[ALLREDUCE_MAX_WORLD];
    fflush(NULL);
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        T_ASSERT(pids[r] >= 0);
        if (pids[r] == 0) {
            alarm(120);
            _exit(rank_main(r, world, &ga));
        }
    }
    for (int r = 0; r < world; r++) {
        int st;
        T_ASSERT(waitpid(pids[r], &st, 0) == pids[r]);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "rank %d of %d ended with status %#x\n", r, world, st);
            exit(1);
        }
    }
    const float *ref = ga.out + 1 * n; /* rank 0's one-shot sum */
    for (int r = 0; r < world; r++)
        for (int which = 0; which < 2; which++)
            if (memcmp(ga.out + ((size_t)r * 2 + which) * n, ref, n * sizeof(float)) != 0) {
                fprintf(stderr, "world %d, buckets of %zu: rank %d's %s result differs from the one-shot sum\n", world,
                        bucket_floats, r, which ? "one-shot" : "bucketed");
                exit(1);
            }
    buckets_plan plan;
    T_ASSERT_RC(buckets_plan_make(&plan, &C, bucket_floats));
    for (int r = 0; r < world; r++) /* the hooked backward hands over every bucket as it finishes it */
        T_ASSERT(ga.early[r] == (r == empty_rank ? 0 : plan.n));
    printf("ok: world %d, %d bucket(s) of >= %zu floats%s: every rank's bucketed sum == the one-shot sum, bit for "
           "bit; the backward handed each over as it finished it (%d before its last stage)\n",
           world, plan.n, bucket_floats, empty_rank >= 0 ? ", one rank with an empty step" : "", plan.n - 1);
    arena_close(&out);
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        printf("usage: %s\nThe bucketed gradient all-reduce overlapped with the CPU backward, across forked ranks.\n"
               "BUCKETS_TEST_SEED=N replays a run.\n",
               argv[0]);
        return strcmp(argv[1], "--help") ? 2 : 0;
    }
    const char *env = getenv("BUCKETS_TEST_SEED");
    g_seed = env ? strtoull(env, NULL, 10) : (uint64_t)df_now_ns();
    printf("seed %llu (BUCKETS_TEST_SEED=%llu replays)\n", (unsigned long long)g_seed, (unsigned long long)g_seed);
    arena_init(&g_seg);
    setup_model();
    test_plan();
    test_hook();
    size_t n = dflash_config_param_count(&C);
    run_group(2, 0, -1);
    run_group(3, 0, 2);
    run_group(2, n / 3, 0);
    run_group(3, 10 * n, -1);
    arena_close(&g_seg);
    free(E);
    printf("test_grad_buckets: all passed\n");
    return 0;
}
