/* setup.c: everything the orchestrator prepares before the first spawn, and undoes at exit.
 *
 *   run dir      created 0700 (refused if it exists, unless --resume), with logs/ and
 *                metrics/; topology.json = the normalised topology (topo_to_json)
 *   segments     memfds: status (status.h), handoff table (handoff.h), one per ring
 *                (ring_format), the ledger (ledger_format over the plan)
 *   arenas       one payload arena per ring, nslots * slot_bytes; slot s at s * slot_bytes
 * The orchestrator keeps every fd until it exits (the fd store): a worker's death loses
 * no memory, and each (re)start gets the same segments in its hello.
 *
 * GPU arenas (a ring with gpu >= 0): the orchestrator never initialises CUDA. The seam is
 * setup_ring_arena(): a GPU ring's arena fd comes from a CUDA-capable process: the tiny
 * cuda_helper binary (helper.c) calls arena_create(ARENA_CUDA) and sends the fd back with
 * fdpass, then exits; the VMM allocation lives on through our fd. The rest of the orchestrator
 * treats arenas as opaque (fd, size, backend, device).
 *
 * Resume: the ledger is persisted to <run_dir>/ledger.bin (the whole segment, written
 * atomically) after every checkpoint commit. On --resume a fresh ledger is built from the
 * same plan, and the snapshot's COMMITTED batches (with their steps) and POISONED batches
 * are replayed into it through the public transitions; everything else is PENDING again
 * (it was in flight or trained after the last checkpoint, which the drafter also resumes
 * from). The snapshot must match the plan (batch count, seed, epoch) or resume refuses.
 */
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ipc/fdpass.h"
#include "ipc/shm.h"
#include "orch.h"
#include "util.h"

/* realpath into a buffer of cap bytes (realpath itself needs PATH_MAX). 0 or -errno. */
static int resolve_path(const char *in, char *out, size_t cap)
{
    char full[PATH_MAX];
    if (!realpath(in, full))
        return -errno;
    if (strlen(full) >= cap)
        return -ENAMETOOLONG;
    memcpy(out, full, strlen(full) + 1);
    return 0;
}

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Make *p absolute against the current directory (malloc'd, the old string freed). The
 * topology's relative paths mean "relative to where the orchestrator was started"; the
 * run dir's topology.json stores them absolute so that `--resume` from another directory
 * (and every worker) finds the same files. NULL stays NULL. 0 or -errno. */
static int absolutise(char **p)
{
    if (!*p || (*p)[0] == '/')
        return 0;
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd))
        return -errno;
    char *abs = NULL;
    if (asprintf(&abs, "%s/%s", cwd, *p) < 0)
        return -ENOMEM;
    free(*p);
    *p = abs;
    return 0;
}

static int absolutise_paths(topo *t)
{
    int rc = 0;
    if (!rc) rc = absolutise(&t->run_dir);
    if (!rc) rc = absolutise(&t->target_model_dir);
    if (!rc) rc = absolutise(&t->drafter.init_dir);
    if (!rc) rc = absolutise(&t->bin_dir);
    for (int i = 0; !rc && i < t->n_shards; i++)
        rc = absolutise(&t->shards[i]);
    return rc;
}

/* --resume trusts the run dir's topology.json, which names the binaries to run: refuse a
 * run dir that is not ours or that others may write (they could have planted it). */
static int check_run_dir_owner(const char *dir, char *err, size_t errlen)
{
    struct stat st;
    if (lstat(dir, &st) < 0) {
        int e = errno;
        snprintf(err, errlen, "--resume: run dir %s: %s", dir, strerror(e));
        return -e;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "--resume: run dir %s is not a directory", dir);
        return -ENOTDIR;
    }
    if (st.st_uid != geteuid() || (st.st_mode & 022)) {
        snprintf(err, errlen, "--resume: run dir %s is owned by uid %u with mode %03o: it must be ours (uid %u) "
                 "and not writable by group or others (chmod 700)", dir, (unsigned)st.st_uid,
                 (unsigned)(st.st_mode & 0777), (unsigned)geteuid());
        return -EPERM;
    }
    return 0;
}

