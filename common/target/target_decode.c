/* target_decode.c: KV-cached CPU decoding of the full target, see target_decode.h. The
 * layer loop mirrors target_forward_cpu line for line; the differences are only where K/V
 * live (the cache instead of the workspace) and which keys a query sees (every cached
 * position up to its own, or the sliding window). */
#include "target/target_decode.h"

#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void decode_free(decode_model *m)
{
    if (!m)
        return;
    target_free(&m->tm);
    target_embeddings_free(&m->head);
    free(m->kc), free(m->vc), free(m->feat), free(m->z), free(m->logits);
    memset(m, 0, sizeof *m);
}

int decode_load(decode_model *m, const char *dir, const int *capture, int n_capture, int max_ctx, char *err,
                size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (n_capture < 1 || n_capture >= 64 || max_ctx < 1) {
        snprintf(err, errlen, "%s: bad decode setup: %d captured layers, cache of %d tokens", dir, n_capture, max_ctx);
        return -EINVAL;
    }
    hfconfig c;
    int rc = hfconfig_load(&c, dir, err, errlen);
    if (rc < 0)
        return rc;
    int L = c.num_hidden_layers;
    hfconfig_free(&c);
    /* target_load runs layers 0..max(capture): adding the last layer loads all of them; its
     * extra capture slot (n_capture) is ignored here */
    int ids[65], n = 0, has_last = 0;
    for (int i = 0; i < n_capture; i++) {
        ids[n++] = capture[i];
        has_last |= capture[i] == L - 1;
    }
    if (!has_last)
        ids[n++] = L - 1;
    if ((rc = target_load(&m->tm, dir, ids, n, err, errlen)) < 0)
        return rc;
    if ((rc = target_load_embeddings(&m->head, dir, 1, err, errlen)) < 0)
        goto fail;
    m->n_capture = n_capture;
    m->max_ctx = max_ctx;
    const hfconfig *hc = &m->tm.cfg;
    size_t kvd = (size_t)hc->num_key_value_heads * (size_t)hc->head_dim;
    m->kc = malloc(sizeof(float) * (size_t)L * (size_t)max_ctx * kvd);
    m->vc = malloc(sizeof(float) * (size_t)L * (size_t)max_ctx * kvd);
    if (!m->kc || !m->vc) {
        snprintf(err, errlen, "%s: out of memory for a KV cache of %d tokens", dir, max_ctx);
        rc = -ENOMEM;
        goto fail;
    }
    return 0;
fail:
    decode_free(m);
    return rc;
}

void decode_reset(decode_model *m)
{
    m->len = 0;
}

int decode_truncate(decode_model *m, int len)
{
    if (len < 0 || len > m->len)
        return -EINVAL;
    m->len = len; /* rows >= len are simply overwritten by the next extend */
    return 0;
}

int32_t decode_argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* Grow the per-step outputs to k rows. */
static int reserve_step(decode_model *m, int k)
{
    if (k <= m->max_step)
        return 0;
    const hfconfig *c = &m->tm.cfg;
    size_t d = (size_t)c->hidden_size;
    float *f = malloc(sizeof(float) * (size_t)k * (size_t)m->n_capture * d);
    float *z = malloc(sizeof(float) * (size_t)k * d);
    float *lg = malloc(sizeof(float) * (size_t)k * (size_t)c->vocab_size);
    if (!f || !z || !lg) {
        free(f), free(z), free(lg);
        return -ENOMEM;
    }
    free(m->feat), free(m->z), free(m->logits);
    m->feat = f, m->z = z, m->logits = lg;
    m->max_step = k;
    return 0;
}

