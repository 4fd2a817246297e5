/* target_model_cuda.cu: the CUDA target forward (target_*_cuda), wired from the nn_*_cuda
 * layers and the one GEMM (nn_gemm_run_cuda) in the HF module order of one decoder layer.
 * See target_model_cuda.h for the contract and docs/target_cuda.md for the kernels, fusions
 * and FLOP count.
 *
 * A sparse layer's MLP is target_moe_mlp_cuda (routed experts, nn/moe.cu), shared with the
 * KV-cached decode (target_decode_cuda.c), which also uses its row-exact form.
 *
 * The residual step is shifted by half a layer so that every add is fused into the norm
 * that follows it: layer l starts with x += y (the previous MLP output), writes layer
 * l-1's capture from the updated x, and normalises with input_layernorm in the same pass;
 * after the last layer one more pass adds the last MLP output and writes its capture. */
#include "target/target_model_cuda.h"

extern "C" {
#include "nn/nn.h"
#include "target/target_model.h"
#include "util.h"
}
#include "target/decode_kernels_cuda.h" /* (its own extern "C") the row-exact router of decode steps */

#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"

static size_t align256(size_t n)
{
    return (n + 255) & ~(size_t)255;
}

/* Bump allocator over one device block: pass 1 (base NULL) only counts bytes. */
typedef struct bump {
    char *base;
    size_t off;
} bump;
static void *bump_take(bump *b, size_t bytes)
{
    void *p = b->base ? b->base + b->off : NULL;
    b->off += align256(bytes);
    return p;
}

static void carve_weights(target_model_cuda *m, bump *b)
{
    size_t d = m->d, I = m->I, hd = m->hd, qkv_n = (size_t)(m->H + 2 * m->KV) * hd, qd = (size_t)m->H * hd;
    size_t E = m->E, F = m->F;
    m->embed = (nn_bf16_cuda *)bump_take(b, (size_t)m->V * d * 2);
    m->inv_freq = (float *)bump_take(b, sizeof(float) * hd / 2);
    for (int l = 0; l < m->n_layers; l++) {
        target_layer_cuda *L = &m->layers[l];
        L->w_qkv = (nn_bf16_cuda *)bump_take(b, qkv_n * d * 2);
        L->w_o = (nn_bf16_cuda *)bump_take(b, d * qd * 2);
        if (L->moe) { /* every expert resident: any token may pick any of them */
            L->w_router = (nn_bf16_cuda *)bump_take(b, E * d * 2);
            L->w_gu = (nn_bf16_cuda *)bump_take(b, E * 2 * F * d * 2);
            L->w_down = (nn_bf16_cuda *)bump_take(b, E * d * F * 2);
        } else {
            L->w_gu = (nn_bf16_cuda *)bump_take(b, 2 * I * d * 2);
            L->w_down = (nn_bf16_cuda *)bump_take(b, d * I * 2);
        }
        L->in_norm = (float *)bump_take(b, sizeof(float) * d);
        L->post_norm = (float *)bump_take(b, sizeof(float) * d);
        L->q_norm = m->qk_norm ? (float *)bump_take(b, sizeof(float) * hd) : NULL;
        L->k_norm = m->qk_norm ? (float *)bump_take(b, sizeof(float) * hd) : NULL;
        L->b_qkv = m->attention_bias ? (nn_bf16_cuda *)bump_take(b, qkv_n * 2) : NULL;
        L->b_o = m->attention_bias ? (nn_bf16_cuda *)bump_take(b, d * 2) : NULL;
        L->b_gu = m->mlp_bias && !L->moe ? (nn_bf16_cuda *)bump_take(b, 2 * I * 2) : NULL;
        L->b_down = m->mlp_bias && !L->moe ? (nn_bf16_cuda *)bump_take(b, d * 2) : NULL;
    }
}

