/* dflash_model.c: parameters, forward and backward of the DFlash drafter, CPU fp32
 * reference built from the nn_* layers and their nn_*_backward gradients. Clear loops,
 * one sequence per call; the CUDA port follows the same order of operations. */
#include "dflash/dflash_model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dflash/adamw.h"
#include "nn/nn_backward.h"
#include "rng_fill.h"
#include "util.h"

/* ---- parameter table ----------------------------------------------------- */

enum { PER_LAYER = 11 };

int dflash_tensor_count(const dflash_config *c)
{
    return 3 + PER_LAYER * c->n_layers;
}

void dflash_tensor_info(const dflash_config *c, int i, dflash_tensor *t)
{
    int64_t d = c->hidden, hd = c->head_dim, I = c->intermediate;
    int64_t qd = (int64_t)c->n_heads * hd, kvd = (int64_t)c->n_kv_heads * hd;
    memset(t, 0, sizeof(*t));
    size_t off = 0;
    /* walk the table up to i, accumulating offsets (n_tensors is small) */
    for (int j = 0; j <= i; j++) {
        dflash_tensor cur;
        memset(&cur, 0, sizeof(cur));
        cur.offset = off;
        int nl = j - 2; /* index into the per-layer part */
        if (j == 0) {
            snprintf(cur.name, sizeof(cur.name), "fc.weight");
            cur.ndim = 2, cur.shape[0] = d, cur.shape[1] = (int64_t)c->n_capture * d;
        } else if (j == 1) {
            snprintf(cur.name, sizeof(cur.name), "hidden_norm.weight");
            cur.ndim = 1, cur.shape[0] = d, cur.is_norm = 1;
        } else if (nl < PER_LAYER * c->n_layers) {
            int l = nl / PER_LAYER, which = nl % PER_LAYER;
            static const char *names[PER_LAYER] = {"input_layernorm",  "post_attention_layernorm",
                                                   "self_attn.q_proj", "self_attn.k_proj",
                                                   "self_attn.v_proj", "self_attn.o_proj",
                                                   "self_attn.q_norm", "self_attn.k_norm",
                                                   "mlp.gate_proj",    "mlp.up_proj",
                                                   "mlp.down_proj"};
            const int64_t shapes[PER_LAYER][2] = {{d, 0},  {d, 0},  {qd, d}, {kvd, d}, {kvd, d}, {d, qd},
                                                  {hd, 0}, {hd, 0}, {I, d},  {I, d},   {d, I}};
            snprintf(cur.name, sizeof(cur.name), "layers.%d.%s.weight", l, names[which]);
            cur.shape[0] = shapes[which][0];
            cur.shape[1] = shapes[which][1];
            cur.ndim = cur.shape[1] ? 2 : 1;
            cur.is_norm = cur.ndim == 1;
        } else {
            snprintf(cur.name, sizeof(cur.name), "norm.weight");
            cur.ndim = 1, cur.shape[0] = d, cur.is_norm = 1;
        }
        cur.numel = (size_t)cur.shape[0] * (size_t)(cur.ndim == 2 ? cur.shape[1] : 1);
        off += cur.numel;
        *t = cur;
    }
}

void dflash_params_bind(dflash_params *p, const dflash_config *c, float *data)
{
    memset(p, 0, sizeof(*p));
    p->data = data;
    p->n = dflash_config_param_count(c);
    int nt = dflash_tensor_count(c);
    for (int i = 0; i < nt; i++) {
        dflash_tensor t;
        dflash_tensor_info(c, i, &t);
        float *v = data + t.offset;
        if (i == 0) {
            p->fc = v;
        } else if (i == 1) {
            p->hidden_norm = v;
        } else if (i == nt - 1) {
            p->final_norm = v;
        } else {
            dflash_layer_params *L = &p->layer[(i - 2) / PER_LAYER];
            float **slots[PER_LAYER] = {&L->input_norm, &L->post_norm, &L->wq,     &L->wk,   &L->wv,    &L->wo,
                                        &L->q_norm,     &L->k_norm,    &L->w_gate, &L->w_up, &L->w_down};
            *slots[(i - 2) % PER_LAYER] = v;
        }
    }
}

int dflash_params_alloc(dflash_params *p, const dflash_config *c)
{
    size_t n = dflash_config_param_count(c);
    float *data = calloc(n, sizeof(float));
    if (!data)
        return -ENOMEM;
    dflash_params_bind(p, c, data);
    p->owns = 1;
    return 0;
}

