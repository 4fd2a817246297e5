/* worker.c: the shared worker skeleton (see worker.h). */
#include "ipc/worker.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

int wk_help(int argc, char **argv, const char *usage)
{
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs(usage, stdout);
        return 1;
    }
    return 0;
}

int wk_start(wk_worker *k, const char *role, int argc, char **argv)
{
    memset(k, 0, sizeof *k);
    df_log_init(role);
    int rc = ctl_worker_start(&k->ctl, argc, argv);
    if (rc < 0)
        return rc;
    df_log_init(k->ctl.name);
    return 0;
}

static int ring_of(wk_worker *k, ring *r, wk_ring *out)
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

int wk_ring_in(wk_worker *k, wk_ring *out)
{
    return ring_of(k, ctl_ring_in(&k->ctl), out);
}

int wk_ring_out(wk_worker *k, wk_ring *out)
{
    return ring_of(k, ctl_ring_out(&k->ctl), out);
}

int wk_ready(wk_worker *k, ring *in, ring *out)
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

void wk_heartbeat(wk_worker *k, uint64_t step)
{
    ctl_heartbeat(&k->ctl, step, k->st.items_total, k->st.tokens_total);
}

void wk_tick(wk_worker *k, uint64_t step)
{
    wk_heartbeat(k, step);
    stage_tick(&k->st, 0);
}

void wk_idle(wk_worker *k)
{
    usleep(100000);
    stage_wait(&k->st);
}

int wk_acquire_free(wk_worker *k, ring *r, uint64_t step, uint32_t *slot)
{
    int rc;
    for (;;) {
        rc = ring_acquire_free(r, (uint16_t)k->ctl.id, k->ctl.incarnation, WK_WAIT_NS, slot);
        if (rc != -ETIMEDOUT)
            break;
        wk_tick(k, step);
    }
    stage_wait(&k->st);
    return rc;
}

int wk_acquire_ready(wk_worker *k, ring *r, uint32_t *slot)
{
    return ring_acquire_ready(r, (uint16_t)k->ctl.id, k->ctl.incarnation, WK_WAIT_NS, slot);
}

void wk_finish(wk_worker *k)
{
    stage_tick(&k->st, 1);
}

void wk_close(wk_worker *k)
{
    if (k->have_metrics) {
        metrics_close(&k->mw);
        k->have_metrics = 0;
    }
    ctl_worker_close(&k->ctl);
}
