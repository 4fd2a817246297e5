/* shm.c: CPU shared segments as ARENA_CPU arenas (see shm.h). */
#include "ipc/shm.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int shm_create(arena *a, uint64_t size, const char *name)
{
    return arena_create(a, ARENA_CPU, -1, size, name, NULL, 0);
}

int shm_import(arena *a, int fd)
{
    struct stat st;
    if (fd < 0)
        return -EBADF;
    if (fstat(fd, &st) < 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    if (st.st_size <= 0) {
        close(fd); /* empty: not a segment */
        return -EINVAL;
    }
    return arena_import(a, ARENA_CPU, -1, fd, (uint64_t)st.st_size, NULL, 0);
}
