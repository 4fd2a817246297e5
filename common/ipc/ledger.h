/* ledger.h: the per-epoch batch plan and each batch's state, in shared memory.
 *
 * Why it exists: the pipeline promises that every sample is trained exactly once per epoch,
 * whatever crashes. The plan (built once per epoch from the sample lengths, a seed and the
 * epoch number) is a deterministic list of batches 0..N-1, each a list of sample indices
 * whose tokens fit a budget. The ledger keeps one 64-bit atomic word per batch that says
 * where the batch is; every transition is one CAS, so a SIGKILL at any instant leaves a
 * batch in its old or its new state, never in between.
 *
 *   PENDING --claim--> CLAIMED(worker, incarnation) --set_in_ring--> IN_RING
 *   CLAIMED | IN_RING --mark_trained(step)--> TRAINED(step) --commit(S >= step)--> COMMITTED
 *   TRAINED(step > S) --rewind(S)--> PENDING      (drafter group restarted from checkpoint S)
 *   CLAIMED(worker) --reclaim_owner(worker)--> PENDING   (orchestrator, after reaping worker)
 *   any state but COMMITTED --mark_poisoned--> POISONED
 *
 * Who calls what: target workers claim (ledger_claim_next in fast mode, ledger_claim_window
 * in deterministic mode; ledger_claim picks), read the sample list, and call ledger_set_in_ring right AFTER
 * ring_publish; drafter rank 0 marks trained and commits after a checkpoint; the orchestrator
 * formats, reclaims, rewinds, poisons and audits. docs/ledger.md has the whole story.
 *
 * Shared memory: the orchestrator builds the plan (heap), sizes the segment with
 * ledger_shm_bytes, copies the plan in with ledger_format; every process maps the segment
 * and calls ledger_open. The plan part is immutable after ledger_format; only the state
 * words and the counters change.
 *
 * Return values: 0 or -errno. -EINVAL bad argument or a transition not allowed from the
 * batch's current state, -ERANGE batch id out of range, -EALREADY the batch is already
 * trained/committed (a second mark_trained would count it twice), -EBUSY claimed by someone
 * else, -ENODATA nothing left to claim, -EPROTO bad segment (magic/version/size).
 */
#ifndef DF_LEDGER_H
#define DF_LEDGER_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    LEDGER_PENDING = 0,
    LEDGER_CLAIMED = 1,
    LEDGER_IN_RING = 2,
    LEDGER_TRAINED = 3,
    LEDGER_COMMITTED = 4,
    LEDGER_POISONED = 5,
} ledger_state;

/* One batch of the plan: entries [first, first+count) of the plan's sample arrays. */
typedef struct ledger_batch {
    uint32_t first;  /* index into sample_idx / sample_len */
    uint32_t count;  /* number of samples */
    uint64_t tokens; /* sum of effective lengths, <= token_budget */
} ledger_batch;

/* A plan on the heap (ledger_plan_build allocates, ledger_plan_free releases). */
typedef struct ledger_plan {
    uint64_t seed;
    uint32_t epoch;
    uint32_t max_seq_len;
    uint64_t token_budget;
    uint32_t n_samples;
    uint32_t n_batches;
    uint32_t n_truncated;  /* samples whose length was cut to max_seq_len */
    uint32_t *sample_idx;  /* [n_samples]: sample indices, batch after batch */
    uint32_t *sample_len;  /* [n_samples]: effective length (min(len, max_seq_len)) of each */
    ledger_batch *batches; /* [n_batches] */
    uint64_t data_digest;  /* the caller's fingerprint of the data files (0 if none); ledger_format
                              * stores it, snapshots carry it (ledger_plan_build leaves it 0) */
} ledger_plan;

/* Process-local handle on a mapped ledger segment. */
typedef struct ledger {
    struct ledger_shm *shm;
    uint64_t bytes;
    uint32_t n_batches, n_samples;
    const ledger_batch *batches; /* [n_batches], in the segment */
    const uint32_t *sample_idx;  /* [n_samples], in the segment */
    const uint32_t *sample_len;  /* [n_samples], in the segment */
    struct ledger_slot *slots;   /* [n_batches], the state words */
} ledger;

typedef struct ledger_counts_t {
    uint32_t pending, claimed, in_ring, trained, committed, poisoned;
} ledger_counts_t;

