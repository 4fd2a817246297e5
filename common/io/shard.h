/* shard.h: token shards (.dfs files) and a dataset made of several of them.
 *
 * A shard holds tokenised chat samples ready for training: per sample its tokens and a
 * loss mask (1 on assistant tokens). Written once by scripts/prepare_data.py (or
 * shard_write), then mmap'd read-only by every worker: nothing is parsed per step.
 *
 * File layout (little-endian, every section 8-byte aligned):
 *   offset 0   header (64 bytes)
 *     char     magic[8]        "DFSHARD1"
 *     uint32   version         1
 *     uint32   vocab_size      every token must be < vocab_size
 *     uint64   n_samples
 *     uint64   n_tokens
 *     uint64   payload_fnv     FNV-1a 64 of every byte after the header
 *     uint64   header_fnv      FNV-1a 64 of the header's first 40 bytes
 *     uint8    reserved[16]    zero
 *   offset 64  uint64 offsets[n_samples + 1]   offsets[0] = 0, non-decreasing, last = n_tokens
 *   then       uint32 tokens[n_tokens]
 *   then       uint8  loss_mask[n_tokens]      0 or 1, padded with zeros to 8 bytes
 *
 * A shard must be a regular file (a FIFO, a device or a directory is refused before any
 * read, the open cannot block). Non-zero reserved bytes are refused (offset 48..63), and
 * n_samples / n_tokens above SHARD_MAX_COUNT; every section offset is computed with
 * overflow checks. Errors name the file and the byte offset of the bad field, e.g.
 *   "data/x.dfs: offset 64: offsets[0] is 5, expected 0".
 */
#ifndef DF_SHARD_H
#define DF_SHARD_H

#include <stddef.h>
#include <stdint.h>

#define SHARD_MAGIC "DFSHARD1"
#define SHARD_VERSION 1u
#define SHARD_HEADER_BYTES 64u
#define SHARD_MAX_COUNT (1ull << 40) /* n_samples and n_tokens: larger is refused */

typedef struct dataset dataset;

/* Opens and fully validates every shard (header, checksums, offsets, token range, mask
 * values). On error returns -EINVAL (bad content) or -errno (I/O) with err naming the file
 * and offset; *ds is NULL. The caller frees with dataset_close. */
int dataset_open(dataset **ds, char *const *paths, int n, char *err, size_t errlen);
void dataset_close(dataset *ds);

uint64_t dataset_n_samples(const dataset *ds);
uint64_t dataset_n_tokens(const dataset *ds);
uint32_t dataset_vocab_size(const dataset *ds);
uint32_t dataset_sample_len(const dataset *ds, uint64_t idx);
/* Borrowed pointers into the mapping, valid until dataset_close. -ERANGE for a bad idx. */
int dataset_sample(const dataset *ds, uint64_t idx, const uint32_t **tokens, const uint8_t **loss_mask, uint32_t *len);
/* Where dataset sample idx lives, for messages that name it: the shard's index among the
 * paths given to dataset_open (*shard) and the sample's index inside that file (*local).
 * 0, or -ERANGE for a bad idx. */
int dataset_locate(const dataset *ds, uint64_t idx, int *shard, uint64_t *local);

/* Writes a shard atomically (tmp, fsync, rename). offsets[n_samples + 1]. 0 or -errno. */
int shard_write(const char *path, uint32_t vocab_size, uint64_t n_samples, const uint64_t *offsets,
                const uint32_t *tokens, const uint8_t *loss_mask);

#endif
