/* report.c: what the orchestrator tells the world: the status object (dfctl status and the
 * metrics summary are the same JSON), supervision events, and the per-interval metrics.
 *
 *   metrics/orchestrator.jsonl  one line per supervision event (spawn, ready, exit with its
 *                               status, restart with its backoff, hang kill, reclaim results,
 *                               checkpoint, shutdown, finish), each one write() on O_APPEND
 *   metrics/summary.jsonl       every metrics_interval_ms: the status object plus, per worker,
 *                               throughput from its status slot and the last line of its own
 *                               metrics/<name>.jsonl (tailed with metrics_reader)
 *   metrics/pipeline.prom       the same figures as a Prometheus textfile, written atomically
 *   stdout                      the progress line: not a terminal, one full line per interval
 *                               (every figure, with the time stamp); a terminal, one line
 *                               rewritten in place ("\r" + clear to the end of the line)
 *                               that fits the terminal's width: the least important fields
 *                               are left out first (report_fit_fields), and every log line
 *                               clears it before and draws it again after (df_log's hook)
 * The training figures (status object "train", the progress line, dfctl top, pipeline.prom):
 * step from drafter rank 0's last "step" line and the figures of io/metrics_keys.h (loss,
 * lr, ...) from that line and the validator's last "validation" line, one row each there;
 * total steps from the plan, tokens/s summed over the drafters, and the ETA:
 * samples left (the ledger: samples of every batch not yet trained, committed or poisoned
 * in this epoch, plus the later epochs' samples) over the measured rate (samples trained
 * per second over the last ORCH_ETA_HIST intervals; a rewind after a drafter death counts
 * against it). Unknown (null / "-") until two intervals have seen progress.
 */
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

#include "io/metrics_keys.h"
#include "orch.h"
#include "util.h"

static double num_or(json_t *o, const char *k, double def);
static json_t *train_json(orch *o);
static void progress_line(orch *o, json_t *s, uint64_t now);

void orch_event(orch *o, json_t *ev)
{
    if (!ev)
        return;
    json_object_set_new(ev, "t", json_real(df_wall_s()));
    if (o->events_fd >= 0) {
        char *s = json_dumps(ev, JSON_COMPACT | JSON_SORT_KEYS);
        if (s) {
            size_t n = strlen(s);
            char *line = realloc(s, n + 2);
            if (line) {
                line[n] = '\n';
                (void)df_write_all(o->events_fd, line, n + 1);
                free(line);
            } else {
                free(s);
            }
        }
    }
    json_decref(ev);
}

void report_log_tail(orch *o, const char *name, char *out, size_t cap, int lines)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/logs/%s.log", o->run_dir, name);
    out[0] = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(out, cap, "  (no log: %s)\n", strerror(errno));
        return;
    }
    char buf[8192];
    off_t end = lseek(fd, 0, SEEK_END);
    off_t from = end > (off_t)sizeof buf - 1 ? end - (off_t)sizeof buf + 1 : 0;
    ssize_t n = pread(fd, buf, sizeof buf - 1, from);
    close(fd);
    if (n <= 0)
        return;
    buf[n] = 0;
    /* walk back `lines` newlines (ignoring a trailing one) */
    char *p = buf + n;
    if (p > buf && p[-1] == '\n')
        p--;
    int seen = 0;
    while (p > buf) {
        if (p[-1] == '\n' && ++seen == lines)
            break;
        p--;
    }
    size_t o_len = 0;
    while (*p && o_len + 4 < cap) {
        if (o_len == 0 || out[o_len - 1] == '\n') {
            out[o_len++] = ' ';
            out[o_len++] = ' ';
        }
        out[o_len++] = *p++;
    }
    if (o_len && out[o_len - 1] == '\n') /* the caller's df_log ends the line */
        o_len--;
    out[o_len] = 0;
}

static double age_ms_of(orch *o, orch_worker *w, uint64_t now)
{
    status_slot *sl = &o->status->slots[w->id];
    uint64_t hb = atomic_load_explicit(&sl->heartbeat_ns, memory_order_acquire);
    if (atomic_load_explicit(&sl->worker_incarnation, memory_order_relaxed) != w->incarnation || hb < w->start_ns)
        hb = w->start_ns;
    return now > hb ? (double)(now - hb) / 1e6 : 0.0;
}

