/* test_ring_stress.c: the ring + hand-off protocol under SIGKILL, with real processes.
 *
 *   producers (3) --ring A--> middles (3) --ring B--> consumers (3)
 *
 * Batch ids 0..N-1 are claimed from a shared table (one CAS per claim, a cursor as a
 * hint); a producer's claim is its hand-off input (external token), so a producer killed
 * between claiming and publishing does not lose the id, and one killed between
 * publishing and recording does not duplicate it. Payloads live in a second memfd arena,
 * one 512-byte region per ring slot, filled from the batch id; descriptors carry offset
 * and checksum. Middles copy A -> B with the hand-off intent; consumers verify the payload
 * and "commit" by fetch_add on a per-batch counter inside a hand-off whose output is
 * external (the commit), so recovery can ask whether it happened.
 *
 * The parent is the orchestrator and the killer: at >= --kills random progress points it
 * SIGKILLs a random worker, reaps it (waitpid), runs handoff_recover_ex and the claim
 * sweep for the dead worker id, and restarts it with incarnation+1 (each restart maps the
 * segments afresh from an fd, at another address). At the end every batch must have been
 * committed exactly once (count == 1), every checksum must match, nothing may be
 * poisoned (max_attempts is high) and every slot must be FREE.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ipc/arena.h"
#include "ipc/handoff.h"
#include "ipc/ring.h"
#include "ipc/shm.h"
#include "test_helpers.h"
#include "util.h"

enum { NPROD = 3, NMID = 3, NCONS = 3, NWORKERS = NPROD + NMID + NCONS };
enum { RING_A = 1, RING_B = 2, NSLOTS_A = 4, NSLOTS_B = 4, PAYLOAD = 512 };
enum { ROLE_PROD, ROLE_MID, ROLE_CONS };
#define MAX_ATTEMPTS 1000u
#define OWN_PENDING 0ull
#define OWN_IN_RING 1ull
#define OWN_CLAIMED(w, inc) ((1ull << 63) | ((uint64_t)(w) << 32) | (uint64_t)(inc))
#define WAIT_NS (50LL * 1000 * 1000)

/* A function, not a macro: the sweep below once passed atomic_load(...) to a macro that
 * read it twice; a claim by another producer turning into OWN_IN_RING (= 1) between the
 * two loads then looked "claimed by worker 0", and an in-ring batch went back to pending
 * and was produced twice (1 run in ~60). Read the owner word once, then decode it. */
static inline int own_is_claimed_by(uint64_t v, uint16_t w)
{
    return (v >> 63) && ((v >> 32) & 0x7fffffffu) == (uint64_t)w;
}

struct ctl {                                       /* the test's own shared state, after the rings in the segment */
    _Alignas(64) _Atomic uint64_t cursor;          /* claim hint: ids below are (mostly) taken */
    _Alignas(64) _Atomic uint64_t committed_total; /* progress for the kill points; may lag by
                                                     * the commits of killed consumers */
    _Alignas(64) _Atomic uint64_t bad_checksum;
    _Atomic uint64_t double_commit;
    _Atomic uint64_t redelivered;
};

static struct {
    uint64_t nbatches;
    arena seg, pay; /* parent's mappings; children remap from dup'd fds */
    uint64_t off_a, off_b, off_h, off_ctl, off_owner, off_count, seg_bytes;
} g;

typedef struct view { /* one process's mapping of everything */
    arena seg, pay;
    ring a, b;
    handoff_table t;
    struct ctl *c;
    _Atomic uint64_t *owner; /* [nbatches] OWN_* */
    _Atomic uint32_t *count; /* [nbatches] commits */
    unsigned char *payload;  /* [(NSLOTS_A + NSLOTS_B) * PAYLOAD] */
    uint64_t done_lo;        /* this process's scan: count[0..done_lo) are all committed */
} view;

static int view_map(view *v, int remap)
{
    arena_init(&v->seg);
    arena_init(&v->pay);
    if (remap) {
        int fd = arena_dup_fd(&g.seg, NULL, 0);
        if (fd < 0 || shm_import(&v->seg, fd) < 0)
            return -1;
        fd = arena_dup_fd(&g.pay, NULL, 0);
        if (fd < 0 || shm_import(&v->pay, fd) < 0)
            return -1;
    } else {
        v->seg = g.seg;
        v->pay = g.pay;
    }
    char *base = v->seg.base;
    if (ring_open(&v->a, base + g.off_a, g.off_b - g.off_a) < 0 ||
        ring_open(&v->b, base + g.off_b, g.off_h - g.off_b) < 0 ||
        handoff_open(&v->t, base + g.off_h, handoff_shm_bytes()) < 0)
        return -1;
    v->c = (struct ctl *)(base + g.off_ctl);
    v->owner = (_Atomic uint64_t *)(base + g.off_owner);
    v->count = (_Atomic uint32_t *)(base + g.off_count);
    v->payload = v->pay.base;
    v->done_lo = 0;
    return 0;
}

