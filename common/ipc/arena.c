/* arena.c: the public arena API and its CPU backend (memfd + mmap MAP_SHARED).
 *
 * Each kind of arena has its backend as an arena_ops table (arena_internal.h,
 * docs/backends.md): cpu_ops here, arena_ops_cuda in arena_cuda.c (CUDA=1) or
 * arena_cuda_nocuda.c (-ENOTSUP). The arena's kind, fixed when it is created or imported,
 * picks the table. This file does the argument checks and fd ownership for both, so the
 * backends only do mapping work. See arena.h for the contract.
 */
#include "ipc/arena_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

int arena_fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (!err || !errlen)
        return rc;
    char detail[320];
    va_list ap;
    va_start(ap, fmt);
    df_verr(detail, sizeof detail, rc, NULL, fmt, ap);
    va_end(ap);
    return df_err(err, errlen, rc, "%s (%s)", strerror(rc < 0 ? -rc : rc), detail);
}

void arena_init(arena *a)
{
    a->kind = ARENA_CPU;
    a->fd = -1;
    a->base = NULL;
    a->size = 0;
    a->device = -1;
    a->cu_handle = 0;
}

/* ---- the cpu backend ---- */

/* Map a memfd of exactly `size` bytes read-write shared. */
static int cpu_map(arena *a, int fd, uint64_t size, char *err, size_t errlen)
{
    if (size > (uint64_t)SIZE_MAX)
        return arena_fail(err, errlen, -EINVAL, "size %llu does not fit the address space", (unsigned long long)size);
    void *p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int e = -errno;
        return arena_fail(err, errlen, e, "mmap of fd %d, %llu bytes: %s", fd, (unsigned long long)size, strerror(-e));
    }
    a->kind = ARENA_CPU;
    a->fd = fd;
    a->base = p;
    a->size = size;
    a->device = -1;
    a->cu_handle = 0;
    return 0;
}

static int cpu_create(arena *a, int device, uint64_t size, const char *name, char *err, size_t errlen)
{
    (void)device;
    int fd = memfd_create(name ? name : "df-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        int e = -errno;
        return arena_fail(err, errlen, e, "memfd_create(\"%s\"): %s", name ? name : "df-arena", strerror(-e));
    }
    int rc;
    if (ftruncate(fd, (off_t)size) < 0) {
        rc = -errno;
        arena_fail(err, errlen, rc, "ftruncate of memfd to %llu bytes: %s", (unsigned long long)size, strerror(-rc));
        goto fail;
    }
    /* Fix the size for everyone: a shrink by any holder would SIGBUS every mapping. */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        rc = -errno;
        arena_fail(err, errlen, rc, "sealing memfd size: %s", strerror(-rc));
        goto fail;
    }
    rc = cpu_map(a, fd, size, err, errlen);
    if (rc < 0)
        goto fail;
    return 0;
fail:
    close(fd);
    return rc;
}

static int cpu_import(arena *a, int device, int fd, uint64_t size, char *err, size_t errlen)
{
    (void)device;
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = -errno;
        return arena_fail(err, errlen, e, "fstat of fd %d: %s", fd, strerror(-e));
    }
    if (!S_ISREG(st.st_mode))
        return arena_fail(err, errlen, -EINVAL, "fd %d is not a memfd/regular file (mode 0%o)", fd,
                          (unsigned)st.st_mode);
    if ((uint64_t)st.st_size != size)
        return arena_fail(err, errlen, -EINVAL, "fd %d has %llu bytes, expected %llu", fd,
                          (unsigned long long)st.st_size, (unsigned long long)size);
    return cpu_map(a, fd, size, err, errlen);
}

static int cpu_grant_access(const arena *a, int peer_device, char *err, size_t errlen)
{
    (void)a, (void)peer_device;
    return arena_fail(err, errlen, -EINVAL, "arena_grant_access needs a mapped ARENA_CUDA arena");
}

static int cpu_copy(const arena *a, uint64_t off, void *buf, uint64_t n, int to_host, char *err, size_t errlen)
{
    (void)err, (void)errlen;
    if (to_host)
        memcpy(buf, (const char *)a->base + off, (size_t)n);
    else
        memcpy((char *)a->base + off, buf, (size_t)n);
    return 0;
}

static void cpu_close(arena *a)
{
    munmap(a->base, (size_t)a->size); /* cannot fail for a mapping we made */
}

static const arena_ops cpu_ops = {
    .name = "cpu",
    .create = cpu_create,
    .import = cpu_import,
    .grant_access = cpu_grant_access,
    .copy = cpu_copy,
    .close = cpu_close,
};

