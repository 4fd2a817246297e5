/* dflash_cuda.h: the DFlash drafter training step on one GPU (dflash_*_cuda), the CUDA twin
 * of the CPU reference in dflash_model.c / dflash_loss.c / adamw.c (docs/drafter_cuda.md).
 *
 * Numerics: fp32 master weights, m and v (one flat array in dflash_tensor_info order, the
 * same layout as dflash_params.data, so checkpoints reuse dflash_ckpt on a host copy); a bf16
 * mirror of that array (same offsets) feeds every GEMM; activations bf16 where they feed a
 * GEMM, the residual stream, norms, softmax statistics, loss and gradient accumulation fp32.
 * Every projection (forward and both backward GEMMs) is one cuBLASLt bf16 GEMM with fp32
 * accumulation; q/k/v and gate/up are fused because their weights are adjacent in the flat
 * array. The frozen embedding / lm_head are borrowed device bf16 tensors.
 *
 * Shape of a step (no allocation, no host synchronisation inside, everything on the
 * context's stream): dflash_step_accumulate_cuda ADDS this batch's gradient into the fp32 gradient
 * buffer; dflash_optimizer_step_cuda clips by the global norm (computed on the device), applies
 * AdamW with the warmup + cosine schedule of adamw_lr and refreshes the bf16 mirror. The
 * loss statistics stay on the device until dflash_stats_read_cuda (the one documented sync).
 * Deterministic: fixed-order reductions only (no float atomics), one cuBLASLt algorithm per
 * shape chosen once and cached (nn_gemm_run_cuda), so the same inputs give bit-identical
 * loss and weights.
 *
 * Errors: every function that can fail takes `char *err, size_t errlen` last (err may be
 * NULL) and returns 0 or -errno with one line in err naming the step and the CUDA /
 * cuBLASLt call or the bad argument.
 */
#ifndef DF_DFLASH_CUDA_H
#define DF_DFLASH_CUDA_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "dflash/adamw.h"
#include "dflash/dflash_config.h"
#include "dflash/dflash_loss.h"

typedef uint16_t dflash_bf16_cuda; /* raw bfloat16 bits (round to nearest even from fp32) */

typedef struct dflash_ctx_cuda dflash_ctx_cuda;

#define DFLASH_MAX_DOCS_CUDA 256 /* documents of one packed call (the ring's BATCH_MAX_DOCS) */

/* One training sequence, or several packed (n_docs > 1), every pointer on the device
 * (borrowed for the call) but doc_starts / doc_n_real (host).
 * Packed: document k is context rows [doc_starts[k], doc_starts[k+1]) of H, x and loss_mask; its
 * anchor slots are anchors / keep [k*doc_slots, (k+1)*doc_slots) (the ring's layout), doc-local
 * anchors as dflash_sample_anchors lays them out (kept ones first). The step uses the first
 * doc_n_real[k] slots of each document (all doc_slots when doc_n_real is NULL or -1), packed
 * one after the other into the N slots it computes (slots left over are padding), so padding
 * slots cost nothing. It computes exactly what one call per document would (doc-local RoPE
 * positions, labels inside the document, attention windows [doc start, doc start + anchor))
 * and adds all their gradients; only the order of fp32 sums differs (gpu_test_dflash
 * "packed"). */
typedef struct dflash_batch_cuda {
    int S;                     /* context tokens (all documents), 1..max_S */
    int N;                     /* anchor slots computed (padding included), 1..max_N; packed: >= the
                               * slots the documents use */
    int n_real;                /* anchors with keep = 1, all in slots [0, n_real) (dflash_sample_anchors
                               * order); bounds the loss rows without a sync. -1: unknown (N used) */
    const void *H;             /* [S, n_capture * d] captured features */
    int H_bf16;                /* 1: H is bf16, 0: fp32 (converted on the device) */
    const int32_t *x;          /* [S] tokens */
    const uint8_t *loss_mask;  /* [S] */
    const int32_t *anchors;    /* [N] sorted ascending for keep = 1 */
    const uint8_t *keep;       /* [N] */
    int n_docs;                /* 0 or 1: one document (n_real above); 2..DFLASH_MAX_DOCS_CUDA: packed */
    const int32_t *doc_starts; /* host [n_docs + 1], from 0 rising to S (packed only) */
    const int *doc_n_real;     /* host [n_docs] or NULL: slots used of each document (its n_real; -1:
                               * all doc_slots); 0 skips the document (no loss, no gradient, as not
                               * calling it) */
    int doc_slots;             /* packed: anchor slots per document in anchors / keep */
} dflash_batch_cuda;

