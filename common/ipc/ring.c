/* ring.c: slot leases in shared memory with futex signalling. Protocol and rationale in
 * ring.h and docs/ring.md; the model of it is tests/ring_model.pml.
 *
 * MEMORY-ORDERING CONTRACT (which store pairs with which load):
 *  (1) Producer: plain stores to the descriptor and payload, relaxed stores to pub_seq,
 *      then the CAS WRITING->READY with release (acq_rel). Consumer: the CAS
 *      READY->READING with acquire (acq_rel) reads that value, so the descriptor and
 *      payload writes happen-before the consumer's reads of them.
 *  (2) Consumer: reads of descriptor/payload, then the CAS READING->FREE with release.
 *      Next producer: the CAS FREE->WRITING with acquire, so those reads happen-before the
 *      producer overwrites the slot (no write-after-read race on a recycled slot).
 *  (3) Reclaimer: acts only after waitpid() reaped the owner; the owner's last stores are
 *      visible (process exit and reaping are full barriers in the kernel). Its CASes are
 *      acq_rel like the owner's, so (1) and (2) hold for the slots it moves too; attempts
 *      is stored (relaxed) before its release CAS and read after an acquiring one.
 *  (4) Sleep/wake (no lost wake-up), on ready_seq / free_seq, all seq_cst:
 *        waker:  CAS on a control word; seq += 1; if (waiters > 0) futex_wake(all)
 *        waiter: s = seq; scan (fails); waiters += 1; if (seq == s) futex_wait(seq, s);
 *                waiters -= 1
 *      If the waker read waiters == 0, its seq += 1 precedes the waiter's waiters += 1 in
 *      the single seq_cst order, so the waiter's re-read of seq (and the kernel's compare)
 *      sees the new value and it does not sleep. Wake-all, not wake-one: a waiter that was
 *      woken and then SIGKILLed cannot swallow the only wake-up.
 *  (5) closed: stored seq_cst before both seq bumps; waiters read seq before closed, so a
 *      close either is seen by the check or changes seq under the futex compare.
 */
#include "ring.h"

#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "futex.h"
#include "util.h"

/* --- control word -------------------------------------------------------------- */
#define CTL_STATE(c) ((ring_state)((c)&0xFu))
#define CTL_WORKER(c) ((uint16_t)(((c) >> 4) & 0xFFFFu))
#define CTL_INC(c) ((uint32_t)(((c) >> 20) & RING_INC_MASK))
#define CTL_GEN(c) ((uint32_t)((c) >> 32))

static inline uint64_t ctl_make(ring_state st, uint16_t worker, uint32_t inc, uint32_t gen)
{
    return ((uint64_t)gen << 32) | ((uint64_t)(inc & RING_INC_MASK) << 20) | ((uint64_t)worker << 4) | (uint64_t)st;
}
/* The word after a transition from old to state st with owner (worker, inc). */
static inline uint64_t ctl_next(uint64_t old, ring_state st, uint16_t worker, uint32_t inc)
{
    return ctl_make(st, worker, inc, CTL_GEN(old) + 1u);
}

/* --- shared layout --------------------------------------------------------------- */
struct ring_hdr {         /* read-only after ring_format */
    uint64_t magic;       /* RING_MAGIC */
    uint32_t version;     /* RING_VERSION */
    uint32_t hdr_bytes;   /* sizeof(struct ring_shm) */
    uint64_t total_bytes; /* ring_shm_bytes(nslots) */
    uint32_t nslots;
    uint32_t record_bytes; /* sizeof(struct ring_slot): one control record per slot */
    uint32_t desc_bytes;   /* sizeof(ring_desc) */
    uint32_t max_attempts;
    uint32_t ring_id;
    uint32_t reserved0;
    uint64_t reserved[2];
};

struct ring_seq { /* one futex word and its waiter count; own cache line */
    _Alignas(DF_CACHELINE) _Atomic uint32_t seq;
    _Atomic uint32_t waiters;
};

struct ring_counter {
    _Alignas(DF_CACHELINE) _Atomic uint64_t v;
};

