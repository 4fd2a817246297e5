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
#include "nn/nn_cuda_device.cuh"         /* bf16, as_bf, warp_sum / warp_max, block_*_serial */
#include "target/decode_linear_cuda.cuh" /* lin_: the small-row linear kernel */

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

/* The process-wide settings below: *g = v when ok; the previous value either way. */
static int setting(int *g, int v, int ok)
{
    int old = *g;
    if (ok)
        *g = v;
    return old;
}

int decode_pdl_small_cuda(int on)
{
    return setting(&g_pdl_small, on, on == 0 || on == 1);
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

__global__ void decode_positions_kernel(int32_t *pos, const int32_t *base, int p0, int T)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < T)
        pos[i] = base_of(base, p0) + i;
}

int decode_positions_cuda(int32_t *pos, const int32_t *base, int p0, int T, cudaStream_t s, char *err, size_t errlen)
{
    if (T < 0 || p0 < 0)
        return df_err(err, errlen, -EINVAL, "decode_positions_cuda: T %d, p0 %d", T, p0);
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
        return df_err(err, errlen, -EINVAL, "decode_counter_add_cuda: no counter");
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
        return df_err(err, errlen, -EINVAL, "decode_kv_append_cuda: T %d, heads %d/%d, head_dim %d, row %d", T, H, KV,
                      hd, row0);
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
        return df_err(err, errlen, -EINVAL, "decode_kv_append_rows_cuda: T %d, heads %d/%d, head_dim %d", T, H, KV, hd);
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
    return setting(&g_att_warps, warps, warps == 4 || warps == 8 || warps == 16);
}

int decode_attention_keys_cuda(int keys)
{
    return setting(&g_att_keys, keys, keys == 4 || keys == 8 || keys == 16);
}

/* DPL consecutive bf16, one load of 2 * DPL bytes when VEC (p aligned to that), else
 * element loads (the same values). */
/* Where element (row, col) of an output [rows, ncols] goes: row-major (ocr 0), or
 * chunk-major with ocr rows (decode_kernels_cuda.h). */
__device__ __forceinline__ long att_out_index(int row, int col, int ncols, int ocr)
{
    return ocr ? ((long)(col / DECODE_XC_CHUNK) * ocr + row) * DECODE_XC_CHUNK + col % DECODE_XC_CHUNK
               : (long)row * ncols + col;
}

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
                                  int window, int H, int KV, float scale, int ocr)
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
    for (int dim = threadIdx.x; dim < hd; dim += blockDim.x) {
        float L = 0.0f, A = 0.0f;
        for (int w = 0; w < NW; w++) {
            if (sm_m[w] == -INFINITY)
                continue; /* a warp that saw no key */
            float c = expf(sm_m[w] - M);
            L += sm_l[w] * c;
            A += sm_acc[w][dim] * c;
        }
        out[att_out_index(qi, h * hd + dim, H * hd, ocr)] = __float2bfloat16(n > 0 ? A / L : 0.0f);
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
                            int window, int H, int KV, int hd, float scale, int ocr)
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
    if (tid < hd)
        out[att_out_index(qi, h * hd + tid, H * hd, ocr)] = __float2bfloat16(acc0 * inv);
    if (tid + ATT_THREADS < hd)
        out[att_out_index(qi, h * hd + tid + ATT_THREADS, H * hd, ocr)] = __float2bfloat16(acc1 * inv);
}

/* decode_attention_cuda with the output row-major (ocr 0) or chunk-major over ocr = Tq rows. */
static int attention(const char *fn, nn_bf16_cuda *out, const nn_bf16_cuda *q, long q_stride, const nn_bf16_cuda *kc,
                     const nn_bf16_cuda *vc, const nn_key_ranges *ranges, const int32_t *base, int p0, int window,
                     int Tq, int H, int KV, int hd, float scale, int ocr, cudaStream_t s, char *err, size_t errlen)
{
    if (Tq < 0 || H <= 0 || KV <= 0 || H % KV || hd <= 0 || hd % 2 || hd > 2 * ATT_THREADS || p0 < 0 || window < 0 ||
        q_stride < (long)H * hd || (ocr && (H * hd) % DECODE_XC_CHUNK))
        return df_err(err, errlen, -EINVAL, "%s: %d queries, heads %d/%d, head_dim %d, p0 %d, window %d", fn, Tq, H, KV,
                      hd, p0, window);
    if (Tq == 0)
        return 0;
    unsigned grid = (unsigned)((long)Tq * H);
    const bf16 *qq = as_bf(q), *kk = as_bf(kc), *vv = as_bf(vc);
    bf16 *oo = as_bf(out);
    /* one load per key and lane when the rows are aligned to it (the same values either way);
     * dpl: head dims a lane holds in the warp kernels (hd 32..256); below 32 (the generic
     * kernel) there is nothing to align, and hd / 32 = 0 must not be a divisor: a model with
     * head_dim 16 died of SIGFPE here */
    const int dpl = hd / 32;
    int avec = dpl > 0 && ((uintptr_t)q | (uintptr_t)kc | (uintptr_t)vc) % (2 * dpl) == 0 && q_stride % dpl == 0;
    cudaError_t le = cudaSuccess;
#define ATT_NW_LAUNCH(DPL, KEYS, NW)                                                                                   \
    do {                                                                                                               \
        if (avec)                                                                                                      \
            le = launch_maybe_pdl(decode_attention_warps_kernel<DPL, KEYS, true, NW>, dim3(grid), dim3(NW * 32), s,    \
                                  g_pdl_small, oo, qq, q_stride, kk, vv, ranges, base, p0, window, H, KV, scale, ocr); \
        else                                                                                                           \
            le = launch_maybe_pdl(decode_attention_warps_kernel<DPL, KEYS, false, NW>, dim3(grid), dim3(NW * 32), s,   \
                                  g_pdl_small, oo, qq, q_stride, kk, vv, ranges, base, p0, window, H, KV, scale, ocr); \
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
                                                             hd, scale, ocr);
    }
