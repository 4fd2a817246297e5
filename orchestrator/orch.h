/* orch.h: the orchestrator's state, shared by its files (internal; not a public API).
 *
 * The orchestrator is one libuv loop in one thread. Files by concept:
 *   setup.c        run dir, topology.json, shm segments, arenas, ledger (+ resume)
 *   resume.c       what --resume checks first: the topology against the run's record,
 *                  ledger.bin against the checkpoints on disk
 *   plan_source.c  sample lengths for the ledger plan (the one call into the shard reader)
 *   supervisor.c   spawn, hello, exit/hang handling, reclaim, restart policy, groups, shutdown
 *   group.c        restart groups' shared memory: all-reduce segment, deterministic reset
 *   control.c      the control socket <run_dir>/ctl.sock (dfctl's server)
 *   report.c       status JSON, events (metrics/orchestrator.jsonl), metrics aggregation
 * Everything runs on the loop thread, so no locks; shared memory is only touched through the
 * segment APIs (status.h, ring.h, handoff.h, ledger.h).
 */
#ifndef DF_ORCH_H
#define DF_ORCH_H

#include <limits.h>
#include <jansson.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "io/metrics.h"
#include "io/topology.h"
#include "ipc/arena.h"
#include "ipc/handoff.h"
#include "ipc/ledger.h"
#include "ipc/ring.h"
#include "ipc/status.h"

#define ORCH_RESTART_HIST 128 /* restart times kept for the intensity limit */

/* What to do once a worker's process is gone (its exit intent, set by the state table's
 * actions before we signal it; read by the "reap" action). */
typedef enum {
    AFTER_POLICY = 0, /* it died by itself (or we killed it as hung): the restart policy decides */
    AFTER_STOP,       /* `dfctl stop` / shutdown: stay down */
    AFTER_RESTART,    /* `dfctl restart`: restart at once, no backoff */
    AFTER_GROUP,      /* killed because a group peer died: restart with the group */
    AFTER_KILL,       /* `dfctl kill`: restarted as after a crash, but not counted against max_restarts */
} orch_after;

/* plan_source.c: the data's fingerprint: per file its path, size and content hash, and one
 * digest over them (the ledger carries the digest; <run_dir>/data_files.json the list) */
#define PLAN_FP_MAX 1024
typedef struct plan_fp {
    int n;
    struct {
        char path[1024];
        uint64_t size, hash;
    } f[PLAN_FP_MAX];
    uint64_t digest;
} plan_fp;

struct orch;

/* supervisor.c: where a worker is in its life. One table in supervisor.c says, for each state
 * and each event, the next state and the action (docs/supervisor.md is the same table in
 * words). The state dfctl shows (orch_worker.state, a status_state) follows from it:
 * each state publishes its status_state when entered, except KILLED and EXITED, which keep
 * showing what was there before (a worker we SIGKILLed still shows "up" until it is gone). */
typedef enum {
    SV_IDLE = 0,  /* never started */
    SV_STARTING,  /* spawned, hello sent, no READY yet */
    SV_UP,        /* READY received */
    SV_STOPPING,  /* SIGTERM sent (dfctl stop / restart); the escalation timer runs */
    SV_KILLED,    /* SIGKILL sent; only its exit can follow */
    SV_EXITED,    /* the process is gone; its handles are closing, reclaim follows */
    SV_BACKOFF,   /* reclaimed, the restart (backoff) timer runs */
    SV_GROUPWAIT, /* reclaimed, waiting for its restart group */
    SV_STOPPED,   /* stopped by the operator or by a shutdown; dfctl start brings it back */
    SV_DONE,      /* exited 0: its work is finished */
    SV_FAILED,    /* exited 100 or gave up: not restarted */
    SV_N_STATES
} supervisor_state;

