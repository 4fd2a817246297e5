/* status.h: the run's status segment, one shared page-set that every worker and the
 * orchestrator map (memfd, handed over with the other segments at each worker start).
 *
 * It carries two things, both plain atomics so a reader never blocks a writer:
 *   - run-wide flags the orchestrator sets and workers poll from their loops: pause,
 *     stop-claiming (drain: produce nothing new), stop (leave now), and a checkpoint-request
 *     generation counter (the drafter checkpoints when it sees a new value);
 *   - one slot per worker id (the index in the topology): the worker's heartbeat and its
 *     progress counters, written by the worker (ctl_heartbeat), read by the orchestrator
 *     for hang detection, throughput and `dfctl status`.
 * Why a segment and not messages: a heartbeat must be a store, cheap enough to call from
 * any inner loop, and it must be readable even when the worker is wedged.
 *
 * Layout: a header line, a flags line, then STATUS_MAX_WORKERS slots of two cache lines
 * each (line 0 worker-written, line 1 orchestrator-written), so no two writers share a line.
 *
 * Memory ordering: counters are stored relaxed, then heartbeat_ns with release; a reader
 * loads heartbeat_ns with acquire and then the counters (they are at least as new as the
 * heartbeat it saw). Flags are stored with release and loaded with acquire; they carry no
 * data, so that is all they need. heartbeat_ns is CLOCK_MONOTONIC, which is system-wide on
 * Linux and therefore comparable across processes.
 */
#ifndef DF_STATUS_H
#define DF_STATUS_H

#include <stdatomic.h>
#include <stdint.h>

#define STATUS_MAGIC 0x5355544154534644ull /* "DFSTATUS" little-endian */
#define STATUS_VERSION 1u
#define STATUS_MAX_WORKERS 64

/* Lifecycle of a worker as the orchestrator sees it (slot.state, orchestrator-written). */
typedef enum {
    STATUS_IDLE = 0,     /* never started */
    STATUS_STARTING = 1, /* spawned, hello sent, no READY yet */
    STATUS_UP = 2,       /* READY received */
    STATUS_STOPPING = 3, /* asked to stop (SIGTERM sent) */
    STATUS_BACKOFF = 4,  /* dead, reclaimed, waiting for its restart timer */
    STATUS_STOPPED = 5,  /* stopped by the operator; `dfctl start` brings it back */
    STATUS_DONE = 6,     /* exited 0: its work is finished */
    STATUS_FAILED = 7,   /* exited 100 or gave up: not restarted */
    STATUS_GROUPWAIT = 8 /* killed because a group peer died; restarts with the group */
} status_state;

const char *status_state_name(uint32_t state);

typedef struct status_slot {
    /* line 0: written by the worker only */
    _Alignas(64) _Atomic uint64_t heartbeat_ns; /* CLOCK_MONOTONIC of the last ctl_heartbeat */
    _Atomic uint64_t step;                      /* worker-defined progress: optimizer step, batch count */
    _Atomic uint64_t items;                     /* batches handled since this incarnation started */
    _Atomic uint64_t tokens;                    /* tokens handled since this incarnation started */
    _Atomic uint32_t worker_incarnation;        /* the incarnation that wrote the fields above */
    _Atomic int32_t worker_pid;
    uint64_t reserved0[3];
    /* line 1: written by the orchestrator only */
    _Alignas(64) _Atomic uint32_t state; /* status_state */
    _Atomic uint32_t incarnation;        /* current incarnation (0 before the first start) */
    _Atomic int32_t pid;                 /* 0 when not running */
    _Atomic uint32_t restarts;
    uint64_t reserved1[6];
} status_slot;

typedef struct status_shm {
    /* header, written once by status_format */
    uint64_t magic;
    uint32_t version;
    uint32_t n_workers;
    uint64_t bytes;        /* total size of the segment */
    uint64_t record_bytes; /* sizeof(status_slot), checked on open */
    uint64_t reserved[4];
    /* run-wide flags (orchestrator-written) */
    _Alignas(64) _Atomic uint32_t pause; /* 1: workers hold before starting new work */
    _Atomic uint32_t stop_claiming;      /* 1: drain; producers claim nothing new */
    _Atomic uint32_t stop;               /* 1: leave now (ctl_should_stop) */
    _Atomic uint32_t pad0;
    _Atomic uint64_t checkpoint_gen; /* bumped by `dfctl checkpoint` */
    uint64_t reserved2[5];
    status_slot slots[STATUS_MAX_WORKERS];
} status_shm;

/* Size of the segment (fixed; one slot per possible worker id). */
uint64_t status_shm_bytes(void);
/* Initialise a zeroed segment of `bytes` (>= status_shm_bytes()) for n_workers. 0 or -EINVAL. */
int status_format(void *mem, uint64_t bytes, uint32_t n_workers);
/* Validate magic/version/sizes of a mapped segment; *out points into mem. 0 or -EINVAL / -EPROTO. */
int status_open(status_shm **out, void *mem, uint64_t bytes);

/* Worker side: one heartbeat with progress (see the ordering contract above). */
void status_heartbeat(status_slot *s, uint64_t step, uint64_t items, uint64_t tokens);

#endif
