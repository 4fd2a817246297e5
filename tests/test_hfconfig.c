/* test_hfconfig.c: config.json parsing for Qwen3 / Llama targets.
 *   - real-world layouts: Qwen3 (transformers 4), Llama 3.1 with llama3 rope scaling,
 *     the transformers 5 layout (rope_parameters, dtype), Qwen3 sliding-window rules
 *   - Qwen3-MoE: Qwen3-30B-A3B's config (every layer sparse), a transformers-5 style one
 *     (num_local_experts, no head_dim, mlp_only_layers + decoder_sparse_step), the rule of
 *     hfconfig_layer_is_moe, and the MoE fields of other families refused by name
 *   - the fixture configs tests/fixtures/tiny-{qwen3,llama,qwen3-moe}/config.json when present
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

static const char *qwen3_30b_a3b =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
    " \"bos_token_id\": 151643, \"decoder_sparse_step\": 1, \"eos_token_id\": 151645, \"head_dim\": 128,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 6144,"
    " \"max_position_embeddings\": 40960, \"max_window_layers\": 48, \"mlp_only_layers\": [],"
    " \"model_type\": \"qwen3_moe\", \"moe_intermediate_size\": 768, \"norm_topk_prob\": true,"
    " \"num_attention_heads\": 32, \"num_experts\": 128, \"num_experts_per_tok\": 8, \"num_hidden_layers\": 48,"
    " \"num_key_value_heads\": 4, \"output_router_logits\": false, \"rms_norm_eps\": 1e-06, \"rope_scaling\": null,"
    " \"rope_theta\": 1000000.0, \"router_aux_loss_coef\": 0.001, \"sliding_window\": null,"
    " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.51.0\","
    " \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}";

/* transformers 5 style: num_local_experts, rope_parameters, no head_dim (hidden / heads), no
 * intermediate_size (6144), norm_topk_prob absent (false), a listed dense layer and step 2 */
static const char *qwen3_moe_v5 =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"hidden_size\": 64,"
    " \"num_hidden_layers\": 6, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 300,"
    " \"num_local_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32,"
    " \"decoder_sparse_step\": 2, \"mlp_only_layers\": [3], \"dtype\": \"bfloat16\","
    " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0}, \"scoring_func\": \"softmax\","
    " \"shared_expert_intermediate_size\": 0, \"router_jitter_noise\": 0.0}";

static void moe(void)
{
    hfconfig c;
    char err[512] = "";
    int rc = parse(&c, qwen3_30b_a3b, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "%s\n", err);
    T_ASSERT_RC(rc);
    T_ASSERT(c.arch == HFCONFIG_ARCH_QWEN3_MOE && !strcmp(c.architecture, "Qwen3MoeForCausalLM") &&
             !strcmp(c.model_type, "qwen3_moe"));
    T_ASSERT(c.num_hidden_layers == 48 && c.hidden_size == 2048 && c.num_attention_heads == 32 &&
             c.num_key_value_heads == 4 && c.head_dim == 128 && c.vocab_size == 151936);
    T_ASSERT(c.num_experts == 128 && c.num_experts_per_tok == 8 && c.moe_intermediate_size == 768 &&
             c.norm_topk_prob == 1 && c.decoder_sparse_step == 1 && c.n_moe_layers == 48);
    T_ASSERT(c.qk_norm == 1 && c.mlp_bias == 0 && c.tie_word_embeddings == 0 && c.sliding_window == 0);
    for (int l = 0; l < 48; l++)
        T_ASSERT(hfconfig_layer_is_moe(&c, l) == 1);
    T_ASSERT(hfconfig_layer_is_moe(&c, 48) == 0 && hfconfig_layer_is_moe(&c, -1) == 0);
    hfconfig_free(&c);
    T_ASSERT(c.moe_layer == NULL);

    T_ASSERT_RC(parse(&c, qwen3_moe_v5, err, sizeof err));
    T_ASSERT(c.num_experts == 8 && c.head_dim == 16 && c.intermediate_size == 6144 && c.norm_topk_prob == 0);
    T_ASSERT(c.rope_theta == 1e6 && c.decoder_sparse_step == 2 && c.n_moe_layers == 2);
    /* (l + 1) % 2 == 0 gives 1, 3, 5; 3 is listed in mlp_only_layers */
    static const int want[6] = {0, 1, 0, 0, 0, 1};
    for (int l = 0; l < 6; l++)
        T_ASSERT(hfconfig_layer_is_moe(&c, l) == want[l]);
    hfconfig_free(&c);

    /* a dense architecture has no sparse layer, whatever MoE-looking fields it carries */
    T_ASSERT_RC(parse(&c, qwen3_06b, err, sizeof err));
    T_ASSERT(c.n_moe_layers == 0 && c.moe_layer == NULL && hfconfig_layer_is_moe(&c, 0) == 0);
    hfconfig_free(&c);
    printf("MoE configs: Qwen3-30B-A3B, transformers-5 layout, sparse-layer rule ok\n");
}

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
    if (access("tests/fixtures/tiny-qwen3-moe/config.json", F_OK) == 0) {
        T_ASSERT_RC(hfconfig_load(&c, "tests/fixtures/tiny-qwen3-moe", err, sizeof err));
        T_ASSERT(c.arch == HFCONFIG_ARCH_QWEN3_MOE && c.num_experts == 8 && c.num_experts_per_tok == 2);
        T_ASSERT(c.moe_intermediate_size == 32 && c.norm_topk_prob == 1 && c.head_dim == 16);
        /* make_moe_fixture.py: mlp_only_layers [0], decoder_sparse_step 2 */
        T_ASSERT(!hfconfig_layer_is_moe(&c, 0) && hfconfig_layer_is_moe(&c, 1) && !hfconfig_layer_is_moe(&c, 2) &&
                 hfconfig_layer_is_moe(&c, 3));
        hfconfig_free(&c);
        n++;
    }
    printf("fixture configs: %d of 3 present and checked\n", n);
}

