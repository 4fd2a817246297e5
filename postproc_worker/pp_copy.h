/* pp_copy.h: the postproc stage's feature copy from the target's slot to the drafter's
 * slot, with the optional Gaussian feature noise (prefix pp_).
 *
 *   cpu arenas   memcpy + dflash_add_noise (fp32), seeded by (seed, batch id)
 *   cuda arenas  one device copy (same GPU), or a peer copy when the slots are on two GPUs
 *                (the drafter's GPU pulls from the target's; the target never waits on it),
 *                then the noise added in place by a kernel seeded by (seed, batch id, element)
 *                (bf16 in, fp32 math, bf16 out). pp_copy_cuda.cu; a CPU-only build refuses.
 * The copier's backend is a pp_ops table chosen by pp_copier_open (pp_copy_internal.h,
 * docs/backends.md).
 *
 * The noise is a pure function of (seed, batch id, element index) on each backend, so a
 * retried batch gets the same noise; the CPU and CUDA streams differ (not bit-compared).
 * 0 or -errno with a message in err. */
#ifndef DF_PP_COPY_H
#define DF_PP_COPY_H

#include "ipc/arena.h"

#include <stddef.h>
#include <stdint.h>

typedef struct pp_copier pp_copier;

/* dst_device: the GPU the copies and kernels run on (-1 for cpu arenas). */
int pp_copier_open(pp_copier **out, int dst_device, char *err, size_t errlen);
void pp_copier_close(pp_copier *c); /* NULL is fine */
/* Copy n feature elements of dtype (BATCH_FEAT_*) from src arena at src_off to dst arena at
 * dst_off and add N(0, std^2) noise when std > 0. Returns when the copy is complete. */
int pp_copy_features(pp_copier *c, const arena *dst, uint64_t dst_off, const arena *src, uint64_t src_off, size_t n,
                     uint32_t dtype, double std, uint64_t seed, uint64_t batch_id, char *err, size_t errlen);

#endif
