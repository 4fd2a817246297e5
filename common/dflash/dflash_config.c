/* dflash_config.c: defaults, validation and the release config.json of the drafter.
 * The JSON shape follows the public z-lab releases (DFlashDraftModel, model_type qwen3,
 * dflash_config {target_layer_ids, mask_token_id}) so an exported drafter loads in the
 * public inference code; we read back exactly what we write plus the Qwen3 defaults. */
#include "dflash/dflash_config.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

double dflash_default_gamma(int B)
{
    if (B == 16)
        return 7.0;
    if (B == 10)
        return 5.0;
    if (B == 8)
        return 4.0;
    double g = round(B / 2.3 * 10.0) / 10.0; /* our choice for other block sizes */
    return g > 0 ? g : 1.0;
}

void dflash_default_layer_ids(int *ids, int n, int L)
{
    if (n == 1) {
        ids[0] = L / 2;
        return;
    }
    for (int i = 0; i < n; i++)
        ids[i] = (int)lround(1.0 + (double)i * (L - 4) / (n - 1));
}

void dflash_config_tiny(dflash_config *c)
{
    memset(c, 0, sizeof(*c));
    c->hidden = 32;
    c->intermediate = 64;
    c->n_layers = 2;
    c->n_heads = 4;
    c->n_kv_heads = 2;
    c->head_dim = 8;
    c->vocab = 50;
    c->block_size = 4;
    c->n_capture = 2;
    c->num_target_layers = 6;
    dflash_default_layer_ids(c->target_layer_ids, c->n_capture, c->num_target_layers);
    c->mask_token_id = 49;
    c->sliding_window = 8;
    c->layer_sliding[1] = 1;
    c->tie_word_embeddings = 1;
    c->max_position_embeddings = 4096;
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 1e6;
    c->gamma = dflash_default_gamma(c->block_size);
    c->dpace_alpha = DFLASH_DPACE_ALPHA_DEFAULT;
}

const char *dflash_loss_name(int loss)
{
    return loss == DFLASH_LOSS_DECAY ? "decay" : loss == DFLASH_LOSS_DPACE ? "dpace" : NULL;
}

int dflash_loss_parse(const char *name)
{
    if (name && !strcmp(name, "decay"))
        return DFLASH_LOSS_DECAY;
    if (name && !strcmp(name, "dpace"))
        return DFLASH_LOSS_DPACE;
    return -1;
}

int dflash_config_validate(const dflash_config *c, char *err, size_t errlen)
{
    if (c->hidden <= 0 || c->intermediate <= 0 || c->vocab <= 0)
        return df_err(err, errlen, -EINVAL, "hidden_size/intermediate_size/vocab_size must be > 0 (got %d/%d/%d)",
                      c->hidden, c->intermediate, c->vocab);
    if (c->n_layers <= 0 || c->n_layers > DFLASH_MAX_LAYERS)
        return df_err(err, errlen, -EINVAL, "num_hidden_layers must be in 1..%d (got %d)", DFLASH_MAX_LAYERS,
                      c->n_layers);
    if (c->n_heads <= 0 || c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads != 0)
        return df_err(err, errlen, -EINVAL,
                      "num_attention_heads (%d) must be a positive multiple of num_key_value_heads (%d)", c->n_heads,
                      c->n_kv_heads);
    if (c->head_dim <= 0 || c->head_dim % 2 != 0)
        return df_err(err, errlen, -EINVAL, "head_dim must be positive and even (got %d)", c->head_dim);
    if (c->block_size < 2)
        return df_err(err, errlen, -EINVAL, "block_size must be >= 2 (got %d)", c->block_size);
    if (c->n_capture <= 0 || c->n_capture > DFLASH_MAX_CAPTURE)
        return df_err(err, errlen, -EINVAL, "dflash_config.target_layer_ids must have 1..%d entries (got %d)",
                      DFLASH_MAX_CAPTURE, c->n_capture);
    for (int i = 0; i < c->n_capture; i++) {
        if (c->target_layer_ids[i] < 0 || (c->num_target_layers > 0 && c->target_layer_ids[i] >= c->num_target_layers))
            return df_err(err, errlen, -EINVAL, "dflash_config.target_layer_ids[%d] = %d is outside 0..%d", i,
                          c->target_layer_ids[i], c->num_target_layers - 1);
    }
    if (c->mask_token_id < 0 || c->mask_token_id >= c->vocab)
        return df_err(err, errlen, -EINVAL, "dflash_config.mask_token_id = %d is outside 0..%d", c->mask_token_id,
                      c->vocab - 1);
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_sliding[l] && c->sliding_window <= 0)
            return df_err(err, errlen, -EINVAL, "layer_types[%d] is sliding_attention but sliding_window = %d", l,
                          c->sliding_window);
    }
    if (!(c->rms_norm_eps > 0) || !(c->rope_theta > 0))
        return df_err(err, errlen, -EINVAL, "rms_norm_eps and rope_theta must be > 0");
    if (!(c->gamma > 0))
        return df_err(err, errlen, -EINVAL, "gamma must be > 0 (got %g)", c->gamma);
    if (!dflash_loss_name(c->loss))
        return df_err(err, errlen, -EINVAL, "loss must be decay (%d) or dpace (%d) (got %d)", DFLASH_LOSS_DECAY,
                      DFLASH_LOSS_DPACE, c->loss);
    /* alpha = 0 leaves the raw confidence product: a block whose first position the drafter
     * misses (q ~ 0) weighs ~0 everywhere, so the positions it most needs are never learned */
    if (c->loss == DFLASH_LOSS_DPACE && !(c->dpace_alpha > 0 && c->dpace_alpha <= 1))
        return df_err(err, errlen, -EINVAL, "dpace_alpha must be in (0, 1] (got %g)", c->dpace_alpha);
    return 0;
}

