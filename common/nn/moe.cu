/* moe.cu: the CUDA twin of moe.c (nn_moe_*_cuda, declared in nn_cuda.h): the softmax top-k
 * router, the permutation of the (token, expert) entries into expert-contiguous rows, the
 * experts (gate/up + SwiGLU, down) as a grouped GEMM over those rows or as a row-exact
 * small-row kernel per active expert, and the weighted un-permute. Everything runs on the
 * device from device-side counts, so a forward or a decode step that uses it stays one
 * stream of launches (CUDA graphs).
 *
 * Determinism: the counts are integer atomics (the same totals in any order); each
 * expert's rows are its tokens in ascending order (a stable block-wide compaction, not an
 * atomic ticket); every float sum has one fixed order (the GEMM's K chunks, the warps'
 * partials added in warp order, the un-permute's k terms in ascending expert order). So a
 * call is bit-reproducible, and with NN_MOE_ROWS a row's bits do not depend on the rows
 * beside it. */
#include "nn/nn_cuda_device.cuh"

#define FULL_MASK 0xffffffffu
#define ROUTE_PER_LANE (NN_MOE_MAX_EXPERTS / 32)

/* The SwiGLU formula of swiglu.cu (nn_swiglu_cuda), so an expert's h rounds like a dense
 * layer's. */
__device__ __forceinline__ float moe_silu_mul(float g, float u)
{
    return g / (1.0f + __expf(-g)) * u;
}

/* bf16 rounding of an fp32 value, back as fp32 (the gu tensor a separate GEMM would write) */
__device__ __forceinline__ float moe_round_bf(float v)
{
    return bf2f(f2bf(v));
}

/* ---- workspace ---------------------------------------------------------------------- */

static size_t align256(size_t n)
{
    return (n + 255) & ~(size_t)255;
}

static int max_tiles_of(int max_T, int E, int k)
{
    long rows = (long)max_T * k;
    /* sum over experts of ceil(c_e / TILE) <= rows / TILE + (experts with a partial tile) */
    long t = (rows + NN_MOE_TILE_ROWS - 1) / NN_MOE_TILE_ROWS + (E < rows ? E : rows);
    return (int)t;
}

size_t nn_moe_work_carve_cuda(nn_moe_work_cuda *w, void *base, int max_T, int E, int k)
{
    char *b = (char *)base;
    size_t off = 0;
    size_t tk = (size_t)max_T * k;
#define TAKE(field, type, n)                                        \
    do {                                                            \
        w->field = b ? reinterpret_cast<type *>(b + off) : nullptr; \
        off += align256(sizeof(type) * (size_t)(n));                \
    } while (0)
    w->max_T = max_T, w->E = E, w->k = k, w->max_tiles = max_tiles_of(max_T, E, k);
    TAKE(idx, int32_t, tk);
    TAKE(wts, float, tk);
    TAKE(counts, int32_t, E);
    TAKE(offsets, int32_t, E + 1);
    TAKE(active, int32_t, E + 1);
    TAKE(tiles, int32_t, 2 * (size_t)w->max_tiles + 1);
    TAKE(rows, int32_t, tk);
    TAKE(slot, int32_t, tk);
    TAKE(stat, long long, 2);
#undef TAKE
    return off;
}

/* ---- routing --------------------------------------------------------------------------- */

/* One warp per token: expert e = lane + 32 i sits in lane e % 32, slot e / 32. Softmax in
 * fp32 (max subtracted); then k rounds of "the largest probability not yet taken", a warp
 * arg-max whose ties go to the smaller index (moe.c's strict > over ascending experts);
 * renormalised by the sum of the k weights added in pick order, as moe.c does. A NaN
 * probability ranks below every number, so an expert is never picked twice and every index
 * stays in range whatever the logits hold. */
__global__ void moe_route_kernel(int32_t *__restrict__ idx, float *__restrict__ wts, int32_t *__restrict__ counts,
                                 const float *__restrict__ logits, int T, int E, int k, int norm)
{
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= T)
        return; /* the whole warp: t is per warp */
    const float *lg = logits + (size_t)t * E;
    float p[ROUTE_PER_LANE];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < ROUTE_PER_LANE; i++) {
        int e = lane + 32 * i;
        p[i] = e < E ? lg[e] : -INFINITY;
        mx = fmaxf(mx, p[i]);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < ROUTE_PER_LANE; i++)
        if (lane + 32 * i < E) {
            p[i] = expf(p[i] - mx);
            sum += p[i];
        }
    sum = warp_sum(sum);
