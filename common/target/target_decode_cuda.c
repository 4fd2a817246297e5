/* target_decode_cuda.c: KV-cached decoding of the full target on the GPU, see
 * target_decode_cuda.h. The layer loop is tmc_forward's order of operations with the
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
#define TDC_SMALL_ROWS 32

const char *tdc_error(const tdc_model *m)
{
    return m->err;
}

void tdc_free(tdc_model *m)
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
    tmc_free(&m->tm);
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

/* bf16 device copy of host fp32 src[n] (RNE, as tmc_load_weights). */
static int upload_bf16(nnc_bf16 *dst, const float *src, size_t n)
{
    uint16_t *h = malloc(sizeof(uint16_t) * (n ? n : 1));
    if (!h)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        h[i] = st_f32_to_bf16(src[i]);
    cudaError_t e = cudaMemcpy(dst, h, sizeof(uint16_t) * n, cudaMemcpyHostToDevice);
    free(h);
    return e == cudaSuccess ? 0 : -EIO;
}

int tdc_load(tdc_model *m, const char *dir, const int *capture, int n_capture, int max_ctx, int max_next, char *err,
             size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (n_capture < 1 || n_capture >= 64 || max_ctx < 1 || max_next < 1 || max_next > max_ctx) {
        snprintf(err, errlen, "%s: bad decode setup: %d captured layers, cache of %d tokens, %d tokens per step",
                 dir, n_capture, max_ctx, max_next);
        return -EINVAL;
    }
    hfc_config c;
    int rc = hfc_load(&c, dir, err, errlen);
    if (rc < 0)
        return rc;
    int L = c.num_hidden_layers;
    hfc_free(&c);
    /* tmc runs layers 0..max(capture): adding the last layer uploads all of them; its
     * extra slot (n_capture) is not handed out */
    int ids[65], n = 0, has_last = 0;
    for (int i = 0; i < n_capture; i++) {
        ids[n++] = capture[i];
        has_last |= capture[i] == L - 1;
    }
    if (!has_last)
        ids[n++] = L - 1;
    if ((rc = tmc_load(&m->tm, dir, ids, n, max_ctx, err, errlen)) < 0)
        return rc;
    tm_embeddings e;
    if ((rc = tm_load_embeddings(&e, dir, 1, err, errlen)) < 0)
        goto fail;
    const tmc_model *t = &m->tm;
    size_t d = (size_t)t->d, kvd = (size_t)t->KV * t->hd, V = (size_t)t->V;
    m->n_capture = n_capture;
    m->max_ctx = max_ctx;
    m->max_next = max_next;
    m->small_rows = DF_MAX(TDC_SMALL_ROWS, max_next);
    size_t cache = (size_t)L * max_ctx * kvd * sizeof(nnc_bf16);
    if ((rc = dev_alloc(&m->final_norm, sizeof(float) * d, "final_norm", dir, err, errlen)) < 0 ||
        (rc = dev_alloc(&m->kc, cache, "K cache", dir, err, errlen)) < 0 ||
        (rc = dev_alloc(&m->vc, cache, "V cache", dir, err, errlen)) < 0 ||
        (rc = dev_alloc(&m->feat, sizeof(nnc_bf16) * max_ctx * n_capture * d, "features", dir, err, errlen)) < 0 ||
        (rc = dev_alloc(&m->z, sizeof(nnc_bf16) * max_next * d, "z", dir, err, errlen)) < 0 ||
        (rc = dev_alloc(&m->logits, sizeof(float) * max_next * V, "logits", dir, err, errlen)) < 0 ||
        (rc = dev_alloc(&m->tokens, sizeof(int32_t) * max_ctx, "tokens", dir, err, errlen)) < 0 ||
        (rc = dev_alloc(&m->next_d, sizeof(int32_t) * max_next, "next", dir, err, errlen)) < 0) {
        tm_embeddings_free(&e);
        goto fail;
    }
    if (cudaMallocHost((void **)&m->next_h, sizeof(int32_t) * max_next) != cudaSuccess ||
        cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMemcpy(m->final_norm, e.final_norm, sizeof(float) * d, cudaMemcpyHostToDevice) != cudaSuccess) {
        snprintf(err, errlen, "%s: pinned buffer / stream / final norm upload: %s", dir,
                 cudaGetErrorString(cudaGetLastError()));
        tm_embeddings_free(&e);
        rc = -EIO;
        goto fail;
    }
    if (e.tied) {
        m->lm_head = m->tm.embed; /* the same bf16 rows as the file's embedding */
    } else {
        if ((rc = dev_alloc(&m->lm_head, sizeof(nnc_bf16) * V * d, "lm_head", dir, err, errlen)) < 0) {
            tm_embeddings_free(&e);
            goto fail;
        }
        m->lm_head_owned = 1;
        if ((rc = upload_bf16(m->lm_head, e.lm_head, V * d)) < 0) {
            snprintf(err, errlen, "%s: lm_head upload failed (%s)", dir, strerror(-rc));
            tm_embeddings_free(&e);
            goto fail;
        }
    }
    tm_embeddings_free(&e);
    return 0;
fail:
    tdc_free(m);
    return rc;
}

