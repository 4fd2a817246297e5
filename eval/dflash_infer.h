/* dflash_infer.h: DFlash drafter inference on the CPU (prefix infer_): draft one block of
 * B-1 tokens from the target features of everything accepted so far.
 *
 * The context path depends on nothing but the captured features, so it is computed once
 * per token and cached: C = RMSNorm_hidden(fc(H)) for each new context row, then per
 * drafter layer K = RoPE(k_norm(C Wk)) at the row's position and V = C Wv. A draft runs
 * the B block rows [anchor, MASK x (B-1)] at positions n_ctx .. n_ctx+B-1 through the
 * layers; their K/V are written after the context rows, used by this draft only, and
 * dropped (n_ctx does not move).
 *
 * The anchor sits at position n_ctx: the context is every token BEFORE the anchor, the
 * anchor's own feature is never seen (docs/dflash_spec.md, the "strictly <" trap). Masks are
 * the training ones (dflash_mask_ranges for one block): full layers see all context rows
 * and the whole block, sliding layers the last W-1 context rows before each query and the
 * block causally. So a draft equals dflash_forward's block for an anchor at n_ctx with
 * the same features.
 *
 * Ownership: infer_state borrows the config, parameters and frozen tensors (they must
 * outlive it) and owns its caches and scratch; infer_free releases them. */
#ifndef DF_DFLASH_INFER_H
#define DF_DFLASH_INFER_H

#include <stddef.h>
#include <stdint.h>

#include "dflash/dflash_config.h"
#include "dflash/dflash_model.h"
#include "nn/nn.h"

typedef struct infer_state {
    const dflash_config *c;
    const dflash_params *p;
    dflash_frozen f;
    int cap;                             /* context rows the cache holds */
    int n_ctx;                           /* context rows cached = position of the next anchor */
    float *inv_freq;                     /* [hd/2] */
    float *kc, *vc;                      /* [n_layers, cap + B, KV*hd]: context rows, then the block's */
    float *ctx;                          /* [chunk, d] C of the rows being appended */
    float *fc_out;                       /* [chunk, d] */
    int32_t *pos;                        /* [max(chunk, B)] */
    float *h, *a, *q, *att, *tmp;        /* [B, d], [B, d], [B, H*hd], [B, H*hd], [B, d] */
    float *g, *u;                        /* [B, I] */
    nn_key_ranges *rng_full, *rng_slide; /* [B] */
    float *z;                            /* [B, d] final-normed block rows of the last draft */
    float *logits;                       /* [B-1, V] logits of block rows 1..B-1 of the last draft */
} infer_state;

/* Allocate caches for cap context rows. 0, -EINVAL (cap < 1), -ENOMEM. */
int infer_init(infer_state *s, const dflash_config *c, const dflash_params *p, const dflash_frozen *f, int cap);
void infer_free(infer_state *s);

/* Forget the context (n_ctx = 0). */
void infer_reset(infer_state *s);

/* Append n context rows at positions n_ctx..n_ctx+n-1 from their captured features
 * H[n, n_capture*d] (the target's capture order = target_layer_ids). 0, -EINVAL (n < 1),
 * -ENOSPC (more than cap rows). */
int infer_append(infer_state *s, const float *H, int n);

/* Draft one block anchored at position n_ctx with the token anchor: writes the greedy
 * tokens of block rows 1..B-1 to draft[B-1] (argmax, first on ties); s->z and s->logits
 * hold the rows for inspection until the next draft. 0, -EINVAL (no context, bad token). */
int infer_draft(infer_state *s, int32_t anchor, int32_t *draft);

#endif