struct ring_slot {
    _Alignas(DF_CACHELINE) _Atomic uint64_t ctl; /* state|worker|inc|gen, see ring.h */
    _Atomic uint64_t pub_seq;                    /* publish ticket of the last publish: consumers take the lowest */
    _Atomic uint64_t lease_ns;                   /* CLOCK_MONOTONIC of the last acquire (stats only) */
    _Atomic uint32_t attempts;                   /* consumer deaths with this batch; reset by the producer */
    uint32_t reserved0;
    uint64_t reserved[4];
    _Alignas(DF_CACHELINE) ring_desc desc; /* written by the WRITING owner only */
};

struct ring_shm {
    _Alignas(DF_CACHELINE) struct ring_hdr hdr;
    _Alignas(DF_CACHELINE) _Atomic uint32_t closed;
    struct ring_seq ready;         /* bumped by publish, requeue, close */
    struct ring_seq free;          /* bumped by release, reclaim-free, free_poisoned, close */
    struct ring_counter published; /* also the source of pub_seq tickets */
    struct ring_counter released;
    struct ring_counter poisoned_total;
    struct ring_slot slots[];
};

_Static_assert(sizeof(struct ring_hdr) == 64, "ring header is one cache line");
_Static_assert(sizeof(_Atomic uint64_t) == 8 && sizeof(_Atomic uint32_t) == 4,
               "atomics must have the plain types' size in shared memory");
_Static_assert(sizeof(struct ring_slot) % DF_CACHELINE == 0, "slots are cache-line multiples");
_Static_assert(sizeof(struct ring_shm) % DF_CACHELINE == 0, "slot array starts on a line");
_Static_assert(offsetof(struct ring_shm, hdr) == 0, "magic at byte 0");

/* --- helpers --------------------------------------------------------------------- */
static inline struct ring_slot *slot_at(ring *r, uint32_t i)
{
    return &r->shm->slots[i];
}

static uint64_t deadline_of(int64_t timeout_ns)
{
    if (timeout_ns < 0)
        return FUTEX_NO_DEADLINE;
    return df_now_ns() + (uint64_t)timeout_ns;
}

static void seq_bump_wake(struct ring_seq *s)
{
    atomic_fetch_add_explicit(&s->seq, 1u, memory_order_seq_cst);
    if (atomic_load_explicit(&s->waiters, memory_order_seq_cst) > 0)
        (void)futex_wake(&s->seq, INT32_MAX);
}

/* Sleep on s until its sequence moves away from seen, the deadline passes or the ring
 * closes. 0 = rescan, -ETIMEDOUT, -EPIPE. */
static int seq_wait(ring *r, struct ring_seq *s, uint32_t seen, uint64_t deadline_ns)
{
    if (atomic_load_explicit(&r->shm->closed, memory_order_seq_cst))
        return -EPIPE;
    if (deadline_ns != FUTEX_NO_DEADLINE && df_now_ns() >= deadline_ns)
        return -ETIMEDOUT;
    atomic_fetch_add_explicit(&s->waiters, 1u, memory_order_seq_cst);
    int rc = 0;
    if (atomic_load_explicit(&s->seq, memory_order_seq_cst) == seen)
        rc = futex_wait_until(&s->seq, seen, deadline_ns);
    atomic_fetch_sub_explicit(&s->waiters, 1u, memory_order_seq_cst);
    if (rc == -ETIMEDOUT)
        return -ETIMEDOUT;
    /* 0, -EAGAIN (seq moved), -EINTR: rescan; anything else cannot happen for a valid
     * address, but rescanning is always safe. */
    return 0;
}

static inline int cas_ctl(struct ring_slot *s, uint64_t *expected, uint64_t desired)
{
    return atomic_compare_exchange_strong_explicit(&s->ctl, expected, desired, memory_order_acq_rel,
                                                   memory_order_acquire);
}

/* --- setup ----------------------------------------------------------------------- */
uint64_t ring_shm_bytes(uint32_t nslots)
{
    if (nslots == 0 || nslots > RING_MAX_SLOTS)
        return 0;
    return (uint64_t)sizeof(struct ring_shm) + (uint64_t)nslots * sizeof(struct ring_slot);
}

