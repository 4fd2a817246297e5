/* test_configs.c: every shipped topology (each .json file in configs/) loads, and the GPU ones are
 * placed the way the workers need: each worker's output ring and each drafter's input ring
 * on the worker's own GPU (a stage writes only its own device memory; the postproc stage
 * pulls from the target's GPU), drafter ranks 0..R-1 on distinct GPUs (NCCL needs one rank
 * per device), every postproc's ring readable from a target. */
#include <glob.h>
#include <stdio.h>
#include <string.h>

#include "io/topology.h"
#include "test_helpers.h"

static void check_placement(const topo *t, const char *path)
{
    int seen_gpu[64] = {0};
    for (int i = 0; i < t->n_workers; i++) {
        const topology_worker *w = &t->workers[i];
        if (w->out_ring >= 0 && t->rings[w->out_ring].gpu != w->gpu) {
            fprintf(stderr, "%s: worker %s on gpu %d writes ring %s on gpu %d\n", path, w->name, w->gpu,
                    t->rings[w->out_ring].name, t->rings[w->out_ring].gpu);
            T_ASSERT(0);
        }
        if (w->role == TOPOLOGY_ROLE_DRAFTER) {
            T_ASSERT(w->in_ring >= 0 && t->rings[w->in_ring].gpu == w->gpu);
            if (t->backend != TOPOLOGY_CPU && topology_n_drafters(t) > 1) {
                T_ASSERT(w->gpu >= 0 && w->gpu < 64);
                T_ASSERT(!seen_gpu[w->gpu]); /* one NCCL rank per device */
                seen_gpu[w->gpu] = 1;
            }
        }
    }
}

int main(void)
{
    glob_t g;
    T_ASSERT(glob("configs/*.json", 0, NULL, &g) == 0);
    T_ASSERT(g.gl_pathc >= 3);
    int gpu_multi = 0;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        topo t;
        char err[1024];
        int rc = topology_load(&t, g.gl_pathv[i], err, sizeof err);
        if (rc)
            fprintf(stderr, "%s\n", err);
        T_ASSERT(rc == 0);
        check_placement(&t, g.gl_pathv[i]);
        if (t.backend != TOPOLOGY_CPU && topology_n_drafters(&t) > 1)
            gpu_multi++;
        printf("ok: %s: %d workers, %d rings, %d drafter ranks, backend %s\n", g.gl_pathv[i], t.n_workers, t.n_rings,
               topology_n_drafters(&t), t.backend == TOPOLOGY_CPU ? "cpu" : "cuda");
        topology_free(&t);
    }
    T_ASSERT(gpu_multi >= 4); /* the 4/8-GPU topologies of both shapes */
    globfree(&g);
    printf("test_configs: %zu topologies ok\n", g.gl_pathc);
    return 0;
}
