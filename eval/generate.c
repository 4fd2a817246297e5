/* generate.c: the generation loop and the CPU backend of generate.h. */
#include "eval/generate.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/hfconfig.h"
#include "target/target_decode.h"

/* ---- CPU backend over target_decode ---- */

static int cpu_extend(void *impl, const int32_t *tokens, int k, int want_logits, int32_t *greedy, const float **logits,
                      char *err, size_t errlen)
{
    decode_model *m = impl;
    int rc = decode_extend(m, tokens, k, 1);
    if (rc < 0) {
        snprintf(err, errlen, "target extend by %d tokens at %d: %s", k, m->len, strerror(-rc));
        return rc;
    }
    *greedy = decode_argmax(m->logits, m->tm.cfg.vocab_size);
    if (want_logits)
        *logits = m->logits;
    return 0;
}

static void cpu_reset(void *impl)
{
    decode_reset(impl);
}

static void cpu_close(void *impl)
{
    decode_free(impl);
    free(impl);
}

static int cpu_open(generate_target *t, int device, const char *dir, int max_ctx, char *err, size_t errlen);
static const generate_ops cpu_ops = {
    .name = "cpu", .open = cpu_open, .extend = cpu_extend, .reset = cpu_reset, .close = cpu_close};

static int cpu_open(generate_target *t, int device, const char *dir, int max_ctx, char *err, size_t errlen)
{
    (void)device;
    decode_model *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    /* features are not needed: capture only the last layer, which decode_load runs anyway */
    hfconfig c;
    int rc = hfconfig_load(&c, dir, err, errlen);
    if (rc < 0) {
        free(m);
        return rc;
    }
    int last = c.num_hidden_layers - 1;
    hfconfig_free(&c);
    if ((rc = decode_load(m, dir, &last, 1, max_ctx, err, errlen)) < 0) {
        free(m);
        return rc;
    }
    t->ops = &cpu_ops;
    t->impl = m;
    t->vocab = m->tm.cfg.vocab_size;
    t->max_ctx = max_ctx;
    return 0;
}

int generate_open(generate_target *t, const char *backend, const char *model_dir, int max_ctx, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    if (strcmp(backend, "cpu") == 0)
        return cpu_ops.open(t, 0, model_dir, max_ctx, err, errlen);
    if (strcmp(backend, "cuda") == 0)
        return generate_ops_cuda.open(t, 0, model_dir, max_ctx, err, errlen);
    if (strncmp(backend, "cuda:", 5) == 0) {
        char *end;
        long dev = strtol(backend + 5, &end, 10);
        if (end != backend + 5 && !*end && dev >= 0 && dev < 1024)
            return generate_ops_cuda.open(t, (int)dev, model_dir, max_ctx, err, errlen);
    }
    snprintf(err, errlen, "--backend %s: expected cpu, cuda or cuda:N", backend);
    return -EINVAL;
}

void generate_close(generate_target *t)
{
    if (t->ops)
        t->ops->close(t->impl);
    memset(t, 0, sizeof *t);
}

void generate_rng(df_rng *r, uint64_t seed, uint64_t idx)
{
    df_rng_seed(r, df_hash64(seed ^ df_hash64(idx + 0x9e3779b97f4a7c15ull)));
}

static int is_eos(const generate_opts *o, int32_t tok)
{
    for (int i = 0; i < o->n_eos; i++)
        if (o->eos[i] == tok)
            return 1;
    return 0;
}

int generate_one(generate_target *t, const int32_t *prompt, int n_prompt, const generate_opts *o, df_rng *rng,
                 sample_work *w, int32_t *out, int *n_out, int *stopped, char *err, size_t errlen)
{
    *n_out = 0;
    *stopped = 0;
    if (n_prompt < 1 || o->max_new < 1) {
        snprintf(err, errlen, "empty prompt or max_new < 1");
        return -EINVAL;
    }
    if ((long)n_prompt + o->max_new > t->max_ctx) {
        snprintf(err, errlen, "prompt of %d tokens + %d new does not fit the cache of %d", n_prompt, o->max_new,
                 t->max_ctx);
        return -ENOSPC;
    }
    int sampled = o->sample.temperature > 0.0;
    t->ops->reset(t->impl);
    const int32_t *feed = prompt;
    int k = n_prompt;
    while (*n_out < o->max_new) {
        int32_t greedy;
        const float *logits = NULL;
        int rc = t->ops->extend(t->impl, feed, k, sampled, &greedy, &logits, err, errlen);
        if (rc < 0)
            return rc;
        int32_t tok = sampled ? sample_token(logits, &o->sample, rng, w) : greedy;
        out[(*n_out)++] = tok;
        if (is_eos(o, tok)) {
            *stopped = 1;
            break;
        }
        feed = &out[*n_out - 1];
        k = 1;
    }
    return 0;
}
