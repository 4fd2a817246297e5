/* ledger.c: the epoch plan (seeded shuffle + length-bucketed packing) and the per-batch state
 * words in shared memory. See ledger.h for the state machine and docs/ledger.md for why.
 *
 * Segment layout (every part starts on a 64-byte boundary; sizes fixed by the plan):
 *   struct ledger_shm       header: immutable plan facts, then one cache line each for the
 *                           committed step, the claim cursor, the pending hint and the stats
 *   ledger_batch[n_batches] the plan's batch table {first, count, tokens}
 *   uint32_t[n_samples]     sample indices, batch after batch
 *   uint32_t[n_samples]     effective length of each of those samples
 *   ledger_slot[n_batches]  one 64-bit state word (+ claim/train counters) per batch
 *
 * State word: bits 0..7 the state; CLAIMED/IN_RING: bits 8..23 worker, 24..55 incarnation;
 * TRAINED/COMMITTED: bits 8..63 the optimizer step. Every transition is one CAS on the word,
 * so a process killed at any instant leaves the batch in its old or its new state.
 *
 * Memory-ordering contract:
 *  - ledger_format writes the whole plan with plain stores, then stores magic with release;
 *    ledger_open loads magic with acquire, so an opener sees the complete plan. The plan is
 *    never written again.
 *  - State words: CAS with acq_rel, loads with acquire. Each word is self-contained (no other
 *    shared data is published through it), so acquire/release is only for a reader that
 *    then inspects the counters; relaxed would be enough for correctness of the states.
 *  - pending_hint is an UPPER BOUND on the number of PENDING batches: a transition into
 *    PENDING increments it BEFORE its CAS (and undoes on CAS failure); a transition out of
 *    PENDING decrements it AFTER its CAS. So "hint == 0" proves nothing is PENDING, and
 *    ledger_claim_next may skip its scan. A crash between a CAS and the decrement only
 *    leaves the hint too high (a wasted scan), never too low.
 *  - committed_step only grows (CAS max), release; readers acquire.
 */
#include "ipc/ledger.h"

#include <errno.h>
#include <inttypes.h>
#include <stdalign.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define LEDGER_MAGIC 0x315247444c454644ull /* "DFLEDGR1" little-endian */
#define LEDGER_VERSION 2u                  /* 2: data_digest, checksum, per-batch replays, stats.replayed */
#define STEP_MAX ((1ull << 56) - 1)
#define N_BUCKETS 64

struct ledger_shm {
    /* immutable after ledger_format */
    _Atomic uint64_t magic; /* stored last, with release */
    uint32_t version;
    uint32_t header_bytes;
    uint64_t total_bytes;
    uint64_t seed;
    uint64_t token_budget;
    uint32_t epoch;
    uint32_t max_seq_len;
    uint32_t n_batches;
    uint32_t n_samples;
    uint32_t n_truncated;
    uint32_t reserved0;
    uint64_t off_batches, off_sample_idx, off_sample_len, off_slots;
    uint64_t plan_hash;   /* FNV-1a of batch table + sample arrays: audit re-checks it */
    uint64_t data_digest; /* the data files' fingerprint at plan time (ledger_plan.data_digest) */
    uint64_t checksum;    /* snapshots only (ledger_snapshot): FNV-1a of the bytes, this field 0 */
    uint64_t reserved1[2];
    /* mutable, each on its own cache line */
    alignas(DF_CACHELINE) _Atomic uint64_t committed_step;
    alignas(DF_CACHELINE) _Atomic uint64_t cursor;       /* next batch id for claim_next */
    alignas(DF_CACHELINE) _Atomic uint64_t pending_hint; /* >= number of PENDING batches */
    alignas(DF_CACHELINE) struct {
        _Atomic uint64_t claims, trained, rewound, reclaimed, poisoned, double_train;
        _Atomic uint64_t replayed; /* batches restored from a snapshot (ledger_restore) */
    } stats;
    alignas(DF_CACHELINE) uint64_t reserved2[8];
};

struct ledger_slot {
    _Atomic uint64_t word;
    _Atomic uint32_t claims;    /* times claimed */
    _Atomic uint32_t trainings; /* times marked trained */
    _Atomic uint32_t replays;   /* times restored COMMITTED/POISONED from a snapshot */
    uint32_t reserved;
};

_Static_assert(sizeof(ledger_batch) == 16, "ledger_batch is 16 bytes in shared memory");
_Static_assert(sizeof(struct ledger_slot) == 24, "ledger_slot is 24 bytes");
_Static_assert(offsetof(struct ledger_shm, checksum) == LEDGER_CHECKSUM_OFFSET, "checksum offset (docs/ledger.md)");

/* --- state words ----------------------------------------------------------------------- */

static inline unsigned w_state(uint64_t w)
{
    return (unsigned)(w & 0xff);
}
static inline uint16_t w_worker(uint64_t w)
{
    return (uint16_t)(w >> 8);
}
static inline uint32_t w_inc(uint64_t w)
{
    return (uint32_t)(w >> 24);
}
static inline uint64_t w_step(uint64_t w)
{
    return w >> 8;
}
static inline uint64_t w_owned(unsigned st, uint16_t worker, uint32_t inc)
{
    return (uint64_t)st | (uint64_t)worker << 8 | (uint64_t)inc << 24;
}
static inline uint64_t w_stepped(unsigned st, uint64_t step)
{
    return (uint64_t)st | step << 8;
}

static inline uint64_t load_word(const ledger *l, uint64_t id)
{
    return atomic_load_explicit(&l->slots[id].word, memory_order_acquire);
}
static inline int cas_word(ledger *l, uint64_t id, uint64_t *expect, uint64_t desired)
{
    return atomic_compare_exchange_strong_explicit(&l->slots[id].word, expect, desired, memory_order_acq_rel,
                                                   memory_order_acquire);
}

