/* dflash_cuda.cu: the DFlash drafter training step on the GPU (see dflash_cuda.h and
 * docs/drafter_cuda.md). The order of operations follows dflash_model.c step by step so
 * the two can be compared tensor by tensor; what differs is only where the data lives and
 * how the small ops are fused:
 *
 *   - projections: cuBLASLt bf16 GEMMs (nn_gemm_run_cuda, align_hint 1); q/k/v and gate/up fused (adjacent in
 *     the flat parameter array); the residual adds ride in the GEMM epilogue (beta = 1, fp32
 *     C = the residual); weight gradients accumulate into the fp32 gradient array with beta 1.
 *   - per-head q/k RMSNorm + RoPE: one warp per (token, head), writing the attention layout
 *     [kv head][row][group head][hd] so that the attention GEMMs of a KV head are plain
 *     strided GEMMs over R*G query rows (the 16 rows of a block x G heads share K/V).
 *   - DFlash attention: scores against the S context keys are one batched GEMM per layer;
 *     a warp per query row applies the training mask (context [lo, a_j), own block keys,
 *     sliding window / in-block causality), computes the block-key scores itself, the
 *     softmax and its LSE; P @ V is a second GEMM plus the block keys' term. Backward
 *     recomputes P from the saved LSE; dK/dV of context keys are GEMMs over all query rows
 *     (a fixed-order sum, no atomics); block keys are reduced per (block, KV head) CTA.
 *     Context scores are computed for every key (masked afterwards): about 2x the useful
 *     attention FLOPs, at tensor-core speed, which at B=16 is a few % of the step.
 *   - loss: rows with weight > 0 are compacted on the device; chunks of chunk_rows rows go
 *     through logits GEMM (fp32) -> one CE/softmax/dlogits kernel per row -> dz GEMM; the
 *     chunk count comes from the host-known bound n_real*(B-1), so the host never waits.
 *     D-PACE (c.loss, dflash_loss.h): the same pass with unit row weights keeps each row's
 *     CE; then one thread per block turns its CEs into the detached position weights and a
 *     last kernel scales the rows of dz (a row's gradient is linear in its weight).
 *   - reductions that produce gradients of norm weights and the global norm go through
 *     fixed-size partial buffers summed in a fixed order: bit-identical runs.
 */
#include "dflash/dflash_cuda.h"
#include "dflash/dflash_adamw_cuda.h"

#include "dflash/dflash_attn_cuda.h"
#include "nn/nn_cuda_device.cuh"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "dflash/dflash_model.h"
#include "io/safetensors.h"
#include "nn/nn.h"
}

/* ---- context ------------------------------------------------------------------------ */

enum { T_IN = 0, T_POST, T_Q, T_K, T_V, T_O, T_QN, T_KN, T_GATE, T_UP, T_DOWN, PER_LAYER };
enum { ERR_ANCHOR = 1, ERR_TOKEN = 2, ERR_ROWS = 4 };
#define NPART 1024    /* partial sums of the global norm */
#define COL_CHUNK 256 /* rows per partial of a column sum */

typedef struct dev_stats {
    double wce, sum_w, norm; /* sum_w: the normaliser's share (decay: sum of w; dpace: loss blocks) */
    double count[DFLASH_MAX_BLOCK], correct[DFLASH_MAX_BLOCK], wpos[DFLASH_MAX_BLOCK];
    int n_kept, err;
} dev_stats;

typedef adamw_state_cuda opt_state; /* the optimizer's device state (dflash_adamw_cuda.h) */
typedef adamw_tensor_cuda tensor_ent;

typedef struct layer_buf {
    float *h_in, *h_mid, *lse;
    bf16 *a, *qkv, *kvc, *Qh, *Kh, *Vh, *att, *n, *gu, *act;
} layer_buf;

struct dflash_ctx_cuda {
    dflash_config c;
    adamw_config opt;
    long warm;
    int d, H, KV, hd, G, I, V, Vp, B, nc, L, qd, kvd, qkvd;
    float eps, scale;
    int max_S, max_N, max_R, max_T, CH;
    size_t np;
    int ntensor;
    size_t off_fc, off_hn, off_fn, off[DFLASH_MAX_LAYERS][PER_LAYER];
    cudaStream_t st;
    nn_gemm_cuda *gemm;
    const bf16 *embed, *head;
    void *arena;
    size_t arena_bytes;
    /* parameters */
    float *P, *Gr, *Mm, *Vm;
    bf16 *Wb;
    tensor_ent *tens;
    float *inv_freq;
    /* batch */
    int32_t *pos, *labels, *idx;
    float *wts;
    dev_stats *ds;
    bf16 *Hb, *ctxb;
    float *fc_out;
    layer_buf lb[DFLASH_MAX_LAYERS];
    float *h_out;
    bf16 *z;
    /* attention (dflash_attn_cuda.h): scheme, its workspace, gradients; per anchor slot the
     * context window [alo, ahi) in packed rows and the effective keep flag */
    int attn_scheme;
    dflash_attn_ws_cuda aws;
    float *dQh, *dKh, *dVh;
    int32_t *ahi, *alo;
    uint8_t *ekeep;
    /* loss */
    bf16 *zc, *dlog;
    float *logits, *dzc, *dz;
    double *row_wce;
    uint8_t *row_ok;
    double *ce_row, *wrow; /* D-PACE: CE and weight per block row [max_R] */
    /* backward */
    float *dh, *dh2, *dn, *da, *dctx, *dfc, *contrib, *partial;
    bf16 *dhb, *dh2b, *dact, *dgu, *datt, *dqkv, *dkvc, *dfcb;
    /* optimizer */
    double *norm_part;
    opt_state *os;
    int last_S, last_N;
    /* forward only (dflash_init_forward_cuda): no gradients, AdamW state or backward buffers
     * (their pointers NULL); the entries that would touch them refuse with -EINVAL */
    int fwd_only;
    /* phase timing (dflash_timing_enable_cuda) */
    int timing;
    cudaEvent_t ev_ph[6];                     /* start, z, loss, bwd end, opt start, opt end */
    cudaEvent_t ev_at[4 * DFLASH_MAX_LAYERS]; /* per layer: fwd start/end, bwd start/end */
};

cudaStream_t dflash_stream_cuda(const dflash_ctx_cuda *x)
{
    return x->st;
}
size_t dflash_param_count_cuda(const dflash_ctx_cuda *x)
{
    return x->np;
}
size_t dflash_device_bytes_cuda(const dflash_ctx_cuda *x)
{
    return x->arena_bytes + (64u << 20);
}

/* ---- device helpers ------------------------------------------------------------------- */

__device__ __forceinline__ float rms_r(float ss, int C, float eps)
{
    return (float)(1.0 / sqrt((double)ss / C + (double)eps));
}

static inline int cdiv(long a, long b)
{
    return (int)((a + b - 1) / b);
}

/* ---- elementwise ---------------------------------------------------------------------- */

__global__ void k_f32_to_bf16(bf16 *out, const float *in, long n)
{
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        out[i] = f2bf(in[i]);
}

