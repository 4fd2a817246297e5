/* dflash_manifest.c: a checkpoint's manifest.json, written and verified (see
 * dflash_manifest.h). Verification opens every listed file, checks its size, then hashes
 * every piece of every file on par_for's threads (version 1 manifests: each file is one
 * piece, so one thread a file) and judges the results in file order, piece order. */
#include "dflash/dflash_manifest.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "par.h"
#include "util.h"

const char *const dflash_manifest_files[DFLASH_MANIFEST_FILES] = {"model.safetensors", "optimizer.safetensors",
                                                                  "trainer_state.json"};

static uint64_t g_piece_bytes = DFLASH_MANIFEST_PIECE_BYTES;

uint64_t dflash_manifest_piece_bytes(uint64_t set)
{
    uint64_t old = g_piece_bytes;
    if (set)
        g_piece_bytes = set < DFLASH_MANIFEST_MIN_PIECE ? DFLASH_MANIFEST_MIN_PIECE : set;
    return old;
}

int dflash_manifest_write(const char *dir, long step, const dflash_manifest_sum sums[DFLASH_MANIFEST_FILES], char *err,
                          size_t errlen)
{
    char path[4200];
    json_t *m = json_object(), *files = json_object();
    int rc = 0;
    char *js = NULL;
    df_sha256_pieces own = {0};
    if (!m || !files) {
        json_decref(files);
        rc = df_err(err, errlen, -ENOMEM, "%s/manifest.json: out of memory", dir);
        goto out;
    }
    json_object_set_new(m, "format", json_string("dflash-pipe-checkpoint-manifest"));
    json_object_set_new(m, "version", json_integer(2));
    json_object_set_new(m, "step", json_integer(step));
    json_object_set_new(m, "files", files);
    for (size_t i = 0; i < DFLASH_MANIFEST_FILES; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, dflash_manifest_files[i]);
        if (access(path, F_OK) != 0 && errno == ENOENT)
            continue; /* no optimizer file (dflash_tool init) */
        char hex[65];
        uint64_t size = 0;
        const df_sha256_pieces *p = &sums[i].pieces;
        if (sums[i].have) {
            memcpy(hex, sums[i].hex, sizeof hex), size = sums[i].size;
        } else {
            df_sha256_pieces_free(&own);
            df_sha256_pieces_init(&own, g_piece_bytes);
            if ((rc = df_sha256_file_pieces(path, hex, &size, &own)) < 0) {
                rc = df_err(err, errlen, rc, "%s: reading it back for its checksum: %s", path, strerror(-rc));
                goto out;
            }
            p = &own;
        }
        if (p->n != df_sha256_piece_count(size, p->piece_bytes)) {
            rc = df_err(err, errlen, -EINVAL, "%s: %zu piece digests for %llu bytes in pieces of %llu (a bug)", path,
                        p->n, (unsigned long long)size, (unsigned long long)p->piece_bytes);
            goto out;
        }
        json_t *arr = json_array(), *e = NULL;
        for (size_t k = 0; arr && k < p->n; k++)
            if (json_array_append_new(arr, json_string(p->hex[k])) < 0)
                json_decref(arr), arr = NULL;
        if (arr)
            e = json_pack("{s:I, s:s, s:I, s:o}", "bytes", (json_int_t)size, "sha256", hex, "piece_bytes",
                          (json_int_t)p->piece_bytes, "sha256_pieces", arr);
        if (!e || json_object_set_new(files, dflash_manifest_files[i], e) < 0) {
            rc = df_err(err, errlen, -ENOMEM, "%s/manifest.json: out of memory", dir);
            goto out;
        }
    }
    js = json_dumps(m, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (!js) {
        rc = df_err(err, errlen, -ENOMEM, "%s/manifest.json: out of memory", dir);
        goto out;
    }
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    if ((rc = df_write_file_atomic(path, js, strlen(js))) < 0) {
        rc = df_err(err, errlen, rc, "%s: %s", path, strerror(-rc));
        goto out;
    }
out:
    df_sha256_pieces_free(&own);
    free(js);
    json_decref(m);
    return rc;
}

