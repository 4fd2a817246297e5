/* target_model_cuda.h: the CUDA forward of the frozen target (Qwen3 / Qwen3-MoE / Llama),
 * target_*_cuda.
 *
 * The GPU twin of target_model.h's target_forward_cpu: same model, same packed-row contract
 * (one row of T tokens holding n_docs documents, positions restart per document,
 * attention never crosses a document), same capture order; but bf16 weights and
 * activations with fp32 accumulation, an fp32 residual stream, and the captured layers
 * written as bf16 straight into a caller-provided device buffer (the arena slot):
 *
 *   out[(t * n_capture + c) * d + i] = bf16(output of decoder layer capture[c] at token t)
 *
 * i.e. [T, n_capture, d] bf16, the CPU path's fp32 layout in the same order. Only layers
 * 0..max(capture) run: no final norm, no lm_head.
 *
 * Shape of the forward (docs/target_cuda.md): per layer 4 cuBLASLt GEMMs on weights fused
 * at load time (QKV [(H+2KV)*hd, d], gate/up [2I, d]), and 4 small kernels: residual add +
 * RMSNorm (+ capture), q/k norm + RoPE, flash attention over the packed documents,
 * SwiGLU. A sparse layer (Qwen3-MoE, hfconfig_layer_is_moe) replaces the MLP's GEMMs and
 * SwiGLU by its routed experts (target_moe_mlp_cuda: a cuBLASLt router GEMM with fp32
 * logits, then nn_moe_route_cuda and nn_moe_experts_cuda of nn/moe.cu, counts and offsets
 * on the device). All buffers for max_T tokens are allocated in target_init_cuda;
 * target_forward_cuda only enqueues on the caller's stream: no allocation, no host
 * synchronisation, so it can be captured in a CUDA graph (after one eager call of the same
 * T, which builds the GEMM plans), experts included.
 *
 * Errors: 0 or -errno, and every function that can fail fills the caller's err (naming the
 * file and tensor for bad weights, the layer, step and CUDA / cuBLASLt call for device
 * failures). -EINVAL / -ENOENT are permanent (bad model or arguments), -ENOMEM / -EIO
 * temporary. Ownership: target_model_cuda owns every device
 * buffer and its GEMM handle; target_free_cuda releases all (safe on a zeroed or failed model).
 * One forward at a time per model (shared workspace), on one device.
 */
#ifndef DF_TARGET_MODEL_CUDA_H
#define DF_TARGET_MODEL_CUDA_H

#include "nn/nn_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "io/hfconfig.h"
#include "io/safetensors.h"

typedef struct target_layer_cuda {
    nn_bf16_cuda *w_qkv, *b_qkv;   /* [(H+2KV)*hd, d]: q rows, k rows, v rows; bias or NULL */
    nn_bf16_cuda *w_o, *b_o;       /* [d, H*hd]; [d] or NULL */
    nn_bf16_cuda *w_gu, *b_gu;     /* [2I, d]: gate rows then up rows; [2I] or NULL */
    nn_bf16_cuda *w_down, *b_down; /* [d, I]; [d] or NULL */
    float *in_norm, *post_norm;    /* [d] */
    float *q_norm, *k_norm;        /* [hd] (Qwen3) or NULL */
    int window;                    /* sliding window in tokens, 0 = full attention */
    int moe;                       /* 1: routed experts: w_gu [E, 2F, d] (each expert's gate rows,
                                    * then its up rows), w_down [E, d, F], no biases */
    nn_bf16_cuda *w_router;        /* [E, d] (moe only) */
} target_layer_cuda;

