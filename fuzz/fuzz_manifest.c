/* fuzz_manifest.c: libFuzzer target for dflash_manifest_verify, which reads a checkpoint
 * step directory's manifest.json before every load of it (each --resume, dflash_tool,
 * dflash_eval). Input: the manifest's text. Once per process the harness makes a private
 * temp directory holding step-00000007 with the three checkpoint files of fixed content
 * (make_step_dir); each input is written over its manifest.json and the directory verified.
 * The seeds' pieces are 4096 bytes, so the two safetensors files span 2 and 3 of them.
 *
 * Beyond "no crash, no sanitizer report", the oracle. A refusal is -EINVAL (the directory
 * is intact, so nothing may pass for a temporary I/O error) with a message naming a file
 * of the step directory. An accepted manifest, read again with jansson, is an object with
 * "format" "dflash-pipe-checkpoint-manifest", "version" a JSON integer equal to 1 or 2 (not
 * one that merely casts to it), "step" an integer equal to the step returned and to the
 * directory's 7, and "files" listing the three files (all of them exist) and nothing else,
 * each with its real size; version 1: "sha256" the file's own digest; version 2: one entry
 * of "sha256_pieces" per piece of "piece_bytes", each the digest of that piece. The stats
 * agree (version, 3 files, their bytes, the pieces hashed). Version 2's whole-file "sha256"
 * is for sha256sum by hand: verify checks only that it is 64 hex digits (hashing the file
 * whole would serialise what the pieces spread over every core), so the oracle does too.
 *
 * Built with -DFUZZ_MANIFEST_SEEDS it is instead a program that writes seed manifests for
 * that directory (version 2 by dflash_manifest_write, version 1 by hand, and ones a resume
 * must refuse) into the directory it is given (scripts/fuzz.sh).
 * Run with scripts/fuzz.sh (make fuzz).
 */
#include "fuzz/fuzz.h"
#include "dflash/dflash_manifest.h"

#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#define STEP 7
#define PIECE 4096

/* The sizes of model.safetensors and optimizer.safetensors: pieces of 4096, the last short. */
enum { MODEL_BYTES = 5000, OPTIMIZER_BYTES = 9000 };

static const char trainer_state[] = "{\"format\": \"dflash-pipe-trainer-state\", \"version\": 1, \"step\": 7}\n";

/* The content of file i of dflash_manifest_files: the same in every process, so that the
 * digests of the seeds one process writes hold in the fuzzer's. */
static const uint8_t *file_bytes(size_t i, uint64_t *len)
{
    static uint8_t model[MODEL_BYTES], optimizer[OPTIMIZER_BYTES];
    static int made;
    if (!made) { /* a fixed xorshift stream, so no piece repeats another */
        uint32_t x = 2463534242u;
        for (size_t k = 0; k < sizeof model + sizeof optimizer; k++) {
            x ^= x << 13, x ^= x >> 17, x ^= x << 5;
            if (k < sizeof model)
                model[k] = (uint8_t)x;
            else
                optimizer[k - sizeof model] = (uint8_t)x;
        }
        made = 1;
    }
    switch (i) {
    case DFLASH_MANIFEST_MODEL: *len = sizeof model; return model;
    case DFLASH_MANIFEST_OPTIMIZER: *len = sizeof optimizer; return optimizer;
    default: *len = sizeof trainer_state - 1; return (const uint8_t *)trainer_state;
    }
}

/* dir, a step directory with the three checkpoint files and no manifest yet. */
static void make_step_dir(const char *dir)
{
    if (mkdir(dir, 0700) < 0)
        fuzz_die("cannot make", dir);
    for (size_t i = 0; i < DFLASH_MANIFEST_FILES; i++) {
        char path[4300];
        uint64_t len;
        const uint8_t *b = file_bytes(i, &len);
        snprintf(path, sizeof path, "%s/%s", dir, dflash_manifest_files[i]);
        fuzz_write_file(path, b, (size_t)len);
    }
}

static char g_step[4200]; /* step-00000007 in the private temp directory */

/* Once per process: the temp directory (removed at exit) and its step directory. */
static void setup(void)
{
    snprintf(g_step, sizeof g_step, "%s/step-%08d", fuzz_tmpdir("fuzz_manifest"), STEP);
    make_step_dir(g_step);
    dflash_manifest_piece_bytes(PIECE); /* what the seed writer's dflash_manifest_write uses */
}

/* The digest of bytes [off, off + len) of b, as hex. */
static void digest(const uint8_t *b, uint64_t off, uint64_t len, char hex[65])
{
    if (df_sha256_buf(b + off, (size_t)len, hex) < 0)
        abort(); /* out of memory: not a finding of the parser */
}

#ifndef FUZZ_MANIFEST_SEEDS
int fuzz_accepted; /* inputs the parser accepted (fuzz/replay_main.c prints it) */

