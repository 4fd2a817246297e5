/* test_target_cpu.c: the target model loader and CPU forward.
 *
 * Always (models with random weights written here with safetensors_writer, one Qwen3-like bf16
 * tied single file, one Llama-like f32 untied sharded with llama3 rope and biases):
 *   - packing: documents packed in one row give the same features as each run alone
 *   - a subset of capture layers (any order) equals the full run's slots
 *   - sliding layers with a window >= every document equal full attention
 *   - load errors name the file and tensor, and map to exit code 100
 *   - target_load_embeddings: tied lm_head is the embedding, untied is lm_head.weight
 * When tests/fixtures/<name>-ref.safetensors exist (made by scripts/make_fixtures.py with
 * transformers): every captured layer vs HF hidden_states[l+1], rel err < 1e-4 (fp32).
 * Without fixtures the self-consistency part runs and the test exits 77 (SKIPPED).
 */
#include "io/hfconfig.h"
#include "io/safetensors.h"
#include "target/target_model.h"
#include "test_helpers.h"
#include "test_model_dir.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

/* ---- random models --------------------------------------------------------- */

typedef struct spec {
    int llama, L, d, I, H, KV, hd, V, tied, bias, sharded;
    safetensors_dtype dt;
    int sliding_window, max_window_layers; /* Qwen3 use_sliding_window when > 0 */
    const char *skip;                      /* tensor left out, or NULL */
    const char *reshape;                   /* tensor written with a wrong shape, or NULL */
} spec;

typedef struct wbuf {
    safetensors_writer *w[2];
    df_rng rng;
    int n;
    const spec *s;
    char index[8192];
    size_t io;
} wbuf;

static void add(wbuf *b, const char *name, int64_t d0, int64_t d1, float scale, float offset)
{
    if (b->s->skip && strcmp(name, b->s->skip) == 0)
        return;
    if (b->s->reshape && strcmp(name, b->s->reshape) == 0)
        d0 += 1;
    int64_t n = d0 * (d1 ? d1 : 1);
    float *v = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        v[i] = offset + scale * (float)(2.0 * df_rng_uniform(&b->rng) - 1.0);
    int64_t shape[2] = {d0, d1};
    int shard = b->s->sharded ? (b->n++ % 2) : 0;
    T_ASSERT_RC(safetensors_writer_add_f32_as(b->w[shard], name, b->s->dt, d1 ? 2 : 1, shape, v));
    free(v);
    if (b->s->sharded)
        b->io +=
            (size_t)snprintf(b->index + b->io, sizeof b->index - b->io, "%s\"%s\": \"model-%05d-of-00002.safetensors\"",
                             b->io > 20 ? ", " : "", name, shard + 1);
}

static void write_config(const char *dir, const spec *s)
{
    char cfg[2048];
    char rope[512], hd[32] = "";
    if (!s->llama) /* Qwen3 configs give head_dim; Llama's is derived from hidden / heads */
        snprintf(hd, sizeof hd, "\"head_dim\": %d, ", s->hd);
    if (s->llama)
        snprintf(rope, sizeof rope,
                 "\"rope_theta\": 500000.0, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0,"
                 " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 16}");
    else
        snprintf(rope, sizeof rope,
                 "\"rope_theta\": 1000000, \"use_sliding_window\": %s, \"sliding_window\": %d,"
                 " \"max_window_layers\": %d",
                 s->sliding_window ? "true" : "false", s->sliding_window ? s->sliding_window : 4096,
                 s->max_window_layers);
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", \"hidden_size\": %d, \"intermediate_size\": %d,"
             " \"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d,"
             " %s\"vocab_size\": %d, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": %s, \"attention_bias\": %s,"
             " \"mlp_bias\": %s, \"torch_dtype\": \"%s\", %s}",
             s->llama ? "LlamaForCausalLM" : "Qwen3ForCausalLM", s->llama ? "llama" : "qwen3", s->d, s->I, s->L, s->H,
             s->KV, hd, s->V, s->tied ? "true" : "false", s->bias ? "true" : "false",
             s->bias && s->llama ? "true" : "false", s->dt == SAFETENSORS_BF16 ? "bfloat16" : "float32", rope);
    write_text(dir, "config.json", cfg);
}

