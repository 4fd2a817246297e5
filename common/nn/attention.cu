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

#define FA_BM 64
#define FA_BN 64
#define FA_THREADS 128

template <int HD> constexpr int fa_smem_bytes()
{
    return (FA_BM + 4 * FA_BN) * (HD + 8) * 2;
}

template <int HD>
__global__ void __launch_bounds__(FA_THREADS)
    flash_fwd_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ qkv, const int32_t *__restrict__ pos, int T,
                     int H, int KV, int window, float scale_log2)
{
    constexpr int LD = HD + 8;      /* padded smem row (elements) */
    constexpr int KSTEPS = HD / 16; /* k-steps of S = Q K^T */
    constexpr int NT_S = FA_BN / 8; /* n-tiles of S per warp */
    constexpr int NT_O = HD / 8;    /* n-tiles of O per warp */
    constexpr int CHUNKS = HD / 8;  /* 16-byte chunks per row */
    extern __shared__ __align__(16) unsigned char fa_smem[];
    bf16 *sQ = reinterpret_cast<bf16 *>(fa_smem); /* [BM][LD] */
    bf16 *sK = sQ + FA_BM * LD;                   /* [2][BN][LD] */
    bf16 *sV = sK + 2 * FA_BN * LD;               /* [2][BN][LD] */

    const int q0 = (gridDim.x - 1 - blockIdx.x) * FA_BM; /* longest tiles first */
    const int h = blockIdx.y, kvh = h / (H / KV);
    const long ld = (long)(H + 2 * KV) * HD;
    const bf16 *gQ = qkv + (size_t)h * HD;
    const bf16 *gK = qkv + (size_t)(H + kvh) * HD;
    const bf16 *gV = qkv + (size_t)(H + KV + kvh) * HD;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int gid = lane >> 2, tig = lane & 3;

    const int q_last = min(q0 + FA_BM, T) - 1;
    const int kv_begin = key_lo(pos, q0, window);
    const int n_tiles = (q_last + 1 - kv_begin + FA_BN - 1) / FA_BN;

    auto load_tile = [&](bf16 *dst, const bf16 *base, int r0) {
        for (int c = tid; c < FA_BN * CHUNKS; c += FA_THREADS) {
            int r = c / CHUNKS, ch = c - r * CHUNKS;
            int gr = r0 + r;
            bool ok = gr >= 0 && gr < T;
            cp_async16(dst + r * LD + ch * 8, ok ? base + (size_t)gr * ld + ch * 8 : base, ok);
        }
    };
    load_tile(sQ, gQ, q0);
    load_tile(sK, gK, kv_begin);
    load_tile(sV, gV, kv_begin);
    cp_async_commit();

    const int r_a = q0 + warp * 16 + gid, r_b = r_a + 8;
    const int lo_a = r_a < T ? key_lo(pos, r_a, window) : INT_MAX; /* rows past T see nothing */
    const int lo_b = r_b < T ? key_lo(pos, r_b, window) : INT_MAX;

    float o[NT_O][4];
#pragma unroll
    for (int n = 0; n < NT_O; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
    uint32_t qf[KSTEPS][4];

    for (int j = 0; j < n_tiles; j++) {
        const int buf = j & 1;
        if (j + 1 < n_tiles) {
            load_tile(sK + (buf ^ 1) * FA_BN * LD, gK, kv_begin + (j + 1) * FA_BN);
            load_tile(sV + (buf ^ 1) * FA_BN * LD, gV, kv_begin + (j + 1) * FA_BN);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (j == 0) {
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++)
                ldsm_x4(qf[ks], sQ + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + ks * 16 + (lane >> 4) * 8);
        }
        const bf16 *ks_ = sK + buf * FA_BN * LD;
        const bf16 *vs_ = sV + buf * FA_BN * LD;
        const int kbase = kv_begin + j * FA_BN;

        /* S = Q K^T for this warp's 16 rows x 64 keys */
        float s[NT_S][4];
#pragma unroll
        for (int n = 0; n < NT_S; n++)
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ks++) {
#pragma unroll
            for (int np = 0; np < NT_S / 2; np++) {
                uint32_t b[4];
                ldsm_x4(b, ks_ + (np * 16 + (lane & 7) + (lane >> 4) * 8) * LD + ks * 16 + ((lane >> 3) & 1) * 8);
                mma_bf16(s[2 * np], qf[ks], b[0], b[1]);
                mma_bf16(s[2 * np + 1], qf[ks], b[2], b[3]);
            }
        }

        /* mask, scale (log2 domain), running max over the quad that shares a row */
        float mx_a = m_a, mx_b = m_b;
#pragma unroll
        for (int n = 0; n < NT_S; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = kbase + n * 8 + 2 * tig + (e & 1);
                int row = e < 2 ? r_a : r_b, lo = e < 2 ? lo_a : lo_b;
                s[n][e] = (key >= lo && key <= row) ? s[n][e] * scale_log2 : -INFINITY;
            }
            mx_a = fmaxf(mx_a, fmaxf(s[n][0], s[n][1]));
            mx_b = fmaxf(mx_b, fmaxf(s[n][2], s[n][3]));
        }
        mx_a = quad_max(mx_a);
        mx_b = quad_max(mx_b);
        const float base_a = mx_a == -INFINITY ? 0.0f : mx_a; /* nothing seen yet: no NaN */
        const float base_b = mx_b == -INFINITY ? 0.0f : mx_b;
        const float alpha_a = exp2f(m_a - base_a), alpha_b = exp2f(m_b - base_b);
        m_a = mx_a;
        m_b = mx_b;
        float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
        for (int n = 0; n < NT_S; n++) {
            s[n][0] = exp2f(s[n][0] - base_a);
            s[n][1] = exp2f(s[n][1] - base_a);
            s[n][2] = exp2f(s[n][2] - base_b);
            s[n][3] = exp2f(s[n][3] - base_b);
            sum_a += s[n][0] + s[n][1];
            sum_b += s[n][2] + s[n][3];
        }
        l_a = l_a * alpha_a + sum_a;
        l_b = l_b * alpha_b + sum_b;
#pragma unroll
        for (int n = 0; n < NT_O; n++) {
            o[n][0] *= alpha_a;
            o[n][1] *= alpha_a;
            o[n][2] *= alpha_b;
            o[n][3] *= alpha_b;
        }

        /* O += P V: the S accumulators are already in the A-fragment layout */
#pragma unroll
        for (int kk = 0; kk < FA_BN / 16; kk++) {
            uint32_t pa[4];
            pa[0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
            pa[1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
            pa[2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pa[3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int dp = 0; dp < NT_O / 2; dp++) {
                uint32_t b[4];
                ldsm_x4_t(b, vs_ + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp * 16 + (lane >> 4) * 8);
                mma_bf16(o[2 * dp], pa, b[0], b[1]);
                mma_bf16(o[2 * dp + 1], pa, b[2], b[3]);
            }
        }
        __syncthreads(); /* this buffer is refilled by the next iteration's loads */
    }

    l_a = quad_sum(l_a);
    l_b = quad_sum(l_b);
    const float inv_a = l_a > 0.0f ? 1.0f / l_a : 0.0f, inv_b = l_b > 0.0f ? 1.0f / l_b : 0.0f;
    const long ldo = (long)H * HD;
#pragma unroll
    for (int n = 0; n < NT_O; n++) {
        int col = h * HD + n * 8 + 2 * tig;
        if (r_a < T)
            *reinterpret_cast<__nv_bfloat162 *>(out + (size_t)r_a * ldo + col) =
                __floats2bfloat162_rn(o[n][0] * inv_a, o[n][1] * inv_a);
        if (r_b < T)
            *reinterpret_cast<__nv_bfloat162 *>(out + (size_t)r_b * ldo + col) =
                __floats2bfloat162_rn(o[n][2] * inv_b, o[n][3] * inv_b);
    }
}

template <int HD>
static int launch_flash(bf16 *out, const bf16 *qkv, const int32_t *pos, int T, int H, int KV, int window, float scale,
                        cudaStream_t s, char *err, size_t errlen)
{
    constexpr int smem = fa_smem_bytes<HD>();
    static bool attr_set = false; /* host-side, once per instantiation (not a stream op) */
    if (!attr_set && smem > 48 * 1024)
        CUDA_TRY(cudaFuncSetAttribute(flash_fwd_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), err,
                 errlen);
    attr_set = true;
    dim3 grid((T + FA_BM - 1) / FA_BM, H);
    const float log2e = 1.4426950408889634f;
    flash_fwd_kernel<HD><<<grid, FA_THREADS, smem, s>>>(out, qkv, pos, T, H, KV, window, scale * log2e);
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

int nn_attention_packed_cuda(nn_bf16_cuda *out, const nn_bf16_cuda *qkv, const int32_t *pos, int T, int H, int KV,
                             int hd, int window, float scale, cudaStream_t s, char *err, size_t errlen)
{
    CUDA_TRY_RC(check_shape(T, H, KV, hd, err, errlen));
    if (T == 0)
        return 0;
    bf16 *o = as_bf(out);
    const bf16 *x = as_bf(qkv);
    switch (hd) {
    case 16: return launch_flash<16>(o, x, pos, T, H, KV, window, scale, s, err, errlen);
    case 32: return launch_flash<32>(o, x, pos, T, H, KV, window, scale, s, err, errlen);
    case 64: return launch_flash<64>(o, x, pos, T, H, KV, window, scale, s, err, errlen);
    case 128: return launch_flash<128>(o, x, pos, T, H, KV, window, scale, s, err, errlen);
    default: return nn_attention_packed_simple_cuda(out, qkv, pos, T, H, KV, hd, window, scale, s, err, errlen);
    }
}
