/* pp_copy.c: the cpu backend of pp_copy.h (host arenas: memcpy + noise) and the dispatch
 * through the copier's ops table (pp_copy_internal.h) to the cuda one. */
#include "postproc_worker/pp_copy_internal.h"

#include "dflash/dflash_batch.h"
#include "io/batch.h"
#include "util.h"

static int unsupported(const arena *dst, const arena *src, uint32_t dtype, uint64_t batch_id, char *err, size_t errlen)
{
    return df_err(err, errlen, -EINVAL, "batch %llu: %s features between %s and %s arenas are not supported",
                  (unsigned long long)batch_id, dtype == BATCH_FEAT_BF16 ? "bf16" : "fp32",
                  src->kind == ARENA_CUDA ? "cuda" : "cpu", dst->kind == ARENA_CUDA ? "cuda" : "cpu");
}

/* ---- the cpu backend: nothing to open, and no device copies ---- */

static int cpu_open(pp_copier **out, int device, char *err, size_t errlen);

static void cpu_close(pp_copier *c)
{
    (void)c; /* the static cpu_copier */
}

static int cpu_copy(pp_copier *c, const arena *dst, uint64_t dst_off, const arena *src, uint64_t src_off, size_t n,
                    double std, uint64_t seed, uint64_t batch_id, char *err, size_t errlen)
{
    (void)c, (void)dst_off, (void)src_off, (void)n, (void)std, (void)seed;
    return unsupported(dst, src, BATCH_FEAT_BF16, batch_id, err, errlen);
}

static const pp_ops cpu_ops = {.name = "cpu", .open = cpu_open, .close = cpu_close, .copy = cpu_copy};
static pp_copier cpu_copier = {.ops = &cpu_ops};

static int cpu_open(pp_copier **out, int device, char *err, size_t errlen)
{
    (void)device, (void)err, (void)errlen;
    *out = &cpu_copier;
    return 0;
}

/* ---- the API ---- */

int pp_copier_open(pp_copier **out, int dst_device, char *err, size_t errlen)
{
    *out = NULL;
    const pp_ops *ops = dst_device < 0 ? &cpu_ops : &pp_ops_cuda;
    return ops->open(out, dst_device, err, errlen);
}

void pp_copier_close(pp_copier *c)
{
    if (c)
        c->ops->close(c);
}

int pp_copy_features(pp_copier *c, const arena *dst, uint64_t dst_off, const arena *src, uint64_t src_off, size_t n,
                     uint32_t dtype, double std, uint64_t seed, uint64_t batch_id, char *err, size_t errlen)
{
    if (dst->kind == ARENA_CPU && src->kind == ARENA_CPU) {
        if (dtype != BATCH_FEAT_F32)
            return df_err(err, errlen, -EINVAL, "batch %llu: bf16 features in host arenas: the cpu path takes fp32",
                          (unsigned long long)batch_id);
        size_t bytes = n * sizeof(float);
        if (src_off > src->size || bytes > src->size - src_off || dst_off > dst->size || bytes > dst->size - dst_off)
            return df_err(err, errlen, -EINVAL, "batch %llu: %zu feature bytes do not fit the slots",
                          (unsigned long long)batch_id, bytes);
        float *d = (float *)((char *)dst->base + dst_off);
        memcpy(d, (const char *)src->base + src_off, bytes);
        if (std > 0)
            dflash_add_noise(d, n, std, seed, batch_id);
        return 0;
    }
    if (!c || dtype != BATCH_FEAT_BF16)
        return unsupported(dst, src, dtype, batch_id, err, errlen);
    return c->ops->copy(c, dst, dst_off, src, src_off, n, std, seed, batch_id, err, errlen);
}
