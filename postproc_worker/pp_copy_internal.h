/* pp_copy_internal.h: the backend seam of pp_copy.h (docs/backends.md): the ops table every
 * copier starts with. pp_copy.c has the cpu backend and the dispatch; pp_ops_cuda is in
 * pp_copy_cuda.cu (CUDA=1) or pp_copy_nocuda.c (every entry -ENOTSUP). Not for use outside
 * postproc_worker/pp_copy*. */
#ifndef DF_PP_COPY_INTERNAL_H
#define DF_PP_COPY_INTERNAL_H

#include "postproc_worker/pp_copy.h"

typedef struct pp_ops {
    const char *name; /* "cpu" / "cuda" */
    int (*open)(pp_copier **out, int device, char *err, size_t errlen);
    void (*close)(pp_copier *c);
    /* bf16 features between device arenas (pp_copy_features has done the host-to-host
     * case and checked the dtype) */
    int (*copy)(pp_copier *c, const arena *dst, uint64_t dst_off, const arena *src, uint64_t src_off, size_t n,
                double std, uint64_t seed, uint64_t batch_id, char *err, size_t errlen);
} pp_ops;

/* Every backend's copier starts with this. */
struct pp_copier {
    const pp_ops *ops;
};

extern const pp_ops pp_ops_cuda;

#endif
