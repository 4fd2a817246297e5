/* target_decode_cuda.c: KV-cached decoding of the full target on the GPU, see
 * target_decode_cuda.h. The layer loop is target_forward_cuda's order of operations with the
 * cache in place of the packed-row attention; target_decode.c is the CPU reference. */
#include "target/target_decode_cuda.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/hfconfig.h"
#include "target/decode_kernels_cuda.h"
#include "target/target_model.h"
#include "util.h"

/* Rows up to which linear layers use the row-exact kernel (a decode step, a verify
 * block); at least max_next so a verify always takes it. */
#define DECODE_CUDA_SMALL_ROWS 32

const char *decode_error_cuda(const decode_model_cuda *m)
{
    return m->err;
}

void decode_free_cuda(decode_model_cuda *m)
{
    if (!m)
        return;
    if (m->lm_head_owned)
        cudaFree(m->lm_head);
    cudaFree(m->final_norm), cudaFree(m->kc), cudaFree(m->vc), cudaFree(m->feat), cudaFree(m->z);
    cudaFree(m->logits), cudaFree(m->tokens), cudaFree(m->next_d);
    if (m->next_h)
        cudaFreeHost(m->next_h);
    if (m->stream)
        cudaStreamDestroy(m->stream);
    target_free_cuda(&m->tm);
    memset(m, 0, sizeof *m);
}

/* cudaMalloc of n bytes into *p, message in err on failure. */
static int dev_alloc(void *p, size_t n, const char *what, const char *dir, char *err, size_t errlen)
{
    cudaError_t e = cudaMalloc((void **)p, n ? n : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();
        snprintf(err, errlen, "%s: cudaMalloc(%s, %zu bytes): %s", dir, what, n, cudaGetErrorString(e));
        return -ENOMEM;
    }
    return 0;
}

/* bf16 device copy of host fp32 src[n] (RNE, as target_load_weights_cuda). */
static int upload_bf16(nn_bf16_cuda *dst, const float *src, size_t n)
{
    uint16_t *h = malloc(sizeof(uint16_t) * (n ? n : 1));
    if (!h)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        h[i] = safetensors_f32_to_bf16(src[i]);
    cudaError_t e = cudaMemcpy(dst, h, sizeof(uint16_t) * n, cudaMemcpyHostToDevice);
    free(h);
    return e == cudaSuccess ? 0 : -EIO;
}

int decode_load_cuda(decode_model_cuda *m, const char *dir, const int *capture, int n_capture, int max_ctx, int max_next, char *err,
             size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (n_capture < 1 || n_capture >= 64 || max_ctx < 1 || max_next < 1 || max_next > max_ctx) {
        snprintf(err, errlen, "%s: bad decode setup: %d captured layers, cache of %d tokens, %d tokens per step",
                 dir, n_capture, max_ctx, max_next);
        return -EINVAL;
    }
    hfconfig c;
    int rc = hfconfig_load(&c, dir, err, errlen);
    if (rc < 0)
        return rc;
    int L = c.num_hidden_layers;
    hfconfig_free(&c);
    /* tmc runs layers 0..max(capture): adding the last layer uploads all of them; its
     * extra slot (n_capture) is not handed out */
    int ids[65], n = 0, has_last = 0;
    for (int i = 0; i < n_capture; i++) {
        ids[n++] = capture[i];
        has_last |= capture[i] == L - 1;
    }
    if (!has_last)
        ids[n++] = L - 1;
    if ((rc = target_load_cuda(&m->tm, dir, ids, n, max_ctx, err, errlen)) < 0)
        return rc;
    target_embeddings e;
    if ((rc = target_load_embeddings(&e, dir, 1, err, errlen)) < 0)
        goto fail;
    const target_model_cuda *t = &m->tm;
    size_t d = (size_t)t->d, kvd = (size_t)t->KV * t->hd, V = (size_t)t->V;
    m->n_capture = n_capture;
    m->max_ctx = max_ctx;
    m->max_next = max_next;
    m->small_rows = DF_MAX(DECODE_CUDA_SMALL_ROWS, max_next);
    size_t cache = (size_t)L * max_ctx * kvd * sizeof(nn_bf16_cuda);
    if ((rc = dev_alloc(&m->final_norm, sizeof(float) * d, "final_norm", dir, err, errlen)) < 0 ||
        (rc = dev_alloc(&m->kc, cache, "K cache", dir, err, errlen)) < 0 ||
        (rc = dev_alloc(&m->vc, cache, "V cache", dir, err, errlen)) < 0 ||
        (rc = dev_alloc(&m->feat, sizeof(nn_bf16_cuda) * max_ctx * n_capture * d, "features", dir, err, errlen)) < 0 ||
        (rc = dev_alloc(&m->z, sizeof(nn_bf16_cuda) * max_next * d, "z", dir, err, errlen)) < 0 ||
        (rc = dev_alloc(&m->logits, sizeof(float) * max_next * V, "logits", dir, err, errlen)) < 0 ||
        (rc = dev_alloc(&m->tokens, sizeof(int32_t) * max_ctx, "tokens", dir, err, errlen)) < 0 ||
        (rc = dev_alloc(&m->next_d, sizeof(int32_t) * max_next, "next", dir, err, errlen)) < 0) {
        target_embeddings_free(&e);
        goto fail;
    }
    if (cudaMallocHost((void **)&m->next_h, sizeof(int32_t) * max_next) != cudaSuccess ||
        cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMemcpy(m->final_norm, e.final_norm, sizeof(float) * d, cudaMemcpyHostToDevice) != cudaSuccess) {
        snprintf(err, errlen, "%s: pinned buffer / stream / final norm upload: %s", dir,
                 cudaGetErrorString(cudaGetLastError()));
        target_embeddings_free(&e);
        rc = -EIO;
        goto fail;
    }
    if (e.tied) {
        m->lm_head = m->tm.embed; /* the same bf16 rows as the file's embedding */
    } else {
        if ((rc = dev_alloc(&m->lm_head, sizeof(nn_bf16_cuda) * V * d, "lm_head", dir, err, errlen)) < 0) {
            target_embeddings_free(&e);
            goto fail;
        }
        m->lm_head_owned = 1;
        if ((rc = upload_bf16(m->lm_head, e.lm_head, V * d)) < 0) {
            snprintf(err, errlen, "%s: lm_head upload failed (%s)", dir, strerror(-rc));
            target_embeddings_free(&e);
            goto fail;
        }
    }
    target_embeddings_free(&e);
    return 0;
fail:
    decode_free_cuda(m);
    return rc;
}

