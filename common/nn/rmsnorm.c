/* rmsnorm.c: CPU reference RMSNorm over the last dimension (HF Qwen3/Llama RMSNorm:
 * the mean of squares in fp32, weight applied after normalisation). */
#include "nn/nn.h"

#include <math.h>

void nn_rmsnorm(float *out, const float *x, const float *w, int T, int C, float eps)
{
    for (int t = 0; t < T; t++) {
        const float *xr = x + (long)t * C;
        float *orow = out + (long)t * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++)
            ss += (double)xr[c] * xr[c];
        float r = (float)(1.0 / sqrt(ss / C + eps));
        for (int c = 0; c < C; c++)
            orow[c] = xr[c] * r * w[c];
    }
}
