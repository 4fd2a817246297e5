/* decode_kernels_cuda.cu: the kernels of decode_kernels_cuda.h. Written for correctness
 * and for results that do not depend on how many rows a call has (every row and every
 * (query, head) is computed by its own warp or block in a fixed order); speed comes from
 * the few rows of a decode step reading each weight once. */
#include "target/decode_kernels_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>

typedef __nv_bfloat16 bf16;

static __thread char g_err[256];

const char *decode_last_error_cuda(void)
{
    return g_err;
}

/* After a launch: 0, or -EIO with the CUDA error text kept for decode_last_error_cuda. */
#define LAUNCHED(what)                                                                                       \
    do {                                                                                                     \
        cudaError_t e_ = cudaGetLastError();                                                                 \
        if (e_ != cudaSuccess) {                                                                             \
            snprintf(g_err, sizeof g_err, "%s: launch failed: %s", what, cudaGetErrorString(e_));            \
            return -EIO;                                                                                     \
        }                                                                                                    \
    } while (0)

static inline const bf16 *bfp(const nn_bf16_cuda *p) { return reinterpret_cast<const bf16 *>(p); }
static inline bf16 *bfp(nn_bf16_cuda *p) { return reinterpret_cast<bf16 *>(p); }

__device__ __forceinline__ float warp_sum32(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max32(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Max (is_max) or sum over the block; every thread gets the result. part: shared,
 * blockDim.x / 32 floats. The leading sync lets a previous call's readers finish. */
__device__ float block_reduce(float v, int is_max, float *part)
{
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = is_max ? warp_max32(v) : warp_sum32(v);
    __syncthreads();
    if (lane == 0)
        part[wid] = v;
    __syncthreads();
    float t = part[0];
    for (int i = 1; i < nw; i++)
        t = is_max ? fmaxf(t, part[i]) : t + part[i];
    return t;
}

/* ---- positions, cache append ------------------------------------------------------- */

__global__ void positions_kernel(int32_t *pos, int p0, int T)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < T)
        pos[i] = p0 + i;
}

int decode_positions_cuda(int32_t *pos, int p0, int T, cudaStream_t s)
{
    if (T < 0 || p0 < 0)
        return -EINVAL;
    if (T == 0)
        return 0;
    positions_kernel<<<(T + 255) / 256, 256, 0, s>>>(pos, p0, T);
    LAUNCHED("positions_kernel");
    return 0;
}

__global__ void kv_append_kernel(bf16 *kc, bf16 *vc, const bf16 *qkv, int T, int H, int KV, int hd, int row0)
{
    long kvd = (long)KV * hd, row = (long)(H + 2 * KV) * hd;
    long n = (long)T * 2 * kvd;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        long t = i / (2 * kvd), j = i - t * 2 * kvd;
        bf16 v = qkv[t * row + (long)H * hd + j];
        if (j < kvd)
            kc[(row0 + t) * kvd + j] = v;
        else
            vc[(row0 + t) * kvd + (j - kvd)] = v;
    }
}

int decode_kv_append_cuda(nn_bf16_cuda *kc, nn_bf16_cuda *vc, const nn_bf16_cuda *qkv, int T, int H, int KV, int hd, int row0,
                  cudaStream_t s)
{
    if (T < 0 || H <= 0 || KV <= 0 || hd <= 0 || row0 < 0)
        return -EINVAL;
    if (T == 0)
        return 0;
    long n = (long)T * 2 * KV * hd;
    int blocks = (int)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
    kv_append_kernel<<<blocks, 256, 0, s>>>(bfp(kc), bfp(vc), bfp(qkv), T, H, KV, hd, row0);
    LAUNCHED("kv_append_kernel");
    return 0;
}

/* ---- cached attention --------------------------------------------------------------- */

#define ATT_THREADS 128 /* thread i owns output dims i and i + 128: hd <= 256 */
#define ATT_CHUNK 512   /* keys scored per pass (shared memory), online softmax across passes */

/* One block per (query, head). Per chunk of keys: one warp per key computes the score
 * (lanes split hd), then the chunk's max rescales the running sum and accumulators, and
 * every thread adds p * v for its dims over the chunk's keys in key order. The keys a
 * query sees and their order depend on that query alone. */
__global__ void __launch_bounds__(ATT_THREADS)
    attention_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ q, long q_stride, const bf16 *__restrict__ kc,
                     const bf16 *__restrict__ vc, const nn_key_ranges *__restrict__ ranges, int p0, int window,
                     int H, int KV, int hd, float scale)
{
    __shared__ float qs[256];
    __shared__ float sc[ATT_CHUNK];
    __shared__ float part[ATT_THREADS / 32];
    int qi = blockIdx.x / H, h = blockIdx.x - qi * H, kvh = h / (H / KV);
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    int lo0, hi0, lo1, hi1;
    if (ranges) {
        nn_key_ranges r = ranges[qi];
        lo0 = r.lo0, hi0 = r.hi0, lo1 = r.lo1, hi1 = r.hi1;
    } else {
        int p = p0 + qi;
        lo0 = window > 0 ? max(0, p - window + 1) : 0, hi0 = p + 1, lo1 = hi1 = 0;
    }
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
            dot = warp_sum32(dot);
            if (lane == 0)
                sc[j] = dot * scale;
        }
        __syncthreads();
        float mx = -INFINITY;
        for (int j = tid; j < cn; j += blockDim.x)
            mx = fmaxf(mx, sc[j]);
        mx = block_reduce(mx, 1, part);
        float m_new = fmaxf(m_run, mx);
        float corr = expf(m_run - m_new); /* 0 on the first chunk (m_run = -inf) */
        float ps = 0.0f;
        for (int j = tid; j < cn; j += blockDim.x) {
            float p = expf(sc[j] - m_new);
            sc[j] = p;
            ps += p;
        }
        ps = block_reduce(ps, 0, part); /* its syncs also publish sc[] */
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