/* Writes config.json + the weights of s (random, from seed) into dir = tmpdir/name. */
static void make_model(char *dir, size_t dlen, const char *name, const spec *s, uint64_t seed)
{
    snprintf(dir, dlen, "%s/%s", tmpdir, name);
    T_ASSERT(mkdir(dir, 0755) == 0);
    write_config(dir, s);
    wbuf b = {{safetensors_writer_new(), safetensors_writer_new()}, {{0}}, 0, s, "{\"weight_map\": {", 0};
    b.io = strlen(b.index);
    df_rng_seed(&b.rng, seed);
    int64_t qd = (int64_t)s->H * s->hd, kvd = (int64_t)s->KV * s->hd;
    char n[256];
    add(&b, "model.embed_tokens.weight", s->V, s->d, 1.0f, 0);
    for (int l = 0; l < s->L; l++) {
#define P(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix), n)
        add(&b, P("input_layernorm.weight"), s->d, 0, 0.2f, 1.0f);
        add(&b, P("self_attn.q_proj.weight"), qd, s->d, 0.3f, 0);
        add(&b, P("self_attn.k_proj.weight"), kvd, s->d, 0.3f, 0);
        add(&b, P("self_attn.v_proj.weight"), kvd, s->d, 0.3f, 0);
        add(&b, P("self_attn.o_proj.weight"), s->d, qd, 0.3f, 0);
        if (s->bias) {
            add(&b, P("self_attn.q_proj.bias"), qd, 0, 0.1f, 0);
            add(&b, P("self_attn.k_proj.bias"), kvd, 0, 0.1f, 0);
            add(&b, P("self_attn.v_proj.bias"), kvd, 0, 0.1f, 0);
            add(&b, P("self_attn.o_proj.bias"), s->d, 0, 0.1f, 0);
        }
        if (!s->llama) {
            add(&b, P("self_attn.q_norm.weight"), s->hd, 0, 0.2f, 1.0f);
            add(&b, P("self_attn.k_norm.weight"), s->hd, 0, 0.2f, 1.0f);
        }
        add(&b, P("post_attention_layernorm.weight"), s->d, 0, 0.2f, 1.0f);
        add(&b, P("mlp.gate_proj.weight"), s->I, s->d, 0.3f, 0);
        add(&b, P("mlp.up_proj.weight"), s->I, s->d, 0.3f, 0);
        add(&b, P("mlp.down_proj.weight"), s->d, s->I, 0.3f, 0);
        if (s->bias && s->llama) {
            add(&b, P("mlp.gate_proj.bias"), s->I, 0, 0.1f, 0);
            add(&b, P("mlp.up_proj.bias"), s->I, 0, 0.1f, 0);
            add(&b, P("mlp.down_proj.bias"), s->d, 0, 0.1f, 0);
        }
#undef P
    }
    add(&b, "model.norm.weight", s->d, 0, 0.2f, 1.0f);
    if (!s->tied)
        add(&b, "lm_head.weight", s->V, s->d, 0.5f, 0);
    char p[600];
    if (s->sharded) {
        for (int i = 0; i < 2; i++) {
            snprintf(p, sizeof p, "%s/model-%05d-of-00002.safetensors", dir, i + 1);
            T_ASSERT_RC(safetensors_writer_write(b.w[i], p));
        }
        snprintf(b.index + b.io, sizeof b.index - b.io, "}}");
        write_text(dir, "model.safetensors.index.json", b.index);
    } else {
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        T_ASSERT_RC(safetensors_writer_write(b.w[0], p));
    }
    safetensors_writer_free(b.w[0]);
    safetensors_writer_free(b.w[1]);
}

static const spec QWEN = {
    .llama = 0, .L = 3, .d = 32, .I = 48, .H = 4, .KV = 2, .hd = 12, .V = 50, .tied = 1, .dt = SAFETENSORS_BF16};
static const spec LLAMA = {.llama = 1,
                           .L = 3,
                           .d = 32,
                           .I = 40,
                           .H = 4,
                           .KV = 1,
                           .hd = 8,
                           .V = 40,
                           .tied = 0,
                           .bias = 1,
                           .sharded = 1,
                           .dt = SAFETENSORS_F32};

/* ---- self-consistency ----------------------------------------------------------- */

