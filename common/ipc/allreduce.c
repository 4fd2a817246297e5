/* allreduce.c: the public all-reduce API (allreduce.h): argument checks, dispatch to the
 * backend behind the seam (allreduce_internal.h) and error text. The backends hold all
 * the mechanism; this file keeps the pipeline free of backend #ifdefs. */
#include "ipc/allreduce_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local int last_err;
static _Thread_local char last_detail[256];
static _Thread_local char strerror_buf[320];

int allreduce_fail(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_detail, sizeof last_detail, fmt, ap);
    va_end(ap);
    last_err = err;
    return err;
}

const char *allreduce_strerror(int err)
{
    int e = err < 0 ? -err : err;
    const char *base;
    if (err == 0)
        return "success";
    switch (e) {
    case ETIMEDOUT: base = "a peer rank did not arrive in time: group broken, restart it"; break;
    case ECANCELED: base = "group aborted by the orchestrator"; break;
    case ESTALE: base = "segment re-formatted since this rank joined"; break;
    case EBUSY: base = "rank already joined / reductions still in flight"; break;
    case EPROTO: base = "not an all-reduce segment"; break;
    case ENOTSUP: base = "backend not built (CUDA=0)"; break;
    default: base = strerror(e); break;
    }
    if (last_err != 0 && (last_err == err || last_err == -err) && last_detail[0])
        snprintf(strerror_buf, sizeof strerror_buf, "%s (%s)", base, last_detail);
    else
        snprintf(strerror_buf, sizeof strerror_buf, "%s", base);
    return strerror_buf;
}

void allreduce_comm_init(allreduce_comm *c)
{
    c->backend = ALLREDUCE_NONE;
    c->rank = -1;
    c->world = 0;
    c->timeout_ns = ALLREDUCE_DEFAULT_TIMEOUT_NS;
    c->impl = NULL;
}

int allreduce_open_shm(allreduce_comm *c, void *mem, uint64_t bytes, int rank, int world)
{
    if (!c || !mem)
        return allreduce_fail(-EINVAL, "allreduce_open_shm: NULL comm or segment");
    if (c->backend != ALLREDUCE_NONE || c->impl)
        return allreduce_fail(-EINVAL, "allreduce_open_shm: comm is not in the init state");
    if (world < 1 || world > ALLREDUCE_MAX_WORLD || rank < 0 || rank >= world)
        return allreduce_fail(-EINVAL, "allreduce_open_shm: rank %d / world %d out of range (world 1..%d)",
                       rank, world, ALLREDUCE_MAX_WORLD);
    return allreduce_shm_open_impl(c, mem, bytes, rank, world);
}

int allreduce_nccl_get_unique_id(void *out128)
{
    if (!out128)
        return allreduce_fail(-EINVAL, "allreduce_nccl_get_unique_id: NULL output");
    return allreduce_nccl_unique_id_impl(out128);
}

int allreduce_open_nccl_ex(allreduce_comm *c, const void *id128, int rank, int world, int device,
                    unsigned flags, int64_t init_timeout_ns)
{
    if (!c || !id128)
        return allreduce_fail(-EINVAL, "allreduce_open_nccl: NULL comm or unique id");
    if (c->backend != ALLREDUCE_NONE || c->impl)
        return allreduce_fail(-EINVAL, "allreduce_open_nccl: comm is not in the init state");
    if (world < 1 || rank < 0 || rank >= world || device < 0)
        return allreduce_fail(-EINVAL, "allreduce_open_nccl: rank %d / world %d / device %d out of range",
                       rank, world, device);
    if (flags & ~ALLREDUCE_DETERMINISTIC)
        return allreduce_fail(-EINVAL, "allreduce_open_nccl: unknown flags 0x%x", flags);
    return allreduce_nccl_open_impl(c, id128, rank, world, device, flags, init_timeout_ns);
}

int allreduce_open_nccl(allreduce_comm *c, const void *id128, int rank, int world, int device)
{
    return allreduce_open_nccl_ex(c, id128, rank, world, device, ALLREDUCE_DETERMINISTIC,
                           ALLREDUCE_DEFAULT_TIMEOUT_NS);
}

int allreduce_set_stream(allreduce_comm *c, void *cuda_stream)
{
    if (!c || c->backend == ALLREDUCE_NONE)
        return allreduce_fail(-EINVAL, "allreduce_set_stream: comm not open");
    if (c->backend == ALLREDUCE_NCCL)
        return allreduce_nccl_set_stream(c, cuda_stream);
    return 0;
}

int allreduce_sum(allreduce_comm *c, float *buf, size_t n, int64_t timeout_ns)
{
    if (!c || c->backend == ALLREDUCE_NONE)
        return allreduce_fail(-EINVAL, "allreduce_sum: comm not open");
    if (n > 0 && !buf)
        return allreduce_fail(-EINVAL, "allreduce_sum: NULL buffer with n=%zu", n);
    return c->backend == ALLREDUCE_SHM ? allreduce_shm_sum(c, buf, n, timeout_ns)
                                : allreduce_nccl_sum(c, buf, n, timeout_ns);
}

int allreduce_bucket_ready(allreduce_comm *c, uint32_t bucket_index, float *ptr, size_t n)
{
    if (!c || c->backend == ALLREDUCE_NONE)
        return allreduce_fail(-EINVAL, "allreduce_bucket_ready: comm not open");
    if (n > 0 && !ptr)
        return allreduce_fail(-EINVAL, "allreduce_bucket_ready: bucket %u: NULL buffer with n=%zu",
                       bucket_index, n);
    return c->backend == ALLREDUCE_SHM ? allreduce_shm_bucket_ready(c, bucket_index, ptr, n)
                                : allreduce_nccl_bucket_ready(c, bucket_index, ptr, n);
}

int allreduce_wait_all(allreduce_comm *c)
{
    if (!c || c->backend == ALLREDUCE_NONE)
        return allreduce_fail(-EINVAL, "allreduce_wait_all: comm not open");
    return c->backend == ALLREDUCE_SHM ? allreduce_shm_wait_all(c) : allreduce_nccl_wait_all(c);
}

void allreduce_close(allreduce_comm *c)
{
    if (!c)
        return;
    if (c->backend == ALLREDUCE_SHM)
        allreduce_shm_close(c);
    else if (c->backend == ALLREDUCE_NCCL)
        allreduce_nccl_close(c);
    allreduce_comm_init(c);
}
