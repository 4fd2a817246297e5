/* dflash_gemm_cuda.c: the drafter's general cuBLASLt GEMM (dflash_gemm_cuda_*). The target's
 * nn_gemm_bf16_cuda only covers out = x w^T with bf16 output; training also needs the two
 * backward shapes (dX = dY W, dW += dY^T X into fp32 gradients with beta = 1), fp32 outputs
 * with a residual as C, and strided batches (the attention score GEMMs, one per KV head).
 *
 * Row-major D = op(A) op(B) is, in cuBLAS's column-major view, D^T = op(B)^T op(A)^T, so B
 * is passed as cuBLAS's A and A as its B with the same transpose flags (no copies).
 * Plans (descriptors + the heuristic's first algorithm) are cached per shape, strides,
 * types, beta != 0 and pointer alignment, so a shape always runs the same algorithm, and
 * cuBLAS documents bit-wise reproducible results for a fixed algorithm on one GPU model
 * (split-K reductions included: the in-place scheme serialises its parts through counters).
 * gpu_test_dflash checks two steps for bit-identical gradients. */
#include "dflash/dflash_cuda.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cublasLt.h>
#pragma GCC diagnostic pop
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PLAN_CACHE 256

typedef struct plan {
    int used;
    int ta, tb, M, N, K, d_type, has_beta, batch, align;
    long lda, ldb, ldd;
    long long sA, sB, sD;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} plan;

struct dflash_gemm_cuda {
    cublasLtHandle_t lt;
    void *ws;
    size_t ws_bytes;
    plan plans[PLAN_CACHE];
    int n_plans, next_evict;
    char err[320];
};

const char *dflash_gemm_error_cuda(const dflash_gemm_cuda *g) { return g ? g->err : "no gemm handle"; }

int dflash_gemm_create_cuda(dflash_gemm_cuda **out, size_t workspace_bytes)
{
    *out = NULL;
    dflash_gemm_cuda *g = calloc(1, sizeof *g);
    if (!g)
        return -ENOMEM;
    if (cublasLtCreate(&g->lt) != CUBLAS_STATUS_SUCCESS) {
        free(g);
        return -EIO;
    }
    g->ws_bytes = workspace_bytes;
    if (workspace_bytes && cudaMalloc(&g->ws, workspace_bytes) != cudaSuccess) {
        cudaGetLastError();
        cublasLtDestroy(g->lt);
        free(g);
        return -ENOMEM;
    }
    *out = g;
    return 0;
}

static void plan_free(plan *p)
{
    if (p->desc)
        cublasLtMatmulDescDestroy(p->desc);
    if (p->la)
        cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb)
        cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc)
        cublasLtMatrixLayoutDestroy(p->lc);
    memset(p, 0, sizeof *p);
}

void dflash_gemm_destroy_cuda(dflash_gemm_cuda *g)
{
    if (!g)
        return;
    for (int i = 0; i < PLAN_CACHE; i++)
        if (g->plans[i].used)
            plan_free(&g->plans[i]);
    if (g->ws)
        cudaFree(g->ws);
    cublasLtDestroy(g->lt);
    free(g);
}

static int fail(dflash_gemm_cuda *g, const char *what, cublasStatus_t st, const dflash_mm_cuda *p)
{
    snprintf(g->err, sizeof g->err,
             "%s: %s (%d) for D[%d, %d] = op%s(A) op%s(B), K=%d, lda %ld ldb %ld ldd %ld, batch %d, d_type %s",
             what, cublasLtGetStatusString(st), (int)st, p->M, p->N, p->ta ? "T" : "N", p->tb ? "T" : "N", p->K,
             p->lda, p->ldb, p->ldd, p->batch, p->d_type == DFLASH_CUDA_F32 ? "f32" : "bf16");
    return -EIO;
}

/* Largest power of two <= 256 dividing every address the call touches. */
static int alignment_of(const dflash_mm_cuda *p)
{
    unsigned long long bits = 256;
    int es_d = p->d_type == DFLASH_CUDA_F32 ? 4 : 2;
    bits |= (unsigned long long)(uintptr_t)p->A | (unsigned long long)(uintptr_t)p->B |
            (unsigned long long)(uintptr_t)p->D | (unsigned long long)(uintptr_t)(p->C ? p->C : p->D);
    if (p->batch > 1)
        bits |= (unsigned long long)(p->sA * 2) | (unsigned long long)(p->sB * 2) |
                (unsigned long long)(p->sD * es_d);
    return (int)(bits & (~bits + 1));
}

#define LT(call, what)                                                  \
    do {                                                                \
        cublasStatus_t st_ = (call);                                    \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                             \
            rc = fail(g, what, st_, p);                                 \
            goto out;                                                   \
        }                                                               \
    } while (0)

static int layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, uint64_t rows, uint64_t cols, long ld, int batch,
                  long long stride)
{
    if (cublasLtMatrixLayoutCreate(l, t, rows, cols, (int64_t)ld) != CUBLAS_STATUS_SUCCESS)
        return -1;
    if (batch > 1) {
        int32_t bc = batch;
        int64_t st = stride;
        if (cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc) !=
                CUBLAS_STATUS_SUCCESS ||
            cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &st, sizeof st) !=
                CUBLAS_STATUS_SUCCESS)
            return -1;
    }
    return 0;
}

