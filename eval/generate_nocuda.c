/* generate_nocuda.c: the CUDA side of generate.h in a build without CUDA=1. */
#include "eval/generate.h"

#include <errno.h>
#include <stdio.h>

int generate_open_cuda(generate_target *t, int device, const char *model_dir, int max_ctx, char *err, size_t errlen)
{
    (void)t, (void)device, (void)model_dir, (void)max_ctx;
    snprintf(err, errlen, "--backend cuda: this build has no CUDA (make CUDA=1)");
    return -ENOTSUP;
}
