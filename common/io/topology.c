/* topology.c: parse and validate the topology JSON (version 1) into a `topo`.
 *
 * Shape: one pass over the document in schema order, one small getter per JSON type
 * (get_int, get_num, get_str, ...), each of which either stores a value (or its default)
 * or writes ONE message "<source>: <json path>: expected ..., got ..." and returns -EINVAL.
 * The first error stops the parse: an operator fixes one thing at a time, and a single clear
 * message beats a cascade. Objects are checked for unknown keys before their fields, so a
 * typo ("gpuu") is reported as such rather than as a missing key. Cross-references (ring
 * names, drafter ranks, producers/consumers per ring) are checked after everything parsed.
 * The schema with every default and limit is docs/topology.md.
 */
#include "io/topology.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* --- error reporting ------------------------------------------------------------------- */

typedef struct pctx {
    char *err;
    size_t errlen;
    const char *src; /* prefix of every message */
    topo_backend backend;
} pctx;

static int fail(pctx *c, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(pctx *c, const char *path, const char *fmt, ...)
{
    if (c->err && c->errlen > 0) {
        int n = snprintf(c->err, c->errlen, "%s: %s: ", c->src, path[0] ? path : "(top level)");
        if (n >= 0 && (size_t)n < c->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return -EINVAL;
}

/* A short rendering of a JSON value for "got ...": scalars as JSON text, containers by kind. */
static void describe(const json_t *v, char *buf, size_t n)
{
    if (!v) {
        snprintf(buf, n, "nothing");
        return;
    }
    if (json_is_object(v)) {
        snprintf(buf, n, "an object");
        return;
    }
    if (json_is_array(v)) {
        snprintf(buf, n, "an array");
        return;
    }
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(10));
    if (!s) {
        snprintf(buf, n, "?");
        return;
    }
    if (strlen(s) > 40)
        snprintf(buf, n, "%.37s...", s);
    else
        snprintf(buf, n, "%s", s);
    free(s);
}

#define GOT_LEN 64

static void join(char *out, size_t n, const char *path, const char *key)
{
    if (path[0])
        snprintf(out, n, "%s.%s", path, key);
    else
        snprintf(out, n, "%s", key);
}

/* Reject keys of obj that are not in allowed (NULL-terminated). */
static int check_keys(pctx *c, const json_t *obj, const char *path, const char *const *allowed)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        int ok = 0;
        for (const char *const *a = allowed; *a; a++)
            if (strcmp(*a, key) == 0) {
                ok = 1;
                break;
            }
        if (!ok) {
            char p[256];
            join(p, sizeof p, path, key);
            return fail(c, p, "unknown key");
        }
    }
    return 0;
}

/* --- typed getters: value or default, or one error ----------------------------------------- */

enum { OPTIONAL = 0, REQUIRED = 1 };

static int get_int(pctx *c, const json_t *obj, const char *path, const char *key, int req,
                   int64_t lo, int64_t hi, int64_t def, int64_t *out)
{
    char p[256], got[GOT_LEN];
    join(p, sizeof p, path, key);
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (req)
            return fail(c, p, "required key missing");
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        describe(v, got, sizeof got);
        if (hi == INT64_MAX)
            return fail(c, p, "expected an integer >= %" PRId64 ", got %s", lo, got);
        return fail(c, p, "expected an integer %" PRId64 "..%" PRId64 ", got %s", lo, hi, got);
    }
    *out = json_integer_value(v);
    return 0;
}

static int get_u32(pctx *c, const json_t *obj, const char *path, const char *key, int64_t lo,
                   int64_t hi, int64_t def, uint32_t *out)
{
    int64_t x;
    int rc = get_int(c, obj, path, key, OPTIONAL, lo, hi, def, &x);
    if (rc == 0)
        *out = (uint32_t)x;
    return rc;
}

/* A number (integer or real) in [lo, hi] (lo excluded when lo_open); what = "a number > 0". */
static int get_num(pctx *c, const json_t *obj, const char *path, const char *key, double lo,
                   int lo_open, double hi, const char *what, double def, double *out)
{
    char p[256], got[GOT_LEN];
    join(p, sizeof p, path, key);
    json_t *v = json_object_get(obj, key);
    if (!v) {
        *out = def;
        return 0;
    }
    double x = json_is_number(v) ? json_number_value(v) : 0.0;
    if (!json_is_number(v) || x < lo || (lo_open && x == lo) || x > hi) {
        describe(v, got, sizeof got);
        return fail(c, p, "expected %s, got %s", what, got);
    }
    *out = x;
    return 0;
}

static int get_bool(pctx *c, const json_t *obj, const char *path, const char *key, int def,
                    int *out)
{
    char p[256], got[GOT_LEN];
    join(p, sizeof p, path, key);
    json_t *v = json_object_get(obj, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v)) {
        describe(v, got, sizeof got);
        return fail(c, p, "expected true or false, got %s", got);
    }
    *out = json_is_true(v);
    return 0;
}

/* A non-empty string (strdup'ed into *out), or NULL for a missing/null optional one. */
static int get_str(pctx *c, const json_t *obj, const char *path, const char *key, int req,
                   int nullable, char **out)
{
    char p[256], got[GOT_LEN];
    join(p, sizeof p, path, key);
    json_t *v = json_object_get(obj, key);
    if (!v && req)
        return fail(c, p, "required key missing");
    if (!v || (nullable && json_is_null(v))) {
        *out = NULL;
        return 0;
    }
    if (!json_is_string(v) || json_string_length(v) == 0 || strlen(json_string_value(v)) != json_string_length(v)) {
        describe(v, got, sizeof got);
        return fail(c, p, "expected a non-empty string%s, got %s", nullable ? " or null" : "", got);
    }
    *out = strdup(json_string_value(v));
    return *out ? 0 : -ENOMEM;
}

static int name_ok(const char *s, size_t maxlen)
{
    size_t n = strlen(s);
    if (n < 1 || n > maxlen)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-'))
            return 0;
    }
    return 1;
}

