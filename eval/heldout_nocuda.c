/* heldout_nocuda.c: the CUDA table of heldout.h in a build without CUDA=1: opening it says
 * so (docs/backends.md, "The stubs"). */
#include "eval/heldout.h"

#include <errno.h>
#include <stdio.h>

#include "util.h"

static int open_nocuda(heldout_set *h, char *err, size_t errlen)
{
    return df_err(err, errlen, -ENOTSUP, "CUDA device %d: this build has no CUDA (rebuild with make CUDA=1)",
                  h->o.device);
}

const heldout_ops heldout_ops_cuda = {.name = "cuda", .open = open_nocuda};
