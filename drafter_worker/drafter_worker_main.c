/* drafter_worker: trains the DFlash drafter on PD batches. One optimizer step per batch:
 * every document of the batch is one sequence (its context features, tokens and anchors);
 * the loss (drafter.loss: the decay or the D-PACE objective, docs/dflash_spec.md) is
 * normalised over the whole batch, gradients summed over documents,
 * then AdamW with clipping and the warmup + cosine schedule. Every checkpoint_every steps
 * (and on `dfctl checkpoint`, and at the end) rank 0 writes a checkpoint and tells the
 * orchestrator, which commits the ledger up to that step.
 *
 * Data parallel: R drafter workers (topology ranks 0..R-1) are one group. Each step every
 * rank contributes one batch (or nothing, near the end of the epoch), the gradients are
 * summed over the ranks (trainer_step; cpu: buckets handed to the orchestrator's shm
 * segment while the backward runs, grad_buckets.h; cuda: one NCCL all-reduce) and every rank applies the same AdamW update, so all hold the same weights bit
 * for bit. Rank 0 alone writes checkpoints, the export and the summary. Each iteration the
 * ranks first agree (a small all-reduce of flags) on who has a batch and whether to stop,
 * so they always run the same number of steps and leave the loop together.
 *
 * Which batch: fast mode takes any READY slot of the input ring. Deterministic mode
 * ("deterministic": true) trains batches in plan order: at each step rank 0 names the R
 * lowest open batch ids (ledger_next_open: not yet trained or poisoned), rank r waits for
 * the r-th one's slot (ring_acquire_ready_batch); with one rank that is the low-water
 * mark. Together with the targets' claim window and the orchestrator's restart of the whole
 * pipeline after a drafter death, a run with kills ends with the same bytes as a clean one
 * (docs/ledger.md, "Deterministic mode").
 *
 * Exactly once: a rank marks its batch trained at the step that consumes it, under a
 * hand-off intent (input = the ring slot, output = the ledger mark), BEFORE the gradient
 * all-reduce of that step, so when rank 0 checkpoints after step s every batch of step s is
 * marked and the commit covers it. If any rank dies the orchestrator restarts the whole
 * group from the last checkpoint and rewinds the ledger to it: every batch trained after
 * that checkpoint is produced and trained again, once.
 *
 * At the end of the epoch: rank 0 writes a final checkpoint, the release-format export in
 * <run_dir>/drafter, and <run_dir>/train_summary.json; every rank writes a "final" metrics
 * line with a hash of its weights and optimizer state (the ranks must agree). */
#include "drafter_worker/trainer.h"
#include "io/batch.h"
#include "io/batch_view.h"
#include "io/metrics.h"
#include "io/metrics_keys.h"
#include "io/stage.h"
#include "proc/worker.h"
#include "util.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

static const char usage[] =
    "usage: drafter_worker   (started by the orchestrator, not by hand)\n"
    "The DFlash pipeline's training stage: PD batches -> forward/backward -> AdamW ->\n"
    "checkpoints (run_dir/checkpoints) -> release export (run_dir/drafter).\n"
    "Reads DF_CTL_FD, DF_WORKER, DF_WORKER_ID, DF_INCARNATION, DF_RUN_DIR (common/proc/ctl.h).\n";

/* A control all-reduce waits for the slowest rank, which may itself be waiting for its
 * batch (a target restarting). A dead or hung peer is noticed by the orchestrator, which
 * aborts the segment (-ECANCELED); this bound only catches what nobody noticed. */
#define CONTROL_TIMEOUT_NS (600ll * 1000000000ll)
#define NO_BATCH UINT64_MAX

typedef struct drafter {
    worker_ctx *wk; /* the worker skeleton: control connection, metrics, stage figures */
    ctl_worker *w;  /* &wk->ctl */
    trainer tr;
    char ckpt_root[1200];
    ledger *L;
    ring *in;
    arena *A;
    uint64_t slot_bytes;
    handoff_table *H;
    batch_view view;
    int det, rank, R;
    allreduce_comm ar;                             /* world R > 1 only */
    atomic_int in_collective;                      /* 1 while waiting for the peers: the helper thread heartbeats */
    _Atomic uint64_t hb_step, hb_items, hb_tokens; /* what it reports meanwhile */
    atomic_int hb_quit;
    pthread_t hb_thread;
    int hb_started;
    ckpt_writer cw;            /* rank 0: the checkpoint being written beside training */
    long saved_step;           /* the last checkpoint written and announced by this incarnation (-1: none) */
    uint32_t ckpt_fail_consec; /* failed checkpoints in a row */
    uint64_t pruned_at;        /* the acknowledged step of the last prune */
    uint64_t sent_step;        /* the last checkpoint this incarnation reported */
    uint32_t nonfinite_consec; /* steps in a row with a NaN/Inf loss or gradient norm */
} drafter;

