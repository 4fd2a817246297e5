/* decode_linear_cuda.cuh: the small-row linear layer of decode_kernels_cuda (prefix lin_,
 * internal to common/target): the tensor-core kernel decode_linear_mma_kernel, its
 * epilogues and the templates that launch it for 1..64 rows. decode_kernels_cuda.cu picks
 * the variant and calls lin_launch_rows; the instantiations of lin_launch_rows (and so of
 * every kernel) are made in decode_linear_{w8,w16,swiglu_w8,swiglu_w16,xc_w8,xc_w16}_cuda.cu,
 * six translation units that compile side by side (the one file that held them all was the
 * build's longest step by far). docs/decode_cuda.md describes the kernel. */
#ifndef DF_DECODE_LINEAR_CUDA_CUH
#define DF_DECODE_LINEAR_CUDA_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "nn/nn_cuda_device.cuh" /* bf16, warp_sum, pdl_*, rope_*, cp.async helpers */
#include "target/decode_kernels_cuda.h"

/* The row a cache position lands in: p0 plus the device-side length when base is given. */
__device__ __forceinline__ int base_of(const int32_t *base, int p0)
{
    return p0 + (base ? *base : 0);
}

#define LIN_COLS 16  /* output columns per block (the m16 of the product) */
#define LIN_CHUNK 32 /* n_in elements per chunk: 8 per lane of a quad, two k16 products */

/* Column blocks from which a shape counts as wide (decode_linear_variant_cuda's auto and
 * tuned variants, the two-tile rule at 9..16 rows). */
#ifndef LIN_AUTO_BLOCKS
#define LIN_AUTO_BLOCKS 512
#endif

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

/* The warps' partial sums go through shared memory as red[warp][row][column], a row of
 * 16 MC columns padded to lin_red_stride(MC) floats: with a stride of 20 (or 36) the 32
 * lanes of a warp store their sums (lane g, t: column g, rows 2t and 2t + 1) to 32
 * different banks, and the epilogue's reads (consecutive threads, consecutive columns)
 * are at most 2-way conflicted. (The first layout, red[warp][column][row], put 8 lanes of
 * every store and 16 of every read on one bank.) */
__host__ __device__ constexpr int lin_red_stride(int MC)
{
    return 16 * MC + 4;
}

/* Row groups of 8 a reduction pass takes: NT, or NT halved until a pass's sums (per_group
 * bytes a group) fit in 40 KB of shared memory (static shared memory stops at 48 KB). */
