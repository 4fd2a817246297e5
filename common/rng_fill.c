/* rng_fill.c: df_rng_fill_normal (rng_fill.h). */
#include "rng_fill.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct normal_job {
    const double *u; /* 2 uniforms per value: u1, u2 as df_rng_normal draws them */
    float *out;
    size_t n;
    double std;
} normal_job;

static void *normal_work(void *arg)
{
    const normal_job *j = arg;
    for (size_t i = 0; i < j->n; i++)
        j->out[i] = (float)(j->std * df_normal_of(j->u[2 * i], j->u[2 * i + 1]));
    return NULL;
}

static void draw(df_rng *r, double *u, size_t n_values)
{
    for (size_t i = 0; i < 2 * n_values; i++)
        u[i] = df_rng_uniform(r);
}

void df_rng_fill_normal(df_rng *r, float *out, size_t n, double std, int threads)
{
    if (threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        threads = c < 1 ? 1 : (int)DF_MIN(c, (long)DF_RNG_FILL_MAX_THREADS);
    }
    threads = DF_MIN(threads, DF_RNG_FILL_MAX_THREADS);
    const size_t CH = DF_RNG_FILL_CHUNK;
    double *buf = threads > 1 && n > CH ? malloc(4 * CH * sizeof(double)) : NULL;
    if (!buf) { /* small fills, one thread, or no memory: the plain loop */
        for (size_t i = 0; i < n; i++)
            out[i] = (float)(std * df_rng_normal(r));
        return;
    }
    double *u[2] = {buf, buf + 2 * CH};
    int cur = 0;
    size_t done = 0;
    draw(r, u[cur], DF_MIN(CH, n));
    while (done < n) {
        size_t m = DF_MIN(CH, n - done), per = (m + (size_t)threads - 1) / (size_t)threads;
        pthread_t th[DF_RNG_FILL_MAX_THREADS];
        normal_job job[DF_RNG_FILL_MAX_THREADS];
        int started[DF_RNG_FILL_MAX_THREADS] = {0}, nj = 0;
        for (size_t a = 0; a < m; a += per, nj++) {
            job[nj] = (normal_job){u[cur] + 2 * a, out + done + a, DF_MIN(per, m - a), std};
            started[nj] = pthread_create(&th[nj], NULL, normal_work, &job[nj]) == 0;
            if (!started[nj])
                normal_work(&job[nj]);
        }
        size_t next = DF_MIN(CH, n - done - m); /* the next chunk's uniforms, meanwhile */
        if (next)
            draw(r, u[cur ^ 1], next);
        for (int k = 0; k < nj; k++)
            if (started[k])
                pthread_join(th[k], NULL);
        done += m;
        cur ^= 1;
    }
    free(buf);
}
