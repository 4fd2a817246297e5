/* allreduce.h: gradient all-reduce (sum, float32, in place) across drafter ranks that are
 * separate OS processes. One interface, two backends behind one seam (allreduce.c):
 *
 *   shm  (allreduce_shm.c)   CPU buffers, one shared-memory segment (a memfd the
 *                            orchestrator creates, formats and hands to every rank).
 *                            Deterministic by construction: every element is summed
 *                            rank 0 + rank 1 + ... + rank R-1, in that order, in float32,
 *                            by exactly one rank, and copied to all; so the result is
 *                            bit-identical on every rank and independent of timing.
 *   nccl (allreduce_nccl_cuda.c, CUDA=1 builds; allreduce_nccl_nocuda.c says -ENOTSUP)
 *                            device buffers, ncclAllReduce on a non-blocking communicator
 *                            so a dead peer becomes -ETIMEDOUT (ncclCommAbort), not a hang.
 *
 * Why shaped so: a drafter rank that dies must not hang the others (the orchestrator
 * restarts the whole group from its last checkpoint), so every wait has a timeout and a
 * broken group stays broken until the orchestrator re-formats the segment (shm) or hands
 * out a new unique id (nccl). The bucketed calls let the drafter reduce gradients layer by
 * layer while the backward pass is still producing the next ones. docs/allreduce.md has the
 * algorithm, the determinism argument and the failure behaviour.
 *
 * All functions return 0 or -errno with a message in the caller's `char *err, size_t errlen`
 * (may be NULL / 0): what the code means for the group and the detail, e.g. "a peer rank
 * did not arrive in time: group broken, restart it (rank 1: waited 2.000 s at a barrier, 1
 * of 2 ranks arrived: a peer is dead or hung)". They never exit. Each backend is an
 * allreduce_ops table its open puts in the comm (allreduce_internal.h, docs/backends.md).
 * An allreduce_comm is used by one thread at a time (the shm bucket thread is internal).
 */
#ifndef DF_ALLREDUCE_H
#define DF_ALLREDUCE_H

#include <stddef.h>
#include <stdint.h>

#define ALLREDUCE_MAX_WORLD 64
/* Timeout (per wait for the slowest peer) used by the bucketed calls until the caller
 * sets allreduce_comm.timeout_ns. */
#define ALLREDUCE_DEFAULT_TIMEOUT_NS (60ll * 1000000000ll)

typedef enum { ALLREDUCE_NONE = 0, ALLREDUCE_SHM = 1, ALLREDUCE_NCCL = 2 } allreduce_backend;

/* allreduce_open_nccl_ex flags. */
#define ALLREDUCE_DETERMINISTIC 1u /* NCCL_ALGO=Ring, NCCL_PROTO=Simple: a fixed reduction order */

struct allreduce_ops; /* allreduce_internal.h */

typedef struct allreduce_comm {
    allreduce_backend backend;       /* ALLREDUCE_NONE after allreduce_comm_init / allreduce_close */
    const struct allreduce_ops *ops; /* the backend's table, set by the open; NULL when not open */
    int rank, world;
    int64_t timeout_ns; /* bucketed calls: max wait for a peer (< 0: forever); set by open */
    void *impl;         /* backend state (heap), owned by the comm, freed by allreduce_close */
} allreduce_comm;

void allreduce_comm_init(allreduce_comm *c);

/* --- shm backend --------------------------------------------------------------------- */

/* Bytes of a segment for `world` ranks reducing up to max_floats floats per round (larger
 * buffers are reduced in rounds of max_floats). 0 if the arguments are out of range. */
uint64_t allreduce_shm_bytes(int world, uint64_t max_floats);

/* Orchestrator: lay out a segment (bytes >= allreduce_shm_bytes). Re-formatting a segment that
 * was formatted before bumps its epoch, so a stale handle from the old group gets -ESTALE.
 * Call only when no rank of the group is alive (after reaping them all): this is how a
 * group restart starts clean. 0 or -EINVAL. */
int allreduce_shm_format(void *mem, uint64_t bytes, int world, uint64_t max_floats, char *err, size_t errlen);

/* Orchestrator: break the group now (e.g. it reaped a dead rank): every rank waiting in or
 * entering a reduction returns -ECANCELED at once instead of waiting for its timeout. */
int allreduce_shm_abort(void *mem, uint64_t bytes, char *err, size_t errlen);

