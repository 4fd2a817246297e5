/* attention.cu: causal GQA attention over a packed row of documents, q/k/v read straight
 * from the fused QKV activation (no transposes, no copies).
 *
 * The flash kernel (hd 16/32/64/128): one block of 4 warps per (64-query tile, head);
 * each warp owns 16 query rows. Key/value tiles of 64 rows stream through shared memory
 * with cp.async, double buffered, rows padded by 16 bytes so ldmatrix is conflict-free.
 * S = Q K^T and O += P V run on the tensor cores (mma.sync m16n8k16 bf16, fp32
 * accumulators); the softmax is online (running max and sum per row, in registers, base-2
 * exponentials with the scale folded in). Masking is per element against the query's
 * key range [lo(t), t], lo(t) = t - pos[t] (its document start) or the sliding window:
 * since lo is non-decreasing in t, a tile of queries needs only the keys
 * [lo(first query), last query], so a document boundary also cuts the work. Rows whose
 * keys are all masked contribute exact zeros, never NaN (the running max falls back to 0).
 * Blocks are issued longest first (the last query tile has the most keys).
 *
 * The wgmma kernels (hd 128, sm_90a; below): 128-query x 128-key tiles on the warpgroup
 * MMA with K/V in swizzled shared memory, loaded by cp.async or TMA.
 *
 * The simple kernel (any even hd <= 256): one warp per (query, head), fp32 online
 * softmax over its keys; the fallback and a second opinion in the tests. */
#include "nn/nn_cuda_device.cuh"

#include <climits>
#include <cstdint>
#include <cuda.h> /* CUtensorMap, cuTensorMapEncodeTiled (the TMA variant) */

/* ---- the flash kernel ------------------------------------------------------------ */

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const bf16 *p)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const bf16 *p)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
/* d[4] += a[4] (16x16, row) * (b0, b1) (16x8, col); fp32 accumulators. */
__device__ __forceinline__ void mma_bf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); /* .x (low half) = lo */
    return *reinterpret_cast<uint32_t *>(&v);
}

__device__ __forceinline__ int key_lo(const int32_t *pos, int t, int window)
{
    int lo = t - pos[t];
    if (window > 0 && t - window + 1 > lo)
        lo = t - window + 1;
    return lo;
}

#define FA_THREADS 128 /* 4 warps */

/* Tile shapes of the flash kernel (nn_attention_packed_tile_cuda): WM m16 row blocks per
 * warp (64 * WM queries per block), BN keys per shared-memory tile. */
template <int HD, int WM, int BN> constexpr int fa_smem_bytes()
{
    return (64 * WM + 4 * BN) * (HD + 8) * 2;
}

/* One block of 4 warps per (64*WM-query tile, head); warp w owns the WM*16 rows
 * q0 + w*16*WM ... Q stays in registers when WM == 1 (16 rows), else it is re-read from
 * shared memory at every k-step (registers go to the second row block's accumulators, so
 * each K/V fragment read from shared memory feeds WM mma instead of one). A key tile that
 * no row of a warp can see is skipped by that warp: for each of its rows the online
 * softmax state would be left bit for bit unchanged (alpha = 1, p = 0), so the skip is
 * exact; a key tile that every row of a warp sees whole skips the per-element mask. */
