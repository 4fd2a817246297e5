/* generate_nocuda.c: the CUDA table of generate.h in a build without CUDA=1: opening it
 * says so (docs/backends.md, "The stubs"). */
#include "eval/generate.h"

#include <errno.h>
#include <stdio.h>

#include "util.h"

static int open_nocuda(generate_target *t, int device, const char *model_dir, int max_ctx, int n_seq, char *err,
                       size_t errlen)
{
    (void)t, (void)max_ctx, (void)n_seq;
    return df_err(err, errlen, -ENOTSUP, "--backend cuda:%d (%s): this build has no CUDA (rebuild with make CUDA=1)",
                  device, model_dir);
}

const generate_ops generate_ops_cuda = {.name = "cuda", .open = open_nocuda};