/* The binary a worker runs: <bin_dir>/<role>_worker, role "test" -> fake_worker. */
static void worker_binary(const orch *o, const topo_worker *tw, char *out, size_t cap)
{
    const char *dir = o->t.bin_dir ? o->t.bin_dir : o->self_dir;
    int n = tw->role == TOPO_ROLE_TEST ? snprintf(out, cap, "%s/fake_worker", dir)
                                       : snprintf(out, cap, "%s/%s_worker", dir, topo_role_name(tw->role));
    if (n < 0 || (size_t)n >= cap)
        out[0] = 0; /* too long: access() then fails with a message naming the worker */
}

/* A GPU ring's arena: cuda_helper creates the VMM allocation on the ring's GPU and sends
 * back its fd (the orchestrator itself never loads CUDA). */
static int cuda_arena_from_helper(orch *o, int i, uint64_t bytes, char *err, size_t errlen)
{
    const topo_ring *r = &o->t.rings[i];
    char devarg[16], bytesarg[32], name[80], answer[600], e2[700];
    snprintf(devarg, sizeof devarg, "%d", r->gpu);
    snprintf(bytesarg, sizeof bytesarg, "%llu", (unsigned long long)bytes);
    snprintf(name, sizeof name, "df-arena-%s", r->name);
    const char *args[] = {"--arena", "--device", devarg, "--bytes", bytesarg, "--name", name, NULL};
    int fd = -1;
    int rc = helper_call(o, args, answer, sizeof answer, &fd, e2, sizeof e2);
    if (rc == 0 && fd < 0)
        snprintf(e2, sizeof e2, "cuda_helper --arena answered without an fd"), rc = -EIO;
    if (rc < 0) {
        snprintf(err, errlen, "rings[%d] \"%s\": GPU arena of %llu bytes on device %d: %s", i, r->name,
                 (unsigned long long)bytes, r->gpu, e2);
        return rc;
    }
    arena *a = &o->ring_arena[i];
    arena_init(a);
    a->kind = ARENA_CUDA;
    a->fd = fd;
    a->device = r->gpu;
    a->size = bytes; /* importers round up exactly as the creator did */
    df_log("rings[%d] \"%s\": GPU arena of %llu bytes on device %d (%s mapped)", i, r->name,
           (unsigned long long)bytes, r->gpu, answer);
    return 0;
}

static int setup_ring_arena(orch *o, int i, char *err, size_t errlen)
{
    const topo_ring *r = &o->t.rings[i];
    uint64_t bytes = (uint64_t)r->slots * r->slot_bytes;
    char name[64];
    snprintf(name, sizeof name, "df-arena-%s", r->name);
    if (r->gpu >= 0)
        return cuda_arena_from_helper(o, i, bytes, err, errlen);
    int rc = arena_create(&o->ring_arena[i], ARENA_CPU, -1, bytes, name);
    if (rc < 0) /* name the two fields that size it: they are what the operator can change */
        snprintf(err, errlen, "rings[%d] \"%s\": arena of %llu bytes (rings[%d].slots %u x rings[%d].slot_bytes %llu): "
                 "%s: lower rings[%d].slots or rings[%d].slot_bytes, or free memory",
                 i, r->name, (unsigned long long)bytes, i, r->slots, i, (unsigned long long)r->slot_bytes,
                 arena_strerror(rc), i, i);
    return rc;
}

