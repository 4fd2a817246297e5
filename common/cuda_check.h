/* cuda_check.h: the one way CUDA code in this tree checks a CUDA runtime call or a kernel
 * launch. Every library function that talks to CUDA follows the tree's error convention:
 * it returns 0 or a negative errno and, on failure, writes one line into the caller's
 * `char *err, size_t errlen` ("file:line: what: CUDA's text"). A failed CUDA call is -EIO.
 *
 *   CUDA_TRY(call, err, errlen)             return -EIO from the enclosing function
 *   CUDA_TRY_GOTO(call, err, errlen, rc, l) set rc = -EIO and goto l (for cleanup paths)
 *   CUDA_LAUNCHED(what, err, errlen)        after a <<<...>>> launch: its launch error
 *   CU_TRY_GOTO(call, err, errlen, rc, l)   a driver API call (CUresult; include cuda.h first):
 *                                           rc = the errno it maps to (cuda_check_cu_errno:
 *                                           -ENOMEM, -ENODEV, -ENOTSUP, -EPERM, -EINVAL, else
 *                                           -EIO) and goto l; err names the call, the
 *                                           CUDA_ERROR_* name, its number and text
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

#ifdef __cuda_cuda_h__ /* the driver API (cuda.h) is in */
static inline int cuda_check_cu_errno(CUresult r)
{
    switch (r) {
    case CUDA_ERROR_OUT_OF_MEMORY:
        return -ENOMEM;
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_STUB_LIBRARY:
        return -ENODEV;
    case CUDA_ERROR_NOT_SUPPORTED:
        return -ENOTSUP;
    case CUDA_ERROR_NOT_PERMITTED:
        return -EPERM;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
        return -EINVAL;
    default:
        return -EIO;
    }
}

/* "file:line: cuMemMap(...): CUDA_ERROR_INVALID_VALUE (1): invalid argument" */
static inline int cuda_check_cu_fail(CUresult r, const char *call, const char *file, int line, char *err,
                                     size_t errlen)
{
    const char *name = NULL, *text = NULL;
    if (cuGetErrorName(r, &name) != CUDA_SUCCESS || !name)
        name = "CUDA_ERROR_?";
    if (cuGetErrorString(r, &text) != CUDA_SUCCESS || !text)
        text = "unknown CUDA error";
    if (err && errlen)
        snprintf(err, errlen, "%s:%d: %s: %s (%d): %s", file, line, call, name, (int)r, text);
    return cuda_check_cu_errno(r);
}

#define CU_TRY_GOTO(call, err, errlen, rc, label)                                                       \
    do {                                                                                                \
        CUresult cu_r_ = (call);                                                                        \
        if (cu_r_ != CUDA_SUCCESS) {                                                                    \
            (rc) = cuda_check_cu_fail(cu_r_, #call, __FILE__, __LINE__, (err), (errlen));                \
            goto label;                                                                                 \
        }                                                                                               \
    } while (0)
#endif

#endif
