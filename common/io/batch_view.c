/* batch_view.c: host views of batches in CPU or CUDA ring slots (batch_view.h). */
#include "io/batch_view.h"

#include "util.h"

#include <stdio.h>

static int grow(batch_view *v, size_t n)
{
    if (v->cap >= n)
        return 0;
    void *p = realloc(v->buf, n);
    if (!p)
        return -ENOMEM;
    v->buf = p;
    v->cap = n;
    return 0;
}

int batch_view_read(batch_view *v, const arena *A, uint64_t off, uint64_t slot_bytes, uint32_t kind, batch_header **out,
                    char *err, size_t errlen)
{
    *out = NULL;
    if (off > A->size || slot_bytes > A->size - off || slot_bytes < sizeof(batch_header))
        return df_err(err, errlen, -EINVAL, "slot [%llu, +%llu) is outside the arena of %llu bytes",
                      (unsigned long long)off, (unsigned long long)slot_bytes, (unsigned long long)A->size);
    if (A->kind == ARENA_CPU) {
        batch_header *h = (batch_header *)((char *)A->base + off);
        int rc = batch_validate(h, slot_bytes, kind, err, errlen);
        if (rc == 0)
            *out = h;
        return rc;
    }
    char e2[400] = "out of memory";
    int rc = grow(v, sizeof(batch_header));
    if (rc == 0)
        rc = arena_read(A, off, v->buf, sizeof(batch_header), e2, sizeof e2);
    if (rc < 0)
        return df_err(err, errlen, rc, "reading the slot header: %s", e2);
    batch_header probe = *(batch_header *)v->buf;
    uint64_t off_feat = probe.off_feat;
    if (probe.magic != BATCH_MAGIC || off_feat < sizeof(batch_header) || off_feat > slot_bytes)
        return df_err(err, errlen, -EINVAL, "batch: bad magic %08x or metadata size %llu (slot %llu bytes)",
                      probe.magic, (unsigned long long)off_feat, (unsigned long long)slot_bytes);
    snprintf(e2, sizeof e2, "out of memory");
    if ((rc = grow(v, (size_t)off_feat)) < 0 || (rc = arena_read(A, off, v->buf, off_feat, e2, sizeof e2)) < 0)
        return df_err(err, errlen, rc, "reading %llu bytes of slot metadata: %s", (unsigned long long)off_feat, e2);
    batch_header *h = (batch_header *)v->buf;
    if ((rc = batch_validate(h, slot_bytes, kind, err, errlen)) < 0)
        return rc;
    *out = h;
    return 0;
}

int batch_view_write(const arena *A, uint64_t off, const batch_header *h, char *err, size_t errlen)
{
    if (A->kind == ARENA_CPU && (const char *)h == (const char *)A->base + off)
        return 0;
    char e2[400];
    int rc = arena_write(A, off, h, h->off_feat, e2, sizeof e2);
    if (rc < 0)
        snprintf(err, errlen, "writing %llu bytes of batch %llu's metadata into the slot: %s",
                 (unsigned long long)h->off_feat, (unsigned long long)h->batch_id, e2);
    return rc;
}

void batch_view_free(batch_view *v)
{
    free(v->buf);
    v->buf = NULL;
    v->cap = 0;
}
