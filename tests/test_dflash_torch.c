/* test_dflash_torch.c: the C drafter (common/dflash/dflash_*) against an independent
 * PyTorch implementation written from docs/dflash_spec.md (tests/reference/dflash_torch.py), on one
 * fixed batch computed there in float64: the loss, the per-position accuracy, the forward
 * output z, and the gradient of the loss w.r.t. every trainable tensor and w.r.t. the
 * captured target features H. docs/drafter_torch.md says why and how.
 *
 * The fixtures are made on a machine with torch (none here):
 *   python3 tests/reference/dflash_torch.py fixture --out tests/fixtures/dflash-torch.safetensors
 * which also writes dflash-torch-tied.safetensors (tied embeddings, other mask rules), and
 *   python3 tests/reference/dflash_torch.py fixture --loss dpace --out tests/fixtures/dflash-torch-dpace.safetensors
 * the same two cases under the D-PACE objective (config "loss": "dpace", "dpace_alpha"; alpha
 * 0.5 untied, 0.3 tied), with the expected position weights ("dpace_weights") and the
 * normaliser ("dpace_norm": blocks with a loss position) besides.
 * Without the first one the test is SKIPPED (exit 77); the others are checked when present.
 *
 * The fixture holds the config as JSON in the safetensors metadata ("config"), the
 * weights under their release names (F32), "embed_tokens" and (untied) "lm_head", the
 * batch (H, input_ids, loss_mask, anchors, keep) and the expected outputs (loss F64,
 * acc/acc_count, labels, weights, z, grad.<name>, grad.H). Anchors are given, not sampled:
 * dflash_batch_set_anchors replays them.
 *
 * Tolerances (float32 C vs float64 truth), the same for both objectives: loss rel 1e-5; z
 * rel 1e-5 (whole tensor, ||got - ref|| / ||ref||); every gradient rel 1e-4; labels exact;
 * weights rel 1e-6; D-PACE weights rel 1e-5 (products of exp(-CE) of fp32 logits) and
 * normaliser exact; accuracies and counts exact (the fixture's argmax margins are far above
 * fp32 noise). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dflash/dflash_batch.h"
#include "dflash/dflash_config.h"
#include "dflash/dflash_loss.h"
#include "dflash/dflash_model.h"
#include "io/safetensors.h"
#include "test_helpers.h"

#define FIXTURE "tests/fixtures/dflash-torch.safetensors"
#define FIXTURE_TIED "tests/fixtures/dflash-torch-tied.safetensors"
#define FIXTURE_DPACE "tests/fixtures/dflash-torch-dpace.safetensors"
#define FIXTURE_DPACE_TIED "tests/fixtures/dflash-torch-dpace-tied.safetensors"

static int g_fail; /* failed checks of the current fixture */

/* A tensor that must exist with this dtype and shape (d1 < 0: 1-D); exits naming it. */
static const safetensors_tensor *need(const safetensors_file *f, const char *name, safetensors_dtype dt, int64_t d0,
                                      int64_t d1)
{
    const safetensors_tensor *t = safetensors_find(f, name);
    if (!t) {
        fprintf(stderr, "%s: tensor \"%s\" missing\n", f->path, name);
        exit(1);
    }
    int ndim = d1 < 0 ? 1 : 2;
    if (t->dtype != dt || t->ndim != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1)) {
        fprintf(stderr, "%s: tensor \"%s\": expected %s [%lld%s%lld], got %s ndim %d [%lld, %lld]\n", f->path, name,
                safetensors_dtype_name(dt), (long long)d0, ndim == 2 ? ", " : "", ndim == 2 ? (long long)d1 : 0LL,
                safetensors_dtype_name(t->dtype), t->ndim, (long long)t->shape[0],
                t->ndim > 1 ? (long long)t->shape[1] : 0LL);
        exit(1);
    }
    return t;
}

static float *load_f32(const safetensors_file *f, const char *name, int64_t d0, int64_t d1)
{
    const safetensors_tensor *t = need(f, name, SAFETENSORS_F32, d0, d1);
    float *v = malloc(t->nbytes > 0 ? t->nbytes : 1);
    T_ASSERT(v);
    memcpy(v, t->data, t->nbytes);
    return v;
}

