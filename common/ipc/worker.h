/* worker.h: the skeleton every pipeline worker shares, on top of the control protocol
 * (ctl.h) and the stage figures (io/stage.h), so that each worker's main holds only its
 * stage's own logic.
 *
 * A worker's life:
 *   if (wk_help(argc, argv, usage)) return 0;          --help / -h: usage on stdout
 *   DF_CHECK_ERR(wk_start(&k, "target_worker", argc, argv));   environment, hello, maps
 *   ... load the model, data, rings (wk_ring_in / wk_ring_out) ...
 *   DF_CHECK_ERR(wk_ready(&k, in, out));   metrics/<name>.jsonl, stage figures, "ready"
 *   loop: wk_tick (heartbeat + stage line), ctl_should_stop / ctl_paused (wk_idle),
 *         wk_acquire_free (back-pressure, heartbeating), stage_count / stage_busy
 *   wk_finish(&k);          the last stage line
 *   ... the stage's own closing (its "done" log line, its resources) ...
 *   wk_close(&k);           metrics and the control connection
 *
 * Ownership: a wk_worker owns its ctl_worker and, after wk_ready, its metrics writer;
 * wk_close releases both. The stage figures (st) count waiting between the wait points
 * the stage marks itself (stage_wait) and those wk_idle and wk_acquire_free mark.
 * Functions return 0 or -errno unless stated. */
#ifndef DF_WORKER_H
#define DF_WORKER_H

#include <stdint.h>

#include "io/metrics.h"
#include "io/stage.h"
#include "ipc/ctl.h"

/* How long one wait on a ring slot blocks before the worker heartbeats and looks again. */
#define WK_WAIT_NS (200 * 1000000ll)

typedef struct wk_worker {
    ctl_worker ctl;
    metrics_writer mw;
    stage_stats st;
    int have_metrics; /* wk_ready opened mw */
} wk_worker;

/* One ring of this worker with its payload arena (a host pointer on the cpu backend) and
 * its slot size: slot s is at s * slot_bytes of A. */
typedef struct wk_ring {
    ring *r;
    arena *A;
    uint64_t slot_bytes;
} wk_ring;

/* 1 (after printing usage on stdout) when argv[1] is --help or -h, else 0. */
int wk_help(int argc, char **argv, const char *usage);
/* Log as role until the hello names this worker, then start the control protocol
 * (ctl_worker_start: a worker run by hand exits DF_EXIT_USAGE there) and log as its name. */
int wk_start(wk_worker *k, const char *role, int argc, char **argv);
/* This worker's input / output ring, mapped with its arena. -ENOENT when the topology
 * gives it none, it was not mapped or its slots
 * have no size. */
int wk_ring_in(wk_worker *k, wk_ring *out);
int wk_ring_out(wk_worker *k, wk_ring *out);
/* Open <run_dir>/metrics/<name>.jsonl, start the stage figures (one line a second; in and
 * out may be NULL) and tell the orchestrator the worker is ready. */
int wk_ready(wk_worker *k, ring *in, ring *out);
/* Heartbeat with progress step and the stage's item / token totals. */
void wk_heartbeat(wk_worker *k, uint64_t step);
/* wk_heartbeat, then the stage line if its interval passed: once per loop and per wait. */
void wk_tick(wk_worker *k, uint64_t step);
/* Sleep 100 ms, counted as waiting (paused, or nothing to claim yet). */
void wk_idle(wk_worker *k);
/* Back-pressure: wait for a free slot of r, heartbeating with step every WK_WAIT_NS; the
 * wait is counted as waiting. Returns ring_acquire_free's result (-EPIPE: the ring was
 * closed, the run is shutting down). */
int wk_acquire_free(wk_worker *k, ring *r, uint64_t step, uint32_t *slot);
/* One wait of up to WK_WAIT_NS for a READY slot of r (ring_acquire_ready's result). */
int wk_acquire_ready(wk_worker *k, ring *r, uint32_t *slot);
/* The last stage line (forced). */
void wk_finish(wk_worker *k);
/* Close the metrics and the control connection. Safe to call twice. */
void wk_close(wk_worker *k);

#endif
