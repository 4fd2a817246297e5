/* fake_worker_main.c: a real worker without a model, for testing the orchestrator, the
 * rings, the hand-off protocol and the ledger end to end (role "test", or any role when a
 * test points binaries.dir at a directory of symlinks to it).
 *
 * It is built on the worker skeleton (common/proc/worker.h) like the real workers: start,
 * rings, metrics and stage figures, heartbeats, close; what is its own is the payload, the
 * checks and the fault injection below. Its shape follows its rings:
 *   out ring only   producer: claims ledger batches, writes a deterministic payload (from
 *                   the batch id) with its checksum into the slot, publishes, set_in_ring
 *   in ring only    consumer: verifies the checksum, marks the batch trained at its next
 *                   step, sends {"ev":"checkpoint","step":N} every DF_FAKE_CKPT_EVERY steps,
 *                   on `dfctl checkpoint` and at the end
 *   both            middle stage: copies the payload from its input slot into an output slot
 * Every hand-off goes through handoff.h, so a kill at any point is recoverable.
 *
 * It ends with exit 0 when its work is over: producers when the ledger's epoch is done or
 * the run drains (stop-claiming); consumers when their input ring is closed and empty, or
 * (final consumers) when every batch is trained and the epoch is committed.
 *
 * Fault injection (environment, e.g. from the topology's per-worker "env"):
 *   DF_FAKE_EXIT=C        exit with code C right after start (100 = permanent failure)
 *   DF_FAKE_CRASH_AT=N    abort() while holding the lease of its N-th item
 *   DF_FAKE_HANG_AT=N     stop heartbeating forever at its N-th item
 *   DF_FAKE_FAULT_INCS=K  the three above and DF_FAKE_LOAD_MS apply only to incarnations <= K
 *                         (default: all)
 *   DF_FAKE_SLOW_MS=M     sleep M ms per item
 *   DF_FAKE_STEPS=N       handle at most N items, then exit 0
 *   DF_FAKE_CKPT_EVERY=K  consumer checkpoint period in steps (default 4)
 *   DF_FAKE_LOAD_MS=M     sleep M ms before READY (a slow model load)
 * A checksum mismatch or a batch trained twice is fatal (exit 3), so tests see it.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "proc/worker.h"
#include "util.h"

#define PAYLOAD_MAX 4096

static long env_num(const char *k, long def)
{
    const char *v = getenv(k);
    return v && *v ? strtol(v, NULL, 10) : def;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000l};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

typedef struct fake {
    worker_ctx k;
    worker_ring rin, rout; /* rin.r / rout.r NULL when the topology gives none */
    ring *in, *out;
    long crash_at, hang_at, slow_ms, max_items, ckpt_every;
    uint64_t items, step, last_ckpt; /* items: handled by this incarnation (DF_FAKE_STEPS) */
} fake;

/* Called with a lease held: the fault points. */
static void fault_point(fake *f)
{
    uint64_t n = f->items + 1;
    if (f->crash_at > 0 && n == (uint64_t)f->crash_at) {
        df_log("DF_FAKE_CRASH_AT=%ld: abort() with a lease held", f->crash_at);
        abort();
    }
    if (f->hang_at > 0 && n == (uint64_t)f->hang_at) {
        df_log("DF_FAKE_HANG_AT=%ld: hanging (no more heartbeats)", f->hang_at);
        for (;;)
            sleep_ms(1000);
    }
}

static void fill_payload(uint8_t *p, uint64_t bytes, uint64_t batch)
{
    df_rng r;
    df_rng_seed(&r, batch * 0x9E3779B97F4A7C15ull + 1);
    for (uint64_t i = 0; i < bytes; i += 8) {
        uint64_t x = df_rng_next(&r);
        memcpy(p + i, &x, DF_MIN(8, bytes - i));
    }
}

static uint8_t *slot_ptr(const worker_ring *r, uint32_t slot)
{
    DF_CHECK(r->A->kind == ARENA_CPU);
    return (uint8_t *)r->A->base + (uint64_t)slot * r->slot_bytes;
}

/* worker_acquire_free, but a stop request (dfctl stop) ends the wait: -EINTR */
static int wait_free(fake *f, ring *r, uint32_t *slot)
{
    for (;;) {
        worker_tick(&f->k, f->step);
        int rc = ring_acquire_free(r, (uint16_t)f->k.ctl.id, f->k.ctl.incarnation, WORKER_WAIT_NS, slot);
        if (rc != -ETIMEDOUT)
            return rc;
        if (ctl_should_stop(&f->k.ctl))
            return -EINTR;
    }
}

static void counted(fake *f, uint64_t tokens)
{
    f->items++;
    stage_count(&f->k.st, 1, tokens);
}

