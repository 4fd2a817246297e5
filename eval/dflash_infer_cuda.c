/* dflash_infer_cuda.c: cached DFlash drafting on the GPU, see dflash_infer_cuda.h. The
 * block path is infer_draft's layer loop (dflash_infer.c) with the residual add folded into
 * the next RMSNorm (nn_add_rmsnorm_cuda), the context path infer_append's. */
#include "eval/dflash_infer_cuda.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dflash/dflash_batch.h"
#include "io/safetensors.h"
#include "nn/nn.h"
#include "target/decode_kernels_cuda.h"
#include "util.h"

/* Context rows appended per pass (bounds the scratch). */
#define INFER_CUDA_CHUNK 256
/* Linear layers of at most this many rows use the row-exact kernel, longer ones cuBLASLt. */
#define INFER_CUDA_SMALL_ROWS 32

const char *infer_error_cuda(const infer_state_cuda *s)
{
    return s->err;
}

void infer_free_cuda(infer_state_cuda *s)
{
    if (!s)
        return;
    cudaFree(s->wb), cudaFree(s->wf), cudaFree(s->kc), cudaFree(s->vc), cudaFree(s->acts);
    if (s->draft_h)
        cudaFreeHost(s->draft_h);
    if (s->ranges_h)
        cudaFreeHost(s->ranges_h);
    nn_gemm_destroy_cuda(s->gemm);
    memset(s, 0, sizeof *s);
}

/* Bump allocation inside one buffer: offsets rounded up to 128 bytes (cuBLASLt and the
 * vectorised loads want 16-byte aligned rows; 128 keeps every tensor on its own line). */
typedef struct bump {
    char *base;
    size_t off;
} bump;

static void *take(bump *b, size_t bytes)
{
    b->off = (b->off + 127) & ~(size_t)127;
    void *p = b->base ? b->base + b->off : NULL;
    b->off += bytes;
    return p;
}

/* Lay out (base NULL: measure) the weights; hb/hf are the host staging copies when
 * filling (same offsets as the device buffers). */
static void layout_weights(infer_state_cuda *s, bump *bb, bump *bf, const dflash_params *p, uint16_t *hb, float *hf,
                           char *db, char *df)
{
    const dflash_config *c = s->c;
    size_t d = (size_t)c->hidden, I = (size_t)c->intermediate, hd = (size_t)c->head_dim;
    size_t qd = (size_t)c->n_heads * hd, kvd = (size_t)c->n_kv_heads * hd, nin = (size_t)c->n_capture * d;
#define BF(dst, src, n)                                                                                      \
    do {                                                                                                     \
        uint16_t *h_ = take(bb, sizeof(uint16_t) * (n));                                                     \
        if (hb) {                                                                                            \
            size_t o_ = (size_t)((char *)h_ - (char *)hb);                                                   \
            for (size_t i_ = 0; i_ < (n); i_++)                                                              \
                h_[i_] = safetensors_f32_to_bf16((src)[i_]);                                                          \
            (dst) = (nn_bf16_cuda *)(db + o_);                                                                   \
        }                                                                                                    \
    } while (0)
#define F32(dst, src, n)                                                                                     \
    do {                                                                                                     \
        float *h_ = take(bf, sizeof(float) * (n));                                                           \
        if (hf) {                                                                                            \
            size_t o_ = (size_t)((char *)h_ - (char *)hf);                                                   \
            memcpy(h_, (src), sizeof(float) * (n));                                                          \
            (dst) = (float *)(df + o_);                                                                      \
        }                                                                                                    \
    } while (0)
    BF(s->fc, p->fc, d * nin);
    F32(s->hidden_norm, p->hidden_norm, d);
    F32(s->final_norm, p->final_norm, d);
    for (int l = 0; l < c->n_layers; l++) {
        const dflash_layer_params *P = &p->layer[l];
        infer_layer_cuda *L = &s->layer[l];
        BF(L->w_qkv, P->wq, (qd + 2 * kvd) * d); /* wq, wk, wv are adjacent (checked) */
        BF(L->w_o, P->wo, d * qd);
        BF(L->w_gu, P->w_gate, 2 * I * d); /* w_gate, w_up adjacent (checked) */
        BF(L->w_down, P->w_down, d * I);
        F32(L->in_norm, P->input_norm, d);
        F32(L->post_norm, P->post_norm, d);
        F32(L->q_norm, P->q_norm, hd);
        F32(L->k_norm, P->k_norm, hd);
    }
#undef BF
#undef F32
}

