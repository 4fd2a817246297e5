/* cublaslt_cuda.c: the one cuBLASLt GEMM of the tree (nn_gemm_*_cuda): the linear layers of
 * the target forward and of inference, and every GEMM of the drafter training step
 * (projections, both backward shapes dX = dY W and dW += dY^T X into fp32 gradients with
 * beta = 1, fp32 outputs with a residual as C, the strided-batched attention GEMMs).
 *
 * Row-major D = op(A) op(B) is, in cuBLAS's column-major view, D^T = op(B)^T op(A)^T, so B
 * is passed as cuBLAS's A and A as its B with the same transpose flags (no copies); a
 * linear layer out = x w^T is then the "TN" layout cuBLASLt is fastest at. A bias is the
 * BIAS epilogue (bias[N] added per output column before the bf16 rounding).
 *
 * Plans (descriptors + the heuristic's first algorithm for the handle's workspace size)
 * are cached per transposes, shape, leading dimensions, batch and strides, output type,
 * beta != 0, bias and alignment, so a shape always runs the same algorithm, and cuBLAS
 * documents bit-wise reproducible results for a fixed algorithm on one GPU model (split-K
 * reductions included: the in-place scheme serialises its parts through counters).
 * gpu_test_dflash checks two drafter steps for bit-identical gradients.
 *
 * algo_rank (opt-in, 0 for every caller that does not set it): the k-th answer of the
 * heuristic's list instead of its first, for shapes where a measurement showed a later
 * answer faster (the target forward's table); part of the plan key.
 *
 * align_hint: the drafter step has always told the heuristic its pointers' alignment
 * (MIN_ALIGNMENT_{A,B,C,D}_BYTES = the largest power of two <= 256 dividing every address
 * and batch stride), the target forward never did (cuBLASLt's default preferences). Both
 * are kept, so each caller gets the algorithms, and so the bits, it always got. */
#include "nn/nn_cuda.h"

/* cublasLt.h declares a few functions without prototypes; it is not ours to fix */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cublasLt.h>
#pragma GCC diagnostic pop
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"

#define PLAN_CACHE 256

typedef struct plan {
    int used;
    int ta, tb, M, N, K, d_type, has_beta, has_bias, batch, align_hint, align, rank;
    long lda, ldb, ldd;
    long long sA, sB, sD;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} plan;

struct nn_gemm_cuda {
    cublasLtHandle_t lt;
    void *ws;
    size_t ws_bytes;
    plan plans[PLAN_CACHE];
    int n_plans, next_evict;
};

int nn_gemm_create_cuda(nn_gemm_cuda **out, size_t workspace_bytes, char *err, size_t errlen)
{
    *out = NULL;
    nn_gemm_cuda *g = calloc(1, sizeof *g);
    if (!g)
        return df_err(err, errlen, -ENOMEM, "nn_gemm_create_cuda: out of host memory");
    cublasStatus_t st = cublasLtCreate(&g->lt);
    if (st != CUBLAS_STATUS_SUCCESS) {
        free(g);
        return df_err(err, errlen, -EIO, "nn_gemm_create_cuda: cublasLtCreate: %s (%d)", cublasLtGetStatusString(st),
                      (int)st);
    }
    g->ws_bytes = workspace_bytes;
    if (workspace_bytes) {
        cudaError_t e = cudaMalloc(&g->ws, workspace_bytes);
        if (e != cudaSuccess) {
            cudaGetLastError(); /* clear it: the caller sees -ENOMEM */
            cublasLtDestroy(g->lt);
            free(g);
            return df_err(err, errlen, -ENOMEM, "nn_gemm_create_cuda: cudaMalloc of the %zu-byte workspace: %s",
                          workspace_bytes, cudaGetErrorString(e));
        }
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

void nn_gemm_destroy_cuda(nn_gemm_cuda *g)
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

/* After a failure: the shape, after the message already in err. */
static int with_shape(char *err, size_t errlen, int rc, const nn_gemm_args_cuda *p)
{
    if (err && errlen) {
        size_t n = strnlen(err, errlen - 1);
        snprintf(err + n, errlen - n,
                 " for D[%d, %d] = op%s(A) op%s(B), K=%d, lda %ld ldb %ld ldd %ld, batch %d, d_type %s%s", p->M, p->N,
                 p->ta ? "T" : "N", p->tb ? "T" : "N", p->K, p->lda, p->ldb, p->ldd, p->batch,
                 p->d_type == NN_GEMM_F32 ? "f32" : "bf16", p->bias ? ", bias" : "");
    }
    return rc;
}

/* Largest power of two <= 256 dividing every address the call touches. */
static int alignment_of(const nn_gemm_args_cuda *p)
{
    unsigned long long bits = 256;
    int es_d = p->d_type == NN_GEMM_F32 ? 4 : 2;
    bits |= (unsigned long long)(uintptr_t)p->A | (unsigned long long)(uintptr_t)p->B |
            (unsigned long long)(uintptr_t)p->D | (unsigned long long)(uintptr_t)(p->C ? p->C : p->D);
    if (p->batch > 1)
        bits |= (unsigned long long)(p->sA * 2) | (unsigned long long)(p->sB * 2) | (unsigned long long)(p->sD * es_d);
    return (int)(bits & (~bits + 1));
}

static cublasStatus_t layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, uint64_t rows, uint64_t cols, long ld,
                             int batch, long long stride)
{
    cublasStatus_t st = cublasLtMatrixLayoutCreate(l, t, rows, cols, (int64_t)ld);
    if (st != CUBLAS_STATUS_SUCCESS || batch <= 1)
        return st;
    int32_t bc = batch;
    int64_t sb = stride;
    st = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sb, sizeof sb);
    return st;
}

