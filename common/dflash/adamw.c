/* adamw.c: AdamW with warmup + cosine and global-norm clipping (see adamw.h). Plain
 * loops over one array: the CPU reference and the numerics the CUDA optimizer matches. */
#include "dflash/adamw.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void adamw_config_default(adamw_config *c, long total_steps)
{
    memset(c, 0, sizeof(*c));
    c->lr = 6e-4;
    c->min_lr = 0;
    c->beta1 = 0.9;
    c->beta2 = 0.95;
    c->eps = 1e-8;
    c->weight_decay = 0;
    c->warmup_frac = 0.04;
    c->clip_norm = 1.0;
    c->total_steps = total_steps;
}

int adamw_init(adamw *o, const adamw_config *c, size_t n)
{
    memset(o, 0, sizeof(*o));
    if (n == 0 || c->total_steps <= 0 || !(c->lr >= 0) || c->beta1 < 0 || c->beta1 >= 1 || c->beta2 < 0 ||
        c->beta2 >= 1)
        return -EINVAL;
    o->m = calloc(n, sizeof(float));
    o->v = calloc(n, sizeof(float));
    if (!o->m || !o->v) {
        adamw_free(o);
        return -ENOMEM;
    }
    o->cfg = *c;
    o->n = n;
    return 0;
}

void adamw_free(adamw *o)
{
    free(o->m);
    free(o->v);
    memset(o, 0, sizeof(*o));
}

double adamw_lr(const adamw_config *c, long step)
{
    long warm = (long)ceil(c->warmup_frac * (double)c->total_steps);
    if (step < warm)
        return c->lr * (double)(step + 1) / (double)warm;
    long span = c->total_steps - warm;
    double t = span > 0 ? (double)(step - warm) / (double)span : 1.0;
    if (t > 1)
        t = 1;
    return c->min_lr + (c->lr - c->min_lr) * 0.5 * (1.0 + cos(M_PI * t));
}

double adamw_global_norm(const float *g, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)g[i] * g[i];
    return sqrt(s);
}

int adamw_step(adamw *o, float *params, float *grads, const adamw_segment *decay, int n_decay, adamw_info *info)
{
    adamw_info local;
    if (!info)
        info = &local;
    memset(info, 0, sizeof(*info));
    const adamw_config *c = &o->cfg;
    double norm = adamw_global_norm(grads, o->n);
    info->grad_norm = norm;
    info->clip_scale = 1.0;
    info->lr = adamw_lr(c, o->step);
    if (!isfinite(norm)) { /* a NaN/Inf gradient would poison m and v forever: skip */
        info->skipped = 1;
        return 0;
    }
    if (c->clip_norm > 0 && norm > c->clip_norm) {
        info->clip_scale = c->clip_norm / (norm + 1e-6);
        float s = (float)info->clip_scale;
        for (size_t i = 0; i < o->n; i++)
            grads[i] *= s;
    }
    for (int s = 0; s < n_decay; s++)
        if (decay[s].off + decay[s].len > o->n)
            return -EINVAL;
    if (c->weight_decay > 0) { /* decoupled, before the Adam update (torch AdamW order) */
        float f = (float)(1.0 - info->lr * c->weight_decay);
        for (int s = 0; s < n_decay; s++)
            for (size_t i = decay[s].off; i < decay[s].off + decay[s].len; i++)
                params[i] *= f;
    }
    long t = o->step + 1;
    double bc1 = 1.0 - pow(c->beta1, (double)t), bc2 = 1.0 - pow(c->beta2, (double)t);
    float b1 = (float)c->beta1, b2 = (float)c->beta2;
    float step_size = (float)(info->lr / bc1), inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2)), eps = (float)c->eps;
    for (size_t i = 0; i < o->n; i++) {
        float g = grads[i];
        o->m[i] = b1 * o->m[i] + (1.0f - b1) * g;
        o->v[i] = b2 * o->v[i] + (1.0f - b2) * g * g;
        params[i] -= step_size * o->m[i] / (sqrtf(o->v[i]) * inv_sqrt_bc2 + eps);
    }
    o->step = t;
    return 0;
}
