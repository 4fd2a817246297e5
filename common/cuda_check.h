/* cuda_check.h: the one way CUDA code in this tree checks a CUDA runtime call or a kernel
 * launch. Every library function that talks to CUDA follows the tree's error convention:
 * it returns 0 or a negative errno and, on failure, writes one line into the caller's
 * `char *err, size_t errlen` ("file:line: what: CUDA's text"). A failed CUDA call is -EIO.
 *
 *   CUDA_TRY(call, err, errlen)             return -EIO from the enclosing function
 *   CUDA_TRY_GOTO(call, err, errlen, rc, l) set rc = -EIO and goto l (for cleanup paths)
 *   CUDA_LAUNCHED(what, err, errlen)        after a <<<...>>> launch: its launch error
 *
 * Header-only and at the base layer so that every room with CUDA code (ipc's GPU arenas,
 * nn's kernels, the models) shares it. Include after cuda_runtime.h. */
#ifndef DF_CUDA_CHECK_H
#define DF_CUDA_CHECK_H

#include <errno.h>
#include <stdio.h>

#define CUDA_TRY(call, err, errlen)                                                                     \
    do {                                                                                                \
        cudaError_t cuda_e_ = (call);                                                                   \
        if (cuda_e_ != cudaSuccess) {                                                                   \
            if ((err) && (errlen))                                                                      \
                snprintf((err), (errlen), "%s:%d: %s: %s", __FILE__, __LINE__, #call,                   \
                         cudaGetErrorString(cuda_e_));                                                  \
            return -EIO;                                                                                \
        }                                                                                               \
    } while (0)

#define CUDA_TRY_GOTO(call, err, errlen, rc, label)                                                     \
    do {                                                                                                \
        cudaError_t cuda_e_ = (call);                                                                   \
        if (cuda_e_ != cudaSuccess) {                                                                   \
            if ((err) && (errlen))                                                                      \
                snprintf((err), (errlen), "%s:%d: %s: %s", __FILE__, __LINE__, #call,                   \
                         cudaGetErrorString(cuda_e_));                                                  \
            (rc) = -EIO;                                                                                \
            goto label;                                                                                 \
        }                                                                                               \
    } while (0)

#define CUDA_LAUNCHED(what, err, errlen)                                                                \
    do {                                                                                                \
        cudaError_t cuda_e_ = cudaGetLastError();                                                       \
        if (cuda_e_ != cudaSuccess) {                                                                   \
            if ((err) && (errlen))                                                                      \
                snprintf((err), (errlen), "%s:%d: launch of %s: %s", __FILE__, __LINE__, (what),        \
                         cudaGetErrorString(cuda_e_));                                                  \
            return -EIO;                                                                                \
        }                                                                                               \
    } while (0)

#endif
