/* futex.c: raw futex(2) syscalls (glibc has no wrapper). See futex.h. */
#include "futex.h"

#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int futex_wait_until(_Atomic uint32_t *word, uint32_t expected, uint64_t deadline_ns)
{
    struct timespec ts, *tsp = NULL;
    if (deadline_ns != FUTEX_NO_DEADLINE) {
        ts.tv_sec = (time_t)(deadline_ns / 1000000000ull);
        ts.tv_nsec = (long)(deadline_ns % 1000000000ull);
        tsp = &ts;
    }
    /* FUTEX_WAIT_BITSET takes an absolute timeout on CLOCK_MONOTONIC (no
     * FUTEX_CLOCK_REALTIME); no FUTEX_PRIVATE_FLAG: the word is in shared memory. */
    long rc = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_BITSET, expected, tsp, NULL, FUTEX_BITSET_MATCH_ANY);
    if (rc == 0)
        return 0;
    if (errno == EWOULDBLOCK)
        return -EAGAIN;
    return -errno;
}

int futex_wake(_Atomic uint32_t *word, int n)
{
    long rc = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, n, NULL, NULL, 0);
    return rc < 0 ? -errno : (int)rc;
}
