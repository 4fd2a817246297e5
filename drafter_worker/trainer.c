/* trainer.c: the drafter's model state and its optimizer step (trainer.h). The CPU
 * backend lives here (cpu_ops); the CUDA one in trainer_cuda.c (trainer_ops_cuda), chosen
 * by trainer_open. */
#include "drafter_worker/trainer.h"
#include "drafter_worker/hb_wait.h"

#include "dflash/dflash_batch.h"
#include "io/hfconfig.h"
#include "json_num.h"
#include "util.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>

static const trainer_ops cpu_ops; /* below */

/* The training objective is the topology's (drafter.loss, drafter.dpace_alpha), whatever a
 * release the run starts from was trained with. */
static void set_objective(dflash_config *c, const topo *t)
{
    c->loss = t->drafter.loss == TOPOLOGY_LOSS_DPACE ? DFLASH_LOSS_DPACE : DFLASH_LOSS_DECAY;
    c->dpace_alpha = t->drafter.dpace_alpha;
}

/* The drafter's shape: the target's width and heads, the topology's depth and block. */
static void build_config(dflash_config *c, const topo *t, const hfconfig *hc)
{
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
    c->rope_scaling = (nn_rope_scaling){0}; /* none, whatever the target's (dflash_config.h) */
    c->gamma = t->drafter.gamma;            /* the topology reader's: > 0, default 7 */
    /* the attention kinds: drafter.layer_types and sliding_window (all full attention when
     * the topology gives none; a drafter.init_dir release then brings its own) */
    for (uint32_t l = 0; l < t->drafter.num_layers && l < DFLASH_MAX_LAYERS; l++)
        c->layer_sliding[l] = t->drafter.layer_sliding[l];
    c->sliding_window = (int)t->drafter.sliding_window;
    set_objective(c, t);
}

/* The attention kinds of a release or checkpoint (got, read from path; as many layers as
 * want) against the topology's drafter.layer_types and sliding_window (want), when the
 * topology gives them: -EINVAL naming the first difference, both values, and how to fix it
 * (fix). The window counts only where some layer is sliding. */
static int check_attention(const topo *t, const dflash_config *want, const dflash_config *got, const char *what,
                           const char *path, const char *fix, char *err, size_t errlen)
{
    if (!t->drafter.layer_types_given)
        return 0; /* the release's (or the checkpoint's) own kinds are the drafter's */
    int any = 0;
    for (int l = 0; l < want->n_layers; l++) {
        if (got->layer_sliding[l] != want->layer_sliding[l])
            return df_err(err, errlen, -EINVAL,
                          "%s: %s: layer_types[%d] is \"%s\", but drafter.layer_types[%d] is \"%s\"%s", what, path, l,
                          got->layer_sliding[l] ? "sliding_attention" : "full_attention", l,
                          want->layer_sliding[l] ? "sliding_attention" : "full_attention", fix);
        any |= want->layer_sliding[l];
    }
    if (any && got->sliding_window != want->sliding_window)
        return df_err(err, errlen, -EINVAL, "%s: %s: sliding_window is %d, but drafter.sliding_window is %d%s", what,
                      path, got->sliding_window, want->sliding_window, fix);
    return 0;
}

/* drafter.init_dir's config.json (path) against the drafter the topology and the target
 * make (want): the fields the orchestrator checks at start (setup.c, check_init_dir), read
 * again here since the release may have changed since then (a restart before the first
 * checkpoint reads it again). A release of another shape was taken silently before: its
 * block size, depth, mask token replaced the topology's. -EINVAL naming the field. The
 * attention kinds count when the topology gives drafter.layer_types (check_attention). */