template <int HD, int WM, int BN>
__global__ void __launch_bounds__(FA_THREADS)
    flash_fwd_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ qkv, const int32_t *__restrict__ pos, int T,
                     int H, int KV, int window, float scale_log2)
{
    constexpr int BM = 64 * WM;
    constexpr int LD = HD + 8;      /* padded smem row (elements) */
    constexpr int KSTEPS = HD / 16; /* k-steps of S = Q K^T */
    constexpr int NT_S = BN / 8;    /* n-tiles of S per row block */
    constexpr int NT_O = HD / 8;    /* n-tiles of O per row block */
    constexpr int CHUNKS = HD / 8;  /* 16-byte chunks per row */
    constexpr bool QREG = WM == 1;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    bf16 *sQ = reinterpret_cast<bf16 *>(fa_smem); /* [BM][LD] */
    bf16 *sK = sQ + BM * LD;                      /* [2][BN][LD] */
    bf16 *sV = sK + 2 * BN * LD;                  /* [2][BN][LD] */

    const int q0 = (gridDim.x - 1 - blockIdx.x) * BM; /* longest tiles first */
    const int h = blockIdx.y, kvh = h / (H / KV);
    const long ld = (long)(H + 2 * KV) * HD;
    const bf16 *gQ = qkv + (size_t)h * HD;
    const bf16 *gK = qkv + (size_t)(H + kvh) * HD;
    const bf16 *gV = qkv + (size_t)(H + KV + kvh) * HD;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int gid = lane >> 2, tig = lane & 3;

    const int q_last = min(q0 + BM, T) - 1;
    const int kv_begin = key_lo(pos, q0, window);
    const int n_tiles = (q_last + 1 - kv_begin + BN - 1) / BN;

    auto load_rows = [&](bf16 *dst, const bf16 *base, int r0, int rows) {
        for (int c = tid; c < rows * CHUNKS; c += FA_THREADS) {
            int r = c / CHUNKS, ch = c - r * CHUNKS;
            int gr = r0 + r;
            bool ok = gr >= 0 && gr < T;
            cp_async16(dst + r * LD + ch * 8, ok ? base + (size_t)gr * ld + ch * 8 : base, ok);
        }
    };
    load_rows(sQ, gQ, q0, BM);
    load_rows(sK, gK, kv_begin, BN);
    load_rows(sV, gV, kv_begin, BN);
    cp_async_commit();

    const int w0 = q0 + warp * 16 * WM; /* this warp's first row */
    int r_a[WM], r_b[WM], lo_a[WM], lo_b[WM];
#pragma unroll
    for (int mt = 0; mt < WM; mt++) {
        r_a[mt] = w0 + mt * 16 + gid, r_b[mt] = r_a[mt] + 8;
        lo_a[mt] = r_a[mt] < T ? key_lo(pos, r_a[mt], window) : INT_MAX; /* rows past T see nothing */
        lo_b[mt] = r_b[mt] < T ? key_lo(pos, r_b[mt], window) : INT_MAX;
    }
    /* keys any row of this warp can see: [w_lo, w_hi] (lo is non-decreasing in t) */
    const int w_lo = w0 < T ? key_lo(pos, w0, window) : INT_MAX;
    const int w_hi = min(w0 + 16 * WM, T) - 1;
    /* every row of the warp sees keys [w_lo_max, w0] whole (w_lo_max: its last row's lo) */
    const int w_lo_max = w0 + 16 * WM - 1 < T ? key_lo(pos, w0 + 16 * WM - 1, window) : INT_MAX;

    float o[WM][NT_O][4];
    float m_a[WM], m_b[WM], l_a[WM], l_b[WM];
#pragma unroll
    for (int mt = 0; mt < WM; mt++) {
#pragma unroll
        for (int n = 0; n < NT_O; n++)
            o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
        m_a[mt] = m_b[mt] = -INFINITY;
        l_a[mt] = l_b[mt] = 0.0f;
    }
    uint32_t qf[QREG ? KSTEPS : 1][4];

    for (int j = 0; j < n_tiles; j++) {
        const int buf = j & 1;
        if (j + 1 < n_tiles) {
            load_rows(sK + (buf ^ 1) * BN * LD, gK, kv_begin + (j + 1) * BN, BN);
            load_rows(sV + (buf ^ 1) * BN * LD, gV, kv_begin + (j + 1) * BN, BN);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (QREG && j == 0) {
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++)
                ldsm_x4(qf[QREG ? ks : 0],
                        sQ + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + ks * 16 + (lane >> 4) * 8);
        }
        const bf16 *ks_ = sK + buf * BN * LD;
        const bf16 *vs_ = sV + buf * BN * LD;
        const int kbase = kv_begin + j * BN;
        if (kbase <= w_hi && kbase + BN - 1 >= w_lo) {
            const bool full = kbase >= w_lo_max && kbase + BN - 1 <= w0;
            /* S = Q K^T for this warp's rows x BN keys */
            float s[WM][NT_S][4];
#pragma unroll
            for (int mt = 0; mt < WM; mt++)
#pragma unroll
                for (int n = 0; n < NT_S; n++)
                    s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) {
                uint32_t qa[WM][4];
#pragma unroll
                for (int mt = 0; mt < WM; mt++) {
                    if (QREG) {
                        qa[mt][0] = qf[QREG ? ks : 0][0], qa[mt][1] = qf[QREG ? ks : 0][1];
                        qa[mt][2] = qf[QREG ? ks : 0][2], qa[mt][3] = qf[QREG ? ks : 0][3];
                    } else {
                        ldsm_x4(qa[mt], sQ + (warp * 16 * WM + mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD +
                                            ks * 16 + (lane >> 4) * 8);
                    }
                }
#pragma unroll
                for (int np = 0; np < NT_S / 2; np++) {
                    uint32_t b[4];
                    ldsm_x4(b, ks_ + (np * 16 + (lane & 7) + (lane >> 4) * 8) * LD + ks * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
                    for (int mt = 0; mt < WM; mt++) {
                        mma_bf16(s[mt][2 * np], qa[mt], b[0], b[1]);
                        mma_bf16(s[mt][2 * np + 1], qa[mt], b[2], b[3]);
                    }
                }
            }

            uint32_t pa[WM][BN / 16][4];
#pragma unroll
            for (int mt = 0; mt < WM; mt++) {
                /* mask and scale (log2 domain); a tile every row of the warp sees whole
                 * needs no mask (the same values) */
                if (full) {
#pragma unroll
                    for (int n = 0; n < NT_S; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            s[mt][n][e] = __fmul_rn(s[mt][n][e], scale_log2); /* never fused into an FMA */
                } else {
#pragma unroll
                    for (int n = 0; n < NT_S; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            int key = kbase + n * 8 + 2 * tig + (e & 1);
                            int row = e < 2 ? r_a[mt] : r_b[mt], lo = e < 2 ? lo_a[mt] : lo_b[mt];
                            s[mt][n][e] = (key >= lo && key <= row) ? __fmul_rn(s[mt][n][e], scale_log2) : -INFINITY;
                        }
                }
                /* running max over the quad that shares a row */
                float mx_a = m_a[mt], mx_b = m_b[mt];
#pragma unroll
                for (int n = 0; n < NT_S; n++) {
                    mx_a = fmaxf(mx_a, fmaxf(s[mt][n][0], s[mt][n][1]));
                    mx_b = fmaxf(mx_b, fmaxf(s[mt][n][2], s[mt][n][3]));
                }
                mx_a = quad_max(mx_a);
                mx_b = quad_max(mx_b);
                const float base_a = mx_a == -INFINITY ? 0.0f : mx_a; /* nothing seen yet: no NaN */
                const float base_b = mx_b == -INFINITY ? 0.0f : mx_b;
                const float alpha_a = exp2f(m_a[mt] - base_a), alpha_b = exp2f(m_b[mt] - base_b);
                m_a[mt] = mx_a;
                m_b[mt] = mx_b;
                float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
                for (int n = 0; n < NT_S; n++) {
                    s[mt][n][0] = exp2f(s[mt][n][0] - base_a);
                    s[mt][n][1] = exp2f(s[mt][n][1] - base_a);
                    s[mt][n][2] = exp2f(s[mt][n][2] - base_b);
                    s[mt][n][3] = exp2f(s[mt][n][3] - base_b);
                    sum_a += s[mt][n][0] + s[mt][n][1];
                    sum_b += s[mt][n][2] + s[mt][n][3];
                }
                l_a[mt] = l_a[mt] * alpha_a + sum_a;
                l_b[mt] = l_b[mt] * alpha_b + sum_b;
#pragma unroll
                for (int n = 0; n < NT_O; n++) {
                    o[mt][n][0] *= alpha_a;
                    o[mt][n][1] *= alpha_a;
                    o[mt][n][2] *= alpha_b;
                    o[mt][n][3] *= alpha_b;
                }
                /* the S accumulators are already in the A-fragment layout of P */
#pragma unroll
                for (int kk = 0; kk < BN / 16; kk++) {
                    pa[mt][kk][0] = pack_bf16x2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                    pa[mt][kk][1] = pack_bf16x2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                    pa[mt][kk][2] = pack_bf16x2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                    pa[mt][kk][3] = pack_bf16x2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
                }
            }

            /* O += P V */
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
#pragma unroll
                for (int dp = 0; dp < NT_O / 2; dp++) {
                    uint32_t b[4];
                    ldsm_x4_t(b, vs_ + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp * 16 + (lane >> 4) * 8);
#pragma unroll
                    for (int mt = 0; mt < WM; mt++) {
                        mma_bf16(o[mt][2 * dp], pa[mt][kk], b[0], b[1]);
                        mma_bf16(o[mt][2 * dp + 1], pa[mt][kk], b[2], b[3]);
                    }
                }
            }
        }
        __syncthreads(); /* this buffer is refilled by the next iteration's loads */
    }

    const long ldo = (long)H * HD;
#pragma unroll
    for (int mt = 0; mt < WM; mt++) {
        const float la = quad_sum(l_a[mt]), lb = quad_sum(l_b[mt]);
        const float inv_a = la > 0.0f ? 1.0f / la : 0.0f, inv_b = lb > 0.0f ? 1.0f / lb : 0.0f;
#pragma unroll
        for (int n = 0; n < NT_O; n++) {
            int col = h * HD + n * 8 + 2 * tig;
            if (r_a[mt] < T)
                *reinterpret_cast<__nv_bfloat162 *>(out + (size_t)r_a[mt] * ldo + col) =
                    __floats2bfloat162_rn(o[mt][n][0] * inv_a, o[mt][n][1] * inv_a);
            if (r_b[mt] < T)
                *reinterpret_cast<__nv_bfloat162 *>(out + (size_t)r_b[mt] * ldo + col) =
                    __floats2bfloat162_rn(o[mt][n][2] * inv_b, o[mt][n][3] * inv_b);
        }
    }
}

template <int HD, int WM, int BN>
static int launch_flash(bf16 *out, const bf16 *qkv, const int32_t *pos, int T, int H, int KV, int window, float scale,
                        cudaStream_t s, char *err, size_t errlen)
{
    constexpr int smem = fa_smem_bytes<HD, WM, BN>();
    static bool attr_set = false; /* host-side, once per instantiation (not a stream op) */
    if (!attr_set && smem > 48 * 1024)
        CUDA_TRY(cudaFuncSetAttribute(flash_fwd_kernel<HD, WM, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                 err, errlen);
    attr_set = true;
    dim3 grid((T + 64 * WM - 1) / (64 * WM), H);
    const float log2e = 1.4426950408889634f;
    flash_fwd_kernel<HD, WM, BN><<<grid, FA_THREADS, smem, s>>>(out, qkv, pos, T, H, KV, window, scale * log2e);
    CUDA_LAUNCHED("flash_fwd_kernel", err, errlen);
    return 0;
}

/* ---- the wgmma kernel (hd 128, sm_90a) --------------------------------------------
 * One block of 2 warpgroups (8 warps) per (128-query tile, head); warpgroup g owns the
 * 64 rows q0 + 64g ... Q and the K/V tiles of 128 keys sit in shared memory in the
 * canonical 128-byte-swizzled layout of the warpgroup MMA: a tile of R rows x 128 dims is
 * two halves [R][64] (dims 0-63, 64-127), each row 128 bytes whose 16-byte chunk c lies at
 * chunk c ^ (row & 7). S = Q K^T reads both operands from shared memory (K-major); O += P V
 * takes P from registers (the S accumulators converted to bf16 in place, the same
 * fragment layout) and V from shared memory as an N-major operand (no transpose copy).
 * K/V tiles stream in with cp.async through three stages, one tile ahead. With PIPE the
 * P V of tile j-1 runs on the tensor cores while the softmax of tile j runs (S_j is issued
 * first, then PV_{j-1}; the softmax waits for S_j only), as FlashAttention-3 does within a
 * warpgroup; without PIPE each tile is S, softmax, PV in order. A warpgroup skips the key
 * tiles none of its rows can see (exact, as in the mma.sync kernel) and masks per element
 * only where a tile is not seen whole by a warp's 16 rows. The output goes out through
 * shared memory (the warpgroup's Q rows, no longer needed) in 16-byte stores. */

#define WG_THREADS 256 /* 2 warpgroups */
#define WG_BM 128      /* queries per block */
#define WG_BN 128      /* keys per tile */
#define WG_HD 128
#define WG_STAGES 3
#define WG_TILE_BYTES (WG_BN * WG_HD * 2)                                /* one K or V tile: 32 KB */
#define WG_Q_BYTES (WG_BM * WG_HD * 2)                                   /* 32 KB */
#define WG_SMEM (1024 + WG_Q_BYTES + WG_STAGES * 2 * WG_TILE_BYTES + 64) /* + alignment slack, mbarriers */

__device__ __forceinline__ void cp_async16_s(uint32_t s, const void *gmem, bool valid)
{
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}

/* rows r0 .. r0+ROWS-1 of one head (row stride ld elements) into a swizzled [2][ROWS][64]
 * tile at shared byte address dst; rows outside [0, T) are zero-filled. 256 threads: each
 * moves one fixed 16-byte chunk of rows tid/16 + 16i. */
template <int ROWS>
__device__ __forceinline__ void wg_load_tile(uint32_t dst, const bf16 *base, long ld, int r0, int T, int tid)
{
    const int ch = tid & 15, half = ch >> 3, cc = ch & 7, rr = tid >> 4;
    const uint32_t off = (uint32_t)(half * ROWS * 128 + rr * 128 + ((cc ^ (rr & 7)) << 4));
#pragma unroll
    for (int i = 0; i < ROWS / 16; i++) {
        const int gr = r0 + rr + 16 * i;
        const bool ok = gr >= 0 && gr < T;
        cp_async16_s(dst + off + (uint32_t)(i * 16 * 128), ok ? base + (size_t)gr * ld + ch * 8 : base, ok);
    }
}

/* shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride
 * byte offsets (each >> 4) */
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) |
           (1ull << 62);
}