__device__ __forceinline__ uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
__device__ __forceinline__ float hash_unit(uint64_t seed, long long i) /* uniform [-1, 1) */
{
    uint64_t h = mix64(seed ^ mix64((uint64_t)i));
    return (float)((double)(h >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

__global__ void k_fill_uniform_bf16(bf16 *p, long n, uint64_t seed, float scale)
{
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        p[i] = f2bf(scale * hash_unit(seed, i));
}

__global__ void k_params_init(float *P, bf16 *Wb, const tensor_ent *tens, uint64_t seed, float amp)
{
    tensor_ent t = tens[blockIdx.y];
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < t.len;
         e += (long long)gridDim.x * blockDim.x) {
        long long i = t.off + e;
        float v = t.is_norm ? 1.0f : amp * hash_unit(seed, i);
        P[i] = v;
        Wb[i] = f2bf(v);
    }
}

/* ---- batch preparation: labels, weights, positions, windows, compaction (one block) ----- */

/* The documents of a call (by value: no copy, nothing to wait for). Document k is context rows
 * [start[k], start[k+1]) and the packed anchor slots [slot0[k], slot0[k+1]), read from
 * anchors / keep at k*stride + (j - slot0[k]); slots from slot0[n] on are padding. */
typedef struct doc_table {
    int n, stride;
    int start[DFLASH_MAX_DOCS_CUDA + 1];
    int slot0[DFLASH_MAX_DOCS_CUDA + 1];
} doc_table;

/* the largest k in [0, n) with v[k] <= t (v rising, v[0] <= t) */
__device__ __forceinline__ int doc_search(const int *v, int n, int t)
{
    int a = 0, b = n - 1;
    while (a < b) {
        int m = (a + b + 1) >> 1;
        if (v[m] <= t)
            a = m;
        else
            b = m - 1;
    }
    return a;
}

/* Slot j: its document's rows [*s0, *s0 + *len), its local anchor *a; returns keep && anchor in
 * range; *bad = kept with the anchor out of range. Padding slots: s0 = len = a = 0. */
__device__ __forceinline__ int slot_info(const doc_table &D, const int32_t *anchors, const uint8_t *keep, int j,
                                         int *s0, int *len, int *a, int *bad)
{
    *s0 = *len = *a = *bad = 0;
    if (j >= D.slot0[D.n])
        return 0;
    int k = doc_search(D.slot0, D.n, j);
    long src = (long)k * D.stride + (j - D.slot0[k]);
    *s0 = D.start[k];
    *len = D.start[k + 1] - D.start[k];
    *a = anchors[src];
    int kp = keep[src] != 0, ok = *a >= 0 && *a < *len;
    *bad = kp && !ok;
    if (!ok)
        *a = 0;
    return kp && ok;
}

/* Per slot j: effective keep, context window alo = document start, ahi = start + anchor (start
 * when not kept); labels y = x[s0 + a + kk] while a + kk < len, weights from loss_mask, RoPE
 * positions doc-local (context row t: t - its document's start; block rows a + kk): exactly what
 * a call per document computes. */
__global__ void __launch_bounds__(1024)
    k_batch_prep(int32_t *labels, float *wts, int32_t *pos, int32_t *idx, int32_t *ahi, int32_t *alo, uint8_t *ekeep,
                 dev_stats *ds, const int32_t *x, const uint8_t *lmask, const int32_t *anchors, const uint8_t *keep,
                 doc_table D, int S, int N, int B, int V, double gamma, double norm_arg, int rows_max, int dpace)
{
    __shared__ int scan[1024];
    __shared__ double shd[32];
    __shared__ int err_sh;
    int tid = threadIdx.x, R = N * B;
    if (tid == 0)
        err_sh = 0;
    __syncthreads();
    int err = 0;
    for (int j = tid; j < N; j += blockDim.x) {
        int s0, len, a, bad, kp = slot_info(D, anchors, keep, j, &s0, &len, &a, &bad);
        if (bad)
            err |= ERR_ANCHOR;
        ekeep[j] = (uint8_t)kp;
        alo[j] = s0;
        ahi[j] = s0 + a;
    }
    for (int t = tid; t < S + R; t += blockDim.x) {
        if (t < S) {
            pos[t] = t - D.start[doc_search(D.start, D.n, t)];
        } else {
            int r = t - S, s0, len, a, bad;
            slot_info(D, anchors, keep, r / B, &s0, &len, &a, &bad);
            pos[t] = a + r % B;
        }
    }
    double sw = 0, nblk = 0; /* nblk: blocks whose k = 1 row is a loss row (D-PACE's normaliser) */
    int base = 0;
    for (int r0 = 0; r0 < R; r0 += blockDim.x) {
        int r = r0 + tid, flag = 0;
        if (r < R) {
            int k = r % B, s0, len, a, bad, kp = slot_info(D, anchors, keep, r / B, &s0, &len, &a, &bad);
            int p = a + k, lab = -1;
            float w = 0.0f;
            if (kp && k > 0 && p < len) {
                lab = x[s0 + p];
                if (lmask[s0 + p]) {
                    w = (float)exp(-(double)(k - 1) / gamma);
                    if (lab < 0 || lab >= V)
                        err |= ERR_TOKEN;
                }
            }
            if (kp && (x[s0 + a] < 0 || x[s0 + a] >= V))
                err |= ERR_TOKEN;
            labels[r] = lab;
            wts[r] = w;
            flag = w > 0.0f;
            sw += (double)w;
            nblk += k == 1 && flag;
        }
        scan[tid] = flag;
        __syncthreads();
        for (int o = 1; o < (int)blockDim.x; o <<= 1) { /* inclusive Hillis-Steele scan */
            int v = tid >= o ? scan[tid - o] : 0;
            __syncthreads();
            scan[tid] += v;
            __syncthreads();
        }
        if (flag)
            idx[base + scan[tid] - 1] = r;
        base += scan[blockDim.x - 1];
        __syncthreads();
    }
    if (err)
        atomicOr(&err_sh, err);
    double total = block_sum<double>(sw, shd);
    double blocks = block_sum<double>(nblk, shd); /* small integers: exact in any order */
    __syncthreads();
    if (tid == 0) {
        if (base > rows_max)
            err_sh |= ERR_ROWS;
        ds->n_kept = base;
        ds->err = err_sh;
        ds->sum_w = dpace ? blocks : total;
        ds->norm = norm_arg > 0 ? norm_arg : ds->sum_w;
    }
}

/* h0[r] = E[x[ahi_j]] (k = 0: the anchor's token, ahi is its packed row) or E[MASK] */
__global__ void k_embed_h0(float *h, const bf16 *E, const int32_t *x, const int32_t *ahi, int R, int B, int d, int S,
                           int V, int mask_id)
{
    long n = (long)R * d;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        int r = (int)(i / d), c = (int)(i % d), k = r % B, a = ahi[r / B];
        int tok = mask_id;
        if (k == 0) {
            tok = (a >= 0 && a < S) ? x[a] : 0;
            if (tok < 0 || tok >= V)
                tok = 0; /* flagged by k_batch_prep */
        }
        h[i] = bf2f(E[(long)tok * d + c]);
    }
}

/* ---- RMSNorm (whole rows) -------------------------------------------------------------- */

__global__ void k_rmsnorm_fwd(bf16 *out, const float *x, const float *w, int C, float eps)
{
    __shared__ float sh[32];
    const float *xr = x + (long)blockIdx.x * C;
    float ss = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        ss += xr[c] * xr[c];
    ss = block_sum<float>(ss, sh);
    float r = rms_r(ss, C, eps);
    bf16 *o = out + (long)blockIdx.x * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        o[c] = f2bf(xr[c] * r * w[c]);
}

/* dx = resid + r (g w) - x r^3 mean(g w x); dxb = bf16(dx); contrib = g x r (for dw) */
__global__ void k_rmsnorm_bwd(float *dx, bf16 *dxb, float *contrib, const float *resid, const float *dout,
                              const float *x, const float *w, int C, float eps)
{
    __shared__ float sh[32];
    long o = (long)blockIdx.x * C;
    float ss = 0, dot = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float xv = x[o + c];
        ss += xv * xv;
        dot += dout[o + c] * w[c] * xv;
    }
    ss = block_sum<float>(ss, sh);
    dot = block_sum<float>(dot, sh);
    float r = rms_r(ss, C, eps);
    float k = dot * r * r * r / (float)C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float g = dout[o + c], xv = x[o + c];
        float v = g * w[c] * r - xv * k;
        if (resid)
            v += resid[o + c];
        dx[o + c] = v;
        if (dxb)
            dxb[o + c] = f2bf(v);
        contrib[o + c] = g * xv * r;
    }
}

/* out[c] += sum over rows of X[r][c], in a fixed order: partial per COL_CHUNK rows, then
 * the partials in order. */
__global__ void k_colsum_partial(float *part, const float *X, long rows, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    long r0 = (long)blockIdx.y * COL_CHUNK, r1 = min(rows, r0 + COL_CHUNK);
    float s = 0;
    for (long r = r0; r < r1; r++)
        s += X[r * C + c];
    part[(long)blockIdx.y * C + c] = s;
}
__global__ void k_colsum_final(float *out, const float *part, int nchunks, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float s = 0;
    for (int i = 0; i < nchunks; i++)
        s += part[(long)i * C + c];
    out[c] += s;
}

/* ---- q/k norm + RoPE ---------------------------------------------------------------------
 * One warp per (row, head); lane handles the rotation pairs (p, p + hd/2), p = lane + 32m. */

#define MAXP 4 /* hd <= 256 */

__device__ __forceinline__ void norm_rope_fwd(bf16 *out, const bf16 *x, const float *w, int hd, float eps, float posf,
                                              const float *inv_freq, int lane)
{
    int half = hd / 2;
    float x1[MAXP], x2[MAXP], ss = 0;
#pragma unroll
    for (int m = 0; m < MAXP; m++) {
        int p = lane + 32 * m;
        x1[m] = x2[m] = 0;
        if (p < half) {
            x1[m] = bf2f(x[p]);
            x2[m] = bf2f(x[p + half]);
            ss += x1[m] * x1[m] + x2[m] * x2[m];
        }
    }
    float r = rms_r(warp_sum(ss), hd, eps);
#pragma unroll
    for (int m = 0; m < MAXP; m++) {
        int p = lane + 32 * m;
        if (p < half) {
            float y1 = x1[m] * r * w[p], y2 = x2[m] * r * w[p + half];
            float ang = posf * inv_freq[p], cs = cosf(ang), sn = sinf(ang);
            out[p] = f2bf(y1 * cs - y2 * sn);
            out[p + half] = f2bf(y2 * cs + y1 * sn);
        }
    }
}

__device__ __forceinline__ void norm_rope_bwd(bf16 *dxo, float *contrib, const float *dy, const bf16 *x, const float *w,
                                              int hd, float eps, float posf, const float *inv_freq, int lane)
{
    int half = hd / 2;
    float g1[MAXP], g2[MAXP], x1[MAXP], x2[MAXP], ss = 0, dot = 0;
#pragma unroll
    for (int m = 0; m < MAXP; m++) {
        int p = lane + 32 * m;
        g1[m] = g2[m] = x1[m] = x2[m] = 0;
        if (p < half) {
            float a = dy[p], b = dy[p + half];
            float ang = posf * inv_freq[p], cs = cosf(ang), sn = sinf(ang);
            g1[m] = a * cs + b * sn;
            g2[m] = b * cs - a * sn;
            x1[m] = bf2f(x[p]);
            x2[m] = bf2f(x[p + half]);
            ss += x1[m] * x1[m] + x2[m] * x2[m];
            dot += g1[m] * w[p] * x1[m] + g2[m] * w[p + half] * x2[m];
        }
    }
    float r = rms_r(warp_sum(ss), hd, eps);
    dot = warp_sum(dot);
    float k = dot * r * r * r / (float)hd;
#pragma unroll
    for (int m = 0; m < MAXP; m++) {
        int p = lane + 32 * m;
        if (p < half) {
            dxo[p] = f2bf(g1[m] * w[p] * r - x1[m] * k);
            dxo[p + half] = f2bf(g2[m] * w[p + half] * r - x2[m] * k);
            contrib[p] = g1[m] * x1[m] * r;
            contrib[p + half] = g2[m] * x2[m] * r;
        }
    }
}

