/* target_backend.h: the target worker's forward, on the CPU (tm_*) or on its GPU (tmc_*),
 * writing a TP batch into a ring slot (prefix tb_).
 *
 * The worker builds the batch's metadata (header, tokens, loss mask) in the buffer
 * tb_meta_buffer gives it: for the CPU backend that is the slot itself, for CUDA a host
 * buffer. tb_forward then makes the slot complete: it copies the metadata into a device
 * slot (CUDA), runs the target over the packed row and writes the captured layers at
 * off_feat (fp32 on the CPU, bf16 on CUDA), and returns when the slot is ready to publish
 * (CUDA: the stream is synchronised).
 *
 * Errors: 0 or -errno with a message in err. tb_open: -EINVAL/-ENOENT (bad or missing
 * model: permanent, tm_exit_code maps them) or -ENOTSUP (no CUDA in this build). tb_forward:
 * -ERANGE a token id outside the vocabulary (bad data), -EIO device failure. */
#ifndef DF_TARGET_BACKEND_H
#define DF_TARGET_BACKEND_H

#include "io/batch.h"
#include "io/topology.h"
#include "ipc/arena.h"

#include <stddef.h>

typedef struct tb_backend tb_backend;

int tb_open(tb_backend **out, const topo *t, int device, char *err, size_t errlen);
void tb_close(tb_backend *b); /* NULL is fine */
int tb_hidden(const tb_backend *b);
int tb_n_layers_run(const tb_backend *b);
int tb_n_layers(const tb_backend *b);
uint32_t tb_feat_dtype(const tb_backend *b); /* BATCH_FEAT_F32 (cpu) or BATCH_FEAT_BF16 (cuda) */
/* Where to build the metadata of the batch for the slot at arena offset off. */
batch_header *tb_meta_buffer(tb_backend *b, const arena *A, uint64_t off);
int tb_forward(tb_backend *b, const arena *A, uint64_t off, batch_header *h, char *err, size_t errlen);

/* ---- backend seam (target_backend_cuda.c / target_backend_nocuda.c) ---- */
int tb_cuda_open(tb_backend **out, const topo *t, int device, char *err, size_t errlen);

#endif
