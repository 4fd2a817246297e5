/* fuzz_prompts.c: libFuzzer target for prompts_load (eval/eval_prompts.c), which reads the
 * prompts dflash_eval and target_generate decode: chat JSONL with the target's
 * byte_tokenizer.json, or a prepared token shard (.dfs). Input, by its first byte:
 *   'S' then a shard's bytes: written to in.dfs, with the two header checksums the harness
 *       writes (as fuzz_shard does), so the fuzzer reaches the sample and vocabulary checks;
 *   anything else: chat JSONL. If the input holds a NUL byte, what comes before it is the
 *       tokenizer directory's byte_tokenizer.json and what follows the JSONL; without one,
 *       the tiny target's tokenizer (models/tiny-target) with the whole input as JSONL.
 * Files live in a private temp directory made once per process and removed at exit
 * (fuzz_tmpdir).
 *
 * Beyond "no crash, no sanitizer report", the oracle for accepted prompts, which go
 * straight into the target's embedding: at most MAX_TOTAL of them, each 1..MAX_LEN tokens,
 * every token a row of the target's table (0 <= t < VOCAB: a negative id is a read before
 * it). For JSONL, each prompt ends with the tokenizer's assistant id (a cut prompt keeps
 * its end) and, if not cut, starts with its bos id. A refusal comes with a message.
 * Run with scripts/fuzz.sh (make fuzz).
 */
#include "fuzz/fuzz.h"
#include "eval/eval_prompts.h"
#include "io/shard.h"
#include "util.h"

#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { VOCAB = 264, MAX_TOTAL = 64, MAX_LEN = 48 };

/* models/tiny-target/byte_tokenizer.json: the default tokenizer of a JSONL input */
static const char default_tokenizer[] = "{\"type\": \"bytes\", \"vocab_size\": 264, \"bos\": 256, \"eos\": 257, "
                                        "\"user\": 258, \"assistant\": 259, \"pad\": 260, \"mask\": 261}\n";

int fuzz_accepted; /* inputs prompts_load accepted (fuzz/replay_main.c prints it) */

/* The tokenizer's id for key, or -1 when the tokenizer JSON does not give an int for it. */
static long long tok_id(const json_t *tj, const char *key)
{
    const json_t *v = json_object_get(tj, key);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *root = fuzz_tmpdir("fuzz_prompts");
    char path[4200], tokdir[4200];
    snprintf(tokdir, sizeof tokdir, "%s/tok", root);
    if (mkdir(tokdir, 0700) < 0 && errno != EEXIST)
        fuzz_die("cannot make", tokdir);
    int shard_mode = size > 0 && data[0] == 'S';
    json_t *tj = NULL; /* the tokenizer as jansson reads it (JSONL mode) */
    if (shard_mode) {
        size_t n = size - 1;
        uint8_t *buf = malloc(n ? n : 1);
        if (!buf)
            return 0;
        memcpy(buf, data + 1, n);
        if (n >= SHARD_HEADER_BYTES) { /* the checksums, as fuzz_shard writes them */
            uint64_t pay = df_fnv1a64(buf + SHARD_HEADER_BYTES, n - SHARD_HEADER_BYTES, 0);
            memcpy(buf + 32, &pay, 8);
            uint64_t hdr = df_fnv1a64(buf, 40, 0);
            memcpy(buf + 40, &hdr, 8);
        }
        snprintf(path, sizeof path, "%s/in.dfs", root);
        fuzz_write_file(path, buf, n);
        free(buf);
    } else {
        const uint8_t *nul = memchr(data, 0, size);
        const char *tok = nul ? (const char *)data : default_tokenizer;
        size_t tok_len = nul ? (size_t)(nul - data) : sizeof default_tokenizer - 1;
        const uint8_t *jsonl = nul ? nul + 1 : data;
        size_t jsonl_len = nul ? size - (size_t)(nul - data) - 1 : size;
        char tpath[4300];
        snprintf(tpath, sizeof tpath, "%s/byte_tokenizer.json", tokdir);
        fuzz_write_file(tpath, tok, tok_len);
        tj = json_loadb(tok, tok_len, 0, NULL);
        snprintf(path, sizeof path, "%s/in.jsonl", root);
        fuzz_write_file(path, jsonl, jsonl_len);
    }
    prompts_list l = {0};
    char err[512] = "";
    int rc = prompts_load(&l, path, tokdir, VOCAB, MAX_TOTAL, MAX_LEN, err, sizeof err);
    if (rc < 0) {
        ORACLE(err[0] != 0);
        prompts_free(&l);
        json_decref(tj);
        return 0;
    }
    fuzz_accepted++;
    ORACLE(l.n >= 0 && l.n <= MAX_TOTAL);
    for (int i = 0; i < l.n; i++) {
        const prompts_entry *e = &l.p[i];
        ORACLE(e->n >= 1 && e->n <= MAX_LEN);
        for (int k = 0; k < e->n; k++) {
            if (e->tokens[k] < 0 || e->tokens[k] >= VOCAB)
                fprintf(stderr, "prompt %d (%s): token %d is %d, outside [0, %d)\n", i, e->source, k, e->tokens[k],
                        VOCAB);
            ORACLE(e->tokens[k] >= 0 && e->tokens[k] < VOCAB);
        }
        if (!shard_mode) { /* JSONL was accepted, so the tokenizer was read: the same ids */
            ORACLE(tj != NULL);
            ORACLE(e->tokens[e->n - 1] == tok_id(tj, "assistant"));
            ORACLE(e->n == MAX_LEN || e->tokens[0] == tok_id(tj, "bos"));
        }
    }
    prompts_free(&l);
    json_decref(tj);
    return 0;
}
