/* generate.c: the generation loop and the CPU backend of generate.h. */
#include "eval/generate.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/hfconfig.h"
#include "target/target_decode.h"
#include "util.h"

/* ---- CPU backend over target_decode ---- */

typedef struct gen_cpu {
    decode_model m;
    int32_t *greedy; /* [n_seq] scratch of a step */
} gen_cpu;

static int cpu_extend(void *impl, int s, const int32_t *tokens, int k, int want_logits, int32_t *greedy,
                      const float **logits, char *err, size_t errlen)
{
    decode_model *m = &((gen_cpu *)impl)->m;
    int rc = decode_extend_seq(m, s, tokens, k, 1);
    if (rc < 0)
        return df_err(err, errlen, rc, "target extend of sequence %d by %d tokens at %d: %s", s, k,
                      decode_seq_len(m, s), strerror(-rc));
    *greedy = decode_argmax(m->logits, m->tm.cfg.vocab_size);
    if (want_logits)
        *logits = m->logits;
    return 0;
}

static int cpu_step(void *impl, const int32_t *tokens, const int *on, int want_logits, int32_t *greedy,
                    const float **logits, char *err, size_t errlen)
{
    decode_model *m = &((gen_cpu *)impl)->m;
    int rc = decode_extend_batch(m, tokens, on), V = m->tm.cfg.vocab_size, R = 0;
    if (rc < 0)
        return df_err(err, errlen, rc, "target step of %d sequences: %s", m->n_seq, strerror(-rc));
    for (int s = 0; s < m->n_seq; s++)
        R += on[s];
    for (int i = 0; i < R; i++)
        greedy[i] = decode_argmax(m->logits + (size_t)i * V, V);
    if (want_logits)
        *logits = m->logits;
    return 0;
}

static void cpu_reset(void *impl, int s)
{
    decode_reset_seq(&((gen_cpu *)impl)->m, s);
}

static void cpu_close(void *impl)
{
    decode_free(&((gen_cpu *)impl)->m);
    free(impl);
}

static int cpu_open(generate_target *t, int device, const char *dir, int max_ctx, int n_seq, char *err, size_t errlen);
static const generate_ops cpu_ops = {
    .name = "cpu", .open = cpu_open, .extend = cpu_extend, .step = cpu_step, .reset = cpu_reset, .close = cpu_close};

static int cpu_open(generate_target *t, int device, const char *dir, int max_ctx, int n_seq, char *err, size_t errlen)
{
    (void)device;
    gen_cpu *g = calloc(1, sizeof *g);
    if (!g)
        return df_err(err, errlen, -ENOMEM, "out of memory");
    /* features are not needed: capture only the last layer, which decode_load runs anyway */
    hfconfig c;
    int rc = hfconfig_load(&c, dir, err, errlen);
    if (rc < 0) {
        free(g);
        return rc;
    }
    int last = c.num_hidden_layers - 1;
    hfconfig_free(&c);
    if ((rc = decode_load_batch(&g->m, dir, &last, 1, max_ctx, n_seq, err, errlen)) < 0) {
        free(g);
        return rc;
    }
    t->ops = &cpu_ops;
    t->impl = g;
    t->vocab = g->m.tm.cfg.vocab_size;
    t->max_ctx = max_ctx;
    t->n_seq = n_seq;
    return 0;
}

