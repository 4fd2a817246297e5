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

#include "cuda_check.h"

/* Context rows appended per pass (bounds the scratch). */
#define INFER_CUDA_CHUNK 256
/* Linear layers of at most this many rows use the row-exact kernel, longer ones cuBLASLt. */
#define INFER_CUDA_SMALL_ROWS DECODE_LINEAR_MAX_ROWS

void infer_free_cuda(infer_state_cuda *s)
{
    if (!s)
        return;
    if (s->draft_graph)
        cudaGraphExecDestroy(s->draft_graph);
    for (int i = 0; i < 65; i++)
        if (s->append_graph[i])
            cudaGraphExecDestroy(s->append_graph[i]);
    if (s->own_cache)
        cudaFree(s->kc), cudaFree(s->vc);
    cudaFree(s->wb), cudaFree(s->wf), cudaFree(s->acts), cudaFree(s->n_ctx_d);
    cudaFree(s->sync_d);
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
#define BF(dst, src, n)                                    \
    do {                                                   \
        uint16_t *h_ = take(bb, sizeof(uint16_t) * (n));   \
        if (hb) {                                          \
            size_t o_ = (size_t)((char *)h_ - (char *)hb); \
            safetensors_f32_to_bf16_n(h_, (src), (n));     \
            (dst) = (nn_bf16_cuda *)(db + o_);             \
        }                                                  \
    } while (0)
#define F32(dst, src, n)                                   \
    do {                                                   \
        float *h_ = take(bf, sizeof(float) * (n));         \
        if (hf) {                                          \
            size_t o_ = (size_t)((char *)h_ - (char *)hf); \
            memcpy(h_, (src), sizeof(float) * (n));        \
            (dst) = (float *)(df + o_);                    \
        }                                                  \
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

/* A CUDA call of s's setup failed: say which (with CUDA's last error), free s, return rc. */
static int cuda_fail(infer_state_cuda *s, char *err, size_t errlen, const char *what, int rc)
{
    df_err(err, errlen, rc, "drafter on the GPU: %s: %s", what, cudaGetErrorString(cudaGetLastError()));
    infer_free_cuda(s);
    return rc;
}

static int alloc_state(infer_state_cuda *s, nn_bf16_cuda *kc, nn_bf16_cuda *vc, size_t lstride, char *err,
                       size_t errlen);

int infer_init_cuda(infer_state_cuda *s, const dflash_config *c, const dflash_params *p, const nn_bf16_cuda *embed,
                    const nn_bf16_cuda *lm_head, int cap, cudaStream_t stream, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    int H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, B = c->block_size, d = c->hidden;
    int I = c->intermediate, V = c->vocab;
    size_t qd = (size_t)H * hd, kvd = (size_t)KV * hd;
    if (cap < 1 || B < 2 || B > DECODE_LINEAR_MAX_ROWS || hd % 2 || hd > 256 || KV < 1 || H % KV ||
        c->mask_token_id < 0 || c->mask_token_id >= V)
        return df_err(err, errlen, -EINVAL,
                      "drafter on the GPU: unsupported shape (cache %d, block %d, head_dim %d, heads %d/%d, mask token "
                      "%d of %d)",
                      cap, B, hd, H, KV, c->mask_token_id, V);
    for (int l = 0; l < c->n_layers; l++) {
        const dflash_layer_params *P = &p->layer[l];
        if (P->wk != P->wq + qd * d || P->wv != P->wk + kvd * d || P->w_up != P->w_gate + (size_t)I * d)
            return df_err(err, errlen, -EINVAL,
                          "drafter on the GPU: layer %d: q/k/v or gate/up not adjacent in the parameters", l);
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
        return df_err(err, errlen, -ENOMEM, "drafter on the GPU: out of host memory for the weights");
    }
    if (cudaMalloc(&s->wb, nb) != cudaSuccess || cudaMalloc(&s->wf, nf) != cudaSuccess) {
        free(hb), free(hf);
        return cuda_fail(s, err, errlen, "cudaMalloc(weights)", -ENOMEM);
    }
    bb = (bump){(char *)hb, 0}, bf = (bump){(char *)hf, 0};
    layout_weights(s, &bb, &bf, p, hb, hf, s->wb, s->wf);
    float *inv = take(&bf, sizeof(float) * (size_t)(hd / 2));
    nn_rope_inv_freq(inv, hd, c->rope_theta, &c->rope_scaling); /* as infer_init */
    s->inv_freq = (float *)((char *)s->wf + ((char *)inv - (char *)hf));
    int ok = cudaMemcpy(s->wb, hb, nb, cudaMemcpyHostToDevice) == cudaSuccess &&
             cudaMemcpy(s->wf, hf, nf, cudaMemcpyHostToDevice) == cudaSuccess;
    free(hb), free(hf);
    if (!ok)
        return cuda_fail(s, err, errlen, "weight upload", -EIO);
    return alloc_state(s, NULL, NULL, 0, err, errlen);
}

/* A context over the weights of `from` whose caches are a view of a batch's slab, layers
 * lstride elements apart. */
static int init_view(infer_state_cuda *s, const infer_state_cuda *from, int cap, nn_bf16_cuda *kc, nn_bf16_cuda *vc,
                     size_t lstride, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    if (cap < 1)
        return df_err(err, errlen, -EINVAL, "drafter on the GPU: a context cache of %d rows", cap);
    /* every weight pointer of `from`; wb / wf stay NULL: this state frees none of them */
    s->c = from->c, s->cap = cap, s->stream = from->stream, s->embed = from->embed, s->lm_head = from->lm_head;
    s->fc = from->fc, s->hidden_norm = from->hidden_norm, s->final_norm = from->final_norm;
    s->inv_freq = from->inv_freq;
    memcpy(s->layer, from->layer, sizeof s->layer);
    int rc = alloc_state(s, kc, vc, lstride, err, errlen);
    if (rc == 0)
        s->fused = from->fused;
    return rc;
}

/* The caches (kc NULL: allocated, else borrowed slab views), scratch, pinned buffers and
 * GEMM handle of s (weights set up). */
static int alloc_state(infer_state_cuda *s, nn_bf16_cuda *kc, nn_bf16_cuda *vc, size_t lstride, char *err,
                       size_t errlen)
{
    const dflash_config *c = s->c;
    int H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, B = c->block_size, d = c->hidden;
    int I = c->intermediate, V = c->vocab, cap = s->cap;
    size_t qd = (size_t)H * hd, kvd = (size_t)KV * hd;
    /* caches and scratch */
    size_t rows = (size_t)cap + B, L = (size_t)c->n_layers, qkv_n = qd + 2 * kvd;
    size_t R = (size_t)DF_MAX(INFER_CUDA_CHUNK, B);
    if (kc) {
        s->kc = kc, s->vc = vc, s->lstride = lstride;
    } else {
        s->own_cache = 1, s->lstride = rows * kvd;
        if (cudaMalloc((void **)&s->kc, sizeof(nn_bf16_cuda) * L * rows * kvd) != cudaSuccess ||
            cudaMalloc((void **)&s->vc, sizeof(nn_bf16_cuda) * L * rows * kvd) != cudaSuccess)
            return cuda_fail(s, err, errlen, "cudaMalloc(context K/V cache)", -ENOMEM);
    }
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
    if (cudaMalloc((void **)&s->n_ctx_d, sizeof(int32_t)) != cudaSuccess ||
        cudaMemset(s->n_ctx_d, 0, sizeof(int32_t)) != cudaSuccess)
        return cuda_fail(s, err, errlen, "cudaMalloc(context length)", -ENOMEM);
    if (cudaMalloc((void **)&s->sync_d, DECODE_EPI_SYNC_BYTES) != cudaSuccess ||
        cudaMemset(s->sync_d, 0, DECODE_EPI_SYNC_BYTES) != cudaSuccess)
        return cuda_fail(s, err, errlen, "cudaMalloc(epilogue scratch)", -ENOMEM);
    int rc = nn_gemm_create_cuda(&s->gemm, (size_t)32 << 20, err, errlen);
    if (rc < 0) {
        infer_free_cuda(s);
        return rc;
    }
    s->use_graphs = 1;
    s->fused = DECODE_FUSED_DEFAULT; /* as decode_model_cuda.fused's */
    return 0;
}

void infer_reset_cuda(infer_state_cuda *s)
{
    s->n_ctx = 0;
    /* in stream order after every earlier append and draft; a failure surfaces at the
     * next synchronisation */
    cudaMemsetAsync(s->n_ctx_d, 0, sizeof(int32_t), s->stream);
}

static size_t layer_stride(const infer_state_cuda *s)
{
    return s->lstride;
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

/* addnorm with out chunk-major (xc: DECODE_FUSE_XC) or row-major. */
static int addnorm_x(int xc, float *x, const nn_bf16_cuda *y, const float *w, nn_bf16_cuda *out, int T, int d,
                     float eps, cudaStream_t s, char *err, size_t errlen)
{
    if (xc)
        return nn_add_rmsnorm_xc_cuda(x, y, w, out, NULL, 0, T, d, eps, decode_pdl_small_cuda(-1), s, err, errlen);
    return addnorm(x, y, w, out, NULL, 0, T, d, eps, s, err, errlen);
}

static int linear(const infer_state_cuda *s, nn_bf16_cuda *out, const nn_bf16_cuda *x, const nn_bf16_cuda *w, int T,
                  int n_in, int n_out, char *kerr, size_t kerrlen)
{
    if (T <= INFER_CUDA_SMALL_ROWS)
        return decode_linear_rows_cuda(out, 0, x, w, NULL, T, n_in, n_out, s->stream, kerr, kerrlen);
    nn_gemm_args_cuda a = nn_gemm_linear_args_cuda(out, x, w, NULL, T, n_in, n_out);
    return nn_gemm_run_cuda(s->gemm, &a, s->stream, kerr, kerrlen);
}

/* Run a step; on failure name it, the function, the layer and the cause in err. */
#define STEP(call, what) CUDA_LAYER_STEP(call, __func__, what)

/* Enqueue the context rows of m features at Hf: rows start at p0 + *base. Ends with
 * n_ctx_d += m. */
static int enqueue_append(infer_state_cuda *s, const nn_bf16_cuda *Hf, int m, const int32_t *base, int p0, char *err,
                          size_t errlen)
{
    const dflash_config *c = s->c;
    int d = c->hidden, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, nin = c->n_capture * d;
    int qkv_n = (H + 2 * KV) * hd;
    float eps = (float)c->rms_norm_eps;
    char kerr[256];
    int l = -1;
    /* C = RMSNorm_hidden(H fc^T), the fc output kept in fp32 as on the CPU */
    if (m <= INFER_CUDA_SMALL_ROWS)
        STEP(decode_linear_rows_cuda(s->fc_out, 1, Hf, s->fc, NULL, m, nin, d, s->stream, kerr, sizeof kerr), "fc");
    else
        for (int r0 = 0; r0 < m; r0 += INFER_CUDA_SMALL_ROWS) /* fp32 out: the row-exact kernel, 64 rows a call */
            STEP(decode_linear_rows_cuda(s->fc_out + (size_t)r0 * d, 1, Hf + (size_t)r0 * nin, s->fc, NULL,
                                         DF_MIN(INFER_CUDA_SMALL_ROWS, m - r0), nin, d, s->stream, kerr, sizeof kerr),
                 "fc");
    STEP(addnorm(s->fc_out, NULL, s->hidden_norm, s->ctx, NULL, 0, m, d, eps, s->stream, kerr, sizeof kerr),
         "hidden_norm");
    const int f_qk = DECODE_FUSE_BITS(s->fused) & DECODE_FUSE_QK_APPEND;
    if (!f_qk)
        STEP(decode_positions_cuda(s->pos, base, p0, m, s->stream, kerr, sizeof kerr), "positions");
    for (l = 0; l < c->n_layers; l++) {
        const infer_layer_cuda *L = &s->layer[l];
        nn_bf16_cuda *kl = s->kc + l * layer_stride(s), *vl = s->vc + l * layer_stride(s);
        STEP(linear(s, s->qkv, s->ctx, L->w_qkv, m, d, qkv_n, kerr, sizeof kerr), "linear qkv (context)");
        if (f_qk) {
            STEP(decode_qk_norm_rope_append_cuda(s->qkv, L->q_norm, L->k_norm, s->inv_freq, kl, vl, m, H, KV, hd, eps,
                                                 base, p0, s->stream, kerr, sizeof kerr),
                 "qk_norm_rope + kv append (context)");
        } else {
            STEP(nn_qk_norm_rope_cuda(s->qkv, L->q_norm, L->k_norm, s->inv_freq, s->pos, m, H, KV, hd, eps, s->stream,
                                      kerr, sizeof kerr),
                 "qk_norm_rope (context)");
            STEP(decode_kv_append_cuda(kl, vl, s->qkv, m, H, KV, hd, base, p0, s->stream, kerr, sizeof kerr),
                 "kv append (context)");
        }
    }
    l = -1;
    STEP(decode_counter_add_cuda(s->n_ctx_d, m, s->stream, kerr, sizeof kerr), "context length");
    return 0;
}

/* Capture what `enqueue` puts on the stream into *exec. */
#define CAPTURE(exec, enqueue_call)                                                                      \
    do {                                                                                                 \
        CUDA_TRY(cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal), err, errlen);      \
        int rc_ = (enqueue_call);                                                                        \
        cudaGraph_t g_ = NULL;                                                                           \
        cudaError_t e_ = cudaStreamEndCapture(s->stream, &g_);                                           \
        if (rc_ == 0 && e_ == cudaSuccess) {                                                             \
            e_ = cudaGraphInstantiate(&(exec), g_, 0);                                                   \
            if (e_ != cudaSuccess)                                                                       \
                (exec) = NULL;                                                                           \
        }                                                                                                \
        if (g_)                                                                                          \
            cudaGraphDestroy(g_);                                                                        \
        if (rc_ < 0)                                                                                     \
            return rc_;                                                                                  \
        if (e_ != cudaSuccess)                                                                           \
            return df_err(err, errlen, -EIO, "%s: graph capture: %s", __func__, cudaGetErrorString(e_)); \
    } while (0)

int infer_append_cuda(infer_state_cuda *s, const nn_bf16_cuda *Hf, int n, char *err, size_t errlen)
{
    if (n < 1)
        return df_err(err, errlen, -EINVAL, "infer_append_cuda: %d rows", n);
    if (s->n_ctx + n > s->cap)
        return df_err(err, errlen, -ENOSPC, "infer_append_cuda: %d + %d context rows overflow the cache of %d",
                      s->n_ctx, n, s->cap);
    /* a graph per row count, for the features buffer it was captured with (the target's
     * feature rows: every append of the speculative loop) */
    if (s->use_graphs && n <= s->c->block_size && n <= 64) {
        if (!s->append_graph[n] || s->append_src[n] != Hf) {
            if (s->append_graph[n])
                cudaGraphExecDestroy(s->append_graph[n]);
            s->append_graph[n] = NULL;
            if (s->append_src[n] == NULL || s->append_src[n] == Hf) {
                CAPTURE(s->append_graph[n], enqueue_append(s, Hf, n, s->n_ctx_d, 0, err, errlen));
                s->append_src[n] = Hf;
            }
        }
        if (s->append_graph[n]) {
            CUDA_TRY(cudaGraphLaunch(s->append_graph[n], s->stream), err, errlen);
            s->n_ctx += n;
            return 0;
        }
    }
    for (int r0 = 0; r0 < n; r0 += INFER_CUDA_CHUNK) {
        int m = DF_MIN(INFER_CUDA_CHUNK, n - r0);
        int rc = enqueue_append(s, Hf + (size_t)r0 * s->c->n_capture * s->c->hidden, m, NULL, s->n_ctx, err, errlen);
        if (rc < 0)
            return rc;
        s->n_ctx += m;
    }
    /* no synchronisation: the next draft runs after these rows on the same stream and
     * synchronises; a fault in them surfaces there */
    return 0;
}

/* Where the rows of one draft call live: R rows (blocks of B) and their scratch, device
 * and pinned; the blocks' positions and cache rows either p0 + *base + row (a lone draft:
 * the graph reads the context length from the device) or per row (a batch: pos / crow,
 * uploaded with the ranges from meta_h). The logits and greedy tokens are those of rows
 * lm_row0 .. lm_row0 + lm_rows - 1. */
typedef struct block_io {
    int R;
    nn_bf16_cuda *kc, *vc; /* the context caches the rows see (a batch: the slab) */
    size_t lstride;        /* elements from one layer's cache rows to the next's */
    float *h;
    nn_bf16_cuda *a, *qkv, *att, *y, *gu, *act, *z;
    float *logits;
    int32_t *tokens, *draft_d, *pos;
    nn_key_ranges *ranges; /* [2, R]: full layers, sliding layers */
    int32_t *tok_h;        /* pinned [R]: the blocks in, the greedy tokens out */
    const void *meta_h;    /* pinned: ranges [2R] (then, batch: pos [R], crow [R]) */
    const int32_t *base;   /* lone */
    int p0;
    const int32_t *crow; /* batch: device [R] (pos: device [R]) */
    int lm_row0, lm_rows;
} block_io;

/* Enqueue a draft of the blocks in io (weights, caches and stream of s). */
static int enqueue_block(const infer_state_cuda *s, const block_io *io, char *err, size_t errlen)
{
    const dflash_config *c = s->c;
    int B = io->R, d = c->hidden, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim;
    int I = c->intermediate, V = c->vocab, qkv_n = (H + 2 * KV) * hd;
    float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)hd);
    cudaStream_t st = s->stream;
    char kerr[256];
    int l = -1;
    const int batch = io->crow != NULL;
    const int32_t *base = io->base;
    const int p0 = io->p0;
    STEP(cudaMemcpyAsync(io->tokens, io->tok_h, sizeof(int32_t) * B, cudaMemcpyHostToDevice, st) == cudaSuccess ? 0
                                                                                                                : -EIO,
         "block upload");
    size_t meta = sizeof(nn_key_ranges) * 2 * B + (batch ? sizeof(int32_t) * 2 * B : 0);
    STEP(cudaMemcpyAsync(io->ranges, io->meta_h, meta, cudaMemcpyHostToDevice, st) == cudaSuccess ? 0 : -EIO,
         "ranges upload");
    const int fz = DECODE_FUSE_BITS(s->fused), f_qk = fz & DECODE_FUSE_QK_APPEND;
    const int f_res = fz & DECODE_FUSE_RESIDUAL, f_glu = fz & DECODE_FUSE_SWIGLU;
    const nn_bf16_cuda *yadd = f_res ? NULL : io->y; /* o_proj / down add into h themselves */
    /* the bit-exact fusions (target_decode_cuda.c's enqueue_extend): the separate kernels' bits */
    const int ep_ok = B <= DECODE_EPI_MAX_ROWS;
    const int f_gepi = ep_ok && (fz & DECODE_FUSE_GLU) && !f_glu && I % 8 == 0;
    const int f_norm = ep_ok && B <= DECODE_NORM_TAIL_ROWS && (fz & DECODE_FUSE_NORM) && !f_res && !f_glu;
    const int f_amax = (fz & DECODE_FUSE_ARGMAX) && io->lm_rows <= DECODE_EPI_MAX_ROWS;
    /* chunk-major a / att / act (and z when the lm_head takes every row) */
    const int f_xc = (fz & DECODE_FUSE_XC) && f_gepi && !f_norm && B >= DECODE_XC_MIN_ROWS &&
                     B <= DECODE_EPI_MAX_ROWS && d % DECODE_XC_CHUNK == 0 && (H * hd) % DECODE_XC_CHUNK == 0 &&
                     I % DECODE_XC_CHUNK == 0;
    const int z_xc = f_xc && !f_amax && io->lm_row0 == 0 && io->lm_rows == B;
    float *h = io->h;
    nn_bf16_cuda *a = io->a, *att = io->att, *y = io->y, *qkv = io->qkv, *act = io->act, *z = io->z;
    STEP(nn_embed_cuda(h, s->embed, io->tokens, B, d, V, NULL, st, kerr, sizeof kerr), "embed");
    if (!f_qk && !batch)
        STEP(decode_positions_cuda(io->pos, base, p0, B, st, kerr, sizeof kerr), "positions");
    for (l = 0; l < c->n_layers; l++) {
        const infer_layer_cuda *L = &s->layer[l];
        nn_bf16_cuda *kl = io->kc + l * io->lstride, *vl = io->vc + l * io->lstride;
        if (!f_norm || l == 0) /* (f_norm: the previous layer's down did it) */
            STEP(addnorm_x(f_xc, h, l > 0 ? yadd : NULL, L->in_norm, a, B, d, eps, st, kerr, sizeof kerr),
                 "input norm");
        STEP(f_xc ? decode_linear_rows_xc_cuda(qkv, 0, a, L->w_qkv, NULL, B, d, qkv_n, st, kerr, sizeof kerr)
                  : linear(s, qkv, a, L->w_qkv, B, d, qkv_n, kerr, sizeof kerr),
             "linear qkv");
        /* the block's K/V go after the context rows: used by this draft, then dropped */
        if (f_qk && batch) {
            STEP(decode_qk_norm_rope_append_rows_cuda(qkv, L->q_norm, L->k_norm, s->inv_freq, kl, vl, B, H, KV, hd, eps,
                                                      io->pos, io->crow, st, kerr, sizeof kerr),
                 "qk_norm_rope + kv append (blocks)");
        } else if (f_qk) {
            STEP(decode_qk_norm_rope_append_cuda(qkv, L->q_norm, L->k_norm, s->inv_freq, kl, vl, B, H, KV, hd, eps,
                                                 base, p0, st, kerr, sizeof kerr),
                 "qk_norm_rope + kv append (block)");
        } else {
            STEP(nn_qk_norm_rope_cuda(qkv, L->q_norm, L->k_norm, s->inv_freq, io->pos, B, H, KV, hd, eps, st, kerr,
                                      sizeof kerr),
                 "qk_norm_rope");
            if (batch)
                STEP(decode_kv_append_rows_cuda(kl, vl, qkv, B, H, KV, hd, io->crow, st, kerr, sizeof kerr),
                     "kv append (blocks)");
            else
                STEP(decode_kv_append_cuda(kl, vl, qkv, B, H, KV, hd, base, p0, st, kerr, sizeof kerr),
                     "kv append (block)");
        }
        STEP((f_xc ? decode_attention_xc_cuda
                   : decode_attention_cuda)(att, qkv, qkv_n, kl, vl, io->ranges + (c->layer_sliding[l] ? B : 0), NULL,
                                            0, 0, B, H, KV, hd, scale, st, kerr, sizeof kerr),
             "attention");
        /* f_res: o_proj and down add into the fp32 residual h inside the linear kernel;
         * f_norm: they add the bf16-rounded y and their last block does the next norm */
        if (f_norm) {
            decode_norm_tail tl = {L->post_norm, a, 0, eps, NULL, 0, s->sync_d};
            STEP(decode_linear_residual_rows_cuda(h, att, L->w_o, NULL, B, H * hd, d, &tl, st, kerr, sizeof kerr),
                 "linear o_proj + post norm");
        } else {
            STEP((f_xc ? decode_linear_rows_xc_cuda : decode_linear_rows_cuda)(f_res ? (void *)h : (void *)y,
                                                                               f_res ? 2 : 0, att, L->w_o, NULL, B,
                                                                               H * hd, d, st, kerr, sizeof kerr),
                 "linear o_proj");
            STEP(addnorm_x(f_xc, h, yadd, L->post_norm, a, B, d, eps, st, kerr, sizeof kerr), "post norm");
        }
        if (f_xc)
            STEP(decode_linear_glu_rows_xc_cuda(act, a, L->w_gu, NULL, B, d, I, st, kerr, sizeof kerr),
                 "linear gate_up + swiglu");
        else if (f_gepi)
            STEP(decode_linear_glu_rows_cuda(act, a, L->w_gu, NULL, B, d, I, st, kerr, sizeof kerr),
                 "linear gate_up + swiglu");
        else
            STEP(linear(s, io->gu, a, L->w_gu, B, d, 2 * I, kerr, sizeof kerr), "linear gate_up");
        if (f_norm) {
            /* down adds to h; its last block does the next layer's input norm, or the final one */
            int lastl = l == c->n_layers - 1;
            decode_norm_tail tl = {
                lastl ? s->final_norm : s->layer[l + 1].in_norm, lastl ? z : a, 0, eps, NULL, 0, s->sync_d};
            if (!f_gepi)
                STEP(nn_swiglu_cuda(act, io->gu, B, I, st, kerr, sizeof kerr), "swiglu");
            STEP(decode_linear_residual_rows_cuda(h, act, L->w_down, NULL, B, I, d, &tl, st, kerr, sizeof kerr),
                 lastl ? "linear down + final norm" : "linear down + input norm");
        } else if (f_xc) {
            STEP(decode_linear_rows_xc_cuda(f_res ? (void *)h : (void *)y, f_res ? 2 : 0, act, L->w_down, NULL, B, I, d,
                                            st, kerr, sizeof kerr),
                 f_res ? "linear down + residual" : "linear down");
        } else if (f_gepi) {
            if (f_res)
                STEP(decode_linear_rows_cuda(h, 2, act, L->w_down, NULL, B, I, d, st, kerr, sizeof kerr),
                     "linear down + residual");
            else
                STEP(linear(s, y, act, L->w_down, B, I, d, kerr, sizeof kerr), "linear down");
        } else if (f_glu) {
            STEP(decode_linear_swiglu_rows_cuda(f_res ? (void *)h : (void *)y, f_res ? 2 : 0, io->gu, L->w_down, NULL,
                                                B, I, d, st, kerr, sizeof kerr),
                 "swiglu + linear down");
        } else {
            STEP(nn_swiglu_cuda(act, io->gu, B, I, st, kerr, sizeof kerr), "swiglu");
            if (f_res)
                STEP(decode_linear_rows_cuda(h, 2, act, L->w_down, NULL, B, I, d, st, kerr, sizeof kerr),
                     "linear down + residual");
            else
                STEP(linear(s, y, act, L->w_down, B, I, d, kerr, sizeof kerr), "linear down");
        }
    }
    l = -1;
    if (!f_norm)
        STEP(addnorm_x(z_xc, h, yadd, s->final_norm, z, B, d, eps, st, kerr, sizeof kerr), "final norm");
    /* row k (k >= 1) predicts the token at anchor + k; row 0 predicts nothing */
    const nn_bf16_cuda *zl = z + (size_t)io->lm_row0 * d;
    const int nl = io->lm_rows;
    if (f_amax) {
        STEP(decode_linear_argmax_rows_cuda(io->logits, io->draft_d, zl, s->lm_head, nl, d, V, s->sync_d, st, kerr,
                                            sizeof kerr),
             "lm_head + argmax");
    } else {
        STEP((z_xc ? decode_linear_rows_xc_cuda : decode_linear_rows_cuda)(io->logits, 1, zl, s->lm_head, NULL, nl, d,
                                                                           V, st, kerr, sizeof kerr),
             "lm_head");
        if ((fz & DECODE_FUSE_ARGMAX_SPLIT) && nl <= DECODE_EPI_MAX_ROWS) /* the same indices, spread */
            STEP(decode_argmax_split_rows_cuda(io->draft_d, io->logits, nl, V, s->sync_d, st, kerr, sizeof kerr),
                 "argmax");
        else
            STEP(decode_argmax_rows_cuda(io->draft_d, io->logits, nl, V, st, kerr, sizeof kerr), "argmax");
    }
    STEP(cudaMemcpyAsync(io->tok_h, io->draft_d, sizeof(int32_t) * nl, cudaMemcpyDeviceToHost, st) == cudaSuccess
             ? 0
             : -EIO,
         "draft download");
    return 0;
}