#if defined(NN_ATTN_WGMMA) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_ENABLED 1
#else
#define WG_ENABLED 0
#endif

#if WG_ENABLED
__device__ __forceinline__ void wg_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wg_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* keeps the compiler from moving reads/writes of accumulator registers across the
 * asynchronous MMA's issue and wait */
__device__ __forceinline__ void wg_pin(float (&d)[64])
{
#pragma unroll
    for (int i = 0; i < 64; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}

#define WG_D64                                                                                                        \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
    "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "  \
    "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define WG_R8(i)                                                                                                \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
        "+f"(d[i + 7])
#define WG_R64 WG_R8(0), WG_R8(8), WG_R8(16), WG_R8(24), WG_R8(32), WG_R8(40), WG_R8(48), WG_R8(56)

/* d[64x128] (+)= A[64x16] (shared, K-major) * B[16x128] (shared, K-major) */
__device__ __forceinline__ void wgmma_ss(float (&d)[64], uint64_t da, uint64_t db, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_D64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WG_R64
                 : "l"(da), "l"(db), "r"(accumulate));
}
/* d[64x128] += A[64x16] (registers) * B[16x128] (shared, N-major) */
__device__ __forceinline__ void wgmma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_D64
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : WG_R64
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
/* mbarriers and TMA (the TMA variant) */
__device__ __forceinline__ void mbar_init(uint32_t bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
    asm volatile("{\n.reg .pred p;\nWG_WAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WG_WAIT_%=;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
/* box {64 dims, 1 head, 128 rows} at (dim c0, head c1, row c2) -> [128][64] swizzled at dst */
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap *tm, int c0, int c1, int c2, uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
                 "%4}], [%5];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(tm)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ float wg_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
#endif

template <bool PIPE, bool TMA, bool PP>
__global__ void __launch_bounds__(WG_THREADS, 1)
    flash_wgmma_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ qkv, const int32_t *__restrict__ pos, int T,
                       int H, int KV, int window, float scale_log2, const __grid_constant__ CUtensorMap tm)
{
#if WG_ENABLED
    extern __shared__ unsigned char wg_smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(wg_smem_raw);
    const uint32_t sQ = (raw + 1023u) & ~1023u; /* the swizzle pattern repeats every 1024 bytes */
    const uint32_t sKV = sQ + WG_Q_BYTES;       /* stage s: K at sKV + 2s*TILE, V after it */
    unsigned char *smem_gen = wg_smem_raw + (sQ - raw);

    const int q0 = (gridDim.x - 1 - blockIdx.x) * WG_BM; /* longest tiles first */
    const int h = blockIdx.y, kvh = h / (H / KV);
    const long ld = (long)(H + 2 * KV) * WG_HD;
    const bf16 *gQ = qkv + (size_t)h * WG_HD;
    const bf16 *gK = qkv + (size_t)(H + kvh) * WG_HD;
    const bf16 *gV = qkv + (size_t)(H + KV + kvh) * WG_HD;
    const int tid = threadIdx.x, warp = (tid >> 5) & 3, lane = tid & 31;
    const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0); /* warp-uniform for the compiler */
    const int gid = lane >> 2, tig = lane & 3;

    const int q_last = min(q0 + WG_BM, T) - 1;
    const int kv_begin = key_lo(pos, q0, window);
    const int n_tiles = (q_last + 1 - kv_begin + WG_BN - 1) / WG_BN;
    /* the thread that issues the TMA loads: with PP the second warpgroup's first (it runs
     * half a tile behind, so it is the last to release a stage) */
    const int loader = PP ? 128 : 0;

    /* TMA: full[st] completes when stage st's K and V (and Q, with tile 0) have landed;
     * empty[st] when all 256 threads are done with it. Thread 0 issues every load, one
     * tile ahead, after the stage's previous tile was released. */
    const uint32_t bar_full = sKV + WG_STAGES * 2 * WG_TILE_BYTES, bar_empty = bar_full + 8 * WG_STAGES;
    auto tma_tile = [&](int j) {
        const int st = j % WG_STAGES;
        const uint32_t full = bar_full + 8 * st, dst = sKV + (uint32_t)(st * 2 * WG_TILE_BYTES);
        if (j >= WG_STAGES)
            mbar_wait(bar_empty + 8 * st, (uint32_t)((j / WG_STAGES - 1) & 1));
        mbar_expect_tx(full, 2 * WG_TILE_BYTES + (j == 0 ? WG_Q_BYTES : 0));
        if (j == 0) {
            tma_load(sQ, &tm, 0, h, q0, full);
            tma_load(sQ + WG_Q_BYTES / 2, &tm, 64, h, q0, full);
        }
        const int row = kv_begin + j * WG_BN;
        tma_load(dst, &tm, 0, H + kvh, row, full);
        tma_load(dst + WG_TILE_BYTES / 2, &tm, 64, H + kvh, row, full);
        tma_load(dst + WG_TILE_BYTES, &tm, 0, H + KV + kvh, row, full);
        tma_load(dst + WG_TILE_BYTES + WG_TILE_BYTES / 2, &tm, 64, H + KV + kvh, row, full);
    };
    if (TMA) {
        if (tid == 0) {
            for (int st = 0; st < WG_STAGES; st++) {
                mbar_init(bar_full + 8 * st, 1);
                mbar_init(bar_empty + 8 * st, WG_THREADS);
            }
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        }
        __syncthreads();
        if (tid == 0)
            tma_tile(0);
    } else {
        wg_load_tile<WG_BM>(sQ, gQ, ld, q0, T, tid);
        wg_load_tile<WG_BN>(sKV, gK, ld, kv_begin, T, tid);
        wg_load_tile<WG_BN>(sKV + WG_TILE_BYTES, gV, ld, kv_begin, T, tid);
        cp_async_commit();
    }

    /* this warpgroup's rows [g0, g1] see keys [lo(g0), g1]: tiles [jb, je) */
    const int g0 = q0 + 64 * wg, g1 = min(g0 + 63, T - 1);
    int jb = 0, je = 0;
    if (g0 < T) {
        jb = (key_lo(pos, g0, window) - kv_begin) / WG_BN;
        je = min(n_tiles, (g1 - kv_begin) / WG_BN + 1);
    }
    jb = __shfl_sync(0xffffffffu, jb, 0); /* warp-uniform for the compiler too */
    je = __shfl_sync(0xffffffffu, je, 0);
    /* this thread's two rows, and its warp's 16 */
    const int w0 = g0 + warp * 16;
    const int r_a = w0 + gid, r_b = r_a + 8;
    const int lo_a = r_a < T ? key_lo(pos, r_a, window) : INT_MAX;
    const int lo_b = r_b < T ? key_lo(pos, r_b, window) : INT_MAX;
    const int w_lo_max = w0 + 15 < T ? key_lo(pos, w0 + 15, window) : INT_MAX;

    float o[64], s[64];
    uint32_t pa[8][4];
#pragma unroll
    for (int i = 0; i < 64; i++)
        o[i] = 0.0f, s[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; k++)
        pa[k][0] = pa[k][1] = pa[k][2] = pa[k][3] = 0u;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;

    /* K-major operands: rows 128 bytes apart, 8-row groups 1024 apart (LBO unused: 16);
     * V as N-major: the two 64-dim halves WG_TILE_BYTES/2 apart, 8-key groups 1024 apart */
    const uint64_t dQ = wg_desc(sQ + wg * 64 * 128, 16, 1024);
    const uint64_t dK0 = wg_desc(sKV, 16, 1024);
    const uint64_t dV0 = wg_desc(sKV + WG_TILE_BYTES, WG_BN * 128, 1024);

    if (PP && wg == 1)
        asm volatile("bar.arrive 3, 256;\n" ::: "memory"); /* the first turn is the first warpgroup's */
    for (int j = 0; j <= n_tiles; j++) {
        if (TMA) {
            if (tid == loader && j + 1 < n_tiles)
                tma_tile(j + 1);
            /* every thread waits for every tile, used or skipped, so that no thread can
             * release a stage a whole ring ahead of the others */
            if (j < n_tiles)
                mbar_wait(bar_full + 8 * (j % WG_STAGES), (uint32_t)((j / WG_STAGES) & 1));
        } else {
            cp_async_wait<0>();
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); /* cp.async data -> wgmma reads */
            __syncthreads(); /* also: every warp is done with the stage refilled below */
            if (j + 1 < n_tiles) {
                const uint32_t st = sKV + (uint32_t)(((j + 1) % WG_STAGES) * 2 * WG_TILE_BYTES);
                wg_load_tile<WG_BN>(st, gK, ld, kv_begin + (j + 1) * WG_BN, T, tid);
                wg_load_tile<WG_BN>(st + WG_TILE_BYTES, gV, ld, kv_begin + (j + 1) * WG_BN, T, tid);
            }
            cp_async_commit(); /* possibly empty: keeps the group count simple */
        }

        const bool do_s = j >= jb && j < je;
        const bool do_pv = PIPE && j - 1 >= jb && j - 1 < je;
        /* stage offsets in descriptor units (16 bytes): K of tile j, V of the tile PV uses */
        const uint64_t k_off = (uint64_t)((j % WG_STAGES) * 2 * WG_TILE_BYTES) >> 4;
        const uint64_t v_off = (uint64_t)(((PIPE ? j + WG_STAGES - 1 : j) % WG_STAGES) * 2 * WG_TILE_BYTES) >> 4;
        auto issue_s = [&]() {
#pragma unroll
            for (int ks = 0; ks < 8; ks++) {
                /* k-step ks: half ks/4, 32 bytes per step inside the 128-byte row */
                const uint64_t a_off = (uint64_t)((ks >> 2) * WG_Q_BYTES / 2 + (ks & 3) * 32) >> 4;
                const uint64_t b_off = (uint64_t)((ks >> 2) * WG_TILE_BYTES / 2 + (ks & 3) * 32) >> 4;
                wgmma_ss(s, dQ + a_off, dK0 + k_off + b_off, ks > 0);
            }
            wg_commit();
        };
        auto issue_pv = [&]() {
#pragma unroll
            for (int kk = 0; kk < 8; kk++) /* 16 keys = 2048 bytes per step */
                wgmma_rs(o, pa[kk], dV0 + v_off + (uint64_t)(kk * 2048 >> 4));
            wg_commit();
        };
        float alpha_a = 1.0f, alpha_b = 1.0f;
        auto softmax = [&]() {
            const int kbase = kv_begin + j * WG_BN;
            const bool full = kbase >= w_lo_max && kbase + WG_BN - 1 <= w0;
            if (!full) {
#pragma unroll
                for (int n = 0; n < 16; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int key = kbase + n * 8 + 2 * tig + (e & 1);
                        const int row = e < 2 ? r_a : r_b, lo = e < 2 ? lo_a : lo_b;
                        if (key < lo || key > row)
                            s[n * 4 + e] = -INFINITY;
                    }
            }
            float mx_a = m_a, mx_b = m_b; /* raw scores (scale > 0 keeps the order) */
#pragma unroll
            for (int n = 0; n < 16; n++) {
                mx_a = fmaxf(mx_a, fmaxf(s[n * 4 + 0], s[n * 4 + 1]));
                mx_b = fmaxf(mx_b, fmaxf(s[n * 4 + 2], s[n * 4 + 3]));
            }
            mx_a = quad_max(mx_a);
            mx_b = quad_max(mx_b);
            /* p = 2^(s * c - max * c); nothing seen yet (max -inf): base 0, no NaN */
            const float base_a = mx_a == -INFINITY ? 0.0f : mx_a * scale_log2;
            const float base_b = mx_b == -INFINITY ? 0.0f : mx_b * scale_log2;
            alpha_a = wg_exp2(m_a == -INFINITY ? -INFINITY : m_a * scale_log2 - base_a);
            alpha_b = wg_exp2(m_b == -INFINITY ? -INFINITY : m_b * scale_log2 - base_b);
            m_a = mx_a;
            m_b = mx_b;
            float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
            for (int n = 0; n < 16; n++) {
                s[n * 4 + 0] = wg_exp2(fmaf(s[n * 4 + 0], scale_log2, -base_a));
                s[n * 4 + 1] = wg_exp2(fmaf(s[n * 4 + 1], scale_log2, -base_a));
                s[n * 4 + 2] = wg_exp2(fmaf(s[n * 4 + 2], scale_log2, -base_b));
                s[n * 4 + 3] = wg_exp2(fmaf(s[n * 4 + 3], scale_log2, -base_b));
                sum_a += s[n * 4 + 0] + s[n * 4 + 1];
                sum_b += s[n * 4 + 2] + s[n * 4 + 3];
            }
            l_a = l_a * alpha_a + sum_a;
            l_b = l_b * alpha_b + sum_b;
        };
        auto rescale_pack = [&]() {
#pragma unroll
            for (int n = 0; n < 16; n++) {
                o[n * 4 + 0] *= alpha_a;
                o[n * 4 + 1] *= alpha_a;
                o[n * 4 + 2] *= alpha_b;
                o[n * 4 + 3] *= alpha_b;
            }
            /* the S accumulators are already in the A-fragment layout of P */
#pragma unroll
            for (int kk = 0; kk < 8; kk++) {
                pa[kk][0] = pack_bf16x2(s[8 * kk + 0], s[8 * kk + 1]);
                pa[kk][1] = pack_bf16x2(s[8 * kk + 2], s[8 * kk + 3]);
                pa[kk][2] = pack_bf16x2(s[8 * kk + 4], s[8 * kk + 5]);
                pa[kk][3] = pack_bf16x2(s[8 * kk + 6], s[8 * kk + 7]);
            }
        };
        /* PP: the warpgroups take turns issuing their MMAs (named barriers 3 and 4), so the
         * softmax of one runs while the tensor cores work for the other. Each waits for its
         * turn, issues, hands the turn over; the second warpgroup's first hand-over is given
         * before the loop and its last one is left out, so every wait has its arrive. */
        if (PP)
            asm volatile("bar.sync %0, 256;\n" ::"r"(3 + wg) : "memory");
        auto handoff = [&]() {
            if (PP && !(wg == 1 && j == n_tiles))
                asm volatile("bar.arrive %0, 256;\n" ::"r"(4 - wg) : "memory");
        };
        /* each issue and its wait in one branch (the compiler keeps the MMAs asynchronous
         * only when it can see that) */
        if (PIPE && do_s && do_pv) { /* the steady state */
            wg_fence();
            issue_s();
            issue_pv();
            handoff();
            wg_wait<1>(); /* S_j done, PV_{j-1} may still run */
            wg_pin(s);
            softmax();
            wg_wait<0>();
            wg_pin(o);
            rescale_pack();
        } else if (do_s) {
            wg_fence();
            issue_s();
            if (PIPE)
                handoff();
            wg_wait<0>();
            wg_pin(s);
            softmax();
            rescale_pack();
            if (!PIPE) {
                wg_fence();
                issue_pv();
                handoff();
                wg_wait<0>();
                wg_pin(o);
            }
        } else if (do_pv) { /* PIPE: the last tile's PV */
            wg_fence();
            issue_pv();
            handoff();
            wg_wait<0>();
            wg_pin(o);
        } else {
            handoff();
        }
        if (TMA) { /* the tile whose V was used last is free (K went before it) */
            const int done = PIPE ? j - 1 : j;
            if (done >= 0 && done < n_tiles)
                mbar_arrive(bar_empty + 8 * (done % WG_STAGES));
        }
    }

    /* normalise, stage the 64 x 128 bf16 rows in this warpgroup's Q rows (same swizzle:
     * conflict-free), then 16-byte stores */
    const float la = quad_sum(l_a), lb = quad_sum(l_b);
    const float inv_a = la > 0.0f ? 1.0f / la : 0.0f, inv_b = lb > 0.0f ? 1.0f / lb : 0.0f;
    const int ra = warp * 16 + gid, rb = ra + 8; /* rows inside the warpgroup */
    unsigned char *sO = smem_gen + wg * 64 * 128;
