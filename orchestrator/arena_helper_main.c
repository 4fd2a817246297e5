/* arena_helper: creates one CUDA VMM arena and hands its fd to the orchestrator, then exits.
 *
 * Why a separate process: the orchestrator never initialises CUDA (a supervisor that owns
 * a CUDA context can be taken down by a GPU fault, and forking after cuInit is undefined).
 * The VMM allocation outlives this process through the exported fd that the orchestrator
 * keeps in its fd store (docs/memory.md), so the helper can exit at once.
 *
 * Protocol: the orchestrator passes one end of a SOCK_SEQPACKET pair as --sock FD. The
 * helper sends one message: payload "ok <bytes mapped>" with the arena fd, or
 * "error: <text>" without an fd. Exit 0 on success, 1 on a CUDA failure, 2 on bad usage. */
#include "ipc/arena.h"
#include "ipc/fdpass.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] =
    "usage: arena_helper --sock FD --device N --bytes B [--name NAME]\n"
    "Creates a CUDA VMM arena of B bytes on device N and sends its fd over the unix socket FD\n"
    "(payload \"ok <bytes>\" or \"error: <text>\"). Started by the orchestrator for GPU rings.\n";

int main(int argc, char **argv)
{
    int sock = -1, device = -1;
    unsigned long long bytes = 0;
    const char *name = "df-arena";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage, stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "arena_helper: %s needs a value\n%s", argv[i], usage);
            return 2;
        }
        char *end = NULL;
        if (!strcmp(argv[i], "--sock"))
            sock = (int)strtol(argv[++i], &end, 10);
        else if (!strcmp(argv[i], "--device"))
            device = (int)strtol(argv[++i], &end, 10);
        else if (!strcmp(argv[i], "--bytes"))
            bytes = strtoull(argv[++i], &end, 10);
        else if (!strcmp(argv[i], "--name"))
            name = argv[++i];
        else {
            fprintf(stderr, "arena_helper: unknown option %s\n%s", argv[i], usage);
            return 2;
        }
        if (end && *end) {
            fprintf(stderr, "arena_helper: %s: not a number: %s\n", argv[i - 1], argv[i]);
            return 2;
        }
    }
    if (sock < 0 || device < 0 || bytes == 0) {
        fprintf(stderr, "arena_helper: --sock, --device and --bytes are required\n%s", usage);
        return 2;
    }
    arena a;
    arena_init(&a);
    char msg[512];
    int rc = arena_create(&a, ARENA_CUDA, device, bytes, name);
    if (rc < 0) {
        snprintf(msg, sizeof msg, "error: %s", arena_strerror(rc));
        fdpass_send(sock, msg, strlen(msg) + 1, NULL, 0);
        return 1;
    }
    snprintf(msg, sizeof msg, "ok %llu", (unsigned long long)a.size);
    rc = fdpass_send(sock, msg, strlen(msg) + 1, &a.fd, 1);
    if (rc < 0) {
        fprintf(stderr, "arena_helper: sending the fd: %s\n", strerror(-rc));
        return 1;
    }
    arena_close(&a); /* the orchestrator's fd keeps the allocation */
    return 0;
}
