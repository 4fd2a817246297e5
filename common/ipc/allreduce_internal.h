/* allreduce_internal.h: the backend seam of allreduce.h (docs/backends.md). Each backend
 * has its open (its own arguments: a segment or a unique id) and an allreduce_ops table the
 * open puts in the comm: allreduce_shm.c (allreduce_ops_shm), and allreduce_nccl_cuda.c
 * (CUDA=1) or allreduce_nccl_nocuda.c (-ENOTSUP) for allreduce_ops_nccl. allreduce.c has
 * the public API, its argument checks and the dispatch. Not for use outside
 * common/ipc/allreduce*.c. Preconditions checked by allreduce.c: c non-NULL and open,
 * n > 0 or a no-op. */
#ifndef DF_ALLREDUCE_INTERNAL_H
#define DF_ALLREDUCE_INTERNAL_H

#include "ipc/allreduce.h"

/* Write "<what rc means for a group> (<detail>)" into err (when err is not NULL); returns
 * rc (< 0). */
int allreduce_fail(char *err, size_t errlen, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

typedef struct allreduce_ops {
    const char *name; /* "shm" / "nccl" */
    int (*set_stream)(allreduce_comm *c, void *cuda_stream, char *err, size_t errlen);
    int (*sum)(allreduce_comm *c, float *buf, size_t n, int64_t timeout_ns, char *err, size_t errlen);
    int (*bucket_ready)(allreduce_comm *c, uint32_t bucket_index, float *ptr, size_t n, char *err, size_t errlen);
    int (*wait_all)(allreduce_comm *c, char *err, size_t errlen);
    void (*close)(allreduce_comm *c);
} allreduce_ops;

extern const allreduce_ops allreduce_ops_shm, allreduce_ops_nccl;

int allreduce_shm_open_impl(allreduce_comm *c, void *mem, uint64_t bytes, int rank, int world, char *err,
                            size_t errlen);
int allreduce_nccl_unique_id_impl(void *out128, char *err, size_t errlen);
int allreduce_nccl_open_impl(allreduce_comm *c, const void *id128, int rank, int world, int device, unsigned flags,
                             int64_t init_timeout_ns, char *err, size_t errlen);

#endif
