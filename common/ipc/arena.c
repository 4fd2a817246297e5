/* arena.c: the public arena API and its CPU backend (memfd + mmap MAP_SHARED).
 *
 * The CUDA backend sits behind arena_internal.h (arena_cuda.c / arena_cuda_nocuda.c);
 * this file does the argument checks, fd ownership and error detail for both, so the two
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

/* Last failure on this thread: its code and a human-readable detail. */
static _Thread_local int last_err;
static _Thread_local char last_detail[256];
static _Thread_local char strerror_buf[384];

int arena_fail(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_detail, sizeof last_detail, fmt, ap);
    va_end(ap);
    last_err = err;
    return err;
}

static void clear_fail(void)
{
    last_err = 0;
    last_detail[0] = 0;
}

const char *arena_last_detail(void)
{
    return last_detail;
}

const char *arena_strerror(int err)
{
    int e = err < 0 ? -err : err;
    if (err == 0)
        return "success";
    if (last_err != 0 && (last_err == err || last_err == -err) && last_detail[0])
        snprintf(strerror_buf, sizeof strerror_buf, "%s (%s)", strerror(e), last_detail);
    else
        snprintf(strerror_buf, sizeof strerror_buf, "%s", strerror(e));
    return strerror_buf;
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

/* Map a memfd of exactly `size` bytes read-write shared. */
static int cpu_map(arena *a, int fd, uint64_t size)
{
    if (size > (uint64_t)SIZE_MAX)
        return arena_fail(-EINVAL, "size %llu does not fit the address space",
                          (unsigned long long)size);
    void *p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int e = -errno;
        return arena_fail(e, "mmap of fd %d, %llu bytes: %s", fd, (unsigned long long)size,
                          strerror(-e));
    }
    a->kind = ARENA_CPU;
    a->fd = fd;
    a->base = p;
    a->size = size;
    a->device = -1;
    a->cu_handle = 0;
    return 0;
}

static int cpu_create(arena *a, uint64_t size, const char *name)
{
    int fd = memfd_create(name ? name : "df-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        int e = -errno;
        return arena_fail(e, "memfd_create(\"%s\"): %s", name ? name : "df-arena", strerror(-e));
    }
    int rc;
    if (ftruncate(fd, (off_t)size) < 0) {
        rc = -errno;
        arena_fail(rc, "ftruncate of memfd to %llu bytes: %s", (unsigned long long)size,
                   strerror(-rc));
        goto fail;
    }
    /* Fix the size for everyone: a shrink by any holder would SIGBUS every mapping. */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        rc = -errno;
        arena_fail(rc, "sealing memfd size: %s", strerror(-rc));
        goto fail;
    }
    rc = cpu_map(a, fd, size);
    if (rc < 0)
        goto fail;
    return 0;
fail:
    close(fd);
    return rc;
}

static int cpu_import(arena *a, int fd, uint64_t size)
{
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = -errno;
        return arena_fail(e, "fstat of fd %d: %s", fd, strerror(-e));
    }
    if (!S_ISREG(st.st_mode))
        return arena_fail(-EINVAL, "fd %d is not a memfd/regular file (mode 0%o)", fd,
                          (unsigned)st.st_mode);
    if ((uint64_t)st.st_size != size)
        return arena_fail(-EINVAL, "fd %d has %llu bytes, expected %llu", fd,
                          (unsigned long long)st.st_size, (unsigned long long)size);
    return cpu_map(a, fd, size);
}

int arena_create(arena *a, arena_kind kind, int device, uint64_t size, const char *name)
{
    clear_fail();
    if (a->base != NULL)
        return arena_fail(-EBUSY, "arena already holds a mapping (call arena_close first)");
    if (size == 0)
        return arena_fail(-EINVAL, "arena size must be > 0");
    switch (kind) {
    case ARENA_CPU:
        return cpu_create(a, size, name);
    case ARENA_CUDA:
        if (device < 0)
            return arena_fail(-EINVAL, "CUDA device %d is negative", device);
        return arena_cuda_create(a, device, size);
    }
    return arena_fail(-EINVAL, "unknown arena kind %d", (int)kind);
}