int infer_draft_cuda(infer_state_cuda *s, int32_t anchor, int32_t *draft, char *err, size_t errlen)
{
    const dflash_config *c = s->c;
    int B = c->block_size, S = s->n_ctx, V = c->vocab;
    if (anchor < 0 || anchor >= V)
        return df_err(err, errlen, -EINVAL, "infer_draft_cuda: anchor token %d outside [0, %d)", anchor, V);
    /* h0 = E[anchor], E[MASK] x (B-1) at positions S..S+B-1; the training masks for one
     * block anchored at S (dflash_mask_ranges): full layers see all context + the block,
     * sliding layers a window of context + the block causally. The previous draft
     * synchronised, so the pinned buffers are free. */
    for (int k = 0; k < B; k++)
        s->draft_h[k] = k == 0 ? anchor : c->mask_token_id;
    int32_t a0 = S;
    uint8_t keep = 1;
    dflash_mask_ranges(s->ranges_h, &a0, &keep, 1, B, S, 0);
    dflash_mask_ranges(s->ranges_h + B, &a0, &keep, 1, B, S, c->sliding_window);
    int rc;
    block_io io = {.R = B,
                   .kc = s->kc,
                   .vc = s->vc,
                   .lstride = layer_stride(s),
                   .h = s->h,
                   .a = s->a,
                   .qkv = s->qkv,
                   .att = s->att,
                   .y = s->y,
                   .gu = s->gu,
                   .act = s->act,
                   .z = s->z,
                   .logits = s->logits,
                   .tokens = s->tokens,
                   .draft_d = s->draft_d,
                   .pos = s->pos,
                   .ranges = s->ranges,
                   .tok_h = s->draft_h,
                   .meta_h = s->ranges_h,
                   .base = s->n_ctx_d,
                   .p0 = 0,
                   .lm_row0 = 1,
                   .lm_rows = B - 1};
    if (s->use_graphs && !s->draft_graph)
        CAPTURE(s->draft_graph, enqueue_block(s, &io, err, errlen));
    if (s->use_graphs && s->draft_graph) {
        CUDA_TRY(cudaGraphLaunch(s->draft_graph, s->stream), err, errlen);
    } else {
        io.base = NULL, io.p0 = S;
        if ((rc = enqueue_block(s, &io, err, errlen)) < 0)
            return rc;
    }
    CUDA_TRY(cudaStreamSynchronize(s->stream), err, errlen);
    memcpy(draft, s->draft_h, sizeof(int32_t) * (B - 1));
    return 0;
}