json_t *report_status_json(orch *o)
{
    uint64_t now = df_now_ns();
    json_t *ws = json_array(), *rs = json_array();
    for (int i = 0; i < o->n; i++) {
        orch_worker *w = &o->w[i];
        status_slot *sl = &o->status->slots[i];
        json_t *j = json_pack("{s:s, s:s, s:i, s:s, s:i, s:i, s:s, s:f, s:f}", "name", w->tw->name, "role",
                              topology_role_name(w->tw->role), "pid", (int)w->pid, "state", status_state_name(w->state),
                              "incarnation", (int)w->incarnation, "restarts", (int)w->restarts, "last_exit",
                              w->last_exit, "items_per_s", w->items_per_s, "tokens_per_s", w->tokens_per_s);
        if (w->tw->role == TOPOLOGY_ROLE_DRAFTER) {
            json_object_set_new(j, "checkpoint_failures", json_integer(w->ckpt_failures));
            json_object_set_new(j, "checkpoint_failures_in_a_row", json_integer(w->ckpt_fail_consec));
            if (w->ckpt_last_error[0])
                json_object_set_new(j, "checkpoint_last_error", json_string(w->ckpt_last_error));
        }
        if (w->last_ev[1]) { /* the stage's last busy/wait split (one line a second) */
            json_object_set_new(j, "busy_frac", json_real(num_or(w->last_ev[1], "busy_frac", 0)));
            json_object_set_new(j, "wait_frac", json_real(num_or(w->last_ev[1], "wait_frac", 0)));
        }
        if (w->pid > 0) {
            json_object_set_new(j, "uptime_s", json_real((double)(now - w->start_ns) * 1e-9));
            json_object_set_new(j, "heartbeat_age_ms", json_real(age_ms_of(o, w, now)));
            json_object_set_new(j, "step", json_integer((json_int_t)atomic_load(&sl->step)));
            json_object_set_new(j, "items", json_integer((json_int_t)atomic_load(&sl->items)));
        }
        json_array_append_new(ws, j);
    }
    for (int r = 0; r < o->t.n_rings; r++) {
        ring_stats st;
        ring_stats_read(&o->rings[r], &st);
        json_array_append_new(rs, json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:I, s:I, s:I, s:f, s:b}", "name",
                                            o->t.rings[r].name, "slots", (int)o->rings[r].nslots, "free", (int)st.free,
                                            "writing", (int)st.writing, "ready", (int)st.ready, "reading",
                                            (int)st.reading, "poisoned", (int)st.poisoned, "published",
                                            (json_int_t)st.published, "released", (json_int_t)st.released,
                                            "poisoned_total", (json_int_t)st.poisoned_total, "oldest_lease_ms",
                                            (double)st.oldest_lease_ns / 1e6, "closed", o->ring_closed[r]));
    }
    ledger_counts_t c;
    ledger_counts(&o->led, &c);
    json_t *led = json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:I}", "batches", (int)ledger_n_batches(&o->led),
                            "pending", (int)c.pending, "claimed", (int)c.claimed, "in_ring", (int)c.in_ring, "trained",
                            (int)c.trained, "committed", (int)c.committed, "poisoned", (int)c.poisoned,
                            "committed_step", (json_int_t)ledger_committed_step(&o->led));
    json_object_set_new(led, "epoch", json_integer(o->epoch));
    json_object_set_new(led, "epochs", json_integer(DF_MAX(o->t.drafter.epochs, 1u)));
    const char *st = o->finished ? "finished" : o->shutting_down ? "shutting_down" : "running";
    json_t *run =
        json_pack("{s:s, s:s, s:s, s:f, s:b, s:b, s:I, s:I, s:I}", "name", o->t.name, "run_dir", o->run_dir, "state",
                  st, "uptime_s", (double)(now - o->start_ns) * 1e-9, "paused", atomic_load(&o->status->pause) != 0,
                  "stop_claiming", atomic_load(&o->status->stop_claiming) != 0, "checkpoint_gen",
                  (json_int_t)atomic_load(&o->status->checkpoint_gen), "restarts_total", (json_int_t)o->restarts_total,
                  "poisoned_total", (json_int_t)o->poisoned_total);
    return json_pack("{s:b, s:o, s:o, s:o, s:o, s:o}", "ok", 1, "run", run, "workers", ws, "rings", rs, "ledger", led,
                     "train", train_json(o));
}

/* "step 120/534 loss 2.345 lr 3.0e-03 4321 tok/s ETA 1m23s | val loss 2.51 tau 1.62 @100";
 * the parts not known yet (no drafter step line, no ETA) are left out or shown as "-" */