int generate_open(generate_target *t, const char *backend, const char *model_dir, int max_ctx, int n_seq, char *err,
                  size_t errlen)
{
    memset(t, 0, sizeof *t);
    if (n_seq < 1 || n_seq > GENERATE_MAX_BATCH)
        return df_err(err, errlen, -EINVAL, "--batch %d: expected 1..%d", n_seq, GENERATE_MAX_BATCH);
    if (strcmp(backend, "cpu") == 0)
        return cpu_ops.open(t, 0, model_dir, max_ctx, n_seq, err, errlen);
    if (strcmp(backend, "cuda") == 0)
        return generate_ops_cuda.open(t, 0, model_dir, max_ctx, n_seq, err, errlen);
    if (strncmp(backend, "cuda:", 5) == 0) {
        char *end;
        long dev = strtol(backend + 5, &end, 10);
        if (end != backend + 5 && !*end && dev >= 0 && dev < 1024)
            return generate_ops_cuda.open(t, (int)dev, model_dir, max_ctx, n_seq, err, errlen);
    }
    return df_err(err, errlen, -EINVAL, "--backend %s: expected cpu, cuda or cuda:N", backend);
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
    if (n_prompt < 1 || o->max_new < 1)
        return df_err(err, errlen, -EINVAL, "empty prompt or max_new < 1");
    if ((long)n_prompt + o->max_new > t->max_ctx)
        return df_err(err, errlen, -ENOSPC, "prompt of %d tokens + %d new does not fit the cache of %d", n_prompt,
                      o->max_new, t->max_ctx);
    int sampled = o->sample.temperature > 0.0;
    t->ops->reset(t->impl, 0);
    const int32_t *feed = prompt;
    int k = n_prompt;
    while (*n_out < o->max_new) {
        int32_t greedy;
        const float *logits = NULL;
        int rc = t->ops->extend(t->impl, 0, feed, k, sampled, &greedy, &logits, err, errlen);
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

/* item it takes token tok: appended; ended on an eos or at max_new */
static int take(generate_item *it, const generate_opts *o, int32_t tok)
{
    it->out[it->n_out++] = tok;
    if (is_eos(o, tok))
        it->stopped = 1;
    return it->stopped || it->n_out >= o->max_new;
}

/* The queue of generate_batch: admit the next items into free sequence s until one is
 * still running after its first token (or none is left). 0 or -errno with err set. */
typedef struct gen_queue {
    generate_target *t;
    generate_item *items;
    int n, next, sampled;
    const generate_opts *o;
    sample_work *w;
    int *on, *item_of;
} gen_queue;

static int queue_admit(gen_queue *q, int s, char *err, size_t errlen)
{
    q->on[s] = 0;
    while (q->next < q->n) {
        int i = q->next++, rc;
        generate_item *it = &q->items[i];
        int32_t greedy;
        const float *logits = NULL;
        q->t->ops->reset(q->t->impl, s);
        if ((rc = q->t->ops->extend(q->t->impl, s, it->prompt, it->n_prompt, q->sampled, &greedy, &logits, err,
                                    errlen)) < 0)
            return rc;
        int32_t tok = q->sampled ? sample_token(logits, &q->o->sample, it->rng, q->w) : greedy;
        if (!take(it, q->o, tok)) {
            q->on[s] = 1, q->item_of[s] = i;
            return 0;
        }
    }
    return 0;
}

int generate_batch(generate_target *t, generate_item *items, int n, const generate_opts *o, sample_work *w, char *err,
                   size_t errlen)
{
    if (n < 1 || o->max_new < 1)
        return df_err(err, errlen, -EINVAL, "generate_batch: %d prompts (max_new %d)", n, o->max_new);
    const int S = n < t->n_seq ? n : t->n_seq; /* sequences in use */
    int on[GENERATE_MAX_BATCH] = {0}, item_of[GENERATE_MAX_BATCH] = {0}, rc;
    int32_t feed[GENERATE_MAX_BATCH], greedy[GENERATE_MAX_BATCH];
    const float *logits = NULL;
    for (int i = 0; i < n; i++) {
        generate_item *it = &items[i];
        it->n_out = it->stopped = 0;
        if (it->n_prompt < 1)
            return df_err(err, errlen, -EINVAL, "prompt %d of the batch is empty", i);
        if ((long)it->n_prompt + o->max_new > t->max_ctx)
            return df_err(err, errlen, -ENOSPC,
                          "prompt %d of the batch: %d tokens + %d new does not fit the cache of %d", i, it->n_prompt,
                          o->max_new, t->max_ctx);
    }
    for (int s = S; s < t->n_seq; s++)
        t->ops->reset(t->impl, s); /* unused sequences sit out with nothing cached */
    gen_queue q = {t, items, n, 0, o->sample.temperature > 0.0, o, w, on, item_of};
    for (int s = 0; s < S; s++) /* the first items, one per sequence, each prefilled alone */
        if ((rc = queue_admit(&q, s, err, errlen)) < 0)
            return rc;
    for (;;) {
        int R = 0;
        for (int s = 0; s < S; s++)
            if (on[s]) {
                generate_item *it = &items[item_of[s]];
                feed[R++] = it->out[it->n_out - 1];
            }
        if (!R)
            break;
        if ((rc = t->ops->step(t->impl, feed, on, q.sampled, greedy, &logits, err, errlen)) < 0)
            return rc;
        int freed = 0;
        for (int s = 0, i = 0; s < S; s++) {
            if (!on[s])
                continue;
            generate_item *it = &items[item_of[s]];
            int32_t tok = q.sampled ? sample_token(logits + (size_t)i * t->vocab, &o->sample, it->rng, w) : greedy[i];
            if (take(it, o, tok))
                on[s] = -1, freed++; /* ended: its sequence takes the next item below */
            i++;
        }
        /* after every row of the step has used its logits (a prefill replaces them) */
        for (int s = 0; freed && s < S; s++)
            if (on[s] < 0 && (rc = queue_admit(&q, s, err, errlen)) < 0)
                return rc;
    }
    return 0;
}
