/* spec_decode_backend.c: the CPU backend pair and the choice between CPU and CUDA, see
 * spec_decode_backend.h. */
#include "eval/spec_decode_backend.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval/dflash_infer.h"
#include "target/target_decode.h"
#include "util.h"

typedef struct cpu_impl {
    decode_model target;
    int n_seq;
    infer_state *drafter;   /* [n_seq] */
    spec_drafter *drafters; /* [n_seq] */
} cpu_impl;

static void cpu_close(void *impl)
{
    cpu_impl *ci = impl;
    for (int i = 0; ci->drafter && i < ci->n_seq; i++)
        infer_free(&ci->drafter[i]);
    free(ci->drafter), free(ci->drafters);
    decode_free(&ci->target);
    free(ci);
}

static int cpu_open(spec_backend *b, const char *target_dir, const dflash_config *c, const dflash_params *p,
                    int max_ctx, int n_seq, int device, char *err, size_t errlen);

/* spec_drafter.draft_batch on the CPU: the sequences' drafts one after the other (every row
 * is computed on its own there, so one call saves nothing; it keeps spec_generate_batch on
 * the same path as the CUDA backend's). */
static int cpu_draft_batch(void *bctx, int n, const int *seqs, const int32_t *anchors, int32_t *drafts)
{
    cpu_impl *ci = bctx;
    for (int j = 0; j < n; j++) {
        if (seqs[j] < 0 || seqs[j] >= ci->n_seq)
            return -EINVAL;
        infer_state *s = &ci->drafter[seqs[j]];
        int rc = infer_draft(s, anchors[j], drafts + (size_t)j * (size_t)(s->c->block_size - 1));
        if (rc < 0)
            return rc;
    }
    return 0;
}

static const spec_backend_ops cpu_ops = {.name = "cpu", .open = cpu_open, .close = cpu_close};

int spec_backend_open(spec_backend *b, const char *kind, const char *target_dir, const dflash_config *c,
                      const dflash_params *p, int max_ctx, char *err, size_t errlen)
{
    return spec_backend_open_batch(b, kind, target_dir, c, p, max_ctx, 1, err, errlen);
}

int spec_backend_open_batch(spec_backend *b, const char *kind, const char *target_dir, const dflash_config *c,
                            const dflash_params *p, int max_ctx, int n_seq, char *err, size_t errlen)
{
    memset(b, 0, sizeof *b);
    if (n_seq < 1 || n_seq > SPEC_MAX_BATCH)
        return df_err(err, errlen, -EINVAL, "batch of %d sequences: must be 1..%d", n_seq, SPEC_MAX_BATCH);
    if (!strncmp(kind, "cuda", 4) && (kind[4] == 0 || kind[4] == ':')) {
        char *end = NULL;
        long dev = kind[4] ? strtol(kind + 5, &end, 10) : 0;
        if (kind[4] && (end == kind + 5 || *end || dev < 0 || dev > 1024))
            return df_err(err, errlen, -EINVAL, "backend '%s': the device after 'cuda:' is not a number", kind);
        b->ops = &spec_backend_ops_cuda;
        return b->ops->open(b, target_dir, c, p, max_ctx, n_seq, (int)dev, err, errlen);
    }
    if (strcmp(kind, "cpu"))
        return df_err(err, errlen, -EINVAL, "unknown backend '%s' (cpu, cuda or cuda:N)", kind);
    b->ops = &cpu_ops;
    return b->ops->open(b, target_dir, c, p, max_ctx, n_seq, 0, err, errlen);
}

static int cpu_open(spec_backend *b, const char *target_dir, const dflash_config *c, const dflash_params *p,
                    int max_ctx, int n_seq, int device, char *err, size_t errlen)
{
    (void)device;
    cpu_impl *ci = calloc(1, sizeof *ci);
    if (!ci)
        return df_err(err, errlen, -ENOMEM, "out of memory");
    int rc = decode_load_batch(&ci->target, target_dir, c->target_layer_ids, c->n_capture, max_ctx, n_seq, err, errlen);
    if (rc < 0) {
        free(ci);
        return rc;
    }
    ci->drafter = calloc((size_t)n_seq, sizeof *ci->drafter);
    ci->drafters = calloc((size_t)n_seq, sizeof *ci->drafters);
    ci->n_seq = n_seq;
    if (!ci->drafter || !ci->drafters) {
        cpu_close(ci);
        return df_err(err, errlen, -ENOMEM, "out of memory");
    }
    /* the drafters borrow the target's embedding (mask row included), lm_head and the
     * parameters; each sequence has its own context cache */
    dflash_frozen f = {.embed = ci->target.head.embed, .lm_head = ci->target.head.lm_head};
    for (int i = 0; i < n_seq; i++) {
        if ((rc = infer_init(&ci->drafter[i], c, p, &f, max_ctx)) < 0) {
            cpu_close(ci);
            return df_err(err, errlen, rc, "out of memory for the drafter's cache of %d tokens", max_ctx);
        }
        spec_drafter_cpu(&ci->drafters[i], &ci->drafter[i]);
        if (n_seq > 1)
            ci->drafters[i].batch_ctx = ci, ci->drafters[i].draft_batch = cpu_draft_batch;
    }
    spec_target_cpu(&b->target, &ci->target);
    b->drafter = ci->drafters[0];
    b->drafters = ci->drafters;
    b->n_seq = n_seq;
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
