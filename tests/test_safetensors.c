/* test_safetensors.c: the safetensors reader and writer on real files.
 *   - float conversions: every f16 / bf16 bit pattern round-trips, RNE ties, NaN, overflow
 *   - writer -> reader round trip for every dtype, with metadata, alignment and layout
 *   - each crafted bad file in tests/bad_safetensors/ gives its exact message (expected.txt)
 *   - model directories: single file, sharded index, missing shard, lying index
 *   - atomic write: a failed write leaves the old file and no temp file behind
 */
#include "io/safetensors.h"
#include "test_helpers.h"
#include "test_model_dir.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static void conversions(void)
{
    /* every f16 / bf16 pattern survives x -> f32 -> x (NaNs stay NaN) */
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = safetensors_f16_to_f32(h);
        if (isnan(f))
            T_ASSERT(isnan(safetensors_f16_to_f32(safetensors_f32_to_f16(f))));
        else
            T_ASSERT(safetensors_f32_to_f16(f) == h);
        float b = safetensors_bf16_to_f32(h);
        if (isnan(b))
            T_ASSERT(isnan(safetensors_bf16_to_f32(safetensors_f32_to_bf16(b))));
        else
            T_ASSERT(safetensors_f32_to_bf16(b) == h);
    }
    /* bf16 RNE: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 -> even (1); 1 + 3*2^-8 -> up */
    T_ASSERT(safetensors_f32_to_bf16(1.0f + 1.0f / 256) == 0x3f80);
    T_ASSERT(safetensors_f32_to_bf16(1.0f + 3.0f / 256) == 0x3f82);
    T_ASSERT(safetensors_f32_to_bf16(1.0f + 1.0f / 256 + 1.0f / 65536) == 0x3f81);
    T_ASSERT(safetensors_f32_to_bf16(FLT_MAX) == 0x7f80); /* above the largest bf16 -> inf */
    T_ASSERT(isnan(safetensors_bf16_to_f32(safetensors_f32_to_bf16(NAN))));
    /* f16: known values, ties, subnormals, overflow */
    T_ASSERT(safetensors_f32_to_f16(1.0f) == 0x3c00);
    T_ASSERT(safetensors_f32_to_f16(-2.0f) == 0xc000);
    T_ASSERT(safetensors_f32_to_f16(65504.0f) == 0x7bff);
    T_ASSERT(safetensors_f32_to_f16(65519.0f) == 0x7bff);
    T_ASSERT(safetensors_f32_to_f16(65520.0f) == 0x7c00);
    T_ASSERT(safetensors_f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00);   /* tie -> even */
    T_ASSERT(safetensors_f32_to_f16(1.0f + 3.0f / 2048) == 0x3c02);   /* tie -> even (up) */
    T_ASSERT(safetensors_f32_to_f16(ldexpf(1.0f, -24)) == 0x0001);    /* smallest subnormal */
    T_ASSERT(safetensors_f32_to_f16(ldexpf(1.0f, -25)) == 0x0000);    /* tie -> even (0) */
    T_ASSERT(safetensors_f32_to_f16(ldexpf(3.0f, -25)) == 0x0002);    /* tie -> even (2) */
    T_ASSERT(safetensors_f32_to_f16(ldexpf(1023.5f, -24)) == 0x0400); /* rounds up into the normals */
    T_ASSERT(safetensors_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    T_ASSERT(isnan(safetensors_f16_to_f32(safetensors_f32_to_f16(NAN))));
    /* the bulk conversion (threads past 2^22 values) == the scalar one, every element: random
     * bit patterns (NaNs, infinities, subnormals and ties among them), an odd length */
    size_t n = 3 * (1u << 22) + 5;
    float *src = malloc(n * sizeof *src);
    uint16_t *dst = malloc(n * sizeof *dst);
    T_ASSERT(src && dst);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint32_t u = (uint32_t)(x >> 32);
        if (i % 7 == 0)
            u = (u & 0xffff0000u) | 0x8000u; /* a tie */
        memcpy(&src[i], &u, 4);
    }
    memset(dst, 0xa5, n * sizeof *dst);
    safetensors_f32_to_bf16_n(dst, src, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += dst[i] != safetensors_f32_to_bf16(src[i]);
    T_ASSERT(bad == 0);
    free(src);
    free(dst);
    printf("conversions: all 65536 f16 and bf16 patterns round-trip, RNE ties ok\n");
}

