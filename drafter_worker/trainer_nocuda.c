/* trainer_nocuda.c: the trainer's CUDA seam in a build without CUDA=1: a clear refusal. */
#include "drafter_worker/trainer.h"

#include <stdio.h>

int trainer_cuda_open(trainer *tr, const topo *t, long total_steps, int resumed, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s: backend \"cuda\": this build has no CUDA (rebuild with make CUDA=1)", t->source_path);
    return -ENOTSUP;
}

int trainer_cuda_step(trainer *tr, const batch_header *h, const void *slot, allreduce_comm *ar, dflash_stats *st,
                      adamw_info *info, char *err, size_t errlen)
{
    snprintf(err, errlen, "no CUDA in this build");
    return -ENOTSUP;
}

int trainer_cuda_to_host(trainer *tr, int with_opt, char *err, size_t errlen)
{
    snprintf(err, errlen, "no CUDA in this build");
    return -ENOTSUP;
}

int trainer_cuda_step_empty(trainer *tr, allreduce_comm *ar, adamw_info *info, char *err, size_t errlen)
{
    snprintf(err, errlen, "no CUDA in this build");
    return -ENOTSUP;
}

void trainer_cuda_close(trainer *tr) {}
