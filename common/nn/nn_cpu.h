/* nn_cpu.h: what the CPU layers' two copies share (internal to common/nn; isa.c says why
 * there are two). */
#ifndef DF_NN_CPU_H
#define DF_NN_CPU_H

#include "nn/nn.h"

/* The body of a loop compiled into both copies: always inlined, so it takes the target of
 * the function it is inlined into (the baseline, or target("avx")). */
#define NN_INLINE static inline __attribute__((always_inline))

#if defined(__x86_64__) || defined(__i386__)
#define NN_HAVE_AVX 1
#define NN_AVX __attribute__((target("avx")))
#else
#define NN_HAVE_AVX 0
#endif

/* Eight float and four double lanes (GCC/Clang vector extension): lane-wise products and
 * sums, rounded as the scalar operations are (common/nn is built with -ffp-contract=off).
 * The baseline copy holds one in two SSE registers, the AVX copy in one. The u types are
 * the same vectors at an element's alignment, for unaligned loads and stores. Vectors are
 * only used inside always-inlined code, so no vector calling convention is involved. */
typedef float nn_v8 __attribute__((vector_size(32)));
typedef float nn_v8u __attribute__((vector_size(32), aligned(4), may_alias));
typedef double nn_v4d __attribute__((vector_size(32)));
typedef double nn_v4du __attribute__((vector_size(32), aligned(8), may_alias));

#if NN_HAVE_AVX

/* lanes of a (0..7) and b (8..15) picked by constant indices; GCC before 12 has only
 * __builtin_shuffle, Clang only __builtin_shufflevector */
#if defined(__clang__)
#define NN_SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
typedef int nn_v8i __attribute__((vector_size(32)));
#define NN_SHUF(a, b, ...) __builtin_shuffle(a, b, (nn_v8i){__VA_ARGS__})
#endif

/* The 8 x 8 transpose: on return v[l][r] is what v[r][l] was. */
NN_INLINE NN_AVX void nn_transpose8(nn_v8 v[8])
{
    nn_v8 lo[4], hi[4], q[8];
    for (int p = 0; p < 4; p++) { /* rows 2p, 2p + 1: lanes 0, 1, 4, 5 and lanes 2, 3, 6, 7 interleaved */
        lo[p] = NN_SHUF(v[2 * p], v[2 * p + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        hi[p] = NN_SHUF(v[2 * p], v[2 * p + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int h = 0; h < 2; h++) { /* rows 4h .. 4h + 3: q[4h + m] holds their lanes m and m + 4 */
        q[4 * h + 0] = NN_SHUF(lo[2 * h], lo[2 * h + 1], 0, 1, 8, 9, 4, 5, 12, 13);
        q[4 * h + 1] = NN_SHUF(lo[2 * h], lo[2 * h + 1], 2, 3, 10, 11, 6, 7, 14, 15);
        q[4 * h + 2] = NN_SHUF(hi[2 * h], hi[2 * h + 1], 0, 1, 8, 9, 4, 5, 12, 13);
        q[4 * h + 3] = NN_SHUF(hi[2 * h], hi[2 * h + 1], 2, 3, 10, 11, 6, 7, 14, 15);
    }
    for (int m = 0; m < 4; m++) {
        v[m] = NN_SHUF(q[m], q[4 + m], 0, 1, 2, 3, 8, 9, 10, 11);
        v[m + 4] = NN_SHUF(q[m], q[4 + m], 4, 5, 6, 7, 12, 13, 14, 15);
    }
}
#endif

/* Attention's q.k (and dout.v) dot products from keys laid out per kv head as [hd, Tk] in
 * double, so that 16 keys' sums are the lanes of four 4-double vectors: enough independent
 * sums to keep the adder busy and nothing to shuffle. Worth it when many queries read the
 * same keys: a call with at least NN_KEYS_T_MIN_QUERIES queries per kv head, whose
 * transposed keys take at most NN_KEYS_T_MAX_BYTES. */
#define NN_KEYS_T_MIN_QUERIES 8
#define NN_KEYS_T_MAX_BYTES (64L << 20)

/* kt[d * Tk + j] = k[j * kv_stride + d] for j < Tk, d < hd (k: the head's first key) */
NN_INLINE void nn_keys_t(double *kt, const float *k, int Tk, int kv_stride, int hd)
{
    for (int j = 0; j < Tk; j++) {
        const float *kj = k + (long)j * kv_stride;
        for (int d = 0; d < hd; d++)
            kt[(long)d * Tk + j] = kj[d];
    }
}

/* sc[j] = (qh . k_j) * scale in double for j in [lo, hi), kt from nn_keys_t: the bits of
 * nn_scores (each key's sum adds (double)q[d] * k[d] in ascending d, then one product by
 * scale), 16 keys at a time, then 4, then one. */
NN_INLINE void nn_scores_t(double *sc, const float *qh, const double *kt, int Tk, int lo, int hi, int hd, double scale)
{
    nn_v4d sc4 = {scale, scale, scale, scale};
    int j = lo;
    for (; j + 16 <= hi; j += 16) {
        nn_v4d s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
        const double *c = kt + j;
        for (int d = 0; d < hd; d++, c += Tk) {
            double qd = qh[d];
            nn_v4d q4 = {qd, qd, qd, qd};
            s0 += q4 * *(const nn_v4du *)c;
            s1 += q4 * *(const nn_v4du *)(c + 4);
            s2 += q4 * *(const nn_v4du *)(c + 8);
            s3 += q4 * *(const nn_v4du *)(c + 12);
        }
        *(nn_v4du *)(sc + j) = s0 * sc4;
        *(nn_v4du *)(sc + j + 4) = s1 * sc4;
        *(nn_v4du *)(sc + j + 8) = s2 * sc4;
        *(nn_v4du *)(sc + j + 12) = s3 * sc4;
    }
    for (; j + 4 <= hi; j += 4) {
        nn_v4d s0 = {0};
        const double *c = kt + j;
        for (int d = 0; d < hd; d++, c += Tk) {
            double qd = qh[d];
            nn_v4d q4 = {qd, qd, qd, qd};
            s0 += q4 * *(const nn_v4du *)c;
        }
        *(nn_v4du *)(sc + j) = s0 * sc4;
    }
    for (; j < hi; j++) {
        double s0 = 0;
        for (int d = 0; d < hd; d++)
            s0 += (double)qh[d] * kt[(long)d * Tk + j];
        sc[j] = s0 * scale;
    }
}

/* Rows of a [rows, n] float matrix that fit in about 24 KB of L1: a tile of weight (or
 * weight-gradient) rows stays there while every row of the activations passes over it;
 * untiled, each activation row streams the whole matrix from L2. A multiple of 8, at
 * least 8. Tiles change when an element is computed, never how. */
static inline int nn_tile_rows(int n)
{
    long rows = (24L << 10) / ((long)(n > 0 ? n : 1) * (long)sizeof(float));
    return rows < 8 ? 8 : (int)(rows & ~7L);
}

#endif