static int cuda_fail(infer_state_cuda *s, char *err, size_t errlen, const char *what, int rc)
{
    snprintf(err, errlen, "drafter on the GPU: %s: %s", what, cudaGetErrorString(cudaGetLastError()));
    infer_free_cuda(s);
    return rc;
}

int infer_init_cuda(infer_state_cuda *s, const dflash_config *c, const dflash_params *p, const nn_bf16_cuda *embed,
              const nn_bf16_cuda *lm_head, int cap, cudaStream_t stream, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    int H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, B = c->block_size, d = c->hidden;
    int I = c->intermediate, V = c->vocab;
    size_t qd = (size_t)H * hd, kvd = (size_t)KV * hd;
    if (cap < 1 || B < 2 || hd % 2 || hd > 256 || KV < 1 || H % KV || c->mask_token_id < 0 ||
        c->mask_token_id >= V) {
        snprintf(err, errlen,
                 "drafter on the GPU: unsupported shape (cache %d, block %d, head_dim %d, heads %d/%d, mask token %d "
                 "of %d)",
                 cap, B, hd, H, KV, c->mask_token_id, V);
        return -EINVAL;
    }
    for (int l = 0; l < c->n_layers; l++) {
        const dflash_layer_params *P = &p->layer[l];
        if (P->wk != P->wq + qd * d || P->wv != P->wk + kvd * d || P->w_up != P->w_gate + (size_t)I * d) {
            snprintf(err, errlen, "drafter on the GPU: layer %d: q/k/v or gate/up not adjacent in the parameters", l);
            return -EINVAL;
        }
    }
    s->c = c, s->cap = cap, s->stream = stream, s->embed = embed, s->lm_head = lm_head;

    /* weights: measure, stage on the host, one copy each */
    bump bb = {0}, bf = {0};
    layout_weights(s, &bb, &bf, p, NULL, NULL, NULL, NULL);
    size_t nb = bb.off, nf = bf.off + sizeof(float) * (size_t)(hd / 2) + 128;
    uint16_t *hb = calloc(1, nb);
    float *hf = calloc(1, nf);
    if (!hb || !hf) {
        free(hb), free(hf);
        snprintf(err, errlen, "drafter on the GPU: out of host memory for the weights");
        return -ENOMEM;
    }
    if (cudaMalloc(&s->wb, nb) != cudaSuccess || cudaMalloc(&s->wf, nf) != cudaSuccess) {
        free(hb), free(hf);
        return cuda_fail(s, err, errlen, "cudaMalloc(weights)", -ENOMEM);
    }
    bb = (bump){(char *)hb, 0}, bf = (bump){(char *)hf, 0};
    layout_weights(s, &bb, &bf, p, hb, hf, s->wb, s->wf);
    float *inv = take(&bf, sizeof(float) * (size_t)(hd / 2));
    nn_rope_inv_freq(inv, hd, c->rope_theta, NULL); /* as infer_init */
    s->inv_freq = (float *)((char *)s->wf + ((char *)inv - (char *)hf));
    int ok = cudaMemcpy(s->wb, hb, nb, cudaMemcpyHostToDevice) == cudaSuccess &&
             cudaMemcpy(s->wf, hf, nf, cudaMemcpyHostToDevice) == cudaSuccess;
    free(hb), free(hf);
    if (!ok)
        return cuda_fail(s, err, errlen, "weight upload", -EIO);

    /* caches and scratch */
    size_t rows = (size_t)cap + B, L = (size_t)c->n_layers, qkv_n = qd + 2 * kvd;
    size_t R = (size_t)DF_MAX(INFER_CUDA_CHUNK, B);
    if (cudaMalloc((void **)&s->kc, sizeof(nn_bf16_cuda) * L * rows * kvd) != cudaSuccess ||
        cudaMalloc((void **)&s->vc, sizeof(nn_bf16_cuda) * L * rows * kvd) != cudaSuccess)
        return cuda_fail(s, err, errlen, "cudaMalloc(context K/V cache)", -ENOMEM);
    for (int pass = 0; pass < 2; pass++) { /* measure, then carve */
        bump a = {pass ? s->acts : NULL, 0};
        s->fc_out = take(&a, sizeof(float) * INFER_CUDA_CHUNK * d);
        s->ctx = take(&a, sizeof(nn_bf16_cuda) * INFER_CUDA_CHUNK * d);
        s->qkv = take(&a, sizeof(nn_bf16_cuda) * R * qkv_n);
        s->pos = take(&a, sizeof(int32_t) * R);
        s->h = take(&a, sizeof(float) * B * d);
        s->a = take(&a, sizeof(nn_bf16_cuda) * B * d);
        s->att = take(&a, sizeof(nn_bf16_cuda) * B * qd);
        s->y = take(&a, sizeof(nn_bf16_cuda) * B * d);
        s->gu = take(&a, sizeof(nn_bf16_cuda) * B * 2 * I);
        s->act = take(&a, sizeof(nn_bf16_cuda) * B * I);
        s->z = take(&a, sizeof(nn_bf16_cuda) * B * d);
        s->logits = take(&a, sizeof(float) * (size_t)(B - 1) * V);
        s->tokens = take(&a, sizeof(int32_t) * B);
        s->draft_d = take(&a, sizeof(int32_t) * B);
        s->ranges = take(&a, sizeof(nn_key_ranges) * 2 * B);
        if (!pass && cudaMalloc(&s->acts, a.off) != cudaSuccess)
            return cuda_fail(s, err, errlen, "cudaMalloc(activations)", -ENOMEM);
    }
    if (cudaMallocHost((void **)&s->draft_h, sizeof(int32_t) * B) != cudaSuccess ||
        cudaMallocHost((void **)&s->ranges_h, sizeof(nn_key_ranges) * 2 * B) != cudaSuccess)
        return cuda_fail(s, err, errlen, "cudaMallocHost", -ENOMEM);
    int rc = nn_gemm_create_cuda(&s->gemm, (size_t)32 << 20, NULL, 0);
    if (rc < 0)
        return cuda_fail(s, err, errlen, "nn_gemm_create_cuda", rc);
    return 0;
}

