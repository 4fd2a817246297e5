/* target_backend.h: the target worker's forward, on the CPU (target_*) or on its GPU (target_*_cuda),
 * writing a TP batch into a ring slot (prefix backend_).
 *
 * The worker builds the batch's metadata (header, tokens, loss mask) in the buffer
 * backend_meta_buffer gives it: for the CPU backend that is the slot itself, for CUDA a host
 * buffer. backend_forward then makes the slot complete: it copies the metadata into a device
 * slot (CUDA), runs the target over the packed row and writes the captured layers at
 * off_feat (fp32 on the CPU, bf16 on CUDA), and returns when the slot is ready to publish
 * (CUDA: the stream is synchronised).
 *
 * Errors: 0 or -errno with a message in err. backend_open: -EINVAL/-ENOENT (bad or missing
 * model: permanent, target_exit_code maps them) or -ENOTSUP (no CUDA in this build). backend_forward:
 * -ERANGE a token id outside the vocabulary (bad data), -EIO device failure.
 *
 * The backend is a backend_ops table chosen by backend_open (target_backend_internal.h,
 * docs/backends.md). */
#ifndef DF_TARGET_BACKEND_H
#define DF_TARGET_BACKEND_H

#include "io/batch.h"
#include "io/topology.h"
#include "ipc/arena.h"

#include <stddef.h>

typedef struct target_backend target_backend;

int backend_open(target_backend **out, const topo *t, int device, char *err, size_t errlen);
void backend_close(target_backend *b); /* NULL is fine */
int backend_hidden(const target_backend *b);
int backend_n_layers_run(const target_backend *b);
int backend_n_layers(const target_backend *b);
int backend_vocab(const target_backend *b);           /* the target's vocab_size, 0 if unknown */
uint32_t backend_feat_dtype(const target_backend *b); /* BATCH_FEAT_F32 (cpu) or BATCH_FEAT_BF16 (cuda) */
/* Where to build the metadata of the batch for the slot at arena offset off. */
batch_header *backend_meta_buffer(target_backend *b, const arena *A, uint64_t off);
int backend_forward(target_backend *b, const arena *A, uint64_t off, batch_header *h, char *err, size_t errlen);

#endif
