/* hb_wait.c: join a thread while heartbeating, for a bounded time. See hb_wait.h. */
#include "drafter_worker/hb_wait.h"

#include <errno.h>
#include <time.h>

#include "util.h"

double hb_wait_join(pthread_t th, void (*hb)(void *), void *arg, double limit_s, const char *what)
{
    uint64_t t0 = df_now_ns();
    int stopped = 0;
    for (;;) { /* joined the moment the thread ends */
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_nsec += 100000000L;
        if (dl.tv_nsec >= 1000000000L)
            dl.tv_sec++, dl.tv_nsec -= 1000000000L;
        int rc = pthread_timedjoin_np(th, NULL, &dl);
        if (rc == 0)
            break;
        if (rc != ETIMEDOUT) { /* cannot happen for a joinable thread of ours; wait plainly */
            pthread_join(th, NULL);
            break;
        }
        double waited = (double)(df_now_ns() - t0) * 1e-9;
        if (hb && waited < limit_s)
            hb(arg);
        else if (hb && !stopped) {
            stopped = 1;
            df_log("%s: still running after %.1f s of waiting; no more heartbeats until it ends", what, waited);
        }
    }
    return (double)(df_now_ns() - t0) * 1e-9;
}
