/* test_allreduce: the shared-memory all-reduce across real forked processes over a real
 * memfd segment (common/ipc/allreduce.h, shm backend).
 *
 * Every rank regenerates every rank's input from (seed, iteration, rank), computes the
 * reference sum in rank order 0+1+...+R-1 in float32 itself, and memcmp's it against what
 * allreduce_sum gave it: so "bit-identical on every rank, in rank order" is checked on
 * every rank. The inputs span 2^-20..2^20 so the order of the additions matters (checked:
 * the reverse order gives different bits). Cases:
 *   setup      errors: unformatted (-EPROTO), wrong world, double join (-EBUSY), stale
 *              after re-format (-ESTALE), bucket out of order; world 1 = identity
 *   sizes      R = 2, 3, 4; sizes 0..10007 around the 1000-float round size
 *   stress     R = 3, 4; 200 iterations, random sizes, random per-rank sleeps
 *   bucketed   buckets in reverse memory order (as the backward pass makes them) give the
 *              bits of one big reduction; -EBUSY for a plain call while buckets fly
 *   mismatch   one rank passes another n: every rank gets -EINVAL, the group goes on
 *   crash      a rank SIGKILLs itself between two barriers of a reduction (DF_AR_CRASH):
 *              the others return -ETIMEDOUT; after a re-format a new group works
 *   kill       the parent SIGKILLs a rank of a group reducing in a loop: -ETIMEDOUT
 *   abort      allreduce_shm_abort releases ranks waiting for a rank that never came: -ECANCELED
 * The seed is printed; ALLREDUCE_TEST_SEED=<n> replays a run.
 */
#include "ipc/allreduce.h"
#include "ipc/shm.h"
#include "util.h"
#include "test_helpers.h"

#include <math.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static char e2[512]; /* the allreduce_ calls' error message (one thread per process) */

#define MAXF 1000                    /* floats per round in most cases: sizes straddle multiples of it */
#define TMO_NS (20ll * 1000000000ll) /* generous: a slow CI machine never trips it */

enum { C_OK = 0, C_FAIL = 1, C_TIMEDOUT = 10, C_CANCELED = 11, C_INVAL = 12, C_STALE = 13, C_OTHER = 20 };

static uint64_t g_seed;
static arena g_seg; /* the segment of the current case; children inherit the mapping */

static int code_of(int rc)
{
    switch (rc) {
    case 0: return C_OK;
    case -ETIMEDOUT: return C_TIMEDOUT;
    case -ECANCELED: return C_CANCELED;
    case -EINVAL: return C_INVAL;
    case -ESTALE: return C_STALE;
    default: return C_OTHER;
    }
}

/* Rank `rank`'s input for iteration `iter`: normal * 2^[-20, 20]. */
static void fill_input(float *x, size_t n, uint64_t iter, int rank)
{
    df_rng r;
    df_rng_seed(&r, df_hash64(g_seed ^ df_hash64(iter * 1000003ull + (uint64_t)rank + 1)));
    for (size_t i = 0; i < n; i++)
        x[i] = (float)ldexp(df_rng_normal(&r), (int)df_rng_below(&r, 41) - 20);
}

/* ref = in_0 + in_1 + ... + in_{R-1} in that order (reverse != 0: the other way round). */
static void reference(float *ref, size_t n, int world, uint64_t iter, int reverse)
{
    float *tmp = malloc((n ? n : 1) * sizeof(float));
    T_ASSERT(tmp);
    for (int k = 0; k < world; k++) {
        int rk = reverse ? world - 1 - k : k;
        fill_input(k == 0 ? ref : tmp, n, iter, rk);
        if (k > 0)
            for (size_t i = 0; i < n; i++)
                ref[i] += tmp[i];
    }
    free(tmp);
}

