/* handoff.h: per-worker hand-off intents, so that the orchestrator can tell, after a
 * worker died, whether the batch it was turning from an input into an output had moved
 * on (undo nothing, free the input) or not (free the output, requeue the input).
 *
 * Why: a stage publishes its output BEFORE it releases its input (a batch is never in
 * neither place), so after a death mid-stage the batch may be in both. Recovery by
 * ring_reclaim_owner alone would requeue the input and the downstream stage would see the
 * batch twice. The intent, written before the output is filled, names both leases with
 * their generations; the output's generation (or phase PUBLISHED) then says which copy is
 * the live one. One intent per worker, 1 input and at most 1 output each (the pipeline's
 * shape; a stage that merges or splits batches runs one intent per output).
 *
 * Stage protocol (the worker; each step one atomic store or one ring CAS):
 *   ring_acquire_ready(in)  -> in READING
 *   ring_acquire_free(out)  -> out WRITING
 *   handoff_begin           -> intent {in ring/slot/gen, out ring/slot/gen}, phase INTENT
 *   fill the output
 *   handoff_publish         -> ring_publish(out), then phase PUBLISHED
 *   handoff_finish          -> ring_release(in), then phase NONE
 * An end may be EXTERNAL instead of a ring slot, named by a 64-bit token (a ledger batch
 * id): a producer's input is a claimed ledger batch, a final consumer's output is a
 * commit. Recovery asks the caller's hooks about external ends (handoff_hooks).
 *
 * Recovery (orchestrator, after reaping the worker): handoff_recover_ex. See docs/ring.md
 * for the table of death points and what each resolves to.
 *
 * Ordering: intent fields are stored relaxed, then phase with release; the orchestrator
 * reads phase with acquire after waitpid(), then the fields.
 */
#ifndef DF_HANDOFF_H
#define DF_HANDOFF_H

#include <stdint.h>

#include "ring.h"

#define HANDOFF_MAGIC 0x31304646484644ull /* "DFHFF01" little-endian, at byte offset 0 */
#define HANDOFF_VERSION 1u
#define HANDOFF_MAX_WORKERS 64u
#define HANDOFF_EXTERNAL 0xFFFFFFFFu /* ring id of an end that is not a ring slot */

enum { HANDOFF_NONE = 0, HANDOFF_INTENT = 1, HANDOFF_PUBLISHED = 2 };

struct handoff_shm;
typedef struct handoff_table {
    struct handoff_shm *shm; /* borrowed pointer into the caller's mapping */
} handoff_table;

/* One end of a hand-off: a ring slot (r != NULL) or an external token (r == NULL). */
typedef struct handoff_end {
    ring *r;
    uint32_t slot;
    uint64_t token;
} handoff_end;

/* A decoded intent (handoff_read). */
typedef struct handoff_intent {
    uint32_t phase, incarnation;
    uint32_t in_ring, in_slot, in_gen;
    uint32_t out_ring, out_slot, out_gen;
    uint64_t in_token, out_token;
} handoff_intent;

uint64_t handoff_shm_bytes(void);
/* Lay out an empty table (every intent NONE) in mem (64-byte aligned). */
int handoff_format(void *mem, uint64_t bytes);
/* Validate magic/version/size. -EBADMSG, -EPROTO, -EMSGSIZE like ring_open. */
int handoff_open(handoff_table *t, void *mem, uint64_t bytes);

/* --- the worker (worker < HANDOFF_MAX_WORKERS) --- */
/* Record the intent. in/out that are ring slots must be held by (worker, inc) in READING
 * (in) / WRITING (out): -EPERM otherwise. At most one end may be external... both may be
 * rings; at least one must be a ring (-EINVAL). */
int handoff_begin(handoff_table *t, uint16_t worker, uint32_t inc, const handoff_end *in, const handoff_end *out);
/* The output is out: ring_publish(out) when it is a ring slot (skip that when it was an
 * external commit the caller already made), then phase PUBLISHED. */
int handoff_publish(handoff_table *t, uint16_t worker, uint32_t inc, ring *out, uint32_t out_slot);
int handoff_mark_published(handoff_table *t, uint16_t worker);
/* Release the input (ring_release when it is a ring slot, in may be NULL for external),
 * then clear the intent. */
int handoff_finish(handoff_table *t, uint16_t worker, uint32_t inc, ring *in, uint32_t in_slot);
int handoff_clear(handoff_table *t, uint16_t worker);
int handoff_read(handoff_table *t, uint16_t worker, handoff_intent *out);

/* --- the orchestrator, after reaping worker --- */
typedef struct handoff_hooks {
    /* External output (a commit) named by token: return 1 if it happened, 0 if not.
     * Without this hook an external output counts as not done (the input is requeued). */
    int (*out_done)(void *ctx, uint16_t worker, uint64_t token);
    /* External input named by token: moved_on = 1 if the output was published (the batch
     * is in the ring now: e.g. ledger_set_in_ring), 0 if it must be produced again
     * (e.g. back to pending). */
    void (*in_resolved)(void *ctx, uint16_t worker, uint64_t token, int moved_on);
    void *ctx;
} handoff_hooks;

/* Resolve worker's intent (published: input READING -> FREE; not published: output
 * WRITING -> FREE and input READING -> READY attempts+1, by the reclaim below), clear
 * it, then ring_reclaim_owner on every ring in rings[0..nrings). Counts are ADDED to rep.
 * -ENOENT if the intent names a ring that is not in rings (nothing is changed then). */
int handoff_recover_ex(handoff_table *t, uint16_t worker, ring **rings, int nrings, const handoff_hooks *hooks,
                       ring_reclaim_report *rep);
int handoff_recover(handoff_table *t, uint16_t worker, ring **rings, int nrings, ring_reclaim_report *rep);

#endif
