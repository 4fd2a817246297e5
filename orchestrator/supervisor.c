/* supervisor.c: spawning, watching and restarting workers; the drain on shutdown.
 *
 * One worker's life (all on the loop thread) is one state table ("the state table" below;
 * docs/supervisor.md): every event (spawned, ready, exit, reaped, hang, dfctl stop / start /
 * restart / kill, a group peer died, the backoff and escalation timers, shutdown, ...) goes
 * through apply(), which enters the row's next state and runs its action. In words:
 *   spawn: socketpair (SOCK_SEQPACKET), uv_spawn with stdout/stderr appended to
 *          logs/<name>.log, fd 3 = the worker's end; the hello + every segment fd goes out
 *          at once (it waits in the socket until the worker reads it). State STARTING.
 *   READY: {"ev":"ready"} on the socket -> UP.
 *   exit:  the uv exit callback records the status, drains the socket (a final checkpoint
 *          sent just before exiting is still honoured), closes the handles; when both are
 *          closed the worker is reaped and reclaimed (handoff_recover_ex over every ring,
 *          poisoned slots recorded in the ledger, ledger_reclaim_owner), THEN the policy
 *          decides. Reclaim always happens before any restart.
 *   hang:  a timer compares each heartbeat with the worker's heartbeat_timeout_ms (in
 *          STARTING, before its ready, with startup_timeout_ms: a model may take minutes to
 *          load) and SIGKILLs a silent worker; the exit callback then does the rest.
 * Restart policy: exit 0 = done (never restarted); exit 100 = permanent (never restarted;
 * the run continues only if another worker of the same role on the same rings can finish
 * the work, else it shuts down with exit 1); anything else = restart after a backoff that
 * starts at backoff_initial_ms, doubles up to backoff_max_ms and resets once the worker
 * was up for stable_ms; more than max_restarts restarts of one worker within
 * restart_window_s -> the run shuts down, exit 1, naming the worker and its log tail (once).
 * Only failures count: a `dfctl kill` restarts the worker after backoff_initial_ms without
 * counting (exit intent AFTER_KILL), and dfctl restart / stop / start never count.
 * The run's last line says how it ended (complete; stopped or failed before the end, with
 * `orchestrator --resume <run dir>`), and the finish event carries the same for dfctl.
 * Drafter ranks are one group: when one dies the group's all-reduce is aborted, the others
 * are SIGKILLed, all are reclaimed, the ledger rewinds to the last committed step, and all
 * restart together (group.c re-formats the all-reduce segment). In deterministic mode the
 * group is every worker, and the rings are re-formatted too (docs/ledger.md).
 *
 * Shutdown (signal or `dfctl shutdown`; docs/operations.md): stop-claiming is set, so
 * producers finish their batch and exit 0; a ring whose producers have all exited is
 * closed (ring_close_for_shutdown), so its consumers drain it and exit 0 in turn: targets,
 * then postproc, then drafters. After shutdown_timeout_ms whatever still runs gets SIGTERM
 * (and the stop flag), after another shutdown_timeout_ms SIGKILL. Then the ledger audit is
 * written and the loop ends.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ipc/fdpass.h"
#include "orch.h"
#include "util.h"

extern char **environ;

/* The events of a worker's life: what the state table (below, "the state table") is indexed
 * by besides the state. docs/supervisor.md says what raises each. */
typedef enum {
    EV_BOOT,             /* the run starts: spawn every worker */
    EV_SPAWNED,          /* uv_spawn succeeded */
    EV_SPAWN_FAILED,     /* uv_spawn failed: handled like an exit with status 127 */
    EV_HELLO_FAILED,     /* the hello (and segment fds) could not be sent */
    EV_READY,            /* {"ev":"ready"} on the control socket */
    EV_EXIT,             /* the process ended (exit code or signal recorded) */
    EV_REAPED,           /* its handles are closed: reclaim, then the restart policy */
    EV_HANG,             /* no heartbeat within heartbeat_timeout_ms */
    EV_STOP,             /* dfctl stop */
    EV_START,            /* dfctl start */
    EV_RESTART,          /* dfctl restart */
    EV_KILL,             /* dfctl kill */
    EV_PEER_DIED,        /* a member of its restart group went down */
    EV_BACKOFF_TIMER,    /* the backoff delay is over */
    EV_ESCALATION_TIMER, /* shutdown_timeout_ms after our SIGTERM */
    EV_SHUTDOWN,         /* the run begins to shut down (drain) */
    EV_SHUTDOWN_TERM,    /* the drain took too long: SIGTERM to what still runs */
    EV_SHUTDOWN_KILL,    /* the SIGTERM did not do it either: SIGKILL */
    EV_GROUP_RESTART,    /* every member of its group is reaped: restart together */
    EV_EPOCH,            /* the next epoch starts: respawn the finished workers */
    EV_N_EVENTS
} supervisor_event;

static int apply(orch_worker *w, supervisor_event ev);
static void check_rings(orch *o);
static void maybe_finish(orch *o);
static int spawn_worker(orch *o, orch_worker *w);

/* A process of this worker exists (or its handles are still closing). */
static int running(const orch_worker *w)
{
    return w->sv == SV_STARTING || w->sv == SV_UP || w->sv == SV_STOPPING || w->sv == SV_KILLED || w->sv == SV_EXITED;
}

/* What dfctl and the status segment show. */
static void publish(orch_worker *w, status_state s)
{
    w->state = s;
    status_slot *sl = &w->o->status->slots[w->id];
    atomic_store_explicit(&sl->state, s, memory_order_relaxed);
    atomic_store_explicit(&sl->pid, w->pid, memory_order_relaxed);
    atomic_store_explicit(&sl->incarnation, w->incarnation, memory_order_relaxed);
    atomic_store_explicit(&sl->restarts, w->restarts, memory_order_relaxed);
}

/* What each state shows (-1: KILLED and EXITED keep showing the state before them). */
static const int sv_shows[SV_N_STATES] = {
    [SV_IDLE] = STATUS_IDLE,
    [SV_STARTING] = STATUS_STARTING,
    [SV_UP] = STATUS_UP,
    [SV_STOPPING] = STATUS_STOPPING,
    [SV_KILLED] = -1,
    [SV_EXITED] = -1,
    [SV_BACKOFF] = STATUS_BACKOFF,
    [SV_GROUPWAIT] = STATUS_GROUPWAIT,
    [SV_STOPPED] = STATUS_STOPPED,
    [SV_DONE] = STATUS_DONE,
    [SV_FAILED] = STATUS_FAILED,
};

static void enter(orch_worker *w, supervisor_state s)
{
    w->sv = s;
    if (sv_shows[s] >= 0)
        publish(w, (status_state)sv_shows[s]);
}

static void ev_worker(orch *o, orch_worker *w, const char *ev, json_t *extra)
{
    json_t *e = json_pack("{s:s, s:s, s:i, s:I}", "ev", ev, "worker", w->tw->name, "inc", (int)w->incarnation, "pid",
                          (json_int_t)(w->pid > 0 ? w->pid : w->proc.pid));
    if (extra) {
        json_object_update(e, extra);
        json_decref(extra);
    }
    orch_event(o, e);
}

static void signal_worker(orch_worker *w, int sig, const char *reason)
{
    if (w->pid <= 0)
        return;
    if (reason && !w->reason[0])
        snprintf(w->reason, sizeof w->reason, "%s", reason);
    int rc = uv_process_kill(&w->proc, sig);
    ev_worker(w->o, w, "signal", json_pack("{s:i, s:s, s:i}", "signal", sig, "reason", reason ? reason : "", "rc", rc));
}

/* ---- control socket of one worker ------------------------------------------------- */