#pragma unroll
    for (int n = 0; n < 16; n++) {
        const int half = n >> 3, c = n & 7;
        __nv_bfloat162 va = __floats2bfloat162_rn(o[n * 4 + 0] * inv_a, o[n * 4 + 1] * inv_a);
        __nv_bfloat162 vb = __floats2bfloat162_rn(o[n * 4 + 2] * inv_b, o[n * 4 + 3] * inv_b);
        *reinterpret_cast<__nv_bfloat162 *>(sO + half * (WG_Q_BYTES / 2) + ra * 128 + ((c ^ (ra & 7)) << 4) + tig * 4) =
            va;
        *reinterpret_cast<__nv_bfloat162 *>(sO + half * (WG_Q_BYTES / 2) + rb * 128 + ((c ^ (rb & 7)) << 4) + tig * 4) =
            vb;
    }
    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory"); /* this warpgroup's 4 warps */
    const long ldo = (long)H * WG_HD;
    const int t128 = tid & 127;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int c = t128 + 128 * i; /* 64 rows x 16 chunks */
        const int r = c >> 4, ch = c & 15, half = ch >> 3, cc = ch & 7;
        const int gr = g0 + r;
        if (gr < T) {
            const uint4 v =
                *reinterpret_cast<const uint4 *>(sO + half * (WG_Q_BYTES / 2) + r * 128 + ((cc ^ (r & 7)) << 4));
            *reinterpret_cast<uint4 *>(out + (size_t)gr * ldo + h * WG_HD + ch * 8) = v;
        }
    }
