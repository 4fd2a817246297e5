/* dflash_attn_cuda.cu: the DFlash attention of one drafter layer, forward and backward, in
 * three schemes (see dflash_attn_cuda.h and docs/drafter_cuda.md "Attention"):
 *
 *   fused (default): flash attention over the DFlash mask. A query tile is one anchor block's
 *     B rows x the G query heads of one KV head (they share K/V; in Qh's layout these rows are
 *     contiguous), cut in CTAs of 64 rows = 4 warps x 16 rows. Keys come in tiles of 64 rows
 *     of Kh/Vh: the context tiles from min_k lo_k up to hi_j (only the last one is partial;
 *     on sliding layers also the first, row by row), then one tile holding the block's own B
 *     keys. Scores, P V, and in the backward dP, dQ, dK, dV are mma.sync m16n8k16 bf16 with
 *     fp32 accumulation; fragments come from shared memory through ldmatrix (rows padded by
 *     8 elements: no bank conflicts), P and dS go from accumulators to A fragments in
 *     registers. Softmax online in base 2 (exp2 of scale*log2e-scaled scores), the LSE saved
 *     in natural log for the backward (and for the GEMM backward, which reads the same).
 *     Backward: D = rowsum(dO . O) per row; a dK/dV kernel per (64 context keys, KV head,
 *     range of blocks): it visits, in block order, the blocks of its range whose context
 *     window meets the tile, 32 query rows at a time, and stores each dS^T tile (bf16, the
 *     values its dK uses) in the workspace; the ranges' partial sums (at most 8) are added in
 *     range order by a last kernel; the block keys' dK/dV by one CTA per (block, KV head).
 *     Then a dQ kernel per query tile: dQ = scale dS K over exactly the stored tiles (a GEMM
 *     over the block's visible keys: S and dP are computed once, in the dK/dV kernel). Every
 *     sum has a fixed order, no float atomics: two runs are bit-identical.
 *   fused-rc: the same forward and dK/dV; the first backward's dQ kernel, which recomputes S
 *     and dP per query tile instead of reading dS (no dS tiles in the workspace; kept
 *     selectable for comparison: DFLASH_ATTN=fused-rc).
 *   gemm: the first scheme (dense score GEMMs over all S context keys, masked afterwards),
 *     kept selectable for comparison: DFLASH_ATTN=gemm.
 *
 * Padding slots (keep 0) give exact zeros: output, dQ, and no contribution to any dK/dV. */
#include "dflash/dflash_attn_cuda.h"

#include "nn/nn_cuda_device.cuh"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FA_TILE 64 /* keys per tile, query rows per CTA */
#define FA_QC 32   /* query rows per mma pass of the dK/dV kernel */
#define FA_QL 64   /* query rows per load (stage) of the dK/dV kernel: two passes */
#define FA_SPLIT 8 /* at most this many block ranges per context key tile */
#define FA_MAX_HD 128
static_assert(FA_QL == FA_TILE, "a dK/dV query stage is one 64-row chunk of the dS^T tiles");

__host__ __device__ static inline int cdiv_i(long a, long b)
{
    return (int)((a + b - 1) / b);
}
/* dS^T tiles of one (KV head, block, 64-row query chunk): slot 0 the block's own keys, slot
 * 1 + x the context keys [64x, 64x + 64) */
static inline long fa_ntile(int S)
{
    return cdiv_i(S, FA_TILE) + 1;
}
static inline long fa_nqc(int B, int G)
{
    return cdiv_i((long)B * G, FA_TILE);
}

int dflash_attn_scheme_cuda(int head_dim, char *err, size_t errlen)
{
    const char *e = getenv("DFLASH_ATTN");
    int s;
    if (!e || !*e || !strcmp(e, "fused"))
        s = DFLASH_ATTN_FUSED;
    else if (!strcmp(e, "gemm"))
        s = DFLASH_ATTN_GEMM;
    else if (!strcmp(e, "fused-fwd"))
        s = DFLASH_ATTN_FUSED_FWD;
    else if (!strcmp(e, "fused-rc"))
        s = DFLASH_ATTN_FUSED_RC;
    else
        return df_err(err, errlen, -EINVAL, "DFLASH_ATTN='%.40s': expected fused, gemm, fused-fwd or fused-rc", e);
    if (s != DFLASH_ATTN_GEMM && head_dim > FA_MAX_HD)
        s = DFLASH_ATTN_GEMM;
    return s;
}

const char *dflash_attn_scheme_name_cuda(int scheme)
{
    return scheme == DFLASH_ATTN_FUSED      ? "fused"
           : scheme == DFLASH_ATTN_GEMM     ? "gemm"
           : scheme == DFLASH_ATTN_FUSED_RC ? "fused-rc"
                                            : "fused-fwd";
}

/* ---- workspace -------------------------------------------------------------------------- */

typedef struct ws_ptrs {
    float *Drow;                     /* [HR] rowsum(dO . O) */
    float *Sc, *dPc, *Pb, *dSb, *Oc; /* gemm */
    bf16 *Pc, *dSc, *dOh;            /* gemm */
    float *dKp, *dVp;                /* fused: [FA_SPLIT][KV][S][hd] partials */
    bf16 *dSt;                       /* fused: dS^T tiles [KV][N][nqc][ntile][64 keys][64 rows] */
} ws_ptrs;

static int uses_gemm(int scheme)
{
    return scheme == DFLASH_ATTN_GEMM || scheme == DFLASH_ATTN_FUSED_FWD;
}

static size_t ws_carve(int scheme, int max_S, int max_N, int B, int H, int KV, int hd, char *base, ws_ptrs *p)
{
    size_t off = 0;
    memset(p, 0, sizeof *p);
#define WTAKE(ptr, type, count)                                       \
    do {                                                              \
        if (base)                                                     \
            (ptr) = (type *)(base + off);                             \
        off += ((size_t)(count) * sizeof(type) + 255) & ~(size_t)255; \
    } while (0)
    long HR = (long)H * max_N * B, Sp = (max_S + 7) / 8 * 8, kvd = (long)KV * hd;
    WTAKE(p->Drow, float, HR);
    if (uses_gemm(scheme)) {
        WTAKE(p->Sc, float, HR *Sp);
        WTAKE(p->dPc, float, HR *Sp);
        WTAKE(p->Pc, bf16, HR * Sp);
        WTAKE(p->dSc, bf16, HR * Sp);
        WTAKE(p->Pb, float, HR *B);
        WTAKE(p->dSb, float, HR *B);
        WTAKE(p->Oc, float, HR *hd);
        WTAKE(p->dOh, bf16, HR * hd);
    } else {
        WTAKE(p->dKp, float, (long)FA_SPLIT *max_S *kvd);
        WTAKE(p->dVp, float, (long)FA_SPLIT *max_S *kvd);
        if (scheme == DFLASH_ATTN_FUSED)
            WTAKE(p->dSt, bf16, (long)KV * max_N * fa_nqc(B, H / KV) * fa_ntile(max_S) * FA_TILE * FA_TILE);
    }
#undef WTAKE
    return off;
}

size_t dflash_attn_ws_bytes_cuda(int scheme, int max_S, int max_N, int B, int H, int KV, int hd)
{
    ws_ptrs p;
    return ws_carve(scheme, max_S, max_N, B, H, KV, hd, NULL, &p);
}

static ws_ptrs ws_get(const dflash_attn_ws_cuda *w)
{
    ws_ptrs p;
    ws_carve(w->scheme, w->max_S, w->max_N, w->B, w->H, w->KV, w->hd, (char *)w->base, &p);
    return p;
}

/* ---- shared geometry ---------------------------------------------------------------------- */

struct fa_args {
    int S, T, R, N, B, G, H, hd, window;
    float scale, sl2; /* softmax scale; scale * log2(e) */
    const int32_t *hi, *lo;
    const uint8_t *keep;
};

static fa_args make_args(const dflash_attn_cuda *a)
{
    fa_args A;
    A.S = a->S, A.R = a->N * a->B, A.T = a->S + A.R, A.N = a->N, A.B = a->B, A.G = a->H / a->KV, A.H = a->H;
    A.hd = a->hd, A.window = a->window, A.scale = a->scale, A.sl2 = a->scale * 1.4426950408889634f;
    A.hi = a->hi, A.lo = a->lo, A.keep = a->keep;
    return A;
}

/* context start of row k of a block with window [lo, hi) */
__device__ __forceinline__ int row_lo(int lo, int hi, int k, int window)
{
    return window > 0 ? max(lo, hi + k - (window - 1)) : lo;
}

/* ---- fused: mma / ldmatrix helpers ------------------------------------------------------------ */

