/* fuzz_topology.c: libFuzzer target for topology_parse, which reads the topology file a user
 * hands the orchestrator. Input: the file's text.
 *
 * Beyond "no crash, no sanitizer report", the oracle is topology.h's promise for every
 * accepted topology: topology_parse(json_dumps(topology_to_json(t))) is accepted and gives
 * the same normalised JSON back; a refusal always comes with a message.
 * Run with scripts/fuzz.sh (make fuzz).
 */
#include "fuzz/fuzz.h"
#include "io/topology.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fuzz_accepted; /* inputs the parser accepted (fuzz/replay_main.c prints it) */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1); /* exactly the text and its NUL, so ASan sees a read past it */
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = 0;
    topo t, t2;
    char err[512] = "";
    int rc = topology_parse(&t, text, "fuzz.json", err, sizeof err);
    free(text);
    if (rc < 0) {
        ORACLE(err[0] != 0);
        return 0;
    }
    fuzz_accepted++;
    json_t *j1 = topology_to_json(&t);
    ORACLE(j1);
    char *dump = json_dumps(j1, JSON_SORT_KEYS);
    ORACLE(dump);
    err[0] = 0;
    rc = topology_parse(&t2, dump, "fuzz-normalised.json", err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "the normalised topology is refused: %s\n%s\n", err, dump);
    ORACLE(rc == 0);
    json_t *j2 = topology_to_json(&t2);
    ORACLE(j2);
    if (!json_equal(j1, j2)) {
        char *d2 = json_dumps(j2, JSON_SORT_KEYS);
        fprintf(stderr, "round trip differs:\n%s\n%s\n", dump, d2 ? d2 : "?");
        free(d2);
    }
    ORACLE(json_equal(j1, j2));
    json_decref(j1);
    json_decref(j2);
    free(dump);
    topology_free(&t);
    topology_free(&t2);
    return 0;
}
