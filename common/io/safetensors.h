/* safetensors.h: read and write Hugging Face .safetensors files (prefix st_).
 *
 * Format: an 8-byte little-endian header length N, N bytes of JSON header, then the data
 * section. The header is an object: tensor name -> {"dtype", "shape", "data_offsets":
 * [begin, end)} with offsets relative to the data section, plus an optional
 * "__metadata__" object of strings. Files are mapped read-only; a tensor's data points
 * into the mapping and stays valid until safetensors_close.
 *
 * Why so strict: the file is untrusted input (downloaded weights, half-written
 * checkpoints). safetensors_parse_header checks every field type, that shape * dtype size equals
 * the byte span, that offsets lie inside the data section and that no two tensors
 * overlap, so nothing after a successful open can read outside the mapping. It is pure
 * (no I/O) and is the libFuzzer target (fuzz/fuzz_safetensors.c). Every error message
 * names the tensor and the offending value; safetensors_open prefixes the file path, e.g.
 *   m.safetensors: tensor "model.norm.weight": data_offsets [0, 640] exceed the data section (512 bytes)
 * Return values: 0, -EINVAL for a malformed file, other -errno for I/O failures.
 *
 * A model directory (safetensors_model) is model.safetensors, or the shards named by
 * model.safetensors.index.json ("weight_map"); each shard is opened once.
 *
 * The writer collects tensors (borrowed data, or converted copies) and writes the file
 * atomically: header sorted by name, padded so the data section starts 8-byte aligned,
 * tensors laid out contiguously by element size (largest first) then name, so every
 * tensor starts aligned to its element size and the file loads with the reference
 * loaders (which reject gaps between tensors).
 */
#ifndef DF_SAFETENSORS_H
#define DF_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "sha256.h" /* df_sha256_pieces */

typedef enum {
    SAFETENSORS_F32,
    SAFETENSORS_F16,
    SAFETENSORS_BF16,
    SAFETENSORS_F64,
    SAFETENSORS_I64,
    SAFETENSORS_I32,
    SAFETENSORS_I16,
    SAFETENSORS_I8,
    SAFETENSORS_U8,
    SAFETENSORS_BOOL
} safetensors_dtype;

#define SAFETENSORS_MAX_DIMS 8
#define SAFETENSORS_MAX_NAME 256                             /* names are at most 255 bytes */
#define SAFETENSORS_MAX_HEADER ((uint64_t)100 * 1024 * 1024) /* the reference loader's limit */

typedef struct safetensors_tensor {
    char name[SAFETENSORS_MAX_NAME];
    safetensors_dtype dtype;
    int ndim;
    int64_t shape[SAFETENSORS_MAX_DIMS];
    uint64_t nbytes;
    const void *data;     /* into the mapping (NULL after safetensors_parse_header alone) */
    uint64_t data_offset; /* begin of data_offsets: relative to the data section */
} safetensors_tensor;

typedef struct safetensors_file {
    char *path;
    int fd;
    void *map;
    uint64_t size;
    safetensors_tensor *tensors; /* sorted by name */
    int n_tensors;
} safetensors_file;

/* Parse and validate a header of hdr_len bytes (not NUL-terminated) for a data section
 * of data_len bytes. On success *out is a malloc'd array of *n tensors sorted by name
 * (caller frees; NULL when n == 0) with data == NULL. On failure *out = NULL, *n = 0,
 * err holds the reason, returns -EINVAL (or -ENOMEM). */
int safetensors_parse_header(const char *hdr, uint64_t hdr_len, uint64_t data_len, safetensors_tensor **out, int *n,
                             char *err, size_t errlen);

/* Open and map path read-only, parse its header. On failure f is left closed (safe to
 * safetensors_close) and err names the file. */
int safetensors_open(safetensors_file *f, const char *path, char *err, size_t errlen);
/* Unmap and free; every safetensors_tensor.data of f becomes invalid. Safe on a zeroed or failed f. */
void safetensors_close(safetensors_file *f);
/* NULL when absent. Borrowed: valid until safetensors_close. */
const safetensors_tensor *safetensors_find(const safetensors_file *f, const char *name);

/* Convert t's elements to f32 into dst[numel] (any dtype; integers are converted by value).
 * 0 or -EINVAL. */
int safetensors_tensor_to_f32(const safetensors_tensor *t, float *dst);
int64_t safetensors_numel(const safetensors_tensor *t);
size_t safetensors_dtype_size(safetensors_dtype d);
const char *safetensors_dtype_name(safetensors_dtype d);                /* "F32", "BF16", ... */
int safetensors_dtype_from_name(const char *s, safetensors_dtype *out); /* 0 or -EINVAL */

/* A HF model directory. files[] owns the shards; dir is a copy of the path. */
typedef struct safetensors_model {
    safetensors_file *files;
    int n_files;
    char *dir;
} safetensors_model;

/* Open dir/model.safetensors.index.json's shards, or dir/model.safetensors. Checks that
 * every tensor the index lists is in its shard. Errors name the file. */
int safetensors_model_open(safetensors_model *m, const char *dir, char *err, size_t errlen);
void safetensors_model_close(safetensors_model *m); /* safe on a zeroed or failed m */
/* NULL when absent; *file_path (if non-NULL) gets the shard's path. Borrowed. */
const safetensors_tensor *safetensors_model_find(const safetensors_model *m, const char *name, const char **file_path);

/* Writer. safetensors_writer_add borrows data (nbytes = numel * dtype size) until safetensors_writer_write
 * returns; safetensors_writer_add_f32_as converts src now (F32, F16, BF16 or F64; RNE) into an
 * owned copy. Names must be unique and at most 255 bytes; -EINVAL / -EEXIST otherwise. */
typedef struct safetensors_writer safetensors_writer;
safetensors_writer *safetensors_writer_new(void); /* NULL on ENOMEM */
int safetensors_writer_add(safetensors_writer *w, const char *name, safetensors_dtype dt, int ndim,
                           const int64_t *shape, const void *data);
int safetensors_writer_add_f32_as(safetensors_writer *w, const char *name, safetensors_dtype dt, int ndim,
                                  const int64_t *shape, const float *src);
int safetensors_writer_set_metadata(safetensors_writer *w, const char *key,
                                    const char *value); /* copies; last set wins */
/* Write path.tmp.<pid>, fsync, rename, fsync the directory. 0 or -errno; on failure
 * (ENOSPC, ...) the previous file at path is untouched and the temp file removed. */
int safetensors_writer_write(safetensors_writer *w, const char *path);
/* The same, and the SHA-256 (64 lowercase hex digits) and size of the bytes written, hashed
 * from the buffers handed to write() on a second thread while the writes and the fsync run
 * (not read back from the file); with pieces (initialised by the caller, may be NULL) also
 * the digest of every piece of the file, on a third thread. sha_hex non-NULL; size may be
 * NULL. */
int safetensors_writer_write_digests(safetensors_writer *w, const char *path, char sha_hex[65], uint64_t *size,
                                     df_sha256_pieces *pieces);
void safetensors_writer_free(safetensors_writer *w); /* NULL is fine */

/* Round to nearest even; NaN stays NaN (quiet), overflow goes to inf. */
uint16_t safetensors_f32_to_bf16(float x);
/* dst[i] = safetensors_f32_to_bf16(src[i]) for i < n; large n on every CPU (element-wise:
 * the same bits whatever the split). What the CUDA loaders upload a 622 M-value table with. */
void safetensors_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n);
float safetensors_bf16_to_f32(uint16_t x);
uint16_t safetensors_f32_to_f16(float x);
float safetensors_f16_to_f32(uint16_t x);

#endif
