/* sha256.c: SHA-256 (see sha256.h) through libcrypto's EVP digest interface. Each stream
 * owns its EVP_MD_CTX, made at init and freed at final, so threads hashing at once (the
 * checkpoint writer hashes a file whole and in pieces on two threads; verify hashes
 * pieces on every core) share no state here. Checked against sha256sum on real files and
 * on several threads by tests/test_sha256.c. */
#include "sha256.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { READ_CHUNK = 1 << 20 };

int df_sha256_init(df_sha256 *s)
{
    memset(s, 0, sizeof *s);
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (!c)
        return -ENOMEM;
    if (EVP_DigestInit_ex(c, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(c);
        return -EIO;
    }
    s->ctx = c;
    return 0;
}

void df_sha256_update(df_sha256 *s, const void *data, size_t len)
{
    if (s->err)
        return;
    if (!s->ctx)
        s->err = -EINVAL;
    else if (len && EVP_DigestUpdate(s->ctx, data, len) != 1)
        s->err = -EIO;
    else
        s->len += len;
}

int df_sha256_final(df_sha256 *s, uint8_t out[32])
{
    int rc = s->err ? s->err : s->ctx ? 0 : -EINVAL;
    unsigned int n = 0;
    if (!rc && (EVP_DigestFinal_ex(s->ctx, out, &n) != 1 || n != 32))
        rc = -EIO;
    df_sha256_free(s);
    return rc;
}

void df_sha256_free(df_sha256 *s)
{
    EVP_MD_CTX_free(s->ctx); /* NULL is fine */
    s->ctx = NULL;
}

void df_sha256_hex(const uint8_t dig[32], char hex[65])
{
    static const char x[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++)
        hex[2 * i] = x[dig[i] >> 4], hex[2 * i + 1] = x[dig[i] & 15];
    hex[64] = 0;
}

int df_sha256_buf(const void *data, size_t len, char hex[65])
{
    df_sha256 s;
    uint8_t dig[32];
    int rc = df_sha256_init(&s);
    if (rc < 0)
        return rc;
    df_sha256_update(&s, data, len);
    if ((rc = df_sha256_final(&s, dig)) < 0)
        return rc;
    df_sha256_hex(dig, hex);
    return 0;
}

const char *df_sha256_impl(void)
{
    return OpenSSL_version(OPENSSL_VERSION);
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
    int rc = df_sha256_final(&p->cur, dig);
    if (rc < 0)
        return rc;
    df_sha256_hex(dig, p->hex[p->n++]);
    p->in_piece = 0;
    return 0;
}

int df_sha256_pieces_update(df_sha256_pieces *p, const void *data, size_t len)
{
    const uint8_t *d = data;
    while (len) {
        int rc;
        /* a piece's stream starts with its first byte: an empty stream has no pieces */
        if (!p->cur.ctx && (rc = df_sha256_init(&p->cur)) < 0)
            return rc;
        uint64_t room = p->piece_bytes - p->in_piece;
        size_t take = len < room ? len : (size_t)room;
        df_sha256_update(&p->cur, d, take);
        if (p->cur.err)
            return p->cur.err;
        p->in_piece += take, d += take, len -= take;
        if (p->in_piece == p->piece_bytes && (rc = pieces_close(p)) < 0)
            return rc;
    }
    return 0;
}

int df_sha256_pieces_final(df_sha256_pieces *p)
{
    return p->in_piece ? pieces_close(p) : 0;
}

void df_sha256_pieces_free(df_sha256_pieces *p)
{
    df_sha256_free(&p->cur);
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
    uint8_t *buf = malloc(READ_CHUNK);
    if (!buf)
        return -ENOMEM;
    df_sha256 s;
    int rc = df_sha256_init(&s);
    while (!rc && len) {
        size_t want = len < READ_CHUNK ? (size_t)len : READ_CHUNK;
        ssize_t r = pread(fd, buf, want, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            rc = -errno;
        else if (r == 0)
            rc = -ENODATA; /* the file is shorter than the range */
        else {
            df_sha256_update(&s, buf, (size_t)r);
            off += (uint64_t)r, len -= (uint64_t)r;
        }
    }
    free(buf);
    uint8_t dig[32];
    if (!rc)
        rc = df_sha256_final(&s, dig);
    df_sha256_free(&s);
    if (rc < 0)
        return rc;
    df_sha256_hex(dig, hex);
    return 0;
}

int df_sha256_file_pieces(const char *path, char hex[65], uint64_t *size, df_sha256_pieces *p)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    uint8_t *buf = malloc(READ_CHUNK);
    df_sha256 s = {0};
    int rc = buf ? df_sha256_init(&s) : -ENOMEM;
    while (!rc) {
        ssize_t r = read(fd, buf, READ_CHUNK);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            rc = -errno;
        if (r <= 0)
            break;
        df_sha256_update(&s, buf, (size_t)r);
        if (p)
            rc = df_sha256_pieces_update(p, buf, (size_t)r);
    }
    free(buf);
    close(fd);
    if (!rc && p)
        rc = df_sha256_pieces_final(p);
    uint64_t len = s.len;
    uint8_t dig[32];
    if (!rc)
        rc = df_sha256_final(&s, dig);
    df_sha256_free(&s);
    if (rc < 0)
        return rc;
    if (size)
        *size = len;
    df_sha256_hex(dig, hex);
    return 0;
}