size_t dflash_config_param_count(const dflash_config *c)
{
    size_t d = (size_t)c->hidden, hd = (size_t)c->head_dim, I = (size_t)c->intermediate;
    size_t qd = (size_t)c->n_heads * hd, kvd = (size_t)c->n_kv_heads * hd;
    size_t layer = 2 * d + qd * d + 2 * kvd * d + d * qd + 2 * hd + 2 * I * d + d * I;
    return d * (size_t)c->n_capture * d + d + (size_t)c->n_layers * layer + d;
}

json_t *dflash_config_to_json(const dflash_config *c)
{
    json_t *o = json_object(), *ids = json_array(), *types = json_array(), *am = json_object(), *dc = json_object(),
           *arch = json_array(), *rp = json_object();
    if (!o || !ids || !types || !am || !dc || !arch || !rp)
        goto fail;
    int any_sliding = 0;
    for (int i = 0; i < c->n_capture; i++)
        json_array_append_new(ids, json_integer(c->target_layer_ids[i]));
    for (int l = 0; l < c->n_layers; l++) {
        json_array_append_new(types, json_string(c->layer_sliding[l] ? "sliding_attention" : "full_attention"));
        any_sliding |= c->layer_sliding[l];
    }
    json_array_append_new(arch, json_string("DFlashDraftModel"));
    json_object_set_new(am, "AutoModel", json_string("dflash.DFlashDraftModel"));
    json_object_set_new(dc, "target_layer_ids", ids);
    json_object_set_new(dc, "mask_token_id", json_integer(c->mask_token_id));
    /* SGLang reads the block size here first (then the top-level field): the two agree */
    json_object_set_new(dc, "block_size", json_integer(c->block_size));
    ids = NULL;
    json_object_set_new(o, "architectures", arch);
    json_object_set_new(o, "model_type", json_string("qwen3"));
    json_object_set_new(o, "auto_map", am);
    json_object_set_new(o, "block_size", json_integer(c->block_size));
    json_object_set_new(o, "num_target_layers", json_integer(c->num_target_layers));
    json_object_set_new(o, "dflash_config", dc);
    json_object_set_new(o, "layer_types", types);
    json_object_set_new(o, "sliding_window", c->sliding_window > 0 ? json_integer(c->sliding_window) : json_null());
    json_object_set_new(o, "use_sliding_window", json_boolean(any_sliding));
    json_object_set_new(o, "max_window_layers", json_integer(c->n_layers));
    json_object_set_new(o, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    json_object_set_new(o, "hidden_size", json_integer(c->hidden));
    json_object_set_new(o, "intermediate_size", json_integer(c->intermediate));
    json_object_set_new(o, "num_hidden_layers", json_integer(c->n_layers));
    json_object_set_new(o, "num_attention_heads", json_integer(c->n_heads));
    json_object_set_new(o, "num_key_value_heads", json_integer(c->n_kv_heads));
    json_object_set_new(o, "head_dim", json_integer(c->head_dim));
    json_object_set_new(o, "hidden_act", json_string("silu"));
    json_object_set_new(o, "attention_bias", json_false());
    json_object_set_new(o, "rms_norm_eps", json_real(c->rms_norm_eps));
    json_object_set_new(o, "rope_theta", json_real(c->rope_theta)); /* transformers 4 */
    json_object_set_new(rp, "rope_type", json_string("default"));
    json_object_set_new(rp, "rope_theta", json_real(c->rope_theta));
    json_object_set_new(o, "rope_parameters", rp); /* transformers 5 */
    json_object_set_new(o, "vocab_size", json_integer(c->vocab));
    json_object_set_new(o, "max_position_embeddings", json_integer(c->max_position_embeddings));
    json_object_set_new(o, "dtype", json_string("bfloat16"));       /* transformers >= 4.56 */
    json_object_set_new(o, "torch_dtype", json_string("bfloat16")); /* older transformers */
    json_object_set_new(o, "dflash_gamma", json_real(c->gamma));    /* ours; ignored by HF */
    if (c->loss != DFLASH_LOSS_DECAY) { /* the default is left out: decay files stay as they were */
        json_object_set_new(o, "dflash_loss", json_string(dflash_loss_name(c->loss)));
        json_object_set_new(o, "dflash_dpace_alpha", json_real(c->dpace_alpha));
    }
    return o;
fail:
    json_decref(o);
    json_decref(ids);
    json_decref(types);
    json_decref(am);
    json_decref(dc);
    json_decref(arch);
    json_decref(rp);
    return NULL;
}

static int get_int(const json_t *o, const char *key, int *out, int required, const char *what, char *err, size_t errlen)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required)
            return df_err(err, errlen, -EINVAL, "%s: missing field \"%s\"", what, key);
        return 0;
    }
    if (json_is_boolean(v)) {
        *out = json_is_true(v);
        return 0;
    }
    /* a number past int is refused, not wrapped (4294967424 would read as 128) */
    if (!json_is_integer(v) || json_integer_value(v) < INT_MIN || json_integer_value(v) > INT_MAX)
        return df_err(err, errlen, -EINVAL, "%s: field \"%s\" must be an integer in [%d, %d]", what, key, INT_MIN,
                      INT_MAX);
    *out = (int)json_integer_value(v);
    return 0;
}

