/* validator: the pipeline's optional validation worker (role "validator", at most one per
 * run; docs/topology.md "validation", docs/operations.md "Validation"). It scores every
 * committed checkpoint of the drafter on a fixed held-out set, teacher-forced, with the
 * training loss's own definition, and appends one line per checkpoint to
 * metrics/<name>.jsonl:
 *   {"t", "worker", "inc", "pid", "ev":"validation", "step", "val_loss", "val_acc":[B-1],
 *    "val_exp_tau", "samples", "eval_s", "load_s"}
 * (the names after "step" are io/metrics_keys.h's VALIDATION_KEYS, shared with the line's
 * readers: the orchestrator's report and dfctl)
 *
 * What it computes, per checkpoint (the same numbers every time for the same weights), is
 * eval/heldout.h's:
 *   - the held-out set: the first validation.max_samples samples of validation.shards, each
 *     truncated to data.max_seq_len like the training plan does; the target (the topology's
 *     capture layers) runs over each once at start, and its captured features are kept:
 *     the target is frozen, so they never change;
 *   - per sample a dflash_batch with drafter.num_anchors anchors drawn by the training's
 *     rule (dflash_sample_anchors) from a FIXED seed (the run seed, batch id
 *     HELDOUT_BATCH_BASE + sample index), so every checkpoint is scored on the same anchors;
 *   - the drafter's forward and chunked loss without a backward: val_loss = sum(w * CE) /
 *     sum(w) over all samples (the training loss, weights exp(-(k-1)/gamma)), val_acc[k-1] =
 *     acc_k for k = 1..B-1, val_exp_tau = 1 + sum_k prod_{j<=k} acc_j (dflash_stats_tau,
 *     docs/drafter_quality.md).
 * Where: on the CPU when the worker's "gpu" is -1 (the default: fp32 target forward and
 * dflash_loss_and_grad), on that CUDA device otherwise (backend "cuda" only: the CUDA
 * target, bf16 features in pinned host memory, the drafter's forward-only CUDA step; the
 * same figures up to bf16 rounding). eval_s is the evaluation's wall time, load_s the part
 * spent loading and verifying the checkpoint.
 *
 * By hand (no orchestrator): validator --topology FILE [--device cpu|N] CHECKPOINT... scores
 * the given checkpoint dirs (or release dirs) on the topology's validation set and prints
 * one JSON line each on stdout (tests/gpu_test_validator.sh compares the two backends so).
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
 * validation/samples, validation/eval_s and validation/load_s (io/tfevents.h,
 * docs/operations.md "TensorBoard").
 *
 * Fault switches (tests): DF_FAULT_VALIDATOR=crash exits 1 right after ready, every
 * incarnation; DF_FAULT_VALIDATOR_SAMPLE_MS=N sleeps N ms (heartbeating) after each sample
 * of an evaluation, so that a test can kill it in the middle of one.
 *
 * Exit codes: 0 done; 1 temporary (restart me); 2 bad usage / started by hand without
 * --topology; 100 permanent (no validation section, bad held-out shard, bad target, a
 * checkpoint that does not fit the target, a GPU validator in a build without CUDA or on a
 * device the machine does not have). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dflash/dflash_config.h"
#include "dflash/dflash_loss.h"
#include "dflash/dflash_model.h"
#include "eval/eval_pair.h"
#include "eval/heldout.h"
#include "io/metrics_keys.h"
#include "io/tfevents.h"
#include "proc/worker.h"
#include "json_num.h"
#include "util.h"

#define VALIDATOR_MAX_STEPS 65536 /* steps remembered as scored (one line each) */

