/* swiglu.cu: silu(gate) * up straight from the fused gate/up GEMM output [T, 2I] (gate
 * in the first I columns, up in the last I), written as the down projection's bf16 input.
 * fp32 math, one rounding (nn_swiglu on the same inputs). */
#include "nn/nn_cuda_device.cuh"

__device__ __forceinline__ float silu_mul(float g, float u)
{
    return g / (1.0f + __expf(-g)) * u;
}

/* 8 outputs per thread with 16-byte loads/stores (I % 8 == 0). */
__global__ void swiglu8_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ gu, int T, int I)
{
    pdl_launch_dependents(); /* the down projection after us may fetch its weights now */
    size_t n8 = (size_t)T * (I / 8);
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n8; j += (size_t)gridDim.x * blockDim.x) {
        size_t t = j / (I / 8);
        int i = (int)(j - t * (I / 8)) * 8;
        const bf16 *row = gu + t * 2 * (size_t)I;
        float g[8], u[8], o[8];
        load_bf16x8(g, row + i);
        load_bf16x8(u, row + I + i);
#pragma unroll
        for (int k = 0; k < 8; k++)
            o[k] = silu_mul(g[k], u[k]);
        store_bf16x8(out + t * (size_t)I + i, o);
    }
}

__global__ void swiglu1_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ gu, int T, int I)
{
    pdl_launch_dependents();
    size_t n = (size_t)T * I;
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n; j += (size_t)gridDim.x * blockDim.x) {
        size_t t = j / I;
        int i = (int)(j - t * I);
        const bf16 *row = gu + t * 2 * (size_t)I;
        out[j] = f2bf(silu_mul(bf2f(row[i]), bf2f(row[I + i])));
    }
}

int nn_swiglu_cuda(nn_bf16_cuda *out, const nn_bf16_cuda *gu, int T, int I, cudaStream_t s, char *err, size_t errlen)
{
    if (T < 0 || I <= 0)
        return df_err(err, errlen, -EINVAL, "nn_swiglu_cuda: T %d, I %d", T, I);
    if (T == 0)
        return 0;
    size_t work = (size_t)T * I / (I % 8 == 0 ? 8 : 1);
    size_t blocks = (work + 255) / 256;
    unsigned nb = (unsigned)(blocks > 8192 ? 8192 : blocks);
    if (I % 8 == 0)
        swiglu8_kernel<<<nb, 256, 0, s>>>(as_bf(out), as_bf(gu), T, I);
    else
        swiglu1_kernel<<<nb, 256, 0, s>>>(as_bf(out), as_bf(gu), T, I);
    CUDA_LAUNCHED("swiglu_kernel", err, errlen);
    return 0;
}
