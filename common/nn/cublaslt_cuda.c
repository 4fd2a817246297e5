/* cublaslt_cuda.c: the bf16 GEMM of every linear layer, through cuBLASLt (nn_gemm_cuda_*).
 *
 * Row-major out[T, N] = x[T, K] @ w[N, K]^T is, in cuBLAS's column-major view,
 * out^T[N, T] = op_T(w as [K, N]) @ (x as [K, T]): the "TN" layout cuBLASLt is fastest at,
 * with no copies. The handle and one workspace are created once (nn_gemm_create_cuda);
 * each shape's descriptors and the heuristic's first algorithm are built on first use and
 * cached, so later calls (and calls inside CUDA graph capture) only enqueue. A bias, when
 * given, is the BIAS epilogue (bias[N] added per output feature before the bf16 rounding).
 * Accumulation is fp32 (CUBLAS_COMPUTE_32F); bf16 inputs and output. */
#include "nn/nn_cuda.h"

/* cublasLt.h declares a few functions without prototypes; it is not ours to fix */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cublasLt.h>
#pragma GCC diagnostic pop
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GEMM_CACHE 64

typedef struct gemm_plan {
    int T, K, N, bias;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} gemm_plan;

struct nn_gemm_cuda {
    cublasLtHandle_t lt;
    void *workspace;
    size_t ws_bytes;
    gemm_plan plans[GEMM_CACHE];
    int n_plans;
    char err[256];
};

static int lt_fail(nn_gemm_cuda *g, const char *what, cublasStatus_t st, int T, int K, int N)
{
    snprintf(g->err, sizeof g->err, "%s failed: %s (%d) for out[%d, %d] = x[%d, %d] @ w[%d, %d]^T", what,
             cublasLtGetStatusString(st), (int)st, T, N, T, K, N, K);
    return -EIO;
}

const char *nn_gemm_error_cuda(const nn_gemm_cuda *g) { return g ? g->err : "no gemm handle"; }

int nn_gemm_create_cuda(nn_gemm_cuda **out, size_t workspace_bytes)
{
    *out = NULL;
    nn_gemm_cuda *g = calloc(1, sizeof *g);
    if (!g)
        return -ENOMEM;
    cublasStatus_t st = cublasLtCreate(&g->lt);
    if (st != CUBLAS_STATUS_SUCCESS) {
        free(g);
        return -EIO;
    }
    g->ws_bytes = workspace_bytes;
    if (workspace_bytes && cudaMalloc(&g->workspace, workspace_bytes) != cudaSuccess) {
        cudaGetLastError(); /* clear it: the caller sees -ENOMEM */
        cublasLtDestroy(g->lt);
        free(g);
        return -ENOMEM;
    }
    *out = g;
    return 0;
}

static void plan_free(gemm_plan *p)
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
    for (int i = 0; i < g->n_plans; i++)
        plan_free(&g->plans[i]);
    if (g->workspace)
        cudaFree(g->workspace);
    cublasLtDestroy(g->lt);
    free(g);
}

#define LT(call, what)                                                  \
    do {                                                                \
        cublasStatus_t st_ = (call);                                    \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                             \
            rc = lt_fail(g, what, st_, T, K, N);                        \
            goto fail;                                                  \
        }                                                               \
    } while (0)

static int plan_build(nn_gemm_cuda *g, gemm_plan *p, int T, int K, int N, int bias)
{
    int rc = 0;
    memset(p, 0, sizeof *p);
    p->T = T, p->K = K, p->N = N, p->bias = bias;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LT(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "set TRANSA");
    LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "set TRANSB");
    if (bias) {
        cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bt = CUDA_R_16BF;
        LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep), "set EPILOGUE");
        LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt),
           "set BIAS_DATA_TYPE");
    }
    LT(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, (uint64_t)K, (uint64_t)N, (int64_t)K), "layout w");
    LT(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, (uint64_t)K, (uint64_t)T, (int64_t)K), "layout x");
    LT(cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_16BF, (uint64_t)N, (uint64_t)T, (int64_t)N), "layout out");

    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int n_res = 0;
    LT(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &g->ws_bytes, sizeof g->ws_bytes);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(g->lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &n_res);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS) {
        rc = lt_fail(g, "cublasLtMatmulAlgoGetHeuristic", st, T, K, N);
        goto fail;
    }
    if (n_res < 1) {
        rc = lt_fail(g, "cublasLtMatmulAlgoGetHeuristic (no algorithm)", CUBLAS_STATUS_NOT_SUPPORTED, T, K, N);
        goto fail;
    }
    p->algo = res.algo;
    return 0;
fail:
    plan_free(p);
    return rc;
}

static gemm_plan *plan_get(nn_gemm_cuda *g, int T, int K, int N, int bias, int *rc)
{
    for (int i = 0; i < g->n_plans; i++) {
        gemm_plan *p = &g->plans[i];
        if (p->T == T && p->K == K && p->N == N && p->bias == bias)
            return p;
    }
    if (g->n_plans == GEMM_CACHE) { /* full: drop the oldest (never happens in the forward) */
        plan_free(&g->plans[0]);
        memmove(&g->plans[0], &g->plans[1], sizeof(gemm_plan) * (GEMM_CACHE - 1));
        g->n_plans--;
    }
    gemm_plan *p = &g->plans[g->n_plans];
    if ((*rc = plan_build(g, p, T, K, N, bias)) < 0)
        return NULL;
    g->n_plans++;
    return p;
}

int nn_gemm_bf16_cuda(nn_gemm_cuda *g, nn_bf16_cuda *out, const nn_bf16_cuda *x, const nn_bf16_cuda *w, const nn_bf16_cuda *bias, int T,
                  int n_in, int n_out, cudaStream_t s)
{
    if (!g || T < 0 || n_in <= 0 || n_out <= 0)
        return -EINVAL;
    if (T == 0)
        return 0;
    int rc = 0, K = n_in, N = n_out;
    gemm_plan *p = plan_get(g, T, K, N, bias != NULL, &rc);
    if (!p)
        return rc;
    if (bias)
        LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
           "set BIAS_POINTER");
    const float alpha = 1.0f, beta = 0.0f;
    LT(cublasLtMatmul(g->lt, p->desc, &alpha, w, p->la, x, p->lb, &beta, out, p->lc, out, p->lc, &p->algo,
                      g->workspace, g->ws_bytes, s),
       "cublasLtMatmul");
    return 0;
fail:
    return rc;
}