/* Rank `rank` of `world` joins a formatted segment (mem stays mapped by the caller for the
 * life of the comm). -EPROTO: not a formatted segment; -EINVAL: world differs from the
 * format or rank out of range; -EBUSY: this rank already joined since the last format
 * (a restarted rank needs the orchestrator to re-format first). */
int allreduce_open_shm(allreduce_comm *c, void *mem, uint64_t bytes, int rank, int world, char *err, size_t errlen);

/* --- nccl backend (CUDA=1 builds; -ENOTSUP otherwise) ---------------------------------- */

/* Rank 0 (or a helper) makes the 128-byte id that the orchestrator hands to every rank
 * over the control channel. Sets the NCCL env (below) first: the orchestrator itself never
 * calls this (it never loads CUDA). */
int allreduce_nccl_get_unique_id(void *out128, char *err, size_t errlen);

/* Join the communicator on CUDA device `device`. Before the first NCCL call of the process
 * it sets NCCL_NVLS_ENABLE=0 (NVLink multicast is off on the lent machines) and, with
 * ALLREDUCE_DETERMINISTIC, NCCL_ALGO=Ring and NCCL_PROTO=Simple. init_timeout_ns bounds the wait
 * for all ranks to join (< 0: forever); on timeout the comm is aborted: -ETIMEDOUT.
 * allreduce_open_nccl = allreduce_open_nccl_ex(..., ALLREDUCE_DETERMINISTIC, ALLREDUCE_DEFAULT_TIMEOUT_NS). */
int allreduce_open_nccl(allreduce_comm *c, const void *unique_id_128_bytes, int rank, int world, int device, char *err,
                        size_t errlen);
int allreduce_open_nccl_ex(allreduce_comm *c, const void *unique_id_128_bytes, int rank, int world, int device,
                           unsigned flags, int64_t init_timeout_ns, char *err, size_t errlen);

/* NCCL: the cudaStream_t on which the caller produces gradients. Reductions wait for the
 * work enqueued on it so far (event) and run on the comm's own stream. NULL: the legacy
 * default stream. No effect on the shm backend. */
int allreduce_set_stream(allreduce_comm *c, void *cuda_stream, char *err, size_t errlen);

/* --- reductions ---------------------------------------------------------------------- */

/* buf[0..n) <- sum over ranks of buf[0..n), in place, every rank the same n. shm: a host
 * buffer; nccl: a device buffer, or a (small) host buffer staged through the device. Returns when buf holds the result (nccl: host waits for
 * the comm stream). timeout_ns bounds each wait for the slowest peer (< 0: forever).
 * -ETIMEDOUT: a peer did not arrive (dead or hung); the group is broken from then on, on
 * every rank (they all return -ETIMEDOUT): exit and let the orchestrator restart the
 * group. -EINVAL: ranks disagree on n or are out of step (every rank sees it).
 * -ECANCELED: allreduce_shm_abort. -ESTALE: the segment was re-formatted under this rank. */
int allreduce_sum(allreduce_comm *c, float *buf, size_t n, int64_t timeout_ns, char *err, size_t errlen);

/* Bucketed reduction for overlap with the backward pass. A step is
 *     allreduce_bucket_ready(c, 0, p0, n0); allreduce_bucket_ready(c, 1, p1, n1); ... allreduce_wait_all(c);
 * with bucket indices 0, 1, 2, ... in order (the same buckets on every rank), each bucket
 * handed over as soon as its gradients are final; the caller must not touch a bucket's
 * memory until allreduce_wait_all returns. shm: a per-comm background thread reduces the buckets
 * in order while the caller goes on (each bucket gives exactly the bits a single
 * allreduce_sum over the same data gives). nccl: one ncclAllReduce per bucket on the
 * comm stream, after the caller's stream (allreduce_set_stream) reached the call. Waits use
 * c->timeout_ns. allreduce_wait_all returns the first error of the step and starts a new step.
 * -EINVAL: bucket index out of order. */
int allreduce_bucket_ready(allreduce_comm *c, uint32_t bucket_index, float *ptr, size_t n, char *err, size_t errlen);
int allreduce_wait_all(allreduce_comm *c, char *err, size_t errlen);

/* Leave the group and free the comm's state (joins the bucket thread, which may take one
 * timeout if a bucket is still waiting on a dead peer; nccl: destroys the
 * communicator, or aborts it if the group is broken). Resets c to the init state. Does not
 * unmap the segment. Safe on an init-state comm. */
void allreduce_close(allreduce_comm *c);

#endif