/* A worker or ring name: 1..31 chars [a-z0-9_-]. */
static int get_name(pctx *c, const json_t *obj, const char *path, const char *key, char out[32])
{
    char p[256], got[GOT_LEN];
    join(p, sizeof p, path, key);
    json_t *v = json_object_get(obj, key);
    if (!v)
        return fail(c, p, "required key missing");
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v) ||
        !name_ok(json_string_value(v), 31)) {
        describe(v, got, sizeof got);
        return fail(c, p, "expected 1..31 characters [a-z0-9_-], got %s", got);
    }
    snprintf(out, 32, "%s", json_string_value(v));
    return 0;
}

/* A gpu field, checked against the backend: -1 with "cpu", 0..7 with "cuda". */
static int get_gpu(pctx *c, const json_t *obj, const char *path, int *out)
{
    char p[256], got[GOT_LEN];
    join(p, sizeof p, path, "gpu");
    json_t *v = json_object_get(obj, "gpu");
    if (!v) {
        if (c->backend == TOPO_CUDA)
            return fail(c, p, "required with backend \"cuda\"");
        *out = -1;
        return 0;
    }
    int64_t x = json_is_integer(v) ? json_integer_value(v) : -2;
    describe(v, got, sizeof got);
    if (x < -1 || x > TOPO_MAX_GPU)
        return fail(c, p, "expected an integer -1..%d, got %s", TOPO_MAX_GPU, got);
    if (c->backend == TOPO_CPU && x != -1)
        return fail(c, p, "expected -1 with backend \"cpu\", got %s", got);
    if (c->backend == TOPO_CUDA && x < 0)
        return fail(c, p, "expected an integer 0..%d with backend \"cuda\", got %s", TOPO_MAX_GPU, got);
    *out = (int)x;
    return 0;
}

/* An object member that must be an object when present; *out NULL when absent. */
static int get_obj(pctx *c, const json_t *obj, const char *path, const char *key, int req,
                   json_t **out)
{
    char p[256], got[GOT_LEN];
    join(p, sizeof p, path, key);
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (!v)
        return req ? fail(c, p, "required key missing") : 0;
    if (!json_is_object(v)) {
        describe(v, got, sizeof got);
        return fail(c, p, "expected an object, got %s", got);
    }
    *out = v;
    return 0;
}

static void free_strv(char **v)
{
    if (!v)
        return;
    for (char **p = v; *p; p++)
        free(*p);
    free(v);
}

/* --- sections ------------------------------------------------------------------------------ */

static int parse_target(pctx *c, topo *t, const json_t *root)
{
    static const char *const keys[] = {"model_dir", "capture_layers", NULL};
    json_t *o;
    char got[GOT_LEN];
    int rc = get_obj(c, root, "", "target", REQUIRED, &o);
    if (rc == 0)
        rc = check_keys(c, o, "target", keys);
    if (rc == 0)
        rc = get_str(c, o, "target", "model_dir", REQUIRED, 0, &t->target_model_dir);
    if (rc)
        return rc;
    json_t *cl = json_object_get(o, "capture_layers");
    if (!cl)
        return fail(c, "target.capture_layers", "required key missing");
    if (!json_is_array(cl) || json_array_size(cl) == 0 || json_array_size(cl) > 256) {
        describe(cl, got, sizeof got);
        return fail(c, "target.capture_layers",
                    "expected a non-empty array (at most 256) of layer indices, got %s%s", got,
                    json_is_array(cl) ? (json_array_size(cl) ? " of more than 256" : " that is empty") : "");
    }
    t->n_capture = (int)json_array_size(cl);
    t->capture_layers = calloc((size_t)t->n_capture, sizeof(int));
    if (!t->capture_layers)
        return -ENOMEM;
    for (int i = 0; i < t->n_capture; i++) {
        json_t *v = json_array_get(cl, (size_t)i);
        char p[64];
        snprintf(p, sizeof p, "target.capture_layers[%d]", i);
        describe(v, got, sizeof got);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1023)
            return fail(c, p, "expected an integer 0..1023, got %s", got);
        int x = (int)json_integer_value(v);
        if (i > 0 && x <= t->capture_layers[i - 1])
            return fail(c, p, "expected an integer > %d (strictly increasing), got %s",
                        t->capture_layers[i - 1], got);
        t->capture_layers[i] = x;
    }
    return 0;
}

