/* gpu_test_allreduce: the NCCL all-reduce backend with one process per GPU present
 * (world = number of GPUs, at most 8; 1 GPU = world 1 still runs init and reductions).
 * CUDA=1 builds; no GPU: prints SKIPPED and exits 77.
 *
 * The parent plays the orchestrator: it never initialises CUDA (a probe child counts the
 * GPUs), receives the 128-byte unique id from rank 0 and hands it to every other rank over
 * a socket, then collects checksums. Each rank, on device = rank:
 *   exact     integer-valued inputs (sums exact in any order): result == host reference
 *             bit for bit, n = 1 and n = 2^20 + 3
 *   repeat    random inputs spanning 2^-20..2^20, reduced twice: bit-identical both times,
 *             within 1e-5 relative of the host rank-order reference, and the same
 *             checksum on every rank (checked by the parent)
 *   bucketed  the same inputs copied in on a caller stream (cudaMemcpyAsync) and reduced
 *             as 5 buckets in reverse order: within tolerance of the single reduction and
 *             bit-identical when repeated (the bucket layout fixes NCCL's order)
 *   timeout   world >= 2: the last rank dies (SIGKILL) without reducing; the others get
 *             -ETIMEDOUT within a 5 s timeout (ncclCommAbort), and again on the next call
 *   init timeout  (any GPU count) a world-2 communicator whose rank 1 never comes:
 *             allreduce_open_nccl_ex gives -ETIMEDOUT at its 3 s deadline, no hang
 */
#include "gpu_test_check.h"

#include "ipc/allreduce.h"
#include "ipc/fdpass.h"
#include "util.h"
#include "test_helpers.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static char e2[512]; /* the allreduce_ calls' error message (one thread per process) */

#define MAX_WORLD 8
#define N_BIG ((1u << 20) + 3)
#define SEED 0xA11ED0CEull

typedef struct rank_report {
    uint64_t cks_repeat, cks_bucket;
} rank_report;

#define ALLREDUCE_OK(call)                                                     \
    do {                                                                       \
        int r_ = (call);                                                       \
        if (r_ != 0) {                                                         \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, e2); \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

static void fill_random(float *x, size_t n, int rank)
{
    df_rng r;
    df_rng_seed(&r, SEED * 1000 + (uint64_t)rank);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)ldexp(df_rng_normal(&r), (int)df_rng_below(&r, 41) - 20);
}

static float exact_value(size_t i, int rank)
{
    return (float)((int)((i * 7 + (size_t)rank * 13) % 1000) - 500);
}

/* max |got - ref| / (sum over ranks of |x|) must stay under 1e-5 */
static void check_close(const float *got, const float *ref, const float *mag, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        double tol = 1e-5 * (double)mag[i] + 1e-30;
        if (fabs((double)got[i] - (double)ref[i]) > tol) {
            fprintf(stderr, "%s: element %zu: %.9g vs reference %.9g (tolerance %.3g)\n", what, i, got[i], ref[i], tol);
            exit(1);
        }
    }
}