static void round_trip(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/rt.safetensors", tmpdir);
    safetensors_writer *w = safetensors_writer_new();
    T_ASSERT(w);
    /* one tensor per dtype, odd sizes so alignment matters */
    static const safetensors_dtype all[] = {SAFETENSORS_F32, SAFETENSORS_F16, SAFETENSORS_BF16, SAFETENSORS_F64,
                                            SAFETENSORS_I64, SAFETENSORS_I32, SAFETENSORS_I16,  SAFETENSORS_I8,
                                            SAFETENSORS_U8,  SAFETENSORS_BOOL};
    unsigned char *bufs[DF_ARRAY_LEN(all)];
    int64_t shape[2] = {3, 5};
    df_rng r;
    df_rng_seed(&r, 42);
    for (unsigned i = 0; i < DF_ARRAY_LEN(all); i++) {
        size_t nb = 15 * safetensors_dtype_size(all[i]);
        bufs[i] = malloc(nb);
        for (size_t j = 0; j < nb; j++)
            bufs[i][j] = (unsigned char)df_rng_next(&r);
        if (all[i] == SAFETENSORS_BOOL)
            for (size_t j = 0; j < nb; j++)
                bufs[i][j] &= 1;
        char name[64];
        snprintf(name, sizeof name, "t.%s", safetensors_dtype_name(all[i]));
        T_ASSERT_RC(safetensors_writer_add(w, name, all[i], 2, shape, bufs[i]));
    }
    float src[7] = {1.0f, -2.5f, 3.14159f, 1e-8f, 70000.0f, -0.0f, 1.0f + 1.0f / 256};
    int64_t s7[1] = {7};
    T_ASSERT_RC(safetensors_writer_add_f32_as(w, "conv.bf16", SAFETENSORS_BF16, 1, s7, src));
    T_ASSERT_RC(safetensors_writer_add_f32_as(w, "conv.f16", SAFETENSORS_F16, 1, s7, src));
    T_ASSERT_RC(safetensors_writer_add_f32_as(w, "conv.f32", SAFETENSORS_F32, 1, s7, src));
    T_ASSERT_RC(safetensors_writer_add(w, "empty", SAFETENSORS_F32, 2, (int64_t[]){0, 4}, NULL));
    T_ASSERT_RC(safetensors_writer_add(w, "scalar", SAFETENSORS_U8, 0, NULL, "\x07"));
    T_ASSERT(safetensors_writer_add(w, "scalar", SAFETENSORS_U8, 0, NULL, "\x07") == -EEXIST);
    T_ASSERT(safetensors_writer_add(w, "__metadata__", SAFETENSORS_U8, 0, NULL, "\x07") == -EINVAL);
    T_ASSERT(safetensors_writer_add_f32_as(w, "int", SAFETENSORS_I32, 1, s7, src) == -EINVAL);
    T_ASSERT_RC(safetensors_writer_set_metadata(w, "format", "pt"));
    T_ASSERT_RC(safetensors_writer_set_metadata(w, "step", "12"));
    T_ASSERT_RC(safetensors_writer_write(w, path));
    safetensors_writer_free(w);

    char err[512] = "";
    safetensors_file f;
    int rc = safetensors_open(&f, path, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "%s\n", err);
    T_ASSERT_RC(rc);
    T_ASSERT(f.n_tensors == (int)DF_ARRAY_LEN(all) + 5);
    /* data section starts 8-aligned; each tensor aligned to its element size; no gaps */
    uint64_t hlen;
    memcpy(&hlen, f.map, 8);
    T_ASSERT((8 + hlen) % 8 == 0);
    uint64_t total = 0;
    for (int i = 0; i < f.n_tensors; i++) {
        const safetensors_tensor *t = &f.tensors[i];
        T_ASSERT(t->data_offset % safetensors_dtype_size(t->dtype) == 0);
        total += t->nbytes;
        if (i)
            T_ASSERT(strcmp(f.tensors[i - 1].name, t->name) < 0); /* sorted by name */
    }
    T_ASSERT(total == f.size - 8 - hlen);
    /* the header lists tensors in name order */
    const char *h = (const char *)f.map + 8;
    T_ASSERT(memmem(h, hlen, "\"conv.bf16\"", 11) < memmem(h, hlen, "\"t.BF16\"", 8));
    T_ASSERT(memmem(h, hlen, "\"__metadata__\":{\"format\":\"pt\",\"step\":\"12\"}", 42));
    for (unsigned i = 0; i < DF_ARRAY_LEN(all); i++) {
        char name[64];
        snprintf(name, sizeof name, "t.%s", safetensors_dtype_name(all[i]));
        const safetensors_tensor *t = safetensors_find(&f, name);
        T_ASSERT(t && t->dtype == all[i] && t->ndim == 2 && t->shape[0] == 3 && t->shape[1] == 5);
        T_ASSERT(t->nbytes == 15 * safetensors_dtype_size(all[i]));
        T_ASSERT(memcmp(t->data, bufs[i], t->nbytes) == 0);
        float out[15];
        T_ASSERT_RC(safetensors_tensor_to_f32(t, out));
        free(bufs[i]);
    }
    float out[7];
    const safetensors_tensor *t = safetensors_find(&f, "conv.f32");
    T_ASSERT(t && safetensors_tensor_to_f32(t, out) == 0 && memcmp(out, src, sizeof src) == 0);
    t = safetensors_find(&f, "conv.bf16");
    T_ASSERT(t && safetensors_tensor_to_f32(t, out) == 0);
    for (int i = 0; i < 7; i++)
        T_ASSERT(out[i] == safetensors_bf16_to_f32(safetensors_f32_to_bf16(src[i])));
    T_ASSERT(out[6] == 1.0f); /* RNE tie */
    t = safetensors_find(&f, "conv.f16");
    T_ASSERT(t && safetensors_tensor_to_f32(t, out) == 0);
    T_ASSERT(out[0] == 1.0f && out[1] == -2.5f && isinf(out[4]) && signbit(out[5]));
    T_ASSERT(fabsf(out[2] - 3.14159f) < 2e-3f);
    t = safetensors_find(&f, "empty");
    T_ASSERT(t && t->nbytes == 0 && t->shape[0] == 0 && t->shape[1] == 4);
    t = safetensors_find(&f, "scalar");
    T_ASSERT(t && t->ndim == 0 && t->nbytes == 1 && ((const unsigned char *)t->data)[0] == 7);
    T_ASSERT(safetensors_find(&f, "nope") == NULL);
    safetensors_close(&f);
    safetensors_close(&f); /* idempotent */
    unlink(path);
    printf("round trip: %zu dtypes + converted + empty + scalar + metadata ok\n", DF_ARRAY_LEN(all));
}