static int parse_drafter(pctx *c, topo *t, const json_t *root)
{
    static const char *const keys[] = {"num_layers", "block_size", "num_anchors", "gamma", "lr",
        "warmup_frac", "weight_decay", "grad_clip", "noise_std", "epochs", "checkpoint_every",
        "keep_checkpoints", "max_checkpoint_failures", "max_nonfinite_steps", "allreduce_bucket_kb", "init_dir", "mask_token_id", NULL};
    topo_drafter *d = &t->drafter;
    json_t *o;
    int rc = get_obj(c, root, "", "drafter", OPTIONAL, &o);
    if (rc)
        return rc;
    json_t *empty = NULL;
    if (!o) {
        empty = json_object();
        if (!empty)
            return -ENOMEM;
        o = empty;
    }
    const char *P = "drafter";
    rc = check_keys(c, o, P, keys);
    if (!rc) rc = get_u32(c, o, P, "num_layers", 1, 64, 1, &d->num_layers);
    if (!rc) rc = get_u32(c, o, P, "block_size", 2, 1024, 16, &d->block_size);
    if (!rc) rc = get_u32(c, o, P, "num_anchors", 1, 65536, 64, &d->num_anchors);
    if (!rc) rc = get_num(c, o, P, "gamma", 0, 1, 1e6, "a number > 0", 7.0, &d->gamma);
    if (!rc) rc = get_num(c, o, P, "lr", 0, 1, 10, "a number in (0, 10]", 6e-4, &d->lr);
    if (!rc) rc = get_num(c, o, P, "warmup_frac", 0, 0, 1, "a number 0..1", 0.04, &d->warmup_frac);
    if (!rc) rc = get_num(c, o, P, "weight_decay", 0, 0, 10, "a number 0..10", 0.0, &d->weight_decay);
    if (!rc) rc = get_num(c, o, P, "grad_clip", 0, 0, 1e9, "a number >= 0 (0 = off)", 1.0, &d->grad_clip);
    if (!rc) rc = get_num(c, o, P, "noise_std", 0, 0, 1e3, "a number 0..1000", 0.0, &d->noise_std);
    if (!rc) rc = get_u32(c, o, P, "epochs", 1, 100000, 1, &d->epochs);
    if (!rc) rc = get_u32(c, o, P, "checkpoint_every", 1, 1000000000, 50, &d->checkpoint_every);
    /* 0 = keep every checkpoint; otherwise the newest N step dirs (never the committed one) */
    if (!rc) rc = get_u32(c, o, P, "keep_checkpoints", 0, 1000000, 3, &d->keep_checkpoints);
    /* consecutive failed checkpoints before the drafter gives up (exit 100): a full disk is
     * reported within N * checkpoint_every steps, not at the end of the run */
    if (!rc) rc = get_u32(c, o, P, "max_checkpoint_failures", 1, 1000000, 3, &d->max_checkpoint_failures);
    if (!rc) rc = get_u32(c, o, P, "max_nonfinite_steps", 1, 1000000, 3, &d->max_nonfinite_steps);
    /* gradient all-reduce buckets (several drafter ranks): at least this many KiB each, cut
     * at layer boundaries; 0 = one bucket per layer. 16 MiB by default */
    if (!rc) rc = get_u32(c, o, P, "allreduce_bucket_kb", 0, 4194304, 16384, &d->allreduce_bucket_kb);
    if (!rc) rc = get_str(c, o, P, "init_dir", OPTIONAL, 1, &d->init_dir);
    if (!rc) {
        json_t *v = json_object_get(o, "mask_token_id");
        d->mask_token_id = -1;
        if (v && !json_is_null(v)) {
            char got[GOT_LEN];
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
                describe(v, got, sizeof got);
                rc = fail(c, "drafter.mask_token_id", "expected an integer 0..%d or null, got %s",
                          INT32_MAX, got);
            } else {
                d->mask_token_id = json_integer_value(v);
            }
        }
    }
    json_decref(empty);
    return rc;
}

static int parse_data(pctx *c, topo *t, const json_t *root)
{
    static const char *const keys[] = {"shards", "token_budget", "max_seq_len", NULL};
    json_t *o;
    char got[GOT_LEN];
    int64_t x;
    int rc = get_obj(c, root, "", "data", REQUIRED, &o);
    if (!rc)
        rc = check_keys(c, o, "data", keys);
    if (rc)
        return rc;
    json_t *sh = json_object_get(o, "shards");
    if (!sh)
        return fail(c, "data.shards", "required key missing");
    if (!json_is_array(sh) || json_array_size(sh) == 0 || json_array_size(sh) > 100000) {
        describe(sh, got, sizeof got);
        return fail(c, "data.shards", "expected a non-empty array of file names, got %s%s", got,
                    json_is_array(sh) && json_array_size(sh) == 0 ? " that is empty" : "");
    }
    t->n_shards = (int)json_array_size(sh);
    t->shards = calloc((size_t)t->n_shards, sizeof(char *));
    if (!t->shards)
        return -ENOMEM;
    for (int i = 0; i < t->n_shards; i++) {
        json_t *v = json_array_get(sh, (size_t)i);
        char p[64];
        snprintf(p, sizeof p, "data.shards[%d]", i);
        if (!json_is_string(v) || json_string_length(v) == 0 ||
            strlen(json_string_value(v)) != json_string_length(v)) {
            describe(v, got, sizeof got);
            return fail(c, p, "expected a non-empty string, got %s", got);
        }
        if (!(t->shards[i] = strdup(json_string_value(v))))
            return -ENOMEM;
    }
    /* at most INT32_MAX: a batch's T is a uint32 in its header and the target sizes its
     * workspace with an int; a larger budget would be truncated there, not refused */
    rc = get_int(c, o, "data", "token_budget", OPTIONAL, 1, INT32_MAX, 2048, &x);
    if (rc)
        return rc;
    t->token_budget = (uint64_t)x;
    rc = get_u32(c, o, "data", "max_seq_len", 1, 1 << 20, 512, &t->max_seq_len);
    if (rc)
        return rc;
    if (t->token_budget < t->max_seq_len)
        return fail(c, "data.token_budget", "expected at least data.max_seq_len (%u), got %" PRIu64,
                    t->max_seq_len, t->token_budget);
    return 0;
}

static int parse_rings(pctx *c, topo *t, const json_t *root)
{
    static const char *const keys[] = {"name", "slots", "slot_bytes", "max_attempts", "gpu", NULL};
    char got[GOT_LEN];
    json_t *a = json_object_get(root, "rings");
    if (!a)
        return fail(c, "rings", "required key missing");
    if (!json_is_array(a) || json_array_size(a) < 1 || json_array_size(a) > TOPO_MAX_RINGS) {
        if (json_is_array(a))
            snprintf(got, sizeof got, "%zu", json_array_size(a));
        else
            describe(a, got, sizeof got);
        return fail(c, "rings", "expected an array of 1..%d rings, got %s", TOPO_MAX_RINGS, got);
    }
    t->n_rings = (int)json_array_size(a);
    t->rings = calloc((size_t)t->n_rings, sizeof(topo_ring));
    if (!t->rings)
        return -ENOMEM;
    for (int i = 0; i < t->n_rings; i++) {
        topo_ring *r = &t->rings[i];
        json_t *o = json_array_get(a, (size_t)i);
        char p[64];
        int64_t x;
        snprintf(p, sizeof p, "rings[%d]", i);
        if (!json_is_object(o)) {
            describe(o, got, sizeof got);
            return fail(c, p, "expected an object, got %s", got);
        }
        int rc = check_keys(c, o, p, keys);
        if (!rc) rc = get_name(c, o, p, "name", r->name);
        if (!rc) rc = get_u32(c, o, p, "slots", 1, 4096, 8, &r->slots);
        if (!rc) rc = get_int(c, o, p, "slot_bytes", OPTIONAL, 4096, (int64_t)1 << 40, 4194304, &x);
        if (rc)
            return rc;
        r->slot_bytes = (uint64_t)x;
        if (!rc) rc = get_u32(c, o, p, "max_attempts", 1, 100, 3, &r->max_attempts);
        if (!rc) rc = get_gpu(c, o, p, &r->gpu);
        if (rc)
            return rc;
        for (int j = 0; j < i; j++)
            if (strcmp(t->rings[j].name, r->name) == 0) {
                char q[80];
                snprintf(q, sizeof q, "%s.name", p);
                return fail(c, q, "duplicate ring name \"%s\" (also rings[%d])", r->name, j);
            }
    }
    return 0;
}

