/* hfconfig.h: a Hugging Face config.json of a Qwen3, Qwen3-MoE or Llama causal LM, parsed
 * into a plain struct (prefix hfconfig_).
 *
 * Only the architectures the target worker can run are accepted (Qwen3ForCausalLM,
 * Qwen3MoeForCausalLM, LlamaForCausalLM); anything else is refused up front with
 * "unsupported architecture X" rather than run with the wrong math. Fields that
 * transformers fills with a class default when absent get the same default here
 * (listed per field below and in docs/target.md); the shape fields have no default and
 * their absence is an error. Both rope layouts are read: transformers 4
 * (top-level rope_theta + rope_scaling) and 5 (rope_parameters with rope_theta inside).
 *
 * The shape fields' products (attention widths, the largest weights, the parameter count)
 * are computed with overflow checks and bounded by the HFCONFIG_MAX_* limits below; the file
 * must be a regular file (a FIFO is refused without blocking).
 * Errors name the file and the field, e.g.
 *   tiny/config.json: num_key_value_heads: 3 does not divide num_attention_heads (4)
 *
 * Qwen3-MoE (model_type qwen3_moe): the Qwen3 layer with the MLP of some layers replaced by
 * a routed mixture of experts (docs/target.md, "Mixture-of-experts targets"). Read:
 * num_experts (or num_local_experts), num_experts_per_tok, moe_intermediate_size (required:
 * they shape the weights), norm_topk_prob (default false, as transformers),
 * decoder_sparse_step (default 1), mlp_only_layers (default []); dense layers keep
 * intermediate_size (default 6144, transformers' class default, as published MoE configs that
 * have no dense layer still carry it). router_aux_loss_coef, output_router_logits and
 * router_jitter_noise only matter to training and are ignored by design. Fields of other MoE
 * families this code does not implement (shared experts, non-softmax scoring, grouped top-k,
 * a routed scaling factor, leading dense layers by count) are refused by name when they
 * would change the math, never ignored; so is use_sliding_window for qwen3_moe.
 * Return values: 0 or -EINVAL (bad content), -ENOENT/-errno (cannot read), -ENOMEM.
 * Ownership: hfconfig_free releases layer_types / moe_layer and zeroes the struct; safe on a zeroed one.
 */
#ifndef DF_HFCONFIG_H
#define DF_HFCONFIG_H

#include "nn/nn.h"

#include <stddef.h>
#include <stdint.h>

typedef enum { HFCONFIG_ARCH_QWEN3, HFCONFIG_ARCH_LLAMA, HFCONFIG_ARCH_QWEN3_MOE } hfconfig_arch;
typedef enum { HFCONFIG_FULL_ATTENTION, HFCONFIG_SLIDING_ATTENTION } hfconfig_layer_type;

#define HFCONFIG_MAX_EOS 8
/* Sanity limits on the products of the shape fields (checked in 64-bit arithmetic):
 * hidden_size and heads x head_dim (any kind of head), elements in one weight matrix, total
 * parameters. The largest released models are far below each (widths ~2^14, matrices
 * ~2^32 elements, ~2^40 parameters). */
#define HFCONFIG_MAX_WIDTH ((uint64_t)1 << 20)
#define HFCONFIG_MAX_TENSOR ((uint64_t)1 << 36)
#define HFCONFIG_MAX_PARAMS ((uint64_t)1 << 42)

