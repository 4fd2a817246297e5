/* plan_source.c: where the ledger plan's per-sample token lengths come from.
 *
 * The one place the orchestrator touches training data: it opens data.shards with the
 * shard reader (common/io/shard.h, dataset_open) only to read every sample's length, which
 * is all the plan needs. Kept in its own file so the orchestrator depends on the shard
 * format through exactly one function.
 *
 * It also fingerprints the data (plan_source_fingerprint): every shard's size and a 64-bit
 * content hash, and one digest over them, which the ledger carries; --resume recomputes it
 * and refuses a shard that changed since the plan was made (setup.c). The shards are hashed
 * in parallel (one thread per shard up to the CPU count, at most 16; ~1.7 GB/s each).
 *
 * The lengths are read once per start (the orchestrator keeps them for every epoch's plan),
 * and that same pass checks what the workers would otherwise find only mid-run: an empty
 * sample, and a token id outside the target's vocabulary (naming the shard, the sample and
 * the id; plan_source_check_shards does the same for the validation shards).
 *
 * Test hook: DF_SYNTHETIC_SAMPLES=N replaces the shards by N synthetic samples whose
 * lengths are drawn from the topology's seed (16..max_seq_len tokens). The supervision
 * tests use it with fake workers, which never read tokens; a real run never sets it.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orch.h"
#include "util.h"

#if __has_include("io/shard.h")
#include "io/shard.h"
#define HAVE_SHARD 1
#else
#define HAVE_SHARD 0
#endif

static int synthetic_lengths(const topo *t, const char *spec, uint32_t **lens, uint32_t *n, char *err, size_t errlen)
{
    char *end;
    unsigned long count = strtoul(spec, &end, 10);
    if (*end || count == 0 || count > 10000000ul)
        return df_err(err, errlen, -EINVAL, "DF_SYNTHETIC_SAMPLES=%s: expected an integer 1..10000000", spec);
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

#if HAVE_SHARD
/* "data.shards[2] /x/b.dfs: sample 17" for dataset sample idx (paths: the dataset's files) */
static void where(const dataset *ds, char *const *paths, const char *field, uint64_t idx, char *out, size_t cap)
{
    int si = 0;
    uint64_t local = idx;
    if (dataset_locate(ds, idx, &si, &local) < 0)
        si = 0;
    snprintf(out, cap, "%s[%d] %s: sample %llu", field, si, paths[si], (unsigned long long)local);
}

/* The first n samples of ds (paths, named `field` in messages): none empty (if no_empty), and
 * every token id below vocab (0: not checked, no model is read). The shard reader has already checked
 * every id against the shards' own vocab_size, so the tokens are scanned only when that is
 * larger than the target's. 0 or -EINVAL with err naming the shard, the sample and the id. */
static int check_samples(const dataset *ds, char *const *paths, const char *field, uint64_t n, int no_empty,
                         uint32_t vocab, const char *vocab_src, char *err, size_t errlen)
{
    char at[1300];
    uint32_t svocab = dataset_vocab_size(ds);
    int scan = vocab > 0 && svocab > vocab;
    for (uint64_t i = 0; i < n; i++) {
        const uint32_t *tok;
        const uint8_t *mask;
        uint32_t len = 0;
        if (dataset_sample(ds, i, &tok, &mask, &len) < 0)
            len = 0;
        if (len == 0 && no_empty) {
            where(ds, paths, field, i, at, sizeof at);
            return df_err(err, errlen, -EINVAL, "%s is empty (0 tokens): every sample needs at least one token", at);
        }
        for (uint32_t k = 0; scan && k < len; k++) {
            if (tok[k] >= vocab) {
                where(ds, paths, field, i, at, sizeof at);
                return df_err(err, errlen, -EINVAL,
                              "%s: token id %u (position %u) is outside the target's vocabulary 0..%u (%s: vocab_size "
                              "%u; the shard header says vocab_size %u: was it tokenised for another model?)",
                              at, tok[k], k, vocab - 1, vocab_src, vocab, svocab);
            }
        }
    }
    if (scan)
        df_log("%s: the shard header says vocab_size %u, more than the target's %u (%s), but every token id of "
               "the %llu samples used is below %u",
               field, svocab, vocab, vocab_src, (unsigned long long)n, vocab);
    return 0;
}
#endif

