/* test_sha256: common/sha256.c (libcrypto underneath) against FIPS 180-4 vectors, against
 * sha256sum on real files of the sizes where SHA-256's padding changes (0, 55, 56, 64
 * bytes, ...) and where the 1 MiB reads split (1 MiB +- 1, 3 MiB + 17), fed whole, in
 * random pieces and through the file readers; streams on several threads at once against
 * the same inputs hashed on one; the piece digests of the checkpoint manifest. */
#include "sha256.h"
#include "test_helpers.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

/* Streamed in pieces of 1..max_piece bytes drawn from r (max_piece 0: one call). */
static void hex_stream(const uint8_t *p, size_t n, df_rng *r, size_t max_piece, char out[65])
{
    df_sha256 s;
    uint8_t d[32];
    T_ASSERT_RC(df_sha256_init(&s));
    for (size_t off = 0; off < n;) {
        size_t want = max_piece ? 1 + (size_t)(df_rng_next(r) % max_piece) : n; /* DF_MIN evaluates twice */
        size_t take = DF_MIN(want, n - off);
        df_sha256_update(&s, p + off, take);
        off += take;
    }
    T_ASSERT(s.len == n);
    T_ASSERT_RC(df_sha256_final(&s, d));
    T_ASSERT(s.ctx == NULL); /* final ends the stream */
    df_sha256_hex(d, out);
}

static void hex_of(const void *p, size_t n, char out[65])
{
    T_ASSERT_RC(df_sha256_buf(p, n, out));
}

static void fill(uint8_t *b, size_t n, df_rng *r)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)df_rng_next(r);
}

/* Threads: each hashes the same inputs as the main thread did, in its own random pieces,
 * while the others do. */
enum { N_THREADS = 4, N_INPUTS = 24 };
typedef struct thr {
    const uint8_t *b;
    const size_t *len;
    const char (*want)[65];
    uint64_t seed;
    int bad;
} thr;

static void *thr_main(void *arg)
{
    thr *t = arg;
    df_rng r;
    df_rng_seed(&r, t->seed);
    for (int rep = 0; rep < 4; rep++)
        for (int i = 0; i < N_INPUTS; i++) {
            char h[65];
            hex_stream(t->b, t->len[i], &r, 1 + (size_t)(df_rng_next(&r) % 9000), h);
            t->bad += strcmp(h, t->want[i]) != 0;
        }
    return NULL;
}