#pragma unroll
    for (int i = 0; i < ROUTE_PER_LANE; i++) {
        int e = lane + 32 * i;
        if (e >= E)
            p[i] = -3.0f; /* no such expert: below everything */
        else {
            p[i] = __fdiv_rn(p[i], sum);
            if (!(p[i] == p[i]))
                p[i] = -0.5f; /* NaN: below every probability, above "taken" */
        }
    }
    float my_w = 0.0f;
    int my_e = 0;
    for (int j = 0; j < k; j++) {
        float bv = -2.0f;
        int bi = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < ROUTE_PER_LANE; i++)
            if (p[i] > bv) /* ascending experts in a lane: strict > keeps the lower */
                bv = p[i], bi = lane + 32 * i;
        warp_argmax(bv, bi);
        if (lane == j)
            my_w = bv, my_e = bi;
#pragma unroll
        for (int i = 0; i < ROUTE_PER_LANE; i++)
            if (lane + 32 * i == bi)
                p[i] = -1.0f; /* taken */
    }
    if (norm) {
        float s = 0.0f;
        for (int j = 0; j < k; j++)
            s = __fadd_rn(s, __shfl_sync(FULL_MASK, my_w, j));
        my_w = __fdiv_rn(my_w, s);
    }
    if (lane < k) {
        idx[(size_t)t * k + lane] = my_e;
        wts[(size_t)t * k + lane] = my_w;
        atomicAdd(counts + my_e, 1);
    }
}

/* Exclusive prefix sum of one int per thread over the block (blockDim.x a multiple of 32);
 * *total gets the block's sum. sh: 32 ints of shared memory (reused across calls). */
__device__ __forceinline__ int block_exclusive_scan(int v, int *sh, int *total)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(FULL_MASK, x, o);
        if (lane >= o)
            x += y;
    }
    __syncthreads(); /* the previous call's readers of sh are done */
    if (lane == 31)
        sh[w] = x;
    __syncthreads();
    if (w == 0) {
        int s = lane < nw ? sh[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(FULL_MASK, s, o);
            if (lane >= o)
                s += y;
        }
        if (lane < nw)
            sh[lane] = s;
    }
    __syncthreads();
    *total = sh[nw - 1];
    return (w > 0 ? sh[w - 1] : 0) + x - v;
}

/* One block, a thread per expert: offsets (prefix sums of the counts), the active experts
 * in ascending order, and the grouped GEMM's tiles (each expert's rows cut into tiles of
 * tile_m, experts in ascending order). */
__global__ void moe_offsets_kernel(const int32_t *__restrict__ counts, int32_t *__restrict__ offsets,
                                   int32_t *__restrict__ active, int32_t *__restrict__ tiles, int max_tiles,
                                   long long *__restrict__ stat, int E, int tile_m)
{
    __shared__ int sh[32];
    const int e = threadIdx.x;
    const int c = e < E ? counts[e] : 0, nt = (c + tile_m - 1) / tile_m, a = c > 0;
    int tot_c, tot_a, tot_t;
    int ex_c = block_exclusive_scan(c, sh, &tot_c);
    int ex_a = block_exclusive_scan(a, sh, &tot_a);
    int ex_t = block_exclusive_scan(nt, sh, &tot_t);
    if (e < E) {
        offsets[e] = ex_c;
        if (a)
            active[ex_a] = e;
        for (int i = 0; i < nt && ex_t + i < max_tiles; i++) {
            tiles[2 * (ex_t + i)] = e;
            tiles[2 * (ex_t + i) + 1] = ex_c + i * tile_m;
        }
    }
    if (e == 0) {
        offsets[E] = tot_c;
        active[E] = tot_a;
        tiles[2 * max_tiles] = tot_t < max_tiles ? tot_t : max_tiles;
        stat[0] += tot_a; /* one thread of one block, in stream order: a plain add */
        stat[1] += 1;
    }
}

