/* dflash_ckpt.h: drafter checkpoints (to continue training) and the public release
 * export (to use the drafter), docs/drafter.md "Checkpoints".
 *
 * Our checkpoint: <root>/step-<8 digits>/ holding model.safetensors (fp32 master weights,
 * release tensor names), optimizer.safetensors (m.<name>, v.<name>, fp32) and
 * trainer_state.json (step, epoch, ledger committed step, seed and rng state, optimizer
 * settings, drafter config), and manifest.json, written last: the step and each file's
 * size and SHA-256. Loading verifies the manifest first (every byte, the step against
 * trainer_state.json and the directory name) and refuses a checkpoint without one. Files
 * are created 0600, directories 0700 (whatever the umask). The step directory is built as <root>/.tmp-step-N.<pid>,
 * every file written tmp + fsync + rename, the directory fsynced and renamed into place,
 * and only then <root>/latest (one line "step-N") is replaced atomically: a crash or a
 * full disk at any point leaves the previous checkpoint as the latest, intact.
 *
 * Release: <dir>/config.json (dflash_config_write_release) + model.safetensors in bf16
 * with exactly the tensor names of dflash_tensor_info (no "model." prefix) + dflash.py. */
#ifndef DF_DFLASH_CKPT_H
#define DF_DFLASH_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "dflash/adamw.h"
#include "dflash/dflash_config.h"
#include "dflash/dflash_model.h"
#include "util.h"

typedef struct dflash_train_state {
    long step; /* optimizer steps done */
    long epoch;
    long ledger_committed_step; /* the ledger position this checkpoint commits */
    uint64_t seed;              /* run seed (anchors, noise) */
    df_rng rng;                 /* any trainer-side stream, saved exactly */
} dflash_train_state;

/* Save a checkpoint for ts->step under root (created if missing). opt may be NULL (no
 * optimizer.safetensors). 0 or -errno, err names the file that failed; on failure the
 * previous latest checkpoint is untouched and the temp directory removed. */
int dflash_ckpt_save(const char *root, const dflash_config *c, const dflash_params *p, const adamw *opt,
                     const dflash_train_state *ts, char *err, size_t errlen);

/* Delete old step dirs under root: every step-N beyond the `keep` newest whose N < below
 * (the caller passes the step the orchestrator acknowledged as committed and persisted, so
 * the checkpoint a --resume would load is never touched, nor anything newer). keep 0 = keep
 * everything. Returns how many were deleted, or -errno with err set (a directory that would
 * not go is reported and left for the next call). */
int dflash_ckpt_prune(const char *root, unsigned keep, long below, char *err, size_t errlen);

/* Tidy what an interrupted save left under root (call it before the next save, when no
 * other process writes there): every .tmp-step-N.<pid> directory is deleted (nothing ever
 * names one: latest and the ledger only name finished step dirs); a .old-step-N.<pid>
 * (the previous step-N, moved aside by a re-save of step N that died before its rename)
 * is deleted when step-N exists and renamed back to step-N when it does not. Returns how
 * many entries it handled (0 when root does not exist), or -errno with err set. */
int dflash_ckpt_remove_partial(const char *root, char *err, size_t errlen);

/* Resolve what to load: root/latest's directory, or dir itself when it holds a
 * trainer_state.json. Writes the path into out. 0 or -errno (-ENOENT: no checkpoint). */
int dflash_ckpt_resolve(const char *root_or_dir, char *out, size_t outlen);

/* Load a checkpoint (root or step dir), verified first (dflash_manifest_verify,
 * dflash_manifest.h; trainer_state's
 * step must equal the manifest's): fills c, allocates p (dflash_params_alloc), and
 * if opt != NULL initialises it from the saved settings with m, v, step restored (opt
 * stays zeroed when the checkpoint has no optimizer file: -ENOENT). ts may be NULL.
 * 0 or -errno with err naming the file and tensor/field. */
int dflash_ckpt_load(const char *root_or_dir, dflash_config *c, dflash_params *p, adamw *opt, dflash_train_state *ts,
                     char *err, size_t errlen);

/* The release's modeling file: common/dflash/dflash.py's bytes, compiled in by the build
 * (scripts/embed_file.sh), NUL-terminated; dflash_modeling_py_len excludes the NUL. */
extern const unsigned char dflash_modeling_py[];
extern const size_t dflash_modeling_py_len;

/* Export the public release format into dir (created if missing): config.json, a bf16
 * model.safetensors and dflash.py (dflash_modeling_py), the class config.json's auto_map
 * names, so transformers' AutoModel.from_pretrained(dir, trust_remote_code=True) loads it
 * (docs/export.md). 0 or -errno. */
int dflash_export_release(const char *dir, const dflash_config *c, const dflash_params *p, char *err, size_t errlen);

/* Load a release dir (config.json + model.safetensors, any float dtype): fills c and
 * allocates p. To continue training from it start a fresh optimizer. 0 or -errno. */
int dflash_load_release(const char *dir, dflash_config *c, dflash_params *p, char *err, size_t errlen);

#endif