const char *ledger_state_name(ledger_state s)
{
    switch (s) {
    case LEDGER_PENDING: return "pending";
    case LEDGER_CLAIMED: return "claimed";
    case LEDGER_IN_RING: return "in_ring";
    case LEDGER_TRAINED: return "trained";
    case LEDGER_COMMITTED: return "committed";
    case LEDGER_POISONED: return "poisoned";
    }
    return "invalid";
}

/* --- plan ------------------------------------------------------------------------------------ */

/* Log-spaced length bucket: k with 2^k <= len^2 < 2^(k+1), i.e. floor(2*log2(len)); two
 * lengths in one bucket differ by less than a factor sqrt(2). len < 2^32, so len^2 fits. */
static unsigned len_bucket(uint32_t len)
{
    uint64_t sq = (uint64_t)len * len;
    return 63u - (unsigned)__builtin_clzll(sq);
}

void ledger_plan_free(ledger_plan *p)
{
    if (!p)
        return;
    free(p->sample_idx);
    free(p->sample_len);
    free(p->batches);
    memset(p, 0, sizeof *p);
}

int ledger_plan_build(ledger_plan *p, const uint32_t *lens, uint32_t n, uint64_t seed, uint32_t epoch,
                      uint64_t token_budget, uint32_t max_seq_len)
{
    memset(p, 0, sizeof *p);
    if (!lens || n == 0 || n == UINT32_MAX || max_seq_len == 0 || token_budget < max_seq_len)
        return -EINVAL;
    for (uint32_t i = 0; i < n; i++)
        if (lens[i] == 0)
            return -EINVAL;

    int rc = -ENOMEM;
    uint32_t *perm = malloc((size_t)n * sizeof *perm);
    uint32_t *sorted = malloc((size_t)n * sizeof *sorted);
    uint32_t *order = NULL;
    ledger_batch *tmp = malloc((size_t)n * sizeof *tmp);
    p->sample_idx = malloc((size_t)n * sizeof(uint32_t));
    p->sample_len = malloc((size_t)n * sizeof(uint32_t));
    if (!perm || !sorted || !tmp || !p->sample_idx || !p->sample_len)
        goto out;

    /* 1. Fisher-Yates shuffle of the sample indices, seeded by (seed, epoch). */
    df_rng rng;
    df_rng_seed(&rng, df_hash64(seed ^ df_hash64(0x6c65646765720000ull + epoch)));
    for (uint32_t i = 0; i < n; i++)
        perm[i] = i;
    for (uint32_t i = n - 1; i > 0; i--) {
        uint32_t j = (uint32_t)df_rng_below(&rng, (uint64_t)i + 1);
        uint32_t x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }

    /* 2. Stable counting sort of the shuffled order into length buckets. */
    uint32_t count[N_BUCKETS] = {0}, start[N_BUCKETS];
    for (uint32_t i = 0; i < n; i++) {
        uint32_t len = DF_MIN(lens[i], max_seq_len);
        p->n_truncated += lens[i] > max_seq_len;
        count[len_bucket(len)]++;
    }
    for (uint32_t b = 0, acc = 0; b < N_BUCKETS; b++) {
        start[b] = acc;
        acc += count[b];
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t s = perm[i];
        sorted[start[len_bucket(DF_MIN(lens[s], max_seq_len))]++] = s;
    }

    /* 3. Greedy packing within each bucket: close a batch when the next sample would exceed
     * the budget. Buckets never mix, so a batch's lengths are within a factor sqrt(2). */
    uint32_t nb = 0, pos = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t s = sorted[i], len = DF_MIN(lens[s], max_seq_len);
        int new_bucket = i == 0 || len_bucket(len) != len_bucket(DF_MIN(lens[sorted[i - 1]], max_seq_len));
        if (nb == 0 || new_bucket || tmp[nb - 1].tokens + len > token_budget) {
            tmp[nb].first = pos;
            tmp[nb].count = 0;
            tmp[nb].tokens = 0;
            nb++;
        }
        tmp[nb - 1].count++;
        tmp[nb - 1].tokens += len;
        pos++;
    }

    /* 4. Shuffle the batch order with the same stream, so consecutive batches are not sorted
     * by length; then lay the samples out batch after batch in that order. */
    order = malloc((size_t)nb * sizeof *order);
    p->batches = malloc((size_t)nb * sizeof *p->batches);
    if (!order || !p->batches)
        goto out;
    for (uint32_t b = 0; b < nb; b++)
        order[b] = b;
    for (uint32_t b = nb - 1; b > 0; b--) {
        uint32_t j = (uint32_t)df_rng_below(&rng, (uint64_t)b + 1);
        uint32_t x = order[b];
        order[b] = order[j];
        order[j] = x;
    }
    pos = 0;
    for (uint32_t b = 0; b < nb; b++) {
        const ledger_batch *src = &tmp[order[b]];
        p->batches[b] = (ledger_batch){.first = pos, .count = src->count, .tokens = src->tokens};
        for (uint32_t k = 0; k < src->count; k++, pos++) {
            uint32_t s = sorted[src->first + k];
            p->sample_idx[pos] = s;
            p->sample_len[pos] = DF_MIN(lens[s], max_seq_len);
        }
    }
    p->seed = seed;
    p->epoch = epoch;
    p->max_seq_len = max_seq_len;
    p->token_budget = token_budget;
    p->n_samples = n;
    p->n_batches = nb;
    rc = 0;
out:
    free(perm);
    free(sorted);
    free(tmp);
    free(order);
    if (rc)
        ledger_plan_free(p);
    return rc;
}

