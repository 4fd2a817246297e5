/* test_hfconfig.c: config.json parsing for Qwen3 / Llama targets.
 *   - real-world layouts: Qwen3 (transformers 4), Llama 3.1 with llama3 rope scaling,
 *     the transformers 5 layout (rope_parameters, dtype), Qwen3 sliding-window rules
 *   - the fixture configs tests/fixtures/tiny-{qwen3,llama}/config.json when present
 *   - bad configs: each gives its exact message naming the file and the field
 */
#include "io/hfconfig.h"
#include "test_helpers.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int parse(hfconfig *c, const char *json, char *err, size_t errlen)
{
    return hfconfig_parse(c, json, strlen(json), "cfg.json", err, errlen);
}

static const char *qwen3_06b =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
    " \"bos_token_id\": 151643, \"eos_token_id\": 151645, \"head_dim\": 128, \"hidden_act\": \"silu\","
    " \"hidden_size\": 1024, \"initializer_range\": 0.02, \"intermediate_size\": 3072,"
    " \"max_position_embeddings\": 40960, \"max_window_layers\": 28, \"model_type\": \"qwen3\","
    " \"num_attention_heads\": 16, \"num_hidden_layers\": 28, \"num_key_value_heads\": 8,"
    " \"rms_norm_eps\": 1e-06, \"rope_scaling\": null, \"rope_theta\": 1000000, \"sliding_window\": null,"
    " \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.51.0\","
    " \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}";

static const char *llama31_8b =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
    " \"bos_token_id\": 128000, \"eos_token_id\": [128001, 128008, 128009], \"hidden_act\": \"silu\","
    " \"hidden_size\": 4096, \"initializer_range\": 0.02, \"intermediate_size\": 14336,"
    " \"max_position_embeddings\": 131072, \"mlp_bias\": false, \"model_type\": \"llama\","
    " \"num_attention_heads\": 32, \"num_hidden_layers\": 32, \"num_key_value_heads\": 8,"
    " \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"factor\": 8.0,"
    " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192,"
    " \"rope_type\": \"llama3\"}, \"rope_theta\": 500000.0, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"bfloat16\", \"use_cache\": true, \"vocab_size\": 128256}";

/* transformers 5: rope_parameters holds theta and scaling, dtype instead of torch_dtype */
static const char *llama_v5 =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 96,"
    " \"intermediate_size\": 256, \"num_hidden_layers\": 3, \"num_attention_heads\": 6,"
    " \"num_key_value_heads\": 2, \"vocab_size\": 500, \"dtype\": \"float32\", \"attention_bias\": true,"
    " \"mlp_bias\": true, \"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 500000.0,"
    " \"factor\": 32.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
    " \"original_max_position_embeddings\": 8192}, \"pad_token_id\": null}";

