/* rope.cu: per-head q/k RMSNorm (Qwen3; skipped for Llama) and the HF rotary embedding,
 * fused and in place on the fused QKV GEMM output, so q and k make one round trip
 * through memory between the GEMM and the attention. Numerics of nn_rmsnorm + nn_rope:
 * fp32 throughout, the angle pos * inv_freq in fp32, full-range sincosf. */
#include "nn/nn_cuda_device.cuh"

#define ROPE_MAX_PAIRS 4 /* hd <= 256: at most 128 pairs, 4 per lane */

/* One warp per (token, head) over the H query and KV key heads; lane handles the pairs
 * (i, i + hd/2) for i = lane, lane + 32, ... */
__global__ void qk_norm_rope_kernel(bf16 *__restrict__ qkv, const float *__restrict__ q_norm,
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
            ss += a[k] * a[k] + b[k] * b[k];
        }
    }
    float r = 1.0f;
    if (nw)
        r = rsqrtf(warp_sum(ss) / (float)hd + eps);
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
            x[i] = f2bf(u * cs - v * sn);
            x[i + half] = f2bf(v * cs + u * sn);
        }
    }
}

int nn_qk_norm_rope_cuda(nn_bf16_cuda *qkv, const float *q_norm, const float *k_norm, const float *inv_freq,
                         const int32_t *pos, int T, int H, int KV, int hd, float eps, cudaStream_t s, char *err,
                         size_t errlen)
{
    if (T < 0 || H <= 0 || KV <= 0 || hd <= 0 || hd % 2 || hd > 256 || (!q_norm) != (!k_norm))
        return df_cuda_errf(err, errlen, -EINVAL,
                            "nn_qk_norm_rope_cuda: T %d, H %d, KV %d, hd %d (even, <= 256), q_norm/k_norm %s", T, H, KV,
                            hd, (!q_norm) != (!k_norm) ? "not both given or both NULL" : "ok");
    if (T == 0)
        return 0;
    long items = (long)T * (H + KV);
    int warps = 8;
    qk_norm_rope_kernel<<<(unsigned)((items + warps - 1) / warps), warps * 32, 0, s>>>(
        as_bf(qkv), q_norm, k_norm, inv_freq, pos, T, H, KV, hd, eps);
    CUDA_LAUNCHED("qk_norm_rope_kernel", err, errlen);
    return 0;
}
