/* dflash_tool: small command-line tool around the drafter's checkpoints, for users and
 * tests: create a fresh checkpoint, export a checkpoint to the public release format,
 * import a release as a checkpoint to continue training, and inspect either kind. */
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

int main(int argc, char **argv)
{
    df_log_init("dflash_tool");
    char err[1024] = "";
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? DF_EXIT_USAGE : 0;
    }
    const char *cmd = argv[1];
    dflash_config c;
    dflash_params p;
    if (!strcmp(cmd, "init")) {
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
    } else if (!strcmp(cmd, "export") || !strcmp(cmd, "import")) {
        if (argc != 4) {
            usage(stderr);
            return DF_EXIT_USAGE;
        }
        if (!strcmp(cmd, "export")) {
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
    } else if (!strcmp(cmd, "verify")) {
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
    } else if (!strcmp(cmd, "inspect")) {
        if (argc != 3) {
            usage(stderr);
            return DF_EXIT_USAGE;
        }
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
    } else {
        fprintf(stderr, "dflash_tool: unknown command '%s'\n", cmd);
        usage(stderr);
        return DF_EXIT_USAGE;
    }
    dflash_params_free(&p);
    return 0;
}