static void packing(const char *dir, const char *label)
{
    target_model m;
    int all[3] = {0, 1, 2};
    load_ok(&m, dir, all, 3);
    int d = m.cfg.hidden_size, V = m.cfg.vocab_size;
    enum { T = 17 };
    int32_t starts[4] = {0, 6, 13, 17}, tok[T];
    df_rng r;
    df_rng_seed(&r, 7);
    for (int t = 0; t < T; t++)
        tok[t] = (int32_t)df_rng_below(&r, (uint64_t)V);
    float *packed = malloc(sizeof(float) * T * 3 * d), *alone = malloc(sizeof(float) * T * 3 * d);
    T_ASSERT_RC(target_reserve(&m, T));
    T_ASSERT_RC(target_forward_cpu(&m, tok, starts, 3, packed));
    double worst = 0;
    for (int k = 0; k < 3; k++) {
        int n = starts[k + 1] - starts[k];
        int32_t one[2] = {0, n};
        T_ASSERT_RC(target_forward_cpu(&m, tok + starts[k], one, 1, alone));
        worst = fmax(worst, max_abs_diff(packed + (size_t)starts[k] * 3 * d, alone, (size_t)n * 3 * d));
    }
    T_ASSERT(worst <= 1e-6);
    /* the features are not trivially equal across layers or tokens */
    T_ASSERT(max_abs_diff(packed, packed + d, (size_t)d) > 1e-3);
    T_ASSERT(max_abs_diff(packed, packed + (size_t)6 * 3 * d, (size_t)d) > 1e-3);

    /* the same tokens as one document differ after the boundary (attention crossed) */
    int32_t whole[2] = {0, T};
    T_ASSERT_RC(target_forward_cpu(&m, tok, whole, 1, alone));
    T_ASSERT(max_abs_diff(packed, alone, (size_t)6 * 3 * d) <= 1e-6);
    T_ASSERT(max_abs_diff(packed + (size_t)6 * 3 * d, alone + (size_t)6 * 3 * d, (size_t)3 * d) > 1e-3);

    /* subset capture in another order: slot c holds layer cap[c] */
    target_model s;
    int cap[2] = {2, 0};
    load_ok(&s, dir, cap, 2);
    T_ASSERT(s.n_layers == 3);
    float *sub = malloc(sizeof(float) * T * 2 * d);
    T_ASSERT_RC(target_forward_cpu(&s, tok, starts, 3, sub));
    for (int t = 0; t < T; t++) {
        T_ASSERT(memcmp(sub + ((size_t)t * 2 + 0) * d, packed + ((size_t)t * 3 + 2) * d, sizeof(float) * d) == 0);
        T_ASSERT(memcmp(sub + ((size_t)t * 2 + 1) * d, packed + ((size_t)t * 3 + 0) * d, sizeof(float) * d) == 0);
    }
    target_free(&s);
    /* only layer 0: one layer loaded */
    int first = 0;
    load_ok(&s, dir, &first, 1);
    T_ASSERT(s.n_layers == 1);
    T_ASSERT_RC(target_forward_cpu(&s, tok, starts, 3, sub));
    for (int t = 0; t < T; t++)
        T_ASSERT(memcmp(sub + (size_t)t * d, packed + (size_t)t * 3 * d, sizeof(float) * d) == 0);
    target_free(&s);

    /* bad input */
    int32_t bad_starts[3] = {0, 5, 5}, bad_tok[2] = {0, V};
    T_ASSERT(target_forward_cpu(&m, tok, bad_starts, 2, sub) == -EINVAL);
    int32_t s2[2] = {1, 3};
    T_ASSERT(target_forward_cpu(&m, tok, s2, 1, sub) == -EINVAL);
    int32_t s3[2] = {0, 2};
    T_ASSERT(target_forward_cpu(&m, bad_tok, s3, 1, sub) == -ERANGE);
    target_free(&m);
    free(packed), free(alone), free(sub);
    printf("%s: packed == alone (max diff %.2g), subset capture == full, bad input refused\n", label, worst);
}

