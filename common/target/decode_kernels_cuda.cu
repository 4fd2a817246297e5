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
#define ATTW_KEYS 4  /* keys a warp scores together (independent loads and shuffles in flight) */

/* hd = 32 * DPL. Lane l owns dims l*DPL .. l*DPL+DPL-1. Warp w takes the key groups
 * g = w, w + 8, ... (ATTW_KEYS consecutive allowed keys each), keeping its own running
 * max m, sum l and accumulators; then the warps merge in order 0..7. The split depends on
 * the number of allowed keys only. */
template <int DPL>
__global__ void __launch_bounds__(ATTW_WARPS * 32)
    decode_attention_warps_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ q, long q_stride,
                                  const bf16 *__restrict__ kc, const bf16 *__restrict__ vc,
                                  const nn_key_ranges *__restrict__ ranges, const int32_t *__restrict__ base, int p0,
                                  int window, int H, int KV, float scale)
{
    constexpr int hd = 32 * DPL;
    __shared__ float sm_m[ATTW_WARPS], sm_l[ATTW_WARPS];
    __shared__ float sm_acc[ATTW_WARPS][hd];
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
    for (int g0 = warp * ATTW_KEYS; g0 < n; g0 += ATTW_WARPS * ATTW_KEYS) {
        float sc[ATTW_KEYS];
        int key[ATTW_KEYS];
#pragma unroll
        for (int j = 0; j < ATTW_KEYS; j++) {
            int jj = g0 + j;
            key[j] = jj < n ? (jj < n0 ? lo0 + jj : lo1 + (jj - n0)) : -1;
            float dot = 0.0f;
            if (key[j] >= 0) {
                const bf16 *kr = kb + key[j] * kvd;
#pragma unroll
                for (int i = 0; i < DPL; i++)
                    dot = fmaf(qf[i], __bfloat162float(kr[i]), dot);
            }
            sc[j] = dot;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int j = 0; j < ATTW_KEYS; j++)
                sc[j] += __shfl_xor_sync(0xffffffffu, sc[j], o);
        float mx = m_run;
#pragma unroll
        for (int j = 0; j < ATTW_KEYS; j++)
            if (key[j] >= 0)
                mx = fmaxf(mx, sc[j]);
        float corr = expf(m_run - mx); /* 0 on the first group (m_run = -inf) */
        l_run *= corr;
#pragma unroll
        for (int i = 0; i < DPL; i++)
            acc[i] *= corr;
#pragma unroll
        for (int j = 0; j < ATTW_KEYS; j++) {
            if (key[j] < 0)
                continue;
            float p = expf(sc[j] - mx);
            l_run += p;
            const bf16 *vr = vb + key[j] * kvd;
#pragma unroll
            for (int i = 0; i < DPL; i++)
                acc[i] = fmaf(p, __bfloat162float(vr[i]), acc[i]);
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
    for (int w = 0; w < ATTW_WARPS; w++)
        M = fmaxf(M, sm_m[w]);
    bf16 *o = out + ((long)qi * H + h) * hd;
    for (int dim = threadIdx.x; dim < hd; dim += blockDim.x) {
        float L = 0.0f, A = 0.0f;
        for (int w = 0; w < ATTW_WARPS; w++) {
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
    switch (hd) {
    case 32:
        decode_attention_warps_kernel<1>
            <<<grid, ATTW_WARPS * 32, 0, s>>>(oo, qq, q_stride, kk, vv, ranges, base, p0, window, H, KV, scale);
        break;
    case 64:
        decode_attention_warps_kernel<2>
            <<<grid, ATTW_WARPS * 32, 0, s>>>(oo, qq, q_stride, kk, vv, ranges, base, p0, window, H, KV, scale);
        break;
    case 128:
        decode_attention_warps_kernel<4>
            <<<grid, ATTW_WARPS * 32, 0, s>>>(oo, qq, q_stride, kk, vv, ranges, base, p0, window, H, KV, scale);
        break;
    case 256:
        decode_attention_warps_kernel<8>
            <<<grid, ATTW_WARPS * 32, 0, s>>>(oo, qq, q_stride, kk, vv, ranges, base, p0, window, H, KV, scale);
        break;
    default:
        decode_attention_kernel<<<grid, ATT_THREADS, 0, s>>>(oo, qq, q_stride, kk, vv, ranges, base, p0, window, H, KV,
                                                             hd, scale);
    }
    CUDA_LAUNCHED("decode_attention_kernel", err, errlen);
    return 0;
}

/* ---- small-row linear layer on the tensor cores ---------------------------------------- */

#define LIN_WARPS 8  /* warps per block: they split n_in */
#define LIN_COLS 16  /* output columns per block (the m16 of the product) */
#define LIN_CHUNK 32 /* n_in elements per chunk: 8 per lane of a quad, two k16 products */

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

/* Chunks a warp loads before multiplying (bytes in flight); the order in which a warp
 * adds its chunks is w, w+8, ... whatever the unroll, so it may follow NT. Measured on an
 * H200 (docs/eval.md): 4 for every NT; the build may pick others (-DLIN_UNROLL_FOR). */
#ifndef LIN_UNROLL_FOR
#define LIN_UNROLL_FOR(NT, SWIGLU) ((NT) == 8 ? 2 : 4)
#endif
#ifndef LIN_MIN_BLOCKS
#define LIN_MIN_BLOCKS(NT) 1
#endif
template <int NT, bool SWIGLU> struct lin_unroll {
    static constexpr int value = LIN_UNROLL_FOR(NT, SWIGLU);
};

/* NT: 8-row groups of x handled per pass (1, 2, 4 or 8: T <= 8 * NT). Lane (g = lane/4,
 * t = lane%4) loads, per chunk at k, 16 bytes of w rows n0+g and n0+g+8 and of x row
 * 8j+g (group j) at k + 8t: the same k offsets in both operands, so product 1 takes their
 * words 0-1 and product 2 words 2-3 (a fixed permutation of k inside the chunk, the same
 * for w and x: the products summed are w[n,k] x[t,k] over every k once). */
template <int NT, bool SWIGLU>
__global__ void __launch_bounds__(LIN_WARPS * 32, LIN_MIN_BLOCKS(NT))
    decode_linear_mma_kernel(void *__restrict__ out, int out_f32, const bf16 *__restrict__ x,
                             const bf16 *__restrict__ w, const bf16 *__restrict__ bias, int T, int K, int N, int vec)
{
    constexpr int U = lin_unroll<NT, SWIGLU>::value;
    __shared__ float red[LIN_WARPS][LIN_COLS][8 * NT];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    int n0 = blockIdx.x * LIN_COLS;
    int nlo = n0 + g, nhi = n0 + g + 8;
    const bf16 *wlo = w + (long)min(nlo, N - 1) * K, *whi = w + (long)min(nhi, N - 1) * K;
    int wlo_ok = nlo < N, whi_ok = nhi < N;
    long xstride = SWIGLU ? 2L * K : (long)K;
    const bf16 *xr[NT];
    int x_ok[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        int r = 8 * j + g;
        x_ok[j] = r < T;
        xr[j] = x + (long)min(r, T - 1) * xstride;
    }
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    int nchunks = (K + LIN_CHUNK - 1) / LIN_CHUNK;
    for (int c0 = warp; c0 < nchunks; c0 += LIN_WARPS * U) {
        uint4 a_lo[U], a_hi[U], b[U][NT];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = c0 + u * LIN_WARPS;
            int k = c * LIN_CHUNK + 8 * t, left = c < nchunks ? K - k : 0;
            a_lo[u] = load8(wlo + k, vec, wlo_ok ? left : 0);
            a_hi[u] = load8(whi + k, vec, whi_ok ? left : 0);
#pragma unroll
            for (int j = 0; j < NT; j++)
                b[u][j] = load_x8<SWIGLU>(xr[j], K, k, vec, x_ok[j] ? left : 0);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (c0 + u * LIN_WARPS >= nchunks)
                break; /* the same for every lane and every T */
#pragma unroll
            for (int j = 0; j < NT; j++) {
                mma_bf16(acc[j], a_lo[u].x, a_hi[u].x, a_lo[u].y, a_hi[u].y, b[u][j].x, b[u][j].y);
                mma_bf16(acc[j], a_lo[u].z, a_hi[u].z, a_lo[u].w, a_hi[u].w, b[u][j].z, b[u][j].w);
            }
        }
    }
    /* acc[j]: [0], [1] = (column n0+g, rows 8j+2t, 8j+2t+1); [2], [3] = column n0+g+8 */
#pragma unroll
    for (int j = 0; j < NT; j++) {
        red[warp][g][8 * j + 2 * t] = acc[j][0];
        red[warp][g][8 * j + 2 * t + 1] = acc[j][1];
        red[warp][g + 8][8 * j + 2 * t] = acc[j][2];
        red[warp][g + 8][8 * j + 2 * t + 1] = acc[j][3];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < LIN_COLS * T; i += blockDim.x) {
        int col = i % LIN_COLS, row = i / LIN_COLS, n = n0 + col;
        if (n >= N)
            continue;
        float v = red[0][col][row];
#pragma unroll
        for (int ww = 1; ww < LIN_WARPS; ww++)
            v += red[ww][col][row];
        if (bias)
            v += __bfloat162float(bias[n]);
        long o = (long)row * N + n;
        if (out_f32 == 2)
            reinterpret_cast<float *>(out)[o] += v; /* the residual add, in fp32 */
        else if (out_f32)
            reinterpret_cast<float *>(out)[o] = v;
        else
            reinterpret_cast<bf16 *>(out)[o] = __float2bfloat16(v);
    }
}

template <bool SWIGLU>
static void launch_linear(void *out, int out_f32, const bf16 *x, const bf16 *w, const bf16 *b, int T, int K, int N,
                          int vec, cudaStream_t s)
{
    unsigned grid = (unsigned)((N + LIN_COLS - 1) / LIN_COLS);
    if (T <= 8)
        decode_linear_mma_kernel<1, SWIGLU><<<grid, LIN_WARPS * 32, 0, s>>>(out, out_f32, x, w, b, T, K, N, vec);
    else if (T <= 16)
        decode_linear_mma_kernel<2, SWIGLU><<<grid, LIN_WARPS * 32, 0, s>>>(out, out_f32, x, w, b, T, K, N, vec);
    else if (T <= 32)
        decode_linear_mma_kernel<4, SWIGLU><<<grid, LIN_WARPS * 32, 0, s>>>(out, out_f32, x, w, b, T, K, N, vec);
    else
        decode_linear_mma_kernel<8, SWIGLU><<<grid, LIN_WARPS * 32, 0, s>>>(out, out_f32, x, w, b, T, K, N, vec);
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
    launch_linear<false>(out, out_f32, as_bf(x), as_bf(w), as_bf(bias), T, n_in, n_out, vec, s);
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
    launch_linear<true>(out, out_f32, as_bf(gu), as_bf(w), as_bf(bias), T, I, n_out, vec, s);
    CUDA_LAUNCHED("decode_linear_mma_kernel (swiglu)", err, errlen);
    return 0;
}

/* ---- q/k norm + RoPE + cache append ---------------------------------------------------- */

#define QKR_MAX_PAIRS 4 /* hd <= 256 */

/* One warp per (row t, head h) of the H + 2KV heads: q and k heads are RMS-normed
 * (q_norm / k_norm, when given) and rotated exactly as nn_qk_norm_rope_cuda (the same
 * formula and order), at position r = p0 + *base + t; k heads then go to cache row r of
 * kc, v heads are copied to row r of vc. */
__global__ void decode_qk_norm_rope_append_kernel(bf16 *__restrict__ qkv, const float *__restrict__ q_norm,
                                                  const float *__restrict__ k_norm, const float *__restrict__ inv_freq,
                                                  bf16 *__restrict__ kc, bf16 *__restrict__ vc, int T, int H, int KV,
                                                  int hd, float eps, const int32_t *__restrict__ base, int p0)
{
    int warps = blockDim.x >> 5, lane = threadIdx.x & 31;
    long item = (long)blockIdx.x * warps + (threadIdx.x >> 5);
    int nh = H + 2 * KV;
    if (item >= (long)T * nh)
        return;
    int t = (int)(item / nh), h = (int)(item - (long)t * nh);
    long r = base_of(base, p0) + t, kvd = (long)KV * hd;
    bf16 *x = qkv + (size_t)t * nh * hd + (size_t)h * hd;
    if (h >= H + KV) { /* v head: copy */
        bf16 *dst = vc + r * kvd + (long)(h - H - KV) * hd;
        for (int i = lane; i < hd; i += 32)
            dst[i] = x[i];
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
            a[k] = __bfloat162float(x[i]);
            b[k] = __bfloat162float(x[i + half]);
            ss += a[k] * a[k] + b[k] * b[k];
        }
    }
    float rr = 1.0f;
    if (nw)
        rr = rsqrtf(warp_sum(ss) / (float)hd + eps);
    float p = (float)r;
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
            bf16 o1 = __float2bfloat16(u * cs - v * sn), o2 = __float2bfloat16(v * cs + u * sn);
            x[i] = o1, x[i + half] = o2;
            if (kd)
                kd[i] = o1, kd[i + half] = o2;
        }
    }
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
    decode_qk_norm_rope_append_kernel<<<(unsigned)((items + warps - 1) / warps), warps * 32, 0, s>>>(
        as_bf(qkv), q_norm, k_norm, inv_freq, as_bf(kc), as_bf(vc), T, H, KV, hd, eps, base, p0);
    CUDA_LAUNCHED("decode_qk_norm_rope_append_kernel", err, errlen);
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
        for (int v4 = threadIdx.x; v4 < V / 4; v4 += blockDim.x) {
            float4 x = r4[v4];
            float e[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (e[j] > best || (at == V && e[j] == best))
                    best = e[j], at = 4 * v4 + j;
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
