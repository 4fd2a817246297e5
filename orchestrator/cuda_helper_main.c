/* cuda_helper: the orchestrator's hands on the GPU. One request per process:
 *   --arena:   create a CUDA VMM arena of --bytes on --device and send its fd back
 *   --nccl-id: make an NCCL unique id (128 bytes) for a drafter group and send it back
 * then exit.
 *
 * Why a separate process: the orchestrator never initialises CUDA (a supervisor that owns
 * a CUDA context can be taken down by a GPU fault, and forking after cuInit is undefined).
 * An arena outlives this process through the exported fd the orchestrator keeps in its fd
 * store (docs/memory.md); an NCCL id is plain bytes (its creator need not stay alive: the
 * ranks bootstrap among themselves through the address it holds, rank 0 listening).
 *
 * Protocol: the orchestrator passes one end of a SOCK_SEQPACKET pair as --sock FD. The
 * helper sends one message: "ok <bytes mapped>" with the arena fd, "ok <256 hex digits>"
 * for an id, or "error: <text>" without an fd. Exit 0 on success, 1 on a CUDA/NCCL failure,
 * 2 on bad usage. orchestrator/helper.c is the other side. */
#include "ipc/allreduce.h"
#include "ipc/arena.h"
#include "ipc/fdpass.h"
#include "util.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] = "usage: cuda_helper --sock FD --arena --device N --bytes B [--name NAME]\n"
                            "       cuda_helper --sock FD --nccl-id\n"
                            "Creates a CUDA VMM arena (or an NCCL unique id) and sends it over the unix socket FD\n"
                            "(payload \"ok ...\" or \"error: <text>\"). Started by the orchestrator, not by hand.\n";

static int reply_error(int sock, const char *what)
{
    char msg[512];
    snprintf(msg, sizeof msg, "error: %s", what);
    fdpass_send(sock, msg, strlen(msg) + 1, NULL, 0);
    return 1;
}

int main(int argc, char **argv)
{
    int sock = -1, device = -1, want_arena = 0, want_id = 0;
    unsigned long long bytes = 0;
    const char *name = "df-arena";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--arena")) {
            want_arena = 1;
            continue;
        }
        if (!strcmp(argv[i], "--nccl-id")) {
            want_id = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "cuda_helper: %s needs a value\n%s", argv[i], usage);
            return 2;
        }
        char *end = NULL;
        if (!strcmp(argv[i], "--sock"))
            sock = (int)df_arg_int("cuda_helper", "--sock", argv[++i], 0, INT_MAX);
        else if (!strcmp(argv[i], "--device"))
            device = (int)df_arg_int("cuda_helper", "--device", argv[++i], 0, INT_MAX);
        else if (!strcmp(argv[i], "--bytes"))
            bytes = strtoull(argv[++i], &end, 10);
        else if (!strcmp(argv[i], "--name"))
            name = argv[++i];
        else {
            fprintf(stderr, "cuda_helper: unknown option %s\n%s", argv[i], usage);
            return 2;
        }
        if (end && *end) {
            fprintf(stderr, "cuda_helper: %s: not a number: %s\n", argv[i - 1], argv[i]);
            return 2;
        }
    }
    if (sock < 0 || want_arena + want_id != 1 || (want_arena && (device < 0 || bytes == 0))) {
        fprintf(stderr, "cuda_helper: --sock and one of --arena (with --device, --bytes) or --nccl-id\n%s", usage);
        return 2;
    }
    char msg[512];
    if (want_id) {
        unsigned char id[128];
        char e2[512];
        int rc = allreduce_nccl_get_unique_id(id, e2, sizeof e2);
        if (rc < 0)
            return reply_error(sock, e2);
        int n = snprintf(msg, sizeof msg, "ok ");
        for (int i = 0; i < 128; i++)
            n += snprintf(msg + n, sizeof msg - (size_t)n, "%02x", id[i]);
        return fdpass_send(sock, msg, (size_t)n + 1, NULL, 0) < 0;
    }
    arena a;
    arena_init(&a);
    char e2[512];
    int rc = arena_create(&a, ARENA_CUDA, device, bytes, name, e2, sizeof e2);
    if (rc < 0)
        return reply_error(sock, e2);
    snprintf(msg, sizeof msg, "ok %llu", (unsigned long long)a.size);
    rc = fdpass_send(sock, msg, strlen(msg) + 1, &a.fd, 1);
    if (rc < 0) {
        fprintf(stderr, "cuda_helper: sending the fd: %s\n", strerror(-rc));
        return 1;
    }
    arena_close(&a); /* the orchestrator's fd keeps the allocation */
    return 0;
}
