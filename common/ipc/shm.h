/* shm.h: CPU shared-memory segments (rings, ledger, heartbeats) as ARENA_CPU arenas.
 *
 * A segment is a memfd: zero-filled at creation, mapped read-write MAP_SHARED, its size
 * sealed. It is handed around by fd exactly like a payload arena (fdpass.h) and kept by
 * the orchestrator for the whole run, so its contents outlive any worker. Close with
 * arena_close(). The only difference from arena_import: the size comes from the fd.
 */
#ifndef DF_SHM_H
#define DF_SHM_H

#include "ipc/arena.h"

/* A new zero-filled segment of size (> 0) bytes; `a` in the init state. 0 or -errno. */
int shm_create(arena *a, uint64_t size, const char *name);

/* Map the segment behind fd (size from fstat). Takes ownership of fd on success and on
 * failure (see arena_import). 0 or -errno. */
int shm_import(arena *a, int fd);

#endif
