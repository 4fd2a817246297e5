/* gpu_test_check.h: what the GPU tests share: CUDA_CHECK (file:line, the call and the
 * CUDA error text, exit 1), RC_CHECK (the same for a 0 / -errno call), EXPECT (a check that
 * counts a failure in gt_failures and goes on), xmalloc, a no-GPU skip, a watchdog so a
 * test never hangs, a per-run seed (fresh every run, printed, NN_CUDA_TEST_SEED=...
 * replays one) and the comparison that prints max abs err, max rel err and the first bad
 * index. A NaN or Inf never passes: the test is !(err <= tol), false for NaN.
 * The CUDA benches (bench/drafter, bench/eval, bench/target) use CUDA_CHECK, RC_CHECK and
 * gt_watchdog from here too, as bench/nn includes tests/nn_plain.h: one copy of each.
 * Header-only (static) because each GPU test and bench is one translation unit. */
#ifndef DF_GPU_TEST_CHECK_H
#define DF_GPU_TEST_CHECK_H

#include <cuda_runtime_api.h>
#include <execinfo.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CUDA_CHECK(call)                                                                                      \
    do {                                                                                                      \
        cudaError_t e_ = (call);                                                                              \
        if (e_ != cudaSuccess) {                                                                              \
            fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_), \
                    cudaGetErrorName(e_));                                                                    \
            exit(1);                                                                                          \
        }                                                                                                     \
    } while (0)

/* A 0 / -errno call; on failure print it with extra text (e.g. the err the call filled). */
#define RC_CHECK(call, extra)                                                                                       \
    do {                                                                                                            \
        long r_ = (long)(call);                                                                                     \
        if (r_ < 0) {                                                                                               \
            fprintf(stderr, "%s:%d: %s returned %ld (%s): %s\n", __FILE__, __LINE__, #call, r_, strerror((int)-r_), \
                    (extra));                                                                                       \
            exit(1);                                                                                                \
        }                                                                                                           \
    } while (0)

/* A check that does not stop the test: on failure "  FAIL file:line: <message>", counted
 * in gt_failures (the test's exit status comes from it at the end). */
static int gt_failures __attribute__((unused));
#define EXPECT(cond, ...)                                 \
    do {                                                  \
        if (!(cond)) {                                    \
            printf("  FAIL %s:%d: ", __FILE__, __LINE__); \
            printf(__VA_ARGS__);                          \
            printf("\n");                                 \
            gt_failures++;                                \
        }                                                 \
    } while (0)

static inline void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of host memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

/* the line the watchdog writes (gt_watchdog sets it) */
static const char *gt_watchdog_line = "FAIL: watchdog: the test ran past its time limit (hung kernel?)\n";

static inline void gt_watchdog_fire(int sig)
{
    (void)sig;
    ssize_t w = write(2, gt_watchdog_line, strlen(gt_watchdog_line)); /* both async-signal-safe */
    (void)w;
    _exit(1);
}

/* After limit_s seconds write line (NULL: the test's FAIL line above; a bench passes its
 * own, ending in a newline) to stderr and exit 1. */
static inline void gt_watchdog(unsigned limit_s, const char *line)
{
    if (line)
        gt_watchdog_line = line;
    signal(SIGALRM, gt_watchdog_fire);
    alarm(limit_s);
}

/* Skip (77) without a usable GPU; arm a watchdog of limit_s seconds. */
/* A crash (SIGSEGV, SIGFPE, SIGBUS, SIGILL, SIGABRT) prints the signal and the stack as
 * "binary(function+0xoff) [addr]" lines on stderr (addr2line -e BINARY resolves the offsets
 * of static functions), then dies of the same signal: the exit status still says which. */
static void gt_crash(int sig)
{
    char line[64];
    int n = snprintf(line, sizeof line, "gt: fatal signal %d (%s); stack:\n", sig, strsignal(sig));
    if (n > 0 && write(2, line, (size_t)n) < 0)
        n = 0;
    void *pc[64];
    backtrace_symbols_fd(pc, backtrace(pc, 64), 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

static inline void gt_setup(unsigned limit_s)
{
    gt_watchdog(limit_s, NULL);
    /* line-buffered: a crash loses no PASS line, and they interleave with the library's
     * stderr log in the order they happened */
    setvbuf(stdout, NULL, _IOLBF, 0);
    void *pc[1];
    backtrace(pc, 1); /* loads libgcc now: not inside the handler */
    const int sigs[] = {SIGSEGV, SIGFPE, SIGBUS, SIGILL, SIGABRT};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        signal(sigs[i], gt_crash);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        printf("SKIPPED: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        exit(77);
    }
    struct cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    printf("device: %s (sm_%d%d, %d SMs)\n", p.name, p.major, p.minor, p.multiProcessorCount);
}

static inline uint64_t gt_seed(void)
{
    const char *s = getenv("NN_CUDA_TEST_SEED");
    uint64_t seed = s ? strtoull(s, NULL, 0) : ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
    printf("seed %llu (replay with NN_CUDA_TEST_SEED=%llu)\n", (unsigned long long)seed, (unsigned long long)seed);
    return seed;
}

/* Compare got[n] with ref[n]: |got - ref| <= atol + rtol * |ref| elementwise. Prints one
 * line (PASS/FAIL, max abs err, max rel err, first bad index with both values). Returns
 * the number of bad elements. */
static inline long gt_check(const char *what, const float *got, const float *ref, size_t n, double atol, double rtol)
{
    double max_abs = 0, max_rel = 0;
    long bad = 0;
    size_t first = 0;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i], e = fabs(g - r);
        int ok = e <= atol + rtol * fabs(r); /* false for NaN / Inf */
        if (!ok && bad++ == 0)
            first = i;
        if (!(e <= max_abs))
            max_abs = e; /* NaN sticks */
        double rel = e / (fabs(r) > 1e-6 ? fabs(r) : 1e-6);
        if (!(rel <= max_rel) && fabs(r) > atol)
            max_rel = rel;
    }
    if (bad)
        printf("FAIL %-44s n=%zu max_abs_err=%.3g max_rel_err=%.3g bad=%ld first_bad=%zu (got %.6g ref %.6g, tol "
               "atol %.2g rtol %.2g)\n",
               what, n, max_abs, max_rel, bad, first, (double)got[first], (double)ref[first], atol, rtol);
    else
        printf("PASS %-44s n=%zu max_abs_err=%.3g max_rel_err=%.3g\n", what, n, max_abs, max_rel);
    return bad;
}

/* Relative L2 error ||got - ref|| / ||ref|| with a limit; prints and returns 1 when over
 * (or NaN), plus the max abs err and its index. */
static inline int gt_check_rel_l2(const char *what, const float *got, const float *ref, size_t n, double limit)
{
    double num = 0, den = 0, max_abs = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)got[i] - ref[i];
        num += e * e;
        den += (double)ref[i] * ref[i];
        if (!(fabs(e) <= max_abs)) {
            max_abs = fabs(e);
            at = i;
        }
    }
    double rel = sqrt(num) / (den > 0 ? sqrt(den) : 1.0);
    int ok = rel <= limit;
    printf("%s %-44s n=%zu rel_l2_err=%.3g (limit %.2g) max_abs_err=%.3g at %zu (got %.6g ref %.6g)\n",
           ok ? "PASS" : "FAIL", what, n, rel, limit, max_abs, at, n ? (double)got[at] : 0.0,
           n ? (double)ref[at] : 0.0);
    return !ok;
}

#endif