void tdc_reset(tdc_model *m)
{
    m->len = 0;
}

int tdc_truncate(tdc_model *m, int len)
{
    if (len < 0 || len > m->len)
        return -EINVAL;
    m->len = len; /* rows >= len are overwritten by the next extend */
    return 0;
}

/* out = x w^T + b over T rows: the row-exact kernel for decode-sized calls, cuBLASLt
 * (tensor cores) for prefills. */
static int linear(tdc_model *m, nnc_bf16 *out, const nnc_bf16 *x, const nnc_bf16 *w, const nnc_bf16 *b, int T,
                  int n_in, int n_out)
{
    if (T <= m->small_rows)
        return dkc_linear_rows(out, 0, x, w, b, T, n_in, n_out, m->stream);
    return nnc_gemm_bf16(m->tm.gemm, out, x, w, b, T, n_in, n_out, m->stream);
}

/* Run a step; on failure name it and the layer in m->err. */
#define STEP(call, what)                                                                                     \
    do {                                                                                                     \
        int r_ = (call);                                                                                     \
        if (r_ < 0) {                                                                                        \
            snprintf(m->err, sizeof m->err, "tdc_extend: layer %d: %s failed (%d): %s%s%s", l, what, r_,     \
                     nnc_last_cuda_error(), dkc_last_error(), nnc_gemm_error(m->tm.gemm));                   \
            return r_ == -EINVAL ? -EINVAL : -EIO;                                                           \
        }                                                                                                    \
    } while (0)