static void carve_acts(target_model_cuda *m, bump *b)
{
    size_t T = m->max_T, d = m->d, I = m->I, hd = m->hd;
    m->x = (float *)bump_take(b, sizeof(float) * T * d);
    m->a = (nn_bf16_cuda *)bump_take(b, 2 * T * d);
    m->y = (nn_bf16_cuda *)bump_take(b, 2 * T * d);
    m->qkv = (nn_bf16_cuda *)bump_take(b, 2 * T * (m->H + 2 * m->KV) * hd);
    m->att = (nn_bf16_cuda *)bump_take(b, 2 * T * m->H * hd);
    /* the dense MLP's activations only when a dense layer runs (Qwen3-30B-A3B has none, and
     * its config's intermediate_size would make them 300 MB at 8192 tokens) */
    int dense = m->n_layers > m->n_moe;
    m->gu = dense ? (nn_bf16_cuda *)bump_take(b, 2 * T * 2 * I) : NULL;
    m->h = dense ? (nn_bf16_cuda *)bump_take(b, 2 * T * I) : NULL;
    m->pos = (int32_t *)bump_take(b, sizeof(int32_t) * T);
    m->bad_token = (int *)bump_take(b, sizeof(int));
    if (m->n_moe) {
        size_t tk = T * (size_t)m->topk;
        m->moe_logits = (float *)bump_take(b, sizeof(float) * T * m->E);
        size_t wb = nn_moe_work_carve_cuda(&m->moe, NULL, (int)T, m->E, m->topk);
        nn_moe_work_carve_cuda(&m->moe, bump_take(b, wb), (int)T, m->E, m->topk);
        m->moe_h = (nn_bf16_cuda *)bump_take(b, 2 * tk * m->F);
        m->moe_yp = (nn_bf16_cuda *)bump_take(b, 2 * tk * d);
    }
}

void target_free_cuda(target_model_cuda *m)
{
    if (m->weights)
        cudaFree(m->weights);
    if (m->acts)
        cudaFree(m->acts);
    nn_gemm_destroy_cuda(m->gemm);
    free(m->capture);
    free(m->capture_slot);
    free(m->layers);
    memset(m, 0, sizeof *m);
}

