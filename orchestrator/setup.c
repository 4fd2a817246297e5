/* setup.c: everything the orchestrator prepares before the first spawn, and undoes at exit.
 *
 *   run dir      created 0700 (refused if it exists, unless --resume), with logs/ and
 *                metrics/; topology.json = the normalised topology (topology_to_json)
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
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ftw.h>
#include <stdlib.h>

#include "io/hfconfig.h"
#include "io/shard.h"
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
    if (!rc)
        rc = absolutise(&t->run_dir);
    if (!rc)
        rc = absolutise(&t->target_model_dir);
    if (!rc)
        rc = absolutise(&t->drafter.init_dir);
    if (!rc)
        rc = absolutise(&t->bin_dir);
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
        return df_err(err, errlen, -e, "--resume: run dir %s: %s", dir, strerror(e));
    }
    if (!S_ISDIR(st.st_mode))
        return df_err(err, errlen, -ENOTDIR, "--resume: run dir %s is not a directory", dir);
    if (st.st_uid != geteuid() || (st.st_mode & 022))
        return df_err(err, errlen, -EPERM,
                      "--resume: run dir %s is owned by uid %u with mode %03o: it must be ours (uid %u) "
                      "and not writable by group or others (chmod 700)",
                      dir, (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777), (unsigned)geteuid());
    return 0;
}

/* One orchestrator per run dir: an exclusive flock on <run_dir>/orchestrator.lock, held
 * (fd kept, close-on-exec so no worker inherits it) until the process exits; the kernel
 * drops it when the holder dies, however it dies. The holder's pid is in the file, for the
 * message of the one refused. Taken before anything in the run dir is touched (the control
 * socket above all: a second orchestrator must not unlink the live one's). */
static int lock_run_dir(orch *o, char *err, size_t errlen)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/orchestrator.lock", o->run_dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        int e = errno;
        return df_err(err, errlen, -e, "%s: %s", path, strerror(e));
    }
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        int e = errno;
        if (e == EWOULDBLOCK) {
            char buf[32] = "";
            ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
            long pid = n > 0 ? strtol(buf, NULL, 10) : 0;
            if (pid > 0 && kill((pid_t)pid, 0) < 0 && errno == ESRCH)
                pid = 0; /* the file still names the last holder: the new one is starting */
            if (pid > 0)
                snprintf(err, errlen,
                         "run dir %s is in use by orchestrator pid %ld (it holds %s): stop that one first "
                         "(dfctl --run-dir %s shutdown) or wait for it to end",
                         o->run_dir, pid, path, o->run_dir);
            else
                snprintf(err, errlen, "run dir %s is in use by another orchestrator that is starting (it holds %s)",
                         o->run_dir, path);
            e = EBUSY;
        } else {
            snprintf(err, errlen, "%s: flock: %s", path, strerror(e));
        }
        close(fd);
        return -e;
    }
    o->lock_fd = fd; /* our pid goes in once the start succeeded (lock_write_pid): a failed
                      * --resume must leave the run dir as it found it */
    return 0;
}

static int lock_write_pid(orch *o, char *err, size_t errlen)
{
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    errno = 0;
    if (ftruncate(o->lock_fd, 0) < 0 || pwrite(o->lock_fd, pid, (size_t)n, 0) != n) {
        int e = errno ? errno : EIO;
        return df_err(err, errlen, -e, "%s/orchestrator.lock: writing our pid: %s", o->run_dir, strerror(e));
    }
    return 0;
}

/* The binary a worker runs: <bin_dir>/<role>_worker, role "test" -> fake_worker, role
 * "validator" -> validator. */
static void worker_binary_of(const orch *o, const topo *t, const topology_worker *tw, char *out, size_t cap)
{
    const char *dir = t->bin_dir ? t->bin_dir : o->self_dir;
    int n = tw->role == TOPOLOGY_ROLE_TEST ? snprintf(out, cap, "%s/fake_worker", dir)
            : tw->role == TOPOLOGY_ROLE_VALIDATOR
                ? snprintf(out, cap, "%s/validator", dir)
                : snprintf(out, cap, "%s/%s_worker", dir, topology_role_name(tw->role));
    if (n < 0 || (size_t)n >= cap)
        out[0] = 0; /* too long: access() then fails with a message naming the worker */
}

static void worker_binary(const orch *o, const topology_worker *tw, char *out, size_t cap)
{
    worker_binary_of(o, &o->t, tw, out, cap);
}

/* Whether t runs the real drafter (which writes checkpoints/step-N): a drafter whose binary
 * is drafter_worker once symlinks are resolved (the tests link the fake worker there). */
static int runs_real_drafter(const orch *o, const topo *t)
{
    for (int i = 0; i < t->n_workers; i++) {
        char bin[1024], real[PATH_MAX];
        if (t->workers[i].role != TOPOLOGY_ROLE_DRAFTER)
            continue;
        worker_binary_of(o, t, &t->workers[i], bin, sizeof bin);
        const char *base = realpath(bin, real) ? strrchr(real, '/') : NULL;
        if (base && !strcmp(base + 1, "drafter_worker"))
            return 1;
    }
    return 0;
}

/* t's normalised text, as the run dir stores it (topology.json and its record): malloc'd,
 * ends with a newline; NULL on allocation failure */
static char *topology_text(const topo *t)
{
    json_t *j = topology_to_json(t);
    char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    if (!text)
        return NULL;
    size_t tl = strlen(text);
    char *out = realloc(text, tl + 2);
    if (!out) {
        free(text);
        return NULL;
    }
    out[tl] = '\n';
    out[tl + 1] = 0;
    return out;
}

