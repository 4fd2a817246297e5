/* hfconfig.c: config.json of Qwen3 / Qwen3-MoE / Llama -> hfconfig. Small typed getters do
 * the work so that every field reports its own name and the value it found; the defaults
 * mirror transformers' Qwen3Config / Qwen3MoeConfig / LlamaConfig so a config that loads
 * there means the same thing here. */
#include "io/hfconfig.h"

#include "ckmath.h"
#include "util.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct parser {
    const char *name; /* file name for messages */
    char *err;
    size_t errlen;
} parser;

static int perr(parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int perr(parser *p, const char *fmt, ...) /* "<file>: <message>", -EINVAL */
{
    va_list ap;
    va_start(ap, fmt);
    int rc = df_verr(p->err, p->errlen, -EINVAL, p->name, fmt, ap);
    va_end(ap);
    return rc;
}

/* A short rendering of a JSON value for messages: "abc" / 3 / 1.5 / an array ... */
static const char *jshow(const json_t *j, char *buf, size_t len)
{
    switch (json_typeof(j)) {
    case JSON_STRING: snprintf(buf, len, "\"%.40s\"", json_string_value(j)); break;
    case JSON_INTEGER: snprintf(buf, len, "%lld", (long long)json_integer_value(j)); break;
    case JSON_REAL: snprintf(buf, len, "%g", json_real_value(j)); break;
    case JSON_TRUE: snprintf(buf, len, "true"); break;
    case JSON_FALSE: snprintf(buf, len, "false"); break;
    case JSON_NULL: snprintf(buf, len, "null"); break;
    case JSON_ARRAY: snprintf(buf, len, "an array"); break;
    case JSON_OBJECT: snprintf(buf, len, "an object"); break;
    }
    return buf;
}

/* integer field in [lo, hi]; absent (or null when null_ok) -> *out = def, or an error
 * when required */
static int get_int(parser *p, json_t *o, const char *key, int required, long long def, long long lo, long long hi,
                   long long *out)
{
    json_t *v = json_object_get(o, key);
    char b[64];
    if (!v || json_is_null(v)) {
        if (required)
            return perr(p, "%s: missing (required)", key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return perr(p, "%s: expected an integer in [%lld, %lld], got %s", key, lo, hi, jshow(v, b, sizeof b));
    *out = json_integer_value(v);
    return 0;
}

static int get_i32(parser *p, json_t *o, const char *key, int required, int def, int lo, int *out)
{
    long long v;
    int rc = get_int(p, o, key, required, def, lo, 1 << 30, &v);
    if (rc == 0)
        *out = (int)v;
    return rc;
}

static int get_num(parser *p, json_t *o, const char *path, const char *key, double def, int *found, double *out)
{
    json_t *v = json_object_get(o, key);
    char b[64];
    if (found)
        *found = v && !json_is_null(v);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v))
        return perr(p, "%s%s: expected a number, got %s", path, key, jshow(v, b, sizeof b));
    *out = json_number_value(v);
    return 0;
}

static int get_bool(parser *p, json_t *o, const char *key, int def, int *out)
{
    json_t *v = json_object_get(o, key);
    char b[64];
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return perr(p, "%s: expected true or false, got %s", key, jshow(v, b, sizeof b));
    *out = json_is_true(v);
    return 0;
}

/* string field copied into buf; absent -> "" (or an error when required) */
static int get_str(parser *p, json_t *o, const char *path, const char *key, int required, char *buf, size_t len)
{
    json_t *v = json_object_get(o, key);
    char b[64];
    buf[0] = '\0';
    if (!v || json_is_null(v)) {
        if (required)
            return perr(p, "%s%s: missing (required)", path, key);
        return 0;
    }
    if (!json_is_string(v))
        return perr(p, "%s%s: expected a string, got %s", path, key, jshow(v, b, sizeof b));
    if (strlen(json_string_value(v)) >= len)
        return perr(p, "%s%s: \"%.40s\" is longer than %zu bytes", path, key, json_string_value(v), len - 1);
    strcpy(buf, json_string_value(v));
    return 0;
}

static int parse_rope(parser *p, json_t *root, hfconfig *c)
{
    /* theta: top-level (transformers 4) or inside rope_parameters (5) / rope_scaling;
     * when several are given they must agree */
    static const char *const holders[] = {"rope_parameters", "rope_scaling"};
    double theta = 10000.0, v;
    int found, have = 0;
    const char *from = "rope_theta";
    int rc = get_num(p, root, "", "rope_theta", 0, &found, &v);
    if (rc < 0)
        return rc;
    if (found) {
        theta = v;
        have = 1;
    }
    json_t *sc = NULL;
    const char *sc_name = NULL;
    char path[64], b[64];
    for (unsigned i = 0; i < DF_ARRAY_LEN(holders); i++) {
        json_t *h = json_object_get(root, holders[i]);
        if (!h || json_is_null(h))
            continue;
        if (!json_is_object(h))
            return perr(p, "%s: expected an object or null, got %s", holders[i], jshow(h, b, sizeof b));
        if (!sc) {
            sc = h;
            sc_name = holders[i];
        }
        snprintf(path, sizeof path, "%s.", holders[i]);
        if ((rc = get_num(p, h, path, "rope_theta", 0, &found, &v)) < 0)
            return rc;
        if (found && have && v != theta)
            return perr(p, "%srope_theta: %g disagrees with %s (%g)", path, v, from, theta);
        if (found && !have) {
            theta = v;
            have = 1;
            from = holders[i];
        }
    }
    if (!(theta > 0))
        return perr(p, "rope_theta: expected a positive number, got %g", theta);
    c->rope_theta = theta;

    strcpy(c->rope_type, "default");
    memset(&c->rope_scaling, 0, sizeof c->rope_scaling);
    if (!sc)
        return 0;
    snprintf(path, sizeof path, "%s.", sc_name);
    if ((rc = get_str(p, sc, path, "rope_type", 0, c->rope_type, sizeof c->rope_type)) < 0)
        return rc;
    if (c->rope_type[0] == '\0' && (rc = get_str(p, sc, path, "type", 0, c->rope_type, sizeof c->rope_type)) < 0)
        return rc;
    if (c->rope_type[0] == '\0')
        strcpy(c->rope_type, "default");
    if (strcmp(c->rope_type, "default") == 0)
        return 0;
    if (strcmp(c->rope_type, "llama3") != 0)
        return perr(p, "%srope_type: unsupported \"%s\" (supported: default, llama3)", path, c->rope_type);
    static const char *const req[] = {"factor", "low_freq_factor", "high_freq_factor",
                                      "original_max_position_embeddings"};
    double vals[4];
    for (int i = 0; i < 4; i++) {
        if ((rc = get_num(p, sc, path, req[i], 0, &found, &vals[i])) < 0)
            return rc;
        if (!found)
            return perr(p, "%s%s: missing (required for rope_type llama3)", path, req[i]);
        if (!(vals[i] > 0))
            return perr(p, "%s%s: expected a positive number, got %g", path, req[i], vals[i]);
    }
    if (!(vals[2] > vals[1]))
        return perr(p, "%shigh_freq_factor: %g must exceed low_freq_factor (%g)", path, vals[2], vals[1]);
    if (!(vals[3] <= (double)(1 << 30)) || vals[3] != (double)(long long)vals[3])
        return perr(p, "%soriginal_max_position_embeddings: expected a whole number up to %d, got %g", path, 1 << 30,
                    vals[3]);
    c->rope_scaling.factor = vals[0];
    c->rope_scaling.low_freq_factor = vals[1];
    c->rope_scaling.high_freq_factor = vals[2];
    c->rope_scaling.original_max_position = (int)vals[3];
    return 0;
}

/* eos_token_id: absent / null (n = 0), an id, or a list of ids */
static int parse_eos(parser *p, json_t *root, int64_t ids[HFCONFIG_MAX_EOS], int *n)
{
    json_t *e = json_object_get(root, "eos_token_id");
    char b[64];
    *n = 0;
    if (!e || json_is_null(e))
        return 0;
    if (json_is_integer(e)) {
        if (json_integer_value(e) < 0)
            return perr(p, "eos_token_id: expected a token id >= 0, got %s", jshow(e, b, sizeof b));
        ids[(*n)++] = json_integer_value(e);
        return 0;
    }
    if (!json_is_array(e))
        return perr(p, "eos_token_id: expected an integer or a list, got %s", jshow(e, b, sizeof b));
    if (json_array_size(e) > HFCONFIG_MAX_EOS)
        return perr(p, "eos_token_id: %zu ids, at most %d supported", json_array_size(e), HFCONFIG_MAX_EOS);
    for (size_t i = 0; i < json_array_size(e); i++) {
        json_t *x = json_array_get(e, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return perr(p, "eos_token_id[%zu]: expected a token id >= 0, got %s", i, jshow(x, b, sizeof b));
        ids[(*n)++] = json_integer_value(x);
    }
    return 0;
}

static int parse_token_ids(parser *p, json_t *root, hfconfig *c)
{
    long long v;
    int rc;
    if ((rc = get_int(p, root, "bos_token_id", 0, -1, 0, INT64_MAX, &v)) < 0)
        return rc;
    c->bos_token_id = v;
    if ((rc = get_int(p, root, "pad_token_id", 0, -1, 0, INT64_MAX, &v)) < 0)
        return rc;
    c->pad_token_id = v;
    return parse_eos(p, root, c->eos_token_ids, &c->n_eos);
}

static int parse_layer_types(parser *p, json_t *root, hfconfig *c)
{
    int L = c->num_hidden_layers, rc, use_sw = 0;
    long long mwl;
    char b[64];
    c->layer_types = calloc((size_t)L, sizeof *c->layer_types); /* all HFCONFIG_FULL_ATTENTION */
    if (!c->layer_types)
        return -ENOMEM;
    json_t *sw = json_object_get(root, "sliding_window");
    if (sw && !json_is_null(sw)) {
        if (!json_is_integer(sw) || json_integer_value(sw) < 1 || json_integer_value(sw) > (1 << 30))
            return perr(p, "sliding_window: expected a positive integer or null, got %s", jshow(sw, b, sizeof b));
        c->sliding_window = (int)json_integer_value(sw);
    }
    if ((rc = get_bool(p, root, "use_sliding_window", 0, &use_sw)) < 0)
        return rc;
    if ((rc = get_int(p, root, "max_window_layers", 0, L, 0, 1 << 30, &mwl)) < 0)
        return rc;
    /* Qwen3Config (and Qwen3MoeConfig) drop the window unless use_sliding_window is set */
    if ((c->arch == HFCONFIG_ARCH_QWEN3 || c->arch == HFCONFIG_ARCH_QWEN3_MOE) && !use_sw)
        c->sliding_window = 0;
    /* Qwen3MoeConfig has no max_window_layers / layer_types of its own and transformers
     * versions differ on which of its layers would slide: refused rather than guessed */
    if (c->arch == HFCONFIG_ARCH_QWEN3_MOE && use_sw)
        return perr(p, "use_sliding_window: true is not supported for qwen3_moe (which layers slide differs "
                       "between transformers versions)");

    json_t *lt = json_object_get(root, "layer_types");
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt) || json_array_size(lt) != (size_t)L)
            return perr(p, "layer_types: expected a list of num_hidden_layers (%d) strings, got %s", L,
                        json_is_array(lt) ? "a list of another length" : jshow(lt, b, sizeof b));
        for (int i = 0; i < L; i++) {
            json_t *x = json_array_get(lt, (size_t)i);
            const char *s = json_is_string(x) ? json_string_value(x) : NULL;
            if (s && strcmp(s, "full_attention") == 0)
                c->layer_types[i] = HFCONFIG_FULL_ATTENTION;
            else if (s && strcmp(s, "sliding_attention") == 0)
                c->layer_types[i] = HFCONFIG_SLIDING_ATTENTION;
            else
                return perr(p, "layer_types[%d]: expected \"full_attention\" or \"sliding_attention\", got %s", i,
                            jshow(x, b, sizeof b));
        }
    } else if (c->arch == HFCONFIG_ARCH_QWEN3 && c->sliding_window > 0) {
        for (int i = (int)mwl; i < L; i++)
            c->layer_types[i] = HFCONFIG_SLIDING_ATTENTION;
    }
    for (int i = 0; i < L; i++)
        if (c->layer_types[i] == HFCONFIG_SLIDING_ATTENTION && c->sliding_window == 0)
            c->layer_types[i] = HFCONFIG_FULL_ATTENTION; /* no window: transformers attends fully */
    return 0;
}

