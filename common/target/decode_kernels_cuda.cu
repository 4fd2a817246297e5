/* decode_kernels_cuda.cu: the kernels of decode_kernels_cuda.h. Every result is a function
 * of its own row (query, output row) alone: the work split and summation order depend on
 * the shapes, never on how many rows a call has. Speed comes from the few rows of a decode
 * step reading each weight once (tensor cores, 16-byte loads) and from few launches. */
#include "target/decode_kernels_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>

#include "cuda_check.h"
#include "nn/nn_cuda_device.cuh" /* bf16, as_bf, warp_sum / warp_max, block_*_serial */

/* -EINVAL with a message naming the function and the shape. */
#define BAD_SHAPE(...)                          \
    do {                                        \
        if (err && errlen)                      \
            snprintf(err, errlen, __VA_ARGS__); \
        return -EINVAL;                         \
    } while (0)

/* -EIO naming the kernel and the launch error. */
#define BAD_LAUNCH(what, e)                                                       \
    do {                                                                          \
        if (err && errlen)                                                        \
            snprintf(err, errlen, "%s: launch: %s", what, cudaGetErrorString(e)); \
        return -EIO;                                                              \
    } while (0)

/* PDL needs compute capability 9.0 (else launches are plain). */
static int pdl_supported(void)
{
    static int ok = -1;
    if (ok < 0) {
        int dev = 0, major = 0;
        ok = cudaGetDevice(&dev) == cudaSuccess &&
             cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
        cudaGetLastError();
    }
    return ok;
}

/* The small kernels of a step (q/k + append, attention) launched as programmatic
 * dependents (decode_pdl_small_cuda). */
#ifndef DECODE_PDL_SMALL_DEFAULT
#define DECODE_PDL_SMALL_DEFAULT 1
#endif
static int g_pdl_small = DECODE_PDL_SMALL_DEFAULT;

int decode_pdl_small_cuda(int on)
{
    int old = g_pdl_small;
    if (on == 0 || on == 1)
        g_pdl_small = on;
    return old;
}

/* kernel<<<grid, block, 0, s>>>(args...), with the PDL attribute when pdl (and supported):
 * the kernel must pdl_wait() before it touches memory. */
template <typename... KArgs, typename... Args>
static cudaError_t launch_maybe_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, cudaStream_t s, int pdl,
                                    Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.stream = s;
    cudaLaunchAttribute at[1];
    if (pdl && pdl_supported()) {
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at, cfg.numAttrs = 1;
    }
    return cudaLaunchKernelEx(&cfg, kernel, ((KArgs)args)...);
}

/* ---- positions, counters, cache append ---------------------------------------------- */

__device__ __forceinline__ int base_of(const int32_t *base, int p0)
{
    return p0 + (base ? *base : 0);
}

__global__ void decode_positions_kernel(int32_t *pos, const int32_t *base, int p0, int T)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < T)
        pos[i] = base_of(base, p0) + i;
}

int decode_positions_cuda(int32_t *pos, const int32_t *base, int p0, int T, cudaStream_t s, char *err, size_t errlen)
{
    if (T < 0 || p0 < 0)
        BAD_SHAPE("decode_positions_cuda: T %d, p0 %d", T, p0);
    if (T == 0)
        return 0;
    decode_positions_kernel<<<(T + 255) / 256, 256, 0, s>>>(pos, base, p0, T);
    CUDA_LAUNCHED("decode_positions_kernel", err, errlen);
    return 0;
}

__global__ void decode_counter_add_kernel(int32_t *c, int add)
{
    *c += add;
}

int decode_counter_add_cuda(int32_t *counter, int add, cudaStream_t s, char *err, size_t errlen)
{
    if (!counter)
        BAD_SHAPE("decode_counter_add_cuda: no counter");
    decode_counter_add_kernel<<<1, 1, 0, s>>>(counter, add);
    CUDA_LAUNCHED("decode_counter_add_kernel", err, errlen);
    return 0;
}

/* One thread per 8 bf16 (16 bytes) when kvd % 8 == 0, else per element. */
__global__ void decode_kv_append_kernel(bf16 *kc, bf16 *vc, const bf16 *qkv, int T, int H, int KV, int hd,
                                        const int32_t *base, int row0, int vec)
{
    long kvd = (long)KV * hd, row = (long)(H + 2 * KV) * hd;
    long r0 = base_of(base, row0);
    int w = vec ? 8 : 1;
    long per = 2 * kvd / w, n = (long)T * per;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        long t = i / per, j = (i - t * per) * w;
        const bf16 *src = qkv + t * row + (long)H * hd + j;
        bf16 *dst = j < kvd ? kc + (r0 + t) * kvd + j : vc + (r0 + t) * kvd + (j - kvd);
        if (vec)
            *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(src);
        else
            *dst = *src;
    }
}

int decode_kv_append_cuda(nn_bf16_cuda *kc, nn_bf16_cuda *vc, const nn_bf16_cuda *qkv, int T, int H, int KV, int hd,
                          const int32_t *base, int row0, cudaStream_t s, char *err, size_t errlen)
{
    if (T < 0 || H <= 0 || KV <= 0 || hd <= 0 || row0 < 0)
        BAD_SHAPE("decode_kv_append_cuda: T %d, heads %d/%d, head_dim %d, row %d", T, H, KV, hd, row0);
    if (T == 0)
        return 0;
    int vec = (KV * hd) % 8 == 0 && hd % 8 == 0 && (uintptr_t)kc % 16 == 0 && (uintptr_t)vc % 16 == 0 &&
              (uintptr_t)qkv % 16 == 0;
    long n = (long)T * 2 * KV * hd / (vec ? 8 : 1);
    int blocks = (int)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
    decode_kv_append_kernel<<<blocks, 256, 0, s>>>(as_bf(kc), as_bf(vc), as_bf(qkv), T, H, KV, hd, base, row0, vec);
    CUDA_LAUNCHED("decode_kv_append_kernel", err, errlen);
    return 0;
}

/* decode_kv_append_kernel with the destination row of new row t read from rows[t]. */
__global__ void decode_kv_append_rows_kernel(bf16 *kc, bf16 *vc, const bf16 *qkv, int T, int H, int KV, int hd,
                                             const int32_t *rows, int vec)
{
    long kvd = (long)KV * hd, row = (long)(H + 2 * KV) * hd;
    int w = vec ? 8 : 1;
    long per = 2 * kvd / w, n = (long)T * per;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        long t = i / per, j = (i - t * per) * w, r = rows[t];
        const bf16 *src = qkv + t * row + (long)H * hd + j;
        bf16 *dst = j < kvd ? kc + r * kvd + j : vc + r * kvd + (j - kvd);
        if (vec)
            *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(src);
        else
            *dst = *src;
    }
}

int decode_kv_append_rows_cuda(nn_bf16_cuda *kc, nn_bf16_cuda *vc, const nn_bf16_cuda *qkv, int T, int H, int KV,
                               int hd, const int32_t *rows, cudaStream_t s, char *err, size_t errlen)
{
    if (T < 0 || H <= 0 || KV <= 0 || hd <= 0 || !rows)
        BAD_SHAPE("decode_kv_append_rows_cuda: T %d, heads %d/%d, head_dim %d", T, H, KV, hd);
    if (T == 0)
        return 0;
    int vec = (KV * hd) % 8 == 0 && hd % 8 == 0 && (uintptr_t)kc % 16 == 0 && (uintptr_t)vc % 16 == 0 &&
              (uintptr_t)qkv % 16 == 0;
    long n = (long)T * 2 * KV * hd / (vec ? 8 : 1);
    int blocks = (int)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
    decode_kv_append_rows_kernel<<<blocks, 256, 0, s>>>(as_bf(kc), as_bf(vc), as_bf(qkv), T, H, KV, hd, rows, vec);
    CUDA_LAUNCHED("decode_kv_append_rows_kernel", err, errlen);
    return 0;
}

/* ---- cached attention --------------------------------------------------------------- */

/* The allowed keys of query qi: [lo0,hi0) then [lo1,hi1). */
__device__ __forceinline__ void key_ranges(const nn_key_ranges *ranges, const int32_t *base, int p0, int window, int qi,
                                           int *lo0, int *hi0, int *lo1, int *hi1)
{
    if (ranges) {
        nn_key_ranges r = ranges[qi];
        *lo0 = r.lo0, *hi0 = r.hi0, *lo1 = r.lo1, *hi1 = r.hi1;
    } else {
        int p = base_of(base, p0) + qi;
        *lo0 = window > 0 ? max(0, p - window + 1) : 0, *hi0 = p + 1, *lo1 = *hi1 = 0;
    }
}

#define ATTW_WARPS 8 /* warps per (query, head) block of the warp-split kernel */

/* Keys a warp scores together (decode_attention_keys_cuda): their K and V rows are all
 * loaded before the scores' shuffles, so that many loads are in flight per lane. */
static int g_att_keys = 8; /* measured fastest at both shapes (docs/decode_cuda.md) */
/* Warps per (query, head) block (decode_attention_warps_cuda). */
#ifndef DECODE_ATT_WARPS_DEFAULT
#define DECODE_ATT_WARPS_DEFAULT 8
#endif
static int g_att_warps = DECODE_ATT_WARPS_DEFAULT;

int decode_attention_warps_cuda(int warps)
{
    int old = g_att_warps;
    if (warps == 4 || warps == 8 || warps == 16)
        g_att_warps = warps;
    return old;
}

int decode_attention_keys_cuda(int keys)
{
    int old = g_att_keys;
    if (keys == 4 || keys == 8 || keys == 16)
        g_att_keys = keys;
    return old;
}

/* DPL consecutive bf16, one load of 2 * DPL bytes when VEC (p aligned to that), else
 * element loads (the same values). */
template <int DPL> struct alignas(2 * DPL) bf16_dpl {
    bf16 v[DPL];
};
template <int DPL, bool VEC> __device__ __forceinline__ bf16_dpl<DPL> load_dpl(const bf16 *p)
{
    bf16_dpl<DPL> r;
    if constexpr (VEC) {
        r = *reinterpret_cast<const bf16_dpl<DPL> *>(p);
    } else {
#pragma unroll
        for (int i = 0; i < DPL; i++)
            r.v[i] = p[i];
    }
    return r;
}

/* hd = 32 * DPL. Lane l owns dims l*DPL .. l*DPL+DPL-1. Warp w of NW takes the key groups
 * g = w, w + NW, ... (KEYS consecutive allowed keys each), keeping its own running max m,
 * sum l and accumulators; then the warps merge in order 0..NW-1. The split depends on the
 * number of allowed keys only. */