/* Creates the context on the current device: allocates master weights (zero), bf16 mirror,
 * gradients, AdamW state, activations for max_S x max_N and the loss chunk buffers
 * (chunk_rows x vocab logits; <= 0: 1024). embed / lm_head are device bf16 [V, d], borrowed
 * (lm_head may equal embed: tied). opt gives the AdamW settings (total_steps for the
 * schedule). 0 or -EINVAL (unsupported shape: message in err), -ENOMEM, -EIO. */
int dflash_init_cuda(dflash_ctx_cuda **out, const dflash_config *c, const adamw_config *opt,
                     const dflash_bf16_cuda *embed, const dflash_bf16_cuda *lm_head, int max_S, int max_N,
                     int chunk_rows, char *err, size_t errlen);
/* A forward-only context (held-out scoring: eval/heldout_cuda.c): the same forward and loss
 * as dflash_init_cuda's for max_S x max_N, without the fp32 gradients, the AdamW m / v, the
 * loss gradient and the backward buffers: 6 bytes per parameter (fp32 master weights + bf16
 * mirror) plus the forward activations, where a training context holds 18 per parameter
 * (weights, gradients, m, v, mirror) plus forward and backward buffers. Only
 * dflash_params_from/to_host_cuda, dflash_forward_loss_cuda, dflash_stats_read_cuda, the
 * debug views, timing and the queries work on it; the entries that need gradients or
 * optimizer state answer -EINVAL (dflash_grads_device_cuda: NULL). */
int dflash_init_forward_cuda(dflash_ctx_cuda **out, const dflash_config *c, const dflash_bf16_cuda *embed,
                             const dflash_bf16_cuda *lm_head, int max_S, int max_N, int chunk_rows, char *err,
                             size_t errlen);
int dflash_is_forward_only_cuda(const dflash_ctx_cuda *ctx);
void dflash_free_cuda(dflash_ctx_cuda *ctx); /* NULL is fine */
cudaStream_t dflash_stream_cuda(const dflash_ctx_cuda *ctx);
size_t dflash_param_count_cuda(const dflash_ctx_cuda *ctx);
/* Bytes of device memory the context holds (for logs and the bench). */
size_t dflash_device_bytes_cuda(const dflash_ctx_cuda *ctx);

/* Master weights <-> host fp32 [n] (dflash_params.data layout). from_host refreshes the bf16
 * mirror. Synchronous. 0 or -EIO. */
int dflash_params_from_host_cuda(dflash_ctx_cuda *ctx, const float *params, char *err, size_t errlen);
int dflash_params_to_host_cuda(dflash_ctx_cuda *ctx, float *params, char *err, size_t errlen);
/* Gradients (tests, data-parallel reductions done on the host). */
int dflash_grads_to_host_cuda(dflash_ctx_cuda *ctx, float *grads, char *err, size_t errlen);
int dflash_grads_from_host_cuda(dflash_ctx_cuda *ctx, const float *grads, char *err, size_t errlen);
int dflash_zero_grads_cuda(dflash_ctx_cuda *ctx, char *err, size_t errlen); /* async */
/* The fp32 gradient buffer [n] on the device (data-parallel all-reduce in place, NCCL). */
float *dflash_grads_device_cuda(dflash_ctx_cuda *ctx);
/* AdamW state for checkpoints: m, v [n] and the update count. */
int dflash_opt_to_host_cuda(dflash_ctx_cuda *ctx, float *m, float *v, long *step, char *err, size_t errlen);
int dflash_opt_from_host_cuda(dflash_ctx_cuda *ctx, const float *m, const float *v, long step, char *err,
                              size_t errlen);
/* Fills the master weights on the device like dflash_params_init_random (norms 1, linear
 * weights uniform with standard deviation std from a counter hash of seed; not the same
 * numbers as the CPU), resets AdamW. For benchmarks. */
int dflash_params_init_device_cuda(dflash_ctx_cuda *ctx, uint64_t seed, float std, char *err, size_t errlen);

