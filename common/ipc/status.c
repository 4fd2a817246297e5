/* status.c: format/open/heartbeat for the status segment (layout and ordering: status.h). */
#include "ipc/status.h"

#include <errno.h>
#include <stddef.h>
#include <time.h>

_Static_assert(sizeof(status_slot) == 128, "status_slot must be two cache lines");
_Static_assert(offsetof(status_shm, pause) % 64 == 0, "flags on their own line");
_Static_assert(offsetof(status_shm, slots) % 64 == 0, "slots line-aligned");

static const char *const state_names[] = {"idle",    "starting", "up",     "stopping", "backoff",
                                          "stopped", "done",     "failed", "groupwait"};

const char *status_state_name(uint32_t state)
{
    return state < sizeof state_names / sizeof state_names[0] ? state_names[state] : "?";
}

uint64_t status_shm_bytes(void)
{
    return sizeof(status_shm);
}

int status_format(void *mem, uint64_t bytes, uint32_t n_workers)
{
    if (!mem || bytes < sizeof(status_shm) || n_workers > STATUS_MAX_WORKERS)
        return -EINVAL;
    status_shm *s = mem;
    s->version = STATUS_VERSION;
    s->n_workers = n_workers;
    s->bytes = bytes;
    s->record_bytes = sizeof(status_slot);
    atomic_store_explicit(&s->pause, 0, memory_order_relaxed);
    atomic_store_explicit(&s->stop_claiming, 0, memory_order_relaxed);
    atomic_store_explicit(&s->stop, 0, memory_order_relaxed);
    atomic_store_explicit(&s->checkpoint_gen, 0, memory_order_relaxed);
    /* magic last: a reader that sees it sees a formatted header (the memfd is zero-filled) */
    atomic_thread_fence(memory_order_release);
    s->magic = STATUS_MAGIC;
    return 0;
}

int status_open(status_shm **out, void *mem, uint64_t bytes)
{
    *out = NULL;
    if (!mem || bytes < sizeof(status_shm))
        return -EINVAL;
    status_shm *s = mem;
    if (s->magic != STATUS_MAGIC || s->version != STATUS_VERSION || s->record_bytes != sizeof(status_slot) ||
        s->bytes > bytes || s->n_workers > STATUS_MAX_WORKERS)
        return -EPROTO;
    atomic_thread_fence(memory_order_acquire);
    *out = s;
    return 0;
}

void status_heartbeat(status_slot *s, uint64_t step, uint64_t items, uint64_t tokens)
{
    atomic_store_explicit(&s->step, step, memory_order_relaxed);
    atomic_store_explicit(&s->items, items, memory_order_relaxed);
    atomic_store_explicit(&s->tokens, tokens, memory_order_relaxed);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    atomic_store_explicit(&s->heartbeat_ns, (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec,
                          memory_order_release); /* pairs with the acquire in the readers */
}
