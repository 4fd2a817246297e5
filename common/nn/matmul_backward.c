/* matmul_backward.c: gradients of the linear layer out = x w^T (+ bias), accumulated.
 * Two plain passes (input gradient, then weight gradient) with the inner loops over
 * contiguous rows, so the reference is easy to read and not absurdly slow. */
#include "nn/nn_backward.h"

void nn_matmul_backward(float *restrict dx, float *restrict dw, float *dbias, const float *restrict dout,
                        const float *restrict x, const float *restrict w, int T,
                        int n_in, int n_out)
{
    if (dx) {
        for (int t = 0; t < T; t++) {
            const float *g = dout + (long)t * n_out;
            float *dxr = dx + (long)t * n_in;
            for (int o = 0; o < n_out; o++) {
                float go = g[o];
                if (go == 0.0f)
                    continue;
                const float *wr = w + (long)o * n_in;
                for (int i = 0; i < n_in; i++)
                    dxr[i] += go * wr[i];
            }
        }
    }
    if (dw || dbias) {
        for (int t = 0; t < T; t++) {
            const float *g = dout + (long)t * n_out;
            const float *xr = x + (long)t * n_in;
            for (int o = 0; o < n_out; o++) {
                float go = g[o];
                if (go == 0.0f)
                    continue;
                if (dbias)
                    dbias[o] += go;
                if (dw) {
                    float *dwr = dw + (long)o * n_in;
                    for (int i = 0; i < n_in; i++)
                        dwr[i] += go * xr[i];
                }
            }
        }
    }
}
