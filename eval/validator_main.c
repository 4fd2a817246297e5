/* validator: the pipeline's optional validation worker (role "validator", at most one per
 * run; docs/topology.md "validation", docs/operations.md "Validation"). It scores every
 * committed checkpoint of the drafter on a fixed held-out set, teacher-forced, with the
 * training loss's own definition, and appends one line per checkpoint to
 * metrics/<name>.jsonl:
 *   {"t", "worker", "inc", "pid", "ev":"validation", "step", "val_loss", "val_acc":[B-1],
 *    "val_exp_tau", "samples", "eval_s"}
 *
 * What it computes, per checkpoint (the same numbers every time for the same weights):
 *   - the held-out set: the first validation.max_samples samples of validation.shards, each
 *     truncated to data.max_seq_len like the training plan does; the target (CPU, the
 *     topology's capture layers) runs over each once at start, and its captured features
 *     are kept in memory: the target is frozen, so they never change;
 *   - per sample a dflash_batch with drafter.num_anchors anchors drawn by the training's
 *     rule (dflash_sample_anchors) from a FIXED seed (the run seed, batch id
 *     VALIDATOR_BATCH_BASE + sample index), so every checkpoint is scored on the same anchors;
 *   - the drafter's forward and chunked loss without a backward (dflash_loss_and_grad with
 *     no gradient): val_loss = sum(w * CE) / sum(w) over all samples (the training loss,
 *     weights exp(-(k-1)/gamma)), val_acc[k-1] = acc_k for k = 1..B-1, val_exp_tau =
 *     1 + sum_k prod_{j<=k} acc_j (dflash_stats_tau, docs/drafter_quality.md).
 *
 * Which checkpoints: the step dirs under <run_dir>/checkpoints whose step the ledger has
 * committed (ledger.bin written: the commit the orchestrator acknowledges), whose step is a
 * multiple of validation.every_steps (every one when 0), and the last committed one of each epoch;
 * each loaded with dflash_ckpt_load, which verifies the manifest first. A checkpoint the
 * drafter pruned before it was scored is skipped (logged). Stateless across restarts: at
 * start it reads its own jsonl (cutting a torn last line) and scores only steps not in it,
 * so a kill at any instant leaves every step there at most once, and a restart adds the
 * missing ones.
 *
 * When it ends: once every drafter rank is finished (its status slot DONE, FAILED or
 * STOPPED: the epoch's or the run's training is over and its last checkpoint committed)
 * and the last committed checkpoint is scored: exit 0 (in a multi-epoch run the
 * orchestrator starts it again with the next epoch). SIGTERM or the stop flag: exit 0 at the
 * next sample. A crash of the validator never touches training: the supervisor restarts it
 * like any worker and, once its restart budget is spent, gives up on it and lets the run go
 * on (docs/operations.md, "Supervision rules").
 *
 * The same figures go to TensorBoard: <run_dir>/tensorboard/<name>/events.out.tfevents.*,
 * a new file per incarnation, one Event per line at its step with the scalars
 * validation/val_loss, validation/val_acc_<k> (k = 1..B-1), validation/val_exp_tau,
 * validation/samples and validation/eval_s (io/tfevents.h, docs/operations.md "TensorBoard").
 *
 * Fault switches (tests): DF_FAULT_VALIDATOR=crash exits 1 right after ready, every
 * incarnation; DF_FAULT_VALIDATOR_SAMPLE_MS=N sleeps N ms (heartbeating) after each sample
 * of an evaluation, so that a test can kill it in the middle of one.
 *
 * Exit codes: 0 done; 1 temporary (restart me); 2 bad usage / started by hand; 100
 * permanent (no validation section, bad held-out shard, bad target, a checkpoint that does
 * not fit the target). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dflash/dflash_batch.h"
#include "dflash/dflash_ckpt.h"
#include "dflash/dflash_config.h"
#include "dflash/dflash_loss.h"
#include "dflash/dflash_model.h"
#include "eval/eval_pair.h"
#include "io/hfconfig.h"
#include "io/shard.h"
#include "io/tfevents.h"
#include "proc/worker.h"
#include "json_num.h"
#include "target/target_model.h"
#include "util.h"

#define VALIDATOR_BATCH_BASE (1ull << 48) /* anchor stream ids far from any training batch id */
#define VALIDATOR_MAX_STEPS 65536         /* steps remembered as scored (one line each) */