static void fill_payload(uint64_t batch, unsigned char *p)
{
    for (int i = 0; i < PAYLOAD / 8; i++) {
        uint64_t x = df_hash64(batch * (PAYLOAD / 8) + (uint64_t)i + 1);
        memcpy(p + 8 * i, &x, 8);
    }
}
static uint64_t expected_checksum(uint64_t batch)
{
    unsigned char p[PAYLOAD];
    fill_payload(batch, p);
    return df_fnv1a64(p, PAYLOAD, batch);
}

/* Done when every batch's commit counter is set. Not committed_total: a consumer killed
 * between its commit (count[b] 0 -> 1) and the total's increment leaves the total one short
 * for ever (recovery rightly sees the commit as made), and every worker would wait for a
 * batch that no longer exists. Counters never fall, so each process scans forward once. */
static int all_done(view *v)
{
    while (v->done_lo < g.nbatches && atomic_load(&v->count[v->done_lo]) > 0)
        v->done_lo++;
    return v->done_lo >= g.nbatches;
}

/* --- producer: claim an id, lease an A slot, write the payload, publish ----------------- */
static int claim_batch(view *v, uint16_t w, uint32_t inc, uint64_t *out)
{
    uint64_t from = atomic_load(&v->c->cursor);
    for (int pass = 0; pass < 2; pass++) {
        for (uint64_t b = from; b < g.nbatches; b++) {
            uint64_t expect = OWN_PENDING;
            if (atomic_load_explicit(&v->owner[b], memory_order_relaxed) != OWN_PENDING)
                continue;
            if (atomic_compare_exchange_strong(&v->owner[b], &expect, OWN_CLAIMED(w, inc))) {
                uint64_t cur = from; /* advance the hint unless someone moved it */
                atomic_compare_exchange_strong(&v->c->cursor, &cur, b + 1);
                *out = b;
                return 0;
            }
        }
        from = 0; /* safety net: a full sweep before saying there is nothing */
    }
    return -ENODATA;
}

static void producer(view *v, uint16_t w, uint32_t inc)
{
    while (!all_done(v)) {
        uint64_t b;
        if (claim_batch(v, w, inc, &b) < 0) {
            usleep(1000); /* everything is claimed; a reclaim may hand one back */
            continue;
        }
        uint32_t s;
        int rc;
        while ((rc = ring_acquire_free(&v->a, w, inc, WAIT_NS, &s)) == -ETIMEDOUT)
            if (all_done(v))
                _exit(0);
        DF_CHECK_ERR(rc);
        handoff_end in = {NULL, 0, b}, out = {&v->a, s, 0};
        DF_CHECK_ERR(handoff_begin(&v->t, w, inc, &in, &out));
        unsigned char *p = v->payload + (uint64_t)s * PAYLOAD;
        fill_payload(b, p);
        ring_desc *d = ring_desc_at(&v->a, s);
        memset(d, 0, sizeof *d);
        d->batch_id = b;
        d->arena_id = 0;
        d->offset = (uint64_t)s * PAYLOAD;
        d->bytes = PAYLOAD;
        d->checksum = df_fnv1a64(p, PAYLOAD, b);
        DF_CHECK_ERR(handoff_publish(&v->t, w, inc, &v->a, s));
        uint64_t expect = OWN_CLAIMED(w, inc);
        DF_CHECK(atomic_compare_exchange_strong(&v->owner[b], &expect, OWN_IN_RING));
        DF_CHECK_ERR(handoff_finish(&v->t, w, inc, NULL, 0));
    }
}

