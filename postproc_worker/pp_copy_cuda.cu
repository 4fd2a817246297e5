/* pp_copy_cuda.cu: the CUDA side of pp_copy.h (pp_ops_cuda): device (or peer) copy of bf16
 * features between two ring slots, then the Gaussian noise in place. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "postproc_worker/pp_copy_internal.h"
}
#include "util.h" /* df_err (C linkage) */

static int open_cuda(pp_copier **out, int device, char *err, size_t errlen);
static void close_cuda(pp_copier *c);
static int copy_cuda(pp_copier *c, const arena *dst, uint64_t dst_off, const arena *src, uint64_t src_off, size_t n,
                     double std, uint64_t seed, uint64_t batch_id, char *err, size_t errlen);

extern "C" const pp_ops pp_ops_cuda = {"cuda", open_cuda, close_cuda, copy_cuda};

typedef struct copier_cuda {
    pp_copier base;
    int device;
    cudaStream_t s;
} copier_cuda;

static __device__ __forceinline__ uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Element i gets std * N(0,1), from Box-Muller over two 24-bit uniforms of a counter hash
 * of (key, i / 2): the pair (2j, 2j+1) shares one draw (cos and sin). */
__global__ void k_add_noise(__nv_bfloat16 *x, size_t n, float std, uint64_t key)
{
    size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; /* pair index */
    size_t i = 2 * j;
    if (i >= n)
        return;
    uint64_t r = mix64(key ^ mix64(j));
    float u1 = ((float)(r >> 40) + 1.0f) * (1.0f / 16777217.0f); /* (0, 1] */
    float u2 = (float)((r >> 16) & 0xffffff) * (1.0f / 16777216.0f);
    float rad = sqrtf(-2.0f * logf(u1)) * std, s, c;
    sincospif(2.0f * u2, &s, &c);
    x[i] = __float2bfloat16(__bfloat162float(x[i]) + rad * c);
    if (i + 1 < n)
        x[i + 1] = __float2bfloat16(__bfloat162float(x[i + 1]) + rad * s);
}

static int open_cuda(pp_copier **out, int device, char *err, size_t errlen)
{
    *out = NULL;
    cudaError_t e = cudaSetDevice(device);
    copier_cuda *c = (copier_cuda *)calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&c->s, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "device %d: %s", device, cudaGetErrorString(e));
        free(c);
        return -EIO;
    }
    c->base.ops = &pp_ops_cuda;
    c->device = device;
    *out = &c->base;
    return 0;
}

static void close_cuda(pp_copier *cb)
{
    copier_cuda *c = (copier_cuda *)cb;
    if (c->s)
        cudaStreamDestroy(c->s);
    free(c);
}

static int copy_cuda(pp_copier *cb, const arena *dst, uint64_t dst_off, const arena *src, uint64_t src_off, size_t n,
                     double std, uint64_t seed, uint64_t batch_id, char *err, size_t errlen)
{
    copier_cuda *c = (copier_cuda *)cb;
    size_t bytes = n * sizeof(__nv_bfloat16);
    if (dst->kind != ARENA_CUDA || src->kind != ARENA_CUDA || src_off > src->size || bytes > src->size - src_off ||
        dst_off > dst->size || bytes > dst->size - dst_off)
        return df_err(err, errlen, -EINVAL, "batch %llu: %zu feature bytes: bad slots for a device copy",
                      (unsigned long long)batch_id, bytes);
    char *d = (char *)dst->base + dst_off;
    const char *s = (const char *)src->base + src_off;
    cudaError_t e = src->device == dst->device ? cudaMemcpyAsync(d, s, bytes, cudaMemcpyDeviceToDevice, c->s)
                                               : cudaMemcpyPeerAsync(d, dst->device, s, src->device, bytes, c->s);
    if (e == cudaSuccess && std > 0 && n > 0) {
        size_t pairs = (n + 1) / 2;
        unsigned blocks = (unsigned)((pairs + 255) / 256);
        uint64_t key = seed * 0x2545f4914f6cdd1dull ^ batch_id;
        k_add_noise<<<blocks, 256, 0, c->s>>>((__nv_bfloat16 *)d, n, (float)std, key);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(c->s);
    if (e != cudaSuccess)
        return df_err(err, errlen, -EIO, "batch %llu: feature copy device %d -> %d: %s", (unsigned long long)batch_id,
                      src->device, dst->device, cudaGetErrorString(e));
    return 0;
}