/* The products of the shape fields, in checked 64-bit arithmetic: each dimension alone is
 * at most 2^30, but their products size every weight and workspace. An attention width
 * (heads x head_dim) above HFCONFIG_MAX_WIDTH, a weight matrix above HFCONFIG_MAX_TENSOR elements or a
 * model above HFCONFIG_MAX_PARAMS parameters is refused naming the fields, before anything is
 * allocated or any safetensors shape is compared. */
static int check_sizes(parser *p, const hfconfig *c)
{
    uint64_t H = (uint64_t)c->hidden_size, hd = (uint64_t)c->head_dim, qd, kvd;
    if (ckmath_mul((uint64_t)c->num_attention_heads, hd, &qd) || qd > HFCONFIG_MAX_WIDTH)
        return perr(p, "num_attention_heads x head_dim: %d x %d = %llu, above the limit of %llu",
                    c->num_attention_heads, c->head_dim, (unsigned long long)((uint64_t)c->num_attention_heads * hd),
                    (unsigned long long)HFCONFIG_MAX_WIDTH);
    if (ckmath_mul((uint64_t)c->num_key_value_heads, hd, &kvd) || kvd > HFCONFIG_MAX_WIDTH)
        return perr(p, "num_key_value_heads x head_dim: %d x %d = %llu, above the limit of %llu",
                    c->num_key_value_heads, c->head_dim, (unsigned long long)((uint64_t)c->num_key_value_heads * hd),
                    (unsigned long long)HFCONFIG_MAX_WIDTH);
    if (H > HFCONFIG_MAX_WIDTH)
        return perr(p, "hidden_size: %d is above the limit of %llu", c->hidden_size,
                    (unsigned long long)HFCONFIG_MAX_WIDTH);
    /* the largest matrices: embed_tokens / lm_head, gate/up/down, q/o, the fused experts */
    static const char *const names[] = {"vocab_size x hidden_size", "intermediate_size x hidden_size",
                                        "hidden_size x num_attention_heads x head_dim",
                                        "num_experts x 2 x moe_intermediate_size x hidden_size"};
    uint64_t el[4];
    el[0] = (uint64_t)c->vocab_size * H; /* each factor <= 2^30: no overflow */
    el[1] = (uint64_t)c->intermediate_size * H;
    el[2] = H * qd;
    /* E <= 2^16, F <= 2^30, H <= 2^20: their product can pass 2^64, so it is checked */
    uint64_t ef = 0;
    if (ckmath_mul((uint64_t)c->num_experts * 2, (uint64_t)c->moe_intermediate_size, &ef) || ckmath_mul(ef, H, &el[3]))
        el[3] = UINT64_MAX;
    for (int i = 0; i < 4; i++)
        if (el[i] > HFCONFIG_MAX_TENSOR)
            return perr(p, "%s: %llu elements in one weight, above the limit of %llu", names[i],
                        (unsigned long long)el[i], (unsigned long long)HFCONFIG_MAX_TENSOR);
    /* per layer: q, k, v, o + gate, up, down (biases and norms are smaller than one row
     * each, counted by the + 16 * width slack); a sparse layer: the router [E, d] and E
     * experts' gate, up, down instead of the dense MLP */
    uint64_t attn, dense, sparse = 0, total = 0, embeds, part;
    if (ckmath_mul(2 * H, qd + kvd, &attn) || ckmath_add(attn, 16 * (H + qd + (uint64_t)c->intermediate_size), &attn))
        goto too_many;
    dense = 3 * el[1]; /* <= 3 * 2^36 */
    if (c->n_moe_layers &&
        (ckmath_muladd(3, el[3] / 2, (uint64_t)c->num_experts * H, &sparse) || ckmath_add(sparse, attn, &sparse)))
        goto too_many;
    if (ckmath_mul(attn + dense, (uint64_t)(c->num_hidden_layers - c->n_moe_layers), &total) ||
        ckmath_mul(sparse, (uint64_t)c->n_moe_layers, &part) || ckmath_add(total, part, &total) ||
        ckmath_mul(el[0], c->tie_word_embeddings ? 1 : 2, &embeds) || ckmath_add(total, embeds, &total) ||
        total > HFCONFIG_MAX_PARAMS)
        goto too_many;
    return 0;
too_many:
    if (c->n_moe_layers)
        return perr(p,
                    "num_hidden_layers: %d layers (%d of %d experts of moe_intermediate_size %d) of hidden_size %d "
                    "and vocab_size %d are more than %llu parameters",
                    c->num_hidden_layers, c->n_moe_layers, c->num_experts, c->moe_intermediate_size, c->hidden_size,
                    c->vocab_size, (unsigned long long)HFCONFIG_MAX_PARAMS);
    return perr(p,
                "num_hidden_layers: %d layers of hidden_size %d, intermediate_size %d and vocab_size %d "
                "are more than %llu parameters",
                c->num_hidden_layers, c->hidden_size, c->intermediate_size, c->vocab_size,
                (unsigned long long)HFCONFIG_MAX_PARAMS);
}

