/* grad_buckets.h: the drafter's gradient all-reduce in buckets, overlapped with the
 * backward pass (prefix buckets_). docs/allreduce.md, "Bucketed overlap".
 *
 * The backward produces the flat gradient array from its end to its start and says so
 * through dflash_grad_hook (dflash_model.h): after the final norm, after each layer, after
 * the context path. A plan cuts the array at those boundaries into buckets of at least
 * bucket_floats each (0: one bucket per boundary), highest offsets first; it depends only on
 * the drafter's shape, so every rank has the same plan, which allreduce_bucket_ready requires. A
 * step hands each bucket to the all-reduce as soon as the backward has passed its lower
 * end, and buckets_step_finish hands over whatever is left (all of it, for a rank whose step had
 * no backward: an empty step, or a batch without loss positions) and waits for the sums.
 *
 * Bits: with the shm backend each bucket's sum is exactly the bits of one allreduce_sum
 * over the whole array, so bucketing changes nothing in the result (tests/test_grad_buckets.c).
 *
 * Use, per optimizer step:
 *     buckets_step s; buckets_step_begin(&s, &plan, ar, g);
 *     ... backward of the last document with hook = buckets_step_hook(&s) ...
 *     rc = buckets_step_finish(&s);           // every bucket reduced, or the first error
 * The caller must not touch g between buckets_step_begin and buckets_step_finish except through the
 * backward (which writes only below the buckets handed over so far).
 */
#ifndef DF_GRAD_BUCKETS_H
#define DF_GRAD_BUCKETS_H

#include <stddef.h>
#include <stdint.h>

#include "dflash/dflash_config.h"
#include "dflash/dflash_model.h"
#include "ipc/allreduce.h"

#define BUCKETS_MAX (DFLASH_MAX_LAYERS + 2)

typedef struct buckets_plan {
    int n;                  /* buckets */
    size_t lo[BUCKETS_MAX]; /* bucket k = floats [lo[k], hi[k]) of the flat array; */
    size_t hi[BUCKETS_MAX]; /* k = 0 is the highest range (the first the backward finishes) */
} buckets_plan;

/* The plan for drafter c with buckets of at least bucket_floats. 0 or -EINVAL. */
int buckets_plan_make(buckets_plan *p, const dflash_config *c, size_t bucket_floats);

typedef struct buckets_step {
    const buckets_plan *plan;
    allreduce_comm *ar;
    float *g;      /* the flat gradient array (borrowed) */
    int next;      /* the next bucket to hand over */
    int early;     /* buckets handed over from inside the backward (for the metrics) */
    int rc;        /* the first error of allreduce_bucket_ready (inside the backward) */
    char err[320]; /* and its message, for buckets_step_finish to report */
    dflash_grad_hook hook;
} buckets_step;

void buckets_step_begin(buckets_step *s, const buckets_plan *p, allreduce_comm *ar, float *g);
/* The hook to pass to the backward whose gradients complete the step (the last one). */
const dflash_grad_hook *buckets_step_hook(buckets_step *s);
/* Hands over the buckets not yet handed over, then waits for all of them (allreduce_wait_all).
 * 0, or the first error (-ETIMEDOUT, -ECANCELED, ...) with its message in err. wait_ns, if
 * not NULL, gets the time spent waiting here (the part of the reduction the backward did not
 * hide). */
int buckets_step_finish(buckets_step *s, int64_t *wait_ns, char *err, size_t errlen);

#endif
