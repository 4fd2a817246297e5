/* matmul.c: CPU reference linear layer, out = x @ w^T (+ bias). Loops ordered so the
 * inner product runs over contiguous memory of both x and w (HF [out, in] weights). */
#include "nn/nn.h"

void nn_matmul(float *out, const float *x, const float *w, const float *bias, int T, int n_in, int n_out)
{
    for (int t = 0; t < T; t++) {
        const float *xr = x + (long)t * n_in;
        float *orow = out + (long)t * n_out;
        for (int o = 0; o < n_out; o++) {
            const float *wr = w + (long)o * n_in;
            float acc = bias ? bias[o] : 0.0f;
            for (int i = 0; i < n_in; i++)
                acc += xr[i] * wr[i];
            orow[o] = acc;
        }
    }
}