static int check_release_shape(const topo *t, const dflash_config *want, const dflash_config *rel, const char *path,
                               char *err, size_t errlen)
{
    const struct {
        const char *key, *topo_field;
        int got, want;
    } f[] = {
        {"num_hidden_layers", "drafter.num_layers", rel->n_layers, want->n_layers},
        {"block_size", "drafter.block_size", rel->block_size, want->block_size},
        {"dflash_config.mask_token_id", "drafter.mask_token_id", rel->mask_token_id, want->mask_token_id},
        {"hidden_size", "the target's hidden_size", rel->hidden, want->hidden},
        {"vocab_size", "the target's vocab_size", rel->vocab, want->vocab},
        {"num_target_layers", "the target's num_hidden_layers", rel->num_target_layers, want->num_target_layers},
    };
    for (size_t i = 0; i < DF_ARRAY_LEN(f); i++)
        if (f[i].got != f[i].want)
            return df_err(err, errlen, -EINVAL,
                          "drafter.init_dir: %s: %s is %d, but %s is %d: the release does not fit the topology; "
                          "make them match (or use another init_dir)",
                          path, f[i].key, f[i].got, f[i].topo_field, f[i].want);
    int same = rel->n_capture == want->n_capture;
    for (int i = 0; same && i < want->n_capture; i++)
        same = rel->target_layer_ids[i] == want->target_layer_ids[i];
    if (!same) {
        char a[400] = "", b[400] = "";
        for (int i = 0, na = 0, nb = 0; i < DFLASH_MAX_CAPTURE; i++) {
            if (i < rel->n_capture && na < (int)sizeof a)
                na += snprintf(a + na, sizeof a - (size_t)na, "%s%d", i ? "," : "", rel->target_layer_ids[i]);
            if (i < want->n_capture && nb < (int)sizeof b)
                nb += snprintf(b + nb, sizeof b - (size_t)nb, "%s%d", i ? "," : "", want->target_layer_ids[i]);
        }
        return df_err(err, errlen, -EINVAL,
                      "drafter.init_dir: %s: dflash_config.target_layer_ids is [%s], but target.capture_layers is "
                      "[%s]: the drafter was trained on the features of its layers; make them match",
                      path, a, b);
    }
    return check_attention(t, want, rel, "drafter.init_dir", path,
                           ": the release does not fit the topology; make them match (or use another init_dir)", err,
                           errlen);
}

/* DF_FAULT_NONFINITE="S[:N]" (trainer.h). A malformed value is an error: a test that meant
 * to inject a fault must not pass silently without one. */
static int parse_fault(trainer *tr, char *err, size_t errlen)
{
    const char *v = getenv("DF_FAULT_NONFINITE");
    if (!v || !*v)
        return 0;
    long s = 0, n = -1;
    int used = 0;
    if (!((sscanf(v, "%ld%n", &s, &used) == 1 && v[used] == 0) ||
          (sscanf(v, "%ld:%ld%n", &s, &n, &used) == 2 && v[used] == 0 && n > 0)) ||
        s < 1)
        return df_err(err, errlen, -EINVAL, "DF_FAULT_NONFINITE=%s: expected STEP or STEP:COUNT (integers >= 1)", v);
    tr->fault_nf_from = s;
    tr->fault_nf_count = n;
    if (n > 0)
        df_log("fault injection (DF_FAULT_NONFINITE=%s): steps %ld..%ld made non-finite", v, s, s + n - 1);
    else
        df_log("fault injection (DF_FAULT_NONFINITE=%s): every step from %ld made non-finite", v, s);
    return 0;
}

static int fault_nonfinite(const trainer *tr)
{
    long s = tr->ts.step + 1; /* the step being trained */
    return tr->fault_nf_from > 0 && s >= tr->fault_nf_from &&
           (tr->fault_nf_count < 0 || s < tr->fault_nf_from + tr->fault_nf_count);
}

