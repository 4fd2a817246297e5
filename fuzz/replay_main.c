/* replay_main.c: runs a fuzz target's LLVMFuzzerTestOneInput over files, without libFuzzer, so
 * that any C compiler with sanitizers can replay the regression inputs of fuzz/regress/ and
 * the repository's own inputs (tests/test_fuzz_replay.sh). A directory argument means every
 * regular file in it (sorted). A failed oracle or a sanitizer report aborts, as under
 * libFuzzer. Prints how many inputs the parser accepted and refused.
 *   fuzz_<target>_replay FILE|DIR ... */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
extern int fuzz_accepted; /* defined by the target: inputs its parser accepted */

static int n_inputs;

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    size_t cap = 1 << 16, len = 0, got;
    uint8_t *buf = malloc(cap);
    while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0)
        if ((len += got) == cap) {
            uint8_t *nb = realloc(buf, cap *= 2);
            if (!nb)
                free(buf);
            buf = nb;
        }
    int bad = ferror(f) || !buf;
    fclose(f);
    if (bad) {
        fprintf(stderr, "%s: cannot read\n", path);
        free(buf);
        return -1;
    }
    int before = fuzz_accepted;
    LLVMFuzzerTestOneInput(buf, len);
    free(buf);
    n_inputs++;
    printf("  %s: %s\n", path, fuzz_accepted > before ? "accepted" : "refused");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        printf("usage: %s FILE|DIR ...\nReplays inputs through this fuzz target (no libFuzzer).\n", argv[0]);
        return argc < 2 ? 2 : 0;
    }
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) < 0) {
            perror(argv[i]);
            return 2;
        }
        if (!S_ISDIR(st.st_mode)) {
            if (replay_file(argv[i]) < 0)
                return 2;
            continue;
        }
        struct dirent **names = NULL;
        int n = scandir(argv[i], &names, NULL, alphasort); /* by name: the same order on every machine */
        if (n < 0) {
            perror(argv[i]);
            return 2;
        }
        for (int k = 0; k < n; k++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], names[k]->d_name);
            if (names[k]->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode) && replay_file(path) < 0)
                return 2;
            free(names[k]);
        }
        free(names);
    }
    printf("%d inputs: %d accepted, %d refused\n", n_inputs, fuzz_accepted, n_inputs - fuzz_accepted);
    return 0;
}
