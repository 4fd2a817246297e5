/* util.c: logging, error messages, whole-file I/O with crash-safe writes, the deterministic
 * PRNG. */
#include "util.h"

#include <fcntl.h>
#include <libgen.h>
#include <math.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char g_prog[64] = "df";

void df_log_init(const char *prog)
{
    snprintf(g_prog, sizeof g_prog, "%s", prog);
}

/* "2026-12-03T10:11:12.345Z": ISO-8601 UTC with milliseconds, the start of every log line */
size_t df_log_stamp(char *out, size_t cap)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(out, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                     tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    return n < 0 ? 0 : DF_MIN((size_t)n, cap ? cap - 1 : 0);
}

static void (*g_log_before)(void), (*g_log_after)(void);

void df_log_set_hook(void (*before)(void), void (*after)(void))
{
    g_log_before = before;
    g_log_after = after;
}

static void vlog(const char *fmt, va_list ap)
{
    char line[2048], stamp[40];
    df_log_stamp(stamp, sizeof stamp);
    int n = snprintf(line, sizeof line, "%s %s: ", stamp, g_prog);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    size_t len = (size_t)n + (m < 0 ? 0 : DF_MIN((size_t)m, sizeof line - (size_t)n - 2));
    line[len++] = '\n';
    if (g_log_before)
        g_log_before();
    (void)df_write_all(2, line, len); /* one write: lines from several processes don't mix */
    if (g_log_after)
        g_log_after();
}

int df_verr(char *err, size_t errlen, int rc, const char *prefix, const char *fmt, va_list ap)
{
    if (!err || !errlen)
        return rc;
    size_t n = 0;
    if (prefix) {
        int k = snprintf(err, errlen, "%s: ", prefix);
        if (k < 0 || (size_t)k >= errlen)
            return rc; /* the prefix alone fills err (cut) */
        n = (size_t)k;
    }
    vsnprintf(err + n, errlen - n, fmt, ap);
    return rc;
}

int df_err(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    df_verr(err, errlen, rc, NULL, fmt, ap);
    va_end(ap);
    return rc;
}

void df_log(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
}

void df_die(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(fmt, ap);
    va_end(ap);
    exit(code);
}

int df_parse_int(const char *s, long long lo, long long hi, long long *out)
{
    if (!s)
        return -EINVAL;
    int hex = (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) ||
              ((s[0] == '-' || s[0] == '+') && s[1] == '0' && (s[2] == 'x' || s[2] == 'X'));
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, hex ? 16 : 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -EINVAL;
    *out = v;
    return 0;
}

long long df_arg_int(const char *prog, const char *opt, const char *s, long long lo, long long hi)
{
    long long v;
    if (df_parse_int(s, lo, hi, &v) < 0) {
        fprintf(stderr, "%s: %s: '%s' is not an integer in [%lld, %lld]\n", prog, opt, s ? s : "", lo, hi);
        exit(2);
    }
    return v;
}

int df_write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

const char *df_file_kind(unsigned mode)
{
    switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO (named pipe)";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFSOCK: return "a socket";
    case S_IFLNK: return "a symbolic link";
    }
    return "not a regular file";
}

int df_open_regular(const char *path, struct stat *stp, char *err, size_t errlen)
{
    struct stat st;
    /* O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting forever;
     * it changes nothing for a regular file */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        if (err && errlen)
            snprintf(err, errlen, "%s: cannot open: %s", path, strerror(e));
        return -e;
    }
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        if (err && errlen)
            snprintf(err, errlen, "%s: fstat: %s", path, strerror(e));
        return -e;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        if (err && errlen)
            snprintf(err, errlen, "%s: is %s, not a regular file", path, df_file_kind(st.st_mode));
        return -EINVAL;
    }
    if (stp)
        *stp = st;
    return fd;
}

int df_read_regular(const char *path, char **out, size_t *len, char *err, size_t errlen)
{
    int rc = 0;
    char *buf = NULL;
    struct stat st;
    *out = NULL;
    int fd = df_open_regular(path, &st, err, errlen);
    if (fd < 0)
        return fd;
    buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        rc = -ENOMEM;
        goto out;
    }
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = -errno;
            goto out;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    buf[got] = 0;
    *out = buf;
    buf = NULL;
    if (len)
        *len = got;
out:
    if (rc < 0 && err && errlen)
        snprintf(err, errlen, "%s: cannot read: %s", path, strerror(-rc));
    free(buf);
    close(fd);
    return rc;
}

int df_read_file(const char *path, char **out, size_t *len)
{
    return df_read_regular(path, out, len, NULL, 0);
}

int df_fsync_dir_of(const char *path)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    int fd = open(dirname(tmp), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = fsync(fd) < 0 ? -errno : 0;
    close(fd);
    return rc;
}

int df_write_file_atomic(const char *path, const void *buf, size_t len)
{
    char tmp[4096];
    int n = snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (n < 0 || (size_t)n >= sizeof tmp)
        return -ENAMETOOLONG;
    /* O_NOFOLLOW: never write through a symlink planted at the temp name; fchmod: 0600
     * whatever the umask, also over a leftover temp file of another mode */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -errno;
    int rc = fchmod(fd, 0600) < 0 ? -errno : 0;
    if (rc == 0)
        rc = df_write_all(fd, buf, len);
    if (rc == 0 && fsync(fd) < 0)
        rc = -errno;
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, path) < 0)
        rc = -errno;
    if (rc != 0) {
        unlink(tmp); /* the previous file at path is untouched */
        return rc;
    }
    return df_fsync_dir_of(path);
}

int df_mkdir_p(const char *path, unsigned mode)
{
    char tmp[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof tmp)
        return -EINVAL;
    memcpy(tmp, path, n + 1);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(tmp, mode) < 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    if (mkdir(tmp, mode) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

uint64_t df_hash64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void df_rng_seed(df_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) {
        seed = df_hash64(seed);
        r->s[i] = seed;
    }
}

uint64_t df_rng_below(df_rng *r, uint64_t n)
{
    uint64_t lim = UINT64_MAX - UINT64_MAX % n; /* reject the biased tail */
    uint64_t x;
    do
        x = df_rng_next(r);
    while (x >= lim);
    return x % n;
}

double df_rng_normal(df_rng *r)
{
    double u1 = df_rng_uniform(r), u2 = df_rng_uniform(r);
    return df_normal_of(u1, u2);
}

uint64_t df_fnv1a64(const void *data, size_t len, uint64_t seed)
{
    const unsigned char *p = data;
    uint64_t h = 0xcbf29ce484222325ull ^ seed;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
