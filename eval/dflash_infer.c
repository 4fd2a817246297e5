/* dflash_infer.c: cached DFlash drafting on the CPU, see dflash_infer.h. The block path
 * is dflash_forward's layer loop for one block; the context path is split out and run
 * once per context row, as its result does not depend on the block. */
#include "eval/dflash_infer.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dflash/dflash_batch.h"
#include "util.h"

/* Context rows are appended in chunks of at most this many (bounds the scratch). */
#define INFER_CHUNK 64

void infer_free(infer_state *s)
{
    if (!s)
        return;
    void *all[] = {s->inv_freq, s->kc,  s->vc, s->ctx, s->fc_out,   s->pos,       s->h, s->a,     s->q,
                   s->att,      s->tmp, s->g,  s->u,   s->rng_full, s->rng_slide, s->z, s->logits};
    for (unsigned i = 0; i < DF_ARRAY_LEN(all); i++)
        free(all[i]);
    memset(s, 0, sizeof *s);
}

int infer_init(infer_state *s, const dflash_config *c, const dflash_params *p, const dflash_frozen *f, int cap)
{
    memset(s, 0, sizeof *s);
    if (cap < 1)
        return -EINVAL;
    s->c = c, s->p = p, s->f = *f, s->cap = cap;
    size_t B = (size_t)c->block_size, d = (size_t)c->hidden, I = (size_t)c->intermediate;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    size_t rows = (size_t)cap + B, L = (size_t)c->n_layers;
    s->inv_freq = malloc(sizeof(float) * (size_t)(c->head_dim / 2));
    s->kc = malloc(sizeof(float) * L * rows * kvd);
    s->vc = malloc(sizeof(float) * L * rows * kvd);
    s->ctx = malloc(sizeof(float) * INFER_CHUNK * d);
    s->fc_out = malloc(sizeof(float) * INFER_CHUNK * d);
    s->pos = malloc(sizeof(int32_t) * DF_MAX((size_t)INFER_CHUNK, B));
    s->h = malloc(sizeof(float) * B * d);
    s->a = malloc(sizeof(float) * B * d);
    s->q = malloc(sizeof(float) * B * qd);
    s->att = malloc(sizeof(float) * B * qd);
    s->tmp = malloc(sizeof(float) * B * d);
    s->g = malloc(sizeof(float) * B * I);
    s->u = malloc(sizeof(float) * B * I);
    s->rng_full = malloc(sizeof(nn_key_ranges) * B);
    s->rng_slide = malloc(sizeof(nn_key_ranges) * B);
    s->z = malloc(sizeof(float) * B * d);
    s->logits = malloc(sizeof(float) * (B - 1 ? B - 1 : 1) * (size_t)c->vocab);
    if (!s->inv_freq || !s->kc || !s->vc || !s->ctx || !s->fc_out || !s->pos || !s->h || !s->a || !s->q || !s->att ||
        !s->tmp || !s->g || !s->u || !s->rng_full || !s->rng_slide || !s->z || !s->logits) {
        infer_free(s);
        return -ENOMEM;
    }
    nn_rope_inv_freq(s->inv_freq, c->head_dim, c->rope_theta, &c->rope_scaling); /* as dflash_acts_ensure */
    return 0;
}

void infer_reset(infer_state *s)
{
    s->n_ctx = 0;
}

static size_t layer_stride(const infer_state *s)
{
    return ((size_t)s->cap + (size_t)s->c->block_size) * (size_t)s->c->n_kv_heads * (size_t)s->c->head_dim;
}

int infer_append(infer_state *s, const float *H, int n)
{
    const dflash_config *c = s->c;
    const dflash_params *p = s->p;
    if (n < 1)
        return -EINVAL;
    if (s->n_ctx + n > s->cap)
        return -ENOSPC;
    int d = c->hidden, KV = c->n_kv_heads, hd = c->head_dim, kvd = KV * hd, nin = c->n_capture * d;
    float eps = (float)c->rms_norm_eps;
    for (int r0 = 0; r0 < n; r0 += INFER_CHUNK) {
        int m = DF_MIN(INFER_CHUNK, n - r0), p0 = s->n_ctx;
        /* C = RMSNorm_hidden(H fc^T): no input_layernorm on the context path */
        nn_matmul(s->fc_out, H + (size_t)r0 * nin, p->fc, NULL, m, nin, d);
        nn_rmsnorm(s->ctx, s->fc_out, p->hidden_norm, m, d, eps);
        for (int i = 0; i < m; i++)
            s->pos[i] = p0 + i;
        for (int l = 0; l < c->n_layers; l++) {
            const dflash_layer_params *P = &p->layer[l];
            float *kr = s->kc + (size_t)l * layer_stride(s) + (size_t)p0 * kvd;
            float *vr = s->vc + (size_t)l * layer_stride(s) + (size_t)p0 * kvd;
            nn_matmul(kr, s->ctx, P->wk, NULL, m, d, kvd);
            nn_rmsnorm(kr, kr, P->k_norm, m * KV, hd, eps);
            nn_rope(kr, s->pos, m, KV, hd, s->inv_freq);
            nn_matmul(vr, s->ctx, P->wv, NULL, m, d, kvd);
        }
        s->n_ctx += m;
    }
    return 0;
}

