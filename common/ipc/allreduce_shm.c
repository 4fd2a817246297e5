/* allreduce_shm.c: the CPU all-reduce backend: ranks are processes that map one shared
 * segment (a memfd the orchestrator created and formatted, see allreduce.h).
 *
 * Segment layout (all offsets fixed at format time):
 *   struct allreduce_shm                header, barrier words, per-rank lines (64-byte lines)
 *   float slot[world][stride]    rank r copies its current round of input into slot r
 *   float result[stride]         the round's sum, written in rank-partitioned pieces
 * stride = max_floats rounded up to 16 floats (one cache line), so slots never share lines.
 *
 * One round (max_floats floats of the caller's buffer; bigger buffers take several):
 *   1. copy my piece of input into slot[rank]
 *   2. barrier                     (all slots filled)
 *   3. for the elements of my partition (whole 16-float blocks, split evenly by rank):
 *        result[i] = slot[0][i]; result[i] += slot[1][i]; ... += slot[R-1][i]
 *   4. barrier                     (result complete)
 *   5. copy result into my buffer
 * Each element is summed by exactly one rank in the fixed order 0, 1, ..., R-1 in float32,
 * so every rank gets the same bits whatever the timing, the partition or the round size:
 * this is the determinism the ledger's deterministic mode builds on. Step 3 of the next
 * round writes result only after its own step 2, which no rank passes before every rank
 * has finished step 5 of this round, and slots are rewritten only after step 4, after the
 * last read of them: so two barriers per round suffice. Round 0 also checks that every
 * rank passed the same n and call number (published before barrier 1): a disagreement is
 * seen by every rank alike and answered -EINVAL everywhere instead of a garbled sum.
 *
 * The barrier counts arrivals in `arrived`; the last arriver resets it and advances
 * `phase`, the futex word everyone else sleeps on (a generation counter: its parity is the
 * classic sense bit, the full 32 bits keep a late waker from confusing two barriers).
 * Waits are shared futexes with an absolute deadline. A waiter whose deadline passes
 * marks the group broken (first cause wins), advances `phase` and wakes everyone, so every
 * rank returns -ETIMEDOUT promptly and every later call fails at once: a broken group
 * stays broken until the orchestrator re-formats the segment (which bumps `epoch`, so a
 * straggler from the old group gets -ESTALE rather than joining the new one).
 *
 * Memory ordering: slot/result stores and rank-line stores happen before the arriver's
 * fetch_add(arrived, acq_rel); the last arriver's fetch_add reads the whole release
 * sequence, then its fetch_add(phase, release) is read by every waiter's
 * load(phase, acquire): so everything written before barrier k by any rank is visible to
 * every rank after barrier k. break_group stores `broken` before its release on phase, so
 * a rank woken by a break sees the cause.
 *
 * Bucketed calls (overlap with the backward pass): a background thread per comm, started
 * at the first bucket, reduces queued buckets in order with the same round algorithm;
 * allreduce_wait_all waits for the queue to drain. Chosen over eager reduction so that the
 * caller's backward pass keeps computing while slow peers catch up.
 *
 * Fault injection: env DF_AR_CRASH="rank:k" makes that rank SIGKILL itself on entering
 * its k-th barrier (1-based) since open: a death between two barriers of one reduction,
 * for the tests.
 */
#include "ipc/allreduce_internal.h"
#include "ipc/futex.h"
#include "util.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ALLREDUCE_SHM_MAGIC 0x314d485352414644ull /* "DFARSHM1" */
#define ALLREDUCE_SHM_VERSION 1u
#define ALLREDUCE_LINE_FLOATS (DF_CACHELINE / sizeof(float))
#define ALLREDUCE_MAX_FLOATS (1ull << 36) /* 256 GiB of slots: a sanity bound, not a target */
#define ALLREDUCE_SPIN 2000               /* phase checks before sleeping on the futex */
#define ALLREDUCE_SUM_BLOCK 4096          /* floats per cache-blocked summation step */

enum { ALLREDUCE_BROKEN_NONE = 0, ALLREDUCE_BROKEN_TIMEOUT = 1, ALLREDUCE_BROKEN_ABORT = 2 };

typedef struct allreduce_rank_line {
    _Alignas(DF_CACHELINE) _Atomic uint32_t joined; /* 1 while a comm holds this rank */
    uint32_t pid;                                   /* diagnostics only */
    _Atomic uint64_t n;                             /* this call's n (round 0 check) */
    _Atomic uint64_t seq;                           /* this call's number since open */
} allreduce_rank_line;

