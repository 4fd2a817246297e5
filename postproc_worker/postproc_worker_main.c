/* postproc_worker: between the target and the drafter. Takes a TP batch (tokens + the
 * target's captured features) from its input ring, samples each document's anchors
 * (seeded by (seed, batch id), so a re-run after a crash draws the same ones), adds the
 * optional Gaussian noise to the features, and writes the PD batch into a slot of the
 * drafter's ring, in the drafter's memory (CPU backend: a copy between two arenas).
 *
 * Hand-off order, the point of this process: acquire input (READING) -> acquire output
 * (WRITING) -> record the intent -> fill the output -> publish the output -> release the
 * input. If it dies anywhere, the orchestrator's recovery frees exactly one of the two:
 * the output if it was not yet published (the input is requeued), else the input.
 *
 * Exit codes: 0 when its input ring is closed and drained or the epoch is done; 1 on a bad
 * slot (restarted; the batch is retried and poisoned after max_attempts). */
#include "dflash/dflash_batch.h"
#include "io/batch.h"
#include "io/batch_view.h"
#include "postproc_worker/pp_copy.h"
#include "io/stage.h"
#include "proc/worker.h"
#include "util.h"

static const char usage[] =
    "usage: postproc_worker   (started by the orchestrator, not by hand)\n"
    "The DFlash pipeline's middle stage: TP batch -> anchors + noise -> PD batch.\n"
    "Reads DF_CTL_FD, DF_WORKER, DF_WORKER_ID, DF_INCARNATION, DF_RUN_DIR (common/proc/ctl.h).\n";