static int parse_ring_ref(pctx *c, topo *t, const json_t *o, const char *path, const char *key,
                          int *out)
{
    char p[256], got[GOT_LEN];
    join(p, sizeof p, path, key);
    json_t *v = json_object_get(o, key);
    *out = -1;
    if (!v)
        return 0;
    if (!json_is_string(v)) {
        describe(v, got, sizeof got);
        return fail(c, p, "expected a ring name, got %s", got);
    }
    int k = topo_find_ring(t, json_string_value(v));
    if (k < 0) {
        describe(v, got, sizeof got);
        return fail(c, p, "unknown ring %s", got);
    }
    *out = k;
    return 0;
}

static int parse_env(pctx *c, topo_worker *w, const json_t *o, const char *path)
{
    char p[256], got[GOT_LEN];
    join(p, sizeof p, path, "env");
    json_t *e = json_object_get(o, "env");
    size_t n = e && json_is_object(e) ? json_object_size(e) : 0;
    if (e && !json_is_object(e)) {
        describe(e, got, sizeof got);
        return fail(c, p, "expected an object of \"NAME\": \"value\" strings, got %s", got);
    }
    w->env = calloc(n + 1, sizeof(char *));
    if (!w->env)
        return -ENOMEM;
    if (!e)
        return 0;
    const char *key;
    json_t *v;
    size_t i = 0;
    json_object_foreach(e, key, v) {
        char q[300];
        snprintf(q, sizeof q, "%s.%s", p, key);
        int ok = key[0] && !(key[0] >= '0' && key[0] <= '9');
        for (const char *s = key; *s; s++)
            if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_'))
                ok = 0;
        if (!ok)
            return fail(c, q, "expected a variable name [A-Za-z_][A-Za-z0-9_]*");
        if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v)) {
            describe(v, got, sizeof got);
            return fail(c, q, "expected a string, got %s", got);
        }
        size_t len = strlen(key) + 1 + json_string_length(v) + 1;
        if (!(w->env[i] = malloc(len)))
            return -ENOMEM;
        snprintf(w->env[i], len, "%s=%s", key, json_string_value(v));
        i++;
    }
    return 0;
}

static int parse_args(pctx *c, topo_worker *w, const json_t *o, const char *path)
{
    char p[256], got[GOT_LEN];
    join(p, sizeof p, path, "args");
    json_t *a = json_object_get(o, "args");
    if (a && !json_is_array(a)) {
        describe(a, got, sizeof got);
        return fail(c, p, "expected an array of strings, got %s", got);
    }
    size_t n = a ? json_array_size(a) : 0;
    w->args = calloc(n + 1, sizeof(char *));
    if (!w->args)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v)) {
            char q[300];
            snprintf(q, sizeof q, "%s[%zu]", p, i);
            describe(v, got, sizeof got);
            return fail(c, q, "expected a string, got %s", got);
        }
        if (!(w->args[i] = strdup(json_string_value(v))))
            return -ENOMEM;
    }
    return 0;
}