/* Block e: the entries routed to expert e in ascending token order (a block-wide ballot
 * compaction per round of blockDim.x tokens), so the permutation does not depend on
 * timing: rows[offsets[e] + i] = the i-th such token, slot[t * k + j] = its row. */
__global__ void moe_scatter_kernel(const int32_t *__restrict__ idx, const int32_t *__restrict__ counts,
                                   const int32_t *__restrict__ offsets, int32_t *__restrict__ rows,
                                   int32_t *__restrict__ slot, int T, int k)
{
    const int e = blockIdx.x;
    if (counts[e] == 0)
        return; /* the whole block */
    __shared__ int wsum[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int base = offsets[e];
    for (int t0 = 0; t0 < T; t0 += blockDim.x) {
        const int t = t0 + threadIdx.x;
        int j = -1;
        if (t < T)
            for (int q = 0; q < k; q++)
                if (idx[(size_t)t * k + q] == e) {
                    j = q;
                    break;
                }
        unsigned bal = __ballot_sync(FULL_MASK, j >= 0);
        int pre = __popc(bal & ((1u << lane) - 1u));
        if (lane == 0)
            wsum[w] = __popc(bal);
        __syncthreads();
        int before = 0, tot = 0;
        for (int i = 0; i < nw; i++) {
            int c = wsum[i];
            before += i < w ? c : 0;
            tot += c;
        }
        if (j >= 0) {
            int r = base + before + pre;
            rows[r] = t;
            slot[(size_t)t * k + j] = r;
        }
        base += tot;
        __syncthreads(); /* wsum is rewritten next round */
    }
}

int nn_moe_route_cuda(nn_moe_work_cuda *w, const float *logits, int T, int norm_topk, cudaStream_t s, char *err,
                      size_t errlen)
{
    if (!w || !w->idx || T < 1 || T > w->max_T || w->E < 1 || w->E > NN_MOE_MAX_EXPERTS || w->k < 1 ||
        w->k > NN_MOE_MAX_TOPK || w->k > w->E)
        return df_err(err, errlen, -EINVAL, "nn_moe_route_cuda: T %d (workspace %d), %d experts, top %d", T,
                      w ? w->max_T : 0, w ? w->E : 0, w ? w->k : 0);
    CUDA_TRY(cudaMemsetAsync(w->counts, 0, sizeof(int32_t) * (size_t)w->E, s), err, errlen);
    moe_route_kernel<<<(T + 7) / 8, 256, 0, s>>>(w->idx, w->wts, w->counts, logits, T, w->E, w->k, norm_topk);
    CUDA_LAUNCHED("moe_route_kernel", err, errlen);
    int threads = (w->E + 31) / 32 * 32;
    moe_offsets_kernel<<<1, threads, 0, s>>>(w->counts, w->offsets, w->active, w->tiles, w->max_tiles, w->stat, w->E,
                                             NN_MOE_TILE_ROWS);
    CUDA_LAUNCHED("moe_offsets_kernel", err, errlen);
    int st = T >= 256 ? 256 : (T + 31) / 32 * 32;
    moe_scatter_kernel<<<w->E, st, 0, s>>>(w->idx, w->counts, w->offsets, w->rows, w->slot, T, w->k);
    CUDA_LAUNCHED("moe_scatter_kernel", err, errlen);
    return 0;
}

/* ---- tensor-core pieces ----------------------------------------------------------------- */

/* d += A B over k16 (m16n8k16, bf16 in, fp32 accumulate). The operands come from 16-byte
 * loads of 8 consecutive k at 8t (t = lane % 4) in BOTH operands: A's logical columns
 * (2t, 2t+1) and (2t+8, 2t+9) are then the loaded k (8t, 8t+1) and (8t+2, 8t+3) and B's
 * logical rows the same, so one product over words .x/.y and one over .z/.w sum every
 * k of the 32-wide chunk exactly once (the same fixed permutation of k in both). */
__device__ __forceinline__ void moe_mma(float *d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                        unsigned b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* a_lo: 8 k of A row g, a_hi: of A row g + 8, b: of B row (column) g */
__device__ __forceinline__ void moe_mma32(float *d, const uint4 &a_lo, const uint4 &a_hi, const uint4 &b)
{
    moe_mma(d, a_lo.x, a_hi.x, a_lo.y, a_hi.y, b.x, b.y);
    moe_mma(d, a_lo.z, a_hi.z, a_lo.w, a_hi.w, b.z, b.w);
}

/* ---- the grouped GEMM (NN_MOE_GROUPED) ----------------------------------------------------
 * Block tile: 128 permuted rows (one tile of the route step's table: one expert) x 128
 * weight rows, K in chunks of 32 through GROUPED_STAGES cp.async stages; 8 warps as 2 x 4,
 * each 64 rows x 32 weight rows (4 x 4 m16n8 products a k16). Shared memory holds a chunk
 * as [row][32] bf16 (64 bytes a row): a warp's 16-byte fragment loads of 8 rows are 512
 * contiguous bytes, conflict-free, and the cp.async copies are 16 consecutive bytes a thread.
 *   GLU (gate/up): A rows are token rows of x through rows[] (no gathered copy); the block's
 *     weight rows are 64 gate rows n0.. and the 64 up rows F + n0.., and warp wn takes gate
 *     rows 16wn.. and the same up rows, so the epilogue finds g and u of one output in one
 *     thread: h = bf16(silu(bf16(g)) * bf16(u)) into h [rows, F].
 *   plain (down): A rows are h's permuted rows; yp [rows, d] = bf16(sum). */
#define GROUPED_STAGES 3
#define GROUPED_TILE_N 128
#define GROUPED_BK 32

template <bool GLU>
__global__ void __launch_bounds__(256, 2)
    moe_grouped_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ x, const int32_t *__restrict__ rows,
                       const bf16 *__restrict__ w, const int32_t *__restrict__ offsets,
                       const int32_t *__restrict__ tiles, int max_tiles, int K, int N, long w_stride)
{
    /* 3 stages x (A 8 KB + B 8 KB) = 48 KB: the static shared memory limit */
    __shared__ __align__(128) bf16 As[GROUPED_STAGES][NN_MOE_TILE_ROWS * GROUPED_BK];
    __shared__ __align__(128) bf16 Bs[GROUPED_STAGES][GROUPED_TILE_N * GROUPED_BK];
    const int tile = blockIdx.y;
    if (tile >= tiles[2 * max_tiles])
        return; /* fewer tiles than the grid's bound */
    const int e = tiles[2 * tile], m0 = tiles[2 * tile + 1];
    const int mrows = min(NN_MOE_TILE_ROWS, offsets[e + 1] - m0);
    const int n0 = blockIdx.x * (GLU ? GROUPED_TILE_N / 2 : GROUPED_TILE_N);
    const bf16 *we = w + (size_t)e * w_stride;
    const int tid = threadIdx.x;

    /* each thread copies 2 x 16 bytes of A and of B per stage: piece p = tid + 256 i is row
     * p / 4, bytes 16 (p % 4) of the chunk */
    const bf16 *a_src[2], *b_src[2];
    bool a_ok[2], b_ok[2];
    int dst[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int p = tid + 256 * i, r = p >> 2, c = p & 3;
        dst[i] = r * GROUPED_BK + c * 8;
        a_ok[i] = r < mrows;
        long arow = GLU ? (a_ok[i] ? rows[m0 + r] : 0) : (long)m0 + (a_ok[i] ? r : 0);
        a_src[i] = x + arow * K + c * 8;
        int wr;
        if (GLU) {
            int f = n0 + (r & 63);
            b_ok[i] = f < N;
            wr = r < 64 ? f : N + f;
        } else {
            wr = n0 + r;
            b_ok[i] = wr < N;
        }
        b_src[i] = we + (long)(b_ok[i] ? wr : 0) * K + c * 8;
    }
    const int nk = (K + GROUPED_BK - 1) / GROUPED_BK;
    auto load = [&](int stage, int kc) {
        const int k0 = kc * GROUPED_BK;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const bool kin = k0 + (dst[i] & (GROUPED_BK - 1)) < K; /* K % 8 == 0: a piece is all in or all out */
            const bool ao = a_ok[i] && kin, bo = b_ok[i] && kin;
            cp_async16(&As[stage][dst[i]], ao ? a_src[i] + k0 : x, ao);
            cp_async16(&Bs[stage][dst[i]], bo ? b_src[i] + k0 : we, bo);
        }
    };
#pragma unroll
    for (int st = 0; st < GROUPED_STAGES - 1; st++) {
        if (st < nk)
            load(st, st);
        cp_async_commit();
    }
    const int lane = tid & 31, warp = tid >> 5, wm = warp >> 2, wn = warp & 3, g = lane >> 2, t4 = lane & 3;
    int brow[4];
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
        brow[nt] = GLU ? (nt < 2 ? 16 * wn + 8 * nt : 64 + 16 * wn + 8 * (nt - 2)) : 32 * wn + 8 * nt;
    float acc[4][4][4];
#pragma unroll
    for (int mt = 0; mt < 4; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
            acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
    for (int kc = 0; kc < nk; kc++) {
        cp_async_wait<GROUPED_STAGES - 2>();
        __syncthreads(); /* chunk kc is in; every warp is done with the stage refilled next */
        const int nx = kc + GROUPED_STAGES - 1;
        if (nx < nk)
            load(nx % GROUPED_STAGES, nx);
        cp_async_commit();
        const bf16 *as = As[kc % GROUPED_STAGES], *bs = Bs[kc % GROUPED_STAGES];
        uint4 af[4][2], bfr[4];
#pragma unroll
        for (int mt = 0; mt < 4; mt++) {
            const bf16 *ar = as + (wm * 64 + mt * 16 + g) * GROUPED_BK + t4 * 8;
            af[mt][0] = *reinterpret_cast<const uint4 *>(ar);
            af[mt][1] = *reinterpret_cast<const uint4 *>(ar + 8 * GROUPED_BK);
        }
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
            bfr[nt] = *reinterpret_cast<const uint4 *>(bs + (brow[nt] + g) * GROUPED_BK + t4 * 8);
#pragma unroll
        for (int mt = 0; mt < 4; mt++)
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
                moe_mma32(acc[mt][nt], af[mt][0], af[mt][1], bfr[nt]);
    }
    cp_async_wait<0>();
    /* acc[mt][nt]: [0], [1] = (row 16 mt + g, weight rows 2t4, 2t4 + 1 of n-tile nt), [2], [3]
     * the same for row 16 mt + g + 8 */
#pragma unroll
    for (int mt = 0; mt < 4; mt++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int r = wm * 64 + mt * 16 + g + 8 * hh;
            if (r >= mrows)
                continue;
            bf16 *orow = out + (size_t)(m0 + r) * N;
            if (GLU) {
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    const int f = n0 + 16 * wn + 8 * nt + 2 * t4;
                    float o0 = moe_silu_mul(moe_round_bf(acc[mt][nt][2 * hh]), moe_round_bf(acc[mt][nt + 2][2 * hh]));
                    float o1 =
                        moe_silu_mul(moe_round_bf(acc[mt][nt][2 * hh + 1]), moe_round_bf(acc[mt][nt + 2][2 * hh + 1]));
                    if (f + 1 < N && (N & 1) == 0)
                        *reinterpret_cast<__nv_bfloat162 *>(orow + f) = __halves2bfloat162(f2bf(o0), f2bf(o1));
                    else {
                        if (f < N)
                            orow[f] = f2bf(o0);
                        if (f + 1 < N)
                            orow[f + 1] = f2bf(o1);
                    }
                }
            } else {
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
                    const int n = n0 + 32 * wn + 8 * nt + 2 * t4;
                    float o0 = acc[mt][nt][2 * hh], o1 = acc[mt][nt][2 * hh + 1];
                    if (n + 1 < N && (N & 1) == 0)
                        *reinterpret_cast<__nv_bfloat162 *>(orow + n) = __halves2bfloat162(f2bf(o0), f2bf(o1));
                    else {
                        if (n < N)
                            orow[n] = f2bf(o0);
                        if (n + 1 < N)
                            orow[n + 1] = f2bf(o1);
                    }
                }
            }
        }
}