/* One listed file: what the manifest says, and the file as opened. */
typedef struct mf_file {
    char path[4200];
    int listed;
    uint64_t want_bytes, piece_bytes; /* version 1: piece_bytes = want_bytes, one piece */
    size_t n_pieces, first_job;
    const char **want; /* [n_pieces] hex, into the manifest's json */
    int fd, open_rc;   /* open_rc: 0 or -errno */
    uint64_t size;
} mf_file;

/* One piece to hash. */
typedef struct mf_job {
    int fd;
    uint64_t off, len;
    int rc;
    char hex[65];
} mf_job;

static void hash_jobs(void *ctx, uint64_t lo, uint64_t hi, int part)
{
    (void)part;
    mf_job *jobs = ctx;
    for (uint64_t i = lo; i < hi; i++)
        jobs[i].rc = df_sha256_range(jobs[i].fd, jobs[i].off, jobs[i].len, jobs[i].hex);
}

/* 1 when s is 64 hex digits. */
static int is_hex64(const char *s)
{
    if (!s || strlen(s) != 64)
        return 0;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f') || (s[i] >= 'A' && s[i] <= 'F')))
            return 0;
    return 1;
}

/* Read manifest entry e of file f (version 1 or 2) into f. 0 or -EINVAL with err. */
static int parse_entry(mf_file *f, const json_t *e, int version, const char *mpath, const char *name, char *err,
                       size_t errlen)
{
    int rc = 0;
    const json_t *jb = json_object_get(e, "bytes");
    const char *whole = json_string_value(json_object_get(e, "sha256"));
    if (!json_is_integer(jb) || json_integer_value(jb) < 0 || !is_hex64(whole)) {
        rc = df_err(err, errlen, -EINVAL,
                    "%s: field \"files.%s\": expected {\"bytes\": integer >= 0, \"sha256\": 64 hex digits, ...}", mpath,
                    name);
        goto out;
    }
    f->want_bytes = (uint64_t)json_integer_value(jb);
    if (version == 1) { /* the whole file as one piece */
        f->piece_bytes = f->want_bytes ? f->want_bytes : 1;
        f->n_pieces = 1;
        f->want = malloc(sizeof *f->want);
        if (!f->want) {
            rc = df_err(err, errlen, -ENOMEM, "%s: out of memory", mpath);
            goto out;
        }
        f->want[0] = whole;
        return 0;
    }
    const json_t *jp = json_object_get(e, "piece_bytes"), *arr = json_object_get(e, "sha256_pieces");
    if (!json_is_integer(jp) || json_integer_value(jp) < (json_int_t)DFLASH_MANIFEST_MIN_PIECE) {
        rc = df_err(err, errlen, -EINVAL, "%s: field \"files.%s.piece_bytes\": expected an integer >= %llu", mpath,
                    name, DFLASH_MANIFEST_MIN_PIECE);
        goto out;
    }
    f->piece_bytes = (uint64_t)json_integer_value(jp);
    uint64_t n = df_sha256_piece_count(f->want_bytes, f->piece_bytes);
    if (!json_is_array(arr) || json_array_size(arr) != n) {
        rc = df_err(err, errlen, -EINVAL,
                    "%s: field \"files.%s.sha256_pieces\": expected an array of %llu digests (%llu bytes in pieces "
                    "of %llu)",
                    mpath, name, (unsigned long long)n, (unsigned long long)f->want_bytes,
                    (unsigned long long)f->piece_bytes);
        goto out;
    }
    f->n_pieces = (size_t)n;
    f->want = malloc((n ? n : 1) * sizeof *f->want);
    if (!f->want) {
        rc = df_err(err, errlen, -ENOMEM, "%s: out of memory", mpath);
        goto out;
    }
    for (size_t k = 0; k < n; k++) {
        f->want[k] = json_string_value(json_array_get(arr, k));
        if (!is_hex64(f->want[k])) {
            rc = df_err(err, errlen, -EINVAL, "%s: field \"files.%s.sha256_pieces[%zu]\": expected 64 hex digits",
                        mpath, name, k);
            goto out;
        }
    }
out:
    return rc;
}