template <int DPL, int KEYS, bool VEC, int NW>
__global__ void __launch_bounds__(NW * 32)
    decode_attention_warps_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ q, long q_stride,
                                  const bf16 *__restrict__ kc, const bf16 *__restrict__ vc,
                                  const nn_key_ranges *__restrict__ ranges, const int32_t *__restrict__ base, int p0,
                                  int window, int H, int KV, float scale)
{
    constexpr int hd = 32 * DPL;
    __shared__ float sm_m[NW], sm_l[NW];
    __shared__ float sm_acc[NW][hd];
    pdl_launch_dependents(); /* o_proj after us may fetch its weights now */
    pdl_wait();              /* (a PDL launch: the q/k kernel ahead is done) */
    int qi = blockIdx.x / H, h = blockIdx.x - qi * H, kvh = h / (H / KV);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int lo0, hi0, lo1, hi1;
    key_ranges(ranges, base, p0, window, qi, &lo0, &hi0, &lo1, &hi1);
    int n0 = max(0, hi0 - lo0), n1 = max(0, hi1 - lo1), n = n0 + n1;
    long kvd = (long)KV * hd;
    const bf16 *qr = q + (long)qi * q_stride + (long)h * hd + lane * DPL;
    const bf16 *kb = kc + (long)kvh * hd + lane * DPL, *vb = vc + (long)kvh * hd + lane * DPL;
    float qf[DPL], acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++)
        qf[i] = __bfloat162float(qr[i]) * scale, acc[i] = 0.0f;
    float m_run = -INFINITY, l_run = 0.0f;
    for (int g0 = warp * KEYS; g0 < n; g0 += NW * KEYS) {
        float sc[KEYS];
        int key[KEYS];
        bf16_dpl<DPL> kk[KEYS], vv[KEYS];
#pragma unroll
        for (int j = 0; j < KEYS; j++) {
            int jj = g0 + j;
            key[j] = jj < n ? (jj < n0 ? lo0 + jj : lo1 + (jj - n0)) : -1;
            if (key[j] >= 0)
                kk[j] = load_dpl<DPL, VEC>(kb + key[j] * kvd), vv[j] = load_dpl<DPL, VEC>(vb + key[j] * kvd);
        }
#pragma unroll
        for (int j = 0; j < KEYS; j++) {
            float dot = 0.0f;
            if (key[j] >= 0) {
#pragma unroll
                for (int i = 0; i < DPL; i++)
                    dot = fmaf(qf[i], __bfloat162float(kk[j].v[i]), dot);
            }
            sc[j] = dot;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int j = 0; j < KEYS; j++)
                sc[j] += __shfl_xor_sync(0xffffffffu, sc[j], o);
        float mx = m_run;
#pragma unroll
        for (int j = 0; j < KEYS; j++)
            if (key[j] >= 0)
                mx = fmaxf(mx, sc[j]);
        float corr = expf(m_run - mx); /* 0 on the first group (m_run = -inf) */
        l_run *= corr;
#pragma unroll
        for (int i = 0; i < DPL; i++)
            acc[i] *= corr;
#pragma unroll
        for (int j = 0; j < KEYS; j++) {
            if (key[j] < 0)
                continue;
            float p = expf(sc[j] - mx);
            l_run += p;
#pragma unroll
            for (int i = 0; i < DPL; i++)
                acc[i] = fmaf(p, __bfloat162float(vv[j].v[i]), acc[i]);
        }
        m_run = mx;
    }
    if (lane == 0)
        sm_m[warp] = m_run, sm_l[warp] = l_run;
#pragma unroll
    for (int i = 0; i < DPL; i++)
        sm_acc[warp][lane * DPL + i] = acc[i];
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < NW; w++)
        M = fmaxf(M, sm_m[w]);
    bf16 *o = out + ((long)qi * H + h) * hd;
    for (int dim = threadIdx.x; dim < hd; dim += blockDim.x) {
        float L = 0.0f, A = 0.0f;
        for (int w = 0; w < NW; w++) {
            if (sm_m[w] == -INFINITY)
                continue; /* a warp that saw no key */
            float c = expf(sm_m[w] - M);
            L += sm_l[w] * c;
            A += sm_acc[w][dim] * c;
        }
        o[dim] = __float2bfloat16(n > 0 ? A / L : 0.0f);
    }
}

#define ATT_THREADS 128 /* thread i owns output dims i and i + 128: hd <= 256 */
#define ATT_CHUNK 512   /* keys scored per pass (shared memory), online softmax across passes */

/* Any even hd (the warp-split kernel takes hd = 32, 64, 128, 256). One block per (query,
 * head). Per chunk of keys: one warp per key computes the score (lanes split hd), then the
 * chunk's max rescales the running sum and accumulators, and every thread adds p * v for
 * its dims over the chunk's keys in key order. */
__global__ void __launch_bounds__(ATT_THREADS)
    decode_attention_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ q, long q_stride,
                            const bf16 *__restrict__ kc, const bf16 *__restrict__ vc,
                            const nn_key_ranges *__restrict__ ranges, const int32_t *__restrict__ base, int p0,
                            int window, int H, int KV, int hd, float scale)
{
    __shared__ float qs[256];
    __shared__ float sc[ATT_CHUNK];
    __shared__ float part[ATT_THREADS / 32];
    pdl_launch_dependents();
    int qi = blockIdx.x / H, h = blockIdx.x - qi * H, kvh = h / (H / KV);
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    int lo0, hi0, lo1, hi1;
    key_ranges(ranges, base, p0, window, qi, &lo0, &hi0, &lo1, &hi1);
    int n0 = max(0, hi0 - lo0), n1 = max(0, hi1 - lo1), n = n0 + n1;
    const bf16 *qr = q + (long)qi * q_stride + (long)h * hd;
    for (int i = tid; i < hd; i += blockDim.x)
        qs[i] = __bfloat162float(qr[i]);
    __syncthreads();
    long kvd = (long)KV * hd;
    const bf16 *kb = kc + (long)kvh * hd, *vb = vc + (long)kvh * hd;
    float m_run = -INFINITY, l_run = 0.0f, acc0 = 0.0f, acc1 = 0.0f;
    for (int c0 = 0; c0 < n; c0 += ATT_CHUNK) {
        int cn = min(ATT_CHUNK, n - c0);
        for (int j = warp; j < cn; j += nw) {
            int jj = c0 + j, key = jj < n0 ? lo0 + jj : lo1 + (jj - n0);
            const bf16 *kr = kb + key * kvd;
            float dot = 0.0f;
            for (int i = lane; i < hd; i += 32)
                dot += qs[i] * __bfloat162float(kr[i]);
            dot = warp_sum(dot);
            if (lane == 0)
                sc[j] = dot * scale;
        }
        __syncthreads();
        float mx = -INFINITY;
        for (int j = tid; j < cn; j += blockDim.x)
            mx = fmaxf(mx, sc[j]);
        mx = block_max_serial(mx, part);
        float m_new = fmaxf(m_run, mx);
        float corr = expf(m_run - m_new);
        float ps = 0.0f;
        for (int j = tid; j < cn; j += blockDim.x) {
            float p = expf(sc[j] - m_new);
            sc[j] = p;
            ps += p;
        }
        ps = block_sum_serial(ps, part); /* its syncs also publish sc[] */
        l_run = l_run * corr + ps;
        acc0 *= corr, acc1 *= corr;
        for (int j = 0; j < cn; j++) {
            int jj = c0 + j, key = jj < n0 ? lo0 + jj : lo1 + (jj - n0);
            const bf16 *vr = vb + key * kvd;
            float p = sc[j];
            if (tid < hd)
                acc0 += p * __bfloat162float(vr[tid]);
            if (tid + ATT_THREADS < hd)
                acc1 += p * __bfloat162float(vr[tid + ATT_THREADS]);
        }
        m_run = m_new;
        __syncthreads(); /* everyone is done with sc[] before the next chunk */
    }
    float inv = n > 0 ? 1.0f / l_run : 0.0f;
    bf16 *o = out + ((long)qi * H + h) * hd;
    if (tid < hd)
        o[tid] = __float2bfloat16(acc0 * inv);
    if (tid + ATT_THREADS < hd)
        o[tid + ATT_THREADS] = __float2bfloat16(acc1 * inv);
}

int decode_attention_cuda(nn_bf16_cuda *out, const nn_bf16_cuda *q, long q_stride, const nn_bf16_cuda *kc,
                          const nn_bf16_cuda *vc, const nn_key_ranges *ranges, const int32_t *base, int p0, int window,
                          int Tq, int H, int KV, int hd, float scale, cudaStream_t s, char *err, size_t errlen)
{
    if (Tq < 0 || H <= 0 || KV <= 0 || H % KV || hd <= 0 || hd % 2 || hd > 2 * ATT_THREADS || p0 < 0 || window < 0 ||
        q_stride < (long)H * hd)
        BAD_SHAPE("decode_attention_cuda: %d queries, heads %d/%d, head_dim %d, p0 %d, window %d", Tq, H, KV, hd, p0,
                  window);
    if (Tq == 0)
        return 0;
    unsigned grid = (unsigned)((long)Tq * H);
    const bf16 *qq = as_bf(q), *kk = as_bf(kc), *vv = as_bf(vc);
    bf16 *oo = as_bf(out);
    /* one load per key and lane when the rows are aligned to it (the same values either way) */
    int avec = ((uintptr_t)q | (uintptr_t)kc | (uintptr_t)vc) % (2 * (hd / 32)) == 0 && q_stride % (hd / 32) == 0;
    cudaError_t le = cudaSuccess;
#define ATT_NW_LAUNCH(DPL, KEYS, NW)                                                                                 \
    do {                                                                                                             \
        if (avec)                                                                                                    \
            le = launch_maybe_pdl(decode_attention_warps_kernel<DPL, KEYS, true, NW>, dim3(grid), dim3(NW * 32), s,  \
                                  g_pdl_small, oo, qq, q_stride, kk, vv, ranges, base, p0, window, H, KV, scale);    \
        else                                                                                                         \
            le = launch_maybe_pdl(decode_attention_warps_kernel<DPL, KEYS, false, NW>, dim3(grid), dim3(NW * 32), s, \
                                  g_pdl_small, oo, qq, q_stride, kk, vv, ranges, base, p0, window, H, KV, scale);    \
    } while (0)
#define ATT_KEYS_LAUNCH(DPL, KEYS)                \
    do {                                          \
        if (g_att_warps == 16)                    \
            ATT_NW_LAUNCH(DPL, KEYS, 16);         \
        else if (g_att_warps == 4)                \
            ATT_NW_LAUNCH(DPL, KEYS, 4);          \
        else                                      \
            ATT_NW_LAUNCH(DPL, KEYS, ATTW_WARPS); \
    } while (0)
    /* KEYS * DPL <= 64: the K and V values of a group stay in registers */
#define ATT_KEYS_CASE(DPL)                             \
    do {                                               \
        if (g_att_keys >= 16 && (DPL) <= 4)            \
            ATT_KEYS_LAUNCH(DPL, (DPL) <= 4 ? 16 : 8); \
        else if (g_att_keys >= 8)                      \
            ATT_KEYS_LAUNCH(DPL, 8);                   \
        else                                           \
            ATT_KEYS_LAUNCH(DPL, 4);                   \
    } while (0)
    switch (hd) {
    case 32: ATT_KEYS_CASE(1); break;
    case 64: ATT_KEYS_CASE(2); break;
    case 128: ATT_KEYS_CASE(4); break;
    case 256: ATT_KEYS_CASE(8); break;
    default:
        decode_attention_kernel<<<grid, ATT_THREADS, 0, s>>>(oo, qq, q_stride, kk, vv, ranges, base, p0, window, H, KV,
                                                             hd, scale);
    }
#undef ATT_KEYS_CASE
#undef ATT_KEYS_LAUNCH
#undef ATT_NW_LAUNCH
    if (le != cudaSuccess) {
        cudaGetLastError();
        BAD_LAUNCH("decode_attention_kernel", le);
    }
    CUDA_LAUNCHED("decode_attention_kernel", err, errlen);
    return 0;
}