static int32_t *load_i32(const safetensors_file *f, const char *name, int64_t n)
{
    const safetensors_tensor *t = need(f, name, SAFETENSORS_I32, n, -1);
    int32_t *v = malloc(t->nbytes > 0 ? t->nbytes : 1);
    T_ASSERT(v);
    memcpy(v, t->data, t->nbytes);
    return v;
}

static double load_f64_scalar(const safetensors_file *f, const char *name)
{
    const safetensors_tensor *t = need(f, name, SAFETENSORS_F64, 1, -1);
    double x;
    memcpy(&x, t->data, sizeof(x));
    return x;
}

/* One row of the table: ||got - ref|| / ||ref|| (plain ||got - ref|| when ref is 0). */
static void check_rel(const char *what, const float *got, const float *ref, size_t n, double tol)
{
    double dd = 0, rr = 0;
    int finite = 1;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]))
            finite = 0;
        double e = (double)got[i] - (double)ref[i];
        dd += e * e;
        rr += (double)ref[i] * ref[i];
    }
    double rel = rr > 0 ? sqrt(dd / rr) : sqrt(dd);
    int ok = finite && rel < tol;
    printf("  %-46s %8zu  %10.3e  %9.2e  %s\n", what, n, sqrt(rr), rel, ok ? "ok" : "FAIL");
    g_fail += !ok;
}

static void check_scalar(const char *what, double got, double ref, double tol)
{
    double rel = fabs(got - ref) / (fabs(ref) > 0 ? fabs(ref) : 1.0);
    int ok = isfinite(got) && rel < tol;
    printf("  %-46s %.10f vs torch %.10f  rel %.2e  %s\n", what, got, ref, rel, ok ? "ok" : "FAIL");
    g_fail += !ok;
}

static int json_int(const json_t *o, const char *key, const char *path)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) {
        fprintf(stderr, "%s: metadata config: \"%s\" missing or not an integer\n", path, key);
        exit(1);
    }
    return (int)json_integer_value(v);
}

static double json_num(const json_t *o, const char *key, const char *path)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) {
        fprintf(stderr, "%s: metadata config: \"%s\" missing or not a number\n", path, key);
        exit(1);
    }
    return json_number_value(v);
}

/* The "config" string of the safetensors "__metadata__", parsed: new reference. */
static json_t *read_config(const safetensors_file *f)
{
    uint64_t hlen;
    T_ASSERT(f->size >= 8);
    memcpy(&hlen, f->map, 8); /* little-endian host (x86-64, aarch64) */
    T_ASSERT(hlen <= f->size - 8);
    json_error_t je;
    json_t *hdr = json_loadb((const char *)f->map + 8, (size_t)hlen, 0, &je);
    if (!hdr) {
        fprintf(stderr, "%s: header JSON: %s\n", f->path, je.text);
        exit(1);
    }
    const char *s = json_string_value(json_object_get(json_object_get(hdr, "__metadata__"), "config"));
    if (!s) {
        fprintf(stderr, "%s: no __metadata__.config string\n", f->path);
        exit(1);
    }
    json_t *cfg = json_loads(s, 0, &je);
    if (!cfg || !json_is_object(cfg)) {
        fprintf(stderr, "%s: __metadata__.config is not a JSON object: %s\n", f->path, cfg ? "" : je.text);
        exit(1);
    }
    json_decref(hdr);
    return cfg;
}

