/* shard.c: validation and mmap of token shards, and the writer. See shard.h for the format. */
#include "io/shard.h"

#include "ckmath.h"
#include "util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct shard {
    char *path;
    void *map;
    uint64_t size;
    uint64_t n_samples, n_tokens;
    const uint64_t *offsets;
    const uint32_t *tokens;
    const uint8_t *mask;
    uint64_t first; /* global index of this shard's sample 0 */
} shard;

struct dataset {
    shard *shards;
    int n;
    uint64_t n_samples, n_tokens;
    uint32_t vocab;
};

static uint64_t align8(uint64_t x)
{
    return (x + 7) & ~7ull;
}

static int shard_load(shard *s, const char *path, uint32_t *vocab, char *err, size_t errlen)
{
    struct stat st;
    /* a FIFO, a device or a directory is refused before anything is read (a FIFO would
     * block, /dev/zero would pass as an empty file, a directory would fail in mmap) */
    int fd = df_open_regular(path, &st, err, errlen);
    if (fd < 0)
        return fd;
    s->size = (uint64_t)st.st_size;
    if (s->size < SHARD_HEADER_BYTES) {
        close(fd);
        return df_err(err, errlen, -EINVAL, "%s: offset 0: file is %llu bytes, shorter than the %u-byte header", path,
                      (unsigned long long)s->size, SHARD_HEADER_BYTES);
    }
    s->map = mmap(NULL, s->size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (s->map == MAP_FAILED) {
        s->map = NULL;
        return df_err(err, errlen, -errno, "%s: mmap: %s", path, strerror(errno));
    }
    const uint8_t *p = s->map;
    uint32_t version, vs;
    uint64_t pay_fnv, hdr_fnv;
    memcpy(&version, p + 8, 4);
    memcpy(&vs, p + 12, 4);
    memcpy(&s->n_samples, p + 16, 8);
    memcpy(&s->n_tokens, p + 24, 8);
    memcpy(&pay_fnv, p + 32, 8);
    memcpy(&hdr_fnv, p + 40, 8);
    if (memcmp(p, SHARD_MAGIC, 8) != 0)
        return df_err(err, errlen, -EINVAL, "%s: offset 0: bad magic (not a DFSHARD1 token shard)", path);
    if (df_fnv1a64(p, 40, 0) != hdr_fnv)
        return df_err(err, errlen, -EINVAL, "%s: offset 40: header checksum mismatch (header corrupt)", path);
    if (version != SHARD_VERSION)
        return df_err(err, errlen, -EINVAL, "%s: offset 8: version %u, this build reads %u", path, version,
                      SHARD_VERSION);
    if (vs == 0)
        return df_err(err, errlen, -EINVAL, "%s: offset 12: vocab_size is 0", path);
    if (*vocab && vs != *vocab)
        return df_err(err, errlen, -EINVAL, "%s: offset 12: vocab_size %u differs from the other shards' %u", path, vs,
                      *vocab);
    *vocab = vs;
    /* the 16 reserved bytes are not covered by header_fnv: zero is the only valid value,
     * so that a later version can give them a meaning */
    for (unsigned i = 48; i < SHARD_HEADER_BYTES; i++)
        if (p[i] != 0)
            return df_err(err, errlen, -EINVAL, "%s: offset %u: reserved header byte is 0x%02x, expected 0", path, i,
                          p[i]);
    /* sizes: bounded, then computed with overflow checks (a header with huge counts and a
     * matching checksum must not wrap the section offsets) */
    if (s->n_samples > SHARD_MAX_COUNT)
        return df_err(err, errlen, -EINVAL, "%s: offset 16: n_samples %llu exceeds the limit of %llu", path,
                      (unsigned long long)s->n_samples, (unsigned long long)SHARD_MAX_COUNT);
    if (s->n_tokens > SHARD_MAX_COUNT)
        return df_err(err, errlen, -EINVAL, "%s: offset 24: n_tokens %llu exceeds the limit of %llu", path,
                      (unsigned long long)s->n_tokens, (unsigned long long)SHARD_MAX_COUNT);
    uint64_t off_off = SHARD_HEADER_BYTES, tok_off, mask_off, end, tok_bytes;
    if (ckmath_muladd(8, s->n_samples + 1, off_off, &tok_off) || ckmath_mul(4, s->n_tokens, &tok_bytes) ||
        ckmath_add(tok_off, align8(tok_bytes), &mask_off) || ckmath_add(mask_off, align8(s->n_tokens), &end))
        return df_err(err, errlen, -EINVAL, "%s: offset 16: n_samples %llu and n_tokens %llu overflow the file size",
                      path, (unsigned long long)s->n_samples, (unsigned long long)s->n_tokens);
    if (end != s->size)
        return df_err(err, errlen, -EINVAL,
                      "%s: offset %llu: file is %llu bytes, header says %llu (n_samples %llu, n_tokens %llu): "
                      "truncated or wrong header",
                      path, (unsigned long long)DF_MIN(end, s->size), (unsigned long long)s->size,
                      (unsigned long long)end, (unsigned long long)s->n_samples, (unsigned long long)s->n_tokens);
    if (df_fnv1a64(p + SHARD_HEADER_BYTES, s->size - SHARD_HEADER_BYTES, 0) != pay_fnv)
        return df_err(err, errlen, -EINVAL, "%s: offset 32: payload checksum mismatch (data corrupt)", path);
    s->offsets = (const uint64_t *)(p + off_off);
    s->tokens = (const uint32_t *)(p + tok_off);
    s->mask = p + mask_off;
    if (s->offsets[0] != 0)
        return df_err(err, errlen, -EINVAL, "%s: offset %llu: offsets[0] is %llu, expected 0", path,
                      (unsigned long long)off_off, (unsigned long long)s->offsets[0]);
    for (uint64_t i = 0; i < s->n_samples; i++)
        if (s->offsets[i + 1] < s->offsets[i] || s->offsets[i + 1] > s->n_tokens ||
            s->offsets[i + 1] - s->offsets[i] > UINT32_MAX)
            return df_err(err, errlen, -EINVAL, "%s: offset %llu: offsets[%llu] = %llu is out of order or range", path,
                          (unsigned long long)(off_off + 8 * (i + 1)), (unsigned long long)(i + 1),
                          (unsigned long long)s->offsets[i + 1]);
    if (s->offsets[s->n_samples] != s->n_tokens)
        return df_err(err, errlen, -EINVAL, "%s: offset %llu: last offset %llu != n_tokens %llu", path,
                      (unsigned long long)(off_off + 8 * s->n_samples), (unsigned long long)s->offsets[s->n_samples],
                      (unsigned long long)s->n_tokens);
    for (uint64_t i = 0; i < s->n_tokens; i++) {
        if (s->tokens[i] >= vs)
            return df_err(err, errlen, -EINVAL, "%s: offset %llu: token %u >= vocab_size %u", path,
                          (unsigned long long)(tok_off + 4 * i), s->tokens[i], vs);
        if (s->mask[i] > 1)
            return df_err(err, errlen, -EINVAL, "%s: offset %llu: loss_mask value %u, expected 0 or 1", path,
                          (unsigned long long)(mask_off + i), s->mask[i]);
    }
    return 0;
}

void dataset_close(dataset *ds)
{
    if (!ds)
        return;
    for (int i = 0; i < ds->n; i++) {
        if (ds->shards[i].map)
            munmap(ds->shards[i].map, ds->shards[i].size);
        free(ds->shards[i].path);
    }
    free(ds->shards);
    free(ds);
}

int dataset_open(dataset **out, char *const *paths, int n, char *err, size_t errlen)
{
    *out = NULL;
    if (n <= 0)
        return df_err(err, errlen, -EINVAL, "dataset: no shard files given");
    dataset *ds = calloc(1, sizeof *ds);
    if (!ds || !(ds->shards = calloc((size_t)n, sizeof(shard)))) {
        free(ds);
        return df_err(err, errlen, -ENOMEM, "dataset: out of memory");
    }
    for (int i = 0; i < n; i++) {
        shard *s = &ds->shards[i];
        ds->n = i + 1;
        if (!(s->path = strdup(paths[i]))) {
            dataset_close(ds);
            return df_err(err, errlen, -ENOMEM, "dataset: out of memory");
        }
        int rc = shard_load(s, paths[i], &ds->vocab, err, errlen);
        if (rc < 0) {
            dataset_close(ds);
            return rc;
        }
        s->first = ds->n_samples;
        ds->n_samples += s->n_samples;
        ds->n_tokens += s->n_tokens;
    }
    *out = ds;
    return 0;
}

uint64_t dataset_n_samples(const dataset *ds)
{
    return ds->n_samples;
}
uint64_t dataset_n_tokens(const dataset *ds)
{
    return ds->n_tokens;
}
uint32_t dataset_vocab_size(const dataset *ds)
{
    return ds->vocab;
}

static const shard *find(const dataset *ds, uint64_t idx, uint64_t *local)
{
    int lo = 0, hi = ds->n - 1; /* last shard whose first <= idx */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (ds->shards[mid].first <= idx)
            lo = mid;
        else
            hi = mid - 1;
    }
    *local = idx - ds->shards[lo].first;
    return &ds->shards[lo];
}