/* <run_dir>/<name> = text, crash-safely; nothing written when it holds that already. */
static int write_run_file(orch *o, const char *name, const char *text, char *err, size_t errlen)
{
    char path[1200], *old = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/%s", o->run_dir, name);
    if (df_read_file(path, &old, &len) == 0 && len == strlen(text) && !memcmp(old, text, len)) {
        free(old);
        return 0;
    }
    free(old);
    int rc = df_write_file_atomic(path, text, strlen(text));
    if (rc < 0)
        snprintf(err, errlen, "%s: %s", path, strerror(-rc));
    return rc;
}

/* --resume: find and lock the run dir, then decide the topology to run with. The record
 * (RESUME_RECORD; topology.json for a run dir an older build started) is what the run was
 * started with; the topology to resume with is the file given (--topology FILE, or a file
 * instead of the run dir), else the run dir's topology.json, which the operator may have
 * edited. The state on disk is checked first (resume_check_state), then every difference
 * (resume_check_topology). */
static int resume_open(orch *o, const char *path, int *record_missing, char *err, size_t errlen)
{
    int rc;
    char dir[1024];
    const char *file = o->resume_topology;
    if (is_dir(path)) {
        snprintf(dir, sizeof dir, "%s", path);
    } else {
        if (file)
            return df_err(err, errlen, -EINVAL,
                          "--resume %s --topology %s: give the run dir with --topology, or the topology file "
                          "alone",
                          path, file);
        file = path;
        topo tmp;
        if ((rc = topology_load(&tmp, path, err, errlen)) < 0)
            return rc;
        snprintf(dir, sizeof dir, "%s", tmp.run_dir);
        topology_free(&tmp);
    }
    int prc = resolve_path(dir, o->run_dir, sizeof o->run_dir);
    if (prc < 0)
        return df_err(err, errlen, prc, "--resume: run dir %s: %s", dir, strerror(-prc));
    if ((rc = check_run_dir_owner(o->run_dir, err, errlen)) < 0)
        return rc;
    if ((rc = lock_run_dir(o, err, errlen)) < 0)
        return rc;
    snprintf(o->topology_path, sizeof o->topology_path, "%s/topology.json", o->run_dir);
    char rec_path[1200];
    snprintf(rec_path, sizeof rec_path, "%s/" RESUME_RECORD, o->run_dir);
    *record_missing = access(rec_path, F_OK) != 0;
    if (*record_missing) {
        snprintf(rec_path, sizeof rec_path, "%s", o->topology_path);
        df_log("resume: %s has no %s (an older build started it): its topology.json is taken as what the run was "
               "started with",
               o->run_dir, RESUME_RECORD);
    }
    topo rec;
    memset(&rec, 0, sizeof rec);
    if ((rc = topology_load(&rec, rec_path, err, errlen)) < 0)
        return rc;
    if (file) {
        if ((rc = topology_load(&o->t, file, err, errlen)) < 0)
            goto out;
        char here[1024];
        if ((rc = absolutise_paths(&o->t)) < 0) {
            snprintf(err, errlen, "%s: making paths absolute: %s", file, strerror(-rc));
            goto out;
        }
        if (resolve_path(o->t.run_dir, here, sizeof here) < 0 || strcmp(here, o->run_dir)) {
            rc = df_err(err, errlen, -EINVAL, "--resume: %s names run_dir %s, not the run dir being resumed (%s)", file,
                        o->t.run_dir, o->run_dir);
            goto out;
        }
        char *same = strdup(rec.run_dir); /* one spelling of the same directory: no change */
        if (!same) {
            rc = -ENOMEM;
            goto out;
        }
        free(o->t.run_dir);
        o->t.run_dir = same;
        topo cur; /* the run dir's copy: replaced by the file given, which should not go unsaid */
        memset(&cur, 0, sizeof cur);
        if (!*record_missing && topology_load(&cur, o->topology_path, err, errlen) == 0) {
            char *a = topology_text(&cur), *b = topology_text(&rec);
            if (a && b && strcmp(a, b))
                df_log("resume: %s was edited since the run started; resuming with %s instead, which replaces it",
                       o->topology_path, file);
            free(a), free(b);
            topology_free(&cur);
        }
        err[0] = 0;
    } else if ((rc = topology_load(&o->t, o->topology_path, err, errlen)) < 0) {
        goto out;
    }
    int fresh = 0;
    if ((rc = resume_check_state(o, runs_real_drafter(o, &rec), &fresh, err, errlen)) < 0)
        goto out;
    o->fresh_resume = fresh;
    rc = resume_check_topology(o, &rec, rec_path, file ? file : o->topology_path, fresh, err, errlen);
out:
    topology_free(&rec);
    return rc;
}

static int write_data_files(orch *o, char *err, size_t errlen);

/* A resume whose checks all passed: bring the run dir's records up to what runs now. */
static int resume_record(orch *o, int record_missing, char *err, size_t errlen)
{
    int rc;
    if (o->fresh_resume) { /* planned anew: the data and the (empty) ledger of this plan */
        if ((rc = write_data_files(o, err, errlen)) < 0)
            return rc;
        if ((rc = setup_persist_ledger(o)) < 0)
            return df_err(err, errlen, rc, "%s/ledger.bin: %s", o->run_dir, strerror(-rc));
    }
    char *text = topology_text(&o->t);
    if (!text)
        return -ENOMEM;
    rc = write_run_file(o, "topology.json", text, err, errlen);
    /* the record last: a failure before it leaves the change to be made again */
    if (!rc && (record_missing || o->topo_changes))
        rc = write_run_file(o, RESUME_RECORD, text, err, errlen);
    free(text);
    if (rc < 0)
        return rc;
    char rec[1200];
    snprintf(rec, sizeof rec, "%s/" RESUME_RECORD, o->run_dir);
    if ((rc = resume_log_changes(o, rec)) < 0)
        snprintf(err, errlen, "%s/metrics/orchestrator.jsonl: %s", o->run_dir, strerror(-rc));
    return rc;
}

