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
 * The simple kernel (any even hd <= 256): one warp per (query, head), fp32 online
 * softmax over its keys; the fallback and a second opinion in the tests. */
#include "nn/nn_cuda_device.cuh"

#include <climits>
#include <cstdint>

/* ---- the flash kernel ------------------------------------------------------------ */

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    int n = valid ? 16 : 0; /* 0: zero-fill, nothing read */
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

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
        return df_cuda_errf(err, errlen, -EINVAL,
                            "nn_attention_packed_cuda: T %d, H %d, KV %d (must divide H), hd %d (even, <= 256)", T, H,
                            KV, hd);
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
        return df_cuda_errf(err, errlen, -EINVAL, "nn_attention_packed_tile_cuda: tile %d outside [0, %d)", tile,
                            NN_ATTN_TILES);
    if (T == 0)
        return 0;
    bf16 *o = as_bf(out);
    const bf16 *x = as_bf(qkv);
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
