/* heldout_cuda.c: the CUDA backend of heldout.h (heldout_ops_cuda; CUDA=1 builds).
 *
 * Open: the CUDA target (target_model_cuda, bf16, the topology's capture layers, workspace
 * for the longest sample) runs over every held-out sample once; each sample's captured
 * features [S, n_capture, d] bf16 go to ONE pinned host buffer (plain host memory when
 * pinning fails), and the target is freed: between evaluations the validator holds on the
 * device only the tokens and masks, the frozen embedding / lm_head (bf16) and two staging
 * buffers of one sample's features. Features in host memory, not on the device, because
 * the validator shares its GPU with training (docs/operations.md "Validation" sizes both).
 *
 * Score: a forward-only drafter context (dflash_init_forward_cuda: no gradients, no AdamW
 * state; made at the first score, made again only when a checkpoint's shape differs) sized
 * for the longest sample and num_anchors anchor slots; the checkpoint's fp32 weights
 * uploaded; every sample's anchors from heldout_batch (the CPU backend's rule, the same
 * numbers) uploaded once; then per sample one dflash_forward_loss_cuda (the training step's
 * forward and loss kernels, no backward) while the next sample's features are copied to
 * the other staging buffer on a second stream. The statistics are merged on the host in
 * sample order, so a score is deterministic. */
#include "eval/heldout.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "dflash/dflash_cuda.h"
#include "target/target_model.h"
#include "target/target_model_cuda.h"
#include "util.h"

typedef struct heldout_gpu {
    int device;
    size_t ncd;                     /* n_capture * d: feature elements per token */
    uint16_t *feat;                 /* host bf16 features of every sample at its feat_off */
    int pinned;                     /* feat from cudaHostAlloc */
    size_t *tok_off;                /* [n] sample i's first token in d_x / d_mask */
    int32_t *d_x;                   /* device: every sample's tokens */
    uint8_t *d_mask;                /* device: every sample's loss mask */
    dflash_bf16_cuda *embed, *head; /* device bf16 [V, d] (head == embed when tied) */
    dflash_bf16_cuda *stage[2];     /* device: one sample's features each */
    cudaStream_t cs;                /* feature copies (and the target's forward at open); a blocking stream:
                                    * ordered after the cudaMemcpy uploads, not after the drafter's stream */
    cudaEvent_t copied[2];
    int32_t *h_anchors, *d_anchors; /* [n * num_anchors] of one score */
    uint8_t *h_keep, *d_keep;
    int *n_real;          /* [n] kept anchors; -1: the sample is skipped */
    dflash_ctx_cuda *ctx; /* forward-only drafter context */
    dflash_config cfg;    /* the config ctx was made for */
} heldout_gpu;

/* cudaMalloc with the tree's codes: -ENOMEM when the device is out of memory, else -EIO. */
static int dev_alloc(void **p, size_t bytes, const char *what, char *err, size_t errlen)
{
    cudaError_t e = cudaMalloc(p, bytes > 0 ? bytes : 1);
    if (e == cudaSuccess)
        return 0;
    *p = NULL;
    cudaGetLastError();
    return df_err(err, errlen, e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO, "cudaMalloc of %zu bytes for %s: %s",
                  bytes, what, cudaGetErrorString(e));
}

