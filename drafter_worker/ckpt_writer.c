/* ckpt_writer.c: one checkpoint write on a thread beside training. See ckpt_writer.h. */
#include "drafter_worker/ckpt_writer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "drafter_worker/hb_wait.h"
#include "util.h"

void ckpt_writer_init(ckpt_writer *w)
{
    memset(w, 0, sizeof *w);
    atomic_init(&w->done, 0);
    w->hb_limit_s = HB_WAIT_LIMIT_S;
}

static void *writer_main(void *arg)
{
    ckpt_writer *w = arg;
    uint64_t t0 = df_now_ns();
    if (w->fault_delay_ms > 0) /* tests: hold the write in flight (ckpt_writer.h) */
        usleep((useconds_t)w->fault_delay_ms * 1000u);
    w->res.rc =
        dflash_ckpt_save(w->root, &w->cfg, &w->p, w->has_opt ? &w->opt : NULL, &w->ts, w->res.err, sizeof w->res.err);
    w->res.write_s = (double)(df_now_ns() - t0) * 1e-9;
    atomic_store_explicit(&w->done, 1, memory_order_release);
    return NULL;
}

static void bufs_free(ckpt_writer *w)
{
    free(w->own_p), free(w->own_m), free(w->own_v);
    w->own_p = w->own_m = w->own_v = NULL;
    w->cap = 0;
}

/* Buffers for n floats each (kept between checkpoints: the size never changes in a run). */
static int reserve(ckpt_writer *w, size_t n, int with_opt)
{
    if (w->cap == n && w->own_p && (!with_opt || (w->own_m && w->own_v)))
        return 0;
    bufs_free(w);
    /* the first snapshot also faults every page in (on the 2-core CPU machine 8.7 s for a
     * 3.3 GB checkpoint of the 1.7B-shape drafter, the later ones 0.26 s: bench_ckpt_async) */
    w->own_p = malloc(n * sizeof(float));
    if (with_opt) {
        w->own_m = malloc(n * sizeof(float));
        w->own_v = malloc(n * sizeof(float));
    }
    w->cap = n;
    if (!w->own_p || (with_opt && (!w->own_m || !w->own_v))) {
        bufs_free(w);
        return -ENOMEM;
    }
    return 0;
}

int ckpt_writer_start(ckpt_writer *w, const char *root, const dflash_config *c, const dflash_params *p,
                      const adamw *opt, const dflash_train_state *ts, int copy, char *err, size_t errlen)
{
    if (w->running)
        return df_err(err, errlen, -EBUSY, "checkpoint of step %ld still pending (collect it first)", w->ts.step);
    if (strlen(root) >= sizeof w->root)
        return df_err(err, errlen, -ENAMETOOLONG, "%s: checkpoint root path too long", root);
    memset(&w->res, 0, sizeof w->res);
    w->res.step = ts->step;
    snprintf(w->root, sizeof w->root, "%s", root);
    w->cfg = *c;
    w->ts = *ts;
    w->has_opt = opt != NULL;
    if (opt && opt->n != p->n)
        return df_err(err, errlen, -EINVAL, "optimizer state has %zu values, the weights %zu", opt->n, p->n);
    uint64_t t0 = df_now_ns();
    if (copy) {
        if (reserve(w, p->n, opt != NULL) < 0)
            return df_err(err, errlen, -ENOMEM, "no memory for a %.2f GB checkpoint snapshot",
                          (double)p->n * 4.0 * (opt ? 3 : 1) / 1e9);
        memcpy(w->own_p, p->data, p->n * sizeof(float));
        dflash_params_bind(&w->p, c, w->own_p);
        if (opt) {
            memcpy(w->own_m, opt->m, opt->n * sizeof(float));
            memcpy(w->own_v, opt->v, opt->n * sizeof(float));
            w->opt = *opt;
            w->opt.m = w->own_m;
            w->opt.v = w->own_v;
        }
    } else {
        w->p = *p;
        w->p.owns = 0; /* a view: ckpt_writer_free must not free the caller's data */
        if (opt)
            w->opt = *opt;
    }
    w->res.snap_s = (double)(df_now_ns() - t0) * 1e-9;
    const char *f = getenv("DF_FAULT_CKPT_DELAY_MS");
    w->fault_delay_ms = f ? atoi(f) : 0;
    atomic_store_explicit(&w->done, 0, memory_order_relaxed);
    int rc = pthread_create(&w->th, NULL, writer_main, w);
    if (rc != 0)
        return df_err(err, errlen, -rc, "checkpoint thread: %s", strerror(rc));
    w->running = 1;
    return 0;
}

int ckpt_writer_pending(const ckpt_writer *w)
{
    return w->running;
}

int ckpt_writer_collect(ckpt_writer *w, int wait, void (*hb)(void *), void *hb_arg, ckpt_result *out)
{
    if (!w->running)
        return 0;
    if (!wait && !atomic_load_explicit(&w->done, memory_order_acquire))
        return 0;
    char what[64];
    snprintf(what, sizeof what, "checkpoint of step %ld", w->res.step);
    w->res.wait_s = hb_wait_join(w->th, hb, hb_arg, w->hb_limit_s, what);
    w->running = 0;
    *out = w->res;
    return 1;
}

void ckpt_writer_free(ckpt_writer *w)
{
    if (w->running) {
        pthread_join(w->th, NULL);
        w->running = 0;
    }
    bufs_free(w);
}
