/* nn_cuda.h: the CUDA layer library (nn_*_cuda), the GPU twin of nn.h.
 *
 * Same semantics as the CPU reference layers in nn.h (which the GPU tests check every
 * kernel against), but shaped for the target forward on a Hopper GPU:
 *   - activations and weights are bf16 (nn_bf16_cuda: the raw 16 bits, so C callers need no
 *     CUDA C++ types); every reduction and every elementwise formula runs in fp32;
 *   - the residual stream is fp32, norm weights and RoPE frequencies are fp32;
 *   - the small ops are fused where the forward needs them fused: residual add + RMSNorm
 *     (+ writing a captured layer), per-head q/k norm + RoPE, SwiGLU on the fused gate/up
 *     output;
 *   - nothing here allocates, synchronises the host or reads device memory from the host:
 *     every function only enqueues kernels on the caller's stream, so a whole forward can
 *     be captured in a CUDA graph.
 * One file per concept beside the CPU reference: rmsnorm.cu, rope.cu, attention.cu,
 * swiglu.cu, moe.cu (routing and the routed experts), embed.cu (embedding gather,
 * positions, random fill), cublaslt_cuda.c (the
 * one cuBLASLt GEMM of the tree: the target forward, the drafter step, inference). The
 * device helpers the kernels share (casts, vector loads, reductions) are in
 * nn_cuda_device.cuh.
 *
 * Errors (the tree's convention, cuda_check.h): every function that can fail takes
 * `char *err, size_t errlen` last (err may be NULL) and returns 0, -EINVAL for shapes it
 * does not support (checked before anything is enqueued) or -EIO when a launch or a
 * cuBLASLt call failed (cudaGetLastError after every launch), with one line in err.
 *
 * Layouts (row-major, as nn.h): x [T, C]; linear weights [out, in]; the fused QKV
 * activation qkv [T, (H + 2*KV) * hd] = per token the H query heads, then the KV key
 * heads, then the KV value heads, each hd contiguous values (the output of one GEMM with
 * the q/k/v projection weights stacked in that order).
 */
#ifndef DF_NN_CUDA_H
#define DF_NN_CUDA_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t nn_bf16_cuda; /* bfloat16 bits (RNE from fp32, as safetensors_f32_to_bf16) */

/* ---- embed.cu ------------------------------------------------------------------- */

/* x[T, d] (fp32) = table[tokens[t], :]. A token outside [0, V) gives a zero row and sets
 * *bad_token (device int, may be NULL) to 1; the caller reads it after synchronising. */
int nn_embed_cuda(float *x, const nn_bf16_cuda *table, const int32_t *tokens, int T, int d, int V, int *bad_token,
                  cudaStream_t s, char *err, size_t errlen);

/* pos[t] = t - doc_starts[doc of t] for a packed row (doc_starts[n_docs+1] on the device,
 * [0] = 0, strictly increasing, [n_docs] = T; validated by the caller on the host). The
 * attention kernels read each query's document start as t - pos[t]. */
int nn_positions_cuda(int32_t *pos, const int32_t *doc_starts, int n_docs, int T, cudaStream_t s, char *err,
                      size_t errlen);

/* p[n] = uniform in [-scale, scale] from a counter hash of (seed, i) (bf16), or a constant. */
int nn_fill_uniform_bf16_cuda(nn_bf16_cuda *p, size_t n, uint64_t seed, float scale, cudaStream_t s, char *err,
                              size_t errlen);
int nn_fill_uniform_f32_cuda(float *p, size_t n, uint64_t seed, float center, float scale, cudaStream_t s, char *err,
                             size_t errlen);

/* ---- rmsnorm.cu ----------------------------------------------------------------- */

/* The residual step between two sub-blocks, one pass per row t:
 *   if y:       x[t] += y[t]                       (x fp32 [T, d], y bf16 [T, d])
 *   if capture: capture[t * cap_stride + i] = bf16(x[t][i])   (the layer output, after the add)
 *   if w:       out[t] = bf16(x[t] * rsqrt(mean(x[t]^2) + eps) * w)   (nn_rmsnorm)
 * Any of y, capture, (w and out) may be NULL. */