/* The target over every sample: features to g->feat. */
static int features(heldout_set *h, heldout_gpu *g, char *err, size_t errlen)
{
    target_model_cuda m;
    memset(&m, 0, sizeof m);
    char why[1024];
    int rc = target_load_cuda(&m, h->o.target_dir, h->o.capture, h->o.n_capture, h->max_S, why, sizeof why);
    if (rc < 0) {
        target_free_cuda(&m);
        return df_err(err, errlen, rc, "the target on CUDA device %d: %s", g->device, why);
    }
    int32_t *d_starts = NULL;
    if ((rc = dev_alloc((void **)&d_starts, 2 * sizeof(int32_t), "document starts", err, errlen)) < 0) {
        target_free_cuda(&m);
        return rc;
    }
    uint64_t t0 = df_now_ns();
    char at[1200];
    for (int i = 0; i < h->n && rc == 0; i++) {
        const heldout_sample *s = &h->s[i];
        if (s->S > 0) {
            int32_t starts[2] = {0, s->S}; /* synchronous copy: the stack array may go */
            cudaError_t e = cudaMemcpy(d_starts, starts, sizeof starts, cudaMemcpyHostToDevice);
            if (e == cudaSuccess &&
                (rc = target_forward_cuda(&m, g->d_x + g->tok_off[i], d_starts, 1, s->S, (nn_bf16_cuda *)g->stage[0],
                                          g->cs, why, sizeof why)) == 0)
                e = cudaMemcpyAsync(g->feat + s->feat_off, g->stage[0], sizeof(uint16_t) * (size_t)s->S * g->ncd,
                                    cudaMemcpyDeviceToHost, g->cs);
            if (e == cudaSuccess && rc == 0)
                e = cudaStreamSynchronize(g->cs);
            int bad = 0;
            if (e == cudaSuccess && rc == 0 && (rc = target_take_token_error_cuda(&m, &bad, why, sizeof why)) == 0 &&
                bad)
                rc = df_err(err, errlen, -ERANGE, "%s: target forward: a token id is outside the vocabulary",
                            heldout_where(h, i, at, sizeof at));
            else if (e != cudaSuccess)
                rc = df_err(err, errlen, -EIO, "%s: target forward on CUDA device %d: %s",
                            heldout_where(h, i, at, sizeof at), g->device, cudaGetErrorString(e));
            else if (rc < 0)
                df_err(err, errlen, rc, "%s: target forward on CUDA device %d: %s", heldout_where(h, i, at, sizeof at),
                       g->device, why);
        }
        if (rc == 0 && h->o.tick && h->o.tick(h->o.tick_arg, 0))
            rc = df_err(err, errlen, -EINTR, "stopped while computing the features");
    }
    h->features_s = (double)(df_now_ns() - t0) * 1e-9;
    cudaFree(d_starts);
    target_free_cuda(&m);
    return rc;
}