int ring_format(void *mem, uint64_t bytes, uint32_t nslots, uint32_t max_attempts, uint32_t id)
{
    uint64_t need = ring_shm_bytes(nslots);
    if (!mem || need == 0 || max_attempts == 0 || ((uintptr_t)mem % DF_CACHELINE) != 0)
        return -EINVAL;
    if (bytes < need)
        return -EMSGSIZE;
    memset(mem, 0, need);
    struct ring_shm *shm = mem;
    shm->hdr.version = RING_VERSION;
    shm->hdr.hdr_bytes = (uint32_t)sizeof(struct ring_shm);
    shm->hdr.total_bytes = need;
    shm->hdr.nslots = nslots;
    shm->hdr.record_bytes = (uint32_t)sizeof(struct ring_slot);
    shm->hdr.desc_bytes = (uint32_t)sizeof(ring_desc);
    shm->hdr.max_attempts = max_attempts;
    shm->hdr.ring_id = id;
    for (uint32_t i = 0; i < nslots; i++)
        atomic_init(&shm->slots[i].ctl, ctl_make(RING_FREE, 0, 0, 0));
    /* magic last: a reader that sees it sees a complete header */
    atomic_thread_fence(memory_order_release);
    shm->hdr.magic = RING_MAGIC;
    return 0;
}

int ring_open(ring *r, void *mem, uint64_t bytes)
{
    if (!r || !mem || ((uintptr_t)mem % DF_CACHELINE) != 0)
        return -EINVAL;
    r->shm = NULL;
    r->nslots = 0;
    if (bytes < sizeof(struct ring_hdr))
        return -EMSGSIZE;
    struct ring_shm *shm = mem;
    if (shm->hdr.magic != RING_MAGIC)
        return -EBADMSG;
    atomic_thread_fence(memory_order_acquire);
    if (shm->hdr.version != RING_VERSION)
        return -EPROTO;
    if (shm->hdr.hdr_bytes != sizeof(struct ring_shm) || shm->hdr.record_bytes != sizeof(struct ring_slot) ||
        shm->hdr.desc_bytes != sizeof(ring_desc) || shm->hdr.max_attempts == 0)
        return -EBADMSG;
    uint64_t need = ring_shm_bytes(shm->hdr.nslots);
    if (need == 0 || shm->hdr.total_bytes != need)
        return -EBADMSG;
    if (bytes < need)
        return -EMSGSIZE;
    r->shm = shm;
    r->nslots = shm->hdr.nslots;
    return 0;
}

uint32_t ring_id(const ring *r)
{
    return r->shm->hdr.ring_id;
}
uint32_t ring_max_attempts(const ring *r)
{
    return r->shm->hdr.max_attempts;
}

/* --- producer -------------------------------------------------------------------- */
int ring_acquire_free(ring *r, uint16_t worker, uint32_t inc, int64_t timeout_ns, uint32_t *slot)
{
    if (!r || !r->shm || !slot)
        return -EINVAL;
    struct ring_shm *shm = r->shm;
    uint64_t deadline = deadline_of(timeout_ns);
    uint32_t n = r->nslots;
    uint32_t start = worker % n; /* spread producers over the slots: fewer CAS collisions */
    for (;;) {
        if (atomic_load_explicit(&shm->closed, memory_order_seq_cst))
            return -EPIPE;
        uint32_t seen = atomic_load_explicit(&shm->free.seq, memory_order_seq_cst);
        for (uint32_t k = 0; k < n; k++) {
            uint32_t i = (start + k) % n;
            struct ring_slot *s = slot_at(r, i);
            uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
            if (CTL_STATE(c) != RING_FREE)
                continue;
            if (cas_ctl(s, &c, ctl_next(c, RING_WRITING, worker, inc))) {
                atomic_store_explicit(&s->attempts, 0u, memory_order_relaxed);
                atomic_store_explicit(&s->lease_ns, df_now_ns(), memory_order_relaxed);
                *slot = i;
                return 0;
            }
        }
        if (timeout_ns == 0)
            return -ETIMEDOUT;
        int rc = seq_wait(r, &shm->free, seen, deadline);
        if (rc < 0)
            return rc;
    }
}

ring_desc *ring_desc_at(ring *r, uint32_t slot)
{
    if (!r || !r->shm || slot >= r->nslots)
        return NULL;
    return &slot_at(r, slot)->desc;
}

