/* test_ledger.c: the epoch plan and the batch state machine in real shared memory.
 *
 *  - plan: determinism (same inputs -> same bytes; other seed/epoch -> other plan), every
 *    sample in exactly one batch, every batch within the token budget, truncation to
 *    max_seq_len, length homogeneity (max^2 < 2 min^2 inside a batch) and packing quality
 *    (at most one under-filled batch per length bucket), bad arguments refused;
 *  - states: every legal transition, the illegal ones with their error codes, a second
 *    mark_trained refused with -EALREADY;
 *  - rewind: steps 1..10 trained, commit(6), rewind(6): the batches of steps 7..10 come back,
 *    are re-claimed and re-trained, and the audit then says exactly once;
 *  - reclaim_owner; a claimer SIGKILLed while holding batches; 4 processes claiming
 *    concurrently from one memfd-backed ledger (each batch claimed exactly once); deterministic
 *    claims by rank (b = s*R + r);
 *  - the audit file read back with jansson; ledger_open refusing a corrupt header.
 */
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ipc/ledger.h"
#include "test_helpers.h"
#include "util.h"

typedef struct seg {
    int fd;
    void *mem;
    uint64_t bytes;
} seg;

/* A memfd-backed shared mapping holding a formatted ledger of plan p. */
static void seg_make(seg *s, const ledger_plan *p, ledger *l)
{
    s->bytes = ledger_shm_bytes(p);
    s->fd = memfd_create("test-ledger", MFD_CLOEXEC);
    T_ASSERT(s->fd >= 0);
    T_ASSERT(ftruncate(s->fd, (off_t)s->bytes) == 0);
    s->mem = mmap(NULL, s->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
    T_ASSERT(s->mem != MAP_FAILED);
    T_ASSERT_RC(ledger_format(s->mem, s->bytes, p));
    T_ASSERT_RC(ledger_open(l, s->mem, s->bytes));
}

static void seg_free(seg *s)
{
    T_ASSERT(munmap(s->mem, s->bytes) == 0);
    T_ASSERT(close(s->fd) == 0);
}

/* Skewed random lengths 1..max_len (many short, few long), reproducible. */
static uint32_t *make_lens(uint32_t n, uint32_t max_len, uint64_t seed)
{
    uint32_t *lens = malloc(n * sizeof *lens);
    T_ASSERT(lens);
    df_rng r;
    df_rng_seed(&r, seed);
    for (uint32_t i = 0; i < n; i++) {
        double u = df_rng_uniform(&r);
        lens[i] = 1 + (uint32_t)(u * u * u * max_len);
    }
    return lens;
}

static int plans_equal(const ledger_plan *a, const ledger_plan *b)
{
    return a->n_batches == b->n_batches && a->n_samples == b->n_samples &&
           memcmp(a->batches, b->batches, a->n_batches * sizeof *a->batches) == 0 &&
           memcmp(a->sample_idx, b->sample_idx, a->n_samples * 4) == 0 &&
           memcmp(a->sample_len, b->sample_len, a->n_samples * 4) == 0;
}

static unsigned bucket_of(uint32_t len) /* test's own: k with 2^k <= len^2 < 2^(k+1) */
{
    unsigned k = 0;
    uint64_t sq = (uint64_t)len * len;
    while (sq >>= 1)
        k++;
    return k;
}

static void test_plan(void)
{
    const uint32_t n = 6000, max_seq = 2048;
    const uint64_t budget = 8192;
    uint32_t *lens = make_lens(n, 3000, 7); /* some above max_seq: truncated */
    ledger_plan a = {0}, b = {0}, c = {0}, d = {0};
    T_ASSERT_RC(ledger_plan_build(&a, lens, n, 42, 0, budget, max_seq));
    T_ASSERT_RC(ledger_plan_build(&b, lens, n, 42, 0, budget, max_seq));
    T_ASSERT_RC(ledger_plan_build(&c, lens, n, 43, 0, budget, max_seq));
    T_ASSERT_RC(ledger_plan_build(&d, lens, n, 42, 1, budget, max_seq));
    T_ASSERT(plans_equal(&a, &b));
    T_ASSERT(!plans_equal(&a, &c));
    T_ASSERT(!plans_equal(&a, &d));
    T_ASSERT(a.seed == 42 && a.epoch == 0 && a.token_budget == budget && a.max_seq_len == max_seq);

    /* every sample exactly once, effective lengths, budget, homogeneity */
    uint8_t *seen = calloc(n, 1);
    T_ASSERT(seen);
    uint32_t truncated = 0, pos = 0;
    unsigned underfilled[64] = {0};
    for (uint32_t i = 0; i < n; i++)
        truncated += lens[i] > max_seq;
    T_ASSERT(truncated > 0 && a.n_truncated == truncated);
    for (uint32_t bi = 0; bi < a.n_batches; bi++) {
        const ledger_batch *bt = &a.batches[bi];
        T_ASSERT(bt->first == pos && bt->count >= 1);
        uint64_t tok = 0;
        uint32_t mn = UINT32_MAX, mx = 0;
        for (uint32_t k = 0; k < bt->count; k++) {
            uint32_t s = a.sample_idx[bt->first + k], len = a.sample_len[bt->first + k];
            T_ASSERT(s < n && !seen[s]);
            seen[s] = 1;
            T_ASSERT(len == (lens[s] < max_seq ? lens[s] : max_seq));
            tok += len;
            mn = len < mn ? len : mn;
            mx = len > mx ? len : mx;
        }
        T_ASSERT(tok == bt->tokens && tok <= budget);
        T_ASSERT((uint64_t)mx * mx < 2ull * mn * mn); /* within a factor sqrt(2) */
        T_ASSERT(bucket_of(mn) == bucket_of(mx));
        if (bt->tokens + 2ull * mn <= budget) /* room for another sample of this bucket */
            underfilled[bucket_of(mn)]++;
        pos += bt->count;
    }
    T_ASSERT(pos == n);
    for (uint32_t i = 0; i < n; i++)
        T_ASSERT(seen[i]);
    for (int k = 0; k < 64; k++)
        T_ASSERT(underfilled[k] <= 1);
    /* batch order is shuffled: lengths are not sorted along the batch ids */
    int ups = 0, downs = 0;
    for (uint32_t bi = 1; bi < a.n_batches; bi++) {
        uint32_t l0 = a.sample_len[a.batches[bi - 1].first], l1 = a.sample_len[a.batches[bi].first];
        ups += l1 > l0;
        downs += l1 < l0;
    }
    T_ASSERT(ups > (int)a.n_batches / 10 && downs > (int)a.n_batches / 10);
    printf("ok: plan of %u samples -> %u batches (%u truncated): deterministic, exactly once, "
           "<= budget, homogeneous\n",
           n, a.n_batches, a.n_truncated);

    /* bad arguments */
    ledger_plan e = {0};
    T_ASSERT(ledger_plan_build(&e, lens, 0, 1, 0, budget, max_seq) == -EINVAL);
    T_ASSERT(ledger_plan_build(&e, lens, n, 1, 0, 100, 200) == -EINVAL); /* budget < max_seq_len */
    T_ASSERT(ledger_plan_build(&e, lens, n, 1, 0, 100, 0) == -EINVAL);
    uint32_t zero[3] = {5, 0, 5};
    T_ASSERT(ledger_plan_build(&e, zero, 3, 1, 0, 100, 50) == -EINVAL);
    T_ASSERT(e.batches == NULL && e.n_batches == 0);
    uint32_t one = 9;
    T_ASSERT_RC(ledger_plan_build(&e, &one, 1, 1, 0, 10, 10));
    T_ASSERT(e.n_batches == 1 && e.sample_idx[0] == 0 && e.batches[0].tokens == 9);
    ledger_plan_free(&e);
    ledger_plan_free(&e); /* twice is fine */

    ledger_plan_free(&a);
    ledger_plan_free(&b);
    ledger_plan_free(&c);
    ledger_plan_free(&d);
    free(seen);
    free(lens);
}

/* n samples of one length each with budget = that length: one sample per batch. */
static void one_per_batch(ledger_plan *p, uint32_t n)
{
    uint32_t *lens = malloc(n * sizeof *lens);
    T_ASSERT(lens);
    for (uint32_t i = 0; i < n; i++)
        lens[i] = 100;
    T_ASSERT_RC(ledger_plan_build(p, lens, n, 5, 0, 100, 100));
    T_ASSERT(p->n_batches == n);
    free(lens);
}

static ledger_state state_of(ledger *l, uint64_t id)
{
    ledger_batch_status s;
    T_ASSERT_RC(ledger_batch_status_get(l, id, &s));
    return s.state;
}

static void test_states(void)
{
    ledger_plan p = {0};
    one_per_batch(&p, 8);
    seg s;
    ledger l;
    seg_make(&s, &p, &l);
    ledger_counts_t c;
    ledger_counts(&l, &c);
    T_ASSERT(c.pending == 8 && c.claimed == 0 && !ledger_epoch_done(&l));

    uint64_t id;
    T_ASSERT_RC(ledger_claim_next(&l, 3, 11, &id));
    T_ASSERT(id == 0);
    ledger_batch_status st;
    T_ASSERT_RC(ledger_batch_status_get(&l, 0, &st));
    T_ASSERT(st.state == LEDGER_CLAIMED && st.worker == 3 && st.incarnation == 11 && st.claims == 1);
    const uint32_t *idx;
    uint32_t n;
    T_ASSERT_RC(ledger_batch_samples(&l, 0, &idx, &n));
    T_ASSERT(n == 1 && idx[0] == p.sample_idx[0]);

    /* illegal transitions */
    T_ASSERT(ledger_set_in_ring(&l, 1) == -EINVAL);      /* PENDING */
    T_ASSERT(ledger_mark_trained(&l, 1, 1) == -EINVAL);  /* PENDING */
    T_ASSERT(ledger_claim_batch(&l, 0, 4, 1) == -EBUSY); /* CLAIMED by 3 */
    T_ASSERT(ledger_claim_batch(&l, 8, 4, 1) == -ERANGE);
    T_ASSERT(ledger_mark_trained(&l, 0, 0) == -EINVAL); /* steps start at 1 */
    T_ASSERT(ledger_batch_samples(&l, 99, &idx, &n) == -ERANGE);

    T_ASSERT_RC(ledger_set_in_ring(&l, 0));
    T_ASSERT_RC(ledger_batch_status_get(&l, 0, &st));
    T_ASSERT(st.state == LEDGER_IN_RING && st.worker == 3 && st.incarnation == 11);
    T_ASSERT(ledger_set_in_ring(&l, 0) == -EINVAL); /* already IN_RING */
    T_ASSERT_RC(ledger_mark_trained(&l, 0, 1));
    T_ASSERT(ledger_mark_trained(&l, 0, 2) == -EALREADY); /* would count it twice */
    T_ASSERT(ledger_set_in_ring(&l, 0) == -EALREADY);     /* consumer was faster: harmless */
    T_ASSERT(ledger_claim_batch(&l, 0, 4, 1) == -EALREADY);
    T_ASSERT_RC(ledger_batch_status_get(&l, 0, &st));
    T_ASSERT(st.state == LEDGER_TRAINED && st.step == 1 && st.trainings == 1);

    /* deterministic-mode claim, trained straight from CLAIMED */
    T_ASSERT_RC(ledger_claim_batch(&l, 5, 9, 2));
    T_ASSERT_RC(ledger_mark_trained(&l, 5, 2));
    T_ASSERT_RC(ledger_commit(&l, 1));
    T_ASSERT(state_of(&l, 0) == LEDGER_COMMITTED && state_of(&l, 5) == LEDGER_TRAINED);
    T_ASSERT(ledger_committed_step(&l) == 1);
    T_ASSERT(ledger_mark_trained(&l, 0, 3) == -EALREADY); /* COMMITTED */
    T_ASSERT(ledger_commit(&l, 0) == -EINVAL);            /* below the committed step */
    T_ASSERT(ledger_rewind(&l, 0) == -EINVAL);            /* cannot undo a checkpoint */
    T_ASSERT(ledger_mark_poisoned(&l, 0) == -EALREADY);
    T_ASSERT_RC(ledger_mark_poisoned(&l, 7)); /* PENDING -> POISONED */
    T_ASSERT_RC(ledger_mark_poisoned(&l, 7)); /* idempotent */
    T_ASSERT(ledger_claim_batch(&l, 7, 1, 1) == -EINVAL);

    /* claim_next skips the batches taken out of order (5, 7) */
    uint64_t got[8];
    int k = 0;
    while (ledger_claim_next(&l, 1, 1, &got[k]) == 0)
        k++;
    T_ASSERT(k == 5);
    static const uint64_t want[] = {1, 2, 3, 4, 6};
    for (int i = 0; i < 5; i++)
        T_ASSERT(got[i] == want[i]);
    T_ASSERT(ledger_claim_next(&l, 1, 1, &id) == -ENODATA);
    ledger_counts(&l, &c);
    T_ASSERT(c.pending == 0 && c.claimed == 5 && c.trained == 1 && c.committed == 1 && c.poisoned == 1);
    T_ASSERT_STREQ(ledger_state_name(LEDGER_IN_RING), "in_ring");

    seg_free(&s);
    ledger_plan_free(&p);
    printf("ok: state machine, illegal transitions refused, double training -> -EALREADY\n");
}

static void test_rewind_and_audit(const char *dir)
{
    ledger_plan p = {0};
    one_per_batch(&p, 10);
    seg s;
    ledger l;
    seg_make(&s, &p, &l);
    uint64_t id;
    for (uint64_t step = 1; step <= 10; step++) { /* batch step-1 trained at step */
        T_ASSERT_RC(ledger_claim_next(&l, 2, 1, &id));
        T_ASSERT(id == step - 1);
        T_ASSERT_RC(ledger_set_in_ring(&l, id));
        T_ASSERT_RC(ledger_mark_trained(&l, id, step));
    }
    T_ASSERT(ledger_claim_next(&l, 2, 1, &id) == -ENODATA);
    T_ASSERT_RC(ledger_commit(&l, 6));
    uint32_t back = 0;
    T_ASSERT_RC(ledger_rewind_ex(&l, 6, &back)); /* drafter restarted from checkpoint 6 */
    T_ASSERT(back == 4);
    for (uint64_t b = 0; b < 10; b++)
        T_ASSERT(state_of(&l, b) == (b < 6 ? LEDGER_COMMITTED : LEDGER_PENDING));
    T_ASSERT(ledger_exactly_once(&l) == 0);

    char path[512];
    snprintf(path, sizeof path, "%s/audit-mid.json", dir);
    T_ASSERT_RC(ledger_audit_write(&l, path));
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    T_ASSERT(j);
    /* batches left: incomplete, no verdict yet (not "false": nothing was done twice) */
    T_ASSERT(json_is_null(json_object_get(j, "exactly_once")));
    T_ASSERT_STREQ(json_string_value(json_object_get(j, "status")), "incomplete");
    T_ASSERT(json_integer_value(json_object_get(json_object_get(j, "counts"), "pending")) == 4);
    json_decref(j);

    /* re-claim (the scan after the cursor ran out) and re-train as steps 7..10 again */
    for (uint64_t step = 7; step <= 10; step++) {
        T_ASSERT_RC(ledger_claim_next(&l, 2, 2, &id));
        T_ASSERT(id == step - 1);
        T_ASSERT_RC(ledger_mark_trained(&l, id, step));
    }
    T_ASSERT(ledger_claim_next(&l, 2, 2, &id) == -ENODATA);
    T_ASSERT(!ledger_epoch_done(&l));
    T_ASSERT_RC(ledger_commit(&l, 10));
    T_ASSERT(ledger_epoch_done(&l) && ledger_exactly_once(&l) == 1);

    snprintf(path, sizeof path, "%s/audit.json", dir);
    T_ASSERT_RC(ledger_audit_write(&l, path));
    j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!j)
        fprintf(stderr, "%s:%d: %s\n", path, je.line, je.text);
    T_ASSERT(j);
    T_ASSERT(json_integer_value(json_object_get(j, "seed")) == 5);
    T_ASSERT(json_integer_value(json_object_get(j, "epoch")) == 0);
    T_ASSERT(json_integer_value(json_object_get(j, "n_batches")) == 10);
    T_ASSERT(json_integer_value(json_object_get(j, "n_samples")) == 10);
    T_ASSERT(json_integer_value(json_object_get(j, "committed_step")) == 10);
    T_ASSERT(json_is_true(json_object_get(j, "exactly_once")));
    T_ASSERT_STREQ(json_string_value(json_object_get(j, "status")), "complete");
    json_t *cnt = json_object_get(j, "counts");
    T_ASSERT(json_integer_value(json_object_get(cnt, "committed")) == 10);
    T_ASSERT(json_integer_value(json_object_get(cnt, "pending")) == 0);
    json_t *stats = json_object_get(j, "stats");
    T_ASSERT(json_integer_value(json_object_get(stats, "rewound")) == 4);
    T_ASSERT(json_integer_value(json_object_get(stats, "trained")) == 14);
    T_ASSERT(json_array_size(json_object_get(j, "poisoned")) == 0);
    json_t *batches = json_object_get(j, "batches");
    T_ASSERT(json_array_size(batches) == 10);
    for (size_t b = 0; b < 10; b++) {
        json_t *o = json_array_get(batches, b);
        T_ASSERT(json_integer_value(json_object_get(o, "id")) == (json_int_t)b);
        T_ASSERT_STREQ(json_string_value(json_object_get(o, "state")), "committed");
        T_ASSERT(json_integer_value(json_object_get(o, "step")) == (json_int_t)b + 1);
        T_ASSERT(json_integer_value(json_object_get(o, "trainings")) == (b >= 6 ? 2 : 1));
    }
    json_decref(j);

    /* a poisoned batch: listed separately, still exactly once */
    seg_free(&s);
    seg_make(&s, &p, &l);
    for (uint64_t b = 0; b < 10; b++) {
        T_ASSERT_RC(ledger_claim_batch(&l, b, 1, 1));
        if (b == 3)
            T_ASSERT_RC(ledger_mark_poisoned(&l, b));
        else
            T_ASSERT_RC(ledger_mark_trained(&l, b, b + 1));
    }
    T_ASSERT_RC(ledger_commit(&l, 10));
    T_ASSERT_RC(ledger_audit_write(&l, path));
    j = json_load_file(path, 0, &je);
    T_ASSERT(j && json_is_true(json_object_get(j, "exactly_once")));
    json_t *pois = json_object_get(j, "poisoned");
    T_ASSERT(json_array_size(pois) == 1 && json_integer_value(json_array_get(pois, 0)) == 3);
    T_ASSERT_STREQ(json_string_value(json_object_get(json_array_get(json_object_get(j, "batches"), 3), "state")),
                   "poisoned");
    json_decref(j);

    /* a corrupted plan in the segment is caught by the audit */
    ((uint32_t *)l.sample_idx)[0] = ((uint32_t *)l.sample_idx)[1];
    T_ASSERT(ledger_exactly_once(&l) == 0);
    T_ASSERT_RC(ledger_audit_write(&l, path));
    j = json_load_file(path, 0, &je);
    T_ASSERT(j && json_is_false(json_object_get(j, "exactly_once")));
    T_ASSERT_STREQ(json_string_value(json_object_get(j, "status")), "violated");
    json_decref(j);

    T_ASSERT(unlink(path) == 0);
    snprintf(path, sizeof path, "%s/audit-mid.json", dir);
    T_ASSERT(unlink(path) == 0);
    seg_free(&s);
    ledger_plan_free(&p);
    printf("ok: rewind(6) after steps 1..10 returns 4 batches; re-trained; audit says exactly once\n");
}