static int gpu_open(heldout_set *h, char *err, size_t errlen)
{
    int n_dev = 0, device = h->o.device;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || device >= n_dev) {
        cudaGetLastError();
        return df_err(err, errlen, -ENODEV, "CUDA device %d: this machine has %d CUDA device(s)%s%s", device,
                      e == cudaSuccess ? n_dev : 0, e == cudaSuccess ? "" : ": ",
                      e == cudaSuccess ? "" : cudaGetErrorString(e));
    }
    CUDA_TRY(cudaSetDevice(device), err, errlen);
    heldout_gpu *g = calloc(1, sizeof *g);
    if (!g)
        return df_err(err, errlen, -ENOMEM, "out of memory");
    h->impl = g;
    g->device = device;
    g->ncd = (size_t)h->o.n_capture * (size_t)h->hc.hidden_size;
    if (!(g->tok_off = calloc((size_t)h->n, sizeof *g->tok_off)) || !(g->n_real = calloc((size_t)h->n, sizeof(int))) ||
        !(g->h_anchors = malloc(sizeof(int32_t) * (size_t)h->n * (size_t)h->o.num_anchors)) ||
        !(g->h_keep = malloc((size_t)h->n * (size_t)h->o.num_anchors)))
        return df_err(err, errlen, -ENOMEM, "out of memory");
    /* tokens and masks of every sample, back to back, on the device */
    size_t tokens = (size_t)h->tokens;
    int32_t *hx = malloc(sizeof(int32_t) * (tokens > 0 ? tokens : 1));
    uint8_t *hm = malloc(tokens > 0 ? tokens : 1);
    if (!hx || !hm) {
        free(hx);
        free(hm);
        return df_err(err, errlen, -ENOMEM, "out of memory");
    }
    size_t off = 0;
    for (int i = 0; i < h->n; i++) {
        g->tok_off[i] = off;
        memcpy(hx + off, h->s[i].x, sizeof(int32_t) * (size_t)h->s[i].S);
        memcpy(hm + off, h->s[i].mask, (size_t)h->s[i].S);
        off += (size_t)h->s[i].S;
    }
    size_t stage_bytes = sizeof(uint16_t) * (size_t)(h->max_S > 0 ? h->max_S : 1) * g->ncd;
    int rc = dev_alloc((void **)&g->d_x, sizeof(int32_t) * tokens, "the held-out tokens", err, errlen);
    if (rc == 0)
        rc = dev_alloc((void **)&g->d_mask, tokens, "the held-out loss masks", err, errlen);
    for (int k = 0; k < 2 && rc == 0; k++)
        rc = dev_alloc((void **)&g->stage[k], stage_bytes, "a sample's features", err, errlen);
    if (rc == 0 && ((e = cudaMemcpy(g->d_x, hx, sizeof(int32_t) * tokens, cudaMemcpyHostToDevice)) != cudaSuccess ||
                    (e = cudaMemcpy(g->d_mask, hm, tokens, cudaMemcpyHostToDevice)) != cudaSuccess ||
                    (e = cudaStreamCreateWithFlags(&g->cs, cudaStreamDefault)) != cudaSuccess ||
                    (e = cudaEventCreateWithFlags(&g->copied[0], cudaEventDisableTiming)) != cudaSuccess ||
                    (e = cudaEventCreateWithFlags(&g->copied[1], cudaEventDisableTiming)) != cudaSuccess))
        rc = df_err(err, errlen, -EIO, "CUDA device %d: %s", device, cudaGetErrorString(e));
    free(hx);
    free(hm);
    if (rc < 0)
        return rc;
    /* the features: pinned, so the copies of a score run beside the drafter's kernels */
    h->feature_bytes = sizeof(uint16_t) * g->ncd * tokens;
    if (cudaHostAlloc((void **)&g->feat, h->feature_bytes > 0 ? h->feature_bytes : 1, cudaHostAllocDefault) ==
        cudaSuccess) {
        g->pinned = 1;
        h->feature_where = "pinned host memory";
    } else {
        cudaGetLastError();
        g->feat = malloc(h->feature_bytes > 0 ? h->feature_bytes : 1);
        h->feature_where = "host memory (pinning failed: copies are synchronous)";
        if (!g->feat)
            return df_err(err, errlen, -ENOMEM, "out of memory for the features of %d held-out samples (%zu bytes)",
                          h->n, h->feature_bytes);
    }
    if ((rc = features(h, g, err, errlen)) < 0)
        return rc;
    /* the frozen embedding and lm_head, bf16 on the device */
    target_embeddings emb;
    if ((rc = target_load_embeddings(&emb, h->o.target_dir, 0, err, errlen)) < 0)
        return rc;
    size_t ne = (size_t)emb.vocab * (size_t)emb.hidden;
    char why[512];
    rc = dflash_upload_bf16_cuda(&g->embed, emb.embed, ne, why, sizeof why);
    if (rc == 0)
        rc = emb.tied ? (g->head = g->embed, 0) : dflash_upload_bf16_cuda(&g->head, emb.lm_head, ne, why, sizeof why);
    target_embeddings_free(&emb);
    if (rc < 0)
        return df_err(err, errlen, rc, "upload of the target's embeddings (%zu x 2 bytes) to CUDA device %d: %s", ne,
                      device, why);
    return 0;
}

