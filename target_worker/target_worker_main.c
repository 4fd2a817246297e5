/* target_worker: the frozen target's stage. Claims batches from the ledger, packs their
 * samples into one row, runs the target forward up to the last captured layer and writes
 * the captured features straight into a slot of its output ring (batch.h layout), then
 * publishes the slot. It waits only for a free slot (back-pressure) and measures that wait.
 *
 * Started by the orchestrator (environment and fd 3 as in common/proc/ctl.h). Exit codes:
 * 0 = no batch left to claim (or told to stop claiming), 100 = bad model or data (do not
 * restart), 1 = anything else.
 *
 * Crash safety: a claimed batch is recorded in the hand-off intent (external input =
 * ledger batch id, output = the ring slot) before the slot is published; the orchestrator
 * resolves it after a death: published -> the batch is in the ring; not published -> the
 * slot is freed and the batch goes back to pending. Nothing is lost, nothing doubled. */
#include "io/batch.h"
#include "io/shard.h"
#include "io/stage.h"
#include "proc/worker.h"
#include "target_worker/target_backend.h"
#include "target/target_model.h"
#include "util.h"

static const char usage[] = "usage: target_worker   (started by the orchestrator, not by hand)\n"
                            "The frozen target's stage of the DFlash pipeline: ledger batch -> target forward ->\n"
                            "captured layers in a ring slot. Reads DF_CTL_FD, DF_WORKER, DF_WORKER_ID,\n"
                            "DF_INCARNATION, DF_RUN_DIR (see common/proc/ctl.h). Exit 0 done, 100 bad model/data.\n";

/* The target refused batch b for a token id outside its vocabulary: name the first such id,
 * where it is in the batch, and the shard and sample it came from. The orchestrator checks
 * every shard against the vocabulary before it starts anything, so this means a shard was
 * changed under a running pipeline (or a backend refused an id the check let through). err
 * keeps the backend's message when no such id is found. */
static void name_bad_token(batch_header *b, const dataset *ds, const topo *t, int vocab, char *err, size_t errlen)
{
    const int32_t *tok = batch_tokens(b);
    for (uint32_t k = 0; k < b->n_docs; k++)
        for (int32_t i = b->doc_starts[k]; i < b->doc_starts[k + 1]; i++) {
            if (tok[i] >= 0 && (vocab <= 0 || tok[i] < vocab))
                continue;
            int si = 0;
            uint64_t local = 0;
            if (dataset_locate(ds, b->sample_idx[k], &si, &local) < 0)
                return;
            snprintf(err, errlen,
                     "batch %llu: token id %u (position %d) of data.shards[%d] %s: sample %llu is outside the "
                     "target's vocabulary 0..%d (%s/config.json: vocab_size %d); the orchestrator checked the shards "
                     "at start: was this one changed since?",
                     (unsigned long long)b->batch_id, (uint32_t)tok[i], i - b->doc_starts[k], si, t->shards[si],
                     (unsigned long long)local, vocab - 1, t->target_model_dir, vocab);
            return;
        }
}

/* The target stage's state, shared by its steps. */
typedef struct tgt {
    worker_ctx *wk;
    ctl_worker *w;
    const topo *t;
    target_backend *m;
    dataset *ds;
    ring *out;
    arena *A;
    uint64_t slot_bytes;
    ledger *L;
    handoff_table *H;
    int d;             /* the features' width */
    uint64_t produced; /* batches published */
} tgt;

/* The model and the data, the output ring (its slots must hold a batch of token_budget
 * tokens), then ready. */