/* Fields of other mixture-of-experts families (Qwen2-MoE's shared expert, DeepSeek's shared
 * experts, grouped top-k, sigmoid scoring, routed scaling, leading dense layers): a config
 * that sets one to anything but the value that means "off" would be run with the wrong
 * math, so it is refused by name. `off` is what the field may hold: an integer 0 / 1, the
 * number 1.0, a string, or null / absent. */
static int refuse_foreign_moe(parser *p, json_t *root)
{
    static const struct {
        const char *key;
        const char *off_str; /* string fields: the one accepted value */
        double off_num;      /* numeric fields: the one accepted value */
        const char *what;
    } f[] = {
        {"shared_expert_intermediate_size", NULL, 0, "shared experts (Qwen2-MoE)"},
        {"n_shared_experts", NULL, 0, "shared experts (DeepSeek-MoE)"},
        {"num_shared_experts", NULL, 0, "shared experts"},
        {"moe_shared_expert_intermediate_size", NULL, 0, "shared experts"},
        {"first_k_dense_replace", NULL, 0, "leading dense layers by count (DeepSeek-MoE)"},
        {"n_group", NULL, 1, "grouped top-k routing"},
        {"topk_group", NULL, 1, "grouped top-k routing"},
        {"routed_scaling_factor", NULL, 1, "a routed scaling factor"},
        {"moe_layer_freq", NULL, 1, "a MoE layer frequency other than decoder_sparse_step"},
        {"scoring_func", "softmax", 0, "a router scoring function other than softmax"},
        {"topk_method", "greedy", 0, "a top-k method other than greedy"},
    };
    char b[64];
    for (unsigned i = 0; i < DF_ARRAY_LEN(f); i++) {
        json_t *v = json_object_get(root, f[i].key);
        if (!v || json_is_null(v))
            continue;
        int off = f[i].off_str ? json_is_string(v) && strcmp(json_string_value(v), f[i].off_str) == 0
                               : json_is_number(v) && json_number_value(v) == f[i].off_num;
        if (!off)
            return perr(p, "%s: %s is not supported (%s; only qwen3_moe's routed experts are implemented)", f[i].key,
                        jshow(v, b, sizeof b), f[i].what);
    }
    json_t *rb = json_object_get(root, "router_bias");
    if (rb && !json_is_null(rb) && !json_is_false(rb))
        return perr(p, "router_bias: %s is not supported (the qwen3_moe router has no bias)", jshow(rb, b, sizeof b));
    return 0;
}