/* DF_FAULT_STEP_DELAY_MS=N (0..60000): sleep N ms after every step. Tests set it on a tiny
 * run so that an operator's kill lands while the run is still going on a loaded machine; the
 * math is unchanged. A malformed value is an error, never ignored. */
static long step_delay_ms(void)
{
    static long ms = -1;
    if (ms < 0) {
        const char *v = getenv("DF_FAULT_STEP_DELAY_MS");
        long long x = 0;
        if (v && df_parse_int(v, 0, 60000, &x) < 0)
            df_die(DF_EXIT_PERM, "DF_FAULT_STEP_DELAY_MS=%s: expected milliseconds 0..60000", v);
        ms = (long)x;
        if (ms > 0)
            df_log("fault injection (DF_FAULT_STEP_DELAY_MS=%ld): every step is followed by a sleep", ms);
    }
    return ms;
}

/* A step with a NaN/Inf loss or gradient norm updated nothing (trainer_step skips it): count
 * it (metrics "nonfinite_steps", the summary), log it, and after
 * drafter.max_nonfinite_steps in a row stop for good: training is not going anywhere and a
 * restart would only repeat it. Every rank sees the same reduced gradient norm, so the
 * ranks of a group count alike and stop at the same step. */
static int check_finite(drafter *d, double loss, const adamw_info *info, uint64_t batch)
{
    trainer *tr = &d->tr;
    uint32_t max = d->w->topo.drafter.max_nonfinite_steps;
    if (isfinite(loss) && isfinite(info->grad_norm) && !info->skipped) {
        d->nonfinite_consec = 0;
        return 0;
    }
    tr->nonfinite_steps++;
    d->nonfinite_consec++;
    df_log("step %ld: non-finite loss %g / gradient norm %g (batch %lld): no update (%u in a row, limit %u)",
           tr->ts.step, loss, info->grad_norm, batch == NO_BATCH ? -1LL : (long long)batch, d->nonfinite_consec, max);
    return 1;
}

static void checkpoint_collect(drafter *d, int wait);

/* After the step's metrics line is written (so the metrics show the last count). */
static void nonfinite_stop(drafter *d, double loss, const adamw_info *info)
{
    trainer *tr = &d->tr;
    uint32_t max = d->w->topo.drafter.max_nonfinite_steps;
    if (d->nonfinite_consec < max)
        return;
    /* a checkpoint still being written (of a step whose weights the skipped steps left as
     * they were) is finished and announced first, so the stop loses nothing it holds */
    checkpoint_collect(d, 1);
    char ck[96] = "no checkpoint was written yet";
    if (d->saved_step > 0)
        snprintf(ck, sizeof ck, "the last checkpoint (step %ld) is intact", d->saved_step);
    df_die(DF_EXIT_PERM,
           "step %ld: %u steps in a row with a non-finite loss or gradient norm "
           "(drafter.max_nonfinite_steps %u; last: loss %g, gradient norm %g); the weights were not updated at "
           "those steps and %s. Likely causes: a learning rate too high (drafter.lr %g), bad features from the "
           "target (NaN/Inf in its weights or activations), or bad input data",
           tr->ts.step, d->nonfinite_consec, max, loss, info->grad_norm, ck, d->w->topo.drafter.lr);
}

static void heartbeat(void *arg)
{
    drafter *d = arg; /* a step may take seconds on the CPU */
    worker_heartbeat(d->wk, (uint64_t)d->tr.ts.step);
}

/* A failed checkpoint leaves the previous one intact, so training goes on and the next
 * save retries; the orchestrator counts each failure (dfctl status). A disk that stays
 * full would otherwise only fail the run at the final export, after all the training
 * since the last good checkpoint was done for nothing: after
 * drafter.max_checkpoint_failures in a row the drafter stops for good (exit 100) naming
 * the directory and the error, so the operator hears of it within a few checkpoints. */
