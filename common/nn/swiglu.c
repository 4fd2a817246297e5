/* swiglu.c: CPU reference SwiGLU activation, silu(gate) * up, elementwise. */
#include "nn/nn.h"

#include <math.h>

void nn_swiglu(float *out, const float *gate, const float *up, long n)
{
    for (long i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}