typedef struct hfconfig {
    hfconfig_arch arch;
    char architecture[64]; /* "Qwen3ForCausalLM" / "Qwen3MoeForCausalLM" / "LlamaForCausalLM" */
    char model_type[32];   /* "qwen3" / "qwen3_moe" / "llama" (required, must match the architecture) */
    int hidden_size, intermediate_size, num_hidden_layers;
    int num_attention_heads;
    int num_key_value_heads; /* default: num_attention_heads */
    int head_dim;            /* given; else Qwen3: 128 (its class default), Llama and Qwen3-MoE: hidden / heads */
    int vocab_size;
    int max_position_embeddings;             /* 0 when absent */
    double rms_norm_eps;                     /* default 1e-6 */
    double rope_theta;                       /* top-level, or rope_parameters / rope_scaling; default 10000 */
    char rope_type[16];                      /* "default" or "llama3", as the file says */
    nn_rope_scaling rope_scaling;            /* resolved here: factor 0 (none) unless rope_type is llama3;
                                                every RoPE of the model passes it as is */
    int tie_word_embeddings;                 /* default 0 (both classes) */
    char dtype[16];                          /* torch_dtype or dtype: "bfloat16", "float16", "float32"; "" if absent */
    int attention_bias;                      /* q/k/v/o projections carry a bias; default 0 */
    int mlp_bias;                            /* Llama gate/up/down bias; default 0 (Qwen3 has none) */
    int qk_norm;                             /* per-head q_norm / k_norm: 1 for Qwen3 (and MoE), 0 for Llama */
    int64_t bos_token_id, pad_token_id;      /* -1 when absent or null */
    int64_t eos_token_ids[HFCONFIG_MAX_EOS]; /* eos_token_id: an integer or a list */
    int n_eos;
    int sliding_window;               /* 0 when absent / null */
    hfconfig_layer_type *layer_types; /* [num_hidden_layers], malloc'd; all full unless
                                  * layer_types says so or (Qwen3) use_sliding_window
                                  * with layers >= max_window_layers */
    /* Qwen3-MoE only (all 0 / NULL otherwise): */
    int num_experts;           /* E: experts per sparse layer */
    int num_experts_per_tok;   /* k: experts each token is routed to, 1..E */
    int moe_intermediate_size; /* F: each expert's SwiGLU width */
    int norm_topk_prob;        /* renormalise the k routing weights to sum 1 (default false) */
    int decoder_sparse_step;   /* default 1 */
    unsigned char *moe_layer;  /* [num_hidden_layers], malloc'd: 1 = sparse (routed experts), 0 = dense */
    int n_moe_layers;          /* layers with moe_layer[l] = 1 */
} hfconfig;

/* 1 when decoder layer `layer` is a routed mixture of experts, transformers' rule: a
 * qwen3_moe layer l is sparse iff l is not in mlp_only_layers, num_experts > 0 and
 * (l + 1) % decoder_sparse_step == 0. 0 for dense architectures and out-of-range layers. */
int hfconfig_layer_is_moe(const hfconfig *c, int layer);

/* Parse json[len] (not NUL-terminated) naming errors after `name` (a path). */
int hfconfig_parse(hfconfig *c, const char *json, size_t len, const char *name, char *err, size_t errlen);
/* Read and parse a file; path may be a config.json or a directory holding one. */
int hfconfig_load(hfconfig *c, const char *path, char *err, size_t errlen);
void hfconfig_free(hfconfig *c);

/* generation_config.json beside a model's config.json: the stop tokens and the sampling
 * defaults the model's authors ship (what transformers' generate uses when the caller
 * gives none). Absent file: found = 0 and the transformers defaults below. Fields:
 *   eos_token_id   an integer or a list (n_eos = 0 when absent or null)
 *   do_sample      default false; when false, temperature / top_p / top_k do not apply
 *   temperature    default 1.0, >= 0        top_p  default 1.0, in (0, 1]
 *   top_k          default 50, >= 0 (0: off) max_new_tokens  0 when absent
 * Errors name the file and the field; 0 or -EINVAL / -errno. */
typedef struct hfconfig_generation {
    int found;
    int64_t eos_token_ids[HFCONFIG_MAX_EOS];
    int n_eos;
    int do_sample;
    double temperature, top_p;
    int top_k;
    int max_new_tokens;
} hfconfig_generation;
int hfconfig_load_generation(hfconfig_generation *g, const char *model_dir, char *err, size_t errlen);

#endif
