/* target_model.h: the frozen target LLM (Qwen3 / Qwen3-MoE / Llama, HF format), its weights
 * and its CPU forward (prefix target_).
 *
 * The target worker only needs the features of a few layers (docs/dflash_spec.md: "layer l"
 * is the OUTPUT of decoder layer l, HF hidden_states[l+1], before any final norm), so
 * target_load reads config.json and the weights of layers 0..max(capture) only: no later
 * layers, no final norm, no lm_head. Weights are converted to fp32 (bf16/f16/f32 files);
 * the embedding table stays in the file mapping and rows are converted on lookup, so a
 * large vocabulary costs no extra memory.
 *
 * Errors: target_load checks every tensor it needs is present with the expected shape and a
 * float dtype; the message names the file and the tensor, e.g.
 *   tiny/model.safetensors: tensor "model.layers.0.self_attn.q_proj.weight": shape [64, 32], expected [64, 64]
 * A missing or malformed model is permanent: target_exit_code(rc) maps the return code to
 * DF_EXIT_PERM (100) so the supervisor does not restart the worker into the same error.
 *
 * Forward over ONE packed row of T tokens holding n_docs documents (doc_starts[0] = 0,
 * strictly increasing, doc_starts[n_docs] = T): positions restart at 0 per document and
 * attention never crosses a document boundary. The captured features go to the caller's
 * buffer, layout [T, n_capture, d] fp32, in the order of capture_layers given to target_load:
 * out[(t * n_capture + c) * d + i] = output of decoder layer capture_layers[c] at token t.
 * Row t is then exactly the drafter's fc input concat_c H_c for that token.
 *
 * Mixture of experts (Qwen3-MoE, hfconfig_layer_is_moe): a sparse layer's MLP is the routed
 * experts of common/nn/moe.c (nn_moe_route + nn_moe_experts). Its weights come from either
 * layout, detected per layer and recorded in expert_layout:
 *   per-expert (published checkpoints): model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight
 *              [F, d], [F, d], [d, F]
 *   fused (transformers 5 in memory):   model.layers.L.mlp.experts.gate_up_proj [E, 2F, d]
 *              (rows 0..F-1 of expert e are gate_proj, F..2F-1 up_proj: transformers splits
 *              linear(x, gate_up_proj[e]) with .chunk(2) as gate, up), mlp.experts.down_proj [E, d, F]
 * and the router model.layers.L.mlp.gate.weight [E, d] in both. A layer holding both layouts
 * is refused; a missing expert tensor is an error naming it.
 *
 * Ownership: target_model owns its weights, workspace and the open safetensors_model; target_free
 * releases all of it (safe on a zeroed or failed model). Not thread-safe: one forward
 * at a time per model (the workspace is shared).
 */
#ifndef DF_TARGET_MODEL_H
#define DF_TARGET_MODEL_H

#include "io/hfconfig.h"
#include "io/safetensors.h"
#include "nn/nn.h"

#include <stddef.h>
#include <stdint.h>

typedef struct target_layer {
    float *in_norm;                /* [d] input_layernorm */
    float *wq, *wk, *wv, *wo;      /* [H*hd, d], [KV*hd, d], [KV*hd, d], [d, H*hd] */
    float *bq, *bk, *bv, *bo;      /* biases or NULL (attention_bias) */
    float *q_norm, *k_norm;        /* [hd] or NULL (Qwen3 only) */
    float *post_norm;              /* [d] post_attention_layernorm */
    float *w_gate, *w_up, *w_down; /* dense: [I, d], [I, d], [d, I]; sparse (moe): every expert,
                                    * [E, F, d], [E, F, d], [E, d, F] (nn.h's MoE layout) */
    float *b_gate, *b_up, *b_down; /* biases or NULL (Llama mlp_bias) */
    int moe;                       /* 1: routed experts (hfconfig_layer_is_moe) */
    float *w_router;               /* [E, d] mlp.gate.weight (moe only) */
} target_layer;

/* Activations for max_T tokens, allocated once (target_reserve); the forward never allocates
 * unless a call exceeds max_T. */
typedef struct target_workspace {
    int max_T;
    float *x;                      /* [T, d] residual stream */
    float *a;                      /* [T, d] normed input / block output */
    float *q, *att;                /* [T, H*hd] */
    float *k, *v;                  /* [T, KV*hd] */
    float *g, *u;                  /* [T, I] */
    nn_key_ranges *full, *sliding; /* [T] attention ranges per query */
    int32_t *pos;                  /* [T] position inside the document */
    /* routed experts (NULL for a dense model). After a forward they hold the routing of the
     * LAST sparse layer run (tests load a model up to one layer to read that layer's). */
    float *moe_logits, *moe_probs; /* [T, E] */
    int32_t *moe_idx;              /* [T, k] experts, descending probability */
    float *moe_w;                  /* [T, k] their weights */
    float *moe_out;                /* [T, d] */
    float *moe_scratch;            /* nn_moe_scratch_floats(T, d, F) */
    int32_t *moe_rows;             /* [T] */
} target_workspace;