void dflash_params_free(dflash_params *p)
{
    if (p->owns)
        free(p->data);
    memset(p, 0, sizeof(*p));
}

void dflash_params_init_random(dflash_params *p, const dflash_config *c, uint64_t seed, float std)
{
    df_rng r;
    df_rng_seed(&r, seed);
    int nt = dflash_tensor_count(c);
    for (int i = 0; i < nt; i++) {
        dflash_tensor t;
        dflash_tensor_info(c, i, &t);
        float *v = p->data + t.offset;
        if (t.is_norm)
            for (size_t e = 0; e < t.numel; e++)
                v[e] = 1.0f;
        else /* (float)(std * df_rng_normal(&r)) per element, in order; threads for the big ones */
            df_rng_fill_normal(&r, v, t.numel, std, 0);
    }
}

int dflash_decay_segments(const dflash_config *c, adamw_segment *segs, int max)
{
    int n = 0, nt = dflash_tensor_count(c);
    for (int i = 0; i < nt && n < max; i++) {
        dflash_tensor t;
        dflash_tensor_info(c, i, &t);
        if (!t.is_norm)
            segs[n++] = (adamw_segment){t.offset, t.numel};
    }
    return n;
}

/* ---- activations ----------------------------------------------------------- */

void dflash_acts_free(dflash_acts *a)
{
    free(a->mem);
    memset(a, 0, sizeof(*a));
}

/* Two passes over the same carve list: size, then pointers. */
static size_t carve(dflash_acts *a, const dflash_config *c, int S, int R, char *base)
{
    size_t off = 0;
    long d = c->hidden, qd = (long)c->n_heads * c->head_dim, kvd = (long)c->n_kv_heads * c->head_dim;
    long I = c->intermediate, T = (long)S + R;
#define TAKE(ptr, type, count)                                      \
    do {                                                            \
        if (base)                                                   \
            (ptr) = (type *)(base + off);                           \
        off += ((size_t)(count) * sizeof(type) + 63) & ~(size_t)63; \
    } while (0)
    TAKE(a->inv_freq, float, c->head_dim / 2);
    TAKE(a->pos, int32_t, T);
    TAKE(a->rng_full, nn_key_ranges, R);
    TAKE(a->rng_slide, nn_key_ranges, R);
    TAKE(a->fc_out, float, S *d);
    TAKE(a->ctx, float, S *d);
    TAKE(a->h_out, float, R *d);
    TAKE(a->z, float, R *d);
    TAKE(a->dz, float, R *d);
    TAKE(a->X, float, T *d);
    TAKE(a->dX, float, T *d);
    TAKE(a->dh, float, R *d);
    TAKE(a->dh2, float, R *d);
    TAKE(a->da, float, R *d);
    TAKE(a->dq, float, R *qd);
    TAKE(a->datt, float, R *qd);
    TAKE(a->dk, float, T *kvd);
    TAKE(a->dv, float, T *kvd);
    TAKE(a->dgate, float, R *I);
    TAKE(a->dup, float, R *I);
    TAKE(a->dact, float, R *I);
    TAKE(a->dctx, float, S *d);
    TAKE(a->dfc, float, S *d);
    for (int l = 0; l < c->n_layers; l++) {
        dflash_layer_acts *L = &a->layer[l];
        TAKE(L->h_in, float, R *d);
        TAKE(L->a, float, R *d);
        TAKE(L->q_pre, float, R *qd);
        TAKE(L->q, float, R *qd);
        TAKE(L->k_pre, float, T *kvd);
        TAKE(L->k, float, T *kvd);
        TAKE(L->v, float, T *kvd);
        TAKE(L->att, float, R *qd);
        TAKE(L->h_mid, float, R *d);
        TAKE(L->n, float, R *d);
        TAKE(L->gate, float, R *I);
        TAKE(L->up, float, R *I);
        TAKE(L->act, float, R *I);
    }
#undef TAKE
    return off;
}

int dflash_acts_ensure(dflash_acts *a, const dflash_config *c, int S, int R)
{
    if (S <= 0 || R <= 0)
        return -EINVAL;
    if (a->mem && S <= a->S_cap && R <= a->R_cap) {
        carve(a, c, a->S_cap, a->R_cap, a->mem); /* idempotent: same layout */
        return 0;
    }
    dflash_acts_free(a);
    size_t bytes = carve(a, c, S, R, NULL);
    a->mem = malloc(bytes);
    if (!a->mem)
        return -ENOMEM;
    a->S_cap = S;
    a->R_cap = R;
    carve(a, c, S, R, a->mem);
    nn_rope_inv_freq(a->inv_freq, c->head_dim, c->rope_theta, &c->rope_scaling);
    return 0;
}

