/* fuzz_dflash_config.c: libFuzzer target for the drafter's config readers, which read
 * files a run takes from disk: dflash_config_read_release (a release's config.json, the
 * drafter.init_dir a run continues from) and dflash_config_from_json (the "config" object of
 * a checkpoint's trainer_state.json). Input: the file's text, given to both (the release
 * reader through a memfd, read by its /proc/self/fd path).
 *
 * Beyond "no crash, no sanitizer report", the oracle: every config either reader accepts
 * passes dflash_config_validate (what dflash_config.h promises the math code), and
 * dflash_config_to_json of it is read back by dflash_config_from_json to the same JSON; a
 * refusal comes with a message.
 * Run with scripts/fuzz.sh (make fuzz).
 */
#include "fuzz/fuzz.h"
#include "dflash/dflash_config.h"

#include <jansson.h>
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
            accepted = 1;
        } else {
            ORACLE(err[0] != 0);
        }
        json_decref(o);
    }
    /* the release config.json, as a file */
    char path[64];
    int fd = fuzz_memfd(data, size, path);
    if (fd >= 0) {
        err[0] = 0;
        if (dflash_config_read_release(&c, path, err, sizeof err) == 0) {
            check(&c);
            accepted = 1;
        } else {
            ORACLE(err[0] != 0);
        }
        close(fd);
    }
    fuzz_accepted += accepted;
    return 0;
}