static void handle_message(orch *o, orch_worker *w, const char *buf)
{
    json_error_t jerr;
    json_t *m = json_loads(buf, 0, &jerr);
    const char *ev = json_string_value(json_object_get(m, "ev"));
    if (!ev) {
        df_log("%s: bad control message (%s): %.200s", w->tw->name, jerr.text, buf);
        json_decref(m);
        return;
    }
    if (!strcmp(ev, "ready")) {
        (void)apply(w, EV_READY);
    } else if (!strcmp(ev, "checkpoint")) {
        json_int_t step = json_integer_value(json_object_get(m, "step"));
        w->ckpt_fail_consec = 0;
        /* acknowledge only a commit that ledger.bin holds: the drafter may then delete older
         * checkpoints, and a --resume after any crash starts from this one or a later one */
        if (step > 0 && supervisor_commit(o, (uint64_t)step) == 0) {
            char ack[96];
            int n = snprintf(ack, sizeof ack, "{\"ev\":\"committed\",\"step\":%llu}",
                             (unsigned long long)o->committed_step);
            int rc = fdpass_send(w->ctl_fd, ack, (size_t)n, NULL, 0);
            /* a dying worker needs no ack; a full socket means the worker does not read acks
             * (it then prunes nothing, which is safe) */
            if (rc < 0 && rc != -EPIPE && rc != -ECONNRESET && rc != -EAGAIN && rc != -EWOULDBLOCK)
                df_log("%s: sending the commit acknowledgement: %s", w->tw->name, strerror(-rc));
        }
    } else if (!strcmp(ev, "checkpoint_failed")) {
        /* the drafter trains on (its previous checkpoint is intact) and gives up by itself
         * after drafter.max_checkpoint_failures in a row; we count for dfctl status */
        w->ckpt_failures++;
        w->ckpt_fail_consec = (uint32_t)json_integer_value(json_object_get(m, "consecutive"));
        snprintf(w->ckpt_last_error, sizeof w->ckpt_last_error, "%s",
                 json_string_value(json_object_get(m, "error")) ?: "");
        df_log("%s: checkpoint at step %lld failed (%u in a row): %s", w->tw->name,
               (long long)json_integer_value(json_object_get(m, "step")), w->ckpt_fail_consec, w->ckpt_last_error);
        json_t *e = json_deep_copy(m);
        json_object_del(e, "ev");
        json_object_set_new(e, "failures_total", json_integer(w->ckpt_failures));
        ev_worker(o, w, "checkpoint_failed", e);
    } else {
        json_t *e = json_deep_copy(m);
        json_object_set_new(e, "worker_ev", json_string(ev));
        json_object_del(e, "ev");
        ev_worker(o, w, "worker_event", e);
    }
    json_decref(m);
}

static void read_ctl(orch *o, orch_worker *w)
{
    char buf[8192];
    for (;;) {
        int fds[8], nfds = 0;
        int n = fdpass_recv(w->ctl_fd, buf, sizeof buf - 1, fds, 8, &nfds);
        for (int i = 0; i < nfds; i++)
            close(fds[i]); /* workers send no fds; never leak one */
        if (n == -EAGAIN || n == -EWOULDBLOCK)
            return;
        /* A worker that exits with our acks unread in its queue makes the kernel report
         * ECONNRESET here once, ahead of the messages it sent before exiting (a final
         * checkpoint): the error is cleared by being reported, so read on. */
        if (n == -ECONNRESET)
            continue;
        if (n <= 0) { /* closed or broken: the exit callback cleans up */
            if (uv_is_active((uv_handle_t *)&w->poll))
                uv_poll_stop(&w->poll);
            return;
        }
        buf[n] = 0;
        handle_message(o, w, buf);
    }
}

static void on_ctl_readable(uv_poll_t *h, int status, int events)
{
    orch_worker *w = h->data;
    (void)events;
    if (status < 0) {
        uv_poll_stop(h);
        return;
    }
    read_ctl(w->o, w);
}

static json_t *hello_json(orch *o, orch_worker *w, int *fds, int *nfds)
{
    json_t *segs = json_array();
    int k = 0;
#define SEG(nm, kind_, a, ring_)                                                                                  \
    do {                                                                                                          \
        json_t *s_ =                                                                                              \
            json_pack("{s:s, s:s, s:I, s:i}", "name", nm, "kind", kind_, "size", (json_int_t)(a)->size, "fd", k); \
        if ((ring_) >= 0)                                                                                         \
            json_object_set_new(s_, "ring", json_integer(ring_));                                                 \
        json_array_append_new(segs, s_);                                                                          \
        fds[k++] = (a)->fd;                                                                                       \
    } while (0)
    SEG("status", "status", &o->status_seg, -1);
    SEG("handoff", "handoff", &o->handoff_seg, -1);
    SEG("ledger", "ledger", &o->ledger_seg, -1);
    for (int i = 0; i < o->t.n_rings; i++) {
        char nm[64];
        snprintf(nm, sizeof nm, "ring:%s", o->t.rings[i].name);
        SEG(nm, "ring", &o->ring_seg[i], i);
        snprintf(nm, sizeof nm, "arena:%s", o->t.rings[i].name);
        SEG(nm, "arena", &o->ring_arena[i], i);
        json_t *last = json_array_get(segs, json_array_size(segs) - 1);
        json_object_set_new(last, "backend", json_string(o->ring_arena[i].kind == ARENA_CUDA ? "cuda" : "cpu"));
        json_object_set_new(last, "device", json_integer(o->ring_arena[i].device));
    }
    int drafter = w->tw->role == TOPOLOGY_ROLE_DRAFTER;
    if (drafter && o->allreduce_seg.base)
        SEG("allreduce", "allreduce", &o->allreduce_seg, -1);
#undef SEG
    *nfds = k;
    json_t *h = json_pack("{s:i, s:i, s:s, s:i, s:s, s:s, s:s, s:I, s:o}", "v", 1, "worker_id", w->id, "name",
                          w->tw->name, "incarnation", (int)w->incarnation, "role", topology_role_name(w->tw->role),
                          "topology", o->topology_path, "run_dir", o->run_dir, "committed_step",
                          (json_int_t)o->committed_step, "segments", segs);
    if (h && drafter) { /* the group's identity, and for cuda groups this generation's NCCL id */
        json_t *g = json_pack("{s:i, s:I, s:s}", "world", topology_n_drafters(&o->t), "generation",
                              (json_int_t)o->group_gen, "allreduce",
                              o->allreduce_seg.base ? "shm"
                              : o->nccl_id[0]       ? "nccl"
                                                    : "none");
        if (g && o->nccl_id[0])
            json_object_set_new(g, "nccl_id", json_string(o->nccl_id));
        json_object_set_new(h, "group", g);
    }
    return h;
}

/* ---- spawn ----------------------------------------------------------------------- */

static int env_is_ours(const char *kv)
{
    static const char *const keys[] = {
        "DF_CTL_FD=", "DF_WORKER=", "DF_WORKER_ID=", "DF_INCARNATION=", "DF_RUN_DIR=", "DF_ORCH_PID="};
    for (size_t i = 0; i < DF_ARRAY_LEN(keys); i++)
        if (!strncmp(kv, keys[i], strlen(keys[i])))
            return 1;
    return 0;
}

static void on_handle_closed(uv_handle_t *h)
{
    orch_worker *w = h->data;
    if (--w->closing > 0)
        return;
    if (w->ctl_fd >= 0)
        close(w->ctl_fd);
    w->ctl_fd = -1;
    (void)apply(w, EV_REAPED);
}

static void on_exit_cb(uv_process_t *p, int64_t exit_status, int term_signal)
{
    orch_worker *w = p->data;
    orch *o = w->o;
    w->exit_status = (int)exit_status;
    w->term_signal = term_signal;
    if (w->ctl_fd >= 0)
        read_ctl(o, w); /* messages sent just before the exit (a final checkpoint) */
    (void)apply(w, EV_EXIT);
}

