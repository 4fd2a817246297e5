/* ctl.c: worker side of the control protocol (the protocol itself is described in ctl.h). */
#include "proc/ctl.h"

#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ipc/fdpass.h"
#include "ipc/shm.h"
#include "util.h"

static volatile sig_atomic_t g_sigterm; /* set by the handler, read by ctl_should_stop */

static void on_sigterm(int sig)
{
    (void)sig;
    g_sigterm = 1;
}

/* A missing or malformed DF_* variable means the binary was not started by the orchestrator
 * (run by hand, or by a wrapper that dropped the environment): bad usage, exit 2, with the
 * variable named. Nothing is mapped yet, so exiting here leaks nothing. */
static long env_long(const char *key, long lo, long hi)
{
    const char *v = getenv(key);
    if (!v || !*v)
        df_die(DF_EXIT_USAGE, "ctl: environment variable %s is not set (workers are started by the orchestrator)", key);
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < lo || x > hi)
        df_die(DF_EXIT_USAGE, "ctl: %s=%s: expected an integer %ld..%ld (workers are started by the orchestrator)", key,
               v, lo, hi);
    return x;
}

static void ctl_init_fields(ctl_worker *w)
{
    memset(w, 0, sizeof *w);
    w->sock = -1;
    arena_init(&w->status_seg);
    arena_init(&w->handoff_seg);
    arena_init(&w->ledger_seg);
    for (int i = 0; i < TOPOLOGY_MAX_RINGS; i++) {
        arena_init(&w->ring_seg[i]);
        arena_init(&w->ring_arena[i]);
    }
    arena_init(&w->allreduce_seg);
}

/* Map one segment of the hello. fd ownership passes to the arena (also on failure). */
static int map_segment(ctl_worker *w, json_t *seg, int fd, char *err, size_t errlen)
{
    const char *kind = json_string_value(json_object_get(seg, "kind"));
    uint64_t size = (uint64_t)json_integer_value(json_object_get(seg, "size"));
    int ri = (int)json_integer_value(json_object_get(seg, "ring"));
    int rc;
    if (!kind) {
        close(fd);
        return -EPROTO;
    }
    if (!strcmp(kind, "status")) {
        if ((rc = shm_import(&w->status_seg, fd)) < 0)
            return rc;
        return status_open(&w->status, w->status_seg.base, w->status_seg.size);
    }
    if (!strcmp(kind, "handoff")) {
        if ((rc = shm_import(&w->handoff_seg, fd)) < 0)
            return rc;
        w->have_handoff = 1;
        return handoff_open(&w->handoff, w->handoff_seg.base, w->handoff_seg.size);
    }
    if (!strcmp(kind, "ledger")) {
        if ((rc = shm_import(&w->ledger_seg, fd)) < 0)
            return rc;
        return ledger_open(&w->ledger, w->ledger_seg.base, w->ledger_seg.size);
    }
    if (!strcmp(kind, "allreduce")) /* mapped as is: the rank opens it (allreduce_open_shm) */
        return shm_import(&w->allreduce_seg, fd);
    if (ri < 0 || ri >= TOPOLOGY_MAX_RINGS) {
        close(fd);
        return -EPROTO;
    }
    if (!strcmp(kind, "ring")) {
        if ((rc = shm_import(&w->ring_seg[ri], fd)) < 0)
            return rc;
        if (ri + 1 > w->n_rings)
            w->n_rings = ri + 1;
        return ring_open(&w->rings[ri], w->ring_seg[ri].base, w->ring_seg[ri].size);
    }
    if (!strcmp(kind, "arena")) {
        /* The one place a worker picks the memory kind: the seam between CPU and CUDA. */
        const char *backend = json_string_value(json_object_get(seg, "backend"));
        int device = (int)json_integer_value(json_object_get(seg, "device"));
        arena_kind k = (backend && !strcmp(backend, "cuda")) ? ARENA_CUDA : ARENA_CPU;
        return arena_import(&w->ring_arena[ri], k, k == ARENA_CUDA ? device : -1, fd, size, err, errlen);
    }
    close(fd);
    return -EPROTO;
}

