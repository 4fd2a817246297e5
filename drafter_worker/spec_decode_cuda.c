/* spec_decode_cuda.c: the CUDA side of spec_decode_backend (CUDA=1 builds).
 *
 * Not written yet: speculative decoding on the GPU needs a KV-cached decode of the target
 * (target_model_cuda has a packed-row forward without cache, final norm or lm_head) and
 * a drafter inference path (dflash_cuda has the training step only). Until then the
 * CUDA build says so instead of running something slower than it claims to be. */
#include "drafter_worker/spec_decode_backend.h"

#include <errno.h>
#include <stdio.h>

int sd_backend_open_cuda(sd_backend *b, const char *target_dir, const dflash_config *c, const dflash_params *p,
                         int max_ctx, char *err, size_t errlen)
{
    (void)b, (void)target_dir, (void)c, (void)p, (void)max_ctx;
    snprintf(err, errlen, "the cuda backend of dflash_eval is not implemented yet: use --backend cpu");
    return -ENOTSUP;
}
