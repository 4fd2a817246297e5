/* rmsnorm_backward.c: gradient of RMSNorm, y = x * r * w, r = (mean(x^2) + eps)^-1/2.
 * dy/dx couples the whole row through r, hence the row-mean term; sums in double like
 * the forward. */
#include "nn/nn_backward.h"

#include <math.h>

void nn_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, int T, int C,
                         float eps)
{
    for (int t = 0; t < T; t++) {
        const float *xr = x + (long)t * C;
        const float *g = dout + (long)t * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++)
            ss += (double)xr[c] * xr[c];
        double r = 1.0 / sqrt(ss / C + eps);
        if (dw) {
            for (int c = 0; c < C; c++)
                dw[c] += (float)((double)g[c] * xr[c] * r);
        }
        if (dx) {
            double dot = 0.0; /* sum_c dout*w*x */
            for (int c = 0; c < C; c++)
                dot += (double)g[c] * w[c] * xr[c];
            double k = dot * r * r * r / C;
            float *dxr = dx + (long)t * C;
            for (int c = 0; c < C; c++)
                dxr[c] += (float)((double)g[c] * w[c] * r - xr[c] * k);
        }
    }
}