#undef ATT_KEYS_CASE
#undef ATT_KEYS_LAUNCH
#undef ATT_NW_LAUNCH
    if (le != cudaSuccess) {
        cudaGetLastError();
        return df_err(err, errlen, -EIO, "decode_attention_kernel: launch: %s", cudaGetErrorString(le));
    }
    CUDA_LAUNCHED("decode_attention_kernel", err, errlen);
    return 0;
}

int decode_attention_cuda(nn_bf16_cuda *out, const nn_bf16_cuda *q, long q_stride, const nn_bf16_cuda *kc,
                          const nn_bf16_cuda *vc, const nn_key_ranges *ranges, const int32_t *base, int p0, int window,
                          int Tq, int H, int KV, int hd, float scale, cudaStream_t s, char *err, size_t errlen)
{
    return attention("decode_attention_cuda", out, q, q_stride, kc, vc, ranges, base, p0, window, Tq, H, KV, hd, scale,
                     0, s, err, errlen);
}

int decode_attention_xc_cuda(nn_bf16_cuda *out, const nn_bf16_cuda *q, long q_stride, const nn_bf16_cuda *kc,
                             const nn_bf16_cuda *vc, const nn_key_ranges *ranges, const int32_t *base, int p0,
                             int window, int Tq, int H, int KV, int hd, float scale, cudaStream_t s, char *err,
                             size_t errlen)
{
    return attention("decode_attention_xc_cuda", out, q, q_stride, kc, vc, ranges, base, p0, window, Tq, H, KV, hd,
                     scale, Tq, s, err, errlen);
}

/* ---- small-row linear layer on the tensor cores ---------------------------------------- */
/* The kernel, its epilogues and launch templates are in decode_linear_cuda.cuh; here: the
 * variants, the process-wide settings and the choice of launch per call. */

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

int decode_linear_cols_cuda(int tiles)
{
    return setting(&g_lin_cols, tiles, tiles >= 1 && tiles <= 4);
}

#ifndef DECODE_LINEAR_ROWS_BLOCK_DEFAULT
#define DECODE_LINEAR_ROWS_BLOCK_DEFAULT 64
#endif
static int g_lin_rows_blk = DECODE_LINEAR_ROWS_BLOCK_DEFAULT;

int decode_linear_rows_block_cuda(int rows)
{
    return setting(&g_lin_rows_blk, rows, rows == 8 || rows == 16 || rows == 32 || rows == 64);
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
    return setting(&g_lin_variant, v, v >= 0 && v < DECODE_LINEAR_VARIANTS);
}

const char *decode_linear_variant_name_cuda(int v)
{
    return v >= 0 && v < DECODE_LINEAR_VARIANTS ? LIN_VARIANTS[v].name : "?";
}

/* PDL needs compute capability 9.0 (else the variant runs as a plain launch). */
static int lin_pdl_ok(void)
{
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev))
        return cudaGetLastError(), 0;
    return major >= 9;
}

template <bool SWIGLU, bool XC = false>
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
    int pdl = v->pdl && lin_pdl_ok(), sms = lin_sm_count();
