/* fuzz_shard.c: libFuzzer target for the token shard reader (dataset_open over one .dfs
 * file), which reads the data shards a run trains on. Input: the file's bytes. The harness
 * writes the two header checksums the fuzzed bytes would need (payload FNV at offset 32,
 * header FNV at 40), so the fuzzer gets past them to the offsets, tokens and mask checks;
 * the file goes through a memfd, read by its /proc/self/fd path like any shard.
 *
 * Beyond "no crash, no sanitizer report", the oracle is shard.h's promise for an accepted
 * shard: the samples' lengths add up to n_tokens, every token is < vocab_size, every mask
 * byte is 0 or 1, and a sample index past the end is -ERANGE. A refusal comes with a
 * message that names the file.
 * Run with scripts/fuzz.sh (make fuzz).
 */
#include "fuzz/fuzz.h"
#include "io/shard.h"
#include "util.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fuzz_accepted; /* inputs the parser accepted (fuzz/replay_main.c prints it) */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    if (size >= SHARD_HEADER_BYTES) {
        uint64_t pay = df_fnv1a64(buf + SHARD_HEADER_BYTES, size - SHARD_HEADER_BYTES, 0);
        memcpy(buf + 32, &pay, 8);
        uint64_t hdr = df_fnv1a64(buf, 40, 0);
        memcpy(buf + 40, &hdr, 8);
    }
    char path[64];
    int fd = fuzz_memfd(buf, size, path);
    free(buf);
    if (fd < 0)
        return 0;
    char *paths[1] = {path};
    dataset *ds = NULL;
    char err[512] = "";
    int rc = dataset_open(&ds, paths, 1, err, sizeof err);
    if (rc < 0) {
        ORACLE(ds == NULL && strstr(err, path) != NULL);
        close(fd);
        return 0;
    }
    fuzz_accepted++;
    uint64_t n = dataset_n_samples(ds), total = 0;
    uint32_t vocab = dataset_vocab_size(ds);
    for (uint64_t i = 0; i < n; i++) {
        const uint32_t *tok;
        const uint8_t *mask;
        uint32_t len;
        ORACLE(dataset_sample(ds, i, &tok, &mask, &len) == 0 && len == dataset_sample_len(ds, i));
        for (uint32_t k = 0; k < len; k++)
            ORACLE(tok[k] < vocab && mask[k] <= 1);
        total += len;
    }
    ORACLE(total == dataset_n_tokens(ds));
    const uint32_t *tok;
    const uint8_t *mask;
    uint32_t len;
    ORACLE(dataset_sample(ds, n, &tok, &mask, &len) == -ERANGE && dataset_sample_len(ds, n) == 0);
    dataset_close(ds);
    close(fd);
    return 0;
}
