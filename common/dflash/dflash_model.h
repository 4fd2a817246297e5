/* dflash_model.h: the DFlash drafter on the CPU in fp32 (docs/dflash_spec.md): parameters in
 * one flat buffer (so AdamW, clipping, all-reduce and checkpoints see one array), the
 * training forward over one sequence's N anchor blocks, and the backward to every
 * trainable parameter and optionally to the captured features H.
 *
 * Wiring: C = RMSNorm_hidden(fc(H)) once; h0 = E[x[a_j]], E[MASK] x (B-1); per layer
 * a = RMSNorm_in(h); Q = RoPE(q_norm(a Wq)); K = RoPE(k_norm([C;a] Wk)); V = [C;a] Wv;
 * h += o_proj(attn with dflash_mask_ranges); h += down(silu(gate(n)) * up(n)),
 * n = RMSNorm_post(h); z = RMSNorm_final(h). The frozen embedding and lm_head are
 * borrowed (dflash_frozen), never trained or saved. */
#ifndef DF_DFLASH_MODEL_H
#define DF_DFLASH_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "dflash/dflash_batch.h"
#include "dflash/dflash_config.h"
#include "dflash/dflash_loss.h"
#include "nn/nn.h"

typedef struct dflash_layer_params {
    float *input_norm; /* [d] */
    float *post_norm;  /* [d] */
    float *wq;         /* [H*hd, d] */
    float *wk, *wv;    /* [KV*hd, d] */
    float *wo;         /* [d, H*hd] */
    float *q_norm;     /* [hd] */
    float *k_norm;     /* [hd] */
    float *w_gate;     /* [I, d] */
    float *w_up;       /* [I, d] */
    float *w_down;     /* [d, I] */
} dflash_layer_params;

/* Views into data[n]; the same struct holds gradients. */
typedef struct dflash_params {
    float *data; /* [n] all trainable parameters, in dflash_tensor_info order */
    size_t n;
    int owns;           /* data allocated by dflash_params_alloc */
    float *fc;          /* [d, n_capture*d] */
    float *hidden_norm; /* [d] */
    dflash_layer_params layer[DFLASH_MAX_LAYERS];
    float *final_norm; /* [d] "norm.weight" */
} dflash_params;

/* One named tensor of the checkpoint (release names, no "model." prefix). */
typedef struct dflash_tensor {
    char name[96];
    int ndim;
    int64_t shape[2];
    size_t offset, numel; /* in floats, into dflash_params.data */
    int is_norm;          /* 1-D norm weight: init 1, no weight decay */
} dflash_tensor;

int dflash_tensor_count(const dflash_config *c);
void dflash_tensor_info(const dflash_config *c, int i, dflash_tensor *t);

/* Allocates n = dflash_config_param_count floats, zeroed, and binds the views. 0/-ENOMEM. */
int dflash_params_alloc(dflash_params *p, const dflash_config *c);
/* Binds views into caller-owned data (not freed by dflash_params_free). */
void dflash_params_bind(dflash_params *p, const dflash_config *c, float *data);
void dflash_params_free(dflash_params *p);
/* Norm weights 1, linear weights N(0, std^2) from df_rng(seed), tensor after tensor, element
 * after element (df_rng_fill_normal: the same bits on any number of threads). */
void dflash_params_init_random(dflash_params *p, const dflash_config *c, uint64_t seed, float std);

/* The weight-decay segments (every 2-D projection; no 1-D norm weight) of the flat
 * array, for adamw_step. Writes at most max, returns the count. */
struct adamw_segment;
int dflash_decay_segments(const dflash_config *c, struct adamw_segment *segs, int max);

/* The target's frozen tensors, borrowed: embed [V, d] (mask token row included) and
 * lm_head [V, d] (== embed for tied targets). */
typedef struct dflash_frozen {
    const float *embed;
    const float *lm_head;
} dflash_frozen;

/* Saved activations of one layer (R = N*B block rows, T = S + R keys). */
typedef struct dflash_layer_acts {
    float *h_in;  /* [R, d] residual entering the layer */
    float *a;     /* [R, d] input_layernorm(h_in) */
    float *q_pre; /* [R, H*hd] a Wq (before q_norm) */
    float *q;     /* [R, H*hd] after q_norm and RoPE */
    float *k_pre; /* [T, KV*hd] [C;a] Wk */
    float *k;     /* [T, KV*hd] after k_norm and RoPE */
    float *v;     /* [T, KV*hd] */
    float *att;   /* [R, H*hd] attention output */
    float *h_mid; /* [R, d] after the attention residual */
    float *n;     /* [R, d] post_attention_layernorm(h_mid) */
    float *gate;  /* [R, I] */
    float *up;    /* [R, I] */
    float *act;   /* [R, I] silu(gate) * up */
} dflash_layer_acts;

