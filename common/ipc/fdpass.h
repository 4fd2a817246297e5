/* fdpass.h: send and receive file descriptors with a small payload over a unix socket
 * (SCM_RIGHTS). This is how arena and segment fds travel from the orchestrator's fd store
 * to each worker (re)start, and from a GPU arena's creator back to the orchestrator.
 *
 * One call = one message on SOCK_SEQPACKET / SOCK_DGRAM sockets (recommended). On
 * SOCK_STREAM the payload may arrive split across calls (the caller frames it); the fds
 * always arrive with the first byte. The payload must be at least 1 byte (a stream
 * socket cannot carry fds without data).
 *
 * Received fds are close-on-exec (MSG_CMSG_CLOEXEC) and owned by the caller. A message
 * whose fds or payload did not fit (control data or data truncated) is an error, and
 * every fd that did arrive with it is closed, so a failed receive never leaks fds.
 */
#ifndef DF_FDPASS_H
#define DF_FDPASS_H

#include <stddef.h>

#define FDPASS_MAX_FDS 64

/* Send len (>= 1) bytes of buf plus nfds (0..FDPASS_MAX_FDS) fds. Restarts on EINTR and
 * short sends; never raises SIGPIPE (-EPIPE instead). The caller keeps its fds.
 * Returns 0 or -errno (-EINVAL for bad arguments). */
int fdpass_send(int sock, const void *buf, size_t len, const int *fds, int nfds);

/* Receive one message: up to cap bytes into buf and up to maxfds (<= FDPASS_MAX_FDS)
 * fds into fds[], their count in *nfds. Restarts on EINTR.
 * Returns the number of payload bytes, 0 when the peer closed (no fds), or -errno:
 *   -EMSGSIZE  more fds than maxfds were sent (control data truncated), or the payload
 *              was longer than cap (datagram/seqpacket); all fds received are closed.
 *   -EAGAIN    non-blocking socket with nothing to read. */
int fdpass_recv(int sock, void *buf, size_t cap, int *fds, int maxfds, int *nfds);

#endif
