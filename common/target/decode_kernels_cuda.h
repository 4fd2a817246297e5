/* decode_kernels_cuda.h: the CUDA kernels of KV-cached decoding that common/nn does not
 * have (prefix decode_), shared by the target's decode (target_decode_cuda.h) and the
 * drafter's inference (eval/dflash_infer_cuda.h):
 *
 *   - positions and appending the K/V heads of a fused QKV activation to a bf16 cache,
 *   - attention of a few new queries against cached keys (one thread block per query
 *     and head; each warp walks a fixed subset of the keys with its own online softmax,
 *     the warps are merged in a fixed order),
 *   - a small-row linear layer (1..64 rows) that reads each weight once for all rows of
 *     the call on the tensor cores, with a summation order per output element that does
 *     not depend on how many rows the call has (see decode_linear_rows_cuda),
 *   - the argmax of logit rows (first index on ties, as decode_argmax).
 *
 * Why a GEMM of our own: greedy speculative decoding is lossless only if the target's
 * greedy token for a row does not depend on the other rows of its call. cuBLASLt picks
 * its kernel (tiling, split-K) by shape, so a 16-row verify and a 1-row plain step may
 * round the same row differently and flip a near-tie. decode_linear_rows_cuda makes a row's
 * bits a function of that row alone, so on one GPU the speculative output equals the
 * plain one exactly; prefills (identical in both loops) keep cuBLASLt.
 *
 * Positions from device memory: the functions that place rows (positions, cache append,
 * causal attention) take `base` (DEVICE int32 or NULL) and p0: the rows start at
 * p0 + *base (p0 when base is NULL). A decode step captured in a CUDA graph reads the
 * cache length there, so the graph is replayed, not re-captured, at every position.
 *
 * Layouts as nn_cuda.h: row-major, linear weights [out, in], fused qkv [T, (H+2KV)*hd]
 * (q heads, k heads, v heads), caches [rows, KV*hd] bf16. Every function only enqueues
 * on the caller's stream: 0, -EINVAL (unsupported shape, nothing enqueued; err says
 * which) or -EIO (the launch failed; err has the CUDA text). */
#ifndef DF_DECODE_KERNELS_CUDA_H
#define DF_DECODE_KERNELS_CUDA_H

#include "nn/nn.h"
#include "nn/nn_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* pos[i] = p0 + (*base) + i for i < T (RoPE positions of rows appended there). */
int decode_positions_cuda(int32_t *pos, const int32_t *base, int p0, int T, cudaStream_t s, char *err, size_t errlen);

/* *counter += add on the stream (a device-side length advanced in stream order). */
int decode_counter_add_cuda(int32_t *counter, int add, cudaStream_t s, char *err, size_t errlen);

/* Cache rows r0..r0+T-1 (r0 = row0 + *base) of kc / vc [*, KV*hd] = the k / v heads of
 * qkv [T, (H+2KV)*hd] (after nn_qk_norm_rope_cuda: K normed and rotated). */
int decode_kv_append_cuda(nn_bf16_cuda *kc, nn_bf16_cuda *vc, const nn_bf16_cuda *qkv, int T, int H, int KV, int hd,
                          const int32_t *base, int row0, cudaStream_t s, char *err, size_t errlen);

/* The same with a cache row per new row: row t goes to rows[t] (DEVICE int32 [T]), the
 * rows of a batch of sequences sharing one cache (target_decode_cuda.h, batches). */
int decode_kv_append_rows_cuda(nn_bf16_cuda *kc, nn_bf16_cuda *vc, const nn_bf16_cuda *qkv, int T, int H, int KV,
                               int hd, const int32_t *rows, cudaStream_t s, char *err, size_t errlen);

