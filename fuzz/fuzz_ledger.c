/* fuzz_ledger.c: libFuzzer target for ledger_snapshot_open, which reads ledger.bin (the
 * batch states of an epoch) from the run dir when an orchestrator resumes. Input: the
 * file's bytes. The harness is built over common/ipc/ledger.c itself (included below) to
 * write what a random mutation nearly always breaks and a file on disk would carry intact:
 * total_bytes = the input's size, the plan hash of the plan arrays (when the layout opens),
 * and the checksum; so the fuzzer reaches the plan coverage and state checks.
 *
 * Beyond "no crash, no sanitizer report", the oracle for an accepted snapshot: a fresh
 * ledger formatted from the snapshot's own plan takes it (ledger_restore returns 0), every
 * batch of the result is COMMITTED, POISONED or PENDING with the snapshot's committed step,
 * and every batch's sample list reads back inside the plan. A refusal comes with a message.
 *
 * Built with -DFUZZ_LEDGER_SEEDS it is instead a program that writes seed snapshots (fresh,
 * mid-epoch with every state, finished) into the directory it is given (scripts/fuzz.sh).
 * Run with scripts/fuzz.sh (make fuzz).
 */
#include "fuzz/fuzz.h"
#include "ipc/ledger.c"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef FUZZ_LEDGER_SEEDS
int fuzz_accepted; /* inputs the parser accepted (fuzz/replay_main.c prints it) */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    void *mem = NULL;
    if (posix_memalign(&mem, 64, size ? size : 1) != 0) /* exactly size bytes: ASan sees past them */
        return 0;
    memcpy(mem, data, size);
    struct ledger_shm *h = mem;
    if (size >= sizeof *h) {
        h->total_bytes = size;
        ledger probe;
        if (ledger_open(&probe, mem, size) == 0)
            h->plan_hash =
                plan_hash(probe.batches, probe.n_batches, probe.sample_idx, probe.sample_len, probe.n_samples);
        h->checksum = snapshot_sum(mem, size);
    }
    ledger snap;
    char err[512] = "";
    int rc = ledger_snapshot_open(&snap, mem, size, err, sizeof err);
    if (rc < 0) {
        ORACLE(err[0] != 0);
        free(mem);
        return 0;
    }
    fuzz_accepted++;
    /* a fresh ledger of the snapshot's own plan takes it */
    ledger_plan p = {.seed = h->seed,
                     .epoch = h->epoch,
                     .max_seq_len = h->max_seq_len,
                     .token_budget = h->token_budget,
                     .n_samples = snap.n_samples,
                     .n_batches = snap.n_batches,
                     .n_truncated = h->n_truncated,
                     .sample_idx = (uint32_t *)snap.sample_idx,
                     .sample_len = (uint32_t *)snap.sample_len,
                     .batches = (ledger_batch *)snap.batches,
                     .data_digest = h->data_digest};
    uint64_t bytes = ledger_shm_bytes(&p);
    void *fresh_mem = NULL;
    ORACLE(posix_memalign(&fresh_mem, 64, bytes) == 0);
    ledger fresh;
    ORACLE(ledger_format(fresh_mem, bytes, &p) == 0 && ledger_open(&fresh, fresh_mem, bytes) == 0);
    ledger_restore_counts rc_out;
    rc = ledger_restore(&fresh, &snap, &rc_out);
    if (rc < 0)
        fprintf(stderr, "an accepted snapshot does not restore: %d\n", rc);
    ORACLE(rc == 0);
    ORACLE(ledger_committed_step(&fresh) == ledger_committed_step(&snap));
    for (uint64_t id = 0; id < fresh.n_batches; id++) {
        ledger_batch_status st;
        ORACLE(ledger_batch_status_get(&fresh, id, &st) == 0);
        ORACLE(st.state == LEDGER_COMMITTED || st.state == LEDGER_POISONED || st.state == LEDGER_PENDING);
        ORACLE(st.state != LEDGER_COMMITTED || (st.step >= 1 && st.step <= ledger_committed_step(&fresh)));
        const uint32_t *idx, *len;
        uint32_t n;
        uint64_t tokens;
        ORACLE(ledger_batch_info(&fresh, id, &idx, &len, &n, &tokens) == 0);
        for (uint32_t k = 0; k < n; k++)
            ORACLE(idx[k] < fresh.n_samples);
    }
    free(fresh_mem);
    free(mem);
    return 0;
}
#else
/* the seed writer: snapshots of a small plan at three points of an epoch, and two that a
 * resume must refuse. mutate: 0 none, 1 cut to 100 bytes, 2 batch 0 COMMITTED at a step past
 * the committed one (the checksum rewritten: only the state check can tell) */
static void write_snapshot(ledger *l, const char *dir, const char *name, int mutate)
{
    void *buf;
    uint64_t len;
    ORACLE(ledger_snapshot(l, &buf, &len) == 0);
    if (mutate == 1)
        len = 100;
    if (mutate == 2) {
        struct ledger_shm *h = buf;
        struct ledger_slot *slots = (struct ledger_slot *)((char *)buf + h->off_slots);
        atomic_store(&slots[0].word, w_stepped(LEDGER_COMMITTED, atomic_load(&h->committed_step) + 40));
        h->checksum = 0;
        h->checksum = snapshot_sum(buf, len);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    ORACLE(f && fwrite(buf, 1, len, f) == len && fclose(f) == 0);
    free(buf);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\nWrites seed ledger snapshots into DIR.\n", argv[0]);
        return 2;
    }
    uint32_t lens[24];
    for (uint32_t i = 0; i < 24; i++)
        lens[i] = 5 + (i * 7) % 40;
    ledger_plan p = {0};
    ORACLE(ledger_plan_build(&p, lens, 24, 1234, 0, 64, 48) == 0);
    uint64_t bytes = ledger_shm_bytes(&p);
    void *mem = NULL;
    ORACLE(posix_memalign(&mem, 64, bytes) == 0);
    ledger l;
    ORACLE(ledger_format(mem, bytes, &p) == 0 && ledger_open(&l, mem, bytes) == 0);
    write_snapshot(&l, argv[1], "fresh.bin", 0);
    write_snapshot(&l, argv[1], "bad_truncated.bin", 1);
    uint64_t id;
    for (int k = 0; k < 6; k++) { /* claimed, in the ring, trained, committed, poisoned */
        ORACLE(ledger_claim_next(&l, 1, 1, &id) == 0);
        if (k >= 1)
            ORACLE(ledger_set_in_ring(&l, id) == 0);
        if (k >= 2 && k < 5)
            ORACLE(ledger_mark_trained(&l, id, (uint64_t)k) == 0);
        if (k == 5)
            ORACLE(ledger_mark_poisoned(&l, id) == 0);
    }
    ORACLE(ledger_commit(&l, 3) == 0);
    write_snapshot(&l, argv[1], "mid_epoch.bin", 0);
    write_snapshot(&l, argv[1], "bad_committed_past_step.bin", 2);
    while (ledger_claim_next(&l, 2, 1, &id) == 0)
        ORACLE(ledger_mark_trained(&l, id, 9) == 0);
    uint32_t back;
    ORACLE(ledger_reclaim_owner_ex(&l, 1, &back) == 0);
    while (ledger_claim_next(&l, 2, 1, &id) == 0)
        ORACLE(ledger_mark_trained(&l, id, 9) == 0);
    ORACLE(ledger_commit(&l, 9) == 0);
    write_snapshot(&l, argv[1], "finished.bin", 0);
    free(mem);
    ledger_plan_free(&p);
    return 0;
}
#endif
