/* dflash_tool: small command-line tool around the drafter's checkpoints and its data, for
 * users and tests: create a fresh checkpoint, export a checkpoint to the public release
 * format, import a release as a checkpoint to continue training, inspect either kind, and
 * show a token shard's samples as text with the loss-masked spans marked. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dflash/dflash_ckpt.h"
#include "dflash/dflash_config.h"
#include "dflash/dflash_manifest.h"
#include "dflash/dflash_model.h"
#include "io/shard.h"
#include "io/tokvocab.h"
#include "util.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: dflash_tool COMMAND [options]\n"
               "  init --out ROOT [--config CONFIG.json] [--seed N] [--std F]\n"
               "        write a step-0 checkpoint of a randomly initialised drafter under ROOT\n"
               "        (CONFIG.json: a release config.json; default: the tiny test config)\n"
               "  export CKPT OUT_DIR\n"
               "        write the public release format (config.json, bf16 model.safetensors and\n"
               "        dflash.py, the class transformers loads with trust_remote_code)\n"
               "        of the checkpoint CKPT (a root with a 'latest' file, or a step dir)\n"
               "  import RELEASE_DIR ROOT\n"
               "        turn a release dir into a step-0 checkpoint under ROOT (fresh optimizer)\n"
               "  inspect DIR\n"
               "        print the config, the trainer state and per-tensor statistics of a\n"
               "        checkpoint or release dir\n"
               "  verify CKPT\n"
               "        check the checkpoint CKPT (a root with a 'latest' file, or a step dir)\n"
               "        against its manifest.json, as a resume does: sizes and SHA-256 digests\n"
               "        (per 64 MiB piece, on every core), step; exit 100 naming the file and\n"
               "        the damaged byte range\n"
               "  shard show FILE [--sample N] [--tokenizer DIR] [--ids] [--color auto|always|never]\n"
               "        a token shard (.dfs): without --sample a summary (samples, tokens, vocab,\n"
               "        the fraction with loss) and sample 0; with it, sample N. Tokens are decoded\n"
               "        by DIR's byte_tokenizer.json or byte-level BPE tokenizer.json (without\n"
               "        --tokenizer: token ids); the tokens with loss (mask 1, what the drafter\n"
               "        learns) are green on a terminal, else between ⟦ and ⟧. --ids: one\n"
               "        token a line (position, id, mask, text)\n"
               "  --help  this text\n"
               "exit codes: 0 ok, 2 usage, 100 bad input file\n");
}

static void print_tensors(const dflash_config *c, const dflash_params *p)
{
    int nt = dflash_tensor_count(c);
    for (int i = 0; i < nt; i++) {
        dflash_tensor t;
        dflash_tensor_info(c, i, &t);
        double s = 0, mx = 0;
        for (size_t e = 0; e < t.numel; e++) {
            double v = p->data[t.offset + e];
            s += v * v;
            mx = fmax(mx, fabs(v));
        }
        printf("  %-44s [%lld%s", t.name, (long long)t.shape[0], t.ndim == 2 ? ", " : "]");
        if (t.ndim == 2)
            printf("%lld]", (long long)t.shape[1]);
        printf("  rms %.4g  max|x| %.4g\n", sqrt(s / (double)t.numel), mx);
    }
}

static void print_config(const dflash_config *c)
{
    printf("drafter: %d layers, hidden %d, intermediate %d, heads %d/%d x %d, vocab %d, block %d, gamma %g\n",
           c->n_layers, c->hidden, c->intermediate, c->n_heads, c->n_kv_heads, c->head_dim, c->vocab, c->block_size,
           c->gamma);
    printf("target: %d layers, captured [", c->num_target_layers);
    for (int i = 0; i < c->n_capture; i++)
        printf("%s%d", i ? ", " : "", c->target_layer_ids[i]);
    printf("], mask token %d, tied %d\n", c->mask_token_id, c->tie_word_embeddings);
    printf("layers: ");
    for (int l = 0; l < c->n_layers; l++)
        printf("%s", c->layer_sliding[l] ? "S" : "F");
    printf(" (S = sliding window %d)\ntrainable parameters: %zu\n", c->sliding_window, dflash_config_param_count(c));
}

/* A checkpoint's optimizer.safetensors, when it has one: load it like a resume would (every
 * m.<name> / v.<name> present with the model tensor's shape, the settings in
 * trainer_state.json), so garbage is found here and not at the drafter's restart. */
