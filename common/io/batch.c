/* batch.c: offsets of the sections of a batch in a slot, and its validation. */
#include "io/batch.h"

#include "ckmath.h"
#include "util.h"

#include <stdio.h>

static uint64_t align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

uint64_t batch_layout(batch_header *h)
{
    uint64_t o = align_up(sizeof(batch_header), 64);
    h->off_tokens = o;
    o += 4ull * h->T;
    h->off_mask = o;
    o = align_up(o + h->T, 64);
    uint64_t na = h->kind == BATCH_KIND_PD ? (uint64_t)h->n_docs * h->num_anchors : 0;
    h->off_anchors = o;
    o += 4 * na;
    h->off_keep = o;
    o = align_up(o + na, 256);
    h->off_feat = o;
    uint64_t esz = h->feat_dtype == BATCH_FEAT_BF16 ? 2 : 4, feat;
    /* T x n_capture x d x esz can exceed 64 bits for header values read from a slot (or a
     * huge topology): an overflow gives UINT64_MAX, larger than any slot */
    if (ckmath_mul4(h->T, h->n_capture, h->d, esz, &feat) || ckmath_add(o, feat, &o))
        o = UINT64_MAX;
    h->total_bytes = o;
    return o;
}

uint64_t batch_checksum(const batch_header *h)
{
    batch_header *m = (batch_header *)h; /* the accessors take a non-const header */
    uint64_t c = df_fnv1a64(batch_tokens(m), 4ull * h->T, h->batch_id);
    return df_fnv1a64(batch_mask(m), h->T, c);
}

int batch_validate(const batch_header *h, uint64_t slot_bytes, uint32_t want_kind, char *err, size_t errlen)
{
    if (h->magic != BATCH_MAGIC || h->version != BATCH_VERSION)
        return df_err(err, errlen, -EINVAL, "batch: bad magic/version %08x/%u", h->magic, h->version);
    if (h->kind != want_kind)
        return df_err(err, errlen, -EINVAL, "batch %llu: kind %u, expected %u", (unsigned long long)h->batch_id,
                      h->kind, want_kind);
    if (h->n_docs == 0 || h->n_docs > BATCH_MAX_DOCS || h->doc_starts[0] != 0 ||
        h->doc_starts[h->n_docs] != (int32_t)h->T)
        return df_err(err, errlen, -EINVAL, "batch %llu: bad document table (n_docs %u, T %u)",
                      (unsigned long long)h->batch_id, h->n_docs, h->T);
    for (uint32_t k = 0; k < h->n_docs; k++)
        if (h->doc_starts[k + 1] <= h->doc_starts[k])
            return df_err(err, errlen, -EINVAL, "batch %llu: document %u is empty or out of order",
                          (unsigned long long)h->batch_id, k);
    batch_header copy = *h;
    if (batch_layout(&copy) != h->total_bytes || copy.off_feat != h->off_feat || h->total_bytes > slot_bytes)
        return df_err(err, errlen, -EINVAL,
                      "batch %llu: layout does not match its header or exceeds the slot (%llu > %llu bytes)",
                      (unsigned long long)h->batch_id, (unsigned long long)h->total_bytes,
                      (unsigned long long)slot_bytes);
    if (batch_checksum(h) != h->checksum)
        return df_err(err, errlen, -EINVAL, "batch %llu: checksum mismatch (torn or stale slot)",
                      (unsigned long long)h->batch_id);
    return 0;
}