int plan_source_check_shards(char *const *paths, int n_paths, const char *field, uint64_t max_samples, uint32_t vocab,
                             const char *vocab_src, char *err, size_t errlen)
{
#if HAVE_SHARD
    dataset *ds = NULL;
    char e[1024];
    int rc = dataset_open(&ds, paths, n_paths, e, sizeof e);
    if (rc < 0)
        return df_err(err, errlen, rc, "%s: %s", field, e);
    uint64_t n = dataset_n_samples(ds);
    if (max_samples > 0 && n > max_samples)
        n = max_samples;
    rc = check_samples(ds, paths, field, n, 0, vocab, vocab_src, err, errlen); /* the validator skips empty ones */
    dataset_close(ds);
    return rc;
#else
    (void)paths, (void)n_paths, (void)max_samples, (void)vocab, (void)vocab_src;
    return df_err(err, errlen, -ENOTSUP, "%s: this build has no shard reader (common/io/shard.h)", field);
#endif
}

int plan_source_lengths(const topo *t, uint32_t vocab, const char *vocab_src, uint32_t **lens, uint32_t *n,
                        plan_data_info *info, char *err, size_t errlen)
{
    *lens = NULL;
    *n = 0;
    memset(info, 0, sizeof *info);
    const char *synth = getenv("DF_SYNTHETIC_SAMPLES");
    if (synth && *synth)
        return synthetic_lengths(t, synth, lens, n, err, errlen);
#if HAVE_SHARD
    dataset *ds = NULL;
    char e[1024];
    int rc = dataset_open(&ds, t->shards, t->n_shards, e, sizeof e);
    if (rc < 0)
        return df_err(err, errlen, rc, "%s", e);
    uint64_t count = dataset_n_samples(ds);
    if (count == 0 || count > UINT32_MAX) {
        snprintf(err, errlen, "%s: %llu samples (expected 1..2^32-1)", t->shards[0], (unsigned long long)count);
        dataset_close(ds);
        return -EINVAL;
    }
    if ((rc = check_samples(ds, t->shards, "data.shards", count, 1, vocab, vocab_src, err, errlen)) < 0) {
        dataset_close(ds);
        return rc;
    }
    uint32_t *l = malloc(count * sizeof *l);
    if (!l) {
        dataset_close(ds);
        return -ENOMEM;
    }
    uint64_t longest = 0;
    for (uint64_t i = 0; i < count; i++) {
        l[i] = dataset_sample_len(ds, i);
        info->n_truncated += l[i] > t->max_seq_len;
        if (l[i] > l[longest])
            longest = i;
    }
    /* the plan truncates these to max_seq_len (docs/topology.md): say so, and where */
    info->longest = l[longest];
    where(ds, t->shards, "data.shards", longest, info->longest_at, sizeof info->longest_at);
    dataset_close(ds);
    *lens = l;
    *n = (uint32_t)count;
    return 0;
#else
    (void)vocab, (void)vocab_src;
    return df_err(err, errlen, -ENOTSUP, "%s: this build has no shard reader (common/io/shard.h)",
                  t->n_shards > 0 ? t->shards[0] : "data.shards");
#endif
}

/* Size and content hash of one regular file (err says why not): 8-byte words folded through the splitmix64 finaliser
 * (several GB/s; an integrity check against a changed or damaged file, not a cryptographic
 * one), the length mixed in last. 0 or -errno. */
static int hash_file(const char *path, uint64_t *size, uint64_t *hash, char *err, size_t errlen)
{
    int fd = df_open_regular(path, NULL, err, errlen); /* a FIFO must not block the open */
    if (fd < 0)
        return fd;
    enum { CHUNK = 1 << 20 };
    uint8_t *buf = malloc(CHUNK);
    if (!buf) {
        close(fd);
        return -ENOMEM;
    }
    uint64_t h = 0x6466696c65736861ull, total = 0;
    int rc = 0;
    for (;;) {
        size_t have = 0; /* fill the whole chunk (or up to EOF) so words never straddle reads */
        while (have < CHUNK) {
            ssize_t n = read(fd, buf + have, CHUNK - have);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0) {
                rc = -errno;
                goto out;
            }
            if (n == 0)
                break;
            have += (size_t)n;
        }
        size_t i = 0;
        for (; i + 8 <= have; i += 8) {
            uint64_t w;
            memcpy(&w, buf + i, 8);
            h = df_hash64(h ^ w);
        }
        if (i < have) { /* the tail of the file */
            uint64_t w = 0;
            memcpy(&w, buf + i, have - i);
            h = df_hash64(h ^ w ^ 0x8000000000000000ull);
        }
        total += have;
        if (have < CHUNK)
            break;
    }
    *size = total;
    *hash = df_hash64(h ^ total);
