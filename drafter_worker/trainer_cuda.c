/* trainer_cuda.c: the trainer's CUDA backend (trainer.h, trainer_ops_cuda): dflash_*_cuda on the
 * worker's GPU.
 *
 * The frozen embedding and lm_head are uploaded once as bf16 (host fp32 copies freed right
 * after). The batch is read in place in the device ring slot: tokens, mask, anchors and keep
 * at the header's offsets, features (bf16) at off_feat; the host copy of the header gives
 * the document boundaries and, per document, the loss normaliser and the number of kept
 * anchors (dflash_batch_* on the host copy, no device round trip).
 *
 * One dflash_step_accumulate_cuda per batch: the documents are packed (dflash_batch_cuda
 * n_docs, only each document's kept anchor slots computed). The context is sized for
 * max_S = data.token_budget tokens (a batch never has more) and max_N = num_anchors x
 * max(2, ceil(token_budget / max_seq_len)) anchor slots (at most token_budget); a batch whose
 * kept anchors exceed that is cut into consecutive groups of documents, one call each.
 * Documents without a loss weight contribute nothing and are left out (inside a group as
 * doc_n_real 0). */
#include "dflash/dflash_batch.h"
#include "dflash/dflash_cuda.h"
#include "drafter_worker/trainer.h"
#include "util.h"

#include <cuda_runtime.h>

#include "cuda_check.h"

struct trainer_cuda {
    dflash_ctx_cuda *ctx;
    int max_S, max_N;               /* packed sizes of one call */
    dflash_bf16_cuda *embed, *head; /* head == embed when tied */
};

static int open_cuda(trainer *tr, const topo *t, long total_steps, int resumed, char *err, size_t errlen)
{
    CUDA_TRY(cudaSetDevice(tr->device), err, errlen);
    trainer_cuda *g = calloc(1, sizeof *g);
    if (!g)
        return -ENOMEM;
    tr->gpu = g;
    uint64_t t0 = df_now_ns(), t_emb, t_up, t_init;
    target_embeddings emb;
    int rc = target_load_embeddings(&emb, t->target_model_dir, 0, err, errlen);
    t_emb = df_now_ns();
    if (rc < 0)
        return rc;
    if (emb.vocab != tr->cfg.vocab || emb.hidden != tr->cfg.hidden) {
        snprintf(err, errlen, "%s: embeddings [%d, %d] do not match the drafter (vocab %d, hidden %d)",
                 t->target_model_dir, emb.vocab, emb.hidden, tr->cfg.vocab, tr->cfg.hidden);
        target_embeddings_free(&emb);
        return -EINVAL;
    }
    size_t n = (size_t)emb.vocab * emb.hidden;
    char why[512] = "";
    rc = dflash_upload_bf16_cuda(&g->embed, emb.embed, n, why, sizeof why);
    if (rc == 0)
        rc = emb.tied ? (g->head = g->embed, 0) : dflash_upload_bf16_cuda(&g->head, emb.lm_head, n, why, sizeof why);
    target_embeddings_free(&emb);
    if (rc < 0)
        return df_err(err, errlen, rc, "upload of the embeddings (%zu x 2 bytes): %s", n, why);
    t_up = df_now_ns();
    adamw_config oc = tr->opt.cfg;
    oc.total_steps = total_steps;
    long na = (long)t->drafter.num_anchors, budget = (long)t->token_budget, seq = (long)t->max_seq_len;
    long maxN = na * DF_MAX(2L, (budget + seq - 1) / DF_MAX(seq, 1L));
    g->max_S = (int)DF_MAX(budget, seq);
    g->max_N = (int)DF_MAX(na, DF_MIN(maxN, budget));
    rc = dflash_init_cuda(&g->ctx, &tr->cfg, &oc, g->embed, g->head, g->max_S, g->max_N, 0, err, errlen);
    if (rc < 0)
        return rc;
    t_init = df_now_ns();
    if ((rc = dflash_params_from_host_cuda(g->ctx, tr->p.data, why, sizeof why)) < 0 ||
        (rc = dflash_opt_from_host_cuda(g->ctx, resumed ? tr->opt.m : NULL, resumed ? tr->opt.v : NULL,
                                        resumed ? tr->opt.step : 0, why, sizeof why)) < 0)
        return df_err(err, errlen, rc, "upload of the weights: %s", why);
    df_log("cuda drafter on device %d: %zu params, %.2f GiB on the device (packed steps up to %d tokens, %d anchor "
           "slots; attention %s); open: embeddings read %.2f s, uploaded %.2f s, step context %.2f s, weights "
           "uploaded %.2f s",
           tr->device, dflash_param_count_cuda(g->ctx), (double)dflash_device_bytes_cuda(g->ctx) / (1u << 30), g->max_S,
           g->max_N, dflash_attn_name_cuda(g->ctx), (double)(t_emb - t0) * 1e-9, (double)(t_up - t_emb) * 1e-9,
           (double)(t_init - t_up) * 1e-9, (double)(df_now_ns() - t_init) * 1e-9);
    return 0;
}

