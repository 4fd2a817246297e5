/* dflash_ckpt.c: checkpoint save/load and release export/import (see dflash_ckpt.h).
 * Crash safety comes from ordering: files complete and fsynced -> directory renamed into
 * place and its parent fsynced -> "latest" replaced atomically. Readers only follow
 * "latest", so nothing half-written is ever reachable. */
#include "dflash/dflash_ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dflash/dflash_manifest.h"
#include "io/safetensors.h"
#include "sha256.h"

/* Remove a flat directory (our checkpoint dirs hold only files). Best effort. */
static void rm_flat_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[4096];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* sum non-NULL: also the file's digests and size, hashed while it is written */
static int write_params(const char *path, const dflash_config *c, const float *data, const char *prefix,
                        safetensors_dtype dt, dflash_manifest_sum *sum)
{
    safetensors_writer *w = safetensors_writer_new();
    if (!w)
        return -ENOMEM;
    int rc = 0, nt = dflash_tensor_count(c);
    for (int i = 0; i < nt && rc == 0; i++) {
        dflash_tensor t;
        dflash_tensor_info(c, i, &t);
        char name[160];
        snprintf(name, sizeof(name), "%s%s", prefix, t.name);
        rc = dt == SAFETENSORS_F32 ? safetensors_writer_add(w, name, SAFETENSORS_F32, t.ndim, t.shape, data + t.offset)
                                   : safetensors_writer_add_f32_as(w, name, dt, t.ndim, t.shape, data + t.offset);
    }
    if (rc == 0)
        rc = safetensors_writer_set_metadata(w, "format", "pt");
    if (rc == 0)
        rc = sum ? safetensors_writer_write_digests(w, path, sum->hex, &sum->size, &sum->pieces)
                 : safetensors_writer_write(w, path);
    safetensors_writer_free(w);
    return rc;
}

/* Read every tensor prefix+name of the table into data (f32), checking shapes. */
static int read_params(const safetensors_file *f, const dflash_config *c, float *data, const char *prefix, char *err,
                       size_t errlen)
{
    int nt = dflash_tensor_count(c);
    for (int i = 0; i < nt; i++) {
        dflash_tensor t;
        dflash_tensor_info(c, i, &t);
        char name[160];
        snprintf(name, sizeof(name), "%s%s", prefix, t.name);
        const safetensors_tensor *s = safetensors_find(f, name);
        if (!s) {
            return df_err(err, errlen, -EINVAL, "%s: tensor \"%s\" missing", f->path, name);
        }
        int ok = s->ndim == t.ndim;
        for (int k = 0; ok && k < t.ndim; k++)
            ok = s->shape[k] == t.shape[k];
        if (!ok) {
            return df_err(err, errlen, -EINVAL, "%s: tensor \"%s\" has shape [%lld%s%lld], expected [%lld, %lld]",
                          f->path, name, (long long)s->shape[0], s->ndim > 1 ? ", " : "",
                          s->ndim > 1 ? (long long)s->shape[1] : 0LL, (long long)t.shape[0], (long long)t.shape[1]);
        }
        int rc = safetensors_tensor_to_f32(s, data + t.offset);
        if (rc < 0) {
            return df_err(err, errlen, rc, "%s: tensor \"%s\": dtype %s cannot be read as float", f->path, name,
                          safetensors_dtype_name(s->dtype));
        }
    }
    return 0;
}

