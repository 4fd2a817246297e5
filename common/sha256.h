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

#endif