/* A GPU ring's arena: cuda_helper creates the VMM allocation on the ring's GPU and sends
 * back its fd (the orchestrator itself never loads CUDA). */
static int cuda_arena_from_helper(orch *o, int i, uint64_t bytes, char *err, size_t errlen)
{
    const topology_ring *r = &o->t.rings[i];
    char devarg[16], bytesarg[32], name[80], answer[600], e2[700];
    snprintf(devarg, sizeof devarg, "%d", r->gpu);
    snprintf(bytesarg, sizeof bytesarg, "%llu", (unsigned long long)bytes);
    snprintf(name, sizeof name, "df-arena-%s", r->name);
    const char *args[] = {"--arena", "--device", devarg, "--bytes", bytesarg, "--name", name, NULL};
    int fd = -1;
    int rc = helper_call(o, args, answer, sizeof answer, &fd, e2, sizeof e2);
    if (rc == 0 && fd < 0)
        snprintf(e2, sizeof e2, "cuda_helper --arena answered without an fd"), rc = -EIO;
    if (rc < 0)
        return df_err(err, errlen, rc, "rings[%d] \"%s\": GPU arena of %llu bytes on device %d: %s", i, r->name,
                      (unsigned long long)bytes, r->gpu, e2);
    arena *a = &o->ring_arena[i];
    arena_init(a);
    a->kind = ARENA_CUDA;
    a->fd = fd;
    a->device = r->gpu;
    a->size = bytes; /* importers round up exactly as the creator did */
    df_log("rings[%d] \"%s\": GPU arena of %llu bytes on device %d (%s mapped)", i, r->name, (unsigned long long)bytes,
           r->gpu, answer);
    return 0;
}

static int setup_ring_arena(orch *o, int i, char *err, size_t errlen)
{
    const topology_ring *r = &o->t.rings[i];
    uint64_t bytes = (uint64_t)r->slots * r->slot_bytes;
    char name[64];
    snprintf(name, sizeof name, "df-arena-%s", r->name);
    if (r->gpu >= 0)
        return cuda_arena_from_helper(o, i, bytes, err, errlen);
    char e2[512];
    int rc = arena_create(&o->ring_arena[i], ARENA_CPU, -1, bytes, name, e2, sizeof e2);
    if (rc < 0) /* name the two fields that size it: they are what the operator can change */
        snprintf(err, errlen,
                 "rings[%d] \"%s\": arena of %llu bytes (rings[%d].slots %u x rings[%d].slot_bytes %llu): "
                 "%s: lower rings[%d].slots or rings[%d].slot_bytes, or free memory",
                 i, r->name, (unsigned long long)bytes, i, r->slots, i, (unsigned long long)r->slot_bytes, e2, i, i);
    return rc;
}

/* Restore the verified ledger.bin into the fresh ledger o->led (ledger_restore: committed and
 * poisoned batches stay, their counters are carried over, not raised). The snapshot must be
 * of the plan just rebuilt from the topology and the data (plan hash, data digest, epoch). */
static int resume_ledger(orch *o, char *err, size_t errlen)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/ledger.bin", o->run_dir);
    ledger snap;
    void *mem = NULL;
    int rc = resume_load_snapshot(o, &snap, &mem, err, errlen);
    if (rc == -ENOENT) /* resume_check_state saw it a moment ago: someone is changing the run dir */
        snprintf(err, errlen, "%s: vanished while the resume was being prepared; refusing to resume", path);
    if (rc < 0)
        return rc;
    if (ledger_data_digest(&snap) != o->data_fp.digest) {
        rc = df_err(err, errlen, -EINVAL,
                    "%s: planned over data with digest %016llx, the data now has %016llx (%s/data_files.json "
                    "and ledger.bin disagree): refusing to resume",
                    path, (unsigned long long)ledger_data_digest(&snap), (unsigned long long)o->data_fp.digest,
                    o->run_dir);
        goto out;
    }
    if (ledger_epoch(&snap) != ledger_epoch(&o->led) || ledger_plan_hash(&snap) != ledger_plan_hash(&o->led) ||
        ledger_n_batches(&snap) != ledger_n_batches(&o->led) || ledger_seed(&snap) != ledger_seed(&o->led)) {
        rc = df_err(err, errlen, -EINVAL,
                    "%s: epoch %u plan hash %016llx (%u batches, seed %llu), but the plan rebuilt from the "
                    "topology and the data is epoch %u plan hash %016llx (%u batches, seed %llu): the data or the "
                    "topology changed since the run started; refusing to resume",
                    path, ledger_epoch(&snap) + 1, (unsigned long long)ledger_plan_hash(&snap), ledger_n_batches(&snap),
                    (unsigned long long)ledger_seed(&snap), ledger_epoch(&o->led) + 1,
                    (unsigned long long)ledger_plan_hash(&o->led), ledger_n_batches(&o->led),
                    (unsigned long long)ledger_seed(&o->led));
        goto out;
    }
    ledger_restore_counts rc_n;
    if ((rc = ledger_restore(&o->led, &snap, &rc_n)) < 0) {
        snprintf(err, errlen, "%s: restoring the snapshot failed: %s", path, strerror(-rc));
        goto out;
    }
    o->committed_step = ledger_committed_step(&o->led);
    df_log("resume: ledger.bin: step %llu, %u batches committed, %u poisoned, the rest pending (%u trained after the "
           "checkpoint and %u in flight are redone)",
           (unsigned long long)o->committed_step, rc_n.committed, rc_n.poisoned, rc_n.rewound, rc_n.reclaimed);
    rc = 0;