/* ---- forward ----------------------------------------------------------------- */

/* X[T, d] = [C ; a] */
static void stack_ctx(float *X, const float *ctx, const float *act, int S, int R, int d)
{
    memcpy(X, ctx, sizeof(float) * (size_t)S * d);
    memcpy(X + (size_t)S * d, act, sizeof(float) * (size_t)R * d);
}

int dflash_forward(const dflash_config *c, const dflash_params *p, const dflash_frozen *f, const dflash_batch *b,
                   dflash_acts *a)
{
    int B = c->block_size, S = b->S, R = b->N * B, T = S + R;
    int d = c->hidden, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, I = c->intermediate;
    int qd = H * hd, kvd = KV * hd;
    float eps = (float)c->rms_norm_eps;
    int rc = dflash_acts_ensure(a, c, S, R);
    if (rc < 0)
        return rc;
    a->S = S;
    a->R = R;
    for (int j = 0; j < b->N; j++) {
        if (b->anchors[j] < 0 || b->anchors[j] >= S)
            return -EINVAL;
    }
    /* context path: C = RMSNorm_hidden(H fc^T), once for all layers */
    nn_matmul(a->fc_out, b->H, p->fc, NULL, S, c->n_capture * d, d);
    nn_rmsnorm(a->ctx, a->fc_out, p->hidden_norm, S, d, eps);
    /* positions and masks */
    for (int i = 0; i < S; i++)
        a->pos[i] = i;
    for (int j = 0; j < b->N; j++)
        for (int k = 0; k < B; k++)
            a->pos[S + j * B + k] = b->anchors[j] + k;
    dflash_mask_ranges(a->rng_full, b->anchors, b->keep, b->N, B, S, 0);
    dflash_mask_ranges(a->rng_slide, b->anchors, b->keep, b->N, B, S, c->sliding_window);
    /* block input: the anchor token's embedding, then the mask token's */
    float *h = a->layer[0].h_in;
    for (int j = 0; j < b->N; j++) {
        for (int k = 0; k < B; k++) {
            int tok = k == 0 ? b->x[b->anchors[j]] : c->mask_token_id;
            if (tok < 0 || tok >= c->vocab)
                return -EINVAL;
            memcpy(h + ((long)j * B + k) * d, f->embed + (long)tok * d, sizeof(float) * (size_t)d);
        }
    }
    float scale = 1.0f / sqrtf((float)hd);
    for (int l = 0; l < c->n_layers; l++) {
        const dflash_layer_params *P = &p->layer[l];
        dflash_layer_acts *L = &a->layer[l];
        nn_rmsnorm(L->a, L->h_in, P->input_norm, R, d, eps);
        nn_matmul(L->q_pre, L->a, P->wq, NULL, R, d, qd);
        nn_rmsnorm(L->q, L->q_pre, P->q_norm, R * H, hd, eps);
        nn_rope(L->q, a->pos + S, R, H, hd, a->inv_freq);
        stack_ctx(a->X, a->ctx, L->a, S, R, d);
        nn_matmul(L->k_pre, a->X, P->wk, NULL, T, d, kvd);
        nn_rmsnorm(L->k, L->k_pre, P->k_norm, T * KV, hd, eps);
        nn_rope(L->k, a->pos, T, KV, hd, a->inv_freq);
        nn_matmul(L->v, a->X, P->wv, NULL, T, d, kvd);
        nn_attention(L->att, L->q, L->k, L->v, c->layer_sliding[l] ? a->rng_slide : a->rng_full, R, T, H, KV, hd,
                     scale);
        nn_matmul(L->h_mid, L->att, P->wo, NULL, R, qd, d);
        for (long i = 0; i < (long)R * d; i++)
            L->h_mid[i] += L->h_in[i];
        nn_rmsnorm(L->n, L->h_mid, P->post_norm, R, d, eps);
        nn_matmul(L->gate, L->n, P->w_gate, NULL, R, d, I);
        nn_matmul(L->up, L->n, P->w_up, NULL, R, d, I);
        nn_swiglu(L->act, L->gate, L->up, (long)R * I);
        float *h_next = l + 1 < c->n_layers ? a->layer[l + 1].h_in : a->h_out;
        nn_matmul(h_next, L->act, P->w_down, NULL, R, I, d);
        for (long i = 0; i < (long)R * d; i++)
            h_next[i] += L->h_mid[i];
    }
    nn_rmsnorm(a->z, a->h_out, p->final_norm, R, d, eps);
    return 0;
}