/* qwen3_moe: the expert fields and which layers are sparse (hfconfig_layer_is_moe). */
static int parse_moe(parser *p, json_t *root, hfconfig *c)
{
    int L = c->num_hidden_layers, rc;
    char b[64];
    long long v;
    if ((rc = refuse_foreign_moe(p, root)) < 0)
        return rc;
    /* transformers 5 maps num_experts onto num_local_experts; either name, equal if both */
    json_t *ne = json_object_get(root, "num_experts"), *nl = json_object_get(root, "num_local_experts");
    const char *ekey = (!ne || json_is_null(ne)) && nl && !json_is_null(nl) ? "num_local_experts" : "num_experts";
    if ((rc = get_int(p, root, ekey, 1, 0, 0, 1 << 16, &v)) < 0)
        return rc;
    c->num_experts = (int)v;
    if (ne && !json_is_null(ne) && nl && !json_is_null(nl) &&
        (!json_is_integer(nl) || json_integer_value(nl) != json_integer_value(ne)))
        return perr(p, "num_local_experts: %s disagrees with num_experts (%d)", jshow(nl, b, sizeof b), c->num_experts);
    if (c->num_experts > 0) {
        if ((rc = get_i32(p, root, "num_experts_per_tok", 1, 0, 1, &c->num_experts_per_tok)) < 0 ||
            (rc = get_i32(p, root, "moe_intermediate_size", 1, 0, 1, &c->moe_intermediate_size)) < 0)
            return rc;
        if (c->num_experts_per_tok > c->num_experts)
            return perr(p, "num_experts_per_tok: %d is more than num_experts (%d)", c->num_experts_per_tok,
                        c->num_experts);
    }
    if ((rc = get_bool(p, root, "norm_topk_prob", 0, &c->norm_topk_prob)) < 0 ||
        (rc = get_i32(p, root, "decoder_sparse_step", 0, 1, 1, &c->decoder_sparse_step)) < 0)
        return rc;
    c->moe_layer = calloc((size_t)L, 1);
    if (!c->moe_layer)
        return -ENOMEM;
    for (int l = 0; l < L; l++)
        c->moe_layer[l] = c->num_experts > 0 && (l + 1) % c->decoder_sparse_step == 0;
    json_t *mo = json_object_get(root, "mlp_only_layers");
    if (mo && !json_is_null(mo)) {
        if (!json_is_array(mo))
            return perr(p, "mlp_only_layers: expected a list of layer ids, got %s", jshow(mo, b, sizeof b));
        for (size_t i = 0; i < json_array_size(mo); i++) {
            json_t *x = json_array_get(mo, i);
            if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= L)
                return perr(p, "mlp_only_layers[%zu]: expected a layer id in [0, %d), got %s", i, L,
                            jshow(x, b, sizeof b));
            c->moe_layer[json_integer_value(x)] = 0;
        }
    }
    for (int l = 0; l < L; l++)
        c->n_moe_layers += c->moe_layer[l];
    return 0;
}

