/* matmul_backward.c: gradients of the linear layer out = x w^T (+ bias), accumulated.
 * Two passes (input gradient, then weight gradient) with the inner loops over contiguous
 * rows. Each element of dx (dw) receives its terms one output (one row t) at a time, in
 * ascending order, and a zero gradient adds nothing (so -0.0 and inf stay what the plain
 * loop makes of them). Four terms go into a register before the element is stored again,
 * which quarters the memory traffic without changing the order of the additions: the
 * bits equal the plain one-term-at-a-time loops (tests/test_nn_exact.c).
 *
 * Both passes go over tiles of rows that stay in L1 (nn_tile_rows): dx over tiles of w's
 * rows (outputs), every row of dx visiting one tile before the next, dw over tiles of its
 * own rows. An element's terms still arrive in ascending order. The element-wise loops are
 * vectorised by the compiler, in a baseline and an AVX copy (isa.c): lane-wise, so the
 * same bits at any width. */
#include "nn/nn_backward.h"
#include "nn/nn_cpu.h"

/* dst[i] += g[r] * src_r[i] for r = 0..3, in that order */
NN_INLINE void axpy4(float *restrict dst, const float g[4], const float *restrict s0, const float *restrict s1,
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

NN_INLINE void axpy1(float *restrict dst, float g, const float *restrict s, int n)
{
    for (int i = 0; i < n; i++)
        dst[i] += g * s[i];
}

/* dx[t] += sum over o of dout[t, o] w[o], the terms in ascending o */
NN_INLINE void backward_dx(float *restrict dx, const float *restrict dout, const float *restrict w, int T, int n_in,
                           int n_out)
{
    int tile = nn_tile_rows(n_in);
    for (int o0 = 0; o0 < n_out; o0 += tile) {
        int o1 = o0 + tile < n_out ? o0 + tile : n_out;
        for (int t = 0; t < T; t++) {
            const float *g = dout + (long)t * n_out;
            float *dxr = dx + (long)t * n_in;
            int o = o0;
            for (; o + 4 <= o1; o += 4) {
                const float *w0 = w + (long)o * n_in;
                if (g[o] != 0.0f && g[o + 1] != 0.0f && g[o + 2] != 0.0f && g[o + 3] != 0.0f) {
                    axpy4(dxr, g + o, w0, w0 + n_in, w0 + 2 * (long)n_in, w0 + 3 * (long)n_in, n_in);
                } else {
                    for (int r = 0; r < 4; r++)
                        if (g[o + r] != 0.0f)
                            axpy1(dxr, g[o + r], w0 + (long)r * n_in, n_in);
                }
            }
            for (; o < o1; o++)
                if (g[o] != 0.0f)
                    axpy1(dxr, g[o], w + (long)o * n_in, n_in);
        }
    }
}

/* dw[o] += sum over t of dout[t, o] x[t] and dbias[o] += sum over t of dout[t, o], the terms
 * in ascending t */
NN_INLINE void backward_dw(float *restrict dw, float *dbias, const float *restrict dout, const float *restrict x, int T,
                           int n_in, int n_out)
{
    int tile = nn_tile_rows(n_in);
    for (int o0 = 0; o0 < n_out; o0 += tile) {
        int o1 = o0 + tile < n_out ? o0 + tile : n_out;
        int t = 0;
        for (; t + 4 <= T; t += 4) {
            const float *g0 = dout + (long)t * n_out, *x0 = x + (long)t * n_in;
            for (int o = o0; o < o1; o++) {
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
            for (int o = o0; o < o1; o++) {
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

NN_INLINE void backward(float *restrict dx, float *restrict dw, float *dbias, const float *restrict dout,
                        const float *restrict x, const float *restrict w, int T, int n_in, int n_out)
{
    if (dx)
        backward_dx(dx, dout, w, T, n_in, n_out);
    if (dw || dbias)
        backward_dw(dw, dbias, dout, x, T, n_in, n_out);
}

static void backward_base(float *restrict dx, float *restrict dw, float *dbias, const float *restrict dout,
                          const float *restrict x, const float *restrict w, int T, int n_in, int n_out)
{
    backward(dx, dw, dbias, dout, x, w, T, n_in, n_out);
}

#if NN_HAVE_AVX
NN_AVX static void backward_avx(float *restrict dx, float *restrict dw, float *dbias, const float *restrict dout,
                                const float *restrict x, const float *restrict w, int T, int n_in, int n_out)
{
    backward(dx, dw, dbias, dout, x, w, T, n_in, n_out);
}
#endif

void nn_matmul_backward(float *restrict dx, float *restrict dw, float *dbias, const float *restrict dout,
                        const float *restrict x, const float *restrict w, int T, int n_in, int n_out)
{
#if NN_HAVE_AVX
    if (nn_isa() >= NN_ISA_AVX) {
        backward_avx(dx, dw, dbias, dout, x, w, T, n_in, n_out);
        return;
    }
#endif
    backward_base(dx, dw, dbias, dout, x, w, T, n_in, n_out);
}
