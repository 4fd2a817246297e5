/* test_ring.c: single-process unit tests of the ring and hand-off protocol: each
 * transition, owner checks (-EPERM), timeouts, FIFO claim order, poisoning after K
 * attempts, the closed flag, ring_open's header validation, and every hand-off recovery
 * case. Real memfd shared memory (shm.h); a forked child checks a cross-process futex
 * wake. The multi-process crash test is test_ring_stress.c. */
#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ipc/arena.h"
#include "ipc/handoff.h"
#include "ipc/ring.h"
#include "ipc/shm.h"
#include "test_helpers.h"
#include "util.h"

#define T_ASSERT_EQ_RC(expr, want)                                                                           \
    do {                                                                                                     \
        int t_got_ = (expr);                                                                                 \
        if (t_got_ != (want)) {                                                                              \
            fprintf(stderr, "%s:%d: %s returned %d (%s), want %d (%s)\n", __FILE__, __LINE__, #expr, t_got_, \
                    ring_strerror(t_got_), (want), ring_strerror(want));                                     \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

static ring_state state_of(ring *r, uint32_t slot)
{
    ring_slot_info si;
    T_ASSERT_RC(ring_slot_read(r, slot, &si));
    return si.state;
}

static void test_basic_cycle(void *mem, uint64_t bytes)
{
    ring r;
    T_ASSERT_RC(ring_format(mem, bytes, 4, 3, 7));
    T_ASSERT_RC(ring_open(&r, mem, bytes));
    T_ASSERT(r.nslots == 4 && ring_id(&r) == 7 && ring_max_attempts(&r) == 3);
    uint32_t s, c;
    T_ASSERT_EQ_RC(ring_acquire_ready(&r, 2, 1, 0, &c), -ETIMEDOUT);
    T_ASSERT_RC(ring_acquire_free(&r, 1, 5, 0, &s));
    T_ASSERT(state_of(&r, s) == RING_WRITING);
    ring_slot_info si;
    T_ASSERT_RC(ring_slot_read(&r, s, &si));
    T_ASSERT(si.worker == 1 && si.incarnation == 5 && si.gen == 1);
    ring_desc *d = ring_desc_at(&r, s);
    T_ASSERT(d != NULL && ring_desc_at(&r, 4) == NULL);
    d->batch_id = 42;
    d->checksum = 0xabc;
    /* wrong owner / wrong incarnation / wrong transition */
    T_ASSERT_EQ_RC(ring_publish(&r, s, 2, 5), -EPERM);
    T_ASSERT_EQ_RC(ring_publish(&r, s, 1, 6), -EPERM);
    T_ASSERT_EQ_RC(ring_release(&r, s, 1, 5), -EPERM);
    T_ASSERT_EQ_RC(ring_publish(&r, 9, 1, 5), -EINVAL);
    T_ASSERT_RC(ring_publish(&r, s, 1, 5));
    T_ASSERT(state_of(&r, s) == RING_READY);
    T_ASSERT_EQ_RC(ring_publish(&r, s, 1, 5), -EPERM); /* twice */
    T_ASSERT_RC(ring_acquire_ready(&r, 2, 1, 0, &c));
    T_ASSERT(c == s && ring_desc_at(&r, c)->batch_id == 42 && ring_desc_at(&r, c)->checksum == 0xabc);
    T_ASSERT(state_of(&r, c) == RING_READING);
    T_ASSERT_EQ_RC(ring_release(&r, c, 3, 1), -EPERM);
    T_ASSERT_RC(ring_release(&r, c, 2, 1));
    T_ASSERT_EQ_RC(ring_release(&r, c, 2, 1), -EPERM);
    T_ASSERT_RC(ring_slot_read(&r, c, &si));
    T_ASSERT(si.state == RING_FREE && si.gen == 4); /* one bump per transition */
    ring_stats st;
    ring_stats_read(&r, &st);
    T_ASSERT(st.free == 4 && st.published == 1 && st.released == 1 && st.poisoned_total == 0);
    /* incarnation is compared in its low RING_INC_BITS bits */
    T_ASSERT_RC(ring_acquire_free(&r, 1, 5 + (1u << RING_INC_BITS), 0, &s));
    T_ASSERT_RC(ring_publish(&r, s, 1, 5));
    T_ASSERT_RC(ring_acquire_ready(&r, 2, 1, 0, &c));
    T_ASSERT_RC(ring_release(&r, c, 2, 1));
    printf("ok basic cycle, owner checks, generation bumps\n");
}

static void test_full_timeout_and_fifo(void *mem, uint64_t bytes)
{
    ring r;
    T_ASSERT_RC(ring_format(mem, bytes, 3, 3, 1));
    T_ASSERT_RC(ring_open(&r, mem, bytes));
    uint32_t s[3], x;
    for (int i = 0; i < 3; i++) {
        T_ASSERT_RC(ring_acquire_free(&r, 1, 1, 0, &s[i]));
        ring_desc_at(&r, s[i])->batch_id = 100 + (uint64_t)i;
    }
    T_ASSERT_EQ_RC(ring_acquire_free(&r, 1, 1, 0, &x), -ETIMEDOUT);
    uint64_t t0 = df_now_ns();
    T_ASSERT_EQ_RC(ring_acquire_free(&r, 1, 1, 20 * 1000 * 1000, &x), -ETIMEDOUT);
    T_ASSERT(df_now_ns() - t0 >= 20 * 1000 * 1000); /* it did wait (a lower bound only) */
    /* publish in the order 2, 0, 1: consumers must get them in that order */
    int order[3] = {2, 0, 1};
    for (int i = 0; i < 3; i++)
        T_ASSERT_RC(ring_publish(&r, s[order[i]], 1, 1));
    for (int i = 0; i < 3; i++) {
        T_ASSERT_RC(ring_acquire_ready(&r, 9, 1, 0, &x));
        T_ASSERT(ring_desc_at(&r, x)->batch_id == 100 + (uint64_t)order[i]);
    }
    t0 = df_now_ns();
    T_ASSERT_EQ_RC(ring_acquire_ready(&r, 9, 1, 10 * 1000 * 1000, &x), -ETIMEDOUT);
    T_ASSERT(df_now_ns() - t0 >= 10 * 1000 * 1000);
    ring_stats st;
    ring_stats_read(&r, &st);
    T_ASSERT(st.reading == 3 && st.free == 0);
    printf("ok full ring times out, oldest READY first\n");
}

static void test_poison(void *mem, uint64_t bytes)
{
    const uint32_t K = 3;
    ring r;
    T_ASSERT_RC(ring_format(mem, bytes, 2, K, 4));
    T_ASSERT_RC(ring_open(&r, mem, bytes));
    uint32_t s, c, other;
    T_ASSERT_RC(ring_acquire_free(&r, 1, 1, 0, &s));
    ring_desc_at(&r, s)->batch_id = 77;
    T_ASSERT_RC(ring_publish(&r, s, 1, 1));
    /* an unrelated batch of another consumer must not be touched by reclaiming worker 5 */
    T_ASSERT_RC(ring_acquire_free(&r, 1, 1, 0, &other));
    ring_reclaim_report rep;
    for (uint32_t k = 1; k <= K; k++) {
        T_ASSERT_RC(ring_acquire_ready(&r, 5, k, 0, &c));
        T_ASSERT(c == s);
        /* consumer 5 "dies" holding it; the orchestrator reclaims */
        memset(&rep, 0, sizeof rep);
        T_ASSERT_RC(ring_reclaim_owner(&r, 5, &rep));
        ring_slot_info si;
        T_ASSERT_RC(ring_slot_read(&r, s, &si));
        T_ASSERT(si.attempts == k);
        if (k < K) {
            T_ASSERT(rep.requeued == 1 && rep.poisoned == 0 && si.state == RING_READY);
        } else {
            T_ASSERT(rep.requeued == 0 && rep.poisoned == 1 && si.state == RING_POISONED);
            T_ASSERT(rep.poisoned_batch_ids[0] == 77 && rep.poisoned_slots[0] == s && rep.poisoned_rings[0] == 4);
        }
    }
    T_ASSERT(state_of(&r, other) == RING_WRITING);
    T_ASSERT_EQ_RC(ring_acquire_ready(&r, 5, 9, 0, &c), -ETIMEDOUT); /* poisoned is not READY */
    ring_stats st;
    ring_stats_read(&r, &st);
    T_ASSERT(st.poisoned == 1 && st.poisoned_total == 1);
    T_ASSERT_EQ_RC(ring_free_poisoned(&r, other), -EPERM);
    T_ASSERT_RC(ring_free_poisoned(&r, s));
    T_ASSERT(state_of(&r, s) == RING_FREE);
    /* WRITING of a dead producer -> FREE; attempts restart at 0 for the next batch */
    memset(&rep, 0, sizeof rep);
    T_ASSERT_RC(ring_reclaim_owner(&r, 1, &rep));
    T_ASSERT(rep.freed == 1 && state_of(&r, other) == RING_FREE);
    T_ASSERT_RC(ring_acquire_free(&r, 1, 2, 0, &s));
    ring_slot_info si;
    T_ASSERT_RC(ring_slot_read(&r, s, &si));
    T_ASSERT(si.attempts == 0);
    printf("ok reclaim: requeue with attempts+1, poison after %u, free_poisoned\n", K);
}

static void test_closed(void *mem, uint64_t bytes)
{
    ring r;
    T_ASSERT_RC(ring_format(mem, bytes, 2, 3, 1));
    T_ASSERT_RC(ring_open(&r, mem, bytes));
    uint32_t s, c;
    T_ASSERT_RC(ring_acquire_free(&r, 1, 1, 0, &s));
    T_ASSERT_RC(ring_publish(&r, s, 1, 1));
    /* take the only READY slot, so a blocked consumer has nothing to find */
    T_ASSERT_RC(ring_acquire_ready(&r, 2, 1, 0, &c));
    pid_t pid = fork();
    T_ASSERT(pid >= 0);
    if (pid == 0) {
        uint32_t x;
        int rc = ring_acquire_ready(&r, 3, 1, -1, &x); /* blocks with no limit */
        _exit(rc == -EPIPE ? 0 : 10);
    }
    usleep(50 * 1000);
    ring_close_for_shutdown(&r);
    int status;
    T_ASSERT(waitpid(pid, &status, 0) == pid);
    T_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    T_ASSERT(ring_is_closed(&r));
    T_ASSERT_EQ_RC(ring_acquire_free(&r, 1, 1, 0, &s), -EPIPE);
    T_ASSERT_EQ_RC(ring_acquire_free(&r, 1, 1, -1, &s), -EPIPE);
    T_ASSERT_RC(ring_release(&r, c, 2, 1)); /* leases still end normally */
    T_ASSERT_EQ_RC(ring_acquire_ready(&r, 2, 1, -1, &c), -EPIPE);
    printf("ok closed ring: blocked waiter in another process gets -EPIPE\n");
}

static void test_cross_process_wake(void *mem, uint64_t bytes)
{
    ring r;
    T_ASSERT_RC(ring_format(mem, bytes, 2, 3, 1));
    T_ASSERT_RC(ring_open(&r, mem, bytes));
    pid_t pid = fork();
    T_ASSERT(pid >= 0);
    if (pid == 0) {
        uint32_t x;
        int rc = ring_acquire_ready(&r, 3, 1, 10LL * 1000 * 1000 * 1000, &x);
        if (rc < 0 || ring_desc_at(&r, x)->batch_id != 1234)
            _exit(10);
        _exit(ring_release(&r, x, 3, 1) == 0 ? 0 : 11);
    }
    usleep(30 * 1000);
    uint32_t s;
    T_ASSERT_RC(ring_acquire_free(&r, 1, 1, 0, &s));
    ring_desc_at(&r, s)->batch_id = 1234;
    T_ASSERT_RC(ring_publish(&r, s, 1, 1));
    int status;
    T_ASSERT(waitpid(pid, &status, 0) == pid);
    T_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    T_ASSERT(state_of(&r, s) == RING_FREE);
    printf("ok cross-process publish wakes a blocked consumer\n");
}

static void test_open_validation(void *mem, uint64_t bytes)
{
    ring r;
    uint64_t need = ring_shm_bytes(4);
    T_ASSERT(need > 0 && need % 64 == 0 && ring_shm_bytes(0) == 0 && ring_shm_bytes(RING_MAX_SLOTS + 1) == 0);
    T_ASSERT_EQ_RC(ring_format(mem, need - 1, 4, 3, 1), -EMSGSIZE);
    T_ASSERT_EQ_RC(ring_format(mem, bytes, 4, 0, 1), -EINVAL);
    T_ASSERT_EQ_RC(ring_format((char *)mem + 8, bytes - 64, 4, 3, 1), -EINVAL);
    T_ASSERT_RC(ring_format(mem, bytes, 4, 3, 1));
    T_ASSERT_EQ_RC(ring_open(&r, mem, need - 64), -EMSGSIZE);
    T_ASSERT_EQ_RC(ring_open(&r, mem, 16), -EMSGSIZE);
    ((unsigned char *)mem)[0] ^= 0xff; /* magic at byte 0 */
    T_ASSERT_EQ_RC(ring_open(&r, mem, bytes), -EBADMSG);
    ((unsigned char *)mem)[0] ^= 0xff;
    ((uint32_t *)mem)[2] = RING_VERSION + 1; /* version at byte 8 */
    T_ASSERT_EQ_RC(ring_open(&r, mem, bytes), -EPROTO);
    ((uint32_t *)mem)[2] = RING_VERSION;
    ((uint32_t *)mem)[6] = 5; /* nslots at byte 24: total_bytes no longer matches */
    T_ASSERT_EQ_RC(ring_open(&r, mem, bytes), -EBADMSG);
    ((uint32_t *)mem)[6] = 4;
    T_ASSERT_RC(ring_open(&r, mem, bytes));
    memset(mem, 0, 64);
    T_ASSERT_EQ_RC(ring_open(&r, mem, bytes), -EBADMSG);
    printf("ok ring_open rejects bad magic, version, size\n");
}

/* --- hand-off recovery: every death point of a middle stage ------------------------ */
enum { IN_ID = 10, OUT_ID = 11, MID = 3, MID_INC = 1, PROD = 1, CONS = 2 };

static void setup_two(void *mem, uint64_t bytes, ring *a, ring *b, handoff_table *t)
{
    uint64_t rb = ring_shm_bytes(2), hb = handoff_shm_bytes();
    T_ASSERT(2 * rb + hb <= bytes);
    T_ASSERT_RC(ring_format(mem, rb, 2, 3, IN_ID));
    T_ASSERT_RC(ring_format((char *)mem + rb, rb, 2, 3, OUT_ID));
    T_ASSERT_RC(handoff_format((char *)mem + 2 * rb, hb));
    T_ASSERT_RC(ring_open(a, mem, rb));
    T_ASSERT_RC(ring_open(b, (char *)mem + rb, rb));
    T_ASSERT_RC(handoff_open(t, (char *)mem + 2 * rb, hb));
}

/* Run the middle stage up to death point `die_at` (0..7), then recover; returns where
 * the batch ended up: 'I' = READY in the input ring, 'O' = READY in the output ring. */
static char middle_dies_at(void *mem, uint64_t bytes, int die_at)
{
    ring a, b;
    handoff_table t;
    setup_two(mem, bytes, &a, &b, &t);
    uint32_t ps, is, os;
    T_ASSERT_RC(ring_acquire_free(&a, PROD, 1, 0, &ps));
    ring_desc_at(&a, ps)->batch_id = 5;
    T_ASSERT_RC(ring_publish(&a, ps, PROD, 1));
    T_ASSERT_RC(ring_acquire_ready(&a, MID, MID_INC, 0, &is));
    if (die_at > 0)
        T_ASSERT_RC(ring_acquire_free(&b, MID, MID_INC, 0, &os));
    if (die_at > 1) {
        handoff_end in = {&a, is, 0}, out = {&b, os, 0};
        T_ASSERT_RC(handoff_begin(&t, MID, MID_INC, &in, &out));
    }
    if (die_at > 2)
        *ring_desc_at(&b, os) = *ring_desc_at(&a, is);
    if (die_at == 4) /* the publish CAS happened, the phase store did not */
        T_ASSERT_RC(ring_publish(&b, os, MID, MID_INC));
    if (die_at > 4)
        T_ASSERT_RC(handoff_publish(&t, MID, MID_INC, &b, os));
    if (die_at == 6) /* released, intent not cleared */
        T_ASSERT_RC(ring_release(&a, is, MID, MID_INC));
    if (die_at > 6)
        T_ASSERT_RC(handoff_finish(&t, MID, MID_INC, &a, is));
    /* SIGKILL here; the orchestrator reaps and recovers */
    ring *rings[2] = {&a, &b};
    ring_reclaim_report rep;
    memset(&rep, 0, sizeof rep);
    T_ASSERT_RC(handoff_recover(&t, MID, rings, 2, &rep));
    handoff_intent it;
    T_ASSERT_RC(handoff_read(&t, MID, &it));
    T_ASSERT(it.phase == HANDOFF_NONE);
    ring_stats sa, sb;
    ring_stats_read(&a, &sa);
    ring_stats_read(&b, &sb);
    T_ASSERT(sa.writing + sa.reading + sb.writing + sb.reading == 0); /* no lease survives */
    T_ASSERT(sa.ready + sb.ready == 1);                               /* exactly one copy */
    uint32_t c;
    if (sa.ready) {
        T_ASSERT_RC(ring_acquire_ready(&a, MID, MID_INC + 1, 0, &c));
        T_ASSERT(ring_desc_at(&a, c)->batch_id == 5);
        ring_slot_info si;
        T_ASSERT_RC(ring_slot_read(&a, c, &si));
        T_ASSERT(si.attempts == 1);
        return 'I';
    }
    T_ASSERT_RC(ring_acquire_ready(&b, CONS, 1, 0, &c));
    T_ASSERT(ring_desc_at(&b, c)->batch_id == 5);
    return 'O';
}

static int g_committed[8];
static int hook_out_done(void *ctx, uint16_t worker, uint64_t token)
{
    (void)ctx;
    (void)worker;
    return g_committed[token];
}
static uint64_t g_resolved_token;
static int g_resolved_moved = -1;
static void hook_in_resolved(void *ctx, uint16_t worker, uint64_t token, int moved_on)
{
    (void)ctx;
    (void)worker;
    g_resolved_token = token;
    g_resolved_moved = moved_on;
}

static void test_handoff(void *mem, uint64_t bytes)
{
    /* death points: 0 after input acquired, 1 output acquired, 2 intent written,
     * 3 output filled, 4 publish CAS done but not marked, 5 marked published,
     * 6 input released but intent not cleared, 7 all done */
    const char want[8] = {'I', 'I', 'I', 'I', 'O', 'O', 'O', 'O'};
    for (int d = 0; d < 8; d++) {
        char got = middle_dies_at(mem, bytes, d);
        if (got != want[d]) {
            fprintf(stderr, "death point %d: batch ended in %c, want %c\n", d, got, want[d]);
            exit(1);
        }
    }
    /* a half-written handoff_begin refuses leases the worker does not hold */
    ring a, b;
    handoff_table t;
    setup_two(mem, bytes, &a, &b, &t);
    handoff_end in = {&a, 0, 0}, out = {&b, 0, 0};
    T_ASSERT_EQ_RC(handoff_begin(&t, MID, MID_INC, &in, &out), -EPERM);
    handoff_end ext = {NULL, 0, 1};
    T_ASSERT_EQ_RC(handoff_begin(&t, MID, MID_INC, &ext, &ext), -EINVAL);

    /* final consumer with an external output (a commit), both outcomes */
    handoff_hooks hooks = {hook_out_done, hook_in_resolved, NULL};
    ring *rings[2] = {&a, &b};
    for (int committed = 0; committed <= 1; committed++) {
        setup_two(mem, bytes, &a, &b, &t);
        uint32_t s, c;
        T_ASSERT_RC(ring_acquire_free(&b, MID, 1, 0, &s));
        T_ASSERT_RC(ring_publish(&b, s, MID, 1));
        T_ASSERT_RC(ring_acquire_ready(&b, CONS, 1, 0, &c));
        handoff_end cin = {&b, c, 0}, cout = {NULL, 0, 3};
        T_ASSERT_RC(handoff_begin(&t, CONS, 1, &cin, &cout));
        g_committed[3] = committed; /* died just after (or before) the commit */
        ring_reclaim_report rep;
        memset(&rep, 0, sizeof rep);
        T_ASSERT_RC(handoff_recover_ex(&t, CONS, rings, 2, &hooks, &rep));
        ring_stats sb;
        ring_stats_read(&b, &sb);
        T_ASSERT(sb.reading == 0);
        T_ASSERT(committed ? (sb.ready == 0 && rep.handed_on == 1) : (sb.ready == 1 && rep.requeued == 1));
    }
    /* producer with an external input (a claimed batch id), both outcomes */
    for (int published = 0; published <= 1; published++) {
        setup_two(mem, bytes, &a, &b, &t);
        uint32_t s;
        T_ASSERT_RC(ring_acquire_free(&a, PROD, 1, 0, &s));
        handoff_end pin = {NULL, 0, 6}, pout = {&a, s, 0};
        T_ASSERT_RC(handoff_begin(&t, PROD, 1, &pin, &pout));
        if (published)
            T_ASSERT_RC(ring_publish(&a, s, PROD, 1));
        g_resolved_moved = -1;
        ring_reclaim_report rep;
        memset(&rep, 0, sizeof rep);
        T_ASSERT_RC(handoff_recover_ex(&t, PROD, rings, 2, &hooks, &rep));
        T_ASSERT(g_resolved_token == 6 && g_resolved_moved == published);
        T_ASSERT(state_of(&a, s) == (published ? RING_READY : RING_FREE));
    }
    /* an intent naming a ring the caller did not pass: -ENOENT, nothing changed */
    setup_two(mem, bytes, &a, &b, &t);
    uint32_t s1, s2;
    T_ASSERT_RC(ring_acquire_free(&a, PROD, 1, 0, &s1));
    T_ASSERT_RC(ring_publish(&a, s1, PROD, 1));
    T_ASSERT_RC(ring_acquire_ready(&a, MID, 1, 0, &s1));
    T_ASSERT_RC(ring_acquire_free(&b, MID, 1, 0, &s2));
    handoff_end i2 = {&a, s1, 0}, o2 = {&b, s2, 0};
    T_ASSERT_RC(handoff_begin(&t, MID, 1, &i2, &o2));
    ring_reclaim_report rep;
    memset(&rep, 0, sizeof rep);
    T_ASSERT_EQ_RC(handoff_recover(&t, MID, rings, 1, &rep), -ENOENT);
    T_ASSERT(state_of(&a, s1) == RING_READING);
    T_ASSERT_RC(handoff_recover(&t, MID, rings, 2, &rep));
    T_ASSERT(state_of(&a, s1) == RING_READY && state_of(&b, s2) == RING_FREE);
    /* handoff_open validation */
    uint64_t rb = ring_shm_bytes(2);
    void *hm = (char *)mem + 2 * rb;
    T_ASSERT_EQ_RC(handoff_open(&t, hm, handoff_shm_bytes() - 1), -EMSGSIZE);
    ((unsigned char *)hm)[0] ^= 1;
    T_ASSERT_EQ_RC(handoff_open(&t, hm, handoff_shm_bytes()), -EBADMSG);
    printf("ok hand-off recovery at all 8 death points of a middle stage, external ends\n");
}

int main(void)
{
    arena seg;
    arena_init(&seg);
    uint64_t bytes = 1 << 20;
    T_ASSERT_RC(shm_create(&seg, bytes, "test_ring"));
    test_basic_cycle(seg.base, bytes);
    test_full_timeout_and_fifo(seg.base, bytes);
    test_poison(seg.base, bytes);
    test_closed(seg.base, bytes);
    test_cross_process_wake(seg.base, bytes);
    test_open_validation(seg.base, bytes);
    test_handoff(seg.base, bytes);
    arena_close(&seg);
    printf("test_ring: all passed\n");
    return 0;
}