/* out[Tq, H*hd] = softmax(q k^T * scale) v over each query's allowed cached keys.
 * q: query i's H heads at q + i * q_stride (the q part of a fused qkv row: q_stride =
 * (H+2KV)*hd). kc, vc: [*, KV*hd]; query head h reads kv head h / (H/KV).
 * Allowed keys: ranges (DEVICE [Tq], the union of [lo0,hi0) and [lo1,hi1), nn.h) when
 * non-NULL; else causal from p = p0 + *base: query i sees [max(0, p+i-window+1), p+i]
 * (window 0: from key 0). A query with no key gets a zero row. hd even, <= 256. The
 * keys a query sees and the order they are summed in depend on that query alone. */
int decode_attention_cuda(nn_bf16_cuda *out, const nn_bf16_cuda *q, long q_stride, const nn_bf16_cuda *kc,
                          const nn_bf16_cuda *vc, const nn_key_ranges *ranges, const int32_t *base, int p0, int window,
                          int Tq, int H, int KV, int hd, float scale, cudaStream_t s, char *err, size_t errlen);

/* decode_attention_cuda with out chunk-major over its Tq rows ((H * hd) % 32 == 0): the
 * o projection's input for decode_linear_rows_xc_cuda. The same values. */
int decode_attention_xc_cuda(nn_bf16_cuda *out, const nn_bf16_cuda *q, long q_stride, const nn_bf16_cuda *kc,
                             const nn_bf16_cuda *vc, const nn_key_ranges *ranges, const int32_t *base, int p0,
                             int window, int Tq, int H, int KV, int hd, float scale, cudaStream_t s, char *err,
                             size_t errlen);

/* Keys a warp of decode_attention_cuda scores per round (4, 8 or 16; 8 at most for
 * hd = 256; default 8): more loads in flight for a few queries over a short cache, another split of
 * the keys (so other roundings; a query's bits still depend on that query alone). A
 * process-wide setting like decode_linear_variant_cuda; returns the previous value,
 * anything else only queries. */
int decode_attention_keys_cuda(int keys);

/* Warps per (query, head) block of decode_attention_cuda (4, 8 or 16; default 8): each
 * takes every warps-th key group and the warps merge in order, so more warps are more
 * loads in flight for one query, and another split (other roundings; a query's bits
 * still depend on that query alone). Process-wide as decode_attention_keys_cuda; returns
 * the previous value, anything else only queries. */
int decode_attention_warps_cuda(int warps);

/* The step's small kernels (q/k norm + RoPE + append, attention; the callers' add +
 * RMSNorm through nn_add_rmsnorm_pdl_cuda) launched as programmatic dependents of the
 * kernel ahead (sm_90+): each waits for it before touching memory, so only the launch
 * overlaps; the same bits. 1 (default) or 0; process-wide, returns the previous value,
 * anything else only queries. */
int decode_pdl_small_cuda(int on);

/* Kernel sequences of a decode step: bits of decode_model_cuda.fused and
 * infer_state_cuda.fused (0: separate kernels; 1 means all three). */
#define DECODE_FUSE_QK_APPEND 2 /* q/k norm + RoPE + K/V cache append: one kernel */
#define DECODE_FUSE_RESIDUAL 4  /* o_proj and down add to the fp32 residual themselves (no bf16 y) */
#define DECODE_FUSE_SWIGLU 8    /* SwiGLU computed in the down projection's loads */
/* The fusions below give the bits of the separate kernels (each row's result is the same
 * with or without them), so they combine with anything, batches included:
 *   GLU: SwiGLU in the gate/up projection's epilogue (decode_linear_glu_rows_cuda);
 *   NORM: o_proj / down add to the residual and the next add + RMSNorm (and the capture)
 *     run in their last block (decode_linear_residual_rows_cuda), in calls of at most
 *     DECODE_NORM_TAIL_ROWS rows;
 *   ARGMAX: the greedy argmax in the lm_head's blocks (decode_linear_argmax_rows_cuda);
 *   QK_TAIL: with QK_APPEND, in calls of at most DECODE_QK_TAIL_ROWS rows, that kernel in
 *     the last block of the qkv projection (decode_linear_qk_rows_cuda);
 *   ARGMAX_SPLIT: the argmax (when not in the lm_head) over 32 blocks a row
 *     (decode_argmax_split_rows_cuda): exact, the same indices. */