void report_train_line(json_t *tr, char *out, size_t cap)
{
    json_t *st = json_object_get(tr, "step"), *eta = json_object_get(tr, "eta_s");
    char e[32] = "-";
    if (json_is_number(eta) && json_number_value(eta) >= 0 && json_number_value(eta) < 1e9) {
        double x = json_number_value(eta); /* past 1e9 s (or NaN) it stays "-": (int)x would overflow */
        if (x < 60)
            snprintf(e, sizeof e, "%.0fs", x);
        else if (x < 3600)
            snprintf(e, sizeof e, "%dm%02ds", (int)x / 60, (int)x % 60);
        else
            snprintf(e, sizeof e, "%dh%02dm", (int)x / 3600, ((int)x % 3600) / 60);
    }
    size_t n = 0;
    out[0] = 0;
#define ADD(...)                                                        \
    do {                                                                \
        int k_ = n < cap ? snprintf(out + n, cap - n, __VA_ARGS__) : 0; \
        n += k_ > 0 ? (size_t)k_ : 0;                                   \
    } while (0)
    if (json_is_integer(st))
        ADD("step %lld/%lld", (long long)json_integer_value(st),
            (long long)json_integer_value(json_object_get(tr, "total_steps")));
    else
        ADD("step -/%lld", (long long)json_integer_value(json_object_get(tr, "total_steps")));
    char v[32];
    for (int k = 0; k < METRICS_N_KEYS; k++) { /* the training figures known so far */
        const metrics_key *m = &metrics_keys[k];
        if (m->from == METRICS_FROM_STEP && json_is_number(json_object_get(tr, m->key))) {
            snprintf(v, sizeof v, m->fmt, json_number_value(json_object_get(tr, m->key)));
            ADD(" %s %s", m->label, v);
        }
    }
    ADD(" %.0f tok/s ETA %s", num_or(tr, "tokens_per_s", 0), e);
    if (json_object_get(tr, "val_step")) { /* a validation line was seen: all of its figures */
        ADD(" | val");
        for (int k = 0; k < METRICS_N_KEYS; k++) {
            const metrics_key *m = &metrics_keys[k];
            if (m->from == METRICS_FROM_VALIDATION) {
                snprintf(v, sizeof v, m->fmt, num_or(tr, m->key, NAN));
                ADD(" %s %s", m->label, v);
            }
        }
        ADD(" @%lld", (long long)json_integer_value(json_object_get(tr, "val_step")));
    }
#undef ADD
}

/* Read whatever the worker appended to its jsonl since the last tick; keep the last line. */
static void tail_worker_metrics(orch *o, orch_worker *w)
{
    if (!w->mr_open) {
        char path[1200];
        snprintf(path, sizeof path, "%s/metrics/%s.jsonl", o->run_dir, w->tw->name);
        if (metrics_reader_open(&w->mr, path) < 0)
            return; /* not written yet */
        w->mr_open = 1;
    }
    json_t *obj;
    static const char *const evs[3] = {"step", "stage", VALIDATION_EV};
    for (int k = 0; k < 100000 && metrics_reader_next(&w->mr, &obj) == 1; k++) {
        const char *ev = json_string_value(json_object_get(obj, "ev"));
        for (int e = 0; ev && e < 3; e++)
            if (!strcmp(ev, evs[e])) {
                json_decref(w->last_ev[e]);
                w->last_ev[e] = json_incref(obj);
            }
        json_decref(w->last_metrics);
        w->last_metrics = obj;
        w->metrics_lines++;
    }
}

static double num_or(json_t *o, const char *k, double def)
{
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : def;
}

/* Samples of the run and of the work done so far (see the top of the file), and the ETA. */
static void eta_update(orch *o)
{
    uint32_t nb = ledger_n_batches(&o->led);
    double per_epoch = 0, done = 0;
    for (uint32_t b = 0; b < nb; b++) {
        const uint32_t *idx;
        uint32_t n = 0;
        ledger_batch_status st;
        if (ledger_batch_samples(&o->led, b, &idx, &n) < 0 || ledger_batch_status_get(&o->led, b, &st) < 0)
            continue;
        per_epoch += n;
        if (st.state == LEDGER_TRAINED || st.state == LEDGER_COMMITTED || st.state == LEDGER_POISONED)
            done += n;
    }
    uint32_t E = DF_MAX(o->t.drafter.epochs, 1u);
    o->samples_total = per_epoch * E;
    o->samples_done = per_epoch * o->epoch + done;
    uint64_t now = df_now_ns();
    uint32_t k = o->eta_n % ORCH_ETA_HIST;
    o->eta_ns[k] = now;
    o->eta_done[k] = o->samples_done;
    o->eta_n++;
    uint32_t have = DF_MIN(o->eta_n, (uint32_t)ORCH_ETA_HIST);
    uint32_t old = (o->eta_n - have) % ORCH_ETA_HIST; /* the oldest sample kept */
    double dt = (double)(now - o->eta_ns[old]) * 1e-9, dd = o->samples_done - o->eta_done[old];
    o->samples_per_s = have >= 2 && dt > 0 ? dd / dt : 0;
    double left = o->samples_total - o->samples_done;
    o->eta_s = left <= 0 ? 0 : o->samples_per_s > 0 ? left / o->samples_per_s : -1;
}