struct allreduce_shm {
    /* Immutable between formats. Written by allreduce_shm_format, magic last (release); read
     * after an acquire load of magic. */
    _Alignas(DF_CACHELINE) _Atomic uint64_t magic;
    uint32_t version;
    uint32_t world;
    uint64_t max_floats;    /* floats per round */
    uint64_t bytes;         /* segment bytes the format needs */
    uint64_t stride;        /* floats between slots, a multiple of 16 */
    uint64_t data_offset;   /* bytes from the segment start to slot 0, 64-aligned */
    _Atomic uint32_t epoch; /* bumped by every re-format, never 0 when formatted */
    uint32_t reserved0;
    /* Barrier: arrivals (RMW only) and the phase futex word, each on its own line. */
    _Alignas(DF_CACHELINE) _Atomic uint32_t arrived;
    _Alignas(DF_CACHELINE) _Atomic uint32_t phase;
    /* Broken state: set once (CAS from NONE), then phase is advanced and woken. */
    _Alignas(DF_CACHELINE) _Atomic uint32_t broken;
    _Atomic uint32_t broken_rank; /* the rank that timed out, or UINT32_MAX for abort */
    _Alignas(DF_CACHELINE) uint64_t reserved[8];
    allreduce_rank_line ranks[ALLREDUCE_MAX_WORLD];
};

typedef struct allreduce_bucket {
    float *ptr;
    size_t n;
    int64_t timeout_ns;
} allreduce_bucket;

typedef struct allreduce_shm_state {
    struct allreduce_shm *h;
    float *slots;  /* [world][stride] */
    float *result; /* [stride] */
    uint64_t stride, max_floats;
    uint32_t epoch; /* the epoch this rank joined */
    uint64_t seq;   /* calls so far */
    uint64_t barriers;
    uint64_t crash_at; /* fault injection: SIGKILL self at this barrier (0: never) */
    int rank, world;
    /* bucket thread; the fields below mu are guarded by it */
    int thread_started;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    allreduce_bucket *q;
    size_t qcap, submitted, done;
    int err, stop;
    uint32_t err_bucket;
    char err_detail[256];
} allreduce_shm_state;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static uint64_t round_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

uint64_t allreduce_shm_bytes(int world, uint64_t max_floats)
{
    if (world < 1 || world > ALLREDUCE_MAX_WORLD || max_floats == 0 || max_floats > ALLREDUCE_MAX_FLOATS)
        return 0;
    uint64_t stride = round_up(max_floats, ALLREDUCE_LINE_FLOATS);
    uint64_t hdr = round_up(sizeof(struct allreduce_shm), DF_CACHELINE);
    return hdr + ((uint64_t)world + 1) * stride * sizeof(float);
}

int allreduce_shm_format(void *mem, uint64_t bytes, int world, uint64_t max_floats, char *err, size_t errlen)
{
    uint64_t need = allreduce_shm_bytes(world, max_floats);
    if (!mem || need == 0)
        return allreduce_fail(err, errlen, -EINVAL,
                              "allreduce_shm_format: world %d (1..%d) / max_floats %llu out of range", world,
                              ALLREDUCE_MAX_WORLD, (unsigned long long)max_floats);
    if ((uintptr_t)mem % DF_CACHELINE)
        return allreduce_fail(err, errlen, -EINVAL, "allreduce_shm_format: segment not 64-byte aligned");
    if (bytes < need)
        return allreduce_fail(err, errlen, -EINVAL,
                              "allreduce_shm_format: segment has %llu bytes, world %d x %llu floats "
                              "needs %llu",
                              (unsigned long long)bytes, world, (unsigned long long)max_floats,
                              (unsigned long long)need);
    struct allreduce_shm *h = mem;
    uint32_t old_epoch = 0;
    if (atomic_load_explicit(&h->magic, memory_order_acquire) == ALLREDUCE_SHM_MAGIC &&
        h->version == ALLREDUCE_SHM_VERSION)
        old_epoch = atomic_load_explicit(&h->epoch, memory_order_relaxed);
    /* Unpublish first, then rebuild: nothing may be using the segment (see allreduce.h),
     * this only makes a racing allreduce_open_shm fail cleanly with -EPROTO. */
    atomic_store_explicit(&h->magic, 0, memory_order_relaxed);
    memset((char *)h + sizeof h->magic, 0, sizeof *h - sizeof h->magic);
    h->version = ALLREDUCE_SHM_VERSION;
    h->world = (uint32_t)world;
    h->max_floats = max_floats;
    h->bytes = need;
    h->stride = round_up(max_floats, ALLREDUCE_LINE_FLOATS);
    h->data_offset = round_up(sizeof(struct allreduce_shm), DF_CACHELINE);
    uint32_t epoch = old_epoch + 1;
    if (epoch == 0)
        epoch = 1;
    atomic_store_explicit(&h->epoch, epoch, memory_order_relaxed);
    atomic_store_explicit(&h->magic, ALLREDUCE_SHM_MAGIC, memory_order_release);
    return 0;
}