#define LIN_CASE(W, PF, PDL)                                                                                \
    if (v->warps == W && v->pf == PF && pdl == PDL)                                                         \
        return lin_launch_rows<SWIGLU, W, PF, PDL, XC>(out, out_f32, x, w, b, T, K, N, vec, ep, g_lin_cols, \
                                                       g_lin_rows_blk, sms, s);
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
        return df_err(err, errlen, -EINVAL, "decode_linear_rows_cuda: %d rows (at most %d), %d -> %d", T,
                      DECODE_LINEAR_MAX_ROWS, n_in, n_out);
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
        return df_err(err, errlen, -EINVAL, "decode_linear_swiglu_rows_cuda: %d rows (at most %d), %d -> %d", T,
                      DECODE_LINEAR_MAX_ROWS, I, n_out);
    if (T == 0)
        return 0;
    int vec = I % 8 == 0 && ((uintptr_t)gu % 16) == 0 && ((uintptr_t)w % 16) == 0;
    cudaError_t e = launch_linear<true>(out, out_f32, as_bf(gu), as_bf(w), as_bf(bias), T, I, n_out, vec, s);
    if (e != cudaSuccess)
        return linear_launch_failed(e, "decode_linear_swiglu_rows_cuda", err, errlen);
    CUDA_LAUNCHED("decode_linear_mma_kernel (swiglu)", err, errlen);
    return 0;
}

/* Rows of the fused epilogues in one launch: up to 64 (8 row groups of 8). They take the
 * plain kernel's row split: at 17..64 rows with decode_linear_rows_block_cuda below 64 a
 * column tile's rows are spread over several blocks (the argmax keys and the GLU output at
 * each block's own rows), and the argmax hand-out, the residual's capture + norm tail and
 * the q/k tail run in the grid's last block (lin_last_block counts every block, those of a
 * split included) over all T rows. */
#define LIN_EPI_MAX_ROWS DECODE_EPI_MAX_ROWS

