/* test_util: the PRNG is deterministic and unbiased enough, atomic writes replace whole files. */
#include "util.h"
#include "test_helpers.h"

#include <sys/stat.h>
#include <unistd.h>

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
    printf("test_util: ok\n");
    return 0;
}