int nn_add_rmsnorm_cuda(float *x, const nn_bf16_cuda *y, const float *w, nn_bf16_cuda *out, nn_bf16_cuda *capture,
                        long cap_stride, int T, int d, float eps, cudaStream_t s, char *err, size_t errlen);
/* The same, launched as a programmatic dependent of the kernel ahead of it (sm_90+; the
 * kernel waits for that one before it touches memory, so only its launch overlaps). */
int nn_add_rmsnorm_pdl_cuda(float *x, const nn_bf16_cuda *y, const float *w, nn_bf16_cuda *out, nn_bf16_cuda *capture,
                            long cap_stride, int T, int d, float eps, cudaStream_t s, char *err, size_t errlen);
/* The same (a PDL launch when pdl != 0) with out chunk-major: element (t, i) at
 * outc[((i / 32) * T + t) * 32 + i % 32], d % 32 == 0. This is the layout the decode
 * linear kernels read at full cache lines (decode_kernels_cuda.h, "chunk-major"); the
 * values are nn_add_rmsnorm_cuda's, bit for bit. */
int nn_add_rmsnorm_xc_cuda(float *x, const nn_bf16_cuda *y, const float *w, nn_bf16_cuda *outc, nn_bf16_cuda *capture,
                           long cap_stride, int T, int d, float eps, int pdl, cudaStream_t s, char *err, size_t errlen);

/* ---- rope.cu -------------------------------------------------------------------- */

/* In place on qkv [T, (H+2*KV)*hd]: for the H query heads and the KV key heads of every
 * token, RMSNorm over hd with q_norm / k_norm [hd] when they are non-NULL (Qwen3), then
 * the HF rotary embedding at position pos[t] (nn_rope: pairs (i, i + hd/2), angle
 * pos * inv_freq[i] in fp32). Value heads are untouched. hd even, <= 256. */
int nn_qk_norm_rope_cuda(nn_bf16_cuda *qkv, const float *q_norm, const float *k_norm, const float *inv_freq,
                         const int32_t *pos, int T, int H, int KV, int hd, float eps, cudaStream_t s, char *err,
                         size_t errlen);
/* The same by the kernel nn_qk_norm_rope_cuda ran before (one warp per token and head): the
 * reference the fast kernel must match bit for bit; used by gpu_test_nn only. */
int nn_qk_norm_rope_ref_cuda(nn_bf16_cuda *qkv, const float *q_norm, const float *k_norm, const float *inv_freq,
                             const int32_t *pos, int T, int H, int KV, int hd, float eps, cudaStream_t s, char *err,
                             size_t errlen);

/* ---- swiglu.cu ------------------------------------------------------------------ */

/* out[T, I] = silu(gu[t, i]) * gu[t, I + i]: gu [T, 2I] is the fused gate/up GEMM output. */
int nn_swiglu_cuda(nn_bf16_cuda *out, const nn_bf16_cuda *gu, int T, int I, cudaStream_t s, char *err, size_t errlen);

/* ---- attention.cu --------------------------------------------------------------- */

/* Causal GQA attention over a packed row, reading q/k/v from qkv [T, (H+2*KV)*hd]:
 * query t (head h, kv head h / (H/KV)) sees keys [lo(t), t] with lo(t) = t - pos[t] (its
 * document start), raised to t - window + 1 when window > 0 (sliding layers). Softmax of
 * q.k * scale in fp32 (online), out [T, H*hd] bf16. Tensor-core flash kernel (mma.sync
 * bf16, tiles of 64 queries x 64 keys in shared memory) for hd in {16, 32, 64, 128}, the
 * simple kernel otherwise (hd even, <= 256). */
int nn_attention_packed_cuda(nn_bf16_cuda *out, const nn_bf16_cuda *qkv, const int32_t *pos, int T, int H, int KV,
                             int hd, int window, float scale, cudaStream_t s, char *err, size_t errlen);
