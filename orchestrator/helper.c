/* helper.c: running <bin_dir>/cuda_helper for one request and reading its answer
 * (prefix helper_). The orchestrator never loads CUDA itself: GPU arenas and NCCL ids come
 * from this short-lived child (orchestrator/cuda_helper_main.c has the protocol). Runs at
 * setup and at group restarts, synchronously, with a bounded wait. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ipc/fdpass.h"
#include "util.h"
#include "orch.h"

#define HELPER_TIMEOUT_MS 120000 /* the first CUDA init on a cold machine takes seconds */

int helper_call(const orch *o, const char *const *args, char *answer, size_t cap, int *fd_out, char *err, size_t errlen)
{
    char bin[1200], sockarg[16];
    const char *argv[16];
    int na = 0;
    *fd_out = -1;
    snprintf(bin, sizeof bin, "%s/cuda_helper", o->t.bin_dir ? o->t.bin_dir : o->self_dir);
    if (access(bin, X_OK) < 0)
        return df_err(err, errlen, -ENOENT, "%s: %s (build with make CUDA=1)", bin, strerror(errno));
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
        return df_err(err, errlen, -errno, "socketpair: %s", strerror(errno));
    snprintf(sockarg, sizeof sockarg, "%d", sv[1]);
    argv[na++] = bin;
    argv[na++] = "--sock";
    argv[na++] = sockarg;
    for (int i = 0; args[i] && na < 15; i++)
        argv[na++] = args[i];
    argv[na] = NULL;
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(sv[0]), close(sv[1]);
        return df_err(err, errlen, -e, "fork: %s", strerror(e));
    }
    if (pid == 0) {
        fcntl(sv[1], F_SETFD, 0); /* the helper's end survives exec */
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    close(sv[1]);
    int nfd = 0, rc;
    struct pollfd pfd = {.fd = sv[0], .events = POLLIN};
    rc = poll(&pfd, 1, HELPER_TIMEOUT_MS);
    if (rc <= 0) {
        kill(pid, SIGKILL);
        rc = rc == 0 ? -ETIMEDOUT : -errno;
        snprintf(err, errlen, "cuda_helper %s gave no answer: %s", args[0], strerror(-rc));
    } else {
        memset(answer, 0, cap);
        rc = fdpass_recv(sv[0], answer, cap - 1, fd_out, 1, &nfd);
        if (rc > 0 && !strncmp(answer, "ok ", 3)) {
            memmove(answer, answer + 3, strlen(answer + 3) + 1);
            rc = 0;
        } else {
            if (nfd == 1)
                close(*fd_out);
            *fd_out = -1;
            rc = df_err(err, errlen, -EIO, "cuda_helper %s: %s", args[0], rc > 0 ? answer : "died without an answer");
        }
    }
    close(sv[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return rc;
}
