/* gpu_test_arena: a CUDA VMM arena survives its creator's SIGKILL (CUDA=1 builds, GPU).
 *
 * The parent plays the orchestrator: it never initialises CUDA and only holds fds.
 *   1. A creator child makes a 64 MiB ARENA_CUDA arena on device 0, copies a df_rng pattern
 *      into it (cuMemcpyHtoD), synchronises, sends the fd + checksum to the parent and
 *      waits; the parent SIGKILLs it.
 *   2. A new program image (fork + exec --verify) imports the fd, cuMemcpyDtoH, checks the
 *      checksum, then writes a marker into the last 16 bytes (cuMemsetD32) and exits.
 *   3. A second exec'd image first tries an import with the wrong size (must fail with the
 *      CUDA error text in the err message), then imports properly and checks pattern+marker.
 * No GPU (cuInit fails or no device): prints SKIPPED and exits 77.
 */
#include "ipc/arena.h"
#include "ipc/fdpass.h"
#include "util.h"
#include "test_helpers.h"

#include <cuda.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static char e2[512]; /* the arena_ calls' error message (this test is one thread) */

#define BYTES (64ull << 20)
#define SEED 0xC0DAull
#define MARKER 0x4D41524Bu /* "MARK" */

typedef struct gmsg {
    uint64_t size;     /* 0: no usable GPU, skip */
    uint64_t checksum; /* fnv1a64 of the pattern */
    char why[200];     /* skip reason */
} gmsg;