int tdc_extend(tdc_model *m, const int32_t *tokens, int k, int n_next, int32_t *next)
{
    tmc_model *t = &m->tm;
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
    STEP(dkc_positions(t->pos, p0, k, s), "positions");
    STEP(nnc_embed(t->x, t->embed, m->tokens, k, d, t->V, t->bad_token, s), "embed");
    for (l = 0; l < t->n_layers; l++) {
        const tmc_layer *Lw = &t->layers[l];
        nnc_bf16 *kl = m->kc + l * lstride, *vl = m->vc + l * lstride;
        /* x += y (previous MLP), capture layer l-1 when the caller asked for it, a = in_norm(x) */
        int prev = l > 0 ? t->capture_slot[l - 1] : -1;
        STEP(nnc_add_rmsnorm(t->x, l > 0 ? t->y : NULL, Lw->in_norm, t->a,
                             prev >= 0 && prev < nc ? m->feat + (size_t)prev * d : NULL, cap_stride, k, d, t->eps, s),
             "add_rmsnorm (input)");
        STEP(linear(m, t->qkv, t->a, Lw->w_qkv, Lw->b_qkv, k, d, qkv_n), "linear qkv");
        STEP(nnc_qk_norm_rope(t->qkv, Lw->q_norm, Lw->k_norm, t->inv_freq, t->pos, k, H, KV, hd, t->eps, s),
             "qk_norm_rope");
        STEP(dkc_kv_append(kl, vl, t->qkv, k, H, KV, hd, p0, s), "kv append");
        STEP(dkc_attention(t->att, t->qkv, qkv_n, kl, vl, NULL, p0, Lw->window, k, H, KV, hd, scale, s),
             "attention");
        STEP(linear(m, t->y, t->att, Lw->w_o, Lw->b_o, k, H * hd, d), "linear o_proj");
        STEP(nnc_add_rmsnorm(t->x, t->y, Lw->post_norm, t->a, NULL, 0, k, d, t->eps, s), "add_rmsnorm (post)");
        STEP(linear(m, t->gu, t->a, Lw->w_gu, Lw->b_gu, k, d, 2 * I), "linear gate_up");
        STEP(nnc_swiglu(t->h, t->gu, k, I, s), "swiglu");
        STEP(linear(m, t->y, t->h, Lw->w_down, Lw->b_down, k, I, d), "linear down");
    }
    l = t->n_layers - 1;
    int last = t->capture_slot[l];
    STEP(nnc_add_rmsnorm(t->x, t->y, NULL, NULL, last >= 0 && last < nc ? m->feat + (size_t)last * d : NULL,
                         cap_stride, k, d, t->eps, s),
         "add (last layer)");
    if (n_next > 0) {
        float *xl = t->x + (size_t)(k - n_next) * d;
        STEP(nnc_add_rmsnorm(xl, NULL, m->final_norm, m->z, NULL, 0, n_next, d, t->eps, s), "final norm");
        STEP(dkc_linear_rows(m->logits, 1, m->z, m->lm_head, NULL, n_next, d, t->V, s), "lm_head");
        STEP(dkc_argmax_rows(m->next_d, m->logits, n_next, t->V, s), "argmax");
        STEP(cudaMemcpyAsync(m->next_h, m->next_d, sizeof(int32_t) * n_next, cudaMemcpyDeviceToHost, s) ==
                     cudaSuccess
                 ? 0
                 : -EIO,
             "greedy tokens download");
    }
    cudaError_t e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) {
        snprintf(m->err, sizeof m->err, "tdc_extend: cudaStreamSynchronize: %s", cudaGetErrorString(e));
        return -EIO;
    }
    memcpy(next, m->next_h, sizeof(int32_t) * n_next);
    m->last_n_next = n_next;
    m->len = p0 + k;
    return 0;
}

int tdc_logits_to_host(tdc_model *m, float *out)
{
    size_t n = (size_t)m->last_n_next * m->tm.V;
    if (cudaMemcpy(out, m->logits, sizeof(float) * n, cudaMemcpyDeviceToHost) != cudaSuccess) {
        snprintf(m->err, sizeof m->err, "tdc_logits_to_host: %s", cudaGetErrorString(cudaGetLastError()));
        return -EIO;
    }
    return 0;
}

int tdc_feats_to_host(tdc_model *m, int k, float *out)
{
    size_t n = (size_t)k * m->n_capture * m->tm.d;
    uint16_t *h = malloc(sizeof(uint16_t) * (n ? n : 1));
    if (!h)
        return -ENOMEM;
    if (cudaMemcpy(h, m->feat, sizeof(uint16_t) * n, cudaMemcpyDeviceToHost) != cudaSuccess) {
        snprintf(m->err, sizeof m->err, "tdc_feats_to_host: %s", cudaGetErrorString(cudaGetLastError()));
        free(h);
        return -EIO;
    }
    for (size_t i = 0; i < n; i++)
        out[i] = st_bf16_to_f32(h[i]);
    free(h);
    return 0;
}