static json_t *state_to_json(const dflash_config *c, const adamw *opt, const dflash_train_state *ts)
{
    json_t *o = json_object(), *rng = json_array(), *cfg = dflash_config_to_json(c);
    if (!o || !rng || !cfg) {
        json_decref(o);
        json_decref(rng);
        json_decref(cfg);
        return NULL;
    }
    char hex[32];
    for (int i = 0; i < 4; i++) {
        snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)ts->rng.s[i]);
        json_array_append_new(rng, json_string(hex));
    }
    snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)ts->seed);
    json_object_set_new(o, "format", json_string("dflash-pipe-checkpoint"));
    json_object_set_new(o, "version", json_integer(1));
    json_object_set_new(o, "step", json_integer(ts->step));
    json_object_set_new(o, "epoch", json_integer(ts->epoch));
    json_object_set_new(o, "ledger_committed_step", json_integer(ts->ledger_committed_step));
    json_object_set_new(o, "seed", json_string(hex));
    json_object_set_new(o, "rng", rng);
    if (opt) {
        const adamw_config *a = &opt->cfg;
        json_object_set_new(o, "optimizer",
                            json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:I, s:I}", "lr", a->lr, "min_lr",
                                      a->min_lr, "beta1", a->beta1, "beta2", a->beta2, "eps", a->eps, "weight_decay",
                                      a->weight_decay, "warmup_frac", a->warmup_frac, "clip_norm", a->clip_norm,
                                      "total_steps", (json_int_t)a->total_steps, "step", (json_int_t)opt->step));
    }
    json_object_set_new(o, "config", cfg);
    return o;
}