/* ---- small-row linear layer on the tensor cores ---------------------------------------- */

#define LIN_COLS 16  /* output columns per block (the m16 of the product) */
#define LIN_CHUNK 32 /* n_in elements per chunk: 8 per lane of a quad, two k16 products */

/* The variants (decode_linear_variant_cuda). warps: warps per block, splitting n_in (warp
 * w takes chunks w, w + warps, ... and the warps' sums are added in warp order); pf: the
 * next round of weight chunks is loaded before this round's products (two rounds in
 * flight); pdl: launched as a programmatic dependent of the kernel ahead of it (sm_90+),
 * so its first weights are loaded while that kernel finishes (pdl_wait before reading x).
 * A variant's split and order depend on (n_in, n_out) only, whatever the row count. */
typedef struct lin_variant {
    const char *name;
    int warps, pf, pdl;
} lin_variant;
static const lin_variant LIN_VARIANTS[DECODE_LINEAR_VARIANTS] = {
    {"8w", 8, 0, 0},          /* the kernel measured in docs/decode_cuda.md before the variants */
    {"8w+pf", 8, 1, 0},       /* prefetch */
    {"16w+pf", 16, 1, 0},     /* more warps per block: more bytes in flight per SM */
    {"8w+pf+pdl", 8, 1, 1},   /* early launch */
    {"16w+pf+pdl", 16, 1, 1}, /* both */
    {"16w+pdl", 16, 0, 1},
    {"auto", 0, 0, 0}, /* per shape: LIN_AUTO_NARROW below LIN_AUTO_BLOCKS blocks, else LIN_AUTO_WIDE */
    {"8w+pdl", 8, 0, 1},
    /* 8 warps everywhere (the bits of variant 0): PDL, and the prefetch above 8 rows only
     * (the prefetch and unroll never change the order of the additions) */
    {"8w+pdl/pf", 8, -1, 1},
    /* per shape as auto: 16 warps + PDL below LIN_AUTO_BLOCKS column blocks; else as 8w+pdl/pf */
    {"tuned", -1, -1, 1},
};
#ifndef LIN_AUTO_BLOCKS
#define LIN_AUTO_BLOCKS 512
#endif
#ifndef LIN_AUTO_NARROW
#define LIN_AUTO_NARROW 4
#endif
#ifndef LIN_AUTO_WIDE
#define LIN_AUTO_WIDE 3
#endif
/* The default: tuned, the fastest plain step at the 1.7B shape on an H200 (docs/decode_cuda.md,
 * bench_decode --linear-sweep); 8w+pdl/pf was 2% faster at 8B. */
#ifndef DECODE_LINEAR_DEFAULT_VARIANT
#define DECODE_LINEAR_DEFAULT_VARIANT 9
#endif
static int g_lin_variant = DECODE_LINEAR_DEFAULT_VARIANT;
/* 4: two tiles also in the 16-warp kernels of more than one wave at 1..16 rows (docs/decode_cuda.md:
 * at 1 row the plain step 5.01 -> 4.90 ms at 8B, 1.58 -> 1.56 ms at 1.7B; at 9..16 rows the
 * 1.7B verify 1.93 -> 1.91 ms) */
#ifndef DECODE_LINEAR_COLS_DEFAULT
#define DECODE_LINEAR_COLS_DEFAULT 4
#endif
static int g_lin_cols = DECODE_LINEAR_COLS_DEFAULT;

/* 1: every block of the linear kernel asks for its whole weight slice in L2 at its start */
#ifndef DECODE_LINEAR_L2PF_DEFAULT
#define DECODE_LINEAR_L2PF_DEFAULT 0
#endif
static int g_lin_l2pf = DECODE_LINEAR_L2PF_DEFAULT;

int decode_linear_l2_prefetch_cuda(int mode)
{
    int old = g_lin_l2pf;
    if (mode == 0 || mode == 1)
        g_lin_l2pf = mode;
    return old;
}

int decode_linear_cols_cuda(int tiles)
{
    int old = g_lin_cols;
    if (tiles >= 1 && tiles <= 4)
        g_lin_cols = tiles;
    return old;
}

/* The device's SM count (once). */
static int lin_sm_count(void)
{
    static int n = 0;
    if (!n) {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && v > 0)
            n = v;
        else
            n = 1 << 30, cudaGetLastError();
    }
    return n;
}

int decode_linear_variant_cuda(int v)
{
    int old = g_lin_variant;
    if (v >= 0 && v < DECODE_LINEAR_VARIANTS)
        g_lin_variant = v;
    return old;
}

const char *decode_linear_variant_name_cuda(int v)
{
    return v >= 0 && v < DECODE_LINEAR_VARIANTS ? LIN_VARIANTS[v].name : "?";
}

/* 8 consecutive bf16 at p (16 bytes) as a uint4: vec: p is 16-byte aligned and all 8 are
 * in range; else element-wise with zeros past `left` (the same values either way). */