/* 1 when j is a JSON string of 64 characters equal to hex, case aside. */
static int same_hex(const json_t *j, const char *hex)
{
    const char *s = json_string_value(j);
    return s && json_string_length(j) == 64 && strcasecmp(s, hex) == 0;
}

/* 1 when j is a JSON string of 64 hex digits. */
static int is_hex64(const json_t *j)
{
    const char *s = json_string_value(j);
    if (!s || json_string_length(j) != 64)
        return 0;
    for (size_t k = 0; k < 64; k++)
        if (!((s[k] >= '0' && s[k] <= '9') || (s[k] >= 'a' && s[k] <= 'f') || (s[k] >= 'A' && s[k] <= 'F')))
            return 0;
    return 1;
}

/* An accepted manifest, read again: what verify promised of it holds for the real files. */
static void check_accepted(const uint8_t *data, size_t size, long step, const dflash_manifest_stats *st)
{
    json_error_t je;
    json_t *m = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &je);
    ORACLE(json_is_object(m));
    const json_t *jv = json_object_get(m, "version"), *js = json_object_get(m, "step");
    const json_t *files = json_object_get(m, "files");
    if (!(json_is_integer(jv) && (json_integer_value(jv) == 1 || json_integer_value(jv) == 2)))
        fprintf(stderr, "accepted a manifest whose \"version\" is not the integer 1 or 2\n");
    ORACLE(json_is_integer(jv) && (json_integer_value(jv) == 1 || json_integer_value(jv) == 2));
    int version = (int)json_integer_value(jv);
    const char *format = json_string_value(json_object_get(m, "format"));
    ORACLE(format && strcmp(format, "dflash-pipe-checkpoint-manifest") == 0);
    ORACLE(json_is_integer(js) && json_integer_value(js) == step && step == STEP);
    ORACLE(json_is_object(files) && json_object_size(files) == DFLASH_MANIFEST_FILES);
    uint64_t total = 0, pieces = 0;
    for (size_t i = 0; i < DFLASH_MANIFEST_FILES; i++) {
        const json_t *e = json_object_get(files, dflash_manifest_files[i]);
        const json_t *jb = json_object_get(e, "bytes");
        uint64_t len;
        const uint8_t *b = file_bytes(i, &len);
        ORACLE(json_is_integer(jb) && json_integer_value(jb) >= 0 && (uint64_t)json_integer_value(jb) == len);
        ORACLE(is_hex64(json_object_get(e, "sha256")));
        total += len;
        char hex[65];
        if (version == 1) {
            digest(b, 0, len, hex);
            if (!same_hex(json_object_get(e, "sha256"), hex))
                fprintf(stderr, "accepted %s with a digest not its own\n", dflash_manifest_files[i]);
            ORACLE(same_hex(json_object_get(e, "sha256"), hex));
            pieces++;
            continue;
        }
        const json_t *jp = json_object_get(e, "piece_bytes"), *arr = json_object_get(e, "sha256_pieces");
        ORACLE(json_is_integer(jp) && json_integer_value(jp) >= PIECE);
        uint64_t p = (uint64_t)json_integer_value(jp), n = len / p + (len % p != 0);
        ORACLE(json_is_array(arr) && json_array_size(arr) == n);
        for (uint64_t k = 0; k < n; k++) {
            uint64_t off = k * p;
            digest(b, off, len - off < p ? len - off : p, hex);
            if (!same_hex(json_array_get(arr, (size_t)k), hex))
                fprintf(stderr, "accepted %s with piece %llu's digest not its own\n", dflash_manifest_files[i],
                        (unsigned long long)k);
            ORACLE(same_hex(json_array_get(arr, (size_t)k), hex));
        }
        pieces += n;
    }
    ORACLE(st->version == version && st->files == DFLASH_MANIFEST_FILES && st->bytes == total);
    ORACLE(st->pieces == pieces);
    json_decref(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_step[0])
        setup();
    char mpath[4300];
    snprintf(mpath, sizeof mpath, "%s/manifest.json", g_step);
    fuzz_write_file(mpath, data, size);
    long step = -1;
    dflash_manifest_stats st;
    char err[1024] = "";
    int rc = dflash_manifest_verify(g_step, &step, &st, err, sizeof err);
    if (rc < 0) {
        if (rc != -EINVAL)
            fprintf(stderr, "refused with %d (%s), not -EINVAL: %s\n", rc, strerror(-rc), err);
        ORACLE(rc == -EINVAL);
        ORACLE(err[0] != 0 && strstr(err, g_step) != NULL);
        return 0;
    }
    fuzz_accepted++;
    check_accepted(data, size, step, &st);
    return 0;
}
#else
/* the seed writer: manifests of the harness's step directory, good and bad */
static const char *g_out; /* the directory the seeds go to */

static void write_seed(const char *name, const json_t *m)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", g_out, name);
    if (json_dump_file(m, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0)
        fuzz_die("cannot write", path);
}