/* ---- the row-exact kernel (NN_MOE_ROWS) -----------------------------------------------------
 * Block (column tile vb, active slot i): expert e = active[i] and 16 weight rows (GLU: gate
 * rows 8 vb.. and the up rows F + 8 vb..; plain: rows 16 vb..), the weights as the 16-row
 * operand and 8 of the expert's rows per 8-column operand (NT groups, 8 NT rows a pass).
 * Warp w takes the K chunks w, w + 8, ... (ROWS_U of them loaded at a time, used in
 * ascending order); the warps' partials are added in warp order through shared memory.
 * Nothing in a row's sums depends on how many rows the expert has, so its bits are those
 * of a call where it is alone. */
#define ROWS_WARPS 8
#define ROWS_U 4
#define ROWS_RS 20 /* 16 columns padded: the partial-sum stores of a warp hit 32 banks */

template <int NT, bool GLU>
__global__ void __launch_bounds__(ROWS_WARPS * 32)
    moe_rows_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ x, const int32_t *__restrict__ rows,
                    const bf16 *__restrict__ w, const int32_t *__restrict__ offsets, const int32_t *__restrict__ counts,
                    const int32_t *__restrict__ active, int E, int K, int N, long w_stride)
{
    __shared__ float red[ROWS_WARPS][8 * NT][ROWS_RS];
    if ((int)blockIdx.y >= active[E])
        return;
    const int e = active[blockIdx.y];
    const int r0 = offsets[e], cnt = counts[e];
    const bf16 *we = w + (size_t)e * w_stride;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int vb = blockIdx.x;
    int nlo, nhi;
    bool lo_ok, hi_ok;
    if (GLU) {
        nlo = 8 * vb + g;
        nhi = N + nlo;
        lo_ok = hi_ok = nlo < N;
    } else {
        nlo = 16 * vb + g;
        nhi = nlo + 8;
        lo_ok = nlo < N, hi_ok = nhi < N;
    }
    const bf16 *wlo = we + (long)(lo_ok ? nlo : 0) * K, *whi = we + (long)(hi_ok ? nhi : 0) * K;
    const int nchunks = (K + 31) / 32;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int p0 = 0; p0 < cnt; p0 += 8 * NT) {
        const int np = min(cnt - p0, 8 * NT), ng = (np + 7) / 8;
        const bf16 *xr[NT];
        bool xok[NT];
#pragma unroll
        for (int j = 0; j < NT; j++) {
            int rr = p0 + 8 * j + g;
            xok[j] = rr < cnt;
            long src = GLU ? rows[r0 + (xok[j] ? rr : 0)] : (long)r0 + (xok[j] ? rr : 0);
            xr[j] = x + src * K;
        }
        float acc[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++)
            acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
        for (int c0 = warp; c0 < nchunks; c0 += ROWS_WARPS * ROWS_U) {
            uint4 alo[ROWS_U], ahi[ROWS_U];
#pragma unroll
            for (int u = 0; u < ROWS_U; u++) {
                int c = c0 + u * ROWS_WARPS, k = c * 32 + 8 * t;
                bool in = c < nchunks && k < K;
                alo[u] = lo_ok && in ? __ldg(reinterpret_cast<const uint4 *>(wlo + k)) : zero;
                ahi[u] = hi_ok && in ? __ldg(reinterpret_cast<const uint4 *>(whi + k)) : zero;
            }
#pragma unroll
            for (int u = 0; u < ROWS_U; u++) {
                int c = c0 + u * ROWS_WARPS, k = c * 32 + 8 * t;
                if (c >= nchunks)
                    break; /* the same for every lane */
                bool in = k < K;
#pragma unroll
                for (int j = 0; j < NT; j++)
                    if (j < ng) {
                        uint4 b = xok[j] && in ? *reinterpret_cast<const uint4 *>(xr[j] + k) : zero;
                        moe_mma32(acc[j], alo[u], ahi[u], b);
                    }
            }
        }
        /* acc[j]: [0], [1] = (weight row g, rows 8j + 2t, 8j + 2t + 1), [2], [3] = weight row g + 8 */
        __syncthreads(); /* the previous pass's epilogue has read red */
#pragma unroll
        for (int j = 0; j < NT; j++) {
            red[warp][8 * j + 2 * t][g] = acc[j][0];
            red[warp][8 * j + 2 * t + 1][g] = acc[j][1];
            red[warp][8 * j + 2 * t][g + 8] = acc[j][2];
            red[warp][8 * j + 2 * t + 1][g + 8] = acc[j][3];
        }
        __syncthreads();
        if (GLU) {
            for (int i = threadIdx.x; i < 8 * np; i += blockDim.x) {
                const int rr = i >> 3, c = i & 7, f = 8 * vb + c;
                if (f >= N)
                    continue;
                float gs = red[0][rr][c], us = red[0][rr][c + 8];
#pragma unroll
                for (int ww = 1; ww < ROWS_WARPS; ww++)
                    gs += red[ww][rr][c], us += red[ww][rr][c + 8];
                out[(size_t)(r0 + p0 + rr) * N + f] = f2bf(moe_silu_mul(moe_round_bf(gs), moe_round_bf(us)));
            }
        } else {
            for (int i = threadIdx.x; i < 16 * np; i += blockDim.x) {
                const int rr = i >> 4, c = i & 15, n = 16 * vb + c;
                if (n >= N)
                    continue;
                float v = red[0][rr][c];
#pragma unroll
                for (int ww = 1; ww < ROWS_WARPS; ww++)
                    v += red[ww][rr][c];
                out[(size_t)(r0 + p0 + rr) * N + n] = f2bf(v);
            }
        }
    }
}