/* Snapshot of one batch's state word. */
typedef struct ledger_batch_status {
    ledger_state state;
    uint16_t worker;      /* CLAIMED / IN_RING: the claimer */
    uint32_t incarnation; /* CLAIMED / IN_RING */
    uint64_t step;        /* TRAINED / COMMITTED: the optimizer step */
    uint32_t claims;      /* how many times it was claimed (re-claims after rewind/reclaim) */
    uint32_t trainings;   /* how many times it was marked trained (> 1 only after a rewind) */
    uint32_t replays;     /* how many times a resume restored it (COMMITTED/POISONED) from ledger.bin */
} ledger_batch_status;

/* What ledger_restore did: batches restored COMMITTED / POISONED, and returned to PENDING
 * because the snapshot had them TRAINED after its checkpoint (rewound) or in flight (reclaimed). */
typedef struct ledger_restore_counts {
    uint32_t committed, poisoned, rewound, reclaimed;
} ledger_restore_counts;

/* Byte offset of the checksum field in a snapshot (docs/ledger.md, "ledger.bin"). */
#define LEDGER_CHECKSUM_OFFSET 112

/* --- plan ---------------------------------------------------------------------------------
 * Deterministic in (lens, n, seed, epoch, token_budget, max_seq_len) on every machine.
 * Requires n >= 1, every lens[i] >= 1, 1 <= max_seq_len <= token_budget. Lengths above
 * max_seq_len are truncated (p->sample_len holds the effective length; p->n_truncated counts
 * them). p must be zeroed or freed; on error p stays zeroed. */
int ledger_plan_build(ledger_plan *p, const uint32_t *lens, uint32_t n, uint64_t seed, uint32_t epoch,
                      uint64_t token_budget, uint32_t max_seq_len);
void ledger_plan_free(ledger_plan *p); /* safe on a zeroed plan; zeroes it */

/* --- segment ------------------------------------------------------------------------------ */
uint64_t ledger_shm_bytes(const ledger_plan *p);
/* Copy the plan into mem (bytes >= ledger_shm_bytes(p)), every batch PENDING. Only the
 * creator calls it, before handing the segment out. */
int ledger_format(void *mem, uint64_t bytes, const ledger_plan *p);
/* Validate magic, version and every size/offset against bytes; fill l. -EPROTO if bad. */
int ledger_open(ledger *l, void *mem, uint64_t bytes);
uint64_t ledger_seed(const ledger *l);
uint32_t ledger_epoch(const ledger *l);
uint32_t ledger_n_batches(const ledger *l);
uint64_t ledger_committed_step(const ledger *l);
uint64_t ledger_plan_hash(const ledger *l);
uint64_t ledger_data_digest(const ledger *l);

/* --- snapshots (ledger.bin) ---------------------------------------------------------------
 * ledger_snapshot: a consistent copy of the segment for persisting (malloc'd with
 * aligned_alloc, caller frees; *len bytes), with its checksum (FNV-1a 64 of the bytes, the
 * checksum field read as 0) filled in. The live segment's checksum stays 0.
 * ledger_snapshot_open: open a snapshot read back from disk (mem 64-byte aligned) and trust
 * nothing: magic (-EPROTO), format version (-EPROTONOSUPPORT), size and checksum, layout,
 * plan hash and coverage, and states that no sequence of transitions produces (a COMMITTED
 * batch with no step, past the committed step, never trained or trained more often than
 * claimed; a stat above the sum of its per-batch counters): -EBADMSG. err says what and
 * where (batch id, values).
 * ledger_restore: copy a verified snapshot (same plan hash) into a freshly formatted ledger
 * l: COMMITTED (with its step) and POISONED batches stay, everything else is PENDING again;
 * the per-batch claims/trainings and the stats are carried over unchanged, so a restore is
 * not a training: it raises only "replays" (per batch) and stats.replayed; TRAINED batches
 * returned count as rewound, in-flight ones as reclaimed. The committed step is the
 * snapshot's. -EINVAL plan mismatch, -EBUSY l is not fresh. */
int ledger_snapshot(ledger *l, void **buf, uint64_t *len);
int ledger_snapshot_open(ledger *l, void *mem, uint64_t bytes, char *err, size_t errlen);
int ledger_restore(ledger *l, ledger *snap, ledger_restore_counts *out);

/* --- transitions -------------------------------------------------------------------------- */
/* Fast mode: the next PENDING batch (a shared cursor, then a scan for batches that a rewind
 * or reclaim returned). -ENODATA when none is PENDING right now (others may still come back
 * if a claimer dies: check ledger_epoch_done before stopping). */
int ledger_claim_next(ledger *l, uint16_t worker, uint32_t inc, uint64_t *batch_id);
/* Claim this one batch (the orchestrator's --resume replay uses it). -EBUSY if
 * CLAIMED/IN_RING, -EALREADY if TRAINED/COMMITTED, -EINVAL if POISONED, -EAGAIN if it
 * changed state under us (retry). */