#define CU_OK(call)                                                                               \
    do {                                                                                          \
        CUresult r_ = (call);                                                                     \
        if (r_ != CUDA_SUCCESS) {                                                                 \
            const char *s_ = "?";                                                                 \
            cuGetErrorString(r_, &s_);                                                            \
            fprintf(stderr, "%s:%d: %s failed: %d %s\n", __FILE__, __LINE__, #call, (int)r_, s_); \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

static void fill_pattern(uint64_t *w, uint64_t n)
{
    df_rng r;
    df_rng_seed(&r, SEED);
    for (uint64_t i = 0; i < n; i++)
        w[i] = df_rng_next(&r);
}

/* Make device 0's primary context current (the arena uses the same one). */
static void use_device0(void)
{
    CUdevice dev;
    CUcontext ctx;
    CU_OK(cuInit(0));
    CU_OK(cuDeviceGet(&dev, 0));
    CU_OK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU_OK(cuCtxSetCurrent(ctx));
}

static void creator(int sock)
{
    gmsg m;
    memset(&m, 0, sizeof m);
    int ndev = 0;
    CUresult r = cuInit(0);
    if (r == CUDA_SUCCESS)
        r = cuDeviceGetCount(&ndev);
    if (r != CUDA_SUCCESS || ndev == 0) {
        const char *s = "no error";
        cuGetErrorString(r, &s);
        snprintf(m.why, sizeof m.why, "no CUDA device (cuInit/cuDeviceGetCount: %s, %d devices)", s, ndev);
        fdpass_send(sock, &m, sizeof m, NULL, 0);
        _exit(77);
    }
    /* a bad device ordinal fails cleanly with the CUDA error text */
    arena a;
    arena_init(&a);
    int rc = arena_create(&a, ARENA_CUDA, 9999, BYTES, "bad-device", e2, sizeof e2);
    T_ASSERT(rc < 0);
    printf("creator: ARENA_CUDA on device 9999: %s\n", e2);
    T_ASSERT(strstr(e2, "CUDA_ERROR"));

    T_ASSERT_RC(arena_create(&a, ARENA_CUDA, 0, BYTES, "gpu-arena", e2, sizeof e2));
    T_ASSERT(a.size >= BYTES && a.fd >= 0 && a.base != NULL);
    printf("creator pid %d: ARENA_CUDA %llu bytes at 0x%llx, fd %d\n", (int)getpid(), (unsigned long long)a.size,
           (unsigned long long)(uintptr_t)a.base, a.fd);
    uint64_t *host = malloc(a.size);
    T_ASSERT(host);
    fill_pattern(host, a.size / 8);
    use_device0();
    CU_OK(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)a.base, host, a.size));
    CU_OK(cuCtxSynchronize()); /* the data is in device memory before the fd leaves */
    m.size = a.size;
    m.checksum = df_fnv1a64(host, a.size, 0);
    free(host);
    int fd = arena_dup_fd(&a, e2, sizeof e2);
    T_ASSERT_RC(fd);
    T_ASSERT_RC(fdpass_send(sock, &m, sizeof m, &fd, 1));
    close(fd);
    for (;;)
        pause(); /* SIGKILLed here, arena still mapped */
}

static int verify(int sock, int stage)
{
    gmsg m;
    int fds[2], nfds = 0;
    int n = fdpass_recv(sock, &m, sizeof m, fds, 2, &nfds);
    T_ASSERT(n == (int)sizeof m && nfds == (stage == 1 ? 1 : 2));
    arena a;
    arena_init(&a);
    if (stage == 2) {
        /* wrong size: twice the real one cannot be mapped from this allocation */
        int rc = arena_import(&a, ARENA_CUDA, 0, fds[1], m.size * 2, e2, sizeof e2);
        printf("verify-2: import with the wrong size: %s\n", e2);
        T_ASSERT(rc < 0 && a.base == NULL);
        T_ASSERT(strstr(e2, "CUDA_ERROR"));   /* the driver's text reaches us */
        T_ASSERT(fcntl(fds[1], F_GETFD) < 0); /* consumed */
    }
    int rc = arena_import(&a, ARENA_CUDA, 0, fds[0], m.size, e2, sizeof e2);
    if (rc < 0) {
        fprintf(stderr, "verify-%d: arena_import: %s\n", stage, e2);
        return 1;
    }
    T_ASSERT(a.size == m.size);
    use_device0();
    uint64_t *host = malloc(a.size);
    T_ASSERT(host);
    CU_OK(cuMemcpyDtoH(host, (CUdeviceptr)(uintptr_t)a.base, a.size));
    uint64_t nw = a.size / 8;
    if (stage == 1) {
        uint64_t sum = df_fnv1a64(host, a.size, 0);
        if (sum != m.checksum) {
            fprintf(stderr, "verify-1: checksum %016llx != creator's %016llx\n", (unsigned long long)sum,
                    (unsigned long long)m.checksum);
            return 1;
        }
        /* leave a marker for the next importer: last 4 uint32 words */
        CU_OK(cuMemsetD32((CUdeviceptr)(uintptr_t)a.base + a.size - 16, MARKER, 4));
        CU_OK(cuCtxSynchronize());
        printf("verify-1 pid %d: %llu bytes intact after the creator's SIGKILL\n", (int)getpid(),
               (unsigned long long)a.size);
    } else {
        uint64_t *expect = malloc(a.size);
        T_ASSERT(expect);
        fill_pattern(expect, nw);
        for (uint64_t i = 0; i + 2 < nw; i++)
            if (host[i] != expect[i]) {
                fprintf(stderr, "verify-2: word %llu (byte offset %llu) differs\n", (unsigned long long)i,
                        (unsigned long long)i * 8);
                return 1;
            }
        const uint32_t *tail = (const uint32_t *)(host + nw - 2);
        for (int i = 0; i < 4; i++)
            T_ASSERT(tail[i] == MARKER);
        free(expect);
        printf("verify-2 pid %d: pattern and verify-1's marker present\n", (int)getpid());
    }
    free(host);
    arena_close(&a);
    return 0;
}

/* fork + exec this binary as "--verify STAGE SOCKFD", send it the fd(s), wait for exit 0. */
static void run_verifier(int stage, const gmsg *m, int arena_fd)
{
    int sv[2];
    T_ASSERT(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
    pid_t pid = fork();
    T_ASSERT(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        if (fcntl(sv[1], F_SETFD, 0) < 0)
            _exit(120);
        char st[8], fd[16];
        snprintf(st, sizeof st, "%d", stage);
        snprintf(fd, sizeof fd, "%d", sv[1]);
        execl("/proc/self/exe", "gpu_test_arena", "--verify", st, fd, (char *)NULL);
        _exit(121);
    }
    close(sv[1]);
    int fds[2] = {arena_fd, arena_fd};
    T_ASSERT_RC(fdpass_send(sv[0], m, sizeof *m, fds, stage == 1 ? 1 : 2));
    close(sv[0]);
    int status;
    T_ASSERT(waitpid(pid, &status, 0) == pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "verifier %d failed (status 0x%x)\n", stage, status);
        exit(1);
    }
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 4 && strcmp(argv[1], "--verify") == 0)
        return verify(atoi(argv[3]), atoi(argv[2]));
    if (argc > 1) {
        printf("usage: %s    (CUDA VMM arena survives its creator's SIGKILL; needs a GPU)\n", argv[0]);
        return strcmp(argv[1], "--help") == 0 ? 0 : 2;
    }
    int sv[2];
    T_ASSERT(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
    pid_t pid = fork();
    T_ASSERT(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        creator(sv[1]);
    }
    close(sv[1]);
    gmsg m;
    int fd = -1, nfds = 0;
    int n = fdpass_recv(sv[0], &m, sizeof m, &fd, 1, &nfds);
    if (n == (int)sizeof m && m.size == 0) {
        waitpid(pid, NULL, 0);
        T_SKIP("%s", m.why);
    }
    if (n != (int)sizeof m || nfds != 1) {
        fprintf(stderr, "creator sent nothing usable (recv %d, %d fds)\n", n, nfds);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return 1;
    }
    close(sv[0]);
    T_ASSERT(kill(pid, SIGKILL) == 0);
    int st;
    T_ASSERT(waitpid(pid, &st, 0) == pid && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    printf("creator %d SIGKILLed; the parent (no CUDA) holds fd %d\n", (int)pid, fd);
    run_verifier(1, &m, fd);
    run_verifier(2, &m, fd);
    close(fd);
    printf("ok: CUDA VMM arena survived its creator's SIGKILL; two exec'd importers verified it\n");
    return 0;
}