static void checkpoint_failed(drafter *d, long step, int rc, const char *err)
{
    const topo *t = &d->w->topo;
    d->ckpt_fail_consec++;
    df_log("checkpoint at step %ld failed (%u in a row, limit %u): %s", step, d->ckpt_fail_consec,
           t->drafter.max_checkpoint_failures, err);
    json_t *ev = json_pack("{s:s, s:I, s:s, s:i, s:i}", "ev", "checkpoint_failed", "step", (json_int_t)step, "error",
                           err, "errno", -rc, "consecutive", (int)d->ckpt_fail_consec);
    char *txt = ev ? json_dumps(ev, JSON_COMPACT) : NULL;
    json_decref(ev);
    if (txt)
        (void)ctl_send(d->w, txt); /* best effort: the count is a report, not the policy */
    free(txt);
    if (d->ckpt_fail_consec >= t->drafter.max_checkpoint_failures)
        df_die(DF_EXIT_PERM,
               "%s: %u checkpoints in a row failed (drafter.max_checkpoint_failures %u), "
               "last: %s (%s); the last good checkpoint is intact: free space or fix %s, then "
               "orchestrator --resume",
               d->ckpt_root, d->ckpt_fail_consec, t->drafter.max_checkpoint_failures, strerror(-rc), err, d->ckpt_root);
}

/* The result of the checkpoint being written, once it is done (wait: wait for it, with
 * heartbeats). Only a checkpoint whose files and `latest` are on disk is announced: the
 * orchestrator then commits the batches trained up to its step. A metrics line
 * "checkpoint" records what it cost the loop (snapshot, waiting) and the thread (write). */
static void checkpoint_collect(drafter *d, int wait)
{
    ckpt_result r;
    if (!ckpt_writer_collect(&d->cw, wait, heartbeat, d, &r))
        return;
    metrics_line ml;
    metrics_begin(&ml, &d->wk->mw, "checkpoint");
    metrics_int(&ml, "step", r.step);
    metrics_int(&ml, "ok", r.rc == 0);
    metrics_int(&ml, "async", d->w->topo.drafter.checkpoint_async);
    metrics_int(&ml, "at_step", d->tr.ts.step); /* the step training had reached when it was collected */
    metrics_num(&ml, "snapshot_s", r.snap_s);
    metrics_num(&ml, "write_s", r.write_s);
    metrics_num(&ml, "wait_s", r.wait_s);
    metrics_end(&ml);
    if (r.rc < 0) {
        checkpoint_failed(d, r.step, r.rc, r.err);
        return;
    }
    df_log("checkpoint step %ld written in %.2f s (snapshot %.2f s, training waited %.2f s for it)", r.step, r.write_s,
           r.snap_s, r.wait_s);
    d->ckpt_fail_consec = 0;
    d->saved_step = r.step;
    d->sent_step = (uint64_t)r.step;
    DF_CHECK_ERR(ctl_send_checkpoint(d->w, d->sent_step));
}

/* Checkpoint the current step: the previous write is collected first (one at a time),
 * then this one is started on the writer thread, or written before returning with
 * drafter.checkpoint_async false. A step already written is announced again, not written
 * again (a re-save of step N would have to move the old step-N aside, and a death between
 * the two renames would leave no step-N for a moment). */
static void save_checkpoint(drafter *d)
{
    char err[768];
    checkpoint_collect(d, 1);
    if (d->tr.ts.step == d->saved_step) {
        DF_CHECK_ERR(ctl_send_checkpoint(d->w, (uint64_t)d->saved_step));
        return;
    }
    int rc = trainer_save_start(&d->tr, &d->cw, d->ckpt_root, err, sizeof err);
    if (rc < 0) {
        checkpoint_failed(d, d->tr.ts.step, rc, err);
        return;
    }
    if (!d->w->topo.drafter.checkpoint_async)
        checkpoint_collect(d, 1);
    else
        df_log("checkpoint step %ld: writing beside training", d->tr.ts.step);
}

/* Delete checkpoints beyond drafter.keep_checkpoints, but only below the step the
 * orchestrator acknowledged as committed AND persisted in ledger.bin: that is the one a
 * --resume loads (and a group restart rewinds to), so it and everything newer stay. */
static void prune_checkpoints(drafter *d)
{
    uint32_t keep = d->w->topo.drafter.keep_checkpoints;
    uint64_t ack = ctl_committed_ack(d->w);
    if (keep == 0 || ack <= d->pruned_at)
        return;
    d->pruned_at = ack;
    char err[512];
    int n = dflash_ckpt_prune(d->ckpt_root, keep, (long)ack, err, sizeof err);
    if (n < 0)
        df_log("pruning old checkpoints: %s", err); /* disk use only: training goes on */
    else if (n > 0)
        df_log("pruned %d old checkpoint%s (keep %u, committed step %llu)", n, n > 1 ? "s" : "", keep,
               (unsigned long long)ack);
}

/* At the end: give the orchestrator a moment to acknowledge the final checkpoint, so the
 * run leaves exactly keep_checkpoints behind. Not waiting would only leave one more. */
