/* generate_cuda.c: the CUDA backend of generate.h (CUDA=1 builds) over target_decode_cuda:
 * greedy tokens come back from the device's argmax; logits are copied to the host only
 * when sampling needs them. */
#include "eval/generate.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "io/hfconfig.h"
#include "target/target_decode_cuda.h"
#include "util.h"

typedef struct gen_cuda {
    decode_model_cuda m;
    int n_seq;
    float *logits; /* host [n_seq, V] */
} gen_cuda;

static int cuda_extend(void *impl, int s, const int32_t *tokens, int k, int want_logits, int32_t *greedy,
                       const float **logits, char *err, size_t errlen)
{
    gen_cuda *g = impl;
    int rc = decode_extend_seq_cuda(&g->m, s, tokens, k, 1, greedy, err, errlen);
    if (rc == 0 && want_logits && (rc = decode_logits_to_host_cuda(&g->m, g->logits, err, errlen)) == 0)
        *logits = g->logits;
    if (rc == -ENOSPC)
        return df_err(err, errlen, rc, "target extend of sequence %d by %d tokens: the cache is full", s, k);
    return rc;
}

static int cuda_step(void *impl, const int32_t *tokens, const int *on, int want_logits, int32_t *greedy,
                     const float **logits, char *err, size_t errlen)
{
    gen_cuda *g = impl;
    int rc = decode_extend_batch_cuda(&g->m, tokens, on, greedy, err, errlen);
    if (rc == 0 && want_logits && (rc = decode_logits_to_host_cuda(&g->m, g->logits, err, errlen)) == 0)
        *logits = g->logits;
    return rc;
}

static void cuda_reset(void *impl, int s)
{
    decode_reset_seq_cuda(&((gen_cuda *)impl)->m, s);
}

static void cuda_close(void *impl)
{
    gen_cuda *g = impl;
    decode_free_cuda(&g->m);
    free(g->logits);
    free(g);
}

static int cuda_open(generate_target *t, int device, const char *model_dir, int max_ctx, int n_seq, char *err,
                     size_t errlen);
const generate_ops generate_ops_cuda = {.name = "cuda",
                                        .open = cuda_open,
                                        .extend = cuda_extend,
                                        .step = cuda_step,
                                        .reset = cuda_reset,
                                        .close = cuda_close};

static int cuda_open(generate_target *t, int device, const char *model_dir, int max_ctx, int n_seq, char *err,
                     size_t errlen)
{
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || device >= n_dev)
        return df_err(err, errlen, n_dev ? -EINVAL : -ENODEV, "--backend cuda:%d: this machine has %d CUDA device(s)",
                      device, n_dev);
    CUDA_TRY(cudaSetDevice(device), err, errlen);
    hfconfig c;
    int rc = hfconfig_load(&c, model_dir, err, errlen);
    if (rc < 0)
        return rc;
    int last = c.num_hidden_layers - 1;
    hfconfig_free(&c);
    gen_cuda *g = calloc(1, sizeof *g);
    if (!g)
        return df_err(err, errlen, -ENOMEM, "out of memory");
    if ((rc = decode_load_batch_cuda(&g->m, model_dir, &last, 1, max_ctx, 1, n_seq, err, errlen)) < 0) {
        free(g);
        return rc;
    }
    g->n_seq = n_seq;
    if (!(g->logits = malloc(sizeof(float) * (size_t)n_seq * (size_t)g->m.tm.V))) {
        cuda_close(g);
        return df_err(err, errlen, -ENOMEM, "out of memory");
    }
    t->ops = &generate_ops_cuda;
    t->impl = g;
    t->vocab = g->m.tm.V;
    t->max_ctx = max_ctx;
    t->n_seq = n_seq;
    return 0;
}