#endif
}

/* 1 when this build carries the wgmma kernel and the current device runs it (sm_90) */
static int wgmma_usable()
{
#if defined(NN_ATTN_WGMMA)
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return major == 9 && minor == 0;
#else
    return 0;
#endif
}

template <bool PIPE, bool TMA, bool PP = false>
static int launch_wgmma(bf16 *out, const bf16 *qkv, const int32_t *pos, int T, int H, int KV, int window, float scale,
                        cudaStream_t s, char *err, size_t errlen)
{
    static bool attr_set = false; /* host-side, once per instantiation (not a stream op) */
    if (!attr_set)
        CUDA_TRY(cudaFuncSetAttribute(flash_wgmma_kernel<PIPE, TMA, PP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      WG_SMEM),
                 err, errlen);
    attr_set = true;
    CUtensorMap tm;
    memset(&tm, 0, sizeof tm);
    if (TMA) {
        /* qkv as [T][H + 2 KV][128] bf16; a box is 64 dims x 1 head x 128 rows, 128-byte
         * swizzled (the wgmma layout); rows past T read as zeros */
        cuuint64_t dim[3] = {WG_HD, (cuuint64_t)(H + 2 * KV), (cuuint64_t)T};
        cuuint64_t stride[2] = {WG_HD * 2, (cuuint64_t)(H + 2 * KV) * WG_HD * 2};
        cuuint32_t box[3] = {64, 1, WG_BN}, estride[3] = {1, 1, 1};
        CUresult r = cuTensorMapEncodeTiled(&tm, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)qkv, dim, stride, box,
                                            estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
        if (r != CUDA_SUCCESS)
            return df_err(err, errlen, -EIO, "nn_attention_packed_tile_cuda: cuTensorMapEncodeTiled: error %d", (int)r);
    }
    dim3 grid((T + WG_BM - 1) / WG_BM, H);
    const float log2e = 1.4426950408889634f;
    flash_wgmma_kernel<PIPE, TMA, PP>
        <<<grid, WG_THREADS, WG_SMEM, s>>>(out, qkv, pos, T, H, KV, window, scale * log2e, tm);
    CUDA_LAUNCHED("flash_wgmma_kernel", err, errlen);
    return 0;
}

