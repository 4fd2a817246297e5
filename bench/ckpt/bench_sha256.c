/* bench_sha256: how fast the checkpoint digests are (common/sha256.h), beside the peers a
 * user would reach for on the same bytes in the same run:
 *
 *   ours, df_sha256_file (libcrypto's SHA-256 through EVP) on a file in the page cache
 *     (what a checkpoint save or load pays per byte);
 *   sha256sum and `openssl dgst -sha256` (whole processes, the same file), where installed.
 *
 * MB/s = file bytes / median wall time of 3 runs (after one warm-up read). A checkpoint of
 * an 8B-shape drafter with its AdamW state is about 12.6 GB (docs/drafter.md): the table
 * also prints the seconds one pass over that would take. Writes
 * bench/results/ckpt/sha256.json (argv[1] to change). Usage: bench_sha256 [OUT.json] [MiB] */
#include "bench/bench_env.h"
#include "sha256.h"
#include "util.h"

#include <errno.h>
#include <sys/stat.h>

#define CKPT_8B_GB 12.6

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct row {
    char name[64];
    double mbs;
    char digest[65];
    int ran;
} row;

static void time_ours(row *r, const char *path, double bytes)
{
    double t[3];
    for (int i = 0; i < 3; i++) {
        double t0 = now_s();
        int rc = df_sha256_file(path, r->digest, NULL);
        t[i] = now_s() - t0;
        if (rc < 0) {
            fprintf(stderr, "bench_sha256: %s: %s\n", path, strerror(-rc));
            exit(1);
        }
    }
    r->mbs = bytes / 1e6 / bench_median(t, 3);
    r->ran = 1;
}

static void time_cmd(row *r, const char *fmt, const char *path, double bytes)
{
    char cmd[512], line[512];
    snprintf(cmd, sizeof cmd, fmt, path);
    double t[3];
    for (int i = 0; i < 3; i++) {
        double t0 = now_s();
        FILE *p = popen(cmd, "r");
        if (!p)
            return;
        line[0] = 0;
        char *ok = fgets(line, sizeof line, p);
        int st = pclose(p);
        t[i] = now_s() - t0;
        if (!ok || st != 0)
            return; /* not installed or failed: the row says so */
    }
    /* sha256sum: "<hex>  path"; openssl: "SHA2-256(path)= <hex>" */
    char *h = strstr(line, "= ");
    h = h ? h + 2 : line;
    snprintf(r->digest, sizeof r->digest, "%.64s", h);
    r->mbs = bytes / 1e6 / bench_median(t, 3);
    r->ran = 1;
}

int main(int argc, char **argv)
{
    const char *out = argc > 1 ? argv[1] : "bench/results/ckpt/sha256.json";
    long mib = argc > 2 ? (long)df_arg_int("bench_sha256", "MIB", argv[2], 1, 1 << 20) : 512;
    if (mib < 1) {
        fprintf(stderr, "usage: bench_sha256 [OUT.json] [MiB >= 1]\n");
        return 2;
    }
    char dir[] = "/tmp/bench_sha256_XXXXXX", path[128];
    if (!mkdtemp(dir)) {
        perror("bench_sha256: mkdtemp");
        return 1;
    }
    snprintf(path, sizeof path, "%s/data.bin", dir);
    size_t n = (size_t)mib << 20;
    unsigned char *b = malloc(n);
    if (!b) {
        fprintf(stderr, "bench_sha256: no memory for %ld MiB\n", mib);
        return 1;
    }
    df_rng r;
    df_rng_seed(&r, 7);
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = df_rng_next(&r);
        memcpy(b + i, &v, n - i < 8 ? n - i : 8);
    }
    int rc = df_write_file_atomic(path, b, n);
    free(b);
    if (rc < 0) {
        fprintf(stderr, "bench_sha256: %s: %s\n", path, strerror(-rc));
        return 1;
    }
    double bytes = (double)n;
    enum { NROWS = 3 };
    row rows[NROWS];
    memset(rows, 0, sizeof rows);
    snprintf(rows[0].name, sizeof rows[0].name, "ours (libcrypto)");
    char warm[65];
    df_sha256_file(path, warm, NULL); /* page cache */
    time_ours(&rows[0], path, bytes);
    snprintf(rows[1].name, sizeof rows[1].name, "sha256sum");
    time_cmd(&rows[1], "sha256sum %s 2>/dev/null", path, bytes);
    snprintf(rows[2].name, sizeof rows[2].name, "openssl dgst -sha256");
    time_cmd(&rows[2], "openssl dgst -sha256 %s 2>/dev/null", path, bytes);
    unlink(path);
    rmdir(dir);

    bench_env e;
    bench_env_read(&e);
    printf("SHA-256 of a %ld MiB file in the page cache (median of 3), commit %s, %s\n", mib, e.commit,
           df_sha256_impl());
    printf("%-24s %10s %22s  %s\n", "implementation", "MB/s", "12.6 GB checkpoint, s", "digest agrees");
    int bad = 0;
    for (int i = 0; i < NROWS; i++) {
        if (!rows[i].ran) {
            printf("%-24s %10s %22s  (not installed or failed)\n", rows[i].name, "-", "-");
            continue;
        }
        int agree = strcmp(rows[i].digest, rows[0].digest) == 0;
        bad |= !agree;
        printf("%-24s %10.0f %22.1f  %s\n", rows[i].name, rows[i].mbs, CKPT_8B_GB * 1e3 / rows[i].mbs,
               agree ? "yes" : "NO");
    }
    FILE *f = fopen(out, "w");
    if (!f) {
        fprintf(stderr, "bench_sha256: %s: %s\n", out, strerror(errno));
        return 1;
    }
    fprintf(f, "{\"bench\": \"sha256\", \"commit\": \"%s\", \"host\": \"%s\", \"date\": \"%s\", \"cpus\": %ld,\n",
            e.commit, e.host, e.date, e.cpus);
    fprintf(f, " \"file_mib\": %ld, \"libcrypto\": \"%s\", \"rows\": [\n", mib, df_sha256_impl());
    for (int i = 0; i < NROWS; i++)
        fprintf(f, "  {\"name\": \"%s\", \"ran\": %s, \"mb_per_s\": %.1f, \"digest\": \"%s\"}%s\n", rows[i].name,
                rows[i].ran ? "true" : "false", rows[i].mbs, rows[i].digest, i < NROWS - 1 ? "," : "");
    fprintf(f, "]}\n");
    fclose(f);
    printf("wrote %s\n", out);
    return bad ? 1 : 0;
}
