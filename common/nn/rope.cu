/* rope.cu: per-head q/k RMSNorm (Qwen3; skipped for Llama) and the HF rotary embedding,
 * fused and in place on the fused QKV GEMM output, so q and k make one round trip
 * through memory between the GEMM and the attention. Numerics of nn_rmsnorm + nn_rope:
 * fp32 throughout, the angle pos * inv_freq in fp32, full-range sincosf. */
#include "nn/nn_cuda_device.cuh"

#define ROPE_MAX_PAIRS 4   /* hd <= 256: at most 128 pairs, 4 per lane */
#define ROPE_LANE_PAIRS 16 /* qk_norm_rope_kernel: pairs a lane holds at once (heads a warp: 16 / P) */
#define ROPE_WARPS 4       /* qk_norm_rope_kernel: warps a block */

/* The reference the fast kernel must match bit for bit; used by gpu_test_nn only (through
 * nn_qk_norm_rope_ref_cuda). It is the kernel nn_qk_norm_rope_cuda ran before (its arithmetic
 * now through the rope_* helpers of nn_cuda_device.cuh, as every q/k kernel's).
 * One warp per (token, head) over the H query and KV key heads; lane handles the pairs
 * (i, i + hd/2) for i = lane, lane + 32, ... */
__global__ void qk_norm_rope_ref_kernel(bf16 *__restrict__ qkv, const float *__restrict__ q_norm,
                                        const float *__restrict__ k_norm, const float *__restrict__ inv_freq,
                                        const int32_t *__restrict__ pos, int T, int H, int KV, int hd, float eps)
{
    int warps = blockDim.x >> 5, lane = threadIdx.x & 31;
    long item = (long)blockIdx.x * warps + (threadIdx.x >> 5);
    int nh = H + KV;
    if (item >= (long)T * nh)
        return;
    int t = (int)(item / nh), h = (int)(item - (long)t * nh);
    bf16 *x = qkv + (size_t)t * (H + 2 * KV) * hd + (size_t)h * hd;
    const float *nw = h < H ? q_norm : k_norm;
    int half = hd / 2;
    float a[ROPE_MAX_PAIRS], b[ROPE_MAX_PAIRS];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < ROPE_MAX_PAIRS; k++) {
        int i = lane + 32 * k;
        a[k] = b[k] = 0.0f;
        if (i < half) {
            a[k] = bf2f(x[i]);
            b[k] = bf2f(x[i + half]);
            ss = rope_ss(ss, a[k], b[k]);
        }
    }
    float r = 1.0f;
    if (nw)
        r = rope_rscale(warp_sum(ss), hd, eps);
    float p = (float)pos[t];
#pragma unroll
    for (int k = 0; k < ROPE_MAX_PAIRS; k++) {
        int i = lane + 32 * k;
        if (i < half) {
            float u = a[k], v = b[k];
            if (nw) {
                u = u * r * nw[i];
                v = v * r * nw[i + half];
            }
            float sn, cs;
            sincosf(p * inv_freq[i], &sn, &cs);
            x[i] = f2bf(rope_lo(u, v, cs, sn));
            x[i + half] = f2bf(rope_hi(u, v, cs, sn));
        }
    }
}

/* One warp per (token t, group of G = ROPE_LANE_PAIRS / P consecutive q/k heads of t, the
 * last group of a token cut at H + KV), P = ceil(hd / 64) pairs per lane; in every head of
 * the group lane handles the pairs (i, i + hd/2), i = lane + 32k (k < P), as
 * qk_norm_rope_ref_kernel does, with its arithmetic: the same sum of squares per lane (k
 * order), the same warp_sum, the same rope_* helpers (every rounding explicit: no contraction
 * left to the compiler), so the same bits. The loads of
 * all G heads (up to 2 KB a warp) go out before any arithmetic; the sincosf of the angle
 * (which depends on t and i only) and the norm weights are done once per warp, not once per
 * head. HD: hd known at compile time (constant offsets: fewer registers), 0: hd as given. */
template <int P, int HD>
__global__ void __launch_bounds__(ROPE_WARPS * 32)
    qk_norm_rope_kernel(bf16 *__restrict__ qkv, const float *__restrict__ q_norm, const float *__restrict__ k_norm,
                        const float *__restrict__ inv_freq, const int32_t *__restrict__ pos, int T, int H, int KV,
                        int hd_arg, float eps)
{
    constexpr int G = ROPE_LANE_PAIRS / P;
    const int hd = HD ? HD : hd_arg, half = hd / 2;
    int lane = threadIdx.x & 31, nh = H + KV, groups = (nh + G - 1) / G;
    long item = (long)blockIdx.x * ROPE_WARPS + (threadIdx.x >> 5);
    if (item >= (long)T * groups)
        return;
    int t = (int)(item / groups), h0 = (int)(item - (long)t * groups) * G;
    bf16 *x = qkv + (size_t)t * (H + 2 * KV) * hd + (size_t)h0 * hd;
    float a[G][P], b[G][P];
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int k = 0; k < P; k++) {
            int i = lane + 32 * k;
            a[g][k] = b[g][k] = 0.0f;
            if (h0 + g < nh && i < half) {
                a[g][k] = bf2f(x[g * hd + i]);
                b[g][k] = bf2f(x[g * hd + i + half]);
            }
        }
    /* while those are on their way: this lane's angles and norm weights */
    float p = (float)pos[t], cs[P], sn[P], qa[P], qb[P], ka[P], kb[P];
