/* dflash_loss.h: the drafter's frozen lm_head + softmax + weighted cross-entropy and its
 * gradient, computed in row chunks so that [rows x vocab] logits never exist at once
 * (151936-wide vocab: docs/dflash_spec.md). Rows with zero weight (position 0, padding,
 * prompt tokens) are skipped entirely: no logits, zero gradient. Also collects the
 * per-position accuracies and the expected acceptance length tau.
 *
 * Two objectives (dflash_config.loss, docs/dflash_spec.md "Loss weights"):
 *   decay  L = sum(w CE) / sum(w), w the batch's fixed weights exp(-(k-1)/gamma);
 *   dpace  L = sum(w CE) / A, w computed per block from the drafter's own detached
 *          confidence q_k = exp(-CE_k) (dflash_dpace_weights), A the number of blocks with
 *          a loss position. The batch's weights then only say which rows are loss
 *          positions (w > 0), as the accuracies always do. The gradient of a row is linear
 *          in its weight, so one pass computes each row's CE and its unit-weight dL/dz; the
 *          weights, known once every row of a block has its CE, scale dz afterwards. */
#ifndef DF_DFLASH_LOSS_H
#define DF_DFLASH_LOSS_H

#include <stdint.h>

#include "dflash/dflash_config.h"

#define DFLASH_MAX_BLOCK 64

typedef struct dflash_stats {
    double wce;                       /* sum of w * CE */
    double sum_w;                     /* the normaliser's share of the rows seen: decay sum of w; dpace the number of
                   * blocks with a loss position (dflash_loss_norm) */
    double loss;                      /* wce / norm of the call (merged: wce / sum_w) */
    double correct[DFLASH_MAX_BLOCK]; /* per block position k: loss rows (w > 0) with argmax == label */
    double count[DFLASH_MAX_BLOCK];   /* per k: loss rows (w > 0) */
    double wpos[DFLASH_MAX_BLOCK];    /* per k: sum of the loss weight its rows carried (decay w, dpace the
                                       * confidence weights); dflash_stats_wpos normalises */
} dflash_stats;

/* z[rows, d] (final-norm output), W[V, d] frozen head, labels/w[rows] (row r is block
 * position r % B). dz[rows, d] (may be NULL) is OVERWRITTEN with dL/dz for
 * L = sum(w*CE) / norm; norm <= 0 means the local sum of w (one sequence); pass the global
 * sum over a data-parallel step to get the correctly normalised gradient. chunk_rows
 * bounds the logits scratch (chunk_rows * V floats, allocated here). st may be NULL;
 * it is zeroed and filled. 0 or -errno (-EINVAL bad label, -ENOMEM). */
int dflash_loss_chunked(float *dz, const float *z, const float *W, const int32_t *labels, const float *w, int rows,
                        int d, int V, int B, int chunk_rows, double norm, dflash_stats *st);

/* D-PACE weights of rows = N*B block rows from their cross-entropies ce[rows] (read only where
 * mask[r] > 0) and the loss-position mask (the batch's weights: > 0 = a loss position). Per
 * block, over k = 1..B-1: q_k = exp(-ce_k), s_k = (1 - alpha) q_k + alpha, P_m = s_1 ... s_m,
 * wd_k = P_k + P_{k+1} + ... + P_L, where L is the last position before the block's first
 * non-loss position (acceptance cannot continue past it: positions after it weigh 0, as do
 * k = 0 and non-loss rows). alpha in (0, 1]. Writes wd[rows]; returns the number of blocks
 * with L >= 1 (the objective's normaliser share), or -EINVAL for a bad alpha or B. */
int dflash_dpace_weights(double *wd, const double *ce, const float *mask, int rows, int B, double alpha);

/* What one sequence adds to the loss normaliser under loss (dflash_loss_kind): decay the sum of
 * w (the same double as dflash_labels_weights returns), dpace the number of blocks whose first
 * predicted row (k = 1) is a loss position. */
double dflash_loss_norm(int loss, const float *w, int rows, int B);

/* dflash_loss_chunked for D-PACE: w marks the loss rows (w > 0), the weights are
 * dflash_dpace_weights of this call's CE; L = sum(wd * CE) / norm, norm <= 0 meaning this
 * call's block count (dflash_loss_norm). The weights are constants of the gradient (detached):
 * dz row r = wd_r * dCE_r/dz / norm. wd_out[rows] (may be NULL) receives the weights.
 * 0 or -errno as dflash_loss_chunked. */
int dflash_loss_dpace_chunked(float *dz, const float *z, const float *W, const int32_t *labels, const float *w,
                              int rows, int d, int V, int B, int chunk_rows, double alpha, double norm, float *wd_out,
                              dflash_stats *st);

/* The objective c->loss chooses (c->block_size, c->dpace_alpha), d = c->hidden, V = c->vocab. */
int dflash_loss_config(const dflash_config *c, float *dz, const float *z, const float *W, const int32_t *labels,
                       const float *w, int rows, int chunk_rows, double norm, dflash_stats *st);

/* Sums b into a (wce, sum_w, counts, wpos) and recomputes a->loss = wce / sum_w. */
void dflash_stats_merge(dflash_stats *a, const dflash_stats *b);
/* acc_k = correct[k] / count[k] (0 when no rows). */
double dflash_stats_acc(const dflash_stats *s, int k);
/* Expected acceptance length 1 + sum_{k=1}^{B-1} prod_{j=1}^{k} acc_j. */
double dflash_stats_tau(const dflash_stats *s, int B);
/* out[k-1] = wpos[k] / sum_{k'=1}^{B-1} wpos[k'] for k = 1..B-1: each position's share of the
 * loss weight (all 0 when there is none). */
void dflash_stats_wpos(const dflash_stats *s, int B, double *out);

#endif
