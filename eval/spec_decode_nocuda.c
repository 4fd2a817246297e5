/* spec_decode_nocuda.c: the CUDA table of spec_decode_backend.h in a build without CUDA=1:
 * opening it says so (docs/backends.md, "The stubs"). */
#include "eval/spec_decode_backend.h"

#include <errno.h>
#include <stdio.h>

#include "util.h"

static int open_nocuda(spec_backend *b, const char *target_dir, const dflash_config *c, const dflash_params *p,
                       int max_ctx, int n_seq, int device, char *err, size_t errlen)
{
    (void)b, (void)target_dir, (void)c, (void)p, (void)max_ctx, (void)n_seq;
    return df_err(err, errlen, -ENOTSUP, "backend cuda:%d: this build has no CUDA (rebuild with make CUDA=1)", device);
}

static void close_nocuda(void *impl)
{
    (void)impl;
}

const spec_backend_ops spec_backend_ops_cuda = {.name = "cuda", .open = open_nocuda, .close = close_nocuda};