__device__ __forceinline__ uint4 load8(const bf16 *p, int vec, int left)
{
    if (vec && left >= 8)
        return __ldg(reinterpret_cast<const uint4 *>(p));
    if (left <= 0)
        return make_uint4(0, 0, 0, 0); /* a padding row or chunk: no load */
    const unsigned short *src = reinterpret_cast<const unsigned short *>(p);
    unsigned v[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (j < left)
            v[j >> 1] |= (unsigned)src[j] << (16 * (j & 1));
    return make_uint4(v[0], v[1], v[2], v[3]);
}

__device__ __forceinline__ void mma_bf16(float *d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                         unsigned b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float silu_mul(float g, float u)
{
    return g / (1.0f + __expf(-g)) * u; /* nn_swiglu_cuda's formula: the same bits */
}

/* The x operand's 8 values at k: plain rows, or (SWIGLU) bf16(silu(gate) * up) from a
 * fused gate/up row [gate(K), up(K)]: nn_swiglu_cuda's output without its pass. */
/* bf16(silu(g) * u) of the two bf16 halves of g and u, packed like them. */
__device__ __forceinline__ unsigned swiglu2(unsigned g, unsigned u)
{
    float g0 = __uint_as_float(g << 16), g1 = __uint_as_float(g & 0xffff0000u);
    float u0 = __uint_as_float(u << 16), u1 = __uint_as_float(u & 0xffff0000u);
    unsigned lo = __bfloat16_as_ushort(__float2bfloat16(silu_mul(g0, u0)));
    unsigned hi = __bfloat16_as_ushort(__float2bfloat16(silu_mul(g1, u1)));
    return lo | (hi << 16);
}

/* The x operand's 8 values at k: plain rows, or (SWIGLU) bf16(silu(gate) * up) from a
 * fused gate/up row [gate(K), up(K)]: nn_swiglu_cuda's output without its pass. */
template <bool SWIGLU> __device__ __forceinline__ uint4 load_x8(const bf16 *row, int K, int k, int vec, int left)
{
    if (!SWIGLU)
        return load8(row + k, vec, left);
    if (left <= 0)
        return make_uint4(0, 0, 0, 0);
    uint4 g = load8(row + k, vec, left), u = load8(row + K + k, vec, left);
    return make_uint4(swiglu2(g.x, u.x), swiglu2(g.y, u.y), swiglu2(g.z, u.z), swiglu2(g.w, u.w));
}

/* Chunks a warp loads per round (bytes in flight); the order in which a warp adds its
 * chunks is w, w + warps, ... whatever the unroll, so it may follow the row groups (NT)
 * and the register budget (512-thread blocks have 128 registers a thread). */
__host__ __device__ constexpr int lin_unroll(int NT, int WARPS, bool PF)
{
    return WARPS == 8 ? (PF ? (NT <= 2   ? 4
                               : NT == 4 ? 2
                                         : 1)
                            : (NT == 8 ? 2 : 4))
                      : (PF ? (NT == 1   ? 4
                               : NT == 2 ? 2
                                         : 1)
                            : (NT <= 2   ? 4
                               : NT == 4 ? 2
                                         : 1));
}

/* Row groups of 8 a reduction pass takes: NT, or NT halved until a pass's sums (per_group
 * bytes a group) fit in 32 KB of shared memory. */
__host__ __device__ constexpr int lin_pass_groups(int NT, int per_group)
{
    return NT > 1 && NT * per_group > 32768 ? lin_pass_groups(NT / 2, per_group) : NT;
}

/* The weight operands of round c0 (chunks c0 + u * WARPS): rows n0+g and n0+g+8, 16
 * bytes each at k = c * 32 + 8t; chunks past the end load nothing (zeros). */
template <int U, int WARPS>
__device__ __forceinline__ void lin_load_w(uint4 *lo, uint4 *hi, const bf16 *wlo, const bf16 *whi, int wlo_ok,
                                           int whi_ok, int c0, int nchunks, int K, int t, int vec)
{
#pragma unroll
    for (int u = 0; u < U; u++) {
        int c = c0 + u * WARPS;
        int k = c * LIN_CHUNK + 8 * t, left = c < nchunks ? K - k : 0;
        lo[u] = load8(wlo + k, vec, wlo_ok ? left : 0);
        hi[u] = load8(whi + k, vec, whi_ok ? left : 0);
    }
}

#define QKR_MAX_PAIRS 4 /* hd <= 256 */

/* bf16 at p; CG: from L2 (__ldcg), for rows other blocks of the running grid wrote. */
template <bool CG> __device__ __forceinline__ float ld_bf(const bf16 *p)
{
    if (CG)
        return __bfloat162float(__ushort_as_bfloat16(__ldcg(reinterpret_cast<const unsigned short *>(p))));
    return __bfloat162float(*p);
}

/* Item (row t, head h) of the H + 2KV heads of qkv, by one warp: q and k heads are
 * RMS-normed (q_norm / k_norm, when given) and rotated exactly as nn_qk_norm_rope_cuda (the
 * same order, the same rope_* arithmetic), at position r; k heads then go to cache row r
 * of kc, v heads are copied to row r of vc. decode_qk_norm_rope_append_kernel and the q/k tail of the
 * linear kernel run this same code, so their bits are the same. */
template <bool CG>
__device__ __forceinline__ void qk_item(bf16 *qkv, const float *q_norm, const float *k_norm, const float *inv_freq,
                                        bf16 *kc, bf16 *vc, int H, int KV, int hd, float eps, long pos, long r, int t,
                                        int h, int lane)
{
    int nh = H + 2 * KV;
    long kvd = (long)KV * hd;
    bf16 *x = qkv + (size_t)t * nh * hd + (size_t)h * hd;
    if (h >= H + KV) { /* v head: copy */
        bf16 *dst = vc + r * kvd + (long)(h - H - KV) * hd;
        for (int i = lane; i < hd; i += 32)
            dst[i] = __float2bfloat16(ld_bf<CG>(x + i));
        return;
    }
    const float *nw = h < H ? q_norm : k_norm;
    int half = hd / 2;
    float a[QKR_MAX_PAIRS], b[QKR_MAX_PAIRS];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < QKR_MAX_PAIRS; k++) {
        int i = lane + 32 * k;
        a[k] = b[k] = 0.0f;
        if (i < half) {
            a[k] = ld_bf<CG>(x + i);
            b[k] = ld_bf<CG>(x + i + half);
            ss = rope_ss(ss, a[k], b[k]);
        }
    }
    float rr = 1.0f;
    if (nw)
        rr = rope_rscale(warp_sum(ss), hd, eps);
    float p = (float)pos;
    bf16 *kd = h >= H ? kc + r * kvd + (long)(h - H) * hd : NULL;
#pragma unroll
    for (int k = 0; k < QKR_MAX_PAIRS; k++) {
        int i = lane + 32 * k;
        if (i < half) {
            float u = a[k], v = b[k];
            if (nw) {
                u = u * rr * nw[i];
                v = v * rr * nw[i + half];
            }
            float sn, cs;
            sincosf(p * inv_freq[i], &sn, &cs);
            bf16 o1 = __float2bfloat16(rope_lo(u, v, cs, sn)), o2 = __float2bfloat16(rope_hi(u, v, cs, sn));
            x[i] = o1, x[i + half] = o2;
            if (kd)
                kd[i] = o1, kd[i + half] = o2;
        }
    }
}

/* The epilogues of decode_linear_mma_kernel (decode_kernels_cuda.h): what a block does
 * with its 16 columns' sums, and what the last block of the grid does after them. */
enum { LIN_EPI_PLAIN = 0, LIN_EPI_GLU = 1, LIN_EPI_RESID = 2, LIN_EPI_ARGMAX = 3, LIN_EPI_QK = 4 };
typedef struct lin_epi {
    int mode;
    /* LIN_EPI_RESID tail: nn_add_rmsnorm_cuda's second half in its order (nthr threads,
     * 4-wide when vec) */
    const float *norm_w;
    bf16 *norm_out, *cap;
    long cap_stride;
    int norm_row0, nthr, vec;
    float eps;
    int *sync;    /* [0]: blocks done; LIN_EPI_ARGMAX: keys (unsigned long long) from byte 8 */
    int32_t *idx; /* LIN_EPI_ARGMAX: the rows' argmax */
    /* LIN_EPI_QK tail: decode_qk_norm_rope_append_cuda on the output */
    const float *q_norm, *k_norm, *inv_freq;
    bf16 *kc, *vc;
    int H, KV, hd, p0;
    const int32_t *base;
    int l2pf; /* decode_linear_l2_prefetch_cuda's setting at the launch */
} lin_epi;

/* An fp32 logit and its column as one 64-bit key whose unsigned order is (value, then the
 * smaller column): the argmax with the first index on ties is the key's maximum. -0 counts
 * as +0 (they compare equal); NaN gets no key (decode_argmax_kernel skips it). 0: none. */
__device__ __forceinline__ unsigned long long argmax_key(float v, int n)
{
    if (v != v)
        return 0ull;
    unsigned u = v == 0.0f ? 0u : __float_as_uint(v); /* -0 -> +0 */
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)u << 32) | (unsigned)(0x7fffffff - n);
}

/* The last block of the grid to finish, for every block (0 / 1, the same in all threads):
 * each thread's stores are fenced before the block counts itself. The last block resets
 * the counter, so the next call (stream order) finds it at zero. */
__device__ __forceinline__ int lin_last_block(int *sync)
{
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(sync, 1) == (int)gridDim.x - 1;
        if (last)
            *sync = 0;
    }
    __syncthreads();
    if (last)
        __threadfence();
    return last;
}

/* The partial sum of squares of thread i0 / V of add_rmsnorm_kernel<V> over row xr: its
 * elements i0, i0 + stride, ... (V each) in that order; four strides' loads in flight. */