/* Compare against the reference; print the first difference. 0 = equal. */
static int check_equal(const float *got, const float *ref, size_t n, int rank, const char *what)
{
    if (memcmp(got, ref, n * sizeof(float)) == 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &ref[i], sizeof(float)) != 0) {
            fprintf(stderr, "rank %d: %s: element %zu of %zu is %.9g, reference %.9g\n", rank, what, i, n, got[i],
                    ref[i]);
            break;
        }
    return 1;
}

static void new_segment(int world, uint64_t max_floats)
{
    uint64_t bytes = allreduce_shm_bytes(world, max_floats);
    T_ASSERT(bytes > 0);
    arena_close(&g_seg);
    T_ASSERT_RC(shm_create(&g_seg, bytes, "allreduce-test"));
    T_ASSERT_RC(allreduce_shm_format(g_seg.base, g_seg.size, world, max_floats, e2, sizeof e2));
}

static int join(allreduce_comm *c, int rank, int world)
{
    allreduce_comm_init(c);
    int rc = allreduce_open_shm(c, g_seg.base, g_seg.size, rank, world, e2, sizeof e2);
    if (rc)
        fprintf(stderr, "rank %d: allreduce_open_shm: %s\n", rank, e2);
    return rc;
}

typedef int (*rank_fn)(int rank, int world, void *arg);

/* Fork `nproc` processes as ranks 0..nproc-1 (of `world`) running fn; returns without
 * waiting. Each child has a 120 s alarm so a hang is a failure, not a stuck suite. */
static void spawn(pid_t *pids, int nproc, int world, rank_fn fn, void *arg)
{
    fflush(NULL);
    for (int r = 0; r < nproc; r++) {
        pids[r] = fork();
        T_ASSERT(pids[r] >= 0);
        if (pids[r] == 0) {
            alarm(120);
            _exit(fn(r, world, arg));
        }
    }
}

/* Wait for the ranks; status[r] = exit code, or -signal. */
static void reap(const pid_t *pids, int nproc, int *status)
{
    for (int r = 0; r < nproc; r++) {
        int st;
        T_ASSERT(waitpid(pids[r], &st, 0) == pids[r]);
        status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
    }
}

static void run_group(int world, rank_fn fn, void *arg, const char *name)
{
    pid_t pids[ALLREDUCE_MAX_WORLD];
    int st[ALLREDUCE_MAX_WORLD];
    spawn(pids, world, world, fn, arg);
    reap(pids, world, st);
    for (int r = 0; r < world; r++) {
        if (st[r] != 0)
            fprintf(stderr, "%s: world %d: rank %d ended with %d\n", name, world, r, st[r]);
        T_ASSERT(st[r] == 0);
    }
}

/* --- sizes ---------------------------------------------------------------------------- */

static const size_t k_sizes[] = {0, 1, 15, 16, 17, 999, 1000, 1001, 2047, 3001, 10007};

static int rank_sizes(int rank, int world, void *arg)
{
    allreduce_comm c;
    if (join(&c, rank, world))
        return C_FAIL;
    float *buf = malloc(10007 * sizeof(float)), *ref = malloc(10007 * sizeof(float));
    for (size_t k = 0; k < DF_ARRAY_LEN(k_sizes); k++) {
        size_t n = k_sizes[k];
        fill_input(buf, n, k, rank);
        int rc = allreduce_sum(&c, buf, n, TMO_NS, e2, sizeof e2);
        if (rc) {
            fprintf(stderr, "rank %d: n=%zu: %s\n", rank, n, e2);
            return code_of(rc);
        }
        reference(ref, n, world, k, 0);
        if (check_equal(buf, ref, n, rank, "sizes"))
            return C_FAIL;
    }
    allreduce_close(&c);
    free(buf);
    free(ref);
    return C_OK;
}

/* --- stress ----------------------------------------------------------------------------- */

#define STRESS_ITERS 200
#define STRESS_MAXN 3500

static size_t stress_n(uint64_t iter)
{
    return 1 + (size_t)(df_hash64(g_seed + iter) % STRESS_MAXN);
}