/* Mark the group broken (first cause wins), advance phase and wake every waiter. */
static void break_group(struct allreduce_shm *h, uint32_t why, uint32_t rank)
{
    uint32_t none = ALLREDUCE_BROKEN_NONE;
    if (atomic_compare_exchange_strong_explicit(&h->broken, &none, why, memory_order_acq_rel, memory_order_acquire))
        atomic_store_explicit(&h->broken_rank, rank, memory_order_relaxed);
    /* release: pairs with the waiters' acquire load of phase; they then read broken */
    atomic_fetch_add_explicit(&h->phase, 1, memory_order_release);
    futex_wake(&h->phase, INT32_MAX);
}

int allreduce_shm_abort(void *mem, uint64_t bytes, char *err, size_t errlen)
{
    struct allreduce_shm *h = mem;
    if (!mem || bytes < sizeof *h || atomic_load_explicit(&h->magic, memory_order_acquire) != ALLREDUCE_SHM_MAGIC)
        return allreduce_fail(err, errlen, -EPROTO, "allreduce_shm_abort: not a formatted all-reduce segment");
    break_group(h, ALLREDUCE_BROKEN_ABORT, UINT32_MAX);
    return 0;
}

/* 0 while the group is usable, else the error every rank reports. */
static int group_state(allreduce_shm_state *s, char *err, size_t errlen)
{
    struct allreduce_shm *h = s->h;
    if (atomic_load_explicit(&h->magic, memory_order_acquire) != ALLREDUCE_SHM_MAGIC ||
        atomic_load_explicit(&h->epoch, memory_order_relaxed) != s->epoch)
        return allreduce_fail(err, errlen, -ESTALE, "rank %d: segment re-formatted since it joined (epoch %u)", s->rank,
                              s->epoch);
    uint32_t b = atomic_load_explicit(&h->broken, memory_order_acquire);
    if (b == ALLREDUCE_BROKEN_NONE)
        return 0;
    if (b == ALLREDUCE_BROKEN_ABORT)
        return allreduce_fail(err, errlen, -ECANCELED, "rank %d: allreduce_shm_abort was called on the segment",
                              s->rank);
    return allreduce_fail(err, errlen, -ETIMEDOUT, "rank %d: group broken: rank %u timed out waiting for a peer",
                          s->rank, atomic_load_explicit(&h->broken_rank, memory_order_relaxed));
}