static void sliding(void)
{
    /* window 100 > every document: sliding layers must equal full attention; window 3
     * must differ on the layers it applies to (layers >= 1) */
    spec s = QWEN;
    char full[512], wide[512], narrow[512];
    make_model(full, sizeof full, "slide_full", &s, 11);
    s.sliding_window = 100, s.max_window_layers = 1;
    make_model(wide, sizeof wide, "slide_wide", &s, 11);
    s.sliding_window = 3;
    make_model(narrow, sizeof narrow, "slide_narrow", &s, 11);
    int cap[3] = {0, 1, 2};
    target_model a, b, c;
    load_ok(&a, full, cap, 3);
    load_ok(&b, wide, cap, 3);
    load_ok(&c, narrow, cap, 3);
    T_ASSERT(b.cfg.layer_types[0] == HFCONFIG_FULL_ATTENTION && b.cfg.layer_types[1] == HFCONFIG_SLIDING_ATTENTION);
    int d = a.cfg.hidden_size;
    int32_t tok[12] = {1, 5, 9, 3, 7, 2, 8, 4, 6, 0, 11, 13}, st[3] = {0, 5, 12};
    float *fa = malloc(sizeof(float) * 12 * 3 * d), *fb = malloc(sizeof(float) * 12 * 3 * d);
    float *fc = malloc(sizeof(float) * 12 * 3 * d);
    T_ASSERT_RC(target_forward_cpu(&a, tok, st, 2, fa));
    T_ASSERT_RC(target_forward_cpu(&b, tok, st, 2, fb));
    T_ASSERT_RC(target_forward_cpu(&c, tok, st, 2, fc));
    T_ASSERT(memcmp(fa, fb, sizeof(float) * 12 * 3 * d) == 0);
    /* layer 0 is full in both; tokens 0..2 of each document see < 3 keys: equal */
    for (int t = 0; t < 12; t++) {
        T_ASSERT(memcmp(fa + (size_t)t * 3 * d, fc + (size_t)t * 3 * d, sizeof(float) * d) == 0);
        int in_doc = t < 5 ? t : t - 5;
        double diff = max_abs_diff(fa + ((size_t)t * 3 + 1) * d, fc + ((size_t)t * 3 + 1) * d, (size_t)d);
        T_ASSERT(in_doc < 3 ? diff == 0 : diff > 1e-4);
    }
    target_free(&a), target_free(&b), target_free(&c);
    free(fa), free(fb), free(fc);
    printf("sliding: window >= documents equals full attention, window 3 masks as expected\n");
}

static void expect_load_error(const char *dir, const int *cap, int n, int want_rc, const char *want)
{
    target_model m;
    char err[1024] = "";
    int rc = target_load(&m, dir, cap, n, err, sizeof err);
    if (rc != want_rc)
        fprintf(stderr, "expected rc %d, got %d (%s)\n", want_rc, rc, err);
    T_ASSERT(rc == want_rc);
    T_ASSERT(target_exit_code(rc) == DF_EXIT_PERM);
    T_ASSERT(m.layers == NULL && m.st.files == NULL);
    T_ASSERT_STREQ(err, want);
}

static void load_errors(void)
{
    char dir[512], want[1200];
    int cap2[1] = {2}, cap1[1] = {1};
    spec s = QWEN;
    s.skip = "model.layers.1.self_attn.k_norm.weight";
    make_model(dir, sizeof dir, "missing", &s, 3);
    snprintf(want, sizeof want,
             "%s: tensor \"model.layers.1.self_attn.k_norm.weight\" missing (looked in model.safetensors)", dir);
    expect_load_error(dir, cap2, 1, -ENOENT, want);
    /* a tensor past the last captured layer is not needed */
    target_model m;
    int cap0[1] = {0};
    load_ok(&m, dir, cap0, 1);
    target_free(&m);

    s = LLAMA;
    s.reshape = "model.layers.1.mlp.down_proj.weight";
    make_model(dir, sizeof dir, "reshaped", &s, 3);
    snprintf(want, sizeof want,
             "%s/model-00002-of-00002.safetensors: tensor \"model.layers.1.mlp.down_proj.weight\": shape [33, 40], "
             "expected [32, 40]",
             dir);
    expect_load_error(dir, cap1, 1, -EINVAL, want);

    s = LLAMA;
    s.skip = "model.layers.0.self_attn.o_proj.bias";
    make_model(dir, sizeof dir, "nobias", &s, 3);
    snprintf(want, sizeof want,
             "%s: tensor \"model.layers.0.self_attn.o_proj.bias\" missing (looked in model.safetensors.index.json)",
             dir);
    expect_load_error(dir, cap1, 1, -ENOENT, want);

    s = QWEN;
    s.dt = SAFETENSORS_F16;
    make_model(dir, sizeof dir, "f16", &s, 3);
    load_ok(&m, dir, cap2, 1); /* f16 weights load too */
    target_free(&m);
    int bad[2] = {1, 3};
    snprintf(want, sizeof want, "%s: capture layer 3 out of range: the model has 3 layers (0..2)", dir);
    expect_load_error(dir, bad, 2, -EINVAL, want);
    int dup[2] = {1, 1};
    snprintf(want, sizeof want, "%s: capture layer 1 listed twice", dir);
    expect_load_error(dir, dup, 2, -EINVAL, want);

    /* integer weights are refused */
    snprintf(dir, sizeof dir, "%s/intw", tmpdir);
    T_ASSERT(mkdir(dir, 0755) == 0);
    write_config(dir, &QWEN);
    safetensors_writer *w = safetensors_writer_new();
    int32_t zeros[50 * 32] = {0};
    T_ASSERT_RC(safetensors_writer_add(w, "model.embed_tokens.weight", SAFETENSORS_I32, 2, (int64_t[]){50, 32}, zeros));
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    T_ASSERT_RC(safetensors_writer_write(w, p));
    safetensors_writer_free(w);
    snprintf(want, sizeof want, "%s: tensor \"model.embed_tokens.weight\": dtype I32, expected F32, BF16 or F16", p);
    expect_load_error(dir, cap0, 1, -EINVAL, want);
    T_ASSERT(target_exit_code(-ENOMEM) == DF_EXIT_TEMP);
    printf("load errors: missing / reshaped / wrong dtype tensors and bad captures named, exit 100\n");
}