void decode_reset_cuda(decode_model_cuda *m)
{
    m->len = 0;
}

int decode_truncate_cuda(decode_model_cuda *m, int len)
{
    if (len < 0 || len > m->len)
        return -EINVAL;
    m->len = len; /* rows >= len are overwritten by the next extend */
    return 0;
}

/* out = x w^T + b over T rows: the row-exact kernel for decode-sized calls, cuBLASLt
 * (tensor cores) for prefills. */
static int linear(decode_model_cuda *m, nn_bf16_cuda *out, const nn_bf16_cuda *x, const nn_bf16_cuda *w, const nn_bf16_cuda *b, int T,
                  int n_in, int n_out, char *err, size_t errlen)
{
    if (T <= m->small_rows)
        return decode_linear_rows_cuda(out, 0, x, w, b, T, n_in, n_out, m->stream);
    nn_gemm_args_cuda a = nn_gemm_linear_args_cuda(out, x, w, b, T, n_in, n_out);
    return nn_gemm_run_cuda(m->tm.gemm, &a, m->stream, err, errlen);
}

/* Run a step; on failure name it and the layer in m->err (why: the nn_*_cuda calls' text). */
#define STEP(call, what)                                                                                     \
    do {                                                                                                     \
        char why[256];                                                                                       \
        why[0] = '\0';                                                                                       \
        int r_ = (call);                                                                                     \
        if (r_ < 0) {                                                                                        \
            snprintf(m->err, sizeof m->err, "decode_extend_cuda: layer %d: %s failed (%d): %s%s", l, what, r_,       \
                     why, decode_last_error_cuda());                                                         \
            return r_ == -EINVAL ? -EINVAL : -EIO;                                                           \
        }                                                                                                    \
    } while (0)