int trainer_open(trainer *tr, const topo *t, int device, long total_steps, const char *ckpt_dir, char *err,
                 size_t errlen)
{
    memset(tr, 0, sizeof *tr);
    int frc = parse_fault(tr, err, errlen);
    if (frc < 0)
        return frc;
    tr->ops = t->backend != TOPOLOGY_CPU ? &trainer_ops_cuda : &cpu_ops;
    tr->device = device;
    char path[1200];
    hfconfig hc;
    snprintf(path, sizeof path, "%s/config.json", t->target_model_dir);
    int rc = hfconfig_load(&hc, path, err, errlen);
    if (rc < 0)
        return rc;
    build_config(&tr->cfg, t, &hc);
    hfconfig_free(&hc);
    char e2[512];
    if ((rc = dflash_config_validate(&tr->cfg, e2, sizeof e2)) < 0)
        return df_err(err, errlen, rc, "%s: drafter: %s", t->source_path, e2);
    adamw_config oc;
    adamw_config_default(&oc, total_steps);
    oc.lr = t->drafter.lr;
    oc.warmup_frac = t->drafter.warmup_frac;
    oc.weight_decay = t->drafter.weight_decay;
    oc.clip_norm = t->drafter.grad_clip;

    /* where the start-up goes, logged at the end (the 8B drafter took ~50 s to be ready) */
    uint64_t t0 = df_now_ns();
    const char *how = ckpt_dir ? "checkpoint" : t->drafter.init_dir ? "release" : "random";
    if (ckpt_dir) { /* restart: continue from the checkpoint the ledger committed */
        dflash_config saved;
        if ((rc = dflash_ckpt_load(ckpt_dir, &saved, &tr->p, &tr->opt, &tr->ts, e2, sizeof e2)) < 0) {
            snprintf(err, errlen, "resume: %s", e2);
            /* a checkpoint that fails validation is not a bad topology, and not worth a
             * restart either: -EBADMSG (the worker exits 100); I/O errors stay as they are */
            return rc == -EINVAL ? -EBADMSG : rc;
        }
        /* the attention kinds the checkpoint was trained with: the topology's when it gives
         * them, else the ones a drafter.init_dir release brought (build_config's all-full
         * would change the drafter under its weights) */
        if (!t->drafter.layer_types_given) {
            memcpy(tr->cfg.layer_sliding, saved.layer_sliding, sizeof tr->cfg.layer_sliding);
            tr->cfg.sliding_window = saved.sliding_window;
        } else if ((rc = check_attention(t, &tr->cfg, &saved, "resume", ckpt_dir,
                                         ": the checkpoint was trained with other attention layers", err, errlen)) <
                   0) {
            return -EBADMSG;
        }
        tr->opt.cfg.total_steps = total_steps;
    } else {
        if (t->drafter.init_dir) {
            dflash_config rel;
            snprintf(path, sizeof path, "%s/config.json", t->drafter.init_dir);
            if ((rc = dflash_config_read_release(&rel, path, err, errlen)) < 0 ||
                (rc = check_release_shape(t, &tr->cfg, &rel, path, err, errlen)) < 0)
                return rc;
            if ((rc = dflash_load_release(t->drafter.init_dir, &tr->cfg, &tr->p, err, errlen)) < 0)
                return rc;
            tr->cfg.gamma = t->drafter.gamma; /* the topology's, over the release's */
            set_objective(&tr->cfg, t);
        } else {
            if ((rc = dflash_params_alloc(&tr->p, &tr->cfg)) < 0)
                return rc;
            dflash_params_init_random(&tr->p, &tr->cfg, t->seed, 0.02f);
        }
        if ((rc = adamw_init(&tr->opt, &oc, tr->p.n)) < 0)
            return rc;
        tr->ts.seed = t->seed;
    }
    tr->n_decay = dflash_decay_segments(&tr->cfg, tr->decay, (int)DF_ARRAY_LEN(tr->decay));
    if (tr->cfg.loss == DFLASH_LOSS_DPACE)
        df_log("objective: dpace (alpha %g): position weights from the drafter's confidence", tr->cfg.dpace_alpha);
    else
        df_log("objective: decay (gamma %g)", tr->cfg.gamma);
    uint64_t t1 = df_now_ns();
    if ((rc = tr->ops->open(tr, t, total_steps, ckpt_dir != NULL, err, errlen)) < 0)
        return rc;
    df_log("start-up: weights and optimizer state (%s) %.2f s, %s backend open %.2f s", how, (double)(t1 - t0) * 1e-9,
           tr->ops->name, (double)(df_now_ns() - t1) * 1e-9);
    return 0;
}

