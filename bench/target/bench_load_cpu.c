/* bench_load_cpu: what loading a model tensor costs on the host, beside the plain loop and
 * the copy ceiling, in one run.
 *
 * A Qwen3-8B embedding (151936 x 4096 bf16 = 1.24 GB; --rows/--cols to change) in memory:
 *   ours: target_check_finite (the NaN/Inf scan every load does) + safetensors_tensor_to_f32
 *         (common/par.h: a range per CPU, a tight loop per dtype);
 *   plain: the same two steps one element at a time on one thread, with the dtype switch
 *          inside the loop and an early-exit scan (what both were before);
 *   ceiling: memcpy of the 2.49 GB of fp32 output (every byte written once, read from a
 *          warm buffer), the most a conversion that writes fp32 can approach.
 * Then target_load_embeddings on a file of that shape (embedding + untied lm_head, as the
 * cuda drafter's start-up reads them). Median of --iters (default 3) after one warm-up.
 * Writes bench/results/target_load_cpu.json (--json to change). */
#include "bench/bench_env.h"
#include "io/safetensors.h"
#include "par.h"
#include "target/target_model.h"
#include "util.h"

#include <errno.h>
#include <limits.h>

static double median_of(double *t, int n)
{
    return bench_median(t, n);
}

/* The loops as they were: the dtype switch per element, the scan stopping at the first bad. */
static uint64_t plain_scan(const uint16_t *p, uint64_t n)
{
    uint64_t bad = UINT64_MAX;
    for (uint64_t i = 0; i < n && bad == UINT64_MAX; i++)
        if ((p[i] & 0x7f80u) == 0x7f80u)
            bad = i;
    return bad;
}

static void plain_convert(const safetensors_tensor *t, float *dst)
{
    size_t es = safetensors_dtype_size(t->dtype);
    const unsigned char *p = t->data;
    uint64_t n = t->nbytes / es;
    for (uint64_t i = 0; i < n; i++, p += es) {
        switch (t->dtype) {
        case SAFETENSORS_F32: memcpy(&dst[i], p, 4); break;
        case SAFETENSORS_BF16: {
            uint16_t v;
            memcpy(&v, p, 2);
            dst[i] = safetensors_bf16_to_f32(v);
            break;
        }
        default: dst[i] = 0; break;
        }
    }
}

