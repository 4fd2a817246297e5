/* target_model.c: loading a Qwen3 / Qwen3-MoE / Llama target and its CPU reference forward,
 * wired from the layers of common/nn (one decoder layer = the HF module order: input norm,
 * q/k/v projections, per-head q/k norm (Qwen3), RoPE, GQA attention, o_proj, residual,
 * post-attention norm, SwiGLU MLP or routed experts, residual). See target_model.h for the
 * contract. */
#include "target/target_model.h"

#include "par.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void shape_str(char *buf, size_t len, const int64_t *shape, int ndim)
{
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < len)
        snprintf(buf + o, len - o, "]");
}

/* Where a missing tensor was looked for: the index when safetensors_model_open used one (it
 * prefers the index whenever it exists). */
static const char *model_source(const safetensors_model *st)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", st->dir);
    return access(p, F_OK) == 0 ? "model.safetensors.index.json" : "model.safetensors";
}

typedef struct finite_job {
    const void *data;
    int f32;                             /* else 16-bit (BF16 or F16) */
    uint32_t exp;                        /* the exponent mask: all ones = Inf or NaN */
    uint64_t first_bad[PAR_MAX_THREADS]; /* per part, UINT64_MAX = none */
} finite_job;

/* Elements [lo, hi): blocks of 4096 OR-reduced without a branch (vectorised), the element
 * looked for only in a block that has one. */
static void finite_range(void *ctx, uint64_t lo, uint64_t hi, int part)
{
    finite_job *j = ctx;
    j->first_bad[part] = UINT64_MAX;
    for (uint64_t b = lo; b < hi; b += 4096) {
        uint64_t e = b + 4096 < hi ? b + 4096 : hi;
        uint32_t hit = 0;
        if (j->f32) {
            const uint32_t *p = j->data;
            for (uint64_t i = b; i < e; i++)
                hit |= (p[i] & j->exp) == j->exp;
        } else {
            const uint16_t *p = j->data;
            for (uint64_t i = b; i < e; i++)
                hit |= (uint32_t)((p[i] & j->exp) == j->exp);
        }
        if (!hit)
            continue;
        for (uint64_t i = b; i < e; i++) {
            uint32_t v = j->f32 ? ((const uint32_t *)j->data)[i] : ((const uint16_t *)j->data)[i];
            if ((v & j->exp) == j->exp) {
                j->first_bad[part] = i;
                return;
            }
        }
    }
}

int target_check_finite(const safetensors_tensor *t, const char *fpath, char *err, size_t errlen)
{
    finite_job j = {.data = t->data};
    if (t->dtype == SAFETENSORS_F32)
        j.f32 = 1, j.exp = 0x7f800000u;
    else if (t->dtype == SAFETENSORS_BF16 || t->dtype == SAFETENSORS_F16)
        j.exp = t->dtype == SAFETENSORS_BF16 ? 0x7f80u : 0x7c00u;
    else
        return 0;
    uint64_t n = t->nbytes / (j.f32 ? 4 : 2), bad = UINT64_MAX;
    /* every CPU on a large tensor; the lowest bad index wins whatever the split */
    int parts = par_for(n, 1ull << 22, finite_range, &j);
    for (int k = 0; k < parts && bad == UINT64_MAX; k++)
        bad = j.first_bad[k];
    if (bad == UINT64_MAX)
        return 0;
    float v;
    safetensors_tensor one = *t;
    one.ndim = 1, one.shape[0] = 1, one.nbytes = t->dtype == SAFETENSORS_F32 ? 4 : 2;
    one.data = (const char *)t->data + bad * one.nbytes;
    safetensors_tensor_to_f32(&one, &v);
    return df_err(err, errlen, -EINVAL,
                  "%s: tensor \"%s\": element %llu is %s: a model with NaN/Inf weights is refused", fpath, t->name,
                  (unsigned long long)bad,
                  isnan(v) ? "NaN"
                  : v > 0  ? "+Inf"
                           : "-Inf");
}