static int barrier(allreduce_shm_state *s, int64_t timeout_ns, char *err, size_t errlen)
{
    struct allreduce_shm *h = s->h;
    if (s->crash_at && ++s->barriers == s->crash_at)
        raise(SIGKILL); /* fault injection (DF_AR_CRASH) */
    /* Read the phase before arriving: it cannot advance until this rank arrives. */
    uint32_t ph = atomic_load_explicit(&h->phase, memory_order_acquire);
    int rc = group_state(s, err, errlen);
    if (rc)
        return rc;
    uint32_t n = atomic_fetch_add_explicit(&h->arrived, 1, memory_order_acq_rel) + 1;
    if (n == (uint32_t)s->world) {
        /* Last arriver. Reset before the release on phase: a rank arriving at the next
         * barrier has acquired the new phase, so it sees arrived == 0. */
        atomic_store_explicit(&h->arrived, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&h->phase, 1, memory_order_release);
        if (s->world > 1)
            futex_wake(&h->phase, INT32_MAX);
        return 0;
    }
    for (int i = 0; i < ALLREDUCE_SPIN; i++) {
        if (atomic_load_explicit(&h->phase, memory_order_acquire) != ph)
            return group_state(s, err, errlen);
        cpu_relax();
    }
    uint64_t t0 = df_now_ns();
    uint64_t deadline = timeout_ns < 0 ? FUTEX_NO_DEADLINE : t0 + (uint64_t)timeout_ns;
    for (;;) {
        if (atomic_load_explicit(&h->phase, memory_order_acquire) != ph)
            return group_state(s, err, errlen); /* passed, or woken by a break: say which */
        rc = futex_wait_until(&h->phase, ph, deadline);
        if (rc == -ETIMEDOUT) {
            if (atomic_load_explicit(&h->phase, memory_order_acquire) != ph)
                return group_state(s, err, errlen);
            break_group(h, ALLREDUCE_BROKEN_TIMEOUT, (uint32_t)s->rank);
            return allreduce_fail(err, errlen, -ETIMEDOUT,
                                  "rank %d: waited %.3f s at a barrier, %u of %d ranks "
                                  "arrived: a peer is dead or hung",
                                  s->rank, (double)(df_now_ns() - t0) * 1e-9,
                                  atomic_load_explicit(&h->arrived, memory_order_relaxed), s->world);
        }
        if (rc < 0 && rc != -EAGAIN && rc != -EINTR)
            return allreduce_fail(err, errlen, rc, "rank %d: futex wait on the barrier: %s", s->rank, strerror(-rc));
    }
}

/* result[lo, hi) = slot[0] + slot[1] + ... + slot[R-1], in that order, in float32. */
static void sum_partition(allreduce_shm_state *s, size_t lo, size_t hi)
{
    for (size_t b = lo; b < hi; b += ALLREDUCE_SUM_BLOCK) {
        size_t e = DF_MIN(b + ALLREDUCE_SUM_BLOCK, hi);
        float *res = s->result;
        memcpy(res + b, s->slots + b, (e - b) * sizeof(float));
        for (int k = 1; k < s->world; k++) {
            const float *src = s->slots + (size_t)k * s->stride;
            for (size_t i = b; i < e; i++)
                res[i] += src[i];
        }
    }
}

/* The reduction proper, on the calling thread (the caller's, or the bucket thread). */
static int shm_reduce(allreduce_shm_state *s, float *buf, size_t n, int64_t timeout_ns, char *err, size_t errlen)
{
    struct allreduce_shm *h = s->h;
    int rc = group_state(s, err, errlen);
    if (rc)
        return rc;
    uint64_t seq = ++s->seq;
    allreduce_rank_line *me = &h->ranks[s->rank];
    /* relaxed: published to the others by the release in barrier 1 */
    atomic_store_explicit(&me->n, (uint64_t)n, memory_order_relaxed);
    atomic_store_explicit(&me->seq, seq, memory_order_relaxed);
    size_t rounds = n == 0 ? 1 : (n + s->max_floats - 1) / s->max_floats;
    float *myslot = s->slots + (size_t)s->rank * s->stride;
    for (size_t r = 0; r < rounds; r++) {
        size_t off = r * s->max_floats;
        size_t len = DF_MIN((size_t)s->max_floats, n - off);
        if (len)
            memcpy(myslot, buf + off, len * sizeof(float));
        if ((rc = barrier(s, timeout_ns, err, errlen)))
            return rc;
        if (r == 0) {
            /* The lines stay put until every rank passes barrier 2, so all ranks read the
             * same values and reach the same verdict. */
            for (int k = 0; k < s->world; k++) {
                uint64_t kn = atomic_load_explicit(&h->ranks[k].n, memory_order_relaxed);
                uint64_t ks = atomic_load_explicit(&h->ranks[k].seq, memory_order_relaxed);
                if (kn != n || ks != seq) {
                    rc = barrier(s, timeout_ns, err, errlen);
                    if (rc)
                        return rc;
                    return allreduce_fail(err, errlen, -EINVAL,
                                          "rank %d: call %llu with n=%zu, but rank %d is at "
                                          "call %llu with n=%llu: ranks out of step",
                                          s->rank, (unsigned long long)seq, n, k, (unsigned long long)ks,
                                          (unsigned long long)kn);
                }
            }
        }
        size_t nblk = (len + ALLREDUCE_LINE_FLOATS - 1) / ALLREDUCE_LINE_FLOATS;
        size_t lo = nblk * (size_t)s->rank / (size_t)s->world * ALLREDUCE_LINE_FLOATS;
        size_t hi = DF_MIN(nblk * (size_t)(s->rank + 1) / (size_t)s->world * ALLREDUCE_LINE_FLOATS, len);
        if (lo < hi)
            sum_partition(s, lo, hi);
        if ((rc = barrier(s, timeout_ns, err, errlen)))
            return rc;
        if (len)
            memcpy(buf + off, s->result, len * sizeof(float));
    }
    return 0;
}

