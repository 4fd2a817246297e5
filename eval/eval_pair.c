/* eval_pair.c: loading a drafter and checking it against its target (see eval_pair.h). */
#include "eval/eval_pair.h"

#include <errno.h>
#include <stdio.h>

#include "dflash/dflash_ckpt.h"
#include "util.h"

int pair_load_drafter(const char *dir, dflash_config *c, dflash_params *p, char *cfg_file, size_t cfg_len, char *err,
                      size_t errlen)
{
    char step[4096];
    if (dflash_ckpt_resolve(dir, step, sizeof step) == 0) {
        snprintf(cfg_file, cfg_len, "%s/trainer_state.json", step);
        return dflash_ckpt_load(dir, c, p, NULL, NULL, err, errlen);
    }
    snprintf(cfg_file, cfg_len, "%s/config.json", dir);
    return dflash_load_release(dir, c, p, err, errlen);
}

int pair_check(const dflash_config *c, const hfconfig *t, const char *dcfg, const char *tdir, char *err, size_t errlen)
{
    const char *what = NULL;
    long dv = 0, tv = 0;
    if (c->hidden != t->hidden_size)
        what = "hidden_size", dv = c->hidden, tv = t->hidden_size;
    else if (c->vocab != t->vocab_size)
        what = "vocab_size", dv = c->vocab, tv = t->vocab_size;
    else if (c->num_target_layers != t->num_hidden_layers)
        what = "num_target_layers", dv = c->num_target_layers, tv = t->num_hidden_layers;
    if (what)
        return df_err(err, errlen, -EINVAL, "%.400s: %s = %ld does not match the target %.400s/config.json (%ld)", dcfg,
                      what, dv, tdir, tv);
    for (int i = 0; i < c->n_capture; i++)
        if (c->target_layer_ids[i] < 0 || c->target_layer_ids[i] >= t->num_hidden_layers)
            return df_err(err, errlen, -EINVAL,
                          "%.900s: dflash_config.target_layer_ids[%d] = %d, the target has %d layers", dcfg, i,
                          c->target_layer_ids[i], t->num_hidden_layers);
    return 0;
}