static void inspect_optimizer(const char *arg, const char *dir)
{
    char path[4200], err[1024];
    snprintf(path, sizeof(path), "%s/optimizer.safetensors", dir);
    if (access(path, F_OK) != 0) {
        printf("optimizer: none (a fresh AdamW starts from this checkpoint)\n");
        return;
    }
    dflash_config c;
    dflash_params p;
    adamw opt;
    if (dflash_ckpt_load(arg, &c, &p, &opt, NULL, err, sizeof(err)) < 0)
        df_die(DF_EXIT_PERM, "%s", err);
    double sm = 0, sv = 0;
    for (size_t i = 0; i < opt.n; i++) {
        sm += (double)opt.m[i] * opt.m[i];
        sv += (double)opt.v[i] * opt.v[i];
    }
    printf("optimizer: %s: m and v for %d tensors (%zu values each), AdamW step %ld of %ld, rms(m) %.4g rms(v) %.4g\n",
           path, dflash_tensor_count(&c), opt.n, opt.step, opt.cfg.total_steps, sqrt(sm / (double)(opt.n ? opt.n : 1)),
           sqrt(sv / (double)(opt.n ? opt.n : 1)));
    adamw_free(&opt);
    dflash_params_free(&p);
}

/* ---- shard show -------------------------------------------------------------------------- */

#define MARK_OPEN "⟦"
#define MARK_CLOSE "⟧"
#define SGR_RESET "\033[0m"

typedef struct show {
    const tokvocab *tv; /* NULL: token ids */
    int color;          /* ANSI colours instead of marks */
    unsigned char *buf; /* the bytes of the run being collected */
    size_t n, cap;
    int style; /* of the run: bit 0 loss, bit 1 special token; -1 none yet */
} show;

static void show_style(int style)
{
    static const char *const sgr[4] = {"", "\033[32m", "\033[2m", "\033[2;32m"}; /* plain, loss, special, both */
    fputs(SGR_RESET, stdout);
    fputs(sgr[style & 3], stdout);
}

static void show_flush(show *s)
{
    tokvocab_print(stdout, s->buf, s->n, 0);
    s->n = 0;
}

/* Append token id with mask m to the running text: consecutive tokens of one style are
 * decoded together (a character may span tokens); a mark or colour change flushes. */
static void show_token(show *s, uint32_t id, int m)
{
    const unsigned char *t;
    size_t len;
    int special = 0;
    char num[32];
    if (!tokvocab_token(s->tv, id, &t, &len, &special)) { /* no text: the id, as a special token */
        len = (size_t)snprintf(num, sizeof num, "<|id %u|>", id);
        t = (const unsigned char *)num;
        special = 1;
    }
    int style = (m ? 1 : 0) | (special ? 2 : 0);
    if (style != s->style) {
        show_flush(s);
        if (s->color) {
            show_style(style);
        } else {
            if (s->style >= 0 && (s->style & 1) && !m)
                fputs(MARK_CLOSE, stdout);
            if ((s->style < 0 || !(s->style & 1)) && m)
                fputs(MARK_OPEN, stdout);
        }
        s->style = style;
    }
    if (s->n + len > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->n + len)
            cap *= 2;
        unsigned char *p = realloc(s->buf, cap);
        if (!p)
            df_die(DF_EXIT_TEMP, "out of memory");
        s->buf = p, s->cap = cap;
    }
    memcpy(s->buf + s->n, t, len);
    s->n += len;
}

/* One sample: its text with marks (or colours), or with --ids one token a line. */
static void show_sample(const tokvocab *tv, const uint32_t *tok, const uint8_t *mask, uint32_t len, int color, int ids)
{
    if (ids || !tv) {
        for (uint32_t i = 0; i < len; i++) {
            const unsigned char *t;
            size_t tl;
            int special = 0;
            if (!ids) { /* no tokenizer: the ids in a row, marks between them */
                int open = mask[i] && (i == 0 || !mask[i - 1]), close = !mask[i] && i > 0 && mask[i - 1];
                if (color)
                    printf("%s%s%u", i ? " " : "", (open || close || i == 0) ? (mask[i] ? "\033[32m" : SGR_RESET) : "",
                           tok[i]);
                else
                    printf("%s%s%u", i ? " " : "", open ? MARK_OPEN " " : close ? MARK_CLOSE " " : "", tok[i]);
                continue;
            }
            printf("%6u %7u %u  ", i, tok[i], mask[i]);
            if (tokvocab_token(tv, tok[i], &t, &tl, &special)) { /* quoted: a space token shows */
                fputs(color && mask[i] ? "\033[32m\"" : "\"", stdout);
                tokvocab_print(stdout, t, tl, TOKVOCAB_ESC_LAYOUT);
                fputs(color && mask[i] ? "\"" SGR_RESET : "\"", stdout);
                fputs(special ? "  (special)\n" : "\n", stdout);
            } else {
                fputs(tv ? "(no text in the tokenizer)\n" : "\n", stdout);
            }
        }
        if (!ids) {
            if (color)
                fputs(SGR_RESET, stdout);
            else if (len && mask[len - 1])
                fputs(" " MARK_CLOSE, stdout);
            fputs("\n", stdout);
        }
        return;
    }
    show s = {.tv = tv, .color = color, .style = -1};
    int last_nl = 1;
    for (uint32_t i = 0; i < len; i++)
        show_token(&s, tok[i], mask[i]);
    if (s.n)
        last_nl = s.buf[s.n - 1] == '\n';
    show_flush(&s);
    if (color)
        fputs(SGR_RESET, stdout);
    else if (s.style >= 0 && (s.style & 1))
        fputs(MARK_CLOSE, stdout), last_nl = 0;
    if (!last_nl) /* the text ends the line it is on (a sample's own final newline is not doubled) */
        fputs("\n", stdout);
    free(s.buf);
}