int dflash_ckpt_save(const char *root, const dflash_config *c, const dflash_params *p, const adamw *opt,
                     const dflash_train_state *ts, char *err, size_t errlen)
{
    int rc = 0, made_tmp = 0;
    char tmp[3900], fin[3900], path[4200], old[3900];
    char *js = NULL;
    json_t *st = NULL;
    /* model and optimizer hashed while written (on threads beside the writes and fsync: no
     * second pass over gigabytes), whole and in pieces; trainer_state.json is read back */
    dflash_manifest_sum sums[DFLASH_MANIFEST_FILES];
    memset(sums, 0, sizeof sums);
    for (size_t i = 0; i < DFLASH_MANIFEST_FILES; i++)
        df_sha256_pieces_init(&sums[i].pieces, dflash_manifest_piece_bytes(0));
    if (strlen(root) > 3000) {
        rc = df_err(err, errlen, -ENAMETOOLONG, "checkpoint root path too long (%zu bytes)", strlen(root));
        goto out;
    }
    if ((rc = df_mkdir_p(root, 0700)) < 0) {
        rc = df_err(err, errlen, rc, "%s: cannot create checkpoint root: %s", root, strerror(-rc));
        goto out;
    }
    snprintf(tmp, sizeof(tmp), "%s/.tmp-step-%08ld.%d", root, ts->step, (int)getpid());
    snprintf(fin, sizeof(fin), "%s/step-%08ld", root, ts->step);
    rm_flat_dir(tmp); /* a leftover of a crashed save of this pid */
    if (mkdir(tmp, 0700) != 0) {
        rc = df_err(err, errlen, -errno, "%s: mkdir: %s", tmp, strerror(errno));
        goto out;
    }
    made_tmp = 1;
    snprintf(path, sizeof(path), "%s/model.safetensors", tmp);
    if ((rc = write_params(path, c, p->data, "", SAFETENSORS_F32, &sums[DFLASH_MANIFEST_MODEL])) < 0) {
        rc = df_err(err, errlen, rc, "%s: %s", path, strerror(-rc));
        goto out;
    }
    sums[DFLASH_MANIFEST_MODEL].have = 1;
    if (opt) {
        snprintf(path, sizeof(path), "%s/optimizer.safetensors", tmp);
        safetensors_writer *w = safetensors_writer_new();
        if (!w) {
            rc = df_err(err, errlen, -ENOMEM, "%s: out of memory", path);
            goto out;
        }
        int nt = dflash_tensor_count(c);
        for (int i = 0; i < nt && rc == 0; i++) {
            dflash_tensor t;
            dflash_tensor_info(c, i, &t);
            char name[160];
            snprintf(name, sizeof(name), "m.%s", t.name);
            rc = safetensors_writer_add(w, name, SAFETENSORS_F32, t.ndim, t.shape, opt->m + t.offset);
            snprintf(name, sizeof(name), "v.%s", t.name);
            if (rc == 0)
                rc = safetensors_writer_add(w, name, SAFETENSORS_F32, t.ndim, t.shape, opt->v + t.offset);
        }
        if (rc == 0)
            rc = safetensors_writer_write_digests(w, path, sums[DFLASH_MANIFEST_OPTIMIZER].hex,
                                                  &sums[DFLASH_MANIFEST_OPTIMIZER].size,
                                                  &sums[DFLASH_MANIFEST_OPTIMIZER].pieces);
        safetensors_writer_free(w);
        if (rc < 0) {
            rc = df_err(err, errlen, rc, "%s: %s", path, strerror(-rc));
            goto out;
        }
        sums[DFLASH_MANIFEST_OPTIMIZER].have = 1;
    }
    st = state_to_json(c, opt, ts);
    js = st ? json_dumps(st, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) : NULL;
    if (!js) {
        rc = df_err(err, errlen, -ENOMEM, "trainer_state.json: out of memory");
        goto out;
    }
    snprintf(path, sizeof(path), "%s/trainer_state.json", tmp);
    if ((rc = df_write_file_atomic(path, js, strlen(js))) < 0) {
        rc = df_err(err, errlen, rc, "%s: %s", path, strerror(-rc));
        goto out;
    }
    if ((rc = dflash_manifest_write(tmp, ts->step, sums, err, errlen)) < 0)
        goto out;
    if ((rc = df_fsync_dir_of(path)) < 0) {
        rc = df_err(err, errlen, rc, "%s: fsync: %s", tmp, strerror(-rc));
        goto out;
    }
    /* a re-save of the same step: move the old directory aside first (rename cannot
     * replace a non-empty directory) */
    snprintf(old, sizeof(old), "%s/.old-step-%08ld.%d", root, ts->step, (int)getpid());
    struct stat sb;
    int had_old = stat(fin, &sb) == 0;
    if (had_old && rename(fin, old) != 0) {
        rc = df_err(err, errlen, -errno, "%s: rename to %s: %s", fin, old, strerror(errno));
        goto out;
    }
    if (rename(tmp, fin) != 0) {
        rc = df_err(err, errlen, -errno, "%s: rename to %s: %s", tmp, fin, strerror(errno));
        goto out;
    }
    made_tmp = 0;
    if ((rc = df_fsync_dir_of(fin)) < 0) {
        rc = df_err(err, errlen, rc, "%s: fsync: %s", root, strerror(-rc));
        goto out;
    }
    char line[64];
    int n = snprintf(line, sizeof(line), "step-%08ld\n", ts->step);
    snprintf(path, sizeof(path), "%s/latest", root);
    if ((rc = df_write_file_atomic(path, line, (size_t)n)) < 0) {
        rc = df_err(err, errlen, rc, "%s: %s", path, strerror(-rc));
        goto out;
    }
    if (had_old)
        rm_flat_dir(old);
    rc = 0;
out:
    if (made_tmp)
        rm_flat_dir(tmp);
    for (size_t i = 0; i < DFLASH_MANIFEST_FILES; i++)
        df_sha256_pieces_free(&sums[i].pieces);
    free(js);
    json_decref(st);
    return rc;
}