typedef struct target_model {
    hfconfig cfg;
    safetensors_model st;            /* kept open: the embedding table is read from the mapping */
    const safetensors_tensor *embed; /* model.embed_tokens.weight [V, d] (borrowed from st) */
    int n_layers;                    /* layers run = max(capture) + 1 */
    int n_capture;
    int *capture;              /* [n_capture] layer ids in the caller's order */
    int *capture_slot;         /* [n_layers] slot in the output or -1 */
    target_layer *layers;      /* [n_layers] */
    float *inv_freq;           /* [hd/2] */
    const char *expert_layout; /* "per-expert" / "fused" (first sparse layer loaded), NULL when dense */
    target_workspace ws;
} target_model;

/* Load config + the weights of layers 0..max(capture_layers) from an HF model dir.
 * capture_layers: n_capture distinct ids in [0, num_hidden_layers), any order.
 * 0 or -errno (-EINVAL / -ENOENT: bad or missing model, permanent) with err set. */
int target_load(target_model *m, const char *dir, const int *capture_layers, int n_capture, char *err, size_t errlen);
void target_free(target_model *m);
/* A weight with a NaN or Inf element is a bad model: scan tensor t (F32, BF16 or F16, raw
 * bytes, no conversion) and return -EINVAL with err naming the file, the tensor, the first
 * bad element and its value; 0 when every element is finite (other dtypes: 0). Both load
 * paths (target_load / target_load_embeddings on the CPU, target_load_cuda on the GPU) call it on every
 * tensor they use, before the first forward. */
int target_check_finite(const safetensors_tensor *t, const char *fpath, char *err, size_t errlen);
/* Find tensor name in st with exactly shape[0..ndim) and a float dtype (F32, BF16, F16),
 * every element finite (target_check_finite): *out is it, *fpath_out (when not NULL) the
 * file that holds it. Else -ENOENT / -EINVAL with err naming the file, the tensor and what
 * was found against what was expected. Both load paths find every weight through it. */
/* Which expert layout sparse layer l of st holds: 1 the fused gate_up_proj / down_proj
 * [E, ...] tensors, 0 per-expert experts.{e}.*_proj tensors; -EINVAL when both are there,
 * -ENOENT when neither (err names the tensors looked for and the files). */
int target_expert_layout(const safetensors_model *st, int l, char *err, size_t errlen);
int target_find_tensor(const safetensors_model *st, const char *name, int ndim, const int64_t *shape,
                       const safetensors_tensor **out, const char **fpath_out, char *err, size_t errlen);
/* DF_EXIT_PERM for a bad/missing model (EINVAL, ENOENT, ENOTDIR, EACCES), else DF_EXIT_TEMP. */
int target_exit_code(int rc);

/* Allocate the workspace for up to max_T tokens (frees a smaller one). 0 or -ENOMEM. */
int target_reserve(target_model *m, int max_T);

/* out[T, d] = embedding rows of tokens[T]. 0, or -ERANGE for a token id outside [0, V). */
int target_embed(const target_model *m, const int32_t *tokens, int T, float *out);

/* The CPU forward described above. out_capture: [T, n_capture, d] fp32, T =
 * doc_starts[n_docs]. 0, -EINVAL (bad doc_starts), -ERANGE (bad token id), -ENOMEM. */
int target_forward_cpu(target_model *m, const int32_t *tokens, const int32_t *doc_starts, int n_docs,
                       float *out_capture);

/* The MLP block of loaded layer l over rows 0..T-1 of the workspace: reads the
 * post-attention-normed rows ws.a, returns the block's output [T, d] (ws.a itself for a
 * dense layer, ws.moe_out for routed experts); the caller adds it to the residual stream.
 * Shared by target_forward_cpu and target_decode.c so the two run the same math. The
 * workspace must hold T rows (target_reserve). */
const float *target_mlp_cpu(target_model *m, int l, int T);

/* What the drafter takes from the target, as fp32: embed [V, d]; lm_head [V, d], the
 * same pointer as embed when the target ties them; final_norm [d] when asked (else NULL).
 * target_embeddings_free frees them (once when tied). */
typedef struct target_embeddings {
    int vocab, hidden, tied;
    float *embed, *lm_head, *final_norm;
} target_embeddings;
int target_load_embeddings(target_embeddings *e, const char *dir, int want_final_norm, char *err, size_t errlen);
void target_embeddings_free(target_embeddings *e);

#endif
