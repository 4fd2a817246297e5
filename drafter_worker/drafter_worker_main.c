/* drafter_worker: trains the DFlash drafter on PD batches. One optimizer step per batch:
 * every document of the batch is one sequence (its context features, tokens and anchors);
 * the loss is normalised by the batch's total weight, gradients summed over documents,
 * then AdamW with clipping and the warmup + cosine schedule. Every checkpoint_every steps
 * (and on `dfctl checkpoint`, and at the end) it writes a checkpoint and tells the
 * orchestrator, which commits the ledger up to that step.
 *
 * Exactly once: a batch is marked trained in the ledger at the step that consumed it, under
 * a hand-off intent (input = the ring slot, output = the ledger mark). If the drafter dies
 * the orchestrator restarts it from the last checkpoint and rewinds the ledger to it: every
 * batch trained after that checkpoint is produced and trained again, once.
 *
 * At the end of the epoch: a final checkpoint, the release-format export in
 * <run_dir>/drafter, and <run_dir>/train_summary.json (loss at start and end, per-position
 * accuracy, expected acceptance length). */
#include "drafter_worker/trainer.h"
#include "io/batch.h"
#include "io/batch_view.h"
#include "io/metrics.h"
#include "io/stage.h"
#include "ipc/ctl.h"
#include "util.h"

#include <unistd.h>

static const char usage[] =
    "usage: drafter_worker   (started by the orchestrator, not by hand)\n"
    "The DFlash pipeline's training stage: PD batches -> forward/backward -> AdamW ->\n"
    "checkpoints (run_dir/checkpoints) -> release export (run_dir/drafter).\n"
    "Reads DF_CTL_FD, DF_WORKER, DF_WORKER_ID, DF_INCARNATION, DF_RUN_DIR (common/ipc/ctl.h).\n";

#define WAIT_NS (200 * 1000000ll)
typedef struct drafter {
    ctl_worker *w;
    trainer tr;
    char ckpt_root[1200];
} drafter;

static void save_checkpoint(drafter *d)
{
    char err[512];
    int rc = trainer_save(&d->tr, d->ckpt_root, err, sizeof err);
    if (rc < 0) {
        /* the previous checkpoint is intact; training goes on and the next save retries */
        df_log("checkpoint at step %ld failed: %s", d->tr.ts.step, err);
        return;
    }
    DF_CHECK_ERR(ctl_send_checkpoint(d->w, (uint64_t)d->tr.ts.step));
}

static void heartbeat(void *arg)
{
    drafter *d = arg; /* a step may take seconds on the CPU */
    ctl_heartbeat(d->w, (uint64_t)d->tr.ts.step, 0, 0);
}

