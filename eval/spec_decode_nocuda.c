/* spec_decode_nocuda.c: the CUDA side of spec_decode_backend in a build without CUDA. */
#include "eval/spec_decode_backend.h"

#include <errno.h>
#include <stdio.h>

int spec_backend_open_cuda(spec_backend *b, const char *target_dir, const dflash_config *c, const dflash_params *p,
                           int max_ctx, int device, char *err, size_t errlen)
{
    (void)b, (void)target_dir, (void)c, (void)p, (void)max_ctx, (void)device;
    snprintf(err, errlen, "the cuda backend needs a CUDA build (make CUDA=1); this one is CPU only");
    return -ENOTSUP;
}
