/* dflash_cuda.h: the DFlash drafter training step on one GPU (prefix dfc_), the CUDA twin
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
 * context's stream): dfc_step_accumulate ADDS this batch's gradient into the fp32 gradient
 * buffer; dfc_optimizer_step clips by the global norm (computed on the device), applies
 * AdamW with the warmup + cosine schedule of adamw_lr and refreshes the bf16 mirror. The
 * loss statistics stay on the device until dfc_stats_read (the one documented sync).
 * Deterministic: fixed-order reductions only (no float atomics), one cuBLASLt algorithm per
 * shape chosen once and cached, so the same inputs give bit-identical loss and weights.
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

typedef uint16_t dfc_bf16; /* raw bfloat16 bits (round to nearest even from fp32) */

typedef struct dfc_ctx dfc_ctx;

/* One training sequence, every pointer on the device (borrowed for the call). */
typedef struct dfc_batch {
    int S;                    /* context tokens, 1..max_S */
    int N;                    /* anchor slots (padding included), 1..max_N */
    int n_real;               /* anchors with keep = 1, all in slots [0, n_real) (dflash_sample_anchors
                               * order); bounds the loss rows without a sync. -1: unknown (N used) */
    const void *H;            /* [S, n_capture * d] captured features */
    int H_bf16;               /* 1: H is bf16, 0: fp32 (converted on the device) */
    const int32_t *x;         /* [S] tokens */
    const uint8_t *loss_mask; /* [S] */
    const int32_t *anchors;   /* [N] sorted ascending for keep = 1 */
    const uint8_t *keep;      /* [N] */
} dfc_batch;

/* Creates the context on the current device: allocates master weights (zero), bf16 mirror,
 * gradients, AdamW state, activations for max_S x max_N and the loss chunk buffers
 * (chunk_rows x vocab logits; <= 0: 1024). embed / lm_head are device bf16 [V, d], borrowed
 * (lm_head may equal embed: tied). opt gives the AdamW settings (total_steps for the
 * schedule). 0 or -EINVAL (unsupported shape: message in err), -ENOMEM, -EIO. */
int dfc_init(dfc_ctx **out, const dflash_config *c, const adamw_config *opt, const dfc_bf16 *embed,
             const dfc_bf16 *lm_head, int max_S, int max_N, int chunk_rows, char *err, size_t errlen);
void dfc_free(dfc_ctx *ctx); /* NULL is fine */
cudaStream_t dfc_stream(const dfc_ctx *ctx);
size_t dfc_param_count(const dfc_ctx *ctx);
/* Bytes of device memory the context holds (for logs and the bench). */
size_t dfc_device_bytes(const dfc_ctx *ctx);
/* Text of the last failure (CUDA / cuBLASLt call, shape). */
const char *dfc_error(const dfc_ctx *ctx);

/* Master weights <-> host fp32 [n] (dflash_params.data layout). from_host refreshes the bf16
 * mirror. Synchronous. 0 or -EIO. */
int dfc_params_from_host(dfc_ctx *ctx, const float *params);
int dfc_params_to_host(dfc_ctx *ctx, float *params);
/* Gradients (tests, data-parallel reductions done on the host). */
int dfc_grads_to_host(dfc_ctx *ctx, float *grads);
int dfc_grads_from_host(dfc_ctx *ctx, const float *grads);
int dfc_zero_grads(dfc_ctx *ctx); /* async */
/* The fp32 gradient buffer [n] on the device (data-parallel all-reduce in place, NCCL). */
float *dfc_grads_device(dfc_ctx *ctx);
/* AdamW state for checkpoints: m, v [n] and the update count. */
int dfc_opt_to_host(dfc_ctx *ctx, float *m, float *v, long *step);
int dfc_opt_from_host(dfc_ctx *ctx, const float *m, const float *v, long step);
/* Fills the master weights on the device like dflash_params_init_random (norms 1, linear
 * weights uniform with standard deviation std from a counter hash of seed; not the same
 * numbers as the CPU), resets AdamW. For benchmarks. */
int dfc_params_init_device(dfc_ctx *ctx, uint64_t seed, float std);

