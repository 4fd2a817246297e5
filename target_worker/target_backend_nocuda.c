/* target_backend_nocuda.c: the CUDA seam of target_backend.h in a build without CUDA=1. */
#include "target_worker/target_backend.h"

#include <errno.h>
#include <stdio.h>

int backend_open_cuda(target_backend **out, const topo *t, int device, char *err, size_t errlen)
{
    *out = NULL;
    snprintf(err, errlen, "%s: backend \"cuda\": this build has no CUDA (rebuild with make CUDA=1)", t->source_path);
    return -ENOTSUP;
}