/* units [0, R*H): queries; [R*H, R*H + T*KV): key + value of (t, g). */
__global__ void k_qk_fwd(bf16 *Qh, bf16 *Kh, bf16 *Vh, const bf16 *qkv, const bf16 *kvc, const float *qn,
                         const float *kn, const float *inv_freq, const int32_t *pos, int S, int R, int H, int KV,
                         int hd, float eps)
{
    long unit = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31, G = H / KV, T = S + R, qd = H * hd, kvd = KV * hd, qkvd = qd + 2 * kvd;
    if (unit < (long)R * H) {
        int r = (int)(unit / H), h = (int)(unit % H), g = h / G, hh = h % G;
        long rho = ((long)g * R + r) * G + hh;
        norm_rope_fwd(Qh + rho * hd, qkv + (long)r * qkvd + (long)h * hd, qn, hd, eps, (float)pos[S + r], inv_freq,
                      lane);
        return;
    }
    unit -= (long)R * H;
    if (unit >= (long)T * KV)
        return;
    int t = (int)(unit / KV), g = (int)(unit % KV);
    const bf16 *ks, *vs;
    if (t < S) {
        ks = kvc + (long)t * 2 * kvd + (long)g * hd;
        vs = ks + kvd;
    } else {
        ks = qkv + (long)(t - S) * qkvd + qd + (long)g * hd;
        vs = ks + kvd;
    }
    long o = ((long)g * T + t) * hd;
    norm_rope_fwd(Kh + o, ks, kn, hd, eps, (float)pos[t], inv_freq, lane);
    for (int i = lane; i < hd; i += 32)
        Vh[o + i] = vs[i];
}

__global__ void k_qk_bwd(bf16 *dqkv, bf16 *dkvc, float *cq, float *ck, const float *dQh, const float *dKh,
                         const float *dVh, const bf16 *qkv, const bf16 *kvc, const float *qn, const float *kn,
                         const float *inv_freq, const int32_t *pos, int S, int R, int H, int KV, int hd, float eps)
{
    long unit = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31, G = H / KV, T = S + R, qd = H * hd, kvd = KV * hd, qkvd = qd + 2 * kvd;
    if (unit < (long)R * H) {
        int r = (int)(unit / H), h = (int)(unit % H), g = h / G, hh = h % G;
        long rho = ((long)g * R + r) * G + hh;
        long o = (long)r * qkvd + (long)h * hd;
        norm_rope_bwd(dqkv + o, cq + unit * hd, dQh + rho * hd, qkv + o, qn, hd, eps, (float)pos[S + r], inv_freq,
                      lane);
        return;
    }
    unit -= (long)R * H;
    if (unit >= (long)T * KV)
        return;
    int t = (int)(unit / KV), g = (int)(unit % KV);
    const bf16 *ks;
    bf16 *dks;
    if (t < S) {
        ks = kvc + (long)t * 2 * kvd + (long)g * hd;
        dks = dkvc + (long)t * 2 * kvd + (long)g * hd;
    } else {
        ks = qkv + (long)(t - S) * qkvd + qd + (long)g * hd;
        dks = dqkv + (long)(t - S) * qkvd + qd + (long)g * hd;
    }
    long o = ((long)g * T + t) * hd;
    norm_rope_bwd(dks, ck + unit * hd, dKh + o, ks, kn, hd, eps, (float)pos[t], inv_freq, lane);
    for (int i = lane; i < hd; i += 32)
        dks[kvd + i] = f2bf(dVh[o + i]);
}

/* ---- SwiGLU --------------------------------------------------------------------------------- */

__global__ void k_swiglu_fwd(bf16 *act, const bf16 *gu, int I, long n)
{
    for (long e = blockIdx.x * (long)blockDim.x + threadIdx.x; e < n; e += (long)gridDim.x * blockDim.x) {
        long r = e / I, i = e % I;
        float g = bf2f(gu[r * 2 * I + i]), u = bf2f(gu[r * 2 * I + I + i]);
        act[e] = f2bf(g / (1.0f + expf(-g)) * u);
    }
}
__global__ void k_swiglu_bwd(bf16 *dgu, const bf16 *dact, const bf16 *gu, int I, long n)
{
    for (long e = blockIdx.x * (long)blockDim.x + threadIdx.x; e < n; e += (long)gridDim.x * blockDim.x) {
        long r = e / I, i = e % I;
        float g = bf2f(gu[r * 2 * I + i]), u = bf2f(gu[r * 2 * I + I + i]), d = bf2f(dact[e]);
        float sg = 1.0f / (1.0f + expf(-g));
        dgu[r * 2 * I + i] = f2bf(d * u * sg * (1.0f + g * (1.0f - sg)));
        dgu[r * 2 * I + I + i] = f2bf(d * g * sg);
    }
}

/* ---- loss ----------------------------------------------------------------------------------- */

__global__ void k_gather_z(bf16 *zc, const bf16 *z, const int32_t *idx, const dev_stats *ds, int rows_max, int d)
{
    long n = (long)rows_max * d;
    int kept = ds->n_kept;
    for (long e = blockIdx.x * (long)blockDim.x + threadIdx.x; e < n; e += (long)gridDim.x * blockDim.x) {
        long ci = e / d;
        zc[e] = ci < kept ? z[(long)idx[ci] * d + e % d] : f2bf(0.0f);
    }
}

/* One block per row of the chunk: softmax, CE, argmax, dlogits = (p - onehot) w / norm.
 * Two passes over the row (it does not fit in shared memory): the first keeps per thread the
 * running max, its first index and the sum of exp(x - max) rescaled when the max grows
 * (online softmax), the second writes dlogits. A thread takes the columns 4 t + 4 k 1024 ..
 * (16-byte loads; rows are Vp = multiple of 8 floats), then the tail past the last multiple of
 * 4, always in increasing column order: ties keep the smallest index, as on the CPU. */
__device__ __forceinline__ void ce_acc(float x, int v, float &mx, float &se, int &am)
{
    if (x > mx) {
        se = se * expf(mx - x) + 1.0f; /* mx = -inf at first: 0 * 0 + 1 */
        mx = x;
        am = v;
    } else {
        se += expf(x - mx);
    }
}

__global__ void __launch_bounds__(1024)
    k_ce(bf16 *dlog, double *row_wce, uint8_t *row_ok, double *ce_row, const float *logits, const int32_t *idx,
         const int32_t *labels, const float *wts, const dev_stats *ds, int c0, int V, int Vp)
{
    __shared__ float shv[32];
    __shared__ int shi[32];
    __shared__ double shd[32];
    int ci = c0 + blockIdx.x;
    if (ci >= ds->n_kept)
        return;
    int row = idx[ci], y = labels[row];
    float w = ce_row ? 1.0f : wts[row]; /* D-PACE (ce_row given): unit weight, scaled later */
    const float *l = logits + (long)blockIdx.x * Vp;
    const int V4 = V / 4;
    float mx = -INFINITY, se = 0.0f;
    int am = 0x7fffffff;
    for (int q = threadIdx.x; q < V4; q += blockDim.x) {
        float4 x = reinterpret_cast<const float4 *>(l)[q];
        ce_acc(x.x, 4 * q, mx, se, am);
        ce_acc(x.y, 4 * q + 1, mx, se, am);
        ce_acc(x.z, 4 * q + 2, mx, se, am);
        ce_acc(x.w, 4 * q + 3, mx, se, am);
    }
    for (int v = 4 * V4 + threadIdx.x; v < V; v += blockDim.x)
        ce_acc(l[v], v, mx, se, am);
    /* block arg-max: larger value wins, ties go to the smaller index (the CPU's first max) */
    const float tmx = mx;
    block_argmax(mx, am, shv, shi);
    double sed = block_sum<double>(tmx == -INFINITY ? 0.0 : (double)se * exp((double)tmx - (double)mx), shd);
    float lse = (float)((double)mx + log(sed));
    float scale = (float)((double)w / ds->norm);
    if (threadIdx.x == 0) {
        row_wce[ci] = (double)w * ((double)lse - (double)l[y]);
        row_ok[ci] = am == y;
        if (ce_row)
            ce_row[row] = (double)lse - (double)l[y];
    }
    if (!dlog) /* forward only (dflash_forward_loss_cuda): no gradient of the logits */
        return;
    bf16 *dl = dlog + (long)blockIdx.x * Vp;
    for (int q = threadIdx.x; q < V4; q += blockDim.x) {
        float4 x = reinterpret_cast<const float4 *>(l)[q];
        float p[4] = {expf(x.x - lse) * scale, expf(x.y - lse) * scale, expf(x.z - lse) * scale,
                      expf(x.w - lse) * scale};
        if (y >= 4 * q && y < 4 * q + 4)
            p[y - 4 * q] -= scale;
        __nv_bfloat162 lo2 = __floats2bfloat162_rn(p[0], p[1]), hi2 = __floats2bfloat162_rn(p[2], p[3]);
        uint2 u;
        u.x = *reinterpret_cast<uint32_t *>(&lo2);
        u.y = *reinterpret_cast<uint32_t *>(&hi2);
        reinterpret_cast<uint2 *>(dl)[q] = u;
    }
    for (int v = 4 * V4 + threadIdx.x; v < V; v += blockDim.x) {
        float p = expf(l[v] - lse) * scale;
        dl[v] = f2bf(v == y ? p - scale : p);
    }
}

/* D-PACE weights, one thread per block j (dflash_dpace_weights' rule): walk k = 1.. while
 * the row is a loss row (wts > 0), s_k = (1 - alpha) exp(-CE_k) + alpha, P_k = s_1 ... s_k;
 * the weight of k is P_k + ... + P_L (L: the last position walked), 0 for every other row. */
__global__ void k_dpace_weights(double *wrow, const double *ce_row, const float *wts, int N, int B, double alpha)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= N)
        return;
    const long r0 = (long)j * B;
    double P[DFLASH_MAX_BLOCK];
    double p = 1.0;
    int L = 0;
    for (int k = 1; k < B && wts[r0 + k] > 0.0f; k++) {
        p *= (1.0 - alpha) * exp(-ce_row[r0 + k]) + alpha;
        P[k] = p;
        L = k;
    }
    double tail = 0;
    for (int k = B - 1; k >= 0; k--) {
        if (k >= 1 && k <= L)
            tail += P[k];
        wrow[r0 + k] = k >= 1 && k <= L ? tail : 0.0;
    }
}

/* D-PACE: dz rows of the loss rows scaled by their weight; row_wce (unit-weight CE) becomes
 * the weighted CE, by the thread of each row's first element */