static void open_target(tgt *g)
{
    const topo *t = g->t;
    char err[1024];
    int rc = backend_open(&g->m, t, g->w->self->gpu, err, sizeof err);
    if (rc < 0)
        df_die(rc == -ENOTSUP ? DF_EXIT_PERM : target_exit_code(rc), "%s", err);
    if (dataset_open(&g->ds, t->shards, t->n_shards, err, sizeof err) < 0)
        df_die(DF_EXIT_PERM, "%s", err);

    worker_ring o;
    DF_CHECK_ERR(worker_ring_out(g->wk, &o));
    g->out = o.r;
    g->A = o.A;
    g->slot_bytes = o.slot_bytes;
    g->L = ctl_ledger(g->w);
    g->H = ctl_handoff(g->w);
    g->d = backend_hidden(g->m);

    batch_header probe = {.kind = BATCH_KIND_TP,
                          .T = (uint32_t)t->token_budget,
                          .n_capture = (uint32_t)t->n_capture,
                          .d = (uint32_t)g->d,
                          .feat_dtype = backend_feat_dtype(g->m)};
    if (batch_layout(&probe) > g->slot_bytes)
        df_die(DF_EXIT_PERM,
               "%s: rings[%d].slot_bytes %llu is too small for a batch of %llu tokens (%llu bytes needed)",
               t->source_path, g->w->self->out_ring, (unsigned long long)g->slot_bytes,
               (unsigned long long)t->token_budget, (unsigned long long)probe.total_bytes);

    DF_CHECK_ERR(worker_ready(g->wk, NULL, g->out));
    df_log("ready: %s, %d layers run of %d, capture %d layers, %llu samples", t->target_model_dir,
           backend_n_layers_run(g->m), backend_n_layers(g->m), t->n_capture,
           (unsigned long long)dataset_n_samples(g->ds));
}

/* The next batch and a free slot for it, the intent recorded: 1; nothing to do now: 0; the
 * end (told to stop, every batch claimed, the ring closed): -1. */
static int claim(tgt *g, uint64_t *bid, uint32_t *slot)
{
    ctl_worker *w = g->w;
    if (ctl_should_stop(w) || ctl_stop_claiming(w))
        return -1;
    if (ctl_paused(w)) {
        worker_idle(g->wk);
        return 0;
    }
    /* fast mode: any pending batch; deterministic: the lowest pending one inside the
     * window after the drafter's low-water mark (docs/ledger.md) */
    int rc = ledger_claim(g->L, (uint16_t)w->id, w->incarnation, ctl_claim_window(w), bid);
    if (rc == -ENODATA) {
        if (ledger_epoch_done(g->L))
            return -1;
        worker_idle(g->wk); /* batches may come back (rewind, reclaim) */
        return 0;
    }
    DF_CHECK_ERR(rc);
    rc = worker_acquire_free(g->wk, g->out, g->produced, slot); /* back-pressure: the only wait of the target */
    if (rc == -EPIPE) { /* ring closed: the run is shutting down; hand the claim back */
        DF_CHECK_ERR(ledger_reclaim_owner(g->L, (uint16_t)w->id));
        return -1;
    }
    DF_CHECK_ERR(rc);
    handoff_end in_end = {.r = NULL, .token = *bid}, out_end = {.r = g->out, .slot = *slot};
    DF_CHECK_ERR(handoff_begin(g->H, (uint16_t)w->id, w->incarnation, &in_end, &out_end));
    return 1;
}

/* Batch bid's header, tokens and loss mask (its samples packed into one row) at off of the
 * slot, or in the backend's host buffer; returns it. */