out:
    free(mem);
    return rc;
}

/* <run_dir>/data_files.json: the data the plan was built from (path, size, content hash per
 * file, and their digest, which the ledger carries too). Written once, crash-safely, at the
 * start of a run; --resume compares it with the data on disk now. */
static int write_data_files(orch *o, char *err, size_t errlen)
{
    char path[1200], hex[32];
    snprintf(path, sizeof path, "%s/data_files.json", o->run_dir);
    json_t *files = json_array();
    for (int i = 0; i < o->data_fp.n; i++) {
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)o->data_fp.f[i].hash);
        json_array_append_new(files, json_pack("{s:s, s:I, s:s}", "path", o->data_fp.f[i].path, "size",
                                               (json_int_t)o->data_fp.f[i].size, "hash", hex));
    }
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)o->data_fp.digest);
    json_t *j = json_pack("{s:i, s:o, s:s}", "version", 1, "files", files, "digest", hex);
    char *text = j ? json_dumps(j, JSON_INDENT(2)) : NULL;
    json_decref(j);
    if (!text)
        return -ENOMEM;
    int rc = df_write_file_atomic(path, text, strlen(text));
    free(text);
    if (rc < 0)
        snprintf(err, errlen, "%s: %s", path, strerror(-rc));
    return rc;
}

/* --resume: the data on disk must be what data_files.json recorded at plan time. */
static int check_data_files(orch *o, char *err, size_t errlen)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/data_files.json", o->run_dir);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j)
        return df_err(err, errlen, -EINVAL,
                      "%s: %s: cannot verify the data the run was planned over; refusing to resume", path, je.text);
    plan_fp *rec = calloc(1, sizeof *rec);
    int rc = rec ? 0 : -ENOMEM;
    json_t *files = json_object_get(j, "files");
    const char *digest = json_string_value(json_object_get(j, "digest"));
    if (!rc && (!json_is_array(files) || !digest || json_array_size(files) > PLAN_FP_MAX))
        rc = df_err(err, errlen, -EINVAL, "%s: expected {\"files\": [...], \"digest\": \"...\"}; refusing to resume",
                    path);
    for (size_t i = 0; !rc && i < json_array_size(files); i++) {
        json_t *f = json_array_get(files, i);
        const char *p = json_string_value(json_object_get(f, "path"));
        const char *h = json_string_value(json_object_get(f, "hash"));
        json_t *sz = json_object_get(f, "size");
        if (!p || !h || !json_is_integer(sz) || strlen(p) >= sizeof rec->f[i].path) {
            rc = df_err(err, errlen, -EINVAL,
                        "%s: files[%zu]: expected {\"path\", \"size\", \"hash\"}; refusing to resume", path, i);
            break;
        }
        snprintf(rec->f[i].path, sizeof rec->f[i].path, "%s", p);
        rec->f[i].size = (uint64_t)json_integer_value(sz);
        rec->f[i].hash = strtoull(h, NULL, 16);
        rec->n = (int)i + 1;
    }
    if (!rc && strtoull(digest, NULL, 16) != plan_source_digest(rec))
        rc = df_err(err, errlen, -EINVAL,
                    "%s: its digest %s does not match its file list (the file was edited); refusing to "
                    "resume",
                    path, digest);
    if (!rc && rec->n != o->data_fp.n)
        rc = df_err(err, errlen, -EINVAL,
                    "%s: the run was planned over %d data files, the topology names %d now; refusing to "
                    "resume",
                    path, rec->n, o->data_fp.n);
    for (int i = 0; !rc && i < rec->n; i++) {
        const char *now = o->data_fp.f[i].path;
        if (strcmp(rec->f[i].path, now)) {
            rc = df_err(err, errlen, -EINVAL,
                        "data.shards[%d]: the run was planned over %s, the topology names %s now; refusing "
                        "to resume",
                        i, rec->f[i].path, now);
        } else if (rec->f[i].size != o->data_fp.f[i].size || rec->f[i].hash != o->data_fp.f[i].hash) {
            rc = df_err(err, errlen, -EINVAL,
                        "data.shards[%d] %s changed since the run was planned: %llu bytes with content hash "
                        "%016llx then, %llu bytes with hash %016llx now (%s); refusing to resume",
                        i, now, (unsigned long long)rec->f[i].size, (unsigned long long)rec->f[i].hash,
                        (unsigned long long)o->data_fp.f[i].size, (unsigned long long)o->data_fp.f[i].hash, path);
        }
    }
    free(rec);
    json_decref(j);
    return rc;
}

/* Build epoch `epoch`'s plan into a fresh ledger segment (o->ledger_seg / o->led; the old
 * one, if any, is closed: the workers get the new fd in their next hello). *n_batches: the
 * plan's batch count. */
static int build_epoch_ledger(orch *o, uint32_t epoch, uint32_t *n_batches, int quiet, char *err, size_t errlen)
{
    uint32_t n = o->n_lens;
    ledger_plan plan;
    memset(&plan, 0, sizeof plan);
    uint32_t msl = o->t.max_seq_len;
    if (msl > o->t.token_budget)
        msl = (uint32_t)o->t.token_budget;
    int rc = ledger_plan_build(&plan, o->lens, n, o->t.seed, epoch, o->t.token_budget, msl);
    if (rc < 0)
        return df_err(err, errlen, rc, "ledger plan of epoch %u over %u samples: %s", epoch + 1, n, strerror(-rc));
    plan.data_digest = o->data_fp.digest;
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
        snprintf(err, errlen, "ledger segment of epoch %u (%llu bytes): %s", epoch + 1, (unsigned long long)bytes,
                 strerror(-rc));
        ledger_plan_free(&plan);
        return rc;
    }
    df_log("plan: epoch %u of %u: %u samples -> %u batches (token budget %llu, seed %llu)", epoch + 1, /* from 1 */
           DF_MAX(o->t.drafter.epochs, 1u), plan.n_samples, plan.n_batches, (unsigned long long)o->t.token_budget,
           (unsigned long long)o->t.seed);
    ledger_plan_free(&plan);
    return 0;
}

