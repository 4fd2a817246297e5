/* allreduce_nccl_nocuda.c: the NCCL side of the all-reduce seam (allreduce_ops_nccl and the
 * open) in builds without CUDA (CUDA=0): every entry says -ENOTSUP (docs/backends.md), so
 * callers fail with a clear message instead of the pipeline growing #ifdefs. The CUDA=1
 * build compiles allreduce_nccl_cuda.c instead. */
#include "ipc/allreduce_internal.h"

#include <errno.h>

#define NOT_BUILT(what) allreduce_fail(err, errlen, -ENOTSUP, "%s: NCCL backend not built (make CUDA=1)", what)

int allreduce_nccl_unique_id_impl(void *out128, char *err, size_t errlen)
{
    (void)out128;
    return NOT_BUILT("allreduce_nccl_get_unique_id");
}

int allreduce_nccl_open_impl(allreduce_comm *c, const void *id128, int rank, int world, int device, unsigned flags,
                             int64_t init_timeout_ns, char *err, size_t errlen)
{
    return NOT_BUILT("allreduce_open_nccl");
}

static int allreduce_nccl_set_stream(allreduce_comm *c, void *cuda_stream, char *err, size_t errlen)
{
    return NOT_BUILT("allreduce_set_stream");
}

static int allreduce_nccl_sum(allreduce_comm *c, float *buf, size_t n, int64_t timeout_ns, char *err, size_t errlen)
{
    return NOT_BUILT("allreduce_sum");
}

static int allreduce_nccl_bucket_ready(allreduce_comm *c, uint32_t bucket_index, float *ptr, size_t n, char *err,
                                       size_t errlen)
{
    return NOT_BUILT("allreduce_bucket_ready");
}

static int allreduce_nccl_wait_all(allreduce_comm *c, char *err, size_t errlen)
{
    return NOT_BUILT("allreduce_wait_all");
}

static void allreduce_nccl_close(allreduce_comm *c)
{
    (void)c;
}

const allreduce_ops allreduce_ops_nccl = {
    .name = "nccl",
    .set_stream = allreduce_nccl_set_stream,
    .sum = allreduce_nccl_sum,
    .bucket_ready = allreduce_nccl_bucket_ready,
    .wait_all = allreduce_nccl_wait_all,
    .close = allreduce_nccl_close,
};
