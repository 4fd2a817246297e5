/* trainer.h: the drafter's training state and one optimizer step over a PD batch, on the
 * CPU reference or on one GPU (prefix trainer_). drafter_worker_main.c owns the loop (which
 * batch, when to checkpoint, the ledger); this file owns the model.
 *
 * One step: every document of the batch is one training sequence (its context features,
 * tokens and anchors); gradients are summed over the documents with the loss normalised
 * over the batch (decay: its total weight; dpace: its blocks with a loss position,
 * dflash_loss.h); with several drafter ranks the gradients are then summed over
 * the ranks (cpu: in buckets handed over during the last document's backward,
 * grad_buckets.h; cuda: one allreduce_sum) and divided by the world size; then AdamW with clipping and
 * the warmup + cosine schedule.
 *
 * Backends (topology "backend"):
 *   cpu   master weights, gradients and AdamW on the host (dflash_model.c, adamw.c); the
 *         PD batch is read in place in its (host) ring slot.
 *   cuda  dflash_*_cuda (dflash_cuda.h) on the worker's GPU; the batch's tokens, mask, anchors and
 *         features are read in place in the (device) ring slot. trainer_cuda.c; a CPU-only
 *         build has trainer_nocuda.c, which refuses with a message. The host copies of the
 *         weights and of AdamW's moments are refreshed only for checkpoints and the export.
 * The backend is a trainer_ops table chosen by trainer_open (docs/backends.md): trainer.c's
 * own for cpu, trainer_ops_cuda for cuda.
 *
 * Checkpoints and the release export go through dflash_ckpt.c in both cases, so a CPU run
 * can resume a GPU checkpoint and the other way round.
 *
 * Errors: 0 or -errno with a message in err; the worker maps -EINVAL on setup (bad model,
 * bad shape) to DF_EXIT_PERM and everything else to DF_EXIT_TEMP. */
#ifndef DF_TRAINER_H
#define DF_TRAINER_H

#include "dflash/adamw.h"
#include "dflash/dflash_batch.h"
#include "dflash/dflash_ckpt.h"
#include "dflash/dflash_config.h"
#include "dflash/dflash_loss.h"
#include "dflash/dflash_model.h"
#include "dflash/grad_buckets.h"
#include "drafter_worker/ckpt_writer.h"
#include "io/batch.h"
#include "io/topology.h"
#include "ipc/allreduce.h"
#include "target/target_model.h"

#define TRAINER_START_STEPS 5 /* "loss at start" = mean of the first steps */
#define TRAINER_END_STEPS 20  /* "loss at end" and the accuracies = the last steps */

typedef struct trainer_cuda trainer_cuda; /* trainer_cuda.c */
typedef struct trainer trainer;

/* The backend seam (docs/backends.md): every backend-specific step of a trainer. step and
 * step_empty do not advance tr->ts.step (trainer_step does on success); to_host refreshes
 * tr->p (and with with_opt tr->opt) from the backend's copy (cpu: nothing to do). */
typedef struct trainer_ops {
    const char *name; /* "cpu" / "cuda": the summary's "backend" */
    int bucketed;     /* gradients reduced in buckets during the backward (allreduce_* metrics) */
    int (*open)(trainer *tr, const topo *t, long total_steps, int resumed, char *err, size_t errlen);
    int (*step)(trainer *tr, const batch_header *h, const void *slot, allreduce_comm *ar, void (*hb)(void *),
                void *hb_arg, dflash_stats *st, adamw_info *info, char *err, size_t errlen);
    int (*step_empty)(trainer *tr, allreduce_comm *ar, adamw_info *info, char *err, size_t errlen);
    int (*to_host)(trainer *tr, int with_opt, char *err, size_t errlen);
    void (*close)(trainer *tr);
    int host_live; /* tr->p / tr->opt are the weights training updates (cpu): a checkpoint copies them */
} trainer_ops;

/* trainer_cuda.c in CUDA=1 builds; trainer_nocuda.c (every entry -ENOTSUP) otherwise */
extern const trainer_ops trainer_ops_cuda;

struct trainer {
    dflash_config cfg;
    const trainer_ops *ops; /* the backend, chosen by trainer_open */
    int device;             /* CUDA device (cuda only) */
    dflash_params p;        /* master weights (cpu: live; cuda: host copy for checkpoints) */
    adamw opt;              /* AdamW (cpu: live; cuda: host copy of m, v, step) */
    dflash_train_state ts;
    /* cpu backend */
    dflash_params g;
    dflash_frozen fz;
    target_embeddings emb;
    adamw_segment decay[4 * DFLASH_MAX_LAYERS + 8];
    int n_decay;
    dflash_acts acts;
    buckets_plan buckets;      /* the gradient all-reduce's buckets (drafter.allreduce_bucket_kb) */
    int64_t allreduce_wait_ns; /* last step: time spent waiting for the reduction after the backward */
    int allreduce_early;       /* last step: buckets handed over while the backward still ran */
    /* cuda backend */
    trainer_cuda *gpu;
    /* data parallel: how many ranks contribute a batch to this step (set by the caller each
     * step; 0 = all of them). The loss normaliser is scaled by it, so the all-reduced sum is
     * the mean over the batches actually trained, also in a short last step. */
    int ranks_with_batch;
    /* the summary's statistics */
    dflash_stats end_win[TRAINER_END_STEPS];
    double start_loss_sum;
    int start_n;
    long nonfinite_steps; /* steps of this incarnation with a NaN/Inf loss or gradient norm */
    /* fault injection (tests): DF_FAULT_NONFINITE="S[:N]" makes steps S..S+N-1 (N omitted:
     * every step from S on) non-finite, cpu backend: the gradient gets a NaN before the
     * backward (so it also travels through the all-reduce) and the loss is NaN */
    long fault_nf_from, fault_nf_count;
};

