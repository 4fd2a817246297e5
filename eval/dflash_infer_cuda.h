/* dflash_infer_cuda.h: DFlash drafter inference on the GPU (prefix infer_*_cuda), the CUDA twin of
 * dflash_infer.h (same contract; read that header for the math): a context K/V cache per
 * drafter layer built once per accepted token from the target's captured features, then
 * one block [anchor, MASK x (B-1)] per draft through the layers, final norm, lm_head and
 * argmax on the device; B-1 ints come back.
 *
 * Numerics: the drafter's fp32 parameters (release format or our checkpoint) are
 * uploaded once as bf16 for the projections (q/k/v and gate/up fused: their tensors are
 * adjacent in dflash_params) and fp32 for the norms; the context's fc output, the
 * residual stream and logits are fp32, other activations bf16, every accumulation fp32.
 * The context rows reuse the fused QKV projection (their q part is computed and unused:
 * one GEMM and the shared q/k norm + RoPE kernel instead of a k/v-only path).
 *
 * Features in: DEVICE bf16 [n, n_capture * d] (decode_model_cuda.feat, the target's capture
 * order). The frozen embedding and lm_head are borrowed device bf16 [V, d] tensors (the
 * target's). Work is enqueued on a borrowed stream (the target's, so features are
 * consumed in order); infer_draft_cuda returns after synchronising it, infer_append_cuda only
 * enqueues (the features must stay unchanged until the next draft or sync).
 *
 * The context length lives on the device too (n_ctx_d, advanced in stream order by each
 * append): a draft is captured once into a CUDA graph (tokens and masks copied from pinned
 * host buffers inside it, positions and cache rows read from n_ctx_d) and replayed for
 * every later draft; an append of at most B rows likewise per row count. use_graphs = 0
 * runs the same kernels eagerly.
 *
 * Errors: 0 or -errno with a line in the caller's err.
 *
 * Ownership: infer_state_cuda owns its device weights (not the per-sequence states of an
 * infer_batch_cuda: they borrow them), caches and scratch (infer_free_cuda); it
 * borrows the config (must outlive it), embed, lm_head and the stream. */
#ifndef DF_DFLASH_INFER_CUDA_H
#define DF_DFLASH_INFER_CUDA_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "dflash/dflash_config.h"
#include "dflash/dflash_model.h"
#include "nn/nn_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct infer_layer_cuda {
    nn_bf16_cuda *w_qkv;                          /* [(H + 2KV) * hd, d] */
    nn_bf16_cuda *w_o;                            /* [d, H * hd] */
    nn_bf16_cuda *w_gu;                           /* [2I, d] gate rows then up rows */
    nn_bf16_cuda *w_down;                         /* [d, I] */
    float *in_norm, *post_norm, *q_norm, *k_norm; /* [d], [d], [hd], [hd] */
} infer_layer_cuda;

typedef struct infer_state_cuda {
    const dflash_config *c;
    int cap;                                    /* context rows the cache holds */
    int n_ctx;                                  /* context rows cached = position of the next anchor */
    cudaStream_t stream;                        /* borrowed */
    const nn_bf16_cuda *embed, *lm_head;        /* borrowed, [V, d] */
    void *wb;                                   /* one allocation: every bf16 weight */
    void *wf;                                   /* one allocation: every fp32 norm + inv_freq */
    nn_bf16_cuda *fc;                           /* [d, n_capture * d] */
    float *hidden_norm, *final_norm, *inv_freq; /* [d], [d], [hd/2] */
    infer_layer_cuda layer[DFLASH_MAX_LAYERS];
    nn_bf16_cuda *kc, *vc;                    /* [n_layers, cap + B, KV*hd]: context rows, then the block's */
    size_t lstride;                           /* elements from one layer's rows to the next's */
    int own_cache;                            /* kc / vc allocated here (else a batch slab's view) */
    void *acts;                               /* one allocation: the scratch below */
    float *fc_out;                            /* [chunk, d] fp32 */
    nn_bf16_cuda *ctx;                        /* [chunk, d] C */
    nn_bf16_cuda *qkv;                        /* [max(chunk, B), (H+2KV)*hd] */
    int32_t *pos;                             /* [max(chunk, B)] */
    float *h;                                 /* [B, d] residual stream */
    nn_bf16_cuda *a, *att, *y, *gu, *act, *z; /* [B, d], [B, H*hd], [B, d], [B, 2I], [B, I], [B, d] */
    float *logits;                            /* [B-1, V] of the last draft */
    int32_t *tokens;                          /* [B] */
    int32_t *draft_d;                         /* [B] */
    nn_key_ranges *ranges;                    /* [2, B]: full layers, sliding layers */
    int32_t *draft_h;                         /* pinned host [B] */
    nn_key_ranges *ranges_h;                  /* pinned host [2, B] */
    nn_gemm_cuda *gemm;
    int32_t *n_ctx_d;                   /* device [1]: n_ctx in stream order */
    int32_t *sync_d;                    /* device DECODE_EPI_SYNC_BYTES: scratch of the fused epilogues */
    int use_graphs;                     /* 1 (default) */
    int fused;                          /* as decode_model_cuda.fused (its default); set before use */
    cudaGraphExec_t draft_graph;        /* captured on the first draft */
    cudaGraphExec_t append_graph[65];   /* [n], n <= min(B, 64) context rows */
    const nn_bf16_cuda *append_src[65]; /* the features buffer append_graph[n] reads */
} infer_state_cuda;