static int rank_stress(int rank, int world, void *arg)
{
    allreduce_comm c;
    if (join(&c, rank, world))
        return C_FAIL;
    float *buf = malloc(STRESS_MAXN * sizeof(float)), *ref = malloc(STRESS_MAXN * sizeof(float));
    df_rng jitter;
    df_rng_seed(&jitter, g_seed * 31 + (uint64_t)rank + 7);
    for (uint64_t it = 0; it < STRESS_ITERS; it++) {
        size_t n = stress_n(it);
        fill_input(buf, n, 100 + it, rank);
        /* shake the timing: a quarter of the calls start up to 0.5 ms late on this rank */
        if (df_rng_below(&jitter, 4) == 0)
            usleep((useconds_t)df_rng_below(&jitter, 500));
        int rc = allreduce_sum(&c, buf, n, TMO_NS, e2, sizeof e2);
        if (rc) {
            fprintf(stderr, "rank %d: iteration %llu: %s\n", rank, (unsigned long long)it, e2);
            return code_of(rc);
        }
        reference(ref, n, world, 100 + it, 0);
        if (check_equal(buf, ref, n, rank, "stress"))
            return C_FAIL;
    }
    allreduce_close(&c);
    free(buf);
    free(ref);
    return C_OK;
}

/* --- bucketed ----------------------------------------------------------------------------- */

#define BUCKET_N 7777
static const size_t k_buckets[] = {1234, 1, 2500, 0, 1000, 17}; /* + the rest */

static int rank_bucketed(int rank, int world, void *arg)
{
    allreduce_comm c;
    if (join(&c, rank, world))
        return C_FAIL;
    c.timeout_ns = TMO_NS;
    float *one = malloc(BUCKET_N * sizeof(float)), *bk = malloc(BUCKET_N * sizeof(float));
    float *ref = malloc(BUCKET_N * sizeof(float));
    for (uint64_t step = 0; step < 3; step++) {
        fill_input(one, BUCKET_N, 500 + step, rank);
        memcpy(bk, one, BUCKET_N * sizeof(float));
        int rc = allreduce_sum(&c, one, BUCKET_N, TMO_NS, e2, sizeof e2);
        if (rc)
            return code_of(rc);
        /* Buckets from the end of the buffer backwards, like gradients of the last layer
         * first; the caller keeps working while they reduce. */
        size_t end = BUCKET_N;
        uint32_t idx = 0;
        for (size_t k = 0; k <= DF_ARRAY_LEN(k_buckets); k++) {
            size_t len = k < DF_ARRAY_LEN(k_buckets) ? k_buckets[k] : end;
            end -= len;
            rc = allreduce_bucket_ready(&c, idx++, bk + end, len, e2, sizeof e2);
            if (rc) {
                fprintf(stderr, "rank %d: allreduce_bucket_ready: %s\n", rank, e2);
                return C_FAIL;
            }
            if (k == 0 && allreduce_sum(&c, ref, 1, TMO_NS, e2, sizeof e2) != -EBUSY) {
                fprintf(stderr, "rank %d: plain reduction with buckets in flight not -EBUSY\n", rank);
                return C_FAIL;
            }
        }
        T_ASSERT(end == 0);
        reference(ref, BUCKET_N, world, 500 + step, 0); /* overlaps the buckets */
        rc = allreduce_wait_all(&c, e2, sizeof e2);
        if (rc) {
            fprintf(stderr, "rank %d: allreduce_wait_all: %s\n", rank, e2);
            return code_of(rc);
        }
        if (check_equal(bk, one, BUCKET_N, rank, "bucketed vs one reduction") ||
            check_equal(one, ref, BUCKET_N, rank, "one reduction vs reference"))
            return C_FAIL;
    }
    allreduce_close(&c);
    free(one);
    free(bk);
    free(ref);
    return C_OK;
}

/* --- mismatch ----------------------------------------------------------------------------- */

