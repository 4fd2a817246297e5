/* hb_wait.h: wait for a thread doing a long host-side job (a checkpoint, the release
 * export) while the caller keeps heartbeating, for a bounded time (prefix hb_wait_).
 *
 * The orchestrator kills a worker whose heartbeat stops for heartbeat_timeout_ms (10 s by
 * default); writing 12.6 GB takes longer. While the job runs the waiting thread heartbeats
 * every 100 ms, but only for limit_s: a job still running then is taken as stuck (a dead
 * disk) and the heartbeats stop, so the hang timeout ends it as it would have ended the
 * same job run in the loop itself. */
#ifndef DF_HB_WAIT_H
#define DF_HB_WAIT_H

#include <pthread.h>

/* How long a wait is vouched for: a 12.6 GB checkpoint takes ~25 s. */
#define HB_WAIT_LIMIT_S 600.0

/* Join th, calling hb(arg) every 100 ms for the first limit_s seconds (hb may be NULL);
 * what names the job in the one log line written when the heartbeats stop. Returns the
 * seconds waited. */
double hb_wait_join(pthread_t th, void (*hb)(void *), void *arg, double limit_s, const char *what);

#endif