/* A copy of m with member key of files.<file> (of m itself when file is NULL) set to v,
 * written as seed name. */
static void write_edited(const char *name, const json_t *m, const char *file, const char *key, json_t *v)
{
    json_t *c = json_deep_copy(m);
    ORACLE(c);
    json_t *o = file ? json_object_get(json_object_get(c, "files"), file) : c;
    ORACLE(o);
    ORACLE(v && json_object_set_new(o, key, v) == 0);
    write_seed(name, c);
    json_decref(c);
}

/* hex with its first digit changed: a digest that is well formed but wrong */
static json_t *wrong_digest(const json_t *j)
{
    char hex[65];
    ORACLE(json_string_length(j) == 64);
    memcpy(hex, json_string_value(j), sizeof hex);
    hex[0] = hex[0] == '0' ? '1' : '0';
    return json_string(hex);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\nWrites seed checkpoint manifests into DIR.\n", argv[0]);
        return 2;
    }
    g_out = argv[1];
    setup();
    char err[1024] = "", mpath[4300];
    dflash_manifest_sum none[DFLASH_MANIFEST_FILES];
    memset(none, 0, sizeof none); /* no digests at hand: dflash_manifest_write reads the files */
    if (dflash_manifest_write(g_step, STEP, none, err, sizeof err) < 0) {
        fprintf(stderr, "fuzz_manifest: dflash_manifest_write: %s\n", err);
        return 1;
    }
    snprintf(mpath, sizeof mpath, "%s/manifest.json", g_step);
    json_error_t je;
    json_t *v2 = json_load_file(mpath, JSON_REJECT_DUPLICATES, &je);
    if (!v2) {
        fprintf(stderr, "fuzz_manifest: %s: line %d: %s\n", mpath, je.line, je.text);
        return 1;
    }
    write_seed("v2.json", v2);
    /* version 1, as builds before the pieces wrote it: whole-file digests only */
    json_t *files = json_object();
    ORACLE(files);
    for (size_t i = 0; i < DFLASH_MANIFEST_FILES; i++) {
        uint64_t len;
        const uint8_t *b = file_bytes(i, &len);
        char hex[65];
        digest(b, 0, len, hex);
        ORACLE(json_object_set_new(files, dflash_manifest_files[i],
                                   json_pack("{s:I, s:s}", "bytes", (json_int_t)len, "sha256", hex)) == 0);
    }
    json_t *v1 = json_pack("{s:s, s:i, s:i, s:o}", "format", "dflash-pipe-checkpoint-manifest", "version", 1, "step",
                           STEP, "files", files);
    ORACLE(v1);
    write_seed("v1.json", v1);
    /* what a resume must refuse */
    const char *model = dflash_manifest_files[DFLASH_MANIFEST_MODEL];
    const char *opt = dflash_manifest_files[DFLASH_MANIFEST_OPTIMIZER];
    const json_t *v2_model = json_object_get(json_object_get(v2, "files"), model);
    const json_t *v1_opt = json_object_get(json_object_get(v1, "files"), opt);
    json_t *pieces = json_deep_copy(json_object_get(v2_model, "sha256_pieces"));
    ORACLE(pieces && json_array_size(pieces) == 2);
    ORACLE(json_array_set_new(pieces, 1, wrong_digest(json_array_get(pieces, 1))) == 0);
    write_edited("bad_v2_piece_digest.json", v2, model, "sha256_pieces", pieces);
    write_edited("bad_v1_digest.json", v1, opt, "sha256", wrong_digest(json_object_get(v1_opt, "sha256")));
    write_edited("bad_size.json", v2, opt, "bytes", json_integer(OPTIMIZER_BYTES + 1)); /* still 3 pieces */
    json_t *fewer = json_deep_copy(json_object_get(v2, "files"));
    ORACLE(fewer && json_object_del(fewer, dflash_manifest_files[DFLASH_MANIFEST_STATE]) == 0);
    write_edited("bad_file_missing.json", v2, NULL, "files", fewer);
    json_t *more = json_deep_copy(json_object_get(v2, "files"));
    ORACLE(more && json_object_set(more, "extra.safetensors", json_object_get(more, model)) == 0);
    write_edited("bad_unknown_file.json", v2, NULL, "files", more);
    write_edited("bad_step.json", v2, NULL, "step", json_integer(STEP + 1)); /* the directory says 7 */
    write_edited("bad_version_3.json", v2, NULL, "version", json_integer(3));
    /* 2^32 + 1, which a cast to int reads as 1: a version 1 manifest otherwise */
    write_edited("bad_version_wrap.json", v1, NULL, "version", json_integer(4294967297ll));
    char path[4200];
    snprintf(path, sizeof path, "%s/bad_not_json.json", g_out);
    static const char cut[] = "{\"format\": ";
    fuzz_write_file(path, cut, sizeof cut - 1);
    json_decref(v1);
    json_decref(v2);
    return 0;
}
#endif
