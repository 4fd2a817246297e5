/* json_num.h: a number into a JSON object that may be NaN or infinite. jansson's json_real
 * refuses NaN/Inf (it returns NULL, which json_pack then reports as a failure and
 * json_object_set_new as a missing key), and JSON has no such numbers: the value becomes
 * null and "<key>_nonfinite": true is added beside it, so a reader can tell "not finite"
 * from "not known". Used by train_summary.json and dflash_eval's JSON. */
#ifndef DF_JSON_NUM_H
#define DF_JSON_NUM_H

#include <jansson.h>

/* obj[key] = v, or null plus obj[key + "_nonfinite"] = true. 0 or -ENOMEM. */
int df_json_set_num(json_t *obj, const char *key, double v);
/* A finite v as a real, anything else as null (array elements: no room for a flag). */
json_t *df_json_num_or_null(double v);

#endif