static const char usage_text[] =
    "usage: validator (started by the orchestrator for a worker with role \"validator\")\n"
    "Scores every committed drafter checkpoint on the topology's \"validation\" shards, teacher-forced:\n"
    "loss, per-position accuracy and expected acceptance length, one line per checkpoint in\n"
    "<run_dir>/metrics/<name>.jsonl. docs/operations.md, \"Validation\".\n"
    "exit codes: 0 done, 1 temporary, 2 bad usage, 100 permanent (bad shard, target or checkpoint)\n";

typedef struct val_sample {
    int S;
    int32_t *x;
    uint8_t *mask;
    float *H; /* [S, n_capture * d] */
} val_sample;

typedef struct validator {
    worker_ctx k;
    const topo *t;
    char metrics_path[1200], ckpt_root[1100];
    val_sample *s;
    int n;
    long tokens;
    target_embeddings emb;
    hfconfig hc;
    long done[VALIDATOR_MAX_STEPS]; /* steps already in the jsonl */
    int n_done;
    long failed[256]; /* steps whose checkpoint would not load: not retried by this incarnation */
    int n_failed;
    uint64_t scored; /* evaluations of this incarnation (heartbeat items) */
    long last_step;
    long sample_ms;     /* DF_FAULT_VALIDATOR_SAMPLE_MS */
    tfevents_writer tb; /* <run_dir>/tensorboard/<name>: the same figures for TensorBoard (fd -1: none) */
} validator;

static void heartbeat(validator *v)
{
    ctl_heartbeat(&v->k.ctl, v->last_step > 0 ? (uint64_t)v->last_step : 0, v->scored, (uint64_t)v->tokens);
}

static void sleep_ms(validator *v, long ms)
{
    while (ms > 0) {
        long d = ms > 100 ? 100 : ms;
        struct timespec ts = {0, d * 1000000L};
        nanosleep(&ts, NULL);
        ms -= d;
        heartbeat(v);
        if (ctl_should_stop(&v->k.ctl))
            return;
    }
}

static int has_step(const long *a, int n, long step)
{
    for (int i = 0; i < n; i++)
        if (a[i] == step)
            return 1;
    return 0;
}

/* The held-out set: features of the first max_samples samples, computed once. */
static void load_heldout(validator *v)
{
    const topo *t = v->t;
    char err[1024];
    dataset *ds = NULL;
    int rc = dataset_open(&ds, t->val.shards, t->val.n_shards, err, sizeof err);
    if (rc < 0)
        df_die(rc == -ENOMEM ? DF_EXIT_TEMP : DF_EXIT_PERM, "validation.shards: %s", err);
    uint64_t avail = dataset_n_samples(ds);
    v->n = (int)(avail < t->val.max_samples ? avail : t->val.max_samples);
    if (v->n == 0)
        df_die(DF_EXIT_PERM, "validation.shards (%s%s): no sample", t->val.shards[0],
               t->val.n_shards > 1 ? ", ..." : "");
    if ((rc = hfconfig_load(&v->hc, t->target_model_dir, err, sizeof err)) < 0)
        df_die(DF_EXIT_PERM, "%s", err);
    if (dataset_vocab_size(ds) > (uint32_t)v->hc.vocab_size)
        df_die(DF_EXIT_PERM, "validation.shards: %s: vocab_size %u is larger than the target's (%d, %s/config.json)",
               t->val.shards[0], dataset_vocab_size(ds), v->hc.vocab_size, t->target_model_dir);
    target_model m;
    if ((rc = target_load(&m, t->target_model_dir, t->capture_layers, t->n_capture, err, sizeof err)) < 0)
        df_die(target_exit_code(rc), "%s", err);
    DF_CHECK_ERR(target_reserve(&m, (int)t->max_seq_len));
    int ncd = t->n_capture * m.cfg.hidden_size;
    v->s = calloc((size_t)v->n, sizeof *v->s);
    DF_CHECK(v->s);
    for (int i = 0; i < v->n; i++) {
        const uint32_t *tok;
        const uint8_t *mask;
        uint32_t len;
        DF_CHECK_ERR(dataset_sample(ds, (uint64_t)i, &tok, &mask, &len));
        int S = (int)(len < t->max_seq_len ? len : t->max_seq_len);
        val_sample *s = &v->s[i];
        s->S = S;
        s->x = malloc(sizeof(int32_t) * (size_t)(S > 0 ? S : 1));
        s->mask = malloc((size_t)(S > 0 ? S : 1));
        s->H = malloc(sizeof(float) * (size_t)(S > 0 ? S : 1) * (size_t)ncd);
        DF_CHECK(s->x && s->mask && s->H);
        for (int j = 0; j < S; j++)
            s->x[j] = (int32_t)tok[j];
        memcpy(s->mask, mask, (size_t)S);
        if (S > 0) {
            int32_t starts[2] = {0, S};
            rc = target_forward_cpu(&m, s->x, starts, 1, s->H);
            if (rc < 0)
                df_die(rc == -ERANGE ? DF_EXIT_PERM : DF_EXIT_TEMP, "validation sample %d: target forward: %s", i,
                       rc == -ERANGE ? "a token id is outside the vocabulary" : strerror(-rc));
        }
        v->tokens += S;
        heartbeat(v);
    }
    target_free(&m);
    dataset_close(ds);
    if ((rc = target_load_embeddings(&v->emb, t->target_model_dir, 0, err, sizeof err)) < 0)
        df_die(target_exit_code(rc), "%s", err);
}