/* The training figures of the status object ("train"), from what report_tick gathered. */
static json_t *train_json(orch *o)
{
    json_t *tr = json_object(), *st = NULL, *val = NULL;
    double tok_s = 0;
    for (int i = 0; i < o->n; i++) {
        orch_worker *w = &o->w[i];
        if (w->tw->role == TOPOLOGY_ROLE_DRAFTER) {
            tok_s += w->tokens_per_s;
            if (w->tw->rank == 0)
                st = w->last_ev[0];
        }
        if (w->tw->role == TOPOLOGY_ROLE_VALIDATOR)
            val = w->last_ev[2];
    }
    json_object_set_new(tr, "step", st ? json_integer(json_integer_value(json_object_get(st, "step"))) : json_null());
    json_object_set_new(tr, "total_steps", json_integer((json_int_t)o->total_steps));
    for (int k = 0; k < METRICS_N_KEYS; k++)
        if (metrics_keys[k].from == METRICS_FROM_STEP)
            json_object_set_new(tr, metrics_keys[k].key,
                                st ? json_real(num_or(st, metrics_keys[k].key, NAN)) : json_null());
    json_object_set_new(tr, "tokens_per_s", json_real(tok_s));
    json_object_set_new(tr, "samples_total", json_integer((json_int_t)o->samples_total));
    json_object_set_new(tr, "samples_done", json_integer((json_int_t)o->samples_done));
    json_object_set_new(tr, "samples_per_s", json_real(o->samples_per_s));
    json_object_set_new(tr, "eta_s", o->eta_s >= 0 ? json_real(o->eta_s) : json_null());
    if (val) {
        json_object_set_new(tr, "val_step", json_integer(json_integer_value(json_object_get(val, "step"))));
        for (int k = 0; k < METRICS_N_KEYS; k++)
            if (metrics_keys[k].from == METRICS_FROM_VALIDATION)
                json_object_set_new(tr, metrics_keys[k].key, json_real(num_or(val, metrics_keys[k].key, NAN)));
    }
    /* a NaN loss (a non-finite step) is not JSON: null */
    const char *key;
    json_t *v;
    json_object_foreach(tr, key, v) if (json_is_real(v) && !isfinite(json_real_value(v)))
        json_object_set_new(tr, key, json_null());
    return tr;
}

static void prom_add(char **buf, size_t *len, size_t *cap, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void prom_add(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(*buf + *len, *cap - *len, fmt, ap);
        va_end(ap);
        if (n < 0)
            return;
        if (*len + (size_t)n < *cap) {
            *len += (size_t)n;
            return;
        }
        size_t nc = *cap * 2 + (size_t)n;
        char *nb = realloc(*buf, nc);
        if (!nb)
            return;
        *buf = nb;
        *cap = nc;
    }
}