/* The backend of an arena kind, NULL for an unknown kind. */
static const arena_ops *ops_of(arena_kind kind)
{
    switch (kind) {
    case ARENA_CPU: return &cpu_ops;
    case ARENA_CUDA: return &arena_ops_cuda;
    }
    return NULL;
}

/* ---- the API ---- */

int arena_create(arena *a, arena_kind kind, int device, uint64_t size, const char *name, char *err, size_t errlen)
{
    if (a->base != NULL)
        return arena_fail(err, errlen, -EBUSY, "arena already holds a mapping (call arena_close first)");
    if (size == 0)
        return arena_fail(err, errlen, -EINVAL, "arena size must be > 0");
    const arena_ops *ops = ops_of(kind);
    if (!ops)
        return arena_fail(err, errlen, -EINVAL, "unknown arena kind %d", (int)kind);
    if (kind == ARENA_CUDA && device < 0)
        return arena_fail(err, errlen, -EINVAL, "CUDA device %d is negative", device);
    return ops->create(a, device, size, name, err, errlen);
}

int arena_import(arena *a, arena_kind kind, int device, int fd, uint64_t size, char *err, size_t errlen)
{
    int rc;
    const arena_ops *ops = ops_of(kind);
    if (fd < 0)
        return arena_fail(err, errlen, -EBADF, "fd %d is not a file descriptor", fd);
    if (a->base != NULL) {
        rc = arena_fail(err, errlen, -EBUSY, "arena already holds a mapping (call arena_close first)");
        goto fail;
    }
    if (size == 0) {
        rc = arena_fail(err, errlen, -EINVAL, "import size must be > 0");
        goto fail;
    }
    /* The fd may have come over SCM_RIGHTS without MSG_CMSG_CLOEXEC: never leak it to
     * a program this process execs. */
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
        rc = -errno;
        arena_fail(err, errlen, rc, "fcntl(FD_CLOEXEC) on fd %d: %s", fd, strerror(-rc));
        goto fail;
    }
    if (!ops)
        rc = arena_fail(err, errlen, -EINVAL, "unknown arena kind %d", (int)kind);
    else if (kind == ARENA_CUDA && device < 0)
        rc = arena_fail(err, errlen, -EINVAL, "CUDA device %d is negative", device);
    else
        rc = ops->import(a, device, fd, size, err, errlen);
    if (rc < 0)
        goto fail;
    return 0;
fail:
    close(fd);
    arena_init(a);
    return rc;
}

int arena_dup_fd(const arena *a, char *err, size_t errlen)
{
    if (a->fd < 0)
        return arena_fail(err, errlen, -EBADF, "arena has no fd (not created or already closed)");
    int fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
        int e = -errno;
        return arena_fail(err, errlen, e, "dup of arena fd %d: %s", a->fd, strerror(-e));
    }
    return fd;
}

int arena_grant_access(const arena *a, int peer_device, char *err, size_t errlen)
{
    if (a->kind != ARENA_CUDA || a->base == NULL)
        return arena_fail(err, errlen, -EINVAL, "arena_grant_access needs a mapped ARENA_CUDA arena");
    if (peer_device < 0)
        return arena_fail(err, errlen, -EINVAL, "CUDA device %d is negative", peer_device);
    return ops_of(a->kind)->grant_access(a, peer_device, err, errlen);
}

static int copy_check(const arena *a, uint64_t off, uint64_t n, char *err, size_t errlen)
{
    if (a->base == NULL || !ops_of(a->kind))
        return arena_fail(err, errlen, -EINVAL, "arena is not mapped");
    if (off > a->size || n > a->size - off)
        return arena_fail(err, errlen, -ERANGE, "bytes [%llu, +%llu) outside the arena of %llu bytes",
                          (unsigned long long)off, (unsigned long long)n, (unsigned long long)a->size);
    return 0;
}

int arena_read(const arena *a, uint64_t off, void *dst, uint64_t n, char *err, size_t errlen)
{
    int rc = copy_check(a, off, n, err, errlen);
    if (rc < 0 || n == 0)
        return rc;
    return ops_of(a->kind)->copy(a, off, dst, n, 1, err, errlen);
}

int arena_write(const arena *a, uint64_t off, const void *src, uint64_t n, char *err, size_t errlen)
{
    int rc = copy_check(a, off, n, err, errlen);
    if (rc < 0 || n == 0)
        return rc;
    return ops_of(a->kind)->copy(a, off, (void *)src, n, 0, err, errlen);
}

void arena_close(arena *a)
{
    const arena_ops *ops = ops_of(a->kind);
    if (a->base != NULL && ops)
        ops->close(a);
    if (a->fd >= 0)
        close(a->fd);
    arena_init(a);
}