static int spawn_worker(orch *o, orch_worker *w)
{
    int sv[2] = {-1, -1}, logfd = -1, rc;
    char **env = NULL, **args = NULL;
    char logpath[1200];
    size_t nenv = 0, i;

    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
        rc = -errno;
        goto fail;
    }
    snprintf(logpath, sizeof logpath, "%s/logs/%s.log", o->run_dir, w->tw->name);
    logfd = open(logpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (logfd < 0) {
        rc = -errno;
        goto fail;
    }
    w->incarnation++;
    {
        char hdr[1300], stamp[40];
        df_log_stamp(stamp, sizeof stamp);
        int hl = snprintf(hdr, sizeof hdr, "%s === orchestrator: starting %s incarnation %u (%s) ===\n", stamp,
                          w->tw->name, w->incarnation, w->bin);
        (void)df_write_all(logfd, hdr, (size_t)hl);
    }

    /* environment: ours (minus the DF_ control keys), then the protocol keys, then the topology's */
    for (char **e = environ; *e; e++)
        nenv++;
    for (char **e = w->tw->env; e && *e; e++)
        nenv++;
    env = calloc(nenv + 8, sizeof *env);
    if (!env) {
        rc = -ENOMEM;
        goto fail;
    }
    i = 0;
    for (char **e = environ; *e; e++)
        if (!env_is_ours(*e) && !(env[i++] = strdup(*e)))
            goto nomem;
    if (asprintf(&env[i++], "DF_CTL_FD=%d", 3) < 0 || asprintf(&env[i++], "DF_WORKER=%s", w->tw->name) < 0 ||
        asprintf(&env[i++], "DF_WORKER_ID=%d", w->id) < 0 ||
        asprintf(&env[i++], "DF_INCARNATION=%u", w->incarnation) < 0 ||
        asprintf(&env[i++], "DF_RUN_DIR=%s", o->run_dir) < 0 ||
        asprintf(&env[i++], "DF_ORCH_PID=%d", (int)getpid()) < 0) {
        env[i - 1] = NULL; /* asprintf leaves it undefined on failure */
        goto nomem;
    }
    for (char **e = w->tw->env; e && *e; e++)
        if (!(env[i++] = strdup(*e)))
            goto nomem;
    env[i] = NULL;

    size_t nargs = 1;
    for (char **a = w->tw->args; a && *a; a++)
        nargs++;
    args = calloc(nargs + 1, sizeof *args);
    if (!args) {
        rc = -ENOMEM;
        goto fail;
    }
    args[0] = w->bin;
    for (size_t k = 1; k < nargs; k++)
        args[k] = w->tw->args[k - 1];

    uv_stdio_container_t stdio[4];
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_INHERIT_FD;
    stdio[1].data.fd = logfd;
    stdio[2].flags = UV_INHERIT_FD;
    stdio[2].data.fd = logfd;
    stdio[3].flags = UV_INHERIT_FD;
    stdio[3].data.fd = sv[1];
    uv_process_options_t opt;
    memset(&opt, 0, sizeof opt);
    opt.exit_cb = on_exit_cb;
    opt.file = w->bin;
    opt.args = args;
    opt.env = env;
    opt.cwd = NULL;
    opt.stdio = stdio;
    opt.stdio_count = 4;
    /* own session: a terminal's Ctrl-C reaches only the orchestrator, which drains */
    opt.flags = UV_PROCESS_DETACHED;
    w->proc.data = w;
    rc = uv_spawn(o->loop, &w->proc, &opt);
    if (rc < 0) {
        /* the handle was initialised: close it, then treat this like an immediate exit */
        char msg[256];
        int ml = snprintf(msg, sizeof msg, "orchestrator: cannot spawn %s: %s\n", w->bin, uv_strerror(rc));
        (void)df_write_all(logfd, msg, (size_t)ml);
        df_log("%s: cannot spawn %s: %s", w->tw->name, w->bin, uv_strerror(rc));
        ev_worker(o, w, "spawn_failed", json_pack("{s:s}", "error", uv_strerror(rc)));
        w->exit_status = 127;
        w->term_signal = 0;
        w->closing = 1;
        w->pid = 0;
        close(sv[0]);
        sv[0] = -1;
        (void)apply(w, EV_SPAWN_FAILED);
        uv_close((uv_handle_t *)&w->proc, on_handle_closed);
        rc = 0;
        goto out;
    }
    w->pid = w->proc.pid;
    w->start_ns = df_now_ns();
    w->ready_ns = 0;
    w->reason[0] = 0;
    w->after = AFTER_POLICY;
    w->items_prev = w->tokens_prev = 0;
    w->sample_ns = w->start_ns;
    if (w->incarnation > 1 && !o->epoch_switching)
        w->restarts++;
    w->ctl_fd = sv[0];
    sv[0] = -1;
    int fl = fcntl(w->ctl_fd, F_GETFL);
    (void)fcntl(w->ctl_fd, F_SETFL, fl | O_NONBLOCK);
    uv_poll_init(o->loop, &w->poll, w->ctl_fd);
    w->poll.data = w;
    uv_poll_start(&w->poll, UV_READABLE, on_ctl_readable);
    (void)apply(w, EV_SPAWNED);

    int fds[FDPASS_MAX_FDS], nfds = 0;
    json_t *hello = hello_json(o, w, fds, &nfds);
    char *text = json_dumps(hello, JSON_COMPACT);
    json_decref(hello);
    rc = text ? fdpass_send(w->ctl_fd, text, strlen(text), fds, nfds) : -ENOMEM;
    free(text);
    ev_worker(o, w, "spawn", json_pack("{s:s, s:i}", "bin", w->bin, "hello_rc", rc));
    if (rc < 0) {
        /* it cannot work without its segments: kill it, the exit path restarts it */
        df_log("%s: sending the hello failed: %s", w->tw->name, strerror(-rc));
        (void)apply(w, EV_HELLO_FAILED);
    }
    rc = 0;
    goto out;
nomem:
    rc = -ENOMEM;
fail:
    df_log("%s: cannot start: %s", w->tw->name, strerror(-rc));
out:
    if (sv[0] >= 0)
        close(sv[0]);
    if (sv[1] >= 0)
        close(sv[1]);
    if (logfd >= 0)
        close(logfd);
    if (env) {
        for (char **e = env; *e; e++)
            free(*e);
        free(env);
    }
    free(args);
    return rc;
}

/* ---- reclaim ---------------------------------------------------------------------- */

static int hook_out_done(void *ctx, uint16_t worker, uint64_t token)
{
    orch *o = ctx;
    ledger_batch_status st;
    (void)worker;
    if (ledger_batch_status_get(&o->led, token, &st) < 0)
        return 0;
    return st.state == LEDGER_TRAINED || st.state == LEDGER_COMMITTED;
}

static void hook_in_resolved(void *ctx, uint16_t worker, uint64_t token, int moved_on)
{
    orch *o = ctx;
    (void)worker;
    /* published but the producer died before ledger_set_in_ring: do it for it; not
     * published: ledger_reclaim_owner (below) returns the batch to pending */
    if (moved_on)
        (void)ledger_set_in_ring(&o->led, token);
}

/* Record every POISONED slot of every ring in the ledger, then free the slot. */
static uint32_t sweep_poisoned(orch *o, json_t *ids)
{
    uint32_t n = 0;
    for (int r = 0; r < o->t.n_rings; r++) {
        for (uint32_t s = 0; s < o->rings[r].nslots; s++) {
            ring_slot_info si;
            if (ring_slot_read(&o->rings[r], s, &si) < 0 || si.state != RING_POISONED)
                continue;
            uint64_t b = ring_desc_at(&o->rings[r], s)->batch_id;
            int rc = ledger_mark_poisoned(&o->led, b);
            df_log("ring %s slot %u: batch %llu poisoned after %u failed attempts (ledger: %s)", o->t.rings[r].name, s,
                   (unsigned long long)b, si.attempts, rc < 0 ? strerror(-rc) : "ok");
            json_array_append_new(ids, json_integer((json_int_t)b));
            (void)ring_free_poisoned(&o->rings[r], s);
            n++;
        }
    }
    o->poisoned_total += n;
    return n;
}

/* Deterministic mode, a member killed for a group restart: its leases need no recovery,
 * because every ring is re-formatted and every in-flight batch returned to PENDING once the
 * whole group is reaped (group_restart_prepare). Running the ring recovery anyway would
 * count the kill as a failed attempt of the batch it held, and could poison it. */
static void reclaim_for_group(orch *o, orch_worker *w)
{
    uint32_t returned = 0;
    (void)handoff_clear(&o->handoff, (uint16_t)w->id);
    (void)ledger_reclaim_owner_ex(&o->led, (uint16_t)w->id, &returned);
    ev_worker(o, w, "reclaim", json_pack("{s:s, s:i}", "mode", "group reset", "ledger_returned", (int)returned));
}

static void reclaim(orch *o, orch_worker *w)
{
    if (o->t.deterministic && w->after == AFTER_GROUP) {
        reclaim_for_group(o, w);
        return;
    }
    ring *rp[TOPOLOGY_MAX_RINGS];
    for (int i = 0; i < o->t.n_rings; i++)
        rp[i] = &o->rings[i];
    ring_reclaim_report rep;
    memset(&rep, 0, sizeof rep);
    handoff_hooks hooks = {.out_done = hook_out_done, .in_resolved = hook_in_resolved, .ctx = o};
    int rc = handoff_recover_ex(&o->handoff, (uint16_t)w->id, rp, o->t.n_rings, &hooks, &rep);
    if (rc < 0)
        df_log("%s: handoff_recover: %s", w->tw->name, strerror(-rc));
    json_t *ids = json_array();
    uint32_t poisoned = sweep_poisoned(o, ids);
    uint32_t returned = 0;
    int lrc = ledger_reclaim_owner_ex(&o->led, (uint16_t)w->id, &returned);
    if (lrc < 0)
        df_log("%s: ledger_reclaim_owner: %s", w->tw->name, strerror(-lrc));
    if (rep.freed || rep.requeued || poisoned || returned || rep.intents)
        df_log("%s: reclaimed: %u slots freed, %u requeued, %u poisoned, %u hand-offs resolved, %u ledger "
               "batches back to pending",
               w->tw->name, rep.freed, rep.requeued, poisoned, rep.intents, returned);
    ev_worker(o, w, "reclaim",
              json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:o}", "freed", (int)rep.freed, "requeued", (int)rep.requeued,
                        "poisoned", (int)poisoned, "intents", (int)rep.intents, "handed_on", (int)rep.handed_on,
                        "ledger_returned", (int)returned, "poisoned_batches", ids));
}