static void write_prom(orch *o, json_t *s)
{
    size_t cap = 8192, len = 0;
    char *b = malloc(cap);
    if (!b)
        return;
    b[0] = 0;
    size_t i;
    json_t *w;
    prom_add(&b, &len, &cap, "# dflash-pipe pipeline metrics (orchestrator, every metrics_interval_ms)\n");
    prom_add(&b, &len, &cap,
             "# TYPE df_worker_up gauge\n# TYPE df_worker_restarts_total counter\n"
             "# TYPE df_worker_items_per_second gauge\n# TYPE df_worker_heartbeat_age_seconds gauge\n");
    json_array_foreach(json_object_get(s, "workers"), i, w)
    {
        const char *n = json_string_value(json_object_get(w, "name"));
        prom_add(&b, &len, &cap, "df_worker_up{worker=\"%s\",state=\"%s\"} %d\n", n,
                 json_string_value(json_object_get(w, "state")), json_integer_value(json_object_get(w, "pid")) > 0);
        prom_add(&b, &len, &cap, "df_worker_restarts_total{worker=\"%s\"} %lld\n", n,
                 (long long)json_integer_value(json_object_get(w, "restarts")));
        prom_add(&b, &len, &cap, "df_worker_incarnation{worker=\"%s\"} %lld\n", n,
                 (long long)json_integer_value(json_object_get(w, "incarnation")));
        prom_add(&b, &len, &cap, "df_worker_items_per_second{worker=\"%s\"} %.3f\n", n,
                 json_real_value(json_object_get(w, "items_per_s")));
        prom_add(&b, &len, &cap, "df_worker_tokens_per_second{worker=\"%s\"} %.3f\n", n,
                 json_real_value(json_object_get(w, "tokens_per_s")));
        if (json_object_get(w, "checkpoint_failures"))
            prom_add(&b, &len, &cap, "df_worker_checkpoint_failures_total{worker=\"%s\"} %lld\n", n,
                     (long long)json_integer_value(json_object_get(w, "checkpoint_failures")));
        if (json_object_get(w, "heartbeat_age_ms"))
            prom_add(&b, &len, &cap, "df_worker_heartbeat_age_seconds{worker=\"%s\"} %.3f\n", n,
                     json_real_value(json_object_get(w, "heartbeat_age_ms")) / 1000.0);
    }
    prom_add(&b, &len, &cap, "# TYPE df_ring_slots gauge\n# TYPE df_ring_published_total counter\n");
    json_array_foreach(json_object_get(s, "rings"), i, w)
    {
        const char *n = json_string_value(json_object_get(w, "name"));
        static const char *const states[] = {"free", "writing", "ready", "reading", "poisoned"};
        for (size_t k = 0; k < DF_ARRAY_LEN(states); k++)
            prom_add(&b, &len, &cap, "df_ring_slots{ring=\"%s\",state=\"%s\"} %lld\n", n, states[k],
                     (long long)json_integer_value(json_object_get(w, states[k])));
        prom_add(&b, &len, &cap, "df_ring_published_total{ring=\"%s\"} %lld\n", n,
                 (long long)json_integer_value(json_object_get(w, "published")));
        prom_add(&b, &len, &cap, "df_ring_poisoned_total{ring=\"%s\"} %lld\n", n,
                 (long long)json_integer_value(json_object_get(w, "poisoned_total")));
        prom_add(&b, &len, &cap, "df_ring_oldest_lease_seconds{ring=\"%s\"} %.3f\n", n,
                 json_real_value(json_object_get(w, "oldest_lease_ms")) / 1000.0);
    }
    json_t *l = json_object_get(s, "ledger");
    const char *key;
    json_t *v;
    prom_add(&b, &len, &cap, "# TYPE df_ledger_batches gauge\n");
    json_object_foreach(l, key, v)
    {
        if (!strcmp(key, "batches"))
            prom_add(&b, &len, &cap, "df_ledger_batches_total %lld\n", (long long)json_integer_value(v));
        else if (!strcmp(key, "committed_step"))
            prom_add(&b, &len, &cap, "df_ledger_committed_step %lld\n", (long long)json_integer_value(v));
        else
            prom_add(&b, &len, &cap, "df_ledger_batches{state=\"%s\"} %lld\n", key, (long long)json_integer_value(v));
    }
    json_t *tr = json_object_get(s, "train");
    /* the orchestrator's own figures; the workers' (io/metrics_keys.h) come before (training)
     * and after (validation) them */
    static const char *const tkeys[][2] = {{"step", "df_train_step"},
                                           {"total_steps", "df_train_total_steps"},
                                           {"tokens_per_s", "df_train_tokens_per_second"},
                                           {"samples_per_s", "df_train_samples_per_second"},
                                           {"samples_total", "df_train_samples_total"},
                                           {"samples_done", "df_train_samples_done"},
                                           {"eta_s", "df_train_eta_seconds"},
                                           {"val_step", "df_validation_step"}};
    prom_add(&b, &len, &cap, "# TYPE df_train_loss gauge\n# TYPE df_train_eta_seconds gauge\n");
    for (int pass = 0; pass < 3; pass++) { /* unknown values are left out */
        size_t n = pass == 1 ? DF_ARRAY_LEN(tkeys) : METRICS_N_KEYS;
        for (size_t k = 0; k < n; k++) {
            const metrics_key *m = pass == 1 ? NULL : &metrics_keys[k];
            if (m && m->from != (pass == 0 ? METRICS_FROM_STEP : METRICS_FROM_VALIDATION))
                continue;
            json_t *tv = json_object_get(tr, m ? m->key : tkeys[k][0]);
            if (json_is_number(tv))
                prom_add(&b, &len, &cap, "%s %.6g\n", m ? m->prom : tkeys[k][1], json_number_value(tv));
        }
    }
    json_t *run = json_object_get(s, "run");
    prom_add(&b, &len, &cap, "df_restarts_total %lld\ndf_poisoned_batches_total %lld\n",
             (long long)json_integer_value(json_object_get(run, "restarts_total")),
             (long long)json_integer_value(json_object_get(run, "poisoned_total")));
    char path[1200];
    snprintf(path, sizeof path, "%s/metrics/pipeline.prom", o->run_dir);
    int rc = df_write_file_atomic(path, b, len);
    if (rc < 0)
        df_log("%s: %s", path, strerror(-rc));
    free(b);
}