/* a qwen3_moe config without its expert fields, and one with them */
#define MOE_BASE                                                                                         \
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"hidden_size\": 64," \
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 10"
#define MOE_OK MOE_BASE ", \"num_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 16"

/* bad configs: the base is a valid small Qwen3 config with one field replaced */
static void bad(void)
{
    static const struct {
        const char *json, *msg;
    } cases[] = {
        {"[1]", "cfg.json: expected a JSON object, got an array"},
        {"{\"architectures\": [\"MistralForCausalLM\"]}",
         "cfg.json: architectures: unsupported architecture MistralForCausalLM (supported: Qwen3ForCausalLM, "
         "Qwen3MoeForCausalLM, LlamaForCausalLM)"},
        {"{\"architectures\": [\"Qwen2MoeForCausalLM\"]}",
         "cfg.json: architectures: unsupported architecture Qwen2MoeForCausalLM (supported: Qwen3ForCausalLM, "
         "Qwen3MoeForCausalLM, LlamaForCausalLM)"},
        {"{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3\"}",
         "cfg.json: model_type: \"qwen3\" does not match architecture Qwen3MoeForCausalLM (expected \"qwen3_moe\")"},
        /* qwen3_moe: the expert fields (the base: 2 layers, 8 experts) */
        {MOE_BASE "}", "cfg.json: num_experts: missing (required)"},
        {MOE_BASE ", \"num_experts\": 8}", "cfg.json: num_experts_per_tok: missing (required)"},
        {MOE_BASE ", \"num_experts\": 8, \"num_experts_per_tok\": 2}",
         "cfg.json: moe_intermediate_size: missing (required)"},
        {MOE_BASE ", \"num_experts\": 8, \"num_experts_per_tok\": 9, \"moe_intermediate_size\": 16}",
         "cfg.json: num_experts_per_tok: 9 is more than num_experts (8)"},
        {MOE_BASE ", \"num_experts\": 8, \"num_local_experts\": 16, \"num_experts_per_tok\": 2}",
         "cfg.json: num_local_experts: 16 disagrees with num_experts (8)"},
        {MOE_OK ", \"decoder_sparse_step\": 0}",
         "cfg.json: decoder_sparse_step: expected an integer in [1, 1073741824], got 0"},
        {MOE_OK ", \"norm_topk_prob\": 1}", "cfg.json: norm_topk_prob: expected true or false, got 1"},
        {MOE_OK ", \"mlp_only_layers\": [0, 2]}", "cfg.json: mlp_only_layers[1]: expected a layer id in [0, 2), got 2"},
        {MOE_OK ", \"mlp_only_layers\": 0}", "cfg.json: mlp_only_layers: expected a list of layer ids, got 0"},
        {MOE_OK ", \"shared_expert_intermediate_size\": 5632}",
         "cfg.json: shared_expert_intermediate_size: 5632 is not supported (shared experts (Qwen2-MoE); only "
         "qwen3_moe's routed experts are implemented)"},
        {MOE_OK ", \"n_shared_experts\": 2}",
         "cfg.json: n_shared_experts: 2 is not supported (shared experts (DeepSeek-MoE); only qwen3_moe's routed "
         "experts are implemented)"},
        {MOE_OK ", \"scoring_func\": \"sigmoid\"}",
         "cfg.json: scoring_func: \"sigmoid\" is not supported (a router scoring function other than softmax; only "
         "qwen3_moe's routed experts are implemented)"},
        {MOE_OK ", \"routed_scaling_factor\": 2.5}",
         "cfg.json: routed_scaling_factor: 2.5 is not supported (a routed scaling factor; only qwen3_moe's routed "
         "experts are implemented)"},
        {MOE_OK ", \"topk_group\": 4}",
         "cfg.json: topk_group: 4 is not supported (grouped top-k routing; only qwen3_moe's routed experts are "
         "implemented)"},
        {MOE_OK ", \"router_bias\": true}",
         "cfg.json: router_bias: true is not supported (the qwen3_moe router has no bias)"},
        {MOE_OK ", \"use_sliding_window\": true, \"sliding_window\": 64}",
         "cfg.json: use_sliding_window: true is not supported for qwen3_moe (which layers slide differs between "
         "transformers versions)"},
        {MOE_BASE ", \"num_experts\": 65536, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 1073741824}",
         "cfg.json: num_experts x 2 x moe_intermediate_size x hidden_size: 9007199254740992 elements in one "
         "weight, above the limit of 68719476736"},
        {"{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"hidden_size\": 64,"
         " \"num_hidden_layers\": 64, \"num_attention_heads\": 4, \"vocab_size\": 10, \"num_experts\": 4096,"
         " \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 131072}",
         "cfg.json: num_hidden_layers: 64 layers (64 of 4096 experts of moe_intermediate_size 131072) of hidden_size "
         "64 and vocab_size 10 are more than 4398046511104 parameters"},
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
            fprintf(stderr, "case %u: rc %d, err %s\n  json %s\n", i, rc, err, cases[i].json);
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
    moe();
    fixtures();
    bad();
    printf("test_hfconfig: ok\n");
    return 0;
}