int allreduce_shm_open_impl(allreduce_comm *c, void *mem, uint64_t bytes, int rank, int world, char *err, size_t errlen)
{
    struct allreduce_shm *h = mem;
    if (bytes < sizeof *h || atomic_load_explicit(&h->magic, memory_order_acquire) != ALLREDUCE_SHM_MAGIC)
        return allreduce_fail(err, errlen, -EPROTO,
                              "allreduce_open_shm: segment (%llu bytes) is not formatted (bad magic)",
                              (unsigned long long)bytes);
    if (h->version != ALLREDUCE_SHM_VERSION)
        return allreduce_fail(err, errlen, -EPROTO, "allreduce_open_shm: segment version %u, this build knows %u",
                              h->version, ALLREDUCE_SHM_VERSION);
    if (h->bytes > bytes)
        return allreduce_fail(err, errlen, -EINVAL,
                              "allreduce_open_shm: segment formatted for %llu bytes, mapping has %llu",
                              (unsigned long long)h->bytes, (unsigned long long)bytes);
    if (h->world != (uint32_t)world)
        return allreduce_fail(err, errlen, -EINVAL,
                              "allreduce_open_shm: segment formatted for world %u, caller says %d", h->world, world);
    uint32_t zero = 0;
    if (!atomic_compare_exchange_strong_explicit(&h->ranks[rank].joined, &zero, 1, memory_order_acq_rel,
                                                 memory_order_acquire))
        return allreduce_fail(err, errlen, -EBUSY,
                              "allreduce_open_shm: rank %d already joined (pid %u) since the last "
                              "format; the orchestrator re-formats before a group restart",
                              rank, h->ranks[rank].pid);
    allreduce_shm_state *s = calloc(1, sizeof *s);
    if (!s) {
        atomic_store_explicit(&h->ranks[rank].joined, 0, memory_order_release);
        return allreduce_fail(err, errlen, -ENOMEM, "allreduce_open_shm: out of memory");
    }
    h->ranks[rank].pid = (uint32_t)getpid();
    s->h = h;
    s->stride = h->stride;
    s->max_floats = h->max_floats;
    s->slots = (float *)((char *)mem + h->data_offset);
    s->result = s->slots + (size_t)world * s->stride;
    s->epoch = atomic_load_explicit(&h->epoch, memory_order_relaxed);
    s->rank = rank;
    s->world = world;
    const char *crash = getenv("DF_AR_CRASH");
    int crank;
    unsigned long long cat;
    if (crash && sscanf(crash, "%d:%llu", &crank, &cat) == 2 && crank == rank)
        s->crash_at = cat;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_work, NULL);
    pthread_cond_init(&s->cv_done, NULL);
    c->backend = ALLREDUCE_SHM;
    c->ops = &allreduce_ops_shm;
    c->rank = rank;
    c->world = world;
    c->timeout_ns = ALLREDUCE_DEFAULT_TIMEOUT_NS;
    c->impl = s;
    return 0;
}

static int allreduce_shm_set_stream(allreduce_comm *c, void *cuda_stream, char *err, size_t errlen)
{
    (void)c, (void)cuda_stream, (void)err, (void)errlen;
    return 0; /* host buffers: no stream to follow */
}

static int buckets_idle(allreduce_shm_state *s)
{
    pthread_mutex_lock(&s->mu);
    int idle = s->submitted == 0;
    pthread_mutex_unlock(&s->mu);
    return idle;
}

static int allreduce_shm_sum(allreduce_comm *c, float *buf, size_t n, int64_t timeout_ns, char *err, size_t errlen)
{
    allreduce_shm_state *s = c->impl;
    if (!buckets_idle(s))
        return allreduce_fail(err, errlen, -EBUSY, "allreduce_sum: buckets in flight: call allreduce_wait_all first");
    return shm_reduce(s, buf, n, timeout_ns, err, errlen);
}

