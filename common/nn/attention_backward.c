/* attention_backward.c: gradient of the range-masked GQA attention of attention.c.
 * Per (query, head): recompute the softmax row in double exactly as the forward does,
 * then dv += p dout, ds_j = p_j (dout.v_j - sum_i p_i dout.v_i), dq += scale ds k,
 * dk += scale ds q. Queries whose ranges are empty produced a constant zero row and so
 * pass no gradient. Several query heads share a kv head (GQA): their dk/dv add up.
 * Like the forward, it visits only the allowed keys, in ascending order, and computes the
 * dot products eight keys at a time (nn_scores): the same bits as the plain loops
 * (tests/test_nn_exact.c). The AVX copy (isa.c) takes the products from the keys and values
 * laid out per kv head as [hd, keys] (nn_keys_t, nn_scores_t in nn_cpu.h), 16 keys a time. */
#include "nn/nn_backward.h"
#include "nn/nn_cpu.h"

#include <math.h>
#include <stdlib.h>

NN_INLINE void attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                                  const float *v, const nn_key_ranges *ranges, int Tq, int Tk, int n_heads,
                                  int n_kv_heads, int hd, float scale, int keys_t)
{
    int group = n_heads / n_kv_heads, kv_stride = n_kv_heads * hd;
    double *p = malloc(sizeof(double) * (size_t)(Tk > 0 ? Tk : 1));
    double *dp = malloc(sizeof(double) * (size_t)(Tk > 0 ? Tk : 1));
    if (!p || !dp)
        abort(); /* reference code: allocation failure is not recoverable here */
    /* the AVX copy: keys and values per kv head as [hd, Tk] (nn_scores_t), when worth it */
    double *kt = NULL, *vt = NULL;
    long kt_n = (long)n_kv_heads * hd * Tk;
    if (keys_t && (long)Tq * group >= NN_KEYS_T_MIN_QUERIES && kt_n > 0 &&
        kt_n * (long)sizeof(double) <= NN_KEYS_T_MAX_BYTES) {
        kt = malloc(sizeof(double) * (size_t)kt_n), vt = malloc(sizeof(double) * (size_t)kt_n);
        if (!kt || !vt)
            abort();
        for (int kh = 0; kh < n_kv_heads; kh++) {
            nn_keys_t(kt + (long)kh * hd * Tk, k + (long)kh * hd, Tk, kv_stride, hd);
            nn_keys_t(vt + (long)kh * hd * Tk, v + (long)kh * hd, Tk, kv_stride, hd);
        }
    }
    for (int t = 0; t < Tq; t++) {
        int lo[2], hi[2];
        int ns = nn_key_spans(&ranges[t], Tk, lo, hi);
        if (ns == 0)
            continue;
        for (int h = 0; h < n_heads; h++) {
            int kh = h / group;
            const float *qh = q + ((long)t * n_heads + h) * hd;
            const float *gh = dout + ((long)t * n_heads + h) * hd;
            double mx = -INFINITY;
            for (int s = 0; s < ns; s++) {
                if (kt)
                    nn_scores_t(p, qh, kt + (long)kh * hd * Tk, Tk, lo[s], hi[s], hd, scale);
                else
                    nn_scores(p, qh, k + (long)kh * hd, lo[s], hi[s], kv_stride, hd, scale);
                for (int j = lo[s]; j < hi[s]; j++)
                    if (p[j] > mx)
                        mx = p[j];
            }
            double den = 0;
            for (int s = 0; s < ns; s++)
                for (int j = lo[s]; j < hi[s]; j++) {
                    if (p[j] == -INFINITY) {
                        p[j] = 0;
                        continue;
                    }
                    p[j] = exp(p[j] - mx);
                    den += p[j];
                }
            /* dp_j = dout . v_j (for every allowed key: a key with p_j = 0 is skipped below) */
            for (int s = 0; s < ns; s++) {
                if (vt)
                    nn_scores_t(dp, gh, vt + (long)kh * hd * Tk, Tk, lo[s], hi[s], hd, 1.0);
                else
                    nn_scores(dp, gh, v + (long)kh * hd, lo[s], hi[s], kv_stride, hd, 1.0);
            }
            double pdp = 0; /* sum_j p_j dp_j */
            for (int s = 0; s < ns; s++)
                for (int j = lo[s]; j < hi[s]; j++) {
                    if (p[j] == 0)
                        continue;
                    p[j] /= den;
                    pdp += p[j] * dp[j];
                }
            float *dqh = dq ? dq + ((long)t * n_heads + h) * hd : NULL;
            for (int s = 0; s < ns; s++)
                for (int j = lo[s]; j < hi[s]; j++) {
                    if (p[j] == 0)
                        continue;
                    double ds = p[j] * (dp[j] - pdp) * scale;
                    long off = (long)j * kv_stride + (long)kh * hd;
                    if (dv) {
                        for (int d = 0; d < hd; d++)
                            dv[off + d] += (float)(p[j] * gh[d]);
                    }
                    if (dqh) {
                        for (int d = 0; d < hd; d++)
                            dqh[d] += (float)(ds * k[off + d]);
                    }
                    if (dk) {
                        for (int d = 0; d < hd; d++)
                            dk[off + d] += (float)(ds * qh[d]);
                    }
                }
        }
    }
    free(p);
    free(dp);
    free(kt);
    free(vt);
}

static void attention_backward_base(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                                    const float *v, const nn_key_ranges *ranges, int Tq, int Tk, int n_heads,
                                    int n_kv_heads, int hd, float scale)
{
    attention_backward(dq, dk, dv, dout, q, k, v, ranges, Tq, Tk, n_heads, n_kv_heads, hd, scale, 0);
}

#if NN_HAVE_AVX
NN_AVX static void attention_backward_avx(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                          const float *k, const float *v, const nn_key_ranges *ranges, int Tq, int Tk,
                                          int n_heads, int n_kv_heads, int hd, float scale)
{
    attention_backward(dq, dk, dv, dout, q, k, v, ranges, Tq, Tk, n_heads, n_kv_heads, hd, scale, 1);
}
#endif

void nn_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                           const float *v, const nn_key_ranges *ranges, int Tq, int Tk, int n_heads, int n_kv_heads,
                           int hd, float scale)
{
#if NN_HAVE_AVX
    if (nn_isa() >= NN_ISA_AVX) {
        attention_backward_avx(dq, dk, dv, dout, q, k, v, ranges, Tq, Tk, n_heads, n_kv_heads, hd, scale);
        return;
    }
#endif
    attention_backward_base(dq, dk, dv, dout, q, k, v, ranges, Tq, Tk, n_heads, n_kv_heads, hd, scale);
}