typedef struct target_model_cuda {
    int d, I, H, KV, hd, V;
    int n_layers; /* layers run = max(capture) + 1 */
    int n_capture;
    int *capture;      /* [n_capture] layer ids in the caller's order (host) */
    int *capture_slot; /* [n_layers] slot in the output or -1 (host) */
    int qk_norm, attention_bias, mlp_bias;
    float eps;
    int max_T;
    void *weights; /* one device allocation for every weight */
    size_t weight_bytes;
    nn_bf16_cuda *embed;       /* [V, d] */
    float *inv_freq;           /* [hd/2] */
    target_layer_cuda *layers; /* [n_layers] (host array of device pointers) */
    void *acts;                /* one device allocation for the workspace */
    size_t act_bytes;
    float *x;            /* [max_T, d] fp32 residual stream */
    nn_bf16_cuda *a, *y; /* [max_T, d] normed input / sub-block output */
    nn_bf16_cuda *qkv;   /* [max_T, (H+2KV)*hd] */
    nn_bf16_cuda *att;   /* [max_T, H*hd] */
    nn_bf16_cuda *gu;    /* [max_T, 2I] */
    nn_bf16_cuda *h;     /* [max_T, I] SwiGLU output */
    int32_t *pos;        /* [max_T] position in the document */
    int *bad_token;      /* device flag: a token id was outside [0, V) */
    /* Routed experts (n_moe = sparse layers among those run; 0: a dense model, the rest
     * unset). gu / h above exist only when a dense layer is run. After a forward the
     * routing buffers hold the LAST sparse layer run (target_moe_routing_cuda). */
    int n_moe, E, topk, F, norm_topk;
    float *moe_logits;    /* [max_T, E] router logits */
    nn_moe_work_cuda moe; /* routing and permutation (nn_cuda.h) */
    nn_bf16_cuda *moe_h;  /* [max_T * topk, F] permuted SwiGLU rows */
    nn_bf16_cuda *moe_yp; /* [max_T * topk, d] permuted expert outputs */
    int moe_kernel;       /* the forward's expert kernel: NN_MOE_GROUPED (default) or NN_MOE_ROWS (tests,
                           * benches; set between forwards) */
    nn_gemm_cuda *gemm;
    /* Kernel choices (target_init_cuda sets the defaults; a bench may override them
     * between forwards, never during one): attn_tile is the flash tile shape
     * (NN_ATTN_TILE_*), gemm_rank[TARGET_GEMM_*] the cuBLASLt heuristic rank of each
     * linear layer, -1 = the measured per-shape table (target_gemm_rank_cuda). Every choice
     * is fixed for a given device and shape, so results stay bit-identical run to run. */
    int attn_tile;
    int gemm_rank[4];
    int dev_major, dev_minor, dev_sms; /* the device the table is looked up for */
} target_model_cuda;

enum { TARGET_GEMM_QKV = 0, TARGET_GEMM_O = 1, TARGET_GEMM_GU = 2, TARGET_GEMM_DOWN = 3 };

/* Shape the model from cfg, validate capture (distinct ids in [0, num_hidden_layers)),
 * allocate weights (uninitialised) and the workspace for max_T tokens on the current
 * device. The caller then fills the weights (target_load_weights_cuda or target_randomize_cuda). */
int target_init_cuda(target_model_cuda *m, const hfconfig *cfg, const int *capture, int n_capture, int max_T, char *err,
                     size_t errlen);
/* Upload the weights of layers 0..n_layers-1 and the embedding from an open HF model
 * (bf16 as is; f32/f16 rounded to bf16 on the host; norms kept fp32). Checks every
 * tensor's presence, dtype and shape; err names the file and the tensor. A sparse layer
 * takes its router (mlp.gate.weight) and its experts in either layout (target_model.h):
 * per-expert gate/up/down_proj tensors, or the fused gate_up_proj [E, 2F, d] (copied as
 * is: it is the device layout) and down_proj [E, d, F]; a layer with both is refused, a
 * missing one named, as target_load does. Synchronous. */
int target_load_weights_cuda(target_model_cuda *m, const safetensors_model *st, char *err, size_t errlen);
/* hfconfig_load + safetensors_model_open + target_init_cuda + target_load_weights_cuda + safetensors_model_close. */
int target_load_cuda(target_model_cuda *m, const char *dir, const int *capture, int n_capture, int max_T, char *err,
                     size_t errlen);