template <bool GLU>
static cudaError_t rows_launch(int T, dim3 grid, cudaStream_t s, bf16 *out, const bf16 *x, const int32_t *rows,
                               const bf16 *w, const int32_t *offsets, const int32_t *counts, const int32_t *active,
                               int E, int K, int N, long w_stride)
{
    /* an expert has at most T rows (a token picks it once): row groups from T */
    if (T <= 8)
        moe_rows_kernel<1, GLU>
            <<<grid, ROWS_WARPS * 32, 0, s>>>(out, x, rows, w, offsets, counts, active, E, K, N, w_stride);
    else if (T <= 16)
        moe_rows_kernel<2, GLU>
            <<<grid, ROWS_WARPS * 32, 0, s>>>(out, x, rows, w, offsets, counts, active, E, K, N, w_stride);
    else if (T <= 32)
        moe_rows_kernel<4, GLU>
            <<<grid, ROWS_WARPS * 32, 0, s>>>(out, x, rows, w, offsets, counts, active, E, K, N, w_stride);
    else
        moe_rows_kernel<8, GLU>
            <<<grid, ROWS_WARPS * 32, 0, s>>>(out, x, rows, w, offsets, counts, active, E, K, N, w_stride);
    return cudaGetLastError();
}

/* ---- un-permute ------------------------------------------------------------------------------
 * Block t: its k entries ordered by expert (rank = experts of the token below it), then
 * y[t, i] = bf16(sum over that order of wts * yp[row, i]), each product and sum rounded
 * once in fp32 (no contraction into fma, as moe.c's loop with -ffp-contract=off). */