template <int V> __device__ __forceinline__ float tail_partial(const float *xr, int d, int i0, int stride)
{
    float ss = 0.0f;
    for (int i = i0; i < d; i += 4 * stride) {
        float v[4][V];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int ii = i + u * stride;
            if (ii < d) {
                if constexpr (V == 4) {
                    float4 f = __ldcg(reinterpret_cast<const float4 *>(xr + ii));
                    v[u][0] = f.x, v[u][1] = f.y, v[u][2] = f.z, v[u][3] = f.w;
                } else {
                    v[u][0] = __ldcg(xr + ii);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (i + u * stride < d)
#pragma unroll
                for (int k = 0; k < V; k++)
                    ss += v[u][k] * v[u][k];
    }
    return ss;
}

/* nn_add_rmsnorm_cuda's work after its residual add, on rows 0..T-1 of x [T, d] (already
 * added, by every block of this grid): capture = bf16(x) of each row, and rows >= norm_row0
 * normalised into norm_out. The sums of squares are add_rmsnorm_kernel's exactly: thread i
 * of its e.nthr (4-wide when vec) has a partial over its elements in order (tail_partial),
 * a warp adds 32 of them by warp_sum with thread i at lane i % 32, and the warps' sums are
 * added as block_sum does; here a warp computes one (row, warp of that kernel) at a time,
 * so the rows go in parallel. The rest is elementwise. x is read from L2 (__ldcg): other
 * blocks wrote it. */
__device__ void lin_tail_norm(const lin_epi &e, const float *x, int T, int d)
{
    __shared__ float part[DECODE_EPI_MAX_ROWS][8];
    __shared__ float rs[DECODE_EPI_MAX_ROWS];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    int nw = e.nthr >> 5, V = e.vec ? 4 : 1, stride = e.nthr * V, r0 = e.norm_row0, nrows = T - r0;
    if (e.cap) {
        if (e.vec) {
            int d4 = d / 4;
            for (int q = threadIdx.x; q < T * d4; q += blockDim.x) {
                int t = q / d4, i = 4 * (q - t * d4);
                float4 f = __ldcg(reinterpret_cast<const float4 *>(x + (size_t)t * d + i));
                bf16 *c = e.cap + (size_t)t * e.cap_stride + i;
                c[0] = f2bf(f.x), c[1] = f2bf(f.y), c[2] = f2bf(f.z), c[3] = f2bf(f.w);
            }
        } else {
            for (int q = threadIdx.x; q < T * d; q += blockDim.x) {
                int t = q / d, i = q - t * d;
                e.cap[(size_t)t * e.cap_stride + i] = f2bf(__ldcg(x + (size_t)t * d + i));
            }
        }
    }
    if (!e.norm_w || nrows <= 0)
        return;
    for (int item = warp; item < nrows * nw; item += nwarps) {
        int row = item / nw, ew = item - row * nw, i0 = (ew * 32 + lane) * V;
        const float *xr = x + (size_t)(r0 + row) * d;
        float ss = e.vec ? tail_partial<4>(xr, d, i0, stride) : tail_partial<1>(xr, d, i0, stride);
        ss = warp_sum(ss);
        if (lane == 0)
            part[row][ew] = ss;
    }
    __syncthreads();
    for (int row = warp; row < nrows; row += nwarps) {
        float tot = warp_sum(lane < nw ? part[row][lane] : 0.0f);
        if (lane == 0)
            rs[row] = rsqrtf(tot / (float)d + e.eps);
    }
    __syncthreads();
    if (e.vec) {
        int d4 = d / 4;
        for (int q = threadIdx.x; q < nrows * d4; q += blockDim.x) {
            int row = q / d4, i = 4 * (q - row * d4);
            float r = rs[row];
            float4 xv = __ldcg(reinterpret_cast<const float4 *>(x + (size_t)(r0 + row) * d + i)),
                   wv = *reinterpret_cast<const float4 *>(e.norm_w + i);
            bf16 *o = e.norm_out + (size_t)row * d + i;
            o[0] = f2bf(xv.x * r * wv.x), o[1] = f2bf(xv.y * r * wv.y);
            o[2] = f2bf(xv.z * r * wv.z), o[3] = f2bf(xv.w * r * wv.w);
        }
    } else {
        for (int q = threadIdx.x; q < nrows * d; q += blockDim.x) {
            int row = q / d, i = q - row * d;
            e.norm_out[(size_t)row * d + i] = f2bf(__ldcg(x + (size_t)(r0 + row) * d + i) * rs[row] * e.norm_w[i]);
        }
    }
}

/* Column col, row rr of a block's sums: the warps' partials added in warp order (the one
 * order every epilogue uses, so a row's value does not depend on the epilogue). */
template <int WARPS, int MC, int RR>
__device__ __forceinline__ float lin_warp_order_sum(const float (*red)[LIN_COLS * MC][RR], int col, int rr)
{
    float v = red[0][col][rr];
#pragma unroll
    for (int ww = 1; ww < WARPS; ww++)
        v += red[ww][col][rr];
    return v;
}

/* The output of rows r0 .. r0 + nr - 1 of a linear block from the warps' partial sums in
 * red[warp][column][row - r0] (added in warp order, then the bias): by e.mode, plain (bf16,
 * fp32, or added to an fp32 residual), GLU (SwiGLU of the gate and up columns), ARGMAX
 * (fp32 logits and one atomicMax per 16 columns and row; the kernel's last block hands out
 * the indices). */
template <int WARPS, int MC, int RR>
__device__ __forceinline__ void lin_epilogue(const float (*red)[LIN_COLS * MC][RR], void *out, int out_f32,
                                             const bf16 *bias, int N, int n0, int r0, int nr, const lin_epi &e)
{
    if (e.mode == LIN_EPI_GLU) {
        /* column c < 8 of tile m: gate 8vb + c (sums [c]), up 8vb + c (sums [c + 8]), each
         * rounded to bf16 as the gu tensor would be, then nn_swiglu_cuda's formula */
        int I = N / 2;
        for (int i = threadIdx.x; i < 8 * MC * nr; i += blockDim.x) {
            int mc = i % (8 * MC), rr = i / (8 * MC), m = mc / 8, col = mc % 8;
            int n = (blockIdx.x * MC + m) * 8 + col;
            if (n >= I)
                continue;
            float vg = lin_warp_order_sum<WARPS, MC, RR>(red, 16 * m + col, rr);
            float vu = lin_warp_order_sum<WARPS, MC, RR>(red, 16 * m + col + 8, rr);
            if (bias)
                vg += __bfloat162float(bias[n]), vu += __bfloat162float(bias[I + n]);
            float gq = __bfloat162float(__float2bfloat16(vg)), uq = __bfloat162float(__float2bfloat16(vu));
            reinterpret_cast<bf16 *>(out)[(long)(r0 + rr) * I + n] = __float2bfloat16(silu_mul(gq, uq));
        }
        return;
    }
    if (e.mode == LIN_EPI_ARGMAX) {
        /* logits as out_f32 = 1; then per row the best key of each 16 columns (16 lanes of
         * one row), one atomicMax per tile and row */
        unsigned long long *keys = reinterpret_cast<unsigned long long *>(e.sync + 2);
        for (int i0 = 0; i0 < LIN_COLS * MC * nr; i0 += blockDim.x) { /* the same trip count in every thread */
            int i = i0 + threadIdx.x, col = i % (LIN_COLS * MC), rr = i / (LIN_COLS * MC), n = n0 + col;
            unsigned long long key = 0ull;
            if (rr < nr && n < N) {
                float v = lin_warp_order_sum<WARPS, MC, RR>(red, col, rr);
                if (bias)
                    v += __bfloat162float(bias[n]);
                reinterpret_cast<float *>(out)[(long)(r0 + rr) * N + n] = v;
                key = argmax_key(v, n);
            }
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) {
                unsigned long long k2 = __shfl_xor_sync(0xffffffffu, key, o);
                key = k2 > key ? k2 : key;
            }
            if (col % LIN_COLS == 0 && rr < nr && key)
                atomicMax(keys + r0 + rr, key);
        }
        return;
    }
    for (int i = threadIdx.x; i < LIN_COLS * MC * nr; i += blockDim.x) {
        int col = i % (LIN_COLS * MC), rr = i / (LIN_COLS * MC), n = n0 + col;
        if (n >= N)
            continue;
        float v = lin_warp_order_sum<WARPS, MC, RR>(red, col, rr);
        if (bias)
            v += __bfloat162float(bias[n]);
        long o = (long)(r0 + rr) * N + n;
        if (e.mode == LIN_EPI_RESID) /* x += float(bf16(v)): the bf16 y a separate add would read */
            reinterpret_cast<float *>(out)[o] += __bfloat162float(__float2bfloat16(v));
        else if (out_f32 == 2)
            reinterpret_cast<float *>(out)[o] += v; /* the residual add, in fp32 */
        else if (out_f32)
            reinterpret_cast<float *>(out)[o] = v;
        else
            reinterpret_cast<bf16 *>(out)[o] = __float2bfloat16(v);
    }
}

/* NT: 8-row groups of x handled per pass (1, 2, 4 or 8: T <= 8 * NT). Lane (g = lane/4,
 * t = lane%4) loads, per chunk at k, 16 bytes of w rows n0+g and n0+g+8 and of x row
 * 8j+g (group j) at k + 8t: the same k offsets in both operands, so product 1 takes their
 * words 0-1 and product 2 words 2-3 (a fixed permutation of k inside the chunk, the same
 * for w and x: the products summed are w[n,k] x[t,k] over every k once). The weights of
 * the first round are loaded before pdl_wait (they are constant during a step); x and out
 * are touched only after it. */
template <int NT, bool SWIGLU, int WARPS, bool PF, bool PDL, int MC>
__global__ void __launch_bounds__(WARPS * 32)
    decode_linear_mma_kernel(void *__restrict__ out, int out_f32, const bf16 *__restrict__ x,
                             const bf16 *__restrict__ w, const bf16 *__restrict__ bias, int T, int K, int N, int vec,
                             lin_epi e)
{
    /* MC column tiles of 16 per block (decode_linear_cols_cuda): tile m is the one a block
     * blockIdx.x * MC + m would have alone, with the same chunks in the same order, sharing
     * the x loads; two rounds in flight instead of four keep the registers */
    constexpr int U = MC == 1 ? lin_unroll(NT, WARPS, PF) : (NT == 1 ? 4 : NT <= 2 ? 2 : 1), STEP = WARPS * U;
    constexpr int RG = lin_pass_groups(NT, WARPS * LIN_COLS * MC * 8 * 4); /* row groups a reduction pass */
    __shared__ float red[WARPS][LIN_COLS * MC][8 * RG];
    if (PDL)
        pdl_launch_dependents();
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const bf16 *wlo[MC], *whi[MC];
    int wlo_ok[MC], whi_ok[MC];
#pragma unroll
    for (int m = 0; m < MC; m++) {
        int vb = blockIdx.x * MC + m, nlo = vb * LIN_COLS + g, nhi = nlo + 8;
        wlo_ok[m] = nlo < N, whi_ok[m] = nhi < N;
        if (e.mode == LIN_EPI_GLU) { /* gate rows 8vb.. and the up rows I + 8vb.. (N = 2I, I % 8 == 0) */
            nlo = vb * 8 + g, nhi = N / 2 + vb * 8 + g;
            wlo_ok[m] = whi_ok[m] = nlo < N / 2;
        }
        wlo[m] = w + (long)min(nlo, N - 1) * K, whi[m] = w + (long)min(nhi, N - 1) * K;
    }
    if (e.l2pf && warp == 0 && vec) {
        /* the block's whole weight slice requested into L2 at once (the loads below keep
         * only a few chunks a warp in flight); with PDL this runs while the kernel ahead
         * finishes. Rows of the tiles vb0 .. vb0 + MC - 1, or their gate and up halves */
        int vb0 = blockIdx.x * MC;
        if (e.mode == LIN_EPI_GLU) {
            int r0 = vb0 * 8, r1 = min(N / 2, r0 + 8 * MC);
            if (r1 > r0) {
                l2_prefetch_range(w + (long)r0 * K, 2L * (r1 - r0) * K, lane, 32);
                l2_prefetch_range(w + (long)(N / 2 + r0) * K, 2L * (r1 - r0) * K, lane, 32);
            }
        } else {
            int r0 = vb0 * LIN_COLS, r1 = min(N, r0 + LIN_COLS * MC);
            if (r1 > r0)
                l2_prefetch_range(w + (long)r0 * K, 2L * (r1 - r0) * K, lane, 32);
        }
    }
    long xstride = SWIGLU ? 2L * K : (long)K;
    const bf16 *xr[NT];
    int x_ok[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        int r = 8 * j + g;
        x_ok[j] = r < T;
        xr[j] = x + (long)min(r, T - 1) * xstride;
    }
    float acc[MC][NT][4];
#pragma unroll
    for (int m = 0; m < MC; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
            acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.0f;
    int nchunks = (K + LIN_CHUNK - 1) / LIN_CHUNK;
    uint4 a_lo[MC][U], a_hi[MC][U];
#pragma unroll
    for (int m = 0; m < MC; m++)
        lin_load_w<U, WARPS>(a_lo[m], a_hi[m], wlo[m], whi[m], wlo_ok[m], whi_ok[m], warp, nchunks, K, t, vec);
    if (PDL)
        pdl_wait();
    for (int c0 = warp; c0 < nchunks; c0 += STEP) {
        uint4 b[U][NT], n_lo[MC][U], n_hi[MC][U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = c0 + u * WARPS;
            int k = c * LIN_CHUNK + 8 * t, left = c < nchunks ? K - k : 0;
#pragma unroll
            for (int j = 0; j < NT; j++)
                b[u][j] = load_x8<SWIGLU>(xr[j], K, k, vec, x_ok[j] ? left : 0);
        }
        if (PF)
#pragma unroll
            for (int m = 0; m < MC; m++)
                lin_load_w<U, WARPS>(n_lo[m], n_hi[m], wlo[m], whi[m], wlo_ok[m], whi_ok[m], c0 + STEP, nchunks, K, t,
                                     vec);
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (c0 + u * WARPS >= nchunks)
                break; /* the same for every lane and every T */
#pragma unroll
            for (int m = 0; m < MC; m++)
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    mma_bf16(acc[m][j], a_lo[m][u].x, a_hi[m][u].x, a_lo[m][u].y, a_hi[m][u].y, b[u][j].x, b[u][j].y);
                    mma_bf16(acc[m][j], a_lo[m][u].z, a_hi[m][u].z, a_lo[m][u].w, a_hi[m][u].w, b[u][j].z, b[u][j].w);
                }
        }
        if (PF) {
#pragma unroll
            for (int m = 0; m < MC; m++)
#pragma unroll
                for (int u = 0; u < U; u++)
                    a_lo[m][u] = n_lo[m][u], a_hi[m][u] = n_hi[m][u];
        } else if (c0 + STEP < nchunks) {
#pragma unroll
            for (int m = 0; m < MC; m++)
                lin_load_w<U, WARPS>(a_lo[m], a_hi[m], wlo[m], whi[m], wlo_ok[m], whi_ok[m], c0 + STEP, nchunks, K, t,
                                     vec);
        }
    }
    /* acc[m][j]: [0], [1] = (column g of tile m, rows 8j+2t, 8j+2t+1); [2], [3] = column g+8.
     * The warps' sums go through shared memory RG row groups at a time (all of them, or
     * half when they would not fit in 32 KB: 64 rows at 16 warps), each pass reducing and
     * writing its rows; a row's sums are added in warp order whichever pass it is in. */
    const int n0 = blockIdx.x * MC * LIN_COLS; /* the block's columns n0 .. n0 + 16 MC - 1 */
#pragma unroll
    for (int p = 0; p < NT / RG; p++) {
        if (p)
            __syncthreads(); /* the previous pass has read red */
#pragma unroll
        for (int m = 0; m < MC; m++)
#pragma unroll
            for (int j = 0; j < RG; j++) {
                red[warp][16 * m + g][8 * j + 2 * t] = acc[m][p * RG + j][0];
                red[warp][16 * m + g][8 * j + 2 * t + 1] = acc[m][p * RG + j][1];
                red[warp][16 * m + g + 8][8 * j + 2 * t] = acc[m][p * RG + j][2];
                red[warp][16 * m + g + 8][8 * j + 2 * t + 1] = acc[m][p * RG + j][3];
            }
        __syncthreads();
        const int r0 = 8 * RG * p, nr = min(T - r0, 8 * RG); /* this pass's rows r0 .. r0 + nr - 1 */
        if (nr > 0)
            lin_epilogue<WARPS, MC, 8 * RG>(red, out, out_f32, bias, N, n0, r0, nr, e);
    }
    if (e.mode == LIN_EPI_ARGMAX && lin_last_block(e.sync) && threadIdx.x < (unsigned)T) {
        /* the last block hands out the rows' indices (and clears the keys for the next call) */
        unsigned long long *keys = reinterpret_cast<unsigned long long *>(e.sync + 2);
        unsigned long long k = atomicExch(keys + threadIdx.x, 0ull);
        e.idx[threadIdx.x] = k ? 0x7fffffff - (int)(unsigned)(k & 0xffffffffu) : 0;
    }
    if (e.mode == LIN_EPI_RESID && lin_last_block(e.sync))
        lin_tail_norm(e, reinterpret_cast<const float *>(out), T, N);
    if (e.mode == LIN_EPI_QK && lin_last_block(e.sync)) {
        int nh = e.H + 2 * e.KV;
        long r0 = base_of(e.base, e.p0);
        for (int item = warp; item < T * nh; item += WARPS) {
            int tt = item / nh;
            qk_item<true>(reinterpret_cast<bf16 *>(out), e.q_norm, e.k_norm, e.inv_freq, e.kc, e.vc, e.H, e.KV, e.hd,
                          e.eps, r0 + tt, r0 + tt, tt, item - tt * nh, lane);
        }
    }
}