static void producer(fake *f)
{
    ledger *l = ctl_ledger(&f->k.ctl);
    handoff_table *h = ctl_handoff(&f->k.ctl);
    uint16_t id = (uint16_t)f->k.ctl.id;
    uint32_t inc = f->k.ctl.incarnation;
    uint64_t sb = f->rout.slot_bytes;
    while (!ctl_should_stop(&f->k.ctl) && (f->max_items <= 0 || f->items < (uint64_t)f->max_items)) {
        worker_tick(&f->k, f->step);
        if (ctl_paused(&f->k.ctl)) {
            worker_idle(&f->k);
            continue;
        }
        if (ctl_stop_claiming(&f->k.ctl))
            break;
        uint64_t b;
        int rc = ledger_claim_next(l, id, inc, &b);
        if (rc == -ENODATA) {
            if (ledger_epoch_done(l))
                break;
            sleep_ms(20); /* batches may come back (a consumer died, a rewind) */
            continue;
        }
        DF_CHECK_ERR(rc);
        uint32_t slot;
        rc = wait_free(f, f->out, &slot);
        if (rc == -EINTR || rc == -EPIPE)
            break; /* the orchestrator returns the claimed batch to pending */
        DF_CHECK_ERR(rc);
        handoff_end in = {.r = NULL, .token = b}, out = {.r = f->out, .slot = slot};
        DF_CHECK_ERR(handoff_begin(h, id, inc, &in, &out));
        uint64_t bytes = DF_MIN((uint64_t)PAYLOAD_MAX, sb);
        uint8_t *p = slot_ptr(&f->rout, slot);
        fill_payload(p, bytes, b);
        ring_desc *d = ring_desc_at(f->out, slot);
        memset(d, 0, sizeof *d);
        d->batch_id = b;
        d->offset = (uint64_t)slot * sb;
        d->bytes = bytes;
        d->arena_id = ring_id(f->out);
        d->checksum = df_fnv1a64(p, bytes, 0);
        d->user[0] = id;
        const uint32_t *idx, *len;
        uint32_t n;
        uint64_t tokens = 0;
        if (ledger_batch_info(l, b, &idx, &len, &n, &tokens) == 0)
            d->user[1] = tokens;
        fault_point(f);
        DF_CHECK_ERR(handoff_publish(h, id, inc, f->out, slot));
        rc = ledger_set_in_ring(l, b);
        DF_CHECK(rc == 0 || rc == -EALREADY);
        DF_CHECK_ERR(handoff_finish(h, id, inc, NULL, 0));
        counted(f, tokens);
        f->step = f->items;
        if (f->slow_ms > 0)
            sleep_ms(f->slow_ms);
    }
}

static void verify(fake *f, const worker_ring *r, uint32_t slot, const ring_desc *d)
{
    uint8_t *p = slot_ptr(r, slot);
    uint64_t sum = df_fnv1a64(p, d->bytes, 0);
    if (sum != d->checksum) {
        df_die(3, "batch %llu in ring %s slot %u: checksum %016llx, descriptor says %016llx",
               (unsigned long long)d->batch_id, f->k.ctl.topo.rings[ring_id(r->r)].name, slot, (unsigned long long)sum,
               (unsigned long long)d->checksum);
    }
}

static void checkpoint(fake *f)
{
    if (f->step > f->last_ckpt) {
        DF_CHECK_ERR(ctl_send_checkpoint(&f->k.ctl, f->step));
        f->last_ckpt = f->step;
    }
}

