/* bench_env.h: what every benchmark's JSON records about where it ran (commit, host,
 * cpus, UTC date) and the median it reports. Header-only: the benches are one file each. */
#ifndef DF_BENCH_ENV_H
#define DF_BENCH_ENV_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct bench_env {
    char commit[64]; /* git rev-parse --short=12 HEAD, or "unknown" */
    char host[128];
    char date[32]; /* 2026-12-03T06:31:14Z */
    long cpus;
} bench_env;

static inline void bench_env_read(bench_env *e)
{
    memset(e, 0, sizeof *e);
    snprintf(e->commit, sizeof e->commit, "unknown");
    FILE *f = popen("git rev-parse --short=12 HEAD 2>/dev/null", "r");
    if (f) {
        if (fgets(e->commit, (int)sizeof e->commit, f))
            e->commit[strcspn(e->commit, "\n")] = 0;
        pclose(f);
    }
    if (gethostname(e->host, sizeof e->host - 1) < 0)
        snprintf(e->host, sizeof e->host, "unknown");
    time_t now = time(NULL);
    struct tm tmv;
    strftime(e->date, sizeof e->date, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tmv));
    e->cpus = sysconf(_SC_NPROCESSORS_ONLN);
}

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* the median of v[n] (n >= 1); sorts v */
static inline double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