/* One launch of NT row groups (T <= 8 * NT), with the PDL attribute when asked. */
template <int NT, bool SWIGLU, int WARPS, bool PF, bool PDL, int MC = 1>
static cudaError_t lin_launch_nt(void *out, int out_f32, const bf16 *x, const bf16 *w, const bf16 *b, int T, int K,
                                 int N, int vec, const lin_epi &e, cudaStream_t s)
{
    cudaLaunchConfig_t cfg = {};
    int tiles = (N + LIN_COLS - 1) / LIN_COLS; /* (GLU: N = 2I, I / 8 tiles) */
    cfg.gridDim = dim3((unsigned)((tiles + MC - 1) / MC));
    cfg.blockDim = dim3(WARPS * 32);
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    if (PDL) {
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at, cfg.numAttrs = 1;
    }
    return cudaLaunchKernelEx(&cfg, decode_linear_mma_kernel<NT, SWIGLU, WARPS, PF, PDL, MC>, out, out_f32, x, w, b, T,
                              K, N, vec, e);
}

/* The launches of one variant: every row count in one call, so the weights are read once
 * (33..64 rows at 16 warps reduce in two passes of 32 rows: decode_linear_mma_kernel). */
template <bool SWIGLU, int WARPS, bool PF, bool PDL>
static cudaError_t lin_launch_rows(void *out, int out_f32, const bf16 *x, const bf16 *w, const bf16 *b, int T, int K,
                                   int N, int vec, const lin_epi &ep, cudaStream_t s)
{
    if (T <= 8) {
        /* two column tiles a block (decode_linear_cols_cuda 3): 16 warps (one block an SM), when
         * one tile a block would take more than one wave of blocks */
        if (WARPS == 16 && !SWIGLU && !PF && g_lin_cols >= 3 && (N + LIN_COLS - 1) / LIN_COLS > lin_sm_count())
            return lin_launch_nt < 1, SWIGLU, WARPS, PF, PDL,
                   (WARPS == 16 && !SWIGLU && !PF) ? 2 : 1 > (out, out_f32, x, w, b, T, K, N, vec, ep, s);
        return lin_launch_nt<1, SWIGLU, WARPS, PF, PDL>(out, out_f32, x, w, b, T, K, N, vec, ep, s);
    }
    if (T <= 16) {
        /* two column tiles a block (decode_linear_cols_cuda 4): 16 warps, more tiles than SMs */
        if (WARPS == 16 && !SWIGLU && !PF && g_lin_cols >= 4 && (N + LIN_COLS - 1) / LIN_COLS > lin_sm_count())
            return lin_launch_nt < 2, SWIGLU, WARPS, PF, PDL,
                   (WARPS == 16 && !SWIGLU && !PF) ? 2 : 1 > (out, out_f32, x, w, b, T, K, N, vec, ep, s);
        /* two column tiles a block (decode_linear_cols_cuda): 8 warps, wide shapes, n_in >= 4096
         * (measured slower at 2048), 9..16 rows */
        if (WARPS == 8 && !SWIGLU && T > 8 && g_lin_cols >= 2 && K >= 4096 &&
            (N + LIN_COLS - 1) / LIN_COLS >= LIN_AUTO_BLOCKS)
            return lin_launch_nt < 2, SWIGLU, WARPS, PF, PDL,
                   (WARPS == 8 && !SWIGLU) ? 2 : 1 > (out, out_f32, x, w, b, T, K, N, vec, ep, s);
        return lin_launch_nt<2, SWIGLU, WARPS, PF, PDL>(out, out_f32, x, w, b, T, K, N, vec, ep, s);
    }
    if (T <= 32)
        return lin_launch_nt<4, SWIGLU, WARPS, PF, PDL>(out, out_f32, x, w, b, T, K, N, vec, ep, s);
    return lin_launch_nt<8, SWIGLU, WARPS, PF, PDL>(out, out_f32, x, w, b, T, K, N, vec, ep, s);
}

/* PDL needs compute capability 9.0 (else the variant runs as a plain launch). */
static int lin_pdl_ok(void)
{
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev))
        return cudaGetLastError(), 0;
    return major >= 9;
}

template <bool SWIGLU>
static cudaError_t launch_linear(void *out, int out_f32, const bf16 *x, const bf16 *w, const bf16 *b, int T, int K,
                                 int N, int vec, cudaStream_t s, const lin_epi &ep = lin_epi())
{
    const lin_variant *v = &LIN_VARIANTS[g_lin_variant];
    int narrow = (N + LIN_COLS - 1) / LIN_COLS < LIN_AUTO_BLOCKS; /* a function of n_out alone */
    if (!v->warps)                                                /* auto */
        v = &LIN_VARIANTS[narrow ? LIN_AUTO_NARROW : LIN_AUTO_WIDE];
    lin_variant tv;
    if (v->warps < 0 || v->pf < 0) { /* warps by shape (tuned), the prefetch by rows */
        tv = *v;
        if (tv.warps < 0)
            tv.warps = narrow ? 16 : 8;
        /* the prefetch (the same bits) above 8 rows at 8 warps; at 16 warps it changed
         * nothing at 64 rows (docs/decode_cuda.md, "Batches: the 64-row verify") */
        tv.pf = tv.warps == 8 && T > 8;
        v = &tv;
    }
    int pdl = v->pdl && lin_pdl_ok();
    lin_epi e = ep;
    e.l2pf = g_lin_l2pf && lin_pdl_ok(); /* (the bulk prefetch is sm_90) */
#define LIN_CASE(W, PF, PDL)                        \
    if (v->warps == W && v->pf == PF && pdl == PDL) \
        return lin_launch_rows<SWIGLU, W, PF, PDL>(out, out_f32, x, w, b, T, K, N, vec, e, s);
    LIN_CASE(8, 0, 0)
    LIN_CASE(8, 1, 0)
    LIN_CASE(16, 1, 0)
    LIN_CASE(8, 1, 1)
    LIN_CASE(16, 1, 1)
    LIN_CASE(16, 0, 1)
    LIN_CASE(16, 0, 0)
    LIN_CASE(8, 0, 1)
#undef LIN_CASE
    return cudaErrorInvalidConfiguration; /* a variant without a case: a bug here */
}

/* A failed launch of the linear kernel: -EIO, err names the function, the variant and why. */
static int linear_launch_failed(cudaError_t e, const char *fn, char *err, size_t errlen)
{
    cudaGetLastError(); /* clear it */
    if (err && errlen)
        snprintf(err, errlen, "%s: launch (%s): %s", fn, LIN_VARIANTS[g_lin_variant].name, cudaGetErrorString(e));
    return -EIO;
}

int decode_linear_rows_cuda(void *out, int out_f32, const nn_bf16_cuda *x, const nn_bf16_cuda *w,
                            const nn_bf16_cuda *bias, int T, int n_in, int n_out, cudaStream_t s, char *err,
                            size_t errlen)
{
    if (T < 0 || T > DECODE_LINEAR_MAX_ROWS || n_in <= 0 || n_out <= 0 || !out || !x || !w || out_f32 < 0 ||
        out_f32 > 2)
        BAD_SHAPE("decode_linear_rows_cuda: %d rows (at most %d), %d -> %d", T, DECODE_LINEAR_MAX_ROWS, n_in, n_out);
    if (T == 0)
        return 0;
    /* 16-byte loads need every row start 16-byte aligned; the choice depends on the
     * shapes and base pointers only, never on T, and both paths load the same values */
    int vec = n_in % 8 == 0 && ((uintptr_t)x % 16) == 0 && ((uintptr_t)w % 16) == 0;
    cudaError_t e = launch_linear<false>(out, out_f32, as_bf(x), as_bf(w), as_bf(bias), T, n_in, n_out, vec, s);
    if (e != cudaSuccess)
        return linear_launch_failed(e, "decode_linear_rows_cuda", err, errlen);
    CUDA_LAUNCHED("decode_linear_mma_kernel", err, errlen);
    return 0;
}