/* Tile shapes of the flash kernel: queries x keys per shared-memory tile. 64x64 (4 warps
 * of 16 query rows, Q in registers) serves every flash hd; 128x64 and 128x32 (4 warps of
 * 32 rows, Q re-read from shared memory, each K/V fragment feeds two row blocks) exist for
 * hd 128 only (other hd run 64x64). The WGMMA tiles (hd 128, sm_90; the 128x64 kernel
 * elsewhere): 128 queries x 128 keys on the warpgroup MMA (attention.cu). Each tile shape
 * is deterministic; two shapes may differ in the last bits (the keys are summed in tiles
 * of another size).
 * NN_ATTN_TILE_DEFAULT is what nn_attention_packed_cuda runs. */
enum {
    NN_ATTN_TILE_64x64 = 0,
    NN_ATTN_TILE_128x64 = 1,
    NN_ATTN_TILE_128x32 = 2,
    NN_ATTN_TILE_WGMMA = 3,        /* 128x128 on the warpgroup MMA, PV overlapped with the softmax */
    NN_ATTN_TILE_WGMMA_SERIAL = 4, /* the same without the overlap */
    NN_ATTN_TILE_WGMMA_TMA = 5,    /* WGMMA with Q/K/V loaded by TMA (mbarriers, no block barrier) */
    NN_ATTN_TILE_WGMMA_PP = 6,     /* WGMMA_TMA with the two warpgroups taking turns on the MMAs */
    NN_ATTN_TILES = 7
};
#define NN_ATTN_TILE_DEFAULT NN_ATTN_TILE_64x64
/* nn_attention_packed_cuda with an explicit tile shape (0 .. NN_ATTN_TILES-1, else -EINVAL). */
int nn_attention_packed_tile_cuda(nn_bf16_cuda *out, const nn_bf16_cuda *qkv, const int32_t *pos, int T, int H, int KV,
                                  int hd, int window, float scale, int tile, cudaStream_t s, char *err, size_t errlen);
/* The simple kernel (one warp per query and head, fp32 online softmax): the fallback and
 * a second opinion in the tests. Same contract. */
int nn_attention_packed_simple_cuda(nn_bf16_cuda *out, const nn_bf16_cuda *qkv, const int32_t *pos, int T, int H,
                                    int KV, int hd, int window, float scale, cudaStream_t s, char *err, size_t errlen);

/* ---- moe.cu: mixture of experts (nn.h's nn_moe_route / nn_moe_experts) ----------------
 * Weights on the GPU, every expert contiguous: the router w_router [E, d]; w_gu [E, 2F, d],
 * expert e's gate_proj rows then its up_proj rows (transformers' fused gate_up_proj, so the
 * fused checkpoint layout copies as is); w_down [E, d, F].
 *
 * A block runs in three steps, all on the device (no host synchronisation, capturable in a
 * CUDA graph):
 *   nn_moe_route_cuda    softmax (fp32) + top-k of the router logits, ties to the lower
 *                        expert, renormalised when norm_topk (nn_moe_route's rule), then the
 *                        permutation: rows per expert (counts), their prefix sums (offsets),
 *                        the (token, j) entries scattered into expert-contiguous order with
 *                        each expert's tokens ascending (rows, slot), the experts that have
 *                        rows (active) and the grouped GEMM's tiles of NN_MOE_TILE_ROWS rows;
 *   nn_moe_experts_cuda  per permuted row r (token t = rows[r], expert e):
 *                          h[r]  = bf16(silu(bf16(x[t] Wg_e^T)) * bf16(x[t] Wu_e^T))
 *                          yp[r] = bf16(h[r] Wd_e^T)
 *                        then y[t] = bf16(sum_j wts[t, j] * yp[slot[t, j]]) in fp32, the k
 *                        terms added into zero in ascending expert order (nn_moe_experts'
 *                        order). No float atomics: every output has one fixed order of sums.
 * Two expert kernels compute the same math (two kernels may round differently):
 *   NN_MOE_GROUPED  tiles of 128 permuted rows x 128 weight rows on the tensor cores (mma.sync
 *                   bf16, fp32 accumulation, cp.async stages), one launch over every expert's
 *                   tiles (tile table from the route step); gate/up rows paired in a warp so
 *                   SwiGLU is the GEMM's epilogue. For prefills and the target forward.
 *   NN_MOE_ROWS     one block per (16 output columns, expert with rows): every row routed to
 *                   the expert against each weight read once, the K split over 8 warps added
 *                   in warp order, so a row's bits do not depend on the other rows of the
 *                   call (decode and verify steps: lossless speculative decoding); calls of
 *                   more than 64 rows run passes of 64 over the same weights.
 * Limits: E <= NN_MOE_MAX_EXPERTS, k <= NN_MOE_MAX_TOPK, d and F multiples of 8 (16-byte
 * loads), x / h / yp / weights 16-byte aligned. */
