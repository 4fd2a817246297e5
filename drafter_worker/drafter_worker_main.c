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
#include "drafter_worker/adamw.h"
#include "drafter_worker/dflash_batch.h"
#include "drafter_worker/dflash_ckpt.h"
#include "drafter_worker/dflash_config.h"
#include "drafter_worker/dflash_model.h"
#include "io/batch.h"
#include "io/hfconfig.h"
#include "io/metrics.h"
#include "io/stage.h"
#include "ipc/ctl.h"
#include "target_worker/target_model.h"
#include "util.h"

#include <jansson.h>
#include <math.h>
#include <unistd.h>

static const char usage[] =
    "usage: drafter_worker   (started by the orchestrator, not by hand)\n"
    "The DFlash pipeline's training stage: PD batches -> forward/backward -> AdamW ->\n"
    "checkpoints (run_dir/checkpoints) -> release export (run_dir/drafter).\n"
    "Reads DF_CTL_FD, DF_WORKER, DF_WORKER_ID, DF_INCARNATION, DF_RUN_DIR (common/ipc/ctl.h).\n";

#define WAIT_NS (200 * 1000000ll)
#define START_STEPS 5  /* "loss at start" = mean of the first steps */
#define END_STEPS 20   /* "loss at end" and the accuracies = the last steps */

typedef struct trainer {
    ctl_worker *w;
    dflash_config cfg;
    dflash_params p, g;
    dflash_frozen fz;
    tm_embeddings emb;
    adamw opt;
    adamw_segment decay[4 * DFLASH_MAX_LAYERS + 8];
    int n_decay;
    dflash_acts acts;
    dflash_train_state ts;
    char ckpt_root[1200];
    dflash_stats start, end_win[END_STEPS];
    double start_loss_sum;
    int start_n;
} trainer;

/* The drafter's shape: the target's width and heads, the topology's depth and block. */
static void build_config(trainer *tr, const topo *t, const hfc_config *hc)
{
    dflash_config *c = &tr->cfg;
    memset(c, 0, sizeof *c);
    c->hidden = hc->hidden_size;
    c->intermediate = hc->intermediate_size;
    c->n_layers = (int)t->drafter.num_layers;
    c->n_heads = hc->num_attention_heads;
    c->n_kv_heads = hc->num_key_value_heads;
    c->head_dim = hc->head_dim;
    c->vocab = hc->vocab_size;
    c->block_size = (int)t->drafter.block_size;
    c->n_capture = t->n_capture;
    for (int i = 0; i < t->n_capture && i < DFLASH_MAX_CAPTURE; i++)
        c->target_layer_ids[i] = t->capture_layers[i];
    c->num_target_layers = hc->num_hidden_layers;
    c->mask_token_id = t->drafter.mask_token_id >= 0 ? (int)t->drafter.mask_token_id : hc->vocab_size - 1;
    c->tie_word_embeddings = hc->tie_word_embeddings;
    c->max_position_embeddings = hc->max_position_embeddings ? hc->max_position_embeddings : 4096;
    c->rms_norm_eps = hc->rms_norm_eps;
    c->rope_theta = hc->rope_theta;
    c->gamma = t->drafter.gamma > 0 ? t->drafter.gamma : dflash_default_gamma(c->block_size);
}

static void save_checkpoint(trainer *tr)
{
    char err[512];
    tr->ts.ledger_committed_step = tr->ts.step;
    int rc = dflash_ckpt_save(tr->ckpt_root, &tr->cfg, &tr->p, &tr->opt, &tr->ts, err, sizeof err);
    if (rc < 0) {
        /* the previous checkpoint is intact; training goes on and the next save retries */
        df_log("checkpoint at step %ld failed: %s", tr->ts.step, err);
        return;
    }
    DF_CHECK_ERR(ctl_send_checkpoint(tr->w, (uint64_t)tr->ts.step));
}