static void bad_files(void)
{
    const char *dir = "tests/bad_safetensors";
    char *exp = NULL;
    size_t len;
    T_ASSERT_RC(df_read_file("tests/bad_safetensors/expected.txt", &exp, &len));
    int n = 0;
    for (char *line = strtok(exp, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#')
            continue;
        char *tab = strchr(line, '\t');
        T_ASSERT(tab);
        *tab = '\0';
        const char *want = tab + 1;
        char path[512], err[1024] = "", full[1024];
        snprintf(path, sizeof path, "%s/%s", dir, line);
        safetensors_file f;
        int rc = safetensors_open(&f, path, err, sizeof err);
        if (rc != -EINVAL) {
            fprintf(stderr, "%s: expected -EINVAL, got %d (%s)\n", path, rc, err);
            exit(1);
        }
        T_ASSERT(f.tensors == NULL && f.map == NULL);
        snprintf(full, sizeof full, "%s: %s", path, want);
        size_t wl = strlen(full);
        if (full[wl - 1] == '*') { /* prefix match: the tail is jansson's wording */
            if (strncmp(err, full, wl - 1) != 0) {
                fprintf(stderr, "%s:\n  expected prefix %s\n  got %s\n", path, full, err);
                exit(1);
            }
        } else {
            T_ASSERT_STREQ(err, full);
        }
        n++;
    }
    free(exp);
    /* every crafted file has an expected message */
    DIR *d = opendir(dir);
    T_ASSERT(d);
    int files = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strstr(e->d_name, ".safetensors"))
            files++;
    closedir(d);
    T_ASSERT(files == n);
    T_ASSERT(n >= 12);

    /* safetensors_parse_header directly: the limits that files cannot cheaply show */
    safetensors_tensor *ts = (safetensors_tensor *)1;
    int nt = 5;
    char err[512];
    T_ASSERT(safetensors_parse_header("{}", SAFETENSORS_MAX_HEADER + 1, 0, &ts, &nt, err, sizeof err) == -EINVAL);
    T_ASSERT(ts == NULL && nt == 0);
    T_ASSERT_STREQ(err, "header length 104857601 exceeds the limit of 104857600 bytes");
    T_ASSERT(safetensors_parse_header("{}  ", 4, 0, &ts, &nt, err, sizeof err) == 0 && ts == NULL && nt == 0);
    const char *h = "{\"b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[3,3]},"
                    "\"a\":{\"dtype\":\"I16\",\"shape\":[2],\"data_offsets\":[0,4]}}";
    T_ASSERT(safetensors_parse_header(h, strlen(h), 4, &ts, &nt, err, sizeof err) == 0);
    T_ASSERT(nt == 2 && strcmp(ts[0].name, "a") == 0 && ts[1].data_offset == 3 && ts[1].nbytes == 0);
    free(ts);
    printf("bad files: %d crafted files give their exact messages\n", n);
}