static int rank_mismatch(int rank, int world, void *arg)
{
    allreduce_comm c;
    float buf[64], ref[64];
    if (join(&c, rank, world))
        return C_FAIL;
    fill_input(buf, 64, 900, rank);
    int rc = allreduce_sum(&c, buf, rank == world - 1 ? 50 : 40, TMO_NS, e2, sizeof e2);
    if (rc != -EINVAL) {
        fprintf(stderr, "rank %d: mismatched n gave %d (%s), want -EINVAL\n", rank, rc, e2);
        return C_FAIL;
    }
    /* a disagreement does not break the group: the next matched call works */
    fill_input(buf, 64, 901, rank);
    rc = allreduce_sum(&c, buf, 64, TMO_NS, e2, sizeof e2);
    if (rc)
        return code_of(rc);
    reference(ref, 64, world, 901, 0);
    if (check_equal(buf, ref, 64, rank, "after mismatch"))
        return C_FAIL;
    allreduce_close(&c);
    return C_OK;
}

/* --- failures ----------------------------------------------------------------------------- */

/* Reduce 2500 floats (3 rounds, 6 barriers) in a loop until an error; the loop only ends by
 * an error, a signal or the 120 s alarm. */
static int rank_loop(int rank, int world, void *arg)
{
    const int64_t tmo = *(const int64_t *)arg;
    allreduce_comm c;
    if (join(&c, rank, world))
        return C_FAIL;
    float *buf = malloc(2500 * sizeof(float));
    fill_input(buf, 2500, 77, rank);
    for (uint64_t it = 0;; it++) {
        /* keep the values bounded: scale down so the loop never overflows to inf */
        for (size_t i = 0; i < 2500; i++)
            buf[i] *= 1.0f / (float)world;
        int rc = allreduce_sum(&c, buf, 2500, tmo, e2, sizeof e2);
        if (rc) {
            printf("  rank %d: iteration %llu: %s\n", rank, (unsigned long long)it, e2);
            /* sticky: the group stays broken for later calls too */
            int rc2 = allreduce_sum(&c, buf, 2500, tmo, e2, sizeof e2);
            if (rc2 != rc)
                return C_FAIL;
            allreduce_close(&c);
            return code_of(rc);
        }
    }
}

static int rank_crash(int rank, int world, void *arg)
{
    /* rank 1 dies on entering its 3rd barrier: round 1, barrier 1 of its first call */
    T_ASSERT(setenv("DF_AR_CRASH", "1:3", 1) == 0);
    return rank_loop(rank, world, arg);
}

static void expect_failure(int world, rank_fn fn, int64_t tmo, int victim, const char *name, int kill_after_us)
{
    pid_t pids[ALLREDUCE_MAX_WORLD];
    int st[ALLREDUCE_MAX_WORLD];
    spawn(pids, world, world, fn, &tmo);
    if (kill_after_us > 0) {
        usleep((useconds_t)kill_after_us);
        T_ASSERT(kill(pids[victim], SIGKILL) == 0);
    }
    reap(pids, world, st);
    for (int r = 0; r < world; r++) {
        int want = r == victim ? -SIGKILL : C_TIMEDOUT;
        if (st[r] != want)
            fprintf(stderr, "%s: rank %d ended with %d, want %d\n", name, r, st[r], want);
        T_ASSERT(st[r] == want);
    }
}