int infer_logits_to_host_cuda(infer_state_cuda *s, float *out, char *err, size_t errlen)
{
    size_t n = (size_t)(s->c->block_size - 1) * s->c->vocab;
    CUDA_TRY(cudaMemcpy(out, s->logits, sizeof(float) * n, cudaMemcpyDeviceToHost), err, errlen);
    return 0;
}

double infer_draft_bytes_cuda(const infer_state_cuda *s, int n_ctx)
{
    const dflash_config *c = s->c;
    double d = c->hidden, I = c->intermediate, qd = (double)c->n_heads * c->head_dim,
           kvd = (double)c->n_kv_heads * c->head_dim;
    double layer = (d * (qd + 2 * kvd) + qd * d + 2 * I * d + I * d) * 2;
    return layer * c->n_layers + (double)c->vocab * d * 2 + (double)c->n_layers * (n_ctx + c->block_size) * kvd * 2 * 2;
}

/* ---- several sequences drafted together ------------------------------------------------ */

int infer_batch_init_cuda(infer_batch_cuda *b, const infer_state_cuda *from, int n_seq, int cap, char *err,
                          size_t errlen)
{
    memset(b, 0, sizeof *b);
    const dflash_config *c = from->c;
    int B = c->block_size, d = c->hidden, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim;
    int I = c->intermediate, V = c->vocab;
    if (n_seq < 1 || cap < 1)
        return df_err(err, errlen, -EINVAL, "infer_batch_init_cuda: %d sequences, a context cache of %d rows", n_seq,
                      cap);
    b->from = from, b->n_seq = n_seq, b->max_blocks = DF_MAX(1, INFER_CUDA_SMALL_ROWS / B);
    size_t rows = (size_t)cap + B, kvd = (size_t)KV * hd, L = (size_t)c->n_layers, lstride = (size_t)n_seq * rows * kvd;
    size_t R = (size_t)b->max_blocks * B, qkv_n = (size_t)(H + 2 * KV) * hd;
    b->seq = calloc((size_t)n_seq, sizeof *b->seq);
    if (!b->seq)
        return df_err(err, errlen, -ENOMEM, "infer_batch_init_cuda: out of memory");
    int rc = -ENOMEM;
    const char *what = NULL;
    if (cudaMalloc((void **)&b->kc, sizeof(nn_bf16_cuda) * L * lstride) != cudaSuccess ||
        cudaMalloc((void **)&b->vc, sizeof(nn_bf16_cuda) * L * lstride) != cudaSuccess) {
        what = "cudaMalloc(context K/V slab)";
        goto fail;
    }
    for (int pass = 0; pass < 2; pass++) { /* measure, then carve */
        bump a = {pass ? b->acts : NULL, 0};
        b->h = take(&a, sizeof(float) * R * d);
        b->a = take(&a, sizeof(nn_bf16_cuda) * R * d);
        b->qkv = take(&a, sizeof(nn_bf16_cuda) * R * qkv_n);
        b->att = take(&a, sizeof(nn_bf16_cuda) * R * H * hd);
        b->y = take(&a, sizeof(nn_bf16_cuda) * R * d);
        b->gu = take(&a, sizeof(nn_bf16_cuda) * R * 2 * I);
        b->act = take(&a, sizeof(nn_bf16_cuda) * R * I);
        b->z = take(&a, sizeof(nn_bf16_cuda) * R * d);
        b->logits = take(&a, sizeof(float) * R * V);
        b->tokens = take(&a, sizeof(int32_t) * R);
        b->draft_d = take(&a, sizeof(int32_t) * R);
        b->meta_d = take(&a, (sizeof(nn_key_ranges) * 2 + sizeof(int32_t) * 2) * R);
        if (!pass && cudaMalloc(&b->acts, a.off) != cudaSuccess) {
            what = "cudaMalloc(batch scratch)";
            goto fail;
        }
    }
    if (cudaMallocHost((void **)&b->tok_h, sizeof(int32_t) * R) != cudaSuccess ||
        cudaMallocHost(&b->meta_h, (sizeof(nn_key_ranges) * 2 + sizeof(int32_t) * 2) * R) != cudaSuccess) {
        what = "cudaMallocHost(batch blocks)";
        goto fail;
    }
    /* sequence i's rows of layer l: kc + l * lstride + i * rows * kvd */
    for (int i = 0; i < n_seq; i++) {
        if ((rc = init_view(&b->seq[i], from, cap, b->kc + (size_t)i * rows * kvd, b->vc + (size_t)i * rows * kvd,
                            lstride, err, errlen)) < 0) {
            infer_batch_free_cuda(b);
            return rc;
        }
        b->n_init = i + 1;
    }
    b->use_graphs = 1;
    return 0;
fail:
    df_err(err, errlen, rc, "drafter on the GPU: %s: %s", what, cudaGetErrorString(cudaGetLastError()));
    infer_batch_free_cuda(b);
    return rc;
}