static void final_prune(drafter *d)
{
    uint64_t want = (uint64_t)d->tr.ts.step, t0 = df_now_ns();
    while (d->w->topo.drafter.keep_checkpoints && d->sent_step == want && ctl_committed_ack(d->w) < want &&
           df_now_ns() - t0 < 5000000000ull) {
        worker_heartbeat(d->wk, want);
        usleep(10000);
    }
    prune_checkpoints(d);
}

/* While this rank waits in a control all-reduce it is not hung: its peer is (and the
 * orchestrator watches that one). The thread heartbeats only during those waits, so a rank
 * stuck anywhere else still misses its heartbeats and is killed. */
static void *hb_main(void *arg)
{
    drafter *d = arg;
    while (!atomic_load(&d->hb_quit)) {
        if (atomic_load(&d->in_collective))
            ctl_heartbeat(d->w, atomic_load(&d->hb_step), atomic_load(&d->hb_items), atomic_load(&d->hb_tokens));
        usleep(200000);
    }
    return NULL;
}

/* Sum v[0..n) over the ranks (exact for the small integers it carries). */
static void collective(drafter *d, float *v, size_t n)
{
    if (d->R <= 1)
        return;
    atomic_store(&d->hb_step, (uint64_t)d->tr.ts.step);
    atomic_store(&d->hb_items, d->wk->st.items_total);
    atomic_store(&d->hb_tokens, d->wk->st.tokens_total);
    atomic_store(&d->in_collective, 1);
    char err[400];
    int rc = allreduce_sum(&d->ar, v, n, CONTROL_TIMEOUT_NS, err, sizeof err);
    atomic_store(&d->in_collective, 0);
    if (rc < 0) /* a peer died (the orchestrator restarts the group) or the group broke */
        df_die(DF_EXIT_TEMP, "control all-reduce (rank %d of %d): %s", d->rank, d->R, err);
}

static int all_trained(ledger *L)
{
    ledger_counts_t lc;
    ledger_counts(L, &lc);
    return lc.pending + lc.claimed + lc.in_ring == 0; /* every batch trained, committed or poisoned */
}

/* What one iteration found. */
typedef struct pick {
    int has;     /* this rank holds a slot: *slot */
    int can_end; /* no batch and none will come: epoch trained, ring closed and empty, or stop */
    int stop;    /* SIGTERM or the run's stop flag */
    uint32_t slot;
} pick;

/* Deterministic mode: which batch each rank trains this step. Rank 0 names the R lowest
 * open ids and the others learn theirs from the sum (the others contribute zeros; ids are
 * sent as id + 1 < 2^24, exact in float). Also agrees on stop. NO_BATCH: none for us. */
static uint64_t det_assign(drafter *d, int stop, int paused, int *stop_any)
{
    float v[1 + ALLREDUCE_MAX_WORLD];
    memset(v, 0, sizeof v);
    v[0] = (float)stop;
    if (d->rank == 0 && !stop && !paused) {
        uint64_t ids[ALLREDUCE_MAX_WORLD];
        uint32_t n = ledger_next_open(d->L, (uint32_t)d->R, ids);
        for (uint32_t r = 0; r < n; r++)
            v[1 + r] = (float)(ids[r] + 1);
    }
    collective(d, v, (size_t)(1 + d->R));
    *stop_any = v[0] > 0;
    return v[1 + d->rank] > 0 ? (uint64_t)v[1 + d->rank] - 1 : NO_BATCH;
}

/* Deterministic mode: wait for batch `want`'s READY slot. Gives up (no batch this step)
 * when the batch gets poisoned, the ring is closed without it, or we are told to stop. */
static void det_acquire(drafter *d, uint64_t want, pick *p)
{
    ctl_worker *w = d->w;
    for (;;) {
        int rc = ring_acquire_ready_batch(d->in, (uint16_t)w->id, w->incarnation, want, WORKER_WAIT_NS, &p->slot);
        if (rc == 0) {
            p->has = 1;
            return;
        }
        if (rc == -EPIPE) { /* closed (shutdown) and the batch never came */
            p->can_end = 1;
            return;
        }
        if (rc != -ETIMEDOUT)
            DF_CHECK_ERR(rc);
        worker_tick(d->wk, (uint64_t)d->tr.ts.step);
        if (ctl_should_stop(w)) {
            p->stop = p->can_end = 1;
            return;
        }
        ledger_batch_status bs;
        if (ledger_batch_status_get(d->L, want, &bs) == 0 && bs.state == LEDGER_POISONED)
            return; /* a consumer upstream failed it max_attempts times: skip it */
    }
}

static void fast_acquire(drafter *d, pick *p)
{
    int rc = worker_acquire_ready(d->wk, d->in, &p->slot);
    if (rc == 0)
        p->has = 1;
    else if (rc == -EPIPE)
        p->can_end = 1; /* closed and drained: upstream is gone */
    else if (rc == -ETIMEDOUT)
        p->can_end = all_trained(d->L);
    else
        DF_CHECK_ERR(rc);
}