int decode_linear_glu_rows_cuda(nn_bf16_cuda *h, const nn_bf16_cuda *x, const nn_bf16_cuda *w_gu,
                                const nn_bf16_cuda *b_gu, int T, int n_in, int I, cudaStream_t s, char *err,
                                size_t errlen)
{
    if (T < 0 || T > LIN_EPI_MAX_ROWS || n_in <= 0 || I <= 0 || I % 8 || !h || !x || !w_gu)
        return df_err(err, errlen, -EINVAL,
                      "decode_linear_glu_rows_cuda: %d rows (at most %d), %d -> 2 x %d (a multiple of 8)", T,
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

/* The chunk-major calls (decode_kernels_cuda.h): x 16-byte aligned, n_in % 32 == 0. */
static int xc_ok(const nn_bf16_cuda *x, const nn_bf16_cuda *w, int n_in)
{
    return n_in % DECODE_XC_CHUNK == 0 && ((uintptr_t)x % 16) == 0 && ((uintptr_t)w % 16) == 0;
}

int decode_linear_rows_xc_cuda(void *out, int out_f32, const nn_bf16_cuda *xc, const nn_bf16_cuda *w,
                               const nn_bf16_cuda *bias, int T, int n_in, int n_out, cudaStream_t s, char *err,
                               size_t errlen)
{
    if (T < 0 || T > DECODE_LINEAR_MAX_ROWS || n_in <= 0 || n_out <= 0 || !out || !xc || !w || out_f32 < 0 ||
        out_f32 > 2 || !xc_ok(xc, w, n_in))
        return df_err(
            err, errlen, -EINVAL,
            "decode_linear_rows_xc_cuda: %d rows (at most %d), %d (a multiple of %d, x and w 16-byte aligned) "
            "-> %d",
            T, DECODE_LINEAR_MAX_ROWS, n_in, DECODE_XC_CHUNK, n_out);
    if (T == 0)
        return 0;
    cudaError_t e = launch_linear<false, true>(out, out_f32, as_bf(xc), as_bf(w), as_bf(bias), T, n_in, n_out, 1, s);
    if (e != cudaSuccess)
        return linear_launch_failed(e, "decode_linear_rows_xc_cuda", err, errlen);
    CUDA_LAUNCHED("decode_linear_mma_kernel (chunk-major x)", err, errlen);
    return 0;
}

int decode_linear_glu_rows_xc_cuda(nn_bf16_cuda *hc, const nn_bf16_cuda *xc, const nn_bf16_cuda *w_gu,
                                   const nn_bf16_cuda *b_gu, int T, int n_in, int I, cudaStream_t s, char *err,
                                   size_t errlen)
{
    if (T < 0 || T > LIN_EPI_MAX_ROWS || n_in <= 0 || I <= 0 || I % DECODE_XC_CHUNK || !hc || !xc || !w_gu ||
        !xc_ok(xc, w_gu, n_in))
        return df_err(err, errlen, -EINVAL,
                      "decode_linear_glu_rows_xc_cuda: %d rows (at most %d), %d -> 2 x %d (both multiples of %d, x and "
                      "w 16-byte aligned)",
                      T, LIN_EPI_MAX_ROWS, n_in, I, DECODE_XC_CHUNK);
    if (T == 0)
        return 0;
    lin_epi ep = lin_epi();
    ep.mode = LIN_EPI_GLU;
    ep.out_crow = T;
    cudaError_t e = launch_linear<false, true>(hc, 0, as_bf(xc), as_bf(w_gu), as_bf(b_gu), T, n_in, 2 * I, 1, s, ep);
    if (e != cudaSuccess)
        return linear_launch_failed(e, "decode_linear_glu_rows_xc_cuda", err, errlen);
    CUDA_LAUNCHED("decode_linear_mma_kernel (glu, chunk-major)", err, errlen);
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
        return df_err(err, errlen, -EINVAL,
                      "decode_linear_residual_rows_cuda: %d rows (at most %d), %d -> %d, norm %s from row %d, capture "
                      "stride %ld",
                      T, LIN_EPI_MAX_ROWS, n_in, n_out, tail && tail->norm_w ? "on" : "off",
                      tail ? tail->norm_row0 : -1, tail ? tail->cap_stride : 0L);
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
        return df_err(err, errlen, -EINVAL, "decode_linear_argmax_rows_cuda: %d rows (at most %d), %d -> %d", T,
                      LIN_EPI_MAX_ROWS, n_in, n_out);
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
        return df_err(err, errlen, -EINVAL, "decode_linear_qk_rows_cuda: %d rows (at most %d), %d -> heads %d/%d of %d",
                      T, LIN_EPI_MAX_ROWS, n_in, H, KV, hd);
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
        return df_err(err, errlen, -EINVAL, "decode_qk_norm_rope_append_cuda: T %d, heads %d/%d, head_dim %d, p0 %d", T,
                      H, KV, hd, p0);
    if (T == 0)
        return 0;
    long items = (long)T * (H + 2 * KV);
    int warps = 8;
    cudaError_t le = launch_maybe_pdl(decode_qk_norm_rope_append_kernel, dim3((unsigned)((items + warps - 1) / warps)),
                                      dim3(warps * 32), s, g_pdl_small, as_bf(qkv), q_norm, k_norm, inv_freq, as_bf(kc),
                                      as_bf(vc), T, H, KV, hd, eps, base, p0);
    if (le != cudaSuccess) {
        cudaGetLastError();
        return df_err(err, errlen, -EIO, "decode_qk_norm_rope_append_kernel: launch: %s", cudaGetErrorString(le));
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
        return df_err(err, errlen, -EINVAL, "decode_qk_norm_rope_append_rows_cuda: T %d, heads %d/%d, head_dim %d", T,
                      H, KV, hd);
    if (T == 0)
        return 0;
    long items = (long)T * (H + 2 * KV);
    int warps = 8;
    cudaError_t le = launch_maybe_pdl(
        decode_qk_norm_rope_append_rows_kernel, dim3((unsigned)((items + warps - 1) / warps)), dim3(warps * 32), s,
        g_pdl_small, as_bf(qkv), q_norm, k_norm, inv_freq, as_bf(kc), as_bf(vc), T, H, KV, hd, eps, pos, crow);
    if (le != cudaSuccess) {
        cudaGetLastError();
        return df_err(err, errlen, -EIO, "decode_qk_norm_rope_append_rows_kernel: launch: %s", cudaGetErrorString(le));
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
        return df_err(err, errlen, -EINVAL, "decode_argmax_split_rows_cuda: %d rows (at most %d) of %d", rows,
                      DECODE_EPI_MAX_ROWS, V);
    if (rows == 0)
        return 0;
    cudaError_t le = launch_maybe_pdl(decode_argmax_split_kernel, dim3(ARGMAX_SPLIT, (unsigned)rows),
                                      dim3(ARGMAX_SPLIT_THREADS), s, g_pdl_small, idx, logits, V, (int *)sync);
    if (le != cudaSuccess) {
        cudaGetLastError();
        return df_err(err, errlen, -EIO, "decode_argmax_split_kernel: launch: %s", cudaGetErrorString(le));
    }
    CUDA_LAUNCHED("decode_argmax_split_kernel", err, errlen);
    return 0;
}

int decode_argmax_rows_cuda(int32_t *idx, const float *logits, int rows, int V, cudaStream_t s, char *err,
                            size_t errlen)
{
    if (rows < 0 || V <= 0)
        return df_err(err, errlen, -EINVAL, "decode_argmax_rows_cuda: %d rows of %d", rows, V);
    if (rows == 0)
        return 0;
    decode_argmax_kernel<<<rows, ARGMAX_THREADS, 0, s>>>(idx, logits, V);
    CUDA_LAUNCHED("decode_argmax_kernel", err, errlen);
    return 0;
}
