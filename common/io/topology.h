/* topology.h: the pipeline's topology file (JSON, version 1) parsed into a plain struct.
 *
 * The orchestrator reads one topology file at start and refuses to start anything when it
 * is wrong: every error names the JSON path and what was expected, e.g.
 *   configs/x.json: workers[2].gpu: expected an integer -1..7, got "a"
 * so an operator can fix the file without reading code. After a successful load every field
 * holds a value (defaults filled in), and the cross-references are resolved to indices
 * (a worker's "in"/"out" ring name -> index into t->rings), so the rest of the code never
 * looks at JSON. topology_to_json gives back the normalised form, written into the run dir as
 * topology.json so a run records exactly what it ran with. The schema is docs/topology.md.
 *
 * Ownership: a topo owns every pointer in it (strings, arrays, env/args vectors); topology_free
 * releases them and resets the struct to zeros. topology_free is safe on a zeroed struct and on
 * one that a failed parse left half-filled (parse frees on error anyway).
 */
#ifndef DF_TOPOLOGY_H
#define DF_TOPOLOGY_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define TOPOLOGY_MAX_WORKERS 64
#define TOPOLOGY_MAX_RINGS 16
#define TOPOLOGY_MAX_GPU 7
#define TOPOLOGY_MAX_DRAFTER_LAYERS 64 /* drafter.num_layers 1..64 (DFLASH_MAX_LAYERS) */

typedef enum { TOPOLOGY_CPU, TOPOLOGY_CUDA } topology_backend;
typedef enum {
    TOPOLOGY_ROLE_TARGET,
    TOPOLOGY_ROLE_POSTPROC,
    TOPOLOGY_ROLE_DRAFTER,
    TOPOLOGY_ROLE_TEST,
    TOPOLOGY_ROLE_VALIDATOR /* scores committed checkpoints on held-out data (eval/validator_main.c) */
} topology_role;

typedef struct topology_ring {
    char name[32];         /* 1..31 chars [a-z0-9_-] */
    uint32_t slots;        /* 1..4096 */
    uint64_t slot_bytes;   /* 4096..(1<<40) */
    uint32_t max_attempts; /* 1..100: a batch is poisoned after this many failed consumers */
    int gpu;               /* -1 = host memory, else the CUDA device of the slots */
} topology_ring;

typedef struct topology_worker {
    char name[32];
    topology_role role;
    int gpu;                       /* -1 (CPU) or 0..7 */
    int in_ring, out_ring;         /* index into topo.rings or -1 */
    int rank;                      /* drafter rank 0..R-1; -1 for other roles */
    uint32_t heartbeat_timeout_ms; /* default: supervision.heartbeat_timeout_ms */
    uint32_t startup_timeout_ms;   /* spawn to ready; default: supervision.startup_timeout_ms */
    char **env;                    /* "K=V", NULL-terminated, owned */
    char **args;                   /* NULL-terminated, owned */
} topology_worker;

/* drafter.loss: the training objective (docs/dflash_spec.md "Loss weights") */
typedef enum { TOPOLOGY_LOSS_DECAY = 0, TOPOLOGY_LOSS_DPACE = 1 } topology_loss;

typedef struct topology_drafter {
    uint32_t num_layers, block_size, num_anchors;
    double gamma, lr, warmup_frac, weight_decay, grad_clip, noise_std;
    topology_loss loss; /* "decay" (default: exp(-(k-1)/gamma)) or "dpace" */
    double dpace_alpha; /* D-PACE confidence smoothing, (0, 1], default 0.5 (read with "dpace" only) */
    uint32_t epochs, checkpoint_every;
    uint32_t keep_checkpoints;        /* newest step dirs kept (0 = all; default 3) */
    uint32_t max_checkpoint_failures; /* consecutive failed checkpoints -> exit 100 (default 3) */
    int checkpoint_async;             /* written on a thread while training goes on (default true) */
    uint32_t max_nonfinite_steps;     /* consecutive NaN/Inf loss or gradient steps -> exit 100 (default 3) */
    uint32_t allreduce_bucket_kb;     /* gradient all-reduce buckets, KiB (0 = per layer; default 16384) */
    char *init_dir;                   /* NULL = fresh init */
    int64_t mask_token_id;            /* -1 = default */
    /* The attention kind of each layer (drafter.layer_types). layer_types_given 0 (absent or
     * null): every layer full attention, or a drafter.init_dir release's own kinds; 1: these,
     * which a release must match. sliding_window: the sliding layers' window in tokens, 0 =
     * none; given exactly when some layer is sliding. */
    int layer_types_given;
    uint8_t layer_sliding[TOPOLOGY_MAX_DRAFTER_LAYERS]; /* 1 = "sliding_attention", 0 = "full_attention" */
    uint32_t sliding_window;
} topology_drafter;

/* The optional top-level "validation" section: the held-out set the validator worker
 * scores every committed checkpoint on (docs/topology.md). enabled 0 = section absent. */
typedef struct topology_validation {
    int enabled;
    char **shards; /* [n_shards] */
    int n_shards;
    uint32_t max_samples; /* the first N samples over the shards */
    uint32_t every_steps; /* score checkpoints whose step is a multiple of this; 0 = every one */
} topology_validation;

typedef struct topology_supervision {
    uint32_t backoff_initial_ms, backoff_max_ms, stable_ms, max_restarts, restart_window_s, heartbeat_timeout_ms,
        startup_timeout_ms, shutdown_timeout_ms, metrics_interval_ms;
} topology_supervision;

typedef struct topo {
    int version;
    char name[64];
    char *description; /* free text for people (benchmark, recipe, default); NULL = none */
    char *run_dir;
    topology_backend backend;
    uint64_t seed;
    int deterministic;
    char *target_model_dir;
    int *capture_layers; /* [n_capture], strictly increasing */
    int n_capture;
    topology_drafter drafter;
    char **shards; /* [n_shards] */
    int n_shards;
    uint64_t token_budget;
    uint32_t max_seq_len;
    topology_ring *rings; /* [n_rings] */
    int n_rings;
    topology_worker *workers; /* [n_workers] */
    int n_workers;
    topology_supervision sup;
    topology_validation val;
    char *bin_dir;     /* NULL = next to the orchestrator binary */
    char *source_path; /* the file it was loaded from */
} topo;

/* Read and validate a topology file. 0, or -ENOENT/-EACCES/... (file unreadable) or -EINVAL
 * (bad content) with a one-line message in err ("<path>: <json path>: <what>"). On error t is
 * left zeroed. On success t owns its memory: release with topology_free. */
int topology_load(topo *t, const char *path, char *err, size_t errlen);
/* The same from text; source_name prefixes error messages (and becomes t->source_path). */
int topology_parse(topo *t, const char *json_text, const char *source_name, char *err, size_t errlen);
/* Free everything t owns and zero it. Safe on a zeroed or half-filled topo. */
void topology_free(topo *t);
int topology_find_worker(const topo *t, const char *name); /* index or -1 */
int topology_find_ring(const topo *t, const char *name);   /* index or -1 */
const char *topology_role_name(topology_role r);           /* "target", ... */
const char *topology_backend_name(topology_backend b);     /* "cpu" | "cuda" */
/* Index of the validator worker, or -1 (there is at most one). */
int topology_find_validator(const topo *t);
/* Number of drafter workers (= world size R of the drafter group). */
int topology_n_drafters(const topo *t);
/* The normalised topology (defaults filled) as a new JSON object (caller json_decref's);
 * NULL on allocation failure. topology_parse(json_dumps(topology_to_json(t))) gives back t. */
json_t *topology_to_json(const topo *t);

#endif
