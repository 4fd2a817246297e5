/* ctl.h: the worker side of the orchestrator <-> worker protocol. Every worker binary
 * starts with ctl_worker_start and then only touches shared state through what it maps.
 *
 * The protocol (the orchestrator side is orchestrator/supervisor.c):
 *   1. The orchestrator spawns the worker with one end of a SOCK_SEQPACKET socketpair as
 *      fd 3 and the environment DF_CTL_FD=3, DF_WORKER=<name>, DF_WORKER_ID=<index in the
 *      topology>, DF_INCARNATION=<n, 1 for the first start>, DF_RUN_DIR=<abs path>,
 *      DF_ORCH_PID=<orchestrator pid>.
 *   2. It sends ONE message, the hello: a JSON object
 *        {"v":1, "worker_id":i, "name":"...", "incarnation":n, "role":"...",
 *         "topology":"<run dir>/topology.json", "run_dir":"...", "committed_step":S,
 *         "epoch":e, "epochs":E, "total_steps":N,
 *         "segments":[{"name":"status","kind":"status","size":B,"fd":0}, ...]}
 *      with every segment's fd attached (SCM_RIGHTS); "fd" is the index among the attached
 *      fds. A multi-epoch run (drafter.epochs E > 1) gives every epoch a new ledger segment
 *      and restarts the workers with it: "epoch" is the segment's, "total_steps" the
 *      drafter's LR schedule over all E epochs. Kinds: status (status.h), handoff (handoff.h), ledger (ledger.h), ring (one per
 *      topology ring, "ring": index), arena (the payload arena of ring "ring", with
 *      "backend": "cpu"|"cuda" and "device"), allreduce (drafter ranks of a group of
 *      R > 1 on the cpu backend only: the shm all-reduce segment, allreduce.h, formatted
 *      by the orchestrator for this incarnation of the group). Drafters also get
 *      "group": {"world": R, "generation": g, "allreduce": "shm"|"nccl"|"none"[, "nccl_id":
 *      256 hex digits]}; g counts group restarts; cuda groups get a fresh NCCL unique id per
 *      generation (made by cuda_helper).
 *   3. The worker maps everything, loads what it needs (model, ...), then ctl_ready() sends
 *      {"ev":"ready"}; from then on the orchestrator counts it as up.
 *   4. Later messages are events, one JSON object per message: {"ev":"checkpoint","step":N}
 *      (the orchestrator then commits the ledger up to N and persists it),
 *      {"ev":"checkpoint_failed","step":N,"error":"...","consecutive":k} (counted, shown by
 *      dfctl status), or anything else with an "ev" key (logged into
 *      metrics/orchestrator.jsonl). The orchestrator answers a checkpoint whose commit it
 *      persisted to ledger.bin with {"ev":"committed","step":N} (ctl_committed_ack): only
 *      then may the drafter delete older checkpoints.
 * Liveness goes through the status segment (ctl_heartbeat), not the socket.
 *
 * The worker dies with the orchestrator: PR_SET_PDEATHSIG(SIGKILL), and getppid() is
 * compared with DF_ORCH_PID afterwards for the race where the parent died first.
 * SIGTERM only sets a flag (no work in the handler); ctl_should_stop() reports it.
 *
 * Ownership: a ctl_worker owns its socket, every mapping and the loaded topology;
 * ctl_worker_close releases them all. Functions return 0 or -errno unless stated.
 */
#ifndef DF_CTL_H
#define DF_CTL_H

#include <stdint.h>

#include "io/topology.h"
#include "ipc/arena.h"
#include "ipc/handoff.h"
#include "ipc/ledger.h"
#include "ipc/ring.h"
#include "ipc/status.h"

#define CTL_HELLO_MAX (64 * 1024) /* bytes: the hello fits in one seqpacket message */
#define CTL_FD 3

