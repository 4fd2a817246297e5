/* spec_decode_backend.h: one place that builds the target + drafter pair a speculative
 * evaluation runs on, CPU or CUDA (prefix spec_backend_). dflash_eval and the tests call
 * this and then only see the spec_target / spec_drafter interfaces of spec_decode.h.
 *
 * "cpu": target_decode (decode_) + dflash_infer (infer_). "cuda" or "cuda:N" (device N, default
 * 0): spec_decode_cuda.c, built only with CUDA=1; without it spec_backend_open("cuda") is
 * -ENOTSUP with a message saying so (spec_decode_nocuda.c).
 *
 * Ownership: the backend owns its models and caches; it borrows the drafter config and
 * parameters (they must outlive it). spec_backend_close frees everything it owns. */
#ifndef DF_SPEC_DECODE_BACKEND_H
#define DF_SPEC_DECODE_BACKEND_H

#include <stddef.h>

#include "dflash/dflash_config.h"
#include "dflash/dflash_model.h"
#include "eval/spec_decode.h"

typedef struct spec_backend spec_backend;

/* The backend seam (docs/backends.md): the CPU table is spec_decode_backend.c's, the CUDA
 * one spec_backend_ops_cuda (spec_decode_cuda.c, or spec_decode_nocuda.c's stub). */
typedef struct spec_backend_ops {
    const char *name;
    /* Load the target and set up the drafter (device: the CUDA device; the CPU ignores it);
     * fills b->target, b->drafter, b->impl. 0 or -errno with err set. */
    int (*open)(spec_backend *b, const char *target_dir, const dflash_config *c, const dflash_params *p, int max_ctx,
                int n_seq, int device, char *err, size_t errlen);
    void (*close)(void *impl);
} spec_backend_ops;
extern const spec_backend_ops spec_backend_ops_cuda;

struct spec_backend {
    spec_target target;
    spec_drafter drafter;        /* == drafters[0] */
    int n_seq;                   /* sequences target decodes together (spec_generate_batch) */
    spec_drafter *drafters;      /* [n_seq]: one drafter context per sequence (shared weights) */
    const spec_backend_ops *ops; /* chosen at spec_backend_open */
    void *impl;                  /* backend state */
};

/* Load the target from target_dir (capturing the drafter's target_layer_ids) with room
 * for max_ctx tokens, and set up the drafter. 0 or -errno, err names the file/field. */
int spec_backend_open(spec_backend *b, const char *kind, const char *target_dir, const dflash_config *c,
                      const dflash_params *p, int max_ctx, char *err, size_t errlen);
/* The same for n_seq (1..SPEC_MAX_BATCH) sequences decoded together: a target cache of
 * n_seq * max_ctx rows and n_seq drafter contexts. */
#define SPEC_MAX_BATCH 64
int spec_backend_open_batch(spec_backend *b, const char *kind, const char *target_dir, const dflash_config *c,
                            const dflash_params *p, int max_ctx, int n_seq, char *err, size_t errlen);
void spec_backend_close(spec_backend *b);

#endif