#define NN_MOE_MAX_EXPERTS 512
#define NN_MOE_MAX_TOPK 32
#define NN_MOE_TILE_ROWS 128
enum { NN_MOE_GROUPED = 0, NN_MOE_ROWS = 1 };

/* Device workspace of the routing and permutation of up to max_T tokens. */
typedef struct nn_moe_work_cuda {
    int max_T, E, k, max_tiles;
    int32_t *idx;     /* [max_T, k] each token's experts, descending probability */
    float *wts;       /* [max_T, k] their weights */
    int32_t *counts;  /* [E] rows routed to each expert */
    int32_t *offsets; /* [E + 1] first permuted row of each expert; offsets[E] = T * k */
    int32_t *active;  /* [E + 1] experts with rows, ascending; active[E] = how many */
    int32_t *tiles;   /* [2 * max_tiles + 1] (expert, first permuted row) per grouped tile; the
                           * number of tiles at [2 * max_tiles] */
    int32_t *rows;    /* [max_T * k] token of each permuted row */
    int32_t *slot;    /* [max_T * k] permuted row of entry (t, j) */
    long long *stat;  /* [2] running sums over routed calls: active experts, calls (benchmarks) */
} nn_moe_work_cuda;

/* Lay the workspace out from base (device, 256-byte aligned) and return its bytes; base
 * NULL only counts (the pointers are then meaningless). */
size_t nn_moe_work_carve_cuda(nn_moe_work_cuda *w, void *base, int max_T, int E, int k);

/* Route T tokens (1 <= T <= w->max_T) from their router logits [T, E] (fp32), then permute
 * (above). The stat counters are only added to. 0, -EINVAL, -EIO. */
int nn_moe_route_cuda(nn_moe_work_cuda *w, const float *logits, int T, int norm_topk, cudaStream_t s, char *err,
                      size_t errlen);

/* The routed experts of the tokens routed by the last nn_moe_route_cuda on w (the same T):
 * x [T, d] bf16 in, y [T, d] bf16 out; h [T * k, F] and yp [T * k, d] bf16 scratch (the
 * permuted SwiGLU and expert outputs, readable afterwards). kernel: NN_MOE_GROUPED or
 * NN_MOE_ROWS. 0, -EINVAL, -EIO. */
int nn_moe_experts_cuda(nn_bf16_cuda *y, const nn_bf16_cuda *x, const nn_bf16_cuda *w_gu, const nn_bf16_cuda *w_down,
                        const nn_moe_work_cuda *w, nn_bf16_cuda *h, nn_bf16_cuda *yp, int T, int d, int F, int kernel,
                        cudaStream_t s, char *err, size_t errlen);

/* ---- cublaslt_cuda.c: the GEMM ---------------------------------------------------- */

/* Row-major D[M, N] = alpha * op(A)[M, K] @ op(B)[K, N] + beta * C (+ bias[N] per column),
 * batched with strides. op(A) = A ([M, K], leading dimension lda) when ta = 0, A^T (A
 * stored [K, M]) when ta = 1; the same for B. A and B bf16; C and D of type d_type
 * (C == NULL: C = D, read only when beta != 0); fp32 accumulation (CUBLAS_COMPUTE_32F).
 * A linear layer out[T, n_out] = x[T, n_in] @ w[n_out, n_in]^T is ta = 0, tb = 1
 * (nn_gemm_linear_args_cuda). */
