/* arena.h: one large allocation shared between processes by file descriptor.
 *
 * Payloads (hidden states, packed batches) live in arenas; rings only carry
 * (arena, offset, bytes) descriptors. An arena is created once, its fd is kept by the
 * orchestrator for the whole run (an "fd store", like systemd's), and every worker
 * (re)start imports it from an fd it received over its control socket (fdpass.h). The
 * memory therefore outlives any single worker: a SIGKILLed creator loses nothing as long
 * as some process still holds an fd.
 *
 * Two backends behind one API (the pipeline never says #ifdef CUDA):
 *   ARENA_CPU   memfd_create + ftruncate + mmap(MAP_SHARED); size sealed (F_SEAL_SHRINK|GROW)
 *               so no process can shrink it under another's mapping (that would SIGBUS).
 *   ARENA_CUDA  CUDA VMM: cuMemCreate with a POSIX-fd shareable handle, exported to an fd,
 *               reserved + mapped (offset 0, the whole arena) + made accessible on `device`.
 *               Only in CUDA=1 builds (arena_cuda.c); otherwise -ENOTSUP (arena_cuda_nocuda.c).
 *   Each kind's backend is an arena_ops table (arena_internal.h, docs/backends.md).
 *               Not legacy cudaIpc*: a new process cannot open a dead exporter's legacy
 *               handle (error 400, measured), while a VMM fd stays importable.
 *
 * Ownership: the arena owns a->fd and the mapping; arena_close() releases both and
 * resets the struct to the init state. arena_import() takes ownership of the fd it is
 * given, on success AND on failure (it is closed on failure), so callers never leak or
 * double-close it. Errors are 0 / -errno with a message in the caller's `char *err, size_t
 * errlen` (may be NULL / 0): the errno's text and the detail, e.g. "Invalid argument (fd 7
 * has 4096 bytes, expected 8192)", or the CUDA driver call and its cuGetErrorString text.
 */
#ifndef DF_ARENA_H
#define DF_ARENA_H

#include <stddef.h>
#include <stdint.h>

typedef enum { ARENA_CPU = 0, ARENA_CUDA = 1 } arena_kind;

typedef struct arena {
    arena_kind kind;
    int fd;             /* owned; -1 when closed */
    void *base;         /* CPU pointer (ARENA_CPU) or CUdeviceptr cast to void* (ARENA_CUDA) */
    uint64_t size;      /* bytes mapped; ARENA_CUDA: the requested size rounded up to the
                         * allocation granularity (creator and importer round the same way) */
    int device;         /* CUDA device ordinal; -1 for ARENA_CPU */
    uint64_t cu_handle; /* CUmemGenericAllocationHandle (ARENA_CUDA), 0 otherwise */
} arena;

/* fd = -1, base = NULL, size = 0, device = -1. Safe to call on any memory. */
void arena_init(arena *a);

/* Create a new arena of `size` bytes (> 0) named `name` (memfd name, shows in
 * /proc/<pid>/fd; NULL = "df-arena"). CPU memory is zero-filled. `device` is ignored for
 * ARENA_CPU. `a` must be in the init state (base == NULL), else -EBUSY.
 * Returns 0 or -errno (-ENOTSUP: ARENA_CUDA in a build without CUDA, or a device
 * without VMM / POSIX-fd support). */
int arena_create(arena *a, arena_kind kind, int device, uint64_t size, const char *name, char *err, size_t errlen);

/* Map an arena created elsewhere from `fd`; `size` must be the creator's size (for
 * ARENA_CPU exactly the file size: a mismatch is -EINVAL with the sizes in err). Takes
 * ownership of fd on success and on failure. */
int arena_import(arena *a, arena_kind kind, int device, int fd, uint64_t size, char *err, size_t errlen);

/* A new close-on-exec fd for the same memory, for handing to another process (the
 * caller owns and closes it; sending it with fdpass_send and then closing is the usual
 * pattern). Returns the fd or -errno. */
int arena_dup_fd(const arena *a, char *err, size_t errlen);

/* ARENA_CUDA: also allow `peer_device` to access this mapping (for peer-to-peer copies
 * into another GPU's arena). ARENA_CPU: -EINVAL. 0 or -errno. */
int arena_grant_access(const arena *a, int peer_device, char *err, size_t errlen);

/* Copy n bytes between the arena at offset off and host memory (synchronous): for
 * ARENA_CPU a memcpy, for ARENA_CUDA a driver copy in the device's primary context. The
 * stages use them for a slot's small header/metadata part; bulk features stay on the
 * device. 0, -ERANGE (off + n beyond the arena) or -errno. */
int arena_read(const arena *a, uint64_t off, void *dst, uint64_t n, char *err, size_t errlen);
int arena_write(const arena *a, uint64_t off, const void *src, uint64_t n, char *err, size_t errlen);

/* Unmap, close the fd, reset to the init state. No-op on an init-state arena. */
void arena_close(arena *a);

#endif
