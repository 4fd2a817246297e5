/* handoff.c: per-worker hand-off intents and their recovery. See handoff.h. */
#include "handoff.h"

#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

#include "util.h"

struct handoff_rec {                               /* one per worker id, on its own cache line */
    _Alignas(DF_CACHELINE) _Atomic uint32_t phase; /* HANDOFF_NONE/INTENT/PUBLISHED, stored last */
    _Atomic uint32_t incarnation;
    _Atomic uint32_t in_ring, in_slot, in_gen;
    _Atomic uint32_t out_ring, out_slot, out_gen;
    _Atomic uint64_t in_token, out_token;
};

struct handoff_shm {
    _Alignas(DF_CACHELINE) uint64_t magic;
    uint32_t version;
    uint32_t nworkers; /* HANDOFF_MAX_WORKERS */
    uint64_t total_bytes;
    uint32_t rec_bytes;
    uint32_t reserved0;
    uint64_t reserved[4];
    struct handoff_rec rec[HANDOFF_MAX_WORKERS];
};
_Static_assert(sizeof(struct handoff_rec) == DF_CACHELINE, "one intent per cache line");

uint64_t handoff_shm_bytes(void)
{
    return sizeof(struct handoff_shm);
}

int handoff_format(void *mem, uint64_t bytes)
{
    if (!mem || ((uintptr_t)mem % DF_CACHELINE) != 0)
        return -EINVAL;
    if (bytes < sizeof(struct handoff_shm))
        return -EMSGSIZE;
    memset(mem, 0, sizeof(struct handoff_shm));
    struct handoff_shm *h = mem;
    h->version = HANDOFF_VERSION;
    h->nworkers = HANDOFF_MAX_WORKERS;
    h->total_bytes = sizeof(struct handoff_shm);
    h->rec_bytes = sizeof(struct handoff_rec);
    atomic_thread_fence(memory_order_release);
    h->magic = HANDOFF_MAGIC;
    return 0;
}

int handoff_open(handoff_table *t, void *mem, uint64_t bytes)
{
    if (!t || !mem || ((uintptr_t)mem % DF_CACHELINE) != 0)
        return -EINVAL;
    t->shm = NULL;
    if (bytes < 64)
        return -EMSGSIZE;
    struct handoff_shm *h = mem;
    if (h->magic != HANDOFF_MAGIC)
        return -EBADMSG;
    atomic_thread_fence(memory_order_acquire);
    if (h->version != HANDOFF_VERSION)
        return -EPROTO;
    if (h->nworkers != HANDOFF_MAX_WORKERS || h->rec_bytes != sizeof(struct handoff_rec) ||
        h->total_bytes != sizeof(struct handoff_shm))
        return -EBADMSG;
    if (bytes < sizeof(struct handoff_shm))
        return -EMSGSIZE;
    t->shm = h;
    return 0;
}

static struct handoff_rec *rec_of(handoff_table *t, uint16_t worker)
{
    if (!t || !t->shm || worker >= HANDOFF_MAX_WORKERS)
        return NULL;
    return &t->shm->rec[worker];
}

/* The generation of a slot held by (worker, inc) in state st, or -EPERM. */
static int held_gen(ring *r, uint32_t slot, uint16_t worker, uint32_t inc, ring_state st, uint32_t *gen)
{
    ring_slot_info si;
    int rc = ring_slot_read(r, slot, &si);
    if (rc < 0)
        return rc;
    if (si.state != st || si.worker != worker || si.incarnation != (inc & RING_INC_MASK))
        return -EPERM;
    *gen = si.gen;
    return 0;
}

int handoff_begin(handoff_table *t, uint16_t worker, uint32_t inc, const handoff_end *in, const handoff_end *out)
{
    struct handoff_rec *h = rec_of(t, worker);
    if (!h || !in || !out || (!in->r && !out->r))
        return -EINVAL;
    uint32_t in_gen = 0, out_gen = 0;
    int rc;
    if (in->r && (rc = held_gen(in->r, in->slot, worker, inc, RING_READING, &in_gen)) < 0)
        return rc;
    if (out->r && (rc = held_gen(out->r, out->slot, worker, inc, RING_WRITING, &out_gen)) < 0)
        return rc;
    /* Phase goes to NONE first, so a death while the fields are half-written leaves no
     * intent (recovery then falls back to ring_reclaim_owner, which is right: nothing
     * was published yet). */
    atomic_store_explicit(&h->phase, HANDOFF_NONE, memory_order_release);
    atomic_store_explicit(&h->incarnation, inc, memory_order_relaxed);
    atomic_store_explicit(&h->in_ring, in->r ? ring_id(in->r) : HANDOFF_EXTERNAL, memory_order_relaxed);
    atomic_store_explicit(&h->in_slot, in->r ? in->slot : 0, memory_order_relaxed);
    atomic_store_explicit(&h->in_gen, in_gen, memory_order_relaxed);
    atomic_store_explicit(&h->in_token, in->token, memory_order_relaxed);
    atomic_store_explicit(&h->out_ring, out->r ? ring_id(out->r) : HANDOFF_EXTERNAL, memory_order_relaxed);
    atomic_store_explicit(&h->out_slot, out->r ? out->slot : 0, memory_order_relaxed);
    atomic_store_explicit(&h->out_gen, out_gen, memory_order_relaxed);
    atomic_store_explicit(&h->out_token, out->token, memory_order_relaxed);
    atomic_store_explicit(&h->phase, HANDOFF_INTENT, memory_order_release);
    return 0;
}

