/* matmul.c: CPU reference linear layer, out = x @ w^T (+ bias).
 * The dot products run over contiguous memory of both x and w (HF [out, in] weights),
 * in 8 independent partial sums that are added in a fixed order at the end: the compiler
 * turns the lanes into SIMD registers (common/nn is built with -O3), and the result is
 * the same on every run (no threads, no reordering left to chance). */
#include "nn/nn.h"

#define LANES 8

static float dot(const float *restrict a, const float *restrict b, int n)
{
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++)
            acc[l] += a[i + l] * b[i + l];
    float s = 0.0f;
    for (; i < n; i++)
        s += a[i] * b[i];
    for (int l = 0; l < LANES; l++)
        s += acc[l];
    return s;
}

void nn_matmul(float *out, const float *x, const float *w, const float *bias, int T, int n_in, int n_out)
{
    for (int t = 0; t < T; t++) {
        const float *xr = x + (long)t * n_in;
        float *orow = out + (long)t * n_out;
        for (int o = 0; o < n_out; o++)
            orow[o] = (bias ? bias[o] : 0.0f) + dot(xr, w + (long)o * n_in, n_in);
    }
}