static int receive_hello(ctl_worker *w)
{
    char *buf = malloc(CTL_HELLO_MAX + 1);
    int fds[FDPASS_MAX_FDS], nfds = 0, rc = 0;
    json_t *root = NULL;
    if (!buf)
        return -ENOMEM;
    int n = fdpass_recv(w->sock, buf, CTL_HELLO_MAX, fds, FDPASS_MAX_FDS, &nfds);
    if (n <= 0) {
        df_log("ctl: no hello on fd %d: %s", w->sock, n == 0 ? "orchestrator closed the socket" : strerror(-n));
        free(buf);
        return n == 0 ? -EPIPE : n;
    }
    buf[n] = 0;
    json_error_t jerr;
    root = json_loads(buf, 0, &jerr);
    if (!json_is_object(root)) {
        df_log("ctl: hello is not a JSON object: %s", jerr.text);
        rc = -EPROTO;
        goto out;
    }
    if (json_integer_value(json_object_get(root, "worker_id")) != w->id ||
        (uint32_t)json_integer_value(json_object_get(root, "incarnation")) != w->incarnation) {
        df_log("ctl: hello is for another worker/incarnation than DF_WORKER_ID/DF_INCARNATION");
        rc = -EPROTO;
        goto out;
    }
    snprintf(w->topology_path, sizeof w->topology_path, "%s",
             json_string_value(json_object_get(root, "topology")) ?: "");
    w->committed_step = (uint64_t)json_integer_value(json_object_get(root, "committed_step"));
    w->epoch = (uint32_t)json_integer_value(json_object_get(root, "epoch"));
    w->epochs = (uint32_t)json_integer_value(json_object_get(root, "epochs"));
    w->total_steps = (uint64_t)json_integer_value(json_object_get(root, "total_steps"));
    json_t *grp = json_object_get(root, "group");
    if (grp) {
        w->group_world = (int)json_integer_value(json_object_get(grp, "world"));
        w->group_gen = (uint64_t)json_integer_value(json_object_get(grp, "generation"));
        const char *hex = json_string_value(json_object_get(grp, "nccl_id"));
        if (hex) { /* 256 hex digits -> the 128-byte NCCL unique id */
            if (strlen(hex) != 2 * sizeof w->nccl_id) {
                df_log("ctl: hello group.nccl_id has %zu hex digits, expected %zu", strlen(hex), 2 * sizeof w->nccl_id);
                rc = -EPROTO;
                goto out;
            }
            for (size_t k = 0; k < sizeof w->nccl_id; k++) {
                unsigned v;
                if (sscanf(hex + 2 * k, "%2x", &v) != 1) {
                    df_log("ctl: hello group.nccl_id: not hex at digit %zu", 2 * k);
                    rc = -EPROTO;
                    goto out;
                }
                w->nccl_id[k] = (unsigned char)v;
            }
            w->has_nccl_id = 1;
        }
    }
    json_t *segs = json_object_get(root, "segments"), *seg;
    size_t i;
    json_array_foreach(segs, i, seg)
    {
        json_int_t fi = json_integer_value(json_object_get(seg, "fd"));
        if (fi < 0 || fi >= nfds || fds[fi] < 0) {
            df_log("ctl: hello segment %zu names fd %lld, but %d fds came", i, (long long)fi, nfds);
            rc = -EPROTO;
            goto out;
        }
        int fd = fds[fi];
        fds[fi] = -1; /* ownership moves to map_segment */
        char e2[512] = "";
        rc = map_segment(w, seg, fd, e2, sizeof e2);
        if (rc < 0) {
            df_log("ctl: mapping segment %s failed: %s", json_string_value(json_object_get(seg, "name")) ?: "?",
                   e2[0] ? e2 : strerror(-rc));
            goto out;
        }
    }
    if (!w->status || !w->ledger.shm) {
        df_log("ctl: hello lacks the status or ledger segment");
        rc = -EPROTO;
    }
out:
    for (int k = 0; k < nfds; k++)
        if (fds[k] >= 0)
            close(fds[k]);
    json_decref(root);
    free(buf);
    return rc;
}