void trainer_close(trainer *tr)
{
    if (tr->ops)
        tr->ops->close(tr);
    dflash_params_free(&tr->p);
    adamw_free(&tr->opt);
    memset(tr, 0, sizeof *tr);
}

/* ---- the cpu backend ---- */

static int cpu_open(trainer *tr, const topo *t, long total_steps, int resumed, char *err, size_t errlen)
{
    int rc;
    (void)total_steps, (void)resumed;
    if ((rc = target_load_embeddings(&tr->emb, t->target_model_dir, 0, err, errlen)) < 0)
        return rc;
    if (tr->emb.vocab != tr->cfg.vocab || tr->emb.hidden != tr->cfg.hidden)
        return df_err(err, errlen, -EINVAL, "%s: embeddings [%d, %d] do not match the drafter (vocab %d, hidden %d)",
                      t->target_model_dir, tr->emb.vocab, tr->emb.hidden, tr->cfg.vocab, tr->cfg.hidden);
    tr->fz.embed = tr->emb.embed;
    tr->fz.lm_head = tr->emb.lm_head;
    if ((rc = buckets_plan_make(&tr->buckets, &tr->cfg,
                                (size_t)t->drafter.allreduce_bucket_kb * 1024 / sizeof(float))) < 0)
        return df_err(err, errlen, rc, "%s: drafter: no all-reduce bucket plan (%s)", t->source_path, strerror(-rc));
    return dflash_params_alloc(&tr->g, &tr->cfg);
}

static void cpu_close(trainer *tr)
{
    dflash_acts_free(&tr->acts);
    dflash_params_free(&tr->g);
    target_embeddings_free(&tr->emb);
}

static int cpu_to_host(trainer *tr, int with_opt, char *err, size_t errlen)
{
    (void)tr, (void)with_opt, (void)err, (void)errlen;
    return 0; /* the host copies are the live ones */
}

/* Finish the step's bucketed gradient all-reduce (each rank's gradient already scaled by
 * its share): hand over what the backward did not, wait for the sums. */
static int reduce_grads(trainer *tr, buckets_step *gs, allreduce_comm *ar, char *err, size_t errlen)
{
    tr->allreduce_wait_ns = 0;
    tr->allreduce_early = 0;
    if (!ar || ar->world <= 1)
        return 0;
    char e2[400];
    int rc = buckets_step_finish(gs, &tr->allreduce_wait_ns, e2, sizeof e2);
    tr->allreduce_early = gs->early;
    if (rc < 0)
        snprintf(err, errlen, "gradient all-reduce (rank %d of %d): %s", ar->rank, ar->world, e2);
    return rc;
}

int trainer_docs(const trainer *tr, const batch_header *h, const float *feat, const allreduce_comm *ar,
                 dflash_batch *seq, double *norm, char *err, size_t errlen)
{
    const dflash_config *c = &tr->cfg;
    const char *hb = (const char *)h;
    int N = (int)h->num_anchors, ncd = c->n_capture * c->hidden;
    *norm = 0;
    for (int k = 0; k < (int)h->n_docs; k++) {
        int s0 = h->doc_starts[k], S = h->doc_starts[k + 1] - s0;
        int rc = dflash_batch_init(&seq[k], c, S, N, feat ? feat + (size_t)s0 * ncd : NULL,
                                   (const int32_t *)(hb + h->off_tokens) + s0, (const uint8_t *)(hb + h->off_mask) + s0,
                                   tr->ts.seed, h->batch_id);
        if (rc == 0)
            rc = dflash_batch_set_anchors(&seq[k], c, (const int32_t *)(hb + h->off_anchors) + (size_t)k * N,
                                          (const uint8_t *)(hb + h->off_keep) + (size_t)k * N, N);
        if (rc < 0) {
            snprintf(err, errlen, "batch %llu document %d: bad anchors or tokens (%s)", (unsigned long long)h->batch_id,
                     k, strerror(-rc));
            for (int j = 0; j <= k; j++)
                dflash_batch_free(&seq[j]);
            return -EINVAL;
        }
        /* decay: the weights' sum; D-PACE: the blocks with a loss position (dflash_loss.h) */
        *norm += c->loss == DFLASH_LOSS_DECAY
                     ? seq[k].sum_w
                     : dflash_loss_norm(c->loss, seq[k].weights, seq[k].N * c->block_size, c->block_size);
    }
    if (ar && ar->world > 1) /* each rank's gradient / n: the all-reduced sum is the mean of n batches */
        *norm *= tr->ranks_with_batch > 0 ? tr->ranks_with_batch : ar->world;
    return 0;
}