/* ---- policy ----------------------------------------------------------------------- */

static void backoff_timer_cb(uv_timer_t *t)
{
    (void)apply(t->data, EV_BACKOFF_TIMER);
}

static void escalation_timer_cb(uv_timer_t *t)
{
    (void)apply(t->data, EV_ESCALATION_TIMER);
}

/* Returns 0 when a restart is allowed (and records it), -1 when the intensity limit is hit. */
static int note_restart(orch *o, orch_worker *w)
{
    uint64_t now = df_now_ns(), window = (uint64_t)o->t.sup.restart_window_s * 1000000000ull;
    uint32_t in_window = 0;
    for (uint32_t k = 0; k < w->n_restart_ns && k < ORCH_RESTART_HIST; k++)
        if (now - w->restart_ns[k] <= window)
            in_window++;
    if (in_window >= o->t.sup.max_restarts)
        return -1;
    w->restart_ns[w->n_restart_ns % ORCH_RESTART_HIST] = now;
    w->n_restart_ns++;
    o->restarts_total++;
    return 0;
}

static uint64_t next_backoff(orch *o, orch_worker *w)
{
    uint64_t up_ms = w->start_ns ? (df_now_ns() - w->start_ns) / 1000000ull : 0;
    if (up_ms >= o->t.sup.stable_ms)
        w->backoff_ms = o->t.sup.backoff_initial_ms;
    uint64_t d = w->backoff_ms;
    w->backoff_ms = DF_MIN(w->backoff_ms * 2, (uint64_t)o->t.sup.backoff_max_ms);
    if (w->backoff_ms == 0)
        w->backoff_ms = 1;
    return d;
}

/* The log tail is printed here, once; the shutdown (and the run's last line) repeat only the
 * one-line reason. */
static void give_up(orch *o, orch_worker *w, const char *what)
{
    char tail[2048], why[400];
    report_log_tail(o, w->tw->name, tail, sizeof tail, 10);
    snprintf(why, sizeof why, "worker %s %s", w->tw->name, what);
    enter(w, SV_FAILED);
    if (w->tw->role == TOPOLOGY_ROLE_VALIDATOR) { /* validation is optional: training goes on */
        df_log("giving up on the validator: %s; training goes on without validation; last lines of %s/logs/%s.log:\n%s",
               why, o->run_dir, w->tw->name, tail);
        ev_worker(o, w, "gave_up", NULL);
        return;
    }
    df_log("%s; last lines of %s/logs/%s.log:\n%s", why, o->run_dir, w->tw->name, tail);
    supervisor_begin_shutdown(o, 1, why);
}

static int has_replacement(orch *o, orch_worker *w)
{
    if (w->tw->role == TOPOLOGY_ROLE_DRAFTER)
        return 0; /* ranks are not interchangeable */
    for (int i = 0; i < o->n; i++) {
        orch_worker *x = &o->w[i];
        if (x != w && x->tw->role == w->tw->role && x->tw->in_ring == w->tw->in_ring &&
            x->tw->out_ring == w->tw->out_ring && x->sv != SV_FAILED && x->sv != SV_STOPPED)
            return 1;
    }
    return 0;
}

/* Once no member runs any more: rewind the ledger (and, in deterministic mode, reset the
 * rings and the in-flight batches: group.c) and restart every member of the group. */
static void group_maybe_restart(orch *o)
{
    if (!o->group_pending)
        return;
    for (int i = 0; i < o->n; i++)
        if (group_in(o, &o->w[i]) && running(&o->w[i]))
            return;
    o->group_pending = 0;
    uint32_t back = 0, in_flight = 0;
    uint64_t step = ledger_committed_step(&o->led);
    int rc = ledger_rewind_ex(&o->led, step, &back);
    int prc = group_restart_prepare(o, &in_flight);
    if (prc < 0) { /* a segment we formatted ourselves would not re-format: nothing sane is left */
        supervisor_begin_shutdown(o, 1, "group restart: re-formatting the shared segments failed");
        return;
    }
    df_log("%s: every member reaped; ledger rewound to step %llu (%u trained batches back to pending%s); "
           "restarting in %llu ms",
           o->t.deterministic ? "deterministic restart of the pipeline" : "drafter group", (unsigned long long)step,
           back, o->t.deterministic ? ", rings reset" : "", (unsigned long long)o->group_delay_ms);
    orch_event(o, json_pack("{s:s, s:I, s:i, s:i, s:i, s:b, s:I, s:I}", "ev", "group_restart", "step", (json_int_t)step,
                            "returned", (int)back, "in_flight_returned", (int)in_flight, "rc", rc, "pipeline",
                            o->t.deterministic, "generation", (json_int_t)o->group_gen, "delay_ms",
                            (json_int_t)o->group_delay_ms));
    for (int i = 0; i < o->n; i++) {
        orch_worker *x = &o->w[i];
        if (group_in(o, x) && x->sv == SV_GROUPWAIT)
            (void)apply(x, EV_GROUP_RESTART);
    }
}

/* A drafter rank went down (or is being restarted): take the whole group down (every
 * worker in deterministic mode). */
static void group_fail(orch *o, orch_worker *dead, uint64_t delay_ms)
{
    o->group_pending = 1;
    o->group_delay_ms = delay_ms;
    enter(dead, SV_GROUPWAIT);
    for (int i = 0; i < o->n; i++) {
        orch_worker *x = &o->w[i];
        if (x != dead && group_in(o, x))
            (void)apply(x, EV_PEER_DIED);
    }
    group_maybe_restart(o);
}

static void describe_exit(orch_worker *w)
{
    int n = snprintf(w->last_exit, sizeof w->last_exit, "%s %d%s%.40s%s", w->term_signal ? "signal" : "exit",
                     w->term_signal ? w->term_signal : w->exit_status, w->reason[0] ? " (" : "", w->reason,
                     w->reason[0] ? ")" : "");
    if (n < 0)
        w->last_exit[0] = 0;
}