/* ---- backward ---------------------------------------------------------------- */

int dflash_grad_boundaries(const dflash_config *c, size_t *lo, int max)
{
    int n = c->n_layers + 2;
    if (max < n)
        return -EINVAL;
    dflash_tensor t;
    dflash_tensor_info(c, dflash_tensor_count(c) - 1, &t); /* norm.weight */
    lo[0] = t.offset;
    for (int l = c->n_layers - 1; l >= 0; l--) {
        dflash_tensor_info(c, 2 + l * PER_LAYER, &t); /* layers.l.input_layernorm, its first */
        lo[c->n_layers - l] = t.offset;
    }
    lo[n - 1] = 0;
    return n;
}

/* the hook's view: where stage lo starts in g, as an offset */
#define GRAD_READY(ptr)                                      \
    do {                                                     \
        if (hook && hook->ready)                             \
            hook->ready(hook->arg, (size_t)((ptr)-g->data)); \
    } while (0)

int dflash_backward(const dflash_config *c, const dflash_params *p, const dflash_frozen *f, const dflash_batch *b,
                    dflash_acts *a, const float *dz, dflash_params *g, float *dH)
{
    return dflash_backward_hooked(c, p, f, b, a, dz, g, dH, NULL);
}

int dflash_backward_hooked(const dflash_config *c, const dflash_params *p, const dflash_frozen *f,
                           const dflash_batch *b, dflash_acts *a, const float *dz, dflash_params *g, float *dH,
                           const dflash_grad_hook *hook)
{
    int B = c->block_size, S = b->S, R = b->N * B, T = S + R;
    int d = c->hidden, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, I = c->intermediate;
    int qd = H * hd, kvd = KV * hd;
    float eps = (float)c->rms_norm_eps;
    (void)f;
    if (a->S != S || a->R != R)
        return -EINVAL; /* not the forward of this batch */
    float scale = 1.0f / sqrtf((float)hd);
    size_t Rd = (size_t)R * d;
    /* dh = d(loss)/d(h_out) through the final norm */
    memset(a->dh, 0, sizeof(float) * Rd);
    nn_rmsnorm_backward(a->dh, g->final_norm, dz, a->h_out, p->final_norm, R, d, eps);
    GRAD_READY(g->final_norm);
    memset(a->dctx, 0, sizeof(float) * (size_t)S * d);
    for (int l = c->n_layers - 1; l >= 0; l--) {
        const dflash_layer_params *P = &p->layer[l];
        dflash_layer_params *G = &g->layer[l];
        dflash_layer_acts *L = &a->layer[l];
        /* MLP: h_next = h_mid + act Wd^T. dh2 = dL/dh_mid starts as the residual copy. */
        memcpy(a->dh2, a->dh, sizeof(float) * Rd);
        memset(a->dact, 0, sizeof(float) * (size_t)R * I);
        nn_matmul_backward(a->dact, G->w_down, NULL, a->dh, L->act, P->w_down, R, I, d);
        memset(a->dgate, 0, sizeof(float) * (size_t)R * I);
        memset(a->dup, 0, sizeof(float) * (size_t)R * I);
        nn_swiglu_backward(a->dgate, a->dup, a->dact, L->gate, L->up, (long)R * I);
        memset(a->da, 0, sizeof(float) * Rd); /* da = dL/dn here */
        nn_matmul_backward(a->da, G->w_gate, NULL, a->dgate, L->n, P->w_gate, R, d, I);
        nn_matmul_backward(a->da, G->w_up, NULL, a->dup, L->n, P->w_up, R, d, I);
        nn_rmsnorm_backward(a->dh2, G->post_norm, a->da, L->h_mid, P->post_norm, R, d, eps);
        /* attention: h_mid = h_in + att Wo^T. dh = dL/dh_in starts as the residual copy. */
        memcpy(a->dh, a->dh2, sizeof(float) * Rd);
        memset(a->datt, 0, sizeof(float) * (size_t)R * qd);
        nn_matmul_backward(a->datt, G->wo, NULL, a->dh2, L->att, P->wo, R, qd, d);
        memset(a->dq, 0, sizeof(float) * (size_t)R * qd);
        memset(a->dk, 0, sizeof(float) * (size_t)T * kvd);
        memset(a->dv, 0, sizeof(float) * (size_t)T * kvd);
        nn_attention_backward(a->dq, a->dk, a->dv, a->datt, L->q, L->k, L->v,
                              c->layer_sliding[l] ? a->rng_slide : a->rng_full, R, T, H, KV, hd, scale);
        /* undo RoPE, then the per-head norms (rmsnorm backward needs an output distinct
         * from its input gradient: dq_pre goes to datt, already consumed) */
        nn_rope_backward(a->dq, a->pos + S, R, H, hd, a->inv_freq);
        nn_rope_backward(a->dk, a->pos, T, KV, hd, a->inv_freq);
        memset(a->datt, 0, sizeof(float) * (size_t)R * qd); /* datt := dq_pre */
        nn_rmsnorm_backward(a->datt, G->q_norm, a->dq, L->q_pre, P->q_norm, R * H, hd, eps);
        /* V first (into dX), then dk_pre goes into dv's buffer, then K (into dX) */
        memset(a->dX, 0, sizeof(float) * (size_t)T * d);
        stack_ctx(a->X, a->ctx, L->a, S, R, d);
        nn_matmul_backward(a->dX, G->wv, NULL, a->dv, a->X, P->wv, T, d, kvd);
        memset(a->dv, 0, sizeof(float) * (size_t)T * kvd); /* dv := dk_pre */
        nn_rmsnorm_backward(a->dv, G->k_norm, a->dk, L->k_pre, P->k_norm, T * KV, hd, eps);
        nn_matmul_backward(a->dX, G->wk, NULL, a->dv, a->X, P->wk, T, d, kvd);
        /* context rows collect their gradient from this layer's K and V */
        for (long i = 0; i < (long)S * d; i++)
            a->dctx[i] += a->dX[i];
        /* da = dL/da = dq_pre Wq + dX[S:] */
        memcpy(a->da, a->dX + (size_t)S * d, sizeof(float) * Rd);
        nn_matmul_backward(a->da, G->wq, NULL, a->datt, L->a, P->wq, R, d, qd);
        nn_rmsnorm_backward(a->dh, G->input_norm, a->da, L->h_in, P->input_norm, R, d, eps);
        /* dL/dh0 (into the frozen embedding) is dropped after layer 0 */
        GRAD_READY(G->input_norm); /* layer l's tensors are contiguous from input_norm */
    }
    /* context path: C = RMSNorm_hidden(H fc^T) */
    memset(a->dfc, 0, sizeof(float) * (size_t)S * d);
    nn_rmsnorm_backward(a->dfc, g->hidden_norm, a->dctx, a->fc_out, p->hidden_norm, S, d, eps);
    nn_matmul_backward(dH, g->fc, NULL, a->dfc, b->H, p->fc, S, c->n_capture * d, d);
    GRAD_READY(g->data); /* fc and hidden_norm: the whole array is final */
    return 0;
}
#undef GRAD_READY

int dflash_loss_and_grad(const dflash_config *c, const dflash_params *p, const dflash_frozen *f, const dflash_batch *b,
                         dflash_acts *a, dflash_params *g, double norm, int chunk_rows, dflash_stats *st)
{
    return dflash_loss_and_grad_hooked(c, p, f, b, a, g, norm, chunk_rows, st, NULL);
}

int dflash_loss_and_grad_hooked(const dflash_config *c, const dflash_params *p, const dflash_frozen *f,
                                const dflash_batch *b, dflash_acts *a, dflash_params *g, double norm, int chunk_rows,
                                dflash_stats *st, const dflash_grad_hook *hook)
{
    int rc = dflash_forward(c, p, f, b, a);
    if (rc < 0)
        return rc;
    int R = b->N * c->block_size;
    /* the objective c->loss picks (decay or D-PACE: dflash_loss.h) */
    rc = dflash_loss_config(c, g ? a->dz : NULL, a->z, f->lm_head, b->labels, b->weights, R, chunk_rows, norm, st);
    if (rc < 0 || !g)
        return rc;
    return dflash_backward_hooked(c, p, f, b, a, a->dz, g, NULL, hook);
}
