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
    free(m->seq_len), free(m->seq_k), free(m->seq_nl);
    memset(m, 0, sizeof *m);
}

int decode_load(decode_model *m, const char *dir, const int *capture, int n_capture, int max_ctx, char *err,
                size_t errlen)
{
    return decode_load_batch(m, dir, capture, n_capture, max_ctx, 1, err, errlen);
}

int decode_load_batch(decode_model *m, const char *dir, const int *capture, int n_capture, int max_ctx, int n_seq,
                      char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (n_capture < 1 || n_capture >= 64 || max_ctx < 1 || n_seq < 1 || n_seq > DECODE_MAX_SEQ)
        return df_err(err, errlen, -EINVAL,
                      "%s: bad decode setup: %d captured layers, cache of %d tokens, %d sequences (1..%d)", dir,
                      n_capture, max_ctx, n_seq, DECODE_MAX_SEQ);
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
    m->n_seq = n_seq;
    const hfconfig *hc = &m->tm.cfg;
    size_t kvd = (size_t)hc->num_key_value_heads * (size_t)hc->head_dim, rows = (size_t)n_seq * (size_t)max_ctx;
    m->kc = malloc(sizeof(float) * (size_t)L * rows * kvd);
    m->vc = malloc(sizeof(float) * (size_t)L * rows * kvd);
    m->seq_len = calloc((size_t)n_seq, sizeof(int));
    m->seq_k = calloc((size_t)n_seq, sizeof(int));
    m->seq_nl = calloc((size_t)n_seq, sizeof(int));
    if (!m->kc || !m->vc || !m->seq_len || !m->seq_k || !m->seq_nl) {
        rc = df_err(err, errlen, -ENOMEM, "%s: out of memory for a KV cache of %d x %d tokens", dir, n_seq, max_ctx);
        goto fail;
    }
    return 0;
fail:
    decode_free(m);
    return rc;
}

/* Where sequence s's length lives (sequence 0: m->len, what the single-sequence calls use). */
static int *len_of(decode_model *m, int s)
{
    return s ? &m->seq_len[s] : &m->len;
}

int decode_seq_len(const decode_model *m, int s)
{
    return s < 0 || s >= m->n_seq ? -EINVAL : s ? m->seq_len[s] : m->len;
}

void decode_reset(decode_model *m)
{
    m->len = 0;
}

void decode_reset_seq(decode_model *m, int s)
{
    if (s >= 0 && s < m->n_seq)
        *len_of(m, s) = 0;
}

int decode_truncate(decode_model *m, int len)
{
    return decode_truncate_seq(m, 0, len);
}

