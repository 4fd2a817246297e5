/* dfctl_main.c: the operator's command line for a running orchestrator.
 *
 * Talks newline-delimited JSON over <run dir>/ctl.sock (protocol: orchestrator/control.c).
 * Deliberately plain blocking sockets, no libuv: one request, one reply (top: one per
 * second). Exit codes (exit_codes.h): 0 ok, 1 cannot connect (then it reads the run dir and
 * says how a finished run ended and where its results are) or the orchestrator refused,
 * 2 bad usage, unknown command or unknown worker.
 */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "exit_codes.h"
#include "io/metrics_keys.h"
#include "util.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: dfctl [--run-dir DIR] [--json] <command> [worker]\n"
               "\n"
               "commands:\n"
               "  status             workers (pid, state, incarnation, restarts, uptime, heartbeat age,\n"
               "                     throughput), rings (occupancy, poisoned) and ledger counts\n"
               "  top [--count N]    status, refreshed every second until Ctrl-C (or N times)\n"
               "  stop <worker>      SIGTERM it and keep it down (SIGKILL after shutdown_timeout_ms);\n"
               "                     returns once it is down, so a start may follow at once\n"
               "  start <worker>     start a stopped/failed/done worker now\n"
               "  restart <worker>   SIGTERM it and start it again at once (drafters: the whole group)\n"
               "  kill <worker>      SIGKILL it; the restart policy brings it back (with backoff)\n"
               "  pause | resume     workers hold before new work / carry on\n"
               "  checkpoint         ask the drafter to checkpoint at its next step\n"
               "  shutdown           drain the pipeline and stop the run\n"
               "\n"
               "options:\n"
               "  --run-dir DIR      the run (default: $DF_RUN_DIR, else the only directory under ./run/)\n"
               "  --json             print the orchestrator's JSON reply instead of a table\n"
               "  --no-wait          stop: return once SIGTERM is sent, not once the worker is down\n"
               "  -h, --help         this text\n"
               "\n" DF_EXIT_CODES_TEXT);
}

static int pick_run_dir(const char *opt, char *out, size_t cap)
{
    if (opt) {
        snprintf(out, cap, "%s", opt);
        return 0;
    }
    const char *env = getenv("DF_RUN_DIR");
    if (env && *env) {
        snprintf(out, cap, "%s", env);
        return 0;
    }
    DIR *d = opendir("run");
    if (!d) {
        fprintf(stderr, "dfctl: no run dir: give --run-dir DIR or set DF_RUN_DIR (and ./run/ does not exist)\n");
        return -1;
    }
    struct dirent *e;
    int found = 0;
    char first[600] = "";
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char p[600];
        struct stat st;
        snprintf(p, sizeof p, "run/%s", e->d_name);
        if (stat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
            if (!found)
                snprintf(first, sizeof first, "%s", p);
            found++;
        }
    }
    closedir(d);
    if (found != 1) {
        fprintf(stderr, "dfctl: %s: give --run-dir DIR or set DF_RUN_DIR\n",
                found ? "several runs under ./run/" : "no run under ./run/");
        return -1;
    }
    fprintf(stderr, "dfctl: using run dir %s (the only one under ./run/)\n", first);
    snprintf(out, cap, "%s", first);
    return 0;
}

/* The last "start" and the last "finish" event of <run_dir>/metrics/orchestrator.jsonl (new
 * references, NULL when none); -errno when the file cannot be read. Each event is one line,
 * written compact with sorted keys, so a cheap substring test picks the lines to parse. */
static int last_start_finish(const char *run_dir, json_t **start, json_t **finish)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/metrics/orchestrator.jsonl", run_dir);
    *start = *finish = NULL;
    FILE *f = fopen(path, "re");
    if (!f)
        return -errno;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        int is_start = strstr(line, "\"ev\":\"start\"") != NULL;
        if (!is_start && !strstr(line, "\"ev\":\"finish\""))
            continue;
        json_t *e = json_loads(line, 0, NULL);
        if (!e) /* a line cut by a crash */
            continue;
        json_t **slot = is_start ? start : finish;
        json_decref(*slot);
        *slot = e;
        if (is_start) { /* a finish before this start belongs to an earlier orchestrator */
            json_decref(*finish);
            *finish = NULL;
        }
    }
    free(line);
    fclose(f);
    return 0;
}

