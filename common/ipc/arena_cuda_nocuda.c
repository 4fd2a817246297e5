/* arena_cuda_nocuda.c: arena_ops_cuda in builds without CUDA (CUDA=0): every entry refuses
 * with -ENOTSUP and says so (docs/backends.md), so a CPU-only build still links and a
 * topology asking for GPU arenas fails with a clear message instead of a link error. */
#include "ipc/arena_internal.h"

#include <errno.h>

static int create_nocuda(arena *a, int device, uint64_t size, const char *name, char *err, size_t errlen)
{
    (void)a, (void)size, (void)name;
    return arena_fail(err, errlen, -ENOTSUP, "ARENA_CUDA on device %d: this build has no CUDA (make CUDA=1)", device);
}

static int import_nocuda(arena *a, int device, int fd, uint64_t size, char *err, size_t errlen)
{
    (void)a, (void)fd, (void)size;
    return arena_fail(err, errlen, -ENOTSUP, "ARENA_CUDA on device %d: this build has no CUDA (make CUDA=1)", device);
}

static int grant_access_nocuda(const arena *a, int peer_device, char *err, size_t errlen)
{
    (void)a;
    return arena_fail(err, errlen, -ENOTSUP, "ARENA_CUDA access for device %d: this build has no CUDA", peer_device);
}

static int copy_nocuda(const arena *a, uint64_t off, void *buf, uint64_t n, int to_host, char *err, size_t errlen)
{
    (void)a, (void)off, (void)buf, (void)n, (void)to_host;
    return arena_fail(err, errlen, -ENOTSUP, "CUDA arenas need a build with CUDA=1");
}

static void close_nocuda(arena *a)
{
    (void)a;
}

const arena_ops arena_ops_cuda = {
    .name = "cuda",
    .create = create_nocuda,
    .import = import_nocuda,
    .grant_access = grant_access_nocuda,
    .copy = copy_nocuda,
    .close = close_nocuda,
};
