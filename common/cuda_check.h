/* cuda_check.h: the one way CUDA code in this tree checks a call. Every library function
 * that talks to CUDA follows the tree's error convention: it returns 0 or a negative errno
 * and, on failure, writes one line into the caller's `char *err, size_t errlen` (err may be
 * NULL or errlen 0: then nothing is written). A failed CUDA or cuBLASLt call is -EIO.
 *
 *   CUDA_TRY(call, err, errlen)                 a CUDA runtime call: return -EIO on failure
 *   CUDA_TRY_GOTO(call, err, errlen, rc, l)     ... set rc = -EIO and goto l (cleanup paths)
 *   CUDA_ALLOC_TRY_GOTO(call, err, errlen, rc, l)  ... rc = -ENOMEM when CUDA is out of
 *                                               memory, else -EIO (allocations)
 *   CUDA_LAUNCHED(what, err, errlen)            after a <<<...>>> launch: its launch error
 *   CUBLAS_TRY_GOTO(call, err, errlen, rc, l)   a cuBLASLt call (include cublasLt.h first)
 *   CUDA_TRY_RC(call)                           a call of this convention (0 / -errno, its
 *                                               message already in err): return its rc
 *   CUDA_TRY_RC_GOTO(call, rc, l)               ... set rc and goto l
 *   CUDA_TRY_RC_AT(call, err, errlen, fmt, ...) ... and put "<fmt ...>: " in front of the
 *                                               callee's message (which layer, which step)
 *   CUDA_LAYER_STEP(call, where, what)          a step of a layer's forward (a call of this
 *                                               convention writing its cause into kerr):
 *                                               err = "<where>: layer <l>: <what> failed
 *                                               (<rc>): <cause>", return -EINVAL or -EIO
 *   df_err(err, errlen, rc, fmt, ...) (util.h)  write a message of one's own, return rc
 *   CU_TRY_GOTO(call, err, errlen, rc, l)   a driver API call (CUresult; include cuda.h first):
 *                                           rc = the errno it maps to (cuda_check_cu_errno:
 *                                           -ENOMEM, -ENODEV, -ENOTSUP, -EPERM, -EINVAL, else
 *                                           -EIO) and goto l; err names the call, the
 *                                           CUDA_ERROR_* name, its number and text
 *
 * Messages: "file:line: call: CUDA's text" for the CUDA and cuBLASLt forms.
 * Header-only and at the base layer so that every room with CUDA code (ipc's GPU arenas,
 * nn's kernels, the models) shares it. Include after cuda_runtime.h. */
#ifndef DF_CUDA_CHECK_H
#define DF_CUDA_CHECK_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "util.h" /* df_err */

#define CUDA_TRY(call, err, errlen)                                                          \
    do {                                                                                     \
        cudaError_t cuda_e_ = (call);                                                        \
        if (cuda_e_ != cudaSuccess)                                                          \
            return df_err((err), (errlen), -EIO, "%s:%d: %s: %s", __FILE__, __LINE__, #call, \
                          cudaGetErrorString(cuda_e_));                                      \
    } while (0)

#define CUDA_TRY_GOTO(call, err, errlen, rc, label)                                          \
    do {                                                                                     \
        cudaError_t cuda_e_ = (call);                                                        \
        if (cuda_e_ != cudaSuccess) {                                                        \
            (rc) = df_err((err), (errlen), -EIO, "%s:%d: %s: %s", __FILE__, __LINE__, #call, \
                          cudaGetErrorString(cuda_e_));                                      \
            goto label;                                                                      \
        }                                                                                    \
    } while (0)

