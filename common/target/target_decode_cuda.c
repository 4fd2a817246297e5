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

#include "cuda_check.h"

void decode_free_cuda(decode_model_cuda *m)
{
    if (!m)
        return;
    decode_drop_graphs_cuda(m);
    if (m->lm_head_owned)
        cudaFree(m->lm_head);
    cudaFree(m->final_norm), cudaFree(m->kc), cudaFree(m->vc), cudaFree(m->feat), cudaFree(m->z);
    cudaFree(m->logits), cudaFree(m->tokens), cudaFree(m->next_d), cudaFree(m->len_d), cudaFree(m->meta_d);
    cudaFree(m->sync_d);
    free(m->seq_len);
    if (m->meta_h)
        cudaFreeHost(m->meta_h);
    if (m->next_h)
        cudaFreeHost(m->next_h);
    if (m->tok_h)
        cudaFreeHost(m->tok_h);
    if (m->len_h)
        cudaFreeHost(m->len_h);
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
        return df_err(err, errlen, -ENOMEM, "%s: cudaMalloc(%s, %zu bytes): %s", dir, what, n, cudaGetErrorString(e));
    }
    return 0;
}

/* bf16 device copy of host fp32 src[n] (RNE, as target_load_weights_cuda). */
static int upload_bf16(nn_bf16_cuda *dst, const float *src, size_t n)
{
    uint16_t *h = malloc(sizeof(uint16_t) * (n ? n : 1));
    if (!h)
        return -ENOMEM;
    safetensors_f32_to_bf16_n(h, src, n); /* on every core: an 8B lm_head is 622 M values */
    cudaError_t e = cudaMemcpy(dst, h, sizeof(uint16_t) * n, cudaMemcpyHostToDevice);
    free(h);
    return e == cudaSuccess ? 0 : -EIO;
}

static int check_setup(const char *what, int n_capture, int max_ctx, int max_next, int n_seq, char *err, size_t errlen)
{
    if (n_capture < 1 || n_capture >= 64 || max_ctx < 1 || max_next < 1 || max_next > max_ctx ||
        max_next > DECODE_LINEAR_MAX_ROWS || n_seq < 1 || n_seq > DECODE_CUDA_MAX_SEQ)
        return df_err(
            err, errlen, -EINVAL,
            "%s: bad decode setup: %d captured layers, cache of %d tokens, %d tokens per step (at most %d), %d "
            "sequences (1..%d)",
            what, n_capture, max_ctx, max_next, DECODE_LINEAR_MAX_ROWS, n_seq, DECODE_CUDA_MAX_SEQ);
    return 0;
}

/* Rows of the per-step buffers: a prefill (max_ctx) or a batched step (max_rows). */
static int work_rows(int max_ctx, int max_next, int n_seq)
{
    return DF_MAX(max_ctx, n_seq * max_next);
}

/* Capture ids for target_init / load: the caller's plus the last layer (so every layer
 * runs; its extra slot n_capture is not handed out). Returns the count. */
static int capture_ids(int *ids, const int *capture, int n_capture, int L)
{
    int n = 0, has_last = 0;
    for (int i = 0; i < n_capture; i++) {
        ids[n++] = capture[i];
        has_last |= capture[i] == L - 1;
    }
    if (!has_last)
        ids[n++] = L - 1;
    return n;
}

/* Everything but the weights, once m->tm is set up. */
static int alloc_buffers(decode_model_cuda *m, int n_capture, int max_ctx, int max_next, int n_seq, const char *what,
                         char *err, size_t errlen)
{
    const target_model_cuda *t = &m->tm;
    size_t d = (size_t)t->d, kvd = (size_t)t->KV * t->hd, V = (size_t)t->V, L = (size_t)t->n_layers;
    m->n_capture = n_capture;
    m->max_ctx = max_ctx;
    m->max_next = max_next;
    m->n_seq = n_seq;
    m->max_rows = n_seq * max_next;
    for (int l = 0; l < t->n_layers; l++)
        if (t->layers[l].window > 0) {
            if (m->window > 0 && m->window != t->layers[l].window)
                return df_err(err, errlen, -EINVAL, "%s: sliding layers with different windows (%d, %d)", what,
                              m->window, t->layers[l].window);
            m->window = t->layers[l].window;
        }
    size_t rows_out = (size_t)DF_MAX(max_next, m->max_rows), feat_rows = (size_t)work_rows(max_ctx, max_next, n_seq);
    m->seq_len = calloc((size_t)n_seq, sizeof(int));
    if (!m->seq_len)
        return df_err(err, errlen, -ENOMEM, "%s: out of memory", what);
    m->small_rows = DECODE_LINEAR_MAX_ROWS;
    m->use_graphs = 1;
    m->fused = DECODE_FUSED_DEFAULT;
    size_t cache = L * (size_t)n_seq * max_ctx * kvd * sizeof(nn_bf16_cuda);
    int rc;
    if ((rc = dev_alloc(&m->final_norm, sizeof(float) * d, "final_norm", what, err, errlen)) < 0 ||
        (rc = dev_alloc(&m->kc, cache, "K cache", what, err, errlen)) < 0 ||
        (rc = dev_alloc(&m->vc, cache, "V cache", what, err, errlen)) < 0 ||
        (rc = dev_alloc(&m->feat, sizeof(nn_bf16_cuda) * feat_rows * n_capture * d, "features", what, err, errlen)) <
            0 ||
        (rc = dev_alloc(&m->z, sizeof(nn_bf16_cuda) * rows_out * d, "z", what, err, errlen)) < 0 ||
        (rc = dev_alloc(&m->logits, sizeof(float) * rows_out * V, "logits", what, err, errlen)) < 0 ||
        (rc = dev_alloc(&m->tokens, sizeof(int32_t) * feat_rows, "tokens", what, err, errlen)) < 0 ||
        (rc = dev_alloc(&m->len_d, sizeof(int32_t), "length", what, err, errlen)) < 0 ||
        (rc = dev_alloc(&m->next_d, sizeof(int32_t) * rows_out, "next", what, err, errlen)) < 0 ||
        (rc = dev_alloc(&m->meta_d, sizeof(int32_t) * 10 * (size_t)m->max_rows, "row metadata", what, err, errlen)) <
            0 ||
        (rc = dev_alloc(&m->sync_d, DECODE_EPI_SYNC_BYTES, "epilogue scratch", what, err, errlen)) < 0)
        return rc;
    CUDA_TRY(cudaMemset(m->sync_d, 0, DECODE_EPI_SYNC_BYTES), err, errlen);
    CUDA_TRY(cudaMallocHost((void **)&m->next_h, sizeof(int32_t) * rows_out), err, errlen);
    CUDA_TRY(cudaMallocHost((void **)&m->tok_h, sizeof(int32_t) * feat_rows), err, errlen);
    CUDA_TRY(cudaMallocHost((void **)&m->meta_h, sizeof(int32_t) * 10 * (size_t)m->max_rows), err, errlen);
    CUDA_TRY(cudaMallocHost((void **)&m->len_h, sizeof(int32_t)), err, errlen);
    CUDA_TRY(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking), err, errlen);
    return 0;
}

