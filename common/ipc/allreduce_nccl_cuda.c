/* allreduce_nccl_cuda.c: the NCCL all-reduce backend (CUDA=1 builds): float32 sum in place
 * on device buffers, one rank per process, one GPU per rank.
 *
 * Shaped by the failure model: a drafter rank that dies must turn into an error on the
 * others, not a GPU kernel spinning forever. So the communicator is NON-BLOCKING
 * (ncclConfig_t.blocking = 0): init and every collective return at once (maybe
 * ncclInProgress), and the host polls ncclCommGetAsyncError / cudaEventQuery against a
 * deadline. On a deadline or an asynchronous error the comm is ncclCommAbort'ed (which
 * also stops the spinning kernels) and marked broken: that call returns -ETIMEDOUT (or
 * -EIO with NCCL's text) and every later call returns the same at once, until allreduce_close.
 * The orchestrator then restarts the group with a new unique id.
 *
 * Environment, set with setenv before the communicator is created (NCCL reads it at init):
 *   NCCL_NVLS_ENABLE=0   always: NVLink multicast (NVLS) is left off on the lent machines.
 *   NCCL_ALGO=Ring, NCCL_PROTO=Simple   with ALLREDUCE_DETERMINISTIC: a ring all-reduce with the
 *       Simple protocol reduces each element in an order fixed by the ring, the channel
 *       split and the message size, all fixed for a fixed world size, machine and n: so
 *       the same step gives the same bits run after run (docs/allreduce.md has the limits).
 *
 * Streams: the comm owns a non-blocking stream. Each reduction first waits (event) for the
 * work the caller enqueued on its stream (allreduce_set_stream, default the legacy stream), then
 * runs ncclAllReduce on the comm stream; allreduce_sum and allreduce_wait_all wait on the host
 * for the comm stream (with the timeout) and make the caller's stream wait for it too.
 */
#include "ipc/allreduce_internal.h"
#include "util.h"

#include <cuda_runtime_api.h>
#include <errno.h>
/* nccl.h declares a few functions with () parameter lists */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

_Static_assert(sizeof(ncclUniqueId) == 128, "the orchestrator hands 128-byte unique ids");

typedef struct allreduce_nccl_state {
    ncclComm_t comm;     /* NULL after an abort */
    cudaStream_t stream; /* the comm's own stream */
    cudaStream_t user;   /* the caller's gradient stream (0: legacy default) */
    cudaEvent_t ev_ready, ev_done;
    int device;
    int broken; /* 0, or the error every later call returns */
    uint32_t next_bucket;
    float *stage; /* device staging for host buffers (small agreements), grown as needed */
    size_t stage_n;
    char broken_detail[200];
} allreduce_nccl_state;

static void set_env(unsigned flags)
{
    /* overwrite: these are correctness settings for this pipeline, not preferences */
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    if (flags & ALLREDUCE_DETERMINISTIC) {
        setenv("NCCL_ALGO", "Ring", 1);
        setenv("NCCL_PROTO", "Simple", 1);
    }
}

static void nap(unsigned *spins)
{
    if (++*spins < 64) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 20000}; /* 20 us */
    nanosleep(&ts, NULL);
}

static uint64_t deadline_of(int64_t timeout_ns)
{
    return timeout_ns < 0 ? UINT64_MAX : df_now_ns() + (uint64_t)timeout_ns;
}

/* Abort the comm and make the group broken with rc; returns rc with the detail recorded. */
static int fail_broken(allreduce_comm *c, allreduce_nccl_state *s, int rc, const char *what, const char *why, char *err,
                       size_t errlen)
{
    if (s->comm) {
        ncclCommAbort(s->comm);
        s->comm = NULL;
    }
    if (!s->broken) {
        s->broken = rc;
        snprintf(s->broken_detail, sizeof s->broken_detail, "rank %d: %s: %s", c->rank, what, why);
    }
    return allreduce_fail(err, errlen, rc, "rank %d: %s: %s (communicator aborted)", c->rank, what, why);
}

static int broken_rc(allreduce_comm *c, allreduce_nccl_state *s, char *err, size_t errlen)
{
    return allreduce_fail(err, errlen, s->broken, "group broken earlier: %s", s->broken_detail);
}

/* A non-blocking comm: after a call that returned ncclInProgress, wait until the comm
 * settles (ncclSuccess) or fails, or the deadline passes. */
static int settle(allreduce_comm *c, allreduce_nccl_state *s, ncclResult_t r, const char *what, uint64_t dl, char *err,
                  size_t errlen)
{
    unsigned spins = 0;
    while (r == ncclInProgress) {
        if (ncclCommGetAsyncError(s->comm, &r) != ncclSuccess)
            return fail_broken(c, s, -EIO, what, "ncclCommGetAsyncError failed", err, errlen);
        if (r == ncclInProgress) {
            if (df_now_ns() >= dl)
                return fail_broken(c, s, -ETIMEDOUT, what, "peers did not answer in time", err, errlen);
            nap(&spins);
        }
    }
    if (r != ncclSuccess) {
        char why[160];
        snprintf(why, sizeof why, "%s (%s)", ncclGetErrorString(r), ncclGetLastError(s->comm));
        return fail_broken(c, s, -EIO, what, why, err, errlen);
    }
    return 0;
}