/* EV_REAPED: reclaim what it held, then the restart policy picks the next state. */
static int act_reap(orch *o, orch_worker *w)
{
    uint64_t up_ms = w->start_ns ? (df_now_ns() - w->start_ns) / 1000000ull : 0;
    int ok = !w->term_signal && w->exit_status == 0;
    if (!ok && w->tw->role == TOPOLOGY_ROLE_DRAFTER)
        group_abort_allreduce(o); /* its peers return -ECANCELED now instead of timing out */
    /* a member that died by itself while its group is being taken down joins the group */
    if (!ok && (w->after == AFTER_POLICY || w->after == AFTER_KILL) && o->group_pending && group_in(o, w) &&
        w->tw->role != TOPOLOGY_ROLE_DRAFTER)
        w->after = AFTER_GROUP;
    reclaim(o, w);
    describe_exit(w);
    ev_worker(o, w, "exit",
              json_pack("{s:i, s:i, s:s, s:s, s:I}", "status", w->exit_status, "signal", w->term_signal, "reason",
                        w->reason, "how", w->last_exit, "uptime_ms", (json_int_t)up_ms));
    df_log("%s (pid %d, incarnation %u) ended: %s after %.1fs", w->tw->name, (int)w->proc.pid, w->incarnation,
           w->last_exit, (double)up_ms / 1000.0);
    w->pid = 0;

    if (o->shutting_down) {
        if (!ok && !w->term_signal && w->exit_status == DF_EXIT_PERM) {
            /* a refusal while the run stops (two workers reading the same bad model: the
             * first reaped stopped the run) is still reported as what it is, with its log */
            char tail[2048];
            report_log_tail(o, w->tw->name, tail, sizeof tail, 10);
            enter(w, SV_FAILED);
            ev_worker(o, w, "permanent_failure", NULL);
            df_log("%s failed permanently (exit 100) while the run was stopping; last lines of %s/logs/%s.log:\n%s",
                   w->tw->name, o->run_dir, w->tw->name, tail);
            if (o->exit_code == 0)
                o->exit_code = 1;
            goto done;
        }
        enter(w, ok ? SV_DONE : SV_STOPPED);
        goto done;
    }
    int deliberate = 0; /* killed by `dfctl kill`: restarted, but not counted as a failure */
    switch (w->after) {
    case AFTER_STOP:
        /* stopped by the operator even if it exited 0: it did not finish its work, so it
         * must not count as done (that would close its output ring) */
        enter(w, SV_STOPPED);
        if (w->tw->role == TOPOLOGY_ROLE_DRAFTER && !ok) /* its uncommitted training is gone */
            (void)ledger_rewind(&o->led, ledger_committed_step(&o->led));
        goto done;
    case AFTER_GROUP:
        enter(w, SV_GROUPWAIT);
        group_maybe_restart(o);
        goto done;
    case AFTER_RESTART:
        w->backoff_ms = o->t.sup.backoff_initial_ms;
        ev_worker(o, w, "restart", json_pack("{s:I, s:s}", "delay_ms", (json_int_t)0, "why", "dfctl restart"));
        if (w->tw->role == TOPOLOGY_ROLE_DRAFTER) {
            group_fail(o, w, 0);
        } else {
            enter(w, SV_BACKOFF);
            spawn_worker(o, w);
        }
        goto done;
    case AFTER_KILL:
        /* it died of our SIGKILL (not of something of its own just before it landed) */
        deliberate = w->term_signal == SIGKILL;
        break;
    case AFTER_POLICY: break;
    }
    if (ok) {
        enter(w, SV_DONE);
        goto done;
    }
    if (!w->term_signal && w->exit_status == DF_EXIT_PERM) {
        enter(w, SV_FAILED);
        ev_worker(o, w, "permanent_failure", NULL);
        if (has_replacement(o, w)) {
            df_log("%s failed permanently (exit 100): not restarted; its peers of role %s carry on", w->tw->name,
                   topology_role_name(w->tw->role));
        } else {
            give_up(o, w, "failed permanently (exit 100) and no other worker can do its work");
        }
        goto done;
    }
    if (!deliberate && note_restart(o, w) < 0) {
        char what[256];
        snprintf(what, sizeof what, "restarted more than %u times within %u s (last: %s)", o->t.sup.max_restarts,
                 o->t.sup.restart_window_s, w->last_exit);
        ev_worker(o, w, "intensity_limit", NULL);
        give_up(o, w, what);
        goto done;
    }
    /* a deliberate kill is no sign of a failing worker: the first delay, and the crash
     * backoff sequence left as it was */
    uint64_t delay = deliberate ? o->t.sup.backoff_initial_ms : next_backoff(o, w);
    ev_worker(o, w, "restart",
              json_pack("{s:I, s:i, s:s, s:b}", "delay_ms", (json_int_t)delay, "next_inc", (int)w->incarnation + 1,
                        "why", w->last_exit, "counted", !deliberate));
    if (w->tw->role == TOPOLOGY_ROLE_DRAFTER) {
        group_fail(o, w, delay);
    } else {
        enter(w, SV_BACKOFF);
        uv_timer_start(&w->timer, backoff_timer_cb, delay, 0);
    }
done:
    check_rings(o);
    maybe_finish(o);
    return 0;
}

/* Close a ring once its producers are gone for good: every producer DONE, or (while
 * shutting down) none running. Its consumers then drain it and see -EPIPE. */
static void check_rings(orch *o)
{
    for (int r = 0; r < o->t.n_rings; r++) {
        if (o->ring_closed[r])
            continue;
        int all_gone = 1;
        for (int i = 0; i < o->n; i++) {
            orch_worker *x = &o->w[i];
            if (x->tw->out_ring != r)
                continue;
            if (o->shutting_down ? running(x) : x->sv != SV_DONE)
                all_gone = 0;
        }
        if (all_gone) {
            ring_close_for_shutdown(&o->rings[r]);
            o->ring_closed[r] = 1;
            orch_event(o, json_pack("{s:s, s:s}", "ev", "ring_closed", "ring", o->t.rings[r].name));
        }
    }
}

/* ---- timers and signals ------------------------------------------------------------- */

static void hang_cb(uv_timer_t *t)
{
    orch *o = t->data;
    uint64_t now = df_now_ns();
    for (int i = 0; i < o->n; i++) {
        orch_worker *w = &o->w[i];
        if (w->sv != SV_STARTING && w->sv != SV_UP) /* not STOPPING (it is being stopped), not KILLED */
            continue;
        status_slot *sl = &o->status->slots[i];
        uint64_t hb = atomic_load_explicit(&sl->heartbeat_ns, memory_order_acquire);
        if (atomic_load_explicit(&sl->worker_incarnation, memory_order_relaxed) != w->incarnation || hb < w->start_ns)
            hb = w->start_ns; /* nothing from this incarnation yet: count from the spawn */
        if (w->sv == SV_UP && hb < w->ready_ns)
            hb = w->ready_ns; /* its ready counts as a heartbeat: a long load is not a hang once it is over */
        uint64_t age_ms = now > hb ? (now - hb) / 1000000ull : 0;
        int starting = w->sv == SV_STARTING;
        uint32_t limit = starting ? w->tw->startup_timeout_ms : w->tw->heartbeat_timeout_ms;
        if (age_ms > limit) {
            if (starting)
                df_log("%s (pid %d): not ready and no heartbeat for %llu ms (startup_timeout_ms %u): SIGKILL",
                       w->tw->name, (int)w->pid, (unsigned long long)age_ms, limit);
            else
                df_log("%s (pid %d): no heartbeat for %llu ms (timeout %u ms): SIGKILL", w->tw->name, (int)w->pid,
                       (unsigned long long)age_ms, limit);
            ev_worker(o, w, "hang",
                      json_pack("{s:I, s:i, s:s}", "heartbeat_age_ms", (json_int_t)age_ms, "timeout_ms", (int)limit,
                                "phase", starting ? "startup" : "running"));
            (void)apply(w, EV_HANG);
        }
    }
}

static void shutdown_timer_cb(uv_timer_t *t)
{
    orch *o = t->data;
    if (o->shutting_down == 1) {
        o->shutting_down = 2;
        atomic_store_explicit(&o->status->stop, 1, memory_order_release);
        df_log("shutdown: drain took longer than %u ms: SIGTERM to the rest", o->t.sup.shutdown_timeout_ms);
        for (int i = 0; i < o->n; i++)
            if (o->w[i].pid > 0)
                (void)apply(&o->w[i], EV_SHUTDOWN_TERM);
        for (int r = 0; r < o->t.n_rings; r++)
            if (!o->ring_closed[r]) {
                ring_close_for_shutdown(&o->rings[r]);
                o->ring_closed[r] = 1;
            }
        uv_timer_start(&o->shutdown_timer, shutdown_timer_cb, o->t.sup.shutdown_timeout_ms, 0);
    } else if (o->shutting_down == 2) {
        o->shutting_down = 3;
        for (int i = 0; i < o->n; i++)
            if (o->w[i].pid > 0) {
                o->forced = 1;
                (void)apply(&o->w[i], EV_SHUTDOWN_KILL);
            }
    }
}

static void on_signal(uv_signal_t *h, int signum)
{
    orch *o = h->data;
    if (o->shutting_down && o->shutting_down < 3) {
        df_log("%s again: skipping the rest of the drain", strsignal(signum));
        uv_timer_stop(&o->shutdown_timer);
        shutdown_timer_cb(&o->shutdown_timer);
        return;
    }
    char why[64];
    snprintf(why, sizeof why, "interrupted by %s", signum == SIGINT ? "SIGINT (Ctrl-C)" : "SIGTERM");
    supervisor_begin_shutdown(o, 0, why);
}

static void close_cb_noop(uv_handle_t *h)
{
    (void)h;
}

/* A write the run's record depends on failed (audit, ledger.bin): the run must not end 0. */
static void record_failed(orch *o, const char *path, int rc, char *msg, size_t cap)
{
    snprintf(msg, cap,
             "%s could not be written: %s: the run's record is incomplete; free space and run "
             "`orchestrator --resume %s` to write it",
             path, strerror(-rc), o->run_dir);
    df_log("%s", msg);
}

static int write_epoch_audit(orch *o, char *msg, size_t cap)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/ledger_audit-epoch%u.json", o->run_dir, o->epoch);
    int rc = ledger_audit_write(&o->led, path);
    if (rc < 0)
        record_failed(o, path, rc, msg, cap);
    return rc;
}