enum { NN_GEMM_BF16 = 0, NN_GEMM_F32 = 1 };
typedef struct nn_gemm_args_cuda {
    int ta, tb, M, N, K;
    const void *A;
    long lda;
    const void *B;
    long ldb;
    void *D;
    long ldd;
    const void *C; /* NULL: D */
    int d_type;    /* NN_GEMM_BF16 or NN_GEMM_F32 */
    float alpha, beta;
    int batch;                /* <= 1: one */
    long long sA, sB, sD;     /* batch strides in elements */
    const nn_bf16_cuda *bias; /* [N] bf16 added per output column before the rounding to
                                 * D (the BIAS epilogue; bf16 D only), or NULL */
    int align_hint;           /* 0: ask cuBLASLt's heuristic with its default alignment
                                 * preferences (the linear layers of the target forward and
                                 * of inference); 1: tell it the largest power of two <= 256
                                 * dividing every pointer and batch stride (the drafter step).
                                 * Each caller keeps the algorithms it always got. */
    int algo_rank;            /* 0: the heuristic's first algorithm (every caller so far);
                                 * k in 1..NN_GEMM_MAX_RANK-1: its (k+1)-th answer of the
                                 * NN_GEMM_MAX_RANK it is asked for (a fixed list for one GPU
                                 * model, cuBLASLt version and shape, so a fixed rank is as
                                 * reproducible as rank 0); -ENOENT when it offers fewer.
                                 * Opt-in per call site (the target's measured per-shape
                                 * table, target_model_cuda.cu; the bench's sweep). */
} nn_gemm_args_cuda;
#define NN_GEMM_MAX_RANK 8

/* One handle per thread of use: the cuBLASLt handle, a workspace (allocated once in
 * nn_gemm_create_cuda) and a cache of plans: descriptors and the heuristic's first
 * algorithm, keyed by everything that can change the choice (transposes, M, N, K, leading
 * dimensions, batch and strides, output type, beta != 0, bias, alignment). After the first
 * call of a shape nn_gemm_run_cuda only enqueues (graph-capturable: capture a shape after
 * one eager call), always with the same algorithm, so a shape's results are bit-identical
 * from call to call on one GPU model. Not thread-safe.
 * create: 0, -ENOMEM (host or workspace), -EIO (no device / cuBLASLt). run: 0, -EINVAL
 * (bad shape, bias with fp32 output, no handle), -EIO (cuBLASLt; err names the call, its
 * status and the shape). */
typedef struct nn_gemm_cuda nn_gemm_cuda;
int nn_gemm_create_cuda(nn_gemm_cuda **out, size_t workspace_bytes, char *err, size_t errlen);
void nn_gemm_destroy_cuda(nn_gemm_cuda *g); /* NULL is fine */
int nn_gemm_run_cuda(nn_gemm_cuda *g, const nn_gemm_args_cuda *p, cudaStream_t s, char *err, size_t errlen);

/* The arguments of a linear layer: out[T, n_out] = x[T, n_in] @ w[n_out, n_in]^T (+ bias),
 * bf16 out, cuBLASLt's default alignment preferences (align_hint 0). */
static inline nn_gemm_args_cuda nn_gemm_linear_args_cuda(nn_bf16_cuda *out, const nn_bf16_cuda *x,
                                                         const nn_bf16_cuda *w, const nn_bf16_cuda *bias, int T,
                                                         int n_in, int n_out)
{
    nn_gemm_args_cuda a;
    memset(&a, 0, sizeof a);
    a.ta = 0, a.tb = 1, a.M = T, a.N = n_out, a.K = n_in;
    a.A = x, a.lda = n_in, a.B = w, a.ldb = n_in, a.D = out, a.ldd = n_out;
    a.d_type = NN_GEMM_BF16, a.alpha = 1.0f, a.beta = 0.0f, a.batch = 1, a.bias = bias;
    return a;
}

#ifdef __cplusplus
}
#endif

#endif