static int parse_workers(pctx *c, topo *t, const json_t *root)
{
    static const char *const keys[] = {"name", "role", "gpu", "in", "out", "rank",
                                       "heartbeat_timeout_ms", "env", "args", NULL};
    static const char *const roles[] = {"target", "postproc", "drafter", "test"};
    char got[GOT_LEN];
    json_t *a = json_object_get(root, "workers");
    if (!a)
        return fail(c, "workers", "required key missing");
    if (!json_is_array(a) || json_array_size(a) < 1 || json_array_size(a) > TOPO_MAX_WORKERS) {
        if (json_is_array(a))
            snprintf(got, sizeof got, "%zu", json_array_size(a));
        else
            describe(a, got, sizeof got);
        return fail(c, "workers", "expected an array of 1..%d workers, got %s", TOPO_MAX_WORKERS, got);
    }
    /* n_workers counts allocated entries from the start, so topo_free can walk a half-filled
     * array (env/args NULL until parsed). */
    t->n_workers = (int)json_array_size(a);
    t->workers = calloc((size_t)t->n_workers, sizeof(topo_worker));
    if (!t->workers)
        return -ENOMEM;
    /* R, the drafter group size, bounds every rank: count the drafters up front. */
    int n_drafters = 0, drafter_idx = 0;
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *rv = json_object_get(json_array_get(a, i), "role");
        n_drafters += json_is_string(rv) && strcmp(json_string_value(rv), "drafter") == 0;
    }
    for (int i = 0; i < t->n_workers; i++) {
        topo_worker *w = &t->workers[i];
        json_t *o = json_array_get(a, (size_t)i);
        char p[64], q[96];
        snprintf(p, sizeof p, "workers[%d]", i);
        w->in_ring = w->out_ring = w->rank = -1;
        if (!json_is_object(o)) {
            describe(o, got, sizeof got);
            return fail(c, p, "expected an object, got %s", got);
        }
        int rc = check_keys(c, o, p, keys);
        if (!rc) rc = get_name(c, o, p, "name", w->name);
        if (rc)
            return rc;
        for (int j = 0; j < i; j++)
            if (strcmp(t->workers[j].name, w->name) == 0) {
                snprintf(q, sizeof q, "%s.name", p);
                return fail(c, q, "duplicate worker name \"%s\" (also workers[%d])", w->name, j);
            }
        json_t *rv = json_object_get(o, "role");
        snprintf(q, sizeof q, "%s.role", p);
        if (!rv)
            return fail(c, q, "required key missing");
        int role = -1;
        for (int k = 0; k < 4 && json_is_string(rv); k++)
            if (strcmp(json_string_value(rv), roles[k]) == 0)
                role = k;
        if (role < 0) {
            describe(rv, got, sizeof got);
            return fail(c, q, "expected \"target\", \"postproc\", \"drafter\" or \"test\", got %s", got);
        }
        w->role = (topo_role)role;
        rc = get_gpu(c, o, p, &w->gpu);
        if (!rc) rc = parse_ring_ref(c, t, o, p, "in", &w->in_ring);
        if (!rc) rc = parse_ring_ref(c, t, o, p, "out", &w->out_ring);
        if (rc)
            return rc;
        const char *rn = roles[role];
        if ((w->role == TOPO_ROLE_TARGET) && w->in_ring >= 0) {
            snprintf(q, sizeof q, "%s.in", p);
            return fail(c, q, "a %s worker reads no ring (remove \"in\")", rn);
        }
        if (w->role == TOPO_ROLE_DRAFTER && w->out_ring >= 0) {
            snprintf(q, sizeof q, "%s.out", p);
            return fail(c, q, "a %s worker writes no ring (remove \"out\")", rn);
        }
        if ((w->role == TOPO_ROLE_POSTPROC || w->role == TOPO_ROLE_DRAFTER) && w->in_ring < 0) {
            snprintf(q, sizeof q, "%s.in", p);
            return fail(c, q, "required for role \"%s\"", rn);
        }
        if ((w->role == TOPO_ROLE_TARGET || w->role == TOPO_ROLE_POSTPROC) && w->out_ring < 0) {
            snprintf(q, sizeof q, "%s.out", p);
            return fail(c, q, "required for role \"%s\"", rn);
        }
        if (w->in_ring >= 0 && w->in_ring == w->out_ring) {
            snprintf(q, sizeof q, "%s.out", p);
            return fail(c, q, "same ring as \"in\" (\"%s\")", t->rings[w->in_ring].name);
        }
        json_t *rk = json_object_get(o, "rank");
        snprintf(q, sizeof q, "%s.rank", p);
        if (rk && w->role != TOPO_ROLE_DRAFTER)
            return fail(c, q, "only drafter workers have a rank");
        if (w->role == TOPO_ROLE_DRAFTER) {
            int64_t x;
            /* default: the order among drafters; uniqueness is checked in cross_check */
            rc = get_int(c, o, p, "rank", OPTIONAL, 0, n_drafters - 1, drafter_idx, &x);
            if (rc)
                return rc;
            w->rank = (int)x;
            drafter_idx++;
        }
        rc = get_u32(c, o, p, "heartbeat_timeout_ms", 100, 86400000, t->sup.heartbeat_timeout_ms,
                     &w->heartbeat_timeout_ms);
        if (!rc) rc = parse_env(c, w, o, p);
        if (!rc) rc = parse_args(c, w, o, p);
        if (rc)
            return rc;
    }
    return 0;
}

static int parse_supervision(pctx *c, topo *t, const json_t *root)
{
    static const char *const keys[] = {"backoff_initial_ms", "backoff_max_ms", "stable_ms",
        "max_restarts", "restart_window_s", "heartbeat_timeout_ms", "shutdown_timeout_ms",
        "metrics_interval_ms", NULL};
    topo_supervision *s = &t->sup;
    json_t *o, *empty = NULL;
    int rc = get_obj(c, root, "", "supervision", OPTIONAL, &o);
    if (rc)
        return rc;
    if (!o && !(o = empty = json_object()))
        return -ENOMEM;
    const char *P = "supervision";
    rc = check_keys(c, o, P, keys);
    if (!rc) rc = get_u32(c, o, P, "backoff_initial_ms", 1, 3600000, 100, &s->backoff_initial_ms);
    if (!rc) rc = get_u32(c, o, P, "backoff_max_ms", 1, 3600000, 5000, &s->backoff_max_ms);
    if (!rc) rc = get_u32(c, o, P, "stable_ms", 1, 86400000, 10000, &s->stable_ms);
    if (!rc) rc = get_u32(c, o, P, "max_restarts", 0, 1000000, 5, &s->max_restarts);
    if (!rc) rc = get_u32(c, o, P, "restart_window_s", 1, 86400, 60, &s->restart_window_s);
    if (!rc) rc = get_u32(c, o, P, "heartbeat_timeout_ms", 100, 86400000, 10000, &s->heartbeat_timeout_ms);
    if (!rc) rc = get_u32(c, o, P, "shutdown_timeout_ms", 1, 3600000, 5000, &s->shutdown_timeout_ms);
    if (!rc) rc = get_u32(c, o, P, "metrics_interval_ms", 10, 3600000, 1000, &s->metrics_interval_ms);
    if (!rc && s->backoff_max_ms < s->backoff_initial_ms)
        rc = fail(c, "supervision.backoff_max_ms",
                  "expected at least supervision.backoff_initial_ms (%u), got %u",
                  s->backoff_initial_ms, s->backoff_max_ms);
    json_decref(empty);
    return rc;
}

/* --- the ring graph (docs/topology.md, "The ring graph") ---------------------------------------
 * Stage order: a postproc reads only rings that targets write, a drafter only rings that
 * postprocs write ("test" workers stand for any stage and are exempt). No cycle: following
 * in -> out through the workers never comes back to a ring, or batches would circulate
 * forever and the epoch could never end. */

/* the stage that must write the ring a worker of role r reads; -1: any (or none) */
static int wanted_producer(topo_role r)
{
    return r == TOPO_ROLE_POSTPROC ? (int)TOPO_ROLE_TARGET : r == TOPO_ROLE_DRAFTER ? (int)TOPO_ROLE_POSTPROC : -1;
}