static int cmp_long_desc(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int dflash_ckpt_prune(const char *root, unsigned keep, long below, char *err, size_t errlen)
{
    if (keep == 0)
        return 0;
    DIR *d = opendir(root);
    if (!d) {
        int e = errno;
        return df_err(err, errlen, -e, "%s: opendir: %s", root, strerror(e));
    }
    long *steps = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        char *end;
        if (strncmp(e->d_name, "step-", 5) != 0)
            continue; /* latest, .tmp-*, .old-*: not ours to judge */
        errno = 0;
        long st = strtol(e->d_name + 5, &end, 10);
        if (errno || *end || end == e->d_name + 5 || st < 0)
            continue;
        if (n == cap) {
            long *nx = realloc(steps, (cap = cap ? 2 * cap : 64) * sizeof *steps);
            if (!nx) {
                rc = -ENOMEM;
                snprintf(err, errlen, "%s: out of memory listing checkpoints", root);
                goto out;
            }
            steps = nx;
        }
        steps[n++] = st;
    }
    qsort(steps, n, sizeof *steps, cmp_long_desc);
    for (size_t i = keep; i < n; i++) {
        if (steps[i] >= below)
            continue; /* the committed one and anything newer stay, whatever keep says */
        char dir[4200];
        snprintf(dir, sizeof(dir), "%s/step-%08ld", root, steps[i]);
        rm_flat_dir(dir);
        struct stat sb;
        if (stat(dir, &sb) == 0) { /* best effort: report, the next prune retries */
            rc = df_err(err, errlen, -EIO, "%s: could not be removed", dir);
            continue;
        }
        if (rc >= 0)
            rc++;
    }
out:
    closedir(d);
    free(steps);
    return rc;
}

int dflash_ckpt_remove_partial(const char *root, char *err, size_t errlen)
{
    DIR *d = opendir(root);
    if (!d) {
        if (errno == ENOENT)
            return 0;
        int e = errno;
        return df_err(err, errlen, -e, "%s: opendir: %s", root, strerror(e));
    }
    int n = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int is_tmp = strncmp(e->d_name, ".tmp-step-", 10) == 0, is_old = strncmp(e->d_name, ".old-step-", 10) == 0;
        if (!is_tmp && !is_old)
            continue;
        char *end;
        errno = 0;
        long st = strtol(e->d_name + 10, &end, 10);
        if (errno || end == e->d_name + 10 || *end != '.' || st < 0)
            continue; /* not a name a save makes */
        char dir[4200], fin[4200];
        snprintf(dir, sizeof dir, "%s/%s", root, e->d_name);
        snprintf(fin, sizeof fin, "%s/step-%08ld", root, st);
        struct stat sb;
        if (is_old && stat(fin, &sb) != 0 && errno == ENOENT) {
            if (rename(dir, fin) != 0) {
                rc = -errno;
                snprintf(err, errlen, "%s: rename back to %s: %s", dir, fin, strerror(errno));
                continue;
            }
            (void)df_fsync_dir_of(fin);
            n++;
            continue;
        }
        rm_flat_dir(dir);
        if (stat(dir, &sb) == 0) {
            rc = -EIO;
            snprintf(err, errlen, "%s: could not be removed", dir);
            continue;
        }
        n++;
    }
    closedir(d);
    return rc < 0 ? rc : n;
}

int dflash_ckpt_resolve(const char *root_or_dir, char *out, size_t outlen)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/trainer_state.json", root_or_dir);
    if (access(path, F_OK) == 0) {
        snprintf(out, outlen, "%s", root_or_dir);
        return 0;
    }
    snprintf(path, sizeof(path), "%s/latest", root_or_dir);
    char *buf = NULL;
    size_t len = 0;
    int rc = df_read_file(path, &buf, &len);
    if (rc < 0)
        return rc;
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == ' '))
        buf[--len] = 0;
    if (len == 0 || strchr(buf, '/')) {
        free(buf);
        return -EINVAL;
    }
    snprintf(out, outlen, "%s/%s", root_or_dir, buf);
    free(buf);
    return 0;
}

static int parse_hex(const json_t *v, uint64_t *out)
{
    const char *s = json_string_value(v);
    if (!s)
        return -EINVAL;
    char *end;
    errno = 0;
    *out = strtoull(s, &end, 16);
    return (errno || *end || end == s) ? -EINVAL : 0;
}