static int plan_build(nn_gemm_cuda *g, plan *q, const nn_gemm_args_cuda *p, int batch, int has_beta, int align,
                      char *err, size_t errlen)
{
    int rc = 0;
    cublasLtMatmulPreference_t pref = NULL;
    memset(q, 0, sizeof *q);
    cudaDataType_t dt = p->d_type == NN_GEMM_F32 ? CUDA_R_32F : CUDA_R_16BF;
    /* column-major call: cm_A = B (op tb), cm_B = A (op ta), m = N, n = M */
    cublasOperation_t opa = p->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = p->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_TRY_GOTO(cublasLtMatmulDescCreate(&q->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), err, errlen, rc, fail);
    CUBLAS_TRY_GOTO(cublasLtMatmulDescSetAttribute(q->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa), err, errlen,
                    rc, fail);
    CUBLAS_TRY_GOTO(cublasLtMatmulDescSetAttribute(q->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb), err, errlen,
                    rc, fail);
    if (p->bias) {
        cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bt = CUDA_R_16BF;
        CUBLAS_TRY_GOTO(cublasLtMatmulDescSetAttribute(q->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep), err,
                        errlen, rc, fail);
        CUBLAS_TRY_GOTO(cublasLtMatmulDescSetAttribute(q->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt),
                        err, errlen, rc, fail);
    }
    CUBLAS_TRY_GOTO(layout(&q->la, CUDA_R_16BF, p->tb ? (uint64_t)p->K : (uint64_t)p->N,
                           p->tb ? (uint64_t)p->N : (uint64_t)p->K, p->ldb, batch, p->sB),
                    err, errlen, rc, fail);
    CUBLAS_TRY_GOTO(layout(&q->lb, CUDA_R_16BF, p->ta ? (uint64_t)p->M : (uint64_t)p->K,
                           p->ta ? (uint64_t)p->K : (uint64_t)p->M, p->lda, batch, p->sA),
                    err, errlen, rc, fail);
    CUBLAS_TRY_GOTO(layout(&q->lc, dt, (uint64_t)p->N, (uint64_t)p->M, p->ldd, batch, p->sD), err, errlen, rc, fail);

    CUBLAS_TRY_GOTO(cublasLtMatmulPreferenceCreate(&pref), err, errlen, rc, fail);
    CUBLAS_TRY_GOTO(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &g->ws_bytes,
                                                         sizeof g->ws_bytes),
                    err, errlen, rc, fail);
    if (p->align_hint) {
        uint32_t a32 = (uint32_t)align;
        const cublasLtMatmulPreferenceAttributes_t al[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; i < 4; i++)
            CUBLAS_TRY_GOTO(cublasLtMatmulPreferenceSetAttribute(pref, al[i], &a32, sizeof a32), err, errlen, rc, fail);
    }
    /* rank 0 asks for one answer, as every caller always did; rank k > 0 for the fixed
     * list of NN_GEMM_MAX_RANK and takes entry k */
    cublasLtMatmulHeuristicResult_t res[NN_GEMM_MAX_RANK];
    int n_res = 0, want = p->algo_rank > 0 ? NN_GEMM_MAX_RANK : 1;
    CUBLAS_TRY_GOTO(cublasLtMatmulAlgoGetHeuristic(g->lt, q->desc, q->la, q->lb, q->lc, q->lc, pref, want, res, &n_res),
                    err, errlen, rc, fail);
    if (n_res < 1) {
        rc = df_err(err, errlen, -EIO, "cublasLtMatmulAlgoGetHeuristic: no algorithm");
        goto fail;
    }
    if (n_res <= p->algo_rank) {
        rc = df_err(err, errlen, -ENOENT, "cublasLtMatmulAlgoGetHeuristic: algorithm rank %d asked, %d offered",
                    p->algo_rank, n_res);
        goto fail;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    q->algo = res[p->algo_rank].algo;
    q->rank = p->algo_rank;
    q->used = 1;
    q->ta = p->ta, q->tb = p->tb, q->M = p->M, q->N = p->N, q->K = p->K, q->d_type = p->d_type;
    q->has_beta = has_beta, q->has_bias = p->bias != NULL, q->batch = batch;
    q->align_hint = p->align_hint != 0, q->align = align;
    q->lda = p->lda, q->ldb = p->ldb, q->ldd = p->ldd, q->sA = p->sA, q->sB = p->sB, q->sD = p->sD;
    return 0;
fail:
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    plan_free(q);
    return with_shape(err, errlen, rc, p);
}

