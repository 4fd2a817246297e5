/* dflash_loss.h: the drafter's frozen lm_head + softmax + weighted cross-entropy and its
 * gradient, computed in row chunks so that [rows x vocab] logits never exist at once
 * (151936-wide vocab: docs/dflash_spec.md). Rows with zero weight (position 0, padding,
 * prompt tokens) are skipped entirely: no logits, zero gradient. Also collects the
 * per-position accuracies and the expected acceptance length tau. */
#ifndef DF_DFLASH_LOSS_H
#define DF_DFLASH_LOSS_H

#include <stdint.h>

#define DFLASH_MAX_BLOCK 64

typedef struct dflash_stats {
    double wce;                       /* sum of w * CE */
    double sum_w;                     /* sum of w of the rows seen */
    double loss;                      /* wce / norm of the call (merged: wce / sum_w) */
    double correct[DFLASH_MAX_BLOCK]; /* per block position k: rows with w > 0 and argmax == label */
    double count[DFLASH_MAX_BLOCK];   /* per k: rows with w > 0 */
} dflash_stats;

/* z[rows, d] (final-norm output), W[V, d] frozen head, labels/w[rows] (row r is block
 * position r % B). dz[rows, d] (may be NULL) is OVERWRITTEN with dL/dz for
 * L = sum(w*CE) / norm; norm <= 0 means the local sum of w (one sequence); pass the global
 * sum over a data-parallel step to get the correctly normalised gradient. chunk_rows
 * bounds the logits scratch (chunk_rows * V floats, allocated here). st may be NULL;
 * it is zeroed and filled. 0 or -errno (-EINVAL bad label, -ENOMEM). */
int dflash_loss_chunked(float *dz, const float *z, const float *W, const int32_t *labels, const float *w, int rows,
                        int d, int V, int B, int chunk_rows, double norm, dflash_stats *st);

/* Sums b into a (wce, sum_w, counts) and recomputes a->loss = wce / sum_w. */
void dflash_stats_merge(dflash_stats *a, const dflash_stats *b);
/* acc_k = correct[k] / count[k] (0 when no rows). */
double dflash_stats_acc(const dflash_stats *s, int k);
/* Expected acceptance length 1 + sum_{k=1}^{B-1} prod_{j=1}^{k} acc_j. */
double dflash_stats_tau(const dflash_stats *s, int B);

#endif