static int cmd_shard(int argc, char **argv)
{
    if (argc < 3 || strcmp(argv[2], "show")) {
        fprintf(stderr, "dflash_tool shard: expected 'shard show FILE [--sample N] [--tokenizer DIR] [--ids] "
                        "[--color auto|always|never]'\n");
        return DF_EXIT_USAGE;
    }
    const char *tok_dir = NULL, *color_s = "auto", *file = NULL;
    long long sample = -1;
    int ids = 0, o;
    static const struct option opts[] = {
        {"sample", required_argument, 0, 's'}, {"tokenizer", required_argument, 0, 't'},
        {"ids", no_argument, 0, 'i'},          {"color", required_argument, 0, 'c'},
        {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
    optind = 3;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 's': sample = df_arg_int("dflash_tool shard show", "--sample", optarg, 0, INT64_MAX); break;
        case 't': tok_dir = optarg; break;
        case 'i': ids = 1; break;
        case 'c': color_s = optarg; break;
        case 'h': usage(stdout); return 0;
        default: return DF_EXIT_USAGE;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "dflash_tool shard show: expected one shard FILE (got %d)\n", argc - optind);
        return DF_EXIT_USAGE;
    }
    file = argv[optind];
    int color;
    if (!strcmp(color_s, "always")) {
        color = 1;
    } else if (!strcmp(color_s, "never")) {
        color = 0;
    } else if (!strcmp(color_s, "auto")) { /* a terminal that takes colours, unless NO_COLOR is set */
        const char *term = getenv("TERM");
        color = isatty(STDOUT_FILENO) && !getenv("NO_COLOR") && !(term && !strcmp(term, "dumb"));
    } else {
        fprintf(stderr, "dflash_tool shard show: --color: '%s' is not auto, always or never\n", color_s);
        return DF_EXIT_USAGE;
    }
    char err[1024] = "";
    tokvocab tv = {0};
    if (tok_dir && tokvocab_load(&tv, tok_dir, err, sizeof err) < 0)
        df_die(DF_EXIT_PERM, "%s", err);
    dataset *ds = NULL;
    char *paths[1] = {(char *)file};
    if (dataset_open(&ds, paths, 1, err, sizeof err) < 0)
        df_die(DF_EXIT_PERM, "%s", err);
    uint64_t n = dataset_n_samples(ds);
    if (sample >= 0 && (uint64_t)sample >= n) {
        fprintf(stderr, "dflash_tool shard show: %s: --sample %lld: the shard has %llu samples (0..%lld)\n", file,
                sample, (unsigned long long)n, (long long)n - 1);
        dataset_close(ds);
        tokvocab_free(&tv);
        return DF_EXIT_USAGE;
    }
    const uint32_t *tok;
    const uint8_t *mask;
    uint32_t len;
    if (sample < 0) {
        uint64_t loss = 0, spans = 0, lmin = UINT64_MAX, lmax = 0;
        for (uint64_t i = 0; i < n; i++) {
            if (dataset_sample(ds, i, &tok, &mask, &len) < 0)
                df_die(DF_EXIT_TEMP, "%s: sample %llu: cannot read", file, (unsigned long long)i);
            for (uint32_t j = 0; j < len; j++) {
                loss += mask[j];
                spans += mask[j] && (j == 0 || !mask[j - 1]);
            }
            lmin = len < lmin ? len : lmin;
            lmax = len > lmax ? len : lmax;
        }
        uint64_t nt = dataset_n_tokens(ds);
        printf("shard %s: %llu samples, %llu tokens (%llu..%llu a sample), vocab_size %u\n", file,
               (unsigned long long)n, (unsigned long long)nt, (unsigned long long)(n ? lmin : 0),
               (unsigned long long)lmax, dataset_vocab_size(ds));
        printf("loss mask: %llu of %llu tokens (%.1f%%) in %llu spans\n", (unsigned long long)loss,
               (unsigned long long)nt, nt ? 100.0 * (double)loss / (double)nt : 0.0, (unsigned long long)spans);
        if (tok_dir)
            printf("tokenizer: %s (%s, %d ids)%s\n", tv.path,
                   tv.kind == TOKVOCAB_BYTES ? "byte vocabulary" : "byte-level BPE", tv.n,
                   (uint64_t)tv.n < dataset_vocab_size(ds) ? "; ids past it show as <|id N|>" : "");
        else
            printf("tokenizer: none (--tokenizer DIR shows text): token ids\n");
        printf("tokens with loss: %s\n", color ? "green" : "between " MARK_OPEN " and " MARK_CLOSE);
        if (n == 0) {
            dataset_close(ds);
            tokvocab_free(&tv);
            return 0;
        }
        sample = 0;
    }
    if (dataset_sample(ds, (uint64_t)sample, &tok, &mask, &len) < 0)
        df_die(DF_EXIT_TEMP, "%s: sample %lld: cannot read", file, sample);
    uint32_t loss = 0, spans = 0;
    for (uint32_t j = 0; j < len; j++) {
        loss += mask[j];
        spans += mask[j] && (j == 0 || !mask[j - 1]);
    }
    printf("--- sample %lld of %llu: %u tokens, %u with loss in %u span%s\n", sample, (unsigned long long)n, len, loss,
           spans, spans == 1 ? "" : "s");
    show_sample(tok_dir ? &tv : NULL, tok, mask, len, color, ids);
    fflush(stdout);
    dataset_close(ds);
    tokvocab_free(&tv);
    return 0;
}

