/* fake_worker_main.c: a real worker without a model, for testing the orchestrator, the
 * rings, the hand-off protocol and the ledger end to end (role "test", or any role when a
 * test points binaries.dir at a directory of symlinks to it).
 *
 * It uses common/ipc/ctl.h exactly like the real workers. Its shape follows its rings:
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
 *   DF_FAKE_FAULT_INCS=K  the three above apply only to incarnations <= K (default: all)
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

#include "ipc/ctl.h"
#include "util.h"

#define PAYLOAD_MAX 4096
#define WAIT_NS (50 * 1000000ll)

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
    ctl_worker w;
    ring *in, *out;
    long crash_at, hang_at, slow_ms, max_items, ckpt_every;
    uint64_t items, tokens, step, last_ckpt;
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

static uint8_t *slot_ptr(fake *f, ring *r, uint32_t slot)
{
    arena *a = ctl_ring_arena(&f->w, r);
    DF_CHECK(a && a->kind == ARENA_CPU);
    return (uint8_t *)a->base + (uint64_t)slot * ctl_ring_slot_bytes(&f->w, r);
}

static int wait_free(fake *f, ring *r, uint32_t *slot)
{
    for (;;) {
        ctl_heartbeat(&f->w, f->step, f->items, f->tokens);
        int rc = ring_acquire_free(r, (uint16_t)f->w.id, f->w.incarnation, WAIT_NS, slot);
        if (rc != -ETIMEDOUT)
            return rc;
        if (ctl_should_stop(&f->w))
            return -EINTR;
    }
}

static void producer(fake *f)
{
    ledger *l = ctl_ledger(&f->w);
    handoff_table *h = ctl_handoff(&f->w);
    uint16_t id = (uint16_t)f->w.id;
    uint32_t inc = f->w.incarnation;
    uint64_t sb = ctl_ring_slot_bytes(&f->w, f->out);
    while (!ctl_should_stop(&f->w) && (f->max_items <= 0 || f->items < (uint64_t)f->max_items)) {
        ctl_heartbeat(&f->w, f->step, f->items, f->tokens);
        if (ctl_paused(&f->w)) {
            sleep_ms(10);
            continue;
        }
        if (ctl_stop_claiming(&f->w))
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
        uint8_t *p = slot_ptr(f, f->out, slot);
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
        f->items++;
        f->tokens += tokens;
        f->step = f->items;
        if (f->slow_ms > 0)
            sleep_ms(f->slow_ms);
    }
}

static void verify(fake *f, ring *r, uint32_t slot, const ring_desc *d)
{
    uint8_t *p = slot_ptr(f, r, slot);
    uint64_t sum = df_fnv1a64(p, d->bytes, 0);
    if (sum != d->checksum) {
        df_die(3, "batch %llu in ring %s slot %u: checksum %016llx, descriptor says %016llx",
               (unsigned long long)d->batch_id, f->w.topo.rings[ring_id(r)].name, slot, (unsigned long long)sum,
               (unsigned long long)d->checksum);
    }
}

static void checkpoint(fake *f)
{
    if (f->step > f->last_ckpt) {
        DF_CHECK_ERR(ctl_send_checkpoint(&f->w, f->step));
        f->last_ckpt = f->step;
    }
}

/* consumer or middle stage */
static void consumer(fake *f)
{
    ledger *l = ctl_ledger(&f->w);
    handoff_table *h = ctl_handoff(&f->w);
    uint16_t id = (uint16_t)f->w.id;
    uint32_t inc = f->w.incarnation;
    f->step = f->last_ckpt = f->w.committed_step; /* "resume from the last checkpoint" */
    int final_sent = 0;
    while (!ctl_should_stop(&f->w) && (f->max_items <= 0 || f->items < (uint64_t)f->max_items)) {
        ctl_heartbeat(&f->w, f->step, f->items, f->tokens);
        if (!f->out && ctl_checkpoint_requested(&f->w))
            checkpoint(f);
        if (ctl_paused(&f->w)) {
            sleep_ms(10);
            continue;
        }
        uint32_t slot;
        int rc = ring_acquire_ready(f->in, id, inc, WAIT_NS, &slot);
        if (rc == -EPIPE)
            break; /* upstream gone and the ring is empty: drained */
        if (rc == -ETIMEDOUT) {
            if (!f->out && !ctl_stop_claiming(&f->w)) {
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
        verify(f, f->in, slot, &d);
        if (f->out) {
            uint32_t os;
            rc = wait_free(f, f->out, &os);
            if (rc == -EINTR || rc == -EPIPE)
                break; /* the orchestrator requeues the input */
            DF_CHECK_ERR(rc);
            handoff_end in = {.r = f->in, .slot = slot}, out = {.r = f->out, .slot = os};
            DF_CHECK_ERR(handoff_begin(h, id, inc, &in, &out));
            uint64_t sb = ctl_ring_slot_bytes(&f->w, f->out);
            memcpy(slot_ptr(f, f->out, os), slot_ptr(f, f->in, slot), d.bytes);
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
        f->items++;
        f->tokens += d.user[1];
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
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: fake_worker  (started by the orchestrator; see tests/fake_worker_main.c)\n"
               "A test worker: produces, forwards or consumes batches according to its rings.\n"
               "Fault injection: DF_FAKE_EXIT, DF_FAKE_CRASH_AT, DF_FAKE_HANG_AT, DF_FAKE_FAULT_INCS,\n"
               "DF_FAKE_SLOW_MS, DF_FAKE_STEPS, DF_FAKE_CKPT_EVERY, DF_FAKE_LOAD_MS.\n");
        return 0;
    }
    static fake f;
    memset(&f, 0, sizeof f);
    DF_CHECK_ERR(ctl_worker_start(&f.w, argc, argv));
    int faults = (long)f.w.incarnation <= env_num("DF_FAKE_FAULT_INCS", 1l << 30);
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
    f.in = ctl_ring_in(&f.w);
    f.out = ctl_ring_out(&f.w);
    DF_CHECK(f.in || f.out);
    long load = env_num("DF_FAKE_LOAD_MS", 0);
    if (load > 0)
        sleep_ms(load);
    df_log("incarnation %u: %s (in %s, out %s), committed step %llu", f.w.incarnation,
           f.in && f.out ? "middle stage" : f.out ? "producer" : "consumer",
           f.in ? f.w.topo.rings[f.w.self->in_ring].name : "-", f.out ? f.w.topo.rings[f.w.self->out_ring].name : "-",
           (unsigned long long)f.w.committed_step);
    DF_CHECK_ERR(ctl_ready(&f.w));
    if (f.in)
        consumer(&f);
    else
        producer(&f);
    df_log("done: %llu items, step %llu%s", (unsigned long long)f.items, (unsigned long long)f.step,
           ctl_should_stop(&f.w) ? " (asked to stop)" : "");
    ctl_worker_close(&f.w);
    return 0;
}