/* The epoch a ledger.bin snapshot is in (0 when there is none or it does not verify: then
 * resume_ledger reports the problem against the epoch-0 plan). */
static uint32_t snapshot_epoch(orch *o)
{
    ledger snap;
    void *mem = NULL;
    char err[16];
    uint32_t e = 0;
    if (resume_load_snapshot(o, &snap, &mem, err, sizeof err) == 0)
        e = ledger_epoch(&snap);
    free(mem);
    return e;
}

/* Multi-epoch runs (drafter.epochs > 1): the drafter keeps one LR schedule over all epochs,
 * so it needs the total optimizer steps: the sum over epochs of ceil(batches / ranks). Each
 * epoch's plan packs differently (another shuffle), so every plan is built once to count. */
static int count_total_steps(orch *o, char *err, size_t errlen)
{
    uint32_t E = DF_MAX(o->t.drafter.epochs, 1u), R = (uint32_t)DF_MAX(topology_n_drafters(&o->t), 1);
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
    /* the data's fingerprint first: the plans carry its digest, and --resume must refuse
     * changed data before anything is built from it */
    int rc = plan_source_fingerprint(&o->t, &o->data_fp, err, errlen);
    if (rc < 0)
        return rc;
    int resumed = o->resume && !o->fresh_resume; /* a fresh resume is planned like a new run */
    if (resumed && (rc = check_data_files(o, err, errlen)) < 0)
        return rc;
    if (o->resume && o->fresh_resume && check_data_files(o, err, errlen) < 0) { /* rewritten below */
        df_log("resume: %s; but nothing was committed yet, so the run is planned anew over the data as it is now", err);
        err[0] = 0;
    }
    /* every sample's length, once (each epoch's plan shuffles the same lengths), with the
     * checks against the target's vocabulary */
    char cfg[1100];
    snprintf(cfg, sizeof cfg, "%s/config.json", o->t.target_model_dir ? o->t.target_model_dir : "");
    plan_data_info info;
    if ((rc = plan_source_lengths(&o->t, (uint32_t)o->target_vocab, cfg, &o->lens, &o->n_lens, &info, err, errlen)) < 0)
        return rc;
    if (info.n_truncated > 0)
        df_log("plan: %llu of %u samples are longer than data.max_seq_len %u and are truncated to it (the longest: "
               "%s, %u tokens)",
               (unsigned long long)info.n_truncated, o->n_lens, o->t.max_seq_len, info.longest_at, info.longest);
    if ((rc = count_total_steps(o, err, errlen)) < 0)
        return rc;
    o->epoch = resumed ? snapshot_epoch(o) : 0;
    if ((rc = build_epoch_ledger(o, o->epoch, &nb, 0, err, errlen)) < 0)
        return rc;
    if (o->resume && o->fresh_resume)
        df_log("resume: nothing was committed yet: every batch starts pending (step 0)");
    return resumed ? resume_ledger(o, err, errlen) : 0;
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
    if (step > 0 && (rc = ledger_commit(&o->led, step)) < 0)
        return df_err(err, errlen, rc, "epoch %u: ledger_commit(%llu): %s", o->epoch + 1, (unsigned long long)step,
                      strerror(-rc));
    o->committed_step = step;
    for (int i = 0; i < o->t.n_rings; i++) { /* every worker exited 0: the rings are empty; re-open them */
        const topology_ring *r = &o->t.rings[i];
        if ((rc = ring_format(o->ring_seg[i].base, o->ring_seg[i].size, r->slots, r->max_attempts, (uint32_t)i)) < 0 ||
            (rc = ring_open(&o->rings[i], o->ring_seg[i].base, o->ring_seg[i].size)) < 0)
            return df_err(err, errlen, rc, "rings[%d] \"%s\": re-format for epoch %u: %s", i, r->name, o->epoch + 1,
                          ring_strerror(rc));
        o->ring_closed[i] = 0;
    }
    if ((rc = setup_persist_ledger(o)) < 0)
        return df_err(err, errlen, rc, "%s/ledger.bin: %s", o->run_dir, strerror(-rc));
    return 0;
}