static int get_num(const json_t *o, const char *key, double *out, int required, const char *what, char *err,
                   size_t errlen)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required)
            return df_err(err, errlen, -EINVAL, "%s: missing field \"%s\"", what, key);
        return 0;
    }
    if (!json_is_number(v))
        return df_err(err, errlen, -EINVAL, "%s: field \"%s\" must be a number", what, key);
    *out = json_number_value(v);
    return 0;
}

int dflash_config_from_json(dflash_config *c, const json_t *o, const char *what, char *err, size_t errlen)
{
    int rc;
    memset(c, 0, sizeof(*c));
    if (!json_is_object(o))
        return df_err(err, errlen, -EINVAL, "%s: not a JSON object", what);
    c->max_position_embeddings = 40960;
    c->tie_word_embeddings = 0;
    double eps = 1e-6, theta = 1e6, gamma = 0;
#define GI(k, f, req)                                            \
    if ((rc = get_int(o, k, &c->f, req, what, err, errlen)) < 0) \
        return rc;
    GI("hidden_size", hidden, 1)
    GI("intermediate_size", intermediate, 1)
    GI("num_hidden_layers", n_layers, 1)
    GI("num_attention_heads", n_heads, 1)
    GI("num_key_value_heads", n_kv_heads, 1)
    GI("vocab_size", vocab, 1)
    GI("block_size", block_size, 1)
    GI("num_target_layers", num_target_layers, 1)
    GI("sliding_window", sliding_window, 0)
    GI("tie_word_embeddings", tie_word_embeddings, 0)
    GI("max_position_embeddings", max_position_embeddings, 0)
    c->head_dim = c->n_heads > 0 ? c->hidden / c->n_heads : 0;
    GI("head_dim", head_dim, 0)
#undef GI
    if ((rc = get_num(o, "rms_norm_eps", &eps, 0, what, err, errlen)) < 0 ||
        (rc = get_num(o, "rope_theta", &theta, 0, what, err, errlen)) < 0 ||
        (rc = get_num(o, "dflash_gamma", &gamma, 0, what, err, errlen)) < 0)
        return rc;
    /* transformers 5 writes rope_theta inside rope_parameters, not at the top level */
    json_t *rp = json_object_get(o, "rope_parameters");
    if (!json_object_get(o, "rope_theta") && json_is_object(rp) &&
        (rc = get_num(rp, "rope_theta", &theta, 0, what, err, errlen)) < 0)
        return rc;
    c->rms_norm_eps = eps;
    c->rope_theta = theta;
    c->rope_scaling = (nn_rope_scaling){0}; /* none: see dflash_config.h */
    c->gamma = gamma > 0 ? gamma : dflash_default_gamma(c->block_size);
    json_t *lv = json_object_get(o, "dflash_loss");
    if (lv && !json_is_null(lv)) {
        if (!json_is_string(lv) || dflash_loss_parse(json_string_value(lv)) < 0)
            return df_err(err, errlen, -EINVAL, "%s: field \"dflash_loss\" must be \"decay\" or \"dpace\"", what);
        c->loss = dflash_loss_parse(json_string_value(lv));
    }
    c->dpace_alpha = DFLASH_DPACE_ALPHA_DEFAULT;
    if ((rc = get_num(o, "dflash_dpace_alpha", &c->dpace_alpha, 0, what, err, errlen)) < 0)
        return rc;
    if (!(c->dpace_alpha > 0 && c->dpace_alpha <= 1))
        return df_err(err, errlen, -EINVAL, "%s: field \"dflash_dpace_alpha\" must be in (0, 1] (got %g)", what,
                      c->dpace_alpha);
    json_t *dc = json_object_get(o, "dflash_config");
    if (!json_is_object(dc))
        return df_err(err, errlen, -EINVAL, "%s: missing object \"dflash_config\"", what);
    json_t *ids = json_object_get(dc, "target_layer_ids");
    if (!json_is_array(ids) || json_array_size(ids) == 0 || json_array_size(ids) > DFLASH_MAX_CAPTURE)
        return df_err(err, errlen, -EINVAL, "%s: \"dflash_config.target_layer_ids\" must be an array of 1..%d integers",
                      what, DFLASH_MAX_CAPTURE);
    c->n_capture = (int)json_array_size(ids);
    for (int i = 0; i < c->n_capture; i++) {
        json_t *v = json_array_get(ids, (size_t)i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT_MAX)
            return df_err(err, errlen, -EINVAL, "%s: dflash_config.target_layer_ids[%d] must be an integer in [0, %d]",
                          what, i, INT_MAX);
        c->target_layer_ids[i] = (int)json_integer_value(v);
    }
    if ((rc = get_int(dc, "mask_token_id", &c->mask_token_id, 1, what, err, errlen)) < 0)
        return rc;
    if (c->n_layers <= 0 || c->n_layers > DFLASH_MAX_LAYERS)
        return df_err(err, errlen, -EINVAL, "%s: num_hidden_layers must be in 1..%d (got %d)", what, DFLASH_MAX_LAYERS,
                      c->n_layers);
    json_t *types = json_object_get(o, "layer_types");
    int use_sw = 1;
    if ((rc = get_int(o, "use_sliding_window", &use_sw, 0, what, err, errlen)) < 0)
        return rc;
    if (types && !json_is_null(types)) {
        if (!json_is_array(types) || (int)json_array_size(types) != c->n_layers)
            return df_err(err, errlen, -EINVAL,
                          "%s: \"layer_types\" must be an array of num_hidden_layers (%d) strings", what, c->n_layers);
        for (int l = 0; l < c->n_layers; l++) {
            const char *s = json_string_value(json_array_get(types, (size_t)l));
            if (!s || (strcmp(s, "sliding_attention") != 0 && strcmp(s, "full_attention") != 0))
                return df_err(err, errlen, -EINVAL,
                              "%s: layer_types[%d] must be \"full_attention\" or \"sliding_attention\"", what, l);
            c->layer_sliding[l] = strcmp(s, "sliding_attention") == 0 && use_sw;
        }
    }
    return dflash_config_validate(c, err, errlen);
}

int dflash_config_write_release(const dflash_config *c, const char *path)
{
    json_t *o = dflash_config_to_json(c);
    if (!o)
        return -ENOMEM;
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    json_decref(o);
    if (!s)
        return -ENOMEM;
    size_t n = strlen(s);
    char *buf = malloc(n + 2);
    if (!buf) {
        free(s);
        return -ENOMEM;
    }
    memcpy(buf, s, n);
    buf[n] = '\n';
    free(s);
    int rc = df_write_file_atomic(path, buf, n + 1);
    free(buf);
    return rc;
}

int dflash_config_read_release(dflash_config *c, const char *path, char *err, size_t errlen)
{
    json_error_t je;
    if (access(path, R_OK) != 0) {
        int e = errno;
        return df_err(err, errlen, -e, "%s: %s", path, strerror(e));
    }
    json_t *o = json_load_file(path, 0, &je);
    if (!o) {
        return df_err(err, errlen, -EINVAL, "%s: line %d column %d: %s", path, je.line, je.column, je.text);
    }
    int rc = dflash_config_from_json(c, o, path, err, errlen);
    json_decref(o);
    return rc;
}