/* The socket is gone (or nobody listens): say what the run dir tells of how the run ended,
 * and where its results are. 0 when it said something, -1 when the run dir has no record. */
static int explain_not_running(const char *run_dir, const char *sock_path, int err)
{
    json_t *start, *fin;
    if (last_start_finish(run_dir, &start, &fin) < 0 || !start) {
        json_decref(start);
        json_decref(fin);
        return -1;
    }
    fprintf(stderr, "dfctl: cannot connect to %s: %s: the orchestrator of this run is not running\n", sock_path,
            strerror(err));
    if (!fin) {
        fprintf(stderr,
                "dfctl: its last orchestrator (pid %lld) recorded no end: it was killed or crashed (or is still "
                "starting)\n"
                "  continue it with: orchestrator --resume %s\n"
                "  its log lines:    %s/metrics/orchestrator.jsonl, %s/logs/\n",
                (long long)json_integer_value(json_object_get(start, "pid")), run_dir, run_dir, run_dir);
        json_decref(start);
        return 0;
    }
    char when[40] = "?";
    double t = json_number_value(json_object_get(fin, "t"));
    time_t tt = (time_t)t;
    struct tm tm;
    if (t > 0 && gmtime_r(&tt, &tm))
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    int code = (int)json_integer_value(json_object_get(fin, "exit_code"));
    const char *state = json_string_value(json_object_get(fin, "state"));
    const char *reason = json_string_value(json_object_get(fin, "reason"));
    long long batches = json_integer_value(json_object_get(fin, "batches"));
    long long done =
        json_integer_value(json_object_get(fin, "committed")) + json_integer_value(json_object_get(fin, "poisoned"));
    if (!state) /* written by an older orchestrator: no state, no batch total */
        state = code ? "failed" : json_integer_value(json_object_get(fin, "pending")) ? "incomplete" : "complete";
    char where[300] = "";
    if (json_object_get(fin, "epochs")) /* epochs counted from 1 for people, as everywhere */
        snprintf(where, sizeof where, " of epoch %lld of %lld",
                 (long long)json_integer_value(json_object_get(fin, "epoch")) + 1,
                 (long long)json_integer_value(json_object_get(fin, "epochs")));
    if (!strcmp(state, "complete"))
        fprintf(stderr, "dfctl: the run finished at %s with exit %d: complete, every batch%s committed (step %lld)\n",
                when, code, where, (long long)json_integer_value(json_object_get(fin, "committed_step")));
    else if (json_is_true(json_object_get(fin, "complete"))) /* its work done, its end failed */
        fprintf(stderr,
                "dfctl: the run failed at %s with exit %d, at the end: %s; every batch%s committed (step %lld)\n", when,
                code, reason ? reason : "?", where,
                (long long)json_integer_value(json_object_get(fin, "committed_step")));
    else
        fprintf(stderr,
                "dfctl: the run %s at %s with exit %d, before the end%s%s: %lld%s%lld batches%s committed "
                "(step %lld)\n",
                strcmp(state, "failed") ? "stopped" : "failed", when, code, reason && *reason ? ": " : "",
                reason ? reason : "", done, batches ? " of " : "", batches ? batches : done, where,
                (long long)json_integer_value(json_object_get(fin, "committed_step")));
    char p[1200];
    struct stat st;
    snprintf(p, sizeof p, "%s/train_summary.json", run_dir);
    if (!strcmp(state, "complete") && stat(p, &st) == 0)
        fprintf(stderr, "  training summary: %s\n", p);
    snprintf(p, sizeof p, "%s/drafter", run_dir);
    if (!strcmp(state, "complete") && stat(p, &st) == 0 && S_ISDIR(st.st_mode))
        fprintf(stderr, "  release export:   %s/\n", p);
    const char *audit = json_string_value(json_object_get(fin, "audit"));
    fprintf(stderr, "  ledger audit:     %s%s\n", audit ? audit : run_dir, audit ? "" : "/ledger_audit.json");
    fprintf(stderr, "  logs:             %s/logs/, metrics: %s/metrics/\n", run_dir, run_dir);
    if (strcmp(state, "complete"))
        fprintf(stderr, "  continue it with: orchestrator --resume %s\n", run_dir);
    json_decref(start);
    json_decref(fin);
    return 0;
}