void report_tick(orch *o)
{
    uint64_t now = df_now_ns();
    for (int i = 0; i < o->n; i++) {
        orch_worker *w = &o->w[i];
        tail_worker_metrics(o, w);
        if (w->pid <= 0) {
            w->items_per_s = w->tokens_per_s = 0;
            continue;
        }
        status_slot *sl = &o->status->slots[i];
        uint64_t items = atomic_load_explicit(&sl->items, memory_order_relaxed);
        uint64_t tokens = atomic_load_explicit(&sl->tokens, memory_order_relaxed);
        if (atomic_load_explicit(&sl->worker_incarnation, memory_order_relaxed) != w->incarnation)
            items = tokens = 0;
        if (items < w->items_prev || tokens < w->tokens_prev) /* a new incarnation counts from 0 */
            w->items_prev = w->tokens_prev = 0;
        double dt = (double)(now - w->sample_ns) * 1e-9;
        if (dt > 0) {
            w->items_per_s = (double)(items - w->items_prev) / dt;
            w->tokens_per_s = (double)(tokens - w->tokens_prev) / dt;
        }
        w->items_prev = items;
        w->tokens_prev = tokens;
        w->sample_ns = now;
    }
    eta_update(o);
    json_t *s = report_status_json(o);
    json_t *ws = json_object_get(s, "workers");
    for (int i = 0; i < o->n; i++)
        if (o->w[i].last_metrics)
            json_object_set(json_array_get(ws, (size_t)i), "metrics", o->w[i].last_metrics);
    json_object_del(s, "ok");
    json_object_set_new(s, "t", json_real(df_wall_s()));
    json_object_set_new(s, "ev", json_string("summary"));

    char path[1200];
    snprintf(path, sizeof path, "%s/metrics/summary.jsonl", o->run_dir);
    char *text = json_dumps(s, JSON_COMPACT);
    if (text) {
        int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (fd >= 0) {
            size_t n = strlen(text);
            text[n] = '\n'; /* one write, newline included */
            struct stat st;
            int have_size = fstat(fd, &st) == 0; /* the orchestrator is this file's one writer */
            if (df_write_all(fd, text, n + 1) < 0 && have_size)
                (void)ftruncate(fd, st.st_size); /* a full disk: take the torn line back */
            close(fd);
        }
        free(text);
    }
    write_prom(o, s);

    progress_line(o, s, now);
    json_decref(s);
}

/* ---- the progress line -------------------------------------------------------------- */

size_t report_fit_fields(const report_field *f, int n, size_t width, char *out, size_t cap)
{
    static const char sep[] = " | ";
    const size_t seplen = sizeof sep - 1;
    unsigned char keep[REPORT_MAX_FIELDS];
    size_t total = 0;
    int kept = 0;
    if (n > REPORT_MAX_FIELDS)
        n = REPORT_MAX_FIELDS;
    for (int i = 0; i < n; i++) {
        keep[i] = f[i].text[0] != 0;
        if (keep[i]) {
            total += (kept ? seplen : 0) + strlen(f[i].text);
            kept++;
        }
    }
    /* drop the least important field (the highest prio; of equals the last) until it fits */
    int dropped[REPORT_MAX_FIELDS], nd = 0;
    while (width && total > width && kept > 1) {
        int worst = -1;
        for (int i = 0; i < n; i++)
            if (keep[i] && (worst < 0 || f[i].prio >= f[worst].prio))
                worst = i;
        keep[worst] = 0;
        dropped[nd++] = worst;
        total -= strlen(f[worst].text) + seplen;
        kept--;
    }
    /* then fill what is left of the line: a dropped field that fits comes back, the most
     * important first (a short figure may fit where a longer, more important one did not) */
    for (int k = nd - 1; k >= 0 && total <= width; k--) {
        size_t add = strlen(f[dropped[k]].text) + seplen;
        if (total + add <= width) {
            keep[dropped[k]] = 1;
            total += add;
        }
    }
    size_t len = 0, limit = width && width < cap ? width : cap - 1;
    int first = 1;
    out[0] = 0;
    for (int i = 0; i < n && len < limit; i++) {
        if (!keep[i])
            continue;
        int k = snprintf(out + len, limit + 1 - len, "%s%s", first ? "" : sep, f[i].text);
        len += k > 0 ? DF_MIN((size_t)k, limit - len) : 0; /* a last field too long for the line is cut */
        first = 0;
    }
    out[len] = 0;
    return len;
}

/* "12.3s", "4m05s", "2h07m" */
static void fmt_elapsed(char *out, size_t cap, double x)
{
    if (x < 60)
        snprintf(out, cap, "%.1fs", x);
    else if (x < 3600)
        snprintf(out, cap, "%dm%02ds", (int)x / 60, (int)x % 60);
    else
        snprintf(out, cap, "%dh%02dm", (int)(x / 3600), ((int)x % 3600) / 60);
}

#define FIELD(pr, ...)                                            \
    do {                                                          \
        if (nf < REPORT_MAX_FIELDS) {                             \
            snprintf(f[nf].text, sizeof f[nf].text, __VA_ARGS__); \
            f[nf++].prio = (pr);                                  \
        }                                                         \
    } while (0)

/* The terminal's fields, in the order shown; prio says what goes first when the line is too
 * long: 0 stays longest (elapsed time, batches committed), then step and ETA, loss, a worker
 * that is not up, restarts and poisoned batches, tokens/s, validation, lr, the workers that
 * are up, the rings. */