/* consumer or middle stage */
static void consumer(fake *f)
{
    ledger *l = ctl_ledger(&f->k.ctl);
    handoff_table *h = ctl_handoff(&f->k.ctl);
    uint16_t id = (uint16_t)f->k.ctl.id;
    uint32_t inc = f->k.ctl.incarnation;
    f->step = f->last_ckpt = f->k.ctl.committed_step; /* "resume from the last checkpoint" */
    int final_sent = 0;
    while (!ctl_should_stop(&f->k.ctl) && (f->max_items <= 0 || f->items < (uint64_t)f->max_items)) {
        worker_tick(&f->k, f->step);
        if (!f->out && ctl_checkpoint_requested(&f->k.ctl))
            checkpoint(f);
        if (ctl_paused(&f->k.ctl)) {
            worker_idle(&f->k);
            continue;
        }
        uint32_t slot;
        int rc = worker_acquire_ready(&f->k, f->in, &slot);
        if (rc == -EPIPE)
            break; /* upstream gone and the ring is empty: drained */
        if (rc == -ETIMEDOUT) {
            if (!f->out && !ctl_stop_claiming(&f->k.ctl)) {
                ledger_counts_t c;
                ledger_counts(l, &c);
                if (c.pending + c.claimed + c.in_ring == 0) {
                    if (!final_sent || f->step > f->last_ckpt) {
                        checkpoint(f);
                        final_sent = 1;
                    }
                    if (ledger_epoch_done(l))
                        break;
                }
            }
            continue;
        }
        DF_CHECK_ERR(rc);
        ring_desc d = *ring_desc_at(f->in, slot);
        verify(f, &f->rin, slot, &d);
        if (f->out) {
            uint32_t os;
            rc = wait_free(f, f->out, &os);
            if (rc == -EINTR || rc == -EPIPE)
                break; /* the orchestrator requeues the input */
            DF_CHECK_ERR(rc);
            handoff_end in = {.r = f->in, .slot = slot}, out = {.r = f->out, .slot = os};
            DF_CHECK_ERR(handoff_begin(h, id, inc, &in, &out));
            uint64_t sb = f->rout.slot_bytes;
            memcpy(slot_ptr(&f->rout, os), slot_ptr(&f->rin, slot), d.bytes);
            ring_desc *od = ring_desc_at(f->out, os);
            *od = d;
            od->offset = (uint64_t)os * sb;
            od->arena_id = ring_id(f->out);
            fault_point(f);
            DF_CHECK_ERR(handoff_publish(h, id, inc, f->out, os));
            DF_CHECK_ERR(handoff_finish(h, id, inc, f->in, slot));
        } else {
            handoff_end in = {.r = f->in, .slot = slot}, out = {.r = NULL, .token = d.batch_id};
            DF_CHECK_ERR(handoff_begin(h, id, inc, &in, &out));
            fault_point(f);
            rc = ledger_mark_trained(l, d.batch_id, f->step + 1);
            if (rc == -EALREADY)
                df_die(3, "batch %llu was already trained: it came twice", (unsigned long long)d.batch_id);
            DF_CHECK_ERR(rc);
            f->step++;
            DF_CHECK_ERR(handoff_mark_published(h, id));
            DF_CHECK_ERR(handoff_finish(h, id, inc, f->in, slot));
            if (f->ckpt_every > 0 && f->step - f->last_ckpt >= (uint64_t)f->ckpt_every)
                checkpoint(f);
        }
        counted(f, d.user[1]);
        if (f->out)
            f->step = f->items;
        if (f->slow_ms > 0)
            sleep_ms(f->slow_ms);
    }
    if (!f->out)
        checkpoint(f); /* drain or SIGTERM: keep what was trained */
}

int main(int argc, char **argv)
{
    if (worker_help(argc, argv,
                    "usage: fake_worker  (started by the orchestrator; see tests/fake_worker_main.c)\n"
                    "A test worker: produces, forwards or consumes batches according to its rings.\n"
                    "Fault injection: DF_FAKE_EXIT, DF_FAKE_CRASH_AT, DF_FAKE_HANG_AT, DF_FAKE_FAULT_INCS,\n"
                    "DF_FAKE_SLOW_MS, DF_FAKE_STEPS, DF_FAKE_CKPT_EVERY, DF_FAKE_LOAD_MS.\n"))
        return 0;
    static fake f;
    memset(&f, 0, sizeof f);
    DF_CHECK_ERR(worker_start(&f.k, "fake_worker", argc, argv));
    int faults = (long)f.k.ctl.incarnation <= env_num("DF_FAKE_FAULT_INCS", 1l << 30);
    long code = env_num("DF_FAKE_EXIT", -1);
    if (faults && code >= 0) {
        df_log("DF_FAKE_EXIT=%ld: exiting at start", code);
        return (int)code;
    }
    f.crash_at = faults ? env_num("DF_FAKE_CRASH_AT", 0) : 0;
    f.hang_at = faults ? env_num("DF_FAKE_HANG_AT", 0) : 0;
    f.slow_ms = env_num("DF_FAKE_SLOW_MS", 0);
    f.max_items = env_num("DF_FAKE_STEPS", 0);
    f.ckpt_every = env_num("DF_FAKE_CKPT_EVERY", 4);
    if (worker_ring_in(&f.k, &f.rin) == 0)
        f.in = f.rin.r;
    if (worker_ring_out(&f.k, &f.rout) == 0)
        f.out = f.rout.r;
    DF_CHECK(f.in || f.out);
    long load = faults ? env_num("DF_FAKE_LOAD_MS", 0) : 0;
    if (load > 0)
        sleep_ms(load);
    ctl_worker *w = &f.k.ctl;
    df_log("incarnation %u: %s (in %s, out %s), committed step %llu", w->incarnation,
           f.in && f.out ? "middle stage"
           : f.out       ? "producer"
                         : "consumer",
           f.in ? w->topo.rings[w->self->in_ring].name : "-", f.out ? w->topo.rings[w->self->out_ring].name : "-",
           (unsigned long long)w->committed_step);
    DF_CHECK_ERR(worker_ready(&f.k, f.in, f.out));
    if (f.in)
        consumer(&f);
    else
        producer(&f);
    worker_finish(&f.k);
    df_log("done: %llu items, step %llu%s", (unsigned long long)f.items, (unsigned long long)f.step,
           ctl_should_stop(w) ? " (asked to stop)" : "");
    worker_close(&f.k);
    return 0;
}