#define DECODE_FUSE_GLU 16
#define DECODE_FUSE_NORM 32
#define DECODE_FUSE_ARGMAX 64
#define DECODE_FUSE_QK_TAIL 128
#define DECODE_FUSE_ARGMAX_SPLIT 256
/* XC: in calls of DECODE_XC_MIN_ROWS..DECODE_EPI_MAX_ROWS rows, the linear layers' inputs chunk-major (the
 * norms, the attention and the SwiGLU epilogue write them so, the linear kernels read
 * them at full cache lines; below): the same values at other addresses, so the same bits.
 * With the GLU epilogue only, not with NORM, the SwiGLU in down's loads, QK_TAIL or
 * ARGMAX (their kernels read row-major x); shapes whose widths are not multiples of 32
 * stay row-major. */
#define DECODE_FUSE_XC 512
/* From 17 rows: measured at 64 rows (the verify of a batch of 4: 8-9% faster, docs/decode_cuda.md);
 * at 16 rows chunk-major x now keeps the two-tile kernels too, which has not been measured */
#ifndef DECODE_XC_MIN_ROWS
#define DECODE_XC_MIN_ROWS 17
#endif
#ifndef DECODE_NORM_TAIL_ROWS
#define DECODE_NORM_TAIL_ROWS 2 /* its last block works alone: at 16 rows it cost more than it saved */
#endif
#ifndef DECODE_QK_TAIL_ROWS
#define DECODE_QK_TAIL_ROWS 2
#endif
#define DECODE_FUSE_BITS(f) ((f) == 1 ? (DECODE_FUSE_QK_APPEND | DECODE_FUSE_RESIDUAL | DECODE_FUSE_SWIGLU) : (f))
/* The sequence before the bit-exact fusions (the q/k kernel only; the SwiGLU inside
 * down's loads measured slower and the residual bit changed nothing, docs/decode_cuda.md). */
#define DECODE_FUSED_SEPARATE DECODE_FUSE_QK_APPEND
/* The default of both (decode_init/load_cuda, infer_init_cuda): the fastest measured on
 * an H200 (docs/decode_cuda.md). The add_rmsnorm tail (NORM) lost once the small kernels were
 * PDL launches; ARGMAX (in the lm_head) and QK_TAIL were slower. */
#ifndef DECODE_FUSED_DEFAULT
#define DECODE_FUSED_DEFAULT (DECODE_FUSE_QK_APPEND | DECODE_FUSE_GLU | DECODE_FUSE_ARGMAX_SPLIT | DECODE_FUSE_XC)
#endif

/* Rows one decode_linear_rows_cuda call takes. */
#define DECODE_LINEAR_MAX_ROWS 64

/* Chunk-major activations. A linear kernel's warp loads, per 32-element chunk of n_in, 16
 * bytes of each of 8 rows (4 lanes a row): in a row-major x [T, n_in] those are 8 cache
 * lines of which it uses 64 bytes each, and at 64 rows those x loads are most of the
 * L1 traffic that bounds the kernel (docs/decode_cuda.md). Chunk-major x keeps the 32
 * columns of a chunk of all T rows together: element (t, k) at
 *     x[((k / 32) * T + t) * 32 + k % 32]            (n_in % 32 == 0)
 * so 8 rows of a chunk are 512 contiguous bytes, 4 full lines. The _xc functions below,
 * nn_add_rmsnorm_xc_cuda and decode_attention_xc_cuda write or read that layout; the
 * values and the order of every sum are those of the row-major calls (the same bits). */
#define DECODE_XC_CHUNK 32