static int rank_main(int rank, int world, int sock)
{
    unsigned char id[128];
    if (rank == 0) {
        ALLREDUCE_OK(allreduce_nccl_get_unique_id(id, e2, sizeof e2));
        T_ASSERT(fdpass_send(sock, id, sizeof id, NULL, 0) >= 0);
    }
    int nfd = 0;
    T_ASSERT(fdpass_recv(sock, id, sizeof id, NULL, 0, &nfd) == (int)sizeof id);
    allreduce_comm c;
    allreduce_comm_init(&c);
    ALLREDUCE_OK(
        allreduce_open_nccl_ex(&c, id, rank, world, rank, ALLREDUCE_DETERMINISTIC, 60ll * 1000000000ll, e2, sizeof e2));
    c.timeout_ns = 60ll * 1000000000ll;
    const char *algo = getenv("NCCL_ALGO"), *nvls = getenv("NCCL_NVLS_ENABLE");
    T_ASSERT(algo && strcmp(algo, "Ring") == 0 && nvls && strcmp(nvls, "0") == 0);

    size_t bytes = N_BIG * sizeof(float);
    float *h_in, *h_out = malloc(bytes), *h_ref = malloc(bytes), *h_mag = malloc(bytes);
    float *h_one = malloc(bytes), *tmp = malloc(bytes);
    CUDA_CHECK(cudaMallocHost((void **)&h_in, bytes));
    float *d_buf;
    CUDA_CHECK(cudaMalloc((void **)&d_buf, bytes));
    T_ASSERT(h_out && h_ref && h_mag && h_one && tmp);

    /* exact */
    size_t sizes[2] = {1, N_BIG};
    for (int k = 0; k < 2; k++) {
        size_t n = sizes[k];
        for (size_t i = 0; i < n; i++) {
            h_in[i] = exact_value(i, rank);
            float s = 0;
            for (int r = 0; r < world; r++)
                s += exact_value(i, r);
            h_ref[i] = s;
        }
        CUDA_CHECK(cudaMemcpy(d_buf, h_in, n * sizeof(float), cudaMemcpyHostToDevice));
        ALLREDUCE_OK(allreduce_sum(&c, d_buf, n, 30ll * 1000000000ll, e2, sizeof e2));
        CUDA_CHECK(cudaMemcpy(h_out, d_buf, n * sizeof(float), cudaMemcpyDeviceToHost));
        T_ASSERT(memcmp(h_out, h_ref, n * sizeof(float)) == 0);
    }
    printf("rank %d: exact: n=1 and n=%u integer sums bit-exact\n", rank, N_BIG);

    /* repeat: host reference in rank order, and the magnitude for the tolerance */
    for (int r = 0; r < world; r++) {
        fill_random(r == 0 ? h_ref : tmp, N_BIG, r);
        for (size_t i = 0; i < N_BIG; i++) {
            if (r == 0)
                h_mag[i] = fabsf(h_ref[i]);
            else {
                h_ref[i] += tmp[i];
                h_mag[i] += fabsf(tmp[i]);
            }
        }
    }
    fill_random(h_in, N_BIG, rank);
    for (int rep = 0; rep < 2; rep++) {
        CUDA_CHECK(cudaMemcpy(d_buf, h_in, bytes, cudaMemcpyHostToDevice));
        ALLREDUCE_OK(allreduce_sum(&c, d_buf, N_BIG, 30ll * 1000000000ll, e2, sizeof e2));
        CUDA_CHECK(cudaMemcpy(rep == 0 ? h_one : h_out, d_buf, bytes, cudaMemcpyDeviceToHost));
    }
    T_ASSERT(memcmp(h_one, h_out, bytes) == 0);
    check_close(h_one, h_ref, h_mag, N_BIG, "repeat");
    rank_report rep = {.cks_repeat = df_fnv1a64(h_one, bytes, 0)};
    printf("rank %d: repeat: two reductions bit-identical, within 1e-5 of the reference\n", rank);

    /* bucketed, inputs copied in on the caller's stream */
    cudaStream_t us;
    CUDA_CHECK(cudaStreamCreateWithFlags(&us, cudaStreamNonBlocking));
    ALLREDUCE_OK(allreduce_set_stream(&c, us, e2, sizeof e2));
    static const size_t cuts[] = {0, 1000, 1001, 300000, 700001, N_BIG}; /* 5 buckets */
    for (int pass = 0; pass < 2; pass++) {
        CUDA_CHECK(cudaMemsetAsync(d_buf, 0xff, bytes, us)); /* NaN garbage first */
        for (int b = 4; b >= 0; b--) {
            size_t lo = cuts[b], hi = cuts[b + 1];
            CUDA_CHECK(cudaMemcpyAsync(d_buf + lo, h_in + lo, (hi - lo) * sizeof(float), cudaMemcpyHostToDevice, us));
            ALLREDUCE_OK(allreduce_bucket_ready(&c, (uint32_t)(4 - b), d_buf + lo, hi - lo, e2, sizeof e2));
        }
        ALLREDUCE_OK(allreduce_wait_all(&c, e2, sizeof e2));
        CUDA_CHECK(cudaMemcpyAsync(h_out, d_buf, bytes, cudaMemcpyDeviceToHost, us));
        CUDA_CHECK(cudaStreamSynchronize(us));
        if (pass == 0) {
            check_close(h_out, h_ref, h_mag, N_BIG, "bucketed");
            memcpy(tmp, h_out, bytes);
        } else {
            T_ASSERT(memcmp(tmp, h_out, bytes) == 0);
        }
    }
    rep.cks_bucket = df_fnv1a64(h_out, bytes, 0);
    printf("rank %d: bucketed: 5 buckets in reverse order on a caller stream: close to the "
           "reference, bit-identical when repeated (%s the single reduction)\n",
           rank, memcmp(h_out, h_one, bytes) == 0 ? "bit-identical to" : "not bit-identical to");
    T_ASSERT(fdpass_send(sock, &rep, sizeof rep, NULL, 0) >= 0);

    /* timeout: the parent tells the last rank to die; the others must not hang */
    char go;
    T_ASSERT(fdpass_recv(sock, &go, 1, NULL, 0, &nfd) == 1);
    if (go == 'x') {
        if (rank == world - 1)
            raise(SIGKILL);
        int rc = allreduce_sum(&c, d_buf, N_BIG, 5ll * 1000000000ll, e2, sizeof e2);
        printf("rank %d: timeout: %s\n", rank, e2);
        T_ASSERT(rc == -ETIMEDOUT);
        T_ASSERT(allreduce_sum(&c, d_buf, N_BIG, 5ll * 1000000000ll, e2, sizeof e2) == -ETIMEDOUT);
    }
    allreduce_close(&c);
    cudaStreamDestroy(us);
    cudaFree(d_buf);
    cudaFreeHost(h_in);
    return 0;
}