__global__ void k_dpace_scale(float *dz, double *row_wce, const double *wrow, const int32_t *idx, const dev_stats *ds,
                              int rows_max, int d)
{
    long n = (long)rows_max * d;
    int kept = ds->n_kept;
    for (long e = blockIdx.x * (long)blockDim.x + threadIdx.x; e < n; e += (long)gridDim.x * blockDim.x) {
        long ci = e / d;
        if (ci >= kept)
            continue;
        long row = idx[ci];
        double w = wrow[row];
        if (dz) { /* NULL: forward only (the validator), no gradient to scale */
            float *p = dz + row * d + e % d;
            *p = (float)((double)*p * w);
        }
        if (e % d == 0)
            row_wce[ci] *= w;
    }
}

__global__ void k_scatter_dz(float *dz, const float *dzc, const int32_t *idx, const dev_stats *ds, int c0, int m, int d)
{
    long n = (long)m * d;
    int kept = ds->n_kept;
    for (long e = blockIdx.x * (long)blockDim.x + threadIdx.x; e < n; e += (long)gridDim.x * blockDim.x) {
        long ci = c0 + e / d;
        if (ci < kept)
            dz[(long)idx[ci] * d + e % d] = dzc[e];
    }
}

__global__ void __launch_bounds__(1024) k_stats(dev_stats *ds, const double *row_wce, const uint8_t *row_ok,
                                                const int32_t *idx, const float *wts, const double *wrow, int B)
{
    __shared__ int cnt[DFLASH_MAX_BLOCK], ok[DFLASH_MAX_BLOCK];
    __shared__ double shd[32];
    int tid = threadIdx.x, kept = ds->n_kept;
    if (tid < DFLASH_MAX_BLOCK)
        cnt[tid] = ok[tid] = 0;
    __syncthreads();
    double s = 0;
    for (int ci = tid; ci < kept; ci += blockDim.x) {
        s += row_wce[ci];
        int k = idx[ci] % B;
        atomicAdd(&cnt[k], 1); /* integer counts: order-independent */
        atomicAdd(&ok[k], (int)row_ok[ci]);
    }
    double tot = block_sum<double>(s, shd);
    __syncthreads();
    if (tid == 0)
        ds->wce = tot;
    if (tid < DFLASH_MAX_BLOCK) {
        ds->count[tid] = cnt[tid];
        ds->correct[tid] = ok[tid];
        ds->wpos[tid] = 0;
    }
    /* per position, the loss weight its rows carried (decay wts, D-PACE wrow): one fixed-order
     * block sum per position */
    for (int k = 1; k < B; k++) {
        double wk = 0;
        for (int ci = tid; ci < kept; ci += blockDim.x) {
            int row = idx[ci];
            if (row % B == k)
                wk += wrow ? wrow[row] : (double)wts[row];
        }
        double t = block_sum<double>(wk, shd);
        if (tid == 0)
            ds->wpos[k] = t;
    }
}

/* ---- init / memory -------------------------------------------------------------------------- */

static size_t carve(dflash_ctx_cuda *x, char *base)
{
    size_t off = 0;
#define TAKE(ptr, type, count)                                        \
    do {                                                              \
        if (base)                                                     \
            (ptr) = (type *)(base + off);                             \
        off += ((size_t)(count) * sizeof(type) + 255) & ~(size_t)255; \
    } while (0)
/* a buffer only the backward pass, the loss gradient or the optimizer uses: none (NULL) in a
 * forward-only context */
#define TAKE_BW(ptr, type, count)   \
    do {                            \
        if (x->fwd_only)            \
            (ptr) = NULL;           \
        else                        \
            TAKE(ptr, type, count); \
    } while (0)
    long d = x->d, R = x->max_R, S = x->max_S, T = x->max_T, I = x->I, CH = x->CH;
    long HR = (long)x->H * R;
    long rows_cap = (long)x->max_N * (x->B - 1);
    TAKE(x->P, float, x->np);
    TAKE_BW(x->Gr, float, x->np);
    TAKE_BW(x->Mm, float, x->np);
    TAKE_BW(x->Vm, float, x->np);
    TAKE(x->Wb, bf16, x->np);
    TAKE(x->tens, tensor_ent, x->ntensor);
    TAKE(x->inv_freq, float, x->hd / 2);
    TAKE(x->pos, int32_t, T);
    TAKE(x->labels, int32_t, R);
    TAKE(x->idx, int32_t, R);
    TAKE(x->wts, float, R);
    TAKE(x->ds, dev_stats, 1);
    TAKE(x->Hb, bf16, S * x->nc * d);
    TAKE(x->ctxb, bf16, S * d);
    TAKE(x->fc_out, float, S *d);
    for (int l = 0; l < x->L; l++) {
        layer_buf *b = &x->lb[l];
        TAKE(b->h_in, float, R *d);
        TAKE(b->h_mid, float, R *d);
        TAKE(b->lse, float, HR);
        TAKE(b->a, bf16, R * d);
        TAKE(b->qkv, bf16, R * x->qkvd);
        TAKE(b->kvc, bf16, S * 2 * x->kvd);
        TAKE(b->Qh, bf16, R * x->qd);
        TAKE(b->Kh, bf16, T * x->kvd);
        TAKE(b->Vh, bf16, T * x->kvd);
        TAKE(b->att, bf16, R * x->qd);
        TAKE(b->n, bf16, R * d);
        TAKE(b->gu, bf16, R * 2 * I);
        TAKE(b->act, bf16, R * I);
    }
    TAKE(x->h_out, float, R *d);
    TAKE(x->z, bf16, R * d);
    TAKE(x->aws.base, char, dflash_attn_ws_bytes_cuda(x->attn_scheme, x->max_S, x->max_N, x->B, x->H, x->KV, x->hd));
    TAKE(x->ahi, int32_t, x->max_N);
    TAKE(x->alo, int32_t, x->max_N);
    TAKE(x->ekeep, uint8_t, x->max_N);
    TAKE_BW(x->dQh, float, HR * x->hd);
    TAKE_BW(x->dKh, float, T * x->kvd);
    TAKE_BW(x->dVh, float, T * x->kvd);
    TAKE(x->zc, bf16, (rows_cap > 0 ? rows_cap : 1) * d);
    TAKE(x->logits, float, CH * x->Vp);
    TAKE_BW(x->dlog, bf16, CH * x->Vp);
    TAKE_BW(x->dzc, float, CH *d);
    TAKE_BW(x->dz, float, R *d);
    TAKE(x->row_wce, double, R);
    TAKE(x->row_ok, uint8_t, R);
    TAKE(x->ce_row, double, R);
    TAKE(x->wrow, double, R);
    TAKE_BW(x->dh, float, R *d);
    TAKE_BW(x->dh2, float, R *d);
    TAKE_BW(x->dn, float, R *d);
    TAKE_BW(x->da, float, R *d);
    TAKE_BW(x->dctx, float, S *d);
    TAKE_BW(x->dfc, float, S *d);
    long contrib = DF_MAX(R * d, S * d);
    contrib = DF_MAX(contrib, R * x->qd + T * x->kvd);
    TAKE_BW(x->contrib, float, contrib);
    long maxrows = DF_MAX(DF_MAX(R, S), DF_MAX(HR, T * x->KV));
    TAKE_BW(x->partial, float, ((maxrows + COL_CHUNK - 1) / COL_CHUNK + 1) * DF_MAX(d, x->hd));
    TAKE_BW(x->dhb, bf16, R * d);
    TAKE_BW(x->dh2b, bf16, R * d);
    TAKE_BW(x->dact, bf16, R * I);
    TAKE_BW(x->dgu, bf16, R * 2 * I);
    TAKE_BW(x->datt, bf16, R * x->qd);
    TAKE_BW(x->dqkv, bf16, R * x->qkvd);
    TAKE_BW(x->dkvc, bf16, S * 2 * x->kvd);
    TAKE_BW(x->dfcb, bf16, S * d);
    TAKE_BW(x->norm_part, double, NPART);
    TAKE_BW(x->os, opt_state, 1);
#undef TAKE_BW
#undef TAKE
    return off;
}

static void timing_destroy(dflash_ctx_cuda *x)
{
    if (!x->timing)
        return;
    for (int i = 0; i < 6; i++)
        cudaEventDestroy(x->ev_ph[i]);
    for (int i = 0; i < 4 * x->L; i++)
        cudaEventDestroy(x->ev_at[i]);
    x->timing = 0;
}

void dflash_free_cuda(dflash_ctx_cuda *x)
{
    if (!x)
        return;
    timing_destroy(x);
    if (x->arena)
        cudaFree(x->arena);
    nn_gemm_destroy_cuda(x->gemm);
    if (x->st)
        cudaStreamDestroy(x->st);
    free(x);
}

/* Both kinds of context: opt NULL = forward only (no gradients, AdamW state or backward
 * buffers in the arena). */
