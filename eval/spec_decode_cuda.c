/* spec_decode_cuda.c: the CUDA side of spec_decode_backend (CUDA=1 builds): the target's
 * KV-cached decode (target_decode_cuda.h) and the drafter's cached inference
 * (dflash_infer_cuda.h) behind spec_target / spec_drafter.
 *
 * Features stay on the device: extend hands out decode_model_cuda.feat, DEVICE bf16
 * [k, n_capture * d], through spec_target.extend's `const float **feats` (the interface is
 * typed for the CPU backend's fp32 host rows; only the drafter of the same backend reads
 * it, and it knows the layout). The drafter shares the target's stream, embedding and
 * lm_head, so no copy and no extra synchronisation is needed between them. */
#include "eval/spec_decode_backend.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval/dflash_infer_cuda.h"
#include "target/target_decode_cuda.h"

typedef struct cuda_impl {
    decode_model_cuda target;
    infer_state_cuda drafter;
    char err[512]; /* the last failure's text, printed once */
} cuda_impl;

static void cuda_close(void *impl)
{
    cuda_impl *ci = impl;
    infer_free_cuda(&ci->drafter);
    decode_free_cuda(&ci->target);
    free(ci);
}

/* Print a failure's text once (the interface carries only -errno). */
static int report(int rc, const char *what, const char *text)
{
    if (rc < 0 && rc != -ENOSPC)
        fprintf(stderr, "spec_decode_cuda: %s: %s\n", what, text);
    return rc;
}

/* The impl of a model inside it (both adapters' ctx point into a cuda_impl). */
#define IMPL_OF_TARGET(m) ((cuda_impl *)((char *)(m)-offsetof(cuda_impl, target)))
#define IMPL_OF_DRAFTER(s) ((cuda_impl *)((char *)(s)-offsetof(cuda_impl, drafter)))

static int t_reset(void *ctx)
{
    decode_reset_cuda(ctx);
    return 0;
}

static int t_extend(void *ctx, const int32_t *tokens, int k, int n_next, int32_t *next, const float **feats)
{
    decode_model_cuda *m = ctx;
    cuda_impl *ci = IMPL_OF_TARGET(m);
    int rc = decode_extend_cuda(m, tokens, k, n_next, next, ci->err, sizeof ci->err);
    if (rc < 0)
        return report(rc, "target extend", ci->err);
    *feats = (const float *)m->feat; /* device bf16, see the file comment */
    return 0;
}

static int t_truncate(void *ctx, int len)
{
    return decode_truncate_cuda(ctx, len);
}

static int d_reset(void *ctx)
{
    infer_reset_cuda(ctx);
    return 0;
}

static int d_append(void *ctx, const float *feats, int n)
{
    infer_state_cuda *s = ctx;
    cuda_impl *ci = IMPL_OF_DRAFTER(s);
    return report(infer_append_cuda(s, (const nn_bf16_cuda *)feats, n, ci->err, sizeof ci->err), "drafter append",
                  ci->err);
}

static int d_draft(void *ctx, int32_t anchor, int32_t *draft)
{
    infer_state_cuda *s = ctx;
    cuda_impl *ci = IMPL_OF_DRAFTER(s);
    return report(infer_draft_cuda(s, anchor, draft, ci->err, sizeof ci->err), "draft", ci->err);
}

static int cuda_open(spec_backend *b, const char *target_dir, const dflash_config *c, const dflash_params *p,
                     int max_ctx, int device, char *err, size_t errlen);
const spec_backend_ops spec_backend_ops_cuda = {.name = "cuda", .open = cuda_open, .close = cuda_close};

static int cuda_open(spec_backend *b, const char *target_dir, const dflash_config *c, const dflash_params *p,
                     int max_ctx, int device, char *err, size_t errlen)
{
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev < 1) {
        snprintf(err, errlen, "--backend cuda: no CUDA device (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return -ENODEV;
    }
    if (device < 0 || device >= n_dev) {
        snprintf(err, errlen, "--device %d: this machine has %d CUDA device(s)", device, n_dev);
        return -EINVAL;
    }
    if ((e = cudaSetDevice(device)) != cudaSuccess) {
        snprintf(err, errlen, "cudaSetDevice(%d): %s", device, cudaGetErrorString(e));
        return -EIO;
    }
    cuda_impl *ci = calloc(1, sizeof *ci);
    if (!ci) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    int rc = decode_load_cuda(&ci->target, target_dir, c->target_layer_ids, c->n_capture, max_ctx, c->block_size, err,
                              errlen);
    if (rc < 0) {
        free(ci);
        return rc;
    }
    if (ci->target.tm.d != c->hidden || ci->target.tm.V != c->vocab) {
        snprintf(err, errlen, "%s: hidden %d / vocab %d, the drafter has %d / %d", target_dir, ci->target.tm.d,
                 ci->target.tm.V, c->hidden, c->vocab);
        cuda_close(ci);
        return -EINVAL;
    }
    /* the drafter borrows the target's embedding (mask row included), lm_head and stream */
    if ((rc = infer_init_cuda(&ci->drafter, c, p, ci->target.tm.embed, ci->target.lm_head, max_ctx, ci->target.stream,
                              err, errlen)) < 0) {
        cuda_close(ci);
        return rc;
    }
    b->target = (spec_target){.ctx = &ci->target,
                              .feat_dim = c->n_capture * c->hidden,
                              .feat_row_bytes = sizeof(nn_bf16_cuda) * (size_t)c->n_capture * (size_t)c->hidden,
                              .max_ctx = max_ctx,
                              .reset = t_reset,
                              .extend = t_extend,
                              .truncate = t_truncate};
    b->drafter = (spec_drafter){
        .ctx = &ci->drafter, .block_size = c->block_size, .reset = d_reset, .append = d_append, .draft = d_draft};
    b->impl = ci;
    return 0;
}