static int setup_segments(orch *o, char *err, size_t errlen)
{
    int rc;
    if ((rc = shm_create(&o->status_seg, status_shm_bytes(), "df-status")) < 0 ||
        (rc = status_format(o->status_seg.base, o->status_seg.size, (uint32_t)o->t.n_workers)) < 0 ||
        (rc = status_open(&o->status, o->status_seg.base, o->status_seg.size)) < 0)
        return df_err(err, errlen, rc, "status segment: %s", strerror(-rc));
    if ((rc = shm_create(&o->handoff_seg, handoff_shm_bytes(), "df-handoff")) < 0 ||
        (rc = handoff_format(o->handoff_seg.base, o->handoff_seg.size)) < 0 ||
        (rc = handoff_open(&o->handoff, o->handoff_seg.base, o->handoff_seg.size)) < 0)
        return df_err(err, errlen, rc, "handoff table: %s", strerror(-rc));
    for (int i = 0; i < o->t.n_rings; i++) {
        const topology_ring *r = &o->t.rings[i];
        uint64_t bytes = ring_shm_bytes(r->slots);
        char name[64];
        snprintf(name, sizeof name, "df-ring-%s", r->name);
        if ((rc = shm_create(&o->ring_seg[i], bytes, name)) < 0 ||
            (rc = ring_format(o->ring_seg[i].base, o->ring_seg[i].size, r->slots, r->max_attempts, (uint32_t)i)) < 0 ||
            (rc = ring_open(&o->rings[i], o->ring_seg[i].base, o->ring_seg[i].size)) < 0)
            return df_err(err, errlen, rc, "rings[%d] \"%s\": %s", i, r->name, ring_strerror(rc));
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
        if ((rc = df_mkdir_p(parent, 0700)) < 0)
            return df_err(err, errlen, rc, "%s: cannot create: %s", parent, strerror(-rc));
    }
    if (mkdir(want, 0700) < 0) {
        rc = -errno;
        if (rc == -EEXIST)
            snprintf(err, errlen,
                     "run dir %s exists: continue it with `orchestrator --resume %s`, or "
                     "choose another run_dir",
                     want, want);
        else
            snprintf(err, errlen, "run dir %s: %s", want, strerror(-rc));
        return rc;
    }
    int prc = resolve_path(want, o->run_dir, sizeof o->run_dir);
    if (prc < 0) {
        snprintf(err, errlen, "run dir %s: %s", want, strerror(-prc));
        (void)rmdir(want); /* still empty */
        return prc;
    }
    o->created_run_dir = 1;
    return 0;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return (flag == FTW_DP ? rmdir(path) : unlink(path)) < 0 ? -1 : 0;
}

void setup_remove_new_run_dir(orch *o, char *note, size_t cap)
{
    note[0] = 0;
    if (!o->created_run_dir || o->resume || !o->run_dir[0])
        return;
    /* depth first, never following a symlink out of it; the lock is still ours meanwhile */
    if (nftw(o->run_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS) < 0)
        snprintf(note, cap, "; could not remove the run dir %s this start had created: %s", o->run_dir,
                 strerror(errno));
    else
        snprintf(note, cap, "; removed the run dir %s this start had created", o->run_dir);
    o->created_run_dir = 0;
}

/* The release's attention kinds (its config.json j at path) against drafter.layer_types and
 * sliding_window, when the topology gives them (absent: the release's own are taken). A
 * layer is sliding where layer_types says "sliding_attention" and use_sliding_window is not
 * false, as the drafter reads it (dflash_config_from_json); the window counts where some
 * layer is sliding. */
static int check_init_dir_attention(const orch *o, const json_t *j, const char *path, char *err, size_t errlen)
{
    const topology_drafter *d = &o->t.drafter;
    if (!d->layer_types_given)
        return 0;
    json_t *types = json_object_get(j, "layer_types"), *use = json_object_get(j, "use_sliding_window");
    json_t *win = json_object_get(j, "sliding_window");
    int use_sw = !json_is_false(use) && !(json_is_integer(use) && json_integer_value(use) == 0);
    if (types && !json_is_null(types) && (!json_is_array(types) || json_array_size(types) != d->num_layers))
        return df_err(err, errlen, -EINVAL, "drafter.init_dir: %s: layer_types: expected an array of %u strings", path,
                      d->num_layers);
    int any = 0;
    for (uint32_t l = 0; l < d->num_layers; l++) {
        const char *k = json_string_value(json_array_get(types, l)); /* NULL when absent: full */
        int sliding = use_sw && k && !strcmp(k, "sliding_attention");
        if (sliding != d->layer_sliding[l]) {
            char got[96];
            if (!types || json_is_null(types))
                snprintf(got, sizeof got, "layer_types is absent (every layer \"full_attention\")");
            else
                snprintf(got, sizeof got, "layer_types[%u] is \"%s\"%s", l, k ? k : "?",
                         k && !strcmp(k, "sliding_attention") && !use_sw ? " (use_sliding_window false: full)" : "");
            return df_err(err, errlen, -EINVAL,
                          "drafter.init_dir: %s: %s, but drafter.layer_types[%u] is \"%s\": the release was trained "
                          "with other attention layers; make the topology match it (or use another init_dir)",
                          path, got, l, d->layer_sliding[l] ? "sliding_attention" : "full_attention");
        }
        any |= sliding;
    }
    if (any && (!json_is_integer(win) || json_integer_value(win) != d->sliding_window)) {
        char got[32];
        if (json_is_integer(win))
            snprintf(got, sizeof got, "%lld", (long long)json_integer_value(win));
        else
            snprintf(got, sizeof got, "%s", win && !json_is_null(win) ? "not an integer" : "null");
        return df_err(err, errlen, -EINVAL,
                      "drafter.init_dir: %s: sliding_window is %s, but drafter.sliding_window is %u: the release was "
                      "trained with another window; make the topology match it (or use another init_dir)",
                      path, got, d->sliding_window);
    }
    return 0;
}

/* drafter.init_dir: a release directory (config.json + model.safetensors) whose shape the
 * drafter takes as it is, so it must be the one the topology describes: the layers, the
 * block, the captured layers and the mask token of its config.json against the topology's,
 * its width and vocabulary against the target's; its attention kinds against
 * drafter.layer_types when the topology gives them. */