static int connect_ctl(const char *run_dir, char *path, size_t cap)
{
    snprintf(path, cap, "%s/ctl.sock", run_dir);
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof a.sun_path) {
        fprintf(stderr, "dfctl: %s: path too long for a unix socket\n", path);
        return -1;
    }
    memcpy(a.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        fprintf(stderr, "dfctl: socket: %s\n", strerror(errno));
        return -1;
    }
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        int e = errno;
        close(fd);
        if ((e == ENOENT || e == ECONNREFUSED) && explain_not_running(run_dir, path, e) == 0)
            return -1;
        fprintf(stderr, "dfctl: cannot connect to %s: %s (is the orchestrator of this run running?)\n", path,
                strerror(e));
        return -1;
    }
    return fd;
}

/* Send one request line, read one reply line. NULL on error (message printed). */
static volatile sig_atomic_t g_interrupted;
static void on_sigint(int s)
{
    (void)s;
    g_interrupted = 1;
}

/* One request, one reply; NULL (said on stderr unless quiet) when the connection failed. */
static json_t *request_q(int fd, const char *sock_path, json_t *req, int quiet)
{
    char *s = json_dumps(req, JSON_COMPACT);
    if (!s)
        return NULL;
    size_t n = strlen(s);
    char *line = realloc(s, n + 2);
    if (!line) {
        free(s);
        return NULL;
    }
    line[n] = '\n';
    int rc = df_write_all(fd, line, n + 1);
    free(line);
    if (rc < 0) {
        fprintf(stderr, "dfctl: %s: write: %s\n", sock_path, strerror(-rc));
        return NULL;
    }
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    if (!buf)
        return NULL;
    for (;;) {
        if (len + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (!quiet)
                fprintf(stderr, "dfctl: %s: the orchestrator closed the connection without a reply\n", sock_path);
            free(buf);
            return NULL;
        }
        char *nl = memchr(buf + len, '\n', (size_t)r);
        len += (size_t)r;
        if (nl) {
            *nl = 0;
            break;
        }
    }
    json_error_t jerr;
    json_t *rep = json_loads(buf, 0, &jerr);
    free(buf);
    if (!rep)
        fprintf(stderr, "dfctl: %s: bad reply: %s\n", sock_path, jerr.text);
    return rep;
}

static json_t *request(int fd, const char *sock_path, json_t *req)
{
    return request_q(fd, sock_path, req, 0);
}

/* The worker's state in a status reply, or NULL. */
static const char *worker_state(json_t *status, const char *name)
{
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(status, "workers"), i, w)
    {
        if (!strcmp(json_string_value(json_object_get(w, "name")) ?: "", name))
            return json_string_value(json_object_get(w, "state"));
    }
    return NULL;
}

/* After "stop": poll status until the worker is down (stopped, done or failed), so that a
 * "start" right after this one finds it stopped instead of "already stopping". The
 * orchestrator SIGKILLs it after wait_ms at the latest; 5 s more covers the reap. A run that
 * ends meanwhile (the connection closes) has every worker down. Returns the exit code;
 * say: print the outcome on stdout (not with --json, whose stdout is the reply alone). */
static int wait_down(int fd, const char *sock_path, const char *name, long long wait_ms, int say)
{
    double t0 = df_now_ns() * 1e-9, limit = (double)wait_ms / 1000.0 + 5.0;
    char last[32] = "?";
    for (;;) {
        json_t *req = json_pack("{s:s}", "cmd", "status");
        json_t *rep = request_q(fd, sock_path, req, 1);
        json_decref(req);
        double dt = df_now_ns() * 1e-9 - t0;
        if (!rep) {
            if (say)
                printf("stop %s: ok (the run ended, %.2f s)\n", name, dt);
            return 0;
        }
        const char *st = worker_state(rep, name);
        if (st)
            snprintf(last, sizeof last, "%s", st);
        json_decref(rep); /* st went with it: last holds the state */
        if (!strcmp(last, "stopped") || !strcmp(last, "done") || !strcmp(last, "failed")) {
            if (say)
                printf("stop %s: ok (%s after %.2f s)\n", name, last, dt);
            return 0;
        }
        if (dt > limit || g_interrupted) {
            fprintf(stderr, "dfctl: stop %s: SIGTERM sent, but it is still %s after %.1f s\n", name, last, dt);
            return 1;
        }
        usleep(20000);
    }
}

