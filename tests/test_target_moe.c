/* test_target_moe.c: Qwen3-MoE targets on the CPU (hfconfig qwen3_moe, both expert layouts,
 * target_forward_cpu, target_decode), on random models written here, then against
 * transformers when its fixture is present.
 *
 * Always (4 layers, mlp_only_layers [0] and decoder_sparse_step 2: layers 1 and 3 sparse):
 *   - the per-expert layout (one bf16 file) and the fused gate_up_proj / down_proj layout
 *     (two shards + index) of the same values load to the same features, bit for bit, and
 *     each names its layout; the sparse layers are the ones transformers' rule gives
 *   - identical experts: a MoE whose every expert is the layer's dense MLP (norm_topk_prob,
 *     so the k weights sum to 1) equals the dense Qwen3 model of the same weights (rel err
 *     < 1e-5 per layer); without the renormalisation it does not
 *   - packing: documents packed in one row == each alone
 *   - KV decode: prefill + single steps + a block == one forward of the document (same
 *     bits), two sequences batched == each alone
 *   - load errors name the missing expert / router tensor, a wrong fused shape, a layer with
 *     no experts or with both layouts; all map to exit code 100
 * With tests/fixtures/tiny-qwen3-moe{,-alt} + tiny-qwen3-moe-ref.safetensors (made by
 * scripts/make_moe_fixture.py with transformers): embed, every layer's hidden state and the
 * logits (rel err < 1e-4), each sparse layer's top-k experts (exact) and weights, and the
 * KV-cached greedy decode (the same tokens) for both layouts. Without it: exit 77 after
 * the rest passed.
 */
#include "io/hfconfig.h"
#include "io/safetensors.h"
#include "target/target_decode.h"
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

/* ---- random models ------------------------------------------------------------- */

typedef struct mspec {
    int L, d, I, H, KV, hd, V, E, k, F, step, norm_topk;
    const char *mlp_only; /* JSON list */
    int fused, sharded;
    int dense_arch;        /* write a Qwen3ForCausalLM with a dense MLP in every layer */
    int identical_experts; /* every expert of layer l = layer l's dense MLP values (F must be I) */
    int both_layouts;      /* write the fused tensors beside the per-expert ones */
    const char *skip;      /* tensor left out, or NULL */
    const char *reshape;   /* tensor written with a wrong first dimension, or NULL */
} mspec;

static const mspec BASE = {.L = 4,
                           .d = 32,
                           .I = 48,
                           .H = 4,
                           .KV = 2,
                           .hd = 8,
                           .V = 64,
                           .E = 8,
                           .k = 2,
                           .F = 16,
                           .step = 2,
                           .norm_topk = 1,
                           .mlp_only = "[0]"};

typedef struct writer {
    safetensors_writer *w[2];
    const mspec *s;
    int n;
    uint64_t seed;
    char index[65536];
    size_t io;
} writer;

/* The values of a tensor depend only on (seed, the name they are drawn for), so two models
 * can share them under other names or layouts. */