/* One owner-checked transition: from (state from, owner worker/inc) to state to. */
static int owner_transition(ring *r, uint32_t slot, uint16_t worker, uint32_t inc, ring_state from, ring_state to)
{
    if (!r || !r->shm || slot >= r->nslots)
        return -EINVAL;
    struct ring_slot *s = slot_at(r, slot);
    uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
    if (CTL_STATE(c) != from || CTL_WORKER(c) != worker || CTL_INC(c) != (inc & RING_INC_MASK))
        return -EPERM;
    /* Nobody but the owner (or the reclaimer, once the owner is dead) changes this word,
     * so a failed CAS means we lost the lease: report it, never retry. */
    if (!cas_ctl(s, &c, ctl_next(c, to, 0, 0)))
        return -EPERM;
    return 0;
}

int ring_publish(ring *r, uint32_t slot, uint16_t worker, uint32_t inc)
{
    if (!r || !r->shm || slot >= r->nslots)
        return -EINVAL;
    struct ring_slot *s = slot_at(r, slot);
    uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
    if (CTL_STATE(c) != RING_WRITING || CTL_WORKER(c) != worker || CTL_INC(c) != (inc & RING_INC_MASK))
        return -EPERM;
    /* The ticket is taken before the CAS; a publisher that dies in between wastes a
     * number (harmless: only the order of tickets matters). */
    uint64_t ticket = atomic_fetch_add_explicit(&r->shm->published.v, 1, memory_order_relaxed);
    atomic_store_explicit(&s->pub_seq, ticket, memory_order_relaxed);
    if (!cas_ctl(s, &c, ctl_next(c, RING_READY, 0, 0)))
        return -EPERM;
    seq_bump_wake(&r->shm->ready);
    return 0;
}

/* --- consumer -------------------------------------------------------------------- */
/* READY -> READING for (worker, inc) if the slot's control word is still *c: 1 when taken
 * (its lease stamped), 0 when another consumer or the reclaimer changed it first. */
static int take_ready(struct ring_slot *s, uint64_t *c, uint16_t worker, uint32_t inc)
{
    if (!cas_ctl(s, c, ctl_next(*c, RING_READING, worker, inc)))
        return 0;
    atomic_store_explicit(&s->lease_ns, df_now_ns(), memory_order_relaxed);
    return 1;
}

/* A consumer's scan found nothing to take: -EPIPE once the ring is closed and -ETIMEDOUT
 * for a poll (timeout 0); else sleep until a publish moves ready.seq away from seen (0:
 * scan again), the deadline passes or the ring closes. */
static int wait_ready(ring *r, uint32_t seen, int64_t timeout_ns, uint64_t deadline)
{
    if (timeout_ns == 0)
        return atomic_load_explicit(&r->shm->closed, memory_order_seq_cst) ? -EPIPE : -ETIMEDOUT;
    return seq_wait(r, &r->shm->ready, seen, deadline);
}

int ring_acquire_ready(ring *r, uint16_t worker, uint32_t inc, int64_t timeout_ns, uint32_t *slot)
{
    if (!r || !r->shm || !slot)
        return -EINVAL;
    struct ring_shm *shm = r->shm;
    uint64_t deadline = deadline_of(timeout_ns);
    for (;;) {
        uint32_t seen = atomic_load_explicit(&shm->ready.seq, memory_order_seq_cst);
        for (;;) { /* pick the oldest READY slot; rescan if another consumer beat us to it */
            uint32_t best = UINT32_MAX;
            uint64_t best_seq = UINT64_MAX, best_ctl = 0;
            for (uint32_t i = 0; i < r->nslots; i++) {
                struct ring_slot *s = slot_at(r, i);
                uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
                if (CTL_STATE(c) != RING_READY)
                    continue;
                uint64_t p = atomic_load_explicit(&s->pub_seq, memory_order_relaxed);
                if (p < best_seq || best == UINT32_MAX) {
                    best = i;
                    best_seq = p;
                    best_ctl = c;
                }
            }
            if (best == UINT32_MAX)
                break;
            if (take_ready(slot_at(r, best), &best_ctl, worker, inc)) {
                *slot = best;
                return 0;
            }
        }
        int rc = wait_ready(r, seen, timeout_ns, deadline);
        if (rc < 0)
            return rc;
    }
}