/* Every batch of this epoch is committed and another follows: audit it, swap in the next
 * epoch's ledger (setup_next_epoch) and start every worker that finished, with the new
 * segment in its hello. Workers map the ledger once, at start, so a restart is how they
 * learn of the new epoch (docs/ledger.md, "Epochs"). 0, or -1 when the run was shut down. */
static int advance_epoch(orch *o)
{
    char err[2600];
    uint32_t done = o->epoch;
    /* the audit first: if it cannot be written the run stops in this epoch, and --resume
     * (which finds it complete) writes it before switching */
    int rc = write_epoch_audit(o, err, sizeof err);
    if (rc < 0) {
        supervisor_begin_shutdown(o, 1, err);
        return -1;
    }
    rc = setup_next_epoch(o, err, sizeof err);
    if (rc < 0) {
        df_log("next epoch: %s", err);
        supervisor_begin_shutdown(o, 1, err);
        return -1;
    }
    /* epochs are counted from 1 in what people read (0-based in the JSON and file names) */
    df_log("epoch %u of %u done (every batch committed, step %llu): starting epoch %u of %u", done + 1,
           DF_MAX(o->t.drafter.epochs, 1u), (unsigned long long)o->committed_step, o->epoch + 1,
           DF_MAX(o->t.drafter.epochs, 1u));
    orch_event(o, json_pack("{s:s, s:i, s:i, s:I, s:i}", "ev", "epoch", "done", (int)done, "epoch", (int)o->epoch,
                            "step", (json_int_t)o->committed_step, "batches", (int)ledger_n_batches(&o->led)));
    return 0;
}

static void respawn_for_epoch(orch *o)
{
    o->epoch_switching = 1;
    for (int i = 0; i < o->n; i++)
        if (o->w[i].sv == SV_DONE)
            (void)apply(&o->w[i], EV_EPOCH);
    o->epoch_switching = 0;
}

static void maybe_finish(orch *o)
{
    if (o->finished)
        return;
    int active = 0, all_final = 1;
    for (int i = 0; i < o->n; i++) {
        orch_worker *w = &o->w[i];
        if (running(w) || uv_is_active((uv_handle_t *)&w->timer) || o->group_pending)
            active = 1;
        if (w->sv != SV_DONE && w->sv != SV_FAILED)
            all_final = 0;
    }
    if (active || (!o->shutting_down && !all_final))
        return;
    if (!o->shutting_down && ledger_epoch_done(&o->led) && o->epoch + 1 < DF_MAX(o->t.drafter.epochs, 1u)) {
        if (advance_epoch(o) == 0)
            respawn_for_epoch(o);
        return;
    }
    o->finished = 1;
    if (!o->shutting_down) {
        if (ledger_epoch_done(&o->led)) {
            df_log("epoch done: every worker finished");
            o->exit_code = 0;
        } else {
            ledger_counts_t c;
            ledger_counts(&o->led, &c);
            snprintf(o->shutdown_reason, sizeof o->shutdown_reason,
                     "every worker has exited but the epoch is not done (%u pending, %u claimed, %u in a ring, %u "
                     "trained but not committed)",
                     c.pending, c.claimed, c.in_ring, c.trained);
            df_log("%s", o->shutdown_reason);
            o->exit_code = 1;
        }
    } else if (o->forced && o->exit_code == 0) {
        df_log("shutdown: some workers had to be killed");
        o->exit_code = 1;
    }
    /* the run's record: a write that fails makes the run fail (exit 1, said on stderr), so
     * that nobody takes a run without its audit for a finished one */
    char msg[2600] = "";
    if (ledger_epoch_done(&o->led))
        (void)write_epoch_audit(o, msg, sizeof msg);
    char path[1200], lpath[1200];
    snprintf(path, sizeof path, "%s/ledger_audit.json", o->run_dir);
    int rc = ledger_audit_write(&o->led, path);
    if (rc < 0)
        record_failed(o, path, rc, msg, sizeof msg);
    snprintf(lpath, sizeof lpath, "%s/ledger.bin", o->run_dir);
    if ((rc = setup_persist_ledger(o)) < 0)
        record_failed(o, lpath, rc, msg, sizeof msg);
    if (msg[0]) { /* record_failed said what, and how to write it later */
        if (o->exit_code == 0)
            o->exit_code = 1;
        if (!o->shutdown_reason[0])
            snprintf(o->shutdown_reason, sizeof o->shutdown_reason, "the run's record could not be written (above)");
    }
    ledger_counts_t c;
    ledger_counts(&o->led, &c);
    uint32_t epochs = DF_MAX(o->t.drafter.epochs, 1u);
    int epoch_done = ledger_epoch_done(&o->led);
    int complete = epoch_done && o->epoch + 1 >= epochs;
    /* exactly_once is a verdict on a finished epoch: null while batches are left (an
     * interrupted run is incomplete, not wrong), false only for a real violation */
    json_t *ex = epoch_done ? json_boolean(ledger_exactly_once(&o->led) == 1) : json_null();
    const char *state = o->exit_code != 0 ? "failed" : complete ? "complete" : "incomplete";
    orch_event(o, json_pack("{s:s, s:i, s:s, s:s, s:b, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:I, s:o}", "ev", "finish",
                            "exit_code", o->exit_code, "state", state, "audit", path, "complete", complete, "reason",
                            o->shutdown_reason, "epoch", (int)o->epoch, "epochs", (int)epochs, "batches",
                            (int)ledger_n_batches(&o->led), "committed", (int)c.committed, "pending", (int)c.pending,
                            "poisoned", (int)c.poisoned, "committed_step", (json_int_t)ledger_committed_step(&o->led),
                            "exactly_once", ex));
    report_tick(o);
    char results[3000];
    report_results(o, results, sizeof results);
    if (complete && o->exit_code == 0)
        df_log("finished (exit 0): the run is complete: every batch of epoch %u of %u committed (step %llu); %s",
               o->epoch + 1, epochs, (unsigned long long)ledger_committed_step(&o->led), results);
    else if (complete) /* the work is done, but something at its end failed */
        df_log("failed (exit %d) at the end: %s; every batch of epoch %u of %u committed (step %llu); %s", o->exit_code,
               o->shutdown_reason, o->epoch + 1, epochs, (unsigned long long)ledger_committed_step(&o->led), results);
    else
        df_log("%s (exit %d) before the end%s%s: %u of %u batches of epoch %u of %u committed (step %llu); %s; "
               "continue with: orchestrator --resume %s",
               o->exit_code ? "failed" : "stopped", o->exit_code, o->shutdown_reason[0] ? ": " : "", o->shutdown_reason,
               c.committed + c.poisoned, ledger_n_batches(&o->led), o->epoch + 1, epochs,
               (unsigned long long)ledger_committed_step(&o->led), results, o->run_dir);

    /* close every handle: uv_run returns once they are gone */
    uv_close((uv_handle_t *)&o->hang_timer, close_cb_noop);
    uv_close((uv_handle_t *)&o->shutdown_timer, close_cb_noop);
    uv_close((uv_handle_t *)&o->sigint, close_cb_noop);
    uv_close((uv_handle_t *)&o->sigterm, close_cb_noop);
    for (int i = 0; i < o->n; i++)
        uv_close((uv_handle_t *)&o->w[i].timer, close_cb_noop);
    report_stop(o);
    control_stop(o);
}

/* ---- the state table -------------------------------------------------------------- */
/* Every change in a worker's life goes through apply(): the table below gives, for the
 * worker's state and the event, the next state and the action. next is a state (entered
 * before the action runs), SV_SAME (the action does not move it) or SV_POLICY (the action
 * picks: a spawn or the restart policy). A pair that is not in the table is logged and
 * ignored. docs/supervisor.md is this table in words; tests/test_supervisor_table.sh keeps
 * the two equal. */

#define SV_SAME SV_N_STATES
#define SV_POLICY (SV_N_STATES + 1)

static const char *const sv_names[SV_N_STATES] = {
    "idle", "starting", "up", "stopping", "killed", "exited", "backoff", "groupwait", "stopped", "done", "failed",
};
static const char *const ev_names[EV_N_EVENTS] = {
    "boot",     "spawned",       "spawn_failed",  "hello_failed",  "ready",
    "exit",     "reaped",        "hang",          "stop",          "start",
    "restart",  "kill",          "peer_died",     "backoff_timer", "escalation_timer",
    "shutdown", "shutdown_term", "shutdown_kill", "group_restart", "epoch",
};

