/* nn_cuda_internal.cuh: what the nnc_ kernel files share and nobody else needs: the bf16
 * type casts, the launch check (every launch is followed by cudaGetLastError; a failure
 * is recorded for nn_last_error_cuda and returned as -EIO) and small device helpers. */
#ifndef DF_NN_CUDA_INTERNAL_CUH
#define DF_NN_CUDA_INTERNAL_CUH

#include "nn/nn_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <errno.h>

typedef __nv_bfloat16 bf16;

/* Record err (with the call site) for nn_last_error_cuda; returns -EIO. */
int nn_record_error_cuda(cudaError_t err, const char *what, const char *file, int line);

/* After a launch: 0, or -EIO with the error recorded. */
#define NN_CUDA_LAUNCHED(what)                                                    \
    do {                                                                      \
        cudaError_t e_ = cudaGetLastError();                                  \
        if (e_ != cudaSuccess)                                                \
            return nn_record_error_cuda(e_, what, __FILE__, __LINE__);            \
    } while (0)

static inline const bf16 *as_bf(const nn_bf16_cuda *p) { return reinterpret_cast<const bf16 *>(p); }
static inline bf16 *as_bf(nn_bf16_cuda *p) { return reinterpret_cast<bf16 *>(p); }

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the total.
 * Uses 33 floats of shared memory; safe to call repeatedly. */
__device__ __forceinline__ float block_sum(float v)
{
    __shared__ float part[33];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* part[] may still be read by a previous call */
    if (lane == 0)
        part[wid] = v;
    __syncthreads();
    float t = lane < nw ? part[lane] : 0.0f;
    t = warp_sum(t);
    return t;
}

#endif