__host__ __device__ constexpr int lin_pass_groups(int NT, int per_group)
{
    return NT > 1 && NT * per_group > 40960 ? lin_pass_groups(NT / 2, per_group) : NT;
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
    int out_crow; /* LIN_EPI_GLU: h chunk-major with this many rows (the call's T), 0: row-major */
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
static __device__ void lin_tail_norm(const lin_epi &e, const float *x, int T, int d)
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
__device__ __forceinline__ float lin_warp_order_sum(const float (*red)[RR][lin_red_stride(MC)], int col, int rr)
{
    float v = red[0][rr][col];
#pragma unroll
    for (int ww = 1; ww < WARPS; ww++)
        v += red[ww][rr][col];
    return v;
}

/* The output of rows r0 .. r0 + nr - 1 of a linear block from the warps' partial sums in
 * red[warp][row - r0][column] (added in warp order, then the bias): by e.mode, plain (bf16,
 * fp32, or added to an fp32 residual), GLU (SwiGLU of the gate and up columns), ARGMAX
 * (fp32 logits and one atomicMax per 16 columns and row; the kernel's last block hands out
 * the indices). */
template <int WARPS, int MC, int RR>
__device__ __forceinline__ void lin_epilogue(const float (*red)[RR][lin_red_stride(MC)], void *out, int out_f32,
                                             const bf16 *bias, int N, int n0, int r0, int nr, const lin_epi &e)
{
    if (e.mode == LIN_EPI_GLU) {
        /* column c < 8 of tile m: gate 8vb + c (sums [c]), up 8vb + c (sums [c + 8]), each
         * rounded to bf16 as the gu tensor would be, then nn_swiglu_cuda's formula */
        int I = N / 2;
        for (int i = threadIdx.x; i < 8 * MC * nr; i += blockDim.x) {
            int mc = i % (8 * MC), rr = i / (8 * MC), m = mc / 8, col = mc % 8;
            int n = n0 / 2 + m * 8 + col; /* (the block's tile index * MC + m) * 8 + col */
            if (n >= I)
                continue;
            float vg = lin_warp_order_sum<WARPS, MC, RR>(red, 16 * m + col, rr);
            float vu = lin_warp_order_sum<WARPS, MC, RR>(red, 16 * m + col + 8, rr);
            if (bias)
                vg += __bfloat162float(bias[n]), vu += __bfloat162float(bias[I + n]);
            float gq = __bfloat162float(__float2bfloat16(vg)), uq = __bfloat162float(__float2bfloat16(vu));
            long o = e.out_crow ? ((long)(n / LIN_CHUNK) * e.out_crow + r0 + rr) * LIN_CHUNK + n % LIN_CHUNK
                                : (long)(r0 + rr) * I + n; /* h chunk-major or row-major */
            reinterpret_cast<bf16 *>(out)[o] = __float2bfloat16(silu_mul(gq, uq));
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
 * are touched only after it. XC: x chunk-major (decode_kernels_cuda.h), so a row group's
 * chunk is 512 contiguous bytes: the same values at other addresses, the same bits. */
template <int NT, bool SWIGLU, int WARPS, bool PF, bool PDL, int MC, bool XC>
__global__ void __launch_bounds__(WARPS * 32)
    decode_linear_mma_kernel(void *__restrict__ out, int out_f32, const bf16 *__restrict__ x,
                             const bf16 *__restrict__ w, const bf16 *__restrict__ bias, int T, int K, int N, int vec,
                             int rsplit, lin_epi e)
{
    /* MC column tiles of 16 per block (decode_linear_cols_cuda): tile m is the one a block
     * blockIdx.x * MC + m would have alone, with the same chunks in the same order, sharing
     * the x loads; two rounds in flight instead of four keep the registers */
    constexpr int U = MC == 1 ? lin_unroll(NT, WARPS, PF) : (NT == 1 ? 4 : NT <= 2 ? 2 : 1), STEP = WARPS * U;
    constexpr int RS = lin_red_stride(MC), RG = lin_pass_groups(NT, WARPS * 8 * RS * 4); /* row groups a pass */
    __shared__ float red[WARPS][8 * RG][RS];
    if (PDL)
        pdl_launch_dependents();
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    /* rsplit blocks a column tile, side by side in the grid: block rb of them takes rows
     * row0 .. row0 + 8 NT - 1 (the same chunks and order for every row: the same bits) */
    const int bx = blockIdx.x / rsplit, row0 = (blockIdx.x - bx * rsplit) * 8 * NT;
    const bf16 *wlo[MC], *whi[MC];
    int wlo_ok[MC], whi_ok[MC];
#pragma unroll
    for (int m = 0; m < MC; m++) {
        int vb = bx * MC + m, nlo = vb * LIN_COLS + g, nhi = nlo + 8;
        wlo_ok[m] = nlo < N, whi_ok[m] = nhi < N;
        if (e.mode == LIN_EPI_GLU) { /* gate rows 8vb.. and the up rows I + 8vb.. (N = 2I, I % 8 == 0) */
            nlo = vb * 8 + g, nhi = N / 2 + vb * 8 + g;
            wlo_ok[m] = whi_ok[m] = nlo < N / 2;
        }
        wlo[m] = w + (long)min(nlo, N - 1) * K, whi[m] = w + (long)min(nhi, N - 1) * K;
    }
    static_assert(!(XC && SWIGLU), "chunk-major x is plain rows");
    /* row r of x: at x + r * K (row-major), or its chunk c at x + (c * T + r) * 32 (XC) */
    long xstride = XC ? (long)LIN_CHUNK : SWIGLU ? 2L * K : (long)K, xcs = XC ? (long)T * LIN_CHUNK : 0;
    const bf16 *xr[NT];
    int x_ok[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        int r = row0 + 8 * j + g;
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
                b[u][j] = XC ? load8(xr[j] + c * xcs + 8 * t, 1, x_ok[j] ? left : 0)
                             : load_x8<SWIGLU>(xr[j], K, k, vec, x_ok[j] ? left : 0);
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
     * half when they would not fit in 40 KB: 64 rows at 16 warps), each pass reducing and
     * writing its rows; a row's sums are added in warp order whichever pass it is in. */
    const int n0 = bx * MC * LIN_COLS; /* the block's columns n0 .. n0 + 16 MC - 1 */
#pragma unroll
    for (int p = 0; p < NT / RG; p++) {
        if (p)
            __syncthreads(); /* the previous pass has read red */
#pragma unroll
        for (int m = 0; m < MC; m++)
#pragma unroll
            for (int j = 0; j < RG; j++) {
                red[warp][8 * j + 2 * t][16 * m + g] = acc[m][p * RG + j][0];
                red[warp][8 * j + 2 * t + 1][16 * m + g] = acc[m][p * RG + j][1];
                red[warp][8 * j + 2 * t][16 * m + g + 8] = acc[m][p * RG + j][2];
                red[warp][8 * j + 2 * t + 1][16 * m + g + 8] = acc[m][p * RG + j][3];
            }
        __syncthreads();
        /* this pass's rows row0 + r0 .. row0 + r0 + nr - 1 */
        const int r0 = 8 * RG * p, nr = min(T - row0 - r0, 8 * RG);
        if (nr > 0)
            lin_epilogue<WARPS, MC, 8 * RG>(red, out, out_f32, bias, N, n0, row0 + r0, nr, e);
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

/* One launch of NT row groups a block (T <= 8 * NT * rsplit: rsplit blocks a column tile),
 * with the PDL attribute when asked. */
template <int NT, bool SWIGLU, int WARPS, bool PF, bool PDL, int MC = 1, bool XC = false>
static cudaError_t lin_launch_nt(void *out, int out_f32, const bf16 *x, const bf16 *w, const bf16 *b, int T, int K,
                                 int N, int vec, const lin_epi &e, cudaStream_t s, int rsplit = 1)
{
    cudaLaunchConfig_t cfg = {};
    int tiles = (N + LIN_COLS - 1) / LIN_COLS; /* (GLU: N = 2I, I / 8 tiles) */
    cfg.gridDim = dim3((unsigned)((tiles + MC - 1) / MC * rsplit));
    cfg.blockDim = dim3(WARPS * 32);
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    if (PDL) {
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at, cfg.numAttrs = 1;
    }
    return cudaLaunchKernelEx(&cfg, decode_linear_mma_kernel<NT, SWIGLU, WARPS, PF, PDL, MC, XC>, out, out_f32, x, w, b,
                              T, K, N, vec, rsplit, e);
}

/* The launches of one variant: every row count in one call, so the weights are read once
 * from HBM (33..64 rows at 16 warps reduce in two passes of 32 rows: decode_linear_mma_kernel).
 * cols: decode_linear_cols_cuda's setting; rows_blk: decode_linear_rows_block_cuda's (17..64
 * rows in blocks of at most that many, side by side, a tile's weights read once from HBM and
 * again from L2); sms: the device's multiprocessors. XC: x chunk-major. */
template <bool SWIGLU, int WARPS, bool PF, bool PDL, bool XC>
cudaError_t lin_launch_rows(void *out, int out_f32, const bf16 *x, const bf16 *w, const bf16 *b, int T, int K, int N,
                            int vec, const lin_epi &ep, int cols, int rows_blk, int sms, cudaStream_t s)
{
    /* the two-tile kernels: the 16-warp ones with plain x rows (a multiple of 16 warps of
     * 128 registers: one block an SM), the 8-warp one at 9..16 rows */
    constexpr int MC16 = WARPS == 16 && !SWIGLU && !PF ? 2 : 1, MC8 = WARPS == 8 && !SWIGLU ? 2 : 1;
    if (T <= 8) {
        /* two column tiles a block (decode_linear_cols_cuda 3): 16 warps (one block an SM), when
         * one tile a block would take more than one wave of blocks */
        if (MC16 == 2 && cols >= 3 && (N + LIN_COLS - 1) / LIN_COLS > sms)
            return lin_launch_nt<1, SWIGLU, WARPS, PF, PDL, MC16, XC>(out, out_f32, x, w, b, T, K, N, vec, ep, s);
        return lin_launch_nt<1, SWIGLU, WARPS, PF, PDL, 1, XC>(out, out_f32, x, w, b, T, K, N, vec, ep, s);
    }
    if (T <= 16) {
        /* two column tiles a block (decode_linear_cols_cuda 4): 16 warps, more tiles than SMs */
        if (MC16 == 2 && cols >= 4 && (N + LIN_COLS - 1) / LIN_COLS > sms)
            return lin_launch_nt<2, SWIGLU, WARPS, PF, PDL, MC16, XC>(out, out_f32, x, w, b, T, K, N, vec, ep, s);
        /* two column tiles a block (decode_linear_cols_cuda): 8 warps, wide shapes, n_in >= 4096
         * (measured slower at 2048), 9..16 rows */
        if (MC8 == 2 && T > 8 && cols >= 2 && K >= 4096 && (N + LIN_COLS - 1) / LIN_COLS >= LIN_AUTO_BLOCKS)
            return lin_launch_nt<2, SWIGLU, WARPS, PF, PDL, MC8, XC>(out, out_f32, x, w, b, T, K, N, vec, ep, s);
        return lin_launch_nt<2, SWIGLU, WARPS, PF, PDL, 1, XC>(out, out_f32, x, w, b, T, K, N, vec, ep, s);
    }
    int nt = T <= 32 ? 4 : 8; /* row groups of 8 a block */
    while (nt > 1 && 8 * nt > rows_blk)
        nt /= 2;
    int rsplit = (T + 8 * nt - 1) / (8 * nt);
    switch (nt) {
    case 1: return lin_launch_nt<1, SWIGLU, WARPS, PF, PDL, 1, XC>(out, out_f32, x, w, b, T, K, N, vec, ep, s, rsplit);
    case 2: return lin_launch_nt<2, SWIGLU, WARPS, PF, PDL, 1, XC>(out, out_f32, x, w, b, T, K, N, vec, ep, s, rsplit);
    case 4: return lin_launch_nt<4, SWIGLU, WARPS, PF, PDL, 1, XC>(out, out_f32, x, w, b, T, K, N, vec, ep, s, rsplit);
    default: return lin_launch_nt<8, SWIGLU, WARPS, PF, PDL, 1, XC>(out, out_f32, x, w, b, T, K, N, vec, ep, s, rsplit);
    }
}

/* Every instantiation of lin_launch_rows: declared here (so no other file makes its own),
 * defined in decode_linear_*_cuda.cu, one per (x kind, warp count), all four (PF, PDL). */
#define LIN_ROWS_INST(EXT, SWIGLU, WARPS, PF, PDL, XC)                                                             \
    EXT template cudaError_t lin_launch_rows<SWIGLU, WARPS, PF, PDL, XC>(                                          \
        void *, int, const bf16 *, const bf16 *, const bf16 *, int, int, int, int, const lin_epi &, int, int, int, \
        cudaStream_t);
#define LIN_ROWS_INST4(EXT, SWIGLU, WARPS, XC)          \
    LIN_ROWS_INST(EXT, SWIGLU, WARPS, false, false, XC) \
    LIN_ROWS_INST(EXT, SWIGLU, WARPS, true, false, XC)  \
    LIN_ROWS_INST(EXT, SWIGLU, WARPS, false, true, XC)  \
    LIN_ROWS_INST(EXT, SWIGLU, WARPS, true, true, XC)
LIN_ROWS_INST4(extern, false, 8, false)
LIN_ROWS_INST4(extern, false, 16, false)
LIN_ROWS_INST4(extern, true, 8, false)
LIN_ROWS_INST4(extern, true, 16, false)
LIN_ROWS_INST4(extern, false, 8, true)
LIN_ROWS_INST4(extern, false, 16, true)

#endif
