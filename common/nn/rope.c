/* rope.c: CPU reference rotary position embedding, HF conventions: inv_freq over
 * head_dim/2 frequencies, the rotation pairs element i with element i + head_dim/2
 * ("rotate_half"), optional Llama-3 frequency scaling. */
#include "nn/nn.h"

#include <math.h>

void nn_rope_inv_freq(float *inv_freq, int head_dim, double theta, const nn_rope_scaling *sc)
{
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        double f = 1.0 / pow(theta, (double)(2 * i) / head_dim);
        if (sc && sc->factor > 0) {
            /* Llama 3.1: keep high frequencies, divide low ones by factor, blend between. */
            double low_wavelen = sc->original_max_position / sc->low_freq_factor;
            double high_wavelen = sc->original_max_position / sc->high_freq_factor;
            double wavelen = 2.0 * M_PI / f;
            if (wavelen > low_wavelen) {
                f = f / sc->factor;
            } else if (wavelen >= high_wavelen) {
                double smooth = (sc->original_max_position / wavelen - sc->low_freq_factor) /
                                (sc->high_freq_factor - sc->low_freq_factor);
                f = (1.0 - smooth) * f / sc->factor + smooth * f;
            }
        }
        inv_freq[i] = (float)f;
    }
}

void nn_rope(float *x, const int32_t *pos, int T, int n_heads, int head_dim, const float *inv_freq)
{
    int half = head_dim / 2;
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            /* HF computes the angle in fp32 (pos * inv_freq), then cos/sin */
            float ang = (float)pos[t] * inv_freq[i];
            float c = cosf(ang), s = sinf(ang);
            for (int h = 0; h < n_heads; h++) {
                float *xh = x + ((long)t * n_heads + h) * head_dim;
                float a = xh[i], b = xh[i + half];
                xh[i] = a * c - b * s;
                xh[i + half] = b * c + a * s;
            }
        }
    }
}