#define CUDA_ALLOC_TRY_GOTO(call, err, errlen, rc, label)                                                          \
    do {                                                                                                           \
        cudaError_t cuda_e_ = (call);                                                                              \
        if (cuda_e_ != cudaSuccess) {                                                                              \
            (rc) = df_err((err), (errlen), cuda_e_ == cudaErrorMemoryAllocation ? -ENOMEM : -EIO, "%s:%d: %s: %s", \
                          __FILE__, __LINE__, #call, cudaGetErrorString(cuda_e_));                                 \
            goto label;                                                                                            \
        }                                                                                                          \
    } while (0)

#define CUDA_LAUNCHED(what, err, errlen)                                                                \
    do {                                                                                                \
        cudaError_t cuda_e_ = cudaGetLastError();                                                       \
        if (cuda_e_ != cudaSuccess)                                                                     \
            return df_err((err), (errlen), -EIO, "%s:%d: launch of %s: %s", __FILE__, __LINE__, (what), \
                          cudaGetErrorString(cuda_e_));                                                 \
    } while (0)

#define CUBLAS_TRY_GOTO(call, err, errlen, rc, label)                                             \
    do {                                                                                          \
        cublasStatus_t cublas_st_ = (call);                                                       \
        if (cublas_st_ != CUBLAS_STATUS_SUCCESS) {                                                \
            (rc) = df_err((err), (errlen), -EIO, "%s:%d: %s: %s (%d)", __FILE__, __LINE__, #call, \
                          cublasLtGetStatusString(cublas_st_), (int)cublas_st_);                  \
            goto label;                                                                           \
        }                                                                                         \
    } while (0)

#define CUDA_TRY_RC(call)      \
    do {                       \
        int cuda_rc_ = (call); \
        if (cuda_rc_ < 0)      \
            return cuda_rc_;   \
    } while (0)

#define CUDA_TRY_RC_GOTO(call, rc, label) \
    do {                                  \
        int cuda_rc_ = (call);            \
        if (cuda_rc_ < 0) {               \
            (rc) = cuda_rc_;              \
            goto label;                   \
        }                                 \
    } while (0)

#define CUDA_TRY_RC_AT(call, err, errlen, ...)                \
    do {                                                      \
        int cuda_rc_ = (call);                                \
        if (cuda_rc_ < 0) {                                   \
            df_cuda_err_prefix((err), (errlen), __VA_ARGS__); \
            return cuda_rc_;                                  \
        }                                                     \
    } while (0)

/* Uses the caller's err, errlen, l (the layer) and kerr (a char array the step writes its
 * cause into, cleared first). -EINVAL stays -EINVAL (a shape the kernels do not take:
 * permanent), anything else is -EIO. */
#define CUDA_LAYER_STEP(call, where, what)                                                                             \
    do {                                                                                                               \
        kerr[0] = 0;                                                                                                   \
        int r_ = (call);                                                                                               \
        if (r_ < 0)                                                                                                    \
            return df_err(err, errlen, r_ == -EINVAL ? -EINVAL : -EIO, "%s: layer %d: %s failed (%d): %s", (where), l, \
                          (what), r_, kerr);                                                                           \
    } while (0)

/* Put "<fmt ...>: " in front of the message already in err (its end is cut if the two do
 * not fit). */
static inline void df_cuda_err_prefix(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline void df_cuda_err_prefix(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    char head[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(head, sizeof head - 2, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    size_t h = strlen(head);
    head[h++] = ':', head[h++] = ' ';
    if (h >= errlen)
        h = errlen - 1;
    size_t old = strnlen(err, errlen - 1), keep = old < errlen - 1 - h ? old : errlen - 1 - h;
    memmove(err + h, err, keep);
    memcpy(err, head, h);
    err[h + keep] = '\0';
}

#ifdef __cuda_cuda_h__ /* the driver API (cuda.h) is in */
static inline int cuda_check_cu_errno(CUresult r)
{
    switch (r) {
    case CUDA_ERROR_OUT_OF_MEMORY: return -ENOMEM;
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_STUB_LIBRARY: return -ENODEV;
    case CUDA_ERROR_NOT_SUPPORTED: return -ENOTSUP;
    case CUDA_ERROR_NOT_PERMITTED: return -EPERM;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE: return -EINVAL;
    default: return -EIO;
    }
}

/* "file:line: cuMemMap(...): CUDA_ERROR_INVALID_VALUE (1): invalid argument" */
static inline int cuda_check_cu_fail(CUresult r, const char *call, const char *file, int line, char *err, size_t errlen)
{
    const char *name = NULL, *text = NULL;
    if (cuGetErrorName(r, &name) != CUDA_SUCCESS || !name)
        name = "CUDA_ERROR_?";
    if (cuGetErrorString(r, &text) != CUDA_SUCCESS || !text)
        text = "unknown CUDA error";
    return df_err(err, errlen, cuda_check_cu_errno(r), "%s:%d: %s: %s (%d): %s", file, line, call, name, (int)r, text);
}

#define CU_TRY_GOTO(call, err, errlen, rc, label)                                         \
    do {                                                                                  \
        CUresult cu_r_ = (call);                                                          \
        if (cu_r_ != CUDA_SUCCESS) {                                                      \
            (rc) = cuda_check_cu_fail(cu_r_, #call, __FILE__, __LINE__, (err), (errlen)); \
            goto label;                                                                   \
        }                                                                                 \
    } while (0)
#endif

#endif