int main(void)
{
    char h[65], h2[65];
    df_rng r;
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    printf("test_sha256: %s, seed %llu\n", df_sha256_impl(), (unsigned long long)seed);
    df_rng_seed(&r, seed);
    hex_of("", 0, h);
    T_ASSERT_STREQ(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    hex_of("abc", 3, h);
    T_ASSERT_STREQ(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    hex_of(m448, strlen(m448), h);
    T_ASSERT_STREQ(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    /* one million 'a' fed in odd pieces: the same digest as in one call */
    size_t n = 1000000;
    uint8_t *a = malloc(n);
    T_ASSERT(a);
    memset(a, 'a', n);
    hex_stream(a, n, &r, 131, h);
    T_ASSERT_STREQ(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(a);

    /* Real files of PRNG bytes: df_sha256_file == sha256sum == the buffer's digest, whole
     * and in random pieces. 55 / 56 bytes: the last size whose length fits the final block
     * and the first that needs another; 64: a whole block and a padding block; 1 MiB +- 1:
     * around the file reader's chunk. */
    static const size_t sizes[] = {
        0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 1000, (1u << 20) - 1, 1u << 20, (1u << 20) + 1, (3u << 20) + 17};
    enum { NS = sizeof sizes / sizeof sizes[0] };
    size_t maxn = (3u << 20) + 17;
    uint8_t *b = malloc(maxn);
    T_ASSERT(b);
    char dir[] = "/tmp/df_test_sha_XXXXXX", path[NS][128], cmd[NS * 130 + 64], want[NS][65];
    T_ASSERT(mkdtemp(dir));
    int off = snprintf(cmd, sizeof cmd, "sha256sum");
    for (int k = 0; k < NS; k++) {
        fill(b, sizes[k], &r);
        snprintf(path[k], sizeof path[k], "%s/f%zu.bin", dir, sizes[k]);
        T_ASSERT_RC(df_write_file_atomic(path[k], b, sizes[k]));
        off += snprintf(cmd + off, sizeof cmd - (size_t)off, " %s", path[k]);
        hex_of(b, sizes[k], want[k]);
        hex_stream(b, sizes[k], &r, 200, h);
        T_ASSERT_STREQ(h, want[k]);
        hex_stream(b, sizes[k], &r, 70000, h);
        T_ASSERT_STREQ(h, want[k]);
        uint64_t sz = 1;
        T_ASSERT_RC(df_sha256_file(path[k], h, &sz));
        T_ASSERT(sz == sizes[k]);
        T_ASSERT_STREQ(h, want[k]);
    }
    FILE *p = popen(cmd, "r");
    T_ASSERT(p);
    int lines = 0;
    char line[512];
    while (fgets(line, sizeof line, p)) { /* "<hex>  <path>\n", in the order given */
        T_ASSERT(lines < NS && strlen(line) > 66);
        line[strcspn(line, "\n")] = 0;
        T_ASSERT_STREQ(line + 66, path[lines]);
        line[64] = 0;
        T_ASSERT_STREQ(line, want[lines]);
        lines++;
    }
    T_ASSERT(pclose(p) == 0);
    if (lines != NS) {
        fprintf(stderr, "test_sha256: sha256sum printed %d of %d digests (is coreutils' sha256sum there?)\n", lines,
                NS);
        return 1;
    }
    printf("test_sha256: %d files of 0 .. %zu bytes == sha256sum (whole, in pieces, read from the file)\n", NS, maxn);
    T_ASSERT(df_sha256_file("/nonexistent/x", h, NULL) == -ENOENT);

    /* misuse and error paths: a stream never started refuses; free is safe on any */
    df_sha256 z = {0};
    uint8_t d[32];
    df_sha256_update(&z, "x", 1);
    T_ASSERT(df_sha256_final(&z, d) == -EINVAL);
    df_sha256_free(&z);
    T_ASSERT_RC(df_sha256_init(&z));
    df_sha256_update(&z, "x", 1);
    df_sha256_free(&z); /* abandoned */
    df_sha256_free(&z);

    /* Streams on N_THREADS threads at once, each in its own pieces: the digests the main
     * thread got (every stream has its own context: nothing shared to race on). */
    size_t len[N_INPUTS];
    char tw[N_INPUTS][65];
    fill(b, 1u << 20, &r);
    for (int i = 0; i < N_INPUTS; i++) {
        len[i] = (size_t)(df_rng_next(&r) % (1u << 20));
        hex_of(b, len[i], tw[i]);
    }
    pthread_t th[N_THREADS];
    thr t[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        t[i] = (thr){.b = b, .len = len, .want = (const char(*)[65])tw, .seed = seed + 1 + (uint64_t)i};
        T_ASSERT(pthread_create(&th[i], NULL, thr_main, &t[i]) == 0);
    }
    int bad = 0;
    for (int i = 0; i < N_THREADS; i++) {
        T_ASSERT(pthread_join(th[i], NULL) == 0);
        bad += t[i].bad;
    }
    T_ASSERT(bad == 0);
    printf("test_sha256: %d threads x %d streams at once == one thread's digests\n", N_THREADS, 4 * N_INPUTS);

    /* Piece digests (the checkpoint manifest's): fed in random chunks, df_sha256_pieces
     * gives piece k the digest of bytes [k P, (k + 1) P) and df_sha256_piece_count pieces;
     * df_sha256_range on the largest file above gives the same for any range, and -ENODATA
     * for one past its end; df_sha256_file_pieces gives the file's whole digest and its
     * pieces. */
    long npieces = 0;
    for (int it = 0; it < 200; it++) {
        size_t ln = (size_t)(df_rng_next(&r) % 20001);
        uint64_t P = 1 + df_rng_next(&r) % (it % 2 ? 64 : 6000);
        fill(b, ln, &r);
        df_sha256_pieces pc;
        T_ASSERT_RC(df_sha256_pieces_init(&pc, P));
        for (size_t o = 0; o < ln;) {
            size_t w = (size_t)(df_rng_next(&r) % 3000), take = DF_MIN(ln - o, w);
            T_ASSERT_RC(df_sha256_pieces_update(&pc, b + o, take));
            o += take;
        }
        T_ASSERT_RC(df_sha256_pieces_final(&pc));
        T_ASSERT(pc.n == df_sha256_piece_count(ln, P));
        for (size_t k = 0; k < pc.n; k++) {
            hex_of(b + k * P, DF_MIN((size_t)P, ln - k * P), h);
            T_ASSERT_STREQ(pc.hex[k], h);
        }
        npieces += (long)pc.n;
        if (it % 3 == 0 && P > 1) { /* abandoned midway: free releases the open piece */
            T_ASSERT_RC(df_sha256_pieces_update(&pc, b, 1));
            T_ASSERT(pc.cur.ctx != NULL);
        }
        df_sha256_pieces_free(&pc);
        T_ASSERT(pc.cur.ctx == NULL);
    }
    T_ASSERT(df_sha256_pieces_init(&(df_sha256_pieces){0}, 0) == -EINVAL);
    const char *big = path[NS - 1];
    size_t fn = sizes[NS - 1];
    int fd = open(big, O_RDONLY);
    T_ASSERT(fd >= 0);
    T_ASSERT((size_t)read(fd, b, fn) == fn);
    for (int it = 0; it < 20; it++) {
        uint64_t o = df_rng_next(&r) % fn, ln = df_rng_next(&r) % (fn - o + 1);
        T_ASSERT_RC(df_sha256_range(fd, o, ln, h));
        hex_of(b + o, (size_t)ln, h2);
        T_ASSERT_STREQ(h, h2);
    }
    T_ASSERT(df_sha256_range(fd, fn - 10, 11, h) == -ENODATA);
    close(fd);
    df_sha256_pieces fp;
    uint64_t sz = 0;
    T_ASSERT_RC(df_sha256_pieces_init(&fp, 1u << 20));
    T_ASSERT_RC(df_sha256_file_pieces(big, h, &sz, &fp));
    T_ASSERT(sz == fn && fp.n == 4);
    T_ASSERT_STREQ(h, want[NS - 1]);
    hex_of(b + (3u << 20), 17, h);
    T_ASSERT_STREQ(fp.hex[3], h);
    df_sha256_pieces_free(&fp);
    printf("test_sha256: piece digests == the digests of their byte ranges (%ld pieces, random sizes and feeds)\n",
           npieces);
    for (int k = 0; k < NS; k++)
        unlink(path[k]);
    rmdir(dir);
    free(b);
    printf("test_sha256: ok\n");
    return 0;
}