int hfconfig_layer_is_moe(const hfconfig *c, int layer)
{
    return c->moe_layer && layer >= 0 && layer < c->num_hidden_layers && c->moe_layer[layer];
}

static int parse_root(parser *p, json_t *root, hfconfig *c)
{
    char b[64];
    int rc;
    if (!json_is_object(root))
        return perr(p, "expected a JSON object, got %s", jshow(root, b, sizeof b));

    json_t *ar = json_object_get(root, "architectures");
    if (!ar || !json_is_array(ar) || json_array_size(ar) != 1 || !json_is_string(json_array_get(ar, 0)))
        return perr(p, "architectures: expected a list of one string, got %s",
                    ar ? (json_is_array(ar) ? "a list of another shape" : jshow(ar, b, sizeof b)) : "nothing");
    const char *a = json_string_value(json_array_get(ar, 0));
    const char *want_type;
    if (strcmp(a, "Qwen3ForCausalLM") == 0) {
        c->arch = HFCONFIG_ARCH_QWEN3;
        want_type = "qwen3";
    } else if (strcmp(a, "Qwen3MoeForCausalLM") == 0) {
        c->arch = HFCONFIG_ARCH_QWEN3_MOE;
        want_type = "qwen3_moe";
    } else if (strcmp(a, "LlamaForCausalLM") == 0) {
        c->arch = HFCONFIG_ARCH_LLAMA;
        want_type = "llama";
    } else {
        return perr(p,
                    "architectures: unsupported architecture %.60s (supported: Qwen3ForCausalLM, "
                    "Qwen3MoeForCausalLM, LlamaForCausalLM)",
                    a);
    }
    snprintf(c->architecture, sizeof c->architecture, "%s", a);
    if ((rc = get_str(p, root, "", "model_type", 1, c->model_type, sizeof c->model_type)) < 0)
        return rc;
    if (strcmp(c->model_type, want_type) != 0)
        return perr(p, "model_type: \"%s\" does not match architecture %s (expected \"%s\")", c->model_type, a,
                    want_type);
    char act[32];
    if ((rc = get_str(p, root, "", "hidden_act", 0, act, sizeof act)) < 0)
        return rc;
    if (act[0] && strcmp(act, "silu") != 0)
        return perr(p, "hidden_act: unsupported \"%s\" (only silu)", act);

    if ((rc = get_i32(p, root, "hidden_size", 1, 0, 1, &c->hidden_size)) < 0 ||
        /* qwen3_moe: Qwen3MoeConfig's default; only its dense layers use it */
        (rc = get_i32(p, root, "intermediate_size", c->arch != HFCONFIG_ARCH_QWEN3_MOE, 6144, 1,
                      &c->intermediate_size)) < 0 ||
        (rc = get_i32(p, root, "num_hidden_layers", 1, 0, 1, &c->num_hidden_layers)) < 0 ||
        (rc = get_i32(p, root, "num_attention_heads", 1, 0, 1, &c->num_attention_heads)) < 0 ||
        (rc = get_i32(p, root, "num_key_value_heads", 0, c->num_attention_heads, 1, &c->num_key_value_heads)) < 0 ||
        (rc = get_i32(p, root, "vocab_size", 1, 0, 1, &c->vocab_size)) < 0 ||
        (rc = get_i32(p, root, "max_position_embeddings", 0, 0, 0, &c->max_position_embeddings)) < 0)
        return rc;
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return perr(p, "num_key_value_heads: %d does not divide num_attention_heads (%d)", c->num_key_value_heads,
                    c->num_attention_heads);
    /* Qwen3Config defaults head_dim to 128; Qwen3MoeConfig has no such field and its
     * attention takes hidden_size / num_attention_heads, as Llama's does */
    int hd_default = c->arch == HFCONFIG_ARCH_QWEN3 ? 128 : c->hidden_size / c->num_attention_heads;
    if (c->arch != HFCONFIG_ARCH_QWEN3 && c->hidden_size % c->num_attention_heads != 0 &&
        (!json_object_get(root, "head_dim") || json_is_null(json_object_get(root, "head_dim"))))
        return perr(p, "head_dim: missing and hidden_size (%d) is not a multiple of num_attention_heads (%d)",
                    c->hidden_size, c->num_attention_heads);
    if ((rc = get_i32(p, root, "head_dim", 0, hd_default, 2, &c->head_dim)) < 0)
        return rc;
    if (c->head_dim % 2 != 0)
        return perr(p, "head_dim: %d is odd (rotary embeddings need an even head_dim)", c->head_dim);

    int found;
    if ((rc = get_num(p, root, "", "rms_norm_eps", 1e-6, &found, &c->rms_norm_eps)) < 0)
        return rc;
    if (!(c->rms_norm_eps > 0 && c->rms_norm_eps < 1))
        return perr(p, "rms_norm_eps: expected a number in (0, 1), got %g", c->rms_norm_eps);
    if ((rc = parse_rope(p, root, c)) < 0)
        return rc;
    if ((rc = get_bool(p, root, "tie_word_embeddings", 0, &c->tie_word_embeddings)) < 0 ||
        (rc = get_bool(p, root, "attention_bias", 0, &c->attention_bias)) < 0 ||
        (rc = get_bool(p, root, "mlp_bias", 0, &c->mlp_bias)) < 0)
        return rc;
    if (c->arch != HFCONFIG_ARCH_LLAMA)
        c->mlp_bias = 0; /* Qwen3MLP / Qwen3MoeMLP have no bias whatever the config says */
    c->qk_norm = c->arch != HFCONFIG_ARCH_LLAMA;

    if ((rc = get_str(p, root, "", "torch_dtype", 0, c->dtype, sizeof c->dtype)) < 0)
        return rc;
    if (c->dtype[0] == '\0' && (rc = get_str(p, root, "", "dtype", 0, c->dtype, sizeof c->dtype)) < 0)
        return rc;
    if (c->dtype[0] && strcmp(c->dtype, "bfloat16") && strcmp(c->dtype, "float16") && strcmp(c->dtype, "float32"))
        return perr(p, "torch_dtype: unsupported \"%s\" (bfloat16, float16 or float32)", c->dtype);

    if (c->arch == HFCONFIG_ARCH_QWEN3_MOE && (rc = parse_moe(p, root, c)) < 0)
        return rc;
    if ((rc = check_sizes(p, c)) < 0)
        return rc;
    if ((rc = parse_token_ids(p, root, c)) < 0)
        return rc;
    return parse_layer_types(p, root, c);
}

