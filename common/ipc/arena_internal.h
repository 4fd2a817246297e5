/* arena_internal.h: the backend seam of arena.h (docs/backends.md): one arena_ops table per
 * arena kind. arena.c has the cpu backend and the public API; arena_ops_cuda is in
 * arena_cuda.c (CUDA=1 builds) or arena_cuda_nocuda.c (every entry -ENOTSUP). Not for use
 * outside common/ipc/arena*.c. */
#ifndef DF_ARENA_INTERNAL_H
#define DF_ARENA_INTERNAL_H

#include "ipc/arena.h"

/* Write "<strerror(rc)> (<detail>)" into err (when err is not NULL); returns rc (< 0). */
int arena_fail(char *err, size_t errlen, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Preconditions checked by arena.c: a is in the init state, size > 0, fd >= 0 for import,
 * device >= 0 for cuda; off + n within the arena for copy. create and import fill every
 * field of *a on success; on failure *a is left in the init state and (import) fd is NOT
 * closed: arena.c closes it. close unmaps and releases the mapping (not a->fd). */
typedef struct arena_ops {
    const char *name; /* "cpu" / "cuda" */
    int (*create)(arena *a, int device, uint64_t size, const char *name, char *err, size_t errlen);
    int (*import)(arena *a, int device, int fd, uint64_t size, char *err, size_t errlen);
    int (*grant_access)(const arena *a, int peer_device, char *err, size_t errlen);
    /* synchronous copy between the arena and host memory (to_host 1: arena -> buf) */
    int (*copy)(const arena *a, uint64_t off, void *buf, uint64_t n, int to_host, char *err, size_t errlen);
    void (*close)(arena *a);
} arena_ops;

extern const arena_ops arena_ops_cuda;

#endif
