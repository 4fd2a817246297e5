/* trainer_nocuda.c: trainer_ops_cuda in a build without CUDA=1: every entry refuses with
 * -ENOTSUP and says so (docs/backends.md). */
#include "drafter_worker/trainer.h"

#include <errno.h>
#include <stdio.h>

#include "util.h"

static int open_nocuda(trainer *tr, const topo *t, long total_steps, int resumed, char *err, size_t errlen)
{
    (void)tr, (void)total_steps, (void)resumed;
    return df_err(err, errlen, -ENOTSUP, "%s: backend \"cuda\": this build has no CUDA (rebuild with make CUDA=1)",
                  t->source_path);
}

static int step_nocuda(trainer *tr, const batch_header *h, const void *slot, allreduce_comm *ar, void (*hb)(void *),
                       void *hb_arg, dflash_stats *st, adamw_info *info, char *err, size_t errlen)
{
    (void)tr, (void)h, (void)slot, (void)ar, (void)hb, (void)hb_arg, (void)st, (void)info;
    return df_err(err, errlen, -ENOTSUP, "trainer: this build has no CUDA (rebuild with make CUDA=1)");
}

static int step_empty_nocuda(trainer *tr, allreduce_comm *ar, adamw_info *info, char *err, size_t errlen)
{
    (void)tr, (void)ar, (void)info;
    return df_err(err, errlen, -ENOTSUP, "trainer: this build has no CUDA (rebuild with make CUDA=1)");
}

static int to_host_nocuda(trainer *tr, int with_opt, char *err, size_t errlen)
{
    (void)tr, (void)with_opt;
    return df_err(err, errlen, -ENOTSUP, "trainer: this build has no CUDA (rebuild with make CUDA=1)");
}

static void close_nocuda(trainer *tr)
{
    (void)tr;
}

const trainer_ops trainer_ops_cuda = {
    .name = "cuda",
    .bucketed = 0,
    .open = open_nocuda,
    .step = step_nocuda,
    .step_empty = step_empty_nocuda,
    .to_host = to_host_nocuda,
    .close = close_nocuda,
};
