/* test_sha256: common/sha256.c against FIPS 180-4 vectors and against sha256sum on a file
 * whose pieces straddle the 64-byte block and the 1 MiB read boundaries, on the
 * implementation the CPU picks (sha-ni or portable); then that one against the portable
 * code on fresh random inputs. */
#include "sha256.h"
#include "test_helpers.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

static void hex_of(const void *p, size_t n, char out[65])
{
    df_sha256 s;
    uint8_t d[32];
    df_sha256_init(&s);
    df_sha256_update(&s, p, n);
    df_sha256_final(&s, d);
    df_sha256_hex(d, out);
}

int main(void)
{
    char h[65];
    hex_of("", 0, h);
    T_ASSERT_STREQ(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    hex_of("abc", 3, h);
    T_ASSERT_STREQ(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    hex_of(m448, strlen(m448), h);
    T_ASSERT_STREQ(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");

    /* one million 'a' fed in odd pieces: the same digest as in one call */
    size_t n = 1000000;
    char *a = malloc(n);
    T_ASSERT(a);
    memset(a, 'a', n);
    df_sha256 s;
    uint8_t d[32];
    df_sha256_init(&s);
    for (size_t off = 0, k = 1; off < n; k = k * 7 % 131 + 1) {
        size_t take = DF_MIN(k, n - off);
        df_sha256_update(&s, a + off, take);
        off += take;
    }
    df_sha256_final(&s, d);
    df_sha256_hex(d, h);
    T_ASSERT_STREQ(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(a);

    /* a file of 3 MiB + 17 bytes of PRNG bytes: df_sha256_file == sha256sum */
    char dir[] = "/tmp/df_test_sha_XXXXXX", path[128], cmd[256];
    T_ASSERT(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/f.bin", dir);
    size_t fn = (3u << 20) + 17;
    unsigned char *b = malloc(fn);
    T_ASSERT(b);
    df_rng r;
    df_rng_seed(&r, 42);
    for (size_t i = 0; i < fn; i++)
        b[i] = (unsigned char)df_rng_next(&r);
    T_ASSERT_RC(df_write_file_atomic(path, b, fn));
    uint64_t sz = 0;
    T_ASSERT_RC(df_sha256_file(path, h, &sz));
    T_ASSERT(sz == fn);
    hex_of(b, fn, cmd);
    T_ASSERT_STREQ(h, cmd);
    snprintf(cmd, sizeof cmd, "sha256sum %s 2>/dev/null", path);
    FILE *p = popen(cmd, "r");
    char line[256] = "";
    if (p && fgets(line, sizeof line, p) && strlen(line) > 64) {
        line[64] = 0;
        T_ASSERT_STREQ(h, line);
    }
    if (p)
        pclose(p);
    T_ASSERT(df_sha256_file("/nonexistent/x", h, NULL) == -ENOENT);

    /* Every test above ran on the implementation the CPU picks. Where that is sha-ni, the
     * portable code must give the same digests: fresh random lengths (0..5000 bytes, so
     * every padding case), contents and piece sizes each run (seed printed). */
    const char *impl = df_sha256_impl();
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    printf("test_sha256: implementation %s, cross-check seed %llu\n", impl, (unsigned long long)seed);
    df_rng_seed(&r, seed);
    int cases = 0;
    for (int it = 0; it < 400; it++) {
        size_t len = (size_t)(df_rng_next(&r) % 5001), piece = 1 + (size_t)(df_rng_next(&r) % 200);
        for (size_t i = 0; i < len; i++)
            b[i] = (unsigned char)df_rng_next(&r);
        char best[65], port[65];
        hex_of(b, len, best);
        df_sha256_force_portable(1);
        df_sha256_init(&s); /* in pieces through the portable code */
        for (size_t off = 0; off < len; off += piece)
            df_sha256_update(&s, b + off, DF_MIN(piece, len - off));
        df_sha256_final(&s, d);
        df_sha256_hex(d, port);
        T_ASSERT(strcmp(df_sha256_impl(), "portable") == 0);
        df_sha256_force_portable(0);
        if (strcmp(best, port) != 0) {
            fprintf(stderr, "test_sha256: %s and portable differ on %zu bytes (seed %llu): %s vs %s\n", impl, len,
                    (unsigned long long)seed, best, port);
            return 1;
        }
        cases++;
    }
    T_ASSERT(strcmp(df_sha256_impl(), impl) == 0);
    printf("test_sha256: %s == portable on %d random inputs\n", impl, cases);

    /* Piece digests (the checkpoint manifest's): fed in random chunks, df_sha256_pieces
     * gives piece k the digest of bytes [k P, (k + 1) P) and df_sha256_piece_count pieces;
     * df_sha256_range on the file above gives the same for any range, and -ENODATA for one
     * past its end; df_sha256_file_pieces gives the file's whole digest and its pieces. */
    long npieces = 0;
    for (int it = 0; it < 200; it++) {
        size_t len = (size_t)(df_rng_next(&r) % 20001);
        uint64_t P = 1 + df_rng_next(&r) % (it % 2 ? 64 : 6000);
        for (size_t i = 0; i < len; i++)
            b[i] = (unsigned char)df_rng_next(&r);
        df_sha256_pieces pc;
        T_ASSERT_RC(df_sha256_pieces_init(&pc, P));
        for (size_t off = 0; off < len;) {
            size_t want = (size_t)(df_rng_next(&r) % 3000), take = DF_MIN(len - off, want);
            T_ASSERT_RC(df_sha256_pieces_update(&pc, b + off, take));
            off += take;
        }
        T_ASSERT_RC(df_sha256_pieces_final(&pc));
        T_ASSERT(pc.n == df_sha256_piece_count(len, P));
        for (size_t k = 0; k < pc.n; k++) {
            char want[65];
            hex_of(b + k * P, DF_MIN((size_t)P, len - k * P), want);
            T_ASSERT_STREQ(pc.hex[k], want);
        }
        npieces += (long)pc.n;
        df_sha256_pieces_free(&pc);
    }
    T_ASSERT(df_sha256_pieces_init(&(df_sha256_pieces){0}, 0) == -EINVAL);
    df_rng_seed(&r, 42); /* the file's bytes again */
    for (size_t i = 0; i < fn; i++)
        b[i] = (unsigned char)df_rng_next(&r);
    int fd = open(path, O_RDONLY);
    T_ASSERT(fd >= 0);
    for (int it = 0; it < 20; it++) {
        uint64_t off = df_rng_next(&r) % fn, len = df_rng_next(&r) % (fn - off + 1);
        char got[65], want[65];
        T_ASSERT_RC(df_sha256_range(fd, off, len, got));
        hex_of(b + off, (size_t)len, want);
        T_ASSERT_STREQ(got, want);
    }
    T_ASSERT(df_sha256_range(fd, fn - 10, 11, h) == -ENODATA);
    close(fd);
    df_sha256_pieces fp;
    T_ASSERT_RC(df_sha256_pieces_init(&fp, 1u << 20));
    T_ASSERT_RC(df_sha256_file_pieces(path, h, &sz, &fp));
    hex_of(b, fn, cmd);
    T_ASSERT(sz == fn && fp.n == 4 && !strcmp(h, cmd));
    hex_of(b + (3u << 20), 17, cmd);
    T_ASSERT_STREQ(fp.hex[3], cmd);
    df_sha256_pieces_free(&fp);
    printf("test_sha256: piece digests == the digests of their byte ranges (%ld pieces, random sizes and feeds)\n",
           npieces);
    unlink(path);
    rmdir(dir);
    free(b);
    printf("test_sha256: ok\n");
    return 0;
}