#pragma unroll
    for (int k = 0; k < P; k++) {
        int i = lane + 32 * k;
        cs[k] = sn[k] = qa[k] = qb[k] = ka[k] = kb[k] = 0.0f;
        if (i < half) {
            sincosf(p * inv_freq[i], &sn[k], &cs[k]);
            if (q_norm) {
                qa[k] = q_norm[i], qb[k] = q_norm[i + half];
                ka[k] = k_norm[i], kb[k] = k_norm[i + half];
            }
        }
    }
    /* the G heads' sums side by side (their shuffles interleave), then their scales */
    float r[G];
    if (q_norm) {
#pragma unroll
        for (int g = 0; g < G; g++) {
            float ss = 0.0f;
#pragma unroll
            for (int k = 0; k < P; k++)
                if (lane + 32 * k < half)
                    ss = rope_ss(ss, a[g][k], b[g][k]);
            r[g] = warp_sum(ss);
        }
#pragma unroll
        for (int g = 0; g < G; g++)
            r[g] = rope_rscale(r[g], hd_arg, eps);
    }
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (h0 + g >= nh)
            break;
        bool q = h0 + g < H;
        bf16 *xg = x + g * hd;
#pragma unroll
        for (int k = 0; k < P; k++) {
            int i = lane + 32 * k;
            if (i < half) {
                float u = a[g][k], v = b[g][k];
                if (q_norm) {
                    u = u * r[g] * (q ? qa[k] : ka[k]);
                    v = v * r[g] * (q ? qb[k] : kb[k]);
                }
                xg[i] = f2bf(rope_lo(u, v, cs[k], sn[k]));
                xg[i + half] = f2bf(rope_hi(u, v, cs[k], sn[k]));
            }
        }
    }
}

template <int P, int HD>
static void qk_norm_rope_launch(bf16 *qkv, const float *q_norm, const float *k_norm, const float *inv_freq,
                                const int32_t *pos, int T, int H, int KV, int hd, float eps, cudaStream_t s)
{
    const int G = ROPE_LANE_PAIRS / P;
    long items = (long)T * ((H + KV + G - 1) / G);
    qk_norm_rope_kernel<P, HD><<<(unsigned)((items + ROPE_WARPS - 1) / ROPE_WARPS), ROPE_WARPS * 32, 0, s>>>(
        qkv, q_norm, k_norm, inv_freq, pos, T, H, KV, hd, eps);
}

/* the argument checks of both entries; fn names the entry in the message */
static int qk_norm_rope_args(const char *fn, const float *q_norm, const float *k_norm, int T, int H, int KV, int hd,
                             char *err, size_t errlen)
{
    if (T < 0 || H <= 0 || KV <= 0 || hd <= 0 || hd % 2 || hd > 256 || (!q_norm) != (!k_norm))
        return df_err(err, errlen, -EINVAL, "%s: T %d, H %d, KV %d, hd %d (even, <= 256), q_norm/k_norm %s", fn, T, H,
                      KV, hd, (!q_norm) != (!k_norm) ? "not both given or both NULL" : "ok");
    return 0;
}

int nn_qk_norm_rope_cuda(nn_bf16_cuda *qkv, const float *q_norm, const float *k_norm, const float *inv_freq,
                         const int32_t *pos, int T, int H, int KV, int hd, float eps, cudaStream_t s, char *err,
                         size_t errlen)
{
    int rc = qk_norm_rope_args("nn_qk_norm_rope_cuda", q_norm, k_norm, T, H, KV, hd, err, errlen);
    if (rc || T == 0)
        return rc;
    bf16 *x = as_bf(qkv);
    switch (hd) { /* the usual head sizes with hd a constant, the rest by pairs per lane */
    case 64: qk_norm_rope_launch<1, 64>(x, q_norm, k_norm, inv_freq, pos, T, H, KV, hd, eps, s); break;
    case 128: qk_norm_rope_launch<2, 128>(x, q_norm, k_norm, inv_freq, pos, T, H, KV, hd, eps, s); break;
    case 256: qk_norm_rope_launch<4, 256>(x, q_norm, k_norm, inv_freq, pos, T, H, KV, hd, eps, s); break;
    default:
        switch ((hd / 2 + 31) / 32) {
        case 1: qk_norm_rope_launch<1, 0>(x, q_norm, k_norm, inv_freq, pos, T, H, KV, hd, eps, s); break;
        case 2: qk_norm_rope_launch<2, 0>(x, q_norm, k_norm, inv_freq, pos, T, H, KV, hd, eps, s); break;
        case 3: qk_norm_rope_launch<3, 0>(x, q_norm, k_norm, inv_freq, pos, T, H, KV, hd, eps, s); break;
        default: qk_norm_rope_launch<4, 0>(x, q_norm, k_norm, inv_freq, pos, T, H, KV, hd, eps, s); break;
        }
    }
    CUDA_LAUNCHED("qk_norm_rope_kernel", err, errlen);
    return 0;
}

int nn_qk_norm_rope_ref_cuda(nn_bf16_cuda *qkv, const float *q_norm, const float *k_norm, const float *inv_freq,
                             const int32_t *pos, int T, int H, int KV, int hd, float eps, cudaStream_t s, char *err,
                             size_t errlen)
{
    int rc = qk_norm_rope_args("nn_qk_norm_rope_ref_cuda", q_norm, k_norm, T, H, KV, hd, err, errlen);
    if (rc || T == 0)
        return rc;
    long items = (long)T * (H + KV);
    int warps = 8;
    qk_norm_rope_ref_kernel<<<(unsigned)((items + warps - 1) / warps), warps * 32, 0, s>>>(
        as_bf(qkv), q_norm, k_norm, inv_freq, pos, T, H, KV, hd, eps);
    CUDA_LAUNCHED("qk_norm_rope_ref_kernel", err, errlen);
    return 0;
}