int decode_truncate_seq(decode_model *m, int s, int len)
{
    if (s < 0 || s >= m->n_seq || len < 0 || len > *len_of(m, s))
        return -EINVAL;
    *len_of(m, s) = len; /* rows >= len are simply overwritten by the next extend */
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

/* The extend of every sequence s with m->seq_k[s] rows (tokens one sequence after the
 * other), logits of the last m->seq_nl[s] rows of each. */
static int extend_rows(decode_model *m, const int32_t *tokens)
{
    int R = 0, NL = 0;
    for (int s = 0; s < m->n_seq; s++) {
        int k = m->seq_k[s], nl = m->seq_nl[s];
        if (k < 0 || nl < 0 || nl > k)
            return -EINVAL;
        if (*len_of(m, s) + k > m->max_ctx)
            return -ENOSPC;
        R += k, NL += nl;
    }
    if (R < 1)
        return -EINVAL;
    int rc;
    if ((rc = target_reserve(&m->tm, R)) < 0 || (rc = reserve_step(m, R)) < 0)
        return rc;
    target_model *tm = &m->tm;
    const hfconfig *c = &tm->cfg;
    target_workspace *w = &tm->ws;
    int d = c->hidden_size, H = c->num_attention_heads, KV = c->num_key_value_heads;
    int hd = c->head_dim, kvd = KV * hd, nc = m->n_capture, Tk = m->n_seq * m->max_ctx;
    float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)hd);
    (void)NL;

    if ((rc = target_embed(tm, tokens, R, w->x)) < 0)
        return rc;
    /* row i of sequence s sits at position p = len(s) + j and sees that sequence's cached
     * keys up to itself (rows s*max_ctx + 0..p), or the last W of them in sliding layers:
     * target_forward_cpu's ranges shifted into the sequence's rows */
    for (int s = 0, i = 0; s < m->n_seq; s++) {
        int base = s * m->max_ctx, p0 = *len_of(m, s);
        for (int j = 0; j < m->seq_k[s]; j++, i++) {
            int p = p0 + j;
            w->pos[i] = p;
            w->full[i] = (nn_key_ranges){base, base + p + 1, 0, 0};
            w->sliding[i] = w->full[i];
            if (c->sliding_window > 0)
                w->sliding[i].lo0 = base + DF_MAX(0, p - c->sliding_window + 1);
        }
    }
    for (int l = 0; l < tm->n_layers; l++) {
        const target_layer *L = &tm->layers[l];
        float *kl = m->kc + (size_t)l * Tk * kvd, *vl = m->vc + (size_t)l * Tk * kvd;
        nn_rmsnorm(w->a, w->x, L->in_norm, R, d, eps);
        nn_matmul(w->q, w->a, L->wq, L->bq, R, d, H * hd);
        if (L->q_norm)
            nn_rmsnorm(w->q, w->q, L->q_norm, R * H, hd, eps);
        nn_rope(w->q, w->pos, R, H, hd, tm->inv_freq);
        /* each sequence's new K/V rows go straight to its cache rows (a row's math is the
         * same whatever rows share the call) */
        for (int s = 0, i = 0; s < m->n_seq; i += m->seq_k[s], s++) {
            int k = m->seq_k[s];
            if (!k)
                continue;
            size_t r0 = (size_t)s * m->max_ctx + (size_t)*len_of(m, s);
            float *knew = kl + r0 * kvd, *vnew = vl + r0 * kvd;
            const float *a = w->a + (size_t)i * d;
            nn_matmul(knew, a, L->wk, L->bk, k, d, kvd);
            nn_matmul(vnew, a, L->wv, L->bv, k, d, kvd);
            if (L->k_norm)
                nn_rmsnorm(knew, knew, L->k_norm, k * KV, hd, eps);
            nn_rope(knew, w->pos + i, k, KV, hd, tm->inv_freq);
        }
        const nn_key_ranges *rg = c->layer_types[l] == HFCONFIG_SLIDING_ATTENTION ? w->sliding : w->full;
        nn_attention(w->att, w->q, kl, vl, rg, R, Tk, H, KV, hd, scale);
        nn_matmul(w->a, w->att, L->wo, L->bo, R, H * hd, d);
        for (long i = 0; i < (long)R * d; i++)
            w->x[i] += w->a[i];
        nn_rmsnorm(w->a, w->x, L->post_norm, R, d, eps);
        const float *mo = target_mlp_cpu(tm, l, R); /* dense or routed experts, row by row */
        for (long i = 0; i < (long)R * d; i++)
            w->x[i] += mo[i];
        int slot = tm->capture_slot[l];
        if (slot >= 0 && slot < nc) /* slot nc is the last layer added by decode_load */
            for (int t = 0; t < R; t++)
                memcpy(m->feat + ((size_t)t * nc + slot) * d, w->x + (size_t)t * d, sizeof(float) * d);
    }
    /* logits of the last seq_nl[s] rows of each sequence, packed in sequence order */
    for (int s = 0, i = 0, o = 0; s < m->n_seq; i += m->seq_k[s], s++) {
        int nl = m->seq_nl[s];
        if (!nl)
            continue;
        const float *xl = w->x + (size_t)(i + m->seq_k[s] - nl) * d;
        nn_rmsnorm(m->z + (size_t)o * d, xl, m->head.final_norm, nl, d, eps);
        nn_matmul(m->logits + (size_t)o * c->vocab_size, m->z + (size_t)o * d, m->head.lm_head, NULL, nl, d,
                  c->vocab_size);
        o += nl;
    }
    for (int s = 0; s < m->n_seq; s++)
        *len_of(m, s) += m->seq_k[s];
    return 0;
}

int decode_extend_seq(decode_model *m, int s, const int32_t *tokens, int k, int n_logits)
{
    if (s < 0 || s >= m->n_seq || k < 1 || n_logits < 0 || n_logits > k)
        return -EINVAL;
    for (int i = 0; i < m->n_seq; i++)
        m->seq_k[i] = i == s ? k : 0, m->seq_nl[i] = i == s ? n_logits : 0;
    return extend_rows(m, tokens);
}

int decode_extend(decode_model *m, const int32_t *tokens, int k, int n_logits)
{
    return decode_extend_seq(m, 0, tokens, k, n_logits);
}

int decode_extend_batch(decode_model *m, const int32_t *tokens, const int *ks)
{
    for (int s = 0; s < m->n_seq; s++) {
        if (ks[s] < 0)
            return -EINVAL;
        m->seq_k[s] = m->seq_nl[s] = ks[s];
    }
    return extend_rows(m, tokens);
}
