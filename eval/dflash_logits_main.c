/* dflash_logits: the block logits our drafter inference (dflash_infer, eval/dflash_infer.h)
 * computes for given inputs, written to a file, so that another implementation (the
 * transformers classes of tests/reference/engine_load_check.py, the float64 PyTorch
 * reference) can be compared with it on the same numbers (docs/export.md).
 *
 *   dflash_logits --target DIR --drafter DIR --in IN.safetensors --out OUT.safetensors
 *
 * IN holds
 *   H        [S, n*d]  captured target features of positions 0..S-1 (F32 / BF16 / F16),
 *                      in the drafter's capture order (dflash_config.target_layer_ids)
 *   tokens   [S]       token ids (any integer or float dtype holding integers)
 *   anchors  [N]       optional: anchor positions, ascending, each in 1..S-1; default one
 *                      anchor at S-1 (the layout of a release's reference.safetensors)
 * For anchor p the drafter sees context rows 0..p-1 (features H[0..p-1]) and drafts the
 * block [tokens[p], MASK x (B-1)] at positions p..p+B-1. OUT holds
 *   logits   [N, B-1, V] F32: block rows 1..B-1 times the target's lm_head
 *   anchors  [N] I32
 * Only the target's embedding and lm_head are read (target_load_embeddings), not its layers.
 *
 * Exit codes: 0 written; 1 temporary (memory, I/O); 2 bad command line; 100 bad target,
 * drafter or input file (the message names the file and the tensor or field). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dflash/dflash_config.h"
#include "dflash/dflash_model.h"
#include "eval/dflash_infer.h"
#include "eval/eval_pair.h"
#include "io/safetensors.h"
#include "target/target_model.h"
#include "util.h"

static void logits_usage(FILE *f)
{
    fprintf(f, "usage: dflash_logits --target DIR --drafter DIR --in IN.safetensors --out OUT.safetensors\n"
               "  --target DIR    the target model (its embedding and lm_head are read)\n"
               "  --drafter DIR   a release-format drafter or one of our checkpoints (root or step dir)\n"
               "  --in FILE       H [S, n*d], tokens [S], optional anchors [N] (default: one anchor at S-1)\n"
               "  --out FILE      logits [N, B-1, V] F32 and anchors [N] I32\n"
               "exit codes: 0 done, 1 temporary failure, 2 bad command line, 100 bad target/drafter/input\n");
}

/* A tensor of IN as fp32 (allocated), with its rank checked. */
static float *logits_read(const safetensors_file *f, const char *name, int ndim, int required, int64_t *shape)
{
    const safetensors_tensor *t = safetensors_find(f, name);
    if (!t) {
        if (required)
            df_die(DF_EXIT_PERM, "%s: tensor \"%s\" missing", f->path, name);
        return NULL;
    }
    if (t->ndim != ndim)
        df_die(DF_EXIT_PERM, "%s: tensor \"%s\" has %d dimensions, expected %d", f->path, name, t->ndim, ndim);
    int64_t n = safetensors_numel(t);
    float *v = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!v)
        df_die(DF_EXIT_TEMP, "out of memory");
    if (safetensors_tensor_to_f32(t, v) < 0)
        df_die(DF_EXIT_PERM, "%s: tensor \"%s\": dtype %s cannot be read", f->path, name,
               safetensors_dtype_name(t->dtype));
    for (int k = 0; k < ndim; k++)
        shape[k] = t->shape[k];
    return v;
}