/* out[T, n_out] = x[T, n_in] @ w[n_out, n_in]^T (+ bias[n_out]), bf16 x / w / bias, fp32
 * accumulation, out bf16 (out_f32 = 0), fp32 (out_f32 = 1), or added to an fp32 out
 * (out_f32 = 2: the residual stream, out += result, no bf16 rounding); 1 <= T <= 64.
 * One thread block per 16 output columns; its W warps (8 or 16: the variant and n_out
 * decide, below) split n_in in chunks of 32 (warp w takes chunks w, w+W, ...), each
 * chunk is two m16n8k16 tensor-core products with the weights as the 16-row operand and
 * up to 8 x rows per 8-column operand, so every weight is read once for all rows; the
 * warps' partial sums are then added in warp order. Which chunk goes where and in what
 * order depends on n_in and n_out only,
 * and a tensor-core product's column depends on that column of its operand alone, so
 * element (t, n) is a function of row t of x and column n of w: a row's bits are the
 * same in a 1-row call and a 64-row one. x, w 16-byte aligned with n_in % 8 == 0 take
 * 16-byte loads; anything else takes element loads of the same values. */
int decode_linear_rows_cuda(void *out, int out_f32, const nn_bf16_cuda *x, const nn_bf16_cuda *w,
                            const nn_bf16_cuda *bias, int T, int n_in, int n_out, cudaStream_t s, char *err,
                            size_t errlen);

/* decode_linear_rows_cuda with x chunk-major over its T rows (16-byte aligned, n_in % 32
 * == 0); out as there (row-major). The same bits as decode_linear_rows_cuda on x row-major. */
int decode_linear_rows_xc_cuda(void *out, int out_f32, const nn_bf16_cuda *xc, const nn_bf16_cuda *w,
                               const nn_bf16_cuda *bias, int T, int n_in, int n_out, cudaStream_t s, char *err,
                               size_t errlen);

/* Kernel variants of decode_linear_rows_cuda / decode_linear_swiglu_rows_cuda (block
 * size, weight prefetch, programmatic dependent launch; bench_decode --linear-sweep
 * compares them). Every variant keeps a row's bits independent of the row count, but
 * two variants may round differently: set one before any decoding and keep it (a
 * process-wide setting; captured CUDA graphs keep the variant they were captured with).
 * decode_linear_variant_cuda(v) selects v (0 .. DECODE_LINEAR_VARIANTS-1; anything else
 * only queries) and returns the previous one. */
#define DECODE_LINEAR_VARIANTS 10
int decode_linear_variant_cuda(int v);
const char *decode_linear_variant_name_cuda(int v);

/* Two column tiles of 16 per block instead of one (each tile with the chunks and order of
 * its own block: the same bits either way): 1 never; 2 in the 8-warp kernels at 9..16
 * rows on wide shapes (at least 512 tiles) with n_in >= 4096 (the x rows read once for 32
 * columns: half the x traffic); 3 also in the 16-warp kernels at 1..8 rows when one tile
 * a block would need more blocks than the GPU has SMs (one wave instead of two); 4
 * (default) the same at 9..16 rows too.
 * Process-wide; returns the previous value, anything else only queries. */
int decode_linear_cols_cuda(int tiles);

/* Rows a block of the linear kernels takes in calls of 17..64 rows: 64 (default: one block
 * a column tile), 32, 16 or 8: a call of T rows then runs T / rows blocks a tile side by side
 * (more blocks in flight, fewer registers each; the weights come once from HBM, then from
 * L2). A row's chunks and order of additions are the same either way: the same bits.
 * Process-wide; returns the previous value, anything else only queries. */
int decode_linear_rows_block_cuda(int rows);

/* The same with x = SwiGLU of a fused gate/up activation gu [T, 2I] (gate columns, then
 * up): x[t, i] = bf16(silu(gu[t, i]) * gu[t, I + i]), nn_swiglu_cuda's values, computed
 * while loading (no pass of its own). n_in = I. */
int decode_linear_swiglu_rows_cuda(void *out, int out_f32, const nn_bf16_cuda *gu, const nn_bf16_cuda *w,
                                   const nn_bf16_cuda *bias, int T, int I, int n_out, cudaStream_t s, char *err,
                                   size_t errlen);

