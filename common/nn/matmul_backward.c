/* matmul_backward.c: gradients of the linear layer out = x w^T (+ bias), accumulated.
 * Two passes (input gradient, then weight gradient) with the inner loops over contiguous
 * rows. Each element of dx (dw) receives its terms one output (one row t) at a time, in
 * ascending order, and a zero gradient adds nothing (so -0.0 and inf stay what the plain
 * loop makes of them). Four terms go into a register before the element is stored again,
 * which quarters the memory traffic without changing the order of the additions: the
 * bits equal the plain one-term-at-a-time loops (tests/test_nn_exact.c). */
#include "nn/nn_backward.h"

/* dst[i] += g[r] * src_r[i] for r = 0..3, in that order */
static void axpy4(float *restrict dst, const float g[4], const float *restrict s0, const float *restrict s1,
                  const float *restrict s2, const float *restrict s3, int n)
{
    for (int i = 0; i < n; i++) {
        float a = dst[i];
        a += g[0] * s0[i];
        a += g[1] * s1[i];
        a += g[2] * s2[i];
        a += g[3] * s3[i];
        dst[i] = a;
    }
}

static void axpy1(float *restrict dst, float g, const float *restrict s, int n)
{
    for (int i = 0; i < n; i++)
        dst[i] += g * s[i];
}

void nn_matmul_backward(float *restrict dx, float *restrict dw, float *dbias, const float *restrict dout,
                        const float *restrict x, const float *restrict w, int T, int n_in, int n_out)
{
    if (dx) {
        for (int t = 0; t < T; t++) {
            const float *g = dout + (long)t * n_out;
            float *dxr = dx + (long)t * n_in;
            int o = 0;
            for (; o + 4 <= n_out; o += 4) {
                const float *w0 = w + (long)o * n_in;
                if (g[o] != 0.0f && g[o + 1] != 0.0f && g[o + 2] != 0.0f && g[o + 3] != 0.0f) {
                    axpy4(dxr, g + o, w0, w0 + n_in, w0 + 2 * (long)n_in, w0 + 3 * (long)n_in, n_in);
                } else {
                    for (int r = 0; r < 4; r++)
                        if (g[o + r] != 0.0f)
                            axpy1(dxr, g[o + r], w0 + (long)r * n_in, n_in);
                }
            }
            for (; o < n_out; o++)
                if (g[o] != 0.0f)
                    axpy1(dxr, g[o], w + (long)o * n_in, n_in);
        }
    }
    if (dw || dbias) {
        int t = 0;
        for (; t + 4 <= T; t += 4) {
            const float *g0 = dout + (long)t * n_out, *x0 = x + (long)t * n_in;
            for (int o = 0; o < n_out; o++) {
                float g4[4] = {g0[o], g0[n_out + o], g0[2 * (long)n_out + o], g0[3 * (long)n_out + o]};
                if (dbias)
                    for (int r = 0; r < 4; r++)
                        if (g4[r] != 0.0f)
                            dbias[o] += g4[r];
                if (!dw)
                    continue;
                float *dwr = dw + (long)o * n_in;
                if (g4[0] != 0.0f && g4[1] != 0.0f && g4[2] != 0.0f && g4[3] != 0.0f) {
                    axpy4(dwr, g4, x0, x0 + n_in, x0 + 2 * (long)n_in, x0 + 3 * (long)n_in, n_in);
                } else {
                    for (int r = 0; r < 4; r++)
                        if (g4[r] != 0.0f)
                            axpy1(dwr, g4[r], x0 + (long)r * n_in, n_in);
                }
            }
        }
        for (; t < T; t++) {
            const float *g = dout + (long)t * n_out;
            const float *xr = x + (long)t * n_in;
            for (int o = 0; o < n_out; o++) {
                float go = g[o];
                if (go == 0.0f)
                    continue;
                if (dbias)
                    dbias[o] += go;
                if (dw)
                    axpy1(dw + (long)o * n_in, go, xr, n_in);
            }
        }
    }
}