/* The steps already scored: one "validation" line each. A last line without its newline
 * (a write cut by a full disk) is cut off, so the next line starts clean. */
static void read_done(validator *v)
{
    char *text = NULL;
    size_t len = 0;
    int rc = df_read_file(v->metrics_path, &text, &len);
    if (rc == -ENOENT)
        return;
    if (rc < 0)
        df_die(DF_EXIT_TEMP, "%s: %s", v->metrics_path, strerror(-rc));
    size_t keep = len;
    while (keep > 0 && text[keep - 1] != '\n')
        keep--;
    if (keep < len) {
        df_log("%s: cutting a torn last line (%zu bytes)", v->metrics_path, len - keep);
        DF_CHECK_ERR(truncate(v->metrics_path, (off_t)keep) == 0 ? 0 : -errno);
    }
    char *line = text, *end = text + keep;
    while (line < end) {
        char *nl = memchr(line, '\n', (size_t)(end - line));
        *nl = 0;
        json_t *j = json_loads(line, 0, NULL);
        json_t *st = json_object_get(j, "step");
        if (json_is_integer(st) && v->n_done < VALIDATOR_MAX_STEPS &&
            !has_step(v->done, v->n_done, (long)json_integer_value(st)))
            v->done[v->n_done++] = (long)json_integer_value(st);
        json_decref(j);
        line = nl + 1;
    }
    free(text);
}

/* Score one checkpoint and append its line. 0; -ENOENT when it vanished (pruned); other
 * -errno when it would not load. */
