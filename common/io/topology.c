/* topology.c: parse and validate the topology JSON (version 1) into a `topo`.
 *
 * Shape: every key of every object is one row of a field table (top_fields, target_fields,
 * drafter_fields, data_fields, ring_fields, worker_fields, supervisor_fields, binaries_fields, validation_fields, in
 * "the field tables" below): name, type, offsetof into the struct, limits, default. One pass
 * over the document in table order, one small getter per JSON type (get_int, get_num,
 * get_str, ...), each of which either stores a value (or its default) or writes ONE message
 * "<source>: <json path>: expected ..., got ..." and returns -EINVAL. The same tables give
 * the known keys of each object and drive topology_to_json.
 * The first error stops the parse: an operator fixes one thing at a time, and a single clear
 * message beats a cascade. Objects are checked for unknown keys before their fields, so a
 * typo ("gpuu") is reported as such rather than as a missing key. Cross-references (ring
 * names, drafter ranks, producers/consumers per ring) are checked after everything parsed.
 * The schema with every default and limit is docs/topology.md.
 */
#include "io/topology.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* --- error reporting ------------------------------------------------------------------- */

typedef struct pctx {
    char *err;
    size_t errlen;
    const char *src; /* prefix of every message */
    topology_backend backend;
    int n_drafters, drafter_idx; /* while parsing workers: R and the drafters seen so far */
} pctx;

static int fail(pctx *c, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(pctx *c, const char *path, const char *fmt, ...) /* "<file>: <field>: <message>", -EINVAL */
{
    if (!c->err || !c->errlen)
        return -EINVAL;
    char where[PATH_MAX + 256];
    snprintf(where, sizeof where, "%s: %s", c->src, path[0] ? path : "(top level)");
    va_list ap;
    va_start(ap, fmt);
    int rc = df_verr(c->err, c->errlen, -EINVAL, where, fmt, ap);
    va_end(ap);
    return rc;
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

/* --- typed getters: value or default, or one error ----------------------------------------- */

enum { OPTIONAL = 0, REQUIRED = 1 };

static int get_int(pctx *c, const json_t *obj, const char *path, const char *key, int req, int64_t lo, int64_t hi,
                   int64_t def, int64_t *out)
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

static int get_u32(pctx *c, const json_t *obj, const char *path, const char *key, int64_t lo, int64_t hi, int64_t def,
                   uint32_t *out)
{
    int64_t x;
    int rc = get_int(c, obj, path, key, OPTIONAL, lo, hi, def, &x);
    if (rc == 0)
        *out = (uint32_t)x;
    return rc;
}

/* A number (integer or real) in [lo, hi] (lo excluded when lo_open); what = "a number > 0". */
static int get_num(pctx *c, const json_t *obj, const char *path, const char *key, double lo, int lo_open, double hi,
                   const char *what, double def, double *out)
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

static int get_bool(pctx *c, const json_t *obj, const char *path, const char *key, int def, int *out)
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
static int get_str(pctx *c, const json_t *obj, const char *path, const char *key, int req, int nullable, char **out)
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
        if (c->backend == TOPOLOGY_CUDA)
            return fail(c, p, "required with backend \"cuda\"");
        *out = -1;
        return 0;
    }
    int64_t x = json_is_integer(v) ? json_integer_value(v) : -2;
    describe(v, got, sizeof got);
    if (x < -1 || x > TOPOLOGY_MAX_GPU)
        return fail(c, p, "expected an integer -1..%d, got %s", TOPOLOGY_MAX_GPU, got);
    if (c->backend == TOPOLOGY_CPU && x != -1)
        return fail(c, p, "expected -1 with backend \"cpu\", got %s", got);
    if (c->backend == TOPOLOGY_CUDA && x < 0)
        return fail(c, p, "expected an integer 0..%d with backend \"cuda\", got %s", TOPOLOGY_MAX_GPU, got);
    *out = (int)x;
    return 0;
}

/* An object member that must be an object when present; *out NULL when absent. */
static int get_obj(pctx *c, const json_t *obj, const char *path, const char *key, int req, json_t **out)
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

/* --- the ring graph (docs/topology.md, "The ring graph") ---------------------------------------
 * Stage order: a postproc reads only rings that targets write, a drafter only rings that
 * postprocs write ("test" workers stand for any stage and are exempt). No cycle: following
 * in -> out through the workers never comes back to a ring, or batches would circulate
 * forever and the epoch could never end. */

/* the stage that must write the ring a worker of role r reads; -1: any (or none) */
static int wanted_producer(topology_role r)
{
    return r == TOPOLOGY_ROLE_POSTPROC  ? (int)TOPOLOGY_ROLE_TARGET
           : r == TOPOLOGY_ROLE_DRAFTER ? (int)TOPOLOGY_ROLE_POSTPROC
                                        : -1;
}

