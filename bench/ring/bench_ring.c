/* bench_ring.c: what a ring hand-off costs between two processes, beside the kernel's
 * own primitives measured in the same run.
 *
 *   handoffs/s   producer process -> ring (16 slots) -> consumer process; the descriptor
 *                names the payload by reference (offset + checksum), nothing is copied
 *   wake p50/p99 ping-pong through two 1-slot rings: each side is blocked in futex wait
 *                when the other publishes; one-way latency = round trip / 2
 *   pipe, eventfd the same ping-pong through two pipes / two eventfds
 *
 * Each figure is measured --repeat times (rounds interleave ring, pipe and eventfd, so a
 * burst of other load on the host hits all three alike) and the median round is kept.
 * Prints a table and writes JSON (date, host, commit, every figure) to --out
 * (default bench/results/ring.json) with df_write_file_atomic.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ipc/arena.h"
#include "ipc/ring.h"
#include "ipc/shm.h"
#include "util.h"
#include "bench/bench_env.h"

#define CHECK(expr)                                                                        \
    do {                                                                                   \
        if (!(expr))                                                                       \
            df_die(1, "%s:%d: %s failed: %s", __FILE__, __LINE__, #expr, strerror(errno)); \
    } while (0)

static const int64_t WAIT_NS = 5LL * 1000 * 1000 * 1000;

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

typedef struct lat {
    double p50_us, p99_us, mean_us;
} lat;

static lat summarize(uint64_t *rtt_ns, int n)
{
    qsort(rtt_ns, (size_t)n, sizeof *rtt_ns, cmp_u64);
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += (double)rtt_ns[i];
    lat l = {rtt_ns[n / 2] / 2e3, rtt_ns[(int)((double)n * 0.99)] / 2e3, sum / n / 2e3};
    return l;
}

static void wait_child(pid_t pid)
{
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        df_die(1, "bench child failed (status 0x%x)", st);
}

/* --- hand-offs per second --------------------------------------------------------- */
static double bench_handoffs(void *mem, uint64_t bytes, uint64_t n)
{
    ring r;
    DF_CHECK_ERR(ring_format(mem, bytes, 16, 3, 1));
    DF_CHECK_ERR(ring_open(&r, mem, bytes));
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) { /* consumer */
        uint64_t sum = 0, xor_ids = 0, xor_want = 0;
        for (uint64_t i = 0; i < n; i++) {
            uint32_t s;
            DF_CHECK_ERR(ring_acquire_ready(&r, 2, 1, WAIT_NS, &s));
            const ring_desc *d = ring_desc_at(&r, s);
            /* FIFO-ish, not strict: a consumer preempted mid-scan can take a newer slot */
            sum += d->offset;
            xor_ids ^= df_hash64(d->batch_id);
            xor_want ^= df_hash64(i);
            DF_CHECK_ERR(ring_release(&r, s, 2, 1));
        }
        /* every batch exactly once: the sums and the hashed-id xor match */
        _exit(sum == n * (n - 1) / 2 && xor_ids == xor_want ? 0 : 3);
    }
    uint64_t t0 = df_now_ns();
    for (uint64_t i = 0; i < n; i++) {
        uint32_t s;
        DF_CHECK_ERR(ring_acquire_free(&r, 1, 1, WAIT_NS, &s));
        ring_desc *d = ring_desc_at(&r, s);
        d->batch_id = i;
        d->offset = i;
        d->bytes = 4096;
        DF_CHECK_ERR(ring_publish(&r, s, 1, 1));
    }
    wait_child(pid);
    return (double)n / ((double)(df_now_ns() - t0) * 1e-9);
}