static void embeddings(const char *qdir, const char *ldir)
{
    char err[1024];
    target_embeddings e;
    T_ASSERT_RC(target_load_embeddings(&e, qdir, 1, err, sizeof err));
    T_ASSERT(e.tied && e.lm_head == e.embed && e.vocab == QWEN.V && e.hidden == QWEN.d && e.final_norm);
    /* the embedding equals what the forward looks up */
    target_model m;
    int cap = 0;
    load_ok(&m, qdir, &cap, 1);
    float row[32];
    int32_t tk = 7;
    T_ASSERT_RC(target_embed(&m, &tk, 1, row));
    T_ASSERT(memcmp(row, e.embed + 7 * QWEN.d, sizeof row) == 0);
    target_free(&m);
    target_embeddings_free(&e);
    T_ASSERT_RC(target_load_embeddings(&e, ldir, 0, err, sizeof err));
    T_ASSERT(!e.tied && e.lm_head != e.embed && e.final_norm == NULL);
    T_ASSERT(max_abs_diff(e.lm_head, e.embed, (size_t)LLAMA.V * LLAMA.d) > 0.1);
    target_embeddings_free(&e);
    target_embeddings_free(&e);
    printf("embeddings: tied and untied lm_head ok\n");
}

/* ---- transformers fixtures --------------------------------------------------------- */