typedef struct ctl_worker {
    int sock; /* control socket (fd 3), -1 when closed */
    int id;   /* worker id = index in topo.workers; also the ring/ledger owner id */
    uint32_t incarnation;
    char name[32];
    char run_dir[1024];
    char topology_path[1100];
    uint64_t committed_step; /* ledger committed step when this incarnation was started */
    uint32_t epoch, epochs;  /* the hello's: this ledger segment's epoch, of how many (0: not sent) */
    uint64_t total_steps;    /* the hello's: optimizer steps over all epochs (0: not sent) */
    uint64_t acked_step;     /* highest {"ev":"committed"} from the orchestrator (ctl_committed_ack) */

    topo topo;                   /* the run's topology (loaded from topology_path) */
    const topology_worker *self; /* &topo.workers[id] */

    arena status_seg;
    status_shm *status;
    status_slot *slot; /* &status->slots[id] */
    uint64_t ckpt_gen_seen;

    arena handoff_seg;
    handoff_table handoff;
    int have_handoff;

    arena ledger_seg;
    ledger ledger;

    int n_rings;
    arena ring_seg[TOPOLOGY_MAX_RINGS];
    ring rings[TOPOLOGY_MAX_RINGS];
    arena ring_arena[TOPOLOGY_MAX_RINGS]; /* payload arena of ring i: slot s at s * slot_bytes */

    arena allreduce_seg;        /* the drafter group's shm all-reduce segment (base NULL if none) */
    int group_world;            /* drafters: R from the hello's "group" (0 for other roles) */
    uint64_t group_gen;         /* drafters: the group's restart generation */
    unsigned char nccl_id[128]; /* cuda drafter groups: this generation's NCCL unique id */
    int has_nccl_id;
} ctl_worker;

/* Read the environment, receive the hello and its fds, map every segment, load the
 * topology, set the parent-death signal and the SIGTERM flag, and write a first heartbeat.
 * argv is only used for the log prefix. A missing or malformed DF_* variable (the worker was
 * run by hand) exits DF_EXIT_USAGE (2) at once with the variable named. Any other failure
 * (a bad hello, a segment that does not map) closes *w and returns a negative errno; the
 * message has been logged (df_log). Workers usually DF_CHECK_ERR it (exit 1). */
int ctl_worker_start(ctl_worker *w, int argc, char **argv);
/* Tell the orchestrator this worker is loaded and ready. */
int ctl_ready(ctl_worker *w);
/* Heartbeat with progress (a few relaxed stores + one release store; call it from any loop). */
void ctl_heartbeat(ctl_worker *w, uint64_t step, uint64_t items, uint64_t tokens);
/* 1 when SIGTERM arrived or the orchestrator set the run-wide stop flag. */
int ctl_should_stop(const ctl_worker *w);
/* 1 while the run is paused (`dfctl pause`): start no new work, keep heartbeating. */
int ctl_paused(const ctl_worker *w);
/* 1 when the run is draining: producers must claim no new batches. */
int ctl_stop_claiming(const ctl_worker *w);
/* 1 once per `dfctl checkpoint` request (the generation changed since the last call). */
int ctl_checkpoint_requested(ctl_worker *w);

/* This worker's input/output ring, or NULL. Borrowed. */
ring *ctl_ring_in(ctl_worker *w);
ring *ctl_ring_out(ctl_worker *w);
/* The payload arena of ring r (CPU: base is a host pointer), or NULL. Borrowed. */
arena *ctl_ring_arena(ctl_worker *w, const ring *r);
/* Slot bytes of ring r (from the topology), 0 if r is not one of ours. */
uint64_t ctl_ring_slot_bytes(ctl_worker *w, const ring *r);
ledger *ctl_ledger(ctl_worker *w);
/* The deterministic mode's claim window for ledger_claim (0 = fast mode: claim anything):
 * the smallest ring capacity of the topology, so every batch in the window fits in every
 * ring at once (docs/ledger.md, "Deterministic mode"). */
uint32_t ctl_claim_window(const ctl_worker *w);
/* The drafter group's all-reduce segment: base and size, or NULL (none was sent). */
void *ctl_allreduce_segment(ctl_worker *w, uint64_t *bytes);
handoff_table *ctl_handoff(ctl_worker *w);

/* Send one event (a JSON object text, e.g. {"ev":"checkpoint","step":12}). */
int ctl_send(ctl_worker *w, const char *json);
/* The checkpoint event for step (the orchestrator commits the ledger up to it). */
int ctl_send_checkpoint(ctl_worker *w, uint64_t step);

/* The highest step the orchestrator acknowledged as committed and persisted (ledger.bin),
 * 0 before the first acknowledgement of this incarnation. Never blocks. */
uint64_t ctl_committed_ack(ctl_worker *w);

/* Unmap everything, close the socket and free the topology. Safe to call twice. */
void ctl_worker_close(ctl_worker *w);

#endif