int main(int argc, char **argv)
{
    int64_t rows = 151936, cols = 4096;
    int iters = 3;
    const char *json = "bench/results/target_load_cpu.json";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: bench_load_cpu [--rows R] [--cols C] [--iters N] [--json F]\n"
                   "  a [R, C] bf16 tensor (default the Qwen3-8B embedding, 151936 x 4096): the NaN scan and\n"
                   "  the fp32 conversion, ours vs the plain loop vs a memcpy ceiling; then\n"
                   "  target_load_embeddings on a file of that shape\n");
            return 0;
        } else if (i + 1 < argc && !strcmp(argv[i], "--rows"))
            rows = atoll(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--cols"))
            cols = atoll(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--iters"))
            iters = (int)df_arg_int("bench_load_cpu", "--iters", argv[++i], 1, INT_MAX);
        else if (i + 1 < argc && !strcmp(argv[i], "--json"))
            json = argv[++i];
        else {
            fprintf(stderr, "bench_load_cpu: unknown argument %s (--help)\n", argv[i]);
            return 2;
        }
    }
    if (rows < 1 || cols < 1 || iters < 1 || iters > 50) {
        fprintf(stderr, "bench_load_cpu: --rows and --cols must be >= 1, --iters 1..50\n");
        return 2;
    }
    uint64_t n = (uint64_t)rows * (uint64_t)cols;
    uint16_t *src = malloc(n * 2), *lm = malloc(n * 2);
    float *dst = malloc(n * 4), *warm = malloc(n * 4);
    if (!src || !lm || !dst || !warm) {
        fprintf(stderr, "bench_load_cpu: no memory for %llu elements\n", (unsigned long long)n);
        return 1;
    }
    for (uint64_t i = 0; i < n; i++) /* finite bf16 values: 0.5 .. 2 with varied mantissas */
        src[i] = (uint16_t)(0x3f00 + (df_hash64(i) & 0xff)), lm[i] = src[i] ^ 0x8000;
    memset(dst, 0, n * 4), memset(warm, 1, n * 4);
    safetensors_tensor t = {.dtype = SAFETENSORS_BF16, .ndim = 2, .nbytes = n * 2, .data = src};
    t.shape[0] = rows, t.shape[1] = cols;
    strcpy(t.name, "model.embed_tokens.weight");
    bench_env env;
    bench_env_read(&env);
    printf("bench_load_cpu: [%lld, %lld] bf16 (%.2f GB -> %.2f GB fp32), %d threads, median of %d\n", (long long)rows,
           (long long)cols, n * 2 / 1e9, n * 4 / 1e9, par_threads(), iters);
    double tt[50], ours, plain, ceil_s;
    char err[512];
    int rc;
    for (int k = -1; k < iters; k++) {
        double t0 = df_wall_s();
        if ((rc = target_check_finite(&t, "mem", err, sizeof err)) < 0 ||
            (rc = safetensors_tensor_to_f32(&t, dst)) < 0) {
            fprintf(stderr, "bench_load_cpu: %s\n", rc == -EINVAL ? err : strerror(-rc));
            return 1;
        }
        if (k >= 0)
            tt[k] = df_wall_s() - t0;
    }
    ours = median_of(tt, iters);
    float first = dst[12345];
    for (int k = -1; k < iters; k++) {
        double t0 = df_wall_s();
        if (plain_scan(src, n) != UINT64_MAX)
            return 1;
        plain_convert(&t, dst);
        if (k >= 0)
            tt[k] = df_wall_s() - t0;
    }
    plain = median_of(tt, iters);
    if (dst[12345] != first) {
        fprintf(stderr, "bench_load_cpu: the plain loop and ours disagree\n");
        return 1;
    }
    for (int k = -1; k < iters; k++) {
        double t0 = df_wall_s();
        memcpy(dst, warm, n * 4);
        if (k >= 0)
            tt[k] = df_wall_s() - t0;
    }
    ceil_s = median_of(tt, iters);

    /* the whole load from a file, as the cuda drafter's start-up does it */
    char tmpl[] = "/tmp/bench_load_cpu.XXXXXX", path[600];
    char *dir = mkdtemp(tmpl);
    double load_s = -1;
    if (dir) {
        snprintf(path, sizeof path, "%s/config.json", dir);
        FILE *f = fopen(path, "w");
        if (f) {
            fprintf(f,
                    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": %lld, "
                    "\"intermediate_size\": %lld, \"num_hidden_layers\": 2, \"num_attention_heads\": 1, "
                    "\"num_key_value_heads\": 1, \"head_dim\": %lld, \"vocab_size\": %lld, \"rms_norm_eps\": 1e-6, "
                    "\"rope_theta\": 1000000.0, \"max_position_embeddings\": 4096, \"tie_word_embeddings\": false, "
                    "\"hidden_act\": \"silu\", \"attention_bias\": false}\n",
                    (long long)cols, (long long)(3 * cols), (long long)cols, (long long)rows);
            fclose(f);
        }
        safetensors_writer *w = safetensors_writer_new();
        int64_t s2[2] = {rows, cols};
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (w && safetensors_writer_add(w, "model.embed_tokens.weight", SAFETENSORS_BF16, 2, s2, src) == 0 &&
            safetensors_writer_add(w, "lm_head.weight", SAFETENSORS_BF16, 2, s2, lm) == 0 &&
            safetensors_writer_write(w, path) == 0) {
            for (int k = -1; k < iters; k++) {
                target_embeddings e;
                double t0 = df_wall_s();
                if ((rc = target_load_embeddings(&e, dir, 0, err, sizeof err)) < 0) {
                    fprintf(stderr, "bench_load_cpu: target_load_embeddings: %s\n", err);
                    break;
                }
                if (k >= 0)
                    tt[k] = df_wall_s() - t0;
                target_embeddings_free(&e);
                if (k == iters - 1)
                    load_s = median_of(tt, iters);
            }
        }
        safetensors_writer_free(w);
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "bench_load_cpu: could not remove %s\n", dir);
    }
    double gb = n * 4 / 1e9;
    printf("\n%-46s %9s %9s %11s\n", "scan + convert one tensor", "seconds", "GB/s out", "of ceiling");
    printf("%-46s %9.3f %9.2f %10.1f%%\n", "ours (par_for, a tight loop per dtype)", ours, gb / ours,
           100 * ceil_s / ours);
    printf("%-46s %9.3f %9.2f %10.1f%%\n", "plain loop, one thread (before; peer)", plain, gb / plain,
           100 * ceil_s / plain);
    printf("%-46s %9.3f %9.2f %10.1f%%\n", "memcpy of the fp32 bytes (ceiling)", ceil_s, gb / ceil_s, 100.0);
    printf("target_load_embeddings (embedding + lm_head from a file in the page cache): %.3f s\n", load_s);
    FILE *f = fopen(json, "w");
    if (!f) {
        fprintf(stderr, "bench_load_cpu: %s: %s\n", json, strerror(errno));
        return 1;
    }
    fprintf(f,
            "{\"bench\": \"load_cpu\", \"commit\": \"%s\", \"host\": \"%s\", \"date\": \"%s\", \"cpus\": %ld, "
            "\"rows\": %lld, \"cols\": %lld, \"threads\": %d,\n \"ours_s\": %.4f, \"plain_s\": %.4f, "
            "\"memcpy_ceiling_s\": %.4f, \"load_embeddings_s\": %.4f}\n",
            env.commit, env.host, env.date, env.cpus, (long long)rows, (long long)cols, par_threads(), ours, plain,
            ceil_s, load_s);
    fclose(f);
    printf("wrote %s\n", json);
    free(src), free(lm), free(dst), free(warm);
    return 0;
}