static int evaluate(validator *v, long step)
{
    const topo *t = v->t;
    char dir[1200], err[1024], cfgf[1300];
    snprintf(dir, sizeof dir, "%s/step-%08ld", v->ckpt_root, step);
    double t0 = df_wall_s();
    dflash_config c;
    dflash_params p;
    int rc = pair_load_drafter(dir, &c, &p, cfgf, sizeof cfgf, err, sizeof err);
    if (rc < 0) {
        if (access(dir, F_OK) != 0)
            return -ENOENT;
        df_log("step %ld: %s: not scored", step, err);
        return rc;
    }
    if ((rc = pair_check(&c, &v->hc, cfgf, t->target_model_dir, err, sizeof err)) < 0 || c.n_capture != t->n_capture)
        df_die(DF_EXIT_PERM, "%s", rc < 0 ? err : "the checkpoint's capture layers are not the topology's");
    df_log("evaluating step %ld on %d held-out samples", step, v->n);
    dflash_frozen fz = {.embed = v->emb.embed, .lm_head = v->emb.lm_head};
    dflash_acts acts;
    memset(&acts, 0, sizeof acts);
    dflash_stats all;
    memset(&all, 0, sizeof all);
    int B = c.block_size;
    for (int i = 0; i < v->n; i++) {
        if (ctl_should_stop(&v->k.ctl)) {
            dflash_acts_free(&acts);
            dflash_params_free(&p);
            return -EINTR;
        }
        val_sample *s = &v->s[i];
        dflash_batch b;
        rc = dflash_batch_init(&b, &c, s->S, (int)t->drafter.num_anchors, s->H, s->x, s->mask, t->seed,
                               VALIDATOR_BATCH_BASE + (uint64_t)i);
        DF_CHECK_ERR(rc);
        if (b.sum_w > 0) {
            dflash_stats st;
            DF_CHECK_ERR(dflash_loss_and_grad(&c, &p, &fz, &b, &acts, NULL, 0, 64, &st));
            dflash_stats_merge(&all, &st);
        }
        dflash_batch_free(&b);
        heartbeat(v);
        if (v->sample_ms > 0)
            sleep_ms(v, v->sample_ms);
    }
    dflash_acts_free(&acts);
    dflash_params_free(&p);
    double eval_s = df_wall_s() - t0;

    json_t *acc = json_array();
    for (int k = 1; k < B; k++)
        json_array_append_new(acc, df_json_num_or_null(dflash_stats_acc(&all, k)));
    json_t *j = json_object();
    double t_line = df_wall_s();
    json_object_set_new(j, "t", json_real(t_line));
    json_object_set_new(j, "worker", json_string(v->k.ctl.name));
    json_object_set_new(j, "inc", json_integer(v->k.ctl.incarnation));
    json_object_set_new(j, "pid", json_integer(getpid()));
    json_object_set_new(j, "ev", json_string("validation"));
    json_object_set_new(j, "step", json_integer(step));
    json_object_set_new(j, "val_loss", df_json_num_or_null(all.sum_w > 0 ? all.wce / all.sum_w : 0.0));
    json_object_set_new(j, "val_acc", acc);
    json_object_set_new(j, "val_exp_tau", df_json_num_or_null(dflash_stats_tau(&all, B)));
    json_object_set_new(j, "samples", json_integer(v->n));
    json_object_set_new(j, "eval_s", json_real(eval_s));
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    DF_CHECK(text);
    size_t n = strlen(text);
    char *line = realloc(text, n + 2);
    DF_CHECK(line);
    line[n] = '\n';
    int fd = open(v->metrics_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    DF_CHECK_ERR(fd < 0 ? -errno : 0);
    rc = df_write_all(fd, line, n + 1); /* one write: a kill leaves the line whole or absent */
    close(fd);
    free(line);
    DF_CHECK_ERR(rc);
    if (v->tb.fd >= 0) { /* after the line, like every metrics line with a step: tags validation/<field> */
        tfevents_summary ts;
        tfevents_summary_init(&ts);
        char tag[64];
#define TB_ADD(name, val) tfevents_summary_add(&ts, name, strlen(name), val)
        TB_ADD("validation/val_loss", all.sum_w > 0 ? all.wce / all.sum_w : 0.0);
        for (int k = 1; k < B; k++) { /* the val_acc array: validation/val_acc_1 .. _<B-1> */
            snprintf(tag, sizeof tag, "validation/val_acc_%d", k);
            TB_ADD(tag, dflash_stats_acc(&all, k));
        }
        TB_ADD("validation/val_exp_tau", dflash_stats_tau(&all, B));
        TB_ADD("validation/samples", v->n);
        TB_ADD("validation/eval_s", eval_s);
#undef TB_ADD
        if (tfevents_write(&v->tb, t_line, step, &ts) < 0)
            df_log("%s: an event could not be written (%llu so far)", v->tb.path,
                   (unsigned long long)v->tb.write_errors);
    }
    df_log("step %ld: val_loss %.4f, acc_1 %.3f, expected tau %.3f (%d samples, %.2fs)", step,
           all.sum_w > 0 ? all.wce / all.sum_w : 0.0, dflash_stats_acc(&all, 1), dflash_stats_tau(&all, B), v->n,
           eval_s);
    if (v->n_done < VALIDATOR_MAX_STEPS)
        v->done[v->n_done++] = step;
    v->scored++;
    v->last_step = step;
    return 0;
}

/* The lowest step that is committed, wanted and not scored yet (or -1). last: the newest
 * committed step dir (always wanted once training is over). */
static long next_step(validator *v, long committed, int finished, long *last)
{
    *last = -1;
    DIR *d = opendir(v->ckpt_root);
    if (!d)
        return -1;
    long best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *endp;
        if (strncmp(e->d_name, "step-", 5) != 0)
            continue;
        long s = strtol(e->d_name + 5, &endp, 10);
        if (*endp || s < 0 || s > committed)
            continue;
        if (s > *last)
            *last = s;
        if (has_step(v->done, v->n_done, s) || has_step(v->failed, v->n_failed, s))
            continue;
        unsigned every = v->t->val.every_steps;
        if ((every == 0 || s % every == 0) && (best < 0 || s < best))
            best = s;
    }
    closedir(d);
    if (best < 0 && finished && *last >= 0 && !has_step(v->done, v->n_done, *last) &&
        !has_step(v->failed, v->n_failed, *last))
        best = *last;
    return best;
}

/* Every drafter rank is finished for this epoch (or for good): each one's slot is DONE,
 * FAILED or STOPPED, and this epoch's ledger is complete or the run is draining (a slot
 * still DONE from the previous epoch, before the orchestrator restarted that rank with the
 * next one, does not count). */