/* Two configs that build the same context (shape and every number the step reads). */
static int same_config(const dflash_config *a, const dflash_config *b)
{
    if (a->hidden != b->hidden || a->intermediate != b->intermediate || a->n_layers != b->n_layers ||
        a->n_heads != b->n_heads || a->n_kv_heads != b->n_kv_heads || a->head_dim != b->head_dim ||
        a->vocab != b->vocab || a->block_size != b->block_size || a->n_capture != b->n_capture ||
        a->mask_token_id != b->mask_token_id || a->sliding_window != b->sliding_window ||
        a->rms_norm_eps != b->rms_norm_eps || a->rope_theta != b->rope_theta || a->gamma != b->gamma)
        return 0;
    for (int l = 0; l < a->n_layers; l++)
        if (a->layer_sliding[l] != b->layer_sliding[l])
            return 0;
    return 1;
}

/* Every sample's anchors (heldout_batch: the CPU backend's numbers) to the device. */
static int anchors(heldout_set *h, heldout_gpu *g, const dflash_config *c, char *err, size_t errlen)
{
    int N = h->o.num_anchors;
    for (int i = 0; i < h->n; i++) {
        g->n_real[i] = -1;
        if (h->s[i].S < 1)
            continue;
        dflash_batch b;
        int rc = heldout_batch(h, i, c, NULL, &b);
        if (rc < 0)
            return df_err(err, errlen, rc, "validation sample %d: anchors: %s", i, strerror(-rc));
        memcpy(g->h_anchors + (size_t)i * N, b.anchors, sizeof(int32_t) * (size_t)N);
        memcpy(g->h_keep + (size_t)i * N, b.keep, (size_t)N);
        if (b.sum_w > 0)
            g->n_real[i] = b.n_real;
        dflash_batch_free(&b);
    }
    CUDA_TRY(cudaMemcpy(g->d_anchors, g->h_anchors, sizeof(int32_t) * (size_t)h->n * N, cudaMemcpyHostToDevice), err,
             errlen);
    CUDA_TRY(cudaMemcpy(g->d_keep, g->h_keep, (size_t)h->n * N, cudaMemcpyHostToDevice), err, errlen);
    return 0;
}

/* Enqueue sample i's features into staging buffer k on the copy stream. */
static int prefetch(heldout_set *h, heldout_gpu *g, int i, int k, char *err, size_t errlen)
{
    const heldout_sample *s = &h->s[i];
    CUDA_TRY(cudaMemcpyAsync(g->stage[k], g->feat + s->feat_off, sizeof(uint16_t) * (size_t)s->S * g->ncd,
                             cudaMemcpyHostToDevice, g->cs),
             err, errlen);
    CUDA_TRY(cudaEventRecord(g->copied[k], g->cs), err, errlen);
    return 0;
}