static int init_ctx(dflash_ctx_cuda **out, const char *fn, const dflash_config *c, const adamw_config *opt,
                    const dflash_bf16_cuda *embed, const dflash_bf16_cuda *lm_head, int max_S, int max_N,
                    int chunk_rows, char *err, size_t errlen)
{
    *out = NULL;
    char verr[256];
    if (dflash_config_validate(c, verr, sizeof verr) < 0)
        return df_err(err, errlen, -EINVAL, "%s: bad config: %s", fn, verr);
    if (c->hidden % 8 || c->head_dim % 8 || c->intermediate % 8 || c->head_dim > 256 || c->block_size > 64 ||
        c->n_heads % c->n_kv_heads || max_S < 1 || max_N < 1 || !embed || !lm_head)
        return df_err(err, errlen, -EINVAL,
                      "%s: unsupported shape: need hidden, head_dim, intermediate multiples of 8, head_dim <= 256, "
                      "block_size <= 64, n_heads %% n_kv_heads == 0, max_S, max_N >= 1, embed/lm_head non-NULL "
                      "(got d=%d hd=%d I=%d B=%d H=%d KV=%d max_S=%d max_N=%d)",
                      fn, c->hidden, c->head_dim, c->intermediate, c->block_size, c->n_heads, c->n_kv_heads, max_S,
                      max_N);
    dflash_ctx_cuda *x = (dflash_ctx_cuda *)calloc(1, sizeof *x);
    if (!x)
        return df_err(err, errlen, -ENOMEM, "%s: out of host memory", fn);
    x->c = *c;
    x->fwd_only = opt == NULL;
    if (opt) {
        x->opt = *opt;
        x->warm = (long)ceil(opt->warmup_frac * (double)opt->total_steps);
    }
    x->d = c->hidden, x->H = c->n_heads, x->KV = c->n_kv_heads, x->hd = c->head_dim, x->G = x->H / x->KV;
    x->I = c->intermediate, x->V = c->vocab, x->Vp = (c->vocab + 7) / 8 * 8, x->B = c->block_size, x->nc = c->n_capture,
    x->L = c->n_layers;
    x->qd = x->H * x->hd, x->kvd = x->KV * x->hd, x->qkvd = x->qd + 2 * x->kvd;
    x->eps = (float)c->rms_norm_eps;
    x->scale = 1.0f / sqrtf((float)x->hd);
    x->max_S = max_S, x->max_N = max_N, x->max_R = max_N * c->block_size, x->max_T = max_S + x->max_R;
    x->CH = chunk_rows > 0 ? chunk_rows : 1024;
    x->np = dflash_config_param_count(c);
    x->ntensor = dflash_tensor_count(c);
    x->embed = (const bf16 *)embed;
    x->head = (const bf16 *)lm_head;
    tensor_ent *th = (tensor_ent *)calloc((size_t)x->ntensor, sizeof *th);
    if (!th) {
        free(x);
        return df_err(err, errlen, -ENOMEM, "%s: out of host memory", fn);
    }
    for (int i = 0; i < x->ntensor; i++) {
        dflash_tensor t;
        dflash_tensor_info(c, i, &t);
        th[i].off = (long long)t.offset, th[i].len = (long long)t.numel, th[i].is_norm = t.is_norm;
        if (i == 0)
            x->off_fc = t.offset;
        else if (i == 1)
            x->off_hn = t.offset;
        else if (i == x->ntensor - 1)
            x->off_fn = t.offset;
        else
            x->off[(i - 2) / PER_LAYER][(i - 2) % PER_LAYER] = t.offset;
        if (t.offset % 8) {
            free(th);
            free(x);
            return df_err(err, errlen, -EINVAL, "%s: tensor %s at offset %zu is not 16-byte aligned in bf16", fn,
                          t.name, t.offset);
        }
    }
    int rc = 0;
    float *inv = (float *)malloc(sizeof(float) * (size_t)(x->hd / 2));
    if (!inv) {
        free(th);
        free(x);
        return df_err(err, errlen, -ENOMEM, "%s: out of host memory", fn);
    }
    nn_rope_inv_freq(inv, x->hd, c->rope_theta, &c->rope_scaling); /* as dflash_acts_ensure */
    /* a blocking stream: ordered after the caller's legacy-stream uploads (cudaMemcpy) */
    CUDA_TRY_GOTO(cudaStreamCreateWithFlags(&x->st, cudaStreamDefault), err, errlen, rc, fail);
    CUDA_TRY_RC_GOTO(nn_gemm_create_cuda(&x->gemm, 64u << 20, err, errlen), rc, fail);
    x->attn_scheme = dflash_attn_scheme_cuda(x->hd, err, errlen);
    if (x->attn_scheme < 0) {
        rc = x->attn_scheme;
        goto fail;
    }
    x->arena_bytes = carve(x, NULL);
    if (cudaMalloc(&x->arena, x->arena_bytes) != cudaSuccess) {
        cudaGetLastError();
        x->arena = NULL;
        rc = df_err(err, errlen, -ENOMEM, "%s: cudaMalloc of %.2f GiB for max_S=%d max_N=%d failed", fn,
                    (double)x->arena_bytes / (1u << 30), max_S, max_N);
        goto fail;
    }
    carve(x, (char *)x->arena);
    x->aws.scheme = x->attn_scheme, x->aws.max_S = max_S, x->aws.max_N = max_N, x->aws.B = x->B;
    x->aws.H = x->H, x->aws.KV = x->KV, x->aws.hd = x->hd, x->aws.gemm = x->gemm;
    CUDA_TRY_GOTO(cudaMemsetAsync(x->arena, 0, x->arena_bytes, x->st), err, errlen, rc, fail);
    CUDA_TRY_GOTO(cudaMemcpyAsync(x->tens, th, sizeof(tensor_ent) * (size_t)x->ntensor, cudaMemcpyHostToDevice, x->st),
                  err, errlen, rc, fail);
    CUDA_TRY_GOTO(cudaMemcpyAsync(x->inv_freq, inv, sizeof(float) * (size_t)(x->hd / 2), cudaMemcpyHostToDevice, x->st),
                  err, errlen, rc, fail);
    CUDA_TRY_GOTO(cudaStreamSynchronize(x->st), err, errlen, rc, fail);
    free(th);
    free(inv);
    *out = x;
    return 0;
fail:
    free(th);
    free(inv);
    dflash_free_cuda(x);
    return rc;
}

int dflash_init_cuda(dflash_ctx_cuda **out, const dflash_config *c, const adamw_config *opt,
                     const dflash_bf16_cuda *embed, const dflash_bf16_cuda *lm_head, int max_S, int max_N,
                     int chunk_rows, char *err, size_t errlen)
{
    if (!opt) {
        *out = NULL;
        return df_err(err, errlen, -EINVAL, "dflash_init_cuda: no optimizer settings (opt is NULL)");
    }
    return init_ctx(out, "dflash_init_cuda", c, opt, embed, lm_head, max_S, max_N, chunk_rows, err, errlen);
}

int dflash_init_forward_cuda(dflash_ctx_cuda **out, const dflash_config *c, const dflash_bf16_cuda *embed,
                             const dflash_bf16_cuda *lm_head, int max_S, int max_N, int chunk_rows, char *err,
                             size_t errlen)
{
    return init_ctx(out, "dflash_init_forward_cuda", c, NULL, embed, lm_head, max_S, max_N, chunk_rows, err, errlen);
}

int dflash_is_forward_only_cuda(const dflash_ctx_cuda *x)
{
    return x->fwd_only;
}

/* The entries that need gradients or AdamW state refuse a forward-only context. */
#define NEED_TRAINING(x, fn)                                                          \
    do {                                                                              \
        if ((x)->fwd_only)                                                            \
            return df_err(err, errlen, -EINVAL,                                       \
                          "%s: a forward-only context has no gradients or optimizer " \
                          "state (dflash_init_forward_cuda)",                         \
                          fn);                                                        \
    } while (0)

/* ---- host <-> device -------------------------------------------------------------------------- */

static int refresh_mirror(dflash_ctx_cuda *x, char *err, size_t errlen)
{
    k_f32_to_bf16<<<1024, 256, 0, x->st>>>(x->Wb, x->P, (long)x->np);
    CUDA_LAUNCHED("k_f32_to_bf16", err, errlen);
    return 0;
}

static int copy_sync(dflash_ctx_cuda *x, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, char *err,
                     size_t errlen)
{
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, x->st), err, errlen);
    CUDA_TRY(cudaStreamSynchronize(x->st), err, errlen);
    return 0;
}

int dflash_params_from_host_cuda(dflash_ctx_cuda *x, const float *p, char *err, size_t errlen)
{
    CUDA_TRY_RC(copy_sync(x, x->P, p, sizeof(float) * x->np, cudaMemcpyHostToDevice, err, errlen));
    CUDA_TRY_RC(refresh_mirror(x, err, errlen));
    CUDA_TRY(cudaStreamSynchronize(x->st), err, errlen);
    return 0;
}
int dflash_params_to_host_cuda(dflash_ctx_cuda *x, float *p, char *err, size_t errlen)
{
    return copy_sync(x, p, x->P, sizeof(float) * x->np, cudaMemcpyDeviceToHost, err, errlen);
}
int dflash_grads_to_host_cuda(dflash_ctx_cuda *x, float *g, char *err, size_t errlen)
{
    NEED_TRAINING(x, "dflash_grads_to_host_cuda");
    return copy_sync(x, g, x->Gr, sizeof(float) * x->np, cudaMemcpyDeviceToHost, err, errlen);
}
int dflash_grads_from_host_cuda(dflash_ctx_cuda *x, const float *g, char *err, size_t errlen)
{
    NEED_TRAINING(x, "dflash_grads_from_host_cuda");
    return copy_sync(x, x->Gr, g, sizeof(float) * x->np, cudaMemcpyHostToDevice, err, errlen);
}
float *dflash_grads_device_cuda(dflash_ctx_cuda *x)
{
    return x->Gr;
}

int dflash_zero_grads_cuda(dflash_ctx_cuda *x, char *err, size_t errlen)
{
    NEED_TRAINING(x, "dflash_zero_grads_cuda");
    CUDA_TRY(cudaMemsetAsync(x->Gr, 0, sizeof(float) * x->np, x->st), err, errlen);
    return 0;
}

int dflash_opt_to_host_cuda(dflash_ctx_cuda *x, float *m, float *v, long *step, char *err, size_t errlen)
{
    NEED_TRAINING(x, "dflash_opt_to_host_cuda");
    opt_state os;
    CUDA_TRY_RC(copy_sync(x, m, x->Mm, sizeof(float) * x->np, cudaMemcpyDeviceToHost, err, errlen));
    CUDA_TRY_RC(copy_sync(x, v, x->Vm, sizeof(float) * x->np, cudaMemcpyDeviceToHost, err, errlen));
    CUDA_TRY_RC(copy_sync(x, &os, x->os, sizeof os, cudaMemcpyDeviceToHost, err, errlen));
    *step = (long)os.step;
    return 0;
}