int target_find_tensor(const safetensors_model *st, const char *name, int ndim, const int64_t *shape,
                       const safetensors_tensor **out, const char **fpath_out, char *err, size_t errlen)
{
    const char *fpath = NULL;
    const safetensors_tensor *t = safetensors_model_find(st, name, &fpath);
    if (!t)
        return df_err(err, errlen, -ENOENT, "%s: tensor \"%s\" missing (looked in %s)", st->dir, name,
                      model_source(st));
    if (t->dtype != SAFETENSORS_F32 && t->dtype != SAFETENSORS_BF16 && t->dtype != SAFETENSORS_F16)
        return df_err(err, errlen, -EINVAL, "%s: tensor \"%s\": dtype %s, expected F32, BF16 or F16", fpath, name,
                      safetensors_dtype_name(t->dtype));
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = t->shape[i] == shape[i];
    if (!same) {
        char got[128], want[128];
        shape_str(got, sizeof got, t->shape, t->ndim);
        shape_str(want, sizeof want, shape, ndim);
        return df_err(err, errlen, -EINVAL, "%s: tensor \"%s\": shape %s, expected %s", fpath, name, got, want);
    }
    int rc = target_check_finite(t, fpath, err, errlen);
    if (rc < 0)
        return rc;
    *out = t;
    if (fpath_out)
        *fpath_out = fpath;
    return 0;
}

static int find_checked(const safetensors_model *st, const char *name, int ndim, const int64_t *shape,
                        const safetensors_tensor **out, char *err, size_t errlen)
{
    return target_find_tensor(st, name, ndim, shape, out, NULL, err, errlen);
}

/* Load name as a malloc'd fp32 copy of shape [d0] (d1 == 0) or [d0, d1]. */
static int load_f32(const safetensors_model *st, const char *name, int64_t d0, int64_t d1, float **out, char *err,
                    size_t errlen)
{
    int64_t shape[2] = {d0, d1};
    const safetensors_tensor *t;
    int rc = find_checked(st, name, d1 ? 2 : 1, shape, &t, err, errlen);
    if (rc < 0)
        return rc;
    float *buf = malloc(sizeof(float) * (size_t)(d0 * (d1 ? d1 : 1)));
    if (!buf)
        return df_err(err, errlen, -ENOMEM, "%s: out of memory for tensor \"%s\"", st->dir, name);
    safetensors_tensor_to_f32(t, buf); /* dtype checked above */
    *out = buf;
    return 0;
}

/* Convert elements [off, off + n) of t into out (a one-dimensional view into the mapping). */
static void slice_to_f32(const safetensors_tensor *t, size_t off, size_t n, float *out)
{
    safetensors_tensor r = *t;
    size_t es = safetensors_dtype_size(t->dtype);
    r.ndim = 1;
    r.shape[0] = (int64_t)n;
    r.nbytes = n * es;
    r.data = (const char *)t->data + off * es;
    safetensors_tensor_to_f32(&r, out);
}

int target_expert_layout(const safetensors_model *st, int l, char *err, size_t errlen)
{
    char fused[SAFETENSORS_MAX_NAME], per[SAFETENSORS_MAX_NAME];
    snprintf(fused, sizeof fused, "model.layers.%d.mlp.experts.gate_up_proj", l);
    snprintf(per, sizeof per, "model.layers.%d.mlp.experts.0.gate_proj.weight", l);
    int has_fused = safetensors_model_find(st, fused, NULL) != NULL;
    int has_per = safetensors_model_find(st, per, NULL) != NULL;
    if (has_fused && has_per)
        return df_err(err, errlen, -EINVAL, "%s: layer %d holds both \"%s\" and \"%s\": one expert layout expected",
                      st->dir, l, fused, per);
    if (!has_fused && !has_per)
        return df_err(err, errlen, -ENOENT, "%s: tensor \"%s\" missing (looked in %s; nor is the fused \"%s\" there)",
                      st->dir, per, model_source(st), fused);
    return has_fused;
}

