/* ring.h: a ring of slot leases in shared memory, for handing batches between worker
 * processes by reference (descriptors, never payloads), with futex signalling.
 *
 * Why it is shaped this way (docs/ring.md has the full protocol and the model check):
 * - Each slot has ONE 64-bit atomic control word: state | owner worker | owner
 *   incarnation | generation. Every transition is one CAS on that word, so a SIGKILL
 *   leaves a slot in its old or its new state, never between, and the generation
 *   (bumped on every transition) makes ABA impossible for a stalled CAS.
 * - States: FREE -> WRITING (producer owns) -> READY -> READING (consumer owns) -> FREE,
 *   plus POISONED (a batch whose consumers died max_attempts times; parked until the
 *   orchestrator has recorded it, then freed with ring_free_poisoned).
 * - Only the owner moves a slot out of WRITING/READING. The one exception is the
 *   orchestrator, and only after it reaped the owner (ring_reclaim_owner,
 *   ring_reclaim_release, and handoff_recover in handoff.h).
 * - Waiting is on shared futexes (two 32-bit sequence words, each on its own cache line)
 *   with a timeout, so callers keep heartbeating; publish/release always bump and wake.
 * - The ring lives in caller-provided shared memory (a memfd mapped by every process);
 *   struct ring is a process-local handle with no resources of its own (nothing to close).
 *
 * Control word (bit 63 .. bit 0):
 *   [63:32] generation (32 bits, +1 per transition, wraps)
 *   [31:20] owner incarnation, low 12 bits (the orchestrator reaps a dead incarnation
 *           before it starts the next, so truncation cannot confuse two live owners;
 *           it only guards against a stale process that outlived its reaping)
 *   [19:4]  owner worker id (16 bits; meaningful in WRITING and READING only)
 *   [3:0]   state (enum ring_state)
 *
 * Errors: 0 or -errno. -EINVAL bad argument or slot; -EPERM caller is not the slot's
 * owner or the slot is not in the state the call needs; -ETIMEDOUT nothing came before
 * the timeout; -EPIPE ring closed for shutdown; ring_open: -EBADMSG bad magic, -EPROTO
 * other version, -EMSGSIZE buffer smaller than the ring needs. ring_strerror() names them.
 */
#ifndef DF_RING_H
#define DF_RING_H

#include <stdint.h>

#define RING_MAGIC 0x3130474E49524644ull /* "DFRING01" little-endian, at byte offset 0 */
#define RING_VERSION 1u
#define RING_MAX_SLOTS 4096u
#define RING_INC_BITS 12u
#define RING_INC_MASK ((1u << RING_INC_BITS) - 1u)

typedef enum ring_state {
    RING_FREE = 0,
    RING_WRITING = 1,
    RING_READY = 2,
    RING_READING = 3,
    RING_POISONED = 4,
} ring_state;

/* A slot descriptor: plain data, copied by value; names a payload in an arena. */
typedef struct ring_desc {
    uint64_t batch_id;
    uint64_t offset; /* bytes into arena arena_id */
    uint64_t bytes;
    uint32_t arena_id;
    uint32_t flags;
    uint32_t dims[8];
    uint64_t checksum;
    uint64_t user[4];
} ring_desc;

struct ring_shm; /* layout in ring.c and docs/ring.md */

/* Process-local handle. shm points into the caller's mapping (borrowed, never freed). */
typedef struct ring {
    struct ring_shm *shm;
    uint32_t nslots;
} ring;

/* Bytes of shared memory a ring of nslots needs (a multiple of 64). 0 if nslots is 0
 * or above RING_MAX_SLOTS. */
uint64_t ring_shm_bytes(uint32_t nslots);

/* Lay out a new ring in mem (64-byte aligned, >= ring_shm_bytes(nslots) bytes, zeroed
 * or not): every slot FREE, generation 0. Not safe while any process uses the memory.
 * max_attempts >= 1: a batch whose consumer died this many times is poisoned.
 * ring_id is the caller's name for the ring (handoff intents refer to rings by it). */
int ring_format(void *mem, uint64_t bytes, uint32_t nslots, uint32_t max_attempts, uint32_t ring_id);

/* Validate the header in mem (magic, version, sizes against bytes) and fill r. */
int ring_open(ring *r, void *mem, uint64_t bytes);

uint32_t ring_id(const ring *r);
uint32_t ring_max_attempts(const ring *r);

/* --- producer: FREE -> WRITING, fill the descriptor, WRITING -> READY (+ futex wake) ---
 * timeout_ns: < 0 wait without limit, 0 try once, > 0 wait up to that long.
 * -ETIMEDOUT when no FREE slot came; -EPIPE when the ring is closed (even if slots are
 * free: a closed ring takes no new batches). On success *slot is owned by
 * (worker, incarnation) and its attempts counter is reset to 0. */