static void test_reclaim(void)
{
    ledger_plan p = {0};
    one_per_batch(&p, 6);
    seg s;
    ledger l;
    seg_make(&s, &p, &l);
    uint64_t a, b, c, d;
    T_ASSERT_RC(ledger_claim_next(&l, 3, 1, &a));
    T_ASSERT_RC(ledger_claim_next(&l, 4, 1, &b));
    T_ASSERT_RC(ledger_claim_next(&l, 3, 2, &c)); /* worker 3, next incarnation */
    T_ASSERT_RC(ledger_claim_next(&l, 3, 2, &d));
    T_ASSERT_RC(ledger_set_in_ring(&l, d)); /* published: the ring owns it now */
    uint32_t n = 0;
    T_ASSERT_RC(ledger_reclaim_owner_ex(&l, 3, &n));
    T_ASSERT(n == 2);
    T_ASSERT(state_of(&l, a) == LEDGER_PENDING && state_of(&l, c) == LEDGER_PENDING);
    T_ASSERT(state_of(&l, b) == LEDGER_CLAIMED && state_of(&l, d) == LEDGER_IN_RING);
    /* everything comes back exactly once */
    uint64_t id;
    int k = 0;
    uint32_t mask = 0;
    while (ledger_claim_next(&l, 5, 1, &id) == 0) {
        T_ASSERT(!(mask & (1u << id)));
        mask |= 1u << id;
        k++;
    }
    T_ASSERT(k == 4 && mask == ((1u << a) | (1u << c) | (1u << 4) | (1u << 5)));
    T_ASSERT_RC(ledger_batch_status_get(&l, a, &(ledger_batch_status){0}));
    ledger_batch_status st;
    T_ASSERT_RC(ledger_batch_status_get(&l, a, &st));
    T_ASSERT(st.claims == 2 && st.worker == 5);
    seg_free(&s);
    ledger_plan_free(&p);
    printf("ok: reclaim_owner returns a dead worker's CLAIMED batches, leaves IN_RING ones\n");
}