/* The router and all experts of sparse layer l, from either layout (target_model.h). */
static int load_experts(target_model *m, int l, char *err, size_t errlen)
{
    const hfconfig *c = &m->cfg;
    const safetensors_model *st = &m->st;
    target_layer *L = &m->layers[l];
    int64_t d = c->hidden_size, E = c->num_experts, F = c->moe_intermediate_size;
    size_t fd = (size_t)F * (size_t)d;
    char n[SAFETENSORS_MAX_NAME], fused[SAFETENSORS_MAX_NAME];
    int rc;
    snprintf(n, sizeof n, "model.layers.%d.mlp.gate.weight", l);
    if ((rc = load_f32(st, n, E, d, &L->w_router, err, errlen)) < 0)
        return rc;
    L->w_gate = malloc(sizeof(float) * (size_t)E * fd);
    L->w_up = malloc(sizeof(float) * (size_t)E * fd);
    L->w_down = malloc(sizeof(float) * (size_t)E * fd);
    if (!L->w_gate || !L->w_up || !L->w_down)
        return df_err(err, errlen, -ENOMEM, "%s: out of memory for the %lld experts of layer %d", st->dir, (long long)E,
                      l);
    int has_fused = target_expert_layout(st, l, err, errlen);
    if (has_fused < 0)
        return has_fused;
    if (!m->expert_layout)
        m->expert_layout = has_fused ? "fused" : "per-expert";
    if (has_fused) {
        snprintf(fused, sizeof fused, "model.layers.%d.mlp.experts.gate_up_proj", l);
        const safetensors_tensor *gu, *dn;
        int64_t sgu[3] = {E, 2 * F, d}, sdn[3] = {E, d, F};
        if ((rc = find_checked(st, fused, 3, sgu, &gu, err, errlen)) < 0)
            return rc;
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.down_proj", l);
        if ((rc = find_checked(st, n, 3, sdn, &dn, err, errlen)) < 0)
            return rc;
        for (int64_t e = 0; e < E; e++) { /* expert e: gate rows first, then up */
            slice_to_f32(gu, (size_t)e * 2 * fd, fd, L->w_gate + (size_t)e * fd);
            slice_to_f32(gu, (size_t)e * 2 * fd + fd, fd, L->w_up + (size_t)e * fd);
        }
        slice_to_f32(dn, 0, (size_t)E * fd, L->w_down);
        return 0;
    }
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    float *dst[3] = {L->w_gate, L->w_up, L->w_down};
    for (int64_t e = 0; e < E; e++)
        for (int i = 0; i < 3; i++) {
            const safetensors_tensor *t;
            int64_t shape[2] = {i == 2 ? d : F, i == 2 ? F : d};
            snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%lld.%s.weight", l, (long long)e, proj[i]);
            if ((rc = find_checked(st, n, 2, shape, &t, err, errlen)) < 0)
                return rc;
            slice_to_f32(t, 0, fd, dst[i] + (size_t)e * fd);
        }
    return 0;
}