int dflash_opt_from_host_cuda(dflash_ctx_cuda *x, const float *m, const float *v, long step, char *err, size_t errlen)
{
    NEED_TRAINING(x, "dflash_opt_from_host_cuda");
    opt_state os;
    memset(&os, 0, sizeof os);
    os.step = step;
    if (m)
        CUDA_TRY_RC(copy_sync(x, x->Mm, m, sizeof(float) * x->np, cudaMemcpyHostToDevice, err, errlen));
    else
        CUDA_TRY(cudaMemsetAsync(x->Mm, 0, sizeof(float) * x->np, x->st), err, errlen);
    if (v)
        CUDA_TRY_RC(copy_sync(x, x->Vm, v, sizeof(float) * x->np, cudaMemcpyHostToDevice, err, errlen));
    else
        CUDA_TRY(cudaMemsetAsync(x->Vm, 0, sizeof(float) * x->np, x->st), err, errlen);
    return copy_sync(x, x->os, &os, sizeof os, cudaMemcpyHostToDevice, err, errlen);
}

int dflash_params_init_device_cuda(dflash_ctx_cuda *x, uint64_t seed, float std, char *err, size_t errlen)
{
    NEED_TRAINING(x, "dflash_params_init_device_cuda");
    dim3 grid(256, (unsigned)x->ntensor);
    k_params_init<<<grid, 256, 0, x->st>>>(x->P, x->Wb, x->tens, seed, std * sqrtf(3.0f));
    CUDA_LAUNCHED("k_params_init", err, errlen);
    CUDA_TRY_RC(dflash_opt_from_host_cuda(x, NULL, NULL, 0, err, errlen));
    CUDA_TRY_RC(dflash_zero_grads_cuda(x, err, errlen));
    CUDA_TRY(cudaStreamSynchronize(x->st), err, errlen);
    return 0;
}

int dflash_debug_att_cuda(dflash_ctx_cuda *x, int layer, float *out, char *err, size_t errlen)
{
    if (layer < 0 || layer >= x->L || !x->last_N)
        return df_err(err, errlen, -EINVAL, "dflash_debug_att_cuda: layer %d of %d, or no step yet", layer, x->L);
    long n = (long)x->last_N * x->B * x->qd;
    uint16_t *h = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)n);
    if (!h)
        return df_err(err, errlen, -ENOMEM, "dflash_debug_att_cuda: out of host memory");
    int rc = copy_sync(x, h, x->lb[layer].att, sizeof(uint16_t) * (size_t)n, cudaMemcpyDeviceToHost, err, errlen);
    for (long i = 0; rc == 0 && i < n; i++)
        out[i] = safetensors_bf16_to_f32(h[i]);
    free(h);
    return rc;
}

int dflash_debug_z_cuda(dflash_ctx_cuda *x, float *out, char *err, size_t errlen)
{
    if (!x->last_N)
        return df_err(err, errlen, -EINVAL, "dflash_debug_z_cuda: no step yet");
    long n = (long)x->last_N * x->B * x->d;
    uint16_t *h = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)n);
    if (!h)
        return df_err(err, errlen, -ENOMEM, "dflash_debug_z_cuda: out of host memory");
    int rc = copy_sync(x, h, x->z, sizeof(uint16_t) * (size_t)n, cudaMemcpyDeviceToHost, err, errlen);
    for (long i = 0; rc == 0 && i < n; i++)
        out[i] = safetensors_bf16_to_f32(h[i]);
    free(h);
    return rc;
}

int dflash_timing_enable_cuda(dflash_ctx_cuda *x, int on, char *err, size_t errlen)
{
    if (!on) {
        timing_destroy(x);
        return 0;
    }
    if (x->timing)
        return 0;
    for (int i = 0; i < 6; i++)
        CUDA_TRY(cudaEventCreate(&x->ev_ph[i]), err, errlen);
    for (int i = 0; i < 4 * x->L; i++)
        CUDA_TRY(cudaEventCreate(&x->ev_at[i]), err, errlen);
    x->timing = 1;
    return 0;
}

static float ev_ms(cudaEvent_t a, cudaEvent_t b)
{
    float ms = 0;
    if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return ms;
}

int dflash_timing_read_cuda(dflash_ctx_cuda *x, dflash_timing_cuda *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    if (!x->timing)
        return df_err(err, errlen, -EINVAL, "dflash_timing_read_cuda: timing not enabled");
    CUDA_TRY(cudaStreamSynchronize(x->st), err, errlen);
    t->fwd_ms = ev_ms(x->ev_ph[0], x->ev_ph[1]);
    t->loss_ms = ev_ms(x->ev_ph[1], x->ev_ph[2]);
    t->bwd_ms = ev_ms(x->ev_ph[2], x->ev_ph[3]);
    t->opt_ms = ev_ms(x->ev_ph[4], x->ev_ph[5]);
    for (int l = 0; l < x->L; l++) {
        t->attn_fwd_ms += ev_ms(x->ev_at[4 * l], x->ev_at[4 * l + 1]);
        t->attn_bwd_ms += ev_ms(x->ev_at[4 * l + 2], x->ev_at[4 * l + 3]);
    }
    return 0;
}

/* A phase boundary for dflash_timing_read_cuda (nothing when timing is off). */
static int mark(dflash_ctx_cuda *x, cudaEvent_t ev, char *err, size_t errlen)
{
    if (x->timing)
        CUDA_TRY(cudaEventRecord(ev, x->st), err, errlen);
    return 0;
}

/* ---- the step --------------------------------------------------------------------------------- */

static int mm(dflash_ctx_cuda *x, int ta, int tb, int M, int N, int K, const void *A, long lda, const void *B, long ldb,
              void *D, long ldd, int dt, float alpha, float beta, const void *C, char *err, size_t errlen)
{
    nn_gemm_args_cuda p;
    memset(&p, 0, sizeof p);
    p.ta = ta, p.tb = tb, p.M = M, p.N = N, p.K = K, p.A = A, p.lda = lda, p.B = B, p.ldb = ldb, p.D = D;
    p.ldd = ldd, p.d_type = dt, p.alpha = alpha, p.beta = beta, p.C = C, p.batch = 1, p.align_hint = 1;
    return nn_gemm_run_cuda(x->gemm, &p, x->st, err, errlen);
}

/* Y[M, N] (+= C) = X[M, K] W[N, K]^T */
static int lin_fwd(dflash_ctx_cuda *x, void *Y, int dt, const bf16 *X, const bf16 *W, int M, int K, int N,
                   const float *C, char *err, size_t errlen)
{
    return mm(x, 0, 1, M, N, K, X, K, W, K, Y, N, dt, 1.0f, C ? 1.0f : 0.0f, C, err, errlen);
}
/* dX[M, K] (= or +=) dY[M, N] W[N, K] */
static int lin_dx(dflash_ctx_cuda *x, void *dX, int dt, const bf16 *dY, const bf16 *W, int M, int K, int N, float beta,
                  char *err, size_t errlen)
{
    return mm(x, 0, 0, M, K, N, dY, N, W, K, dX, K, dt, 1.0f, beta, NULL, err, errlen);
}
/* dW[N, K] += dY[M, N]^T X[M, K] (fp32) */
static int lin_dw(dflash_ctx_cuda *x, float *dW, const bf16 *dY, const bf16 *X, int M, int K, int N, char *err,
                  size_t errlen)
{
    return mm(x, 1, 0, N, K, M, dY, N, X, K, dW, K, NN_GEMM_F32, 1.0f, 1.0f, NULL, err, errlen);
}

static int grid_for(long n)
{
    return (int)DF_MIN((n + 255) / 256, 4096L);
}

static int colsum(dflash_ctx_cuda *x, float *out, const float *X, long rows, int C, char *err, size_t errlen)
{
    int nch = cdiv(rows, COL_CHUNK);
    dim3 g1(cdiv(C, 128), nch);
    k_colsum_partial<<<g1, 128, 0, x->st>>>(x->partial, X, rows, C);
    CUDA_LAUNCHED("k_colsum_partial", err, errlen);
    k_colsum_final<<<cdiv(C, 128), 128, 0, x->st>>>(out, x->partial, nch, C);
    CUDA_LAUNCHED("k_colsum_final", err, errlen);
    return 0;
}

static int rms_bwd(dflash_ctx_cuda *x, float *dx, bf16 *dxb, float *dw_grad, const float *resid, const float *dout,
                   const float *xin, const float *w, int rows, int C, char *err, size_t errlen)
{
    k_rmsnorm_bwd<<<rows, 256, 0, x->st>>>(dx, dxb, x->contrib, resid, dout, xin, w, C, x->eps);
    CUDA_LAUNCHED("k_rmsnorm_bwd", err, errlen);
    return colsum(x, dw_grad, x->contrib, rows, C, err, errlen);
}

/* The step: forward, loss and, when backward, the loss gradient and the backward pass (fn
 * names the public entry in messages). The forward and the statistics are the same kernels in
 * the same order either way, so a forward-only call gives the training step's loss bits. */
