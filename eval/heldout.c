/* heldout.c: the held-out set (heldout.h) and its CPU backend: the samples read once from
 * the shards, the target's fp32 features of each kept in host memory, and per drafter the
 * CPU reference forward and chunked loss without a gradient (dflash_loss_and_grad). The
 * CUDA backend is heldout_cuda.c; both take their anchors from heldout_batch. */
#include "eval/heldout.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dflash/dflash_loss.h"
#include "io/shard.h"
#include "target/target_model.h"
#include "util.h"

/* ---- the CPU backend ------------------------------------------------------------------- */

typedef struct heldout_cpu {
    float *H; /* every sample's [S, n_capture * d] fp32 features, at its feat_off */
    target_embeddings emb;
    dflash_acts acts;
} heldout_cpu;

static int cpu_open(heldout_set *h, char *err, size_t errlen)
{
    heldout_cpu *g = calloc(1, sizeof *g);
    if (!g)
        return df_err(err, errlen, -ENOMEM, "out of memory");
    h->impl = g;
    target_model m;
    int rc = target_load(&m, h->o.target_dir, h->o.capture, h->o.n_capture, err, errlen);
    if (rc < 0)
        return rc;
    size_t ncd = (size_t)h->o.n_capture * (size_t)m.cfg.hidden_size;
    h->feature_bytes = sizeof(float) * ncd * (size_t)h->tokens;
    h->feature_where = "host memory";
    if ((rc = target_reserve(&m, h->max_S > 0 ? h->max_S : 1)) < 0 ||
        !(g->H = malloc(h->feature_bytes > 0 ? h->feature_bytes : 1))) {
        target_free(&m);
        return df_err(err, errlen, -ENOMEM, "out of memory for the features of %d held-out samples (%zu bytes)", h->n,
                      h->feature_bytes);
    }
    uint64_t t0 = df_now_ns();
    char at[1200];
    for (int i = 0; i < h->n && rc == 0; i++) {
        heldout_sample *s = &h->s[i];
        if (s->S > 0) {
            int32_t starts[2] = {0, s->S};
            rc = target_forward_cpu(&m, s->x, starts, 1, g->H + s->feat_off);
            if (rc < 0)
                df_err(err, errlen, rc, "%s: target forward: %s", heldout_where(h, i, at, sizeof at),
                       rc == -ERANGE ? "a token id is outside the vocabulary" : strerror(-rc));
        }
        if (rc == 0 && h->o.tick && h->o.tick(h->o.tick_arg, 0))
            rc = df_err(err, errlen, -EINTR, "stopped while computing the features");
    }
    h->features_s = (double)(df_now_ns() - t0) * 1e-9;
    target_free(&m);
    if (rc < 0)
        return rc;
    return target_load_embeddings(&g->emb, h->o.target_dir, 0, err, errlen);
}

static int cpu_score(heldout_set *h, const dflash_config *c, const dflash_params *p, dflash_stats *all, char *err,
                     size_t errlen)
{
    heldout_cpu *g = h->impl;
    dflash_frozen fz = {.embed = g->emb.embed, .lm_head = g->emb.lm_head};
    memset(all, 0, sizeof *all);
    for (int i = 0; i < h->n; i++) {
        heldout_sample *s = &h->s[i];
        if (s->S > 0) {
            dflash_batch b;
            int rc = heldout_batch(h, i, c, g->H + s->feat_off, &b);
            if (rc == 0 && b.sum_w > 0) {
                dflash_stats st;
                rc = dflash_loss_and_grad(c, p, &fz, &b, &g->acts, NULL, 0, 64, &st);
                if (rc == 0)
                    dflash_stats_merge(all, &st);
            }
            dflash_batch_free(&b);
            if (rc < 0)
                return df_err(err, errlen, rc, "validation sample %d: drafter forward: %s", i, strerror(-rc));
        }
        if (h->o.tick && h->o.tick(h->o.tick_arg, 1))
            return df_err(err, errlen, -EINTR, "stopped at sample %d of %d", i + 1, h->n);
    }
    return 0;
}

static void cpu_close(heldout_set *h)
{
    heldout_cpu *g = h->impl;
    if (!g)
        return;
    free(g->H);
    target_embeddings_free(&g->emb);
    dflash_acts_free(&g->acts);
    free(g);
    h->impl = NULL;
}

static const heldout_ops cpu_ops = {.name = "cpu", .open = cpu_open, .score = cpu_score, .close = cpu_close};

/* ---- the set --------------------------------------------------------------------------- */

const char *heldout_where(const heldout_set *h, int i, char *out, size_t cap)
{
    const heldout_sample *s = &h->s[i];
    snprintf(out, cap, "validation sample %d (validation.shards[%d] %s: sample %llu)", i, s->shard,
             h->o.shards[s->shard], (unsigned long long)s->local);
    return out;
}

int heldout_batch(const heldout_set *h, int i, const dflash_config *c, const float *H, dflash_batch *b)
{
    const heldout_sample *s = &h->s[i];
    return dflash_batch_init(b, c, s->S, h->o.num_anchors, H, s->x, s->mask, h->o.seed,
                             HELDOUT_BATCH_BASE + (uint64_t)i);
}