/* ---- the simple kernel ----------------------------------------------------------- */

#define SA_MAX_PER_LANE 8 /* hd <= 256 */

__global__ void simple_attn_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ qkv,
                                   const int32_t *__restrict__ pos, int T, int H, int KV, int hd, int window,
                                   float scale)
{
    int warps = blockDim.x >> 5, lane = threadIdx.x & 31;
    long item = (long)blockIdx.x * warps + (threadIdx.x >> 5);
    if (item >= (long)T * H)
        return;
    int t = (int)(item / H), h = (int)(item - (long)t * H), kvh = h / (H / KV);
    long ld = (long)(H + 2 * KV) * hd;
    const bf16 *q = qkv + (size_t)t * ld + (size_t)h * hd;
    float qr[SA_MAX_PER_LANE], acc[SA_MAX_PER_LANE];
#pragma unroll
    for (int k = 0; k < SA_MAX_PER_LANE; k++) {
        int i = lane + 32 * k;
        qr[k] = i < hd ? bf2f(q[i]) * scale : 0.0f;
        acc[k] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int j = key_lo(pos, t, window); j <= t; j++) {
        const bf16 *kr = qkv + (size_t)j * ld + (size_t)(H + kvh) * hd;
        const bf16 *vr = qkv + (size_t)j * ld + (size_t)(H + KV + kvh) * hd;
        float dot = 0.0f;
#pragma unroll
        for (int k = 0; k < SA_MAX_PER_LANE; k++) {
            int i = lane + 32 * k;
            if (i < hd)
                dot += qr[k] * bf2f(kr[i]);
        }
        dot = warp_sum(dot);
        float mn = fmaxf(m, dot);
        float alpha = __expf(m - mn), p = __expf(dot - mn);
        l = l * alpha + p;
#pragma unroll
        for (int k = 0; k < SA_MAX_PER_LANE; k++) {
            int i = lane + 32 * k;
            if (i < hd)
                acc[k] = acc[k] * alpha + p * bf2f(vr[i]);
        }
        m = mn;
    }
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    bf16 *o = out + (size_t)t * H * hd + (size_t)h * hd;
#pragma unroll
    for (int k = 0; k < SA_MAX_PER_LANE; k++) {
        int i = lane + 32 * k;
        if (i < hd)
            o[i] = f2bf(acc[k] * inv);
    }
}

