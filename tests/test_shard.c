/* test_shard: token shards round-trip through shard_write/dataset_open, a dataset spans
 * several shards, and every kind of corruption is refused with a message naming the file
 * and the byte offset. Also reads a shard written by scripts/prepare_data.py if given one
 * (tests/test_prepare_data.sh does). */
#include "io/shard.h"
#include "test_helpers.h"
#include "util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[] = "/tmp/df_test_shard_XXXXXX";

static void make_shard(const char *path, uint64_t n, uint32_t base_len, uint32_t vocab)
{
    uint64_t *off = malloc(sizeof(uint64_t) * (n + 1));
    off[0] = 0;
    for (uint64_t i = 0; i < n; i++)
        off[i + 1] = off[i] + base_len + i;
    uint32_t *tok = malloc(4 * off[n] + 4);
    uint8_t *mask = malloc(off[n] + 1);
    for (uint64_t i = 0; i < off[n]; i++) {
        tok[i] = (uint32_t)(df_hash64(i) % vocab);
        mask[i] = (uint8_t)(i % 3 != 0);
    }
    T_ASSERT_RC(shard_write(path, vocab, n, off, tok, mask));
    free(off);
    free(tok);
    free(mask);
}

/* copy src to dst, then overwrite len bytes at offset (or truncate to offset if len < 0) */
static void corrupt(const char *src, const char *dst, long offset, const void *bytes, long len)
{
    char *buf;
    size_t n;
    T_ASSERT_RC(df_read_file(src, &buf, &n));
    if (len < 0)
        n = (size_t)offset;
    else
        memcpy(buf + offset, bytes, (size_t)len);
    T_ASSERT_RC(df_write_file_atomic(dst, buf, n));
    free(buf);
}

/* fix the checksums after a deliberate content change, so deeper checks are reached */
static void refresh_checksums(const char *path)
{
    char *buf;
    size_t n;
    T_ASSERT_RC(df_read_file(path, &buf, &n));
    uint64_t pay = df_fnv1a64(buf + 64, n - 64, 0);
    memcpy(buf + 32, &pay, 8);
    uint64_t hdr = df_fnv1a64(buf, 40, 0);
    memcpy(buf + 40, &hdr, 8);
    T_ASSERT_RC(df_write_file_atomic(path, buf, n));
    free(buf);
}

static void expect_error(const char *path, const char *want_suffix)
{
    dataset *ds;
    char err[512], want[512];
    char *paths[] = {(char *)path};
    int rc = dataset_open(&ds, paths, 1, err, sizeof err);
    T_ASSERT(rc == -EINVAL && ds == NULL);
    snprintf(want, sizeof want, "%s: %s", path, want_suffix);
    T_ASSERT_STREQ(err, want);
    printf("  refused: %s\n", err);
}

