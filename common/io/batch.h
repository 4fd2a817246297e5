/* batch.h: the layout of a batch inside a ring slot's payload, shared by the stages.
 *
 * One batch = one ledger batch = several documents (samples) packed into one row of T
 * tokens. The target writes a TP batch; the postproc stage turns it into a PD batch (the
 * same layout plus each document's anchors and keep flags, with noise added to the
 * features) in the drafter's memory. Everything is offsets from the slot's start, so the
 * layout means the same in every process whatever address the arena is mapped at.
 *
 *   batch_header                       (fixed size, below)
 *   int32  tokens[T]
 *   uint8  loss_mask[T]                (padded to 64 bytes)
 *   int32  anchors[n_docs][num_anchors] (PD only; sorted; padding entries 0)
 *   uint8  keep[n_docs][num_anchors]    (PD only; padded to 64 bytes)
 *   feat   features[T][n_capture][d]   (fp32 on the CPU backend, bf16 on CUDA; 256-byte aligned)
 *
 * The features of document k are rows doc_starts[k] .. doc_starts[k+1]-1, i.e. for the
 * drafter a [S_k, n_capture * d] matrix in the concat order of the captured layers.
 */
#ifndef DF_BATCH_H
#define DF_BATCH_H

#include <stddef.h>
#include <stdint.h>

#define BATCH_MAGIC 0x48435442u /* "BTCH" */
#define BATCH_VERSION 1u
#define BATCH_MAX_DOCS 256

enum { BATCH_FEAT_F32 = 0, BATCH_FEAT_BF16 = 1 };
enum { BATCH_KIND_TP = 1, BATCH_KIND_PD = 2 };

typedef struct batch_header {
    uint32_t magic, version;
    uint32_t kind;       /* BATCH_KIND_* */
    uint32_t feat_dtype; /* BATCH_FEAT_* */
    uint64_t batch_id;   /* ledger batch id */
    uint32_t n_docs, T;  /* documents, total tokens */
    uint32_t n_capture, d;
    uint32_t num_anchors, block_size;                               /* PD only (0 in TP) */
    uint64_t off_tokens, off_mask, off_anchors, off_keep, off_feat; /* bytes from the header */
    uint64_t total_bytes;
    uint64_t sample_idx[BATCH_MAX_DOCS];    /* dataset sample of each document */
    int32_t doc_starts[BATCH_MAX_DOCS + 1]; /* doc k = tokens [doc_starts[k], doc_starts[k+1]) */
    uint64_t checksum;                      /* FNV-1a of tokens and mask (not features): catches a torn or stale slot */
} batch_header;

/* Fill the offsets and total_bytes of h from its kind, n_docs, T, n_capture, d,
 * num_anchors and feat_dtype. Returns total_bytes. */
uint64_t batch_layout(batch_header *h);

static inline int32_t *batch_tokens(batch_header *h)
{
    return (int32_t *)((char *)h + h->off_tokens);
}
static inline uint8_t *batch_mask(batch_header *h)
{
    return (uint8_t *)((char *)h + h->off_mask);
}
static inline int32_t *batch_anchors(batch_header *h)
{
    return (int32_t *)((char *)h + h->off_anchors);
}
static inline uint8_t *batch_keep(batch_header *h)
{
    return (uint8_t *)((char *)h + h->off_keep);
}
static inline void *batch_feat(batch_header *h)
{
    return (char *)h + h->off_feat;
}

/* Checksum over tokens and mask (what batch_header.checksum holds). */
uint64_t batch_checksum(const batch_header *h);
/* Validate a header read from a slot of slot_bytes: magic, version, kind, bounds of every
 * section. 0 or -EINVAL with a message in err. */
int batch_validate(const batch_header *h, uint64_t slot_bytes, uint32_t want_kind, char *err, size_t errlen);

#endif