/* dflash_tool init --out ROOT [--config CONFIG.json] [--seed N] [--std F] */
static int cmd_init(int argc, char **argv)
{
    char err[1024] = "";
    const char *out = NULL, *cfg = NULL;
    uint64_t seed = 1;
    double std = 0.02;
    static const struct option opts[] = {{"out", required_argument, 0, 'o'},  {"config", required_argument, 0, 'c'},
                                         {"seed", required_argument, 0, 's'}, {"std", required_argument, 0, 'd'},
                                         {"help", no_argument, 0, 'h'},       {0, 0, 0, 0}};
    int o;
    optind = 2;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'o': out = optarg; break;
        case 'c': cfg = optarg; break;
        case 's': {
            char *end;
            errno = 0;
            seed = strtoull(optarg, &end, 0);
            if (errno || end == optarg || *end || optarg[0] == '-') {
                fprintf(stderr, "dflash_tool init: --seed: '%s' is not an integer in [0, 2^64)\n", optarg);
                return DF_EXIT_USAGE;
            }
            break;
        }
        case 'd': {
            char *end;
            std = strtod(optarg, &end);
            if (end == optarg || *end || !(std > 0 && std < 1e6)) {
                fprintf(stderr, "dflash_tool init: --std: '%s' is not a number in (0, 1e6)\n", optarg);
                return DF_EXIT_USAGE;
            }
            break;
        }
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return DF_EXIT_USAGE;
        }
    }
    if (!out) {
        fprintf(stderr, "dflash_tool init: --out ROOT is required\n");
        return DF_EXIT_USAGE;
    }
    dflash_config c;
    dflash_params p;
    if (cfg) {
        if (dflash_config_read_release(&c, cfg, err, sizeof(err)) < 0)
            df_die(DF_EXIT_PERM, "%s", err);
    } else {
        dflash_config_tiny(&c);
    }
    if (dflash_params_alloc(&p, &c) < 0)
        df_die(DF_EXIT_TEMP, "out of memory for %zu parameters", dflash_config_param_count(&c));
    dflash_params_init_random(&p, &c, seed, (float)std);
    dflash_train_state ts = {.seed = seed};
    df_rng_seed(&ts.rng, seed);
    if (dflash_ckpt_save(out, &c, &p, NULL, &ts, err, sizeof(err)) < 0)
        df_die(DF_EXIT_TEMP, "%s", err);
    print_config(&c);
    printf("wrote %s/step-00000000 (latest)\n", out);
    dflash_params_free(&p);
    return 0;
}