int decode_linear_swiglu_rows_cuda(void *out, int out_f32, const nn_bf16_cuda *gu, const nn_bf16_cuda *w,
                                   const nn_bf16_cuda *bias, int T, int I, int n_out, cudaStream_t s, char *err,
                                   size_t errlen)
{
    if (T < 0 || T > DECODE_LINEAR_MAX_ROWS || I <= 0 || n_out <= 0 || !out || !gu || !w || out_f32 < 0 || out_f32 > 2)
        BAD_SHAPE("decode_linear_swiglu_rows_cuda: %d rows (at most %d), %d -> %d", T, DECODE_LINEAR_MAX_ROWS, I,
                  n_out);
    if (T == 0)
        return 0;
    int vec = I % 8 == 0 && ((uintptr_t)gu % 16) == 0 && ((uintptr_t)w % 16) == 0;
    cudaError_t e = launch_linear<true>(out, out_f32, as_bf(gu), as_bf(w), as_bf(bias), T, I, n_out, vec, s);
    if (e != cudaSuccess)
        return linear_launch_failed(e, "decode_linear_swiglu_rows_cuda", err, errlen);
    CUDA_LAUNCHED("decode_linear_mma_kernel (swiglu)", err, errlen);
    return 0;
}

/* Rows of the fused epilogues (one launch of at most 4 row groups: never split). */
#define LIN_EPI_MAX_ROWS DECODE_EPI_MAX_ROWS

int decode_linear_glu_rows_cuda(nn_bf16_cuda *h, const nn_bf16_cuda *x, const nn_bf16_cuda *w_gu,
                                const nn_bf16_cuda *b_gu, int T, int n_in, int I, cudaStream_t s, char *err,
                                size_t errlen)
{
    if (T < 0 || T > LIN_EPI_MAX_ROWS || n_in <= 0 || I <= 0 || I % 8 || !h || !x || !w_gu)
        BAD_SHAPE("decode_linear_glu_rows_cuda: %d rows (at most %d), %d -> 2 x %d (a multiple of 8)", T,
                  LIN_EPI_MAX_ROWS, n_in, I);
    if (T == 0)
        return 0;
    int vec = n_in % 8 == 0 && ((uintptr_t)x % 16) == 0 && ((uintptr_t)w_gu % 16) == 0;
    lin_epi ep = lin_epi();
    ep.mode = LIN_EPI_GLU;
    cudaError_t e = launch_linear<false>(h, 0, as_bf(x), as_bf(w_gu), as_bf(b_gu), T, n_in, 2 * I, vec, s, ep);
    if (e != cudaSuccess)
        return linear_launch_failed(e, "decode_linear_glu_rows_cuda", err, errlen);
    CUDA_LAUNCHED("decode_linear_mma_kernel (glu)", err, errlen);
    return 0;
}

/* nn_add_rmsnorm_cuda's thread count and vector choice for these pointers (rmsnorm.cu),
 * y taken as aligned (a cudaMalloc'd row buffer). */
static void tail_shape(lin_epi *ep, int d, const float *x, const float *w, const void *out, const void *cap,
                       long cap_stride)
{
    ep->nthr = d >= 2048 ? 256 : (d >= 512 ? 128 : 64);
    ep->vec = d % 4 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)w % 16 == 0 && (uintptr_t)out % 8 == 0 &&
              (uintptr_t)cap % 8 == 0 && cap_stride % 4 == 0;
}

int decode_linear_residual_rows_cuda(float *x, const nn_bf16_cuda *in, const nn_bf16_cuda *w, const nn_bf16_cuda *bias,
                                     int T, int n_in, int n_out, const decode_norm_tail *tail, cudaStream_t s,
                                     char *err, size_t errlen)
{
    if (T < 0 || T > LIN_EPI_MAX_ROWS || n_in <= 0 || n_out <= 0 || !x || !in || !w || !tail || !tail->sync ||
        (!tail->norm_w) != (!tail->norm_out) || tail->norm_row0 < 0 || tail->norm_row0 > T ||
        (tail->capture && tail->cap_stride < n_out))
        BAD_SHAPE("decode_linear_residual_rows_cuda: %d rows (at most %d), %d -> %d, norm %s from row %d, capture "
                  "stride %ld",
                  T, LIN_EPI_MAX_ROWS, n_in, n_out, tail && tail->norm_w ? "on" : "off", tail ? tail->norm_row0 : -1,
                  tail ? tail->cap_stride : 0L);
    if (T == 0)
        return 0;
    int vec = n_in % 8 == 0 && ((uintptr_t)in % 16) == 0 && ((uintptr_t)w % 16) == 0;
    lin_epi ep = lin_epi();
    ep.mode = LIN_EPI_RESID;
    ep.norm_w = tail->norm_w, ep.norm_out = as_bf(tail->norm_out), ep.norm_row0 = tail->norm_row0;
    ep.cap = as_bf(tail->capture), ep.cap_stride = tail->cap_stride, ep.eps = tail->eps, ep.sync = tail->sync;
    /* the order of the nn_add_rmsnorm_cuda call this replaces: with the capture when the
     * norm starts at row 0 (one call), else the norm's own call on rows norm_row0.. */
    if (tail->norm_row0 == 0)
        tail_shape(&ep, n_out, x, tail->norm_w, tail->norm_out, tail->capture, tail->capture ? tail->cap_stride : 0);
    else
        tail_shape(&ep, n_out, x + (size_t)tail->norm_row0 * n_out, tail->norm_w, tail->norm_out, NULL, 0);
    cudaError_t e = launch_linear<false>(x, 2, as_bf(in), as_bf(w), as_bf(bias), T, n_in, n_out, vec, s, ep);
    if (e != cudaSuccess)
        return linear_launch_failed(e, "decode_linear_residual_rows_cuda", err, errlen);
    CUDA_LAUNCHED("decode_linear_mma_kernel (residual + norm)", err, errlen);
    return 0;
}

int decode_linear_argmax_rows_cuda(float *logits, int32_t *idx, const nn_bf16_cuda *x, const nn_bf16_cuda *w, int T,
                                   int n_in, int n_out, int32_t *sync, cudaStream_t s, char *err, size_t errlen)
{
    if (T < 0 || T > LIN_EPI_MAX_ROWS || n_in <= 0 || n_out <= 0 || !logits || !idx || !x || !w || !sync)
        BAD_SHAPE("decode_linear_argmax_rows_cuda: %d rows (at most %d), %d -> %d", T, LIN_EPI_MAX_ROWS, n_in, n_out);
    if (T == 0)
        return 0;
    int vec = n_in % 8 == 0 && ((uintptr_t)x % 16) == 0 && ((uintptr_t)w % 16) == 0;
    lin_epi ep = lin_epi();
    ep.mode = LIN_EPI_ARGMAX;
    ep.sync = sync, ep.idx = idx;
    cudaError_t e = launch_linear<false>(logits, 1, as_bf(x), as_bf(w), NULL, T, n_in, n_out, vec, s, ep);
    if (e != cudaSuccess)
        return linear_launch_failed(e, "decode_linear_argmax_rows_cuda", err, errlen);
    CUDA_LAUNCHED("decode_linear_mma_kernel (argmax)", err, errlen);
    return 0;
}

int decode_linear_qk_rows_cuda(nn_bf16_cuda *qkv, const nn_bf16_cuda *x, const nn_bf16_cuda *w,
                               const nn_bf16_cuda *bias, int T, int n_in, const decode_qk_tail *qk, cudaStream_t s,
                               char *err, size_t errlen)
{
    int H = qk ? qk->H : 0, KV = qk ? qk->KV : 0, hd = qk ? qk->hd : 0;
    if (T < 0 || T > LIN_EPI_MAX_ROWS || n_in <= 0 || !qkv || !x || !w || !qk || !qk->sync || H <= 0 || KV <= 0 ||
        hd <= 0 || hd % 2 || hd > 2 * 32 * QKR_MAX_PAIRS || qk->p0 < 0 || (!qk->q_norm) != (!qk->k_norm))
        BAD_SHAPE("decode_linear_qk_rows_cuda: %d rows (at most %d), %d -> heads %d/%d of %d", T, LIN_EPI_MAX_ROWS,
                  n_in, H, KV, hd);
    if (T == 0)
        return 0;
    int N = (H + 2 * KV) * hd;
    int vec = n_in % 8 == 0 && ((uintptr_t)x % 16) == 0 && ((uintptr_t)w % 16) == 0;
    lin_epi ep = lin_epi();
    ep.mode = LIN_EPI_QK;
    ep.sync = qk->sync, ep.eps = qk->eps;
    ep.q_norm = qk->q_norm, ep.k_norm = qk->k_norm, ep.inv_freq = qk->inv_freq;
    ep.kc = as_bf(qk->kc), ep.vc = as_bf(qk->vc), ep.H = H, ep.KV = KV, ep.hd = hd, ep.p0 = qk->p0, ep.base = qk->base;
    cudaError_t e = launch_linear<false>(qkv, 0, as_bf(x), as_bf(w), as_bf(bias), T, n_in, N, vec, s, ep);
    if (e != cudaSuccess)
        return linear_launch_failed(e, "decode_linear_qk_rows_cuda", err, errlen);
    CUDA_LAUNCHED("decode_linear_mma_kernel (q/k norm + rope + append)", err, errlen);
    return 0;
}

/* ---- q/k norm + RoPE + cache append ---------------------------------------------------- */

/* One warp per (row t, head h) of the H + 2KV heads (qk_item). */
__global__ void decode_qk_norm_rope_append_kernel(bf16 *__restrict__ qkv, const float *__restrict__ q_norm,
                                                  const float *__restrict__ k_norm, const float *__restrict__ inv_freq,
                                                  bf16 *__restrict__ kc, bf16 *__restrict__ vc, int T, int H, int KV,
                                                  int hd, float eps, const int32_t *__restrict__ base, int p0)
{
    pdl_launch_dependents(); /* attention after us may launch now */
    pdl_wait();              /* (a PDL launch: the qkv projection ahead is done) */
    int warps = blockDim.x >> 5, lane = threadIdx.x & 31;
    long item = (long)blockIdx.x * warps + (threadIdx.x >> 5);
    int nh = H + 2 * KV;
    if (item >= (long)T * nh)
        return;
    int t = (int)(item / nh), h = (int)(item - (long)t * nh);
    long r = base_of(base, p0) + t;
    qk_item<false>(qkv, q_norm, k_norm, inv_freq, kc, vc, H, KV, hd, eps, r, r, t, h, lane);
}

