/* dflash_config.h: the DFlash drafter's shape and constants (docs/dflash_spec.md), and the
 * release config.json (z-lab format) read/write. One struct that every other dflash_*
 * file takes; validated once so the math code can trust it. */
#ifndef DF_DFLASH_CONFIG_H
#define DF_DFLASH_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "nn/nn.h" /* nn_rope_scaling */

#define DFLASH_MAX_LAYERS 64
#define DFLASH_MAX_CAPTURE 32

/* The training objective (docs/dflash_spec.md "Loss weights"): the fixed exponential decay
 * exp(-(k-1)/gamma), or D-PACE (position weights from the drafter's own detached confidence,
 * dflash_loss.h). A training setting like gamma: in trainer_state.json and the release
 * config only when it is not the default (decay). */
typedef enum { DFLASH_LOSS_DECAY = 0, DFLASH_LOSS_DPACE = 1 } dflash_loss_kind;
#define DFLASH_DPACE_ALPHA_DEFAULT 0.5

typedef struct dflash_config {
    int hidden;       /* d */
    int intermediate; /* I (SwiGLU width) */
    int n_layers;     /* drafter decoder layers */
    int n_heads, n_kv_heads, head_dim;
    int vocab;      /* V: rows of the target's embedding / lm_head */
    int block_size; /* B */
    int n_capture;  /* n: number of captured target layers */
    int target_layer_ids[DFLASH_MAX_CAPTURE];
    int num_target_layers;                    /* L of the target */
    int mask_token_id;                        /* a row of the target's embedding table */
    int sliding_window;                       /* W, used by layers with layer_sliding[l] = 1 */
    uint8_t layer_sliding[DFLASH_MAX_LAYERS]; /* 1 = "sliding_attention", 0 = "full_attention" */
    int tie_word_embeddings;                  /* the target's: lm_head IS the embedding matrix */
    int max_position_embeddings;
    double rms_norm_eps; /* used as float in the math */
    double rope_theta;
    /* The drafter's RoPE scaling: none (factor 0) for every drafter, set so by each reader of
     * a config (dflash_config_from_json, the trainer's from the topology): the release
     * config.json says rope_type "default" (dflash_config_to_json), so transformers computes
     * the drafter's frequencies unscaled and so must we; a llama3 target's scaling
     * (hfconfig) is not carried over, only its rope_theta. Pass it to nn_rope_inv_freq. */
    nn_rope_scaling rope_scaling;
    double gamma;       /* loss decay exp(-(k-1)/gamma), resolved by the reader; not in the release config */
    int loss;           /* dflash_loss_kind; 0 (memset) = decay */
    double dpace_alpha; /* D-PACE smoothing, (0, 1]; read only when loss is DPACE */
} dflash_config;

/* "decay" / "dpace" (NULL for a value outside the enum) and back (-1: unknown name). */
const char *dflash_loss_name(int loss);
int dflash_loss_parse(const char *name);

/* Loss decay constant of the paper: 7 for B=16, 5 for B=10, 4 for B=8, else B/2.3 rounded
 * to the nearest 0.1 (our choice for other block sizes). */
double dflash_default_gamma(int block_size);

/* Default captured layers round(1 + i*(L-4)/(n-1)), i = 0..n-1 (n = 1: L/2). */
void dflash_default_layer_ids(int *ids, int n, int num_target_layers);

/* A small config for tests and `dflash_tool init` defaults: d=32, H=4, KV=2, hd=8, I=64,
 * V=50, B=4, 2 layers (layer 1 sliding, W=8), 2 captured layers of a 6-layer target. */
void dflash_config_tiny(dflash_config *c);

/* 0, or -EINVAL with a message naming the bad field in err. */
int dflash_config_validate(const dflash_config *c, char *err, size_t errlen);

/* Trainable parameter count (what the checkpoint holds). */
size_t dflash_config_param_count(const dflash_config *c);

/* Release config.json (docs/dflash_spec.md "config.json of a release"), written atomically.
 * 0 or -errno. */
int dflash_config_write_release(const dflash_config *c, const char *path);
/* Parse a release config.json. Missing optional fields get Qwen3 defaults (sliding off,
 * gamma from block_size); a missing or mistyped required field is -EINVAL with the file
 * and field named in err. 0 or -errno. */
int dflash_config_read_release(dflash_config *c, const char *path, char *err, size_t errlen);

/* The same fields as a jansson object (new reference; NULL on ENOMEM) and back: used by
 * trainer_state.json. from_json: 0 or -EINVAL with err naming the field. */
struct json_t;
struct json_t *dflash_config_to_json(const dflash_config *c);
int dflash_config_from_json(dflash_config *c, const struct json_t *obj, const char *what, char *err, size_t errlen);

#endif
