/* fuzz_safetensors.c: libFuzzer target for safetensors_parse_header, the one function that reads
 * untrusted safetensors bytes. Input: 8 bytes little-endian data_len, then the header.
 *
 * Beyond "no crash, no sanitizer report", every accepted header is checked against the
 * promises of safetensors.h (the oracle): tensors sorted by name and unique, offsets and
 * sizes inside data_len, nbytes = numel * dtype size, no two non-empty spans overlapping.
 * Run with scripts/fuzz.sh (make fuzz).
 */
#include "fuzz/fuzz.h"
#include "io/safetensors.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fuzz_accepted; /* inputs the parser accepted (fuzz/replay_main.c prints it) */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 8)
        return 0;
    uint64_t data_len = 0;
    for (int i = 7; i >= 0; i--)
        data_len = (data_len << 8) | data[i];
    /* a copy of exactly the header bytes, so ASan sees any read past its end */
    size_t hlen = size - 8;
    char *hdr = malloc(hlen ? hlen : 1);
    if (!hdr)
        return 0;
    memcpy(hdr, data + 8, hlen);
    safetensors_tensor *ts = NULL;
    int n = -1;
    char err[512];
    int rc = safetensors_parse_header(hdr, hlen, data_len, &ts, &n, err, sizeof err);
    if (rc < 0) {
        ORACLE(ts == NULL && n == 0);
        ORACLE(memchr(err, '\0', sizeof err) != NULL && err[0] != '\0');
    } else {
        fuzz_accepted++;
        ORACLE(n >= 0 && (n == 0) == (ts == NULL));
        for (int i = 0; i < n; i++) {
            const safetensors_tensor *t = &ts[i];
            ORACLE(memchr(t->name, '\0', sizeof t->name) != NULL);
            ORACLE(i == 0 || strcmp(ts[i - 1].name, t->name) < 0);
            ORACLE(t->ndim >= 0 && t->ndim <= SAFETENSORS_MAX_DIMS && safetensors_dtype_size(t->dtype) > 0);
            uint64_t numel = 1;
            for (int k = 0; k < t->ndim; k++) {
                ORACLE(t->shape[k] >= 0);
                ORACLE(!__builtin_mul_overflow(numel, (uint64_t)t->shape[k], &numel));
            }
            ORACLE(numel * safetensors_dtype_size(t->dtype) == t->nbytes);
            ORACLE(t->data_offset <= data_len && t->nbytes <= data_len - t->data_offset);
            ORACLE(t->data == NULL);
            for (int j = 0; j < i; j++) { /* quadratic, but n is small for fuzz inputs */
                const safetensors_tensor *u = &ts[j];
                if (t->nbytes && u->nbytes)
                    ORACLE(t->data_offset + t->nbytes <= u->data_offset ||
                           u->data_offset + u->nbytes <= t->data_offset);
            }
        }
    }
    free(ts);
    free(hdr);
    return 0;
}
