/* fuzz_dflash_config.c: libFuzzer target for the drafter's config readers, which read
 * files a run takes from disk: dflash_config_read_release (a release's config.json, the
 * drafter.init_dir a run continues from) and dflash_config_from_json (the "config" object of
 * a checkpoint's trainer_state.json). Input: the file's text, given to both (the release
 * reader through a memfd, read by its /proc/self/fd path).
 *
 * Beyond "no crash, no sanitizer report", the oracle: every config either reader accepts
 * passes dflash_config_validate (what dflash_config.h promises the math code), and
 * dflash_config_to_json of it is read back by dflash_config_from_json to the same JSON; every
 * integer the input gives for a field is the field's value (a number outside int must be
 * refused, not wrapped: "hidden_size": 4294967424 once read as 128); a refusal comes with
 * a message.
 * Run with scripts/fuzz.sh (make fuzz).
 */
#include "fuzz/fuzz.h"
#include "dflash/dflash_config.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fuzz_accepted; /* inputs a reader accepted (fuzz/replay_main.c prints it) */

/* an accepted config: valid, and its JSON reads back to itself */
static void check(const dflash_config *c)
{
    char err[512] = "";
    if (dflash_config_validate(c, err, sizeof err) < 0)
        fprintf(stderr, "accepted but invalid: %s\n", err);
    ORACLE(dflash_config_validate(c, err, sizeof err) == 0);
    json_t *j1 = dflash_config_to_json(c);
    ORACLE(j1);
    dflash_config c2;
    int rc = dflash_config_from_json(&c2, j1, "normalised", err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "its own JSON is refused: %s\n", err);
    ORACLE(rc == 0);
    json_t *j2 = dflash_config_to_json(&c2);
    ORACLE(j2 && json_equal(j1, j2));
    json_decref(j1);
    json_decref(j2);
}

/* every integer of the input o that c was read from is c's value: nothing wrapped */
static void check_ints(const dflash_config *c, const json_t *o)
{
    static const struct {
        const char *key;
        size_t off;
    } f[] = {{"hidden_size", offsetof(dflash_config, hidden)},
             {"intermediate_size", offsetof(dflash_config, intermediate)},
             {"num_hidden_layers", offsetof(dflash_config, n_layers)},
             {"num_attention_heads", offsetof(dflash_config, n_heads)},
             {"num_key_value_heads", offsetof(dflash_config, n_kv_heads)},
             {"vocab_size", offsetof(dflash_config, vocab)},
             {"block_size", offsetof(dflash_config, block_size)},
             {"num_target_layers", offsetof(dflash_config, num_target_layers)},
             {"sliding_window", offsetof(dflash_config, sliding_window)},
             {"tie_word_embeddings", offsetof(dflash_config, tie_word_embeddings)},
             {"max_position_embeddings", offsetof(dflash_config, max_position_embeddings)},
             {"head_dim", offsetof(dflash_config, head_dim)}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        const json_t *v = json_object_get(o, f[i].key);
        int got;
        memcpy(&got, (const char *)c + f[i].off, sizeof got);
        if (json_is_integer(v) && json_integer_value(v) != got)
            fprintf(stderr, "%s: the input says %lld, the config holds %d\n", f[i].key,
                    (long long)json_integer_value(v), got);
        ORACLE(!json_is_integer(v) || json_integer_value(v) == got);
    }
    const json_t *dc = json_object_get(o, "dflash_config");
    const json_t *m = json_object_get(dc, "mask_token_id");
    ORACLE(!json_is_integer(m) || json_integer_value(m) == c->mask_token_id);
    const json_t *ids = json_object_get(dc, "target_layer_ids");
    ORACLE(json_array_size(ids) == (size_t)c->n_capture);
    for (int i = 0; i < c->n_capture; i++)
        ORACLE(json_integer_value(json_array_get(ids, (size_t)i)) == c->target_layer_ids[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512] = "";
    dflash_config c;
    int accepted = 0;
    /* the trainer_state.json "config" object */
    json_error_t je;
    json_t *o = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &je);
    if (o) {
        if (dflash_config_from_json(&c, o, "trainer_state.json", err, sizeof err) == 0) {
            check(&c);
            check_ints(&c, o);
            accepted = 1;
        } else {
            ORACLE(err[0] != 0);
        }
    }
    /* the release config.json, as a file */
    char path[64];
    int fd = fuzz_memfd(data, size, path);
    if (fd >= 0) {
        err[0] = 0;
        if (dflash_config_read_release(&c, path, err, sizeof err) == 0) {
            check(&c);
            json_t *r = json_loadb((const char *)data, size, 0, &je); /* the release reader's flags */
            ORACLE(r);
            check_ints(&c, r);
            json_decref(r);
            accepted = 1;
        } else {
            ORACLE(err[0] != 0);
        }
        close(fd);
    }
    json_decref(o);
    fuzz_accepted += accepted;
    return 0;
}