int decode_extend(decode_model *m, const int32_t *tokens, int k, int n_logits)
{
    if (k < 1 || n_logits < 0 || n_logits > k)
        return -EINVAL;
    if (m->len + k > m->max_ctx)
        return -ENOSPC;
    int rc;
    if ((rc = target_reserve(&m->tm, k)) < 0 || (rc = reserve_step(m, k)) < 0)
        return rc;
    target_model *tm = &m->tm;
    const hfconfig *c = &tm->cfg;
    target_workspace *w = &tm->ws;
    int d = c->hidden_size, I = c->intermediate_size, H = c->num_attention_heads, KV = c->num_key_value_heads;
    int hd = c->head_dim, kvd = KV * hd, nc = m->n_capture, p0 = m->len, Tk = p0 + k;
    float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)hd);

    if ((rc = target_embed(tm, tokens, k, w->x)) < 0)
        return rc;
    /* query i sits at position p0 + i and sees every cached key up to itself (one
     * document), or the last W of them in sliding layers: target_forward_cpu's ranges */
    for (int i = 0; i < k; i++) {
        int p = p0 + i;
        w->pos[i] = p;
        w->full[i] = (nn_key_ranges){0, p + 1, 0, 0};
        w->sliding[i] = w->full[i];
        if (c->sliding_window > 0)
            w->sliding[i].lo0 = DF_MAX(0, p - c->sliding_window + 1);
    }
    for (int l = 0; l < tm->n_layers; l++) {
        const target_layer *L = &tm->layers[l];
        float *kl = m->kc + (size_t)l * m->max_ctx * kvd, *vl = m->vc + (size_t)l * m->max_ctx * kvd;
        float *knew = kl + (size_t)p0 * kvd, *vnew = vl + (size_t)p0 * kvd;
        nn_rmsnorm(w->a, w->x, L->in_norm, k, d, eps);
        nn_matmul(w->q, w->a, L->wq, L->bq, k, d, H * hd);
        nn_matmul(knew, w->a, L->wk, L->bk, k, d, kvd);
        nn_matmul(vnew, w->a, L->wv, L->bv, k, d, kvd);
        if (L->q_norm) {
            nn_rmsnorm(w->q, w->q, L->q_norm, k * H, hd, eps);
            nn_rmsnorm(knew, knew, L->k_norm, k * KV, hd, eps);
        }
        nn_rope(w->q, w->pos, k, H, hd, tm->inv_freq);
        nn_rope(knew, w->pos, k, KV, hd, tm->inv_freq);
        const nn_key_ranges *rg = c->layer_types[l] == HFCONFIG_SLIDING_ATTENTION ? w->sliding : w->full;
        nn_attention(w->att, w->q, kl, vl, rg, k, Tk, H, KV, hd, scale);
        nn_matmul(w->a, w->att, L->wo, L->bo, k, H * hd, d);
        for (long i = 0; i < (long)k * d; i++)
            w->x[i] += w->a[i];
        nn_rmsnorm(w->a, w->x, L->post_norm, k, d, eps);
        nn_matmul(w->g, w->a, L->w_gate, L->b_gate, k, d, I);
        nn_matmul(w->u, w->a, L->w_up, L->b_up, k, d, I);
        nn_swiglu(w->g, w->g, w->u, (long)k * I);
        nn_matmul(w->a, w->g, L->w_down, L->b_down, k, I, d);
        for (long i = 0; i < (long)k * d; i++)
            w->x[i] += w->a[i];
        int slot = tm->capture_slot[l];
        if (slot >= 0 && slot < nc) /* slot nc is the last layer added by decode_load */
            for (int t = 0; t < k; t++)
                memcpy(m->feat + ((size_t)t * nc + slot) * d, w->x + (size_t)t * d, sizeof(float) * d);
    }
    if (n_logits > 0) {
        const float *xl = w->x + (size_t)(k - n_logits) * d;
        nn_rmsnorm(m->z, xl, m->head.final_norm, n_logits, d, eps);
        nn_matmul(m->logits, m->z, m->head.lm_head, NULL, n_logits, d, c->vocab_size);
    }
    m->len = Tk;
    return 0;
}
