/* resume.c: what `orchestrator --resume` checks before it trusts a run dir, besides the
 * data files (data_files.json, setup.c).
 *
 *   ledger.bin read and verified (resume_load_snapshot: its own checksums, ledger.c); setup.c
 *              restores it into the plan rebuilt from the topology and the data.
 *   run state  ledger.bin against the checkpoints and the final files on disk. The
 *              orchestrator writes ledger.bin when a run starts and at every commit, so a
 *              run dir that holds checkpoints, an audit or a summary but no ledger.bin lost
 *              the one record of what those checkpoints trained: refused, never restarted
 *              from step 0 over them. The committed step's checkpoint must be there (the
 *              drafter continues from it). Checkpoints newer than the committed step are
 *              what a stop between a checkpoint's write and its commit leaves: logged, and
 *              trained again from the committed one.
 *   topology   the topology to resume with (the run dir's topology.json, possibly edited,
 *              or the file given) against the record of what the run was started with
 *              (RESUME_RECORD, updated only when a change is accepted). Every difference is
 *              logged as `field: old -> new`. Only the fields of the safe list below may
 *              change, and only with --accept-changes; before anything was committed any
 *              field may (nothing on disk depends on it yet). docs/operations.md, "Resume".
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orch.h"
#include "util.h"

/* ---- run state -------------------------------------------------------------------- */

/* Read <run_dir>/ledger.bin into aligned memory (ledger_snapshot_open wants it) and verify
 * it. 0 (snap open on *mem, caller frees *mem), -ENOENT when there is none, other -errno
 * with err naming the file and what is wrong. */
int resume_load_snapshot(orch *o, ledger *snap, void **mem, char *err, size_t errlen)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/ledger.bin", o->run_dir);
    char *buf = NULL;
    size_t len = 0;
    *mem = NULL;
    int rc = df_read_file(path, &buf, &len);
    if (rc < 0)
        return df_err(err, errlen, rc, "%s: %s", path, strerror(-rc));
    size_t cap = (len + 63) & ~(size_t)63;
    void *m = aligned_alloc(64, cap ? cap : 64);
    if (!m) {
        free(buf);
        return -ENOMEM;
    }
    memset(m, 0, cap ? cap : 64);
    memcpy(m, buf, len);
    free(buf);
    char why[512];
    rc = ledger_snapshot_open(snap, m, len, why, sizeof why);
    if (rc < 0) {
        snprintf(err, errlen, "%s: %s; refusing to resume from it", path, why);
        free(m);
        return rc;
    }
    *mem = m;
    return 0;
}

#define CKPT_LIST_MAX 4096

typedef struct ckpt_list {
    int has_dir; /* <run_dir>/checkpoints exists */
    int n;       /* step dirs found (sorted ascending), at most CKPT_LIST_MAX kept */
    uint64_t step[CKPT_LIST_MAX];
} ckpt_list;

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The drafter's step dirs: "step-" and 8 or more digits (dflash_ckpt's naming); temp and
 * aside dirs (.tmp-*, .old-*) and `latest` are not checkpoints. */
static int list_checkpoints(const char *run_dir, ckpt_list *cl, char *err, size_t errlen)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/checkpoints", run_dir);
    memset(cl, 0, sizeof *cl);
    DIR *d = opendir(path);
    if (!d) {
        if (errno == ENOENT)
            return 0;
        int e = errno;
        return df_err(err, errlen, -e, "%s: %s", path, strerror(e));
    }
    cl->has_dir = 1;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *s = de->d_name;
        if (strncmp(s, "step-", 5) != 0 || strlen(s) < 13 || strspn(s + 5, "0123456789") != strlen(s + 5))
            continue;
        if (cl->n < CKPT_LIST_MAX)
            cl->step[cl->n++] = strtoull(s + 5, NULL, 10);
    }
    closedir(d);
    qsort(cl->step, (size_t)cl->n, sizeof cl->step[0], cmp_u64);
    return 0;
}

