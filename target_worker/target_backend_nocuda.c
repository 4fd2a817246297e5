/* target_backend_nocuda.c: backend_ops_cuda in a build without CUDA=1: every entry refuses
 * with -ENOTSUP and says so (docs/backends.md). */
#include "target_worker/target_backend_internal.h"

#include <errno.h>
#include <stdio.h>

#include "util.h"

static int open_nocuda(target_backend **out, const topo *t, int device, char *err, size_t errlen)
{
    (void)device;
    *out = NULL;
    return df_err(err, errlen, -ENOTSUP, "%s: backend \"cuda\": this build has no CUDA (rebuild with make CUDA=1)",
                  t->source_path);
}

static int forward_nocuda(target_backend *b, const arena *A, uint64_t off, batch_header *h, char *err, size_t errlen)
{
    (void)b, (void)A, (void)off, (void)h;
    return df_err(err, errlen, -ENOTSUP, "target forward: this build has no CUDA (rebuild with make CUDA=1)");
}

static batch_header *meta_nocuda(target_backend *b, const arena *A, uint64_t off)
{
    (void)b, (void)A, (void)off;
    return NULL;
}

static void close_nocuda(target_backend *b)
{
    (void)b;
}

const backend_ops backend_ops_cuda = {.name = "cuda",
                                      .feat_dtype = BATCH_FEAT_BF16,
                                      .open = open_nocuda,
                                      .forward = forward_nocuda,
                                      .meta = meta_nocuda,
                                      .close = close_nocuda};
