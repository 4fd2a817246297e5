/* fuzz.h: what the fuzz targets of fuzz/ share: the entry point libFuzzer (or
 * fuzz/replay_main.c) calls, the count of accepted inputs the replay prints, the oracle
 * check, and a file made of the input for readers that take a path. */
#ifndef DF_FUZZ_H
#define DF_FUZZ_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create */
#endif
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
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

#endif
