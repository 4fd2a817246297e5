/* pp_copy_nocuda.c: the CUDA seam of pp_copy.h in a build without CUDA=1. */
#include "postproc_worker/pp_copy.h"

#include <errno.h>
#include <stdio.h>

int pp_cuda_open(pp_copier **out, int device, char *err, size_t errlen)
{
    *out = NULL;
    snprintf(err, errlen, "GPU rings (device %d): this build has no CUDA (rebuild with make CUDA=1)", device);
    return -ENOTSUP;
}

void pp_cuda_close(pp_copier *c) {}

int pp_cuda_copy(pp_copier *c, const arena *dst, uint64_t dst_off, const arena *src, uint64_t src_off, size_t n,
                 double std, uint64_t seed, uint64_t batch_id, char *err, size_t errlen)
{
    snprintf(err, errlen, "no CUDA in this build");
    return -ENOTSUP;
}