int trainer_step(trainer *tr, const batch_header *h, const void *slot, allreduce_comm *ar, void (*hb)(void *),
                 void *hb_arg, dflash_stats *out, adamw_info *info, char *err, size_t errlen)
{
    const dflash_config *c = &tr->cfg;
    if ((int)h->n_capture != c->n_capture || (int)h->d != c->hidden || (int)h->block_size != c->block_size)
        return df_err(
            err, errlen, -EINVAL, "batch %llu: features %ux%u block %u do not match the drafter (%dx%d, block %d)",
            (unsigned long long)h->batch_id, h->n_capture, h->d, h->block_size, c->n_capture, c->hidden, c->block_size);
    memset(out, 0, sizeof *out);
    int rc = tr->ops->step(tr, h, slot, ar, hb, hb_arg, out, info, err, errlen);
    if (rc == 0)
        tr->ts.step++;
    return rc;
}

int trainer_step_empty(trainer *tr, allreduce_comm *ar, adamw_info *info, char *err, size_t errlen)
{
    int rc = tr->ops->step_empty(tr, ar, info, err, errlen);
    if (rc == 0)
        tr->ts.step++;
    return rc;
}

static int cpu_step(trainer *tr, const batch_header *h, const void *slot, allreduce_comm *ar, void (*hb)(void *),
                    void *hb_arg, dflash_stats *out, adamw_info *info, char *err, size_t errlen)
{
    const dflash_config *c = &tr->cfg;
    int rc;
    if (h->feat_dtype != BATCH_FEAT_F32)
        return df_err(err, errlen, -EINVAL, "batch %llu: bf16 features, the cpu drafter takes fp32",
                      (unsigned long long)h->batch_id);
    batch_header *b = (batch_header *)slot; /* cpu: h == slot */
    dflash_batch seq[BATCH_MAX_DOCS];
    int nd = (int)b->n_docs;
    double norm;
    if ((rc = trainer_docs(tr, b, (const float *)batch_feat(b), ar, seq, &norm, err, errlen)) < 0)
        return rc;
    memset(tr->g.data, 0, tr->g.n * sizeof(float));
    int inject = fault_nonfinite(tr);
    if (inject)
        tr->g.data[0] = NAN; /* accumulated into, and reduced like, a real non-finite gradient */
    /* the last document with loss positions completes the gradients: its backward hands the
     * buckets to the all-reduce as it finishes them (grad_buckets.h) */
    int last = -1;
    for (int k = 0; k < nd; k++)
        if (seq[k].sum_w > 0)
            last = k;
    buckets_step gs = {0};
    int bucketed = ar && ar->world > 1;
    if (bucketed)
        buckets_step_begin(&gs, &tr->buckets, ar, tr->g.data);
    rc = 0;
    for (int k = 0; k < nd; k++) {
        dflash_stats st;
        if (rc == 0 && seq[k].sum_w > 0) { /* a document without loss positions contributes nothing */
            rc = dflash_loss_and_grad_hooked(c, &tr->p, &tr->fz, &seq[k], &tr->acts, &tr->g, norm, 64, &st,
                                             bucketed && k == last ? buckets_step_hook(&gs) : NULL);
            if (rc < 0)
                snprintf(err, errlen, "batch %llu document %d: forward/backward: %s", (unsigned long long)b->batch_id,
                         k, strerror(-rc));
            else
                dflash_stats_merge(out, &st);
        }
        if (hb)
            hb(hb_arg);
        dflash_batch_free(&seq[k]);
    }
    if (rc < 0)
        return rc; /* the worker exits; the orchestrator restarts the group */
    if (inject)
        out->loss = out->wce = NAN; /* as a real NaN logit would leave them (merged stats too) */
    if ((rc = reduce_grads(tr, &gs, ar, err, errlen)) < 0)
        return rc;
    if (!isfinite(out->loss) && !(ar && ar->world > 1)) {
        /* one rank: a NaN/Inf loss skips the update even if the gradient looks finite. With
         * several ranks the decision must be the same everywhere, so it rests on the reduced
         * gradient norm alone (adamw_step); a non-finite loss comes with a non-finite
         * gradient (the softmax of a non-finite logit is NaN) */
        memset(info, 0, sizeof *info);
        info->grad_norm = adamw_global_norm(tr->g.data, tr->g.n);
        info->lr = adamw_lr(&tr->opt.cfg, tr->opt.step);
        info->clip_scale = 1.0;
        info->skipped = 1;
    } else if ((rc = adamw_step(&tr->opt, tr->p.data, tr->g.data, tr->decay, tr->n_decay, info)) < 0) {
        return df_err(err, errlen, rc, "AdamW: %s", strerror(-rc));
    }
    return 0;
}