static int check_stage_order(pctx *c, const topo *t)
{
    char p[96];
    for (int i = 0; i < t->n_workers; i++) {
        const topo_worker *w = &t->workers[i];
        int want = wanted_producer(w->role);
        if (want < 0 || w->in_ring < 0)
            continue;
        for (int j = 0; j < t->n_workers; j++) {
            const topo_worker *pw = &t->workers[j];
            if (pw->out_ring != w->in_ring || pw->role == TOPO_ROLE_TEST || (int)pw->role == want)
                continue;
            snprintf(p, sizeof p, "workers[%d].in", i);
            return fail(c, p,
                        "ring \"%s\" is written by workers[%d] \"%s\" (role %s), but a %s reads only what a %s "
                        "writes (stage order target -> postproc -> drafter)",
                        t->rings[w->in_ring].name, j, pw->name, topo_role_name(pw->role), topo_role_name(w->role),
                        topo_role_name((topo_role)want));
        }
    }
    return 0;
}

/* depth-first search from ring r; on[] marks the rings on the current path, done[] the rings
 * whose every successor is known to be cycle-free. On a cycle, path[0..*n) holds the workers
 * along it, from the worker that reads r back to r. */
static int ring_dfs(const topo *t, int r, char *on, char *done, int *path, int *n, int *start)
{
    if (on[r]) {
        *start = r;
        return 1;
    }
    if (done[r])
        return 0;
    on[r] = 1;
    for (int i = 0; i < t->n_workers; i++) {
        const topo_worker *w = &t->workers[i];
        if (w->in_ring != r || w->out_ring < 0)
            continue;
        path[(*n)++] = i;
        if (ring_dfs(t, w->out_ring, on, done, path, n, start))
            return 1;
        (*n)--;
    }
    on[r] = 0;
    done[r] = 1;
    return 0;
}

static int check_no_cycle(pctx *c, const topo *t)
{
    char on[TOPO_MAX_RINGS] = {0}, done[TOPO_MAX_RINGS] = {0}, p[32], desc[1024];
    int path[TOPO_MAX_WORKERS + 1], n = 0, start = -1;
    for (int r = 0; r < t->n_rings; r++) {
        if (!ring_dfs(t, r, on, done, path, &n, &start))
            continue;
        /* path runs from ring r; the cycle is the part from the first worker reading start */
        int k = 0;
        while (k < n && t->workers[path[k]].in_ring != start)
            k++;
        size_t o = (size_t)snprintf(desc, sizeof desc, "%s", t->rings[start].name);
        for (; k < n && o < sizeof desc; k++) {
            const topo_worker *w = &t->workers[path[k]];
            o += (size_t)snprintf(desc + o, sizeof desc - o, " -> workers[%d] \"%s\" -> %s", path[k], w->name,
                                  t->rings[w->out_ring].name);
        }
        snprintf(p, sizeof p, "rings[%d]", start);
        return fail(c, p, "ring \"%s\" is part of a cycle: %s (batches would flow back into it)",
                    t->rings[start].name, desc);
    }
    return 0;
}

/* Every ring needs a producer and a consumer, the stages come in order without a cycle;
 * drafter ranks are 0..R-1, each once. */
static int cross_check(pctx *c, topo *t)
{
    char p[96];
    for (int r = 0; r < t->n_rings; r++) {
        int prod = 0, cons = 0;
        for (int i = 0; i < t->n_workers; i++) {
            prod += t->workers[i].out_ring == r;
            cons += t->workers[i].in_ring == r;
        }
        snprintf(p, sizeof p, "rings[%d]", r);
        if (!prod)
            return fail(c, p, "ring \"%s\" has no producer (no worker has \"out\": \"%s\")",
                        t->rings[r].name, t->rings[r].name);
        if (!cons)
            return fail(c, p, "ring \"%s\" has no consumer (no worker has \"in\": \"%s\")",
                        t->rings[r].name, t->rings[r].name);
    }
    int rc = check_stage_order(c, t);
    if (!rc)
        rc = check_no_cycle(c, t);
    if (rc)
        return rc;
    int n_drafters = topo_n_drafters(t);
    int owner[TOPO_MAX_WORKERS];
    for (int k = 0; k < TOPO_MAX_WORKERS; k++)
        owner[k] = -1;
    for (int i = 0; i < t->n_workers; i++) {
        const topo_worker *w = &t->workers[i];
        if (w->role != TOPO_ROLE_DRAFTER)
            continue;
        snprintf(p, sizeof p, "workers[%d].rank", i);
        if (w->rank < 0 || w->rank >= n_drafters) /* parse_workers bounds it; defensive */
            return fail(c, p, "expected an integer 0..%d, got %d", n_drafters - 1, w->rank);
        if (owner[w->rank] >= 0)
            return fail(c, p, "rank %d is already taken by workers[%d] (drafter ranks must be 0..%d, each once)",
                        w->rank, owner[w->rank], n_drafters - 1);
        owner[w->rank] = i;
    }
    return 0;
}