int dflash_ckpt_load(const char *root_or_dir, dflash_config *c, dflash_params *p, adamw *opt, dflash_train_state *ts,
                     char *err, size_t errlen)
{
    int rc;
    char dir[4096], path[4200];
    json_t *st = NULL;
    safetensors_file mf = {0}, of = {0};
    int mf_open = 0, of_open = 0;
    memset(p, 0, sizeof(*p));
    if (opt)
        memset(opt, 0, sizeof(*opt));
    if ((rc = dflash_ckpt_resolve(root_or_dir, dir, sizeof(dir))) < 0) {
        rc = df_err(err, errlen, rc, "%s: no checkpoint (no trainer_state.json, no readable \"latest\"): %s",
                    root_or_dir, strerror(-rc));
        goto out;
    }
    long mstep;
    if ((rc = dflash_manifest_verify(dir, &mstep, NULL, err, errlen)) < 0)
        goto out;
    snprintf(path, sizeof(path), "%s/trainer_state.json", dir);
    json_error_t je;
    st = json_load_file(path, 0, &je);
    if (!st) {
        rc = df_err(err, errlen, -EINVAL, "%s: line %d: %s", path, je.line, je.text);
        goto out;
    }
    if (json_integer_value(json_object_get(st, "version")) != 1) {
        rc = df_err(err, errlen, -EINVAL, "%s: field \"version\": expected 1", path);
        goto out;
    }
    if ((rc = dflash_config_from_json(c, json_object_get(st, "config"), path, err, errlen)) < 0)
        goto out;
    json_t *sj = json_object_get(st, "step");
    if (!json_is_integer(sj) || json_integer_value(sj) != mstep) {
        rc = df_err(err, errlen, -EINVAL, "%s: field \"step\" is %lld, manifest.json says %ld", path,
                    (long long)json_integer_value(sj), mstep);
        goto out;
    }
    if (ts) {
        memset(ts, 0, sizeof(*ts));
        ts->step = (long)json_integer_value(json_object_get(st, "step"));
        json_t *jep = json_object_get(st, "epoch"), *jl = json_object_get(st, "ledger_committed_step");
        if (!json_is_integer(jep) || json_integer_value(jep) < 0 || !json_is_integer(jl) ||
            json_integer_value(jl) < 0) {
            rc = df_err(err, errlen, -EINVAL, "%s: fields \"epoch\"/\"ledger_committed_step\" must be integers >= 0",
                        path);
            goto out;
        }
        ts->epoch = (long)json_integer_value(jep);
        ts->ledger_committed_step = (long)json_integer_value(jl);
        json_t *r = json_object_get(st, "rng");
        if (parse_hex(json_object_get(st, "seed"), &ts->seed) < 0 || json_array_size(r) != 4) {
            rc = df_err(err, errlen, -EINVAL, "%s: fields \"seed\"/\"rng\" must be hex strings (rng: 4 of them)", path);
            goto out;
        }
        for (int i = 0; i < 4; i++)
            if (parse_hex(json_array_get(r, (size_t)i), &ts->rng.s[i]) < 0) {
                rc = df_err(err, errlen, -EINVAL, "%s: field \"rng[%d]\" is not a hex string", path, i);
                goto out;
            }
    }
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    if ((rc = safetensors_open(&mf, path, err, errlen)) < 0)
        goto out;
    mf_open = 1;
    if ((rc = dflash_params_alloc(p, c)) < 0) {
        rc = df_err(err, errlen, rc, "%s: out of memory", path);
        goto out;
    }
    if ((rc = read_params(&mf, c, p->data, "", err, errlen)) < 0)
        goto out;
    if (opt) {
        json_t *oj = json_object_get(st, "optimizer");
        snprintf(path, sizeof(path), "%s/optimizer.safetensors", dir);
        if (!json_is_object(oj) || access(path, F_OK) != 0) {
            rc = df_err(err, errlen, -ENOENT, "%s: checkpoint has no optimizer state", dir);
            goto out;
        }
        adamw_config a;
        json_int_t total = 0, ostep = 0;
        if (json_unpack(oj, "{s:F, s:F, s:F, s:F, s:F, s:F, s:F, s:F, s:I, s:I}", "lr", &a.lr, "min_lr", &a.min_lr,
                        "beta1", &a.beta1, "beta2", &a.beta2, "eps", &a.eps, "weight_decay", &a.weight_decay,
                        "warmup_frac", &a.warmup_frac, "clip_norm", &a.clip_norm, "total_steps", &total, "step",
                        &ostep) != 0) {
            rc = df_err(err, errlen, -EINVAL,
                        "%s/trainer_state.json: object \"optimizer\" lacks a field or has a wrong type", dir);
            goto out;
        }
        if (total < 0 || ostep < 0) {
            rc = df_err(err, errlen, -EINVAL,
                        "%s/trainer_state.json: \"optimizer.total_steps\"/\"optimizer.step\" must be >= 0", dir);
            goto out;
        }
        a.total_steps = (long)total;
        if ((rc = adamw_init(opt, &a, p->n)) < 0) {
            rc = df_err(err, errlen, rc, "%s/trainer_state.json: optimizer settings rejected", dir);
            goto out;
        }
        opt->step = (long)ostep;
        if ((rc = safetensors_open(&of, path, err, errlen)) < 0)
            goto out;
        of_open = 1;
        if ((rc = read_params(&of, c, opt->m, "m.", err, errlen)) < 0 ||
            (rc = read_params(&of, c, opt->v, "v.", err, errlen)) < 0)
            goto out;
    }
    rc = 0;
out:
    if (mf_open)
        safetensors_close(&mf);
    if (of_open)
        safetensors_close(&of);
    json_decref(st);
    if (rc < 0) {
        dflash_params_free(p);
        if (opt)
            adamw_free(opt);
    }
    return rc;
}