int nn_gemm_run_cuda(nn_gemm_cuda *g, const nn_gemm_args_cuda *p, cudaStream_t s, char *err, size_t errlen)
{
    if (!g || !p)
        return df_err(err, errlen, -EINVAL, "nn_gemm_run_cuda: no handle or no arguments");
    if (p->M < 0 || p->N <= 0 || p->K <= 0 || (p->bias && p->d_type != NN_GEMM_BF16) || p->algo_rank < 0 ||
        p->algo_rank >= NN_GEMM_MAX_RANK)
        return with_shape(err, errlen, df_err(err, errlen, -EINVAL, "nn_gemm_run_cuda: bad arguments"), p);
    if (p->M == 0)
        return 0;
    int batch = p->batch > 1 ? p->batch : 1, has_beta = p->beta != 0.0f, has_bias = p->bias != NULL, rc = 0;
    int hint = p->align_hint != 0, align = hint ? alignment_of(p) : 0;
    plan *q = NULL;
    for (int i = 0; i < g->n_plans; i++) {
        plan *c = &g->plans[i];
        if (c->used && c->ta == p->ta && c->tb == p->tb && c->M == p->M && c->N == p->N && c->K == p->K &&
            c->d_type == p->d_type && c->has_beta == has_beta && c->has_bias == has_bias && c->batch == batch &&
            c->align_hint == hint && c->align == align && c->rank == p->algo_rank && c->lda == p->lda &&
            c->ldb == p->ldb && c->ldd == p->ldd &&
            (batch == 1 || (c->sA == p->sA && c->sB == p->sB && c->sD == p->sD))) {
            q = c;
            break;
        }
    }
    if (!q) {
        int slot, fresh = g->n_plans < PLAN_CACHE;
        if (fresh) {
            slot = g->n_plans;
        } else { /* full: evict round-robin (a training loop or a forward uses far fewer shapes) */
            slot = g->next_evict;
            g->next_evict = (g->next_evict + 1) % PLAN_CACHE;
            plan_free(&g->plans[slot]);
        }
        q = &g->plans[slot];
        if ((rc = plan_build(g, q, p, batch, has_beta, align, err, errlen)) < 0)
            return rc;
        if (fresh)
            g->n_plans++;
    }
    if (p->bias)
        CUBLAS_TRY_GOTO(
            cublasLtMatmulDescSetAttribute(q->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p->bias, sizeof p->bias), err,
            errlen, rc, fail);
    const void *C = p->C ? p->C : p->D;
    float alpha = p->alpha, beta = p->beta;
    CUBLAS_TRY_GOTO(cublasLtMatmul(g->lt, q->desc, &alpha, p->B, q->la, p->A, q->lb, &beta, C, q->lc, p->D, q->lc,
                                   &q->algo, g->ws, g->ws_bytes, s),
                    err, errlen, rc, fail);
    return 0;
fail:
    return with_shape(err, errlen, rc, p);
}