int main(int argc, char **argv)
{
    if (argc == 2) { /* read a shard made elsewhere and print a summary */
        dataset *ds;
        char err[512];
        if (dataset_open(&ds, &argv[1], 1, err, sizeof err) < 0) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        uint64_t lab = 0;
        for (uint64_t i = 0; i < dataset_n_samples(ds); i++) {
            const uint32_t *t;
            const uint8_t *m;
            uint32_t len;
            T_ASSERT_RC(dataset_sample(ds, i, &t, &m, &len));
            for (uint32_t j = 0; j < len; j++)
                lab += m[j];
        }
        printf("samples %llu tokens %llu labels %llu vocab %u\n", (unsigned long long)dataset_n_samples(ds),
               (unsigned long long)dataset_n_tokens(ds), (unsigned long long)lab, dataset_vocab_size(ds));
        dataset_close(ds);
        return 0;
    }
    T_ASSERT(mkdtemp(dir));
    char a[256], b[256], bad[256];
    snprintf(a, sizeof a, "%s/a.dfs", dir);
    snprintf(b, sizeof b, "%s/b.dfs", dir);
    snprintf(bad, sizeof bad, "%s/bad.dfs", dir);
    make_shard(a, 10, 5, 100);
    make_shard(b, 3, 2, 100);

    /* round trip across two shards */
    dataset *ds;
    char err[512];
    char *paths[] = {a, b};
    T_ASSERT_RC(dataset_open(&ds, paths, 2, err, sizeof err));
    T_ASSERT(dataset_n_samples(ds) == 13);
    T_ASSERT(dataset_vocab_size(ds) == 100);
    T_ASSERT(dataset_sample_len(ds, 0) == 5 && dataset_sample_len(ds, 9) == 14);
    T_ASSERT(dataset_sample_len(ds, 10) == 2 && dataset_sample_len(ds, 12) == 4);
    const uint32_t *t;
    const uint8_t *m;
    uint32_t len;
    T_ASSERT_RC(dataset_sample(ds, 11, &t, &m, &len));
    T_ASSERT(len == 3 && t[0] == df_hash64(2) % 100 && m[0] == 1 && m[1] == 0);
    T_ASSERT(dataset_sample(ds, 13, &t, &m, &len) == -ERANGE);
    /* where a sample lives: shard index and the index inside that file */
    int si = -1;
    uint64_t local = 99;
    T_ASSERT_RC(dataset_locate(ds, 9, &si, &local));
    T_ASSERT(si == 0 && local == 9);
    T_ASSERT_RC(dataset_locate(ds, 11, &si, &local));
    T_ASSERT(si == 1 && local == 1);
    T_ASSERT(dataset_locate(ds, 13, &si, &local) == -ERANGE);
    dataset_close(ds);

    /* every corruption gives its own message */
    corrupt(a, bad, 0, "XXXX", 4);
    expect_error(bad, "offset 0: bad magic (not a DFSHARD1 token shard)");
    corrupt(a, bad, 20, "\x01", 1);
    expect_error(bad, "offset 40: header checksum mismatch (header corrupt)");
    corrupt(a, bad, 300, "\x07", 1);
    expect_error(bad, "offset 32: payload checksum mismatch (data corrupt)");
    corrupt(a, bad, 200, NULL, -1);
    expect_error(bad, "offset 200: file is 200 bytes, header says 632 (n_samples 10, n_tokens 95): truncated or "
                      "wrong header");
    corrupt(a, bad, 10, NULL, -1);
    expect_error(bad, "offset 0: file is 10 bytes, shorter than the 64-byte header");
    uint32_t v2 = 2;
    corrupt(a, bad, 8, &v2, 4);
    refresh_checksums(bad);
    expect_error(bad, "offset 8: version 2, this build reads 1");
    uint64_t five = 5;
    corrupt(a, bad, 64, &five, 8);
    refresh_checksums(bad);
    expect_error(bad, "offset 64: offsets[0] is 5, expected 0");
    uint64_t big = 1000;
    corrupt(a, bad, 64 + 8 * 3, &big, 8);
    refresh_checksums(bad);
    expect_error(bad, "offset 88: offsets[3] = 1000 is out of order or range");
    uint32_t tok = 100;
    long tok_off = 64 + 8 * 11;
    corrupt(a, bad, tok_off + 4 * 7, &tok, 4);
    refresh_checksums(bad);
    expect_error(bad, "offset 180: token 100 >= vocab_size 100");
    uint8_t two = 2;
    long mask_off = tok_off + ((4 * 95 + 7) & ~7);
    corrupt(a, bad, mask_off + 3, &two, 1);
    refresh_checksums(bad);
    expect_error(bad, "offset 539: loss_mask value 2, expected 0 or 1");

    /* reserved header bytes (48..63, outside header_fnv) must be zero */
    corrupt(a, bad, 53, "\x01", 1);
    refresh_checksums(bad);
    expect_error(bad, "offset 53: reserved header byte is 0x01, expected 0");
    /* huge counts with valid checksums: refused by field before any offset is computed */
    uint64_t huge = 1ull << 63;
    corrupt(a, bad, 16, &huge, 8);
    refresh_checksums(bad);
    expect_error(bad, "offset 16: n_samples 9223372036854775808 exceeds the limit of 1099511627776");
    huge = UINT64_MAX / 4 + 2; /* 4 * n_tokens wraps to 4 */
    corrupt(a, bad, 24, &huge, 8);
    refresh_checksums(bad);
    expect_error(bad, "offset 24: n_tokens 4611686018427387905 exceeds the limit of 1099511627776");
    /* not a regular file: a directory, a FIFO (the open must not block), a device */
    char fifo[256];
    snprintf(fifo, sizeof fifo, "%s/fifo.dfs", dir);
    T_ASSERT(mkfifo(fifo, 0600) == 0);
    expect_error(dir, "is a directory, not a regular file");
    expect_error(fifo, "is a FIFO (named pipe), not a regular file");
    expect_error("/dev/zero", "is a character device, not a regular file");
    unlink(fifo);

    /* mixed vocabularies across shards */
    make_shard(bad, 2, 2, 50);
    char *mixed[] = {a, bad};
    T_ASSERT(dataset_open(&ds, mixed, 2, err, sizeof err) == -EINVAL);
    char want[512];
    snprintf(want, sizeof want, "%s: offset 12: vocab_size 50 differs from the other shards' 100", bad);
    T_ASSERT_STREQ(err, want);
    char *missing[] = {"/nonexistent/x.dfs"};
    T_ASSERT(dataset_open(&ds, missing, 1, err, sizeof err) == -ENOENT);
    T_ASSERT_STREQ(err, "/nonexistent/x.dfs: cannot open: No such file or directory");

    unlink(a);
    unlink(b);
    unlink(bad);
    rmdir(dir);
    printf("test_shard: ok\n");
    return 0;
}
