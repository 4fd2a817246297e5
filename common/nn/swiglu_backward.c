/* swiglu_backward.c: gradient of silu(gate) * up, with silu'(g) = sig(g) (1 + g (1 - sig(g))). */
#include "nn/nn_backward.h"

#include <math.h>

void nn_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, long n)
{
    for (long i = 0; i < n; i++) {
        float g = gate[i];
        float sg = 1.0f / (1.0f + expf(-g));
        if (dup)
            dup[i] += dout[i] * g * sg;
        if (dgate)
            dgate[i] += dout[i] * up[i] * sg * (1.0f + g * (1.0f - sg));
    }
}
