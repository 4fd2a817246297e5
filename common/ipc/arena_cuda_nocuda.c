/* arena_cuda_nocuda.c: the ARENA_CUDA side of the arena seam in builds without CUDA
 * (CUDA=0): every CUDA call reports -ENOTSUP, so a CPU-only build still links and a
 * topology asking for GPU arenas fails with a clear message instead of a link error. */
#include "ipc/arena_internal.h"

#include <errno.h>

int arena_cuda_create(arena *a, int device, uint64_t size)
{
    (void)a, (void)size;
    return arena_fail(-ENOTSUP, "ARENA_CUDA on device %d: this build has no CUDA (make CUDA=1)",
                      device);
}

int arena_cuda_import(arena *a, int device, int fd, uint64_t size)
{
    (void)a, (void)fd, (void)size;
    return arena_fail(-ENOTSUP, "ARENA_CUDA on device %d: this build has no CUDA (make CUDA=1)",
                      device);
}

int arena_cuda_grant_access(const arena *a, int peer_device)
{
    (void)a;
    return arena_fail(-ENOTSUP, "ARENA_CUDA access for device %d: this build has no CUDA",
                      peer_device);
}

void arena_cuda_close(arena *a)
{
    (void)a;
}

int arena_cuda_copy(const arena *a, uint64_t off, void *buf, uint64_t n, int to_host)
{
    return arena_fail(-ENOTSUP, "CUDA arenas need a build with CUDA=1");
}
