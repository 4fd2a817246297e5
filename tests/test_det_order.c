/* test_det_order: the pieces of the deterministic mode (docs/ledger.md, "Deterministic
 * mode") on real shared memory:
 *  1. ledger: the low-water mark, ledger_next_open, the claim window (only ids below
 *     low + W, lowest first), ledger_claim's fast/deterministic switch, and
 *     ledger_reset_in_flight;
 *  2. ring: ring_acquire_ready_batch takes the READY slot of the named batch whatever its
 *     publish order, times out while that batch is not there, drains after close;
 *  3. the window argument under concurrency: 3 forked producers claim with W = the ring's
 *     capacity, sleep a random time per batch (so they publish out of order) and publish into
 *     one ring; the consumer takes exactly the low-water batch each time. Every batch must
 *     arrive, in plan order, without the ring ever filling up with batches the consumer cannot
 *     take (that would be a timeout here). With a window of capacity + 6 instead it stalls
 *     within a few dozen batches (tried by hand): the bound is what keeps it flowing. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ipc/ledger.h"
#include "ipc/ring.h"
#include "test_helpers.h"
#include "util.h"

/* A ledger of n one-sample batches in shared anonymous memory (survives fork). */
static void *make_ledger(ledger *l, uint32_t n, uint64_t *bytes)
{
    uint32_t *lens = malloc(n * sizeof *lens);
    T_ASSERT(lens);
    for (uint32_t i = 0; i < n; i++)
        lens[i] = 100; /* = the budget: one sample per batch */
    ledger_plan p = {0};
    T_ASSERT_RC(ledger_plan_build(&p, lens, n, 3, 0, 100, 100));
    T_ASSERT(p.n_batches == n);
    *bytes = ledger_shm_bytes(&p);
    void *mem = mmap(NULL, *bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    T_ASSERT(mem != MAP_FAILED);
    T_ASSERT_RC(ledger_format(mem, *bytes, &p));
    T_ASSERT_RC(ledger_open(l, mem, *bytes));
    ledger_plan_free(&p);
    free(lens);
    return mem;
}

static ledger_state state_of(ledger *l, uint64_t id)
{
    ledger_batch_status st;
    T_ASSERT_RC(ledger_batch_status_get(l, id, &st));
    return st.state;
}

static void test_ledger_window(void)
{
    ledger l;
    uint64_t bytes, id, ids[4];
    void *mem = make_ledger(&l, 10, &bytes);
    T_ASSERT(ledger_low_water(&l) == 0);
    T_ASSERT(ledger_claim_window(&l, 1, 1, 0, &id) == -EINVAL);
    for (uint64_t want = 0; want < 3; want++) { /* W = 3: ids 0, 1, 2 and then nothing */
        T_ASSERT_RC(ledger_claim(&l, 1, 1, 3, &id));
        T_ASSERT(id == want);
    }
    T_ASSERT(ledger_claim_window(&l, 2, 1, 3, &id) == -ENODATA);
    T_ASSERT(ledger_low_water(&l) == 0); /* claimed is still open */
    T_ASSERT_RC(ledger_set_in_ring(&l, 0));
    T_ASSERT_RC(ledger_mark_trained(&l, 0, 1));
    T_ASSERT(ledger_low_water(&l) == 1);
    T_ASSERT_RC(ledger_claim_window(&l, 2, 1, 3, &id));
    T_ASSERT(id == 3);
    T_ASSERT(ledger_next_open(&l, 4, ids) == 4 && ids[0] == 1 && ids[1] == 2 && ids[2] == 3 && ids[3] == 4);
    /* a batch that comes back (reclaim) is claimed first: the lowest pending one */
    T_ASSERT_RC(ledger_reclaim_owner(&l, 1)); /* 1, 2 back to pending */
    T_ASSERT_RC(ledger_claim_window(&l, 3, 1, 3, &id));
    T_ASSERT(id == 1);
    /* poisoned counts as behind the drafter: the window moves past it */
    T_ASSERT_RC(ledger_mark_poisoned(&l, 2));
    T_ASSERT(ledger_next_open(&l, 2, ids) == 2 && ids[0] == 1 && ids[1] == 3);
    T_ASSERT(ledger_claim_window(&l, 3, 1, 2, &id) == -ENODATA); /* [1, 3) : 1 claimed, 2 poisoned */
    /* fast mode claims anything pending */
    T_ASSERT_RC(ledger_claim(&l, 4, 1, 0, &id));
    T_ASSERT(id == 4);
    /* the deterministic restart: everything in flight back to pending, trained untouched */
    T_ASSERT_RC(ledger_set_in_ring(&l, 3));
    uint32_t back = 0;
    T_ASSERT_RC(ledger_reset_in_flight(&l, &back));
    T_ASSERT(back == 3); /* 1 (claimed), 3 (in ring), 4 (claimed) */
    T_ASSERT(state_of(&l, 0) == LEDGER_TRAINED && state_of(&l, 1) == LEDGER_PENDING &&
             state_of(&l, 2) == LEDGER_POISONED && state_of(&l, 3) == LEDGER_PENDING &&
             state_of(&l, 4) == LEDGER_PENDING);
    ledger_counts_t c;
    ledger_counts(&l, &c);
    T_ASSERT(c.pending == 8 && c.claimed == 0 && c.in_ring == 0 && c.trained == 1 && c.poisoned == 1);
    /* the pending hint stayed an upper bound: fast claims still find every pending batch */
    uint32_t got = 0;
    while (ledger_claim_next(&l, 5, 1, &id) == 0)
        got++;
    T_ASSERT(got == 8);
    /* everything done: the low-water mark is n_batches */
    for (uint64_t b = 0; b < 10; b++)
        if (state_of(&l, b) == LEDGER_CLAIMED)
            T_ASSERT_RC(ledger_mark_trained(&l, b, 2));
    T_ASSERT(ledger_low_water(&l) == 10 && ledger_next_open(&l, 4, ids) == 0);
    T_ASSERT(munmap(mem, bytes) == 0);
    printf("ok: ledger low-water mark, next_open, claim window, reset_in_flight\n");
}

static void *make_ring(ring *r, uint32_t nslots, uint64_t *bytes)
{
    *bytes = ring_shm_bytes(nslots);
    void *mem = mmap(NULL, *bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    T_ASSERT(mem != MAP_FAILED);
    T_ASSERT_RC(ring_format(mem, *bytes, nslots, 3, 0));
    T_ASSERT_RC(ring_open(r, mem, *bytes));
    return mem;
}

static void publish(ring *r, uint16_t w, uint64_t batch)
{
    uint32_t s;
    T_ASSERT_RC(ring_acquire_free(r, w, 1, 0, &s));
    ring_desc_at(r, s)->batch_id = batch;
    T_ASSERT_RC(ring_publish(r, s, w, 1));
}

static void test_ring_by_batch(void)
{
    ring r;
    uint64_t bytes;
    void *mem = make_ring(&r, 4, &bytes);
    publish(&r, 1, 5);
    publish(&r, 1, 3);
    publish(&r, 1, 7);
    uint32_t s;
    T_ASSERT_RC(ring_acquire_ready_batch(&r, 9, 1, 3, 0, &s)); /* not the oldest: the named one */
    T_ASSERT(ring_desc_at(&r, s)->batch_id == 3);
    T_ASSERT(ring_acquire_ready_batch(&r, 9, 1, 3, 0, &s) == -ETIMEDOUT); /* taken */
    uint64_t t0 = df_now_ns();
    T_ASSERT(ring_acquire_ready_batch(&r, 9, 1, 4, 50000000, &s) == -ETIMEDOUT);
    T_ASSERT(df_now_ns() - t0 >= 40000000ull); /* it waited */
    uint32_t s3 = 0;
    ring_slot_info si;
    for (uint32_t i = 0; i < 4; i++)
        if (ring_slot_read(&r, i, &si) == 0 && si.state == RING_READING)
            s3 = i;
    T_ASSERT_RC(ring_release(&r, s3, 9, 1));
    ring_close_for_shutdown(&r);
    T_ASSERT_RC(ring_acquire_ready_batch(&r, 9, 1, 7, 0, &s)); /* a closed ring still drains */
    T_ASSERT(ring_desc_at(&r, s)->batch_id == 7);
    T_ASSERT(ring_acquire_ready_batch(&r, 9, 1, 4, 1000000000, &s) == -EPIPE); /* never coming */
    T_ASSERT(munmap(mem, bytes) == 0);
    printf("ok: ring_acquire_ready_batch takes the named batch, waits, drains, -EPIPE when closed\n");
}

#define N_BATCHES 400
#define N_SLOTS 3
#define N_PROD 3

static void producer(ledger *l, ring *r, uint16_t w, uint64_t seed)
{
    df_rng g;
    df_rng_seed(&g, seed);
    for (;;) {
        uint64_t id;
        int rc = ledger_claim_window(l, w, 1, N_SLOTS, &id);
        if (rc == -ENODATA) {
            if (ledger_low_water(l) >= N_BATCHES)
                _exit(0);
            usleep(50);
            continue;
        }
        T_ASSERT_RC(rc);
        usleep((useconds_t)df_rng_below(&g, 2000)); /* "the forward": random, so order scrambles */
        uint32_t s;
        T_ASSERT_RC(ring_acquire_free(r, w, 1, 5000000000ll, &s)); /* a full ring here = the bound broke */
        ring_desc_at(r, s)->batch_id = id;
        T_ASSERT_RC(ring_publish(r, s, w, 1));
        rc = ledger_set_in_ring(l, id);
        T_ASSERT(rc == 0 || rc == -EALREADY);
    }
}

static void test_window_under_concurrency(void)
{
    ledger l;
    ring r;
    uint64_t lbytes, rbytes;
    void *lm = make_ledger(&l, N_BATCHES, &lbytes);
    void *rm = make_ring(&r, N_SLOTS, &rbytes);
    pid_t pids[N_PROD];
    fflush(stdout); /* the children must not print the parent's buffered lines again */
    for (int p = 0; p < N_PROD; p++) {
        pids[p] = fork();
        T_ASSERT(pids[p] >= 0);
        if (pids[p] == 0)
            producer(&l, &r, (uint16_t)(p + 1), 100 + (uint64_t)p);
    }
    uint32_t skipped = 0; /* times a later batch sat READY while the consumer needed the low one */
    for (uint64_t want = 0; want < N_BATCHES; want++) {
        T_ASSERT(ledger_low_water(&l) == want);
        for (uint32_t i = 0; i < N_SLOTS; i++) {
            ring_slot_info si;
            if (ring_slot_read(&r, i, &si) == 0 && si.state == RING_READY && ring_desc_at(&r, i)->batch_id != want) {
                skipped++;
                break;
            }
        }
        uint32_t s;
        int rc = ring_acquire_ready_batch(&r, 50, 1, want, 5000000000ll, &s);
        if (rc < 0) {
            fprintf(stderr, "batch %llu never became READY (%s): the window did not keep it flowing\n",
                    (unsigned long long)want, ring_strerror(rc));
            exit(1);
        }
        T_ASSERT(ring_desc_at(&r, s)->batch_id == want);
        T_ASSERT_RC(ledger_mark_trained(&l, want, want + 1));
        T_ASSERT_RC(ring_release(&r, s, 50, 1));
    }
    for (int p = 0; p < N_PROD; p++) {
        int st;
        T_ASSERT(waitpid(pids[p], &st, 0) == pids[p]);
        T_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    ledger_counts_t c;
    ledger_counts(&l, &c);
    T_ASSERT(c.trained == N_BATCHES);
    T_ASSERT(munmap(lm, lbytes) == 0 && munmap(rm, rbytes) == 0);
    printf("ok: %d producers, window %d = ring capacity: %d batches consumed in plan order, no stall "
           "(%u times a later batch was READY first)\n",
           N_PROD, N_SLOTS, N_BATCHES, skipped);
}

int main(void)
{
    test_ledger_window();
    test_ring_by_batch();
    test_window_under_concurrency();
    return 0;
}