static int run_step(dflash_ctx_cuda *x, const char *fn, const dflash_batch_cuda *b, double norm, int backward,
                    dflash_stats *st, char *err, size_t errlen)
{
    int S = b->S, N = b->N, B = x->B, R = N * B, T = S + R, d = x->d, I = x->I;
    if (S < 1 || S > x->max_S || N < 1 || N > x->max_N || !b->H || !b->x || !b->loss_mask || !b->anchors || !b->keep)
        return df_err(err, errlen, -EINVAL, "%s: S=%d (max %d), N=%d (max %d) or a NULL pointer", fn, S, x->max_S, N,
                      x->max_N);
    doc_table D;
    memset(&D, 0, sizeof D);
    int rows_max = 0;
    if (b->n_docs <= 1) {
        int n_real = b->n_real >= 0 ? DF_MIN(b->n_real, N) : N;
        D.n = 1, D.stride = N, D.start[0] = 0, D.start[1] = S, D.slot0[0] = 0, D.slot0[1] = N;
        rows_max = n_real * (B - 1);
    } else {
        if (b->n_docs > DFLASH_MAX_DOCS_CUDA || b->doc_slots < 1 || !b->doc_starts)
            return df_err(err, errlen, -EINVAL, "%s: %d documents (max %d), doc_slots %d (>= 1) or no doc_starts", fn,
                          b->n_docs, DFLASH_MAX_DOCS_CUDA, b->doc_slots);
        D.n = b->n_docs, D.stride = b->doc_slots;
        for (int k = 0; k <= D.n; k++) {
            D.start[k] = b->doc_starts[k];
            if ((k == 0 && D.start[0] != 0) || (k == D.n && D.start[k] != S) || (k > 0 && D.start[k] < D.start[k - 1]))
                return df_err(err, errlen, -EINVAL, "%s: doc_starts[%d] = %d: must rise from 0 to S = %d", fn, k,
                              D.start[k], S);
        }
        D.slot0[0] = 0;
        for (int k = 0; k < D.n; k++) {
            int used = b->doc_n_real ? b->doc_n_real[k] : -1;
            used = used >= 0 ? DF_MIN(used, D.stride) : D.stride;
            if (D.start[k + 1] == D.start[k])
                used = 0;
            D.slot0[k + 1] = D.slot0[k] + used;
            rows_max += used * (B - 1);
        }
        if (D.slot0[D.n] > N)
            return df_err(err, errlen, -EINVAL, "%s: the documents use %d anchor slots, N = %d", fn, D.slot0[D.n], N);
    }
    cudaStream_t s = x->st;
    x->last_S = S, x->last_N = N;
    dflash_attn_cuda A;
    A.S = S, A.N = N, A.B = B, A.H = x->H, A.KV = x->KV, A.hd = x->hd, A.window = 0, A.scale = x->scale;
    A.hi = x->ahi, A.lo = x->alo, A.keep = x->ekeep;

    CUDA_TRY_RC(mark(x, x->ev_ph[0], err, errlen));
    /* batch: labels, weights, positions, loss rows */
    const int dpace = x->c.loss == DFLASH_LOSS_DPACE;
    k_batch_prep<<<1, 1024, 0, s>>>(x->labels, x->wts, x->pos, x->idx, x->ahi, x->alo, x->ekeep, x->ds, b->x,
                                    b->loss_mask, b->anchors, b->keep, D, S, N, B, x->V, x->c.gamma, norm, rows_max,
                                    dpace);
    CUDA_LAUNCHED("k_batch_prep", err, errlen);
    const bf16 *Hb = (const bf16 *)b->H;
    if (!b->H_bf16) {
        k_f32_to_bf16<<<grid_for((long)S * x->nc * d), 256, 0, s>>>(x->Hb, (const float *)b->H, (long)S * x->nc * d);
        CUDA_LAUNCHED("k_f32_to_bf16(H)", err, errlen);
        Hb = x->Hb;
    }
    /* context: C = RMSNorm_hidden(H fc^T) */
    CUDA_TRY_RC(lin_fwd(x, x->fc_out, NN_GEMM_F32, Hb, x->Wb + x->off_fc, S, x->nc * d, d, NULL, err, errlen));
    k_rmsnorm_fwd<<<S, 256, 0, s>>>(x->ctxb, x->fc_out, x->P + x->off_hn, d, x->eps);
    CUDA_LAUNCHED("k_rmsnorm_fwd(hidden)", err, errlen);
    k_embed_h0<<<grid_for((long)R * d), 256, 0, s>>>(x->lb[0].h_in, x->embed, b->x, x->ahi, R, B, d, S, x->V,
                                                     x->c.mask_token_id);
    CUDA_LAUNCHED("k_embed_h0", err, errlen);

    for (int l = 0; l < x->L; l++) {
        layer_buf *lb = &x->lb[l];
        const size_t *o = x->off[l];
        A.window = x->c.layer_sliding[l] ? x->c.sliding_window : 0;
        k_rmsnorm_fwd<<<R, 256, 0, s>>>(lb->a, lb->h_in, x->P + o[T_IN], d, x->eps);
        CUDA_LAUNCHED("k_rmsnorm_fwd(input)", err, errlen);
        CUDA_TRY_RC(lin_fwd(x, lb->qkv, NN_GEMM_BF16, lb->a, x->Wb + o[T_Q], R, d, x->qkvd, NULL, err, errlen));
        CUDA_TRY_RC(lin_fwd(x, lb->kvc, NN_GEMM_BF16, x->ctxb, x->Wb + o[T_K], S, d, 2 * x->kvd, NULL, err, errlen));
        long units = (long)R * x->H + (long)T * x->KV;
        k_qk_fwd<<<cdiv(units, 8), 256, 0, s>>>(lb->Qh, lb->Kh, lb->Vh, lb->qkv, lb->kvc, x->P + o[T_QN],
                                                x->P + o[T_KN], x->inv_freq, x->pos, S, R, x->H, x->KV, x->hd, x->eps);
        CUDA_LAUNCHED("k_qk_fwd", err, errlen);
        CUDA_TRY_RC(mark(x, x->ev_at[4 * l], err, errlen));
        CUDA_TRY_RC(dflash_attn_fwd_cuda(&x->aws, &A, (const nn_bf16_cuda *)lb->Qh, (const nn_bf16_cuda *)lb->Kh,
                                         (const nn_bf16_cuda *)lb->Vh, (nn_bf16_cuda *)lb->att, lb->lse, s, err,
                                         errlen));
        CUDA_TRY_RC(mark(x, x->ev_at[4 * l + 1], err, errlen));
        CUDA_TRY_RC(lin_fwd(x, lb->h_mid, NN_GEMM_F32, lb->att, x->Wb + o[T_O], R, x->qd, d, lb->h_in, err, errlen));
        k_rmsnorm_fwd<<<R, 256, 0, s>>>(lb->n, lb->h_mid, x->P + o[T_POST], d, x->eps);
        CUDA_LAUNCHED("k_rmsnorm_fwd(post)", err, errlen);
        CUDA_TRY_RC(lin_fwd(x, lb->gu, NN_GEMM_BF16, lb->n, x->Wb + o[T_GATE], R, d, 2 * I, NULL, err, errlen));
        k_swiglu_fwd<<<grid_for((long)R * I), 256, 0, s>>>(lb->act, lb->gu, I, (long)R * I);
        CUDA_LAUNCHED("k_swiglu_fwd", err, errlen);
        float *h_next = l + 1 < x->L ? x->lb[l + 1].h_in : x->h_out;
        CUDA_TRY_RC(lin_fwd(x, h_next, NN_GEMM_F32, lb->act, x->Wb + o[T_DOWN], R, I, d, lb->h_mid, err, errlen));
    }
    k_rmsnorm_fwd<<<R, 256, 0, s>>>(x->z, x->h_out, x->P + x->off_fn, d, x->eps);
    CUDA_LAUNCHED("k_rmsnorm_fwd(final)", err, errlen);
    CUDA_TRY_RC(mark(x, x->ev_ph[1], err, errlen));

    /* loss over the compacted rows, chunk by chunk */
    if (backward)
        CUDA_TRY(cudaMemsetAsync(x->dz, 0, sizeof(float) * (size_t)R * d, s), err, errlen);
    if (rows_max > 0) {
        k_gather_z<<<grid_for((long)rows_max * d), 256, 0, s>>>(x->zc, x->z, x->idx, x->ds, rows_max, d);
        CUDA_LAUNCHED("k_gather_z", err, errlen);
    }
    for (int c0 = 0; c0 < rows_max; c0 += x->CH) {
        int m = DF_MIN(x->CH, rows_max - c0);
        CUDA_TRY_RC(mm(x, 0, 1, m, x->V, d, x->zc + (long)c0 * d, d, x->head, d, x->logits, x->Vp, NN_GEMM_F32, 1.0f,
                       0.0f, NULL, err, errlen));
        k_ce<<<m, 1024, 0, s>>>(backward ? x->dlog : NULL, x->row_wce, x->row_ok, dpace ? x->ce_row : NULL, x->logits,
                                x->idx, x->labels, x->wts, x->ds, c0, x->V, x->Vp);
        CUDA_LAUNCHED("k_ce", err, errlen);
        if (!backward)
            continue;
        CUDA_TRY_RC(
            mm(x, 0, 0, m, d, x->V, x->dlog, x->Vp, x->head, d, x->dzc, d, NN_GEMM_F32, 1.0f, 0.0f, NULL, err, errlen));
        k_scatter_dz<<<grid_for((long)m * d), 256, 0, s>>>(x->dz, x->dzc, x->idx, x->ds, c0, m, d);
        CUDA_LAUNCHED("k_scatter_dz", err, errlen);
    }
    if (dpace && rows_max > 0) { /* every row's CE is known: the weights, then dz and wce scaled */
        k_dpace_weights<<<cdiv(N, 128), 128, 0, s>>>(x->wrow, x->ce_row, x->wts, N, B, x->c.dpace_alpha);
        CUDA_LAUNCHED("k_dpace_weights", err, errlen);
        k_dpace_scale<<<grid_for((long)rows_max * d), 256, 0, s>>>(x->dz, x->row_wce, x->wrow, x->idx, x->ds, rows_max,
                                                                   d);
        CUDA_LAUNCHED("k_dpace_scale", err, errlen);
    }
    k_stats<<<1, 1024, 0, s>>>(x->ds, x->row_wce, x->row_ok, x->idx, x->wts, dpace ? x->wrow : NULL, B);
    CUDA_LAUNCHED("k_stats", err, errlen);
    CUDA_TRY_RC(mark(x, x->ev_ph[2], err, errlen));
    if (!backward) {
        CUDA_TRY_RC(mark(x, x->ev_ph[3], err, errlen));
        return st ? dflash_stats_read_cuda(x, st, err, errlen) : 0;
    }

    /* backward */
    CUDA_TRY_RC(
        rms_bwd(x, x->dh, x->dhb, x->Gr + x->off_fn, NULL, x->dz, x->h_out, x->P + x->off_fn, R, d, err, errlen));
    for (int l = x->L - 1; l >= 0; l--) {
        layer_buf *lb = &x->lb[l];
        const size_t *o = x->off[l];
        float *G = x->Gr;
        A.window = x->c.layer_sliding[l] ? x->c.sliding_window : 0;
        /* MLP */
        CUDA_TRY_RC(lin_dx(x, x->dact, NN_GEMM_BF16, x->dhb, x->Wb + o[T_DOWN], R, I, d, 0.0f, err, errlen));
        CUDA_TRY_RC(lin_dw(x, G + o[T_DOWN], x->dhb, lb->act, R, I, d, err, errlen));
        k_swiglu_bwd<<<grid_for((long)R * I), 256, 0, s>>>(x->dgu, x->dact, lb->gu, I, (long)R * I);
        CUDA_LAUNCHED("k_swiglu_bwd", err, errlen);
        CUDA_TRY_RC(lin_dx(x, x->dn, NN_GEMM_F32, x->dgu, x->Wb + o[T_GATE], R, d, 2 * I, 0.0f, err, errlen));
        CUDA_TRY_RC(lin_dw(x, G + o[T_GATE], x->dgu, lb->n, R, d, 2 * I, err, errlen));
        CUDA_TRY_RC(
            rms_bwd(x, x->dh2, x->dh2b, G + o[T_POST], x->dh, x->dn, lb->h_mid, x->P + o[T_POST], R, d, err, errlen));
        /* attention */
        CUDA_TRY_RC(lin_dx(x, x->datt, NN_GEMM_BF16, x->dh2b, x->Wb + o[T_O], R, x->qd, d, 0.0f, err, errlen));
        CUDA_TRY_RC(lin_dw(x, G + o[T_O], x->dh2b, lb->att, R, x->qd, d, err, errlen));
        CUDA_TRY_RC(mark(x, x->ev_at[4 * l + 2], err, errlen));
        CUDA_TRY_RC(dflash_attn_bwd_cuda(&x->aws, &A, (const nn_bf16_cuda *)lb->Qh, (const nn_bf16_cuda *)lb->Kh,
                                         (const nn_bf16_cuda *)lb->Vh, (const nn_bf16_cuda *)lb->att, lb->lse,
                                         (const nn_bf16_cuda *)x->datt, x->dQh, x->dKh, x->dVh, s, err, errlen));
        CUDA_TRY_RC(mark(x, x->ev_at[4 * l + 3], err, errlen));
        long units = (long)R * x->H + (long)T * x->KV;
        float *cq = x->contrib, *ck = x->contrib + (long)R * x->qd;
        k_qk_bwd<<<cdiv(units, 8), 256, 0, s>>>(x->dqkv, x->dkvc, cq, ck, x->dQh, x->dKh, x->dVh, lb->qkv, lb->kvc,
                                                x->P + o[T_QN], x->P + o[T_KN], x->inv_freq, x->pos, S, R, x->H, x->KV,
                                                x->hd, x->eps);
        CUDA_LAUNCHED("k_qk_bwd", err, errlen);
        CUDA_TRY_RC(colsum(x, G + o[T_QN], cq, (long)R * x->H, x->hd, err, errlen));
        CUDA_TRY_RC(colsum(x, G + o[T_KN], ck, (long)T * x->KV, x->hd, err, errlen));
        CUDA_TRY_RC(lin_dx(x, x->da, NN_GEMM_F32, x->dqkv, x->Wb + o[T_Q], R, d, x->qkvd, 0.0f, err, errlen));
        CUDA_TRY_RC(lin_dw(x, G + o[T_Q], x->dqkv, lb->a, R, d, x->qkvd, err, errlen));
        CUDA_TRY_RC(lin_dx(x, x->dctx, NN_GEMM_F32, x->dkvc, x->Wb + o[T_K], S, d, 2 * x->kvd,
                           l == x->L - 1 ? 0.0f : 1.0f, err, errlen));
        CUDA_TRY_RC(lin_dw(x, G + o[T_K], x->dkvc, x->ctxb, S, d, 2 * x->kvd, err, errlen));
        CUDA_TRY_RC(rms_bwd(x, x->dh, x->dhb, G + o[T_IN], x->dh2, x->da, lb->h_in, x->P + o[T_IN], R, d, err, errlen));
    }
    CUDA_TRY_RC(
        rms_bwd(x, x->dfc, x->dfcb, x->Gr + x->off_hn, NULL, x->dctx, x->fc_out, x->P + x->off_hn, S, d, err, errlen));
    CUDA_TRY_RC(lin_dw(x, x->Gr + x->off_fc, x->dfcb, Hb, S, x->nc * d, d, err, errlen));
    CUDA_TRY_RC(mark(x, x->ev_ph[3], err, errlen));
    if (st)
        return dflash_stats_read_cuda(x, st, err, errlen);
    return 0;
}

