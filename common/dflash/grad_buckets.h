/* grad_buckets.h: the drafter's gradient all-reduce in buckets, overlapped with the
 * backward pass (prefix gb_). docs/allreduce.md, "Bucketed overlap".
 *
 * The backward produces the flat gradient array from its end to its start and says so
 * through dflash_grad_hook (dflash_model.h): after the final norm, after each layer, after
 * the context path. A plan cuts the array at those boundaries into buckets of at least
 * bucket_floats each (0: one bucket per boundary), highest offsets first; it depends only on
 * the drafter's shape, so every rank has the same plan, which ar_bucket_ready requires. A
 * step hands each bucket to the all-reduce as soon as the backward has passed its lower
 * end, and gb_step_finish hands over whatever is left (all of it, for a rank whose step had
 * no backward: an empty step, or a batch without loss positions) and waits for the sums.
 *
 * Bits: with the shm backend each bucket's sum is exactly the bits of one ar_allreduce_sum
 * over the whole array, so bucketing changes nothing in the result (tests/test_grad_buckets.c).
 *
 * Use, per optimizer step:
 *     gb_step s; gb_step_begin(&s, &plan, ar, g);
 *     ... backward of the last document with hook = gb_step_hook(&s) ...
 *     rc = gb_step_finish(&s);           // every bucket reduced, or the first error
 * The caller must not touch g between gb_step_begin and gb_step_finish except through the
 * backward (which writes only below the buckets handed over so far).
 */
#ifndef DF_GRAD_BUCKETS_H
#define DF_GRAD_BUCKETS_H

#include <stddef.h>
#include <stdint.h>

#include "dflash/dflash_config.h"
#include "dflash/dflash_model.h"
#include "ipc/allreduce.h"

#define GB_MAX_BUCKETS (DFLASH_MAX_LAYERS + 2)

typedef struct gb_plan {
    int n;                      /* buckets */
    size_t lo[GB_MAX_BUCKETS];  /* bucket k = floats [lo[k], hi[k]) of the flat array; */
    size_t hi[GB_MAX_BUCKETS];  /* k = 0 is the highest range (the first the backward finishes) */
} gb_plan;

/* The plan for drafter c with buckets of at least bucket_floats. 0 or -EINVAL. */
int gb_plan_make(gb_plan *p, const dflash_config *c, size_t bucket_floats);

typedef struct gb_step {
    const gb_plan *plan;
    ar_comm *ar;
    float *g;         /* the flat gradient array (borrowed) */
    int next;         /* the next bucket to hand over */
    int early;        /* buckets handed over from inside the backward (for the metrics) */
    int rc;           /* the first error of ar_bucket_ready */
    dflash_grad_hook hook;
} gb_step;

void gb_step_begin(gb_step *s, const gb_plan *p, ar_comm *ar, float *g);
/* The hook to pass to the backward whose gradients complete the step (the last one). */
const dflash_grad_hook *gb_step_hook(gb_step *s);
/* Hands over the buckets not yet handed over, then waits for all of them (ar_wait_all).
 * 0, or the first error (-ETIMEDOUT, -ECANCELED, ...: ar_strerror). wait_ns, if not NULL,
 * gets the time spent waiting here (the part of the reduction the backward did not hide). */
int gb_step_finish(gb_step *s, int64_t *wait_ns);

#endif