int target_init_cuda(target_model_cuda *m, const hfconfig *c, const int *capture, int n_capture, int max_T, char *err,
                     size_t errlen)
{
    memset(m, 0, sizeof *m);
    int rc = 0, last = -1;
    float *inv = NULL;
    if (n_capture < 1)
        return df_err(err, errlen, -EINVAL, "no layers to capture");
    if (max_T < 1)
        return df_err(err, errlen, -EINVAL, "max_T %d: must be >= 1", max_T);
    /* routed experts: the limits of nn/moe.cu's kernels (16-byte loads, the router's warp) */
    if (c->n_moe_layers > 0 && (c->num_experts > NN_MOE_MAX_EXPERTS || c->num_experts_per_tok > NN_MOE_MAX_TOPK ||
                                c->hidden_size % 8 || c->moe_intermediate_size % 8 || c->moe_intermediate_size <= 0))
        return df_err(err, errlen, -EINVAL,
                      "%s: %d experts, top %d, hidden %d, moe_intermediate_size %d: the CUDA experts take at "
                      "most %d experts, top %d, and widths that are multiples of 8",
                      c->architecture, c->num_experts, c->num_experts_per_tok, c->hidden_size, c->moe_intermediate_size,
                      NN_MOE_MAX_EXPERTS, NN_MOE_MAX_TOPK);
    if (c->head_dim <= 0 || c->head_dim % 2 || c->head_dim > 256)
        return df_err(err, errlen, -EINVAL, "head_dim %d: the CUDA forward needs an even head_dim <= 256", c->head_dim);
    if (c->num_key_value_heads <= 0 || c->num_attention_heads % c->num_key_value_heads)
        return df_err(err, errlen, -EINVAL, "num_key_value_heads %d does not divide num_attention_heads %d",
                      c->num_key_value_heads, c->num_attention_heads);
    for (int i = 0; i < n_capture; i++) {
        int l = capture[i];
        if (l < 0 || l >= c->num_hidden_layers)
            return df_err(err, errlen, -EINVAL, "capture layer %d out of range: the model has %d layers (0..%d)", l,
                          c->num_hidden_layers, c->num_hidden_layers - 1);
        for (int j = 0; j < i; j++)
            if (capture[j] == l)
                return df_err(err, errlen, -EINVAL, "capture layer %d listed twice", l);
        last = DF_MAX(last, l);
    }
    m->d = c->hidden_size, m->I = c->intermediate_size, m->H = c->num_attention_heads;
    m->KV = c->num_key_value_heads, m->hd = c->head_dim, m->V = c->vocab_size;
    m->n_layers = last + 1, m->n_capture = n_capture, m->max_T = max_T;
    m->qk_norm = c->qk_norm, m->attention_bias = c->attention_bias, m->mlp_bias = c->mlp_bias;
    m->eps = (float)c->rms_norm_eps;
    m->capture = (int *)malloc(sizeof(int) * (size_t)n_capture);
    m->capture_slot = (int *)malloc(sizeof(int) * (size_t)m->n_layers);
    m->layers = (target_layer_cuda *)calloc((size_t)m->n_layers, sizeof(target_layer_cuda));
    inv = (float *)malloc(sizeof(float) * (size_t)(m->hd / 2));
    if (!m->capture || !m->capture_slot || !m->layers || !inv) {
        rc = df_err(err, errlen, -ENOMEM, "out of host memory");
        goto fail;
    }
    for (int l = 0; l < m->n_layers; l++)
        m->capture_slot[l] = -1;
    for (int i = 0; i < n_capture; i++) {
        m->capture[i] = capture[i];
        m->capture_slot[capture[i]] = i;
    }
    for (int l = 0; l < m->n_layers; l++)
        m->layers[l].window = c->layer_types && c->layer_types[l] == HFCONFIG_SLIDING_ATTENTION && c->sliding_window > 0
                                  ? c->sliding_window
                                  : 0;
    for (int l = 0; l < m->n_layers; l++)
        if ((m->layers[l].moe = hfconfig_layer_is_moe(c, l)))
            m->n_moe++;
    if (m->n_moe) {
        m->E = c->num_experts, m->topk = c->num_experts_per_tok, m->F = c->moe_intermediate_size;
        m->norm_topk = c->norm_topk_prob;
    }
    m->moe_kernel = NN_MOE_GROUPED;
    {
        bump b = {NULL, 0};
        carve_weights(m, &b);
        m->weight_bytes = b.off;
        CUDA_ALLOC_TRY_GOTO(cudaMalloc(&m->weights, m->weight_bytes), err, errlen, rc, fail);
        b = (bump){(char *)m->weights, 0};
        carve_weights(m, &b);

        bump a = {NULL, 0};
        carve_acts(m, &a);
        m->act_bytes = a.off;
        CUDA_ALLOC_TRY_GOTO(cudaMalloc(&m->acts, m->act_bytes), err, errlen, rc, fail);
        a = (bump){(char *)m->acts, 0};
        carve_acts(m, &a);
        CUDA_ALLOC_TRY_GOTO(cudaMemset(m->bad_token, 0, sizeof(int)), err, errlen, rc, fail);
        if (m->n_moe)
            CUDA_ALLOC_TRY_GOTO(cudaMemset(m->moe.stat, 0, 2 * sizeof(long long)), err, errlen, rc, fail);
    }
    /* the same frequencies as the CPU path (llama3 scaling included) */
    nn_rope_inv_freq(inv, m->hd, c->rope_theta, &c->rope_scaling);
    CUDA_ALLOC_TRY_GOTO(cudaMemcpy(m->inv_freq, inv, sizeof(float) * (size_t)(m->hd / 2), cudaMemcpyHostToDevice), err,
                        errlen, rc, fail);
    free(inv);
    inv = NULL;
    CUDA_TRY_RC_GOTO(nn_gemm_create_cuda(&m->gemm, (size_t)32 << 20, err, errlen), rc, fail);
    m->attn_tile = -1;
    for (int i = 0; i < 4; i++)
        m->gemm_rank[i] = -1;
    {
        int dev = 0;
        struct cudaDeviceProp prop;
        CUDA_TRY_GOTO(cudaGetDevice(&dev), err, errlen, rc, fail);
        CUDA_TRY_GOTO(cudaGetDeviceProperties(&prop, dev), err, errlen, rc, fail);
        m->dev_major = prop.major, m->dev_minor = prop.minor, m->dev_sms = prop.multiProcessorCount;
    }
    return 0;
fail:
    free(inv);
    target_free_cuda(m);
    return rc;
}

/* ---- weights from an HF model ------------------------------------------------------ */

/* Host staging buffers, grown on demand, freed at the end of target_load_weights_cuda. */
typedef struct stage {
    float *f;
    uint16_t *h;
    size_t cap;
} stage;

static int stage_reserve(stage *s, size_t n)
{
    if (n <= s->cap)
        return 0;
    free(s->f);
    free(s->h);
    s->f = (float *)malloc(sizeof(float) * n);
    s->h = (uint16_t *)malloc(sizeof(uint16_t) * n);
    s->cap = s->f && s->h ? n : 0;
    return s->cap ? 0 : -ENOMEM;
}

/* Find name (ndim 1..3 dims of shape, a float dtype), convert and copy it to dst on the
 * device: bf16 (as_f32 == 0; bf16 files copy as is) or fp32. */
