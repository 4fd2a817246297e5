/* test_model_dir.h: what the C tests that write model directories into a scratch
 * directory and load them share (test_target_cpu, test_target_moe, test_safetensors,
 * gpu_test_moe): write_text (config.json, a shard index), rm_rf (the scratch tree, walked
 * here: no shell), and for the target tests load_ok (target_load, or exit 1 with its
 * message) and max_abs_diff. Header-only (static inline): each test is one file. */
#ifndef DF_TEST_MODEL_DIR_H
#define DF_TEST_MODEL_DIR_H

#include "target/target_model.h"
#include "util.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* dir/name := text, written atomically; exit 1 naming the file when that fails */
static inline void write_text(const char *dir, const char *name, const char *text)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int rc = df_write_file_atomic(p, text, strlen(text));
    if (rc < 0) {
        fprintf(stderr, "writing %s: %s\n", p, strerror(-rc));
        exit(1);
    }
}

/* remove dir and everything under it (best effort: a scratch tree the test made) */
static inline void rm_rf(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char p[1024];
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p)
            continue; /* never a cut path: it could name another file */
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
            rm_rf(p);
        else
            unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static inline double max_abs_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

/* target_load of dir with the n capture layers cap; on failure print its message, exit 1 */
static inline void load_ok(target_model *m, const char *dir, const int *cap, int n)
{
    char err[1024] = "";
    int rc = target_load(m, dir, cap, n, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "target_load %s: returned %d: %s\n", dir, rc, err);
        exit(1);
    }
}

#endif
