/* allreduce_nccl_nocuda.c: the NCCL side of the all-reduce seam in builds without CUDA
 * (CUDA=0): every entry says -ENOTSUP, so callers fail with a clear message instead of
 * the pipeline growing #ifdefs. The CUDA=1 build compiles allreduce_nccl_cuda.c instead. */
#include "ipc/allreduce_internal.h"

#include <errno.h>

#define NOT_BUILT(what) allreduce_fail(-ENOTSUP, "%s: NCCL backend not built (make CUDA=1)", what)

int allreduce_nccl_unique_id_impl(void *out128)
{
    (void)out128;
    return NOT_BUILT("allreduce_nccl_get_unique_id");
}

int allreduce_nccl_open_impl(allreduce_comm *c, const void *id128, int rank, int world, int device,
                      unsigned flags, int64_t init_timeout_ns)
{
    return NOT_BUILT("allreduce_open_nccl");
}

int allreduce_nccl_set_stream(allreduce_comm *c, void *cuda_stream)
{
    return NOT_BUILT("allreduce_set_stream");
}

int allreduce_nccl_sum(allreduce_comm *c, float *buf, size_t n, int64_t timeout_ns)
{
    return NOT_BUILT("allreduce_sum");
}

int allreduce_nccl_bucket_ready(allreduce_comm *c, uint32_t bucket_index, float *ptr, size_t n)
{
    return NOT_BUILT("allreduce_bucket_ready");
}

int allreduce_nccl_wait_all(allreduce_comm *c)
{
    return NOT_BUILT("allreduce_wait_all");
}

void allreduce_nccl_close(allreduce_comm *c)
{
    (void)c;
}