__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldsm4(uint32_t r[4], const bf16 *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ void ldsm4t(uint32_t r[4], const bf16 *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ uint32_t pack_bf2(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); /* .x (low half) = lo: the smaller column */
    return *reinterpret_cast<uint32_t *>(&v);
}

/* A fragment (16 x 16 at rows r0, cols c0) of a row-major tile s (row stride LDS). */
template <int LDS> __device__ __forceinline__ void frag_a(uint32_t a[4], const bf16 *s, int r0, int c0, int lane)
{
    ldsm4(a, s + (r0 + (lane & 15)) * LDS + c0 + (lane >> 4) * 8);
}
/* B fragments of two n-tiles (n0, n0 + 8) at k-step k0, B[k][n] = s[n][k] (s row-major [n][k]):
 * b[0], b[1] for n0; b[2], b[3] for n0 + 8. */
template <int LDS> __device__ __forceinline__ void frag_b_nk(uint32_t b[4], const bf16 *s, int n0, int k0, int lane)
{
    ldsm4(b, s + (n0 + (lane & 7) + (lane >> 4) * 8) * LDS + k0 + ((lane >> 3) & 1) * 8);
}
/* The same with B[k][n] = s[k][n] (s row-major [k][n]): transposing loads. */
template <int LDS> __device__ __forceinline__ void frag_b_kn(uint32_t b[4], const bf16 *s, int k0, int n0, int lane)
{
    ldsm4t(b, s + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS + n0 + (lane >> 4) * 8);
}
/* A fragment (16 x 16 at rows m0, cols k0) of A[m][k] = s[k][m] (s row-major [k][m]): transposing loads */
template <int LDS> __device__ __forceinline__ void frag_a_t(uint32_t a[4], const bf16 *s, int m0, int k0, int lane)
{
    ldsm4t(a, s + (k0 + (lane >> 4) * 8 + (lane & 7)) * LDS + m0 + ((lane >> 3) & 1) * 8);
}
/* One k-step (16) of a warp tile of 16 MT rows x 16 NP columns: acc[mt][n] (n-tiles of 8) +=
 * a[mt] (16 x 16 A fragments) x B, B[k][n] = s[k0 + k][n0 + n] (s row-major [k][n]). Each B
 * fragment pair serves the MT row tiles (MT = 2 halves the shared-memory reads per mma). */
template <int LDS, int MT, int NP>
__device__ __forceinline__ void mma_tile_kn(float (*acc)[2 * NP][4], const uint32_t (*a)[4], const bf16 *s, int k0,
                                            int n0, int lane)
{
#pragma unroll
    for (int np = 0; np < NP; np++) {
        uint32_t b[4];
        frag_b_kn<LDS>(b, s, k0, n0 + np * 16, lane);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            mma16816(acc[mt][2 * np], a[mt], b[0], b[1]);
            mma16816(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
    }
}
/* accumulators of n-tiles 2kk, 2kk+1 (16 x 16) -> an A fragment */
__device__ __forceinline__ void acc_to_a(uint32_t a[4], const float c0[4], const float c1[4])
{
    a[0] = pack_bf2(c0[0], c0[1]);
    a[1] = pack_bf2(c0[2], c0[3]);
    a[2] = pack_bf2(c1[0], c1[1]);
    a[3] = pack_bf2(c1[2], c1[3]);
}

/* rows [0, ROWS) x HDP columns of a padded tile from rowptr(r) (hd valid columns, 16-byte
 * aligned rows); rows >= nrows and columns >= hd are zero. */
template <int HDP, int ROWS, typename F> __device__ __forceinline__ void fa_load(bf16 *s, int nrows, int hd, F rowptr)
{
    constexpr int CPR = HDP / 8, LDS = HDP + 8;
    for (int c = threadIdx.x; c < ROWS * CPR; c += blockDim.x) {
        int r = c / CPR, col = (c % CPR) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < nrows && col < hd)
            v = *reinterpret_cast<const uint4 *>(rowptr(r) + col);
        *reinterpret_cast<uint4 *>(s + r * LDS + col) = v;
    }
}

/* 4 bytes global -> shared without a register round trip (cp_async16: nn_cuda_device.cuh) */
__device__ __forceinline__ void cp_async4(void *dst, const void *src)
{
    uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src));
}

/* fa_load issued asynchronously (the zero padding is stored at once) */
template <int HDP, int ROWS, typename F>
__device__ __forceinline__ void fa_load_async(bf16 *s, int nrows, int hd, F rowptr)
{
    constexpr int CPR = HDP / 8, LDS = HDP + 8;
    for (int c = threadIdx.x; c < ROWS * CPR; c += blockDim.x) {
        int r = c / CPR, col = (c % CPR) * 8;
        if (r < nrows && col < hd)
            cp_async16(s + r * LDS + col, rowptr(r) + col);
        else
            *reinterpret_cast<uint4 *>(s + r * LDS + col) = make_uint4(0, 0, 0, 0);
    }
}

/* K and V tiles in two stages (the next tile loads while this one is used) */
template <int HDP> static constexpr size_t fa_smem_fwd()
{
    return (size_t)4 * FA_TILE * (HDP + 8) * sizeof(bf16);
}
/* Q, dO of the query tile, then K and V in two stages */
template <int HDP> static constexpr size_t fa_smem_dq()
{
    return (size_t)6 * FA_TILE * (HDP + 8) * sizeof(bf16);
}
/* a dS^T tile (64 x 64) and a K tile, in two stages */
template <int HDP> static constexpr size_t fa_smem_dq_ds()
{
    return (size_t)2 * FA_TILE * (FA_TILE + 8 + HDP + 8) * sizeof(bf16);
}
/* K, V of the key tile, then Q, dO, LSE, D of a query chunk in two stages */
template <int HDP> static constexpr size_t fa_smem_dkv()
{
    return (size_t)(2 * FA_TILE + 4 * FA_QL) * (HDP + 8) * sizeof(bf16) + 4 * FA_QL * sizeof(float);
}

/* The double buffer's step: with more to come, start the next load (issue_next: one
 * cp.async group) and wait for all but that group; else wait for everything. (The dK/dV
 * kernel keeps its own copy: through this helper its code came out different.) */
