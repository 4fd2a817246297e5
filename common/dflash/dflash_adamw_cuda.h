/* dflash_adamw_cuda.h: the drafter's AdamW step on the GPU (adamw_*_cuda), the CUDA twin of
 * adamw_step in adamw.c over the same flat fp32 parameter array, for dflash_cuda.cu.
 *
 * One step is three launches on the caller's stream, no host synchronisation:
 *   1. the squared global norm of the gradients as ADAMW_NORM_PARTS_CUDA double partials:
 *      thread t of the grid (1024 blocks x 256 threads) sums g[t], g[t + 262144], ... in
 *      that order, each block sums its threads in a fixed tree; the order never depends on
 *      timing, so the norm is bit-identical run to run;
 *   2. one block: the partials in a fixed tree, the schedule's learning rate, the clip
 *      factor and the bias corrections into the device adamw_state_cuda (skip = 1 on a
 *      non-finite norm: the step changes nothing and is not counted);
 *   3. the update itself over the whole array: every thread takes 8 consecutive elements
 *      (two 16-byte loads of each of p, g, m, v, two 16-byte stores of each of p, m, v,
 *      one 16-byte store of the bf16 mirror), the same float operations per element as
 *      adamw.c in the same order, so the bits do not depend on how the array is split.
 * The bytes a step moves: 4 per parameter for the norm, 16 read + 14 written for the update
 * (ADAMW_BYTES_PER_PARAM_CUDA); the bench reports them against a device copy's bandwidth.
 *
 * Layout rules: the tensors cover [0, n) in order and each starts at a multiple of 8
 * elements, so 8 elements never straddle two tensors (dflash_init_cuda refuses any other
 * offset); every array is 16-byte aligned (adamw_step_cuda refuses it otherwise, -EINVAL).
 * Errors: 0 or -errno with one line in err (err may be NULL).
 */
#ifndef DF_DFLASH_ADAMW_CUDA_H
#define DF_DFLASH_ADAMW_CUDA_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "dflash/adamw.h"

#define ADAMW_NORM_PARTS_CUDA 1024    /* double partials of the squared global norm */
#define ADAMW_BYTES_PER_PARAM_CUDA 34 /* norm read 4 + read p, g, m, v 16 + write p, m, v 12, bf16 2 */

/* The optimizer's device state (one per context, in device memory; the host copies it in
 * and out for checkpoints and adamw_info). */
typedef struct adamw_state_cuda {
    double norm, lr, clip_scale;
    float gscale, wd_factor, step_size, inv_sqrt_bc2;
    int skip, do_clip;
    long long step; /* updates done */
} adamw_state_cuda;

/* One tensor of the flat array (device table); is_norm: never decayed. */
typedef struct adamw_tensor_cuda {
    long long off, len;
    int is_norm;
} adamw_tensor_cuda;

/* Device pointers of one step. */
typedef struct adamw_buffers_cuda {
    float *p, *m, *v;
    const float *g;
    uint16_t *mirror; /* bf16 copy of p, same offsets */
    size_t n;
    const adamw_tensor_cuda *tensors; /* [ntensor], device */
    int ntensor;
    double *norm_part;       /* [ADAMW_NORM_PARTS_CUDA], device scratch */
    adamw_state_cuda *state; /* device */
} adamw_buffers_cuda;

/* One AdamW step (clip by the global norm, schedule of adamw_lr with `warm` warmup steps,
 * decoupled decay on tensors with is_norm 0 when c->weight_decay > 0) enqueued on st. */
int adamw_step_cuda(const adamw_buffers_cuda *b, const adamw_config *c, long warm, cudaStream_t st, char *err,
                    size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