int decode_load_cuda(decode_model_cuda *m, const char *dir, const int *capture, int n_capture, int max_ctx,
                     int max_next, char *err, size_t errlen)
{
    return decode_load_batch_cuda(m, dir, capture, n_capture, max_ctx, max_next, 1, err, errlen);
}

int decode_load_batch_cuda(decode_model_cuda *m, const char *dir, const int *capture, int n_capture, int max_ctx,
                           int max_next, int n_seq, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    int rc = check_setup(dir, n_capture, max_ctx, max_next, n_seq, err, errlen);
    if (rc < 0)
        return rc;
    hfconfig c;
    if ((rc = hfconfig_load(&c, dir, err, errlen)) < 0)
        return rc;
    int L = c.num_hidden_layers;
    hfconfig_free(&c);
    int ids[65], n = capture_ids(ids, capture, n_capture, L);
    if ((rc = target_load_cuda(&m->tm, dir, ids, n, work_rows(max_ctx, max_next, n_seq), err, errlen)) < 0)
        return rc;
    target_embeddings e;
    if ((rc = target_load_embeddings(&e, dir, 1, err, errlen)) < 0)
        goto fail;
    size_t d = (size_t)m->tm.d, V = (size_t)m->tm.V;
    if ((rc = alloc_buffers(m, n_capture, max_ctx, max_next, n_seq, dir, err, errlen)) < 0) {
        target_embeddings_free(&e);
        goto fail;
    }
    if (cudaMemcpy(m->final_norm, e.final_norm, sizeof(float) * d, cudaMemcpyHostToDevice) != cudaSuccess) {
        snprintf(err, errlen, "%s: final norm upload: %s", dir, cudaGetErrorString(cudaGetLastError()));
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

int decode_init_random_cuda(decode_model_cuda *m, const hfconfig *cfg, const int *capture, int n_capture, int max_ctx,
                            int max_next, uint64_t seed, char *err, size_t errlen)
{
    return decode_init_random_batch_cuda(m, cfg, capture, n_capture, max_ctx, max_next, 1, seed, err, errlen);
}

int decode_init_random_batch_cuda(decode_model_cuda *m, const hfconfig *cfg, const int *capture, int n_capture,
                                  int max_ctx, int max_next, int n_seq, uint64_t seed, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    int rc = check_setup("random target", n_capture, max_ctx, max_next, n_seq, err, errlen);
    if (rc < 0)
        return rc;
    int ids[65], n = capture_ids(ids, capture, n_capture, cfg->num_hidden_layers);
    if ((rc = target_init_cuda(&m->tm, cfg, ids, n, work_rows(max_ctx, max_next, n_seq), err, errlen)) < 0)
        return rc;
    if ((rc = target_randomize_cuda(&m->tm, seed, err, errlen)) < 0)
        goto fail;
    if ((rc = alloc_buffers(m, n_capture, max_ctx, max_next, n_seq, "random target", err, errlen)) < 0)
        goto fail;
    size_t d = (size_t)m->tm.d, V = (size_t)m->tm.V;
    if (cfg->tie_word_embeddings) {
        m->lm_head = m->tm.embed;
    } else {
        if ((rc = dev_alloc(&m->lm_head, sizeof(nn_bf16_cuda) * V * d, "lm_head", "random target", err, errlen)) < 0)
            goto fail;
        m->lm_head_owned = 1;
        if ((rc = nn_fill_uniform_bf16_cuda(m->lm_head, V * d, seed ^ 0x9e3779b97f4a7c15ull, 0.02f, m->stream, err,
                                            errlen)) < 0)
            goto fail;
    }
    if ((rc = nn_fill_uniform_f32_cuda(m->final_norm, d, seed + 7, 1.0f, 0.1f, m->stream, err, errlen)) < 0)
        goto fail;
    CUDA_TRY_GOTO(cudaStreamSynchronize(m->stream), err, errlen, rc, fail);
    return 0;
fail:
    decode_free_cuda(m);
    return rc;
}

void decode_reset_cuda(decode_model_cuda *m)
{
    m->len = 0;
}

void decode_drop_graphs_cuda(decode_model_cuda *m)
{
    for (int i = 0; i < m->n_graphs; i++)
        cudaGraphExecDestroy(m->graphs[i].exec);
    m->n_graphs = 0;
}

/* Where sequence s's length lives (sequence 0: m->len). */
static int *len_of(decode_model_cuda *m, int s)
{
    return s ? &m->seq_len[s] : &m->len;
}

int decode_seq_len_cuda(const decode_model_cuda *m, int s)
{
    return s < 0 || s >= m->n_seq ? -EINVAL : s ? m->seq_len[s] : m->len;
}

void decode_reset_seq_cuda(decode_model_cuda *m, int s)
{
    if (s >= 0 && s < m->n_seq)
        *len_of(m, s) = 0;
}

int decode_truncate_cuda(decode_model_cuda *m, int len)
{
    return decode_truncate_seq_cuda(m, 0, len);
}

int decode_truncate_seq_cuda(decode_model_cuda *m, int s, int len)
{
    if (s < 0 || s >= m->n_seq || len < 0 || len > *len_of(m, s))
        return -EINVAL;
    *len_of(m, s) = len; /* rows >= len are overwritten by the next extend */
    return 0;
}

double decode_step_bytes_cuda(const decode_model_cuda *m, int len, int k, int n_next)
{
    return decode_step_bytes_moe_cuda(m, len, k, n_next, -1.0);
}

double decode_step_bytes_moe_cuda(const decode_model_cuda *m, int len, int k, int n_next, double distinct)
{
    const target_model_cuda *t = &m->tm;
    double d = t->d, I = t->I, qd = (double)t->H * t->hd, kvd = (double)t->KV * t->hd;
    double attn = (d * (qd + 2 * kvd) + qd * d) * 2 + 2 * d * 4;
    double dense = (d * 2 * I + I * d) * 2;
    if (t->n_moe && distinct < 0) /* k rows routed uniformly: the expected number of distinct experts */
        distinct = t->E * (1.0 - pow(1.0 - (double)t->topk / t->E, k));
    double sparse = t->n_moe ? (double)t->E * d * 2 + distinct * 3.0 * d * t->F * 2 : 0;
    double bytes = attn * t->n_layers + dense * (t->n_layers - t->n_moe) + sparse * t->n_moe + 4 * d;
    if (n_next > 0)
        bytes += (double)t->V * d * 2;
    /* the k queries of one call read the rows before them and the new ones: the union is
     * len + k rows of K and V per layer */
    bytes += (double)t->n_layers * (len + k) * kvd * 2 * 2;
    return bytes;
}

/* nn_add_rmsnorm_cuda, launched as a programmatic dependent when decode_pdl_small_cuda is
 * on (the same bits). */
static int addnorm(float *x, const nn_bf16_cuda *y, const float *w, nn_bf16_cuda *out, nn_bf16_cuda *capture,
                   long cap_stride, int T, int d, float eps, cudaStream_t s, char *err, size_t errlen)
{
    return decode_pdl_small_cuda(-1)
               ? nn_add_rmsnorm_pdl_cuda(x, y, w, out, capture, cap_stride, T, d, eps, s, err, errlen)
               : nn_add_rmsnorm_cuda(x, y, w, out, capture, cap_stride, T, d, eps, s, err, errlen);
}

/* addnorm with out chunk-major (xc, DECODE_FUSE_XC) or row-major. */
static int addnorm_x(int xc, float *x, const nn_bf16_cuda *y, const float *w, nn_bf16_cuda *out, nn_bf16_cuda *capture,
                     long cap_stride, int T, int d, float eps, cudaStream_t s, char *err, size_t errlen)
{
    if (xc)
        return nn_add_rmsnorm_xc_cuda(x, y, w, out, capture, cap_stride, T, d, eps, decode_pdl_small_cuda(-1), s, err,
                                      errlen);
    return addnorm(x, y, w, out, capture, cap_stride, T, d, eps, s, err, errlen);
}

/* Whether a call of T rows takes chunk-major activations (DECODE_FUSE_XC in fz, the GLU
 * epilogue on, every width a multiple of DECODE_XC_CHUNK). */
static int use_xc(const target_model_cuda *t, int fz, int gepi, int T)
{
    return (fz & DECODE_FUSE_XC) && gepi && T >= DECODE_XC_MIN_ROWS && T <= DECODE_EPI_MAX_ROWS &&
           t->d % DECODE_XC_CHUNK == 0 && (t->H * t->hd) % DECODE_XC_CHUNK == 0 && t->I % DECODE_XC_CHUNK == 0;
}

/* out = x w^T + b over T rows: the row-exact kernel for decode-sized calls, cuBLASLt
 * (tensor cores) for prefills. */
static int linear(decode_model_cuda *m, nn_bf16_cuda *out, const nn_bf16_cuda *x, const nn_bf16_cuda *w,
                  const nn_bf16_cuda *b, int T, int n_in, int n_out, char *kerr, size_t kerrlen)
{
    if (T <= m->small_rows)
        return decode_linear_rows_cuda(out, 0, x, w, b, T, n_in, n_out, m->stream, kerr, kerrlen);
    nn_gemm_args_cuda a = nn_gemm_linear_args_cuda(out, x, w, b, T, n_in, n_out);
    return nn_gemm_run_cuda(m->tm.gemm, &a, m->stream, kerr, kerrlen);
}

/* The fusions a model with routed experts keeps: those that leave the MLP block's input a
 * (row-major) and its output y (bf16, added by the next add + RMSNorm) where the experts
 * read and write them. Off: the residual and SwiGLU-in-down fusions (no bf16 y / a down
 * projection to fuse into), the add + RMSNorm tail of down (the next layer may follow a
 * sparse layer) and chunk-major activations (a would be chunk-major). The dense layers of
 * such a model then run the same remaining sequence. */
static int moe_fuse_mask(const target_model_cuda *t, int fz)
{
    if (!t->n_moe)
        return fz;
    return fz & ~(DECODE_FUSE_RESIDUAL | DECODE_FUSE_SWIGLU | DECODE_FUSE_NORM | DECODE_FUSE_XC);
}

/* Run a step; on failure name it, the layer and the cause (the callee's kerr) in err. */
#define STEP(call, what) CUDA_LAYER_STEP(call, "decode_extend_cuda", what)

/* Enqueue one extend of k tokens of sequence seq whose ids are in m->tok_h: the rows start
 * at p0 + *base of that sequence (base = m->len_d inside a graph, NULL eagerly). */
static int enqueue_extend(decode_model_cuda *m, int seq, int k, int n_next, const int32_t *base, int p0, char *err,
                          size_t errlen)
{
    target_model_cuda *t = &m->tm;
    const int d = t->d, I = t->I, H = t->H, KV = t->KV, hd = t->hd, nc = m->n_capture;
    const int qkv_n = (H + 2 * KV) * hd;
    const long cap_stride = (long)nc * d;
    const size_t lstride = (size_t)m->n_seq * m->max_ctx * KV * hd, soff = (size_t)seq * m->max_ctx * KV * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    cudaStream_t s = m->stream;
    char kerr[256];
    int l = -1;
    /* the fused sequence (decode-sized calls with m->fused, DECODE_FUSE_* bits): o_proj and
     * down add their outputs to the fp32 residual inside the linear kernel (no bf16 y), q/k
     * norm + RoPE + cache append in one kernel, SwiGLU inside down's loads; otherwise y and
     * separate kernels (prefills: cuBLASLt) */
    const int fz = k <= m->small_rows ? moe_fuse_mask(t, DECODE_FUSE_BITS(m->fused)) : 0;
    const int f_qk = fz & DECODE_FUSE_QK_APPEND, f_res = fz & DECODE_FUSE_RESIDUAL, f_glu = fz & DECODE_FUSE_SWIGLU;
    const nn_bf16_cuda *yadd = f_res ? NULL : t->y;
    /* the bit-exact fusions (DECODE_FUSE_GLU / NORM / ARGMAX: the separate kernels' bits),
     * for calls their kernels take; NORM replaces the bf16 y of the separate sequence, so
     * not with the residual or SwiGLU-in-down bits */
    const int ep_ok = k <= DECODE_EPI_MAX_ROWS;
    const int f_gepi = ep_ok && (fz & DECODE_FUSE_GLU) && !f_glu && I % 8 == 0;
    const int f_norm = ep_ok && k <= DECODE_NORM_TAIL_ROWS && (fz & DECODE_FUSE_NORM) && !f_res && !f_glu;
    const int f_amax = (fz & DECODE_FUSE_ARGMAX) && n_next <= DECODE_EPI_MAX_ROWS;
    const int f_qkt = f_qk && (fz & DECODE_FUSE_QK_TAIL) && k <= DECODE_QK_TAIL_ROWS;
    /* chunk-major a / att / h (and z when the argmax is its own kernel) */
    const int f_xc = !f_norm && !f_glu && !f_qkt && use_xc(t, fz, f_gepi, k);
    STEP(cudaMemcpyAsync(m->tokens, m->tok_h, sizeof(int32_t) * k, cudaMemcpyHostToDevice, s) == cudaSuccess ? 0 : -EIO,
         "token upload");
    if (base)
        STEP(cudaMemcpyAsync(m->len_d, m->len_h, sizeof(int32_t), cudaMemcpyHostToDevice, s) == cudaSuccess ? 0 : -EIO,
             "length upload");
    if (!f_qk)
        STEP(decode_positions_cuda(t->pos, base, p0, k, s, kerr, sizeof kerr), "positions");
    STEP(nn_embed_cuda(t->x, t->embed, m->tokens, k, d, t->V, t->bad_token, s, kerr, sizeof kerr), "embed");
    for (l = 0; l < t->n_layers; l++) {
        const target_layer_cuda *Lw = &t->layers[l];
        nn_bf16_cuda *kl = m->kc + l * lstride + soff, *vl = m->vc + l * lstride + soff;
        /* x += y (previous MLP), capture layer l-1 when the caller asked for it, a = in_norm(x) */
        int prev = l > 0 ? t->capture_slot[l - 1] : -1;
        if (!f_norm || l == 0) /* (f_norm: the previous layer's down did it) */
            STEP(addnorm_x(f_xc, t->x, l > 0 ? yadd : NULL, Lw->in_norm, t->a,
                           prev >= 0 && prev < nc ? m->feat + (size_t)prev * d : NULL, cap_stride, k, d, t->eps, s,
                           kerr, sizeof kerr),
                 "add_rmsnorm (input)");
        if (f_qkt) {
            decode_qk_tail qt = {H, KV, hd, Lw->q_norm, Lw->k_norm, t->inv_freq, t->eps, kl, vl, base, p0, m->sync_d};
            STEP(decode_linear_qk_rows_cuda(t->qkv, t->a, Lw->w_qkv, Lw->b_qkv, k, d, &qt, s, kerr, sizeof kerr),
                 "linear qkv + qk_norm_rope + kv append");
        } else if (f_xc) {
            STEP(decode_linear_rows_xc_cuda(t->qkv, 0, t->a, Lw->w_qkv, Lw->b_qkv, k, d, qkv_n, s, kerr, sizeof kerr),
                 "linear qkv");
        } else {
            STEP(linear(m, t->qkv, t->a, Lw->w_qkv, Lw->b_qkv, k, d, qkv_n, kerr, sizeof kerr), "linear qkv");
        }
        if (f_qkt) {
            /* done in the qkv projection's last block */
        } else if (f_qk) {
            STEP(decode_qk_norm_rope_append_cuda(t->qkv, Lw->q_norm, Lw->k_norm, t->inv_freq, kl, vl, k, H, KV, hd,
                                                 t->eps, base, p0, s, kerr, sizeof kerr),
                 "qk_norm_rope + kv append");
        } else {
            STEP(nn_qk_norm_rope_cuda(t->qkv, Lw->q_norm, Lw->k_norm, t->inv_freq, t->pos, k, H, KV, hd, t->eps, s,
                                      kerr, sizeof kerr),
                 "qk_norm_rope");
            STEP(decode_kv_append_cuda(kl, vl, t->qkv, k, H, KV, hd, base, p0, s, kerr, sizeof kerr), "kv append");
        }
        STEP((f_xc ? decode_attention_xc_cuda : decode_attention_cuda)(
                 t->att, t->qkv, qkv_n, kl, vl, NULL, base, p0, Lw->window, k, H, KV, hd, scale, s, kerr, sizeof kerr),
             "attention");
        if (f_xc) {
            STEP(decode_linear_rows_xc_cuda(f_res ? (void *)t->x : (void *)t->y, f_res ? 2 : 0, t->att, Lw->w_o,
                                            Lw->b_o, k, H * hd, d, s, kerr, sizeof kerr),
                 f_res ? "linear o_proj + residual" : "linear o_proj");
        } else if (f_norm) {
            decode_norm_tail tl = {Lw->post_norm, t->a, 0, t->eps, NULL, 0, m->sync_d};
            STEP(decode_linear_residual_rows_cuda(t->x, t->att, Lw->w_o, Lw->b_o, k, H * hd, d, &tl, s, kerr,
                                                  sizeof kerr),
                 "linear o_proj + add_rmsnorm (post)");
        } else if (f_res) {
            STEP(decode_linear_rows_cuda(t->x, 2, t->att, Lw->w_o, Lw->b_o, k, H * hd, d, s, kerr, sizeof kerr),
                 "linear o_proj + residual");
        } else {
            STEP(linear(m, t->y, t->att, Lw->w_o, Lw->b_o, k, H * hd, d, kerr, sizeof kerr), "linear o_proj");
        }
        if (!f_norm)
            STEP(addnorm_x(f_xc, t->x, yadd, Lw->post_norm, t->a, NULL, 0, k, d, t->eps, s, kerr, sizeof kerr),
                 "add_rmsnorm (post)");
        if (Lw->moe) { /* routed experts into y (the fusions that would replace y are off: moe_fuse_mask) */
            STEP(target_moe_mlp_cuda(t, l, t->a, t->y, k, k <= m->small_rows, s, kerr, sizeof kerr), "experts");
            continue;
        }
        if (f_xc)
            STEP(decode_linear_glu_rows_xc_cuda(t->h, t->a, Lw->w_gu, Lw->b_gu, k, d, I, s, kerr, sizeof kerr),
                 "linear gate_up + swiglu");
        else if (f_gepi)
            STEP(decode_linear_glu_rows_cuda(t->h, t->a, Lw->w_gu, Lw->b_gu, k, d, I, s, kerr, sizeof kerr),
                 "linear gate_up + swiglu");
        else
            STEP(linear(m, t->gu, t->a, Lw->w_gu, Lw->b_gu, k, d, 2 * I, kerr, sizeof kerr), "linear gate_up");
        if (f_norm) {
            /* down adds to x; its last block does the next layer's input add_rmsnorm with the
             * capture of this layer, or after the last layer the capture and the final norm
             * of the n_next rows the logits are for */
            int cur = t->capture_slot[l], lastl = l == t->n_layers - 1;
            decode_norm_tail tl = {lastl ? (n_next > 0 ? m->final_norm : NULL) : t->layers[l + 1].in_norm,
                                   lastl ? (n_next > 0 ? m->z : NULL) : t->a,
                                   lastl ? k - n_next : 0,
                                   t->eps,
                                   cur >= 0 && cur < nc ? m->feat + (size_t)cur * d : NULL,
                                   cap_stride,
                                   m->sync_d};
            if (!f_gepi)
                STEP(nn_swiglu_cuda(t->h, t->gu, k, I, s, kerr, sizeof kerr), "swiglu");
            STEP(decode_linear_residual_rows_cuda(t->x, t->h, Lw->w_down, Lw->b_down, k, I, d, &tl, s, kerr,
                                                  sizeof kerr),
                 lastl ? "linear down + add (last layer) + final norm" : "linear down + add_rmsnorm (input)");
        } else if (f_xc) {
            STEP(decode_linear_rows_xc_cuda(f_res ? (void *)t->x : (void *)t->y, f_res ? 2 : 0, t->h, Lw->w_down,
                                            Lw->b_down, k, I, d, s, kerr, sizeof kerr),
                 f_res ? "linear down + residual" : "linear down");
        } else if (f_gepi) {
            if (f_res)
                STEP(decode_linear_rows_cuda(t->x, 2, t->h, Lw->w_down, Lw->b_down, k, I, d, s, kerr, sizeof kerr),
                     "linear down + residual");
            else
                STEP(linear(m, t->y, t->h, Lw->w_down, Lw->b_down, k, I, d, kerr, sizeof kerr), "linear down");
        } else if (f_glu) /* SwiGLU inside the down projection's loads */
            STEP(decode_linear_swiglu_rows_cuda(f_res ? (void *)t->x : (void *)t->y, f_res ? 2 : 0, t->gu, Lw->w_down,
                                                Lw->b_down, k, I, d, s, kerr, sizeof kerr),
                 "swiglu + linear down");
        else {
            STEP(nn_swiglu_cuda(t->h, t->gu, k, I, s, kerr, sizeof kerr), "swiglu");
            if (f_res)
                STEP(decode_linear_rows_cuda(t->x, 2, t->h, Lw->w_down, Lw->b_down, k, I, d, s, kerr, sizeof kerr),
                     "linear down + residual");
            else
                STEP(linear(m, t->y, t->h, Lw->w_down, Lw->b_down, k, I, d, kerr, sizeof kerr), "linear down");
        }
    }
    l = t->n_layers - 1;
    int last = t->capture_slot[l];
    if (!f_norm)
        STEP(addnorm(t->x, yadd, NULL, NULL, last >= 0 && last < nc ? m->feat + (size_t)last * d : NULL, cap_stride, k,
                     d, t->eps, s, kerr, sizeof kerr),
             "add (last layer)");
    if (n_next > 0) {
        float *xl = t->x + (size_t)(k - n_next) * d;
        const int z_xc = f_xc && !f_amax; /* (one row: both layouts are the same) */
        if (!f_norm)
            STEP(addnorm_x(z_xc, xl, NULL, m->final_norm, m->z, NULL, 0, n_next, d, t->eps, s, kerr, sizeof kerr),
                 "final norm");
        if (z_xc) {
            STEP(
                decode_linear_rows_xc_cuda(m->logits, 1, m->z, m->lm_head, NULL, n_next, d, t->V, s, kerr, sizeof kerr),
                "lm_head");
            if ((fz & DECODE_FUSE_ARGMAX_SPLIT) && n_next <= DECODE_EPI_MAX_ROWS)
                STEP(decode_argmax_split_rows_cuda(m->next_d, m->logits, n_next, t->V, m->sync_d, s, kerr, sizeof kerr),
                     "argmax");
            else
                STEP(decode_argmax_rows_cuda(m->next_d, m->logits, n_next, t->V, s, kerr, sizeof kerr), "argmax");
        } else if (f_amax) {
            STEP(decode_linear_argmax_rows_cuda(m->logits, m->next_d, m->z, m->lm_head, n_next, d, t->V, m->sync_d, s,
                                                kerr, sizeof kerr),
                 "lm_head + argmax");
        } else {
            STEP(decode_linear_rows_cuda(m->logits, 1, m->z, m->lm_head, NULL, n_next, d, t->V, s, kerr, sizeof kerr),
                 "lm_head");
            if ((fz & DECODE_FUSE_ARGMAX_SPLIT) && n_next <= DECODE_EPI_MAX_ROWS) /* the same indices, spread */
                STEP(decode_argmax_split_rows_cuda(m->next_d, m->logits, n_next, t->V, m->sync_d, s, kerr, sizeof kerr),
                     "argmax");
            else
                STEP(decode_argmax_rows_cuda(m->next_d, m->logits, n_next, t->V, s, kerr, sizeof kerr), "argmax");
        }
        STEP(cudaMemcpyAsync(m->next_h, m->next_d, sizeof(int32_t) * n_next, cudaMemcpyDeviceToHost, s) == cudaSuccess
                 ? 0
                 : -EIO,
             "greedy tokens download");
    }
    return 0;
}

/* A linear layer of T rows with the row-exact kernel, in pieces of DECODE_LINEAR_MAX_ROWS
 * rows (a row's bits do not depend on the piece it is in). out_f32 as decode_linear_rows_cuda. */
static int linear_exact(decode_model_cuda *m, void *out, int out_f32, const nn_bf16_cuda *x, const nn_bf16_cuda *w,
                        const nn_bf16_cuda *b, int T, int n_in, int n_out, char *kerr, size_t kerrlen)
{
    size_t osz = out_f32 ? sizeof(float) : sizeof(nn_bf16_cuda);
    for (int r0 = 0; r0 < T; r0 += DECODE_LINEAR_MAX_ROWS) {
        int rc = decode_linear_rows_cuda((char *)out + (size_t)r0 * n_out * osz, out_f32, x + (size_t)r0 * n_in, w, b,
                                         DF_MIN(DECODE_LINEAR_MAX_ROWS, T - r0), n_in, n_out, m->stream, kerr, kerrlen);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* decode_linear_glu_rows_cuda over T rows in pieces of DECODE_EPI_MAX_ROWS. */
static int glu_exact(decode_model_cuda *m, nn_bf16_cuda *h, const nn_bf16_cuda *x, const nn_bf16_cuda *w,
                     const nn_bf16_cuda *b, int T, int n_in, int I, char *kerr, size_t kerrlen)
{
    for (int r0 = 0; r0 < T; r0 += DECODE_EPI_MAX_ROWS) {
        int rc = decode_linear_glu_rows_cuda(h + (size_t)r0 * I, x + (size_t)r0 * n_in, w, b,
                                             DF_MIN(DECODE_EPI_MAX_ROWS, T - r0), n_in, I, m->stream, kerr, kerrlen);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Enqueue a batched step of R rows: tokens in m->tok_h, row metadata in m->meta_h
 * (positions [R], cache rows [R], full-layer key ranges [R], sliding-layer ones [R]),
 * both copied inside the step. The kernels are enqueue_extend's for a small extend with
 * per-row positions, cache rows and key ranges: the bit-exact fusions of m->fused (q/k +
 * append, gate/up + SwiGLU, the split argmax), never the residual or SwiGLU-in-down ones
 * (decode_extend_batch_cuda refuses those). */
static int enqueue_batch(decode_model_cuda *m, int R, char *err, size_t errlen)
{
    target_model_cuda *t = &m->tm;
    const int d = t->d, I = t->I, H = t->H, KV = t->KV, hd = t->hd, nc = m->n_capture;
    const int qkv_n = (H + 2 * KV) * hd;
    const long cap_stride = (long)nc * d;
    const size_t lstride = (size_t)m->n_seq * m->max_ctx * KV * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    cudaStream_t s = m->stream;
    char kerr[256];
    int l = -1;
    int32_t *pos = m->meta_d, *crow = m->meta_d + R;
    const nn_key_ranges *full = (const nn_key_ranges *)(m->meta_d + 2 * R), *slide = full + R;
    const int fz = moe_fuse_mask(t, DECODE_FUSE_BITS(m->fused)), f_qk = fz & DECODE_FUSE_QK_APPEND;
    const int f_gepi = (fz & DECODE_FUSE_GLU) && I % 8 == 0;
    const int f_asplit = (fz & DECODE_FUSE_ARGMAX_SPLIT) && R <= DECODE_EPI_MAX_ROWS;
    const int f_xc = use_xc(t, fz, f_gepi, R); /* chunk-major a / att / h / z: one call of R rows each */
    STEP(cudaMemcpyAsync(m->tokens, m->tok_h, sizeof(int32_t) * R, cudaMemcpyHostToDevice, s) == cudaSuccess ? 0 : -EIO,
         "token upload");
    STEP(cudaMemcpyAsync(m->meta_d, m->meta_h, sizeof(int32_t) * 10 * (size_t)R, cudaMemcpyHostToDevice, s) ==
                 cudaSuccess
             ? 0
             : -EIO,
         "row metadata upload");
    STEP(nn_embed_cuda(t->x, t->embed, m->tokens, R, d, t->V, t->bad_token, s, kerr, sizeof kerr), "embed");
    for (l = 0; l < t->n_layers; l++) {
        const target_layer_cuda *Lw = &t->layers[l];
        nn_bf16_cuda *kl = m->kc + l * lstride, *vl = m->vc + l * lstride;
        int prev = l > 0 ? t->capture_slot[l - 1] : -1;
        STEP(addnorm_x(f_xc, t->x, l > 0 ? t->y : NULL, Lw->in_norm, t->a,
                       prev >= 0 && prev < nc ? m->feat + (size_t)prev * d : NULL, cap_stride, R, d, t->eps, s, kerr,
                       sizeof kerr),
             "add_rmsnorm (input)");
        STEP(f_xc ? decode_linear_rows_xc_cuda(t->qkv, 0, t->a, Lw->w_qkv, Lw->b_qkv, R, d, qkv_n, s, kerr, sizeof kerr)
                  : linear_exact(m, t->qkv, 0, t->a, Lw->w_qkv, Lw->b_qkv, R, d, qkv_n, kerr, sizeof kerr),
             "linear qkv");
        if (f_qk) {
            STEP(decode_qk_norm_rope_append_rows_cuda(t->qkv, Lw->q_norm, Lw->k_norm, t->inv_freq, kl, vl, R, H, KV, hd,
                                                      t->eps, pos, crow, s, kerr, sizeof kerr),
                 "qk_norm_rope + kv append");
        } else {
            STEP(nn_qk_norm_rope_cuda(t->qkv, Lw->q_norm, Lw->k_norm, t->inv_freq, pos, R, H, KV, hd, t->eps, s, kerr,
                                      sizeof kerr),
                 "qk_norm_rope");
            STEP(decode_kv_append_rows_cuda(kl, vl, t->qkv, R, H, KV, hd, crow, s, kerr, sizeof kerr), "kv append");
        }
        STEP((f_xc ? decode_attention_xc_cuda : decode_attention_cuda)(t->att, t->qkv, qkv_n, kl, vl,
                                                                       Lw->window > 0 ? slide : full, NULL, 0, 0, R, H,
                                                                       KV, hd, scale, s, kerr, sizeof kerr),
             "attention");
        STEP(f_xc ? decode_linear_rows_xc_cuda(t->y, 0, t->att, Lw->w_o, Lw->b_o, R, H * hd, d, s, kerr, sizeof kerr)
                  : linear_exact(m, t->y, 0, t->att, Lw->w_o, Lw->b_o, R, H * hd, d, kerr, sizeof kerr),
             "linear o_proj");
        STEP(addnorm_x(f_xc, t->x, t->y, Lw->post_norm, t->a, NULL, 0, R, d, t->eps, s, kerr, sizeof kerr),
             "add_rmsnorm (post)");
        if (Lw->moe) { /* every row row-exact, in passes of 64 rows past 64 */
            STEP(target_moe_mlp_cuda(t, l, t->a, t->y, R, 1, s, kerr, sizeof kerr), "experts");
            continue;
        }
        if (f_xc) {
            STEP(decode_linear_glu_rows_xc_cuda(t->h, t->a, Lw->w_gu, Lw->b_gu, R, d, I, s, kerr, sizeof kerr),
                 "linear gate_up + swiglu");
        } else if (f_gepi) {
            STEP(glu_exact(m, t->h, t->a, Lw->w_gu, Lw->b_gu, R, d, I, kerr, sizeof kerr), "linear gate_up + swiglu");
        } else {
            STEP(linear_exact(m, t->gu, 0, t->a, Lw->w_gu, Lw->b_gu, R, d, 2 * I, kerr, sizeof kerr), "linear gate_up");
            STEP(nn_swiglu_cuda(t->h, t->gu, R, I, s, kerr, sizeof kerr), "swiglu");
        }
        STEP(f_xc ? decode_linear_rows_xc_cuda(t->y, 0, t->h, Lw->w_down, Lw->b_down, R, I, d, s, kerr, sizeof kerr)
                  : linear_exact(m, t->y, 0, t->h, Lw->w_down, Lw->b_down, R, I, d, kerr, sizeof kerr),
             "linear down");
    }
    l = t->n_layers - 1;
    int last = t->capture_slot[l];
    STEP(addnorm(t->x, t->y, NULL, NULL, last >= 0 && last < nc ? m->feat + (size_t)last * d : NULL, cap_stride, R, d,
                 t->eps, s, kerr, sizeof kerr),
         "add (last layer)");
    STEP(addnorm_x(f_xc, t->x, NULL, m->final_norm, m->z, NULL, 0, R, d, t->eps, s, kerr, sizeof kerr), "final norm");
    STEP(f_xc ? decode_linear_rows_xc_cuda(m->logits, 1, m->z, m->lm_head, NULL, R, d, t->V, s, kerr, sizeof kerr)
              : linear_exact(m, m->logits, 1, m->z, m->lm_head, NULL, R, d, t->V, kerr, sizeof kerr),
         "lm_head");
    if (f_asplit) /* the same indices, spread */
        STEP(decode_argmax_split_rows_cuda(m->next_d, m->logits, R, t->V, m->sync_d, s, kerr, sizeof kerr), "argmax");
    else
        STEP(decode_argmax_rows_cuda(m->next_d, m->logits, R, t->V, s, kerr, sizeof kerr), "argmax");
    STEP(cudaMemcpyAsync(m->next_h, m->next_d, sizeof(int32_t) * R, cudaMemcpyDeviceToHost, s) == cudaSuccess ? 0
                                                                                                              : -EIO,
         "greedy tokens download");
    return 0;
}

/* The graph of (k, n_next) in *exec, captured on first use; NULL when the table is full
 * (the caller then runs eagerly). 0 or -errno (capture failed: err says why). */
static int graph_for(decode_model_cuda *m, int k, int n_next, cudaGraphExec_t *exec, char *err, size_t errlen)
{
    *exec = NULL;
    for (int i = 0; i < m->n_graphs; i++)
        if (m->graphs[i].k == k && m->graphs[i].n_next == n_next) {
            *exec = m->graphs[i].exec;
            return 0;
        }
    if (m->n_graphs == DECODE_CUDA_GRAPHS)
        return 0;
    CUDA_TRY(cudaStreamBeginCapture(m->stream, cudaStreamCaptureModeThreadLocal), err, errlen);
    int rc = n_next < 0 ? enqueue_batch(m, k, err, errlen) : enqueue_extend(m, 0, k, n_next, m->len_d, 0, err, errlen);
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(m->stream, &g);
    if (rc < 0) {
        if (g)
            cudaGraphDestroy(g);
        cudaGetLastError();
        return rc;
    }
    if (e != cudaSuccess)
        return df_err(err, errlen, -EIO, "decode_extend_cuda: graph capture of %d rows: %s", k, cudaGetErrorString(e));
    e = cudaGraphInstantiate(exec, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "decode_extend_cuda: graph of %d rows: cudaGraphInstantiate: %s", k,
                 cudaGetErrorString(e));
        *exec = NULL;
        return -EIO;
    }
    m->graphs[m->n_graphs++] = (decode_graph_cuda){k, n_next, *exec};
    return 0;
}

static int check_tokens(const decode_model_cuda *m, const int32_t *tokens, int k, char *err, size_t errlen)
{
    for (int i = 0; i < k; i++)
        if (tokens[i] < 0 || tokens[i] >= m->tm.V)
            return df_err(err, errlen, -ERANGE, "decode_extend_cuda: token %d = %d is outside the vocabulary [0, %d)",
                          i, tokens[i], m->tm.V);
    return 0;
}

int decode_extend_seq_cuda(decode_model_cuda *m, int seq, const int32_t *tokens, int k, int n_next, int32_t *next,
                           char *err, size_t errlen)
{
    if (seq < 0 || seq >= m->n_seq || k < 1 || n_next < 0 || n_next > k || n_next > m->max_next)
        return df_err(err, errlen, -EINVAL,
                      "decode_extend_cuda: sequence %d of %d, %d tokens, %d greedy rows (at most %d)", seq, m->n_seq, k,
                      n_next, m->max_next);
    int *len = len_of(m, seq);
    if (*len + k > m->max_ctx)
        return df_err(err, errlen, -ENOSPC, "decode_extend_cuda: %d + %d tokens overflow the cache of %d", *len, k,
                      m->max_ctx);
    int rc = check_tokens(m, tokens, k, err, errlen);
    if (rc < 0)
        return rc;
    /* the previous extend synchronised: the pinned buffers are free to overwrite */
    memcpy(m->tok_h, tokens, sizeof(int32_t) * k);
    *m->len_h = *len;
    cudaGraphExec_t exec = NULL;
    /* graphs address sequence 0's cache rows: other sequences (batch prefills) run eagerly */
    if (seq == 0 && m->use_graphs && k <= m->small_rows && (rc = graph_for(m, k, n_next, &exec, err, errlen)) < 0)
        return rc;
    if (exec)
        CUDA_TRY(cudaGraphLaunch(exec, m->stream), err, errlen);
    else if ((rc = enqueue_extend(m, seq, k, n_next, NULL, *len, err, errlen)) < 0)
        return rc;
    CUDA_TRY(cudaStreamSynchronize(m->stream), err, errlen);
    memcpy(next, m->next_h, sizeof(int32_t) * n_next);
    m->last_n_next = n_next;
    *len += k;
    return 0;
}

int decode_extend_cuda(decode_model_cuda *m, const int32_t *tokens, int k, int n_next, int32_t *next, char *err,
                       size_t errlen)
{
    return decode_extend_seq_cuda(m, 0, tokens, k, n_next, next, err, errlen);
}

int decode_extend_batch_cuda(decode_model_cuda *m, const int32_t *tokens, const int *ks, int32_t *next, char *err,
                             size_t errlen)
{
    int R = 0, rc;
    for (int s = 0; s < m->n_seq; s++) {
        if (ks[s] < 0)
            return df_err(err, errlen, -EINVAL, "decode_extend_batch_cuda: sequence %d: %d tokens", s, ks[s]);
        if (*len_of(m, s) + ks[s] > m->max_ctx)
            return df_err(err, errlen, -ENOSPC,
                          "decode_extend_batch_cuda: sequence %d: %d + %d tokens overflow the cache of %d", s,
                          *len_of(m, s), ks[s], m->max_ctx);
        R += ks[s];
    }
    /* a batch runs the bit-exact fusions only (enqueue_batch): the same bits as a lone
     * extend, which the residual and SwiGLU-in-down fusions would not give (they round
     * differently) */
    int other_fusions = DECODE_FUSE_BITS(m->fused) & (DECODE_FUSE_RESIDUAL | DECODE_FUSE_SWIGLU);
    if (R < 1 || R > m->max_rows || other_fusions)
        return df_err(err, errlen, -EINVAL, "decode_extend_batch_cuda: %d rows (1..%d)%s", R, m->max_rows,
                      other_fusions ? ", and batches run the separate kernels (fused 0 or DECODE_FUSE_QK_APPEND)" : "");
    if ((rc = check_tokens(m, tokens, R, err, errlen)) < 0)
        return rc;
    /* row metadata: position inside the sequence, cache row, and the keys it sees (the
     * causal ranges of a lone extend, shifted into the sequence's rows) */
    int32_t *pos = m->meta_h, *crow = m->meta_h + R;
    nn_key_ranges *full = (nn_key_ranges *)(m->meta_h + 2 * R), *slide = full + R;
    for (int s = 0, i = 0; s < m->n_seq; s++) {
        int base = s * m->max_ctx, p0 = *len_of(m, s);
        for (int j = 0; j < ks[s]; j++, i++) {
            int p = p0 + j;
            pos[i] = p, crow[i] = base + p;
            full[i] = (nn_key_ranges){base, base + p + 1, 0, 0};
            slide[i] = full[i];
            if (m->window > 0)
                slide[i].lo0 = base + DF_MAX(0, p - m->window + 1);
        }
    }
    memcpy(m->tok_h, tokens, sizeof(int32_t) * R);
    cudaGraphExec_t exec = NULL;
    if (m->use_graphs && (rc = graph_for(m, R, -1, &exec, err, errlen)) < 0)
        return rc;
    if (exec)
        CUDA_TRY(cudaGraphLaunch(exec, m->stream), err, errlen);
    else if ((rc = enqueue_batch(m, R, err, errlen)) < 0)
        return rc;
    CUDA_TRY(cudaStreamSynchronize(m->stream), err, errlen);
    memcpy(next, m->next_h, sizeof(int32_t) * R);
    m->last_n_next = R;
    for (int s = 0; s < m->n_seq; s++)
        *len_of(m, s) += ks[s];
    return 0;
}

int decode_logits_to_host_cuda(decode_model_cuda *m, float *out, char *err, size_t errlen)
{
    size_t n = (size_t)m->last_n_next * m->tm.V;
    CUDA_TRY(cudaMemcpy(out, m->logits, sizeof(float) * n, cudaMemcpyDeviceToHost), err, errlen);
    return 0;
}

int decode_feats_to_host_cuda(decode_model_cuda *m, int k, float *out, char *err, size_t errlen)
{
    size_t n = (size_t)k * m->n_capture * m->tm.d;
    uint16_t *h = malloc(sizeof(uint16_t) * (n ? n : 1));
    if (!h)
        return df_err(err, errlen, -ENOMEM, "decode_feats_to_host_cuda: out of memory");
    cudaError_t e = cudaMemcpy(h, m->feat, sizeof(uint16_t) * n, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "decode_feats_to_host_cuda: %s", cudaGetErrorString(e));
        free(h);
        return -EIO;
    }
    for (size_t i = 0; i < n; i++)
        out[i] = safetensors_bf16_to_f32(h[i]);
    free(h);
    return 0;
}