template <typename F> __device__ __forceinline__ void fa_wait_current(bool more, F issue_next)
{
    if (more) {
        issue_next();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
}

/* ---- fused: what the forward and dQ kernels share ----------------------------------------------
 * Written so that the kernels compile to the very code they had when each carried its own
 * copy (the same cubin text, compared): what the copies' lambdas captured by reference is
 * passed by reference, and the dQ kernel's per-row loads stay in the same loop (per_row). */

/* A thread's two query rows i of the chunk at m0 (the mma layout: warp * 16 + lane / 4,
 * then 8 below): mr, whether it exists (rv), its position in the block (kq), its first
 * visible context key (rlo); then per_row(i, mr, rv). */
template <typename F>
__device__ __forceinline__ void fa_thread_rows(const fa_args &A, int M, int W, int hi, int lo, int m0, int warp,
                                               int lane, int mr[2], bool rv[2], int kq[2], int rlo[2], F per_row)
{
#pragma unroll
    for (int i = 0; i < 2; i++) {
        mr[i] = m0 + warp * 16 + (lane >> 2) + 8 * i;
        rv[i] = mr[i] < M;
        kq[i] = mr[i] / A.G;
        rlo[i] = row_lo(lo, hi, kq[i], W);
        per_row(i, mr, rv);
    }
}

/* Start loading key tile it of block j into stage it & 1 (K at sKV + 2 (it & 1) TS, V TS
 * after it), one cp.async group: context keys [clo + it FA_TILE, hi) for it < nctx, the
 * block's own B keys for it == nctx. */
template <int HDP>
__device__ __forceinline__ void
fa_issue_kv(bf16 *sKV, int it, const int &nctx, const int &clo, const int &hi, const long &kvbase, const int &j,
            const fa_args &A, const bf16 *__restrict__ const &Kh, const bf16 *__restrict__ const &Vh, const int &hd)
{
    constexpr int TS = FA_TILE * (HDP + 8);
    const bool blk = it == nctx;
    const int t0 = blk ? 0 : clo + it * FA_TILE, nk = blk ? A.B : min(FA_TILE, hi - t0);
    const long krow = kvbase + (blk ? (long)A.S + (long)j * A.B : (long)t0);
    bf16 *sK = sKV + 2 * (it & 1) * TS;
    fa_load_async<HDP, FA_TILE>(sK, nk, hd, [&](int r) { return Kh + (krow + r) * hd; });
    fa_load_async<HDP, FA_TILE>(sK + TS, nk, hd, [&](int r) { return Vh + (krow + r) * hd; });
    cp_async_commit();
}

/* ---- fused forward ---------------------------------------------------------------------------
 * grid (N, KV, ceil(B*G / 64)), 128 threads. Blocks in reverse slot order: anchors ascend, so
 * the longest windows start first. */
template <int HDP>
__global__ void __launch_bounds__(128)
    k_fa_fwd(bf16 *__restrict__ att, float *__restrict__ lse, const bf16 *__restrict__ Qh, const bf16 *__restrict__ Kh,
             const bf16 *__restrict__ Vh, fa_args A)
{
    constexpr int LDS = HDP + 8, NK = HDP / 16, NO = HDP / 8, TS = FA_TILE * LDS;
    extern __shared__ __align__(16) unsigned char fa_sm[];
    bf16 *sKV = reinterpret_cast<bf16 *>(fa_sm); /* stage st: K at sKV + 2*st*TS, V at + TS */
    const int j = A.N - 1 - (int)blockIdx.x, g = blockIdx.y, M = A.B * A.G, m0 = blockIdx.z * FA_TILE;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, hd = A.hd;
    if (m0 >= M)
        return;
    const int rows = min(FA_TILE, M - m0);
    const long rhob = ((long)g * A.R + (long)j * A.B) * A.G; /* first row of the block */
    if (!A.keep[j]) {
        for (int e = threadIdx.x; e < rows * (hd / 8); e += blockDim.x) {
            int m = m0 + e / (hd / 8), col = (e % (hd / 8)) * 8, k = m / A.G, hh = m % A.G;
            *reinterpret_cast<uint4 *>(att + ((long)(j * A.B + k) * A.H + g * A.G + hh) * hd + col) =
                make_uint4(0, 0, 0, 0);
        }
        for (int m = threadIdx.x; m < rows; m += blockDim.x)
            lse[rhob + m0 + m] = -INFINITY;
        return;
    }
    const int hi = A.hi[j], lo = A.lo[j], W = A.window;
    int mr[2], kq[2], rlo[2];
    bool rv[2];
    fa_thread_rows(A, M, W, hi, lo, m0, warp, lane, mr, rv, kq, rlo, [](int, const int *, const bool *) {});
    const int clo = row_lo(lo, hi, 0, W);
    const int nctx = clo < hi ? cdiv_i(hi - clo, FA_TILE) : 0;
    const long kvbase = (long)g * A.T;
    /* tile it: context keys [clo + 64 it, ...) for it < nctx, then the block's own keys */
    auto issue = [&](int it) { fa_issue_kv<HDP>(sKV, it, nctx, clo, hi, kvbase, j, A, Kh, Vh, hd); };
    issue(0);
    /* Q through stage 1 (free until tile 1 is issued), into registers */
    bf16 *sQ = sKV + 2 * TS;
    fa_load<HDP, FA_TILE>(sQ, rows, hd, [&](int r) { return Qh + (rhob + m0 + r) * hd; });
    __syncthreads();
    uint32_t qf[NK][4];
#pragma unroll
    for (int kk = 0; kk < NK; kk++)
        frag_a<LDS>(qf[kk], sQ, warp * 16, kk * 16, lane);
    __syncthreads();
    float o[NO][4];
#pragma unroll
    for (int n = 0; n < NO; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    for (int it = 0; it <= nctx; it++) {
        const bool blk = it == nctx;
        const int t0 = blk ? 0 : clo + it * FA_TILE;
        const int nk = blk ? A.B : min(FA_TILE, hi - t0);
        fa_wait_current(it < nctx, [&] { issue(it + 1); });
        __syncthreads(); /* tile it has landed for every thread */
        const bf16 *sK = sKV + 2 * (it & 1) * TS, *sV = sK + TS;
        float s[8][4];
#pragma unroll
        for (int n = 0; n < 8; n++)
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < NK; kk++)
#pragma unroll
            for (int np = 0; np < 4; np++) {
                if (np * 16 >= nk) /* keys past nk (a block's own keys: 16 of 64) are masked below */
                    break;
                uint32_t b[4];
                frag_b_nk<LDS>(b, sK, np * 16, kk * 16, lane);
                mma16816(s[2 * np], qf[kk], b[0], b[1]);
                mma16816(s[2 * np + 1], qf[kk], b[2], b[3]);
            }
        float alpha[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float mt = -INFINITY;
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int c = n * 8 + 2 * (lane & 3) + e;
                    bool v = rv[i] && c < nk && (blk ? (W == 0 || c <= kq[i]) : (t0 + c >= rlo[i]));
                    float x = v ? s[n][2 * i + e] * A.sl2 : -INFINITY;
                    s[n][2 * i + e] = x;
                    mt = fmaxf(mt, x);
                }
            mt = quad_max(mt);
            float mnew = fmaxf(mx[i], mt);
            float mref = mnew == -INFINITY ? 0.0f : mnew;
            alpha[i] = exp2f(mx[i] - mref);
            mx[i] = mnew;
            float rs = 0.0f;
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float p = exp2f(s[n][2 * i + e] - mref);
                    s[n][2 * i + e] = p;
                    rs += p;
                }
            l[i] = l[i] * alpha[i] + rs;
        }
#pragma unroll
        for (int n = 0; n < NO; n++) {
            o[n][0] *= alpha[0], o[n][1] *= alpha[0];
            o[n][2] *= alpha[1], o[n][3] *= alpha[1];
        }
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            if (kk * 16 >= nk) /* P = 0 and V rows zero there: nothing to add */
                break;
            uint32_t a[4];
            acc_to_a(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
            for (int np = 0; np < NK; np++) {
                uint32_t b[4];
                frag_b_kn<LDS>(b, sV, kk * 16, np * 16, lane);
                mma16816(o[2 * np], a, b[0], b[1]);
                mma16816(o[2 * np + 1], a, b[2], b[3]);
            }
        }
        __syncthreads(); /* stage it & 1 is free for tile it + 2 */
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float L = quad_sum(l[i]);
        if (!rv[i])
            continue;
        float inv = L > 0.0f ? 1.0f / L : 0.0f;
        int m = mr[i], k = m / A.G, hh = m % A.G;
        bf16 *orow = att + ((long)(j * A.B + k) * A.H + g * A.G + hh) * hd;
#pragma unroll
        for (int n = 0; n < NO; n++) {
            int col = n * 8 + 2 * (lane & 3);
            if (col < hd)
                *reinterpret_cast<__nv_bfloat162 *>(orow + col) =
                    __floats2bfloat162_rn(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
        }
        if ((lane & 3) == 0)
            lse[rhob + m] = L > 0.0f ? (mx[i] + log2f(L)) * 0.6931471805599453f : -INFINITY;
    }
}

/* D[rho] = dO . O over the head's row (warp per row) */
__global__ void k_fa_bwd_prep(float *Drow, const bf16 *datt, const bf16 *att, fa_args A, long HR)
{
    long rho = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (rho >= HR)
        return;
    int hh = (int)(rho % A.G), r = (int)((rho / A.G) % A.R), g = (int)(rho / ((long)A.G * A.R));
    long o = ((long)r * A.H + g * A.G + hh) * A.hd;
    float s = 0;
    for (int i = lane; i < A.hd; i += 32)
        s += bf2f(datt[o + i]) * bf2f(att[o + i]);
    s = warp_sum(s);
    if (lane == 0)
        Drow[rho] = s;
}