typedef struct orch_worker {
    struct orch *o;
    int id; /* index in topo.workers = owner id in rings/ledger/status */
    const topology_worker *tw;
    char bin[1024];      /* the binary spawned for it */
    supervisor_state sv; /* its place in supervisor.c's state table */
    uint32_t state;      /* status_state: what dfctl and the status segment show (follows sv) */
    pid_t pid;           /* 0 when no process */
    uint32_t incarnation, restarts;
    uint64_t start_ns, ready_ns;
    uint64_t backoff_ms; /* the delay of the next restart */
    uint64_t restart_ns[ORCH_RESTART_HIST];
    uint32_t n_restart_ns;
    orch_after after; /* exit intent of this incarnation */
    char reason[64];  /* why we killed it ("hang", "dfctl kill", ...), "" if not */
    int exit_status, term_signal;
    char last_exit[64];        /* "exit 1", "signal 9 (hang)" ... for dfctl status */
    uint32_t ckpt_failures;    /* checkpoint_failed events over the run (drafter rank 0) */
    uint32_t ckpt_fail_consec; /* in a row, as the drafter counts them; 0 after a good one */
    char ckpt_last_error[256];
    uv_process_t proc;
    int ctl_fd; /* our end of the control socketpair, -1 when none */
    uv_poll_t poll;
    uv_timer_t timer; /* BACKOFF: the restart; STOPPING / KILLED: SIGTERM -> SIGKILL escalation */
    int closing;      /* EXITED: handles still closing (the reap follows at 0) */
    /* throughput, sampled each metrics interval from the status slot */
    uint64_t items_prev, tokens_prev, sample_ns;
    double items_per_s, tokens_per_s;
    metrics_reader mr; /* tail of metrics/<name>.jsonl */
    int mr_open;
    json_t *last_metrics; /* the last line read from its jsonl (new ref) or NULL */
    json_t *last_ev[3];   /* the last "step", "stage" and "validation" lines (new refs) or NULL */
    uint64_t metrics_lines;
} orch_worker;

typedef struct orch {
    uv_loop_t *loop;
    topo t;
    char run_dir[1024]; /* absolute */
    char topology_path[1100];
    char self_dir[1024]; /* directory of the orchestrator binary */
    int resume;
    int created_run_dir; /* this start made run_dir (not --resume): a failed start removes it */
    uint64_t start_ns;

    /* segments: all fds kept for the whole run */
    arena status_seg, handoff_seg, ledger_seg;
    arena ring_seg[TOPOLOGY_MAX_RINGS], ring_arena[TOPOLOGY_MAX_RINGS];
    status_shm *status;
    handoff_table handoff;
    ledger led;
    ring rings[TOPOLOGY_MAX_RINGS];
    int ring_closed[TOPOLOGY_MAX_RINGS];
    uint64_t committed_step;
    uint32_t epoch;       /* the ledger's epoch, 0..drafter.epochs-1 */
    uint64_t total_steps; /* optimizer steps over all epochs (the drafter's LR schedule) */
    int epoch_switching;  /* spawning for the next epoch: not a restart */
    uint64_t poisoned_total;
    arena allreduce_seg;     /* the drafter group's shm all-reduce segment (cpu, R > 1), group.c */
    uint64_t group_gen;      /* 1 + group restarts so far (sent to drafters in the hello) */
    char nccl_id[257];       /* cuda drafter groups (R > 1): this generation's NCCL unique id, hex */
    int group_pending;       /* group restart waiting for every member to be reaped */
    uint64_t group_delay_ms; /* the backoff the group restarts with */
    uint64_t restarts_total;

    orch_worker w[TOPOLOGY_MAX_WORKERS];
    int n;

    /* loop handles */
    uv_signal_t sigint, sigterm;
    uv_timer_t hang_timer, metrics_timer, shutdown_timer;
    uv_pipe_t ctl_server;
    int ctl_server_open;
    char ctl_path[1100];

    /* shutdown */
    int shutting_down; /* 0 running, 1 draining, 2 SIGTERM sent, 3 SIGKILL sent */
    int finished;
    int exit_code; /* what main returns */
    int forced;    /* something had to be SIGKILLed during shutdown */
    char shutdown_reason[512];

    int events_fd; /* metrics/orchestrator.jsonl, O_APPEND */
    /* ETA (report.c): samples trained over the run, sampled each metrics interval */
#define ORCH_ETA_HIST 64
    uint64_t eta_ns[ORCH_ETA_HIST];
    double eta_done[ORCH_ETA_HIST];
    uint32_t eta_n;
    double samples_total, samples_done, samples_per_s, eta_s; /* eta_s < 0: unknown */
    int lock_fd;     /* <run_dir>/orchestrator.lock, flock'ed for our whole life */
    plan_fp data_fp; /* the data the plan is built from (plan_source.c) */
    uint32_t *lens;  /* every sample's token length, read once at start (each epoch's plan) */
    uint32_t n_lens;
    int target_vocab, target_layers, target_hidden; /* from model_dir/config.json; 0 when not read */

    /* --resume (setup.c, resume.c) */
    const char *resume_topology; /* --topology FILE (or the file given to --resume); NULL: the run dir's */
    int accept_changes;          /* --accept-changes */
    int fresh_resume;            /* nothing was ever committed: planned anew, ledger.bin rewritten */
    json_t *topo_changes;        /* the accepted changes ([{field, old, new}]) or NULL */
} orch;

