/* dflash_adamw_cuda.cu: AdamW over the drafter's flat fp32 parameter array on the GPU (see
 * dflash_adamw_cuda.h). Memory-bound: a step reads the gradients twice (norm, update) and
 * p, m, v once, writes p, m, v and the bf16 mirror once; the kernels keep enough bytes in
 * flight to run near the device's copy bandwidth:
 *   - norm: each thread issues the loads of 8 grid-strided elements before it adds any of
 *     them (same elements, same order of additions as one load at a time);
 *   - update: each thread loads 8 consecutive elements of each array with 16-byte loads and
 *     writes them back with 16-byte stores; the per-element arithmetic is adamw_elem, the
 *     operations and roundings of the scalar kernel it replaced, pinned with the _rn
 *     intrinsics, so the result is bit for bit the same (tests/gpu_test_adamw.c checks every
 *     element against the same sequence computed on the host).
 */
#include "dflash/dflash_adamw_cuda.h"

#include "nn/nn_cuda_device.cuh"

#include <errno.h>
#include <math.h>
#include <stdio.h>

#define NORM_THREADS 256
#define NORM_UNROLL 8
#define UPD_THREADS 256
#define UPD_ELEMS 8 /* per thread: two float4 of each array */

__global__ void __launch_bounds__(NORM_THREADS) k_adamw_sqnorm(double *part, const float *__restrict__ g, long n)
{
    __shared__ double shd[32];
    double s = 0;
    long stride = (long)gridDim.x * blockDim.x, i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    for (; i + (NORM_UNROLL - 1) * stride < n; i += NORM_UNROLL * stride) {
        float x[NORM_UNROLL];
#pragma unroll
        for (int k = 0; k < NORM_UNROLL; k++)
            x[k] = __ldcs(g + i + k * stride);
#pragma unroll
        for (int k = 0; k < NORM_UNROLL; k++)
            s += (double)x[k] * x[k];
    }
    for (; i < n; i += stride) {
        float x = g[i];
        s += (double)x * x;
    }
    s = block_sum<double>(s, shd);
    if (threadIdx.x == 0)
        part[blockIdx.x] = s;
}

__global__ void __launch_bounds__(ADAMW_NORM_PARTS_CUDA)
    k_adamw_plan(adamw_state_cuda *os, const double *part, double lr_peak, double min_lr, long long warm,
                 long long total, double clip, double b1, double b2, double wd)
{
    __shared__ double shd[32];
    double s = block_sum<double>(part[threadIdx.x], shd);
    if (threadIdx.x != 0)
        return;
    double norm = sqrt(s);
    long long step = os->step;
    double lr;
    if (step < warm) {
        lr = lr_peak * (double)(step + 1) / (double)warm;
    } else {
        long long span = total - warm;
        double t = span > 0 ? (double)(step - warm) / (double)span : 1.0;
        if (t > 1)
            t = 1;
        lr = min_lr + (lr_peak - min_lr) * 0.5 * (1.0 + cos(M_PI * t));
    }
    os->norm = norm;
    os->lr = lr;
    os->clip_scale = 1.0;
    os->do_clip = 0;
    os->gscale = 1.0f;
    if (!isfinite(norm)) {
        os->skip = 1;
        return;
    }
    os->skip = 0;
    if (clip > 0 && norm > clip) {
        os->clip_scale = clip / (norm + 1e-6);
        os->gscale = (float)os->clip_scale;
        os->do_clip = 1;
    }
    long long t = step + 1;
    double bc1 = 1.0 - pow(b1, (double)t), bc2 = 1.0 - pow(b2, (double)t);
    os->wd_factor = (float)(1.0 - lr * wd);
    os->step_size = (float)(lr / bc1);
    os->inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    os->step = t;
}

typedef struct upd_args {
    int clip, use_wd;
    float gs, wdf, ss, ib, b1, b2, omb1, omb2, eps;
} upd_args;

/* The update of one element, every operation rounded on its own in this order (fma: one
 * rounding); tests/gpu_test_adamw.c spells out the same sequence on the host:
 *   g = g*gs (clip); p = p*wdf (decay); m = fma(b1, m, (1-b1)*g);
 *   v = fma(b2, v, g*((1-b2)*g)); p = p - (ss*m) / fma(sqrt(v), ib, eps)
 * It is what the scalar kernel this file replaced computed (its machine code, checked,
 * fused nothing beyond these fmas). Written with the _rn intrinsics: plain expressions let
 * the compiler pick which product to fuse, and it picked differently once the loop was
 * vectorised (different bits). */
__device__ __forceinline__ void adamw_elem(float &p, float &m, float &v, float g, int decay, const upd_args &a)
{
    if (a.clip)
        g = __fmul_rn(g, a.gs);
    if (decay)
        p = __fmul_rn(p, a.wdf);
    m = __fmaf_rn(a.b1, m, __fmul_rn(a.omb1, g));
    v = __fmaf_rn(a.b2, v, __fmul_rn(g, __fmul_rn(a.omb2, g)));
    p = __fsub_rn(p, __fdiv_rn(__fmul_rn(a.ss, m), __fmaf_rn(__fsqrt_rn(v), a.ib, a.eps)));
}

/* Whether element i (inside the array) is decayed: the tensor holding it, by bisection
 * over the offsets (only when weight decay is on). */
