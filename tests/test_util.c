/* test_util: the PRNG is deterministic and unbiased enough, atomic writes replace whole files,
 * command-line integers are read whole and in range, df_err / df_verr write the message (cut
 * to the buffer, never past it) and return the code they were given. */
#include "util.h"
#include "test_helpers.h"

#include <stdarg.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static int prefixed(char *err, size_t errlen, const char *prefix, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = df_verr(err, errlen, -EINVAL, prefix, fmt, ap);
    va_end(ap);
    return rc;
}

/* df_err and df_verr on a buffer with guard bytes after errlen */
static void check_err(void)
{
    char e[32];
    memset(e, 'G', sizeof e);
    T_ASSERT(df_err(e, 16, -EIO, "%s %d", "io", 7) == -EIO);
    T_ASSERT_STREQ(e, "io 7");
    memset(e, 'G', sizeof e);
    T_ASSERT(df_err(e, 8, -ENOSPC, "%s", "0123456789") == -ENOSPC); /* cut, terminated */
    T_ASSERT_STREQ(e, "0123456");
    T_ASSERT(e[8] == 'G');
    T_ASSERT(df_err(NULL, 8, -ENOMEM, "x") == -ENOMEM && df_err(e, 0, 5, "x") == 5);
    memset(e, 'G', sizeof e);
    T_ASSERT(prefixed(e, 24, "cfg.json", "field \"%s\"", "n") == -EINVAL);
    T_ASSERT_STREQ(e, "cfg.json: field \"n\"");
    T_ASSERT(prefixed(e, 24, NULL, "plain %d", 1) == -EINVAL);
    T_ASSERT_STREQ(e, "plain 1");
    memset(e, 'G', sizeof e);
    T_ASSERT(prefixed(e, 6, "a-long-prefix", "never seen") == -EINVAL); /* the prefix fills it */
    T_ASSERT_STREQ(e, "a-lon");
    T_ASSERT(e[6] == 'G');
    memset(e, 'G', sizeof e);
    T_ASSERT(prefixed(e, 10, "abc", "%s", "0123456789") == -EINVAL);
    T_ASSERT_STREQ(e, "abc: 0123");
    T_ASSERT(e[10] == 'G');
}

int main(void)
{
    df_rng a, b;
    df_rng_seed(&a, 42);
    df_rng_seed(&b, 42);
    for (int i = 0; i < 1000; i++)
        T_ASSERT(df_rng_next(&a) == df_rng_next(&b));
    df_rng_seed(&b, 43);
    T_ASSERT(df_rng_next(&a) != df_rng_next(&b));

    /* df_rng_below covers its range roughly uniformly */
    int hist[10] = {0};
    for (int i = 0; i < 100000; i++)
        hist[df_rng_below(&a, 10)]++;
    for (int i = 0; i < 10; i++)
        T_ASSERT(hist[i] > 9000 && hist[i] < 11000);
    double s = 0, s2 = 0;
    for (int i = 0; i < 100000; i++) {
        double x = df_rng_normal(&a);
        s += x;
        s2 += x * x;
    }
    T_ASSERT(s / 1e5 > -0.02 && s / 1e5 < 0.02);
    T_ASSERT(s2 / 1e5 > 0.97 && s2 / 1e5 < 1.03);

    char dir[] = "/tmp/df_test_util_XXXXXX";
    T_ASSERT(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/sub/dir/f.txt", dir);
    char sub[256];
    snprintf(sub, sizeof sub, "%s/sub/dir", dir);
    T_ASSERT_RC(df_mkdir_p(sub, 0700));
    T_ASSERT_RC(df_write_file_atomic(path, "one", 3));
    T_ASSERT_RC(df_write_file_atomic(path, "second", 6));
    char *buf;
    size_t len;
    T_ASSERT_RC(df_read_file(path, &buf, &len));
    T_ASSERT(len == 6 && memcmp(buf, "second", 6) == 0);
    free(buf);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    T_ASSERT(access(tmp, F_OK) != 0); /* no temp file left behind */
    T_ASSERT(df_read_file("/nonexistent/x", &buf, &len) == -ENOENT);
    T_ASSERT(df_write_file_atomic("/nonexistent/dir/x", "a", 1) == -ENOENT);
    /* command-line integers: whole, in range, never wrapped or cut */
    long long v = 0;
    T_ASSERT(df_parse_int("42", 1, 100, &v) == 0 && v == 42);
    T_ASSERT(df_parse_int("-1", -1, 5, &v) == 0 && v == -1);
    T_ASSERT(df_parse_int("0x10", 0, 100, &v) == 0 && v == 16);
    T_ASSERT(df_parse_int("010", 0, 100, &v) == 0 && v == 10); /* decimal, not octal */
    T_ASSERT(df_parse_int("9223372036854775807", 0, INT64_MAX, &v) == 0 && v == INT64_MAX);
    const char *bad[] = {"", "x", "12x", "1.5", " ", "0x", "4294967297", "9223372036854775808", "101", "0", "-3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        v = 7;
        long long hi = i == 7 ? INT64_MAX : (i == 6 ? 2147483647 : 100);
        T_ASSERT(df_parse_int(bad[i], 1, hi, &v) == -EINVAL && v == 7);
    }
    T_ASSERT(df_parse_int(NULL, 0, 1, &v) == -EINVAL);
    check_err();
    printf("test_util: ok\n");
    return 0;
}
