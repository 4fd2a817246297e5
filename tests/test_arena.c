/* test_arena: CPU arenas outlive their creator, importers share memory, fds travel intact.
 *
 *   1. A child creates a 64 MiB CPU arena, fills it with a df_rng pattern, sends its fd to
 *      the parent (the orchestrator's fd-store role) and is SIGKILLed. A NEW program image
 *      (fork + exec of this binary with --verify-child) receives the fd over a socket,
 *      imports it and checks the checksum, then writes a marker the parent sees.
 *   2. Two live importers (separate processes, each importing from an fd received over a
 *      socket) see each other's writes.
 *   3. Errors: bad fd, size mismatch (fd consumed, no leak), non-memfd fd, zero size, busy
 *      arena, sealed size, ARENA_CUDA without CUDA; shm_create/shm_import.
 *   4. fdpass: several fds, 64 fds, a truncated control message (too many fds), a truncated
 *      payload, peer close, EINTR during a blocked receive; no fd leaks anywhere.
 */
#include "ipc/arena.h"
#include "ipc/fdpass.h"
#include "ipc/shm.h"
#include "util.h"
#include "test_helpers.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

static char e2[512]; /* the arena_ calls' error message (this test is one thread) */

#define BIG_BYTES (64ull << 20)
#define MARKER 0x564552494649454Dull /* "VERIFIEM" */

typedef struct hello_msg {
    uint64_t size, seed, checksum;
} hello_msg;

static const char *self_exe;

static void fill_pattern(void *base, uint64_t size, uint64_t seed)
{
    df_rng r;
    df_rng_seed(&r, seed);
    uint64_t *w = base;
    for (uint64_t i = 0; i < size / 8; i++)
        w[i] = df_rng_next(&r);
}

/* Offset of the first 8-byte word in [0, limit) that differs from the pattern, or limit. */
static uint64_t pattern_first_diff(const void *base, uint64_t limit, uint64_t seed)
{
    df_rng r;
    df_rng_seed(&r, seed);
    const uint64_t *w = base;
    for (uint64_t i = 0; i < limit / 8; i++)
        if (w[i] != df_rng_next(&r))
            return i * 8;
    return limit;
}

static int count_open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    T_ASSERT(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

static int fd_is_open(int fd)
{
    return fcntl(fd, F_GETFD) >= 0;
}

static void wait_exit0(pid_t pid, const char *what)
{
    int st;
    T_ASSERT(waitpid(pid, &st, 0) == pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "%s: child %d ended with status 0x%x\n", what, (int)pid, st);
        exit(1);
    }
}

/* --verify-child <sockfd>: the freshly exec'd importer of test 1. */
static int verify_child(int sock)
{
    hello_msg m;
    int fd, nfds;
    int n = fdpass_recv(sock, &m, sizeof m, &fd, 1, &nfds);
    if (n != (int)sizeof m || nfds != 1) {
        fprintf(stderr, "verify-child: fdpass_recv returned %d with %d fds\n", n, nfds);
        return 1;
    }
    arena a;
    arena_init(&a);
    int rc = arena_import(&a, ARENA_CPU, -1, fd, m.size, e2, sizeof e2);
    if (rc < 0) {
        fprintf(stderr, "verify-child: arena_import: %s\n", e2);
        return 1;
    }
    uint64_t sum = df_fnv1a64(a.base, a.size, 0);
    if (sum != m.checksum) {
        fprintf(stderr, "verify-child: checksum %016llx != creator's %016llx; first bad offset %llu\n",
                (unsigned long long)sum, (unsigned long long)m.checksum,
                (unsigned long long)pattern_first_diff(a.base, a.size, m.seed));
        return 1;
    }
    ((uint64_t *)a.base)[a.size / 8 - 1] = MARKER;
    printf("verify-child pid %d: imported %llu bytes, checksum %016llx intact\n", (int)getpid(),
           (unsigned long long)a.size, (unsigned long long)sum);
    arena_close(&a);
    return 0;
}

