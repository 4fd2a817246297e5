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
#include "util.h"

struct cuda_impl;
/* What a drafter adapter's ctx points at: one sequence's drafter context and its impl. */
typedef struct d_ctx {
    infer_state_cuda *s;
    struct cuda_impl *ci;
} d_ctx;

typedef struct cuda_impl {
    decode_model_cuda target;
    infer_state_cuda drafter; /* owns the drafter weights; sequence 0's context when n_seq == 1 */
    int n_seq;
    infer_batch_cuda batch; /* n_seq > 1: the sequences' contexts, drafted together */
    spec_drafter *drafters; /* [n_seq] */
    d_ctx *dctx;            /* [n_seq] */
    char err[512];          /* the last failure's text, printed once */
} cuda_impl;

static void cuda_close(void *impl)
{
    cuda_impl *ci = impl;
    infer_batch_free_cuda(&ci->batch); /* before the weights it borrows */
    free(ci->drafters), free(ci->dctx);
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

/* The impl of the target inside it (the target adapter's ctx points into a cuda_impl). */
#define IMPL_OF_TARGET(m) ((cuda_impl *)((char *)(m)-offsetof(cuda_impl, target)))

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

static int t_reset_seq(void *ctx, int seq)
{
    decode_model_cuda *m = ctx;
    if (seq < 0 || seq >= m->n_seq)
        return -EINVAL;
    decode_reset_seq_cuda(m, seq);
    return 0;
}

static int t_extend_seq(void *ctx, int seq, const int32_t *tokens, int k, int n_next, int32_t *next,
                        const float **feats)
{
    decode_model_cuda *m = ctx;
    cuda_impl *ci = IMPL_OF_TARGET(m);
    int rc = decode_extend_seq_cuda(m, seq, tokens, k, n_next, next, ci->err, sizeof ci->err);
    if (rc < 0)
        return report(rc, "target extend", ci->err);
    *feats = (const float *)m->feat;
    return 0;
}

static int t_truncate_seq(void *ctx, int seq, int len)
{
    return decode_truncate_seq_cuda(ctx, seq, len);
}

static int t_extend_batch(void *ctx, const int32_t *tokens, const int *ks, int32_t *next, const float **feats)
{
    decode_model_cuda *m = ctx;
    cuda_impl *ci = IMPL_OF_TARGET(m);
    int rc = decode_extend_batch_cuda(m, tokens, ks, next, ci->err, sizeof ci->err);
    if (rc < 0)
        return report(rc, "target batch extend", ci->err);
    *feats = (const float *)m->feat;
    return 0;
}

static int d_reset(void *ctx)
{
    infer_reset_cuda(((d_ctx *)ctx)->s);
    return 0;
}

static int d_append(void *ctx, const float *feats, int n)
{
    d_ctx *dc = ctx;
    cuda_impl *ci = dc->ci;
    return report(infer_append_cuda(dc->s, (const nn_bf16_cuda *)feats, n, ci->err, sizeof ci->err), "drafter append",
                  ci->err);
}

static int d_draft(void *ctx, int32_t anchor, int32_t *draft)
{
    d_ctx *dc = ctx;
    cuda_impl *ci = dc->ci;
    return report(infer_draft_cuda(dc->s, anchor, draft, ci->err, sizeof ci->err), "draft", ci->err);
}

static int d_draft_batch(void *bctx, int n, const int *seqs, const int32_t *anchors, int32_t *drafts)
{
    cuda_impl *ci = bctx;
    return report(infer_batch_draft_cuda(&ci->batch, n, seqs, anchors, drafts, ci->err, sizeof ci->err), "batch draft",
                  ci->err);
}

static int cuda_open(spec_backend *b, const char *target_dir, const dflash_config *c, const dflash_params *p,
                     int max_ctx, int n_seq, int device, char *err, size_t errlen);
const spec_backend_ops spec_backend_ops_cuda = {.name = "cuda", .open = cuda_open, .close = cuda_close};

static int cuda_open(spec_backend *b, const char *target_dir, const dflash_config *c, const dflash_params *p,
                     int max_ctx, int n_seq, int device, char *err, size_t errlen)
{
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev < 1)
        return df_err(err, errlen, -ENODEV, "--backend cuda: no CUDA device (%s)",
                      e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    if (device < 0 || device >= n_dev)
        return df_err(err, errlen, -EINVAL, "--device %d: this machine has %d CUDA device(s)", device, n_dev);
    if ((e = cudaSetDevice(device)) != cudaSuccess)
        return df_err(err, errlen, -EIO, "cudaSetDevice(%d): %s", device, cudaGetErrorString(e));
    cuda_impl *ci = calloc(1, sizeof *ci);
    if (!ci)
        return df_err(err, errlen, -ENOMEM, "out of memory");
    int rc = decode_load_batch_cuda(&ci->target, target_dir, c->target_layer_ids, c->n_capture, max_ctx, c->block_size,
                                    n_seq, err, errlen);
    if (rc < 0) {
        free(ci);
        return rc;
    }
    if (ci->target.tm.d != c->hidden || ci->target.tm.V != c->vocab) {
        df_err(err, errlen, -EINVAL,
               "%s/config.json: hidden_size %d / vocab_size %d, the drafter has hidden_size %d / vocab_size %d",
               target_dir, ci->target.tm.d, ci->target.tm.V, c->hidden, c->vocab);
        cuda_close(ci); /* after the message, which reads the target's shape */
        return -EINVAL;
    }
    /* the drafter borrows the target's embedding (mask row included), lm_head and stream */
    if ((rc = infer_init_cuda(&ci->drafter, c, p, ci->target.tm.embed, ci->target.lm_head, max_ctx, ci->target.stream,
                              err, errlen)) < 0) {
        cuda_close(ci);
        return rc;
    }
    /* a batch: one drafter context per sequence over the weights above, their caches in
     * one slab so that the running sequences' blocks are drafted in one call
     * (infer_batch_cuda, docs/eval.md) */
    ci->drafters = calloc((size_t)n_seq, sizeof *ci->drafters);
    ci->dctx = calloc((size_t)n_seq, sizeof *ci->dctx);
    if (!ci->drafters || !ci->dctx) {
        cuda_close(ci);
        return df_err(err, errlen, -ENOMEM, "out of memory");
    }
    if (n_seq > 1 && (rc = infer_batch_init_cuda(&ci->batch, &ci->drafter, n_seq, max_ctx, err, errlen)) < 0) {
        cuda_close(ci);
        return rc;
    }
    ci->n_seq = n_seq;
    for (int i = 0; i < n_seq; i++) {
        ci->dctx[i] = (d_ctx){n_seq > 1 ? &ci->batch.seq[i] : &ci->drafter, ci};
        ci->drafters[i] = (spec_drafter){.ctx = &ci->dctx[i],
                                         .block_size = c->block_size,
                                         .reset = d_reset,
                                         .append = d_append,
                                         .draft = d_draft,
                                         .batch_ctx = n_seq > 1 ? ci : NULL,
                                         .draft_batch = n_seq > 1 ? d_draft_batch : NULL};
    }
    b->target = (spec_target){.ctx = &ci->target,
                              .feat_dim = c->n_capture * c->hidden,
                              .feat_row_bytes = sizeof(nn_bf16_cuda) * (size_t)c->n_capture * (size_t)c->hidden,
                              .max_ctx = max_ctx,
                              .reset = t_reset,
                              .extend = t_extend,
                              .truncate = t_truncate,
                              .n_seq = n_seq,
                              .reset_seq = t_reset_seq,
                              .extend_seq = t_extend_seq,
                              .truncate_seq = t_truncate_seq,
                              .extend_batch = t_extend_batch};
    b->drafter = ci->drafters[0];
    b->drafters = ci->drafters;
    b->n_seq = n_seq;
    b->impl = ci;
    return 0;
}
