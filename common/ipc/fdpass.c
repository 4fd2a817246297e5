/* fdpass.c: SCM_RIGHTS send/receive (see fdpass.h). The control buffer is sized for the
 * caller's maxfds exactly, so the kernel itself flags a sender that sent more
 * (MSG_CTRUNC); we then close what did arrive and report -EMSGSIZE. */
#include "ipc/fdpass.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* A control buffer big enough for FDPASS_MAX_FDS ints, aligned for struct cmsghdr. */
typedef union {
    char buf[CMSG_SPACE(sizeof(int) * FDPASS_MAX_FDS)];
    struct cmsghdr align;
} fdpass_cbuf;

int fdpass_send(int sock, const void *buf, size_t len, const int *fds, int nfds)
{
    if (len == 0 || buf == NULL || nfds < 0 || nfds > FDPASS_MAX_FDS || (nfds > 0 && !fds))
        return -EINVAL;
    fdpass_cbuf cb;
    memset(&cb, 0, sizeof cb);
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (nfds > 0) {
        msg.msg_control = cb.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    }
    size_t done = 0;
    while (done < len) {
        ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        done += (size_t)n;
        /* Stream socket short send: the fds went with the first byte; send the rest plain. */
        iov.iov_base = (char *)buf + done;
        iov.iov_len = len - done;
        msg.msg_control = NULL;
        msg.msg_controllen = 0;
    }
    return 0;
}

int fdpass_recv(int sock, void *buf, size_t cap, int *fds, int maxfds, int *nfds)
{
    if (nfds)
        *nfds = 0;
    if (cap == 0 || buf == NULL || maxfds < 0 || maxfds > FDPASS_MAX_FDS || (maxfds > 0 && !fds) || !nfds)
        return -EINVAL;
    fdpass_cbuf cb;
    struct iovec iov = {.iov_base = buf, .iov_len = cap};
    struct msghdr msg;
    ssize_t n;
    for (;;) {
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        if (maxfds > 0) {
            msg.msg_control = cb.buf;
            msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)maxfds);
        }
        n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
        if (n >= 0)
            break;
        if (errno != EINTR)
            return -errno;
    }
    /* Collect every fd that arrived, whatever the outcome, so none can leak. */
    int got = 0, extra = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const unsigned char *p = CMSG_DATA(c);
        for (size_t i = 0; i < k; i++) {
            int fd;
            memcpy(&fd, p + i * sizeof(int), sizeof fd);
            if (got < maxfds)
                fds[got++] = fd;
            else {
                close(fd); /* cannot happen with our buffer sizing; defensive */
                extra++;
            }
        }
    }
    if ((msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) || extra) {
        for (int i = 0; i < got; i++)
            close(fds[i]);
        return -EMSGSIZE;
    }
    *nfds = got;
    return (int)n;
}