static int load_layer(target_model *m, int l, char *err, size_t errlen)
{
    const hfconfig *c = &m->cfg;
    const safetensors_model *st = &m->st;
    target_layer *L = &m->layers[l];
    int64_t d = c->hidden_size, I = c->intermediate_size, hd = c->head_dim;
    int64_t qd = (int64_t)c->num_attention_heads * hd, kvd = (int64_t)c->num_key_value_heads * hd;
    char n[SAFETENSORS_MAX_NAME];
    int rc = 0;
#define LOAD(field, suffix, d0, d1)                                     \
    do {                                                                \
        snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);         \
        if ((rc = load_f32(st, n, d0, d1, &L->field, err, errlen)) < 0) \
            return rc;                                                  \
    } while (0)
    LOAD(in_norm, "input_layernorm.weight", d, 0);
    LOAD(wq, "self_attn.q_proj.weight", qd, d);
    LOAD(wk, "self_attn.k_proj.weight", kvd, d);
    LOAD(wv, "self_attn.v_proj.weight", kvd, d);
    LOAD(wo, "self_attn.o_proj.weight", d, qd);
    if (c->attention_bias) {
        LOAD(bq, "self_attn.q_proj.bias", qd, 0);
        LOAD(bk, "self_attn.k_proj.bias", kvd, 0);
        LOAD(bv, "self_attn.v_proj.bias", kvd, 0);
        LOAD(bo, "self_attn.o_proj.bias", d, 0);
    }
    if (c->qk_norm) {
        LOAD(q_norm, "self_attn.q_norm.weight", hd, 0);
        LOAD(k_norm, "self_attn.k_norm.weight", hd, 0);
    }
    LOAD(post_norm, "post_attention_layernorm.weight", d, 0);
    if (hfconfig_layer_is_moe(c, l)) {
        L->moe = 1;
        return load_experts(m, l, err, errlen);
    }
    LOAD(w_gate, "mlp.gate_proj.weight", I, d);
    LOAD(w_up, "mlp.up_proj.weight", I, d);
    LOAD(w_down, "mlp.down_proj.weight", d, I);
    if (c->mlp_bias) {
        LOAD(b_gate, "mlp.gate_proj.bias", I, 0);
        LOAD(b_up, "mlp.up_proj.bias", I, 0);
        LOAD(b_down, "mlp.down_proj.bias", d, 0);
    }
#undef LOAD
    return 0;
}

static void ws_free(target_workspace *w)
{
    free(w->x), free(w->a), free(w->q), free(w->att), free(w->k), free(w->v), free(w->g), free(w->u);
    free(w->full), free(w->sliding), free(w->pos);
    free(w->moe_logits), free(w->moe_probs), free(w->moe_idx), free(w->moe_w), free(w->moe_out);
    free(w->moe_scratch), free(w->moe_rows);
    memset(w, 0, sizeof *w);
}

int target_reserve(target_model *m, int max_T)
{
    if (max_T <= m->ws.max_T)
        return 0;
    ws_free(&m->ws);
    const hfconfig *c = &m->cfg;
    size_t T = (size_t)max_T, d = (size_t)c->hidden_size, I = (size_t)c->intermediate_size;
    size_t qd = (size_t)c->num_attention_heads * (size_t)c->head_dim;
    size_t kvd = (size_t)c->num_key_value_heads * (size_t)c->head_dim;
    target_workspace *w = &m->ws;
    w->x = malloc(sizeof(float) * T * d);
    w->a = malloc(sizeof(float) * T * DF_MAX(d, qd));
    w->q = malloc(sizeof(float) * T * qd);
    w->att = malloc(sizeof(float) * T * qd);
    w->k = malloc(sizeof(float) * T * kvd);
    w->v = malloc(sizeof(float) * T * kvd);
    w->g = malloc(sizeof(float) * T * I);
    w->u = malloc(sizeof(float) * T * I);
    w->full = malloc(sizeof(nn_key_ranges) * T);
    w->sliding = malloc(sizeof(nn_key_ranges) * T);
    w->pos = malloc(sizeof(int32_t) * T);
    if (!w->x || !w->a || !w->q || !w->att || !w->k || !w->v || !w->g || !w->u || !w->full || !w->sliding || !w->pos) {
        ws_free(w);
        return -ENOMEM;
    }
    if (c->n_moe_layers) {
        size_t E = (size_t)c->num_experts, k = (size_t)c->num_experts_per_tok;
        w->moe_logits = malloc(sizeof(float) * T * E);
        w->moe_probs = malloc(sizeof(float) * T * E);
        w->moe_idx = malloc(sizeof(int32_t) * T * k);
        w->moe_w = malloc(sizeof(float) * T * k);
        w->moe_out = malloc(sizeof(float) * T * d);
        w->moe_scratch = malloc(sizeof(float) * nn_moe_scratch_floats(max_T, (int)d, c->moe_intermediate_size));
        w->moe_rows = malloc(sizeof(int32_t) * T);
        if (!w->moe_logits || !w->moe_probs || !w->moe_idx || !w->moe_w || !w->moe_out || !w->moe_scratch ||
            !w->moe_rows) {
            ws_free(w);
            return -ENOMEM;
        }
    }
    w->max_T = max_T;
    return 0;
}

