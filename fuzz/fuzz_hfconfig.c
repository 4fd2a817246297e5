/* fuzz_hfconfig.c: libFuzzer target for hfconfig_parse, which reads a model's config.json.
 * Input: the file's bytes (not NUL-terminated, as hfconfig_parse takes them).
 *
 * Beyond "no crash, no sanitizer report", the oracle is what the loaders rely on for an
 * accepted config: positive sizes, heads that divide evenly into kv groups, a layer type
 * for every layer, eos ids within HFCONFIG_MAX_EOS; a refusal comes with a message.
 * Run with scripts/fuzz.sh (make fuzz).
 */
#include "fuzz/fuzz.h"
#include "io/hfconfig.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fuzz_accepted; /* inputs the parser accepted (fuzz/replay_main.c prints it) */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *json = malloc(size ? size : 1); /* exactly the bytes: ASan sees a read past them */
    if (!json)
        return 0;
    memcpy(json, data, size);
    hfconfig c;
    memset(&c, 0, sizeof c);
    char err[512] = "";
    int rc = hfconfig_parse(&c, json, size, "config.json", err, sizeof err);
    free(json);
    if (rc < 0) {
        ORACLE(err[0] != 0);
        hfconfig_free(&c);
        return 0;
    }
    fuzz_accepted++;
    ORACLE(c.hidden_size > 0 && c.intermediate_size > 0 && c.num_hidden_layers > 0 && c.vocab_size > 0);
    ORACLE(c.num_attention_heads > 0 && c.num_key_value_heads > 0 && c.head_dim > 0);
    ORACLE(c.num_attention_heads % c.num_key_value_heads == 0);
    ORACLE(c.n_eos >= 0 && c.n_eos <= HFCONFIG_MAX_EOS);
    ORACLE(c.layer_types != NULL);
    for (int l = 0; l < c.num_hidden_layers; l++)
        ORACLE(c.layer_types[l] == c.layer_types[l]); /* every entry readable (ASan) */
    hfconfig_free(&c);
    return 0;
}