static void write_shard(const char *path, const char *names[], int n, float base)
{
    safetensors_writer *w = safetensors_writer_new();
    float v[4][3];
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < 3; j++)
            v[i][j] = base + (float)(i * 3 + j);
        T_ASSERT_RC(safetensors_writer_add(w, names[i], SAFETENSORS_F32, 1, (int64_t[]){3}, v[i]));
    }
    T_ASSERT_RC(safetensors_writer_write(w, path));
    safetensors_writer_free(w);
}

static void put(const char *dir, const char *name, const char *text)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    T_ASSERT_RC(df_write_file_atomic(p, text, strlen(text)));
}

static void models(void)
{
    char dir[512], p[1200], err[1024];
    snprintf(dir, sizeof dir, "%s/model", tmpdir);
    T_ASSERT(mkdir(dir, 0755) == 0);
    safetensors_model m;
    T_ASSERT(safetensors_model_open(&m, dir, err, sizeof err) == -ENOENT);
    snprintf(p, sizeof p, "%s: neither model.safetensors nor model.safetensors.index.json exists", dir);
    T_ASSERT_STREQ(err, p);

    /* single file */
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    write_shard(p, (const char *[]){"x", "y"}, 2, 0);
    T_ASSERT_RC(safetensors_model_open(&m, dir, err, sizeof err));
    const char *fp = NULL;
    const safetensors_tensor *t = safetensors_model_find(&m, "y", &fp);
    T_ASSERT(t && m.n_files == 1 && strcmp(fp, p) == 0 && ((const float *)t->data)[0] == 3.0f);
    safetensors_model_close(&m);

    /* sharded: the index wins over model.safetensors; each shard opened once */
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    write_shard(p, (const char *[]){"a", "b"}, 2, 100);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    write_shard(p, (const char *[]){"c"}, 1, 200);
    put(dir, "model.safetensors.index.json",
        "{\"metadata\": {\"total_size\": 36}, \"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", "
        "\"c\": \"model-00002-of-00002.safetensors\", \"b\": \"model-00001-of-00002.safetensors\"}}");
    T_ASSERT_RC(safetensors_model_open(&m, dir, err, sizeof err));
    T_ASSERT(m.n_files == 2);
    t = safetensors_model_find(&m, "c", &fp);
    T_ASSERT(t && ((const float *)t->data)[2] == 202.0f && strstr(fp, "model-00002-of-00002"));
    T_ASSERT(safetensors_model_find(&m, "x", NULL) == NULL);
    safetensors_model_close(&m);
    safetensors_model_close(&m);

    /* missing shard: the message names the file */
    put(dir, "model.safetensors.index.json",
        "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", \"z\": \"model-00003-of-00003.safetensors\"}}");
    T_ASSERT(safetensors_model_open(&m, dir, err, sizeof err) == -ENOENT);
    snprintf(p, sizeof p, "%s/model-00003-of-00003.safetensors: cannot open: No such file or directory", dir);
    T_ASSERT_STREQ(err, p);
    /* an index that puts a tensor in the wrong shard */
    put(dir, "model.safetensors.index.json", "{\"weight_map\": {\"c\": \"model-00001-of-00002.safetensors\"}}");
    T_ASSERT(safetensors_model_open(&m, dir, err, sizeof err) == -EINVAL);
    snprintf(p, sizeof p,
             "%s/model.safetensors.index.json: weight_map puts tensor \"c\" in model-00001-of-00002.safetensors, "
             "which has no such tensor",
             dir);
    T_ASSERT_STREQ(err, p);
    /* path escapes and bad JSON */
    put(dir, "model.safetensors.index.json", "{\"weight_map\": {\"c\": \"../x.safetensors\"}}");
    T_ASSERT(safetensors_model_open(&m, dir, err, sizeof err) == -EINVAL);
    T_ASSERT(strstr(err, "weight_map[\"c\"]: \"../x.safetensors\" is not a file name in the model directory"));
    put(dir, "model.safetensors.index.json", "{\"weight_map\": [1]}");
    T_ASSERT(safetensors_model_open(&m, dir, err, sizeof err) == -EINVAL);
    T_ASSERT(strstr(err, "model.safetensors.index.json: weight_map: expected an object, got an array"));
    put(dir, "model.safetensors.index.json", "{\"weight_map\": ");
    T_ASSERT(safetensors_model_open(&m, dir, err, sizeof err) == -EINVAL);
    T_ASSERT(strstr(err, "model.safetensors.index.json: line 1 column"));
    printf("model dirs: single, sharded, missing shard, lying index ok\n");
}

