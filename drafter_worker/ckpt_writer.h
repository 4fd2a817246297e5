/* ckpt_writer.h: the drafter's checkpoint written on a thread while training goes on
 * (prefix ckpt_writer_).
 *
 * Why: a checkpoint of a Qwen3-8B-shape drafter with its AdamW moments is 12.6 GB; written
 * and hashed in the training loop it stopped training for ~25 s each time (and sent no
 * heartbeat meanwhile). Here the loop only takes a snapshot (the cuda backend's copy of the
 * weights to the host, which it needs anyway; a memcpy for the cpu backend, whose host
 * weights are the live ones) and hands it to one writer thread, which runs dflash_ckpt_save
 * unchanged. The loop collects the result when the thread is done and only then tells the
 * orchestrator: a checkpoint is announced (and the ledger commits its batches) once its
 * files and `latest` are on disk, exactly as before.
 *
 * One write at a time: the caller collects the result of the one in flight (waiting for it,
 * with its heartbeat) before it starts the next. What each death does:
 *   - the worker dies while the thread writes: the temp directory <root>/.tmp-step-N.<pid>
 *     stays behind, `latest` and the ledger still name the previous checkpoint, nothing was
 *     announced; dflash_ckpt_remove_partial (called when the next incarnation starts)
 *     deletes the leftover.
 *   - the write fails (full disk): the result carries the error; the caller counts it
 *     like a failed synchronous save (drafter.max_checkpoint_failures).
 *
 * Borrowed or copied: with copy = 0 the snapshot points at the caller's buffers, which
 * must not change until ckpt_writer_collect returned (the cuda backend's host copies only
 * change in trainer_to_host, which the worker never calls with a write in flight); copy =
 * 1 copies them into buffers the writer owns (allocated on first use, reused).
 *
 * Fault injection (tests): DF_FAULT_CKPT_DELAY_MS=N makes the thread wait N ms before it
 * writes, so a test can kill the worker with a write surely in flight.
 *
 * Errors: 0 or -errno with err set. */
#ifndef DF_CKPT_WRITER_H
#define DF_CKPT_WRITER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "dflash/adamw.h"
#include "dflash/dflash_ckpt.h"
#include "dflash/dflash_config.h"
#include "dflash/dflash_model.h"

typedef struct ckpt_result {
    long step;      /* the checkpoint's step */
    int rc;         /* dflash_ckpt_save's result */
    char err[768];  /* its message when rc < 0 */
    double snap_s;  /* the snapshot copy in ckpt_writer_start (the caller's thread; 0 when borrowed) */
    double write_s; /* the thread's dflash_ckpt_save */
    double wait_s;  /* what ckpt_writer_collect spent waiting for the thread */
} ckpt_result;

typedef struct ckpt_writer {
    pthread_t th;
    int running;     /* a thread was started and not joined */
    atomic_int done; /* set by the thread as its last act */
    char root[1200];
    dflash_config cfg;
    dflash_params p; /* the snapshot: views into own_p, or the caller's */
    adamw opt;
    int has_opt;
    dflash_train_state ts;
    float *own_p, *own_m, *own_v; /* copy = 1 buffers, [cap] floats each */
    size_t cap;
    int fault_delay_ms; /* DF_FAULT_CKPT_DELAY_MS */
    double hb_limit_s;  /* collect heartbeats for at most this long (HB_WAIT_LIMIT_S, hb_wait.h) */
    ckpt_result res;
} ckpt_writer;

void ckpt_writer_init(ckpt_writer *w);
/* Start writing (c, p, opt, ts) under root on the thread; opt may be NULL. -EBUSY while
 * the previous write is not collected (ckpt_writer_collect first: its result would be
 * lost); -ENOMEM when the copy buffers cannot be had; the thread's own error is in the
 * result. */
int ckpt_writer_start(ckpt_writer *w, const char *root, const dflash_config *c, const dflash_params *p,
                      const adamw *opt, const dflash_train_state *ts, int copy, char *err, size_t errlen);
/* 1 while a write was started and not collected. */
int ckpt_writer_pending(const ckpt_writer *w);
/* Collect the result of the write started last: with wait = 0 only when it has finished
 * (else returns 0), with wait = 1 after waiting for it (hb every 100 ms meanwhile, for the
 * first w->hb_limit_s seconds only). Returns 1 with *out filled, 0 when there was nothing
 * to collect. */
int ckpt_writer_collect(ckpt_writer *w, int wait, void (*hb)(void *), void *hb_arg, ckpt_result *out);
/* Wait for a write in flight (its result is dropped) and free the buffers. */
void ckpt_writer_free(ckpt_writer *w);

#endif