void infer_batch_free_cuda(infer_batch_cuda *b)
{
    if (!b)
        return;
    for (int i = 0; b->seq && i < b->n_init; i++)
        infer_free_cuda(&b->seq[i]);
    free(b->seq);
    for (int i = 0; i <= INFER_CUDA_SMALL_ROWS; i++)
        if (b->graph[i])
            cudaGraphExecDestroy(b->graph[i]);
    cudaFree(b->kc), cudaFree(b->vc), cudaFree(b->acts);
    if (b->tok_h)
        cudaFreeHost(b->tok_h);
    if (b->meta_h)
        cudaFreeHost(b->meta_h);
    memset(b, 0, sizeof *b);
}

/* One call of n blocks (n <= max_blocks): their tokens and row metadata are in the pinned
 * buffers; a graph per n (it copies them in). */
static int batch_call(infer_batch_cuda *b, int n, char *err, size_t errlen)
{
    const infer_state_cuda *s = b->from;
    int B = s->c->block_size, R = n * B;
    nn_key_ranges *ranges = b->meta_d;
    int32_t *pos = (int32_t *)(ranges + 2 * R);
    block_io io = {.R = R,
                   .kc = b->kc,
                   .vc = b->vc,
                   .lstride = b->seq[0].lstride,
                   .h = b->h,
                   .a = b->a,
                   .qkv = b->qkv,
                   .att = b->att,
                   .y = b->y,
                   .gu = b->gu,
                   .act = b->act,
                   .z = b->z,
                   .logits = b->logits,
                   .tokens = b->tokens,
                   .draft_d = b->draft_d,
                   .pos = pos,
                   .ranges = ranges,
                   .tok_h = b->tok_h,
                   .meta_h = b->meta_h,
                   .crow = pos + R,
                   .lm_row0 = 0,
                   .lm_rows = R};
    int rc;
    if (b->use_graphs && !b->graph[n]) {
        /* (CAPTURE's s: the stream) */
        CAPTURE(b->graph[n], enqueue_block(s, &io, err, errlen));
    }
    if (b->use_graphs && b->graph[n])
        CUDA_TRY(cudaGraphLaunch(b->graph[n], s->stream), err, errlen);
    else if ((rc = enqueue_block(s, &io, err, errlen)) < 0)
        return rc;
    CUDA_TRY(cudaStreamSynchronize(s->stream), err, errlen);
    return 0;
}