int heldout_exit_code(int rc)
{
    switch (rc) {
    case -EINVAL:
    case -ENOENT:
    case -ENOTDIR:
    case -EACCES:
    case -ERANGE:
    case -ENOTSUP:
    case -ENODEV: return DF_EXIT_PERM;
    default: return DF_EXIT_TEMP;
    }
}

/* The samples: tokens and masks copied out of the shards, cut to max_seq_len. */
static int read_samples(heldout_set *h, char *err, size_t errlen)
{
    const heldout_opts *o = &h->o;
    dataset *ds = NULL;
    char why[1024];
    int rc = dataset_open(&ds, o->shards, o->n_shards, why, sizeof why);
    if (rc < 0) /* a shard that does not read is a bad shard */
        return df_err(err, errlen, rc == -ENOMEM ? rc : -EINVAL, "validation.shards: %s", why);
    uint64_t avail = dataset_n_samples(ds);
    h->n = (int)(avail < o->max_samples ? avail : o->max_samples);
    if (h->n == 0) {
        rc = df_err(err, errlen, -EINVAL, "validation.shards (%s%s): no sample", o->shards[0],
                    o->n_shards > 1 ? ", ..." : "");
    } else if (dataset_vocab_size(ds) > (uint32_t)h->hc.vocab_size) {
        rc = df_err(err, errlen, -EINVAL,
                    "validation.shards: %s: offset 12: vocab_size %u is larger than the target's (%d, %s/config.json)",
                    o->shards[0], dataset_vocab_size(ds), h->hc.vocab_size, o->target_dir);
    } else if (!(h->s = calloc((size_t)h->n, sizeof *h->s))) {
        rc = -ENOMEM;
    }
    size_t off = 0, ncd = (size_t)o->n_capture * (size_t)h->hc.hidden_size;
    for (int i = 0; rc == 0 && i < h->n; i++) {
        const uint32_t *tok;
        const uint8_t *mask;
        uint32_t len;
        heldout_sample *s = &h->s[i];
        if ((rc = dataset_sample(ds, (uint64_t)i, &tok, &mask, &len)) < 0 ||
            (rc = dataset_locate(ds, (uint64_t)i, &s->shard, &s->local)) < 0) {
            rc = df_err(err, errlen, -EINVAL, "validation.shards: sample %d of %s%s: %s", i, o->shards[0],
                        o->n_shards > 1 ? ", ..." : "", strerror(-rc));
            break;
        }
        s->S = (int)(len < o->max_seq_len ? len : o->max_seq_len);
        s->x = malloc(sizeof(int32_t) * (size_t)(s->S > 0 ? s->S : 1));
        s->mask = malloc((size_t)(s->S > 0 ? s->S : 1));
        if (!s->x || !s->mask) {
            rc = -ENOMEM;
            break;
        }
        for (int j = 0; j < s->S; j++)
            s->x[j] = (int32_t)tok[j];
        memcpy(s->mask, mask, (size_t)s->S);
        s->feat_off = off;
        off += (size_t)s->S * ncd;
        h->tokens += s->S;
        if (s->S > h->max_S)
            h->max_S = s->S;
    }
    if (rc == 0 && h->tokens == 0)
        rc = df_err(err, errlen, -EINVAL, "validation.shards (%s%s): the first %d samples have no token", o->shards[0],
                    o->n_shards > 1 ? ", ..." : "", h->n);
    if (rc == -ENOMEM)
        df_err(err, errlen, rc, "out of memory reading %d held-out samples", h->n);
    dataset_close(ds);
    return rc;
}

int heldout_open(heldout_set *h, const heldout_opts *o, char *err, size_t errlen)
{
    memset(h, 0, sizeof *h);
    h->o = *o;
    if (o->n_capture < 1 || o->n_shards < 1 || o->num_anchors < 1 || o->max_samples < 1 || o->max_seq_len < 1)
        return df_err(err, errlen, -EINVAL, "heldout_open: no capture layer, shard, anchor, sample or token");
    h->ops = o->device >= 0 ? &heldout_ops_cuda : &cpu_ops;
    int rc = hfconfig_load(&h->hc, o->target_dir, err, errlen);
    if (rc < 0) {
        rc = rc == -ENOMEM ? rc : -EINVAL;
    } else if ((rc = read_samples(h, err, errlen)) == 0) {
        rc = h->ops->open(h, err, errlen);
    }
    if (rc < 0)
        heldout_close(h);
    return rc;
}

int heldout_score(heldout_set *h, const dflash_config *c, const dflash_params *p, dflash_stats *all, char *err,
                  size_t errlen)
{
    return h->ops->score(h, c, p, all, err, errlen);
}

void heldout_close(heldout_set *h)
{
    if (h->ops && h->ops->close)
        h->ops->close(h);
    for (int i = 0; h->s && i < h->n; i++) {
        free(h->s[i].x);
        free(h->s[i].mask);
    }
    free(h->s);
    hfconfig_free(&h->hc);
    memset(h, 0, sizeof *h);
}