static const char usage_text[] =
    "usage: validator (started by the orchestrator for a worker with role \"validator\")\n"
    "       validator --topology FILE [--device cpu|N] CHECKPOINT...   (by hand)\n"
    "Scores every committed drafter checkpoint on the topology's \"validation\" shards, teacher-forced:\n"
    "loss, per-position accuracy and expected acceptance length, one line per checkpoint in\n"
    "<run_dir>/metrics/<name>.jsonl; on the CPU, or on the GPU the validator worker's \"gpu\" names\n"
    "(backend \"cuda\"). docs/operations.md, \"Validation\".\n"
    "By hand: scores the CHECKPOINT dirs (step or root dirs of a run, or release dirs) on the\n"
    "topology's validation set and prints one JSON line each on stdout.\n"
    "  --topology FILE   the run's topology (target, capture layers, validation, num_anchors, seed)\n"
    "  --device cpu|N    where (default: the topology validator's gpu, the CPU when it has none)\n"
    "exit codes: 0 done, 1 temporary, 2 bad usage, 100 permanent (bad shard, target, checkpoint or device)\n";

typedef struct validator {
    worker_ctx k;
    const topo *t;
    char metrics_path[1200], ckpt_root[1100];
    heldout_set hs;
    int device;                     /* -1: the CPU */
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
    ctl_heartbeat(&v->k.ctl, v->last_step > 0 ? (uint64_t)v->last_step : 0, v->scored, (uint64_t)v->hs.tokens);
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

/* After each held-out sample: the heartbeat, the fault switch's sleep while scoring, and the
 * stop flag. */
static int tick(void *arg, int phase)
{
    validator *v = arg;
    heartbeat(v);
    if (phase == 1 && v->sample_ms > 0)
        sleep_ms(v, v->sample_ms);
    return ctl_should_stop(&v->k.ctl);
}

/* The options of the topology's validation set on device (-1: the CPU). */
static void heldout_opts_of(const topo *t, int device, heldout_opts *o)
{
    memset(o, 0, sizeof *o);
    o->target_dir = t->target_model_dir;
    o->capture = t->capture_layers;
    o->n_capture = t->n_capture;
    o->shards = t->val.shards;
    o->n_shards = t->val.n_shards;
    o->max_samples = t->val.max_samples;
    o->max_seq_len = t->max_seq_len;
    o->num_anchors = (int)t->drafter.num_anchors;
    o->seed = t->seed;
    o->device = device;
}

/* The held-out set: features of the first max_samples samples, computed once. A stop
 * request in the middle ends the worker (0). where: what chose the device, for messages. */
static void open_heldout(heldout_set *hs, const topo *t, int device, validator *v, const char *where)
{
    heldout_opts o;
    heldout_opts_of(t, device, &o);
    if (v) {
        o.tick = tick;
        o.tick_arg = v;
    }
    char err[1400];
    int rc = heldout_open(hs, &o, err, sizeof err);
    if (rc == -EINTR) {
        df_log("stopped before the held-out set was ready");
        exit(DF_EXIT_OK);
    }
    if (rc < 0) {
        if (device >= 0 && (rc == -ENOTSUP || rc == -ENODEV))
            df_die(heldout_exit_code(rc), "%s: %s", where, err);
        df_die(heldout_exit_code(rc), "%s", err);
    }
    char dev[32] = "the CPU";
    if (device >= 0)
        snprintf(dev, sizeof dev, "CUDA device %d", device);
    df_log("held-out set: %d samples, %ld tokens from %s%s; features %.1f MiB in %s (target forward on %s, %.2f s)",
           hs->n, hs->tokens, t->val.shards[0], t->val.n_shards > 1 ? " ..." : "",
           (double)hs->feature_bytes / (1 << 20), hs->feature_where, dev, hs->features_s);
}

/* val_loss, val_acc and val_exp_tau of one evaluation into j (the names: io/metrics_keys.h). */
static void put_figures(json_t *j, const dflash_stats *all, int B)
{
    json_t *acc = json_array();
    for (int k = 1; k < B; k++)
        json_array_append_new(acc, df_json_num_or_null(dflash_stats_acc(all, k)));
    json_object_set_new(j, VALIDATION_KEY_LOSS, df_json_num_or_null(all->sum_w > 0 ? all->wce / all->sum_w : 0.0));
    json_object_set_new(j, VALIDATION_KEY_ACC, acc);
    json_object_set_new(j, VALIDATION_KEY_EXP_TAU, df_json_num_or_null(dflash_stats_tau(all, B)));
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

/* "1,3": n layer ids, for messages (cut to fit out) */
static void layer_list(const int *ids, int n, char *out, size_t cap)
{
    size_t len = 0;
    out[0] = 0;
    for (int i = 0; i < n && len < cap; i++) {
        int k = snprintf(out + len, cap - len, "%s%d", i ? "," : "", ids[i]);
        len += k > 0 ? (size_t)k : 0;
    }
}

/* The drafter c (its config cfgf) was trained on the features of the topology's capture
 * layers, in their order: the held-out features are those. DF_EXIT_PERM naming both
 * fields otherwise. */
static void check_layers(const dflash_config *c, const topo *t, const char *cfgf)
{
    int same = c->n_capture == t->n_capture;
    for (int i = 0; same && i < c->n_capture; i++)
        same = c->target_layer_ids[i] == t->capture_layers[i];
    if (same)
        return;
    char a[400], b[400];
    layer_list(c->target_layer_ids, c->n_capture, a, sizeof a);
    layer_list(t->capture_layers, t->n_capture, b, sizeof b);
    df_die(DF_EXIT_PERM,
           "%s: dflash_config.target_layer_ids is [%s], but %s: target.capture_layers is [%s]: the held-out "
           "features are those of the topology's layers",
           cfgf, a, t->source_path, b);
}

/* Load a checkpoint (or release) dir and score it. 0 with *B and *load_s set; -ENOENT when
 * it vanished (pruned); -EINTR when stopped; other -errno when it would not load (logged).
 * A drafter that does not fit the target, or a failed score, ends the process. */
static int score_dir(heldout_set *hs, const topo *t, const char *dir, long step, dflash_stats *all, int *B,
                     double *load_s)
{
    char err[1400], cfgf[1300];
    double t0 = df_wall_s();
    dflash_config c;
    dflash_params p;
    int rc = pair_load_drafter(dir, &c, &p, cfgf, sizeof cfgf, err, sizeof err);
    *load_s = df_wall_s() - t0;
    if (rc < 0) {
        if (access(dir, F_OK) != 0)
            return -ENOENT;
        if (step >= 0)
            df_log("step %ld: %s: not scored", step, err);
        else
            df_log("%s", err);
        return rc;
    }
    if ((rc = pair_check(&c, &hs->hc, cfgf, t->target_model_dir, err, sizeof err)) < 0)
        df_die(DF_EXIT_PERM, "%s", err);
    check_layers(&c, t, cfgf);
    *B = c.block_size;
    rc = heldout_score(hs, &c, &p, all, err, sizeof err);
    dflash_params_free(&p);
    if (rc < 0 && rc != -EINTR)
        df_die(heldout_exit_code(rc), "%s: %s", dir, err);
    return rc;
}

/* Score one checkpoint and append its line. 0; -ENOENT when it vanished (pruned); other
 * -errno when it would not load. */
static int evaluate(validator *v, long step)
{
    const topo *t = v->t;
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/step-%08ld", v->ckpt_root, step);
    double t0 = df_wall_s(), load_s = 0;
    df_log("evaluating step %ld on %d held-out samples", step, v->hs.n);
    dflash_stats all;
    int B = 0;
    int rc = score_dir(&v->hs, t, dir, step, &all, &B, &load_s);
    if (rc < 0)
        return rc;
    double eval_s = df_wall_s() - t0;
    if (v->device >= 0 && v->scored == 0)
        df_log("drafter forward context: %.2f GiB on CUDA device %d", (double)v->hs.device_bytes / (1u << 30),
               v->device);

    json_t *j = json_object();
    double t_line = df_wall_s();
    json_object_set_new(j, "t", json_real(t_line));
    json_object_set_new(j, "worker", json_string(v->k.ctl.name));
    json_object_set_new(j, "inc", json_integer(v->k.ctl.incarnation));
    json_object_set_new(j, "pid", json_integer(getpid()));
    json_object_set_new(j, "ev", json_string(VALIDATION_EV));
    json_object_set_new(j, "step", json_integer(step));
    put_figures(j, &all, B);
    json_object_set_new(j, VALIDATION_KEY_SAMPLES, json_integer(v->hs.n));
    json_object_set_new(j, VALIDATION_KEY_EVAL_S, json_real(eval_s));
    json_object_set_new(j, VALIDATION_KEY_LOAD_S, json_real(load_s));
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
#define TB_TAG(key) VALIDATION_EV "/" key
        TB_ADD(TB_TAG(VALIDATION_KEY_LOSS), all.sum_w > 0 ? all.wce / all.sum_w : 0.0);
        for (int k = 1; k < B; k++) { /* the val_acc array: validation/val_acc_1 .. _<B-1> */
            snprintf(tag, sizeof tag, TB_TAG(VALIDATION_KEY_ACC) "_%d", k);
            TB_ADD(tag, dflash_stats_acc(&all, k));
        }
        TB_ADD(TB_TAG(VALIDATION_KEY_EXP_TAU), dflash_stats_tau(&all, B));
        TB_ADD(TB_TAG(VALIDATION_KEY_SAMPLES), v->hs.n);
        TB_ADD(TB_TAG(VALIDATION_KEY_EVAL_S), eval_s);
        TB_ADD(TB_TAG(VALIDATION_KEY_LOAD_S), load_s);
#undef TB_TAG
#undef TB_ADD
        if (tfevents_write(&v->tb, t_line, step, &ts) < 0)
            df_log("%s: an event could not be written (%llu so far)", v->tb.path,
                   (unsigned long long)v->tb.write_errors);
    }
    df_log("step %ld: val_loss %.4f, acc_1 %.3f, expected tau %.3f (%d samples, %.2fs, of which %.2fs loading)", step,
           all.sum_w > 0 ? all.wce / all.sum_w : 0.0, dflash_stats_acc(&all, 1), dflash_stats_tau(&all, B), v->hs.n,
           eval_s, load_s);
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

/* By hand: validator --topology FILE [--device cpu|N] CHECKPOINT... (one JSON line each). */
static int by_hand(int argc, char **argv)
{
    static const struct option opts[] = {{"topology", required_argument, NULL, 't'},
                                         {"device", required_argument, NULL, 'd'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *topo_path = NULL, *dev = NULL;
    int ch;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 't': topo_path = optarg; break;
        case 'd': dev = optarg; break;
        case 'h': fputs(usage_text, stdout); return DF_EXIT_OK;
        default: fputs(usage_text, stderr); return DF_EXIT_USAGE;
        }
    }
    if (!topo_path || optind >= argc) {
        fprintf(stderr, "validator: --topology FILE and at least one CHECKPOINT dir are required\n%s", usage_text);
        return DF_EXIT_USAGE;
    }
    static topo t;
    char err[1400], where[1300];
    int rc = topology_load(&t, topo_path, err, sizeof err);
    if (rc < 0)
        df_die(rc == -EINVAL ? DF_EXIT_USAGE : DF_EXIT_PERM, "%s", err);
    if (!t.val.enabled)
        df_die(DF_EXIT_PERM, "%s: no \"validation\" section: nothing to validate", topo_path);
    int vi = topology_find_validator(&t), device = vi >= 0 ? t.workers[vi].gpu : -1;
    snprintf(where, sizeof where, "%s: workers[%d].gpu = %d", topo_path, vi, device);
    if (dev) {
        long long d;
        if (!strcmp(dev, "cpu"))
            device = -1;
        else if (df_parse_int(dev, 0, TOPOLOGY_MAX_GPU, &d) == 0)
            device = (int)d;
        else
            df_die(DF_EXIT_USAGE, "--device: expected cpu or a CUDA device 0..%d, got '%s'", TOPOLOGY_MAX_GPU, dev);
        snprintf(where, sizeof where, "--device");
    }
    heldout_set hs;
    open_heldout(&hs, &t, device, NULL, where);
    for (int a = optind; a < argc; a++) {
        dflash_stats all;
        int B = 0;
        double t0 = df_wall_s(), load_s = 0;
        if ((rc = score_dir(&hs, &t, argv[a], -1, &all, &B, &load_s)) < 0)
            df_die(heldout_exit_code(rc), "%s: not scored (%s)", argv[a],
                   rc == -ENOENT ? "no such directory" : strerror(-rc));
        double eval_s = df_wall_s() - t0;
        json_t *j = json_object();
        char backend[32] = "cpu";
        if (device >= 0)
            snprintf(backend, sizeof backend, "cuda:%d", device);
        json_object_set_new(j, "checkpoint", json_string(argv[a]));
        json_object_set_new(j, "backend", json_string(backend));
        put_figures(j, &all, B); /* the figures of a "validation" line under its names, then by-hand extras */
        json_object_set_new(j, VALIDATION_KEY_SAMPLES, json_integer(hs.n));
        json_object_set_new(j, "tokens", json_integer(hs.tokens));
        json_object_set_new(j, "features_s", json_real(hs.features_s));
        json_object_set_new(j, VALIDATION_KEY_EVAL_S, json_real(eval_s));
        json_object_set_new(j, VALIDATION_KEY_LOAD_S, json_real(load_s));
        json_object_set_new(j, "feature_bytes", json_integer((json_int_t)hs.feature_bytes));
        json_object_set_new(j, "device_bytes", json_integer((json_int_t)hs.device_bytes));
        /* the statistics themselves, for comparisons that want counts, not ratios */
        json_object_set_new(j, "wce", json_real(all.wce));
        json_object_set_new(j, "sum_w", json_real(all.sum_w));
        json_t *cnt = json_array(), *cor = json_array();
        for (int k = 0; k < B; k++) {
            json_array_append_new(cnt, json_real(all.count[k]));
            json_array_append_new(cor, json_real(all.correct[k]));
        }
        json_object_set_new(j, "count", cnt);
        json_object_set_new(j, "correct", cor);
        char *text = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        DF_CHECK(text);
        printf("%s\n", text);
        fflush(stdout);
        free(text);
    }
    heldout_close(&hs);
    topology_free(&t);
    return DF_EXIT_OK;
}

int main(int argc, char **argv)
{
    if (worker_help(argc, argv, usage_text))
        return 0;
    for (int a = 1; a < argc; a++)
        if (!strcmp(argv[a], "--topology") || !strncmp(argv[a], "--topology=", 11)) {
            df_log_init("validator");
            return by_hand(argc, argv);
        }
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
    v.device = v.k.ctl.self->gpu;
    char where[1300];
    snprintf(where, sizeof where, "%s: workers[%d].gpu = %d", v.t->source_path, v.k.ctl.id, v.device);
    if (v.device < 0 && v.t->backend == TOPOLOGY_CUDA)
        df_log("the validator runs on the CPU (hours per checkpoint at a real target size): give its worker a "
               "\"gpu\" to score on that GPU (docs/operations.md, \"Validation\")");
    open_heldout(&v.hs, v.t, v.device, &v, where);
    read_done(&v);
    char tbdir[1200], err[1300];
    snprintf(tbdir, sizeof tbdir, "%s/tensorboard/%s", v.k.ctl.run_dir, v.k.ctl.name);
    if (tfevents_open(&v.tb, tbdir, 0, err, sizeof err) < 0) /* a new file per incarnation */
        df_log("no TensorBoard events: %s", err);            /* the JSONL lines go on */
    DF_CHECK_ERR(ctl_ready(&v.k.ctl));
    df_log("ready: %d held-out samples (%ld tokens) from %s%s on %s; %d steps already scored; scoring %s", v.hs.n,
           v.hs.tokens, v.t->val.shards[0], v.t->val.n_shards > 1 ? " ..." : "", v.device >= 0 ? "the GPU" : "the CPU",
           v.n_done,
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
    heldout_close(&v.hs);
    tfevents_close(&v.tb);
    worker_close(&v.k);
    return 0;
}
