/* nn_cuda.h: the CUDA layer library (prefix nnc_), the GPU twin of nn.h.
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
 * swiglu.cu, embed.cu (embedding gather, positions, random fill), cublaslt_cuda.c (GEMM).
 *
 * Errors: the kernel wrappers return 0, -EINVAL for shapes they do not support (checked
 * before anything is enqueued) or -EIO when the launch failed (cudaGetLastError after
 * every launch; nn_last_error_cuda() has the CUDA error text).
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

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t nn_bf16_cuda; /* bfloat16 bits (RNE from fp32, as safetensors_f32_to_bf16) */

/* Text of the last CUDA error a wrapper saw in this thread ("" when none). */
const char *nn_last_error_cuda(void);

/* ---- embed.cu ------------------------------------------------------------------- */

/* x[T, d] (fp32) = table[tokens[t], :]. A token outside [0, V) gives a zero row and sets
 * *bad_token (device int, may be NULL) to 1; the caller reads it after synchronising. */
int nn_embed_cuda(float *x, const nn_bf16_cuda *table, const int32_t *tokens, int T, int d, int V, int *bad_token,
              cudaStream_t s);

/* pos[t] = t - doc_starts[doc of t] for a packed row (doc_starts[n_docs+1] on the device,
 * [0] = 0, strictly increasing, [n_docs] = T; validated by the caller on the host). The
 * attention kernels read each query's document start as t - pos[t]. */
int nn_positions_cuda(int32_t *pos, const int32_t *doc_starts, int n_docs, int T, cudaStream_t s);

/* p[n] = uniform in [-scale, scale] from a counter hash of (seed, i) (bf16), or a constant. */
int nn_fill_uniform_bf16_cuda(nn_bf16_cuda *p, size_t n, uint64_t seed, float scale, cudaStream_t s);
int nn_fill_uniform_f32_cuda(float *p, size_t n, uint64_t seed, float center, float scale, cudaStream_t s);

/* ---- rmsnorm.cu ----------------------------------------------------------------- */

/* The residual step between two sub-blocks, one pass per row t:
 *   if y:       x[t] += y[t]                       (x fp32 [T, d], y bf16 [T, d])
 *   if capture: capture[t * cap_stride + i] = bf16(x[t][i])   (the layer output, after the add)
 *   if w:       out[t] = bf16(x[t] * rsqrt(mean(x[t]^2) + eps) * w)   (nn_rmsnorm)
 * Any of y, capture, (w and out) may be NULL. */
int nn_add_rmsnorm_cuda(float *x, const nn_bf16_cuda *y, const float *w, nn_bf16_cuda *out, nn_bf16_cuda *capture,
                    long cap_stride, int T, int d, float eps, cudaStream_t s);

/* ---- rope.cu -------------------------------------------------------------------- */

/* In place on qkv [T, (H+2*KV)*hd]: for the H query heads and the KV key heads of every
 * token, RMSNorm over hd with q_norm / k_norm [hd] when they are non-NULL (Qwen3), then
 * the HF rotary embedding at position pos[t] (nn_rope: pairs (i, i + hd/2), angle
 * pos * inv_freq[i] in fp32). Value heads are untouched. hd even, <= 256. */
int nn_qk_norm_rope_cuda(nn_bf16_cuda *qkv, const float *q_norm, const float *k_norm, const float *inv_freq,
                     const int32_t *pos, int T, int H, int KV, int hd, float eps, cudaStream_t s);

/* ---- swiglu.cu ------------------------------------------------------------------ */

/* out[T, I] = silu(gu[t, i]) * gu[t, I + i]: gu [T, 2I] is the fused gate/up GEMM output. */
int nn_swiglu_cuda(nn_bf16_cuda *out, const nn_bf16_cuda *gu, int T, int I, cudaStream_t s);

/* ---- attention.cu --------------------------------------------------------------- */

/* Causal GQA attention over a packed row, reading q/k/v from qkv [T, (H+2*KV)*hd]:
 * query t (head h, kv head h / (H/KV)) sees keys [lo(t), t] with lo(t) = t - pos[t] (its
 * document start), raised to t - window + 1 when window > 0 (sliding layers). Softmax of
 * q.k * scale in fp32 (online), out [T, H*hd] bf16. Tensor-core flash kernel (mma.sync
 * bf16, tiles of 64 queries x 64 keys in shared memory) for hd in {16, 32, 64, 128}, the
 * simple kernel otherwise (hd even, <= 256). */
int nn_attention_packed_cuda(nn_bf16_cuda *out, const nn_bf16_cuda *qkv, const int32_t *pos, int T, int H, int KV, int hd,
                         int window, float scale, cudaStream_t s);
/* The simple kernel (one warp per query and head, fp32 online softmax): the fallback and
 * a second opinion in the tests. Same contract. */
int nn_attention_packed_simple_cuda(nn_bf16_cuda *out, const nn_bf16_cuda *qkv, const int32_t *pos, int T, int H, int KV,
                                int hd, int window, float scale, cudaStream_t s);

/* ---- cublaslt_cuda.c: bf16 GEMM ---------------------------------------------------- */

/* out[T, n_out] = x[T, n_in] @ w[n_out, n_in]^T (+ bias[n_out]), bf16 in and out, fp32
 * accumulation (nn_matmul). One handle per thread of use: it owns the cuBLASLt handle and
 * a workspace (allocated once in nn_gemm_create_cuda) and caches the descriptors and the
 * heuristic's algorithm per shape, so after the first call of a shape nn_gemm_bf16_cuda only
 * enqueues (graph-capturable; capture a shape after one eager call). Not thread-safe. */
typedef struct nn_gemm_cuda nn_gemm_cuda;
/* 0 or -ENOMEM / -EIO (no device, cuBLASLt failure; see nn_gemm_error_cuda). */
int nn_gemm_create_cuda(nn_gemm_cuda **out, size_t workspace_bytes);
void nn_gemm_destroy_cuda(nn_gemm_cuda *g); /* NULL is fine */
int nn_gemm_bf16_cuda(nn_gemm_cuda *g, nn_bf16_cuda *out, const nn_bf16_cuda *x, const nn_bf16_cuda *w, const nn_bf16_cuda *bias, int T,
                  int n_in, int n_out, cudaStream_t s);
/* The last failure of g in words (names the cuBLASLt call, status and shape). */
const char *nn_gemm_error_cuda(const nn_gemm_cuda *g);

#ifdef __cplusplus
}
#endif

#endif