/* setup.c */
int setup_run(orch *o, const char *path, int resume, char *err, size_t errlen);
void setup_teardown(orch *o);
/* A start that failed before the supervisor ran: remove the run dir if this start created
 * it (never a resumed one, nor one that existed). note gets what was done ("" if nothing). */
void setup_remove_new_run_dir(orch *o, char *note, size_t cap);
int setup_persist_ledger(orch *o); /* <run_dir>/ledger.bin after each commit */
/* Every batch of o->epoch is committed and another epoch follows: build its plan into a new
 * ledger segment (committed step carried over), re-format the rings, persist ledger.bin.
 * The caller respawns the workers (their hello carries the new segment). 0 or -errno. */
int setup_next_epoch(orch *o, char *err, size_t errlen);
/* --resume: 1 when the run has nothing left to do (every batch committed, the summary written) */
int setup_run_complete(orch *o);
/* --resume of a complete run: write the final audits (ledger_audit-epoch<E>.json,
 * ledger_audit.json) that are missing (a crash or a failed write at the end). done: the
 * files written, comma-separated ("" if none). 0 or -errno with err naming the file. */
int setup_write_missing(orch *o, char *done, size_t cap, char *err, size_t errlen);

/* group.c: restart groups (drafter ranks; every worker in deterministic mode) */
int group_in(const orch *o, const orch_worker *w);  /* w restarts with the group */
int group_setup(orch *o, char *err, size_t errlen); /* the all-reduce segment, at setup */
void group_abort_allreduce(orch *o);                /* a rank died: wake the others */
/* Every member reaped: re-format the all-reduce segment; deterministic mode also re-formats
 * every ring and returns in-flight batches to PENDING (*in_flight_returned). 0 or -errno. */
int group_restart_prepare(orch *o, uint32_t *in_flight_returned);
void group_teardown(orch *o);

/* helper.c: run <bin_dir>/cuda_helper with args (NULL-terminated; args[0] names the request)
 * and read its one answer: 0 with the text after "ok " in answer (and an fd in *fd_out, or
 * -1), or -errno with err set (missing binary, timeout, "error: ..." from the helper). */
int helper_call(const orch *o, const char *const *args, char *answer, size_t cap, int *fd_out, char *err,
                size_t errlen);

int plan_source_fingerprint(const topo *t, plan_fp *fp, char *err, size_t errlen);
uint64_t plan_source_digest(const plan_fp *fp); /* over f[0..n) */
/* What plan_source_lengths saw besides the lengths. */
typedef struct plan_data_info {
    uint64_t n_truncated;  /* samples longer than data.max_seq_len (the plan truncates them) */
    uint32_t longest;      /* the longest sample's token count */
    char longest_at[1300]; /* where it is: "data.shards[0] /x.dfs: sample 5" */
} plan_data_info;
/* plan_source.c: per-sample token lengths of the topology's data (malloc'd, caller frees),
 * after checking every sample: -EINVAL naming the shard and the sample for an empty one, or
 * for a token id >= vocab (vocab 0: not checked; vocab_src names where vocab came from). */