/* --- segment -------------------------------------------------------------------------------- */

typedef struct layout {
    uint64_t off_batches, off_sample_idx, off_sample_len, off_slots, total;
} layout;

static uint64_t round64(uint64_t x)
{
    return (x + 63) & ~63ull;
}

static layout make_layout(uint32_t n_batches, uint32_t n_samples)
{
    layout L;
    L.off_batches = round64(sizeof(struct ledger_shm));
    L.off_sample_idx = round64(L.off_batches + (uint64_t)n_batches * sizeof(ledger_batch));
    L.off_sample_len = round64(L.off_sample_idx + (uint64_t)n_samples * 4);
    L.off_slots = round64(L.off_sample_len + (uint64_t)n_samples * 4);
    L.total = round64(L.off_slots + (uint64_t)n_batches * sizeof(struct ledger_slot));
    return L;
}

uint64_t ledger_shm_bytes(const ledger_plan *p)
{
    return make_layout(p->n_batches, p->n_samples).total;
}

static uint64_t plan_hash(const ledger_batch *b, uint32_t nb, const uint32_t *idx, const uint32_t *len, uint32_t ns)
{
    uint64_t h = df_fnv1a64(b, (size_t)nb * sizeof *b, 0);
    h = df_fnv1a64(idx, (size_t)ns * 4, h);
    return df_fnv1a64(len, (size_t)ns * 4, h);
}

int ledger_format(void *mem, uint64_t bytes, const ledger_plan *p)
{
    if (!mem || !p || p->n_batches == 0 || ((uintptr_t)mem & 63))
        return -EINVAL;
    layout L = make_layout(p->n_batches, p->n_samples);
    if (bytes < L.total)
        return -ENOSPC;
    char *base = mem;
    struct ledger_shm *h = mem;
    memset(mem, 0, L.total);
    memcpy(base + L.off_batches, p->batches, (size_t)p->n_batches * sizeof(ledger_batch));
    memcpy(base + L.off_sample_idx, p->sample_idx, (size_t)p->n_samples * 4);
    memcpy(base + L.off_sample_len, p->sample_len, (size_t)p->n_samples * 4);
    /* slots: all-zero words are PENDING with zero counters */
    h->version = LEDGER_VERSION;
    h->header_bytes = sizeof *h;
    h->total_bytes = L.total;
    h->seed = p->seed;
    h->token_budget = p->token_budget;
    h->epoch = p->epoch;
    h->max_seq_len = p->max_seq_len;
    h->n_batches = p->n_batches;
    h->n_samples = p->n_samples;
    h->n_truncated = p->n_truncated;
    h->off_batches = L.off_batches;
    h->off_sample_idx = L.off_sample_idx;
    h->off_sample_len = L.off_sample_len;
    h->off_slots = L.off_slots;
    h->plan_hash = plan_hash(p->batches, p->n_batches, p->sample_idx, p->sample_len, p->n_samples);
    h->data_digest = p->data_digest;
    atomic_store_explicit(&h->pending_hint, p->n_batches, memory_order_relaxed);
    atomic_store_explicit(&h->magic, LEDGER_MAGIC, memory_order_release);
    return 0;
}

int ledger_open(ledger *l, void *mem, uint64_t bytes)
{
    memset(l, 0, sizeof *l);
    if (!mem || ((uintptr_t)mem & 63) || bytes < sizeof(struct ledger_shm))
        return -EPROTO;
    struct ledger_shm *h = mem;
    if (atomic_load_explicit(&h->magic, memory_order_acquire) != LEDGER_MAGIC || h->version != LEDGER_VERSION ||
        h->header_bytes != sizeof *h || h->n_batches == 0)
        return -EPROTO;
    layout L = make_layout(h->n_batches, h->n_samples);
    if (h->total_bytes != L.total || L.total > bytes || h->off_batches != L.off_batches ||
        h->off_sample_idx != L.off_sample_idx || h->off_sample_len != L.off_sample_len || h->off_slots != L.off_slots)
        return -EPROTO;
    char *base = mem;
    l->shm = h;
    l->bytes = bytes;
    l->n_batches = h->n_batches;
    l->n_samples = h->n_samples;
    l->batches = (const ledger_batch *)(base + L.off_batches);
    l->sample_idx = (const uint32_t *)(base + L.off_sample_idx);
    l->sample_len = (const uint32_t *)(base + L.off_sample_len);
    l->slots = (struct ledger_slot *)(base + L.off_slots);
    return 0;
}

uint64_t ledger_seed(const ledger *l)
{
    return l->shm->seed;
}
uint32_t ledger_epoch(const ledger *l)
{
    return l->shm->epoch;
}
uint32_t ledger_n_batches(const ledger *l)
{
    return l->n_batches;
}
uint64_t ledger_committed_step(const ledger *l)
{
    return atomic_load_explicit(&l->shm->committed_step, memory_order_acquire);
}

/* --- transitions ----------------------------------------------------------------------------- */

