/* worker.h: the skeleton every pipeline worker shares, on top of the control protocol
 * (ctl.h) and the stage figures (io/stage.h), so that each worker's main holds only its
 * stage's own logic.
 *
 * A worker's life:
 *   if (worker_help(argc, argv, usage)) return 0;          --help / -h: usage on stdout
 *   DF_CHECK_ERR(worker_start(&k, "target_worker", argc, argv));   environment, hello, maps
 *   ... load the model, data, rings (worker_ring_in / worker_ring_out) ...
 *   DF_CHECK_ERR(worker_ready(&k, in, out));   metrics/<name>.jsonl, stage figures, "ready"
 *   loop: worker_tick (heartbeat + stage line), ctl_should_stop / ctl_paused (worker_idle),
 *         worker_acquire_free (back-pressure, heartbeating), stage_count / stage_busy
 *   worker_finish(&k);          the last stage line
 *   ... the stage's own closing (its "done" log line, its resources) ...
 *   worker_close(&k);           metrics and the control connection
 *
 * Ownership: a worker_ctx owns its ctl_worker and, after worker_ready, its metrics writer;
 * worker_close releases both. The stage figures (st) count waiting between the wait points
 * the stage marks itself (stage_wait) and those worker_idle and worker_acquire_free mark.
 * Functions return 0 or -errno unless stated. */
#ifndef DF_WORKER_H
#define DF_WORKER_H

#include <stdint.h>

#include "io/metrics.h"
#include "io/stage.h"
#include "proc/ctl.h"

/* How long one wait on a ring slot blocks before the worker heartbeats and looks again. */
#define WORKER_WAIT_NS (200 * 1000000ll)

typedef struct worker_ctx {
    ctl_worker ctl;
    metrics_writer mw;
    stage_stats st;
    int have_metrics; /* worker_ready opened mw */
} worker_ctx;

/* One ring of this worker with its payload arena (a host pointer on the cpu backend) and
 * its slot size: slot s is at s * slot_bytes of A. */
typedef struct worker_ring {
    ring *r;
    arena *A;
    uint64_t slot_bytes;
} worker_ring;

/* 1 (after printing usage on stdout) when argv[1] is --help or -h, else 0. */
int worker_help(int argc, char **argv, const char *usage);
/* Log as role until the hello names this worker, then start the control protocol
 * (ctl_worker_start: a worker run by hand exits DF_EXIT_USAGE there) and log as its name. */
int worker_start(worker_ctx *k, const char *role, int argc, char **argv);
/* This worker's input / output ring, mapped with its arena. -ENOENT when the topology
 * gives it none, it was not mapped or its slots
 * have no size. */
int worker_ring_in(worker_ctx *k, worker_ring *out);
int worker_ring_out(worker_ctx *k, worker_ring *out);
/* Open <run_dir>/metrics/<name>.jsonl, start the stage figures (one line a second; in and
 * out may be NULL) and tell the orchestrator the worker is ready. */
int worker_ready(worker_ctx *k, ring *in, ring *out);
/* Heartbeat with progress step and the stage's item / token totals. */
void worker_heartbeat(worker_ctx *k, uint64_t step);
/* worker_heartbeat, then the stage line if its interval passed: once per loop and per wait. */
void worker_tick(worker_ctx *k, uint64_t step);
/* Sleep 100 ms, counted as waiting (paused, or nothing to claim yet). */
void worker_idle(worker_ctx *k);
/* Back-pressure: wait for a free slot of r, heartbeating with step every WORKER_WAIT_NS; the
 * wait is counted as waiting. Returns ring_acquire_free's result (-EPIPE: the ring was
 * closed, the run is shutting down). */
int worker_acquire_free(worker_ctx *k, ring *r, uint64_t step, uint32_t *slot);
/* One wait of up to WORKER_WAIT_NS for a READY slot of r (ring_acquire_ready's result). */
int worker_acquire_ready(worker_ctx *k, ring *r, uint32_t *slot);
/* The last stage line (forced). */
void worker_finish(worker_ctx *k);
/* Close the metrics and the control connection. Safe to call twice. */
void worker_close(worker_ctx *k);

#endif