/* One optimizer step over the PD batch b. Returns the merged statistics. */
static void train_step(trainer *tr, batch_header *b, const topo *t, dflash_stats *out)
{
    const dflash_config *c = &tr->cfg;
    dflash_batch seq[BATCH_MAX_DOCS];
    int nd = (int)b->n_docs, ncd = c->n_capture * c->hidden;
    double norm = 0;
    for (int k = 0; k < nd; k++) {
        int s0 = b->doc_starts[k], S = b->doc_starts[k + 1] - s0;
        const float *H = (const float *)batch_feat(b) + (size_t)s0 * ncd;
        DF_CHECK_ERR(dflash_batch_init(&seq[k], c, S, (int)b->num_anchors, H, batch_tokens(b) + s0,
                                       batch_mask(b) + s0, t->seed, b->batch_id));
        DF_CHECK_ERR(dflash_batch_set_anchors(&seq[k], c, batch_anchors(b) + (size_t)k * b->num_anchors,
                                              batch_keep(b) + (size_t)k * b->num_anchors, (int)b->num_anchors));
        norm += seq[k].sum_w;
    }
    memset(tr->g.data, 0, tr->g.n * sizeof(float));
    memset(out, 0, sizeof *out);
    for (int k = 0; k < nd; k++) {
        dflash_stats st;
        if (seq[k].sum_w > 0) { /* a document without loss positions contributes nothing */
            DF_CHECK_ERR(dflash_loss_and_grad(c, &tr->p, &tr->fz, &seq[k], &tr->acts, &tr->g, norm, 64, &st));
            dflash_stats_merge(out, &st);
        }
        ctl_heartbeat(tr->w, (uint64_t)tr->ts.step, 0, 0); /* a step may take seconds on the CPU */
        dflash_batch_free(&seq[k]);
    }
}