int ring_acquire_free(ring *r, uint16_t worker, uint32_t incarnation, int64_t timeout_ns, uint32_t *slot);
/* The slot's descriptor, for its owner to fill (WRITING) or read (READING). Pointer into
 * shared memory, valid while r's mapping is; NULL for a bad slot index. */
ring_desc *ring_desc_at(ring *r, uint32_t slot);
/* WRITING(worker, incarnation) -> READY, stamped with a publish sequence number so
 * consumers take the oldest first; bumps ready_seq and wakes waiters. Everything the
 * producer wrote before (descriptor, payload) is visible to the consumer that acquires. */
int ring_publish(ring *r, uint32_t slot, uint16_t worker, uint32_t incarnation);

/* --- consumer: READY -> READING ... READING -> FREE (+ futex wake) ---
 * Takes the READY slot with the lowest publish sequence (FIFO-ish; a requeued batch keeps
 * its old sequence and so goes first). A closed ring still hands out READY slots (drain);
 * it returns -EPIPE instead of waiting once none is left. */
int ring_acquire_ready(ring *r, uint16_t worker, uint32_t incarnation, int64_t timeout_ns, uint32_t *slot);
/* The same transition for the READY slot whose descriptor names batch_id (the deterministic
 * drafter consumes batches in plan order, whatever order they arrive in). Only WHICH slot
 * is tried differs from ring_acquire_ready: the CAS and the wait are the same (the model in
 * tests/ring_model.pml already lets a consumer take any READY slot). Waits while that batch
 * is not READY; -EPIPE when the ring is closed and it is not there. */
int ring_acquire_ready_batch(ring *r, uint16_t worker, uint32_t incarnation, uint64_t batch_id, int64_t timeout_ns,
                             uint32_t *slot);
/* READING(worker, incarnation) -> FREE; bumps free_seq and wakes waiters. */
int ring_release(ring *r, uint32_t slot, uint16_t worker, uint32_t incarnation);

/* --- orchestrator only, after the owner was reaped (never while it may run) ---
 * WRITING(worker, any incarnation) -> FREE; READING(worker) -> READY with attempts+1,
 * or -> POISONED when attempts reaches max_attempts. Counts are ADDED to rep (zero it
 * first); up to 16 poisoned batch ids and slots are listed, poisoned counts them all.
 * Process the dead worker's hand-off intent first (handoff_recover does both). */
#define RING_REPORT_IDS 16
typedef struct ring_reclaim_report {
    uint32_t freed, requeued, poisoned;
    uint64_t poisoned_batch_ids[RING_REPORT_IDS];
    /* added beyond the contract: */
    uint32_t poisoned_slots[RING_REPORT_IDS]; /* slot of each listed poisoned batch */
    uint32_t poisoned_rings[RING_REPORT_IDS]; /* ring_id of each listed poisoned batch */
    uint32_t handed_on;                       /* inputs freed by handoff_recover because their output was published */
    uint32_t intents;                         /* intents handoff_recover found and resolved */
} ring_reclaim_report;
int ring_reclaim_owner(ring *r, uint16_t worker, ring_reclaim_report *rep);
/* READING(worker, generation gen) -> FREE, as if the dead owner had released it: the
 * batch moved on (handoff_recover uses it when the output was published). -ESTALE when
 * the slot is no longer in exactly that lease (the owner got further than recorded). */
int ring_reclaim_release(ring *r, uint32_t slot, uint16_t worker, uint32_t gen);
/* POISONED -> FREE, after the orchestrator recorded the batch (ledger_mark_poisoned).
 * -EPERM if the slot is not POISONED. */
int ring_free_poisoned(ring *r, uint32_t slot);

/* One slot's control word decoded, plus its counters (a racy snapshot unless the caller
 * owns the slot or the owner is dead). */
typedef struct ring_slot_info {
    ring_state state;
    uint16_t worker;
    uint32_t incarnation; /* low RING_INC_BITS bits */
    uint32_t gen;
    uint32_t attempts;
    uint64_t pub_seq;
} ring_slot_info;
int ring_slot_read(ring *r, uint32_t slot, ring_slot_info *info);

typedef struct ring_stats {
    uint32_t free, writing, ready, reading, poisoned;
    uint64_t published, released, poisoned_total;
    uint64_t oldest_lease_ns; /* age of the oldest WRITING/READING lease, 0 if none */
} ring_stats;
/* Snapshot for metrics and dfctl status (racy but each word is read atomically). */
void ring_stats_read(ring *r, ring_stats *st);

/* Set the closed flag and wake every waiter: waits return -EPIPE from now on. */
void ring_close_for_shutdown(ring *r);
int ring_is_closed(ring *r);

const char *ring_strerror(int err);

#endif