int dflash_manifest_verify(const char *dir, long *step_out, dflash_manifest_stats *st, char *err, size_t errlen)
{
    char path[4200];
    json_t *m = NULL;
    int rc = 0;
    mf_file fs[DFLASH_MANIFEST_FILES];
    mf_job *jobs = NULL;
    memset(fs, 0, sizeof fs);
    for (size_t i = 0; i < DFLASH_MANIFEST_FILES; i++)
        fs[i].fd = -1;
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    if (access(path, F_OK) != 0) {
        if (errno != ENOENT) {
            rc = df_err(err, errlen, -errno, "%s: %s", path, strerror(errno));
            goto out;
        }
        rc = df_err(err, errlen, -EINVAL,
                    "%s: missing: the checkpoint has no checksums (written before they were recorded, or the "
                    "manifest was lost), so it cannot be verified and is not loaded; continue from the release export "
                    "instead (drafter.init_dir)",
                    path);
        goto out;
    }
    json_error_t je;
    m = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!m) {
        rc = df_err(err, errlen, -EINVAL, "%s: line %d: %s", path, je.line, je.text);
        goto out;
    }
    json_t *files = json_object_get(m, "files"), *js = json_object_get(m, "step");
    /* compared as the JSON integer it is: cast to int first, 4294967297 would read as 1 */
    const json_t *jv = json_object_get(m, "version");
    json_int_t jversion = json_is_integer(jv) ? json_integer_value(jv) : 0;
    if (strcmp(json_string_value(json_object_get(m, "format")) ?: "", "dflash-pipe-checkpoint-manifest") != 0 ||
        (jversion != 1 && jversion != 2)) {
        rc = df_err(err, errlen, -EINVAL,
                    "%s: fields \"format\"/\"version\": not a version 1 or 2 dflash-pipe checkpoint manifest", path);
        goto out;
    }
    int version = (int)jversion;
    /* the step is a long from here on: one past LONG_MAX (where long is 32 bits) is refused */
    if (!json_is_integer(js) || json_integer_value(js) < 0 || json_integer_value(js) > LONG_MAX) {
        rc = df_err(err, errlen, -EINVAL, "%s: field \"step\": expected an integer >= 0", path);
        goto out;
    }
    if (!json_is_object(files)) {
        rc = df_err(err, errlen, -EINVAL, "%s: field \"files\": expected an object", path);
        goto out;
    }
    long step = (long)json_integer_value(js);
    const char *key;
    json_t *v;
    json_object_foreach(files, key, v)
    {
        int known = 0;
        for (size_t i = 0; i < DFLASH_MANIFEST_FILES; i++)
            known |= !strcmp(key, dflash_manifest_files[i]);
        if (!known) {
            rc = df_err(err, errlen, -EINVAL, "%s: field \"files.%s\": not a checkpoint file", path, key);
            goto out;
        }
    }
    /* what the manifest says, file by file; then every listed file opened and sized */
    size_t njobs = 0;
    for (size_t i = 0; i < DFLASH_MANIFEST_FILES; i++) {
        mf_file *f = &fs[i];
        snprintf(f->path, sizeof f->path, "%s/%s", dir, dflash_manifest_files[i]);
        json_t *e = json_object_get(files, dflash_manifest_files[i]);
        int present = access(f->path, F_OK) == 0;
        if (!e) {
            if (present || i != DFLASH_MANIFEST_OPTIMIZER) { /* only the optimizer file is optional */
                rc = df_err(err, errlen, -EINVAL, "%s: %s is not listed in %s: unverifiable, not loaded", f->path,
                            present ? "the file" : "a required file", path);
                goto out;
            }
            continue;
        }
        if ((rc = parse_entry(f, e, version, path, dflash_manifest_files[i], err, errlen)) < 0)
            goto out;
        f->listed = 1;
        f->fd = open(f->path, O_RDONLY | O_CLOEXEC);
        struct stat sb;
        if (f->fd < 0 || fstat(f->fd, &sb) < 0)
            f->open_rc = -errno;
        else
            f->size = (uint64_t)sb.st_size;
        f->first_job = njobs;
        if (!f->open_rc && f->size == f->want_bytes)
            njobs += f->n_pieces; /* a file of the wrong size is refused unhashed */
    }
    /* every piece of every file of the right size, hashed on par_for's threads */
    jobs = calloc(njobs ? njobs : 1, sizeof *jobs);
    if (!jobs) {
        rc = df_err(err, errlen, -ENOMEM, "%s: out of memory", path);
        goto out;
    }
    for (size_t i = 0; i < DFLASH_MANIFEST_FILES; i++) {
        mf_file *f = &fs[i];
        if (!f->listed || f->open_rc || f->size != f->want_bytes)
            continue;
        for (size_t k = 0; k < f->n_pieces; k++) {
            mf_job *j = &jobs[f->first_job + k];
            j->fd = f->fd;
            j->off = (uint64_t)k * f->piece_bytes;
            j->len = f->want_bytes - j->off < f->piece_bytes ? f->want_bytes - j->off : f->piece_bytes;
        }
    }
    int threads = par_for(njobs, 1, hash_jobs, jobs);
    /* judged in file order, then piece order: the same message whichever thread was first */
    for (size_t i = 0; i < DFLASH_MANIFEST_FILES; i++) {
        mf_file *f = &fs[i];
        if (!f->listed)
            continue;
        if ((rc = f->open_rc) < 0) {
            if (rc == -ENOENT) {
                rc = df_err(err, errlen, -EINVAL, "%s: missing (listed in %s)", f->path, path);
                goto out;
            }
            rc = df_err(err, errlen, rc, "%s: %s", f->path, strerror(-rc)); /* an I/O error may pass: stays temporary */
            goto out;
        }
        if (f->size != f->want_bytes) {
            rc = df_err(err, errlen, -EINVAL, "%s: %llu bytes, %s says %llu: the file is truncated or corrupt", f->path,
                        (unsigned long long)f->size, path, (unsigned long long)f->want_bytes);
            goto out;
        }
        for (size_t k = 0; k < f->n_pieces; k++) {
            mf_job *j = &jobs[f->first_job + k];
            if (j->rc == -ENODATA) {
                rc = df_err(err, errlen, -EINVAL,
                            "%s: ended before byte %llu while it was read: the file is truncated or changing", f->path,
                            (unsigned long long)(j->off + j->len));
                goto out;
            }
            if (j->rc < 0) {
                rc = df_err(err, errlen, j->rc, "%s: %s", f->path, strerror(-j->rc));
                goto out;
            }
            if (strcasecmp(j->hex, f->want[k]) == 0)
                continue;
            if (version == 1) {
                rc = df_err(err, errlen, -EINVAL,
                            "%s: content does not match its checksum (sha256 %s, %s says %s): the file is corrupt",
                            f->path, j->hex, path, f->want[k]);
                goto out;
            }
            rc =
                df_err(err, errlen, -EINVAL,
                       "%s: content does not match its checksum (bytes %llu..%llu of %llu: sha256 %s, %s says %s): the "
                       "file is corrupt",
                       f->path, (unsigned long long)j->off, (unsigned long long)(j->off + j->len),
                       (unsigned long long)f->want_bytes, j->hex, path, f->want[k]);
            goto out;
        }
    }
    /* the directory name step-N is what `latest` and the ledger's committed step point at */
    const char *base = strrchr(dir, '/');
    base = base ? base + 1 : dir;
    if (!strncmp(base, "step-", 5)) {
        char *end;
        errno = 0;
        long dstep = strtol(base + 5, &end, 10);
        if (!errno && *end == 0 && end != base + 5 && dstep != step) {
            rc = df_err(err, errlen, -EINVAL, "%s: field \"step\" is %ld but the directory is %s", path, step, base);
            goto out;
        }
    }
    if (step_out)
        *step_out = step;
    if (st) {
        memset(st, 0, sizeof *st);
        st->version = version, st->threads = threads, st->pieces = njobs;
        for (size_t i = 0; i < DFLASH_MANIFEST_FILES; i++)
            if (fs[i].listed)
                st->files++, st->bytes += fs[i].want_bytes;
    }
    rc = 0;
out:
    for (size_t i = 0; i < DFLASH_MANIFEST_FILES; i++) {
        if (fs[i].fd >= 0)
            close(fs[i].fd);
        free(fs[i].want);
    }
    free(jobs);
    json_decref(m);
    return rc;
}