static int upload_nd(const safetensors_model *st, stage *sg, const char *name, int ndim, const int64_t *want, void *dst,
                     int as_f32, char *err, size_t errlen)
{
    const char *fpath = NULL;
    const safetensors_tensor *t;
    int frc =
        target_find_tensor(st, name, ndim, want, &t, &fpath, err, errlen); /* on the host mapping, before the upload */
    if (frc < 0)
        return frc;
    size_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= (size_t)want[i];
    const void *src;
    size_t bytes;
    if (!as_f32 && t->dtype == SAFETENSORS_BF16) {
        src = t->data;
        bytes = n * 2;
    } else {
        if (stage_reserve(sg, n) < 0)
            return df_err(err, errlen, -ENOMEM, "%s: out of host memory staging tensor \"%s\"", fpath, name);
        safetensors_tensor_to_f32(t, sg->f);
        if (as_f32) {
            src = sg->f;
            bytes = n * sizeof(float);
        } else {
            safetensors_f32_to_bf16_n(sg->h, sg->f, n);
            src = sg->h;
            bytes = n * 2;
        }
    }
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess)
        return df_err(err, errlen, -EIO, "%s: tensor \"%s\": cudaMemcpy: %s", fpath, name, cudaGetErrorString(e));
    return 0;
}

/* upload_nd of shape [d0] (d1 == 0) or [d0, d1] */
static int upload(const safetensors_model *st, stage *sg, const char *name, int64_t d0, int64_t d1, void *dst,
                  int as_f32, char *err, size_t errlen)
{
    int64_t want[2] = {d0, d1};
    return upload_nd(st, sg, name, d1 ? 2 : 1, want, dst, as_f32, err, errlen);
}

/* The router and every expert of sparse layer l, from either checkpoint layout
 * (target_expert_layout, target_find_tensor: the CPU loader's checks and messages). In the device layout
 * w_gu [E, 2F, d] is the fused gate_up_proj itself; per-expert tensors go to their rows. */
static int upload_experts(const target_model_cuda *m, const safetensors_model *st, stage *sg, int l, char *err,
                          size_t errlen)
{
    const target_layer_cuda *L = &m->layers[l];
    const int64_t d = m->d, E = m->E, F = m->F;
    char n[SAFETENSORS_MAX_NAME];
    int rc;
    snprintf(n, sizeof n, "model.layers.%d.mlp.gate.weight", l);
    if ((rc = upload(st, sg, n, E, d, L->w_router, 0, err, errlen)) < 0)
        return rc;
    int has_fused = target_expert_layout(st, l, err, errlen);
    if (has_fused < 0)
        return has_fused;
    if (has_fused) {
        int64_t sgu[3] = {E, 2 * F, d}, sdn[3] = {E, d, F};
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.gate_up_proj", l);
        if ((rc = upload_nd(st, sg, n, 3, sgu, L->w_gu, 0, err, errlen)) < 0)
            return rc;
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.down_proj", l);
        return upload_nd(st, sg, n, 3, sdn, L->w_down, 0, err, errlen);
    }
    for (int64_t e = 0; e < E; e++) {
        nn_bf16_cuda *gu = L->w_gu + (size_t)e * 2 * F * d;
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%lld.gate_proj.weight", l, (long long)e);
        if ((rc = upload(st, sg, n, F, d, gu, 0, err, errlen)) < 0)
            return rc;
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%lld.up_proj.weight", l, (long long)e);
        if ((rc = upload(st, sg, n, F, d, gu + (size_t)F * d, 0, err, errlen)) < 0)
            return rc;
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%lld.down_proj.weight", l, (long long)e);
        if ((rc = upload(st, sg, n, d, F, L->w_down + (size_t)e * d * F, 0, err, errlen)) < 0)
            return rc;
    }
    return 0;
}