/* ---- fused dQ: grid (N, KV, ceil(B*G / 64)), 128 threads ------------------------------------- */
template <int HDP>
__global__ void __launch_bounds__(128)
    k_fa_dq(float *__restrict__ dQh, const bf16 *__restrict__ Qh, const bf16 *__restrict__ Kh,
            const bf16 *__restrict__ Vh, const bf16 *__restrict__ datt, const float *__restrict__ lse,
            const float *__restrict__ Drow, fa_args A)
{
    constexpr int LDS = HDP + 8, NK = HDP / 16, NO = HDP / 8, TS = FA_TILE * LDS;
    extern __shared__ __align__(16) unsigned char fa_sm[];
    bf16 *sQ = reinterpret_cast<bf16 *>(fa_sm), *sO = sQ + TS, *sKV = sO + TS; /* stage st: K at sKV + 2 st TS */
    const int j = A.N - 1 - (int)blockIdx.x, g = blockIdx.y, M = A.B * A.G, m0 = blockIdx.z * FA_TILE;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, hd = A.hd;
    if (m0 >= M)
        return;
    const int rows = min(FA_TILE, M - m0);
    const long rhob = ((long)g * A.R + (long)j * A.B) * A.G;
    if (!A.keep[j]) {
        for (long e = threadIdx.x; e < (long)rows * hd; e += blockDim.x)
            dQh[(rhob + m0) * hd + e] = 0.0f;
        return;
    }
    const int hi = A.hi[j], lo = A.lo[j], W = A.window;
    int mr[2], kq[2], rlo[2];
    bool rv[2];
    float lse2[2], Dr[2];
    fa_thread_rows(A, M, W, hi, lo, m0, warp, lane, mr, rv, kq, rlo, [&](int i, const int *m, const bool *v) {
        lse2[i] = v[i] ? lse[rhob + m[i]] * 1.4426950408889634f : 0.0f;
        Dr[i] = v[i] ? Drow[rhob + m[i]] : 0.0f;
    });
    const int clo = row_lo(lo, hi, 0, W);
    const int nctx = clo < hi ? cdiv_i(hi - clo, FA_TILE) : 0;
    const long kvbase = (long)g * A.T;
    auto issue = [&](int it) { fa_issue_kv<HDP>(sKV, it, nctx, clo, hi, kvbase, j, A, Kh, Vh, hd); };
    fa_load_async<HDP, FA_TILE>(sQ, rows, hd, [&](int r) { return Qh + (rhob + m0 + r) * hd; });
    fa_load_async<HDP, FA_TILE>(sO, rows, hd, [&](int r) {
        int m = m0 + r, k = m / A.G, hh = m % A.G;
        return datt + ((long)(j * A.B + k) * A.H + g * A.G + hh) * hd;
    });
    issue(0); /* one group: Q, dO and tile 0 */
    float dq[NO][4];
#pragma unroll
    for (int n = 0; n < NO; n++)
        dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
    for (int it = 0; it <= nctx; it++) {
        const bool blk = it == nctx;
        const int t0 = blk ? 0 : clo + it * FA_TILE;
        const int nk = blk ? A.B : min(FA_TILE, hi - t0);
        fa_wait_current(it < nctx, [&] { issue(it + 1); });
        __syncthreads();
        const bf16 *sK = sKV + 2 * (it & 1) * TS, *sV = sK + TS;
        float s[8][4], dp[8][4];
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < NK; kk++) {
            uint32_t qa[4], oa[4];
            frag_a<LDS>(qa, sQ, warp * 16, kk * 16, lane);
            frag_a<LDS>(oa, sO, warp * 16, kk * 16, lane);
#pragma unroll
            for (int np = 0; np < 4; np++) {
                uint32_t b[4];
                frag_b_nk<LDS>(b, sK, np * 16, kk * 16, lane);
                mma16816(s[2 * np], qa, b[0], b[1]);
                mma16816(s[2 * np + 1], qa, b[2], b[3]);
                frag_b_nk<LDS>(b, sV, np * 16, kk * 16, lane);
                mma16816(dp[2 * np], oa, b[0], b[1]);
                mma16816(dp[2 * np + 1], oa, b[2], b[3]);
            }
        }
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = e >> 1, c = n * 8 + 2 * (lane & 3) + (e & 1);
                bool v = rv[i] && c < nk && (blk ? (W == 0 || c <= kq[i]) : (t0 + c >= rlo[i]));
                float p = v ? exp2f(s[n][e] * A.sl2 - lse2[i]) : 0.0f;
                s[n][e] = p * (dp[n][e] - Dr[i]); /* dS */
            }
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            uint32_t a[4];
            acc_to_a(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
            for (int np = 0; np < NK; np++) {
                uint32_t b[4];
                frag_b_kn<LDS>(b, sK, kk * 16, np * 16, lane);
                mma16816(dq[2 * np], a, b[0], b[1]);
                mma16816(dq[2 * np + 1], a, b[2], b[3]);
            }
        }
        __syncthreads(); /* stage it & 1 is free for tile it + 2 */
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (!rv[i])
            continue;
        float *drow = dQh + (rhob + mr[i]) * hd;
#pragma unroll
        for (int n = 0; n < NO; n++) {
            int col = n * 8 + 2 * (lane & 3);
            if (col < hd)
                *reinterpret_cast<float2 *>(drow + col) =
                    make_float2(dq[n][2 * i] * A.scale, dq[n][2 * i + 1] * A.scale);
        }
    }
}

/* ---- fused dQ from the stored dS: grid (N, KV, ceil(B*G / 64)), 128 threads ----------------
 * dQ = scale dS K over the tiles the dK/dV kernel wrote for this block and query chunk: the
 * context tiles x in [clo / 64, ceil(hi / 64)) (exactly those its visibility test passes),
 * then the block's own keys (slot 0). One GEMM-like pass: no S, P or dP recomputed.
 * ntile = ceil(S/64) + 1 tiles per (block, chunk), nchunk = ceil(B*G/64) chunks per block. */
template <int HDP>
__global__ void __launch_bounds__(128) k_fa_dq_ds(float *__restrict__ dQh, const bf16 *__restrict__ dSt,
                                                  const bf16 *__restrict__ Kh, fa_args A, int ntile, int nchunk)
{
    constexpr int LDS = HDP + 8, DL = FA_TILE + 8;
    constexpr int DT = FA_TILE * DL, ST = DT + FA_TILE * LDS; /* stage st: dS^T at st ST, K at st ST + DT */
    /* warps: WM x WN over the 64 rows x HDP columns; a warp holds MT row tiles x 2 NP n-tiles */
    constexpr int WN = HDP >= 64 ? 2 : 1, WM = 4 / WN, MT = FA_TILE / 16 / WM, NP = HDP / 16 / WN;
    extern __shared__ __align__(16) unsigned char fa_sm[];
    bf16 *sm = reinterpret_cast<bf16 *>(fa_sm);
    const int j = A.N - 1 - (int)blockIdx.x, g = blockIdx.y, M = A.B * A.G, c = blockIdx.z, m0 = c * FA_TILE;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, hd = A.hd;
    const int wr = (warp % WM) * MT * 16, wc = (warp / WM) * NP * 16; /* the warp's first row, column */
    const int rows = min(FA_TILE, M - m0);
    const long rhob = ((long)g * A.R + (long)j * A.B) * A.G;
    if (!A.keep[j]) {
        for (long e = threadIdx.x; e < (long)rows * hd; e += blockDim.x)
            dQh[(rhob + m0) * hd + e] = 0.0f;
        return;
    }
    const int hi = A.hi[j], clo = row_lo(A.lo[j], hi, 0, A.window);
    const int x0 = clo / FA_TILE, nctx = clo < hi ? cdiv_i(hi, FA_TILE) - x0 : 0;
    const bf16 *dsb = dSt + (((long)g * A.N + j) * nchunk + c) * ntile * (FA_TILE * FA_TILE);
    auto issue = [&](int it) {
        const bool blk = it == nctx;
        const int t0 = blk ? 0 : (x0 + it) * FA_TILE, nk = blk ? A.B : min(FA_TILE, A.S - t0);
        const long krow = (long)g * A.T + (blk ? (long)A.S + (long)j * A.B : (long)t0);
        const bf16 *ds = dsb + (long)(blk ? 0 : x0 + it + 1) * (FA_TILE * FA_TILE);
        bf16 *sD = sm + (it & 1) * ST;
        fa_load_async<FA_TILE, FA_TILE>(sD, (nk + 15) & ~15, FA_TILE, [&](int r) { return ds + r * FA_TILE; });
        fa_load_async<HDP, FA_TILE>(sD + DT, nk, hd, [&](int r) { return Kh + (krow + r) * hd; });
        cp_async_commit();
    };
    issue(0);
    float dq[MT][2 * NP][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < 2 * NP; n++)
            dq[mt][n][0] = dq[mt][n][1] = dq[mt][n][2] = dq[mt][n][3] = 0.0f;
    for (int it = 0; it <= nctx; it++) {
        fa_wait_current(it < nctx, [&] { issue(it + 1); });
        __syncthreads(); /* tile it has landed */
        const bf16 *sD = sm + (it & 1) * ST, *sK = sD + DT;
        const int nk = it == nctx ? A.B : min(FA_TILE, A.S - (x0 + it) * FA_TILE);
#pragma unroll
        for (int kk = 0; kk < FA_TILE / 16; kk++) {
            if (kk * 16 >= nk) /* keys past nk: dS and K rows zero (a block's own keys: 16 of 64) */
                break;
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                frag_a_t<DL>(a[mt], sD, wr + mt * 16, kk * 16, lane);
            mma_tile_kn<LDS, MT, NP>(dq, a, sK, kk * 16, wc, lane);
        }
        __syncthreads(); /* stage it & 1 is free for tile it + 2 */
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int m = m0 + wr + mt * 16 + (lane >> 2) + 8 * i;
            if (m >= M)
                continue;
            float *drow = dQh + (rhob + m) * hd;
#pragma unroll
            for (int n = 0; n < 2 * NP; n++) {
                int col = wc + n * 8 + 2 * (lane & 3);
                if (col < hd)
                    *reinterpret_cast<float2 *>(drow + col) =
                        make_float2(dq[mt][n][2 * i] * A.scale, dq[mt][n][2 * i + 1] * A.scale);
            }
        }
}

/* ---- fused dK/dV: grid ceil(S/64) x KV x nsplit + N x KV, 128 threads -------------------------
 * The first ceil(S/64) KV nsplit CTAs: context keys [64x, 64x + 64) of KV head g, the blocks of
 * range z ([z*bps, (z+1)*bps)) that see them, written to the partials of range z (or straight
 * to dKh/dVh when nsplit == 1). They come in decreasing z, then increasing x: anchors ascend
 * in slot order, so the CTAs with the most blocks to visit start first and the short ones
 * fill the tail. Then N x KV CTAs: block j's own keys, straight to dKh/dVh. */
