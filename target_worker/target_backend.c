/* target_backend.c: the cpu backend of target_backend.h (target_forward_cpu in the slot)
 * and the dispatch through the ops table; the cuda one is target_backend_cuda.c. */
#include "target_worker/target_backend_internal.h"

#include "target/target_model.h"
#include "util.h"

typedef struct backend_cpu {
    struct target_backend base;
    target_model m;
} backend_cpu;

static int cpu_forward(target_backend *bb, const arena *A, uint64_t off, batch_header *h, char *err, size_t errlen)
{
    backend_cpu *b = (backend_cpu *)bb;
    int rc = target_forward_cpu(&b->m, batch_tokens(h), h->doc_starts, (int)h->n_docs, (float *)batch_feat(h));
    if (rc < 0)
        snprintf(err, errlen, "batch %llu: target forward: %s", (unsigned long long)h->batch_id,
                 rc == -ERANGE ? "a token id is outside the vocabulary" : strerror(-rc));
    return rc;
}

static batch_header *cpu_meta(target_backend *b, const arena *A, uint64_t off)
{
    return (batch_header *)((char *)A->base + off);
}

static void cpu_close(target_backend *bb)
{
    backend_cpu *b = (backend_cpu *)bb;
    target_free(&b->m);
    free(b);
}

static const backend_ops cpu_ops;

static int cpu_open(target_backend **out, const topo *t, int device, char *err, size_t errlen)
{
    (void)device;
    backend_cpu *b = calloc(1, sizeof *b);
    if (!b)
        return -ENOMEM;
    int rc = target_load(&b->m, t->target_model_dir, t->capture_layers, t->n_capture, err, errlen);
    if (rc == 0 && (rc = target_reserve(&b->m, (int)t->token_budget)) < 0)
        snprintf(err, errlen, "workspace for %llu tokens: out of memory", (unsigned long long)t->token_budget);
    if (rc < 0) {
        target_free(&b->m);
        free(b);
        return rc;
    }
    b->base.hidden = b->m.cfg.hidden_size;
    b->base.n_layers_run = b->m.n_layers;
    b->base.n_layers = b->m.cfg.num_hidden_layers;
    b->base.vocab = b->m.cfg.vocab_size;
    b->base.ops = &cpu_ops;
    *out = &b->base;
    return 0;
}

static const backend_ops cpu_ops = {.name = "cpu",
                                    .feat_dtype = BATCH_FEAT_F32,
                                    .open = cpu_open,
                                    .forward = cpu_forward,
                                    .meta = cpu_meta,
                                    .close = cpu_close};

int backend_open(target_backend **out, const topo *t, int device, char *err, size_t errlen)
{
    *out = NULL;
    const backend_ops *ops = t->backend != TOPOLOGY_CPU ? &backend_ops_cuda : &cpu_ops;
    return ops->open(out, t, device, err, errlen);
}

void backend_close(target_backend *b)
{
    if (b)
        b->ops->close(b);
}

int backend_hidden(const target_backend *b)
{
    return b->hidden;
}
int backend_n_layers_run(const target_backend *b)
{
    return b->n_layers_run;
}
int backend_n_layers(const target_backend *b)
{
    return b->n_layers;
}
int backend_vocab(const target_backend *b)
{
    return b->vocab;
}
uint32_t backend_feat_dtype(const target_backend *b)
{
    return b->ops->feat_dtype;
}

batch_header *backend_meta_buffer(target_backend *b, const arena *A, uint64_t off)
{
    return b->ops->meta(b, A, off);
}

int backend_forward(target_backend *b, const arena *A, uint64_t off, batch_header *h, char *err, size_t errlen)
{
    return b->ops->forward(b, A, off, h, err, errlen);
}