static int step_cuda(trainer *tr, const batch_header *h, const void *slot, allreduce_comm *ar, void (*hb)(void *),
                     void *hb_arg, dflash_stats *st, adamw_info *info, char *err, size_t errlen)
{
    (void)hb, (void)hb_arg; /* one GPU step is short: the worker's loop keeps the heartbeat */
    trainer_cuda *g = tr->gpu;
    const dflash_config *c = &tr->cfg;
    if (h->feat_dtype != BATCH_FEAT_BF16)
        return df_err(err, errlen, -EINVAL, "batch %llu: fp32 features, the cuda drafter reads bf16 slots",
                      (unsigned long long)h->batch_id);
    const char *base = (const char *)slot;
    int N = (int)h->num_anchors, ncd = c->n_capture * c->hidden;
    dflash_batch seq[BATCH_MAX_DOCS];
    double norm;
    int nd = (int)h->n_docs;
    char why[512] = "";
    int rc = trainer_docs(tr, h, NULL, ar, seq, &norm, err, errlen); /* h: the host copy, same offsets */
    if (rc < 0)
        return rc;
    if ((rc = dflash_zero_grads_cuda(g->ctx, why, sizeof why)) < 0)
        goto fail;
    for (int k = 0; k < nd && rc == 0;) {
        if (seq[k].sum_w <= 0) { /* no loss position: contributes nothing */
            k++;
            continue;
        }
        /* the longest run of documents from k that fits one call */
        int k0 = k, s0 = h->doc_starts[k0], slots = 0, dn[BATCH_MAX_DOCS];
        int32_t starts[BATCH_MAX_DOCS + 1];
        for (; k < nd; k++) {
            int used = seq[k].sum_w > 0 ? seq[k].n_real : 0;
            for (int i = 0; i < N && used > 0 && used < N; i++)
                if (seq[k].keep[i] && i >= used)
                    used = N; /* kept anchors not first (not the sampler's layout): all slots */
            if (k > k0 && (h->doc_starts[k + 1] - s0 > g->max_S || slots + used > g->max_N))
                break;
            dn[k - k0] = used;
            starts[k - k0] = h->doc_starts[k] - s0;
            slots += used;
        }
        starts[k - k0] = h->doc_starts[k] - s0;
        int one = k - k0 == 1;
        dflash_batch_cuda b = {
            .S = starts[k - k0],
            .N = one ? N : slots,
            .n_real = one ? seq[k0].n_real : -1,
            .H = base + h->off_feat + (size_t)s0 * ncd * sizeof(dflash_bf16_cuda),
            .H_bf16 = 1,
            .x = (const int32_t *)(base + h->off_tokens) + s0,
            .loss_mask = (const uint8_t *)(base + h->off_mask) + s0,
            .anchors = (const int32_t *)(base + h->off_anchors) + (size_t)k0 * N,
            .keep = (const uint8_t *)(base + h->off_keep) + (size_t)k0 * N,
            .n_docs = one ? 0 : k - k0,
            .doc_starts = starts,
            .doc_n_real = dn,
            .doc_slots = N,
        };
        dflash_stats ds;
        rc = dflash_step_accumulate_cuda(g->ctx, &b, norm, &ds, why, sizeof why);
        if (rc == 0)
            dflash_stats_merge(st, &ds);
    }
    if (rc < 0)
        goto fail;
    if (ar && ar->world > 1) { /* gradients were pre-scaled by 1/world: the sum is the mean */
        char e2[400];
        if ((rc = allreduce_set_stream(ar, dflash_stream_cuda(g->ctx), e2, sizeof e2)) < 0 ||
            (rc = allreduce_sum(ar, dflash_grads_device_cuda(g->ctx), dflash_param_count_cuda(g->ctx), ar->timeout_ns,
                                e2, sizeof e2)) < 0) {
            snprintf(err, errlen, "gradient all-reduce (rank %d of %d): %s", ar->rank, ar->world, e2);
            goto out;
        }
    }
    rc = dflash_optimizer_step_cuda(g->ctx, info, why, sizeof why);
fail:
    if (rc < 0)
        snprintf(err, errlen, "batch %llu: %s", (unsigned long long)h->batch_id, why);
out:
    for (int k = 0; k < nd; k++)
        dflash_batch_free(&seq[k]);
    return rc;
}

