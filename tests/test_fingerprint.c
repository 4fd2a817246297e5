/* test_fingerprint: the orchestrator's data fingerprint (orchestrator/plan_source.c,
 * plan_source_fingerprint) hashes the shards on several threads; the result must not
 * depend on how many. Fresh random files every run (seed printed):
 *   - 9 shards of random sizes (0 bytes, under 8, not a multiple of 8, over one 1 MiB read
 *     chunk): the sizes, hashes and digest with 1, 2, 4 and 16 threads are identical, and
 *     each size is the file's;
 *   - one changed byte in one shard changes that shard's hash and the digest, nothing else;
 *   - shards 3 and 7 missing: every thread count reports data.shards[3] (the lowest), never 7,
 *     whichever thread meets its error first. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "orchestrator/orch.h"
#include "test_helpers.h"
#include "util.h"

#define N 9

static plan_fp fp1, fpn; /* large: static */

static void run(const topo *t, int threads, plan_fp *fp, int *rc, char *err, size_t errlen)
{
    char v[16];
    snprintf(v, sizeof v, "%d", threads);
    setenv("DF_FINGERPRINT_THREADS", v, 1);
    *rc = plan_source_fingerprint(t, fp, err, errlen);
}

int main(void)
{
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    printf("test_fingerprint: seed %llu\n", (unsigned long long)seed);
    df_rng r;
    df_rng_seed(&r, seed);
    char dir[] = "/tmp/df_test_fp_XXXXXX";
    T_ASSERT(mkdtemp(dir));
    static const size_t sizes_base[N] = {0, 5, 8, 13, 4096, 65539, (1u << 20) + 3, (1u << 20) * 2, 777};
    char *paths[N];
    size_t sizes[N];
    for (int i = 0; i < N; i++) {
        sizes[i] = sizes_base[i] + (i > 2 ? df_rng_below(&r, 64) : 0);
        paths[i] = malloc(256);
        snprintf(paths[i], 256, "%s/s%d.dfs", dir, i);
        unsigned char *b = malloc(sizes[i] + 1);
        T_ASSERT(b);
        for (size_t k = 0; k < sizes[i]; k++)
            b[k] = (unsigned char)df_rng_next(&r);
        T_ASSERT_RC(df_write_file_atomic(paths[i], b, sizes[i]));
        free(b);
    }
    topo t;
    memset(&t, 0, sizeof t);
    t.shards = paths;
    t.n_shards = N;
    char err[1024];
    int rc;
    run(&t, 1, &fp1, &rc, err, sizeof err);
    T_ASSERT_RC(rc);
    for (int i = 0; i < N; i++)
        T_ASSERT(fp1.f[i].size == sizes[i]);
    static const int counts[] = {2, 4, 16};
    for (int c = 0; c < 3; c++) {
        run(&t, counts[c], &fpn, &rc, err, sizeof err);
        T_ASSERT_RC(rc);
        T_ASSERT(fpn.n == N && fpn.digest == fp1.digest);
        for (int i = 0; i < N; i++)
            T_ASSERT(fpn.f[i].size == fp1.f[i].size && fpn.f[i].hash == fp1.f[i].hash &&
                     !strcmp(fpn.f[i].path, fp1.f[i].path));
    }
    printf("ok: %d shards (0 .. 2 MiB + 63 bytes): 1, 2, 4 and 16 threads give the same sizes, hashes and digest\n", N);

    /* one byte changed: that shard's hash and the digest move, nothing else */
    int victim = 4 + (int)df_rng_below(&r, N - 4);
    FILE *f = fopen(paths[victim], "r+b");
    T_ASSERT(f);
    long at = (long)df_rng_below(&r, sizes[victim]);
    T_ASSERT(fseek(f, at, SEEK_SET) == 0);
    int ch = fgetc(f);
    T_ASSERT(ch != EOF && fseek(f, at, SEEK_SET) == 0 && fputc(ch ^ 0x10, f) != EOF && fclose(f) == 0);
    run(&t, 4, &fpn, &rc, err, sizeof err);
    T_ASSERT_RC(rc);
    T_ASSERT(fpn.digest != fp1.digest);
    for (int i = 0; i < N; i++)
        T_ASSERT((fpn.f[i].hash != fp1.f[i].hash) == (i == victim) && fpn.f[i].size == fp1.f[i].size);
    printf("ok: one byte flipped at offset %ld of shard %d: its hash and the digest change, no other\n", at, victim);

    /* two shards missing: the lowest is named, whatever the thread count */
    T_ASSERT(unlink(paths[3]) == 0 && unlink(paths[7]) == 0);
    static const int all[] = {1, 2, 4, 16};
    for (int rep = 0; rep < 20; rep++)
        for (int c = 0; c < 4; c++) {
            run(&t, all[c], &fpn, &rc, err, sizeof err);
            if (rc != -ENOENT || !strstr(err, "data.shards[3]") || strstr(err, "data.shards[7]")) {
                fprintf(stderr, "test_fingerprint: %d threads: rc %d, '%s' (expected -ENOENT naming data.shards[3])\n",
                        all[c], rc, err);
                return 1;
            }
        }
    printf("ok: shards 3 and 7 missing: every thread count (80 runs) names data.shards[3]: %s\n", err);
    for (int i = 0; i < N; i++) {
        unlink(paths[i]);
        free(paths[i]);
    }
    rmdir(dir);
    printf("test_fingerprint: ok\n");
    return 0;
}