int ring_acquire_ready_batch(ring *r, uint16_t worker, uint32_t inc, uint64_t batch_id, int64_t timeout_ns,
                             uint32_t *slot)
{
    if (!r || !r->shm || !slot)
        return -EINVAL;
    struct ring_shm *shm = r->shm;
    uint64_t deadline = deadline_of(timeout_ns);
    for (;;) {
        uint32_t seen = atomic_load_explicit(&shm->ready.seq, memory_order_seq_cst);
        for (uint32_t i = 0; i < r->nslots; i++) {
            struct ring_slot *s = slot_at(r, i);
            uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
            if (CTL_STATE(c) != RING_READY)
                continue;
            /* The descriptor of a READY slot only changes after the slot went through
             * READING/FREE/WRITING, which moves the generation: if the CAS below (against
             * c) succeeds, the id read here was the slot's id all along. An id read from a
             * slot that changed meanwhile is thrown away with the failed CAS. */
            uint64_t b = __atomic_load_n(&s->desc.batch_id, __ATOMIC_RELAXED);
            if (b != batch_id)
                continue;
            if (take_ready(s, &c, worker, inc)) {
                *slot = i;
                return 0;
            }
        }
        int rc = wait_ready(r, seen, timeout_ns, deadline);
        if (rc < 0)
            return rc;
    }
}

int ring_release(ring *r, uint32_t slot, uint16_t worker, uint32_t inc)
{
    int rc = owner_transition(r, slot, worker, inc, RING_READING, RING_FREE);
    if (rc < 0)
        return rc;
    atomic_fetch_add_explicit(&r->shm->released.v, 1, memory_order_relaxed);
    seq_bump_wake(&r->shm->free);
    return 0;
}

/* --- orchestrator ----------------------------------------------------------------- */
int ring_reclaim_owner(ring *r, uint16_t worker, ring_reclaim_report *rep)
{
    if (!r || !r->shm || !rep)
        return -EINVAL;
    uint32_t max_att = r->shm->hdr.max_attempts;
    int woke_free = 0, woke_ready = 0;
    for (uint32_t i = 0; i < r->nslots; i++) {
        struct ring_slot *s = slot_at(r, i);
        uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
        ring_state st = CTL_STATE(c);
        if ((st != RING_WRITING && st != RING_READING) || CTL_WORKER(c) != worker)
            continue;
        if (st == RING_WRITING) {
            /* the batch never got out: the slot is simply free again */
            if (!cas_ctl(s, &c, ctl_next(c, RING_FREE, 0, 0)))
                return -EBUSY; /* someone moved a dead owner's slot: the caller broke the rules */
            rep->freed++;
            woke_free = 1;
            continue;
        }
        uint32_t att = atomic_load_explicit(&s->attempts, memory_order_relaxed) + 1u;
        atomic_store_explicit(&s->attempts, att, memory_order_relaxed);
        if (att >= max_att) {
            if (!cas_ctl(s, &c, ctl_next(c, RING_POISONED, 0, 0)))
                return -EBUSY;
            if (rep->poisoned < RING_REPORT_IDS) {
                rep->poisoned_batch_ids[rep->poisoned] = s->desc.batch_id;
                rep->poisoned_slots[rep->poisoned] = i;
                rep->poisoned_rings[rep->poisoned] = r->shm->hdr.ring_id;
            }
            rep->poisoned++;
            atomic_fetch_add_explicit(&r->shm->poisoned_total.v, 1, memory_order_relaxed);
        } else {
            /* keeps its pub_seq: the oldest, so the retry goes first */
            if (!cas_ctl(s, &c, ctl_next(c, RING_READY, 0, 0)))
                return -EBUSY;
            rep->requeued++;
            woke_ready = 1;
        }
    }
    if (woke_free)
        seq_bump_wake(&r->shm->free);
    if (woke_ready)
        seq_bump_wake(&r->shm->ready);
    return 0;
}

