/* fuzz_tokvocab.c: libFuzzer target for tokvocab_parse (common/io/tokvocab.c), which reads
 * the tokenizer `dflash_tool shard show --tokenizer DIR` decodes with. Input, by its first
 * byte: 'B' then a byte_tokenizer.json; anything else a Hugging Face tokenizer.json.
 *
 * Beyond "no crash, no sanitizer report", the oracle for an accepted tokenizer: 1..2^24
 * ids, offsets that never go back and end at the blob's size, every present id's text
 * inside the blob; a byte vocabulary has ids 0..255 as plain 1- or 2-byte latin-1 texts;
 * and what tokvocab_print writes of every text holds no byte a terminal reads as control
 * (C0 but newline and tab, DEL; C1 controls come out as \u00NN, never raw). A refusal
 * comes with a message. Run with scripts/fuzz.sh (make fuzz).
 */
#include "fuzz/fuzz.h"
#include "io/tokvocab.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fuzz_accepted; /* inputs the parser accepted (fuzz/replay_main.c prints it) */

/* What tokvocab_print makes of t[n] holds no terminal control byte; a raw C1 control
 * (U+0080..U+009F, UTF-8 C2 80..C2 9F) is one too. */
static void check_print(const unsigned char *t, size_t n)
{
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (!f)
        return;
    tokvocab_print(f, t, n, 0);
    fclose(f);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)out[i];
        ORACLE(c >= 0x20 || c == '\n' || c == '\t');
        ORACLE(c != 0x7F);
        ORACLE(!(c == 0xC2 && i + 1 < len && (unsigned char)out[i + 1] >= 0x80 && (unsigned char)out[i + 1] < 0xA0));
    }
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int bytes = size > 0 && data[0] == 'B';
    size_t n = bytes ? size - 1 : size;
    char *json = malloc(n ? n : 1); /* exactly the bytes: ASan sees a read past them */
    if (!json)
        return 0;
    memcpy(json, data + bytes, n);
    tokvocab v;
    char err[512] = "";
    int rc = tokvocab_parse(&v, json, n, bytes ? TOKVOCAB_BYTES : TOKVOCAB_BPE,
                            bytes ? "byte_tokenizer.json" : "tokenizer.json", err, sizeof err);
    free(json);
    if (rc < 0) {
        ORACLE(err[0] != 0);
        return 0;
    }
    fuzz_accepted++;
    ORACLE(v.n >= 1 && v.n <= TOKVOCAB_MAX_ID && v.off[0] == 0);
    for (int i = 0; i < v.n; i++)
        ORACLE(v.off[i] <= v.off[i + 1]);
    for (int i = 0; i < v.n; i++) {
        const unsigned char *t;
        size_t len;
        int special = -1;
        if (!tokvocab_token(&v, (uint32_t)i, &t, &len, &special))
            continue;
        ORACLE(t >= v.bytes && t + len <= v.bytes + v.off[v.n] && (special == 0 || special == 1));
        if (bytes && i < 256)
            ORACLE(!special && len == (i < 0x80 ? 1u : 2u));
        check_print(t, len);
    }
    const unsigned char *t;
    size_t len;
    ORACLE(!tokvocab_token(&v, (uint32_t)v.n, &t, &len, NULL));
    tokvocab_free(&v);
    return 0;
}