/* The same with row t at position pos[t] and cache row crow[t] (a batch of sequences). */
__global__ void decode_qk_norm_rope_append_rows_kernel(bf16 *__restrict__ qkv, const float *__restrict__ q_norm,
                                                       const float *__restrict__ k_norm,
                                                       const float *__restrict__ inv_freq, bf16 *__restrict__ kc,
                                                       bf16 *__restrict__ vc, int T, int H, int KV, int hd, float eps,
                                                       const int32_t *__restrict__ pos,
                                                       const int32_t *__restrict__ crow)
{
    pdl_launch_dependents();
    pdl_wait();
    int warps = blockDim.x >> 5, lane = threadIdx.x & 31;
    long item = (long)blockIdx.x * warps + (threadIdx.x >> 5);
    int nh = H + 2 * KV;
    if (item >= (long)T * nh)
        return;
    int t = (int)(item / nh), h = (int)(item - (long)t * nh);
    qk_item<false>(qkv, q_norm, k_norm, inv_freq, kc, vc, H, KV, hd, eps, pos[t], crow[t], t, h, lane);
}

int decode_qk_norm_rope_append_cuda(nn_bf16_cuda *qkv, const float *q_norm, const float *k_norm, const float *inv_freq,
                                    nn_bf16_cuda *kc, nn_bf16_cuda *vc, int T, int H, int KV, int hd, float eps,
                                    const int32_t *base, int p0, cudaStream_t s, char *err, size_t errlen)
{
    if (T < 0 || H <= 0 || KV <= 0 || hd <= 0 || hd % 2 || hd > 2 * 32 * QKR_MAX_PAIRS || p0 < 0 ||
        (!q_norm) != (!k_norm))
        BAD_SHAPE("decode_qk_norm_rope_append_cuda: T %d, heads %d/%d, head_dim %d, p0 %d", T, H, KV, hd, p0);
    if (T == 0)
        return 0;
    long items = (long)T * (H + 2 * KV);
    int warps = 8;
    cudaError_t le = launch_maybe_pdl(decode_qk_norm_rope_append_kernel, dim3((unsigned)((items + warps - 1) / warps)),
                                      dim3(warps * 32), s, g_pdl_small, as_bf(qkv), q_norm, k_norm, inv_freq, as_bf(kc),
                                      as_bf(vc), T, H, KV, hd, eps, base, p0);
    if (le != cudaSuccess) {
        cudaGetLastError();
        BAD_LAUNCH("decode_qk_norm_rope_append_kernel", le);
    }
    CUDA_LAUNCHED("decode_qk_norm_rope_append_kernel", err, errlen);
    return 0;
}

int decode_qk_norm_rope_append_rows_cuda(nn_bf16_cuda *qkv, const float *q_norm, const float *k_norm,
                                         const float *inv_freq, nn_bf16_cuda *kc, nn_bf16_cuda *vc, int T, int H,
                                         int KV, int hd, float eps, const int32_t *pos, const int32_t *crow,
                                         cudaStream_t s, char *err, size_t errlen)
{
    if (T < 0 || H <= 0 || KV <= 0 || hd <= 0 || hd % 2 || hd > 2 * 32 * QKR_MAX_PAIRS || !pos || !crow ||
        (!q_norm) != (!k_norm))
        BAD_SHAPE("decode_qk_norm_rope_append_rows_cuda: T %d, heads %d/%d, head_dim %d", T, H, KV, hd);
    if (T == 0)
        return 0;
    long items = (long)T * (H + 2 * KV);
    int warps = 8;
    cudaError_t le = launch_maybe_pdl(
        decode_qk_norm_rope_append_rows_kernel, dim3((unsigned)((items + warps - 1) / warps)), dim3(warps * 32), s,
        g_pdl_small, as_bf(qkv), q_norm, k_norm, inv_freq, as_bf(kc), as_bf(vc), T, H, KV, hd, eps, pos, crow);
    if (le != cudaSuccess) {
        cudaGetLastError();
        BAD_LAUNCH("decode_qk_norm_rope_append_rows_kernel", le);
    }
    CUDA_LAUNCHED("decode_qk_norm_rope_append_rows_kernel", err, errlen);
    return 0;
}

/* ---- argmax -------------------------------------------------------------------------- */

#define ARGMAX_THREADS 1024

/* One block per row; thread i scans v = i, i + 1024, ... (4 values per 16-byte load when
 * V % 4 == 0), then a fixed tree: the first index of the maximum. */
__global__ void __launch_bounds__(ARGMAX_THREADS) decode_argmax_kernel(int32_t *idx, const float *logits, int V)
{
    __shared__ float bv[ARGMAX_THREADS];
    __shared__ int bi[ARGMAX_THREADS];
    const float *row = logits + (long)blockIdx.x * V;
    float best = -INFINITY;
    int at = V; /* V: nothing seen (all -inf or NaN) */
    if (V % 4 == 0 && ((uintptr_t)row % 16) == 0) {
        const float4 *r4 = reinterpret_cast<const float4 *>(row);
        int n4 = V / 4;
        for (int b4 = threadIdx.x; b4 < n4; b4 += 4 * blockDim.x) { /* 4 loads in flight, visited in order */
            float4 x[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int v4 = b4 + u * blockDim.x;
                x[u] = v4 < n4 ? r4[v4] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int v4 = b4 + u * blockDim.x;
                if (v4 >= n4)
                    break;
                float e[4] = {x[u].x, x[u].y, x[u].z, x[u].w};
#pragma unroll
                for (int j = 0; j < 4; j++)
                    if (e[j] > best || (at == V && e[j] == best))
                        best = e[j], at = 4 * v4 + j;
            }
        }
    } else {
        for (int v = threadIdx.x; v < V; v += blockDim.x) {
            float x = row[v];
            if (x > best || (at == V && x == best)) /* strictly greater: the first of equals stays */
                best = x, at = v;
        }
    }
    bv[threadIdx.x] = best, bi[threadIdx.x] = at;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half >>= 1) {
        if ((int)threadIdx.x < half) {
            float ov = bv[threadIdx.x + half];
            int oi = bi[threadIdx.x + half];
            if (oi < V && (ov > bv[threadIdx.x] || (ov == bv[threadIdx.x] && oi < bi[threadIdx.x])))
                bv[threadIdx.x] = ov, bi[threadIdx.x] = oi;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0)
        idx[blockIdx.x] = bi[0] < V ? bi[0] : 0;
}

#define ARGMAX_SPLIT 32 /* blocks per row of decode_argmax_split_rows_cuda */
#define ARGMAX_SPLIT_THREADS 256

/* Block (part, row) scans its slice of the row (4 loads in flight a thread) into one
 * argmax_key, the block's best by a key maximum, one atomicMax per block; the last block
 * of the grid hands out the indices and zeroes the keys and the counter. */
__global__ void __launch_bounds__(ARGMAX_SPLIT_THREADS)
    decode_argmax_split_kernel(int32_t *idx, const float *__restrict__ logits, int V, int *sync)
{
    __shared__ unsigned long long best[ARGMAX_SPLIT_THREADS / 32];
    pdl_wait(); /* (a PDL launch: the lm_head ahead is done) */
    unsigned long long *keys = reinterpret_cast<unsigned long long *>(sync + 2);
    int row = blockIdx.y, per = (V + gridDim.x - 1) / gridDim.x, lo = blockIdx.x * per, hi = min(V, lo + per);
    const float *r = logits + (size_t)row * V;
    unsigned long long key = 0ull;
    for (int v0 = lo + threadIdx.x; v0 < hi; v0 += 4 * blockDim.x) {
        float x[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int v = v0 + u * blockDim.x;
            x[u] = v < hi ? r[v] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int v = v0 + u * blockDim.x;
            if (v < hi) {
                unsigned long long k = argmax_key(x[u], v);
                key = k > key ? k : key;
            }
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        unsigned long long k2 = __shfl_xor_sync(0xffffffffu, key, o);
        key = k2 > key ? k2 : key;
    }
    if ((threadIdx.x & 31) == 0)
        best[threadIdx.x >> 5] = key;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            key = best[w] > key ? best[w] : key;
        if (key)
            atomicMax(keys + row, key);
    }
    __threadfence();
    __syncthreads();
    __shared__ int last;
    if (threadIdx.x == 0) {
        last = atomicAdd(sync, 1) == (int)(gridDim.x * gridDim.y) - 1;
        if (last)
            *sync = 0;
    }
    __syncthreads();
    if (last && threadIdx.x < gridDim.y) {
        __threadfence();
        unsigned long long k = atomicExch(keys + threadIdx.x, 0ull);
        idx[threadIdx.x] = k ? 0x7fffffff - (int)(unsigned)(k & 0xffffffffu) : 0;
    }
}

int decode_argmax_split_rows_cuda(int32_t *idx, const float *logits, int rows, int V, int32_t *sync, cudaStream_t s,
                                  char *err, size_t errlen)
{
    if (rows < 0 || rows > DECODE_EPI_MAX_ROWS || V <= 0 || !sync)
        BAD_SHAPE("decode_argmax_split_rows_cuda: %d rows (at most %d) of %d", rows, DECODE_EPI_MAX_ROWS, V);
    if (rows == 0)
        return 0;
    cudaError_t le = launch_maybe_pdl(decode_argmax_split_kernel, dim3(ARGMAX_SPLIT, (unsigned)rows),
                                      dim3(ARGMAX_SPLIT_THREADS), s, g_pdl_small, idx, logits, V, (int *)sync);
    if (le != cudaSuccess) {
        cudaGetLastError();
        BAD_LAUNCH("decode_argmax_split_kernel", le);
    }
    CUDA_LAUNCHED("decode_argmax_split_kernel", err, errlen);
    return 0;
}

int decode_argmax_rows_cuda(int32_t *idx, const float *logits, int rows, int V, cudaStream_t s, char *err,
                            size_t errlen)
{
    if (rows < 0 || V <= 0)
        BAD_SHAPE("decode_argmax_rows_cuda: %d rows of %d", rows, V);
    if (rows == 0)
        return 0;
    decode_argmax_kernel<<<rows, ARGMAX_THREADS, 0, s>>>(idx, logits, V);
    CUDA_LAUNCHED("decode_argmax_kernel", err, errlen);
    return 0;
}