int ring_reclaim_release(ring *r, uint32_t slot, uint16_t worker, uint32_t gen)
{
    if (!r || !r->shm || slot >= r->nslots)
        return -EINVAL;
    struct ring_slot *s = slot_at(r, slot);
    uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
    if (CTL_STATE(c) != RING_READING || CTL_WORKER(c) != worker || CTL_GEN(c) != gen)
        return -ESTALE;
    if (!cas_ctl(s, &c, ctl_next(c, RING_FREE, 0, 0)))
        return -ESTALE;
    atomic_fetch_add_explicit(&r->shm->released.v, 1, memory_order_relaxed);
    seq_bump_wake(&r->shm->free);
    return 0;
}

int ring_free_poisoned(ring *r, uint32_t slot)
{
    if (!r || !r->shm || slot >= r->nslots)
        return -EINVAL;
    struct ring_slot *s = slot_at(r, slot);
    uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
    if (CTL_STATE(c) != RING_POISONED)
        return -EPERM;
    if (!cas_ctl(s, &c, ctl_next(c, RING_FREE, 0, 0)))
        return -EPERM;
    seq_bump_wake(&r->shm->free);
    return 0;
}

int ring_slot_read(ring *r, uint32_t slot, ring_slot_info *info)
{
    if (!r || !r->shm || slot >= r->nslots || !info)
        return -EINVAL;
    struct ring_slot *s = slot_at(r, slot);
    uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
    info->state = CTL_STATE(c);
    info->worker = CTL_WORKER(c);
    info->incarnation = CTL_INC(c);
    info->gen = CTL_GEN(c);
    info->attempts = atomic_load_explicit(&s->attempts, memory_order_relaxed);
    info->pub_seq = atomic_load_explicit(&s->pub_seq, memory_order_relaxed);
    return 0;
}

void ring_stats_read(ring *r, ring_stats *st)
{
    memset(st, 0, sizeof *st);
    if (!r || !r->shm)
        return;
    uint64_t now = df_now_ns();
    for (uint32_t i = 0; i < r->nslots; i++) {
        struct ring_slot *s = slot_at(r, i);
        uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
        switch (CTL_STATE(c)) {
        case RING_FREE: st->free++; break;
        case RING_READY: st->ready++; break;
        case RING_POISONED: st->poisoned++; break;
        case RING_WRITING:
        case RING_READING: {
            if (CTL_STATE(c) == RING_WRITING)
                st->writing++;
            else
                st->reading++;
            uint64_t t = atomic_load_explicit(&s->lease_ns, memory_order_relaxed);
            if (t && t < now && now - t > st->oldest_lease_ns)
                st->oldest_lease_ns = now - t;
            break;
        }
        }
    }
    st->published = atomic_load_explicit(&r->shm->published.v, memory_order_relaxed);
    st->released = atomic_load_explicit(&r->shm->released.v, memory_order_relaxed);
    st->poisoned_total = atomic_load_explicit(&r->shm->poisoned_total.v, memory_order_relaxed);
}

void ring_close_for_shutdown(ring *r)
{
    if (!r || !r->shm)
        return;
    atomic_store_explicit(&r->shm->closed, 1u, memory_order_seq_cst);
    seq_bump_wake(&r->shm->ready);
    seq_bump_wake(&r->shm->free);
    /* waiters that have not registered yet see closed in seq_wait() or a moved seq */
    (void)futex_wake(&r->shm->ready.seq, INT32_MAX);
    (void)futex_wake(&r->shm->free.seq, INT32_MAX);
}

int ring_is_closed(ring *r)
{
    return r && r->shm && atomic_load_explicit(&r->shm->closed, memory_order_seq_cst) != 0;
}

const char *ring_strerror(int err)
{
    switch (err) {
    case 0: return "ok";
    case -EINVAL: return "invalid argument or slot index";
    case -EPERM: return "not the slot's owner, or the slot is not in the state this call needs";
    case -ETIMEDOUT: return "timed out waiting for a slot";
    case -EPIPE: return "ring closed for shutdown";
    case -EBADMSG: return "not a ring (bad magic, or header sizes do not match this build)";
    case -EPROTO: return "ring version differs from this build's";
    case -EMSGSIZE: return "shared memory smaller than the ring needs";
    case -ESTALE: return "slot lease changed since it was recorded";
    case -EBUSY: return "a dead owner's slot changed during reclaim (was the owner reaped?)";
    }
    return err < 0 ? strerror(-err) : "unknown";
}