static void test_survives_sigkill(void)
{
    int sv[2];
    T_ASSERT(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
    const uint64_t seed = 0xA5E4A;
    pid_t creator = fork();
    T_ASSERT(creator >= 0);
    if (creator == 0) {
        close(sv[0]);
        arena a;
        arena_init(&a);
        T_ASSERT_RC(arena_create(&a, ARENA_CPU, -1, BIG_BYTES, "test-arena-big", e2, sizeof e2));
        fill_pattern(a.base, a.size, seed);
        hello_msg m = {a.size, seed, df_fnv1a64(a.base, a.size, 0)};
        int fd = arena_dup_fd(&a, e2, sizeof e2);
        T_ASSERT_RC(fd);
        T_ASSERT_RC(fdpass_send(sv[1], &m, sizeof m, &fd, 1));
        close(fd);
        for (;;)
            pause(); /* hold the arena until SIGKILLed */
    }
    close(sv[1]);
    hello_msg m;
    int fd = -1, nfds = 0;
    T_ASSERT(fdpass_recv(sv[0], &m, sizeof m, &fd, 1, &nfds) == (int)sizeof m);
    T_ASSERT(nfds == 1 && m.size == BIG_BYTES);
    close(sv[0]);
    T_ASSERT(kill(creator, SIGKILL) == 0);
    int st;
    T_ASSERT(waitpid(creator, &st, 0) == creator);
    T_ASSERT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    printf("creator %d SIGKILLed; parent holds only fd %d (never mapped)\n", (int)creator, fd);

    /* A new program image imports from an fd received over a fresh socket. */
    T_ASSERT(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
    pid_t verifier = fork();
    T_ASSERT(verifier >= 0);
    if (verifier == 0) {
        close(sv[0]);
        close(fd);
        int flags = fcntl(sv[1], F_GETFD);
        if (flags < 0 || fcntl(sv[1], F_SETFD, flags & ~FD_CLOEXEC) < 0)
            _exit(120);
        char num[16];
        snprintf(num, sizeof num, "%d", sv[1]);
        execl(self_exe, self_exe, "--verify-child", num, (char *)NULL);
        perror("execl");
        _exit(121);
    }
    close(sv[1]);
    T_ASSERT_RC(fdpass_send(sv[0], &m, sizeof m, &fd, 1));
    close(sv[0]);
    wait_exit0(verifier, "verify-child");

    /* The parent maps it last: the verifier's marker is there, the pattern is intact. */
    arena a;
    arena_init(&a);
    T_ASSERT_RC(arena_import(&a, ARENA_CPU, -1, fd, m.size, e2, sizeof e2));
    T_ASSERT(((uint64_t *)a.base)[a.size / 8 - 1] == MARKER);
    T_ASSERT(pattern_first_diff(a.base, a.size - 8, seed) == a.size - 8);
    arena_close(&a);
    T_ASSERT(a.fd == -1 && a.base == NULL);
    printf("ok: 64 MiB CPU arena survived its creator's SIGKILL; exec'd importer verified it\n");
}

/* Test 2: importer `role` (0/1) writes a block and a flag, waits for the other's. */
static int live_importer(int sock, int role)
{
    uint64_t size;
    int fd, nfds;
    if (fdpass_recv(sock, &size, sizeof size, &fd, 1, &nfds) != (int)sizeof size || nfds != 1)
        return 10;
    arena a;
    arena_init(&a);
    if (arena_import(&a, ARENA_CPU, -1, fd, size, e2, sizeof e2) < 0)
        return 11;
    char *base = a.base;
    _Atomic uint64_t *flag_mine = (_Atomic uint64_t *)(base + role * DF_CACHELINE);
    _Atomic uint64_t *flag_other = (_Atomic uint64_t *)(base + (1 - role) * DF_CACHELINE);
    char *mine = base + 4096 + (size_t)role * 65536, *other = base + 4096 + (size_t)(1 - role) * 65536;
    fill_pattern(mine, 65536, 100 + role);
    /* release: the block above is visible to whoever acquires the flag */
    atomic_store_explicit(flag_mine, 1000 + role, memory_order_release);
    uint64_t deadline = df_now_ns() + 20ull * 1000000000ull; /* a hang guard, not a timing check */
    while (atomic_load_explicit(flag_other, memory_order_acquire) != 1000u + (1 - role)) {
        if (df_now_ns() > deadline)
            return 12;
        usleep(100);
    }
    if (pattern_first_diff(other, 65536, 100 + (1 - role)) != 65536)
        return 13;
    arena_close(&a);
    return 0;
}

static void test_two_live_importers(void)
{
    int sv[2][2];
    pid_t pid[2];
    for (int r = 0; r < 2; r++) {
        T_ASSERT(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv[r]) == 0);
        pid[r] = fork(); /* forked before the arena exists: they can only import it */
        T_ASSERT(pid[r] >= 0);
        if (pid[r] == 0)
            _exit(live_importer(sv[r][1], r));
        close(sv[r][1]);
    }
    arena a;
    arena_init(&a);
    T_ASSERT_RC(arena_create(&a, ARENA_CPU, -1, 1 << 20, "test-arena-live", e2, sizeof e2));
    for (int r = 0; r < 2; r++) {
        int fd = arena_dup_fd(&a, e2, sizeof e2);
        T_ASSERT_RC(fd);
        uint64_t size = a.size;
        T_ASSERT_RC(fdpass_send(sv[r][0], &size, sizeof size, &fd, 1));
        close(fd);
        close(sv[r][0]);
    }
    wait_exit0(pid[0], "importer 0");
    wait_exit0(pid[1], "importer 1");
    char *base = a.base;
    T_ASSERT(pattern_first_diff(base + 4096, 65536, 100) == 65536);
    T_ASSERT(pattern_first_diff(base + 4096 + 65536, 65536, 101) == 65536);
    arena_close(&a);
    printf("ok: two live importers saw each other's writes (and the creator saw both)\n");
}

static void test_errors(void)
{
    int fds_before = count_open_fds();
    arena a, b;
    arena_init(&a);
    arena_init(&b);
    T_ASSERT(arena_import(&a, ARENA_CPU, -1, -1, 4096, e2, sizeof e2) == -EBADF);
    T_ASSERT(arena_create(&a, ARENA_CPU, -1, 0, "zero", e2, sizeof e2) == -EINVAL);
    T_ASSERT(arena_create(&a, (arena_kind)7, -1, 4096, "kind", e2, sizeof e2) == -EINVAL);
    T_ASSERT(arena_dup_fd(&a, e2, sizeof e2) == -EBADF);
    T_ASSERT(arena_grant_access(&a, 0, e2, sizeof e2) == -EINVAL);

    T_ASSERT_RC(arena_create(&a, ARENA_CPU, -1, 8192, "test-arena-err", e2, sizeof e2));
    T_ASSERT(arena_create(&a, ARENA_CPU, -1, 8192, "again", e2, sizeof e2) == -EBUSY);
    /* size mismatch: -EINVAL, the message names both sizes, the fd was consumed */
    int fd = arena_dup_fd(&a, e2, sizeof e2);
    T_ASSERT_RC(fd);
    T_ASSERT(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    int rc = arena_import(&b, ARENA_CPU, -1, fd, 4096, e2, sizeof e2);
    T_ASSERT(rc == -EINVAL);
    printf("size mismatch reads: %s\n", e2);
    T_ASSERT(strstr(e2, "8192 bytes, expected 4096"));
    T_ASSERT(!fd_is_open(fd));
    T_ASSERT(b.fd == -1 && b.base == NULL);
    /* the size is sealed: no holder can shrink it under another's mapping */
    fd = arena_dup_fd(&a, e2, sizeof e2);
    T_ASSERT(ftruncate(fd, 4096) < 0 && errno == EPERM);
    close(fd);
    /* a pipe is not an arena */
    int p[2];
    T_ASSERT(pipe(p) == 0);
    T_ASSERT(arena_import(&b, ARENA_CPU, -1, p[0], 4096, e2, sizeof e2) == -EINVAL);
    T_ASSERT(!fd_is_open(p[0]));
    close(p[1]);
    T_ASSERT(arena_grant_access(&a, 0, e2, sizeof e2) == -EINVAL);
    arena_close(&a);
    arena_close(&a); /* idempotent */

    /* ARENA_CUDA: -ENOTSUP without CUDA (a CUDA build: in a child, as CUDA opens fds) */
#ifndef DF_WITH_CUDA
    rc = arena_create(&a, ARENA_CUDA, 0, 1 << 20, "cuda", e2, sizeof e2);
    T_ASSERT(rc == -ENOTSUP);
    T_ASSERT(strstr(e2, "CUDA=1"));
    fd = memfd_create("x", MFD_CLOEXEC);
    T_ASSERT(fd >= 0);
    T_ASSERT(arena_import(&a, ARENA_CUDA, 0, fd, 4096, e2, sizeof e2) == -ENOTSUP);
    T_ASSERT(!fd_is_open(fd));
#endif
    arena_close(&a);

    /* shm: zero-filled, size from the fd, shared */
    T_ASSERT_RC(shm_create(&a, 3 * 4096 + 17, "test-shm"));
    for (uint64_t i = 0; i < a.size; i++)
        T_ASSERT(((unsigned char *)a.base)[i] == 0);
    fd = arena_dup_fd(&a, e2, sizeof e2);
    T_ASSERT_RC(shm_import(&b, fd));
    T_ASSERT(b.size == 3 * 4096 + 17 && b.base != a.base);
    ((volatile char *)b.base)[a.size - 1] = 42;
    T_ASSERT(((volatile char *)a.base)[a.size - 1] == 42);
    arena_close(&b);
    arena_close(&a);
    T_ASSERT(shm_import(&a, -1) == -EBADF);
    fd = memfd_create("empty", MFD_CLOEXEC);
    T_ASSERT(shm_import(&a, fd) == -EINVAL && !fd_is_open(fd));

    T_ASSERT(count_open_fds() == fds_before);
#ifdef DF_WITH_CUDA
    pid_t pid = fork();
    T_ASSERT(pid >= 0);
    if (pid == 0) {
        rc = arena_create(&a, ARENA_CUDA, 0, 1 << 20, "cuda", e2, sizeof e2);
        printf("ARENA_CUDA create in a CUDA build: %s\n", e2);
        arena_close(&a);
        _exit(0);
    }
    wait_exit0(pid, "CUDA probe");
#endif
    printf("ok: arena errors (bad fd, size mismatch, pipe, zero, busy, seal, CUDA seam, shm)\n");
}

static int memfd_with(const char *text)
{
    int fd = memfd_create("fdpass-test", MFD_CLOEXEC);
    T_ASSERT(fd >= 0);
    T_ASSERT_RC(df_write_all(fd, text, strlen(text)));
    return fd;
}

static void expect_content(int fd, const char *text)
{
    char buf[64] = {0};
    T_ASSERT(pread(fd, buf, sizeof buf - 1, 0) == (ssize_t)strlen(text));
    T_ASSERT_STREQ(buf, text);
}

static volatile sig_atomic_t alarms;
static void on_alarm(int sig)
{
    (void)sig;
    alarms++;
}

static void test_fdpass(void)
{
    int fds_before = count_open_fds();
    int sv[2];
    T_ASSERT(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);

    /* several fds, each arrives as the right file, close-on-exec */
    int out[5], in[FDPASS_MAX_FDS], n = 0;
    char name[5][16];
    for (int i = 0; i < 5; i++) {
        snprintf(name[i], sizeof name[i], "file-%d", i);
        out[i] = memfd_with(name[i]);
    }
    T_ASSERT_RC(fdpass_send(sv[0], "hello", 5, out, 5));
    char buf[128];
    T_ASSERT(fdpass_recv(sv[1], buf, sizeof buf, in, FDPASS_MAX_FDS, &n) == 5);
    T_ASSERT(n == 5 && memcmp(buf, "hello", 5) == 0);
    for (int i = 0; i < 5; i++) {
        T_ASSERT(in[i] != out[i]);
        expect_content(in[i], name[i]);
        T_ASSERT(fcntl(in[i], F_GETFD) & FD_CLOEXEC);
        close(in[i]);
    }

    /* 64 fds is the limit; 65 is refused before sending */
    int many[FDPASS_MAX_FDS + 1];
    for (int i = 0; i <= FDPASS_MAX_FDS; i++)
        many[i] = out[i % 5];
    T_ASSERT(fdpass_send(sv[0], "x", 1, many, FDPASS_MAX_FDS + 1) == -EINVAL);
    T_ASSERT_RC(fdpass_send(sv[0], "m", 1, many, FDPASS_MAX_FDS));
    T_ASSERT(fdpass_recv(sv[1], buf, sizeof buf, in, FDPASS_MAX_FDS, &n) == 1 && n == FDPASS_MAX_FDS);
    for (int i = 0; i < n; i++) {
        expect_content(in[i], name[i % 5]);
        close(in[i]);
    }

    /* more fds than the receiver takes: truncated control data, nothing leaks */
    int before = count_open_fds();
    T_ASSERT_RC(fdpass_send(sv[0], "t", 1, out, 5));
    n = -1;
    T_ASSERT(fdpass_recv(sv[1], buf, sizeof buf, in, 2, &n) == -EMSGSIZE);
    T_ASSERT(n == 0 && count_open_fds() == before);
    /* a raw sender exceeding FDPASS_MAX_FDS (100 fds) */
    {
        int raw[100];
        for (int i = 0; i < 100; i++)
            raw[i] = out[i % 5];
        union {
            char b[CMSG_SPACE(sizeof raw)];
            struct cmsghdr al;
        } cb;
        memset(&cb, 0, sizeof cb);
        struct iovec iov = {.iov_base = "r", .iov_len = 1};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b, .msg_controllen = sizeof cb.b};
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof raw);
        memcpy(CMSG_DATA(c), raw, sizeof raw);
        T_ASSERT(sendmsg(sv[0], &msg, 0) == 1);
        T_ASSERT(fdpass_recv(sv[1], buf, sizeof buf, in, FDPASS_MAX_FDS, &n) == -EMSGSIZE);
        T_ASSERT(count_open_fds() == before);
    }
    /* a payload longer than the buffer: truncated data is an error too, fds closed */
    char big[100];
    memset(big, 'b', sizeof big);
    T_ASSERT_RC(fdpass_send(sv[0], big, sizeof big, out, 2));
    T_ASSERT(fdpass_recv(sv[1], buf, 10, in, 4, &n) == -EMSGSIZE);
    T_ASSERT(count_open_fds() == before);
    /* no fds at all is fine; bad arguments are -EINVAL */
    T_ASSERT_RC(fdpass_send(sv[0], "plain", 5, NULL, 0));
    T_ASSERT(fdpass_recv(sv[1], buf, sizeof buf, in, 4, &n) == 5 && n == 0);
    T_ASSERT(fdpass_send(sv[0], "", 0, out, 1) == -EINVAL);
    T_ASSERT(fdpass_recv(sv[1], buf, sizeof buf, in, FDPASS_MAX_FDS + 1, &n) == -EINVAL);

    /* EINTR: a signal without SA_RESTART interrupts the blocked receive; it retries */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm; /* no SA_RESTART */
    T_ASSERT(sigaction(SIGALRM, &sa, NULL) == 0);
    struct itimerval it = {{0, 5000}, {0, 5000}};
    T_ASSERT(setitimer(ITIMER_REAL, &it, NULL) == 0);
    pid_t late = fork();
    T_ASSERT(late >= 0);
    if (late == 0) {
        usleep(200 * 1000);
        _exit(fdpass_send(sv[0], "late", 4, out, 1) == 0 ? 0 : 1);
    }
    T_ASSERT(fdpass_recv(sv[1], buf, sizeof buf, in, 4, &n) == 4 && n == 1);
    memset(&it, 0, sizeof it);
    T_ASSERT(setitimer(ITIMER_REAL, &it, NULL) == 0);
    expect_content(in[0], name[0]);
    close(in[0]);
    wait_exit0(late, "late sender");
    printf("EINTR check: %d SIGALRMs arrived during the blocked receive\n", (int)alarms);

    /* stream socket: fds arrive with the payload */
    int st[2];
    T_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, st) == 0);
    T_ASSERT_RC(fdpass_send(st[0], "stream", 6, out + 3, 2));
    T_ASSERT(fdpass_recv(st[1], buf, sizeof buf, in, 4, &n) == 6 && n == 2);
    expect_content(in[0], name[3]);
    expect_content(in[1], name[4]);
    close(in[0]);
    close(in[1]);
    close(st[0]);
    close(st[1]);

    /* peer closed: 0 */
    close(sv[0]);
    T_ASSERT(fdpass_recv(sv[1], buf, sizeof buf, in, 4, &n) == 0 && n == 0);
    close(sv[1]);
    for (int i = 0; i < 5; i++)
        close(out[i]);
    T_ASSERT(count_open_fds() == fds_before);
    printf("ok: fdpass of 5 and 64 fds, truncated control/payload rejected without leaks, EINTR, "
           "stream, peer close\n");
}

int main(int argc, char **argv)
{
    self_exe = "/proc/self/exe";
    setvbuf(stdout, NULL, _IOLBF, 0); /* children and exec'd images share stdout */
    if (argc == 3 && strcmp(argv[1], "--verify-child") == 0)
        return verify_child(atoi(argv[2]));
    if (argc > 1) {
        printf("usage: %s            run the arena/fdpass tests\n"
               "       %s --verify-child SOCKFD   (internal) import the arena sent on SOCKFD\n",
               argv[0], argv[0]);
        return strcmp(argv[1], "--help") == 0 ? 0 : 2;
    }
    test_errors();
    test_fdpass();
    test_two_live_importers();
    test_survives_sigkill();
    printf("test_arena: all passed\n");
    return 0;
}
