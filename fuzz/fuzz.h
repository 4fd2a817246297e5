/* fuzz.h: what the fuzz targets of fuzz/ share: the entry point libFuzzer (or
 * fuzz/replay_main.c) calls, the count of accepted inputs the replay prints, the oracle
 * check, a file made of the input for readers that take a path, and a private directory of
 * files for readers that take one. */
#ifndef DF_FUZZ_H
#define DF_FUZZ_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create */
#endif
#include <errno.h>
#include <ftw.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Inputs the target's parser accepted; each target defines it (fuzz/replay_main.c prints it). */
extern int fuzz_accepted;

/* A promise of the parser's header broken: abort, as a sanitizer report would. */
#define ORACLE(cond)                                                           \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "oracle failed: %s (line %d)\n", #cond, __LINE__); \
            abort();                                                           \
        }                                                                      \
    } while (0)

/* data[size] as a memfd, and its /proc/self/fd path in path[64]: a regular file for readers
 * that take a path. The fd (close it), or -1. */
static inline int fuzz_memfd(const void *data, size_t size, char path[64])
{
    int fd = memfd_create("fuzz-input", MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return -1;
    }
    snprintf(path, 64, "/proc/self/fd/%d", fd);
    return fd;
}

/* ---- for harnesses whose parser reads files by path from a directory (manifest, prompts) */

/* The harness cannot run without its files: stop, loudly (not an oracle failure). */
static inline void fuzz_die(const char *what, const char *path)
{
    fprintf(stderr, "fuzz harness: %s %s: %s\n", what, path, strerror(errno));
    abort();
}

/* path = data[len], or fuzz_die. */
static inline void fuzz_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        fuzz_die("cannot create", path);
    int short_write = len && fwrite(data, 1, len, f) != len;
    if (fclose(f) != 0 || short_write) /* closed either way */
        fuzz_die("cannot write", path);
}

/* fuzz_tmpdir's directory, removed at exit ("" until made) */
static inline char *fuzz_root_(void)
{
    static char root[4096];
    return root;
}

static inline int fuzz_remove_entry_(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb, (void)type, (void)ftw;
    if (remove(path) < 0)
        perror(path); /* at exit: say so, remove the rest */
    return 0;
}

static inline void fuzz_remove_root_(void)
{
    if (nftw(fuzz_root_(), fuzz_remove_entry_, 8, FTW_DEPTH | FTW_PHYS) != 0)
        perror(fuzz_root_());
}

/* A private directory $TMPDIR/<name>.XXXXXX (or under /tmp), made on the first call and
 * removed at exit (a crash or a timeout leaves it behind); its path. */
static inline const char *fuzz_tmpdir(const char *name)
{
    char *root = fuzz_root_();
    if (root[0])
        return root;
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp)
        tmp = "/tmp";
    if ((size_t)snprintf(root, 4096, "%s/%s.XXXXXX", tmp, name) >= 4096 - 256) {
        errno = ENAMETOOLONG;
        fuzz_die("temp directory", tmp);
    }
    if (!mkdtemp(root))
        fuzz_die("cannot make", root);
    if (atexit(fuzz_remove_root_) != 0) {
        fuzz_remove_root_();
        errno = ENOMEM;
        fuzz_die("cannot register the removal of", root);
    }
    return root;
}

#endif