/* Claim until nothing is left, marking each batch trained; record hits in shared memory. */
static void claimer(ledger *l, uint16_t worker, _Atomic uint32_t *hits)
{
    uint64_t id;
    for (;;) {
        int rc = ledger_claim_next(l, worker, 1, &id);
        if (rc == -ENODATA)
            break;
        if (rc != 0)
            _exit(10);
        ledger_batch_status st;
        if (ledger_batch_status_get(l, id, &st) || st.state != LEDGER_CLAIMED || st.worker != worker)
            _exit(11);
        atomic_fetch_add(&hits[id], 1);
        if (ledger_set_in_ring(l, id) || ledger_mark_trained(l, id, id + 1))
            _exit(12);
    }
    _exit(0);
}

static void test_multiprocess(void)
{
    const uint32_t n = 12000;
    uint32_t *lens = make_lens(n, 1000, 99);
    ledger_plan p = {0};
    T_ASSERT_RC(ledger_plan_build(&p, lens, n, 77, 2, 4096, 1024));
    free(lens);
    seg s;
    ledger l;
    seg_make(&s, &p, &l);
    const uint32_t nb = p.n_batches;
    _Atomic uint32_t *hits = mmap(NULL, nb * sizeof *hits, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    T_ASSERT(hits != MAP_FAILED);

    /* a claimer that dies holding 10 batches */
    pid_t pid = fork();
    T_ASSERT(pid >= 0);
    if (pid == 0) {
        ledger lc;
        uint64_t id;
        if (ledger_open(&lc, s.mem, s.bytes))
            _exit(20);
        for (int i = 0; i < 10; i++)
            if (ledger_claim_next(&lc, 50, 1, &id))
                _exit(21);
        raise(SIGKILL);
        _exit(22);
    }
    int status;
    T_ASSERT(waitpid(pid, &status, 0) == pid);
    T_ASSERT(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    ledger_counts_t c;
    ledger_counts(&l, &c);
    T_ASSERT(c.claimed == 10);
    uint32_t back;
    T_ASSERT_RC(ledger_reclaim_owner_ex(&l, 50, &back)); /* the orchestrator, after reaping */
    T_ASSERT(back == 10);

    /* 4 concurrent claimers: each batch claimed exactly once among them */
    pid_t kids[4];
    for (int k = 0; k < 4; k++) {
        kids[k] = fork();
        T_ASSERT(kids[k] >= 0);
        if (kids[k] == 0) {
            ledger lc;
            if (ledger_open(&lc, s.mem, s.bytes))
                _exit(20);
            claimer(&lc, (uint16_t)(k + 1), hits);
        }
    }
    for (int k = 0; k < 4; k++) {
        T_ASSERT(waitpid(kids[k], &status, 0) == kids[k]);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fprintf(stderr, "claimer %d: status 0x%x\n", k, status);
        T_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    uint32_t twice = 0;
    for (uint32_t b = 0; b < nb; b++) {
        T_ASSERT(hits[b] == 1);
        ledger_batch_status st;
        T_ASSERT_RC(ledger_batch_status_get(&l, b, &st));
        T_ASSERT(st.state == LEDGER_TRAINED && st.step == b + 1 && st.trainings == 1);
        twice += st.claims == 2;
    }
    T_ASSERT(twice == 10); /* exactly the dead claimer's batches were claimed a second time */
    T_ASSERT_RC(ledger_commit(&l, nb));
    T_ASSERT(ledger_exactly_once(&l) == 1);
    T_ASSERT(munmap(hits, nb * sizeof *hits) == 0);
    seg_free(&s);
    ledger_plan_free(&p);
    printf("ok: %u batches, 1 claimer SIGKILLed + reclaimed, 4 concurrent claimers: each batch once\n", nb);
}

/* Deterministic mode: rank r of R claims b = s*R + r at step s; no collisions. */
static void test_deterministic(void)
{
    ledger_plan p = {0};
    one_per_batch(&p, 64);
    seg s;
    ledger l;
    seg_make(&s, &p, &l);
    const int R = 2;
    pid_t kids[2];
    for (int r = 0; r < R; r++) {
        kids[r] = fork();
        T_ASSERT(kids[r] >= 0);
        if (kids[r] == 0) {
            ledger lc;
            if (ledger_open(&lc, s.mem, s.bytes))
                _exit(20);
            for (uint64_t step = 0;; step++) {
                uint64_t b = step * (uint64_t)R + (uint64_t)r;
                if (b >= ledger_n_batches(&lc))
                    break;
                if (ledger_claim_batch(&lc, b, (uint16_t)(r + 1), 1) || ledger_mark_trained(&lc, b, step + 1))
                    _exit(21);
            }
            _exit(0);
        }
    }
    for (int r = 0; r < R; r++) {
        int status;
        T_ASSERT(waitpid(kids[r], &status, 0) == kids[r]);
        T_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    for (uint64_t b = 0; b < 64; b++) {
        ledger_batch_status st;
        T_ASSERT_RC(ledger_batch_status_get(&l, b, &st));
        T_ASSERT(st.state == LEDGER_TRAINED && st.step == b / R + 1 && st.claims == 1);
    }
    seg_free(&s);
    ledger_plan_free(&p);
    printf("ok: deterministic claims by rank (b = s*R + r)\n");
}

static void test_open_validation(void)
{
    ledger_plan p = {0};
    one_per_batch(&p, 4);
    seg s;
    ledger l;
    seg_make(&s, &p, &l);
    T_ASSERT(ledger_open(&l, s.mem, s.bytes - 64) == -EPROTO); /* segment too small */
    T_ASSERT(ledger_format(s.mem, s.bytes - 64, &p) == -ENOSPC);
    uint32_t *version = (uint32_t *)((char *)s.mem + 8);
    *version = 99;
    T_ASSERT(ledger_open(&l, s.mem, s.bytes) == -EPROTO);
    *version = 2;
    T_ASSERT_RC(ledger_open(&l, s.mem, s.bytes));
    memset(s.mem, 0, 8); /* magic */
    T_ASSERT(ledger_open(&l, s.mem, s.bytes) == -EPROTO);
    seg_free(&s);
    ledger_plan_free(&p);
    printf("ok: ledger_open refuses bad magic, version and size\n");
}

/* ledger.bin: a snapshot verifies; one flipped bit, an old version, an impossible state
 * are refused; a restore carries the counters over and raises only "replays". */
static void test_snapshot(void)
{
    ledger_plan p = {0};
    one_per_batch(&p, 6);
    seg s;
    ledger l, snap, r;
    seg_make(&s, &p, &l);
    for (uint64_t b = 0; b < 4; b++) {
        T_ASSERT_RC(ledger_claim_batch(&l, b, 1, 1));
        T_ASSERT_RC(ledger_mark_trained(&l, b, b + 1));
    }
    T_ASSERT_RC(ledger_rewind(&l, 2)); /* batches 2, 3 back: trained twice below */
    for (uint64_t b = 2; b < 4; b++) {
        T_ASSERT_RC(ledger_claim_batch(&l, b, 1, 2));
        T_ASSERT_RC(ledger_mark_trained(&l, b, b + 1));
    }
    T_ASSERT_RC(ledger_commit(&l, 3)); /* 0, 1, 2 committed; 3 trained at step 4 */
    T_ASSERT_RC(ledger_mark_poisoned(&l, 5));
    void *buf;
    uint64_t len;
    char err[512];
    T_ASSERT_RC(ledger_snapshot(&l, &buf, &len));
    T_ASSERT_RC(ledger_snapshot_open(&snap, buf, len, err, sizeof err));
    uint8_t *bytes = buf;
    uint64_t off_slots;
    memcpy(&off_slots, bytes + 88, 8);
    bytes[off_slots + 24 + 8] ^= 1; /* batch 1's claim counter: nothing else would notice */
    T_ASSERT(ledger_snapshot_open(&snap, buf, len, err, sizeof err) == -EBADMSG && strstr(err, "checksum"));
    bytes[off_slots + 24 + 8] ^= 1;
    uint32_t *version = (uint32_t *)(bytes + 8);
    *version = 1;
    T_ASSERT(ledger_snapshot_open(&snap, buf, len, err, sizeof err) == -EPROTONOSUPPORT && strstr(err, "version 1"));
    *version = 2;
    /* COMMITTED at step 9 > committed step 3, checksum made right: the state check refuses */
    uint64_t w = 4 | 9ull << 8, zero = 0, sum;
    memcpy(bytes + off_slots, &w, 8);
    memcpy(bytes + LEDGER_CHECKSUM_OFFSET, &zero, 8);
    sum = df_fnv1a64(bytes, len, 0);
    memcpy(bytes + LEDGER_CHECKSUM_OFFSET, &sum, 8);
    T_ASSERT(ledger_snapshot_open(&snap, buf, len, err, sizeof err) == -EBADMSG && strstr(err, "past the committed"));
    free(buf);

    T_ASSERT_RC(ledger_snapshot(&l, &buf, &len));
    T_ASSERT_RC(ledger_snapshot_open(&snap, buf, len, err, sizeof err));
    seg s2;
    seg_make(&s2, &p, &r);
    ledger_restore_counts rc;
    T_ASSERT_RC(ledger_restore(&r, &snap, &rc));
    T_ASSERT(rc.committed == 3 && rc.poisoned == 1 && rc.rewound == 1 && rc.reclaimed == 0);
    T_ASSERT(ledger_committed_step(&r) == 3);
    ledger_batch_status st;
    T_ASSERT_RC(ledger_batch_status_get(&r, 2, &st));
    T_ASSERT(st.state == LEDGER_COMMITTED && st.step == 3 && st.trainings == 2 && st.claims == 2 && st.replays == 1);
    T_ASSERT_RC(ledger_batch_status_get(&r, 3, &st));
    T_ASSERT(st.state == LEDGER_PENDING && st.trainings == 2 && st.replays == 0);
    T_ASSERT(ledger_restore(&r, &snap, &rc) == -EBUSY); /* only into a fresh ledger */
    seg_free(&s2);
    free(buf);
    seg_free(&s);
    ledger_plan_free(&p);
    printf("ok: ledger.bin snapshot: checksum, version and impossible states refused; restore keeps the counters\n");
}

int main(void)
{
    char dir[] = "/tmp/test_ledger.XXXXXX";
    T_ASSERT(mkdtemp(dir));
    test_plan();
    test_states();
    test_rewind_and_audit(dir);
    test_reclaim();
    test_multiprocess();
    test_snapshot();
    test_deterministic();
    test_open_validation();
    T_ASSERT(rmdir(dir) == 0);
    printf("test_ledger: all passed\n");
    return 0;
}