__global__ void moe_unpermute_kernel(bf16 *__restrict__ y, const bf16 *__restrict__ yp, const int32_t *__restrict__ idx,
                                     const float *__restrict__ wts, const int32_t *__restrict__ slot, int d, int k)
{
    __shared__ int s_row[NN_MOE_MAX_TOPK];
    __shared__ float s_w[NN_MOE_MAX_TOPK];
    const int t = blockIdx.x;
    if ((int)threadIdx.x < k) {
        const int j = threadIdx.x, ej = idx[(size_t)t * k + j];
        int rank = 0;
        for (int q = 0; q < k; q++)
            rank += idx[(size_t)t * k + q] < ej;
        s_row[rank] = slot[(size_t)t * k + j];
        s_w[rank] = wts[(size_t)t * k + j];
    }
    __syncthreads();
    bf16 *yr = y + (size_t)t * d;
    if ((d & 7) == 0) {
        for (int i = threadIdx.x * 8; i < d; i += blockDim.x * 8) {
            float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (int r = 0; r < k; r++) {
                float v[8];
                load_bf16x8(v, yp + (size_t)s_row[r] * d + i);
                const float wr = s_w[r];
#pragma unroll
                for (int q = 0; q < 8; q++)
                    acc[q] = __fadd_rn(acc[q], __fmul_rn(wr, v[q]));
            }
            store_bf16x8(yr + i, acc);
        }
    } else {
        for (int i = threadIdx.x; i < d; i += blockDim.x) {
            float acc = 0.0f;
            for (int r = 0; r < k; r++)
                acc = __fadd_rn(acc, __fmul_rn(s_w[r], bf2f(yp[(size_t)s_row[r] * d + i])));
            yr[i] = f2bf(acc);
        }
    }
}