template <int HDP>
__global__ void __launch_bounds__(128)
    k_fa_dkv(float *__restrict__ dKh, float *__restrict__ dVh, float *__restrict__ dKp, float *__restrict__ dVp,
             const bf16 *__restrict__ Qh, const bf16 *__restrict__ Kh, const bf16 *__restrict__ Vh,
             const bf16 *__restrict__ datt, const float *__restrict__ lse, const float *__restrict__ Drow, fa_args A,
             int nctx_tiles, int KV, int nsplit, int bps, bf16 *__restrict__ dSt, int ntile, int nchunk)
{
    constexpr int LDS = HDP + 8, NK = HDP / 16, NO = HDP / 8, CS = FA_QL * LDS;
    extern __shared__ __align__(16) unsigned char fa_sm[];
    /* K, V; then per stage st: Q at sQO + 2 st CS, dO at + CS; LSE at sLD + 2 st FA_QL, D at + FA_QL */
    bf16 *sK = reinterpret_cast<bf16 *>(fa_sm), *sV = sK + FA_TILE * LDS, *sQO = sV + FA_TILE * LDS;
    float *sLD = reinterpret_cast<float *>(sQO + 4 * CS);
    const int M = A.B * A.G, W = A.window, hd = A.hd;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nctx_cta = nctx_tiles * KV * nsplit, L = (int)blockIdx.x;
    const bool blk = L >= nctx_cta;
    int g, z, x; /* x: the context key tile, or the block whose own keys this CTA takes */
    if (!blk) {
        const int per_z = nctx_tiles * KV, rem = L % per_z;
        z = nsplit - 1 - L / per_z, g = rem / nctx_tiles, x = rem % nctx_tiles;
    } else {
        z = 0, g = (L - nctx_cta) / A.N, x = (L - nctx_cta) % A.N;
    }
    const int jb = blk ? x : 0;
    const int t0 = blk ? 0 : x * FA_TILE;
    const int nk = blk ? A.B : min(FA_TILE, A.S - t0);
    const long krow = (long)g * A.T + (blk ? (long)A.S + (long)jb * A.B : (long)t0);
    fa_load_async<HDP, FA_TILE>(sK, nk, hd, [&](int r) { return Kh + (krow + r) * hd; });
    fa_load_async<HDP, FA_TILE>(sV, nk, hd, [&](int r) { return Vh + (krow + r) * hd; });
    float dk[NO][4], dv[NO][4];
#pragma unroll
    for (int n = 0; n < NO; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dk[n][e] = dv[n][e] = 0.0f;
    int kr[2];
    kr[0] = warp * 16 + (lane >> 2), kr[1] = kr[0] + 8;
    const int j_begin = blk ? jb : z * bps, j_end = blk ? jb + 1 : min(A.N, (z + 1) * bps);
    /* the first block from j on (in slot order) that is kept and whose window meets the tile */
    auto visible_from = [&](int j) {
        for (; j < j_end; j++) {
            if (!A.keep[j])
                continue;
            const int hi = A.hi[j], lo = A.lo[j];
            if (blk || !(t0 >= hi || t0 + nk <= row_lo(lo, hi, 0, W)))
                break;
        }
        return j;
    };
    /* query chunk (j, qc) into stage st */
    auto issue = [&](int j, int qc, int st) {
        const long rhob = ((long)g * A.R + (long)j * A.B) * A.G;
        const int qrows = min(FA_QL, M - qc);
        bf16 *sQ = sQO + 2 * st * CS;
        fa_load_async<HDP, FA_QL>(sQ, qrows, hd, [&](int r) { return Qh + (rhob + qc + r) * hd; });
        fa_load_async<HDP, FA_QL>(sQ + CS, qrows, hd, [&](int r) {
            int m = qc + r, k = m / A.G, hh = m % A.G;
            return datt + ((long)(j * A.B + k) * A.H + g * A.G + hh) * hd;
        });
        /* LSE and D asynchronously too: a plain load here would hold its warp, and so the
         * whole CTA at the next barrier, for a round trip to memory */
        float *sL = sLD + 2 * st * FA_QL;
        for (int r = threadIdx.x; r < 2 * FA_QL; r += blockDim.x) {
            int rr = r % FA_QL;
            if (rr < qrows)
                cp_async4(sL + r, (r < FA_QL ? lse : Drow) + rhob + qc + rr);
            else
                sL[r] = 0.0f;
        }
        cp_async_commit();
    };
    int cj = visible_from(j_begin), cqc = 0, st = 0;
    if (cj < j_end)
        issue(cj, 0, 0); /* one group with K and V */
    else
        cp_async_commit();
    while (cj < j_end) {
        int nj = cj, nqc = cqc + FA_QL;
        if (nqc >= M)
            nj = visible_from(cj + 1), nqc = 0;
        if (nj < j_end) {
            issue(nj, nqc, st ^ 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads(); /* chunk (cj, cqc) and K, V have landed */
        const int hi = A.hi[cj], lo = A.lo[cj], qload = min(FA_QL, M - cqc);
        /* passes of 32 queries over the stage; a warp whose 16 keys are all past nk (3 of 4 on a
         * block's own 16 keys) has nothing to add and stores no dS (the dQ kernel reads only the
         * key rows below nk rounded up to 16) */
        for (int hq = 0; warp * 16 < nk && hq < qload; hq += FA_QC) {
            const int qrows = min(FA_QC, qload - hq);
            const bf16 *sQ = sQO + 2 * st * CS + hq * LDS, *sO = sQ + CS;
            const float *sL = sLD + 2 * st * FA_QL + hq, *sD = sL + FA_QL;
            /* S^T = K Q^T and dP^T = V dO^T: 16 keys (this warp) x 32 queries */
            float stt[4][4], dpt[4][4];
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    stt[n][e] = dpt[n][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < NK; kk++) {
                uint32_t ka[4], va[4];
                frag_a<LDS>(ka, sK, warp * 16, kk * 16, lane);
                frag_a<LDS>(va, sV, warp * 16, kk * 16, lane);
#pragma unroll
                for (int np = 0; np < 2; np++) {
                    uint32_t b[4];
                    frag_b_nk<LDS>(b, sQ, np * 16, kk * 16, lane);
                    mma16816(stt[2 * np], ka, b[0], b[1]);
                    mma16816(stt[2 * np + 1], ka, b[2], b[3]);
                    frag_b_nk<LDS>(b, sO, np * 16, kk * 16, lane);
                    mma16816(dpt[2 * np], va, b[0], b[1]);
                    mma16816(dpt[2 * np + 1], va, b[2], b[3]);
                }
            }
            /* full layers: a key's mask does not depend on the query row (no division by G) */
            bool kv0[2];
#pragma unroll
            for (int i = 0; i < 2; i++)
                kv0[i] = kr[i] < nk && (blk || (t0 + kr[i] < hi && t0 + kr[i] >= lo));
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int key = kr[e >> 1], c = n * 8 + 2 * (lane & 3) + (e & 1);
                    bool v = c < qrows;
                    if (W == 0) {
                        v = v && kv0[e >> 1];
                    } else {
                        int k = (cqc + hq + c) / A.G;
                        v = v && key < nk && (blk ? key <= k : (t0 + key < hi && t0 + key >= row_lo(lo, hi, k, W)));
                    }
                    float p = v ? exp2f(stt[n][e] * A.sl2 - sL[c] * 1.4426950408889634f) : 0.0f; /* LSE: natural */
                    stt[n][e] = p;
                    dpt[n][e] = p * (dpt[n][e] - sD[c]); /* dS^T */
                }
                /* dV += P^T dO, dK += dS^T Q (k = the 32 queries) */
#pragma unroll
            for (int kk = 0; kk < 2; kk++) {
                uint32_t pa[4], sa[4];
                acc_to_a(pa, stt[2 * kk], stt[2 * kk + 1]);
                acc_to_a(sa, dpt[2 * kk], dpt[2 * kk + 1]);
                if (dSt) { /* dS^T (bf16, as used here) for the dQ kernel: tile [key][query row] */
                    bf16 *t = dSt + ((((long)g * A.N + cj) * nchunk + cqc / FA_TILE) * ntile + (blk ? 0 : x + 1)) *
                                        (FA_TILE * FA_TILE);
                    int q = hq + kk * 16 + 2 * (lane & 3);
                    *reinterpret_cast<uint32_t *>(t + kr[0] * FA_TILE + q) = sa[0];
                    *reinterpret_cast<uint32_t *>(t + kr[1] * FA_TILE + q) = sa[1];
                    *reinterpret_cast<uint32_t *>(t + kr[0] * FA_TILE + q + 8) = sa[2];
                    *reinterpret_cast<uint32_t *>(t + kr[1] * FA_TILE + q + 8) = sa[3];
                }
#pragma unroll
                for (int np = 0; np < NK; np++) {
                    uint32_t b[4];
                    frag_b_kn<LDS>(b, sO, kk * 16, np * 16, lane);
                    mma16816(dv[2 * np], pa, b[0], b[1]);
                    mma16816(dv[2 * np + 1], pa, b[2], b[3]);
                    frag_b_kn<LDS>(b, sQ, kk * 16, np * 16, lane);
                    mma16816(dk[2 * np], sa, b[0], b[1]);
                    mma16816(dk[2 * np + 1], sa, b[2], b[3]);
                }
            }
        }
        __syncthreads(); /* stage st is free for the chunk after next */
        cj = nj, cqc = nqc, st ^= 1;
    }
    cp_async_wait<0>();
    float *ok, *ov;
    long ostride;
    if (blk || nsplit == 1) {
        ok = dKh + krow * hd, ov = dVh + krow * hd;
    } else { /* partial of range z: [z][g][S][hd] */
        long base = (((long)z * KV + g) * A.S + t0) * hd;
        ok = dKp + base, ov = dVp + base;
    }
    ostride = hd;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (kr[i] >= nk)
            continue;
#pragma unroll
        for (int n = 0; n < NO; n++) {
            int col = n * 8 + 2 * (lane & 3);
            if (col < hd) {
                *reinterpret_cast<float2 *>(ok + kr[i] * ostride + col) =
                    make_float2(dk[n][2 * i] * A.scale, dk[n][2 * i + 1] * A.scale);
                *reinterpret_cast<float2 *>(ov + kr[i] * ostride + col) = make_float2(dv[n][2 * i], dv[n][2 * i + 1]);
            }
        }
    }
}

/* dKh/dVh context rows = sum of the nsplit partials, in range order */
__global__ void k_fa_dkv_reduce(float *dKh, float *dVh, const float *dKp, const float *dVp, int S, int T, int KV,
                                int hd, int nsplit)
{
    long n = (long)KV * S * hd;
    for (long e = blockIdx.x * (long)blockDim.x + threadIdx.x; e < n; e += (long)gridDim.x * blockDim.x) {
        long g = e / ((long)S * hd), rem = e % ((long)S * hd);
        float a = 0, b = 0;
        for (int z = 0; z < nsplit; z++) {
            a += dKp[(long)z * n + e];
            b += dVp[(long)z * n + e];
        }
        dKh[g * T * hd + rem] = a;
        dVh[g * T * hd + rem] = b;
    }
}

template <int HDP>
static int fa_fwd_launch(const fa_args &A, int KV, const bf16 *Qh, const bf16 *Kh, const bf16 *Vh, bf16 *att,
                         float *lse, cudaStream_t st, char *err, size_t errlen)
{
    size_t sm = fa_smem_fwd<HDP>();
    CUDA_TRY(cudaFuncSetAttribute(k_fa_fwd<HDP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm), err, errlen);
    dim3 grid((unsigned)A.N, (unsigned)KV, (unsigned)cdiv_i((long)A.B * A.G, FA_TILE));
    k_fa_fwd<HDP><<<grid, 128, sm, st>>>(att, lse, Qh, Kh, Vh, A);
    CUDA_LAUNCHED("k_fa_fwd", err, errlen);
    return 0;
}

template <int HDP>
static int fa_bwd_launch(const fa_args &A, int KV, const ws_ptrs &w, const bf16 *Qh, const bf16 *Kh, const bf16 *Vh,
                         const bf16 *datt, const float *lse, float *dQh, float *dKh, float *dVh, cudaStream_t st,
                         char *err, size_t errlen)
{
    const bool rc = w.dSt == NULL; /* fused-rc: the dQ kernel recomputes S and dP */
    size_t skv = fa_smem_dkv<HDP>();
    CUDA_TRY(cudaFuncSetAttribute(k_fa_dkv<HDP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)skv), err, errlen);
    const int nqc = (int)fa_nqc(A.B, A.G), ntile = (int)fa_ntile(A.S);
    dim3 gq((unsigned)A.N, (unsigned)KV, (unsigned)nqc);
    if (rc) {
        size_t sq = fa_smem_dq<HDP>();
        CUDA_TRY(cudaFuncSetAttribute(k_fa_dq<HDP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sq), err, errlen);
        k_fa_dq<HDP><<<gq, 128, sq, st>>>(dQh, Qh, Kh, Vh, datt, lse, w.Drow, A);
        CUDA_LAUNCHED("k_fa_dq", err, errlen);
    }
    int nct = cdiv_i(A.S, FA_TILE);
    int bps = A.N > 32 * FA_SPLIT ? cdiv_i(A.N, FA_SPLIT) : 32; /* blocks per range */
    int nsplit = cdiv_i(A.N, bps);
    unsigned gk = (unsigned)((nct * nsplit + A.N) * KV);
    k_fa_dkv<HDP><<<gk, 128, skv, st>>>(dKh, dVh, w.dKp, w.dVp, Qh, Kh, Vh, datt, lse, w.Drow, A, nct, KV, nsplit, bps,
                                        w.dSt, ntile, nqc);
    CUDA_LAUNCHED("k_fa_dkv", err, errlen);
    if (!rc) { /* dQ from the dS^T tiles the dK/dV kernel stored */
        size_t sq = fa_smem_dq_ds<HDP>();
        CUDA_TRY(cudaFuncSetAttribute(k_fa_dq_ds<HDP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sq), err,
                 errlen);
        k_fa_dq_ds<HDP><<<gq, 128, sq, st>>>(dQh, w.dSt, Kh, A, ntile, nqc);
        CUDA_LAUNCHED("k_fa_dq_ds", err, errlen);
    }
    if (nsplit > 1) {
        long n = (long)KV * A.S * A.hd;
        k_fa_dkv_reduce<<<(int)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096), 256, 0, st>>>(
            dKh, dVh, w.dKp, w.dVp, A.S, A.T, KV, A.hd, nsplit);
        CUDA_LAUNCHED("k_fa_dkv_reduce", err, errlen);
    }
    return 0;
}