int arena_import(arena *a, arena_kind kind, int device, int fd, uint64_t size)
{
    int rc;
    clear_fail();
    if (fd < 0)
        return arena_fail(-EBADF, "fd %d is not a file descriptor", fd);
    if (a->base != NULL) {
        rc = arena_fail(-EBUSY, "arena already holds a mapping (call arena_close first)");
        goto fail;
    }
    if (size == 0) {
        rc = arena_fail(-EINVAL, "import size must be > 0");
        goto fail;
    }
    /* The fd may have come over SCM_RIGHTS without MSG_CMSG_CLOEXEC: never leak it to
     * a program this process execs. */
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
        rc = -errno;
        arena_fail(rc, "fcntl(FD_CLOEXEC) on fd %d: %s", fd, strerror(-rc));
        goto fail;
    }
    switch (kind) {
    case ARENA_CPU:
        rc = cpu_import(a, fd, size);
        break;
    case ARENA_CUDA:
        rc = device < 0 ? arena_fail(-EINVAL, "CUDA device %d is negative", device)
                        : arena_cuda_import(a, device, fd, size);
        break;
    default:
        rc = arena_fail(-EINVAL, "unknown arena kind %d", (int)kind);
        break;
    }
    if (rc < 0)
        goto fail;
    return 0;
fail:
    close(fd);
    arena_init(a);
    return rc;
}

int arena_dup_fd(const arena *a)
{
    clear_fail();
    if (a->fd < 0)
        return arena_fail(-EBADF, "arena has no fd (not created or already closed)");
    int fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
        int e = -errno;
        return arena_fail(e, "dup of arena fd %d: %s", a->fd, strerror(-e));
    }
    return fd;
}

int arena_grant_access(const arena *a, int peer_device)
{
    clear_fail();
    if (a->kind != ARENA_CUDA || a->base == NULL)
        return arena_fail(-EINVAL, "arena_grant_access needs a mapped ARENA_CUDA arena");
    if (peer_device < 0)
        return arena_fail(-EINVAL, "CUDA device %d is negative", peer_device);
    return arena_cuda_grant_access(a, peer_device);
}

static int copy_check(const arena *a, uint64_t off, uint64_t n)
{
    if (a->base == NULL)
        return arena_fail(-EINVAL, "arena is not mapped");
    if (off > a->size || n > a->size - off)
        return arena_fail(-ERANGE, "bytes [%llu, +%llu) outside the arena of %llu bytes", (unsigned long long)off,
                          (unsigned long long)n, (unsigned long long)a->size);
    return 0;
}

int arena_read(const arena *a, uint64_t off, void *dst, uint64_t n)
{
    clear_fail();
    int rc = copy_check(a, off, n);
    if (rc < 0 || n == 0)
        return rc;
    if (a->kind == ARENA_CUDA)
        return arena_cuda_copy(a, off, dst, n, 1);
    memcpy(dst, (const char *)a->base + off, (size_t)n);
    return 0;
}

int arena_write(const arena *a, uint64_t off, const void *src, uint64_t n)
{
    clear_fail();
    int rc = copy_check(a, off, n);
    if (rc < 0 || n == 0)
        return rc;
    if (a->kind == ARENA_CUDA)
        return arena_cuda_copy(a, off, (void *)src, n, 0);
    memcpy((char *)a->base + off, src, (size_t)n);
    return 0;
}

void arena_close(arena *a)
{
    if (a->base != NULL) {
        if (a->kind == ARENA_CUDA)
            arena_cuda_close(a);
        else
            munmap(a->base, (size_t)a->size); /* cannot fail for a mapping we made */
    }
    if (a->fd >= 0)
        close(a->fd);
    arena_init(a);
}