/* --- ping-pong through two rings ---------------------------------------------------- */
static lat bench_ring_pingpong(void *mem, uint64_t bytes, int iters)
{
    uint64_t rb = ring_shm_bytes(1);
    CHECK(2 * rb <= bytes);
    ring ping, pong;
    DF_CHECK_ERR(ring_format(mem, rb, 1, 3, 1));
    DF_CHECK_ERR(ring_format((char *)mem + rb, rb, 1, 3, 2));
    DF_CHECK_ERR(ring_open(&ping, mem, rb));
    DF_CHECK_ERR(ring_open(&pong, (char *)mem + rb, rb));
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        for (int i = 0; i < iters; i++) {
            uint32_t s, o;
            DF_CHECK_ERR(ring_acquire_ready(&ping, 2, 1, WAIT_NS, &s));
            uint64_t v = ring_desc_at(&ping, s)->user[0];
            DF_CHECK_ERR(ring_release(&ping, s, 2, 1));
            DF_CHECK_ERR(ring_acquire_free(&pong, 2, 1, WAIT_NS, &o));
            ring_desc_at(&pong, o)->user[0] = v;
            DF_CHECK_ERR(ring_publish(&pong, o, 2, 1));
        }
        _exit(0);
    }
    uint64_t *rtt = calloc((size_t)iters, sizeof *rtt);
    CHECK(rtt != NULL);
    for (int i = 0; i < iters; i++) {
        uint32_t s, o;
        uint64_t t0 = df_now_ns();
        DF_CHECK_ERR(ring_acquire_free(&ping, 1, 1, WAIT_NS, &s));
        ring_desc_at(&ping, s)->user[0] = (uint64_t)i;
        DF_CHECK_ERR(ring_publish(&ping, s, 1, 1));
        DF_CHECK_ERR(ring_acquire_ready(&pong, 1, 1, WAIT_NS, &o));
        if (ring_desc_at(&pong, o)->user[0] != (uint64_t)i)
            df_die(1, "ping-pong: wrong reply");
        DF_CHECK_ERR(ring_release(&pong, o, 1, 1));
        rtt[i] = df_now_ns() - t0;
    }
    wait_child(pid);
    lat l = summarize(rtt, iters);
    free(rtt);
    return l;
}

/* --- ping-pong through two pipes or two eventfds ----------------------------------- */
static void xfer(int wfd, int rfd, int is_eventfd)
{
    uint64_t v = 1;
    size_t len = is_eventfd ? 8 : 1;
    CHECK(write(wfd, &v, len) == (ssize_t)len);
    CHECK(read(rfd, &v, len) == (ssize_t)len);
}

static lat bench_fd_pingpong(int is_eventfd, int iters)
{
    int a[2], b[2]; /* a: parent -> child, b: child -> parent; [0] read end, [1] write end */
    if (is_eventfd) {
        CHECK((a[0] = a[1] = eventfd(0, 0)) >= 0);
        CHECK((b[0] = b[1] = eventfd(0, 0)) >= 0);
    } else {
        CHECK(pipe(a) == 0 && pipe(b) == 0);
    }
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        for (int i = 0; i < iters; i++) {
            uint64_t v;
            size_t len = is_eventfd ? 8 : 1;
            CHECK(read(a[0], &v, len) == (ssize_t)len);
            v = 1;
            CHECK(write(b[1], &v, len) == (ssize_t)len);
        }
        _exit(0);
    }
    uint64_t *rtt = calloc((size_t)iters, sizeof *rtt);
    CHECK(rtt != NULL);
    for (int i = 0; i < iters; i++) {
        uint64_t t0 = df_now_ns();
        xfer(a[1], b[0], is_eventfd);
        rtt[i] = df_now_ns() - t0;
    }
    wait_child(pid);
    close(a[0]);
    close(b[0]);
    if (!is_eventfd) {
        close(a[1]);
        close(b[1]);
    }
    lat l = summarize(rtt, iters);
    free(rtt);
    return l;
}

static double median_of(double *v, int n) /* median of n <= 15 values (sorted in place) */
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v[n / 2];
}

static lat median_lat(const lat *l, int n)
{
    double a[15], b[15], c[15];
    for (int i = 0; i < n; i++) {
        a[i] = l[i].p50_us;
        b[i] = l[i].p99_us;
        c[i] = l[i].mean_us;
    }
    lat m = {median_of(a, n), median_of(b, n), median_of(c, n)};
    return m;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_ring [--handoffs N] [--iters N] [--repeat R] [--out PATH]\n"
               "  --handoffs N  hand-offs for the throughput figure (default 1000000)\n"
               "  --iters N     ping-pong round trips per latency figure (default 20000)\n"
               "  --repeat R    rounds of every figure, the median is kept (default 3, max 15)\n"
               "  --out PATH    JSON output (default bench/results/ring.json)\n");
}