int handoff_mark_published(handoff_table *t, uint16_t worker)
{
    struct handoff_rec *h = rec_of(t, worker);
    if (!h)
        return -EINVAL;
    if (atomic_load_explicit(&h->phase, memory_order_relaxed) != HANDOFF_INTENT)
        return -EPERM;
    atomic_store_explicit(&h->phase, HANDOFF_PUBLISHED, memory_order_release);
    return 0;
}

int handoff_publish(handoff_table *t, uint16_t worker, uint32_t inc, ring *out, uint32_t out_slot)
{
    int rc = ring_publish(out, out_slot, worker, inc);
    if (rc < 0)
        return rc;
    return handoff_mark_published(t, worker);
}

int handoff_clear(handoff_table *t, uint16_t worker)
{
    struct handoff_rec *h = rec_of(t, worker);
    if (!h)
        return -EINVAL;
    atomic_store_explicit(&h->phase, HANDOFF_NONE, memory_order_release);
    return 0;
}

int handoff_finish(handoff_table *t, uint16_t worker, uint32_t inc, ring *in, uint32_t in_slot)
{
    if (in) {
        int rc = ring_release(in, in_slot, worker, inc);
        if (rc < 0)
            return rc;
    }
    return handoff_clear(t, worker);
}

int handoff_read(handoff_table *t, uint16_t worker, handoff_intent *o)
{
    struct handoff_rec *h = rec_of(t, worker);
    if (!h || !o)
        return -EINVAL;
    o->phase = atomic_load_explicit(&h->phase, memory_order_acquire);
    o->incarnation = atomic_load_explicit(&h->incarnation, memory_order_relaxed);
    o->in_ring = atomic_load_explicit(&h->in_ring, memory_order_relaxed);
    o->in_slot = atomic_load_explicit(&h->in_slot, memory_order_relaxed);
    o->in_gen = atomic_load_explicit(&h->in_gen, memory_order_relaxed);
    o->in_token = atomic_load_explicit(&h->in_token, memory_order_relaxed);
    o->out_ring = atomic_load_explicit(&h->out_ring, memory_order_relaxed);
    o->out_slot = atomic_load_explicit(&h->out_slot, memory_order_relaxed);
    o->out_gen = atomic_load_explicit(&h->out_gen, memory_order_relaxed);
    o->out_token = atomic_load_explicit(&h->out_token, memory_order_relaxed);
    return 0;
}

static ring *find_ring(ring **rings, int nrings, uint32_t id)
{
    for (int i = 0; i < nrings; i++)
        if (rings[i] && rings[i]->shm && ring_id(rings[i]) == id)
            return rings[i];
    return NULL;
}

int handoff_recover_ex(handoff_table *t, uint16_t worker, ring **rings, int nrings, const handoff_hooks *hooks,
                       ring_reclaim_report *rep)
{
    if (!rec_of(t, worker) || !rep || nrings < 0 || (nrings > 0 && !rings))
        return -EINVAL;
    handoff_intent it;
    (void)handoff_read(t, worker, &it);
    if (it.phase != HANDOFF_NONE) {
        ring *in = NULL, *out = NULL;
        if (it.in_ring != HANDOFF_EXTERNAL && !(in = find_ring(rings, nrings, it.in_ring)))
            return -ENOENT;
        if (it.out_ring != HANDOFF_EXTERNAL && !(out = find_ring(rings, nrings, it.out_ring)))
            return -ENOENT;
        int published = it.phase == HANDOFF_PUBLISHED;
        if (!published && out) {
            /* Died between handoff_begin and handoff_mark_published: the output slot
             * tells. Still WRITING by us with the recorded generation = not published;
             * anything else = the publish CAS happened (the generation moved on). */
            ring_slot_info si;
            int rc = ring_slot_read(out, it.out_slot, &si);
            if (rc < 0)
                return rc;
            published = !(si.state == RING_WRITING && si.worker == worker && si.gen == it.out_gen);
        } else if (!published && hooks && hooks->out_done) {
            published = hooks->out_done(hooks->ctx, worker, it.out_token) > 0;
        }
        if (published && in) {
            /* The batch moved on: the input copy is dead weight. -ESTALE = the worker
             * had already released it (died before clearing the intent): fine. */
            int rc = ring_reclaim_release(in, it.in_slot, worker, it.in_gen);
            if (rc == 0)
                rep->handed_on++;
            else if (rc != -ESTALE)
                return rc;
        }
        if (!in && hooks && hooks->in_resolved)
            hooks->in_resolved(hooks->ctx, worker, it.in_token, published);
        /* not published: ring_reclaim_owner below frees the output and requeues the input */
        rep->intents++;
        (void)handoff_clear(t, worker);
    }
    for (int i = 0; i < nrings; i++) {
        if (!rings[i])
            continue;
        int rc = ring_reclaim_owner(rings[i], worker, rep);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int handoff_recover(handoff_table *t, uint16_t worker, ring **rings, int nrings, ring_reclaim_report *rep)
{
    return handoff_recover_ex(t, worker, rings, nrings, NULL, rep);
}