static int parse_root(pctx *c, topo *t, const json_t *root)
{
    static const char *const keys[] = {"version", "name", "run_dir", "backend", "seed",
        "deterministic", "target", "drafter", "data", "rings", "workers", "supervision",
        "binaries", NULL};
    char got[GOT_LEN];
    int64_t x;
    if (!json_is_object(root)) {
        describe(root, got, sizeof got);
        return fail(c, "", "expected an object, got %s", got);
    }
    int rc = check_keys(c, root, "", keys);
    if (rc)
        return rc;
    json_t *v = json_object_get(root, "version");
    if (!v)
        return fail(c, "version", "required key missing");
    if (!json_is_integer(v) || json_integer_value(v) != 1) {
        describe(v, got, sizeof got);
        return fail(c, "version", "expected 1, got %s", got);
    }
    t->version = 1;
    v = json_object_get(root, "name");
    if (v) {
        const char *s = json_is_string(v) ? json_string_value(v) : "";
        int ok = json_is_string(v) && s[0] && strlen(s) <= 63 && strlen(s) == json_string_length(v);
        for (; ok && *s; s++)
            if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
                  *s == '_' || *s == '-' || *s == '.'))
                ok = 0;
        if (!ok) {
            describe(v, got, sizeof got);
            return fail(c, "name", "expected 1..63 characters [A-Za-z0-9_.-], got %s", got);
        }
        snprintf(t->name, sizeof t->name, "%s", json_string_value(v));
    } else {
        snprintf(t->name, sizeof t->name, "default");
    }
    rc = get_str(c, root, "", "run_dir", REQUIRED, 0, &t->run_dir);
    if (rc)
        return rc;
    v = json_object_get(root, "backend");
    if (!v)
        return fail(c, "backend", "required key missing");
    if (json_is_string(v) && strcmp(json_string_value(v), "cpu") == 0)
        t->backend = TOPO_CPU;
    else if (json_is_string(v) && strcmp(json_string_value(v), "cuda") == 0)
        t->backend = TOPO_CUDA;
    else {
        describe(v, got, sizeof got);
        return fail(c, "backend", "expected \"cpu\" or \"cuda\", got %s", got);
    }
    c->backend = t->backend;
    rc = get_int(c, root, "", "seed", OPTIONAL, 0, INT64_MAX, 1234, &x);
    if (rc)
        return rc;
    t->seed = (uint64_t)x;
    if ((rc = get_bool(c, root, "", "deterministic", 0, &t->deterministic)) ||
        (rc = parse_target(c, t, root)) || (rc = parse_drafter(c, t, root)) ||
        (rc = parse_data(c, t, root)) || (rc = parse_supervision(c, t, root)) ||
        (rc = parse_rings(c, t, root)) || (rc = parse_workers(c, t, root)))
        return rc;
    json_t *b;
    if ((rc = get_obj(c, root, "", "binaries", OPTIONAL, &b)))
        return rc;
    if (b) {
        static const char *const bkeys[] = {"dir", NULL};
        if ((rc = check_keys(c, b, "binaries", bkeys)) ||
            (rc = get_str(c, b, "binaries", "dir", OPTIONAL, 1, &t->bin_dir)))
            return rc;
    }
    return cross_check(c, t);
}

/* --- public API ------------------------------------------------------------------------------ */

static int parse_buf(topo *t, const char *text, size_t len, const char *src, char *err, size_t errlen)
{
    pctx c = {.err = err, .errlen = errlen, .src = src ? src : "topology", .backend = TOPO_CPU};
    if (err && errlen)
        err[0] = '\0';
    memset(t, 0, sizeof *t);
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (err && errlen)
            snprintf(err, errlen, "%s:%d:%d: JSON syntax error: %s", c.src, je.line, je.column, je.text);
        return -EINVAL;
    }
    int rc = parse_root(&c, t, root);
    json_decref(root);
    if (rc == 0 && src && !(t->source_path = strdup(src)))
        rc = -ENOMEM;
    if (rc == -ENOMEM && err && errlen)
        snprintf(err, errlen, "%s: out of memory", c.src);
    if (rc)
        topo_free(t);
    return rc;
}

int topo_parse(topo *t, const char *json_text, const char *source_name, char *err, size_t errlen)
{
    return parse_buf(t, json_text, strlen(json_text), source_name, err, errlen);
}

int topo_load(topo *t, const char *path, char *err, size_t errlen)
{
    char *text = NULL;
    size_t len = 0;
    memset(t, 0, sizeof *t);
    char why[600];
    /* a FIFO, a device or a directory is refused without blocking and named as such */
    int rc = df_read_regular(path, &text, &len, why, sizeof why);
    if (rc) {
        if (err && errlen && rc == -EINVAL)
            snprintf(err, errlen, "%s (the topology file)", why);
        else if (err && errlen)
            snprintf(err, errlen, "%s: cannot read the topology file: %s", path, strerror(-rc));
        return rc;
    }
    rc = parse_buf(t, text, len, path, err, errlen);
    free(text);
    return rc;
}

void topo_free(topo *t)
{
    if (!t)
        return;
    free(t->run_dir);
    free(t->target_model_dir);
    free(t->capture_layers);
    free(t->drafter.init_dir);
    if (t->shards)
        for (int i = 0; i < t->n_shards; i++)
            free(t->shards[i]);
    free(t->shards);
    free(t->rings);
    if (t->workers)
        for (int i = 0; i < t->n_workers; i++) {
            free_strv(t->workers[i].env);
            free_strv(t->workers[i].args);
        }
    free(t->workers);
    free(t->bin_dir);
    free(t->source_path);
    memset(t, 0, sizeof *t);
}

int topo_find_worker(const topo *t, const char *name)
{
    for (int i = 0; i < t->n_workers; i++)
        if (strcmp(t->workers[i].name, name) == 0)
            return i;
    return -1;
}

int topo_find_ring(const topo *t, const char *name)
{
    for (int i = 0; i < t->n_rings; i++)
        if (strcmp(t->rings[i].name, name) == 0)
            return i;
    return -1;
}

int topo_n_drafters(const topo *t)
{
    int n = 0;
    for (int i = 0; i < t->n_workers; i++)
        n += t->workers[i].role == TOPO_ROLE_DRAFTER;
    return n;
}

const char *topo_role_name(topo_role r)
{
    switch (r) {
    case TOPO_ROLE_TARGET: return "target";
    case TOPO_ROLE_POSTPROC: return "postproc";
    case TOPO_ROLE_DRAFTER: return "drafter";
    case TOPO_ROLE_TEST: return "test";
    }
    return "?";
}

const char *topo_backend_name(topo_backend b)
{
    return b == TOPO_CUDA ? "cuda" : "cpu";
}

/* --- normalised JSON --------------------------------------------------------------------------- */

/* json_object_set_new that remembers a failure instead of checking every call. */
static void put(json_t *o, const char *k, json_t *v, int *bad)
{
    if (!v || json_object_set_new(o, k, v) != 0)
        *bad = 1;
}

static json_t *str_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

