/* metrics_keys.h: the training figures a worker writes and the orchestrator shows, one row
 * each, shared by the worker that writes them, the orchestrator's report and dfctl.
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

/* X(ID, KEY, FROM, PROM, LABEL, FMT, PRIO, NAME, DFCTL_FMT), in the order shown */
#define METRICS_KEYS(X)                                                                          \
    X(LOSS, "loss", STEP, "df_train_loss", "loss", "%.3f", 2, "loss", "%.4f")                    \
    X(LR, "lr", STEP, "df_train_lr", "lr", "%.1e", 6, "lr", "%.3g")                              \
    X(VAL_LOSS, "val_loss", VALIDATION, "df_validation_loss", "loss", "%.3f", 5, "loss", "%.4f") \
    X(VAL_EXP_TAU, "val_exp_tau", VALIDATION, "df_validation_expected_tau", "tau", "%.2f", 5, "expected tau", "%.3f")

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