/* dflash_tool export CKPT OUT_DIR / import RELEASE_DIR ROOT */
static int cmd_export_import(int argc, char **argv)
{
    char err[1024] = "";
    if (argc != 4) {
        usage(stderr);
        return DF_EXIT_USAGE;
    }
    dflash_config c;
    dflash_params p;
    if (!strcmp(argv[1], "export")) {
        if (dflash_ckpt_load(argv[2], &c, &p, NULL, NULL, err, sizeof(err)) < 0)
            df_die(DF_EXIT_PERM, "%s", err);
        if (dflash_export_release(argv[3], &c, &p, err, sizeof(err)) < 0)
            df_die(DF_EXIT_TEMP, "%s", err);
        printf("exported %s -> %s (config.json, model.safetensors bf16, dflash.py)\n", argv[2], argv[3]);
    } else {
        if (dflash_load_release(argv[2], &c, &p, err, sizeof(err)) < 0)
            df_die(DF_EXIT_PERM, "%s", err);
        dflash_train_state ts = {0};
        if (dflash_ckpt_save(argv[3], &c, &p, NULL, &ts, err, sizeof(err)) < 0)
            df_die(DF_EXIT_TEMP, "%s", err);
        printf("imported %s -> %s/step-00000000 (start a fresh optimizer)\n", argv[2], argv[3]);
    }
    dflash_params_free(&p);
    return 0;
}

/* dflash_tool verify CKPT */
static int cmd_verify(int argc, char **argv)
{
    char err[1024] = "";
    if (argc != 3) {
        usage(stderr);
        return DF_EXIT_USAGE;
    }
    char dir[4096];
    int rc = dflash_ckpt_resolve(argv[2], dir, sizeof(dir));
    if (rc < 0)
        df_die(DF_EXIT_PERM, "%s: no checkpoint (no trainer_state.json, no readable \"latest\"): %s", argv[2],
               strerror(-rc));
    long step = 0;
    dflash_manifest_stats st;
    double t0 = df_wall_s();
    if ((rc = dflash_manifest_verify(dir, &step, &st, err, sizeof(err))) < 0)
        df_die(rc == -EINVAL ? DF_EXIT_PERM : DF_EXIT_TEMP, "%s", err);
    printf("verified %s: step %ld, manifest version %d, %d files, %llu bytes in %llu pieces on %d threads, %.2f "
           "s\n",
           dir, step, st.version, st.files, (unsigned long long)st.bytes, (unsigned long long)st.pieces, st.threads,
           df_wall_s() - t0);
    return 0;
}

/* dflash_tool inspect DIR: a checkpoint (root or step dir) or a release dir */
static int cmd_inspect(int argc, char **argv)
{
    char err[1024] = "";
    if (argc != 3) {
        usage(stderr);
        return DF_EXIT_USAGE;
    }
    dflash_config c;
    dflash_params p;
    dflash_train_state ts;
    char dir[4096];
    if (dflash_ckpt_resolve(argv[2], dir, sizeof(dir)) == 0) {
        if (dflash_ckpt_load(argv[2], &c, &p, NULL, &ts, err, sizeof(err)) < 0)
            df_die(DF_EXIT_PERM, "%s", err);
        printf("checkpoint %s: step %ld, epoch %ld, ledger committed step %ld, seed %llu\n", dir, ts.step, ts.epoch,
               ts.ledger_committed_step, (unsigned long long)ts.seed);
        inspect_optimizer(argv[2], dir);
    } else {
        if (dflash_load_release(argv[2], &c, &p, err, sizeof(err)) < 0)
            df_die(DF_EXIT_PERM, "%s is neither a checkpoint nor a release dir: %s", argv[2], err);
        printf("release %s\n", argv[2]);
    }
    print_config(&c);
    print_tensors(&c, &p);
    dflash_params_free(&p);
    return 0;
}

int main(int argc, char **argv)
{
    df_log_init("dflash_tool");
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? DF_EXIT_USAGE : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "shard"))
        return cmd_shard(argc, argv);
    if (!strcmp(cmd, "init"))
        return cmd_init(argc, argv);
    if (!strcmp(cmd, "export") || !strcmp(cmd, "import"))
        return cmd_export_import(argc, argv);
    if (!strcmp(cmd, "verify"))
        return cmd_verify(argc, argv);
    if (!strcmp(cmd, "inspect"))
        return cmd_inspect(argc, argv);
    fprintf(stderr, "dflash_tool: unknown command '%s'\n", cmd);
    usage(stderr);
    return DF_EXIT_USAGE;
}