void infer_reset_cuda(infer_state_cuda *s)
{
    s->n_ctx = 0;
}

static size_t layer_stride(const infer_state_cuda *s)
{
    return ((size_t)s->cap + (size_t)s->c->block_size) * (size_t)s->c->n_kv_heads * (size_t)s->c->head_dim;
}

static int linear(infer_state_cuda *s, nn_bf16_cuda *out, const nn_bf16_cuda *x, const nn_bf16_cuda *w, int T, int n_in, int n_out,
                  char *err, size_t errlen)
{
    if (T <= INFER_CUDA_SMALL_ROWS)
        return decode_linear_rows_cuda(out, 0, x, w, NULL, T, n_in, n_out, s->stream);
    nn_gemm_args_cuda a = nn_gemm_linear_args_cuda(out, x, w, NULL, T, n_in, n_out);
    return nn_gemm_run_cuda(s->gemm, &a, s->stream, err, errlen);
}

/* why: the nn_*_cuda calls' text */
#define STEP(call, what)                                                                                     \
    do {                                                                                                     \
        char why[256];                                                                                       \
        why[0] = '\0';                                                                                       \
        int r_ = (call);                                                                                     \
        if (r_ < 0) {                                                                                        \
            snprintf(s->err, sizeof s->err, "%s: layer %d: %s failed (%d): %s%s", __func__, l, what, r_,     \
                     why, decode_last_error_cuda());                                                         \
            return r_ == -EINVAL ? -EINVAL : -EIO;                                                           \
        }                                                                                                    \
    } while (0)