json_t *topo_to_json(const topo *t)
{
    int bad = 0;
    json_t *root = json_object();
    if (!root)
        return NULL;
    put(root, "version", json_integer(t->version), &bad);
    put(root, "name", json_string(t->name), &bad);
    put(root, "run_dir", str_or_null(t->run_dir), &bad);
    put(root, "backend", json_string(topo_backend_name(t->backend)), &bad);
    put(root, "seed", json_integer((json_int_t)t->seed), &bad);
    put(root, "deterministic", json_boolean(t->deterministic), &bad);

    json_t *tg = json_object(), *cl = json_array();
    for (int i = 0; cl && i < t->n_capture; i++)
        if (json_array_append_new(cl, json_integer(t->capture_layers[i])))
            bad = 1;
    if (tg) {
        put(tg, "model_dir", str_or_null(t->target_model_dir), &bad);
        put(tg, "capture_layers", cl, &bad);
    } else {
        json_decref(cl);
    }
    put(root, "target", tg, &bad);

    const topo_drafter *d = &t->drafter;
    json_t *dr = json_object();
    if (dr) {
        put(dr, "num_layers", json_integer(d->num_layers), &bad);
        put(dr, "block_size", json_integer(d->block_size), &bad);
        put(dr, "num_anchors", json_integer(d->num_anchors), &bad);
        put(dr, "gamma", json_real(d->gamma), &bad);
        put(dr, "lr", json_real(d->lr), &bad);
        put(dr, "warmup_frac", json_real(d->warmup_frac), &bad);
        put(dr, "weight_decay", json_real(d->weight_decay), &bad);
        put(dr, "grad_clip", json_real(d->grad_clip), &bad);
        put(dr, "noise_std", json_real(d->noise_std), &bad);
        put(dr, "epochs", json_integer(d->epochs), &bad);
        put(dr, "checkpoint_every", json_integer(d->checkpoint_every), &bad);
        put(dr, "keep_checkpoints", json_integer(d->keep_checkpoints), &bad);
        put(dr, "max_checkpoint_failures", json_integer(d->max_checkpoint_failures), &bad);
        put(dr, "max_nonfinite_steps", json_integer(d->max_nonfinite_steps), &bad);
        put(dr, "allreduce_bucket_kb", json_integer(d->allreduce_bucket_kb), &bad);
        put(dr, "init_dir", str_or_null(d->init_dir), &bad);
        put(dr, "mask_token_id", d->mask_token_id < 0 ? json_null() : json_integer(d->mask_token_id), &bad);
    }
    put(root, "drafter", dr, &bad);

    json_t *da = json_object(), *sh = json_array();
    for (int i = 0; sh && i < t->n_shards; i++)
        if (json_array_append_new(sh, json_string(t->shards[i])))
            bad = 1;
    if (da) {
        put(da, "shards", sh, &bad);
        put(da, "token_budget", json_integer((json_int_t)t->token_budget), &bad);
        put(da, "max_seq_len", json_integer(t->max_seq_len), &bad);
    } else {
        json_decref(sh);
    }
    put(root, "data", da, &bad);

    json_t *rings = json_array();
    for (int i = 0; rings && i < t->n_rings; i++) {
        const topo_ring *r = &t->rings[i];
        json_t *o = json_object();
        if (!o) {
            bad = 1;
            break;
        }
        put(o, "name", json_string(r->name), &bad);
        put(o, "slots", json_integer(r->slots), &bad);
        put(o, "slot_bytes", json_integer((json_int_t)r->slot_bytes), &bad);
        put(o, "max_attempts", json_integer(r->max_attempts), &bad);
        put(o, "gpu", json_integer(r->gpu), &bad);
        if (json_array_append_new(rings, o))
            bad = 1;
    }
    put(root, "rings", rings, &bad);

    json_t *ws = json_array();
    for (int i = 0; ws && i < t->n_workers; i++) {
        const topo_worker *w = &t->workers[i];
        json_t *o = json_object();
        if (!o) {
            bad = 1;
            break;
        }
        put(o, "name", json_string(w->name), &bad);
        put(o, "role", json_string(topo_role_name(w->role)), &bad);
        put(o, "gpu", json_integer(w->gpu), &bad);
        if (w->in_ring >= 0)
            put(o, "in", json_string(t->rings[w->in_ring].name), &bad);
        if (w->out_ring >= 0)
            put(o, "out", json_string(t->rings[w->out_ring].name), &bad);
        if (w->role == TOPO_ROLE_DRAFTER)
            put(o, "rank", json_integer(w->rank), &bad);
        put(o, "heartbeat_timeout_ms", json_integer(w->heartbeat_timeout_ms), &bad);
        json_t *env = json_object();
        for (char **e = w->env; env && e && *e; e++) {
            const char *eq = strchr(*e, '=');
            char key[256];
            snprintf(key, sizeof key, "%.*s", eq ? (int)(eq - *e) : (int)strlen(*e), *e);
            put(env, key, json_string(eq ? eq + 1 : ""), &bad);
        }
        put(o, "env", env, &bad);
        json_t *args = json_array();
        for (char **s = w->args; args && s && *s; s++)
            if (json_array_append_new(args, json_string(*s)))
                bad = 1;
        put(o, "args", args, &bad);
        if (json_array_append_new(ws, o))
            bad = 1;
    }
    put(root, "workers", ws, &bad);

    const topo_supervision *s = &t->sup;
    json_t *su = json_object();
    if (su) {
        put(su, "backoff_initial_ms", json_integer(s->backoff_initial_ms), &bad);
        put(su, "backoff_max_ms", json_integer(s->backoff_max_ms), &bad);
        put(su, "stable_ms", json_integer(s->stable_ms), &bad);
        put(su, "max_restarts", json_integer(s->max_restarts), &bad);
        put(su, "restart_window_s", json_integer(s->restart_window_s), &bad);
        put(su, "heartbeat_timeout_ms", json_integer(s->heartbeat_timeout_ms), &bad);
        put(su, "shutdown_timeout_ms", json_integer(s->shutdown_timeout_ms), &bad);
        put(su, "metrics_interval_ms", json_integer(s->metrics_interval_ms), &bad);
    }
    put(root, "supervision", su, &bad);

    json_t *bi = json_object();
    if (bi)
        put(bi, "dir", str_or_null(t->bin_dir), &bad);
    put(root, "binaries", bi, &bad);

    if (bad) {
        json_decref(root);
        return NULL;
    }
    return root;
}