static void write_summary(trainer *tr, const char *run_dir, double secs)
{
    dflash_stats end;
    memset(&end, 0, sizeof end);
    int n_end = (int)DF_MIN(tr->ts.step, END_STEPS);
    for (int i = 0; i < n_end; i++)
        dflash_stats_merge(&end, &tr->end_win[i]);
    int B = tr->cfg.block_size;
    double start_loss = tr->start_n ? tr->start_loss_sum / tr->start_n : NAN;
    json_t *acc = json_array();
    for (int k = 1; k < B; k++)
        json_array_append_new(acc, json_real(dflash_stats_acc(&end, k)));
    json_t *j = json_pack("{s:I, s:f, s:f, s:o, s:f, s:f, s:i, s:s}", "steps", (json_int_t)tr->ts.step,
                          "loss_start", start_loss, "loss_end", end.loss, "acc", acc, "expected_tau",
                          dflash_stats_tau(&end, B), "seconds", secs, "block_size", B, "release_dir", "drafter");
    char path[1200];
    snprintf(path, sizeof path, "%s/train_summary.json", run_dir);
    char *txt = json_dumps(j, JSON_INDENT(1));
    DF_CHECK(txt);
    DF_CHECK_ERR(df_write_file_atomic(path, txt, strlen(txt)));
    df_log("summary: %ld steps, loss %.4f -> %.4f, expected tau %.2f (block %d)", tr->ts.step, start_loss, end.loss,
           dflash_stats_tau(&end, B), B);
    free(txt);
    json_decref(j);
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
    if (t->backend != TOPO_CPU)
        df_die(DF_EXIT_PERM, "backend \"cuda\" is not wired into drafter_worker yet: use \"cpu\"");
    if (topo_n_drafters(t) != 1)
        df_die(DF_EXIT_PERM, "%s: %d drafter ranks: the CPU drafter trains with one rank", t->source_path,
               topo_n_drafters(t));

    trainer tr;
    memset(&tr, 0, sizeof tr);
    tr.w = &w;
    hfc_config hc;
    snprintf(path, sizeof path, "%s/config.json", t->target_model_dir);
    if (hfc_load(&hc, path, err, sizeof err) < 0)
        df_die(DF_EXIT_PERM, "%s", err);
    build_config(&tr, t, &hc);
    hfc_free(&hc);
    if (dflash_config_validate(&tr.cfg, err, sizeof err) < 0)
        df_die(DF_EXIT_PERM, "%s: drafter: %s", t->source_path, err);
    if (tm_load_embeddings(&tr.emb, t->target_model_dir, 0, err, sizeof err) < 0)
        df_die(DF_EXIT_PERM, "%s", err);
    tr.fz.embed = tr.emb.embed;
    tr.fz.lm_head = tr.emb.lm_head;

    ledger *L = ctl_ledger(&w);
    long total_steps = (long)ledger_n_batches(L) * (long)DF_MAX(t->drafter.epochs, 1u);
    adamw_config oc;
    adamw_config_default(&oc, total_steps);
    oc.lr = t->drafter.lr;
    oc.warmup_frac = t->drafter.warmup_frac;
    oc.weight_decay = t->drafter.weight_decay;
    oc.clip_norm = t->drafter.grad_clip;
    snprintf(tr.ckpt_root, sizeof tr.ckpt_root, "%s/checkpoints", w.run_dir);

    if (w.committed_step > 0) { /* restart: continue from the checkpoint the ledger committed */
        dflash_config saved;
        snprintf(path, sizeof path, "%s/step-%08llu", tr.ckpt_root, (unsigned long long)w.committed_step);
        if (dflash_ckpt_load(path, &saved, &tr.p, &tr.opt, &tr.ts, err, sizeof err) < 0)
            df_die(DF_EXIT_TEMP, "resume from step %llu: %s", (unsigned long long)w.committed_step, err);
        df_log("resumed from %s (step %ld)", path, tr.ts.step);
    } else {
        if (t->drafter.init_dir) {
            dflash_config rc_cfg;
            if (dflash_load_release(t->drafter.init_dir, &rc_cfg, &tr.p, err, sizeof err) < 0)
                df_die(DF_EXIT_PERM, "%s", err);
            tr.cfg = rc_cfg;
            tr.cfg.gamma = t->drafter.gamma > 0 ? t->drafter.gamma : dflash_default_gamma(tr.cfg.block_size);
        } else {
            DF_CHECK_ERR(dflash_params_alloc(&tr.p, &tr.cfg));
            dflash_params_init_random(&tr.p, &tr.cfg, t->seed, 0.02f);
        }
        DF_CHECK_ERR(adamw_init(&tr.opt, &oc, tr.p.n));
        tr.ts.seed = t->seed;
    }
    DF_CHECK_ERR(dflash_params_alloc(&tr.g, &tr.cfg));
    tr.n_decay = dflash_decay_segments(&tr.cfg, tr.decay, (int)DF_ARRAY_LEN(tr.decay));

    ring *in = ctl_ring_in(&w);
    arena *A = ctl_ring_arena(&w, in);
    uint64_t slot_bytes = ctl_ring_slot_bytes(&w, in);
    DF_CHECK(in && A && A->base);
    handoff_table *H = ctl_handoff(&w);
    snprintf(path, sizeof path, "%s/metrics", w.run_dir);
    metrics_writer mw;
    DF_CHECK_ERR(metrics_open(&mw, path, w.name, w.incarnation));
    stage_stats st;
    stage_init(&st, &mw, in, NULL, 1000000000ull);
    DF_CHECK_ERR(ctl_ready(&w));
    df_log("ready: drafter %d layers d=%d, %zu trainable params, block %d, %ld steps planned", tr.cfg.n_layers,
           tr.cfg.hidden, tr.p.n, tr.cfg.block_size, total_steps);

    uint64_t t_start = df_now_ns();
    for (;;) {
        ctl_heartbeat(&w, (uint64_t)tr.ts.step, st.items_total, st.tokens_total);
        stage_tick(&st, 0);
        if (ctl_should_stop(&w))
            break;
        if (ctl_checkpoint_requested(&w))
            save_checkpoint(&tr);
        if (ctl_paused(&w)) {
            usleep(100000);
            stage_wait(&st);
            continue;
        }
        uint32_t slot;
        int rc = ring_acquire_ready(in, (uint16_t)w.id, w.incarnation, WAIT_NS, &slot);
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
        batch_header *b = (batch_header *)((char *)A->base + d->offset);
        if (d->offset + sizeof *b > A->size || batch_validate(b, slot_bytes, BATCH_KIND_PD, err, sizeof err) < 0)
            df_die(DF_EXIT_TEMP, "input slot %u: %s", slot, err);
        if ((int)b->n_capture != tr.cfg.n_capture || (int)b->d != tr.cfg.hidden ||
            (int)b->block_size != tr.cfg.block_size)
            df_die(DF_EXIT_PERM, "batch %llu: features %ux%u block %u do not match the drafter (%dx%d, block %d)",
                   (unsigned long long)b->batch_id, b->n_capture, b->d, b->block_size, tr.cfg.n_capture,
                   tr.cfg.hidden, tr.cfg.block_size);
        handoff_end ie = {.r = in, .slot = slot}, oe = {.r = NULL, .token = b->batch_id};
        DF_CHECK_ERR(handoff_begin(H, (uint16_t)w.id, w.incarnation, &ie, &oe));

        dflash_stats s;
        train_step(&tr, b, t, &s);
        adamw_info info;
        DF_CHECK_ERR(adamw_step(&tr.opt, tr.p.data, tr.g.data, tr.decay, tr.n_decay, &info));
        tr.ts.step++;
        DF_CHECK_ERR(ledger_mark_trained(L, b->batch_id, (uint64_t)tr.ts.step));
        DF_CHECK_ERR(handoff_mark_published(H, (uint16_t)w.id));
        uint32_t T = b->T;
        uint64_t bid = b->batch_id;
        DF_CHECK_ERR(handoff_finish(H, (uint16_t)w.id, w.incarnation, in, slot));
        stage_count(&st, 1, T);
        stage_busy(&st);

        if (tr.start_n < START_STEPS) {
            tr.start_loss_sum += s.loss;
            tr.start_n++;
        }
        tr.end_win[(tr.ts.step - 1) % END_STEPS] = s;
        metrics_line ml;
        metrics_begin(&ml, &mw, "step");
        metrics_int(&ml, "step", tr.ts.step);
        metrics_u64(&ml, "batch", bid);
        metrics_num(&ml, "loss", s.loss);
        metrics_num(&ml, "acc1", dflash_stats_acc(&s, 1));
        metrics_num(&ml, "tau", dflash_stats_tau(&s, tr.cfg.block_size));
        metrics_num(&ml, "lr", info.lr);
        metrics_num(&ml, "grad_norm", info.grad_norm);
        metrics_int(&ml, "tokens", T);
        metrics_end(&ml);
        if (t->drafter.checkpoint_every && tr.ts.step % (long)t->drafter.checkpoint_every == 0)
            save_checkpoint(&tr);
    }
    stage_tick(&st, 1);
    if (tr.ts.step > 0 && tr.ts.step != tr.ts.ledger_committed_step)
        save_checkpoint(&tr);
    if (!ctl_should_stop(&w) && tr.ts.step > 0) { /* the epoch is complete: export and summarise */
        snprintf(path, sizeof path, "%s/drafter", w.run_dir);
        if (dflash_export_release(path, &tr.cfg, &tr.p, err, sizeof err) < 0)
            df_die(DF_EXIT_TEMP, "export: %s", err);
        write_summary(&tr, w.run_dir, (double)(df_now_ns() - t_start) * 1e-9);
    }
    df_log("done at step %ld: busy %.1fs, waiting %.1fs", tr.ts.step, st.busy_total_s, st.wait_total_s);
    metrics_close(&mw);
    dflash_acts_free(&tr.acts);
    dflash_params_free(&tr.g);
    dflash_params_free(&tr.p);
    adamw_free(&tr.opt);
    tm_embeddings_free(&tr.emb);
    ctl_worker_close(&w);
    return DF_EXIT_OK;
}