int target_load_weights_cuda(target_model_cuda *m, const safetensors_model *st, char *err, size_t errlen)
{
    stage sg = {NULL, NULL, 0};
    int rc = 0;
    int64_t d = m->d, I = m->I, hd = m->hd, qd = (int64_t)m->H * hd, kvd = (int64_t)m->KV * hd;
    char n[SAFETENSORS_MAX_NAME];
#define UP(suffix, d0, d1, dst, f32)                                                                                 \
    CUDA_TRY_RC_GOTO(                                                                                                \
        upload(st, &sg, (snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix), n), d0, d1, dst, f32, err, errlen), \
        rc, out)
    CUDA_TRY_RC_GOTO(upload(st, &sg, "model.embed_tokens.weight", m->V, d, m->embed, 0, err, errlen), rc, out);
    for (int l = 0; l < m->n_layers; l++) {
        target_layer_cuda *L = &m->layers[l];
        UP("input_layernorm.weight", d, 0, L->in_norm, 1);
        UP("self_attn.q_proj.weight", qd, d, L->w_qkv, 0);
        UP("self_attn.k_proj.weight", kvd, d, L->w_qkv + qd * d, 0);
        UP("self_attn.v_proj.weight", kvd, d, L->w_qkv + (qd + kvd) * d, 0);
        UP("self_attn.o_proj.weight", d, qd, L->w_o, 0);
        if (m->attention_bias) {
            UP("self_attn.q_proj.bias", qd, 0, L->b_qkv, 0);
            UP("self_attn.k_proj.bias", kvd, 0, L->b_qkv + qd, 0);
            UP("self_attn.v_proj.bias", kvd, 0, L->b_qkv + qd + kvd, 0);
            UP("self_attn.o_proj.bias", d, 0, L->b_o, 0);
        }
        if (m->qk_norm) {
            UP("self_attn.q_norm.weight", hd, 0, L->q_norm, 1);
            UP("self_attn.k_norm.weight", hd, 0, L->k_norm, 1);
        }
        UP("post_attention_layernorm.weight", d, 0, L->post_norm, 1);
        if (L->moe) {
            CUDA_TRY_RC_GOTO(upload_experts(m, st, &sg, l, err, errlen), rc, out);
            continue;
        }
        UP("mlp.gate_proj.weight", I, d, L->w_gu, 0);
        UP("mlp.up_proj.weight", I, d, L->w_gu + I * d, 0);
        UP("mlp.down_proj.weight", d, I, L->w_down, 0);
        if (m->mlp_bias) {
            UP("mlp.gate_proj.bias", I, 0, L->b_gu, 0);
            UP("mlp.up_proj.bias", I, 0, L->b_gu + I, 0);
            UP("mlp.down_proj.bias", d, 0, L->b_down, 0);
        }
    }
#undef UP
out:
    free(sg.f);
    free(sg.h);
    return rc;
}

int target_load_cuda(target_model_cuda *m, const char *dir, const int *capture, int n_capture, int max_T, char *err,
                     size_t errlen)
{
    hfconfig cfg;
    safetensors_model st;
    memset(&cfg, 0, sizeof cfg);
    memset(&st, 0, sizeof st);
    memset(m, 0, sizeof *m);
    int rc = hfconfig_load(&cfg, dir, err, errlen);
    if (rc < 0)
        return rc;
    if ((rc = safetensors_model_open(&st, dir, err, errlen)) < 0)
        goto out;
    if ((rc = target_init_cuda(m, &cfg, capture, n_capture, max_T, err, errlen)) < 0)
        goto out;
    if ((rc = target_load_weights_cuda(m, &st, err, errlen)) < 0)
        target_free_cuda(m);
out:
    safetensors_model_close(&st);
    hfconfig_free(&cfg);
    return rc;
}

int target_randomize_cuda(target_model_cuda *m, uint64_t seed, char *err, size_t errlen)
{
    const float w_scale = 0.02f * 1.7320508f; /* uniform with std 0.02 */
    size_t d = m->d, I = m->I, hd = m->hd, qkv_n = (size_t)(m->H + 2 * m->KV) * hd, qd = (size_t)m->H * hd;
    uint64_t k = seed * 1000003ull;
    CUDA_TRY_RC(nn_fill_uniform_bf16_cuda(m->embed, (size_t)m->V * d, k++, 1.0f, 0, err, errlen));
    for (int l = 0; l < m->n_layers; l++) {
        target_layer_cuda *L = &m->layers[l];
        CUDA_TRY_RC(nn_fill_uniform_bf16_cuda(L->w_qkv, qkv_n * d, k++, w_scale, 0, err, errlen));
        CUDA_TRY_RC(nn_fill_uniform_bf16_cuda(L->w_o, d * qd, k++, w_scale, 0, err, errlen));
        if (L->moe) { /* the router and experts at HF's init std as well */
            size_t E = m->E, F = m->F;
            CUDA_TRY_RC(nn_fill_uniform_bf16_cuda(L->w_router, E * d, k++, w_scale, 0, err, errlen));
            CUDA_TRY_RC(nn_fill_uniform_bf16_cuda(L->w_gu, E * 2 * F * d, k++, w_scale, 0, err, errlen));
            CUDA_TRY_RC(nn_fill_uniform_bf16_cuda(L->w_down, E * d * F, k++, w_scale, 0, err, errlen));
        } else {
            CUDA_TRY_RC(nn_fill_uniform_bf16_cuda(L->w_gu, 2 * I * d, k++, w_scale, 0, err, errlen));
            CUDA_TRY_RC(nn_fill_uniform_bf16_cuda(L->w_down, d * I, k++, w_scale, 0, err, errlen));
        }
        CUDA_TRY_RC(nn_fill_uniform_f32_cuda(L->in_norm, d, k++, 1.0f, 0.1f, 0, err, errlen));
        CUDA_TRY_RC(nn_fill_uniform_f32_cuda(L->post_norm, d, k++, 1.0f, 0.1f, 0, err, errlen));
        if (L->q_norm) {
            CUDA_TRY_RC(nn_fill_uniform_f32_cuda(L->q_norm, hd, k++, 1.0f, 0.1f, 0, err, errlen));
            CUDA_TRY_RC(nn_fill_uniform_f32_cuda(L->k_norm, hd, k++, 1.0f, 0.1f, 0, err, errlen));
        }
        if (L->b_qkv) {
            CUDA_TRY_RC(nn_fill_uniform_bf16_cuda(L->b_qkv, qkv_n, k++, w_scale, 0, err, errlen));
            CUDA_TRY_RC(nn_fill_uniform_bf16_cuda(L->b_o, d, k++, w_scale, 0, err, errlen));
        }
        if (L->b_gu) {
            CUDA_TRY_RC(nn_fill_uniform_bf16_cuda(L->b_gu, 2 * I, k++, w_scale, 0, err, errlen));
            CUDA_TRY_RC(nn_fill_uniform_bf16_cuda(L->b_down, d, k++, w_scale, 0, err, errlen));
        }
    }
    CUDA_TRY(cudaDeviceSynchronize(), err, errlen);
    return 0;
}