static int act_none(orch *o, orch_worker *w)
{
    (void)o, (void)w;
    return 0;
}

static int act_refuse_already(orch *o, orch_worker *w) /* dfctl: "already <state>" */
{
    (void)o, (void)w;
    return -EALREADY;
}

static int act_refuse_busy(orch *o, orch_worker *w) /* dfctl restart while its handles close */
{
    (void)o, (void)w;
    return -EBUSY;
}

static int act_refuse_srch(orch *o, orch_worker *w) /* dfctl kill: "not running" */
{
    (void)o, (void)w;
    return -ESRCH;
}

static int act_spawn(orch *o, orch_worker *w)
{
    return spawn_worker(o, w);
}

static int act_start(orch *o, orch_worker *w) /* dfctl start (and restart of a worker that is down) */
{
    uv_timer_stop(&w->timer);
    w->backoff_ms = o->t.sup.backoff_initial_ms;
    ev_worker(o, w, "start", json_pack("{s:s}", "why", "dfctl start"));
    return spawn_worker(o, w);
}

static int act_respawn(orch *o, orch_worker *w) /* the backoff is over */
{
    return o->shutting_down ? 0 : spawn_worker(o, w);
}

static int act_epoch(orch *o, orch_worker *w)
{
    enter(w, SV_BACKOFF);
    return spawn_worker(o, w);
}

static int act_ready(orch *o, orch_worker *w)
{
    w->ready_ns = df_now_ns();
    ev_worker(o, w, "ready", json_pack("{s:f}", "load_s", (double)(w->ready_ns - w->start_ns) * 1e-9));
    return 0;
}

static int act_ready_late(orch *o, orch_worker *w) /* READY from a worker we already SIGKILLed */
{
    if (w->state != STATUS_STARTING)
        return 0;
    publish(w, STATUS_UP);
    return act_ready(o, w);
}

static int act_exited(orch *o, orch_worker *w)
{
    (void)o;
    w->pid = 0;
    uv_timer_stop(&w->timer);
    w->closing = 2;
    uv_close((uv_handle_t *)&w->poll, on_handle_closed);
    uv_close((uv_handle_t *)&w->proc, on_handle_closed);
    return 0;
}

static int act_stop(orch *o, orch_worker *w) /* dfctl stop of a running worker */
{
    w->after = AFTER_STOP;
    signal_worker(w, SIGTERM, "dfctl stop");
    uv_timer_start(&w->timer, escalation_timer_cb, o->t.sup.shutdown_timeout_ms, 0);
    return 0;
}

static int act_restart(orch *o, orch_worker *w) /* dfctl restart of a running worker */
{
    w->after = AFTER_RESTART;
    signal_worker(w, SIGTERM, "dfctl restart");
    uv_timer_start(&w->timer, escalation_timer_cb, o->t.sup.shutdown_timeout_ms, 0);
    return 0;
}

static int act_cancel(orch *o, orch_worker *w) /* drop a pending restart */
{
    (void)o;
    uv_timer_stop(&w->timer);
    return 0;
}

static int act_kill(orch *o, orch_worker *w)
{
    (void)o;
    /* an operator's kill of a worker that was running normally: the reap restarts it without
     * counting it against max_restarts. One already being stopped keeps its intent, and one
     * we already killed for a reason of ours (a hang) stays a failure. */
    if (w->after == AFTER_POLICY && !w->reason[0])
        w->after = AFTER_KILL;
    signal_worker(w, SIGKILL, "dfctl kill");
    return 0;
}

static int act_kill_hello(orch *o, orch_worker *w) /* it cannot work without its segments */
{
    (void)o;
    signal_worker(w, SIGKILL, "hello failed");
    return 0;
}

static int act_kill_hang(orch *o, orch_worker *w)
{
    (void)o;
    signal_worker(w, SIGKILL, "hang");
    return 0;
}

static int act_kill_group(orch *o, orch_worker *w)
{
    (void)o;
    w->after = AFTER_GROUP;
    signal_worker(w, SIGKILL, "group restart");
    return 0;
}

static int act_kill_escalation(orch *o, orch_worker *w)
{
    (void)o;
    signal_worker(w, SIGKILL, "stop timeout");
    return 0;
}

static int act_term_shutdown(orch *o, orch_worker *w)
{
    (void)o;
    signal_worker(w, SIGTERM, "shutdown");
    return 0;
}

static int act_kill_shutdown(orch *o, orch_worker *w)
{
    (void)o;
    signal_worker(w, SIGKILL, "shutdown timeout");
    return 0;
}

static int act_show_groupwait(orch *o, orch_worker *w) /* a group peer died while its handles close */
{
    (void)o;
    if (w->state == STATUS_BACKOFF || w->state == STATUS_UP || w->state == STATUS_STARTING)
        publish(w, STATUS_GROUPWAIT);
    return 0;
}

static int act_group_restart(orch *o, orch_worker *w)
{
    uv_timer_start(&w->timer, backoff_timer_cb, o->group_delay_ms, 0);
    return 0;
}

typedef struct sv_rule {
    uint8_t state, event, next;
    int (*act)(orch *o, orch_worker *w);
} sv_rule;

#define ROW(st, ev, nx, act)                 \
    {                                        \
        SV_##st, EV_##ev, SV_##nx, act_##act \
    }