/* "step-00000036, step-00000038 (2)" for the steps in [from, n) of cl, at most 6 named */
static void name_steps(const ckpt_list *cl, int from, char *out, size_t cap)
{
    size_t len = 0;
    out[0] = 0;
    int count = cl->n - from;
    for (int i = from; i < cl->n && len < cap; i++) {
        int shown = i - from;
        int n = shown < 5 || i == cl->n - 1 ? snprintf(out + len, cap - len, "%sstep-%08llu", shown ? ", " : "",
                                                       (unsigned long long)cl->step[i])
                : shown == 5                ? snprintf(out + len, cap - len, ", ...")
                                            : 0;
        if (n > 0)
            len += (size_t)n;
    }
    if (len < cap && count > 1)
        snprintf(out + len, cap - len, " (%d)", count);
}

static int exists(const char *dir, const char *name)
{
    char path[1300];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

/* Whether the final audit <run_dir>/<name> records a committed step (an audit is written
 * at the end of every run, also of one that committed nothing; unreadable counts as yes) */
static int audit_committed(const orch *o, const char *name)
{
    char path[1300];
    snprintf(path, sizeof path, "%s/%s", o->run_dir, name);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    json_t *st = json_object_get(j, "committed_step");
    int yes = !json_is_integer(st) || json_integer_value(st) > 0;
    json_decref(j);
    return yes;
}

/* What a run that committed something leaves beside ledger.bin, as a list for a message
 * ("" when none): checkpoint dirs, the summary, the release export, and (with_audits) the
 * final audits that record a commit. */
static void committed_evidence(const orch *o, const ckpt_list *cl, int with_audits, char *out, size_t cap)
{
    size_t len = 0;
    out[0] = 0;
#define ADD(...)                                                        \
    do {                                                                \
        int n_ = snprintf(out + len, cap - len, "%s", len ? "; " : ""); \
        if (n_ > 0 && (size_t)n_ < cap - len)                           \
            len += (size_t)n_;                                          \
        n_ = snprintf(out + len, cap - len, __VA_ARGS__);               \
        if (n_ > 0 && (size_t)n_ < cap - len)                           \
            len += (size_t)n_;                                          \
    } while (0)
    if (cl->n > 0) {
        char steps[400];
        name_steps(cl, 0, steps, sizeof steps);
        ADD("checkpoints/ %s", steps);
    }
    DIR *d = with_audits ? opendir(o->run_dir) : NULL;
    if (d) {
        struct dirent *de;
        while ((de = readdir(d)) != NULL)
            if (!strncmp(de->d_name, "ledger_audit", 12) && strstr(de->d_name, ".json") &&
                audit_committed(o, de->d_name))
                ADD("%s", de->d_name);
        closedir(d);
    }
    if (exists(o->run_dir, "train_summary.json"))
        ADD("train_summary.json");
    if (exists(o->run_dir, "drafter/config.json"))
        ADD("drafter/ (the release export)");
#undef ADD
}

int resume_check_state(orch *o, int writes_checkpoints, int *fresh, char *err, size_t errlen)
{
    *fresh = 0;
    ledger snap;
    void *mem = NULL;
    int rc = resume_load_snapshot(o, &snap, &mem, err, errlen);
    if (rc < 0 && rc != -ENOENT)
        return rc; /* there but damaged: its own message */
    int have = rc == 0;
    uint64_t N = have ? ledger_committed_step(&snap) : 0;
    uint32_t epoch = have ? ledger_epoch(&snap) : 0;
    /* a finished run reads no checkpoint again (--resume only reports it complete) */
    int complete = have && ledger_epoch_done(&snap) && epoch + 1 >= DF_MAX(o->t.drafter.epochs, 1u) &&
                   exists(o->run_dir, "train_summary.json");
    free(mem);
    err[0] = 0;

    ckpt_list *cl = calloc(1, sizeof *cl);
    if (!cl)
        return -ENOMEM;
    char evidence[1500], steps[400];
    if ((rc = list_checkpoints(o->run_dir, cl, err, errlen)) < 0)
        goto out;
    committed_evidence(o, cl, !have, evidence, sizeof evidence);
    if (!have) {
        if (evidence[0]) {
            rc = df_err(err, errlen, -EINVAL,
                        "%s/ledger.bin is missing, but the run dir holds what committed work leaves behind: %s. "
                        "ledger.bin is the only record of which batches those contain: a resume without it "
                        "would train from step 0 and overwrite them. Put ledger.bin back (a copy of it), or leave "
                        "this run dir as it is and start a new run with another run_dir (`dflash_tool export "
                        "%s/checkpoints DIR` and drafter.init_dir DIR start it from these weights); refusing to "
                        "resume",
                        o->run_dir, evidence, o->run_dir);
            goto out;
        }
        df_log("resume: no %s/ledger.bin and nothing committed on disk (no checkpoint, audit or summary): "
               "the run starts from step 0",
               o->run_dir);
        *fresh = 1;
        rc = 0;
        goto out;
    }
    int found = 0, newer = cl->n;
    for (int i = 0; i < cl->n; i++) {
        found |= cl->step[i] == N;
        if (cl->step[i] > N && newer == cl->n)
            newer = i;
    }
    /* the committed checkpoint: the real drafter continues from it (a fake test drafter
     * writes none, and then there is no checkpoints/ either) */
    if (N > 0 && (cl->has_dir || writes_checkpoints) && !found && !complete) {
        name_steps(cl, 0, steps, sizeof steps);
        rc = df_err(err, errlen, -EINVAL,
                    "%s/ledger.bin commits the batches up to step %llu, but %s/checkpoints/step-%08llu is missing "
                    "(on disk: %s): the drafter continues from that checkpoint and nothing else matches the ledger. "
                    "Put it back, or start a new run with another run_dir; refusing to resume",
                    o->run_dir, (unsigned long long)N, o->run_dir, (unsigned long long)N,
                    cl->has_dir ? (cl->n ? steps : "no checkpoint") : "no checkpoints/ directory");
        goto out;
    }
    if (newer < cl->n) {
        name_steps(cl, newer, steps, sizeof steps);
        df_log("resume: checkpoints/ %s %s newer than the ledger's committed step %llu: written, but the run stopped "
               "before committing %s (or ledger.bin is older than the checkpoints); training continues from step "
               "%llu, the batches after it are trained again and a checkpoint of the same step replaces the one "
               "there",
               steps, cl->n - newer > 1 ? "are" : "is", (unsigned long long)N, cl->n - newer > 1 ? "them" : "it",
               (unsigned long long)N);
    }
    *fresh = N == 0 && epoch == 0 && !evidence[0];
    rc = 0;
out:
    free(cl);
    return rc;
}

/* ---- topology ------------------------------------------------------------------------ */

/* A field that may change on resume (--accept-changes), or may not, and why. Matched
 * against the field's pattern: workers["x"].env.K -> workers[].env.K; an entry matches the
 * pattern itself and everything below it. First match wins; no match: not safe. */
typedef struct change_rule {
    const char *pattern;
    int safe;
    const char *why;
} change_rule;

static const char WHY_PLAN[] = "the ledger's plan (which batches exist, their order, the LR schedule's length) is "
                               "built from it, and ledger.bin holds that plan's hash";
static const char WHY_OPT[] = "the committed checkpoint's optimizer state carries it: the resumed drafter would go "
                              "on with the old value";
static const char WHY_SHAPE[] = "the committed checkpoint's weights were made with it (their shape, or the target and "
                                "features they were trained on)";
static const char WHY_LOSS[] = "it defines what the run optimises: one run trains one objective";
static const char WHY_RUN[] = "it is what the run is (where it lives, what it runs on, how it is ordered)";

static const change_rule RULES[] = {
    {"name", 1, "a label in logs and metrics"},
    {"description", 1, "free text"},
    {"supervision", 1,
     "the supervisor's policy (restarts, backoff, timeouts, metrics cadence) is read afresh at every start"},
    {"drafter.checkpoint_every", 1, "checkpoint cadence: each checkpoint commits what was trained before it"},
    {"drafter.keep_checkpoints", 1, "how many old checkpoints are kept (the committed one never goes)"},
    {"drafter.checkpoint_async", 1, "how a checkpoint is written, not what it holds"},
    {"drafter.max_checkpoint_failures", 1, "a failure limit"},
    {"drafter.max_nonfinite_steps", 1, "a failure limit"},
    {"drafter.allreduce_bucket_kb", 1, "how gradients are all-reduced; the sum's bits do not depend on it"},
    {"drafter.lr", 0, WHY_OPT},
    {"drafter.warmup_frac", 0, WHY_OPT},
    {"drafter.weight_decay", 0, WHY_OPT},
    {"drafter.grad_clip", 0, WHY_OPT},
    {"drafter.epochs", 0, WHY_PLAN},
    {"drafter.gamma", 0, WHY_LOSS},
    {"drafter.noise_std", 0, WHY_LOSS},
    {"drafter.num_anchors", 0, WHY_LOSS},
    {"drafter", 0, WHY_SHAPE}, /* num_layers, block_size, mask_token_id, init_dir, layer_types, sliding_window */
    {"target", 0, WHY_SHAPE},
    {"seed", 0, WHY_PLAN},
    {"data", 0, WHY_PLAN},
    {"validation", 1, "the validator only scores committed checkpoints; training does not read it"},
    {"workers[].heartbeat_timeout_ms", 1, "a watchdog timeout"},
    {"workers[].startup_timeout_ms", 1, "a watchdog timeout"},
    {"workers[].env", 1, "the worker's extra environment (passed through unread: you vouch for it)"},
    {"rings[].slots", 1, "ring capacity: rings are re-made at every start"},
    {"rings[].slot_bytes", 1, "slot size: rings are re-made at every start"},
    {"rings[].max_attempts", 1, "the poison limit of batches from now on"},
    {"run_dir", 0, WHY_RUN},
    {"backend", 0, WHY_RUN},
    {"deterministic", 0, WHY_RUN},
    {"binaries", 0, WHY_RUN},
    {"version", 0, WHY_RUN},
};

static const char WHY_WORKER_ADD[] =
    "a target, postproc or validator worker more or less: batches are claimed from the "
    "ledger, whoever computes them";
static const char WHY_DRAFTER_ADD[] = "the drafter ranks split each step's batches: the step count and the LR "
                                      "schedule depend on their number";
static const char WHY_OTHER[] = "not on the list of fields that may change on resume";

static int rule_match(const char *pattern, const char *rule)
{
    size_t n = strlen(rule);
    return !strncmp(pattern, rule, n) && (pattern[n] == 0 || pattern[n] == '.');
}

/* Whether a change of `pattern` may be accepted; *why: the reason either way. a / b: the
 * old / new value (NULL: absent), for workers added or removed. */
static int classify(const char *pattern, const json_t *a, const json_t *b, const char **why)
{
    if (!strcmp(pattern, "workers[]")) { /* a worker added or removed: by its role */
        const char *role = json_string_value(json_object_get(a ? a : b, "role"));
        int ok = role && (!strcmp(role, "target") || !strcmp(role, "postproc") || !strcmp(role, "validator") ||
                          !strcmp(role, "test"));
        *why = ok ? WHY_WORKER_ADD : role && !strcmp(role, "drafter") ? WHY_DRAFTER_ADD : WHY_OTHER;
        return ok;
    }
    for (size_t i = 0; i < DF_ARRAY_LEN(RULES); i++)
        if (rule_match(pattern, RULES[i].pattern)) {
            *why = RULES[i].why;
            return RULES[i].safe;
        }
    *why = WHY_OTHER;
    return 0;
}

/* One value for a message: compact JSON (reals with 12 digits: 0.0006, not
 * 0.00059999999999999995), "absent" for none; at most cap bytes. */
static void show(const json_t *v, char *out, size_t cap)
{
    if (!v) {
        snprintf(out, cap, "absent");
        return;
    }
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(12));
    snprintf(out, cap, "%s", s ? s : "?");
    if (s && strlen(s) >= cap && cap > 4)
        memcpy(out + cap - 4, "...", 4);
    free(s);
}