int plan_source_lengths(const topo *t, uint32_t vocab, const char *vocab_src, uint32_t **lens, uint32_t *n,
                        plan_data_info *info, char *err, size_t errlen);
/* The token ids of the first max_samples (0: all) samples of other shards (the validation
 * set, whose empty samples the validator skips), `field` naming them in messages. */
int plan_source_check_shards(char *const *paths, int n_paths, const char *field, uint64_t max_samples, uint32_t vocab,
                             const char *vocab_src, char *err, size_t errlen);

/* resume.c: --resume's checks before it trusts the run dir (docs/operations.md, "Resume").
 * The record of the topology a run was started with (or last accepted on a resume): */
#define RESUME_RECORD "topology.recorded.json"
/* The state on disk: ledger.bin (verified) and the checkpoints. Contradictions (checkpoints
 * or a final audit without ledger.bin; the committed step's checkpoint missing, checked when
 * checkpoints/ exists or writes_checkpoints: the real drafter runs) are refused with -EINVAL
 * and err naming what is missing; *fresh = nothing was ever committed (every topology field
 * may still change). 0 or -errno. */
int resume_check_state(orch *o, int writes_checkpoints, int *fresh, char *err, size_t errlen);
/* Read and verify <run_dir>/ledger.bin into *snap (backed by *mem, which the caller frees):
 * 0, -ENOENT when there is none, other -errno with err saying what is wrong. */
int resume_load_snapshot(orch *o, ledger *snap, void **mem, char *err, size_t errlen);
/* Compare the topology to resume with (o->t) with the record rec: every difference is
 * logged (field: old -> new); 0 when none, or when all may change and o->accept_changes
 * (then o->topo_changes holds them), else -EINVAL with err saying how to proceed. */
int resume_check_topology(orch *o, const topo *rec, const char *rec_path, const char *cand_path, int fresh, char *err,
                          size_t errlen);
/* A resume with accepted changes: append a "topology_changed" event to
 * metrics/orchestrator.jsonl (before the report opens it). 0 or -errno. */
int resume_log_changes(orch *o, const char *record_path);

/* supervisor.c */
int supervisor_start(orch *o); /* spawn everyone, start timers and signals */
void supervisor_begin_shutdown(orch *o, int exit_code, const char *why);
int supervisor_cmd_stop(orch *o, orch_worker *w);
int supervisor_cmd_start(orch *o, orch_worker *w);
int supervisor_cmd_restart(orch *o, orch_worker *w);
int supervisor_cmd_kill(orch *o, orch_worker *w);
int supervisor_commit(orch *o, uint64_t step); /* ledger commit + persist; <0 if ledger.bin was not written */

/* control.c */
int control_start(orch *o, char *err, size_t errlen);
void control_stop(orch *o);

/* report.c */
void orch_event(orch *o, json_t *ev); /* steals ev; adds "t"; appends to orchestrator.jsonl */
json_t *report_status_json(orch *o);  /* new reference: the dfctl status object */
void report_tick(orch *o);            /* one metrics interval: summary, prom, progress line */
int report_start(orch *o);
void report_stop(orch *o);
void report_log_tail(orch *o, const char *name, char *out, size_t cap, int lines);
/* One line of the training figures of a status object's "train" (progress line, dfctl top). */
void report_train_line(json_t *train, char *out, size_t cap);
/* One field of the progress line: its text and how much it matters (0 most). */
#define REPORT_MAX_FIELDS (TOPOLOGY_MAX_WORKERS + TOPOLOGY_MAX_RINGS + 16)
typedef struct report_field {
    char text[200];
    int prio;
} report_field;
/* The fields' texts joined with " | " in their order into out (NUL-terminated); with width > 0
 * the least important fields (the highest prio; of equals, the later one) are left out until
 * the line is at most width characters, then those left out that still fit in the rest of the
 * line come back, the most important first; a single field longer than the width is cut.
 * Empty texts are skipped. Returns the length. */
size_t report_fit_fields(const report_field *f, int n, size_t width, char *out, size_t cap);
/* Where a run's results are, for its last line: "ledger audit: <path>" and, when they exist,
 * the training summary and the release export. */
void report_results(const orch *o, char *out, size_t cap);

#endif
