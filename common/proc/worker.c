/* worker.c: the shared worker skeleton (see worker.h). */
#include "proc/worker.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

int worker_help(int argc, char **argv, const char *usage)
{
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs(usage, stdout);
        return 1;
    }
    return 0;
}

int worker_start(worker_ctx *k, const char *role, int argc, char **argv)
{
    memset(k, 0, sizeof *k);
    df_log_init(role);
    int rc = ctl_worker_start(&k->ctl, argc, argv);
    if (rc < 0)
        return rc;
    df_log_init(k->ctl.name);
    return 0;
}

static int ring_of(worker_ctx *k, ring *r, worker_ring *out)
{
    memset(out, 0, sizeof *out);
    arena *A = r ? ctl_ring_arena(&k->ctl, r) : NULL;
    if (!A || !A->base)
        return -ENOENT;
    out->r = r;
    out->A = A;
    out->slot_bytes = ctl_ring_slot_bytes(&k->ctl, r);
    return out->slot_bytes > 0 ? 0 : -ENOENT;
}

int worker_ring_in(worker_ctx *k, worker_ring *out)
{
    return ring_of(k, ctl_ring_in(&k->ctl), out);
}

int worker_ring_out(worker_ctx *k, worker_ring *out)
{
    return ring_of(k, ctl_ring_out(&k->ctl), out);
}

int worker_ready(worker_ctx *k, ring *in, ring *out)
{
    char mdir[1200];
    int n = snprintf(mdir, sizeof mdir, "%s/metrics", k->ctl.run_dir);
    if (n < 0 || (size_t)n >= sizeof mdir)
        return -ENAMETOOLONG;
    int rc = metrics_open(&k->mw, mdir, k->ctl.name, k->ctl.incarnation);
    if (rc < 0)
        return rc;
    k->have_metrics = 1;
    stage_init(&k->st, &k->mw, in, out, 1000000000ull);
    return ctl_ready(&k->ctl);
}

void worker_heartbeat(worker_ctx *k, uint64_t step)
{
    ctl_heartbeat(&k->ctl, step, k->st.items_total, k->st.tokens_total);
}

void worker_tick(worker_ctx *k, uint64_t step)
{
    worker_heartbeat(k, step);
    stage_tick(&k->st, 0);
}

void worker_idle(worker_ctx *k)
{
    usleep(100000);
    stage_wait(&k->st);
}

int worker_acquire_free(worker_ctx *k, ring *r, uint64_t step, uint32_t *slot)
{
    int rc;
    for (;;) {
        rc = ring_acquire_free(r, (uint16_t)k->ctl.id, k->ctl.incarnation, WORKER_WAIT_NS, slot);
        if (rc != -ETIMEDOUT)
            break;
        worker_tick(k, step);
    }
    stage_wait(&k->st);
    return rc;
}

int worker_acquire_ready(worker_ctx *k, ring *r, uint32_t *slot)
{
    return ring_acquire_ready(r, (uint16_t)k->ctl.id, k->ctl.incarnation, WORKER_WAIT_NS, slot);
}

void worker_finish(worker_ctx *k)
{
    stage_tick(&k->st, 1);
}

void worker_close(worker_ctx *k)
{
    if (k->have_metrics) {
        metrics_close(&k->mw);
        k->have_metrics = 0;
    }
    ctl_worker_close(&k->ctl);
}