/* ---- the GEMM scheme ---------------------------------------------------------------------------
 * Query rows rho = (g * R + r) * G + hh (kv head g, block row r = j*B + k, head h = g*G + hh).
 * Keys of kv head g at Kh + (g*T + t)*hd: context t < S, block rows t = S + j*B + kk. */

struct attn_args {
    int S, Sp, R, T, B, G, hd, window;
    float scale;
    const int32_t *hi, *lo;
    const uint8_t *keep;
};

/* Mask of row rho: context [lo, hi), block keys [0, nb); returns 0 for padding. */
__device__ __forceinline__ int row_mask(const attn_args &A, long rho, int *j, int *k, int *g, int *lo, int *hi, int *nb)
{
    int r = (int)((rho / A.G) % A.R);
    *g = (int)(rho / ((long)A.G * A.R));
    *j = r / A.B;
    *k = r % A.B;
    if (!A.keep[*j])
        return 0;
    int a = A.hi[*j];
    *hi = a;
    *lo = row_lo(A.lo[*j], a, *k, A.window);
    *nb = A.window > 0 ? *k + 1 : A.B;
    return 1;
}

/* dot(a[hd], b[hd]) over the warp (all lanes get it) */
__device__ __forceinline__ float warp_dot(const bf16 *a, const bf16 *b, int hd, int lane)
{
    float s = 0;
    for (int i = lane; i < hd; i += 32)
        s += bf2f(a[i]) * bf2f(b[i]);
    return warp_sum(s);
}

__global__ void k_attn_fwd_softmax(bf16 *Pc, float *Pb, float *lse, const float *Sc, const bf16 *Qh, const bf16 *Kh,
                                   attn_args A, long HR)
{
    long rho = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (rho >= HR)
        return;
    int j, k, g, lo = 0, hi = 0, nb = 0;
    bf16 *prow = Pc + rho * A.Sp;
    float *pb = Pb + rho * A.B;
    if (!row_mask(A, rho, &j, &k, &g, &lo, &hi, &nb)) {
        for (int s = lane; s < A.Sp; s += 32)
            prow[s] = f2bf(0.0f);
        for (int kk = lane; kk < A.B; kk += 32)
            pb[kk] = 0.0f;
        if (lane == 0)
            lse[rho] = -INFINITY;
        return;
    }
    const bf16 *q = Qh + rho * A.hd;
    const bf16 *kb = Kh + ((long)g * A.T + A.S + (long)j * A.B) * A.hd;
    float sb0 = -INFINITY, sb1 = -INFINITY;
    for (int kk = 0; kk < nb; kk++) {
        float s = warp_dot(q, kb + (long)kk * A.hd, A.hd, lane) * A.scale;
        if (kk == lane)
            sb0 = s;
        if (kk == lane + 32)
            sb1 = s;
    }
    const float *srow = Sc + rho * A.Sp;
    float m = fmaxf(sb0, sb1);
    for (int s = lo + lane; s < hi; s += 32)
        m = fmaxf(m, srow[s] * A.scale);
    m = warp_max(m);
    float sum = (sb0 > -INFINITY ? expf(sb0 - m) : 0.0f) + (sb1 > -INFINITY ? expf(sb1 - m) : 0.0f);
    for (int s = lo + lane; s < hi; s += 32)
        sum += expf(srow[s] * A.scale - m);
    sum = warp_sum(sum);
    float L = m + logf(sum);
    for (int s = lane; s < A.Sp; s += 32)
        prow[s] = f2bf(s >= lo && s < hi ? expf(srow[s] * A.scale - L) : 0.0f);
    for (int kk = lane; kk < A.B; kk += 32) {
        float sb = kk < 32 ? sb0 : sb1;
        pb[kk] = kk < nb ? expf(sb - L) : 0.0f;
    }
    if (lane == 0)
        lse[rho] = L;
}