/* Upload p (host fp32, dflash_params layout) and allocate caches for cap context rows on
 * the current device. 0, -EINVAL (cap < 1, a shape the kernels do not take: message in
 * err), -ENOMEM, -EIO. */
int infer_init_cuda(infer_state_cuda *s, const dflash_config *c, const dflash_params *p, const nn_bf16_cuda *embed,
                    const nn_bf16_cuda *lm_head, int cap, cudaStream_t stream, char *err, size_t errlen);
void infer_free_cuda(infer_state_cuda *s);

/* Forget the context. */
void infer_reset_cuda(infer_state_cuda *s);
/* Append n context rows from DEVICE bf16 features H[n, n_capture*d]. 0, -EINVAL (n < 1),
 * -ENOSPC (past cap), -EIO. */
int infer_append_cuda(infer_state_cuda *s, const nn_bf16_cuda *H, int n, char *err, size_t errlen);
/* Draft block rows 1..B-1 for the anchor at position n_ctx: draft[B-1] (host). 0, -EINVAL
 * (no context, bad anchor), -EIO. */
int infer_draft_cuda(infer_state_cuda *s, int32_t anchor, int32_t *draft, char *err, size_t errlen);
/* The last draft's logits [B-1, V] to host out. 0 or -EIO. */
int infer_logits_to_host_cuda(infer_state_cuda *s, float *out, char *err, size_t errlen);

/* Several sequences drafted together (speculative decoding of a batch of prompts): n_seq
 * contexts (seq[i], the usual per-sequence state: reset, append and lone drafts work on
 * it) whose caches are views of one slab [n_layers][n_seq][cap + B][KV*hd], so that the
 * blocks of up to max_blocks = 64 / B sequences go through the layers as ONE call of
 * n x B rows: every weight and the lm_head are read once for all of them, instead of once
 * a sequence. Each row's result is the one a lone draft of its sequence gives (the
 * row-exact linear kernels; attention over that sequence's rows only, by per-row key
 * ranges into the slab), so the drafts are the same tokens. More sequences than
 * max_blocks go in several calls. A graph per block count. */
typedef struct infer_batch_cuda {
    const infer_state_cuda *from; /* the weights (and stream) */
    int n_seq, n_init, max_blocks;
    infer_state_cuda *seq; /* [n_seq] */
    nn_bf16_cuda *kc, *vc; /* the slab */
    void *acts;            /* scratch of max_blocks * B rows: */
    float *h, *logits;
    nn_bf16_cuda *a, *qkv, *att, *y, *gu, *act, *z;
    int32_t *tokens, *draft_d;
    void *meta_d;              /* ranges [2R], pos [R], cache rows [R] */
    int32_t *tok_h;            /* pinned [R] */
    void *meta_h;              /* pinned, as meta_d */
    int use_graphs;            /* 1 (default) */
    cudaGraphExec_t graph[65]; /* [blocks] */
} infer_batch_cuda;

/* n_seq contexts of cap rows over the weights of `from` (which must outlive b). 0 or
 * -errno (message in err). */
int infer_batch_init_cuda(infer_batch_cuda *b, const infer_state_cuda *from, int n_seq, int cap, char *err,
                          size_t errlen);
void infer_batch_free_cuda(infer_batch_cuda *b);
/* Draft the blocks anchored at anchors[j] for sequences seqs[j] (j < n, distinct, each with
 * context): drafts[j * (B-1) ..] (host), what infer_draft_cuda on b->seq[seqs[j]] gives.
 * 0, -EINVAL (a bad sequence or anchor), -EIO. */
int infer_batch_draft_cuda(infer_batch_cuda *b, int n, const int *seqs, const int32_t *anchors, int32_t *drafts,
                           char *err, size_t errlen);
/* The logits [B-1, V] of block j of the last call (of at most max_blocks) to host out. */
int infer_batch_logits_to_host_cuda(infer_batch_cuda *b, int j, float *out, char *err, size_t errlen);

/* Bytes a draft reads at least with n_ctx context rows: every drafter weight but fc once,
 * the lm_head, the context and block K/V rows. */
double infer_draft_bytes_cuda(const infer_state_cuda *s, int n_ctx);

#ifdef __cplusplus
}
#endif

#endif