int main(int argc, char **argv)
{
    df_log_init("dflash_logits");
    const char *target = NULL, *drafter = NULL, *in = NULL, *out = NULL;
    static const struct option lo[] = {{"target", required_argument, 0, 't'}, {"drafter", required_argument, 0, 'd'},
                                       {"in", required_argument, 0, 'i'},     {"out", required_argument, 0, 'o'},
                                       {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 't': target = optarg; break;
        case 'd': drafter = optarg; break;
        case 'i': in = optarg; break;
        case 'o': out = optarg; break;
        case 'h': logits_usage(stdout); return DF_EXIT_OK;
        default: logits_usage(stderr); return DF_EXIT_USAGE;
        }
    }
    if (optind != argc || !target || !drafter || !in || !out) {
        fprintf(stderr, "dflash_logits: --target, --drafter, --in and --out are required%s\n",
                optind != argc ? " (and nothing else)" : "");
        logits_usage(stderr);
        return DF_EXIT_USAGE;
    }
    char err[1024] = "", cfgf[4200];
    int rc;
    dflash_config c;
    dflash_params p;
    /* our checkpoint (root or step dir) or a release dir; cfgf: the file its config came from */
    if ((rc = pair_load_drafter(drafter, &c, &p, cfgf, sizeof cfgf, err, sizeof err)) < 0)
        df_die(rc == -ENOMEM ? DF_EXIT_TEMP : DF_EXIT_PERM, "%s", err);
    target_embeddings e;
    if ((rc = target_load_embeddings(&e, target, 0, err, sizeof err)) < 0)
        df_die(target_exit_code(rc), "%s", err);
    if (e.hidden != c.hidden || e.vocab != c.vocab)
        df_die(DF_EXIT_PERM, "%s: hidden_size %d / vocab_size %d do not match the target %s/config.json (%d / %d)",
               cfgf, c.hidden, c.vocab, target, e.hidden, e.vocab);

    safetensors_file f;
    if ((rc = safetensors_open(&f, in, err, sizeof err)) < 0)
        df_die(rc == -ENOMEM ? DF_EXIT_TEMP : DF_EXIT_PERM, "%s", err);
    int64_t sh[2], st[1], sa[1];
    float *H = logits_read(&f, "H", 2, 1, sh);
    float *tok = logits_read(&f, "tokens", 1, 1, st);
    float *anc = logits_read(&f, "anchors", 1, 0, sa);
    int S = (int)sh[0], B = c.block_size, V = c.vocab;
    if (sh[1] != (int64_t)c.n_capture * c.hidden)
        df_die(DF_EXIT_PERM, "%s: H is [%lld, %lld], the drafter takes %d captured layers of %d = %d columns", in,
               (long long)sh[0], (long long)sh[1], c.n_capture, c.hidden, c.n_capture * c.hidden);
    if (st[0] != S || S < 2)
        df_die(DF_EXIT_PERM, "%s: tokens has %lld entries, H %d rows (both must be the same, >= 2)", in,
               (long long)st[0], S);
    int N = anc ? (int)sa[0] : 1;
    int32_t *anchors = malloc(sizeof(int32_t) * (size_t)(N > 0 ? N : 1));
    if (!anchors)
        df_die(DF_EXIT_TEMP, "out of memory");
    if (N < 1)
        df_die(DF_EXIT_PERM, "%s: anchors is empty", in);
    for (int j = 0; j < N; j++) {
        float a = anc ? anc[j] : (float)(S - 1);
        if (a != (float)(int)a || a < 1 || a > S - 1 || (j > 0 && (int)a <= anchors[j - 1]))
            df_die(DF_EXIT_PERM, "%s: anchors[%d] = %g: anchors must be ascending integers in 1..%d", in, j, a, S - 1);
        anchors[j] = (int32_t)a;
    }
    for (int j = 0; j < N; j++) {
        float t = tok[anchors[j]];
        if (t != (float)(int)t || t < 0 || t >= V)
            df_die(DF_EXIT_PERM, "%s: tokens[%d] = %g is not a token id in 0..%d", in, anchors[j], t, V - 1);
    }

    dflash_frozen fr = {.embed = e.embed, .lm_head = e.lm_head};
    infer_state s;
    if ((rc = infer_init(&s, &c, &p, &fr, S)) < 0)
        df_die(DF_EXIT_TEMP, "infer_init: %s", strerror(-rc));
    size_t row = (size_t)(B - 1) * (size_t)V;
    float *logits = malloc(sizeof(float) * row * (size_t)N);
    int32_t *draft = malloc(sizeof(int32_t) * (size_t)B);
    if (!logits || !draft)
        df_die(DF_EXIT_TEMP, "out of memory");
    size_t w = (size_t)c.n_capture * (size_t)c.hidden;
    for (int j = 0; j < N; j++) { /* the context grows to each anchor in turn, as in decoding */
        int have = s.n_ctx, want = anchors[j];
        if ((rc = infer_append(&s, H + (size_t)have * w, want - have)) < 0)
            df_die(DF_EXIT_TEMP, "infer_append: %s", strerror(-rc));
        if ((rc = infer_draft(&s, (int32_t)tok[want], draft)) < 0)
            df_die(DF_EXIT_TEMP, "infer_draft: %s", strerror(-rc));
        memcpy(logits + row * (size_t)j, s.logits, sizeof(float) * row);
    }

    safetensors_writer *wr = safetensors_writer_new();
    if (!wr)
        df_die(DF_EXIT_TEMP, "out of memory");
    int64_t ls[3] = {N, B - 1, V}, as[1] = {N};
    if ((rc = safetensors_writer_add(wr, "logits", SAFETENSORS_F32, 3, ls, logits)) < 0 ||
        (rc = safetensors_writer_add(wr, "anchors", SAFETENSORS_I32, 1, as, anchors)) < 0 ||
        (rc = safetensors_writer_set_metadata(wr, "format", "pt")) < 0 || (rc = safetensors_writer_write(wr, out)) < 0)
        df_die(DF_EXIT_TEMP, "%s: %s", out, strerror(-rc));
    safetensors_writer_free(wr);
    fprintf(stderr, "dflash_logits: %d block(s) of %d rows over up to %d context rows -> %s\n", N, B - 1,
            anchors[N - 1], out);

    infer_free(&s);
    safetensors_close(&f);
    target_embeddings_free(&e);
    dflash_params_free(&p);
    free(H), free(tok), free(anc), free(anchors), free(logits), free(draft);
    return DF_EXIT_OK;
}