/* A communicator of 2 whose rank 1 never comes: the non-blocking init must give up at
 * the deadline (ncclCommAbort) with -ETIMEDOUT rather than hang. Runs on one GPU. */
static int init_timeout_main(void)
{
    unsigned char id[128];
    ALLREDUCE_OK(allreduce_nccl_get_unique_id(id, e2, sizeof e2));
    allreduce_comm c;
    allreduce_comm_init(&c);
    int rc = allreduce_open_nccl_ex(&c, id, 0, 2, 0, ALLREDUCE_DETERMINISTIC, 3ll * 1000000000ll, e2, sizeof e2);
    printf("init timeout: %s\n", e2);
    T_ASSERT(rc == -ETIMEDOUT);
    T_ASSERT(c.backend == ALLREDUCE_NONE && c.impl == NULL);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        printf("usage: %s   NCCL all-reduce across one process per GPU (skips without GPU)\n", argv[0]);
        return strcmp(argv[1], "--help") == 0 ? 0 : 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* count GPUs in a child: the parent must stay CUDA-free to fork ranks */
    int pfd[2];
    T_ASSERT(pipe(pfd) == 0);
    pid_t probe = fork();
    T_ASSERT(probe >= 0);
    if (probe == 0) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess)
            n = 0;
        T_ASSERT(write(pfd[1], &n, sizeof n) == (ssize_t)sizeof n);
        _exit(0);
    }
    int ndev = 0, st;
    T_ASSERT(read(pfd[0], &ndev, sizeof ndev) == (ssize_t)sizeof ndev);
    T_ASSERT(waitpid(probe, &st, 0) == probe);
    close(pfd[0]);
    close(pfd[1]);
    if (ndev <= 0)
        T_SKIP("gpu_test_allreduce: no CUDA device (cudaGetDeviceCount)");
    int world = ndev > MAX_WORLD ? MAX_WORLD : ndev;
    printf("world %d (one rank per GPU)\n", world);

    pid_t pids[MAX_WORLD];
    int socks[MAX_WORLD];
    for (int r = 0; r < world; r++) {
        int sv[2];
        T_ASSERT(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) == 0);
        pids[r] = fork();
        T_ASSERT(pids[r] >= 0);
        if (pids[r] == 0) {
            close(sv[0]);
            alarm(300);
            _exit(rank_main(r, world, sv[1]));
        }
        close(sv[1]);
        socks[r] = sv[0];
    }
    /* the orchestrator's part of the id exchange */
    unsigned char id[128];
    int nfd = 0;
    T_ASSERT(fdpass_recv(socks[0], id, sizeof id, NULL, 0, &nfd) == (int)sizeof id);
    for (int r = 0; r < world; r++)
        T_ASSERT(fdpass_send(socks[r], id, sizeof id, NULL, 0) >= 0);
    rank_report rep[MAX_WORLD];
    for (int r = 0; r < world; r++) {
        int got = fdpass_recv(socks[r], &rep[r], sizeof rep[r], NULL, 0, &nfd);
        if (got != (int)sizeof rep[r]) {
            fprintf(stderr, "rank %d sent no report (%d)\n", r, got);
            for (int k = 0; k < world; k++)
                kill(pids[k], SIGKILL);
            exit(1);
        }
        T_ASSERT(rep[r].cks_repeat == rep[0].cks_repeat);
        T_ASSERT(rep[r].cks_bucket == rep[0].cks_bucket);
    }
    printf("all %d ranks: identical result checksums\n", world);
    char go = world >= 2 ? 'x' : 'q';
    for (int r = 0; r < world; r++)
        T_ASSERT(fdpass_send(socks[r], &go, 1, NULL, 0) >= 0);
    int ok = 1;
    for (int r = 0; r < world; r++) {
        T_ASSERT(waitpid(pids[r], &st, 0) == pids[r]);
        int want_kill = go == 'x' && r == world - 1;
        int good = want_kill ? (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) : (WIFEXITED(st) && WEXITSTATUS(st) == 0);
        if (!good) {
            fprintf(stderr, "rank %d: bad end status 0x%x\n", r, st);
            ok = 0;
        }
    }
    T_ASSERT(ok);
    if (world < 2)
        printf("timeout: not run (needs 2 GPUs)\n");
    else
        printf("timeout: a dead rank gave -ETIMEDOUT on all %d others (no hang)\n", world - 1);
    fflush(NULL);
    pid_t it = fork();
    T_ASSERT(it >= 0);
    if (it == 0) {
        alarm(120);
        _exit(init_timeout_main());
    }
    T_ASSERT(waitpid(it, &st, 0) == it);
    T_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    printf("init timeout: a world-2 init with an absent rank gave -ETIMEDOUT (no hang)\n");
    printf("gpu_test_allreduce: all passed\n");
    return 0;
}