/* --- middle: A slot -> B slot under a hand-off intent ---------------------------------- */
static void middle(view *v, uint16_t w, uint32_t inc)
{
    while (!all_done(v)) {
        uint32_t si, so;
        int rc = ring_acquire_ready(&v->a, w, inc, WAIT_NS, &si);
        if (rc == -ETIMEDOUT)
            continue;
        DF_CHECK_ERR(rc);
        while ((rc = ring_acquire_free(&v->b, w, inc, WAIT_NS, &so)) == -ETIMEDOUT)
            DF_CHECK(!all_done(v)); /* cannot be done while we hold an uncommitted batch */
        DF_CHECK_ERR(rc);
        handoff_end in = {&v->a, si, 0}, out = {&v->b, so, 0};
        DF_CHECK_ERR(handoff_begin(&v->t, w, inc, &in, &out));
        const ring_desc *di = ring_desc_at(&v->a, si);
        ring_desc *dout = ring_desc_at(&v->b, so);
        const unsigned char *src = v->payload + di->offset;
        unsigned char *dst = v->payload + (uint64_t)(NSLOTS_A + so) * PAYLOAD;
        if (df_fnv1a64(src, PAYLOAD, di->batch_id) != di->checksum)
            atomic_fetch_add(&v->c->bad_checksum, 1);
        memcpy(dst, src, PAYLOAD);
        *dout = *di;
        dout->arena_id = 0;
        dout->offset = (uint64_t)(NSLOTS_A + so) * PAYLOAD;
        DF_CHECK_ERR(handoff_publish(&v->t, w, inc, &v->b, so));
        DF_CHECK_ERR(handoff_finish(&v->t, w, inc, &v->a, si));
    }
}

/* --- consumer: verify, commit once, release -------------------------------------------- */
static void consumer(view *v, uint16_t w, uint32_t inc)
{
    while (!all_done(v)) {
        uint32_t s;
        int rc = ring_acquire_ready(&v->b, w, inc, WAIT_NS, &s);
        if (rc == -ETIMEDOUT)
            continue;
        DF_CHECK_ERR(rc);
        const ring_desc *d = ring_desc_at(&v->b, s);
        uint64_t b = d->batch_id;
        DF_CHECK(b < g.nbatches);
        const unsigned char *p = v->payload + d->offset;
        if (d->checksum != expected_checksum(b) || df_fnv1a64(p, PAYLOAD, b) != d->checksum)
            atomic_fetch_add(&v->c->bad_checksum, 1);
        ring_slot_info info;
        DF_CHECK_ERR(ring_slot_read(&v->b, s, &info));
        if (info.attempts > 0)
            atomic_fetch_add(&v->c->redelivered, 1);
        handoff_end in = {&v->b, s, 0}, out = {NULL, 0, b};
        DF_CHECK_ERR(handoff_begin(&v->t, w, inc, &in, &out));
        /* the commit: one atomic RMW, observable by recovery (count > 0) */
        if (atomic_fetch_add(&v->count[b], 1) != 0)
            atomic_fetch_add(&v->c->double_commit, 1);
        else
            atomic_fetch_add(&v->c->committed_total, 1);
        DF_CHECK_ERR(handoff_mark_published(&v->t, w));
        DF_CHECK_ERR(handoff_finish(&v->t, w, inc, &v->b, s));
    }
}

static int role_of(int w)
{
    return w < NPROD ? ROLE_PROD : w < NPROD + NMID ? ROLE_MID : ROLE_CONS;
}

static pid_t spawn(int w, uint32_t inc)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    view v;
    if (view_map(&v, 1) < 0)
        df_die(1, "worker %d: cannot map the segments", w);
    switch (role_of(w)) {
    case ROLE_PROD: producer(&v, (uint16_t)w, inc); break;
    case ROLE_MID: middle(&v, (uint16_t)w, inc); break;
    default: consumer(&v, (uint16_t)w, inc); break;
    }
    _exit(0);
}

/* --- orchestrator-side recovery hooks ---------------------------------------------------- */
static view *g_pv;
static int hook_out_done(void *ctx, uint16_t worker, uint64_t token)
{
    return atomic_load(&g_pv->count[token]) > 0;
}
static void return_to_pending(uint64_t b)
{
    atomic_store(&g_pv->owner[b], OWN_PENDING);
    uint64_t cur = atomic_load(&g_pv->c->cursor);
    while (cur > b && !atomic_compare_exchange_weak(&g_pv->c->cursor, &cur, b))
        ;
}
static void hook_in_resolved(void *ctx, uint16_t worker, uint64_t token, int moved_on)
{
    uint64_t v = atomic_load(&g_pv->owner[token]);
    if (!own_is_claimed_by(v, worker))
        return; /* the producer had recorded it already */
    if (moved_on)
        atomic_store(&g_pv->owner[token], OWN_IN_RING);
    else
        return_to_pending(token);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: test_ring_stress [--batches N] [--kills K] [--seed S]\n"
               "  3 producers -> ring A -> 3 middles -> ring B -> 3 consumers, N batches\n"
               "  (default 100000), at least K SIGKILLs (default 150) with reclaim+restart.\n");
}

