/* stage.h: the figures every pipeline stage reports: busy and waiting time, items and
 * tokens per second, and the occupancy of its rings, as one metrics line per interval
 * (metrics/<worker>.jsonl, event "stage"). A stage calls stage_busy/stage_wait around its
 * work and its waits, and stage_tick from its loop. */
#ifndef DF_STAGE_H
#define DF_STAGE_H

#include <stdint.h>

#include "io/metrics.h"
#include "ipc/ring.h"

typedef struct stage_stats {
    metrics_writer *mw;
    ring *in, *out; /* borrowed; either may be NULL */
    uint64_t interval_ns;
    uint64_t t0_ns, last_ns, mark_ns;
    uint64_t busy_ns, wait_ns; /* since the last line */
    uint64_t items, tokens;    /* since the last line */
    uint64_t items_total, tokens_total;
    double busy_total_s, wait_total_s;
} stage_stats;

void stage_init(stage_stats *s, metrics_writer *mw, ring *in, ring *out, uint64_t interval_ns);
/* Close the open interval as busy / waiting time (each call starts a new interval). */
void stage_busy(stage_stats *s);
void stage_wait(stage_stats *s);
void stage_count(stage_stats *s, uint64_t items, uint64_t tokens);
/* Emit a "stage" line if the interval passed (or force); extra_key/extra may add one figure. */
void stage_tick(stage_stats *s, int force);

#endif
