/* sha256.c: SHA-256 (see sha256.h). Straight from FIPS 180-4, and the same rounds on the
 * x86 SHA extensions where the CPU has them; checked against sha256sum and against each
 * other by tests/test_sha256.c. */
#include "sha256.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t ror(uint32_t x, int n)
{
    return (x >> n) | (x << (32 - n));
}

static void block(uint32_t h[8], const uint8_t *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = k + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
        uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

static void blocks_portable(uint32_t h[8], const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        block(h, p + 64 * i);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>

/* The x86 SHA extensions (SHA-NI): sha256rnds2 does two rounds on the state held as ABEF /
 * CDGH in two registers, sha256msg1 / msg2 the sigma0 / sigma1 parts of the message
 * schedule. Same digest as block() (tests/test_sha256.c compares them on random data);
 * several times faster. */
__attribute__((target("sha,sse4.1"))) static void blocks_shani(uint32_t h[8], const uint8_t *p, size_t n)
{
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bll, 0x0405060700010203ll);
    __m128i dcba = _mm_loadu_si128((const __m128i *)&h[0]); /* lanes 0..3 = A B C D */
    __m128i hgfe = _mm_loadu_si128((const __m128i *)&h[4]); /* lanes 0..3 = E F G H */
    __m128i cdab = _mm_shuffle_epi32(dcba, 0xb1);
    __m128i efgh = _mm_shuffle_epi32(hgfe, 0x1b);
    __m128i abef = _mm_alignr_epi8(cdab, efgh, 8);
    __m128i cdgh = _mm_blend_epi16(efgh, cdab, 0xf0);
    for (size_t blk = 0; blk < n; blk++, p += 64) {
        __m128i abef0 = abef, cdgh0 = cdgh, m[4];
#pragma GCC unroll 16
        for (int g = 0; g < 16; g++) { /* rounds 4g .. 4g+3 */
            __m128i *w = &m[g & 3];
            if (g < 4)
                *w = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * g)), bswap);
            else { /* W[4g..4g+3] from the groups g-4 (in *w), g-3, g-2, g-1 */
                __m128i t = _mm_sha256msg1_epu32(*w, m[(g + 1) & 3]);
                t = _mm_add_epi32(t, _mm_alignr_epi8(m[(g + 3) & 3], m[(g + 2) & 3], 4));
                *w = _mm_sha256msg2_epu32(t, m[(g + 3) & 3]);
            }
            __m128i wk = _mm_add_epi32(*w, _mm_loadu_si128((const __m128i *)&K[4 * g]));
            cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);
            abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(wk, 0x0e));
        }
        abef = _mm_add_epi32(abef, abef0);
        cdgh = _mm_add_epi32(cdgh, cdgh0);
    }
    __m128i feba = _mm_shuffle_epi32(abef, 0x1b);
    __m128i dchg = _mm_shuffle_epi32(cdgh, 0xb1);
    _mm_storeu_si128((__m128i *)&h[0], _mm_blend_epi16(feba, dchg, 0xf0));
    _mm_storeu_si128((__m128i *)&h[4], _mm_alignr_epi8(dchg, feba, 8));
}

static int cpu_has_shani(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(b & (1u << 29))) /* SHA */
        return 0;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 19)) && (c & (1u << 9)); /* SSE4.1, SSSE3 */
}
#else
static int cpu_has_shani(void)
{
    return 0;
}
#define blocks_shani blocks_portable
#endif

/* The block function, chosen on first use. Several threads may choose at once (the
 * checkpoint writer hashes a file whole and in pieces on two threads): they choose the
 * same one, and the atomics make that a race the C memory model allows, not undefined
 * behaviour (the thread sanitizer reported the plain pointer). Relaxed: the value is all
 * that is shared, and it is read once per update call, not per block. */
typedef void (*blocks_fn)(uint32_t h[8], const uint8_t *p, size_t n);
static _Atomic(blocks_fn) blocks_impl;
static atomic_int force_portable;

static blocks_fn pick(void)
{
    blocks_fn f = atomic_load_explicit(&blocks_impl, memory_order_relaxed);
    if (!f) {
        f = !atomic_load_explicit(&force_portable, memory_order_relaxed) && cpu_has_shani() ? blocks_shani
                                                                                            : blocks_portable;
        atomic_store_explicit(&blocks_impl, f, memory_order_relaxed);
    }
    return f;
}

const char *df_sha256_impl(void)
{
    return pick() == blocks_portable ? "portable" : "sha-ni";
}

void df_sha256_force_portable(int force)
{
    atomic_store_explicit(&force_portable, force, memory_order_relaxed);
    atomic_store_explicit(&blocks_impl, NULL, memory_order_relaxed);
}

void df_sha256_init(df_sha256 *s)
{
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->len = 0;
    s->nbuf = 0;
}