/* A rank without a batch this step: zero gradients into the sum, the same AdamW step. */
static int step_empty_cuda(trainer *tr, allreduce_comm *ar, adamw_info *info, char *err, size_t errlen)
{
    trainer_cuda *g = tr->gpu;
    char why[512] = "";
    int rc = dflash_zero_grads_cuda(g->ctx, why, sizeof why);
    if (rc == 0 && ar && ar->world > 1) {
        char e2[400];
        if ((rc = allreduce_set_stream(ar, dflash_stream_cuda(g->ctx), e2, sizeof e2)) < 0 ||
            (rc = allreduce_sum(ar, dflash_grads_device_cuda(g->ctx), dflash_param_count_cuda(g->ctx), ar->timeout_ns,
                                e2, sizeof e2)) < 0)
            return df_err(err, errlen, rc, "gradient all-reduce (rank %d of %d): %s", ar->rank, ar->world, e2);
    }
    if (rc == 0)
        rc = dflash_optimizer_step_cuda(g->ctx, info, why, sizeof why);
    if (rc < 0)
        snprintf(err, errlen, "empty step: %s", why);
    return rc;
}

static int to_host_cuda(trainer *tr, int with_opt, char *err, size_t errlen)
{
    trainer_cuda *g = tr->gpu;
    char why[512] = "";
    int rc = dflash_params_to_host_cuda(g->ctx, tr->p.data, why, sizeof why);
    if (rc == 0 && with_opt)
        rc = dflash_opt_to_host_cuda(g->ctx, tr->opt.m, tr->opt.v, &tr->opt.step, why, sizeof why);
    if (rc < 0)
        snprintf(err, errlen, "copy of the weights to the host: %s", why);
    return rc;
}

static void close_cuda(trainer *tr)
{
    trainer_cuda *g = tr->gpu;
    if (!g)
        return;
    dflash_free_cuda(g->ctx);
    if (g->head && g->head != g->embed)
        cudaFree(g->head);
    cudaFree(g->embed);
    free(g);
    tr->gpu = NULL;
}

const trainer_ops trainer_ops_cuda = {
    .name = "cuda",
    .bucketed = 0,
    .open = open_cuda,
    .step = step_cuda,
    .step_empty = step_empty_cuda,
    .to_host = to_host_cuda,
    .close = close_cuda,
};