void target_free(target_model *m)
{
    if (!m)
        return;
    for (int l = 0; m->layers && l < m->n_layers; l++) {
        target_layer *L = &m->layers[l];
        float *all[] = {L->in_norm, L->wq,     L->wk,     L->wv,     L->wo,        L->bq,     L->bk,
                        L->bv,      L->bo,     L->q_norm, L->k_norm, L->post_norm, L->w_gate, L->w_up,
                        L->w_down,  L->b_gate, L->b_up,   L->b_down, L->w_router};
        for (unsigned i = 0; i < DF_ARRAY_LEN(all); i++)
            free(all[i]);
    }
    free(m->layers);
    free(m->capture);
    free(m->capture_slot);
    free(m->inv_freq);
    ws_free(&m->ws);
    safetensors_model_close(&m->st);
    hfconfig_free(&m->cfg);
    memset(m, 0, sizeof *m);
}

int target_exit_code(int rc)
{
    return (rc == -EINVAL || rc == -ENOENT || rc == -ENOTDIR || rc == -EACCES) ? DF_EXIT_PERM : DF_EXIT_TEMP;
}

int target_load(target_model *m, const char *dir, const int *capture_layers, int n_capture, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    int rc = hfconfig_load(&m->cfg, dir, err, errlen);
    if (rc < 0)
        return rc;
    const hfconfig *c = &m->cfg;
    if (n_capture < 1) {
        rc = df_err(err, errlen, -EINVAL, "%s: no layers to capture", dir);
        goto fail;
    }
    int last = -1;
    for (int i = 0; i < n_capture; i++) {
        int l = capture_layers[i];
        if (l < 0 || l >= c->num_hidden_layers) {
            rc = df_err(err, errlen, -EINVAL, "%s: capture layer %d out of range: the model has %d layers (0..%d)", dir,
                        l, c->num_hidden_layers, c->num_hidden_layers - 1);
            goto fail;
        }
        for (int j = 0; j < i; j++)
            if (capture_layers[j] == l) {
                rc = df_err(err, errlen, -EINVAL, "%s: capture layer %d listed twice", dir, l);
                goto fail;
            }
        last = DF_MAX(last, l);
    }
    m->n_layers = last + 1;
    m->n_capture = n_capture;
    m->capture = malloc(sizeof(int) * (size_t)n_capture);
    m->capture_slot = malloc(sizeof(int) * (size_t)m->n_layers);
    m->layers = calloc((size_t)m->n_layers, sizeof *m->layers);
    m->inv_freq = malloc(sizeof(float) * (size_t)(c->head_dim / 2));
    if (!m->capture || !m->capture_slot || !m->layers || !m->inv_freq) {
        rc = df_err(err, errlen, -ENOMEM, "%s: out of memory", dir);
        goto fail;
    }
    for (int l = 0; l < m->n_layers; l++)
        m->capture_slot[l] = -1;
    for (int i = 0; i < n_capture; i++) {
        m->capture[i] = capture_layers[i];
        m->capture_slot[capture_layers[i]] = i;
    }
    if ((rc = safetensors_model_open(&m->st, dir, err, errlen)) < 0)
        goto fail;
    int64_t eshape[2] = {c->vocab_size, c->hidden_size};
    if ((rc = find_checked(&m->st, "model.embed_tokens.weight", 2, eshape, &m->embed, err, errlen)) < 0)
        goto fail;
    for (int l = 0; l < m->n_layers; l++)
        if ((rc = load_layer(m, l, err, errlen)) < 0)
            goto fail;
    nn_rope_inv_freq(m->inv_freq, c->head_dim, c->rope_theta, &c->rope_scaling);
    if (m->expert_layout) /* which checkpoint layout was read, once per load */
        df_log("%s: mixture of experts: %d of %d layers routed (%d experts, top %d%s), weights in the %s layout", dir,
               c->n_moe_layers, c->num_hidden_layers, c->num_experts, c->num_experts_per_tok,
               c->norm_topk_prob ? ", renormalised" : "", m->expert_layout);
    return 0;
fail:
    target_free(m);
    return rc;
}