static int gpu_score(heldout_set *h, const dflash_config *c, const dflash_params *p, dflash_stats *all, char *err,
                     size_t errlen)
{
    heldout_gpu *g = h->impl;
    int N = h->o.num_anchors, rc;
    char why[1024];
    memset(all, 0, sizeof *all);
    if (c->vocab != h->hc.vocab_size || c->hidden != h->hc.hidden_size || c->n_capture != h->o.n_capture)
        return df_err(err, errlen, -EINVAL,
                      "the drafter (vocab %d, hidden %d, %d captured layers) does not fit the held-out "
                      "features (vocab %d, hidden %d, %d captured layers)",
                      c->vocab, c->hidden, c->n_capture, h->hc.vocab_size, h->hc.hidden_size, h->o.n_capture);
    CUDA_TRY(cudaSetDevice(g->device), err, errlen);
    if (g->ctx && !same_config(&g->cfg, c)) {
        dflash_free_cuda(g->ctx);
        g->ctx = NULL;
    }
    if (!g->ctx) {
        if (!g->d_anchors && ((rc = dev_alloc((void **)&g->d_anchors, sizeof(int32_t) * (size_t)h->n * N, "the anchors",
                                              err, errlen)) < 0 ||
                              (rc = dev_alloc((void **)&g->d_keep, (size_t)h->n * N, "the anchors", err, errlen)) < 0))
            return rc;
        if ((rc = dflash_init_forward_cuda(&g->ctx, c, g->embed, g->head, h->max_S > 0 ? h->max_S : 1, N, 0, why,
                                           sizeof why)) < 0)
            return df_err(err, errlen, rc, "the drafter's forward context on CUDA device %d: %s", g->device, why);
        g->cfg = *c;
        size_t tokens = (size_t)h->tokens, ne = (size_t)c->vocab * (size_t)c->hidden;
        h->device_bytes = dflash_device_bytes_cuda(g->ctx) + 2 * sizeof(uint16_t) * (size_t)h->max_S * g->ncd +
                          (g->head == g->embed ? 1 : 2) * 2 * ne + 5 * tokens + 5 * (size_t)h->n * N;
    }
    if ((rc = dflash_params_from_host_cuda(g->ctx, p->data, why, sizeof why)) < 0)
        return df_err(err, errlen, rc, "upload of the drafter's weights: %s", why);
    if ((rc = anchors(h, g, c, err, errlen)) < 0)
        return rc;
    int next = 0; /* the next scored sample (S > 0 and a weighted position) */
    while (next < h->n && g->n_real[next] < 0)
        next++;
    if (next < h->n && (rc = prefetch(h, g, next, 0, err, errlen)) < 0)
        return rc;
    int k = 0; /* the staging buffer of sample `next` */
    for (int i = 0; i < h->n; i++) {
        if (i == next) {
            int after = i + 1;
            while (after < h->n && g->n_real[after] < 0)
                after++;
            CUDA_TRY(cudaStreamWaitEvent(dflash_stream_cuda(g->ctx), g->copied[k], 0), err, errlen);
            /* the other buffer's last reader (the sample before) is done: its statistics were read */
            if (after < h->n && (rc = prefetch(h, g, after, 1 - k, err, errlen)) < 0)
                return rc;
            const heldout_sample *s = &h->s[i];
            dflash_batch_cuda db = {
                .S = s->S,
                .N = N,
                .n_real = g->n_real[i],
                .H = g->stage[k],
                .H_bf16 = 1,
                .x = g->d_x + g->tok_off[i],
                .loss_mask = g->d_mask + g->tok_off[i],
                .anchors = g->d_anchors + (size_t)i * N,
                .keep = g->d_keep + (size_t)i * N,
            };
            dflash_stats st;
            if ((rc = dflash_forward_loss_cuda(g->ctx, &db, &st, why, sizeof why)) < 0) {
                cudaStreamSynchronize(g->cs); /* no copy left in flight into a buffer */
                return df_err(err, errlen, rc, "validation sample %d: drafter forward on CUDA device %d: %s", i,
                              g->device, why);
            }
            dflash_stats_merge(all, &st);
            next = after;
            k = 1 - k;
        }
        if (h->o.tick && h->o.tick(h->o.tick_arg, 1)) {
            cudaStreamSynchronize(g->cs);
            return df_err(err, errlen, -EINTR, "stopped at sample %d of %d", i + 1, h->n);
        }
    }
    return 0;
}

static void gpu_close(heldout_set *h)
{
    heldout_gpu *g = h->impl;
    if (!g)
        return;
    if (g->cs)
        cudaStreamSynchronize(g->cs);
    dflash_free_cuda(g->ctx);
    for (int k = 0; k < 2; k++) {
        cudaFree(g->stage[k]);
        if (g->copied[k])
            cudaEventDestroy(g->copied[k]);
    }
    if (g->cs)
        cudaStreamDestroy(g->cs);
    if (g->head && g->head != g->embed)
        cudaFree(g->head);
    cudaFree(g->embed);
    cudaFree(g->d_x);
    cudaFree(g->d_mask);
    cudaFree(g->d_anchors);
    cudaFree(g->d_keep);
    if (g->pinned)
        cudaFreeHost(g->feat);
    else
        free(g->feat);
    free(g->tok_off);
    free(g->n_real);
    free(g->h_anchors);
    free(g->h_keep);
    free(g);
    h->impl = NULL;
}

const heldout_ops heldout_ops_cuda = {.name = "cuda", .open = gpu_open, .score = gpu_score, .close = gpu_close};