int ctl_worker_start(ctl_worker *w, int argc, char **argv)
{
    long orch_pid;
    int rc;
    ctl_init_fields(w);
    if (argc > 0 && argv && argv[0]) {
        const char *slash = strrchr(argv[0], '/');
        const char *nm = getenv("DF_WORKER");
        char prog[64];
        snprintf(prog, sizeof prog, "%s", nm ? nm : (slash ? slash + 1 : argv[0]));
        df_log_init(prog);
    }
    /* Die with the orchestrator; then close the race where it died before prctl. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
        return -errno;
    orch_pid = env_long("DF_ORCH_PID", 1, INT_MAX);
    if (getppid() != (pid_t)orch_pid) {
        df_log("ctl: the orchestrator (pid %ld) is gone; exiting", orch_pid);
        return -ESRCH;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigterm;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) < 0)
        return -errno;

    w->sock = (int)env_long("DF_CTL_FD", 0, INT_MAX);
    w->id = (int)env_long("DF_WORKER_ID", 0, STATUS_MAX_WORKERS - 1);
    w->incarnation = (uint32_t)env_long("DF_INCARNATION", 1, INT_MAX);
    snprintf(w->name, sizeof w->name, "%s", getenv("DF_WORKER") ?: "");
    snprintf(w->run_dir, sizeof w->run_dir, "%s", getenv("DF_RUN_DIR") ?: "");

    if ((rc = receive_hello(w)) < 0)
        goto fail;
    char err[512];
    if ((rc = topology_load(&w->topo, w->topology_path, err, sizeof err)) < 0) {
        df_log("ctl: %s", err);
        goto fail;
    }
    if (w->id >= w->topo.n_workers || strcmp(w->topo.workers[w->id].name, w->name) != 0) {
        df_log("ctl: worker id %d is not \"%s\" in %s", w->id, w->name, w->topology_path);
        rc = -EPROTO;
        goto fail;
    }
    w->self = &w->topo.workers[w->id];
    w->slot = &w->status->slots[w->id];
    w->ckpt_gen_seen = atomic_load_explicit(&w->status->checkpoint_gen, memory_order_acquire);
    atomic_store_explicit(&w->slot->worker_incarnation, w->incarnation, memory_order_relaxed);
    atomic_store_explicit(&w->slot->worker_pid, (int32_t)getpid(), memory_order_relaxed);
    status_heartbeat(w->slot, 0, 0, 0);
    return 0;
fail:
    ctl_worker_close(w);
    return rc;
}

int ctl_ready(ctl_worker *w)
{
    return ctl_send(w, "{\"ev\":\"ready\"}");
}

void ctl_heartbeat(ctl_worker *w, uint64_t step, uint64_t items, uint64_t tokens)
{
    status_heartbeat(w->slot, step, items, tokens);
}

int ctl_should_stop(const ctl_worker *w)
{
    return g_sigterm || atomic_load_explicit(&w->status->stop, memory_order_acquire);
}

int ctl_paused(const ctl_worker *w)
{
    return atomic_load_explicit(&w->status->pause, memory_order_acquire) != 0;
}

int ctl_stop_claiming(const ctl_worker *w)
{
    return atomic_load_explicit(&w->status->stop_claiming, memory_order_acquire) != 0;
}

int ctl_checkpoint_requested(ctl_worker *w)
{
    uint64_t g = atomic_load_explicit(&w->status->checkpoint_gen, memory_order_acquire);
    if (g == w->ckpt_gen_seen)
        return 0;
    w->ckpt_gen_seen = g;
    return 1;
}

static ring *ring_at(ctl_worker *w, int i)
{
    return i >= 0 && i < w->n_rings && w->rings[i].shm ? &w->rings[i] : NULL;
}

ring *ctl_ring_in(ctl_worker *w)
{
    return ring_at(w, w->self->in_ring);
}

ring *ctl_ring_out(ctl_worker *w)
{
    return ring_at(w, w->self->out_ring);
}

arena *ctl_ring_arena(ctl_worker *w, const ring *r)
{
    ptrdiff_t i = r - w->rings;
    return i >= 0 && i < w->n_rings && w->ring_arena[i].base ? &w->ring_arena[i] : NULL;
}

uint64_t ctl_ring_slot_bytes(ctl_worker *w, const ring *r)
{
    ptrdiff_t i = r - w->rings;
    return i >= 0 && i < w->n_rings ? w->topo.rings[i].slot_bytes : 0;
}

ledger *ctl_ledger(ctl_worker *w)
{
    return &w->ledger;
}

uint32_t ctl_claim_window(const ctl_worker *w)
{
    if (!w->topo.deterministic || w->topo.n_rings == 0)
        return 0;
    uint32_t m = w->topo.rings[0].slots;
    for (int i = 1; i < w->topo.n_rings; i++)
        m = DF_MIN(m, w->topo.rings[i].slots);
    return m;
}

void *ctl_allreduce_segment(ctl_worker *w, uint64_t *bytes)
{
    if (bytes)
        *bytes = w->allreduce_seg.base ? w->allreduce_seg.size : 0;
    return w->allreduce_seg.base;
}

handoff_table *ctl_handoff(ctl_worker *w)
{
    return w->have_handoff ? &w->handoff : NULL;
}

int ctl_send(ctl_worker *w, const char *json)
{
    if (w->sock < 0)
        return -EBADF;
    return fdpass_send(w->sock, json, strlen(json), NULL, 0);
}

/* Drain what the orchestrator sent since the hello (never blocks). Today only
 * {"ev":"committed","step":S}: checkpoint S is committed in the ledger AND ledger.bin holds
 * it, so a --resume after any crash starts from S or later. Anything else is ignored. */
uint64_t ctl_committed_ack(ctl_worker *w)
{
    char buf[512];
    for (;;) {
        if (w->sock < 0)
            break;
        ssize_t n = recv(w->sock, buf, sizeof buf - 1, MSG_DONTWAIT);
        if (n <= 0) /* EAGAIN: nothing more; 0 or an error: the orchestrator is gone (pdeathsig) */
            break;
        buf[n] = 0;
        json_t *m = json_loads(buf, 0, NULL);
        const char *ev = json_string_value(json_object_get(m, "ev"));
        json_int_t step = json_integer_value(json_object_get(m, "step"));
        if (ev && !strcmp(ev, "committed") && step > 0 && (uint64_t)step > w->acked_step)
            w->acked_step = (uint64_t)step;
        json_decref(m);
    }
    return w->acked_step;
}

int ctl_send_checkpoint(ctl_worker *w, uint64_t step)
{
    char msg[96];
    snprintf(msg, sizeof msg, "{\"ev\":\"checkpoint\",\"step\":%llu}", (unsigned long long)step);
    return ctl_send(w, msg);
}

void ctl_worker_close(ctl_worker *w)
{
    if (w->sock >= 0) {
        /* Closing with unread acks in the queue would make the orchestrator's next read
         * fail with ECONNRESET ahead of our last messages (it reads on, but be polite):
         * discard what is queued first. */
        char junk[512];
        while (recv(w->sock, junk, sizeof junk, MSG_DONTWAIT) > 0)
            ;
        close(w->sock);
    }
    w->sock = -1;
    arena_close(&w->status_seg);
    arena_close(&w->handoff_seg);
    arena_close(&w->ledger_seg);
    for (int i = 0; i < TOPOLOGY_MAX_RINGS; i++) {
        arena_close(&w->ring_seg[i]);
        arena_close(&w->ring_arena[i]);
        w->rings[i].shm = NULL;
    }
    arena_close(&w->allreduce_seg);
    w->status = NULL;
    w->slot = NULL;
    w->ledger.shm = NULL;
    w->have_handoff = 0;
    topology_free(&w->topo);
    w->self = NULL;
}