/* Host-wait for ev_done on the comm stream, watching NCCL's async error and the deadline. */
static int wait_done(allreduce_comm *c, allreduce_nccl_state *s, const char *what, uint64_t dl, char *err,
                     size_t errlen)
{
    cudaError_t ce = cudaEventRecord(s->ev_done, s->stream);
    if (ce != cudaSuccess)
        return fail_broken(c, s, -EIO, "cudaEventRecord", cudaGetErrorString(ce), err, errlen);
    unsigned spins = 0;
    for (;;) {
        ce = cudaEventQuery(s->ev_done);
        if (ce == cudaSuccess)
            break;
        if (ce != cudaErrorNotReady)
            return fail_broken(c, s, -EIO, what, cudaGetErrorString(ce), err, errlen);
        ncclResult_t ar = ncclSuccess;
        if (ncclCommGetAsyncError(s->comm, &ar) != ncclSuccess || (ar != ncclSuccess && ar != ncclInProgress))
            return fail_broken(c, s, -EIO, what, ncclGetErrorString(ar), err, errlen);
        if (df_now_ns() >= dl)
            return fail_broken(c, s, -ETIMEDOUT, what, "the reduction did not finish in time: a peer is dead or hung",
                               err, errlen);
        nap(&spins);
    }
    /* the caller's later work on its stream sees the result without a host sync of its own */
    ce = cudaStreamWaitEvent(s->user, s->ev_done, 0);
    if (ce != cudaSuccess)
        return fail_broken(c, s, -EIO, "cudaStreamWaitEvent", cudaGetErrorString(ce), err, errlen);
    return 0;
}

/* Enqueue one reduction after the caller's stream reached this point. */
static int enqueue(allreduce_comm *c, allreduce_nccl_state *s, float *buf, size_t n, const char *what, uint64_t dl,
                   char *err, size_t errlen)
{
    cudaError_t ce = cudaEventRecord(s->ev_ready, s->user);
    if (ce == cudaSuccess)
        ce = cudaStreamWaitEvent(s->stream, s->ev_ready, 0);
    if (ce != cudaSuccess)
        return fail_broken(c, s, -EIO, what, cudaGetErrorString(ce), err, errlen);
    ncclResult_t r = ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, s->comm, s->stream);
    return settle(c, s, r, what, dl, err, errlen);
}

int allreduce_nccl_unique_id_impl(void *out128, char *err, size_t errlen)
{
    set_env(0);
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
        return allreduce_fail(err, errlen, -EIO, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    memcpy(out128, &id, sizeof id);
    return 0;
}

int allreduce_nccl_open_impl(allreduce_comm *c, const void *id128, int rank, int world, int device, unsigned flags,
                             int64_t init_timeout_ns, char *err, size_t errlen)
{
    allreduce_nccl_state *s = calloc(1, sizeof *s);
    if (!s)
        return allreduce_fail(err, errlen, -ENOMEM, "allreduce_open_nccl: out of memory");
    s->device = device;
    c->rank = rank;
    c->world = world;
    int rc = 0;
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess) {
        rc = allreduce_fail(err, errlen, -ENODEV, "allreduce_open_nccl: cudaSetDevice(%d): %s", device,
                            cudaGetErrorString(ce));
        goto fail;
    }
    if ((ce = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (ce = cudaEventCreateWithFlags(&s->ev_ready, cudaEventDisableTiming)) != cudaSuccess ||
        (ce = cudaEventCreateWithFlags(&s->ev_done, cudaEventDisableTiming)) != cudaSuccess) {
        rc =
            allreduce_fail(err, errlen, -EIO, "allreduce_open_nccl: stream/event creation: %s", cudaGetErrorString(ce));
        goto fail;
    }
    set_env(flags);
    ncclUniqueId id;
    memcpy(&id, id128, sizeof id);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* every wait is ours to bound: see the file comment */
    ncclResult_t r = ncclCommInitRankConfig(&s->comm, world, id, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        rc = allreduce_fail(err, errlen, -EIO,
                            "allreduce_open_nccl: ncclCommInitRankConfig(rank %d of %d, device %d): %s", rank, world,
                            device, ncclGetErrorString(r));
        s->comm = NULL; /* nothing to abort when init itself refused */
        goto fail;
    }
    c->impl = s;
    if ((rc = settle(c, s, r, "ncclCommInitRankConfig", deadline_of(init_timeout_ns), err, errlen)))
        goto fail;
    c->backend = ALLREDUCE_NCCL;
    c->ops = &allreduce_ops_nccl;
    c->timeout_ns = ALLREDUCE_DEFAULT_TIMEOUT_NS;
    return 0;
fail:
    if (s->comm)
        ncclCommAbort(s->comm);
    if (s->ev_done)
        cudaEventDestroy(s->ev_done);
    if (s->ev_ready)
        cudaEventDestroy(s->ev_ready);
    if (s->stream)
        cudaStreamDestroy(s->stream);
    free(s);
    allreduce_comm_init(c);
    return rc;
}

static int allreduce_nccl_set_stream(allreduce_comm *c, void *cuda_stream, char *err, size_t errlen)
{
    allreduce_nccl_state *s = c->impl;
    s->user = (cudaStream_t)cuda_stream;
    return 0;
}

/* 1 if p is ordinary host memory (not device, managed or registered): such a buffer is
 * staged through s->stage so small host-side agreements (a few flags per step) work on the
 * nccl backend too. */
static int is_host_pointer(const void *p)
{
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return 1;
    }
    return a.type == cudaMemoryTypeUnregistered || a.type == cudaMemoryTypeHost;
}