/* ---- the forward --------------------------------------------------------------------- */

/* The measured per-shape GEMM table: cuBLASLt's heuristic rank per (device, T, N, K),
 * chosen once from bench_target --breakdown's sweep (every rank timed; a later rank is
 * kept only when it was clearly faster, see docs/target_cuda.md) and fixed here, so the
 * algorithm, and so the bits, never depend on a timing taken at run time. */
typedef struct gemm_rule {
    int major, minor, sms, T, N, K, rank;
} gemm_rule;
static const gemm_rule GEMM_RULES[] = {
    /* H100 / H200 (sm_90, 132 SMs), 8192 tokens, Qwen3-8B's QKV [8192, 6144, 4096]: rank 3
     * took 0.507 / 0.546 ms against rank 0's 0.575 / 0.565 ms in the two sweeps of one run
     * (2026-12-03, H200); every other 8B linear layer was within 2% of rank 0, so keeps it */
    {9, 0, 132, 8192, 6144, 4096, 3},
};

int target_gemm_rank_cuda(const target_model_cuda *m, int T, int N, int K)
{
    for (size_t i = 0; i < sizeof GEMM_RULES / sizeof GEMM_RULES[0]; i++) {
        const gemm_rule *r = &GEMM_RULES[i];
        if (r->T > 0 && r->major == m->dev_major && r->minor == m->dev_minor && r->sms == m->dev_sms && r->T == T &&
            r->N == N && r->K == K)
            return r->rank;
    }
    return 0;
}

/* hd 128: the wgmma kernel with TMA loads and the two warpgroups taking turns (128x128
 * tiles, sm_90; elsewhere nn_attention_packed_tile_cuda runs 128x64 for it), measured
 * fastest at Qwen3-8B with documents of 2048 and 4096 tokens (0.29 / 0.49 ms per layer
 * against 128x64's 0.71 / 1.29 ms, H200; docs/target_cuda.md); the other hd have only
 * 64x64. */
int target_attn_tile_cuda(const target_model_cuda *m, int T)
{
    (void)T;
    if (m->attn_tile >= 0)
        return m->attn_tile;
    return m->hd == 128 ? NN_ATTN_TILE_WGMMA_PP : NN_ATTN_TILE_64x64;
}

/* out[T, n_out] = x[T, n_in] w^T (+ b): the one GEMM, with the target's algorithm choice */
static int linear(target_model_cuda *m, int which, nn_bf16_cuda *out, const nn_bf16_cuda *x, const nn_bf16_cuda *w,
                  const nn_bf16_cuda *b, int T, int n_in, int n_out, cudaStream_t s, char *err, size_t errlen)
{
    nn_gemm_args_cuda a = nn_gemm_linear_args_cuda(out, x, w, b, T, n_in, n_out);
    a.algo_rank = m->gemm_rank[which] >= 0 ? m->gemm_rank[which] : target_gemm_rank_cuda(m, T, n_out, n_in);
    return nn_gemm_run_cuda(m->gemm, &a, s, err, errlen);
}

