/* embed.cu: the start of a forward: the embedding gather (bf16 table -> fp32 residual
 * stream), the per-token positions of a packed row, plus device-side random fills (the
 * bench makes 8B-parameter random models without moving them over PCIe). */
#include "nn/nn_cuda_device.cuh"

/* One block per token, 8 bf16 (16 bytes) per load when d allows. */
__global__ void embed_kernel(float *__restrict__ x, const bf16 *__restrict__ table, const int32_t *__restrict__ tok,
                             int d, int V, int *bad)
{
    int t = blockIdx.x;
    int id = tok[t];
    float *xr = x + (size_t)t * d;
    if (id < 0 || id >= V) {
        for (int i = threadIdx.x; i < d; i += blockDim.x)
            xr[i] = 0.0f;
        if (bad && threadIdx.x == 0)
            *bad = 1;
        return;
    }
    const bf16 *row = table + (size_t)id * d;
    if ((d & 7) == 0) {
        for (int i = threadIdx.x * 8; i < d; i += blockDim.x * 8) {
            float f[8];
            load_bf16x8(f, row + i);
            *reinterpret_cast<float4 *>(xr + i) = make_float4(f[0], f[1], f[2], f[3]);
            *reinterpret_cast<float4 *>(xr + i + 4) = make_float4(f[4], f[5], f[6], f[7]);
        }
    } else {
        for (int i = threadIdx.x; i < d; i += blockDim.x)
            xr[i] = bf2f(row[i]);
    }
}

int nn_embed_cuda(float *x, const nn_bf16_cuda *table, const int32_t *tokens, int T, int d, int V, int *bad_token,
                  cudaStream_t s, char *err, size_t errlen)
{
    if (T < 0 || d <= 0 || V <= 0)
        return df_err(err, errlen, -EINVAL, "nn_embed_cuda: T %d, d %d, V %d", T, d, V);
    if (T == 0)
        return 0;
    embed_kernel<<<T, 128, 0, s>>>(x, as_bf(table), tokens, d, V, bad_token);
    CUDA_LAUNCHED("embed_kernel", err, errlen);
    return 0;
}

/* Binary search for the document of t: the last d with starts[d] <= t. */
__global__ void positions_kernel(int32_t *pos, const int32_t *__restrict__ starts, int n_docs, int T)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T)
        return;
    int lo = 0, hi = n_docs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (starts[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    int p = t - starts[lo];
    /* malformed starts must not send the attention outside [0, t] */
    pos[t] = p < 0 ? 0 : (p > t ? t : p);
}

int nn_positions_cuda(int32_t *pos, const int32_t *doc_starts, int n_docs, int T, cudaStream_t s, char *err,
                      size_t errlen)
{
    if (n_docs < 1 || T < 0)
        return df_err(err, errlen, -EINVAL, "nn_positions_cuda: n_docs %d, T %d", n_docs, T);
    if (T == 0)
        return 0;
    positions_kernel<<<(T + 255) / 256, 256, 0, s>>>(pos, doc_starts, n_docs, T);
    CUDA_LAUNCHED("positions_kernel", err, errlen);
    return 0;
}

__device__ __forceinline__ float hash_uniform(uint64_t seed, uint64_t i) /* [-1, 1) */
{
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + i * 0xD1B54A32D192ED03ull + 0x632BE59BD9B4E019ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

__global__ void fill_bf16_kernel(bf16 *p, size_t n, uint64_t seed, float scale)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = f2bf(hash_uniform(seed, i) * scale);
}

__global__ void fill_f32_kernel(float *p, size_t n, uint64_t seed, float center, float scale)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = center + hash_uniform(seed, i) * scale;
}

static unsigned fill_blocks(size_t n)
{
    size_t b = (n + 255) / 256;
    return (unsigned)(b > 65536 ? 65536 : (b ? b : 1));
}

int nn_fill_uniform_bf16_cuda(nn_bf16_cuda *p, size_t n, uint64_t seed, float scale, cudaStream_t s, char *err,
                              size_t errlen)
{
    if (n == 0)
        return 0;
    fill_bf16_kernel<<<fill_blocks(n), 256, 0, s>>>(as_bf(p), n, seed, scale);
    CUDA_LAUNCHED("fill_bf16_kernel", err, errlen);
    return 0;
}

int nn_fill_uniform_f32_cuda(float *p, size_t n, uint64_t seed, float center, float scale, cudaStream_t s, char *err,
                             size_t errlen)
{
    if (n == 0)
        return 0;
    fill_f32_kernel<<<fill_blocks(n), 256, 0, s>>>(p, n, seed, center, scale);
    CUDA_LAUNCHED("fill_f32_kernel", err, errlen);
    return 0;
}