uint32_t dataset_sample_len(const dataset *ds, uint64_t idx)
{
    if (idx >= ds->n_samples)
        return 0;
    uint64_t i;
    const shard *s = find(ds, idx, &i);
    return (uint32_t)(s->offsets[i + 1] - s->offsets[i]);
}

int dataset_sample(const dataset *ds, uint64_t idx, const uint32_t **tokens, const uint8_t **loss_mask, uint32_t *len)
{
    if (idx >= ds->n_samples)
        return -ERANGE;
    uint64_t i;
    const shard *s = find(ds, idx, &i);
    *tokens = s->tokens + s->offsets[i];
    *loss_mask = s->mask + s->offsets[i];
    *len = (uint32_t)(s->offsets[i + 1] - s->offsets[i]);
    return 0;
}

int dataset_locate(const dataset *ds, uint64_t idx, int *shard_i, uint64_t *local)
{
    if (idx >= ds->n_samples)
        return -ERANGE;
    const shard *s = find(ds, idx, local);
    *shard_i = (int)(s - ds->shards);
    return 0;
}

int shard_write(const char *path, uint32_t vocab_size, uint64_t n_samples, const uint64_t *offsets,
                const uint32_t *tokens, const uint8_t *loss_mask)
{
    uint64_t n_tokens = offsets[n_samples];
    if (n_samples > SHARD_MAX_COUNT || n_tokens > SHARD_MAX_COUNT)
        return -EOVERFLOW;
    uint64_t tok_off = SHARD_HEADER_BYTES + 8 * (n_samples + 1);
    uint64_t mask_off = tok_off + align8(4 * n_tokens);
    uint64_t size = mask_off + align8(n_tokens);
    if (size > SIZE_MAX)
        return -EOVERFLOW;
    uint8_t *buf = calloc(1, (size_t)size);
    if (!buf)
        return -ENOMEM;
    memcpy(buf, SHARD_MAGIC, 8);
    uint32_t version = SHARD_VERSION;
    memcpy(buf + 8, &version, 4);
    memcpy(buf + 12, &vocab_size, 4);
    memcpy(buf + 16, &n_samples, 8);
    memcpy(buf + 24, &n_tokens, 8);
    memcpy(buf + SHARD_HEADER_BYTES, offsets, 8 * (n_samples + 1));
    memcpy(buf + tok_off, tokens, 4 * n_tokens);
    memcpy(buf + mask_off, loss_mask, n_tokens);
    uint64_t pay = df_fnv1a64(buf + SHARD_HEADER_BYTES, size - SHARD_HEADER_BYTES, 0);
    memcpy(buf + 32, &pay, 8);
    uint64_t hdr = df_fnv1a64(buf, 40, 0);
    memcpy(buf + 40, &hdr, 8);
    int rc = df_write_file_atomic(path, buf, size);
    free(buf);
    return rc;
}