int main(int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs(usage, stdout);
        return 0;
    }
    df_log_init("drafter_worker");
    ctl_worker w;
    DF_CHECK_ERR(ctl_worker_start(&w, argc, argv));
    df_log_init(w.name);
    const topo *t = &w.topo;
    char err[1024], path[2600];
    if (topo_n_drafters(t) != 1)
        df_die(DF_EXIT_PERM, "%s: %d drafter ranks: data-parallel drafter groups are not wired in yet",
               t->source_path, topo_n_drafters(t));

    drafter dr;
    memset(&dr, 0, sizeof dr);
    dr.w = &w;
    trainer *tr = &dr.tr;
    ledger *L = ctl_ledger(&w);
    long total_steps = (long)ledger_n_batches(L) * (long)DF_MAX(t->drafter.epochs, 1u);
    snprintf(dr.ckpt_root, sizeof dr.ckpt_root, "%s/checkpoints", w.run_dir);
    const char *resume = NULL;
    if (w.committed_step > 0) { /* restart: continue from the checkpoint the ledger committed */
        snprintf(path, sizeof path, "%s/step-%08llu", dr.ckpt_root, (unsigned long long)w.committed_step);
        resume = path;
    }
    int rc = trainer_open(tr, t, w.self->gpu, total_steps, resume, err, sizeof err);
    if (rc < 0)
        df_die(rc == -EINVAL || rc == -ENOENT || rc == -ENOTSUP ? DF_EXIT_PERM : DF_EXIT_TEMP, "%s", err);
    if (resume)
        df_log("resumed from %s (step %ld)", resume, tr->ts.step);

    ring *in = ctl_ring_in(&w);
    arena *A = ctl_ring_arena(&w, in);
    uint64_t slot_bytes = ctl_ring_slot_bytes(&w, in);
    DF_CHECK(in && A && A->base);
    batch_view view = {0};
    handoff_table *H = ctl_handoff(&w);
    snprintf(path, sizeof path, "%s/metrics", w.run_dir);
    metrics_writer mw;
    DF_CHECK_ERR(metrics_open(&mw, path, w.name, w.incarnation));
    stage_stats st;
    stage_init(&st, &mw, in, NULL, 1000000000ull);
    DF_CHECK_ERR(ctl_ready(&w));
    df_log("ready: %s drafter %d layers d=%d, %zu trainable params, block %d, %ld steps planned",
           tr->cuda ? "cuda" : "cpu", tr->cfg.n_layers, tr->cfg.hidden, tr->p.n, tr->cfg.block_size, total_steps);

    uint64_t t_start = df_now_ns();
    for (;;) {
        ctl_heartbeat(&w, (uint64_t)tr->ts.step, st.items_total, st.tokens_total);
        stage_tick(&st, 0);
        if (ctl_should_stop(&w))
            break;
        if (ctl_checkpoint_requested(&w))
            save_checkpoint(&dr);
        if (ctl_paused(&w)) {
            usleep(100000);
            stage_wait(&st);
            continue;
        }
        uint32_t slot;
        rc = ring_acquire_ready(in, (uint16_t)w.id, w.incarnation, WAIT_NS, &slot);
        if (rc == -ETIMEDOUT) {
            stage_wait(&st);
            ledger_counts_t lc;
            ledger_counts(L, &lc);
            if (lc.pending + lc.claimed + lc.in_ring == 0)
                break; /* every batch of the epoch is trained (or poisoned) */
            continue;
        }
        stage_wait(&st);
        if (rc == -EPIPE)
            break;
        DF_CHECK_ERR(rc);
        const ring_desc *d = ring_desc_at(in, slot);
        batch_header *b;
        if (batch_view_read(&view, A, d->offset, slot_bytes, BATCH_KIND_PD, &b, err, sizeof err) < 0)
            df_die(DF_EXIT_TEMP, "input slot %u: %s", slot, err); /* retried, then poisoned */
        handoff_end ie = {.r = in, .slot = slot}, oe = {.r = NULL, .token = b->batch_id};
        DF_CHECK_ERR(handoff_begin(H, (uint16_t)w.id, w.incarnation, &ie, &oe));

        dflash_stats s;
        adamw_info info;
        rc = trainer_step(tr, b, (const char *)A->base + d->offset, NULL, heartbeat, &dr, &s, &info, err, sizeof err);
        if (rc < 0)
            df_die(rc == -EINVAL ? DF_EXIT_PERM : DF_EXIT_TEMP, "step %ld: %s", tr->ts.step + 1, err);
        DF_CHECK_ERR(ledger_mark_trained(L, b->batch_id, (uint64_t)tr->ts.step));
        DF_CHECK_ERR(handoff_mark_published(H, (uint16_t)w.id));
        uint32_t T = b->T;
        uint64_t bid = b->batch_id;
        DF_CHECK_ERR(handoff_finish(H, (uint16_t)w.id, w.incarnation, in, slot));
        stage_count(&st, 1, T);
        stage_busy(&st);

        trainer_record(tr, &s);
        metrics_line ml;
        metrics_begin(&ml, &mw, "step");
        metrics_int(&ml, "step", tr->ts.step);
        metrics_u64(&ml, "batch", bid);
        metrics_num(&ml, "loss", s.loss);
        metrics_num(&ml, "acc1", dflash_stats_acc(&s, 1));
        metrics_num(&ml, "tau", dflash_stats_tau(&s, tr->cfg.block_size));
        metrics_num(&ml, "lr", info.lr);
        metrics_num(&ml, "grad_norm", info.grad_norm);
        metrics_int(&ml, "tokens", T);
        metrics_end(&ml);
        if (t->drafter.checkpoint_every && tr->ts.step % (long)t->drafter.checkpoint_every == 0)
            save_checkpoint(&dr);
    }
    stage_tick(&st, 1);
    if (tr->ts.step > 0 && tr->ts.step != tr->ts.ledger_committed_step)
        save_checkpoint(&dr);
    if (!ctl_should_stop(&w) && tr->ts.step > 0) { /* the epoch is complete: export and summarise */
        snprintf(path, sizeof path, "%s/drafter", w.run_dir);
        if (trainer_export(tr, path, err, sizeof err) < 0)
            df_die(DF_EXIT_TEMP, "export: %s", err);
        if (trainer_write_summary(tr, w.run_dir, (double)(df_now_ns() - t_start) * 1e-9, err, sizeof err) < 0)
            df_die(DF_EXIT_TEMP, "%s", err);
    }
    df_log("done at step %ld: busy %.1fs, waiting %.1fs", tr->ts.step, st.busy_total_s, st.wait_total_s);
    metrics_close(&mw);
    batch_view_free(&view);
    trainer_close(tr);
    ctl_worker_close(&w);
    return DF_EXIT_OK;
}