int target_embed(const target_model *m, const int32_t *tokens, int T, float *out)
{
    int d = m->cfg.hidden_size;
    size_t row = (size_t)d * safetensors_dtype_size(m->embed->dtype);
    for (int t = 0; t < T; t++) {
        if (tokens[t] < 0 || tokens[t] >= m->cfg.vocab_size)
            return -ERANGE;
        safetensors_tensor r = *m->embed; /* a one-row view into the mapping */
        r.ndim = 1;
        r.shape[0] = d;
        r.nbytes = row;
        r.data = (const char *)m->embed->data + (size_t)tokens[t] * row;
        safetensors_tensor_to_f32(&r, out + (size_t)t * d);
    }
    return 0;
}

const float *target_mlp_cpu(target_model *m, int l, int T)
{
    const hfconfig *c = &m->cfg;
    const target_layer *L = &m->layers[l];
    target_workspace *w = &m->ws;
    int d = c->hidden_size;
    if (L->moe) {
        int E = c->num_experts, k = c->num_experts_per_tok, F = c->moe_intermediate_size;
        nn_moe_route(w->moe_idx, w->moe_w, w->moe_logits, w->moe_probs, w->a, L->w_router, T, d, E, k,
                     c->norm_topk_prob);
        nn_moe_experts(w->moe_out, w->a, w->moe_idx, w->moe_w, L->w_gate, L->w_up, L->w_down, T, d, F, E, k,
                       w->moe_scratch, w->moe_rows);
        return w->moe_out;
    }
    int I = c->intermediate_size;
    nn_matmul(w->g, w->a, L->w_gate, L->b_gate, T, d, I);
    nn_matmul(w->u, w->a, L->w_up, L->b_up, T, d, I);
    nn_swiglu(w->g, w->g, w->u, (long)T * I);
    nn_matmul(w->a, w->g, L->w_down, L->b_down, T, I, d);
    return w->a;
}