static void test_failures(void)
{
    const int64_t tmo = 300ll * 1000000; /* 0.3 s: only the dead rank can make it expire */
    new_segment(3, MAXF);
    expect_failure(3, rank_crash, tmo, 1, "crash", 0);
    printf("crash: rank 1 SIGKILLed itself mid-reduction; ranks 0, 2: -ETIMEDOUT\n");

    /* the orchestrator's restart: re-format, start a fresh group on the same segment */
    T_ASSERT_RC(allreduce_shm_format(g_seg.base, g_seg.size, 3, MAXF, e2, sizeof e2));
    run_group(3, rank_sizes, NULL, "restart");
    printf("restart: re-formatted segment, new group reduces correctly\n");

    new_segment(4, MAXF);
    expect_failure(4, rank_loop, tmo, 2, "kill", 50000);
    printf("kill: rank 2 SIGKILLed by the parent while reducing; others: -ETIMEDOUT\n");

    /* abort: ranks 0, 1 of world 3 wait for a rank 2 that never comes (timeout 60 s, far
     * beyond the test); the orchestrator's abort must release them with -ECANCELED. */
    new_segment(3, MAXF);
    pid_t pids[2];
    int st[2];
    int64_t long_tmo = 60ll * 1000000000ll;
    spawn(pids, 2, 3, rank_loop, &long_tmo);
    usleep(100000);
    T_ASSERT_RC(allreduce_shm_abort(g_seg.base, g_seg.size, e2, sizeof e2));
    reap(pids, 2, st);
    T_ASSERT(st[0] == C_CANCELED && st[1] == C_CANCELED);
    printf("abort: allreduce_shm_abort released ranks waiting for an absent peer: -ECANCELED\n");
}

/* --- single-process checks ------------------------------------------------------------------ */

static void test_setup(void)
{
    T_ASSERT(allreduce_shm_bytes(0, 10) == 0 && allreduce_shm_bytes(ALLREDUCE_MAX_WORLD + 1, 10) == 0);
    T_ASSERT(allreduce_shm_bytes(2, 0) == 0 && allreduce_shm_bytes(2, 10) > 0);

    allreduce_comm c0, c1;
    allreduce_comm_init(&c0);
    allreduce_comm_init(&c1);
    arena_close(&g_seg);
    T_ASSERT_RC(shm_create(&g_seg, allreduce_shm_bytes(2, 100), "allreduce-setup"));
    T_ASSERT(allreduce_open_shm(&c0, g_seg.base, g_seg.size, 0, 2, e2, sizeof e2) == -EPROTO);
    T_ASSERT(allreduce_shm_format(g_seg.base, allreduce_shm_bytes(2, 100), 2, 113, e2, sizeof e2) ==
             -EINVAL); /* small */
    T_ASSERT(strstr(e2, "needs"));
    T_ASSERT_RC(allreduce_shm_format(g_seg.base, g_seg.size, 2, 100, e2, sizeof e2));
    T_ASSERT(allreduce_open_shm(&c0, g_seg.base, g_seg.size, 0, 3, e2, sizeof e2) == -EINVAL); /* world */
    T_ASSERT(allreduce_open_shm(&c0, g_seg.base, g_seg.size, 2, 2, e2, sizeof e2) == -EINVAL); /* rank */
    T_ASSERT_RC(allreduce_open_shm(&c0, g_seg.base, g_seg.size, 0, 2, e2, sizeof e2));
    T_ASSERT(allreduce_open_shm(&c1, g_seg.base, g_seg.size, 0, 2, e2, sizeof e2) == -EBUSY);
    T_ASSERT(strstr(e2, "re-format"));
    float x[4] = {1, 2, 3, 4};
    T_ASSERT(allreduce_bucket_ready(&c0, 1, x, 4, e2, sizeof e2) == -EINVAL); /* must start at 0 */
    T_ASSERT_RC(allreduce_wait_all(&c0, e2, sizeof e2));                      /* empty step */
    /* a re-format under a live handle: the handle is stale, not silently in the new group */
    T_ASSERT_RC(allreduce_shm_format(g_seg.base, g_seg.size, 2, 100, e2, sizeof e2));
    T_ASSERT(allreduce_sum(&c0, x, 4, TMO_NS, e2, sizeof e2) == -ESTALE);
    T_ASSERT_RC(allreduce_open_shm(&c1, g_seg.base, g_seg.size, 0, 2, e2, sizeof e2)); /* the new group's rank 0 */
    allreduce_close(&c0); /* stale: must not give back the new group's rank 0 */
    T_ASSERT(c0.backend == ALLREDUCE_NONE && c0.impl == NULL);
    allreduce_close(&c0); /* twice is fine */
    T_ASSERT(allreduce_open_shm(&c0, g_seg.base, g_seg.size, 0, 2, e2, sizeof e2) == -EBUSY);
    allreduce_close(&c1);
    T_ASSERT_RC(allreduce_open_shm(&c1, g_seg.base, g_seg.size, 0, 2, e2, sizeof e2)); /* a clean close gives back */
    allreduce_close(&c1);

    /* world 1: the sum of one rank is its own input, bit for bit, in rounds of 7 */
    new_segment(1, 7);
    T_ASSERT_RC(join(&c0, 0, 1));
    float a[53], b[53];
    fill_input(a, 53, 1, 0);
    memcpy(b, a, sizeof a);
    T_ASSERT_RC(allreduce_sum(&c0, a, 53, TMO_NS, e2, sizeof e2));
    T_ASSERT(memcmp(a, b, sizeof a) == 0);
    for (uint32_t i = 0; i < 5; i++)
        T_ASSERT_RC(allreduce_bucket_ready(&c0, i, a + 10 * i, i < 4 ? 10 : 13, e2, sizeof e2));
    T_ASSERT_RC(allreduce_wait_all(&c0, e2, sizeof e2));
    T_ASSERT(memcmp(a, b, sizeof a) == 0);
    allreduce_close(&c0);

#ifndef DF_WITH_CUDA
    unsigned char id[128];
    T_ASSERT(allreduce_nccl_get_unique_id(id, e2, sizeof e2) == -ENOTSUP);
    T_ASSERT(allreduce_open_nccl(&c0, id, 0, 1, 0, e2, sizeof e2) == -ENOTSUP);
    T_ASSERT(strstr(e2, "CUDA=1"));
#endif
    printf("setup: format/open errors, stale handle, double join, world 1 identity: ok\n");
}