/* Random weights generated on the device (benchmarks): linear weights uniform with the
 * std of HF's init (0.02), norms 1 +- 0.1, embeddings uniform in [-1, 1]. Synchronous. */
int target_randomize_cuda(target_model_cuda *m, uint64_t seed, char *err, size_t errlen);
void target_free_cuda(target_model_cuda *m);

/* Enqueue the forward of one packed row on stream s. tokens [T] and doc_starts
 * [n_docs + 1] are DEVICE arrays (doc_starts[0] = 0, strictly increasing,
 * doc_starts[n_docs] = T: validate on the host before uploading; the kernels stay in
 * bounds on bad input but the result is then meaningless). out: device [T, n_capture, d]
 * bf16. 0, -EINVAL (T outside [1, max_T], n_docs < 1), -EIO (a launch or cuBLASLt call
 * failed; err: "layer L: step: ..."). */
int target_forward_cuda(target_model_cuda *m, const int32_t *tokens, const int32_t *doc_starts, int n_docs, int T,
                        nn_bf16_cuda *out, cudaStream_t s, char *err, size_t errlen);
/* After the stream has synchronised: *bad = 1 when a token of a forward since the last
 * call was outside [0, V) (its embedding was zero), and clears the flag. 0 or -EIO. */
int target_take_token_error_cuda(target_model_cuda *m, int *bad, char *err, size_t errlen);

/* FLOP of one forward over documents of the given lengths (docs/performance.md):
 * 2 * (params of layers 0..n_layers-1) per token + 2 * n_layers * L_doc * H * hd per token
 * of each document of length L_doc (causal attention). */
double target_forward_flops_cuda(const target_model_cuda *m, const int32_t *doc_starts, int n_docs);
/* The cuBLASLt heuristic rank the forward uses for out[T, N] = x[T, K] w[N, K]^T on this
 * model's device: the measured per-shape table (docs/target_cuda.md), 0 for any shape or
 * device not in it. */
int target_gemm_rank_cuda(const target_model_cuda *m, int T, int N, int K);
/* The flash tile shape the forward uses for T tokens (NN_ATTN_TILE_*): m->attn_tile when
 * set, else the wgmma tile for hd 128 (128x64 where the device or build has no wgmma) and
 * 64x64 otherwise. */
int target_attn_tile_cuda(const target_model_cuda *m, int T);

/* Parameters of the layers run (no embedding, no head): the FLOP formula's count. A sparse
 * layer counts its ACTIVE parameters: the router and k experts (what one token runs). */
double target_layer_params_cuda(const target_model_cuda *m);

/* The routed-experts MLP of sparse layer l over T rows, enqueued on s: a [T, d] (the
 * post-attention-normed rows) -> y [T, d], both bf16 (y is what the residual add reads,
 * as a dense layer's down projection output). Router logits [T, E] in fp32, routing and
 * permutation (nn_moe_route_cuda), the experts (nn_moe_experts_cuda). exact = 1: the
 * row-exact path of decode steps (the router through decode_linear_rows_cuda in 64-row
 * pieces, NN_MOE_ROWS): a row's bits do not depend on the other rows; exact = 0: the
 * cuBLASLt router and m->moe_kernel (the forward, prefills). 0, -EINVAL, -EIO. */
int target_moe_mlp_cuda(target_model_cuda *m, int l, const nn_bf16_cuda *a, nn_bf16_cuda *y, int T, int exact,
                        cudaStream_t s, char *err, size_t errlen);
/* After the stream has synchronised: the routing of the last sparse layer run, over its T
 * rows, to host memory: idx [T, k] and wts [T, k] (each may be NULL), logits [T, E] when
 * non-NULL. 0, -EINVAL (no sparse layer, T past max_T), -EIO. */
int target_moe_routing_cuda(const target_model_cuda *m, int T, int32_t *idx, float *wts, float *logits, char *err,
                            size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