/* att[r][h*hd + i] = Oc[rho][i] + sum_kk Pb[rho][kk] V[block kk][i] */
__global__ void k_attn_combine(bf16 *att, const float *Oc, const float *Pb, const bf16 *Vh, attn_args A, int H, long n)
{
    for (long e = blockIdx.x * (long)blockDim.x + threadIdx.x; e < n; e += (long)gridDim.x * blockDim.x) {
        long rho = e / A.hd;
        int i = (int)(e % A.hd), hh = (int)(rho % A.G), r = (int)((rho / A.G) % A.R),
            g = (int)(rho / ((long)A.G * A.R));
        int j = r / A.B;
        const bf16 *vb = Vh + ((long)g * A.T + A.S + (long)j * A.B) * A.hd + i;
        const float *pb = Pb + rho * A.B;
        float v = Oc[e];
        for (int kk = 0; kk < A.B; kk++)
            v += pb[kk] * bf2f(vb[(long)kk * A.hd]);
        att[(long)r * H * A.hd + (long)(g * A.G + hh) * A.hd + i] = f2bf(v);
    }
}

/* dOh[rho] = datt[r][h]; Drow[rho] = dO . O */
__global__ void k_attn_prep_bwd(bf16 *dOh, float *Drow, const bf16 *datt, const bf16 *att, attn_args A, int H, long HR)
{
    long rho = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (rho >= HR)
        return;
    int hh = (int)(rho % A.G), r = (int)((rho / A.G) % A.R), g = (int)(rho / ((long)A.G * A.R));
    long o = (long)r * H * A.hd + (long)(g * A.G + hh) * A.hd;
    float s = 0;
    for (int i = lane; i < A.hd; i += 32) {
        bf16 v = datt[o + i];
        dOh[rho * A.hd + i] = v;
        s += bf2f(v) * bf2f(att[o + i]);
    }
    s = warp_sum(s);
    if (lane == 0)
        Drow[rho] = s;
}

/* P recomputed from Sc and the saved LSE; dS = P (dP - D). */
__global__ void k_attn_bwd_softmax(bf16 *dSc, bf16 *Pc, float *dSb, float *Pb, const float *Sc, const float *dPc,
                                   const float *lse, const float *Drow, const bf16 *Qh, const bf16 *Kh, const bf16 *Vh,
                                   const bf16 *dOh, attn_args A, long HR)
{
    long rho = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (rho >= HR)
        return;
    int j, k, g, lo = 0, hi = 0, nb = 0;
    bf16 *ds = dSc + rho * A.Sp, *pc = Pc + rho * A.Sp;
    float *dsb = dSb + rho * A.B, *pb = Pb + rho * A.B;
    if (!row_mask(A, rho, &j, &k, &g, &lo, &hi, &nb)) {
        for (int s = lane; s < A.Sp; s += 32)
            ds[s] = pc[s] = f2bf(0.0f);
        for (int kk = lane; kk < A.B; kk += 32)
            dsb[kk] = pb[kk] = 0.0f;
        return;
    }
    float L = lse[rho], D = Drow[rho];
    const bf16 *q = Qh + rho * A.hd, *dO = dOh + rho * A.hd;
    long kb = ((long)g * A.T + A.S + (long)j * A.B) * A.hd;
    for (int kk = 0; kk < A.B; kk++) {
        float p = 0, dsv = 0;
        if (kk < nb) {
            float s = warp_dot(q, Kh + kb + (long)kk * A.hd, A.hd, lane) * A.scale;
            float dp = warp_dot(dO, Vh + kb + (long)kk * A.hd, A.hd, lane);
            p = expf(s - L);
            dsv = p * (dp - D);
        }
        if (lane == 0) {
            pb[kk] = p;
            dsb[kk] = dsv;
        }
    }
    const float *srow = Sc + rho * A.Sp, *dprow = dPc + rho * A.Sp;
    for (int s = lane; s < A.Sp; s += 32) {
        float p = 0, dsv = 0;
        if (s >= lo && s < hi) {
            p = expf(srow[s] * A.scale - L);
            dsv = p * (dprow[s] - D);
        }
        pc[s] = f2bf(p);
        ds[s] = f2bf(dsv);
    }
}

/* One CTA per (block j, kv head g): dK, dV of the block's own keys (sum over its B*G query
 * rows in a fixed order) and the block-key term of dQ. */
__global__ void k_attn_block_bwd(float *dQh, float *dKh, float *dVh, const float *dSb, const float *Pb, const bf16 *Qh,
                                 const bf16 *Kh, const bf16 *dOh, attn_args A)
{
    int j = blockIdx.x, g = blockIdx.y, BG = A.B * A.G;
    long row0 = ((long)g * A.R + (long)j * A.B) * A.G; /* first rho of the block: rows are contiguous */
    long kb = ((long)g * A.T + A.S + (long)j * A.B) * A.hd;
    for (int e = threadIdx.x; e < A.B * A.hd; e += blockDim.x) {
        int kk = e / A.hd, i = e % A.hd;
        float dk = 0, dv = 0;
        for (int q = 0; q < BG; q++) {
            long rho = row0 + q;
            dk += dSb[rho * A.B + kk] * bf2f(Qh[rho * A.hd + i]);
            dv += Pb[rho * A.B + kk] * bf2f(dOh[rho * A.hd + i]);
        }
        dKh[kb + (long)kk * A.hd + i] = dk * A.scale;
        dVh[kb + (long)kk * A.hd + i] = dv;
    }
    for (int e = threadIdx.x; e < BG * A.hd; e += blockDim.x) {
        long rho = row0 + e / A.hd;
        int i = e % A.hd;
        float acc = 0;
        for (int kk = 0; kk < A.B; kk++)
            acc += dSb[rho * A.B + kk] * bf2f(Kh[kb + (long)kk * A.hd + i]);
        dQh[rho * A.hd + i] += acc * A.scale;
    }
}

static int mm_batched(nn_gemm_cuda *gemm, cudaStream_t st, int ta, int tb, int M, int N, int K, const void *A, long lda,
                      long long sA, const void *B, long ldb, long long sB, void *D, long ldd, long long sD, float alpha,
                      int batch, char *err, size_t errlen)
{
    nn_gemm_args_cuda p;
    memset(&p, 0, sizeof p);
    p.ta = ta, p.tb = tb, p.M = M, p.N = N, p.K = K, p.A = A, p.lda = lda, p.B = B, p.ldb = ldb, p.D = D;
    p.ldd = ldd, p.d_type = NN_GEMM_F32, p.alpha = alpha, p.beta = 0.0f, p.batch = batch, p.sA = sA, p.sB = sB;
    p.sD = sD, p.align_hint = 1;
    return nn_gemm_run_cuda(gemm, &p, st, err, errlen);
}

static attn_args gemm_args(const dflash_attn_cuda *a)
{
    attn_args A;
    A.S = a->S, A.Sp = (a->S + 7) / 8 * 8, A.R = a->N * a->B, A.T = a->S + A.R, A.B = a->B, A.G = a->H / a->KV;
    A.hd = a->hd, A.window = a->window, A.scale = a->scale, A.hi = a->hi, A.lo = a->lo, A.keep = a->keep;
    return A;
}

static int gemm_fwd(const dflash_attn_ws_cuda *ws, const ws_ptrs &w, const dflash_attn_cuda *a, const bf16 *Qh,
                    const bf16 *Kh, const bf16 *Vh, bf16 *att, float *lse, cudaStream_t st, char *err, size_t errlen)
{
    attn_args A = gemm_args(a);
    int hd = a->hd, KV = a->KV;
    long Rg = (long)A.R * A.G, HR = (long)a->H * A.R;
    CUDA_TRY_RC(mm_batched(ws->gemm, st, 0, 1, (int)Rg, A.S, hd, Qh, hd, Rg * hd, Kh, hd, (long long)A.T * hd, w.Sc,
                           A.Sp, Rg * A.Sp, 1.0f, KV, err, errlen));
    k_attn_fwd_softmax<<<cdiv_i(HR, 8), 256, 0, st>>>(w.Pc, w.Pb, lse, w.Sc, Qh, Kh, A, HR);
    CUDA_LAUNCHED("k_attn_fwd_softmax", err, errlen);
    CUDA_TRY_RC(mm_batched(ws->gemm, st, 0, 0, (int)Rg, hd, A.S, w.Pc, A.Sp, Rg * A.Sp, Vh, hd, (long long)A.T * hd,
                           w.Oc, hd, Rg * hd, 1.0f, KV, err, errlen));
    k_attn_combine<<<(int)((HR * hd + 255) / 256 < 4096 ? (HR * hd + 255) / 256 : 4096), 256, 0, st>>>(
        att, w.Oc, w.Pb, Vh, A, a->H, HR * hd);
    CUDA_LAUNCHED("k_attn_combine", err, errlen);
    return 0;
}