/* 1 = compared, 0 = fixture absent */
static int compare_fixture(const char *name)
{
    char mdir[256], ref[256], err[1024];
    snprintf(mdir, sizeof mdir, "tests/fixtures/%s", name);
    snprintf(ref, sizeof ref, "tests/fixtures/%s-ref.safetensors", name);
    if (access(ref, F_OK) != 0)
        return 0;
    safetensors_file rf;
    int rc = safetensors_open(&rf, ref, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "%s\n", err);
    T_ASSERT_RC(rc);
    const safetensors_tensor *ids = safetensors_find(&rf, "input_ids"), *ds = safetensors_find(&rf, "doc_starts"),
                             *emb = safetensors_find(&rf, "embed");
    T_ASSERT(ids && ds && emb && ids->dtype == SAFETENSORS_I32 && ds->dtype == SAFETENSORS_I32 && ids->ndim == 1 &&
             ds->ndim == 1);
    int T = (int)ids->shape[0], n_docs = (int)ds->shape[0] - 1;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)T), *starts = malloc(sizeof(int32_t) * (size_t)(n_docs + 1));
    memcpy(tok, ids->data, sizeof(int32_t) * (size_t)T);
    memcpy(starts, ds->data, sizeof(int32_t) * (size_t)(n_docs + 1));
    T_ASSERT(starts[n_docs] == T);

    hfconfig c;
    T_ASSERT_RC(hfconfig_load(&c, mdir, err, sizeof err));
    int L = c.num_hidden_layers, d = c.hidden_size;
    hfconfig_free(&c);
    int *all = malloc(sizeof(int) * (size_t)L);
    for (int l = 0; l < L; l++)
        all[l] = l;
    target_model m;
    load_ok(&m, mdir, all, L);
    float *out = malloc(sizeof(float) * (size_t)T * L * d), *refv = malloc(sizeof(float) * (size_t)T * d);
    float *got = malloc(sizeof(float) * (size_t)T * d);

    /* embedding = hidden_states[0] */
    T_ASSERT(emb->ndim == 2 && emb->shape[0] == T && emb->shape[1] == d);
    T_ASSERT_RC(safetensors_tensor_to_f32(emb, refv));
    T_ASSERT_RC(target_embed(&m, tok, T, got));
    T_ASSERT(max_abs_diff(got, refv, (size_t)T * d) == 0);

    T_ASSERT_RC(target_forward_cpu(&m, tok, starts, n_docs, out));
    for (int l = 0; l < L; l++) {
        char hn[64];
        snprintf(hn, sizeof hn, "hidden.%d", l);
        const safetensors_tensor *h = safetensors_find(&rf, hn);
        T_ASSERT(h && h->ndim == 2 && h->shape[0] == T && h->shape[1] == d);
        T_ASSERT_RC(safetensors_tensor_to_f32(h, refv));
        double num = 0, den = 0, mx = 0;
        for (int t = 0; t < T; t++)
            for (int i = 0; i < d; i++) {
                double o = out[((size_t)t * L + l) * d + i], r = refv[(size_t)t * d + i];
                num += (o - r) * (o - r);
                den += r * r;
                mx = fmax(mx, fabs(o - r));
            }
        double rel = sqrt(num / den);
        printf("%s layer %d: max abs err %.3g, rel err %.3g (T=%d, %d docs)\n", name, l, mx, rel, T, n_docs);
        T_ASSERT(rel < 1e-4);
    }
    target_free(&m);
    /* a subset capture (last and first layers) equals the full run */
    int sub[2] = {L - 1, 0};
    load_ok(&m, mdir, sub, 2);
    float *so = malloc(sizeof(float) * (size_t)T * 2 * d);
    T_ASSERT_RC(target_forward_cpu(&m, tok, starts, n_docs, so));
    for (int t = 0; t < T; t++) {
        T_ASSERT(memcmp(so + ((size_t)t * 2) * d, out + ((size_t)t * L + L - 1) * d, sizeof(float) * d) == 0);
        T_ASSERT(memcmp(so + ((size_t)t * 2 + 1) * d, out + ((size_t)t * L) * d, sizeof(float) * d) == 0);
    }
    target_free(&m);
    /* the drafter's view of the same model: embed, lm_head (tied or not), final norm */
    target_embeddings e;
    T_ASSERT_RC(target_load_embeddings(&e, mdir, 1, err, sizeof err));
    T_ASSERT(e.hidden == d && e.final_norm && (e.lm_head == e.embed) == (e.tied != 0));
    T_ASSERT(strcmp(name, "tiny-qwen3") != 0 || e.tied);
    T_ASSERT(strcmp(name, "tiny-llama") != 0 || !e.tied);
    target_embeddings_free(&e);
    safetensors_close(&rf);
    free(tok), free(starts), free(all), free(out), free(refv), free(got), free(so);
    return 1;
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_target_cpu.XXXXXX");
    T_ASSERT(mkdtemp(tmpdir));
    char qdir[512], ldir[512];
    make_model(qdir, sizeof qdir, "qwen", &QWEN, 1);
    make_model(ldir, sizeof ldir, "llama", &LLAMA, 2);
    packing(qdir, "qwen3-like (bf16, tied, qk norm)");
    packing(ldir, "llama-like (f32, sharded, llama3 rope, biases)");
    sliding();
    load_errors();
    embeddings(qdir, ldir);
    rm_rf(tmpdir);

    int n = compare_fixture("tiny-qwen3") + compare_fixture("tiny-llama");
    if (n == 0)
        T_SKIP("self-consistency passed; no transformers fixtures (tests/fixtures/tiny-*-ref.safetensors)");
    printf("test_target_cpu: ok (%d fixture models compared with transformers)\n", n);
    return 0;
}