int decode_attention_cuda(nn_bf16_cuda *out, const nn_bf16_cuda *q, long q_stride, const nn_bf16_cuda *kc, const nn_bf16_cuda *vc,
                  const nn_key_ranges *ranges, int p0, int window, int Tq, int H, int KV, int hd, float scale,
                  cudaStream_t s)
{
    if (Tq < 0 || H <= 0 || KV <= 0 || H % KV || hd <= 0 || hd % 2 || hd > 2 * ATT_THREADS || p0 < 0 ||
        window < 0 || q_stride < (long)H * hd)
        return -EINVAL;
    if (Tq == 0)
        return 0;
    attention_kernel<<<(unsigned)((long)Tq * H), ATT_THREADS, 0, s>>>(bfp(out), bfp(q), q_stride, bfp(kc), bfp(vc),
                                                                        ranges, p0, window, H, KV, hd, scale);
    LAUNCHED("attention_kernel");
    return 0;
}

/* ---- row-exact linear layer ---------------------------------------------------------- */

#define LIN_WARPS 8 /* output columns per block */
#define LIN_ROWS 8  /* rows accumulated per pass over a weight row */

/* 8 consecutive bf16 at p as floats; vec: p is 16-byte aligned and all 8 are in range,
 * else element-wise with zeros past `left` (the same values either way). */
__device__ __forceinline__ void load8(float *f, const bf16 *p, int vec, int left)
{
    if (vec && left >= 8) {
        uint4 u = *reinterpret_cast<const uint4 *>(p);
        const __nv_bfloat162 *b = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 v = __bfloat1622float2(b[j]);
            f[2 * j] = v.x, f[2 * j + 1] = v.y;
        }
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++)
            f[j] = j < left ? __bfloat162float(p[j]) : 0.0f;
    }
}

__global__ void __launch_bounds__(LIN_WARPS * 32)
    linear_rows_kernel(void *__restrict__ out, int out_f32, const bf16 *__restrict__ x, const bf16 *__restrict__ w,
                       const bf16 *__restrict__ bias, int T, int K, int N, int vec)
{
    int lane = threadIdx.x & 31, n = blockIdx.x * LIN_WARPS + (threadIdx.x >> 5);
    if (n >= N)
        return; /* no block-wide synchronisation below */
    const bf16 *wr = w + (long)n * K;
    float b = bias ? __bfloat162float(bias[n]) : 0.0f;
    for (int t0 = 0; t0 < T; t0 += LIN_ROWS) {
        int tn = min(LIN_ROWS, T - t0);
        float acc[LIN_ROWS];
#pragma unroll
        for (int r = 0; r < LIN_ROWS; r++)
            acc[r] = 0.0f;
        for (int k0 = lane * 8; k0 < K; k0 += 32 * 8) {
            float wf[8];
            load8(wf, wr + k0, vec, K - k0);
#pragma unroll
            for (int r = 0; r < LIN_ROWS; r++) {
                if (r < tn) {
                    float xf[8];
                    load8(xf, x + (long)(t0 + r) * K + k0, vec, K - k0);
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        acc[r] = fmaf(xf[j], wf[j], acc[r]);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < LIN_ROWS; r++) {
            if (r < tn) {
                float v = warp_sum32(acc[r]) + b;
                long o = (long)(t0 + r) * N + n;
                if (lane == 0) {
                    if (out_f32)
                        reinterpret_cast<float *>(out)[o] = v;
                    else
                        reinterpret_cast<bf16 *>(out)[o] = __float2bfloat16(v);
                }
            }
        }
    }
}

int decode_linear_rows_cuda(void *out, int out_f32, const nn_bf16_cuda *x, const nn_bf16_cuda *w, const nn_bf16_cuda *bias, int T,
                    int n_in, int n_out, cudaStream_t s)
{
    if (T < 0 || n_in <= 0 || n_out <= 0 || !out || !x || !w)
        return -EINVAL;
    if (T == 0)
        return 0;
    /* vectorised loads need every row start 16-byte aligned; the choice depends on the
     * shapes and base pointers only, never on T, and both paths load the same values */
    int vec = n_in % 8 == 0 && ((uintptr_t)x % 16) == 0 && ((uintptr_t)w % 16) == 0;
    linear_rows_kernel<<<(n_out + LIN_WARPS - 1) / LIN_WARPS, LIN_WARPS * 32, 0, s>>>(out, out_f32, bfp(x), bfp(w),
                                                                                    bfp(bias), T, n_in, n_out, vec);
    LAUNCHED("linear_rows_kernel");
    return 0;
}

/* ---- argmax -------------------------------------------------------------------------- */

#define ARGMAX_THREADS 256

__global__ void argmax_kernel(int32_t *idx, const float *logits, int V)
{
    __shared__ float bv[ARGMAX_THREADS];
    __shared__ int bi[ARGMAX_THREADS];
    const float *row = logits + (long)blockIdx.x * V;
    float best = -INFINITY;
    int at = V; /* V: nothing seen (all -inf or NaN) */
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float x = row[v];
        if (x > best || (at == V && x == best)) /* strictly greater: the first of equals stays */
            best = x, at = v;
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

int decode_argmax_rows_cuda(int32_t *idx, const float *logits, int rows, int V, cudaStream_t s)
{
    if (rows < 0 || V <= 0)
        return -EINVAL;
    if (rows == 0)
        return 0;
    argmax_kernel<<<rows, ARGMAX_THREADS, 0, s>>>(idx, logits, V);
    LAUNCHED("argmax_kernel");
    return 0;
}
