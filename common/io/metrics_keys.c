/* metrics_keys.c: the table of metrics_keys.h, made from its METRICS_KEYS rows. */
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