static int progress_fields(orch *o, json_t *s, uint64_t now, report_field *f)
{
    int nf = 0;
    json_t *l = json_object_get(s, "ledger"), *tr = json_object_get(s, "train");
    char t[32];
    fmt_elapsed(t, sizeof t, (double)(now - o->start_ns) * 1e-9);
    FIELD(0, "[%s]", t);
    uint32_t epochs = DF_MAX(o->t.drafter.epochs, 1u);
    if (epochs > 1)
        FIELD(1, "epoch %u/%u", o->epoch + 1, epochs);
    FIELD(0, "ledger %lld/%lld", (long long)json_integer_value(json_object_get(l, "committed")),
          (long long)json_integer_value(json_object_get(l, "batches")));
    json_t *st = json_object_get(tr, "step"), *eta = json_object_get(tr, "eta_s");
    if (json_is_integer(st))
        FIELD(1, "step %lld/%lld", (long long)json_integer_value(st),
              (long long)json_integer_value(json_object_get(tr, "total_steps")));
    char v[32];
    for (int k = 0; k < METRICS_N_KEYS; k++) {
        const metrics_key *m = &metrics_keys[k];
        if (m->from == METRICS_FROM_STEP && json_is_number(json_object_get(tr, m->key))) {
            snprintf(v, sizeof v, m->fmt, json_number_value(json_object_get(tr, m->key)));
            FIELD(m->prio, "%s %s", m->label, v);
        }
    }
    if (json_is_number(eta) && json_number_value(eta) >= 0 && json_number_value(eta) < 1e9) {
        fmt_elapsed(t, sizeof t, json_number_value(eta));
        FIELD(1, "ETA %s", t);
    }
    if (o->restarts_total || o->poisoned_total)
        FIELD(3, "restarts %llu poisoned %llu", (unsigned long long)o->restarts_total,
              (unsigned long long)o->poisoned_total);
    if (json_number_value(json_object_get(tr, "tokens_per_s")) > 0)
        FIELD(4, "%.0f tok/s", json_number_value(json_object_get(tr, "tokens_per_s")));
    const char *val0 = NULL; /* the first validation figure: the field is shown once it is known */
    for (int k = 0; k < METRICS_N_KEYS && !val0; k++)
        if (metrics_keys[k].from == METRICS_FROM_VALIDATION)
            val0 = metrics_keys[k].key;
    if (val0 && json_is_number(json_object_get(tr, val0))) { /* the validation figures: one field */
        char text[sizeof f[0].text] = "val";
        int prio = -1;
        for (int k = 0; k < METRICS_N_KEYS; k++) {
            const metrics_key *m = &metrics_keys[k];
            if (m->from != METRICS_FROM_VALIDATION)
                continue;
            snprintf(v, sizeof v, m->fmt, json_number_value(json_object_get(tr, m->key)));
            size_t len = strlen(text);
            snprintf(text + len, sizeof text - len, " %s %s", m->label, v);
            prio = prio < 0 ? m->prio : prio;
        }
        FIELD(prio, "%s", text);
    }
    for (int i = 0; i < o->n; i++) {
        const orch_worker *w = &o->w[i];
        int up = w->state == STATUS_UP || w->state == STATUS_DONE;
        FIELD(up ? 7 : 3, "%s %s %.1f/s", w->tw->name, status_state_name(w->state), w->items_per_s);
    }
    for (int r = 0; r < o->t.n_rings; r++) {
        ring_stats rs;
        ring_stats_read(&o->rings[r], &rs);
        FIELD(8, "%s %u/%u", o->t.rings[r].name, rs.ready + rs.reading + rs.writing, o->rings[r].nslots);
    }
    return nf;
}

/* The log file's fields: every figure (the full line, one per interval). */
static int progress_fields_full(orch *o, json_t *s, uint64_t now, report_field *f)
{
    int nf = 0;
    json_t *l = json_object_get(s, "ledger");
    FIELD(0, "[%7.1fs] ledger %lld/%lld committed (step %lld, %lld in flight)", (double)(now - o->start_ns) * 1e-9,
          (long long)json_integer_value(json_object_get(l, "committed")),
          (long long)json_integer_value(json_object_get(l, "batches")),
          (long long)json_integer_value(json_object_get(l, "committed_step")),
          (long long)(json_integer_value(json_object_get(l, "claimed")) +
                      json_integer_value(json_object_get(l, "in_ring")) +
                      json_integer_value(json_object_get(l, "trained"))));
    for (int i = 0; i < o->n; i++)
        FIELD(0, "%s %s %.1f/s", o->w[i].tw->name, status_state_name(o->w[i].state), o->w[i].items_per_s);
    for (int r = 0; r < o->t.n_rings; r++) {
        ring_stats rs;
        ring_stats_read(&o->rings[r], &rs);
        FIELD(0, "%s %u/%u", o->t.rings[r].name, rs.ready + rs.reading + rs.writing, o->rings[r].nslots);
    }
    FIELD(0, "restarts %llu poisoned %llu", (unsigned long long)o->restarts_total,
          (unsigned long long)o->poisoned_total);
    if (nf < REPORT_MAX_FIELDS) {
        report_train_line(json_object_get(s, "train"), f[nf].text, sizeof f[nf].text);
        f[nf++].prio = 0;
    }
    return nf;
}
#undef FIELD

