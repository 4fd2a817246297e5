/* par.c: a loop split over threads. See par.h. */
#include "par.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

typedef struct par_part {
    void (*fn)(void *ctx, uint64_t lo, uint64_t hi, int part);
    void *ctx;
    uint64_t lo, hi;
    int part;
} par_part;

static void *part_main(void *arg)
{
    par_part *p = arg;
    p->fn(p->ctx, p->lo, p->hi, p->part);
    return NULL;
}

int par_threads(void)
{
    static _Atomic int cached; /* sysconf reads /sys: once per process, not once per loop */
    int c = atomic_load_explicit(&cached, memory_order_relaxed);
    if (c == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        c = n < 1 ? 1 : n > PAR_MAX_THREADS ? PAR_MAX_THREADS : (int)n;
        atomic_store_explicit(&cached, c, memory_order_relaxed);
    }
    return c;
}

int par_for(uint64_t n, uint64_t min_per_part, void (*fn)(void *ctx, uint64_t lo, uint64_t hi, int part), void *ctx)
{
    if (n == 0)
        return 0;
    if (min_per_part == 0)
        min_per_part = 1;
    uint64_t k = n / min_per_part; /* small loops (a row, a norm) stay here without asking */
    if (k > 1 && k > (uint64_t)par_threads())
        k = (uint64_t)par_threads();
    if (k <= 1) {
        fn(ctx, 0, n, 0);
        return 1;
    }
    par_part parts[PAR_MAX_THREADS];
    pthread_t th[PAR_MAX_THREADS];
    int started[PAR_MAX_THREADS] = {0};
    for (uint64_t i = 0; i < k; i++)
        parts[i] = (par_part){fn, ctx, n * i / k, n * (i + 1) / k, (int)i};
    for (uint64_t i = 0; i + 1 < k; i++)
        started[i] = pthread_create(&th[i], NULL, part_main, &parts[i]) == 0;
    part_main(&parts[k - 1]);
    for (uint64_t i = 0; i + 1 < k; i++) {
        if (started[i])
            pthread_join(th[i], NULL);
        else
            part_main(&parts[i]);
    }
    return (int)k;
}