/* Rows the fused-epilogue kernels below take in one call. */
#define DECODE_EPI_MAX_ROWS 64
/* Device scratch of those kernels (a block counter, per-row argmax keys): this many bytes,
 * zeroed once (cudaMemset); every call leaves it zero again. One per stream: calls that
 * share one run one after the other. */
#define DECODE_EPI_SYNC_BYTES (8 + 8 * DECODE_EPI_MAX_ROWS)

/* h[T, I] = bf16(silu(g) * u) with g = bf16(x @ w_gate^T + b_gate), u = bf16(x @ w_up^T +
 * b_up), w_gu [2I, n_in] the fused gate/up weight (gate rows, then up rows), b_gu [2I] or
 * NULL: decode_linear_rows_cuda into gu [T, 2I] then nn_swiglu_cuda, bit for bit, in one
 * launch (no gu tensor). The block of gate columns 8j..8j+7 also takes up columns
 * 8j..8j+7: its 16 weight rows are read from where they are (no re-layout of w_gu); the
 * kernel variant is the one of an n_out = 2I call, so every sum has the same order.
 * T <= DECODE_EPI_MAX_ROWS, I % 8 == 0. */
int decode_linear_glu_rows_cuda(nn_bf16_cuda *h, const nn_bf16_cuda *x, const nn_bf16_cuda *w_gu,
                                const nn_bf16_cuda *b_gu, int T, int n_in, int I, cudaStream_t s, char *err,
                                size_t errlen);

/* decode_linear_glu_rows_cuda with x and h chunk-major over T rows (n_in, I multiples of
 * 32): the down projection's input in the layout decode_linear_rows_xc_cuda reads. */
int decode_linear_glu_rows_xc_cuda(nn_bf16_cuda *hc, const nn_bf16_cuda *xc, const nn_bf16_cuda *w_gu,
                                   const nn_bf16_cuda *b_gu, int T, int n_in, int I, cudaStream_t s, char *err,
                                   size_t errlen);

/* What decode_linear_residual_rows_cuda does after its add. */
typedef struct decode_norm_tail {
    const float *norm_w;    /* RMSNorm weight [n_out], or NULL (no norm) */
    nn_bf16_cuda *norm_out; /* [T - norm_row0, n_out]: rows norm_row0.. normalised (with norm_w) */
    int norm_row0;
    float eps;
    nn_bf16_cuda *capture; /* bf16 of x after the add, row t at capture + t * cap_stride, or NULL */
    long cap_stride;
    int32_t *sync; /* DECODE_EPI_SYNC_BYTES of zeroed device scratch */
} decode_norm_tail;

/* The residual step after a linear layer in one launch: y = bf16(in @ w^T + bias), x[T,
 * n_out] (fp32) += y, then what nn_add_rmsnorm_cuda(x, y, ...) does after its add (the
 * capture, the norm of rows norm_row0..), computed by the last block of the grid to finish
 * (a counter in tail->sync) in that kernel's order: bit for bit decode_linear_rows_cuda
 * into y, then nn_add_rmsnorm_cuda(x, y, norm_w, norm_out, capture) (norm_row0 == 0) or
 * nn_add_rmsnorm_cuda(x, y, NULL, NULL, capture) and nn_add_rmsnorm_cuda(x + norm_row0 *
 * n_out, NULL, norm_w, norm_out, NULL) (pointers 16-byte aligned, as cudaMalloc'd
 * buffers). T <= DECODE_EPI_MAX_ROWS. */
int decode_linear_residual_rows_cuda(float *x, const nn_bf16_cuda *in, const nn_bf16_cuda *w, const nn_bf16_cuda *bias,
                                     int T, int n_in, int n_out, const decode_norm_tail *tail, cudaStream_t s,
                                     char *err, size_t errlen);

/* decode_linear_rows_cuda(logits, 1, x, w, NULL, ...) and decode_argmax_rows_cuda(idx,
 * logits, T, n_out) in one launch: each block folds its columns into one 64-bit key per row
 * (value, then the first column) with atomicMax, the last block hands out the indices
 * (the same indices: first on ties, NaN skipped). sync: DECODE_EPI_SYNC_BYTES of zeroed
 * device scratch. T <= DECODE_EPI_MAX_ROWS. */