static int check_stage_order(pctx *c, const topo *t)
{
    char p[96];
    for (int i = 0; i < t->n_workers; i++) {
        const topology_worker *w = &t->workers[i];
        int want = wanted_producer(w->role);
        if (want < 0 || w->in_ring < 0)
            continue;
        for (int j = 0; j < t->n_workers; j++) {
            const topology_worker *pw = &t->workers[j];
            if (pw->out_ring != w->in_ring || pw->role == TOPOLOGY_ROLE_TEST || (int)pw->role == want)
                continue;
            snprintf(p, sizeof p, "workers[%d].in", i);
            return fail(c, p,
                        "ring \"%s\" is written by workers[%d] \"%s\" (role %s), but a %s reads only what a %s "
                        "writes (stage order target -> postproc -> drafter)",
                        t->rings[w->in_ring].name, j, pw->name, topology_role_name(pw->role),
                        topology_role_name(w->role), topology_role_name((topology_role)want));
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
        const topology_worker *w = &t->workers[i];
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
    char on[TOPOLOGY_MAX_RINGS] = {0}, done[TOPOLOGY_MAX_RINGS] = {0}, p[32], desc[1024];
    int path[TOPOLOGY_MAX_WORKERS + 1], n = 0, start = -1;
    for (int r = 0; r < t->n_rings; r++) {
        if (!ring_dfs(t, r, on, done, path, &n, &start))
            continue;
        /* path runs from ring r; the cycle is the part from the first worker reading start */
        int k = 0;
        while (k < n && t->workers[path[k]].in_ring != start)
            k++;
        size_t o = (size_t)snprintf(desc, sizeof desc, "%s", t->rings[start].name);
        for (; k < n && o < sizeof desc; k++) {
            const topology_worker *w = &t->workers[path[k]];
            o += (size_t)snprintf(desc + o, sizeof desc - o, " -> workers[%d] \"%s\" -> %s", path[k], w->name,
                                  t->rings[w->out_ring].name);
        }
        snprintf(p, sizeof p, "rings[%d]", start);
        return fail(c, p, "ring \"%s\" is part of a cycle: %s (batches would flow back into it)", t->rings[start].name,
                    desc);
    }
    return 0;
}

/* The validator and the "validation" section come together (at most one validator); it
 * scores checkpoints, so every_steps is a multiple of drafter.checkpoint_every. */
static int check_validation(pctx *c, topo *t)
{
    char p[96];
    int first = -1;
    for (int i = 0; i < t->n_workers; i++) {
        if (t->workers[i].role != TOPOLOGY_ROLE_VALIDATOR)
            continue;
        snprintf(p, sizeof p, "workers[%d].role", i);
        if (first >= 0)
            return fail(c, p, "a second validator (workers[%d] is one): at most one worker has role \"validator\"",
                        first);
        if (!t->val.enabled)
            return fail(c, p, "a validator needs the top-level \"validation\" section (its held-out shards)");
        first = i;
    }
    if (!t->val.enabled)
        return 0;
    if (first < 0)
        return fail(c, "validation", "no worker has role \"validator\" (add one, or remove this section)");
    if (t->val.every_steps % t->drafter.checkpoint_every)
        return fail(c, "validation.every_steps",
                    "expected a multiple of drafter.checkpoint_every (%u): validation scores checkpoints, got %u",
                    t->drafter.checkpoint_every, t->val.every_steps);
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
            return fail(c, p, "ring \"%s\" has no producer (no worker has \"out\": \"%s\")", t->rings[r].name,
                        t->rings[r].name);
        if (!cons)
            return fail(c, p, "ring \"%s\" has no consumer (no worker has \"in\": \"%s\")", t->rings[r].name,
                        t->rings[r].name);
    }
    int rc = check_stage_order(c, t);
    if (!rc)
        rc = check_no_cycle(c, t);
    if (rc)
        return rc;
    int n_drafters = topology_n_drafters(t);
    int owner[TOPOLOGY_MAX_WORKERS];
    for (int k = 0; k < TOPOLOGY_MAX_WORKERS; k++)
        owner[k] = -1;
    for (int i = 0; i < t->n_workers; i++) {
        const topology_worker *w = &t->workers[i];
        if (w->role != TOPOLOGY_ROLE_DRAFTER)
            continue;
        snprintf(p, sizeof p, "workers[%d].rank", i);
        if (w->rank < 0 || w->rank >= n_drafters) /* parse_workers bounds it; defensive */
            return fail(c, p, "expected an integer 0..%d, got %d", n_drafters - 1, w->rank);
        if (owner[w->rank] >= 0)
            return fail(c, p, "rank %d is already taken by workers[%d] (drafter ranks must be 0..%d, each once)",
                        w->rank, owner[w->rank], n_drafters - 1);
        owner[w->rank] = i;
    }
    return check_validation(c, t);
}

/* --- the field tables --------------------------------------------------------------------------
 * Every key of every object of the file is one row of a table below (top_fields, target_fields,
 * drafter_fields, data_fields, ring_fields, worker_fields, supervisor_fields, binaries_fields,
 * validation_fields): its
 * name, its type, where it lives (offsetof into the struct the object fills), its limits and
 * default. The same row drives the unknown-key check (the key list of the object), the parse
 * (rows in order; the first error stops) and topology_to_json (rows in order, so the normalised
 * file lists the keys as the table does). A field whose JSON is not a plain scalar (an array,
 * a ring reference, the worker's role) names its own parse and write functions in its row;
 * checks across fields (token_budget >= max_seq_len, the ring graph, ranks) stay as code
 * after the table pass. */

typedef enum {
    FT_U32,    /* uint32_t: integer lo..hi, default def */
    FT_U64,    /* uint64_t: integer lo..hi (int64 range), default def; req may be REQUIRED */
    FT_NUM,    /* double: number dlo..dhi (dlo excluded when lo_open), default ddef */
    FT_BOOL,   /* int: true/false, default def */
    FT_STR,    /* char *: non-empty string (owned), NULL when absent or null (nullable) */
    FT_NAME,   /* char[32]: 1..31 characters [a-z0-9_-], required */
    FT_GPU,    /* int: -1..TOPOLOGY_MAX_GPU, checked against the backend */
    FT_OBJ,    /* a nested object described by sub[0..n_sub) at the same base + off */
    FT_CUSTOM, /* parse and write functions of its own */
} ftype;

typedef struct field field;
struct field {
    const char *key;
    ftype type;
    size_t off; /* of the value in the struct this object fills */
    int req;    /* REQUIRED or OPTIONAL (FT_U64, FT_STR, FT_OBJ) */
    int64_t lo, hi, def;
    double dlo, dhi, ddef;
    int lo_open;
    const char *what; /* FT_NUM: "a number > 0" in the error message */
    int nullable;     /* FT_STR: null accepted (and written for NULL) */
    const field *sub; /* FT_OBJ */
    int n_sub;
    /* instead of the type's parse; s is the struct the object fills */
    int (*parse)(pctx *c, topo *t, void *s, const json_t *o, const char *path);
    /* after the field parsed: a check against the fields before it */
    int (*check)(pctx *c, topo *t, void *s, const char *path);
    /* instead of the type's writer; *omit = 1 leaves the key out */
    json_t *(*write)(const topo *t, const void *s, int *omit);
};

#define NF(tab) ((int)(sizeof(tab) / sizeof((tab)[0])))
#define F_U32(k, st, m, lo_, hi_, def_)                                                     \
    {                                                                                       \
        .key = k, .type = FT_U32, .off = offsetof(st, m), .lo = lo_, .hi = hi_, .def = def_ \
    }
#define F_U64(k, st, m, req_, lo_, hi_, def_)                                                            \
    {                                                                                                    \
        .key = k, .type = FT_U64, .off = offsetof(st, m), .req = req_, .lo = lo_, .hi = hi_, .def = def_ \
    }
#define F_NUM(k, st, m, lo_, open_, hi_, what_, def_)                                                              \
    {                                                                                                              \
        .key = k, .type = FT_NUM, .off = offsetof(st, m), .dlo = lo_, .lo_open = open_, .dhi = hi_, .what = what_, \
        .ddef = def_                                                                                               \
    }
#define F_STR(k, st, m, req_, null_)                                                     \
    {                                                                                    \
        .key = k, .type = FT_STR, .off = offsetof(st, m), .req = req_, .nullable = null_ \
    }
#define F_OBJ(k, off_, req_, tab, check_)                                                                 \
    {                                                                                                     \
        .key = k, .type = FT_OBJ, .off = off_, .req = req_, .sub = tab, .n_sub = NF(tab), .check = check_ \
    }
#define F_CUSTOM(k, parse_, write_)                                   \
    {                                                                 \
        .key = k, .type = FT_CUSTOM, .parse = parse_, .write = write_ \
    }

#define AT(s, off, type) ((type *)(void *)((char *)(s) + (off)))
#define CAT(s, off, type) ((const type *)(const void *)((const char *)(s) + (off)))

/* Reject keys of obj that no row of tab names. */
static int check_keys(pctx *c, const json_t *obj, const char *path, const field *tab, int n)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v)
    {
        int ok = 0;
        for (int i = 0; i < n && !ok; i++)
            ok = strcmp(tab[i].key, key) == 0;
        if (!ok) {
            char p[256];
            join(p, sizeof p, path, key);
            return fail(c, p, "unknown key");
        }
    }
    return 0;
}