static void fmt_dur(char *out, size_t cap, double s)
{
    if (!(s >= 0 && s < 1e9)) /* NaN, negative or past ~30 years: unknown ((int)s would overflow) */
        snprintf(out, cap, "-");
    else if (s < 60)
        snprintf(out, cap, "%.1fs", s);
    else if (s < 3600)
        snprintf(out, cap, "%dm%02ds", (int)s / 60, (int)s % 60);
    else
        snprintf(out, cap, "%dh%02dm", (int)s / 3600, ((int)s % 3600) / 60);
}

/* The training figures (the orchestrator's "train" object, docs/operations.md). */
static void print_train(json_t *tr)
{
    if (!tr)
        return;
    char eta[32] = "-";
    json_t *e = json_object_get(tr, "eta_s"), *st = json_object_get(tr, "step");
    if (json_is_number(e))
        fmt_dur(eta, sizeof eta, json_number_value(e));
    char step[32] = "-", v[32];
    if (json_is_integer(st))
        snprintf(step, sizeof step, "%lld", (long long)json_integer_value(st));
    printf("train: step %s of %lld", step, (long long)json_integer_value(json_object_get(tr, "total_steps")));
    for (int k = 0; k < METRICS_N_KEYS; k++) { /* the training figures of io/metrics_keys.h, "-" until known */
        const metrics_key *m = &metrics_keys[k];
        if (m->from != METRICS_FROM_STEP)
            continue;
        json_t *x = json_object_get(tr, m->key);
        if (json_is_number(x))
            snprintf(v, sizeof v, m->dfctl_fmt, json_number_value(x));
        else
            snprintf(v, sizeof v, "-");
        printf(", %s %s", m->name, v);
    }
    printf(", %.0f tokens/s; %lld of %lld samples trained, %.1f samples/s, ETA %s\n",
           json_number_value(json_object_get(tr, "tokens_per_s")),
           (long long)json_integer_value(json_object_get(tr, "samples_done")),
           (long long)json_integer_value(json_object_get(tr, "samples_total")),
           json_number_value(json_object_get(tr, "samples_per_s")), eta);
    if (json_object_get(tr, "val_step")) { /* a validation line was seen */
        printf("validation: step %lld", (long long)json_integer_value(json_object_get(tr, "val_step")));
        for (int k = 0; k < METRICS_N_KEYS; k++) {
            const metrics_key *m = &metrics_keys[k];
            if (m->from != METRICS_FROM_VALIDATION)
                continue;
            snprintf(v, sizeof v, m->dfctl_fmt, json_number_value(json_object_get(tr, m->key)));
            printf(", %s %s", m->name, v);
        }
        printf("\n");
    }
}

