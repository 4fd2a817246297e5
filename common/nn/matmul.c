/* matmul.c: CPU reference linear layer, out = x @ w^T (+ bias).
 * The dot products run over contiguous memory of both x and w (HF [out, in] weights),
 * in 8 independent partial sums (lane l takes the terms i = l mod 8) that are added in a
 * fixed order at the end, so the result is the same on every run (no threads, no
 * reordering left to chance). Several outputs share each load of x (weight rows side by
 * side, each with its own 8 lanes): every output still sums exactly as dot() alone would,
 * so the bits equal the one-output loop (tests/test_nn_exact.c).
 *
 * Two copies (isa.c picks one at run time): the x86-64 baseline holds an output's 8 lanes
 * in two SSE registers and takes 4 outputs at a time; AVX holds them in one register and
 * takes 8 outputs at a time (8 independent sums keep its adder busy: with 4 the adds
 * wait on each other and AVX gains nothing). Same lanes, same operations, same order. */
#include "nn/nn_cpu.h"

#include <string.h>

#define LANES 8

/* ---- the baseline copy: four float lanes (GCC/Clang vector extension; SSE2 on x86-64,
 * NEON on arm64), lane-wise products and sums rounded exactly as the scalar operations
 * are (no fused multiply-add: -ffp-contract=off); an output's 8 lanes are lo and hi */
typedef float v4 __attribute__((vector_size(16)));

static inline v4 load4(const float *p)
{
    v4 v;
    memcpy(&v, p, sizeof v); /* unaligned load */
    return v;
}

/* sum of a[i] * b[i]: lane l (0..7) accumulates the i = l (mod 8) terms of the whole
 * blocks, the tail goes into s one term at a time, then the lanes are added to s in order */
static float dot(const float *restrict a, const float *restrict b, int n)
{
    v4 lo = {0, 0, 0, 0}, hi = {0, 0, 0, 0};
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        lo += load4(a + i) * load4(b + i);
        hi += load4(a + i + 4) * load4(b + i + 4);
    }
    float s = 0.0f;
    for (; i < n; i++)
        s += a[i] * b[i];
    for (int l = 0; l < 4; l++)
        s += lo[l];
    for (int l = 0; l < 4; l++)
        s += hi[l];
    return s;
}

/* dot(a, b_r) for the four rows b0..b3, each summed exactly as dot() does; a is loaded once */
static void dot4(float out[4], const float *restrict a, const float *restrict b0, const float *restrict b1,
                 const float *restrict b2, const float *restrict b3, int n)
{
    v4 l0 = {0, 0, 0, 0}, h0 = l0, l1 = l0, h1 = l0, l2 = l0, h2 = l0, l3 = l0, h3 = l0;
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        v4 al = load4(a + i), ah = load4(a + i + 4);
        l0 += al * load4(b0 + i);
        h0 += ah * load4(b0 + i + 4);
        l1 += al * load4(b1 + i);
        h1 += ah * load4(b1 + i + 4);
        l2 += al * load4(b2 + i);
        h2 += ah * load4(b2 + i + 4);
        l3 += al * load4(b3 + i);
        h3 += ah * load4(b3 + i + 4);
    }
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    for (; i < n; i++) {
        s0 += a[i] * b0[i];
        s1 += a[i] * b1[i];
        s2 += a[i] * b2[i];
        s3 += a[i] * b3[i];
    }
    for (int l = 0; l < 4; l++) {
        s0 += l0[l];
        s1 += l1[l];
        s2 += l2[l];
        s3 += l3[l];
    }
    for (int l = 0; l < 4; l++) {
        s0 += h0[l];
        s1 += h1[l];
        s2 += h2[l];
        s3 += h3[l];
    }
    out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3;
}

