/* dflash_attn_cuda.h: the DFlash attention of one drafter layer on the GPU, forward and
 * backward (dflash_attn_*_cuda), the CUDA twin of nn_attention / nn_attention_backward over
 * the ranges of dflash_mask_ranges (docs/drafter.md "Training mask", docs/drafter_cuda.md
 * "Attention").
 *
 * Query block j (B rows, anchor slot j) of KV head g sees, per row k:
 *   context keys [lo_k, hi_j), lo_k = lo_j (full) or max(lo_j, hi_j + k - (W-1)) (sliding, W);
 *   its own block keys: all B (full) or kk <= k (sliding);
 *   nothing when keep_j = 0 (exact zero output, LSE -inf).
 * hi_j / lo_j are absolute rows of Kh/Vh: one document is lo = 0, hi = anchor; a packed batch
 * gives each block its document's start as lo and start + anchor as hi, so blocks never see
 * another document.
 *
 * Two schemes, same inputs, same outputs (within rounding):
 *   DFLASH_ATTN_FUSED  block-sparse flash attention: one CTA per (anchor block, KV head) with
 *                      the block's B rows x G query heads sharing K/V, key tiles of 64 visited
 *                      only inside [min lo_k, hi_j) plus the block's own keys, tensor cores
 *                      (mma.sync bf16 -> fp32), online softmax, LSE saved. Backward: a dK/dV
 *                      kernel per context key tile over the blocks that see it (blocks split in
 *                      at most 8 fixed ranges, partials summed in range order; the block keys'
 *                      dK/dV by a CTA per (block, KV head)) that also stores dS (bf16) tile by
 *                      tile, then a dQ kernel per query tile: dQ = dS K over the stored tiles.
 *                      No float atomics: bit-identical runs. head_dim <= 128.
 *   DFLASH_ATTN_FUSED_RC  the same forward; the first fused backward: its dQ kernel recomputes S
 *                      and dP instead of reading dS (no dS scratch; kept for comparison).
 *   DFLASH_ATTN_GEMM   the first scheme: dense score GEMMs against all S context keys through
 *                      [H*R, S] scratch, masked afterwards (kept for comparison).
 *   DFLASH_ATTN_FUSED_FWD  fused forward, GEMM backward (the backward reads only Q, K, V, the
 *                      output and the LSE, so the two mix).
 *
 * Layouts (those of the drafter step): Qh [KV][R][G][hd] (R = N*B rows r = j*B + k), Kh, Vh
 * [KV][T][hd] (T = S + R: context rows, then the block rows S + j*B + kk), att [R][H*hd]
 * (head h = g*G + hh), lse [KV*R*G] in Qh's row order, all bf16 but lse; the gradients dQh
 * [KV][R][G][hd], dKh / dVh [KV][T][hd] are fp32 and fully written (zeros where no query
 * looks). Errors: 0 or -errno with one line in err. */
#ifndef DF_DFLASH_ATTN_CUDA_H
#define DF_DFLASH_ATTN_CUDA_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "nn/nn_cuda.h"

enum { DFLASH_ATTN_FUSED = 0, DFLASH_ATTN_GEMM = 1, DFLASH_ATTN_FUSED_FWD = 2, DFLASH_ATTN_FUSED_RC = 3 };

/* The scheme named by the environment variable DFLASH_ATTN ("fused" (default when unset or
 * empty), "gemm", "fused-fwd", "fused-rc"), downgraded to DFLASH_ATTN_GEMM when head_dim > 128
 * (the fused kernels hold one head's row in registers). 0..3, or -EINVAL with the bad value in err. */
int dflash_attn_scheme_cuda(int head_dim, char *err, size_t errlen);
const char *dflash_attn_scheme_name_cuda(int scheme);

/* One layer's attention call. */
typedef struct dflash_attn_cuda {
    int S;               /* context rows in Kh / Vh (all documents of a packed batch) */
    int N, B;            /* anchor slots, block size (R = N*B block rows) */
    int H, KV, hd;       /* query heads, KV heads, head dim */
    int window;          /* 0: full attention; W > 0: sliding window W */
    float scale;         /* softmax scale (1/sqrt(hd)) */
    const int32_t *hi;   /* [N] device: end of block j's context keys (exclusive), in [lo_j, S] */
    const int32_t *lo;   /* [N] device: start of block j's document, in [0, S] */
    const uint8_t *keep; /* [N] device: 0 = padding slot */
} dflash_attn_cuda;

/* Scratch of the schemes: the caller gives memory of dflash_attn_ws_bytes_cuda(...) bytes
 * (256-byte aligned) and a cuBLASLt handle (GEMM scheme only); sizes are for at most max_S
 * context rows and max_N anchor slots. The fused schemes need O(H*R) for the backward plus the
 * dK/dV partials (8 x max_S x KV x hd x 2 fp32), fused also the dS tiles (bf16, KV x max_N x
 * ceil(B*H/KV / 64) x (ceil(max_S / 64) + 1) x 64 x 64); the GEMM scheme the [H*R, S] score
 * scratch. */
typedef struct dflash_attn_ws_cuda {
    int scheme, max_S, max_N, B, H, KV, hd;
    void *base;
    nn_gemm_cuda *gemm;
} dflash_attn_ws_cuda;
size_t dflash_attn_ws_bytes_cuda(int scheme, int max_S, int max_N, int B, int H, int KV, int hd);

/* Forward: att (bf16, [R][H*hd]) and lse (fp32, natural log; -inf on padding rows). */
int dflash_attn_fwd_cuda(const dflash_attn_ws_cuda *ws, const dflash_attn_cuda *a, const nn_bf16_cuda *Qh,
                         const nn_bf16_cuda *Kh, const nn_bf16_cuda *Vh, nn_bf16_cuda *att, float *lse, cudaStream_t st,
                         char *err, size_t errlen);
/* Backward from datt ([R][H*hd] bf16, the gradient of att): dQh, dKh, dVh (fp32, written). */
int dflash_attn_bwd_cuda(const dflash_attn_ws_cuda *ws, const dflash_attn_cuda *a, const nn_bf16_cuda *Qh,
                         const nn_bf16_cuda *Kh, const nn_bf16_cuda *Vh, const nn_bf16_cuda *att, const float *lse,
                         const nn_bf16_cuda *datt, float *dQh, float *dKh, float *dVh, cudaStream_t st, char *err,
                         size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
