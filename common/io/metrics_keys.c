/* metrics_keys.c: the tables of metrics_keys.h, made from its METRICS_KEYS rows and its
 * VALIDATION_KEYS names. */
#include "io/metrics_keys.h"

const metrics_key metrics_keys[METRICS_N_KEYS] = {
#define METRICS_KEY_ROW(id, key_, from_, prom_, label_, fmt_, prio_, name_, dfctl_fmt_) \
    [METRICS_KEY_##id] = {.key = key_,                                                  \
                          .from = METRICS_FROM_##from_,                                 \
                          .prom = prom_,                                                \
                          .label = label_,                                              \
                          .fmt = fmt_,                                                  \
                          .prio = prio_,                                                \
                          .name = name_,                                                \
                          .dfctl_fmt = dfctl_fmt_},
    METRICS_KEYS(METRICS_KEY_ROW)
#undef METRICS_KEY_ROW
};

const char *const validation_keys[VALIDATION_N_KEYS] = {
#define VALIDATION_KEY_NAME(id) [VALIDATION_KEY_ID_##id] = VALIDATION_KEY_##id,
    VALIDATION_KEYS(VALIDATION_KEY_NAME)
#undef VALIDATION_KEY_NAME
};