static int aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

int nn_moe_experts_cuda(nn_bf16_cuda *y, const nn_bf16_cuda *x, const nn_bf16_cuda *w_gu, const nn_bf16_cuda *w_down,
                        const nn_moe_work_cuda *w, nn_bf16_cuda *h, nn_bf16_cuda *yp, int T, int d, int F, int kernel,
                        cudaStream_t s, char *err, size_t errlen)
{
    if (!w || T < 1 || T > w->max_T || d < 8 || F < 8 || d % 8 || F % 8 ||
        (kernel != NN_MOE_GROUPED && kernel != NN_MOE_ROWS))
        return df_err(err, errlen, -EINVAL, "nn_moe_experts_cuda: T %d (workspace %d), d %d, F %d, kernel %d", T,
                      w ? w->max_T : 0, d, F, kernel);
    if (!aligned16(x) || !aligned16(w_gu) || !aligned16(w_down) || !aligned16(h) || !aligned16(yp) || !aligned16(y))
        return df_err(err, errlen, -EINVAL,
                      "nn_moe_experts_cuda: x, y, h, yp and the weights must be 16-byte "
                      "aligned");
    const int E = w->E, k = w->k;
    const long gu_stride = 2L * F * d, dn_stride = (long)d * F;
    if (kernel == NN_MOE_GROUPED) {
        /* the tiles live in the table of the route step; the grid is its bound */
        dim3 g1((unsigned)((F + 63) / 64), (unsigned)w->max_tiles),
            g2((unsigned)((d + 127) / 128), (unsigned)w->max_tiles);
        moe_grouped_kernel<true><<<g1, 256, 0, s>>>(as_bf(h), as_bf(x), w->rows, as_bf(w_gu), w->offsets, w->tiles,
                                                    w->max_tiles, d, F, gu_stride);
        CUDA_LAUNCHED("moe_grouped_kernel (gate/up)", err, errlen);
        moe_grouped_kernel<false><<<g2, 256, 0, s>>>(as_bf(yp), as_bf(h), w->rows, as_bf(w_down), w->offsets, w->tiles,
                                                     w->max_tiles, F, d, dn_stride);
        CUDA_LAUNCHED("moe_grouped_kernel (down)", err, errlen);
    } else {
        /* at most min(E, T * k) experts have rows: blocks past active[E] return at once */
        unsigned slots = (unsigned)((long)T * k < E ? (long)T * k : E);
        cudaError_t ce = rows_launch<true>(T, dim3((unsigned)((F + 7) / 8), slots), s, as_bf(h), as_bf(x), w->rows,
                                           as_bf(w_gu), w->offsets, w->counts, w->active, E, d, F, gu_stride);
        if (ce != cudaSuccess)
            return df_err(err, errlen, -EIO, "launch of moe_rows_kernel (gate/up): %s", cudaGetErrorString(ce));
        ce = rows_launch<false>(T, dim3((unsigned)((d + 15) / 16), slots), s, as_bf(yp), as_bf(h), w->rows,
                                as_bf(w_down), w->offsets, w->counts, w->active, E, F, d, dn_stride);
        if (ce != cudaSuccess)
            return df_err(err, errlen, -EIO, "launch of moe_rows_kernel (down): %s", cudaGetErrorString(ce));
    }
    moe_unpermute_kernel<<<T, 128, 0, s>>>(as_bf(y), as_bf(yp), w->idx, w->wts, w->slot, d, k);
    CUDA_LAUNCHED("moe_unpermute_kernel", err, errlen);
    return 0;
}
