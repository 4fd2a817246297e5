/* plan_source.c: where the ledger plan's per-sample token lengths come from.
 *
 * The one place the orchestrator touches training data: it opens data.shards with the
 * shard reader (common/io/shard.h, dataset_open) only to read every sample's length, which
 * is all the plan needs. Kept in its own file so the orchestrator depends on the shard
 * format through exactly one function.
 *
 * Test hook: DF_SYNTHETIC_SAMPLES=N replaces the shards by N synthetic samples whose
 * lengths are drawn from the topology's seed (16..max_seq_len tokens). The supervision
 * tests use it with fake workers, which never read tokens; a real run never sets it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "orch.h"
#include "util.h"

#if __has_include("io/shard.h")
#include "io/shard.h"
#define HAVE_SHARD 1
#else
#define HAVE_SHARD 0
#endif

static int synthetic_lengths(const topo *t, const char *spec, uint32_t **lens, uint32_t *n,
                             char *err, size_t errlen)
{
    char *end;
    unsigned long count = strtoul(spec, &end, 10);
    if (*end || count == 0 || count > 10000000ul) {
        snprintf(err, errlen, "DF_SYNTHETIC_SAMPLES=%s: expected an integer 1..10000000", spec);
        return -EINVAL;
    }
    uint32_t *l = malloc(count * sizeof *l);
    if (!l)
        return -ENOMEM;
    df_rng rng;
    df_rng_seed(&rng, t->seed ^ 0x53594e5448ull);
    uint32_t hi = t->max_seq_len >= 16 ? t->max_seq_len : 16;
    for (unsigned long i = 0; i < count; i++)
        l[i] = 16 + (uint32_t)df_rng_below(&rng, hi - 16 + 1);
    *lens = l;
    *n = (uint32_t)count;
    return 0;
}

int plan_source_lengths(const topo *t, uint32_t **lens, uint32_t *n, char *err, size_t errlen)
{
    *lens = NULL;
    *n = 0;
    const char *synth = getenv("DF_SYNTHETIC_SAMPLES");
    if (synth && *synth)
        return synthetic_lengths(t, synth, lens, n, err, errlen);
#if HAVE_SHARD
    dataset *ds = NULL;
    int rc = dataset_open(&ds, t->shards, t->n_shards, err, errlen);
    if (rc < 0)
        return rc;
    uint64_t count = dataset_n_samples(ds);
    if (count == 0 || count > UINT32_MAX) {
        snprintf(err, errlen, "%s: %llu samples (expected 1..2^32-1)", t->shards[0],
                 (unsigned long long)count);
        dataset_close(ds);
        return -EINVAL;
    }
    uint32_t *l = malloc(count * sizeof *l);
    if (!l) {
        dataset_close(ds);
        return -ENOMEM;
    }
    for (uint64_t i = 0; i < count; i++)
        l[i] = dataset_sample_len(ds, i);
    dataset_close(ds);
    *lens = l;
    *n = (uint32_t)count;
    return 0;
#else
    snprintf(err, errlen, "%s: this build has no shard reader (common/io/shard.h)",
             t->n_shards > 0 ? t->shards[0] : "data.shards");
    return -ENOTSUP;
#endif
}