static batch_header *pack_batch(tgt *g, uint64_t bid, uint64_t off)
{
    const topo *t = g->t;
    const uint32_t *sidx;
    uint32_t ns;
    DF_CHECK_ERR(ledger_batch_samples(g->L, bid, &sidx, &ns));
    if (ns > BATCH_MAX_DOCS)
        df_die(DF_EXIT_PERM, "batch %llu has %u samples, more than %d", (unsigned long long)bid, ns, BATCH_MAX_DOCS);
    batch_header *b = backend_meta_buffer(g->m, g->A, off); /* the slot (cpu) or a host buffer (cuda) */
    memset(b, 0, sizeof *b);
    b->magic = BATCH_MAGIC;
    b->version = BATCH_VERSION;
    b->kind = BATCH_KIND_TP;
    b->feat_dtype = backend_feat_dtype(g->m);
    b->batch_id = bid;
    b->n_docs = ns;
    b->n_capture = (uint32_t)t->n_capture;
    b->d = (uint32_t)g->d;
    uint32_t T = 0;
    for (uint32_t k = 0; k < ns; k++) {
        uint32_t len = DF_MIN(dataset_sample_len(g->ds, sidx[k]), t->max_seq_len);
        b->sample_idx[k] = sidx[k];
        b->doc_starts[k] = (int32_t)T;
        T += len;
    }
    b->doc_starts[ns] = (int32_t)T;
    b->T = T;
    if (T > t->token_budget || batch_layout(b) > g->slot_bytes)
        df_die(DF_EXIT_PERM, "batch %llu: %u tokens do not fit the slot", (unsigned long long)bid, T);
    int32_t *tok = batch_tokens(b);
    uint8_t *msk = batch_mask(b);
    for (uint32_t k = 0; k < ns; k++) {
        const uint32_t *doc_tok;
        const uint8_t *doc_mask;
        uint32_t len;
        DF_CHECK_ERR(dataset_sample(g->ds, sidx[k], &doc_tok, &doc_mask, &len));
        uint32_t n = (uint32_t)(b->doc_starts[k + 1] - b->doc_starts[k]);
        for (uint32_t i = 0; i < n; i++) {
            tok[b->doc_starts[k] + i] = (int32_t)doc_tok[i];
            msk[b->doc_starts[k] + i] = doc_mask[i];
        }
    }
    b->checksum = batch_checksum(b);
    return b;
}

/* Batch bid through the target into slot, then published and marked in the ledger. */
static void produce(tgt *g, uint64_t bid, uint32_t slot)
{
    ctl_worker *w = g->w;
    char err[1024];
    uint64_t off = (uint64_t)slot * g->slot_bytes;
    batch_header *b = pack_batch(g, bid, off);
    uint32_t T = b->T, ns = b->n_docs;
    int rc = backend_forward(g->m, g->A, off, b, err, sizeof err);
    if (rc == -ERANGE)
        name_bad_token(b, g->ds, g->t, backend_vocab(g->m), err, sizeof err);
    if (rc < 0) /* bad token: bad data, do not retry */
        df_die(rc == -ERANGE || rc == -EINVAL ? DF_EXIT_PERM : DF_EXIT_TEMP, "%s", err);

    ring_desc *desc = ring_desc_at(g->out, slot);
    memset(desc, 0, sizeof *desc);
    desc->batch_id = bid;
    desc->offset = off;
    desc->bytes = b->total_bytes;
    desc->dims[0] = T;
    desc->dims[1] = ns;
    desc->checksum = b->checksum;
    DF_CHECK_ERR(handoff_publish(g->H, (uint16_t)w->id, w->incarnation, g->out, slot));
    rc = ledger_set_in_ring(g->L, bid); /* -EALREADY: the drafter already took and marked it */
    if (rc != -EALREADY)
        DF_CHECK_ERR(rc);
    DF_CHECK_ERR(handoff_finish(g->H, (uint16_t)w->id, w->incarnation, NULL, 0));
    g->produced++;
    stage_count(&g->wk->st, 1, T);
    stage_busy(&g->wk->st);
}

int main(int argc, char **argv)
{
    if (worker_help(argc, argv, usage))
        return 0;
    static worker_ctx wk;
    DF_CHECK_ERR(worker_start(&wk, "target_worker", argc, argv));
    tgt g = {.wk = &wk, .w = &wk.ctl, .t = &wk.ctl.topo};
    open_target(&g);
    for (;;) {
        worker_tick(&wk, g.produced);
        uint64_t bid;
        uint32_t slot;
        int c = claim(&g, &bid, &slot);
        if (c < 0)
            break;
        if (c > 0)
            produce(&g, bid, slot);
    }
    worker_finish(&wk);
    df_log("done: %llu batches, %llu tokens, busy %.1fs, waiting %.1fs", (unsigned long long)g.produced,
           (unsigned long long)wk.st.tokens_total, wk.st.busy_total_s, wk.st.wait_total_s);
    dataset_close(g.ds);
    backend_close(g.m);
    worker_close(&wk);
    return DF_EXIT_OK;
}
