/* adamw.h: AdamW over one flat fp32 parameter array (the drafter's master weights),
 * with the paper's schedule (linear warmup over warmup_frac of the steps, then cosine to
 * min_lr), global-L2-norm gradient clipping and optional decoupled weight decay.
 *
 * Weight decay is applied only to the segments the caller marks (the drafter marks its
 * 2-D projection matrices and leaves every 1-D norm weight undecayed: decaying a norm
 * gain pulls it towards 0, i.e. shrinks the whole layer, which is not regularisation).
 * The paper recipe uses weight_decay = 0 anyway. m, v are fp32 like the weights. */
#ifndef DF_ADAMW_H
#define DF_ADAMW_H

#include <stddef.h>

typedef struct adamw_config {
    double lr;     /* peak learning rate */
    double min_lr; /* floor of the cosine (0 = decay to 0) */
    double beta1, beta2, eps;
    double weight_decay; /* decoupled: p -= lr * wd * p, on decay segments only */
    double warmup_frac;  /* warmup steps = ceil(warmup_frac * total_steps) */
    double clip_norm;    /* clip the global L2 norm to this; <= 0: no clipping */
    long total_steps;
} adamw_config;

/* A range [off, off+len) of the parameter array that gets weight decay. */
typedef struct adamw_segment {
    size_t off, len;
} adamw_segment;

typedef struct adamw {
    adamw_config cfg;
    size_t n;
    float *m, *v; /* [n] first and second moments, owned */
    long step;    /* updates done so far */
} adamw;

typedef struct adamw_info {
    double lr;         /* learning rate used by this update */
    double grad_norm;  /* global L2 norm BEFORE clipping */
    double clip_scale; /* factor applied to the gradients (1 = not clipped) */
    int skipped;       /* 1: non-finite gradient norm, nothing updated (step not counted) */
} adamw_info;

/* Paper defaults: lr 6e-4, betas (0.9, 0.95), eps 1e-8, wd 0, warmup 4%, clip 1.0. */
void adamw_config_default(adamw_config *c, long total_steps);
/* m, v zeroed, step 0. 0 or -ENOMEM / -EINVAL. */
int adamw_init(adamw *o, const adamw_config *c, size_t n);
void adamw_free(adamw *o);
/* LR for the update with 0-based index `step`: warmup (step+1)/W * lr for step < W (so
 * the first update is not wasted at 0), then min_lr + (lr - min_lr)(1 + cos(pi t))/2 with
 * t = (step - W) / (total - W) clamped to [0, 1]. */
double adamw_lr(const adamw_config *c, long step);
/* Global L2 norm of g[n] (double accumulation). */
double adamw_global_norm(const float *g, size_t n);
/* One update: clip g in place (if needed); p *= 1 - lr wd on the decay segments; then
 * for every element m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr mhat / (sqrt(vhat) + eps) with bias corrections 1-b^t. 0 or -EINVAL. */
int adamw_step(adamw *o, float *params, float *grads, const adamw_segment *decay, int n_decay, adamw_info *info);

#endif