int hfconfig_parse(hfconfig *c, const char *json, size_t len, const char *name, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    parser p = {name, err, errlen};
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return perr(&p, "line %d column %d: %s", jerr.line, jerr.column, jerr.text);
    int rc = parse_root(&p, root, c);
    json_decref(root);
    if (rc == -ENOMEM)
        perr(&p, "out of memory");
    if (rc < 0)
        hfconfig_free(c);
    return rc;
}

int hfconfig_load(hfconfig *c, const char *path, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    char *file = NULL;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        if (asprintf(&file, "%s/config.json", path) < 0)
            return -ENOMEM;
    } else if (!(file = strdup(path))) {
        return -ENOMEM;
    }
    char *buf = NULL;
    size_t len = 0;
    char why[600];
    /* a FIFO, a device or a directory named config.json is refused without blocking */
    int rc = df_read_regular(file, &buf, &len, why, sizeof why);
    if (rc == -EINVAL)
        snprintf(err, errlen, "%s", why);
    else if (rc < 0)
        snprintf(err, errlen, "%s: cannot read: %s", file, strerror(-rc));
    else
        rc = hfconfig_parse(c, buf, len, file, err, errlen);
    free(buf);
    free(file);
    return rc;
}

void hfconfig_free(hfconfig *c)
{
    if (!c)
        return;
    free(c->layer_types);
    free(c->moe_layer);
    memset(c, 0, sizeof *c);
}