int decode_extend_cuda(decode_model_cuda *m, const int32_t *tokens, int k, int n_next, int32_t *next)
{
    target_model_cuda *t = &m->tm;
    if (k < 1 || n_next < 0 || n_next > k || n_next > m->max_next)
        return -EINVAL;
    if (m->len + k > m->max_ctx)
        return -ENOSPC;
    for (int i = 0; i < k; i++)
        if (tokens[i] < 0 || tokens[i] >= t->V)
            return -ERANGE;
    const int d = t->d, I = t->I, H = t->H, KV = t->KV, hd = t->hd, nc = m->n_capture, p0 = m->len;
    const int qkv_n = (H + 2 * KV) * hd;
    const long cap_stride = (long)nc * d;
    const size_t lstride = (size_t)m->max_ctx * KV * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    cudaStream_t s = m->stream;
    int l = -1;
    STEP(cudaMemcpyAsync(m->tokens, tokens, sizeof(int32_t) * k, cudaMemcpyHostToDevice, s) == cudaSuccess ? 0 : -EIO,
         "token upload");
    STEP(decode_positions_cuda(t->pos, p0, k, s), "positions");
    STEP(nn_embed_cuda(t->x, t->embed, m->tokens, k, d, t->V, t->bad_token, s, why, sizeof why), "embed");
    for (l = 0; l < t->n_layers; l++) {
        const target_layer_cuda *Lw = &t->layers[l];
        nn_bf16_cuda *kl = m->kc + l * lstride, *vl = m->vc + l * lstride;
        /* x += y (previous MLP), capture layer l-1 when the caller asked for it, a = in_norm(x) */
        int prev = l > 0 ? t->capture_slot[l - 1] : -1;
        STEP(nn_add_rmsnorm_cuda(t->x, l > 0 ? t->y : NULL, Lw->in_norm, t->a,
                             prev >= 0 && prev < nc ? m->feat + (size_t)prev * d : NULL, cap_stride, k, d, t->eps, s, why, sizeof why),
             "add_rmsnorm (input)");
        STEP(linear(m, t->qkv, t->a, Lw->w_qkv, Lw->b_qkv, k, d, qkv_n, why, sizeof why), "linear qkv");
        STEP(nn_qk_norm_rope_cuda(t->qkv, Lw->q_norm, Lw->k_norm, t->inv_freq, t->pos, k, H, KV, hd, t->eps, s, why, sizeof why),
             "qk_norm_rope");
        STEP(decode_kv_append_cuda(kl, vl, t->qkv, k, H, KV, hd, p0, s), "kv append");
        STEP(decode_attention_cuda(t->att, t->qkv, qkv_n, kl, vl, NULL, p0, Lw->window, k, H, KV, hd, scale, s),
             "attention");
        STEP(linear(m, t->y, t->att, Lw->w_o, Lw->b_o, k, H * hd, d, why, sizeof why), "linear o_proj");
        STEP(nn_add_rmsnorm_cuda(t->x, t->y, Lw->post_norm, t->a, NULL, 0, k, d, t->eps, s, why, sizeof why), "add_rmsnorm (post)");
        STEP(linear(m, t->gu, t->a, Lw->w_gu, Lw->b_gu, k, d, 2 * I, why, sizeof why), "linear gate_up");
        STEP(nn_swiglu_cuda(t->h, t->gu, k, I, s, why, sizeof why), "swiglu");
        STEP(linear(m, t->y, t->h, Lw->w_down, Lw->b_down, k, I, d, why, sizeof why), "linear down");
    }
    l = t->n_layers - 1;
    int last = t->capture_slot[l];
    STEP(nn_add_rmsnorm_cuda(t->x, t->y, NULL, NULL, last >= 0 && last < nc ? m->feat + (size_t)last * d : NULL,
                         cap_stride, k, d, t->eps, s, why, sizeof why),
         "add (last layer)");
    if (n_next > 0) {
        float *xl = t->x + (size_t)(k - n_next) * d;
        STEP(nn_add_rmsnorm_cuda(xl, NULL, m->final_norm, m->z, NULL, 0, n_next, d, t->eps, s, why, sizeof why), "final norm");
        STEP(decode_linear_rows_cuda(m->logits, 1, m->z, m->lm_head, NULL, n_next, d, t->V, s), "lm_head");
        STEP(decode_argmax_rows_cuda(m->next_d, m->logits, n_next, t->V, s), "argmax");
        STEP(cudaMemcpyAsync(m->next_h, m->next_d, sizeof(int32_t) * n_next, cudaMemcpyDeviceToHost, s) ==
                     cudaSuccess
                 ? 0
                 : -EIO,
             "greedy tokens download");
    }
    cudaError_t e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) {
        snprintf(m->err, sizeof m->err, "decode_extend_cuda: cudaStreamSynchronize: %s", cudaGetErrorString(e));
        return -EIO;
    }
    memcpy(next, m->next_h, sizeof(int32_t) * n_next);
    m->last_n_next = n_next;
    m->len = p0 + k;
    return 0;
}

int decode_logits_to_host_cuda(decode_model_cuda *m, float *out)
{
    size_t n = (size_t)m->last_n_next * m->tm.V;
    if (cudaMemcpy(out, m->logits, sizeof(float) * n, cudaMemcpyDeviceToHost) != cudaSuccess) {
        snprintf(m->err, sizeof m->err, "decode_logits_to_host_cuda: %s", cudaGetErrorString(cudaGetLastError()));
        return -EIO;
    }
    return 0;
}

int decode_feats_to_host_cuda(decode_model_cuda *m, int k, float *out)
{
    size_t n = (size_t)k * m->n_capture * m->tm.d;
    uint16_t *h = malloc(sizeof(uint16_t) * (n ? n : 1));
    if (!h)
        return -ENOMEM;
    if (cudaMemcpy(h, m->feat, sizeof(uint16_t) * n, cudaMemcpyDeviceToHost) != cudaSuccess) {
        snprintf(m->err, sizeof m->err, "decode_feats_to_host_cuda: %s", cudaGetErrorString(cudaGetLastError()));
        free(h);
        return -EIO;
    }
    for (size_t i = 0; i < n; i++)
        out[i] = safetensors_bf16_to_f32(h[i]);
    free(h);
    return 0;
}