/* Replay a ledger.bin snapshot's committed/poisoned batches into the fresh ledger o->led. */
static int resume_ledger(orch *o, char *err, size_t errlen)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/ledger.bin", o->run_dir);
    char *buf = NULL;
    size_t len = 0;
    int rc = df_read_file(path, &buf, &len);
    if (rc == -ENOENT) {
        df_log("resume: no %s (no checkpoint was committed): every batch starts pending", path);
        return 0;
    }
    if (rc < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(-rc));
        return rc;
    }
    /* ledger_open wants aligned memory: copy into an aligned buffer */
    void *mem = aligned_alloc(64, (len + 63) & ~(size_t)63);
    if (!mem) {
        free(buf);
        return -ENOMEM;
    }
    memset(mem, 0, (len + 63) & ~(size_t)63);
    memcpy(mem, buf, len);
    free(buf);
    ledger snap;
    rc = ledger_open(&snap, mem, len);
    if (rc < 0) {
        snprintf(err, errlen, "%s: not a ledger snapshot (%s)", path, strerror(-rc));
        goto out;
    }
    if (ledger_n_batches(&snap) != ledger_n_batches(&o->led) || ledger_seed(&snap) != ledger_seed(&o->led) ||
        ledger_epoch(&snap) != ledger_epoch(&o->led)) {
        snprintf(err, errlen, "%s: snapshot has %u batches (seed %llu, epoch %u), the plan has %u: "
                 "the data or the seed changed since the run started",
                 path, ledger_n_batches(&snap), (unsigned long long)ledger_seed(&snap), ledger_epoch(&snap),
                 ledger_n_batches(&o->led));
        rc = -EINVAL;
        goto out;
    }
    uint64_t committed = ledger_committed_step(&snap);
    uint32_t n_comm = 0, n_pois = 0;
    for (uint32_t b = 0; b < ledger_n_batches(&snap); b++) {
        ledger_batch_status st;
        if ((rc = ledger_batch_status_get(&snap, b, &st)) < 0)
            goto out;
        if (st.state == LEDGER_COMMITTED) {
            if ((rc = ledger_claim_batch(&o->led, b, 0, 0)) < 0 ||
                (rc = ledger_mark_trained(&o->led, b, st.step ? st.step : 1)) < 0)
                goto replay_fail;
            n_comm++;
        } else if (st.state == LEDGER_POISONED) {
            if ((rc = ledger_mark_poisoned(&o->led, b)) < 0)
                goto replay_fail;
            n_pois++;
        }
    }
    if (committed > 0 && (rc = ledger_commit(&o->led, committed)) < 0)
        goto replay_fail;
    o->committed_step = committed;
    df_log("resume: ledger.bin: step %llu, %u batches committed, %u poisoned, the rest pending",
           (unsigned long long)committed, n_comm, n_pois);
    rc = 0;
    goto out;
replay_fail:
    snprintf(err, errlen, "%s: replaying the snapshot failed: %s", path, strerror(-rc));
out:
    free(mem);
    return rc;
}

/* Build epoch `epoch`'s plan into a fresh ledger segment (o->ledger_seg / o->led; the old
 * one, if any, is closed: the workers get the new fd in their next hello). *n_batches: the
 * plan's batch count. */
static int build_epoch_ledger(orch *o, uint32_t epoch, uint32_t *n_batches, int quiet, char *err, size_t errlen)
{
    uint32_t *lens = NULL, n = 0;
    ledger_plan plan;
    memset(&plan, 0, sizeof plan);
    int rc = plan_source_lengths(&o->t, &lens, &n, err, errlen);
    if (rc < 0)
        return rc;
    uint32_t msl = o->t.max_seq_len;
    if (msl > o->t.token_budget)
        msl = (uint32_t)o->t.token_budget;
    rc = ledger_plan_build(&plan, lens, n, o->t.seed, epoch, o->t.token_budget, msl);
    free(lens);
    if (rc < 0) {
        snprintf(err, errlen, "ledger plan of epoch %u over %u samples: %s", epoch, n, strerror(-rc));
        return rc;
    }
    *n_batches = plan.n_batches;
    if (quiet) { /* only counting (the LR schedule's total) */
        ledger_plan_free(&plan);
        return 0;
    }
    uint64_t bytes = ledger_shm_bytes(&plan);
    arena_close(&o->ledger_seg);
    arena_init(&o->ledger_seg);
    if ((rc = shm_create(&o->ledger_seg, bytes, "df-ledger")) < 0 ||
        (rc = ledger_format(o->ledger_seg.base, o->ledger_seg.size, &plan)) < 0 ||
        (rc = ledger_open(&o->led, o->ledger_seg.base, o->ledger_seg.size)) < 0) {
        snprintf(err, errlen, "ledger segment of epoch %u (%llu bytes): %s", epoch, (unsigned long long)bytes,
                 strerror(-rc));
        ledger_plan_free(&plan);
        return rc;
    }
    df_log("plan: epoch %u of %u: %u samples -> %u batches (token budget %llu, seed %llu)", epoch,
           DF_MAX(o->t.drafter.epochs, 1u), plan.n_samples, plan.n_batches, (unsigned long long)o->t.token_budget,
           (unsigned long long)o->t.seed);
    ledger_plan_free(&plan);
    return 0;
}