/* Activations and scratch for one sequence; grown by dflash_acts_ensure, reused across
 * steps (no allocation in the steady state). */
typedef struct dflash_acts {
    int S_cap, R_cap, S, R;
    void *mem;
    float *inv_freq;                     /* [hd/2] */
    int32_t *pos;                        /* [S + R] RoPE positions: context 0..S-1, block a_j + k */
    nn_key_ranges *rng_full, *rng_slide; /* [R] */
    float *fc_out;                       /* [S, d] H fc^T */
    float *ctx;                          /* [S, d] C */
    float *h_out;                        /* [R, d] residual after the last layer */
    float *z;                            /* [R, d] final norm output */
    float *dz;                           /* [R, d] loss gradient */
    float *X;                            /* [T, d] scratch [C ; a] */
    float *dX;                           /* [T, d] */
    float *dh, *dh2, *da;                /* [R, d] */
    float *dq, *datt;                    /* [R, H*hd] */
    float *dk, *dv;                      /* [T, KV*hd] */
    float *dgate, *dup, *dact;           /* [R, I] */
    float *dctx, *dfc;                   /* [S, d] */
    dflash_layer_acts layer[DFLASH_MAX_LAYERS];
} dflash_acts;

int dflash_acts_ensure(dflash_acts *a, const dflash_config *c, int S, int R);
void dflash_acts_free(dflash_acts *a);

/* Forward of b (R = b->N * B rows); leaves z in a->z. 0 or -errno. */
int dflash_forward(const dflash_config *c, const dflash_params *p, const dflash_frozen *f, const dflash_batch *b,
                   dflash_acts *a);
/* Backward from dz[R, d] (dL/dz) after dflash_forward on the same a: ADDS to g (all
 * trainable tensors) and, if dH != NULL, to dH[S, n_capture*d]. 0 or -errno. */
int dflash_backward(const dflash_config *c, const dflash_params *p, const dflash_frozen *f, const dflash_batch *b,
                    dflash_acts *a, const float *dz, dflash_params *g, float *dH);

/* Gradient readiness, for overlapping an all-reduce with the backward. The backward
 * produces the flat gradient array from its end to its start: the final norm (the last
 * tensor), then layer n_layers-1 .. 0, then the context path (fc, hidden_norm: the first
 * tensors). After each of these n_layers + 2 stages it calls ready(arg, lo): every
 * g->data[i] with i >= lo is final for this backward and is not touched again by it.
 * The boundaries are dflash_grad_boundaries'. The hook runs on the caller's thread. */
typedef struct dflash_grad_hook {
    void (*ready)(void *arg, size_t lo);
    void *arg;
} dflash_grad_hook;

/* The lo values the hook will see, in order (strictly decreasing, the last is 0). Writes
 * n_layers + 2 of them into lo[max] and returns that count (or -EINVAL if max is short). */
int dflash_grad_boundaries(const dflash_config *c, size_t *lo, int max);

/* dflash_backward / dflash_loss_and_grad that call hook (may be NULL) as above. */
int dflash_backward_hooked(const dflash_config *c, const dflash_params *p, const dflash_frozen *f,
                           const dflash_batch *b, dflash_acts *a, const float *dz, dflash_params *g, float *dH,
                           const dflash_grad_hook *hook);

/* forward + chunked loss of the objective c->loss (dflash_loss_config; norm <= 0: this
 * sequence's dflash_loss_norm, as dflash_loss_chunked) + backward into g (added; g
 * may be NULL for evaluation only). st gets loss and accuracies. 0 or -errno. */
int dflash_loss_and_grad(const dflash_config *c, const dflash_params *p, const dflash_frozen *f, const dflash_batch *b,
                         dflash_acts *a, dflash_params *g, double norm, int chunk_rows, dflash_stats *st);
int dflash_loss_and_grad_hooked(const dflash_config *c, const dflash_params *p, const dflash_frozen *f,
                                const dflash_batch *b, dflash_acts *a, dflash_params *g, double norm, int chunk_rows,
                                dflash_stats *st, const dflash_grad_hook *hook);

#endif
