/* spec_decode_backend.c: the CPU backend pair and the choice between CPU and CUDA, see
 * spec_decode_backend.h. */
#include "eval/spec_decode_backend.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval/dflash_infer.h"
#include "target/target_decode.h"

typedef struct cpu_impl {
    decode_model target;
    infer_state drafter;
} cpu_impl;

static void cpu_close(void *impl)
{
    cpu_impl *ci = impl;
    infer_free(&ci->drafter);
    decode_free(&ci->target);
    free(ci);
}

static int cpu_open(spec_backend *b, const char *target_dir, const dflash_config *c, const dflash_params *p,
                    int max_ctx, int device, char *err, size_t errlen);
static const spec_backend_ops cpu_ops = {.name = "cpu", .open = cpu_open, .close = cpu_close};

int spec_backend_open(spec_backend *b, const char *kind, const char *target_dir, const dflash_config *c,
                      const dflash_params *p, int max_ctx, char *err, size_t errlen)
{
    memset(b, 0, sizeof *b);
    if (!strncmp(kind, "cuda", 4) && (kind[4] == 0 || kind[4] == ':')) {
        char *end = NULL;
        long dev = kind[4] ? strtol(kind + 5, &end, 10) : 0;
        if (kind[4] && (end == kind + 5 || *end || dev < 0 || dev > 1024)) {
            snprintf(err, errlen, "backend '%s': the device after 'cuda:' is not a number", kind);
            return -EINVAL;
        }
        b->ops = &spec_backend_ops_cuda;
        return b->ops->open(b, target_dir, c, p, max_ctx, (int)dev, err, errlen);
    }
    if (strcmp(kind, "cpu")) {
        snprintf(err, errlen, "unknown backend '%s' (cpu, cuda or cuda:N)", kind);
        return -EINVAL;
    }
    b->ops = &cpu_ops;
    return b->ops->open(b, target_dir, c, p, max_ctx, 0, err, errlen);
}

static int cpu_open(spec_backend *b, const char *target_dir, const dflash_config *c, const dflash_params *p,
                    int max_ctx, int device, char *err, size_t errlen)
{
    (void)device;
    cpu_impl *ci = calloc(1, sizeof *ci);
    if (!ci) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    int rc = decode_load(&ci->target, target_dir, c->target_layer_ids, c->n_capture, max_ctx, err, errlen);
    if (rc < 0) {
        free(ci);
        return rc;
    }
    /* the drafter borrows the target's embedding (mask row included) and lm_head */
    dflash_frozen f = {.embed = ci->target.head.embed, .lm_head = ci->target.head.lm_head};
    if ((rc = infer_init(&ci->drafter, c, p, &f, max_ctx)) < 0) {
        snprintf(err, errlen, "out of memory for the drafter's cache of %d tokens", max_ctx);
        cpu_close(ci);
        return rc;
    }
    spec_target_cpu(&b->target, &ci->target);
    spec_drafter_cpu(&b->drafter, &ci->drafter);
    b->impl = ci;
    return 0;
}

void spec_backend_close(spec_backend *b)
{
    if (b && b->impl && b->ops)
        b->ops->close(b->impl);
    if (b)
        memset(b, 0, sizeof *b);
}