int dflash_export_release(const char *dir, const dflash_config *c, const dflash_params *p, char *err, size_t errlen)
{
    int rc;
    char path[4200];
    if ((rc = df_mkdir_p(dir, 0700)) < 0) {
        rc = df_err(err, errlen, rc, "%s: cannot create: %s", dir, strerror(-rc));
        goto out;
    }
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    if ((rc = write_params(path, c, p->data, "", SAFETENSORS_BF16, NULL)) < 0) {
        rc = df_err(err, errlen, rc, "%s: %s", path, strerror(-rc));
        goto out;
    }
    snprintf(path, sizeof(path), "%s/dflash.py", dir);
    if ((rc = df_write_file_atomic(path, dflash_modeling_py, dflash_modeling_py_len)) < 0) {
        rc = df_err(err, errlen, rc, "%s: %s", path, strerror(-rc));
        goto out;
    }
    /* config.json last: its auto_map names dflash.py, which is in place by now */
    snprintf(path, sizeof(path), "%s/config.json", dir);
    if ((rc = dflash_config_write_release(c, path)) < 0) {
        rc = df_err(err, errlen, rc, "%s: %s", path, strerror(-rc));
        goto out;
    }
    rc = 0;
out:
    return rc;
}

int dflash_load_release(const char *dir, dflash_config *c, dflash_params *p, char *err, size_t errlen)
{
    int rc;
    char path[4200];
    safetensors_file f = {0};
    int f_open = 0;
    memset(p, 0, sizeof(*p));
    snprintf(path, sizeof(path), "%s/config.json", dir);
    if ((rc = dflash_config_read_release(c, path, err, errlen)) < 0)
        goto out;
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    if ((rc = safetensors_open(&f, path, err, errlen)) < 0)
        goto out;
    f_open = 1;
    if ((rc = dflash_params_alloc(p, c)) < 0) {
        rc = df_err(err, errlen, rc, "%s: out of memory", path);
        goto out;
    }
    rc = read_params(&f, c, p->data, "", err, errlen);
out:
    if (f_open)
        safetensors_close(&f);
    if (rc < 0)
        dflash_params_free(p);
    return rc;
}
