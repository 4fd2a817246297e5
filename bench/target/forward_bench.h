/* forward_bench.h: what the two benches of the CUDA target forward share (bench_target:
 * the dense Qwen3 shapes; bench_moe: Qwen3-30B-A3B): the failure text of the last 0 /
 * -errno call (g_err), the bf16 8192^3 cuBLASLt GEMM their MFU is measured against, and
 * one layout's measurement of target_forward_cuda in two halves: eager calls timed
 * between CUDA events, then the same forward captured in a CUDA graph and its replays
 * timed. Between the halves each bench keeps the eager output and poisons the buffer, so
 * the replay's output can be compared bit for bit. CUDA_CHECK / RC_CHECK (file:line, the
 * call, the error text; exit 1) and the watchdog come from tests/gpu_test_check.h.
 * Header-only (static): each bench is one file. Include in CUDA builds only. */
#ifndef DF_BENCH_TARGET_FORWARD_BENCH_H
#define DF_BENCH_TARGET_FORWARD_BENCH_H

#include "nn/nn_cuda.h"
#include "target/target_model_cuda.h"
#include "tests/gpu_test_check.h"

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static char g_err[512]; /* the failure text of the last 0 / -errno call */

/* TFLOP/s of an n = 8192 bf16 GEMM through the wrapper the forward uses (a linear layer,
 * align_hint 0): 3 calls to warm up, then iters calls between events. */
static double gemm_ceiling_tflops(int iters)
{
    const int n = 8192;
    size_t e = (size_t)n * n;
    nn_bf16_cuda *a, *b, *c;
    CUDA_CHECK(cudaMalloc((void **)&a, 2 * e));
    CUDA_CHECK(cudaMalloc((void **)&b, 2 * e));
    CUDA_CHECK(cudaMalloc((void **)&c, 2 * e));
    RC_CHECK(nn_fill_uniform_bf16_cuda(a, e, 1, 1.0f, 0, g_err, sizeof g_err), g_err);
    RC_CHECK(nn_fill_uniform_bf16_cuda(b, e, 2, 1.0f, 0, g_err, sizeof g_err), g_err);
    nn_gemm_cuda *g;
    RC_CHECK(nn_gemm_create_cuda(&g, (size_t)32 << 20, g_err, sizeof g_err), g_err);
    /* the target forward's kind of call: a linear layer, align_hint 0 */
    nn_gemm_args_cuda ga = nn_gemm_linear_args_cuda(c, a, b, NULL, n, n, n);
    for (int i = 0; i < 3; i++)
        RC_CHECK(nn_gemm_run_cuda(g, &ga, 0, g_err, sizeof g_err), g_err);
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventRecord(e0, 0));
    for (int i = 0; i < iters; i++)
        RC_CHECK(nn_gemm_run_cuda(g, &ga, 0, g_err, sizeof g_err), g_err);
    CUDA_CHECK(cudaEventRecord(e1, 0));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    nn_gemm_destroy_cuda(g);
    cudaFree(a), cudaFree(b), cudaFree(c);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return 2.0 * n * (double)n * n * iters / (ms * 1e-3) / 1e12;
}

/* The eager half: one forward of the packed row (dtok, n_docs documents starting at dst)
 * first, untimed (it builds the GEMM plans), then n forwards between events on s.
 * Returns the n forwards' total ms; dout holds the last one's output. */
static float forward_eager_ms(target_model_cuda *m, const int32_t *dtok, const int32_t *dst, int n_docs, int tokens,
                              nn_bf16_cuda *dout, int n, cudaStream_t s)
{
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    RC_CHECK(target_forward_cuda(m, dtok, dst, n_docs, tokens, dout, s, g_err, sizeof g_err), g_err);
    CUDA_CHECK(cudaStreamSynchronize(s)); /* the first call builds the GEMM plans */
    CUDA_CHECK(cudaEventRecord(e0, s));
    for (int i = 0; i < n; i++)
        RC_CHECK(target_forward_cuda(m, dtok, dst, n_docs, tokens, dout, s, g_err, sizeof g_err), g_err);
    CUDA_CHECK(cudaEventRecord(e1, s));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return ms;
}

/* The graph half: the same forward captured on s into a CUDA graph, launched once
 * (untimed), then iters launches between events on s. Returns their total ms; dout holds
 * the output of the last launch. */
static float forward_graph_ms(target_model_cuda *m, const int32_t *dtok, const int32_t *dst, int n_docs, int tokens,
                              nn_bf16_cuda *dout, int iters, cudaStream_t s)
{
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    int rc = target_forward_cuda(m, dtok, dst, n_docs, tokens, dout, s, g_err, sizeof g_err);
    CUDA_CHECK(cudaStreamEndCapture(s, &g));
    RC_CHECK(rc, g_err);
    CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    CUDA_CHECK(cudaGraphLaunch(ge, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    CUDA_CHECK(cudaEventRecord(e0, s));
    for (int i = 0; i < iters; i++)
        CUDA_CHECK(cudaGraphLaunch(ge, s));
    CUDA_CHECK(cudaEventRecord(e1, s));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return ms;
}

/* Exit 1 when a forward so far met a token id out of the vocabulary: the bench made it. */
static void forward_token_check(target_model_cuda *m, const char *prog)
{
    int bad = 0;
    RC_CHECK(target_take_token_error_cuda(m, &bad, g_err, sizeof g_err), g_err);
    if (bad) {
        fprintf(stderr, "%s: token error flag set (bench bug)\n", prog);
        exit(1);
    }
}

#endif
