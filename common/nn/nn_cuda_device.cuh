/* nn_cuda_device.cuh: the device helpers every kernel of the tree shares, so that each
 * exists once: bf16 <-> fp32 casts and 16-byte vector loads/stores, and the warp, quad and
 * block reductions (sum, max, arg-max). Also the check of every call (cuda_check.h) and
 * the nn_bf16_cuda <-> bf16 pointer casts of the wrappers.
 *
 * Reduction orders are part of the results (the drafter step and the target forward are
 * bit-reproducible), so every function here has one fixed order, named by the function:
 *   warp_sum / warp_max      butterfly over the 32 lanes, xor offsets 16, 8, 4, 2, 1
 *   quad_sum / quad_max      butterfly over the 4 lanes of a quad, xor offsets 1, 2
 *   block_sum                warp butterfly, then warp 0's lanes butterfly the per-warp
 *                            results (lane i holds warp i's)
 *   block_sum_serial,        warp butterfly, then the per-warp results added (or maxed)
 *   block_max_serial         one after the other from warp 0 up, by every thread
 *   warp_argmax, block_argmax  butterfly / warp then block as block_sum, on (value, index):
 *                            the larger value wins, a tie goes to the smaller index
 * A kernel that needs a different order gets a new function here with its own name; it
 * never changes one of these.
 * Include from .cu files only (after the file's own header). */
#ifndef DF_NN_CUDA_DEVICE_CUH
#define DF_NN_CUDA_DEVICE_CUH

#include "nn/nn_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>

#include "cuda_check.h"

typedef __nv_bfloat16 bf16;

/* ---- cp.async (sm_80+): 16 bytes global -> shared without a register round trip ------
 * cp_async16(dst, src): a plain copy; cp_async16(dst, src, valid): valid = 0 zero-fills the
 * 16 bytes and reads nothing (src must still be a mapped address). Groups: commit after a
 * batch of copies, cp_async_wait<N>() until at most N groups are still in flight. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src)
{
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
}
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid)
{
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* ---- programmatic dependent launch (sm_90+; no-ops on older GPUs) --------------------
 * A kernel launched with the programmatic-serialisation attribute may start before the
 * kernel ahead of it in the stream has finished: it must call pdl_wait() before it reads
 * anything that kernel writes (or writes anything it may still read). pdl_launch_dependents()
 * lets such a follower start early; it is harmless where the follower is a plain launch. */
__device__ __forceinline__ void pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* ---- casts -------------------------------------------------------------------------- */

static inline const bf16 *as_bf(const nn_bf16_cuda *p)
{
    return reinterpret_cast<const bf16 *>(p);
}
static inline bf16 *as_bf(nn_bf16_cuda *p)
{
    return reinterpret_cast<bf16 *>(p);
}

/* exact (bf16 is the top half of an fp32) */
__device__ __forceinline__ float bf2f(bf16 v)
{
    return __bfloat162float(v);
}
/* round to nearest even (__float2bfloat16 and __float2bfloat16_rn are the same rounding) */
__device__ __forceinline__ bf16 f2bf(float v)
{
    return __float2bfloat16_rn(v);
}

/* 8 consecutive bf16 at p (16-byte aligned) as fp32, one 16-byte load. */
__device__ __forceinline__ void load_bf16x8(float f[8], const bf16 *p)
{
    uint4 u = *reinterpret_cast<const uint4 *>(p);
    const bf16 *b = reinterpret_cast<const bf16 *>(&u);
#pragma unroll
    for (int k = 0; k < 8; k++)
        f[k] = bf2f(b[k]);
}

/* f[8] rounded to bf16 at p (16-byte aligned), one 16-byte store. */
__device__ __forceinline__ void store_bf16x8(bf16 *p, const float f[8])
{
    uint4 u;
    bf16 *b = reinterpret_cast<bf16 *>(&u);
#pragma unroll
    for (int k = 0; k < 8; k++)
        b[k] = f2bf(f[k]);
    *reinterpret_cast<uint4 *>(p) = u;
}