static float *values(uint64_t seed, const char *name, size_t n, float scale, float offset)
{
    uint64_t h = 1469598103934665603ull ^ seed;
    for (const char *c = name; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ull;
    df_rng r;
    df_rng_seed(&r, h);
    float *v = malloc(sizeof(float) * n);
    T_ASSERT(v);
    for (size_t i = 0; i < n; i++)
        v[i] = offset + scale * (float)(2.0 * df_rng_uniform(&r) - 1.0);
    return v;
}

static void put(writer *b, const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2, const float *v)
{
    if (b->s->skip && strcmp(name, b->s->skip) == 0)
        return;
    int64_t shape[3] = {d0, d1, d2};
    if (b->s->reshape && strcmp(name, b->s->reshape) == 0)
        shape[0] += 1, v = values(1, "pad", (size_t)(d0 + 1) * (d1 ? d1 : 1) * (d2 ? d2 : 1), 0.1f, 0);
    int shard = b->s->sharded ? (b->n++ % 2) : 0;
    T_ASSERT_RC(safetensors_writer_add_f32_as(b->w[shard], name, SAFETENSORS_BF16, ndim, shape, v));
    if (b->s->reshape && strcmp(name, b->s->reshape) == 0)
        free((void *)v);
    if (b->s->sharded) {
        T_ASSERT(b->io + strlen(name) + 64 < sizeof b->index);
        b->io +=
            (size_t)snprintf(b->index + b->io, sizeof b->index - b->io, "%s\"%s\": \"model-%05d-of-00002.safetensors\"",
                             b->io > 20 ? ", " : "", name, shard + 1);
    }
}

/* a tensor whose values are drawn for its own name */
static void add(writer *b, const char *name, int64_t d0, int64_t d1, float scale, float offset)
{
    float *v = values(b->seed, name, (size_t)(d0 * (d1 ? d1 : 1)), scale, offset);
    put(b, name, d1 ? 2 : 1, d0, d1, 0, v);
    free(v);
}

static int sparse(const mspec *s, int l)
{
    if (s->dense_arch)
        return 0;
    char tag[16];
    snprintf(tag, sizeof tag, "%d", l); /* mlp_only lists here are single digits */
    int listed = strchr(s->mlp_only, tag[0]) != NULL;
    return !listed && s->E > 0 && (l + 1) % s->step == 0;
}

static void experts(writer *b, int l)
{
    const mspec *s = b->s;
    char n[256], src[256];
    size_t fd = (size_t)s->F * s->d;
    snprintf(n, sizeof n, "model.layers.%d.mlp.gate.weight", l);
    add(b, n, s->E, s->d, 1.0f, 0); /* a router of scale 1 spreads the logits (O(1) apart) */
    float *gate = malloc(sizeof(float) * s->E * fd), *up = malloc(sizeof(float) * s->E * fd);
    float *down = malloc(sizeof(float) * s->E * fd);
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    float *dst[3] = {gate, up, down};
    for (int e = 0; e < s->E; e++)
        for (int i = 0; i < 3; i++) {
            if (s->identical_experts)
                snprintf(src, sizeof src, "model.layers.%d.mlp.%s.weight", l, proj[i]);
            else
                snprintf(src, sizeof src, "model.layers.%d.mlp.experts.%d.%s.weight", l, e, proj[i]);
            float *v = values(b->seed, src, fd, 0.3f, 0);
            memcpy(dst[i] + (size_t)e * fd, v, sizeof(float) * fd);
            free(v);
        }
    if (!s->fused || s->both_layouts)
        for (int e = 0; e < s->E; e++)
            for (int i = 0; i < 3; i++) {
                snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%d.%s.weight", l, e, proj[i]);
                put(b, n, 2, i == 2 ? s->d : s->F, i == 2 ? s->F : s->d, 0, dst[i] + (size_t)e * fd);
            }
    if (s->fused || s->both_layouts) {
        float *gu = malloc(sizeof(float) * s->E * 2 * fd);
        for (int e = 0; e < s->E; e++) { /* gate rows, then up rows, per expert */
            memcpy(gu + (size_t)e * 2 * fd, gate + (size_t)e * fd, sizeof(float) * fd);
            memcpy(gu + (size_t)e * 2 * fd + fd, up + (size_t)e * fd, sizeof(float) * fd);
        }
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.gate_up_proj", l);
        put(b, n, 3, s->E, 2 * s->F, s->d, gu);
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.down_proj", l);
        put(b, n, 3, s->E, s->d, s->F, down);
        free(gu);
    }
    free(gate), free(up), free(down);
}

/* config.json + weights of s (values from seed) into dir = tmpdir/name */
static void make_model(char *dir, size_t dlen, const char *name, const mspec *s, uint64_t seed)
{
    snprintf(dir, dlen, "%s/%s", tmpdir, name);
    T_ASSERT(mkdir(dir, 0755) == 0);
    char cfg[2048], moe[512] = "";
    if (!s->dense_arch)
        snprintf(moe, sizeof moe,
                 ", \"num_experts\": %d, \"num_experts_per_tok\": %d, \"moe_intermediate_size\": %d,"
                 " \"norm_topk_prob\": %s, \"decoder_sparse_step\": %d, \"mlp_only_layers\": %s,"
                 " \"router_aux_loss_coef\": 0.001, \"output_router_logits\": false",
                 s->E, s->k, s->F, s->norm_topk ? "true" : "false", s->step, s->mlp_only);
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", \"hidden_size\": %d, \"intermediate_size\": %d,"
             " \"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d,"
             " \"vocab_size\": %d, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": true, \"rope_theta\": 1000000,"
             " \"torch_dtype\": \"bfloat16\"%s}",
             s->dense_arch ? "Qwen3ForCausalLM" : "Qwen3MoeForCausalLM", s->dense_arch ? "qwen3" : "qwen3_moe", s->d,
             s->I, s->L, s->H, s->KV, s->hd, s->V, moe);
    write_text(dir, "config.json", cfg);
    writer *b = calloc(1, sizeof *b);
    T_ASSERT(b);
    b->w[0] = safetensors_writer_new(), b->w[1] = safetensors_writer_new();
    b->s = s, b->seed = seed;
    snprintf(b->index, sizeof b->index, "{\"weight_map\": {");
    b->io = strlen(b->index);
    int64_t qd = (int64_t)s->H * s->hd, kvd = (int64_t)s->KV * s->hd;
    char n[256];
    add(b, "model.embed_tokens.weight", s->V, s->d, 1.0f, 0);
    for (int l = 0; l < s->L; l++) {
#define P(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix), n)
        add(b, P("input_layernorm.weight"), s->d, 0, 0.2f, 1.0f);
        add(b, P("self_attn.q_proj.weight"), qd, s->d, 0.3f, 0);
        add(b, P("self_attn.k_proj.weight"), kvd, s->d, 0.3f, 0);
        add(b, P("self_attn.v_proj.weight"), kvd, s->d, 0.3f, 0);
        add(b, P("self_attn.o_proj.weight"), s->d, qd, 0.3f, 0);
        add(b, P("self_attn.q_norm.weight"), s->hd, 0, 0.2f, 1.0f);
        add(b, P("self_attn.k_norm.weight"), s->hd, 0, 0.2f, 1.0f);
        add(b, P("post_attention_layernorm.weight"), s->d, 0, 0.2f, 1.0f);
        if (sparse(s, l)) {
            experts(b, l);
        } else {
            add(b, P("mlp.gate_proj.weight"), s->I, s->d, 0.3f, 0);
            add(b, P("mlp.up_proj.weight"), s->I, s->d, 0.3f, 0);
            add(b, P("mlp.down_proj.weight"), s->d, s->I, 0.3f, 0);
        }
#undef P
    }
    add(b, "model.norm.weight", s->d, 0, 0.2f, 1.0f);
    char p[600];
    if (s->sharded) {
        for (int i = 0; i < 2; i++) {
            snprintf(p, sizeof p, "%s/model-%05d-of-00002.safetensors", dir, i + 1);
            T_ASSERT_RC(safetensors_writer_write(b->w[i], p));
        }
        snprintf(b->index + b->io, sizeof b->index - b->io, "}}");
        write_text(dir, "model.safetensors.index.json", b->index);
    } else {
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        T_ASSERT_RC(safetensors_writer_write(b->w[0], p));
    }
    safetensors_writer_free(b->w[0]);
    safetensors_writer_free(b->w[1]);
    free(b);
}

