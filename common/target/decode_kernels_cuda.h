/* decode_kernels_cuda.h: the CUDA kernels of KV-cached decoding that common/nn does not
 * have (prefix dkc_), shared by the target's decode (target_decode_cuda.h) and the
 * drafter's inference (eval/dflash_infer_cuda.h):
 *
 *   - appending the K/V heads of a fused QKV activation to a bf16 cache,
 *   - attention of a few new queries against cached keys (one thread block per query
 *     and head, a plain loop over the keys in chunks with an online softmax in fp32),
 *   - a small-row linear layer whose every output element is computed in one fixed order
 *     that does not depend on how many rows the call has (see decode_linear_rows_cuda),
 *   - the argmax of logit rows (first index on ties, as decode_argmax) and positions.
 *
 * Why a GEMM of our own: greedy speculative decoding is lossless only if the target's
 * greedy token for a row does not depend on the other rows of its call. cuBLASLt picks
 * its kernel (tiling, split-K) by shape, so a 16-row verify and a 1-row plain step may
 * round the same row differently and flip a near-tie. decode_linear_rows_cuda makes a row's
 * bits a function of that row alone, so on one GPU the speculative output equals the
 * plain one exactly; prefills (identical in both loops) keep cuBLASLt's tensor cores.
 *
 * Layouts as nn_cuda.h: row-major, linear weights [out, in], fused qkv [T, (H+2KV)*hd]
 * (q heads, k heads, v heads), caches [rows, KV*hd] bf16. Every function only enqueues
 * on the caller's stream; 0, -EINVAL (unsupported shape, nothing enqueued) or -EIO (the
 * launch failed; decode_last_error_cuda() has the CUDA text). */
#ifndef DF_DECODE_KERNELS_CUDA_H
#define DF_DECODE_KERNELS_CUDA_H

#include "nn/nn.h"
#include "nn/nn_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Text of the last launch failure in this thread ("" when none). */
const char *decode_last_error_cuda(void);

/* pos[i] = p0 + i for i < T (RoPE positions of rows appended at p0). */
int decode_positions_cuda(int32_t *pos, int p0, int T, cudaStream_t s);

/* Cache rows row0..row0+T-1 of kc / vc [*, KV*hd] = the k / v heads of qkv [T, (H+2KV)*hd]
 * (after nn_qk_norm_rope_cuda: K normed and rotated). */
int decode_kv_append_cuda(nn_bf16_cuda *kc, nn_bf16_cuda *vc, const nn_bf16_cuda *qkv, int T, int H, int KV, int hd, int row0,
                  cudaStream_t s);

/* out[Tq, H*hd] = softmax(q k^T * scale) v over each query's allowed cached keys.
 * q: query i's H heads at q + i * q_stride (the q part of a fused qkv row: q_stride =
 * (H+2KV)*hd). kc, vc: [*, KV*hd]; query head h reads kv head h / (H/KV).
 * Allowed keys: ranges (DEVICE [Tq], the union of [lo0,hi0) and [lo1,hi1), nn.h) when
 * non-NULL; else causal from p0: query i sees [max(0, p0+i-window+1), p0+i] (window 0:
 * from key 0). A query with no key gets a zero row. hd even, <= 256. */
int decode_attention_cuda(nn_bf16_cuda *out, const nn_bf16_cuda *q, long q_stride, const nn_bf16_cuda *kc, const nn_bf16_cuda *vc,
                  const nn_key_ranges *ranges, int p0, int window, int Tq, int H, int KV, int hd, float scale,
                  cudaStream_t s);

/* out[T, n_out] = x[T, n_in] @ w[n_out, n_in]^T (+ bias[n_out]), bf16 x / w / bias, fp32
 * accumulation, out bf16 (out_f32 = 0) or fp32 (out_f32 = 1). One warp per output column;
 * lane j sums the products k = 8j + 256i .. +7 in increasing k, then the warp adds its 32
 * partial sums in a fixed butterfly: element (t, n) depends on row t and column n only.
 * Made for the few rows of a decode step (reads w once per 8 rows); any T works. */
int decode_linear_rows_cuda(void *out, int out_f32, const nn_bf16_cuda *x, const nn_bf16_cuda *w, const nn_bf16_cuda *bias, int T,
                    int n_in, int n_out, cudaStream_t s);

/* idx[r] = argmax of logits[r, 0..V) (fp32), the first index on ties, for r < rows. */
int decode_argmax_rows_cuda(int32_t *idx, const float *logits, int rows, int V, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