static void atomic_write(void)
{
    char path[512], tmp[600];
    snprintf(path, sizeof path, "%s/atomic.safetensors", tmpdir);
    write_shard(path, (const char *[]){"old"}, 1, 1);
    /* a write that cannot complete (the target is a non-empty directory) */
    char bad[512];
    snprintf(bad, sizeof bad, "%s/model", tmpdir);
    safetensors_writer *w = safetensors_writer_new();
    float v = 5;
    T_ASSERT_RC(safetensors_writer_add(w, "new", SAFETENSORS_F32, 0, NULL, &v));
    int rc = safetensors_writer_write(w, bad);
    T_ASSERT(rc == -EISDIR || rc == -ENOTEMPTY || rc == -EEXIST);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", bad, (int)getpid());
    T_ASSERT(access(tmp, F_OK) < 0); /* the temp file is gone */
    /* overwrite keeps the file valid and replaces the content */
    T_ASSERT_RC(safetensors_writer_write(w, path));
    safetensors_writer_free(w);
    safetensors_file f;
    char err[512];
    T_ASSERT_RC(safetensors_open(&f, path, err, sizeof err));
    T_ASSERT(f.n_tensors == 1 && safetensors_find(&f, "new") && !safetensors_find(&f, "old"));
    safetensors_close(&f);
    printf("atomic write: failed write cleans up, overwrite ok\n");
}

/* a FIFO (the open must return, not wait for a writer), a device and a directory named like
 * a model file are refused naming what they are */
static void not_regular(void)
{
    char fifo[600], sub[600], err[1024], want[1200];
    snprintf(fifo, sizeof fifo, "%s/fifo.safetensors", tmpdir);
    snprintf(sub, sizeof sub, "%s/dir.safetensors", tmpdir);
    T_ASSERT(mkfifo(fifo, 0600) == 0 && mkdir(sub, 0700) == 0);
    const char *paths[] = {fifo, "/dev/null", sub};
    const char *kinds[] = {"a FIFO (named pipe)", "a character device", "a directory"};
    for (int i = 0; i < 3; i++) {
        safetensors_file f;
        T_ASSERT(safetensors_open(&f, paths[i], err, sizeof err) == -EINVAL);
        snprintf(want, sizeof want, "%s: is %s, not a regular file", paths[i], kinds[i]);
        T_ASSERT_STREQ(err, want);
        safetensors_close(&f);
    }
    unlink(fifo);
    rmdir(sub);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_safetensors.XXXXXX");
    T_ASSERT(mkdtemp(tmpdir));
    conversions();
    round_trip();
    bad_files();
    models();
    atomic_write();
    not_regular();
    rm_rf(tmpdir);
    printf("test_safetensors: ok\n");
    return 0;
}