int infer_draft(infer_state *s, int32_t anchor, int32_t *draft)
{
    const dflash_config *c = s->c;
    const dflash_params *p = s->p;
    int B = c->block_size, S = s->n_ctx, T = S + B;
    int d = c->hidden, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, I = c->intermediate;
    int qd = H * hd, kvd = KV * hd, V = c->vocab;
    float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)hd);
    if (anchor < 0 || anchor >= V)
        return -EINVAL;
    /* h0 = E[anchor], E[MASK] x (B-1), at positions S + k */
    for (int k = 0; k < B; k++) {
        int tok = k == 0 ? anchor : c->mask_token_id;
        memcpy(s->h + (size_t)k * d, s->f.embed + (size_t)tok * d, sizeof(float) * (size_t)d);
        s->pos[k] = S + k;
    }
    int32_t a0 = S;
    uint8_t keep = 1;
    dflash_mask_ranges(s->rng_full, &a0, &keep, 1, B, S, 0);
    dflash_mask_ranges(s->rng_slide, &a0, &keep, 1, B, S, c->sliding_window);
    for (int l = 0; l < c->n_layers; l++) {
        const dflash_layer_params *P = &p->layer[l];
        float *kl = s->kc + (size_t)l * layer_stride(s), *vl = s->vc + (size_t)l * layer_stride(s);
        float *kb = kl + (size_t)S * kvd, *vb = vl + (size_t)S * kvd; /* block rows, dropped after */
        nn_rmsnorm(s->a, s->h, P->input_norm, B, d, eps);
        nn_matmul(s->q, s->a, P->wq, NULL, B, d, qd);
        nn_rmsnorm(s->q, s->q, P->q_norm, B * H, hd, eps);
        nn_rope(s->q, s->pos, B, H, hd, s->inv_freq);
        nn_matmul(kb, s->a, P->wk, NULL, B, d, kvd);
        nn_rmsnorm(kb, kb, P->k_norm, B * KV, hd, eps);
        nn_rope(kb, s->pos, B, KV, hd, s->inv_freq);
        nn_matmul(vb, s->a, P->wv, NULL, B, d, kvd);
        nn_attention(s->att, s->q, kl, vl, c->layer_sliding[l] ? s->rng_slide : s->rng_full, B, T, H, KV, hd, scale);
        nn_matmul(s->tmp, s->att, P->wo, NULL, B, qd, d);
        for (long i = 0; i < (long)B * d; i++)
            s->h[i] += s->tmp[i];
        nn_rmsnorm(s->a, s->h, P->post_norm, B, d, eps);
        nn_matmul(s->g, s->a, P->w_gate, NULL, B, d, I);
        nn_matmul(s->u, s->a, P->w_up, NULL, B, d, I);
        nn_swiglu(s->g, s->g, s->u, (long)B * I);
        nn_matmul(s->tmp, s->g, P->w_down, NULL, B, I, d);
        for (long i = 0; i < (long)B * d; i++)
            s->h[i] += s->tmp[i];
    }
    nn_rmsnorm(s->z, s->h, p->final_norm, B, d, eps);
    /* row k (k >= 1) predicts the token at anchor + k; row 0 predicts nothing */
    if (B > 1)
        nn_matmul(s->logits, s->z + d, s->f.lm_head, NULL, B - 1, d, V);
    for (int k = 1; k < B; k++) {
        const float *lg = s->logits + (size_t)(k - 1) * V;
        int32_t best = 0;
        for (int v = 1; v < V; v++)
            if (lg[v] > lg[best])
                best = v;
        draft[k - 1] = best;
    }
    return 0;
}
