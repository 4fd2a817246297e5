/* target_backend_internal.h: the struct every tb_ backend starts with (target_backend.c,
 * target_backend_cuda.c). Not for use outside target_worker/target_backend*. */
#ifndef DF_TARGET_BACKEND_INTERNAL_H
#define DF_TARGET_BACKEND_INTERNAL_H

#include "target_worker/target_backend.h"

struct target_backend {
    int cuda;
    int hidden, n_layers_run, n_layers;
    int (*forward)(target_backend *b, const arena *A, uint64_t off, batch_header *h, char *err, size_t errlen);
    batch_header *(*meta)(target_backend *b, const arena *A, uint64_t off);
    void (*close)(target_backend *b);
};

#endif