static void *bucket_thread(void *arg)
{
    allreduce_shm_state *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->done == s->submitted && !s->stop)
            pthread_cond_wait(&s->cv_work, &s->mu);
        if (s->done == s->submitted)
            break; /* stop requested and nothing queued */
        allreduce_bucket b = s->q[s->done];
        int skip = s->err != 0;
        pthread_mutex_unlock(&s->mu);
        /* After a failure the rest of the step is skipped: every rank saw the same
         * failure (a broken group or an out-of-step -EINVAL), so they skip alike. */
        char err[sizeof s->err_detail] = "";
        int rc = skip ? 0 : shm_reduce(s, b.ptr, b.n, b.timeout_ns, err, sizeof err);
        pthread_mutex_lock(&s->mu);
        if (rc && !s->err) { /* handed to allreduce_wait_all, which reports it */
            s->err = rc;
            s->err_bucket = (uint32_t)s->done;
            snprintf(s->err_detail, sizeof s->err_detail, "%s", err);
        }
        s->done++;
        pthread_cond_broadcast(&s->cv_done);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static int allreduce_shm_bucket_ready(allreduce_comm *c, uint32_t bucket_index, float *ptr, size_t n, char *err,
                                      size_t errlen)
{
    allreduce_shm_state *s = c->impl;
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    if (bucket_index != s->submitted) {
        rc = allreduce_fail(err, errlen, -EINVAL,
                            "allreduce_bucket_ready: bucket %u handed over, expected bucket %zu "
                            "(indices run 0, 1, 2, ... within a step)",
                            bucket_index, s->submitted);
        goto out;
    }
    if (s->submitted == s->qcap) {
        size_t cap = s->qcap ? 2 * s->qcap : 64;
        allreduce_bucket *q = realloc(s->q, cap * sizeof *q);
        if (!q) {
            rc = allreduce_fail(err, errlen, -ENOMEM, "allreduce_bucket_ready: out of memory for %zu buckets", cap);
            goto out;
        }
        s->q = q;
        s->qcap = cap;
    }
    if (!s->thread_started) {
        int e = pthread_create(&s->thread, NULL, bucket_thread, s);
        if (e) {
            rc = allreduce_fail(err, errlen, -e, "allreduce_bucket_ready: pthread_create: %s", strerror(e));
            goto out;
        }
        s->thread_started = 1;
    }
    s->q[s->submitted++] = (allreduce_bucket){.ptr = ptr, .n = n, .timeout_ns = c->timeout_ns};
    pthread_cond_signal(&s->cv_work);
out:
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static int allreduce_shm_wait_all(allreduce_comm *c, char *err, size_t errlen)
{
    allreduce_shm_state *s = c->impl;
    pthread_mutex_lock(&s->mu);
    while (s->done < s->submitted)
        pthread_cond_wait(&s->cv_done, &s->mu);
    int rc = s->err;
    uint32_t bucket = s->err_bucket;
    char detail[sizeof s->err_detail];
    memcpy(detail, s->err_detail, sizeof detail);
    s->submitted = s->done = 0;
    s->err = 0;
    s->err_detail[0] = 0;
    pthread_mutex_unlock(&s->mu);
    if (rc)
        return allreduce_fail(err, errlen, rc, "bucket %u: %s", bucket, detail);
    return 0;
}

static void allreduce_shm_close(allreduce_comm *c)
{
    allreduce_shm_state *s = c->impl;
    if (!s)
        return;
    if (s->thread_started) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_cond_signal(&s->cv_work);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    /* Give the rank back only to the group it joined (a re-format already cleared it). */
    if (atomic_load_explicit(&s->h->epoch, memory_order_relaxed) == s->epoch)
        atomic_store_explicit(&s->h->ranks[s->rank].joined, 0, memory_order_release);
    pthread_cond_destroy(&s->cv_work);
    pthread_cond_destroy(&s->cv_done);
    pthread_mutex_destroy(&s->mu);
    free(s->q);
    free(s);
    c->impl = NULL;
}

const allreduce_ops allreduce_ops_shm = {
    .name = "shm",
    .set_stream = allreduce_shm_set_stream,
    .sum = allreduce_shm_sum,
    .bucket_ready = allreduce_shm_bucket_ready,
    .wait_all = allreduce_shm_wait_all,
    .close = allreduce_shm_close,
};