int target_forward_cuda(target_model_cuda *m, const int32_t *tokens, const int32_t *doc_starts, int n_docs, int T,
                        nn_bf16_cuda *out, cudaStream_t s, char *err, size_t errlen)
{
    if (T < 1 || T > m->max_T || n_docs < 1 || !out)
        return df_err(err, errlen, -EINVAL, "target_forward_cuda: T %d outside [1, %d] or n_docs %d < 1", T, m->max_T,
                      n_docs);
    const int d = m->d, I = m->I, H = m->H, KV = m->KV, hd = m->hd, nc = m->n_capture;
    const int qkv_n = (H + 2 * KV) * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    const long cap_stride = (long)nc * d;
    const int tile = target_attn_tile_cuda(m, T);
    CUDA_TRY_RC_AT(nn_positions_cuda(m->pos, doc_starts, n_docs, T, s, err, errlen), err, errlen, "positions");
    CUDA_TRY_RC_AT(nn_embed_cuda(m->x, m->embed, tokens, T, d, m->V, m->bad_token, s, err, errlen), err, errlen,
                   "embed");
    for (int l = 0; l < m->n_layers; l++) {
        const target_layer_cuda *L = &m->layers[l];
        /* x += y (previous MLP), capture layer l-1, a = input_layernorm(x) */
        int prev_slot = l > 0 ? m->capture_slot[l - 1] : -1;
        CUDA_TRY_RC_AT(nn_add_rmsnorm_cuda(m->x, l > 0 ? m->y : NULL, L->in_norm, m->a,
                                           prev_slot >= 0 ? out + (size_t)prev_slot * d : NULL, cap_stride, T, d,
                                           m->eps, s, err, errlen),
                       err, errlen, "layer %d: add_rmsnorm (input)", l);
        CUDA_TRY_RC_AT(linear(m, TARGET_GEMM_QKV, m->qkv, m->a, L->w_qkv, L->b_qkv, T, d, qkv_n, s, err, errlen), err,
                       errlen, "layer %d: gemm qkv", l);
        CUDA_TRY_RC_AT(nn_qk_norm_rope_cuda(m->qkv, L->q_norm, L->k_norm, m->inv_freq, m->pos, T, H, KV, hd, m->eps, s,
                                            err, errlen),
                       err, errlen, "layer %d: qk_norm_rope", l);
        CUDA_TRY_RC_AT(
            nn_attention_packed_tile_cuda(m->att, m->qkv, m->pos, T, H, KV, hd, L->window, scale, tile, s, err, errlen),
            err, errlen, "layer %d: attention", l);
        CUDA_TRY_RC_AT(linear(m, TARGET_GEMM_O, m->y, m->att, L->w_o, L->b_o, T, H * hd, d, s, err, errlen), err,
                       errlen, "layer %d: gemm o_proj", l);
        CUDA_TRY_RC_AT(nn_add_rmsnorm_cuda(m->x, m->y, L->post_norm, m->a, NULL, 0, T, d, m->eps, s, err, errlen), err,
                       errlen, "layer %d: add_rmsnorm (post)", l);
        if (L->moe) {
            CUDA_TRY_RC_AT(target_moe_mlp_cuda(m, l, m->a, m->y, T, 0, s, err, errlen), err, errlen,
                           "layer %d: experts", l);
            continue;
        }
        CUDA_TRY_RC_AT(linear(m, TARGET_GEMM_GU, m->gu, m->a, L->w_gu, L->b_gu, T, d, 2 * I, s, err, errlen), err,
                       errlen, "layer %d: gemm gate_up", l);
        CUDA_TRY_RC_AT(nn_swiglu_cuda(m->h, m->gu, T, I, s, err, errlen), err, errlen, "layer %d: swiglu", l);
        CUDA_TRY_RC_AT(linear(m, TARGET_GEMM_DOWN, m->y, m->h, L->w_down, L->b_down, T, I, d, s, err, errlen), err,
                       errlen, "layer %d: gemm down", l);
    }
    const int l = m->n_layers - 1; /* the last layer run is always captured */
    CUDA_TRY_RC_AT(nn_add_rmsnorm_cuda(m->x, m->y, NULL, NULL, out + (size_t)m->capture_slot[l] * d, cap_stride, T, d,
                                       m->eps, s, err, errlen),
                   err, errlen, "layer %d: add (last capture)", l);
    return 0;
}

int target_take_token_error_cuda(target_model_cuda *m, int *bad, char *err, size_t errlen)
{
    int v = 0;
    CUDA_TRY(cudaMemcpy(&v, m->bad_token, sizeof v, cudaMemcpyDeviceToHost), err, errlen);
    CUDA_TRY(cudaMemset(m->bad_token, 0, sizeof v), err, errlen);
    *bad = v;
    return 0;
}