int target_forward_cpu(target_model *m, const int32_t *tokens, const int32_t *doc_starts, int n_docs,
                       float *out_capture)
{
    if (n_docs < 1 || doc_starts[0] != 0)
        return -EINVAL;
    for (int i = 0; i < n_docs; i++)
        if (doc_starts[i + 1] <= doc_starts[i])
            return -EINVAL;
    int T = doc_starts[n_docs], rc;
    if ((rc = target_reserve(m, T)) < 0)
        return rc;
    const hfconfig *c = &m->cfg;
    target_workspace *w = &m->ws;
    int d = c->hidden_size, H = c->num_attention_heads, KV = c->num_key_value_heads;
    int hd = c->head_dim, nc = m->n_capture;
    float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)hd);

    if ((rc = target_embed(m, tokens, T, w->x)) < 0)
        return rc;
    nn_packed_causal_ranges(w->full, w->pos, doc_starts, n_docs);
    /* sliding layers (window W): keys [max(doc start, t - W + 1), t] */
    for (int t = 0; t < T; t++) {
        w->sliding[t] = w->full[t];
        if (c->sliding_window > 0)
            w->sliding[t].lo0 = DF_MAX(w->full[t].lo0, t - c->sliding_window + 1);
    }

    for (int l = 0; l < m->n_layers; l++) {
        const target_layer *L = &m->layers[l];
        /* attention block */
        nn_rmsnorm(w->a, w->x, L->in_norm, T, d, eps);
        nn_matmul(w->q, w->a, L->wq, L->bq, T, d, H * hd);
        nn_matmul(w->k, w->a, L->wk, L->bk, T, d, KV * hd);
        nn_matmul(w->v, w->a, L->wv, L->bv, T, d, KV * hd);
        if (L->q_norm) { /* Qwen3: RMSNorm over each head's head_dim, before RoPE */
            nn_rmsnorm(w->q, w->q, L->q_norm, T * H, hd, eps);
            nn_rmsnorm(w->k, w->k, L->k_norm, T * KV, hd, eps);
        }
        nn_rope(w->q, w->pos, T, H, hd, m->inv_freq);
        nn_rope(w->k, w->pos, T, KV, hd, m->inv_freq);
        const nn_key_ranges *rg = c->layer_types[l] == HFCONFIG_SLIDING_ATTENTION ? w->sliding : w->full;
        nn_attention(w->att, w->q, w->k, w->v, rg, T, T, H, KV, hd, scale);
        nn_matmul(w->a, w->att, L->wo, L->bo, T, H * hd, d);
        for (long i = 0; i < (long)T * d; i++)
            w->x[i] += w->a[i];
        /* MLP block (dense or routed experts) */
        nn_rmsnorm(w->a, w->x, L->post_norm, T, d, eps);
        const float *mo = target_mlp_cpu(m, l, T);
        for (long i = 0; i < (long)T * d; i++)
            w->x[i] += mo[i];

        int slot = m->capture_slot[l];
        if (slot >= 0) /* the residual stream after layer l = HF hidden_states[l+1] */
            for (int t = 0; t < T; t++)
                memcpy(out_capture + ((size_t)t * nc + slot) * d, w->x + (size_t)t * d, sizeof(float) * d);
    }
    return 0;
}

/* ---- embeddings for the drafter ------------------------------------------------- */

void target_embeddings_free(target_embeddings *e)
{
    if (!e)
        return;
    if (e->lm_head != e->embed)
        free(e->lm_head);
    free(e->embed);
    free(e->final_norm);
    memset(e, 0, sizeof *e);
}

int target_load_embeddings(target_embeddings *e, const char *dir, int want_final_norm, char *err, size_t errlen)
{
    memset(e, 0, sizeof *e);
    hfconfig c;
    safetensors_model st;
    memset(&st, 0, sizeof st);
    int rc = hfconfig_load(&c, dir, err, errlen);
    if (rc < 0)
        return rc;
    if ((rc = safetensors_model_open(&st, dir, err, errlen)) < 0)
        goto out;
    e->vocab = c.vocab_size;
    e->hidden = c.hidden_size;
    e->tied = c.tie_word_embeddings;
    if ((rc = load_f32(&st, "model.embed_tokens.weight", c.vocab_size, c.hidden_size, &e->embed, err, errlen)) < 0)
        goto out;
    if (e->tied)
        e->lm_head = e->embed; /* tied: lm_head IS the embedding matrix (docs/dflash_spec.md) */
    else if ((rc = load_f32(&st, "lm_head.weight", c.vocab_size, c.hidden_size, &e->lm_head, err, errlen)) < 0)
        goto out;
    if (want_final_norm && (rc = load_f32(&st, "model.norm.weight", c.hidden_size, 0, &e->final_norm, err, errlen)) < 0)
        goto out;
out:
    safetensors_model_close(&st);
    hfconfig_free(&c);
    if (rc < 0)
        target_embeddings_free(e);
    return rc;
}