/* The epoch a ledger.bin snapshot is in (0 when there is none or it is unreadable: then
 * resume_ledger reports the problem against the epoch-0 plan). */
static uint32_t snapshot_epoch(orch *o)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/ledger.bin", o->run_dir);
    char *buf = NULL;
    size_t len = 0;
    uint32_t e = 0;
    if (df_read_file(path, &buf, &len) < 0)
        return 0;
    size_t cap = (len + 63) & ~(size_t)63;
    void *mem = aligned_alloc(64, cap ? cap : 64);
    if (mem) {
        memset(mem, 0, cap);
        memcpy(mem, buf, len);
        ledger snap;
        if (ledger_open(&snap, mem, len) == 0)
            e = ledger_epoch(&snap);
    }
    free(mem);
    free(buf);
    return e;
}

/* Multi-epoch runs (drafter.epochs > 1): the drafter keeps one LR schedule over all epochs,
 * so it needs the total optimizer steps: the sum over epochs of ceil(batches / ranks). Each
 * epoch's plan packs differently (another shuffle), so every plan is built once to count. */
static int count_total_steps(orch *o, char *err, size_t errlen)
{
    uint32_t E = DF_MAX(o->t.drafter.epochs, 1u), R = (uint32_t)DF_MAX(topo_n_drafters(&o->t), 1);
    o->total_steps = 0;
    for (uint32_t e = 0; e < E; e++) {
        uint32_t nb = 0;
        int rc = build_epoch_ledger(o, e, &nb, 1, err, errlen);
        if (rc < 0)
            return rc;
        o->total_steps += (nb + R - 1) / R;
    }
    return 0;
}

static int setup_ledger(orch *o, char *err, size_t errlen)
{
    uint32_t nb;
    int rc = count_total_steps(o, err, errlen);
    if (rc < 0)
        return rc;
    o->epoch = o->resume ? snapshot_epoch(o) : 0;
    if ((rc = build_epoch_ledger(o, o->epoch, &nb, 0, err, errlen)) < 0)
        return rc;
    return o->resume ? resume_ledger(o, err, errlen) : 0;
}

int setup_next_epoch(orch *o, char *err, size_t errlen)
{
    uint32_t nb;
    uint64_t step = ledger_committed_step(&o->led);
    int rc = build_epoch_ledger(o, o->epoch + 1, &nb, 0, err, errlen);
    if (rc < 0)
        return rc;
    o->epoch++;
    /* the new ledger continues the step count: a rewind or a resume never goes below the
     * last checkpoint of the previous epoch, which is where the drafter continues from */
    if (step > 0 && (rc = ledger_commit(&o->led, step)) < 0) {
        snprintf(err, errlen, "epoch %u: ledger_commit(%llu): %s", o->epoch, (unsigned long long)step, strerror(-rc));
        return rc;
    }
    o->committed_step = step;
    for (int i = 0; i < o->t.n_rings; i++) { /* every worker exited 0: the rings are empty; re-open them */
        const topo_ring *r = &o->t.rings[i];
        if ((rc = ring_format(o->ring_seg[i].base, o->ring_seg[i].size, r->slots, r->max_attempts, (uint32_t)i)) < 0 ||
            (rc = ring_open(&o->rings[i], o->ring_seg[i].base, o->ring_seg[i].size)) < 0) {
            snprintf(err, errlen, "rings[%d] \"%s\": re-format for epoch %u: %s", i, r->name, o->epoch,
                     ring_strerror(rc));
            return rc;
        }
        o->ring_closed[i] = 0;
    }
    if ((rc = setup_persist_ledger(o)) < 0) {
        snprintf(err, errlen, "%s/ledger.bin: %s", o->run_dir, strerror(-rc));
        return rc;
    }
    return 0;
}

