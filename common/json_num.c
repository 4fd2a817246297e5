/* json_num.c: NaN/Inf-safe numbers in JSON objects (json_num.h). */
#include "json_num.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>

json_t *df_json_num_or_null(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

int df_json_set_num(json_t *obj, const char *key, double v)
{
    if (isfinite(v))
        return json_object_set_new(obj, key, json_real(v)) < 0 ? -ENOMEM : 0;
    char flag[256];
    snprintf(flag, sizeof flag, "%s_nonfinite", key);
    if (json_object_set_new(obj, key, json_null()) < 0 || json_object_set_new(obj, flag, json_true()) < 0)
        return -ENOMEM;
    return 0;
}
