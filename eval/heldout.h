/* heldout.h: teacher-forced scoring of a drafter on a fixed held-out set (prefix heldout_),
 * the figures of the validator worker (eval/validator_main.c, docs/operations.md
 * "Validation"): the training loss's definition, per-position accuracy and expected tau.
 *
 * The set: the first max_samples samples of the shards, each cut to max_seq_len tokens like
 * the training plan does; heldout_open runs the target over each once and keeps the captured
 * features (the target is frozen, so they never change). heldout_score then scores one
 * drafter: per sample a dflash_batch with num_anchors anchors drawn by the training's rule
 * (dflash_sample_anchors) from a FIXED seed (seed, stream HELDOUT_BATCH_BASE + the sample's
 * index), so every checkpoint is scored on the same anchors; the forward and chunked loss
 * without a backward; the statistics of all samples merged (dflash_stats_merge: loss =
 * sum(w CE) / sum(w), acc_k, dflash_stats_tau). Samples without a weighted position (or
 * without tokens) contribute nothing.
 *
 * Backend seam (docs/backends.md): the set holds an ops table chosen at heldout_open from
 * opts.device: "cpu" (-1: target_forward_cpu, fp32 features in host memory,
 * dflash_loss_and_grad without a gradient; heldout.c) or "cuda" (a device: the CUDA target
 * forward, bf16 features in pinned host memory, the CUDA drafter's forward-only step
 * dflash_forward_loss_cuda; heldout_cuda.c, whose table heldout_nocuda.c replaces in a build
 * without CUDA=1 by stubs answering -ENOTSUP). The two compute the same figures up to bf16
 * rounding (tests/gpu_test_validator.sh states the tolerance); each is deterministic.
 *
 * Errors: 0 or -errno with one line in err naming the shard, sample, model file or device.
 * heldout_exit_code maps a code to the worker's exit: a bad shard, target, checkpoint or
 * device setting is permanent (100), out of memory and I/O or CUDA failures temporary (1). */
#ifndef DF_EVAL_HELDOUT_H
#define DF_EVAL_HELDOUT_H

#include <stddef.h>
#include <stdint.h>

#include "dflash/dflash_batch.h"
#include "dflash/dflash_config.h"
#include "dflash/dflash_loss.h"
#include "dflash/dflash_model.h"
#include "io/hfconfig.h"

#define HELDOUT_BATCH_BASE (1ull << 48) /* anchor stream ids far from any training batch id */

typedef struct heldout_opts {
    const char *target_dir; /* the target model (HF directory) */
    const int *capture;     /* [n_capture] captured layers, the topology's order */
    int n_capture;
    char *const *shards; /* [n_shards] held-out .dfs shards */
    int n_shards;
    uint32_t max_samples; /* the first N samples over the shards */
    uint32_t max_seq_len; /* samples cut to this many tokens */
    int num_anchors;      /* anchors per sample (drafter.num_anchors) */
    uint64_t seed;        /* the run seed */
    int device;           /* -1: the CPU; 0..: this CUDA device */
    /* called after every sample (features at open, scoring per checkpoint) with the phase
     * (0 open, 1 score); non-zero stops the call with -EINTR. NULL: never stops. */
    int (*tick)(void *arg, int phase);
    void *tick_arg;
} heldout_opts;

typedef struct heldout_sample {
    int S;           /* tokens (0..max_seq_len) */
    int32_t *x;      /* [S] */
    uint8_t *mask;   /* [S] loss mask */
    size_t feat_off; /* the sample's features: element offset in the backend's feature store */
    int shard;       /* where it was read, for messages: o.shards[shard], its sample `local` */
    uint64_t local;
} heldout_sample;

typedef struct heldout_set heldout_set;
typedef struct heldout_ops {
    const char *name; /* "cpu" or "cuda" */
    /* The target over every sample (the captured features kept) and the frozen embeddings;
     * fills h->impl, feature_bytes, feature_where. 0 or -errno with err set. */
    int (*open)(heldout_set *h, char *err, size_t errlen);
    /* One drafter (c must fit the target: pair_check) over every sample: *all filled. */
    int (*score)(heldout_set *h, const dflash_config *c, const dflash_params *p, dflash_stats *all, char *err,
                 size_t errlen);
    void (*close)(heldout_set *h);
} heldout_ops;

struct heldout_set {
    const heldout_ops *ops;
    heldout_opts o;            /* a copy; the pointers in it are borrowed */
    hfconfig hc;               /* the target's config.json */
    heldout_sample *s;         /* [n] */
    int n;                     /* samples in the set */
    long tokens;               /* their tokens */
    int max_S;                 /* the longest one */
    double features_s;         /* seconds the target took over them (open) */
    size_t feature_bytes;      /* the features kept */
    const char *feature_where; /* where: "host memory", "pinned host memory", ... */
    size_t device_bytes;       /* the device memory a score holds (cuda; 0 before the first score) */
    void *impl;                /* the backend's state */
};

/* The CUDA table (heldout_cuda.c; in a build without CUDA=1, heldout_nocuda.c's stubs). */
extern const heldout_ops heldout_ops_cuda;

/* Read the samples, check them against the target's config and run the backend's open.
 * On failure h is closed (heldout_close is still safe). */
int heldout_open(heldout_set *h, const heldout_opts *o, char *err, size_t errlen);
/* Score one drafter: 0, -EINTR (tick asked to stop), other -errno with err set. */
int heldout_score(heldout_set *h, const dflash_config *c, const dflash_params *p, dflash_stats *all, char *err,
                  size_t errlen);
void heldout_close(heldout_set *h); /* safe on a zeroed or failed set */
/* DF_EXIT_PERM for a code that a restart would meet again (-EINVAL, -ENOENT, -ENOTDIR,
 * -EACCES, -ERANGE, -ENOTSUP, -ENODEV), else DF_EXIT_TEMP. */
int heldout_exit_code(int rc);

/* "validation sample 3 (validation.shards[0] /d/h.dfs: sample 3)": held-out sample i and
 * the shard and sample it was read from, for the messages of both backends; returns out. */
const char *heldout_where(const heldout_set *h, int i, char *out, size_t cap);

/* Sample i's batch (anchors, labels, weights from the fixed seed): the one rule both
 * backends use. H: the sample's fp32 features or NULL (the CUDA backend reads its own).
 * 0 or -errno; samples without tokens are not batched (the caller skips them). */
int heldout_batch(const heldout_set *h, int i, const dflash_config *c, const float *H, dflash_batch *b);

#endif