static int setup_segments(orch *o, char *err, size_t errlen)
{
    int rc;
    if ((rc = shm_create(&o->status_seg, status_shm_bytes(), "df-status")) < 0 ||
        (rc = status_format(o->status_seg.base, o->status_seg.size, (uint32_t)o->t.n_workers)) < 0 ||
        (rc = status_open(&o->status, o->status_seg.base, o->status_seg.size)) < 0) {
        snprintf(err, errlen, "status segment: %s", strerror(-rc));
        return rc;
    }
    if ((rc = shm_create(&o->handoff_seg, handoff_shm_bytes(), "df-handoff")) < 0 ||
        (rc = handoff_format(o->handoff_seg.base, o->handoff_seg.size)) < 0 ||
        (rc = handoff_open(&o->handoff, o->handoff_seg.base, o->handoff_seg.size)) < 0) {
        snprintf(err, errlen, "handoff table: %s", strerror(-rc));
        return rc;
    }
    for (int i = 0; i < o->t.n_rings; i++) {
        const topo_ring *r = &o->t.rings[i];
        uint64_t bytes = ring_shm_bytes(r->slots);
        char name[64];
        snprintf(name, sizeof name, "df-ring-%s", r->name);
        if ((rc = shm_create(&o->ring_seg[i], bytes, name)) < 0 ||
            (rc = ring_format(o->ring_seg[i].base, o->ring_seg[i].size, r->slots, r->max_attempts, (uint32_t)i)) < 0 ||
            (rc = ring_open(&o->rings[i], o->ring_seg[i].base, o->ring_seg[i].size)) < 0) {
            snprintf(err, errlen, "rings[%d] \"%s\": %s", i, r->name, ring_strerror(rc));
            return rc;
        }
        if ((rc = setup_ring_arena(o, i, err, errlen)) < 0)
            return rc;
    }
    if ((rc = group_setup(o, err, errlen)) < 0)
        return rc;
    return setup_ledger(o, err, errlen);
}

static int make_run_dir(orch *o, const char *want, char *err, size_t errlen)
{
    int rc;
    char parent[1024];
    snprintf(parent, sizeof parent, "%s", want);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = 0;
        if ((rc = df_mkdir_p(parent, 0700)) < 0) {
            snprintf(err, errlen, "%s: cannot create: %s", parent, strerror(-rc));
            return rc;
        }
    }
    if (mkdir(want, 0700) < 0) {
        rc = -errno;
        if (rc == -EEXIST)
            snprintf(err, errlen, "run dir %s exists: continue it with `orchestrator --resume %s`, or "
                     "choose another run_dir", want, want);
        else
            snprintf(err, errlen, "run dir %s: %s", want, strerror(-rc));
        return rc;
    }
    int prc = resolve_path(want, o->run_dir, sizeof o->run_dir);
    if (prc < 0) {
        snprintf(err, errlen, "run dir %s: %s", want, strerror(-prc));
        return prc;
    }
    return 0;
}

