/* allreduce_internal.h: the seam between allreduce.c (public API, dispatch, errors) and
 * the backends: allreduce_shm.c, and allreduce_nccl_cuda.c (CUDA=1) or
 * allreduce_nccl_nocuda.c (-ENOTSUP). Not for use outside common/ipc/allreduce*.c.
 * Preconditions checked by allreduce.c: c non-NULL, backend matches, n > 0 or a no-op. */
#ifndef DF_ALLREDUCE_INTERNAL_H
#define DF_ALLREDUCE_INTERNAL_H

#include "ipc/allreduce.h"

/* Record the detail text for a failure with code err (< 0) on this thread; returns err. */
int allreduce_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

int allreduce_shm_open_impl(allreduce_comm *c, void *mem, uint64_t bytes, int rank, int world);
int allreduce_shm_sum(allreduce_comm *c, float *buf, size_t n, int64_t timeout_ns);
int allreduce_shm_bucket_ready(allreduce_comm *c, uint32_t bucket_index, float *ptr, size_t n);
int allreduce_shm_wait_all(allreduce_comm *c);
void allreduce_shm_close(allreduce_comm *c);

int allreduce_nccl_unique_id_impl(void *out128);
int allreduce_nccl_open_impl(allreduce_comm *c, const void *id128, int rank, int world, int device,
                      unsigned flags, int64_t init_timeout_ns);
int allreduce_nccl_set_stream(allreduce_comm *c, void *cuda_stream);
int allreduce_nccl_sum(allreduce_comm *c, float *buf, size_t n, int64_t timeout_ns);
int allreduce_nccl_bucket_ready(allreduce_comm *c, uint32_t bucket_index, float *ptr, size_t n);
int allreduce_nccl_wait_all(allreduce_comm *c);
void allreduce_nccl_close(allreduce_comm *c);

#endif