out:
    free(buf);
    close(fd);
    return rc;
}

uint64_t plan_source_digest(const plan_fp *fp)
{
    uint64_t d = df_fnv1a64("dfdata1", 7, 0);
    for (int i = 0; i < fp->n; i++) {
        d = df_fnv1a64(fp->f[i].path, strlen(fp->f[i].path) + 1, d);
        d = df_fnv1a64(&fp->f[i].size, 8, d);
        d = df_fnv1a64(&fp->f[i].hash, 8, d);
    }
    return d;
}

/* The shards are hashed by up to FP_THREADS threads, each taking the next unhashed shard:
 * every hash is a function of its file alone, so the result does not depend on the thread
 * count (DF_FINGERPRINT_THREADS=N overrides it; tests compare 1 with many), and the error
 * reported is the lowest-numbered shard's, whichever thread met it first. */
#define FP_THREADS 16

typedef struct fp_job {
    const topo *t;
    plan_fp *fp;
    int next; /* next shard to take (atomic) */
    int *rc;  /* [n_shards] */
    char (*why)[512];
} fp_job;

static void *fp_worker(void *arg)
{
    fp_job *j = arg;
    for (;;) {
        int i = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (i >= j->t->n_shards)
            return NULL;
        j->rc[i] = hash_file(j->t->shards[i], &j->fp->f[i].size, &j->fp->f[i].hash, j->why[i], sizeof j->why[i]);
    }
}

static int fp_threads(int n_shards)
{
    const char *e = getenv("DF_FINGERPRINT_THREADS");
    long n = e && *e ? strtol(e, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        n = 1;
    if (n > FP_THREADS)
        n = FP_THREADS;
    return (int)(n < n_shards ? n : n_shards);
}

int plan_source_fingerprint(const topo *t, plan_fp *fp, char *err, size_t errlen)
{
    memset(fp, 0, sizeof *fp);
    const char *synth = getenv("DF_SYNTHETIC_SAMPLES");
    if (synth && *synth) { /* no files: the sample count is what the plan depends on */
        fp->n = 1;
        snprintf(fp->f[0].path, sizeof fp->f[0].path, "DF_SYNTHETIC_SAMPLES");
        fp->f[0].size = strtoull(synth, NULL, 10);
        fp->digest = plan_source_digest(fp);
        return 0;
    }
    if (t->n_shards > PLAN_FP_MAX)
        return df_err(err, errlen, -E2BIG, "data.shards: %d files (at most %d)", t->n_shards, PLAN_FP_MAX);
    for (int i = 0; i < t->n_shards; i++) {
        if (strlen(t->shards[i]) >= sizeof fp->f[i].path)
            return df_err(err, errlen, -ENAMETOOLONG, "data.shards[%d]: path too long (%zu bytes)", i,
                          strlen(t->shards[i]));
        snprintf(fp->f[i].path, sizeof fp->f[i].path, "%s", t->shards[i]);
    }
    fp_job j = {.t = t, .fp = fp};
    j.rc = calloc((size_t)t->n_shards + 1, sizeof *j.rc);
    j.why = calloc((size_t)t->n_shards + 1, sizeof *j.why);
    if (!j.rc || !j.why) {
        free(j.rc), free(j.why);
        return df_err(err, errlen, -ENOMEM, "data.shards: out of memory");
    }
    pthread_t th[FP_THREADS];
    int nt = fp_threads(t->n_shards), started = 0;
    for (; started < nt - 1; started++) /* this thread is the last worker */
        if (pthread_create(&th[started], NULL, fp_worker, &j) != 0)
            break; /* fewer threads: the others take the rest */
    fp_worker(&j);
    for (int k = 0; k < started; k++)
        pthread_join(th[k], NULL);
    int rc = 0;
    for (int i = 0; i < t->n_shards && rc == 0; i++) {
        if ((rc = j.rc[i]) < 0) {
            if (j.why[i][0])
                snprintf(err, errlen, "data.shards[%d]: %s", i, j.why[i]);
            else
                snprintf(err, errlen, "data.shards[%d] %s: %s", i, t->shards[i], strerror(-rc));
        }
    }
    free(j.rc), free(j.why);
    if (rc < 0)
        return rc;
    fp->n = t->n_shards;
    fp->digest = plan_source_digest(fp);
    return 0;
}
