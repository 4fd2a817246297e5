/* nn.h: the CPU reference layer library (fp32 math), one concept per file:
 *   matmul.c     linear layers           rmsnorm.c   RMSNorm (whole rows and per head)
 *   rope.c       rotary embeddings        swiglu.c    silu(gate) * up
 *   attention.c  masked multi-head attention with GQA, masks as key ranges per query
 *   moe.c        mixture-of-experts: softmax top-k routing and the routed SwiGLU experts
 *   isa.c        which vector instructions the loops run with (the same bits at every level)
 *
 * These are the numerics every other backend is checked against: simple loops, no
 * threads, no tricks beyond keeping accumulations in float (double where noted).
 * CUDA kernels live beside them as <name>.cu with the same semantics.
 *
 * Layout conventions (HF / PyTorch): activations row-major [T, C]; linear weights
 * [out, in]; attention q [Tq, n_heads, head_dim], k/v [Tk, n_kv_heads, head_dim];
 * query head h uses kv head h / (n_heads / n_kv_heads) (GQA).
 * Callers own every buffer; no function allocates unless it says so.
 */
#ifndef DF_NN_H
#define DF_NN_H

#include <stddef.h>
#include <stdint.h>

/* The vector instructions the hot loops run with. Every level gives the same bits (the
 * same operations, lanes and order; no fused multiply-add), only the speed differs. */
enum { NN_ISA_BASE = 0, NN_ISA_AVX = 1, NN_ISA_COUNT = 2 };

/* The level in use: the best this CPU has, unless DF_NN_ISA (base | avx) asks for a lower
 * one (read at the first call; an unknown or unsupported value is said on stderr and
 * ignored). */
int nn_isa(void);

/* Use `isa` from now on, process-wide (tests and benches compare the levels). Returns the
 * previous level, -EINVAL for no such level, -ENOTSUP when this CPU lacks it. */
int nn_isa_set(int isa);

/* 1 when this CPU can run `isa`. */
int nn_isa_supported(int isa);

/* "base", "avx"; "?" for anything else. */
const char *nn_isa_name(int isa);

/* out[T, n_out] = x[T, n_in] @ w[n_out, n_in]^T (+ bias[n_out] if non-NULL). */
void nn_matmul(float *out, const float *x, const float *w, const float *bias, int T, int n_in, int n_out);

/* out[T, C] = x * rsqrt(mean(x^2) + eps) * w[C]. out may alias x. */
void nn_rmsnorm(float *out, const float *x, const float *w, int T, int C, float eps);

/* Llama-3 style frequency scaling (HF rope_type "llama3"); factor <= 0 means none. */
typedef struct nn_rope_scaling {
    double factor, low_freq_factor, high_freq_factor;
    int original_max_position;
} nn_rope_scaling;

/* inv_freq[head_dim/2] = theta^(-2i/head_dim), then llama3 scaling if given. */
void nn_rope_inv_freq(float *inv_freq, int head_dim, double theta, const nn_rope_scaling *scaling);

/* In-place HF rotary embedding (rotate_half convention: pairs (i, i + head_dim/2)) of
 * x[T, n_heads, head_dim] at positions pos[T]. */
void nn_rope(float *x, const int32_t *pos, int T, int n_heads, int head_dim, const float *inv_freq);

/* out[n] = silu(gate[n]) * up[n]. out may alias gate or up. */
void nn_swiglu(float *out, const float *gate, const float *up, long n);

/* ---- mixture of experts (Qwen3-MoE) ---------------------------------------------
 * Weights, each expert contiguous: router w_router [E, d]; w_gate [E, F, d], w_up [E, F, d]
 * (expert e's HF gate_proj / up_proj [F, d] at e * F * d), w_down [E, d, F] (down_proj).
 *
 * nn_moe_route: for each token t, logits[t] = x[t] w_router^T (fp32, nn_matmul), probs[t] =
 * softmax(logits[t]) in fp32 (max subtracted, sum in index order), then the k experts of
 * largest probability in descending order: idx[t, 0..k-1], wts[t, j] = probs[t, idx[t, j]],
 * divided by their sum when norm_topk (Qwen3-MoE's norm_topk_prob). Ties: the lower expert
 * index first. torch.topk does not promise any order among equal values, so an exact tie
 * is the one case where this and transformers may pick differently; the fixtures are made
 * with no near tie (scripts/make_moe_fixture.py). Selection is on the probabilities, as
 * transformers does (two logits can round to the same probability).
 * logits, probs [T, E] are the caller's (outputs); idx [T, k], wts [T, k].
 *
 * nn_moe_experts: out[t] = sum_j wts[t, j] * down_e(silu(gate_e x[t]) * up_e x[t]), e =
 * idx[t, j], the terms added in ascending expert order into zero (transformers' loop over
 * experts with index_add_). Tokens are gathered per expert and run through nn_matmul
 * together; each row's sums do not depend on which rows share a call, so a token's output
 * is bit-identical whether it runs alone or in any batch. out [T, d] must not alias x.
 * scratch: nn_moe_scratch_floats(T, d, F) floats; rows: T int32. */
void nn_moe_route(int32_t *idx, float *wts, float *logits, float *probs, const float *x, const float *w_router, int T,
                  int d, int E, int k, int norm_topk);
size_t nn_moe_scratch_floats(int T, int d, int F);
void nn_moe_experts(float *out, const float *x, const int32_t *idx, const float *wts, const float *w_gate,
                    const float *w_up, const float *w_down, int T, int d, int F, int E, int k, float *scratch,
                    int32_t *rows);

/* The keys query q may attend: the union of [lo0, hi0) and [lo1, hi1) (empty when
 * lo >= hi). A query whose ranges are both empty gets an all-zero output row (padding). */
typedef struct nn_key_ranges {
    int32_t lo0, hi0, lo1, hi1;
} nn_key_ranges;

/* out[Tq, n_heads, hd] = softmax(q k^T * scale over the allowed keys) v.
 * ranges[Tq] gives each query's allowed keys. Softmax in double for the reference. */
void nn_attention(float *out, const float *q, const float *k, const float *v, const nn_key_ranges *ranges, int Tq,
                  int Tk, int n_heads, int n_kv_heads, int hd, float scale);

/* The keys of r inside [0, Tk) as at most two disjoint spans [lo, hi), ascending: every k
 * with lo0 <= k < hi0 or lo1 <= k < hi1, in the order a loop over all keys meets them.
 * Returns the count (0: the query sees nothing). */
int nn_key_spans(const nn_key_ranges *r, int Tk, int lo[2], int hi[2]);

/* sc[j] = (qh . k_j) * scale in double, for j in [lo, hi); k_j = k + j * kv_stride, hd
 * floats each. Each dot product sums over d in order (eight keys at a time, side by side),
 * so the result does not depend on lo or hi. */
void nn_scores(double *sc, const float *qh, const float *k, int lo, int hi, int kv_stride, int hd, double scale);

/* Causal ranges for a packed row: documents given by starts[n_docs+1] (starts[0] = 0,
 * starts[n_docs] = T). Query t of document d sees keys [starts[d], t]. Also fills
 * pos[t] = t - starts[d] when pos is non-NULL. */
void nn_packed_causal_ranges(nn_key_ranges *ranges, int32_t *pos, const int32_t *starts, int n_docs);

#endif
