/* arena_cuda.c: the ARENA_CUDA backend of arena.h (arena_ops_cuda; CUDA=1 builds), CUDA
 * VMM through the driver API.
 *
 * Why VMM and not cudaIpc*: measured on the H200 machine, a VMM allocation exported as a
 * POSIX fd survives its creator's SIGKILL while any process holds the fd, and a new process
 * can import it; a legacy IPC handle of a dead exporter cannot be opened (error 400). The
 * orchestrator keeps the fds, so GPU arenas outlive every worker.
 *
 * Create: cuInit, retain the device's primary context (the one cudart uses, so kernels of
 * the same process see the mapping), cuMemCreate (pinned device memory, POSIX-fd handle
 * requested) of the size rounded up to the minimum granularity, export to an fd, reserve
 * a VA range, map it at offset 0 (cuMemMap offsets must be 0: whole arenas are mapped,
 * offsets live in ring descriptors), set read-write access for `device`.
 * Import: the same with cuMemImportFromShareableHandle instead of create/export.
 * Every failing driver call is reported in err with its cuGetErrorName/cuGetErrorString
 * text and mapped to an errno (CU_TRY_GOTO, cuda_check.h).
 *
 * The primary context stays retained for the arena's lifetime (one retain per arena,
 * released in arena_cuda_close); calls are made with it pushed and popped again, so
 * whatever context the caller has current is left untouched.
 */
#include "ipc/arena_internal.h"

#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cuda_check.h"

/* cuInit, check the device supports VMM with POSIX fds, retain and push its primary
 * context. On success the caller must pop and (eventually) release. */
static int open_device(int device, CUdevice *dev_out, CUcontext *ctx_out, char *err, size_t errlen)
{
    int rc = 0, vmm = 0, posix = 0;
    CUdevice dev;
    CUcontext ctx = NULL;
    CU_TRY_GOTO(cuInit(0), err, errlen, rc, fail);
    CU_TRY_GOTO(cuDeviceGet(&dev, device), err, errlen, rc, fail);
    CU_TRY_GOTO(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev), err, errlen,
                rc, fail);
    CU_TRY_GOTO(cuDeviceGetAttribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev), err,
                errlen, rc, fail);
    if (!vmm || !posix)
        return arena_fail(err, errlen, -ENOTSUP, "CUDA device %d lacks %s", device,
                          !vmm ? "virtual memory management (cuMemCreate)" : "POSIX file descriptor memory handles");
    CU_TRY_GOTO(cuDevicePrimaryCtxRetain(&ctx, dev), err, errlen, rc, fail);
    {
        CUresult r = cuCtxPushCurrent(ctx);
        if (r != CUDA_SUCCESS) {
            rc = cuda_check_cu_fail(r, "cuCtxPushCurrent(primary context)", __FILE__, __LINE__, err, errlen);
            cuDevicePrimaryCtxRelease(dev);
            return rc;
        }
    }
    *dev_out = dev;
    *ctx_out = ctx;
    return 0;
fail:
    return rc;
}

static void close_device(CUdevice dev, int release)
{
    CUcontext popped;
    cuCtxPopCurrent(&popped);
    if (release)
        cuDevicePrimaryCtxRelease(dev);
}

static void alloc_prop(CUmemAllocationProp *prop, int device)
{
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = device;
    prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

/* Round size up to the allocation granularity (the same rule in creator and importer). */
static int rounded_size(const CUmemAllocationProp *prop, int device, uint64_t size, uint64_t *out, size_t *gran_out,
                        char *err, size_t errlen)
{
    int rc = 0;
    size_t gran = 0;
    CU_TRY_GOTO(cuMemGetAllocationGranularity(&gran, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), err, errlen, rc, fail);
    if (gran == 0)
        return arena_fail(err, errlen, -EIO, "CUDA device %d reports allocation granularity 0", device);
    if (size > UINT64_MAX - gran)
        return arena_fail(err, errlen, -EINVAL, "arena size %llu overflows when rounded to granularity %zu",
                          (unsigned long long)size, gran);
    *out = (size + gran - 1) / gran * gran;
    *gran_out = gran;
    return 0;
fail:
    return rc;
}

/* Reserve a VA range, map handle h at offset 0 over all of it, grant `device` RW.
 * On failure everything done here is undone (the handle itself is not released). */
static int map_handle(CUmemGenericAllocationHandle h, int device, uint64_t size, size_t gran, CUdeviceptr *ptr_out,
                      char *err, size_t errlen)
{
    int rc = 0;
    CUdeviceptr ptr = 0;
    int mapped = 0;
    CU_TRY_GOTO(cuMemAddressReserve(&ptr, (size_t)size, gran, 0, 0), err, errlen, rc, fail);
    CU_TRY_GOTO(cuMemMap(ptr, (size_t)size, 0, h, 0), err, errlen, rc, fail);
    mapped = 1;
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = device;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CU_TRY_GOTO(cuMemSetAccess(ptr, (size_t)size, &acc, 1), err, errlen, rc, fail);
    *ptr_out = ptr;
    return 0;
fail:
    if (mapped)
        cuMemUnmap(ptr, (size_t)size);
    if (ptr)
        cuMemAddressFree(ptr, (size_t)size);
    return rc;
}

/* The end of a create or import: a is the mapped arena; the primary context stays
 * retained while it lives. */
static void adopt(arena *a, CUdevice dev, int device, int fd, CUmemGenericAllocationHandle h, CUdeviceptr ptr,
                  uint64_t bytes)
{
    close_device(dev, 0);
    a->kind = ARENA_CUDA;
    a->fd = fd;
    a->base = (void *)(uintptr_t)ptr;
    a->size = bytes;
    a->device = device;
    a->cu_handle = (uint64_t)h;
}

static int cuda_create(arena *a, int device, uint64_t size, const char *name, char *err, size_t errlen)
{
    (void)name;
    CUdevice dev;
    CUcontext ctx;
    int rc = open_device(device, &dev, &ctx, err, errlen);
    if (rc < 0)
        return rc;
    CUmemAllocationProp prop;
    alloc_prop(&prop, device);
    CUmemGenericAllocationHandle h = 0;
    int have_h = 0, fd = -1;
    uint64_t bytes;
    size_t gran;
    CUdeviceptr ptr = 0;
    rc = rounded_size(&prop, device, size, &bytes, &gran, err, errlen);
    if (rc < 0)
        goto fail;
    CU_TRY_GOTO(cuMemCreate(&h, (size_t)bytes, &prop, 0), err, errlen, rc, fail);
    have_h = 1;
    CU_TRY_GOTO(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), err, errlen, rc,
                fail);
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
        rc = -errno;
        arena_fail(err, errlen, rc, "fcntl(FD_CLOEXEC) on exported CUDA fd %d: %s", fd, strerror(-rc));
        goto fail;
    }
    rc = map_handle(h, device, bytes, gran, &ptr, err, errlen);
    if (rc < 0)
        goto fail;
    adopt(a, dev, device, fd, h, ptr, bytes);
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    if (have_h)
        cuMemRelease(h);
    close_device(dev, 1);
    return rc;
}