/* The data must make the order matter, or the bit-identity checks prove nothing. */
static void test_order_matters(void)
{
    enum { N = 4096 };
    static float fwd[N], rev[N];
    reference(fwd, N, 4, 3, 0);
    reference(rev, N, 4, 3, 1);
    T_ASSERT(memcmp(fwd, rev, sizeof fwd) != 0);
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        printf("usage: %s   (env ALLREDUCE_TEST_SEED=<n> replays a seed)\n"
               "Tests the shared-memory all-reduce across forked ranks.\n",
               argv[0]);
        return strcmp(argv[1], "--help") == 0 ? 0 : 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *s = getenv("ALLREDUCE_TEST_SEED");
    g_seed = s ? strtoull(s, NULL, 0) : (df_hash64((uint64_t)time(NULL)) ^ (uint64_t)getpid());
    printf("seed %llu (replay: ALLREDUCE_TEST_SEED=%llu)\n", (unsigned long long)g_seed, (unsigned long long)g_seed);
    arena_init(&g_seg);
    signal(SIGPIPE, SIG_IGN);

    test_order_matters();
    test_setup();
    for (int world = 2; world <= 4; world++) {
        new_segment(world, MAXF);
        run_group(world, rank_sizes, NULL, "sizes");
    }
    printf("sizes: R=2,3,4, %zu sizes 0..10007 (rounds of %d): bit-identical to rank-order "
           "reference on every rank\n",
           DF_ARRAY_LEN(k_sizes), MAXF);
    for (int world = 3; world <= 4; world++) {
        new_segment(world, MAXF);
        run_group(world, rank_stress, NULL, "stress");
    }
    printf("stress: R=3,4 x %d iterations, random sizes and per-rank sleeps: bit-identical\n", STRESS_ITERS);
    new_segment(3, MAXF);
    run_group(3, rank_bucketed, NULL, "bucketed");
    printf("bucketed: 7 buckets in reverse order x 3 steps == one reduction, bit for bit\n");
    new_segment(3, MAXF);
    run_group(3, rank_mismatch, NULL, "mismatch");
    printf("mismatch: n disagreement -> -EINVAL on every rank, group continues\n");
    test_failures();
    arena_close(&g_seg);
    printf("test_allreduce: all passed\n");
    return 0;
}