static int sync_stream(infer_state_cuda *s)
{
    cudaError_t e = cudaStreamSynchronize(s->stream);
    if (e != cudaSuccess) {
        snprintf(s->err, sizeof s->err, "drafter: cudaStreamSynchronize: %s", cudaGetErrorString(e));
        return -EIO;
    }
    return 0;
}

int infer_append_cuda(infer_state_cuda *s, const nn_bf16_cuda *Hf, int n)
{
    const dflash_config *c = s->c;
    if (n < 1)
        return -EINVAL;
    if (s->n_ctx + n > s->cap)
        return -ENOSPC;
    int d = c->hidden, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, nin = c->n_capture * d;
    int qkv_n = (H + 2 * KV) * hd;
    float eps = (float)c->rms_norm_eps;
    int l = -1;
    for (int r0 = 0; r0 < n; r0 += INFER_CUDA_CHUNK) {
        int m = DF_MIN(INFER_CUDA_CHUNK, n - r0), p0 = s->n_ctx;
        l = -1;
        /* C = RMSNorm_hidden(H fc^T), the fc output kept in fp32 as on the CPU */
        STEP(decode_linear_rows_cuda(s->fc_out, 1, Hf + (size_t)r0 * nin, s->fc, NULL, m, nin, d, s->stream), "fc");
        STEP(nn_add_rmsnorm_cuda(s->fc_out, NULL, s->hidden_norm, s->ctx, NULL, 0, m, d, eps, s->stream, why, sizeof why),
             "hidden_norm");
        STEP(decode_positions_cuda(s->pos, p0, m, s->stream), "positions");
        for (l = 0; l < c->n_layers; l++) {
            const infer_layer_cuda *L = &s->layer[l];
            nn_bf16_cuda *kl = s->kc + l * layer_stride(s), *vl = s->vc + l * layer_stride(s);
            STEP(linear(s, s->qkv, s->ctx, L->w_qkv, m, d, qkv_n, why, sizeof why), "linear qkv (context)");
            STEP(nn_qk_norm_rope_cuda(s->qkv, L->q_norm, L->k_norm, s->inv_freq, s->pos, m, H, KV, hd, eps, s->stream, why, sizeof why),
                 "qk_norm_rope (context)");
            STEP(decode_kv_append_cuda(kl, vl, s->qkv, m, H, KV, hd, p0, s->stream), "kv append (context)");
        }
        s->n_ctx += m;
    }
    /* no synchronisation: the next draft runs after these rows on the same stream and
     * synchronises; a fault in them surfaces there */
    return 0;
}