static int parse_fields(pctx *c, topo *t, const field *tab, int n, void *s, const json_t *o, const char *path);

/* One row: its value (or default) into s, or one error. */
static int parse_field(pctx *c, topo *t, const field *f, void *s, const json_t *o, const char *path)
{
    int64_t x;
    int rc;
    if (f->parse) {
        rc = f->parse(c, t, s, o, path);
    } else {
        switch (f->type) {
        case FT_U32: rc = get_u32(c, o, path, f->key, f->lo, f->hi, f->def, AT(s, f->off, uint32_t)); break;
        case FT_U64:
            rc = get_int(c, o, path, f->key, f->req, f->lo, f->hi, f->def, &x);
            if (rc == 0)
                *AT(s, f->off, uint64_t) = (uint64_t)x;
            break;
        case FT_NUM:
            rc = get_num(c, o, path, f->key, f->dlo, f->lo_open, f->dhi, f->what, f->ddef, AT(s, f->off, double));
            break;
        case FT_BOOL: rc = get_bool(c, o, path, f->key, (int)f->def, AT(s, f->off, int)); break;
        case FT_STR: rc = get_str(c, o, path, f->key, f->req, f->nullable, AT(s, f->off, char *)); break;
        case FT_NAME: rc = get_name(c, o, path, f->key, AT(s, f->off, char)); break;
        case FT_GPU: rc = get_gpu(c, o, path, AT(s, f->off, int)); break;
        case FT_OBJ: {
            /* an absent optional object parses as {}: every field takes its default */
            json_t *v, *empty = NULL;
            char p[256];
            join(p, sizeof p, path, f->key);
            rc = get_obj(c, o, path, f->key, f->req, &v);
            if (rc == 0 && !v && !(v = empty = json_object()))
                rc = -ENOMEM;
            if (rc == 0)
                rc = parse_fields(c, t, f->sub, f->n_sub, (char *)s + f->off, v, p);
            json_decref(empty);
            break;
        }
        default:
            rc = -EINVAL; /* FT_CUSTOM without a parse function: a table bug */
            break;
        }
    }
    if (rc == 0 && f->check) {
        char p[256];
        join(p, sizeof p, path, f->key);
        rc = f->check(c, t, s, f->type == FT_OBJ ? p : path);
    }
    return rc;
}

/* The unknown-key check, then every row in order. */
static int parse_fields(pctx *c, topo *t, const field *tab, int n, void *s, const json_t *o, const char *path)
{
    int rc = check_keys(c, o, path, tab, n);
    for (int i = 0; i < n && rc == 0; i++)
        rc = parse_field(c, t, &tab[i], s, o, path);
    return rc;
}

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

static json_t *write_fields(const topo *t, const field *tab, int n, const void *s);

static json_t *write_field(const topo *t, const field *f, const void *s, int *omit)
{
    *omit = 0;
    if (f->write)
        return f->write(t, s, omit);
    switch (f->type) {
    case FT_U32: return json_integer(*CAT(s, f->off, uint32_t));
    case FT_U64: return json_integer((json_int_t)*CAT(s, f->off, uint64_t));
    case FT_NUM: return json_real(*CAT(s, f->off, double));
    case FT_BOOL: return json_boolean(*CAT(s, f->off, int));
    case FT_STR: return str_or_null(*CAT(s, f->off, char *));
    case FT_NAME: return json_string(CAT(s, f->off, char));
    case FT_GPU: return json_integer(*CAT(s, f->off, int));
    case FT_OBJ: return write_fields(t, f->sub, f->n_sub, (const char *)s + f->off);
    default: return NULL;
    }
}

/* The object of tab's rows in order; NULL on allocation failure. */
static json_t *write_fields(const topo *t, const field *tab, int n, const void *s)
{
    int bad = 0;
    json_t *o = json_object();
    if (!o)
        return NULL;
    for (int i = 0; i < n; i++) {
        int omit = 0;
        json_t *v = write_field(t, &tab[i], s, &omit);
        if (!omit)
            put(o, tab[i].key, v, &bad);
    }
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* --- fields with their own parse / write ------------------------------------------------------- */

static int parse_capture_layers(pctx *c, topo *t, void *s, const json_t *o, const char *path)
{
    char got[GOT_LEN];
    json_t *cl = json_object_get(o, "capture_layers");
    if (!cl)
        return fail(c, "target.capture_layers", "required key missing");
    if (!json_is_array(cl) || json_array_size(cl) == 0 || json_array_size(cl) > 256) {
        describe(cl, got, sizeof got);
        return fail(c, "target.capture_layers", "expected a non-empty array (at most 256) of layer indices, got %s%s",
                    got, json_is_array(cl) ? (json_array_size(cl) ? " of more than 256" : " that is empty") : "");
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
            return fail(c, p, "expected an integer > %d (strictly increasing), got %s", t->capture_layers[i - 1], got);
        t->capture_layers[i] = x;
    }
    return 0;
}

static json_t *write_capture_layers(const topo *t, const void *s, int *omit)
{
    json_t *cl = json_array();
    for (int i = 0; cl && i < t->n_capture; i++)
        if (json_array_append_new(cl, json_integer(t->capture_layers[i]))) {
            json_decref(cl);
            return NULL;
        }
    return cl;
}

static int parse_mask_token_id(pctx *c, topo *t, void *s, const json_t *o, const char *path)
{
    topology_drafter *d = s;
    json_t *v = json_object_get(o, "mask_token_id");
    d->mask_token_id = -1;
    if (v && !json_is_null(v)) {
        char got[GOT_LEN];
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
            describe(v, got, sizeof got);
            return fail(c, "drafter.mask_token_id", "expected an integer 0..%d or null, got %s", INT32_MAX, got);
        }
        d->mask_token_id = json_integer_value(v);
    }
    return 0;
}

static json_t *write_mask_token_id(const topo *t, const void *s, int *omit)
{
    const topology_drafter *d = s;
    return d->mask_token_id < 0 ? json_null() : json_integer(d->mask_token_id);
}

/* drafter.layer_types: null/absent, or one "full_attention" / "sliding_attention" per
 * layer (num_layers is parsed before it) */
static int parse_layer_types(pctx *c, topo *t, void *s, const json_t *o, const char *path)
{
    topology_drafter *d = s;
    char got[GOT_LEN];
    json_t *v = json_object_get(o, "layer_types");
    d->layer_types_given = 0;
    memset(d->layer_sliding, 0, sizeof d->layer_sliding);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_array(v) || json_array_size(v) != d->num_layers) {
        if (json_is_array(v))
            snprintf(got, sizeof got, "an array of %zu", json_array_size(v));
        else
            describe(v, got, sizeof got);
        return fail(c, "drafter.layer_types",
                    "expected an array of drafter.num_layers (%u) strings \"full_attention\" or \"sliding_attention\", "
                    "or null, got %s",
                    d->num_layers, got);
    }
    for (uint32_t l = 0; l < d->num_layers; l++) {
        json_t *e = json_array_get(v, l);
        const char *k = json_is_string(e) ? json_string_value(e) : "";
        if (strcmp(k, "full_attention") != 0 && strcmp(k, "sliding_attention") != 0) {
            char q[64];
            snprintf(q, sizeof q, "drafter.layer_types[%u]", l);
            describe(e, got, sizeof got);
            return fail(c, q, "expected \"full_attention\" or \"sliding_attention\", got %s", got);
        }
        d->layer_sliding[l] = k[0] == 's';
    }
    d->layer_types_given = 1;
    return 0;
}