static int check_shape(int T, int H, int KV, int hd, char *err, size_t errlen)
{
    if (T < 0 || H <= 0 || KV <= 0 || H % KV || hd <= 0 || hd % 2 || hd > 256)
        return df_err(err, errlen, -EINVAL,
                      "nn_attention_packed_cuda: T %d, H %d, KV %d (must divide H), hd %d (even, <= 256)", T, H, KV,
                      hd);
    return 0;
}

int nn_attention_packed_simple_cuda(nn_bf16_cuda *out, const nn_bf16_cuda *qkv, const int32_t *pos, int T, int H,
                                    int KV, int hd, int window, float scale, cudaStream_t s, char *err, size_t errlen)
{
    CUDA_TRY_RC(check_shape(T, H, KV, hd, err, errlen));
    if (T == 0)
        return 0;
    long items = (long)T * H;
    int warps = 8;
    simple_attn_kernel<<<(unsigned)((items + warps - 1) / warps), warps * 32, 0, s>>>(as_bf(out), as_bf(qkv), pos, T, H,
                                                                                      KV, hd, window, scale);
    CUDA_LAUNCHED("simple_attn_kernel", err, errlen);
    return 0;
}

int nn_attention_packed_tile_cuda(nn_bf16_cuda *out, const nn_bf16_cuda *qkv, const int32_t *pos, int T, int H, int KV,
                                  int hd, int window, float scale, int tile, cudaStream_t s, char *err, size_t errlen)
{
    CUDA_TRY_RC(check_shape(T, H, KV, hd, err, errlen));
    if (tile < 0 || tile >= NN_ATTN_TILES)
        return df_err(err, errlen, -EINVAL, "nn_attention_packed_tile_cuda: tile %d outside [0, %d)", tile,
                      NN_ATTN_TILES);
    if (T == 0)
        return 0;
    bf16 *o = as_bf(out);
    const bf16 *x = as_bf(qkv);
    if (hd == 128 && tile >= NN_ATTN_TILE_WGMMA) {
        if (!wgmma_usable())
            return launch_flash<128, 2, 64>(o, x, pos, T, H, KV, window, scale, s, err, errlen); /* no sm_90a here */
        switch (tile) {
        case NN_ATTN_TILE_WGMMA: return launch_wgmma<true, false>(o, x, pos, T, H, KV, window, scale, s, err, errlen);
        case NN_ATTN_TILE_WGMMA_SERIAL:
            return launch_wgmma<false, false>(o, x, pos, T, H, KV, window, scale, s, err, errlen);
        case NN_ATTN_TILE_WGMMA_TMA:
            return launch_wgmma<true, true>(o, x, pos, T, H, KV, window, scale, s, err, errlen);
        default: return launch_wgmma<true, true, true>(o, x, pos, T, H, KV, window, scale, s, err, errlen);
        }
    }
    if (hd == 128 && tile == NN_ATTN_TILE_128x64)
        return launch_flash<128, 2, 64>(o, x, pos, T, H, KV, window, scale, s, err, errlen);
    if (hd == 128 && tile == NN_ATTN_TILE_128x32)
        return launch_flash<128, 2, 32>(o, x, pos, T, H, KV, window, scale, s, err, errlen);
    switch (hd) {
    case 16: return launch_flash<16, 1, 64>(o, x, pos, T, H, KV, window, scale, s, err, errlen);
    case 32: return launch_flash<32, 1, 64>(o, x, pos, T, H, KV, window, scale, s, err, errlen);
    case 64: return launch_flash<64, 1, 64>(o, x, pos, T, H, KV, window, scale, s, err, errlen);
    case 128: return launch_flash<128, 1, 64>(o, x, pos, T, H, KV, window, scale, s, err, errlen);
    default: return nn_attention_packed_simple_cuda(out, qkv, pos, T, H, KV, hd, window, scale, s, err, errlen);
    }
}

int nn_attention_packed_cuda(nn_bf16_cuda *out, const nn_bf16_cuda *qkv, const int32_t *pos, int T, int H, int KV,
                             int hd, int window, float scale, cudaStream_t s, char *err, size_t errlen)
{
    return nn_attention_packed_tile_cuda(out, qkv, pos, T, H, KV, hd, window, scale, NN_ATTN_TILE_DEFAULT, s, err,
                                         errlen);
}