static int plan_build(dflash_gemm_cuda *g, plan *q, const dflash_mm_cuda *p, int has_beta, int align)
{
    int rc = 0;
    memset(q, 0, sizeof *q);
    int batch = p->batch > 1 ? p->batch : 1;
    cudaDataType_t dt = p->d_type == DFLASH_CUDA_F32 ? CUDA_R_32F : CUDA_R_16BF;
    /* column-major call: cm_A = B (op tb), cm_B = A (op ta), m = N, n = M */
    cublasOperation_t opa = p->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = p->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT(cublasLtMatmulDescCreate(&q->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    LT(cublasLtMatmulDescSetAttribute(q->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa), "set TRANSA");
    LT(cublasLtMatmulDescSetAttribute(q->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb), "set TRANSB");
    if (layout(&q->la, CUDA_R_16BF, p->tb ? (uint64_t)p->K : (uint64_t)p->N, p->tb ? (uint64_t)p->N : (uint64_t)p->K,
               p->ldb, batch, p->sB) < 0 ||
        layout(&q->lb, CUDA_R_16BF, p->ta ? (uint64_t)p->M : (uint64_t)p->K, p->ta ? (uint64_t)p->K : (uint64_t)p->M,
               p->lda, batch, p->sA) < 0 ||
        layout(&q->lc, dt, (uint64_t)p->N, (uint64_t)p->M, p->ldd, batch, p->sD) < 0) {
        rc = fail(g, "cublasLtMatrixLayoutCreate", CUBLAS_STATUS_INVALID_VALUE, p);
        goto out;
    }
    cublasLtMatmulPreference_t pref = NULL;
    LT(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    uint32_t a32 = (uint32_t)align;
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &g->ws_bytes, sizeof g->ws_bytes);
    cublasLtMatmulPreferenceAttributes_t al[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++)
        st = cublasLtMatmulPreferenceSetAttribute(pref, al[i], &a32, sizeof a32);
    cublasLtMatmulHeuristicResult_t res;
    int n_res = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(g->lt, q->desc, q->la, q->lb, q->lc, q->lc, pref, 1, &res, &n_res);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS) {
        rc = fail(g, "cublasLtMatmulAlgoGetHeuristic", st, p);
        goto out;
    }
    if (n_res < 1) {
        rc = fail(g, "cublasLtMatmulAlgoGetHeuristic (no algorithm)", CUBLAS_STATUS_NOT_SUPPORTED, p);
        goto out;
    }
    q->algo = res.algo;
    q->used = 1;
    q->ta = p->ta, q->tb = p->tb, q->M = p->M, q->N = p->N, q->K = p->K, q->d_type = p->d_type;
    q->has_beta = has_beta, q->batch = batch, q->align = align;
    q->lda = p->lda, q->ldb = p->ldb, q->ldd = p->ldd, q->sA = p->sA, q->sB = p->sB, q->sD = p->sD;
    return 0;
out:
    plan_free(q);
    return rc;
}

int dflash_gemm_run_cuda(dflash_gemm_cuda *g, const dflash_mm_cuda *p, cudaStream_t s)
{
    if (!g || p->M < 0 || p->N <= 0 || p->K < 0)
        return -EINVAL;
    if (p->M == 0)
        return 0;
    int batch = p->batch > 1 ? p->batch : 1, has_beta = p->beta != 0.0f, align = alignment_of(p), rc = 0;
    plan *q = NULL;
    for (int i = 0; i < g->n_plans; i++) {
        plan *c = &g->plans[i];
        if (c->used && c->ta == p->ta && c->tb == p->tb && c->M == p->M && c->N == p->N && c->K == p->K &&
            c->d_type == p->d_type && c->has_beta == has_beta && c->batch == batch && c->align == align &&
            c->lda == p->lda && c->ldb == p->ldb && c->ldd == p->ldd &&
            (batch == 1 || (c->sA == p->sA && c->sB == p->sB && c->sD == p->sD))) {
            q = c;
            break;
        }
    }
    if (!q) {
        int slot;
        if (g->n_plans < PLAN_CACHE) {
            slot = g->n_plans++;
        } else { /* full: evict round-robin (a training loop uses far fewer shapes) */
            slot = g->next_evict;
            g->next_evict = (g->next_evict + 1) % PLAN_CACHE;
            plan_free(&g->plans[slot]);
        }
        q = &g->plans[slot];
        if ((rc = plan_build(g, q, p, has_beta, align)) < 0)
            return rc;
    }
    const void *C = p->C ? p->C : p->D;
    float alpha = p->alpha, beta = p->beta;
    cublasStatus_t st = cublasLtMatmul(g->lt, q->desc, &alpha, p->B, q->la, p->A, q->lb, &beta, C, q->lc, p->D,
                                       q->lc, &q->algo, g->ws, g->ws_bytes, s);
    if (st != CUBLAS_STATUS_SUCCESS)
        return fail(g, "cublasLtMatmul", st, p);
    return 0;
}