/* Train the batch in p->slot: mark it, step, release it, log it. */
static void train_batch(drafter *d, const pick *p, uint64_t want)
{
    ctl_worker *w = d->w;
    trainer *tr = &d->tr;
    char err[1024];
    const ring_desc *rd = ring_desc_at(d->in, p->slot);
    batch_header *b;
    if (batch_view_read(&d->view, d->A, rd->offset, d->slot_bytes, BATCH_KIND_PD, &b, err, sizeof err) < 0)
        df_die(DF_EXIT_TEMP, "input slot %u: %s", p->slot, err); /* retried, then poisoned */
    if (want != NO_BATCH && b->batch_id != want)
        df_die(DF_EXIT_TEMP, "input slot %u: descriptor says batch %llu, the batch header %llu", p->slot,
               (unsigned long long)want, (unsigned long long)b->batch_id);
    uint64_t bid = b->batch_id;
    uint32_t T = b->T, n_docs = b->n_docs;
    handoff_end ie = {.r = d->in, .slot = p->slot}, oe = {.r = NULL, .token = bid};
    DF_CHECK_ERR(handoff_begin(d->H, (uint16_t)w->id, w->incarnation, &ie, &oe));
    /* marked before the step's all-reduce (see the top of the file); a death from here on
     * loses the step, and the group restart rewinds this mark with the others */
    DF_CHECK_ERR(ledger_mark_trained(d->L, bid, (uint64_t)tr->ts.step + 1));
    DF_CHECK_ERR(handoff_mark_published(d->H, (uint16_t)w->id));

    dflash_stats s;
    adamw_info info;
    double t0 = df_wall_s();
    int rc = trainer_step(tr, b, (const char *)d->A->base + rd->offset, d->R > 1 ? &d->ar : NULL, heartbeat, d, &s,
                          &info, err, sizeof err);
    if (rc < 0)
        df_die(rc == -EINVAL ? DF_EXIT_PERM : DF_EXIT_TEMP, "step %ld: %s", tr->ts.step + 1, err);
    double step_s = df_wall_s() - t0; /* the step itself: forward, backward, reduction, update */
    DF_CHECK_ERR(handoff_finish(d->H, (uint16_t)w->id, w->incarnation, d->in, p->slot));
    stage_count(&d->wk->st, 1, T);
    stage_busy(&d->wk->st);

    int nonfinite = check_finite(d, s.loss, &info, bid);
    trainer_record(tr, &s);
    metrics_line ml;
    metrics_begin(&ml, &d->wk->mw, "step");
    metrics_int(&ml, "step", tr->ts.step);
    metrics_u64(&ml, "batch", bid);
    /* loss and lr: figures the orchestrator shows, named in io/metrics_keys.h */
    metrics_num(&ml, metrics_keys[METRICS_KEY_LOSS].key, s.loss);
    for (int k = 1; k < tr->cfg.block_size; k++) { /* accuracy at each block position: acc1 .. acc<B-1> */
        char key[16];
        snprintf(key, sizeof key, "acc%d", k);
        metrics_num(&ml, key, dflash_stats_acc(&s, k));
    }
    metrics_num(&ml, "tau", dflash_stats_tau(&s, tr->cfg.block_size));
    metrics_num(&ml, metrics_keys[METRICS_KEY_LR].key, info.lr);
    metrics_num(&ml, "grad_norm", info.grad_norm);
    metrics_num(&ml, "step_s", step_s);
    metrics_num(&ml, "tok_s", step_s > 0 ? T / step_s : 0.0); /* this rank's tokens over its step time */
    metrics_int(&ml, "tokens", T);
    metrics_int(&ml, "docs", n_docs); /* samples trained by this step (report.py's samples/s) */
    metrics_int(&ml, "nonfinite", nonfinite);
    metrics_int(&ml, "nonfinite_steps", tr->nonfinite_steps);
    /* each block position's share of this step's loss weight (decay: fixed; dpace: from the
     * drafter's confidence), positions 1..B-1, summing to 1 */
    double wpos[DFLASH_MAX_BLOCK];
    dflash_stats_wpos(&s, tr->cfg.block_size, wpos);
    metrics_nums(&ml, "w_pos", wpos, tr->cfg.block_size - 1);
    if (d->R > 1 && tr->ops->bucketed) { /* the bucketed reduction: what the backward did not hide */
        metrics_num(&ml, "allreduce_wait_ms", (double)tr->allreduce_wait_ns * 1e-6);
        metrics_int(&ml, "allreduce_buckets_overlapped", tr->allreduce_early);
    }
    metrics_end(&ml);
    nonfinite_stop(d, s.loss, &info);
    if (step_delay_ms() > 0) {
        struct timespec ts = {step_delay_ms() / 1000, (step_delay_ms() % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
        }
    }
}

/* A rank without a batch this step still takes part in the reduction and the update. */
static void empty_step(drafter *d)
{
    char err[512];
    adamw_info info;
    int rc = trainer_step_empty(&d->tr, &d->ar, &info, err, sizeof err);
    if (rc < 0)
        df_die(rc == -ENOTSUP ? DF_EXIT_PERM : DF_EXIT_TEMP, "step %ld (no batch on this rank): %s", d->tr.ts.step + 1,
               err);
    int nonfinite = check_finite(d, 0.0, &info, NO_BATCH);
    metrics_line ml;
    metrics_begin(&ml, &d->wk->mw, "empty_step");
    metrics_int(&ml, "step", d->tr.ts.step);
    metrics_num(&ml, "grad_norm", info.grad_norm);
    metrics_int(&ml, "nonfinite", nonfinite);
    metrics_int(&ml, "nonfinite_steps", d->tr.nonfinite_steps);
    metrics_end(&ml);
    nonfinite_stop(d, 0.0, &info);
    stage_busy(&d->wk->st);
}

/* A hash of everything the ranks must agree on: weights, AdamW moments, step. */
static uint64_t state_hash(const trainer *tr)
{
    uint64_t h = df_fnv1a64(tr->p.data, tr->p.n * sizeof(float), 0);
    h = df_fnv1a64(tr->opt.m, tr->opt.n * sizeof(float), h);
    h = df_fnv1a64(tr->opt.v, tr->opt.n * sizeof(float), h);
    return df_fnv1a64(&tr->ts.step, sizeof tr->ts.step, h);
}

static void setup_group(drafter *d)
{
    ctl_worker *w = d->w;
    const topo *t = &w->topo;
    d->R = topology_n_drafters(t);
    d->rank = w->self->rank < 0 ? 0 : w->self->rank;
    d->det = t->deterministic;
    if (d->det && d->R > 1 && ctl_claim_window(w) < (uint32_t)d->R)
        df_die(DF_EXIT_PERM,
               "%s: deterministic mode with %d drafter ranks needs every ring to have at least %d "
               "slots (the R batches of a step must fit at once; docs/ledger.md)",
               t->source_path, d->R, d->R);
    allreduce_comm_init(&d->ar);
    if (d->R <= 1)
        return;
    int rc;
    char err[400];
    if (t->backend != TOPOLOGY_CPU) { /* NCCL across the ranks' GPUs, id from the orchestrator */
        if (!w->has_nccl_id)
            df_die(DF_EXIT_PERM, "%s: %d cuda drafter ranks: no NCCL unique id in the hello", t->source_path, d->R);
        rc = allreduce_open_nccl(&d->ar, w->nccl_id, d->rank, d->R, w->self->gpu, err, sizeof err);
        if (rc < 0) /* a peer that never arrives: -ETIMEDOUT; the orchestrator restarts the group */
            df_die(DF_EXIT_TEMP, "NCCL: rank %d of %d on GPU %d: %s", d->rank, d->R, w->self->gpu, err);
    } else {
        uint64_t bytes;
        void *seg = ctl_allreduce_segment(w, &bytes);
        if (!seg)
            df_die(DF_EXIT_PERM, "%s: %d drafter ranks: no all-reduce segment in the hello", t->source_path, d->R);
        rc = allreduce_open_shm(&d->ar, seg, bytes, d->rank, d->R, err, sizeof err);
        if (rc < 0) /* e.g. -EBUSY: the segment was not re-formatted for this group: restart */
            df_die(DF_EXIT_TEMP, "all-reduce: rank %d of %d: %s", d->rank, d->R, err);
    }
    if ((rc = pthread_create(&d->hb_thread, NULL, hb_main, d)) != 0)
        df_die(DF_EXIT_TEMP, "heartbeat thread: %s", strerror(rc));
    d->hb_started = 1;
}

/* The drafter's start: tidy what an earlier incarnation's interrupted checkpoint left,
 * then the trainer from the committed checkpoint (a restart), drafter.init_dir or a fresh
 * init. */
static void open_trainer(drafter *d, long total_steps)
{
    ctl_worker *w = d->w;
    trainer *tr = &d->tr;
    char err[1024], path[1300];
    snprintf(d->ckpt_root, sizeof d->ckpt_root, "%s/checkpoints", w->run_dir);
    ckpt_writer_init(&d->cw);
    d->saved_step = -1;
    if (d->rank == 0) { /* the previous incarnation may have died while writing one */
        int n = dflash_ckpt_remove_partial(d->ckpt_root, err, sizeof err);
        if (n < 0)
            df_log("tidying %s: %s", d->ckpt_root, err); /* disk use only: the checkpoints themselves are intact */
        else if (n > 0)
            df_log("tidied %d entr%s an interrupted checkpoint left in %s", n, n > 1 ? "ies" : "y", d->ckpt_root);
    }
    const char *resume = NULL;
    if (w->committed_step > 0) { /* restart: continue from the checkpoint the ledger committed */
        snprintf(path, sizeof path, "%.1199s/step-%08llu", d->ckpt_root, (unsigned long long)w->committed_step);
        resume = path;
    }
    int rc = trainer_open(tr, &w->topo, w->self->gpu, total_steps, resume, err, sizeof err);
    if (rc < 0) /* -EBADMSG: the committed checkpoint fails validation; a restart cannot fix it */
        df_die(rc == -EINVAL || rc == -ENOENT || rc == -ENOTSUP || rc == -EBADMSG ? DF_EXIT_PERM : DF_EXIT_TEMP, "%s",
               err);
    if (resume && tr->ts.step != (long)w->committed_step) /* the dir name is checked too: belt and braces */
        df_die(DF_EXIT_PERM, "resume: %s/trainer_state.json: step %ld, but the ledger's committed step is %llu", resume,
               tr->ts.step, (unsigned long long)w->committed_step);
    if (resume) {
        df_log("resumed from %s (step %ld)", resume, tr->ts.step);
        d->saved_step = tr->ts.step; /* on disk already: not written again */
    }
    tr->ts.epoch = (long)ledger_epoch(d->L); /* recorded in the checkpoints of this epoch */
}

/* The input ring, ready to the orchestrator, the TensorBoard events, the ready line. */
static void get_ready(drafter *d, long total_steps)
{
    ctl_worker *w = d->w;
    const trainer *tr = &d->tr;
    char err[1024], path[1300];
    worker_ring ri;
    DF_CHECK_ERR(worker_ring_in(d->wk, &ri));
    d->in = ri.r;
    d->A = ri.A;
    d->slot_bytes = ri.slot_bytes;
    d->H = ctl_handoff(w);
    DF_CHECK_ERR(worker_ready(d->wk, d->in, NULL));
    /* the metrics lines with a step also go to TensorBoard event files; a new file per
     * incarnation, whose START marker drops the steps a resumed run redoes (io/tfevents.h) */
    snprintf(path, sizeof path, "%s/tensorboard/%s", w->run_dir, w->name);
    if (metrics_open_tfevents(&d->wk->mw, path, 1, err, sizeof err) < 0)
        df_log("no TensorBoard events: %s", err); /* the JSONL metrics go on */
    df_log("ready: %s drafter %d layers d=%d, %zu trainable params, block %d, %ld steps planned, epoch %u of %u, "
           "rank %d of %d, %s mode",
           tr->ops->name, tr->cfg.n_layers, tr->cfg.hidden, tr->p.n, tr->cfg.block_size, total_steps,
           ledger_epoch(d->L), DF_MAX(w->topo.drafter.epochs, 1u), d->rank, d->R, d->det ? "deterministic" : "fast");
}

/* One round of the loop: checkpoints due, a batch picked (or none), the ranks agree, one
 * step trained (or an empty one). 1 when the loop is over. */
static int train_round(drafter *d)
{
    ctl_worker *w = d->w;
    trainer *tr = &d->tr;
    worker_tick(d->wk, (uint64_t)tr->ts.step);
    if (d->rank == 0)
        checkpoint_collect(d, 0); /* announce the one written beside the last steps, if done */
    if (d->rank == 0 && ctl_checkpoint_requested(w))
        save_checkpoint(d);
    if (d->rank == 0)
        prune_checkpoints(d);
    pick p = {0};
    p.stop = ctl_should_stop(w);
    int paused = ctl_paused(w), stop_any = p.stop;
    uint64_t want = NO_BATCH;
    if (d->det) {
        if (d->R > 1)
            want = det_assign(d, p.stop, paused, &stop_any);
        else if (!p.stop && !paused && (want = ledger_low_water(d->L)) >= ledger_n_batches(d->L))
            want = NO_BATCH;
    }
    /* deterministic: a named batch is always fetched (rank 0's pause already decided) */
    if (p.stop || stop_any)
        p.can_end = 1;
    else if (d->det && want != NO_BATCH)
        det_acquire(d, want, &p);
    else if (paused)
        ;
    else if (!d->det)
        fast_acquire(d, &p);
    else
        p.can_end = all_trained(d->L);
    stage_wait(&d->wk->st);

    /* agree: how many ranks have a batch, whether all can end, whether any stops */
    float f[3] = {(float)p.has, (float)p.can_end, (float)p.stop};
    collective(d, f, 3);
    stop_any |= f[2] > 0;
    if (f[0] == 0) {
        if (f[1] >= (float)d->R || stop_any)
            return 1;
        if (paused)
            usleep(100000);
        return 0;
    }
    tr->ranks_with_batch = (int)f[0]; /* the gradient is the mean over the batches of this step */
    if (p.has)
        train_batch(d, &p, want);
    else
        empty_step(d);
    if (d->rank == 0 && w->topo.drafter.checkpoint_every && tr->ts.step % (long)w->topo.drafter.checkpoint_every == 0)
        save_checkpoint(d);
    return stop_any;
}

/* After the loop: the last checkpoint on disk and announced, the old ones pruned; after the
 * last epoch the release export and the summary; the state hash the ranks compare. */
static void finish(drafter *d, int last_epoch, uint64_t t_start)
{
    ctl_worker *w = d->w;
    trainer *tr = &d->tr;
    char err[1024], path[1300];
    worker_finish(d->wk);
    if (d->rank == 0) { /* the last one on disk and announced before the export reads the weights */
        checkpoint_collect(d, 1);
        if (tr->ts.step > 0 && tr->ts.step != d->saved_step)
            save_checkpoint(d);
        checkpoint_collect(d, 1);
    }
    if (d->rank == 0 && tr->ts.step > 0)
        final_prune(d);
    /* the last epoch is complete: export, summarise (an earlier epoch only checkpoints: the
     * orchestrator starts the next one with a new ledger) */
    if (d->rank == 0 && !ctl_should_stop(w) && tr->ts.step > 0 && last_epoch) {
        snprintf(path, sizeof path, "%s/drafter", w->run_dir);
        if (trainer_export(tr, path, heartbeat, d, err, sizeof err) < 0)
            df_die(DF_EXIT_TEMP, "export: %s", err);
        if (trainer_write_summary(tr, w->run_dir, (double)(df_now_ns() - t_start) * 1e-9, err, sizeof err) < 0)
            df_die(DF_EXIT_TEMP, "%s", err);
    }
    int rc = trainer_to_host(tr, 1, err, sizeof err);
    if (rc < 0)
        df_die(DF_EXIT_TEMP, "%s", err);
    char hex[24];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)state_hash(tr));
    metrics_line ml;
    metrics_begin(&ml, &d->wk->mw, "final");
    metrics_int(&ml, "step", tr->ts.step);
    metrics_int(&ml, "rank", d->rank);
    metrics_str(&ml, "state_hash", hex);
    metrics_end(&ml);
    df_log("done at step %ld (rank %d of %d, state hash %s): busy %.1fs, waiting %.1fs", tr->ts.step, d->rank, d->R,
           hex, d->wk->st.busy_total_s, d->wk->st.wait_total_s);
}