/* The terminal line: what is on the screen now (shown), to clear it around a log line. */
static struct {
    int on;    /* stdout and stderr are a terminal: draw in place */
    int shown; /* a line is on the screen, the cursor after it */
    char line[1024];
    size_t len;
} g_tty;

static void tty_clear(void)
{
    if (g_tty.shown)
        (void)df_write_all(STDOUT_FILENO, "\r\033[K", 4);
}

static void tty_draw(void)
{
    if (!g_tty.shown)
        return;
    char buf[sizeof g_tty.line + 8];
    memcpy(buf, "\r\033[K", 4);
    memcpy(buf + 4, g_tty.line, g_tty.len);
    (void)df_write_all(STDOUT_FILENO, buf, 4 + g_tty.len); /* one write: no half-drawn line */
}

/* Columns of the terminal on stdout: TIOCGWINSZ, else $COLUMNS, else 80. */
static size_t tty_width(void)
{
    struct winsize ws;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        return ws.ws_col;
    long long c;
    if (df_parse_int(getenv("COLUMNS"), 1, 10000, &c) == 0)
        return (size_t)c;
    return 80;
}

static void progress_line(orch *o, json_t *s, uint64_t now)
{
    report_field f[REPORT_MAX_FIELDS];
    if (g_tty.on) {
        int nf = progress_fields(o, s, now, f);
        /* one column short of the width: a line that fills the last column leaves the cursor
         * waiting to wrap, and some terminals then scroll on the "\r" */
        size_t w = tty_width();
        g_tty.len = report_fit_fields(f, nf, w > 1 ? w - 1 : 1, g_tty.line, sizeof g_tty.line);
        g_tty.shown = 1;
        tty_draw();
        if (o->finished) { /* the last figures stay on the screen */
            (void)df_write_all(STDOUT_FILENO, "\n", 1);
            g_tty.shown = 0;
        }
        return;
    }
    int nf = progress_fields_full(o, s, now, f);
    char line[REPORT_MAX_FIELDS * 64];
    size_t len = df_log_stamp(line, sizeof line);
    line[len++] = ' ';
    len += report_fit_fields(f, nf, 0, line + len, sizeof line - len - 1);
    line[len++] = '\n';
    (void)df_write_all(STDOUT_FILENO, line, len);
}

void report_results(const orch *o, char *out, size_t cap)
{
    char p[1200];
    struct stat st;
    int n = snprintf(out, cap, "ledger audit: %s/ledger_audit.json", o->run_dir);
    snprintf(p, sizeof p, "%s/train_summary.json", o->run_dir);
    if (n >= 0 && (size_t)n < cap && stat(p, &st) == 0)
        n += snprintf(out + n, cap - (size_t)n, ", training summary: %s", p);
    snprintf(p, sizeof p, "%s/drafter", o->run_dir);
    if (n >= 0 && (size_t)n < cap && stat(p, &st) == 0 && S_ISDIR(st.st_mode))
        (void)snprintf(out + n, cap - (size_t)n, ", release export: %s/", p);
}

static void metrics_cb(uv_timer_t *t)
{
    report_tick(t->data);
}

int report_start(orch *o)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/metrics/orchestrator.jsonl", o->run_dir);
    o->events_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (o->events_fd < 0)
        return -errno;
    uv_timer_init(o->loop, &o->metrics_timer);
    o->metrics_timer.data = o;
    uint64_t ms = o->t.sup.metrics_interval_ms ? o->t.sup.metrics_interval_ms : 1000;
    uv_timer_start(&o->metrics_timer, metrics_cb, ms, ms);
    /* in place only when the log lines land on the same terminal (they clear and redraw it) */
    memset(&g_tty, 0, sizeof g_tty);
    g_tty.on = isatty(STDOUT_FILENO) && isatty(STDERR_FILENO);
    if (g_tty.on)
        df_log_set_hook(tty_clear, tty_draw);
    return 0;
}

static void noop_close(uv_handle_t *h)
{
    (void)h;
}

void report_stop(orch *o)
{
    if (g_tty.on) {
        if (g_tty.shown)
            (void)df_write_all(STDOUT_FILENO, "\n", 1);
        g_tty.shown = 0;
        df_log_set_hook(NULL, NULL);
    }
    if (!uv_is_closing((uv_handle_t *)&o->metrics_timer))
        uv_close((uv_handle_t *)&o->metrics_timer, noop_close);
    for (int i = 0; i < o->n; i++) {
        if (o->w[i].mr_open)
            metrics_reader_close(&o->w[i].mr);
        o->w[i].mr_open = 0;
        json_decref(o->w[i].last_metrics);
        o->w[i].last_metrics = NULL;
        for (int e = 0; e < 3; e++) {
            json_decref(o->w[i].last_ev[e]);
            o->w[i].last_ev[e] = NULL;
        }
    }
}
