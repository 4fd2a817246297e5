/* batch_view.h: a batch in a ring slot as the host sees it, whatever memory the slot is in.
 *
 * A slot of a CPU arena is read in place. A slot of a CUDA arena lives in device memory:
 * the host needs only its metadata (header, tokens, loss mask, anchors, keep: the bytes
 * before off_feat, a few KB to a few hundred KB), which batch_view_read copies into a
 * host buffer; the features stay on the device and are addressed as slot + off_feat.
 * batch_view_write is the producer side: it copies a host-built metadata part into the
 * slot. Both check everything batch_validate checks. */
#ifndef DF_BATCH_VIEW_H
#define DF_BATCH_VIEW_H

#include "io/batch.h"
#include "ipc/arena.h"

#include <stddef.h>

typedef struct batch_view {
    void *buf; /* host copy (CUDA arenas), grown as needed, owned */
    size_t cap;
} batch_view;

/* The header of the slot at arena offset off (slot_bytes long), validated for kind.
 * CPU arena: a pointer into the slot. CUDA arena: a pointer into v->buf holding the first
 * off_feat bytes. 0 or -errno (-EINVAL bad batch, message in err). */
int batch_view_read(batch_view *v, const arena *A, uint64_t off, uint64_t slot_bytes, uint32_t kind, batch_header **out,
                    char *err, size_t errlen);
/* Copy the metadata part [0, h->off_feat) of host-built h into the slot at off (a no-op
 * when h already is the slot, i.e. CPU arenas written in place). 0 or -errno. */
int batch_view_write(const arena *A, uint64_t off, const batch_header *h, char *err, size_t errlen);
void batch_view_free(batch_view *v);

#endif