static void good(void)
{
    hfconfig c;
    char err[512] = "";
    int rc = parse(&c, qwen3_06b, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "%s\n", err);
    T_ASSERT_RC(rc);
    T_ASSERT(c.arch == HFCONFIG_ARCH_QWEN3 && !strcmp(c.architecture, "Qwen3ForCausalLM") &&
             !strcmp(c.model_type, "qwen3"));
    T_ASSERT(c.hidden_size == 1024 && c.intermediate_size == 3072 && c.num_hidden_layers == 28);
    T_ASSERT(c.num_attention_heads == 16 && c.num_key_value_heads == 8 && c.head_dim == 128);
    T_ASSERT(c.vocab_size == 151936 && c.max_position_embeddings == 40960);
    T_ASSERT(c.rms_norm_eps == 1e-6 && c.rope_theta == 1e6 && !strcmp(c.rope_type, "default"));
    T_ASSERT(c.rope_scaling.factor == 0);
    T_ASSERT(c.tie_word_embeddings == 1 && c.qk_norm == 1 && c.attention_bias == 0 && c.mlp_bias == 0);
    T_ASSERT(!strcmp(c.dtype, "bfloat16"));
    T_ASSERT(c.bos_token_id == 151643 && c.n_eos == 1 && c.eos_token_ids[0] == 151645 && c.pad_token_id == -1);
    T_ASSERT(c.sliding_window == 0);
    for (int i = 0; i < 28; i++)
        T_ASSERT(c.layer_types[i] == HFCONFIG_FULL_ATTENTION);
    hfconfig_free(&c);
    hfconfig_free(&c);

    T_ASSERT_RC(parse(&c, llama31_8b, err, sizeof err));
    T_ASSERT(c.arch == HFCONFIG_ARCH_LLAMA && c.qk_norm == 0 && c.tie_word_embeddings == 0);
    T_ASSERT(c.head_dim == 128 && c.num_key_value_heads == 8 && c.rms_norm_eps == 1e-5);
    T_ASSERT(c.rope_theta == 500000.0 && !strcmp(c.rope_type, "llama3"));
    T_ASSERT(c.rope_scaling.factor == 8.0 && c.rope_scaling.low_freq_factor == 1.0);
    T_ASSERT(c.rope_scaling.high_freq_factor == 4.0 && c.rope_scaling.original_max_position == 8192);
    T_ASSERT(c.n_eos == 3 && c.eos_token_ids[2] == 128009 && c.bos_token_id == 128000);
    hfconfig_free(&c);

    T_ASSERT_RC(parse(&c, llama_v5, err, sizeof err));
    T_ASSERT(c.head_dim == 16 && c.rope_theta == 500000.0 && !strcmp(c.rope_type, "llama3"));
    T_ASSERT(c.rope_scaling.factor == 32.0 && !strcmp(c.dtype, "float32"));
    T_ASSERT(c.attention_bias == 1 && c.mlp_bias == 1 && c.pad_token_id == -1 && c.n_eos == 0);
    T_ASSERT(c.rms_norm_eps == 1e-6 && c.tie_word_embeddings == 0);
    hfconfig_free(&c);

    /* Qwen3 defaults: head_dim 128, kv heads = heads, rope_theta 10000; sliding window
     * only with use_sliding_window, for layers >= max_window_layers */
    const char *q_min = "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 64,"
                        " \"intermediate_size\": 128, \"num_hidden_layers\": 4, \"num_attention_heads\": 4,"
                        " \"vocab_size\": 300, \"use_sliding_window\": true, \"sliding_window\": 8,"
                        " \"max_window_layers\": 2}";
    T_ASSERT_RC(parse(&c, q_min, err, sizeof err));
    T_ASSERT(c.head_dim == 128 && c.num_key_value_heads == 4 && c.rope_theta == 10000.0 && c.sliding_window == 8);
    T_ASSERT(c.layer_types[0] == HFCONFIG_FULL_ATTENTION && c.layer_types[1] == HFCONFIG_FULL_ATTENTION);
    T_ASSERT(c.layer_types[2] == HFCONFIG_SLIDING_ATTENTION && c.layer_types[3] == HFCONFIG_SLIDING_ATTENTION);
    hfconfig_free(&c);
    const char *q_lt = "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 64,"
                       " \"intermediate_size\": 128, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
                       " \"head_dim\": 16, \"vocab_size\": 300, \"use_sliding_window\": true, \"sliding_window\": 5,"
                       " \"layer_types\": [\"sliding_attention\", \"full_attention\", \"sliding_attention\"],"
                       " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0}}";
    T_ASSERT_RC(parse(&c, q_lt, err, sizeof err));
    T_ASSERT(c.layer_types[0] == HFCONFIG_SLIDING_ATTENTION && c.layer_types[1] == HFCONFIG_FULL_ATTENTION &&
             c.layer_types[2] == HFCONFIG_SLIDING_ATTENTION && c.rope_theta == 1e6 && c.head_dim == 16);
    hfconfig_free(&c);
    printf("good configs: Qwen3, Llama 3.1, transformers-5 layout, sliding rules ok\n");
}

static void fixtures(void)
{
    hfconfig c;
    char err[512];
    int n = 0;
    if (access("tests/fixtures/tiny-qwen3/config.json", F_OK) == 0) {
        T_ASSERT_RC(hfconfig_load(&c, "tests/fixtures/tiny-qwen3", err, sizeof err));
        T_ASSERT(c.arch == HFCONFIG_ARCH_QWEN3 && c.num_hidden_layers == 4 && c.hidden_size == 64);
        T_ASSERT(c.num_attention_heads == 4 && c.num_key_value_heads == 2 && c.head_dim == 16);
        T_ASSERT(c.vocab_size == 300 && c.tie_word_embeddings == 1 && c.qk_norm == 1);
        hfconfig_free(&c);
        n++;
    }
    if (access("tests/fixtures/tiny-llama/config.json", F_OK) == 0) {
        T_ASSERT_RC(hfconfig_load(&c, "tests/fixtures/tiny-llama/config.json", err, sizeof err));
        T_ASSERT(c.arch == HFCONFIG_ARCH_LLAMA && c.tie_word_embeddings == 0 && c.qk_norm == 0);
        T_ASSERT(!strcmp(c.rope_type, "llama3") && c.rope_scaling.factor > 0);
        T_ASSERT(c.num_key_value_heads < c.num_attention_heads);
        T_ASSERT(c.head_dim == c.hidden_size / c.num_attention_heads);
        hfconfig_free(&c);
        n++;
    }
    printf("fixture configs: %d of 2 present and checked\n", n);
}