void df_sha256_update(df_sha256 *s, const void *data, size_t len)
{
    const uint8_t *p = data;
    s->len += len;
    if (s->nbuf) {
        size_t take = 64 - s->nbuf < len ? 64 - s->nbuf : len;
        memcpy(s->buf + s->nbuf, p, take);
        s->nbuf += take, p += take, len -= take;
        if (s->nbuf < 64)
            return;
        pick()(s->h, s->buf, 1);
        s->nbuf = 0;
    }
    if (len >= 64) {
        pick()(s->h, p, len / 64);
        p += len / 64 * 64, len %= 64;
    }
    memcpy(s->buf, p, len);
    s->nbuf = len;
}

void df_sha256_final(df_sha256 *s, uint8_t out[32])
{
    uint64_t bits = s->len * 8;
    uint8_t pad[72] = {0x80};
    size_t npad = (s->nbuf < 56 ? 56 : 120) - s->nbuf;
    for (int i = 0; i < 8; i++)
        pad[npad + i] = (uint8_t)(bits >> (56 - 8 * i));
    df_sha256_update(s, pad, npad + 8);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 4; j++)
            out[4 * i + j] = (uint8_t)(s->h[i] >> (24 - 8 * j));
}

void df_sha256_hex(const uint8_t dig[32], char hex[65])
{
    static const char x[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++)
        hex[2 * i] = x[dig[i] >> 4], hex[2 * i + 1] = x[dig[i] & 15];
    hex[64] = 0;
}

int df_sha256_file(const char *path, char hex[65], uint64_t *size)
{
    return df_sha256_file_pieces(path, hex, size, NULL);
}

int df_sha256_pieces_init(df_sha256_pieces *p, uint64_t piece_bytes)
{
    memset(p, 0, sizeof *p);
    if (!piece_bytes)
        return -EINVAL;
    p->piece_bytes = piece_bytes;
    df_sha256_init(&p->cur);
    return 0;
}

/* Close the open piece into p->hex[p->n]. */
static int pieces_close(df_sha256_pieces *p)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 16;
        char(*h)[65] = realloc(p->hex, cap * sizeof *h);
        if (!h)
            return -ENOMEM;
        p->hex = h, p->cap = cap;
    }
    uint8_t dig[32];
    df_sha256_final(&p->cur, dig);
    df_sha256_hex(dig, p->hex[p->n++]);
    df_sha256_init(&p->cur);
    p->in_piece = 0;
    return 0;
}

int df_sha256_pieces_update(df_sha256_pieces *p, const void *data, size_t len)
{
    const uint8_t *d = data;
    while (len) {
        uint64_t room = p->piece_bytes - p->in_piece;
        size_t take = len < room ? len : (size_t)room;
        df_sha256_update(&p->cur, d, take);
        p->in_piece += take, d += take, len -= take;
        if (p->in_piece == p->piece_bytes) {
            int rc = pieces_close(p);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

int df_sha256_pieces_final(df_sha256_pieces *p)
{
    return p->in_piece ? pieces_close(p) : 0;
}

void df_sha256_pieces_free(df_sha256_pieces *p)
{
    free(p->hex);
    p->hex = NULL;
    p->n = p->cap = 0;
}

uint64_t df_sha256_piece_count(uint64_t bytes, uint64_t piece_bytes)
{
    return piece_bytes ? bytes / piece_bytes + (bytes % piece_bytes != 0) : 0;
}

int df_sha256_range(int fd, uint64_t off, uint64_t len, char hex[65])
{
    enum { CHUNK = 1 << 20 };
    uint8_t *buf = malloc(CHUNK);
    if (!buf)
        return -ENOMEM;
    df_sha256 s;
    df_sha256_init(&s);
    int rc = 0;
    while (len) {
        size_t want = len < CHUNK ? (size_t)len : CHUNK;
        ssize_t r = pread(fd, buf, want, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = -errno;
            break;
        }
        if (r == 0) {
            rc = -ENODATA; /* the file is shorter than the range */
            break;
        }
        df_sha256_update(&s, buf, (size_t)r);
        off += (uint64_t)r, len -= (uint64_t)r;
    }
    free(buf);
    if (rc < 0)
        return rc;
    uint8_t dig[32];
    df_sha256_final(&s, dig);
    df_sha256_hex(dig, hex);
    return 0;
}

int df_sha256_file_pieces(const char *path, char hex[65], uint64_t *size, df_sha256_pieces *p)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    enum { CHUNK = 1 << 20 };
    uint8_t *buf = malloc(CHUNK);
    if (!buf) {
        close(fd);
        return -ENOMEM;
    }
    df_sha256 s;
    df_sha256_init(&s);
    int rc = 0;
    for (;;) {
        ssize_t r = read(fd, buf, CHUNK);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = -errno;
            break;
        }
        if (r == 0)
            break;
        df_sha256_update(&s, buf, (size_t)r);
        if (p && (rc = df_sha256_pieces_update(p, buf, (size_t)r)) < 0)
            break;
    }
    free(buf);
    close(fd);
    if (rc == 0 && p)
        rc = df_sha256_pieces_final(p);
    if (rc < 0)
        return rc;
    uint8_t dig[32];
    if (size)
        *size = s.len;
    df_sha256_final(&s, dig);
    df_sha256_hex(dig, hex);
    return 0;
}