int setup_run(orch *o, const char *path, int resume, char *err, size_t errlen)
{
    int rc;
    o->resume = resume;
    arena_init(&o->status_seg);
    arena_init(&o->handoff_seg);
    arena_init(&o->ledger_seg);
    arena_init(&o->ar_seg);
    for (int i = 0; i < TOPO_MAX_RINGS; i++) {
        arena_init(&o->ring_seg[i]);
        arena_init(&o->ring_arena[i]);
    }
    o->events_fd = -1;

    if (!resume && is_dir(path)) {
        snprintf(err, errlen, "%s is a directory: to continue that run use `orchestrator --resume %s`", path, path);
        return -EINVAL;
    }
    if (resume) {
        /* --resume <run dir> or --resume <topology.json>: the run dir's topology.json wins */
        char dir[1024];
        if (is_dir(path)) {
            snprintf(dir, sizeof dir, "%s", path);
        } else {
            topo tmp;
            if ((rc = topo_load(&tmp, path, err, errlen)) < 0)
                return rc;
            snprintf(dir, sizeof dir, "%s", tmp.run_dir);
            topo_free(&tmp);
        }
        int prc = resolve_path(dir, o->run_dir, sizeof o->run_dir);
        if (prc < 0) {
            snprintf(err, errlen, "--resume: run dir %s: %s", dir, strerror(-prc));
            return prc;
        }
        if ((rc = check_run_dir_owner(o->run_dir, err, errlen)) < 0)
            return rc;
        snprintf(o->topo_path, sizeof o->topo_path, "%s/topology.json", o->run_dir);
        if ((rc = topo_load(&o->t, o->topo_path, err, errlen)) < 0)
            return rc;
    } else {
        if ((rc = topo_load(&o->t, path, err, errlen)) < 0)
            return rc;
        if ((rc = absolutise_paths(&o->t)) < 0) {
            snprintf(err, errlen, "%s: making paths absolute: %s", path, strerror(-rc));
            return rc;
        }
    }

    /* check the binaries before creating anything */
    for (int i = 0; i < o->t.n_workers; i++) {
        char bin[1024];
        worker_binary(o, &o->t.workers[i], bin, sizeof bin);
        if (access(bin, X_OK) < 0) {
            snprintf(err, errlen, "workers[%d] \"%s\" (role %s): binary %s: %s", i, o->t.workers[i].name,
                     topo_role_name(o->t.workers[i].role), bin, strerror(errno));
            return -ENOENT;
        }
    }

    o->n = o->t.n_workers;
    for (int i = 0; i < o->n; i++) {
        orch_worker *w = &o->w[i];
        w->o = o;
        w->id = i;
        w->tw = &o->t.workers[i];
        w->ctl_fd = -1;
        w->backoff_ms = o->t.sup.backoff_initial_ms;
        worker_binary(o, w->tw, w->bin, sizeof w->bin);
    }
    /* segments and the plan first: a bad data file leaves no run dir behind */
    if ((rc = setup_segments(o, err, errlen)) < 0)
        return rc;
    if (!resume) {
        if ((rc = make_run_dir(o, o->t.run_dir, err, errlen)) < 0)
            return rc;
        snprintf(o->topo_path, sizeof o->topo_path, "%s/topology.json", o->run_dir);
        json_t *j = topo_to_json(&o->t);
        char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
        json_decref(j);
        if (!text)
            return -ENOMEM;
        size_t tl = strlen(text);
        text[tl] = '\n'; /* replace the NUL: write tl + 1 bytes */
        rc = df_write_file_atomic(o->topo_path, text, tl + 1);
        free(text);
        if (rc < 0) {
            snprintf(err, errlen, "%s: %s", o->topo_path, strerror(-rc));
            return rc;
        }
    }
    char sub[1200];
    snprintf(sub, sizeof sub, "%s/logs", o->run_dir);
    if ((rc = df_mkdir_p(sub, 0700)) < 0)
        goto dir_fail;
    snprintf(sub, sizeof sub, "%s/metrics", o->run_dir);
    if ((rc = df_mkdir_p(sub, 0700)) < 0)
        goto dir_fail;
    return 0;
dir_fail:
    snprintf(err, errlen, "%s: %s", sub, strerror(-rc));
    return rc;
}

int setup_run_complete(orch *o)
{
    if (o->epoch + 1 < DF_MAX(o->t.drafter.epochs, 1u))
        return 0;
    char path[1200];
    snprintf(path, sizeof path, "%s/train_summary.json", o->run_dir);
    /* the summary is the drafter's last act after the final checkpoint and the export; an
     * epoch committed without it (a crash in between) still needs the drafter to finish */
    return ledger_epoch_done(&o->led) && access(path, F_OK) == 0;
}

int setup_persist_ledger(orch *o)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/ledger.bin", o->run_dir);
    return df_write_file_atomic(path, o->ledger_seg.base, o->ledger_seg.size);
}

void setup_teardown(orch *o)
{
    arena_close(&o->status_seg);
    arena_close(&o->handoff_seg);
    arena_close(&o->ledger_seg);
    group_teardown(o);
    for (int i = 0; i < TOPO_MAX_RINGS; i++) {
        arena_close(&o->ring_seg[i]);
        arena_close(&o->ring_arena[i]);
    }
    o->status = NULL;
    topo_free(&o->t);
}