static json_t *write_layer_types(const topo *t, const void *s, int *omit)
{
    const topology_drafter *d = s;
    if (!d->layer_types_given)
        return json_null();
    json_t *a = json_array();
    for (uint32_t l = 0; a && l < d->num_layers; l++)
        if (json_array_append_new(a, json_string(d->layer_sliding[l] ? "sliding_attention" : "full_attention"))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* drafter.sliding_window: the sliding layers' window, given exactly when some layer is
 * sliding (layer_types is parsed before it); one given with none would be silently unused.
 * null/absent is stored as 0. */
static int parse_sliding_window(pctx *c, topo *t, void *s, const json_t *o, const char *path)
{
    topology_drafter *d = s;
    char got[GOT_LEN];
    json_t *v = json_object_get(o, "sliding_window");
    int first = -1;
    for (uint32_t l = 0; first < 0 && l < d->num_layers; l++)
        if (d->layer_sliding[l])
            first = (int)l;
    d->sliding_window = 0;
    describe(v, got, sizeof got);
    if (!v || json_is_null(v)) {
        if (first >= 0)
            return fail(c, "drafter.sliding_window",
                        "expected an integer 1..%d (drafter.layer_types[%d] is \"sliding_attention\"), got %s",
                        INT32_MAX, first, got);
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > INT32_MAX)
        return fail(c, "drafter.sliding_window", "expected an integer 1..%d or null, got %s", INT32_MAX, got);
    if (first < 0)
        return fail(c, "drafter.sliding_window",
                    "expected null (no drafter.layer_types entry is \"sliding_attention\": the window would be "
                    "unused), got %s",
                    got);
    d->sliding_window = (uint32_t)json_integer_value(v);
    return 0;
}

static json_t *write_sliding_window(const topo *t, const void *s, int *omit)
{
    const topology_drafter *d = s;
    return d->sliding_window ? json_integer(d->sliding_window) : json_null();
}

/* drafter.loss: "decay" (default) or "dpace" */
static int parse_loss(pctx *c, topo *t, void *s, const json_t *o, const char *path)
{
    topology_drafter *d = s;
    json_t *v = json_object_get(o, "loss");
    d->loss = TOPOLOGY_LOSS_DECAY;
    if (!v)
        return 0;
    if (json_is_string(v) && strcmp(json_string_value(v), "dpace") == 0)
        d->loss = TOPOLOGY_LOSS_DPACE;
    else if (!(json_is_string(v) && strcmp(json_string_value(v), "decay") == 0)) {
        char got[GOT_LEN];
        describe(v, got, sizeof got);
        return fail(c, "drafter.loss", "expected \"decay\" or \"dpace\", got %s", got);
    }
    return 0;
}

static json_t *write_loss(const topo *t, const void *s, int *omit)
{
    return json_string(((const topology_drafter *)s)->loss == TOPOLOGY_LOSS_DPACE ? "dpace" : "decay");
}

/* "shards" of path (data, validation): a non-empty array of non-empty strings */
static int parse_shard_list(pctx *c, const json_t *o, const char *path, char ***out, int *n_out)
{
    char got[GOT_LEN], q[64];
    json_t *sh = json_object_get(o, "shards");
    snprintf(q, sizeof q, "%s.shards", path);
    if (!sh)
        return fail(c, q, "required key missing");
    if (!json_is_array(sh) || json_array_size(sh) == 0 || json_array_size(sh) > 100000) {
        describe(sh, got, sizeof got);
        return fail(c, q, "expected a non-empty array of file names, got %s%s", got,
                    json_is_array(sh) && json_array_size(sh) == 0 ? " that is empty" : "");
    }
    *n_out = (int)json_array_size(sh);
    *out = calloc((size_t)*n_out, sizeof(char *));
    if (!*out)
        return -ENOMEM;
    for (int i = 0; i < *n_out; i++) {
        json_t *v = json_array_get(sh, (size_t)i);
        char p[80];
        snprintf(p, sizeof p, "%s.shards[%d]", path, i);
        if (!json_is_string(v) || json_string_length(v) == 0 || strlen(json_string_value(v)) != json_string_length(v)) {
            describe(v, got, sizeof got);
            return fail(c, p, "expected a non-empty string, got %s", got);
        }
        if (!((*out)[i] = strdup(json_string_value(v))))
            return -ENOMEM;
    }
    return 0;
}

static json_t *write_shard_list(char *const *shards, int n)
{
    json_t *sh = json_array();
    for (int i = 0; sh && i < n; i++)
        if (json_array_append_new(sh, json_string(shards[i]))) {
            json_decref(sh);
            return NULL;
        }
    return sh;
}

static int parse_shards(pctx *c, topo *t, void *s, const json_t *o, const char *path)
{
    return parse_shard_list(c, o, "data", &t->shards, &t->n_shards);
}

static json_t *write_shards(const topo *t, const void *s, int *omit)
{
    return write_shard_list(t->shards, t->n_shards);
}

static int parse_val_shards(pctx *c, topo *t, void *s, const json_t *o, const char *path)
{
    return parse_shard_list(c, o, "validation", &t->val.shards, &t->val.n_shards);
}

static json_t *write_val_shards(const topo *t, const void *s, int *omit)
{
    return write_shard_list(t->val.shards, t->val.n_shards);
}

/* data, after its fields */
static int check_data(pctx *c, topo *t, void *s, const char *path)
{
    if (t->token_budget < t->max_seq_len)
        return fail(c, "data.token_budget", "expected at least data.max_seq_len (%u), got %" PRIu64, t->max_seq_len,
                    t->token_budget);
    return 0;
}

/* supervision, after its fields */
static int check_supervision(pctx *c, topo *t, void *s, const char *path)
{
    const topology_supervision *su = &t->sup;
    if (su->backoff_max_ms < su->backoff_initial_ms)
        return fail(c, "supervision.backoff_max_ms", "expected at least supervision.backoff_initial_ms (%u), got %u",
                    su->backoff_initial_ms, su->backoff_max_ms);
    return 0;
}

/* rings[i].in / .out: the name of a ring listed before */
static int parse_ring_ref(pctx *c, topo *t, const json_t *o, const char *path, const char *key, int *out)
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
    int k = topology_find_ring(t, json_string_value(v));
    if (k < 0) {
        describe(v, got, sizeof got);
        return fail(c, p, "unknown ring %s", got);
    }
    *out = k;
    return 0;
}

static const char *const roles[] = {"target", "postproc", "drafter", "test", "validator"};

static int check_worker_name(pctx *c, topo *t, void *s, const char *path)
{
    topology_worker *w = s;
    int i = (int)(w - t->workers);
    char q[96];
    for (int j = 0; j < i; j++)
        if (strcmp(t->workers[j].name, w->name) == 0) {
            snprintf(q, sizeof q, "%s.name", path);
            return fail(c, q, "duplicate worker name \"%s\" (also workers[%d])", w->name, j);
        }
    return 0;
}

static int parse_role(pctx *c, topo *t, void *s, const json_t *o, const char *path)
{
    topology_worker *w = s;
    char q[96], got[GOT_LEN];
    json_t *rv = json_object_get(o, "role");
    snprintf(q, sizeof q, "%s.role", path);
    if (!rv)
        return fail(c, q, "required key missing");
    int role = -1;
    for (int k = 0; k < (int)DF_ARRAY_LEN(roles) && json_is_string(rv); k++)
        if (strcmp(json_string_value(rv), roles[k]) == 0)
            role = k;
    if (role < 0) {
        describe(rv, got, sizeof got);
        return fail(c, q, "expected \"target\", \"postproc\", \"drafter\", \"validator\" or \"test\", got %s", got);
    }
    w->role = (topology_role)role;
    return 0;
}

static json_t *write_role(const topo *t, const void *s, int *omit)
{
    return json_string(topology_role_name(((const topology_worker *)s)->role));
}

static int parse_in(pctx *c, topo *t, void *s, const json_t *o, const char *path)
{
    return parse_ring_ref(c, t, o, path, "in", &((topology_worker *)s)->in_ring);
}

static int parse_out(pctx *c, topo *t, void *s, const json_t *o, const char *path)
{
    return parse_ring_ref(c, t, o, path, "out", &((topology_worker *)s)->out_ring);
}

static json_t *write_ring_ref(const topo *t, int ring, int *omit)
{
    *omit = ring < 0;
    return ring < 0 ? NULL : json_string(t->rings[ring].name);
}

static json_t *write_in(const topo *t, const void *s, int *omit)
{
    return write_ring_ref(t, ((const topology_worker *)s)->in_ring, omit);
}

static json_t *write_out(const topo *t, const void *s, int *omit)
{
    return write_ring_ref(t, ((const topology_worker *)s)->out_ring, omit);
}

/* after "out": which rings the role reads and writes */
static int check_worker_rings(pctx *c, topo *t, void *s, const char *p)
{
    const topology_worker *w = s;
    const char *rn = roles[w->role];
    char q[96];
    if ((w->role == TOPOLOGY_ROLE_TARGET) && w->in_ring >= 0) {
        snprintf(q, sizeof q, "%s.in", p);
        return fail(c, q, "a %s worker reads no ring (remove \"in\")", rn);
    }
    if (w->role == TOPOLOGY_ROLE_DRAFTER && w->out_ring >= 0) {
        snprintf(q, sizeof q, "%s.out", p);
        return fail(c, q, "a %s worker writes no ring (remove \"out\")", rn);
    }
    if ((w->role == TOPOLOGY_ROLE_POSTPROC || w->role == TOPOLOGY_ROLE_DRAFTER) && w->in_ring < 0) {
        snprintf(q, sizeof q, "%s.in", p);
        return fail(c, q, "required for role \"%s\"", rn);
    }
    if ((w->role == TOPOLOGY_ROLE_TARGET || w->role == TOPOLOGY_ROLE_POSTPROC) && w->out_ring < 0) {
        snprintf(q, sizeof q, "%s.out", p);
        return fail(c, q, "required for role \"%s\"", rn);
    }
    if (w->role == TOPOLOGY_ROLE_VALIDATOR && (w->in_ring >= 0 || w->out_ring >= 0)) {
        snprintf(q, sizeof q, "%s.%s", p, w->in_ring >= 0 ? "in" : "out");
        return fail(c, q, "a validator worker reads and writes no ring (it reads checkpoints; remove \"%s\")",
                    w->in_ring >= 0 ? "in" : "out");
    }
    if (w->in_ring >= 0 && w->in_ring == w->out_ring) {
        snprintf(q, sizeof q, "%s.out", p);
        return fail(c, q, "same ring as \"in\" (\"%s\")", t->rings[w->in_ring].name);
    }
    return 0;
}

/* workers[i].gpu: the general rule (get_gpu), except the validator, whose gpu is optional
 * with either backend: -1 (the default) scores on the CPU, 0..7 (backend "cuda" only) on
 * that GPU (eval/heldout.h) */
static int parse_worker_gpu(pctx *c, topo *t, void *s, const json_t *o, const char *p)
{
    topology_worker *w = s;
    if (w->role != TOPOLOGY_ROLE_VALIDATOR)
        return get_gpu(c, o, p, &w->gpu);
    char q[96], got[GOT_LEN];
    json_t *v = json_object_get(o, "gpu");
    w->gpu = -1;
    if (!v)
        return 0;
    int64_t x = json_is_integer(v) ? json_integer_value(v) : -2;
    snprintf(q, sizeof q, "%s.gpu", p);
    describe(v, got, sizeof got);
    if (x < -1 || x > TOPOLOGY_MAX_GPU)
        return fail(c, q, "expected an integer -1..%d, got %s", TOPOLOGY_MAX_GPU, got);
    if (c->backend == TOPOLOGY_CPU && x != -1)
        return fail(c, q, "expected -1 with backend \"cpu\" (a GPU validator needs backend \"cuda\"), got %s", got);
    w->gpu = (int)x;
    return 0;
}

static json_t *write_worker_gpu(const topo *t, const void *s, int *omit)
{
    return json_integer(((const topology_worker *)s)->gpu);
}

/* drafters only; default: the order among drafters (uniqueness: cross_check) */
static int parse_rank(pctx *c, topo *t, void *s, const json_t *o, const char *p)
{
    topology_worker *w = s;
    char q[96];
    snprintf(q, sizeof q, "%s.rank", p);
    if (json_object_get(o, "rank") && w->role != TOPOLOGY_ROLE_DRAFTER)
        return fail(c, q, "only drafter workers have a rank");
    if (w->role == TOPOLOGY_ROLE_DRAFTER) {
        int64_t x;
        int rc = get_int(c, o, p, "rank", OPTIONAL, 0, c->n_drafters - 1, c->drafter_idx, &x);
        if (rc)
            return rc;
        w->rank = (int)x;
        c->drafter_idx++;
    }
    return 0;
}

static json_t *write_rank(const topo *t, const void *s, int *omit)
{
    const topology_worker *w = s;
    *omit = w->role != TOPOLOGY_ROLE_DRAFTER;
    return *omit ? NULL : json_integer(w->rank);
}

/* default: supervision.heartbeat_timeout_ms (parsed before the workers) */
static int parse_worker_heartbeat(pctx *c, topo *t, void *s, const json_t *o, const char *p)
{
    return get_u32(c, o, p, "heartbeat_timeout_ms", 100, 86400000, t->sup.heartbeat_timeout_ms,
                   &((topology_worker *)s)->heartbeat_timeout_ms);
}

/* default: supervision.startup_timeout_ms */
static int parse_worker_startup(pctx *c, topo *t, void *s, const json_t *o, const char *p)
{
    return get_u32(c, o, p, "startup_timeout_ms", 100, 86400000, t->sup.startup_timeout_ms,
                   &((topology_worker *)s)->startup_timeout_ms);
}

static int parse_env(pctx *c, topo *t, void *s, const json_t *o, const char *path)
{
    topology_worker *w = s;
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
    json_object_foreach(e, key, v)
    {
        char q[300];
        snprintf(q, sizeof q, "%s.%s", p, key);
        int ok = key[0] && !(key[0] >= '0' && key[0] <= '9');
        for (const char *k = key; *k; k++)
            if (!((*k >= 'A' && *k <= 'Z') || (*k >= 'a' && *k <= 'z') || (*k >= '0' && *k <= '9') || *k == '_'))
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

static json_t *write_env(const topo *t, const void *s, int *omit)
{
    const topology_worker *w = s;
    int bad = 0;
    json_t *env = json_object();
    for (char **e = w->env; env && e && *e; e++) {
        const char *eq = strchr(*e, '=');
        char key[256];
        snprintf(key, sizeof key, "%.*s", eq ? (int)(eq - *e) : (int)strlen(*e), *e);
        put(env, key, json_string(eq ? eq + 1 : ""), &bad);
    }
    if (bad) {
        json_decref(env);
        return NULL;
    }
    return env;
}

static int parse_args(pctx *c, topo *t, void *s, const json_t *o, const char *path)
{
    topology_worker *w = s;
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

static json_t *write_args(const topo *t, const void *s, int *omit)
{
    const topology_worker *w = s;
    json_t *args = json_array();
    for (char **a = w->args; args && a && *a; a++)
        if (json_array_append_new(args, json_string(*a))) {
            json_decref(args);
            return NULL;
        }
    return args;
}

/* --- the tables ------------------------------------------------------------------------------ */

static const field target_fields[] = {
    F_STR("model_dir", topo, target_model_dir, REQUIRED, 0),
    F_CUSTOM("capture_layers", parse_capture_layers, write_capture_layers),
};

static const field drafter_fields[] = {
    F_U32("num_layers", topology_drafter, num_layers, 1, TOPOLOGY_MAX_DRAFTER_LAYERS, 1),
    F_U32("block_size", topology_drafter, block_size, 2, 1024, 16),
    F_U32("num_anchors", topology_drafter, num_anchors, 1, 65536, 64),
    F_NUM("gamma", topology_drafter, gamma, 0, 1, 1e6, "a number > 0", 7.0),
    /* the objective: "decay" (the fixed exp(-(k-1)/gamma)) or "dpace" (weights from the
     * drafter's own confidence); alpha 0 would let one early miss zero a block's weights */
    F_CUSTOM("loss", parse_loss, write_loss),
    F_NUM("dpace_alpha", topology_drafter, dpace_alpha, 0, 1, 1, "a number in (0, 1]", 0.5),
    F_NUM("lr", topology_drafter, lr, 0, 1, 10, "a number in (0, 10]", 6e-4),
    F_NUM("warmup_frac", topology_drafter, warmup_frac, 0, 0, 1, "a number 0..1", 0.04),
    F_NUM("weight_decay", topology_drafter, weight_decay, 0, 0, 10, "a number 0..10", 0.0),
    F_NUM("grad_clip", topology_drafter, grad_clip, 0, 0, 1e9, "a number >= 0 (0 = off)", 1.0),
    F_NUM("noise_std", topology_drafter, noise_std, 0, 0, 1e3, "a number 0..1000", 0.0),
    F_U32("epochs", topology_drafter, epochs, 1, 100000, 1),
    F_U32("checkpoint_every", topology_drafter, checkpoint_every, 1, 1000000000, 50),
    /* 0 = keep every checkpoint; otherwise the newest N step dirs (never the committed one) */
    F_U32("keep_checkpoints", topology_drafter, keep_checkpoints, 0, 1000000, 3),
    /* consecutive failed checkpoints before the drafter gives up (exit 100): a full disk is
     * reported within N * checkpoint_every steps, not at the end of the run */
    F_U32("max_checkpoint_failures", topology_drafter, max_checkpoint_failures, 1, 1000000, 3),
    /* false: the loop waits for each checkpoint's files (the behaviour before the writer
     * thread; for comparisons and debugging) */
    {.key = "checkpoint_async", .type = FT_BOOL, .off = offsetof(topology_drafter, checkpoint_async), .def = 1},
    F_U32("max_nonfinite_steps", topology_drafter, max_nonfinite_steps, 1, 1000000, 3),
    /* gradient all-reduce buckets (several drafter ranks): at least this many KiB each, cut
     * at layer boundaries; 0 = one bucket per layer. 16 MiB by default */
    F_U32("allreduce_bucket_kb", topology_drafter, allreduce_bucket_kb, 0, 4194304, 16384),
    F_STR("init_dir", topology_drafter, init_dir, OPTIONAL, 1),
    F_CUSTOM("mask_token_id", parse_mask_token_id, write_mask_token_id),
    /* the attention kind of each layer, then the window of the sliding ones (given exactly
     * when one is) */
    F_CUSTOM("layer_types", parse_layer_types, write_layer_types),
    F_CUSTOM("sliding_window", parse_sliding_window, write_sliding_window),
};

static const field data_fields[] = {
    F_CUSTOM("shards", parse_shards, write_shards),
    /* at most INT32_MAX: a batch's T is a uint32 in its header and the target sizes its
     * workspace with an int; a larger budget would be truncated there, not refused */
    F_U64("token_budget", topo, token_budget, OPTIONAL, 1, INT32_MAX, 2048),
    F_U32("max_seq_len", topo, max_seq_len, 1, 1 << 20, 512),
};

static const field ring_fields[] = {
    {.key = "name", .type = FT_NAME, .off = offsetof(topology_ring, name)},
    F_U32("slots", topology_ring, slots, 1, 4096, 8),
    F_U64("slot_bytes", topology_ring, slot_bytes, OPTIONAL, 4096, (int64_t)1 << 40, 4194304),
    F_U32("max_attempts", topology_ring, max_attempts, 1, 100, 3),
    {.key = "gpu", .type = FT_GPU, .off = offsetof(topology_ring, gpu)},
};

static const field worker_fields[] = {
    {.key = "name", .type = FT_NAME, .off = offsetof(topology_worker, name), .check = check_worker_name},
    F_CUSTOM("role", parse_role, write_role),
    {.key = "gpu",
     .type = FT_GPU,
     .off = offsetof(topology_worker, gpu),
     .parse = parse_worker_gpu,
     .write = write_worker_gpu},
    F_CUSTOM("in", parse_in, write_in),
    {.key = "out", .type = FT_CUSTOM, .parse = parse_out, .write = write_out, .check = check_worker_rings},
    F_CUSTOM("rank", parse_rank, write_rank),
    {.key = "heartbeat_timeout_ms",
     .type = FT_U32,
     .off = offsetof(topology_worker, heartbeat_timeout_ms),
     .parse = parse_worker_heartbeat},
    {.key = "startup_timeout_ms",
     .type = FT_U32,
     .off = offsetof(topology_worker, startup_timeout_ms),
     .parse = parse_worker_startup},
    F_CUSTOM("env", parse_env, write_env),
    F_CUSTOM("args", parse_args, write_args),
};

static const field supervisor_fields[] = {
    F_U32("backoff_initial_ms", topology_supervision, backoff_initial_ms, 1, 3600000, 100),
    F_U32("backoff_max_ms", topology_supervision, backoff_max_ms, 1, 3600000, 5000),
    F_U32("stable_ms", topology_supervision, stable_ms, 1, 86400000, 10000),
    F_U32("max_restarts", topology_supervision, max_restarts, 0, 1000000, 5),
    F_U32("restart_window_s", topology_supervision, restart_window_s, 1, 86400, 60),
    F_U32("heartbeat_timeout_ms", topology_supervision, heartbeat_timeout_ms, 100, 86400000, 10000),
    /* from spawn to ready: loading a model may take far longer than a heartbeat interval */
    F_U32("startup_timeout_ms", topology_supervision, startup_timeout_ms, 100, 86400000, 600000),
    F_U32("shutdown_timeout_ms", topology_supervision, shutdown_timeout_ms, 1, 3600000, 5000),
    F_U32("metrics_interval_ms", topology_supervision, metrics_interval_ms, 10, 3600000, 1000),
};

static const field validation_fields[] = {
    F_CUSTOM("shards", parse_val_shards, write_val_shards),
    F_U32("max_samples", topology_validation, max_samples, 1, 1000000, 64),
    F_U32("every_steps", topology_validation, every_steps, 0, 1000000000, 0),
};

static const field binaries_fields[] = {
    F_STR("dir", topo, bin_dir, OPTIONAL, 1),
};

/* --- arrays of objects: rings, workers ----------------------------------------------------------- */

static int parse_rings(pctx *c, topo *t, void *s, const json_t *root, const char *path)
{
    char got[GOT_LEN];
    json_t *a = json_object_get(root, "rings");
    if (!a)
        return fail(c, "rings", "required key missing");
    if (!json_is_array(a) || json_array_size(a) < 1 || json_array_size(a) > TOPOLOGY_MAX_RINGS) {
        if (json_is_array(a))
            snprintf(got, sizeof got, "%zu", json_array_size(a));
        else
            describe(a, got, sizeof got);
        return fail(c, "rings", "expected an array of 1..%d rings, got %s", TOPOLOGY_MAX_RINGS, got);
    }
    t->n_rings = (int)json_array_size(a);
    t->rings = calloc((size_t)t->n_rings, sizeof(topology_ring));
    if (!t->rings)
        return -ENOMEM;
    for (int i = 0; i < t->n_rings; i++) {
        topology_ring *r = &t->rings[i];
        json_t *o = json_array_get(a, (size_t)i);
        char p[64];
        snprintf(p, sizeof p, "rings[%d]", i);
        if (!json_is_object(o)) {
            describe(o, got, sizeof got);
            return fail(c, p, "expected an object, got %s", got);
        }
        int rc = parse_fields(c, t, ring_fields, NF(ring_fields), r, o, p);
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

static json_t *write_rings(const topo *t, const void *s, int *omit)
{
    json_t *a = json_array();
    for (int i = 0; a && i < t->n_rings; i++)
        if (json_array_append_new(a, write_fields(t, ring_fields, NF(ring_fields), &t->rings[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static int parse_workers(pctx *c, topo *t, void *s, const json_t *root, const char *path)
{
    char got[GOT_LEN];
    json_t *a = json_object_get(root, "workers");
    if (!a)
        return fail(c, "workers", "required key missing");
    if (!json_is_array(a) || json_array_size(a) < 1 || json_array_size(a) > TOPOLOGY_MAX_WORKERS) {
        if (json_is_array(a))
            snprintf(got, sizeof got, "%zu", json_array_size(a));
        else
            describe(a, got, sizeof got);
        return fail(c, "workers", "expected an array of 1..%d workers, got %s", TOPOLOGY_MAX_WORKERS, got);
    }
    /* n_workers counts allocated entries from the start, so topology_free can walk a half-filled
     * array (env/args NULL until parsed). */
    t->n_workers = (int)json_array_size(a);
    t->workers = calloc((size_t)t->n_workers, sizeof(topology_worker));
    if (!t->workers)
        return -ENOMEM;
    /* R, the drafter group size, bounds every rank: count the drafters up front. */
    c->n_drafters = 0;
    c->drafter_idx = 0;
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *rv = json_object_get(json_array_get(a, i), "role");
        c->n_drafters += json_is_string(rv) && strcmp(json_string_value(rv), "drafter") == 0;
    }
    for (int i = 0; i < t->n_workers; i++) {
        topology_worker *w = &t->workers[i];
        json_t *o = json_array_get(a, (size_t)i);
        char p[64];
        snprintf(p, sizeof p, "workers[%d]", i);
        w->in_ring = w->out_ring = w->rank = -1;
        if (!json_is_object(o)) {
            describe(o, got, sizeof got);
            return fail(c, p, "expected an object, got %s", got);
        }
        int rc = parse_fields(c, t, worker_fields, NF(worker_fields), w, o, p);
        if (rc)
            return rc;
    }
    return 0;
}

static json_t *write_workers(const topo *t, const void *s, int *omit)
{
    json_t *a = json_array();
    for (int i = 0; a && i < t->n_workers; i++)
        if (json_array_append_new(a, write_fields(t, worker_fields, NF(worker_fields), &t->workers[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* --- the top level ------------------------------------------------------------------------------ */

static int parse_version(pctx *c, topo *t, void *s, const json_t *root, const char *path)
{
    char got[GOT_LEN];
    json_t *v = json_object_get(root, "version");
    if (!v)
        return fail(c, "version", "required key missing");
    if (!json_is_integer(v) || json_integer_value(v) != 1) {
        describe(v, got, sizeof got);
        return fail(c, "version", "expected 1, got %s", got);
    }
    t->version = 1;
    return 0;
}

static json_t *write_version(const topo *t, const void *s, int *omit)
{
    return json_integer(t->version);
}

/* the run's name: 1..63 characters [A-Za-z0-9_.-], "default" when absent */
static int parse_topo_name(pctx *c, topo *t, void *s, const json_t *root, const char *path)
{
    char got[GOT_LEN];
    json_t *v = json_object_get(root, "name");
    if (v) {
        const char *n = json_is_string(v) ? json_string_value(v) : "";
        int ok = json_is_string(v) && n[0] && strlen(n) <= 63 && strlen(n) == json_string_length(v);
        for (; ok && *n; n++)
            if (!((*n >= 'a' && *n <= 'z') || (*n >= 'A' && *n <= 'Z') || (*n >= '0' && *n <= '9') || *n == '_' ||
                  *n == '-' || *n == '.'))
                ok = 0;
        if (!ok) {
            describe(v, got, sizeof got);
            return fail(c, "name", "expected 1..63 characters [A-Za-z0-9_.-], got %s", got);
        }
        snprintf(t->name, sizeof t->name, "%s", json_string_value(v));
    } else {
        snprintf(t->name, sizeof t->name, "default");
    }
    return 0;
}

static int parse_backend(pctx *c, topo *t, void *s, const json_t *root, const char *path)
{
    char got[GOT_LEN];
    json_t *v = json_object_get(root, "backend");
    if (!v)
        return fail(c, "backend", "required key missing");
    if (json_is_string(v) && strcmp(json_string_value(v), "cpu") == 0)
        t->backend = TOPOLOGY_CPU;
    else if (json_is_string(v) && strcmp(json_string_value(v), "cuda") == 0)
        t->backend = TOPOLOGY_CUDA;
    else {
        describe(v, got, sizeof got);
        return fail(c, "backend", "expected \"cpu\" or \"cuda\", got %s", got);
    }
    c->backend = t->backend;
    return 0;
}

/* description: free text for the reader (what the file is for: a benchmark, a recipe, the
 * embedded default); nothing reads it but people. Bounded so a stray blob is refused. */
#define TOPOLOGY_MAX_DESCRIPTION 1024
static int check_description(pctx *c, topo *t, void *s, const char *path)
{
    (void)s;
    (void)path;
    size_t n = t->description ? strlen(t->description) : 0;
    if (n > TOPOLOGY_MAX_DESCRIPTION)
        return fail(c, "description", "expected at most %d characters, got %zu", TOPOLOGY_MAX_DESCRIPTION, n);
    return 0;
}

static json_t *write_backend(const topo *t, const void *s, int *omit)
{
    return json_string(topology_backend_name(t->backend));
}

/* validation: optional; absent = no validator (and the key is left out of the normalised
 * file). Its checks against the workers and drafter.checkpoint_every are in cross_check. */
static int parse_validation(pctx *c, topo *t, void *s, const json_t *root, const char *path)
{
    json_t *v;
    int rc = get_obj(c, root, "", "validation", OPTIONAL, &v);
    if (rc || !v)
        return rc;
    t->val.enabled = 1;
    return parse_fields(c, t, validation_fields, NF(validation_fields), &t->val, v, "validation");
}

static json_t *write_validation(const topo *t, const void *s, int *omit)
{
    *omit = !t->val.enabled;
    return *omit ? NULL : write_fields(t, validation_fields, NF(validation_fields), &t->val);
}

/* In the order of the normalised file. The parse takes them in top_parse_order instead:
 * supervision before rings and workers (a worker's heartbeat default comes from it). */
static const field top_fields[] = {
    F_CUSTOM("version", parse_version, write_version),
    {.key = "name", .type = FT_NAME, .off = offsetof(topo, name), .parse = parse_topo_name},
    {.key = "description",
     .type = FT_STR,
     .off = offsetof(topo, description),
     .req = OPTIONAL,
     .nullable = 1,
     .check = check_description},
    F_STR("run_dir", topo, run_dir, REQUIRED, 0),
    F_CUSTOM("backend", parse_backend, write_backend),
    F_U64("seed", topo, seed, OPTIONAL, 0, INT64_MAX, 1234),
    {.key = "deterministic", .type = FT_BOOL, .off = offsetof(topo, deterministic), .def = 0},
    F_OBJ("target", 0, REQUIRED, target_fields, NULL),
    F_OBJ("drafter", offsetof(topo, drafter), OPTIONAL, drafter_fields, NULL),
    F_OBJ("data", 0, REQUIRED, data_fields, check_data),
    F_CUSTOM("rings", parse_rings, write_rings),
    F_CUSTOM("workers", parse_workers, write_workers),
    F_OBJ("supervision", offsetof(topo, sup), OPTIONAL, supervisor_fields, check_supervision),
    F_OBJ("binaries", 0, OPTIONAL, binaries_fields, NULL),
    F_CUSTOM("validation", parse_validation, write_validation),
};
static const int top_parse_order[NF(top_fields)] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 10, 11, 13, 14};

static int parse_root(pctx *c, topo *t, const json_t *root)
{
    char got[GOT_LEN];
    if (!json_is_object(root)) {
        describe(root, got, sizeof got);
        return fail(c, "", "expected an object, got %s", got);
    }
    int rc = check_keys(c, root, "", top_fields, NF(top_fields));
    for (int i = 0; i < NF(top_fields) && rc == 0; i++)
        rc = parse_field(c, t, &top_fields[top_parse_order[i]], t, root, "");
    return rc ? rc : cross_check(c, t);
}

/* --- public API ------------------------------------------------------------------------------ */

static int parse_buf(topo *t, const char *text, size_t len, const char *src, char *err, size_t errlen)
{
    pctx c = {.err = err, .errlen = errlen, .src = src ? src : "topology", .backend = TOPOLOGY_CPU};
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
        topology_free(t);
    return rc;
}

int topology_parse(topo *t, const char *json_text, const char *source_name, char *err, size_t errlen)
{
    return parse_buf(t, json_text, strlen(json_text), source_name, err, errlen);
}

int topology_load(topo *t, const char *path, char *err, size_t errlen)
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

void topology_free(topo *t)
{
    if (!t)
        return;
    free(t->description);
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
    if (t->val.shards)
        for (int i = 0; i < t->val.n_shards; i++)
            free(t->val.shards[i]);
    free(t->val.shards);
    free(t->bin_dir);
    free(t->source_path);
    memset(t, 0, sizeof *t);
}

int topology_find_worker(const topo *t, const char *name)
{
    for (int i = 0; i < t->n_workers; i++)
        if (strcmp(t->workers[i].name, name) == 0)
            return i;
    return -1;
}

int topology_find_ring(const topo *t, const char *name)
{
    for (int i = 0; i < t->n_rings; i++)
        if (strcmp(t->rings[i].name, name) == 0)
            return i;
    return -1;
}

int topology_find_validator(const topo *t)
{
    for (int i = 0; i < t->n_workers; i++)
        if (t->workers[i].role == TOPOLOGY_ROLE_VALIDATOR)
            return i;
    return -1;
}

int topology_n_drafters(const topo *t)
{
    int n = 0;
    for (int i = 0; i < t->n_workers; i++)
        n += t->workers[i].role == TOPOLOGY_ROLE_DRAFTER;
    return n;
}

const char *topology_role_name(topology_role r)
{
    switch (r) {
    case TOPOLOGY_ROLE_TARGET: return "target";
    case TOPOLOGY_ROLE_POSTPROC: return "postproc";
    case TOPOLOGY_ROLE_DRAFTER: return "drafter";
    case TOPOLOGY_ROLE_TEST: return "test";
    case TOPOLOGY_ROLE_VALIDATOR: return "validator";
    }
    return "?";
}

const char *topology_backend_name(topology_backend b)
{
    return b == TOPOLOGY_CUDA ? "cuda" : "cpu";
}

/* --- normalised JSON --------------------------------------------------------------------------- */

json_t *topology_to_json(const topo *t)
{
    return write_fields(t, top_fields, NF(top_fields), t);
}