static int drafters_finished(validator *v)
{
    const topo *t = v->t;
    int any = 0;
    if (!ledger_epoch_done(&v->k.ctl.ledger) && !ctl_stop_claiming(&v->k.ctl))
        return 0;
    for (int i = 0; i < t->n_workers; i++) {
        if (t->workers[i].role != TOPOLOGY_ROLE_DRAFTER)
            continue;
        any = 1;
        uint32_t s = atomic_load_explicit(&v->k.ctl.status->slots[i].state, memory_order_acquire);
        if (s != STATUS_DONE && s != STATUS_FAILED && s != STATUS_STOPPED)
            return 0;
    }
    return any;
}

int main(int argc, char **argv)
{
    if (worker_help(argc, argv, usage_text))
        return 0;
    static validator v;
    DF_CHECK_ERR(worker_start(&v.k, "validator", argc, argv));
    v.t = &v.k.ctl.topo;
    if (!v.t->val.enabled)
        df_die(DF_EXIT_PERM, "%s: no \"validation\" section: nothing to validate", v.t->source_path);
    const char *fault = getenv("DF_FAULT_VALIDATOR");
    const char *sms = getenv("DF_FAULT_VALIDATOR_SAMPLE_MS");
    if (sms && *sms) {
        char *endp;
        v.sample_ms = strtol(sms, &endp, 10);
        if (*endp || v.sample_ms < 0)
            df_die(DF_EXIT_USAGE, "DF_FAULT_VALIDATOR_SAMPLE_MS=%s: expected milliseconds", sms);
    }
    if (fault && *fault && strcmp(fault, "crash") != 0)
        df_die(DF_EXIT_USAGE, "DF_FAULT_VALIDATOR=%s: the only switch is \"crash\"", fault);
    snprintf(v.metrics_path, sizeof v.metrics_path, "%s/metrics/%s.jsonl", v.k.ctl.run_dir, v.k.ctl.name);
    snprintf(v.ckpt_root, sizeof v.ckpt_root, "%s/checkpoints", v.k.ctl.run_dir);
    v.last_step = -1;
    load_heldout(&v);
    read_done(&v);
    char tbdir[1200], err[1300];
    snprintf(tbdir, sizeof tbdir, "%s/tensorboard/%s", v.k.ctl.run_dir, v.k.ctl.name);
    if (tfevents_open(&v.tb, tbdir, 0, err, sizeof err) < 0) /* a new file per incarnation */
        df_log("no TensorBoard events: %s", err);            /* the JSONL lines go on */
    DF_CHECK_ERR(ctl_ready(&v.k.ctl));
    df_log("ready: %d held-out samples (%ld tokens) from %s%s; %d steps already scored; scoring %s", v.n, v.tokens,
           v.t->val.shards[0], v.t->val.n_shards > 1 ? " ..." : "", v.n_done,
           v.t->val.every_steps ? "checkpoints at multiples of validation.every_steps and the last"
                                : "every checkpoint");
    if (fault && !strcmp(fault, "crash"))
        df_die(DF_EXIT_TEMP, "DF_FAULT_VALIDATOR=crash: exiting 1 on purpose");
    for (;;) {
        heartbeat(&v);
        if (ctl_should_stop(&v.k.ctl))
            break;
        int finished = drafters_finished(&v);
        long committed = (long)ledger_committed_step(&v.k.ctl.ledger), last;
        long s = next_step(&v, committed, finished, &last);
        if (s >= 0) {
            int rc = evaluate(&v, s);
            if (rc == -ENOENT) {
                df_log("step %ld: the checkpoint was pruned before it was scored (drafter.keep_checkpoints)", s);
                if (v.n_failed < (int)DF_ARRAY_LEN(v.failed))
                    v.failed[v.n_failed++] = s;
            } else if (rc < 0 && rc != -EINTR && v.n_failed < (int)DF_ARRAY_LEN(v.failed)) {
                v.failed[v.n_failed++] = s;
            }
            continue;
        }
        if (finished) {
            df_log("training finished and its last checkpoint (step %ld) is scored: done", last);
            break;
        }
        sleep_ms(&v, 200);
    }
    for (int i = 0; i < v.n; i++) {
        free(v.s[i].x);
        free(v.s[i].mask);
        free(v.s[i].H);
    }
    free(v.s);
    target_embeddings_free(&v.emb);
    hfconfig_free(&v.hc);
    tfevents_close(&v.tb);
    worker_close(&v.k);
    return 0;
}