static void close_drafter(drafter *d)
{
    if (d->hb_started) {
        atomic_store(&d->hb_quit, 1);
        pthread_join(d->hb_thread, NULL);
    }
    allreduce_close(&d->ar);
    batch_view_free(&d->view);
    ckpt_writer_free(&d->cw);
    trainer_close(&d->tr);
    worker_close(d->wk);
}

int main(int argc, char **argv)
{
    if (worker_help(argc, argv, usage))
        return 0;
    static worker_ctx wk;
    DF_CHECK_ERR(worker_start(&wk, "drafter_worker", argc, argv));
    const topo *t = &wk.ctl.topo;
    static drafter dr; /* large (the trainer's statistics); zeroed */
    drafter *d = &dr;
    d->wk = &wk;
    d->w = &wk.ctl;
    d->L = ctl_ledger(d->w);
    setup_group(d);
    /* one LR schedule over every epoch: the orchestrator counts the steps of all the plans
     * (each epoch packs differently); the fallback assumes equal epochs */
    long total_steps = d->w->total_steps > 0
                           ? (long)d->w->total_steps
                           : ((long)ledger_n_batches(d->L) + d->R - 1) / d->R * (long)DF_MAX(t->drafter.epochs, 1u);
    int last_epoch = ledger_epoch(d->L) + 1 >= DF_MAX(t->drafter.epochs, 1u);
    open_trainer(d, total_steps);
    get_ready(d, total_steps);
    uint64_t t_start = df_now_ns();
    while (!train_round(d))
        ;
    finish(d, last_epoch, t_start);
    close_drafter(d);
    return DF_EXIT_OK;
}
