/* dflash_batch.h: everything the drafter derives from one training sequence before the
 * model runs (docs/dflash_spec.md "Training"): anchor sampling, labels, loss weights, the
 * training attention mask as nn_key_ranges, and the optional feature noise.
 *
 * Shaped as plain functions over arrays so the postproc_worker (which samples anchors
 * and adds noise in the pipeline) and the drafter (which needs labels, weights and masks)
 * can share them, and the CUDA port can copy the exact rules. Determinism: every random
 * choice is drawn from a df_rng seeded by (seed, batch_id, stream), so a replayed batch is
 * bit-identical whatever process or restart produced it. */
#ifndef DF_DFLASH_BATCH_H
#define DF_DFLASH_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "dflash/dflash_config.h"
#include "nn/nn.h"
#include "util.h"

/* Independent random streams of one batch. */
enum { DFLASH_STREAM_ANCHORS = 1, DFLASH_STREAM_NOISE = 2 };
void dflash_rng_for(df_rng *r, uint64_t seed, uint64_t batch_id, uint64_t stream);

/* Anchors: candidates p in [0, S-2] with loss_mask[p] = loss_mask[p+1] = 1; draws
 * n = min(num_anchors, #candidates) without replacement (partial Fisher-Yates on the
 * candidate list, rng stream ANCHORS), sorts them ascending, and pads anchors[n..) with 0
 * and keep 0. anchors/keep have num_anchors entries. Returns n (>= 0). */
int dflash_sample_anchors(int32_t *anchors, uint8_t *keep, int num_anchors, const uint8_t *loss_mask, int S,
                          uint64_t seed, uint64_t batch_id);

/* labels[j*B+k] = x[a_j+k] (no shift) or -1 where there is none (k = 0, past S, padding);
 * weights[j*B+k] = keep_j * [a_j+k < S] * loss_mask[a_j+k] * exp(-(k-1)/gamma), 0 for k = 0.
 * Returns sum of the weights. */
double dflash_labels_weights(int32_t *labels, float *weights, const int32_t *anchors, const uint8_t *keep, int N, int B,
                             const int32_t *x, const uint8_t *loss_mask, int S, double gamma);

/* The training mask for the N*B block queries over keys [context 0..S-1 ; block rows
 * S + j*B + k]. Full attention (window <= 0): block j sees context [0, a_j) (STRICTLY
 * before its anchor) and its own block (bidirectional). Sliding (window W > 0): context
 * [max(0, a_j + k - (W-1)), a_j) and own-block keys with offset <= k (causal). keep_j = 0:
 * both ranges empty (the attention output is exact zeros). */
void dflash_mask_ranges(nn_key_ranges *ranges, const int32_t *anchors, const uint8_t *keep, int N, int B, int S,
                        int window);

/* One sequence as the model consumes it. H/x/loss_mask are borrowed; anchors, keep,
 * labels, weights are owned (dflash_batch_free). */
typedef struct dflash_batch {
    int S;                    /* context tokens */
    int N;                    /* anchor slots (= num_anchors, padding included) */
    int n_real;               /* anchors with keep = 1 */
    const float *H;           /* [S, n_capture * d] captured target features, concat order */
    const int32_t *x;         /* [S] tokens */
    const uint8_t *loss_mask; /* [S] 1 = response token */
    int32_t *anchors;         /* [N] sorted ascending, pads 0 */
    uint8_t *keep;            /* [N] */
    int32_t *labels;          /* [N*B], -1 = none */
    float *weights;           /* [N*B] */
    double sum_w;             /* sum of weights */
} dflash_batch;

/* Allocates N = num_anchors slots, samples anchors with (seed, batch_id), fills labels
 * and weights. 0 or -errno (-EINVAL on bad sizes, -ENOMEM). On failure b is freed. */
int dflash_batch_init(dflash_batch *b, const dflash_config *c, int S, int num_anchors, const float *H, const int32_t *x,
                      const uint8_t *loss_mask, uint64_t seed, uint64_t batch_id);
/* Replace the anchors by given ones (N of them, sorted, keep flags; tests and replays)
 * and recompute labels and weights. The slot count changes to N. 0 or -errno. */
int dflash_batch_set_anchors(dflash_batch *b, const dflash_config *c, const int32_t *anchors, const uint8_t *keep,
                             int N);
void dflash_batch_free(dflash_batch *b);

/* Feature noise, one std for the whole run (topology drafter.noise_std): H[i] += std *
 * N(0,1) for i < count, drawn from stream NOISE of (seed, batch_id). */
void dflash_add_noise(float *H, size_t count, double std, uint64_t seed, uint64_t batch_id);

#endif
