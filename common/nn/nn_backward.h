/* nn_backward.h: gradients of the CPU reference layers in nn.h, one file per layer
 * (<layer>_backward.c), for training the DFlash drafter on the CPU and for judging the
 * CUDA backward kernels.
 *
 * Contract shared by every function here: gradient outputs are ACCUMULATED (+=), never
 * overwritten, so a tensor used twice (the drafter's context C feeds the K and V
 * projections of every layer) simply collects its gradient from each use. Callers zero
 * them first. A NULL gradient output is skipped (e.g. frozen weights, unused inputs).
 * The forward inputs are passed again (no hidden saved state); the layouts are those of
 * nn.h. Sums run in double where the forward does (softmax, RMS), else in float.
 */
#ifndef DF_NN_BACKWARD_H
#define DF_NN_BACKWARD_H

#include "nn/nn.h"

/* out = x w^T (+ bias): dx[T, n_in] += dout w; dw[n_out, n_in] += dout^T x; dbias += sum_t dout. */
void nn_matmul_backward(float *dx, float *dw, float *dbias, const float *dout, const float *x, const float *w, int T,
                        int n_in, int n_out);

/* out = x * r * w with r = rsqrt(mean(x^2) + eps) per row:
 * dx += r * (dout*w) - x * r^3 * mean(dout*w*x); dw += sum_t dout * x * r.
 * dx must not alias dout. Per-head norms: call with T*n_heads rows of head_dim. */
void nn_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, int T, int C,
                         float eps);

/* The rotation is orthogonal, so its backward is the inverse rotation, applied IN PLACE
 * to the gradient dx[T, n_heads, head_dim] (the one exception to "accumulate"). */
void nn_rope_backward(float *dx, const int32_t *pos, int T, int n_heads, int head_dim, const float *inv_freq);

/* out = silu(gate) * up: dgate += dout * up * silu'(gate); dup += dout * silu(gate). */
void nn_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, long n);

/* Backward of nn_attention (same masks, same GQA mapping): the probabilities are
 * recomputed in double from q, k; then dv += p^T dout, ds = p * (dout.v - sum p dout.v),
 * dq += scale * ds k, dk += scale * ds^T q. Queries with no allowed key contribute
 * nothing (their output was the constant zero). dq [Tq, n_heads, hd], dk/dv
 * [Tk, n_kv_heads, hd]; any may be NULL. */
void nn_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                           const float *v, const nn_key_ranges *ranges, int Tq, int Tk, int n_heads, int n_kv_heads,
                           int hd, float scale);

#endif