double target_layer_params_cuda(const target_model_cuda *m)
{
    double d = m->d, I = m->I, hd = m->hd, H = m->H, KV = m->KV;
    double attn = d * (H + 2 * KV) * hd + H * hd * d + 2 * d;
    if (m->qk_norm)
        attn += 2 * hd;
    if (m->attention_bias)
        attn += (H + 2 * KV) * hd + d;
    double dense = 3 * d * I + (m->mlp_bias ? 2 * I + d : 0);
    /* a sparse layer: the router and the k experts a token runs (the active parameters) */
    double sparse = (double)m->E * d + (double)m->topk * 3 * d * m->F;
    return attn * m->n_layers + dense * (m->n_layers - m->n_moe) + sparse * m->n_moe;
}

/* ---- routed experts -------------------------------------------------------------------- */

int target_moe_mlp_cuda(target_model_cuda *m, int l, const nn_bf16_cuda *a, nn_bf16_cuda *y, int T, int exact,
                        cudaStream_t s, char *err, size_t errlen)
{
    if (l < 0 || l >= m->n_layers || !m->layers[l].moe || T < 1 || T > m->max_T)
        return df_err(err, errlen, -EINVAL,
                      "target_moe_mlp_cuda: layer %d is not a sparse layer run, or T %d "
                      "outside [1, %d]",
                      l, T, m->max_T);
    const target_layer_cuda *L = &m->layers[l];
    const int d = m->d, E = m->E;
    if (exact) {
        /* the row-exact small-row linear layer: a row's logits, so its experts, do not depend on
         * the rows beside it */
        for (int r0 = 0; r0 < T; r0 += DECODE_LINEAR_MAX_ROWS)
            CUDA_TRY_RC_AT(decode_linear_rows_cuda(m->moe_logits + (size_t)r0 * E, 1, a + (size_t)r0 * d, L->w_router,
                                                   NULL, DF_MIN(DECODE_LINEAR_MAX_ROWS, T - r0), d, E, s, err, errlen),
                           err, errlen, "router");
    } else {
        nn_gemm_args_cuda ga = nn_gemm_linear_args_cuda((nn_bf16_cuda *)m->moe_logits, a, L->w_router, NULL, T, d, E);
        ga.d_type = NN_GEMM_F32;
        CUDA_TRY_RC_AT(nn_gemm_run_cuda(m->gemm, &ga, s, err, errlen), err, errlen, "router");
    }
    CUDA_TRY_RC_AT(nn_moe_route_cuda(&m->moe, m->moe_logits, T, m->norm_topk, s, err, errlen), err, errlen, "route");
    CUDA_TRY_RC_AT(nn_moe_experts_cuda(y, a, L->w_gu, L->w_down, &m->moe, m->moe_h, m->moe_yp, T, d, m->F,
                                       exact ? NN_MOE_ROWS : m->moe_kernel, s, err, errlen),
                   err, errlen, "experts");
    return 0;
}

int target_moe_routing_cuda(const target_model_cuda *m, int T, int32_t *idx, float *wts, float *logits, char *err,
                            size_t errlen)
{
    if (!m->n_moe || T < 1 || T > m->max_T)
        return df_err(err, errlen, -EINVAL, "target_moe_routing_cuda: %d sparse layers, T %d (max %d)", m->n_moe, T,
                      m->max_T);
    size_t tk = (size_t)T * m->topk;
    if (idx)
        CUDA_TRY(cudaMemcpy(idx, m->moe.idx, sizeof(int32_t) * tk, cudaMemcpyDeviceToHost), err, errlen);
    if (wts)
        CUDA_TRY(cudaMemcpy(wts, m->moe.wts, sizeof(float) * tk, cudaMemcpyDeviceToHost), err, errlen);
    if (logits)
        CUDA_TRY(cudaMemcpy(logits, m->moe_logits, sizeof(float) * (size_t)T * m->E, cudaMemcpyDeviceToHost), err,
                 errlen);
    return 0;
}

double target_forward_flops_cuda(const target_model_cuda *m, const int32_t *doc_starts, int n_docs)
{
    double T = doc_starts[n_docs] - doc_starts[0], att = 0;
    for (int i = 0; i < n_docs; i++) {
        double L = doc_starts[i + 1] - doc_starts[i];
        att += L * 2.0 * m->n_layers * L * m->H * m->hd;
    }
    return 2.0 * target_layer_params_cuda(m) * T + att;
}