static int check_init_dir(orch *o, char *err, size_t errlen)
{
    const topology_drafter *d = &o->t.drafter;
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", d->init_dir);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j)
        return df_err(err, errlen, -EINVAL,
                      "drafter.init_dir: %s: %s (a release directory holds config.json and model.safetensors)", path,
                      je.text);
    json_t *dc = json_object_get(j, "dflash_config");
    json_t *ids = json_object_get(dc, "target_layer_ids");
    int rc = 0;
    struct {
        const char *key, *topo_field;
        json_t *v;
        long long want;
    } f[] = {
        {"num_hidden_layers", "drafter.num_layers", json_object_get(j, "num_hidden_layers"), d->num_layers},
        {"block_size", "drafter.block_size", json_object_get(j, "block_size"), d->block_size},
        {"dflash_config.mask_token_id", "drafter.mask_token_id", json_object_get(dc, "mask_token_id"),
         d->mask_token_id >= 0 ? d->mask_token_id
         : o->target_vocab > 0 ? o->target_vocab - 1
                               : -1},
        {"hidden_size", "the target's hidden_size", json_object_get(j, "hidden_size"), o->target_hidden},
        {"vocab_size", "the target's vocab_size", json_object_get(j, "vocab_size"), o->target_vocab},
        {"num_target_layers", "the target's num_hidden_layers", json_object_get(j, "num_target_layers"),
         o->target_layers},
    };
    for (size_t i = 0; !rc && i < DF_ARRAY_LEN(f); i++) {
        if (f[i].want < 0 || (f[i].want == 0 && strstr(f[i].topo_field, "target")))
            continue; /* the target's config was not read (test workers only) */
        if (!json_is_integer(f[i].v)) {
            rc = df_err(err, errlen, -EINVAL, "drafter.init_dir: %s: %s: expected an integer", path, f[i].key);
        } else if (json_integer_value(f[i].v) != f[i].want) {
            rc = df_err(err, errlen, -EINVAL,
                        "drafter.init_dir: %s: %s is %lld, but %s is %lld: the drafter would take the init_dir's "
                        "shape; make the topology match it (or use another init_dir)",
                        path, f[i].key, (long long)json_integer_value(f[i].v), f[i].topo_field, f[i].want);
        }
    }
    int same = json_is_array(ids) && (int)json_array_size(ids) == o->t.n_capture;
    for (int i = 0; same && i < o->t.n_capture; i++)
        same = json_integer_value(json_array_get(ids, (size_t)i)) == o->t.capture_layers[i];
    if (!rc && !same) {
        char *s = json_dumps(ids, JSON_ENCODE_ANY | JSON_COMPACT), mine[400];
        size_t len = 0;
        for (int i = 0; i < o->t.n_capture && len < sizeof mine; i++) {
            int n = snprintf(mine + len, sizeof mine - len, "%s%d", i ? "," : "[", o->t.capture_layers[i]);
            len += n > 0 ? (size_t)n : 0;
        }
        if (len < sizeof mine - 1)
            snprintf(mine + len, sizeof mine - len, "]");
        snprintf(err, errlen,
                 "drafter.init_dir: %s: dflash_config.target_layer_ids is %s, but target.capture_layers is %s: the "
                 "drafter was trained on the features of its layers; make them match",
                 path, s ? s : "absent", mine);
        free(s);
        rc = -EINVAL;
    }
    if (!rc)
        rc = check_init_dir_attention(o, j, path, err, errlen);
    json_decref(j);
    return rc;
}

/* Inputs checked before anything is created (exit 2, the message names the file and the
 * field): the target's config.json and what depends on it (capture layers within its depth,
 * the mask token within its vocabulary, drafter.init_dir's shape), and the validation
 * shards (empty samples, token ids outside the vocabulary). The data shards get the same
 * checks where their lengths are read (plan_source_lengths); the weights are the target
 * worker's to check (it exits 100 naming the file). */
static int check_inputs(orch *o, char *err, size_t errlen)
{
    int rc;
    struct stat st;
    int reads_model = 0; /* the fake test workers read none */
    for (int i = 0; i < o->t.n_workers; i++)
        reads_model |= o->t.workers[i].role != TOPOLOGY_ROLE_TEST;
    rc = !reads_model ? 0 : stat(o->t.target_model_dir, &st) < 0 ? -errno : !S_ISDIR(st.st_mode) ? -ENOTDIR : 0;
    if (rc < 0)
        return df_err(err, errlen, rc, "target.model_dir: %s: %s", o->t.target_model_dir, strerror(-rc));
    char cfg[1100];
    snprintf(cfg, sizeof cfg, "%s/config.json", o->t.target_model_dir);
    if (reads_model) {
        hfconfig hc;
        char e[1024];
        if ((rc = hfconfig_load(&hc, o->t.target_model_dir, e, sizeof e)) < 0) { /* its config.json */
            return df_err(err, errlen, rc, "target.model_dir: %s", e);
        }
        o->target_vocab = hc.vocab_size;
        o->target_layers = hc.num_hidden_layers;
        o->target_hidden = hc.hidden_size;
        hfconfig_free(&hc);
        for (int i = 0; i < o->t.n_capture; i++)
            if (o->t.capture_layers[i] >= o->target_layers)
                return df_err(
                    err, errlen, -EINVAL,
                    "target.capture_layers[%d]: layer %d does not exist: the target has %d layers, 0..%d (%s: "
                    "num_hidden_layers %d)",
                    i, o->t.capture_layers[i], o->target_layers, o->target_layers - 1, cfg, o->target_layers);
        if (o->t.drafter.mask_token_id >= o->target_vocab)
            return df_err(err, errlen, -EINVAL,
                          "drafter.mask_token_id: %lld is outside the target's vocabulary 0..%d (%s: vocab_size %d)",
                          (long long)o->t.drafter.mask_token_id, o->target_vocab - 1, cfg, o->target_vocab);
    }
    if (o->t.drafter.init_dir && (rc = check_init_dir(o, err, errlen)) < 0)
        return rc;
    if (o->t.val.enabled &&
        (rc = plan_source_check_shards(o->t.val.shards, o->t.val.n_shards, "validation.shards", o->t.val.max_samples,
                                       (uint32_t)o->target_vocab, cfg, err, errlen)) < 0)
        return rc;
    return 0;
}