int decode_linear_argmax_rows_cuda(float *logits, int32_t *idx, const nn_bf16_cuda *x, const nn_bf16_cuda *w, int T,
                                   int n_in, int n_out, int32_t *sync, cudaStream_t s, char *err, size_t errlen);

/* What decode_linear_qk_rows_cuda does after its projection. */
typedef struct decode_qk_tail {
    int H, KV, hd;                /* heads of the fused qkv rows */
    const float *q_norm, *k_norm; /* both NULL: no norm (Llama) */
    const float *inv_freq;        /* [hd / 2] */
    float eps;
    nn_bf16_cuda *kc, *vc; /* the layer's caches */
    const int32_t *base;   /* rows at p0 + *base (DEVICE, or NULL) */
    int p0;
    int32_t *sync; /* DECODE_EPI_SYNC_BYTES of zeroed device scratch */
} decode_qk_tail;

/* decode_linear_rows_cuda(qkv, 0, x, w, bias, T, n_in, (H+2KV)*hd) and
 * decode_qk_norm_rope_append_cuda on its rows in one launch, bit for bit: the last block
 * of the grid runs the q/k kernel's per-head code (one warp per row and head). That is
 * T * (H+2KV) heads in one block, so it pays for a row or two only (callers pick by T: a
 * row's bits are the same either way). T <= DECODE_EPI_MAX_ROWS. */
int decode_linear_qk_rows_cuda(nn_bf16_cuda *qkv, const nn_bf16_cuda *x, const nn_bf16_cuda *w,
                               const nn_bf16_cuda *bias, int T, int n_in, const decode_qk_tail *qk, cudaStream_t s,
                               char *err, size_t errlen);

/* nn_qk_norm_rope_cuda (same math) at positions r = p0 + *base + t, and in the same pass
 * the k heads (normed, rotated) to cache row r of kc and the v heads to row r of vc:
 * decode_positions_cuda + nn_qk_norm_rope_cuda + decode_kv_append_cuda in one launch.
 * q_norm / k_norm both NULL: no norm (Llama). hd even, <= 256. */
int decode_qk_norm_rope_append_cuda(nn_bf16_cuda *qkv, const float *q_norm, const float *k_norm, const float *inv_freq,
                                    nn_bf16_cuda *kc, nn_bf16_cuda *vc, int T, int H, int KV, int hd, float eps,
                                    const int32_t *base, int p0, cudaStream_t s, char *err, size_t errlen);

/* The same for a batch of sequences: row t at position pos[t] and cache row crow[t]
 * (DEVICE arrays [T]): nn_qk_norm_rope_cuda at pos + decode_kv_append_rows_cuda at crow,
 * bit for bit, in one launch. */
int decode_qk_norm_rope_append_rows_cuda(nn_bf16_cuda *qkv, const float *q_norm, const float *k_norm,
                                         const float *inv_freq, nn_bf16_cuda *kc, nn_bf16_cuda *vc, int T, int H,
                                         int KV, int hd, float eps, const int32_t *pos, const int32_t *crow,
                                         cudaStream_t s, char *err, size_t errlen);

/* idx[r] = argmax of logits[r, 0..V) (fp32), the first index on ties, for r < rows. */
int decode_argmax_rows_cuda(int32_t *idx, const float *logits, int rows, int V, cudaStream_t s, char *err,
                            size_t errlen);

/* The same indices from 32 blocks a row (each folds its slice into one 64-bit key, value
 * then first index, atomicMax per block; the last block hands them out): the rows' scan
 * spread over the GPU instead of one block a row. sync: DECODE_EPI_SYNC_BYTES of zeroed
 * device scratch. rows <= DECODE_EPI_MAX_ROWS. */
int decode_argmax_split_rows_cuda(int32_t *idx, const float *logits, int rows, int V, int32_t *sync, cudaStream_t s,
                                  char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
