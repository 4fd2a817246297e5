/* dflash_manifest.h: a drafter checkpoint's manifest.json (prefix dflash_manifest_): which
 * files a step directory holds, with their sizes and SHA-256 digests, whole and piece by
 * piece. dflash_ckpt_save writes it last, when every other file is durable;
 * dflash_ckpt_load checks the files against it before it reads any of them. The format and
 * what each check refuses: docs/drafter.md. */
#ifndef DF_DFLASH_MANIFEST_H
#define DF_DFLASH_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "sha256.h"

/* The files a manifest may list, in the order it lists and judges them. */
#define DFLASH_MANIFEST_FILES 3
extern const char *const dflash_manifest_files[DFLASH_MANIFEST_FILES];
enum { DFLASH_MANIFEST_MODEL = 0, DFLASH_MANIFEST_OPTIMIZER = 1, DFLASH_MANIFEST_STATE = 2 };

/* Pieces of 64 MiB: an 8B-shape optimizer file (8.4 GB) is 126 of them, checked on every
 * core at once; the manifest grows by about 70 bytes a piece. */
#define DFLASH_MANIFEST_PIECE_BYTES (64ull << 20)
#define DFLASH_MANIFEST_MIN_PIECE 4096ull

/* The piece size of the manifests this process writes (>= DFLASH_MANIFEST_MIN_PIECE; 0
 * only queries). Process-wide, for tests that want several pieces in small files. Returns
 * the previous value. */
uint64_t dflash_manifest_piece_bytes(uint64_t set);

/* A file's digests when its writer already has them (hashed as written). */
typedef struct dflash_manifest_sum {
    int have;
    char hex[65];
    uint64_t size;
    df_sha256_pieces pieces; /* initialised with dflash_manifest_piece_bytes(0) */
} dflash_manifest_sum;

/* Write dir/manifest.json (version 2): step and, for each file of dflash_manifest_files
 * that exists in dir, {"bytes", "sha256", "piece_bytes", "sha256_pieces"} from sums[i]
 * when it has them, else read from the file. 0 or -errno with err set. */
int dflash_manifest_write(const char *dir, long step, const dflash_manifest_sum sums[DFLASH_MANIFEST_FILES], char *err,
                          size_t errlen);

/* What a verify covered (dflash_tool verify prints it). */
typedef struct dflash_manifest_stats {
    int version, files, threads;
    uint64_t bytes, pieces;
} dflash_manifest_stats;

/* Verify the step dir `dir` against its manifest.json (version 1: whole-file digests, one
 * thread a file; version 2: the pieces' digests, on every core): every listed file present
 * with its size and digests; model and trainer state listed (the optimizer file may be
 * absent, but not present and unlisted); nothing else listed; a step-N directory name
 * equal to the manifest's step. The files are judged in the table's order, whichever
 * thread finished first. 0 (*step = the manifest's step; st, may be NULL, filled), -EINVAL
 * with err naming the file and field or byte range, or another -errno for an I/O error
 * (temporary). */
int dflash_manifest_verify(const char *dir, long *step, dflash_manifest_stats *st, char *err, size_t errlen);

#endif