/* Forward + chunked loss + backward of one sequence; gradients ADDED to the buffer. The
 * objective is the config's (c.loss: decay, or D-PACE with c.dpace_alpha; dflash_loss.h).
 * norm: the loss normaliser (<= 0: this call's own, dflash_loss_norm: decay the sum of
 * weights as dflash_loss_chunked, D-PACE the blocks with a loss position). st->wpos gets the
 * per-position weight sums.
 * st: if non-NULL, synchronises and fills it (else use dflash_stats_read_cuda later).
 * 0 or -EINVAL (shape beyond the init sizes), -EIO. Bad tokens/labels/anchors are detected
 * on the device and reported by dflash_stats_read_cuda as -EINVAL. */
int dflash_step_accumulate_cuda(dflash_ctx_cuda *ctx, const dflash_batch_cuda *b, double norm, dflash_stats *st,
                                char *err, size_t errlen);
/* Forward + chunked loss of one batch without the backward pass (either kind of context):
 * the statistics dflash_step_accumulate_cuda gives for the same batch and weights, bit for
 * bit (the same kernels in the same order; loss normalised by the batch's own sum of
 * weights), gradients untouched. st: as in dflash_step_accumulate_cuda. 0, -EINVAL, -EIO. */
int dflash_forward_loss_cuda(dflash_ctx_cuda *ctx, const dflash_batch_cuda *b, dflash_stats *st, char *err,
                             size_t errlen);
/* Synchronises the stream and reads the statistics of the last dflash_step_accumulate_cuda
 * or dflash_forward_loss_cuda.
 * 0, -EINVAL when the device flagged bad input (what in err), -EIO. */
int dflash_stats_read_cuda(dflash_ctx_cuda *ctx, dflash_stats *st, char *err, size_t errlen);

/* One AdamW update from the accumulated gradients (not zeroed: call dflash_zero_grads_cuda).
 * Norm, clipping, skip on a non-finite norm, learning rate and step count all on the
 * device. info: if non-NULL, synchronises and fills it. 0 or -EIO. */
int dflash_optimizer_step_cuda(dflash_ctx_cuda *ctx, adamw_info *info, char *err, size_t errlen);

/* Debug/test views (synchronous): attention output of layer l [R, H*hd] and the final
 * norm output z [R, d] of the last step, as fp32; R = N*B of that step. */
int dflash_debug_att_cuda(dflash_ctx_cuda *ctx, int layer, float *out, char *err, size_t errlen);
int dflash_debug_z_cuda(dflash_ctx_cuda *ctx, float *out, char *err, size_t errlen);

/* The attention scheme this context runs (dflash_attn_cuda.h; DFLASH_ATTN read at init):
 * "fused", "gemm" or "fused-fwd". */
const char *dflash_attn_name_cuda(const dflash_ctx_cuda *ctx);

/* Phase timing for benchmarks: when on, the step records CUDA events (no host sync) at its
 * phase boundaries and around every attention call; dflash_timing_read_cuda synchronises and gives
 * the last step's milliseconds. */
typedef struct dflash_timing_cuda {
    float fwd_ms, loss_ms, bwd_ms, opt_ms; /* forward to z; lm_head + CE; backward; AdamW */
    float attn_fwd_ms, attn_bwd_ms;        /* attention (all layers) inside fwd / bwd */
} dflash_timing_cuda;
int dflash_timing_enable_cuda(dflash_ctx_cuda *ctx, int on, char *err, size_t errlen);
int dflash_timing_read_cuda(dflash_ctx_cuda *ctx, dflash_timing_cuda *t, char *err, size_t errlen);

/* ---- helpers for tests and benchmarks ---- */
/* Allocates a device bf16 copy of host fp32 src[n] (RNE, safetensors_f32_to_bf16: tests
 * round their inputs the same way). 0 or -ENOMEM/-EIO. */
int dflash_upload_bf16_cuda(dflash_bf16_cuda **dst, const float *src, size_t n, char *err, size_t errlen);
/* p[n] = bf16 uniform in [-scale, scale] from a counter hash of (seed, i) (the hash of
 * dflash_params_init_device_cuda; not nn_fill_uniform_bf16_cuda's numbers). */
int dflash_fill_uniform_bf16_cuda(dflash_bf16_cuda *p, size_t n, uint64_t seed, float scale, cudaStream_t s, char *err,
                                  size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