int main(int argc, char **argv)
{
    if (worker_help(argc, argv, usage))
        return 0;
    static worker_ctx wk;
    DF_CHECK_ERR(worker_start(&wk, "postproc_worker", argc, argv));
    ctl_worker *w = &wk.ctl;
    const topo *t = &w->topo;
    worker_ring ri, ro;
    DF_CHECK_ERR(worker_ring_in(&wk, &ri));
    DF_CHECK_ERR(worker_ring_out(&wk, &ro));
    ring *in = ri.r, *out = ro.r;
    arena *Ain = ri.A, *Aout = ro.A;
    uint64_t in_bytes = ri.slot_bytes, out_bytes = ro.slot_bytes;
    ledger *L = ctl_ledger(w);
    handoff_table *H = ctl_handoff(w);
    const topology_drafter *dr = &t->drafter;
    int N = (int)dr->num_anchors;

    char err[512];
    /* the copies run on the drafter's GPU (it pulls from the target's, which never waits) */
    pp_copier *cp;
    if (pp_copier_open(&cp, Aout->kind == ARENA_CUDA ? Aout->device : -1, err, sizeof err) < 0)
        df_die(DF_EXIT_PERM, "%s", err);
    if (Ain->kind == ARENA_CUDA && Aout->kind == ARENA_CUDA && Ain->device != Aout->device) {
        /* the target's slots are on another GPU: let ours read them (peer copy) */
        char e2[512];
        int rc = arena_grant_access(Ain, Aout->device, e2, sizeof e2);
        if (rc < 0)
            df_die(DF_EXIT_PERM, "input ring on GPU %d is not reachable from GPU %d: %s", Ain->device, Aout->device,
                   e2);
    }
    batch_view iview = {0};
    void *ometa = NULL; /* host buffer for the output metadata (cuda) */
    DF_CHECK_ERR(worker_ready(&wk, in, out));
    df_log("ready: %d anchors per document, block %u, noise std %g", N, dr->block_size, dr->noise_std);

    uint64_t done = 0;
    for (;;) {
        worker_tick(&wk, done);
        if (ctl_should_stop(w))
            break;
        if (ctl_paused(w)) {
            worker_idle(&wk);
            continue;
        }
        uint32_t islot, oslot;
        int rc = worker_acquire_ready(&wk, in, &islot);
        stage_wait(&wk.st);
        if (rc == -ETIMEDOUT) {
            if (ledger_epoch_done(L))
                break;
            continue;
        }
        if (rc == -EPIPE)
            break; /* closed and drained: upstream is gone */
        DF_CHECK_ERR(rc);
        const ring_desc *id = ring_desc_at(in, islot);
        batch_header *src;
        if (batch_view_read(&iview, Ain, id->offset, in_bytes, BATCH_KIND_TP, &src, err, sizeof err) < 0)
            df_die(DF_EXIT_TEMP, "input slot %u: %s", islot, err); /* retried, then poisoned */

        rc = worker_acquire_free(&wk, out, done, &oslot);
        if (rc == -EPIPE)
            break; /* the reclaim after our exit requeues the input */
        DF_CHECK_ERR(rc);
        handoff_end ie = {.r = in, .slot = islot}, oe = {.r = out, .slot = oslot};
        DF_CHECK_ERR(handoff_begin(H, (uint16_t)w->id, w->incarnation, &ie, &oe));

        uint64_t off = (uint64_t)oslot * out_bytes;
        batch_header probe = *src;
        probe.kind = BATCH_KIND_PD;
        probe.num_anchors = (uint32_t)N;
        batch_layout(&probe);
        batch_header *dst = (batch_header *)((char *)Aout->base + off);
        if (Aout->kind == ARENA_CUDA) { /* build the metadata on the host, copy it in below */
            free(ometa);
            if (!(ometa = calloc(1, probe.off_feat)))
                df_die(DF_EXIT_TEMP, "out of memory");
            dst = ometa;
        }
        *dst = *src;
        dst->kind = BATCH_KIND_PD;
        dst->num_anchors = (uint32_t)N;
        dst->block_size = dr->block_size;
        if (batch_layout(dst) > out_bytes)
            df_die(DF_EXIT_PERM, "%s: the PD ring's slot_bytes %llu is too small for batch %llu (%llu bytes)",
                   t->source_path, (unsigned long long)out_bytes, (unsigned long long)dst->batch_id,
                   (unsigned long long)dst->total_bytes);
        memcpy(batch_tokens(dst), batch_tokens(src), 4ull * src->T);
        memcpy(batch_mask(dst), batch_mask(src), src->T);
        for (uint32_t k = 0; k < src->n_docs; k++) {
            int s0 = src->doc_starts[k], S = src->doc_starts[k + 1] - s0;
            /* one stream per document: batch id and document index name it */
            DF_CHECK_ERR(dflash_sample_anchors(batch_anchors(dst) + (size_t)k * N, batch_keep(dst) + (size_t)k * N, N,
                                               batch_mask(src) + s0, S, t->seed, dst->batch_id * BATCH_MAX_DOCS + k));
        }
        dst->checksum = batch_checksum(dst);
        size_t nfeat = (size_t)src->T * src->n_capture * src->d;
        if (batch_view_write(Aout, off, dst, err, sizeof err) < 0 ||
            pp_copy_features(cp, Aout, off + dst->off_feat, Ain, id->offset + src->off_feat, nfeat, src->feat_dtype,
                             dr->noise_std, t->seed, dst->batch_id, err, sizeof err) < 0)
            df_die(DF_EXIT_TEMP, "%s", err);

        ring_desc *od = ring_desc_at(out, oslot);
        *od = *id;
        od->offset = off;
        od->bytes = dst->total_bytes;
        od->checksum = dst->checksum;
        DF_CHECK_ERR(handoff_publish(H, (uint16_t)w->id, w->incarnation, out, oslot));
        DF_CHECK_ERR(handoff_finish(H, (uint16_t)w->id, w->incarnation, in, islot));
        done++;
        stage_count(&wk.st, 1, src->T);
        stage_busy(&wk.st);
    }
    worker_finish(&wk);
    df_log("done: %llu batches, busy %.1fs, waiting %.1fs", (unsigned long long)done, wk.st.busy_total_s,
           wk.st.wait_total_s);
    batch_view_free(&iview);
    free(ometa);
    pp_copier_close(cp);
    worker_close(&wk);
    return DF_EXIT_OK;
}