static int cpu_step_empty(trainer *tr, allreduce_comm *ar, adamw_info *info, char *err, size_t errlen)
{
    memset(tr->g.data, 0, tr->g.n * sizeof(float)); /* x + 0 = x: the others' sum is unchanged */
    buckets_step gs = {0}; /* the same buckets as the ranks that trained a batch: every bucket at the end */
    if (ar && ar->world > 1)
        buckets_step_begin(&gs, &tr->buckets, ar, tr->g.data);
    int rc = reduce_grads(tr, &gs, ar, err, errlen);
    if (rc < 0)
        return rc;
    if ((rc = adamw_step(&tr->opt, tr->p.data, tr->g.data, tr->decay, tr->n_decay, info)) < 0)
        return df_err(err, errlen, rc, "AdamW: %s", strerror(-rc));
    return 0;
}

static const trainer_ops cpu_ops = {
    .name = "cpu",
    .bucketed = 1,
    .open = cpu_open,
    .step = cpu_step,
    .step_empty = cpu_step_empty,
    .to_host = cpu_to_host,
    .close = cpu_close,
    .host_live = 1,
};

/* ---- both backends ---- */

int trainer_to_host(trainer *tr, int with_opt, char *err, size_t errlen)
{
    return tr->ops->to_host(tr, with_opt, err, errlen);
}

int trainer_save_start(trainer *tr, ckpt_writer *w, const char *root, char *err, size_t errlen)
{
    int rc;
    if (ckpt_writer_pending(w))
        return df_err(
            err, errlen, -EBUSY,
            "a checkpoint is still being written (collect it first)"); /* before trainer_to_host: it would overwrite the borrowed copies */
    if ((rc = trainer_to_host(tr, 1, err, errlen)) < 0)
        return rc;
    tr->ts.ledger_committed_step = tr->ts.step;
    return ckpt_writer_start(w, root, &tr->cfg, &tr->p, &tr->opt, &tr->ts, tr->ops->host_live, err, errlen);
}

typedef struct export_job {
    const char *dir;
    trainer *tr;
    int rc;
    char err[1024];
} export_job;

static void *export_main(void *arg)
{
    export_job *j = arg; /* host work only: the cuda copy came to tr->p in the caller's thread */
    j->rc = dflash_export_release(j->dir, &j->tr->cfg, &j->tr->p, j->err, sizeof j->err);
    return NULL;
}

