/* eval_pair.h: a drafter and the target it is scored against (prefix pair_), shared by
 * dflash_eval (speculative decoding) and the validator (teacher-forced scoring of
 * checkpoints): load a drafter from any of its on-disk forms, and refuse a drafter whose
 * shape does not fit the target, naming both config files. 0 or -errno with err set. */
#ifndef DF_EVAL_PAIR_H
#define DF_EVAL_PAIR_H

#include <stddef.h>

#include "dflash/dflash_config.h"
#include "dflash/dflash_model.h"
#include "io/hfconfig.h"

/* Our checkpoint (a root with 'latest' or a step dir; verified against its manifest by
 * dflash_ckpt_load) or a release dir (config.json + model.safetensors). Fills c, allocates
 * p. cfg_file gets the file its config came from (for messages). */
int pair_load_drafter(const char *dir, dflash_config *c, dflash_params *p, char *cfg_file, size_t cfg_len, char *err,
                      size_t errlen);
/* The drafter (config from dcfg) must fit the target tdir (config t): hidden size, vocab,
 * layer count, capture layers in range. -EINVAL with both files named. */
int pair_check(const dflash_config *c, const hfconfig *t, const char *dcfg, const char *tdir, char *err, size_t errlen);

#endif
