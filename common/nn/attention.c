/* attention.c: CPU reference masked attention with GQA. A mask is given as at most two
 * key ranges per query (nn_key_ranges): enough for packed causal documents (one range)
 * and for DFlash training (context before the anchor + the query's own block). Softmax
 * is computed in double so this stays the reference the kernels are judged against.
 *
 * Speed without changing a bit: only the allowed keys are visited (nn_key_spans), in
 * ascending order as a loop over every key would, and the q.k dot products of eight keys
 * run side by side (eight independent sums, each over d in order), which hides the
 * latency of the serial double additions. tests/test_nn_exact.c checks the results
 * against the plain one-key-at-a-time loops (tests/nn_plain.h) bit for bit. The AVX copy
 * (isa.c) takes the q.k products from the keys laid out per kv head as [hd, keys]
 * (nn_keys_t, nn_scores_t in nn_cpu.h), 16 keys at a time, the same sums. */
#include "nn/nn_cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int nn_key_spans(const nn_key_ranges *r, int Tk, int lo[2], int hi[2])
{
    int a0 = r->lo0 > 0 ? r->lo0 : 0, b0 = r->hi0 < Tk ? r->hi0 : Tk;
    int a1 = r->lo1 > 0 ? r->lo1 : 0, b1 = r->hi1 < Tk ? r->hi1 : Tk;
    int n = 0;
    if (a0 < b0) {
        lo[n] = a0, hi[n] = b0, n++;
    }
    if (a1 < b1) {
        lo[n] = a1, hi[n] = b1, n++;
    }
    if (n == 2 && lo[1] < lo[0]) { /* ascending */
        int t = lo[0];
        lo[0] = lo[1], lo[1] = t;
        t = hi[0];
        hi[0] = hi[1], hi[1] = t;
    }
    if (n == 2 && lo[1] <= hi[0]) { /* overlapping or touching: one span */
        hi[0] = hi[1] > hi[0] ? hi[1] : hi[0];
        n = 1;
    }
    return n;
}

void nn_scores(double *sc, const float *qh, const float *k, int lo, int hi, int kv_stride, int hd, double scale)
{
    int j = lo;
    for (; j + 8 <= hi; j += 8) { /* eight independent sums keep the adder busy */
        const float *kr[8];
        for (int r = 0; r < 8; r++)
            kr[r] = k + (long)(j + r) * kv_stride;
        double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int d = 0; d < hd; d++) {
            double qd = qh[d];
            for (int r = 0; r < 8; r++)
                s[r] += qd * kr[r][d];
        }
        for (int r = 0; r < 8; r++)
            sc[j + r] = s[r] * scale;
    }
    for (; j < hi; j++) {
        const float *kj = k + (long)j * kv_stride;
        double s0 = 0;
        for (int d = 0; d < hd; d++)
            s0 += (double)qh[d] * kj[d];
        sc[j] = s0 * scale;
    }
}

NN_INLINE void attention(float *out, const float *q, const float *k, const float *v, const nn_key_ranges *ranges,
                         int Tq, int Tk, int n_heads, int n_kv_heads, int hd, float scale, int keys_t)
{
    int group = n_heads / n_kv_heads, kv_stride = n_kv_heads * hd;
    double *sc = malloc(sizeof(double) * (size_t)(Tk > 0 ? Tk : 1));
    double *acc = malloc(sizeof(double) * (size_t)hd);
    if (!sc || !acc)
        abort();       /* reference code: allocation failure is not recoverable here */
    double *kt = NULL; /* the AVX copy: the keys per kv head as [hd, Tk] (nn_scores_t), when worth it */
    long kt_n = (long)n_kv_heads * hd * Tk;
    if (keys_t && (long)Tq * group >= NN_KEYS_T_MIN_QUERIES && kt_n > 0 &&
        kt_n * (long)sizeof(double) <= NN_KEYS_T_MAX_BYTES) {
        if (!(kt = malloc(sizeof(double) * (size_t)kt_n)))
            abort();
        for (int kh = 0; kh < n_kv_heads; kh++)
            nn_keys_t(kt + (long)kh * hd * Tk, k + (long)kh * hd, Tk, kv_stride, hd);
    }
    for (int t = 0; t < Tq; t++) {
        int lo[2], hi[2];
        int ns = nn_key_spans(&ranges[t], Tk, lo, hi);
        for (int h = 0; h < n_heads; h++) {
            int kh = h / group;
            const float *qh = q + ((long)t * n_heads + h) * hd;
            float *oh = out + ((long)t * n_heads + h) * hd;
            if (ns == 0) { /* padding query: exact zeros, never NaN */
                memset(oh, 0, sizeof(float) * (size_t)hd);
                continue;
            }
            double mx = -INFINITY;
            for (int s = 0; s < ns; s++) {
                if (kt)
                    nn_scores_t(sc, qh, kt + (long)kh * hd * Tk, Tk, lo[s], hi[s], hd, scale);
                else
                    nn_scores(sc, qh, k + (long)kh * hd, lo[s], hi[s], kv_stride, hd, scale);
                for (int j = lo[s]; j < hi[s]; j++)
                    if (sc[j] > mx)
                        mx = sc[j];
            }
            double den = 0;
            memset(acc, 0, sizeof(double) * (size_t)hd);
            for (int s = 0; s < ns; s++)
                for (int j = lo[s]; j < hi[s]; j++) {
                    if (sc[j] == -INFINITY)
                        continue;
                    double p = exp(sc[j] - mx);
                    den += p;
                    const float *vj = v + (long)j * kv_stride + (long)kh * hd;
                    for (int d = 0; d < hd; d++)
                        acc[d] += p * vj[d];
                }
            for (int d = 0; d < hd; d++)
                oh[d] = (float)(acc[d] / den);
        }
    }
    free(sc);
    free(acc);
    free(kt);
}

void nn_packed_causal_ranges(nn_key_ranges *ranges, int32_t *pos, const int32_t *starts, int n_docs)
{
    for (int d = 0; d < n_docs; d++) {
        for (int t = starts[d]; t < starts[d + 1]; t++) {
            ranges[t] = (nn_key_ranges){starts[d], t + 1, 0, 0};
            if (pos)
                pos[t] = t - starts[d];
        }
    }
}

static void attention_base(float *out, const float *q, const float *k, const float *v, const nn_key_ranges *ranges,
                           int Tq, int Tk, int n_heads, int n_kv_heads, int hd, float scale)
{
    attention(out, q, k, v, ranges, Tq, Tk, n_heads, n_kv_heads, hd, scale, 0);
}

#if NN_HAVE_AVX
NN_AVX static void attention_avx(float *out, const float *q, const float *k, const float *v,
                                 const nn_key_ranges *ranges, int Tq, int Tk, int n_heads, int n_kv_heads, int hd,
                                 float scale)
{
    attention(out, q, k, v, ranges, Tq, Tk, n_heads, n_kv_heads, hd, scale, 1);
}
#endif

void nn_attention(float *out, const float *q, const float *k, const float *v, const nn_key_ranges *ranges, int Tq,
                  int Tk, int n_heads, int n_kv_heads, int hd, float scale)
{
#if NN_HAVE_AVX
    if (nn_isa() >= NN_ISA_AVX) {
        attention_avx(out, q, k, v, ranges, Tq, Tk, n_heads, n_kv_heads, hd, scale);
        return;
    }
#endif
    attention_base(out, q, k, v, ranges, Tq, Tk, n_heads, n_kv_heads, hd, scale);
}