static void config_from_json(dflash_config *c, const json_t *o, const char *path)
{
    memset(c, 0, sizeof(*c));
    c->hidden = json_int(o, "d", path);
    c->n_heads = json_int(o, "heads", path);
    c->n_kv_heads = json_int(o, "kv", path);
    c->head_dim = json_int(o, "hd", path);
    c->intermediate = json_int(o, "I", path);
    c->vocab = json_int(o, "V", path);
    c->block_size = json_int(o, "B", path);
    c->n_capture = json_int(o, "n_capture", path);
    c->num_target_layers = json_int(o, "num_target_layers", path);
    c->mask_token_id = json_int(o, "mask_token_id", path);
    c->sliding_window = json_int(o, "sliding_window", path);
    c->gamma = json_num(o, "gamma", path);
    c->rms_norm_eps = json_num(o, "rms_norm_eps", path);
    c->rope_theta = json_num(o, "rope_theta", path);
    c->max_position_embeddings = 4096;
    const json_t *lo = json_object_get(o, "loss"); /* absent: the decay fixtures */
    c->loss = DFLASH_LOSS_DECAY;
    if (lo) {
        T_ASSERT(json_is_string(lo) && dflash_loss_parse(json_string_value(lo)) >= 0);
        c->loss = dflash_loss_parse(json_string_value(lo));
        c->dpace_alpha = json_num(o, "dpace_alpha", path);
    }
    const json_t *tie = json_object_get(o, "tie_word_embeddings");
    T_ASSERT(json_is_boolean(tie));
    c->tie_word_embeddings = json_is_true(tie);
    const json_t *ids = json_object_get(o, "target_layer_ids");
    T_ASSERT(json_is_array(ids) && (int)json_array_size(ids) == c->n_capture && c->n_capture <= DFLASH_MAX_CAPTURE);
    for (int i = 0; i < c->n_capture; i++)
        c->target_layer_ids[i] = (int)json_integer_value(json_array_get(ids, (size_t)i));
    const json_t *types = json_object_get(o, "layer_types");
    T_ASSERT(json_is_array(types) && json_array_size(types) >= 1 && json_array_size(types) <= DFLASH_MAX_LAYERS);
    c->n_layers = (int)json_array_size(types);
    for (int l = 0; l < c->n_layers; l++) {
        const char *t = json_string_value(json_array_get(types, (size_t)l));
        T_ASSERT(t && (!strcmp(t, "full_attention") || !strcmp(t, "sliding_attention")));
        c->layer_sliding[l] = !strcmp(t, "sliding_attention");
    }
    char err[256];
    if (dflash_config_validate(c, err, sizeof(err)) < 0) {
        fprintf(stderr, "%s: config: %s\n", path, err);
        exit(1);
    }
}