/* Build the drafter from the topology and the target's config.json; then either resume the
 * checkpoint ckpt_dir (non-NULL), or start from drafter.init_dir (release format), or from
 * a random init seeded by the topology's seed. total_steps sizes the LR schedule; device is
 * the worker's GPU (cuda backend). 0 or -errno with err set. */
int trainer_open(trainer *tr, const topo *t, int device, long total_steps, const char *ckpt_dir, char *err,
                 size_t errlen);
void trainer_close(trainer *tr); /* safe on a zeroed trainer */

/* One optimizer step. A step whose gradient norm (after the all-reduce: the same on every
 * rank) or, with one rank, whose loss is NaN/Inf does not update anything: weights, AdamW
 * moments and the optimizer's step stay as they were (info->skipped = 1); the batch still
 * counts as consumed (tr->ts.step advances). The caller counts such steps and gives up
 * after drafter.max_nonfinite_steps in a row. h: the batch's header and metadata readable on the host (for the cpu
 * backend the slot itself; for cuda a host copy of the slot's first h->off_feat bytes).
 * slot: the slot as mapped in this process (host memory for cpu, device memory for cuda),
 * holding tokens, mask, anchors, keep and features at h's offsets. ar: the drafter group
 * (NULL or world 1: no reduction). hb: called between documents (long CPU steps keep the
 * heartbeat alive), may be NULL. Fills st (merged over documents, this rank) and info. */
int trainer_step(trainer *tr, const batch_header *h, const void *slot, allreduce_comm *ar, void (*hb)(void *),
                 void *hb_arg, dflash_stats *st, adamw_info *info, char *err, size_t errlen);

/* The same optimizer step for a rank of a group (ar world > 1) that has no batch this step
 * (the end of an epoch with fewer batches left than ranks): it contributes zero gradients
 * to the all-reduce and applies the group's update like every rank, so the weights stay
 * identical everywhere. cpu backend only for now (cuda: -ENOTSUP). */
int trainer_step_empty(trainer *tr, allreduce_comm *ar, adamw_info *info, char *err, size_t errlen);

/* Start a checkpoint under root on w's thread (ckpt_writer.h) with ts.ledger_committed_step
 * = ts.step: the host copies are refreshed (trainer_to_host) and handed over, copied when
 * training updates them in place (cpu) and borrowed otherwise (cuda: they change only in
 * trainer_to_host, which must therefore not be called before w's result was collected).
 * The caller collects the result (ckpt_writer_collect) before anything else touches them. */
int trainer_save_start(trainer *tr, ckpt_writer *w, const char *root, char *err, size_t errlen);
/* Release-format export into dir: the weights come to the host in this thread, the files
 * are written on another while this one calls hb(hb_arg) every 100 ms (hb_wait.h; hb may
 * be NULL). */
int trainer_export(trainer *tr, const char *dir, void (*hb)(void *), void *hb_arg, char *err, size_t errlen);
/* Refresh tr->p (and with with_opt tr->opt) from the backend (cuda: the device copies). */
int trainer_to_host(trainer *tr, int with_opt, char *err, size_t errlen);
/* Record a step's statistics for the summary; write <run_dir>/train_summary.json (loss at
 * start and end, per-position accuracy, expected acceptance length) and log it. */
void trainer_record(trainer *tr, const dflash_stats *st);
int trainer_write_summary(trainer *tr, const char *run_dir, double seconds, char *err, size_t errlen);

/* ---- shared by the backends (trainer.c, trainer_cuda.c) ---- */
/* Both backends: the batch's documents as training sequences from the host view h (anchors,
 * keep, labels and weights; feat: the fp32 features in host memory, or NULL when they stay on
 * the device), and the loss normaliser (dflash_loss_norm summed over the documents: decay
 * the batch's total weight, dpace its blocks with a loss position; times the world size so an
 * all-reduced sum of gradients is the mean). The caller frees seq[0..h->n_docs). */
int trainer_docs(const trainer *tr, const batch_header *h, const float *feat, const allreduce_comm *ar,
                 dflash_batch *seq, double *norm, char *err, size_t errlen);

#endif