/* bad configs: the base is a valid small Qwen3 config with one field replaced */
static void bad(void)
{
    static const struct {
        const char *json, *msg;
    } cases[] = {
        {"[1]", "cfg.json: expected a JSON object, got an array"},
        {"{\"architectures\": [\"MistralForCausalLM\"]}",
         "cfg.json: architectures: unsupported architecture MistralForCausalLM (supported: Qwen3ForCausalLM, "
         "LlamaForCausalLM)"},
        {"{\"model_type\": \"qwen3\"}", "cfg.json: architectures: expected a list of one string, got nothing"},
        {"{\"architectures\": \"Qwen3ForCausalLM\"}",
         "cfg.json: architectures: expected a list of one string, got \"Qwen3ForCausalLM\""},
        {"{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"llama\"}",
         "cfg.json: model_type: \"llama\" does not match architecture Qwen3ForCausalLM (expected \"qwen3\")"},
        {"{\"architectures\": [\"Qwen3ForCausalLM\"]}", "cfg.json: model_type: missing (required)"},
        {"{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_act\": \"gelu\"}",
         "cfg.json: hidden_act: unsupported \"gelu\" (only silu)"},
        {"{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\"}",
         "cfg.json: hidden_size: missing (required)"},
        {"{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": \"64\"}",
         "cfg.json: hidden_size: expected an integer in [1, 1073741824], got \"64\""},
        {"{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 64,"
         " \"intermediate_size\": 128, \"num_hidden_layers\": 0}",
         "cfg.json: num_hidden_layers: expected an integer in [1, 1073741824], got 0"},
        {"{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 64,"
         " \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
         " \"num_key_value_heads\": 3, \"vocab_size\": 10}",
         "cfg.json: num_key_value_heads: 3 does not divide num_attention_heads (4)"},
        {"{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 66,"
         " \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 10}",
         "cfg.json: head_dim: missing and hidden_size (66) is not a multiple of num_attention_heads (4)"},
        {"{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 64,"
         " \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 10,"
         " \"head_dim\": 15}",
         "cfg.json: head_dim: 15 is odd (rotary embeddings need an even head_dim)"},
        {"{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 64,"
         " \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 10,"
         " \"rms_norm_eps\": \"small\"}",
         "cfg.json: rms_norm_eps: expected a number, got \"small\""},
        {"{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 64,"
         " \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 10,"
         " \"rope_theta\": -1}",
         "cfg.json: rope_theta: expected a positive number, got -1"},
        {"{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 64,"
         " \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 10,"
         " \"rope_theta\": 10000, \"rope_parameters\": {\"rope_theta\": 500000}}",
         "cfg.json: rope_parameters.rope_theta: 500000 disagrees with rope_theta (10000)"},
        {"{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 64,"
         " \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 10,"
         " \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4}}",
         "cfg.json: rope_scaling.rope_type: unsupported \"yarn\" (supported: default, llama3)"},
        {"{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 64,"
         " \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 10,"
         " \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1,"
         " \"high_freq_factor\": 4}}",
         "cfg.json: rope_scaling.original_max_position_embeddings: missing (required for rope_type llama3)"},
        /* found by fuzz/fuzz_hfconfig.c: a value past int was converted to int (undefined behaviour) */
        {"{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 64,"
         " \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 10,"
         " \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1,"
         " \"high_freq_factor\": 4, \"original_max_position_embeddings\": 642147483648}}",
         "cfg.json: rope_scaling.original_max_position_embeddings: expected a whole number up to 1073741824, got "
         "6.42147e+11"},
        {"{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 64,"
         " \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 10,"
         " \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1,"
         " \"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192.5}}",
         "cfg.json: rope_scaling.original_max_position_embeddings: expected a whole number up to 1073741824, got "
         "8192.5"},
        {"{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 64,"
         " \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 10,"
         " \"rope_scaling\": [8]}",
         "cfg.json: rope_scaling: expected an object or null, got an array"},
        {"{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 64,"
         " \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 10,"
         " \"tie_word_embeddings\": 1}",
         "cfg.json: tie_word_embeddings: expected true or false, got 1"},
        {"{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 64,"
         " \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 10,"
         " \"torch_dtype\": \"float8\"}",
         "cfg.json: torch_dtype: unsupported \"float8\" (bfloat16, float16 or float32)"},
        {"{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 64,"
         " \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 10,"
         " \"eos_token_id\": [1, \"2\"]}",
         "cfg.json: eos_token_id[1]: expected a token id >= 0, got \"2\""},
        {"{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 64,"
         " \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 10,"
         " \"layer_types\": [\"full_attention\"]}",
         "cfg.json: layer_types: expected a list of num_hidden_layers (2) strings, got a list of another length"},
        {"{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 64,"
         " \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 10,"
         " \"layer_types\": [\"full_attention\", \"local\"]}",
         "cfg.json: layer_types[1]: expected \"full_attention\" or \"sliding_attention\", got \"local\""},
        {"{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 64,"
         " \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 10,"
         " \"sliding_window\": 0}",
         "cfg.json: sliding_window: expected a positive integer or null, got 0"},
        /* products of the shape fields: checked, bounded, named */
        {"{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 64, "
         "\"intermediate_size\": 128, \"num_hidden_layers\": 2,"
         " \"num_attention_heads\": 1073741824, \"head_dim\": 1073741824, \"vocab_size\": 10}",
         "cfg.json: num_attention_heads x head_dim: 1073741824 x 1073741824 = 1152921504606846976, above the "
         "limit of 1048576"},
        {"{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 64, "
         "\"intermediate_size\": 128, \"num_hidden_layers\": 2,"
         " \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"head_dim\": 1048576, \"vocab_size\": 10}",
         "cfg.json: num_attention_heads x head_dim: 4 x 1048576 = 4194304, above the limit of 1048576"},
        {"{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 1073741824, "
         "\"intermediate_size\": 128, \"num_hidden_layers\": 2,"
         " \"num_attention_heads\": 4, \"vocab_size\": 10}",
         "cfg.json: hidden_size: 1073741824 is above the limit of 1048576"},
        {"{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 65536, "
         "\"intermediate_size\": 128, \"num_hidden_layers\": 2,"
         " \"num_attention_heads\": 4, \"vocab_size\": 1073741824}",
         "cfg.json: vocab_size x hidden_size: 70368744177664 elements in one weight, above the limit of "
         "68719476736"},
        {"{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 8192, "
         "\"intermediate_size\": 28672, \"num_hidden_layers\": 1073741824,"
         " \"num_attention_heads\": 64, \"num_key_value_heads\": 8, \"vocab_size\": 128256}",
         "cfg.json: num_hidden_layers: 1073741824 layers of hidden_size 8192, intermediate_size 28672 and "
         "vocab_size 128256 are more than 4398046511104 parameters"},
        {"{\"architectures\": [\"Qwen3ForCausalLM\"], \"hidden_size\": 64, \"hidden_size\": 65}",
         "cfg.json: line 1 column *"}, /* the tail is jansson's wording */
    };
    for (unsigned i = 0; i < DF_ARRAY_LEN(cases); i++) {
        hfconfig c;
        char err[512] = "";
        int rc = parse(&c, cases[i].json, err, sizeof err);
        if (rc != -EINVAL)
            fprintf(stderr, "case %u: rc %d, err %s\n", i, rc, err);
        T_ASSERT(rc == -EINVAL);
        T_ASSERT(c.layer_types == NULL); /* freed on error */
        size_t ml = strlen(cases[i].msg);
        if (cases[i].msg[ml - 1] == '*')
            T_ASSERT(strncmp(err, cases[i].msg, ml - 1) == 0);
        else
            T_ASSERT_STREQ(err, cases[i].msg);
    }
    /* a missing file names itself */
    hfconfig c;
    char err[512];
    T_ASSERT(hfconfig_load(&c, "/nonexistent/dir/config.json", err, sizeof err) == -ENOENT);
    T_ASSERT_STREQ(err, "/nonexistent/dir/config.json: cannot read: No such file or directory");
    /* config.json that is a FIFO (the read must not block) or a directory */
    char dir[] = "/tmp/df_test_hfc_XXXXXX", cfg[64], want[160];
    T_ASSERT(mkdtemp(dir));
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    T_ASSERT(mkfifo(cfg, 0600) == 0);
    T_ASSERT(hfconfig_load(&c, dir, err, sizeof err) == -EINVAL);
    snprintf(want, sizeof want, "%s: is a FIFO (named pipe), not a regular file", cfg);
    T_ASSERT_STREQ(err, want);
    T_ASSERT(unlink(cfg) == 0 && mkdir(cfg, 0700) == 0);
    T_ASSERT(hfconfig_load(&c, dir, err, sizeof err) == -EINVAL);
    snprintf(want, sizeof want, "%s: is a directory, not a regular file", cfg);
    T_ASSERT_STREQ(err, want);
    T_ASSERT(rmdir(cfg) == 0 && rmdir(dir) == 0);
    printf("bad configs: %zu messages ok\n", DF_ARRAY_LEN(cases) + 3);
}

int main(void)
{
    good();
    fixtures();
    bad();
    printf("test_hfconfig: ok\n");
    return 0;
}