/* Forward + chunked loss + backward of one sequence; gradients ADDED to the buffer.
 * norm: the loss normaliser (<= 0: this sequence's sum of weights, as dflash_loss_chunked).
 * st: if non-NULL, synchronises and fills it (else use dfc_stats_read later).
 * 0 or -EINVAL (shape beyond the init sizes), -EIO. Bad tokens/labels/anchors are detected
 * on the device and reported by dfc_stats_read as -EINVAL. */
int dfc_step_accumulate(dfc_ctx *ctx, const dfc_batch *b, double norm, dflash_stats *st);
/* Synchronises the stream and reads the statistics of the last dfc_step_accumulate.
 * 0, -EINVAL when the device flagged bad input (a message in dfc_error), -EIO. */
int dfc_stats_read(dfc_ctx *ctx, dflash_stats *st);

/* One AdamW update from the accumulated gradients (not zeroed: call dfc_zero_grads).
 * Norm, clipping, skip on a non-finite norm, learning rate and step count all on the
 * device. info: if non-NULL, synchronises and fills it. 0 or -EIO. */
int dfc_optimizer_step(dfc_ctx *ctx, adamw_info *info);

/* Debug/test views (synchronous): attention output of layer l [R, H*hd] and the final
 * norm output z [R, d] of the last step, as fp32; R = N*B of that step. */
int dfc_debug_att(dfc_ctx *ctx, int layer, float *out);
int dfc_debug_z(dfc_ctx *ctx, float *out);

/* Phase timing for benchmarks: when on, the step records CUDA events (no host sync) at its
 * phase boundaries and around every attention call; dfc_timing_read synchronises and gives
 * the last step's milliseconds. */
typedef struct dfc_timing {
    float fwd_ms, loss_ms, bwd_ms, opt_ms; /* forward to z; lm_head + CE; backward; AdamW */
    float attn_fwd_ms, attn_bwd_ms;        /* attention (all layers) inside fwd / bwd */
} dfc_timing;
int dfc_timing_enable(dfc_ctx *ctx, int on);
int dfc_timing_read(dfc_ctx *ctx, dfc_timing *t);

/* ---- helpers for tests and benchmarks ---- */
/* Allocates a device bf16 copy of host fp32 src[n] (RNE). 0 or -ENOMEM/-EIO. */
int dfc_upload_bf16(dfc_bf16 **dst, const float *src, size_t n);
/* p[n] = bf16 uniform in [-scale, scale] from a counter hash of (seed, i). */
int dfc_fill_uniform_bf16(dfc_bf16 *p, size_t n, uint64_t seed, float scale, cudaStream_t s);
/* Host RNE fp32 -> bf16 and back (tests round their inputs the way the device does). */
dfc_bf16 dfc_f32_to_bf16(float f);
float dfc_bf16_to_f32(dfc_bf16 h);

/* ---- dflash_gemm_cuda.c: the cuBLASLt GEMM every projection uses ---- */
typedef struct dfc_gemm dfc_gemm;
enum { DFC_BF16 = 0, DFC_F32 = 1 };
/* Row-major D[M, N] = alpha * op(A)[M, K] @ op(B)[K, N] + beta * C, batched with strides
 * (elements). op(A) = A ([M, K], lda) when ta = 0, A^T (A stored [K, M]) when ta = 1; same
 * for B. A and B bf16; C and D of type d_type (C == NULL: C = D). fp32 accumulation. */
typedef struct dfc_mm {
    int ta, tb, M, N, K;
    const void *A;
    long lda;
    const void *B;
    long ldb;
    void *D;
    long ldd;
    const void *C; /* NULL: D (only read when beta != 0) */
    int d_type;
    float alpha, beta;
    int batch;                  /* <= 1: one */
    long long sA, sB, sD;       /* batch strides in elements */
} dfc_mm;
int dfc_gemm_create(dfc_gemm **out, size_t workspace_bytes);
void dfc_gemm_destroy(dfc_gemm *g);
int dfc_gemm_run(dfc_gemm *g, const dfc_mm *p, cudaStream_t s);
const char *dfc_gemm_error(const dfc_gemm *g);

#ifdef __cplusplus
}
#endif

#endif