int setup_run(orch *o, const char *path, int resume, char *err, size_t errlen)
{
    int rc;
    o->resume = resume;
    arena_init(&o->status_seg);
    arena_init(&o->handoff_seg);
    arena_init(&o->ledger_seg);
    arena_init(&o->allreduce_seg);
    for (int i = 0; i < TOPOLOGY_MAX_RINGS; i++) {
        arena_init(&o->ring_seg[i]);
        arena_init(&o->ring_arena[i]);
    }
    o->events_fd = -1;
    o->lock_fd = -1;

    if (!resume && is_dir(path))
        return df_err(err, errlen, -EINVAL, "%s is a directory: to continue that run use `orchestrator --resume %s`",
                      path, path);
    int record_missing = 0;
    if (resume) {
        if ((rc = resume_open(o, path, &record_missing, err, errlen)) < 0)
            return rc;
    } else {
        if ((rc = topology_load(&o->t, path, err, errlen)) < 0)
            return rc;
        if ((rc = absolutise_paths(&o->t)) < 0)
            return df_err(err, errlen, rc, "%s: making paths absolute: %s", path, strerror(-rc));
    }

    /* check the binaries before creating anything */
    for (int i = 0; i < o->t.n_workers; i++) {
        char bin[1024];
        worker_binary(o, &o->t.workers[i], bin, sizeof bin);
        if (access(bin, X_OK) < 0)
            return df_err(err, errlen, -ENOENT, "workers[%d] \"%s\" (role %s): binary %s: %s", i, o->t.workers[i].name,
                          topology_role_name(o->t.workers[i].role), bin, strerror(errno));
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
    /* inputs, segments and the plan first: a bad model or data file leaves no run dir behind */
    if (!getenv("DF_SYNTHETIC_SAMPLES") && (rc = check_inputs(o, err, errlen)) < 0)
        return rc;
    if ((rc = setup_segments(o, err, errlen)) < 0)
        return rc;
    if (!resume) {
        if ((rc = make_run_dir(o, o->t.run_dir, err, errlen)) < 0)
            return rc;
        if ((rc = lock_run_dir(o, err, errlen)) < 0)
            return rc;
        if ((rc = write_data_files(o, err, errlen)) < 0)
            return rc;
        snprintf(o->topology_path, sizeof o->topology_path, "%s/topology.json", o->run_dir);
        /* topology.json, which the operator may edit for a --resume, and the record of what
         * the run was started with, which a --resume compares it with */
        char *text = topology_text(&o->t);
        if (!text)
            return -ENOMEM;
        rc = write_run_file(o, "topology.json", text, err, errlen);
        if (!rc)
            rc = write_run_file(o, RESUME_RECORD, text, err, errlen);
        free(text);
        if (rc < 0)
            return rc;
        /* ledger.bin from the start (nothing committed): a run dir without one is then
         * always a damaged one, which --resume refuses instead of starting over */
        if ((rc = setup_persist_ledger(o)) < 0)
            return df_err(err, errlen, rc, "%s/ledger.bin: %s", o->run_dir, strerror(-rc));
    }
    char sub[1200];
    snprintf(sub, sizeof sub, "%s/logs", o->run_dir);
    if ((rc = df_mkdir_p(sub, 0700)) < 0)
        goto dir_fail;
    snprintf(sub, sizeof sub, "%s/metrics", o->run_dir);
    if ((rc = df_mkdir_p(sub, 0700)) < 0)
        goto dir_fail;
    if (resume && (rc = resume_record(o, record_missing, err, errlen)) < 0)
        return rc;
    return lock_write_pid(o, err, errlen);
dir_fail:
    return df_err(err, errlen, rc, "%s: %s", sub, strerror(-rc));
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

int setup_write_missing(orch *o, char *done, size_t cap, char *err, size_t errlen)
{
    char a[1200], b[1200];
    snprintf(a, sizeof a, "%s/ledger_audit-epoch%u.json", o->run_dir, o->epoch);
    snprintf(b, sizeof b, "%s/ledger_audit.json", o->run_dir);
    const char *files[] = {a, b};
    size_t len = 0;
    done[0] = 0;
    for (int i = 0; i < 2; i++) {
        if (access(files[i], F_OK) == 0)
            continue;
        int rc = ledger_audit_write(&o->led, files[i]);
        if (rc < 0)
            return df_err(err, errlen, rc, "%s: %s", files[i], strerror(-rc));
        int n = snprintf(done + len, cap - len, "%s%s", len ? ", " : "", files[i]);
        if (n > 0 && (size_t)n < cap - len)
            len += (size_t)n;
    }
    return 0;
}

int setup_persist_ledger(orch *o)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/ledger.bin", o->run_dir);
    void *snap = NULL;
    uint64_t len = 0;
    int rc = ledger_snapshot(&o->led, &snap, &len);
    if (rc < 0)
        return rc;
    rc = df_write_file_atomic(path, snap, len);
    free(snap);
    return rc;
}

void setup_teardown(orch *o)
{
    arena_close(&o->status_seg);
    arena_close(&o->handoff_seg);
    arena_close(&o->ledger_seg);
    group_teardown(o);
    for (int i = 0; i < TOPOLOGY_MAX_RINGS; i++) {
        arena_close(&o->ring_seg[i]);
        arena_close(&o->ring_arena[i]);
    }
    o->status = NULL;
    topology_free(&o->t);
    free(o->lens);
    o->lens = NULL;
    o->n_lens = 0;
    json_decref(o->topo_changes);
    o->topo_changes = NULL;
    if (o->lock_fd >= 0) /* last: the run dir is ours until everything is released */
        close(o->lock_fd);
    o->lock_fd = -1;
}