int ledger_claim_batch(ledger *l, uint64_t batch_id, uint16_t worker, uint32_t inc);
/* Deterministic mode (docs/ledger.md, "Deterministic mode"). A batch is "open" while it
 * still has to be trained: PENDING, CLAIMED or IN_RING. The low-water mark is the lowest
 * open id (n_batches when none is open); a deterministic drafter trains batches in id
 * order, so it always waits for the low-water batch (rank r of R: the r-th open id).
 * ledger_next_open: the k lowest open ids into ids[], returns how many (< k near the end).
 * ledger_claim_window: claim the lowest PENDING id in [low, low + window); -ENODATA when
 * none is (the window is full: wait for the drafter). window must be >= 1 and at most the
 * smallest ring capacity on the path, or the pipeline can deadlock (the argument is in
 * docs/ledger.md). These scan the state words from id 0: O(n_batches) per call.
 * ledger_claim: window 0 = ledger_claim_next (fast mode), else ledger_claim_window. */
uint32_t ledger_next_open(ledger *l, uint32_t k, uint64_t *ids);
uint64_t ledger_low_water(ledger *l);
int ledger_claim_window(ledger *l, uint16_t worker, uint32_t inc, uint32_t window, uint64_t *batch_id);
int ledger_claim(ledger *l, uint16_t worker, uint32_t inc, uint32_t window, uint64_t *batch_id);
/* The plan's sample list of a batch: idx points into the segment (valid while mapped). */
int ledger_batch_samples(ledger *l, uint64_t batch_id, const uint32_t **idx, uint32_t *n);
/* Same plus the effective length of each sample ([n], min(len, max_seq_len)) and the token sum. */
int ledger_batch_info(ledger *l, uint64_t batch_id, const uint32_t **idx, const uint32_t **len, uint32_t *n,
                      uint64_t *tokens);
/* CLAIMED -> IN_RING (keeps the owner). Call right after ring_publish. -EALREADY if the
 * consumer already marked it trained (harmless), -EINVAL from any other state. */
int ledger_set_in_ring(ledger *l, uint64_t batch_id);
/* CLAIMED | IN_RING -> TRAINED(step), step >= 1. -EALREADY if TRAINED/COMMITTED. */
int ledger_mark_trained(ledger *l, uint64_t batch_id, uint64_t step);
/* Every TRAINED with step <= step -> COMMITTED; committed_step = step. -EINVAL if step is
 * below the recorded committed_step. */
int ledger_commit(ledger *l, uint64_t step);
/* Every TRAINED with step > step -> PENDING. -EINVAL if step < committed_step. */
int ledger_rewind(ledger *l, uint64_t step);
int ledger_rewind_ex(ledger *l, uint64_t step, uint32_t *n_returned);
/* Every CLAIMED by worker (any incarnation) -> PENDING. Orchestrator only, after the worker
 * was reaped and after the ring recovery (so a batch already published is IN_RING, not lost
 * and not duplicated: see docs/ledger.md, "crash windows"). */
int ledger_reclaim_owner(ledger *l, uint16_t worker);
int ledger_reclaim_owner_ex(ledger *l, uint16_t worker, uint32_t *n_returned);
/* Every CLAIMED and IN_RING batch -> PENDING (counted as reclaimed). Orchestrator only, when
 * every worker is reaped and the rings are re-formatted (the deterministic mode's restart of
 * the whole pipeline after a drafter death): what was in flight is produced again. */
int ledger_reset_in_flight(ledger *l, uint32_t *n_returned);
/* Any state but COMMITTED -> POISONED (-EALREADY if COMMITTED; 0 if already POISONED). */
int ledger_mark_poisoned(ledger *l, uint64_t batch_id);
int ledger_batch_status_get(ledger *l, uint64_t batch_id, ledger_batch_status *st);
void ledger_counts(ledger *l, ledger_counts_t *c);
/* JSON audit (written atomically): seed, epoch, counts, every batch's state and step,
 * poisoned ids, "status" ("complete", "incomplete": batches left, "violated": the plan does
 * not cover every sample once) and the "exactly_once" verdict (true, false, or null while
 * incomplete). 0 or -errno. */
int ledger_audit_write(ledger *l, const char *path);
/* The verdict alone: 1 iff every batch is COMMITTED or POISONED and every sample index
 * 0..n_samples-1 is in exactly one batch of the plan. */
int ledger_exactly_once(ledger *l);
int ledger_epoch_done(ledger *l); /* 1 when every batch is COMMITTED or POISONED */
const char *ledger_state_name(ledger_state s);

#endif