static void matmul_base(float *out, const float *x, const float *w, const float *bias, int T, int n_in, int n_out)
{
    int tile = nn_tile_rows(n_in);
    for (int o0 = 0; o0 < n_out; o0 += tile) {
        int o1 = o0 + tile < n_out ? o0 + tile : n_out;
        for (int t = 0; t < T; t++) {
            const float *xr = x + (long)t * n_in;
            float *orow = out + (long)t * n_out;
            int o = o0;
            for (; o + 4 <= o1; o += 4) {
                const float *w0 = w + (long)o * n_in;
                float d[4];
                dot4(d, xr, w0, w0 + n_in, w0 + 2 * (long)n_in, w0 + 3 * (long)n_in, n_in);
                for (int r = 0; r < 4; r++)
                    orow[o + r] = (bias ? bias[o + r] : 0.0f) + d[r];
            }
            for (; o < o1; o++)
                orow[o] = (bias ? bias[o] : 0.0f) + dot(xr, w + (long)o * n_in, n_in);
        }
    }
}

#if NN_HAVE_AVX
/* ---- the AVX copy: an output's 8 lanes in one register (lane l = lo[l] for l < 4, hi[l - 4]
 * after), 8 outputs at a time. Vectors never cross a function boundary (the helpers are
 * inlined), so no vector calling convention is involved. */
typedef nn_v8 v8;
typedef nn_v8u v8u;
#define AVX_INLINE NN_INLINE NN_AVX

/* dot(a, b) summed exactly as dot() does */
AVX_INLINE float dot_avx1(const float *restrict a, const float *restrict b, int n)
{
    v8 acc = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        acc += *(const v8u *)(a + i) * *(const v8u *)(b + i);
    float s = 0.0f;
    for (; i < n; i++)
        s += a[i] * b[i];
    for (int l = 0; l < LANES; l++)
        s += acc[l];
    return s;
}

/* out[r] = (bias ? bias[r] : 0) + dot(a, b + r * ldb) for r < 8, each summed exactly as
 * dot() does. The last step of each sum, tail + lane 0 + lane 1 + ... + lane 7 in that
 * order, runs for the 8 outputs at once: the 8 x 8 lanes are transposed (acc[l] then holds
 * lane l of the 8 outputs) and added as whole vectors, the same additions in the same order. */
AVX_INLINE void dot_avx8(float *out, const float *bias, const float *restrict a, const float *restrict b, long ldb,
                         int n)
{
    v8 acc[8];
    for (int r = 0; r < 8; r++)
        acc[r] = (v8){0};
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        v8 xa = *(const v8u *)(a + i);
        for (int r = 0; r < 8; r++)
            acc[r] += xa * *(const v8u *)(b + r * ldb + i);
    }
    v8 s = {0};
    for (int r = 0; r < 8; r++)
        for (int k = i; k < n; k++)
            s[r] += a[k] * b[r * ldb + k];
    nn_transpose8(acc); /* acc[l] now holds lane l of the 8 outputs */
    for (int l = 0; l < LANES; l++)
        s += acc[l];
    if (bias)
        s = *(const v8u *)bias + s;
    else
        s = (v8){0} + s;
    *(v8u *)out = s;
}

NN_AVX static void matmul_avx(float *out, const float *x, const float *w, const float *bias, int T, int n_in, int n_out)
{
    int tile = nn_tile_rows(n_in);
    for (int o0 = 0; o0 < n_out; o0 += tile) {
        int o1 = o0 + tile < n_out ? o0 + tile : n_out;
        for (int t = 0; t < T; t++) {
            const float *xr = x + (long)t * n_in;
            float *orow = out + (long)t * n_out;
            int o = o0;
            for (; o + 8 <= o1; o += 8)
                dot_avx8(orow + o, bias ? bias + o : NULL, xr, w + (long)o * n_in, n_in, n_in);
            for (; o < o1; o++)
                orow[o] = (bias ? bias[o] : 0.0f) + dot_avx1(xr, w + (long)o * n_in, n_in);
        }
    }
}
#endif

void nn_matmul(float *out, const float *x, const float *w, const float *bias, int T, int n_in, int n_out)
{
#if NN_HAVE_AVX
    if (nn_isa() >= NN_ISA_AVX) {
        matmul_avx(out, x, w, bias, T, n_in, n_out);
        return;
    }
#endif
    matmul_base(out, x, w, bias, T, n_in, n_out);
}
