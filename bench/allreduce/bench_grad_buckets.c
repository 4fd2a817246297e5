/* bench_grad_buckets: what overlapping the gradient all-reduce with the backward buys on
 * the CPU backend (common/dflash/grad_buckets.h), measured in one run beside its two
 * bounds:
 *   compute alone   forward + backward, no reduction (world 1): the floor for a step
 *   one bucket      the whole gradient reduced after the backward (no overlap: the peer)
 *   per layer       buckets handed over as the backward finishes each layer (overlap)
 *   reduce alone    allreduce_sum of the whole gradient, no backward
 * R forked ranks (real processes, a real memfd segment), each with its own random batch,
 * a drafter of --layers layers, d = --hidden. Per mode: --warmup steps, then --steps timed
 * ones; rank 0's median step time and median exposed wait (buckets_step_finish's allreduce_wait_all).
 * Prints a table and writes JSON (date, host, cpus, commit, config, every figure) to --out
 * (default bench/results/grad_buckets.json).
 *   build/bench/bench_grad_buckets [--ranks R] [--layers L] [--hidden D] [--seq S]
 *                                  [--anchors N] [--steps K] [--warmup W] [--out PATH] */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dflash/dflash_batch.h"
#include "dflash/dflash_config.h"
#include "dflash/dflash_model.h"
#include "dflash/grad_buckets.h"
#include "ipc/allreduce.h"
#include "ipc/arena.h"
#include "ipc/shm.h"
#include "util.h"
#include "bench/bench_env.h"

static char e2[512]; /* the allreduce_ calls' error message (one thread per process) */

