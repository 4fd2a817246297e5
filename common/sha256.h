/* sha256.h: SHA-256 (FIPS 180-4), portable C, for the checkpoint manifest
 * (common/dflash/dflash_ckpt.c): each file's digest is recorded when the checkpoint is
 * written and checked before it is loaded. The hex digest is what `sha256sum` prints, so
 * an operator can check a checkpoint by hand. Corruption detection, not authentication:
 * whoever can rewrite a file can rewrite the manifest (docs/security.md). */
#ifndef DF_SHA256_H
#define DF_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct df_sha256 {
    uint32_t h[8];
    uint64_t len; /* bytes hashed so far */
    uint8_t buf[64];
    size_t nbuf;
} df_sha256;

void df_sha256_init(df_sha256 *s);
void df_sha256_update(df_sha256 *s, const void *data, size_t len);
void df_sha256_final(df_sha256 *s, uint8_t out[32]);
/* hex: 64 lowercase hex digits + NUL */
void df_sha256_hex(const uint8_t dig[32], char hex[65]);
/* The implementation in use: "sha-ni" (x86 SHA extensions, picked when the CPU has them)
 * or "portable" (plain C, any CPU). Same digests; sha-ni is several times faster
 * (bench/ckpt/bench_sha256.c). */
const char *df_sha256_impl(void);
/* 1: use the portable code from now on; 0: the best the CPU has again (tests, benchmarks).
 * Not to be called while another thread hashes. */
void df_sha256_force_portable(int force);
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
    df_sha256 cur;
    size_t n, cap;   /* pieces closed, slots allocated */
    char (*hex)[65]; /* [n]: their digests */
} df_sha256_pieces;

/* 0, or -EINVAL when piece_bytes is 0. */
int df_sha256_pieces_init(df_sha256_pieces *p, uint64_t piece_bytes);
/* 0 or -ENOMEM (p then stays unusable: free it). */
int df_sha256_pieces_update(df_sha256_pieces *p, const void *data, size_t len);
/* Close the last, partial piece. 0 or -ENOMEM. */
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