/* Checks one fixture; returns the number of failed checks. */
static int run_fixture(const char *path)
{
    char err[512];
    safetensors_file f;
    memset(&f, 0, sizeof(f));
    if (safetensors_open(&f, path, err, sizeof(err)) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    g_fail = 0;
    json_t *jc = read_config(&f);
    dflash_config c;
    config_from_json(&c, jc, path);
    int S = json_int(jc, "S", path), N = json_int(jc, "N", path);
    const char *attn = json_string_value(json_object_get(jc, "attention"));
    const char *tv = json_string_value(json_object_get(jc, "torch_version"));
    int B = c.block_size, d = c.hidden, V = c.vocab, R = N * B, nd = c.n_capture * d;
    printf("%s: d=%d H=%d KV=%d hd=%d I=%d V=%d B=%d layers=%d (", path, d, c.n_heads, c.n_kv_heads, c.head_dim,
           c.intermediate, V, B, c.n_layers);
    for (int l = 0; l < c.n_layers; l++)
        printf("%s%s", l ? "," : "", c.layer_sliding[l] ? "sliding" : "full");
    printf(") W=%d S=%d N=%d gamma=%g %s; loss %s", c.sliding_window, S, N, c.gamma,
           c.tie_word_embeddings ? "tied" : "untied", dflash_loss_name(c.loss));
    if (c.loss == DFLASH_LOSS_DPACE)
        printf(" (alpha %g)", c.dpace_alpha);
    printf("; torch %s, %s attention\n", tv ? tv : "?", attn ? attn : "?");

    /* weights under their release names; every grad.* of the file must be one of ours */
    dflash_params p, g;
    T_ASSERT_RC(dflash_params_alloc(&p, &c));
    T_ASSERT_RC(dflash_params_alloc(&g, &c));
    int nt = dflash_tensor_count(&c);
    for (int i = 0; i < nt; i++) {
        dflash_tensor t;
        dflash_tensor_info(&c, i, &t);
        const safetensors_tensor *st = need(&f, t.name, SAFETENSORS_F32, t.shape[0], t.ndim == 2 ? t.shape[1] : -1);
        memcpy(p.data + t.offset, st->data, st->nbytes);
    }
    for (int i = 0; i < f.n_tensors; i++) {
        const char *nm = f.tensors[i].name;
        if (strncmp(nm, "grad.", 5) != 0 || !strcmp(nm, "grad.H"))
            continue;
        int found = 0;
        for (int k = 0; k < nt && !found; k++) {
            dflash_tensor t;
            dflash_tensor_info(&c, k, &t);
            found = !strcmp(nm + 5, t.name);
        }
        if (!found) {
            printf("  %s: torch has a trainable tensor the C drafter lacks  FAIL\n", nm);
            g_fail++;
        }
    }
    float *embed = load_f32(&f, "embed_tokens", V, d);
    float *lm_head = c.tie_word_embeddings ? NULL : load_f32(&f, "lm_head", V, d);
    dflash_frozen fz = {embed, c.tie_word_embeddings ? embed : lm_head};

    /* the batch, with the fixture's anchors */
    float *H = load_f32(&f, "H", S, nd);
    int32_t *x = load_i32(&f, "input_ids", S);
    int32_t *lm32 = load_i32(&f, "loss_mask", S);
    int32_t *anchors = load_i32(&f, "anchors", N);
    int32_t *keep32 = load_i32(&f, "keep", N);
    uint8_t *lm = malloc((size_t)S), *keep = malloc((size_t)N);
    T_ASSERT(lm && keep);
    for (int i = 0; i < S; i++)
        lm[i] = lm32[i] != 0;
    for (int j = 0; j < N; j++)
        keep[j] = keep32[j] != 0;
    dflash_batch b;
    T_ASSERT_RC(dflash_batch_init(&b, &c, S, N, H, x, lm, 1, 0));
    T_ASSERT_RC(dflash_batch_set_anchors(&b, &c, anchors, keep, N));
    T_ASSERT(b.N == N);

    printf("  %-46s %8s  %10s  %9s\n", "check", "numel", "||torch||", "rel.err");
    int32_t *ref_labels = load_i32(&f, "labels", R);
    int lab_bad = 0;
    for (int r = 0; r < R; r++)
        lab_bad += b.labels[r] != ref_labels[r];
    printf("  %-46s %8d  %10s  %9d  %s\n", "labels (mismatches)", R, "", lab_bad, lab_bad ? "FAIL" : "ok");
    g_fail += lab_bad != 0;
    float *ref_w = load_f32(&f, "weights", R, -1);
    check_rel("weights", b.weights, ref_w, (size_t)R, 1e-6);
    check_scalar("sum of weights", b.sum_w, load_f64_scalar(&f, "sum_w"), 1e-6);

    /* the training path: forward + chunked loss (8-row chunks) + backward to the params */
    dflash_acts a;
    memset(&a, 0, sizeof(a));
    dflash_stats st;
    T_ASSERT_RC(dflash_loss_and_grad(&c, &p, &fz, &b, &a, &g, 0, 8, &st));
    float *ref_z = load_f32(&f, "z", R, d);
    check_rel("z (final norm output)", a.z, ref_z, (size_t)R * d, 1e-5);
    check_scalar(c.loss == DFLASH_LOSS_DPACE ? "loss = sum(u CE) / A (D-PACE)" : "loss = sum(w CE) / sum(w)", st.loss,
                 load_f64_scalar(&f, "loss"), 1e-5);
    float *ref_u = NULL, *u = NULL;
    if (c.loss == DFLASH_LOSS_DPACE) { /* the position weights and the normaliser */
        double A = dflash_loss_norm(c.loss, b.weights, R, B);
        check_scalar("D-PACE normaliser A (blocks)", A, load_f64_scalar(&f, "dpace_norm"), 1e-12);
        check_scalar("stats sum_w == A", st.sum_w, load_f64_scalar(&f, "dpace_norm"), 1e-12);
        ref_u = load_f32(&f, "dpace_weights", R, -1);
        u = malloc(sizeof(float) * (size_t)R);
        T_ASSERT(u);
        T_ASSERT_RC(dflash_loss_dpace_chunked(NULL, a.z, fz.lm_head, b.labels, b.weights, R, d, V, B, 8, c.dpace_alpha,
                                              0, u, NULL));
        check_rel("D-PACE weights u", u, ref_u, (size_t)R, 1e-5);
        int zero_bad = 0; /* exactly 0 where torch has 0: past a block's first gap, padding, k = 0 */
        for (int r = 0; r < R; r++)
            zero_bad += (ref_u[r] == 0.0f) != (u[r] == 0.0f);
        printf("  %-46s %8d  %10s  %9d  %s\n", "D-PACE zero weights (mismatches)", R, "", zero_bad,
               zero_bad ? "FAIL" : "ok");
        g_fail += zero_bad != 0;
    }
    float *ref_acc = load_f32(&f, "acc", B - 1, -1), *ref_cnt = load_f32(&f, "acc_count", B - 1, -1);
    for (int k = 1; k < B; k++) {
        char what[64];
        double acc = dflash_stats_acc(&st, k);
        int ok = st.count[k] == ref_cnt[k - 1] && fabs(acc - ref_acc[k - 1]) < 1e-6;
        snprintf(what, sizeof(what), "acc_%d (rows %g vs %g)", k, st.count[k], (double)ref_cnt[k - 1]);
        printf("  %-46s %.4f vs torch %.4f  %s\n", what, acc, ref_acc[k - 1], ok ? "ok" : "FAIL");
        g_fail += !ok;
    }
    for (int i = 0; i < nt; i++) {
        dflash_tensor t;
        char gname[128];
        dflash_tensor_info(&c, i, &t);
        snprintf(gname, sizeof(gname), "grad.%s", t.name);
        float *ref = load_f32(&f, gname, t.shape[0], t.ndim == 2 ? t.shape[1] : -1);
        check_rel(gname, g.data + t.offset, ref, t.numel, 1e-4);
        free(ref);
    }

    /* the gradient to the captured features: forward, loss, backward with dH */
    float *dH = calloc((size_t)S * nd, sizeof(float));
    dflash_params g2;
    T_ASSERT(dH);
    T_ASSERT_RC(dflash_params_alloc(&g2, &c));
    T_ASSERT_RC(dflash_forward(&c, &p, &fz, &b, &a));
    T_ASSERT_RC(dflash_loss_config(&c, a.dz, a.z, fz.lm_head, b.labels, b.weights, R, 8, 0, NULL));
    T_ASSERT_RC(dflash_backward(&c, &p, &fz, &b, &a, a.dz, &g2, dH));
    float *ref_dH = load_f32(&f, "grad.H", S, nd);
    check_rel("grad.H (captured target features)", dH, ref_dH, (size_t)S * nd, 1e-4);
    check_rel("params grad: backward(dH) == loss_and_grad", g2.data, g.data, g.n, 1e-6);

    printf("%s: %s (%d failed checks)\n", path, g_fail ? "FAIL" : "PASS", g_fail);
    free(ref_dH);
    free(dH);
    free(ref_u);
    free(u);
    free(ref_acc);
    free(ref_cnt);
    free(ref_z);
    free(ref_w);
    free(ref_labels);
    dflash_params_free(&g2);
    dflash_acts_free(&a);
    dflash_batch_free(&b);
    free(lm);
    free(keep);
    free(lm32);
    free(keep32);
    free(anchors);
    free(x);
    free(H);
    free(embed);
    free(lm_head);
    dflash_params_free(&g);
    dflash_params_free(&p);
    json_decref(jc);
    safetensors_close(&f);
    return g_fail;
}

int main(int argc, char **argv)
{
    if (argc > 1) { /* explicit fixtures (e.g. made with a deliberately broken reference) */
        if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
            printf("usage: %s [fixture.safetensors ...]\n"
                   "Checks the C drafter against tests/reference/dflash_torch.py fixtures (default: %s, %s,\n"
                   "%s and %s).\n",
                   argv[0], FIXTURE, FIXTURE_TIED, FIXTURE_DPACE, FIXTURE_DPACE_TIED);
            return 0;
        }
        int fails = 0;
        for (int i = 1; i < argc; i++)
            fails += run_fixture(argv[i]);
        return fails ? 1 : 0;
    }
    if (access(FIXTURE, R_OK) != 0) {
        if (errno != ENOENT)
            fprintf(stderr, "%s: %s\n", FIXTURE, strerror(errno));
        T_SKIP("%s not made yet (run tests/reference/dflash_torch.py fixture on a machine with torch)", FIXTURE);
    }
    int fails = run_fixture(FIXTURE);
    const char *more[] = {FIXTURE_TIED, FIXTURE_DPACE, FIXTURE_DPACE_TIED};
    for (int i = 0; i < 3; i++) {
        if (access(more[i], R_OK) == 0)
            fails += run_fixture(more[i]);
        else
            printf("note: %s not present, not checked\n", more[i]);
    }
    if (fails) {
        fprintf(stderr, "test_dflash_torch: %d checks failed: the C drafter disagrees with the PyTorch reference\n",
                fails);
        return 1;
    }
    printf("test_dflash_torch: C drafter == PyTorch reference (loss, acc, z, every gradient, grad.H; decay and "
           "D-PACE)\n");
    return 0;
}