int dflash_step_accumulate_cuda(dflash_ctx_cuda *x, const dflash_batch_cuda *b, double norm, dflash_stats *st,
                                char *err, size_t errlen)
{
    NEED_TRAINING(x, "dflash_step_accumulate_cuda");
    return run_step(x, "dflash_step_accumulate_cuda", b, norm, 1, st, err, errlen);
}

int dflash_forward_loss_cuda(dflash_ctx_cuda *x, const dflash_batch_cuda *b, dflash_stats *st, char *err, size_t errlen)
{
    return run_step(x, "dflash_forward_loss_cuda", b, 0.0, 0, st, err, errlen);
}

int dflash_stats_read_cuda(dflash_ctx_cuda *x, dflash_stats *st, char *err, size_t errlen)
{
    dev_stats ds;
    CUDA_TRY_RC(copy_sync(x, &ds, x->ds, sizeof ds, cudaMemcpyDeviceToHost, err, errlen));
    memset(st, 0, sizeof *st);
    st->wce = ds.wce;
    st->sum_w = ds.sum_w;
    st->loss = ds.norm > 0 ? ds.wce / ds.norm : 0.0;
    for (int k = 0; k < DFLASH_MAX_BLOCK; k++) {
        st->count[k] = ds.count[k];
        st->correct[k] = ds.correct[k];
        st->wpos[k] = ds.wpos[k];
    }
    if (ds.err)
        return df_err(err, errlen, -EINVAL, "bad batch:%s%s%s", ds.err & ERR_ANCHOR ? " anchor outside [0, S)" : "",
                      ds.err & ERR_TOKEN ? " token/label outside [0, vocab)" : "",
                      ds.err & ERR_ROWS ? " more weighted rows than n_real*(B-1) (n_real wrong?)" : "");
    return 0;
}

static_assert(NPART == ADAMW_NORM_PARTS_CUDA, "norm_part holds the optimizer's partials");

int dflash_optimizer_step_cuda(dflash_ctx_cuda *x, adamw_info *info, char *err, size_t errlen)
{
    NEED_TRAINING(x, "dflash_optimizer_step_cuda");
    const adamw_config *c = &x->opt;
    CUDA_TRY_RC(mark(x, x->ev_ph[4], err, errlen));
    adamw_buffers_cuda ab;
    ab.p = x->P, ab.m = x->Mm, ab.v = x->Vm, ab.g = x->Gr, ab.mirror = (uint16_t *)x->Wb, ab.n = x->np;
    ab.tensors = x->tens, ab.ntensor = x->ntensor, ab.norm_part = x->norm_part, ab.state = x->os;
    CUDA_TRY_RC(adamw_step_cuda(&ab, c, x->warm, x->st, err, errlen));
    CUDA_TRY_RC(mark(x, x->ev_ph[5], err, errlen));
    if (info) {
        opt_state os;
        CUDA_TRY_RC(copy_sync(x, &os, x->os, sizeof os, cudaMemcpyDeviceToHost, err, errlen));
        memset(info, 0, sizeof *info);
        info->lr = os.lr;
        info->grad_norm = os.norm;
        info->clip_scale = os.clip_scale;
        info->skipped = os.skip;
    }
    return 0;
}

/* ---- helpers -------------------------------------------------------------------------------- */

int dflash_upload_bf16_cuda(dflash_bf16_cuda **dst, const float *src, size_t n, char *err, size_t errlen)
{
    *dst = NULL;
    dflash_bf16_cuda *h = (dflash_bf16_cuda *)malloc(sizeof(dflash_bf16_cuda) * (n ? n : 1));
    if (!h)
        return df_err(err, errlen, -ENOMEM, "dflash_upload_bf16_cuda: out of host memory for %zu values", n);
    /* on every core: one thread took ~2.3 s a table at the 8B shape (622 M values; the
     * embedding and the lm_head were 4.6 s of the drafter's start-up) */
    safetensors_f32_to_bf16_n(h, src, n);
    void *d = NULL;
    cudaError_t e = cudaMalloc(&d, sizeof(dflash_bf16_cuda) * (n ? n : 1));
    if (e != cudaSuccess) {
        cudaGetLastError();
        free(h);
        return df_err(err, errlen, -ENOMEM, "dflash_upload_bf16_cuda: cudaMalloc of %zu bf16: %s", n,
                      cudaGetErrorString(e));
    }
    e = cudaMemcpy(d, h, sizeof(dflash_bf16_cuda) * n, cudaMemcpyHostToDevice);
    if (e == cudaSuccess)
        e = cudaDeviceSynchronize(); /* the DMA from pageable memory may still be in flight */
    free(h);
    if (e != cudaSuccess) {
        cudaFree(d);
        return df_err(err, errlen, -EIO, "dflash_upload_bf16_cuda: copy of %zu bf16: %s", n, cudaGetErrorString(e));
    }
    *dst = (dflash_bf16_cuda *)d;
    return 0;
}

int dflash_fill_uniform_bf16_cuda(dflash_bf16_cuda *p, size_t n, uint64_t seed, float scale, cudaStream_t s, char *err,
                                  size_t errlen)
{
    k_fill_uniform_bf16<<<4096, 256, 0, s>>>((bf16 *)p, (long)n, seed, scale);
    CUDA_LAUNCHED("k_fill_uniform_bf16", err, errlen);
    return 0;
}

const char *dflash_attn_name_cuda(const dflash_ctx_cuda *x)
{
    return dflash_attn_scheme_name_cuda(x->attn_scheme);
}
