/* allreduce.c: the public all-reduce API (allreduce.h): argument checks, dispatch through the
 * comm's ops table (allreduce_internal.h) and the error text. The backends hold all the
 * mechanism; this file keeps the pipeline free of backend #ifdefs. */
#include "ipc/allreduce_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "util.h"

/* What an error code means for a group of ranks. */
static const char *meaning(int rc)
{
    switch (rc < 0 ? -rc : rc) {
    case ETIMEDOUT: return "a peer rank did not arrive in time: group broken, restart it";
    case ECANCELED: return "group aborted by the orchestrator";
    case ESTALE: return "segment re-formatted since this rank joined";
    case EBUSY: return "rank already joined / reductions still in flight";
    case EPROTO: return "not an all-reduce segment";
    case ENOTSUP: return "backend not built (CUDA=0)";
    default: return strerror(rc < 0 ? -rc : rc);
    }
}

int allreduce_fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (!err || !errlen)
        return rc;
    char detail[320];
    va_list ap;
    va_start(ap, fmt);
    df_verr(detail, sizeof detail, rc, NULL, fmt, ap);
    va_end(ap);
    return df_err(err, errlen, rc, "%s (%s)", meaning(rc), detail);
}

void allreduce_comm_init(allreduce_comm *c)
{
    c->backend = ALLREDUCE_NONE;
    c->ops = NULL;
    c->rank = -1;
    c->world = 0;
    c->timeout_ns = ALLREDUCE_DEFAULT_TIMEOUT_NS;
    c->impl = NULL;
}

int allreduce_open_shm(allreduce_comm *c, void *mem, uint64_t bytes, int rank, int world, char *err, size_t errlen)
{
    if (!c || !mem)
        return allreduce_fail(err, errlen, -EINVAL, "allreduce_open_shm: NULL comm or segment");
    if (c->backend != ALLREDUCE_NONE || c->impl)
        return allreduce_fail(err, errlen, -EINVAL, "allreduce_open_shm: comm is not in the init state");
    if (world < 1 || world > ALLREDUCE_MAX_WORLD || rank < 0 || rank >= world)
        return allreduce_fail(err, errlen, -EINVAL, "allreduce_open_shm: rank %d / world %d out of range (world 1..%d)",
                              rank, world, ALLREDUCE_MAX_WORLD);
    return allreduce_shm_open_impl(c, mem, bytes, rank, world, err, errlen);
}

int allreduce_nccl_get_unique_id(void *out128, char *err, size_t errlen)
{
    if (!out128)
        return allreduce_fail(err, errlen, -EINVAL, "allreduce_nccl_get_unique_id: NULL output");
    return allreduce_nccl_unique_id_impl(out128, err, errlen);
}

int allreduce_open_nccl_ex(allreduce_comm *c, const void *id128, int rank, int world, int device, unsigned flags,
                           int64_t init_timeout_ns, char *err, size_t errlen)
{
    if (!c || !id128)
        return allreduce_fail(err, errlen, -EINVAL, "allreduce_open_nccl: NULL comm or unique id");
    if (c->backend != ALLREDUCE_NONE || c->impl)
        return allreduce_fail(err, errlen, -EINVAL, "allreduce_open_nccl: comm is not in the init state");
    if (world < 1 || rank < 0 || rank >= world || device < 0)
        return allreduce_fail(err, errlen, -EINVAL, "allreduce_open_nccl: rank %d / world %d / device %d out of range",
                              rank, world, device);
    if (flags & ~ALLREDUCE_DETERMINISTIC)
        return allreduce_fail(err, errlen, -EINVAL, "allreduce_open_nccl: unknown flags 0x%x", flags);
    return allreduce_nccl_open_impl(c, id128, rank, world, device, flags, init_timeout_ns, err, errlen);
}

int allreduce_open_nccl(allreduce_comm *c, const void *id128, int rank, int world, int device, char *err, size_t errlen)
{
    return allreduce_open_nccl_ex(c, id128, rank, world, device, ALLREDUCE_DETERMINISTIC, ALLREDUCE_DEFAULT_TIMEOUT_NS,
                                  err, errlen);
}

int allreduce_set_stream(allreduce_comm *c, void *cuda_stream, char *err, size_t errlen)
{
    if (!c || !c->ops)
        return allreduce_fail(err, errlen, -EINVAL, "allreduce_set_stream: comm not open");
    return c->ops->set_stream(c, cuda_stream, err, errlen);
}

int allreduce_sum(allreduce_comm *c, float *buf, size_t n, int64_t timeout_ns, char *err, size_t errlen)
{
    if (!c || !c->ops)
        return allreduce_fail(err, errlen, -EINVAL, "allreduce_sum: comm not open");
    if (n > 0 && !buf)
        return allreduce_fail(err, errlen, -EINVAL, "allreduce_sum: NULL buffer with n=%zu", n);
    return c->ops->sum(c, buf, n, timeout_ns, err, errlen);
}

int allreduce_bucket_ready(allreduce_comm *c, uint32_t bucket_index, float *ptr, size_t n, char *err, size_t errlen)
{
    if (!c || !c->ops)
        return allreduce_fail(err, errlen, -EINVAL, "allreduce_bucket_ready: comm not open");
    if (n > 0 && !ptr)
        return allreduce_fail(err, errlen, -EINVAL, "allreduce_bucket_ready: bucket %u: NULL buffer with n=%zu",
                              bucket_index, n);
    return c->ops->bucket_ready(c, bucket_index, ptr, n, err, errlen);
}

int allreduce_wait_all(allreduce_comm *c, char *err, size_t errlen)
{
    if (!c || !c->ops)
        return allreduce_fail(err, errlen, -EINVAL, "allreduce_wait_all: comm not open");
    return c->ops->wait_all(c, err, errlen);
}

void allreduce_close(allreduce_comm *c)
{
    if (!c)
        return;
    if (c->ops)
        c->ops->close(c);
    allreduce_comm_init(c);
}
