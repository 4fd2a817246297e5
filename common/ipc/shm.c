/* shm.c: CPU shared segments as ARENA_CPU arenas (see shm.h). */
#include "ipc/shm.h"
#include "ipc/arena_internal.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int shm_create(arena *a, uint64_t size, const char *name)
{
    return arena_create(a, ARENA_CPU, -1, size, name);
}

int shm_import(arena *a, int fd)
{
    struct stat st;
    if (fd < 0)
        return arena_fail(-EBADF, "fd %d is not a file descriptor", fd);
    if (fstat(fd, &st) < 0) {
        int e = -errno;
        close(fd);
        return arena_fail(e, "fstat of segment fd %d: %s", fd, strerror(-e));
    }
    if (st.st_size <= 0) {
        close(fd);
        return arena_fail(-EINVAL, "segment fd %d is empty (size %lld)", fd,
                          (long long)st.st_size);
    }
    return arena_import(a, ARENA_CPU, -1, fd, (uint64_t)st.st_size);
}
