/* pp_copy.c: the CPU side of pp_copy.h and the dispatch to the CUDA side. */
#include "postproc_worker/pp_copy.h"

#include "dflash/dflash_batch.h"
#include "io/batch.h"
#include "util.h"

int pp_copier_open(pp_copier **out, int dst_device, char *err, size_t errlen)
{
    *out = NULL;
    if (dst_device < 0)
        return 0; /* cpu: nothing to set up (a NULL copier means cpu) */
    return pp_cuda_open(out, dst_device, err, errlen);
}

void pp_copier_close(pp_copier *c)
{
    if (c)
        pp_cuda_close(c);
}

int pp_copy_features(pp_copier *c, const arena *dst, uint64_t dst_off, const arena *src, uint64_t src_off, size_t n,
                     uint32_t dtype, double std, uint64_t seed, uint64_t batch_id, char *err, size_t errlen)
{
    if (dst->kind == ARENA_CPU && src->kind == ARENA_CPU) {
        if (dtype != BATCH_FEAT_F32) {
            snprintf(err, errlen, "batch %llu: bf16 features in host arenas: the cpu path takes fp32",
                     (unsigned long long)batch_id);
            return -EINVAL;
        }
        size_t bytes = n * sizeof(float);
        if (src_off > src->size || bytes > src->size - src_off || dst_off > dst->size || bytes > dst->size - dst_off) {
            snprintf(err, errlen, "batch %llu: %zu feature bytes do not fit the slots", (unsigned long long)batch_id,
                     bytes);
            return -EINVAL;
        }
        float *d = (float *)((char *)dst->base + dst_off);
        memcpy(d, (const char *)src->base + src_off, bytes);
        if (std > 0)
            dflash_add_noise(d, n, std, seed, batch_id);
        return 0;
    }
    if (!c || dtype != BATCH_FEAT_BF16) {
        snprintf(err, errlen, "batch %llu: %s features between %s and %s arenas are not supported",
                 (unsigned long long)batch_id, dtype == BATCH_FEAT_BF16 ? "bf16" : "fp32",
                 src->kind == ARENA_CUDA ? "cuda" : "cpu", dst->kind == ARENA_CUDA ? "cuda" : "cpu");
        return -EINVAL;
    }
    return pp_cuda_copy(c, dst, dst_off, src, src_off, n, std, seed, batch_id, err, errlen);
}
