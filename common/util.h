/* util.h: the few things every file needs: exit codes, time, logging, error messages, CHECK
 * macros.
 *
 * Library code (common/, orchestrator/) returns 0 or -errno and never exits; on failure it
 * writes one line into the caller's `char *err, size_t errlen` (df_err).
 * Workers stop at the first error with DF_CHECK / DF_CHECK_ERR, which print file:line,
 * the failing expression and the error, then exit with a code the supervisor reads:
 *   DF_EXIT_OK 0        done
 *   DF_EXIT_TEMP 1      temporary failure: restart me
 *   DF_EXIT_USAGE 2     bad command line or topology (nothing started)
 *   DF_EXIT_PERM 100    permanent failure (bad model, bad data, bad config): do not restart
 */
#ifndef DF_UTIL_H
#define DF_UTIL_H

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef __cplusplus /* the CUDA sources (.cu, C++) call it too */
extern "C" {
#endif

struct stat;

enum {
    DF_EXIT_OK = 0,
    DF_EXIT_TEMP = 1,
    DF_EXIT_USAGE = 2,
    DF_EXIT_PERM = 100,
};

#define DF_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define DF_MIN(a, b) ((a) < (b) ? (a) : (b))
#define DF_MAX(a, b) ((a) > (b) ? (a) : (b))
#define DF_CACHELINE 64

static inline uint64_t df_now_ns(void) /* CLOCK_MONOTONIC, ns */
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline double df_wall_s(void) /* CLOCK_REALTIME, seconds since the epoch */
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One line to stderr: "<ISO-8601 UTC time with ms> <program>: <text>" (program from
 * df_log_init), written with one write() so lines of several processes never mix. */
void df_log_init(const char *prog);
void df_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The line prefix's time, "2026-12-03T10:11:12.345Z", into out; returns its length. */
size_t df_log_stamp(char *out, size_t cap);
/* For a program that keeps a line of its own on the terminal (the orchestrator's progress
 * line): df_log calls before() ahead of each line it writes (clear that line) and after()
 * once it is written (draw it again). NULL, NULL: none. Set from the thread that logs. */
void df_log_set_hook(void (*before)(void), void (*after)(void));
/* The library's error convention in one call: format the message into err (when err is not
 * NULL and errlen > 0; cut to fit) and return rc, so that a failing branch is one line:
 *     return df_err(err, errlen, -EINVAL, "%s: field \"step\": expected an integer", path);
 * df_verr is its va_list form for the helpers that put a fixed prefix in front of every
 * message they write ("<prefix>: <message>"; prefix NULL: none), e.g. a parser naming its
 * file. */
int df_err(char *err, size_t errlen, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
int df_verr(char *err, size_t errlen, int rc, const char *prefix, const char *fmt, va_list ap)
    __attribute__((format(printf, 5, 0)));

/* Log and exit(code). */
void df_die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));

/* An integer given on a command line: all of s, decimal (or hex after 0x), in [lo, hi].
 * 0 with *out set, or -EINVAL (not an integer, past long long, outside the range): a
 * value is never cut or wrapped into range the way atoi and an (int) cast would. */
int df_parse_int(const char *s, long long lo, long long hi, long long *out);
/* df_parse_int for an option that must be right: on bad input prints
 * "<prog>: <opt>: '<s>' is not an integer in [lo, hi]" to stderr and exits 2 (bad usage). */
long long df_arg_int(const char *prog, const char *opt, const char *s, long long lo, long long hi);

/* Worker-side checks. DF_CHECK(expr): expr must be true. DF_CHECK_ERR(rc_expr): rc must be
 * >= 0; a negative value is printed as -errno text. Both exit DF_EXIT_TEMP. */
#define DF_CHECK(expr)                                                                  \
    do {                                                                                \
        if (!(expr))                                                                    \
            df_die(DF_EXIT_TEMP, "%s:%d: check failed: %s", __FILE__, __LINE__, #expr); \
    } while (0)
#define DF_CHECK_ERR(call)                                                                                   \
    do {                                                                                                     \
        long df_rc_ = (long)(call);                                                                          \
        if (df_rc_ < 0)                                                                                      \
            df_die(DF_EXIT_TEMP, "%s:%d: %s failed: %s", __FILE__, __LINE__, #call, strerror((int)-df_rc_)); \
    } while (0)

/* Write all of buf to fd (restarting on EINTR / short writes). 0 or -errno. */
int df_write_all(int fd, const void *buf, size_t len);
/* Read a whole file into a malloc'd NUL-terminated buffer (caller frees). 0 or -errno;
 * -EINVAL when path is not a regular file (df_read_regular says which kind it is). */
int df_read_file(const char *path, char **out, size_t *len);
/* Open a file that must be a regular file (a shard, a model file, a config): O_RDONLY |
 * O_CLOEXEC | O_NONBLOCK, so that a FIFO cannot block the open, then fstat. Returns the fd
 * (st filled, st may be NULL), or -errno with err = "<path>: cannot open: <strerror>", or
 * -EINVAL with err = "<path>: is a FIFO (named pipe), not a regular file" (or a directory,
 * a character device, ...). */
int df_open_regular(const char *path, struct stat *st, char *err, size_t errlen);
/* df_read_file with df_open_regular's check and messages (err may be NULL). */
int df_read_regular(const char *path, char **out, size_t *len, char *err, size_t errlen);
/* "a directory", "a FIFO (named pipe)", "a character device", ... for an st_mode. */
const char *df_file_kind(unsigned mode);
/* Crash-safe file write: path.tmp (created 0600, O_NOFOLLOW), fsync, rename, fsync dir.
 * 0 or -errno. */
int df_write_file_atomic(const char *path, const void *buf, size_t len);
/* fsync the directory holding path. 0 or -errno. */
int df_fsync_dir_of(const char *path);
/* mkdir -p with mode for every created level. 0 or -errno. */
int df_mkdir_p(const char *path, unsigned mode);

/* Deterministic PRNG (splitmix64 seeding a xoshiro256**): the same seed gives the same
 * stream on every machine. Used by the plan, anchors, noise and tests. */
typedef struct df_rng {
    uint64_t s[4];
} df_rng;
void df_rng_seed(df_rng *r, uint64_t seed);
static inline uint64_t df_rng_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}
static inline uint64_t df_rng_next(df_rng *r) /* one xoshiro256** step; inline: fills draw billions */
{
    uint64_t *s = r->s;
    uint64_t out = df_rng_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = df_rng_rotl(s[3], 45);
    return out;
}
static inline double df_rng_uniform(df_rng *r) /* [0,1) */
{
    return (double)(df_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}
uint64_t df_rng_below(df_rng *r, uint64_t n); /* uniform in [0, n), n > 0, unbiased */
double df_rng_normal(df_rng *r);              /* standard normal (Box-Muller) */
/* The normal df_rng_normal makes of its two uniforms (u1 drawn first): for fills that draw
 * the uniforms apart from the arithmetic (rng_fill.h) and must give the same bits. */
static inline double df_normal_of(double u1, double u2)
{
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
uint64_t df_hash64(uint64_t x); /* splitmix64 finaliser: a good 64-bit mix */

/* FNV-1a 64 over bytes: payload checksums in tests and shard headers. */
uint64_t df_fnv1a64(const void *data, size_t len, uint64_t seed);

#ifdef __cplusplus
}
#endif
#endif
