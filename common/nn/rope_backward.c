/* rope_backward.c: gradient of the rotary embedding. Each (i, i+half) pair is rotated by
 * angle pos*inv_freq[i]; the transpose of a rotation is the rotation by minus that angle,
 * applied in place to the incoming gradient. The angle is computed exactly as the
 * forward computes it (fp32 product, then cos/sin). */
#include "nn/nn_backward.h"

#include <math.h>

void nn_rope_backward(float *dx, const int32_t *pos, int T, int n_heads, int head_dim, const float *inv_freq)
{
    int half = head_dim / 2;
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            float ang = (float)pos[t] * inv_freq[i];
            float c = cosf(ang), s = sinf(ang);
            for (int h = 0; h < n_heads; h++) {
                float *g = dx + ((long)t * n_heads + h) * head_dim;
                float a = g[i], b = g[i + half];
                /* forward: y0 = a c - b s, y1 = b c + a s  =>  dx0 = g0 c + g1 s, dx1 = g1 c - g0 s */
                g[i] = a * c + b * s;
                g[i + half] = b * c - a * s;
            }
        }
    }
}