static void print_status(json_t *s)
{
    json_t *run = json_object_get(s, "run");
    char up[32];
    fmt_dur(up, sizeof up, json_real_value(json_object_get(run, "uptime_s")));
    printf("run %s  %s  up %s  %s%s%s\n", json_string_value(json_object_get(run, "name")),
           json_string_value(json_object_get(run, "state")), up, json_string_value(json_object_get(run, "run_dir")),
           json_is_true(json_object_get(run, "paused")) ? "  [paused]" : "",
           json_is_true(json_object_get(run, "stop_claiming")) ? "  [draining]" : "");
    printf("\n%-12s %-9s %7s %-9s %4s %8s %8s %8s %7s %8s %9s %5s %5s  %s\n", "WORKER", "ROLE", "PID", "STATE", "INC",
           "RESTARTS", "UPTIME", "HB AGE", "STEP", "ITEMS/S", "TOKENS/S", "BUSY", "WAIT", "LAST EXIT");
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(s, "workers"), i, w)
    {
        char upt[32] = "-", hb[32] = "-", step[32] = "-", pid[16] = "-";
        if (json_integer_value(json_object_get(w, "pid")) > 0) {
            snprintf(pid, sizeof pid, "%lld", (long long)json_integer_value(json_object_get(w, "pid")));
            fmt_dur(upt, sizeof upt, json_real_value(json_object_get(w, "uptime_s")));
            snprintf(hb, sizeof hb, "%.0fms", json_real_value(json_object_get(w, "heartbeat_age_ms")));
            snprintf(step, sizeof step, "%lld", (long long)json_integer_value(json_object_get(w, "step")));
        }
        const char *le = json_string_value(json_object_get(w, "last_exit"));
        char busy[16] = "-", wait[16] = "-";
        if (json_is_number(json_object_get(w, "busy_frac"))) {
            snprintf(busy, sizeof busy, "%.0f%%", 100 * json_number_value(json_object_get(w, "busy_frac")));
            snprintf(wait, sizeof wait, "%.0f%%", 100 * json_number_value(json_object_get(w, "wait_frac")));
        }
        printf("%-12s %-9s %7s %-9s %4lld %8lld %8s %8s %7s %8.1f %9.0f %5s %5s  %s\n",
               json_string_value(json_object_get(w, "name")), json_string_value(json_object_get(w, "role")), pid,
               json_string_value(json_object_get(w, "state")),
               (long long)json_integer_value(json_object_get(w, "incarnation")),
               (long long)json_integer_value(json_object_get(w, "restarts")), upt, hb, step,
               json_real_value(json_object_get(w, "items_per_s")), json_real_value(json_object_get(w, "tokens_per_s")),
               busy, wait, le && *le ? le : "-");
    }
    json_array_foreach(json_object_get(s, "workers"), i, w)
    { /* only when something failed */
        json_int_t nf = json_integer_value(json_object_get(w, "checkpoint_failures"));
        if (nf > 0)
            printf("%s: %lld checkpoint failures (%lld in a row), last: %s\n",
                   json_string_value(json_object_get(w, "name")), (long long)nf,
                   (long long)json_integer_value(json_object_get(w, "checkpoint_failures_in_a_row")),
                   json_string_value(json_object_get(w, "checkpoint_last_error")) ?: "?");
    }
    printf("\n%-12s %5s %5s %7s %5s %7s %8s %9s %8s  %s\n", "RING", "SLOTS", "FREE", "WRITING", "READY", "READING",
           "POISONED", "PUBLISHED", "OLDEST", "");
    json_array_foreach(json_object_get(s, "rings"), i, w)
    {
        char old[32];
        fmt_dur(old, sizeof old, json_real_value(json_object_get(w, "oldest_lease_ms")) / 1000.0);
        printf("%-12s %5lld %5lld %7lld %5lld %7lld %8lld %9lld %8s  %s\n",
               json_string_value(json_object_get(w, "name")),
               (long long)json_integer_value(json_object_get(w, "slots")),
               (long long)json_integer_value(json_object_get(w, "free")),
               (long long)json_integer_value(json_object_get(w, "writing")),
               (long long)json_integer_value(json_object_get(w, "ready")),
               (long long)json_integer_value(json_object_get(w, "reading")),
               (long long)json_integer_value(json_object_get(w, "poisoned_total")),
               (long long)json_integer_value(json_object_get(w, "published")), old,
               json_is_true(json_object_get(w, "closed")) ? "closed" : "");
    }
    json_t *l = json_object_get(s, "ledger");
    printf("\nledger: epoch %lld of %lld, %lld batches: %lld pending, %lld claimed, %lld in ring, %lld trained, "
           "%lld committed, %lld poisoned; committed step %lld\n",
           (long long)json_integer_value(json_object_get(l, "epoch")) + 1,
           (long long)json_integer_value(json_object_get(l, "epochs")),
           (long long)json_integer_value(json_object_get(l, "batches")),
           (long long)json_integer_value(json_object_get(l, "pending")),
           (long long)json_integer_value(json_object_get(l, "claimed")),
           (long long)json_integer_value(json_object_get(l, "in_ring")),
           (long long)json_integer_value(json_object_get(l, "trained")),
           (long long)json_integer_value(json_object_get(l, "committed")),
           (long long)json_integer_value(json_object_get(l, "poisoned")),
           (long long)json_integer_value(json_object_get(l, "committed_step")));
    print_train(json_object_get(s, "train"));
}