int infer_draft_cuda(infer_state_cuda *s, int32_t anchor, int32_t *draft)
{
    const dflash_config *c = s->c;
    int B = c->block_size, S = s->n_ctx, d = c->hidden, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim;
    int I = c->intermediate, V = c->vocab, qkv_n = (H + 2 * KV) * hd;
    float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)hd);
    cudaStream_t st = s->stream;
    int l = -1;
    if (anchor < 0 || anchor >= V)
        return -EINVAL;
    /* h0 = E[anchor], E[MASK] x (B-1) at positions S..S+B-1; the training masks for one
     * block anchored at S (dflash_mask_ranges): full layers see all context + the block,
     * sliding layers a window of context + the block causally */
    for (int k = 0; k < B; k++)
        s->draft_h[k] = k == 0 ? anchor : c->mask_token_id;
    int32_t a0 = S;
    uint8_t keep = 1;
    dflash_mask_ranges(s->ranges_h, &a0, &keep, 1, B, S, 0);
    dflash_mask_ranges(s->ranges_h + B, &a0, &keep, 1, B, S, c->sliding_window);
    STEP(cudaMemcpyAsync(s->tokens, s->draft_h, sizeof(int32_t) * B, cudaMemcpyHostToDevice, st) == cudaSuccess
             ? 0
             : -EIO,
         "block upload");
    STEP(cudaMemcpyAsync(s->ranges, s->ranges_h, sizeof(nn_key_ranges) * 2 * B, cudaMemcpyHostToDevice, st) ==
                 cudaSuccess
             ? 0
             : -EIO,
         "ranges upload");
    STEP(nn_embed_cuda(s->h, s->embed, s->tokens, B, d, V, NULL, st, why, sizeof why), "embed");
    STEP(decode_positions_cuda(s->pos, S, B, st), "positions");
    for (l = 0; l < c->n_layers; l++) {
        const infer_layer_cuda *L = &s->layer[l];
        nn_bf16_cuda *kl = s->kc + l * layer_stride(s), *vl = s->vc + l * layer_stride(s);
        STEP(nn_add_rmsnorm_cuda(s->h, l > 0 ? s->y : NULL, L->in_norm, s->a, NULL, 0, B, d, eps, st, why, sizeof why), "input norm");
        STEP(linear(s, s->qkv, s->a, L->w_qkv, B, d, qkv_n, why, sizeof why), "linear qkv");
        STEP(nn_qk_norm_rope_cuda(s->qkv, L->q_norm, L->k_norm, s->inv_freq, s->pos, B, H, KV, hd, eps, st, why, sizeof why),
             "qk_norm_rope");
        /* the block's K/V go after the context rows: used by this draft, then dropped */
        STEP(decode_kv_append_cuda(kl, vl, s->qkv, B, H, KV, hd, S, st), "kv append (block)");
        STEP(decode_attention_cuda(s->att, s->qkv, qkv_n, kl, vl, s->ranges + (c->layer_sliding[l] ? B : 0), 0, 0, B, H, KV,
                           hd, scale, st),
             "attention");
        STEP(linear(s, s->y, s->att, L->w_o, B, H * hd, d, why, sizeof why), "linear o_proj");
        STEP(nn_add_rmsnorm_cuda(s->h, s->y, L->post_norm, s->a, NULL, 0, B, d, eps, st, why, sizeof why), "post norm");
        STEP(linear(s, s->gu, s->a, L->w_gu, B, d, 2 * I, why, sizeof why), "linear gate_up");
        STEP(nn_swiglu_cuda(s->act, s->gu, B, I, st, why, sizeof why), "swiglu");
        STEP(linear(s, s->y, s->act, L->w_down, B, I, d, why, sizeof why), "linear down");
    }
    l = -1;
    STEP(nn_add_rmsnorm_cuda(s->h, s->y, s->final_norm, s->z, NULL, 0, B, d, eps, st, why, sizeof why), "final norm");
    /* row k (k >= 1) predicts the token at anchor + k; row 0 predicts nothing */
    STEP(decode_linear_rows_cuda(s->logits, 1, s->z + d, s->lm_head, NULL, B - 1, d, V, st), "lm_head");
    STEP(decode_argmax_rows_cuda(s->draft_d, s->logits, B - 1, V, st), "argmax");
    STEP(cudaMemcpyAsync(s->draft_h, s->draft_d, sizeof(int32_t) * (B - 1), cudaMemcpyDeviceToHost, st) ==
                 cudaSuccess
             ? 0
             : -EIO,
         "draft download");
    int rc = sync_stream(s);
    if (rc < 0)
        return rc;
    memcpy(draft, s->draft_h, sizeof(int32_t) * (B - 1));
    return 0;
}

int infer_logits_to_host_cuda(infer_state_cuda *s, float *out)
{
    size_t n = (size_t)(s->c->block_size - 1) * s->c->vocab;
    if (cudaMemcpy(out, s->logits, sizeof(float) * n, cudaMemcpyDeviceToHost) != cudaSuccess) {
        snprintf(s->err, sizeof s->err, "infer_logits_to_host_cuda: %s", cudaGetErrorString(cudaGetLastError()));
        return -EIO;
    }
    return 0;
}
