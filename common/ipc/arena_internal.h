/* arena_internal.h: the seam between arena.c (CPU backend, public API) and the CUDA
 * backend: arena_cuda.c in CUDA=1 builds, arena_cuda_nocuda.c (-ENOTSUP) otherwise.
 * Not for use outside common/ipc/arena*.c. */
#ifndef DF_ARENA_INTERNAL_H
#define DF_ARENA_INTERNAL_H

#include "ipc/arena.h"

/* Record the detail text for a failure with code err (< 0) on this thread; returns err. */
int arena_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The CUDA backend. Preconditions checked by arena.c: a is in init state, size > 0,
 * fd >= 0 for import. On success they fill every field of *a; on failure *a is left in
 * the init state and (import) fd is NOT closed: arena.c closes it. */
int arena_cuda_create(arena *a, int device, uint64_t size);
int arena_cuda_import(arena *a, int device, int fd, uint64_t size);
int arena_cuda_grant_access(const arena *a, int peer_device);
/* Synchronous copy device <-> host (to_host 1: arena -> buf). Bounds checked by arena.c. */
int arena_cuda_copy(const arena *a, uint64_t off, void *buf, uint64_t n, int to_host);
/* Unmap and release the mapping and handle; does not close a->fd. */
void arena_cuda_close(arena *a);

#endif
