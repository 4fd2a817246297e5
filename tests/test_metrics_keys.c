/* test_metrics_keys: the table of the training figures the workers write and the orchestrator
 * shows (common/io/metrics_keys.h) is well formed, and the orchestrator's log-file progress
 * line (report_train_line) shows every row of it.
 *   1. every row: a key, a Prometheus name "df_..." and a dfctl name of its own (no two rows
 *      share one), a label, both formats one conversion of a double, a priority >= 0;
 *   2. the line of a "train" object holding every row's figure shows each training figure as
 *      " <label> <value>" before the tokens/s and each validation figure after " | val", in
 *      the table's order; an object without the figures leaves the training ones out and
 *      the validation part away;
 *   3. the line of today's four rows is the text it was before the table (pinned);
 *   4. the names of the validator's "validation" line (VALIDATION_KEYS): the ones the
 *      scripts and tests read, in the line's order (pinned), none empty, none twice, none a
 *      field every metrics line has; every VALIDATION row's key is one of them (the field
 *      the validator writes is the one the report reads).
 */
#include <stdio.h>
#include <string.h>

#include "io/metrics_keys.h"
#include "orchestrator/orch.h"
#include "test_helpers.h"

/* one printf conversion, of a double (%f %e %g, with flags / width / precision) */
static int one_double_conversion(const char *fmt)
{
    int n = 0;
    for (const char *p = fmt; (p = strchr(p, '%')) != NULL; p++) {
        if (p[1] == '%') {
            p++;
            continue;
        }
        size_t k = 1 + strspn(p + 1, "-+ #0123456789.");
        if (!strchr("eEfFgG", p[k]))
            return 0;
        n++;
    }
    return n == 1;
}

int main(void)
{
    T_ASSERT(METRICS_N_KEYS > 0);
    for (int i = 0; i < METRICS_N_KEYS; i++) {
        const metrics_key *m = &metrics_keys[i];
        T_ASSERT(m->key && m->key[0] && m->label && m->label[0] && m->name && m->name[0]);
        T_ASSERT(m->prom && !strncmp(m->prom, "df_", 3));
        T_ASSERT(m->from == METRICS_FROM_STEP || m->from == METRICS_FROM_VALIDATION);
        T_ASSERT(m->prio >= 0);
        if (!one_double_conversion(m->fmt) || !one_double_conversion(m->dfctl_fmt)) {
            fprintf(stderr, "row %s: formats \"%s\" / \"%s\" are not one conversion of a double\n", m->key, m->fmt,
                    m->dfctl_fmt);
            return 1;
        }
        for (int j = 0; j < i; j++) {
            T_ASSERT(strcmp(m->key, metrics_keys[j].key) != 0);
            T_ASSERT(strcmp(m->prom, metrics_keys[j].prom) != 0);
        }
    }

    /* 2. every figure known: each one on the line, training ones before tok/s, in table order */
    json_t *tr = json_pack("{s:i, s:i, s:f, s:f, s:i}", "step", 12, "total_steps", 100, "tokens_per_s", 4321.0, "eta_s",
                           83.0, "val_step", 10);
    T_ASSERT(tr);
    for (int i = 0; i < METRICS_N_KEYS; i++)
        json_object_set_new(tr, metrics_keys[i].key, json_real(1.25 + i));
    char line[1024], want[64], v[32];
    report_train_line(tr, line, sizeof line);
    const char *tok = strstr(line, " tok/s"), *val = strstr(line, " | val"), *at = line;
    T_ASSERT(tok && val && tok < val);
    for (int i = 0; i < METRICS_N_KEYS; i++) {
        const metrics_key *m = &metrics_keys[i];
        snprintf(v, sizeof v, m->fmt, 1.25 + i);
        snprintf(want, sizeof want, " %s %s", m->label, v);
        const char *hit = strstr(m->from == METRICS_FROM_STEP ? at : (at > val ? at : val), want);
        if (!hit || (m->from == METRICS_FROM_STEP ? hit > tok : hit < val)) {
            fprintf(stderr, "row %s: \"%s\" not where it belongs in \"%s\"\n", m->key, want, line);
            return 1;
        }
        at = hit + strlen(want); /* the next row comes later */
    }
    /* nothing known yet: no figure, no validation part */
    json_t *empty = json_pack("{s:n, s:i, s:f}", "step", "total_steps", 100, "tokens_per_s", 0.0);
    report_train_line(empty, line, sizeof line);
    T_ASSERT_STREQ(line, "step -/100 0 tok/s ETA -");

    /* 3. today's rows: the line as it was written before the table */
    json_t *today = json_pack("{s:i, s:i, s:f, s:f, s:f, s:f, s:i, s:f, s:f}", "step", 120, "total_steps", 534, "loss",
                              2.3456, "lr", 3e-3, "tokens_per_s", 4321.2, "eta_s", 83.0, "val_step", 100, "val_loss",
                              2.5101, "val_exp_tau", 1.6234);
    report_train_line(today, line, sizeof line);
    T_ASSERT_STREQ(line, "step 120/534 loss 2.346 lr 3.0e-03 4321 tok/s ETA 1m23s | val loss 2.510 tau 1.62 @100");
    json_decref(tr);
    json_decref(empty);
    json_decref(today);

    /* 4. the validation line's names */
    static const char *const pinned[] = {"val_loss", "val_acc", "val_exp_tau", "samples", "eval_s", "load_s"};
    static const char *const common_fields[] = {"t", "worker", "inc", "pid", "ev", "step"};
    T_ASSERT(VALIDATION_N_KEYS == (int)(sizeof pinned / sizeof pinned[0]));
    T_ASSERT_STREQ(VALIDATION_EV, "validation");
    for (int i = 0; i < VALIDATION_N_KEYS; i++) {
        const char *k = validation_keys[i];
        T_ASSERT(k && k[0]);
        T_ASSERT_STREQ(k, pinned[i]);
        for (int j = 0; j < i; j++)
            T_ASSERT(strcmp(k, validation_keys[j]) != 0);
        for (size_t j = 0; j < sizeof common_fields / sizeof common_fields[0]; j++)
            T_ASSERT(strcmp(k, common_fields[j]) != 0);
    }
    for (int i = 0; i < METRICS_N_KEYS; i++) {
        if (metrics_keys[i].from != METRICS_FROM_VALIDATION)
            continue;
        int found = 0;
        for (int j = 0; j < VALIDATION_N_KEYS; j++)
            found |= !strcmp(metrics_keys[i].key, validation_keys[j]);
        if (!found) {
            fprintf(stderr, "row %s: a VALIDATION row whose key is not a field of the validation line\n",
                    metrics_keys[i].key);
            return 1;
        }
    }
    printf("test_metrics_keys: ok (%d rows, %d validation fields)\n", METRICS_N_KEYS, VALIDATION_N_KEYS);
    return 0;
}