/* ---- the q/k norm + RoPE arithmetic ------------------------------------------------------ */

/* Every kernel that normalises and rotates a q/k head (nn_qk_norm_rope_cuda, its reference,
 * the decode q/k kernels) does its arithmetic through these, with each rounding spelled
 * out: nvcc may contract a * b + c into one fma differently in different kernels (it did:
 * one bf16 in 25K differed between two kernels of the same source), and a constant head
 * size turns x / hd + eps into an fma. So the kernels agree bit for bit by construction. */
/* ss + a^2 + b^2: the sum of squares of one pair, added to a lane's partial */
__device__ __forceinline__ float rope_ss(float ss, float a, float b)
{
    return __fadd_rn(ss, __fadd_rn(__fmul_rn(a, a), __fmul_rn(b, b)));
}
/* 1 / rms from the head's sum of squares */
__device__ __forceinline__ float rope_rscale(float sum, int hd, float eps)
{
    return rsqrtf(__fadd_rn(__fdiv_rn(sum, (float)hd), eps));
}
/* the rotation of the pair (u, v) by the angle of (cs, sn) */
__device__ __forceinline__ float rope_lo(float u, float v, float cs, float sn)
{
    return __fsub_rn(__fmul_rn(u, cs), __fmul_rn(v, sn));
}
__device__ __forceinline__ float rope_hi(float u, float v, float cs, float sn)
{
    return __fadd_rn(__fmul_rn(v, cs), __fmul_rn(u, sn));
}

/* ---- warp and quad reductions ----------------------------------------------------------- */

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double warp_sum(double v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The 4 lanes of a quad (lane & ~3) that share an mma accumulator row. */
__device__ __forceinline__ float quad_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}

__device__ __forceinline__ float quad_max(float v)
{
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
    return v;
}

/* (v, i) of every lane -> the warp's: larger v wins, a tie goes to the smaller i. */
__device__ __forceinline__ void warp_argmax(float &v, int &i)
{
    for (int o = 16; o > 0; o >>= 1) {
        float v2 = __shfl_xor_sync(0xffffffffu, v, o);
        int i2 = __shfl_xor_sync(0xffffffffu, i, o);
        if (v2 > v || (v2 == v && i2 < i))
            v = v2, i = i2;
    }
}

/* ---- block reductions (blockDim.x a multiple of 32, <= 1024; every thread of the block
 * calls them and gets the result) ------------------------------------------------------ */

/* sh: __shared__, >= 32 elements. The leading sync lets a previous call's readers of sh
 * finish, so a kernel may call it repeatedly with the same sh. */
template <typename T> __device__ __forceinline__ T block_sum(T v, T *sh)
{
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0)
        sh[wid] = v;
    __syncthreads();
    T t = lane < nw ? sh[lane] : (T)0;
    return warp_sum(t);
}

/* part: __shared__, blockDim.x / 32 floats; same leading sync. */
__device__ __forceinline__ float block_sum_serial(float v, float *part)
{
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0)
        part[wid] = v;
    __syncthreads();
    float t = part[0];
    for (int i = 1; i < nw; i++)
        t += part[i];
    return t;
}

__device__ __forceinline__ float block_max_serial(float v, float *part)
{
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0)
        part[wid] = v;
    __syncthreads();
    float t = part[0];
    for (int i = 1; i < nw; i++)
        t = fmaxf(t, part[i]);
    return t;
}

/* shv, shi: __shared__, >= 32 elements each; one call per kernel (no leading sync).
 * Lanes past the last warp count as (-inf, INT_MAX). */
__device__ __forceinline__ void block_argmax(float &v, int &i, float *shv, int *shi)
{
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    warp_argmax(v, i);
    if (lane == 0)
        shv[wid] = v, shi[wid] = i;
    __syncthreads();
    v = lane < nw ? shv[lane] : -INFINITY;
    i = lane < nw ? shi[lane] : 0x7fffffff;
    warp_argmax(v, i);
}

#endif