static int cuda_import(arena *a, int device, int fd, uint64_t size, char *err, size_t errlen)
{
    CUdevice dev;
    CUcontext ctx;
    int rc = open_device(device, &dev, &ctx, err, errlen);
    if (rc < 0)
        return rc;
    CUmemAllocationProp prop;
    alloc_prop(&prop, device);
    CUmemGenericAllocationHandle h = 0;
    int have_h = 0;
    uint64_t bytes;
    size_t gran;
    CUdeviceptr ptr = 0;
    rc = rounded_size(&prop, device, size, &bytes, &gran, err, errlen);
    if (rc < 0)
        goto fail;
    /* The driver does not take over fd (it keeps its own reference); we keep it for
     * arena_dup_fd and close it in arena_close. */
    CU_TRY_GOTO(cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                err, errlen, rc, fail);
    have_h = 1;
    rc = map_handle(h, device, bytes, gran, &ptr, err, errlen);
    if (rc < 0) {
        char why[384]; /* copy: arena_fail writes err again */
        snprintf(why, sizeof why, "%s", err && errlen ? err : "");
        arena_fail(err, errlen, rc,
                   "%s; importing fd %d as %llu bytes (requested %llu): was the size the "
                   "creator's?",
                   why, fd, (unsigned long long)bytes, (unsigned long long)size);
        goto fail;
    }
    adopt(a, dev, device, fd, h, ptr, bytes);
    return 0;
fail:
    if (have_h)
        cuMemRelease(h);
    close_device(dev, 1);
    return rc;
}

static int cuda_grant_access(const arena *a, int peer_device, char *err, size_t errlen)
{
    CUdevice dev;
    CUcontext ctx;
    int rc = open_device(a->device, &dev, &ctx, err, errlen);
    if (rc < 0)
        return rc;
    CUmemAccessDesc acc[2];
    memset(acc, 0, sizeof acc);
    /* cuMemSetAccess replaces the access list for the range: name the owner again. */
    acc[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc[0].location.id = a->device;
    acc[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    acc[1] = acc[0];
    acc[1].location.id = peer_device;
    CU_TRY_GOTO(cuMemSetAccess((CUdeviceptr)(uintptr_t)a->base, (size_t)a->size, acc, peer_device == a->device ? 1 : 2),
                err, errlen, rc, fail);
    close_device(dev, 1);
    return 0;
fail:
    close_device(dev, 1);
    return rc;
}

static int cuda_copy(const arena *a, uint64_t off, void *buf, uint64_t n, int to_host, char *err, size_t errlen)
{
    CUdevice dev;
    CUcontext ctx;
    int rc = open_device(a->device, &dev, &ctx, err, errlen);
    if (rc < 0)
        return rc;
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)a->base + off;
    if (to_host)
        CU_TRY_GOTO(cuMemcpyDtoH(buf, p, (size_t)n), err, errlen, rc, fail);
    else
        CU_TRY_GOTO(cuMemcpyHtoD(p, buf, (size_t)n), err, errlen, rc, fail);
    close_device(dev, 1);
    return 0;
fail:
    close_device(dev, 1);
    return rc;
}

static void cuda_close(arena *a)
{
    CUdevice dev;
    CUcontext ctx;
    /* Retain once more to get the context handle; released twice below (this retain and
     * the one taken at create/import). Teardown errors cannot be acted on: ignored. */
    if (cuDeviceGet(&dev, a->device) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS)
        return;
    if (cuCtxPushCurrent(ctx) == CUDA_SUCCESS) {
        CUdeviceptr ptr = (CUdeviceptr)(uintptr_t)a->base;
        cuMemUnmap(ptr, (size_t)a->size);
        cuMemAddressFree(ptr, (size_t)a->size);
        cuMemRelease((CUmemGenericAllocationHandle)a->cu_handle);
        CUcontext popped;
        cuCtxPopCurrent(&popped);
    }
    cuDevicePrimaryCtxRelease(dev);
    cuDevicePrimaryCtxRelease(dev);
}

const arena_ops arena_ops_cuda = {
    .name = "cuda",
    .create = cuda_create,
    .import = cuda_import,
    .grant_access = cuda_grant_access,
    .copy = cuda_copy,
    .close = cuda_close,
};