static void stat_inc(_Atomic uint64_t *c)
{
    atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

/* PENDING -> CLAIMED on one batch; 1 if we got it. */
static int try_claim(ledger *l, uint64_t id, uint16_t worker, uint32_t inc)
{
    uint64_t expect = w_stepped(LEDGER_PENDING, 0);
    if (!cas_word(l, id, &expect, w_owned(LEDGER_CLAIMED, worker, inc)))
        return 0;
    atomic_fetch_sub_explicit(&l->shm->pending_hint, 1, memory_order_acq_rel); /* after the CAS */
    atomic_fetch_add_explicit(&l->slots[id].claims, 1, memory_order_relaxed);
    stat_inc(&l->shm->stats.claims);
    return 1;
}

int ledger_claim_next(ledger *l, uint16_t worker, uint32_t inc, uint64_t *batch_id)
{
    /* First pass: the shared cursor hands out ids in plan order. */
    if (atomic_load_explicit(&l->shm->cursor, memory_order_relaxed) < l->n_batches) {
        for (;;) {
            uint64_t id = atomic_fetch_add_explicit(&l->shm->cursor, 1, memory_order_relaxed);
            if (id >= l->n_batches)
                break;
            if (try_claim(l, id, worker, inc)) {
                *batch_id = id;
                return 0;
            }
        }
    }
    /* Then batches that came back (rewind, reclaim) or that a claimer skipped by dying between
     * its cursor increment and its CAS: a scan, skipped when the hint proves there are none. */
    if (atomic_load_explicit(&l->shm->pending_hint, memory_order_acquire) == 0)
        return -ENODATA;
    for (uint64_t id = 0; id < l->n_batches; id++)
        if (w_state(load_word(l, id)) == LEDGER_PENDING && try_claim(l, id, worker, inc)) {
            *batch_id = id;
            return 0;
        }
    return -ENODATA;
}

int ledger_claim_batch(ledger *l, uint64_t batch_id, uint16_t worker, uint32_t inc)
{
    if (batch_id >= l->n_batches)
        return -ERANGE;
    if (try_claim(l, batch_id, worker, inc))
        return 0;
    switch (w_state(load_word(l, batch_id))) {
    case LEDGER_PENDING: return -EAGAIN; /* raced with a state change back: retry */
    case LEDGER_CLAIMED:
    case LEDGER_IN_RING: return -EBUSY;
    case LEDGER_TRAINED:
    case LEDGER_COMMITTED: return -EALREADY;
    default: return -EINVAL;
    }
}

/* "Open" = not yet trained: the batches a deterministic drafter still has to consume in id
 * order (PENDING, CLAIMED, IN_RING). TRAINED, COMMITTED and POISONED are behind it. */
static int is_open(uint64_t w)
{
    unsigned st = w_state(w);
    return st == LEDGER_PENDING || st == LEDGER_CLAIMED || st == LEDGER_IN_RING;
}

uint32_t ledger_next_open(ledger *l, uint32_t k, uint64_t *ids)
{
    uint32_t n = 0;
    for (uint64_t id = 0; id < l->n_batches && n < k; id++)
        if (is_open(load_word(l, id)))
            ids[n++] = id;
    return n;
}

uint64_t ledger_low_water(ledger *l)
{
    uint64_t id;
    return ledger_next_open(l, 1, &id) ? id : l->n_batches;
}

int ledger_claim_window(ledger *l, uint16_t worker, uint32_t inc, uint32_t window, uint64_t *batch_id)
{
    if (window == 0)
        return -EINVAL;
    uint64_t low = ledger_low_water(l);
    uint64_t end = DF_MIN(low + window, (uint64_t)l->n_batches);
    for (uint64_t id = low; id < end; id++)
        if (w_state(load_word(l, id)) == LEDGER_PENDING && try_claim(l, id, worker, inc)) {
            *batch_id = id;
            return 0;
        }
    return -ENODATA;
}

int ledger_claim(ledger *l, uint16_t worker, uint32_t inc, uint32_t window, uint64_t *batch_id)
{
    return window ? ledger_claim_window(l, worker, inc, window, batch_id) : ledger_claim_next(l, worker, inc, batch_id);
}

int ledger_batch_info(ledger *l, uint64_t batch_id, const uint32_t **idx, const uint32_t **len, uint32_t *n,
                      uint64_t *tokens)
{
    if (batch_id >= l->n_batches)
        return -ERANGE;
    const ledger_batch *b = &l->batches[batch_id];
    if (idx)
        *idx = l->sample_idx + b->first;
    if (len)
        *len = l->sample_len + b->first;
    if (n)
        *n = b->count;
    if (tokens)
        *tokens = b->tokens;
    return 0;
}

int ledger_batch_samples(ledger *l, uint64_t batch_id, const uint32_t **idx, uint32_t *n)
{
    return ledger_batch_info(l, batch_id, idx, NULL, n, NULL);
}

int ledger_set_in_ring(ledger *l, uint64_t batch_id)
{
    if (batch_id >= l->n_batches)
        return -ERANGE;
    uint64_t w = load_word(l, batch_id);
    for (;;) {
        unsigned st = w_state(w);
        if (st == LEDGER_TRAINED || st == LEDGER_COMMITTED)
            return -EALREADY;
        if (st != LEDGER_CLAIMED)
            return -EINVAL;
        if (cas_word(l, batch_id, &w, w_owned(LEDGER_IN_RING, w_worker(w), w_inc(w))))
            return 0;
    }
}

int ledger_mark_trained(ledger *l, uint64_t batch_id, uint64_t step)
{
    if (batch_id >= l->n_batches)
        return -ERANGE;
    if (step == 0 || step > STEP_MAX)
        return -EINVAL;
    uint64_t w = load_word(l, batch_id);
    for (;;) {
        unsigned st = w_state(w);
        if (st == LEDGER_TRAINED || st == LEDGER_COMMITTED) {
            stat_inc(&l->shm->stats.double_train); /* someone tried to count it twice */
            return -EALREADY;
        }
        if (st != LEDGER_CLAIMED && st != LEDGER_IN_RING)
            return -EINVAL;
        if (cas_word(l, batch_id, &w, w_stepped(LEDGER_TRAINED, step))) {
            atomic_fetch_add_explicit(&l->slots[batch_id].trainings, 1, memory_order_relaxed);
            stat_inc(&l->shm->stats.trained);
            return 0;
        }
    }
}

int ledger_commit(ledger *l, uint64_t step)
{
    if (step > STEP_MAX)
        return -EINVAL;
    uint64_t prev = atomic_load_explicit(&l->shm->committed_step, memory_order_acquire);
    if (step < prev)
        return -EINVAL;
    for (uint64_t id = 0; id < l->n_batches; id++) {
        uint64_t w = load_word(l, id);
        while (w_state(w) == LEDGER_TRAINED && w_step(w) <= step &&
               !cas_word(l, id, &w, w_stepped(LEDGER_COMMITTED, w_step(w))))
            ;
    }
    while (prev < step && !atomic_compare_exchange_weak_explicit(&l->shm->committed_step, &prev, step,
                                                                 memory_order_acq_rel, memory_order_acquire))
        ;
    return 0;
}

/* Move every batch that `match` selects back to PENDING; n = how many. */
static void return_to_pending(ledger *l, int (*match)(uint64_t w, uint64_t arg), uint64_t arg, uint32_t *n)
{
    uint32_t k = 0;
    for (uint64_t id = 0; id < l->n_batches; id++) {
        uint64_t w = load_word(l, id);
        while (match(w, arg)) {
            /* the hint goes up BEFORE the batch becomes PENDING (it is an upper bound) */
            atomic_fetch_add_explicit(&l->shm->pending_hint, 1, memory_order_acq_rel);
            if (cas_word(l, id, &w, w_stepped(LEDGER_PENDING, 0))) {
                k++;
                break;
            }
            atomic_fetch_sub_explicit(&l->shm->pending_hint, 1, memory_order_acq_rel);
        }
    }
    if (n)
        *n = k;
}

static int match_trained_after(uint64_t w, uint64_t step)
{
    return w_state(w) == LEDGER_TRAINED && w_step(w) > step;
}

static int match_claimed_by(uint64_t w, uint64_t worker)
{
    return w_state(w) == LEDGER_CLAIMED && w_worker(w) == worker;
}

static int match_in_flight(uint64_t w, uint64_t unused)
{
    (void)unused;
    return w_state(w) == LEDGER_CLAIMED || w_state(w) == LEDGER_IN_RING;
}

int ledger_reset_in_flight(ledger *l, uint32_t *n_returned)
{
    uint32_t k;
    return_to_pending(l, match_in_flight, 0, &k);
    atomic_fetch_add_explicit(&l->shm->stats.reclaimed, k, memory_order_relaxed);
    if (n_returned)
        *n_returned = k;
    return 0;
}

int ledger_rewind_ex(ledger *l, uint64_t step, uint32_t *n_returned)
{
    if (n_returned)
        *n_returned = 0;
    if (step < atomic_load_explicit(&l->shm->committed_step, memory_order_acquire))
        return -EINVAL;
    uint32_t k;
    return_to_pending(l, match_trained_after, step, &k);
    atomic_fetch_add_explicit(&l->shm->stats.rewound, k, memory_order_relaxed);
    if (n_returned)
        *n_returned = k;
    return 0;
}

int ledger_rewind(ledger *l, uint64_t step)
{
    return ledger_rewind_ex(l, step, NULL);
}

int ledger_reclaim_owner_ex(ledger *l, uint16_t worker, uint32_t *n_returned)
{
    uint32_t k;
    return_to_pending(l, match_claimed_by, worker, &k);
    atomic_fetch_add_explicit(&l->shm->stats.reclaimed, k, memory_order_relaxed);
    if (n_returned)
        *n_returned = k;
    return 0;
}

int ledger_reclaim_owner(ledger *l, uint16_t worker)
{
    return ledger_reclaim_owner_ex(l, worker, NULL);
}

int ledger_mark_poisoned(ledger *l, uint64_t batch_id)
{
    if (batch_id >= l->n_batches)
        return -ERANGE;
    uint64_t w = load_word(l, batch_id);
    for (;;) {
        unsigned st = w_state(w);
        if (st == LEDGER_POISONED)
            return 0;
        if (st == LEDGER_COMMITTED)
            return -EALREADY;
        if (cas_word(l, batch_id, &w, w_stepped(LEDGER_POISONED, 0))) {
            if (st == LEDGER_PENDING)
                atomic_fetch_sub_explicit(&l->shm->pending_hint, 1, memory_order_acq_rel);
            stat_inc(&l->shm->stats.poisoned);
            return 0;
        }
    }
}

int ledger_batch_status_get(ledger *l, uint64_t batch_id, ledger_batch_status *s)
{
    if (batch_id >= l->n_batches)
        return -ERANGE;
    uint64_t w = load_word(l, batch_id);
    memset(s, 0, sizeof *s);
    s->state = (ledger_state)w_state(w);
    if (s->state == LEDGER_CLAIMED || s->state == LEDGER_IN_RING) {
        s->worker = w_worker(w);
        s->incarnation = w_inc(w);
    } else if (s->state == LEDGER_TRAINED || s->state == LEDGER_COMMITTED) {
        s->step = w_step(w);
    }
    s->claims = atomic_load_explicit(&l->slots[batch_id].claims, memory_order_relaxed);
    s->trainings = atomic_load_explicit(&l->slots[batch_id].trainings, memory_order_relaxed);
    s->replays = atomic_load_explicit(&l->slots[batch_id].replays, memory_order_relaxed);
    return 0;
}

void ledger_counts(ledger *l, ledger_counts_t *c)
{
    memset(c, 0, sizeof *c);
    for (uint64_t id = 0; id < l->n_batches; id++) {
        switch (w_state(load_word(l, id))) {
        case LEDGER_PENDING: c->pending++; break;
        case LEDGER_CLAIMED: c->claimed++; break;
        case LEDGER_IN_RING: c->in_ring++; break;
        case LEDGER_TRAINED: c->trained++; break;
        case LEDGER_COMMITTED: c->committed++; break;
        case LEDGER_POISONED: c->poisoned++; break;
        }
    }
}

int ledger_epoch_done(ledger *l)
{
    ledger_counts_t c;
    ledger_counts(l, &c);
    return c.committed + c.poisoned == l->n_batches;
}

/* The plan in the segment is intact and covers every sample index exactly once:
 * 1 yes, 0 no, -ENOMEM. */
static int plan_covers_once(ledger *l)
{
    struct ledger_shm *h = l->shm;
    if (plan_hash(l->batches, l->n_batches, l->sample_idx, l->sample_len, l->n_samples) != h->plan_hash)
        return 0;
    uint8_t *seen = calloc(l->n_samples ? l->n_samples : 1, 1);
    if (!seen)
        return -ENOMEM;
    uint64_t total = 0;
    int ok = 1;
    for (uint32_t b = 0; ok && b < l->n_batches; b++) {
        const ledger_batch *bt = &l->batches[b];
        if ((uint64_t)bt->first + bt->count > l->n_samples) {
            ok = 0;
            break;
        }
        for (uint32_t k = 0; k < bt->count; k++) {
            uint32_t s = l->sample_idx[bt->first + k];
            if (s >= l->n_samples || seen[s]++) {
                ok = 0;
                break;
            }
        }
        total += bt->count;
    }
    free(seen);
    return ok && total == l->n_samples;
}

int ledger_exactly_once(ledger *l)
{
    int cover = plan_covers_once(l);
    if (cover < 0)
        return cover;
    return cover && ledger_epoch_done(l);
}

int ledger_audit_write(ledger *l, const char *path)
{
    struct ledger_shm *h = l->shm;
    int cover = plan_covers_once(l);
    if (cover < 0)
        return cover;
    ledger_counts_t c;
    ledger_counts(l, &c);
    int done = c.committed + c.poisoned == l->n_batches;

    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return -errno;
    /* Hand-written so that each batch is one line: greppable, diffable. */
    fprintf(f, "{\n  \"seed\": %" PRIu64 ",\n  \"epoch\": %u,\n  \"n_batches\": %u,\n  \"n_samples\": %u,\n", h->seed,
            h->epoch, h->n_batches, h->n_samples);
    fprintf(f, "  \"token_budget\": %" PRIu64 ",\n  \"max_seq_len\": %u,\n  \"n_truncated\": %u,\n", h->token_budget,
            h->max_seq_len, h->n_truncated);
    fprintf(f, "  \"plan_hash\": \"%016" PRIx64 "\",\n  \"committed_step\": %" PRIu64 ",\n", h->plan_hash,
            ledger_committed_step(l));
    fprintf(f,
            "  \"counts\": {\"pending\": %u, \"claimed\": %u, \"in_ring\": %u, \"trained\": %u, "
            "\"committed\": %u, \"poisoned\": %u},\n",
            c.pending, c.claimed, c.in_ring, c.trained, c.committed, c.poisoned);
    fprintf(f,
            "  \"stats\": {\"claims\": %" PRIu64 ", \"trained\": %" PRIu64 ", \"rewound\": %" PRIu64
            ", \"reclaimed\": %" PRIu64 ", \"poisoned\": %" PRIu64 ", \"double_train_rejected\": %" PRIu64
            ", \"replayed\": %" PRIu64 "},\n",
            atomic_load(&h->stats.claims), atomic_load(&h->stats.trained), atomic_load(&h->stats.rewound),
            atomic_load(&h->stats.reclaimed), atomic_load(&h->stats.poisoned), atomic_load(&h->stats.double_train),
            atomic_load(&h->stats.replayed));
    /* The verdict is only due once the epoch is over: an interrupted run's audit says
     * "incomplete" with exactly_once null (resume it), and false is kept for a plan that does
     * not cover every sample once, whatever the state of the batches. */
    const char *status = !cover ? "violated" : done ? "complete" : "incomplete";
    fprintf(f,
            "  \"plan_covers_every_sample_once\": %s,\n  \"epoch_done\": %s,\n  \"status\": \"%s\",\n"
            "  \"exactly_once\": %s,\n",
            cover ? "true" : "false", done ? "true" : "false", status,
            !cover ? "false"
            : done ? "true"
                   : "null");
    fprintf(f, "  \"poisoned\": [");
    for (uint64_t id = 0, k = 0; id < l->n_batches; id++)
        if (w_state(load_word(l, id)) == LEDGER_POISONED)
            fprintf(f, "%s%" PRIu64, k++ ? ", " : "", id);
    fprintf(f, "],\n  \"batches\": [\n");
    for (uint64_t id = 0; id < l->n_batches; id++) {
        ledger_batch_status s;
        ledger_batch_status_get(l, id, &s);
        fprintf(f,
                "    {\"id\": %" PRIu64 ", \"state\": \"%s\", \"step\": %" PRIu64 ", \"samples\": %u, "
                "\"tokens\": %" PRIu64 ", \"claims\": %u, \"trainings\": %u, \"replays\": %u}%s\n",
                id, ledger_state_name(s.state), s.step, l->batches[id].count, l->batches[id].tokens, s.claims,
                s.trainings, s.replays, id + 1 < l->n_batches ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    if (fclose(f) != 0) {
        free(buf);
        return -ENOMEM;
    }
    int rc = df_write_file_atomic(path, buf, len);
    free(buf);
    return rc;
}

/* --- snapshots (ledger.bin) -------------------------------------------------------------------- */

uint64_t ledger_plan_hash(const ledger *l)
{
    return l->shm->plan_hash;
}
uint64_t ledger_data_digest(const ledger *l)
{
    return l->shm->data_digest;
}

/* FNV-1a over the snapshot with its checksum field read as zero. */
static uint64_t snapshot_sum(const void *mem, uint64_t bytes)
{
    static const uint8_t zero[8];
    const uint8_t *p = mem;
    uint64_t h = df_fnv1a64(p, LEDGER_CHECKSUM_OFFSET, 0);
    /* continue the same FNV-1a stream: its state is the running hash XORed back with the
     * seed, and the seed is 0 here */
    h = df_fnv1a64(zero, 8, h ^ 0xcbf29ce484222325ull);
    return df_fnv1a64(p + LEDGER_CHECKSUM_OFFSET + 8, bytes - LEDGER_CHECKSUM_OFFSET - 8, h ^ 0xcbf29ce484222325ull);
}

int ledger_snapshot(ledger *l, void **out, uint64_t *out_len)
{
    struct ledger_shm *h = l->shm;
    uint64_t total = h->total_bytes;
    *out = NULL;
    *out_len = 0;
    uint8_t *mem = aligned_alloc(64, total);
    if (!mem)
        return -ENOMEM;
    /* the plan part is immutable: plain copy; the mutable words one atomic load each (the
     * stats BEFORE the slots: a slot counter moves before its stat, so the copy never shows
     * a stat above the sum of its slots) */
    memset(mem, 0, total);
    memcpy(mem, h, offsetof(struct ledger_shm, committed_step));
    memcpy(mem + h->off_batches, (const uint8_t *)h + h->off_batches, h->off_slots - h->off_batches);
    struct ledger_shm *c = (struct ledger_shm *)mem;
    atomic_store_explicit(&c->committed_step, ledger_committed_step(l), memory_order_relaxed);
    atomic_store_explicit(&c->cursor, atomic_load(&h->cursor), memory_order_relaxed);
    atomic_store_explicit(&c->pending_hint, atomic_load(&h->pending_hint), memory_order_relaxed);
    atomic_store_explicit(&c->stats.claims, atomic_load(&h->stats.claims), memory_order_relaxed);
    atomic_store_explicit(&c->stats.trained, atomic_load(&h->stats.trained), memory_order_relaxed);
    atomic_store_explicit(&c->stats.rewound, atomic_load(&h->stats.rewound), memory_order_relaxed);
    atomic_store_explicit(&c->stats.reclaimed, atomic_load(&h->stats.reclaimed), memory_order_relaxed);
    atomic_store_explicit(&c->stats.poisoned, atomic_load(&h->stats.poisoned), memory_order_relaxed);
    atomic_store_explicit(&c->stats.double_train, atomic_load(&h->stats.double_train), memory_order_relaxed);
    atomic_store_explicit(&c->stats.replayed, atomic_load(&h->stats.replayed), memory_order_relaxed);
    struct ledger_slot *cs = (struct ledger_slot *)(mem + h->off_slots);
    for (uint64_t id = 0; id < l->n_batches; id++) {
        atomic_store_explicit(&cs[id].word, load_word(l, id), memory_order_relaxed);
        atomic_store_explicit(&cs[id].claims, atomic_load(&l->slots[id].claims), memory_order_relaxed);
        atomic_store_explicit(&cs[id].trainings, atomic_load(&l->slots[id].trainings), memory_order_relaxed);
        atomic_store_explicit(&cs[id].replays, atomic_load(&l->slots[id].replays), memory_order_relaxed);
    }
    c->checksum = 0;
    c->checksum = snapshot_sum(mem, total);
    *out = mem;
    *out_len = total;
    return 0;
}

/* A state that no sequence of transitions produces. Checked on COMMITTED and POISONED words
 * (the orchestrator changes those itself, so a snapshot holds them exactly) and on the
 * counters; TRAINED/CLAIMED words may be mid-change while the snapshot is copied. */
static int check_states(ledger *l, char *err, size_t errlen)
{
    struct ledger_shm *h = l->shm;
    uint64_t committed = atomic_load(&h->committed_step);
    uint64_t sum_claims = 0, sum_trainings = 0, sum_replays = 0;
    uint32_t n_poisoned = 0;
    for (uint64_t id = 0; id < l->n_batches; id++) {
        uint64_t w = load_word(l, id);
        unsigned st = w_state(w);
        uint32_t claims = atomic_load(&l->slots[id].claims), trainings = atomic_load(&l->slots[id].trainings);
        sum_claims += claims;
        sum_trainings += trainings;
        sum_replays += atomic_load(&l->slots[id].replays);
        if (st > LEDGER_POISONED)
            return df_err(err, errlen, -EBADMSG, "batch %" PRIu64 ": state %u is not a ledger state", id, st);
        if ((st == LEDGER_PENDING || st == LEDGER_POISONED) && w_step(w) != 0)
            return df_err(err, errlen, -EBADMSG, "batch %" PRIu64 " is %s with a payload (%#" PRIx64 ")", id,
                          ledger_state_name((ledger_state)st), w_step(w));
        n_poisoned += st == LEDGER_POISONED;
        if (st == LEDGER_TRAINED && w_step(w) == 0)
            return df_err(err, errlen, -EBADMSG, "batch %" PRIu64 " is trained with no step", id);
        if (st != LEDGER_COMMITTED)
            continue;
        if (w_step(w) == 0)
            return df_err(err, errlen, -EBADMSG, "batch %" PRIu64 " is committed with no step", id);
        if (w_step(w) > committed)
            return df_err(err, errlen, -EBADMSG,
                          "batch %" PRIu64 " is committed at step %" PRIu64 ", past the committed step %" PRIu64, id,
                          w_step(w), committed);
        if (trainings == 0 || trainings > claims)
            return df_err(err, errlen, -EBADMSG,
                          "batch %" PRIu64 " is committed with %u trainings and %u claims (a committed batch "
                          "was trained at least once, and each training needs a claim)",
                          id, trainings, claims);
    }
    /* a slot counter moves before its stat: a stat above the sum of its slots cannot be */
    if (atomic_load(&h->stats.trained) > sum_trainings || atomic_load(&h->stats.claims) > sum_claims ||
        atomic_load(&h->stats.replayed) > sum_replays || atomic_load(&h->stats.poisoned) < n_poisoned)
        return df_err(err, errlen, -EBADMSG,
                      "counts do not add up: stats claims %" PRIu64 " / trained %" PRIu64 " / replayed %" PRIu64
                      " / poisoned %" PRIu64 ", batches' claims %" PRIu64 " / trainings %" PRIu64 " / replays %" PRIu64
                      " / poisoned %u",
                      atomic_load(&h->stats.claims), atomic_load(&h->stats.trained), atomic_load(&h->stats.replayed),
                      atomic_load(&h->stats.poisoned), sum_claims, sum_trainings, sum_replays, n_poisoned);
    return 0;
}

int ledger_snapshot_open(ledger *l, void *mem, uint64_t bytes, char *err, size_t errlen)
{
    memset(l, 0, sizeof *l);
    struct ledger_shm *h = mem;
    if (!mem || ((uintptr_t)mem & 63) || bytes < 16 || atomic_load(&h->magic) != LEDGER_MAGIC)
        return df_err(err, errlen, -EPROTO, "not a ledger snapshot (no DFLEDGR1 magic)");
    if (h->version != LEDGER_VERSION)
        return df_err(err, errlen, -EPROTONOSUPPORT,
                      "ledger format version %u; this orchestrator reads version %u only (the run was "
                      "started by an older build: finish it with that build, or start a new run)",
                      h->version, LEDGER_VERSION);
    if (bytes < sizeof *h || h->total_bytes != bytes)
        return df_err(err, errlen, -EBADMSG, "%" PRIu64 " bytes, its header says %" PRIu64 " (truncated or extended)",
                      bytes, bytes < sizeof *h ? 0 : h->total_bytes);
    uint64_t sum = snapshot_sum(mem, bytes);
    if (sum != h->checksum)
        return df_err(err, errlen, -EBADMSG,
                      "checksum mismatch (stored %016" PRIx64 ", computed %016" PRIx64 "): the file was "
                      "changed or damaged after it was written",
                      h->checksum, sum);
    int rc = ledger_open(l, mem, bytes);
    if (rc < 0)
        return df_err(err, errlen, rc, "inconsistent layout (sizes and offsets disagree)");
    rc = plan_covers_once(l);
    if (rc <= 0)
        return df_err(err, errlen, rc < 0 ? rc : -EBADMSG, "its plan is not intact (plan hash or sample coverage)");
    return check_states(l, err, errlen);
}

int ledger_restore(ledger *l, ledger *snap, ledger_restore_counts *out)
{
    memset(out, 0, sizeof *out);
    if (snap->n_batches != l->n_batches || snap->n_samples != l->n_samples || snap->shm->plan_hash != l->shm->plan_hash)
        return -EINVAL;
    for (uint64_t id = 0; id < l->n_batches; id++)
        if (load_word(l, id) != 0 || atomic_load(&l->slots[id].claims) || atomic_load(&l->slots[id].trainings))
            return -EBUSY; /* only into a freshly formatted ledger */
    struct ledger_shm *h = l->shm, *s = snap->shm;
    uint64_t pending = 0;
    for (uint64_t id = 0; id < l->n_batches; id++) {
        uint64_t w = load_word(snap, id);
        unsigned st = w_state(w);
        uint32_t replays = atomic_load(&snap->slots[id].replays);
        uint64_t nw = 0;
        if (st == LEDGER_COMMITTED || st == LEDGER_POISONED) {
            nw = st == LEDGER_COMMITTED ? w_stepped(LEDGER_COMMITTED, w_step(w)) : w_stepped(LEDGER_POISONED, 0);
            replays++;
            if (st == LEDGER_COMMITTED)
                out->committed++;
            else
                out->poisoned++;
        } else {
            pending++;
            if (st == LEDGER_TRAINED)
                out->rewound++;
            else if (st == LEDGER_CLAIMED || st == LEDGER_IN_RING)
                out->reclaimed++;
        }
        atomic_store_explicit(&l->slots[id].word, nw, memory_order_relaxed);
        atomic_store_explicit(&l->slots[id].claims, atomic_load(&snap->slots[id].claims), memory_order_relaxed);
        atomic_store_explicit(&l->slots[id].trainings, atomic_load(&snap->slots[id].trainings), memory_order_relaxed);
        atomic_store_explicit(&l->slots[id].replays, replays, memory_order_relaxed);
    }
    atomic_store(&h->stats.claims, atomic_load(&s->stats.claims));
    atomic_store(&h->stats.trained, atomic_load(&s->stats.trained));
    atomic_store(&h->stats.rewound, atomic_load(&s->stats.rewound) + out->rewound);
    atomic_store(&h->stats.reclaimed, atomic_load(&s->stats.reclaimed) + out->reclaimed);
    atomic_store(&h->stats.poisoned, atomic_load(&s->stats.poisoned));
    atomic_store(&h->stats.double_train, atomic_load(&s->stats.double_train));
    atomic_store(&h->stats.replayed, atomic_load(&s->stats.replayed) + out->committed + out->poisoned);
    atomic_store(&h->pending_hint, pending);
    atomic_store(&h->cursor, 0);
    atomic_store_explicit(&h->committed_step, ledger_committed_step(snap), memory_order_release);
    return 0;
}