#define CHECK(x)                                                                                                 \
    do {                                                                                                         \
        long rc_ = (long)(x);                                                                                    \
        if (rc_ < 0) {                                                                                           \
            fprintf(stderr, "bench_grad_buckets: %s:%d: %s: %s\n", __FILE__, __LINE__, #x, strerror((int)-rc_)); \
            exit(1);                                                                                             \
        }                                                                                                        \
    } while (0)

enum { MODE_COMPUTE, MODE_ONE, MODE_LAYER, MODE_REDUCE, N_MODES, MAX_STEPS = 1000 };
static const char *const mode_name[N_MODES] = {"compute alone", "one bucket", "per layer", "reduce alone"};
static const char *const mode_key[N_MODES] = {"compute_alone", "one_bucket", "per_layer", "reduce_alone"};

typedef struct opts {
    int ranks, layers, hidden, seq, anchors, steps, warmup;
    const char *out;
} opts;

typedef struct shared_out {
    double step_ms[N_MODES][MAX_STEPS]; /* rank 0 */
    double wait_ms[N_MODES][MAX_STEPS];
} shared_out;

static dflash_config C;
static arena g_seg;

static double now_ms(void)
{
    return (double)df_now_ns() * 1e-6;
}

static int rank_main(int rank, const opts *o, shared_out *so)
{
    allreduce_comm c;
    allreduce_comm_init(&c);
    CHECK(allreduce_open_shm(&c, g_seg.base, g_seg.size, rank, o->ranks, e2, sizeof e2));
    c.timeout_ns = 120ll * 1000000000ll;
    buckets_plan one, layer;
    CHECK(buckets_plan_make(&one, &C, SIZE_MAX));
    CHECK(buckets_plan_make(&layer, &C, 0));
    df_rng r;
    df_rng_seed(&r, 1000 + (uint64_t)rank);
    int d = C.hidden, S = o->seq;
    float *E = malloc(sizeof(float) * (size_t)C.vocab * d), *H = malloc(sizeof(float) * (size_t)S * C.n_capture * d);
    int32_t *x = malloc(sizeof(int32_t) * (size_t)S);
    uint8_t *lm = malloc((size_t)S);
    if (!E || !H || !x || !lm)
        return 1;
    for (long i = 0; i < (long)C.vocab * d; i++)
        E[i] = (float)(0.3 * df_rng_normal(&r));
    for (long i = 0; i < (long)S * C.n_capture * d; i++)
        H[i] = (float)df_rng_normal(&r);
    for (int i = 0; i < S; i++) {
        x[i] = (int32_t)df_rng_below(&r, (uint64_t)C.vocab - 1);
        lm[i] = i >= S / 4;
    }
    dflash_params p, g;
    CHECK(dflash_params_alloc(&p, &C));
    CHECK(dflash_params_alloc(&g, &C));
    dflash_params_init_random(&p, &C, 7, 0.05f);
    dflash_frozen fz = {E, E};
    dflash_acts a = {0};
    dflash_batch b;
    CHECK(dflash_batch_init(&b, &C, S, o->anchors, H, x, lm, 5, (uint64_t)rank));
    for (int m = 0; m < N_MODES; m++) {
        for (int it = 0; it < o->warmup + o->steps; it++) {
            CHECK(allreduce_sum(&c, (float[1]){0}, 1, c.timeout_ns, e2, sizeof e2)); /* start the step together */
            double t0 = now_ms();
            int64_t wait_ns = 0;
            memset(g.data, 0, g.n * sizeof(float));
            dflash_stats st;
            if (m == MODE_COMPUTE) {
                CHECK(dflash_loss_and_grad(&C, &p, &fz, &b, &a, &g, 0, 64, &st));
            } else if (m == MODE_REDUCE) {
                uint64_t w0 = df_now_ns();
                CHECK(allreduce_sum(&c, g.data, g.n, c.timeout_ns, e2, sizeof e2));
                wait_ns = (int64_t)(df_now_ns() - w0);
            } else {
                buckets_step s;
                buckets_step_begin(&s, m == MODE_ONE ? &one : &layer, &c, g.data);
                CHECK(dflash_loss_and_grad_hooked(&C, &p, &fz, &b, &a, &g, 0, 64, &st, buckets_step_hook(&s)));
                CHECK(buckets_step_finish(&s, &wait_ns, e2, sizeof e2));
            }
            double t1 = now_ms();
            if (rank == 0 && it >= o->warmup) {
                so->step_ms[m][it - o->warmup] = t1 - t0;
                so->wait_ms[m][it - o->warmup] = (double)wait_ns * 1e-6;
            }
        }
    }
    allreduce_close(&c);
    return 0;
}

int main(int argc, char **argv)
{
    opts o = {.ranks = 2,
              .layers = 4,
              .hidden = 256,
              .seq = 256,
              .anchors = 16,
              .steps = 15,
              .warmup = 3,
              .out = "bench/results/grad_buckets.json"};
    static const struct option lo[] = {
        {"ranks", 1, 0, 'r'}, {"layers", 1, 0, 'l'}, {"hidden", 1, 0, 'd'}, {"seq", 1, 0, 's'},  {"anchors", 1, 0, 'a'},
        {"steps", 1, 0, 'k'}, {"warmup", 1, 0, 'w'}, {"out", 1, 0, 'o'},    {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 'r': o.ranks = (int)df_arg_int("bench_grad_buckets", "--ranks", optarg, 1, 64); break;
        case 'l': o.layers = (int)df_arg_int("bench_grad_buckets", "--layers", optarg, 1, 1024); break;
        case 'd': o.hidden = (int)df_arg_int("bench_grad_buckets", "--hidden", optarg, 1, 1 << 16); break;
        case 's': o.seq = (int)df_arg_int("bench_grad_buckets", "--seq", optarg, 1, 1 << 20); break;
        case 'a': o.anchors = (int)df_arg_int("bench_grad_buckets", "--anchors", optarg, 1, 1 << 20); break;
        case 'k': o.steps = (int)df_arg_int("bench_grad_buckets", "--steps", optarg, 1, INT_MAX); break;
        case 'w': o.warmup = (int)df_arg_int("bench_grad_buckets", "--warmup", optarg, 0, INT_MAX); break;
        case 'o': o.out = optarg; break;
        case 'h':
            printf("usage: %s [--ranks R] [--layers L] [--hidden D] [--seq S] [--anchors N] [--steps K] [--warmup W] "
                   "[--out PATH]\nThe CPU drafter step with its gradient all-reduce in one bucket vs per-layer "
                   "buckets overlapped with the backward, beside compute alone and reduce alone.\n",
                   argv[0]);
            return 0;
        default: return 2;
        }
    }
    if (o.ranks < 2 || o.ranks > ALLREDUCE_MAX_WORLD || o.layers < 1 || o.layers > DFLASH_MAX_LAYERS || o.hidden < 64 ||
        o.hidden % 64 || o.seq < 16 || o.anchors < 1 || o.steps < 1 || o.steps > MAX_STEPS || o.warmup < 0) {
        fprintf(stderr,
                "bench_grad_buckets: bad option value (--ranks 2..%d, --layers 1..%d, --hidden a multiple of "
                "64, --seq >= 16, --steps 1..%d)\n",
                ALLREDUCE_MAX_WORLD, DFLASH_MAX_LAYERS, MAX_STEPS);
        return 2;
    }
    dflash_config_tiny(&C);
    C.n_layers = o.layers;
    for (int l = 0; l < DFLASH_MAX_LAYERS; l++)
        C.layer_sliding[l] = 0;
    C.hidden = o.hidden;
    C.intermediate = 3 * o.hidden;
    C.head_dim = 64;
    C.n_heads = o.hidden / 64;
    C.n_kv_heads = C.n_heads >= 2 ? C.n_heads / 2 : 1;
    char err[256];
    if (dflash_config_validate(&C, err, sizeof err) < 0) {
        fprintf(stderr, "bench_grad_buckets: drafter shape: %s\n", err);
        return 2;
    }
    size_t n = dflash_config_param_count(&C);
    arena_init(&g_seg);
    CHECK(shm_create(&g_seg, allreduce_shm_bytes(o.ranks, 1u << 20), "bench-allreduce"));
    CHECK(allreduce_shm_format(g_seg.base, g_seg.size, o.ranks, 1u << 20, e2, sizeof e2));
    arena outa;
    arena_init(&outa);
    CHECK(shm_create(&outa, sizeof(shared_out), "bench-out"));
    shared_out *so = (shared_out *)outa.base;
    buckets_plan layer;
    CHECK(buckets_plan_make(&layer, &C, 0));
    bench_env env;
    bench_env_read(&env);
    printf("bench_grad_buckets  (%s, %ld cpus, commit %s): %d ranks, drafter %d layers d=%d (%zu params, %.1f MB "
           "of fp32 gradients), S=%d, %d anchors x block %d; %d buckets per layer mode\n",
           env.host, env.cpus, env.commit, o.ranks, o.layers, o.hidden, n, (double)n * 4e-6, o.seq, o.anchors,
           C.block_size, layer.n);
    fflush(stdout);
    pid_t pids[ALLREDUCE_MAX_WORLD];
    for (int r = 0; r < o.ranks; r++) {
        pids[r] = fork();
        if (pids[r] < 0) {
            perror("fork");
            return 1;
        }
        if (pids[r] == 0)
            _exit(rank_main(r, &o, so));
    }
    int bad = 0;
    for (int r = 0; r < o.ranks; r++) {
        int st;
        if (waitpid(pids[r], &st, 0) != pids[r] || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            bad = 1;
    }
    if (bad) {
        fprintf(stderr, "bench_grad_buckets: a rank failed\n");
        return 1;
    }
    double step[N_MODES], wait[N_MODES];
    for (int m = 0; m < N_MODES; m++) {
        step[m] = bench_median(so->step_ms[m], o.steps);
        wait[m] = bench_median(so->wait_ms[m], o.steps);
    }
    printf("\n%-14s %12s %16s\n", "mode", "step ms", "exposed wait ms");
    for (int m = 0; m < N_MODES; m++)
        printf("%-14s %12.2f %16.2f\n", mode_name[m], step[m], m == MODE_COMPUTE ? 0.0 : wait[m]);
    double hidden_frac = step[MODE_ONE] - step[MODE_COMPUTE] > 0
                             ? (step[MODE_ONE] - step[MODE_LAYER]) / (step[MODE_ONE] - step[MODE_COMPUTE])
                             : 0.0;
    printf("per layer vs one bucket: %.3fx step time; %.0f%% of the reduction's cost hidden "
           "(medians of %d steps, rank 0)\n",
           step[MODE_ONE] / step[MODE_LAYER], 100.0 * hidden_frac, o.steps);
    char json[4096];
    int k =
        snprintf(json, sizeof json,
                 "{\n  \"bench\": \"grad_buckets\",\n  \"date\": \"%s\",\n  \"host\": \"%s\",\n  \"cpus\": %ld,\n"
                 "  \"commit\": \"%s\",\n  \"ranks\": %d,\n  \"layers\": %d,\n  \"hidden\": %d,\n  \"params\": %zu,\n"
                 "  \"seq\": %d,\n  \"anchors\": %d,\n  \"block_size\": %d,\n  \"steps\": %d,\n  \"warmup\": %d,\n"
                 "  \"buckets_per_layer_mode\": %d,\n",
                 env.date, env.host, env.cpus, env.commit, o.ranks, o.layers, o.hidden, n, o.seq, o.anchors,
                 C.block_size, o.steps, o.warmup, layer.n);
    for (int m = 0; m < N_MODES && k > 0 && (size_t)k < sizeof json; m++)
        k += snprintf(json + k, sizeof json - (size_t)k, "  \"%s_step_ms\": %.3f,\n  \"%s_wait_ms\": %.3f,\n",
                      mode_key[m], step[m], mode_key[m], wait[m]);
    if (k > 0 && (size_t)k < sizeof json)
        k += snprintf(
            json + k, sizeof json - (size_t)k,
            "  \"speedup_per_layer_vs_one_bucket\": %.4f,\n  \"reduction_cost_hidden_frac\": %.4f,\n"
            "  \"note\": \"medians over the timed steps of rank 0; step = forward + backward + the reduction "
            "(every rank starts a step together); exposed wait = time in allreduce_wait_all after the backward\"\n}\n",
            step[MODE_ONE] / step[MODE_LAYER], hidden_frac);
    if (k <= 0 || (size_t)k >= sizeof json) {
        fprintf(stderr, "bench_grad_buckets: JSON too long\n");
        return 1;
    }
    int rc = df_write_file_atomic(o.out, json, (size_t)k);
    if (rc < 0) {
        fprintf(stderr, "bench_grad_buckets: %s: %s\n", o.out, strerror(-rc));
        return 1;
    }
    printf("wrote %s\n", o.out);
    arena_close(&outa);
    arena_close(&g_seg);
    return 0;
}