/* state       event             next       action    (docs/supervisor.md, "The table") */
static const sv_rule sv_table[] = {
    ROW(IDLE, BOOT, POLICY, spawn),
    ROW(IDLE, SPAWNED, STARTING, none),
    ROW(IDLE, SPAWN_FAILED, EXITED, none),
    ROW(IDLE, STOP, SAME, refuse_already),
    ROW(IDLE, START, POLICY, start),
    ROW(IDLE, RESTART, POLICY, start),
    ROW(IDLE, KILL, SAME, refuse_srch),
    ROW(IDLE, PEER_DIED, SAME, none),
    ROW(IDLE, SHUTDOWN, STOPPED, none),

    ROW(STARTING, HELLO_FAILED, KILLED, kill_hello),
    ROW(STARTING, READY, UP, ready),
    ROW(STARTING, EXIT, EXITED, exited),
    ROW(STARTING, HANG, KILLED, kill_hang),
    ROW(STARTING, STOP, STOPPING, stop),
    ROW(STARTING, START, SAME, refuse_already),
    ROW(STARTING, RESTART, STOPPING, restart),
    ROW(STARTING, KILL, KILLED, kill),
    ROW(STARTING, PEER_DIED, KILLED, kill_group),
    ROW(STARTING, SHUTDOWN, SAME, none),
    ROW(STARTING, SHUTDOWN_TERM, SAME, term_shutdown),
    ROW(STARTING, SHUTDOWN_KILL, KILLED, kill_shutdown),

    ROW(UP, READY, SAME, none),
    ROW(UP, EXIT, EXITED, exited),
    ROW(UP, HANG, KILLED, kill_hang),
    ROW(UP, STOP, STOPPING, stop),
    ROW(UP, START, SAME, refuse_already),
    ROW(UP, RESTART, STOPPING, restart),
    ROW(UP, KILL, KILLED, kill),
    ROW(UP, PEER_DIED, KILLED, kill_group),
    ROW(UP, SHUTDOWN, SAME, none),
    ROW(UP, SHUTDOWN_TERM, SAME, term_shutdown),
    ROW(UP, SHUTDOWN_KILL, KILLED, kill_shutdown),

    ROW(STOPPING, READY, SAME, none),
    ROW(STOPPING, EXIT, EXITED, exited),
    ROW(STOPPING, STOP, STOPPING, stop),
    ROW(STOPPING, START, SAME, refuse_already),
    ROW(STOPPING, RESTART, STOPPING, restart),
    ROW(STOPPING, KILL, KILLED, kill),
    ROW(STOPPING, PEER_DIED, KILLED, kill_group),
    ROW(STOPPING, ESCALATION_TIMER, KILLED, kill_escalation),
    ROW(STOPPING, SHUTDOWN, SAME, none),
    ROW(STOPPING, SHUTDOWN_TERM, SAME, term_shutdown),
    ROW(STOPPING, SHUTDOWN_KILL, KILLED, kill_shutdown),

    ROW(KILLED, READY, SAME, ready_late),
    ROW(KILLED, EXIT, EXITED, exited),
    ROW(KILLED, STOP, STOPPING, stop),
    ROW(KILLED, START, SAME, refuse_already),
    ROW(KILLED, RESTART, STOPPING, restart),
    ROW(KILLED, KILL, KILLED, kill),
    ROW(KILLED, PEER_DIED, KILLED, kill_group),
    ROW(KILLED, ESCALATION_TIMER, KILLED, kill_escalation),
    ROW(KILLED, SHUTDOWN, SAME, none),
    ROW(KILLED, SHUTDOWN_TERM, SAME, term_shutdown),
    ROW(KILLED, SHUTDOWN_KILL, KILLED, kill_shutdown),

    ROW(EXITED, REAPED, POLICY, reap),
    ROW(EXITED, STOP, SAME, refuse_already),
    ROW(EXITED, START, SAME, refuse_already),
    ROW(EXITED, RESTART, SAME, refuse_busy),
    ROW(EXITED, KILL, SAME, refuse_srch),
    ROW(EXITED, PEER_DIED, SAME, show_groupwait),
    ROW(EXITED, SHUTDOWN, SAME, none),

    ROW(BACKOFF, SPAWNED, STARTING, none),
    ROW(BACKOFF, SPAWN_FAILED, EXITED, none),
    ROW(BACKOFF, BACKOFF_TIMER, POLICY, respawn),
    ROW(BACKOFF, STOP, STOPPED, cancel),
    ROW(BACKOFF, START, POLICY, start),
    ROW(BACKOFF, RESTART, POLICY, start),
    ROW(BACKOFF, KILL, SAME, refuse_srch),
    ROW(BACKOFF, PEER_DIED, GROUPWAIT, cancel),
    ROW(BACKOFF, SHUTDOWN, STOPPED, cancel),

    ROW(GROUPWAIT, SPAWNED, STARTING, none),
    ROW(GROUPWAIT, SPAWN_FAILED, EXITED, none),
    ROW(GROUPWAIT, GROUP_RESTART, BACKOFF, group_restart),
    ROW(GROUPWAIT, STOP, STOPPED, cancel),
    ROW(GROUPWAIT, START, POLICY, start),
    ROW(GROUPWAIT, RESTART, POLICY, start),
    ROW(GROUPWAIT, KILL, SAME, refuse_srch),
    ROW(GROUPWAIT, PEER_DIED, SAME, none),
    ROW(GROUPWAIT, SHUTDOWN, STOPPED, cancel),

    ROW(STOPPED, SPAWNED, STARTING, none),
    ROW(STOPPED, SPAWN_FAILED, EXITED, none),
    ROW(STOPPED, STOP, SAME, refuse_already),
    ROW(STOPPED, START, POLICY, start),
    ROW(STOPPED, RESTART, POLICY, start),
    ROW(STOPPED, KILL, SAME, refuse_srch),
    ROW(STOPPED, PEER_DIED, SAME, none),
    ROW(STOPPED, SHUTDOWN, SAME, none),

    ROW(DONE, SPAWNED, STARTING, none),
    ROW(DONE, SPAWN_FAILED, EXITED, none),
    ROW(DONE, EPOCH, POLICY, epoch),
    ROW(DONE, STOP, SAME, refuse_already),
    ROW(DONE, START, POLICY, start),
    ROW(DONE, RESTART, POLICY, start),
    ROW(DONE, KILL, SAME, refuse_srch),
    ROW(DONE, PEER_DIED, SAME, none),
    ROW(DONE, SHUTDOWN, SAME, none),

    ROW(FAILED, SPAWNED, STARTING, none),
    ROW(FAILED, SPAWN_FAILED, EXITED, none),
    ROW(FAILED, STOP, SAME, refuse_already),
    ROW(FAILED, START, POLICY, start),
    ROW(FAILED, RESTART, POLICY, start),
    ROW(FAILED, KILL, SAME, refuse_srch),
    ROW(FAILED, PEER_DIED, SAME, none),
    ROW(FAILED, SHUTDOWN, SAME, none),
};
#undef ROW

/* Apply one event to one worker: the table's next state, then its action (whose result is
 * returned: the dfctl commands answer with it). */
static int apply(orch_worker *w, supervisor_event ev)
{
    for (size_t i = 0; i < DF_ARRAY_LEN(sv_table); i++) {
        const sv_rule *r = &sv_table[i];
        if (r->state != w->sv || r->event != ev)
            continue;
        if (r->next < SV_N_STATES)
            enter(w, (supervisor_state)r->next);
        return r->act(w->o, w);
    }
    df_log("%s: event %s in state %s is not in the supervisor's state table: ignored", w->tw->name, ev_names[ev],
           sv_names[w->sv]);
    return -EINVAL;
}

/* ---- public ----------------------------------------------------------------------- */

int supervisor_commit(orch *o, uint64_t step)
{
    uint64_t cur = ledger_committed_step(&o->led);
    uint64_t s = step > cur ? step : cur;
    int rc = ledger_commit(&o->led, s);
    if (rc < 0) {
        df_log("ledger_commit(%llu): %s", (unsigned long long)s, strerror(-rc));
        return rc;
    }
    o->committed_step = s;
    rc = setup_persist_ledger(o);
    if (rc < 0)
        df_log("%s/ledger.bin: %s (the commit holds in memory; not acknowledged)", o->run_dir, strerror(-rc));
    ledger_counts_t c;
    ledger_counts(&o->led, &c);
    orch_event(o, json_pack("{s:s, s:I, s:i, s:i}", "ev", "checkpoint", "step", (json_int_t)s, "committed",
                            (int)c.committed, "persist_rc", rc));
    return rc < 0 ? rc : 0;
}

void supervisor_begin_shutdown(orch *o, int exit_code, const char *why)
{
    if (exit_code > o->exit_code)
        o->exit_code = exit_code;
    if (o->shutting_down || o->finished)
        return;
    o->shutting_down = 1;
    snprintf(o->shutdown_reason, sizeof o->shutdown_reason, "%s", why);
    df_log("shutdown (%s): stop claiming, draining in pipeline order", why);
    orch_event(o, json_pack("{s:s, s:s, s:i}", "ev", "shutdown", "why", why, "exit_code", exit_code));
    atomic_store_explicit(&o->status->stop_claiming, 1, memory_order_release);
    atomic_store_explicit(&o->status->pause, 0, memory_order_release);
    o->group_pending = 0;
    for (int i = 0; i < o->n; i++)
        (void)apply(&o->w[i], EV_SHUTDOWN);
    uv_timer_start(&o->shutdown_timer, shutdown_timer_cb, o->t.sup.shutdown_timeout_ms, 0);
    check_rings(o);
    maybe_finish(o);
}

int supervisor_cmd_stop(orch *o, orch_worker *w)
{
    (void)o;
    return apply(w, EV_STOP);
}

int supervisor_cmd_start(orch *o, orch_worker *w)
{
    if (o->shutting_down)
        return -ESHUTDOWN;
    return apply(w, EV_START);
}

int supervisor_cmd_restart(orch *o, orch_worker *w)
{
    if (o->shutting_down)
        return -ESHUTDOWN;
    return apply(w, EV_RESTART);
}

int supervisor_cmd_kill(orch *o, orch_worker *w)
{
    (void)o;
    return apply(w, EV_KILL);
}

int supervisor_start(orch *o)
{
    o->start_ns = df_now_ns();
    uv_timer_init(o->loop, &o->hang_timer);
    o->hang_timer.data = o;
    uv_timer_init(o->loop, &o->shutdown_timer);
    o->shutdown_timer.data = o;
    uv_signal_init(o->loop, &o->sigint);
    o->sigint.data = o;
    uv_signal_init(o->loop, &o->sigterm);
    o->sigterm.data = o;
    uv_signal_start(&o->sigint, on_signal, SIGINT);
    uv_signal_start(&o->sigterm, on_signal, SIGTERM);
    uint32_t min_to = 10000;
    for (int i = 0; i < o->n; i++) {
        uv_timer_init(o->loop, &o->w[i].timer);
        o->w[i].timer.data = &o->w[i];
        min_to = DF_MIN(min_to, DF_MIN(o->w[i].tw->heartbeat_timeout_ms, o->w[i].tw->startup_timeout_ms));
    }
    uint64_t period = DF_MAX(20u, DF_MIN(1000u, min_to / 4));
    uv_timer_start(&o->hang_timer, hang_cb, period, period);
    /* --resume after every batch of a non-last epoch was committed (the orchestrator died
     * before it started the next one): start the next epoch right away */
    while (ledger_epoch_done(&o->led) && o->epoch + 1 < DF_MAX(o->t.drafter.epochs, 1u))
        if (advance_epoch(o) < 0)
            return 0;
    for (int i = 0; i < o->n; i++)
        (void)apply(&o->w[i], EV_BOOT);
    return 0;
}
