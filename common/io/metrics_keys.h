/* metrics_keys.h: the training figures a worker writes and the orchestrator shows, one row
 * each, shared by the worker that writes them, the orchestrator's report and dfctl; and the
 * names of every field of the validator's "validation" line (VALIDATION_KEYS, below).
 *
 * A row's figure is the field KEY of the worker's metrics line (io/metrics.h): the "step"
 * line of drafter rank 0 (FROM STEP) or the "validation" line of the validator (FROM
 * VALIDATION). The orchestrator keeps each worker's last such line and copies the figure
 * into the status object's "train" under the same key (null until a line has it), and shows
 * it:
 *   the progress line     "<LABEL> <FMT>": the training figures after "step S/T", the
 *                         validation ones together after " | val" (the log file's line);
 *                         on a terminal each training figure is a field of priority PRIO
 *                         (report_fit_fields leaves the highest out first) and the
 *                         validation figures one field, of the first one's PRIO
 *   metrics/pipeline.prom a gauge named PROM
 *   dfctl status / top    "<NAME> <DFCTL_FMT>" on its "train:" or "validation:" line
 * A new figure is one X(...) row below (its enum name, then the fields above in order), and
 * the worker writing metrics_keys[METRICS_KEY_<ID>].key into its line.
 */
#ifndef DF_METRICS_KEYS_H
#define DF_METRICS_KEYS_H

/* The validator's "validation" line (eval/validator_main.c), its one writer: after the
 * fields every metrics line has ("t", "worker", "inc", "pid", "ev", "step") come these, in
 * this order. The validator's TensorBoard tags are the same names under "validation/" (the
 * array val_acc: "validation/val_acc_<k>", k = 1..B-1), the way io/metrics.h tags a line
 * it writes. Each name is a string literal, so that a METRICS_KEYS row below and a tag
 * (VALIDATION_EV "/" VALIDATION_KEY_LOSS) are made from it at compile time; the readers of
 * the line take the figures they show through those rows. A new field is a name here and
 * one X(...) in VALIDATION_KEYS, in its place. */
#define VALIDATION_EV "validation"           /* the line's "ev" */
#define VALIDATION_KEY_LOSS "val_loss"       /* sum(w * CE) / sum(w) over the held-out set */
#define VALIDATION_KEY_ACC "val_acc"         /* [B-1]: acc_k, k = 1..B-1 */
#define VALIDATION_KEY_EXP_TAU "val_exp_tau" /* 1 + sum_k prod_{j<=k} acc_j */
#define VALIDATION_KEY_SAMPLES "samples"     /* held-out samples scored */
#define VALIDATION_KEY_EVAL_S "eval_s"       /* the evaluation's wall time, seconds */
#define VALIDATION_KEY_LOAD_S "load_s"       /* of which loading the checkpoint */
#define VALIDATION_KEYS(X) X(LOSS) X(ACC) X(EXP_TAU) X(SAMPLES) X(EVAL_S) X(LOAD_S)

typedef enum validation_key_id {
#define VALIDATION_KEY_ENUM(id) VALIDATION_KEY_ID_##id,
    VALIDATION_KEYS(VALIDATION_KEY_ENUM)
#undef VALIDATION_KEY_ENUM
        VALIDATION_N_KEYS
} validation_key_id;

/* the names above in VALIDATION_KEYS order: validation_keys[VALIDATION_KEY_ID_LOSS] is
 * VALIDATION_KEY_LOSS */
extern const char *const validation_keys[VALIDATION_N_KEYS];

/* X(ID, KEY, FROM, PROM, LABEL, FMT, PRIO, NAME, DFCTL_FMT), in the order shown; a
 * VALIDATION row's KEY is one of the VALIDATION_KEY_* names above */
#define METRICS_KEYS(X)                                                                                                \
    X(LOSS, "loss", STEP, "df_train_loss", "loss", "%.3f", 2, "loss", "%.4f")                                          \
    X(LR, "lr", STEP, "df_train_lr", "lr", "%.1e", 6, "lr", "%.3g")                                                    \
    X(VAL_LOSS, VALIDATION_KEY_LOSS, VALIDATION, "df_validation_loss", "loss", "%.3f", 5, "loss", "%.4f")              \
    X(VAL_EXP_TAU, VALIDATION_KEY_EXP_TAU, VALIDATION, "df_validation_expected_tau", "tau", "%.2f", 5, "expected tau", \
      "%.3f")

typedef enum metrics_from {
    METRICS_FROM_STEP,       /* drafter rank 0's "step" line */
    METRICS_FROM_VALIDATION, /* the validator's "validation" line */
} metrics_from;

typedef enum metrics_key_id {
#define METRICS_KEY_ENUM(id, ...) METRICS_KEY_##id,
    METRICS_KEYS(METRICS_KEY_ENUM)
#undef METRICS_KEY_ENUM
        METRICS_N_KEYS
} metrics_key_id;

typedef struct metrics_key {
    const char *key;   /* the field in the worker's line and in the status object's "train" */
    metrics_from from; /* the line it comes from */
    const char *prom;  /* pipeline.prom gauge */
    const char *label; /* progress line: "<label> <fmt>" */
    const char *fmt;   /* printf format of the number (a double) on the progress line */
    int prio;          /* terminal progress line: left out before the lower ones */
    const char *name;  /* dfctl: "<name> <dfctl_fmt>" */
    const char *dfctl_fmt;
} metrics_key;

extern const metrics_key metrics_keys[METRICS_N_KEYS];

#endif