static void add_change(json_t *out, const char *path, const char *pattern, json_t *a, json_t *b)
{
    const char *why;
    int safe = classify(pattern, a, b, &why);
    json_t *c = json_pack("{s:s, s:s, s:b, s:s}", "field", path, "pattern", pattern, "safe", safe, "why", why);
    if (!c)
        return;
    if (a)
        json_object_set(c, "old", a);
    if (b)
        json_object_set(c, "new", b);
    json_array_append_new(out, c);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void diff(json_t *out, const char *path, const char *pattern, json_t *a, json_t *b);

/* The item of list whose "name" is name, or NULL. */
static json_t *by_name(json_t *list, const char *name)
{
    size_t i;
    json_t *x;
    json_array_foreach(list, i, x)
    {
        const char *n = json_string_value(json_object_get(x, "name"));
        if (name && n && !strcmp(name, n))
            return x;
    }
    return NULL;
}

/* workers / rings: items matched by name (an order change is no change: ids are given
 * afresh at every start); field paths name the item: workers["drafter0"].env.K */
static void diff_named(json_t *out, const char *path, json_t *a, json_t *b)
{
    char p[512], pat[512];
    size_t i;
    json_t *x;
    snprintf(pat, sizeof pat, "%.500s[]", path); /* names are at most 31 characters */
    json_array_foreach(a, i, x)
    {
        const char *name = json_string_value(json_object_get(x, "name"));
        snprintf(p, sizeof p, "%.400s[\"%.40s\"]", path, name ? name : "?");
        diff(out, p, pat, x, by_name(b, name));
    }
    json_array_foreach(b, i, x)
    {
        const char *name = json_string_value(json_object_get(x, "name"));
        snprintf(p, sizeof p, "%.400s[\"%.40s\"]", path, name ? name : "?");
        if (!by_name(a, name))
            diff(out, p, pat, NULL, x);
    }
}

static void diff(json_t *out, const char *path, const char *pattern, json_t *a, json_t *b)
{
    if (a && b && json_equal(a, b))
        return;
    if (a && b && json_is_object(a) && json_is_object(b)) {
        /* the union of the keys, sorted: one order for the messages whatever the files' */
        size_t na = json_object_size(a), nb = json_object_size(b), n = 0;
        const char **keys = malloc((na + nb + 1) * sizeof *keys);
        if (!keys)
            return;
        const char *k;
        json_t *v;
        json_object_foreach(a, k, v) keys[n++] = k;
        json_object_foreach(b, k, v) if (!json_object_get(a, k)) keys[n++] = k;
        qsort(keys, n, sizeof *keys, cmp_str);
        char p[512], pat[512];
        for (size_t i = 0; i < n; i++)
            if (strlen(path) > 250 || strlen(pattern) > 250 || strlen(keys[i]) > 250) {
                /* a key too long to name (an env variable's name has no limit): the object as
                 * a whole is the change, never nothing */
                free(keys);
                add_change(out, path, pattern, a, b);
                return;
            }
        for (size_t i = 0; i < n; i++) {
            snprintf(p, sizeof p, "%.250s%s%.250s", path, path[0] ? "." : "", keys[i]);
            snprintf(pat, sizeof pat, "%.250s%s%.250s", pattern, pattern[0] ? "." : "", keys[i]);
            if (!path[0] && (!strcmp(keys[i], "workers") || !strcmp(keys[i], "rings")) &&
                json_is_array(json_object_get(a, keys[i])) && json_is_array(json_object_get(b, keys[i])))
                diff_named(out, p, json_object_get(a, keys[i]), json_object_get(b, keys[i]));
            else
                diff(out, p, pat, json_object_get(a, keys[i]), json_object_get(b, keys[i]));
        }
        free(keys);
        return;
    }
    add_change(out, path, pattern, a, b); /* scalars, lists (capture_layers, shards, args) and absent */
}

int resume_check_topology(orch *o, const topo *rec, const char *rec_path, const char *cand_path, int fresh, char *err,
                          size_t errlen)
{
    json_t *ja = topology_to_json(rec), *jb = topology_to_json(&o->t), *changes = json_array();
    int rc = 0;
    if (!ja || !jb || !changes) {
        rc = -ENOMEM;
        goto out;
    }
    diff(changes, "", "", ja, jb);
    size_t n = json_array_size(changes), n_unsafe = 0, i;
    if (n == 0)
        goto out;
    json_t *c;
    json_array_foreach(changes, i, c) n_unsafe += !json_is_true(json_object_get(c, "safe"));
    int accept = o->accept_changes && (fresh || n_unsafe == 0);
    df_log("resume: %s differs from the topology run %s was started with (%s) in %zu field%s:", cand_path, rec->name,
           rec_path, n, n > 1 ? "s" : "");
    char first_unsafe[256] = "";
    json_array_foreach(changes, i, c)
    {
        char va[300], vb[300];
        const char *field = json_string_value(json_object_get(c, "field"));
        int safe = json_is_true(json_object_get(c, "safe"));
        show(json_object_get(c, "old"), va, sizeof va);
        show(json_object_get(c, "new"), vb, sizeof vb);
        if (!safe && !first_unsafe[0])
            snprintf(first_unsafe, sizeof first_unsafe, "%s", field);
        df_log("  %s: %s -> %s  [%s: %s]", field, va, vb,
               safe    ? "may change on resume"
               : fresh ? "may change now, as nothing is committed yet; once something is, it cannot"
                       : "cannot change once a checkpoint is committed",
               json_string_value(json_object_get(c, "why")));
    }
    if (accept) {
        df_log("resume: %zu change%s accepted (--accept-changes); %s is updated to the new topology", n,
               n > 1 ? "s" : "", rec_path);
        o->topo_changes = json_incref(changes);
        goto out;
    }
    if (!fresh && n_unsafe > 0) {
        char more[64] = "";
        if (n_unsafe > 1)
            snprintf(more, sizeof more, " and %zu more field%s", n_unsafe - 1, n_unsafe > 2 ? "s" : "");
        snprintf(err, errlen,
                 "--resume: refusing: %s%s cannot change once a checkpoint is committed (listed above). Undo %s "
                 "(the run's record is %s), or start a new run with another run_dir (`dflash_tool export "
                 "%s/checkpoints DIR` and drafter.init_dir DIR start it from this run's weights)%s; nothing was "
                 "changed",
                 first_unsafe, more, n_unsafe > 1 ? "them" : "it", rec_path, o->run_dir,
                 n_unsafe < n ? "; the other changes may be made with --accept-changes" : "");
    } else
        snprintf(err, errlen,
                 "--resume: refusing: %zu field%s changed (listed above)%s: run it again with --accept-changes to "
                 "apply %s (the run's record %s is then updated and the change logged in "
                 "metrics/orchestrator.jsonl), or undo %s; nothing was changed",
                 n, n > 1 ? "s" : "",
                 n_unsafe ? "; nothing is committed yet, so every field may still change"
                 : n > 1  ? ", all of which may change on resume"
                          : ", which may change on resume",
                 n > 1 ? "them" : "it", rec_path, n > 1 ? "them" : "it");
    rc = -EINVAL;
out:
    json_decref(ja);
    json_decref(jb);
    json_decref(changes);
    return rc;
}

int resume_log_changes(orch *o, const char *record_path)
{
    if (!o->topo_changes)
        return 0;
    json_t *list = json_array();
    size_t i;
    json_t *c;
    json_array_foreach(o->topo_changes, i, c)
    {
        json_t *e = json_pack("{s:O}", "field", json_object_get(c, "field"));
        if (!e)
            continue;
        json_object_set_new(e, "old", json_object_get(c, "old") ? json_incref(json_object_get(c, "old")) : json_null());
        json_object_set_new(e, "new", json_object_get(c, "new") ? json_incref(json_object_get(c, "new")) : json_null());
        json_array_append_new(list, e);
    }
    json_t *ev = json_pack("{s:s, s:o, s:s, s:s, s:f}", "ev", "topology_changed", "changes", list, "record",
                           record_path, "accepted_by", "--accept-changes", "t", df_wall_s());
    char *s = ev ? json_dumps(ev, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(ev);
    if (!s)
        return -ENOMEM;
    char path[1200];
    snprintf(path, sizeof path, "%s/metrics/orchestrator.jsonl", o->run_dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    int rc = fd < 0 ? -errno : 0;
    if (fd >= 0) {
        size_t n = strlen(s);
        s[n] = '\n'; /* replaces the NUL: n + 1 bytes written */
        rc = df_write_all(fd, s, n + 1);
        close(fd);
    }
    free(s);
    return rc;
}