__device__ __forceinline__ int adamw_decays(const adamw_tensor_cuda *tens, int ntensor, long long i)
{
    int lo = 0, hi = ntensor - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (tens[mid].off <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return !tens[lo].is_norm;
}

__global__ void __launch_bounds__(UPD_THREADS)
    k_adamw_update(float *__restrict__ P, bf16 *__restrict__ Wb, float *__restrict__ M, float *__restrict__ Vv,
                   const float *__restrict__ Gr, long long n, const adamw_tensor_cuda *__restrict__ tens, int ntensor,
                   const adamw_state_cuda *__restrict__ os, float b1, float b2, float eps, int use_wd)
{
    if (os->skip)
        return;
    upd_args a;
    a.clip = os->do_clip, a.use_wd = use_wd;
    a.gs = os->gscale, a.wdf = os->wd_factor, a.ss = os->step_size, a.ib = os->inv_sqrt_bc2;
    a.b1 = b1, a.b2 = b2, a.omb1 = __fsub_rn(1.0f, b1), a.omb2 = __fsub_rn(1.0f, b2), a.eps = eps;
    long long i0 = (blockIdx.x * (long long)blockDim.x + threadIdx.x) * UPD_ELEMS;
    if (i0 >= n)
        return;
    int decay = use_wd ? adamw_decays(tens, ntensor, i0) : 0;
    if (i0 + UPD_ELEMS <= n) {
        const float4 *g4 = reinterpret_cast<const float4 *>(Gr + i0);
        float4 *p4 = reinterpret_cast<float4 *>(P + i0), *m4 = reinterpret_cast<float4 *>(M + i0),
               *v4 = reinterpret_cast<float4 *>(Vv + i0);
        float4 g[2], p[2], m[2], v[2];
        /* every load before any arithmetic: 128 bytes in flight per thread */
        g[0] = __ldcs(g4), g[1] = __ldcs(g4 + 1);
        p[0] = __ldcs(p4), p[1] = __ldcs(p4 + 1);
        m[0] = __ldcs(m4), m[1] = __ldcs(m4 + 1);
        v[0] = __ldcs(v4), v[1] = __ldcs(v4 + 1);
        float *gf = reinterpret_cast<float *>(g), *pf = reinterpret_cast<float *>(p),
              *mf = reinterpret_cast<float *>(m), *vf = reinterpret_cast<float *>(v);
        uint4 wb;
        bf16 *wbh = reinterpret_cast<bf16 *>(&wb);
#pragma unroll
        for (int k = 0; k < UPD_ELEMS; k++) {
            adamw_elem(pf[k], mf[k], vf[k], gf[k], decay, a);
            wbh[k] = f2bf(pf[k]);
        }
        __stcs(p4, p[0]), __stcs(p4 + 1, p[1]);
        __stcs(m4, m[0]), __stcs(m4 + 1, m[1]);
        __stcs(v4, v[0]), __stcs(v4 + 1, v[1]);
        __stcs(reinterpret_cast<uint4 *>(Wb + i0), wb);
        return;
    }
    for (long long i = i0; i < n; i++) { /* the array's last n % 8 elements */
        float p = P[i], m = M[i], v = Vv[i];
        adamw_elem(p, m, v, Gr[i], decay, a);
        M[i] = m;
        Vv[i] = v;
        P[i] = p;
        Wb[i] = f2bf(p);
    }
}

int adamw_step_cuda(const adamw_buffers_cuda *b, const adamw_config *c, long warm, cudaStream_t st, char *err,
                    size_t errlen)
{
    const void *arr[] = {b->p, b->m, b->v, b->g, b->mirror};
    for (size_t k = 0; k < sizeof arr / sizeof arr[0]; k++)
        if ((uintptr_t)arr[k] % 16)
            return df_err(err, errlen, -EINVAL,
                          "adamw_step_cuda: array %zu (p, m, v, g, mirror) at %p is not "
                          "16-byte aligned",
                          k, arr[k]);
    if (b->ntensor < 1)
        return df_err(err, errlen, -EINVAL, "adamw_step_cuda: no tensors");
    k_adamw_sqnorm<<<ADAMW_NORM_PARTS_CUDA, NORM_THREADS, 0, st>>>(b->norm_part, b->g, (long)b->n);
    CUDA_LAUNCHED("k_adamw_sqnorm", err, errlen);
    k_adamw_plan<<<1, ADAMW_NORM_PARTS_CUDA, 0, st>>>(b->state, b->norm_part, c->lr, c->min_lr, warm, c->total_steps,
                                                      c->clip_norm, c->beta1, c->beta2, c->weight_decay);
    CUDA_LAUNCHED("k_adamw_plan", err, errlen);
    long long groups = ((long long)b->n + UPD_ELEMS - 1) / UPD_ELEMS;
    unsigned blocks = (unsigned)((groups + UPD_THREADS - 1) / UPD_THREADS);
    if (blocks > 0) {
        k_adamw_update<<<blocks, UPD_THREADS, 0, st>>>(b->p, (bf16 *)b->mirror, b->m, b->v, b->g, (long long)b->n,
                                                       b->tensors, b->ntensor, b->state, (float)c->beta1,
                                                       (float)c->beta2, (float)c->eps, c->weight_decay > 0);
        CUDA_LAUNCHED("k_adamw_update", err, errlen);
    }
    return 0;
}
