/* target_backend_cuda.c: the CUDA side of target_backend.h (backend_ops_cuda): target_forward_cuda straight into the
 * device ring slot. The metadata is built on the host and copied in first (tokens and
 * doc_starts must be on the device for the forward); the features are written as bf16 at
 * off_feat; the stream is synchronised before returning so the slot can be published. */
#include "target_worker/target_backend_internal.h"
#include "target/target_model_cuda.h"
#include "io/batch_view.h"
#include "util.h"

#include <cuda_runtime.h>
#include <stddef.h>

#include "cuda_check.h"

typedef struct backend_cuda {
    struct target_backend base;
    target_model_cuda m;
    cudaStream_t s;
    void *meta; /* host buffer for one slot's metadata */
    size_t meta_cap;
    int device;
} backend_cuda;

static int cuda_forward(target_backend *bb, const arena *A, uint64_t off, batch_header *h, char *err, size_t errlen)
{
    backend_cuda *b = (backend_cuda *)bb;
    if (A->kind != ARENA_CUDA || A->device != b->device)
        return df_err(err, errlen, -EINVAL,
                      "the output ring's arena is %s device %d; the cuda target runs on device %d",
                      A->kind == ARENA_CUDA ? "on" : "in host memory, not on", A->device, b->device);
    int rc = batch_view_write(A, off, h, err, errlen);
    if (rc < 0)
        return rc;
    char *slot = (char *)A->base + off;
    char why[512] = "";
    rc = target_forward_cuda(&b->m, (const int32_t *)(slot + h->off_tokens),
                             (const int32_t *)(slot + offsetof(batch_header, doc_starts)), (int)h->n_docs, (int)h->T,
                             (nn_bf16_cuda *)(slot + h->off_feat), b->s, why, sizeof why);
    if (rc < 0)
        return df_err(err, errlen, rc == -EINVAL ? -EINVAL : -EIO, "batch %llu: target forward: %s",
                      (unsigned long long)h->batch_id, why);
    cudaError_t ce = cudaStreamSynchronize(b->s);
    if (ce != cudaSuccess)
        return df_err(err, errlen, -EIO, "batch %llu: target forward: %s", (unsigned long long)h->batch_id,
                      cudaGetErrorString(ce));
    int bad = 0;
    if ((rc = target_take_token_error_cuda(&b->m, &bad, err, errlen)) < 0)
        return -EIO;
    if (bad)
        return df_err(err, errlen, -ERANGE, "batch %llu: a token id is outside the vocabulary",
                      (unsigned long long)h->batch_id);
    return 0;
}

static batch_header *cuda_meta(target_backend *bb, const arena *A, uint64_t off)
{
    return (batch_header *)((backend_cuda *)bb)->meta;
}

static void cuda_close(target_backend *bb)
{
    backend_cuda *b = (backend_cuda *)bb;
    target_free_cuda(&b->m);
    if (b->s)
        cudaStreamDestroy(b->s);
    free(b->meta);
    free(b);
}

static int cuda_open(target_backend **out, const topo *t, int device, char *err, size_t errlen)
{
    *out = NULL;
    CUDA_TRY(cudaSetDevice(device), err, errlen);
    backend_cuda *b = calloc(1, sizeof *b);
    if (!b)
        return -ENOMEM;
    b->device = device;
    batch_header probe = {.kind = BATCH_KIND_TP,
                          .T = (uint32_t)t->token_budget,
                          .n_capture = (uint32_t)t->n_capture,
                          .d = 1,
                          .feat_dtype = BATCH_FEAT_BF16};
    batch_layout(&probe);
    b->meta_cap = probe.off_feat;
    b->meta = calloc(1, b->meta_cap);
    int rc = b->meta ? 0 : -ENOMEM;
    if (rc == 0)
        rc = target_load_cuda(&b->m, t->target_model_dir, t->capture_layers, t->n_capture, (int)t->token_budget, err,
                              errlen);
    if (rc == 0)
        CUDA_TRY_GOTO(cudaStreamCreateWithFlags(&b->s, cudaStreamNonBlocking), err, errlen, rc, fail);
fail:
    if (rc < 0) {
        cuda_close(&b->base);
        return rc;
    }
    b->base.ops = &backend_ops_cuda;
    b->base.hidden = b->m.d;
    b->base.n_layers_run = b->m.n_layers;
    hfconfig hc;
    char path[1200], e2[256];
    memset(&hc, 0, sizeof hc);
    snprintf(path, sizeof path, "%s/config.json", t->target_model_dir);
    int have_cfg = hfconfig_load(&hc, path, e2, sizeof e2) == 0;
    b->base.n_layers = have_cfg ? hc.num_hidden_layers : b->m.n_layers;
    b->base.vocab = have_cfg ? hc.vocab_size : 0;
    hfconfig_free(&hc);
    *out = &b->base;
    return 0;
}

const backend_ops backend_ops_cuda = {.name = "cuda",
                                      .feat_dtype = BATCH_FEAT_BF16,
                                      .open = cuda_open,
                                      .forward = cuda_forward,
                                      .meta = cuda_meta,
                                      .close = cuda_close};
