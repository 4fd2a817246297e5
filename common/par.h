/* par.h: run a loop over [0, n) on several threads, each a contiguous range (prefix par_).
 *
 * For element-wise work over large buffers (the bf16 -> fp32 conversion of a model's
 * tensors, the NaN/Inf scan of their bytes): every element's result is the same whatever
 * the split, so the output does not depend on the thread count. A range per thread, the
 * last one on the calling thread; a thread that cannot be started runs its range on the
 * calling thread too. */
#ifndef DF_PAR_H
#define DF_PAR_H

#include <stdint.h>

#define PAR_MAX_THREADS 64

/* Online CPUs, 1..PAR_MAX_THREADS (read once per process). */
int par_threads(void);

/* Call fn(ctx, lo, hi, part) over ranges covering [0, n) in order of part = 0, 1, ...,
 * with at least min_per_part elements each (so small loops stay on one thread) and at most
 * par_threads() parts. Returns the number of parts (0 when n is 0). */
int par_for(uint64_t n, uint64_t min_per_part, void (*fn)(void *ctx, uint64_t lo, uint64_t hi, int part), void *ctx);

#endif
