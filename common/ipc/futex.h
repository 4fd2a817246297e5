/* futex.h: the two futex calls the rings need, on 32-bit words in SHARED memory.
 *
 * Shaped for cross-process use: never FUTEX_PRIVATE_FLAG (the kernel keys a shared
 * futex by the page, so two processes mapping the same memfd page wait on the same
 * queue). Waits take an absolute CLOCK_MONOTONIC deadline (FUTEX_WAIT_BITSET), so a
 * caller looping on EINTR/spurious wakes never stretches its timeout.
 */
#ifndef DF_FUTEX_H
#define DF_FUTEX_H

#include <stdatomic.h>
#include <stdint.h>

#define FUTEX_NO_DEADLINE UINT64_MAX

/* Sleep while *word == expected, until woken or CLOCK_MONOTONIC reaches deadline_ns
 * (FUTEX_NO_DEADLINE: no limit). 0 = woken (maybe spuriously), -EAGAIN = *word already
 * differed, -ETIMEDOUT, -EINTR, or another -errno. The caller always re-checks its
 * condition: a 0 return promises nothing. */
int futex_wait_until(_Atomic uint32_t *word, uint32_t expected, uint64_t deadline_ns);

/* Wake up to n waiters on word (INT32_MAX: all). Returns the number woken or -errno. */
int futex_wake(_Atomic uint32_t *word, int n);

#endif
