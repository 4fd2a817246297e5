/* target_backend_internal.h: the backend seam of target_backend.h (docs/backends.md): the
 * ops table and the struct every backend starts with. target_backend.c has the cpu backend
 * and the dispatch; backend_ops_cuda is in target_backend_cuda.c (CUDA=1) or
 * target_backend_nocuda.c (every entry -ENOTSUP). Not for use outside
 * target_worker/target_backend*. */
#ifndef DF_TARGET_BACKEND_INTERNAL_H
#define DF_TARGET_BACKEND_INTERNAL_H

#include "target_worker/target_backend.h"

typedef struct backend_ops {
    const char *name;    /* "cpu" / "cuda" */
    uint32_t feat_dtype; /* BATCH_FEAT_F32 (cpu) or BATCH_FEAT_BF16 (cuda) */
    int (*open)(target_backend **out, const topo *t, int device, char *err, size_t errlen);
    int (*forward)(target_backend *b, const arena *A, uint64_t off, batch_header *h, char *err, size_t errlen);
    batch_header *(*meta)(target_backend *b, const arena *A, uint64_t off);
    void (*close)(target_backend *b);
} backend_ops;

struct target_backend {
    const backend_ops *ops;
    int hidden, n_layers_run, n_layers;
    int vocab; /* the target's vocab_size (0: unknown) */
};

extern const backend_ops backend_ops_cuda;

#endif
