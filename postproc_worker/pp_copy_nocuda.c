/* pp_copy_nocuda.c: pp_ops_cuda in a build without CUDA=1: every entry refuses with -ENOTSUP
 * and says so (docs/backends.md). */
#include "postproc_worker/pp_copy_internal.h"

#include <errno.h>
#include <stdio.h>

#include "util.h"

static int open_nocuda(pp_copier **out, int device, char *err, size_t errlen)
{
    *out = NULL;
    return df_err(err, errlen, -ENOTSUP, "GPU rings (device %d): this build has no CUDA (rebuild with make CUDA=1)",
                  device);
}

static void close_nocuda(pp_copier *c)
{
    (void)c;
}

static int copy_nocuda(pp_copier *c, const arena *dst, uint64_t dst_off, const arena *src, uint64_t src_off, size_t n,
                       double std, uint64_t seed, uint64_t batch_id, char *err, size_t errlen)
{
    (void)c, (void)dst, (void)dst_off, (void)src, (void)src_off, (void)n, (void)std, (void)seed, (void)batch_id;
    return df_err(err, errlen, -ENOTSUP, "feature copy: this build has no CUDA (rebuild with make CUDA=1)");
}

const pp_ops pp_ops_cuda = {.name = "cuda", .open = open_nocuda, .close = close_nocuda, .copy = copy_nocuda};
