/* safetensors.h: read and write Hugging Face .safetensors files (prefix st_).
 *
 * Format: an 8-byte little-endian header length N, N bytes of JSON header, then the data
 * section. The header is an object: tensor name -> {"dtype", "shape", "data_offsets":
 * [begin, end)} with offsets relative to the data section, plus an optional
 * "__metadata__" object of strings. Files are mapped read-only; a tensor's data points
 * into the mapping and stays valid until st_close.
 *
 * Why so strict: the file is untrusted input (downloaded weights, half-written
 * checkpoints). st_parse_header checks every field type, that shape * dtype size equals
 * the byte span, that offsets lie inside the data section and that no two tensors
 * overlap, so nothing after a successful open can read outside the mapping. It is pure
 * (no I/O) and is the libFuzzer target (fuzz/fuzz_safetensors.c). Every error message
 * names the tensor and the offending value; st_open prefixes the file path, e.g.
 *   m.safetensors: tensor "model.norm.weight": data_offsets [0, 640] exceed the data section (512 bytes)
 * Return values: 0, -EINVAL for a malformed file, other -errno for I/O failures.
 *
 * A model directory (st_model) is model.safetensors, or the shards named by
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

typedef enum { ST_F32, ST_F16, ST_BF16, ST_F64, ST_I64, ST_I32, ST_I16, ST_I8, ST_U8, ST_BOOL } st_dtype;

#define ST_MAX_DIMS 8
#define ST_MAX_NAME 256                             /* names are at most 255 bytes */
#define ST_MAX_HEADER ((uint64_t)100 * 1024 * 1024) /* the reference loader's limit */

typedef struct st_tensor {
    char name[ST_MAX_NAME];
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t nbytes;
    const void *data;     /* into the mapping (NULL after st_parse_header alone) */
    uint64_t data_offset; /* begin of data_offsets: relative to the data section */
} st_tensor;

typedef struct st_file {
    char *path;
    int fd;
    void *map;
    uint64_t size;
    st_tensor *tensors; /* sorted by name */
    int n_tensors;
} st_file;

/* Parse and validate a header of hdr_len bytes (not NUL-terminated) for a data section
 * of data_len bytes. On success *out is a malloc'd array of *n tensors sorted by name
 * (caller frees; NULL when n == 0) with data == NULL. On failure *out = NULL, *n = 0,
 * err holds the reason, returns -EINVAL (or -ENOMEM). */
int st_parse_header(const char *hdr, uint64_t hdr_len, uint64_t data_len, st_tensor **out, int *n, char *err,
                    size_t errlen);

/* Open and map path read-only, parse its header. On failure f is left closed (safe to
 * st_close) and err names the file. */
int st_open(st_file *f, const char *path, char *err, size_t errlen);
/* Unmap and free; every st_tensor.data of f becomes invalid. Safe on a zeroed or failed f. */
void st_close(st_file *f);
/* NULL when absent. Borrowed: valid until st_close. */
const st_tensor *st_find(const st_file *f, const char *name);

/* Convert t's elements to f32 into dst[numel] (any dtype; integers are converted by value).
 * 0 or -EINVAL. */
int st_tensor_to_f32(const st_tensor *t, float *dst);
int64_t st_numel(const st_tensor *t);
size_t st_dtype_size(st_dtype d);
const char *st_dtype_name(st_dtype d);                 /* "F32", "BF16", ... */
int st_dtype_from_name(const char *s, st_dtype *out);  /* 0 or -EINVAL */

/* A HF model directory. files[] owns the shards; dir is a copy of the path. */
typedef struct st_model {
    st_file *files;
    int n_files;
    char *dir;
} st_model;

/* Open dir/model.safetensors.index.json's shards, or dir/model.safetensors. Checks that
 * every tensor the index lists is in its shard. Errors name the file. */
int st_model_open(st_model *m, const char *dir, char *err, size_t errlen);
void st_model_close(st_model *m); /* safe on a zeroed or failed m */
/* NULL when absent; *file_path (if non-NULL) gets the shard's path. Borrowed. */
const st_tensor *st_model_find(const st_model *m, const char *name, const char **file_path);

/* Writer. st_writer_add borrows data (nbytes = numel * dtype size) until st_writer_write
 * returns; st_writer_add_f32_as converts src now (F32, F16, BF16 or F64; RNE) into an
 * owned copy. Names must be unique and at most 255 bytes; -EINVAL / -EEXIST otherwise. */
typedef struct st_writer st_writer;
st_writer *st_writer_new(void); /* NULL on ENOMEM */
int st_writer_add(st_writer *w, const char *name, st_dtype dt, int ndim, const int64_t *shape, const void *data);
int st_writer_add_f32_as(st_writer *w, const char *name, st_dtype dt, int ndim, const int64_t *shape,
                         const float *src);
int st_writer_set_metadata(st_writer *w, const char *key, const char *value); /* copies; last set wins */
/* Write path.tmp.<pid>, fsync, rename, fsync the directory. 0 or -errno; on failure
 * (ENOSPC, ...) the previous file at path is untouched and the temp file removed. */
int st_writer_write(st_writer *w, const char *path);
void st_writer_free(st_writer *w); /* NULL is fine */

/* Round to nearest even; NaN stays NaN (quiet), overflow goes to inf. */
uint16_t st_f32_to_bf16(float x);
float st_bf16_to_f32(uint16_t x);
uint16_t st_f32_to_f16(float x);
float st_f16_to_f32(uint16_t x);

#endif
