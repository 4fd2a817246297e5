/* sha256.h: SHA-256 for the checkpoint manifest (common/dflash/dflash_ckpt.c): each file's
 * digest is recorded when the checkpoint is written and checked before it is loaded. The
 * hex digest is what `sha256sum` prints, so an operator can check a checkpoint by hand.
 * Corruption detection, not authentication: whoever can rewrite a file can rewrite the
 * manifest (docs/security.md). The rounds are libcrypto's (OpenSSL's EVP interface, which
 * picks the CPU's SHA extensions or vector code itself); this file keeps the project's
 * side: 0 / -errno returns, whole files, pieces, byte ranges. */
#ifndef DF_SHA256_H
#define DF_SHA256_H

#include <stddef.h>
#include <stdint.h>

struct evp_md_ctx_st; /* libcrypto's EVP_MD_CTX, opaque here */

/* One stream. Each has its own libcrypto context: streams on different threads share
 * nothing. A zeroed struct is a stream not started (df_sha256_free is a no-op on it). */
typedef struct df_sha256 {
    struct evp_md_ctx_st *ctx;
    uint64_t len; /* bytes hashed so far */
    int err;      /* the first failure of an update, returned by final */
} df_sha256;

/* Starts a stream. 0, -ENOMEM, or -EIO (libcrypto could not set up SHA-256: a broken
 * installation); on failure nothing is held. */
int df_sha256_init(df_sha256 *s);
/* Feeds bytes. A failure (-EIO; -EINVAL on a stream not started) is kept, and final
 * returns it: a caller checks once, at the end. */
void df_sha256_update(df_sha256 *s, const void *data, size_t len);
/* The digest of everything fed; ends the stream (its context freed: init again to reuse).
 * 0, or the first failure of the stream (-EINVAL, -EIO). */
int df_sha256_final(df_sha256 *s, uint8_t out[32]);
/* Ends a stream without its digest (error paths); safe on one ended or never started. */
void df_sha256_free(df_sha256 *s);
/* hex: 64 lowercase hex digits + NUL */
void df_sha256_hex(const uint8_t dig[32], char hex[65]);
/* The digest of one buffer as hex. 0, -ENOMEM or -EIO. */
int df_sha256_buf(const void *data, size_t len, char hex[65]);
/* The libcrypto in use, as it names itself ("OpenSSL 3.0.19 27 Jan 2026"): for benchmarks. */
const char *df_sha256_impl(void);
/* Digest of a whole file (read in 1 MiB pieces) as hex, and its size. 0 or -errno. */
int df_sha256_file(const char *path, char hex[65], uint64_t *size);

/* The digests of a stream piece by piece: piece i is bytes [i P, (i + 1) P) of what was
 * fed, P = piece_bytes (the last piece may be shorter; an empty stream has none). The
 * checkpoint manifest records them beside the whole file's digest, so that a loader can
 * check the pieces of a large file on several threads at once (one SHA-256 stream cannot
 * be split). */
typedef struct df_sha256_pieces {
    uint64_t piece_bytes;
    uint64_t in_piece; /* bytes of the open piece hashed so far */
    df_sha256 cur;     /* the open piece: started by its first byte */
    size_t n, cap;     /* pieces closed, slots allocated */
    char (*hex)[65];   /* [n]: their digests */
} df_sha256_pieces;

/* 0, or -EINVAL when piece_bytes is 0. Holds nothing yet: a zeroed struct or one that
 * failed here may be freed. */
int df_sha256_pieces_init(df_sha256_pieces *p, uint64_t piece_bytes);
/* 0, -ENOMEM or -EIO (p then stays unusable: free it). */
int df_sha256_pieces_update(df_sha256_pieces *p, const void *data, size_t len);
/* Close the last, partial piece. 0, -ENOMEM or -EIO. */
int df_sha256_pieces_final(df_sha256_pieces *p);
void df_sha256_pieces_free(df_sha256_pieces *p);
/* Pieces a stream of `bytes` has with pieces of piece_bytes (0 for an empty one). */
uint64_t df_sha256_piece_count(uint64_t bytes, uint64_t piece_bytes);

/* Digest of bytes [off, off + len) of the open file fd (pread, 1 MiB at a time): 0,
 * -ENODATA when the file ends before off + len, or -errno. */
int df_sha256_range(int fd, uint64_t off, uint64_t len, char hex[65]);
/* df_sha256_file and the file's pieces (p initialised by the caller; NULL: none) in one
 * read. */
int df_sha256_file_pieces(const char *path, char hex[65], uint64_t *size, df_sha256_pieces *p);

#endif