static int gemm_bwd(const dflash_attn_ws_cuda *ws, const ws_ptrs &w, const dflash_attn_cuda *a, const bf16 *Qh,
                    const bf16 *Kh, const bf16 *Vh, const bf16 *att, const float *lse, const bf16 *datt, float *dQh,
                    float *dKh, float *dVh, cudaStream_t st, char *err, size_t errlen)
{
    attn_args A = gemm_args(a);
    int hd = a->hd, KV = a->KV;
    long Rg = (long)A.R * A.G, HR = (long)a->H * A.R;
    k_attn_prep_bwd<<<cdiv_i(HR, 8), 256, 0, st>>>(w.dOh, w.Drow, datt, att, A, a->H, HR);
    CUDA_LAUNCHED("k_attn_prep_bwd", err, errlen);
    CUDA_TRY_RC(mm_batched(ws->gemm, st, 0, 1, (int)Rg, A.S, hd, Qh, hd, Rg * hd, Kh, hd, (long long)A.T * hd, w.Sc,
                           A.Sp, Rg * A.Sp, 1.0f, KV, err, errlen));
    CUDA_TRY_RC(mm_batched(ws->gemm, st, 0, 1, (int)Rg, A.S, hd, w.dOh, hd, Rg * hd, Vh, hd, (long long)A.T * hd, w.dPc,
                           A.Sp, Rg * A.Sp, 1.0f, KV, err, errlen));
    k_attn_bwd_softmax<<<cdiv_i(HR, 8), 256, 0, st>>>(w.dSc, w.Pc, w.dSb, w.Pb, w.Sc, w.dPc, lse, w.Drow, Qh, Kh, Vh,
                                                      w.dOh, A, HR);
    CUDA_LAUNCHED("k_attn_bwd_softmax", err, errlen);
    /* dQ = scale dS K; dK = scale dS^T Q; dV = P^T dO (context keys) */
    CUDA_TRY_RC(mm_batched(ws->gemm, st, 0, 0, (int)Rg, hd, A.S, w.dSc, A.Sp, Rg * A.Sp, Kh, hd, (long long)A.T * hd,
                           dQh, hd, Rg * hd, A.scale, KV, err, errlen));
    CUDA_TRY_RC(mm_batched(ws->gemm, st, 1, 0, A.S, hd, (int)Rg, w.dSc, A.Sp, Rg * A.Sp, Qh, hd, Rg * hd, dKh, hd,
                           (long long)A.T * hd, A.scale, KV, err, errlen));
    CUDA_TRY_RC(mm_batched(ws->gemm, st, 1, 0, A.S, hd, (int)Rg, w.Pc, A.Sp, Rg * A.Sp, w.dOh, hd, Rg * hd, dVh, hd,
                           (long long)A.T * hd, 1.0f, KV, err, errlen));
    dim3 g(A.R / A.B, KV);
    k_attn_block_bwd<<<g, 256, 0, st>>>(dQh, dKh, dVh, w.dSb, w.Pb, Qh, Kh, w.dOh, A);
    CUDA_LAUNCHED("k_attn_block_bwd", err, errlen);
    return 0;
}

/* ---- entry points ------------------------------------------------------------------------------ */

static int check_call(const dflash_attn_ws_cuda *ws, const dflash_attn_cuda *a, const char *who, char *err,
                      size_t errlen)
{
    if (!ws || !a || a->S < 1 || a->S > ws->max_S || a->N < 1 || a->N > ws->max_N || a->B != ws->B || a->H != ws->H ||
        a->KV != ws->KV || a->hd != ws->hd || a->hd % 8 || a->H % a->KV || !a->hi || !a->lo || !a->keep ||
        (uses_gemm(ws->scheme) && !ws->gemm) || !ws->base)
        return df_err(err, errlen, -EINVAL,
                      "%s: bad call (S=%d max %d, N=%d max %d, B=%d, H=%d, KV=%d, hd=%d vs the workspace's, "
                      "NULL mask arrays or workspace)",
                      who, a ? a->S : 0, ws ? ws->max_S : 0, a ? a->N : 0, ws ? ws->max_N : 0, a ? a->B : 0,
                      a ? a->H : 0, a ? a->KV : 0, a ? a->hd : 0);
    return 0;
}

int dflash_attn_fwd_cuda(const dflash_attn_ws_cuda *ws, const dflash_attn_cuda *a, const nn_bf16_cuda *Qh_,
                         const nn_bf16_cuda *Kh_, const nn_bf16_cuda *Vh_, nn_bf16_cuda *att_, float *lse,
                         cudaStream_t st, char *err, size_t errlen)
{
    CUDA_TRY_RC(check_call(ws, a, "dflash_attn_fwd_cuda", err, errlen));
    const bf16 *Qh = as_bf(Qh_), *Kh = as_bf(Kh_), *Vh = as_bf(Vh_);
    bf16 *att = as_bf(att_);
    ws_ptrs w = ws_get(ws);
    if (ws->scheme == DFLASH_ATTN_GEMM)
        return gemm_fwd(ws, w, a, Qh, Kh, Vh, att, lse, st, err, errlen);
    fa_args A = make_args(a);
    if (a->hd <= 16)
        return fa_fwd_launch<16>(A, a->KV, Qh, Kh, Vh, att, lse, st, err, errlen);
    if (a->hd <= 32)
        return fa_fwd_launch<32>(A, a->KV, Qh, Kh, Vh, att, lse, st, err, errlen);
    if (a->hd <= 64)
        return fa_fwd_launch<64>(A, a->KV, Qh, Kh, Vh, att, lse, st, err, errlen);
    if (a->hd <= 128)
        return fa_fwd_launch<128>(A, a->KV, Qh, Kh, Vh, att, lse, st, err, errlen);
    return df_err(err, errlen, -EINVAL, "dflash_attn_fwd_cuda: fused scheme with head_dim %d > %d", a->hd, FA_MAX_HD);
}

int dflash_attn_bwd_cuda(const dflash_attn_ws_cuda *ws, const dflash_attn_cuda *a, const nn_bf16_cuda *Qh_,
                         const nn_bf16_cuda *Kh_, const nn_bf16_cuda *Vh_, const nn_bf16_cuda *att_, const float *lse,
                         const nn_bf16_cuda *datt_, float *dQh, float *dKh, float *dVh, cudaStream_t st, char *err,
                         size_t errlen)
{
    CUDA_TRY_RC(check_call(ws, a, "dflash_attn_bwd_cuda", err, errlen));
    const bf16 *Qh = as_bf(Qh_), *Kh = as_bf(Kh_), *Vh = as_bf(Vh_), *att = as_bf(att_), *datt = as_bf(datt_);
    ws_ptrs w = ws_get(ws);
    if (uses_gemm(ws->scheme))
        return gemm_bwd(ws, w, a, Qh, Kh, Vh, att, lse, datt, dQh, dKh, dVh, st, err, errlen);
    fa_args A = make_args(a);
    long HR = (long)a->H * A.R;
    k_fa_bwd_prep<<<cdiv_i(HR, 8), 256, 0, st>>>(w.Drow, datt, att, A, HR);
    CUDA_LAUNCHED("k_fa_bwd_prep", err, errlen);
    if (a->hd <= 16)
        return fa_bwd_launch<16>(A, a->KV, w, Qh, Kh, Vh, datt, lse, dQh, dKh, dVh, st, err, errlen);
    if (a->hd <= 32)
        return fa_bwd_launch<32>(A, a->KV, w, Qh, Kh, Vh, datt, lse, dQh, dKh, dVh, st, err, errlen);
    if (a->hd <= 64)
        return fa_bwd_launch<64>(A, a->KV, w, Qh, Kh, Vh, datt, lse, dQh, dKh, dVh, st, err, errlen);
    if (a->hd <= 128)
        return fa_bwd_launch<128>(A, a->KV, w, Qh, Kh, Vh, datt, lse, dQh, dKh, dVh, st, err, errlen);
    return df_err(err, errlen, -EINVAL, "dflash_attn_bwd_cuda: fused scheme with head_dim %d > %d", a->hd, FA_MAX_HD);
}
