/* group.c: what the orchestrator owns for restart groups (prefix group_).
 *
 * The drafter ranks are one group: a dead rank restarts all of them from the last
 * checkpoint (supervisor.c decides when; this file does the shared-memory part).
 *   - All-reduce: with R > 1 ranks on the cpu backend the ranks sum their gradients through
 *     one shm segment (common/ipc/allreduce_shm.c). It is created here at setup, handed to
 *     every rank in its hello (kind "allreduce"), aborted when a rank dies (the others stop
 *     waiting at once instead of after their timeout) and re-formatted before the group
 *     starts again (a stale rank can never join the new group: allreduce.h). On the cuda
 *     backend the ranks build an NCCL communicator instead: cuda_helper makes a fresh unique
 *     id for every generation of the group (a restarted group never meets the old one's
 *     bootstrap), and the hello's "group" object carries it (hex) to every rank.
 *   - Deterministic mode ("deterministic": true) widens the group to every worker: after a
 *     drafter death, later batches still in the rings would sit ahead of the rewound ones
 *     and could fill them (docs/ledger.md). So every worker is stopped, and once all are
 *     reaped group_reset_pipeline re-formats every ring (a closed ring stays closed) and
 *     returns every CLAIMED / IN_RING batch to PENDING; the ledger rewind to the
 *     checkpoint is the supervisor's, as in fast mode.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ipc/allreduce.h"
#include "ipc/shm.h"
#include "orch.h"
#include "util.h"

/* Floats per all-reduce round: larger gradients are reduced in rounds of this size. 1M
 * floats = 4 MiB per rank slot; the memfd is only backed where it is touched. */
#define GROUP_AR_MAX_FLOATS (1ull << 20)

int group_in(const orch *o, const orch_worker *w)
{
    /* the validator only reads committed checkpoints: no batch of it is ever in flight, so
     * it is never part of a group (its deaths never restart training, nor the other way) */
    if (w->tw->role == TOPOLOGY_ROLE_VALIDATOR)
        return 0;
    return o->t.deterministic || w->tw->role == TOPOLOGY_ROLE_DRAFTER;
}

/* A new NCCL unique id for this generation of a cuda drafter group (R > 1). */
static int new_nccl_id(orch *o, char *err, size_t errlen)
{
    const char *args[] = {"--nccl-id", NULL};
    char answer[600], e2[700];
    int fd = -1;
    int rc = helper_call(o, args, answer, sizeof answer, &fd, e2, sizeof e2);
    if (fd >= 0)
        close(fd);
    if (rc == 0 && strlen(answer) != 256)
        snprintf(e2, sizeof e2, "cuda_helper --nccl-id: %zu hex digits, expected 256", strlen(answer)), rc = -EIO;
    if (rc < 0)
        return df_err(err, errlen, rc, "%s: %d cuda drafter ranks need an NCCL unique id: %s", o->t.source_path,
                      topology_n_drafters(&o->t), e2);
    memcpy(o->nccl_id, answer, 257);
    return 0;
}

int group_setup(orch *o, char *err, size_t errlen)
{
    int R = topology_n_drafters(&o->t);
    o->group_gen = 1;
    o->nccl_id[0] = 0;
    if (R > 1 && o->t.backend != TOPOLOGY_CPU)
        return new_nccl_id(o, err, errlen);
    if (R <= 1)
        return 0; /* one rank needs no reduction */
    uint64_t bytes = allreduce_shm_bytes(R, GROUP_AR_MAX_FLOATS);
    int rc;
    if (bytes == 0)
        return df_err(err, errlen, -EINVAL, "%s: %d drafter ranks: too many for the shm all-reduce (at most %d)",
                      o->t.source_path, R, ALLREDUCE_MAX_WORLD);
    char e2[400] = "";
    if ((rc = shm_create(&o->allreduce_seg, bytes, "df-allreduce")) < 0 ||
        (rc = allreduce_shm_format(o->allreduce_seg.base, o->allreduce_seg.size, R, GROUP_AR_MAX_FLOATS, e2,
                                   sizeof e2)) < 0)
        return df_err(err, errlen, rc, "all-reduce segment for %d drafter ranks (%llu bytes): %s", R,
                      (unsigned long long)bytes, e2[0] ? e2 : strerror(-rc));
    return 0;
}

void group_abort_allreduce(orch *o)
{
    if (o->allreduce_seg.base)
        (void)allreduce_shm_abort(o->allreduce_seg.base, o->allreduce_seg.size, NULL, 0);
}

int group_restart_prepare(orch *o, uint32_t *in_flight_returned)
{
    int rc = 0;
    *in_flight_returned = 0;
    o->group_gen++;
    if (o->nccl_id[0]) {
        char err[800];
        if ((rc = new_nccl_id(o, err, sizeof err)) < 0) {
            df_log("drafter group: %s", err);
            return rc;
        }
    }
    char e2[400];
    if (o->allreduce_seg.base &&
        (rc = allreduce_shm_format(o->allreduce_seg.base, o->allreduce_seg.size, topology_n_drafters(&o->t),
                                   GROUP_AR_MAX_FLOATS, e2, sizeof e2)) < 0) {
        df_log("drafter group: re-formatting the all-reduce segment: %s", e2);
        return rc;
    }
    if (!o->t.deterministic)
        return 0;
    for (int i = 0; i < o->t.n_rings; i++) {
        const topology_ring *r = &o->t.rings[i];
        if ((rc = ring_format(o->ring_seg[i].base, o->ring_seg[i].size, r->slots, r->max_attempts, (uint32_t)i)) < 0 ||
            (rc = ring_open(&o->rings[i], o->ring_seg[i].base, o->ring_seg[i].size)) < 0) {
            df_log("rings[%d] \"%s\": re-format: %s", i, r->name, ring_strerror(rc));
            return rc;
        }
        if (o->ring_closed[i]) /* its producers are done for good: keep it closed */
            ring_close_for_shutdown(&o->rings[i]);
    }
    return ledger_reset_in_flight(&o->led, in_flight_returned);
}

void group_teardown(orch *o)
{
    arena_close(&o->allreduce_seg);
}