int main(int argc, char **argv)
{
    uint64_t nbatches = 100000, seed = 1;
    int kills_planned = 150;
    static const struct option opts[] = {
        {"batches", 1, 0, 'n'}, {"kills", 1, 0, 'k'}, {"seed", 1, 0, 's'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "n:k:s:h", opts, NULL)) != -1) {
        switch (o) {
        case 'n': nbatches = (uint64_t)df_arg_int("test_ring_stress", "-n", optarg, 1, INT64_MAX); break;
        case 'k': kills_planned = (int)df_arg_int("test_ring_stress", "-k", optarg, 0, INT_MAX); break;
        case 's': seed = strtoull(optarg, NULL, 10); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (nbatches == 0 || kills_planned < 0 || kills_planned > 10000) {
        fprintf(stderr, "test_ring_stress: --batches must be > 0 and --kills in [0, 10000]\n");
        return 2;
    }
    df_log_init("test_ring_stress");
    g.nbatches = nbatches;
    uint64_t rb_a = ring_shm_bytes(NSLOTS_A), rb_b = ring_shm_bytes(NSLOTS_B);
    g.off_a = 0;
    g.off_b = rb_a;
    g.off_h = g.off_b + rb_b;
    g.off_ctl = g.off_h + handoff_shm_bytes();
    g.off_owner = g.off_ctl + ((sizeof(struct ctl) + 63) & ~63ull);
    g.off_count = g.off_owner + nbatches * 8;
    g.seg_bytes = g.off_count + nbatches * 4;
    arena_init(&g.seg);
    arena_init(&g.pay);
    T_ASSERT_RC(shm_create(&g.seg, g.seg_bytes, "ring_stress_seg"));
    T_ASSERT_RC(shm_create(&g.pay, (NSLOTS_A + NSLOTS_B) * PAYLOAD, "ring_stress_payload"));
    char *base = g.seg.base;
    T_ASSERT_RC(ring_format(base + g.off_a, rb_a, NSLOTS_A, MAX_ATTEMPTS, RING_A));
    T_ASSERT_RC(ring_format(base + g.off_b, rb_b, NSLOTS_B, MAX_ATTEMPTS, RING_B));
    T_ASSERT_RC(handoff_format(base + g.off_h, handoff_shm_bytes()));
    view pv;
    T_ASSERT(view_map(&pv, 0) == 0);
    g_pv = &pv;

    /* kill points: random progress marks in [2%, 95%] of the batches, ascending */
    df_rng rng;
    df_rng_seed(&rng, seed);
    uint64_t *kill_at = calloc((size_t)kills_planned + 1, sizeof *kill_at);
    T_ASSERT(kill_at != NULL);
    for (int i = 0; i < kills_planned; i++)
        kill_at[i] = nbatches / 50 + df_rng_below(&rng, nbatches * 93 / 100 + 1);
    for (int i = 1; i < kills_planned; i++) /* insertion sort: small */
        for (int j = i; j > 0 && kill_at[j] < kill_at[j - 1]; j--) {
            uint64_t t = kill_at[j];
            kill_at[j] = kill_at[j - 1];
            kill_at[j - 1] = t;
        }

    pid_t pid[NWORKERS];
    uint32_t inc[NWORKERS];
    int finished[NWORKERS] = {0};
    int killed[NWORKERS] = {0}; /* SIGKILL sent, not reaped yet: do not count it twice */
    for (int w = 0; w < NWORKERS; w++) {
        inc[w] = 1;
        pid[w] = spawn(w, inc[w]);
        T_ASSERT(pid[w] > 0);
    }
    double t0 = df_wall_s();
    uint64_t deadline = df_now_ns() + 100ull * 1000 * 1000 * 1000;
    int kills = 0, restarts = 0, nfinished = 0;
    ring_reclaim_report total;
    memset(&total, 0, sizeof total);
    ring *rings[2] = {&pv.a, &pv.b};
    while (nfinished < NWORKERS) {
        int st;
        pid_t p;
        while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
            int w = 0;
            while (w < NWORKERS && pid[w] != p)
                w++;
            T_ASSERT(w < NWORKERS);
            pid[w] = 0;
            killed[w] = 0;
            if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
                finished[w] = 1;
                nfinished++;
                continue;
            }
            if (!(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)) {
                fprintf(stderr, "worker %d died on its own (status 0x%x): see its message above\n", w, st);
                exit(1);
            }
            /* reaped: now, and only now, its leases may be reclaimed */
            ring_reclaim_report rep;
            memset(&rep, 0, sizeof rep);
            handoff_hooks hooks = {hook_out_done, hook_in_resolved, NULL};
            T_ASSERT_RC(handoff_recover_ex(&pv.t, (uint16_t)w, rings, 2, &hooks, &rep));
            if (role_of(w) == ROLE_PROD) /* claims it never got to record in an intent */
                for (uint64_t b = 0; b < nbatches; b++)
                    if (own_is_claimed_by(atomic_load(&pv.owner[b]), (uint16_t)w))
                        return_to_pending(b);
            total.freed += rep.freed;
            total.requeued += rep.requeued;
            total.poisoned += rep.poisoned;
            total.handed_on += rep.handed_on;
            total.intents += rep.intents;
            T_ASSERT(rep.poisoned == 0);
            inc[w]++;
            pid[w] = spawn(w, inc[w]);
            T_ASSERT(pid[w] > 0);
            restarts++;
        }
        if (p < 0 && errno != ECHILD) {
            perror("waitpid");
            exit(1);
        }
        uint64_t done = atomic_load(&pv.c->committed_total);
        if (kills < kills_planned && done >= kill_at[kills]) {
            int w = (int)df_rng_below(&rng, NWORKERS);
            if (pid[w] > 0 && !finished[w] && !killed[w]) {
                T_ASSERT(kill(pid[w], SIGKILL) == 0);
                killed[w] = 1;
                kills++;
            }
        }
        if (df_now_ns() > deadline) {
            ring_stats sa, sb;
            ring_stats_read(&pv.a, &sa);
            ring_stats_read(&pv.b, &sb);
            fprintf(stderr,
                    "TIMEOUT: %llu/%llu committed; A free %u wr %u ready %u rd %u; "
                    "B free %u wr %u ready %u rd %u\n",
                    (unsigned long long)done, (unsigned long long)nbatches, sa.free, sa.writing, sa.ready, sa.reading,
                    sb.free, sb.writing, sb.ready, sb.reading);
            for (uint64_t b = 0, shown = 0; b < nbatches && shown < 10; b++)
                if (atomic_load(&pv.count[b]) != 1) {
                    fprintf(stderr, "  batch %llu: count %u owner 0x%llx\n", (unsigned long long)b,
                            atomic_load(&pv.count[b]), (unsigned long long)atomic_load(&pv.owner[b]));
                    shown++;
                }
            for (int w = 0; w < NWORKERS; w++)
                if (pid[w] > 0)
                    kill(pid[w], SIGKILL);
            exit(1);
        }
        usleep(200 + (useconds_t)df_rng_below(&rng, 600)); /* random moments */
    }
    double secs = df_wall_s() - t0;

    /* --- verdict --- */
    uint64_t not_once = 0;
    for (uint64_t b = 0; b < nbatches; b++)
        if (atomic_load(&pv.count[b]) != 1) {
            if (not_once < 10)
                fprintf(stderr, "batch %llu committed %u times\n", (unsigned long long)b, atomic_load(&pv.count[b]));
            not_once++;
        }
    ring_stats sa, sb;
    ring_stats_read(&pv.a, &sa);
    ring_stats_read(&pv.b, &sb);
    printf("ring stress: %llu batches, %d kills, %d restarts, %.2f s (%.0f batches/s), seed %llu\n",
           (unsigned long long)nbatches, kills, restarts, secs, (double)nbatches / secs, (unsigned long long)seed);
    printf("  recovery: %u intents resolved, %u inputs handed on, %u slots freed, %u requeued, "
           "%u poisoned; %llu redeliveries seen by consumers\n",
           total.intents, total.handed_on, total.freed, total.requeued, total.poisoned,
           (unsigned long long)atomic_load(&pv.c->redelivered));
    printf("  verdict: %llu batches not committed exactly once, %llu double commits, "
           "%llu bad checksums\n",
           (unsigned long long)not_once, (unsigned long long)atomic_load(&pv.c->double_commit),
           (unsigned long long)atomic_load(&pv.c->bad_checksum));
    T_ASSERT(not_once == 0);
    T_ASSERT(atomic_load(&pv.c->double_commit) == 0);
    T_ASSERT(atomic_load(&pv.c->bad_checksum) == 0);
    T_ASSERT(total.poisoned == 0 && sa.poisoned_total == 0 && sb.poisoned_total == 0);
    T_ASSERT(kills >= kills_planned);
    T_ASSERT(sa.free == NSLOTS_A && sb.free == NSLOTS_B); /* no lease outlives the run */
    /* published counts tickets; a publisher killed between ticket and CAS wastes one */
    T_ASSERT(sa.published >= sa.released && sb.published >= sb.released);
    free(kill_at);
    arena_close(&g.seg);
    arena_close(&g.pay);
    printf("test_ring_stress: passed\n");
    return 0;
}