int trainer_export(trainer *tr, const char *dir, void (*hb)(void *), void *hb_arg, char *err, size_t errlen)
{
    int rc;
    if ((rc = trainer_to_host(tr, 0, err, errlen)) < 0)
        return rc;
    export_job j = {.dir = dir, .tr = tr};
    pthread_t th;
    if (pthread_create(&th, NULL, export_main, &j) != 0)
        export_main(&j); /* no thread: write it here, without heartbeats */
    else
        (void)hb_wait_join(th, hb, hb_arg, HB_WAIT_LIMIT_S, "release export");
    if (j.rc < 0)
        snprintf(err, errlen, "%s", j.err);
    return j.rc;
}

void trainer_record(trainer *tr, const dflash_stats *st)
{
    if (tr->start_n < TRAINER_START_STEPS) {
        tr->start_loss_sum += st->loss;
        tr->start_n++;
    }
    tr->end_win[(tr->ts.step + TRAINER_END_STEPS - 1) % TRAINER_END_STEPS] = *st;
}

int trainer_write_summary(trainer *tr, const char *run_dir, double secs, char *err, size_t errlen)
{
    dflash_stats end;
    memset(&end, 0, sizeof end);
    int n_end = (int)DF_MIN(tr->ts.step, TRAINER_END_STEPS);
    for (int i = 0; i < n_end; i++)
        dflash_stats_merge(&end, &tr->end_win[i]);
    int B = tr->cfg.block_size;
    double start_loss = tr->start_n ? tr->start_loss_sum / tr->start_n : NAN;
    json_t *acc = json_array();
    for (int k = 1; k < B; k++)
        json_array_append_new(acc, df_json_num_or_null(dflash_stats_acc(&end, k)));
    /* no step in this incarnation (a resume of a trained-out epoch): the losses are unknown,
     * null. A NaN/Inf loss from training (a non-finite step among the last ones) is null
     * too, with "loss_end_nonfinite": true beside it (json_num.h) */
    json_t *j = json_pack("{s:I, s:o, s:o, s:I}", "steps", (json_int_t)tr->ts.step, "loss_start", json_null(),
                          "loss_end", json_null(), "nonfinite_steps", (json_int_t)tr->nonfinite_steps);
    int bad = !j || !acc;
    if (!bad && tr->start_n)
        bad = df_json_set_num(j, "loss_start", start_loss) < 0 || df_json_set_num(j, "loss_end", end.loss) < 0;
    if (!bad)
        bad = json_object_set_new(j, "acc", acc) < 0;
    acc = NULL;
    if (!bad)
        bad = df_json_set_num(j, "expected_tau", dflash_stats_tau(&end, B)) < 0 ||
              df_json_set_num(j, "seconds", secs) < 0 || json_object_set_new(j, "block_size", json_integer(B)) < 0 ||
              json_object_set_new(j, "release_dir", json_string("drafter")) < 0 ||
              json_object_set_new(j, "backend", json_string(tr->ops->name)) < 0 ||
              json_object_set_new(j, "loss", json_string(dflash_loss_name(tr->cfg.loss))) < 0;
    if (!bad) { /* each position's share of the loss weight over the last steps */
        double wpos[DFLASH_MAX_BLOCK];
        json_t *wj = json_array();
        dflash_stats_wpos(&end, B, wpos);
        for (int k = 1; k < B && wj; k++)
            json_array_append_new(wj, df_json_num_or_null(wpos[k - 1]));
        bad = !wj || json_object_set_new(j, "w_pos", wj) < 0;
    }
    char path[1200];
    snprintf(path, sizeof path, "%s/train_summary.json", run_dir);
    char *txt = j && !bad ? json_dumps(j, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    json_decref(acc);
    if (!txt)
        return df_err(err, errlen, -ENOMEM, "%s: out of memory", path);
    int rc = df_write_file_atomic(path, txt, strlen(txt));
    free(txt);
    if (rc < 0)
        return df_err(err, errlen, rc, "%s: %s", path, strerror(-rc));
    df_log("summary: %ld steps, loss %.4f -> %.4f, expected tau %.2f (block %d)%s", tr->ts.step, start_loss, end.loss,
           dflash_stats_tau(&end, B), B, tr->nonfinite_steps ? ", with non-finite steps (nonfinite_steps)" : "");
    return 0;
}