static int parse_generation(parser *p, json_t *root, hfconfig_generation *g)
{
    int rc, found;
    long long v;
    if (!json_is_object(root))
        return perr(p, "expected a JSON object");
    if ((rc = parse_eos(p, root, g->eos_token_ids, &g->n_eos)) < 0)
        return rc;
    if ((rc = get_bool(p, root, "do_sample", 0, &g->do_sample)) < 0)
        return rc;
    if ((rc = get_num(p, root, "", "temperature", 1.0, &found, &g->temperature)) < 0)
        return rc;
    if (!(g->temperature >= 0.0))
        return perr(p, "temperature: %g must be >= 0", g->temperature);
    if ((rc = get_num(p, root, "", "top_p", 1.0, &found, &g->top_p)) < 0)
        return rc;
    if (!(g->top_p > 0.0 && g->top_p <= 1.0))
        return perr(p, "top_p: %g must be in (0, 1]", g->top_p);
    if ((rc = get_int(p, root, "top_k", 0, 50, 0, INT32_MAX, &v)) < 0)
        return rc;
    g->top_k = (int)v;
    if ((rc = get_int(p, root, "max_new_tokens", 0, 0, 0, INT32_MAX, &v)) < 0)
        return rc;
    g->max_new_tokens = (int)v;
    return 0;
}

int hfconfig_load_generation(hfconfig_generation *g, const char *model_dir, char *err, size_t errlen)
{
    memset(g, 0, sizeof *g);
    g->temperature = 1.0;
    g->top_p = 1.0;
    g->top_k = 50;
    char *file = NULL;
    if (asprintf(&file, "%s/generation_config.json", model_dir) < 0)
        return -ENOMEM;
    struct stat st;
    if (stat(file, &st) != 0 && errno == ENOENT) {
        free(file);
        return 0;
    }
    char *buf = NULL;
    size_t len = 0;
    char why[600];
    int rc = df_read_regular(file, &buf, &len, why, sizeof why);
    if (rc == -EINVAL)
        snprintf(err, errlen, "%s", why);
    else if (rc < 0)
        snprintf(err, errlen, "%s: cannot read: %s", file, strerror(-rc));
    if (rc == 0) {
        parser p = {file, err, errlen};
        json_error_t jerr;
        json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
        if (!root) {
            rc = perr(&p, "line %d column %d: %s", jerr.line, jerr.column, jerr.text);
        } else {
            rc = parse_generation(&p, root, g);
            json_decref(root);
        }
        g->found = rc == 0;
    }
    free(buf);
    free(file);
    return rc;
}