/* Print a reply; returns the exit code it implies. */
static int show(json_t *rep, int as_json, int is_status)
{
    if (as_json) {
        char *s = json_dumps(rep, JSON_COMPACT);
        printf("%s\n", s ? s : "null");
        free(s);
    }
    if (!json_is_true(json_object_get(rep, "ok"))) {
        const char *e = json_string_value(json_object_get(rep, "error"));
        fprintf(stderr, "dfctl: %s\n", e ? e : "request failed");
        json_int_t code = json_integer_value(json_object_get(rep, "code"));
        return code == 2 ? 2 : 1;
    }
    if (!as_json) {
        if (is_status)
            print_status(rep);
        else
            printf("%s\n", json_string_value(json_object_get(rep, "msg")) ?: "ok");
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *run_opt = NULL, *cmd = NULL, *worker = NULL;
    int as_json = 0, no_wait = 0;
    long count = -1;
    df_log_init("dfctl");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            as_json = 1;
        } else if (!strcmp(argv[i], "--no-wait")) {
            no_wait = 1;
        } else if (!strcmp(argv[i], "--run-dir") && i + 1 < argc) {
            run_opt = argv[++i];
        } else if (!strcmp(argv[i], "--count") && i + 1 < argc) {
            long long n;
            if (df_parse_int(argv[++i], 1, LONG_MAX, &n) < 0) {
                fprintf(stderr, "dfctl: --count %s: expected a positive integer\n", argv[i]);
                return 2;
            }
            count = (long)n;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "dfctl: unknown option %s (dfctl --help)\n", argv[i]);
            return 2;
        } else if (!cmd) {
            cmd = argv[i];
        } else if (!worker) {
            worker = argv[i];
        } else {
            fprintf(stderr, "dfctl: too many arguments (%s)\n", argv[i]);
            return 2;
        }
    }
    if (!cmd) {
        usage(stderr);
        return 2;
    }
    static const char *const with_worker[] = {"stop", "start", "restart", "kill"};
    static const char *const plain[] = {"status", "top", "pause", "resume", "checkpoint", "shutdown"};
    int needs_worker = 0, known = 0;
    for (size_t k = 0; k < DF_ARRAY_LEN(with_worker); k++)
        if (!strcmp(cmd, with_worker[k]))
            known = needs_worker = 1;
    for (size_t k = 0; k < DF_ARRAY_LEN(plain); k++)
        if (!strcmp(cmd, plain[k]))
            known = 1;
    if (!known) {
        fprintf(stderr, "dfctl: unknown command \"%s\" (dfctl --help lists them)\n", cmd);
        return 2;
    }
    if (needs_worker && !worker) {
        fprintf(stderr, "dfctl: %s needs a worker name (dfctl status lists them)\n", cmd);
        return 2;
    }
    if (!needs_worker && worker) {
        fprintf(stderr, "dfctl: %s takes no argument (got \"%s\")\n", cmd, worker);
        return 2;
    }
    char run_dir[1024], sock_path[1200];
    if (pick_run_dir(run_opt, run_dir, sizeof run_dir) < 0)
        return 1;
    signal(SIGPIPE, SIG_IGN);
    int fd = connect_ctl(run_dir, sock_path, sizeof sock_path);
    if (fd < 0)
        return 1;

    int code = 0;
    if (!strcmp(cmd, "top")) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_sigint;
        sigaction(SIGINT, &sa, NULL);
        int tty = isatty(1);
        for (long it = 0; (count < 0 || it < count) && !g_interrupted; it++) {
            json_t *req = json_pack("{s:s}", "cmd", "status");
            json_t *rep = request(fd, sock_path, req);
            json_decref(req);
            if (!rep) {
                code = 1;
                break;
            }
            if (tty && !as_json)
                printf("\033[H\033[2J");
            code = show(rep, as_json, 1);
            json_decref(rep);
            fflush(stdout);
            if (code || (count >= 0 && it + 1 >= count))
                break;
            for (int k = 0; k < 10 && !g_interrupted; k++)
                usleep(100000);
        }
    } else {
        json_t *req = json_pack("{s:s}", "cmd", cmd);
        if (worker)
            json_object_set_new(req, "worker", json_string(worker));
        json_t *rep = request(fd, sock_path, req);
        json_decref(req);
        int is_stop = !strcmp(cmd, "stop");
        json_t *wait = rep ? json_object_get(rep, "wait_ms") : NULL;
        int waits = rep && is_stop && !no_wait && json_is_true(json_object_get(rep, "ok")) && json_is_integer(wait);
        if (waits && !as_json) /* wait_down prints the outcome in place of the reply */
            code = wait_down(fd, sock_path, worker, json_integer_value(wait), 1);
        else
            code = rep ? show(rep, as_json, !strcmp(cmd, "status")) : 1;
        if (waits && as_json && code == 0)
            code = wait_down(fd, sock_path, worker, json_integer_value(wait), 0);
        json_decref(rep);
    }
    close(fd);
    return code;
}