int infer_batch_draft_cuda(infer_batch_cuda *b, int n, const int *seqs, const int32_t *anchors, int32_t *drafts,
                           char *err, size_t errlen)
{
    const dflash_config *c = b->from->c;
    int B = c->block_size, V = c->vocab, cap = b->seq ? b->seq[0].cap : 0;
    for (int j = 0; j < n; j++) {
        if (seqs[j] < 0 || seqs[j] >= b->n_seq)
            return df_err(err, errlen, -EINVAL, "infer_batch_draft_cuda: sequence %d of %d", seqs[j], b->n_seq);
        if (anchors[j] < 0 || anchors[j] >= V)
            return df_err(err, errlen, -EINVAL, "infer_batch_draft_cuda: sequence %d: anchor token %d outside [0, %d)",
                          seqs[j], anchors[j], V);
        for (int i = 0; i < j; i++)
            if (seqs[i] == seqs[j]) { /* its two blocks would write the same cache rows */
                return df_err(err, errlen, -EINVAL, "infer_batch_draft_cuda: sequence %d given twice", seqs[j]);
            }
    }
    for (int j0 = 0; j0 < n; j0 += b->max_blocks) {
        int m = DF_MIN(b->max_blocks, n - j0), R = m * B;
        nn_key_ranges *full = b->meta_h, *slide = full + R;
        int32_t *pos = (int32_t *)(full + 2 * R), *crow = pos + R;
        for (int j = 0; j < m; j++) {
            /* sequence q's block as a lone draft sees it (infer_draft_cuda), shifted into
             * the slab: its rows start at q * (cap + B) */
            int q = seqs[j0 + j], S = b->seq[q].n_ctx, off = q * (cap + B), r = j * B;
            int32_t a0 = S;
            uint8_t keep = 1;
            dflash_mask_ranges(full + r, &a0, &keep, 1, B, S, 0);
            dflash_mask_ranges(slide + r, &a0, &keep, 1, B, S, c->sliding_window);
            for (int k = 0; k < B; k++) {
                nn_key_ranges *f = &full[r + k], *w = &slide[r + k];
                f->lo0 += off, f->hi0 += off, f->lo1 += off, f->hi1 += off;
                w->lo0 += off, w->hi0 += off, w->lo1 += off, w->hi1 += off;
                b->tok_h[r + k] = k == 0 ? anchors[j0 + j] : c->mask_token_id;
                pos[r + k] = S + k, crow[r + k] = off + S + k;
            }
        }
        int rc = batch_call(b, m, err, errlen);
        if (rc < 0)
            return rc;
        /* row k >= 1 of block j predicts the token at its anchor + k */
        for (int j = 0; j < m; j++)
            memcpy(drafts + (size_t)(j0 + j) * (B - 1), b->tok_h + (size_t)j * B + 1, sizeof(int32_t) * (B - 1));
    }
    return 0;
}

int infer_batch_logits_to_host_cuda(infer_batch_cuda *b, int j, float *out, char *err, size_t errlen)
{
    const dflash_config *c = b->from->c;
    int B = c->block_size;
    if (j < 0 || j >= b->max_blocks)
        return df_err(err, errlen, -EINVAL, "infer_batch_logits_to_host_cuda: block %d of %d", j, b->max_blocks);
    size_t row = (size_t)j * B + 1, n = (size_t)(B - 1) * c->vocab;
    CUDA_TRY(cudaMemcpy(out, b->logits + row * c->vocab, sizeof(float) * n, cudaMemcpyDeviceToHost), err, errlen);
    return 0;
}