static int allreduce_nccl_sum(allreduce_comm *c, float *buf, size_t n, int64_t timeout_ns, char *err, size_t errlen)
{
    allreduce_nccl_state *s = c->impl;
    if (s->broken)
        return broken_rc(c, s, err, errlen);
    if (s->next_bucket)
        return allreduce_fail(err, errlen, -EBUSY, "allreduce_sum: buckets in flight: call allreduce_wait_all first");
    uint64_t dl = deadline_of(timeout_ns);
    float *dev = buf;
    int host = n > 0 && is_host_pointer(buf);
    if (host) {
        if (s->stage_n < n) {
            cudaFree(s->stage);
            s->stage = NULL, s->stage_n = 0;
            if (cudaMalloc((void **)&s->stage, n * sizeof(float)) != cudaSuccess) {
                cudaGetLastError();
                return allreduce_fail(err, errlen, -ENOMEM, "allreduce_sum: staging %zu floats on device %d", n,
                                      s->device);
            }
            s->stage_n = n;
        }
        if (cudaMemcpy(s->stage, buf, n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) {
            cudaGetLastError();
            return allreduce_fail(err, errlen, -EIO, "allreduce_sum: copy of %zu floats to device %d", n, s->device);
        }
        dev = s->stage;
    }
    int rc = enqueue(c, s, dev, n, "ncclAllReduce", dl, err, errlen);
    if (rc == 0)
        rc = wait_done(c, s, "ncclAllReduce", dl, err, errlen);
    if (rc == 0 && host && cudaMemcpy(buf, dev, n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) {
        cudaGetLastError();
        return allreduce_fail(err, errlen, -EIO, "allreduce_sum: copy of %zu floats from device %d", n, s->device);
    }
    return rc;
}

static int allreduce_nccl_bucket_ready(allreduce_comm *c, uint32_t bucket_index, float *ptr, size_t n, char *err,
                                       size_t errlen)
{
    allreduce_nccl_state *s = c->impl;
    if (s->broken)
        return broken_rc(c, s, err, errlen);
    if (bucket_index != s->next_bucket)
        return allreduce_fail(err, errlen, -EINVAL,
                              "allreduce_bucket_ready: bucket %u handed over, expected bucket %u "
                              "(indices run 0, 1, 2, ... within a step)",
                              bucket_index, s->next_bucket);
    char what[64];
    snprintf(what, sizeof what, "ncclAllReduce of bucket %u", bucket_index);
    int rc = enqueue(c, s, ptr, n, what, deadline_of(c->timeout_ns), err, errlen);
    if (rc)
        return rc;
    s->next_bucket++;
    return 0;
}

static int allreduce_nccl_wait_all(allreduce_comm *c, char *err, size_t errlen)
{
    allreduce_nccl_state *s = c->impl;
    uint32_t nb = s->next_bucket;
    s->next_bucket = 0;
    if (s->broken)
        return broken_rc(c, s, err, errlen);
    if (nb == 0)
        return 0;
    return wait_done(c, s, "allreduce_wait_all", deadline_of(c->timeout_ns), err, errlen);
}

static void allreduce_nccl_close(allreduce_comm *c)
{
    allreduce_nccl_state *s = c->impl;
    if (!s)
        return;
    if (s->comm) {
        /* Finalize flushes outstanding work; bounded like every other wait, else abort. */
        ncclResult_t r = ncclCommFinalize(s->comm);
        if (r == ncclSuccess || r == ncclInProgress)
            r = settle(c, s, r, "ncclCommFinalize", deadline_of(c->timeout_ns), NULL, 0) ? ncclInternalError
                                                                                         : ncclSuccess;
        if (s->comm) {
            if (r == ncclSuccess)
                ncclCommDestroy(s->comm);
            else
                ncclCommAbort(s->comm);
        }
        s->comm = NULL;
    }
    cudaFree(s->stage);
    cudaEventDestroy(s->ev_done);
    cudaEventDestroy(s->ev_ready);
    cudaStreamDestroy(s->stream);
    free(s);
    c->impl = NULL;
}

const allreduce_ops allreduce_ops_nccl = {
    .name = "nccl",
    .set_stream = allreduce_nccl_set_stream,
    .sum = allreduce_nccl_sum,
    .bucket_ready = allreduce_nccl_bucket_ready,
    .wait_all = allreduce_nccl_wait_all,
    .close = allreduce_nccl_close,
};