int main(int argc, char **argv)
{
    uint64_t handoffs = 1000000;
    int iters = 20000, repeat = 3;
    const char *out = "bench/results/ring.json";
    static const struct option opts[] = {{"handoffs", 1, 0, 'n'}, {"iters", 1, 0, 'i'}, {"repeat", 1, 0, 'r'},
                                         {"out", 1, 0, 'o'},      {"help", 0, 0, 'h'},  {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "n:i:r:o:h", opts, NULL)) != -1) {
        switch (o) {
        case 'n': handoffs = (uint64_t)df_arg_int("bench_ring", "--handoffs", optarg, 1, INT64_MAX); break;
        case 'i': iters = (int)df_arg_int("bench_ring", "--iters", optarg, 1, INT_MAX); break;
        case 'r': repeat = (int)df_arg_int("bench_ring", "--repeat", optarg, 1, INT_MAX); break;
        case 'o': out = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (handoffs == 0 || iters < 100 || repeat < 1 || repeat > 15) {
        fprintf(stderr, "bench_ring: --handoffs must be > 0, --iters >= 100, --repeat in [1, 15]\n");
        return 2;
    }
    df_log_init("bench_ring");
    arena seg;
    arena_init(&seg);
    uint64_t bytes = 1 << 16;
    DF_CHECK_ERR(shm_create(&seg, bytes, "bench_ring"));

    double hps_r[15];
    lat lr_r[15], lp_r[15], le_r[15];
    for (int k = 0; k < repeat; k++) {
        hps_r[k] = bench_handoffs(seg.base, bytes, handoffs);
        lr_r[k] = bench_ring_pingpong(seg.base, bytes, iters);
        lp_r[k] = bench_fd_pingpong(0, iters);
        le_r[k] = bench_fd_pingpong(1, iters);
    }
    double hps = median_of(hps_r, repeat);
    lat lr = median_lat(lr_r, repeat), lp = median_lat(lp_r, repeat), le = median_lat(le_r, repeat);
    arena_close(&seg);

    bench_env env;
    bench_env_read(&env);
    const char *host = env.host, *commit = env.commit, *date = env.date;
    long ncpu = env.cpus;
    double load[1] = {-1}; /* other work on the host skews every figure: record it */
    if (getloadavg(load, 1) != 1)
        load[0] = -1;

    printf("bench_ring  (%s, %ld cpus, load average %.2f, commit %s)\n", host, ncpu, load[0], commit);
    printf("  ring hand-offs, 2 processes, 16 slots : %12.0f /s  (%.0f ns each)\n", hps, 1e9 / hps);
    printf("  one-way wake latency (ping-pong / 2)   p50 us   p99 us  mean us\n");
    printf("    ring (futex)                       %8.2f %8.2f %8.2f\n", lr.p50_us, lr.p99_us, lr.mean_us);
    printf("    pipe                               %8.2f %8.2f %8.2f\n", lp.p50_us, lp.p99_us, lp.mean_us);
    printf("    eventfd                            %8.2f %8.2f %8.2f\n", le.p50_us, le.p99_us, le.mean_us);

    char json[2048];
    int n = snprintf(
        json, sizeof json,
        "{\n  \"bench\": \"ring\",\n  \"date\": \"%s\",\n  \"host\": \"%s\",\n  \"cpus\": %ld,\n"
        "  \"loadavg_1min\": %.2f,\n  \"commit\": \"%s\",\n  \"handoffs\": %llu,\n  \"pingpong_iters\": %d,\n  "
        "\"repeat\": %d,\n"
        "  \"ring_handoffs_per_s\": %.0f,\n"
        "  \"ring_wake_p50_us\": %.3f,\n  \"ring_wake_p99_us\": %.3f,\n  \"ring_wake_mean_us\": %.3f,\n"
        "  \"pipe_wake_p50_us\": %.3f,\n  \"pipe_wake_p99_us\": %.3f,\n  \"pipe_wake_mean_us\": %.3f,\n"
        "  \"eventfd_wake_p50_us\": %.3f,\n  \"eventfd_wake_p99_us\": %.3f,\n  \"eventfd_wake_mean_us\": %.3f,\n"
        "  \"note\": \"median of repeat rounds; one-way latency = ping-pong round trip / 2; both sides block (futex "
        "wait / read) between messages\"\n}\n",
        date, host, ncpu, load[0], commit, (unsigned long long)handoffs, iters, repeat, hps, lr.p50_us, lr.p99_us,
        lr.mean_us, lp.p50_us, lp.p99_us, lp.mean_us, le.p50_us, le.p99_us, le.mean_us);
    CHECK(n > 0 && (size_t)n < sizeof json);
    int rc = df_write_file_atomic(out, json, (size_t)n);
    if (rc < 0)
        df_die(1, "cannot write %s: %s", out, strerror(-rc));
    printf("  wrote %s\n", out);
    return 0;
}