static double rel_err(const float *a, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static void random_tokens(int32_t *tok, int T, int V, uint64_t seed)
{
    df_rng r;
    df_rng_seed(&r, seed);
    for (int t = 0; t < T; t++)
        tok[t] = (int32_t)df_rng_below(&r, (uint64_t)V);
}

/* ---- self-consistency ------------------------------------------------------------ */

static void layouts(void)
{
    mspec s = BASE;
    char per[512], fused[512];
    make_model(per, sizeof per, "per_expert", &s, 3);
    s.fused = 1, s.sharded = 1;
    make_model(fused, sizeof fused, "fused", &s, 3);
    int all[4] = {0, 1, 2, 3};
    target_model a, b;
    load_ok(&a, per, all, 4);
    load_ok(&b, fused, all, 4);
    T_ASSERT(a.expert_layout && !strcmp(a.expert_layout, "per-expert"));
    T_ASSERT(b.expert_layout && !strcmp(b.expert_layout, "fused"));
    /* transformers' rule: 0 is listed in mlp_only_layers, 2 fails (2 + 1) % 2 == 0 */
    const int want[4] = {0, 1, 0, 1};
    for (int l = 0; l < 4; l++) {
        T_ASSERT(a.layers[l].moe == want[l] && hfconfig_layer_is_moe(&a.cfg, l) == want[l]);
        T_ASSERT((a.layers[l].w_router != NULL) == want[l]);
    }
    T_ASSERT(a.cfg.n_moe_layers == 2 && a.cfg.num_experts == 8 && a.cfg.num_experts_per_tok == 2);
    int d = a.cfg.hidden_size;
    enum { T = 21 };
    int32_t tok[T], st[4] = {0, 8, 15, 21};
    random_tokens(tok, T, s.V, 5);
    float *fa = malloc(sizeof(float) * T * 4 * d), *fb = malloc(sizeof(float) * T * 4 * d);
    T_ASSERT_RC(target_forward_cpu(&a, tok, st, 3, fa));
    T_ASSERT_RC(target_forward_cpu(&b, tok, st, 3, fb));
    T_ASSERT(memcmp(fa, fb, sizeof(float) * T * 4 * d) == 0);
    /* the routing is not degenerate: over these tokens, every expert of layer 3 is chosen */
    int used[8] = {0}, n_used = 0;
    for (int i = 0; i < T * 2; i++)
        used[a.ws.moe_idx[i]] = 1;
    for (int e = 0; e < 8; e++)
        n_used += used[e];
    T_ASSERT(n_used >= 6);
    /* packing: each document alone gives the same features */
    float *alone = malloc(sizeof(float) * T * 4 * d);
    double worst = 0;
    for (int i = 0; i < 3; i++) {
        int32_t one[2] = {0, st[i + 1] - st[i]};
        T_ASSERT_RC(target_forward_cpu(&a, tok + st[i], one, 1, alone));
        worst = fmax(worst, max_abs_diff(fa + (size_t)st[i] * 4 * d, alone, (size_t)one[1] * 4 * d));
    }
    T_ASSERT(worst <= 1e-6);
    target_free(&a);
    target_free(&b);
    /* only up to layer 1 (sparse): one dense, one sparse layer loaded, the same features */
    int cap1 = 1;
    load_ok(&a, fused, &cap1, 1);
    T_ASSERT(a.n_layers == 2 && a.layers[1].moe);
    T_ASSERT_RC(target_forward_cpu(&a, tok, st, 3, alone));
    for (int t = 0; t < T; t++)
        T_ASSERT(memcmp(alone + (size_t)t * d, fa + ((size_t)t * 4 + 1) * d, sizeof(float) * d) == 0);
    target_free(&a);
    free(fa), free(fb), free(alone);
    printf("layouts: per-expert == fused (sharded) bit for bit, sparse layers {1, 3}, packed == alone (%.2g)\n", worst);
}

static void identical_experts(void)
{
    mspec s = BASE;
    s.F = s.I, s.identical_experts = 1;
    char moe[512], dense[512], raw[512];
    make_model(moe, sizeof moe, "ident_moe", &s, 9);
    s.norm_topk = 0;
    make_model(raw, sizeof raw, "ident_raw", &s, 9);
    s.dense_arch = 1;
    make_model(dense, sizeof dense, "ident_dense", &s, 9);
    int all[4] = {0, 1, 2, 3};
    target_model a, b, c;
    load_ok(&a, moe, all, 4);
    load_ok(&b, dense, all, 4);
    load_ok(&c, raw, all, 4);
    T_ASSERT(a.cfg.n_moe_layers == 2 && b.cfg.n_moe_layers == 0 && b.cfg.arch == HFCONFIG_ARCH_QWEN3);
    int d = a.cfg.hidden_size;
    enum { T = 13 };
    int32_t tok[T], st[3] = {0, 6, 13};
    random_tokens(tok, T, s.V, 8);
    float *fa = malloc(sizeof(float) * T * 4 * d), *fb = malloc(sizeof(float) * T * 4 * d);
    float *fc = malloc(sizeof(float) * T * 4 * d), *la = malloc(sizeof(float) * T * d);
    float *lb = malloc(sizeof(float) * T * d), *lc = malloc(sizeof(float) * T * d);
    T_ASSERT_RC(target_forward_cpu(&a, tok, st, 2, fa));
    T_ASSERT_RC(target_forward_cpu(&b, tok, st, 2, fb));
    T_ASSERT_RC(target_forward_cpu(&c, tok, st, 2, fc));
    double worst = 0, raw_diff = 0;
    for (int l = 0; l < 4; l++) {
        for (int t = 0; t < T; t++) {
            memcpy(la + (size_t)t * d, fa + ((size_t)t * 4 + l) * d, sizeof(float) * d);
            memcpy(lb + (size_t)t * d, fb + ((size_t)t * 4 + l) * d, sizeof(float) * d);
            memcpy(lc + (size_t)t * d, fc + ((size_t)t * 4 + l) * d, sizeof(float) * d);
        }
        double r = rel_err(la, lb, (size_t)T * d);
        if (l == 0)
            T_ASSERT(r == 0); /* the dense layer is the same code on the same weights */
        worst = fmax(worst, r);
        raw_diff = fmax(raw_diff, rel_err(lc, lb, (size_t)T * d));
    }
    T_ASSERT(worst < 1e-5);
    T_ASSERT(raw_diff > 1e-3); /* without norm_topk_prob the k weights sum below 1 */
    target_free(&a), target_free(&b), target_free(&c);
    free(fa), free(fb), free(fc), free(la), free(lb), free(lc);
    printf("identical experts == the dense model (rel err %.2g); without norm_topk_prob it differs (%.2g)\n", worst,
           raw_diff);
}

static void decode(void)
{
    mspec s = BASE;
    s.fused = 1;
    char dir[512], err[1024] = "";
    make_model(dir, sizeof dir, "decode", &s, 4);
    int cap[2] = {3, 1};
    decode_model m;
    int rc = decode_load(&m, dir, cap, 2, 32, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "%s\n", err);
    T_ASSERT_RC(rc);
    int d = s.d, V = s.V;
    enum { T = 12 };
    int32_t tok[T];
    random_tokens(tok, T, V, 11);
    /* reference: one forward of the document */
    target_model f;
    load_ok(&f, dir, cap, 2);
    float *ref = malloc(sizeof(float) * T * 2 * d), *feat = malloc(sizeof(float) * T * 2 * d);
    int32_t one[2] = {0, T};
    T_ASSERT_RC(target_forward_cpu(&f, tok, one, 1, ref));
    target_free(&f);
    /* prefill 5, two single steps, a block of 5 */
    float *lg_block = malloc(sizeof(float) * 5 * V), *lg_step = malloc(sizeof(float) * 5 * V);
    int at = 0;
    const int chunk[4] = {5, 1, 1, 5};
    for (int i = 0; i < 4; i++) {
        T_ASSERT_RC(decode_extend(&m, tok + at, chunk[i], chunk[i]));
        memcpy(feat + (size_t)at * 2 * d, m.feat, sizeof(float) * chunk[i] * 2 * d);
        at += chunk[i];
    }
    memcpy(lg_block, m.logits, sizeof(float) * 5 * V);
    T_ASSERT(memcmp(feat, ref, sizeof(float) * T * 2 * d) == 0);
    /* the block's logits == the same tokens one step at a time */
    T_ASSERT_RC(decode_truncate(&m, 7));
    for (int i = 0; i < 5; i++) {
        T_ASSERT_RC(decode_extend(&m, tok + 7 + i, 1, 1));
        memcpy(lg_step + (size_t)i * V, m.logits, sizeof(float) * V);
    }
    T_ASSERT(memcmp(lg_block, lg_step, sizeof(float) * 5 * V) == 0);
    decode_free(&m);
    /* two sequences in one batch == each alone */
    T_ASSERT_RC(decode_load_batch(&m, dir, cap, 2, 32, 2, err, sizeof err));
    int ks[2] = {7, 4};
    int32_t both[11];
    memcpy(both, tok, sizeof(int32_t) * 7);
    memcpy(both + 7, tok + 3, sizeof(int32_t) * 4);
    T_ASSERT_RC(decode_extend_batch(&m, both, ks));
    T_ASSERT(memcmp(m.feat, ref, sizeof(float) * 7 * 2 * d) == 0);
    float *second = malloc(sizeof(float) * 4 * 2 * d);
    memcpy(second, m.feat + (size_t)7 * 2 * d, sizeof(float) * 4 * 2 * d);
    decode_reset_seq(&m, 1);
    T_ASSERT_RC(decode_extend_seq(&m, 1, tok + 3, 4, 0));
    T_ASSERT(memcmp(second, m.feat, sizeof(float) * 4 * 2 * d) == 0);
    decode_free(&m);
    free(ref), free(feat), free(lg_block), free(lg_step), free(second);
    printf("decode: prefill + steps + block == one forward, block logits == steps, batch == alone ok\n");
}

static void expect_load_error(const char *dir, int want_rc, const char *want)
{
    target_model m;
    char err[1024] = "", full[1200];
    int all[4] = {0, 1, 2, 3};
    int rc = target_load(&m, dir, all, 4, err, sizeof err);
    snprintf(full, sizeof full, want, dir);
    if (rc != want_rc || strcmp(err, full) != 0)
        fprintf(stderr, "rc %d (want %d)\n  got  %s\n  want %s\n", rc, want_rc, err, full);
    T_ASSERT(rc == want_rc);
    T_ASSERT_STREQ(err, full);
    T_ASSERT(target_exit_code(rc) == DF_EXIT_PERM);
}

static void load_errors(void)
{
    mspec s = BASE;
    char dir[512];
    s.skip = "model.layers.1.mlp.experts.3.up_proj.weight";
    make_model(dir, sizeof dir, "no_expert", &s, 1);
    expect_load_error(
        dir, -ENOENT,
        "%s: tensor \"model.layers.1.mlp.experts.3.up_proj.weight\" missing (looked in model.safetensors)");
    s.skip = "model.layers.3.mlp.gate.weight";
    make_model(dir, sizeof dir, "no_router", &s, 1);
    expect_load_error(dir, -ENOENT,
                      "%s: tensor \"model.layers.3.mlp.gate.weight\" missing (looked in model.safetensors)");
    s.skip = "model.layers.1.mlp.experts.0.gate_proj.weight";
    make_model(dir, sizeof dir, "no_experts", &s, 1);
    expect_load_error(dir, -ENOENT,
                      "%s: tensor \"model.layers.1.mlp.experts.0.gate_proj.weight\" missing (looked in "
                      "model.safetensors; nor is the fused \"model.layers.1.mlp.experts.gate_up_proj\" there)");
    s.skip = NULL, s.fused = 1, s.sharded = 1;
    s.reshape = "model.layers.3.mlp.experts.down_proj";
    make_model(dir, sizeof dir, "bad_fused", &s, 1);
    /* which shard holds it depends on the split: the message starts with the model dir */
    {
        target_model m;
        char err[1024] = "";
        int all[4] = {0, 1, 2, 3};
        T_ASSERT(target_load(&m, dir, all, 4, err, sizeof err) == -EINVAL);
        T_ASSERT(
            strstr(err, "tensor \"model.layers.3.mlp.experts.down_proj\": shape [9, 32, 16], expected [8, 32, 16]"));
        T_ASSERT(strstr(err, dir) == err);
    }
    s.reshape = NULL, s.sharded = 0, s.both_layouts = 1;
    make_model(dir, sizeof dir, "both", &s, 1);
    expect_load_error(dir, -EINVAL,
                      "%s: layer 1 holds both \"model.layers.1.mlp.experts.gate_up_proj\" and "
                      "\"model.layers.1.mlp.experts.0.gate_proj.weight\": one expert layout expected");
    printf("load errors: missing expert / router / all experts, fused shape, both layouts: named, exit 100\n");
}

/* ---- the transformers fixture --------------------------------------------------------- */

static const safetensors_tensor *ref_get(const safetensors_file *rf, const char *name, safetensors_dtype dt, int64_t d0,
                                         int64_t d1)
{
    const safetensors_tensor *t = safetensors_find(rf, name);
    if (!t)
        fprintf(stderr, "reference: no tensor %s\n", name);
    T_ASSERT(t && t->dtype == dt && t->shape[0] == d0 && (d1 == 0 ? t->ndim == 1 : t->ndim == 2 && t->shape[1] == d1));
    return t;
}

static float *ref_f32(const safetensors_file *rf, const char *name, int64_t d0, int64_t d1)
{
    const safetensors_tensor *t = ref_get(rf, name, SAFETENSORS_F32, d0, d1);
    float *v = malloc(sizeof(float) * (size_t)(d0 * (d1 ? d1 : 1)));
    T_ASSERT(v);
    T_ASSERT_RC(safetensors_tensor_to_f32(t, v));
    return v;
}

/* 1 = compared, 0 = fixture absent; the layout the directory holds goes to *layout */
static int compare_fixture(const char *mdir, const char *refpath, const char **layout)
{
    char err[1024];
    if (access(refpath, F_OK) != 0 || access(mdir, F_OK) != 0)
        return 0;
    safetensors_file rf;
    int rc = safetensors_open(&rf, refpath, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "%s\n", err);
    T_ASSERT_RC(rc);
    hfconfig c;
    T_ASSERT_RC(hfconfig_load(&c, mdir, err, sizeof err));
    T_ASSERT(c.arch == HFCONFIG_ARCH_QWEN3_MOE);
    int L = c.num_hidden_layers, d = c.hidden_size, V = c.vocab_size, E = c.num_experts, k = c.num_experts_per_tok;
    const safetensors_tensor *ids = safetensors_find(&rf, "input_ids"), *ds = safetensors_find(&rf, "doc_starts");
    T_ASSERT(ids && ds && ids->dtype == SAFETENSORS_I32 && ds->dtype == SAFETENSORS_I32);
    int T = (int)ids->shape[0], n_docs = (int)ds->shape[0] - 1;
    const int32_t *tok = ids->data, *starts = ds->data;
    T_ASSERT(starts[0] == 0 && starts[n_docs] == T);

    /* every layer's hidden state (packed row) */
    int *all = malloc(sizeof(int) * (size_t)L);
    for (int l = 0; l < L; l++)
        all[l] = l;
    target_model m;
    load_ok(&m, mdir, all, L);
    *layout = m.expert_layout;
    float *out = malloc(sizeof(float) * (size_t)T * L * d), *got = malloc(sizeof(float) * (size_t)T * d);
    float *emb = ref_f32(&rf, "embed", T, d);
    T_ASSERT_RC(target_embed(&m, tok, T, got));
    T_ASSERT(max_abs_diff(got, emb, (size_t)T * d) == 0);
    T_ASSERT_RC(target_forward_cpu(&m, tok, starts, n_docs, out));
    for (int l = 0; l < L; l++) {
        char hn[64];
        snprintf(hn, sizeof hn, "hidden.%d", l);
        float *h = ref_f32(&rf, hn, T, d);
        for (int t = 0; t < T; t++)
            memcpy(got + (size_t)t * d, out + ((size_t)t * L + l) * d, sizeof(float) * d);
        double rel = rel_err(got, h, (size_t)T * d);
        printf("%s layer %d (%s): max abs err %.3g, rel err %.3g (T=%d, %d docs)\n", mdir, l,
               hfconfig_layer_is_moe(&c, l) ? "sparse" : "dense", max_abs_diff(got, h, (size_t)T * d), rel, T, n_docs);
        T_ASSERT(rel < 1e-4);
        free(h);
    }
    target_free(&m);

    /* each sparse layer's routing: the model loaded up to that layer keeps its routing */
    int n_sparse = 0;
    for (int l = 0; l < L; l++) {
        if (!hfconfig_layer_is_moe(&c, l))
            continue;
        n_sparse++;
        load_ok(&m, mdir, &l, 1);
        char nm[64];
        snprintf(nm, sizeof nm, "router.%d.idx", l);
        const safetensors_tensor *ix = ref_get(&rf, nm, SAFETENSORS_I32, T, k);
        snprintf(nm, sizeof nm, "router.%d.w", l);
        float *w = ref_f32(&rf, nm, T, k);
        snprintf(nm, sizeof nm, "router.%d.logits", l);
        float *lg = ref_f32(&rf, nm, T, E);
        double werr = 0;
        for (int s = 0; s < n_docs; s++) { /* per document, as the reference ran */
            int32_t one[2] = {0, starts[s + 1] - starts[s]};
            T_ASSERT_RC(target_forward_cpu(&m, tok + starts[s], one, 1, out));
            for (int t = 0; t < one[1]; t++)
                for (int j = 0; j < k; j++) {
                    size_t r = (size_t)(starts[s] + t) * k + j;
                    T_ASSERT(m.ws.moe_idx[(size_t)t * k + j] == ((const int32_t *)ix->data)[r]);
                    werr = fmax(werr, fabs(m.ws.moe_w[(size_t)t * k + j] - w[r]));
                }
            T_ASSERT(rel_err(m.ws.moe_logits, lg + (size_t)starts[s] * E, (size_t)one[1] * E) < 1e-4);
        }
        printf("%s layer %d routing: top-%d experts equal, weights max abs err %.3g\n", mdir, l, k, werr);
        T_ASSERT(werr < 1e-4);
        free(w), free(lg);
        target_free(&m);
    }
    T_ASSERT(n_sparse > 0 && n_sparse < L); /* the fixture has both kinds of layer */

    /* logits per document and the greedy KV decode */
    decode_model dm;
    int last = L - 1;
    T_ASSERT_RC(decode_load(&dm, mdir, &last, 1, 64, err, sizeof err));
    float *lref = ref_f32(&rf, "logits", T, V);
    double lrel = 0;
    for (int s = 0; s < n_docs; s++) {
        int n = starts[s + 1] - starts[s];
        decode_reset(&dm);
        T_ASSERT_RC(decode_extend(&dm, tok + starts[s], n, n));
        lrel = fmax(lrel, rel_err(dm.logits, lref + (size_t)starts[s] * V, (size_t)n * V));
    }
    printf("%s logits: rel err %.3g\n", mdir, lrel);
    T_ASSERT(lrel < 1e-4);
    int n_dec = 0;
    for (int i = 0;; i++, n_dec++) {
        char pn[64], tn[64], ln[64];
        snprintf(pn, sizeof pn, "decode.%d.prompt", i);
        snprintf(tn, sizeof tn, "decode.%d.tokens", i);
        snprintf(ln, sizeof ln, "decode.%d.logits", i);
        const safetensors_tensor *pt = safetensors_find(&rf, pn), *tt = safetensors_find(&rf, tn);
        if (!pt)
            break;
        T_ASSERT(tt && pt->dtype == SAFETENSORS_I32 && tt->dtype == SAFETENSORS_I32);
        int P = (int)pt->shape[0], N = (int)tt->shape[0];
        float *dl = ref_f32(&rf, ln, N, V);
        const int32_t *want = tt->data;
        decode_reset(&dm);
        T_ASSERT_RC(decode_extend(&dm, pt->data, P, 1));
        double drel = 0;
        for (int j = 0; j < N; j++) {
            int32_t next = decode_argmax(dm.logits, V);
            drel = fmax(drel, rel_err(dm.logits, dl + (size_t)j * V, (size_t)V));
            if (next != want[j])
                fprintf(stderr, "decode %d step %d: got token %d, transformers %d\n", i, j, next, want[j]);
            T_ASSERT(next == want[j]);
            T_ASSERT_RC(decode_extend(&dm, &next, 1, 1));
        }
        printf("%s decode %d: %d greedy tokens after a %d-token prompt equal, logits rel err %.3g\n", mdir, i, N, P,
               drel);
        T_ASSERT(drel < 1e-4);
        free(dl);
    }
    T_ASSERT(n_dec > 0);
    decode_free(&dm);
    hfconfig_free(&c);
    safetensors_close(&rf);
    free(all), free(out), free(got), free(emb), free(lref);
    return 1;
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_target_moe.XXXXXX");
    T_ASSERT(mkdtemp(tmpdir));
    layouts();
    identical_experts();
    decode();
    load_errors();
    rm_rf(tmpdir);

    const char *ref = "tests/fixtures/tiny-qwen3-moe-ref.safetensors", *la = NULL, *lb = NULL;
    int n = compare_fixture("tests/fixtures/tiny-qwen3-moe", ref, &la);
    if (n == 0)
        T_SKIP("self-consistency passed; no transformers fixture (%s)", ref);
    T_ASSERT(compare_fixture("tests/fixtures/tiny-qwen3-moe-alt", ref, &lb) == 1);
    T_ASSERT(la && lb && strcmp(la, lb) != 0); /* both layouts checked against transformers */
    printf("test_target_moe: ok (transformers fixture: %s and %s layouts)\n", la, lb);
    return 0;
}
